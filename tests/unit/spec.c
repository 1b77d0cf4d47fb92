/* spec.c: the pure parts of speculative decoding (src/runtime/spec.c, spec_policy.c): the
 * acceptance rule on a 2-token toy distribution (statistically, with a switch that makes the
 * rule wrong so the test is seen to fail), greedy acceptance, and the cost-aware block-length
 * policy on synthetic cost tables and confidences (expected choices computed by hand below).
 * The loop on a real model is tests/tiny/spec.c. */
#include "test.h"
#include "dsflash.h"
#include "runtime/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== statistics ========================================================================== */

/* Upper critical value of chi-square with df degrees of freedom at p = 0.001
 * (Wilson-Hilferty: df * (1 - 2/(9df) + z sqrt(2/(9df)))^3, z = 3.0902). */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df), z = 3.0902;
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* ==== acceptance on a 2-token toy distribution ============================================ */

/* Target p = (0.3, 0.7) (logits log 0.3, log 0.7 at temperature 1), proposal q = (0.8, 0.2):
 * the draft is drawn from q, one block of n = 1 is verified, the first committed token is
 * counted. Exact speculative sampling makes its distribution p: by hand, P(0) = q0 min(1,
 * p0/q0) + (residual mass) = 0.8 * 0.375 + 0 ... = 0.3 (the residual max(0, p - q) = (0, 0.5)
 * only ever gives 1). Returns the chi-square statistic of the counts against p (df = 1). */
static double toy_chi2(spec_rule rule, int n_samples, double *frac0) {
    const float L[2][2] = {{logf(0.3f), logf(0.7f)}, {0.0f, 0.0f}};
    const float q[2] = {0.8f, 0.2f};
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp); /* temperature 1, no filters */
    uint64_t rng = dsf_rng_init(12345);
    void *work = malloc(spec_accept_work_bytes(2));
    long cnt[2] = {0, 0};
    for (int s = 0; s < n_samples; s++) {
        int32_t d = dsf_rng_uniform(&rng) < q[0] ? 0 : 1, out[2];
        int k = spec_accept(&L[0][0], 2, 2, &d, q, 1, &sp, &rng, rule, work, out);
        (void)k;
        cnt[out[0]]++;
    }
    free(work);
    double e0 = 0.3 * n_samples, e1 = 0.7 * n_samples;
    *frac0 = (double)cnt[0] / n_samples;
    return (cnt[0] - e0) * (cnt[0] - e0) / e0 + (cnt[1] - e1) * (cnt[1] - e1) / e1;
}

/* Guards against a wrong accept/residual rule: the committed token must follow the target,
 * not the proposal; the deliberately wrong rule (accept everything) must be caught. */
TEST(spec_toy_two_token_distribution) {
    double f0;
    double x = toy_chi2(SPEC_RULE_EXACT, 20000, &f0);
    CHECKF(x < chi2_crit(1), "exact rule: chi2 %.2f >= %.2f (P(0) = %.4f, want 0.3)", x, chi2_crit(1), f0);
    double xw = toy_chi2(SPEC_RULE_TEST_WRONG, 20000, &f0);
    CHECKF(xw > chi2_crit(1), "the wrong rule was not detected: chi2 %.2f (P(0) = %.4f)", xw, f0);
}

/* Guards the greedy rule: accept while the draft equals the argmax of the row before it, then
 * the correction; the bonus after a full accept. */
TEST(spec_greedy_accept_prefix) {
    /* rows (V = 3): argmax 2, 0, 1, 1 */
    const float L[4][3] = {{0, 1, 5}, {3, 1, 2}, {0, 4, 1}, {0, 9, 1}};
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp);
    sp.temperature = 0;
    uint64_t rng = 1;
    void *work = malloc(spec_accept_work_bytes(3));
    int32_t out[4];
    const int32_t d1[3] = {2, 0, 0};
    int k = spec_accept(&L[0][0], 3, 3, d1, NULL, 3, &sp, &rng, SPEC_RULE_EXACT, work, out);
    CHECKF(k == 2 && out[0] == 2 && out[1] == 0 && out[2] == 1, "k %d out %d %d %d", k, out[0], out[1], out[2]);
    const int32_t d2[3] = {2, 0, 1};
    k = spec_accept(&L[0][0], 3, 3, d2, NULL, 3, &sp, &rng, SPEC_RULE_EXACT, work, out);
    CHECKF(k == 3 && out[3] == 1, "full accept: k %d bonus %d", k, out[3]);
    const int32_t d3[3] = {1, 0, 1};
    k = spec_accept(&L[0][0], 3, 3, d3, NULL, 3, &sp, &rng, SPEC_RULE_EXACT, work, out);
    CHECKF(k == 0 && out[0] == 2, "first rejected: k %d out %d", k, out[0]);
    CHECK(rng == 1); /* greedy draws nothing */
    free(work);
}

