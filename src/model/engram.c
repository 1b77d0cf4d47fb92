/* engram.c: Engram n-gram memory (architecture.md §4.2): the per-position hash over the
 * compressed token history and the gated add into every hyper-connection copy, applied to
 * the stream BEFORE its block. The table is read row by row, never whole.
 * Must not: map or read the table whole; write stream rows other than its layer's input.
 * Invariant: each stream row (token, copy) is written by exactly one range of a job. */
#include "model/engram.h"
#include "model/mm.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void engram_hash(const dsf_shape *sh, int64_t e, const int32_t *tokens, int64_t p, int64_t *rows) {
    const int64_t ng = sh->ngram, nh = sh->heads_per_ngram, cols = sh->ple_cols;
    const uint64_t *mult = sh->ple_mult + e * ng;
    const uint64_t *off = sh->ple_offset + e * cols, *size = sh->ple_size + e * cols;
    uint64_t tk[8];
    int blocked = 0;
    for (int64_t s = 0; s < ng; s++) {
        int64_t c = DSF_ENGRAM_DEAD;
        if (p - s >= 0) {
            int32_t id = tokens[p - s];
            c = (id < 0 || id >= sh->n_token_map) ? DSF_ENGRAM_DEAD : sh->token_map[id];
        }
        /* spec §4.2.3: blocking is cumulative from the sequence start or a DEAD token */
        blocked = blocked || c == DSF_ENGRAM_DEAD;
        tk[s] = blocked ? (uint64_t)sh->engram_pad : (uint64_t)c;
    }
    uint64_t rolling = tk[0] * mult[0];
    for (int64_t s = 1; s < ng; s++) {
        rolling ^= tk[s] * mult[s];
        for (int64_t h = 0; h < nh; h++) {
            int64_t col = (s - 1) * nh + h;
            rows[col] = (int64_t)(rolling % size[col] + off[col]);
        }
    }
}

/* The gated add of each token's Engram value into its hc copies, threaded over (token, copy)
 * items i = t * hc + c (each stream row is written by exactly one chunk; a decode step has hc
 * items, not one). */
typedef struct {
    const fwd *f;
    const dsf_layer *L;
} gate_job;

static void gate_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const gate_job *j = ctx;
    const dsf_shape *sh = j->f->sh;
    const dsf_layer *L = j->L;
    dsf_scratch *sc = j->f->sc;
    const int64_t D = sh->n_embd, hc = sh->hc, nout = (hc + 1) * D;
    const float dscale = (float)(1.0 / sqrt((double)D));
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / hc, c = i % hc;
        const float *kv = sc->ekv + t * nout, *val = kv + hc * D;
        float *x = sc->X + (t * hc + c) * D;
        const float *key = kv + c * D, *gw = L->engram_gate + c * D;
        double sx = 0, sk = 0, dot = 0;
        for (int64_t d = 0; d < D; d++) {
            sx += (double)x[d] * x[d];
            sk += (double)key[d] * key[d];
            dot += (double)x[d] * gw[d] * key[d];
        }
        float rx = (float)(1.0 / sqrt(sx / (double)D + (double)sh->eps));
        float rk = (float)(1.0 / sqrt(sk / (double)D + (double)sh->eps));
        float dd = (float)dot * rx * rk * dscale;
        /* spec §4.2.4: sign via copysign, +0 counts as positive */
        float g = op_sigmoid(copysignf(sqrtf(fmaxf(fabsf(dd), 1e-6f)), dd));
        for (int64_t d = 0; d < D; d++) x[d] += g * val[d];
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* madvise(WILLNEED) over the pages holding rows[0..n) of the table (sorted in place). A hint
 * only: failures are ignored and nothing is read here. */
