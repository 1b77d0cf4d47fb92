/* vision/encode.c: dsf_vision_encode = vision_prepare (io/image decode, vision/prep plan and
 * patches) -> the tower and the aligner -> the block and the image's key.
 * Must not: compute (vision/tower does) or hold state between images.
 * Invariant: on failure *out holds no allocation (block NULL) and err names the problem.
 * vision_prepare is a PLACEHOLDER until io/image.c and vision/prep.c land (h-vimage). */
#include "vision/vision.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

int vision_prepare(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image_plan *pl,
                   float **patches, char *err) {
    (void)v, (void)bytes, (void)len, (void)max_tokens, (void)pl;
    *patches = NULL;
    return dsf_seterr(err, "vision: this build has no image decoder yet");
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
