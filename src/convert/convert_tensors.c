/* convert_tensors.c: the converter's tensor half (gguf-layout.md §3): the checkpoint-name ->
 * GGUF-name map with expected shapes and dtype rules (§3.1-§3.2), and the streamed
 * transformations (§3.3): FP8 block dequantization, MXFP4 nibble repacking, Engram tables
 * dequantized and concatenated, engram_gate = q*k, router to F32. With --outtype native
 * (docs/FORMAT.md) the FP8 weights keep their e4m3 bytes and 32x32 scale grid (FP8_B32) and
 * the Engram rows their e4m3 bytes and per-32 scales (FP8_R264).
 * Must not: hold a whole tensor (every transformation streams through bounded buffers), or
 * read config.json (it gets the validated cfg from convert.c).
 * Invariant: every output value equals the checkpoint's mathematical value (FP8 x E8M0 and
 * BF16 are exact in BF16; the E8M0 range check guarantees it). */
#include "convert/convert_impl.h"
#include "convert/progress.h"
#include "base/threads.h"
#include "base/util.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES ((uint64_t)8 << 20) /* source bytes per streamed chunk */

/* ================================================================ tensor plan (§3.2) */

enum { K_COPY, K_FP8, K_FP8N, K_MXFP4, K_ENGRAM, K_GATE }; /* K_FP8N: FP8 kept as FP8_B32 */

typedef struct {
    char name[GGUF_MAX_NAME];
    int kind;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const st_tensor *w, *s;  /* source (and its scale, or k_weight for K_GATE) */
    const char *pfx;         /* K_MXFP4: checkpoint block prefix ("layers" or "mtp") */
    int layer;               /* K_MXFP4: layer (or DSpark stage) */
    int proj;                /* K_MXFP4: 1, 2, 3 */
    int order;               /* position of w in the checkpoint, for the output order */
    int seq;                 /* position in the plan (tie-break) */
    uint64_t el0, nel;       /* K_COPY: elements [el0, el0 + nel) of w (nel 0: all) */
    uint64_t nbytes;
} otensor;

struct tensor_plan {
    const cfg *c;
    const st_checkpoint *ck;
    bool f32, native;
    otensor *t;
    int n, cap;
    bool *used;              /* per checkpoint tensor */
    const st_tensor **eng_w, **eng_s;
};
typedef tensor_plan plan;

static int ck_index(const plan *p, const st_tensor *t) { return (int)(t - st_at(p->ck, 0)); }

static otensor *plan_add(plan *p, const char *name) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = dsf_xrealloc(p->t, (size_t)p->cap * sizeof *p->t);
    }
    otensor *o = &p->t[p->n++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    return o;
}

static const char *shape_str(const st_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Finds a required checkpoint tensor with the given shape (d1 < 0: 1-D). */
static const st_tensor *need(plan *p, const char *name, int64_t d0, int64_t d1, char *err) {
    const st_tensor *t = st_find(p->ck, name);
    if (!t) {
        dsf_seterr(err, "checkpoint: missing tensor '%s'", name);
        return NULL;
    }
    int nd = d1 < 0 ? 1 : 2;
    if (t->n_dims != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        char b[128];
        if (nd == 1) dsf_seterr(err, "checkpoint: tensor '%s': expected shape [%lld], got %s", name, (long long)d0, shape_str(t, b, sizeof b));
        else dsf_seterr(err, "checkpoint: tensor '%s': expected shape [%lld, %lld], got %s", name, (long long)d0,
                        (long long)d1, shape_str(t, b, sizeof b));
        return NULL;
    }
    p->used[ck_index(p, t)] = true;
    return t;
}

static bool is_float(int dt) { return dt == ST_BF16 || dt == ST_F16 || dt == ST_F32; }

static uint64_t tensor_bytes(uint32_t type, const int64_t *ne, uint32_t nd) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < nd; d++) n *= (uint64_t)ne[d];
    return n / ggml_blck_size(type) * ggml_type_size(type) + dsf_type_extra_bytes(type, (uint64_t)ne[0], n / (uint64_t)ne[0]);
}

