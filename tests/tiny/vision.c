/* vision.c: the deepseek41v tower and aligner (src/vision/tower.c, attn2d.c) against the
 * official reference's goldens of ../shared/testdata/tinyvl (README: "Per image"), fed with
 * the golden patches (IMAGE.pixels.f32), on both projector files (BF16 and F32 weights); the
 * projector loader's refusals (src/vision/mmproj.c) on malformed variants of the tinyvl file,
 * and the split attn_q/attn_k/attn_v form it accepts. */
#include "dsflash.h"
#include "io/gguf.h"
#include "vision/vision.h"
#include "vision/mmproj.h"
#include "helpers.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VDIR "testdata/tinyvl/"
static const char *const keys[] = {"grad", "wide", "tall", "tiny", "cap-cap20"};

/* The golden file KEY.KIND.f32 of n floats (malloc'ed), NULL if absent or of another size. */
static float *load_f32(const char *key, const char *kind, size_t n) {
    char rel[128];
    snprintf(rel, sizeof rel, VDIR "golden/%s.%s.f32", key, kind);
    const char *p = test_shared(rel);
    long sz = 0;
    unsigned char *b = p ? test_slurp(p, &sz) : NULL;
    if (!b || (size_t)sz != n * sizeof(float)) {
        free(b);
        return NULL;
    }
    return (float *)(void *)b;
}

/* images.json's plan of key into *pl; -1 if absent. */
static int load_plan(const char *key, dsf_image_plan *pl) {
    const char *p = test_shared(VDIR "golden/images.json");
    json_t *root = p ? test_load_json(p) : NULL;
    json_t *img = root ? json_object_get(root, key) : NULL, *jp = img ? json_object_get(img, "plan") : NULL;
    if (!jp) {
        json_decref(root);
        return -1;
    }
#define GI(f) (int)json_integer_value(json_object_get(jp, #f))
    *pl = (dsf_image_plan){.width = (int)json_integer_value(json_object_get(img, "width")),
                           .height = (int)json_integer_value(json_object_get(img, "height")),
                           .best_w = GI(best_w), .best_h = GI(best_h), .n_vit_w = GI(n_vit_w), .n_vit_h = GI(n_vit_h),
                           .n_llm_w = GI(n_llm_w), .n_llm_h = GI(n_llm_h), .n_tokens = GI(n_tokens),
                           .resized_w = GI(resized_w), .resized_h = GI(resized_h), .off_x = GI(off_x), .off_y = GI(off_y)};
#undef GI
    json_decref(root);
    return 0;
}

typedef struct {
    double max_abs, mean_abs;
} diff;

static diff compare(const float *a, const float *b, size_t n) {
    diff d = {0, 0};
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d.max_abs)) d.max_abs = e; /* NaN propagates as a failure */
        d.mean_abs += e;
    }
    d.mean_abs /= (double)(n ? n : 1);
    return d;
}

static dsf_vision *open_vision(const char *path, dsf_numerics num, int threads, char *err) {
    dsf_vision_params p;
    dsf_vision_params_default(&p);
    p.numerics = num;
    p.n_threads = threads;
    return dsf_vision_open(path, &p, err);
}

/* Runs one image's golden patches through v: vit [N][D] and block [n_tokens][dim] (malloc'ed). */
static int run_key(test_ctx *t, dsf_vision *v, const char *key, dsf_image_plan *pl, float **vit, float **block) {
    const vis_hparams *hp = &vision_model(v)->hp;
    char err[DSF_ERR_LEN] = "";
    if (load_plan(key, pl)) {
        test_fail(t, __FILE__, __LINE__, "%s: no plan in images.json", key);
        return -1;
    }
    const size_t N = (size_t)pl->n_vit_h * (size_t)pl->n_vit_w;
    float *px = load_f32(key, "pixels", N * 3 * (size_t)hp->patch * (size_t)hp->patch);
    *vit = malloc(N * (size_t)hp->n_embd * sizeof(float));
    *block = malloc((size_t)pl->n_tokens * (size_t)hp->proj_dim * sizeof(float));
    int rc = px ? vision_run_patches(v, px, pl, *vit, *block, err) : -1;
    free(px);
    if (rc) test_fail(t, __FILE__, __LINE__, "%s: %s", key, px ? err : "golden pixels absent or of another size");
    return rc;
}

