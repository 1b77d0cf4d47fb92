/* threads.h: a persistent worker pool and parallel_for over index ranges.
 * The token loop never creates threads or allocates: the pool is created once per engine.
 * parallel_for splits [0, n) into contiguous chunks (at least `grain` indices each, except
 * the last) and calls fn(ctx, i0, i1, tid) on each, with tid in [0, n_threads); it returns
 * when all chunks are done. Deterministic: the split depends only on n, grain and n_threads,
 * and callers must not let results depend on which thread ran a chunk. */
#ifndef DSF_THREADS_H
#define DSF_THREADS_H

#include <pthread.h>
#include <stdint.h>

typedef struct dsf_pool dsf_pool;
typedef void (*dsf_range_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

/* Threads that run engine work (the pool's workers, the server's scheduler) get at least this
 * much stack whatever RLIMIT_STACK says: kernels keep chunk buffers of up to 512 KiB on the
 * stack (kernels/matmul_avx512.c, kernels/matmul_avx2.c). */
#define DSF_THREAD_STACK ((size_t)8 << 20)
/* pthread_create with a stack of at least DSF_THREAD_STACK; returns pthread_create's code. */
int dsf_thread_start(pthread_t *th, void *(*fn)(void *), void *arg);

dsf_pool *dsf_pool_new(int n_threads); /* n_threads <= 1: everything runs on the caller */
void dsf_pool_free(dsf_pool *p);
int dsf_pool_size(const dsf_pool *p);
void dsf_parallel_for(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx);
/* The same with dynamic claiming: [0, n) is cut into units [u*grain, (u+1)*grain) (the last
 * one shorter) and the threads claim units one at a time until none is left, so a slow
 * thread delays the job by at most one unit. Each unit is one fn call; tid is the calling
 * thread's index (per-thread scratch stays safe), but which thread runs which unit depends
 * on timing: fn's results must not depend on tid or on the unit boundaries beyond them. */
void dsf_parallel_for_dyn(dsf_pool *p, int64_t n, int64_t grain, dsf_range_fn fn, void *ctx);
/* Guided claiming: each claim takes max(min_grain, remaining / (2 x threads)) indices, so the
 * pieces shrink towards the end and the threads finish together, with few claims. Same
 * contract as dsf_parallel_for_dyn (boundaries depend on timing; tid = the thread's index). */
void dsf_parallel_for_guided(dsf_pool *p, int64_t n, int64_t min_grain, dsf_range_fn fn, void *ctx);
/* Two-ended claiming of n units: even threads claim from the front, odd threads from the
 * back, until the two ends meet; each claim takes max(1, unclaimed / (2 x threads)) adjacent
 * units (one fn call), so the claims shrink to single units where the ends meet. A caller
 * that puts compute-bound units first and bandwidth-bound ones last thus has both kinds
 * running at once on two threads until one kind runs out. Same contract as
 * dsf_parallel_for_dyn; n < 2^31. */
void dsf_parallel_for_ends(dsf_pool *p, int64_t n, dsf_range_fn fn, void *ctx);

#endif
