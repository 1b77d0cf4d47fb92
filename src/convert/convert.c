/* convert.c: Hugging Face DeepSeek-V4.1 checkpoint -> `deepseek41` GGUF, the layout of
 * llama.cpp's converter (gguf-layout.md §2-§3), loadable under its rules (§6).
 *
 * Owns: reading config.json, refusing configs the loader would refuse (§6.1-§6.3), the
 * metadata keys (§2), and the order of the whole conversion. The tensors (name map, shapes,
 * dtype rules, streamed transformations) are convert_tensors.c's.
 * Must not: write anything before the whole checkpoint has been validated (except the
 * per-chunk Engram scale checks, which abort the .tmp file). */
#include "convert/convert_impl.h"
#include "base/util.h"
#include "convert/dspark_meta.h"
#include "convert/vocab.h"
#include "kernels/dtype.h"
#include "model/roles.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ARCH "deepseek41"
#define MAX_DIM (1 << 24)          /* sanity bound on every config dimension */

/* ================================================================ config */

static void cfg_free(cfg *c) {
    json_decref(c->root);
    free(c->ratio);
    free(c->kv_src_l);
    free(c->idx_src_l);
    free(c->kv_src);
    free(c->topk_src);
    free(c->eng_layers);
    free(c->eng_rows);
    free(c->sizes);
    free(c->offsets);
    free(c->mults);
    free(c->tmap);
    free(c->ds_targets);
}

/* text_config first, then the top level. */
static json_t *cget(const cfg *c, const char *k) {
    json_t *v = c->tc ? json_object_get(c->tc, k) : NULL;
    return v ? v : json_object_get(c->root, k);
}

int convert_json_int(json_t *v, const char *k, int64_t lo, int64_t hi, int64_t *out, char *err) {
    if (!v) return dsf_seterr(err, "config.json: '%s' is missing", k);
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        *out = (int64_t)json_real_value(v);
    else if (json_is_integer(v)) *out = json_integer_value(v);
    else return dsf_seterr(err, "config.json: '%s' is not an integer", k);
    if (*out < lo || *out > hi)
        return dsf_seterr(err, "config.json: '%s' = %lld is outside [%lld, %lld]", k, (long long)*out,
                          (long long)lo, (long long)hi);
    return 0;
}

static int req_int(const cfg *c, const char *k, int64_t lo, int64_t hi, int64_t *out, char *err) {
    return convert_json_int(cget(c, k), k, lo, hi, out, err);
}

static int opt_int(const cfg *c, const char *k, int64_t lo, int64_t hi, int64_t def, int64_t *out, char *err) {
    json_t *v = cget(c, k);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    return req_int(c, k, lo, hi, out, err);
}

static int req_num(const cfg *c, const char *k, double *out, char *err) {
    json_t *v = cget(c, k);
    if (!json_is_number(v)) return dsf_seterr(err, "config.json: '%s' is %s", k, v ? "not a number" : "missing");
    *out = json_number_value(v);
    return 0;
}

static int req_bool(const cfg *c, const char *k, bool *out, char *err) {
    json_t *v = cget(c, k);
    if (!json_is_boolean(v)) return dsf_seterr(err, "config.json: '%s' is %s", k, v ? "not a boolean" : "missing");
    *out = json_is_true(v);
    return 0;
}

/* An array of non-negative integers below hi; *n may be 0. */
static int int_list(json_t *v, const char *k, int64_t hi, uint32_t **out, int64_t *n, char *err) {
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) > 4096) return dsf_seterr(err, "config.json: '%s' is not a list", k);
    *n = (int64_t)json_array_size(v);
    *out = dsf_xmalloc((size_t)(*n ? *n : 1) * sizeof **out);
    for (int64_t i = 0; i < *n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= hi)
            return dsf_seterr(err, "config.json: '%s'[%lld] is not an integer in [0, %lld)", k, (long long)i, (long long)hi);
        (*out)[i] = (uint32_t)json_integer_value(e);
    }
    return 0;
}

