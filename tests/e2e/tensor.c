/* tensor.c: `dsflash tensor`, the one-tensor dequantizer, run as a process.
 * Guards against: a dequantization that differs from ggml's (the fixtures' TYPE.deq.f32) for
 * any type the engine decodes, a type without a decoder that is not named, the BF16 tensors of
 * a real converter output not read bit-exactly, wrong element order, NaN/Inf values (a block
 * scale of NaN or Inf) passed silently or reported at the wrong row and block, and errors
 * (unknown name, unwritable output, truncated file, bad usage) that crash, stay silent or leave
 * a partial output file behind. */
#include "test.h"
#include "helpers.h"
#include "qfix.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;
    uint32_t type, nd;
    int64_t ne[2];
    const void *data;
    uint64_t n; /* bytes */
} tdesc;

static int write_gguf(const char *path, const tdesc *d, int n, char *err) {
    gguf_writer *w = gguf_writer_new();
    int rc = gguf_writer_kv_str(w, "general.architecture", "test", err);
    for (int i = 0; i < n && rc == 0; i++) rc = gguf_writer_tensor(w, d[i].name, d[i].type, d[i].nd, d[i].ne, err);
    if (rc == 0) rc = gguf_writer_begin(w, path, err);
    for (int i = 0; i < n && rc == 0; i++) rc = gguf_writer_write(w, d[i].data, d[i].n, err);
    if (rc == 0) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc;
}

/* Runs `dsflash tensor MODEL NAME ARGS` (stderr into out); returns the exit status. */
static int run_tensor(const char *model, const char *name, const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s tensor %s %s %s 2>&1", test_bin(), model, name, args);
    return test_run(cmd, out, cap);
}

/* The output file as floats; NULL if absent; *n its count. */
static float *read_f32(const char *path, int64_t *n) {
    long size = 0;
    float *v = (float *)test_slurp(path, &size);
    *n = v ? size / 4 : 0;
    return v;
}

/* Index of the first value of a and b (n each) that differ as floats (-0 == +0, inf == inf), or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(a[i] == b[i]) && !(isnan(a[i]) && isnan(b[i]))) return i;
    return -1;
}

/* One fixture type: rows 0..3 as a [4][1024] tensor, rows 4 and 5 as vectors, the crafted
 * blocks as a vector; each written by `dsflash tensor` must equal ggml's values. */
