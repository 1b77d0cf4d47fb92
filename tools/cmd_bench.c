/* cmd_bench.c: `dsflash bench --kernels`: the kernel micro-benchmark.
 *
 * Decode kernels are judged by weight bytes per second against the memory read bandwidth
 * measured in the same run; prefill kernels by GFLOP/s against the measured dot peak
 * (STYLE.md "SIMD"). The read bandwidth of this machine class is bimodal and switches every
 * few seconds, so every kernel measurement is bracketed by two read probes (probe, kernel,
 * probe, kernel, ...) and compared with the mean of its two neighbours.
 *
 * All weights live in one arena of random bytes (random, never constant: constant pages can
 * be deduplicated or compress in caches and inflate bandwidth figures), larger than any L3;
 * each kernel walks a set of matrices that covers the whole arena, so every pass reads from
 * DRAM.
 *
 * `dsflash bench -m MODEL`: prefill + greedy decode through the public engine API, with the
 * same probes interleaved (read probes between blocks of decode steps, peak probes around
 * the prefill), run on the engine's own thread pool. As an MPI job (mpirun ... --parallel MODE)
 * rank 0 runs it and the other ranks follow inside dsf_engine_open; the decode is then timed as
 * one block (a probe on rank 0 between steps would count as MPI wait on the others) and the
 * report adds each phase's traffic (bench_dist.c). */
#include "bench_constrain.h"
#include "bench_dist.h"
#include "bench_batch.h"
#include "bench_engram.h"
#include "bench_vision.h"
#include "cmd.h"
#include "frontend.h"
#include "dsflash.h"
#include "model/cost.h"
#include "model/mm.h"
#include "io/gguf.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4r.h"
#include "kernels/select.h"
#include "model/model.h"
#include "model/engram_io.h"
#include "kernels/quant.h"
#include "base/threads.h"
#include "base/util.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    const dsf_kernels *k;
    const dsf_wmat *w;
    const float *x;
    const uint16_t *xb; /* non-NULL: BF16-activation kernel */
    const dsf_q8k *x8;  /* non-NULL: Q8_K-activation kernel (--act-q8k) */
    int64_t T;
    float *y;
} mm_job;

static void mm_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    mm_job *j = ctx;
    if (j->x8) kern_matmul_q8k(j->k, j->w, j->x8, j->T, j->y, j->w->n_out, i0, i1);
    else if (j->xb) kern_matmul_xbf16(j->k, j->w, j->xb, j->T, j->y, j->w->n_out, i0, i1);
    else kern_matmul(j->k, j->w, j->x, j->T, j->y, j->w->n_out, i0, i1);
}

typedef struct {
    const dsf_kernels *k;
    const uint8_t *p;
    uint64_t n;
    double sums[64];
} probe_job;

static void probe_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    probe_job *j = ctx;
    /* 1 index = 1 MiB */
    uint64_t a = (uint64_t)i0 << 20, b = (uint64_t)i1 << 20;
    if (b > j->n) b = j->n;
    j->sums[tid & 63] += kern_read_probe(j->k, j->p + a, b - a);
}

typedef struct {
    const dsf_kernels *k;
    int bf16;
    int64_t iters;
    uint64_t flops[64];
    float sink[64];
} peak_job;

static void peak_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    peak_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->flops[tid & 63] += kern_peak_probe(j->k, j->iters, j->bf16, &j->sink[tid & 63]);
}

/* Before each timed probe: a short untimed job on every thread of the probe pool (~1 ms of
 * FMAs), because a probe timed from a sleeping pool reads low and makes the fractions read
 * high (docs/perf-log.md, Method). */
static void probe_warm(dsf_pool *pool, const dsf_kernels *k) {
    peak_job j = {.k = k, .bf16 = 0, .iters = 500000};
    dsf_parallel_for(pool, dsf_pool_size(pool), 1, peak_chunk, &j);
}

/* One pass of the read probe over the arena; returns GB/s (1e9 bytes/s). The threads claim
 * 1 MiB pieces guided, as the decode's matmuls claim their rows, so that a core that reads
 * faster than the other does more of the arena and the probe measures what the two cores
 * read together (static halves read low: docs/perf-log.md, Method, "Correction of
 * 2026-12-01"). */
static double probe_read(dsf_pool *pool, const dsf_kernels *k, const uint8_t *arena, uint64_t n) {
    probe_job j = {.k = k, .p = arena, .n = n};
    probe_warm(pool, k);
    double t0 = dsf_now();
    dsf_parallel_for_guided(pool, (int64_t)(n >> 20), 1, probe_chunk, &j);
    double dt = dsf_now() - t0;
    return (double)n / dt / 1e9;
}

/* Returns GFLOP/s of the dot peak (0 if the table has no such instruction): ~3 ms per thread
 * on a warm pool. */
static double probe_peak(dsf_pool *pool, const dsf_kernels *k, int bf16) {
    peak_job j = {.k = k, .bf16 = bf16, .iters = 1600000};
    int n = dsf_pool_size(pool);
    probe_warm(pool, k);
    double t0 = dsf_now();
    dsf_parallel_for(pool, n, 1, peak_chunk, &j);
    double dt = dsf_now() - t0;
    uint64_t f = 0;
    for (int i = 0; i < 64; i++) f += j.flops[i];
    return (double)f / dt / 1e9;
}

/* The largest of 3 consecutive dot-peak probes. A 3 ms probe can be disturbed as a whole
 * (measured: both single probes around one prefill read 645 GFLOP/s where the others read
 * 810-840, and that prefill's fraction read 0.615 against 0.46-0.51), and a disturbed probe
 * can only read low. */
static double probe_peak_max(dsf_pool *pool, const dsf_kernels *k, int bf16) {
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double g = probe_peak(pool, k, bf16);
        if (g > best) best = g;
    }
    return best;
}

double bench_bf16_peak(dsf_pool *pool, const dsf_kernels *k) { return probe_peak_max(pool, k, 1); }

typedef struct {
    const char *label;
    uint32_t type;
    int64_t n_in, n_out, T;
    int xbf16; /* 1: BF16 activations (reference-mode prefill path); 2: Q8_K (--act-q8k) */
} bench_case;

/* The probe / weight arena: anonymous memory in 2 MiB pages where the kernel grants them
 * (MADV_HUGEPAGE before the first touch), so that the read probe measures the memory system
 * and not TLB misses; the model's own mapping gets the same advice (engine.c). Released with
 * arena_free. */
#define ARENA_ALIGN ((size_t)2 << 20)
static uint8_t *arena_alloc(uint64_t n) {
    size_t len = (size_t)n + ARENA_ALIGN;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + sizeof(size_t) * 2 + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1));
#ifdef MADV_HUGEPAGE
    madvise(p, (size_t)n, MADV_HUGEPAGE);
#endif
    size_t hdr[2] = {(size_t)(p - m), len};
    memcpy(p - sizeof hdr, hdr, sizeof hdr);
    return p;
}

static void arena_free(uint8_t *p) {
    if (!p) return;
    size_t hdr[2];
    memcpy(hdr, p - sizeof hdr, sizeof hdr);
    munmap(p - hdr[0], hdr[1]);
}

static double median3(double a, double b, double c) {
    if (a > b) { double t = a; a = b; b = t; }
    if (b > c) { double t = b; b = c; c = t; }
    return a > b ? a : b;
}

static void fill_random(uint8_t *p, uint64_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        memcpy(p + i, &s, 8);
    }
}

/* Makes the random bytes decode to finite, sane numbers for the type (so that no kernel runs
 * on NaN/Inf or subnormal patterns, which some CPUs handle through slow paths). */
static void sanitize(uint8_t *p, uint64_t n, uint32_t type) {
    if (type == GGML_TYPE_BF16) {
        for (uint64_t i = 0; i + 2 <= n; i += 2) p[i + 1] = (uint8_t)((p[i + 1] & 0x80) | 0x3C | (p[i + 1] & 1));
    } else if (type == GGML_TYPE_F16) {
        for (uint64_t i = 0; i + 2 <= n; i += 2) p[i + 1] = (uint8_t)((p[i + 1] & 0x83) | 0x30);
    } else if (type == GGML_TYPE_F32) {
        for (uint64_t i = 0; i + 4 <= n; i += 4) p[i + 3] = (uint8_t)((p[i + 3] & 0x80) | 0x3E);
    } else if (type == DSF_TYPE_FP8B32) { /* no NaN code (0x7F, 0xFF): those take the exact path */
        for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)((p[i] & 0x7F) == 0x7F ? p[i] ^ 1 : p[i]);
    }
    /* Q8_0 scales: f16 bytes at the start of each 34-byte block; MXFP4 scale bytes: any
     * value decodes finitely except e >= ~250 with big codes; both are handled per matrix. */
}

/* An FP8_B32 matrix's scale grid (the bytes from its rows' end): a checkpoint's spread of
 * scales, 2^-11 .. 2^0. */
static void sanitize_grid(uint8_t *grid, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) grid[i] = (uint8_t)(116 + grid[i] % 12);
}

