/* moe.c: the MoE FFN of one layer for a chunk (architecture.md §4.5): fp32 router,
 * sqrt-softplus scores, selection on score + bias (bias for selection only; bias_vl for an
 * image-span token, vision.md §6), weights
 * normalized with +1e-20 and scaled, SwiGLU clamped (gate: upper only, before silu; up:
 * both sides), routing weight applied before w2, accumulation in fp32 in increasing expert
 * id, then the shared expert. Tokens are grouped by expert so that each expert's weights
 * are read once per chunk.
 * Must not: change the accumulation order (increasing expert id, then the shared expert) in
 * any path: decode (moe_decode), prefill fp32 or BF16 (expert) give the same values. */
#include "model/moe.h"
#include "model/mm.h"
#include "model/dist.h"
#include "kernels/vec.h"
#include "kernels/select.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Row jobs of one expert call, threaded over its n gathered rows (each row written by one
 * chunk; an expert's rows belong to distinct tokens, so their acc rows are distinct). */
typedef struct {
    const dsf_akernels *k;
    dsf_scratch *sc;
    const int32_t *etok;
    const float *ewt;
    int64_t ff, D;
    float lim;
    const float *src; /* gather_range: the rows etok[] are copied from */
} rows_job;

/* z = silu(min(g, lim)) * clamp(u, -lim, lim) * wt  (lim <= 0: no clamp), in place in eg */
static void swiglu_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t k = k0; k < k1; k++)
        ka_swiglu(j->k, j->sc->eg + k * j->ff, j->sc->eg + k * j->ff, j->sc->eu + k * j->ff, j->ff, j->lim,
                  j->ewt ? j->ewt[k] : 1.0f);
}

/* ex[k] = src[etok[k]]: an expert's token rows, gathered by both threads (docs/perf-log.md,
 * "What decides decode speed here", the prefill paragraph after item 12). */
static void gather_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t k = k0; k < k1; k++)
        memcpy(j->sc->ex + k * j->D, j->src + (int64_t)j->etok[k] * j->D, (size_t)j->D * sizeof(float));
}

static void acc_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t k = k0; k < k1; k++) ka_add(j->k, j->sc->acc + (int64_t)j->etok[k] * j->D, j->sc->ey + k * j->D, j->D);
}

/* A stage member's expert outputs are kept, not added (dist_moe_begin/end add them in order):
 * row k into sc->ystore row sc->eslot[k]. */
static void keep_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t k = k0; k < k1; k++)
        memcpy(j->sc->ystore + (int64_t)j->sc->eslot[k] * j->D, j->sc->ey + k * j->D, (size_t)j->D * sizeof(float));
}

/* Reference mode, T > 1: the chunk's prepared inputs are converted to BF16 once per layer and
 * each expert gathers BF16 rows (gather_b_range) for its gate and up products; its down input
 * is made in one job (down_range: swiglu, the activation prep and the BF16 copy of each row).
 * Every product gets the same BF16 activations as fwd_mm_act would give it (QDQ'd values are
 * exact in BF16), so every value is the same; an expert takes 6 jobs instead of 10. */
typedef struct {
    const uint16_t *src;
    uint16_t *dst;
    const int32_t *etok;
    int64_t D;
} gather_b_job;

static void gather_b_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const gather_b_job *j = ctx;
    for (int64_t k = k0; k < k1; k++)
        memcpy(j->dst + k * j->D, j->src + (int64_t)j->etok[k] * j->D, (size_t)j->D * sizeof(uint16_t));
}

/* Rows [k0, k1) of the down input: eg = swiglu as swiglu_range; eu = its activation prep as
 * fwd_act makes it (QDQ per row: ff is a multiple of 32); sc->xb = BF16 of eu. */
typedef struct {
    const dsf_akernels *k;
    dsf_scratch *sc;
    const float *ewt;
    int64_t ff;
    float lim;
    atomic_int inexact;
} down_job;

static void down_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    down_job *j = ctx;
    const int64_t ff = j->ff;
    for (int64_t k = k0; k < k1; k++) {
        float *g = j->sc->eg + k * ff, *u = j->sc->eu + k * ff;
        ka_swiglu(j->k, g, g, u, ff, j->lim, j->ewt ? j->ewt[k] : 1.0f);
        memcpy(u, g, (size_t)ff * sizeof(float));
        ka_qdq_fp8(j->k, u, ff);
        if (!kern_act_to_bf16(u, j->sc->xb + k * ff, ff)) atomic_store(&j->inexact, 1);
    }
}

