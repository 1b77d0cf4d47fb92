/* spec_policy.c: the cost-aware block length of speculative decoding (docs/SPECULATIVE.md).
 *
 * Owns: the calibration of the drafter's confidence into acceptance probabilities (per-bucket
 * counts with a prior), the per-machine table of main-forward times for 1..B+1 tokens
 * (measured, then refined online), and the two decisions of a round: draft at all, and how
 * many of the drafted tokens to verify.
 * Must not: influence what is generated (only how many drafts are verified), or read the
 * clock (callers pass the seconds they measured), except spec_cost_measure.
 * Invariant: the chosen n never has a lower expected rate (committed tokens per second) than
 * n = 0 under the model, so the policy never projects a slowdown against plain decoding. */
#include "runtime/spec.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void spec_policy_init(spec_policy *pol) {
    memset(pol, 0, sizeof *pol);
    pol->mode = SPEC_POLICY_COST;
}

/* ==== calibration ========================================================================= */

static int bucket_of(float conf) {
    double s = 1.0 / (1.0 + exp(-(double)conf));
    int b = (int)(s * SPEC_CONF_BUCKETS);
    return b < 0 ? 0 : b >= SPEC_CONF_BUCKETS ? SPEC_CONF_BUCKETS - 1 : b;
}

double spec_calib_prob(const spec_calib *c, int i, float conf) {
    if (isnan(conf)) {
        if (i < 0) i = 0;
        if (i >= SPEC_MAX_BLOCK) i = SPEC_MAX_BLOCK - 1;
        return (c->pacc[i] + 0.5 * SPEC_PRIOR_N) / (c->pn[i] + SPEC_PRIOR_N);
    }
    int b = bucket_of(conf);
    double centre = (b + 0.5) / SPEC_CONF_BUCKETS;
    return (c->acc[b] + centre * SPEC_PRIOR_N) / (c->n[b] + SPEC_PRIOR_N);
}

void spec_calib_observe(spec_calib *c, const float *conf, int n, int k) {
    /* draft i was judged only when all before it were accepted: trials i = 0..min(k, n-1) */
    for (int i = 0; i < n && i <= k; i++) {
        double hit = i < k ? 1.0 : 0.0;
        int ip = i < SPEC_MAX_BLOCK ? i : SPEC_MAX_BLOCK - 1;
        c->pacc[ip] += hit;
        c->pn[ip] += 1.0;
        if (conf && !isnan(conf[i])) {
            int b = bucket_of(conf[i]);
            c->acc[b] += hit;
            c->n[b] += 1.0;
        }
    }
}

/* ==== the cost table ====================================================================== */

double spec_cost_fwd(const spec_policy *pol, int t) {
    if (t < 1) return 0.0;
    if (t <= SPEC_MAX_BLOCK + 1 && pol->t_fwd[t] > 0) return pol->t_fwd[t];
    double t1 = pol->t_fwd[1] > 0 ? pol->t_fwd[1] : 1.0;
    return t1 * t; /* unknown: assume no sharing at all (the pessimistic side) */
}

/* Weight of a new observation in the running averages. */
#define SPEC_EMA 0.1

void spec_cost_observe(spec_policy *pol, int t, double seconds) {
    if (t < 1 || t > SPEC_MAX_BLOCK + 1 || !(seconds > 0)) return;
    double *x = &pol->t_fwd[t];
    *x = *x > 0 ? (1 - SPEC_EMA) * *x + SPEC_EMA * seconds : seconds;
}

void spec_cost_observe_draft(spec_policy *pol, double seconds) {
    if (!(seconds >= 0)) return;
    pol->t_draft = pol->t_draft > 0 ? (1 - SPEC_EMA) * pol->t_draft + SPEC_EMA * seconds : seconds;
}

/* ==== the decisions ======================================================================= */

double spec_rate(const spec_policy *pol, const double *c, int n, double extra) {
    double e = 1.0, run = 1.0; /* the correction or bonus token always comes */
    for (int i = 0; i < n; i++) {
        run *= c[i];
        e += run;
    }
    return e / (extra + spec_cost_fwd(pol, n + 1));
}

/* The largest n allowed by max_draft and min_p for acceptance probabilities c[0..nd). */
static int cap_block(const spec_policy *pol, const double *c, int nd) {
    int n = nd;
    if (pol->max_draft > 0 && n > pol->max_draft) n = pol->max_draft;
    double run = 1.0;
    for (int i = 0; i < n; i++) {
        run *= c[i];
        if (run < pol->min_p) return i;
    }
    return n;
}