static void sanitize_blocks(uint8_t *p, uint64_t n, uint32_t type) {
    if (type == GGML_TYPE_Q8_0)
        for (uint64_t i = 0; i + 34 <= n; i += 34) p[i + 1] = (uint8_t)((p[i + 1] & 0x83) | 0x20);
    else if (type == GGML_TYPE_MXFP4)
        for (uint64_t i = 0; i + 17 <= n; i += 17) p[i] = (uint8_t)(120 + p[i] % 16);
    else if (type == GGML_TYPE_IQ2_XXS || type == GGML_TYPE_IQ2_XS || type == GGML_TYPE_IQ2_S || type == GGML_TYPE_IQ4_XS)
        for (uint64_t i = 0, bs = ggml_type_size(type); i + bs <= n; i += bs) /* the f16 d at offset 0 */
            p[i + 1] = (uint8_t)((p[i + 1] & 0x83) | 0x20);
    else if (type >= GGML_TYPE_Q2_K && type <= GGML_TYPE_Q6_K) {
        /* the f16 d (and dmin) of each super-block: finite, moderate (high byte 0x20..0x23) */
        static const int bb[] = {84, 110, 144, 176, 210}, o0[] = {80, 108, 0, 0, 208}, o1[] = {82, -1, 2, 2, -1};
        const int k = (int)type - GGML_TYPE_Q2_K;
        for (uint64_t i = 0; i + (uint64_t)bb[k] <= n; i += (uint64_t)bb[k]) {
            p[i + (uint64_t)o0[k] + 1] = (uint8_t)(0x20 | (p[i + (uint64_t)o0[k] + 1] & 3));
            if (o1[k] >= 0) p[i + (uint64_t)o1[k] + 1] = (uint8_t)(0x20 | (p[i + (uint64_t)o1[k] + 1] & 3));
        }
    }
    else if (type == GGML_TYPE_IQ3_XXS || type == GGML_TYPE_IQ3_S || type == GGML_TYPE_IQ1_S)
        for (uint64_t i = 0, bs = ggml_type_size(type); i + bs <= n; i += bs) p[i + 1] = (uint8_t)((p[i + 1] & 0x83) | 0x20);
    else if (type == GGML_TYPE_IQ1_M) /* the f16 d's high byte: the top nibbles of bytes 53 and 55 */
        for (uint64_t i = 0; i + 56 <= n; i += 56) {
            uint8_t h = (uint8_t)((((p[i + 53] >> 4) | (p[i + 55] & 0xF0)) & 0x83) | 0x20);
            p[i + 53] = (uint8_t)((p[i + 53] & 0x0F) | h << 4);
            p[i + 55] = (uint8_t)((p[i + 55] & 0x0F) | (h & 0xF0));
        }
}

/* The CPU as /proc/cpuinfo names it (model name, family and model): the host these machines
 * land on changes (docs/PERFORMANCE.md), and the figures mean different things on each. */
static const char *cpu_name(void) {
    static char buf[160] = "unknown";
    char line[256], name[96] = "", fam[16] = "", mod[16] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return buf;
    while (fgets(line, sizeof line, f) && line[0] != '\n') {
        char *v = strchr(line, ':');
        if (!v) continue;
        v += v[1] == ' ' ? 2 : 1;
        v[strcspn(v, "\r\n")] = 0;
        if (!strncmp(line, "model name", 10)) snprintf(name, sizeof name, "%s", v);
        else if (!strncmp(line, "cpu family", 10)) snprintf(fam, sizeof fam, "%s", v);
        else if (!strncmp(line, "model\t", 6)) snprintf(mod, sizeof mod, "%s", v);
    }
    fclose(f);
    if (name[0]) snprintf(buf, sizeof buf, "%s (family %s, model %s)", name, fam[0] ? fam : "?", mod[0] ? mod : "?");
    return buf;
}

/* One core's decode rate with the weights in L2, against what one core reads from memory in the
 * same run: whether the T = 1 kernel could keep up with a core's memory stream (ratio > 1) or is
 * compute-bound (< 1; ggml's MXFP4 GEMV is, at ~17 GB/s per core here). Single thread (the
 * caller), a 384 KiB matrix run ~10 ms per pass, each pass between 1-thread read probes of a
 * third of the arena (in turn); the median of 9 passes. Returns the MXFP4R ratio (the engine's expert layout). */
static double core_decode_rate(const dsf_kernels *k, const uint8_t *arena, uint64_t arena_n, const uint16_t *xb,
                               const dsf_q8k *x8, double need_per_core) {
    static const struct {
        const char *label;
        uint32_t type;
        int q8k; /* Q8_K activations (--act-q8k) instead of BF16 */
    } cc[] = {{"mxfp4r gemv xbf16", DSF_TYPE_MXFP4R, 0}, {"mxfp4 gemv xbf16", GGML_TYPE_MXFP4, 0},
              {"bf16 gemv xbf16", GGML_TYPE_BF16, 0},     {"q4_k gemv xbf16", GGML_TYPE_Q4_K, 0},
              {"q4_k gemv q8k", GGML_TYPE_Q4_K, 1},       {"q2_k gemv xbf16", GGML_TYPE_Q2_K, 0},
              {"q2_k gemv q8k", GGML_TYPE_Q2_K, 1},       {"iq4_xs gemv xbf16", GGML_TYPE_IQ4_XS, 0},
              {"iq4_xs gemv q8k", GGML_TYPE_IQ4_XS, 1},   {"iq2_xxs gemv xbf16", GGML_TYPE_IQ2_XXS, 0},
              {"iq2_xxs gemv q8k", GGML_TYPE_IQ2_XXS, 1}, {"fp8 gemv xbf16", DSF_TYPE_FP8B32, 0}};
    const int64_t n_in = 5120;
    const uint64_t probe_n = arena_n / 3 / 4096 * 4096, mat_cap = (uint64_t)384 << 10;
    uint8_t *m = dsf_aligned_alloc(mat_cap + 4096);
    float *y = dsf_aligned_alloc(4096 * sizeof(float));
    if (!m || !y) {
        free(m);
        free(y);
        return 0;
    }
    double ratio_mxr = 0;
    printf("one core, weights in L2 (compute rate), against one core's read bandwidth from memory;\n"
           "0.85 of the all-thread read probe, per thread: %.2f GB/s\n", need_per_core);
    for (unsigned c = 0; c < sizeof cc / sizeof *cc; c++) {
        const int rp = cc[c].type == DSF_TYPE_MXFP4R;
        uint64_t row_bytes = rp ? mxfp4r_row_bytes(n_in) : (uint64_t)n_in / ggml_blck_size(cc[c].type) * ggml_type_size(cc[c].type);
        uint64_t rb = rp ? row_bytes + row_bytes / 16 : row_bytes + (cc[c].type == DSF_TYPE_FP8B32 ? (uint64_t)n_in / 32 : 0);
        int64_t rows = (int64_t)(mat_cap / rb) / 32 * 32; /* whole row blocks of an FP8_B32 grid */
        uint64_t mat_bytes = rb * (uint64_t)rows;
        fill_random(m, mat_bytes, 0xC0DEull + c);
        if (rp)
            for (uint64_t i = row_bytes * (uint64_t)rows; i < mat_bytes; i++) m[i] = (uint8_t)(120 + m[i] % 16);
        else {
            sanitize(m, mat_bytes, cc[c].type);
            sanitize_blocks(m, mat_bytes, cc[c].type);
        }
        if (cc[c].type == DSF_TYPE_FP8B32) sanitize_grid(m + row_bytes * (uint64_t)rows, mat_bytes - row_bytes * (uint64_t)rows);
        dsf_wmat w = {.type = cc[c].type, .n_in = n_in, .n_out = rows, .row_bytes = row_bytes, .data = m};
        if (rp || cc[c].type == DSF_TYPE_FP8B32) w.scales = m + row_bytes * (uint64_t)rows;
        if (cc[c].q8k) kern_matmul_q8k(k, &w, x8, 1, y, rows, 0, rows); /* into L2 */
        else kern_matmul_xbf16(k, &w, xb, 1, y, rows, 0, rows);
        double fr[9], g[9], pr[9];
        double t0 = dsf_now();
        kern_read_probe(k, arena, probe_n);
        double p_prev = (double)probe_n / (dsf_now() - t0) / 1e9;
        for (int r = 0; r < 9; r++) {
            int reps = 0;
            t0 = dsf_now();
            double dt;
            do {
                if (cc[c].q8k) kern_matmul_q8k(k, &w, x8, 1, y, rows, 0, rows);
                else kern_matmul_xbf16(k, &w, xb, 1, y, rows, 0, rows);
                reps++;
            } while ((dt = dsf_now() - t0) < 0.01);
            double t1 = dsf_now();
            kern_read_probe(k, arena + (uint64_t)((r + 1) % 3) * probe_n, probe_n);
            double p_next = (double)probe_n / (dsf_now() - t1) / 1e9;
            g[r] = (double)mat_bytes * reps / dt / 1e9;
            pr[r] = 0.5 * (p_prev + p_next);
            fr[r] = g[r] / pr[r];
            p_prev = p_next;
        }
        int idx[9];
        for (int r = 0; r < 9; r++) idx[r] = r;
        for (int i = 0; i < 9; i++)
            for (int j = i + 1; j < 9; j++)
                if (fr[idx[j]] < fr[idx[i]]) { int tmp = idx[i]; idx[i] = idx[j]; idx[j] = tmp; }
        const int med = idx[4];
        printf("  %-20s %5d %9.2f GB/s per core; one core reads %.2f GB/s -> %.2fx; %.2fx the 0.85 share\n",
               cc[c].label, (int)rows, g[med], pr[med], fr[med], need_per_core > 0 ? g[med] / need_per_core : 0);
        if (rp) ratio_mxr = fr[med];
    }
    free(m);
    free(y);
    return ratio_mxr;
}

/* The bytes of one matrix of the case (codes and scales of a repacked one, codes and grid of an
 * FP8_B32 one); *row_bytes: a row's codes. */
