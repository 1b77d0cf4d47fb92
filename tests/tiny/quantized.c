/* quantized.c: deepseek41 models whose tensors hold ggml's quantized blocks (issue 33), built
 * without a quantizer: synth lays the model out with the tensors retyped, then their bytes are
 * replaced by the fixtures' blocks (../shared/testdata/quants: ggml's own quantization of
 * weight-like rows), cycled over each tensor.
 * Guards against: a loader that refuses a type ggml_type_supported() reports on a tensor class
 * where llama.cpp's quantizer may put it (routed and shared experts, dense projections, hc
 * mixes, router, LM head, token embedding, Engram table; vectors the engine widens at load), a
 * forward pass that reads quantized rows wrongly (the logits must equal, within summation-order
 * noise, those of the same model stored as F32 holding ggml's dequantized values), a type
 * without a decoder that is not named at open, NaN/Inf block scales that give NaN logits
 * silently, and malformed quantized tensors (ne0 or a re-viewed row not a whole number of
 * blocks, wrong shape, truncated data) that are not refused with the tensor named. */
#include "test.h"
#include "helpers.h"
#include "qfix.h"
#include "tmodel.h"
#include "dsflash.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RT 256

/* The tiny topology with every row length a multiple of 256 where it can be (hidden, q_lora,
 * ff, Engram dim), so that the 256-value block types reach every tensor class. */
static void qparams(tm_params *p) {
    tm_params_default(p);
    p->n_embd = 256;
    p->q_lora = 256;
    p->n_ff = 256;
    p->engram_dim = 256;
}

typedef struct {
    char names[MAX_RT][GGUF_MAX_NAME];
    int n;
    uint32_t type;
} retype_list;

static void retype_all(tm_model *m, void *ud) {
    const retype_list *l = ud;
    for (int i = 0; i < l->n; i++) tm_retype_tensor(m, l->names[i], l->type);
}

/* The tensors of the base model at base whose rows are whole blocks of bs values: all but the
 * vectors of fewer values (hc base/scale, biases, sinks). */
static int list_tensors(const char *base, uint32_t bs, retype_list *l, char *err) {
    gguf_file *g = gguf_open(base, err);
    if (!g) return -1;
    l->n = 0;
    for (uint64_t i = 0; i < g->n_tensors && l->n < MAX_RT; i++)
        if (g->tensors[i].ne[0] % bs == 0 && g->tensors[i].ne[0] >= 32)
            snprintf(l->names[l->n++], GGUF_MAX_NAME, "%s", g->tensors[i].name);
    gguf_close(g);
    return 0;
}

/* Overwrites the data of the listed tensors of path: block k of tensor j holds the fixture
 * run's block k + 7j (f32: ggml's values of that block, as F32 elements). */
static int fill(const char *path, const retype_list *l, const qfix *f, bool f32, char *err) {
    gguf_file *g = gguf_open(path, err);
    if (!g) return -1;
    FILE *fp = fopen(path, "r+b");
    int rc = fp ? 0 : dsf_seterr(err, "cannot reopen %s", path);
    for (int j = 0; j < l->n && rc == 0; j++) {
        const gguf_tensor *t = gguf_find_tensor(g, l->names[j]);
        const uint64_t nb = t->nbytes / (f32 ? 4 * f->bs : f->ts);
        if (fseek(fp, (long)(g->data_offset + t->offset), SEEK_SET)) rc = -1;
        for (uint64_t k = 0; k < nb && rc == 0; k++) {
            const void *src = f32 ? (const void *)qfix_wvalues(f, (int64_t)k + 7 * j) : qfix_wblock(f, (int64_t)k + 7 * j);
            if (fwrite(src, f32 ? 4 * f->bs : f->ts, 1, fp) != 1) rc = dsf_seterr(err, "write failed");
        }
    }
    if (fp && fclose(fp)) rc = -1;
    gguf_close(g);
    return rc;
}

/* The model of qparams with the listed tensors retyped to type and filled from the fixture. */
static int build(const char *path, retype_list *l, uint32_t type, const qfix *f, char *err) {
    tm_params p;
    qparams(&p);
    l->type = type;
    if (tm_write(&p, path, retype_all, l, err) < 0) return -1;
    return fill(path, l, f, type == GGML_TYPE_F32, err);
}

