/* vec.h: the non-matmul kernels of the forward pass: the attention core (scores, joint
 * softmax with a sink, weighted sum), the lightning indexer's scores, and the small vector
 * operations around them (RMS sums, hc collapse/expand, SwiGLU, accumulation, RoPE).
 *
 * Kernels know arrays and sizes only: no allocation, no I/O, no threads, deterministic. Every
 * entry has a scalar twin (the *_ref functions in vec_ref.c: the model's formulas in their
 * original evaluation order); a fast table (vec_avx2.c, vec_avx512.c) may leave an entry
 * NULL, and then the twin runs. The table follows the matmul table's choice (select.h:
 * akernels_get, the best ISA the CPU supports, or DSF_KERNELS=ref|avx2|avx512), so one knob
 * switches every kernel of the process; the ka_* calls that fall back to the twins are
 * select.h's too. Must not: choose or dispatch here, or include anything outside src/kernels
 * and src/base.
 *
 * Numerics of the fast entries against their twins (checked by tests/unit/kernels_attn.c):
 *   - hc_collapse, hc_expand, add, rope: bit-identical (same operations in the same order,
 *     products and sums rounded separately, never fused);
 *   - unpack_*: bit-identical (the same product of element and scale);
 *   - sumsq: double accumulation in another order (differences ~1e-16 relative);
 *   - attn, index, swiglu: fp32 sums in another order, fused multiply-adds, and a vector
 *     exp within 2 ulp of expf (see vec_avx512.c); relative differences ~1e-6. */
#ifndef DSF_VEC_H
#define DSF_VEC_H

#include <stdint.h>

/* Attention of nh query heads of one token over nk shared keys (MQA: the key rows double as
 * values, architecture.md §4.4.8). q, o: [nh][dh]; keys[k]: row of dh floats; sinks: [nh]
 * raw logits; att: scratch of nh*nk floats. For each head h:
 *   s_k = (q_h . key_k) * scale,  m = max(sink_h, max_k s_k),
 *   o_h = sum_k exp(s_k - m) key_k / (exp(sink_h - m) + sum_k exp(s_k - m)).
 * nk may be 0 (then o_h = 0). */
typedef void (*attn_fn)(float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys, int64_t nk,
                        float scale, const float *sinks, float *att);

/* Lightning-indexer scores (architecture.md §4.4.5) of rows j in [j0, j1) for one query:
 *   scores[j] = sum_h w[h] * relu(q_h . ik_j)   (q: [ih][id], w: [ih], ik: rows of id floats),
 * or -INFINITY when cmask is given and cmask[j / B] == 0 (row outside the candidate blocks). */
typedef void (*index_fn)(float *scores, const float *q, const float *w, const float *ik, int64_t j0, int64_t j1,
                         int64_t ih, int64_t id, const uint8_t *cmask, int64_t B);

/* sum_i x[i]^2 accumulated in double (RMSNorm and the hc mixes' rms). */
typedef double (*sumsq_fn)(const float *x, int64_t n);

/* One token: out[d] = sum_c pre[c] X[c][d]   (X: hc rows ld apart, d < D <= ld; the sum in
 * increasing c). */
typedef void (*hc_collapse_fn)(float *out, const float *X, const float *pre, int64_t hc, int64_t D, int64_t ld);

/* One token: Y[j][d] = post[j] fo[d] + sum_i comb[i][j] R[i][d]   (R, Y: hc rows ld apart, d < D
 * <= ld; comb: [hc][hc]; the residual sum over increasing i first, then the sublayer term added). */
typedef void (*hc_expand_fn)(float *Y, const float *fo, const float *R, const float *post, const float *comb,
                             int64_t hc, int64_t D, int64_t ld);

/* z[i] = wt * (silu(min(g[i], lim)) * clamp(u[i], -lim, lim)); lim <= 0: no clamps; silu(x) =
 * x / (1 + exp(-x)). z may alias g or u. */
