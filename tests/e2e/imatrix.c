/* imatrix.c: `dsflash imatrix` on tiny41.gguf (issue 33).
 *
 * Guards against: sums of squared activations taken from the wrong activation (another
 * layer's, before the norm, the wrong token rows) or credited to the wrong tensor or expert,
 * token counts per expert that do not follow the routing, rows counted per group or compressed
 * row where the product's rows are those (imatrix_plain_prefill_matches_dumps, against the
 * official oracle's intermediates and the README's row counts); a file that the imatrix reader refuses or that
 * lacks llama-imatrix's keys (imatrix_round_trip); a file `dsflash quantize` refuses or does not
 * use, or whose quantized model does not run (imatrix_quantize_uses_it); weights missed or
 * mis-mapped when the engine repacks the MXFP4 experts or copies the dense weights into memory
 * (imatrix_repack_resident_same); text chunks not made as llama-imatrix makes them: tokenized
 * with BOS in front, cut into --ctx tokens, BOS first in each chunk, the tail dropped
 * (imatrix_text_chunks); and bad input that crashes, is silent or leaves a file behind
 * (imatrix_refuses_*). */
#include "test.h"
#include "helpers.h"
#include "golden.h"
#include "convert/imatrix.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TINY41 "testdata/tiny41/tiny41.gguf"
#define DUMP "testdata/tiny41/golden/plain-prefill.dump/"

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Runs `dsflash imatrix -m model ARGS -o out` (output into log); returns the exit status. */
static int run_imatrix(const char *model, const char *args, const char *out, const char *env, char *log, size_t cap) {
    char *cmd = malloc(strlen(args) + 2048);
    sprintf(cmd, "%s %s imatrix -m %s %s -o %s 2>&1", env ? env : "", test_bin(), model, args, out);
    int rc = test_run(cmd, log, cap);
    free(cmd);
    return rc;
}

/* "--tokens 0,1,2" of the first n tokens of a golden case into buf (malloc'ed). */
static char *tokens_arg(const golden *g, int n) {
    char *buf = malloc((size_t)n * 12 + 16), *p = buf + sprintf(buf, "--tokens ");
    for (int i = 0; i < n; i++) p += sprintf(p, i ? ",%d" : "%d", g->tokens[i]);
    return buf;
}

/* A dump of the plain-prefill case (n floats or ints), NULL if absent or short. */
static void *load_dump(const char *name, long n) {
    char rel[256];
    snprintf(rel, sizeof rel, DUMP "%s", name);
    const char *p = test_shared(rel);
    long sz = 0;
    unsigned char *d = p ? test_slurp(p, &sz) : NULL;
    if (d && sz != n * 4) {
        free(d);
        d = NULL;
    }
    return d;
}

/* Compares the pair of weight w (matrix k, ne0 D) with the sum over the rows of x[T][D] whose
 * sel[t] is set (all when sel is NULL): counts exactly, in_sum2 within the tolerance below.
 * worst[0], worst[1]: the largest error seen relative to the column, to the mean column
 * (updated). 0, or -1 with msg on failure. */
/* Tolerance of in_sum2: our activations differ from the oracle's by fp32 summation-order
 * noise (the README's oracle-vs-oracle agreement is ~1e-5 on the logits). Measured here
 * (the test prints it): at most 2.5e-6 of the column's own value and 2.4e-6 of the mean
 * column; the bound, 2.5e-5 of each summed, is 10x that. A token row missing or counted
 * twice moves a column by ~1/64 (1.6 %), another layer's or an unnormed input by far more. */