/* A plain or FP8 tensor: checkpoint [d0] or [d0, d1] -> GGUF {d1, d0}, dtype by §3.1. */
static int add_dense(plan *p, const char *ckname, const char *gname, int64_t d0, int64_t d1, bool force_f32, char *err) {
    const st_tensor *t = need(p, ckname, d0, d1, err);
    if (!t) return -1;
    otensor *o = plan_add(p, gname);
    o->w = t;
    o->order = ck_index(p, t);
    o->n_dims = d1 < 0 ? 1 : 2;
    o->ne[0] = d1 < 0 ? d0 : d1;
    o->ne[1] = d1 < 0 ? 1 : d0;
    o->ne[2] = o->ne[3] = 1;
    size_t gl = strlen(gname);
    bool norm = gl >= 12 && !strcmp(gname + gl - 12, "_norm.weight");
    /* §3.1 rules 2-3: 1-D, *_norm, F32 sources, router and gate are F32; other 2-D follow --outtype. */
    bool f32 = force_f32 || o->n_dims == 1 || norm || t->dtype == ST_F32 || p->f32;
    o->type = f32 ? GGML_TYPE_F32 : GGML_TYPE_BF16;
    /* X.weight's block scales are X.scale (only .weight tensors can be FP8) */
    char sname[256] = "";
    size_t cl = strlen(ckname);
    if (cl > 7 && !strcmp(ckname + cl - 7, ".weight")) snprintf(sname, sizeof sname, "%.*s.scale", (int)(cl - 7), ckname);
    const st_tensor *s = sname[0] ? st_find(p->ck, sname) : NULL;
    if (t->dtype == ST_F8_E4M3) {
        if (!s) return dsf_seterr(err, "checkpoint: FP8 tensor '%s' has no block scales%s%s%s", ckname,
                                  sname[0] ? " ('" : "", sname, sname[0] ? "')" : "");
        if (o->n_dims != 2) return dsf_seterr(err, "checkpoint: FP8 tensor '%s' is not 2-D", ckname);
        int64_t so = (d0 + p->c->bo - 1) / p->c->bo, si = (d1 + p->c->bi - 1) / p->c->bi;
        if (s->n_dims != 2 || s->shape[0] != so || s->shape[1] != si) {
            char b[128];
            return dsf_seterr(err, "checkpoint: '%s': scale shape %s does not match (%lld, %lld) blocks (expected [%lld, %lld])",
                              sname, shape_str(s, b, sizeof b), (long long)p->c->bo, (long long)p->c->bi, (long long)so,
                              (long long)si);
        }
        if (s->dtype != ST_F8_E8M0 && s->dtype != ST_U8)
            return dsf_seterr(err, "checkpoint: '%s': dtype %s, expected F8_E8M0", sname, st_dtype_name(s->dtype));
        p->used[ck_index(p, s)] = true;
        o->kind = K_FP8;
        o->s = s;
        if (p->native && !f32) { /* FORMAT.md: the checkpoint's bytes, so only its 32x32 grid fits */
            if (p->c->bo != 32 || p->c->bi != 32)
                return dsf_seterr(err, "checkpoint: --outtype native needs 32x32 FP8 blocks (weight_block_size), "
                                  "this one has [%lld, %lld]", (long long)p->c->bo, (long long)p->c->bi);
            o->kind = K_FP8N;
            o->type = DSF_TYPE_FP8B32;
        }
    } else if (is_float(t->dtype)) {
        if (s) return dsf_seterr(err, "checkpoint: '%s' has a scale '%s' but is %s, not FP8", ckname, sname, st_dtype_name(t->dtype));
        o->kind = K_COPY;
    } else {
        return dsf_seterr(err, "checkpoint: tensor '%s': dtype %s is not allowed here", ckname, st_dtype_name(t->dtype));
    }
    o->nbytes = tensor_bytes(o->type, o->ne, o->n_dims);
    return 0;
}

/* The routed experts pfx.il.ffn.experts.{0..n_expert-1}.w{proj} as one MXFP4 tensor. */
static int add_experts(plan *p, const char *pfx, int il, int proj, const char *gname, int64_t rows, int64_t in,
                       int64_t n_expert, char *err) {
    otensor *o = plan_add(p, gname);
    o->pfx = pfx;
    o->kind = K_MXFP4;
    o->type = GGML_TYPE_MXFP4;
    o->layer = il;
    o->proj = proj;
    o->n_dims = 3;
    o->ne[0] = in;
    o->ne[1] = rows;
    o->ne[2] = n_expert;
    o->ne[3] = 1;
    o->order = -1;
    for (int64_t e = 0; e < n_expert; e++) {
        char wn[256], sn[256];
        snprintf(wn, sizeof wn, "%s.%d.ffn.experts.%lld.w%d.weight", pfx, il, (long long)e, proj);
        snprintf(sn, sizeof sn, "%s.%d.ffn.experts.%lld.w%d.scale", pfx, il, (long long)e, proj);
        const st_tensor *w = need(p, wn, rows, in / 2, err), *s = w ? need(p, sn, rows, in / 32, err) : NULL;
        if (!s) return -1;
        if (w->dtype != ST_I8 && w->dtype != ST_U8)
            return dsf_seterr(err, "checkpoint: '%s': dtype %s, expected I8 (packed E2M1)", wn, st_dtype_name(w->dtype));
        if (s->dtype != ST_F8_E8M0 && s->dtype != ST_U8)
            return dsf_seterr(err, "checkpoint: '%s': dtype %s, expected F8_E8M0", sn, st_dtype_name(s->dtype));
    }
    o->nbytes = tensor_bytes(o->type, o->ne, o->n_dims);
    return 0;
}

/* The routed experts' GGUF names by projection w1, w2, w3 (the order they are written in). */
static const char *const exp_names[3] = {"ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"};

/* The dense tensors every block has (a main layer, or a DSpark stage: gguf-layout.md §3.2, §4.2):
 * checkpoint pfx.il.* -> blk.gl.*, with E routed experts. */