/* Loader rules of gguf-layout.md §6.1 S1-S8 and §6.2 B1-B5 on the values we will write. */
static int check_sources(cfg *c, char *err) {
    int64_t L = c->n_layer;
    if (c->n_kv_src == 0 || c->n_idx_src == 0)
        return dsf_seterr(err, "config.json: kv_source_layer_ids and index_source_layer_ids must be non-empty "
                          "(GGUF cannot store an empty array and the loader requires both keys)");
    c->kv_src = dsf_xmalloc((size_t)L * sizeof *c->kv_src);
    c->topk_src = dsf_xmalloc((size_t)L * sizeof *c->topk_src);
    if (roles_derive(c->ratio, L, c->kv_src_l, c->n_kv_src, c->idx_src_l, c->n_idx_src, c->kv_src, c->topk_src,
                     "config.json: ", err))
        return -1;
    if (c->cand >= 0) {
        int64_t bs, tb;
        if (req_int(c, "candidate_topk_blocks", 1, UINT32_MAX, &tb, err) ||
            req_int(c, "candidate_block_size", 1, UINT32_MAX, &bs, err))
            return -1;
        if (roles_check_candidates(c->ratio, c->topk_src, L, c->cand, tb, bs, "config.json: ", err)) return -1;
    }
    return 0;
}

static int check_engram(cfg *c, const char *hf_dir, char *err) {
    json_t *jl = cget(c, "engram_layer_ids");
    int64_t n;
    if (int_list(jl, "engram_layer_ids", c->n_layer, &c->eng_layers, &n, err)) return -1;
    c->n_eng = n;
    if (n == 0) return 0;
    for (int64_t i = 1; i < n; i++)
        if (c->eng_layers[i] <= c->eng_layers[i - 1])
            return dsf_seterr(err, "config.json: engram layer %u is out of range or out of order", c->eng_layers[i]);
    if (req_int(c, "engram_max_ngram_size", 2, 9, &c->ngram, err) ||
        req_int(c, "engram_n_heads", 1, 64, &c->eng_heads, err) ||
        req_int(c, "engram_head_dim", 32, MAX_DIM, &c->eng_dim, err) ||
        req_int(c, "engram_vocab_size", 2, INT32_MAX, &c->eng_vocab, err) ||
        req_int(c, "engram_pad_token_id", 0, c->n_vocab - 1, &c->eng_pad, err) ||
        req_int(c, "engram_compressed_vocab_size", 1, c->n_vocab, &c->eng_cvocab, err))
        return -1;
    if (c->eng_dim % 32) return dsf_seterr(err, "config.json: engram_head_dim %lld is not a multiple of 32", (long long)c->eng_dim);
    int64_t ncol = (c->ngram - 1) * c->eng_heads;
    /* S10: the loader's fixed limits (LLAMA_MAX_PLE_NGRAM 8, LLAMA_MAX_PLE_HEADS 64). */
    if (n * c->ngram > 8 || n * ncol > 64)
        return dsf_seterr(err, "config.json: engram metadata is inconsistent (%lld layers x %lld-grams x %lld heads "
                          "exceeds the loader's 8 multipliers / 64 heads)", (long long)n, (long long)c->ngram,
                          (long long)c->eng_heads);
    /* engram_num_embeddings may exceed 2^32 in principle: parse as JSON integers directly. */
    json_t *jr = cget(c, "engram_num_embeddings");
    if (!json_is_array(jr) || (int64_t)json_array_size(jr) != n)
        return dsf_seterr(err, "config.json: engram_num_embeddings must list one row count per engram layer");
    c->eng_rows = dsf_xmalloc((size_t)n * sizeof *c->eng_rows);
    for (int64_t i = 0; i < n; i++) {
        json_t *e = json_array_get(jr, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 1)
            return dsf_seterr(err, "config.json: engram_num_embeddings[%lld] is not a positive integer", (long long)i);
        c->eng_rows[i] = (uint64_t)json_integer_value(e);
    }
    int64_t total = n * ncol;
    c->sizes = dsf_xmalloc((size_t)total * sizeof *c->sizes);
    c->offsets = dsf_xmalloc((size_t)total * sizeof *c->offsets);
    if (engram_primes((int)n, (int)c->ngram, (int)c->eng_heads, (uint64_t)c->eng_vocab, c->sizes, err)) return -1;
    uint64_t off = 0;
    for (int64_t e = 0; e < n; e++) {
        uint64_t sum = 0;
        for (int64_t j = 0; j < ncol; j++) sum += c->sizes[e * ncol + j];
        if (sum != c->eng_rows[e])
            return dsf_seterr(err, "config.json: engram layer %u: prime sum %llu != engram_num_embeddings %llu",
                              c->eng_layers[e], (unsigned long long)sum, (unsigned long long)c->eng_rows[e]);
    }
    for (int64_t j = 0; j < total; j++) {
        c->offsets[j] = off;
        off += c->sizes[j];
        if (off > INT32_MAX) /* S12: row ids are int32 in the loader */
            return dsf_seterr(err, "config.json: engram head %lld: bucket range out of range (offset + size > INT32_MAX)",
                              (long long)j);
    }
    c->mults = dsf_xmalloc((size_t)(n * c->ngram) * sizeof *c->mults);
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hf_dir);
    int64_t cv;
    if (engram_token_map(tj, &c->tmap, &c->tmap_n, &cv, err)) return -1;
    if (cv != c->eng_cvocab || c->tmap_n != c->n_vocab)
        return dsf_seterr(err, "compressed token map (%lld -> %lld) does not match the config (vocab_size %lld, "
                          "engram_compressed_vocab_size %lld)", (long long)c->tmap_n, (long long)cv,
                          (long long)c->n_vocab, (long long)c->eng_cvocab);
    engram_multipliers(c->eng_layers, (int)n, (int)c->ngram, (uint64_t)cv, c->mults);
    return 0;
}

