/* iq2_avx2.c: AVX2/FMA/F16C matmul kernels for IQ2_XXS, IQ2_XS, IQ2_S and IQ4_XS weights, both
 * activation families (fp32: mm_*_avx2; BF16: xmm_*_avx2, on the exactly widened activations),
 * every T. Compiled with the Makefile's AVX2_FLAGS only; the entries sit in kernels_avx2
 * (matmul_avx2.c).
 *
 * Owns: the group decoders of these four types (8-lane) and their tiles. Must not: allocate
 * (the widened activations are on the stack), call select.c, or round an activation. Rows whose
 * n_in is not a multiple of 256 or is above 16384 go to the scalar twins.
 *
 * Numerics (factoring, as iq2_avx512.c): a group of 32 weights decodes to 32 small signed
 * integers q (int8: grid value with its sign, or a kvalues_iq4nl entry) and the exact fp32
 * multipliers of its two halves (elements 0-15, 16-31; equal for IQ2_XXS and IQ4_XS). Per half
 * P = q0 * x0 + q1 * x1 (8 lanes, products exact) and acc = fma(P, m_half, acc). Each output is
 * one accumulator's 8 lanes summed (hsum) per K chunk of KB super-blocks, the chunks added in
 * order: the same operations for T = 1 and T > 1 (batch invariance). */
#include "kernels/iq2k.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kernels/grids.h"

#define QK 256
#define KB 4     /* K chunk in super-blocks, every T */
#define TC 32    /* tokens per chunk (T > 1) */
#define R1 4     /* rows per decode tile */
#define RN 2     /* rows per T > 1 tile (x 4 tokens) */
#define IQ_MAX_IN 16384

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

INLINE float f16at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* IQ2 multiplier d * (0.5 + s) * 0.25 (exact) */
INLINE float iq2_mul(float d, unsigned s) { return d * (0.5f + (float)s) * 0.25f; }

/* 4 grid entries (32 unsigned bytes) with element e negated where bit e of m is set. */
INLINE __m256i iq2_signed(const uint64_t *grid, unsigned i0, unsigned i1, unsigned i2, unsigned i3, uint32_t m) {
    __m256i g = _mm256_set_epi64x((long long)grid[i3], (long long)grid[i2], (long long)grid[i1], (long long)grid[i0]);
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i n = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), rep), bit), bit);
    return _mm256_sub_epi8(_mm256_xor_si256(g, n), n);
}

INLINE uint32_t sign4(uint32_t w) {
    return (uint32_t)grid_iq2_signs[w & 127] | (uint32_t)grid_iq2_signs[(w >> 7) & 127] << 8 |
           (uint32_t)grid_iq2_signs[(w >> 14) & 127] << 16 | (uint32_t)grid_iq2_signs[(w >> 21) & 127] << 24;
}

/* ---- group decoders: group g of super-block b -> 32 int8 q; *ml, *mh: the halves' multipliers ---- */

INLINE __m256i dec_iq2_xxs(const uint8_t *b, int g, float *ml, float *mh) {
    const uint8_t *o = b + 2 + 8 * g;
    uint32_t w;
    memcpy(&w, o + 4, 4);
    *ml = *mh = iq2_mul(f16at(b), w >> 28);
    return iq2_signed(grid_iq2xxs, o[0], o[1], o[2], o[3], sign4(w));
}

INLINE __m256i dec_iq2_xs(const uint8_t *b, int g, float *ml, float *mh) {
    uint16_t q[4];
    memcpy(q, b + 2 + 8 * g, 8);
    const float d = f16at(b);
    *ml = iq2_mul(d, b[66 + g] & 15u);
    *mh = iq2_mul(d, b[66 + g] >> 4);
    uint32_t m = (uint32_t)grid_iq2_signs[q[0] >> 9] | (uint32_t)grid_iq2_signs[q[1] >> 9] << 8 |
                 (uint32_t)grid_iq2_signs[q[2] >> 9] << 16 | (uint32_t)grid_iq2_signs[q[3] >> 9] << 24;
    return iq2_signed(grid_iq2xs, q[0] & 511u, q[1] & 511u, q[2] & 511u, q[3] & 511u, m);
}

INLINE __m256i dec_iq2_s(const uint8_t *b, int g, float *ml, float *mh) {
    const uint8_t *qs = b + 2 + 4 * g;
    const unsigned h = b[66 + g];
    uint32_t m;
    memcpy(&m, b + 34 + 4 * g, 4);
    const float d = f16at(b);
    *ml = iq2_mul(d, b[74 + g] & 15u);
    *mh = iq2_mul(d, b[74 + g] >> 4);
    return iq2_signed(grid_iq2s, qs[0] | (h & 3) << 8, qs[1] | (h >> 2 & 3) << 8, qs[2] | (h >> 4 & 3) << 8,
                      qs[3] | (h >> 6) << 8, m);
}