/* argmax over n = 0..cap of spec_rate(n, extra); ties to the smaller n. */
static int best_n(const spec_policy *pol, const double *c, int cap, double extra, double *rate) {
    int best = 0;
    double br = 1.0 / spec_cost_fwd(pol, 1); /* n = 0: a plain step, no draft paid */
    for (int n = 1; n <= cap; n++) {
        double r = spec_rate(pol, c, n, extra);
        if (r > br * (1.0 + 1e-9)) best = n, br = r;
    }
    if (rate) *rate = br;
    return best;
}

bool spec_policy_draft(spec_policy *pol, int n_max) {
    if (n_max < 1) return false;
    if (pol->mode == SPEC_POLICY_ALWAYS) return true;
    if (n_max > SPEC_MAX_BLOCK) n_max = SPEC_MAX_BLOCK;
    double c[SPEC_MAX_BLOCK];
    for (int i = 0; i < n_max; i++) c[i] = spec_calib_prob(&pol->cal, i, NAN);
    int n = best_n(pol, c, cap_block(pol, c, n_max), pol->t_draft, NULL);
    if (n > 0) {
        pol->n_skipped = 0;
        return true;
    }
    if (++pol->n_skipped >= SPEC_EXPLORE) { /* look again now and then: the text may have changed */
        pol->n_skipped = 0;
        return true;
    }
    return false;
}

int spec_policy_choose(const spec_policy *pol, const float *conf, int nd) {
    if (nd < 1) return 0;
    if (nd > SPEC_MAX_BLOCK) nd = SPEC_MAX_BLOCK;
    if (pol->mode == SPEC_POLICY_ALWAYS) return pol->max_draft > 0 && nd > pol->max_draft ? pol->max_draft : nd;
    double c[SPEC_MAX_BLOCK];
    for (int i = 0; i < nd; i++) c[i] = spec_calib_prob(&pol->cal, i, conf ? conf[i] : NAN);
    return best_n(pol, c, cap_block(pol, c, nd), 0.0, NULL); /* the draft is paid already */
}

double spec_project(const spec_policy *pol, double accept, int B, bool always) {
    if (B > SPEC_MAX_BLOCK) B = SPEC_MAX_BLOCK;
    if (B < 1) return 1.0;
    double c[SPEC_MAX_BLOCK], plain = 1.0 / spec_cost_fwd(pol, 1), rate;
    for (int i = 0; i < B; i++) c[i] = accept;
    if (always) rate = spec_rate(pol, c, B, pol->t_draft);
    else best_n(pol, c, cap_block(pol, c, B), pol->t_draft, &rate); /* the decision of spec_policy_draft */
    return rate / plain;
}

/* ==== measuring the table ================================================================= */

int spec_cost_measure(dsf_engine *e, int n_max, spec_policy *pol, char *err) {
    if (n_max > SPEC_MAX_BLOCK) n_max = SPEC_MAX_BLOCK;
    if (n_max < 0) n_max = 0;
    const int prefix = 32, reps = 3;
    dsf_session *s = dsf_session_new(e, prefix + n_max + 2, err);
    if (!s) return -1;
    int32_t toks[SPEC_MAX_BLOCK + 1 + 32];
    int nv = dsf_engine_n_vocab(e);
    for (int i = 0; i < prefix + n_max + 1; i++) toks[i] = (int32_t)((i * 7919 + 13) % nv);
    /* as the loop runs them: one logits row per verified token (the LM head is part of the cost) */
    float *lg = malloc((size_t)(n_max + 1) * (size_t)nv * sizeof *lg);
    int rc = lg ? dsf_session_eval(s, toks, prefix, NULL, false, err) : dsf_seterr(err, "out of memory");
    for (int t = 1; rc == 0 && t <= n_max + 1; t++) {
        double best = INFINITY;
        for (int r = 0; rc == 0 && r < reps; r++) {
            double t0 = dsf_now();
            rc = dsf_session_eval(s, toks + prefix, t, lg, t > 1, err);
            double dt = dsf_now() - t0;
            if (dt < best) best = dt;
            if (rc == 0) rc = dsf_session_rollback(s, prefix, err);
        }
        if (rc == 0) pol->t_fwd[t] = best;
    }
    free(lg);
    dsf_session_free(s);
    return rc;
}
