/* engram_io.c: the Engram table's reader pool and the per-chunk row requests (engram_io.h).
 *
 * Threads and locking: n_readers threads wait on work_cv for a job in the queue (a module of a
 * request with unclaimed rows), claim one unique row at a time under mu, read it outside mu
 * (the hot-row cache first, then pread on the pool's own file descriptor), and report it under
 * mu; the report of a job's last row broadcasts done_cv. A waiting forward claims rows of its
 * own job the same way before it sleeps on done_cv, so a job completes even with no readers.
 * Owns: its own open file description of the model (so that POSIX_FADV_RANDOM, which turns
 * off the kernel's readahead of a 512-byte row into 16 KiB, touches no other reader of the
 * file), the threads, the cache, the statistics.
 * Must not: know row types (rows are raw bytes), or touch the compute pool.
 * Invariant: a job's raw slot i is written by exactly one claimant of i, and read only after
 * engram_io_wait saw done == n_uniq under mu. */
#include "model/engram_io.h"
#include "model/engram_cache.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct ejob {
    int64_t n, n_uniq;
    int64_t *rows;  /* [max_rows] hashed rows, in the caller's order */
    int64_t *uniq;  /* [max_rows] sorted unique rows, n_uniq of them */
    int32_t *slot;  /* [max_rows] rows[i] == uniq[slot[i]] */
    uint8_t *raw;   /* [max_rows][stride] the bytes of uniq[k] at k * stride */
    uint64_t stride;
    int64_t next, done; /* claimed and finished unique rows (under io->mu) */
    bool started, failed;
    char err[200]; /* the first failed row's row_res.why */
    struct ejob *qnext;
} ejob;

struct engram_req {
    bool failed; /* a wait failed since the last engram_req_take_error */
    char err[DSF_ERR_LEN];
    int n_modules;
    int64_t max_rows;
    uint64_t stride;
    ejob *jobs; /* [n_modules] */
};

struct engram_io {
    int fd;              /* own description of the model file, or -1: copy from base */
    const uint8_t *base; /* the table in memory (fd < 0) */
    uint64_t off, row_bytes;
    int64_t n_rows;
    int n_readers;
    pthread_t *th;
    engram_cache *cache;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    ejob *head;          /* jobs with unclaimed rows, in start order */
    bool stop;
    int open;            /* jobs with a row claimed and not all rows read */
    double busy_t0;      /* when open last rose from 0 */
    engram_io_stats st;
};

/* ---- one row ------------------------------------------------------------------------- */

typedef struct {
    bool hit, failed;
    uint64_t preads, bytes;
    char why[200];
} row_res;

/* Row `row` into dst: from the cache, else read (pread until whole: a short count is retried
 * from where it stopped, 0 bytes means the file ends before the row does). On failure dst is
 * zeroed and res->why says why; nothing is cached. */
static void read_row(engram_io *io, int64_t row, uint8_t *dst, row_res *res) {
    const uint64_t rb = io->row_bytes;
    memset(res, 0, sizeof *res);
    if (row < 0 || row >= io->n_rows) {
        res->failed = true;
        snprintf(res->why, sizeof res->why, "row %lld is outside the table's %lld rows", (long long)row,
                 (long long)io->n_rows);
        memset(dst, 0, rb);
        return;
    }
    if (io->cache && engram_cache_get(io->cache, row, dst)) {
        res->hit = true;
        return;
    }
    const uint64_t off = io->off + (uint64_t)row * rb;
    if (io->fd < 0) {
        memcpy(dst, io->base + (uint64_t)row * rb, rb);
    } else {
        uint64_t got = 0;
        while (got < rb) {
            ssize_t k = pread(io->fd, dst + got, rb - got, (off_t)(off + got));
            res->preads++;
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                res->failed = true;
                if (k < 0)
                    snprintf(res->why, sizeof res->why, "row %lld at file offset %llu: read failed: %s", (long long)row,
                             (unsigned long long)off, strerror(errno));
                else
                    snprintf(res->why, sizeof res->why,
                             "row %lld at file offset %llu: short read (%llu of %llu bytes): the file ends before the "
                             "table does (truncated?)",
                             (long long)row, (unsigned long long)off, (unsigned long long)got, (unsigned long long)rb);
                memset(dst, 0, rb);
                return;
            }
            got += (uint64_t)k;
        }
        res->bytes = rb;
    }
    if (io->cache) engram_cache_put(io->cache, row, dst);
}

/* ---- the queue (under mu) -------------------------------------------------------------- */

static void dequeue(engram_io *io, ejob *j) {
    for (ejob **p = &io->head; *p; p = &(*p)->qnext)
        if (*p == j) {
            *p = j->qnext;
            j->qnext = NULL;
            return;
        }
}

