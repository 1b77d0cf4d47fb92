/* mmproj_layout.c: the deepseek41v projector's keys and tensor list (see mmproj_layout.h).
 *
 * Owns: the key order, names and value types of gguf-layout.md §5.1, and the name map, GGUF shapes,
 * dtype rules and row slices of §5.2 (vision.md §10).
 * Must not: read a checkpoint or config.json, or generate data (convert_mmproj.c and
 * synth_mmproj.c do, from this list).
 * Invariant: 9 * n_layer + 10 tensors; the element count of each equals its source rows'. */
#include "convert/mmproj_layout.h"
#include "base/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mmproj_meta_write(gguf_writer *w, const mmproj_meta *m, char *err) {
    const uint32_t p = m->patch, r = m->merge;
    if (gguf_writer_kv_str(w, "general.architecture", "clip", err) ||
        gguf_writer_kv_str(w, "general.type", "mmproj", err) || gguf_writer_kv_str(w, "general.name", m->name, err) ||
        /* MmprojModel: the converter's ftype, 32 (MOSTLY_BF16) for `auto` on a BF16 checkpoint */
        gguf_writer_kv_u32(w, "general.file_type", m->f32 ? 0 : 32, err) ||
        gguf_writer_kv_bool(w, "clip.has_vision_encoder", true, err) ||
        gguf_writer_kv_u32(w, "clip.vision.projection_dim", m->proj_dim, err) ||
        /* p * r * 16: warm-up only, the planner sizes every image itself (vision.md §2.2) */
        gguf_writer_kv_u32(w, "clip.vision.image_size", p * r * 16, err) ||
        gguf_writer_kv_u32(w, "clip.vision.patch_size", p, err) ||
        gguf_writer_kv_u32(w, "clip.vision.embedding_length", m->n_embd, err) ||
        gguf_writer_kv_u32(w, "clip.vision.feed_forward_length", m->ff, err) ||
        gguf_writer_kv_u32(w, "clip.vision.block_count", m->n_layer, err) ||
        gguf_writer_kv_u32(w, "clip.vision.attention.head_count", m->n_head, err) ||
        gguf_writer_kv_arr(w, "clip.vision.image_mean", GGUF_VT_FLOAT32, m->mean, 3, err) ||
        gguf_writer_kv_arr(w, "clip.vision.image_std", GGUF_VT_FLOAT32, m->std, 3, err) ||
        gguf_writer_kv_str(w, "clip.projector_type", "deepseek41v", err) ||
        /* the PyTorch RMSNorm default of vision.py, not the text model's 1e-20 */
        gguf_writer_kv_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f, err) ||
        gguf_writer_kv_bool(w, "clip.use_silu", true, err) ||
        gguf_writer_kv_u32(w, "clip.vision.projector.scale_factor", r, err) ||
        gguf_writer_kv_u32(w, "clip.vision.image_min_pixels", m->min_pixels, err))
        return -1;
    return gguf_writer_kv_u32(w, "general.quantization_version", 2, err);
}

typedef struct {
    mmproj_tensor *t;
    int n;
    uint32_t dense;  /* the type of the 2-D weights */
} list;

/* Appends GGUF tensor `name` from src rows [row0, row0 + rows) (d1 < 0: a vector of d0). The
 * GGUF shape is {d1, rows} for a matrix, {d0} for a vector: the torch layout read fastest-first. */
static mmproj_tensor *add(list *l, enum mmproj_fill fill, const char *src, int64_t d0, int64_t d1, int64_t row0,
                          int64_t rows, const char *fmt, ...) DSF_PRINTF(8, 9);
static mmproj_tensor *add(list *l, enum mmproj_fill fill, const char *src, int64_t d0, int64_t d1, int64_t row0,
                          int64_t rows, const char *fmt, ...) {
    mmproj_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    snprintf(t->src, sizeof t->src, "%s", src);
    t->src_d0 = d0;
    t->src_d1 = d1;
    t->row0 = row0;
    t->rows = rows;
    t->fill = fill;
    t->fan_in = d1 < 0 ? 1 : d1;
    t->n_dims = d1 < 0 ? 1 : 2;
    t->ne[0] = d1 < 0 ? d0 : d1;
    t->ne[1] = d1 < 0 ? 1 : (rows ? rows : d0);
    t->ne[2] = t->ne[3] = 1;
    /* §5.2: 1-D tensors F32, 2-D weights by --outtype */
    t->type = t->n_dims == 1 ? GGML_TYPE_F32 : l->dense;
    return t;
}

