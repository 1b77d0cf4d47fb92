/* spec.h: speculative decoding (runtime layer; dspark.md §7): the drafter interface, the
 * cost-aware block-length policy and the speculative round inside the generation loop.
 *
 * A drafter proposes tokens; the main model verifies them in one multi-token forward
 * (per-position logits), the acceptance rule decides how many are committed, and the main
 * session is rolled back exactly to the committed length. Greedy output is identical to
 * non-speculative greedy decoding; at temperature > 0 the output distribution is exactly the
 * main model's (speculative sampling, Leviathan et al. 2023). The policy only changes how
 * many drafted tokens are verified, never what is generated. docs/SPECULATIVE.md states the
 * policy. */
#ifndef DSF_SPEC_H
#define DSF_SPEC_H

#include "dsflash.h"

/* ==== the drafter interface (TASK35_IFACE) ================================================ */

/* A drafter: proposes up to n tokens after the anchor. One per sequence (it holds that
 * sequence's draft state). */
typedef struct dsf_drafter dsf_drafter;
typedef struct {
    /* Draft after the last committed position p (the session's n_past - 1) with the anchor a
     * (the main model's token for p + 1, not yet consumed). Writes ids[0..n) (the drafted
     * tokens for p+2..p+n+1), and, when q != NULL, the proposal distributions
     * q[i*n_vocab .. (i+1)*n_vocab) (n_vocab: the main model's; probabilities that sum to 1:
     * exactly the distribution ids[i] was drawn from, given the SAMPLED ids[0..i)), and
     * conf[i] = the confidence head's raw logit for ids[i] (NAN when the drafter has none).
     * q is non-NULL exactly when tau > 0; then ids are sampled with *rng (the only
     * randomness). Returns the number drafted (0..n), or -1 with err. Must leave the main
     * session s as it found it (same n_past and state). */
    int (*propose)(dsf_drafter *d, dsf_session *s, int32_t anchor, int n, float tau, uint64_t *rng, int32_t *ids,
                   float *q, float *conf, char *err);
    /* The main model committed positions [p0, p1): the drafter updates its state from them
     * (DSpark: the rings, from the target features the main forward recorded for those
     * positions). Called after every prefill and every verification or decode step, after
     * the rollback (s then holds exactly p1 tokens). NULL: nothing to do. */
    int (*commit)(dsf_drafter *d, dsf_session *s, int p0, int p1, char *err);
    /* The sequence was rolled back / reset to n_past (e.g. a server slot reused for another
     * prompt, or a prefill reusing a prefix): forget everything at positions >= n_past.
     * NULL: nothing to do. */
    void (*reset)(dsf_drafter *d, int n_past);
    void (*free)(dsf_drafter *d);
    int block; /* the largest n it can draft (DSpark: B drafted per call) */
    /* Optional (NULL: nothing to do): the drafter will serve the main session s, called once
     * when it is attached (spec_attach), before any prefill of s: a DSpark drafter turns on
     * the target-feature recording of s here, so that the prefill already records them. */
    int (*bind)(dsf_drafter *d, dsf_session *s, char *err);
} dsf_drafter_ops;
struct dsf_drafter {
    const dsf_drafter_ops *ops;
};

/* Most drafted tokens per round that the loop supports (buffers, cost table). */
#define SPEC_MAX_BLOCK 16

/* Loads a DSpark draft GGUF for the main engine: one drafter per sequence (bound to its
 * session by ops->bind). NULL with err naming the file and the problem. */
dsf_drafter *spec_load_drafter(dsf_engine *e, const char *path, char *err);
/* What --draft names: "oracle" or "oracle:K" (the test hook below), else a draft GGUF
 * (spec_load_drafter). max_ctx: the main sessions' context (the oracle's own session). */
dsf_drafter *spec_open_drafter(dsf_engine *e, const char *what, int max_ctx, char *err);
/* The test drafter: proposes the main model's own continuation, evaluated on a session of
 * its own that it keeps equal to the main session's committed tokens: at tau = 0 the
 * greedy tokens (every draft is accepted), at tau > 0 samples from the main model's
 * softmax(L / tau) (q = that distribution). corrupt >= 0: the draft at that index (and
 * only it) is replaced by another token (greedy only), so that rejections at every place
 * of the block are exercised. block: drafts per call (<= SPEC_MAX_BLOCK). */
dsf_drafter *spec_oracle_new(dsf_engine *e, int max_ctx, int block, int corrupt, char *err);
void dsf_drafter_free(dsf_drafter *d);

/* ==== opening (spec_load.c) =============================================================== */

typedef struct spec_seq spec_seq;
typedef struct spec_policy spec_policy;

