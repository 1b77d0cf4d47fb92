/* vision/prep: image pixels to ViT patches, bit for bit as the official image processor
 * computes them (vision.md §2): the resize plan, Pillow-exact bicubic resampling, the
 * letterbox at 127, the normalisation table and bf16 rounding, the patch order.
 * Must not: decode files (io/image does) or run the tower (vision/tower does).
 * Invariants: exact integer and IEEE double/float arithmetic in the order the spec writes it;
 * an image whose resize target has a zero side is refused with a clear error. */
#ifndef DSF_VISION_PREP_H
#define DSF_VISION_PREP_H
#include "dsflash.h"
#include "io/image.h"

typedef struct {
    int patch;       /* p (clip.vision.patch_size) */
    int merge;       /* r (clip.vision.projector.scale_factor) */
    int max_tokens;  /* M, the token cap */
    long min_pixels; /* clip.vision.image_min_pixels */
} vis_prep_cfg;

/* The plan for a W x H image (vision.md §2.2-§2.3): fills every field of *out. -1 + err when
 * the resize target has a zero side, or W, H, M are out of range. */
int vis_plan(const vis_prep_cfg *c, int W, int H, dsf_image_plan *out, char *err);
/* Resize + letterbox + normalise + bf16 + patches: out is [n_vit_h * n_vit_w][3 p^2] floats
 * (patch-row-major, element c p^2 + dy p + dx). pl must be vis_plan's plan for img. */
int vis_patches(const vis_prep_cfg *c, const img_rgb8 *img, const dsf_image_plan *pl, float *out, char *err);

/* Pillow's BICUBIC coefficients of one pass (vision.md §2.4), exposed for the tests: the
 * number of weights a row may hold for an in -> out resize (Pillow's ksize), and row o
 * (0 <= o < out): its first source index in *lo, its 22-bit fixed-point weights in iw (room
 * for vis_bicubic_taps entries); returns the number of weights. */
int vis_bicubic_taps(int in, int out);
int vis_bicubic_row(int in, int out, int o, int *lo, int32_t *iw);
/* The normalised value of the 8-bit v (vision.md §2.5): float32 ops, then bf16 (RNE). */
float vis_norm_value(int v);

#endif
