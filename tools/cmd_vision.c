/* cmd_vision.c: `dsflash vision --mmproj PROJ --image FILE ...`: one image through the
 * preprocessing, the tower and the aligner (src/vision), printing the plan and writing the
 * stage outputs in the goldens' layouts (raw little-endian float32: pixels [N][3 p^2], vit
 * [N][D], block [n_tokens][dim]), which ../shared/testdata/check_vl.py compares.
 *
 * Owns: the options and the output files. Must not: compute anything itself.
 * `--pixels-in P.f32 --grid WxH` runs the tower on given patches instead of an image (the
 * goldens' IMAGE.pixels.f32), to check the tower apart from the preprocessing. */
#include "cmd.h"
#include "dsflash.h"
#include "vision/vision.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *USAGE =
    "usage: dsflash vision --mmproj PROJ.gguf (--image FILE | --pixels-in P.f32 --grid WxH)\n"
    "                      [--image-max-tokens N] [--tower bf16|fp32] [--threads N]\n"
    "                      [--pixels-out P.f32] [--vit-out V.f32] [--block-out B.f32]\n"
    "  Decodes a PNG or JPEG image, plans and preprocesses it, runs the vision tower and the\n"
    "  aligner of a deepseek41v projector, prints the plan, and writes each requested stage as\n"
    "  raw little-endian float32: pixels [patches][3*p*p], vit [patches][width], block\n"
    "  [tokens][text width] in span order (START, per row its cells then NEWLINE, END).\n"
    "  --image-max-tokens N  token cap of the image's block (default 1024; vision.md §2.2)\n"
    "  --tower bf16|fp32     tower numerics: bf16 = the reference's dtype flow (the default, as\n"
    "                        dsflash defaults to reference numerics); fp32 = plain (the tight goldens)\n"
    "  --threads N           threads (default: all online cores)\n"
    "  --pixels-in P.f32 --grid WxH   run the tower on these patches (W x H patches) instead\n";

static int write_f32(const char *path, const float *p, size_t n, char *err) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return dsf_seterr(err, "%s: cannot open for writing", path);
    size_t w = fwrite(p, sizeof(float), n, fp);
    if (fclose(fp) != 0 || w != n) return dsf_seterr(err, "%s: write failed", path);
    return 0;
}

typedef struct {
    const char *mmproj, *image, *pixels_in, *pixels_out, *vit_out, *block_out;
    int max_tokens, threads, grid_w, grid_h;
    dsf_numerics num;
} vis_opts;

static int parse(int argc, char **argv, vis_opts *o) {
    *o = (vis_opts){.num = DSF_NUMERICS_REFERENCE};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!v) {
            fprintf(stderr, "dsflash vision: unknown or incomplete option '%s' (try --help)\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--mmproj")) o->mmproj = v;
        else if (!strcmp(a, "--image")) o->image = v;
        else if (!strcmp(a, "--pixels-in")) o->pixels_in = v;
        else if (!strcmp(a, "--pixels-out")) o->pixels_out = v;
        else if (!strcmp(a, "--vit-out")) o->vit_out = v;
        else if (!strcmp(a, "--block-out")) o->block_out = v;
        else if (!strcmp(a, "--tower") && (!strcmp(v, "bf16") || !strcmp(v, "fp32")))
            o->num = v[0] == 'b' ? DSF_NUMERICS_REFERENCE : DSF_NUMERICS_PLAIN;
        else if (!strcmp(a, "--grid") && sscanf(v, "%dx%d", &o->grid_w, &o->grid_h) == 2 && o->grid_w > 0 && o->grid_h > 0) {
        } else if (!strcmp(a, "--image-max-tokens") || !strcmp(a, "--threads")) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > (a[2] == 't' ? 256 : 1000000)) {
                fprintf(stderr, "dsflash vision: %s wants a positive count%s, got '%s'\n", a,
                        a[2] == 't' ? " up to 256" : "", v);
                return -1;
            }
            if (a[2] == 't') o->threads = (int)n;
            else o->max_tokens = (int)n;
        } else {
            fprintf(stderr, "dsflash vision: bad option or value: %s %s (try --help)\n", a, v);
            return -1;
        }
    }
    if (!o->mmproj || !!o->image == !!o->pixels_in || (o->pixels_in && !o->grid_w)) {
        fprintf(stderr, "dsflash vision: give --mmproj and either --image or --pixels-in with --grid (try --help)\n");
        return -1;
    }
    return 0;
}

