/* vis_patches.c: the five tinyvl PNGs through img_decode, vis_plan and vis_patches, against
 * the official image processor's patches (golden/IMAGE.pixels.f32), bit for bit.
 *
 * Guards against: any difference in decoding (alpha, palette, grey), the plan, Pillow's
 * bicubic (pass order, uint8 between passes, skipped passes, fixed-point rounding, the
 * widened kernel of a downscale), the letterbox value and offsets, the normalisation and its
 * bf16 rounding, or the patch order (patch-row-major, channel-major inside a patch).
 * Expected values: ../shared/testdata/tinyvl/golden (images.json gives each image's token cap
 * and plan; hf/config.json the vision config). */
#include "io/image.h"
#include "vision/prep.h"
#include "base/util.h"
#include "test.h"
#include "helpers.h"

#include <stdlib.h>
#include <string.h>

#define TV "testdata/tinyvl/"

static long jint(json_t *o, const char *k) { return (long)json_integer_value(json_object_get(o, k)); }

/* p, r and min_pixels of tinyvl's hf/config.json vision_config; -1 if absent. */
static int tinyvl_cfg(vis_prep_cfg *c) {
    const char *path = test_shared(TV "hf/config.json");
    json_t *js = path ? test_load_json(path) : NULL;
    json_t *v = json_object_get(js, "vision_config");
    int ok = json_is_object(v);
    if (ok) {
        c->patch = (int)jint(v, "patch_size");
        c->merge = (int)jint(v, "downsample_ratio");
        c->min_pixels = jint(v, "min_pixels");
        ok = c->patch > 0 && c->merge > 0 && c->min_pixels > 0;
    }
    json_decref(js);
    return ok ? 0 : -1;
}

/* One image of images.json (key, its record im): decode, plan (checked against the record's
 * plan), patches (checked bit for bit against its pixels file). Fails or skips through t. */
static void one_image(test_ctx *t, vis_prep_cfg c, const char *key, json_t *im) {
    c.max_tokens = (int)jint(im, "max_image_tokens");
    char rel[256];
    snprintf(rel, sizeof rel, TV "images/%s", json_string_value(json_object_get(im, "png")));
    NEED_SHARED(png, rel);
    json_t *pf = json_object_get(json_object_get(im, "files"), "pixels");
    snprintf(rel, sizeof rel, TV "golden/%s", json_string_value(json_object_get(pf, "file")));
    NEED_SHARED(gold_path, rel);

    long len, glen;
    unsigned char *d = test_slurp(png, &len);
    float *gold = (float *)test_slurp(gold_path, &glen);
    CHECKF(d && gold, "%s: cannot read the PNG or the golden", key);
    img_rgb8 img;
    char err[DSF_ERR_LEN];
    int rc = img_decode(d, (size_t)len, 0, &img, err);
    free(d);
    CHECKF(rc == 0, "%s: %s", key, err);
    dsf_image_plan pl;
    CHECKF(vis_plan(&c, img.w, img.h, &pl, err) == 0, "%s: %s", key, err);
    json_t *jp = json_object_get(im, "plan");
    const int got[] = {pl.best_w, pl.best_h, pl.n_vit_w, pl.n_vit_h, pl.n_llm_w, pl.n_llm_h,
                       pl.n_tokens, pl.resized_w, pl.resized_h, pl.off_x, pl.off_y};
    static const char *const names[] = {"best_w", "best_h", "n_vit_w", "n_vit_h", "n_llm_w", "n_llm_h",
                                        "n_tokens", "resized_w", "resized_h", "off_x", "off_y"};
    for (int k = 0; k < 11; k++)
        CHECKF(got[k] == jint(jp, names[k]), "%s: plan %s = %d, golden %ld", key, names[k], got[k],
               jint(jp, names[k]));
    size_t rows = (size_t)pl.n_vit_h * pl.n_vit_w, dim = (size_t)3 * c.patch * c.patch;
    json_t *shape = json_object_get(pf, "shape");
    CHECKF(json_integer_value(json_array_get(shape, 0)) == (long)rows &&
               json_integer_value(json_array_get(shape, 1)) == (long)dim && (size_t)glen == rows * dim * 4,
           "%s: golden shape/size does not match the plan (%zu x %zu)", key, rows, dim);
    float *out = malloc(rows * dim * sizeof *out);
    rc = vis_patches(&c, &img, &pl, out, err);
    img_free(&img);
    CHECKF(rc == 0, "%s: %s", key, err);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < rows * dim; i++)
        if (memcmp(&out[i], &gold[i], 4) != 0 && !bad++) first = i;
    float o1 = out[first], g1 = gold[first];
    free(out);
    free(gold);
    CHECKF(bad == 0, "%s: %zu of %zu values differ; first at patch %zu element %zu: %.9g vs golden %.9g", key,
           bad, rows * dim, first / dim, first % dim, o1, g1);
}

TEST(vis_patches_tinyvl_bit_exact) {
    NEED_SHARED(jpath, TV "golden/images.json");
    vis_prep_cfg c;
    CHECKF(tinyvl_cfg(&c) == 0, "cannot read vision_config of " TV "hf/config.json");
    json_t *all = test_load_json(jpath);
    CHECKF(json_object_size(all) == 5, "images.json: %zu images, the README lists five", json_object_size(all));
    const char *key;
    json_t *rec;
    json_object_foreach(all, key, rec) {
        one_image(t, c, key, rec);
        if (t->failed || t->skipped) break;
    }
    json_decref(all);
}

TEST(vis_patches_bad_plan) {
    /* A plan that does not belong to the image is refused, never used to index it. */
    vis_prep_cfg c = {.patch = 14, .merge = 3, .max_tokens = 1024, .min_pixels = 12544};
    uint8_t px[20 * 10 * 3] = {0};
    img_rgb8 img = {20, 10, px};
    dsf_image_plan pl;
    char err[DSF_ERR_LEN];
    CHECKF(vis_plan(&c, 20, 10, &pl, err) == 0, "%s", err);
    float *out = malloc((size_t)pl.n_vit_w * pl.n_vit_h * 3 * 14 * 14 * sizeof *out);
    CHECKF(vis_patches(&c, &img, &pl, out, err) == 0, "%s", err);
    dsf_image_plan bad = pl;
    bad.width = 21;
    CHECK(vis_patches(&c, &img, &bad, out, err) == -1 && strstr(err, "plan"));
    bad = pl;
    bad.off_x = bad.best_w;
    CHECK(vis_patches(&c, &img, &bad, out, err) == -1 && strstr(err, "inconsistent"));
    bad = pl;
    bad.best_w += 1;
    CHECK(vis_patches(&c, &img, &bad, out, err) == -1 && strstr(err, "inconsistent"));
    free(out);
}