/* The options of run, chat, serve and bench. */
typedef struct {
    const char *draft;  /* --draft: a DSpark GGUF, or "oracle[:K]" (tests); NULL: no drafting */
    int max_draft;      /* --draft-max N: at most N drafted tokens verified per round (0: the block) */
    float min_p;        /* --draft-min-p P: cut the block where the cumulative acceptance probability < P */
    bool always;        /* --draft-policy always: verify every drafted token (no cost model) */
} spec_opts;

/* Opens o->draft and its sequence state for one session of max_ctx tokens. base: the policy
 * to start from (its cost table; NULL: measured now on e). The oracle test hook verifies
 * everything it drafts (SPEC_POLICY_ALWAYS: it exists to exercise long accepts). */
spec_seq *spec_open(dsf_engine *e, const spec_opts *o, int max_ctx, const spec_policy *base, char *err);

/* ==== the cost-aware block length (spec_policy.c) ========================================= */

typedef enum {
    SPEC_POLICY_COST = 0, /* the cost model below (the default) */
    SPEC_POLICY_ALWAYS,   /* verify everything drafted (tests; bench's "always verify B") */
} spec_policy_mode;

/* Calibration of the confidence head: per bucket of sigmoid(conf) (or, for a drafter with no
 * confidence, per position in the block) the observed accepts and trials, on top of a prior
 * of SPEC_PRIOR_N pseudo-trials at the bucket's centre (or 0.5). */
#define SPEC_CONF_BUCKETS 10
#define SPEC_PRIOR_N 4.0
typedef struct {
    double acc[SPEC_CONF_BUCKETS], n[SPEC_CONF_BUCKETS];   /* conf buckets */
    double pacc[SPEC_MAX_BLOCK], pn[SPEC_MAX_BLOCK];       /* per position (conf NAN) */
} spec_calib;

struct spec_policy {
    spec_policy_mode mode;
    int max_draft;      /* --draft-max: at most this many drafted tokens verified (0: the drafter's block) */
    float min_p;        /* --draft-min-p: stop the block where the cumulative acceptance probability < min_p */
    /* t_fwd[t]: seconds of one main forward of t tokens (t = 1..SPEC_MAX_BLOCK+1; 0 = unknown:
     * then t_fwd[1] * t is assumed, the worst case of no sharing); t_draft: seconds per draft
     * call. Measured at startup (spec_cost_measure) and refined online (spec_cost_observe). */
    double t_fwd[SPEC_MAX_BLOCK + 2];
    double t_draft;
    spec_calib cal;
    int n_skipped;      /* rounds in a row without drafting (exploration, see spec_policy_draft) */
};

void spec_policy_init(spec_policy *pol);
/* The calibrated probability that the draft at block index i with confidence conf (raw
 * logit, NAN = none) is accepted, given that the ones before it were. */
double spec_calib_prob(const spec_calib *c, int i, float conf);
/* Records one verification: n drafts verified with confidences conf[0..n), k accepted. */
void spec_calib_observe(spec_calib *c, const float *conf, int n, int k);
/* Seconds of a forward of t tokens according to the table. */
double spec_cost_fwd(const spec_policy *pol, int t);
/* Refines the table with one observed forward of t tokens (exponential average). */
void spec_cost_observe(spec_policy *pol, int t, double seconds);
void spec_cost_observe_draft(spec_policy *pol, double seconds);
/* The expected committed tokens per second when n drafts with per-draft acceptance
 * probabilities c[0..n) are verified, with `extra` seconds spent beside the forward. */
double spec_rate(const spec_policy *pol, const double *c, int n, double extra);
/* Before drafting: should this round draft at most n_max tokens at all? Compares the rate
 * expected from the calibration's per-position history (draft cost included) with plain
 * decoding; when drafting loses it still drafts once every SPEC_EXPLORE skipped rounds so
 * the calibration can see the drafter improve. */
#define SPEC_EXPLORE 16
bool spec_policy_draft(spec_policy *pol, int n_max);
/* After drafting nd tokens with confidences conf[0..nd): how many to verify (0..nd):
 * the n that maximizes the expected committed tokens per second of this round (the draft
 * is paid already), cut where the cumulative acceptance probability falls below min_p and
 * at max_draft; 0 when no n beats a plain decode step. Ties go to the smaller n. */
int spec_policy_choose(const spec_policy *pol, const float *conf, int nd);
/* The projected speed-up over plain decoding (tokens per second, ratio) when every draft is
 * accepted with probability accept, for a drafter of block B under the table and t_draft:
 * always = true verifies all B ("always verify B"); otherwise the policy's choice, which
 * drafts only when that wins (so the result is >= 1). */
double spec_project(const spec_policy *pol, double accept, int B, bool always);
/* Measures t_fwd[1..n_max+1] on the engine with a scratch session (best of 3 per size). */
int spec_cost_measure(dsf_engine *e, int n_max, spec_policy *pol, char *err);

