/* fuzz_image.c: libFuzzer harness for the image decoders (src/io/image.c) and the
 * preprocessing that runs on what they decode (src/vision/prep.c).
 *
 * Byte 0 sets the pixel cap (1 + 64 b0: 1 .. 16321 pixels, small so that every accepted
 * image is cheap), byte 1 the token cap M (4 .. 64), byte 2 min_pixels (196 (b2 mod 65):
 * 0 .. 12544, tinyvl's); the rest is the file (PNG, JPEG or anything).
 * Checked: a refused image leaves no pixels and one error line; an accepted one has a
 * positive size within the cap. Its plan, when vis_plan accepts it, keeps the span within M
 * (n_tokens = n_llm_h (n_llm_w + 1) + 2), the canvas a whole number of patches and the
 * resized image inside the canvas with one margin at most; vis_plan's refusals are one line.
 * The patches are bf16 values in [-1, 1], and the letterbox corner is the normalised 127. */
#include "fuzz_common.h"
#include "io/image.h"
#include "vision/prep.h"

static void fz_image_plan_check(const vis_prep_cfg *c, const dsf_image_plan *pl) {
    FZ_REQUIRE(pl->n_tokens <= c->max_tokens && pl->n_tokens == pl->n_llm_h * (pl->n_llm_w + 1) + 2,
               "span of %d tokens (cap %d)", pl->n_tokens, c->max_tokens);
    FZ_REQUIRE(pl->best_w == pl->n_vit_w * c->patch && pl->best_h == pl->n_vit_h * c->patch && pl->n_vit_w > 0 &&
                   pl->n_vit_h > 0, "canvas %dx%d is not whole patches", pl->best_w, pl->best_h);
    FZ_REQUIRE(pl->n_llm_w == (pl->n_vit_w + c->merge - 1) / c->merge &&
                   pl->n_llm_h == (pl->n_vit_h + c->merge - 1) / c->merge, "aligner grid");
    FZ_REQUIRE(pl->resized_w > 0 && pl->resized_h > 0 && pl->off_x >= 0 && pl->off_y >= 0 &&
                   pl->off_x + pl->resized_w <= pl->best_w && pl->off_y + pl->resized_h <= pl->best_h,
               "resized %dx%d at %d,%d outside %dx%d", pl->resized_w, pl->resized_h, pl->off_x, pl->off_y,
               pl->best_w, pl->best_h);
    FZ_REQUIRE(pl->resized_w == pl->best_w || pl->resized_h == pl->best_h, "margins on both axes");
}

static int fz_image_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    long cap = 1 + 64L * fz_u8(&in);
    vis_prep_cfg c = {.patch = 14, .merge = 3, .max_tokens = 4 + fz_u8(&in) % 61, .min_pixels = 196L * (fz_u8(&in) % 65)};
    img_rgb8 im;
    char err[DSF_ERR_LEN] = "";
    if (img_decode(in.p, in.n, cap, &im, err)) {
        fz_check_err(err, "img_decode");
        FZ_REQUIRE(!im.rgb && im.w == 0 && im.h == 0, "a refused image left pixels");
        return 0;
    }
    FZ_REQUIRE(im.rgb && im.w > 0 && im.h > 0 && (long)im.w * im.h <= cap, "decoded %dx%d with cap %ld", im.w,
               im.h, cap);
    dsf_image_plan pl;
    if (vis_plan(&c, im.w, im.h, &pl, err)) {
        fz_check_err(err, "vis_plan");
        img_free(&im);
        return 1;
    }
    fz_image_plan_check(&c, &pl);
    size_t n = (size_t)pl.n_vit_w * pl.n_vit_h * 3 * c.patch * c.patch;
    float *out = dsf_xmalloc(n * sizeof *out);
    FZ_REQUIRE(vis_patches(&c, &im, &pl, out, err) == 0, "vis_patches refused its own plan: %s", err);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &out[i], 4);
        FZ_REQUIRE((u & 0xFFFF) == 0 && out[i] >= -1.0f && out[i] <= 1.0f, "patch value %zu = %.9g", i, out[i]);
    }
    if (pl.off_x > 0 || pl.off_y > 0) /* canvas pixel (0, 0), red, is patch 0 element 0 */
        FZ_REQUIRE(out[0] == vis_norm_value(127), "letterbox corner %.9g", out[0]);
    free(out);
    img_free(&im);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_image_one(data, size);
    return 0;
}
#endif
