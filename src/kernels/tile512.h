/* tile512.h: the pieces of the AVX-512 matmul tiles that matmul_avx512.c (fp32 and BF16
 * products, the table) and mxfp4_avx512.c (MXFP4 x BF16 activations, both layouts) share: the
 * prefetch distance, the far-apart row streams of a tile, the tiles' horizontal sums and stores,
 * and mxfp4_avx512.c's two table entries.
 *
 * Include only from code compiled with the AVX-512 flags, inside its __AVX512F__ guard.
 * Must not: hold state or anything but static inline helpers, macros and declarations; every
 * helper is always inlined, so each tile compiles as if it were written in its own file. */
#ifndef DSF_TILE512_H
#define DSF_TILE512_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/matmul.h"

#ifndef PF_DIST
/* Software prefetch distance in bytes along each weight row (decode tiles): the distance that
 * read memory fastest (docs/perf-log.md, item 7). */
#define PF_DIST 1024
#endif

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#include "kernels/red512.h"

/* out[t * 4 + r] = the sum of acc[r][t] (4 rows x 4 tokens): each token's 4 rows adjacent. */
INLINE void red4x4(__m512 acc[4][4], float *out) {
    __m512 a[16];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[4 * r + t] = acc[r][t];
    _mm512_storeu_ps(out, red16(a));
}

/* Adds (k > 0) or stores (k = 0) a 4 x 4 tile's sums out (red4x4's order) into the y of 4
 * adjacent rows from row r and tokens t..t+3: one 4-float access per token. */
INLINE void tile_put4x4(const float *out, float *y, int64_t ldy, int64_t t, int64_t r, int64_t k) {
    UNROLL for (int j = 0; j < 4; j++) {
        float *yy = y + (t + j) * ldy + r;
        __m128 v = _mm_loadu_ps(out + 4 * j);
        _mm_storeu_ps(yy, k == 0 ? v : _mm_add_ps(_mm_loadu_ps(yy), v));
    }
}
/* out[r] = the sum of a[r], r < 4. */
INLINE void red4(const __m512 *a, float *out) {
    __m512 c = red_q(red_q(a[0], a[1], 0x44, 0xEE), red_q(a[2], a[3], 0x44, 0xEE), 0x88, 0xDD);
    __m512 d = red_e(c, c, 0x44, 0xEE);
    __m512 e = red_e(d, d, 0x88, 0xDD); /* lane 4k: the sum of a[k] */
    _mm_storeu_ps(out, _mm512_castps512_ps128(
                           _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), e)));
}

/* ---- T = 1 row order ----
 * A decode tile takes RB x pw rows: pw adjacent rows from each of RB far-apart streams (the
 * row range [r0, r1) is cut into RB contiguous streams of `len` steps of pw rows; tile k
 * takes step k of each). Each thread then reads RB long sequential streams, which the memory
 * system serves much better than RB adjacent rows, short streams the hardware prefetchers
 * keep re-learning (docs/perf-log.md, item 2). Rows past r1 (the tail of
 * the last stream) repeat row r1 - 1 and their results are dropped. The order of rows does
 * not change any value. */
INLINE int64_t t1_stream_len(int64_t r0, int64_t r1, int ns, int pw) { return (r1 - r0 + ns * pw - 1) / (ns * pw); }
INLINE void t1_tile_rows(const dsf_wmat *w, int64_t r0, int64_t r1, int64_t len, int64_t k, int ns, int pw,
                         int64_t *rr, const uint8_t **wr) {
    for (int s = 0; s < ns; s++)
        for (int j = 0; j < pw; j++) {
            int64_t r = r0 + (s * len + k) * pw + j;
            rr[s * pw + j] = r < r1 ? r : -1;
            wr[s * pw + j] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
        }
}

INLINE __m512bh as_bh(__m512i v) { return (__m512bh)v; }

/* The kernels_avx512 entries of mxfp4_avx512.c (matmul_xbf16_fn): MXFP4 weights, and
 * DSF_TYPE_MXFP4R weights, with BF16 activations. */
void xmm_mxfp4_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                      int64_t r1);
void xmm_mxfp4r_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                       int64_t r1);

#endif
