/* engram.c: Engram n-gram memory (architecture.md §4.2): the per-position hash over the
 * compressed token history and the gated add into every hyper-connection copy, applied to
 * the stream BEFORE its block. The table is read row by row, never whole. */
#include "fwd.h"
#include "ops.h"
#include "quant.h"

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

/* The gated add of each token's Engram value into its hc copies, threaded over tokens (each
 * token's stream rows are written by exactly one chunk). */
typedef struct {
    const fwd *f;
    const dsf_layer *L;
} gate_job;

static void gate_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const gate_job *j = ctx;
    const dsf_shape *sh = j->f->sh;
    const dsf_layer *L = j->L;
    dsf_scratch *sc = j->f->sc;
    const int64_t D = sh->n_embd, hc = sh->hc, nout = (hc + 1) * D;
    const float dscale = (float)(1.0 / sqrt((double)D));
    for (int64_t t = t0; t < t1; t++) {
        const float *kv = sc->ekv + t * nout, *val = kv + hc * D;
        for (int64_t c = 0; c < hc; c++) {
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
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* madvise(WILLNEED) over the pages holding rows[0..n) of the table (tmp: n int64 scratch).
 * A hint only: failures are ignored and nothing is read here. */
static void prefetch_rows(const gguf_tensor *ple, const int64_t *rows, int64_t n, int64_t *tmp) {
    static long pg;
    if (!pg) pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t base = (uintptr_t)ple->data;
    for (int64_t i = 0; i < n; i++) tmp[i] = rows[i];
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

/* Row `row` of the table as fp32 into out. Reads it with pread when the model is a file:
 * the table's pages are mapped without huge pages and a decode step touches rows it never
 * touched before, and a first touch through the mapping is a page fault each (~20 us under a
 * hypervisor, 24 rows per Engram layer), where a pread of the cached page costs ~1 us. A
 * failed or short read (or a row too long for the buffer) falls back to the mapping. */
static void gather_row(const gguf_file *g, const gguf_tensor *ple, int64_t row, float *out, int64_t pd) {
    _Alignas(64) uint8_t buf[8192];
    const uint8_t *src = ple->data + (uint64_t)row * ple->row_bytes;
    if (g && g->fd >= 0 && ple->row_bytes <= sizeof buf && src >= g->map && src + ple->row_bytes <= g->map + g->size &&
        pread(g->fd, buf, (size_t)ple->row_bytes, (off_t)(src - g->map)) == (ssize_t)ple->row_bytes)
        src = buf;
    dequant_row(ple->type, src, out, pd);
}

void engram_forward(const fwd *f, int64_t il) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t e = sh->engram_of[il], T = f->T, D = sh->n_embd, hc = sh->hc;
    const int64_t cols = sh->ple_cols, pd = sh->ple_dim, nin = cols * pd;
    const gguf_tensor *ple = f->w->ple;
    /* Hash every token of the chunk first, then ask the kernel for all the table pages at
     * once (sorted, de-duplicated, adjacent pages merged) before gathering: on the real model
     * the table is ~400 GB and mostly not resident, so one batch of readahead beats faulting
     * the rows in one by one. */
    for (int64_t t = 0; t < T; t++) engram_hash(sh, e, f->tkv[t]->tokens, f->tpos[t], sc->rows + t * cols);
    prefetch_rows(ple, sc->rows, T * cols, sc->prow);
    for (int64_t t = 0; t < T; t++) {
        const int64_t *rows = sc->rows + t * cols;
        for (int64_t c = 0; c < cols; c++) gather_row(f->e->gguf, ple, rows[c], sc->erow + t * nin + c * pd, pd);
    }
    if (T == f->T) fwd_dump(f, "engram_rows", sc->rows, (size_t)(T * cols) * sizeof(int64_t));
    const float *xin = fwd_act(f, sc->erow, T, nin, sc->erow); /* in place: rows are not reused */
    const int64_t nout = (hc + 1) * D;
    fwd_mm_act(f, &L->engram_kv, xin, T, sc->ekv, nout);
    gate_job j = {f, L};
    dsf_parallel_for(f->e->pool, T, 16384 / (hc * D) + 1, gate_range, &j);
}
