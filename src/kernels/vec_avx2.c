/* vec_avx2.c: AVX2 + FMA versions of the attention / indexer / hc kernels
 * (vec.h). Compiled with the AVX2 flags only; chosen at run time when the matmul
 * table is the AVX2 one. Shapes a kernel does not handle fall back to the scalar twin.
 *
 * exp: the same reduction and polynomial as the AVX-512 file (within 2 ulp of expf), with
 * 2^n built in the exponent field; a vector holding an argument outside [-87.3, 88.3] (where
 * the result would be subnormal or near overflow) or a NaN is done lane by lane with expf. */
#include "kernels/vec.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f), hi = _mm256_set1_ps(88.37f);
    /* ordered compares: a NaN lane fails both and takes the slow path */
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LE_OQ));
    if (_mm256_movemask_ps(ok) != 0xFF) {
        _Alignas(32) float v[8];
        _mm256_store_ps(v, x);
        for (int i = 0; i < 8; i++) v[i] = expf(v[i]);
        return _mm256_load_ps(v);
    }
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* n in [-126, 128]: 2^n as two factors so that n = 128 does not overflow the field */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h = _mm256_srai_epi32(ni, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* For the unit test: the vector exp on n floats. */
void ka_exp_avx2(float *y, const float *x, int64_t n);
void ka_exp_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = expf(x[i]);
}

AI float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* lanes [0, left) set (left clamped to 8), for maskload/maskstore */
AI __m256i tail_mask(int64_t left) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)), idx);
}

/* ---- attention ------------------------------------------------------------------------- */

AI void scores_tile(float *s, const float *q, int64_t dh, const float *const *keys, int64_t nk, float scale,
                    const int HN) {
    for (int64_t k = 0; k < nk; k++) {
        const float *key = keys[k];
        __m256 a[4];
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) a[i] = _mm256_setzero_ps();
        for (int64_t x = 0; x < dh; x += 8) {
            __m256 kv = _mm256_loadu_ps(key + x);
#pragma GCC unroll 4
            for (int i = 0; i < HN; i++) a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * dh + x), kv, a[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) s[i * nk + k] = hsum256(a[i]) * scale;
    }
}

AI void acc_tile(float *o, const float *p, int64_t nk, int64_t dh, const float *const *keys, int64_t x,
                 const float *den, const int HN, const int XN) {
    __m256 a[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < HN; i++)
#pragma GCC unroll 2
        for (int j = 0; j < XN; j++) a[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nk; k++) {
        const float *kr = keys[k] + x;
        __m256 kv[2];
#pragma GCC unroll 2
        for (int j = 0; j < XN; j++) kv[j] = _mm256_loadu_ps(kr + 8 * j);
#pragma GCC unroll 4
        for (int i = 0; i < HN; i++) {
            __m256 pb = _mm256_broadcast_ss(p + i * nk + k);
#pragma GCC unroll 2
            for (int j = 0; j < XN; j++) a[i][j] = _mm256_fmadd_ps(pb, kv[j], a[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < HN; i++) {
        __m256 dv = _mm256_set1_ps(den[i]);
#pragma GCC unroll 2
        for (int j = 0; j < XN; j++) _mm256_storeu_ps(o + i * dh + x + 8 * j, _mm256_div_ps(a[i][j], dv));
    }
}

AI void acc_heads(float *o, const float *p, int64_t nk, int64_t dh, const float *const *keys, const float *den,
                  const int HN) {
    int64_t x = 0;
    for (; x + 16 <= dh; x += 16) acc_tile(o, p, nk, dh, keys, x, den, HN, 2);
    for (; x < dh; x += 8) acc_tile(o, p, nk, dh, keys, x, den, HN, 1);
}

static float softmax_num(float *s, int64_t nk, float sink) {
    float m = sink;
    int64_t k = 0;
    __m256 mv = _mm256_set1_ps(sink);
    for (; k + 8 <= nk; k += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + k));
    _Alignas(32) float t[8];
    _mm256_store_ps(t, mv);
    for (int i = 0; i < 8; i++) m = fmaxf(m, t[i]);
    for (; k < nk; k++) m = fmaxf(m, s[k]);
    const __m256 mb = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (k = 0; k + 8 <= nk; k += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + k), mb));
        _mm256_storeu_ps(s + k, e);
        sum = _mm256_add_ps(sum, e);
    }
    float den = expf(sink - m) + hsum256(sum);
    for (; k < nk; k++) {
        s[k] = expf(s[k] - m);
        den += s[k];
    }
    return den;
}

