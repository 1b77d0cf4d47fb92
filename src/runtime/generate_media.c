/* runtime/generate_media: PLACEHOLDER for the image-span prefill of the generation loop. */
#include "dsflash.h"
#include "base/util.h"

int dsf_gen_prefill_begin_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                                char *err) {
    (void)g, (void)prompt, (void)m, (void)n, (void)chunk;
    return dsf_seterr(err, "images: not supported by this build");
}
int dsf_gen_prefill_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                          dsf_gen_progress_cb progress, void *ud, char *err) {
    (void)g, (void)prompt, (void)m, (void)n, (void)chunk, (void)progress, (void)ud;
    return dsf_seterr(err, "images: not supported by this build");
}
