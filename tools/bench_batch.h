/* bench_batch.h: `dsflash bench -m MODEL --batch N` (tools/bench_batch.c): N sequences decoded
 * together, one dsf_batch_eval per step, as the server's scheduler runs its decoding slots. In
 * an MPI job under --parallel pipeline the batch goes through the stages in micro-batches, so
 * every stage has work: the figure that shows it. */
#ifndef DSF_BENCH_BATCH_H
#define DSF_BENCH_BATCH_H

#include "dsflash.h"
#include "bench_dist.h"

typedef struct {
    int nseq, steps;
    double wall, tps;      /* seconds of the timed steps; tokens (all sequences) per second */
    bench_dist_phase dist; /* an MPI job's traffic over the timed steps (n = 0: single process) */
} bench_batch_result;

/* nseq sessions, each prefilled (untimed) with its own prompt of `prompt` tokens, then `steps`
 * greedy steps of all of them at once, timed. 0, or 1 (said) on failure. */
int bench_batch(dsf_engine *e, int nseq, int prompt, int steps, bench_batch_result *out);
/* Its report lines (rank 0). */
void bench_batch_print(const bench_batch_result *r);

#endif
