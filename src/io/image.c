/* io/image.c: see image.h. Owns the format sniffing, the libpng and libjpeg-turbo decoders
 * over a memory buffer, their error hooks (setjmp/longjmp to -1 + one line) and the
 * conversion of every sample layout to 8-bit RGB as PIL's Image.open(...).convert("RGB")
 * gives it (vision.md §2.1).
 * Must not: resize or know the vision model; allocate from a header field before the size
 * passed the pixel cap.
 * Invariants: the caps are checked on the header's size before any pixel buffer exists; a
 * truncated stream is an error (never a grey-filled image); warnings of either library are
 * ignored, as PIL ignores them.
 *
 * PIL's rules copied here (Pillow PngImagePlugin / JpegImagePlugin, Unpack.c, Convert.c):
 * - PNG grey of 1, 2, 4 bits is scaled to 8 bits (x 255, 85, 17); a palette is looked up
 *   (an index past the PLTE entries gives black, as libpng and current Pillow do);
 *   tRNS, alpha and gamma chunks change no colour value;
 * - 16-bit PNG: RGB, RGBA and grey+alpha keep the HIGH byte of each sample (PIL's
 *   "RGB;16B", "RGBA;16B", "LA;16B" unpackers); 16-bit grey opens as mode I (0..65535) and
 *   convert("RGB") CLAMPS it to 255 (Convert.c i2rgb), so every value >= 255 is white;
 * - JPEG grey is replicated, YCbCr is converted by libjpeg to RGB (PIL asks libjpeg for RGB);
 *   4-component JPEG (CMYK or YCCK) is read as CMYK with Adobe's inverted convention (PIL
 *   assumes it for every CMYK JPEG) and converted with PIL's cmyk2rgb:
 *   nk = 255 - K, out = clamp(nk - (C * nk) / 255 rounded as MULDIV255). */
#include "io/image.h"
#include "base/util.h"

#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

/* The largest side either decoder is asked for, whatever the pixel cap: a side past this is
 * a broken or hostile header (libjpeg's own limit is 65500). */
#define IMG_MAX_SIDE 1000000

/* Checks the header's size against the caps; 0 or -1 + err. */
static int check_size(const char *fmt, long w, long h, long max_pixels, char *err) {
    if (w <= 0 || h <= 0) return dsf_seterr(err, "image: %s has an empty size %ldx%ld", fmt, w, h);
    if (w > IMG_MAX_SIDE || h > IMG_MAX_SIDE)
        return dsf_seterr(err, "image: %s size %ldx%ld is too large (a side over %d)", fmt, w, h, IMG_MAX_SIDE);
    if ((double)w * (double)h > (double)max_pixels)
        return dsf_seterr(err, "image: %s size %ldx%ld has more than the %ld pixels allowed", fmt, w, h,
                          max_pixels);
    return 0;
}

/* A malloc'ed [h][w][3] buffer (the size passed check_size), or NULL + err. */
static uint8_t *alloc_rgb(int w, int h, char *err) {
    uint8_t *p = malloc((size_t)w * (size_t)h * 3);
    if (!p) dsf_seterr(err, "image: out of memory for %dx%d pixels", w, h);
    return p;
}

/* ==== PNG ================================================================================== */

typedef struct {
    const uint8_t *data;
    size_t len, pos;
    long max_pixels;
    char *err;
    img_rgb8 *out;
    uint8_t *raw;      /* the undecoded rows: one row, or all of them when interlaced */
    png_bytep *rows;   /* [h] row pointers into raw (interlaced images) */
    jmp_buf jb;
} png_ctx;

static void png_err_fn(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    if (c->err && !c->err[0]) dsf_seterr(c->err, "image: corrupt PNG: %s", msg);
    dsf_err_oneline(c->err);
    longjmp(c->jb, 1);
}

static void png_warn_fn(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static void png_read_fn(png_structp png, png_bytep dst, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) {
        dsf_seterr(c->err, "image: truncated PNG data (%zu bytes)", c->len);
        longjmp(c->jb, 1);
    }
    memcpy(dst, c->data + c->pos, n);
    c->pos += n;
}

typedef struct {
    int w, color, depth, palette_n;
    png_colorp palette;
} png_layout;

/* One decoded row (libpng's layout after png_set_packing: one sample per byte below 8 bits,
 * big-endian pairs at 16 bits) to RGB, with the rules of the file header. */
