/* attn.c: attention of one layer for a chunk of tokens (architecture.md §4.4): the layer's
 * RoPE tables, q LoRA, the window KV, then (compressor.c, indexer.c) the compressed rows and
 * their selection, the joint softmax over window + selected compressed rows + sink (§4.4.8),
 * and the grouped output projection (§4.4.9).
 * Must not: compute the compressor's or the indexer's arithmetic (their files).
 * Invariant: every query sees exactly the rows it would see in decode (§5.2). */
#include "model/attn.h"
#include "model/mm.h"
#include "kernels/vec.h"
#include "kernels/select.h"
#include "kernels/ops.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

/* ---- RoPE tables ------------------------------------------------------------------------ */

static const float *rope_table(const fwd *f, int64_t il) {
    return f->sh->ratio[il] > 0 ? f->e->rope.freq_compress : f->e->rope.freq_main;
}

typedef struct {
    const fwd *f;
    const float *freq;
} rtab_job;

static void rtab_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const rtab_job *j = ctx;
    const int64_t nrot = j->f->sh->n_rot;
    for (int64_t t = t0; t < t1; t++) ka_rope_table(j->f->sc->rcs + t * nrot, nrot, j->freq, j->f->tpos[t]);
}

/* The chunk's tables for a layer with frequencies freq: a token's query heads, KV row, index
 * queries and attention outputs all take its table, built once per layer (docs/perf-log.md,
 * item 40). */
static void rope_tables(const fwd *f, const float *freq) {
    rtab_job j = {f, freq};
    dsf_parallel_for_guided(f->e->pool, f->T, 16, rtab_range, &j);
}

/* ---- attention core ------------------------------------------------------------------- */

#define ATT_MAX_KEYS 2048 /* keys of one query on the threaded path (stack arrays) */
#define ATT_HEADS 4       /* heads per work item (the kernels reuse each key row across them) */

/* Token t's query heads in the chunk scratch (rows padded by DSF_Q_PAD floats, session.h). */
static int64_t q_stride(const dsf_shape *sh) { return sh->n_head * sh->head_dim + DSF_Q_PAD; }
static float *q_tok(const fwd *f, int64_t t) { return f->sc->q + t * q_stride(f->sh); }

typedef struct {
    const fwd *f;
    const dsf_akernels *k;
    int64_t il;
    float scale;
} core_job;

/* Per token: the q LoRA norm. */
static void qnorm_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const core_job *j = ctx;
    const dsf_shape *sh = j->f->sh;
    dsf_scratch *sc = j->f->sc;
    const int64_t ql = sh->q_lora;
    for (int64_t t = t0; t < t1; t++)
        ka_rmsnorm(j->k, sc->qr + t * ql, sc->qa + t * ql, j->f->w->layers[j->il].q_norm, ql, sh->eps);
}

/* Per token: RoPE of the query heads; the window KV row (norm, RoPE, FP8 QDQ) at position p. */
static void qkv_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const core_job *j = ctx;
    const fwd *f = j->f;
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[j->il];
    dsf_scratch *sc = f->sc;
    const int64_t H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t p = f->tpos[t];
        rope_rows(f, q_tok(f, t) + dh - nrot, H, dh, t, 0);
        float *kv = kv_win(f->tkv[t], j->il, p, dh);
        ka_rmsnorm(j->k, kv, sc->kvw + t * dh, L->kv_norm, dh, sh->eps);
        rope_rows(f, kv + dh - nrot, 1, dh, t, 0);
        if (f->ref) ka_qdq_fp8(j->k, kv, dh); /* all dims, RoPE tail included (spec §4.4.2) */
    }
}

/* The keys query t sees, in the joint softmax's order: its window rows w0..p, then the
 * selected compressed rows. Returns their count (<= window + idx_topk). */
