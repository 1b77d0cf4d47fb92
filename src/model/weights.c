/* weights.c: binds every deepseek41 tensor by name (gguf-layout.md §3.2), checking dtype and
 * shape, and refuses files with missing or extra tensors (rule S14). Matrices are views into
 * the mapping (never copied); only small vectors (norms, sinks, biases, hc base/scale, Engram
 * gate) and the hc mix matrices are widened to fp32 copies. No tensor data is read except
 * those.
 *
 * Types (issue 33): every tensor may hold any type ggml_type_supported() reports, whatever
 * the converter or llama-quantize would put there:
 *   - matrices read by the kernels (routed and shared experts, the attention, compressor,
 *     indexer and Engram projections, the router, the LM head, the token embedding and the
 *     Engram table, both read a row at a time through dequant_row) stay in their file type:
 *     the kernels dequantize a row and dot it in fp32 (the reference numerics of a quantized
 *     weight);
 *   - tensors the engine uses as fp32 vectors (norms, sinks, biases, hc base/scale and
 *     engram_gate: the converter and llama-quantize keep them F32, the seed's graph casts a
 *     quantized engram_gate to F32) are dequantized once at load (bind_vec);
 *   - the hc mix matrices (hc_attn_fn, hc_ffn_fn: F32 from the converter, quantized by
 *     llama-quantize like any 2-D weight) are widened to fp32 at load when they are not F32:
 *     24 rows, the size the converter's F32 file already has, and rows of hc * n_embd (20480
 *     on the real model) that are longer than the kernels' scalar twins take in a block type.
 * The row length of each tensor is a whole number of its type's blocks: gguf.c refuses any
 * other ne0 naming the tensor, and wo_a's re-viewed rows are checked here.
 * DSF_TYPE_FP8B32 (docs/FORMAT.md: e4m3 rows, then a 32x32 scale grid shared by 32 rows) is a
 * matrix type, not a row type: only the 2-D matrices the kernels read through a dsf_wmat take
 * it (scales = data + n_out * n_in; the hc mixes are widened to fp32 through it); the token
 * embedding (read a row at a time by dequant_row), stacked experts and vectors refuse it, and so
 * does a file that lacks
 * dsflash.native_version (weights_native_version). */
#include "model/model.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const gguf_file *f;
    bool *used;
    char *err;
} binder;

static const gguf_tensor *find(binder *b, const char *name, bool required) {
    const gguf_tensor *t = gguf_find_tensor(b->f, name);
    if (!t) {
        if (required) dsf_seterr(b->err, "tensor '%s' not found", name);
        return NULL;
    }
    b->used[t - b->f->tensors] = true;
    return t;
}

static void fmt_ne(char *buf, size_t n, const int64_t *ne, int nd) {
    int o = snprintf(buf, n, "[");
    for (int i = 0; i < nd && o > 0 && (size_t)o < n; i++)
        o += snprintf(buf + o, n - (size_t)o, i ? ", %lld" : "%lld", (long long)ne[i]);
    if (o > 0 && (size_t)o < n) snprintf(buf + o, n - (size_t)o, "]");
}

static int check_shape(binder *b, const gguf_tensor *t, const int64_t *want, int nd) {
    for (int i = 0; i < GGUF_MAX_DIMS; i++) {
        int64_t w = i < nd ? want[i] : 1;
        if (t->ne[i] != w) {
            char a[96], g[96];
            fmt_ne(a, sizeof a, want, nd);
            fmt_ne(g, sizeof g, t->ne, (int)t->n_dims);
            return dsf_seterr(b->err, "tensor '%s' has wrong shape; expected %s, got %s", t->name, a, g);
        }
    }
    return 0;
}

static int check_type(binder *b, const gguf_tensor *t) {
    if (t->type == DSF_TYPE_FP8B32)
        return dsf_seterr(b->err, "tensor '%s': type FP8_B32 is for 2-D dense matrices read by the matmul kernels, "
                          "not for this tensor", t->name);
    if (!ggml_type_supported(t->type))
        return dsf_seterr(b->err, "tensor '%s': type %s (%u) is not supported by dsflash", t->name,
                          ggml_type_name(t->type), t->type);
    return 0;
}

