/* dspark_load.c: opens a DSpark draft GGUF (`dflash`, gguf-layout.md §4) against its main
 * model: the metadata -> the draft's dsf_shape (its stages as window-only layers), the tensors
 * through weights.c (shape.dspark), and the fit with the main model (vocab, width, target
 * layers).
 * Must not: run the draft (dspark.c) or read tensor data beyond what weights.c binds.
 * Invariant: every refusal names the key, tensor or mismatch; a failed open frees everything. */
#include "model/dspark_impl.h"
#include "kernels/ops.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KD(s) "dflash." s

/* A required u32 key in [lo, hi]. */
static int ku32(const gguf_file *g, const char *key, uint32_t lo, uint32_t hi, int64_t *out, char *err) {
    uint32_t v = 0;
    int rc = gguf_get_u32(g, key, &v, err);
    if (rc == 1) return dsf_seterr(err, "dflash draft: key not found: %s", key);
    if (rc < 0) return -1;
    if (v < lo || v > hi) return dsf_seterr(err, "dflash draft: %s = %u is outside [%u, %u]", key, v, lo, hi);
    *out = v;
    return 0;
}

static int kf32(const gguf_file *g, const char *key, float *out, char *err) {
    int rc = gguf_get_f32(g, key, out, err);
    if (rc == 1) return dsf_seterr(err, "dflash draft: key not found: %s", key);
    if (rc == 0 && !(*out >= 0.0f && *out < 1e30f)) return dsf_seterr(err, "dflash draft: %s = %g is out of range", key, (double)*out);
    return rc;
}

/* An optional bool key that must hold `want` when present. */
static int kbool_is(const gguf_file *g, const char *key, bool want, bool required, char *err) {
    bool v = want;
    int rc = gguf_get_bool(g, key, &v, err);
    if (rc < 0) return -1;
    if (rc == 1 && required) return dsf_seterr(err, "dflash draft: key not found: %s", key);
    if (v != want) return dsf_seterr(err, "dflash draft: %s = %s is not supported (dsflash runs the %s)", key,
                                     v ? "true" : "false", want ? "single-pass DSpark layout" : "DSpark layout");
    return 0;
}

/* swiglu_clamp_exp / _shexp: a scalar or one entry per stage. */
static int kclamp(const gguf_file *g, const char *key, int64_t n, float *out, bool required, char *err) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return required ? dsf_seterr(err, "dflash draft: key not found: %s", key) : 1;
    if (kv->type != GGUF_VT_ARRAY) {
        float v;
        if (kf32(g, key, &v, err)) return -1;
        for (int64_t i = 0; i < n; i++) out[i] = v;
        return 0;
    }
    float *a = NULL;
    uint64_t na = 0;
    if (gguf_get_arr_f32(g, key, &a, &na, err) < 0) return -1;
    int rc = 0;
    if ((int64_t)na != n) rc = dsf_seterr(err, "dflash draft: %s has %llu entries, expected %lld (block_count)", key,
                                          (unsigned long long)na, (long long)n);
    else memcpy(out, a, (size_t)n * sizeof *out);
    free(a);
    return rc;
}