static int64_t query_keys(const fwd *f, int64_t il, int64_t t, const float **keys) {
    const dsf_shape *sh = f->sh;
    const dsf_kvstate *tk = f->tkv[t];
    const int64_t dh = sh->head_dim, W = sh->window, r = sh->ratio[il];
    const int64_t p = f->tpos[t], w0 = p - W + 1 > 0 ? p - W + 1 : 0;
    const int64_t nw = p - w0 + 1, ns = r > 0 ? f->sc->n_sel[t] : 0;
    const float *ckv = r > 0 ? tk->ckv[sh->kv_src[il]] : NULL;
    const int32_t *sel = f->sc->sel + t * f->sc->ksel;
    for (int64_t k = 0; k < nw; k++) keys[k] = kv_win(tk, il, w0 + k, dh);
    for (int64_t k = 0; k < ns; k++) keys[nw + k] = ckv + (int64_t)sel[k] * dh;
    return nw + ns;
}

/* Items i = g*T + t: heads [4g, 4g+4) of token t. Group-major order gives every chunk the same
 * share of each token (early tokens see fewer keys), and each item writes only its output
 * rows o[t][h], so the result does not depend on the split. */
static void core_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const core_job *j = ctx;
    const fwd *f = j->f;
    const dsf_shape *sh = f->sh;
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot;
    const float *sinks = f->w->layers[j->il].attn_sinks;
    const float *keys[ATT_MAX_KEYS];
    float att[ATT_HEADS * ATT_MAX_KEYS];
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i % T, h = i / T * ATT_HEADS, n = H - h < ATT_HEADS ? H - h : ATT_HEADS;
        const int64_t nk = query_keys(f, j->il, t, keys);
        /* one joint softmax over window + selected rows; the sink is a raw logit in the
         * denominator only (kernels/vec.h) */
        const float *q = q_tok(f, t) + h * dh;
        ka_attn(j->k, sc->o + (t * H + h) * dh, q, n, dh, keys, nk, j->scale, sinks + h, att);
        rope_rows(f, sc->o + (t * H + h) * dh + dh - nrot, n, dh, t, 1);
    }
}

/* The same for one token, serially with the session's scratch: shapes whose key count
 * exceeds the threaded path's stack arrays. */
static void core_token_scalar(const fwd *f, int64_t il, int64_t t, float scale) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot, W = sh->window, r = sh->ratio[il];
    const dsf_kvstate *tk = f->tkv[t];
    const float *ckv = r > 0 ? f->tkv[t]->ckv[sh->kv_src[il]] : NULL;
    const int64_t p = f->tpos[t], w0 = p - W + 1 > 0 ? p - W + 1 : 0;
    const int64_t nw = p - w0 + 1, ns = r > 0 ? sc->n_sel[t] : 0, nk = nw + ns;
    for (int64_t h = 0; h < H; h++) {
        const float *q = q_tok(f, t) + h * dh;
        float m = L->attn_sinks[h];
        for (int64_t k = 0; k < nk; k++) {
            const float *key = k < nw ? kv_win(tk, il, w0 + k, dh) : ckv + (int64_t)sc->sel[t * sc->ksel + k - nw] * dh;
            float d = 0.0f;
            for (int64_t x = 0; x < dh; x++) d += q[x] * key[x];
            sc->att[k] = d * scale;
            m = fmaxf(m, sc->att[k]);
        }
        /* one joint softmax; the sink is a raw logit in the denominator only */
        float den = expf(L->attn_sinks[h] - m);
        float *o = sc->o + (t * H + h) * dh;
        memset(o, 0, (size_t)dh * sizeof(float));
        for (int64_t k = 0; k < nk; k++) {
            const float *key = k < nw ? kv_win(tk, il, w0 + k, dh) : ckv + (int64_t)sc->sel[t * sc->ksel + k - nw] * dh;
            float pk = expf(sc->att[k] - m);
            den += pk;
            for (int64_t x = 0; x < dh; x++) o[x] += pk * key[x];
        }
        for (int64_t x = 0; x < dh; x++) o[x] /= den;
        op_rope(o + dh - nrot, nrot, rope_table(f, il), p, 1);
    }
}

