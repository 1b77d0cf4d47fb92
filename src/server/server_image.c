/* server_image.c: a serve request's images, from the encoder's image records to checked bytes
 * (server_image.h: what it owns, must not do, its invariant).
 *
 * Chapters: the strict base64 decoder; the PNG / JPEG header probe; data: URLs and the
 * records; the limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server_image.h"

/* ==== base64 ============================================================================== */

static int b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* The characters before the padding. */
static size_t b64_body(const char *s, size_t n) {
    size_t k = n;
    while (k > 0 && n - k < 2 && s[k - 1] == '=') k--;
    return k;
}

size_t srv_b64_decoded_len(const char *s, size_t n) {
    size_t k = b64_body(s, n);
    return k / 4 * 3 + (k % 4 ? k % 4 - 1 : 0);
}

int srv_b64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len, char *err) {
    *out = NULL;
    *out_len = 0;
    size_t k = b64_body(s, n), pad = n - k;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        if (b64_val(c) >= 0) continue;
        if (c >= 0x20 && c < 0x7F) return dsf_seterr(err, "base64: invalid character '%c' at offset %zu", c, i);
        return dsf_seterr(err, "base64: invalid byte 0x%02X at offset %zu", c, i);
    }
    if (k % 4 == 1) return dsf_seterr(err, "base64: %zu characters leave a lone one at the end", k);
    if (pad && (k + pad) % 4) return dsf_seterr(err, "base64: '=' padding at offset %zu does not end a group of 4", k);
    size_t cap = srv_b64_decoded_len(s, n);
    uint8_t *o = dsf_xmalloc(cap ? cap : 1);
    size_t w = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < k; i++) {
        acc = (acc << 6) | (uint32_t)b64_val((unsigned char)s[i]);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[w++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc) { /* a canonical encoder leaves the unused low bits zero */
        free(o);
        return dsf_seterr(err, "base64: the last group has non-zero unused bits (offset %zu)", k - 1);
    }
    DSF_ASSERT(w == cap);
    *out = o;
    *out_len = w;
    return 0;
}

/* ==== image headers ======================================================================= */

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* PNG: the signature, then IHDR first (PNG spec §5.6), 13 bytes of data and its CRC. */
static int probe_png(const uint8_t *p, size_t n, int *w, int *h, char *err) {
    if (n < 8 + 8 + 13 + 4) return dsf_seterr(err, "PNG: truncated before the end of its IHDR chunk (%zu bytes)", n);
    if (be32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4)) return dsf_seterr(err, "PNG: the first chunk is not a 13-byte IHDR");
    uint32_t W = be32(p + 16), H = be32(p + 20);
    if (W == 0 || H == 0 || W > 0x7FFFFFFFu || H > 0x7FFFFFFFu)
        return dsf_seterr(err, "PNG: invalid size %u x %u in IHDR", W, H);
    *w = (int)W, *h = (int)H;
    return SRV_IMG_PNG;
}

/* JPEG: markers from SOI to the first SOFn (ITU T.81 B.1.1.2-B.2.2): fill bytes 0xFF, standalone
 * markers (TEM, RSTn) without a length, every other segment skipped by its 16-bit length. */
static int probe_jpeg(const uint8_t *p, size_t n, int *w, int *h, char *err) {
    size_t i = 2;
    for (;;) {
        if (i >= n) return dsf_seterr(err, "JPEG: truncated before its frame header (SOF)");
        if (p[i] != 0xFF) return dsf_seterr(err, "JPEG: expected a marker at offset %zu, got 0x%02X", i, p[i]);
        while (i < n && p[i] == 0xFF) i++;
        if (i >= n) return dsf_seterr(err, "JPEG: truncated before its frame header (SOF)");
        unsigned m = p[i++];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;
        if (m == 0xD8 || m == 0xD9 || m == 0xDA || m == 0x00)
            return dsf_seterr(err, "JPEG: marker 0x%02X at offset %zu before the frame header", m, i - 1);
        if (n - i < 2) return dsf_seterr(err, "JPEG: truncated segment length at offset %zu", i);
        unsigned len = be16(p + i);
        if (len < 2 || len > n - i) return dsf_seterr(err, "JPEG: segment 0x%02X at offset %zu has length %u past the end", m, i - 2, len);
        bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
            if (len < 8) return dsf_seterr(err, "JPEG: frame header of %u bytes (at least 8)", len);
            unsigned H = be16(p + i + 3), W = be16(p + i + 5);
            /* H = 0 defers the height to a DNL marker (T.81 B.2.2): not supported */
            if (W == 0 || H == 0) return dsf_seterr(err, "JPEG: invalid size %u x %u in its frame header", W, H);
            *w = (int)W, *h = (int)H;
            return SRV_IMG_JPEG;
        }
        i += len;
    }
}

