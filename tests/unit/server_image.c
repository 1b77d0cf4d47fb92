/* server_image.c: a serve request's images without a model (src/server/server_image.c): the
 * strict base64 decoder, the PNG / JPEG header probe, data: URLs and the limits.
 * Expected values: RFC 4648 §10's test vectors; the image sizes of
 * ../shared/testdata/tinyvl/README.md; JPEG headers laid out by hand per ITU T.81 B.2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_image.h"
#include "base/util.h"
#include "helpers.h"
#include "test.h"

static bool b64_ok(const char *in, const char *want) {
    uint8_t *out = NULL;
    size_t n = 0;
    char err[DSF_ERR_LEN] = "";
    bool ok = srv_b64_decode(in, strlen(in), &out, &n, err) == 0 && n == strlen(want) && !memcmp(out, want, n) &&
              srv_b64_decoded_len(in, strlen(in)) == n;
    free(out);
    return ok;
}

static bool b64_refused(const char *in, size_t n, const char *needle) {
    uint8_t *out = (uint8_t *)"x";
    size_t len = 7;
    char err[DSF_ERR_LEN] = "";
    bool ok = srv_b64_decode(in, n, &out, &len, err) == -1 && !out && len == 0 && strstr(err, needle);
    return ok;
}

/* Guards against a lenient decoder (two texts for one byte string: the prefix cache keys on
 * the decoded bytes, the limits on their length) and a wrong one (an image that differs from
 * what the client sent). */
TEST(server_image_base64_is_strict) {
    static const char *const vec[][2] = {{"", ""},         {"Zg==", "f"},         {"Zm8=", "fo"},
                                         {"Zm9v", "foo"},  {"Zm9vYg==", "foob"},  {"Zm9vYmE=", "fooba"},
                                         {"Zm9vYmFy", "foobar"}, {"Zg", "f"},     {"Zm8", "fo"}};
    for (size_t i = 0; i < sizeof vec / sizeof *vec; i++) CHECKF(b64_ok(vec[i][0], vec[i][1]), "'%s'", vec[i][0]);
    uint8_t *out = NULL;
    size_t n = 0;
    char err[DSF_ERR_LEN] = "";
    CHECK(srv_b64_decode("/+8=", 4, &out, &n, err) == 0 && n == 2 && out[0] == 0xFF && out[1] == 0xEF);
    free(out);
    CHECK(b64_refused("Zm9v\nYmFy", 9, "offset 4"));
    CHECK(b64_refused("Zm9v YmFy", 9, "' '"));
    CHECK(b64_refused("_-8=", 4, "'_'"));
    CHECK(b64_refused("Zm9vY", 5, "lone"));
    CHECK(b64_refused("Zg=", 3, "padding"));
    CHECK(b64_refused("Zm9v=", 5, "padding"));
    CHECK(b64_refused("Zg=a", 4, "'='"));
    CHECK(b64_refused("Zh==", 4, "non-zero"));
    CHECK(b64_refused("Zm9=", 4, "non-zero"));
    CHECK(b64_refused("Zg\0=", 4, "0x00"));
}

/* A JPEG of SOI, an APP0 of 16 bytes, fill bytes, an RST marker and a frame header SOFn. */
static size_t mk_jpeg(uint8_t *p, unsigned sof, unsigned w, unsigned h) {
    size_t n = 0;
    p[n++] = 0xFF, p[n++] = 0xD8;
    p[n++] = 0xFF, p[n++] = 0xE0, p[n++] = 0, p[n++] = 16;
    memcpy(p + n, "JFIF\0\1\1\0\0\1\0\1\0\0", 14), n += 14;
    p[n++] = 0xFF, p[n++] = 0xFF, p[n++] = 0xD3;   /* fill byte, then RST3 (no length) */
    p[n++] = 0xFF, p[n++] = 0xC4, p[n++] = 0, p[n++] = 3, p[n++] = 0; /* a DHT before the frame */
    p[n++] = 0xFF, p[n++] = (uint8_t)sof, p[n++] = 0, p[n++] = 11, p[n++] = 8;
    p[n++] = (uint8_t)(h >> 8), p[n++] = (uint8_t)h, p[n++] = (uint8_t)(w >> 8), p[n++] = (uint8_t)w;
    p[n++] = 1, p[n++] = 1, p[n++] = 0x11, p[n++] = 0;
    return n;
}

