/* kquant_avx2.c: AVX2/FMA/F16C matmul kernels of the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K,
 * both families (mm_*_avx2: fp32 activations; xmm_*_avx2: BF16 activations, widened exactly to
 * fp32 and run through the fp32 kernel, as matmul_avx2.c does for its types). Compiled with the
 * Makefile's AVX2_FLAGS only; the entries sit in kernels_avx2 (matmul_avx2.c).
 *
 * Owns: the AVX2 K-quant decoders and tiles. Must not: allocate (buffers are on the stack), call
 * select.c; rows that are not whole super-blocks (and BF16 rows over 16384) go to the twins.
 * Numerics: every weight is formed as dequant.c forms it (d*sc and d*sc*q exact; one rounding
 * for - dmin*m, fused here, or for Q6_K's product), then fp32 FMA against the activations:
 * the result differs from the twin's only by fp32 summation order.
 * Tiles: T = 1 takes 4 rows from 4 far-apart streams; T > 1 tiles of 2 rows x 4 tokens decode
 * each group once for the 4 tokens. Every output gets the same operations (8-lane chains in
 * group order, K chunks of KB super-blocks, the same horizontal sum) whatever T, the tile and
 * the row range: batch invariant. */
#include "kernels/kquant.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kernels/kquant_x86.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define QK 256
#define KB 4  /* K chunk: super-blocks */
#define TC 32 /* token chunk */

enum { K2, K3, K4, K5, K6 };
static const int kq_bytes[5] = {84, 110, 144, 176, 210};

/* A super-block's scales: s[j] = d * sc_j (sub-blocks of 16; Q4_K/Q5_K: of 32, j < 8),
 * m[j] = dmin * m_j (Q2_K: j < 16; Q4_K/Q5_K: j < 8). All products exact. */
typedef struct {
    float s[16], m[16];
} kq_row;

INLINE void put_scaled(__m128i bytes, int sgn, float d, float *out) { /* 16 bytes x d -> out */
    __m256 dv = _mm256_set1_ps(d);
    __m256i lo = sgn ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    __m256i hi = sgn ? _mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)) : _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), dv));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), dv));
}

INLINE void kq_prep(const int K, const uint8_t *b, kq_row *st) {
    if (K == K4 || K == K5) {
        const __m128 dd = kq_f16x2(b);
        const __m128i q = kq_k45_bytes(b);
        _mm256_storeu_ps(st->s, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_set1_ps(_mm_cvtss_f32(dd))));
        _mm256_storeu_ps(st->m, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))),
                                              _mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dd)))));
    } else if (K == K2) {
        const __m128i s = _mm_loadu_si128((const __m128i *)(const void *)b);
        const __m128 dd = kq_f16x2(b + 80);
        put_scaled(_mm_and_si128(s, _mm_set1_epi8(15)), 0, _mm_cvtss_f32(dd), st->s);
        put_scaled(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15)), 0, _mm_cvtss_f32(_mm_movehdup_ps(dd)), st->m);
    } else if (K == K3) {
        put_scaled(kq_k3_bytes(b + 94), 1, _mm_cvtss_f32(_mm_movehdup_ps(kq_f16x2(b + 106))), st->s);
    } else {
        put_scaled(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)), 1,
                   _mm_cvtss_f32(_mm_movehdup_ps(kq_f16x2(b + 206))), st->s);
    }
}

INLINE __m256i zx8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)); }
#define MOVB(v, from, to) ((from) >= (to) ? _mm256_srli_epi32(v, (from) - (to)) : _mm256_slli_epi32(v, (to) - (from)))

/* Group g (elements 32g..32g+31) of a super-block as 4 x 8 fp32: the twin's values. */
INLINE void kq_dec(const int K, const uint8_t *b, const kq_row *st, const int g, __m256 *w) {
    const int h = g >> 2, s = g & 3;
    UNROLL for (int k = 0; k < 4; k++) {
        const int j = 2 * g + (k >> 1); /* sub-block of 16 */
        __m256i q;
        if (K == K2) {
            q = _mm256_and_si256(_mm256_srli_epi32(zx8(b + 16 + 32 * h + 8 * k), 2 * s), _mm256_set1_epi32(3));
            w[k] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(st->s[j]), _mm256_set1_ps(st->m[j]));
        } else if (K == K3) {
            q = _mm256_and_si256(_mm256_srli_epi32(zx8(b + 32 + 32 * h + 8 * k), 2 * s), _mm256_set1_epi32(3));
            q = _mm256_or_si256(q, _mm256_and_si256(MOVB(zx8(b + 8 * k), g, 2), _mm256_set1_epi32(4)));
            q = _mm256_sub_epi32(q, _mm256_set1_epi32(4));
            w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(st->s[j]));
        } else if (K == K4 || K == K5) {
            q = zx8(b + (K == K4 ? 16 : 48) + 32 * (g >> 1) + 8 * k);
            q = (g & 1) ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15));
            if (K == K5) q = _mm256_or_si256(q, _mm256_and_si256(MOVB(zx8(b + 16 + 8 * k), g, 4), _mm256_set1_epi32(16)));
            w[k] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(st->s[g]), _mm256_set1_ps(st->m[g]));
        } else {
            q = zx8(b + 64 * h + 32 * (s & 1) + 8 * k);
            q = s >= 2 ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15));
            q = _mm256_or_si256(q, _mm256_and_si256(MOVB(zx8(b + 128 + 32 * h + 8 * k), 2 * s, 4), _mm256_set1_epi32(48)));
            w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32))), _mm256_set1_ps(st->s[j]));
        }
    }
}

