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

/* ---- random weights (helper q8b's block: the IQ kernels of q8k_iq_avx512.c) ----
 * Guards against: a fast Q8_K kernel that decodes some index, sign selector, sub-scale or nibble
 * wrongly (random bytes reach every one, the fixture rows only what ggml's quantizer chose), that
 * drops or repeats a tail (n_in from one super-block to 17: partial K chunks; n_out not a
 * multiple of the 4-row tile; T not a multiple of the 4-token tile, across the 64-token chunk),
 * writes outside its rows [r0, r1) or past n_out in y (NaN sentinels must survive), overflows
 * its integer sums at the extreme codes (+-127 activations), or gives a token's result
 * bits that depend on T, the token's place in the batch or the row range.
 * Tolerance: against the twin (double sums of the dequantized operands), the fp32 rounding bound
 * of check_type: (n + 3) 2^-24 sum|w a|; batch invariance is bit for bit. */
static uint64_t q8b_s = 0x243F6A8885A308D3ull;
static uint32_t q8b_rnd(void) {
    q8b_s ^= q8b_s << 13;
    q8b_s ^= q8b_s >> 7;
    q8b_s ^= q8b_s << 17;
    return (uint32_t)(q8b_s >> 32);
}
static float q8b_unit(void) { return (float)q8b_rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* Random super-blocks (every byte random) with a moderate finite f16 d (at offset 0; IQ1_M's
 * in its scale words). */
static uint8_t *q8b_weights(uint32_t type, int64_t n_in, int64_t n_out, uint64_t *rb) {
    const uint64_t bs = ggml_type_size(type), nb = (uint64_t)n_in / 256;
    uint8_t *d = malloc(bs * nb * (uint64_t)n_out);
    for (uint64_t b = 0; b < nb * (uint64_t)n_out; b++) {
        for (uint64_t j = 0; j < bs; j++) d[b * bs + j] = (uint8_t)q8b_rnd();
        uint16_t h = f32_to_f16(0.001f + 0.05f * (q8b_unit() + 1.0f));
        if (type != GGML_TYPE_IQ1_M) memcpy(d + b * bs, &h, 2);
        else /* IQ1_M: d in the top nibbles of its 4 scale words (offset 48) */
            for (int j = 0; j < 4; j++) d[b * bs + 49 + 2 * j] = (uint8_t)((d[b * bs + 49 + 2 * j] & 0x0F) | ((h >> (4 * j)) & 0xF) << 4);
    }
    *rb = bs * nb;
    return d;
}

/* T tokens of Q8_K activations: random values; token 1 (if any) all -1 (codes all -127, the
 * largest offset sums), token 2 alternating +-3 (codes +-127). */
static dsf_q8k *q8b_acts(int64_t n_in, int64_t T) {
    float *x = malloc((size_t)n_in * sizeof *x);
    dsf_q8k *q = malloc((size_t)(T * n_in / 256) * sizeof *q);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < n_in; i++) x[i] = t == 1 ? -1.0f : t == 2 ? (i & 1 ? 3.0f : -3.0f) : q8b_unit() * 2.0f;
        quantize_row_q8k(x, n_in, q + t * (n_in / 256));
    }
    free(x);
    return q;
}

/* sum |w a| of row r, token t (the scalar codecs) */
static double q8b_absdot(const dsf_wmat *w, const dsf_q8k *x, int64_t r, int64_t t) {
    float *wr = malloc((size_t)w->n_in * sizeof *wr);
    dequant_row(w->type, w->data + (uint64_t)r * w->row_bytes, wr, w->n_in);
    const dsf_q8k *xb = x + t * (w->n_in / 256);
    double s = 0;
    for (int64_t i = 0; i < w->n_in; i++) s += fabs((double)wr[i] * xb[i / 256].d * xb[i / 256].qs[i % 256]);
    free(wr);
    return s;
}

/* One case: table k against the twin over rows [r0, r1), then each token alone (T = 1, rows
 * [r0, r1)) and the rows' full range must give the same bits. Returns an error or NULL. */
