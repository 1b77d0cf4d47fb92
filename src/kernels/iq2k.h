/* iq2k.h: the matmul entries of iq2_avx512.c and iq2_avx2.c: IQ2_XXS, IQ2_XS, IQ2_S and IQ4_XS
 * weights, both activation families (matmul_fn: fp32 activations; matmul_xbf16_fn: BF16
 * activations), every T. The kernel tables (matmul_avx512.c, matmul_avx2.c) hold them.
 *
 * Must not: be included by code compiled without the matching ISA flags for anything but the
 * table entries. Contract: matmul.h's (numerics within fp32 summation noise of the exact dot of
 * the dequantized weights, batch invariance within a family and table); rows whose n_in is not
 * a multiple of 256 (or is above 16384) go to the scalar twins. */
#ifndef DSF_IQ2K_H
#define DSF_IQ2K_H

#include "kernels/matmul.h"

#define IQ2K_MM(NAME) \
    void NAME(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1)
#define IQ2K_XMM(NAME) \
    void NAME(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1)
#define IQ2K_DECL(ISA)                                                                                          \
    IQ2K_MM(mm_iq2_xxs_##ISA); IQ2K_MM(mm_iq2_xs_##ISA); IQ2K_MM(mm_iq2_s_##ISA); IQ2K_MM(mm_iq4_xs_##ISA);    \
    IQ2K_XMM(xmm_iq2_xxs_##ISA); IQ2K_XMM(xmm_iq2_xs_##ISA); IQ2K_XMM(xmm_iq2_s_##ISA); IQ2K_XMM(xmm_iq4_xs_##ISA);

IQ2K_DECL(avx512)
IQ2K_DECL(avx2)

#endif
