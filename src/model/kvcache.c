/* kvcache.c: allocation of the per-sequence state and of the chunk scratch (session.h).
 *
 * Owns: the sizes of every session array, from the shape, max_ctx and max_chunk, and the
 * bytes they take (reported through *bytes); the row storage (packed in reference numerics,
 * spec §5.1, or fp32) and its row sizes.
 * Must not: compute anything, or leave a half-built state (a failed allocation frees all).
 * Invariant: everything is sized up front; the token loop never allocates. */
#include "model/session.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Arrays of 1 MiB or more (the KV rows of a layer) go in 2 MiB pages: the attention reads
 * them after each layer's weight stream has evicted its TLB entries, and under a hypervisor
 * every 4 KiB miss is a nested page walk (docs/perf-log.md, item 10). Zeroed here, like
 * calloc. */
#define KDEC_BYTES ((size_t)16 << 20) /* attn.c's decoded keys: 12 tokens of the released shape */
#define KDEC_TOK 16
#define HUGE_MIN ((size_t)1 << 20)
#define HUGE_PAGE ((size_t)2 << 20)
/* fail == NULL: only counts n into *bytes (scratch_bytes' dry run of scratch_init) */
static void *take(size_t n, size_t *bytes, int *fail) {
    if (!fail) {
        *bytes += n;
        return NULL;
    }
    if (*fail) return NULL;
    void *p = NULL;
    if (n >= HUGE_MIN) {
        size_t r = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        if (posix_memalign(&p, HUGE_PAGE, r) != 0) p = NULL;
#ifdef MADV_HUGEPAGE
        if (p) madvise(p, r, MADV_HUGEPAGE);
#endif
        if (p) memset(p, 0, n);
    } else {
        p = calloc(n ? n : 1, 1);
    }
    if (!p) *fail = 1;
    *bytes += n;
    return p;
}

int kv_pack_default(int ref) {
    const char *k = dsf_knob("DSF_KV_PACK");
    return ref && !(k && atoi(k) == 0);
}

int kv_row_bytes(const dsf_shape *s, int packed, int64_t *wrow, int64_t *crow, int64_t *irow) {
    const int64_t dh = s->head_dim, id = s->idx_dim; /* multiples of 32 (shape.c) */
    /* the indexer decodes packed keys in blocks on the stack (indexer.c): keys wider than a
     * block stay fp32 */
    packed = packed && id <= KV_IDX_DEC;
    if (packed) { /* spec §5.1: e4m3 + E8M0 per 32; e2m1 + e4m3 per 16; e2m1 + E8M0 per 32 */
        *wrow = dh + dh / 32;
        *crow = dh / 2 + dh / 16;
        *irow = id / 2 + id / 32;
    } else {
        *wrow = dh * (int64_t)sizeof(float);
        *crow = dh * (int64_t)sizeof(float);
        *irow = id * (int64_t)sizeof(float);
    }
    return packed;
}

int kv_init(dsf_kvstate *kv, const dsf_shape *s, int64_t max_ctx, int64_t max_chunk, int packed, size_t *bytes,
            char *err) {
    return kv_init_held(kv, s, max_ctx, max_chunk, packed, NULL, NULL, bytes, err);
}