#define RTOL 2.5e-5
#define MTOL 2.5e-5
static int check_pair(const gguf_file *f, const char *w, int k, const float *x, const bool *sel, int T, int D,
                      double *worst, char *msg, size_t cap) {
    char sn[128], cn[128];
    snprintf(sn, sizeof sn, "%s.in_sum2", w);
    snprintf(cn, sizeof cn, "%s.counts", w);
    const gguf_tensor *s = gguf_find_tensor(f, sn), *c = gguf_find_tensor(f, cn);
    if (!s || !c) return snprintf(msg, cap, "%s: no in_sum2/counts pair", w), -1;
    if (s->ne[0] != D || s->ne[1] <= k || c->ne[1] != s->ne[1])
        return snprintf(msg, cap, "%s: shape {%lld, %lld}", w, (long long)s->ne[0], (long long)s->ne[1]), -1;
    const float *got = (const float *)(const void *)s->data + (size_t)k * D;
    const float cnt = ((const float *)(const void *)c->data)[k];
    int n = 0;
    double mean = 0, want[4096];
    for (int i = 0; i < D; i++) want[i] = 0;
    for (int t = 0; t < T; t++) {
        if (sel && !sel[t]) continue;
        n++;
        for (int i = 0; i < D; i++) want[i] += (double)x[t * D + i] * x[t * D + i];
    }
    if (cnt != (float)n) return snprintf(msg, cap, "%s[%d]: count %g, the oracle routed %d tokens", w, k, cnt, n), -1;
    for (int i = 0; i < D; i++) mean += want[i] / D;
    for (int i = 0; i < D; i++) {
        double err = fabs(got[i] - want[i]), tol = RTOL * want[i] + MTOL * mean;
        if (want[i] > 0 && err / want[i] > worst[0]) worst[0] = err / want[i];
        if (mean > 0 && err / mean > worst[1]) worst[1] = err / mean;
        if (err > tol) return snprintf(msg, cap, "%s[%d] column %d: %.8g, the oracle's activations give %.8g", w, k, i, got[i], want[i]), -1;
    }
    return 0;
}

/* counts[k] of weight w is want (for the weights whose inputs the oracle does not dump). */
static int check_count(const gguf_file *f, const char *w, int k, int want, char *msg, size_t cap) {
    char cn[128];
    snprintf(cn, sizeof cn, "%s.counts", w);
    const gguf_tensor *c = gguf_find_tensor(f, cn);
    if (!c || c->ne[1] <= k) return snprintf(msg, cap, "%s: no counts of matrix %d", w, k), -1;
    const float got = ((const float *)(const void *)c->data)[k];
    if (got != (float)want) return snprintf(msg, cap, "%s[%d]: count %g, want %d", w, k, got, want), -1;
    return 0;
}

