/* vision/mmproj.c: the projector GGUF loader (see mmproj.h for what it owns and its
 * invariants). The rules run in a fixed order: identity keys (architecture, projector type),
 * hyperparameters, preprocessing keys, then every tensor by name; the first failing rule
 * decides the message. Tensor data is not read, except the patch embedding (copied, padded). */
#include "vision/mmproj.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const gguf_file *f;
    char *err;
    uint8_t *bound; /* [n_tensors]: bound by a rule (every tensor of the file must be) */
} rd;

static int req_u32(rd *r, const char *key, uint32_t lo, uint32_t hi, int *out) {
    uint32_t v = 0;
    int rc = gguf_get_u32(r->f, key, &v, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in projector: %s", key);
    if (rc < 0) return -1;
    if (v < lo || v > hi) return dsf_seterr(r->err, "key %s = %u: expected %u..%u", key, v, lo, hi);
    *out = (int)v;
    return 0;
}

static int req_str(rd *r, const char *key, const char *want) {
    char *s = NULL;
    int rc = gguf_get_str(r->f, key, &s, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in projector: %s", key);
    if (rc < 0) return -1;
    if (strcmp(s, want)) {
        rc = dsf_seterr(r->err, "key %s = '%.64s': expected '%s'%s", key, s, want,
                        !strcmp(key, "clip.projector_type") ? " (unknown projector type)" : "");
        dsf_err_oneline(r->err);
    }
    free(s);
    return rc;
}

/* image_mean / image_std: FLOAT32 arrays of >= 3 entries (B8); the preprocessing's table
 * normalises with 0.5 (vision.md §2.5), so any other value is refused rather than ignored. */
static int norm_arr(rd *r, const char *key) {
    float *a = NULL;
    uint64_t n = 0;
    int rc = gguf_get_arr_f32(r->f, key, &a, &n, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in projector: %s", key);
    if (rc < 0) return -1;
    if (n < 3) rc = dsf_seterr(r->err, "key %s: image_mean/image_std arrays must have at least 3 elements, got %llu",
                               key, (unsigned long long)n);
    for (uint64_t i = 0; rc == 0 && i < 3; i++)
        if (a[i] != 0.5f)
            rc = dsf_seterr(r->err, "key %s[%llu] = %g: only 0.5 is supported (vision.md §2.5)", key,
                            (unsigned long long)i, (double)a[i]);
    free(a);
    return rc;
}

static int hparams(rd *r, vis_hparams *hp) {
    if (req_str(r, "general.architecture", "clip") || req_str(r, "clip.projector_type", "deepseek41v")) return -1;
    bool b = true, gelu = false, silu = false;
    if (gguf_get_bool(r->f, "clip.has_vision_encoder", &b, r->err) < 0) return -1;
    if (!b) return dsf_seterr(r->err, "key clip.has_vision_encoder is false: the projector has no vision encoder");
    if (gguf_get_bool(r->f, "clip.use_gelu", &gelu, r->err) < 0 || gguf_get_bool(r->f, "clip.use_silu", &silu, r->err) < 0)
        return -1;
    if (gelu && silu) return dsf_seterr(r->err, "keys clip.use_gelu and clip.use_silu: both use_gelu and use_silu are set to true");
    int image_size = 0, min_px = 0;
    if (req_u32(r, "clip.vision.embedding_length", 4, 16384, &hp->n_embd) ||
        req_u32(r, "clip.vision.attention.head_count", 1, 1024, &hp->n_head) ||
        req_u32(r, "clip.vision.feed_forward_length", 1, 65536, &hp->n_ff) ||
        req_u32(r, "clip.vision.block_count", 1, 1024, &hp->n_layer) ||
        req_u32(r, "clip.vision.projection_dim", 1, 65536, &hp->proj_dim) ||
        req_u32(r, "clip.vision.image_size", 1, 1u << 20, &image_size) ||
        req_u32(r, "clip.vision.patch_size", 1, 256, &hp->patch) ||
        req_u32(r, "clip.vision.projector.scale_factor", 1, 16, &hp->merge) ||
        req_u32(r, "clip.vision.image_min_pixels", 0, 1u << 30, &min_px))
        return -1;
    hp->min_pixels = min_px;
    if (hp->n_embd % hp->n_head || (hp->n_embd / hp->n_head) % 4)
        return dsf_seterr(r->err, "keys clip.vision.embedding_length %d / attention.head_count %d: the head width must be "
                                  "a whole multiple of 4 (2-D RoPE, vision.md §3)", hp->n_embd, hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    int rc = gguf_get_f32(r->f, "clip.vision.attention.layer_norm_epsilon", &hp->eps, r->err);
    if (rc == 1) return dsf_seterr(r->err, "key not found in projector: clip.vision.attention.layer_norm_epsilon");
    if (rc < 0) return -1;
    if (!(hp->eps > 0 && hp->eps < 1))
        return dsf_seterr(r->err, "key clip.vision.attention.layer_norm_epsilon = %g: expected 0 < eps < 1", (double)hp->eps);
    return norm_arr(r, "clip.vision.image_mean") || norm_arr(r, "clip.vision.image_std") ? -1 : 0;
}

/* ---- tensors ---- */

/* The tensor of that name, marked bound. */
static const gguf_tensor *find(rd *r, const char *name) {
    const gguf_tensor *t = gguf_find_tensor(r->f, name);
    if (!t) dsf_seterr(r->err, "tensor not found in projector: %s", name);
    else r->bound[t - r->f->tensors] = 1;
    return t;
}

static void fmt_ne(char *b, size_t cap, int nd, const int64_t *ne) {
    int o = snprintf(b, cap, "[");
    for (int i = 0; i < nd && o < (int)cap; i++) o += snprintf(b + o, cap - (size_t)o, i ? ", %lld" : "%lld", (long long)ne[i]);
    if (o < (int)cap) snprintf(b + o, cap - (size_t)o, "]");
}

/* t must have n_dims nd and ne[0..nd) = want. */
static int check_shape(rd *r, const gguf_tensor *t, int nd, const int64_t *want) {
    bool ok = (int)t->n_dims == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->ne[i] == want[i];
    if (ok) return 0;
    char a[96], b[96];
    fmt_ne(a, sizeof a, nd, want);
    fmt_ne(b, sizeof b, (int)t->n_dims, t->ne);
    return dsf_seterr(r->err, "tensor '%s': expected %s (ggml ne), got %s", t->name, a, b);
}

/* A 1-D F32 vector of n values. */
static int vec(rd *r, const char *name, int64_t n, const float **out) {
    const gguf_tensor *t = find(r, name);
    if (!t || check_shape(r, t, 1, &n)) return -1;
    if (t->type != GGML_TYPE_F32)
        return dsf_seterr(r->err, "tensor '%s': type %s, expected F32", name, ggml_type_name(t->type));
    *out = (const float *)(const void *)t->data;
    return 0;
}

/* A 2-D weight [n_out][n_in] (ggml ne {n_in, n_out}), BF16 or F32. */
static int mat(rd *r, const char *name, int64_t n_in, int64_t n_out, dsf_wmat *out) {
    const gguf_tensor *t = find(r, name);
    const int64_t ne[2] = {n_in, n_out};
    if (!t || check_shape(r, t, 2, ne)) return -1;
    if (t->type != GGML_TYPE_BF16 && t->type != GGML_TYPE_F32)
        return dsf_seterr(r->err, "tensor '%s': type %s, expected BF16 or F32", name, ggml_type_name(t->type));
    *out = (dsf_wmat){t->type, n_in, n_out, t->row_bytes, t->data, NULL};
    return 0;
}

static const char *nm(int il, const char *what) {
    static char buf[4][GGUF_MAX_NAME + 16];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "v.blk.%d.%s", il, what);
    return b;
}

static int layer(rd *r, const vis_hparams *hp, int il, vis_layer *l) {
    const int64_t D = hp->n_embd, I = hp->n_ff;
    if (vec(r, nm(il, "ln1.weight"), D, &l->ln1) || vec(r, nm(il, "ln2.weight"), D, &l->ln2)) return -1;
    l->split = !gguf_find_tensor(r->f, nm(il, "attn_qkv.weight")) && gguf_find_tensor(r->f, nm(il, "attn_q.weight"));
    if (!l->split) {
        if (mat(r, nm(il, "attn_qkv.weight"), D, 3 * D, &l->qkv) || vec(r, nm(il, "attn_qkv.bias"), 3 * D, &l->bqkv))
            return -1;
    } else if (mat(r, nm(il, "attn_q.weight"), D, D, &l->q) || vec(r, nm(il, "attn_q.bias"), D, &l->bq) ||
               mat(r, nm(il, "attn_k.weight"), D, D, &l->k) || vec(r, nm(il, "attn_k.bias"), D, &l->bk) ||
               mat(r, nm(il, "attn_v.weight"), D, D, &l->v) || vec(r, nm(il, "attn_v.bias"), D, &l->bv)) {
        return -1;
    }
    return mat(r, nm(il, "attn_out.weight"), D, D, &l->out) || vec(r, nm(il, "attn_out.bias"), D, &l->bout) ||
                   mat(r, nm(il, "ffn_gate.weight"), D, I, &l->gate) || mat(r, nm(il, "ffn_up.weight"), D, I, &l->up) ||
                   mat(r, nm(il, "ffn_down.weight"), I, D, &l->down)
               ? -1
               : 0;
}

/* v.patch_embd.weight {p, p, 3, D} F32: row o of the linear map is its p*p*3 values in
 * (channel, dy, dx) order, the patches' element order (vision.md §2.6); copied with the rows
 * padded to kp (a multiple of 32) so that the fast kernels take it. */
static int patch_embd(rd *r, vis_model *m) {
    const vis_hparams *hp = &m->hp;
    const gguf_tensor *t = find(r, "v.patch_embd.weight");
    const int64_t ne[4] = {hp->patch, hp->patch, 3, hp->n_embd};
    if (!t || check_shape(r, t, 4, ne)) return -1;
    if (t->type != GGML_TYPE_F32)
        return dsf_seterr(r->err, "tensor 'v.patch_embd.weight': type %s, expected F32", ggml_type_name(t->type));
    const int64_t k = 3 * (int64_t)hp->patch * hp->patch, kp = (k + 31) / 32 * 32;
    m->patch_w_data = dsf_aligned_alloc((size_t)(kp * hp->n_embd) * sizeof(float));
    if (!m->patch_w_data) return dsf_seterr(r->err, "out of memory for the patch embedding");
    const float *src = (const float *)(const void *)t->data;
    for (int64_t o = 0; o < hp->n_embd; o++) {
        memcpy(m->patch_w_data + o * kp, src + o * k, (size_t)k * sizeof(float));
        memset(m->patch_w_data + o * kp + k, 0, (size_t)(kp - k) * sizeof(float));
    }
    m->patch_w = (dsf_wmat){GGML_TYPE_F32, kp, hp->n_embd, (uint64_t)kp * sizeof(float),
                            (const uint8_t *)m->patch_w_data, NULL};
    return vec(r, "v.patch_embd.bias", hp->n_embd, &m->patch_b);
}

static int tensors(rd *r, vis_model *m) {
    const vis_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, dim = hp->proj_dim, rr = (int64_t)hp->merge * hp->merge;
    if (patch_embd(r, m)) return -1;
    m->layers = dsf_xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    for (int il = 0; il < hp->n_layer; il++)
        if (layer(r, hp, il, &m->layers[il])) return -1;
    if (vec(r, "v.post_ln.weight", D, &m->post_ln) || mat(r, "mm.1.weight", D * rr, dim, &m->mm1) ||
        vec(r, "mm.1.bias", dim, &m->mm1_b) || mat(r, "mm.2.weight", dim, dim, &m->mm2) ||
        vec(r, "mm.2.bias", dim, &m->mm2_b) || vec(r, "v.token_embd.img_start", dim, &m->img_start) ||
        vec(r, "v.token_embd.img_end", dim, &m->img_end) || vec(r, "v.image_newline", dim, &m->img_newline))
        return -1;
    for (uint64_t i = 0; i < r->f->n_tensors; i++)
        if (!r->bound[i]) {
            dsf_seterr(r->err, "tensor '%s': not a tensor of a deepseek41v projector with %d blocks (%s q/k/v)",
                       r->f->tensors[i].name, hp->n_layer, m->layers[0].split ? "split" : "fused");
            dsf_err_oneline(r->err);
            return -1;
        }
    return 0;
}

static vis_model *finish(gguf_file *f, char *err) {
    if (!f) return NULL;
    vis_model *m = dsf_xcalloc(1, sizeof *m);
    m->f = f;
    rd r = {f, err, dsf_xcalloc(f->n_tensors + 1, 1)};
    int rc = hparams(&r, &m->hp) || tensors(&r, m) ? -1 : 0;
    free(r.bound);
    if (rc) {
        dsf_prefixerr(err, "%s", f->path ? f->path : "projector");
        vis_model_free(m);
        return NULL;
    }
    return m;
}

vis_model *vis_model_open(const char *path, char *err) { return finish(gguf_open(path, err), err); }

vis_model *vis_model_open_mem(const void *data, uint64_t size, const char *name, char *err) {
    return finish(gguf_open_mem(data, size, name, err), err);
}

void vis_model_free(vis_model *m) {
    if (!m) return;
    free(m->patch_w_data);
    free(m->layers);
    gguf_close(m->f);
    free(m);
}