static int add_block_dense(plan *p, const char *pfx, int il, int gl, int64_t E, char *err) {
    const cfg *c = p->c;
    int64_t D = c->n_embd, H = c->n_head, dh = c->head_dim, mix = (2 + c->hc) * c->hc, ff = c->moe_ff;
    int64_t og_in = H * dh / c->o_groups, og_out = c->o_groups * c->o_lora;
    struct { const char *ck, *g; int64_t d0, d1; bool f32; } t[] = {
        {"attn_norm.weight", "attn_norm.weight", D, -1, false},
        {"ffn_norm.weight", "ffn_norm.weight", D, -1, false},
        {"hc_attn_fn", "hc_attn_fn.weight", mix, c->hc * D, false},
        {"hc_ffn_fn", "hc_ffn_fn.weight", mix, c->hc * D, false},
        {"hc_attn_base", "hc_attn_base.weight", mix, -1, false},
        {"hc_ffn_base", "hc_ffn_base.weight", mix, -1, false},
        {"hc_attn_scale", "hc_attn_scale.weight", 3, -1, false},
        {"hc_ffn_scale", "hc_ffn_scale.weight", 3, -1, false},
        {"attn.attn_sink", "attn_sinks.weight", H, -1, false},
        {"attn.wq_a.weight", "attn_q_a.weight", c->q_lora, D, false},
        {"attn.q_norm.weight", "attn_q_a_norm.weight", c->q_lora, -1, false},
        {"attn.wq_b.weight", "attn_q_b.weight", H * dh, c->q_lora, false},
        {"attn.wkv.weight", "attn_kv.weight", dh, D, false},
        {"attn.kv_norm.weight", "attn_kv_a_norm.weight", dh, -1, false},
        {"attn.wo_a.weight", "attn_output_a.weight", og_out, og_in, false},
        {"attn.wo_b.weight", "attn_output_b.weight", D, og_out, false},
        {"ffn.gate.weight", "ffn_gate_inp.weight", E, D, true},
        {"ffn.gate.bias", "exp_probs_b.bias", E, -1, false},
        {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight", ff * c->n_shared, D, false},
        {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight", D, ff * c->n_shared, false},
        {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight", ff * c->n_shared, D, false},
    };
    char ck[256], g[GGUF_MAX_NAME];
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        snprintf(ck, sizeof ck, "%s.%d.%s", pfx, il, t[k].ck);
        snprintf(g, sizeof g, "blk.%d.%s", gl, t[k].g);
        if (add_dense(p, ck, g, t[k].d0, t[k].d1, t[k].f32, err)) return -1;
    }
    return 0;
}

static int build_plan(plan *p, char *err) {
    const cfg *c = p->c;
    int64_t D = c->n_embd, V = c->n_vocab, dh = c->head_dim;
    int64_t ff = c->moe_ff, E = c->n_expert, ih = c->idx_heads, id = c->idx_dim;
    /* Routed experts first, as the reference converter writes them (§3.4). */
    for (int il = 0; il < c->n_layer; il++)
        for (int pj = 1; pj <= 3; pj++) {
            char g[GGUF_MAX_NAME];
            snprintf(g, sizeof g, "blk.%d.%s.weight", il, exp_names[pj - 1]);
            if (add_experts(p, "layers", il, pj, g, pj == 2 ? D : ff, pj == 2 ? ff : D, E, err)) return -1;
        }
    if (c->n_eng) {
        otensor *o = plan_add(p, "per_layer_token_embd.weight");
        o->kind = K_ENGRAM;
        o->type = p->f32 ? GGML_TYPE_F32 : GGML_TYPE_BF16;
        /* FP8_R264 holds 256-wide blocks: a narrower table (tiny test models) stays BF16 */
        if (p->native && c->eng_dim % 256 == 0) o->type = DSF_TYPE_FP8R264;
        else if (p->native)
            dsf_log(1, "convert: Engram rows of %lld values are not whole FP8_R264 blocks (256): "
                    "per_layer_token_embd.weight stays BF16", (long long)c->eng_dim);
        o->n_dims = 2;
        o->ne[0] = c->eng_dim;
        o->ne[1] = 0;
        o->ne[2] = o->ne[3] = 1;
        o->order = -1;
        p->eng_w = dsf_xcalloc((size_t)c->n_eng, sizeof *p->eng_w);
        p->eng_s = dsf_xcalloc((size_t)c->n_eng, sizeof *p->eng_s);
        for (int64_t e = 0; e < c->n_eng; e++) {
            char wn[128], sn[128];
            snprintf(wn, sizeof wn, "layers.%u.engram.embed.weight", c->eng_layers[e]);
            snprintf(sn, sizeof sn, "layers.%u.engram.embed.scale", c->eng_layers[e]);
            const st_tensor *w = st_find(p->ck, wn);
            if (w && w->n_dims == 2 && w->shape[0] != (int64_t)c->eng_rows[e])
                return dsf_seterr(err, "checkpoint: '%s': %lld rows, config says %llu", wn, (long long)w->shape[0],
                                  (unsigned long long)c->eng_rows[e]);
            w = need(p, wn, (int64_t)c->eng_rows[e], c->eng_dim, err);
            const st_tensor *s = w ? need(p, sn, (int64_t)c->eng_rows[e], c->eng_dim / 32, err) : NULL;
            if (!s) return -1;
            if (w->dtype != ST_F8_E4M3 || (s->dtype != ST_F8_E8M0 && s->dtype != ST_U8))
                return dsf_seterr(err, "checkpoint: '%s' must be F8_E4M3 with an F8_E8M0 scale", wn);
            p->eng_w[e] = w;
            p->eng_s[e] = s;
            o->ne[1] += w->shape[0];
        }
        o->nbytes = tensor_bytes(o->type, o->ne, o->n_dims);
    }
    /* Everything else; sorted into checkpoint order afterwards. */
    if (add_dense(p, "embed.weight", "token_embd.weight", V, D, false, err) ||
        add_dense(p, "norm.weight", "output_norm.weight", D, -1, false, err) ||
        add_dense(p, "head.weight", "output.weight", V, D, false, err))
        return -1;
    for (int il = 0; il < c->n_layer; il++) {
        if (add_block_dense(p, "layers", il, il, E, err)) return -1;
        char ck[256], g[GGUF_MAX_NAME];
        /* Optional on every layer (TENSOR_NOT_REQUIRED in the loader). */
        snprintf(ck, sizeof ck, "layers.%d.ffn.gate.bias_vl", il);
        if (st_find(p->ck, ck)) {
            snprintf(g, sizeof g, "blk.%d.exp_probs_b_vl.bias", il);
            if (add_dense(p, ck, g, E, -1, false, err)) return -1;
        }
        bool kv_owner = c->kv_src[il] == il, idx_owner = c->topk_src[il] == il;
        struct { bool on; const char *ck, *g; int64_t d0, d1; } r[] = {
            {kv_owner, "attn.compressor.wkv.weight", "attn_compressor_kv.weight", dh, D},
            {kv_owner && c->ratio[il] > 1, "attn.compressor.wgate.weight", "attn_compressor_gate.weight", dh, D},
            {kv_owner, "attn.compressor.norm.weight", "attn_compressor_norm.weight", dh, -1},
            {kv_owner, "attn.indexer.wk.weight", "indexer.attn_k.weight", id, dh},
            {kv_owner, "attn.indexer.k_norm.weight", "indexer.k_norm.weight", id, -1},
            {idx_owner, "attn.indexer.wq_b.weight", "indexer.attn_q_b.weight", ih * id, c->q_lora},
            {idx_owner, "attn.indexer.weights_proj.weight", "indexer.proj.weight", ih, D},
        };
        for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
            if (!r[k].on) continue;
            snprintf(ck, sizeof ck, "layers.%d.%s", il, r[k].ck);
            snprintf(g, sizeof g, "blk.%d.%s", il, r[k].g);
            if (add_dense(p, ck, g, r[k].d0, r[k].d1, false, err)) return -1;
        }
        bool eng = false;
        for (int64_t e = 0; e < c->n_eng; e++) eng |= (int64_t)c->eng_layers[e] == il;
        if (eng) {
            int64_t ncol = (c->ngram - 1) * c->eng_heads;
            snprintf(ck, sizeof ck, "layers.%d.engram.wkv.weight", il);
            snprintf(g, sizeof g, "blk.%d.engram_kv.weight", il);
            if (add_dense(p, ck, g, (c->hc + 1) * D, ncol * c->eng_dim, false, err)) return -1;
            char kn[256];
            snprintf(ck, sizeof ck, "layers.%d.engram.q_weight", il);
            snprintf(kn, sizeof kn, "layers.%d.engram.k_weight", il);
            const st_tensor *q = need(p, ck, c->hc, D, err), *k = q ? need(p, kn, c->hc, D, err) : NULL;
            if (!k) return -1;
            if (!is_float(q->dtype) || !is_float(k->dtype))
                return dsf_seterr(err, "checkpoint: engram q/k weights of layer %d must be BF16/F16/F32", il);
            snprintf(g, sizeof g, "blk.%d.engram_gate.weight", il);
            otensor *o = plan_add(p, g);
            o->kind = K_GATE;
            o->type = GGML_TYPE_F32;
            o->w = q;
            o->s = k;
            o->order = ck_index(p, q);
            o->n_dims = 2;
            o->ne[0] = D;
            o->ne[1] = c->hc;
            o->ne[2] = o->ne[3] = 1;
            o->nbytes = tensor_bytes(o->type, o->ne, o->n_dims);
        }
    }
    /* Extra tensors make the loader fail ("wrong number of tensors"), so refuse them. The
     * DSpark stages and the vision tower go to other files (--dspark, --mmproj). */
    for (int i = 0; i < st_count(p->ck); i++) {
        const char *n = st_at(p->ck, i)->name;
        if (p->used[i] || !strncmp(n, "mtp.", 4) || !strncmp(n, "vision.", 7) || !strncmp(n, "aligner.", 8) ||
            !strcmp(n, "image_start") || !strcmp(n, "image_end") || !strcmp(n, "image_newline"))
            continue;
        return dsf_seterr(err, "checkpoint: unexpected tensor '%s' (not part of this config's deepseek41 layout)", n);
    }
    return 0;
}

/* The DSpark draft (gguf-layout.md §4.1-§4.2): stages mtp.S -> blk.S with E' experts, the
 * global tensors, bias_vl dropped; every other mtp.* tensor (a stage >= S) is refused, and
 * the main model's tensors are ignored (the draft shares them at runtime). */
static int build_plan_dspark(plan *p, char *err) {
    const cfg *c = p->c;
    int64_t D = c->n_embd, V = c->n_vocab, ff = c->moe_ff, R = c->ds_rank, E = c->ds_expert;
    char ck[256], g[GGUF_MAX_NAME];
    for (int s = 0; s < c->ds_stages; s++)
        for (int pj = 1; pj <= 3; pj++) {
            snprintf(g, sizeof g, "blk.%d.%s.weight", s, exp_names[pj - 1]);
            if (add_experts(p, "mtp", s, pj, g, pj == 2 ? D : ff, pj == 2 ? ff : D, E, err)) return -1;
        }
    for (int s = 0; s < c->ds_stages; s++) {
        if (add_block_dense(p, "mtp", s, s, E, err)) return -1;
        snprintf(ck, sizeof ck, "mtp.%d.ffn.gate.bias_vl", s);
        const st_tensor *vl = st_find(p->ck, ck);
        if (vl) p->used[ck_index(p, vl)] = true;
    }
    int last = (int)c->ds_stages - 1;
    char nrm[64], w1[64], w2[64], cp[64];
    snprintf(nrm, sizeof nrm, "mtp.%d.norm.weight", last);
    snprintf(w1, sizeof w1, "mtp.%d.markov_head.embed.weight", last);
    snprintf(w2, sizeof w2, "mtp.%d.markov_head.head.weight", last);
    snprintf(cp, sizeof cp, "mtp.%d.confidence_head.proj.weight", last);
    if (add_dense(p, "mtp.0.main_proj.weight", "fc.weight", D, c->ds_n_targets * D, false, err) ||
        add_dense(p, "mtp.0.main_norm.weight", "enc.output_norm.weight", D, -1, false, err) ||
        add_dense(p, nrm, "output_norm.weight", D, -1, false, err) ||
        add_dense(p, w1, "markov_w1.weight", V, R, false, err) ||
        add_dense(p, w2, "markov_w2.weight", V, R, false, err) ||
        add_dense(p, cp, "conf_proj.weight", 1, D + R, true, err))
        return -1;
    for (int i = 0; i < st_count(p->ck); i++) {
        const char *n = st_at(p->ck, i)->name;
        if (p->used[i] || strncmp(n, "mtp.", 4)) continue;
        char *end;
        long st = strtol(n + 4, &end, 10);
        if (end != n + 4 && st >= c->ds_stages)
            return dsf_seterr(err, "checkpoint: unexpected DSpark stage %ld in '%s' (num_nextn_predict_layers = %lld)",
                              st, n, (long long)c->ds_stages);
        return dsf_seterr(err, "checkpoint: unexpected tensor '%s' (not part of the DSpark draft layout)", n);
    }
    return 0;
}

/* Experts and the Engram table first (order -1 keeps their relative order), then the rest
 * in checkpoint order. */
static int cmp_order(const void *a, const void *b) {
    const otensor *x = a, *y = b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* ================================================================ streaming */

typedef struct {
    gguf_writer *w;
    dsf_pool *pool;
    dsf_progress bar;
    int64_t bo, bi;              /* FP8 weight block */
    float lut[256];              /* e4m3 byte -> f32 */
    uint8_t *src, *src2, *dst;   /* chunk buffers */
    uint64_t src_cap, src2_cap, dst_cap;
} stream;

static int out(stream *s, const void *p, uint64_t n, char *err) {
    if (gguf_writer_write(s->w, p, n, err)) return -1;
    progress_add(&s->bar, n);
    return 0;
}

static void *grow(uint8_t **b, uint64_t *cap, uint64_t n) {
    if (n > *cap) {
        free(*b);
        *b = dsf_xmalloc((size_t)n);
        *cap = n;
    }
    return *b;
}

static void put_val(uint8_t *dst, int64_t i, float v, bool f32) {
    if (f32) memcpy(dst + 4 * i, &v, 4);
    else {
        uint16_t h = f32_to_bf16(v);
        memcpy(dst + 2 * i, &h, 2);
    }
}

static float src_val(const uint8_t *src, int dt, int64_t i) {
    uint16_t h;
    float f;
    switch (dt) {
    case ST_BF16: memcpy(&h, src + 2 * i, 2); return bf16_to_f32(h);
    case ST_F16: memcpy(&h, src + 2 * i, 2); return f16_to_f32(h);
    default: memcpy(&f, src + 4 * i, 4); return f;
    }
}

static int write_copy(stream *s, const st_checkpoint *ck, const otensor *o, char *err) {
    const st_tensor *t = o->w;
    uint32_t es = st_dtype_size(t->dtype);
    bool f32 = o->type == GGML_TYPE_F32, same = (f32 && t->dtype == ST_F32) || (!f32 && t->dtype == ST_BF16);
    uint64_t step = CHUNK_BYTES / 4, nel = o->nel ? o->nel : t->nelem;
    for (uint64_t i0 = 0; i0 < nel; i0 += step) {
        uint64_t n = nel - i0 < step ? nel - i0 : step;
        uint8_t *src = grow(&s->src, &s->src_cap, n * es);
        if (st_read(ck, t, (o->el0 + i0) * es, n * es, src, err)) return -1;
        if (same) {
            if (out(s, src, n * es, err)) return -1;
            continue;
        }
        uint8_t *dst = grow(&s->dst, &s->dst_cap, n * 4);
        for (uint64_t i = 0; i < n; i++) put_val(dst, (int64_t)i, src_val(src, t->dtype, (int64_t)i), f32);
        if (out(s, dst, n * (f32 ? 4 : 2), err)) return -1;
    }
    return 0;
}

static int write_gate(stream *s, const st_checkpoint *ck, const otensor *o, char *err) {
    uint64_t n = o->w->nelem;
    uint8_t *q = grow(&s->src, &s->src_cap, n * 4), *k = grow(&s->src2, &s->src2_cap, n * 4);
    if (st_read(ck, o->w, 0, o->w->nbytes, q, err) || st_read(ck, o->s, 0, o->s->nbytes, k, err)) return -1;
    float *dst = grow(&s->dst, &s->dst_cap, n * 4);
    /* bf16 x bf16 is exact in f32 (§3.2: engram_gate = q_weight * k_weight) */
    for (uint64_t i = 0; i < n; i++) dst[i] = src_val(q, o->w->dtype, (int64_t)i) * src_val(k, o->s->dtype, (int64_t)i);
    return out(s, dst, n * 4, err);
}

/* The checks of a chunk of source bytes (at: the chunk's first element in the tensor). */
typedef int (*byte_check)(const uint8_t *b, uint64_t n, uint64_t at, const char *name, char *err);

/* E8M0 exponents outside [3, 246] would make e4m3 x 2^(e-127) inexact in BF16 (§3.3); the native
 * types refuse them too, so that a native file holds the seed layout's values. */
static int check_e8m0(const uint8_t *e, uint64_t n, uint64_t at, const char *name, char *err) {
    for (uint64_t i = 0; i < n; i++)
        if (e[i] < 3 || e[i] > 246)
            return dsf_seterr(err, "%s: E8M0 scale exponents outside [3, 246] (found %u at element %llu), the "
                              "dequantized values would not be exact", name, e[i], (unsigned long long)(at + i));
    return 0;
}

typedef struct {
    const uint8_t *w, *s;   /* weight rows of this chunk; the whole scale tensor */
    const float *lut;       /* e4m3 byte -> f32 */
    uint8_t *dst;
    int64_t in, bo, bi, s_cols, row0;
    bool f32;
} fp8_job;

static void fp8_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const fp8_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *srow = j->s + (j->row0 + r) / j->bo * j->s_cols;
        for (int64_t b0 = 0; b0 < j->in; b0 += j->bi) {
            /* W[o][i] = e4m3(W[o][i]) * 2^(S[o/bo][i/bi] - 127), exact in f32 and in bf16 */
            float sc = ldexpf(1.0f, (int)srow[b0 / j->bi] - 127);
            int64_t b1 = b0 + j->bi < j->in ? b0 + j->bi : j->in;
            for (int64_t i = b0; i < b1; i++) put_val(j->dst, r * j->in + i, j->lut[j->w[r * j->in + i]] * sc, j->f32);
        }
    }
}

