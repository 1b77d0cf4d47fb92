/* vec_avx512.c: AVX-512 versions of the attention / indexer / hc kernels
 * (vec.h). Compiled with the AVX-512 flags only; chosen at run time when the matmul
 * table is the AVX-512 one. Shapes a kernel does not handle fall back to the scalar twin.
 *
 * exp: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in two so n ln2 is exact),
 * the degree-7 Taylor polynomial of e^r in Horner form with FMA (truncation error < 6e-9
 * relative, far below the fp32 half-ulp), and vscalefps for the 2^n factor, which also
 * produces the subnormal, zero and infinite results. Measured against glibc expf over
 * [-104, 89]: at most 2 ulp (tests/unit/kernels_attn.c checks it). NaN propagates. */
#include "kernels/vec.h"
#include "kernels/quant.h"
#include "kernels/red512.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m512 exp512(__m512 x) {
    /* clamp so that n*ln2 and r stay finite: below -104 the result is 0, above 100 it is inf;
     * x is the second operand so that a NaN passes through */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* For the unit test: the vector exp on n floats. */
void ka_exp_avx512(float *y, const float *x, int64_t n);
void ka_exp_avx512(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

AI __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* ---- attention ------------------------------------------------------------------------- */

/* s[i][k] = (q_i . key_k) * scale for HN heads (q rows dh apart, s rows ld apart). */
AI void scores_tile(float *s, int64_t ld, const float *q, int64_t dh, const float *const *keys, int64_t nk,
                    float scale, const int HN) {
    for (int64_t k = 0; k < nk; k++) {
        const float *key = keys[k];
        __m512 a[4];
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) a[i] = _mm512_setzero_ps();
        for (int64_t x = 0; x < dh; x += 16) {
            __m512 kv = _mm512_loadu_ps(key + x);
#pragma GCC unroll 4
            for (int i = 0; i < HN; i++) a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * dh + x), kv, a[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) s[i * ld + k] = _mm512_reduce_add_ps(a[i]) * scale;
    }
}

/* The same for 4 heads x 4 keys at a time (8 loads per 16 FMAs instead of 5 per 4); each
 * (head, key) sum has the same lanes and order as scores_tile's, so the result is identical. */
static void scores_4x4(float *s, const float *q, int64_t dh, const float *const *keys, int64_t nk, float scale) {
    int64_t k = 0;
    for (; k + 4 <= nk; k += 4) {
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) a[i][r] = _mm512_setzero_ps();
        const float *kp[4] = {keys[k], keys[k + 1], keys[k + 2], keys[k + 3]};
        for (int64_t x = 0; x < dh; x += 16) {
            __m512 kv[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) kv[r] = _mm512_loadu_ps(kp[r] + x);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512 qv = _mm512_loadu_ps(q + i * dh + x);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) a[i][r] = _mm512_fmadd_ps(qv, kv[r], a[i][r]);
            }
        }
        /* the 16 sums at once (red16: lane 4r + i is head i's sum for key r), each by the tree
         * of _mm512_reduce_add_ps as scores_tile's: the same bits, 45 operations instead of 128 */
        __m512 a16[16];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) a16[4 * i + r] = a[i][r];
        _Alignas(64) float sum[16];
        _mm512_store_ps(sum, _mm512_mul_ps(red16(a16), _mm512_set1_ps(scale)));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) s[i * nk + k + r] = sum[4 * r + i];
    }
    if (k < nk) scores_tile(s + k, nk, q, dh, keys + k, nk - k, scale, 4);
}

#ifndef ATT_PF
#define ATT_PF 8 /* keys ahead for the P.V pass's software prefetch */
#endif

/* o[i][x..x+16*XN) = sum_k p[i][k] key_k[x..] / den[i] for HN heads. */
AI void acc_tile(float *o, const float *p, int64_t nk, int64_t dh, const float *const *keys, int64_t x,
                 const float *den, const int HN, const int XN) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < HN; i++)
