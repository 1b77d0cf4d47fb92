/* vision/mmproj: the projector GGUF (general.architecture = clip, clip.projector_type =
 * deepseek41v; gguf-layout.md §5, vision.md §10) -> a validated, read-only vis_model.
 *
 * Owns: the loader rules of that file (gguf-layout.md §6 S18 and B8, plus the engine's own:
 * shapes of every tensor, 2-D weights BF16 or F32, 1-D tensors and v.patch_embd.weight F32,
 * the fused attn_qkv or the split attn_q/attn_k/attn_v, no unknown tensor), and the one copy
 * it makes: the patch embedding padded to a multiple of 32 inputs (the fast kernels' block).
 * Must not: compute (vision/tower does) or preprocess images (vision/prep does).
 * Invariants: everything but the padded patch embedding points into the file's mapping and
 * lives until vis_model_free; every refusal names the key or tensor and what was expected. */
#ifndef DSF_VISION_MMPROJ_H
#define DSF_VISION_MMPROJ_H

#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"
#include "kernels/matmul.h"

typedef struct {
    int n_layer;     /* L  clip.vision.block_count */
    int n_embd;      /* D  clip.vision.embedding_length */
    int n_head;      /* H  clip.vision.attention.head_count */
    int head_dim;    /* d = D / H, a multiple of 4 (2-D RoPE: a quarter per axis and half) */
    int n_ff;        /* I  clip.vision.feed_forward_length */
    int patch;       /* p  clip.vision.patch_size */
    int merge;       /* r  clip.vision.projector.scale_factor */
    int proj_dim;    /* dim clip.vision.projection_dim: the block's row width */
    long min_pixels; /* clip.vision.image_min_pixels */
    float eps;       /* clip.vision.attention.layer_norm_epsilon (1e-6) */
} vis_hparams;

typedef struct {
    const float *ln1, *ln2;    /* [D] RMSNorm weights */
    /* split = false: qkv [3D][D] with bias [3D] (q, k, v row blocks); true: q, k, v [D][D]
     * with biases [D] each (then qkv/bqkv are unused) */
    bool split;
    dsf_wmat qkv, q, k, v;
    const float *bqkv, *bq, *bk, *bv;
    dsf_wmat out;              /* [D][D] */
    const float *bout;         /* [D] */
    dsf_wmat gate, up;         /* [I][D] */
    dsf_wmat down;             /* [D][I] */
} vis_layer;

typedef struct {
    gguf_file *f;
    vis_hparams hp;
    dsf_wmat patch_w;          /* [D][kp] F32, kp = 3 p^2 rounded up to 32, zero tail (owned) */
    float *patch_w_data;
    const float *patch_b;      /* [D] */
    vis_layer *layers;         /* [L] */
    const float *post_ln;      /* [D] */
    dsf_wmat mm1, mm2;         /* [dim][D r^2], [dim][dim] */
    const float *mm1_b, *mm2_b;/* [dim] */
    const float *img_start, *img_end, *img_newline; /* [dim] */
} vis_model;

/* Opens and validates path. NULL + err ("PATH: tensor 'v.blk.0.attn_out.weight': expected
 * [64, 64] (ggml ne), got [64, 32]") on any violation. */
vis_model *vis_model_open(const char *path, char *err);
/* The same over a caller-owned buffer (tests, fuzzers); the buffer must outlive the model. */
vis_model *vis_model_open_mem(const void *data, uint64_t size, const char *name, char *err);
void vis_model_free(vis_model *m);

#endif