static void prefetch_rows(const gguf_tensor *ple, int64_t *tmp, int64_t n) {
    static long pg;
    if (!pg) pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t base = (uintptr_t)ple->data;
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_i64);
    uintptr_t lo = 0, hi = 0; /* current page range [lo, hi) */
    for (int64_t i = 0; i < n; i++) {
        uintptr_t a = base + (uintptr_t)tmp[i] * ple->row_bytes;
        uintptr_t p0 = a & ~(uintptr_t)(pg - 1), p1 = (a + ple->row_bytes + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
        if (hi && p0 <= hi) {
            if (p1 > hi) hi = p1;
            continue;
        }
        if (hi) madvise((void *)lo, hi - lo, MADV_WILLNEED);
        lo = p0;
        hi = p1;
    }
    if (hi) madvise((void *)lo, hi - lo, MADV_WILLNEED);
}

/* Table row `row` as fp32 into out, read with pread (gguf_read_span): the table's pages are
 * mapped without huge pages and a decode step touches rows it never touched before (24 rows
 * per Engram layer). nowait: only if no disk read is needed; returns false otherwise. */
static bool gather_row(const gguf_file *g, const gguf_tensor *ple, int64_t row, float *out, int64_t pd, bool nowait) {
    _Alignas(64) uint8_t buf[8192];
    const uint8_t *src = gguf_read_span(g, ple->data + (uint64_t)row * ple->row_bytes, (size_t)ple->row_bytes, buf,
                                        sizeof buf, nowait);
    if (!src) return false;
    dequant_row(ple->type, src, out, pd);
    return true;
}

/* Gathers of the chunk's rows, threaded over rows (item i = row c of token t, i = t * cols +
 * c; each writes only its own erow slot). First pass (blocking = 0): the rows already in the
 * page cache, emiss[i] = 1 for the others; second pass: those, after their readahead. */
typedef struct {
    const fwd *f;
    const gguf_tensor *ple;
    int64_t pd;
    bool blocking;
} gather_job;

static void gather_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const gather_job *j = ctx;
    dsf_scratch *sc = j->f->sc;
    for (int64_t i = i0; i < i1; i++) {
        float *out = sc->erow + i * j->pd; /* erow is [T][cols * pd] */
        if (!j->blocking) sc->emiss[i] = !gather_row(j->f->e->gguf, j->ple, sc->rows[i], out, j->pd, true);
        else if (sc->emiss[i]) gather_row(j->f->e->gguf, j->ple, sc->rows[i], out, j->pd, false);
    }
}

void engram_forward(const fwd *f, int64_t il) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t e = sh->engram_of[il], T = f->T, D = sh->n_embd, hc = sh->hc;
    const int64_t cols = sh->ple_cols, pd = sh->ple_dim, nin = cols * pd;
    const gguf_tensor *ple = f->w->ple;
    /* Hash every token of the chunk first and read the rows already in the page cache; then
     * ask the kernel for the pages of all the others at once (sorted, de-duplicated, adjacent
     * pages merged) before reading them: the real model's table (~200 GB) is mostly not
     * resident (docs/perf-log.md, items 6 and 11). */
    for (int64_t t = 0; t < T; t++) engram_hash(sh, e, f->tkv[t]->tokens, f->tpos[t], sc->rows + t * cols);
    gather_job gj = {f, ple, pd, false};
    dsf_parallel_for_guided(f->e->pool, T * cols, 4, gather_range, &gj);
    int64_t m = 0;
    for (int64_t i = 0; i < T * cols; i++)
        if (sc->emiss[i]) sc->prow[m++] = sc->rows[i];
    if (m) {
        prefetch_rows(ple, sc->prow, m);
        gj.blocking = true;
        dsf_parallel_for_guided(f->e->pool, T * cols, 4, gather_range, &gj);
    }
    if (T == f->T) fwd_dump(f, "engram_rows", sc->rows, (size_t)(T * cols) * sizeof(int64_t));
    const float *xin = fwd_act(f, sc->erow, T, nin, sc->erow); /* in place: rows are not reused */
    const int64_t nout = (hc + 1) * D;
    fwd_mm_act(f, &L->engram_kv, xin, T, sc->ekv, nout);
    gate_job j = {f, L};
    dsf_parallel_for_guided(f->e->pool, T * hc, 16384 / D + 1, gate_range, &j);
}
