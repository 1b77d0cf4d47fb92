/* kquant_x86.h: the 128-bit unpacking of the K-quant sub-block scales, and the store of a tile's
 * results, that kquant_avx512.c and kquant_avx2.c share (SSE/AVX2 instructions only; include from code compiled with AVX2 or
 * AVX-512 flags). dequant.c (scale_min_k4, deq_q3_k) stays the reference for the layouts.
 *
 * Must not: hold state or anything but static inline helpers. */
#ifndef DSF_KQUANT_X86_H
#define DSF_KQUANT_X86_H

#include <immintrin.h>
#include <stdint.h>

/* Q4_K/Q5_K block b: bytes 0-7 the 6-bit sub-block scales sc_j, 8-15 the mins m_j (j < 4 from
 * the low 6 bits of scales[j] / scales[j+4]; j >= 4 from the nibbles of scales[j+4] and the
 * top 2 bits of scales[j-4] / scales[j]; the 12 scale bytes follow d and dmin). */
static inline __m128i kq_k45_bytes(const uint8_t *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)b); /* scales[i] at 4 + i */
    __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    __m128i h = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    a = _mm_blend_epi32(a, _mm_srli_epi16(a, 4), 0x8);
    a = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    h = _mm_and_si128(_mm_srli_epi16(h, 2), _mm_set1_epi8(0x30)); /* (byte >> 6) << 4 */
    return _mm_or_si128(a, h);
}

/* Q3_K: the 16 signed sub-block scales (6 bits, bias 32) as int8: low 4 bits from scales[i]
 * (i < 8) or scales[i-8] >> 4, high 2 bits from bits 2(i/4).. of scales[8 + i%4]. p: the
 * block + 94 (the 12 scale bytes at p[2..13]; 16 bytes read, all inside the block). */
static inline __m128i kq_k3_bytes(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
    __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
    lo = _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(15));
    hi = _mm_and_si128(_mm_srlv_epi32(hi, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* two fp16 values at p (4 bytes read) as lanes 0, 1 */
static inline __m128 kq_f16x2(const uint8_t *p) {
    uint32_t u;
    __builtin_memcpy(&u, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
}

/* A tile's results out[j * nr + r] (rows rr[r], -1: dropped; tokens t..t+nt-1) stored into y
 * (first K chunk) or added to it (the later ones, in chunk order). */
static inline void kq_put(float *y, int64_t ldy, const int64_t *rr, int nr, int64_t t, int64_t nt, const float *out,
                          int first) {
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nt && rr[r] >= 0; j++) {
            float *yy = &y[(t + j) * ldy + rr[r]];
            *yy = first ? out[j * nr + r] : *yy + out[j * nr + r];
        }
}

#endif
