/* quant.h: element and block formats (gguf-layout.md §1.4-1.5, architecture.md §3) and the
 * reference quantize-dequantize (QDQ) operators of the official numerics contract (§3.3).
 *
 * These are kernels: pure functions on arrays, no allocation, no I/O. All scalar; they are
 * the reference twins of any SIMD version. */
#ifndef DSF_QUANT_H
#define DSF_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- element codecs ---- */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);        /* round to nearest even; NaN stays a quiet NaN */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);         /* round to nearest even */
float e4m3_to_f32(uint8_t b);         /* OCP e4m3fn; 0x7F/0xFF -> NaN */
uint8_t f32_to_e4m3(float f);         /* RNE, saturating to +-448 (never NaN for finite f) */
float e8m0_to_f32(uint8_t b);         /* 2^(b-127); 255 -> NaN */
float e2m1_to_f32(uint8_t code);      /* bit 3 sign, magnitudes {0,.5,1,1.5,2,3,4,6} */
uint8_t f32_to_e2m1(float f);         /* clamp to +-6, nearest, ties to the even code */
float pow2ceil_f32(float t);          /* 2^ceil(log2 t) via IEEE bits, t > 0 (§3.3) */

/* ---- ggml block types ---- */
/* Elements and bytes per block; 0 for an unknown/retired id. dsflash's native types (dtype.h)
 * answer too: FP8_R264 256 / 264, FP8_B32 1 / 1 (its rows; the scale grid is extra). */
uint32_t ggml_blck_size(uint32_t type);
uint32_t ggml_type_size(uint32_t type);
const char *ggml_type_name(uint32_t type); /* "?" if unknown */
/* True for dsflash's native types (DSF_TYPE_FP8B32, DSF_TYPE_FP8R264). */
bool dsf_type_native(uint32_t type);
/* Bytes a tensor holds beyond its rows (rows x ne0 elements at the block size): the scale grid of
 * DSF_TYPE_FP8B32, ceil(rows/32) * ceil(ne0/32); 0 for every other type. */
uint64_t dsf_type_extra_bytes(uint32_t type, uint64_t ne0, uint64_t rows);
/* True if dequant_row() supports the type: every ggml type of the block table (all the types
 * of ggml 0.25.1's GGUF files), the F64/I* element types and DSF_TYPE_FP8R264. dequant.c
 * implements both. DSF_TYPE_FP8B32 is not a row type (its scales are shared by 32 rows):
 * matmul.h's wmat_dequant_row reads it. */
bool ggml_type_supported(uint32_t type);
/* Dequantizes n elements (n a multiple of the block size) of a row of the given type, bit for bit
 * as ggml 0.25.1's to_float (-0.0 and subnormals included). */
void dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Q8_K activations (matmul.h dsf_q8k), n a multiple of 256, out n/256 blocks (292 bytes each,
 * ggml's block_q8_K; out is void * so that this header need not know the struct). Bit for bit
 * ggml's quantize_row_q8_K: per block the element of largest magnitude m (the first one on
 * ties) gets code -127, iscale = -127/m, q = round-half-even(iscale * x) capped at 127,
 * d = 1/iscale, bsums[j] = the sum of codes 16j..16j+15; an all-zero block has d = 0, codes 0. */
void quantize_row_q8k(const float *x, int64_t n, void *out);

/* ---- QDQ operators (architecture.md §3.3), in place, fp32 values ----
 * n must be a multiple of the group size. */
void qdq_fp8_e8m0(float *x, int64_t n);   /* QDQ_FP8: groups of 32, pow2 scale */
void qdq_fp4_e8m0(float *x, int64_t n);   /* QDQ_FP4_E8M0: groups of 32 */
void qdq_fp4_e4m3(float *x, int64_t n);   /* QDQ_FP4_E4M3: groups of 16, e4m3 scale */

/* ---- packed QDQ (architecture.md §5.1, §5.5: the KV state's storage formats) ----
 * Each *_pack computes exactly what the QDQ operator above computes (the same scale, the same
 * codes) and stores the codes and the scales instead of the products; the matching unpack_*
 * multiplies them back with the QDQ's own operation, so unpack(pack(x)) == qdq(x) bit for
 * bit (-0.0, subnormal results and the saturated clamp included; NaNs stay NaNs). n must be
 * a multiple of the group size. FP4 codes: element 2c in the low nibble of byte c, 2c+1 in
 * the high nibble; sign in bit 3 (so -0.0 keeps its sign).
 *   fp8_e8m0: codes[n] e4m3, scales[n/32] E8M0 (2^(b-127));
 *   fp4_e8m0: nib[n/2] e2m1, scales[n/32] E8M0;
 *   fp4_e4m3: nib[n/2] e2m1, scales[n/16] e4m3. */
void qdq_fp8_e8m0_pack(const float *x, int64_t n, uint8_t *codes, uint8_t *scales);
void qdq_fp4_e8m0_pack(const float *x, int64_t n, uint8_t *nib, uint8_t *scales);
void qdq_fp4_e4m3_pack(const float *x, int64_t n, uint8_t *nib, uint8_t *scales);
void unpack_fp8_e8m0(float *y, const uint8_t *codes, const uint8_t *scales, int64_t n);
void unpack_fp4_e8m0(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n);
void unpack_fp4_e4m3(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n);
/* Whether packed bytes are something the matching *_pack stores for finite input (no NaN
 * code, scales in the QDQ's range): snapshots are hostile input. */
bool packed_fp8_valid(const uint8_t *codes, const uint8_t *scales, int64_t n);
bool packed_fp4_valid(const uint8_t *scales, int64_t n);
bool packed_fp4_e4m3_valid(const uint8_t *scales, int64_t n);

/* MXFP4 nibble placement (§3.2): checkpoint row bytes (pairs 2c, 2c+1) + E8M0 scales ->
 * GGUF block_mxfp4 blocks (pairs j, j+16). n_in a multiple of 32. dst holds n_in/32*17 bytes. */
void mxfp4_repack_row(const uint8_t *packed, const uint8_t *scales, int64_t n_in, uint8_t *dst);

#endif
