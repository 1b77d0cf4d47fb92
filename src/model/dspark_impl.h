/* dspark_impl.h: the loaded DSpark draft, shared by dspark_load.c (which builds it) and
 * dspark.c (which runs it). Private to those two files.
 * Invariant: after dspark_open the struct is read-only; de borrows main's pool and kernels. */
#ifndef DSF_DSPARK_IMPL_H
#define DSF_DSPARK_IMPL_H

#include "model/dspark.h"
#include "model/model.h"

struct dsf_dspark {
    dsf_engine *main;  /* the main model: token_embd, output, pool, numerics */
    dsf_engine de;     /* the draft as an engine: its file, shape (stages as layers), weights, RoPE */
    int32_t *targets;  /* [n_targets] increasing main layers */
    int n_targets;
    int block;         /* B */
    int32_t noise;
};

#endif
