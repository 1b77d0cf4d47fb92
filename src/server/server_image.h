/* server_image.h: the images of a serve request (server layer), pure: the image records the
 * chat encoder lists (dsf_chat_prompt.images_json) -> image bytes, with the request limits.
 *
 * Owns: the strict base64 decoder, `data:` URLs (remote http(s) URLs are refused, never
 * fetched), the size probe of PNG and JPEG headers (the pixel limit is answered on the
 * connection thread, before anything is decoded) and the limits' 400 / 413 errors.
 * Must not: decode pixels or run the tower (the scheduler calls dsf_vision_encode); touch
 * sockets, threads or the engine. Every record is hostile input.
 * Invariant: an accepted srv_image holds the exact bytes its data: URL encodes. */
#ifndef DSF_SERVER_IMAGE_H
#define DSF_SERVER_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "server/server.h"

/* ---- base64 (RFC 4648 §4, strict) ---- */

/* Decodes s[0..n): the standard alphabet only (no whitespace, no URL-safe letters), padding
 * '=' only at the end and only to complete the last group (an unpadded tail of 2 or 3
 * characters is accepted), unused bits of the last group zero (one text per byte string).
 * *out (malloc'ed, *out_len bytes; at least 1 byte allocated). -1 with err naming the offset. */
int srv_b64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len, char *err);
/* The decoded length of a valid n-character text (an upper bound for any text). */
size_t srv_b64_decoded_len(const char *s, size_t n);

/* ---- image headers ---- */

#define SRV_IMG_UNKNOWN 0
#define SRV_IMG_PNG 1
#define SRV_IMG_JPEG 2

/* The format and size from the header alone: SRV_IMG_PNG (IHDR) or SRV_IMG_JPEG (the first
 * SOFn frame header) with *w, *h > 0; SRV_IMG_UNKNOWN for other formats (left to the decoder);
 * -1 with err for a PNG or JPEG whose header is truncated or malformed. */
int srv_image_probe(const uint8_t *p, size_t n, int *w, int *h, char *err);

/* ---- a request's images ---- */

typedef struct {
    int max_images;   /* per request; <= 0: no image accepted */
    size_t max_bytes; /* per image, decoded */
    long max_pixels;  /* per image, width x height from its header */
} srv_image_limits;

/* Images of a request beyond which `serve` refuses it, and the per-image limits, unless the
 * command line says otherwise (cmd_serve.c). */
#define SRV_DEFAULT_MAX_IMAGES 8
#define SRV_DEFAULT_MAX_IMAGE_BYTES (16u << 20)
#define SRV_DEFAULT_MAX_IMAGE_PIXELS 50000000L

/* Parses the encoder's image records (a JSON array of {"type": "image", "url"} or
 * {"type": "image", "source": {"type": "base64", "media_type", "data"}}) into images in
 * prompt order (*out malloc'ed, NULL when there is none). Limits: lim (NULL: none). Errors:
 * 400 for a remote URL, another URL scheme, a non-base64 data: URL or a media type not under
 * "image/", bad base64, a malformed PNG/JPEG header, more than lim->max_images images; 413 for
 * an image over lim->max_bytes or lim->max_pixels. Each message names the image ("image 2:
 * ...") and the limit's option. */
int srv_images_parse(const char *images_json, const srv_image_limits *lim, srv_image **out, int *n, srv_error *e);
void srv_images_free(srv_image *im, int n);

#endif
