/* attn.c: attention of one layer for a chunk of tokens (architecture.md §4.4): q LoRA, the
 * window KV, the compressor of KV source layers (§4.4.4) with its index keys, the lightning
 * indexer with top-k and the two-level candidate blocks (§4.4.5-4.4.7), the joint softmax
 * over window + selected compressed rows + sink (§4.4.8), and the grouped output projection
 * (§4.4.9). Every query sees exactly the rows it would see in decode (§5.2). */
#include "model/forward.h"
#include "kernels/vec.h"
#include "kernels/select.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

static const float *rope_table(const fwd *f, int64_t il) {
    return f->sh->ratio[il] > 0 ? f->e->rope.freq_compress : f->e->rope.freq_main;
}

/* The cos/sin table of the layer's frequencies at token t's position, sc->rcs + t * n_rot
 * (built once per layer by rope_tables: every head of a token rotates by the same angles). */
static const float *rope_cs(const fwd *f, int64_t t) { return f->sc->rcs + t * f->sh->n_rot; }

/* RoPE of n rows (stride apart) of token t with the layer's table. */
static void rope_rows(const fwd *f, float *x, int64_t n, int64_t stride, int64_t t, int inverse) {
    const int64_t nrot = f->sh->n_rot;
    for (int64_t i = 0; i < n; i++) ka_rope_apply(x + i * stride, nrot, rope_cs(f, t), inverse);
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
 * queries and attention outputs all take its table. (Built where used, a decode step made
 * 18 per layer, each n_rot / 2 cos and sin in double; the same values.) */
static void rope_tables(const fwd *f, const float *freq) {
    rtab_job j = {f, freq};
    dsf_parallel_for_guided(f->e->pool, f->T, 16, rtab_range, &j);
}

/* ---- compressor (KV source layers) ------------------------------------------------------ */

typedef struct {
    const fwd *f;
    int64_t il;
} emit_job;

/* Latents [k0, k1): each row's index key and compressed KV row, written to its own slots. */
static void emit_range(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const emit_job *ej = ctx;
    const fwd *f = ej->f;
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[ej->il];
    const dsf_scratch *sc = f->sc;
    const dsf_akernels *ak = akernels_get();
    const int64_t il = ej->il, dh = sh->head_dim, id = sh->idx_dim, nrot = sh->n_rot, r = sh->ratio[il];
    const float *freq = f->e->rope.freq_compress;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t j = sc->tjrow[k];
        dsf_kvstate *kv = sc->tjkv[k];
        float *ik = kv->ik[il] + j * id;
        op_rmsnorm(ik, sc->ikt + k * id, L->idx_k_norm, id, sh->eps);
        op_rope(ik + id - nrot, nrot, freq, j * r, 0);
        if (f->ref) ka_qdq_fp4(ak, ik, id);
        float *c = kv->ckv[il] + j * dh;
        memcpy(c, sc->lat + k * dh, (size_t)dh * sizeof(float));
        op_rope(c + dh - nrot, nrot, freq, j * r, 0);
        if (f->ref) ka_qdq_fp4_e4m3(ak, c, dh);
    }
}

/* Emits the compressed rows of the nr latents in sc->lat: latent k becomes row sc->tjrow[k]
 * of sequence sc->tjkv[k] (source layer il). Rows are independent: a prefill's are a job. */
static void emit_rows(const fwd *f, int64_t il, int64_t nr) {
    if (nr <= 0) return;
    /* index keys from the pre-RoPE latent (spec §4.4.4) */
    fwd_mm(f, &f->w->layers[il].idx_k, f->sc->lat, nr, f->sc->ikt, f->sh->idx_dim);
    emit_job ej = {f, il};
    if (nr < 8) emit_range(&ej, 0, nr, 0);
    else dsf_parallel_for_guided(f->e->pool, nr, 4, emit_range, &ej);
}

