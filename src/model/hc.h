/* hc.h: the hyper-connections of the forward pass (architecture.md §4.3): the hc mixes (pre,
 * post, Sinkhorn comb), the collapse of the hc copies into one row, the expand back, and the
 * rmsnorm of the collapsed rows. Not a public interface.
 * Must not: know which sublayer a mix belongs to (forward.c passes the weights and pre). */
#ifndef DSF_HC_H
#define DSF_HC_H

#include "model/forward.h"

/* pre[T][hc], post[T][hc], comb[T][hc][hc] from the stream X[T][hc][n_embd], with the mix
 * projection fn and its scale[3] and base[(2 + hc) * hc]; uses f->sc->mix. */
void hc_mixes(const fwd *f, const dsf_wmat *fn, const float *scale, const float *base, const float *X,
              float *pre, float *post, float *comb);
/* out[T][D] = sum_c pre[c] X[c] */
void hc_collapse(const fwd *f, const float *X, const float *pre, float *out);
/* Y[j] = post[j] fo + sum_i comb[i][j] R[i]   (i = source copy, j = destination) */
void hc_expand(const fwd *f, const float *fo, const float *R, const float *post, const float *comb, float *Y);
/* y[t] = rmsnorm(x[t]) * w for the tokens [t0, T) of the chunk (rows of n_embd; y from its
 * row 0, x from its row t0). */
void hc_norm_rows(const fwd *f, float *y, const float *x, const float *w, int64_t t0);

#endif