/* The DSpark draft's config (dspark.md §1; the converter refusals of gguf-layout.md §6.3). */
static int check_dspark(cfg *c, char *err) {
    if (!cget(c, "dspark_block_size"))
        return dsf_seterr(err, "config.json: --dspark needs the dspark_* config (dspark_block_size is missing)");
    if (req_int(c, "num_nextn_predict_layers", 1, 64, &c->ds_stages, err) ||
        req_int(c, "dspark_block_size", 1, 1024, &c->ds_block, err) ||
        req_int(c, "dspark_noise_token_id", 0, c->n_vocab - 1, &c->ds_noise, err) ||
        req_int(c, "dspark_markov_rank", 1, MAX_DIM, &c->ds_rank, err) ||
        req_int(c, "dspark_n_routed_experts", 1, 1024, &c->ds_expert, err) ||
        req_int(c, "dspark_num_experts_per_tok", 1, c->ds_expert, &c->ds_used, err) ||
        int_list(cget(c, "dspark_target_layer_ids"), "dspark_target_layer_ids", c->n_layer, &c->ds_targets,
                 &c->ds_n_targets, err))
        return -1;
    if (c->ds_n_targets == 0) return dsf_seterr(err, "config.json: dspark_target_layer_ids is missing or empty");
    for (int64_t s = 0; s < c->ds_stages; s++)
        if (c->n_layer + s < c->n_ratio && c->ratio[c->n_layer + s] != 0)
            return dsf_seterr(err, "config.json: compress_ratios[%lld] = %d, but DSpark stages are uncompressed (0)",
                              (long long)(c->n_layer + s), c->ratio[c->n_layer + s]);
    return 0;
}

