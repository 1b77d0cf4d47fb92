/* vision/prep.c: see prep.h. Owns the resize plan (vision.md §2.2), the ImageOps.pad geometry
 * (§2.3), Pillow's BICUBIC resampling with its 22-bit fixed point (§2.4), the normalisation
 * table (§2.5) and the patch layout (§2.6).
 * Must not: decode files, run the tower, or reorder a floating-point operation: every double
 * and float operation below is the one the spec writes, in its order (the Makefile builds with
 * -ffp-contract=off, so no FMA merges two of them).
 * Invariants: the output is a pure function of the pixels and the plan; vis_patches writes
 * exactly n_vit_h * n_vit_w * 3 p^2 floats, each a bf16 value. */
#include "vision/prep.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Plans are refused for sides past this (a decoded image is capped long before). */
#define PREP_MAX_SIDE 100000000
/* The token cap's range: the block needs START, one cell, NEWLINE, END; an upper bound keeps
 * every integer product below far from overflow. */
#define PREP_MIN_TOKENS 4
#define PREP_MAX_TOKENS (1 << 20)

/* Python's round() on a double: half to even. */
static long round_half_even(double x) {
    double f = floor(x), d = x - f;
    long r = (long)f;
    if (d > 0.5 || (d == 0.5 && (r & 1))) r++;
    return r;
}

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

/* ==== the plan (§2.2, §2.3) ================================================================ */

/* The aligner grid of a best_w x best_h canvas and its span length. */
static void llm_grid(const vis_prep_cfg *c, long best_w, long best_h, long *nw, long *nh, long *tokens) {
    *nh = ceil_div(best_h / c->patch, c->merge);
    *nw = ceil_div(best_w / c->patch, c->merge);
    *tokens = *nh * (*nw + 1) + 2;
}

int vis_plan(const vis_prep_cfg *c, int W, int H, dsf_image_plan *out, char *err) {
    memset(out, 0, sizeof *out);
    if (W <= 0 || H <= 0 || W > PREP_MAX_SIDE || H > PREP_MAX_SIDE)
        return dsf_seterr(err, "vision: image size %dx%d is out of range", W, H);
    if (c->patch <= 0 || c->merge <= 0 || c->patch > 4096 || c->merge > 64 || c->min_pixels < 0 ||
        c->min_pixels > (1L << 40))
        return dsf_seterr(err, "vision: bad preprocessing config (patch %d, merge %d, min_pixels %ld)", c->patch,
                          c->merge, c->min_pixels);
    if (c->max_tokens < PREP_MIN_TOKENS || c->max_tokens > PREP_MAX_TOKENS)
        return dsf_seterr(err, "vision: image token cap %d is out of range (%d..%d)", c->max_tokens,
                          PREP_MIN_TOKENS, PREP_MAX_TOKENS);
    const long p = c->patch, M = c->max_tokens;
    long w = W, h = H;
    if (w * h < c->min_pixels) {
        double s = sqrt((double)c->min_pixels / (double)(w * h)); /* vision.md: sqrt, not pow(x, 0.5) */
        w = (long)((double)w * s);
        h = (long)((double)h * s);
    }
    if (w <= 0 || h <= 0) return dsf_seterr(err, "vision: image size %dx%d plans to an empty canvas", W, H);
    long best_w = ceil_div(w, p) * p, best_h = ceil_div(h, p) * p;
    long n_llm_w, n_llm_h, tokens;
    llm_grid(c, best_w, best_h, &n_llm_w, &n_llm_h, &tokens);
    if (tokens > M) { /* the cap solve, on the min_pixels-scaled w, h */
        double q = (double)h / (double)w;
        double mw = sqrt((double)(M - 2) / q + 0.25) - 0.5;
        double mh = mw * q;
        long cell = p * c->merge;
        if (mw < 1) {
            best_h = (M - 2) / 2 * cell;
            best_w = cell;
        } else if (mh < 1) {
            best_h = cell;
            best_w = (M - 3) * cell;
        } else {
            double bw = (double)((long)floor(mw) * cell) / (double)w;
            double bh = (double)((long)floor(mh) * cell) / (double)h;
            double beta = bw < bh ? bw : bh;
            best_h = (long)floor((double)h * beta / (double)p) * p;
            best_w = (long)floor((double)w * beta / (double)p) * p;
        }
        llm_grid(c, best_w, best_h, &n_llm_w, &n_llm_h, &tokens);
        if (best_w <= 0 || best_h <= 0 || tokens > M)
            return dsf_seterr(err, "vision: image size %dx%d: the token cap %ld cannot be met", W, H, M);
    }
    out->width = W, out->height = H;
    out->best_w = (int)best_w, out->best_h = (int)best_h;
    out->n_vit_w = (int)(best_w / p), out->n_vit_h = (int)(best_h / p);
    out->n_llm_w = (int)n_llm_w, out->n_llm_h = (int)n_llm_h;
    out->n_tokens = (int)tokens;
    /* §2.3: ImageOps.pad's contain() target, then the paste offset (centering 0.5) */
    long nw = best_w, nh = best_h;
    double im_ratio = (double)W / (double)H, dest_ratio = (double)best_w / (double)best_h;
    if (im_ratio != dest_ratio) {
        if (im_ratio > dest_ratio)
            nh = round_half_even((double)H / (double)W * (double)best_w);
        else
            nw = round_half_even((double)W / (double)H * (double)best_h);
    }
    out->resized_w = (int)nw, out->resized_h = (int)nh;
    if (nw <= 0 || nh <= 0)
        return dsf_seterr(err, "vision: image %dx%d resizes to an empty %ldx%ld (aspect ratio too extreme for "
                               "the %dx%d canvas)", W, H, nw, nh, out->best_w, out->best_h);
    if (nw != best_w)
        out->off_x = (int)round_half_even((double)(best_w - nw) * 0.5);
    else if (nh != best_h)
        out->off_y = (int)round_half_even((double)(best_h - nh) * 0.5);
    return 0;
}

