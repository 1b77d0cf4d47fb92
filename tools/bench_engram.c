/* bench_engram.c: the Engram table read from the disk (see bench_engram.h). Measures only:
 * the engine's readers (src/model/engram_io.c) keep their own statistics, and this file turns
 * them into per-token figures next to a random-read probe of the same file, so that the
 * Engram rate reads as a fraction of what the device gives at the same queue depth.
 * Must not: change what the engine reads (the probe uses its own file descriptor). */
#include "bench_engram.h"
#include "model/model.h"
#include "model/engram_io.h"
#include "io/gguf.h"
#include "base/util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void bench_engram_init(bench_engram *be, const char *path) {
    memset(be, 0, sizeof *be);
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open(path, err);
    const gguf_tensor *t = g ? gguf_find_tensor(g, "per_layer_token_embd.weight") : NULL;
    if (t) {
        be->on = true;
        snprintf(be->path, sizeof be->path, "%s", path);
        be->off = g->data_offset + t->offset;
        be->bytes = t->nbytes;
        be->row_bytes = t->row_bytes;
        be->n_rows = t->ne[1];
    }
    if (g) gguf_close(g);
}

/* The share of the table's pages in the page cache (mincore over a mapping of its range). */
static double resident_share(const bench_engram *be, int fd) {
    const long pg = sysconf(_SC_PAGESIZE);
    const uint64_t a = be->off & ~(uint64_t)(pg - 1), len = be->off + be->bytes - a;
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)a);
    if (m == MAP_FAILED) return -1;
    const size_t np = (size_t)((len + (uint64_t)pg - 1) / (uint64_t)pg);
    unsigned char *v = malloc(np);
    double share = -1;
    if (v && mincore(m, len, v) == 0) {
        size_t n = 0;
        for (size_t i = 0; i < np; i++) n += v[i] & 1;
        share = (double)n / (double)np;
    }
    free(v);
    munmap(m, len);
    return share;
}

/* Drops the table's pages; the share of them still cached, or -1. */
static double evict(const bench_engram *be) {
    int fd = open(be->path, O_RDONLY);
    if (fd < 0) return -1;
    double share = -1;
    if (posix_fadvise(fd, (off_t)be->off, (off_t)be->bytes, POSIX_FADV_DONTNEED) == 0) share = resident_share(be, fd);
    close(fd);
    return share;
}

double bench_engram_evict(bench_engram *be) {
    const double share = evict(be);
    if (share > be->worst_resident) be->worst_resident = share;
    if (share < 0) be->worst_resident = -1;
    be->evictions++;
    return share;
}

typedef struct {
    const bench_engram *be;
    int fd, n;
    uint64_t seed;
    int failed;
} probe_arg;

static void *probe_thread(void *p) {
    probe_arg *a = p;
    uint8_t *buf = malloc(a->be->row_bytes);
    uint64_t s = a->seed;
    for (int i = 0; buf && i < a->n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t row = (s >> 16) % (uint64_t)a->be->n_rows;
        const off_t at = (off_t)(a->be->off + row * a->be->row_bytes);
        a->failed |= pread(a->fd, buf, a->be->row_bytes, at) != (ssize_t)a->be->row_bytes;
    }
    free(buf);
    return NULL;
}

double bench_engram_probe(bench_engram *be, int qd, int n) {
    if (qd < 1) qd = 1;
    if (evict(be) < 0) return 0;
    int fd = open(be->path, O_RDONLY);
    if (fd < 0) return 0;
    /* as the engine's readers read: no readahead around a row */
    posix_fadvise(fd, (off_t)be->off, (off_t)be->bytes, POSIX_FADV_RANDOM);
    pthread_t th[256];
    probe_arg a[256];
    if (qd > 256) qd = 256;
    const double t0 = dsf_now();
    for (int i = 0; i < qd; i++) {
        a[i] = (probe_arg){be, fd, n / qd, 0x51ED0000ull + (uint64_t)i, 0};
        if (pthread_create(&th[i], NULL, probe_thread, &a[i])) a[i].failed = 1, a[i].n = 0, th[i] = 0;
    }
    int failed = 0, done = 0;
    for (int i = 0; i < qd; i++) {
        if (th[i]) pthread_join(th[i], NULL);
        failed |= a[i].failed;
        done += a[i].n;
    }
    const double dt = dsf_now() - t0;
    close(fd);
    evict(be); /* leave it cold for what comes next */
    return failed || dt <= 0 ? 0 : done / dt;
}

void bench_engram_report(bench_engram *be, dsf_engine *e, int steps) {
    if (!be->on || !e->eio || steps < 1) return;
    engram_io_stats st;
    engram_io_get_stats(e->eio, &st);
    const int readers = engram_io_readers(e->eio), qd = readers ? readers : 1;
    const double qd1 = bench_engram_probe(be, 1, 2000), qdn = readers ? bench_engram_probe(be, qd, 8000) : qd1;
    const double per = 1.0 / steps, read_ms = st.read_s * per * 1e3, wait_ms = st.wait_s * per * 1e3;
    /* the wait includes its own reads and the wake-up, so it can pass the read time a hair */
    const double hidden = read_ms > 0 && wait_ms < read_ms ? 1 - wait_ms / read_ms : 0.0;
    const double disk_rows = (double)st.bytes / (double)be->row_bytes;
    const double rate = st.read_s > 0 ? disk_rows / st.read_s : 0; /* rows per second while reading */
    printf("  Engram table %.2f GB (%lld rows of %llu bytes), evicted from the page cache before each of %d steps "
           "(mincore: at most %.2f %% of its pages left cached)\n",
           (double)be->bytes / 1e9, (long long)be->n_rows, (unsigned long long)be->row_bytes, be->evictions,
           be->worst_resident < 0 ? -1.0 : 100 * be->worst_resident);
    printf("  Engram per token: %.1f rows, %.1f unique, %.1f from the hot-row cache (%.0f MiB), %.1f preads "
           "(%.1f KB); readers %d\n",
           (double)st.rows * per, (double)st.unique * per, (double)st.cache_hits * per,
           (double)engram_io_cache_bytes(e->eio) / 1048576.0, (double)st.preads * per, (double)st.bytes * per / 1e3,
           readers);
    printf("  Engram read time per token %.3f ms (while a module's rows were being read), waited in "
           "engram_forward %.3f ms: %.0f %% hidden behind other work\n",
           read_ms, wait_ms, 100 * hidden);
    printf("  random-read probe (%llu-byte reads at random rows of the evicted table): QD 1 %.0f reads/s (%.2f MB/s), "
           "QD %d %.0f reads/s (%.2f MB/s); Engram reads while decoding %.0f rows/s -> %.3f of the QD %d probe\n",
           (unsigned long long)be->row_bytes, qd1, qd1 * (double)be->row_bytes / 1e6, qd, qdn,
           qdn * (double)be->row_bytes / 1e6, rate, qdn > 0 ? rate / qdn : 0.0, qd);
    printf("engram_cold readers=%d read_ms=%.3f wait_ms=%.3f hidden=%.3f rows_per_s=%.0f probe_qd1=%.0f probe_qd%d=%.0f "
           "ratio=%.3f\n",
           readers, read_ms, wait_ms, hidden, rate, qd1, qd, qdn,
           qdn > 0 ? rate / qdn : 0.0);
}
