/* mm.c: the forward pass's threaded products (fwd_mm and its family), the DSF_PROFILE
 * profiler and the DSF_DUMP dumps.
 * Owns: the range jobs and grains of the products (rows or tokens, guided; the decode
 * multi-product jobs claimed from both ends), the activation prep (FP8 QDQ, BF16 copies) and
 * the profile's process-wide counters; calling the engine's product observer (model.h
 * dsf_mm_observer, unset but for dsflash imatrix) at each product's entry.
 * Must not: call a mechanism (hc, attention, MoE, Engram) or name a tensor; change a value by
 * how it splits work (the kernels give every row and token the same bits whatever the range).
 * Invariant: a product of one projection always takes the same kernel family, so prefill and
 * decode agree bit for bit. */
#include "model/mm.h"
#include "kernels/select.h"
#include "kernels/mxfp4r.h"
#include "kernels/vec.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const dsf_kernels *k;
    const dsf_wmat *w;
    const float *x;
    int64_t T, ldy;
    float *y;
} mm_job;

static void mm_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const mm_job *j = ctx;
    kern_matmul(j->k, j->w, j->x, j->T, j->y, j->ldy, i0, i1);
}

/* The same job split by tokens [t0, t1) instead of rows (run_mm). */
static void mm_tok_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const mm_job *j = ctx;
    kern_matmul(j->k, j->w, j->x + t0 * j->w->n_in, t1 - t0, j->y + t0 * j->ldy, j->ldy, 0, j->w->n_out);
}

/* Rows per unit of a multi-product job (mm_multi): MM_UNITS units per thread and product, at
 * most MM_UNITS_MAX per product (so that an MoE job of 14 products stays one job of at most
 * MULTI_UNITS units on a many-core pool), claimed from both ends in shrinking runs (the
 * kernels give every row the same value whatever its range, so the split changes nothing).
 * A single product is claimed guided instead (pieces shrink from a quarter of the rows per
 * thread down to mm_min_grain). Either way the threads finish together. */
#ifndef MM_UNITS
#define MM_UNITS 16
#endif
#define MM_UNITS_MAX 32
static int64_t mm_grain(const fwd *f, const dsf_wmat *w) {
    int64_t units = MM_UNITS * (int64_t)dsf_pool_size(f->e->pool);
    int64_t grain = w->n_out / (units < MM_UNITS_MAX ? units : MM_UNITS_MAX);
    return grain < 16 ? 16 : grain;
}

/* The smallest guided piece. T = 1 streams each row once, so the last pieces are what one
 * thread still reads while the other waits at the join: they are cut down to MM_TAIL_BYTES
 * of weights (a few us), whatever the product's size (docs/perf-log.md, item 12). T > 1
 * takes 1/64 of the rows (2 threads): a piece there is compute-bound, and its last one is
 * what the other thread waits for (docs/perf-log.md, "Results on this machine", set 32). */
#ifndef MM_TAIL_BYTES
#define MM_TAIL_BYTES 65536
#endif
static int64_t mm_min_grain(const fwd *f, const dsf_wmat *w, int64_t T) {
    int64_t grain = w->n_out / (32 * dsf_pool_size(f->e->pool));
    if (T == 1 && MM_TAIL_BYTES > 0) {
        const int64_t rb = (int64_t)wmat_row_read_bytes(w) > 0 ? (int64_t)wmat_row_read_bytes(w) : 1;
        grain = (MM_TAIL_BYTES + rb - 1) / rb;
        grain = (grain + 3) / 4 * 4; /* whole tiles of 4 rows */
    }
    return grain < 4 ? 4 : grain; /* one kernel tile: a 24-row product splits 6 + 4 + ... */
}

/* DSF_PROFILE=1: a time split printed to stderr at exit, for decode steps (T = 1) and prefill
 * chunks (T > 1) apart: whole forward calls, and the matmuls by path (fp32 / BF16
 * activations) and weight type, with the bytes (decode) or FLOPs (prefill) they did.
 * DSF_PROFILE=2 adds a table by product: each shape and weight type (a multi-product job,
 * such as an MoE job, as one line named by its first product and its count), with its calls,
 * time, GB/s and GFLOP/s, slowest first. A debugging aid for speed work; off by default (one
 * branch per call). Process-wide counters without locks: meant for one engine driven by one
 * thread (bench, logits, run). */
