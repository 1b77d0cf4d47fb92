/* threads.c: the worker pool. Guards against lost or doubled chunks (every index must be
 * visited exactly once), lost wake-ups (many back-to-back calls must all return), a split that
 * depends on scheduling (same n/grain/threads -> same chunks on the same tids), and silent
 * deadlock on nested use (must abort instead). */
#include "test.h"
#include "base/threads.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXN 5000
#define MAXT 16

typedef struct {
    atomic_int visits[MAXN];
    int64_t c0[MAXT], c1[MAXT]; /* chunk seen by each tid */
    atomic_int bad_tid;
    int64_t sum[MAXT];
} visit_ctx;

static void visit(void *ctx, int64_t i0, int64_t i1, int tid) {
    visit_ctx *v = ctx;
    if (tid < 0 || tid >= MAXT) { atomic_store(&v->bad_tid, 1); return; }
    v->c0[tid] = i0;
    v->c1[tid] = i1;
    for (int64_t i = i0; i < i1; i++) {
        atomic_fetch_add(&v->visits[i], 1);
        v->sum[tid] += i;
    }
}

/* Runs one parallel_for and checks coverage, tids and the grain rule. Returns 0 if good. */
static int check_once(test_ctx *t, dsf_pool *p, int64_t n, int64_t grain, visit_ctx *v) {
    memset(v, 0, sizeof *v);
    for (int k = 0; k < MAXT; k++) v->c0[k] = v->c1[k] = -1;
    dsf_parallel_for(p, n, grain, visit, v);
    if (atomic_load(&v->bad_tid)) { test_fail(t, __FILE__, __LINE__, "tid out of range"); return -1; }
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int c = atomic_load(&v->visits[i]);
        if (c != 1) { test_fail(t, __FILE__, __LINE__, "n=%lld grain=%lld: index %lld visited %d times", (long long)n, (long long)grain, (long long)i, c); return -1; }
        total += i;
    }
    int64_t s = 0;
    for (int k = 0; k < MAXT; k++) s += v->sum[k];
    if (s != total) { test_fail(t, __FILE__, __LINE__, "sum %lld != %lld", (long long)s, (long long)total); return -1; }
    /* chunks: contiguous in tid order, each >= grain except the last, tid < pool size */
    int64_t next = 0;
    for (int k = 0; k < MAXT; k++) {
        if (v->c0[k] < 0) continue;
        if (k >= dsf_pool_size(p) || v->c0[k] != next) { test_fail(t, __FILE__, __LINE__, "chunk of tid %d starts at %lld, expected %lld", k, (long long)v->c0[k], (long long)next); return -1; }
        if (v->c1[k] < n && v->c1[k] - v->c0[k] < grain) { test_fail(t, __FILE__, __LINE__, "chunk [%lld,%lld) smaller than grain %lld", (long long)v->c0[k], (long long)v->c1[k], (long long)grain); return -1; }
        next = v->c1[k];
    }
    if (next != n) { test_fail(t, __FILE__, __LINE__, "chunks end at %lld, expected %lld", (long long)next, (long long)n); return -1; }
    return 0;
}

TEST(threads_cover_ranges) {
    static visit_ctx v;
    int sizes[] = {1, 2, 3, 4, 7};
    int64_t ns[] = {1, 2, 3, 5, 16, 17, 100, 1000, 4999};
    int64_t grains[] = {1, 3, 16, 64};
    for (unsigned a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        dsf_pool *p = dsf_pool_new(sizes[a]);
        CHECK(dsf_pool_size(p) == sizes[a]);
        for (unsigned b = 0; b < sizeof ns / sizeof *ns; b++)
            for (unsigned c = 0; c < sizeof grains / sizeof *grains; c++)
                if (check_once(t, p, ns[b], grains[c], &v)) { dsf_pool_free(p); return; }
        dsf_pool_free(p);
    }
}

TEST(threads_n_below_threads) {
    static visit_ctx v;
    dsf_pool *p = dsf_pool_new(6);
    for (int64_t n = 1; n <= 5; n++)
        if (check_once(t, p, n, 1, &v)) { dsf_pool_free(p); return; }
    dsf_pool_free(p);
}

TEST(threads_deterministic_split) {
    static visit_ctx v;
    int64_t a0[MAXT], a1[MAXT];
    dsf_pool *p = dsf_pool_new(3);
    if (check_once(t, p, 1000, 16, &v)) { dsf_pool_free(p); return; }
    memcpy(a0, v.c0, sizeof a0);
    memcpy(a1, v.c1, sizeof a1);
    for (int r = 0; r < 50; r++) {
        if (check_once(t, p, 1000, 16, &v)) { dsf_pool_free(p); return; }
        CHECK(!memcmp(a0, v.c0, sizeof a0) && !memcmp(a1, v.c1, sizeof a1));
    }
    /* chunk boundaries are multiples of the grain (kernels rely on it for unrolled rows) */
    for (int k = 0; k < 3; k++) CHECK(a0[k] % 16 == 0);
    dsf_pool_free(p);
}

typedef struct { atomic_long total; } count_ctx;
static void count(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    atomic_fetch_add(&((count_ctx *)ctx)->total, (long)(i1 - i0));
}

