/* dspark.c: the DSpark draft's arithmetic and per-sequence state (dspark.md §3-§4, §6): the
 * target-feature switch of a main session, the per-stage rings written from committed
 * positions' features (§4.1), and one draft call (§4.2): the block [anchor, noise x (B-1)]
 * through the lagged-mHC stages (forward_layer with the block attention plugged in: every row
 * sees the ring positions <= p and all B block rows, no causal mask, the sink), the final
 * collapse with the last FFN pre, the main model's head, then the sequential Markov chain and
 * the confidence head.
 * Must not: touch the main model's state (its session only supplies features), or sample with
 * anything but softmax(l / tau).
 * Invariant: only dspark_seq_commit writes the rings; a draft call leaves the sequence as it
 * was (its scratch aside). */
#include "model/dspark_impl.h"
#include "model/forward.h"
#include "model/dist.h"
#include "model/mm.h"
#include "model/hc.h"
#include "kernels/select.h"
#include "kernels/vec.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dsf_dspark_seq {
    dsf_dspark *d;
    dsf_scratch sc;    /* T <= B + 1 rows of the draft's shape */
    float *ring;       /* [S][W][dh]: position pos at row pos % W */
    int64_t lo, hi;    /* ring positions held: [lo, hi) */
    float *fq;         /* [T][feat_dim] features' activation prep */
    float *bk;         /* [B][dh] the block's own keys */
    float *att;        /* [B][heads / 4][4][W + B]: the attention core's scores, per item */
    float *lrow, *prow;/* [V] a logits row and its probabilities when the caller takes none */
    const float **keys;/* [W + B] */
    float *xc, *base;  /* [B][D] final collapse, [B][V] head logits (before the Markov term) */
    float *erow, *cin; /* [R] Markov embedding, [D + R] confidence input */
};

/* ---- target features on the main session (dspark.md §3) ------------------------------- */

int dsf_session_set_features(dsf_session *s, const int32_t *layers, int n, char *err) {
    dsf_kvstate *kv = &s->kv;
    const dsf_shape *sh = &s->e->shape;
    if (n < 0 || n > 64) return dsf_seterr(err, "target features: %d layers (want 0..64)", n);
    if (n && s->e->dist && s->e->dist->n_stages > 1) /* the layers' streams are on other ranks */
        return dsf_seterr(err, "target features (DSpark) need every layer on rank 0: not with --parallel pipeline");
    for (int i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] >= sh->n_layer || (i && layers[i] <= layers[i - 1]))
            return dsf_seterr(err, "target features: layer %d is out of range or out of order", layers[i]);
    free(kv->feat);
    free(kv->feat_of);
    kv->feat = NULL;
    kv->feat_of = NULL;
    kv->nfeat = 0;
    if (n == 0) return 0;
    kv->fslots = kv->wslots;
    kv->feat = calloc((size_t)(kv->fslots * n * sh->n_embd), sizeof(float));
    if (!kv->feat) return dsf_seterr(err, "out of memory for the target features (%lld positions)", (long long)kv->fslots);
    kv->feat_of = dsf_xmalloc((size_t)sh->n_layer * sizeof(int32_t));
    for (int64_t il = 0; il < sh->n_layer; il++) kv->feat_of[il] = -1;
    for (int i = 0; i < n; i++) kv->feat_of[layers[i]] = i;
    kv->nfeat = n;
    kv->feat_lo = kv->n; /* the positions consumed so far were not recorded */
    return 0;
}

const float *dsf_session_feature(const dsf_session *s, int pos) {
    const dsf_kvstate *kv = &s->kv;
    /* fslots == wslots: the rows of positions >= win_lo are intact, as the window KV's */
    if (!kv->feat || pos < 0 || pos >= kv->n || pos < kv->win_lo || pos < kv->feat_lo) return NULL;
    return kv->feat + (int64_t)(pos % kv->fslots) * kv->nfeat * s->e->shape.n_embd;
}

/* ---- the sequence state ---------------------------------------------------------------- */