/* A matrix [n_out][n_in] (GGUF ne {n_in, n_out} or, for stacked experts, {n_in, n_out, n_e}). */
static int bind_mat(binder *b, dsf_wmat *m, const char *name, int64_t n_in, int64_t n_out, int64_t n_stack,
                    bool required) {
    memset(m, 0, sizeof *m);
    const gguf_tensor *t = find(b, name, required);
    if (!t) return required ? -1 : 0;
    int64_t want[3] = {n_in, n_out, n_stack};
    if (check_shape(b, t, want, n_stack > 1 ? 3 : 2) < 0) return -1;
    bool fp8 = t->type == DSF_TYPE_FP8B32 && n_stack == 1 && strcmp(name, "token_embd.weight");
    if (!fp8 && check_type(b, t) < 0) return -1;
    m->type = t->type;
    m->n_in = n_in;
    m->n_out = n_out;
    m->row_bytes = t->row_bytes;
    m->data = t->data;
    if (fp8) m->scales = t->data + (uint64_t)n_out * (uint64_t)n_in; /* gguf.c counted the grid in nbytes */
    return 0;
}

/* wo_a in FP8_B32: its grid's 32-row blocks belong to the stored rows, so the re-view must keep
 * them (2-D, rows of gin elements) and each group's o_lora rows must start a block. */
static int check_wo_a_fp8(binder *b, const gguf_tensor *t, int64_t gin, int64_t rows, int64_t o_lora) {
    if (t->n_dims != 2 || t->ne[0] != gin || t->ne[1] != rows)
        return dsf_seterr(b->err, "tensor '%s': FP8_B32 must be stored 2-D as [%lld, %lld] (its scale grid covers "
                          "those rows), got %u dims [%lld, %lld, ...]", t->name, (long long)gin, (long long)rows,
                          t->n_dims, (long long)t->ne[0], (long long)t->ne[1]);
    if (o_lora % 32)
        return dsf_seterr(b->err, "tensor '%s': FP8_B32 needs o_lora (%lld) to be a multiple of 32 (its groups would "
                          "split a 32-row scale block)", t->name, (long long)o_lora);
    return 0;
}

/* A matrix's rows as an fp32 copy owned by w (freed by weights_free); through wmat_dequant_row,
 * which reads an FP8_B32 grid as well as the row types. */
static const float *widen(dsf_weights *w, const dsf_wmat *m) {
    float *c = dsf_xmalloc((size_t)(m->n_in * m->n_out) * sizeof(float));
    for (int64_t r = 0; r < m->n_out; r++) wmat_dequant_row(m, r, c + r * m->n_in);
    w->owned = dsf_xrealloc(w->owned, (size_t)(w->n_owned + 1) * sizeof(void *));
    w->owned[w->n_owned++] = c;
    return c;
}

static int bind_vec(binder *b, dsf_weights *w, fvec *v, const char *name, int64_t n0, int64_t n1, bool required) {
    *v = NULL;
    const gguf_tensor *t = find(b, name, required);
    if (!t) return required ? -1 : 0;
    int64_t want[2] = {n0, n1};
    if (check_shape(b, t, want, n1 > 1 ? 2 : 1) < 0 || check_type(b, t) < 0) return -1;
    if (t->type == GGML_TYPE_F32) { /* used in place: data offsets are 32-byte aligned */
        *v = (const float *)(const void *)t->data;
        return 0;
    }
    const dsf_wmat m = {t->type, n0, n1, t->row_bytes, t->data, NULL};
    *v = widen(w, &m);
    return 0;
}

/* A small matrix the engine reads in fp32 (the hc mixes): bound as bind_mat, then, when its type
 * is not F32, widened once into an owned fp32 copy (see the file header). */
