/* spec.c: the speculative loop (src/runtime/spec.c) on real (tiny) models, in-process:
 * greedy equivalence with the oracle drafter (also corrupted at every block index) against
 * plain decoding -- ids, logprobs, text, finish reason and the session's final state -- over
 * 200 tokens, with max_tokens, stop strings and the context limit falling inside blocks;
 * and exact sampling on tinyds at tau = 1: the empirical next-token distribution with a
 * deliberately poor toy drafter, and with the real DSpark draft bound through spec_attach,
 * matches the target softmax (chi-square, fixed seeds), and the test fails when the accept
 * rule is made wrong (SPEC_RULE_TEST_WRONG).
 * Models: the synth tiny model (always) and ../shared/testdata/tinyds/tinyds.gguf with
 * tinyds-dspark.gguf (skipped if absent). The plain runs are the reference: the loop must not change a single token. */
#include "test.h"
#include "helpers.h"

#include "dsflash.h"
#include "runtime/generate.h"
#include "runtime/spec.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== fixture ============================================================================= */

typedef struct {
    test_gen_fx fx;
    int max_ctx;
} fixture;

static int fx_open(fixture *f, const char *path, int max_ctx) {
    f->max_ctx = max_ctx;
    return test_gen_open(&f->fx, path, max_ctx);
}

#define MAX_REC 512
typedef struct {
    int n;
    int32_t id[MAX_REC];
    float lp[MAX_REC];
} rec;

static void on_tok(void *ud, const dsf_gen_token *t) {
    rec *r = ud;
    if (r->n < MAX_REC) {
        r->id[r->n] = t->id;
        r->lp[r->n] = t->logprob;
    }
    r->n++;
}

typedef struct {
    rec r;
    dsf_gen_result res;
    int n_past;
    int32_t last_tok;
} outcome;

/* One generation from a fresh session state (rolled back to 0), speculative when sq != NULL. */
static int generate(fixture *f, spec_seq *sq, const int32_t *prompt, int n, const dsf_sampler_params *sp,
                    outcome *o, char *err) {
    memset(o, 0, sizeof *o);
    if (dsf_session_rollback(f->fx.s, 0, err) < 0) return -1;
    if (spec_attach(f->fx.g, sq, err) < 0) return -1;
    dsf_gen_params gp;
    dsf_gen_params_default(&gp);
    gp.sampler = *sp;
    gp.logprobs = true;
    gp.on_token = on_tok;
    gp.ud = &o->r;
    int rc = dsf_gen_run(f->fx.g, prompt, n, &gp, NULL, &o->res, err);
    spec_attach(f->fx.g, NULL, NULL);
    o->n_past = dsf_session_n_past(f->fx.s);
    o->last_tok = o->n_past ? dsf_session_tokens(f->fx.s)[o->n_past - 1] : -1;
    return rc;
}

/* The two outcomes are the same generation: same ids and logprobs (bit for bit: the multi-token
 * verification and the rollback give the decode's own logits), text, finish, state. */
static int same(const outcome *a, const outcome *b, char *why, size_t cap) {
    if (a->r.n != b->r.n) return snprintf(why, cap, "%d vs %d tokens", a->r.n, b->r.n), 0;
    for (int i = 0; i < a->r.n && i < MAX_REC; i++) {
        if (a->r.id[i] != b->r.id[i]) return snprintf(why, cap, "token %d: id %d vs %d", i, a->r.id[i], b->r.id[i]), 0;
        if (a->r.lp[i] != b->r.lp[i])
            return snprintf(why, cap, "token %d: logprob %.9g vs %.9g", i, a->r.lp[i], b->r.lp[i]), 0;
    }
    if (a->res.finish != b->res.finish) return snprintf(why, cap, "finish %d vs %d", a->res.finish, b->res.finish), 0;
    if (a->res.text_len != b->res.text_len || memcmp(a->res.text, b->res.text, a->res.text_len))
        return snprintf(why, cap, "texts differ"), 0;
    if (a->n_past != b->n_past || a->last_tok != b->last_tok)
        return snprintf(why, cap, "session holds %d tokens (last %d) vs %d (last %d)", a->n_past, a->last_tok,
                        b->n_past, b->last_tok), 0;
    return 1;
}

static void prompt_of(int32_t *p, int n, int nv, int salt) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 37 + salt * 11 + 5) % nv);
}