dsf_dspark_seq *dspark_seq_new(dsf_dspark *d, char *err) {
    const dsf_shape *sh = &d->de.shape;
    const int64_t B = d->block, T = B + 1, W = sh->window, dh = sh->head_dim, D = sh->n_embd;
    dsf_dspark_seq *q = dsf_xcalloc(1, sizeof *q);
    q->d = d;
    size_t bytes = 0;
    if (scratch_init(&q->sc, sh, T, W + B, 0, &bytes) < 0) { /* the draft's rings are fp32 */
        free(q);
        dsf_seterr(err, "out of memory allocating the draft's scratch");
        return NULL;
    }
    /* the fc product's BF16 copies are feat_dim wide */
    if (q->sc.xb_cap < T * sh->n_feat_in) {
        free(q->sc.xb);
        q->sc.xb = dsf_xmalloc((size_t)(T * sh->n_feat_in) * sizeof(uint16_t));
        q->sc.xb_cap = T * sh->n_feat_in;
    }
    q->ring = dsf_xcalloc((size_t)(sh->n_layer * W * dh), sizeof(float));
    q->fq = dsf_xmalloc((size_t)(T * sh->n_feat_in) * sizeof(float));
    q->bk = dsf_xmalloc((size_t)(B * dh) * sizeof(float));
    q->att = dsf_xmalloc((size_t)(B * ((sh->n_head + 3) / 4) * 4 * (W + B)) * sizeof(float));
    q->keys = dsf_xmalloc((size_t)(W + B) * sizeof(float *));
    q->xc = dsf_xmalloc((size_t)(B * D) * sizeof(float));
    q->base = dsf_xmalloc((size_t)(B * sh->n_vocab) * sizeof(float));
    q->erow = dsf_xmalloc((size_t)sh->markov_rank * sizeof(float));
    q->cin = dsf_xmalloc((size_t)(D + sh->markov_rank) * sizeof(float));
    q->lrow = dsf_xmalloc((size_t)sh->n_vocab * sizeof(float));
    q->prow = dsf_xmalloc((size_t)sh->n_vocab * sizeof(float));
    return q;
}

void dspark_seq_free(dsf_dspark_seq *q) {
    if (!q) return;
    scratch_free(&q->sc);
    void *p[] = {q->ring, q->fq, q->bk, q->att, (void *)q->keys, q->xc, q->base, q->erow, q->cin, q->lrow, q->prow};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    free(q);
}

void dspark_seq_reset(dsf_dspark_seq *q, int64_t n_past) {
    if (n_past >= q->hi) return;
    /* positions >= n_past that were written overwrote the slots of hi - W .. n_past - 1 */
    int64_t lo = q->hi - q->d->de.shape.window;
    if (lo > q->lo) q->lo = lo;
    q->hi = n_past;
    if (q->lo > q->hi) q->lo = q->hi;
}

void dspark_seq_range(const dsf_dspark_seq *q, int64_t *lo, int64_t *hi) {
    *lo = q->lo;
    *hi = q->hi;
}

const float *dspark_ring_entry(const dsf_dspark_seq *q, int s, int64_t pos) {
    const dsf_shape *sh = &q->d->de.shape;
    if (s < 0 || s >= sh->n_layer || pos < q->lo || pos >= q->hi) return NULL;
    return q->ring + (s * sh->window + pos % sh->window) * sh->head_dim;
}

const float *dspark_last_xc(const dsf_dspark_seq *q) { return q->xc; }
const float *dspark_last_base(const dsf_dspark_seq *q) { return q->base; }

static float *ring_row(const dsf_dspark_seq *q, int64_t s, int64_t pos) {
    const dsf_shape *sh = &q->d->de.shape;
    return q->ring + (s * sh->window + pos % sh->window) * sh->head_dim;
}

static fwd seq_fwd(dsf_dspark_seq *q, int64_t T);

/* K = QDQ_FP8(RoPE(RMSNorm(kv; kv_norm), pos)) in place (dspark.md §4.1, §4.2; QDQ in the
 * reference numerics only). cs: scratch for the RoPE table. */
