/* spec.c: the speculative loop (dspark.md §7): draft -> verify in one multi-token forward ->
 * accept -> exact rollback, inside the generation loop of generate.c (through its hooks).
 *
 * Owns: the acceptance rule (greedy: the main sampler's own greedy pick must equal the draft;
 * tau > 0: exact speculative sampling), the per-sequence buffers and statistics, the calls to
 * the drafter (propose / commit / reset) and to the policy (spec_policy.c).
 * Must not: sample, stream or stop by itself: every committed token goes through gen_push,
 * which does exactly what the plain loop does per token (detokenize, callbacks, logprobs from
 * the row the token was chosen from, stop strings, EOS, max_tokens, context).
 * Invariants: after a round the main session holds exactly the committed tokens except the
 * pending one (as in the plain loop); the drafter has been told every committed position.
 *
 * Sampling transforms at tau > 0: the main side's target p is exactly the distribution
 * dsf_sample_ws draws from (top-k, top-p, min-p, temperature, ignore_eos: spec_target_dist);
 * the drafter's q is whatever distribution it drew its token from (the interface passes only
 * tau, so a drafter applies the temperature and no filter). The rule is exact for any q from
 * which d was really drawn: drafts outside the filters have p = 0 and are always rejected, and
 * the residual max(0, p - q) never leaves p's support, so the output distribution is the main
 * sampler's with its filters. */
#include "runtime/spec.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== acceptance (pure) ==================================================================== */

size_t spec_accept_work_bytes(int n_vocab) {
    return 2 * (size_t)n_vocab * sizeof(float) + (size_t)n_vocab * sizeof(int32_t) +
           dsf_sample_scratch_bytes(n_vocab);
}

int spec_target_dist(const float *logits, int n_vocab, const dsf_sampler_params *sp, float *p, void *scratch,
                     int32_t *ids) {
    int m = sampler_survivors(logits, n_vocab, sp, ids, scratch);
    if (m <= 0) return -1;
    double lmax = logits[ids[0]], inv_t = 1.0 / (double)sp->temperature, total = 0.0;
    for (int i = 1; i < m; i++)
        if (logits[ids[i]] > lmax) lmax = logits[ids[i]];
    memset(p, 0, (size_t)n_vocab * sizeof *p);
    for (int i = 0; i < m; i++) total += exp(((double)logits[ids[i]] - lmax) * inv_t);
    for (int i = 0; i < m; i++) p[ids[i]] = (float)(exp(((double)logits[ids[i]] - lmax) * inv_t) / total);
    return 0;
}

/* A draw from w[0..n) (non-negative, any sum > 0); -1 when the sum is 0. */
static int32_t draw(const float *w, int n, uint64_t *rng) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += w[i];
    if (!(total > 0)) return -1;
    double u = dsf_rng_uniform(rng) * total, acc = 0.0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        acc += w[i];
        last = i;
        if (u < acc) return i;
    }
    return last; /* u in the rounding gap at the top */
}

int spec_accept(const float *L, size_t ld, int n_vocab, const int32_t *d, const float *q, int n,
                const dsf_sampler_params *sp, uint64_t *rng, spec_rule rule, void *work, int32_t *out) {
    float *p = work, *r = p + n_vocab;
    int32_t *ids = (int32_t *)(r + n_vocab);
    void *scratch = ids + n_vocab;
    bool greedy = !(sp->temperature > 0.0f);
    for (int i = 0; i < n; i++) {
        const float *row = L + (size_t)i * ld;
        if (greedy) {
            int32_t t = dsf_sample_ws(row, n_vocab, sp, rng, scratch);
            out[i] = t;
            if (t != d[i] && rule == SPEC_RULE_EXACT) return i;
            out[i] = d[i];
            continue;
        }
        if (rule == SPEC_RULE_TEST_WRONG) { /* tests: the distribution becomes q's */
            out[i] = d[i];
            continue;
        }
        const float *qi = q + (size_t)i * ld;
        if (spec_target_dist(row, n_vocab, sp, p, scratch, ids) < 0) {
            out[i] = -1;
            return i;
        }
        double pd = d[i] >= 0 && d[i] < n_vocab ? p[d[i]] : 0.0, qd = d[i] >= 0 && d[i] < n_vocab ? qi[d[i]] : 0.0;
        double u = dsf_rng_uniform(rng);
        if (qd > 0 && u * qd < pd) { /* accept with probability min(1, p/q) */
            out[i] = d[i];
            continue;
        }
        for (int v = 0; v < n_vocab; v++) r[v] = p[v] > qi[v] ? p[v] - qi[v] : 0.0f;
        int32_t t = draw(r, n_vocab, rng);
        out[i] = t >= 0 ? t : draw(p, n_vocab, rng); /* p == q up to rounding: p itself */
        return i;
    }
    out[n] = dsf_sample_ws(L + (size_t)n * ld, n_vocab, sp, rng, scratch); /* the bonus from p_{n+1} */
    return n;
}

