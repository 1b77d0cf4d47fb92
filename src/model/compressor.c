/* compressor.c: the KV-source compressor of one layer for a chunk (architecture.md §4.4.4):
 * ratio 1, norm(wkv . u); ratio 2, the per-channel softmax over each group of two tokens'
 * gate scores, then the norm. Each completed row is emitted with its index key (norm, RoPE at
 * the row's position with freq_compress, FP4 QDQ in reference numerics) to its sequence's
 * compressed cache (packed there when the sequence stores packed rows, session.h).
 * Must not: read the attention's RoPE tables (a row rotates at its own position, not a
 * token's); write any row but the ones the chunk completes.
 * Invariant: a group that a forward leaves incomplete carries its first token's (a, g) in
 * the sequence's carry, so chunked prefill and decode emit the same rows. */
#include "model/attn.h"
#include "model/mm.h"
#include "kernels/select.h"
#include "kernels/vec.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

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
        /* a packed row is built in its scratch row (ikt, lat: read by nothing after this),
         * then packed with the same QDQ (quant.h *_pack) */
        uint8_t *irow = kv_ik(kv, il, j), *crow = kv_ckv(kv, il, j);
        float *ik = kv->packed ? sc->ikt + k * id : (float *)irow;
        op_rmsnorm(ik, sc->ikt + k * id, L->idx_k_norm, id, sh->eps);
        op_rope(ik + id - nrot, nrot, freq, j * r, 0);
        if (kv->packed) qdq_fp4_e8m0_pack(ik, id, irow, irow + id / 2);
        else if (f->ref) ka_qdq_fp4(ak, ik, id);
        float *c = kv->packed ? sc->lat + k * dh : (float *)crow;
        if (!kv->packed) memcpy(c, sc->lat + k * dh, (size_t)dh * sizeof(float));
        op_rope(c + dh - nrot, nrot, freq, j * r, 0);
        if (kv->packed) qdq_fp4_e4m3_pack(c, dh, crow, crow + dh / 2);
        else if (f->ref) ka_qdq_fp4_e4m3(ak, c, dh);
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

void compressor_forward(const fwd *f, int64_t il, const float *u) {
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
