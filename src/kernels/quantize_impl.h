/* quantize_impl.h: what quantize.c shares with quantize_k.c: the weighted scale searches and
 * the block encoders of the K-quants. Not for callers outside src/kernels/quantize*.c (the API
 * is quantize.h).
 *
 * Every search minimizes E = sum_i w_i (x_i - deq_i)^2 for one group of values, where deq_i is
 * computed exactly as the decoder computes it (fp32, products in the decoder's order).
 * Invariants: the inputs are finite (quantize_row checks first), w_i >= 0 with a positive sum
 * (qz_weights guarantees it), and a group whose largest |x| (or range, for an affine grid) is
 * below QZ_TINY gets scale 0 (no f16 scale can represent it, and 1/scale would overflow). */
#ifndef DSF_QUANTIZE_IMPL_H
#define DSF_QUANTIZE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#define QZ_TINY 1e-30f

/* The integer nearest to v, halves upward (floor(v + 0.5)), clamped to [lo, hi]. */
int qz_nearest(float v, int lo, int hi);

/* The f16 value nearest to v, saturated to +-65504 instead of inf: what a scale field can hold. */
float qz_f16_round(float v);

/* Writes 16-bit/32-bit little-endian values. */
void qz_put16(uint8_t *p, uint16_t v);
void qz_put32(uint8_t *p, uint32_t v);

/* The weights of n values starting at column off: imatrix + off when imatrix is given and
 * those n weights have a positive sum, else n ones (a constant table). n <= 256. */
const float *qz_weights(const float *imatrix, int64_t off, int n);

/* Symmetric grid: deq = s * q, q integer in [lo, hi] (lo < 0 < hi). Searches s (either sign)
 * over candidates that put the largest |x| near either end of the grid, then alternates
 * nearest assignment and least squares s = sum(wxq)/sum(wqq) while E decreases. Writes q
 * (n values) and returns s (0 for a tiny group, q all 0). */
float qz_fit_sym(const float *x, const float *w, int n, int lo, int hi, int8_t *q);

/* Affine grid: deq = s * q + b, q integer in [0, nmax], s >= 0; with neg_b, b <= 0 (the
 * K-quants store the offset as -dmin * m with m >= 0 and one dmin per super-block). Searches
 * the range's split into about nmax levels anchored at the minimum (and, with both_ends, at
 * the maximum: clipping the low end instead), then alternates assignment and the weighted
 * least-squares (s, b) (b pinned at 0 when neg_b and the free optimum is positive) from the
 * best two. Writes q, *s, *b. */
void qz_fit_affine(const float *x, const float *w, int n, int nmax, bool neg_b, bool both_ends, uint8_t *q,
                   float *s, float *b);

/* Squared-error terms of a symmetric group for a fixed effective scale a (deq = a * q,
 * fp32 as decoded): assigns q (NULL: not written) and returns E. */
double qz_assign_sym(const float *x, const float *w, int n, float a, int lo, int hi, int8_t *q);
/* The same for deq = a * q - c, q in [0, nmax]. */
double qz_assign_affine(const float *x, const float *w, int n, float a, float c, int nmax, uint8_t *q);

/* K-quant block encoders (quantize_k.c): 256 values x, weights w (256) -> one block. */
void qz_block_q2_k(const float *x, const float *w, uint8_t *out);
void qz_block_q3_k(const float *x, const float *w, uint8_t *out);
void qz_block_q4_k(const float *x, const float *w, uint8_t *out);
void qz_block_q5_k(const float *x, const float *w, uint8_t *out);
void qz_block_q6_k(const float *x, const float *w, uint8_t *out);

#endif