/* ==== Pillow BICUBIC (§2.4) =================================================================== */

#define PREP_PRECISION_BITS 22

/* Keys' cubic with a = -0.5, written as Pillow evaluates it. */
static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

int vis_bicubic_taps(int in, int out) {
    double scale = (double)in / (double)out, fs = scale < 1.0 ? 1.0 : scale;
    return (int)ceil(2.0 * fs) * 2 + 1;
}

int vis_bicubic_row(int in, int out, int o, int *lo, int32_t *iw) {
    double scale = (double)in / (double)out;
    double fs = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * fs;
    double center = (o + 0.5) * scale;
    double ss = 1.0 / fs;
    int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
    if (xmin < 0) xmin = 0;
    if (xmax > in) xmax = in;
    int n = xmax - xmin;
    double sum = 0.0;
    for (int k = 0; k < n; k++) sum += bicubic((k + xmin - center + 0.5) * ss);
    for (int k = 0; k < n; k++) { /* the same weights again (no scratch of ksize doubles) */
        double v = bicubic((k + xmin - center + 0.5) * ss);
        if (sum != 0.0) v = v / sum;
        iw[k] = v < 0 ? (int32_t)(-0.5 + v * (1 << PREP_PRECISION_BITS))
                      : (int32_t)(0.5 + v * (1 << PREP_PRECISION_BITS));
    }
    *lo = xmin;
    return n;
}

static uint8_t clip8(int64_t acc) {
    if (acc < 0) return 0;
    acc >>= PREP_PRECISION_BITS;
    return (uint8_t)(acc > 255 ? 255 : acc);
}

/* The coefficient table of one pass: per output index its first tap and ksize weights
 * (unused taps 0). */
typedef struct {
    int ksize;
    int *lo, *n;
    int32_t *w; /* [out][ksize] */
} coeffs;

static int coeffs_make(int in, int out, coeffs *k, char *err) {
    k->ksize = vis_bicubic_taps(in, out);
    k->lo = malloc(sizeof *k->lo * (size_t)out);
    k->n = malloc(sizeof *k->n * (size_t)out);
    k->w = calloc((size_t)out * (size_t)k->ksize, sizeof *k->w);
    if (!k->lo || !k->n || !k->w) return dsf_seterr(err, "vision: out of memory for resize coefficients");
    for (int o = 0; o < out; o++) k->n[o] = vis_bicubic_row(in, out, o, &k->lo[o], k->w + (size_t)o * k->ksize);
    return 0;
}

static void coeffs_free(coeffs *k) {
    free(k->lo);
    free(k->n);
    free(k->w);
}

/* Horizontal pass: src [h][sw][3] -> dst [h][dw][3]. */
static void pass_h(const uint8_t *src, int sw, int h, uint8_t *dst, int dw, const coeffs *k) {
    for (int y = 0; y < h; y++) {
        const uint8_t *s = src + (size_t)y * sw * 3;
        uint8_t *d = dst + (size_t)y * dw * 3;
        for (int o = 0; o < dw; o++) {
            const int32_t *w = k->w + (size_t)o * k->ksize;
            const uint8_t *sp = s + (size_t)k->lo[o] * 3;
            for (int ch = 0; ch < 3; ch++) {
                int64_t acc = 1 << (PREP_PRECISION_BITS - 1);
                for (int t = 0; t < k->n[o]; t++) acc += (int64_t)sp[3 * t + ch] * w[t];
                d[3 * o + ch] = clip8(acc);
            }
        }
    }
}

/* Vertical pass: src [sh][w][3] -> dst [dh][w][3]. */
static void pass_v(const uint8_t *src, int w, uint8_t *dst, int dh, const coeffs *k) {
    size_t stride = (size_t)w * 3;
    for (int o = 0; o < dh; o++) {
        const int32_t *wt = k->w + (size_t)o * k->ksize;
        const uint8_t *s = src + (size_t)k->lo[o] * stride;
        uint8_t *d = dst + (size_t)o * stride;
        for (size_t x = 0; x < stride; x++) {
            int64_t acc = 1 << (PREP_PRECISION_BITS - 1);
            for (int t = 0; t < k->n[o]; t++) acc += (int64_t)s[(size_t)t * stride + x] * wt[t];
            d[x] = clip8(acc);
        }
    }
}