/* The dflash keys (§4.3) -> sh; every stage is a ratio-0 window layer with no Engram. */
static int load_keys(dsf_dspark *d, const gguf_file *g, char *err) {
    dsf_shape *s = &d->de.shape;
    int64_t hkv = 1, kl, vl, og, olr, hc, it, gate, blk, noise;
    if (ku32(g, KD("block_count"), 1, 64, &s->n_layer, err) || ku32(g, KD("embedding_length"), 32, 1 << 20, &s->n_embd, err) ||
        ku32(g, KD("attention.head_count"), 1, 4096, &s->n_head, err) ||
        ku32(g, KD("attention.key_length"), 32, 65536, &kl, err) || ku32(g, KD("attention.value_length"), 32, 65536, &vl, err) ||
        ku32(g, KD("rope.dimension_count"), 0, 65536, &s->n_rot, err) ||
        ku32(g, KD("attention.q_lora_rank"), 32, 1 << 20, &s->q_lora, err) ||
        ku32(g, KD("attention.sliding_window"), 1, 1 << 20, &s->window, err) ||
        ku32(g, KD("expert_count"), 1, 1024, &s->n_expert, err) ||
        ku32(g, KD("expert_used_count"), 1, (uint32_t)s->n_expert, &s->n_expert_used, err) ||
        ku32(g, KD("expert_feed_forward_length"), 32, 1 << 20, &s->n_ff_exp, err) ||
        ku32(g, KD("expert_shared_count"), 1, 64, &s->n_expert_shared, err) ||
        ku32(g, KD("expert_gating_func"), 0, 255, &gate, err) ||
        ku32(g, KD("attention.output_group_count"), 1, 4096, &og, err) ||
        ku32(g, KD("attention.output_lora_rank"), 1, 1 << 20, &olr, err) ||
        ku32(g, KD("hyper_connection.count"), 1, 16, &hc, err) ||
        ku32(g, KD("hyper_connection.sinkhorn_iterations"), 1, 1000, &it, err) ||
        ku32(g, KD("block_size"), 1, 64, &blk, err) || ku32(g, "tokenizer.ggml.mask_token_id", 0, INT32_MAX, &noise, err) ||
        kf32(g, KD("attention.layer_norm_rms_epsilon"), &s->eps, err) || kf32(g, KD("expert_weights_scale"), &s->expert_weights_scale, err) ||
        kf32(g, KD("hyper_connection.epsilon"), &s->hc_eps, err))
        return -1;
    if (gguf_find_kv(g, KD("attention.head_count_kv")) && ku32(g, KD("attention.head_count_kv"), 1, 1, &hkv, err)) return -1;
    if (gguf_get_bool(g, KD("expert_weights_norm"), &s->expert_weights_norm, err) != 0)
        return dsf_seterr(err, "dflash draft: key %s is missing or not a bool", KD("expert_weights_norm"));
    if (gate != 4) return dsf_seterr(err, "DSpark DSV4 draft expects sqrtsoftplus MoE scoring (%s = %lld, want 4)",
                                     KD("expert_gating_func"), (long long)gate);
    if (kl != vl) return dsf_seterr(err, "dflash draft: key_length %lld != value_length %lld", (long long)kl, (long long)vl);
    if (kbool_is(g, KD("hyper_connection.single_pass"), true, true, err) ||
        kbool_is(g, KD("sample_from_anchor"), true, false, err))
        return -1;
    if (gguf_get_f32(g, KD("rope.freq_base"), &s->rope_base, err) < 0) return -1;
    if (!gguf_find_kv(g, KD("rope.freq_base"))) s->rope_base = 10000.0f;
    if (!(s->rope_base > 0.0f)) return dsf_seterr(err, "dflash draft: %s must be > 0", KD("rope.freq_base"));
    s->head_dim = kl;
    s->o_groups = og;
    s->o_lora = olr;
    s->hc = hc;
    s->hc_iters = it;
    s->cand_src = -1;
    d->block = (int)blk;
    d->noise = (int32_t)noise;
    const int64_t L = s->n_layer;
    s->swiglu_exp = dsf_xmalloc((size_t)L * sizeof(float));
    s->swiglu_shexp = dsf_xmalloc((size_t)L * sizeof(float));
    s->ratio = dsf_xcalloc((size_t)L, sizeof(int32_t));
    s->kv_src = dsf_xmalloc((size_t)L * sizeof(int32_t));
    s->topk_src = dsf_xmalloc((size_t)L * sizeof(int32_t));
    s->engram_of = dsf_xmalloc((size_t)L * sizeof(int32_t));
    for (int64_t i = 0; i < L; i++) s->kv_src[i] = s->topk_src[i] = s->engram_of[i] = -1;
    int rc = kclamp(g, KD("swiglu_clamp_exp"), L, s->swiglu_exp, true, err);
    if (rc < 0) return -1;
    rc = kclamp(g, KD("swiglu_clamp_shexp"), L, s->swiglu_shexp, false, err);
    if (rc < 0) return -1;
    if (rc == 1) memcpy(s->swiglu_shexp, s->swiglu_exp, (size_t)L * sizeof(float));
    int32_t *cr = NULL;
    uint64_t ncr = 0;
    rc = gguf_get_arr_i32(g, KD("attention.compress_ratios"), &cr, &ncr, err);
    if (rc < 0) return -1;
    for (uint64_t i = 0; rc == 0 && i < ncr; i++)
        if (cr[i] != 0) rc = dsf_seterr(err, "DSpark DSV4 draft expects uncompressed attention on all stages "
                                        "(%s[%llu] = %d)", KD("attention.compress_ratios"), (unsigned long long)i, cr[i]);
    free(cr);
    if (rc < 0) return -1;
    /* the engine's own divisibilities (shape.c check_engine_limits) */
    if (s->head_dim % 32 || s->n_rot % 2 || s->n_rot > s->head_dim || s->n_embd % 32 || s->q_lora % 32 ||
        s->n_head % s->o_groups || (s->o_groups * s->o_lora) % 32)
        return dsf_seterr(err, "dflash draft: unsupported shape (key_length, q_lora_rank, embedding_length and "
                          "groups x output_lora_rank must be multiples of 32, rope dims even and <= key_length, "
                          "heads a multiple of output_group_count)");
    return 0;
}