static void key_finish(const fwd *f, const float *kv_norm, float *k, const float *kvw, int64_t pos, float *cs) {
    const dsf_shape *sh = f->sh;
    const dsf_akernels *ak = akernels_get();
    ka_rmsnorm(ak, k, kvw, kv_norm, sh->head_dim, sh->eps);
    ka_rope_table(cs, sh->n_rot, f->e->rope.freq_main, pos);
    ka_rope_apply(k + sh->head_dim - sh->n_rot, sh->n_rot, cs, 0);
    if (f->ref) ka_qdq_fp8(ak, k, sh->head_dim);
}

/* Ring entries of T positions pos0.. from their features (§4.1): x = RMSNorm(fc . f; main_norm)
 * once, then every stage's wkv / kv_norm / RoPE at the feature's position. */
static void commit_rows(dsf_dspark_seq *q, const float *feat, int64_t pos0, int64_t T) {
    const dsf_dspark *d = q->d;
    const dsf_shape *sh = &d->de.shape;
    const dsf_weights *w = &d->de.w;
    dsf_scratch *sc = &q->sc;
    const int64_t D = sh->n_embd, dh = sh->head_dim;
    fwd f = seq_fwd(q, T);
    const float *fx = fwd_act(&f, feat, T, sh->n_feat_in, q->fq);
    fwd_mm_act(&f, &w->fc, fx, T, sc->h, D);
    for (int64_t t = 0; t < T; t++) ka_rmsnorm(akernels_get(), sc->u + t * D, sc->h + t * D, w->enc_norm, D, sh->eps);
    const float *xq = fwd_act(&f, sc->u, T, D, sc->uq);
    for (int64_t s = 0; s < sh->n_layer; s++) {
        const dsf_layer *L = &w->layers[s];
        fwd_mm_act(&f, &L->wkv, xq, T, sc->kvw, dh);
        for (int64_t t = 0; t < T; t++) key_finish(&f, L->kv_norm, ring_row(q, s, pos0 + t), sc->kvw + t * dh, pos0 + t, sc->rcs);
    }
}

void dspark_seq_commit(dsf_dspark_seq *q, const float *feat, int64_t pos0, int64_t n) {
    const int64_t W = q->d->de.shape.window, fd = q->d->de.shape.n_feat_in, tmax = q->sc.max_chunk;
    if (n <= 0) return;
    if (pos0 != q->hi) q->lo = q->hi = pos0; /* not contiguous: the rings restart */
    if (n > W) { /* only the last W positions stay in the rings */
        feat += (n - W) * fd;
        pos0 += n - W;
        q->lo = q->hi = pos0;
        n = W;
    }
    for (int64_t i = 0; i < n; i += tmax) {
        int64_t T = n - i < tmax ? n - i : tmax;
        commit_rows(q, feat + i * fd, pos0 + i, T);
    }
    q->hi = pos0 + n;
    if (q->hi - W > q->lo) q->lo = q->hi - W;
}

/* ---- the block attention (§4.2) ------------------------------------------------------------ */

/* The attention core of the block, threaded: item i = (row t, heads [4g, 4g + 4)); every row
 * sees the same keys; each item writes only its own output heads (then their inverse RoPE). */
#define CORE_HEADS 4

typedef struct {
    const fwd *f;
    const float *sinks;
    const float *const *keys;
    int64_t nk;
    float scale;
} core_job;

static void core_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const core_job *j = ctx;
    const dsf_shape *sh = j->f->sh;
    const int64_t H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot, ng = (H + CORE_HEADS - 1) / CORE_HEADS;
    dsf_dspark_seq *q = j->f->attn_user;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / ng, h0 = i % ng * CORE_HEADS, nh = H - h0 < CORE_HEADS ? H - h0 : CORE_HEADS;
        float *o = j->f->sc->o + (t * H + h0) * dh;
        float *att = q->att + i * CORE_HEADS * j->nk; /* [items][4][nk]: one private slice per item */
        ka_attn(akernels_get(), o, j->f->sc->q + (t * H + h0) * dh, nh, dh, j->keys, j->nk, j->scale, j->sinks + h0, att);
        for (int64_t h = 0; h < nh; h++) ka_rope_apply(o + h * dh + dh - nrot, nrot, j->f->sc->rcs + t * nrot, 1);
    }
}