enum { PROF_TYPES = 3, PROF_PATHS = 3, PROF_PRODS = 96 };
typedef struct {
    int64_t n_out, n_in;
    uint32_t type;
    int n; /* products in the job (1: a single product) */
    long calls;
    double s, bytes, flop;
} prof_prod;
typedef struct {
    double fwd_s, tokens, mm_s[PROF_PATHS][PROF_TYPES], mm_bytes[PROF_PATHS][PROF_TYPES], mm_flop[PROF_PATHS][PROF_TYPES];
    long calls, mm_calls;
    prof_prod prod[PROF_PRODS];
    int n_prod, prod_full; /* prod_full: a product did not fit the table */
} prof_phase;
static struct {
    int on; /* 0 off, 1 the time split, 2 also the table by product */
    prof_phase ph[2]; /* 0: decode steps, 1: prefill chunks */
} prof = {.on = -1};

static int prof_prod_cmp(const void *a, const void *b) {
    const prof_prod *x = a, *y = b;
    return x->s < y->s ? 1 : x->s > y->s ? -1 : 0;
}

static void prof_report_prods(const char *phase, prof_phase *q, double per) {
    qsort(q->prod, (size_t)q->n_prod, sizeof *q->prod, prof_prod_cmp);
    fprintf(stderr, "dsflash profile by product, %s (ms per token; a job of n products is named by its first):\n",
            phase);
    fprintf(stderr, "  %-30s %8s %9s %8s %9s\n", "product", "calls", "ms/token", "GB/s", "GFLOP/s");
    for (int i = 0; i < q->n_prod; i++) {
        const prof_prod *p = &q->prod[i];
        char name[64];
        int o = p->n > 1 ? snprintf(name, sizeof name, "job of %d: ", p->n) : 0;
        snprintf(name + o, sizeof name - (size_t)o, "%lld x %lld %s", (long long)p->n_out, (long long)p->n_in,
                 p->type == DSF_TYPE_MXFP4R ? "mxfp4r" : ggml_type_name(p->type));
        fprintf(stderr, "  %-30s %8ld %9.3f %8.2f %9.1f\n", name, p->calls, 1e3 * p->s / per, p->bytes / p->s / 1e9,
                p->flop / p->s / 1e9);
    }
    if (q->prod_full) fprintf(stderr, "  (more than %d distinct products: the rest not listed)\n", PROF_PRODS);
}

static void prof_report(void) {
    static const char *path[PROF_PATHS] = {"fp32 act", "bf16 act", "q8k act"};
    static const char *type[PROF_TYPES] = {"dense", "mxfp4", "mxfp4 (n_in < 4096)"};
    for (int ph = 0; ph < 2; ph++) {
        prof_phase *q = &prof.ph[ph];
        if (!q->calls) continue;
        double mm = 0, per = ph ? q->tokens : (double)q->calls;
        for (int a = 0; a < PROF_PATHS; a++)
            for (int b = 0; b < PROF_TYPES; b++) mm += q->mm_s[a][b];
        fprintf(stderr, "dsflash profile, %s: %ld calls, %.0f tokens, %.2f ms/token; matmuls %.2f ms/token (%ld calls), rest %.2f ms/token\n",
                ph ? "prefill" : "decode", q->calls, q->tokens, 1e3 * q->fwd_s / per, 1e3 * mm / per, q->mm_calls,
                1e3 * (q->fwd_s - mm) / per);
        for (int a = 0; a < PROF_PATHS; a++)
            for (int b = 0; b < PROF_TYPES; b++)
                if (q->mm_s[a][b] > 0)
                    fprintf(stderr, "  %s %-20s: %.2f ms/token, %.2f GB/s, %.1f GFLOP/s\n", path[a], type[b],
                            1e3 * q->mm_s[a][b] / per, q->mm_bytes[a][b] / q->mm_s[a][b] / 1e9,
                            q->mm_flop[a][b] / q->mm_s[a][b] / 1e9);
        if (prof.on >= 2) prof_report_prods(ph ? "prefill" : "decode", q, per);
    }
}

static int prof_enabled(void) {
    if (prof.on < 0) {
        const char *v = dsf_knob("DSF_PROFILE");
        prof.on = !v || !*v || !strcmp(v, "0") ? 0 : !strcmp(v, "2") ? 2 : 1;
        if (prof.on) atexit(prof_report);
    }
    return prof.on;
}

void fwd_profile_reset(void) {
    if (prof_enabled()) memset(prof.ph, 0, sizeof prof.ph);
}