/* e4m3fn 0x7F/0xFF are NaN: never valid weight data, and they would propagate silently. */
static int check_e4m3(const uint8_t *b, uint64_t n, uint64_t at, const char *name, char *err) {
    for (uint64_t i = 0; i < n; i++)
        if ((b[i] & 0x7F) == 0x7F)
            return dsf_seterr(err, "%s: FP8 NaN byte 0x%02X at element %llu", name, b[i], (unsigned long long)(at + i));
    return 0;
}

/* A source tensor's bytes as they are, checked a chunk at a time. */
static int copy_checked(stream *s, const st_checkpoint *ck, const st_tensor *t, byte_check check, char *err) {
    for (uint64_t off = 0; off < t->nbytes; off += CHUNK_BYTES) {
        uint64_t n = t->nbytes - off < CHUNK_BYTES ? t->nbytes - off : CHUNK_BYTES;
        uint8_t *b = grow(&s->src, &s->src_cap, n);
        if (st_read(ck, t, off, n, b, err) || check(b, n, off, t->name, err) || out(s, b, n, err)) return -1;
    }
    return 0;
}

/* FP8_B32 (docs/FORMAT.md): the e4m3 bytes [rows][in] as the checkpoint stores them, then its
 * E8M0 grid [ceil(rows/32)][ceil(in/32)] (its shape checked by add_dense). */
