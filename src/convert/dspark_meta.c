/* dspark_meta.c: the `dflash` keys of gguf-layout.md §4.3, exactly those, in the reference
 * converter's order (DeepseekV41DSparkModel.set_gguf_parameters).
 * Must not: decide any value (the caller's dspark_meta holds them all).
 * Invariant: per-stage arrays (swiglu clamps, compress ratios) have n_stages entries. */
#include "convert/dspark_meta.h"
#include "base/util.h"

#include <stdlib.h>

#define KD(s) "dflash." s

int dspark_meta_write(gguf_writer *w, const dspark_meta *m, char *err) {
    const uint32_t n = m->n_stages;
    if (n < 1 || n > 64) return dsf_seterr(err, "dflash draft: %u stages (want 1..64)", n);
    if (gguf_writer_kv_str(w, "general.architecture", "dflash", err) ||
        gguf_writer_kv_str(w, "general.type", "model", err) || gguf_writer_kv_str(w, "general.name", m->name, err) ||
        gguf_writer_kv_u32(w, KD("block_count"), n, err) || gguf_writer_kv_u32(w, KD("context_length"), m->ctx, err) ||
        gguf_writer_kv_u32(w, KD("embedding_length"), m->n_embd, err) ||
        gguf_writer_kv_u32(w, KD("feed_forward_length"), m->ff, err) ||
        gguf_writer_kv_u32(w, KD("attention.head_count"), m->n_head, err) ||
        gguf_writer_kv_u32(w, KD("attention.head_count_kv"), 1, err) ||
        gguf_writer_kv_u32(w, KD("attention.key_length"), m->head_dim, err) ||
        gguf_writer_kv_u32(w, KD("attention.value_length"), m->head_dim, err) ||
        gguf_writer_kv_u32(w, KD("rope.dimension_count"), m->n_rot, err) ||
        gguf_writer_kv_f32(w, KD("rope.freq_base"), m->rope_base, err) ||
        gguf_writer_kv_f32(w, KD("attention.layer_norm_rms_epsilon"), m->eps, err) ||
        gguf_writer_kv_u32(w, KD("attention.q_lora_rank"), m->q_lora, err) ||
        gguf_writer_kv_u32(w, KD("attention.sliding_window"), m->window, err) ||
        gguf_writer_kv_u32(w, KD("expert_count"), m->n_expert, err) ||
        gguf_writer_kv_u32(w, KD("expert_used_count"), m->n_used, err) ||
        gguf_writer_kv_u32(w, KD("expert_feed_forward_length"), m->ff, err) ||
        gguf_writer_kv_u32(w, KD("expert_shared_count"), m->n_shared, err) ||
        gguf_writer_kv_f32(w, KD("expert_weights_scale"), m->route_scale, err) ||
        gguf_writer_kv_bool(w, KD("expert_weights_norm"), m->norm_topk, err) ||
        gguf_writer_kv_u32(w, KD("expert_gating_func"), 4, err))
        return -1;
    float lims[64];
    int32_t zeros[64] = {0};
    for (uint32_t i = 0; i < n; i++) lims[i] = m->swiglu;
    return gguf_writer_kv_arr(w, KD("swiglu_clamp_exp"), GGUF_VT_FLOAT32, lims, n, err) ||
                   gguf_writer_kv_arr(w, KD("swiglu_clamp_shexp"), GGUF_VT_FLOAT32, lims, n, err) ||
                   gguf_writer_kv_u32(w, KD("attention.output_group_count"), m->o_groups, err) ||
                   gguf_writer_kv_u32(w, KD("attention.output_lora_rank"), m->o_lora, err) ||
                   gguf_writer_kv_arr(w, KD("attention.compress_ratios"), GGUF_VT_INT32, zeros, n, err) ||
                   gguf_writer_kv_u32(w, KD("hyper_connection.count"), m->hc, err) ||
                   gguf_writer_kv_u32(w, KD("hyper_connection.sinkhorn_iterations"), m->sinkhorn, err) ||
                   gguf_writer_kv_f32(w, KD("hyper_connection.epsilon"), m->hc_eps, err) ||
                   gguf_writer_kv_bool(w, KD("hyper_connection.single_pass"), true, err) ||
                   gguf_writer_kv_u32(w, KD("block_size"), m->block, err) ||
                   /* Python ints through add_array: INT32, the V4.1 ids as-is */
                   gguf_writer_kv_arr(w, KD("target_layers"), GGUF_VT_INT32, m->targets, m->n_targets, err) ||
                   gguf_writer_kv_bool(w, KD("sample_from_anchor"), true, err) ||
                   gguf_writer_kv_bool(w, KD("has_confidence_head"), true, err)
               ? -1
               : 0;
}