/* ==== acceptance (spec.c; pure) =========================================================== */

typedef enum {
    SPEC_RULE_EXACT = 0,   /* min(1, p/q), residual norm(max(0, p - q)) */
    SPEC_RULE_TEST_WRONG,  /* TESTS ONLY: accept every draft (the distribution then is q's) */
} spec_rule;

/* The distribution dsf_sample_ws draws from at temperature > 0 (top-k -> top-p -> min-p ->
 * temperature; ignore_eos), over ids [0, n_vocab): p[n_vocab]. scratch: as dsf_sample_ws.
 * Returns 0, or -1 when no token is possible. */
int spec_target_dist(const float *logits, int n_vocab, const dsf_sampler_params *sp, float *p, void *scratch,
                     int32_t *ids);
/* The acceptance of one verified block. L: [n+1] rows of stride ld (row j: the main logits
 * after consuming the anchor and d[0..j)); d[0..n) drafts; q: [n] rows of stride ld, the
 * proposals (tau > 0 only); ids >= n_vocab are never sampled. Greedy (sp->temperature <= 0): accepts while d[i] == the sampler's greedy pick of
 * L[i]. Sampling: accepts d[i] with probability min(1, p_i(d_i)/q_i(d_i)), else draws the
 * correction from norm(max(0, p_i - q_i)) and stops; the bonus after n accepts is drawn by
 * dsf_sample_ws from L[n]. Writes out[0..k] (the k accepted drafts then the correction or
 * bonus) and returns k. work: 2 * n_vocab floats + n_vocab int32 + dsf_sample_scratch_bytes. */
int spec_accept(const float *L, size_t ld, int n_vocab, const int32_t *d, const float *q, int n,
                const dsf_sampler_params *sp, uint64_t *rng, spec_rule rule, void *work, int32_t *out);
size_t spec_accept_work_bytes(int n_vocab);

/* ==== the speculative sequence (spec.c) =================================================== */

/* spec_seq: the speculative state of one sequence: its drafter (owned), its policy and its
 * buffers. */

typedef struct {
    long long rounds;     /* speculative rounds (with a verification of >= 1 draft) */
    long long plain;      /* decode steps without drafts (policy or context limit) */
    long long drafted;    /* tokens drafted */
    long long verified;   /* drafted tokens verified */
    long long accepted;   /* drafted tokens accepted */
    long long committed;  /* tokens committed by speculative rounds (accepted + corrections/bonus) */
} spec_stats;

/* Takes ownership of d. pol: the policy to start from (its cost table), copied. n_vocab: the
 * engine's. NULL + err on failure (d is freed then). */
spec_seq *spec_seq_new(dsf_engine *e, dsf_drafter *d, const spec_policy *pol, char *err);
void spec_seq_free(spec_seq *sq);
spec_policy *spec_seq_policy(spec_seq *sq);
const spec_stats *spec_seq_stats(const spec_seq *sq);
void spec_seq_stats_reset(spec_seq *sq);
/* TESTS ONLY: the acceptance rule (default SPEC_RULE_EXACT). */
void spec_seq_set_rule(spec_seq *sq, spec_rule r);

/* Makes g decode speculatively with sq (NULL: detach): binds the drafter to g's session
 * (ops->bind), then dsf_gen_decode / dsf_gen_run run spec rounds and every completed prefill
 * informs the drafter (reset + commit). sq must outlive the attachment. 0, or -1 with err
 * (the bind failed; nothing is attached). */
int spec_attach(dsf_gen *g, spec_seq *sq, char *err);

/* One round after the generator returned the pending token a (not yet evaluated): plan
 * (spec_plan) and then verify (spec_verify) or a plain decode step (spec_plain). Returns like
 * dsf_gen_next: DSF_FINISH_NONE with *next = the new pending token, else the finish. */
dsf_finish_reason spec_round(spec_seq *sq, dsf_gen *g, int32_t a, int32_t *next, char *err);
/* Step-wise (the server): spec_plan drafts and picks the block; returns n >= 1 when the
 * round should verify n drafts (then call spec_verify), 0 when the token should be evaluated
 * plainly (then evaluate a, alone or batched, and call spec_plain_done), -1 on a drafter
 * failure (err). */
int spec_plan(spec_seq *sq, dsf_gen *g, int32_t a, char *err);
dsf_finish_reason spec_verify(spec_seq *sq, dsf_gen *g, int32_t a, int32_t *next, char *err);
/* After a plain step evaluated a on the session (n_past grew by one): informs the drafter
 * and the cost table (seconds: the forward's time, <= 0: unknown). Returns 0 or -1 (err). */
int spec_plain_done(spec_seq *sq, dsf_gen *g, double seconds, char *err);

#endif