/* The patches of the image (decoded, planned, preprocessed) or of --pixels-in, and the plan. */
static float *patches_of(dsf_vision *v, const vis_opts *o, dsf_image_plan *pl, char *err) {
    const vis_hparams *hp = &vision_model(v)->hp;
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (o->image) {
        float *px = NULL;
        if (dsf_read_file(o->image, &bytes, &len, err)) return NULL;
        int rc = vision_prepare(v, bytes, len, o->max_tokens, pl, &px, err);
        free(bytes);
        return rc ? NULL : px;
    }
    const int r = hp->merge;
    *pl = (dsf_image_plan){.best_w = o->grid_w * hp->patch, .best_h = o->grid_h * hp->patch, .n_vit_w = o->grid_w,
                           .n_vit_h = o->grid_h, .n_llm_w = (o->grid_w + r - 1) / r, .n_llm_h = (o->grid_h + r - 1) / r};
    pl->n_tokens = pl->n_llm_h * (pl->n_llm_w + 1) + 2;
    if (dsf_read_file(o->pixels_in, &bytes, &len, err)) return NULL;
    const size_t want = (size_t)o->grid_w * (size_t)o->grid_h * 3 * (size_t)hp->patch * (size_t)hp->patch * sizeof(float);
    if (len != want) {
        free(bytes);
        dsf_seterr(err, "%s: %zu bytes, expected %zu for %dx%d patches of 3x%dx%d floats", o->pixels_in, len, want,
                   o->grid_w, o->grid_h, hp->patch, hp->patch);
        return NULL;
    }
    return (float *)(void *)bytes;
}

static int cmd_vision(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    vis_opts o;
    if (parse(argc, argv, &o)) return 2;
    char err[DSF_ERR_LEN] = "";
    dsf_vision_params p;
    dsf_vision_params_default(&p);
    p.numerics = o.num;
    p.n_threads = o.threads;
    dsf_vision *v = dsf_vision_open(o.mmproj, &p, err);
    if (!v) {
        fprintf(stderr, "dsflash vision: %s\n", err);
        return 1;
    }
    const vis_hparams *hp = &vision_model(v)->hp;
    dsf_image_plan pl;
    float *px = patches_of(v, &o, &pl, err), *vit = NULL, *block = NULL;
    int rc = px ? 0 : -1;
    if (!rc) {
        printf("plan: %dx%d -> %dx%d (resized %dx%d at %d,%d), vit %dx%d patches, llm %dx%d, %d tokens, tower %s\n",
               pl.width, pl.height, pl.best_w, pl.best_h, pl.resized_w, pl.resized_h, pl.off_x, pl.off_y, pl.n_vit_w,
               pl.n_vit_h, pl.n_llm_w, pl.n_llm_h, pl.n_tokens, o.num == DSF_NUMERICS_PLAIN ? "fp32" : "bf16");
        const size_t N = (size_t)pl.n_vit_w * (size_t)pl.n_vit_h;
        vit = malloc(N * (size_t)hp->n_embd * sizeof(float));
        block = malloc((size_t)pl.n_tokens * (size_t)hp->proj_dim * sizeof(float));
        if (!vit || !block) rc = dsf_seterr(err, "out of memory");
        if (!rc && (o.vit_out || o.block_out)) rc = vision_run_patches(v, px, &pl, vit, block, err);
        if (!rc && o.pixels_out) rc = write_f32(o.pixels_out, px, N * 3 * (size_t)hp->patch * (size_t)hp->patch, err);
        if (!rc && o.vit_out) rc = write_f32(o.vit_out, vit, N * (size_t)hp->n_embd, err);
        if (!rc && o.block_out) rc = write_f32(o.block_out, block, (size_t)pl.n_tokens * (size_t)hp->proj_dim, err);
    }
    if (rc) fprintf(stderr, "dsflash vision: %s\n", err);
    free(px), free(vit), free(block);
    dsf_vision_close(v);
    return rc ? 1 : 0;
}

DSF_COMMAND(vision, "one image through the deepseek41v projector: plan, patches, ViT output, image block", cmd_vision)