int kv_init_held(dsf_kvstate *kv, const dsf_shape *s, int64_t max_ctx, int64_t max_chunk, int packed,
                 const uint8_t *hold, const uint8_t *hold_src, size_t *bytes, char *err) {
    memset(kv, 0, sizeof *kv);
    kv->max_ctx = max_ctx;
    kv->packed = kv_row_bytes(s, packed, &kv->wrow, &kv->crow, &kv->irow);
    int64_t margin = DSF_ROLLBACK_MARGIN;
    const char *km = dsf_knob("DSF_ROLLBACK_MARGIN"); /* tests shrink the ring to exercise it */
    if (km && atoll(km) >= 0) margin = atoll(km);
    kv->wslots = s->window + max_chunk + margin;
    if (kv->wslots > max_ctx) kv->wslots = max_ctx;
    int fail = 0;
    const size_t L = (size_t)s->n_layer, F = sizeof(float);
    kv->tokens = take((size_t)max_ctx * sizeof(int32_t), bytes, &fail);
    kv->win = dsf_xcalloc(L, sizeof(uint8_t *));
    kv->ckv = dsf_xcalloc(L, sizeof(uint8_t *));
    kv->ik = dsf_xcalloc(L, sizeof(uint8_t *));
    kv->carry = dsf_xcalloc(L, sizeof(float *));
    for (int64_t il = 0; il < s->n_layer; il++) {
        if (!hold || hold[il]) kv->win[il] = take((size_t)kv->wslots * (size_t)kv->wrow, bytes, &fail);
        if (s->kv_src[il] == il && (!hold_src || hold_src[il])) {
            size_t rows = (size_t)(max_ctx / s->ratio[il]) + 1;
            kv->ckv[il] = take(rows * (size_t)kv->crow, bytes, &fail);
            kv->ik[il] = take(rows * (size_t)kv->irow, bytes, &fail);
            if (!hold || hold[il]) kv->carry[il] = take(2 * (size_t)s->head_dim * F, bytes, &fail);
        }
    }
    /* the image-span marks (session.h): calloc'd, not counted, and never touched by a session
     * that holds no span, so a text session pays only the address space (plan.c agrees) */
    kv->vtype = calloc((size_t)max_ctx, 1);
    kv->keys = calloc((size_t)max_ctx, sizeof(uint64_t));
    if (!kv->vtype || !kv->keys) fail = 1;
    if (fail) {
        kv_free(kv, s);
        return dsf_seterr(err, "out of memory allocating the KV state for %lld tokens", (long long)max_ctx);
    }
    return 0;
}

void kv_free(dsf_kvstate *kv, const dsf_shape *s) {
    if (kv->win)
        for (int64_t il = 0; il < s->n_layer; il++) {
            free(kv->win[il]);
            free(kv->ckv[il]);
            free(kv->ik[il]);
            free(kv->carry[il]);
        }
    free(kv->win);
    free(kv->ckv);
    free(kv->ik);
    free(kv->carry);
    free(kv->tokens);
    free(kv->feat);
    free(kv->feat_of);
    free(kv->vtype);
    free(kv->keys);
    free(kv->erows);
    memset(kv, 0, sizeof *kv);
}

/* scratch_init's arrays, allocated (alloc) or only counted into *bytes (sc's pointers stay
 * NULL); -1 when an allocation failed (everything freed). */