/* Guards the target distribution: the main sampler's filters apply to p (top-k 1 leaves the
 * argmax only, so every other draft is rejected and the correction is the argmax). */
TEST(spec_target_respects_filters) {
    const float L[2][3] = {{0, 2, 1}, {0, 0, 0}};
    const float q[3] = {0.5f, 0.25f, 0.25f};
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp);
    sp.top_k = 1;
    uint64_t rng = 7;
    void *work = malloc(spec_accept_work_bytes(3));
    for (int s = 0; s < 200; s++) {
        int32_t d = s % 3, out[2];
        int k = spec_accept(&L[0][0], 3, 3, &d, q, 1, &sp, &rng, SPEC_RULE_EXACT, work, out);
        CHECKF(out[0] == 1 && k == (d == 1), "draft %d: k %d out %d", d, k, out[0]);
    }
    free(work);
}

/* ==== the policy ============================================================================ */

/* A table with t_fwd[t] = t1 * (1 + slope (t - 1)). */
static void table(spec_policy *pol, double t1, double slope) {
    spec_policy_init(pol);
    for (int t = 1; t <= SPEC_MAX_BLOCK + 1; t++) pol->t_fwd[t] = t1 * (1.0 + slope * (t - 1));
}

/* Guards "never verify more when the model says it loses": with no sharing at all (a forward
 * of t tokens costs t single ones) the expected tokens (1 + E_n) never beat n + 1 single
 * steps, so nothing is verified, however confident the drafter is; and drafting itself is
 * skipped except for the exploration round every SPEC_EXPLORE. */
TEST(spec_policy_no_sharing_never_verifies) {
    spec_policy pol;
    table(&pol, 0.01, 1.0);
    float conf[5] = {8, 8, 8, 8, 8};
    CHECK(spec_policy_choose(&pol, conf, 5) == 0);
    pol.t_draft = 0.001;
    int drafted = 0;
    for (int r = 0; r < 4 * SPEC_EXPLORE; r++) drafted += spec_policy_draft(&pol, 5);
    CHECKF(drafted == 4, "drafted in %d of %d rounds (want 1 in %d)", drafted, 4 * SPEC_EXPLORE, SPEC_EXPLORE);
}

/* Guards the use of the verification's sharing: free verification (flat table) verifies the
 * whole block whenever acceptance is possible. */
TEST(spec_policy_flat_table_verifies_all) {
    spec_policy pol;
    table(&pol, 0.01, 0.0);
    float conf[5] = {-2, -2, -2, -2, -2};
    CHECK(spec_policy_choose(&pol, conf, 5) == 5);
    CHECK(spec_policy_choose(&pol, conf, 3) == 3);
    pol.max_draft = 2;
    CHECK(spec_policy_choose(&pol, conf, 5) == 2);
}

/* Guards the cost/benefit balance on a CPU-like table, t_fwd = 1 + 0.3 (t - 1) (units of one
 * decode step). Prior acceptance = the bucket centre of sigmoid(conf) (no observations yet):
 * conf = 5 -> sigmoid 0.9933, bucket 9, c = 0.95; conf = -5 -> bucket 0, c = 0.05.
 * By hand, c = 0.95: rate(n) = (1 + sum_{j<=n} 0.95^j) / (1 + 0.3 n):
 *   n=0 1.000, n=1 1.500, n=2 1.788, n=3 1.970, n=4 2.087, n=5 2.160 -> n = 5.
 * c = 0.05: rate(1) = 1.05 / 1.3 = 0.81 < 1 -> n = 0.
 * c = 0.55 (conf 0.2 -> sigmoid 0.5498, bucket 5): rate(1) = 1.55/1.3 = 1.192, rate(2) =
 * (1.55 + 0.3025)/1.6 = 1.158 -> n = 1. */