static void png_row_rgb(const png_layout *l, const uint8_t *src, uint8_t *dst) {
    int w = l->w, d = l->depth;
    switch (l->color) {
    case PNG_COLOR_TYPE_GRAY:
        for (int x = 0; x < w; x++) {
            int v;
            if (d == 16) {
                int v16 = src[2 * x] << 8 | src[2 * x + 1];
                v = v16 > 255 ? 255 : v16; /* PIL mode I -> RGB clamps */
            } else {
                v = src[x] * (d == 1 ? 255 : d == 2 ? 85 : d == 4 ? 17 : 1);
            }
            dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = (uint8_t)v;
        }
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA: {
        int step = d == 16 ? 4 : 2;
        for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = src[step * x];
        break;
    }
    case PNG_COLOR_TYPE_PALETTE:
        for (int x = 0; x < w; x++) {
            int i = src[x];
            if (i < l->palette_n) {
                dst[3 * x] = l->palette[i].red;
                dst[3 * x + 1] = l->palette[i].green;
                dst[3 * x + 2] = l->palette[i].blue;
            } else {
                dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = 0;
            }
        }
        break;
    default: { /* RGB, RGBA at 8 or 16 bits: the first (high) byte of each of the first 3 samples */
        int bps = d == 16 ? 2 : 1, ch = l->color == PNG_COLOR_TYPE_RGB ? 3 : 4;
        for (int x = 0; x < w; x++)
            for (int k = 0; k < 3; k++) dst[3 * x + k] = src[(ch * x + k) * bps];
        break;
    }
    }
}

/* The decoder proper; every libpng error lands at the setjmp with c->err written. */
static int png_run(png_ctx *c, png_structp png, png_infop info) {
    if (setjmp(c->jb)) return -1;
    png_set_error_fn(png, c, png_err_fn, png_warn_fn);
    png_set_read_fn(png, c, png_read_fn);
    png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, color, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, NULL, NULL);
    if (check_size("PNG", (long)w, (long)h, c->max_pixels, c->err)) return -1;
    png_layout l = {.w = (int)w, .color = color, .depth = depth};
    if (color == PNG_COLOR_TYPE_PALETTE && !png_get_PLTE(png, info, &l.palette, &l.palette_n))
        return dsf_seterr(c->err, "image: corrupt PNG: a palette image without a PLTE chunk");
    if (depth < 8) png_set_packing(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (rowbytes < (size_t)w || rowbytes > (size_t)w * 8)
        return dsf_seterr(c->err, "image: PNG row of %zu bytes for width %u", rowbytes, (unsigned)w);
    c->out->rgb = alloc_rgb((int)w, (int)h, c->err);
    if (!c->out->rgb) return -1;
    c->out->w = (int)w;
    c->out->h = (int)h;
    if (passes == 1) {
        c->raw = malloc(rowbytes);
        if (!c->raw) return dsf_seterr(c->err, "image: out of memory for a PNG row");
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(png, c->raw, NULL);
            png_row_rgb(&l, c->raw, c->out->rgb + (size_t)y * w * 3);
        }
    } else { /* Adam7: the passes fill the whole image in place */
        c->raw = malloc(rowbytes * h);
        c->rows = malloc(sizeof *c->rows * h);
        if (!c->raw || !c->rows) return dsf_seterr(c->err, "image: out of memory for an interlaced PNG");
        for (png_uint_32 y = 0; y < h; y++) c->rows[y] = c->raw + (size_t)y * rowbytes;
        png_read_image(png, c->rows);
        for (png_uint_32 y = 0; y < h; y++) png_row_rgb(&l, c->rows[y], c->out->rgb + (size_t)y * w * 3);
    }
    /* The pixels are complete; the chunks after IDAT (and IEND) are not needed. */
    return 0;
}

static int png_decode(const uint8_t *data, size_t len, long max_pixels, img_rgb8 *out, char *err) {
    png_ctx c = {.data = data, .len = len, .max_pixels = max_pixels, .err = err, .out = out};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return dsf_seterr(err, "image: cannot start the PNG decoder");
    }
    int rc = png_run(&c, png, info);
    png_destroy_read_struct(&png, &info, NULL);
    free(c.raw);
    free(c.rows);
    return rc;
}

/* ==== JPEG ================================================================================= */

typedef struct {
    struct jpeg_error_mgr pub;
    char *err;
    jmp_buf jb;
} jpeg_errctx;

static void jpeg_exit_fn(j_common_ptr ci) {
    jpeg_errctx *e = (jpeg_errctx *)ci->err;
    if (e->err && !e->err[0]) {
        char msg[JMSG_LENGTH_MAX];
        e->pub.format_message(ci, msg);
        dsf_seterr(e->err, "image: corrupt JPEG: %s", msg);
        dsf_err_oneline(e->err);
    }
    longjmp(e->jb, 1);
}

static void jpeg_msg_fn(j_common_ptr ci, int level) { (void)ci, (void)level; }

/* A source over the whole buffer that refuses to run past its end: libjpeg's own memory
 * source would insert an EOI and return a partly grey image, where PIL reports truncation. */
static void src_init(j_decompress_ptr ci) { (void)ci; }
static boolean src_fill(j_decompress_ptr ci) {
    jpeg_errctx *e = (jpeg_errctx *)ci->err;
    dsf_seterr(e->err, "image: truncated JPEG data");
    longjmp(e->jb, 1);
}
static void src_skip(j_decompress_ptr ci, long n) {
    struct jpeg_source_mgr *s = ci->src;
    if (n <= 0) return;
    if ((size_t)n > s->bytes_in_buffer) src_fill(ci);
    s->next_input_byte += n;
    s->bytes_in_buffer -= (size_t)n;
}
static void src_term(j_decompress_ptr ci) { (void)ci; }