static int bind_mat_f32(binder *b, dsf_weights *w, dsf_wmat *m, const char *name, int64_t n_in, int64_t n_out) {
    if (bind_mat(b, m, name, n_in, n_out, 1, true) < 0) return -1;
    if (m->type == GGML_TYPE_F32) return 0;
    const float *c = widen(w, m);
    *m = (dsf_wmat){GGML_TYPE_F32, n_in, n_out, (uint64_t)n_in * sizeof(float), (const uint8_t *)c, NULL};
    return 0;
}

dsf_wmat wmat_rows(const dsf_wmat *m, int64_t r0, int64_t n_out) {
    dsf_wmat v = *m;
    v.n_out = n_out;
    v.data = m->data + (uint64_t)r0 * m->row_bytes;
    if (m->type == DSF_TYPE_FP8B32) {
        DSF_ASSERT(r0 % 32 == 0);
        v.scales = m->scales + (uint64_t)(r0 / 32) * (uint64_t)((m->n_in + 31) / 32);
    }
    return v;
}

int weights_native_version(const gguf_file *f, uint32_t *version, char *err) {
    *version = 0;
    const gguf_kv *kv = gguf_find_kv(f, DSF_NATIVE_KEY);
    if (kv) {
        if (kv->type != GGUF_VT_UINT32)
            return dsf_seterr(err, "key %s: expected a u32, got %s", DSF_NATIVE_KEY, gguf_vtype_name(kv->type));
        if (kv->u != DSF_NATIVE_VERSION)
            return dsf_seterr(err, "key %s = %llu: this dsflash reads native files of version %u only (docs/FORMAT.md)",
                              DSF_NATIVE_KEY, (unsigned long long)kv->u, DSF_NATIVE_VERSION);
        *version = (uint32_t)kv->u;
        return 0;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (dsf_type_native(f->tensors[i].type))
            return dsf_seterr(err, "tensor '%s' has dsflash's native type %s, but the file has no %s key "
                              "(docs/FORMAT.md)", f->tensors[i].name, ggml_type_name(f->tensors[i].type), DSF_NATIVE_KEY);
    return 0;
}

dsf_wmat wmat_expert(const dsf_wmat *stack, int64_t e) {
    dsf_wmat m = *stack;
    m.data = stack->data + (uint64_t)e * (uint64_t)stack->n_out * stack->row_bytes;
    if (stack->scales) m.scales = stack->scales + (uint64_t)e * (uint64_t)stack->n_out * (stack->row_bytes / 16);
    return m;
}

const char *const tensor_class_names[TC_COUNT] = {
    "routed experts", "shared experts", "dense projections", "hc mixes", "router", "LM head",
    "token embedding", "Engram table", "small vectors"};

tensor_class tensor_class_of(const char *name) {
    static const struct {
        const char *suffix;
        tensor_class c;
    } by_suffix[] = {
        {"_exps.weight", TC_ROUTED},      {"_shexp.weight", TC_SHARED},    {"hc_attn_fn.weight", TC_HC},
        {"hc_ffn_fn.weight", TC_HC},      {"ffn_gate_inp.weight", TC_ROUTER}, {"engram_gate.weight", TC_SMALL},
        {"_norm.weight", TC_SMALL},       {"attn_sinks.weight", TC_SMALL}, {"_base.weight", TC_SMALL},
        {"_scale.weight", TC_SMALL},      {".bias", TC_SMALL},
    };
    if (!strcmp(name, "output.weight")) return TC_HEAD;
    if (!strcmp(name, "token_embd.weight")) return TC_EMBED;
    if (!strcmp(name, "per_layer_token_embd.weight")) return TC_ENGRAM;
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof by_suffix / sizeof by_suffix[0]; i++) {
        const size_t k = strlen(by_suffix[i].suffix);
        if (n >= k && !strcmp(name + n - k, by_suffix[i].suffix)) return by_suffix[i].c;
    }
    return TC_DENSE;
}

