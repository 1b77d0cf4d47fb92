/* q8k.c: the opt-in Q8_K activation mode's kernels (kernels/matmul.h dsf_q8k): the activation
 * quantizer against ggml's own Q8_K bytes, and every table's matmul_q8k entries against the
 * scalar twin and against ggml's vec_dot results (../shared/testdata/quants, README "Tests a C
 * engine should run", item 2).
 *
 * Guards against: an activation quantizer that is not ggml's (rounding, the sign of the scale,
 * the cap at 127, the block sums), a Q8_K product that decodes a weight format wrongly or drops
 * the activation scale, a fast kernel that differs from its twin beyond fp32 rounding, and one
 * whose result for a token depends on the batch (T = 1 against T = 4, bit for bit). */
#include "test.h"
#include "helpers.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QDIR "testdata/quants/"

/* The fixture rows (index.json): 4 x 1024, 2304, 5120 values, all whole Q8_K blocks. */
static const int64_t row_len[6] = {1024, 1024, 1024, 1024, 2304, 5120};
#define N_ACT (4 * 1024 + 2304 + 5120)

/* The types whose vec_dot_type is Q8_K (README table). */
static const uint32_t q8k_types[] = {GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,  GGML_TYPE_Q5_K,
                                     GGML_TYPE_Q6_K,   GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
                                     GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S,  GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
                                     GGML_TYPE_IQ4_XS};
#define N_Q8K_TYPES (sizeof q8k_types / sizeof q8k_types[0])

static unsigned char *slurp_q(const char *file, long *size) {
    char rel[128];
    snprintf(rel, sizeof rel, QDIR "%s", file);
    const char *p = test_shared(rel);
    return p ? test_slurp(p, size) : NULL;
}

/* act.f32 quantized by quantize_row_q8k, row by row, must be TYPE.act.q byte for byte (ggml's
 * CPU from_float of Q8_K; the README: identical to ggml's reference quantizer on these rows). */
TEST(q8k_quantize_matches_ggml) {
    NEED_SHARED(idx, QDIR "index.json");
    long na = 0, nq = 0;
    float *act = (float *)slurp_q("act.f32", &na);
    unsigned char *want = slurp_q("Q4_K.act.q", &nq);
    CHECKF(act && want && na == N_ACT * 4 && nq == N_ACT / 256 * 292, "fixture sizes %ld, %ld", na, nq);
    unsigned char *got = malloc((size_t)nq);
    int64_t off = 0;
    for (int r = 0; r < 6; r++) {
        quantize_row_q8k(act + off, row_len[r], got + off / 256 * 292);
        off += row_len[r];
    }
    for (long i = 0; i < nq; i++)
        if (got[i] != want[i]) {
            test_fail(t, __FILE__, __LINE__, "byte %ld (block %ld, offset %ld): %02x, ggml %02x", i, i / 292, i % 292,
                      got[i], want[i]);
            break;
        }
    free(act);
    free(want);
    free(got);
}

/* One type: its fixture rows (TYPE.q) times ggml's activation blocks (TYPE.act.q) through table k
 * (NULL: the twin). The twin must meet the README's bound against ggml's vec_dot (|s - dot[0]| <=
 * 2e-6 dot[2]: ggml is within 5.1e-7 of the exact dot of the same operands); a fast table must
 * equal the twin within fp32 rounding (n + 3 roundings of at most 2^-24 of sum|w a| = dot[2]:
 * the bound (n + 3) 2^-24 dot[2]), and give the same bits for a row whether it runs alone or in
 * a batch of 4 tokens (rows 0-3 share their length). */
static const char *check_type(const dsf_kernels *k, uint32_t type, char *err, size_t cap) {
    char fn[64];
    long nq = 0, na = 0, nd = 0;
    snprintf(fn, sizeof fn, "%s.q", ggml_type_name(type));
    unsigned char *wq = slurp_q(fn, &nq);
    snprintf(fn, sizeof fn, "%s.act.q", ggml_type_name(type));
    dsf_q8k *aq = (dsf_q8k *)slurp_q(fn, &na);
    snprintf(fn, sizeof fn, "%s.dot.f32", ggml_type_name(type));
    float *dot = (float *)slurp_q(fn, &nd);
    const char *res = NULL;
    if (!wq || !aq || !dot || na != N_ACT / 256 * 292 || nd != 6 * 5 * 4) {
        res = "fixture files missing or of the wrong size";
        goto done;
    }
    int64_t woff = 0, aoff = 0;
    const uint64_t bpb = ggml_type_size(type) * (256 / ggml_blck_size(type)); /* bytes per 256 values */
    for (int r = 0; r < 6 && !res; r++) {
        const int64_t n = row_len[r], rb = (int64_t)((uint64_t)n / 256 * bpb);
        dsf_wmat w = {.type = type, .n_in = n, .n_out = 1, .row_bytes = (uint64_t)rb, .data = wq + woff};
        float ys = 0, yt[4] = {0};
        kern_matmul_q8k(k, &w, aq + aoff / 256, 1, &ys, 1, 0, 1);
        const float *d = dot + 5 * r;
        if (!k && !(fabs((double)ys - d[0]) <= 2e-6 * d[2]))
            res = "twin vs ggml's vec_dot";
        if (k) {
            float yr = 0;
            matmul_q8k_any_ref(&w, aq + aoff / 256, 1, &yr, 1, 0, 1);
            if (!(fabs((double)ys - yr) <= (double)(n + 3) * 0x1p-24 * d[2])) res = "table vs twin";
            if (!res && r == 0) { /* rows 0-3 as 4 tokens of one row: token j = activation row j */
                dsf_q8k *x4 = aq;
                kern_matmul_q8k(k, &w, x4, 4, yt, 1, 0, 1);
                if (memcmp(&yt[0], &ys, 4) != 0) res = "T = 4 differs from T = 1";
            }
        }
        if (res)
            snprintf(err, cap, "%s %s row %d: %.9g (ggml %.9g, sum|wa| %.3g): %s", k ? k->name : "twin",
                     ggml_type_name(type), r, ys, d[0], d[2], res), res = err;
        woff += rb;
        aoff += n;
    }
done:
    free(wq);
    free(aq);
    free(dot);
    return res;
}

TEST(q8k_twin_matches_ggml_vecdot) {
    NEED_SHARED(idx, QDIR "index.json");
    char err[320];
    for (size_t i = 0; i < N_Q8K_TYPES; i++) {
        const char *bad = check_type(NULL, q8k_types[i], err, sizeof err);
        CHECKF(!bad, "%s", bad);
    }
}

TEST(q8k_tables_match_twin) {
    NEED_SHARED(idx, QDIR "index.json");
    static const char *names[] = {"avx2", "avx512", "amx"};
    char err[320];
    int n_tables = 0;
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        n_tables++;
        for (size_t i = 0; i < N_Q8K_TYPES; i++) {
            const char *bad = check_type(k, q8k_types[i], err, sizeof err);
            CHECKF(!bad, "%s", bad);
        }
    }
    if (n_tables == 0) SKIP("no SIMD table runs on this CPU");
}
