/* forward.c: the layer loop for a chunk of tokens (architecture.md §4.0, §4.3, §4.6).
 * Reads like the model card: embed into hc copies; per layer: Engram (before the block),
 * hc mixes, collapse with the previous sublayer's pre, attention, expand, hc mixes, collapse
 * with the attention's pre, MoE, expand; final collapse with the last FFN pre, norm, head.
 * Owns: the order of the steps, the chunk's token positions and the sequences' lengths.
 * Must not: compute a mechanism's arithmetic itself (products: mm.c; hyper-connections: hc.c;
 * attention, MoE, Engram: their files). */
#include "model/forward.h"
#include "model/mm.h"
#include "model/hc.h"
#include "model/attn.h"
#include "model/moe.h"
#include "model/engram.h"
#include "model/engram_io.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <string.h>

/* The token rows of the embedding into every hc copy of the stream sc->X; the first layer's
 * pre is one-hot (no eps). An image-span position takes its substituted row instead (vision.md
 * §5: the next of its sequence's pending rows, kv->erows from n_erows on). */
void fwd_embed(const fwd *f, const int32_t *tok) {
    const dsf_weights *w = f->w;
    dsf_scratch *sc = f->sc;
    const int64_t D = f->sh->n_embd, hc = f->sh->hc;
    int64_t k = 0; /* span rows of this token's sequence consumed so far in the chunk */
    for (int64_t t = 0; t < f->T; t++) {
        if (t > 0 && f->tkv[t - 1] != f->tkv[t]) k = 0;
        if (fwd_span(f, t)) {
            const dsf_kvstate *kv = f->tkv[t];
            DSF_ASSERT(kv->n_erows + k < kv->erows_cap);
            memcpy(sc->h, kv->erows + (kv->n_erows + k++) * D, (size_t)D * sizeof(float));
        } else {
            /* one row per token, at random: read it (gguf_read_span) rather than fault it in */
            _Alignas(64) uint8_t row[32768];
            const uint8_t *src = w->tok_embd.data + (uint64_t)tok[t] * w->tok_embd.row_bytes;
            dequant_row(w->tok_embd.type, gguf_read_span(f->e->gguf, src, (size_t)w->tok_embd.row_bytes, row, sizeof row, false), sc->h, D);
        }
        for (int64_t c = 0; c < hc; c++) memcpy(sc->X + (t * hc + c) * D, sc->h, (size_t)D * sizeof(float));
        for (int64_t c = 0; c < hc; c++) sc->pre[t * hc + c] = c == 0 ? 1.0f : 0.0f; /* layer 0: one-hot, no eps */
    }
}

/* dspark.md §3: the target feature of layer il for every token whose sequence records it:
 * the plain mean over the hc copies of the stream entering the block (after Engram), stored
 * at the layer's slot of the token's row in the sequence's feature ring. */
static void record_features(const fwd *f, int64_t il) {
    const int64_t D = f->sh->n_embd, hc = f->sh->hc;
    for (int64_t t = 0; t < f->T; t++) {
        const dsf_kvstate *kv = f->tkv[t];
        if (!kv->feat || kv->feat_of[il] < 0) continue;
        float *dst = kv->feat + ((f->tpos[t] % kv->fslots) * kv->nfeat + kv->feat_of[il]) * D;
        const float *x = f->sc->X + t * hc * D;
        for (int64_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < hc; c++) acc += x[c * D + d];
            dst[d] = acc / (float)hc;
        }
    }
}

void forward_layer(const fwd *f, int64_t il) {
    const dsf_layer *L = &f->w->layers[il];
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, D = f->sh->n_embd, hc = f->sh->hc;
    if (f->sh->engram_of[il] >= 0) {
        engram_forward(f, il);
        fwd_dump_layer(f, il, "engram_out", sc->X, T * hc * D);
    }
    if (f->feats) record_features(f, il);
    hc_mixes(f, &L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, sc->X, sc->a_pre, sc->post, sc->comb);
    hc_collapse(f, sc->X, sc->pre, sc->h);
    hc_norm_rows(f, sc->u, sc->h, L->attn_norm, 0);
    fwd_dump_layer(f, il, "attn_in", sc->u, T * D);
    if (f->attn) f->attn(f, il, sc->u, sc->out);
    else attn_forward(f, il, sc->u, sc->out);
    fwd_dump_layer(f, il, "attn_out", sc->out, T * D);
    hc_expand(f, sc->out, sc->X, sc->post, sc->comb, sc->X1);
    hc_mixes(f, &L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, sc->X1, sc->f_pre, sc->post, sc->comb);
    /* spec §4.3: the FFN collapses with the ATTENTION's pre */
    hc_collapse(f, sc->X1, sc->a_pre, sc->h);
    hc_norm_rows(f, sc->u, sc->h, L->ffn_norm, 0);
    fwd_dump_layer(f, il, "ffn_in", sc->u, T * D);
    moe_forward(f, il, sc->u, sc->out);
    fwd_dump_layer(f, il, "ffn_out", sc->out, T * D);
    hc_expand(f, sc->out, sc->X1, sc->post, sc->comb, sc->X);
    memcpy(sc->pre, sc->f_pre, (size_t)(T * hc) * sizeof(float));
    fwd_dump_layer(f, il, "block_out", sc->X, T * hc * D);
    fwd_dump_layer(f, il, "next_pre_mix", sc->pre, T * hc);
}