static int load_config(cfg *c, const char *hf_dir, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    json_error_t jerr;
    c->root = json_load_file(path, 0, &jerr);
    if (!c->root) return dsf_seterr(err, "%s: %s (line %d)", path, jerr.text, jerr.line);
    if (!json_is_object(c->root)) return dsf_seterr(err, "%s: not a JSON object", path);
    c->tc = json_object_get(c->root, "text_config");
    if (c->tc && !json_is_object(c->tc)) c->tc = NULL;
    c->qc = cget(c, "quantization_config");
    if (req_int(c, "num_hidden_layers", 1, 512, &c->n_layer, err) ||
        req_int(c, "hidden_size", 1, MAX_DIM, &c->n_embd, err) ||
        req_int(c, "vocab_size", 1, MAX_DIM, &c->n_vocab, err) ||
        req_int(c, "num_attention_heads", 1, 4096, &c->n_head, err) ||
        req_int(c, "head_dim", 1, 65536, &c->head_dim, err) ||
        req_int(c, "qk_rope_head_dim", 0, c->head_dim, &c->rope_dim, err) ||
        req_int(c, "q_lora_rank", 1, MAX_DIM, &c->q_lora, err) ||
        req_int(c, "o_groups", 1, 4096, &c->o_groups, err) ||
        req_int(c, "o_lora_rank", 1, MAX_DIM, &c->o_lora, err) ||
        req_int(c, "n_routed_experts", 1, 1024, &c->n_expert, err) ||
        req_int(c, "num_experts_per_tok", 1, c->n_expert, &c->n_used, err) ||
        req_int(c, "n_shared_experts", 1, 64, &c->n_shared, err) ||
        req_int(c, "moe_intermediate_size", 1, MAX_DIM, &c->moe_ff, err) ||
        req_int(c, "hc_mult", 1, 64, &c->hc, err) ||
        req_int(c, "index_n_heads", 1, 4096, &c->idx_heads, err) ||
        req_int(c, "index_head_dim", 1, 65536, &c->idx_dim, err) ||
        req_int(c, "index_topk", 0, UINT32_MAX, &c->idx_topk, err) ||
        req_int(c, "sliding_window", 1, UINT32_MAX, &c->swa, err) ||
        opt_int(c, "candidate_source_layer_id", -1, 511, -1, &c->cand, err))
        return -1;
    if (c->idx_topk == 0) return dsf_seterr(err, "config.json: index_topk must be > 0");
    if ((c->n_head * c->head_dim) % c->o_groups)
        return dsf_seterr(err, "config.json: heads x head_dim is not a multiple of o_groups");
    if (c->n_embd % 32 || c->moe_ff % 32)
        return dsf_seterr(err, "config.json: hidden_size and moe_intermediate_size must be multiples of 32 (MXFP4 blocks)");
    /* §6.3 converter refusals. */
    json_t *sf = json_object_get(c->qc, "scale_fmt");
    if (sf && (!json_is_string(sf) || strcmp(json_string_value(sf), "ue8m0")))
        return dsf_seterr(err, "config.json: unsupported FP8 scale format %s (only ue8m0)",
                          json_is_string(sf) ? json_string_value(sf) : "(not a string)");
    json_t *gt = cget(c, "gate_temp");
    if (gt && (!json_is_number(gt) || json_number_value(gt) != 1.0))
        return dsf_seterr(err, "config.json: gate_temp != 1 is not supported (the router logits would need dividing by it)");
    json_t *wb = json_object_get(c->qc, "weight_block_size");
    c->bo = c->bi = 32;
    if (wb && !json_is_null(wb)) {
        json_t *a = json_array_get(wb, 0), *b = json_array_get(wb, 1);
        if (!json_is_array(wb) || json_array_size(wb) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 1 || json_integer_value(b) < 1 || json_integer_value(a) > MAX_DIM ||
            json_integer_value(b) > MAX_DIM)
            return dsf_seterr(err, "config.json: quantization_config.weight_block_size must be two positive integers");
        c->bo = json_integer_value(a);
        c->bi = json_integer_value(b);
    }
    json_t *sc = cget(c, "scoring_func");
    if (!json_is_string(sc) || strcmp(json_string_value(sc), "sqrtsoftplus"))
        return dsf_seterr(err, "config.json: scoring_func must be sqrtsoftplus (the deepseek41 loader expects it)");
    int64_t nh;
    if (opt_int(c, "num_hash_layers", 0, 512, 0, &nh, err)) return -1;
    if (nh) return dsf_seterr(err, "config.json: num_hash_layers = %lld, but V4.1 has no hash-routed layers", (long long)nh);
    json_t *cr = cget(c, "compress_ratios");
    if (!json_is_array(cr) || (int64_t)json_array_size(cr) < c->n_layer || json_array_size(cr) > 512)
        return dsf_seterr(err, "config.json: compress_ratios must have between num_hidden_layers and 512 entries");
    c->n_ratio = (int64_t)json_array_size(cr);
    c->ratio = dsf_xmalloc((size_t)c->n_ratio * sizeof *c->ratio);
    for (int64_t i = 0; i < c->n_ratio; i++) {
        json_t *e = json_array_get(cr, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return dsf_seterr(err, "config.json: compress_ratios[%lld] is not a non-negative integer", (long long)i);
        c->ratio[i] = (int32_t)json_integer_value(e);
    }
    if (int_list(cget(c, "kv_source_layer_ids"), "kv_source_layer_ids", UINT32_MAX, &c->kv_src_l, &c->n_kv_src, err) ||
        int_list(cget(c, "index_source_layer_ids"), "index_source_layer_ids", UINT32_MAX, &c->idx_src_l,
                 &c->n_idx_src, err))
        return -1;
    if (check_sources(c, err)) return -1;
    if (check_engram(c, hf_dir, err)) return -1;
    return c->dspark ? check_dspark(c, err) : 0;
}

/* ================================================================ metadata (§2) */

#define K(s) ARCH "." s

static int put_u32c(gguf_writer *w, const cfg *c, const char *key, const char *ck, char *err) {
    int64_t v;
    if (req_int(c, ck, 0, UINT32_MAX, &v, err)) return -1;
    return gguf_writer_kv_u32(w, key, (uint32_t)v, err);
}

static int put_f32c(gguf_writer *w, const cfg *c, const char *key, const char *ck, char *err) {
    double v = 0;
    if (req_num(c, ck, &v, err)) return -1;
    return gguf_writer_kv_f32(w, key, (float)v, err);
}

static int write_rope_scaling(gguf_writer *w, const cfg *c, char *err) {
    json_t *rs = cget(c, "rope_scaling");
    if (!rs || json_is_null(rs)) return 0;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *ty = json_string_value(t);
    json_t *f = json_object_get(rs, "factor");
    if (!ty || !json_is_number(f)) return dsf_seterr(err, "config.json: rope_scaling needs a type and a factor");
    if (!strcmp(ty, "linear")) {
        if (gguf_writer_kv_str(w, K("rope.scaling.type"), "linear", err)) return -1;
        return gguf_writer_kv_f32(w, K("rope.scaling.factor"), (float)json_number_value(f), err);
    }
    if (strcmp(ty, "yarn")) return dsf_seterr(err, "config.json: unsupported rope_scaling type '%s'", ty);
    json_t *orig = json_object_get(rs, "original_max_position_embeddings");
    if (!json_is_integer(orig) || json_integer_value(orig) < 1 || json_integer_value(orig) > UINT32_MAX)
        return dsf_seterr(err, "config.json: rope_scaling.original_max_position_embeddings is missing or bad");
    if (gguf_writer_kv_str(w, K("rope.scaling.type"), "yarn", err) ||
        gguf_writer_kv_f32(w, K("rope.scaling.factor"), (float)json_number_value(f), err) ||
        gguf_writer_kv_u32(w, K("rope.scaling.original_context_length"), (uint32_t)json_integer_value(orig), err))
        return -1;
    static const char *const opt[][2] = {
        {"extrapolation_factor", K("rope.scaling.yarn_ext_factor")},
        {"attention_factor", K("rope.scaling.yarn_attn_factor")},
        {"beta_fast", K("rope.scaling.yarn_beta_fast")},
        {"beta_slow", K("rope.scaling.yarn_beta_slow")},
    };
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        json_t *v = json_object_get(rs, opt[i][0]);
        if (v && !json_is_null(v)) {
            if (!json_is_number(v)) return dsf_seterr(err, "config.json: rope_scaling.%s is not a number", opt[i][0]);
            if (gguf_writer_kv_f32(w, opt[i][1], (float)json_number_value(v), err)) return -1;
        }
    }
    return 0;
}

