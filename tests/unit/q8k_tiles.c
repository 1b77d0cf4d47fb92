/* q8k_tiles.c: every table's Q8_K-activation kernels of the K-quants (matmul.h matmul_q8k_fn) on
 * random blocks, many shapes, token counts and row ranges, against the scalar twin
 * matmul_q8k_any_ref (q8k.c checks the fixtures; this file the tiles and drivers).
 *
 * Guards against: a tile that drops or repeats a row or token at an edge (n_out not a multiple
 * of 4, T not a multiple of 4, one-row ranges), writes outside [r0, r1) or into the ldy gap (NaN
 * sentinels must survive), wrong token-chunk handling (chunks of 128 KiB / n_in tokens: n_in =
 * 4096 with T = 40 and 16384 with T = 9 cross one), a wrong sub-block scale, minimum or d for any
 * byte value (random bytes cover every code and scale), and results that depend on the batch
 * (each token of a batch must equal, bit for bit, the same token run alone).
 *
 * Tolerance: the integer dots are exact; per super-block two fp32 products and two accumulating
 * FMAs, then a 16-lane tree: at most n_in/256 * 4 + 8 roundings of 2^-24 of sum|w a| (the terms
 * d dx isum and dmin dx imin are each at most sum|w a|-sized for these blocks' moderate d/dmin);
 * (n_in + 3) * 2^-24 * sum|w a| (q8k.c's bound) covers it. A decoding error is O(|w a|). */
#include "test.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t q8t_s = 0x2545F4914F6CDD1Dull;
static uint64_t q8t_rnd(void) {
    q8t_s ^= q8t_s << 13;
    q8t_s ^= q8t_s >> 7;
    q8t_s ^= q8t_s << 17;
    return q8t_s;
}

/* offsets of the f16 d (and dmin) in each K-quant block (gguf-layout §1.5) */
static int q8t_scale_offs(uint32_t type, int *o) {
    switch (type) {
    case GGML_TYPE_Q2_K: o[0] = 80, o[1] = 82; return 2;
    case GGML_TYPE_Q3_K: o[0] = 108; return 1;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: o[0] = 0, o[1] = 2; return 2;
    default: o[0] = 208; return 1; /* Q6_K */
    }
}

/* random block bytes, with moderate positive f16 d / dmin */
static uint8_t *q8t_weights(uint32_t type, int64_t n_in, int64_t n_out, uint64_t *rb) {
    const uint64_t bs = ggml_type_size(type), nb = (uint64_t)n_in / 256;
    uint8_t *d = malloc(bs * nb * (uint64_t)n_out);
    for (uint64_t b = 0; b < nb * (uint64_t)n_out; b++) {
        uint8_t *p = d + b * bs;
        for (uint64_t i = 0; i < bs; i++) p[i] = (uint8_t)q8t_rnd();
        int o[2], n = q8t_scale_offs(type, o);
        for (int k = 0; k < n; k++) {
            uint16_t h = f32_to_f16(0.001f + 0.02f * (float)(q8t_rnd() % 1000) / 1000.0f);
            memcpy(p + o[k], &h, 2);
        }
    }
    *rb = bs * nb;
    return d;
}

/* sum_i |w_i a_i| for row r and token t (the dequantized operands) */
static double q8t_abs_dot(const dsf_wmat *w, const dsf_q8k *x, int64_t r, int64_t t) {
    float *row = malloc((size_t)w->n_in * sizeof *row);
    wmat_dequant_row(w, r, row);
    const dsf_q8k *xb = x + t * (w->n_in / 256);
    double s = 0;
    for (int64_t i = 0; i < w->n_in; i++) s += fabs((double)row[i] * xb[i / 256].d * xb[i / 256].qs[i % 256]);
    free(row);
    return s;
}

