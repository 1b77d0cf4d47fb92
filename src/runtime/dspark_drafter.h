/* dspark_drafter.h: the DSpark draft (model/dspark.h) as a speculative-decoding drafter
 * (runtime/spec.h's dsf_drafter): one per sequence, bound to that sequence's main session.
 * Must not: verify or accept (the speculative loop's), or own the draft model or the session. */
#ifndef DSF_DSPARK_DRAFTER_H
#define DSF_DSPARK_DRAFTER_H

#include "model/dspark.h"

#include "runtime/spec.h"

/* A drafter over the loaded draft d for the sequence of session s (whose engine is d's main
 * model): turns on s's target features for d's target layers. The caller then commits the
 * positions it consumes (ops->commit after each prefill and verification). d and s must
 * outlive it; ops->free releases it. NULL with err. */
dsf_drafter *dspark_drafter_new(dsf_dspark *d, dsf_session *s, char *err);

/* What `--draft FILE` opens: the dflash file for the main engine e (dspark_open, refused with
 * a clear error when it does not fit e), owned by the drafter, which serves the session that
 * ops->bind names (spec_attach binds it before any prefill). NULL with err. */
dsf_drafter *dspark_drafter_open(dsf_engine *e, const char *path, char *err);

#endif
