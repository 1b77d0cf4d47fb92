/* fp8.h: the products of DSF_TYPE_FP8B32 weights (the checkpoint's dense e4m3 matrices with their
 * 32x32 E8M0 grid, dtype.h) in both kernel families, for the avx2, avx512 and amx tables.
 *
 * Owns: the FP8_B32 entries of the fast tables (matmul_avx2.c, matmul_avx512.c and matmul_amx.c
 * register them, handing each the table's own BF16 kernel), the row decoder to BF16 and the
 * driver that runs a BF16 kernel over decoded rows (fp8.c), and the fused T = 1 kernels
 * (fp8_avx512.c, fp8_avx2.c).
 * Must not: allocate, start threads or keep state (kernels); include anything outside
 * src/kernels and src/base.
 *
 * Invariant (the contract of every entry): the result is bit-identical to the same table's BF16
 * kernel of the same family run on the BF16 matrix that holds the same values, bf16(w(r, i)) =
 * the top half of e4m3(q) * 2^(S-127) (exact whenever the value is a BF16 value, which every
 * value with 3 <= S is: see below), for every T, token place and row range -- so a native file's
 * logits equal the BF16 file's, and decode and prefill agree. Two ways keep it:
 *   - T > 1: rows are decoded to BF16 into stack scratch and the table's BF16 kernel runs on them
 *     (fp8b32_via_bf16): the same kernel on the same values;
 *   - T = 1: a fused kernel decodes in registers and performs the BF16 T = 1 kernel's float
 *     operations in its order (the same K chunks, the same lane sums), only the load differs.
 * Exactness of the fast decodes: every e4m3 value (subnormals included) is a normal BF16 (and
 * fp32) value, and scaling it by 2^(S-127) is exact for 3 <= S <= 246: the value has at most 4
 * significant bits and stays at or above 2^-133, the smallest BF16 subnormal, and below 2^128.
 * A block with another scale (S <= 2: values below BF16's reach; S >= 247: the fast decodes'
 * multiplier leaves fp32; 255: NaN) is an exceptional block: the decoder takes it element by
 * element (wmat_dequant_row's value, rounded to BF16 by f32_to_bf16), and a fused kernel
 * recomputes the row through the BF16 kernel (a fused kernel may send more scales that way, see
 * its file). NaN codes (0x7F, 0xFF) decode to NaN, as in the BF16 matrix. The sign of a zero
 * weight never changes a result (accumulators start at +0 and a sum is -0 only when both terms
 * are), but the decoders keep it anyway. Real checkpoints use S ~ 100..135 and no NaN codes.
 * AVX-512 decodes by table lookup (fp8_avx512.c), AVX2 through fp16 (fp8_avx2.c). */
#ifndef DSF_FP8_H
#define DSF_FP8_H

#include <stdint.h>

#include "kernels/matmul.h"

/* The scales for which the fast decode is exact (above). */
static inline int fp8_scale_ok(uint8_t s) { return s >= 3 && s <= 246; }

/* One row of an FP8_B32 matrix as BF16 bits: ng groups of 32 codes q, the row block's grid row
 * sc, into dst[32 ng]: bf16 of e4m3(q) * 2^(S-127), exact where the value is a BF16 value,
 * f32_to_bf16 of it in the exceptional blocks. */
typedef void (*fp8_row_fn)(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *dst);

/* The scalar decoder (fp8.c): every block element by element. */
void fp8_row_bf16_ref(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *dst);
/* Rows [r, r + n) of w (n_in a multiple of 32) into dst[n][n_in], each by dec. */
void fp8_rows_bf16(const dsf_wmat *w, int64_t r, int64_t n, uint16_t *dst, fp8_row_fn dec);
/* One exceptional block (32 values at q, scale s) into dst, element by element. */
void fp8_block_bf16_ref(const uint8_t *q, uint8_t s, uint16_t *dst);

/* The product through a BF16 kernel: rows of w decoded by dec into stack scratch (256 KiB,
 * whole rows) and, per chunk of tokens, the BF16 kernel run on them: mm with the fp32
 * activations x when x != NULL, else xmm with the BF16 activations xb. n_in must be a multiple of
 * 32 and at most 131072 (else the twin runs, which asks n_in <= 16384). */
void fp8b32_via_bf16(const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, matmul_fn mm, matmul_xbf16_fn xmm, fp8_row_fn dec);

/* The table entries, given the table's BF16 kernels and the K chunk (elements) of their T = 1
 * path, which the fused kernels repeat. AVX-512: bf16 / xbf16 are kernels_avx512's BF16 entries
 * (kc: its KC and XKC); the via entry runs every T through the scratch (the amx table, whose
 * tile sums cannot be repeated in registers). AVX2: mm is its fp32-family BF16 entry, xmm its
 * BF16-activation one (which widens the activations and runs mm's operations). */
void fp8b32_mm_avx512(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      matmul_fn bf16, int kc);
void fp8b32_xbf16_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                         int64_t r1, matmul_xbf16_fn bf16, int kc);
void fp8b32_xbf16_via_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                             int64_t r1, matmul_xbf16_fn bf16);
void fp8b32_mm_avx2(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                    matmul_fn bf16, int kc);
void fp8b32_xbf16_avx2(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                       int64_t r1, matmul_xbf16_fn xmm, matmul_fn mm, int kc);

#endif
