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
#include "kernels/quant.h"
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
    int64_t t0, tn; /* the core's tokens [t0, t0 + tn) */
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
        const dsf_kvstate *tk = f->tkv[t];
        uint8_t *row = kv_win(tk, j->il, p);
        /* a packed row is built in the product's scratch row, then packed */
        float *kv = tk->packed ? sc->kvw + t * dh : (float *)row;
        ka_rmsnorm(j->k, kv, sc->kvw + t * dh, L->kv_norm, dh, sh->eps);
        rope_rows(f, kv + dh - nrot, 1, dh, t, 0);
        /* all dims, RoPE tail included (spec §4.4.2); packed: the same QDQ, stored as codes */
        if (tk->packed) qdq_fp8_e8m0_pack(kv, dh, row, row + dh);
        else if (f->ref) ka_qdq_fp8(j->k, kv, dh);
    }
}

/* Key k of query t (the order of query_keys): packed state, its decoded row in the scratch
 * (decode_keys); fp32, the row itself. */
static const float *key_row(const fwd *f, int64_t il, int64_t t, int64_t k, int64_t w0, int64_t nw) {
    const dsf_kvstate *tk = f->tkv[t];
    const dsf_scratch *sc = f->sc;
    if (tk->packed) return sc->kdec + (sc->koff[t] + k) * f->sh->head_dim;
    if (k < nw) return (const float *)kv_win(tk, il, w0 + k);
    return (const float *)kv_ckv(tk, f->sh->kv_src[il], sc->sel[t * sc->ksel + k - nw]);
}

/* Query t's window rows [w0, w0 + nw) and selected compressed rows (ns). */
static void key_range(const fwd *f, int64_t il, int64_t t, int64_t *w0, int64_t *nw, int64_t *ns) {
    const int64_t W = f->sh->window, p = f->tpos[t];
    *w0 = p - W + 1 > 0 ? p - W + 1 : 0;
    *nw = p - *w0 + 1;
    *ns = f->sh->ratio[il] > 0 ? f->sc->n_sel[t] : 0;
}

/* ---- packed keys: decoded per token into the scratch ----------------------------------- */

typedef struct {
    const fwd *f;
    const dsf_akernels *k;
} kdec_job;

static void kdec_range(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const kdec_job *j = ctx;
    const dsf_scratch *sc = j->f->sc;
    const int64_t dh = j->f->sh->head_dim;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = sc->kptr[r];
        if (sc->kfmt[r] == 0) ka_unpack_fp8(j->k, sc->kdec + r * dh, p, p + dh, dh);
        else ka_unpack_fp4_e4m3(j->k, sc->kdec + r * dh, p, p + dh / 2, dh);
    }
}

/* The keys of tokens [t0, t1) decoded into sc->kdec (at most kdec_tok tokens): token t's
 * from row koff[t], in query_keys' order. Decoding is exact, so the core sees the values an
 * fp32 state holds. */
static void decode_keys(const fwd *f, const dsf_akernels *k, int64_t il, int64_t t0, int64_t t1) {
    dsf_scratch *sc = f->sc;
    const int64_t src = f->sh->kv_src[il];
    int64_t rows = 0;
    for (int64_t t = t0; t < t1; t++) {
        const dsf_kvstate *tk = f->tkv[t];
        int64_t w0, nw, ns;
        key_range(f, il, t, &w0, &nw, &ns);
        DSF_ASSERT(rows + nw + ns <= sc->kdec_rows);
        sc->koff[t] = rows;
        for (int64_t i = 0; i < nw; i++, rows++) sc->kptr[rows] = kv_win(tk, il, w0 + i), sc->kfmt[rows] = 0;
        for (int64_t i = 0; i < ns; i++, rows++)
            sc->kptr[rows] = kv_ckv(tk, src, sc->sel[t * sc->ksel + i]), sc->kfmt[rows] = 1;
    }
    kdec_job j = {f, k};
    dsf_parallel_for_guided(f->e->pool, rows, 32, kdec_range, &j);
}

/* The keys query t sees, in the joint softmax's order: its window rows w0..p, then the
 * selected compressed rows. Returns their count (<= window + idx_topk). */
static int64_t query_keys(const fwd *f, int64_t il, int64_t t, const float **keys) {
    int64_t w0, nw, ns;
    key_range(f, il, t, &w0, &nw, &ns);
    for (int64_t k = 0; k < nw + ns; k++) keys[k] = key_row(f, il, t, k, w0, nw);
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
    const int64_t T = j->tn, H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot;
    const float *sinks = f->w->layers[j->il].attn_sinks;
    const float *keys[ATT_MAX_KEYS];
    float att[ATT_HEADS * ATT_MAX_KEYS];
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = j->t0 + i % T, h = i / T * ATT_HEADS, n = H - h < ATT_HEADS ? H - h : ATT_HEADS;
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
    const int64_t H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot, p = f->tpos[t];
    int64_t w0, nw, ns;
    key_range(f, il, t, &w0, &nw, &ns);
    const int64_t nk = nw + ns;
    for (int64_t h = 0; h < H; h++) {
        const float *q = q_tok(f, t) + h * dh;
        float m = L->attn_sinks[h];
        for (int64_t k = 0; k < nk; k++) {
            const float *key = key_row(f, il, t, k, w0, nw);
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
            const float *key = key_row(f, il, t, k, w0, nw);
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
    core_job cj = {f, akernels_get(), il, (float)(1.0 / sqrt((double)dh)), 0, T};
    dsf_parallel_for_guided(f->e->pool, T, 16384 / ql + 1, qnorm_range, &cj);
    const float *qrq = fwd_act(f, sc->qr, T, ql, sc->qrq);
    fwd_mm_act(f, &L->wq_b, qrq, T, sc->q, q_stride(sh));
    if (T > 1) fwd_mm_act(f, &L->wkv, uq, T, sc->kvw, dh);
    dsf_parallel_for_guided(f->e->pool, T, 8, qkv_range, &cj);
    if (r > 0) {
        if (sh->kv_src[il] == il) compressor_forward(f, il, u);
        if (sh->topk_src[il] == il) indexer_forward(f, il, u);
    }
    /* packed state (the batch's sessions all store alike, session.c): the core runs on
     * groups of kdec_tok tokens whose keys are decoded first */
    const int64_t tstep = f->tkv[0]->packed ? sc->kdec_tok : T;
    for (int64_t t0 = 0; t0 < T; t0 += tstep) {
        const int64_t t1 = T - t0 < tstep ? T : t0 + tstep;
        if (f->tkv[0]->packed) decode_keys(f, cj.k, il, t0, t1);
        cj.t0 = t0, cj.tn = t1 - t0;
        if (W + sc->ksel <= ATT_MAX_KEYS) {
            /* items: head groups x tokens; >= ~64K multiply-adds per chunk */
            int64_t grain = 65536 / (ATT_HEADS * dh * (W + (r > 0 ? sc->ksel : 0))) + 1;
            dsf_parallel_for_guided(f->e->pool, (H + ATT_HEADS - 1) / ATT_HEADS * cj.tn, grain, core_range, &cj);
        } else {
            for (int64_t t = t0; t < t1; t++) core_token_scalar(f, il, t, cj.scale);
        }
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
