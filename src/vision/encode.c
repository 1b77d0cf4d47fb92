/* vision/encode.c: dsf_vision_encode = vision_prepare (io/image decode, vision/prep plan and
 * patches) -> the tower and the aligner -> the block and the image's key.
 * Must not: compute (vision/tower does) or hold state between images.
 * Invariant: on failure *out holds no allocation (block NULL) and err names the problem. */
#include "vision/vision.h"
#include "vision/prep.h"
#include "io/image.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

int vision_prepare(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image_plan *pl,
                   float **patches, char *err) {
    const vis_hparams *hp = &vision_model(v)->hp;
    const vis_prep_cfg c = {hp->patch, hp->merge, vision_cap(v, max_tokens), hp->min_pixels};
    img_rgb8 img = {0};
    *patches = NULL;
    if (img_decode(bytes, len, vision_max_pixels(v), &img, err) || vis_plan(&c, img.w, img.h, pl, err)) {
        img_free(&img);
        return -1;
    }
    const size_t n = (size_t)pl->n_vit_h * (size_t)pl->n_vit_w * 3 * (size_t)hp->patch * (size_t)hp->patch;
    float *px = malloc(n * sizeof(float));
    int rc = px ? vis_patches(&c, &img, pl, px, err) : dsf_seterr(err, "vision: out of memory for %zu patch values", n);
    img_free(&img);
    if (rc) {
        free(px);
        return -1;
    }
    *patches = px;
    return 0;
}

int dsf_vision_encode(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image *out, char *err) {
    memset(out, 0, sizeof *out);
    if (!v || !bytes) return dsf_seterr(err, "vision: no projector or no image bytes");
    float *px = NULL;
    dsf_image_plan pl;
    if (vision_prepare(v, bytes, len, max_tokens, &pl, &px, err)) return -1;
    const int dim = vision_model(v)->hp.proj_dim;
    float *block = malloc((size_t)pl.n_tokens * (size_t)dim * sizeof(float));
    int rc = block ? vision_run_patches(v, px, &pl, NULL, block, err) : dsf_seterr(err, "vision: out of memory");
    free(px);
    if (rc) {
        free(block);
        return -1;
    }
    *out = (dsf_image){.plan = pl, .n_embd = dim, .block = block, .key = vision_key(bytes, len, vision_cap(v, max_tokens))};
    return 0;
}