static const char *q8b_case(const dsf_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t T, int64_t r0,
                            int64_t r1, char *err, size_t cap) {
    dsf_wmat w = {.type = type, .n_in = n_in, .n_out = n_out};
    uint8_t *data = q8b_weights(type, n_in, n_out, &w.row_bytes);
    w.data = data;
    dsf_q8k *x = q8b_acts(n_in, T);
    const int64_t ldy = n_out + 3;
    float *y = malloc((size_t)(T * ldy) * sizeof *y), *yr = malloc((size_t)(T * ldy) * sizeof *yr);
    float *y1 = malloc((size_t)ldy * sizeof *y1), *yf = malloc((size_t)(T * ldy) * sizeof *yf);
    for (int64_t i = 0; i < T * ldy; i++) y[i] = yr[i] = yf[i] = NAN;
    kern_matmul_q8k(k, &w, x, T, y, ldy, r0, r1);
    matmul_q8k_any_ref(&w, x, T, yr, ldy, r0, r1);
    kern_matmul_q8k(k, &w, x, T, yf, ldy, 0, n_out);
    const char *res = NULL;
    for (int64_t t = 0; t < T && !res; t++) {
        for (int64_t i = 0; i < ldy; i++) y1[i] = NAN;
        kern_matmul_q8k(k, &w, x + t * (n_in / 256), 1, y1, ldy, r0, r1);
        for (int64_t r = 0; r < ldy && !res; r++) {
            const float a = y[t * ldy + r];
            if (r < r0 || r >= r1) {
                if (!isnan(a) || !isnan(y1[r])) res = "wrote outside its rows";
                continue;
            }
            const double tol = (double)(n_in + 3) * 0x1p-24 * q8b_absdot(&w, x, r, t);
            if (!(fabs((double)a - yr[t * ldy + r]) <= tol)) res = "table vs twin";
            else if (memcmp(&a, &y1[r], 4) != 0) res = "T > 1 differs from the token alone (T = 1)";
            else if (memcmp(&a, &yf[t * ldy + r], 4) != 0) res = "the row range changes the bits";
            if (res)
                snprintf(err, cap, "%s %s n_in=%lld n_out=%lld T=%lld rows [%lld,%lld): y[%lld][%lld] = %.9g, twin %.9g: %s",
                         k->name, ggml_type_name(type), (long long)n_in, (long long)n_out, (long long)T, (long long)r0,
                         (long long)r1, (long long)t, (long long)r, a, yr[t * ldy + r], res), res = err;
        }
    }
    free(data);
    free(x);
    free(y);
    free(yr);
    free(y1);
    free(yf);
    return res;
}

TEST(q8k_random_weights_iq) {
    static const char *names[] = {"avx2", "avx512", "amx"};
    static const uint32_t types[] = {GGML_TYPE_IQ4_XS, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M};
    static const int64_t n_ins[] = {256, 512, 768, 1024, 1280, 2304, 4352};
    static const int64_t Ts[] = {1, 2, 3, 7, 17};
    char err[400];
    int n_run = 0;
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        for (size_t a = 0; a < sizeof types / sizeof types[0]; a++) {
            if (!k->matmul_q8k[types[a]]) continue;
            n_run++;
            for (size_t b = 0; b < sizeof n_ins / sizeof n_ins[0]; b++)
                for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
                    const int64_t n_in = n_ins[b], n_out = n_in > 1000 ? 7 : 13; /* not a multiple of 4 */
                    const char *bad = q8b_case(k, types[a], n_in, n_out, Ts[c], 0, n_out, err, sizeof err);
                    if (!bad) bad = q8b_case(k, types[a], n_in, n_out, Ts[c], 1, n_out - 1, err, sizeof err);
                    if (!bad) bad = q8b_case(k, types[a], n_in, n_out, Ts[c], 2, 3, err, sizeof err);
                    CHECKF(!bad, "%s", bad);
                    if (bad) return;
                }
            /* prefill-sized: across the 64-token chunk and the K chunks (17 super-blocks) */
            const char *bad = q8b_case(k, types[a], 4352, 9, 67, 1, 9, err, sizeof err);
            CHECKF(!bad, "%s", bad);
        }
    }
    if (n_run == 0) SKIP("no SIMD table with an IQ Q8_K kernel runs on this CPU");
}
/* ---- end of q8b's block ---- */
