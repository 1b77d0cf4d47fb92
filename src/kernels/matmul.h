/* matmul.h: the matmul kernel table: the weight-matrix view (dsf_wmat), the product and probe
 * signatures, the tables of each ISA and the scalar twins.
 *
 * Owns: types and the tables' declarations. Kernels know arrays, dtypes, block formats and a
 * row range; they do not allocate, do no I/O, start no threads and are deterministic.
 * Must not: choose a table or dispatch (kernels/select.h does both); include anything outside
 * src/kernels and src/base.
 * Invariant: every entry has a scalar twin in matmul_ref.c; a NULL entry in a fast table falls
 * back to the twin (select.c's kern_* calls). */
#ifndef DSF_MATMUL_H
#define DSF_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* A weight matrix [n_out rows][n_in] in a ggml block type, rows contiguous; or in
 * DSF_TYPE_MXFP4R (kernels/mxfp4r.h); or in DSF_TYPE_FP8B32 (dtype.h: row r's e4m3 bytes at
 * data + r * row_bytes, row_bytes = n_in; the 32x32 E8M0 grid at scales, row block r/32's
 * ceil(n_in/32) bytes at scales + (r/32) * ceil(n_in/32)). */
typedef struct {
    uint32_t type;        /* enum ggml_type, DSF_TYPE_MXFP4R or DSF_TYPE_FP8B32 */
    int64_t n_in, n_out;
    uint64_t row_bytes;
    const uint8_t *data;
    const uint8_t *scales; /* DSF_TYPE_MXFP4R: row r's scale bytes at scales + r * row_bytes / 16;
                            * DSF_TYPE_FP8B32: the scale grid (above) */
} dsf_wmat;

/* Row r of any supported weight type as fp32 (n_in values). */
void wmat_dequant_row(const dsf_wmat *w, int64_t r, float *out);

/* y[t*ldy + r] = sum_i W[r][i] * x[t*n_in + i]  for t in [0,T), r in [r0, r1).
 * x is fp32 (activation prep, e.g. FP8 QDQ, has already been applied); y is fp32.
 * Accuracy contract: within fp32 summation-order noise of the exact sum.
 * Batch invariance (fast tables): y[t][r] is bit-identical whatever T, the token's place in
 * the batch and the row range, so decode and (chunked) prefill agree exactly as long as the
 * same function (same family: matmul or matmul_xbf16, same table) is used for both. */
typedef void (*matmul_fn)(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,
                          int64_t r0, int64_t r1);

/* The same product with BF16 activations: x is [T][n_in] bf16 bits. The products of BF16 (or
 * MXFP4) weights with BF16 activations are exact in fp32, so the result equals matmul on the
 * widened activations up to fp32 summation order -- except that the BF16 dot instructions
 * flush subnormals (inputs and partial sums below 2^-126) to zero. Meant for reference mode,
 * where activations entering FP8/FP4 projections are FP8-QDQ'd and thus exact in BF16 (see
 * kern_act_to_bf16); it lets prefill run at the BF16 dot peak. */
typedef void (*matmul_xbf16_fn)(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,
                                int64_t r0, int64_t r1);
/* Q8_K activations: the opt-in mode in which the activations entering a product with a K or IQ
 * weight type are quantized as ggml quantizes them (its vec_dot_type for those types): per 256
 * values an fp32 scale d, 256 int8 codes q (value = d * q) and the 16 sums of 16 codes (ggml's
 * block_q8_K, 292 bytes; quant.h quantize_row_q8k writes it bit for bit as ggml does). It changes
 * the results (up to ~2e-2 of sum|w x| on rows with outlier channels: fixtures README), so it is
 * never the default. */
typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} dsf_q8k;
_Static_assert(sizeof(dsf_q8k) == 292, "ggml's block_q8_K layout");

/* y[t*ldy + r] = sum_i W[r][i] * (d * q)[t][i] for x = T rows of n_in/256 Q8_K blocks, r in
 * [r0, r1). Accuracy contract: within fp32 rounding of the exact sum of the dequantized weights
 * times the dequantized activations, as ggml's vec_dot (the fixtures README bound: 2e-6 of
 * sum|w a|). Batch invariance as matmul_fn. n_in a multiple of 256. */