/* One expert FFN on n token rows, already through the activation prep (QDQ in reference
 * mode): xb, their BF16 copy (reference mode, moe_forward), or else xq [n][D]; adds into acc
 * rows etok[]. */
static void expert(const fwd *f, const dsf_wmat *wg, const dsf_wmat *wu, const dsf_wmat *wd, int64_t n,
                   const float *xq, const uint16_t *xb, const int32_t *etok, const float *ewt, float lim, bool keep) {
    dsf_scratch *sc = f->sc;
    const int64_t D = f->sh->n_embd, ff = wg->n_out;
    rows_job j = {akernels_get(), sc, etok, ewt, ff, D, lim, NULL};
    if (xb) {
        fwd_mm_xb(f, wg, xb, n, sc->eg, ff);
        fwd_mm_xb(f, wu, xb, n, sc->eu, ff);
        down_job dj = {j.k, sc, ewt, ff, lim, 0};
        dsf_parallel_for_guided(f->e->pool, n, 16384 / ff + 1, down_range, &dj);
        if (!atomic_load(&dj.inexact)) fwd_mm_xb(f, wd, sc->xb, n, sc->ey, D);
        else fwd_mm(f, wd, sc->eu, n, sc->ey, D); /* as fwd_mm_act does for a non-finite input */
    } else {
        fwd_mm_act(f, wg, xq, n, sc->eg, ff);
        fwd_mm_act(f, wu, xq, n, sc->eu, ff);
        dsf_parallel_for_guided(f->e->pool, n, 16384 / ff + 1, swiglu_range, &j);
        fwd_mm_act(f, wd, fwd_act(f, sc->eg, n, ff, sc->eu), n, sc->ey, D);
    }
    dsf_parallel_for_guided(f->e->pool, n, 16384 / D + 1, keep ? keep_range : acc_range, &j);
}

/* Decode, between and after the two product jobs, threaded: item i = expert slot i
 * (swiglu, then the activation prep of its down input), or a range of output elements (the
 * sum over the slots, in slot order). Every value is computed as in the serial form. */
typedef struct {
    const fwd *f;
    const dsf_akernels *k;
    const dsf_wmat *wg;
    const float *lim, *wt; /* per slot */
    int64_t ff, D, ns;
    const float **x; /* out: each slot's down input */
    float *out;
    bool add; /* out holds a stage member's partial sum (dist_moe_begin): add to it */
} dec_job;

static void dec_swiglu_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const dec_job *j = ctx;
    dsf_scratch *sc = j->f->sc;
    for (int64_t i = i0; i < i1; i++) {
        float *g = sc->eg + i * j->ff, *u = sc->eu + i * j->ff;
        const int64_t n = j->wg[i].n_out;
        ka_swiglu(j->k, g, g, u, n, j->lim[i], j->wt[i]);
        if (!j->f->ref) {
            j->x[i] = g;
            continue;
        }
        memcpy(u, g, (size_t)n * sizeof(float)); /* as fwd_act: the QDQ'd copy in u */
        ka_qdq_fp8(j->k, u, n);
        j->x[i] = u;
    }
}

static void dec_sum_range(void *ctx, int64_t d0, int64_t d1, int tid) {
    (void)tid;
    const dec_job *j = ctx;
    if (!j->add) memset(j->out + d0, 0, (size_t)(d1 - d0) * sizeof(float));
    for (int64_t i = 0; i < j->ns; i++) ka_add(j->k, j->out + d0, j->f->sc->ey + i * j->D + d0, d1 - d0);
}

/* Decode (one token): the top-k experts and the shared expert as two threaded jobs (all
 * gate/up products, then all down products) instead of seven calls per expert. Every value
 * is computed by the same operations as expert() does, and the outputs are added in the same
 * order (increasing expert id, then the shared expert), so the result is identical. */
