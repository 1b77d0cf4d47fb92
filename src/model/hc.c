/* hc.c: hyper-connections (architecture.md §4.3): the mixes (pre, post and the Sinkhorn comb
 * from the stream), the collapse of the hc copies, the expand back into them, and the rmsnorm
 * of collapsed rows.
 * Must not: call a mechanism; reorder the reference's fp32 sums (they feed FP8 decisions
 * downstream).
 * Invariant: each token's (or block's) outputs are written by exactly one range of a job, so
 * results do not depend on the thread count. */
#include "model/hc.h"
#include "model/mm.h"
#include "kernels/select.h"
#include "kernels/vec.h"
#include "kernels/ops.h"

#include <math.h>

/* The per-token loops below run on the worker pool over token ranges: each token's outputs
 * are written by exactly one chunk, so results do not depend on the thread count. */
typedef struct {
    const fwd *f;
    const dsf_akernels *k;
    const float *scale, *base, *X, *fo, *w;
    const float *ipre, *ipost, *icomb; /* inputs of collapse / expand */
    float *pre, *post, *comb, *out;
} tok_job;

/* Tokens per chunk: at least ~16K elements of work. */
static int64_t tok_grain(int64_t per_token) { return 16384 / (per_token > 0 ? per_token : 1) + 1; }

static void mixes_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const tok_job *j = ctx;
    const dsf_shape *sh = j->f->sh;
    const int64_t hc = sh->hc, n = hc * sh->n_embd, mix = (2 + hc) * hc;
    const float *scale = j->scale, *base = j->base;
    float A[16 * 16];
    for (int64_t t = t0; t < t1; t++) {
        /* rms_norm_eps, not hc_eps; the reference's fp32 rounding (op_meansq) */
        float rho = 1.0f / sqrtf(op_meansq(j->X + t * n, n) + sh->eps);
        const float *m = j->f->sc->mix + t * mix;
        for (int64_t c = 0; c < hc; c++) {
            j->pre[t * hc + c] = op_sigmoid(m[c] * rho * scale[0] + base[c]) + sh->hc_eps;
            j->post[t * hc + c] = 2.0f * op_sigmoid(m[hc + c] * rho * scale[1] + base[hc + c]);
        }
        for (int64_t i = 0; i < hc * hc; i++) A[i] = m[2 * hc + i] * rho * scale[2] + base[2 * hc + i];
        op_sinkhorn(j->comb + t * hc * hc, A, hc, sh->hc_iters, sh->hc_eps);
    }
}

/* pre[T][hc], post[T][hc], comb[T][hc][hc] from the stream X[T][hc][D]. */
void hc_mixes(const fwd *f, const dsf_wmat *fn, const float *scale, const float *base, const float *X,
              float *pre, float *post, float *comb) {
    const dsf_shape *sh = f->sh;
    const int64_t T = f->T, hc = sh->hc, mix = (2 + hc) * hc;
    fwd_mm(f, fn, X, T, f->sc->mix, mix);
    tok_job j = {.f = f, .k = akernels_get(), .scale = scale, .base = base, .X = X, .pre = pre, .post = post, .comb = comb};
    dsf_parallel_for_guided(f->e->pool, T, tok_grain(hc * sh->n_embd), mixes_range, &j);
}

/* collapse / expand items: (token, block of HC_BLOCK elements of D), i = t * nb + b, so that a
 * decode step (one token) splits over both threads too; every element is computed as in one
 * call over the whole row (the sums run over copies, per element). */
#define HC_BLOCK 1024

static int64_t hc_blocks(const fwd *f) { return (f->sh->n_embd + HC_BLOCK - 1) / HC_BLOCK; }

static void collapse_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const tok_job *j = ctx;
    const int64_t hc = j->f->sh->hc, D = j->f->sh->n_embd, nb = hc_blocks(j->f);
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / nb, d0 = i % nb * HC_BLOCK, n = D - d0 < HC_BLOCK ? D - d0 : HC_BLOCK;
        ka_hc_collapse(j->k, j->out + t * D + d0, j->X + t * hc * D + d0, j->ipre + t * hc, hc, n, D);
    }
}

/* out[T][D] = sum_c pre[c] X[c] */
void hc_collapse(const fwd *f, const float *X, const float *pre, float *out) {
    tok_job j = {.f = f, .k = akernels_get(), .X = X, .ipre = pre, .out = out};
    dsf_parallel_for_guided(f->e->pool, f->T * hc_blocks(f), tok_grain(f->sh->hc * HC_BLOCK), collapse_range, &j);
}

static void expand_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const tok_job *j = ctx;
    const int64_t hc = j->f->sh->hc, D = j->f->sh->n_embd, nb = hc_blocks(j->f);
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / nb, d0 = i % nb * HC_BLOCK, n = D - d0 < HC_BLOCK ? D - d0 : HC_BLOCK;
        ka_hc_expand(j->k, j->out + t * hc * D + d0, j->fo + t * D + d0, j->X + t * hc * D + d0, j->ipost + t * hc,
                     j->icomb + t * hc * hc, hc, n, D);
    }
}

/* Y[j] = post[j] fo + sum_i comb[i][j] R[i]   (i = source copy, j = destination);
 * the reference's order: the residual mix summed over i first, then the sublayer term added
 * (fp32 rounding feeds the FP8 decisions downstream; kernels/vec.h keeps it bit for bit) */
void hc_expand(const fwd *f, const float *fo, const float *R, const float *post, const float *comb, float *Y) {
    tok_job j = {.f = f, .k = akernels_get(), .fo = fo, .X = R, .ipost = post, .icomb = comb, .out = Y};
    dsf_parallel_for_guided(f->e->pool, f->T * hc_blocks(f), tok_grain(f->sh->hc * f->sh->hc * HC_BLOCK), expand_range,
                            &j);
}

static void norm_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const tok_job *j = ctx;
    const int64_t D = j->f->sh->n_embd;
    for (int64_t t = t0; t < t1; t++) ka_rmsnorm(j->k, j->out + t * D, j->X + t * D, j->w, D, j->f->sh->eps);
}

/* y[t] = rmsnorm(x[t]) * w for the tokens [t0, T) of the chunk (rows of n_embd). */
void hc_norm_rows(const fwd *f, float *y, const float *x, const float *w, int64_t t0) {
    const int64_t D = f->sh->n_embd;
    tok_job j = {.f = f, .k = akernels_get(), .X = x + t0 * D, .w = w, .out = y};
    dsf_parallel_for_guided(f->e->pool, f->T - t0, tok_grain(D), norm_range, &j);
}