/* Stage il's attention for the B block rows at positions p+1..p+B: the keys are the ring
 * entries of max(0, p-W+1)..p and the B block keys, the same set for every row. */
static void block_attn(const fwd *f, int64_t il, const float *u, float *out) {
    dsf_dspark_seq *q = f->attn_user;
    const dsf_shape *sh = f->sh;
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const dsf_akernels *ak = akernels_get();
    const int64_t T = f->T, D = sh->n_embd, H = sh->n_head, dh = sh->head_dim, nrot = sh->n_rot, ql = sh->q_lora;
    const int64_t W = sh->window, p = f->tpos[0] - 1, c0 = p - W + 1 > 0 ? p - W + 1 : 0;
    const float *uq = fwd_act(f, u, T, D, sc->uq);
    fwd_mm_act(f, &L->wq_a, uq, T, sc->qa, ql);
    for (int64_t t = 0; t < T; t++) ka_rmsnorm(ak, sc->qr + t * ql, sc->qa + t * ql, L->q_norm, ql, sh->eps);
    const float *qrq = fwd_act(f, sc->qr, T, ql, sc->qrq);
    fwd_mm_act(f, &L->wq_b, qrq, T, sc->q, H * dh);
    fwd_mm_act(f, &L->wkv, uq, T, sc->kvw, dh);
    for (int64_t t = 0; t < T; t++) {
        key_finish(f, L->kv_norm, q->bk + t * dh, sc->kvw + t * dh, f->tpos[t], sc->rcs + t * nrot);
        for (int64_t h = 0; h < H; h++) ka_rope_apply(sc->q + (t * H + h) * dh + dh - nrot, nrot, sc->rcs + t * nrot, 0);
    }
    int64_t nk = 0;
    for (int64_t pos = c0; pos <= p; pos++) q->keys[nk++] = ring_row(q, il, pos);
    for (int64_t t = 0; t < T; t++) q->keys[nk++] = q->bk + t * dh;
    core_job cj = {f, L->attn_sinks, q->keys, nk, (float)(1.0 / sqrt((double)dh))};
    dsf_parallel_for_guided(f->e->pool, T * ((H + CORE_HEADS - 1) / CORE_HEADS), 1, core_range, &cj);
    /* grouped wo_a (fp32, no activation quant), then wo_b (architecture.md §4.4.9) */
    const int64_t og = sh->o_groups, olr = sh->o_lora, gin = H * dh / og;
    for (int64_t g = 0; g < og; g++) {
        for (int64_t t = 0; t < T; t++) memcpy(sc->q + t * gin, sc->o + t * H * dh + g * gin, (size_t)gin * sizeof(float));
        dsf_wmat wg = wmat_rows(&L->wo_a, g * olr, olr);
        fwd_mm(f, &wg, sc->q, T, sc->ya + g * olr, og * olr);
    }
    const float *yaq = fwd_act(f, sc->ya, T, og * olr, sc->yaq);
    fwd_mm_act(f, &L->wo_b, yaq, T, out, D);
}

static fwd seq_fwd(dsf_dspark_seq *q, int64_t T) {
    const dsf_engine *de = &q->d->de;
    fwd f = {de, &de->shape, &de->w, &q->sc, q->sc.tkv, q->sc.tpos, T, de->numerics == DSF_NUMERICS_REFERENCE,
             false, block_attn, q, NULL};
    return f;
}

/* ---- one draft call ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* argmax (first of equal maxima) at tau = 0; else probs = softmax(l / tau) (fp32, as [R]
 * sample) and a draw from it with *rng. */