void convert_default_name(const char *hf_dir, char *out, size_t cap) {
    /* gguf.Metadata falls back to the model directory's name; a folder called "hf" (as in
     * the test sets, NAME/hf) is a container, so its parent names the model. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", hf_dir);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    char *base = strrchr(tmp, '/');
    base = base ? base + 1 : tmp;
    bool is_hf = !strcmp(base, "hf");
    if (is_hf || !strcmp(base, ".") || !strcmp(base, "..")) {
        char *rp = realpath(hf_dir, NULL);
        if (rp) {
            snprintf(tmp, sizeof tmp, "%s", rp);
            free(rp);
            if (is_hf) {
                char *s = strrchr(tmp, '/');
                if (s && s != tmp) *s = 0;
            }
            base = strrchr(tmp, '/');
            base = base ? base + 1 : tmp;
        }
    }
    snprintf(out, cap, "%s", base[0] ? base : "model");
}

static int write_metadata(gguf_writer *w, const cfg *c, const char *hf_dir, const convert_opts *o, char *err) {
    char name[512];
    if (o->name) snprintf(name, sizeof name, "%s", o->name);
    else convert_default_name(hf_dir, name, sizeof name);
    if (gguf_writer_kv_str(w, "general.architecture", ARCH, err) ||
        gguf_writer_kv_str(w, "general.type", "model", err) ||
        gguf_writer_kv_str(w, "general.name", name, err))
        return -1;
    /* TextModel.set_gguf_parameters */
    if (gguf_writer_kv_u32(w, K("block_count"), (uint32_t)c->n_layer, err) ||
        put_u32c(w, c, K("context_length"), "max_position_embeddings", err) ||
        gguf_writer_kv_u32(w, K("embedding_length"), (uint32_t)c->n_embd, err))
        return -1;
    static const char *const ff_keys[] = {"intermediate_size", "prefix_dense_intermediate_size",
                                          "dense_intermediate_size", "n_inner", "hidden_dim"};
    for (size_t i = 0; i < 5; i++)
        if (cget(c, ff_keys[i])) {
            if (put_u32c(w, c, K("feed_forward_length"), ff_keys[i], err)) return -1;
            break;
        }
    if (gguf_writer_kv_u32(w, K("attention.head_count"), (uint32_t)c->n_head, err)) return -1;
    if (cget(c, "num_key_value_heads") && put_u32c(w, c, K("attention.head_count_kv"), "num_key_value_heads", err))
        return -1;
    if (write_rope_scaling(w, c, err)) return -1;
    if (cget(c, "rope_theta") && put_f32c(w, c, K("rope.freq_base"), "rope_theta", err)) return -1;
    if (put_f32c(w, c, K("attention.layer_norm_rms_epsilon"), "rms_norm_eps", err) ||
        gguf_writer_kv_u32(w, K("expert_count"), (uint32_t)c->n_expert, err) ||
        gguf_writer_kv_u32(w, K("expert_used_count"), (uint32_t)c->n_used, err))
        return -1;
    int64_t g;
    if (cget(c, "n_group")) {
        if (req_int(c, "n_group", 0, c->n_expert - 1, &g, err) ||
            gguf_writer_kv_u32(w, K("expert_group_count"), (uint32_t)g, err))
            return -1;
    }
    if (cget(c, "topk_group") && put_u32c(w, c, K("expert_group_used_count"), "topk_group", err)) return -1;
    if (gguf_writer_kv_u32(w, K("expert_gating_func"), 4, err) || /* SQRTSOFTPLUS */
        gguf_writer_kv_u32(w, K("attention.key_length"), (uint32_t)c->head_dim, err) ||
        gguf_writer_kv_u32(w, K("attention.value_length"), (uint32_t)c->head_dim, err) ||
        gguf_writer_kv_u32(w, "general.file_type", 38, err)) /* MOSTLY_MXFP4_MOE, also with f32 */
        return -1;
    /* DeepseekV4Model.set_gguf_parameters */
    double lim = 0;
    bool norm = false;
    if (gguf_writer_kv_u32(w, K("rope.dimension_count"), (uint32_t)c->rope_dim, err) ||
        gguf_writer_kv_u32(w, K("attention.q_lora_rank"), (uint32_t)c->q_lora, err) ||
        gguf_writer_kv_u32(w, K("attention.sliding_window"), (uint32_t)c->swa, err) ||
        gguf_writer_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)c->moe_ff, err) ||
        gguf_writer_kv_u32(w, K("expert_shared_count"), (uint32_t)c->n_shared, err) ||
        put_f32c(w, c, K("expert_weights_scale"), "routed_scaling_factor", err) ||
        req_bool(c, "norm_topk_prob", &norm, err) ||
        gguf_writer_kv_bool(w, K("expert_weights_norm"), norm, err) ||
        req_num(c, "swiglu_limit", &lim, err))
        return -1;
    float *lims = dsf_xmalloc((size_t)c->n_layer * sizeof *lims);
    for (int64_t i = 0; i < c->n_layer; i++) lims[i] = (float)lim;
    int rc = gguf_writer_kv_arr(w, K("swiglu_clamp_exp"), GGUF_VT_FLOAT32, lims, (uint64_t)c->n_layer, err);
    if (!rc) rc = gguf_writer_kv_arr(w, K("swiglu_clamp_shexp"), GGUF_VT_FLOAT32, lims, (uint64_t)c->n_layer, err);
    free(lims);
    if (rc) return -1;
    if (gguf_writer_kv_u32(w, K("attention.indexer.head_count"), (uint32_t)c->idx_heads, err) ||
        gguf_writer_kv_u32(w, K("attention.indexer.key_length"), (uint32_t)c->idx_dim, err) ||
        gguf_writer_kv_u32(w, K("attention.indexer.top_k"), (uint32_t)c->idx_topk, err) ||
        gguf_writer_kv_u32(w, K("attention.output_group_count"), (uint32_t)c->o_groups, err) ||
        gguf_writer_kv_u32(w, K("attention.output_lora_rank"), (uint32_t)c->o_lora, err) ||
        /* Python ints through add_array: INT32, written verbatim (all entries) */
        gguf_writer_kv_arr(w, K("attention.compress_ratios"), GGUF_VT_INT32, c->ratio, (uint64_t)c->n_ratio, err) ||
        put_f32c(w, c, K("attention.compress_rope_freq_base"), "compress_rope_theta", err) ||
        gguf_writer_kv_u32(w, K("hyper_connection.count"), (uint32_t)c->hc, err) ||
        put_u32c(w, c, K("hyper_connection.sinkhorn_iterations"), "hc_sinkhorn_iters", err) ||
        put_f32c(w, c, K("hyper_connection.epsilon"), "hc_eps", err) ||
        gguf_writer_kv_u32(w, K("hash_layer_count"), 0, err))
        return -1;
    /* DeepseekV41Model.set_gguf_parameters (§2.4) */
    if (gguf_writer_kv_arr(w, K("attention.kv_source_layers"), GGUF_VT_UINT32, c->kv_src_l, (uint64_t)c->n_kv_src, err) ||
        gguf_writer_kv_arr(w, K("attention.indexer.source_layers"), GGUF_VT_UINT32, c->idx_src_l,
                           (uint64_t)c->n_idx_src, err))
        return -1;
    if (c->cand >= 0) {
        if (gguf_writer_kv_i32(w, K("attention.indexer.candidate_source_layer"), (int32_t)c->cand, err) ||
            put_u32c(w, c, K("attention.indexer.candidate_top_k_blocks"), "candidate_topk_blocks", err) ||
            put_u32c(w, c, K("attention.indexer.candidate_block_size"), "candidate_block_size", err))
            return -1;
    }
    if (c->n_eng) {
        uint64_t ncol = (uint64_t)(c->n_eng * (c->ngram - 1) * c->eng_heads);
        if (gguf_writer_kv_arr(w, K("ple.layers"), GGUF_VT_UINT32, c->eng_layers, (uint64_t)c->n_eng, err) ||
            gguf_writer_kv_u32(w, K("ple.ngram_size"), (uint32_t)c->ngram, err) ||
            gguf_writer_kv_u32(w, K("ple.heads_per_ngram"), (uint32_t)c->eng_heads, err) ||
            gguf_writer_kv_u32(w, K("embedding_length_per_layer_input"), (uint32_t)c->eng_dim, err) ||
            gguf_writer_kv_arr(w, K("ple.layer_multipliers"), GGUF_VT_UINT64, c->mults,
                               (uint64_t)(c->n_eng * c->ngram), err) ||
            gguf_writer_kv_arr(w, K("ple.head_offsets"), GGUF_VT_UINT64, c->offsets, ncol, err) ||
            gguf_writer_kv_arr(w, K("ple.head_vocab_sizes"), GGUF_VT_UINT64, c->sizes, ncol, err) ||
            gguf_writer_kv_u32(w, K("engram.pad_token_id"), (uint32_t)c->eng_pad, err) ||
            gguf_writer_kv_arr(w, K("engram.token_map"), GGUF_VT_INT32, c->tmap, (uint64_t)c->tmap_n, err))
            return -1;
    }
    if (gguf_writer_kv_u32(w, "general.quantization_version", 2, err)) return -1;
    return vocab_write_gguf(w, hf_dir, c->n_vocab, err);
}

