/* synth.h: the one builder of random-weight deepseek41 GGUF files, in the exact layout of
 * gguf-layout.md §2-§3. It serves `dsflash synth` (five presets) and the tests' models
 * (tests/tmodel.h), which describe any topology with the same parameters.
 *
 * Presets:
 *   "tiny":  the topology of testdata/tiny41 (hidden 128, 8 layers, every layer role) with a
 *            usable byte-level BPE tokenizer (vocab 1024) for demos and server tests;
 *   "tiny-roles": tiny's widths on 12 layers whose roles are shaped like the release's (two
 *            ratio-2 groups, a ratio-1 candidate-source group with re-indexing layers, Engram
 *            before 1 and 5), the MPI tests' second topology;
 *   "bench": every real per-layer shape and dtype of V4.1-Flash, 8 layers with every layer
 *            role, 32 routed experts, vocab 129280 (about 11 GB on disk) for benchmarks;
 *   "bench-moe": the real widths and 384 experts (top 6) on 1 layer with every layer role
 *            (about 10.6 GB), for multi-token (speculative verification) benchmarks;
 *   "real":  the released V4.1-Flash as architecture.md §1.1-1.3 gives it (40 layers, 43
 *            compress_ratios, 384 experts, the 768,022,850-row Engram table; about 699 GB),
 *            meant to be written header-only (synth_write_opts) for memory plans.
 *
 * Types: synth_write_opts.type retypes every quantizable matrix (the 2-D BF16 ones, Engram
 * table and embeddings included) and .expert_type the routed experts; what llama-quantize keeps
 * F32 stays F32, and a tensor whose ne0 is not a whole number of the type's blocks falls back,
 * both by `dsflash quantize`'s rules (convert/quantize_model.h: quantize_tensor_class,
 * quantize_fallback_type); the fallbacks are reported. synth_write_opts.recipe instead gives
 * every tensor the type a `dsflash quantize` recipe would (quantize_recipe_type). Quantized
 * blocks are random codes with finite, small scales.
 *
 * FP8-exact weights (issue 36; off by default, so that existing models keep their values): the
 * BF16/F32 tensors that the checkpoint stores as FP8 (the dense FP8 weights and a 256-wide
 * Engram table, quantize_native_type) hold e4m3 x 2^(S-127) values, with each 32x32 block's
 * (32-value group's) smallest S, so that `dsflash quantize M OUT native` turns such a model into
 * a native file of the same values, and synth_write_opts.native writes that file directly,
 * byte for byte the same.
 *
 * A model is built in two steps: synth_model_new() lays out the keys (§2.3/§2.4, and the
 * tokenizer's) and the tensor list (§3.2, in the converter's order §3.4) of a parameter set;
 * the edit functions below may then drop, add, retype or reshape any key or tensor (the
 * loader-rule tests build one invalid variant per rule that way); synth_model_write()
 * generates the weights while streaming them through the GGUF writer, so tensor data is
 * never held in memory.
 *
 * Weights are random, never constant, scaled so that activations stay O(1): dense matrices
 * uniform with std 1/sqrt(fan_in), norms 1 + 0.1 U(-1,1), embeddings std 1, MXFP4 blocks with
 * random codes. Each tensor's values are a pure function of (seed, its name, its type and
 * distribution), generated in element order: editing one tensor leaves the others unchanged,
 * and a tensor given more rows starts with the same values. */
#ifndef DSF_SYNTH_H
#define DSF_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SYNTH_MAX_LAYERS 48