#pragma GCC unroll 4
        for (int j = 0; j < XN; j++) a[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nk; k++) {
        const float *kr = keys[k] + x;
        /* this pass reads 64 bytes x XN of each key row, 2 KiB apart: the hardware
         * prefetchers do not follow that, so fetch the rows ATT_PF keys ahead */
        if (k + ATT_PF < nk)
#pragma GCC unroll 4
            for (int j = 0; j < XN; j++) _mm_prefetch((const char *)(keys[k + ATT_PF] + x + 16 * j), _MM_HINT_T0);
        __m512 kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < XN; j++) kv[j] = _mm512_loadu_ps(kr + 16 * j);
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) {
            __m512 pb = _mm512_set1_ps(p[i * nk + k]);
#pragma GCC unroll 4
            for (int j = 0; j < XN; j++) a[i][j] = _mm512_fmadd_ps(pb, kv[j], a[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < HN; i++) {
        __m512 dv = _mm512_set1_ps(den[i]);
#pragma GCC unroll 4
        for (int j = 0; j < XN; j++) _mm512_storeu_ps(o + i * dh + x + 16 * j, _mm512_div_ps(a[i][j], dv));
    }
}

AI void acc_heads(float *o, const float *p, int64_t nk, int64_t dh, const float *const *keys, const float *den,
                  const int HN) {
    int64_t x = 0;
    for (; x + 64 <= dh; x += 64) acc_tile(o, p, nk, dh, keys, x, den, HN, 4);
    for (; x < dh; x += 16) acc_tile(o, p, nk, dh, keys, x, den, HN, 1);
}

/* In place s[k] = exp(s[k] - m) with m = max(sink, max_k s[k]); returns the denominator
 * exp(sink - m) + sum_k s[k]. */
static float softmax_num(float *s, int64_t nk, float sink) {
    __m512 mv = _mm512_set1_ps(sink);
    for (int64_t k = 0; k < nk; k += 16) {
        __mmask16 mk = tail_mask(nk - k);
        mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, s + k));
    }
    const float m = _mm512_reduce_max_ps(mv);
    const __m512 mb = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t k = 0; k < nk; k += 16) {
        __mmask16 mk = tail_mask(nk - k);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + k), mb));
        _mm512_mask_storeu_ps(s + k, mk, e);
        sum = _mm512_mask_add_ps(sum, mk, sum, e);
    }
    return expf(sink - m) + _mm512_reduce_add_ps(sum);
}

/* softmax_fn: the sink-free numerators (a sink of -inf adds exp(-inf) = 0 to the sum). */
static float softmax_avx512(float *s, int64_t n) { return softmax_num(s, n, -INFINITY); }

static void attn_avx512(float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys, int64_t nk,
                        float scale, const float *sinks, float *att) {
    if (dh % 16) {
        attn_ref(o, q, nh, dh, keys, nk, scale, sinks, att);
        return;
    }
    for (int64_t h0 = 0; h0 < nh; h0 += 4) {
        const int64_t hn = nh - h0 < 4 ? nh - h0 : 4;
        float *s = att + h0 * nk;
        if (hn == 4) {
            scores_4x4(s, q + h0 * dh, dh, keys, nk, scale);
        } else {
            for (int64_t i = 0; i < hn; i++) scores_tile(s + i * nk, nk, q + (h0 + i) * dh, dh, keys, nk, scale, 1);
        }
        float den[4];
        for (int64_t i = 0; i < hn; i++) den[i] = softmax_num(s + i * nk, nk, sinks[h0 + i]);
        switch (hn) {
        case 4: acc_heads(o + h0 * dh, s, nk, dh, keys, den, 4); break;
        case 3: acc_heads(o + h0 * dh, s, nk, dh, keys, den, 3); break;
        case 2: acc_heads(o + h0 * dh, s, nk, dh, keys, den, 2); break;
        default: acc_heads(o + h0 * dh, s, nk, dh, keys, den, 1); break;
        }
    }
}