/* The `dflash` keys (gguf-layout.md §4.3, dspark_meta.c) from config.json, then the tokenizer's
 * and the noise token. */
static int write_metadata_dspark(gguf_writer *w, const cfg *c, const char *hf_dir, const convert_opts *o, char *err) {
    char name[512];
    if (o->name) snprintf(name, sizeof name, "%s", o->name);
    else {
        convert_default_name(hf_dir, name, sizeof name - 8);
        strcat(name, "-dspark");
    }
    int64_t ctx, it;
    double theta, eps, scale, lim, hc_eps;
    bool norm = false;
    if (req_int(c, "max_position_embeddings", 0, UINT32_MAX, &ctx, err) || req_num(c, "rope_theta", &theta, err) ||
        req_num(c, "rms_norm_eps", &eps, err) || req_num(c, "routed_scaling_factor", &scale, err) ||
        req_bool(c, "norm_topk_prob", &norm, err) || req_num(c, "swiglu_limit", &lim, err) ||
        req_int(c, "hc_sinkhorn_iters", 0, UINT32_MAX, &it, err) || req_num(c, "hc_eps", &hc_eps, err))
        return -1;
    const dspark_meta m = {
        .name = name, .n_stages = (uint32_t)c->ds_stages, .ctx = (uint32_t)ctx, .n_embd = (uint32_t)c->n_embd,
        .ff = (uint32_t)c->moe_ff, .n_head = (uint32_t)c->n_head, .head_dim = (uint32_t)c->head_dim,
        .n_rot = (uint32_t)c->rope_dim, .q_lora = (uint32_t)c->q_lora, .window = (uint32_t)c->swa,
        .n_expert = (uint32_t)c->ds_expert, .n_used = (uint32_t)c->ds_used, .n_shared = (uint32_t)c->n_shared,
        .o_groups = (uint32_t)c->o_groups, .o_lora = (uint32_t)c->o_lora, .hc = (uint32_t)c->hc,
        .sinkhorn = (uint32_t)it, .block = (uint32_t)c->ds_block, .rope_base = (float)theta, .eps = (float)eps,
        .route_scale = (float)scale, .swiglu = (float)lim, .hc_eps = (float)hc_eps, .norm_topk = norm,
        .targets = c->ds_targets, .n_targets = (uint32_t)c->ds_n_targets};
    if (dspark_meta_write(w, &m, err) || gguf_writer_kv_u32(w, "general.file_type", 38, err) ||
        gguf_writer_kv_u32(w, "general.quantization_version", 2, err) || vocab_write_gguf(w, hf_dir, c->n_vocab, err))
        return -1;
    return gguf_writer_kv_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)c->ds_noise, err);
}

