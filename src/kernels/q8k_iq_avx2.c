/* q8k_iq_avx2.c: AVX2 matmul kernels of IQ4_XS and IQ2_XXS weights with Q8_K activations
 * (matmul.h matmul_q8k_fn, the opt-in mode), every T. Compiled with the Makefile's AVX2_FLAGS
 * only; the entries sit in kernels_avx2 (matmul_avx2.c).
 *
 * Owns: the per-group integer dots of these two types. Must not: allocate, call select.c, or
 * change an activation code. Rows whose n_in is not a multiple of 256 go to the twin.
 *
 * Numerics: a weight is m * q (q8k_iq_avx512.c's header), here m = d * (integer u) with u = ls
 * - 32 (IQ4_XS) or 2s + 1 (IQ2_XXS, d / 8 then); per group of 32 vpmaddubsw takes |q| against
 * the activation codes carrying q's sign (vpsignb; pair sums <= 2 * 127 * 127, no saturation),
 * vpmaddwd by u gives int32 lanes, and a super-block's exact integer sum (< 2^31) is converted
 * and added by one FMA with d_w * d_x: acc = fma(float(isum), d, acc) in 8 lanes, summed by
 * hsum8's fixed tree at the end of the row. Each output is the exact product up to fp32
 * rounding. Batch invariance: every (row, token) runs row_dot alone, whatever T and the rows. */
#include "kernels/q8k_iq.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kernels/grids.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

INLINE float f16v(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* int32 lanes of the group's signed products q * x (q: signed bytes, x: codes) times u */
INLINE __m256i group_dot(__m256i q, __m256i x, int u) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
    return _mm256_madd_epi16(p, _mm256_set1_epi16((short)u));
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: the super-block's integer sum and
 * its d. Group g: qs[16g ..] low nibbles elements 0-15, high ones 16-31. */
INLINE __m256i sb_iq4xs(const uint8_t *b, const int8_t *x, float *d) {
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)grid_iq4nl));
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    __m256i s = _mm256_setzero_si256();
    UNROLL for (int g = 0; g < 8; g++) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 8 + 16 * g));
        const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
        const int ls = ((b[4 + g / 2] >> 4 * (g & 1)) & 15) | ((sh >> 2 * g) & 3) << 4;
        s = _mm256_add_epi32(s, group_dot(_mm256_shuffle_epi8(tab, n), _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 * g)), ls - 32));
    }
    *d = f16v(b);
    return s;
}

/* IQ2_XXS {f16 d; 8 x (u8 idx[4]; u32 signs 7k.. | s << 28)}: the integer sum (u = 2s + 1) and
 * d / 8. */
INLINE __m256i sb_iq2xxs(const uint8_t *b, const int8_t *x, float *d) {
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                            3, 3, 3, 3);
    __m256i s = _mm256_setzero_si256();
    UNROLL for (int g = 0; g < 8; g++) {
        const uint8_t *e = b + 2 + 8 * g;
        uint32_t w;
        memcpy(&w, e + 4, 4);
        const __m256i q = _mm256_setr_epi64x((long long)grid_iq2xxs[e[0]], (long long)grid_iq2xxs[e[1]],
                                             (long long)grid_iq2xxs[e[2]], (long long)grid_iq2xxs[e[3]]);
        const uint32_t m = (uint32_t)grid_iq2_signs[w & 127] | (uint32_t)grid_iq2_signs[(w >> 7) & 127] << 8 |
                           (uint32_t)grid_iq2_signs[(w >> 14) & 127] << 16 | (uint32_t)grid_iq2_signs[(w >> 21) & 127] << 24;
        /* byte j: -1 where bit j of m is set (negated), else +1 */
        const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread), bit), bit);
        const __m256i sq = _mm256_sign_epi8(q, _mm256_or_si256(neg, _mm256_set1_epi8(1)));
        s = _mm256_add_epi32(s, group_dot(sq, _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 * g)), 2 * (int)(w >> 28) + 1));
    }
    *d = f16v(b) * 0.125f; /* exact */
    return s;
}

/* The sum of the 8 lanes by a fixed tree. */
INLINE float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE float row_dot(const int iq2, const uint8_t *row, const dsf_q8k *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        float d;
        __m256i s = iq2 ? sb_iq2xxs(row + 66 * b, x[b].qs, &d) : sb_iq4xs(row + 136 * b, x[b].qs, &d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * x[b].d), acc);
    }
    return hsum8(acc);
}

INLINE void q8_run2(const int iq2, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                    int64_t r1) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 256 != 0) {
        matmul_q8k_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    const int64_t nb = w->n_in / 256;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++) y[t * ldy + r] = row_dot(iq2, w->data + (uint64_t)r * w->row_bytes, x + t * nb, nb);
}

Q8K_FN(q8k_iq4_xs_avx2) { q8_run2(0, w, x, T, y, ldy, r0, r1); }
Q8K_FN(q8k_iq2_xxs_avx2) { q8_run2(1, w, x, T, y, ldy, r0, r1); }

#endif
