/* image_decode.c: the PNG/JPEG decoder (src/io/image.c) on the five tinyvl PNGs, on images
 * written here with libpng's and libjpeg's own encoders, and on broken inputs.
 *
 * Guards against: a wrong size or channel order; alpha composited instead of dropped; a
 * palette, low-bit grey or 16-bit sample converted other than PIL's convert("RGB") does
 * (vision.md §2.1; the 16-bit rules are PIL's: high byte for RGB/RGBA/LA, grey clamped to
 * 255); interlaced PNGs misread; CMYK JPEGs decoded without PIL's Adobe inversion; and
 * corrupt, truncated, wrong-magic, empty or oversized inputs that crash, hang, allocate from
 * the header or are accepted instead of failing with one clear line. */
#include "io/image.h"
#include "base/util.h"
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#define TV "testdata/tinyvl/"

/* ---- independent encoders: libpng and libjpeg write the inputs ------------------------------ */

static void png_wr(png_structp png, png_bytep p, size_t n) { dsf_buf_append(png_get_io_ptr(png), p, n); }
static void png_fl(png_structp png) { (void)png; }

typedef struct {
    int w, h, depth, color, interlace;
    const uint8_t *rows; /* [h][rowbytes] in the file's sample layout (16-bit big-endian) */
    const png_color *pal;
    int pal_n;
    const uint8_t *trns; /* palette alpha, pal_n entries, or NULL */
} png_spec;

/* The PNG of s in b (b->len = 0 on failure). */
static void png_make(const png_spec *s, dsf_buf *b) {
    b->len = 0;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        b->len = 0;
        return;
    }
    png_set_write_fn(png, b, png_wr, png_fl);
    png_set_IHDR(png, info, (png_uint_32)s->w, (png_uint_32)s->h, s->depth, s->color, s->interlace,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->pal) png_set_PLTE(png, info, s->pal, s->pal_n);
    if (s->trns) png_set_tRNS(png, info, s->trns, s->pal_n, NULL);
    png_write_info(png, info);
    size_t rb = png_get_rowbytes(png, info);
    png_bytep *rows = malloc(sizeof *rows * (size_t)s->h);
    for (int y = 0; y < s->h; y++) rows[y] = (png_bytep)s->rows + (size_t)y * rb;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    free(rows);
    png_destroy_write_struct(&png, &info);
}

/* A JPEG of w x h, comps 1/3/4 (in space cs), every pixel = px[0..comps). */
static unsigned long jpeg_make(int w, int h, int comps, J_COLOR_SPACE cs, const uint8_t *px, uint8_t **out) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned long n = 0;
    *out = NULL;
    jpeg_mem_dest(&c, out, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    uint8_t *row = malloc((size_t)w * (size_t)comps);
    for (int x = 0; x < w; x++) memcpy(row + x * comps, px, (size_t)comps);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(row);
    return n;
}

/* PNG's CRC-32 (ISO 3309), to forge headers that only the checks after the CRC refuse. */
static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Rewrites the IHDR of a PNG in b (signature, then IHDR at byte 8) with width w, height h and
 * a correct CRC. */
static void png_set_size(uint8_t *b, uint32_t w, uint32_t h) {
    put_be32(b + 16, w);
    put_be32(b + 20, h);
    put_be32(b + 29, crc32_png(b + 12, 17));
}

/* ---- the five tinyvl images -------------------------------------------------------------- */

TEST(image_decode_tinyvl_pngs) {
    NEED_SHARED(jpath, TV "golden/images.json");
    json_t *js = test_load_json(jpath);
    CHECKF(json_is_object(js), "cannot read %s", jpath);
    const char *key;
    json_t *im;
    int n = 0;
    json_object_foreach(js, key, im) {
        const char *png = json_string_value(json_object_get(im, "png"));
        const char *mode = json_string_value(json_object_get(im, "png_mode"));
        int W = (int)json_integer_value(json_object_get(im, "width"));
        int H = (int)json_integer_value(json_object_get(im, "height"));
        CHECKF(png && mode && W > 0 && H > 0, "%s: images.json lacks png/png_mode/width/height", key);
        char rel[256];
        snprintf(rel, sizeof rel, TV "images/%s", png);
        NEED_SHARED(path, rel);
        long len;
        unsigned char *d = test_slurp(path, &len);
        CHECKF(d, "cannot read %s", path);
        img_rgb8 out;
        char err[DSF_ERR_LEN];
        int rc = img_decode(d, (size_t)len, 0, &out, err);
        free(d);
        CHECKF(rc == 0, "%s: %s", png, err);
        CHECKF(out.w == W && out.h == H, "%s: decoded %dx%d, images.json says %dx%d", png, out.w, out.h, W, H);
        if (strcmp(mode, "L") == 0) /* grey is replicated to R, G, B */
            for (long i = 0; i < (long)W * H; i++)
                CHECKF(out.rgb[3 * i] == out.rgb[3 * i + 1] && out.rgb[3 * i] == out.rgb[3 * i + 2],
                       "%s: grey pixel %ld is not R = G = B", png, i);
        img_free(&out);
        CHECK(out.rgb == NULL);
        n++;
    }
    json_decref(js);
    CHECKF(n == 5, "images.json lists %d images, the README five", n);
}