static int write_fp8_native(stream *s, const st_checkpoint *ck, const otensor *o, char *err) {
    return copy_checked(s, ck, o->w, check_e4m3, err) || copy_checked(s, ck, o->s, check_e8m0, err) ? -1 : 0;
}

static int write_fp8(stream *s, const st_checkpoint *ck, const otensor *o, char *err) {
    const st_tensor *w = o->w, *sc = o->s;
    int64_t rows = w->shape[0], in = w->shape[1];
    uint8_t *scale = grow(&s->src2, &s->src2_cap, sc->nbytes);
    if (st_read(ck, sc, 0, sc->nbytes, scale, err) || check_e8m0(scale, sc->nbytes, 0, sc->name, err)) return -1;
    int64_t step = (int64_t)(CHUNK_BYTES / (uint64_t)in);
    if (step < 1) step = 1;
    bool f32 = o->type == GGML_TYPE_F32;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
        int64_t n = rows - r0 < step ? rows - r0 : step;
        uint64_t nb = (uint64_t)(n * in);
        uint8_t *src = grow(&s->src, &s->src_cap, nb), *dst = grow(&s->dst, &s->dst_cap, nb * 4);
        if (st_read(ck, w, (uint64_t)(r0 * in), nb, src, err) || check_e4m3(src, nb, (uint64_t)(r0 * in), w->name, err))
            return -1;
        fp8_job j = {src, scale, s->lut, dst, in, s->bo, s->bi, sc->shape[1], r0, f32};
        dsf_parallel_for(s->pool, n, 16, fp8_rows, &j);
        if (out(s, dst, nb * (f32 ? 4 : 2), err)) return -1;
    }
    return 0;
}