/* Claims the next unique row of j (j has one); drops j from the queue when it was the last. */
static int64_t claim(engram_io *io, ejob *j) {
    if (!j->next && !io->open++) io->busy_t0 = dsf_now();
    int64_t i = j->next++;
    if (j->next == j->n_uniq) dequeue(io, j);
    return i;
}

/* Accounts row i of j as read (res); the last one wakes the waiters. */
static void finish(engram_io *io, ejob *j, const row_res *res) {
    io->st.cache_hits += res->hit;
    io->st.preads += res->preads;
    io->st.bytes += res->bytes;
    if (res->failed && !j->failed) {
        j->failed = true;
        snprintf(j->err, sizeof j->err, "%s", res->why);
    }
    if (++j->done == j->n_uniq) {
        if (!--io->open) io->st.read_s += dsf_now() - io->busy_t0;
        pthread_cond_broadcast(&io->done_cv);
    }
}

/* Claims, reads and reports rows of j (or of the queue's first job when j is NULL) while any
 * is unclaimed. Called and returns with mu held. */
static void work(engram_io *io, ejob *j) {
    for (;;) {
        ejob *w = j ? j : io->head;
        if (!w || w->next >= w->n_uniq) return;
        int64_t i = claim(io, w);
        pthread_mutex_unlock(&io->mu);
        row_res res;
        read_row(io, w->uniq[i], w->raw + (uint64_t)i * w->stride, &res);
        pthread_mutex_lock(&io->mu);
        finish(io, w, &res);
    }
}

static void *reader_main(void *arg) {
    engram_io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && !io->head) pthread_cond_wait(&io->work_cv, &io->mu);
        if (!io->head) break; /* stopping, and nothing queued */
        work(io, NULL);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* ---- the pool ---------------------------------------------------------------------------- */

engram_io *engram_io_new(int fd, const uint8_t *base, uint64_t off, uint64_t row_bytes, int64_t n_rows, int n_readers,
                         uint64_t cache_bytes, char *err) {
    DSF_ASSERT(row_bytes > 0 && n_rows >= 0 && n_readers >= 0 && (fd >= 0 || base));
    engram_io *io = dsf_xcalloc(1, sizeof *io);
    io->fd = -1;
    if (fd >= 0) {
        /* a description of our own: the advice below must not change how the weights'
         * mapping or the token table's reads are read ahead */
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        io->fd = open(p, O_RDONLY | O_CLOEXEC);
        if (io->fd < 0) io->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* no /proc: share the description */
        if (io->fd < 0) {
            dsf_seterr(err, "Engram readers: cannot reopen the model file: %s", strerror(errno));
            free(io);
            return NULL;
        }
        posix_fadvise(io->fd, (off_t)off, (off_t)(row_bytes * (uint64_t)n_rows), POSIX_FADV_RANDOM);
    }
    io->base = base;
    io->off = off;
    io->row_bytes = row_bytes;
    io->n_rows = n_rows;
    io->cache = cache_bytes ? engram_cache_new(cache_bytes, row_bytes, n_rows) : NULL;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work_cv, NULL);
    pthread_cond_init(&io->done_cv, NULL);
    io->th = dsf_xcalloc((size_t)(n_readers ? n_readers : 1), sizeof *io->th);
    for (; io->n_readers < n_readers; io->n_readers++) {
        int rc = pthread_create(&io->th[io->n_readers], NULL, reader_main, io);
        if (rc) {
            dsf_seterr(err, "Engram readers: cannot start reader thread %d: %s", io->n_readers, strerror(rc));
            engram_io_free(io);
            return NULL;
        }
    }
    return io;
}

void engram_io_free(engram_io *io) {
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    DSF_ASSERT(!io->head); /* a forward left a request unwaited */
    io->stop = true;
    pthread_cond_broadcast(&io->work_cv);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n_readers; i++) pthread_join(io->th[i], NULL);
    pthread_cond_destroy(&io->work_cv);
    pthread_cond_destroy(&io->done_cv);
    pthread_mutex_destroy(&io->mu);
    engram_cache_free(io->cache);
    if (io->fd >= 0) close(io->fd);
    free(io->th);
    free(io);
}

int engram_io_readers(const engram_io *io) { return io ? io->n_readers : 0; }
uint64_t engram_io_cache_bytes(const engram_io *io) { return io ? engram_cache_bytes(io->cache) : 0; }

void engram_io_get_stats(engram_io *io, engram_io_stats *out) {
    pthread_mutex_lock(&io->mu);
    *out = io->st;
    pthread_mutex_unlock(&io->mu);
}

void engram_io_reset_stats(engram_io *io) {
    pthread_mutex_lock(&io->mu);
    memset(&io->st, 0, sizeof io->st);
    pthread_mutex_unlock(&io->mu);
}

