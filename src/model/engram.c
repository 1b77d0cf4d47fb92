/* engram.c: Engram n-gram memory (architecture.md §4.2): the per-position hash over the
 * compressed token history and the gated add into every hyper-connection copy, applied to
 * the stream BEFORE its block. Image-span positions (vision.md §7) are DEAD in the history
 * and get gate 0. The table is read row by row, never whole: the chunk's rows
 * of every module are hashed at the start of the forward and read by the engine's reader
 * pool (engram_io.c) while the layers before each module compute.
 * Must not: map or read the table whole, or read the file itself (engram_io.c does); write
 * stream rows other than its layer's input.
 * Invariant: each stream row (token, copy) is written by exactly one range of a job. */
#include "model/engram.h"
#include "model/engram_io.h"
#include "model/mm.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>

void engram_hash(const dsf_shape *sh, int64_t e, const int32_t *tokens, int64_t p, int64_t *rows) {
    engram_hash_spans(sh, e, tokens, NULL, p, rows);
}

void engram_hash_spans(const dsf_shape *sh, int64_t e, const int32_t *tokens, const uint8_t *vtype, int64_t p,
                       int64_t *rows) {
    const int64_t ng = sh->ngram, nh = sh->heads_per_ngram, cols = sh->ple_cols;
    const uint64_t *mult = sh->ple_mult + e * ng;
    const uint64_t *off = sh->ple_offset + e * cols, *size = sh->ple_size + e * cols;
    uint64_t tk[8];
    int blocked = 0;
    for (int64_t s = 0; s < ng; s++) {
        int64_t c = DSF_ENGRAM_DEAD;
        if (p - s >= 0 && !(vtype && vtype[p - s])) { /* vision.md §7: a span position is DEAD */
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
        if (fwd_span(j->f, t)) continue; /* vision.md §7: gate 0 at a span position, the stream as it is */
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

/* The chunk's rows of module m: hashed for every token, then queued for the readers. */
static void start_module(const fwd *f, int m) {
    const dsf_shape *sh = f->sh;
    const int64_t cols = sh->ple_cols;
    int64_t *rows = engram_req_rows(f->sc->ereq, m);
    for (int64_t t = 0; t < f->T; t++)
        engram_hash_spans(sh, m, f->tkv[t]->tokens, f->tkv[t]->vtype, f->tpos[t], rows + t * cols);
    engram_io_start(f->e->eio, f->sc->ereq, m, f->T * cols);
}

void engram_start(const fwd *f, int64_t l0, int64_t l1) {
    for (int m = 0; m < (int)f->sh->n_engram; m++)
        if (f->sh->engram_layer[m] >= l0 && f->sh->engram_layer[m] < l1) start_module(f, m);
}

/* The chunk's rows of one module decoded into erow, threaded over rows (item i = row c of
 * token t, i = t * cols + c; each writes only its own erow slot). */
typedef struct {
    const fwd *f;
    const gguf_tensor *ple;
    int64_t pd;
    int m;
} gather_job;

static void gather_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const gather_job *j = ctx;
    dsf_scratch *sc = j->f->sc;
    for (int64_t i = i0; i < i1; i++) /* erow is [T][cols * pd] */
        dequant_row(j->ple->type, engram_req_row(sc->ereq, j->m, i), sc->erow + i * j->pd, j->pd);
}

void engram_forward(const fwd *f, int64_t il) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t e = sh->engram_of[il], T = f->T, D = sh->n_embd, hc = sh->hc;
    const int64_t cols = sh->ple_cols, pd = sh->ple_dim, nin = cols * pd;
    const gguf_tensor *ple = f->w->ple;
    const int m = (int)e;
    DSF_ASSERT(sc->ereq && f->e->eio);
    /* the reads started with the forward (engram_start); a caller that runs this layer alone
     * starts them here */
    if (!engram_req_started(sc->ereq, m)) start_module(f, m);
    if (engram_io_wait(f->e->eio, sc->ereq, m, NULL) < 0) return; /* the forward's caller reports it */
    gather_job gj = {f, ple, pd, m};
    dsf_parallel_for_guided(f->e->pool, T * cols, 4, gather_range, &gj);
    if (T == f->T) fwd_dump(f, "engram_rows", engram_req_rows(sc->ereq, m), (size_t)(T * cols) * sizeof(int64_t));
    const float *xin = fwd_act(f, sc->erow, T, nin, sc->erow); /* in place: rows are not reused */
    const int64_t nout = (hc + 1) * D;
    fwd_mm_act(f, &L->engram_kv, xin, T, sc->ekv, nout);
    gate_job j = {f, L};
    dsf_parallel_for_guided(f->e->pool, T * hc, 16384 / D + 1, gate_range, &j);
}