/* Guards against a pixel limit that reads the wrong header fields (a huge image slipping
 * through, or a small one refused), and against overreads on truncated headers. */
TEST(server_image_probe_reads_the_header) {
    static const struct { const char *file; int w, h; } png[] = {
        {"grad.png", 154, 98}, {"wide.png", 160, 90}, {"tall.png", 61, 130}, {"tiny.png", 7, 5}, {"cap.png", 200, 150}};
    char err[DSF_ERR_LEN];
    int w, h;
    for (size_t i = 0; i < sizeof png / sizeof *png; i++) {
        char rel[96];
        snprintf(rel, sizeof rel, "testdata/tinyvl/images/%s", png[i].file);
        NEED_SHARED(path, rel);
        long size = 0;
        unsigned char *b = test_slurp(path, &size);
        CHECK(b);
        int fmt = srv_image_probe(b, (size_t)size, &w, &h, err);
        CHECKF(fmt == SRV_IMG_PNG && w == png[i].w && h == png[i].h, "%s: %d %dx%d", png[i].file, fmt, w, h);
        for (size_t cut = 8; cut < 33; cut++) {
            uint8_t *c = dsf_xmalloc(cut);
            memcpy(c, b, cut);
            int r = srv_image_probe(c, cut, &w, &h, err);
            free(c);
            CHECKF(r == -1 && strstr(err, "PNG"), "%s cut at %zu: %d", png[i].file, cut, r);
        }
        free(b);
    }
    uint8_t j[64];
    size_t n = mk_jpeg(j, 0xC0, 640, 480);
    CHECK(srv_image_probe(j, n, &w, &h, err) == SRV_IMG_JPEG && w == 640 && h == 480);
    n = mk_jpeg(j, 0xC2, 3, 65535); /* progressive */
    CHECK(srv_image_probe(j, n, &w, &h, err) == SRV_IMG_JPEG && w == 3 && h == 65535);
    for (size_t cut = 2; cut < n - 3; cut++)
        CHECKF(srv_image_probe(j, cut, &w, &h, err) == -1 && strstr(err, "JPEG"), "JPEG cut at %zu", cut);
    n = mk_jpeg(j, 0xC0, 640, 0); /* height in a DNL marker: refused */
    CHECK(srv_image_probe(j, n, &w, &h, err) == -1 && strstr(err, "640 x 0"));
    n = mk_jpeg(j, 0xC0, 8, 8);
    j[5] = 200; /* APP0 length past the end */
    CHECK(srv_image_probe(j, n, &w, &h, err) == -1 && strstr(err, "past the end"));
    CHECK(srv_image_probe((const uint8_t *)"GIF89a", 6, &w, &h, err) == SRV_IMG_UNKNOWN);
    CHECK(srv_image_probe((const uint8_t *)"", 0, &w, &h, err) == SRV_IMG_UNKNOWN);
}

/* The records of one image as the chat encoder lists them: {"type": "image", "url": URL}. */
static char *records(const char *url, int copies) {
    dsf_buf b = {0};
    dsf_buf_append(&b, "[", 1);
    for (int i = 0; i < copies; i++) dsf_buf_appendf(&b, "%s{\"type\": \"image\", \"url\": \"%s\"}", i ? ", " : "", url);
    dsf_buf_append(&b, "]", 2);
    return (char *)b.data;
}

static int parse_one(const char *url, int copies, const srv_image_limits *lim, srv_image **im, int *n, srv_error *e) {
    char *r = records(url, copies);
    memset(e, 0, sizeof *e);
    int rc = srv_images_parse(r, lim, im, n, e);
    free(r);
    return rc;
}

