/* dtype.h: the ggml tensor type ids (gguf-layout.md §1.4), the element and block formats
 * the kernels know.
 *
 * Owns: the enum only; the per-type facts (block size, bytes, name, codecs) are quant.h's.
 * Must not: include anything outside src/kernels and src/base (io/gguf.h includes this, the
 * kernels never include io/).
 * Invariant: the ids are the file's, so they never change; GGML_TYPE_COUNT bounds every
 * table indexed by type. */
#ifndef DSF_DTYPE_H
#define DSF_DTYPE_H

/* ggml tensor types (gguf-layout.md §1.4). Ids are the file's. */
enum ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16, GGML_TYPE_IQ2_XS = 17, GGML_TYPE_IQ3_XXS = 18, GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20, GGML_TYPE_IQ3_S = 21, GGML_TYPE_IQ2_S = 22, GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24, GGML_TYPE_I16 = 25, GGML_TYPE_I32 = 26, GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28, GGML_TYPE_IQ1_M = 29, GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34, GGML_TYPE_TQ2_0 = 35, GGML_TYPE_MXFP4 = 39, GGML_TYPE_NVFP4 = 40,
    GGML_TYPE_Q1_0 = 41, GGML_TYPE_Q2_0 = 42, GGML_TYPE_COUNT = 43
};

/* dsflash's native types (docs/FORMAT.md), outside ggml's id range (a u32 in the file): a file
 * that uses them carries the key dsflash.native_version, and llama.cpp refuses it.
 * DSF_TYPE_FP8B32: a dense FP8 matrix as the checkpoint stores it: rows*ne0 e4m3 bytes, then the
 *   32x32 E8M0 scale grid, ceil(rows/32) * ceil(ne0/32) bytes (quant.h dsf_type_extra_bytes).
 * DSF_TYPE_FP8R264: a block of 256 values in 264 bytes: 256 e4m3 bytes, then 8 E8M0 scales
 *   (scale j covers values 32j..32j+31): the Engram table's row (architecture.md §3.2). */
#define DSF_TYPE_FP8B32 1024u
#define DSF_TYPE_FP8R264 1025u
#define DSF_NATIVE_VERSION 1u
#define DSF_NATIVE_KEY "dsflash.native_version" /* u32: DSF_NATIVE_VERSION */

#endif
