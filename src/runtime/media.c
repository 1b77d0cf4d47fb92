/* runtime/media: placeholder expansion of image prompts (dsf_mm_*).
 * PLACEHOLDER until the text side lands. */
#include "dsflash.h"
#include "base/util.h"

int dsf_mm_expand(const int32_t *prompt, int n, int32_t image_token_id, const dsf_image *images, int n_images,
                  dsf_mm_prompt *out, char *err) {
    (void)prompt, (void)n, (void)image_token_id, (void)images, (void)n_images, (void)out;
    return dsf_seterr(err, "images: not supported by this build");
}
void dsf_mm_prompt_free(dsf_mm_prompt *p) { (void)p; }
dsf_media dsf_mm_media(const dsf_mm_prompt *p) {
    (void)p;
    dsf_media m = {0};
    return m;
}
