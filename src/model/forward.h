/* forward.h: the forward pass's context and its entry points. Not a public interface.
 * Owns: the fwd struct that every file of the pass takes (mm.c, hc.c, attn.c, compressor.c,
 * indexer.c, moe.c, engram.c, forward.c), and forward_chunk / forward_tokens (forward.c).
 * Must not: declare the products (mm.h) or a mechanism (hc.h, attn.h, moe.h, engram.h), so
 * that a mechanism file sees the context and mm.h, never another mechanism.
 * Invariant: a fwd describes one chunk and is read-only while the chunk runs. */
#ifndef DSF_FWD_H
#define DSF_FWD_H

#include "model/session.h"

/* Threading: every job of the forward pass is claimed guided (dsf_parallel_for_guided),
 * never split statically, so that a thread the host slows costs at most a piece
 * (docs/perf-log.md, item 19). Its items are independent and no job uses the thread id, so
 * the split changes no value. */

/* A forward over T tokens. Token t belongs to the sequence state tkv[t] at absolute position
 * tpos[t]; the tokens of one sequence are consecutive and in position order. One sequence's
 * chunk (prefill, decode) and a batch of several sequences' decode steps run the same code. */
typedef struct fwd_ctx {
    const dsf_engine *e;
    const dsf_shape *sh;
    const dsf_weights *w;
    dsf_scratch *sc;
    dsf_kvstate **tkv; /* [T] */
    const int64_t *tpos; /* [T] */
    int64_t T;
    int ref;        /* reference numerics (QDQ contract) */
    bool feats;     /* some token's sequence records target features (dspark.md §3) */
    /* the attention of forward_layer: NULL is attn_forward; the DSpark draft (dspark.c) plugs
     * in its block attention */
    void (*attn)(const struct fwd_ctx *f, int64_t il, const float *u, float *out);
    void *attn_user; /* the plugged-in attention's state */
    /* [T] each token's type (DSF_TOKEN_*; vision.md §5-§7), or NULL when every token is text:
     * a span token takes its embedding row, routes with bias_vl and gets Engram gate 0 */
    const int8_t *ttype;
} fwd;

/* Whether token t of the chunk is an image-span position (vision.md §6: every type >= 0). */
static inline bool fwd_span(const fwd *f, int64_t t) { return f->ttype && f->ttype[t] >= 0; }

/* forward.c: layer il of a V4.1 block (Engram where the shape has it, hc mixes, attention,
 * MoE) on the stream f->sc->X, in place; f->sc->pre holds the previous FFN's pre on entry and
 * this layer's on return. The main layer loop and the DSpark stages (dspark.c) run it. */
void forward_layer(const fwd *f, int64_t il);
/* forward.c, the steps of forward_tokens (distpipe.c runs them on a stage's layers): set up
 * f for the chunk (positions, history, types); the embedding into the stream; the sequences'
 * new lengths; the head for tokens [t0, T) into logits [T - t0][n_vocab]. */
void fwd_begin(fwd *f, const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T);
void fwd_embed(const fwd *f, const int32_t *tok);
void fwd_commit(const fwd *f);
void fwd_head(const fwd *f, int64_t t0, float *logits);
/* forward.c: consumes T <= max_chunk tokens at positions kv->n.. and appends them. The
 * positions' types are kv->vtype[n..n+T) (set by the caller; 0 = text) and the span positions'
 * embeddings the rows of kv->erows from n_erows on, in order (session.h).
 * logits: NULL, or [T][n_vocab] when all_rows, else [n_vocab] (last token). Returns 0, or -1
 * with err when the Engram table could not be read (an I/O error, a file truncated under
 * us): the tokens are appended all the same, with values that must not be used, and the
 * caller rolls the state back. */
int forward_chunk(dsf_session *s, const int32_t *tok, int64_t T, float *logits, int all_rows, char *err);
/* The general form: token t goes to tkv[t] at position tkv[t]->n + (its index among that
 * sequence's tokens); sc is the scratch of a participant whose max_chunk >= T and whose
 * max_ctx is the largest. logits: NULL or [T][n_vocab]. Returns as forward_chunk does. */
int forward_tokens(const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T,
                   float *logits, int64_t logit_row0, char *err);

#endif