/* ---- indexer scores -------------------------------------------------------------------- */

#define IDX_MAXQ 16384 /* floats of the transposed query (id x 64 lanes at most) */

/* Scores of R rows: the heads sit in the lanes (qT is [id][16*NC]), so each row needs one
 * broadcast per dimension and no per-head horizontal sum. */
AI void index_tile(float *scores, const int64_t *rows, const float *qT, const __m512 *wv, const float *ik,
                   int64_t id, const int R, const int NC) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) a[r][c] = _mm512_setzero_ps();
    const float *kr[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) kr[r] = ik + rows[r] * id;
    for (int64_t x = 0; x < id; x++) {
        __m512 qv[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) qv[c] = _mm512_load_ps(qT + x * 16 * NC + 16 * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 kb = _mm512_set1_ps(kr[r][x]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) a[r][c] = _mm512_fmadd_ps(kb, qv[c], a[r][c]);
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        /* relu; a NaN dot becomes 0 like the twin's (d > 0 ? d : 0) */
        __m512 s = _mm512_mul_ps(wv[0], _mm512_max_ps(a[r][0], z));
#pragma GCC unroll 4
        for (int c = 1; c < NC; c++) s = _mm512_fmadd_ps(wv[c], _mm512_max_ps(a[r][c], z), s);
        scores[rows[r]] = _mm512_reduce_add_ps(s);
    }
}

AI void index_rows(float *scores, const float *qT, const __m512 *wv, const float *ik, int64_t j0, int64_t j1,
                   int64_t id, const uint8_t *cmask, int64_t B, const int NC) {
    int64_t j = j0;
    while (j < j1) {
        int64_t rows[4];
        int nr = 0;
        while (j < j1 && nr < 4) {
            if (cmask && !cmask[j / B]) {
                scores[j++] = -INFINITY;
                continue;
            }
            rows[nr++] = j++;
        }
        if (nr == 4) {
            index_tile(scores, rows, qT, wv, ik, id, 4, NC);
        } else {
            for (int r = 0; r < nr; r++) index_tile(scores, rows + r, qT, wv, ik, id, 1, NC);
        }
    }
}

static void index_avx512(float *scores, const float *q, const float *w, const float *ik, int64_t j0, int64_t j1,
                         int64_t ih, int64_t id, const uint8_t *cmask, int64_t B) {
    if (ih < 1 || ih > 64 || id < 1 || id * 64 > IDX_MAXQ) {
        index_ref(scores, q, w, ik, j0, j1, ih, id, cmask, B);
        return;
    }
    const int nc = (int)((ih + 15) / 16), ld = 16 * nc;
    _Alignas(64) float qT[IDX_MAXQ];
    for (int64_t x = 0; x < id; x++)
        for (int h = 0; h < ld; h++) qT[x * ld + h] = h < ih ? q[h * id + x] : 0.0f;
    __m512 wv[4];
    for (int c = 0; c < nc; c++) wv[c] = _mm512_maskz_loadu_ps(tail_mask(ih - 16 * c), w + 16 * c);
    switch (nc) {
    case 1: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 1); break;
    case 2: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 2); break;
    case 3: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 3); break;
    default: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 4); break;
    }
}

/* ---- small vector operations ----------------------------------------------------------- */

static double sumsq_avx512(const float *x, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), v1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        __m512d v2 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)), v3 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
        a0 = _mm512_fmadd_pd(v0, v0, a0); /* exact: a float's square fits a double */
        a1 = _mm512_fmadd_pd(v1, v1, a1);
        a2 = _mm512_fmadd_pd(v2, v2, a2);
        a3 = _mm512_fmadd_pd(v3, v3, a3);
    }
    for (; i < n; i += 8) {
        __mmask8 m = n - i >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (n - i)) - 1);
        __m512d v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        a0 = _mm512_fmadd_pd(v, v, a0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}