TEST(threads_many_calls) {
    /* Back-to-back calls exercise the spin/sleep hand-over; a lost wake-up hangs here (the
     * runner's timeout then fails the test). The usleep lets workers fall asleep sometimes. */
    dsf_pool *p = dsf_pool_new(3);
    count_ctx c;
    atomic_init(&c.total, 0);
    long want = 0;
    for (int r = 0; r < 20000; r++) {
        int64_t n = 1 + r % 37;
        dsf_parallel_for(p, n, 1, count, &c);
        want += n;
        if (r % 2000 == 0) usleep(2000);
    }
    CHECK(atomic_load(&c.total) == want);
    dsf_pool_free(p);
}

static dsf_pool *g_nested_pool;
static void nested(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)ctx;
    (void)i0;
    (void)i1;
    (void)tid;
    dsf_parallel_for(g_nested_pool, 10, 1, count, ctx);
}

TEST(threads_nested_aborts) {
    /* Nested parallel_for must abort (DSF_ASSERT), not deadlock or run silently. */
    for (int nt = 1; nt <= 2; nt++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            freopen("/dev/null", "w", stderr);
            alarm(10);
            count_ctx c;
            atomic_init(&c.total, 0);
            g_nested_pool = dsf_pool_new(nt);
            dsf_parallel_for(g_nested_pool, 4, 1, nested, &c);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "threads=%d: nested call did not abort (status %d)", nt, st);
    }
}

/* Dynamic jobs: every index visited exactly once, each call one whole unit [u*grain,
 * (u+1)*grain) (the last one cut at n), tids within the pool; also under many calls. */
typedef struct {
    atomic_int hits[4096];
    atomic_int bad;
    int64_t grain, n;
    int nthreads;
    int64_t last[8]; /* dsf_parallel_for_ends: the unit each thread claimed last */
} dyn_ctx;
static void dyn_visit(void *ctx, int64_t i0, int64_t i1, int tid) {
    dyn_ctx *d = ctx;
    int64_t want1 = i0 + d->grain < d->n ? i0 + d->grain : d->n;
    if (i0 % d->grain != 0 || i1 != want1 || tid < 0 || tid >= d->nthreads) atomic_store(&d->bad, 1);
    for (int64_t i = i0; i < i1; i++) atomic_fetch_add(&d->hits[i], 1);
}

typedef void (*claim_fn)(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx);

/* 300 jobs of varied n and grain on pools of 1-3 threads: every index visited once and
 * piece_check() finds nothing wrong with the pieces. */
static void check_claims(test_ctx *t, claim_fn run, dsf_range_fn piece_check) {
    for (int nt = 1; nt <= 3; nt++) {
        dsf_pool *p = dsf_pool_new(nt);
        static dyn_ctx d;
        for (int r = 0; r < 300; r++) {
            int64_t n = 1 + (r * 131) % 4096, grain = 1 + (r * 17) % 97;
            memset(&d, 0, sizeof d);
            d.grain = grain;
            d.n = n;
            d.nthreads = dsf_pool_size(p);
            run(p, n, grain, piece_check, &d);
            CHECK(!atomic_load(&d.bad));
            for (int64_t i = 0; i < n; i++) CHECK(atomic_load(&d.hits[i]) == 1);
        }
        dsf_pool_free(p);
    }
}

TEST(threads_dynamic_units) { check_claims(t, dsf_parallel_for_dyn, dyn_visit); }

/* Guided jobs: every index visited exactly once, pieces of at least min_grain indices (the
 * last one may be shorter), tids within the pool. */
static void guided_visit(void *ctx, int64_t i0, int64_t i1, int tid) {
    dyn_ctx *d = ctx;
    if (i1 <= i0 || (i1 - i0 < d->grain && i1 != d->n) || tid < 0 || tid >= d->nthreads) atomic_store(&d->bad, 1);
    for (int64_t i = i0; i < i1; i++) atomic_fetch_add(&d->hits[i], 1);
}

TEST(threads_guided_pieces) { check_claims(t, dsf_parallel_for_guided, guided_visit); }

/* Two-ended jobs: every unit visited exactly once; even threads claim front to back (each
 * claim starts at or past the end of their last), odd threads back to front (each claim ends
 * at or before the start of their last); no claim is empty, and none is larger than
 * n / (2 x threads) (a claim takes what is unclaimed / (2 x threads), at least 1). */
static void ends_visit(void *ctx, int64_t i0, int64_t i1, int tid) {
    dyn_ctx *d = ctx;
    int64_t most = d->n / (2 * d->nthreads) > 1 ? d->n / (2 * d->nthreads) : 1;
    if (i1 <= i0 || i1 - i0 > most || tid < 0 || tid >= d->nthreads || tid >= 8) {
        atomic_store(&d->bad, 1);
        return;
    }
    if (d->last[tid] >= 0 && ((tid & 1) ? i1 > d->last[tid] : i0 < d->last[tid])) atomic_store(&d->bad, 1);
    d->last[tid] = (tid & 1) ? i0 : i1;
    for (int64_t i = i0; i < i1; i++) atomic_fetch_add(&d->hits[i], 1);
}

static void ends_run(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx) {
    dyn_ctx *d = ctx;
    (void)grain;
    d->grain = 1;
    for (int i = 0; i < 8; i++) d->last[i] = -1;
    dsf_parallel_for_ends(p, n, fn, ctx);
}

TEST(threads_ends_units) { check_claims(t, ends_run, ends_visit); }
