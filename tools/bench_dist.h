/* bench_dist.h: `dsflash bench -m MODEL` as an MPI job (mpirun ... --parallel MODE; tools/
 * bench_dist.c): the traffic of each measured phase (prefill, decode) from dsf_dist_stats,
 * reset before the phase and read after it, and the report of it (rank 0 prints). */
#ifndef DSF_BENCH_DIST_H
#define DSF_BENCH_DIST_H

#include "dsflash.h"

#define BENCH_DIST_MAX 64 /* ranks reported */

typedef struct {
    int n;          /* ranks; 0: not measured (a single process) */
    int tokens;     /* tokens the phase evaluated */
    double wall;    /* rank 0's seconds for the phase */
    dsf_dist_rank_stats st[BENCH_DIST_MAX];
} bench_dist_phase;

/* Resets every rank's counters (a no-op in a single process): call just before the phase. */
void bench_dist_begin(dsf_engine *e);
/* The counters after the phase (wall seconds, tokens evaluated) into ph. 0, or -1 (said). */
int bench_dist_end(dsf_engine *e, bench_dist_phase *ph, double wall, int tokens);
/* Rank 0's report of a job: the plan's shape, then per phase the bytes and messages exchanged
 * per token (all ranks' sends), tok/s and each rank's share of the wall time spent waiting on
 * MPI; each rank's resident memory (at the end of decode). Nothing in a single process. */
void bench_dist_print(const dsf_engine *e, const bench_dist_phase *prefill, const bench_dist_phase *decode);
/* One phase's line: tok/s, bytes and messages per token, each rank's wait fraction. */
void bench_dist_print_phase(const char *name, const bench_dist_phase *ph);
/* The keys of the machine-readable last line (" ranks=N ..."), appended to buf; "" in a single
 * process. */
void bench_dist_keys(const bench_dist_phase *prefill, const bench_dist_phase *decode, char *buf, size_t size);
/* --threads' default: this machine's online CPUs shared among the job's ranks on it
 * (OMPI_COMM_WORLD_LOCAL_SIZE), at least 1; all of them in a single process. */
long bench_dist_default_threads(void);

#endif