/* All rows of logits for tokens (n of them) in plain numerics (no activation QDQ: the F32 twin
 * differs by the summation order only). NULL with err. */
static float *logits_of(const char *path, const int32_t *tok, int n, int *V, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = DSF_NUMERICS_PLAIN;
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    if (!e) return NULL;
    dsf_session *s = dsf_session_new(e, 64, err);
    float *lg = NULL;
    if (s) {
        *V = dsf_engine_n_vocab(e);
        lg = malloc((size_t)n * (size_t)*V * sizeof *lg);
        if (dsf_session_eval(s, tok, n, lg, true, err) < 0) {
            free(lg);
            lg = NULL;
        }
    }
    dsf_session_free(s);
    dsf_engine_close(e);
    return lg;
}

/* One type: the quantized model loads and its logits equal the F32 twin's. */
static void check_type(test_ctx *t, const qfix *f, const char *base, const char *qpath, const char *fpath) {
    char err[DSF_ERR_LEN];
    static retype_list l;
    CHECKF(list_tensors(base, f->bs, &l, err) == 0, "%s", err);
    CHECKF(build(qpath, &l, f->id, f, err) == 0, "%s: %s", f->name, err);
    if (!ggml_type_supported(f->id)) { /* no decoder yet: the first tensor in the list is named */
        dsf_engine *e = dsf_engine_open(qpath, NULL, err);
        dsf_engine_close(e);
        CHECKF(!e && strstr(err, "is not supported") && strstr(err, f->name) && strstr(err, "tensor '"), "%s: %s",
               f->name, e ? "accepted" : err);
        return;
    }
    CHECKF(build(fpath, &l, GGML_TYPE_F32, f, err) == 0, "%s: f32 twin: %s", f->name, err);
    static const int32_t tok[] = {1, 17, 200, 3, 99, 42, 7, 255, 128, 5, 64, 31};
    const int n = (int)(sizeof tok / sizeof tok[0]);
    int V = 0, V2 = 0;
    float *q = logits_of(qpath, tok, n, &V, err);
    CHECKF(q, "%s: the quantized model: %s", f->name, err);
    float *r = logits_of(fpath, tok, n, &V2, err);
    if (!r) free(q);
    CHECKF(r && V == V2, "%s: the F32 twin: %s", f->name, err);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < (int64_t)n * V; i++) {
        scale = fmax(scale, fabs(r[i]));
        worst = fmax(worst, fabs((double)q[i] - r[i]));
    }
    free(q);
    free(r);
    /* Same values, other kernels (a quantized row is dequantized and dotted in double by the
     * scalar twin, F32 rows by the fast fp32 kernels): only the summation order differs, about
     * 1e-7 relative per product, through 6 layers (measured: at most 7e-7 of the largest
     * logit, Q2_K; 0 for Q8_0, MXFP4, F16, BF16); 1e-5 of the largest logit leaves a margin
     * of 14 while one tensor of the 131 given shifted blocks already moves them by 2.4e-4. */
    CHECKF(worst <= 1e-5 * scale, "%s: logits differ from the F32 twin by %.3g (largest logit %.3g), %d tensors",
           f->name, worst, scale, l.n);
    CHECKF(l.n >= 40, "%s: only %d tensors quantized", f->name, l.n);
}

TEST(quantized_every_class_loads_and_runs) {
    char names[QFIX_MAX_TYPES][16], err[DSF_ERR_LEN];
    const int n = qfix_types(names, QFIX_MAX_TYPES);
    if (n == 0) SKIP("needs ../shared/testdata/quants");
    char base[512], qpath[512], fpath[512];
    snprintf(base, sizeof base, "%s", tm_path("quant-base"));
    snprintf(qpath, sizeof qpath, "%s", tm_path("quant-q"));
    snprintf(fpath, sizeof fpath, "%s", tm_path("quant-f32"));
    tm_params p;
    qparams(&p);
    CHECKF(tm_write(&p, base, NULL, NULL, err) == 0, "%s", err);
    for (int i = 0; i < n; i++) {
        qfix f;
        CHECKF(qfix_load(names[i], &f), "fixture %s incomplete", names[i]);
        check_type(t, &f, base, qpath, fpath);
        qfix_free(&f);
        if (t->failed) return;
    }
}