TEST(spec_policy_cpu_table_hand_computed) {
    spec_policy pol;
    table(&pol, 1.0, 0.3);
    float hi[5] = {5, 5, 5, 5, 5}, lo[5] = {-5, -5, -5, -5, -5}, mid[5] = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
    CHECKF(spec_policy_choose(&pol, hi, 5) == 5, "high confidence: %d", spec_policy_choose(&pol, hi, 5));
    CHECKF(spec_policy_choose(&pol, lo, 5) == 0, "low confidence: %d", spec_policy_choose(&pol, lo, 5));
    CHECKF(spec_policy_choose(&pol, mid, 5) == 1, "middle confidence: %d", spec_policy_choose(&pol, mid, 5));
    /* high then low: rate(1) = 1.95/1.3 = 1.5, rate(2) = (1.95 + 0.0475)/1.6 = 1.248 -> n = 1 */
    float mix[5] = {5, -5, 5, 5, 5};
    CHECKF(spec_policy_choose(&pol, mix, 5) == 1, "high-low: %d", spec_policy_choose(&pol, mix, 5));
}

/* Guards --draft-min-p: the block stops before the cumulative acceptance drops below it.
 * Flat table, c = 0.75 (conf 1.2 -> sigmoid 0.7685, bucket 7): cumulative 0.75, 0.5625,
 * 0.4219: min_p 0.5 -> n = 2; min_p 0.8 -> n = 0. */
TEST(spec_policy_min_p_cuts) {
    spec_policy pol;
    table(&pol, 1.0, 0.0);
    float c[5] = {1.2f, 1.2f, 1.2f, 1.2f, 1.2f};
    pol.min_p = 0.5f;
    CHECKF(spec_policy_choose(&pol, c, 5) == 2, "min_p 0.5: %d", spec_policy_choose(&pol, c, 5));
    pol.min_p = 0.8f;
    CHECK(spec_policy_choose(&pol, c, 5) == 0);
}

/* Guards the online calibration: a confident drafter that is always rejected is soon
 * believed at its record (bucket 9: (0 + 0.95 * 4) / (n + 4) accepts), and the policy stops
 * verifying; a drafter without confidence is judged per position. */
TEST(spec_policy_calibrates_online) {
    spec_policy pol;
    table(&pol, 1.0, 0.3);
    float hi[5] = {5, 5, 5, 5, 5};
    CHECK(spec_policy_choose(&pol, hi, 5) == 5);
    for (int r = 0; r < 40; r++) spec_calib_observe(&pol.cal, hi, 5, 0);
    double p = spec_calib_prob(&pol.cal, 0, 5.0f);
    CHECKF(fabs(p - 3.8 / 44.0) < 1e-12, "calibrated %.6f, want %.6f", p, 3.8 / 44.0);
    CHECK(spec_policy_choose(&pol, hi, 5) == 0);
    /* no confidence: position 0 accepted 10 of 10 -> (10 + 2) / 14; position 1 never judged -> 0.5 */
    memset(&pol.cal, 0, sizeof pol.cal);
    spec_calib_observe(&pol.cal, NULL, 1, 1);
    for (int r = 0; r < 9; r++) spec_calib_observe(&pol.cal, NULL, 1, 1);
    CHECK(fabs(spec_calib_prob(&pol.cal, 0, NAN) - 12.0 / 14.0) < 1e-12);
    CHECK(fabs(spec_calib_prob(&pol.cal, 1, NAN) - 0.5) < 1e-12);
}

/* Guards the projection `bench --draft` prints: under the policy it is never below 1 (no
 * slowdown against plain decoding), while "always verify B" can be: with no sharing (slope 1)
 * and 50 % accepts, by hand (1 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.03125) / (6 + 0.2) = 0.3165. */
TEST(spec_policy_never_projects_slowdown) {
    const double slopes[] = {0.0, 0.1, 0.5, 1.0, 2.0};
    for (size_t si = 0; si < sizeof slopes / sizeof *slopes; si++)
        for (int ai = 0; ai <= 10; ai++) {
            spec_policy pol;
            table(&pol, 1.0, slopes[si]);
            pol.t_draft = 0.2;
            double x = spec_project(&pol, ai / 10.0, 5, false);
            CHECKF(x >= 1.0, "slope %.1f accept %.1f: policy projects %.4f", slopes[si], ai / 10.0, x);
        }
    spec_policy pol;
    table(&pol, 1.0, 1.0);
    pol.t_draft = 0.2;
    double always = spec_project(&pol, 0.5, 5, true);
    CHECKF(fabs(always - 1.96875 / 6.2) < 1e-9, "always-B projection %.6f, want %.6f", always, 1.96875 / 6.2);
    /* flat table, 90 %: (1 + .9 + .81 + .729 + .6561 + .59049) / 1.2 = 4.6856 / 1.2 */
    table(&pol, 1.0, 0.0);
    pol.t_draft = 0.2;
    double x = spec_project(&pol, 0.9, 5, false);
    CHECKF(fabs(x - 4.68559 / 1.2) < 1e-6, "flat 90 %%: %.6f", x);
}
