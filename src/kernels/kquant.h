/* kquant.h: the entry points of the K-quant matmul kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K):
 * kquant_avx512.c (entries of kernels_avx512) and kquant_avx2.c (entries of kernels_avx2).
 *
 * Owns: declarations only. Each function has the matmul_fn (fp32 activations, mm_) or
 * matmul_xbf16_fn (BF16 activations, xmm_) signature of matmul.h and honours its contract:
 * results within fp32 summation noise of the dequantize-then-dot twin, batch invariant within
 * a family and table. Rows whose length is not a multiple of 256 (and BF16-activation rows
 * over 16384) go to the scalar twins. */
#ifndef DSF_KQUANT_H
#define DSF_KQUANT_H

#include "kernels/matmul.h"

#define KQ_DECL(ISA, T)                                                                                        \
    void mm_##T##_##ISA(const dsf_wmat *w, const float *x, int64_t T_, float *y, int64_t ldy, int64_t r0,    \
                        int64_t r1);                                                                         \
    void xmm_##T##_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T_, float *y, int64_t ldy, int64_t r0, \
                         int64_t r1);
KQ_DECL(avx512, q2_k)
KQ_DECL(avx512, q3_k)
KQ_DECL(avx512, q4_k)
KQ_DECL(avx512, q5_k)
KQ_DECL(avx512, q6_k)
KQ_DECL(avx2, q2_k)
KQ_DECL(avx2, q3_k)
KQ_DECL(avx2, q4_k)
KQ_DECL(avx2, q5_k)
KQ_DECL(avx2, q6_k)
#undef KQ_DECL

#endif