static int write_mxfp4(stream *s, const st_checkpoint *ck, const otensor *o, char *err) {
    int64_t in = o->ne[0], rows = o->ne[1], ob = in / 32 * 17;
    for (int64_t e = 0; e < o->ne[2]; e++) {
        char wn[256], sn[256];
        snprintf(wn, sizeof wn, "%s.%d.ffn.experts.%lld.w%d.weight", o->pfx, o->layer, (long long)e, o->proj);
        snprintf(sn, sizeof sn, "%s.%d.ffn.experts.%lld.w%d.scale", o->pfx, o->layer, (long long)e, o->proj);
        const st_tensor *w = st_find(ck, wn), *sc = st_find(ck, sn);
        DSF_ASSERT(w && sc); /* checked by build_plan */
        int64_t step = (int64_t)(CHUNK_BYTES / (uint64_t)(in / 2));
        if (step < 1) step = 1;
        for (int64_t r0 = 0; r0 < rows; r0 += step) {
            int64_t n = rows - r0 < step ? rows - r0 : step;
            uint8_t *src = grow(&s->src, &s->src_cap, (uint64_t)(n * in / 2));
            uint8_t *scl = grow(&s->src2, &s->src2_cap, (uint64_t)(n * in / 32));
            uint8_t *dst = grow(&s->dst, &s->dst_cap, (uint64_t)(n * ob));
            if (st_read(ck, w, (uint64_t)(r0 * in / 2), (uint64_t)(n * in / 2), src, err) ||
                st_read(ck, sc, (uint64_t)(r0 * in / 32), (uint64_t)(n * in / 32), scl, err))
                return -1;
            /* codes and E8M0 bytes unchanged; only the nibble pairing changes (§3.3) */
            for (int64_t r = 0; r < n; r++) mxfp4_repack_row(src + r * in / 2, scl + r * in / 32, in, dst + r * ob);
            if (out(s, dst, (uint64_t)(n * ob), err)) return -1;
        }
    }
    return 0;
}