static int scratch_layout(dsf_scratch *sc, const dsf_shape *s, int64_t T, int64_t max_ctx, int packed, size_t *bytes,
                          int alloc) {
    memset(sc, 0, sizeof *sc);
    sc->max_chunk = T;
    int fail = 0, *failp = alloc ? &fail : NULL;
    const size_t F = sizeof(float), I = sizeof(int32_t);
    const size_t D = (size_t)s->n_embd, hc = (size_t)s->hc, H = (size_t)s->n_head, dh = (size_t)s->head_dim;
    const size_t ql = (size_t)s->q_lora, oo = (size_t)(s->o_groups * s->o_lora), mix = (2 + hc) * hc;
    const size_t ff = (size_t)(s->n_ff_exp * (s->n_expert_shared > 1 ? s->n_expert_shared : 1));
    /* selections never exceed the rows a context can hold: cap the file's sizes by it */
    sc->ksel = s->idx_topk < max_ctx ? s->idx_topk : max_ctx;
    const size_t nblk = (size_t)(s->cand_src >= 0 ? max_ctx / s->cand_block + 2 : 1);
    sc->kcand = s->cand_src >= 0 ? (s->cand_topk_blocks < (int64_t)nblk ? s->cand_topk_blocks : (int64_t)nblk) : 1;
    const size_t ih = (size_t)s->idx_heads, id = (size_t)s->idx_dim, K = (size_t)sc->ksel;
    const size_t ctb = (size_t)sc->kcand;
    const size_t E = (size_t)s->n_expert, EK = (size_t)s->n_expert_used, t = (size_t)T;
    /* a token sees at most min(window, max_ctx) window rows (the window comes from the file) */
    const size_t wrows = (size_t)(s->window < max_ctx ? s->window : max_ctx);
    const size_t natt = wrows + K > E ? wrows + K : E;
    size_t nheap = K;
    if (ctb > nheap) nheap = ctb;
    if (EK > nheap) nheap = EK;
    const size_t cols = (size_t)s->ple_cols, ein = cols * (size_t)s->ple_dim;
#define TAKE(field, n) sc->field = take((n), bytes, failp)
    TAKE(X, t * hc * D * F);
    TAKE(X1, t * hc * D * F);
    TAKE(pre, t * hc * F);
    TAKE(a_pre, t * hc * F);
    TAKE(f_pre, t * hc * F);
    TAKE(post, t * hc * F);
    TAKE(comb, t * hc * hc * F);
    TAKE(mix, t * mix * F);
    TAKE(h, t * D * F);
    TAKE(u, t * D * F);
    TAKE(uq, t * D * F);
    TAKE(qa, t * ql * F);
    TAKE(qr, t * ql * F);
    TAKE(qrq, t * ql * F);
    TAKE(q, t * (H * dh + DSF_Q_PAD) * F);
    TAKE(kvw, t * dh * F);
    TAKE(o, t * H * dh * F);
    TAKE(ya, t * oo * F);
    TAKE(yaq, t * oo * F);
    TAKE(out, t * D * F);
    TAKE(ca, t * dh * F);
    TAKE(cg, t * dh * F);
    TAKE(lat, t * dh * F);
    TAKE(ikt, t * id * F);
    TAKE(iq, t * ih * id * F);
    TAKE(iw, t * ih * F);
    TAKE(scores, (size_t)(max_ctx + 1) * F);
    TAKE(blk, nblk * F);
    TAKE(sel, t * K * I);
    TAKE(n_sel, t * sizeof(int64_t));
    TAKE(cand, t * ctb * I);
    TAKE(n_cand, t * sizeof(int64_t));
    TAKE(heap, nheap * I);
    TAKE(cmask, nblk);
    TAKE(att, natt * F);
    TAKE(rcs, t * (size_t)(s->n_rot > 0 ? s->n_rot : 1) * F);
    TAKE(keys, natt * I);
    TAKE(rlog, t * E * F);
    TAKE(esel, t * EK * I);
    TAKE(ewt, t * EK * F);
    TAKE(etok, t * I);
    TAKE(ewtok, t * F);
    TAKE(ex, t * D * F);
    TAKE(exq, t * D * F);
    /* decode runs all experts of a token in one job (moe.c): room for top-k + shared rows */
    const size_t te = t > EK + 2 ? t : EK + 2;
    TAKE(eg, te * ff * F);
    TAKE(eu, te * ff * F);
    TAKE(ey, te * D * F);
    TAKE(acc, t * D * F);
    TAKE(erow, t * (ein ? ein : 1) * F);
    TAKE(ekv, t * (hc + 1) * D * F);
    TAKE(fin, t * D * F);
    {
        size_t mx = D;
        const size_t ins[] = {ql, oo, ff, ein, (size_t)s->q_lora};
        for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) if (ins[i] > mx) mx = ins[i];
        TAKE(xb, te * mx * sizeof(uint16_t));
        sc->xb_cap = (int64_t)(te * mx);
    }
    TAKE(tkv, t * sizeof(dsf_kvstate *));
    TAKE(ttype, t);
    TAKE(tpos, t * sizeof(int64_t));
    TAKE(tjrow, t * sizeof(int64_t));
    TAKE(tjkv, t * sizeof(dsf_kvstate *));
    if (packed) {
        /* the decoded keys of kdec_tok tokens: at most KDEC_BYTES and KDEC_TOK tokens (enough
         * work items per group), at least one token's */
        const size_t per_tok = (wrows + K) * dh * F;
        size_t kt = KDEC_BYTES / (per_tok ? per_tok : 1);
        if (kt > KDEC_TOK) kt = KDEC_TOK;
        if (kt < 1) kt = 1;
        if (kt > t) kt = t;
        sc->kdec_tok = (int64_t)kt;
        sc->kdec_rows = (int64_t)(kt * (wrows + K));
        TAKE(kdec, (size_t)sc->kdec_rows * dh * F);
        TAKE(kptr, (size_t)sc->kdec_rows * sizeof(uint8_t *));
        TAKE(kfmt, (size_t)sc->kdec_rows);
        TAKE(koff, t * sizeof(int64_t));
    }