/* Bit-identical to the twin: the same products and sums, each rounded, in the same order. */
static void hc_collapse_avx512(float *out, const float *X, const float *pre, int64_t hc, int64_t D, int64_t ld) {
    for (int64_t d = 0; d < D; d += 16) {
        __mmask16 m = tail_mask(D - d);
        __m512 s = _mm512_setzero_ps();
        for (int64_t c = 0; c < hc; c++)
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(pre[c]), _mm512_maskz_loadu_ps(m, X + c * ld + d)));
        _mm512_mask_storeu_ps(out + d, m, s);
    }
}

static void hc_expand_avx512(float *Y, const float *fo, const float *R, const float *post, const float *comb,
                             int64_t hc, int64_t D, int64_t ld) {
    for (int64_t j = 0; j < hc; j++) {
        const __m512 pj = _mm512_set1_ps(post[j]);
        for (int64_t d = 0; d < D; d += 16) {
            __mmask16 m = tail_mask(D - d);
            __m512 s = _mm512_setzero_ps();
            for (int64_t i = 0; i < hc; i++)
                s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(comb[i * hc + j]), _mm512_maskz_loadu_ps(m, R + i * ld + d)));
            __m512 y = _mm512_add_ps(_mm512_mul_ps(pj, _mm512_maskz_loadu_ps(m, fo + d)), s);
            _mm512_mask_storeu_ps(Y + j * ld + d, m, y);
        }
    }
}

static void swiglu_avx512(float *z, const float *g, const float *u, int64_t n, float lim, float wt) {
    const __m512 one = _mm512_set1_ps(1.0f), wv = _mm512_set1_ps(wt);
    const __m512 hi = _mm512_set1_ps(lim), lo = _mm512_set1_ps(-lim);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 gg = _mm512_maskz_loadu_ps(m, g + i), uu = _mm512_maskz_loadu_ps(m, u + i);
        if (lim > 0.0f) {
            /* fminf/fmaxf semantics: a NaN operand yields the limit (second operand) */
            gg = _mm512_min_ps(gg, hi);
            uu = _mm512_min_ps(_mm512_max_ps(uu, lo), hi);
        }
        __m512 silu = _mm512_div_ps(gg, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gg))));
        _mm512_mask_storeu_ps(z + i, m, _mm512_mul_ps(wv, _mm512_mul_ps(silu, uu)));
    }
}

static void add_avx512(float *a, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(a + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* A QDQ group of 16 x nv (nv = 1 or 2) into v[0..nv) and its max |v| into *amax; 0 if any
 * value is a NaN or an infinity (|v| <= FLT_MAX is false for both): such a group takes the
 * scalar twin. */
AI int qdq_group_load(const float *x, __m512 *v, float *amax, const int nv) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    __m512 a[2], m = _mm512_setzero_ps();
    __mmask16 fin = 0xFFFF;
    for (int h = 0; h < nv; h++) {
        v[h] = _mm512_loadu_ps(x + 16 * h);
        a[h] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[h]), absm));
        fin &= _mm512_cmp_ps_mask(a[h], _mm512_set1_ps(3.4028234664e38f), _CMP_LE_OQ);
        m = _mm512_max_ps(m, a[h]);
    }
    if (fin != 0xFFFF) return 0;
    *amax = _mm512_reduce_max_ps(m);
    return 1;
}

/* QDQ_FP8 (quant.c qdq_fp8_e8m0), bit for bit. The scale s = pow2ceil(max(amax, 1e-4) / 448)
 * is a power of two, so v / s == v * (1 / s) exactly; e4m3 RNE of a = |v / s| <= 448: normal
 * range (a >= 2^-6) keeps 3 mantissa bits by the integer round-half-even on the fp32 bits,
 * the subnormal range rounds to multiples of 2^-9 by adding and subtracting 2^14. Groups with
 * a NaN or an infinity take the scalar twin. */