/* ---- PIL's conversions, on PNGs libpng writes --------------------------------------------- */

/* Decodes the PNG of s and compares with want [h][w][3]. */
static int png_expect(test_ctx *t, const png_spec *s, const uint8_t *want, const char *what) {
    dsf_buf b = {0};
    png_make(s, &b);
    img_rgb8 out;
    char err[DSF_ERR_LEN];
    int ok = b.len > 0;
    if (!ok) test_fail(t, __FILE__, __LINE__, "%s: libpng could not write the test image", what);
    if (ok && img_decode(b.data, b.len, 0, &out, err)) {
        test_fail(t, __FILE__, __LINE__, "%s: %s", what, err);
        ok = 0;
    } else if (ok) {
        if (out.w != s->w || out.h != s->h) {
            test_fail(t, __FILE__, __LINE__, "%s: size %dx%d", what, out.w, out.h);
            ok = 0;
        }
        for (int i = 0; ok && i < s->w * s->h * 3; i++)
            if (out.rgb[i] != want[i]) {
                test_fail(t, __FILE__, __LINE__, "%s: byte %d (pixel %d) is %d, PIL gives %d", what, i, i / 3,
                          out.rgb[i], want[i]);
                ok = 0;
            }
        img_free(&out);
    }
    dsf_buf_free(&b);
    return ok;
}

TEST(image_decode_png_modes) {
    /* RGBA 8-bit: alpha dropped, colour kept as stored (a fully transparent red stays red). */
    static const uint8_t rgba[] = {255, 0, 0, 0, 10, 20, 30, 128, 1, 2, 3, 255};
    static const uint8_t rgba_w[] = {255, 0, 0, 10, 20, 30, 1, 2, 3};
    png_spec s = {3, 1, 8, PNG_COLOR_TYPE_RGBA, PNG_INTERLACE_NONE, rgba, NULL, 0, NULL};
    if (!png_expect(t, &s, rgba_w, "RGBA8")) return;
    /* grey+alpha 8-bit */
    static const uint8_t la[] = {7, 0, 200, 99};
    static const uint8_t la_w[] = {7, 7, 7, 200, 200, 200};
    s = (png_spec){2, 1, 8, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_INTERLACE_NONE, la, NULL, 0, NULL};
    if (!png_expect(t, &s, la_w, "LA8")) return;
    /* palette with tRNS: the colour of the entry, transparency ignored; 4-bit indices */
    static const png_color pal[3] = {{10, 20, 30}, {40, 50, 60}, {250, 0, 5}};
    static const uint8_t trns[3] = {0, 128, 255};
    static const uint8_t p4[] = {0x21, 0x00}; /* indices 2, 1, 0 (high nibble first) */
    static const uint8_t p4_w[] = {250, 0, 5, 40, 50, 60, 10, 20, 30};
    s = (png_spec){3, 1, 4, PNG_COLOR_TYPE_PALETTE, PNG_INTERLACE_NONE, p4, pal, 3, trns};
    if (!png_expect(t, &s, p4_w, "P4+tRNS")) return;
    s.trns = NULL;
    if (!png_expect(t, &s, p4_w, "P4")) return;
    /* 1-bit and 2-bit grey: scaled to 0/255 and 0/85/170/255 */
    static const uint8_t g1[] = {0xA0}; /* 1, 0, 1 */
    static const uint8_t g1_w[] = {255, 255, 255, 0, 0, 0, 255, 255, 255};
    s = (png_spec){3, 1, 1, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, g1, NULL, 0, NULL};
    if (!png_expect(t, &s, g1_w, "L1")) return;
    static const uint8_t g2[] = {0x1B}; /* 0, 1, 2, 3 */
    static const uint8_t g2_w[] = {0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255};
    s = (png_spec){4, 1, 2, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, g2, NULL, 0, NULL};
    if (!png_expect(t, &s, g2_w, "L2")) return;
}