int srv_image_probe(const uint8_t *p, size_t n, int *w, int *h, char *err) {
    *w = *h = 0;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n >= 8 && !memcmp(p, png_sig, 8)) return probe_png(p, n, w, h, err);
    if (n >= 2 && p[0] == 0xFF && p[1] == 0xD8) return probe_jpeg(p, n, w, h, err);
    return SRV_IMG_UNKNOWN;
}

/* ==== data: URLs and records =============================================================== */

static bool has_prefix_ci(const char *s, size_t n, const char *pre) {
    size_t k = strlen(pre);
    if (n < k) return false;
    for (size_t i = 0; i < k; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != pre[i]) return false;
    }
    return true;
}

/* The bytes of a base64 image: media type (NULL: not given) checked, then decoded within
 * max_bytes (0: no limit). */
static int image_bytes(int idx, const char *mtype, size_t mlen, const char *b64, size_t blen, size_t max_bytes,
                       srv_image *im, srv_error *e) {
    if (mtype && !has_prefix_ci(mtype, mlen, "image/"))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: media type '%.*s' is not an image type", idx,
                        (int)(mlen > 64 ? 64 : mlen), mtype);
    size_t want = srv_b64_decoded_len(b64, blen);
    if (max_bytes && want > max_bytes)
        return srv_fail(e, 413, "messages", "image_too_large",
                        "image %d is %zu bytes, over the limit of %zu bytes per image (--max-image-bytes)", idx, want,
                        max_bytes);
    char err[DSF_ERR_LEN] = "";
    if (srv_b64_decode(b64, blen, &im->data, &im->len, err))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: invalid base64 data: %s", idx, err);
    if (im->len == 0) return srv_fail(e, 400, "messages", "invalid_image", "image %d: the image data is empty", idx);
    return 0;
}

/* A data: URL (RFC 2397): data:[<media type>][;params];base64,<data>. */
static int from_url(int idx, const char *u, size_t n, size_t max_bytes, srv_image *im, srv_error *e) {
    if (has_prefix_ci(u, n, "http://") || has_prefix_ci(u, n, "https://"))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: remote image URLs are not fetched; send a data: URL "
                        "(data:image/png;base64,...)", idx);
    if (!has_prefix_ci(u, n, "data:"))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: the image URL must be a data: URL "
                        "(data:image/png;base64,...)", idx);
    const char *comma = memchr(u, ',', n);
    if (!comma) return srv_fail(e, 400, "messages", "invalid_image", "image %d: the data: URL has no ',' before its data", idx);
    const char *meta = u + 5;
    size_t ml = (size_t)(comma - meta);
    if (ml < 7 || !has_prefix_ci(meta + ml - 7, 7, ";base64"))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: only base64 data: URLs are read (data:image/png;base64,...)",
                        idx);
    const char *semi = memchr(meta, ';', ml);
    size_t tl = (size_t)(semi - meta);
    const char *b64 = comma + 1;
    return image_bytes(idx, tl ? meta : NULL, tl, b64, n - (size_t)(b64 - u), max_bytes, im, e);
}