static void moe_decode(const fwd *f, int64_t il, const float *vq, float *out) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    /* slots of the widest expert (the shared one is n_shared routed widths wide) */
    const int64_t D = sh->n_embd, K = sh->n_expert_used,
                  ff = L->gate_sh.n_out > L->gate_exps.n_out ? L->gate_sh.n_out : L->gate_exps.n_out;
    const dist_plan *dp = f->e->dist;
    const bool split = dp && dp->split_experts, shared = !split || dp->member == dp->members - 1;
    int32_t order[64];
    int64_t ne = 0;
    for (int64_t k = 0; k < K; k++) /* a stage member: only its experts (dist.h) */
        if (!split || dist_owns_expert(dp, sc->esel[k])) order[ne++] = (int32_t)k;
    for (int64_t a = 1; a < ne; a++) /* by expert id: the accumulation order */
        for (int64_t b = a; b > 0 && sc->esel[order[b - 1]] > sc->esel[order[b]]; b--) {
            int32_t tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    dsf_wmat wg[65], wu[65], wd[65];
    const dsf_wmat *w[130];
    const float *x[130];
    float *y[130];
    const int64_t ns = ne + (shared ? 1 : 0); /* slots: the experts, then the shared one */
    for (int64_t i = 0; i < ns; i++) {
        if (i < ne) {
            int64_t e = sc->esel[order[i]];
            wg[i] = wmat_expert(&L->gate_exps, e);
            wu[i] = wmat_expert(&L->up_exps, e);
            wd[i] = wmat_expert(&L->down_exps, e);
        } else {
            wg[i] = L->gate_sh;
            wu[i] = L->up_sh;
            wd[i] = L->down_sh;
        }
        w[2 * i] = &wg[i], x[2 * i] = vq, y[2 * i] = sc->eg + i * ff;
        w[2 * i + 1] = &wu[i], x[2 * i + 1] = vq, y[2 * i + 1] = sc->eu + i * ff;
    }
    if (ns) fwd_mm_act_multi(f, (int)(2 * ns), w, x, y);
    float lim[65], wt[65];
    for (int64_t i = 0; i < ns; i++) {
        lim[i] = i < ne ? sh->swiglu_exp[il] : sh->swiglu_shexp[il];
        wt[i] = i < ne ? sc->ewt[order[i]] : 1.0f;
    }
    dec_job dj = {f, akernels_get(), wg, lim, wt, ff, D, ns, x, out, split};
    if (ns) dsf_parallel_for_guided(f->e->pool, ns, 1, dec_swiglu_range, &dj);
    for (int64_t i = 0; i < ns; i++) {
        w[i] = &wd[i];
        y[i] = sc->ey + i * D;
    }
    if (ns) fwd_mm_act_multi(f, (int)ns, w, x, y);
    /* the sum in increasing expert id, then the shared expert (sc->acc is not needed here); a
     * stage member continues the previous member's sum and passes it on */
    if (split) dist_moe_begin(f, out);
    dsf_parallel_for_guided(f->e->pool, D, 1024, dec_sum_range, &dj);
    if (split) dist_moe_end(f, out);
}

/* A stage member's outputs, added in increasing expert id to the previous member's sum, then
 * the shared expert on the last member (dist.h): the single process's order of additions. */
static void member_sum(const fwd *f, float *acc) {
    const dist_plan *dp = f->e->dist;
    const dsf_scratch *sc = f->sc;
    const dsf_akernels *k = akernels_get();
    const int64_t T = f->T, D = f->sh->n_embd, K = f->sh->n_expert_used;
    dist_moe_begin(f, acc);
    for (int64_t t = 0; t < T; t++) {
        const int32_t *sel = sc->esel + t * K;
        for (int64_t i = 0; i < K; i++) { /* position i in increasing id: the i-th smallest */
            int32_t e = -1;
            for (int64_t a = 0; a < K; a++) {
                int64_t below = 0;
                for (int64_t b = 0; b < K; b++) below += sel[b] < sel[a];
                if (below == i) e = sel[a];
            }
            if (dist_owns_expert(dp, e)) ka_add(k, acc + t * D, sc->ystore + (t * (K + 1) + i) * D, D);
        }
        if (dp->member == dp->members - 1) ka_add(k, acc + t * D, sc->ystore + (t * (K + 1) + K) * D, D);
    }
    dist_moe_end(f, acc);
}

