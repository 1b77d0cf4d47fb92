/* spec_load.c: what `--draft` opens: the oracle test hook ("oracle", "oracle:K") or a DSpark
 * draft GGUF (runtime/dspark_drafter.c over model/dspark.c).
 * Must not: know the draft's tensors (the draft model's own files do). */
#include "runtime/spec.h"
#include "runtime/dspark_drafter.h"
#include "base/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Drafts per oracle call: the DSpark block (B = 5 drafted tokens, dspark.md §4). */
#define SPEC_ORACLE_BLOCK 5

dsf_drafter *spec_load_drafter(dsf_engine *e, const char *path, char *err) {
    dsf_drafter *d = dspark_drafter_open(e, path, err);
    if (!d) dsf_prefixerr(err, "--draft %s", path);
    return d;
}

dsf_drafter *spec_open_drafter(dsf_engine *e, const char *what, int max_ctx, char *err) {
    if (!what || !*what) {
        dsf_seterr(err, "--draft: no draft named");
        return NULL;
    }
    if (!strcmp(what, "oracle")) return spec_oracle_new(e, max_ctx, SPEC_ORACLE_BLOCK, -1, err);
    if (!strncmp(what, "oracle:", 7)) {
        char *end;
        errno = 0;
        long k = strtol(what + 7, &end, 10);
        if (errno || end == what + 7 || *end || k < 0 || k >= SPEC_ORACLE_BLOCK) {
            dsf_seterr(err, "--draft %s: expected oracle:K with K the corrupted draft index 0..%d", what,
                       SPEC_ORACLE_BLOCK - 1);
            return NULL;
        }
        return spec_oracle_new(e, max_ctx, SPEC_ORACLE_BLOCK, (int)k, err);
    }
    return spec_load_drafter(e, what, err);
}

spec_seq *spec_open(dsf_engine *e, const spec_opts *o, int max_ctx, const spec_policy *base, char *err) {
    if (o->max_draft < 0) {
        dsf_seterr(err, "--draft-max must be >= 0, got %d", o->max_draft);
        return NULL;
    }
    if (!(o->min_p >= 0 && o->min_p <= 1)) {
        dsf_seterr(err, "--draft-min-p must be within 0..1, got %g", (double)o->min_p);
        return NULL;
    }
    dsf_drafter *d = spec_open_drafter(e, o->draft, max_ctx, err);
    if (!d) return NULL;
    spec_policy pol;
    spec_policy_init(&pol);
    bool oracle = !strncmp(o->draft, "oracle", 6);
    if (base) pol = *base;
    else if (!oracle && !o->always && spec_cost_measure(e, d->ops->block, &pol, err) < 0) {
        dsf_drafter_free(d);
        return NULL;
    }
    if (oracle || o->always) pol.mode = SPEC_POLICY_ALWAYS;
    pol.max_draft = o->max_draft;
    pol.min_p = o->min_p;
    return spec_seq_new(e, d, &pol, err);
}