/* An Anthropic-style source {"type": "base64", "media_type", "data"} or {"type": "url", "url"}. */
static int from_source(int idx, const json_t *src, size_t max_bytes, srv_image *im, srv_error *e) {
    const json_t *t = json_object_get(src, "type");
    const char *ty = pyjson_is_str(t) ? json_string_value(t) : "";
    if (!strcmp(ty, "url")) {
        const json_t *u = json_object_get(src, "url");
        if (!pyjson_is_str(u)) return srv_fail(e, 400, "messages", "invalid_image", "image %d: source.url must be a string", idx);
        return from_url(idx, json_string_value(u), json_string_length(u), max_bytes, im, e);
    }
    if (strcmp(ty, "base64"))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: source type '%.64s' is not supported (base64 or url)",
                        idx, ty);
    const json_t *mt = json_object_get(src, "media_type"), *d = json_object_get(src, "data");
    if (!pyjson_is_str(d) || (mt && !pyjson_is_str(mt)))
        return srv_fail(e, 400, "messages", "invalid_image", "image %d: source.data and source.media_type must be strings", idx);
    return image_bytes(idx, mt ? json_string_value(mt) : NULL, mt ? json_string_length(mt) : 0, json_string_value(d),
                       json_string_length(d), max_bytes, im, e);
}

/* One record -> im (bytes, probed size), within the limits. */
static int one_image(int idx, const json_t *rec, const srv_image_limits *lim, srv_image *im, srv_error *e) {
    size_t max_bytes = lim ? lim->max_bytes : 0;
    const json_t *u = json_object_get(rec, "url"), *src = json_object_get(rec, "source");
    int rc;
    if (pyjson_is_str(u) && json_string_length(u)) rc = from_url(idx, json_string_value(u), json_string_length(u), max_bytes, im, e);
    else if (json_is_object(src)) rc = from_source(idx, src, max_bytes, im, e);
    else if (pyjson_is_str(src)) rc = from_url(idx, json_string_value(src), json_string_length(src), max_bytes, im, e);
    else rc = srv_fail(e, 400, "messages", "invalid_image", "image %d: expected image_url.url with a data: URL", idx);
    if (rc) return -1;
    char err[DSF_ERR_LEN] = "";
    int fmt = srv_image_probe(im->data, im->len, &im->w, &im->h, err);
    if (fmt < 0) return srv_fail(e, 400, "messages", "invalid_image", "image %d: %s", idx, err);
    long long px = (long long)im->w * im->h;
    if (lim && lim->max_pixels > 0 && px > lim->max_pixels)
        return srv_fail(e, 413, "messages", "image_too_large",
                        "image %d is %d x %d = %lld pixels, over the limit of %ld pixels per image (--max-image-pixels)",
                        idx, im->w, im->h, px, lim->max_pixels);
    return 0;
}

int srv_images_parse(const char *images_json, const srv_image_limits *lim, srv_image **out, int *n, srv_error *e) {
    *out = NULL;
    *n = 0;
    if (!images_json || !*images_json) return 0;
    char err[DSF_ERR_LEN] = "";
    json_t *arr = pyjson_loads(images_json, strlen(images_json), err);
    if (!json_is_array(arr)) {
        json_decref(arr);
        return srv_fail(e, 500, NULL, "internal_error", "the encoder's image list is not a JSON array");
    }
    size_t m = json_array_size(arr);
    int rc = 0;
    if (m && lim && (lim->max_images <= 0 || m > (size_t)lim->max_images)) {
        rc = srv_fail(e, 400, "messages", "too_many_images", "the request has %zu images; the limit is %d per request (--max-images)",
                      m, lim->max_images > 0 ? lim->max_images : 0);
    } else if (m > 0) {
        srv_image *im = dsf_xcalloc(m, sizeof *im);
        for (size_t i = 0; i < m && !rc; i++) {
            const json_t *rec = json_array_get(arr, i);
            rc = json_is_object(rec) ? one_image((int)i + 1, rec, lim, &im[i], e)
                                     : srv_fail(e, 400, "messages", "invalid_image", "image %zu: not an object", i + 1);
        }
        if (rc) srv_images_free(im, (int)m);
        else *out = im, *n = (int)m;
    }
    json_decref(arr);
    return rc;
}

void srv_images_free(srv_image *im, int n) {
    for (int i = 0; im && i < n; i++) free(im[i].data);
    free(im);
}