/* ==== the sequence ========================================================================= */

struct spec_seq {
    dsf_drafter *d;
    spec_policy pol;
    spec_rule rule;
    spec_stats st;
    int n_vocab_model, block;
    int n_plan;             /* drafts planned for the pending verification */
    int32_t ids[SPEC_MAX_BLOCK + 1], vt[SPEC_MAX_BLOCK + 1], out[SPEC_MAX_BLOCK + 1];
    float conf[SPEC_MAX_BLOCK];
    float *q;               /* [block][n_vocab_model] */
    float *rows;            /* [block + 1][n_vocab_model] verification logits */
    void *work;             /* spec_accept_work_bytes */
};

spec_seq *spec_seq_new(dsf_engine *e, dsf_drafter *d, const spec_policy *pol, char *err) {
    if (!d) {
        dsf_seterr(err, "spec_seq_new: no drafter");
        return NULL;
    }
    int nv = dsf_engine_n_vocab(e), B = d->ops->block;
    if (B < 1 || B > SPEC_MAX_BLOCK) {
        dsf_drafter_free(d);
        dsf_seterr(err, "the drafter's block of %d tokens is outside 1..%d", B, SPEC_MAX_BLOCK);
        return NULL;
    }
    spec_seq *sq = calloc(1, sizeof *sq);
    if (sq) {
        sq->q = malloc((size_t)B * (size_t)nv * sizeof(float));
        sq->rows = malloc((size_t)(B + 1) * (size_t)nv * sizeof(float));
        sq->work = malloc(spec_accept_work_bytes(nv));
    }
    if (!sq || !sq->q || !sq->rows || !sq->work) {
        spec_seq_free(sq);
        dsf_drafter_free(d);
        dsf_seterr(err, "out of memory for the speculative buffers (%d x %d logits)", B + 1, nv);
        return NULL;
    }
    sq->d = d;
    sq->block = B;
    sq->n_vocab_model = nv;
    if (pol) sq->pol = *pol;
    else spec_policy_init(&sq->pol);
    return sq;
}

void spec_seq_free(spec_seq *sq) {
    if (!sq) return;
    dsf_drafter_free(sq->d);
    free(sq->q);
    free(sq->rows);
    free(sq->work);
    free(sq);
}

spec_policy *spec_seq_policy(spec_seq *sq) { return &sq->pol; }
const spec_stats *spec_seq_stats(const spec_seq *sq) { return &sq->st; }
void spec_seq_stats_reset(spec_seq *sq) { memset(&sq->st, 0, sizeof sq->st); }
void spec_seq_set_rule(spec_seq *sq, spec_rule r) { sq->rule = r; }

void dsf_drafter_free(dsf_drafter *d) {
    if (d && d->ops->free) d->ops->free(d);
}

static int drafter_commit(spec_seq *sq, dsf_session *s, int p0, int p1, char *err) {
    if (p1 <= p0 || !sq->d->ops->commit) return 0;
    return sq->d->ops->commit(sq->d, s, p0, p1, err);
}

/* ==== one round ============================================================================ */

int spec_plan(spec_seq *sq, dsf_gen *g, int32_t a, char *err) {
    dsf_session *s = gen_session(g);
    const dsf_sampler_params *sp = gen_sampler(g);
    int N = dsf_session_n_past(s);
    /* The verification consumes n + 1 tokens and must leave one free slot, so that the
     * context check of every committed token sees what the plain loop sees (spec §7.6). */
    int n_max = dsf_session_max_ctx(s) - N - 2;
    if (n_max > sq->block) n_max = sq->block;
    if (sq->pol.max_draft > 0 && n_max > sq->pol.max_draft) n_max = sq->pol.max_draft;
    sq->n_plan = 0;
    if (gen_constrained(g) || !spec_policy_draft(&sq->pol, n_max)) return 0;
    float tau = sp->temperature > 0.0f ? sp->temperature : 0.0f;
    for (int i = 0; i < n_max; i++) sq->conf[i] = NAN;
    double t0 = dsf_now();
    int nd = sq->d->ops->propose(sq->d, s, a, n_max, tau, gen_rng(g), sq->ids, tau > 0 ? sq->q : NULL, sq->conf,
                                 err);
    if (nd < 0) return dsf_prefixerr(err, "draft at position %d", N);
    if (nd > n_max) return dsf_seterr(err, "the drafter returned %d tokens, more than the %d asked", nd, n_max);
    spec_cost_observe_draft(&sq->pol, dsf_now() - t0);
    for (int i = 0; i < nd; i++)
        if (sq->ids[i] < 0 || sq->ids[i] >= sq->n_vocab_model)
            return dsf_seterr(err, "the drafter proposed id %d outside the vocabulary", (int)sq->ids[i]);
    sq->st.drafted += nd;
    sq->n_plan = spec_policy_choose(&sq->pol, sq->conf, nd);
    return sq->n_plan;
}

