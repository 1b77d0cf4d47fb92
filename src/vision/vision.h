/* vision/vision.h: the internal entry points of the projector API (vision.c) that the CLI,
 * the benchmark and the tests use besides include/dsflash.h: the loaded model, its pool, the
 * tower run on given patches (the goldens' pixels), and the preprocessing alone.
 * Must not: expose anything a runtime caller needs (they use dsflash.h only). */
#ifndef DSF_VISION_VISION_H
#define DSF_VISION_VISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsflash.h"
#include "vision/mmproj.h"
#include "base/threads.h"

const vis_model *vision_model(const dsf_vision *v);
dsf_pool *vision_pool(dsf_vision *v);
/* Whether the tower runs the reference (bf16) numerics. */
bool vision_bf16(const dsf_vision *v);
/* The decoded-pixel cap (dsf_vision_params.max_pixels; 0: img_decode's default). */
long vision_max_pixels(const dsf_vision *v);
/* The token cap a request of max_tokens (<= 0: the projector's default) runs with. */
int vision_cap(const dsf_vision *v, int max_tokens);

/* The tower and the aligner on patches [n_vit_h * n_vit_w][3 p^2] of the plan pl (its grids
 * and n_tokens must agree with the model's p and r). vit: NULL or [N][D]; block: NULL or
 * [pl->n_tokens][proj_dim]. -1 + err. */
int vision_run_patches(dsf_vision *v, const float *patches, const dsf_image_plan *pl, float *vit, float *block,
                       char *err);

/* Decodes the image bytes, plans it under the cap (max_tokens <= 0: the default) and makes its
 * patches: *pl filled, *patches malloc'ed [n_vit_h * n_vit_w][3 p^2]. -1 + err naming the
 * problem (corrupt or oversized image, empty resize target). */
int vision_prepare(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image_plan *pl,
                   float **patches, char *err);

/* The image key of dsf_image.key: a 64-bit hash of the bytes and the cap, never 0. */
uint64_t vision_key(const uint8_t *bytes, size_t len, int cap);

#endif
