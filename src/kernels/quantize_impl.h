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

/* The f16 value k steps (of the magnitude's bits) from the f16 value v; NAN when that leaves
 * the finite range. Used to try the stored scales next to a rounded optimum. */
float qz_f16_step(float v, int k);

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

/* A group's assignment for a fixed effective scale a: writes q (NULL: not written), returns E.
 * qz_assign_sym (integer levels lo..hi) and qz_assign_nl (indexes into grid_iq4nl; lo, hi unused). */
typedef double (*qz_assign_fn)(const float *x, const float *w, int n, float a, int lo, int hi, int8_t *q);

/* From the f16 scale d0: the best of d0 and the f16 scales up to 2 steps either side, q assigned
 * for it by assign; returns that stored scale. n <= 256. */
float qz_f16_refine(qz_assign_fn assign, const float *x, const float *w, int n, int lo, int hi, float d0,
                    int8_t *q);

/* qz_fit_sym, then the stored f16 scale next to its optimum (qz_f16_refine). */
float qz_fit_sym_f16(const float *x, const float *w, int n, int lo, int hi, int8_t *q);

/* The non-uniform grid of IQ4_NL/IQ4_XS: deq = s * grid_iq4nl[q], q in [0, 15]. qz_assign_nl
 * picks the nearest grid value; qz_fit_nl searches s as qz_fit_sym does (candidates putting the
 * largest |x| near either end of the grid, then alternating assignment and least squares). */
double qz_assign_nl(const float *x, const float *w, int n, float a, int lo, int hi, int8_t *q);
float qz_fit_nl(const float *x, const float *w, int n, int8_t *q);

/* FP4 (E2M1) codes of n values for the multiplier scale on the doubled magnitudes {0, 1, 2, 3,
 * 4, 6, 8, 12} (bit 3 the sign; no -0 written): the nearest value to |x| * i1 * i2 (i1 * i2 =
 * 1 / scale, split in two so that a power-of-two inverse beyond fp32 stays exact). Returns E. */
double qz_fp4_codes(const float *x, const float *w, int n, float scale, float i1, float i2, uint8_t *codes);

/* K-quant block encoders (quantize_k.c): 256 values x, weights w (256) -> one block. */
void qz_block_q2_k(const float *x, const float *w, uint8_t *out);
void qz_block_q3_k(const float *x, const float *w, uint8_t *out);
void qz_block_q4_k(const float *x, const float *w, uint8_t *out);
void qz_block_q5_k(const float *x, const float *w, uint8_t *out);
void qz_block_q6_k(const float *x, const float *w, uint8_t *out);
void qz_block_iq4_xs(const float *x, const float *w, uint8_t *out);

/* quantize_grid.c: one block of the type (its block size of values x, weights w). */
void qz_block_iq4_nl(const float *x, const float *w, uint8_t *out);
void qz_block_nvfp4(const float *x, const float *w, uint8_t *out);
void qz_block_q1_0(const float *x, const float *w, uint8_t *out);
void qz_block_q2_0(const float *x, const float *w, uint8_t *out);
void qz_block_tq1_0(const float *x, const float *w, uint8_t *out);
void qz_block_tq2_0(const float *x, const float *w, uint8_t *out);

/* quantize_iq2.c: one 256-value block of IQ2_XXS, IQ2_XS, IQ2_S (values x, weights w). */
void qz_block_iq2_xxs(const float *x, const float *w, uint8_t *out);
void qz_block_iq2_xs(const float *x, const float *w, uint8_t *out);
void qz_block_iq2_s(const float *x, const float *w, uint8_t *out);
/* quantize_iq13.c: one 256-value block of the grid types IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. */
void qz_block_iq3_xxs(const float *x, const float *w, uint8_t *out);
void qz_block_iq3_s(const float *x, const float *w, uint8_t *out);
void qz_block_iq1_s(const float *x, const float *w, uint8_t *out);
void qz_block_iq1_m(const float *x, const float *w, uint8_t *out);

#endif