dsf_finish_reason spec_verify(spec_seq *sq, dsf_gen *g, int32_t a, int32_t *next, char *err) {
    dsf_session *s = gen_session(g);
    int N = dsf_session_n_past(s), n = sq->n_plan, nv = sq->n_vocab_model;
    *next = -1;
    sq->vt[0] = a;
    memcpy(sq->vt + 1, sq->ids, (size_t)n * sizeof *sq->vt);
    double t0 = dsf_now();
    if (dsf_session_eval(s, sq->vt, n + 1, sq->rows, true, err) < 0) {
        dsf_prefixerr(err, "verification at position %d", N);
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    spec_cost_observe(&sq->pol, n + 1, dsf_now() - t0);
    int k = spec_accept(sq->rows, (size_t)nv, gen_n_vocab(g), sq->ids, sq->q, n, gen_sampler(g), gen_rng(g), sq->rule,
                        sq->work, sq->out);
    spec_calib_observe(&sq->pol.cal, sq->conf, n, k);
    sq->st.rounds++;
    sq->st.verified += n;
    sq->st.accepted += k;
    /* keep a, d_1..d_k; then commit them and the correction (or bonus) one by one */
    if (dsf_session_rollback(s, N + k + 1, err) < 0) {
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    dsf_finish_reason fin = DSF_FINISH_NONE;
    int c = 0;
    while (fin == DSF_FINISH_NONE && c <= k) {
        if (sq->out[c] < 0) {
            dsf_seterr(err, "no token can be sampled (every logit is -inf or NaN)");
            dsf_gen_fail(g, err);
            return DSF_FINISH_ERROR;
        }
        fin = gen_push(g, sq->rows + (size_t)c * (size_t)nv, sq->out[c], next, err);
        c++;
        sq->st.committed++;
    }
    /* finished inside the block (EOS, stop string, max_tokens): the session keeps the tokens
     * before the last committed one, as the plain loop leaves it */
    if (c <= k && dsf_session_rollback(s, N + c, err) < 0) {
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    if (drafter_commit(sq, s, N, dsf_session_n_past(s), err) < 0) {
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    return fin;
}

int spec_plain_done(spec_seq *sq, dsf_gen *g, double seconds, char *err) {
    dsf_session *s = gen_session(g);
    int n = dsf_session_n_past(s);
    sq->st.plain++;
    if (seconds > 0) spec_cost_observe(&sq->pol, 1, seconds);
    return drafter_commit(sq, s, n - 1, n, err);
}

dsf_finish_reason spec_round(spec_seq *sq, dsf_gen *g, int32_t a, int32_t *next, char *err) {
    *next = -1;
    dsf_finish_reason fin = gen_poll_cancel(g);
    if (fin != DSF_FINISH_NONE) return fin;
    int n = spec_plan(sq, g, a, err);
    if (n < 0) {
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    if (n > 0) return spec_verify(sq, g, a, next, err);
    dsf_session *s = gen_session(g);
    double t0 = dsf_now();
    if (dsf_session_eval(s, &a, 1, gen_logits(g), false, err) < 0) {
        dsf_prefixerr(err, "decode at position %d", dsf_session_n_past(s));
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    if (spec_plain_done(sq, g, dsf_now() - t0, err) < 0) {
        dsf_gen_fail(g, err);
        return DSF_FINISH_ERROR;
    }
    return dsf_gen_next(g, gen_logits(g), next, err);
}

/* ==== attaching to a generator ============================================================= */

static dsf_finish_reason hook_round(void *ud, dsf_gen *g, int32_t tok, int32_t *next, char *err) {
    return spec_round(ud, g, tok, next, err);
}

static int hook_prefilled(void *ud, dsf_gen *g, int n_cached, int n_prompt, char *err) {
    spec_seq *sq = ud;
    if (sq->d->ops->reset) sq->d->ops->reset(sq->d, n_cached);
    return drafter_commit(sq, gen_session(g), n_cached, n_prompt, err);
}

int spec_attach(dsf_gen *g, spec_seq *sq, char *err) {
    gen_set_hooks(g, NULL);
    if (!sq) return 0;
    if (sq->d->ops->bind && sq->d->ops->bind(sq->d, gen_session(g), err) < 0) return -1;
    gen_hooks h = {.round = hook_round, .prefilled = hook_prefilled, .ud = sq};
    gen_set_hooks(g, &h);
    return 0;
}
