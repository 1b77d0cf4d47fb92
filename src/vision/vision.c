/* vision/vision: the public projector API (dsf_vision_*, dsf_image_free).
 * PLACEHOLDER until the tower lands: every entry point refuses with a clear error. */
#include "dsflash.h"
#include "base/util.h"

void dsf_vision_params_default(dsf_vision_params *p) {
    p->numerics = DSF_NUMERICS_PLAIN;
    p->n_threads = 0;
    p->max_tokens = 0;
    p->max_pixels = 0;
}
dsf_vision *dsf_vision_open(const char *mmproj_path, const dsf_vision_params *p, char *err) {
    (void)mmproj_path, (void)p;
    dsf_seterr(err, "vision: this build has no vision tower");
    return NULL;
}
void dsf_vision_close(dsf_vision *v) { (void)v; }
int dsf_vision_n_embd(const dsf_vision *v) { (void)v; return 0; }
int dsf_vision_encode(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image *out, char *err) {
    (void)v, (void)bytes, (void)len, (void)max_tokens, (void)out;
    return dsf_seterr(err, "vision: this build has no vision tower");
}
void dsf_image_free(dsf_image *im) { (void)im; }