/* Guards against remote URLs being fetched or passed on, bad data reaching the decoder, limits
 * that are not enforced or that do not say which limit (and option) was hit. */
TEST(server_image_records_and_limits) {
    NEED_SHARED(path, "testdata/tinyvl/images/grad.png");
    long size = 0;
    unsigned char *png = test_slurp(path, &size);
    CHECK(png);
    char *b64 = test_base64(png, (size_t)size); /* tests/lib: apart from the decoder under test */
    dsf_buf url = {0};
    dsf_buf_appendf(&url, "data:image/png;base64,%s", b64);
    dsf_buf_append(&url, "", 1);
    free(b64);
    const char *u = (const char *)url.data;
    srv_image_limits lim = {.max_images = 2, .max_bytes = (size_t)size, .max_pixels = 154 * 98};
    srv_image *im = NULL;
    int n = 0;
    srv_error e;
    CHECKF(parse_one(u, 2, &lim, &im, &n, &e) == 0, "%s", e.message);
    CHECK(n == 2 && im[1].len == (size_t)size && !memcmp(im[1].data, png, (size_t)size) && im[1].w == 154 && im[1].h == 98);
    srv_images_free(im, n);

    static const struct { const char *url; int status; const char *says; } bad[] = {
        {"https://example.com/cat.png", 400, "remote image URLs are not fetched; send a data: URL"},
        {"HTTP://example.com/cat.png", 400, "remote image URLs are not fetched"},
        {"ftp://example.com/cat.png", 400, "must be a data: URL"},
        {"data:image/png,abc", 400, "only base64 data: URLs"},
        {"data:image/png;base64", 400, "no ','"},
        {"data:text/plain;base64,Zm9v", 400, "'text/plain' is not an image type"},
        {"data:image/png;base64,Zm9v!", 400, "invalid base64 data: base64: invalid character '!' at offset 4"},
        {"data:image/png;base64,", 400, "empty"},
        {"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", 400, "image 1: PNG: truncated"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        im = (srv_image *)&n;
        CHECKF(parse_one(bad[i].url, 1, &lim, &im, &n, &e) == -1 && !im && n == 0, "%s accepted", bad[i].url);
        CHECKF(e.status == bad[i].status && strstr(e.message, bad[i].says), "%s: %d %s", bad[i].url, e.status, e.message);
    }
    CHECK(parse_one(u, 3, &lim, &im, &n, &e) == -1 && e.status == 400 &&
          strstr(e.message, "3 images; the limit is 2 per request (--max-images)"));
    lim.max_bytes = (size_t)size - 1;
    CHECK(parse_one(u, 1, &lim, &im, &n, &e) == -1 && e.status == 413 && strstr(e.message, "--max-image-bytes") &&
          strstr(e.message, "image 1 is"));
    lim.max_bytes = (size_t)size;
    lim.max_pixels = 154 * 98 - 1;
    CHECK(parse_one(u, 1, &lim, &im, &n, &e) == -1 && e.status == 413 &&
          strstr(e.message, "154 x 98 = 15092 pixels") && strstr(e.message, "--max-image-pixels"));
    /* the Anthropic-style source record, and no limits at all */
    char *rec = dsf_xmalloc(url.len + 128);
    snprintf(rec, url.len + 128, "[{\"type\": \"image\", \"source\": {\"type\": \"base64\", \"media_type\": \"image/png\", "
             "\"data\": \"%s\"}}]", u + strlen("data:image/png;base64,"));
    CHECKF(srv_images_parse(rec, NULL, &im, &n, &e) == 0 && n == 1 && im[0].len == (size_t)size, "%s", e.message);
    srv_images_free(im, n);
    free(rec);
    CHECK(srv_images_parse("[]", NULL, &im, &n, &e) == 0 && !im && n == 0);
    free(png);
    dsf_buf_free(&url);
}