static uint64_t case_bytes(const bench_case *bc, uint64_t *row_bytes) {
    const int rp = bc->type == DSF_TYPE_MXFP4R;
    *row_bytes = rp ? mxfp4r_row_bytes(bc->n_in) : (uint64_t)bc->n_in / ggml_blck_size(bc->type) * ggml_type_size(bc->type);
    return (rp ? *row_bytes + *row_bytes / 16 : *row_bytes) * (uint64_t)bc->n_out +
           dsf_type_extra_bytes(bc->type, (uint64_t)bc->n_in, (uint64_t)bc->n_out);
}

/* The FP8_B32 cases against the BF16 case before each (the same shape, T and family): their
 * fractions (of the read probe for T = 1, of the dot peak for T > 1) and weights/s of fp8 over
 * bf16 (their GFLOP/s). *frac / *over: the means over the decode pairs (the summary keys). */
static void fp8_pairs(const bench_case *cases, int n_cases, const double *fr, const double *gf, double *frac,
                      double *over) {
    int n = 0;
    printf("fp8 (FP8_B32) against bf16, same shape, T and family:\n%-20s %5s %16s %9s %9s %12s\n", "kernel", "T", "shape",
           "bf16", "fp8", "fp8/bf16 w/s");
    for (int c = 1; c < n_cases; c++) {
        const bench_case *a = &cases[c - 1], *b = &cases[c];
        if (b->type != DSF_TYPE_FP8B32 || a->type != GGML_TYPE_BF16 || a->n_in != b->n_in || a->n_out != b->n_out ||
            a->T != b->T || a->xbf16 != b->xbf16 || !(gf[c] > 0 && gf[c - 1] > 0)) /* both run (--only) */
            continue;
        char shape[48];
        snprintf(shape, sizeof shape, "[%lldx%lld]", (long long)b->n_out, (long long)b->n_in);
        const double ratio = gf[c - 1] > 0 ? gf[c] / gf[c - 1] : 0;
        printf("%-20s %5lld %16s %8.1f%% %8.1f%% %11.2fx\n", b->label, (long long)b->T, shape, 100.0 * fr[c - 1],
               100.0 * fr[c], ratio);
        if (b->T == 1) {
            *frac += fr[c];
            *over += ratio;
            n++;
        }
    }
    if (n) *frac /= n, *over /= n;
}