/* lanes i + i+4, then + i+2, then + i+1 */
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* NR rows x NT tokens over super-blocks [b0, b1); out[t * NR + r]. NT = 1 prefetches. */
INLINE void kq_tile(const int K, const int NR, const int NT, const uint8_t *const *wr, const float *const *x,
                    int64_t b0, int64_t b1, float *out) {
    const int BB = kq_bytes[K];
    __m256 a[4][4];
    UNROLL for (int r = 0; r < NR; r++)
        UNROLL for (int t = 0; t < NT; t++) a[r][t] = _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; b++) {
        kq_row st[4];
        UNROLL for (int r = 0; r < NR; r++) {
            if (NT == 1)
                for (int o = 0; o < BB; o += 64) _mm_prefetch((const char *)(wr[r] + b * BB + 2048 + o), _MM_HINT_T0);
            kq_prep(K, wr[r] + b * BB, &st[r]);
        }
        __asm__ volatile("" ::: "memory"); /* the scales are read back as broadcast loads, not moved out of registers */
        UNROLL for (int r = 0; r < NR; r++) /* row by row: the codes' shared widenings stay in registers */
            UNROLL for (int g = 0; g < 8; g++) {
                __m256 w[4];
                kq_dec(K, wr[r] + b * BB, &st[r], g, w);
                UNROLL for (int t = 0; t < NT; t++)
                    UNROLL for (int k = 0; k < 4; k++)
                        a[r][t] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x[t] + b * QK + 32 * g + 8 * k), a[r][t]);
            }
    }
    UNROLL for (int r = 0; r < NR; r++)
        UNROLL for (int t = 0; t < NT; t++) out[t * NR + r] = hsum8(a[r][t]);
}

/* T = 1: tiles of 4 rows, one from each quarter of [r0, r1) (4 long sequential streams); rows
 * past r1 repeat row r1 - 1 and are dropped. T > 1: token chunks, K chunks, tiles of 2
 * adjacent rows x 4 tokens. Each output: the sum, in chunk order, of its per-chunk tile sums. */
INLINE void kq_run(const int K, const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                   int64_t r1) {
    const int64_t nb = w->n_in / QK;
    const uint8_t *wr[4];
    int64_t rr[4];
    if (T == 1) {
        const int64_t len = (r1 - r0 + 3) / 4;
        for (int64_t k = 0; k < len; k++) {
            for (int s = 0; s < 4; s++) {
                int64_t r = r0 + s * len + k;
                rr[s] = r < r1 ? r : -1;
                wr[s] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
            }
            for (int64_t b0 = 0; b0 < nb; b0 += KB) {
                float out[4];
                kq_tile(K, 4, 1, wr, &x, b0, b0 + KB < nb ? b0 + KB : nb, out);
                kq_put(y, ldy, rr, 4, 0, 1, out, b0 == 0);
            }
        }
        return;
    }
    for (int64_t tc = 0; tc < T; tc += TC) {
        const int64_t tc1 = tc + TC < T ? tc + TC : T;
        for (int64_t b0 = 0; b0 < nb; b0 += KB)
            for (int64_t r = r0; r < r1; r += 2) {
                for (int i = 0; i < 2; i++) {
                    rr[i] = r + i < r1 ? r + i : -1;
                    wr[i] = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes;
                }
                for (int64_t t = tc; t < tc1; t += 4) {
                    const float *xt[4];
                    float out[8];
                    for (int j = 0; j < 4; j++) xt[j] = x + (t + j < tc1 ? t + j : tc1 - 1) * w->n_in;
                    kq_tile(K, 2, 4, wr, xt, b0, b0 + KB < nb ? b0 + KB : nb, out);
                    kq_put(y, ldy, rr, 2, t, tc1 - t < 4 ? tc1 - t : 4, out, b0 == 0);
                }
            }
    }
}

/* BF16 activations: whole 4-token tiles widened (exactly) into a 512 KiB stack buffer, then the
 * fp32 kernel (batch invariance makes the split into calls change no value). */
#define XW_BUF 131072
INLINE void kq_xrun(const int K, const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                    int64_t r1) {
    float buf[XW_BUF];
    const int64_t per = XW_BUF / w->n_in / 4 * 4;
    for (int64_t t0 = 0; t0 < T; t0 += per) {
        const int64_t nt = T - t0 < per ? T - t0 : per;
        for (int64_t i = 0; i < nt * w->n_in; i += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(x + t0 * w->n_in + i)));
            _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        kq_run(K, w, buf, nt, y + t0 * ldy, ldy, r0, r1);
    }
}

#define KQ_ENTRIES(T, K)                                                                                       \
    void mm_##T##_avx2(const dsf_wmat *w, const float *x, int64_t T_, float *y, int64_t ldy, int64_t r0,       \
                       int64_t r1) {                                                                         \
        if (r1 <= r0 || T_ <= 0) return;                                                                     \
        if (w->n_in % QK != 0) matmul_any_ref(w, x, T_, y, ldy, r0, r1);                                      \
        else kq_run(K, w, x, T_, y, ldy, r0, r1);                                                            \
    }                                                                                                        \
    void xmm_##T##_avx2(const dsf_wmat *w, const uint16_t *x, int64_t T_, float *y, int64_t ldy, int64_t r0,   \
                        int64_t r1) {                                                                        \
        if (r1 <= r0 || T_ <= 0) return;                                                                     \
        if (w->n_in % QK != 0 || w->n_in > 16384) matmul_xbf16_any_ref(w, x, T_, y, ldy, r0, r1);             \
        else kq_xrun(K, w, x, T_, y, ldy, r0, r1);                                                           \
    }
KQ_ENTRIES(q2_k, K2)
KQ_ENTRIES(q3_k, K3)
KQ_ENTRIES(q4_k, K4)
KQ_ENTRIES(q5_k, K5)
KQ_ENTRIES(q6_k, K6)

#endif
