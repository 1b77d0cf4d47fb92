/* model/session_media: PLACEHOLDER for the image-span entry points of the session. */
#include "dsflash.h"
#include "base/util.h"

int dsf_engine_n_embd(const dsf_engine *e) { (void)e; return 0; }
bool dsf_engine_has_vision(const dsf_engine *e) { (void)e; return false; }
int dsf_session_eval_media(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, float *logits,
                           bool all_rows, char *err) {
    (void)s, (void)tokens, (void)m, (void)n, (void)logits, (void)all_rows;
    return dsf_seterr(err, "images: not supported by this build");
}
const uint64_t *dsf_session_keys(const dsf_session *s) { (void)s; return NULL; }