/* Byte offset of tensor name's data in path (-1 if absent). */
static long data_at(const char *path, const char *name, char *err) {
    gguf_file *g = gguf_open(path, err);
    const gguf_tensor *tt = g ? gguf_find_tensor(g, name) : NULL;
    long at = tt ? (long)(g->data_offset + tt->offset) : -1;
    gguf_close(g);
    return at;
}

static int poke(const char *path, long at, const void *v, size_t n) {
    FILE *fp = fopen(path, "r+b");
    int ok = fp && fseek(fp, at, SEEK_SET) == 0 && fwrite(v, n, 1, fp) == 1;
    if (fp) fclose(fp);
    return ok ? 0 : -1;
}

/* A Q8_0 model whose LM head row 5 has a NaN block scale, then whose token 3's embedding row has
 * an Inf one (f16 0x7E00 / 0x7C00; spec §1.5: Q8_0 y = d * q, d the block's first 2 bytes). */
TEST(quantized_nonfinite_scale_is_refused) {
    qfix f;
    if (!qfix_load("Q8_0", &f)) SKIP("needs ../shared/testdata/quants");
    char err[DSF_ERR_LEN], base[512], path[512];
    snprintf(base, sizeof base, "%s", tm_path("quant-nan-base"));
    snprintf(path, sizeof path, "%s", tm_path("quant-nan"));
    tm_params p;
    qparams(&p);
    static retype_list l;
    int ok = tm_write(&p, base, NULL, NULL, err) == 0 && list_tensors(base, 32, &l, err) == 0 &&
             build(path, &l, GGML_TYPE_Q8_0, &f, err) == 0;
    qfix_free(&f);
    CHECKF(ok, "%s", err);
    const long row_bytes = 256 / 32 * 34;
    long head = data_at(path, "output.weight", err), embd = data_at(path, "token_embd.weight", err);
    CHECK(head > 0 && embd > 0);
    const uint16_t nan16 = 0x7E00, inf16 = 0x7C00;
    CHECK(poke(path, head + 5 * row_bytes, &nan16, 2) == 0);
    dsf_engine *e = dsf_engine_open(path, NULL, err);
    CHECKF(e, "%s", err);
    dsf_session *s = dsf_session_new(e, 32, err);
    CHECKF(s, "%s", err);
    const int V = dsf_engine_n_vocab(e);
    float *lg = malloc((size_t)V * 4 * sizeof *lg);
    const int32_t tok[4] = {1, 2, 4, 6};
    int rc = dsf_session_eval(s, tok, 4, lg, false, err);
    CHECKF(rc < 0 && strstr(err, "non-finite logit (NaN for token 5 at position 3)") && dsf_session_n_past(s) == 0,
           "rc %d, n_past %d: %s", rc, dsf_session_n_past(s), err);
    rc = dsf_session_eval(s, tok, 2, NULL, false, err); /* no logits asked: nothing to refuse */
    CHECKF(rc == 0 && dsf_session_n_past(s) == 2, "%s", err);
    dsf_session_free(s);
    dsf_engine_close(e);
    /* the head repaired, token 3's embedding poisoned: every logit of that token is refused */
    const uint16_t one = 0x3C00;
    CHECK(poke(path, head + 5 * row_bytes, &one, 2) == 0 && poke(path, embd + 3 * row_bytes, &inf16, 2) == 0);
    e = dsf_engine_open(path, NULL, err);
    CHECKF(e, "%s", err);
    s = dsf_session_new(e, 32, err);
    const int32_t ok_tok[3] = {1, 2, 4}, bad_tok[2] = {7, 3};
    CHECKF(s && dsf_session_eval(s, ok_tok, 3, lg, true, err) == 0, "%s", err);
    for (int i = 0; i < 3 * V; i++) CHECKF(isfinite(lg[i]), "logit %d not finite", i);
    rc = dsf_session_eval(s, bad_tok, 2, lg, true, err);
    CHECKF(rc < 0 && strstr(err, "non-finite logit") && strstr(err, "at position 4)") && dsf_session_n_past(s) == 3,
           "rc %d, n_past %d: %s", rc, dsf_session_n_past(s), err);
    /* the state is as before the refused call: the same tokens again give the same logits */
    float *again = malloc((size_t)V * sizeof *again);
    CHECKF(dsf_session_eval(s, &bad_tok[0], 1, again, false, err) == 0, "%s", err);
    dsf_session *s2 = dsf_session_new(e, 32, err);
    const int32_t four[4] = {1, 2, 4, 7};
    CHECKF(s2 && dsf_session_eval(s2, four, 4, lg, false, err) == 0, "%s", err);
    CHECK(memcmp(again, lg, (size_t)V * sizeof *lg) == 0); /* rollback left no trace */
    free(again);
    free(lg);
    dsf_session_free(s2);
    dsf_session_free(s);
    dsf_engine_close(e);
}