/* softmax_fn: the sink-free numerators (a sink of -inf adds exp(-inf) = 0 to the sum). */
static float softmax_avx2(float *s, int64_t n) { return softmax_num(s, n, -INFINITY); }

static void attn_avx2(float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys, int64_t nk,
                      float scale, const float *sinks, float *att) {
    if (dh % 8) {
        attn_ref(o, q, nh, dh, keys, nk, scale, sinks, att);
        return;
    }
    for (int64_t h0 = 0; h0 < nh; h0 += 4) {
        const int64_t hn = nh - h0 < 4 ? nh - h0 : 4;
        float *s = att + h0 * nk;
        if (hn == 4) {
            scores_tile(s, q + h0 * dh, dh, keys, nk, scale, 4);
        } else {
            for (int64_t i = 0; i < hn; i++) scores_tile(s + i * nk, q + (h0 + i) * dh, dh, keys, nk, scale, 1);
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

/* ---- indexer scores (heads in the lanes, as in the AVX-512 file) ------------------------ */

#define IDX_MAXQ 8192 /* floats of the transposed query (id x 32 lanes at most) */

AI void index_tile(float *scores, const int64_t *rows, const float *qT, const __m256 *wv, const float *ik,
                   int64_t id, const int R, const int NC) {
    __m256 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) a[r][c] = _mm256_setzero_ps();
    const float *kr[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) kr[r] = ik + rows[r] * id;
    for (int64_t x = 0; x < id; x++) {
        __m256 qv[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) qv[c] = _mm256_load_ps(qT + x * 8 * NC + 8 * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 kb = _mm256_broadcast_ss(kr[r] + x);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) a[r][c] = _mm256_fmadd_ps(kb, qv[c], a[r][c]);
        }
    }
    const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        /* relu: maxps returns its second operand (0) for a NaN dot, like (d > 0 ? d : 0) */
        __m256 s = _mm256_mul_ps(wv[0], _mm256_max_ps(a[r][0], z));
#pragma GCC unroll 4
        for (int c = 1; c < NC; c++) s = _mm256_fmadd_ps(wv[c], _mm256_max_ps(a[r][c], z), s);
        scores[rows[r]] = hsum256(s);
    }
}

AI void index_rows(float *scores, const float *qT, const __m256 *wv, const float *ik, int64_t j0, int64_t j1,
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

static void index_avx2(float *scores, const float *q, const float *w, const float *ik, int64_t j0, int64_t j1,
                       int64_t ih, int64_t id, const uint8_t *cmask, int64_t B) {
    if (ih < 1 || ih > 32 || id < 1 || id * 32 > IDX_MAXQ) {
        index_ref(scores, q, w, ik, j0, j1, ih, id, cmask, B);
        return;
    }
    const int nc = (int)((ih + 7) / 8), ld = 8 * nc;
    _Alignas(32) float qT[IDX_MAXQ];
    for (int64_t x = 0; x < id; x++)
        for (int h = 0; h < ld; h++) qT[x * ld + h] = h < ih ? q[h * id + x] : 0.0f;
    __m256 wv[4];
    for (int c = 0; c < nc; c++) wv[c] = _mm256_maskload_ps(w + 8 * c, tail_mask(ih - 8 * c));
    switch (nc) {
    case 1: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 1); break;
    case 2: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 2); break;
    case 3: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 3); break;
    default: index_rows(scores, qT, wv, ik, j0, j1, id, cmask, B, 4); break;
    }
}

/* ---- small vector operations ----------------------------------------------------------- */

static double sumsq_avx2(const float *x, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), v1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a0 = _mm256_fmadd_pd(v0, v0, a0); /* exact: a float's square fits a double */
        a1 = _mm256_fmadd_pd(v1, v1, a1);
    }
    _Alignas(32) double t[4];
    _mm256_store_pd(t, _mm256_add_pd(a0, a1));
    double s = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