void moe_forward(const fwd *f, int64_t il, const float *v, float *out) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, D = sh->n_embd, E = sh->n_expert, K = sh->n_expert_used;
    fwd_mm(f, &L->router, v, T, sc->rlog, E);
    for (int64_t t = 0; t < T; t++) {
        float *lg = sc->rlog + t * E;
        for (int64_t e = 0; e < E; e++) lg[e] = sqrtf(op_softplus(lg[e]));
        /* select on score + bias; sc->blk is free here and holds the biased scores */
        float *biased = sc->att;
        /* vision.md §6: an image-span position selects with bias_vl, per token */
        const float *bias = fwd_span(f, t) ? L->exp_bias_vl : L->exp_bias;
        for (int64_t e = 0; e < E; e++) biased[e] = lg[e] + bias[e];
        int32_t *sel = sc->esel + t * K;
        op_topk(biased, E, K, sel, sc->heap);
        float *wt = sc->ewt + t * K, sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += (wt[k] = lg[sel[k]]);
        for (int64_t k = 0; k < K; k++) {
            /* [R] Gate.forward renormalizes only when top-k > 1 (dspark.md §4.2) */
            if (sh->expert_weights_norm && K > 1) wt[k] /= (sum + 1e-20f);
            wt[k] *= sh->expert_weights_scale;
        }
    }
    fwd_dump(f, "moe_indices", sc->esel, (size_t)(T * K) * sizeof(int32_t));
    fwd_dump(f, "moe_weights", sc->ewt, (size_t)(T * K) * sizeof(float));
    /* the activation prep is per row: once per token here, not once per (token, expert) */
    const float *vq = fwd_act(f, v, T, D, sc->exq);
    if (T == 1 && K <= 64) {
        moe_decode(f, il, vq, out);
        return;
    }
    const dist_plan *dp = f->e->dist;
    const bool split = dp && dp->split_experts; /* keep this member's outputs (member_sum) */
    if (!split) memset(sc->acc, 0, (size_t)(T * D) * sizeof(float));
    const float lim = sh->swiglu_exp[il];
    /* the BF16 inputs (expert's BF16 path) in sc->ex, which holds 2 x T x D of them: the chunk's,
     * then an expert's gathered rows. A non-finite input keeps the fp32 path for the layer, and
     * so do FFN widths that are not a multiple of 32 (down_range's QDQ is per row, fwd_act's
     * then runs over the whole chunk), and the Q8_K mode. */
    uint16_t *vqb = (uint16_t *)(void *)sc->ex, *exb = vqb + T * D;
    const char *knob = dsf_knob("DSF_MOE_XB"); /* "0": the fp32 path (tests compare the two) */
    /* the Q8_K mode's products take fwd_mm_act, never BF16 copies */
    const bool q8 = fwd_q8k_on(f, &L->gate_exps) || fwd_q8k_on(f, &L->up_exps) || fwd_q8k_on(f, &L->down_exps) ||
                    fwd_q8k_on(f, &L->gate_sh) || fwd_q8k_on(f, &L->up_sh) || fwd_q8k_on(f, &L->down_sh);
    const bool xb = f->ref && !q8 && !(knob && strcmp(knob, "0") == 0) && L->gate_exps.n_out % 32 == 0 &&
                    L->gate_sh.n_out % 32 == 0 && fwd_to_bf16(f, vq, T, D, vqb);
    for (int64_t e = split ? dp->e0 : 0; e < (split ? dp->e1 : E); e++) { /* increasing expert id: the fp32 accumulation order */
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (sc->esel[t * K + k] == e) {
                    sc->etok[n] = (int32_t)t;
                    sc->ewtok[n] = sc->ewt[t * K + k];
                    if (split) { /* its row in ystore: the token's position of e in increasing id */
                        int32_t below = 0;
                        for (int64_t b = 0; b < K; b++) below += sc->esel[t * K + b] < e;
                        sc->eslot[n] = (int32_t)(t * (K + 1) + below);
                    }
                    n++;
                }
        if (!n) continue;
        dsf_wmat wg = wmat_expert(&L->gate_exps, e), wu = wmat_expert(&L->up_exps, e),
                 wd = wmat_expert(&L->down_exps, e);
        if (xb) {
            gather_b_job g = {vqb, exb, sc->etok, D};
            dsf_parallel_for_guided(f->e->pool, n, 32768 / D + 1, gather_b_range, &g);
            expert(f, &wg, &wu, &wd, n, NULL, exb, sc->etok, sc->ewtok, lim, split);
            continue;
        }
        rows_job g = {NULL, sc, sc->etok, NULL, 0, D, 0.0f, vq};
        dsf_parallel_for_guided(f->e->pool, n, 16384 / D + 1, gather_range, &g);
        expert(f, &wg, &wu, &wd, n, sc->ex, NULL, sc->etok, sc->ewtok, lim, split);
    }
    for (int64_t t = 0; t < T; t++) {
        sc->etok[t] = (int32_t)t;
        if (split) sc->eslot[t] = (int32_t)(t * (K + 1) + K);
    }
    if (!split || dp->member == dp->members - 1)
        expert(f, &L->gate_sh, &L->up_sh, &L->down_sh, T, vq, xb ? vqb : NULL, sc->etok, NULL, sh->swiglu_shexp[il], split);
    if (split) member_sum(f, sc->acc);
    memcpy(out, sc->acc, (size_t)(T * D) * sizeof(float));
}