void fwd_profile_collect(void) {
    if (!prof_enabled()) prof.on = 1; /* no atexit report: only DSF_PROFILE registers it */
}

void fwd_profile_mxfp4(double *s, double *bytes, double *flop) {
    const prof_phase *q = &prof.ph[1];
    *s = *bytes = *flop = 0;
    for (int a = 0; a < PROF_PATHS; a++)
        for (int b = 1; b < PROF_TYPES; b++) { /* the two MXFP4 types */
            *s += q->mm_s[a][b];
            *bytes += q->mm_bytes[a][b];
            *flop += q->mm_flop[a][b];
        }
}

static void prof_mm(const fwd *f, const dsf_wmat *w, int64_t T, int path, double t0) {
    prof_phase *q = &prof.ph[f->T > 1];
    int type = !wmat_is_mxfp4(w) ? 0 : w->n_in < 4096 ? 2 : 1;
    q->mm_s[path][type] += dsf_now() - t0;
    q->mm_bytes[path][type] += (double)wmat_row_read_bytes(w) * (double)w->n_out;
    q->mm_flop[path][type] += 2.0 * (double)w->n_in * (double)w->n_out * (double)T;
    q->mm_calls++;
}

/* One product or job (n products from w[0]) into the table by product (DSF_PROFILE=2). */
static void prof_job(const fwd *f, const dsf_wmat *const *w, int n, int64_t T, double t0) {
    if (prof.on < 2 || n <= 0) return;
    prof_phase *q = &prof.ph[f->T > 1];
    double bytes = 0, flop = 0;
    for (int i = 0; i < n; i++) {
        bytes += (double)wmat_row_read_bytes(w[i]) * (double)w[i]->n_out;
        flop += 2.0 * (double)w[i]->n_in * (double)w[i]->n_out * (double)T;
    }
    prof_prod *p = NULL;
    for (int i = 0; i < q->n_prod && !p; i++)
        if (q->prod[i].n_out == w[0]->n_out && q->prod[i].n_in == w[0]->n_in && q->prod[i].type == w[0]->type &&
            q->prod[i].n == n)
            p = &q->prod[i];
    if (!p) {
        if (q->n_prod == PROF_PRODS) {
            q->prod_full = 1;
            return;
        }
        p = &q->prod[q->n_prod++];
        *p = (prof_prod){.n_out = w[0]->n_out, .n_in = w[0]->n_in, .type = w[0]->type, .n = n};
    }
    p->calls++;
    p->s += dsf_now() - t0;
    p->bytes += bytes;
    p->flop += flop;
}

double fwd_profile_start(void) { return prof_enabled() ? dsf_now() : 0; }

void fwd_profile_end(int64_t T, double t0) {
    if (t0 <= 0) return;
    prof_phase *q = &prof.ph[T > 1];
    q->fwd_s += dsf_now() - t0;
    q->tokens += (double)T;
    q->calls++;
}

/* A product with few rows and many tokens is split by tokens instead (tfn): split by rows,
 * every piece streams all T activation rows from memory again, while the weights (a few MB
 * at most) are what the pieces could share (docs/perf-log.md, item 38). The kernels give
 * y[t][r] the same bits whatever the token range (batch invariance), so the split changes
 * nothing else. */
#ifndef MM_TOK_ROWS
#define MM_TOK_ROWS 64
#endif
#define MM_TOK_GRAIN 16 /* tokens: whole 4-token tiles */

/* A product's rows, claimed guided (or its tokens: above); path: 0 fp32 activations, 1 BF16,
 * 2 Q8_K (the profile's split). */
static void run_mm(const fwd *f, const dsf_wmat *w, int64_t T, dsf_range_fn fn, dsf_range_fn tfn, void *job,
                   int path) {
    double t0 = prof_enabled() ? dsf_now() : 0;
    if (T >= 2 * MM_TOK_GRAIN && w->n_out <= MM_TOK_ROWS)
        dsf_parallel_for_guided(f->e->pool, T, MM_TOK_GRAIN, tfn, job);
    else
        dsf_parallel_for_guided(f->e->pool, w->n_out, mm_min_grain(f, w, T), fn, job);
    if (t0 > 0) {
        prof_job(f, &w, 1, T, t0);
        prof_mm(f, w, T, path, t0);
    }
}