static void check_type(test_ctx *t, const qfix *f, const char *model) {
    char err[DSF_ERR_LEN], out[4096], args[512];
    const char *of = test_tmpfile("tensor-out.f32");
    const tdesc d[4] = {
        {"q.rows", f->id, 2, {f->row_len[0], 4}, f->q, (uint64_t)qfix_row_bytes_at(f, 4)},
        {"q.row4", f->id, 1, {f->row_len[4], 1}, f->q + qfix_row_bytes_at(f, 4), (uint64_t)(f->row_len[4] / f->bs * f->ts)},
        {"q.row5", f->id, 1, {f->row_len[5], 1}, f->q + qfix_row_bytes_at(f, 5), (uint64_t)(f->row_len[5] / f->bs * f->ts)},
        {"q.rand", f->id, 1, {f->rn, 1}, f->rq, (uint64_t)(f->rn / f->bs * f->ts)},
    };
    CHECKF(write_gguf(model, d, 4, err) == 0, "%s: %s", f->name, err);
    const float *want[4] = {f->deq, f->deq + qfix_row_values_at(f, 4), f->deq + qfix_row_values_at(f, 5), f->rdeq};
    const int64_t n_want[4] = {4 * f->row_len[0], f->row_len[4], f->row_len[5], f->rn};
    for (int i = 0; i < 4; i++) {
        unlink(of);
        snprintf(args, sizeof args, "--out %s --allow-nonfinite", of);
        int rc = run_tensor(model, d[i].name, args, out, sizeof out);
        if (!ggml_type_supported(f->id)) { /* no decoder yet: the refusal names the type */
            CHECKF(rc != 0 && strstr(out, f->name) && strstr(out, "not supported") && access(of, F_OK) != 0,
                   "%s: rc %d: %s", f->name, rc, out);
            continue;
        }
        CHECKF(rc == 0, "%s %s: rc %d: %s", f->name, d[i].name, rc, out);
        int64_t n;
        float *v = read_f32(of, &n);
        CHECKF(v && n == n_want[i], "%s %s: %lld values, want %lld", f->name, d[i].name, (long long)n,
               (long long)n_want[i]);
        int64_t k = first_diff(v, want[i], n); /* bit-exact up to the sign of zero (README) */
        float got = k >= 0 ? v[k] : 0;
        free(v);
        CHECKF(k < 0, "%s %s: value %lld is %.9g, ggml's is %.9g", f->name, d[i].name, (long long)k, (double)got,
               (double)want[i][k]);
    }
    if (!ggml_type_supported(f->id)) return;
    /* Without --allow-nonfinite, the crafted row is refused exactly when ggml's values hold a
     * NaN or an infinity (E8M0 255, F16 infinities...), at ggml's first such block. */
    int64_t bad = -1;
    for (int64_t i = 0; i < f->rn && bad < 0; i++)
        if (!isfinite(f->rdeq[i])) bad = i / f->bs;
    unlink(of);
    snprintf(args, sizeof args, "--out %s", of);
    int rc = run_tensor(model, "q.rand", args, out, sizeof out);
    if (bad < 0) {
        CHECKF(rc == 0, "%s: rc %d: %s", f->name, rc, out);
        return;
    }
    char where[64];
    snprintf(where, sizeof where, "row 0, block %lld ", (long long)bad);
    CHECKF(rc != 0 && strstr(out, where) && strstr(out, "NaN or infinite") && access(of, F_OK) != 0,
           "%s: want a refusal at %s: rc %d: %s", f->name, where, rc, out);
}

TEST(tensor_matches_ggml_dequantization) {
    char names[QFIX_MAX_TYPES][16];
    const int n = qfix_types(names, QFIX_MAX_TYPES);
    if (n == 0) SKIP("needs ../shared/testdata/quants");
    char model[512]; /* test_tmpfile's buffers rotate */
    snprintf(model, sizeof model, "%s", test_tmpfile("tensor-fixture.gguf"));
    int supported = 0;
    for (int i = 0; i < n; i++) {
        qfix f;
        CHECKF(qfix_load(names[i], &f), "fixture %s incomplete", names[i]);
        supported += ggml_type_supported(f.id);
        check_type(t, &f, model);
        qfix_free(&f);
        if (t->failed) return;
    }
    /* F16, BF16, Q4_0..Q8_0, Q2_K..Q8_K and MXFP4 at least (the decoders of issue 33 add the rest) */
    CHECKF(supported >= 14, "only %d fixture types decoded", supported);
}

/* tiny41's BF16 tensors (a converter's output): value = the BF16 bits << 16 (spec §1.5),
 * element order as stored. */
TEST(tensor_bf16_of_tiny41) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN], out[2048], args[512];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    const char *names[] = {"token_embd.weight", "blk.0.attn_q_b.weight", "output.weight"};
    const char *of = test_tmpfile("tensor-bf16.f32");
    for (int i = 0; i < 3; i++) {
        const gguf_tensor *tt = gguf_find_tensor(g, names[i]);
        CHECKF(tt && tt->type == GGML_TYPE_BF16, "%s is not BF16 in tiny41", names[i]);
        snprintf(args, sizeof args, "--out %s", of);
        int rc = run_tensor(model, names[i], args, out, sizeof out);
        CHECKF(rc == 0, "%s: rc %d: %s", names[i], rc, out);
        int64_t n;
        float *v = read_f32(of, &n);
        CHECKF(v && (uint64_t)n * 2 == tt->nbytes, "%s: %lld values for %llu bytes", names[i], (long long)n,
               (unsigned long long)tt->nbytes);
        int64_t bad = -1;
        for (int64_t k = 0; k < n && bad < 0; k++) {
            uint32_t want = (uint32_t)(tt->data[2 * k] | tt->data[2 * k + 1] << 8) << 16, got;
            memcpy(&got, &v[k], 4);
            if (got != want) bad = k;
        }
        free(v);
        CHECKF(bad < 0, "%s: value %lld differs from its BF16 bits", names[i], (long long)bad);
    }
    gguf_close(g);
}

