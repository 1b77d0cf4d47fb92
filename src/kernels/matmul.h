/* kernels.h: the kernel table. Kernels know arrays, dtypes, block formats and a row range;
 * they do not allocate, do no I/O, start no threads and are deterministic. Every entry has
 * a scalar twin in kernels_ref.c; a NULL entry in a fast table falls back to the twin.
 * The table is picked once (kernels_get): DSF_KERNELS=ref forces the scalar twins. */
#ifndef DSF_KERNELS_H
#define DSF_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* A weight matrix [n_out rows][n_in] in a ggml block type, rows contiguous; or in
 * DSF_TYPE_MXFP4R (below). */
typedef struct {
    uint32_t type;        /* enum ggml_type, or DSF_TYPE_MXFP4R */
    int64_t n_in, n_out;
    uint64_t row_bytes;
    const uint8_t *data;
    const uint8_t *scales; /* DSF_TYPE_MXFP4R only: row r's scale bytes at scales + r * row_bytes / 16 */
} dsf_wmat;

/* An internal weight type, never in a file: MXFP4 repacked at load (engine.c) so that the
 * AVX-512 decode needs no byte gather and sums each block in one dword lane. A row of
 * n_in = 32 nbk elements is ceil(nbk / 16) units of 16 blocks (the last one nu = nbk mod 16
 * blocks when that is not 0); its codes are 16 nbk bytes at data + r * row_bytes (row_bytes =
 * 16 nbk, the ggml row less its scale bytes): unit u starts at byte 256 u and is 4 lines of
 * 4 nu bytes, line h holding dword h (code bytes 4h .. 4h+3, gguf-layout §1.5) of each of
 * the unit's blocks, block 16u + j at 4j; except that two whole units 2p and 2p + 1 (both of
 * 16 blocks) interleave their lines in the pair's 512 bytes: line h of unit 2p + v at byte
 * 512 p + 128 h + 64 v, so that the decode tile, which takes the lines of such a pair in
 * turn, reads each row at rising addresses (kernels_avx512.c). Its scales are nbk bytes, the
 * E8M0 byte of block b at scales[r * nbk + b] (row_bytes / 16 per row). The values are those
 * of the MXFP4 rows it was made from, bit for bit; only the layout differs. */
#define DSF_TYPE_MXFP4R 0x10000u
/* Bytes a product reads per row (codes and scales for DSF_TYPE_MXFP4R). */
static inline uint64_t wmat_row_read_bytes(const dsf_wmat *w) {
    return w->type == DSF_TYPE_MXFP4R ? w->row_bytes + w->row_bytes / 16 : w->row_bytes;
}
static inline bool wmat_is_mxfp4(const dsf_wmat *w) { return w->type == GGML_TYPE_MXFP4 || w->type == DSF_TYPE_MXFP4R; }
/* MXFP4 -> DSF_TYPE_MXFP4R. mxfp4r_row_bytes: a repacked row's code bytes (16 nbk), or 0 if
 * the shape cannot be repacked (n_in not a multiple of 32). mxfp4r_repack converts rows
 * [r0, r1) of src (MXFP4) into codes/scales laid out for the whole matrix. */
uint64_t mxfp4r_row_bytes(int64_t n_in);
void mxfp4r_repack(const dsf_wmat *src, int64_t r0, int64_t r1, uint8_t *codes, uint8_t *scales);
/* The dsf_wmat over the repacked arrays of src (same shape). */
dsf_wmat mxfp4r_view(const dsf_wmat *src, const uint8_t *codes, const uint8_t *scales);
/* Block b of a repacked row of nbk blocks (its codes and scales) back in its ggml form: the scale byte,
 * then the 16 code bytes. */
void mxfp4r_block(const uint8_t *codes, const uint8_t *scales, int64_t nbk, int64_t b, uint8_t blk[17]);
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
    /* DSF_TYPE_MXFP4R with BF16 activations. NULL: the table has no fast kernel for it, and
     * the engine does not repack (the fp32 family always runs it through the twin). */
    matmul_xbf16_fn mxfp4r_xbf16;
    /* kern_act_to_bf16 (same results bit for bit); NULL -> act_to_bf16_ref */
    bool (*act_to_bf16)(const float *x, uint16_t *xb, int64_t n);
    read_probe_fn read_probe;          /* NULL -> ref */
    peak_probe_fn peak_probe;          /* NULL -> ref */
} dsf_kernels;

extern const dsf_kernels kernels_ref;
extern const dsf_kernels kernels_avx2;   /* AVX2 + FMA + F16C (kernels_avx2.c) */
extern const dsf_kernels kernels_avx512; /* AVX-512 F/BW/VL/DQ/BF16/VNNI/VBMI (kernels_avx512.c) */
/* The avx512 table with the BF16-activation products of BF16 weights (mxfp4 = 1: and of MXFP4
 * weights, without a repacked kernel) on AMX tiles (kernels_amx.c): kernels_amx_init fills *k
 * with it (with kernels_ref when the build has no AMX); kernels_amx_built says whether the
 * build has it. kernels_by_name("amx") and ("amx-mxfp4") return them. */
void kernels_amx_init(dsf_kernels *k, int mxfp4);
int kernels_amx_built(void);
/* The table picked once for this process: the best one the CPU supports (amx, avx512, avx2,
 * ref), or the one named by DSF_KERNELS=ref|avx2|avx512|amx|amx-mxfp4 (an unsupported or
 * unknown name warns and falls back). */
const dsf_kernels *kernels_get(void);
/* The table of that name if this CPU can run it, else NULL (tests and benchmarks). */
const dsf_kernels *kernels_by_name(const char *name);
/* Matmul through the table with fallback to the generic dequantizing twin. */
void kern_matmul(const dsf_kernels *k, const dsf_wmat *w, const float *x, int64_t T, float *y,
                 int64_t ldy, int64_t r0, int64_t r1);

/* BF16-activation matmul through the table, with fallback to the scalar twin. */
void kern_matmul_xbf16(const dsf_kernels *k, const dsf_wmat *w, const uint16_t *x, int64_t T, float *y,
                       int64_t ldy, int64_t r0, int64_t r1);
/* Rounds n fp32 activations to BF16 (round to nearest even). Returns true iff every value
 * was already exact in BF16 (then kern_matmul_xbf16 computes the same exact products as
 * kern_matmul; only the summation order, and the flushing of subnormals, differ). */
bool kern_act_to_bf16(const float *x, uint16_t *xb, int64_t n);
/* Its scalar twin (the rounding rule of quant.c's f32_to_bf16). */
bool act_to_bf16_ref(const float *x, uint16_t *xb, int64_t n);

/* Probes through the table with fallback to the scalar versions. */
double kern_read_probe(const dsf_kernels *k, const uint8_t *p, uint64_t n);
uint64_t kern_peak_probe(const dsf_kernels *k, int64_t iters, int bf16, float *sink);

/* Scalar twin for any type dequant_row() supports. */
void matmul_any_ref(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,
                    int64_t r0, int64_t r1);
/* Scalar twin of matmul_xbf16 (exact products, double accumulation, no flushing). */
void matmul_xbf16_any_ref(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,
                          int64_t r0, int64_t r1);

#endif