/* Everything a model is built from. Layer lists are layer ids, ascending. */
typedef struct {
    const char *name;                      /* general.name */
    uint32_t n_embd, n_layer, n_head, head_dim, n_rot, q_lora, o_groups, o_lora, window;
    uint32_t n_expert, n_used, ff, n_shared;
    uint32_t idx_heads, idx_dim, idx_topk;
    int32_t cand_layer;                    /* -1: no candidate stage (its keys are not written) */
    uint32_t cand_blocks, cand_bsize;
    uint32_t hc, sinkhorn;
    float hc_eps;
    uint32_t ngram, heads_per_ngram, engram_dim;
    uint32_t engram_vocab;                 /* bucket counts: the primes >= this, one per column */
    uint32_t engram_pad;                   /* engram.pad_token_id */
    uint32_t vocab, ctx;
    bool yarn;                             /* false: no rope.scaling.* keys (plain RoPE) */
    float yarn_factor;
    uint32_t orig_ctx;                     /* rope.scaling.original_context_length */
    float eps;                             /* rms_norm_eps */
    float route_scale;                     /* expert_weights_scale */
    float swiglu;                          /* swiglu_clamp_exp/_shexp, one value per layer */
    int n_ratio;                           /* compress_ratios entries (>= n_layer); 0: n_layer */
    int32_t ratios[SYNTH_MAX_LAYERS + 4];
    int n_kvsrc, n_idxsrc, n_engram;       /* n_engram 0: no Engram (no ple.* / engram.* keys) */
    uint32_t kvsrc[SYNTH_MAX_LAYERS], idxsrc[SYNTH_MAX_LAYERS], engram[SYNTH_MAX_LAYERS];
    uint32_t dense_type;                   /* GGML_TYPE_BF16 or _F32: 2-D weights and tables */
    uint32_t expert_type;                  /* GGML_TYPE_MXFP4 or _F32: routed experts */
    bool vl_bias;                          /* the optional blk.*.exp_probs_b_vl.bias on every layer */
    /* true: the built-in byte-level BPE tokenizer (tokenizer.ggml.*), and the Engram token map
     * derived from it; false: no tokenizer keys and a random token map of n_token_map entries
     * (0: vocab; fewer makes the ids past it DEAD) with values in [0, n_compressed). */
    bool tokenizer;
    uint32_t n_token_map, n_compressed;
} synth_params;

/* Writes the preset to path with weights seeded by seed. Returns 0, or -1 with err
 * (DSF_ERR_LEN) naming the problem. The output is a pure function of (preset, seed). */
int synth_write(const char *preset, const char *path, uint64_t seed, char *err);
/* Bytes the file will have (approximately: tensor data only); 0 for an unknown preset. */
uint64_t synth_data_bytes(const char *preset);

/* How a preset is written. SYNTH_TYPE_KEEP: the preset's own type. */
#define SYNTH_TYPE_KEEP (-1)
typedef struct {
    bool header_only;   /* the keys and tensor infos (with their offsets), no tensor data */
    int type;           /* ggml type of the quantizable matrices, or SYNTH_TYPE_KEEP */
    int expert_type;    /* ggml type of the routed experts, or SYNTH_TYPE_KEEP */
    const char *recipe; /* NULL, or a `dsflash quantize` recipe name (then type/expert_type are unused) */
    /* 0: the preset's Engram table; else about this many rows (each column's bucket count is
     * the first prime >= engram_rows / columns): a large table for `bench --cold` (a 17e6-row
     * bench table is ~8.7 GB) */
    uint64_t engram_rows;
    bool fp8_exact;     /* synth_fp8_exact: FP8-exact FP8-role weights (the BF16 twin of .native) */
    bool native;        /* after the above, a dsflash native file (docs/FORMAT.md): synth_native */
} synth_write_opts;

/* synth_write with options (o NULL: the defaults, which synth_write uses). note (cap bytes,
 * may be NULL) receives a line about type fallbacks, or "". data_bytes, when not NULL,
 * receives the tensor data bytes described (written or not). */
int synth_write_ex(const char *preset, const char *path, uint64_t seed, const synth_write_opts *o, char *note,
                   size_t cap, uint64_t *data_bytes, char *err);

/* Writes a random-weight DSpark draft (`dflash`, gguf-layout.md §4) for the preset's model:
 * 3 stages, block size 5, target layers the main model's last three (or all if fewer), the
 * preset's widths, expert count and top-k; its keys are the converter's (convert/dspark_meta.h).
 * o as in synth_write_ex (NULL: the defaults). 0, or -1 with err. A pure function of (preset,
 * seed); the main model of the same seed and this draft open together (dspark_open). */
int synth_write_dspark(const char *preset, const char *path, uint64_t seed, const synth_write_opts *o, char *err);

/* ---- the vision projector (synth_mmproj.c) ---- */

/* Writes a random-weight deepseek41v projector (clip / mmproj, gguf-layout.md §5), in the layout
 * `convert --mmproj` writes (convert/mmproj_layout.h). Presets: "tinyvl", testdata/tinyvl's tower
 * (2 blocks, width 64, 4 heads, SwiGLU 176, patch 14, merge 3, min_pixels 12544) projecting to the
 * "tiny" preset's 128; "release", the released tower (32 blocks, width 1024, 16 heads, 2816, patch
 * 14, merge 3, min_pixels 295936) projecting to the 5120 of "bench", "bench-moe" and "real". From o
 * (NULL: the defaults) only .header_only and .type (SYNTH_TYPE_KEEP or GGML_TYPE_BF16: BF16 2-D
 * weights; GGML_TYPE_F32: F32, as `convert --mmproj --outtype f32`) apply. A pure function of its
 * arguments. 0, or -1 with err. */
