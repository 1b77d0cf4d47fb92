/* vision_cli.c: `dsflash vision` (tools/cmd_vision.c) end to end: its output files checked by
 * ../shared/testdata/check_vl.py, the goldens' independent checker (skipped where python3 is
 * absent), and its refusals. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VDIR "testdata/tinyvl/"

static bool have_python(void) { return test_run("python3 -c 1", NULL, 0) == 0; }

/* check_vl.py golden/images.json KEY KIND FILE: 0 on PASS; its report in out. */
static int check_vl(const char *key, const char *kind, const char *file, char *out, size_t cap) {
    const char *py = test_shared("testdata/check_vl.py");
    const char *js = test_shared(VDIR "golden/images.json");
    if (!py || !js) return -1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' %s %s '%s' 2>&1", py, js, key, kind, file);
    return test_run(cmd, out, cap);
}

/* Guards against: a CLI that writes the stages in another layout or order than the goldens'
 * (rows, span order, float format), or runs another tower than --tower asks: the fp32 tower's
 * vit and block pass check_vl.py's 1e-4, the default (bf16) tower's block passes block-bf16's
 * bounds, on the golden patches of an image (--pixels-in, apart from the preprocessing). */
TEST(vision_cli_pixels_in) {
    NEED_SHARED(proj, VDIR "mmproj-tinyvl.gguf");
    if (!have_python()) SKIP("needs python3 for check_vl.py");
    char projs[4096];
    snprintf(projs, sizeof projs, "%s", proj);
    static const struct {
        const char *key, *grid;
    } im[] = {{"tall", "6x12"}}; /* python3 runs slowly; the tiny tier covers every image */
    for (size_t i = 0; i < sizeof im / sizeof *im; i++) {
        char rel[128], px[4096], vit[4096], blk[4096], blk16[4096], cmd[49152], out[4096];
        snprintf(rel, sizeof rel, VDIR "golden/%s.pixels.f32", im[i].key);
        const char *p = test_shared(rel);
        CHECKF(p, "%s absent", rel);
        snprintf(px, sizeof px, "%s", p);
        snprintf(vit, sizeof vit, "%s/%s.vit.f32", test_tmpdir(), im[i].key);
        snprintf(blk, sizeof blk, "%s/%s.block.f32", test_tmpdir(), im[i].key);
        snprintf(blk16, sizeof blk16, "%s/%s.block16.f32", test_tmpdir(), im[i].key);
        snprintf(cmd, sizeof cmd,
                 "'%s' vision --mmproj '%s' --pixels-in '%s' --grid %s --tower fp32 --threads 2 --vit-out '%s' "
                 "--block-out '%s' 2>&1 && '%s' vision --mmproj '%s' --pixels-in '%s' --grid %s --block-out '%s' 2>&1",
                 test_bin(), projs, px, im[i].grid, vit, blk, test_bin(), projs, px, im[i].grid, blk16);
        CHECKF(test_run(cmd, out, sizeof out) == 0, "%s: %s", im[i].key, out);
        CHECKF(strstr(out, "tower fp32") && strstr(out, "tower bf16"), "%s: the plan lines: %s", im[i].key, out);
        CHECKF(check_vl(im[i].key, "vit", vit, out, sizeof out) == 0, "%s vit: %s", im[i].key, out);
        CHECKF(check_vl(im[i].key, "block", blk, out, sizeof out) == 0, "%s block: %s", im[i].key, out);
        CHECKF(check_vl(im[i].key, "block-bf16", blk16, out, sizeof out) == 0, "%s block-bf16: %s", im[i].key, out);
        /* the default tower is bf16: it must NOT pass the fp32 block's 1e-4 */
        CHECKF(check_vl(im[i].key, "block", blk16, out, sizeof out) != 0, "%s: the default tower is not bf16", im[i].key);
    }
}

/* Guards against: a crash, a zero exit or a silent partial result on bad input: each case
 * exits non-zero with one line that names the problem. */