void weights_free(dsf_weights *w, const dsf_shape *s) {
    (void)s;
    for (int64_t i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* gguf-layout.md §3.2: exp_probs_b_vl is optional, but on every layer or none (a partial set
 * would route image positions of some layers with the text bias); sets w->vision. */
static int check_vision(dsf_weights *w, const dsf_shape *s, char *err) {
    int64_t n_vl = 0, miss = -1;
    for (int64_t il = 0; il < s->n_layer; il++) {
        if (w->layers[il].exp_bias_vl) n_vl++;
        else if (miss < 0) miss = il;
    }
    if (n_vl && miss >= 0)
        return dsf_seterr(err, "tensor 'blk.%lld.exp_probs_b_vl.bias' not found: the file has the image routing bias "
                               "on %lld of %lld layers (it must be on every layer or none)", (long long)miss,
                          (long long)n_vl, (long long)s->n_layer);
    w->vision = n_vl > 0;
    return 0;
}

int weights_bind(dsf_weights *w, const dsf_shape *s, const gguf_file *f, char *err) {
    memset(w, 0, sizeof *w);
    uint32_t native;
    if (weights_native_version(f, &native, err) < 0) return -1;
    binder bb = {f, dsf_xcalloc((size_t)f->n_tensors + 1, sizeof(bool)), err}, *b = &bb;
    const int64_t D = s->n_embd, H = s->n_head, dh = s->head_dim, hcd = s->hc * D;
    const int64_t mix = (2 + s->hc) * s->hc;
    char nm[GGUF_MAX_NAME + 32];
#define N(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    if (s->dspark) { /* gguf-layout.md §4.1: the draft's own tensors; embedding and head are the main model's */
        if (bind_vec(b, w, &w->output_norm, "output_norm.weight", D, 1, true) < 0 ||
            bind_mat(b, &w->fc, "fc.weight", s->n_feat_in, D, 1, true) < 0 ||
            bind_vec(b, w, &w->enc_norm, "enc.output_norm.weight", D, 1, true) < 0 ||
            bind_mat(b, &w->markov_w1, "markov_w1.weight", s->markov_rank, s->n_vocab, 1, true) < 0 ||
            bind_mat(b, &w->markov_w2, "markov_w2.weight", s->markov_rank, s->n_vocab, 1, true) < 0 ||
            bind_vec(b, w, &w->conf_proj, "conf_proj.weight", D + s->markov_rank, 1, true) < 0)
            goto fail;
        find(b, "conf_proj.bias", false); /* optional (§4.3 loader rules); [R] has no bias */
        find(b, "fc.scale", false);
    } else {
        if (bind_mat(b, &w->tok_embd, "token_embd.weight", D, s->n_vocab, 1, true) < 0) goto fail;
        if (s->n_vocab < 1) {
            dsf_seterr(err, "token_embd.weight has no rows");
            goto fail;
        }
        if (bind_vec(b, w, &w->output_norm, "output_norm.weight", D, 1, true) < 0 ||
            bind_mat(b, &w->output, "output.weight", D, s->n_vocab, 1, true) < 0)
            goto fail;
    }
    if (s->n_engram) {
        const gguf_tensor *t = find(b, "per_layer_token_embd.weight", true);
        if (!t) goto fail;
        if (t->n_dims != 2 || t->ne[0] != s->ple_dim || t->ne[1] < s->ple_rows_needed) {
            if (t->n_dims == 2 && t->ne[0] == s->ple_dim)
                dsf_seterr(err, "%s has %lld rows, too few for the Engram heads (%lld)", t->name, (long long)t->ne[1],
                           (long long)s->ple_rows_needed);
            else {
                int64_t want[2] = {s->ple_dim, s->ple_rows_needed};
                check_shape(b, t, want, 2);
            }
            goto fail;
        }
        if (check_type(b, t) < 0) goto fail;
        w->ple = t;
    }
    w->layers = dsf_xcalloc((size_t)s->n_layer, sizeof(dsf_layer));
    for (int64_t il = 0; il < s->n_layer; il++) {
        dsf_layer *L = &w->layers[il];
        int i = (int)il;
        if (bind_vec(b, w, &L->attn_norm, N("blk.%d.attn_norm.weight", i), D, 1, true) < 0 ||
            bind_vec(b, w, &L->attn_sinks, N("blk.%d.attn_sinks.weight", i), H, 1, true) < 0 ||
            bind_mat(b, &L->wq_a, N("blk.%d.attn_q_a.weight", i), D, s->q_lora, 1, true) < 0 ||
            bind_vec(b, w, &L->q_norm, N("blk.%d.attn_q_a_norm.weight", i), s->q_lora, 1, true) < 0 ||
            bind_mat(b, &L->wq_b, N("blk.%d.attn_q_b.weight", i), s->q_lora, H * dh, 1, true) < 0 ||
            bind_mat(b, &L->wkv, N("blk.%d.attn_kv.weight", i), D, dh, 1, true) < 0 ||
            bind_vec(b, w, &L->kv_norm, N("blk.%d.attn_kv_a_norm.weight", i), dh, 1, true) < 0 ||
            bind_mat(b, &L->wo_b, N("blk.%d.attn_output_b.weight", i), s->o_groups * s->o_lora, D, 1, true) < 0 ||
            bind_mat_f32(b, w, &L->hc_attn_fn, N("blk.%d.hc_attn_fn.weight", i), hcd, mix) < 0 ||
            bind_vec(b, w, &L->hc_attn_base, N("blk.%d.hc_attn_base.weight", i), mix, 1, true) < 0 ||
            bind_vec(b, w, &L->hc_attn_scale, N("blk.%d.hc_attn_scale.weight", i), 3, 1, true) < 0 ||
            bind_mat_f32(b, w, &L->hc_ffn_fn, N("blk.%d.hc_ffn_fn.weight", i), hcd, mix) < 0 ||
            bind_vec(b, w, &L->hc_ffn_base, N("blk.%d.hc_ffn_base.weight", i), mix, 1, true) < 0 ||
            bind_vec(b, w, &L->hc_ffn_scale, N("blk.%d.hc_ffn_scale.weight", i), 3, 1, true) < 0 ||
            bind_mat(b, &L->router, N("blk.%d.ffn_gate_inp.weight", i), D, s->n_expert, 1, true) < 0 ||
            bind_vec(b, w, &L->exp_bias, N("blk.%d.exp_probs_b.bias", i), s->n_expert, 1, true) < 0 ||
            bind_vec(b, w, &L->exp_bias_vl, N("blk.%d.exp_probs_b_vl.bias", i), s->n_expert, 1, false) < 0 ||
            bind_vec(b, w, &L->ffn_norm, N("blk.%d.ffn_norm.weight", i), D, 1, true) < 0 ||
            bind_mat(b, &L->gate_exps, N("blk.%d.ffn_gate_exps.weight", i), D, s->n_ff_exp, s->n_expert, true) < 0 ||
            bind_mat(b, &L->down_exps, N("blk.%d.ffn_down_exps.weight", i), s->n_ff_exp, D, s->n_expert, true) < 0 ||
            bind_mat(b, &L->up_exps, N("blk.%d.ffn_up_exps.weight", i), D, s->n_ff_exp, s->n_expert, true) < 0 ||
            bind_mat(b, &L->gate_sh, N("blk.%d.ffn_gate_shexp.weight", i), D, s->n_ff_exp * s->n_expert_shared, 1,
                     true) < 0 ||
            bind_mat(b, &L->down_sh, N("blk.%d.ffn_down_shexp.weight", i), s->n_ff_exp * s->n_expert_shared, D, 1,
                     true) < 0 ||
            bind_mat(b, &L->up_sh, N("blk.%d.ffn_up_shexp.weight", i), D, s->n_ff_exp * s->n_expert_shared, 1,
                     true) < 0)
            goto fail;
        /* wo_a is re-viewed (TENSOR_ALLOW_RESHAPE): only the element count is fixed, but
         * rows must be the per-group input width so that group g owns rows g*o_lora... */
        {
            const gguf_tensor *t = find(b, N("blk.%d.attn_output_a.weight", i), true);
            const int64_t gin = H * dh / s->o_groups, rows = s->o_groups * s->o_lora;
            if (!t) goto fail;
            if (t->type == DSF_TYPE_FP8B32 ? check_wo_a_fp8(b, t, gin, rows, s->o_lora) < 0 : check_type(b, t) < 0)
                goto fail;
            /* TENSOR_ALLOW_RESHAPE (gguf-layout §3.2, §7.3): only the element count is
             * checked; the contiguous data is re-viewed as rows of gin elements. */
            int64_t nel = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
            if (nel != gin * rows) {
                int64_t want[3] = {gin, s->o_lora, s->o_groups};
                check_shape(b, t, want, 3);
                goto fail;
            }
            if (gin % (int64_t)ggml_blck_size(t->type)) {
                dsf_seterr(err, "tensor '%s': re-viewed rows of %lld elements are not a whole number of %s blocks (%u)",
                           t->name, (long long)gin, ggml_type_name(t->type), ggml_blck_size(t->type));
                goto fail;
            }
            L->wo_a = (dsf_wmat){t->type, gin, rows,
                                 (uint64_t)(gin / ggml_blck_size(t->type)) * ggml_type_size(t->type), t->data, NULL};
            if (t->type == DSF_TYPE_FP8B32) L->wo_a.scales = t->data + (uint64_t)(gin * rows);
        }
        if (s->kv_src[il] == il) {
            if (bind_mat(b, &L->comp_wkv, N("blk.%d.attn_compressor_kv.weight", i), D, dh, 1, true) < 0 ||
                bind_vec(b, w, &L->comp_norm, N("blk.%d.attn_compressor_norm.weight", i), dh, 1, true) < 0 ||
                bind_mat(b, &L->idx_k, N("blk.%d.indexer.attn_k.weight", i), dh, s->idx_dim, 1, true) < 0 ||
                bind_vec(b, w, &L->idx_k_norm, N("blk.%d.indexer.k_norm.weight", i), s->idx_dim, 1, true) < 0)
                goto fail;
            if (s->ratio[il] > 1 &&
                bind_mat(b, &L->comp_wgate, N("blk.%d.attn_compressor_gate.weight", i), D, dh, 1, true) < 0)
                goto fail;
        }
        if (s->topk_src[il] == il) {
            if (bind_mat(b, &L->idx_q_b, N("blk.%d.indexer.attn_q_b.weight", i), s->q_lora, s->idx_heads * s->idx_dim,
                         1, true) < 0 ||
                bind_mat(b, &L->idx_proj, N("blk.%d.indexer.proj.weight", i), D, s->idx_heads, 1, true) < 0)
                goto fail;
        }
        if (s->engram_of[il] >= 0) {
            if (bind_mat(b, &L->engram_kv, N("blk.%d.engram_kv.weight", i), s->ple_cols * s->ple_dim,
                         D * (s->hc + 1), 1, true) < 0 ||
                bind_vec(b, w, &L->engram_gate, N("blk.%d.engram_gate.weight", i), D, s->hc, true) < 0)
                goto fail;
        }
    }
#undef N
    if (check_vision(w, s, err) < 0) goto fail;
    /* S14: no unused tensors. */
    for (uint64_t t = 0; t < f->n_tensors; t++)
        if (!bb.used[t]) {
            dsf_seterr(err, "wrong number of tensors: '%s' is not part of a %s model of this shape",
                       f->tensors[t].name, s->dspark ? "dflash" : "deepseek41");
            goto fail;
        }
    free(bb.used);
    return 0;
fail:
    free(bb.used);
    weights_free(w, s);
    return -1;
}