/* Bit-identical to the twin: the same products and sums, each rounded, in the same order
 * (the scalar tails keep product and sum in separate statements so nothing is fused). */
static void hc_collapse_avx2(float *out, const float *X, const float *pre, int64_t hc, int64_t D, int64_t ld) {
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int64_t c = 0; c < hc; c++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(pre[c]), _mm256_loadu_ps(X + c * ld + d)));
        _mm256_storeu_ps(out + d, s);
    }
    for (; d < D; d++) {
        float s = 0.0f;
        for (int64_t c = 0; c < hc; c++) {
            float p = pre[c] * X[c * ld + d];
            s = s + p;
        }
        out[d] = s;
    }
}

static void hc_expand_avx2(float *Y, const float *fo, const float *R, const float *post, const float *comb,
                           int64_t hc, int64_t D, int64_t ld) {
    for (int64_t j = 0; j < hc; j++) {
        const __m256 pj = _mm256_set1_ps(post[j]);
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            __m256 s = _mm256_setzero_ps();
            for (int64_t i = 0; i < hc; i++)
                s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(comb[i * hc + j]), _mm256_loadu_ps(R + i * ld + d)));
            _mm256_storeu_ps(Y + j * ld + d, _mm256_add_ps(_mm256_mul_ps(pj, _mm256_loadu_ps(fo + d)), s));
        }
        for (; d < D; d++) {
            float s = 0.0f;
            for (int64_t i = 0; i < hc; i++) {
                float p = comb[i * hc + j] * R[i * ld + d];
                s = s + p;
            }
            float pf = post[j] * fo[d];
            Y[j * ld + d] = pf + s;
        }
    }
}

static void swiglu_avx2(float *z, const float *g, const float *u, int64_t n, float lim, float wt) {
    const __m256 one = _mm256_set1_ps(1.0f), wv = _mm256_set1_ps(wt);
    const __m256 hi = _mm256_set1_ps(lim), lo = _mm256_set1_ps(-lim);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gg = _mm256_loadu_ps(g + i), uu = _mm256_loadu_ps(u + i);
        if (lim > 0.0f) {
            /* fminf/fmaxf semantics: a NaN operand yields the limit (second operand) */
            gg = _mm256_min_ps(gg, hi);
            uu = _mm256_min_ps(_mm256_max_ps(uu, lo), hi);
        }
        __m256 silu = _mm256_div_ps(gg, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), gg))));
        _mm256_storeu_ps(z + i, _mm256_mul_ps(wv, _mm256_mul_ps(silu, uu)));
    }
    if (i < n) swiglu_ref(z + i, g + i, u + i, n - i, lim, wt);
}

static void add_avx2(float *a, const float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) a[i] += y[i];
}

/* QDQ_FP8 (quant.c qdq_fp8_e8m0), bit for bit; the method of vec_avx512.c's
 * qdq_fp8_avx512 on 8-wide vectors: pow2 scale, exact v * (1 / s), clamp to +-448, e4m3
 * round-half-even on the fp32 bits (normal range) or by adding and subtracting 2^14 (below
 * 2^-6), times s. Groups with a NaN or an infinity take the scalar twin. */
