/* iq13.h: the matmul kernels of the grid types IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (256-weight
 * super-blocks; gguf-layout §1.5, ../shared/testdata/quants/TYPE.json): AVX-512 in
 * iq13_avx512.c, AVX2 in iq13_avx2.c. Each is a matmul_fn (fp32 activations) or a
 * matmul_xbf16_fn (BF16 activations) with matmul.h's contract: within fp32 summation noise of
 * the dequantized weights' exact dot, batch-invariant within its family and table; rows whose
 * n_in is not a multiple of 256 go to the scalar twin.
 *
 * Must not: be called outside the table of its ISA (matmul_avx512.c, matmul_avx2.c): each
 * exists only in builds that compile its file with that ISA's flags. */
#ifndef DSF_IQ13_H
#define DSF_IQ13_H

#include <string.h>

#include "kernels/matmul.h"

#define IQ13_DECL(ISA)                                                                                                \
    void matmul_iq3xxs_f32_##ISA(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,    \
                                 int64_t r1);                                                                        \
    void matmul_iq3s_f32_##ISA(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,      \
                               int64_t r1);                                                                          \
    void matmul_iq1s_f32_##ISA(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,      \
                               int64_t r1);                                                                          \
    void matmul_iq1m_f32_##ISA(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,      \
                               int64_t r1);                                                                          \
    void matmul_iq3xxs_bf16_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,            \
                                  int64_t r0, int64_t r1);                                                           \
    void matmul_iq3s_bf16_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,  \
                                int64_t r1);                                                                         \
    void matmul_iq1s_bf16_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,  \
                                int64_t r1);                                                                         \
    void matmul_iq1m_bf16_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,  \
                                int64_t r1);

IQ13_DECL(avx512)
IQ13_DECL(avx2)

/* Helpers of the two kernel files: little-endian field reads and the block sizes. */
static inline uint32_t iq13_rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint16_t iq13_rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline int iq13_block_bytes(int ty) {
    return ty == GGML_TYPE_IQ3_XXS ? 98 : ty == GGML_TYPE_IQ3_S ? 110 : ty == GGML_TYPE_IQ1_S ? 50 : 56;
}

/* The cases a driver leaves to the scalar twins (bf: BF16 activations): rows that are not
 * whole blocks; true when the call is done (an empty range is done as well). */
static inline int iq13_twin(const dsf_wmat *w, const void *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                            int64_t r1, int bf) {
    if (r1 <= r0 || T <= 0) return 1;
    if (w->n_in % 256 == 0) return 0;
    if (bf) matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);
    else matmul_any_ref(w, x, T, y, ldy, r0, r1);
    return 1;
}

/* Defines ISA's 8 entries (in its own file) over that file's driver
 * DRV(w, x, T, y, ldy, r0, r1, type, bf): x const void *, bf = 1 for BF16 activations. */
#define IQ13_DEF1(ISA, NAME, TY, DRV)                                                                                \
    void matmul_##NAME##_f32_##ISA(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,  \
                                   int64_t r1) {                                                                     \
        DRV(w, x, T, y, ldy, r0, r1, TY, 0);                                                                         \
    }                                                                                                                \
    void matmul_##NAME##_bf16_##ISA(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,          \
                                    int64_t r0, int64_t r1) {                                                        \
        DRV(w, x, T, y, ldy, r0, r1, TY, 1);                                                                         \
    }
#define IQ13_DEFINE(ISA, DRV)                                                                                        \
    IQ13_DEF1(ISA, iq3xxs, GGML_TYPE_IQ3_XXS, DRV)                                                                   \
    IQ13_DEF1(ISA, iq3s, GGML_TYPE_IQ3_S, DRV)                                                                       \
    IQ13_DEF1(ISA, iq1s, GGML_TYPE_IQ1_S, DRV)                                                                       \
    IQ13_DEF1(ISA, iq1m, GGML_TYPE_IQ1_M, DRV)

#endif