TEST(vision_cli_refusals) {
    NEED_SHARED(proj, VDIR "mmproj-tinyvl.gguf");
    NEED_SHARED(model, VDIR "tinyvl.gguf");
    char projs[4096], models[4096], cmd[16384], out[4096];
    snprintf(projs, sizeof projs, "%s", proj);
    snprintf(models, sizeof models, "%s", model);
    const struct {
        const char *args, *want;
    } cases[] = {
        {"--mmproj '%s' --pixels-in /nonexistent.f32 --grid 2x2", "nonexistent"},
        {"--mmproj /nonexistent.gguf --pixels-in x --grid 2x2", "nonexistent"},
        {"--mmproj '%s' --pixels-in '%s' --grid 2x2", "bytes, expected"}, /* a GGUF is not 2x2 patches */
        {"--mmproj '%s' --image /dev/null --tower int8", "--tower"},
        {"--mmproj '%s' --image '%s'", "unsupported format"}, /* a GGUF is no image */
        {"--mmproj '%s' --image /nonexistent.png", "nonexistent"},
        {"--mmproj '%s'", "either --image"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[8192];
        snprintf(args, sizeof args, cases[i].args, projs, projs);
        snprintf(cmd, sizeof cmd, "'%s' vision %s 2>&1", test_bin(), args);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc != 0 && rc < 128, "case %zu: exit %d: %s", i, rc, out);
        CHECKF(strstr(out, cases[i].want), "case %zu: '%s' lacks '%s'", i, out, cases[i].want);
    }
    /* the main model is not a projector */
    snprintf(cmd, sizeof cmd, "'%s' vision --mmproj '%s' --pixels-in x --grid 1x1 2>&1", test_bin(), models);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "general.architecture"), "exit %d: %s", rc, out);
}

/* Guards against: a CLI whose preprocessing differs from the reference's by a single bit (the
 * README's rule for pixels) on any of the five PNGs (RGB, RGBA, L, P; no resize, resize with
 * letterbox rows and columns, an upscale, the cap of 20), checked by check_vl.py; and the
 * block of one image through the whole path (decode -> tower) within the fp32 bound. */
TEST(vision_cli_image) {
    NEED_SHARED(proj, VDIR "mmproj-tinyvl.gguf");
    if (!have_python()) SKIP("needs python3 for check_vl.py");
    char projs[4096];
    snprintf(projs, sizeof projs, "%s", proj);
    static const struct {
        const char *key, *png, *cap;
    } im[] = {{"grad", "grad", "1024"}, {"wide", "wide", "1024"}, {"tall", "tall", "1024"},
              {"tiny", "tiny", "1024"}, {"cap-cap20", "cap", "20"}};
    for (size_t i = 0; i < sizeof im / sizeof *im; i++) {
        char rel[128], png[4096], px[4096], blk[4096], cmd[24576], out[4096];
        snprintf(rel, sizeof rel, VDIR "images/%s.png", im[i].png);
        const char *p = test_shared(rel);
        CHECKF(p, "%s absent", rel);
        snprintf(png, sizeof png, "%s", p);
        snprintf(px, sizeof px, "%s/%s.px.f32", test_tmpdir(), im[i].key);
        snprintf(blk, sizeof blk, "%s/%s.img-block.f32", test_tmpdir(), im[i].key);
        snprintf(cmd, sizeof cmd, "'%s' vision --mmproj '%s' --image '%s' --image-max-tokens %s --tower fp32 "
                                  "--pixels-out '%s' --block-out '%s' 2>&1",
                 test_bin(), projs, png, im[i].cap, px, blk);
        CHECKF(test_run(cmd, out, sizeof out) == 0, "%s: %s", im[i].key, out);
        CHECKF(check_vl(im[i].key, "pixels", px, out, sizeof out) == 0, "%s pixels: %s", im[i].key, out);
        if (i == 1) CHECKF(check_vl(im[i].key, "block", blk, out, sizeof out) == 0, "%s block: %s", im[i].key, out);
    }
}