INLINE __m256i dec_iq4_xs(const uint8_t *b, int g, float *ml, float *mh) {
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    const int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 15) | ((sh >> (2 * g)) & 3) << 4;
    *ml = *mh = f16at(b) * (float)(ls - 32);
    const __m128i kv = _mm_loadu_si128((const __m128i *)(const void *)grid_iq4nl);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 8 + 16 * g));
    __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(v, _mm_set1_epi8(15)));
    __m128i hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    return _mm256_set_m128i(hi, lo);
}

/* ---- tiles ---- */

/* The 32 int8 q as 4 fp32 vectors (exact). */
INLINE void widen_q(__m256i q, __m256 *w) {
    __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

/* One group against activations xg[0..31]: each half's products, then its multiplier. */
INLINE __m256 group_acc(const __m256 *w, const float *xg, float ml, float mh, __m256 a) {
    __m256 p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), _mm256_mul_ps(w[0], _mm256_loadu_ps(xg)));
    a = _mm256_fmadd_ps(p, _mm256_set1_ps(ml), a);
    p = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), _mm256_mul_ps(w[2], _mm256_loadu_ps(xg + 16)));
    return _mm256_fmadd_ps(p, _mm256_set1_ps(mh), a);
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* T = 1: R1 rows over super-blocks [b0, b1); T > 1: RN rows x 4 tokens (x[t]: each token's
 * activations of the chunk, from super-block b0), out[r * 4 + t]. */
#define IQ_TILES(NAME, DEC, BB)                                                                                  \
    static void NAME##_t1(const uint8_t *const *wr, const float *x, int64_t b0, int64_t b1, float *out) {       \
        __m256 a[R1];                                                                                            \
        UNROLL for (int r = 0; r < R1; r++) a[r] = _mm256_setzero_ps();                                          \
        for (int64_t b = b0; b < b1; b++)                                                                        \
            for (int g = 0; g < 8; g++)                                                                          \
                UNROLL for (int r = 0; r < R1; r++) {                                                            \
                    float ml, mh;                                                                                \
                    __m256 w[4];                                                                                 \
                    widen_q(DEC(wr[r] + b * (BB), g, &ml, &mh), w);                                              \
                    a[r] = group_acc(w, x + b * QK + 32 * g, ml, mh, a[r]);                                      \
                }                                                                                                \
        UNROLL for (int r = 0; r < R1; r++) out[r] = hsum8(a[r]);                                               \
    }                                                                                                            \
    static void NAME##_tn(const uint8_t *const *wr, const float *const *x, int64_t b0, int64_t b1, float *out) { \
        __m256 a[RN][4];                                                                                         \
        UNROLL for (int r = 0; r < RN; r++)                                                                      \
            UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm256_setzero_ps();                                   \
        for (int64_t b = b0; b < b1; b++)                                                                        \
            for (int g = 0; g < 8; g++)                                                                          \
                UNROLL for (int r = 0; r < RN; r++) {                                                            \
                    float ml, mh;                                                                                \
                    __m256 w[4];                                                                                 \
                    widen_q(DEC(wr[r] + b * (BB), g, &ml, &mh), w);                                              \
                    UNROLL for (int t = 0; t < 4; t++)                                                           \
                        a[r][t] = group_acc(w, x[t] + (b - b0) * QK + 32 * g, ml, mh, a[r][t]);                  \
                }                                                                                                \
        UNROLL for (int r = 0; r < RN; r++)                                                                      \
            UNROLL for (int t = 0; t < 4; t++) out[r * 4 + t] = hsum8(a[r][t]);                                 \
    }                                                                                                            \
    static const iq_ops NAME##_ops = {NAME##_t1, NAME##_tn};

typedef struct {
    void (*t1)(const uint8_t *const *wr, const float *x, int64_t b0, int64_t b1, float *out);
    void (*tn)(const uint8_t *const *wr, const float *const *x, int64_t b0, int64_t b1, float *out);
} iq_ops;

IQ_TILES(iq2_xxs, dec_iq2_xxs, 66)
IQ_TILES(iq2_xs, dec_iq2_xs, 74)
IQ_TILES(iq2_s, dec_iq2_s, 82)
IQ_TILES(iq4_xs, dec_iq4_xs, 136)

/* ---- drivers ---- */

