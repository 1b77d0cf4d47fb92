/* model.h: the validated shape of a deepseek41 model, its bound weights, and the engine.
 *
 * Shapes come from the GGUF, are validated once (shape.c and roles.c: gguf-layout.md §6
 * rules S1-S19, B1-B9), then live read-only in dsf_shape. Weights (weights.c) are views into
 * the mapping, or into the copies residency.c may make at open; the Engram table is only
 * touched row by row.
 * Must not: hold session state (session.h) or the forward pass's context (forward.h). */
#ifndef DSF_MODEL_H
#define DSF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsflash.h"
#include "io/gguf.h"
#include "kernels/matmul.h"
#include "base/threads.h"

#define DSF_MAX_LAYERS 512
#define DSF_ENGRAM_DEAD (-1)

typedef struct {
    /* dimensions */
    int64_t n_vocab, n_embd, n_layer, n_head, head_dim, n_rot, q_lora, o_groups, o_lora;
    int64_t n_ctx_train, window;
    float eps;
    /* RoPE: main table (ratio-0 layers) and compress table (ratio > 0 layers, YaRN) */
    float rope_base, compress_rope_base;
    bool yarn;
    float yarn_factor, yarn_beta_fast, yarn_beta_slow;
    int64_t yarn_orig_ctx;
    /* MoE */
    int64_t n_expert, n_expert_used, n_ff_exp, n_expert_shared;
    float expert_weights_scale;
    bool expert_weights_norm;
    float *swiglu_exp, *swiglu_shexp; /* [n_layer]; <= 0 means no clamp */
    /* indexer */
    int64_t idx_heads, idx_dim, idx_topk;
    /* hyper-connections */
    int64_t hc, hc_iters;
    float hc_eps;
    /* layer roles (gguf-layout §2.5) */
    int32_t *ratio;    /* [n_layer] */
    int32_t *kv_src;   /* [n_layer] -1 for ratio-0 layers */
    int32_t *topk_src; /* [n_layer] */
    int32_t cand_src;  /* -1: no candidate stage */
    int64_t cand_topk_blocks, cand_block;
    /* Engram */
    int64_t n_engram;        /* modules (0: off) */
    int32_t *engram_layer;   /* [n_engram] block before which module e applies */
    int32_t *engram_of;      /* [n_layer] module index or -1 */
    int64_t ngram, heads_per_ngram, ple_dim, ple_cols; /* cols = (ngram-1)*heads */
    uint64_t *ple_mult;      /* [n_engram*ngram] */
    uint64_t *ple_offset;    /* [n_engram*ple_cols] absolute rows */
    uint64_t *ple_size;      /* [n_engram*ple_cols] */
    int32_t *token_map;      /* [n_token_map] raw id -> compressed id */
    int64_t n_token_map;
    uint32_t engram_pad_raw;
    int64_t engram_pad;      /* token_map[pad_raw] */
    int64_t ple_rows_needed; /* max(offset + size) */
    /* A DSpark draft (`dflash`, gguf-layout.md §4; dspark_load.c): the layers are its stages,
     * the file has no token_embd/output (shared with the main model) but the draft's own
     * tensors (dsf_weights.fc ...); n_feat_in = target layers x n_embd, markov_rank = R. */
    bool dspark;
    int64_t n_feat_in, markov_rank;
} dsf_shape;

/* A small vector in fp32 (norm weights, sinks, biases, hc base/scale...): a view into the
 * mapping when the file stores it as F32 (as the converter does), so loading reads no tensor
 * data; converted once at load otherwise. */
typedef const float *fvec;

typedef struct {
    fvec attn_norm, attn_sinks, q_norm, kv_norm;
    dsf_wmat wq_a, wq_b, wkv, wo_a, wo_b;
    dsf_wmat hc_attn_fn, hc_ffn_fn;
    fvec hc_attn_base, hc_attn_scale, hc_ffn_base, hc_ffn_scale;
    /* compressor + index keys (KV sources) */
    dsf_wmat comp_wkv, comp_wgate; /* wgate only for ratio > 1 */
    fvec comp_norm;
    dsf_wmat idx_k;
    fvec idx_k_norm;
    /* indexer query (index sources) */
    dsf_wmat idx_q_b, idx_proj;
    /* Engram */
    dsf_wmat engram_kv;
    fvec engram_gate; /* [hc][n_embd] */
    /* MoE */
    dsf_wmat router;          /* F32 in converter output */
    fvec exp_bias, exp_bias_vl;
    fvec ffn_norm;
    dsf_wmat gate_exps, up_exps, down_exps; /* per expert: rows n_out, data + e*n_out*row_bytes */
    dsf_wmat gate_sh, up_sh, down_sh;
} dsf_layer;

typedef struct {
    dsf_wmat tok_embd, output;
    void **owned; /* small vectors converted to fp32 at load (non-F32 files only) */
    int64_t n_owned;
    fvec output_norm;
    const gguf_tensor *ple; /* per_layer_token_embd: rows of ple_dim, lazily read */
    dsf_layer *layers;
    /* DSpark draft only (shape.dspark): main_proj, its norm, the Markov tables, the confidence */
    dsf_wmat fc, markov_w1, markov_w2;
    fvec enc_norm, conf_proj;
    bool vision; /* every layer carries exp_bias_vl (image spans can be routed; vision.md §6) */
} dsf_weights;

