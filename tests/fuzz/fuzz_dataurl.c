/* fuzz_dataurl.c: libFuzzer harness for a serve request's images (src/server/server_image.c):
 * the strict base64 decoder, the PNG / JPEG header probe, and the encoder's image records with
 * their data: URLs and limits -- all of them bytes from the client.
 *
 * Byte 0 picks the parser (mod 3): 0 srv_b64_decode, 1 srv_image_probe, 2 srv_images_parse
 * (limits: 2 images, 64 bytes, 4096 pixels). The rest is its input.
 * Checks: base64: an accepted text decodes to srv_b64_decoded_len bytes and is the canonical
 * encoding of them (re-encoding gives the text back, padding aside: one text per byte
 * string); a refusal is one line and leaves nothing allocated. Probe: an accepted header has
 * a size >= 1 x 1; a refusal is one line. Records: accepted images are within the limits and
 * their bytes non-empty; a refusal has status 400, 413 or 500 and a message. */
#include "fuzz_common.h"
#include "server/server_image.h"

static int fz_dataurl_b64(const uint8_t *p, size_t n) {
    uint8_t *out = NULL;
    size_t len = 0;
    char err[DSF_ERR_LEN] = "";
    if (srv_b64_decode((const char *)p, n, &out, &len, err)) {
        fz_check_err(err, "srv_b64_decode");
        FZ_REQUIRE(!out && len == 0, "a refusal left %zu bytes", len);
        return 0;
    }
    FZ_REQUIRE(len == srv_b64_decoded_len((const char *)p, n), "decoded %zu bytes, decoded_len says %zu", len,
               srv_b64_decoded_len((const char *)p, n));
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)out[i] << 16 | (i + 1 < len ? (uint32_t)out[i + 1] << 8 : 0) | (i + 2 < len ? out[i + 2] : 0);
        size_t m = len - i >= 3 ? 4 : len - i + 1;
        for (size_t c = 0; c < m; c++, k++)
            FZ_REQUIRE(k < n && p[k] == (uint8_t)al[(v >> (18 - 6 * c)) & 63], "not the canonical encoding at %zu", k);
    }
    for (; k < n; k++) FZ_REQUIRE(p[k] == '=', "byte %zu after the data is not padding", k);
    free(out);
    return 1;
}

static int fz_dataurl_probe(const uint8_t *p, size_t n) {
    int w = -1, h = -1;
    char err[DSF_ERR_LEN] = "";
    int fmt = srv_image_probe(p, n, &w, &h, err);
    if (fmt < 0) {
        fz_check_err(err, "srv_image_probe");
        return 0;
    }
    if (fmt == SRV_IMG_UNKNOWN) {
        FZ_REQUIRE(w == 0 && h == 0, "unknown format with a size");
        return 0;
    }
    FZ_REQUIRE(fmt == SRV_IMG_PNG || fmt == SRV_IMG_JPEG, "format %d", fmt);
    FZ_REQUIRE(w >= 1 && h >= 1, "accepted size %d x %d", w, h);
    return 1;
}

static int fz_dataurl_records(const uint8_t *p, size_t n) {
    char *js = dsf_xmalloc(n + 1);
    memcpy(js, p, n);
    js[n] = 0;
    srv_image_limits lim = {.max_images = 2, .max_bytes = 64, .max_pixels = 4096};
    srv_image *im = NULL;
    int k = -1;
    srv_error e;
    memset(&e, 0, sizeof e);
    int rc = srv_images_parse(js, &lim, &im, &k, &e);
    free(js);
    if (rc) {
        FZ_REQUIRE(e.status == 400 || e.status == 413 || e.status == 500, "refused with status %d", e.status);
        FZ_REQUIRE(e.message[0], "refused without a message");
        FZ_REQUIRE(!im && k == 0, "a refusal kept %d images", k);
        return 0;
    }
    FZ_REQUIRE(k >= 0 && k <= 2 && (k == 0) == (im == NULL), "accepted %d images", k);
    for (int i = 0; i < k; i++) {
        FZ_REQUIRE(im[i].len >= 1 && im[i].len <= 64 && im[i].data, "image %d: %zu bytes", i, im[i].len);
        FZ_REQUIRE((long long)im[i].w * im[i].h <= 4096, "image %d: %d x %d", i, im[i].w, im[i].h);
    }
    srv_images_free(im, k);
    return k > 0;
}

static int fz_dataurl_one(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: return fz_dataurl_b64(data + 1, size - 1);
    case 1: return fz_dataurl_probe(data + 1, size - 1);
    default: return fz_dataurl_records(data + 1, size - 1);
    }
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_dataurl_one(data, size);
    return 0;
}
#endif
