/* q8k.h: the entry points of the Q8_K-activation kernels (matmul.h matmul_q8k_fn: the opt-in
 * mode in which the activations are quantized as ggml quantizes them) of the K-quants (Q2_K..Q6_K):
 * q8k_avx512.c (entries of kernels_avx512).
 *
 * Owns: declarations only. Each function honours matmul_q8k_fn's contract: within fp32 rounding
 * of matmul_q8k_any_ref, batch invariant (y[t][r] bit-identical whatever T, the token's place and
 * the row range). Rows whose length is not a multiple of 256 go to the scalar twin. */
#ifndef DSF_Q8K_H
#define DSF_Q8K_H

#include "kernels/matmul.h"

#define MQ8_DECL(T)                                                                                             \
    void mq8_##T##_avx512(const dsf_wmat *w, const dsf_q8k *x, int64_t T_, float *y, int64_t ldy, int64_t r0, \
                          int64_t r1);
MQ8_DECL(q2_k)
MQ8_DECL(q3_k)
MQ8_DECL(q4_k)
MQ8_DECL(q5_k)
MQ8_DECL(q6_k)
#undef MQ8_DECL

#endif
