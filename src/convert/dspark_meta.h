/* dspark_meta.h: the metadata keys of a DSpark draft GGUF (`dflash`, gguf-layout.md §4.3), written
 * from plain values so that the converter (--dspark, from config.json) and `synth --dspark`
 * (from a preset) write the same keys in the same order.
 * Must not: read a checkpoint or a preset, or write tensors, the file type or the tokenizer keys
 * (each caller appends general.file_type, general.quantization_version, its tokenizer keys and
 * tokenizer.ggml.mask_token_id after these). */
#ifndef DSF_DSPARK_META_H
#define DSF_DSPARK_META_H

#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct {
    const char *name;                /* general.name */
    uint32_t n_stages, ctx, n_embd, ff, n_head, head_dim, n_rot, q_lora, window;
    uint32_t n_expert, n_used, n_shared, o_groups, o_lora, hc, sinkhorn, block;
    float rope_base, eps, route_scale, swiglu, hc_eps;
    bool norm_topk;                  /* expert_weights_norm */
    const uint32_t *targets;         /* target_layers (the main model's layer ids, as-is) */
    uint32_t n_targets;
} dspark_meta;

/* general.architecture/type/name and every dflash.* key, in the reference converter's order;
 * the caller then writes general.file_type (38 unless retyped) and general.quantization_version
 * (2). 0 / -1 with err. */
int dspark_meta_write(gguf_writer *w, const dspark_meta *m, char *err);

#endif