typedef struct {
    const uint8_t *q, *e;
    const float *lut;
    uint8_t *dst;
    int64_t d;
    bool f32;
} eng_job;

static void eng_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const eng_job *j = ctx;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < j->d / 32; b++) {
            /* v = e4m3(q) * 2^(s[i/32] - 127), computed in f32, rounded to bf16 (exact) */
            float sc = ldexpf(1.0f, (int)j->e[r * (j->d / 32) + b] - 127);
            for (int64_t i = 32 * b; i < 32 * b + 32; i++) put_val(j->dst, r * j->d + i, j->lut[j->q[r * j->d + i]] * sc, j->f32);
        }
}

/* n Engram rows of d values as FP8_R264 blocks (docs/FORMAT.md): per 256 values, their 256
 * e4m3 bytes then their 8 E8M0 bytes, both as the checkpoint stores them. */
static void eng_r264(const uint8_t *q, const uint8_t *ex, int64_t n, int64_t d, uint8_t *dst) {
    for (int64_t b = 0; b < n * d / 256; b++, dst += 264) {
        memcpy(dst, q + 256 * b, 256);
        memcpy(dst + 256, ex + 8 * b, 8);
    }
}

static int write_engram(stream *s, const st_checkpoint *ck, const plan *p, const otensor *o, char *err) {
    int64_t d = o->ne[0];
    bool f32 = o->type == GGML_TYPE_F32, r264 = o->type == DSF_TYPE_FP8R264;
    int64_t step = (int64_t)(CHUNK_BYTES / (uint64_t)d);
    if (step > (1 << 18)) step = 1 << 18;
    for (int64_t e = 0; e < p->c->n_eng; e++) {
        const st_tensor *w = p->eng_w[e], *sc = p->eng_s[e];
        int64_t rows = w->shape[0];
        for (int64_t r0 = 0; r0 < rows; r0 += step) {
            int64_t n = rows - r0 < step ? rows - r0 : step;
            uint64_t nb = (uint64_t)(n * d), ns = (uint64_t)(n * d / 32);
            uint8_t *q = grow(&s->src, &s->src_cap, nb), *ex = grow(&s->src2, &s->src2_cap, ns);
            uint8_t *dst = grow(&s->dst, &s->dst_cap, nb * 4);
            if (st_read(ck, w, (uint64_t)(r0 * d), nb, q, err) || st_read(ck, sc, (uint64_t)(r0 * d / 32), ns, ex, err) ||
                check_e8m0(ex, ns, (uint64_t)(r0 * d / 32), sc->name, err) || check_e4m3(q, nb, (uint64_t)(r0 * d), w->name, err))
                return -1;
            if (r264) {
                eng_r264(q, ex, n, d, dst);
                if (out(s, dst, nb / 256 * 264, err)) return -1;
            } else {
                eng_job j = {q, ex, s->lut, dst, d, f32};
                dsf_parallel_for(s->pool, n, 256, eng_rows, &j);
                if (out(s, dst, nb * (f32 ? 4 : 2), err)) return -1;
            }
            /* ~200 GB stream once: drop the consumed pages from the page cache */
            st_release(ck, w, (uint64_t)(r0 * d), nb);
            st_release(ck, sc, (uint64_t)(r0 * d / 32), ns);
        }
    }
    return 0;
}