TEST(imatrix_plain_prefill_matches_dumps) {
    NEED_SHARED(model, TINY41);
    golden g;
    if (golden_load("plain-prefill", &g) < 0) SKIP("needs the plain-prefill golden");
    char out[512], log[4096], msg[512] = "", err[DSF_ERR_LEN];
    snprintf(out, sizeof out, "%s/im-pp.gguf", test_tmpdir());
    char *args = tokens_arg(&g, g.n);
    strcat(args, " --numerics plain --threads 2");
    int rc = run_imatrix(model, args, out, NULL, log, sizeof log);
    free(args);
    const int T = g.n, D = 128, HC = 4, K = 2, E = 8;
    golden_free(&g);
    CHECKF(rc == 0, "imatrix exited %d: %s", rc, log);
    gguf_file *f = gguf_open(out, err), *m = gguf_open(model, err);
    CHECKF(f && m, "%s", err);
    double worst[2] = {0, 0};
    int bad = 0, checked = 0;
    for (int L = 0; L < 8 && !bad; L++) {
        char nm[64], w[128];
        snprintf(nm, sizeof nm, "L%02d.attn_in.f32", L);
        float *a = load_dump(nm, T * D);
        snprintf(nm, sizeof nm, "L%02d.ffn_in.f32", L);
        float *x = load_dump(nm, T * D);
        snprintf(nm, sizeof nm, "L%02d.moe_indices.i32", L);
        int32_t *idx = load_dump(nm, T * K);
        /* the stream entering the layer's hc mix: after the Engram add, else the last block */
        if (L == 1 || L == 4) snprintf(nm, sizeof nm, "L%02d.engram_out.f32", L);
        else snprintf(nm, sizeof nm, "L%02d.block_out.f32", L - 1);
        float *X = L > 0 ? load_dump(nm, T * HC * D) : NULL;
        if (!a || !x || !idx || (L > 0 && !X)) {
            snprintf(msg, sizeof msg, "layer %d: dumps absent or short", L);
            bad = -1;
        }
        /* attn_in: wq_a and wkv; on the compressor and indexer layers also their inputs from u */
        static const char *const on_a[] = {"attn_q_a", "attn_kv", "attn_compressor_kv", "attn_compressor_gate",
                                           "indexer.proj"};
        for (int j = 0; j < 5 && !bad; j++) {
            snprintf(w, sizeof w, "blk.%d.%s.weight", L, on_a[j]);
            if (j >= 2 && !gguf_find_tensor(m, w)) continue;
            bad = check_pair(f, w, 0, a, NULL, T, D, worst, msg, sizeof msg);
            checked++;
        }
        static const char *const on_x[] = {"ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp"};
        for (int j = 0; j < 3 && !bad; j++) {
            snprintf(w, sizeof w, "blk.%d.%s.weight", L, on_x[j]);
            bad = check_pair(f, w, 0, x, NULL, T, D, worst, msg, sizeof msg);
            checked++;
        }
        for (int e = 0; e < E && !bad; e++) { /* routed: only the tokens the oracle sent to e */
            bool sel[256];
            for (int it = 0; it < T; it++) sel[it] = idx[it * K] == e || idx[it * K + 1] == e;
            snprintf(w, sizeof w, "blk.%d.ffn_gate_exps.weight", L);
            bad = check_pair(f, w, e, x, sel, T, D, worst, msg, sizeof msg);
            snprintf(w, sizeof w, "blk.%d.ffn_up_exps.weight", L);
            if (!bad) bad = check_pair(f, w, e, x, sel, T, D, worst, msg, sizeof msg);
            int n = 0;
            for (int it = 0; it < T; it++) n += sel[it];
            snprintf(w, sizeof w, "blk.%d.ffn_down_exps.weight", L);
            if (!bad) bad = check_count(f, w, e, n, msg, sizeof msg);
            checked += 2;
        }
        /* inputs not dumped: the counts. Every token once; the 2 output groups each once;
         * the index keys once per compressed row: the README's 32 rows of ratio 2 (KV sources
         * 2 and 4) and 64 of ratio 1 (KV source 5) in 64 tokens. */
        static const struct { const char *name; int count; } once[] = {
            {"attn_q_b", 64}, {"attn_output_a", 128}, {"attn_output_b", 64}, {"hc_ffn_fn", 64},
            {"ffn_down_shexp", 64}, {"engram_kv", 64}, {"indexer.attn_q_b", 64}, {"indexer.attn_k", 0}};
        for (size_t j = 0; j < sizeof once / sizeof once[0] && !bad; j++) {
            snprintf(w, sizeof w, "blk.%d.%s.weight", L, once[j].name);
            if (!gguf_find_tensor(m, w)) continue;
            bad = check_count(f, w, 0, once[j].count ? once[j].count : L == 5 ? 64 : 32, msg, sizeof msg);
        }
        if (L > 0 && !bad) {
            snprintf(w, sizeof w, "blk.%d.hc_attn_fn.weight", L);
            bad = check_pair(f, w, 0, X, NULL, T, HC * D, worst, msg, sizeof msg);
            checked++;
        }
        free(a);
        free(x);
        free(idx);
        free(X);
    }
    gguf_close(f);
    gguf_close(m);
    fprintf(stderr, "imatrix vs the oracle's dumps: %d matrices, worst error %.2e of the column, %.2e of the mean column\n",
            checked, worst[0], worst[1]);
    CHECKF(!bad, "%s", msg);
    unlink(out);
}