/* Every image's golden patches through the projector at path in numerics num: the block
 * against KEY.<kind>.f32 within max_tol / mean_tol, and (vit_tol > 0) the ViT output against
 * KEY.vit.f32 within vit_tol. 0, or -1 after a failed check. */
static int sweep(test_ctx *t, const char *path, dsf_numerics num, const char *kind, double max_tol, double mean_tol,
                 double vit_tol) {
    char err[DSF_ERR_LEN] = "";
    dsf_vision *v = open_vision(path, num, 2, err);
    if (!v) {
        test_fail(t, __FILE__, __LINE__, "%s: %s", path, err);
        return -1;
    }
    const vis_hparams *hp = &vision_model(v)->hp;
    int rc = 0;
    for (size_t i = 0; !rc && i < sizeof keys / sizeof *keys; i++) {
        dsf_image_plan pl;
        float *vit = NULL, *block = NULL;
        rc = run_key(t, v, keys[i], &pl, &vit, &block);
        const size_t nv = rc ? 0 : (size_t)pl.n_vit_h * pl.n_vit_w * (size_t)hp->n_embd;
        const size_t nb = rc ? 0 : (size_t)pl.n_tokens * (size_t)hp->proj_dim;
        float *gv = vit_tol > 0 && !rc ? load_f32(keys[i], "vit", nv) : NULL, *gb = rc ? NULL : load_f32(keys[i], kind, nb);
        diff dv = vit_tol <= 0 ? (diff){0, 0} : gv ? compare(vit, gv, nv) : (diff){INFINITY, 0};
        diff db = gb ? compare(block, gb, nb) : (diff){INFINITY, INFINITY};
        free(vit), free(block), free(gv), free(gb);
        if (rc) break;
        if (getenv("DSF_TEST_VERBOSE"))
            fprintf(stderr, "  %s %s: vit max %.3g, %s max %.3g mean %.3g\n", path, keys[i], dv.max_abs, kind,
                    db.max_abs, db.mean_abs);
        if (!(dv.max_abs <= vit_tol || vit_tol <= 0) || !(db.max_abs <= max_tol) || !(db.mean_abs <= mean_tol)) {
            test_fail(t, __FILE__, __LINE__, "%s %s: vit max abs %.3g (want <= %g), %s max abs %.3g mean %.3g (want <= %g, %g)",
                      path, keys[i], dv.max_abs, vit_tol, kind, db.max_abs, db.mean_abs, max_tol, mean_tol);
            rc = -1;
        }
    }
    dsf_vision_close(v);
    return rc;
}

/* Guards against: any arithmetic slip in the fp32 tower (patch embedding, RMSNorm eps, the 2-D
 * RoPE's axes and rotate-half pairing, the attention scale, SwiGLU halves, the channel-major
 * merge and its zero padding, exact GELU, the span order of the block), with BF16 weights and
 * with F32 weights. Tolerance: the README's 1e-4 max abs for vit and block (the oracle agrees
 * with an independent fp32 tower to 3e-6). */
TEST(vision_fp32_goldens) {
    NEED_SHARED(bf, VDIR "mmproj-tinyvl.gguf");
    NEED_SHARED(f32, VDIR "mmproj-tinyvl-f32.gguf");
    char files[2][4096]; /* test_shared's buffers rotate */
    snprintf(files[0], sizeof files[0], "%s", bf);
    snprintf(files[1], sizeof files[1], "%s", f32);
    for (int fi = 0; fi < 2; fi++)
        if (sweep(t, files[fi], DSF_NUMERICS_PLAIN, "block", 1e-4, 1e-4, 1e-4)) return;
}

/* Guards against: a bf16 tower that does not follow the reference's dtype flow closely enough
 * (a wrong formula is far outside). Tolerance: the README's block-bf16 bound, max 0.1 and mean
 * 0.01 (this tower lands near 0.03 / 0.003, about as far as the fp32 tower is from it). */
TEST(vision_bf16_goldens) {
    NEED_SHARED(bf, VDIR "mmproj-tinyvl.gguf");
    char path[4096];
    snprintf(path, sizeof path, "%s", bf);
    sweep(t, path, DSF_NUMERICS_REFERENCE, "block-bf16", 0.1, 0.01, 0);
}