mmproj_tensor *mmproj_tensors(const mmproj_meta *m, int *n) {
    const int64_t D = m->n_embd, I = m->ff, p = m->patch, r = m->merge, dim = m->proj_dim;
    list l = {dsf_xcalloc(9 * (size_t)m->n_layer + 10, sizeof(mmproj_tensor)), 0,
              m->f32 ? GGML_TYPE_F32 : GGML_TYPE_BF16};
    /* an nn.Linear over flattened (3, p, p) patches, viewed as the conv kernel {p, p, 3, D} (same
     * element order); always F32 (V4-Flash vision's tensor_force_quant) */
    mmproj_tensor *pe = add(&l, MMF_DENSE, "vision.patch_embed.proj.weight", D, 3 * p * p, 0, 0, "v.patch_embd.weight");
    pe->type = GGML_TYPE_F32;
    pe->n_dims = 4;
    pe->ne[0] = p, pe->ne[1] = p, pe->ne[2] = 3, pe->ne[3] = D;
    add(&l, MMF_BIAS, "vision.patch_embed.proj.bias", D, -1, 0, 0, "v.patch_embd.bias");
    for (uint32_t i = 0; i < m->n_layer; i++) {
        char s[96];
#define SRC(x) (snprintf(s, sizeof s, "vision.blocks.%u.%s", i, x), s)
        add(&l, MMF_NORM, SRC("norm1.weight"), D, -1, 0, 0, "v.blk.%u.ln1.weight", i);
        /* q | k | v row blocks, not permuted */
        add(&l, MMF_DENSE, SRC("attn.wqkv.weight"), 3 * D, D, 0, 0, "v.blk.%u.attn_qkv.weight", i);
        add(&l, MMF_BIAS, SRC("attn.wqkv.bias"), 3 * D, -1, 0, 0, "v.blk.%u.attn_qkv.bias", i);
        add(&l, MMF_DENSE, SRC("attn.wo.weight"), D, D, 0, 0, "v.blk.%u.attn_out.weight", i);
        add(&l, MMF_BIAS, SRC("attn.wo.bias"), D, -1, 0, 0, "v.blk.%u.attn_out.bias", i);
        add(&l, MMF_NORM, SRC("norm2.weight"), D, -1, 0, 0, "v.blk.%u.ln2.weight", i);
        /* w1 is [2I, D]: rows 0..I-1 the gate, I..2I-1 the up projection (vision.md §3) */
        add(&l, MMF_DENSE, SRC("mlp.w1.weight"), 2 * I, D, 0, I, "v.blk.%u.ffn_gate.weight", i);
        add(&l, MMF_DENSE, SRC("mlp.w1.weight"), 2 * I, D, I, I, "v.blk.%u.ffn_up.weight", i);
        add(&l, MMF_DENSE, SRC("mlp.w2.weight"), D, I, 0, 0, "v.blk.%u.ffn_down.weight", i);
#undef SRC
    }
    add(&l, MMF_NORM, "vision.norm.weight", D, -1, 0, 0, "v.post_ln.weight");
    add(&l, MMF_DENSE, "aligner.w1.weight", dim, D * r * r, 0, 0, "mm.1.weight");
    add(&l, MMF_BIAS, "aligner.w1.bias", dim, -1, 0, 0, "mm.1.bias");
    add(&l, MMF_DENSE, "aligner.w2.weight", dim, dim, 0, 0, "mm.2.weight");
    add(&l, MMF_BIAS, "aligner.w2.bias", dim, -1, 0, 0, "mm.2.bias");
    add(&l, MMF_EMBED, "image_start", dim, -1, 0, 0, "v.token_embd.img_start");
    add(&l, MMF_EMBED, "image_end", dim, -1, 0, 0, "v.token_embd.img_end");
    add(&l, MMF_EMBED, "image_newline", dim, -1, 0, 0, "v.image_newline");
    DSF_ASSERT(l.n == 9 * (int)m->n_layer + 10);
    *n = l.n;
    return l.t;
}
