/* mm.h: the forward pass's threaded products, its profiler (DSF_PROFILE) and its dumps
 * (DSF_DUMP). Not a public interface.
 * Owns: how a product of a chunk is split over the pool (rows or tokens, guided; the
 * multi-product jobs of decode), the activation prep of reference numerics (FP8 QDQ, BF16
 * copies), the profile counters and the debug dumps.
 * Must not: call any mechanism (hc, attention, MoE, Engram); know which tensor a product is.
 * Invariant: every product gives each output the same bits whatever the split, the thread
 * count and the batch (the kernels are batch-invariant). Externs keep the fwd_ prefix: they
 * act on a fwd context. */
#ifndef DSF_MM_H
#define DSF_MM_H

#include "model/forward.h"

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
/* True when w's products run in the Q8_K activation mode (dsf_engine_params.act_q8k on, a
 * weight type with a Q8_K dot, n_in a multiple of 256 up to 16384): fwd_mm, fwd_mm_act and the
 * multi-product jobs then quantize the activations to Q8_K (f->sc->xb) and use the matmul_q8k
 * kernels; callers that would hand w BF16 copies (fwd_mm_xb) must take fwd_mm_act instead. */
bool fwd_q8k_on(const fwd *f, const dsf_wmat *w);
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
/* DSF_PROFILE: the clock at the start of a forward call, or 0 when the profile is off;
 * fwd_profile_end counts the call of T tokens that started at t0 (nothing when t0 is 0). */
double fwd_profile_start(void);
void fwd_profile_end(int64_t T, double t0);
/* Counts the time split of DSF_PROFILE=1 without the variable and without its report at exit
 * (bench's --ubatch list reads it through fwd_profile_mxfp4); a no-op when DSF_PROFILE is set. */
void fwd_profile_collect(void);
/* What the prefill chunks' products of MXFP4 weights (the routed experts) counted since the
 * last reset: seconds, weight bytes read (each product's weights once per call), FLOPs. */
void fwd_profile_mxfp4(double *s, double *bytes, double *flop);

/* Debug dump of a chunk tensor to $DSF_DUMP/<name>.bin (no-op unless set): the first chunk of
 * a sequence (tpos[0] == 0) creates the file, later chunks append. */
void fwd_dump(const fwd *f, const char *name, const void *data, size_t bytes);
/* The same for n floats of layer il, named L<il>.<what>. */
void fwd_dump_layer(const fwd *f, int64_t il, const char *what, const float *p, int64_t n);

#endif