/* Sets the type id of tensor name in the header of the file at path (the 4 bytes after its
 * name and dims). */
static int set_type(const char *path, const char *name, uint32_t type) {
    long size = 0;
    unsigned char *buf = test_slurp(path, &size);
    if (!buf) return -1;
    const size_t nl = strlen(name);
    int rc = -1;
    for (unsigned char *p = buf + 8; p + nl + 4 < buf + size; p++) {
        uint64_t len;
        memcpy(&len, p - 8, 8);
        if (len != nl || memcmp(p, name, nl)) continue;
        uint32_t nd;
        memcpy(&nd, p + nl, 4);
        rc = poke(path, (long)(p - buf) + (long)nl + 4 + 8 * (long)nd, &type, 4);
        break;
    }
    free(buf);
    return rc;
}

static void reshape_wo_a(tm_model *m, void *ud) {
    (void)ud;
    const int64_t ne[2] = {256, 8}; /* 2048 elements = gin 64 x 32 rows: re-viewed rows of 64 */
    tm_reshape_tensor(m, "blk.0.attn_output_a.weight", 2, ne);
    tm_retype_tensor(m, "blk.0.attn_output_a.weight", GGML_TYPE_Q4_K);
}

static void reshape_kv(tm_model *m, void *ud) {
    (void)ud;
    const int64_t ne[2] = {64, 64};
    tm_reshape_tensor(m, "blk.2.attn_kv.weight", 2, ne);
    tm_retype_tensor(m, "blk.2.attn_kv.weight", GGML_TYPE_Q8_0);
}

static void retype_head(tm_model *m, void *ud) {
    (void)ud;
    tm_retype_tensor(m, "output.weight", GGML_TYPE_Q4_K);
}

TEST(quantized_malformed_tensors) {
    char err[DSF_ERR_LEN], path[512];
    tm_params p;
    tm_params_default(&p); /* hidden 64: rows of 64 values */
    snprintf(path, sizeof path, "%s", tm_path("quant-bad"));
    /* ne0 = 64 is not a whole number of Q4_K blocks (256): the reader names the tensor */
    CHECKF(tm_write(&p, path, NULL, NULL, err) == 0, "%s", err);
    CHECK(set_type(path, "blk.1.attn_kv.weight", GGML_TYPE_Q4_K) == 0);
    dsf_engine *e = dsf_engine_open(path, NULL, err);
    CHECKF(!e && strstr(err, "tensor 'blk.1.attn_kv.weight'") && strstr(err, "ne0 = 64") &&
               strstr(err, "Q4_K block size 256"),
           "%s", e ? "accepted" : err);
    /* wo_a stored as whole Q4_K rows of 256, but re-viewed as rows of 64 */
    CHECKF(tm_write(&p, path, reshape_wo_a, NULL, err) == 0, "%s", err);
    e = dsf_engine_open(path, NULL, err);
    CHECKF(!e && strstr(err, "tensor 'blk.0.attn_output_a.weight'") && strstr(err, "64 elements") &&
               strstr(err, "Q4_K blocks (256)"),
           "%s", e ? "accepted" : err);
    /* a quantized tensor of the wrong shape */
    CHECKF(tm_write(&p, path, reshape_kv, NULL, err) == 0, "%s", err);
    e = dsf_engine_open(path, NULL, err);
    CHECKF(!e && strstr(err, "tensor 'blk.2.attn_kv.weight' has wrong shape"), "%s", e ? "accepted" : err);
    /* truncated data: the quantized head runs past the end */
    qparams(&p);
    CHECKF(tm_write(&p, path, retype_head, NULL, err) == 0, "%s", err);
    long head = data_at(path, "output.weight", err);
    CHECK(head > 0 && truncate(path, head + 1000) == 0);
    e = dsf_engine_open(path, NULL, err);
    CHECKF(!e && strstr(err, "past the end of the file"), "%s", e ? "accepted" : err);
    CHECKF(strstr(err, "tensor '"), "the truncation error names no tensor: %s", err);
}
