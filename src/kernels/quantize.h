/* quantize.h: fp32 rows -> ggml block formats (gguf-layout.md §1.4-1.5; the layouts of
 * ../shared/testdata/quants/TYPE.json), the library that `dsflash quantize` calls per row.
 *
 * Owns: the encoders; the decoders are quant.h's (dequant_row), and every encoder here
 * writes exactly the bytes those decoders read.
 * Must not: allocate (scratch is one block or one fixed-size chunk on the stack), do I/O,
 * start threads, or depend on anything but its arguments (deterministic: the same row gives
 * the same bytes on every run and machine; no FMA contraction, no rounding-mode games).
 *
 * Quality: the block types search their scales (candidate scales, then alternating
 * assignment and weighted least squares; the K-quants also refine the super-block scales
 * and the integer sub-block scales), minimizing sum_i w_i (x_i - deq_i)^2 with w_i = the
 * importance vector when one is given, else 1. The IQ grid types also search the grid entry of
 * each 4 or 8 values (quantize_iq2.c, quantize_iq13.c). Cost: roughly 30 (MXFP4) to 200 (Q5_K)
 * ns per weight on one core, 250 (IQ2_XXS, IQ1_S) to 750 (IQ2_S) for the IQ grid types, so a
 * caller quantizing a large model splits rows over threads. */
#ifndef DSF_QUANTIZE_H
#define DSF_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

/* quantize_row's results besides 0. */
#define QUANTIZE_EUNSUPPORTED (-1) /* type not supported, n <= 0 or not a multiple of the block */
#define QUANTIZE_ENONFINITE (-2)   /* a NaN/Inf in x, or a NaN/Inf/negative importance */
#define QUANTIZE_ERANGE (-3)       /* a finite |x| above quantize_max_abs(type) */

/* True for the types quantize_row can write: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K..Q6_K, MXFP4, IQ4_NL, IQ4_XS, NVFP4, Q2_0, Q1_0, TQ2_0, TQ1_0, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. IQ2_XXS, IQ2_XS and IQ1_S are written without an importance
 * vector too (weights of 1), though ggml and `dsflash quantize` require one for them
 * (quantize_requires_imatrix). */
bool quantize_type_supported(uint32_t type);

/* True exactly for the types ggml refuses to quantize without an importance matrix
 * (ggml_quantize_requires_imatrix: IQ2_XXS, IQ2_XS, IQ1_S), whether or not this library
 * writes them. */
bool quantize_requires_imatrix(uint32_t type);

/* The largest |x| quantize_row accepts for the type: what the format can represent (F16:
 * below 65520, which would round to inf; BF16: below the bf16 rounding-to-inf point; a block
 * type: its largest f16 block scale times its largest level). +inf when any finite fp32 fits
 * (F32, MXFP4) and for NVFP4, which has no per-tensor scale and saturates |x| beyond 2688
 * (12 x UE4M3 448 / 2) to 2688, as ggml's quantizer does; 0 for an unsupported type. */
float quantize_max_abs(uint32_t type);

/* Quantizes one row of n values (n a positive multiple of the type's block size) into
 * n / blck * type_size bytes at out. imatrix is NULL or n per-column importances (>= 0,
 * e.g. mean squared activations); types whose format has no choice to make (F32, F16, BF16)
 * ignore it.
 *
 * Non-finite or out-of-range input is refused, never encoded: the whole row (and imatrix)
 * is checked before anything is written, and on any error out is left untouched. Returns 0,
 * QUANTIZE_EUNSUPPORTED, QUANTIZE_ENONFINITE or QUANTIZE_ERANGE. The caller names the tensor
 * in its message (quantize_strerror gives the reason). */
int quantize_row(uint32_t type, const float *x, int64_t n, const float *imatrix, void *out);

/* One line for a quantize_row result ("ok" for 0). */
const char *quantize_strerror(int rc);

#endif
