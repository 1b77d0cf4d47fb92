/* shape.c: deepseek41 metadata -> validated dsf_shape.
 *
 * Applies every loader rule of gguf-layout.md §6 (S1-S13 here, S14 in weights.c; B1-B5 here,
 * B6 in the tokenizer, B9 in gguf.c) plus the engine's own requirements (block sizes of
 * the QDQ groups). Each error names the key or layer. Reads no tensor data. */
#include "model/model.h"
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

static bool in_list(const uint32_t *v, uint64_t n, uint32_t x) {
    for (uint64_t i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
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

int shape_load(dsf_shape *s, const gguf_file *f, char *err) {
    memset(s, 0, sizeof *s);
    rd r = {f, err};
    rd *R = &r;
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

    uint32_t u, n_layer, n_embd, n_head, ctx;
    /* B1 / generic keys */
    if (req_u32(R, k("block_count"), &n_layer) < 0 || req_u32(R, k("context_length"), &ctx) < 0 ||
        req_u32(R, k("embedding_length"), &n_embd) < 0)
        goto fail;
    if (n_layer < 1 || n_layer > DSF_MAX_LAYERS) {
        dsf_seterr(err, "%s = %u is outside 1..%d", k("block_count"), n_layer, DSF_MAX_LAYERS);
        goto fail;
    }
    s->n_layer = n_layer;
    s->n_ctx_train = ctx;
    s->n_embd = n_embd;
    if (key_or_arr_u32_uniform(R, k("attention.head_count"), n_layer, &n_head, true) < 0) goto fail;
    s->n_head = n_head;
    if (n_embd == 0 || n_head == 0) {
        dsf_seterr(err, "%s and %s must be > 0", k("embedding_length"), k("attention.head_count"));
        goto fail;
    }
    uint32_t n_head_kv = 1;
    if (key_or_arr_u32_uniform(R, k("attention.head_count_kv"), n_layer, &n_head_kv, false) < 0) goto fail;
    if (n_head_kv != 1) {
        dsf_seterr(err, "%s = %u; DeepSeek-V4.1 has one shared KV head", k("attention.head_count_kv"), n_head_kv);
        goto fail;
    }
    uint32_t key_len, val_len, n_rot;
    if (opt_u32(R, k("attention.key_length"), &key_len, n_embd / n_head) < 0 ||
        opt_u32(R, k("attention.value_length"), &val_len, n_embd / n_head) < 0 ||
        opt_u32(R, k("rope.dimension_count"), &n_rot, key_len) < 0)
        goto fail;
    if (key_len != val_len) {
        dsf_seterr(err, "%s (%u) != %s (%u): K and V are one latent", k("attention.key_length"), key_len,
                   k("attention.value_length"), val_len);
        goto fail;
    }
    s->head_dim = key_len;
    s->n_rot = n_rot;
    if (opt_f32(R, k("rope.freq_base"), &s->rope_base, 10000.0f) < 0) goto fail;
    {
        char *st = NULL;
        int rr = gguf_get_str(f, k("rope.scaling.type"), &st, err);
        if (rr < 0) goto fail;
        s->yarn = rr == 0 && strcmp(st, "yarn") == 0;
        if (rr == 0 && !s->yarn && strcmp(st, "none") != 0) {
            dsf_seterr(err, "%s = '%s': only yarn (or none) is supported", k("rope.scaling.type"), st);
            free(st);
            goto fail;
        }
        free(st);
    }
    if (opt_f32(R, k("rope.scaling.factor"), &s->yarn_factor, 1.0f) < 0 ||
        opt_u32(R, k("rope.scaling.original_context_length"), &u, ctx) < 0 ||
        opt_f32(R, k("rope.scaling.yarn_beta_fast"), &s->yarn_beta_fast, 32.0f) < 0 ||
        opt_f32(R, k("rope.scaling.yarn_beta_slow"), &s->yarn_beta_slow, 1.0f) < 0)
        goto fail;
    s->yarn_orig_ctx = u;
    if (s->yarn && !(s->yarn_factor > 0.0f)) {
        dsf_seterr(err, "%s must be > 0", k("rope.scaling.factor"));
        goto fail;
    }
    /* B2 */
    if (req_f32(R, k("attention.layer_norm_rms_epsilon"), &s->eps) < 0) goto fail;
    uint32_t q_lora, window, ff, n_sh, ih, id, topk, og, olr, hc, iters, n_hash, gating, n_exp = 0, n_used = 0;
    if (req_u32(R, k("attention.q_lora_rank"), &q_lora) < 0 ||
        req_u32(R, k("attention.sliding_window"), &window) < 0 ||
        key_or_arr_u32_uniform(R, k("expert_feed_forward_length"), n_layer, &ff, true) < 0 ||
        req_u32(R, k("expert_shared_count"), &n_sh) < 0 ||
        req_f32(R, k("expert_weights_scale"), &s->expert_weights_scale) < 0 ||
        req_bool(R, k("expert_weights_norm"), &s->expert_weights_norm) < 0 ||
        req_u32(R, k("attention.indexer.head_count"), &ih) < 0 ||
        req_u32(R, k("attention.indexer.key_length"), &id) < 0 ||
        req_u32(R, k("attention.indexer.top_k"), &topk) < 0 ||
        req_u32(R, k("attention.output_group_count"), &og) < 0 ||
        req_u32(R, k("attention.output_lora_rank"), &olr) < 0 ||
        req_f32(R, k("attention.compress_rope_freq_base"), &s->compress_rope_base) < 0 ||
        req_u32(R, k("hyper_connection.count"), &hc) < 0 ||
        req_u32(R, k("hyper_connection.sinkhorn_iterations"), &iters) < 0 ||
        req_f32(R, k("hyper_connection.epsilon"), &s->hc_eps) < 0 ||
        req_u32(R, k("hash_layer_count"), &n_hash) < 0 || req_u32(R, k("expert_gating_func"), &gating) < 0 ||
        req_u32(R, k("expert_count"), &n_exp) < 0 || req_u32(R, k("expert_used_count"), &n_used) < 0)
        goto fail;
    s->swiglu_exp = dsf_xmalloc(n_layer * sizeof(float));
    s->swiglu_shexp = dsf_xmalloc(n_layer * sizeof(float));
    if (key_or_arr_f32(R, k("swiglu_clamp_exp"), n_layer, s->swiglu_exp, true) < 0) goto fail; /* B3 */
    rc = key_or_arr_f32(R, k("swiglu_clamp_shexp"), n_layer, s->swiglu_shexp, false);
    if (rc < 0) goto fail;
    if (rc == 1) memcpy(s->swiglu_shexp, s->swiglu_exp, n_layer * sizeof(float));
    /* B5 */
    if (gating != 4) {
        dsf_seterr(err, "DeepSeek-V4 loader currently expects sqrtsoftplus MoE scoring (%s = %u, want 4)",
                   k("expert_gating_func"), gating);
        goto fail;
    }
    /* B1 */
    if (n_exp == 0 || n_exp > 1024 || n_used == 0 || n_used > n_exp) {
        dsf_seterr(err, "%s = %u / %s = %u: need 1 <= used <= count <= 1024", k("expert_count"), n_exp,
                   k("expert_used_count"), n_used);
        goto fail;
    }
    {
        uint32_t ng = 0, nn = 0;
        if (opt_u32(R, k("expert_group_count"), &ng, 0) < 0 || opt_u32(R, k("nextn_predict_layers"), &nn, 0) < 0)
            goto fail;
        if (ng > 1 && ng >= n_exp) {
            dsf_seterr(err, "%s = %u must be < %s", k("expert_group_count"), ng, k("expert_count"));
            goto fail;
        }
        if (ng > 1) {
            dsf_seterr(err, "%s = %u: grouped expert selection is not part of DeepSeek-V4.1", k("expert_group_count"), ng);
            goto fail;
        }
        if (nn > n_layer) {
            dsf_seterr(err, "%s = %u exceeds %s", k("nextn_predict_layers"), nn, k("block_count"));
            goto fail;
        }
    }
    if (n_hash != 0) {
        dsf_seterr(err, "%s = %u: DeepSeek-V4.1 has no hash-routed layers", k("hash_layer_count"), n_hash);
        goto fail;
    }
    /* S1 */
    if (topk == 0) {
        dsf_seterr(err, "DeepSeek-V4.1 indexer top_k must be > 0");
        goto fail;
    }
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

    /* compress ratios (B4) */
    {
        int32_t *cr = NULL;
        uint64_t ncr = 0;
        rc = gguf_get_arr_i32(f, k("attention.compress_ratios"), &cr, &ncr, err);
        if (rc == 1) {
            dsf_seterr(err, "key not found in model: %s", k("attention.compress_ratios"));
            goto fail;
        }
        if (rc < 0) goto fail;
        if (ncr < n_layer || ncr > 512) {
            free(cr);
            dsf_seterr(err, "DeepSeek-V4 compress_ratios is shorter than block_count (%llu < %u) or longer than 512",
                       (unsigned long long)ncr, n_layer);
            goto fail;
        }
        s->ratio = dsf_xmalloc(n_layer * sizeof(int32_t));
        for (uint32_t il = 0; il < n_layer; il++) {
            if (cr[il] < 0) {
                free(cr);
                dsf_seterr(err, "%s[%u] is negative", k("attention.compress_ratios"), il);
                goto fail;
            }
            s->ratio[il] = cr[il];
        }
        free(cr);
    }
    /* sources (S2-S5) */
    {
        uint32_t *kvs = NULL, *ids = NULL;
        uint64_t nkv = 0, nid = 0;
        rc = gguf_get_arr_u32(f, k("attention.kv_source_layers"), &kvs, &nkv, err);
        if (rc == 1) dsf_seterr(err, "array key not found in model: %s", k("attention.kv_source_layers"));
        if (rc != 0) goto fail;
        rc = gguf_get_arr_u32(f, k("attention.indexer.source_layers"), &ids, &nid, err);
        if (rc == 1) dsf_seterr(err, "array key not found in model: %s", k("attention.indexer.source_layers"));
        if (rc != 0) {
            free(kvs);
            goto fail;
        }
        s->kv_src = dsf_xmalloc(n_layer * sizeof(int32_t));
        s->topk_src = dsf_xmalloc(n_layer * sizeof(int32_t));
        int bad = 0;
        for (uint64_t i = 0; i < nkv; i++) bad |= kvs[i] >= n_layer;
        for (uint64_t i = 0; i < nid; i++) bad |= ids[i] >= n_layer;
        if (bad) dsf_seterr(err, "DeepSeek-V4.1 kv/index source layer out of range");
        int32_t last_kv = -1, last_idx = -1;
        for (uint32_t il = 0; il < n_layer && !bad; il++) {
            uint32_t ratio = (uint32_t)s->ratio[il];
            bool is_kv = in_list(kvs, nkv, il), is_idx = in_list(ids, nid, il);
            s->kv_src[il] = s->topk_src[il] = -1;
            if ((is_kv || is_idx) && ratio == 0) {
                bad = 1;
                dsf_seterr(err, "DeepSeek-V4.1 source layer %u has compress ratio 0", il);
                break;
            }
            if (is_kv) last_kv = (int32_t)il;
            if (is_idx) last_idx = (int32_t)il;
            if (ratio == 0) continue;
            if (ratio > 2 || last_kv < 0 || last_idx < last_kv || (uint32_t)s->ratio[last_kv] != ratio ||
                (uint32_t)s->ratio[last_idx] != ratio) {
                bad = 1;
                dsf_seterr(err, "DeepSeek-V4.1 layer %u: ratio %u without a matching kv/index source", il, ratio);
                break;
            }
            s->kv_src[il] = last_kv;
            s->topk_src[il] = last_idx;
        }
        free(kvs);
        free(ids);
        if (bad) goto fail;
    }
    /* candidates (S6-S8) */
    {
        int32_t cs = -1;
        rc = gguf_get_i32(f, k("attention.indexer.candidate_source_layer"), &cs, err);
        if (rc < 0) goto fail;
        s->cand_src = -1;
        if (rc == 0 && cs >= 0) {
            uint32_t tb, bs;
            if (req_u32(R, k("attention.indexer.candidate_top_k_blocks"), &tb) < 0 ||
                req_u32(R, k("attention.indexer.candidate_block_size"), &bs) < 0)
                goto fail;
            if ((uint32_t)cs >= n_layer || s->topk_src[cs] != cs || bs == 0 || tb == 0) {
                dsf_seterr(err, "DeepSeek-V4.1 invalid candidate selection (source must be an index source, block "
                                "size and top-k blocks > 0)");
                goto fail;
            }
            for (uint32_t il = (uint32_t)cs + 1; il < n_layer; il++)
                if (s->topk_src[il] == (int32_t)il && s->ratio[il] != s->ratio[cs]) {
                    dsf_seterr(err, "DeepSeek-V4.1 candidate consumers must share the source's compress ratio "
                                    "(layer %u)", il);
                    goto fail;
                }
            s->cand_src = cs;
            s->cand_topk_blocks = tb;
            s->cand_block = bs;
        }
    }
    if (load_engram(R, s) < 0) goto fail;

    /* The engine's own requirements (not llama.cpp rules): the QDQ groups and the grouped
     * output projection need these divisibilities. */
    {
        const char *why = NULL;
        if (s->head_dim % 32) why = "attention.key_length must be a multiple of 32 (FP8 window-KV groups)";
        else if (n_rot % 2 || n_rot > s->head_dim || n_rot > s->idx_dim)
            why = "rope.dimension_count must be even and <= key_length and indexer.key_length";
        else if (n_embd % 32 || q_lora % 32 || ff % 32) why = "embedding_length, q_lora_rank and expert_feed_forward_length must be multiples of 32";
        else if (og == 0 || n_head % og) why = "attention.head_count must be a multiple of output_group_count";
        else if ((og * olr) % 32) why = "output_group_count * output_lora_rank must be a multiple of 32";
        else if (s->idx_dim % 32 || ih == 0) why = "attention.indexer.key_length must be a multiple of 32 and head_count > 0";
        else if (hc == 0 || hc > 16) why = "hyper_connection.count must be in 1..16";
        else if (iters > 1000) why = "hyper_connection.sinkhorn_iterations must be <= 1000 (V4.1: 20)"; /* runs per token */
        else if (window == 0) why = "attention.sliding_window must be > 0";
        else if (s->n_engram && (s->ple_dim * s->ple_cols) % 32) why = "Engram input width must be a multiple of 32";
        if (why) {
            dsf_seterr(err, "unsupported shape: %s", why);
            goto fail;
        }
    }
    /* Float settings: finite and in range, or the forward would silently produce NaN. */
    {
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
            if (!isfinite(v) || (fl[i].positive ? !(v > 0.0f) : v < 0.0f) || fabsf(v) > 1e30f) {
                dsf_seterr(err, "%s = %g is out of range (want a finite %s value)", k(fl[i].key), (double)v,
                           fl[i].positive ? "positive" : "non-negative");
                goto fail;
            }
        }
        for (uint32_t il = 0; il < n_layer; il++)
            if (!isfinite(s->swiglu_exp[il]) || !isfinite(s->swiglu_shexp[il])) {
                dsf_seterr(err, "%s / %s: layer %u is not finite", k("swiglu_clamp_exp"), k("swiglu_clamp_shexp"), il);
                goto fail;
            }
    }
    return 0;
fail:
    shape_free(s);
    return -1;
}