/* ---- the Q8_K activation mode (dsf_engine_params.act_q8k) ----
 * A product whose weight type has a Q8_K dot (ggml's vec_dot_type of the K-quants and of these
 * IQ types) quantizes its activation rows with quantize_row_q8k into f->sc->xb and runs the
 * matmul_q8k kernels. Whether a product does depends on its weight only (type, n_in), never on
 * T, so prefill and decode take the same family. n_in is at most 16384 (the twin's row buffer)
 * and a row's blocks must fit f->sc->xb's share of one token (xb_cap / max_chunk). */
static bool q8k_type(uint32_t t) {
    switch (t) {
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS:
    case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ4_XS: return true;
    default: return false;
    }
}
/* uint16_t elements of f->sc->xb that one row of n_in values takes as Q8_K blocks (64-byte multiple) */
static int64_t q8k_elems(int64_t n_in) { return (n_in / 256 * (int64_t)sizeof(dsf_q8k) + 63) / 64 * 32; }
bool fwd_q8k_on(const fwd *f, const dsf_wmat *w) {
    return f->e->act_q8k && q8k_type(w->type) && w->n_in % 256 == 0 && w->n_in <= 16384 &&
           q8k_elems(w->n_in) <= f->sc->xb_cap / (f->sc->max_chunk > 0 ? f->sc->max_chunk : 1);
}

typedef struct {
    const dsf_kernels *k;
    const dsf_wmat *w;
    const dsf_q8k *x; /* T rows of n_in / 256 blocks */
    int64_t T, ldy;
    float *y;
} mq_job;

static void mq_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const mq_job *j = ctx;
    kern_matmul_q8k(j->k, j->w, j->x, j->T, j->y, j->ldy, i0, i1);
}

static void mq_tok_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const mq_job *j = ctx;
    kern_matmul_q8k(j->k, j->w, j->x + t0 * (j->w->n_in / 256), t1 - t0, j->y + t0 * j->ldy, j->ldy, 0, j->w->n_out);
}

typedef struct {
    const float *x;
    dsf_q8k *q;
    int64_t n;
} q8_job;

static void q8_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const q8_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) quantize_row_q8k(j->x + t * j->n, j->n, j->q + t * (j->n / 256));
}

/* The blocks of T rows are contiguous (the kernels' layout), so T rows take T * n_in / 256
 * blocks: within q8k_elems(n_in) * T. */
static void mm_q8k(const fwd *f, const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy) {
    if (f->e->mm_obs) f->e->mm_obs(f->e->mm_obs_user, w, x, NULL, T);
    q8_job q = {x, (dsf_q8k *)(void *)f->sc->xb, w->n_in};
    if (T == 1) q8_range(&q, 0, 1, 0);
    else dsf_parallel_for_guided(f->e->pool, T, 16384 / w->n_in + 1, q8_range, &q);
    mq_job j = {f->e->kern, w, q.q, T, ldy, y};
    run_mm(f, w, T, mq_range, mq_tok_range, &j, 2);
}

void fwd_mm(const fwd *f, const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy) {
    if (T <= 0) return;
    if (fwd_q8k_on(f, w)) {
        mm_q8k(f, w, x, T, y, ldy);
        return;
    }
    if (f->e->mm_obs) f->e->mm_obs(f->e->mm_obs_user, w, x, NULL, T);
    mm_job j = {f->e->kern, w, x, T, ldy, y};
    run_mm(f, w, T, mm_range, mm_tok_range, &j, 0);
}

typedef struct {
    const float *x;
    float *xq;
    int64_t n;
} act_job;

static void act_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const act_job *j = ctx;
    float *dst = j->xq + t0 * j->n;
    if (j->xq != j->x) memcpy(dst, j->x + t0 * j->n, (size_t)((t1 - t0) * j->n) * sizeof(float));
    ka_qdq_fp8(akernels_get(), dst, (t1 - t0) * j->n);
}

typedef struct {
    const dsf_kernels *k;
    const dsf_wmat *w;
    const uint16_t *x;
    int64_t T, ldy;
    float *y;
} mmb_job;

static void mmb_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const mmb_job *j = ctx;
    kern_matmul_xbf16(j->k, j->w, j->x, j->T, j->y, j->ldy, i0, i1);
}

static void mmb_tok_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const mmb_job *j = ctx;
    kern_matmul_xbf16(j->k, j->w, j->x + t0 * j->w->n_in, t1 - t0, j->y + t0 * j->ldy, j->ldy, 0, j->w->n_out);
}

typedef struct {
    const float *x;
    uint16_t *xb;
    int64_t n;
    atomic_int inexact;
} bf16_job;