/* target_layers: inside the main model, no repeats; kept in increasing order (dspark.md §3). */
static int load_targets(dsf_dspark *d, const gguf_file *g, char *err) {
    const gguf_kv *kv = gguf_find_kv(g, KD("target_layers"));
    if (!kv) return dsf_seterr(err, "DFlash model requires 'target_layers' in GGUF metadata");
    uint32_t *t = NULL;
    uint64_t n = 0;
    if (gguf_get_arr_u32(g, KD("target_layers"), &t, &n, err)) return -1;
    const int64_t L = d->main->shape.n_layer;
    int rc = 0;
    if (n == 0 || n > 64) rc = dsf_seterr(err, "dflash draft: %s has %llu entries (want 1..64)", KD("target_layers"), (unsigned long long)n);
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        if ((int64_t)t[i] >= L)
            rc = dsf_seterr(err, "draft does not fit the main model: target layer %u is outside its %lld layers", t[i],
                            (long long)L);
    d->targets = dsf_xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (uint64_t i = 0; rc == 0 && i < n; i++) { /* insertion sort, refusing repeats */
        uint64_t j = i;
        for (; j > 0 && d->targets[j - 1] > (int32_t)t[i]; j--) d->targets[j] = d->targets[j - 1];
        d->targets[j] = (int32_t)t[i];
        if (j > 0 && d->targets[j - 1] == (int32_t)t[i]) rc = dsf_seterr(err, "dflash draft: target layer %u is listed twice", t[i]);
    }
    free(t);
    d->n_targets = (int)n;
    return rc;
}

/* The fit with the main model (gguf-layout.md §4: the draft shares token_embd and output). */
static int check_fit(const dsf_dspark *d, const gguf_file *g, char *err) {
    const dsf_shape *m = &d->main->shape, *s = &d->de.shape;
    if (s->n_embd != m->n_embd)
        return dsf_seterr(err, "draft does not fit the main model: embedding_length %lld vs the main model's %lld",
                          (long long)s->n_embd, (long long)m->n_embd);
    if (d->noise >= m->n_vocab)
        return dsf_seterr(err, "draft does not fit the main model: mask_token_id %d is outside its vocab (%lld)",
                          d->noise, (long long)m->n_vocab);
    const gguf_tensor *w1 = gguf_find_tensor(g, "markov_w1.weight");
    if (!w1) return dsf_seterr(err, "dflash draft: tensor 'markov_w1.weight' not found");
    if (w1->n_dims != 2 || w1->ne[1] != m->n_vocab)
        return dsf_seterr(err, "draft does not fit the main model: markov_w1.weight has %lld rows, the main vocab is %lld",
                          (long long)w1->ne[1], (long long)m->n_vocab);
    if (w1->ne[0] < 1 || w1->ne[0] > 65536) return dsf_seterr(err, "dflash draft: markov_w1.weight rank %lld is out of range", (long long)w1->ne[0]);
    return 0;
}

dsf_dspark *dspark_open(const char *path, dsf_engine *main, char *err) {
    gguf_file *g = gguf_open(path, err);
    if (!g) return NULL;
    dsf_dspark *d = dsf_xcalloc(1, sizeof *d);
    d->main = main;
    d->de.gguf = g;
    char *arch = NULL;
    int rc = gguf_get_str(g, "general.architecture", &arch, err);
    if (rc == 0 && strcmp(arch, "dflash")) rc = dsf_seterr(err, "general.architecture is '%s'; a DSpark draft is 'dflash'", arch);
    else if (rc == 1) rc = dsf_seterr(err, "key not found in model: general.architecture");
    free(arch);
    dsf_shape *s = &d->de.shape;
    if (rc || load_keys(d, g, err) || load_targets(d, g, err) || check_fit(d, g, err)) goto fail;
    s->dspark = true;
    s->n_vocab = main->shape.n_vocab;
    s->n_feat_in = (int64_t)d->n_targets * s->n_embd;
    s->markov_rank = gguf_find_tensor(g, "markov_w1.weight")->ne[0];
    s->n_ctx_train = main->shape.n_ctx_train;
    if (weights_bind(&d->de.w, s, g, err)) goto fail;
    d->de.w.tok_embd = main->w.tok_embd;
    d->de.w.output = main->w.output;
    const int64_t half = s->n_rot / 2 ? s->n_rot / 2 : 1;
    d->de.rope.freq_main = dsf_xmalloc((size_t)half * sizeof(float));
    d->de.rope.freq_compress = dsf_xmalloc((size_t)half * sizeof(float));
    op_rope_freqs(d->de.rope.freq_main, s->n_rot, s->rope_base, 0, 1, 0, 0, 0);
    memcpy(d->de.rope.freq_compress, d->de.rope.freq_main, (size_t)half * sizeof(float));
    d->de.numerics = main->numerics;
    d->de.kern = main->kern;
    d->de.pool = main->pool;
    d->de.name = dsf_xstrdup(path);
    return d;
fail:
    dsf_err_oneline(err);
    dspark_close(d);
    return NULL;
}

void dspark_close(dsf_dspark *d) {
    if (!d) return;
    if (d->de.w.layers) weights_free(&d->de.w, &d->de.shape);
    shape_free(&d->de.shape);
    free(d->de.rope.freq_main);
    free(d->de.rope.freq_compress);
    free(d->de.name);
    gguf_close(d->de.gguf);
    free(d->targets);
    free(d);
}

void dspark_info(const dsf_dspark *d, dsf_dspark_info *o) {
    o->n_stages = (int)d->de.shape.n_layer;
    o->block = d->block;
    o->n_targets = d->n_targets;
    o->window = (int)d->de.shape.window;
    o->markov_rank = (int)d->de.shape.markov_rank;
    o->noise = d->noise;
    o->targets = d->targets;
    o->feat_dim = d->de.shape.n_feat_in;
}