static void compressor(const fwd *f, int64_t il, const float *u) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, dh = sh->head_dim, r = sh->ratio[il];
    if (r == 1) {
        /* ratio 1: plain norm(wkv . u), no gate, no activation quant (spec §4.4.4) */
        fwd_mm(f, &L->comp_wkv, u, T, sc->ca, dh);
        for (int64_t t = 0; t < T; t++) {
            op_rmsnorm(sc->lat + t * dh, sc->ca + t * dh, L->comp_norm, dh, sh->eps);
            sc->tjrow[t] = f->tpos[t];
            sc->tjkv[t] = f->tkv[t];
        }
        emit_rows(f, il, T);
        return;
    }
    DSF_ASSERT(r == 2);
    if (T == 1) { /* decode: both products in one job */
        const dsf_wmat *w2[2] = {&L->comp_wkv, &L->comp_wgate};
        const float *x2[2] = {u, u};
        float *y2[2] = {sc->ca, sc->cg};
        fwd_mm_multi(f, 2, w2, x2, y2);
    } else {
        fwd_mm(f, &L->comp_wkv, u, T, sc->ca, dh);
        fwd_mm(f, &L->comp_wgate, u, T, sc->cg, dh);
    }
    int64_t nr = 0;
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = f->tpos[t];
        if ((p + 1) % 2) continue;
        const float *a0, *g0;
        if (t >= 1 && f->tkv[t - 1] == f->tkv[t]) {
            a0 = sc->ca + (t - 1) * dh;
            g0 = sc->cg + (t - 1) * dh;
        } else { /* the group started in an earlier forward: its first token is carried */
            a0 = f->tkv[t]->carry[il];
            g0 = a0 + dh;
        }
        const float *a1 = sc->ca + t * dh, *g1 = sc->cg + t * dh;
        float *z = sc->lat + nr * dh;
        for (int64_t d = 0; d < dh; d++) {
            /* per-channel softmax over the group's two gate scores, fp32 */
            float m = fmaxf(g0[d], g1[d]);
            float e0 = expf(g0[d] - m), e1 = expf(g1[d] - m), s = e0 + e1;
            z[d] = (e0 / s) * a0[d] + (e1 / s) * a1[d];
        }
        op_rmsnorm(z, z, L->comp_norm, dh, sh->eps);
        sc->tjrow[nr] = (p - 1) / 2;
        sc->tjkv[nr] = f->tkv[t];
        nr++;
    }
    /* a sequence whose last token leaves a group incomplete carries that token's (a, g) */
    for (int64_t t = 0; t < T; t++) {
        if (t + 1 < T && f->tkv[t + 1] == f->tkv[t]) continue;
        if ((f->tpos[t] + 1) % 2) {
            float *carry = f->tkv[t]->carry[il];
            memcpy(carry, sc->ca + t * dh, (size_t)dh * sizeof(float));
            memcpy(carry + dh, sc->cg + t * dh, (size_t)dh * sizeof(float));
        }
    }
    emit_rows(f, il, nr);
}

/* ---- lightning indexer, top-k, candidate blocks ------------------------------------------ */

/* One query's index scores over a row range (each row written by exactly one chunk). */
typedef struct {
    const dsf_akernels *k;
    float *scores;
    const float *q, *w, *ik;
    int64_t ih, id;
    const uint8_t *cmask;
    int64_t B;
} index_job;

static void index_range(void *ctx, int64_t j0, int64_t j1, int tid) {
    (void)tid;
    const index_job *j = ctx;
    ka_index(j->k, j->scores, j->q, j->w, j->ik, j0, j1, j->ih, j->id, j->cmask, j->B);
}

/* Per token: RoPE on the index queries, their FP4 QDQ (reference), the head weights' scale. */
typedef struct {
    const fwd *f;
    float wscale;
} iprep_job;

static void iprep_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const iprep_job *j = ctx;
    const fwd *f = j->f;
    const dsf_shape *sh = f->sh;
    dsf_scratch *sc = f->sc;
    const int64_t ih = sh->idx_heads, id = sh->idx_dim, nrot = sh->n_rot;
    for (int64_t t = t0; t < t1; t++) {
        rope_rows(f, sc->iq + t * ih * id + id - nrot, ih, id, t, 0); /* the layer's table: freq_compress */
        if (f->ref) ka_qdq_fp4(akernels_get(), sc->iq + t * ih * id, ih * id); /* groups of 32 within each head */
        for (int64_t h = 0; h < ih; h++) sc->iw[t * ih + h] *= j->wscale;
    }
}

bool attn_index_projects(const dsf_shape *sh, int64_t il, int64_t p_last, int64_t ksel, int64_t kcand) {
    const int64_t r = sh->ratio[il];
    if (r <= 0 || sh->topk_src[il] != il) return false;
    /* the most compressed rows a query of the chunk sees (positions rise within a chunk) */
    const int64_t C_last = (p_last + 1) / r, B = sh->cand_block > 0 ? sh->cand_block : 1;
    return C_last > ksel || (il == sh->cand_src && (C_last + B - 1) / B > kcand);
}