static void qdq_fp8_avx512(float *x, int64_t n) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    const __m512 lim = _mm512_set1_ps(448.0f), c14 = _mm512_set1_ps(16384.0f), small = _mm512_set1_ps(0x1p-6f);
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        __m512 v[2];
        float amax;
        if (!qdq_group_load(x + g, v, &amax, 2)) {
            qdq_fp8_e8m0(x + g, 32);
            continue;
        }
        float s = pow2ceil_f32(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
        const __m512 vs = _mm512_set1_ps(s), vinv = _mm512_set1_ps(1.0f / s);
        for (int h = 0; h < 2; h++) {
            __m512 y = _mm512_mul_ps(v[h], vinv);
            y = _mm512_min_ps(_mm512_max_ps(y, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
            __m512i yb = _mm512_castps_si512(y);
            __m512i sign = _mm512_andnot_si512(absm, yb);
            __m512i ab = _mm512_and_si512(yb, absm);
            /* normal: round half even to 3 mantissa bits */
            __m512i rn = _mm512_add_epi32(ab, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF),
                                                                _mm512_and_si512(_mm512_srli_epi32(ab, 20), one)));
            rn = _mm512_and_si512(rn, _mm512_set1_epi32((int)0xFFF00000u));
            /* subnormal: multiples of 2^-9 */
            __m512 af = _mm512_castsi512_ps(ab);
            __m512 rs = _mm512_sub_ps(_mm512_add_ps(af, c14), c14);
            __mmask16 is_small = _mm512_cmp_ps_mask(af, small, _CMP_LT_OQ);
            __m512i q = _mm512_mask_mov_epi32(rn, is_small, _mm512_castps_si512(rs));
            _mm512_storeu_ps(x + g + 16 * h, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(q, sign)), vs));
        }
    }
}

/* e2m1 RNE of y = v / s clamped to 6, times s (qdq_fp4_e8m0 / qdq_fp4_e4m3's value path, bit
 * for bit): steps of 0.5 below 2, 1 below 4, 2 up to 6, each by roundscale's ties-to-even on
 * y / step, where an even multiple is the even code; the sign is put back afterwards, so -0
 * stays -0 as the twin's code 8 does. */
AI __m512 qdq_e2m1(__m512 y, __m512 vs) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512 six = _mm512_set1_ps(6.0f), two = _mm512_set1_ps(2.0f), four = _mm512_set1_ps(4.0f);
    __m512i yb = _mm512_castps_si512(y);
    __m512i sign = _mm512_andnot_si512(absm, yb);
    __m512 a = _mm512_min_ps(_mm512_castsi512_ps(_mm512_and_si512(yb, absm)), six);
    /* 1 / step: 2 below 2, 1 below 4, 0.5 from 4 */
    __m512 inv = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, two, _CMP_GE_OQ), two, _mm512_set1_ps(1.0f));
    inv = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, four, _CMP_GE_OQ), inv, _mm512_set1_ps(0.5f));
    __m512 q = _mm512_div_ps(_mm512_roundscale_ps(_mm512_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), inv);
    q = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(q), sign));
    return _mm512_mul_ps(q, vs);
}

/* QDQ_FP4_E8M0, bit for bit qdq_fp4_e8m0: the same scale s (scalar, per group), y = v / s
 * (exact as v * (1/s): s is a power of two), then qdq_e2m1. Groups with a NaN or an infinity
 * take the scalar twin. */
static void qdq_fp4_avx512(float *x, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        __m512 v[2];
        float amax;
        if (!qdq_group_load(x + g, v, &amax, 2)) {
            qdq_fp4_e8m0(x + g, 32);
            continue;
        }
        float s = pow2ceil_f32(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
        const __m512 vs = _mm512_set1_ps(s), vinv = _mm512_set1_ps(1.0f / s);
        for (int h = 0; h < 2; h++) _mm512_storeu_ps(x + g + 16 * h, qdq_e2m1(_mm512_mul_ps(v[h], vinv), vs));
    }
}

