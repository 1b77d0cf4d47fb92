/* convert_impl.h: what the converter's two halves share, private to src/convert/convert*.c:
 * the validated config (read by convert.c) and the tensor plan and streaming writers
 * (convert_tensors.c).
 * Must not: be included outside the converter (its interface is convert.h). */
#ifndef DSF_CONVERT_IMPL_H
#define DSF_CONVERT_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "convert/convert.h"
#include "io/gguf.h"
#include "io/safetensors.h"

/* config.json, validated against the loader's rules (§6.1-§6.3), with the derived per-layer
 * sources and the Engram constants. Read-only once load_config() has returned. */
typedef struct {
    json_t *root, *tc, *qc;
    int64_t n_layer, n_embd, n_vocab, n_head, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int64_t n_expert, n_used, n_shared, moe_ff, hc, idx_heads, idx_dim, idx_topk, swa;
    int64_t bo, bi;                /* FP8 weight block */
    int64_t n_ratio;
    int32_t *ratio;                /* compress_ratios, all entries */
    uint32_t *kv_src_l, *idx_src_l;
    int64_t n_kv_src, n_idx_src;
    int32_t *kv_src, *topk_src;    /* per layer, -1 if none */
    int64_t cand;                  /* candidate source layer or -1 */
    /* Engram */
    int64_t n_eng, ngram, eng_heads, eng_dim, eng_vocab, eng_pad, eng_cvocab;
    uint32_t *eng_layers;
    uint64_t *eng_rows;            /* engram_num_embeddings */
    uint64_t *sizes, *offsets, *mults;
    int32_t *tmap;
    int64_t tmap_n;
    /* DSpark draft (--dspark, gguf-layout.md §4): the stages mtp.0..ds_stages-1 */
    bool dspark;
    int64_t ds_stages, ds_block, ds_noise, ds_rank, ds_expert, ds_used;
    uint32_t *ds_targets;
    int64_t ds_n_targets;
} cfg;

/* ---- config helpers (convert.c), also used by convert_mmproj.c ---- */

/* *out = the JSON integer v (an integral real is accepted), which must lie in [lo, hi]; k names
 * it in the error ("config.json: 'k' is missing / not an integer / outside [lo, hi]"). */
int convert_json_int(json_t *v, const char *k, int64_t lo, int64_t hi, int64_t *out, char *err);
/* general.name when --name is not given: the directory's name, or its parent's for .../hf. */
void convert_default_name(const char *hf_dir, char *out, size_t cap);

/* The output tensors: names, GGUF types and shapes, each bound to its checkpoint sources and
 * sorted into the output order (the checkpoint's). */
typedef struct tensor_plan tensor_plan;

/* Builds the plan of every output tensor from the checkpoint, checking every source's name,
 * shape and dtype (and refusing unused checkpoint tensors) before anything is written.
 * f32: --outtype f32; native: --outtype native (the FP8 weights as DSF_TYPE_FP8B32, which
 * needs 32x32 blocks, and the Engram table as DSF_TYPE_FP8R264 rows when its width is a
 * multiple of 256, else BF16). NULL with err on a bad checkpoint. c and ck must outlive the plan. */
tensor_plan *tensor_plan_build(const cfg *c, const st_checkpoint *ck, bool f32, bool native, char *err);

/* The plan's building blocks, for another file's layout (convert_mmproj.c): an empty plan
 * (f32/native as above); one output tensor of `type` (F32 or BF16), n_dims/ne in GGUF order, from
 * rows [row0, row0 + rows) of the float (BF16/F16/F32) checkpoint tensor ckname, whose torch shape
 * must be [d0] (d1 < 0) or [d0, d1] (rows 0: all of them; the element counts must agree); whether
 * checkpoint tensor i feeds the plan; and the output order (checkpoint order, the tensors of one
 * source in the order added), to call once after the last add. */
tensor_plan *tensor_plan_new(const cfg *c, const st_checkpoint *ck, bool f32, bool native);
int tensor_plan_add_rows(tensor_plan *p, const char *ckname, int64_t d0, int64_t d1, int64_t row0, int64_t rows,
                         const char *gname, uint32_t type, uint32_t n_dims, const int64_t *ne, char *err);
bool tensor_plan_uses(const tensor_plan *p, int i);
void tensor_plan_order(tensor_plan *p);

/* Declares every planned tensor to w, in output order; *total receives their data bytes.
 * 0 / -1 with err. */
int tensor_plan_declare(const tensor_plan *p, gguf_writer *w, uint64_t *total, char *err);

/* Streams every tensor's data into w (after gguf_writer_begin) with `threads` workers, then
 * finishes the file. total: the bytes tensor_plan_declare() counted (for the progress bar
 * drawn on stderr when progress is set). 0 / -1 with err naming the tensor. */
int tensor_plan_write(const tensor_plan *p, gguf_writer *w, uint64_t total, int threads, bool progress,
                      char *err);

void tensor_plan_free(tensor_plan *p);

#endif