/* Runs plain vs oracle (uncorrupted, corrupted at 0..4) under sp; 0 ok, else fills why. */
static int equivalence(fixture *f, const int32_t *prompt, int n, const dsf_sampler_params *sp, char *why,
                       size_t cap, long long *verified) {
    char err[DSF_ERR_LEN] = "";
    outcome ref, got;
    if (generate(f, NULL, prompt, n, sp, &ref, err) < 0) return snprintf(why, cap, "plain: %s", err), -1;
    for (int corrupt = -1; corrupt < 5; corrupt++) {
        dsf_drafter *d = spec_oracle_new(f->fx.e, f->max_ctx, 5, corrupt, err);
        spec_policy pol;
        spec_policy_init(&pol);
        pol.mode = SPEC_POLICY_ALWAYS;
        spec_seq *sq = d ? spec_seq_new(f->fx.e, d, &pol, err) : NULL;
        if (!sq) return snprintf(why, cap, "oracle: %s", err), -1;
        int rc = generate(f, sq, prompt, n, sp, &got, err);
        const spec_stats *st = spec_seq_stats(sq);
        long long acc = st->accepted, ver = st->verified, rounds = st->rounds;
        spec_seq_free(sq);
        if (rc < 0) return snprintf(why, cap, "oracle %d: %s", corrupt, err), -1;
        char d2[256] = "";
        int ok = same(&ref, &got, d2, sizeof d2);
        /* the oracle's drafts are the greedy tokens: all accepted, or all up to the corruption */
        bool rate_ok = corrupt < 0 ? acc == ver : acc <= rounds * corrupt;
        if (verified) *verified += ver;
        dsf_gen_result_free(&got.res);
        if (!ok || !rate_ok) {
            dsf_gen_result_free(&ref.res);
            return snprintf(why, cap, "oracle corrupted at %d: %s (accepted %lld of %lld)", corrupt,
                            ok ? "acceptance" : d2, acc, ver), -1;
        }
    }
    dsf_gen_result_free(&ref.res);
    return 0;
}

/* Guards against any difference between speculative and plain greedy decoding: long accepts
 * (the uncorrupted oracle), rejections at every block index, and the endings that can fall
 * inside an accepted block -- max_tokens, a stop string, EOS, the context limit. */
static void check_greedy(test_ctx *t, const char *path) {
    fixture f;
    CHECKF(fx_open(&f, path, 320) == 0, "cannot open %s", path);
    int nv = dsf_engine_n_vocab(f.fx.e);
    int32_t prompt[12];
    prompt_of(prompt, 12, nv, 1);
    char why[512] = "";
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = true;
    sp.max_tokens = 200;
    long long ver = 0;
    CHECKF(equivalence(&f, prompt, 12, &sp, why, sizeof why, &ver) == 0, "200 tokens: %s", why);
    CHECKF(ver >= 6 * 150, "only %lld drafts verified in 6 runs of 200 tokens", ver);
    const int maxes[] = {1, 2, 6, 7, 13};
    for (size_t i = 0; i < sizeof maxes / sizeof *maxes; i++) {
        sp.max_tokens = maxes[i];
        CHECKF(equivalence(&f, prompt, 12, &sp, why, sizeof why, NULL) == 0, "max_tokens %d: %s", maxes[i], why);
    }
    /* EOS allowed (the model may or may not emit it within 60 tokens: either way the same) */
    sp.ignore_eos = false;
    sp.max_tokens = 60;
    CHECKF(equivalence(&f, prompt, 12, &sp, why, sizeof why, NULL) == 0, "with EOS: %s", why);
    /* a stop string taken from the middle of the plain output */
    outcome ref;
    char err[DSF_ERR_LEN];
    sp.ignore_eos = true;
    CHECK(generate(&f, NULL, prompt, 12, &sp, &ref, err) == 0);
    char stop[8] = "";
    if (ref.res.text_len > 40) memcpy(stop, ref.res.text + 23, 2);
    dsf_gen_result_free(&ref.res);
    const char *stops[1] = {stop};
    if (stop[0] && stop[1]) {
        sp.stop = stops;
        sp.n_stop = 1;
        CHECKF(equivalence(&f, prompt, 12, &sp, why, sizeof why, NULL) == 0, "stop string: %s", why);
        sp.n_stop = 0;
    }
    test_gen_close(&f.fx);
    /* the context limit: 12 + 45 tokens fill a 57-token session inside a block */
    CHECKF(fx_open(&f, path, 57) == 0, "cannot open %s", path);
    sp.max_tokens = 0;
    CHECKF(equivalence(&f, prompt, 12, &sp, why, sizeof why, NULL) == 0, "context limit: %s", why);
    test_gen_close(&f.fx);
}

TEST(spec_greedy_identical_synth) {
    static char path[512];
    const char *p = test_synth_tiny(path, sizeof path, "spec-tiny.gguf", 7);
    CHECK(p);
    check_greedy(t, p);
}