/* Guards against: results that depend on the thread count or the split of the work (tower.h
 * invariant), in both numerics: 1 and 3 threads must agree bit for bit. */
TEST(vision_threads_bitexact) {
    NEED_SHARED(bfs, VDIR "mmproj-tinyvl.gguf");
    char bf[4096];
    snprintf(bf, sizeof bf, "%s", bfs);
    for (int num = 0; num < 2; num++) {
        float *out[2][2] = {{NULL}};
        dsf_image_plan pl;
        for (int r = 0; r < 2; r++) {
            char err[DSF_ERR_LEN] = "";
            dsf_vision *v = open_vision(bf, num ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE, r ? 3 : 1, err);
            CHECKF(v, "%s", err);
            int rc = run_key(t, v, "cap-cap20", &pl, &out[r][0], &out[r][1]);
            dsf_vision_close(v);
            if (rc) return;
        }
        const size_t nv = (size_t)pl.n_vit_h * pl.n_vit_w * 64, nb = (size_t)pl.n_tokens * 128;
        const bool same = !memcmp(out[0][0], out[1][0], nv * 4) && !memcmp(out[0][1], out[1][1], nb * 4);
        for (int r = 0; r < 2; r++) free(out[r][0]), free(out[r][1]);
        CHECKF(same, "numerics %d: 1 and 3 threads differ", num);
    }
}

/* ---- malformed projector files ---- */

typedef struct {
    const char *drop;      /* tensor left out */
    const char *reshape;   /* tensor written with ne {ne0 / 2, ne1 * 2} (same bytes) */
    const char *key;       /* string key set to sval */
    const char *sval;
    bool split;            /* attn_qkv of every block written as attn_q/attn_k/attn_v */
} variant;

static int add_tensor(gguf_writer *w, const gguf_tensor *tt, const variant *vr, char *err) {
    if (vr->drop && !strcmp(tt->name, vr->drop)) return 0;
    int64_t ne[4] = {tt->ne[0], tt->ne[1], tt->ne[2], tt->ne[3]};
    if (vr->reshape && !strcmp(tt->name, vr->reshape)) ne[0] /= 2, ne[1] *= 2;
    if (vr->split && strstr(tt->name, ".attn_qkv.")) {
        char nm[96];
        const char *dot = strstr(tt->name, ".attn_qkv.");
        for (int p = 0; p < 3; p++) {
            snprintf(nm, sizeof nm, "%.*s.attn_%c.%s", (int)(dot - tt->name), tt->name, "qkv"[p], dot + 10);
            int64_t ns[4] = {ne[0], ne[1], 1, 1};
            if (tt->n_dims == 1) ns[0] /= 3;
            else ns[1] /= 3;
            if (gguf_writer_tensor(w, nm, tt->type, tt->n_dims, ns, err)) return -1;
        }
        return 0;
    }
    return gguf_writer_tensor(w, tt->name, tt->type, tt->n_dims, ne, err);
}

/* Writes src with the variant's change to dst: 0, or -1 with err. The split form's q, k, v
 * are the fused tensor's thirds (rows, or bias entries), written in that order. */
static int write_variant(const char *src, const char *dst, const variant *vr, char *err) {
    gguf_file *f = gguf_open(src, err);
    if (!f) return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = 0;
    for (uint64_t i = 0; !rc && i < f->n_kv; i++)
        rc = vr->key && !strcmp(f->kv[i].key, vr->key) ? gguf_writer_kv_str(w, vr->key, vr->sval, err)
                                                         : gguf_writer_copy_kv(w, &f->kv[i], err);
    for (uint64_t i = 0; !rc && i < f->n_tensors; i++) rc = add_tensor(w, &f->tensors[i], vr, err);
    if (!rc) rc = gguf_writer_begin(w, dst, err);
    for (uint64_t i = 0; !rc && i < f->n_tensors; i++) {
        const gguf_tensor *tt = &f->tensors[i];
        if (vr->drop && !strcmp(tt->name, vr->drop)) continue;
        const int parts = vr->split && strstr(tt->name, ".attn_qkv.") ? 3 : 1; /* thirds: contiguous, in order */
        for (int p = 0; !rc && p < parts; p++)
            rc = gguf_writer_write(w, tt->data + p * (tt->nbytes / 3), tt->nbytes / (uint64_t)parts, err);
    }
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}