typedef void (*matmul_q8k_fn)(const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy,
                              int64_t r0, int64_t r1);

/* Benchmark probes (never on a model path; `dsflash bench --kernels` compares the kernels
 * with them). read_probe reads n bytes (n a multiple of 256, p 64-byte aligned) with the
 * widest loads and returns a checksum so that the reads cannot be elided. peak_probe runs
 * `iters` rounds of independent dot-product instructions on registers (BF16 pairs when bf16
 * and the table has them, else fp32 FMA) and returns the FLOPs done (0 if unsupported);
 * *sink receives a value that depends on every instruction. */
typedef double (*read_probe_fn)(const uint8_t *p, uint64_t n);
typedef uint64_t (*peak_probe_fn)(int64_t iters, int bf16, float *sink);

typedef struct {
    const char *name;                 /* "ref", "avx2", "avx512" */
    matmul_fn matmul[GGML_TYPE_COUNT]; /* by weight type; NULL -> ref */
    matmul_xbf16_fn matmul_xbf16[GGML_TYPE_COUNT]; /* BF16 activations; NULL -> ref */
    matmul_q8k_fn matmul_q8k[GGML_TYPE_COUNT];     /* Q8_K activations; NULL -> matmul_q8k_any_ref */
    /* DSF_TYPE_MXFP4R with BF16 activations. NULL: the table has no fast kernel for it, and
     * the engine does not repack (the fp32 family always runs it through the twin). */
    matmul_xbf16_fn mxfp4r_xbf16;
    /* DSF_TYPE_FP8B32 (kernels/fp8.h), fp32 and BF16 activations: bit for bit the table's BF16
     * kernel of the same family on the same values. NULL -> the twin (matmul_any_ref,
     * matmul_xbf16_any_ref, which read FP8_B32 through wmat_dequant_row). */
    matmul_fn fp8b32;
    matmul_xbf16_fn fp8b32_xbf16;
    /* kern_act_to_bf16 (same results bit for bit); NULL -> act_to_bf16_ref */
    bool (*act_to_bf16)(const float *x, uint16_t *xb, int64_t n);
    read_probe_fn read_probe;          /* NULL -> ref */
    peak_probe_fn peak_probe;          /* NULL -> ref */
} dsf_kernels;

extern const dsf_kernels kernels_ref;    /* the scalar twins (matmul_ref.c) */
extern const dsf_kernels kernels_avx2;   /* AVX2 + FMA + F16C (matmul_avx2.c) */
extern const dsf_kernels kernels_avx512; /* AVX-512 F/BW/VL/DQ/BF16/VNNI/VBMI (matmul_avx512.c, mxfp4_avx512.c) */
/* The avx512 table with the BF16-activation products of BF16 weights (mxfp4 = 1: and of MXFP4
 * weights, without a repacked kernel) on AMX tiles (matmul_amx.c): kernels_amx_init fills *k
 * with it (with kernels_ref when the build has no AMX); kernels_amx_built says whether the
 * build has it. kernels_by_name("amx") and ("amx-mxfp4") return them (select.h). */
void kernels_amx_init(dsf_kernels *k, int mxfp4);
int kernels_amx_built(void);
/* The same tables on emulated tiles (matmul_amx.c built with DSF_AMX_EMU, amx_emu.h), named
 * "amx-emu" and "amx-mxfp4-emu": for the tests, on CPUs with the avx512 table's features. */
void kernels_amxemu_init(dsf_kernels *k, int mxfp4);
int kernels_amxemu_built(void);

/* Scalar twin for any type dequant_row() supports. */
void matmul_any_ref(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,
                    int64_t r0, int64_t r1);
/* Scalar twin of matmul_xbf16 (exact products, double accumulation, no flushing). */
void matmul_xbf16_any_ref(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,
                          int64_t r0, int64_t r1);
/* Scalar twin of matmul_q8k for any type dequant_row() supports with 256-value blocks or
 * blocks dividing 256 (dequantized weights times dequantized activations, double accumulation). */
void matmul_q8k_any_ref(const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy,
                        int64_t r0, int64_t r1);
/* Scalar twin of kern_act_to_bf16 (the rounding rule of quant.c's f32_to_bf16). */
bool act_to_bf16_ref(const float *x, uint16_t *xb, int64_t n);

#endif