TEST(spec_greedy_identical_tinyds) {
    NEED_SHARED(p, "testdata/tinyds/tinyds.gguf");
    check_greedy(t, p);
}

/* ==== exact sampling ======================================================================= */

/* The toy drafter: a context-free proposal, uniform over 4 fixed ids (a poor draft on purpose:
 * most of the target's mass lies elsewhere, so the residual draws matter). */
typedef struct {
    dsf_drafter base;
    dsf_drafter_ops ops;
    int n_vocab;
    int32_t set[4];
} toy;

static int toy_propose(dsf_drafter *d, dsf_session *s, int32_t anchor, int n, float tau, uint64_t *rng,
                       int32_t *ids, float *q, float *conf, char *err) {
    toy *o = (toy *)d;
    for (int i = 0; i < n; i++) {
        int k = (int)(dsf_rng_uniform(rng) * 4);
        ids[i] = o->set[k > 3 ? 3 : k];
        conf[i] = NAN;
        if (q) {
            float *qi = q + (size_t)i * (size_t)o->n_vocab;
            memset(qi, 0, (size_t)o->n_vocab * sizeof *qi);
            for (int j = 0; j < 4; j++) qi[o->set[j]] = 0.25f;
        }
    }
    return n;
}

static void toy_free(dsf_drafter *d) { free(d); }

/* Upper critical value of chi-square at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df), z = 3.0902, c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* The chi-square statistic of counts[0..nv) against the probabilities p[0..nv) (n draws),
 * bins merged in id order until each expects >= 10; *df = bins - 1. */
static double chi2(const long *counts, const double *p, int nv, long n, int *df) {
    double x = 0, e = 0, o = 0;
    int bins = 0;
    for (int v = 0; v < nv; v++) {
        e += p[v] * (double)n;
        o += (double)counts[v];
        if (e >= 10 || v == nv - 1) {
            if (e > 0) x += (o - e) * (o - e) / e;
            bins++;
            e = o = 0;
        }
    }
    *df = bins - 1;
    return x;
}

/* The toy over the main engine's vocab: the ids 5, 102, 199, 296 -- plausible yet wrong. */
static dsf_drafter *toy_new(int nv) {
    toy *d = calloc(1, sizeof *d);
    d->ops = (dsf_drafter_ops){.propose = toy_propose, .free = toy_free, .block = 3};
    d->base.ops = &d->ops;
    d->n_vocab = nv;
    for (int j = 0; j < 4; j++) d->set[j] = (int32_t)((5 + 97 * j) % nv);
    return &d->base;
}

/* The token after a fixed prompt and anchor, drafted by d (owned; NULL: the toy, block 3) and
 * verified (tau = 1), n_samples times with seeds 1..n; returns the chi-square against the
 * target. With attach, d is bound to the generator's session through the loop's attach path
 * (spec_attach, from an empty session), so that every prefill records the target features
 * and commits them to d, as `run --draft` does. */
static int sample_after_anchor(test_ctx *t, fixture *f, dsf_drafter *d, bool attach, spec_rule rule, long n_samples,
                               double *x, int *df) {
    char err[DSF_ERR_LEN] = "";
    int nv = dsf_engine_n_vocab(f->fx.e);
    int32_t prompt[9];
    prompt_of(prompt, 8, nv, 3);
    /* the target: softmax of the logits after prompt + anchor, in double, on a fresh session */
    int32_t anchor = 17 % nv;
    prompt[8] = anchor;
    float *lg = malloc((size_t)nv * sizeof *lg);
    double *p = malloc((size_t)nv * sizeof *p);
    long *cnt = calloc((size_t)nv, sizeof *cnt);
    dsf_session *s = dsf_session_new(f->fx.e, 32, err);
    if (!s || dsf_session_eval(s, prompt, 9, lg, false, err) < 0) return test_fail(t, __FILE__, __LINE__, "%s", err), -1;
    dsf_session_free(s);
    double mx = lg[0], sum = 0;
    for (int v = 1; v < nv; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < nv; v++) sum += (p[v] = exp((double)lg[v] - mx));
    for (int v = 0; v < nv; v++) p[v] /= sum;
    if (!d) d = toy_new(nv);
    spec_policy pol;
    spec_policy_init(&pol);
    pol.mode = SPEC_POLICY_ALWAYS;
    spec_seq *sq = spec_seq_new(f->fx.e, d, &pol, err);
    int rc = -1;
    if (!sq) goto done;
    spec_seq_set_rule(sq, rule);
    if (attach && (dsf_session_rollback(f->fx.s, 0, err) < 0 || spec_attach(f->fx.g, sq, err) < 0)) goto done;
    for (long i = 0; i < n_samples; i++) {
        rec r = {0};
        dsf_gen_params gp;
        dsf_gen_params_default(&gp);
        gp.sampler.seed = (uint64_t)i + 1;
        gp.on_token = on_tok;
        gp.ud = &r;
        int32_t a, next;
        dsf_gen_result res;
        if (dsf_gen_prefill(f->fx.g, prompt, 8, 0, NULL, NULL, err) < 0 || dsf_gen_begin(f->fx.g, &gp, err) < 0) goto done;
        if (gen_push(f->fx.g, gen_logits(f->fx.g), anchor, &a, err) != DSF_FINISH_NONE) goto done;
        dsf_finish_reason fin = spec_round(sq, f->fx.g, a, &next, err);
        dsf_gen_end(f->fx.g, &res, err);
        dsf_gen_result_free(&res);
        if (fin == DSF_FINISH_ERROR || r.n < 2) goto done;
        cnt[r.id[1]]++;
    }
    *x = chi2(cnt, p, nv, n_samples, df);
    rc = 0;
done:
    if (rc) test_fail(t, __FILE__, __LINE__, "sampling failed: %s", err);
    if (attach) spec_attach(f->fx.g, NULL, NULL);
    spec_seq_free(sq);
    free(lg);
    free(p);
    free(cnt);
    return rc;
}