/* The whole file through the reader; llama-imatrix's keys with their types. */
TEST(imatrix_round_trip) {
    NEED_SHARED(model, TINY41);
    golden g;
    if (golden_load("text-prompt", &g) < 0) SKIP("needs the text-prompt golden");
    char out[512], log[4096], err[DSF_ERR_LEN] = "";
    snprintf(out, sizeof out, "%s/im-rt.gguf", test_tmpdir());
    char *args = tokens_arg(&g, g.n);
    int rc = run_imatrix(model, args, out, NULL, log, sizeof log);
    free(args);
    const int n = g.n;
    golden_free(&g);
    CHECKF(rc == 0, "imatrix exited %d: %s", rc, log);
    CHECKF(!file_exists(strcat(strcpy(err, out), ".tmp")), ".tmp left behind");
    gguf_file *f = gguf_open(out, err);
    CHECKF(f, "%s", err);
    const gguf_kv *gt = gguf_find_kv(f, "general.type"), *cc = gguf_find_kv(f, "imatrix.chunk_count"),
                  *cs = gguf_find_kv(f, "imatrix.chunk_size");
    bool ok = gt && gt->type == GGUF_VT_STRING && gt->str.len == 7 && !memcmp(gt->str.ptr, "imatrix", 7) && cc &&
              cc->type == GGUF_VT_UINT32 && cc->u == 1 && cs && cs->type == GGUF_VT_UINT32 && cs->u == (uint64_t)n &&
              !gguf_find_kv(f, "imatrix.datasets"); /* --tokens: no dataset file */
    const uint64_t nt = f->n_tensors;
    gguf_close(f);
    CHECKF(ok, "general.type / imatrix.chunk_count 1 / imatrix.chunk_size %d / no datasets: not as expected", n);
    /* every matmul weight of the layers: the model's "blk." tensors of 2 or 3 dims but
     * engram_gate (a vector per hc copy, not a product) */
    gguf_file *m = gguf_open(model, err);
    CHECKF(m, "%s", err);
    uint64_t want = 0;
    for (uint64_t i = 0; i < m->n_tensors; i++)
        want += !strncmp(m->tensors[i].name, "blk.", 4) && m->tensors[i].n_dims >= 2 &&
                !strstr(m->tensors[i].name, "engram_gate");
    gguf_close(m);
    imatrix *im = imatrix_open(out, err);
    CHECKF(im, "%s", err);
    CHECKF((uint64_t)imatrix_count(im) == want && nt == 2 * want, "%lld weights, %llu tensors; the model has %llu",
           (long long)imatrix_count(im), (unsigned long long)nt, (unsigned long long)want);
    imatrix_entry e;
    int r = imatrix_find(im, "blk.3.ffn_down_exps.weight", 64, 8, &e, err);
    CHECKF(r == 0, "blk.3.ffn_down_exps.weight: %d %s", r, err);
    float cnt = 0;
    for (int k = 0; k < 8; k++) cnt += e.counts[k];
    CHECKF(cnt == 2.0f * n, "expert tokens %g, want top-2 x %d", cnt, n); /* every token goes to 2 experts */
    r = imatrix_find(im, "blk.0.attn_output_a.weight", 128, 1, &e, err);
    CHECKF(r == 0 && e.counts[0] == 2.0f * n, "attn_output_a: %d, count %g (2 groups x %d rows)", r,
           r == 0 ? e.counts[0] : -1.0f, n);
    imatrix_close(im);
    unlink(out);
}

/* Q4_K_M with the collected imatrix: accepted, used (bytes differ from the run without it:
 * on tiny41 the K types fall back to Q5_0 / Q5_1, which weigh their error by it), and the
 * result runs. */
TEST(imatrix_quantize_uses_it) {
    NEED_SHARED(model, TINY41);
    golden g;
    if (golden_load("plain-prefill", &g) < 0) SKIP("needs the plain-prefill golden");
    char im[512], q[512], q0[512], log[4096], cmd[2048];
    snprintf(im, sizeof im, "%s/im-q.gguf", test_tmpdir());
    snprintf(q, sizeof q, "%s/im-q4.gguf", test_tmpdir());
    snprintf(q0, sizeof q0, "%s/im-q4-0.gguf", test_tmpdir());
    char *args = tokens_arg(&g, g.n);
    int rc = run_imatrix(model, args, im, NULL, log, sizeof log);
    CHECKF(rc == 0, "imatrix exited %d: %s", rc, log);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s Q4_K_M --imatrix %s 2>&1", test_bin(), model, q, im);
    rc = test_run(cmd, log, sizeof log);
    CHECKF(rc == 0, "quantize --imatrix exited %d: %s", rc, log);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s Q4_K_M 2>&1", test_bin(), model, q0);
    rc = test_run(cmd, log, sizeof log);
    CHECKF(rc == 0, "quantize exited %d: %s", rc, log);
    long na = 0, nb = 0;
    unsigned char *x = test_slurp(q, &na), *y = test_slurp(q0, &nb);
    bool differ = x && y && na == nb && memcmp(x, y, (size_t)na) != 0;
    free(x);
    free(y);
    CHECKF(differ, "the imatrix changed no byte of the Q4_K_M file (or a file is missing)");
    char *cmdl = malloc(strlen(args) + 1024), lg[512];
    snprintf(lg, sizeof lg, "%s/im-q4.f32", test_tmpdir());
    sprintf(cmdl, "%s logits -m %s --numerics plain --out %s %s 2>&1", test_bin(), q, lg, args);
    rc = test_run(cmdl, log, sizeof log);
    free(cmdl);
    free(args);
    long sz = 0;
    float *l = rc == 0 ? (float *)test_slurp(lg, &sz) : NULL;
    bool finite = l && sz == (long)g.n * g.vocab * 4;
    for (long i = 0; finite && i < sz / 4; i++) finite = isfinite(l[i]);
    free(l);
    golden_free(&g);
    CHECKF(finite, "logits of the imatrix-quantized model: rc %d, %ld bytes, or non-finite: %s", rc, sz, log);
    unlink(im);
    unlink(q);
    unlink(q0);
    unlink(lg);
}