/* ================================================================ the plan's interface */

tensor_plan *tensor_plan_new(const cfg *c, const st_checkpoint *ck, bool f32, bool native) {
    plan *p = dsf_xcalloc(1, sizeof *p);
    p->c = c;
    p->ck = ck;
    p->f32 = f32;
    p->native = native;
    p->used = dsf_xcalloc((size_t)st_count(ck) + 1, sizeof *p->used);
    return p;
}

int tensor_plan_add_rows(tensor_plan *p, const char *ckname, int64_t d0, int64_t d1, int64_t row0, int64_t rows,
                         const char *gname, uint32_t type, uint32_t n_dims, const int64_t *ne, char *err) {
    const st_tensor *t = need(p, ckname, d0, d1, err);
    if (!t) return -1;
    if (!is_float(t->dtype))
        return dsf_seterr(err, "checkpoint: tensor '%s': dtype %s, expected BF16, F16 or F32", ckname,
                          st_dtype_name(t->dtype));
    const int64_t row_el = d1 < 0 ? 1 : d1;
    if (rows <= 0) row0 = 0, rows = d0;
    otensor *o = plan_add(p, gname);
    o->kind = K_COPY;
    o->type = type;
    o->w = t;
    o->order = ck_index(p, t);
    o->n_dims = n_dims;
    int64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        o->ne[d] = d < n_dims ? ne[d] : 1;
        n *= o->ne[d];
    }
    DSF_ASSERT((type == GGML_TYPE_F32 || type == GGML_TYPE_BF16) && row0 >= 0 && row0 + rows <= d0 && n == rows * row_el);
    o->el0 = (uint64_t)(row0 * row_el);
    o->nel = (uint64_t)n;
    o->nbytes = tensor_bytes(o->type, o->ne, o->n_dims);
    return 0;
}

bool tensor_plan_uses(const tensor_plan *p, int i) { return i >= 0 && i < st_count(p->ck) && p->used[i]; }

void tensor_plan_order(tensor_plan *p) {
    for (int i = 0; i < p->n; i++) p->t[i].seq = i;
    qsort(p->t, (size_t)p->n, sizeof *p->t, cmp_order);
}

tensor_plan *tensor_plan_build(const cfg *c, const st_checkpoint *ck, bool f32, bool native, char *err) {
    plan *p = tensor_plan_new(c, ck, f32, native);
    if (c->dspark ? build_plan_dspark(p, err) : build_plan(p, err)) {
        tensor_plan_free(p);
        return NULL;
    }
    tensor_plan_order(p);
    return p;
}

int tensor_plan_declare(const tensor_plan *p, gguf_writer *w, uint64_t *total, char *err) {
    *total = 0;
    for (int i = 0; i < p->n; i++) {
        if (gguf_writer_tensor(w, p->t[i].name, p->t[i].type, p->t[i].n_dims, p->t[i].ne, err)) return -1;
        *total += p->t[i].nbytes;
    }
    return 0;
}

int tensor_plan_write(const tensor_plan *p, gguf_writer *w, uint64_t total, int threads, bool progress_bar,
                      char *err) {
    const st_checkpoint *ck = p->ck;
    stream s;
    memset(&s, 0, sizeof s);
    int rc = -1;
    s.w = w;
    s.pool = dsf_pool_new(threads);
    s.bo = p->c->bo;
    s.bi = p->c->bi;
    for (int i = 0; i < 256; i++) s.lut[i] = e4m3_to_f32((uint8_t)i);
    progress_start(&s.bar, total, progress_bar);
    for (int i = 0; i < p->n; i++) {
        const otensor *t = &p->t[i];
        int r;
        switch (t->kind) {
        case K_COPY: r = write_copy(&s, ck, t, err); break;
        case K_FP8: r = write_fp8(&s, ck, t, err); break;
        case K_FP8N: r = write_fp8_native(&s, ck, t, err); break;
        case K_MXFP4: r = write_mxfp4(&s, ck, t, err); break;
        case K_ENGRAM: r = write_engram(&s, ck, p, t, err); break;
        default: r = write_gate(&s, ck, t, err); break;
        }
        if (r) {
            dsf_prefixerr(err, "writing '%s'", t->name);
            goto done;
        }
    }
    if (gguf_writer_finish(w, err)) goto done;
    rc = 0;
done:
    progress_end(&s.bar, rc == 0);
    dsf_pool_free(s.pool);
    free(s.src);
    free(s.src2);
    free(s.dst);
    return rc;
}

void tensor_plan_free(tensor_plan *p) {
    if (!p) return;
    free(p->t);
    free(p->used);
    free(p->eng_w);
    free(p->eng_s);
    free(p);
}