static int q8t_case(test_ctx *t, const dsf_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t T,
                    int64_t r0, int64_t r1) {
    dsf_wmat w = {.type = type, .n_in = n_in, .n_out = n_out};
    uint8_t *data = q8t_weights(type, n_in, n_out, &w.row_bytes);
    w.data = data;
    float *xf = malloc((size_t)n_in * sizeof *xf);
    dsf_q8k *x = malloc((size_t)(T * n_in / 256) * sizeof *x);
    for (int64_t tt = 0; tt < T; tt++) {
        for (int64_t i = 0; i < n_in; i++) /* with an outlier channel now and then */
            xf[i] = ((float)(q8t_rnd() % 20001) / 10000.0f - 1.0f) * (q8t_rnd() % 97 == 0 ? 30.0f : 1.0f);
        quantize_row_q8k(xf, n_in, x + tt * (n_in / 256));
    }
    const int64_t ldy = n_out + 3;
    float *y = malloc((size_t)(T * ldy) * sizeof *y), *yr = malloc((size_t)(T * ldy) * sizeof *yr),
          *y1 = malloc((size_t)ldy * sizeof *y1);
    for (int64_t i = 0; i < T * ldy; i++) y[i] = yr[i] = NAN;
    kern_matmul_q8k(k, &w, x, T, y, ldy, r0, r1);
    matmul_q8k_any_ref(&w, x, T, yr, ldy, r0, r1);
    int rc = 0;
    for (int64_t tt = 0; tt < T && !rc; tt++) {
        if (T > 1) kern_matmul_q8k(k, &w, x + tt * (n_in / 256), 1, y1, ldy, r0, r1);
        for (int64_t r = 0; r < ldy && !rc; r++) {
            const float a = y[tt * ldy + r], b = yr[tt * ldy + r];
            if (r < r0 || r >= r1) {
                if (!isnan(a)) rc = -1;
                if (rc) test_fail(t, __FILE__, __LINE__, "%s %s n_in=%lld T=%lld: wrote y[%lld][%lld] outside [%lld,%lld)",
                                  k->name, ggml_type_name(type), (long long)n_in, (long long)T, (long long)tt, (long long)r,
                                  (long long)r0, (long long)r1);
                continue;
            }
            const double tol = (double)(n_in + 3) * 0x1p-24 * q8t_abs_dot(&w, x, r, tt);
            if (!(fabs((double)a - (double)b) <= tol) || (T > 1 && memcmp(&a, &y1[r], 4) != 0)) {
                test_fail(t, __FILE__, __LINE__, "%s %s n_in=%lld n_out=%lld T=%lld [%lld,%lld): y[%lld][%lld] = %.9g, twin %.9g (tol %.3g), alone %.9g",
                          k->name, ggml_type_name(type), (long long)n_in, (long long)n_out, (long long)T, (long long)r0,
                          (long long)r1, (long long)tt, (long long)r, a, b, tol, T > 1 ? y1[r] : a);
                rc = -1;
            }
        }
    }
    free(data);
    free(xf);
    free(x);
    free(y);
    free(yr);
    free(y1);
    return rc;
}

TEST(q8k_tiles_vs_twin) {
    static const char *names[] = {"avx2", "avx512", "amx"};
    static const uint32_t types[] = {GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    static const int64_t n_ins[] = {256, 512, 2304};
    static const int64_t Ts[] = {1, 2, 3, 7, 17};
    int n_run = 0;
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        for (size_t a = 0; a < sizeof types / sizeof *types; a++) {
            if (!k->matmul_q8k[types[a]]) continue;
            n_run++;
            for (size_t b = 0; b < sizeof n_ins / sizeof *n_ins; b++)
                for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
                    const int64_t n_out = 13; /* not a multiple of the 4-row tile */
                    if (q8t_case(t, k, types[a], n_ins[b], n_out, Ts[c], 0, n_out)) return;
                    if (q8t_case(t, k, types[a], n_ins[b], n_out, Ts[c], 1, n_out - 1)) return;
                    if (q8t_case(t, k, types[a], n_ins[b], n_out, Ts[c], 2, 3)) return;
                }
            /* token chunks: 128 KiB / n_in tokens per chunk */
            if (q8t_case(t, k, types[a], 4096, 5, 40, 0, 5)) return;
            if (q8t_case(t, k, types[a], 16384, 3, 9, 1, 3)) return;
        }
    }
    if (n_run == 0) SKIP("no table has a K-quant Q8_K kernel on this CPU");
}
