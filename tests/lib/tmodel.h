/* tmodel.h: the tests' random-weight deepseek41 GGUF files, from a parameter struct
 * (tests/tiny/loader.c, tests/tiny/topology.c, tests/tiny/attn.c), built by synth, the
 * one synthetic-model builder (src/convert/synth.h).
 *
 * tm_params is the tests' vocabulary for synth_params: the builder lays out the tensors
 * of gguf-layout.md §3.2 from it (compressor tensors on listed KV sources with ratio > 0, the gate only
 * for ratio > 1, indexer queries on index sources, Engram tensors on the listed Engram
 * layers), writes the keys of §2.3/§2.4 (no tokenizer: dsf_engine_open does not read it;
 * a random Engram token map instead) and the tensors of §3.2 with their dtypes, and streams
 * everything through the GGUF writer. Before writing, an optional edit hook may drop, add,
 * retype or reshape any key or tensor (the loader-rule tests build one invalid variant per
 * rule that way).
 *
 * Weights are random and seeded (synth.h): each tensor's values depend only on (seed, its
 * name, its dtype and distribution), in element order, so editing one tensor leaves the
 * others unchanged and a tensor given more rows starts with the same values. */
#ifndef DSF_TEST_TMODEL_H
#define DSF_TEST_TMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "convert/synth.h"
#include "io/gguf.h"

#define TM_MAX_LAYERS SYNTH_MAX_LAYERS

typedef struct {
    uint64_t seed;
    uint32_t n_layer, n_embd, n_head, head_dim, n_rot, q_lora, o_groups, o_lora, window;
    uint32_t n_vocab, n_ctx;
    int n_ratio;                           /* compress_ratios entries (>= n_layer); 0: n_layer */
    int32_t ratio[TM_MAX_LAYERS + 4];
    int n_kv_src, n_idx_src;
    uint32_t kv_src[TM_MAX_LAYERS], idx_src[TM_MAX_LAYERS];
    uint32_t idx_heads, idx_dim, idx_topk;
    int32_t cand_src;                      /* -1: no candidate stage (keys not written) */
    uint32_t cand_blocks, cand_block;
    uint32_t hc, sinkhorn;
    float hc_eps;
    uint32_t n_expert, n_used, n_ff, n_shared;
    float route_scale, swiglu;             /* swiglu_clamp_exp/_shexp, one value per layer */
    float eps;                             /* rms_norm_eps */
    int n_engram;                          /* 0: no Engram (no ple.* / engram.* keys) */
    uint32_t engram[TM_MAX_LAYERS];
    uint32_t ngram, engram_heads, engram_dim;
    uint32_t engram_vocab;                 /* bucket counts: the primes >= this, one per column */
    uint32_t engram_pad;                   /* raw pad token id */
    uint32_t n_token_map;                  /* 0: n_vocab; fewer makes the ids past it DEAD */
    uint32_t n_compressed;                 /* compressed ids (token_map values in [0, n)) */
    bool yarn;
    float yarn_factor;
    uint32_t yarn_orig_ctx;
    uint32_t dense_type;                   /* GGML_TYPE_F32 or GGML_TYPE_BF16 (2-D weights, tables) */
    uint32_t expert_type;                  /* GGML_TYPE_MXFP4 or GGML_TYPE_F32 (routed experts) */
} tm_params;

/* A valid base model with every layer role (6 layers, hidden 64, vocab 256): ratios
 * [0,2,2,1,1,1] (+1 trailing entry), KV sources [1,3], index sources [1,3,5], candidate
 * source 3 (consumer 5), Engram before layers 0 and 4 (3-grams, 2 heads x 32), hc 4. */
void tm_params_default(tm_params *p);

/* ---- the model before it is written, and the edit hook ---- */
typedef synth_model tm_model;
typedef void (*tm_edit_fn)(tm_model *m, void *ud);

/* "deepseek41.<suffix>" in one of 8 rotating static buffers. */
const char *tm_k(const char *suffix);

/* The edit operations are synth's (synth.h documents them), under the tests' names. */
static inline int tm_drop_key(tm_model *m, const char *key) { return synth_drop_key(m, key); }
static inline void tm_set_u32(tm_model *m, const char *key, uint32_t v) { synth_set_u32(m, key, v); }
static inline void tm_set_i32(tm_model *m, const char *key, int32_t v) { synth_set_i32(m, key, v); }
static inline void tm_set_f32(tm_model *m, const char *key, float v) { synth_set_f32(m, key, v); }
static inline void tm_set_bool(tm_model *m, const char *key, bool v) { synth_set_bool(m, key, v); }
static inline void tm_set_str(tm_model *m, const char *key, const char *v) { synth_set_str(m, key, v); }
static inline void tm_set_arr(tm_model *m, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    synth_set_arr(m, key, elem_type, data, n);
}
static inline void tm_set_arr_u32(tm_model *m, const char *key, const uint32_t *v, uint64_t n) {
    synth_set_arr(m, key, GGUF_VT_UINT32, v, n);
}
static inline int tm_retype_key(tm_model *m, const char *key, uint32_t new_type) {
    return synth_retype_key(m, key, new_type);
}
static inline int tm_arr_set(tm_model *m, const char *key, uint64_t i, uint64_t v) {
    return synth_arr_set(m, key, i, v);
}
static inline int tm_arr_resize(tm_model *m, const char *key, uint64_t n) { return synth_arr_resize(m, key, n); }
static inline int tm_drop_tensor(tm_model *m, const char *name) { return synth_drop_tensor(m, name); }
static inline void tm_add_tensor(tm_model *m, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne) {
    synth_add_tensor(m, name, type, n_dims, ne);
}
static inline int tm_reshape_tensor(tm_model *m, const char *name, uint32_t n_dims, const int64_t *ne) {
    return synth_reshape_tensor(m, name, n_dims, ne);
}
static inline int tm_retype_tensor(tm_model *m, const char *name, uint32_t type) {
    return synth_retype_tensor(m, name, type);
}

/* Builds the model of p, applies edit(m, ud) if given, and writes it to path.
 * Returns 0, or -1 with err (DSF_ERR_LEN) naming the problem (a parameter set the builder
 * cannot express, or a writer refusal). */
int tm_write(const tm_params *p, const char *path, tm_edit_fn edit, void *ud, char *err);

/* A fresh path "<test_tmpdir()>/<stem>-<counter>.gguf" (static buffer rotated over 4). */
const char *tm_path(const char *stem);

#endif
