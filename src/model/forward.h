/* fwd.h: the forward pass's internal context, shared by forward.c and the per-mechanism files
 * (attn.c, moe.c, engram.c). Not a public interface. */
#ifndef DSF_FWD_H
#define DSF_FWD_H

#include "model/session.h"

/* Threading: every job of the forward pass is claimed guided (dsf_parallel_for_guided: pieces
 * that shrink down to the job's grain), never split statically. Its items are independent and
 * no job uses the thread id, so the split changes no value; a thread that the host slows (at
 * times one of these vCPUs ran the same kernel ~20 % slower than the other) then costs at
 * most a piece, not half of the job. With static splits the other thread waited at the joins
 * of the non-matmul jobs for ~250 ms of a 9 s prefill (the attention core alone 100 ms). */

/* A forward over T tokens. Token t belongs to the sequence state tkv[t] at absolute position
 * tpos[t]; the tokens of one sequence are consecutive and in position order. One sequence's
 * chunk (prefill, decode) and a batch of several sequences' decode steps run the same code. */
typedef struct {
    const dsf_engine *e;
    const dsf_shape *sh;
    const dsf_weights *w;
    dsf_scratch *sc;
    dsf_kvstate **tkv; /* [T] */
    const int64_t *tpos; /* [T] */
    int64_t T;
    int ref;        /* reference numerics (QDQ contract) */
} fwd;

/* y[T][ldy] (rows of w) = w . x[T][w->n_in], threaded over rows. */
void fwd_mm(const fwd *f, const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy);
/* y = w . xq for an activation that fwd_act prepared. Reference mode: xq is FP8-QDQ'd (e4m3
 * times a power of two), exact in BF16, so the BF16 dot-product kernels compute the official
 * products exactly (kern_matmul_xbf16); plain mode: the fp32 family. A projection always uses
 * the same family, so prefill and decode agree bit for bit (the kernels are batch-invariant). */
void fwd_mm_act(const fwd *f, const dsf_wmat *w, const float *xq, int64_t T, float *y, int64_t ldy);
/* Its two halves, for callers that reuse one BF16 copy for several products:
 * fwd_to_bf16: xb[T][n] = BF16 of x (threaded over rows); true iff every value was exact.
 * fwd_mm_xb: y = w . xb with the BF16-activation kernels. */
bool fwd_to_bf16(const fwd *f, const float *x, int64_t T, int64_t n, uint16_t *xb);
void fwd_mm_xb(const fwd *f, const dsf_wmat *w, const uint16_t *xb, int64_t T, float *y, int64_t ldy);
/* Activation prep for an FP8/FP4 projection: in reference mode copies x[T][n] to xq and
 * applies QDQ_FP8 (groups of 32 along n) and returns xq; in plain mode returns x. */
const float *fwd_act(const fwd *f, const float *x, int64_t T, int64_t n, float *xq);
/* n products of one token (T = 1) in one threaded job: y[i] = w[i] . xq[i], each exactly as
 * fwd_mm_act computes it (BF16 activations when reference mode's QDQ made them exact, else
 * fp32); f->sc->xb holds the BF16 copies (one per distinct xq pointer in a row; when it is
 * full, the products so far run as one job first). Cuts the per-call synchronization of
 * decode, where a token's experts are many small products. */
void fwd_mm_act_multi(const fwd *f, int n, const dsf_wmat *const *w, const float *const *xq, float *const *y);
/* The same for products without activation quantization: each exactly as fwd_mm computes it
 * (the fp32 family), in one job (decode's 8 grouped wo_a products). */
void fwd_mm_multi(const fwd *f, int n, const dsf_wmat *const *w, const float *const *x, float *const *y);
/* DSF_PROFILE: forgets what the profile counted so far (bench calls it after its warm-up
 * prefill, so that the report covers the measured prefill and decode steps only). */
void fwd_profile_reset(void);
/* Debug dump of a chunk tensor to $DSF_DUMP/<name>.f32 (no-op unless set). */
void fwd_dump(const fwd *f, const char *name, const void *data, size_t bytes);

void engram_forward(const fwd *f, int64_t il);
void attn_forward(const fwd *f, int64_t il, const float *u, float *out);
/* Whether layer il's indexer computes its query projections (idx_q_b, idx_proj) for a chunk
 * whose last query sits at position p_last, with the session's ksel and kcand: only when a
 * query can see more compressed rows than it selects (or than the candidate stage keeps);
 * otherwise every visible row is selected and the projections are skipped (spec §4.4.5).
 * Layers that are no index source (or have ratio 0) never compute them. */
bool attn_index_projects(const dsf_shape *sh, int64_t il, int64_t p_last, int64_t ksel, int64_t kcand);
void moe_forward(const fwd *f, int64_t il, const float *v, float *out);
/* Engram rows of one token (absolute per_layer_token_embd rows, [ple_cols]). */
void engram_hash(const dsf_shape *sh, int64_t e, const int32_t *tokens, int64_t p, int64_t *rows);

#endif
