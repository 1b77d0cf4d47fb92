/* dspark_drafter.h: the DSpark draft (model/dspark.h) as a speculative-decoding drafter
 * (runtime/spec.h's dsf_drafter): one per sequence, bound to that sequence's main session.
 * Must not: verify or accept (the speculative loop's), or own the draft model or the session. */
#ifndef DSF_DSPARK_DRAFTER_H
#define DSF_DSPARK_DRAFTER_H

#include "model/dspark.h"

typedef struct dsf_drafter dsf_drafter;

#ifndef DSF_SPEC_H
/* The interface's declaration (TASK35_IFACE.md), until runtime/spec.h (branch h-spec) provides
 * it: at the merge, replace this block with #include "runtime/spec.h". */
typedef struct {
    int (*propose)(dsf_drafter *d, dsf_session *s, int32_t anchor, int n, float tau, uint64_t *rng, int32_t *ids,
                   float *q, float *conf, char *err);
    int (*commit)(dsf_drafter *d, dsf_session *s, int p0, int p1, char *err);
    void (*reset)(dsf_drafter *d, int n_past);
    void (*free)(dsf_drafter *d);
    int block;
} dsf_drafter_ops;
struct dsf_drafter {
    const dsf_drafter_ops *ops;
};
#endif

/* A drafter over the loaded draft d for the sequence of session s (whose engine is d's main
 * model): turns on s's target features for d's target layers. The caller then commits the
 * positions it consumes (ops->commit after each prefill and verification). d and s must
 * outlive it; ops->free releases it. NULL with err. */
dsf_drafter *dspark_drafter_new(dsf_dspark *d, dsf_session *s, char *err);

#endif