TEST(image_decode_png_16bit) {
    /* RGB 16: the high byte (PIL "RGB;16B"), never rounded: 0x12FF -> 0x12 */
    static const uint8_t rgb16[] = {0x12, 0xFF, 0x80, 0x01, 0xFF, 0xFF, 0x00, 0xFF, 0x7F, 0x80, 0x01, 0x00};
    static const uint8_t rgb16_w[] = {0x12, 0x80, 0xFF, 0x00, 0x7F, 0x01};
    png_spec s = {2, 1, 16, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, rgb16, NULL, 0, NULL};
    if (!png_expect(t, &s, rgb16_w, "RGB16")) return;
    /* RGBA 16 and LA 16: high bytes, alpha dropped */
    static const uint8_t rgba16[] = {0xAB, 0xCD, 0x01, 0x02, 0xFE, 0xFF, 0x00, 0x00};
    static const uint8_t rgba16_w[] = {0xAB, 0x01, 0xFE};
    s = (png_spec){1, 1, 16, PNG_COLOR_TYPE_RGBA, PNG_INTERLACE_NONE, rgba16, NULL, 0, NULL};
    if (!png_expect(t, &s, rgba16_w, "RGBA16")) return;
    static const uint8_t la16[] = {0x9A, 0xFF, 0x00, 0x00};
    static const uint8_t la16_w[] = {0x9A, 0x9A, 0x9A};
    s = (png_spec){1, 1, 16, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_INTERLACE_NONE, la16, NULL, 0, NULL};
    if (!png_expect(t, &s, la16_w, "LA16")) return;
    /* grey 16: PIL opens it as mode I and convert("RGB") clamps: 200 -> 200, 255 -> 255,
     * 256 -> 255, 0x8000 -> 255 (not the high byte 0x80) */
    static const uint8_t g16[] = {0x00, 0xC8, 0x00, 0xFF, 0x01, 0x00, 0x80, 0x00};
    static const uint8_t g16_w[] = {200, 200, 200, 255, 255, 255, 255, 255, 255, 255, 255, 255};
    s = (png_spec){4, 1, 16, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, g16, NULL, 0, NULL};
    if (!png_expect(t, &s, g16_w, "L16")) return;
}

TEST(image_decode_png_interlaced) {
    /* An Adam7 image must give the same pixels as its plain twin: every pixel distinct. */
    enum { W = 13, H = 11 };
    static uint8_t px[W * H * 3];
    for (int i = 0; i < W * H * 3; i++) px[i] = (uint8_t)(i * 7 + i / 3);
    png_spec s = {W, H, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_ADAM7, px, NULL, 0, NULL};
    if (!png_expect(t, &s, px, "RGB8 Adam7")) return;
    static uint8_t g[W * H], gw[W * H * 3];
    for (int i = 0; i < W * H; i++) g[i] = (uint8_t)(255 - i), gw[3 * i] = gw[3 * i + 1] = gw[3 * i + 2] = g[i];
    s = (png_spec){W, H, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_ADAM7, g, NULL, 0, NULL};
    if (!png_expect(t, &s, gw, "L8 Adam7")) return;
}

/* ---- JPEG ------------------------------------------------------------------------------- */

/* Lossy: a flat image decodes within this of its value (quality 95, no edges). */
#define JPEG_TOL 3

