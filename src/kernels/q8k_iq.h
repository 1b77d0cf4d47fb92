/* q8k_iq.h: the Q8_K-activation matmul entries (matmul.h matmul_q8k_fn) of q8k_iq_avx512.c and
 * q8k_iq_avx2.c: IQ4_XS and IQ2_XXS weights (AVX-512: all 8 IQ types
 * with 256-weight blocks) times
 * ggml's Q8_K activation blocks, every T. The kernel tables kernels_avx512 (matmul_avx512.c) and kernels_avx2 (matmul_avx2.c) hold them.
 *
 * Must not: be included by code compiled without the matching ISA flags for anything but the
 * table entries. Contract: matmul.h's matmul_q8k_fn (within fp32 rounding of the exact sum of the
 * dequantized weights times the dequantized activations; y[t][r] bit-identical whatever T, the
 * token's place in the batch and the row range); rows whose n_in is not a multiple of 256 (or
 * is above 16384 for AVX-512) go to the scalar twin matmul_q8k_any_ref. */
#ifndef DSF_Q8K_IQ_H
#define DSF_Q8K_IQ_H

#include "kernels/matmul.h"

/* a matmul_q8k_fn named NAME */
#define Q8K_FN(NAME) void NAME(const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1)

Q8K_FN(q8k_iq4_xs_avx512);
Q8K_FN(q8k_iq2_xxs_avx512);
Q8K_FN(q8k_iq2_xs_avx512);
Q8K_FN(q8k_iq2_s_avx512);
Q8K_FN(q8k_iq3_xxs_avx512);
Q8K_FN(q8k_iq3_s_avx512);
Q8K_FN(q8k_iq1_s_avx512);
Q8K_FN(q8k_iq1_m_avx512);

Q8K_FN(q8k_iq4_xs_avx2);
Q8K_FN(q8k_iq2_xxs_avx2);

#endif