typedef void (*swiglu_fn)(float *z, const float *g, const float *u, int64_t n, float lim, float wt);

/* a[i] += y[i] */
typedef void (*add_fn)(float *a, const float *y, int64_t n);

/* The numerators of a softmax without a sink (the vision tower's attention, vision.md §3): in
 * place s[k] = exp(s[k] - m), m = max_k s[k]; returns sum_k s[k]. n >= 1. */
typedef float (*softmax_fn)(float *s, int64_t n);

/* QDQ_FP8 in place (quant.h qdq_fp8_e8m0, spec §3.3): groups of 32, pow2 scale, e4m3 RNE; a
 * tail of n % 32 is left alone. Fast versions are bit-identical to the twin. */
typedef void (*qdq_fn)(float *x, int64_t n);

/* Decoders of the packed KV formats (quant.h unpack_*: the twins): y[0..n) from the codes and
 * the scales; n a multiple of the group size (32, 32, 16). Fast versions are bit-identical to
 * the twins (each value is the twin's one product of the element and the scale). */
typedef void (*unpack_fn)(float *y, const uint8_t *codes, const uint8_t *scales, int64_t n);

typedef struct {
    const char *name; /* "ref", "avx2", "avx512" (the matmul table's name) */
    attn_fn attn;
    index_fn index;
    sumsq_fn sumsq;
    hc_collapse_fn hc_collapse;
    hc_expand_fn hc_expand;
    swiglu_fn swiglu;
    add_fn add;
    softmax_fn softmax;
    qdq_fn qdq_fp8;
    qdq_fn qdq_fp4;      /* QDQ_FP4_E8M0 (index queries and keys) */
    qdq_fn qdq_fp4_e4m3; /* QDQ_FP4_E4M3 (compressed KV rows): groups of 16, e4m3 scale */
    unpack_fn unpack_fp8;      /* packed window rows: e4m3 codes, E8M0 per 32 */
    unpack_fn unpack_fp4;      /* packed index keys: e2m1 nibbles, E8M0 per 32 */
    unpack_fn unpack_fp4_e4m3; /* packed compressed rows: e2m1 nibbles, e4m3 per 16 */
} dsf_akernels;

extern const dsf_akernels akernels_ref;
extern const dsf_akernels akernels_avx2;   /* vec_avx2.c */
extern const dsf_akernels akernels_avx512; /* vec_avx512.c */

/* RoPE with a per-position table: cs[2i] = cos, cs[2i+1] = sin of the fp32 angle fp32(pos)*freq[i]
 * (computed in double and rounded, exactly as op_rope does) for i < n_rot/2. ka_rope_apply
 * rotates the pairs of x[0..n_rot) like op_rope(x, n_rot, freq, pos, inverse) does, bit for bit,
 * so one table serves every head of a token. */
void ka_rope_table(float *cs, int64_t n_rot, const float *freq, int64_t pos);
void ka_rope_apply(float *x, int64_t n_rot, const float *cs, int inverse);

/* The scalar twins (also the entries of akernels_ref). */
void attn_ref(float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys, int64_t nk, float scale,
              const float *sinks, float *att);
void index_ref(float *scores, const float *q, const float *w, const float *ik, int64_t j0, int64_t j1, int64_t ih,
               int64_t id, const uint8_t *cmask, int64_t B);
double sumsq_ref(const float *x, int64_t n);
void hc_collapse_ref(float *out, const float *X, const float *pre, int64_t hc, int64_t D, int64_t ld);
void hc_expand_ref(float *Y, const float *fo, const float *R, const float *post, const float *comb, int64_t hc,
                   int64_t D, int64_t ld);
void swiglu_ref(float *z, const float *g, const float *u, int64_t n, float lim, float wt);
void add_ref(float *a, const float *y, int64_t n);
float softmax_ref(float *s, int64_t n);

#endif