/* ================================================================ entry points */

int convert_checkpoint(const char *hf_dir, const char *out_path, const convert_opts *o, char *err) {
    cfg c;
    memset(&c, 0, sizeof c);
    tensor_plan *p = NULL;
    st_checkpoint *ck = NULL;
    gguf_writer *w = NULL;
    uint64_t total = 0;
    int rc = -1;
    c.dspark = o->dspark;
    if (load_config(&c, hf_dir, err)) goto done;
    ck = st_open_dir(hf_dir, err);
    if (!ck) goto done;
    p = tensor_plan_build(&c, ck, o->f32, o->native, err);
    if (!p) goto done;
    w = gguf_writer_new();
    if ((o->dspark ? write_metadata_dspark(w, &c, hf_dir, o, err) : write_metadata(w, &c, hf_dir, o, err)) ||
        (o->native && gguf_writer_kv_u32(w, DSF_NATIVE_KEY, DSF_NATIVE_VERSION, err)) ||
        tensor_plan_declare(p, w, &total, err) ||
        gguf_writer_begin(w, out_path, err) || tensor_plan_write(p, w, total, o->threads, o->progress, err))
        goto done;
    rc = 0;
done:
    gguf_writer_free(w);
    tensor_plan_free(p);
    st_close(ck);
    cfg_free(&c);
    return rc;
}

int convert_vocab_only(const char *dir, const char *out_path, char *err) {
    gguf_writer *w = gguf_writer_new();
    int rc = -1;
    if (!gguf_writer_kv_str(w, "general.architecture", ARCH, err) && !gguf_writer_kv_str(w, "general.type", "model", err) &&
        !vocab_write_gguf(w, dir, 0, err) && !gguf_writer_begin(w, out_path, err) && !gguf_writer_finish(w, err))
        rc = 0;
    gguf_writer_free(w);
    return rc;
}
