/* red512.h: horizontal sums of AVX-512 accumulators, shared by the AVX-512 kernel files (include
 * only from code compiled with the AVX-512 flags). */
#ifndef DSF_RED512_H
#define DSF_RED512_H

#include <immintrin.h>

/* ---- horizontal sums ----
 * Every tile ends by summing the 16 lanes of each accumulator. red16 sums 16 accumulators at
 * once, red4 four, each sum by the tree of GCC's _mm512_reduce_add_ps: lane i + lane i+8, then
 * + i+4, then + i+2, then + i+1 (fp32 addition commutes, so the operand order within a pair
 * does not matter). Every tile uses these, so the T = 1 and T > 1 tiles of a family keep
 * adding in the same order whatever the compiler; red16 takes 45 vector operations for 16
 * sums where 16 reductions take 128 (docs/perf-log.md, item 23). */
/* (the shuffles take immediates, hence macros) quarter pairs; element pairs within quarters */
#define red_q(a, b, lo, hi) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, lo), _mm512_shuffle_f32x4(a, b, hi))
#define red_e(a, b, lo, hi) _mm512_add_ps(_mm512_shuffle_ps(a, b, lo), _mm512_shuffle_ps(a, b, hi))
/* Lane 4k + j of the result is the sum of a[4j + k]. */
static inline __attribute__((always_inline)) __m512 red16(const __m512 *a) {
    __m512 b[8], c[4];
    _Pragma("GCC unroll 16") for (int m = 0; m < 8; m++) b[m] = red_q(a[2 * m], a[2 * m + 1], 0x44, 0xEE); /* i + i+8 */
    _Pragma("GCC unroll 16") for (int n = 0; n < 4; n++) c[n] = red_q(b[2 * n], b[2 * n + 1], 0x88, 0xDD); /* i + i+4 */
    __m512 d0 = red_e(c[0], c[1], 0x44, 0xEE), d1 = red_e(c[2], c[3], 0x44, 0xEE);     /* i + i+2 */
    return red_e(d0, d1, 0x88, 0xDD);                                                   /* i + i+1 */
}

#endif