TEST(image_decode_jpeg) {
    static const struct {
        int comps;
        J_COLOR_SPACE cs;
        uint8_t px[4], want[3];
    } cases[] = {
        {3, JCS_RGB, {200, 100, 50, 0}, {200, 100, 50}},
        {1, JCS_GRAYSCALE, {77, 0, 0, 0}, {77, 77, 77}},
        /* stored CMYK (255, 0, 255, 255) is PIL's CMYK (0, 255, 0, 0) after its Adobe inversion:
         * magenta ink only -> RGB (255, 0, 255) */
        {4, JCS_CMYK, {255, 0, 255, 255}, {255, 0, 255}},
        /* stored (255, 255, 255, 127): no C/M/Y ink, K = 128 -> nk = 127 -> grey 127 */
        {4, JCS_CMYK, {255, 255, 255, 127}, {127, 127, 127}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        uint8_t *j;
        unsigned long n = jpeg_make(37, 19, cases[k].comps, cases[k].cs, cases[k].px, &j);
        CHECKF(n > 0, "libjpeg could not write case %zu", k);
        img_rgb8 out;
        char err[DSF_ERR_LEN];
        int rc = img_decode(j, n, 0, &out, err);
        if (rc == 0) {
            /* truncated in the entropy-coded data: an error, never a grey-filled image */
            img_rgb8 o2;
            CHECKF(img_decode(j, n * 2 / 3, 0, &o2, err) == -1 && strstr(err, "truncated"),
                   "case %zu: a truncated JPEG: %s", k, err);
            CHECKF(img_decode(j, n, 37L * 19 - 1, &o2, err) == -1 && strstr(err, "pixels allowed"),
                   "case %zu: the pixel cap: %s", k, err);
        }
        free(j);
        CHECKF(rc == 0, "case %zu: %s", k, err);
        CHECKF(out.w == 37 && out.h == 19, "case %zu: size %dx%d", k, out.w, out.h);
        for (int i = 0; i < 37 * 19; i++)
            for (int c = 0; c < 3; c++) {
                int d = out.rgb[3 * i + c] - cases[k].want[c];
                CHECKF(d >= -JPEG_TOL && d <= JPEG_TOL, "case %zu: pixel %d channel %d is %d, want %d", k, i, c,
                       out.rgb[3 * i + c], cases[k].want[c]);
            }
        img_free(&out);
    }
}

/* ---- broken input -------------------------------------------------------------------------- */

/* Expects img_decode to fail with a message containing want; out stays empty. */
static int expect_err(test_ctx *t, const uint8_t *d, size_t n, long cap, const char *want, const char *what) {
    img_rgb8 out = {1, 1, (uint8_t *)1};
    char err[DSF_ERR_LEN] = "";
    int rc = img_decode(d, n, cap, &out, err);
    if (rc != -1 || out.rgb || !strstr(err, want) || strchr(err, '\n')) {
        test_fail(t, __FILE__, __LINE__, "%s: rc %d, err '%s' (want '%s')", what, rc, err, want);
        if (rc == 0) img_free(&out);
        return 0;
    }
    return 1;
}

TEST(image_decode_broken) {
    enum { W = 9, H = 6 };
    static uint8_t px[W * H * 3];
    for (int i = 0; i < W * H * 3; i++) px[i] = (uint8_t)(i * 13);
    png_spec s = {W, H, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, px, NULL, 0, NULL};
    dsf_buf b = {0};
    png_make(&s, &b);
    CHECK(b.len > 33);
    uint8_t *d = b.data;
    size_t n = b.len;
    img_rgb8 out;
    char err[DSF_ERR_LEN];
    CHECKF(img_decode(d, n, W * H, &out, err) == 0, "the intact image at a cap of exactly its pixels: %s", err);
    img_free(&out);

    static const uint8_t gif[] = "GIF89a\x01\x00\x01\x00\x00\x00\x00;";
    if (!expect_err(t, gif, sizeof gif - 1, 0, "image: unsupported format (not PNG or JPEG)", "GIF")) return;
    if (!expect_err(t, (const uint8_t *)"", 0, 0, "unsupported format", "empty")) return;
    if (!expect_err(t, d, 7, 0, "unsupported format", "7 bytes of a PNG signature")) return;
    if (!expect_err(t, d, W * H - 1, W * H - 1, "pixels allowed", "the pixel cap")) return;
    /* Cut anywhere before IEND (PIL, too, accepts a file whose IEND is missing). */
    for (size_t cut = 8; cut < n - 12; cut++)
        if (!expect_err(t, d, cut, 0, "image: ", "a truncated PNG")) return;
    if (!expect_err(t, d, n - 20, 0, "truncated", "a PNG cut in IDAT")) return;

    uint8_t *m = malloc(n);
    memcpy(m, d, n);
    m[18] ^= 1; /* a bit of the width, CRC unchanged */
    if (!expect_err(t, m, n, 0, "CRC", "IHDR with a bad CRC")) return;
    memcpy(m, d, n);
    m[n - 16] ^= 0x40; /* a bit of IDAT's CRC (IEND's 12 bytes follow it) */
    if (!expect_err(t, m, n, 0, "CRC", "IDAT with a bad CRC")) return;
    memcpy(m, d, n);
    png_set_size(m, 0, H);
    if (!expect_err(t, m, n, 0, "corrupt PNG", "width 0")) return;
    memcpy(m, d, n);
    png_set_size(m, 60000, 60000); /* 3.6 Gpixel: refused from the header, nothing allocated */
    if (!expect_err(t, m, n, 0, "pixels allowed", "a 60000x60000 header")) return;
    memcpy(m, d, n);
    png_set_size(m, W, H + 1); /* one row more than IDAT holds */
    if (!expect_err(t, m, n, 0, "image: ", "a short IDAT")) return;
    free(m);
    dsf_buf_free(&b);

    static const uint8_t jpeg_junk[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x02, 0xFF, 0xD9};
    if (!expect_err(t, jpeg_junk, sizeof jpeg_junk, 0, "corrupt JPEG", "a JPEG without a frame")) return;
    static const uint8_t jpeg_cut[] = {0xFF, 0xD8, 0xFF};
    if (!expect_err(t, jpeg_cut, sizeof jpeg_cut, 0, "image: ", "a JPEG of 3 bytes")) return;
}
