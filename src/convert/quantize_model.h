/* quantize_model.h: `dsflash quantize`, the streaming GGUF -> quantized GGUF rewriter
 * (issue 33): whole-file recipes with llama.cpp's names (quantize_recipe.c) and the
 * streamed requantization of every weight, row chunk by row chunk (quantize_model.c); and the
 * lossless `native` target (issue 36, quantize_native.c: the checkpoint's FP8 bytes back).
 *
 * The rules every recipe follows (quantize_tensor_class, quantize_plan_type):
 * - never quantized, copied as they are (F32 in files from `dsflash convert`): 1-D tensors,
 *   the norms, the router (ffn_gate_inp), engram_gate, attn_sinks, exp_probs_b, the hc_*
 *   fn/base/scale tensors, and integer tensors;
 * - routed experts already in MXFP4 stay MXFP4 when the recipe's expert type has at least
 *   MXFP4's 4.25 bits per weight (requantizing them could only lose precision and grow);
 * - --tensor-type PATTERN=TYPE overrides the recipe for the quantized tensors whose name
 *   the PCRE2 regex matches (searched, not anchored; the first matching pattern wins);
 * - a row (ne0) that is not a multiple of the type's block size falls back
 *   (quantize_fallback_type): Q2_K, Q3_K and the IQ1/IQ2/IQ3 types -> Q4_0; Q4_K, IQ4_XS ->
 *   Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0; anything that still does not fit -> BF16;
 * - a tensor already in its target type is copied byte for byte. */
#ifndef DSF_QUANTIZE_MODEL_H
#define DSF_QUANTIZE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

/* The tensor classes a recipe gives a type to, and QC_KEEP (never quantized). */
enum { QC_EXPERTS, QC_DENSE, QC_SHEXP, QC_ENGRAM, QC_EMBD, QC_HEAD, QC_COUNT, QC_KEEP = QC_COUNT };

typedef struct {
    const char *name;          /* llama.cpp's name, e.g. "Q4_K_M" */
    uint32_t ftype;            /* llama.cpp's general.file_type number */
    uint32_t type[QC_COUNT];   /* enum ggml_type per class */
} quantize_recipe;

int quantize_recipe_count(void);
const quantize_recipe *quantize_recipe_at(int i);
/* The recipe of that name (case-insensitive), or NULL. */
const quantize_recipe *quantize_recipe_find(const char *name);
/* "routed experts", "dense", ... (for --help and logs). */
const char *quantize_class_name(int qc);
/* A ggml type id from its name (case-insensitive, "q4_k" or "Q4_K"); -1 if unknown. */
int quantize_type_from_name(const char *name);

/* The class of a tensor by its deepseek41 name, its dims and its type (QC_KEEP for the
 * never-quantized ones listed above). */
int quantize_tensor_class(const char *name, uint32_t n_dims, uint32_t src_type);
/* The type a row of ne0 values gets when `type` does not fit it (ne0 % block != 0); type
 * itself when it fits. */
uint32_t quantize_fallback_type(uint32_t type, int64_t ne0);
/* The type a recipe gives a tensor (name, dims, its type in the source, its ne0), without
 * --tensor-type: src_type for QC_KEEP; else the class's type, then the block-size fallback,
 * except that routed experts already in MXFP4 stay MXFP4 when that type has at least
 * MXFP4's bits per weight. Shared by `dsflash quantize` and `dsflash synth --recipe`. */
uint32_t quantize_recipe_type(const quantize_recipe *r, const char *name, uint32_t n_dims, uint32_t src_type,
                              int64_t ne0);
/* Bits per weight of a ggml type. */
double quantize_bpw(uint32_t type);

/* ---- `quantize IN OUT native` (quantize_native.c; docs/FORMAT.md) ---- */

/* The native type of a tensor of a seed-layout file: DSF_TYPE_FP8B32 for the 2-D weights (of
 * any type dequant_row decodes: BF16 from the converter) that the checkpoint stores as FP8 with a 32x32 grid (attn_q_a, attn_q_b, attn_kv,
 * attn_output_a, attn_output_b, indexer.attn_q_b, engram_kv, the shared experts; the draft's
 * fc), DSF_TYPE_FP8R264 for the Engram table when ne0 is a multiple of 256; else src_type
 * (copied). */
uint32_t quantize_native_type(const char *name, uint32_t n_dims, uint32_t src_type, int64_t ne0);
/* Rows [n <= 32][ne0] of x (one 32-row stripe) -> their e4m3 bytes q [n][ne0] and the stripe's
 * row of the FP8_B32 grid, grid[ceil(ne0/32)]: per 32x32 block the smallest S with
 * amax / 2^(S-127) <= 448. Returns -1, or the index r*ne0+c of the first value that is not
 * e4m3 x 2^(S-127) exactly (q and grid then partly written). */
int64_t quantize_native_stripe(const float *x, int64_t n, int64_t ne0, uint8_t *q, uint8_t *grid);
/* One row of ne0 values (a multiple of 256) -> ne0/256 FP8_R264 blocks of 264 bytes, per 32
 * values the same rule. -1, or the index of the first value that is not exact. */
int64_t quantize_native_r264(const float *x, int64_t ne0, uint8_t *out);

typedef struct {
    const char *pattern;       /* PCRE2 regex on the tensor name */
    uint32_t type;             /* enum ggml_type */
} quantize_override;

typedef struct {
    const char *recipe;              /* a quantize_recipe name */
    const quantize_override *tt;     /* --tensor-type, in the order given */
    int n_tt;
    const char *imatrix;             /* --imatrix FILE or NULL */
    int threads;                     /* >= 1 */
    bool progress;                   /* progress bar on stderr */
} quantize_opts;

/* Rewrites the GGUF at in_path into out_path (the caller handles OUT.tmp and the rename):
 * every KV copied (general.file_type set to the recipe's ftype, general.quantization_version
 * to 2), tensors in the input's order, each weight quantized row by row with quantize_row
 * (kernels/quantize.h) in bounded chunks on `threads` workers; the bytes do not depend on
 * the thread count. Everything is checked before out_path is created: the recipe, the
 * patterns, the decodability of every source and the writability of every target type, the
 * imatrix (required for quantize_requires_imatrix types; every entry's shape). Returns 0, or
 * -1 with a message naming the problem (and the tensor, its row, for a weight that cannot be
 * quantized). */
int quantize_model(const char *in_path, const char *out_path, const quantize_opts *o, char *err);

#endif
