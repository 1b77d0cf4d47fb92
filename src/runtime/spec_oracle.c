/* spec_oracle.c: the test drafter of speculative decoding ("the draft copies the main model's
 * argmax", issue 35): it proposes the main model's own continuation, so every draft is
 * accepted unless it is corrupted on purpose, and long accepts are exercised end to end.
 *
 * Owns: a session of its own on the main engine, kept equal to the main session's committed
 * tokens (it re-syncs from dsf_session_tokens at every call: commit and reset need nothing).
 * Must not: touch the main session, or be used for speed (each draft costs a forward).
 * Invariant: at tau = 0 an uncorrupted draft is the main model's greedy continuation; at
 * tau > 0 q[i] is softmax(L_i / tau) of the main model and ids[i] is drawn from it. */
#include "runtime/spec.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dsf_drafter base;
    dsf_drafter_ops ops;  /* per instance: the block is a parameter */
    dsf_session *own;
    int n_vocab, corrupt;
    float *lg;  /* [n_vocab] */
} oracle;

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* q = softmax(x / tau); returns a draw from it. */
static int32_t soft_draw(const float *x, int n, float tau, float *q, uint64_t *rng) {
    double mx = x[argmax(x, n)], total = 0.0;
    for (int i = 0; i < n; i++) total += exp(((double)x[i] - mx) / tau);
    for (int i = 0; i < n; i++) q[i] = (float)(exp(((double)x[i] - mx) / tau) / total);
    double u = dsf_rng_uniform(rng), acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += q[i];
        if (u < acc) return i;
    }
    return argmax(x, n);
}

/* Makes the own session hold exactly the main session's tokens. */
static int sync_own(oracle *o, dsf_session *s, char *err) {
    const int32_t *want = dsf_session_tokens(s), *have = dsf_session_tokens(o->own);
    int nw = dsf_session_n_past(s), nh = dsf_session_n_past(o->own), l = 0;
    while (l < nw && l < nh && want[l] == have[l]) l++;
    if (l < nh && dsf_session_rollback(o->own, l, err) < 0) return -1;
    if (l < nw && dsf_session_eval(o->own, want + l, nw - l, NULL, false, err) < 0) return -1;
    return 0;
}

static int oracle_propose(dsf_drafter *d, dsf_session *s, int32_t anchor, int n, float tau, uint64_t *rng,
                          int32_t *ids, float *q, float *conf, char *err) {
    oracle *o = (oracle *)d;
    if (sync_own(o, s, err) < 0) return -1;
    int n0 = dsf_session_n_past(o->own);
    if (n > dsf_session_max_ctx(o->own) - n0) n = dsf_session_max_ctx(o->own) - n0;
    int32_t t = anchor;
    for (int i = 0; i < n; i++) {
        if (dsf_session_eval(o->own, &t, 1, o->lg, false, err) < 0) return -1;
        if (tau > 0 && q) {
            ids[i] = soft_draw(o->lg, o->n_vocab, tau, q + (size_t)i * (size_t)o->n_vocab, rng);
        } else {
            ids[i] = argmax(o->lg, o->n_vocab);
            if (i == o->corrupt) ids[i] = (ids[i] + 1) % o->n_vocab;
        }
        conf[i] = NAN;
        t = ids[i];
    }
    return dsf_session_rollback(o->own, n0, err) < 0 ? -1 : n;
}

static void oracle_free(dsf_drafter *d) {
    oracle *o = (oracle *)d;
    dsf_session_free(o->own);
    free(o->lg);
    free(o);
}

dsf_drafter *spec_oracle_new(dsf_engine *e, int max_ctx, int block, int corrupt, char *err) {
    if (block < 1 || block > SPEC_MAX_BLOCK) {
        dsf_seterr(err, "oracle drafter: block %d is outside 1..%d", block, SPEC_MAX_BLOCK);
        return NULL;
    }
    oracle *o = calloc(1, sizeof *o);
    if (!o) {
        dsf_seterr(err, "oracle drafter: out of memory");
        return NULL;
    }
    dsf_drafter_ops *ops = &o->ops;
    o->n_vocab = dsf_engine_n_vocab(e);
    o->corrupt = corrupt;
    o->lg = malloc((size_t)o->n_vocab * sizeof *o->lg);
    o->own = o->lg ? dsf_session_new(e, max_ctx, err) : NULL;
    ops->propose = oracle_propose;
    ops->free = oracle_free;
    ops->block = block;
    o->base.ops = ops;
    if (!o->own) {
        if (!o->lg) dsf_seterr(err, "oracle drafter: out of memory");
        free(o->lg);
        free(o);
        return NULL;
    }
    return &o->base;
}