/* T = 1: R1 rows from far-apart streams (the row range cut into R1 pieces; rows past r1 repeat
 * r1 - 1 and are dropped), K chunks of KB super-blocks added in order. */
static void iq_t1(const dsf_wmat *w, const float *x, float *y, int64_t r0, int64_t r1, const iq_ops *op) {
    const int64_t nb = w->n_in / QK, len = (r1 - r0 + R1 - 1) / R1;
    for (int64_t k = 0; k < len; k++) {
        const uint8_t *wr[R1];
        int64_t rr[R1];
        for (int s = 0; s < R1; s++) {
            int64_t r = r0 + s * len + k;
            rr[s] = r < r1 ? r : -1;
            wr[s] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
        }
        for (int64_t b0 = 0; b0 < nb; b0 += KB) {
            float o[R1];
            op->t1(wr, x, b0, b0 + KB < nb ? b0 + KB : nb, o);
            for (int i = 0; i < R1; i++)
                if (rr[i] >= 0) y[rr[i]] = b0 == 0 ? o[i] : y[rr[i]] + o[i];
        }
    }
}

/* T > 1: token chunks of TC x K chunks of KB super-blocks x row tiles of RN x token tiles of 4.
 * xb (BF16, x NULL): each chunk's activations are widened (exactly) into xw[TC][KB * QK] first. */
static void iq_tn(const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T, float *y, int64_t ldy,
                  int64_t r0, int64_t r1, const iq_ops *op) {
    const int64_t nb = w->n_in / QK;
    float xw[TC * KB * QK];
    for (int64_t tc = 0; tc < T; tc += TC) {
        const int64_t tc1 = tc + TC < T ? tc + TC : T;
        for (int64_t b0 = 0; b0 < nb; b0 += KB) {
            const int64_t b1 = b0 + KB < nb ? b0 + KB : nb, ldx = xb ? (b1 - b0) * QK : w->n_in;
            const float *xc = xb ? xw : x + tc * w->n_in + b0 * QK;
            if (xb)
                for (int64_t t = tc; t < tc1; t++)
                    for (int64_t i = 0; i < ldx; i += 8) {
                        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(xb + t * w->n_in + b0 * QK + i)));
                        _mm256_storeu_ps(xw + (t - tc) * ldx + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                    }
            for (int64_t r = r0; r < r1; r += RN) {
                const uint8_t *wr[RN];
                for (int i = 0; i < RN; i++) wr[i] = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes;
                for (int64_t t = tc; t < tc1; t += 4) {
                    const float *xt[4];
                    float out[RN * 4];
                    for (int j = 0; j < 4; j++) xt[j] = xc + ((t + j < tc1 ? t + j : tc1 - 1) - tc) * ldx;
                    op->tn(wr, xt, b0, b1, out);
                    for (int i = 0; i < RN && r + i < r1; i++)
                        for (int j = 0; j < 4 && t + j < tc1; j++) {
                            float *yy = &y[(t + j) * ldy + r + i];
                            *yy = b0 == 0 ? out[i * 4 + j] : *yy + out[i * 4 + j];
                        }
                }
            }
        }
    }
}

static void iq_run(const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T, float *y, int64_t ldy,
                   int64_t r0, int64_t r1, const iq_ops *op) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % QK != 0 || w->n_in > IQ_MAX_IN) {
        if (xb) matmul_xbf16_any_ref(w, xb, T, y, ldy, r0, r1);
        else matmul_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    if (T > 1) {
        iq_tn(w, x, xb, T, y, ldy, r0, r1, op);
        return;
    }
    float buf[IQ_MAX_IN];
    if (xb)
        for (int64_t i = 0; i < w->n_in; i++) {
            uint32_t u = (uint32_t)xb[i] << 16;
            memcpy(&buf[i], &u, 4);
        }
    iq_t1(w, xb ? buf : x, y, r0, r1, op);
}

#define IQ_ENTRIES(NAME)                                                                                         \
    void mm_##NAME##_avx2(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,      \
                          int64_t r1) {                                                                          \
        iq_run(w, x, NULL, T, y, ldy, r0, r1, &NAME##_ops);                                                      \
    }                                                                                                            \
    void xmm_##NAME##_avx2(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,  \
                           int64_t r1) {                                                                         \
        iq_run(w, NULL, x, T, y, ldy, r0, r1, &NAME##_ops);                                                      \
    }
IQ_ENTRIES(iq2_xxs)
IQ_ENTRIES(iq2_xs)
IQ_ENTRIES(iq2_s)
IQ_ENTRIES(iq4_xs)

#endif
