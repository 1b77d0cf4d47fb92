/* select.h: the kernel tables chosen once for the process, and the calls that go through a
 * table with fallback to the scalar twins.
 *
 * Owns: the choice (CPU probe, DSF_KERNELS) of the matmul table (matmul.h) and of the vec table
 * (vec.h) together, so that one knob switches every kernel of the process; and the kern_* and
 * ka_* calls, which run a table's entry or, when it has none, the twin.
 * Must not: compute anything itself (every value comes from a table entry or a twin); include
 * anything outside src/kernels and src/base.
 * Invariant: the choice is made once and never changes; an unsupported or unknown
 * DSF_KERNELS warns and falls back to the automatic choice, it never crashes. */
#ifndef DSF_SELECT_H
#define DSF_SELECT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/matmul.h"
#include "kernels/vec.h"

/* ---- the matmul table (matmul.h) ---- */

/* The table picked once for this process: the best one the CPU supports (amx, avx512, avx2,
 * ref), or the one named by DSF_KERNELS=ref|avx2|avx512|amx|amx-mxfp4 (an unsupported or
 * unknown name warns and falls back). */
const dsf_kernels *kernels_get(void);
/* The table of that name if this CPU can run it, else NULL (tests and benchmarks). */
const dsf_kernels *kernels_by_name(const char *name);
/* Matmul through the table with fallback to the generic dequantizing twin. */
void kern_matmul(const dsf_kernels *k, const dsf_wmat *w, const float *x, int64_t T, float *y,
                 int64_t ldy, int64_t r0, int64_t r1);

/* BF16-activation matmul through the table, with fallback to the scalar twin. */
void kern_matmul_xbf16(const dsf_kernels *k, const dsf_wmat *w, const uint16_t *x, int64_t T, float *y,
                       int64_t ldy, int64_t r0, int64_t r1);
/* matmul_q8k through k's table (NULL entry: matmul_q8k_any_ref). */
void kern_matmul_q8k(const dsf_kernels *k, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y,
                     int64_t ldy, int64_t r0, int64_t r1);
/* Rounds n fp32 activations to BF16 (round to nearest even). Returns true iff every value
 * was already exact in BF16 (then kern_matmul_xbf16 computes the same exact products as
 * kern_matmul; only the summation order, and the flushing of subnormals, differ). Its scalar twin is act_to_bf16_ref (matmul.h). */
bool kern_act_to_bf16(const float *x, uint16_t *xb, int64_t n);

/* Probes through the table with fallback to the scalar versions. */
double kern_read_probe(const dsf_kernels *k, const uint8_t *p, uint64_t n);
uint64_t kern_peak_probe(const dsf_kernels *k, int64_t iters, int bf16, float *sink);

/* ---- the vec table (vec.h) ---- */

/* The table matching kernels_get()'s choice (same knob, same CPU checks), picked once. */
const dsf_akernels *akernels_get(void);
/* The table of that name if this CPU runs it ("ref", "avx2", "avx512"), else NULL (tests). */
const dsf_akernels *akernels_by_name(const char *name);

/* Calls through a table, falling back to the twin for a NULL entry (k may be NULL: twins). */
void ka_attn(const dsf_akernels *k, float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys,
             int64_t nk, float scale, const float *sinks, float *att);
void ka_index(const dsf_akernels *k, float *scores, const float *q, const float *w, const float *ik, int64_t j0,
              int64_t j1, int64_t ih, int64_t id, const uint8_t *cmask, int64_t B);
double ka_sumsq(const dsf_akernels *k, const float *x, int64_t n);
void ka_hc_collapse(const dsf_akernels *k, float *out, const float *X, const float *pre, int64_t hc, int64_t D,
                    int64_t ld);
void ka_hc_expand(const dsf_akernels *k, float *Y, const float *fo, const float *R, const float *post,
                  const float *comb, int64_t hc, int64_t D, int64_t ld);
void ka_swiglu(const dsf_akernels *k, float *z, const float *g, const float *u, int64_t n, float lim, float wt);
void ka_add(const dsf_akernels *k, float *a, const float *y, int64_t n);
/* s[k] = exp(s[k] - max s) in place; returns their sum (vec.h softmax_fn). */
float ka_softmax(const dsf_akernels *k, float *s, int64_t n);
void ka_qdq_fp8(const dsf_akernels *k, float *x, int64_t n);
void ka_qdq_fp4(const dsf_akernels *k, float *x, int64_t n);
void ka_qdq_fp4_e4m3(const dsf_akernels *k, float *x, int64_t n);
void ka_unpack_fp8(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n);
void ka_unpack_fp4(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n);
void ka_unpack_fp4_e4m3(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n);
/* y = w * x * rsqrt(sumsq(x)/n + eps) with op_rmsnorm's roundings (w may be NULL; y may alias x). */
void ka_rmsnorm(const dsf_akernels *k, float *y, const float *x, const float *w, int64_t n, float eps);

#endif