/* Whether a case runs under --only LIST (comma-separated substrings of its label; NULL: all). */
static int case_selected(const char *label, const char *only) {
    if (!only) return 1;
    for (const char *p = only; *p;) {
        size_t n = strcspn(p, ",");
        char part[64];
        snprintf(part, sizeof part, "%.*s", (int)(n < sizeof part - 1 ? n : sizeof part - 1), p);
        if (n && strstr(label, part)) return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

static int bench_kernels(int n_threads, const char *set, uint64_t arena_mb, int reps, const char *only) {
    const dsf_kernels *k = set ? kernels_by_name(set) : kernels_get();
    if (!k) {
        fprintf(stderr, "dsflash bench: kernel set '%s' is unknown or not supported by this CPU\n", set);
        return 1;
    }
    uint64_t arena_n = arena_mb << 20;
    uint8_t *arena = arena_alloc(arena_n + 4096);
    if (!arena) {
        fprintf(stderr, "dsflash bench: cannot allocate %llu MiB\n", (unsigned long long)arena_mb);
        return 1;
    }
    fill_random(arena, arena_n + 4096, 0x5EEDF00Dull);
    dsf_pool *pool = dsf_pool_new(n_threads);

    static const bench_case cases[] = {
        {"mxfp4 expert gemv", GGML_TYPE_MXFP4, 5120, 2304, 1, 0},  /* ffn_gate/up_exps slice */
        {"mxfp4 expert down", GGML_TYPE_MXFP4, 2304, 5120, 1, 0},  /* ffn_down_exps slice */
        {"mxfp4 gemv xbf16", GGML_TYPE_MXFP4, 5120, 2304, 1, 1},  /* the same, reference mode */
        {"mxfp4 down xbf16", GGML_TYPE_MXFP4, 2304, 5120, 1, 1},
        {"mxfp4r gemv xbf16", DSF_TYPE_MXFP4R, 5120, 2304, 1, 1}, /* repacked at load (engine.c) */
        {"mxfp4r down xbf16", DSF_TYPE_MXFP4R, 2304, 5120, 1, 1},
        {"bf16 gemv", GGML_TYPE_BF16, 5120, 8192, 1, 0},           /* dense projections */
        {"bf16 gemv xbf16", GGML_TYPE_BF16, 5120, 8192, 1, 1},
        {"bf16 gemv lmhead", GGML_TYPE_BF16, 5120, 16384, 1, 0},
        {"q8_0 gemv", GGML_TYPE_Q8_0, 5120, 8192, 1, 0},
        {"f16 gemv", GGML_TYPE_F16, 5120, 8192, 1, 0},
        {"f32 gemv", GGML_TYPE_F32, 5120, 4096, 1, 0},
        {"bf16 gemm T=64", GGML_TYPE_BF16, 5120, 4096, 64, 0},  /* prefill, fp32 activations */
        {"mxfp4 gemm T=64", GGML_TYPE_MXFP4, 5120, 2304, 64, 0},
        {"bf16 gemm T=4", GGML_TYPE_BF16, 5120, 4096, 4, 0},
        {"bf16 gemm xbf16", GGML_TYPE_BF16, 5120, 4096, 64, 1}, /* prefill, BF16 activations */
        {"mxfp4 gemm xbf16", GGML_TYPE_MXFP4, 5120, 2304, 64, 1},
        {"mxfp4r gemm xbf16", DSF_TYPE_MXFP4R, 5120, 2304, 64, 1},
        {"q8_0 gemm xbf16", GGML_TYPE_Q8_0, 5120, 4096, 64, 1}, /* widened to the fp32 tile */
        {"bf16 gemm xbf16 256", GGML_TYPE_BF16, 5120, 4096, 256, 1},
        /* IQ2_XXS, IQ4_XS, IQ2_XS, IQ2_S (iq2_avx512.c): gate/up slice, down slice, dense; both families */
        {"iq2_xxs gemv xbf16", GGML_TYPE_IQ2_XXS, 5120, 2304, 1, 1},
        {"iq2_xxs down xbf16", GGML_TYPE_IQ2_XXS, 2304, 5120, 1, 1},
        {"iq2_xxs dense xbf16", GGML_TYPE_IQ2_XXS, 4096, 4096, 1, 1},
        {"iq2_xxs gemv", GGML_TYPE_IQ2_XXS, 5120, 2304, 1, 0},
        {"iq2_xxs down", GGML_TYPE_IQ2_XXS, 2304, 5120, 1, 0},
        {"iq2_xxs dense", GGML_TYPE_IQ2_XXS, 4096, 4096, 1, 0},
        {"iq2_xxs gemm xbf16", GGML_TYPE_IQ2_XXS, 5120, 2304, 64, 1},
        {"iq4_xs gemv xbf16", GGML_TYPE_IQ4_XS, 5120, 2304, 1, 1},
        {"iq4_xs down xbf16", GGML_TYPE_IQ4_XS, 2304, 5120, 1, 1},
        {"iq4_xs dense xbf16", GGML_TYPE_IQ4_XS, 4096, 4096, 1, 1},
        {"iq4_xs gemv", GGML_TYPE_IQ4_XS, 5120, 2304, 1, 0},
        {"iq4_xs down", GGML_TYPE_IQ4_XS, 2304, 5120, 1, 0},
        {"iq4_xs dense", GGML_TYPE_IQ4_XS, 4096, 4096, 1, 0},
        {"iq4_xs gemm xbf16", GGML_TYPE_IQ4_XS, 5120, 2304, 64, 1},
        {"iq2_xs gemv xbf16", GGML_TYPE_IQ2_XS, 5120, 2304, 1, 1},
        {"iq2_xs down xbf16", GGML_TYPE_IQ2_XS, 2304, 5120, 1, 1},
        {"iq2_xs dense xbf16", GGML_TYPE_IQ2_XS, 4096, 4096, 1, 1},
        {"iq2_xs gemv", GGML_TYPE_IQ2_XS, 5120, 2304, 1, 0},
        {"iq2_xs down", GGML_TYPE_IQ2_XS, 2304, 5120, 1, 0},
        {"iq2_xs dense", GGML_TYPE_IQ2_XS, 4096, 4096, 1, 0},
        {"iq2_xs gemm xbf16", GGML_TYPE_IQ2_XS, 5120, 2304, 64, 1},
        {"iq2_s gemv xbf16", GGML_TYPE_IQ2_S, 5120, 2304, 1, 1},
        {"iq2_s down xbf16", GGML_TYPE_IQ2_S, 2304, 5120, 1, 1},
        {"iq2_s dense xbf16", GGML_TYPE_IQ2_S, 4096, 4096, 1, 1},
        {"iq2_s gemv", GGML_TYPE_IQ2_S, 5120, 2304, 1, 0},
        {"iq2_s down", GGML_TYPE_IQ2_S, 2304, 5120, 1, 0},
        {"iq2_s dense", GGML_TYPE_IQ2_S, 4096, 4096, 1, 0},
        {"iq2_s gemm xbf16", GGML_TYPE_IQ2_S, 5120, 2304, 64, 1},
        /* the IQ types with Q8_K activations (q8k_iq_*.c; --act-q8k) */
        {"iq2_xxs gemv q8k", GGML_TYPE_IQ2_XXS, 5120, 2304, 1, 2}, {"iq2_xxs down q8k", GGML_TYPE_IQ2_XXS, 2304, 5120, 1, 2},
        {"iq2_xxs dense q8k", GGML_TYPE_IQ2_XXS, 4096, 4096, 1, 2}, {"iq2_xxs gemm q8k", GGML_TYPE_IQ2_XXS, 5120, 2304, 64, 2},
        {"iq4_xs gemv q8k", GGML_TYPE_IQ4_XS, 5120, 2304, 1, 2}, {"iq4_xs down q8k", GGML_TYPE_IQ4_XS, 2304, 5120, 1, 2},
        {"iq4_xs dense q8k", GGML_TYPE_IQ4_XS, 4096, 4096, 1, 2}, {"iq4_xs gemm q8k", GGML_TYPE_IQ4_XS, 5120, 2304, 64, 2},
        {"iq2_xs gemv q8k", GGML_TYPE_IQ2_XS, 5120, 2304, 1, 2}, {"iq2_s gemv q8k", GGML_TYPE_IQ2_S, 5120, 2304, 1, 2},
        {"iq3_xxs gemv q8k", GGML_TYPE_IQ3_XXS, 5120, 2304, 1, 2}, {"iq3_s gemv q8k", GGML_TYPE_IQ3_S, 5120, 2304, 1, 2},
        {"iq1_s gemv q8k", GGML_TYPE_IQ1_S, 5120, 2304, 1, 2}, {"iq1_m gemv q8k", GGML_TYPE_IQ1_M, 5120, 2304, 1, 2},
        /* the K-quants (kquant_*.c): expert gate/up slice, down slice, a dense 4096 x 4096, both
         * families; a prefill tile row in reference mode */
#define KQ_CASES(N, T)                                                                                 \
    {N " gemv", T, 5120, 2304, 1, 0}, {N " down", T, 2304, 5120, 1, 0}, {N " dense", T, 4096, 4096, 1, 0}, \
        {N " gemv xbf16", T, 5120, 2304, 1, 1}, {N " down xbf16", T, 2304, 5120, 1, 1},                  \
        {N " dense xbf16", T, 4096, 4096, 1, 1}, {N " gemm xbf16", T, 5120, 2304, 64, 1},                 \
        {N " gemv q8k", T, 5120, 2304, 1, 2}, {N " down q8k", T, 2304, 5120, 1, 2},                      \
        {N " dense q8k", T, 4096, 4096, 1, 2}, {N " gemm q8k", T, 5120, 2304, 64, 2}
        KQ_CASES("q4_k", GGML_TYPE_Q4_K), KQ_CASES("q2_k", GGML_TYPE_Q2_K), KQ_CASES("q6_k", GGML_TYPE_Q6_K),
        KQ_CASES("q5_k", GGML_TYPE_Q5_K), KQ_CASES("q3_k", GGML_TYPE_Q3_K),
#undef KQ_CASES
        {"iq3_xxs expert gemv", GGML_TYPE_IQ3_XXS, 5120, 2304, 1, 0}, /* the grid types (iq13_*.c) */
        {"iq3_xxs gemv xbf16", GGML_TYPE_IQ3_XXS, 5120, 2304, 1, 1},
        {"iq3_xxs gemm xbf16", GGML_TYPE_IQ3_XXS, 5120, 2304, 64, 1},
        {"iq3_s expert gemv", GGML_TYPE_IQ3_S, 5120, 2304, 1, 0},
        {"iq3_s gemv xbf16", GGML_TYPE_IQ3_S, 5120, 2304, 1, 1},
        {"iq3_s gemm xbf16", GGML_TYPE_IQ3_S, 5120, 2304, 64, 1},
        {"iq1_s expert gemv", GGML_TYPE_IQ1_S, 5120, 2304, 1, 0},
        {"iq1_s gemv xbf16", GGML_TYPE_IQ1_S, 5120, 2304, 1, 1},
        {"iq1_s gemm xbf16", GGML_TYPE_IQ1_S, 5120, 2304, 64, 1},
        {"iq1_m expert gemv", GGML_TYPE_IQ1_M, 5120, 2304, 1, 0},
        {"iq1_m gemv xbf16", GGML_TYPE_IQ1_M, 5120, 2304, 1, 1},
        {"iq1_m gemm xbf16", GGML_TYPE_IQ1_M, 5120, 2304, 64, 1},
        /* the native FP8_B32 dense weights (fp8.h) next to BF16 at the model's shapes, in pairs
         * (bf16 then fp8: the pair's line at the end): wq_b, wq_a, wo_b, the shared expert's w1;
         * decode in both families, prefill tiles in reference mode (BF16 activations) and plain */
#define FP8_PAIR(N, I, O, T, X) {"bf16 " N, GGML_TYPE_BF16, I, O, T, X}, {"fp8 " N, DSF_TYPE_FP8B32, I, O, T, X}
        FP8_PAIR("wq_b gemv", 1280, 32768, 1, 0), FP8_PAIR("wq_b gemv xbf16", 1280, 32768, 1, 1),
        FP8_PAIR("wq_a gemv", 5120, 1280, 1, 0), FP8_PAIR("wq_a gemv xbf16", 5120, 1280, 1, 1),
        FP8_PAIR("wo_b gemv", 8192, 5120, 1, 0), FP8_PAIR("wo_b gemv xbf16", 8192, 5120, 1, 1),
        FP8_PAIR("w1 gemv", 5120, 2304, 1, 0), FP8_PAIR("w1 gemv xbf16", 5120, 2304, 1, 1),
        FP8_PAIR("w1 gemm xbf16", 5120, 2304, 16, 1), FP8_PAIR("w1 gemm xbf16", 5120, 2304, 64, 1),
        FP8_PAIR("w1 gemm xbf16", 5120, 2304, 128, 1), FP8_PAIR("w1 gemm", 5120, 2304, 16, 0),
        FP8_PAIR("w1 gemm", 5120, 2304, 64, 0), FP8_PAIR("wo_b gemm xbf16", 8192, 5120, 64, 1),
#undef FP8_PAIR
    };
    const int n_cases = (int)(sizeof cases / sizeof *cases);
    for (int c = 0; c < n_cases; c++) {
        uint64_t rb, mb = case_bytes(&cases[c], &rb);
        if (mb > arena_n) {
            fprintf(stderr, "dsflash bench: case '%s' reads a %.0f MiB matrix, more than --arena-mb %llu holds\n",
                    cases[c].label, (double)mb / (1 << 20), (unsigned long long)arena_mb);
            dsf_pool_free(pool);
            arena_free(arena);
            return 1;
        }
    }

    float *x = dsf_aligned_alloc(256 * 16384 * sizeof(float));
    float *y = dsf_aligned_alloc(256 * 16384 * sizeof(float));
    uint16_t *xb = dsf_aligned_alloc(256 * 16384 * sizeof(uint16_t));
    dsf_q8k *x8 = dsf_aligned_alloc(256 * 64 * sizeof(dsf_q8k));
    if (!x || !y || !xb || !x8) {
        fprintf(stderr, "dsflash bench: out of memory\n");
        return 1;
    }
    for (int i = 0; i < 256 * 16384; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    kern_act_to_bf16(x, xb, 256 * 16384);
    quantize_row_q8k(x, 256 * 16384, x8);

    printf("dsflash bench --kernels: kernels %s, threads %d, arena %llu MiB, commit %s\n  cpu %s\n", k->name,
           dsf_pool_size(pool), (unsigned long long)arena_mb, dsf_build_commit, cpu_name());
    double bf16_peak = median3(probe_peak(pool, k, 1), probe_peak(pool, k, 1), probe_peak(pool, k, 1));
    double fma_peak = median3(probe_peak(pool, k, 0), probe_peak(pool, k, 0), probe_peak(pool, k, 0));
    probe_read(pool, k, arena, arena_n); /* warm-up: fault the pages in */
    printf("dot peak: bf16 %.1f GFLOP/s, fp32 fma %.1f GFLOP/s\n", bf16_peak, fma_peak);
    printf("%-20s %5s %16s %9s %9s %9s %8s\n", "kernel", "T", "shape", "GB/s", "GFLOP/s", "probe", "ratio");

    /* Decode kernels (T = 1) are paired with read probes, prefill kernels (T > 1) with dot-peak
     * probes: kernel, probe, kernel, probe...; each pass is compared with the mean of the probes
     * run just before and just after it, and the pass with the median ratio is reported. */
    double bw_sum = 0, frac_mx = 0, frac_mxr = 0, frac_bf = 0, pf_bf = 0, pf_xbf = 0, pf_mx = 0;
    int n_bw = 0;
    double *c_fr = calloc((size_t)n_cases, sizeof *c_fr), *c_gf = calloc((size_t)n_cases, sizeof *c_gf);
    for (int c = 0; c < n_cases; c++) {
        const bench_case *bc = &cases[c];
        const int decode = bc->T == 1;
        if (!case_selected(bc->label, only)) continue;
        /* a repacked matrix: its codes, then its scales (kernels/mxfp4r.h) */
        const int rp = bc->type == DSF_TYPE_MXFP4R;
        uint64_t row_bytes, mat_bytes = case_bytes(bc, &row_bytes);
        int64_t n_mat = (int64_t)(arena_n / mat_bytes); /* >= 1: checked above */
        if (!rp) sanitize(arena, arena_n, bc->type);
        for (int64_t m = 0; m < n_mat; m++) {
            uint8_t *mp = arena + (uint64_t)m * mat_bytes;
            if (bc->type == DSF_TYPE_FP8B32) sanitize_grid(mp + row_bytes * (uint64_t)bc->n_out, mat_bytes - row_bytes * (uint64_t)bc->n_out);
            else if (!rp) sanitize_blocks(mp, mat_bytes, bc->type);
            else
                for (uint64_t i = row_bytes * (uint64_t)bc->n_out; i < mat_bytes; i++) mp[i] = (uint8_t)(120 + mp[i] % 16);
        }
        /* decode passes read every matrix of the arena once; prefill runs one matrix (compute-bound) */
        int64_t use = decode ? n_mat : 1;
        double gbs[16], gflops[16], ref[16], fr[16];
        int nr = reps < 16 ? reps : 16;
        const int pk_bf16 = bf16_peak > 0;
        double p_prev = decode ? probe_read(pool, k, arena, arena_n) : probe_peak(pool, k, pk_bf16);
        for (int r = 0; r < nr; r++) {
            double t0 = dsf_now();
            for (int64_t m = 0; m < use; m++) {
                dsf_wmat w = {.type = bc->type, .n_in = bc->n_in, .n_out = bc->n_out, .row_bytes = row_bytes,
                              .data = arena + (uint64_t)m * mat_bytes};
                if (rp || bc->type == DSF_TYPE_FP8B32) w.scales = w.data + row_bytes * (uint64_t)bc->n_out;
                mm_job j = {.k = k, .w = &w, .x = x, .xb = bc->xbf16 == 1 ? xb : NULL, .x8 = bc->xbf16 == 2 ? x8 : NULL,
                            .T = bc->T, .y = y};
                dsf_parallel_for(pool, bc->n_out, 16, mm_chunk, &j);
            }
            double dt = dsf_now() - t0;
            double p_next = decode ? probe_read(pool, k, arena, arena_n) : probe_peak(pool, k, pk_bf16);
            gbs[r] = (double)mat_bytes * (double)use / dt / 1e9;
            gflops[r] = 2.0 * (double)bc->n_in * (double)bc->n_out * (double)bc->T * (double)use / dt / 1e9;
            ref[r] = 0.5 * (p_prev + p_next);
            p_prev = p_next;
            fr[r] = (decode ? gbs[r] : gflops[r]) / ref[r];
        }
        int idx[16] = {0};
        for (int r = 0; r < nr; r++) idx[r] = r;
        for (int i = 0; i < nr; i++)
            for (int j = i + 1; j < nr; j++)
                if (fr[idx[j]] < fr[idx[i]]) { int tmp = idx[i]; idx[i] = idx[j]; idx[j] = tmp; }
        int med = idx[nr / 2];
        char shape[48];
        snprintf(shape, sizeof shape, "%lldx[%lldx%lld]", (long long)use, (long long)bc->n_out, (long long)bc->n_in);
        printf("%-20s %5lld %16s %9.2f %9.1f %9.1f %7.1f%%  %s\n", bc->label, (long long)bc->T, shape, gbs[med],
               gflops[med], ref[med], 100.0 * fr[med], decode ? "of read bw" : pk_bf16 ? "of bf16 peak" : "of fma peak");
        if (decode) {
            bw_sum += ref[med];
            n_bw++;
        }
        /* the summary keys, by case label (the reference-mode kernels for the decode keys) */
        if (!strcmp(bc->label, "mxfp4 gemv xbf16")) frac_mx = fr[med];
        if (!strcmp(bc->label, "mxfp4r gemv xbf16")) frac_mxr = fr[med];
        if (!strcmp(bc->label, "bf16 gemv xbf16")) frac_bf = fr[med];
        if (!strcmp(bc->label, "bf16 gemm T=64")) pf_bf = fr[med];
        if (!strcmp(bc->label, "bf16 gemm xbf16")) pf_xbf = fr[med];
        if (!strcmp(bc->label, "mxfp4 gemm xbf16")) pf_mx = fr[med];
        if (c_fr && c_gf) c_fr[c] = fr[med], c_gf[c] = gflops[med];
        fflush(stdout);
    }
    double fp8_frac = 0, fp8_over_bf16 = 0;
    if (c_fr && c_gf) fp8_pairs(cases, n_cases, c_fr, c_gf, &fp8_frac, &fp8_over_bf16);
    free(c_fr);
    free(c_gf);
    double mxr_core = core_decode_rate(k, arena, arena_n, xb, x8, n_bw ? 0.85 * bw_sum / n_bw / dsf_pool_size(pool) : 0);
    printf("kernels=%s threads=%d read_bw=%.2f bf16_peak=%.1f fma_peak=%.1f mxfp4_bw_fraction=%.3f "
           "bf16_bw_fraction=%.3f bf16_gemm_peak_fraction=%.3f bf16_gemm_xbf16_peak_fraction=%.3f "
           "mxfp4_gemm_xbf16_peak_fraction=%.3f mxfp4r_bw_fraction=%.3f mxfp4r_core_vs_core_read=%.3f "
           "fp8_bw_fraction=%.3f fp8_over_bf16_weights=%.3f\n",
           k->name, dsf_pool_size(pool), n_bw ? bw_sum / n_bw : 0, bf16_peak, fma_peak, frac_mx, frac_bf, pf_bf,
           pf_xbf, pf_mx, frac_mxr, mxr_core, fp8_frac, fp8_over_bf16);
    dsf_pool_free(pool);
    arena_free(arena);
    free(x);
    free(y);
    free(xb);
    free(x8);
    return 0;
}

/* ================================================================ end to end (-m MODEL) */

static long rss_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) v = strtol(line + n, NULL, 10);
    fclose(f);
    return v;
}

/* Share of the model file's mapping that the kernel maps with 2 MiB pages (FilePmdMapped over
 * Rss in /proc/self/smaps); -1 if unknown. */
static double model_pmd_share(const char *path) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int in = 0;
    double rss = 0, pmd = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, ' ')) {
            const char *name = strrchr(line, '/');
            in = name && !strncmp(name + 1, base, strlen(base)) && name[1 + strlen(base)] == '\n';
            continue;
        }
        long v;
        if (in && sscanf(line, "Rss: %ld kB", &v) == 1) rss += (double)v;
        if (in && sscanf(line, "FilePmdMapped: %ld kB", &v) == 1) pmd += (double)v;
    }
    fclose(f);
    return rss > 0 ? pmd / rss : -1;
}