/* o [T][og x gin] -> q [og][T][gin]: item i = g * T + t. */
typedef struct {
    const float *o;
    float *q;
    int64_t T, og, gin;
} split_job;

static void split_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const split_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t g = i / j->T, t = i % j->T;
        memcpy(j->q + i * j->gin, j->o + (t * j->og + g) * j->gin, (size_t)j->gin * sizeof(float));
    }
}

void attn_forward(const fwd *f, int64_t il, const float *u, float *out) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, H = sh->n_head, dh = sh->head_dim, W = sh->window;
    const int64_t ql = sh->q_lora, r = sh->ratio[il];
    rope_tables(f, rope_table(f, il));

    const float *uq = fwd_act(f, u, T, sh->n_embd, sc->uq);
    if (T == 1) { /* decode: wq_a and wkv (same input) in one job */
        const dsf_wmat *w2[2] = {&L->wq_a, &L->wkv};
        const float *x2[2] = {uq, uq};
        float *y2[2] = {sc->qa, sc->kvw};
        fwd_mm_act_multi(f, 2, w2, x2, y2);
    } else fwd_mm_act(f, &L->wq_a, uq, T, sc->qa, ql);
    core_job cj = {f, akernels_get(), il, (float)(1.0 / sqrt((double)dh))};
    dsf_parallel_for_guided(f->e->pool, T, 16384 / ql + 1, qnorm_range, &cj);
    const float *qrq = fwd_act(f, sc->qr, T, ql, sc->qrq);
    fwd_mm_act(f, &L->wq_b, qrq, T, sc->q, q_stride(sh));
    if (T > 1) fwd_mm_act(f, &L->wkv, uq, T, sc->kvw, dh);
    dsf_parallel_for_guided(f->e->pool, T, 8, qkv_range, &cj);
    if (r > 0) {
        if (sh->kv_src[il] == il) compressor_forward(f, il, u);
        if (sh->topk_src[il] == il) indexer_forward(f, il, u);
    }
    if (W + sc->ksel <= ATT_MAX_KEYS) {
        /* items: head groups x tokens; >= ~64K multiply-adds per chunk */
        int64_t grain = 65536 / (ATT_HEADS * dh * (W + (r > 0 ? sc->ksel : 0))) + 1;
        dsf_parallel_for_guided(f->e->pool, (H + ATT_HEADS - 1) / ATT_HEADS * T, grain, core_range, &cj);
    } else {
        for (int64_t t = 0; t < T; t++) core_token_scalar(f, il, t, cj.scale);
    }
    /* grouped wo_a (a BF16 product in the reference: no activation quant), then wo_b */
    const int64_t og = sh->o_groups, olr = sh->o_lora, gin = H * dh / og;
    if (T == 1 && og <= 64) { /* decode: the og products in one job (one join instead of og) */
        dsf_wmat wg[64];
        const dsf_wmat *wp[64];
        const float *xp[64];
        float *yp[64];
        for (int64_t g = 0; g < og; g++) {
            wg[g] = wmat_rows(&L->wo_a, g * olr, olr);
            wp[g] = &wg[g], xp[g] = sc->o + g * gin, yp[g] = sc->ya + g * olr;
        }
        fwd_mm_multi(f, (int)og, wp, xp, yp);
    } else {
        /* every group's inputs contiguous (group-major) in sc->q, free after the core */
        split_job sj = {sc->o, sc->q, T, og, gin};
        dsf_parallel_for_guided(f->e->pool, T * og, 16, split_range, &sj);
        for (int64_t g = 0; g < og; g++) {
            dsf_wmat wg = wmat_rows(&L->wo_a, g * olr, olr);
            fwd_mm(f, &wg, sc->q + g * T * gin, T, sc->ya + g * olr, og * olr);
        }
    }
    const float *yaq = fwd_act(f, sc->ya, T, og * olr, sc->yaq);
    fwd_mm_act(f, &L->wo_b, yaq, T, out, sh->n_embd);
}
