/* threads.c: a persistent worker pool (see threads.h).
 *
 * The pool owns n_threads - 1 worker threads; the caller of dsf_parallel_for is thread 0.
 * A call publishes one job (fn, ctx, split) and bumps a generation counter; workers spin on
 * the counter for a short while (decode issues thousands of small jobs per second, and a
 * futex wake costs more than the job) and then sleep on a condition variable. Chunk k of
 * the deterministic split always runs on thread k, so per-thread scratch indexed by tid
 * is safe and results never depend on scheduling. A dynamic job (dsf_parallel_for_dyn)
 * instead lets each thread claim grain-sized units from a shared counter: a slow thread
 * (a busy neighbour, a page fault) then costs at most one unit of waiting.
 *
 * Invariants: one job at a time per pool; dsf_parallel_for is not re-entrant (calling it
 * from inside a chunk, or from two threads at once on the same pool, aborts); no
 * allocation after dsf_pool_new. */
#include "base/threads.h"
#include "base/util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SPIN_ITERS 20000 /* polling before sleeping: ~0.45-0.5 ms on these Zen 5 machines (measured) */

typedef struct {
    struct dsf_pool *pool;
    int tid;
    pthread_t th;
} worker;

struct dsf_pool {
    int n;
    worker *w;

    /* the current job, written by the caller before gen is bumped */
    dsf_range_fn fn;
    void *ctx;
    int64_t n_items, grain, units;
    int nch;
    int dynamic;                           /* 1: units claimed one at a time (dsf_parallel_for_dyn);
                                              2: shrinking pieces (dsf_parallel_for_guided);
                                              3: from both ends (dsf_parallel_for_ends) */
    _Alignas(64) atomic_int_fast64_t next; /* next unclaimed unit of a dynamic job; mode 3:
                                              front in the low 32 bits, back in the high */

    _Alignas(64) atomic_uint_fast64_t gen; /* bumped once per job */
    atomic_int stop;
    atomic_int n_sleeping;                 /* workers waiting on wake_cv */
    _Alignas(64) atomic_int pending;       /* workers that have not finished the job */
    atomic_int caller_sleeping;
    atomic_int busy;                       /* a job is being run (misuse guard) */

    pthread_mutex_t mu;
    pthread_cond_t wake_cv, done_cv;
};

static _Thread_local int tl_in_chunk; /* set while this thread runs a chunk */

/* One polling step. Every 256th step yields the core: when threads outnumber free cores
 * (a shared machine, or a pool larger than the CPU count) the thread we wait for may be
 * runnable but not running. */