/* A Q8_0 tensor [3][64] whose row 1, block 1 has a NaN scale and row 2, block 0 an Inf one (f16
 * 0x7E00 and 0x7C00, spec §1.5: y = d * q). */
TEST(tensor_reports_nonfinite_blocks) {
    uint8_t blk[6][34];
    for (int b = 0; b < 6; b++) {
        uint16_t d = 0x2C00; /* 1/16 */
        if (b == 3) d = 0x7E00;
        if (b == 4) d = 0x7C00;
        memcpy(blk[b], &d, 2);
        for (int i = 0; i < 32; i++) blk[b][2 + i] = (uint8_t)(i - 16);
    }
    char err[DSF_ERR_LEN], out[4096], args[512];
    const char *model = test_tmpfile("tensor-nan.gguf"), *of = test_tmpfile("tensor-nan.f32");
    const tdesc d = {"w", GGML_TYPE_Q8_0, 2, {64, 3}, blk, sizeof blk};
    CHECKF(write_gguf(model, &d, 1, err) == 0, "%s", err);
    int rc = run_tensor(model, "w", "--check", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "w: row 1, block 1 ") && strstr(out, "w: row 2, block 0 ") &&
               strstr(out, "64 values in 2 blocks are NaN or infinite"),
           "rc %d: %s", rc, out);
    unlink(of);
    snprintf(args, sizeof args, "--out %s", of);
    rc = run_tensor(model, "w", args, out, sizeof out);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", of);
    CHECKF(rc == 1 && strstr(out, "nothing written") && access(of, F_OK) != 0 && access(tmp, F_OK) != 0,
           "rc %d: %s", rc, out);
    snprintf(args, sizeof args, "--out %s --allow-nonfinite", of);
    rc = run_tensor(model, "w", args, out, sizeof out);
    int64_t n;
    float *v = read_f32(of, &n);
    /* y = d * q with q = i - 16: d = 1/16 gives -1 at i = 0; row 1, block 1 (NaN d) is all NaN;
     * row 2, block 0 (Inf d) is -inf at i = 1 and NaN at i = 16 (inf * 0); row 2, block 1 finite */
    CHECKF(rc == 0 && v && n == 192 && v[0] == -1.0f && v[17] == 0.0625f && isnan(v[96]) && isnan(v[127]) &&
               isinf(v[129]) && v[129] < 0 && isnan(v[144]) && v[160] == -1.0f,
           "rc %d: %s", rc, out);
    free(v);
}

TEST(tensor_errors) {
    NEED_SHARED(tiny, "testdata/tiny41/tiny41.gguf");
    char out[4096], cmd[1200];
    int rc = run_tensor(tiny, "no.such.tensor", "--check", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "no tensor named 'no.such.tensor'"), "rc %d: %s", rc, out);
    rc = run_tensor(tiny, "output.weight", "--out /nonexistent-dir/x.f32", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "cannot write /nonexistent-dir/x.f32"), "rc %d: %s", rc, out);
    rc = run_tensor(tiny, "output.weight", "", out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--out"), "rc %d: %s", rc, out);
    rc = run_tensor(tiny, "", "--out x --check", out, sizeof out);
    CHECKF(rc == 2, "rc %d: %s", rc, out);
    rc = run_tensor(tiny, "output.weight", "--bogus", out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "unknown option --bogus"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s tensor --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "--allow-nonfinite"));
    /* a truncated copy: the last tensor's data runs past the end; the reader names it */
    long size = 0;
    unsigned char *buf = test_slurp(tiny, &size);
    free(buf);
    const char *cut = test_tmpfile("tensor-cut.gguf");
    CHECK(size > 4096 && test_copy_head(tiny, (uint64_t)size - 1000, cut) == 0);
    rc = run_tensor(cut, "output.weight", "--check", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "runs past the end of the file") && strstr(out, "tensor '"), "rc %d: %s", rc, out);
}