typedef struct {
    long max_pixels;
    char *err;
    img_rgb8 *out;
    uint8_t *row; /* one decoded scanline (4 samples per pixel at most) */
} jpeg_ctx;

/* MULDIV255 of Pillow's Convert.c: a * b / 255 rounded. */
static int muldiv255(int a, int b) {
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

static void jpeg_row_rgb(const uint8_t *src, int w, int comps, uint8_t *dst) {
    if (comps == 1) {
        for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = src[x];
    } else if (comps == 3) {
        memcpy(dst, src, (size_t)w * 3);
    } else {
        for (int x = 0; x < w; x++) {
            const uint8_t *p = src + 4 * x; /* stored (Adobe-inverted) CMYK: PIL's CMYK = 255 - stored */
            int nk = p[3];                  /* 255 - (255 - stored K) */
            for (int k = 0; k < 3; k++) {
                int v = nk - muldiv255(255 - p[k], nk);
                dst[3 * x + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

static int jpeg_run(jpeg_ctx *c, struct jpeg_decompress_struct *ci, jpeg_errctx *e) {
    if (setjmp(e->jb)) return -1;
    jpeg_read_header(ci, TRUE);
    if (check_size("JPEG", (long)ci->image_width, (long)ci->image_height, c->max_pixels, c->err)) return -1;
    switch (ci->num_components) {
    case 1: ci->out_color_space = JCS_GRAYSCALE; break;
    case 3: ci->out_color_space = JCS_RGB; break;
    case 4: ci->out_color_space = JCS_CMYK; break;
    default:
        return dsf_seterr(c->err, "image: JPEG with %d colour components is not supported", ci->num_components);
    }
    jpeg_start_decompress(ci);
    int w = (int)ci->output_width, h = (int)ci->output_height, comps = ci->output_components;
    if (w != (int)ci->image_width || h != (int)ci->image_height || comps != ci->num_components)
        return dsf_seterr(c->err, "image: JPEG decoder output %dx%dx%d does not match the header", w, h, comps);
    c->out->rgb = alloc_rgb(w, h, c->err);
    c->row = malloc((size_t)w * 4);
    if (!c->out->rgb || !c->row) return dsf_seterr(c->err, "image: out of memory for %dx%d pixels", w, h);
    c->out->w = w;
    c->out->h = h;
    while (ci->output_scanline < ci->output_height) {
        JSAMPROW r = c->row;
        int y = (int)ci->output_scanline;
        if (jpeg_read_scanlines(ci, &r, 1) != 1) return dsf_seterr(c->err, "image: truncated JPEG data");
        jpeg_row_rgb(c->row, w, comps, c->out->rgb + (size_t)y * w * 3);
    }
    /* The pixels are complete; what follows the last scan is not needed. */
    return 0;
}

static int jpeg_decode(const uint8_t *data, size_t len, long max_pixels, img_rgb8 *out, char *err) {
    struct jpeg_decompress_struct ci;
    jpeg_errctx e;
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_exit_fn;
    e.pub.emit_message = jpeg_msg_fn;
    e.err = err;
    jpeg_ctx c = {.max_pixels = max_pixels, .err = err, .out = out};
    int rc = -1;
    if (setjmp(e.jb) == 0) {
        jpeg_create_decompress(&ci);
        struct jpeg_source_mgr *src =
            (*ci.mem->alloc_small)((j_common_ptr)&ci, JPOOL_PERMANENT, sizeof(struct jpeg_source_mgr));
        src->init_source = src_init;
        src->fill_input_buffer = src_fill;
        src->skip_input_data = src_skip;
        src->resync_to_restart = jpeg_resync_to_restart;
        src->term_source = src_term;
        src->next_input_byte = data;
        src->bytes_in_buffer = len;
        ci.src = src;
        rc = jpeg_run(&c, &ci, &e);
    }
    jpeg_destroy_decompress(&ci);
    free(c.row);
    return rc;
}

/* ==== the entry point ====================================================================== */

int img_decode(const uint8_t *data, size_t len, long max_pixels, img_rgb8 *out, char *err) {
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    out->w = out->h = 0;
    out->rgb = NULL;
    if (err) err[0] = 0;
    if (max_pixels <= 0) max_pixels = IMG_DEFAULT_MAX_PIXELS;
    int rc;
    if (data && len >= 8 && memcmp(data, png_magic, 8) == 0)
        rc = png_decode(data, len, max_pixels, out, err);
    else if (data && len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        rc = jpeg_decode(data, len, max_pixels, out, err);
    else
        return dsf_seterr(err, "image: unsupported format (not PNG or JPEG)");
    if (rc) {
        if (err && !err[0]) dsf_seterr(err, "image: the image could not be decoded");
        img_free(out);
    }
    return rc;
}

void img_free(img_rgb8 *im) {
    if (!im) return;
    free(im->rgb);
    im->rgb = NULL;
    im->w = im->h = 0;
}