static int32_t pick(const float *l, int64_t V, float tau, uint64_t *rng, float *probs) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    if (!(tau > 0.0f)) return (int32_t)best;
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) sum += (probs[i] = expf((l[i] - l[best]) / tau));
    for (int64_t i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
    double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53, c = 0.0;
    for (int64_t i = 0; i < V; i++) {
        c += probs[i];
        if (u < c) return (int32_t)i;
    }
    return (int32_t)best; /* rounding: u above the last partial sum */
}

/* The stages over the block and the head: q->xc, q->base. */
static void run_block(dsf_dspark_seq *q, int64_t p, int32_t anchor) {
    const dsf_dspark *d = q->d;
    const dsf_shape *sh = &d->de.shape;
    dsf_scratch *sc = &q->sc;
    const int64_t B = d->block, D = sh->n_embd, hc = sh->hc;
    fwd f = seq_fwd(q, B);
    for (int64_t t = 0; t < B; t++) {
        sc->tpos[t] = p + 1 + t;
        wmat_dequant_row(&d->main->w.tok_embd, t ? d->noise : anchor, sc->h);
        for (int64_t c = 0; c < hc; c++) memcpy(sc->X + (t * hc + c) * D, sc->h, (size_t)D * sizeof(float));
        for (int64_t c = 0; c < hc; c++) sc->pre[t * hc + c] = c == 0 ? 1.0f : 0.0f; /* make_identity_pre_mix */
    }
    for (int64_t s = 0; s < sh->n_layer; s++) forward_layer(&f, s);
    hc_collapse(&f, sc->X, sc->pre, q->xc); /* the last stage's FFN pre; no hc_head */
    hc_norm_rows(&f, sc->fin, q->xc, d->de.w.output_norm, 0);
    fwd_mm(&f, &d->main->w.output, sc->fin, B, q->base, sh->n_vocab);
}

int dspark_draft(dsf_dspark_seq *q, int64_t p, int32_t anchor, int n, float tau, uint64_t *rng, int32_t *ids,
                 float *logits, float *probs, float *conf, char *err) {
    const dsf_dspark *d = q->d;
    const dsf_shape *sh = &d->de.shape;
    const dsf_weights *w = &d->de.w;
    const int64_t V = sh->n_vocab, D = sh->n_embd, R = sh->markov_rank, W = sh->window;
    if (n < 0 || n > d->block) return dsf_seterr(err, "draft: %d tokens asked, the block drafts at most %d", n, d->block);
    if (anchor < 0 || anchor >= V) return dsf_seterr(err, "draft: anchor %d is outside the vocabulary", anchor);
    const int64_t need = p - W + 1 > 0 ? p - W + 1 : 0;
    if (p < 0 || q->hi != p + 1 || q->lo > need)
        return dsf_seterr(err, "draft after position %lld: the rings hold positions %lld..%lld, it needs %lld..%lld",
                          (long long)p, (long long)q->lo, (long long)q->hi - 1, (long long)need, (long long)p);
    if (tau > 0.0f && !rng) return dsf_seterr(err, "draft: sampling at tau > 0 needs an rng state");
    run_block(q, p, anchor);
    fwd f = seq_fwd(q, 1);
    int32_t prev = anchor;
    for (int i = 0; i < n; i++) {
        float *li = logits ? logits + (int64_t)i * V : q->lrow;
        wmat_dequant_row(&w->markov_w1, prev, q->erow); /* e_i = markov_w1[prev] */
        fwd_mm(&f, &w->markov_w2, q->erow, 1, li, V);
        const float *bi = q->base + (int64_t)i * V;
        for (int64_t v = 0; v < V; v++) li[v] = bi[v] + li[v];
        memcpy(q->cin, q->xc + (int64_t)i * D, (size_t)D * sizeof(float));
        memcpy(q->cin + D, q->erow, (size_t)R * sizeof(float));
        float c = 0.0f;
        for (int64_t k = 0; k < D + R; k++) c += w->conf_proj[k] * q->cin[k];
        if (conf) conf[i] = c;
        ids[i] = pick(li, V, tau, rng, probs ? probs + (int64_t)i * V : q->prow);
        prev = ids[i];
    }
    return n;
}