/* The tables read a row at a time at random (token embeddings, Engram table) are read with
 * pread, not through the mapping, so the warm-up eval does not bring them in: read them once
 * here (blocking only for what is not cached yet), so that no timed step waits on a cold row
 * from disk (on the bench model, a cold token row cost 1.4 ms of a ~100 ms step). */
static void warm_row_tables(const char *path, int cold) {
    static const char *const names[] = {"token_embd.weight", "per_layer_token_embd.weight"};
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open(path, err);
    uint8_t *buf = malloc((size_t)4 << 20);
    for (int i = 0; g && buf && i < (cold ? 1 : 2); i++) { /* --cold: the Engram table stays on the disk */
        const gguf_tensor *t = gguf_find_tensor(g, names[i]);
        for (uint64_t o = 0; t && o < t->nbytes; o += (uint64_t)4 << 20) {
            size_t n = t->nbytes - o < ((uint64_t)4 << 20) ? (size_t)(t->nbytes - o) : (size_t)4 << 20;
            if (!gguf_read_span(g, t->data + o, n, buf, n, true)) gguf_read_span(g, t->data + o, n, buf, n, false);
        }
    }
    free(buf);
    if (g) gguf_close(g);
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One `bench -m` run: its settings, what it holds, and what it measured. */
typedef struct {
    const char *path, *csv;
    int n_prompt, n_gen, n_threads, plain, act_q8k, cold;
    bench_engram eg; /* --cold: the Engram table, evicted before each decode step */
    dsf_engine *e;
    const dsf_kernels *k;
    dsf_pool *pool;
    uint8_t *arena;
    uint64_t arena_n;
    int n_vocab;
    float *logits;
    int32_t *toks;
    dsf_session *ss;
    double tok_bytes, tok_flops, head_flops;
    double *il_bytes, *il_flops;
    /* prefill */
    double t_prefill, prefill_tps, prefill_gflops, peak, pk0, pk1;
    /* decode */
    int block, n_blocks, steps;
    double decode_tps, step_bytes, frac, bw_med;
    long rss;
    bench_dist_phase dpre, ddec; /* an MPI job's traffic per phase (n = 0: single process) */
    bench_batch_result bat;      /* --batch (nseq = 0: not run) */
} bench_run;

/* Decode: blocks of steps, each bracketed by read probes. Returns 0, or 1 (said) on failure. */
static int bench_decode(bench_run *b) {
    const dsf_kernels *k = b->k;
    dsf_pool *pool = b->pool;
    dsf_session *ss = b->ss;
    char err[DSF_ERR_LEN] = "";
    /* one step per block: a step (~0.1-0.2 s) is shorter than the bandwidth modes last; an MPI
     * job's decode is one block, so that its wall time holds nothing but the steps */
    const bool job = dsf_dist_size() > 1;
    int block = job ? b->n_gen : 1;
    int n_blocks = b->n_gen / block;
    double *fr = malloc((size_t)(n_blocks + 1) * sizeof *fr), *bw = malloc((size_t)(n_blocks + 1) * sizeof *bw);
    double p_prev = probe_read(pool, k, b->arena, b->arena_n), t_dec = 0;
    int pos = b->n_prompt, steps = 0;
    dsf_sampler_params greedy;
    dsf_sampler_params_default(&greedy);
    greedy.temperature = 0.0f;
    uint64_t rng = dsf_rng_init(0);
    double dec_bytes = 0; /* weight bytes of all decode steps (a step's depend on its position) */
    if (b->e->eio) engram_io_reset_stats(b->e->eio);
    for (int bi = 0; bi < n_blocks; bi++) {
        double blk_bytes = 0;
        for (int j = 0; j < block; j++) blk_bytes += cost_decode_bytes(ss, pos + j, b->tok_bytes, b->il_bytes);
        dec_bytes += blk_bytes;
        if (b->cold && b->eg.on) bench_engram_evict(&b->eg); /* untimed: every step finds its rows on the disk */
        if (job) bench_dist_begin(b->e);
        double tb = dsf_now();
        for (int j = 0; j < block; j++) {
            /* the engine's greedy sampler: the step a user's greedy decode takes */
            int32_t best = dsf_sample_ws(b->logits, b->n_vocab, &greedy, &rng, NULL);
            if (best < 0) { /* every logit NaN or -inf: the model is broken, say so */
                fprintf(stderr, "dsflash bench: decode: step %d has no finite logit\n", steps);
                return 1;
            }
            b->toks[pos] = best;
            if (dsf_session_eval(ss, &b->toks[pos], 1, b->logits, false, err) < 0) {
                fprintf(stderr, "dsflash bench: decode: %s\n", err);
                return 1;
            }
            pos++;
            steps++;
        }
        double dt = dsf_now() - tb;
        t_dec += dt;
        if (job && bench_dist_end(b->e, &b->ddec, dt, block) < 0) return 1;
        double p_next = probe_read(pool, k, b->arena, b->arena_n);
        bw[bi] = 0.5 * (p_prev + p_next);
        fr[bi] = blk_bytes / dt / 1e9 / bw[bi];
        if (getenv("DSF_BENCH_VERBOSE"))
            fprintf(stderr, "block %d: %.2f GB/s of weights, probes %.2f / %.2f GB/s -> %.3f\n", bi,
                    blk_bytes / dt / 1e9, p_prev, p_next, fr[bi]);
        p_prev = p_next;
    }
    b->decode_tps = steps / t_dec;
    b->step_bytes = steps ? dec_bytes / steps : b->tok_bytes;
    qsort(fr, (size_t)n_blocks, sizeof *fr, cmp_dbl);
    qsort(bw, (size_t)n_blocks, sizeof *bw, cmp_dbl);
    b->frac = n_blocks ? fr[n_blocks / 2] : 0;
    b->bw_med = n_blocks ? bw[n_blocks / 2] : 0;
    b->block = block;
    b->n_blocks = n_blocks;
    b->steps = steps;
    free(fr);
    free(bw);
    return 0;
}

/* The report: the human-readable lines, the --csv row, the machine-readable last line.
 * Returns 0, or 1 (said) if the CSV file cannot be opened. */
static int bench_report(const bench_run *b) {
    const dsf_kernels *k = b->k;
    const char *path = b->path, *csv = b->csv;
    dsf_engine *e = b->e;
    const int n_prompt = b->n_prompt, n_threads = b->n_threads, plain = b->plain, steps = b->steps;
    const double tok_flops = b->tok_flops, head_flops = b->head_flops, step_bytes = b->step_bytes;
    const double prefill_tps = b->prefill_tps, prefill_gflops = b->prefill_gflops, peak = b->peak;
    const double decode_tps = b->decode_tps, bw_med = b->bw_med, frac = b->frac;
    const long rss = b->rss;
    printf("dsflash bench: model %s\n", path);
    printf("  kernels %s, threads %d, numerics %s%s, commit %s, peak RSS %.1f MiB\n  cpu %s\n", k->name, n_threads,
           plain ? "plain" : "reference", b->act_q8k ? " with Q8_K activations (--act-q8k)" : "", dsf_build_commit, rss / 1024.0, cpu_name());
    printf("  weights read per decoded token: %.3f GB (mean over the steps); matmul FLOPs per token: %.2f GFLOP (a "
           "prompt token without the LM head: %.2f, before the indexer projections a chunk skips)\n",
           step_bytes / 1e9, tok_flops / 1e9, (tok_flops - head_flops) / 1e9);
    if (dsf_engine_repacked_bytes(e))
        printf("  routed experts repacked in memory: %.2f GB (--no-repack reads them from the file)\n",
               (double)dsf_engine_repacked_bytes(e) / 1e9);
    else printf("  routed experts read from the file (not repacked)\n");
    if (dsf_engine_resident_bytes(e))
        printf("  dense weights copied into memory: %.2f GB (--mmap reads them from the file)\n",
               (double)dsf_engine_resident_bytes(e) / 1e9);
    else printf("  dense weights read from the file mapping\n");
    double pmd = model_pmd_share(path);
    if (pmd >= 0)
        printf("  model mapping in 2 MiB pages: %.0f %%%s\n", 100 * pmd,
               pmd < 0.95 ? " (the rest was cached earlier in 4 KiB folios: --cold re-reads the file in 2 MiB "
                            "ones; TLB misses cost bandwidth)"
                          : "");
    printf("  prefill %d tokens (ubatch %d): %.2f s, %.1f tok/s, %.1f GFLOP/s; measured BF16 peak (%s) %.1f GFLOP/s (best of 3 "
           "probes before and after: %.1f, %.1f) -> %.3f\n",
           n_prompt, dsf_engine_ubatch(e), b->t_prefill, prefill_tps, prefill_gflops, strncmp(k->name, "amx", 3) ? "dot instructions" : "AMX tiles",
           peak, b->pk0, b->pk1, prefill_gflops / peak);
    printf("  decode %d tokens (blocks of %d): %.2f tok/s, %.2f GB/s of weights; read bandwidth (median of "
           "neighbouring probes) %.2f GB/s -> fraction %.3f (median over %d blocks)\n",
           steps, b->block, decode_tps, step_bytes * decode_tps / 1e9, bw_med, frac, b->n_blocks);
    bench_dist_print(e, &b->dpre, &b->ddec);
    if (b->bat.nseq) bench_batch_print(&b->bat);
    if (csv) {
        FILE *cf = fopen(csv, "a");
        if (!cf) {
            fprintf(stderr, "dsflash bench: cannot open %s\n", csv);
            return 1;
        }
        if (ftell(cf) == 0)
            fprintf(cf, "model,commit,kernels,threads,numerics,prompt,gen,prefill_tps,prefill_gflops,peak_gflops,"
                        "prefill_peak_fraction,decode_tps,bytes_per_token,read_bw,decode_bw_fraction,rss_mib\n");
        fprintf(cf, "%s,%s,%s,%d,%s,%d,%d,%.3f,%.2f,%.2f,%.4f,%.4f,%.0f,%.3f,%.4f,%.1f\n", path, dsf_build_commit, k->name,
                n_threads, plain ? (b->act_q8k ? "plain+q8k" : "plain") : (b->act_q8k ? "reference+q8k" : "reference"), n_prompt, steps, prefill_tps, prefill_gflops, peak,
                prefill_gflops / peak, decode_tps, step_bytes, bw_med, frac, rss / 1024.0);
        fclose(cf);
    }
    char job[2048];
    bench_dist_keys(&b->dpre, &b->ddec, job, sizeof job);
    printf("decode_bw_fraction=%.3f prefill_peak_fraction=%.3f decode_tps=%.3f prefill_tps=%.2f bytes_per_token=%.0f "
           "read_bw=%.2f peak_gflops=%.1f threads=%d kernels=%s%s\n",
           frac, prefill_gflops / peak, decode_tps, prefill_tps, step_bytes, bw_med, peak, n_threads, k->name, job);
    return 0;
}

#define BENCH_MAX_UBATCH 8
static int g_ubatch[BENCH_MAX_UBATCH], g_n_ubatch; /* --ubatch N[,N...] */

/* --ubatch A,B,...: the prefill of the prompt once at each chunk size, each on a new session,
 * bracketed by the read and peak probes. The profile's counters of the MXFP4 products (the
 * routed experts) give their share of the time and the share of their time that reading their
 * weights at the probed bandwidth would take: the rest is decoding and multiplying. The
 * engine's chunk is the first size again afterwards. Returns 0, or 1 (said) on failure. */
static int bench_ubatch_sweep(bench_run *b) {
    char err[DSF_ERR_LEN] = "";
    dsf_engine *e = b->e;
    const dsf_shape *sh = &e->shape;
    const int pk_bf16 = kern_peak_probe(b->k, 1, 1, &(float){0}) > 0;
    fwd_profile_collect();
    for (int i = 0; i < g_n_ubatch; i++) {
        e->chunk = g_ubatch[i];
        dsf_session *s = dsf_session_new(e, b->n_prompt + 1, err);
        if (!s) {
            fprintf(stderr, "dsflash bench: --ubatch %d: %s\n", g_ubatch[i], err);
            return 1;
        }
        const double bw0 = probe_read(b->pool, b->k, b->arena, b->arena_n), pk0 = probe_peak_max(b->pool, b->k, pk_bf16);
        fwd_profile_reset();
        const double t0 = dsf_now();
        const int rc = dsf_session_eval(s, b->toks, b->n_prompt, b->logits, false, err);
        const double t = dsf_now() - t0;
        double xs, xb, xf;
        fwd_profile_mxfp4(&xs, &xb, &xf);
        const double flops = cost_prefill_flops(s, b->n_prompt, b->tok_flops, b->head_flops, b->il_flops);
        dsf_session_free(s);
        if (rc < 0) {
            fprintf(stderr, "dsflash bench: prefill at --ubatch %d: %s\n", g_ubatch[i], err);
            return 1;
        }
        const double pk1 = probe_peak_max(b->pool, b->k, pk_bf16), bw1 = probe_read(b->pool, b->k, b->arena, b->arena_n);
        const double peak = pk0 > pk1 ? pk0 : pk1, bw = 0.5 * (bw0 + bw1);
        const double tpe = sh->n_expert ? (double)g_ubatch[i] * (double)sh->n_expert_used / (double)sh->n_expert : 0;
        const double read_share = xs > 0 ? xb / (bw * 1e9) / xs : 0;
        printf("  prefill %d tokens at ubatch %d (%.1f tokens per routed expert): %.1f tok/s, %.1f GFLOP/s -> %.3f of "
               "the peak (%.1f); MXFP4 products %.0f %% of the time at %.1f GFLOP/s, their weights %.2f GB/s: reading "
               "them at the probed %.1f GB/s would take %.3f of their time\n",
               b->n_prompt, g_ubatch[i], tpe, b->n_prompt / t, flops / t / 1e9, flops / t / 1e9 / peak, peak,
               100 * xs / t, xs > 0 ? xf / xs / 1e9 : 0, xs > 0 ? xb / xs / 1e9 : 0, bw, read_share);
        printf("ubatch=%d prefill_tps=%.2f prefill_peak_fraction=%.3f mxfp4_time_share=%.3f mxfp4_read_share=%.3f\n",
               g_ubatch[i], b->n_prompt / t, flops / t / 1e9 / peak, xs / t, read_share);
    }
    fwd_profile_reset();
    e->chunk = g_ubatch[0];
    return 0;
}

/* The warm-up eval, then the prefill of the prompt bracketed by dot-peak probes. Returns 0,
 * or 1 (said) on failure. */
static int bench_prefill(bench_run *b) {
    char err[DSF_ERR_LEN] = "";
    const dsf_kernels *k = b->k;
    dsf_pool *pool = b->pool;
    dsf_engine *e = b->e;
    const int n_prompt = b->n_prompt;
    /* warm-up: fault the weights in. A 32-token eval touches every dense tensor and, with
     * near certainty, every routed expert (32 x top-k draws), so the measured steps do not pay
     * first-touch page faults on the mapping. */
    int n_warm = n_prompt < 32 ? n_prompt : 32;
    dsf_session *ws = dsf_session_new(e, n_warm, err);
    if (!ws || dsf_session_eval(ws, b->toks, n_warm, b->logits, false, err) < 0) {
        fprintf(stderr, "dsflash bench: warm-up: %s\n", err);
        return 1;
    }
    dsf_session_free(ws);
    fwd_profile_reset(); /* DSF_PROFILE reports the measured prefill and decode steps only */
    warm_row_tables(b->path, b->cold);
    /* the indexer projections' cost per layer (cost_prefill_flops) */
    b->il_bytes = calloc((size_t)e->shape.n_layer + 1, sizeof(double));
    b->il_flops = calloc((size_t)e->shape.n_layer + 1, sizeof(double));
    if (!b->il_bytes || !b->il_flops) {
        fprintf(stderr, "dsflash bench: out of memory\n");
        return 1;
    }
    cost_index_proj(e, b->il_bytes, b->il_flops);
    if (g_n_ubatch > 1 && bench_ubatch_sweep(b)) return 1;
    probe_read(pool, k, b->arena, b->arena_n);

    dsf_session *ss = dsf_session_new(e, n_prompt + b->n_gen + 1, err);
    if (!ss) {
        fprintf(stderr, "dsflash bench: %s\n", err);
        return 1;
    }
    b->ss = ss;
    /* prefill, bracketed by dot-peak probes */
    const int pk_bf16 = kern_peak_probe(k, 1, 1, &(float){0}) > 0;
    double pk0 = probe_peak_max(pool, k, pk_bf16);
    const bool job = dsf_dist_size() > 1;
    if (job) bench_dist_begin(e);
    double t0 = dsf_now();
    if (dsf_session_eval(ss, b->toks, n_prompt, b->logits, false, err) < 0) {
        fprintf(stderr, "dsflash bench: prefill: %s\n", err);
        return 1;
    }
    double t_prefill = dsf_now() - t0;
    if (job && bench_dist_end(e, &b->dpre, t_prefill, n_prompt) < 0) return 1;
    double pk1 = probe_peak_max(pool, k, pk_bf16);
    /* the prefill's FLOPs: every matmul for every prompt token, but the LM head only for the
     * last one (the eval returns the last row's logits), and the indexer's query projections
     * only in the chunks that compute them (the eval's chunks of max_chunk tokens) */
    double prefill_flops = cost_prefill_flops(ss, n_prompt, b->tok_flops, b->head_flops, b->il_flops);
    b->t_prefill = t_prefill;
    b->prefill_tps = n_prompt / t_prefill;
    b->prefill_gflops = prefill_flops / t_prefill / 1e9;
    /* a disturbed probe (another thread or the hypervisor taking a core for part of it) can
     * only read low, so the machine's peak is the largest of the six */
    b->peak = pk0 > pk1 ? pk0 : pk1;
    b->pk0 = pk0;
    b->pk1 = pk1;
    return 0;
}

/* The engine parameters of bench's options. */
static void engine_params(dsf_engine_params *ep, int n_threads, int plain, int repack, int resident, int act_q8k,
                          const int engram[2]) {
    dsf_engine_params_default(ep);
    ep->engram_readers = engram[0];
    ep->engram_cache_mb = engram[1];
    ep->n_threads = n_threads;
    ep->numerics = plain ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
    ep->repack = repack;
    ep->resident = resident;
    ep->act_q8k = act_q8k;
    ep->ubatch = g_n_ubatch ? g_ubatch[0] : 0;
}

static int g_batch; /* --batch N: also N sequences decoded together (bench_batch.h) */

static int bench_model(const char *path, int n_prompt, int n_gen, int n_threads, const char *csv, int plain,
                       uint64_t arena_mb, int cold, int repack, int resident, int act_q8k, const int engram[2]) {
    char err[DSF_ERR_LEN] = "";
    bench_run run = {.path = path, .csv = csv, .n_prompt = n_prompt, .n_gen = n_gen, .n_threads = n_threads,
                     .plain = plain, .act_q8k = act_q8k, .cold = cold};
    bench_run *b = &run;
    if (cold) bench_engram_init(&b->eg, path);
    if (cold) { /* drop the file's clean cached pages: the engine then reads it in 2 MiB folios */
        int fd = open(path, O_RDONLY);
        if (fd < 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
            fprintf(stderr, "dsflash bench: --cold: could not drop the cached pages of %s\n", path);
        if (fd >= 0) close(fd);
    }
    if (cost_token(path, &b->tok_bytes, &b->tok_flops, &b->head_flops, err) < 0) {
        fprintf(stderr, "dsflash bench: %s\n", err);
        return 1;
    }
    dsf_engine_params ep;
    engine_params(&ep, n_threads, plain, repack, resident, act_q8k, engram);
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    if (!e) {
        fprintf(stderr, "dsflash bench: %s\n", err);
        return 1;
    }
    b->e = e;
    b->k = kernels_get();
    /* the probes run on the engine's own pool: a second pool's worker would spin or sleep
     * while the other works, taking a core from the probe after each step (the probe after the
     * prefill read ~half the dot peak in 3 of 5 runs) or making the engine's next step wait for
     * its worker to wake up */
    b->pool = e->pool;
    b->arena_n = arena_mb << 20;
    b->arena = arena_alloc(b->arena_n);
    b->n_vocab = dsf_engine_n_vocab(e);
    b->logits = malloc((size_t)b->n_vocab * sizeof *b->logits);
    b->toks = malloc((size_t)(n_prompt + n_gen + 1) * sizeof *b->toks);
    if (!b->arena || !b->logits || !b->toks) {
        fprintf(stderr, "dsflash bench: out of memory\n");
        return 1;
    }
    fill_random(b->arena, b->arena_n, 0xB0B0ull);
    uint64_t s = 12345;
    b->toks[0] = 0;
    for (int i = 1; i < n_prompt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b->toks[i] = 3 + (int32_t)((s >> 33) % (uint64_t)(b->n_vocab > 4 ? b->n_vocab - 3 : 1));
    }
    if (bench_prefill(b) || bench_decode(b)) return 1;
    if (g_batch && bench_batch(e, g_batch, 16, n_gen, &b->bat)) return 1;
    b->rss = rss_kib("VmHWM:");
    if (cold) bench_engram_report(&b->eg, e, b->steps);
    if (bench_report(b)) return 1;
    free(b->il_bytes);
    free(b->il_flops);
    free(b->logits);
    free(b->toks);
    arena_free(b->arena);
    dsf_session_free(b->ss);
    dsf_engine_close(e);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsflash bench -m MODEL [--prompt N] [--gen N] [--batch N] [--threads N] [--csv FILE] [--plain] [--cold]\n"
               "                     [--no-repack] [--mmap] [--act-q8k] [--engram-readers N] [--engram-cache MB]\n"
               "                     [--ubatch N[,N...]]\n"
               "       dsflash bench --kernels [--threads N] [--set ref|avx2|avx512] [--arena-mb MB] [--reps N] [--only LIST]\n"
               "       dsflash bench --constrain VOCAB.gguf [--reps N]\n"
               "       dsflash bench --vision MMPROJ|synth [--vision-grid WxH] [--threads N] [--plain]\n"
               "       dsflash bench -m MODEL --draft DRAFT [--draft-max N] [--draft-min-p P] [--threads N]\n"
               "\n"
               "  -m MODEL      end to end: a prefill of --prompt tokens (default 512), then --gen greedy\n"
               "                decode steps (default 64); reports tok/s, weight bytes per token, the read\n"
               "                bandwidth probed between blocks of decode steps and the decode bandwidth\n"
               "                fraction, prefill GFLOP/s against the BF16 dot peak probed around it\n"
               "  --csv FILE    append one row of results (a header first if the file is new)\n"
               "  --plain       numerics plain (fp32, no QDQ) instead of reference\n"
               "  --act-q8k     Q8_K activations (ggml's) for K / IQ weights: faster there, changes results\n"
               "  --no-repack   keep the routed experts in the file instead of repacking them in memory\n"
               "  --mmap        read the dense weights from the file mapping instead of copying them\n"
               "                into memory\n"
               "  --ubatch N    tokens per prefill forward (default: auto, as run and serve pick it); a list\n"
               "                (up to 8) measures the prompt's prefill at each size first, a line each with\n"
               "                tok/s, the peak fraction, the MXFP4 products' share of the time and the share\n"
               "                of theirs that reading their weights at the probed bandwidth would take\n"
               "                (ubatch=... keys); the run then uses the first\n"
               "  --batch N     after the decode, N sequences (16-token prompts) decoded together for --gen\n"
               "                steps, one dsf_batch_eval per step (the server's batched decode): tok/s of all\n"
               "                of them (in an MPI job with its traffic and wait fractions)\n"
               "  --cold        first drop the model file's cached pages, so that the engine reads it\n"
               "                afresh into 2 MiB page-cache folios (pages cached earlier in 4 KiB\n"
               "                folios stay that way and cost TLB misses; see docs/PERFORMANCE.md); and\n"
               "                drop the Engram table's pages again before each decode step (checked\n"
               "                with mincore), then report the Engram reads per token, the share hidden\n"
               "                behind the layers before Engram, and a random-read probe of the table\n"
               "%s"
               "  --draft D     speculative decoding on MODEL (a DSpark GGUF, or \"oracle\" until one exists):\n"
               "                the main forward for T = 1..B+1 tokens as a ratio to T = 1, the draft's time\n"
               "                per call as decode steps, and the projected speed-up at 50/70/90 %% accepts\n"
               "                under the block-length policy and under \"always verify B\"\n"
               "  --kernels     kernel micro-benchmark: each matmul kernel's GB/s and GFLOP/s against a\n"
               "                read-bandwidth probe run between kernel passes and the dot-product peak\n"
               "  --constrain V constrained decoding on the vocabulary of V (a vocab-only GGUF will do): ns per\n"
               "                token of the unconstrained sampler, and of the mask in typical grammar\n"
               "                states (first visit, cached, under a binding budget), compile times;\n"
               "                --reps N takes 10 N samples per figure\n"
               "  --vision P    the vision tower and aligner on one image (random patches, a 108x81-patch grid:\n"
               "                a 4000x3000 photo under the default cap; --vision-grid WxH for another):\n"
               "                ms per image, GFLOP/s and the fraction of the BF16 dot peak probed around\n"
               "                it; P an mmproj GGUF, or synth (random BF16 weights of the release shapes);\n"
               "                the bf16 tower (reference numerics) unless --plain\n"
               "  --threads N   worker threads (default: online CPUs; in an MPI job, per rank: the online\n"
               "                CPUs shared among the job's ranks on this machine)\n"
               "  --set NAME    kernel table (default: the one DSF_KERNELS / the CPU selects)\n"
               "  --arena-mb MB weight arena / probe buffer, larger than the last-level cache (default 1024)\n"
               "  --only LIST   --kernels: only the cases whose label contains one of the comma-separated\n"
               "                substrings (e.g. 'wq_,wo_b,w1 ': the FP8_B32 / BF16 pairs)\n"
               "  --reps N      passes per kernel, each bracketed by probes (default 5, max 16)\n"
               "\n"
               "As an MPI job (mpirun -np N dsflash bench -m MODEL --parallel pipeline|experts|pipeline,experts):\n"
               "rank 0 runs the bench, the decode is timed as one block, and it adds per phase (prefill, decode)\n"
               "the bytes and messages all ranks sent per token, each rank's share of the time spent waiting on\n"
               "MPI, and each rank's resident memory (README \"Several machines (MPI)\").\n"
               "The last line is machine-readable (key=value).\n",
            GEN_CLI_ENGRAM_HELP);
}

static int cmd_bench(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    int kernels = 0, reps = 5, n_prompt = 512, n_gen = 64, plain = 0, cold = 0, repack = 0, resident = 0, act_q8k = 0;
    const char *model = NULL, *csv = NULL, *constrain = NULL, *vision = NULL, *vgrid = NULL;
    long threads = bench_dist_default_threads();
    const char *set = NULL, *only = NULL;
    uint64_t arena_mb = 1024;
    spec_opts so = {0};
    int engram[2] = {0, 0}; /* dsf_engine_params.engram_readers, .engram_cache_mb */
    for (int i = 1; i < argc; i++) {
        int dr = gen_cli_draft_option(&so, "bench", argc, argv, &i);
        if (!dr) dr = gen_cli_engram_option("bench", argc, argv, &i, &engram[0], &engram[1]);
        if (dr < 0) return 2;
        if (dr) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--kernels")) {
            kernels = 1;
        } else if (!strcmp(a, "--constrain") && v) {
            constrain = v;
            i++;
        } else if (!strcmp(a, "--vision") && v) {
            vision = v;
            i++;
        } else if (!strcmp(a, "--vision-grid") && v) {
            vgrid = v;
            i++;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            model = v;
            i++;
        } else if (!strcmp(a, "--csv") && v) {
            csv = v;
            i++;
        } else if (!strcmp(a, "--plain")) {
            plain = 1;
        } else if (!strcmp(a, "--cold")) {
            cold = 1;
        } else if (!strcmp(a, "--no-repack")) {
            repack = -1;
        } else if (!strcmp(a, "--mmap")) {
            resident = -1;
        } else if (!strcmp(a, "--act-q8k")) {
            act_q8k = 1;
        } else if (!strcmp(a, "--ubatch") && v) {
            g_n_ubatch = 0;
            int ok = 1;
            for (const char *q = v; ok;) {
                long n = strtol(q, &end, 10);
                ok = end != q && n >= 1 && n <= (1 << 20) && (!*end || *end == ',') && g_n_ubatch < BENCH_MAX_UBATCH;
                if (!ok) break;
                g_ubatch[g_n_ubatch++] = (int)n;
                if (!*end) break;
                q = end + 1;
            }
            if (!ok) {
                fprintf(stderr, "dsflash bench: --ubatch wants up to %d chunk sizes of 1..1048576 tokens (N or "
                                "N,N,...), got '%s'\n", BENCH_MAX_UBATCH, v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--batch") && v) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 256) {
                fprintf(stderr, "dsflash bench: --batch wants 1..256 sequences, got '%s'\n", v);
                return 2;
            }
            g_batch = (int)n;
            i++;
        } else if ((!strcmp(a, "--prompt") || !strcmp(a, "--gen")) && v) {
            long n = strtol(v, &end, 10);
            if (*end || n < (a[2] == 'p' ? 2 : 1) || n > 1000000) {
                fprintf(stderr, "dsflash bench: %s wants a positive count, got '%s'\n", a, v);
                return 2;
            }
            if (a[2] == 'p') n_prompt = (int)n;
            else n_gen = (int)n;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            threads = strtol(v, &end, 10);
            if (*end || threads < 1 || threads > 64) {
                fprintf(stderr, "dsflash bench: --threads wants 1..64, got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--set") && v) {
            set = v;
            i++;
        } else if (!strcmp(a, "--only") && v) {
            only = v;
            i++;
        } else if (!strcmp(a, "--arena-mb") && v) {
            long m = strtol(v, &end, 10);
            if (*end || m < 64 || m > 65536) {
                fprintf(stderr, "dsflash bench: --arena-mb wants 64..65536, got '%s'\n", v);
                return 2;
            }
            arena_mb = (uint64_t)m;
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            reps = (int)strtol(v, &end, 10);
            if (*end || reps < 1 || reps > 16) {
                fprintf(stderr, "dsflash bench: --reps wants 1..16, got '%s'\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "dsflash bench: unknown or incomplete option '%s' (try --help)\n", a);
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (dsf_dist_size() > 1 && (!model || so.draft)) { /* every rank would run it alone */
        if (dsf_dist_rank() == 0)
            fprintf(stderr, "dsflash bench: --parallel runs only bench -m MODEL (not --kernels, --constrain, "
                            "--vision or --draft)\n");
        return 2;
    }
    if (constrain) return bench_constrain(constrain, reps * 10);
    if (vision) return bench_vision(vision, vgrid, (int)threads, plain);
    if (kernels == !!model) {
        fprintf(stderr, "dsflash bench: give either -m MODEL or --kernels (try --help)\n");
        return 2;
    }
    if (model && so.draft) {
        dsf_engine_params ep;
        engine_params(&ep, (int)threads, plain, repack, resident, act_q8k, engram);
        return bench_draft(model, &so, &ep);
    }
    if (model)
        return bench_model(model, n_prompt, n_gen, (int)threads, csv, plain, arena_mb, cold, repack, resident, act_q8k,
                           engram);
    return bench_kernels((int)threads, set, arena_mb, reps, only);
}

DSF_COMMAND(bench, "benchmarks: end to end (-m MODEL), kernel micro-benchmark (--kernels), constrained decoding (--constrain)", cmd_bench)
