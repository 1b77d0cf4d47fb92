/* io/image: compressed image bytes (PNG through libpng, JPEG through libjpeg-turbo) to 8-bit
 * RGB with the semantics of PIL's Image.open(...).convert("RGB") (vision.md §2.1): grey is
 * replicated, a palette is looked up, alpha (and a palette's transparency) is dropped, never
 * composited; EXIF orientation is not applied; an animated image gives its first frame.
 * Must not: resize, normalise or know the vision model (src/vision/ does).
 * Invariants: the pixel cap is checked on the header's size before any pixel is decoded; a
 * corrupt, truncated or unsupported image gets -1 and one line naming the problem. */
#ifndef DSF_IO_IMAGE_H
#define DSF_IO_IMAGE_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int w, h;
    uint8_t *rgb; /* [h][w][3], top row first; malloc'ed */
} img_rgb8;

/* The default pixel cap (dsf_vision_params.max_pixels = 0). */
#define IMG_DEFAULT_MAX_PIXELS 50000000L

/* Sniffs the format from the bytes (PNG, JPEG) and decodes. max_pixels <= 0: the default. */
int img_decode(const uint8_t *data, size_t len, long max_pixels, img_rgb8 *out, char *err);
void img_free(img_rgb8 *im);

#endif