int synth_write_mmproj(const char *preset, const char *path, uint64_t seed, const synth_write_opts *o, char *err);

/* The same for any shape m (m->name, mean/std and f32 included; m must outlive the call). */
struct mmproj_meta_s;
int synth_mmproj_write(const struct mmproj_meta_s *m, const char *path, uint64_t seed, bool header_only, char *err);

/* ---- the model before it is written ---- */

typedef struct synth_model synth_model;

/* Lays out the keys and tensors of p, weights to be seeded by seed (nothing is generated
 * yet; p is copied). NULL with err for a parameter set the builder cannot express. */
synth_model *synth_model_new(const synth_params *p, uint64_t seed, char *err);
void synth_model_free(synth_model *m);

/* Writes the keys in order, then every tensor's data. 0, or -1 with err (a type or shape
 * the builder cannot size, or a writer refusal). */
int synth_model_write(const synth_model *m, const char *path, char *err);
/* Writes the keys and tensor infos only (a header-only file; nothing is generated). */
int synth_model_write_header(const synth_model *m, const char *path, char *err);

/* Keys written by fn(w, ctx, err) (0 / -1 with err) before the model's own keys, e.g. a layout
 * shared with the converter (convert/dspark_meta.h). ctx must outlive the writes. */
struct gguf_writer;
typedef int (*synth_head_fn)(struct gguf_writer *w, const void *ctx, char *err);
void synth_set_head(synth_model *m, synth_head_fn fn, const void *ctx);

/* Retypes as synth_write_opts describes (type / expert_type may be SYNTH_TYPE_KEEP). 0, or -1
 * with err for a type with no known block size; note as in synth_write_ex. */
int synth_quantize(synth_model *m, int type, int expert_type, char *note, size_t cap, char *err);
/* Makes the FP8-role weights FP8-exact (see the header); their types do not change. */
void synth_fp8_exact(synth_model *m);
/* Makes m a native file as `dsflash quantize IN OUT native` would (quantize_native_type; the
 * dsflash.native_version key), FP8-exact: its values are those of the same model written with
 * synth_fp8_exact alone. */
void synth_native(synth_model *m);
/* Gives every tensor the type recipe gives it (quantize_recipe_type) and sets general.file_type
 * to the recipe's. 0, or -1 with err for an unknown recipe. */
int synth_quantize_recipe(synth_model *m, const char *recipe, char *err);

/* Keys. Setters replace the value (and type) of an existing key in place, or append it. */
int synth_drop_key(synth_model *m, const char *key); /* 0, or -1 if absent */
void synth_set_u32(synth_model *m, const char *key, uint32_t v);
void synth_set_i32(synth_model *m, const char *key, int32_t v);
void synth_set_f32(synth_model *m, const char *key, float v);
void synth_set_bool(synth_model *m, const char *key, bool v);
void synth_set_str(synth_model *m, const char *key, const char *v);
/* Array of a numeric element type; values given as raw little-endian elements (copied). */
void synth_set_arr(synth_model *m, const char *key, uint32_t elem_type, const void *data, uint64_t n);
/* Array of strings (copied; lens NULL: NUL-terminated). */
void synth_set_arr_str(synth_model *m, const char *key, const char *const *strs, const uint64_t *lens,
                       uint64_t n);
/* Converts a key's value to another numeric type, keeping the value (e.g. UINT32 -> INT32,
 * FLOAT32 -> FLOAT64; for an array, its element type). -1 if absent or not convertible. */
int synth_retype_key(synth_model *m, const char *key, uint32_t new_type);
/* Sets element i of a numeric array key from a u64. -1 if impossible. */
int synth_arr_set(synth_model *m, const char *key, uint64_t i, uint64_t v);
/* Truncates (or, repeating the last element, extends) a numeric array. */
int synth_arr_resize(synth_model *m, const char *key, uint64_t n);

/* Tensors (ne in GGUF order, unused dims 1). Data is generated at write time for the final
 * name/type/shape; an added tensor is a dense matrix (std 1/sqrt(ne[0])). A quantized type
 * gets random codes with finite scales (synth_model.c: block_scales); a type the builder has
 * no scale layout for gets random bytes (only a loader looks at those). */
int synth_drop_tensor(synth_model *m, const char *name);
void synth_add_tensor(synth_model *m, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne);
int synth_reshape_tensor(synth_model *m, const char *name, uint32_t n_dims, const int64_t *ne);
int synth_retype_tensor(synth_model *m, const char *name, uint32_t type);

#endif