/* Guards against: a loader that accepts a file it cannot run, or refuses without naming the
 * problem (gguf-layout.md §6 B8, S18 and the shapes of §5): each variant must be refused with
 * an error that names the key or the tensor. */
TEST(vision_loader_refusals) {
    NEED_SHARED(bfs, VDIR "mmproj-tinyvl.gguf");
    char bf[4096];
    snprintf(bf, sizeof bf, "%s", bfs);
    static const struct {
        variant v;
        const char *want[2];
    } cases[] = {
        {{.key = "clip.projector_type", .sval = "deepseek4v"}, {"clip.projector_type", "unknown projector type"}},
        {{.key = "general.architecture", .sval = "deepseek41"}, {"general.architecture", "clip"}},
        {{.drop = "mm.2.bias"}, {"mm.2.bias", "not found"}},
        {{.drop = "v.image_newline"}, {"v.image_newline", "not found"}},
        {{.drop = "v.blk.1.ffn_down.weight"}, {"v.blk.1.ffn_down.weight", "not found"}},
        {{.reshape = "v.blk.0.attn_out.weight"}, {"v.blk.0.attn_out.weight", "expected [64, 64]"}},
        {{.reshape = "mm.1.weight"}, {"mm.1.weight", "expected [576, 128]"}},
    };
    char dst[4096];
    snprintf(dst, sizeof dst, "%s", test_tmpfile("mmproj-variant.gguf"));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[DSF_ERR_LEN] = "";
        CHECKF(!write_variant(bf, dst, &cases[i].v, err), "case %zu: writing the variant: %s", i, err);
        dsf_vision *v = open_vision(dst, DSF_NUMERICS_PLAIN, 1, err);
        if (v) dsf_vision_close(v);
        CHECKF(!v, "case %zu: a malformed projector was accepted", i);
        if (getenv("DSF_TEST_VERBOSE")) fprintf(stderr, "  case %zu: %s\n", i, err);
        for (int k = 0; k < 2; k++) CHECKF(strstr(err, cases[i].want[k]), "case %zu: error '%s' lacks '%s'", i, err, cases[i].want[k]);
    }
}

/* Guards against: refusing (or misreading) the split attn_q/attn_k/attn_v form that the clip
 * loader accepts (gguf-layout.md §5.2): the same values split must give the fused file's block
 * bit for bit (the q, k and v products are separate in both forms' kernels' rows). */
TEST(vision_loader_split_qkv) {
    NEED_SHARED(bfs, VDIR "mmproj-tinyvl.gguf");
    char bf[4096], dst[4096], err[DSF_ERR_LEN] = "";
    snprintf(bf, sizeof bf, "%s", bfs);
    snprintf(dst, sizeof dst, "%s", test_tmpfile("mmproj-split.gguf"));
    variant vr = {.split = true};
    CHECKF(!write_variant(bf, dst, &vr, err), "%s", err);
    float *out[2][2] = {{NULL}};
    dsf_image_plan pl;
    for (int r = 0; r < 2; r++) {
        dsf_vision *v = open_vision(r ? dst : bf, DSF_NUMERICS_PLAIN, 2, err);
        CHECKF(v, "%s", err);
        CHECK(vision_model(v)->layers[0].split == (r == 1));
        int rc = run_key(t, v, "grad", &pl, &out[r][0], &out[r][1]);
        dsf_vision_close(v);
        if (rc) return;
    }
    const bool same = !memcmp(out[0][1], out[1][1], (size_t)pl.n_tokens * 128 * 4);
    for (int r = 0; r < 2; r++) free(out[r][0]), free(out[r][1]);
    CHECK(same);
}

/* ---- dsf_vision_encode on the PNG files ---- */

/* Guards against: an encode path that differs from the tower on the golden patches (decode,
 * plan, cap, span order of the block) or a key that ignores the bytes or the cap: each of the
 * five PNGs (cap-cap20 with its cap of 20) gives the plan of images.json and the fp32 golden
 * block within 1e-4 (README); keys are non-zero, equal for equal input, different for another
 * cap or other bytes. */