static void qdq_fp8_avx2(float *x, int64_t n) {
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
    const __m256 lim = _mm256_set1_ps(448.0f), nlim = _mm256_set1_ps(-448.0f), c14 = _mm256_set1_ps(16384.0f);
    const __m256 small = _mm256_set1_ps(0x1p-6f), fmax = _mm256_set1_ps(3.4028234664e38f);
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        __m256 v[4], a[4];
        int fin = 0xFF;
        for (int h = 0; h < 4; h++) {
            v[h] = _mm256_loadu_ps(x + g + 8 * h);
            a[h] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v[h]), absm));
            fin &= _mm256_movemask_ps(_mm256_cmp_ps(a[h], fmax, _CMP_LE_OQ));
        }
        if (fin != 0xFF) {
            qdq_fp8_e8m0(x + g, 32);
            continue;
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        float mm[8], amax = 0.0f;
        _mm256_storeu_ps(mm, m);
        for (int i = 0; i < 8; i++) amax = mm[i] > amax ? mm[i] : amax;
        float s = pow2ceil_f32(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
        const __m256 vs = _mm256_set1_ps(s), vinv = _mm256_set1_ps(1.0f / s);
        for (int h = 0; h < 4; h++) {
            __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[h], vinv), nlim), lim);
            __m256i yb = _mm256_castps_si256(y);
            __m256i sign = _mm256_andnot_si256(absm, yb), ab = _mm256_and_si256(yb, absm);
            __m256i rn = _mm256_add_epi32(ab, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF),
                                                                _mm256_and_si256(_mm256_srli_epi32(ab, 20), one)));
            rn = _mm256_and_si256(rn, _mm256_set1_epi32((int)0xFFF00000u));
            __m256 af = _mm256_castsi256_ps(ab);
            __m256 rs = _mm256_sub_ps(_mm256_add_ps(af, c14), c14);
            __m256 q = _mm256_blendv_ps(_mm256_castsi256_ps(rn), rs, _mm256_cmp_ps(af, small, _CMP_LT_OQ));
            _mm256_storeu_ps(x + g + 8 * h, _mm256_mul_ps(_mm256_or_ps(q, _mm256_castsi256_ps(sign)), vs));
        }
    }
}

/* ---- packed KV decoders (quant.h unpack_*), 8 lanes: vec_avx512.c has the reasoning --- */

/* 8 e4m3 codes -> their values, bit for bit e4m3_to_f32 (0x7F / 0xFF: NaN). */
AI __m256 e4m3x8(const uint8_t *p) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    __m256i bits = _mm256_or_si256(_mm256_slli_epi32(mag, 20), _mm256_slli_epi32(_mm256_andnot_si256(mag, c), 24));
    __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
    __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
    return _mm256_blendv_ps(v, _mm256_set1_ps(NAN), nan);
}

static void unpack_fp8_avx2(float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const __m256 s = _mm256_set1_ps(e8m0_to_f32(scales[g / 32]));
        for (int h = 0; h < 4; h++) _mm256_storeu_ps(y + g + 8 * h, _mm256_mul_ps(e4m3x8(codes + g + 8 * h), s));
    }
}

/* 8 e2m1 codes from 4 bytes (element 2c in the low nibble of byte c) -> their values: the
 * magnitude by an 8-entry table (vpermps reads the low 3 bits), the sign bit 3 to bit 31. */
AI __m256 e2m1x8(const uint8_t *nib) {
    uint32_t u;
    memcpy(&u, nib, 4);
    const __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128((int)u));
    const __m128i t = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0F)),
                                   _mm_and_si128(_mm_slli_epi16(w, 4), _mm_set1_epi16(0x0F00)));
    const __m256i c = _mm256_cvtepu8_epi32(t);
    const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(_mm256_permutevar8x32_ps(lut, c), _mm256_castsi256_ps(sign));
}

static void unpack_fp4_avx2(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const __m256 s = _mm256_set1_ps(e8m0_to_f32(scales[g / 32]));
        for (int h = 0; h < 4; h++) _mm256_storeu_ps(y + g + 8 * h, _mm256_mul_ps(e2m1x8(nib + (g + 8 * h) / 2), s));
    }
}

static void unpack_fp4_e4m3_avx2(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 16 <= n; g += 16) {
        const __m256 s = _mm256_set1_ps(e4m3_to_f32(scales[g / 16]));
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + g + 8 * h, _mm256_mul_ps(e2m1x8(nib + (g + 8 * h) / 2), s));
    }
}

const dsf_akernels akernels_avx2 = {
    .name = "avx2",
    .attn = attn_avx2,
    .index = index_avx2,
    .sumsq = sumsq_avx2,
    .hc_collapse = hc_collapse_avx2,
    .hc_expand = hc_expand_avx2,
    .swiglu = swiglu_avx2,
    .add = add_avx2,
    .softmax = softmax_avx2,
    .qdq_fp8 = qdq_fp8_avx2,
    .unpack_fp8 = unpack_fp8_avx2,
    .unpack_fp4 = unpack_fp4_avx2,
    .unpack_fp4_e4m3 = unpack_fp4_e4m3_avx2,
};
