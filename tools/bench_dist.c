/* bench_dist.c: `dsflash bench -m MODEL` as an MPI job (bench_dist.h).
 *
 * Every rank runs bench's option parsing and opens the engine; a follower never comes back from
 * dsf_engine_open (it follows rank 0 until rank 0 closes the engine), so everything else here
 * runs on rank 0, which asks the others for their counters. A phase's figures:
 * - bytes and messages per token: the sum over ranks of what each sent, over the tokens the
 *   phase evaluated (the op stream rank 0 sends, the stream and what crosses each cut, the
 *   experts' partial sums, the logits back to rank 0);
 * - each rank's wait fraction: its seconds inside MPI waits (a follower's idle wait for rank
 *   0's next op included) over rank 0's wall time of the phase.
 * Must not: print on a follower, or measure anything but the counters (cmd_bench.c times). */
#include "bench_dist.h"
#include "model/model.h"
#include "model/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void bench_dist_begin(dsf_engine *e) { dsf_dist_stats_reset(e); }

int bench_dist_end(dsf_engine *e, bench_dist_phase *ph, double wall, int tokens) {
    char err[DSF_ERR_LEN] = "";
    memset(ph, 0, sizeof *ph);
    const int n = dsf_dist_stats(e, ph->st, BENCH_DIST_MAX, err);
    if (n < 0) {
        fprintf(stderr, "dsflash bench: the ranks' counters: %s\n", err);
        return -1;
    }
    ph->n = n;
    ph->wall = wall;
    ph->tokens = tokens;
    return 0;
}

static void sums(const bench_dist_phase *ph, double *bytes, double *msgs) {
    *bytes = *msgs = 0;
    for (int r = 0; r < ph->n; r++) *bytes += (double)ph->st[r].bytes_sent, *msgs += (double)ph->st[r].msgs_sent;
}

void bench_dist_print_phase(const char *name, const bench_dist_phase *ph) {
    double bytes, msgs;
    sums(ph, &bytes, &msgs);
    const double tk = ph->tokens > 0 ? ph->tokens : 1;
    printf("  MPI, %s %d tokens: %.2f tok/s; exchanged per token %.0f bytes in %.2f messages (all ranks' sends); "
           "time waiting on MPI:",
           name, ph->tokens, ph->wall > 0 ? ph->tokens / ph->wall : 0, bytes / tk, msgs / tk);
    for (int r = 0; r < ph->n; r++) printf(" rank %d %.3f%s", r, ph->wall > 0 ? ph->st[r].wait_s / ph->wall : 0, r + 1 < ph->n ? "," : "");
    printf(" (of the phase's wall time)\n");
}

void bench_dist_print(const dsf_engine *e, const bench_dist_phase *prefill, const bench_dist_phase *decode) {
    const dist_plan *d = e->dist;
    if (!d || prefill->n < 2) return;
    const char *mode = d->n_stages == d->size ? "pipeline" : d->n_stages == 1 ? "experts" : "pipeline,experts";
    printf("  MPI job: %d ranks, --parallel %s: %d stage%s (cuts at", d->size, mode, d->n_stages, d->n_stages > 1 ? "s" : "");
    for (int s = 1; s < d->n_stages; s++) printf("%s %lld", s > 1 ? "," : "", (long long)d->l0[s]);
    printf("%s), members per stage", d->n_stages > 1 ? "" : " none");
    for (int s = 0; s < d->n_stages; s++) printf("%s%d", s ? "," : " ", d->first[s + 1] - d->first[s]);
    printf("; each rank's layers, experts and weight bytes: its log line (stderr); the read probes and fractions are "
           "rank 0's\n");
    bench_dist_print_phase("prefill", prefill);
    bench_dist_print_phase("decode", decode);
    printf("  MPI, resident memory (VmRSS after the decode; rank 0's holds the probe arena, --arena-mb):");
    for (int r = 0; r < decode->n; r++)
        printf(" rank %d %.1f MiB%s", r, (double)decode->st[r].rss_bytes / 1048576.0, r + 1 < decode->n ? "," : "");
    printf("\n");
}

/* "a,b,c" of each rank's wait fraction */
static void fractions(const bench_dist_phase *ph, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < ph->n && o < size; r++)
        o += (size_t)snprintf(buf + o, size - o, "%s%.3f", r ? "," : "", ph->wall > 0 ? ph->st[r].wait_s / ph->wall : 0);
}

void bench_dist_keys(const bench_dist_phase *prefill, const bench_dist_phase *decode, char *buf, size_t size) {
    buf[0] = 0;
    if (prefill->n < 2) return;
    double pb, pm, db, dm;
    sums(prefill, &pb, &pm);
    sums(decode, &db, &dm);
    char pw[BENCH_DIST_MAX * 8], dw[BENCH_DIST_MAX * 8], rss[BENCH_DIST_MAX * 12];
    fractions(prefill, pw, sizeof pw);
    fractions(decode, dw, sizeof dw);
    size_t o = 0;
    rss[0] = 0;
    for (int r = 0; r < decode->n && o < sizeof rss; r++)
        o += (size_t)snprintf(rss + o, sizeof rss - o, "%s%.0f", r ? "," : "", (double)decode->st[r].rss_bytes / 1048576.0);
    const double pt = prefill->tokens > 0 ? prefill->tokens : 1, dt = decode->tokens > 0 ? decode->tokens : 1;
    snprintf(buf, size,
             " ranks=%d prefill_mpi_bytes_per_token=%.0f prefill_mpi_msgs_per_token=%.3f prefill_mpi_wait=%s "
             "decode_mpi_bytes_per_token=%.0f decode_mpi_msgs_per_token=%.3f decode_mpi_wait=%s rss_mib=%s",
             prefill->n, pb / pt, pm / pt, pw, db / dt, dm / dt, dw, rss);
}

long bench_dist_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *local = dsf_dist_size() > 1 ? getenv("OMPI_COMM_WORLD_LOCAL_SIZE") : NULL;
    const long k = local ? strtol(local, NULL, 10) : 1;
    if (k > 1) n /= k;
    return n < 1 ? 1 : n;
}
