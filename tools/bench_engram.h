/* bench_engram.h: the Engram table read from the disk, for `dsflash bench -m MODEL --cold`
 * (tools/bench_engram.c): evicting the table from the page cache (checked with mincore), a
 * random-read probe of the table's row size, and the per-token report of the engine's reader
 * statistics against that probe. */
#ifndef DSF_BENCH_ENGRAM_H
#define DSF_BENCH_ENGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "dsflash.h"

typedef struct {
    bool on;               /* the model has an Engram table and the path was opened */
    char path[1024];
    uint64_t off, bytes;   /* the table's file range */
    uint64_t row_bytes;
    int64_t n_rows;
    double worst_resident; /* the largest share of its pages cached right after an eviction */
    int evictions;
} bench_engram;

/* Finds the table of the GGUF at path (be->on false when it has none). */
void bench_engram_init(bench_engram *be, const char *path);
/* Drops the table's pages from the page cache (posix_fadvise DONTNEED) and checks with
 * mincore what is left; returns the share of its pages still cached (-1 if it cannot tell). */
double bench_engram_evict(bench_engram *be);
/* Random reads of row_bytes at random rows of the evicted table: n reads by qd threads.
 * Returns reads per second (0 on failure). */
double bench_engram_probe(bench_engram *be, int qd, int n);
/* Prints the Engram lines of a cold decode of `steps` tokens on e (the reader statistics
 * gathered since engram_io_reset_stats) against a probe run now at QD 1 and at the readers'
 * count. */
void bench_engram_report(bench_engram *be, dsf_engine *e, int steps);

#endif