/* Pillow's resize(BICUBIC) of a W x H RGB image to dw x dh into dst (malloc'ed [dh][dw][3]):
 * horizontal pass first, uint8 between the passes, a pass only where its axis changes. */
static int resize_bicubic(const img_rgb8 *img, int dw, int dh, uint8_t *dst, char *err) {
    int W = img->w, H = img->h;
    if (dw == W && dh == H) {
        memcpy(dst, img->rgb, (size_t)W * H * 3);
        return 0;
    }
    coeffs kh = {0}, kv = {0};
    uint8_t *tmp = NULL;
    int rc = -1;
    if (dw != W && coeffs_make(W, dw, &kh, err)) goto done;
    if (dh != H && coeffs_make(H, dh, &kv, err)) goto done;
    if (dw != W && dh != H) {
        tmp = malloc((size_t)dw * H * 3);
        if (!tmp) {
            dsf_seterr(err, "vision: out of memory for a %dx%d resize", dw, H);
            goto done;
        }
        pass_h(img->rgb, W, H, tmp, dw, &kh);
        pass_v(tmp, dw, dst, dh, &kv);
    } else if (dw != W) {
        pass_h(img->rgb, W, H, dst, dw, &kh);
    } else {
        pass_v(img->rgb, W, dst, dh, &kv);
    }
    rc = 0;
done:
    free(tmp);
    coeffs_free(&kh);
    coeffs_free(&kv);
    return rc;
}

/* ==== normalisation and patches (§2.5, §2.6) ==================================================== */

static float bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

float vis_norm_value(int v) {
    float x = (float)v / 255.0f; /* one float32 operation each, as the reference runs them */
    x = x - 0.5f;
    x = x / 0.5f;
    return bf16_rne(x);
}

/* The plan's geometry checked against the image and the config, so that vis_patches never
 * reads or writes outside its buffers whatever plan it is handed. */
static int plan_fits(const vis_prep_cfg *c, const img_rgb8 *img, const dsf_image_plan *pl, char *err) {
    if (!img->rgb || img->w <= 0 || img->h <= 0 || pl->width != img->w || pl->height != img->h)
        return dsf_seterr(err, "vision: the plan is for a %dx%d image, got %dx%d", pl->width, pl->height, img->w,
                          img->h);
    if (c->patch <= 0 || pl->n_vit_w <= 0 || pl->n_vit_h <= 0 || pl->best_w != pl->n_vit_w * c->patch ||
        pl->best_h != pl->n_vit_h * c->patch || pl->resized_w <= 0 || pl->resized_h <= 0 || pl->off_x < 0 ||
        pl->off_y < 0 || pl->off_x + pl->resized_w > pl->best_w || pl->off_y + pl->resized_h > pl->best_h)
        return dsf_seterr(err, "vision: inconsistent image plan (canvas %dx%d, resized %dx%d at %d,%d)", pl->best_w,
                          pl->best_h, pl->resized_w, pl->resized_h, pl->off_x, pl->off_y);
    return 0;
}

int vis_patches(const vis_prep_cfg *c, const img_rgb8 *img, const dsf_image_plan *pl, float *out, char *err) {
    if (plan_fits(c, img, pl, err)) return -1;
    const int p = c->patch, bw = pl->best_w, bh = pl->best_h, rw = pl->resized_w, rh = pl->resized_h;
    uint8_t *canvas = malloc((size_t)bw * bh * 3), *rs = malloc((size_t)rw * rh * 3);
    if (!canvas || !rs) {
        free(canvas);
        free(rs);
        return dsf_seterr(err, "vision: out of memory for a %dx%d canvas", bw, bh);
    }
    if (resize_bicubic(img, rw, rh, rs, err)) {
        free(canvas);
        free(rs);
        return -1;
    }
    memset(canvas, 127, (size_t)bw * bh * 3); /* the letterbox is 8-bit 127 in every channel */
    for (int y = 0; y < rh; y++)
        memcpy(canvas + ((size_t)(y + pl->off_y) * bw + pl->off_x) * 3, rs + (size_t)y * rw * 3, (size_t)rw * 3);
    free(rs);
    float norm[256];
    for (int v = 0; v < 256; v++) norm[v] = vis_norm_value(v);
    const size_t pd = (size_t)3 * p * p;
    for (int pi = 0; pi < pl->n_vit_h; pi++)
        for (int pj = 0; pj < pl->n_vit_w; pj++) {
            float *o = out + ((size_t)pi * pl->n_vit_w + pj) * pd;
            for (int ch = 0; ch < 3; ch++)
                for (int dy = 0; dy < p; dy++) {
                    const uint8_t *row = canvas + ((size_t)(pi * p + dy) * bw + (size_t)pj * p) * 3;
                    for (int dx = 0; dx < p; dx++) o[((size_t)ch * p + dy) * p + dx] = norm[row[3 * dx + ch]];
                }
        }
    free(canvas);
    return 0;
}