#undef TAKE
    if (fail) {
        scratch_free(sc);
        return -1;
    }
    return 0;
}

int scratch_init(dsf_scratch *sc, const dsf_shape *s, int64_t T, int64_t max_ctx, int packed, size_t *bytes) {
    return scratch_layout(sc, s, T, max_ctx, packed, bytes, 1);
}

size_t scratch_bytes(const dsf_shape *s, int64_t T, int64_t max_ctx, int packed) {
    dsf_scratch sc;
    size_t bytes = 0;
    scratch_layout(&sc, s, T, max_ctx, packed, &bytes, 0);
    return bytes;
}

/* The automatic prefill chunk (session.h). Each routed expert's weights are decoded once per
 * chunk, so a chunk should give every expert CHUNK_TPE tokens on average: on 384 experts with
 * top-6 a 512-token chunk gives 8, and the MXFP4 products are then bound by decoding the
 * weights (docs/PERFORMANCE.md, "Prefill chunk"). The chunk's own memory, its scratch and the
 * window ring's extra rows, is bounded by CHUNK_RAM_SHARE of RAM per session. */
#define CHUNK_MIN 512
#define CHUNK_MAX 8192
#define CHUNK_TPE 32
#define CHUNK_RAM_SHARE 16 /* 1/16 of RAM */

size_t chunk_bytes(const dsf_shape *s, int64_t chunk, int packed) {
    int64_t wrow, crow, irow;
    kv_row_bytes(s, packed, &wrow, &crow, &irow);
    return scratch_bytes(s, chunk, chunk, packed) + (size_t)chunk * (size_t)wrow * (size_t)s->n_layer;
}

int64_t chunk_auto(const dsf_shape *s, int packed, double ram) {
    int64_t c = CHUNK_MIN;
    while (c < CHUNK_MAX && c * s->n_expert_used < (int64_t)CHUNK_TPE * s->n_expert) c *= 2;
    while (c > CHUNK_MIN && ram > 0 && (double)chunk_bytes(s, c, packed) > ram / CHUNK_RAM_SHARE) c /= 2;
    return c;
}

void scratch_free(dsf_scratch *sc) {
    void *p[] = {sc->X, sc->X1, sc->pre, sc->a_pre, sc->f_pre, sc->post, sc->comb, sc->mix, sc->h, sc->u,
                 sc->uq, sc->qa, sc->qr, sc->qrq, sc->q, sc->kvw, sc->o, sc->ya, sc->yaq, sc->out, sc->ca,
                 sc->cg, sc->lat, sc->ikt, sc->iq, sc->iw, sc->scores, sc->blk, sc->sel, sc->n_sel, sc->cand,
                 sc->n_cand, sc->heap, sc->cmask, sc->att, sc->rcs, sc->keys, sc->rlog, sc->esel, sc->ewt, sc->etok,
                 sc->ewtok, sc->ex, sc->exq, sc->eg, sc->eu, sc->ey, sc->acc, sc->ystore, sc->eslot, sc->erow, sc->ekv,
                 sc->fin, sc->xb, sc->tkv, sc->ttype, sc->tpos, sc->tjrow, sc->tjkv, sc->kdec, (void *)sc->kptr, sc->kfmt,
                 sc->koff};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(sc, 0, sizeof *sc);
}