/* Reference numerics (the BF16 expert path), with the MXFP4 experts repacked and the dense
 * weights copied into memory, or both read from the file: the same file byte for byte (the
 * map follows the engine's copies), and no product left unmapped. */
TEST(imatrix_repack_resident_same) {
    NEED_SHARED(model, TINY41);
    golden g;
    if (golden_load("plain-prefill", &g) < 0) SKIP("needs the plain-prefill golden");
    char a[512], b[512], log[4096];
    snprintf(a, sizeof a, "%s/im-r1.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/im-r0.gguf", test_tmpdir());
    char *args = tokens_arg(&g, g.n);
    golden_free(&g);
    int ra = run_imatrix(model, args, a, "DSF_REPACK=1 DSF_RESIDENT=1 DSF_LOG=2", log, sizeof log);
    bool warned = strstr(log, "not collected") != NULL;
    bool repacked = strstr(log, "repacked the routed experts") != NULL;
    int rb = ra == 0 ? run_imatrix(model, args, b, "DSF_REPACK=0 DSF_RESIDENT=0", log, sizeof log) : -1;
    free(args);
    CHECKF(ra == 0 && rb == 0, "imatrix exited %d / %d: %s", ra, rb, log);
    CHECKF(!warned, "products left unmapped with the copies");
    long na = 0, nb = 0;
    unsigned char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, (size_t)na);
    free(x);
    free(y);
    CHECKF(same, "the file depends on where the weights live (repacked: %s)", repacked ? "yes" : "no (no AVX-512)");
    if (!repacked) fprintf(stderr, "imatrix_repack_resident_same: the kernels do not repack here: resident copies only\n");
    unlink(a);
    unlink(b);
}

/* The text of the text-prompt case through -f: its tokens are the golden's (BOS + the
 * sentence). --ctx 8 --chunks 2 must equal --tokens of [tok0..tok7] + [BOS, tok9..tok15]: the
 * second chunk's first token is overwritten by BOS, the tail beyond 2 chunks is not used. */
