/* indexer.c: the lightning indexer of one layer for a chunk (architecture.md §4.4.5-4.4.7):
 * the index queries and head weights (skipped when every visible row is selected anyway), the
 * scores over the compressed index keys, the top-k selection, and on the candidate source
 * layer the two-level candidate blocks that restrict the layers after it.
 * Must not: write the KV caches (it reads the index keys compressor.c emitted, decoding packed
 * ones exactly).
 * Invariant: every query selects exactly the rows it would select in decode (§5.2); scores
 * are written per row by exactly one range of a job. */
#include "model/attn.h"
#include "model/mm.h"
#include "kernels/select.h"
#include "kernels/vec.h"
#include "kernels/ops.h"

#include <math.h>
#include <string.h>

/* One query's index scores over a row range (each row written by exactly one chunk). */
typedef struct {
    const dsf_akernels *k;
    float *scores;
    const float *q, *w;
    const dsf_kvstate *kv; /* the index keys: kv_ik(kv, src, j) */
    int64_t src, ih, id;
    const uint8_t *cmask;
    int64_t B;
} index_job;

/* Packed keys: the rows of [j0, j1) inside the candidates, decoded (exactly) in blocks on
 * the stack and scored as fp32 rows; a row's score does not depend on its block or its
 * place in it (vec.h: rows are independent), so it equals the fp32 state's. */
static void index_packed(const index_job *j, int64_t j0, int64_t j1) {
    float buf[KV_IDX_DEC], tmp[KV_IDX_DEC / 32];
    int64_t rows[KV_IDX_DEC / 32];
    const int64_t id = j->id, nb = KV_IDX_DEC / id; /* id <= KV_IDX_DEC (kv_init), a multiple of 32 */
    for (int64_t r = j0; r < j1;) {
        int64_t m = 0;
        for (; r < j1 && m < nb; r++) {
            if (j->cmask && !j->cmask[r / j->B]) {
                j->scores[r] = -INFINITY;
                continue;
            }
            const uint8_t *p = kv_ik(j->kv, j->src, r);
            ka_unpack_fp4(j->k, buf + m * id, p, p + id / 2, id);
            rows[m++] = r;
        }
        if (!m) continue;
        ka_index(j->k, tmp, j->q, j->w, buf, 0, m, j->ih, id, NULL, 1);
        for (int64_t i = 0; i < m; i++) j->scores[rows[i]] = tmp[i];
    }
}

static void index_range(void *ctx, int64_t j0, int64_t j1, int tid) {
    (void)tid;
    const index_job *j = ctx;
    if (j->kv->packed) index_packed(j, j0, j1);
    else ka_index(j->k, j->scores, j->q, j->w, (const float *)j->kv->ik[j->src], j0, j1, j->ih, j->id, j->cmask, j->B);
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

void indexer_forward(const fwd *f, int64_t il, const float *u) {
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
        index_job ij = {akernels_get(), sc->scores, sc->iq + t * ih * id, sc->iw + t * ih, f->tkv[t], src, ih, id,
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
