/* shape.c: deepseek41 metadata -> validated dsf_shape.
 *
 * Owns: every loader rule of gguf-layout.md §6 that metadata decides (S1-S13 here, with the
 * layer roles' S3-S8 derived in roles.c; S14 in weights.c; B1-B5 here, B6 in the tokenizer,
 * B9 in gguf.c) plus the engine's own requirements (block sizes of the QDQ groups), checked
 * in a fixed order: dimensions, RoPE, keys, MoE, roles, candidates, Engram, limits, floats.
 * Must not: read tensor data, or keep a partly loaded shape (a failure frees it).
 * Invariant: each error names the key or layer; the first failing rule decides the message. */
#include "model/model.h"
#include "model/roles.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "deepseek41"

typedef struct {
    const gguf_file *f;
    char *err;
} rd;

static const char *k(const char *suffix) {
    static char buf[4][160];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], ARCH ".%s", suffix);
    return b;
}

/* Required/optional scalar readers: return 0 ok, -1 error (message set). */
static int req_u32(rd *r, const char *key, uint32_t *out) {
    int rc = gguf_get_u32(r->f, key, out, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in model: %s", key);
    return rc;
}
static int opt_u32(rd *r, const char *key, uint32_t *out, uint32_t def) {
    *out = def;
    int rc = gguf_get_u32(r->f, key, out, r->err);
    return rc < 0 ? -1 : 0;
}
static int req_f32(rd *r, const char *key, float *out) {
    int rc = gguf_get_f32(r->f, key, out, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in model: %s", key);
    return rc;
}
static int opt_f32(rd *r, const char *key, float *out, float def) {
    *out = def;
    int rc = gguf_get_f32(r->f, key, out, r->err);
    return rc < 0 ? -1 : 0;
}
static int req_bool(rd *r, const char *key, bool *out) {
    int rc = gguf_get_bool(r->f, key, out, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in model: %s", key);
    return rc;
}

/* get_key_or_arr (gguf-layout §1.6): a scalar (broadcast) or an array of exactly n entries
 * all equal (the engine supports one value per model for these keys). */
static int key_or_arr_u32_uniform(rd *r, const char *key, uint32_t n, uint32_t *out, bool required) {
    const gguf_kv *kv = gguf_find_kv(r->f, key);
    if (!kv) {
        if (required) return dsf_seterr(r->err, "key not found in model: %s", key);
        return 1;
    }
    if (kv->type != GGUF_VT_ARRAY) return req_u32(r, key, out);
    uint32_t *a = NULL;
    uint64_t na = 0;
    if (gguf_get_arr_u32(r->f, key, &a, &na, r->err) < 0) return -1;
    if (na != n) {
        free(a);
        return dsf_seterr(r->err, "key %s has wrong array length; expected %u, got %llu", key, n,
                          (unsigned long long)na);
    }
    for (uint64_t i = 1; i < na; i++)
        if (a[i] != a[0]) {
            free(a);
            return dsf_seterr(r->err, "key %s: per-layer values differ; dsflash supports one value", key);
        }
    *out = na ? a[0] : 0;
    free(a);
    return 0;
}

static int key_or_arr_f32(rd *r, const char *key, uint32_t n, float *out, bool required) {
    const gguf_kv *kv = gguf_find_kv(r->f, key);
    if (!kv) {
        if (required) return dsf_seterr(r->err, "key not found in model: %s", key);
        return 1;
    }
    if (kv->type != GGUF_VT_ARRAY) {
        float v;
        if (req_f32(r, key, &v) < 0) return -1;
        for (uint32_t i = 0; i < n; i++) out[i] = v;
        return 0;
    }
    float *a = NULL;
    uint64_t na = 0;
    if (gguf_get_arr_f32(r->f, key, &a, &na, r->err) < 0) return -1;
    if (na != n) {
        free(a);
        return dsf_seterr(r->err, "key %s has wrong array length; expected %u, got %llu", key, n,
                          (unsigned long long)na);
    }
    memcpy(out, a, n * sizeof *out);
    free(a);
    return 0;
}

void shape_free(dsf_shape *s) {
    free(s->swiglu_exp);
    free(s->swiglu_shexp);
    free(s->ratio);
    free(s->kv_src);
    free(s->topk_src);
    free(s->engram_layer);
    free(s->engram_of);
    free(s->ple_mult);
    free(s->ple_offset);
    free(s->ple_size);
    free(s->token_map);
    memset(s, 0, sizeof *s);
}

static int load_engram(rd *r, dsf_shape *s) {
    uint32_t *layers = NULL;
    uint64_t n_e = 0;
    int rc = gguf_get_arr_u32(r->f, k("ple.layers"), &layers, &n_e, r->err);
    if (rc < 0) return -1;
    s->engram_of = dsf_xmalloc((size_t)s->n_layer * sizeof *s->engram_of);
    for (int64_t il = 0; il < s->n_layer; il++) s->engram_of[il] = -1;
    if (rc == 1 || n_e == 0) {
        free(layers);
        s->n_engram = 0;
        return 0;
    }
    uint32_t ngram, heads, dim, pad;
    uint64_t n_mult = 0, n_off = 0, n_size = 0, n_map = 0;
    if (req_u32(r, k("ple.ngram_size"), &ngram) < 0 || req_u32(r, k("ple.heads_per_ngram"), &heads) < 0 ||
        req_u32(r, k("embedding_length_per_layer_input"), &dim) < 0 ||
        req_u32(r, k("engram.pad_token_id"), &pad) < 0)
        goto fail;
#define REQ_ARR(fn, key, out, n)                                                             \
    do {                                                                                     \
        int rr = fn(r->f, key, out, n, r->err);                                              \
        if (rr == 1) { dsf_seterr(r->err, "array key not found in model: %s", key); goto fail; } \
        if (rr < 0) goto fail;                                                               \
    } while (0)
    REQ_ARR(gguf_get_arr_u64, k("ple.layer_multipliers"), &s->ple_mult, &n_mult);
    REQ_ARR(gguf_get_arr_u64, k("ple.head_offsets"), &s->ple_offset, &n_off);
    REQ_ARR(gguf_get_arr_u64, k("ple.head_vocab_sizes"), &s->ple_size, &n_size);
    REQ_ARR(gguf_get_arr_i32, k("engram.token_map"), &s->token_map, &n_map);
#undef REQ_ARR
    uint64_t n_cols = ngram >= 2 ? (uint64_t)(ngram - 1) * heads : 0;
    /* S10 */
    if (n_cols == 0 || dim == 0 || n_mult != n_e * ngram || n_size != n_e * n_cols || n_off != n_e * n_cols ||
        n_mult > 8 || n_size > 64 || pad >= n_map) {
        dsf_seterr(r->err, "DeepSeek-V4.1 engram metadata is inconsistent (layers %llu, ngram %u, heads %u, "
                           "dim %u, multipliers %llu, offsets %llu, sizes %llu, token_map %llu, pad %u)",
                   (unsigned long long)n_e, ngram, heads, dim, (unsigned long long)n_mult,
                   (unsigned long long)n_off, (unsigned long long)n_size, (unsigned long long)n_map, pad);
        goto fail;
    }
    /* S11 */
    for (uint64_t e = 0; e < n_e; e++)
        if (layers[e] >= s->n_layer || (e > 0 && layers[e] <= layers[e - 1])) {
            dsf_seterr(r->err, "DeepSeek-V4.1 engram layer %u is out of range or out of order", layers[e]);
            goto fail;
        }
    /* S12 */
    s->ple_rows_needed = 0;
    for (uint64_t c = 0; c < n_e * n_cols; c++) {
        if (s->ple_size[c] < 2 || s->ple_offset[c] > (uint64_t)INT32_MAX ||
            s->ple_offset[c] + s->ple_size[c] > (uint64_t)INT32_MAX) {
            dsf_seterr(r->err, "DeepSeek-V4.1 engram head %llu: bucket range out of range", (unsigned long long)c);
            goto fail;
        }
        if ((int64_t)(s->ple_offset[c] + s->ple_size[c]) > s->ple_rows_needed)
            s->ple_rows_needed = (int64_t)(s->ple_offset[c] + s->ple_size[c]);
    }
    /* The hash multiplies compressed ids by the multipliers in 64-bit arithmetic (spec
     * §4.2.3): refuse maps with negative ids, which would make the products ill-defined. */
    for (uint64_t i = 0; i < n_map; i++)
        if (s->token_map[i] < 0) {
            dsf_seterr(r->err, "%s: entry %llu is negative (%d)", k("engram.token_map"), (unsigned long long)i,
                       s->token_map[i]);
            goto fail;
        }
    s->n_engram = (int64_t)n_e;
    s->engram_layer = dsf_xmalloc(n_e * sizeof *s->engram_layer);
    for (uint64_t e = 0; e < n_e; e++) {
        s->engram_layer[e] = (int32_t)layers[e];
        s->engram_of[layers[e]] = (int32_t)e;
    }
    s->ngram = ngram;
    s->heads_per_ngram = heads;
    s->ple_dim = dim;
    s->ple_cols = (int64_t)n_cols;
    s->n_token_map = (int64_t)n_map;
    s->engram_pad_raw = pad;
    s->engram_pad = s->token_map[pad];
    free(layers);
    return 0;
fail:
    free(layers);
    return -1;
}

/* ---- dimensions (B1) ------------------------------------------------------------------ */

static int check_arch(const gguf_file *f, char *err) {
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc == 1) return dsf_seterr(err, "key not found in model: general.architecture");
    if (rc < 0) return -1;
    if (strcmp(arch, ARCH) != 0) {
        dsf_seterr(err, "general.architecture is '%s'; dsflash runs only '" ARCH "'", arch);
        free(arch);
        return -1;
    }
    free(arch);
    return 0;
}

/* Layers, context, width, heads and the one shared KV head's dimensions. */
static int load_dims(rd *r, dsf_shape *s) {
    uint32_t n_layer, n_embd, n_head, ctx;
    if (req_u32(r, k("block_count"), &n_layer) < 0 || req_u32(r, k("context_length"), &ctx) < 0 ||
        req_u32(r, k("embedding_length"), &n_embd) < 0)
        return -1;
    if (n_layer < 1 || n_layer > DSF_MAX_LAYERS)
        return dsf_seterr(r->err, "%s = %u is outside 1..%d", k("block_count"), n_layer, DSF_MAX_LAYERS);
    s->n_layer = n_layer;
    s->n_ctx_train = ctx;
    s->n_embd = n_embd;
    if (key_or_arr_u32_uniform(r, k("attention.head_count"), n_layer, &n_head, true) < 0) return -1;
    s->n_head = n_head;
    if (n_embd == 0 || n_head == 0)
        return dsf_seterr(r->err, "%s and %s must be > 0", k("embedding_length"), k("attention.head_count"));
    uint32_t n_head_kv = 1;
    if (key_or_arr_u32_uniform(r, k("attention.head_count_kv"), n_layer, &n_head_kv, false) < 0) return -1;
    if (n_head_kv != 1)
        return dsf_seterr(r->err, "%s = %u; DeepSeek-V4.1 has one shared KV head", k("attention.head_count_kv"),
                          n_head_kv);
    uint32_t key_len, val_len, n_rot;
    if (opt_u32(r, k("attention.key_length"), &key_len, n_embd / n_head) < 0 ||
        opt_u32(r, k("attention.value_length"), &val_len, n_embd / n_head) < 0 ||
        opt_u32(r, k("rope.dimension_count"), &n_rot, key_len) < 0)
        return -1;
    if (key_len != val_len)
        return dsf_seterr(r->err, "%s (%u) != %s (%u): K and V are one latent", k("attention.key_length"), key_len,
                          k("attention.value_length"), val_len);
    s->head_dim = key_len;
    s->n_rot = n_rot;
    return 0;
}

/* ---- RoPE ------------------------------------------------------------------------------ */

/* The main table's base and the compress table's YaRN scaling (its base is read with the
 * attention keys). */
static int load_rope(rd *r, dsf_shape *s) {
    uint32_t u;
    if (opt_f32(r, k("rope.freq_base"), &s->rope_base, 10000.0f) < 0) return -1;
    char *st = NULL;
    int rr = gguf_get_str(r->f, k("rope.scaling.type"), &st, r->err);
    if (rr < 0) return -1;
    s->yarn = rr == 0 && strcmp(st, "yarn") == 0;
    if (rr == 0 && !s->yarn && strcmp(st, "none") != 0) {
        dsf_seterr(r->err, "%s = '%s': only yarn (or none) is supported", k("rope.scaling.type"), st);
        free(st);
        return -1;
    }
    free(st);
    if (opt_f32(r, k("rope.scaling.factor"), &s->yarn_factor, 1.0f) < 0 ||
        opt_u32(r, k("rope.scaling.original_context_length"), &u, (uint32_t)s->n_ctx_train) < 0 ||
        opt_f32(r, k("rope.scaling.yarn_beta_fast"), &s->yarn_beta_fast, 32.0f) < 0 ||
        opt_f32(r, k("rope.scaling.yarn_beta_slow"), &s->yarn_beta_slow, 1.0f) < 0)
        return -1;
    s->yarn_orig_ctx = u;
    if (s->yarn && !(s->yarn_factor > 0.0f)) return dsf_seterr(r->err, "%s must be > 0", k("rope.scaling.factor"));
    return 0;
}

/* ---- attention, MoE, indexer and hc keys (B2, B3, B5, B1, S1) ------------------------- */

/* The required keys of every mechanism. gating and n_hash are checked by check_moe. */
static int load_hparams(rd *r, dsf_shape *s, uint32_t *gating, uint32_t *n_hash) {
    const uint32_t n_layer = (uint32_t)s->n_layer;
    uint32_t q_lora, window, ff, n_sh, ih, id, topk, og, olr, hc, iters, n_exp = 0, n_used = 0;
    /* B2 */
    if (req_f32(r, k("attention.layer_norm_rms_epsilon"), &s->eps) < 0) return -1;
    if (req_u32(r, k("attention.q_lora_rank"), &q_lora) < 0 ||
        req_u32(r, k("attention.sliding_window"), &window) < 0 ||
        key_or_arr_u32_uniform(r, k("expert_feed_forward_length"), n_layer, &ff, true) < 0 ||
        req_u32(r, k("expert_shared_count"), &n_sh) < 0 ||
        req_f32(r, k("expert_weights_scale"), &s->expert_weights_scale) < 0 ||
        req_bool(r, k("expert_weights_norm"), &s->expert_weights_norm) < 0 ||
        req_u32(r, k("attention.indexer.head_count"), &ih) < 0 ||
        req_u32(r, k("attention.indexer.key_length"), &id) < 0 ||
        req_u32(r, k("attention.indexer.top_k"), &topk) < 0 ||
        req_u32(r, k("attention.output_group_count"), &og) < 0 ||
        req_u32(r, k("attention.output_lora_rank"), &olr) < 0 ||
        req_f32(r, k("attention.compress_rope_freq_base"), &s->compress_rope_base) < 0 ||
        req_u32(r, k("hyper_connection.count"), &hc) < 0 ||
        req_u32(r, k("hyper_connection.sinkhorn_iterations"), &iters) < 0 ||
        req_f32(r, k("hyper_connection.epsilon"), &s->hc_eps) < 0 ||
        req_u32(r, k("hash_layer_count"), n_hash) < 0 || req_u32(r, k("expert_gating_func"), gating) < 0 ||
        req_u32(r, k("expert_count"), &n_exp) < 0 || req_u32(r, k("expert_used_count"), &n_used) < 0)
        return -1;
    s->q_lora = q_lora;
    s->window = window;
    s->n_ff_exp = ff;
    s->n_expert_shared = n_sh;
    s->idx_heads = ih;
    s->idx_dim = id;
    s->idx_topk = topk;
    s->o_groups = og;
    s->o_lora = olr;
    s->hc = hc;
    s->hc_iters = iters;
    s->n_expert = n_exp;
    s->n_expert_used = n_used;
    /* B3 */
    s->swiglu_exp = dsf_xmalloc(n_layer * sizeof(float));
    s->swiglu_shexp = dsf_xmalloc(n_layer * sizeof(float));
    if (key_or_arr_f32(r, k("swiglu_clamp_exp"), n_layer, s->swiglu_exp, true) < 0) return -1;
    int rc = key_or_arr_f32(r, k("swiglu_clamp_shexp"), n_layer, s->swiglu_shexp, false);
    if (rc < 0) return -1;
    if (rc == 1) memcpy(s->swiglu_shexp, s->swiglu_exp, n_layer * sizeof(float));
    return 0;
}

/* The MoE and indexer settings DeepSeek-V4.1 fixes. */
static int check_moe(rd *r, const dsf_shape *s, uint32_t gating, uint32_t n_hash) {
    const uint32_t n_exp = (uint32_t)s->n_expert, n_used = (uint32_t)s->n_expert_used;
    /* B5 */
    if (gating != 4)
        return dsf_seterr(r->err, "DeepSeek-V4 loader currently expects sqrtsoftplus MoE scoring (%s = %u, want 4)",
                          k("expert_gating_func"), gating);
    /* B1 */
    if (n_exp == 0 || n_exp > 1024 || n_used == 0 || n_used > n_exp)
        return dsf_seterr(r->err, "%s = %u / %s = %u: need 1 <= used <= count <= 1024", k("expert_count"), n_exp,
                          k("expert_used_count"), n_used);
    uint32_t ng = 0, nn = 0;
    if (opt_u32(r, k("expert_group_count"), &ng, 0) < 0 || opt_u32(r, k("nextn_predict_layers"), &nn, 0) < 0)
        return -1;
    if (ng > 1 && ng >= n_exp)
        return dsf_seterr(r->err, "%s = %u must be < %s", k("expert_group_count"), ng, k("expert_count"));
    if (ng > 1)
        return dsf_seterr(r->err, "%s = %u: grouped expert selection is not part of DeepSeek-V4.1",
                          k("expert_group_count"), ng);
    if (nn > s->n_layer)
        return dsf_seterr(r->err, "%s = %u exceeds %s", k("nextn_predict_layers"), nn, k("block_count"));
    if (n_hash != 0)
        return dsf_seterr(r->err, "%s = %u: DeepSeek-V4.1 has no hash-routed layers", k("hash_layer_count"), n_hash);
    /* S1 */
    if (s->idx_topk == 0) return dsf_seterr(r->err, "DeepSeek-V4.1 indexer top_k must be > 0");
    return 0;
}

/* ---- layer roles (B4, S2-S8; roles.c) -------------------------------------------------- */

static int load_ratios(rd *r, dsf_shape *s) {
    const uint32_t n_layer = (uint32_t)s->n_layer;
    int32_t *cr = NULL;
    uint64_t ncr = 0;
    int rc = gguf_get_arr_i32(r->f, k("attention.compress_ratios"), &cr, &ncr, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in model: %s", k("attention.compress_ratios"));
    if (rc < 0) return -1;
    if (ncr < n_layer || ncr > 512) {
        free(cr);
        return dsf_seterr(r->err, "DeepSeek-V4 compress_ratios is shorter than block_count (%llu < %u) or longer than 512",
                          (unsigned long long)ncr, n_layer);
    }
    s->ratio = dsf_xmalloc(n_layer * sizeof(int32_t));
    for (uint32_t il = 0; il < n_layer; il++) {
        if (cr[il] < 0) {
            free(cr);
            return dsf_seterr(r->err, "%s[%u] is negative", k("attention.compress_ratios"), il);
        }
        s->ratio[il] = cr[il];
    }
    free(cr);
    return 0;
}

static int load_sources(rd *r, dsf_shape *s) {
    uint32_t *kvs = NULL, *ids = NULL;
    uint64_t nkv = 0, nid = 0;
    int rc = gguf_get_arr_u32(r->f, k("attention.kv_source_layers"), &kvs, &nkv, r->err);
    if (rc == 1) dsf_seterr(r->err, "array key not found in model: %s", k("attention.kv_source_layers"));
    if (rc != 0) return -1;
    rc = gguf_get_arr_u32(r->f, k("attention.indexer.source_layers"), &ids, &nid, r->err);
    if (rc == 1) dsf_seterr(r->err, "array key not found in model: %s", k("attention.indexer.source_layers"));
    if (rc != 0) {
        free(kvs);
        return -1;
    }
    s->kv_src = dsf_xmalloc((size_t)s->n_layer * sizeof(int32_t));
    s->topk_src = dsf_xmalloc((size_t)s->n_layer * sizeof(int32_t));
    rc = roles_derive(s->ratio, s->n_layer, kvs, (int64_t)nkv, ids, (int64_t)nid, s->kv_src, s->topk_src,
                      "DeepSeek-V4.1 ", r->err);
    free(kvs);
    free(ids);
    return rc;
}

static int load_candidates(rd *r, dsf_shape *s) {
    int32_t cs = -1;
    int rc = gguf_get_i32(r->f, k("attention.indexer.candidate_source_layer"), &cs, r->err);
    if (rc < 0) return -1;
    s->cand_src = -1;
    if (rc != 0 || cs < 0) return 0;
    uint32_t tb, bs;
    if (req_u32(r, k("attention.indexer.candidate_top_k_blocks"), &tb) < 0 ||
        req_u32(r, k("attention.indexer.candidate_block_size"), &bs) < 0)
        return -1;
    if (roles_check_candidates(s->ratio, s->topk_src, s->n_layer, cs, tb, bs, "DeepSeek-V4.1 ", r->err) < 0)
        return -1;
    s->cand_src = cs;
    s->cand_topk_blocks = tb;
    s->cand_block = bs;
    return 0;
}

/* ---- the engine's own requirements ------------------------------------------------------ */

/* Not llama.cpp rules: the QDQ groups and the grouped output projection need these
 * divisibilities. */
static int check_engine_limits(const dsf_shape *s, char *err) {
    const char *why = NULL;
    if (s->head_dim % 32) why = "attention.key_length must be a multiple of 32 (FP8 window-KV groups)";
    else if (s->n_rot % 2 || s->n_rot > s->head_dim || s->n_rot > s->idx_dim)
        why = "rope.dimension_count must be even and <= key_length and indexer.key_length";
    else if (s->n_embd % 32 || s->q_lora % 32 || s->n_ff_exp % 32) why = "embedding_length, q_lora_rank and expert_feed_forward_length must be multiples of 32";
    else if (s->o_groups == 0 || s->n_head % s->o_groups) why = "attention.head_count must be a multiple of output_group_count";
    else if ((s->o_groups * s->o_lora) % 32) why = "output_group_count * output_lora_rank must be a multiple of 32";
    else if (s->idx_dim % 32 || s->idx_heads == 0) why = "attention.indexer.key_length must be a multiple of 32 and head_count > 0";
    else if (s->hc == 0 || s->hc > 16) why = "hyper_connection.count must be in 1..16";
    else if (s->hc_iters > 1000) why = "hyper_connection.sinkhorn_iterations must be <= 1000 (V4.1: 20)"; /* runs per token */
    else if (s->window == 0) why = "attention.sliding_window must be > 0";
    else if (s->n_engram && (s->ple_dim * s->ple_cols) % 32) why = "Engram input width must be a multiple of 32";
    if (why) return dsf_seterr(err, "unsupported shape: %s", why);
    return 0;
}

/* Float settings: finite and in range, or the forward would silently produce NaN. */
static int check_floats(const dsf_shape *s, char *err) {
    const struct { const char *key; float v; int positive; } fl[] = {
        {"attention.layer_norm_rms_epsilon", s->eps, 1},
        {"rope.freq_base", s->rope_base, 1},
        {"attention.compress_rope_freq_base", s->compress_rope_base, 1},
        {"rope.scaling.factor", s->yarn_factor, 1},
        {"rope.scaling.yarn_beta_fast", s->yarn_beta_fast, 1},
        {"rope.scaling.yarn_beta_slow", s->yarn_beta_slow, 1},
        {"expert_weights_scale", s->expert_weights_scale, 0},
        {"hyper_connection.epsilon", s->hc_eps, 0},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        float v = fl[i].v;
        if (!isfinite(v) || (fl[i].positive ? !(v > 0.0f) : v < 0.0f) || fabsf(v) > 1e30f)
            return dsf_seterr(err, "%s = %g is out of range (want a finite %s value)", k(fl[i].key), (double)v,
                              fl[i].positive ? "positive" : "non-negative");
    }
    for (int64_t il = 0; il < s->n_layer; il++)
        if (!isfinite(s->swiglu_exp[il]) || !isfinite(s->swiglu_shexp[il]))
            return dsf_seterr(err, "%s / %s: layer %u is not finite", k("swiglu_clamp_exp"), k("swiglu_clamp_shexp"),
                              (unsigned)il);
    return 0;
}

/* ---- the whole shape -------------------------------------------------------------------- */

int shape_load(dsf_shape *s, const gguf_file *f, char *err) {
    memset(s, 0, sizeof *s);
    rd r = {f, err};
    if (check_arch(f, err) < 0) return -1;
    uint32_t gating = 0, n_hash = 0;
    if (load_dims(&r, s) < 0 || load_rope(&r, s) < 0 || load_hparams(&r, s, &gating, &n_hash) < 0 ||
        check_moe(&r, s, gating, n_hash) < 0 || load_ratios(&r, s) < 0 || load_sources(&r, s) < 0 ||
        load_candidates(&r, s) < 0 || load_engram(&r, s) < 0 || check_engine_limits(s, err) < 0 ||
        check_floats(s, err) < 0) {
        shape_free(s);
        return -1;
    }
    return 0;
}
