/* ops.h: small vector operations of the forward pass (norms, activations, RoPE, hc mixes,
 * Sinkhorn, top-k). Pure functions on arrays: no allocation, no I/O, deterministic. */
#ifndef DSF_OPS_H
#define DSF_OPS_H

#include <stdint.h>

/* mean(x^2) in fp32 in the reference's (torch CPU) summation order. */
float op_meansq(const float *x, int64_t n);
/* y = (x * (1 / sqrt(mean(x^2) + eps))) * w, fp32 as the reference rounds it; y may alias x.
 * w may be NULL (no weight). */
void op_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
float op_sigmoid(float x);
float op_silu(float x);
float op_softplus(float x); /* torch default: x > 20 -> x, else log1p(exp(x)) */

/* RoPE frequencies (architecture.md §4.4.3, computed in fp32 as the reference does).
 * freq[i] for i < n_rot/2. yarn: blend with factor/orig_ctx/beta_fast/beta_slow. */
void op_rope_freqs(float *freq, int64_t n_rot, float base, int yarn, float factor, int64_t orig_ctx,
                   float beta_fast, float beta_slow);
/* Rotates the adjacent pairs (x[2i], x[2i+1]) of x[0..n_rot) by angle fp32(pos)*freq[i]
 * (inverse: by minus that angle). */
void op_rope(float *x, int64_t n_rot, const float *freq, int64_t pos, int inverse);

/* Sinkhorn (architecture.md §4.3): A is [n][n] logits (i = source copy, j = destination);
 * writes comb[i][j]: row softmax + eps, column normalization, then (iters-1) x (row, col). */
void op_sinkhorn(float *comb, const float *A, int64_t n, int64_t iters, float eps);

/* Top-k (k <= n) of scores[0..n) by value, ties to the lower index; NaN never wins.
 * Writes the selected indices to out in increasing index order; returns the count
 * (min(k, n)). heap is scratch of k int32. */
int64_t op_topk(const float *scores, int64_t n, int64_t k, int32_t *out, int32_t *heap);

#endif