/* The final collapse with the last FFN pre (no hc_head), norm and head for the tokens
 * [t0, T): logits [T - t0][n_vocab]. */
void fwd_head(const fwd *f, int64_t t0, float *logits) {
    dsf_scratch *sc = f->sc;
    hc_collapse(f, sc->X, sc->pre, sc->h);
    hc_norm_rows(f, sc->fin, sc->h, f->w->output_norm, t0);
    fwd_mm(f, &f->w->output, sc->fin, f->T - t0, logits, f->sh->n_vocab);
}

void fwd_begin(fwd *f, const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T) {
    const dsf_shape *sh = &e->shape;
    DSF_ASSERT(T >= 1 && T <= sc->max_chunk);
    bool spans = false;
    for (int64_t t = 0; t < T; t++) {
        sc->tkv[t] = tkv[t];
        sc->tpos[t] = (t > 0 && tkv[t - 1] == tkv[t]) ? sc->tpos[t - 1] + 1 : tkv[t]->n;
        DSF_ASSERT(sc->tpos[t] < tkv[t]->max_ctx);
        tkv[t]->tokens[sc->tpos[t]] = tok[t];
        sc->ttype[t] = (int8_t)kv_type(tkv[t], sc->tpos[t]);
        spans |= sc->ttype[t] >= 0;
    }
    DSF_ASSERT(!spans || e->w.vision); /* dsf_session_eval_media refuses spans without bias_vl */
    *f = (fwd){e, sh, &e->w, sc, sc->tkv, sc->tpos, T, e->numerics == DSF_NUMERICS_REFERENCE, false, NULL, NULL,
               spans ? sc->ttype : NULL};
    for (int64_t t = 0; t < T; t++) f->feats |= tkv[t]->feat != NULL;
}

void fwd_commit(const fwd *f) {
    for (int64_t t = 0; t < f->T; t++) {
        dsf_kvstate *kv = f->tkv[t];
        kv->n = f->tpos[t] + 1;
        if (f->ttype && f->ttype[t] >= 0) kv->n_erows++;
        if (kv->n - kv->wslots > kv->win_lo) kv->win_lo = kv->n - kv->wslots;
    }
}

int forward_tokens(const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T,
                   float *logits, int64_t logit_row0, char *err) {
    if (e->dist_forward) return e->dist_forward(e, sc, tkv, tok, T, logits, logit_row0, err); /* an MPI job */
    fwd f;
    fwd_begin(&f, e, sc, tkv, tok, T);
    double prof_t0 = fwd_profile_start();
    if (e->shape.n_engram) engram_start(&f, 0, e->shape.n_layer); /* the readers work while the layers before Engram run */
    fwd_embed(&f, tok);
    for (int64_t il = 0; il < e->shape.n_layer; il++) forward_layer(&f, il);
    fwd_commit(&f);
    if (logits) fwd_head(&f, logit_row0, logits);
    fwd_profile_end(T, prof_t0);
    return engram_req_take_error(sc->ereq, err);
}

int forward_chunk(dsf_session *s, const int32_t *tok, int64_t T, float *logits, int all_rows, char *err) {
    dsf_kvstate **tkv = s->sc.tkv;
    DSF_ASSERT(T <= s->sc.max_chunk && s->kv.n + T <= s->kv.max_ctx);
    /* sc->tkv doubles as the argument: forward_tokens copies it onto itself */
    for (int64_t t = 0; t < T; t++) tkv[t] = &s->kv;
    return forward_tokens(s->e, &s->sc, tkv, tok, T, logits, all_rows ? 0 : T - 1, err);
}