static void indexer(const fwd *f, int64_t il, const float *u) {
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, ih = sh->idx_heads, id = sh->idx_dim, r = sh->ratio[il];
    const int64_t src = sh->kv_src[il], K = sc->ksel;
    const int is_cand_src = il == sh->cand_src;
    const int restricted = sh->cand_src >= 0 && il > sh->cand_src;
    const int64_t B = sh->cand_block;
    int64_t p_last = 0;
    for (int64_t t = 0; t < T; t++)
        if (f->tpos[t] > p_last) p_last = f->tpos[t];
    if (attn_index_projects(sh, il, p_last, K, sc->kcand)) {
        const float *qrq = fwd_act(f, sc->qr, T, sh->q_lora, sc->qrq);
        fwd_mm_act(f, &L->idx_q_b, qrq, T, sc->iq, ih * id);
        fwd_mm(f, &L->idx_proj, u, T, sc->iw, ih);
        iprep_job pj = {f, (float)(1.0 / sqrt((double)id) / sqrt((double)ih))};
        dsf_parallel_for_guided(f->e->pool, T, 1, iprep_range, &pj);
    }
    for (int64_t t = 0; t < T; t++) {
        const float *ik = f->tkv[t]->ik[src];
        const int64_t p = f->tpos[t], C = (p + 1) / r;
        int32_t *sel = sc->sel + t * K;
        if (C == 0) {
            sc->n_sel[t] = 0;
            if (is_cand_src) sc->n_cand[t] = 0;
            continue;
        }
        const int64_t nb = (C + B - 1) / (B ? B : 1);
        const int scores_needed = C > K || (is_cand_src && nb > sc->kcand);
        if (!scores_needed) {
            for (int64_t j = 0; j < C; j++) sel[j] = (int32_t)j;
            sc->n_sel[t] = C;
            if (is_cand_src) { /* every block is a candidate */
                for (int64_t b = 0; b < nb; b++) sc->cand[t * sc->kcand + b] = (int32_t)b;
                sc->n_cand[t] = nb;
            }
            continue;
        }
        /* candidate restriction: only rows of the candidate blocks published for this query */
        if (restricted) {
            memset(sc->cmask, 0, (size_t)nb);
            for (int64_t c = 0; c < sc->n_cand[t]; c++) {
                int64_t b = sc->cand[t * sc->kcand + c];
                if (b < nb) sc->cmask[b] = 1;
            }
        }
        /* scores[j] = sum_h w_h relu(q_h . ik_j), -inf outside the candidates; rows threaded */
        index_job ij = {akernels_get(), sc->scores, sc->iq + t * ih * id, sc->iw + t * ih, ik, ih, id,
                        restricted ? sc->cmask : NULL, B ? B : 1};
        int64_t grain = 65536 / (ih * id) + 1; /* >= ~64K multiply-adds per chunk */
        dsf_parallel_for_guided(f->e->pool, C, grain, index_range, &ij);
        if (is_cand_src) {
            /* two-level candidates (spec §4.4.6): block max, newest block pinned */
            for (int64_t b = 0; b < nb; b++) {
                float m = -INFINITY;
                for (int64_t j = b * B; j < (b + 1) * B && j < C; j++) m = fmaxf(m, sc->scores[j]);
                sc->blk[b] = m;
            }
            sc->blk[(C - 1) / B] = INFINITY;
            int32_t *cand = sc->cand + t * sc->kcand;
            int64_t nc = op_topk(sc->blk, nb, sc->kcand, cand, sc->heap);
            int64_t m = 0;
            for (int64_t c = 0; c < nc; c++)
                if (sc->blk[cand[c]] > -INFINITY) cand[m++] = cand[c];
            sc->n_cand[t] = m;
        }
        if (C <= K) {
            for (int64_t j = 0; j < C; j++) sel[j] = (int32_t)j;
            sc->n_sel[t] = C;
            continue;
        }
        /* top-K; rows outside the candidates (-inf) only fill up if fewer than K remain,
         * lowest index first (the reference leaves that case implementation-defined) */
        int64_t n = op_topk(sc->scores, C, K, sel, sc->heap);
        sc->n_sel[t] = n;
    }
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
         * denominator only (kernels_attn.h) */
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
        if (sh->kv_src[il] == il) compressor(f, il, u);
        if (sh->topk_src[il] == il) indexer(f, il, u);
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
            wg[g] = L->wo_a;
            wg[g].n_out = olr;
            wg[g].data = L->wo_a.data + (uint64_t)(g * olr) * L->wo_a.row_bytes;
            wp[g] = &wg[g], xp[g] = sc->o + g * gin, yp[g] = sc->ya + g * olr;
        }
        fwd_mm_multi(f, (int)og, wp, xp, yp);
    } else {
        /* every group's inputs contiguous (group-major) in sc->q, free after the core */
        split_job sj = {sc->o, sc->q, T, og, gin};
        dsf_parallel_for_guided(f->e->pool, T * og, 16, split_range, &sj);
        for (int64_t g = 0; g < og; g++) {
            dsf_wmat wg = L->wo_a;
            wg.n_out = olr;
            wg.data = L->wo_a.data + (uint64_t)(g * olr) * L->wo_a.row_bytes;
            fwd_mm(f, &wg, sc->q + g * T * gin, T, sc->ya + g * olr, og * olr);
        }
    }
    const float *yaq = fwd_act(f, sc->ya, T, og * olr, sc->yaq);
    fwd_mm_act(f, &L->wo_b, yaq, T, out, sh->n_embd);
}