TEST(imatrix_text_chunks) {
    NEED_SHARED(model, TINY41);
    NEED_SHARED(gj, "testdata/tiny41/golden/text-prompt.json");
    golden g;
    if (golden_load("text-prompt", &g) < 0) SKIP("needs the text-prompt golden");
    json_t *j = test_load_json(gj);
    const char *text = json_string_value(json_object_get(json_object_get(j, "token_set_spec"), "text"));
    char txt[512], a[512], b[512], log[4096], args[1024], err[DSF_ERR_LEN];
    snprintf(txt, sizeof txt, "%s/im-text.txt", test_tmpdir());
    snprintf(a, sizeof a, "%s/im-ta.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/im-tb.gguf", test_tmpdir());
    FILE *fp = text ? fopen(txt, "w") : NULL;
    bool wrote = fp && fputs(text, fp) >= 0;
    if (fp) fclose(fp);
    json_decref(j);
    CHECKF(wrote && g.n >= 16 && g.tokens[0] == 0, "text-prompt: text or tokens not as expected");
    snprintf(args, sizeof args, "-f %s --ctx 8 --chunks 2", txt);
    int ra = run_imatrix(model, args, a, NULL, log, sizeof log);
    CHECKF(ra == 0, "imatrix -f exited %d: %s", ra, log);
    int o = snprintf(args, sizeof args, "--ctx 8 --tokens ");
    for (int i = 0; i < 16; i++) o += snprintf(args + o, sizeof args - (size_t)o, i ? ",%d" : "%d", i == 8 ? g.tokens[0] : g.tokens[i]);
    golden_free(&g);
    int rb = run_imatrix(model, args, b, NULL, log, sizeof log);
    CHECKF(rb == 0, "imatrix --tokens exited %d: %s", rb, log);
    gguf_file *fa = gguf_open(a, err), *fb = gguf_open(b, err);
    CHECKF(fa && fb, "%s", err);
    const gguf_kv *ds = gguf_find_kv(fa, "imatrix.datasets"), *cc = gguf_find_kv(fa, "imatrix.chunk_count"),
                  *cs = gguf_find_kv(fa, "imatrix.chunk_size");
    bool keys = ds && ds->type == GGUF_VT_ARRAY && ds->arr_type == GGUF_VT_STRING && ds->arr_n == 1 &&
                ds->strs[0].len == strlen(txt) && !memcmp(ds->strs[0].ptr, txt, strlen(txt)) && cc && cc->u == 2 &&
                cs && cs->u == 8;
    bool same = fa->n_tensors == fb->n_tensors && fa->n_tensors > 0;
    for (uint64_t i = 0; same && i < fa->n_tensors; i++) {
        const gguf_tensor *x = &fa->tensors[i], *y = gguf_find_tensor(fb, x->name);
        same = y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
        if (!same) snprintf(err, sizeof err, "%s differs", x->name);
    }
    gguf_close(fa);
    gguf_close(fb);
    CHECKF(keys, "imatrix.datasets [\"%s\"], chunk_count 2, chunk_size 8: not as expected", txt);
    CHECKF(same, "-f TEXT and the equivalent --tokens differ: %s", err);
    unlink(a);
    unlink(b);
    unlink(txt);
}

/* Each refusal exits non-zero with one line naming the problem and leaves no output. */
TEST(imatrix_refuses_bad_input) {
    NEED_SHARED(model, TINY41);
    char out[512], txt[512], empty[512], log[4096], args[1024], tmp[600];
    snprintf(out, sizeof out, "%s/im-bad.gguf", test_tmpdir());
    snprintf(txt, sizeof txt, "%s/im-short.txt", test_tmpdir());
    snprintf(empty, sizeof empty, "%s/im-empty.txt", test_tmpdir());
    FILE *fp = fopen(txt, "w");
    CHECK(fp && fputs("The capital of France is Paris.", fp) >= 0);
    fclose(fp);
    fp = fopen(empty, "w");
    CHECK(fp);
    fclose(fp);
    const struct { const char *fmt, *arg, *out, *want; } bad[] = {
        {"-f %s", "/nonexistent/im.txt", out, "/nonexistent/im.txt"},
        {"-f %s", empty, out, "is empty"},
        {"-f %s --ctx 5000", txt, out, "--ctx 5000 is longer than the model's context (4096 tokens)"},
        {"-f %s", txt, out, "fewer than one chunk of --ctx 512"},
        {"-f %s --ctx 4", txt, "/nonexistent/dir/im.gguf", "cannot write /nonexistent/dir/im.gguf.tmp"},
        {"--tokens %s", "1,x", out, "bad token list"},
        {"--tokens %s", "1,2,99999", out, "99999"},
        {"-f %s --tokens 1", txt, out, "exactly one of -f TEXT and --tokens"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(args, sizeof args, bad[k].fmt, bad[k].arg);
        int rc = run_imatrix(model, args, bad[k].out, NULL, log, sizeof log);
        char *nl = strchr(log, '\n');
        CHECKF(rc != 0 && strstr(log, bad[k].want) && strstr(log, "dsflash imatrix: ") && nl && !nl[1],
               "%s: rc %d, want one line with \"%s\", got: %s", args, rc, bad[k].want, log);
        snprintf(tmp, sizeof tmp, "%s.tmp", bad[k].out);
        CHECKF(!file_exists(bad[k].out) && !file_exists(tmp), "%s: output left behind", args);
    }
    unlink(txt);
    unlink(empty);
}