/* QDQ_FP4_E4M3 (compressed KV rows), bit for bit qdq_fp4_e4m3: groups of 16, the twin's scale
 * s = e4m3_RNE(max(amax, 6 * 2^-9) / 6) (scalar, per group; not a power of two, so y = v / s is
 * an IEEE division like the twin's), then qdq_e2m1. Groups with a NaN or an infinity take the
 * scalar twin. */
static void qdq_fp4_e4m3_avx512(float *x, int64_t n) {
    for (int64_t g = 0; g + 16 <= n; g += 16) {
        __m512 v;
        float amax;
        if (!qdq_group_load(x + g, &v, &amax, 1)) {
            qdq_fp4_e4m3(x + g, 16);
            continue;
        }
        float s = e4m3_to_f32(f32_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f));
        const __m512 vs = _mm512_set1_ps(s);
        _mm512_storeu_ps(x + g, qdq_e2m1(_mm512_div_ps(v, vs), vs));
    }
}

/* ---- packed KV decoders (quant.h unpack_*) ---------------------------------------------- */

/* 16 e4m3 codes -> their values, bit for bit e4m3_to_f32: the code's 7 magnitude bits placed
 * at fp32 bit 20 are the value times 2^-120 (a normal exponent e becomes e + 0 - 127 + 7, a
 * subnormal code becomes an fp32 subnormal of the same mantissa), so one exact multiply by
 * 2^120 gives the value; the sign goes to bit 31; 0x7F / 0xFF become NaN. */
AI __m512 e4m3x16(__m128i b) {
    const __m512i c = _mm512_cvtepu8_epi32(b);
    const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    __m512i bits = _mm512_or_si512(_mm512_slli_epi32(mag, 20), _mm512_slli_epi32(_mm512_andnot_si512(mag, c), 24));
    __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
    return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)), _mm512_set1_ps(NAN));
}

static void unpack_fp8_avx512(float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const __m512 s = _mm512_set1_ps(e8m0_to_f32(scales[g / 32]));
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(y + g + 16 * h,
                             _mm512_mul_ps(e4m3x16(_mm_loadu_si128((const __m128i *)(codes + g + 16 * h))), s));
    }
}

/* 16 e2m1 codes from 8 bytes (element 2c in the low nibble of byte c) -> their values, by a
 * 16-entry table (e2m1_to_f32 of each code, -0.0 for code 8). */
AI __m512 e2m1x16(const uint8_t *nib) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)nib));
    /* byte 2c = low nibble, byte 2c+1 = high nibble of source byte c */
    const __m128i t = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0F)),
                                   _mm_and_si128(_mm_slli_epi16(w, 4), _mm_set1_epi16(0x0F00)));
    const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(t), lut);
}

static void unpack_fp4_avx512(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const __m512 s = _mm512_set1_ps(e8m0_to_f32(scales[g / 32]));
        for (int h = 0; h < 2; h++) _mm512_storeu_ps(y + g + 16 * h, _mm512_mul_ps(e2m1x16(nib + (g + 16 * h) / 2), s));
    }
}

static void unpack_fp4_e4m3_avx512(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 16 <= n; g += 16)
        _mm512_storeu_ps(y + g, _mm512_mul_ps(e2m1x16(nib + g / 2), _mm512_set1_ps(e4m3_to_f32(scales[g / 16]))));
}

const dsf_akernels akernels_avx512 = {
    .name = "avx512",
    .attn = attn_avx512,
    .index = index_avx512,
    .sumsq = sumsq_avx512,
    .hc_collapse = hc_collapse_avx512,
    .hc_expand = hc_expand_avx512,
    .swiglu = swiglu_avx512,
    .add = add_avx512,
    .softmax = softmax_avx512,
    .qdq_fp8 = qdq_fp8_avx512,
    .qdq_fp4 = qdq_fp4_avx512,
    .qdq_fp4_e4m3 = qdq_fp4_e4m3_avx512,
    .unpack_fp8 = unpack_fp8_avx512,
    .unpack_fp4 = unpack_fp4_avx512,
    .unpack_fp4_e4m3 = unpack_fp4_e4m3_avx512,
};
