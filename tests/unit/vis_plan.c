/* vis_plan.c: the resize plan, the pad geometry, Pillow's bicubic coefficients and the
 * normalisation table of src/vision/prep.c against the official code's numbers.
 *
 * Guards against: a plan that differs from the official plan_image_grid + ImageOps.pad in
 * any field (a double operation reordered, pow instead of sqrt, the cap solve on the wrong
 * w/h, round half away from zero instead of half to even, the offset on the wrong axis); an
 * image whose resize target has a zero side accepted instead of refused; bicubic weights
 * that are not Pillow's (division instead of the reciprocal product, the kernel not widened
 * when shrinking, rounding of negative weights); a normalisation value off by one bf16 ulp.
 * Expected values: ../shared/testdata/tinyvl/golden/planning.json (500 official plans and
 * the table) and the sample rows of vision.md §2.4. */
#include "vision/prep.h"
#include "base/util.h"
#include "test.h"
#include "helpers.h"

#include <string.h>

static long jint(json_t *o, const char *k) { return (long)json_integer_value(json_object_get(o, k)); }

TEST(vis_plan_planning_json) {
    NEED_SHARED(path, "testdata/tinyvl/golden/planning.json");
    json_t *js = test_load_json(path);
    json_t *cfgs = json_object_get(js, "configs"), *cases = json_object_get(js, "cases");
    CHECKF(json_is_object(cfgs) && json_is_array(cases), "cannot read %s", path);
    int n = 0, n_ok = 0, n_pad = 0;
    size_t i;
    json_t *e;
    json_array_foreach(cases, i, e) {
        const char *cname = json_string_value(json_object_get(e, "config"));
        json_t *cj = json_object_get(cfgs, cname ? cname : "");
        CHECKF(json_is_object(cj), "case %zu: unknown config", i);
        vis_prep_cfg c = {.patch = (int)jint(cj, "patch"), .merge = (int)jint(cj, "merge"),
                          .max_tokens = (int)jint(cj, "max_image_tokens"), .min_pixels = jint(cj, "min_pixels")};
        int W = (int)jint(e, "w"), H = (int)jint(e, "h");
        dsf_image_plan pl;
        char err[DSF_ERR_LEN] = "";
        int rc = vis_plan(&c, W, H, &pl, err);
        /* The canvas fields exist for every entry (the pad step is what fails). */
        static const char *const canvas[] = {"best_w", "best_h", "n_vit_w", "n_vit_h", "n_llm_w", "n_llm_h", "n_tokens"};
        const int got_canvas[] = {pl.best_w, pl.best_h, pl.n_vit_w, pl.n_vit_h, pl.n_llm_w, pl.n_llm_h, pl.n_tokens};
        for (int k = 0; k < 7; k++)
            CHECKF(got_canvas[k] == jint(e, canvas[k]), "%s %dx%d: %s = %d, official %ld", cname, W, H, canvas[k],
                   got_canvas[k], jint(e, canvas[k]));
        if (json_object_get(e, "pad_error") || json_object_get(e, "error")) {
            CHECKF(rc == -1 && strstr(err, "empty"), "%s %dx%d: the official code fails (%s), vis_plan gave rc %d '%s'",
                   cname, W, H, json_string_value(json_object_get(e, "pad_error")), rc, err);
            n_pad++;
        } else {
            CHECKF(rc == 0, "%s %dx%d: %s", cname, W, H, err);
            static const char *const pad[] = {"resized_w", "resized_h", "off_x", "off_y"};
            const int got_pad[] = {pl.resized_w, pl.resized_h, pl.off_x, pl.off_y};
            for (int k = 0; k < 4; k++)
                CHECKF(got_pad[k] == jint(e, pad[k]), "%s %dx%d: %s = %d, official %ld", cname, W, H, pad[k],
                       got_pad[k], jint(e, pad[k]));
            CHECK(pl.width == W && pl.height == H);
            n_ok++;
        }
        n++;
    }
    json_decref(js);
    /* The README: 500 plans; 24 of them are pad errors (counted from the file when written). */
    CHECKF(n == 500 && n_pad == 24 && n_ok == 476, "%d plans, %d pad errors", n, n_pad);
}

TEST(vis_plan_norm_table) {
    NEED_SHARED(path, "testdata/tinyvl/golden/planning.json");
    json_t *js = test_load_json(path);
    json_t *tab = json_object_get(js, "norm_table_f32_bits");
    CHECKF(json_array_size(tab) == 256, "cannot read norm_table_f32_bits of %s", path);
    for (int v = 0; v < 256; v++) {
        float x = vis_norm_value(v);
        uint32_t u;
        memcpy(&u, &x, 4);
        uint32_t want = (uint32_t)json_integer_value(json_array_get(tab, (size_t)v));
        CHECKF(u == want, "v = %d: bits %08x, official %08x", v, u, want);
    }
    json_decref(js);
    /* vision.md §2.5's named values */
    CHECK(vis_norm_value(0) == -1.0f && vis_norm_value(255) == 1.0f);
    CHECK(vis_norm_value(127) == -0.003936767578125f && vis_norm_value(128) == 0.003936767578125f);
}

TEST(vis_plan_bicubic_rows) {
    static const struct {
        int in, out, o, lo, n;
        int32_t w[4];
    } rows[] = {/* vision.md §2.4, verified there on Pillow 9.4.0 */
                {7, 137, 0, 0, 2, {4710961, -516657}},
                {7, 137, 68, 2, 4, {0, 4194304, 0, 0}},
                {160, 168, 84, 78, 4, {-1161, 54603, 4188445, -47583}},
                {200, 168, 1, 0, 4, {-118544, 3069817, 1484600, -241570}}};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        int32_t iw[64];
        CHECK(vis_bicubic_taps(rows[r].in, rows[r].out) <= 64);
        int lo = -1, n = vis_bicubic_row(rows[r].in, rows[r].out, rows[r].o, &lo, iw);
        CHECKF(lo == rows[r].lo && n == rows[r].n, "%d -> %d, o = %d: lo %d, %d taps (spec: %d, %d)", rows[r].in,
               rows[r].out, rows[r].o, lo, n, rows[r].lo, rows[r].n);
        for (int k = 0; k < n; k++)
            CHECKF(iw[k] == rows[r].w[k], "%d -> %d, o = %d: weight %d is %d, spec %d", rows[r].in, rows[r].out,
                   rows[r].o, k, iw[k], rows[r].w[k]);
    }
}

TEST(vis_plan_bad_input) {
    vis_prep_cfg c = {.patch = 14, .merge = 3, .max_tokens = 1024, .min_pixels = 12544};
    dsf_image_plan pl;
    char err[DSF_ERR_LEN];
    CHECK(vis_plan(&c, 0, 10, &pl, err) == -1 && strstr(err, "out of range"));
    CHECK(vis_plan(&c, 10, -1, &pl, err) == -1 && strstr(err, "out of range"));
    c.max_tokens = 3;
    CHECK(vis_plan(&c, 10, 10, &pl, err) == -1 && strstr(err, "token cap"));
    c.max_tokens = 1024;
    c.patch = 0;
    CHECK(vis_plan(&c, 10, 10, &pl, err) == -1 && strstr(err, "config"));
}