static void bf16_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    bf16_job *j = ctx;
    if (!kern_act_to_bf16(j->x + t0 * j->n, j->xb + t0 * j->n, (t1 - t0) * j->n)) atomic_store(&j->inexact, 1);
}

bool fwd_to_bf16(const fwd *f, const float *x, int64_t T, int64_t n, uint16_t *xb) {
    bf16_job j = {x, xb, n, 0};
    dsf_parallel_for_guided(f->e->pool, T, 65536 / n + 1, bf16_range, &j);
    return !atomic_load(&j.inexact);
}

void fwd_mm_xb(const fwd *f, const dsf_wmat *w, const uint16_t *xb, int64_t T, float *y, int64_t ldy) {
    if (T <= 0) return;
    if (f->e->mm_obs) f->e->mm_obs(f->e->mm_obs_user, w, NULL, xb, T);
    mmb_job j = {f->e->kern, w, xb, T, ldy, y};
    run_mm(f, w, T, mmb_range, mmb_tok_range, &j, 1);
}

void fwd_mm_act(const fwd *f, const dsf_wmat *w, const float *xq, int64_t T, float *y, int64_t ldy) {
    if (T <= 0) return;
    /* QDQ'd values are exact in BF16; anything else (non-finite input) keeps the fp32 path */
    if (fwd_q8k_on(f, w) || !f->ref || !fwd_to_bf16(f, xq, T, w->n_in, f->sc->xb)) {
        fwd_mm(f, w, xq, T, y, ldy);
        return;
    }
    fwd_mm_xb(f, w, f->sc->xb, T, y, ldy);
}

typedef struct {
    const dsf_wmat *w;
    const float *x;    /* fp32 path when xb and x8 are NULL */
    const uint16_t *xb;
    const dsf_q8k *x8; /* the Q8_K mode (fwd_q8k_on) */
    float *y;
    int64_t r0, r1;
} mm_unit;

typedef struct {
    const dsf_kernels *k;
    const mm_unit *u;
} multi_job;

/* Units [i0, i1) of a job; adjacent units of one product run as one call (longer row
 * streams for the kernel's tiles). */
static void multi_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const multi_job *j = ctx;
    for (int64_t i = i0; i < i1;) {
        const mm_unit *u = &j->u[i];
        int64_t r1 = u->r1;
        for (i++; i < i1 && j->u[i].w == u->w && j->u[i].y == u->y && j->u[i].r0 == r1; i++) r1 = j->u[i].r1;
        if (u->x8) kern_matmul_q8k(j->k, u->w, u->x8, 1, u->y, u->w->n_out, u->r0, r1);
        else if (u->xb) kern_matmul_xbf16(j->k, u->w, u->xb, 1, u->y, u->w->n_out, u->r0, r1);
        else kern_matmul(j->k, u->w, u->x, 1, u->y, u->w->n_out, u->r0, r1);
    }
}

#define MULTI_UNITS 512 /* units per threaded job (24 KiB of stack); more run as further jobs */

/* Runs units as one job. Compute-bound MXFP4 units go first and bandwidth-bound ones last,
 * and the threads claim from both ends (dsf_parallel_for_ends): one thread decodes MXFP4
 * while the other streams the dense units (in MoE decode, the shared expert), until one kind
 * runs out, which keeps the memory busier (docs/perf-log.md, items 5 and 34). Units are
 * independent, so order and split change no value. */
static void run_units(const fwd *f, mm_unit *units, int64_t nu) {
    mm_unit tmp[MULTI_UNITS];
    int64_t o = 0;
    for (int64_t i = 0; i < nu; i++)
        if (wmat_is_mxfp4(units[i].w)) tmp[o++] = units[i];
    for (int64_t i = 0; i < nu; i++)
        if (!wmat_is_mxfp4(units[i].w)) tmp[o++] = units[i];
    multi_job j = {f->e->kern, tmp};
    dsf_parallel_for_ends(f->e->pool, nu, multi_range, &j);
}

#define MULTI_MAX 64    /* products per call */
/* act: products as fwd_mm_act computes them (BF16 activations when exact in reference mode);
 * otherwise as fwd_mm does (the fp32 family); either way the Q8_K mode's products (fwd_q8k_on) as
 * mm_q8k does. f->sc->xb holds the copies: a BF16 one (act) and a Q8_K one per activation, made
 * when a product needs it and the last one made of its kind was of another activation. */