/* Guards the exactness of speculative sampling on a real model: the committed token after the
 * anchor follows the main model's softmax at tau = 1, although the drafter proposes from a
 * very different distribution; the same statistic with the accept rule made wrong fails. */
TEST(spec_sampling_matches_target_tinyds) {
    NEED_SHARED(path, "testdata/tinyds/tinyds.gguf");
    fixture f;
    CHECKF(fx_open(&f, path, 64) == 0, "cannot open %s", path);
    double x = 0, xw = 0;
    int df = 0, dfw = 0;
    if (sample_after_anchor(t, &f, NULL, false, SPEC_RULE_EXACT, 1500, &x, &df) == 0 &&
        sample_after_anchor(t, &f, NULL, false, SPEC_RULE_TEST_WRONG, 1500, &xw, &dfw) == 0) {
        dsf_log(1, "spec sampling: chi2 %.1f (%d df), wrong rule %.1f (%d df)", x, df, xw, dfw);
        CHECKF(df >= 5 && x < chi2_crit(df), "exact rule: chi2 %.1f with %d df (critical %.1f)", x, df, chi2_crit(df));
        CHECKF(xw > chi2_crit(dfw), "wrong rule not detected: chi2 %.1f with %d df", xw, dfw);
    }
    test_gen_close(&f.fx);
}

/* Guards the exactness of speculative sampling with the real DSpark draft (tinyds-dspark.gguf,
 * bound through spec_attach so that the prefill records the target features and commits the
 * rings, as `run --draft` does): its proposals q are the draft model's softmax, conditioned on
 * the rings, the anchor and the Markov term, and the committed token after the anchor must
 * still follow the main model's softmax at tau = 1; accepting every draft
 * (SPEC_RULE_TEST_WRONG) makes the distribution q's, which the same statistic must detect. */
TEST(spec_sampling_matches_target_dspark) {
    NEED_SHARED(path, "testdata/tinyds/tinyds.gguf");
    NEED_SHARED(dpath, "testdata/tinyds/tinyds-dspark.gguf");
    fixture f;
    CHECKF(fx_open(&f, path, 64) == 0, "cannot open %s", path);
    char err[DSF_ERR_LEN] = "";
    double x = 0, xw = 0;
    int df = 0, dfw = 0;
    /* one drafter per run (sample_after_anchor owns it), opened as `--draft FILE` opens it */
    dsf_drafter *d = spec_load_drafter(f.fx.e, dpath, err);
    CHECKF(d, "%s", err);
    if (d && sample_after_anchor(t, &f, d, true, SPEC_RULE_EXACT, 1500, &x, &df) == 0) {
        dsf_drafter *dw = spec_load_drafter(f.fx.e, dpath, err);
        CHECKF(dw, "%s", err);
        if (dw && sample_after_anchor(t, &f, dw, true, SPEC_RULE_TEST_WRONG, 1500, &xw, &dfw) == 0) {
            dsf_log(1, "spec sampling (dspark): chi2 %.1f (%d df), wrong rule %.1f (%d df)", x, df, xw, dfw);
            CHECKF(df >= 5 && x < chi2_crit(df), "exact rule: chi2 %.1f with %d df (critical %.1f)", x, df,
                   chi2_crit(df));
            CHECKF(xw > chi2_crit(dfw), "wrong rule not detected: chi2 %.1f with %d df", xw, dfw);
        }
    }
    test_gen_close(&f.fx);
}
