/* red256.h: the horizontal sum of an AVX2 accumulator, shared by the AVX2 matmul tiles
 * (matmul_avx2.c) and the fused FP8 tile that repeats them bit for bit (fp8_avx2.c). Include
 * only from code compiled with the AVX2 flags. */
#ifndef DSF_RED256_H
#define DSF_RED256_H

#include <immintrin.h>

/* The sum of the 8 lanes: the 128-bit halves added, then lanes i + i+2, then + i+1. */
static inline __attribute__((always_inline)) float red256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