/* An observer of the forward pass's products (dsflash imatrix; engine_set_mm_observer): called
 * once per product, on the thread that issues it and before the product runs, with the weight
 * view w (w->data points into the engine's copy of the weight: the file mapping, a repacked or
 * resident copy, a widened fp32 copy; an expert or a group of a stacked tensor is a slice of
 * it) and the T activation rows [T][w->n_in] exactly as the product receives them: fp32 in x,
 * or BF16 bits in xb (the other is NULL). In reference numerics these are the inputs after
 * the activation prep (FP8 QDQ of FP8/FP4 projections); in plain numerics the raw inputs. */
typedef void (*dsf_mm_observer)(void *user, const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T);

struct dsf_scratch_s; /* session.h */
struct dsf_kvstate_s;

/* RoPE cos/sin are computed per position on the fly from these frequencies. */
typedef struct {
    float *freq_main;     /* [n_rot/2] */
    float *freq_compress; /* [n_rot/2] */
} dsf_rope;

struct dsf_engine {
    gguf_file *gguf;
    dsf_shape shape;
    dsf_weights w;
    dsf_rope rope;
    dsf_numerics numerics;
    int64_t chunk; /* tokens per prefill forward of its sessions (dsf_engine_params.ubatch) */
    bool act_q8k; /* dsf_engine_params.act_q8k: Q8_K activations for the K / IQ weights (mm.c) */
    const dsf_kernels *kern;
    dsf_pool *pool;
    uint64_t model_id; /* hash of the header (keys + tensor table), recorded in snapshots */
    uint64_t data_id;  /* hash of sampled tensor bytes; computed on the first snapshot (0 = not yet) */
    char *name;
    void *repack_map; /* the repacked routed experts (DSF_TYPE_MXFP4R, residency.c), or NULL */
    size_t repack_size;
    size_t repack_touched; /* of it, the rows this rank repacked (all of them single-process) */
    void *dense_map; /* the dense weights copied at open (residency.c), or NULL */
    size_t dense_size;
    uint64_t copied_orig; /* file bytes the two copies replace */
    dsf_mm_observer mm_obs; /* NULL (the default): no observer, one branch per product */
    void *mm_obs_user;
    struct dist_plan *dist; /* spread over the ranks of an MPI job (model/dist.h), or NULL */
    /* forward_tokens of a spread engine (distpipe.c), called by forward.c (not linked to it:
     * distpipe.c runs forward.c's steps), or NULL */
    int (*dist_forward)(const struct dsf_engine *e, struct dsf_scratch_s *sc, struct dsf_kvstate_s **tkv,
                        const int32_t *tok, int64_t T, float *logits, int64_t logit_row0, char *err);
    struct engram_io *eio; /* the Engram table's readers and hot-row cache (engram_io.h), or NULL
                            * without Engram */
};

/* engine.c: installs (fn != NULL) or removes the products' observer. Not thread-safe: set it
 * while no forward runs; the observer then sees the products of every session of e. */
void engine_set_mm_observer(dsf_engine *e, dsf_mm_observer fn, void *user);

/* shape.c */
int shape_load(dsf_shape *s, const gguf_file *f, char *err);
void shape_free(dsf_shape *s);
/* weights.c: binds a deepseek41 file's tensors, or a dflash draft's when s->dspark. */
int weights_bind(dsf_weights *w, const dsf_shape *s, const gguf_file *f, char *err);
void weights_free(dsf_weights *w, const dsf_shape *s);
/* An expert's matrix inside a stacked expert tensor. */
dsf_wmat wmat_expert(const dsf_wmat *stack, int64_t e);
/* Rows [r0, r0 + n_out) of a matrix as a matrix (wo_a's groups); for DSF_TYPE_FP8B32, r0 must be
 * a multiple of 32 (weights_bind checks it for wo_a): the view's scale grid starts at r0's block. */
dsf_wmat wmat_rows(const dsf_wmat *m, int64_t r0, int64_t n_out);
/* dsflash's native files (docs/FORMAT.md): *version receives the file's dsflash.native_version,
 * 0 when it has none. -1 with err naming the key or the tensor when the key is not a u32, names
 * another version than DSF_NATIVE_VERSION, or is missing while a tensor has a native type. */
int weights_native_version(const gguf_file *f, uint32_t *version, char *err);

/* The classes of deepseek41 tensors a quantization recipe treats alike (dsflash inspect's
 * summary), by name: the routed and shared experts, the other matrices of the layers (attention,
 * compressor, indexer, engram_kv), the hc mix matrices, the router, the head, the embeddings
 * and the vectors the engine uses in fp32 (norms, sinks, biases, hc base/scale, engram_gate). */
typedef enum {
    TC_ROUTED, TC_SHARED, TC_DENSE, TC_HC, TC_ROUTER, TC_HEAD, TC_EMBED, TC_ENGRAM, TC_SMALL, TC_COUNT
} tensor_class;
extern const char *const tensor_class_names[TC_COUNT];
tensor_class tensor_class_of(const char *name);

#endif
