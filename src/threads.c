/* threads.c: see threads.h. (Serial placeholder until the worker pool lands: every range
 * runs on the calling thread. Same results by construction.) */
#include "threads.h"
#include "util.h"

#include <stdlib.h>

struct dsf_pool { int n; };

dsf_pool *dsf_pool_new(int n_threads) {
    dsf_pool *p = dsf_xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    return p;
}

void dsf_pool_free(dsf_pool *p) { free(p); }

int dsf_pool_size(const dsf_pool *p) { return p ? p->n : 1; }

void dsf_parallel_for(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx) {
    (void)p;
    (void)grain;
    if (n > 0) fn(ctx, 0, n, 0);
}