/* ---- requests ---------------------------------------------------------------------------- */

engram_req *engram_req_new(const engram_io *io, int n_modules, int64_t max_rows, size_t *bytes) {
    DSF_ASSERT(n_modules > 0 && max_rows > 0);
    engram_req *r = dsf_xcalloc(1, sizeof *r);
    r->n_modules = n_modules;
    r->max_rows = max_rows;
    r->stride = (io->row_bytes + 63) & ~(uint64_t)63;
    r->jobs = dsf_xcalloc((size_t)n_modules, sizeof *r->jobs);
    const size_t n = (size_t)max_rows;
    for (int m = 0; m < n_modules; m++) {
        ejob *j = &r->jobs[m];
        j->rows = dsf_xmalloc(n * sizeof *j->rows);
        j->uniq = dsf_xmalloc(n * sizeof *j->uniq);
        j->slot = dsf_xmalloc(n * sizeof *j->slot);
        j->raw = dsf_aligned_alloc(n * r->stride);
        DSF_ASSERT(j->raw);
        j->stride = r->stride;
        if (bytes) *bytes += n * (2 * sizeof(int64_t) + sizeof(int32_t) + r->stride);
    }
    return r;
}

void engram_req_free(engram_req *r) {
    if (!r) return;
    for (int m = 0; m < r->n_modules; m++) {
        DSF_ASSERT(!r->jobs[m].started);
        free(r->jobs[m].rows);
        free(r->jobs[m].uniq);
        free(r->jobs[m].slot);
        free(r->jobs[m].raw);
    }
    free(r->jobs);
    free(r);
}

int64_t *engram_req_rows(engram_req *r, int m) {
    DSF_ASSERT(m >= 0 && m < r->n_modules);
    return r->jobs[m].rows;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void engram_io_start(engram_io *io, engram_req *r, int m, int64_t n) {
    DSF_ASSERT(m >= 0 && m < r->n_modules && n >= 0 && n <= r->max_rows);
    ejob *j = &r->jobs[m];
    DSF_ASSERT(!j->started);
    /* sorted and unique: each row is read once per chunk, in file order */
    memcpy(j->uniq, j->rows, (size_t)n * sizeof *j->uniq);
    qsort(j->uniq, (size_t)n, sizeof *j->uniq, cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (!u || j->uniq[i] != j->uniq[u - 1]) j->uniq[u++] = j->uniq[i];
    for (int64_t i = 0; i < n; i++) {
        const int64_t *at = bsearch(&j->rows[i], j->uniq, (size_t)u, sizeof *j->uniq, cmp_i64);
        j->slot[i] = (int32_t)(at - j->uniq);
    }
    j->n = n;
    j->n_uniq = u;
    j->next = j->done = 0;
    j->failed = false;
    j->err[0] = 0;
    j->started = true;
    pthread_mutex_lock(&io->mu);
    io->st.modules++;
    io->st.rows += (uint64_t)n;
    io->st.unique += (uint64_t)u;
    if (u) {
        ejob **p = &io->head;
        while (*p) p = &(*p)->qnext;
        *p = j;
        j->qnext = NULL;
        pthread_cond_broadcast(&io->work_cv);
    }
    pthread_mutex_unlock(&io->mu);
}

int engram_io_wait(engram_io *io, engram_req *r, int m, char *err) {
    DSF_ASSERT(m >= 0 && m < r->n_modules);
    ejob *j = &r->jobs[m];
    if (!j->started) return 0;
    const double t0 = dsf_now();
    pthread_mutex_lock(&io->mu);
    work(io, j); /* help: the rows nobody has claimed yet */
    while (j->done < j->n_uniq) pthread_cond_wait(&io->done_cv, &io->mu);
    j->started = false;
    io->st.wait_s += dsf_now() - t0;
    pthread_mutex_unlock(&io->mu);
    if (!j->failed) return 0;
    if (!r->failed) {
        r->failed = true;
        snprintf(r->err, sizeof r->err, "Engram table: %s", j->err);
    }
    return dsf_seterr(err, "Engram table: %s", j->err);
}

int engram_req_take_error(engram_req *r, char *err) {
    if (!r || !r->failed) return 0;
    r->failed = false;
    return dsf_seterr(err, "%s", r->err);
}

bool engram_req_started(const engram_req *r, int m) {
    DSF_ASSERT(m >= 0 && m < r->n_modules);
    return r->jobs[m].started;
}

const uint8_t *engram_req_row(const engram_req *r, int m, int64_t i) {
    const ejob *j = &r->jobs[m];
    return j->raw + (uint64_t)j->slot[i] * j->stride;
}

int engram_req_pending(const engram_req *r) {
    int n = 0;
    for (int m = 0; r && m < r->n_modules; m++) n += r->jobs[m].started;
    return n;
}