static inline void cpu_relax(int s) {
    if ((s & 255) == 255) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Chunk k of the current job: units of `grain` indices split as evenly as possible. */
static void chunk_range(const dsf_pool *p, int k, int64_t *i0, int64_t *i1) {
    int64_t u0 = p->units * k / p->nch, u1 = p->units * (k + 1) / p->nch;
    int64_t a = u0 * p->grain, b = u1 * p->grain;
    *i0 = a < p->n_items ? a : p->n_items;
    *i1 = b < p->n_items ? b : p->n_items;
}

static void run_chunk(dsf_pool *p, int k) {
    int64_t i0, i1;
    tl_in_chunk = 1;
    if (p->dynamic == 2) { /* guided: claim max(grain, remaining / (2 x threads)) indices */
        i0 = atomic_load(&p->next);
        for (;;) {
            if (i0 >= p->n_items) break;
            int64_t size = (p->n_items - i0) / (2 * p->n);
            if (size < p->grain) size = p->grain;
            i1 = i0 + size < p->n_items ? i0 + size : p->n_items;
            if (!atomic_compare_exchange_weak(&p->next, &i0, i1)) continue; /* i0 reloaded */
            p->fn(p->ctx, i0, i1, k);
            i0 = atomic_load(&p->next);
        }
    } else if (p->dynamic == 3) { /* units [front, back) are unclaimed; guided from either end */
        const int from_back = k & 1;
        int_fast64_t v = atomic_load(&p->next);
        for (;;) {
            const int64_t front = v & 0xffffffff, back = v >> 32;
            if (front >= back) break;
            int64_t size = (back - front) / (2 * p->n);
            if (size < 1) size = 1;
            if (!atomic_compare_exchange_weak(&p->next, &v, from_back ? v - ((int_fast64_t)size << 32) : v + size)) continue;
            i0 = from_back ? back - size : front;
            p->fn(p->ctx, i0, i0 + size, k);
            v = atomic_load(&p->next);
        }
    } else if (p->dynamic) {
        for (int64_t u; (u = atomic_fetch_add(&p->next, 1)) < p->units;) {
            i0 = u * p->grain;
            i1 = i0 + p->grain < p->n_items ? i0 + p->grain : p->n_items;
            p->fn(p->ctx, i0, i1, k);
        }
    } else {
        chunk_range(p, k, &i0, &i1);
        if (i1 > i0) p->fn(p->ctx, i0, i1, k);
    }
    tl_in_chunk = 0;
}

static void *worker_main(void *arg) {
    worker *me = arg;
    dsf_pool *p = me->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g = atomic_load(&p->gen);
        for (int s = 0; g == seen && s < SPIN_ITERS; s++) {
            cpu_relax(s);
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->wake_cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) break;
        /* Every worker acknowledges every job, even without a chunk of its own: the caller
         * may only publish the next job once nobody can still be reading this one's fields. */
        if (me->tid < p->nch) run_chunk(p, me->tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int dsf_thread_start(pthread_t *th, void *(*fn)(void *), void *arg) {
    pthread_attr_t a;
    int rc = pthread_attr_init(&a);
    if (rc) return rc;
    size_t have = 0;
    if (pthread_attr_getstacksize(&a, &have) == 0 && have < DSF_THREAD_STACK) pthread_attr_setstacksize(&a, DSF_THREAD_STACK);
    rc = pthread_create(th, &a, fn, arg);
    pthread_attr_destroy(&a);
    return rc;
}

dsf_pool *dsf_pool_new(int n_threads) {
    dsf_pool *p = dsf_xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->busy, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (p->n > 1) {
        p->w = dsf_xcalloc((size_t)p->n, sizeof *p->w);
        for (int i = 1; i < p->n; i++) {
            p->w[i].pool = p;
            p->w[i].tid = i;
            if (dsf_thread_start(&p->w[i].th, worker_main, &p->w[i]) != 0) {
                /* Could not start all threads: run with the ones we have. */
                p->n = i;
                break;
            }
        }
    }
    return p;
}

static void wake_workers(dsf_pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

void dsf_pool_free(dsf_pool *p) {
    if (!p) return;
    DSF_ASSERT(!atomic_load(&p->busy));
    if (p->n > 1) {
        atomic_store(&p->stop, 1);
        wake_workers(p);
        for (int i = 1; i < p->n; i++) pthread_join(p->w[i].th, NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->w);
    free(p);
}

int dsf_pool_size(const dsf_pool *p) { return p ? p->n : 1; }

static void parallel_run(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx, int dynamic);

void dsf_parallel_for(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx) {
    parallel_run(p, n, grain, fn, ctx, 0);
}

void dsf_parallel_for_dyn(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx) {
    parallel_run(p, n, grain, fn, ctx, 1);
}

void dsf_parallel_for_guided(dsf_pool *p, int64_t n, int64_t min_grain, dsf_range_fn fn, void *ctx) {
    parallel_run(p, n, min_grain, fn, ctx, 2);
}

void dsf_parallel_for_ends(dsf_pool *p, int64_t n, dsf_range_fn fn, void *ctx) {
    DSF_ASSERT(n < ((int64_t)1 << 31));
    parallel_run(p, n, 1, fn, ctx, 3);
}

static void parallel_run(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx, int dynamic) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    /* Nested use would deadlock (the pool has one job slot): refuse it loudly. */
    DSF_ASSERT(!tl_in_chunk);
    if (!p || p->n <= 1) {
        tl_in_chunk = 1;
        const int units = dynamic == 1 || dynamic == 3; /* one fn call per grain */
        for (int64_t i0 = 0; i0 < n; i0 += units ? grain : n) fn(ctx, i0, units && n - i0 > grain ? i0 + grain : n, 0);
        tl_in_chunk = 0;
        return;
    }
    int expected = 0;
    DSF_ASSERT(atomic_compare_exchange_strong(&p->busy, &expected, 1));

    int64_t units = n / grain + (n % grain != 0);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->grain = grain;
    p->units = units;
    p->nch = units < p->n ? (int)units : p->n;
    p->dynamic = dynamic;
    atomic_store(&p->next, dynamic == 3 ? (int_fast64_t)units << 32 : 0);
    if (p->nch == 1) {
        run_chunk(p, 0);
        atomic_store(&p->busy, 0);
        return;
    }
    atomic_store(&p->pending, p->n - 1);
    wake_workers(p);
    run_chunk(p, 0);

    for (int s = 0; atomic_load(&p->pending) != 0 && s < SPIN_ITERS; s++) cpu_relax(s);
    if (atomic_load(&p->pending) != 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, 1);
        while (atomic_load(&p->pending) != 0) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store(&p->busy, 0);
}