static void mm_multi(const fwd *f, int n, const dsf_wmat *const *w, const float *const *xq, float *const *y, bool act) {
    DSF_ASSERT(n >= 0 && n <= MULTI_MAX);
    mm_unit units[MULTI_UNITS];
    int64_t nu = 0, used = 0;
    const uint16_t *b = NULL;
    const dsf_q8k *b8 = NULL;
    const float *bsrc = NULL, *b8src = NULL; /* the activations of b and b8 */
    double t0 = prof_enabled() ? dsf_now() : 0;
    for (int i = 0; i < n; i++) {
        DSF_ASSERT(w[i]->n_in <= f->sc->xb_cap);
        const bool q8 = fwd_q8k_on(f, w[i]);
        if (f->e->mm_obs) f->e->mm_obs(f->e->mm_obs_user, w[i], xq[i], NULL, 1);
        if (q8 ? xq[i] != b8src : act && xq[i] != bsrc) { /* a new activation: its copy */
            const int64_t need = q8 ? q8k_elems(w[i]->n_in) : w[i]->n_in;
            used = q8 ? (used + 31) / 32 * 32 : used; /* Q8_K blocks 64-byte aligned */
            if (used + need > f->sc->xb_cap) { /* full: run what refers to it first */
                run_units(f, units, nu);
                nu = used = 0;
                bsrc = b8src = NULL, b = NULL, b8 = NULL;
            }
            uint16_t *dst = f->sc->xb + used;
            if (q8) {
                quantize_row_q8k(xq[i], w[i]->n_in, dst);
                b8 = (const dsf_q8k *)(const void *)dst, b8src = xq[i], used += need;
            } else {
                b = f->ref && kern_act_to_bf16(xq[i], dst, w[i]->n_in) ? dst : NULL;
                bsrc = xq[i];
                if (b) used += w[i]->n_in;
            }
        }
        const int64_t grain = mm_grain(f, w[i]);
        for (int64_t r = 0; r < w[i]->n_out; r += grain) {
            if (nu == MULTI_UNITS) {
                run_units(f, units, nu);
                nu = 0;
            }
            units[nu++] = (mm_unit){w[i], xq[i], q8 ? NULL : b, q8 ? b8 : NULL, y[i], r,
                                    r + grain < w[i]->n_out ? r + grain : w[i]->n_out};
        }
    }
    run_units(f, units, nu);
    if (t0 > 0) { /* one clock for the whole job: split it by bytes */
        prof_job(f, w, n, 1, t0);
        double tot = 0, dt = dsf_now() - t0;
        for (int i = 0; i < n; i++) tot += (double)wmat_row_read_bytes(w[i]) * (double)w[i]->n_out;
        for (int i = 0; i < n; i++)
            prof_mm(f, w[i], 1, fwd_q8k_on(f, w[i]) ? 2 : act && f->ref, dsf_now() - dt * (double)wmat_row_read_bytes(w[i]) * (double)w[i]->n_out / tot);
    }
}

void fwd_mm_act_multi(const fwd *f, int n, const dsf_wmat *const *w, const float *const *xq, float *const *y) {
    mm_multi(f, n, w, xq, y, true);
}

void fwd_mm_multi(const fwd *f, int n, const dsf_wmat *const *w, const float *const *x, float *const *y) {
    mm_multi(f, n, w, x, y, false);
}

const float *fwd_act(const fwd *f, const float *x, int64_t T, int64_t n, float *xq) {
    if (!f->ref) return x;
    act_job j = {x, xq, n};
    if (n % 32) { /* QDQ groups of 32 straddle rows: one pass over the whole chunk */
        act_range(&j, 0, T, 0);
        return xq;
    }
    /* threaded over tokens: whole rows of whole groups, so the split changes nothing */
    dsf_parallel_for_guided(f->e->pool, T, 16384 / n + 1, act_range, &j);
    return xq;
}

void fwd_dump(const fwd *f, const char *name, const void *data, size_t bytes) {
    const char *dir = dsf_knob("DSF_DUMP");
    if (!dir || !data) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *fp = fopen(path, f->tpos[0] == 0 ? "wb" : "ab");
    if (!fp) return;
    fwrite(data, 1, bytes, fp);
    fclose(fp);
}

void fwd_dump_layer(const fwd *f, int64_t il, const char *what, const float *p, int64_t n) {
    char nm[64];
    snprintf(nm, sizeof nm, "L%02lld.%s", (long long)il, what);
    fwd_dump(f, nm, p, (size_t)n * sizeof(float));
}
