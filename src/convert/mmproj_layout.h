/* mmproj_layout.h: the deepseek41v projector GGUF (arch `clip`, type `mmproj`; gguf-layout.md §5,
 * vision.md §10): its keys in the converter's order and its 9*L + 10 tensors with their names,
 * shapes, dtypes and checkpoint sources. The one description of the layout, shared by
 * `convert --mmproj` (convert_mmproj.c) and `synth --mmproj-preset` (synth_mmproj.c), as
 * dspark_meta.h is for the DSpark draft. */
#ifndef DSF_MMPROJ_LAYOUT_H
#define DSF_MMPROJ_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"

/* The projector's shape and the values of its keys. */
typedef struct mmproj_meta_s {
    const char *name;      /* general.name */
    uint32_t n_layer;      /* clip.vision.block_count (vision_config.num_hidden_layers, > 0) */
    uint32_t n_embd;       /* clip.vision.embedding_length: the tower width D */
    uint32_t n_head;       /* clip.vision.attention.head_count */
    uint32_t ff;           /* clip.vision.feed_forward_length: the SwiGLU width I */
    uint32_t patch;        /* clip.vision.patch_size p */
    uint32_t merge;        /* clip.vision.projector.scale_factor r (the r x r aligner unfold) */
    uint32_t proj_dim;     /* clip.vision.projection_dim: the text model's hidden size */
    uint32_t min_pixels;   /* clip.vision.image_min_pixels */
    float mean[3], std[3]; /* clip.vision.image_mean / image_std */
    bool f32;              /* 2-D weights F32 (--outtype f32, general.file_type 0), else BF16 (32) */
} mmproj_meta;

/* The keys of §5.1 in the converter's order (general.architecture first, quantization_version
 * last). 0 / -1 with err (a writer refusal). */
int mmproj_meta_write(gguf_writer *w, const mmproj_meta *m, char *err);

/* How a synthetic projector fills a tensor (synth_mmproj.c). */
enum mmproj_fill { MMF_NORM, MMF_DENSE, MMF_BIAS, MMF_EMBED };

/* One GGUF tensor and where the converter takes it from. */
typedef struct {
    char name[GGUF_MAX_NAME];  /* GGUF name, e.g. v.blk.3.ffn_up.weight */
    uint32_t type;             /* GGML_TYPE_F32 or GGML_TYPE_BF16 */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ggml order, unused dims 1 */
    char src[96];              /* checkpoint tensor, e.g. vision.blocks.3.mlp.w1.weight */
    int64_t src_d0, src_d1;    /* its torch shape: [d0, d1], or [d0] when d1 < 0 */
    int64_t row0, rows;        /* the rows of src this tensor holds (the halves of w1); rows 0: all */
    enum mmproj_fill fill;
    int64_t fan_in;            /* MMF_DENSE: the input width */
} mmproj_tensor;

/* The tensors of m in the release checkpoint's order (patch embedding, blocks, final norm,
 * aligner, delimiters): dtypes by §5.2 (v.patch_embd.weight always F32, 1-D F32, other 2-D
 * weights BF16 or F32 by m->f32). Returns a malloc'ed array of *n entries. */
mmproj_tensor *mmproj_tensors(const mmproj_meta *m, int *n);

#endif