TEST(vision_encode_png) {
    NEED_SHARED(projs, VDIR "mmproj-tinyvl.gguf");
    char proj[4096], err[DSF_ERR_LEN] = "";
    snprintf(proj, sizeof proj, "%s", projs);
    dsf_vision *v = open_vision(proj, DSF_NUMERICS_PLAIN, 2, err);
    CHECKF(v, "%s", err);
    static const char *const png[] = {"grad", "wide", "tall", "tiny", "cap"};
    uint64_t key_prev = 0;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, VDIR "images/%s.png", png[i]);
        const char *p = test_shared(rel);
        long sz = 0;
        unsigned char *bytes = p ? test_slurp(p, &sz) : NULL;
        dsf_image_plan gp;
        dsf_image im;
        const int cap = i == 4 ? 20 : 0;
        int rc = bytes && !load_plan(keys[i], &gp) ? dsf_vision_encode(v, bytes, (size_t)sz, cap, &im, err) : -1;
        if (rc) {
            free(bytes), dsf_vision_close(v);
            CHECKF(0, "%s: %s", png[i], bytes ? err : "absent");
        }
        const size_t nb = (size_t)gp.n_tokens * 128;
        float *gb = load_f32(keys[i], "block", nb);
        const bool plan_ok = !memcmp(&im.plan, &gp, sizeof gp) && im.n_embd == 128;
        diff d = gb && plan_ok ? compare(im.block, gb, nb) : (diff){INFINITY, 0};
        dsf_image again, other;
        int r2 = dsf_vision_encode(v, bytes, (size_t)sz, i == 4 ? 21 : 19, &other, err);
        int r3 = dsf_vision_encode(v, bytes, (size_t)sz, cap, &again, err);
        const bool keys_ok = !r2 && !r3 && im.key && im.key == again.key && other.key != im.key && im.key != key_prev;
        key_prev = im.key;
        dsf_image_free(&im), dsf_image_free(&again), dsf_image_free(&other);
        free(bytes), free(gb);
        if (!plan_ok || !(d.max_abs <= 1e-4) || !keys_ok) {
            dsf_vision_close(v);
            CHECKF(0, "%s: plan %s, block max abs %.3g (want <= 1e-4), keys %s", png[i], plan_ok ? "ok" : "differs",
                   d.max_abs, keys_ok ? "ok" : "wrong");
        }
    }
    dsf_vision_close(v);
}

/* Guards against: a crash or an accepted garbage image in the public entry point: corrupt and
 * truncated PNG bytes, and a plan under the smallest token cap, are refused with a message and
 * leave no block behind. */
TEST(vision_encode_refusals) {
    NEED_SHARED(projs, VDIR "mmproj-tinyvl.gguf");
    NEED_SHARED(pngs, VDIR "images/grad.png");
    char proj[4096], err[DSF_ERR_LEN] = "";
    snprintf(proj, sizeof proj, "%s", projs);
    long sz = 0;
    unsigned char *bytes = test_slurp(pngs, &sz);
    CHECK(bytes && sz > 100);
    dsf_vision *v = open_vision(proj, DSF_NUMERICS_PLAIN, 1, err);
    CHECKF(v, "%s", err);
    dsf_image im;
    const struct {
        size_t len;
        int flip, cap;
    } cases[] = {{(size_t)sz / 2, -1, 0}, {(size_t)sz, 0, 0}, {16, -1, 0}, {(size_t)sz, -1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char *b = malloc((size_t)sz);
        memcpy(b, bytes, (size_t)sz);
        if (cases[i].flip >= 0) b[cases[i].flip] ^= 0xff; /* the PNG signature */
        err[0] = 0;
        int rc = dsf_vision_encode(v, b, cases[i].len, cases[i].cap, &im, err);
        free(b);
        if (rc == 0) dsf_image_free(&im);
        if (rc != -1 || !err[0] || im.block) {
            free(bytes), dsf_vision_close(v);
            CHECKF(0, "case %zu: rc %d, error '%s'", i, rc, err);
        }
        if (getenv("DSF_TEST_VERBOSE")) fprintf(stderr, "  case %zu: %s\n", i, err);
    }
    free(bytes);
    dsf_vision_close(v);
}
