/* bench_draft.c: `dsflash bench -m MODEL --draft DRAFT`: what speculative decoding can give on
 * this machine. Measures the main forward for T = 1..B+1 tokens (the policy's cost table, the
 * same measurement `run`/`serve` do at startup) and the draft's time per call, then projects
 * the speed-up over plain decoding at per-token accept rates of 50/70/90 % under the
 * cost-aware policy and under "always verify B" (src/runtime/spec_policy.c, spec_project).
 * Owns only the measurement and the report; the policy is the runtime's. */
#include "cmd.h"
#include "frontend.h"
#include "dsflash.h"
#include "runtime/spec.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Draft calls timed (the best is kept, as for the forwards). */
#define DRAFT_REPS 5

/* Seconds of the drafter's best call after a 64-token prompt. */
static double time_draft(dsf_engine *e, dsf_drafter *d, int B, char *err) {
    const int n = 64;
    dsf_session *s = dsf_session_new(e, n + 2 * B + 8, err);
    if (!s) return -1;
    int nv = dsf_engine_n_vocab(e);
    int32_t toks[64], ids[SPEC_MAX_BLOCK];
    float conf[SPEC_MAX_BLOCK];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % nv);
    double best = -1;
    bool bound = !d->ops->bind || d->ops->bind(d, s, err) == 0; /* before the prefill: features */
    if (bound && dsf_session_eval(s, toks, n, NULL, false, err) == 0) {
        if (d->ops->reset) d->ops->reset(d, 0);
        if (!d->ops->commit || d->ops->commit(d, s, 0, n, err) == 0) {
            best = INFINITY;
            uint64_t rng = 1;
            for (int r = 0; r < DRAFT_REPS && best >= 0; r++) {
                double t0 = dsf_now();
                if (d->ops->propose(d, s, toks[0], B, 0.0f, &rng, ids, NULL, conf, err) < 0) best = -1;
                else if (dsf_now() - t0 < best) best = dsf_now() - t0;
            }
        }
    }
    dsf_session_free(s);
    return best;
}

int bench_draft(const char *model, const spec_opts *so, const dsf_engine_params *ep) {
    char err[DSF_ERR_LEN] = "";
    dsf_engine *e = dsf_engine_open(model, ep, err);
    dsf_drafter *d = e ? spec_open_drafter(e, so->draft, 256, err) : NULL;
    spec_policy pol;
    spec_policy_init(&pol);
    pol.max_draft = so->max_draft;
    pol.min_p = so->min_p;
    int B = d ? d->ops->block : 0;
    if (B > SPEC_MAX_BLOCK) B = SPEC_MAX_BLOCK;
    double td = -1;
    if (d && spec_cost_measure(e, B, &pol, err) == 0) td = time_draft(e, d, B, err);
    if (td < 0) {
        fprintf(stderr, "dsflash bench: %s\n", err);
        dsf_drafter_free(d);
        dsf_engine_close(e);
        return 1;
    }
    double t1 = pol.t_fwd[1];
    printf("draft %s: block %d, %.3f ms per call = %.2f decode steps\n", so->draft, B, td * 1e3, td / t1);
    printf("main forward of T tokens (best of 3; ratio to T = 1):\n");
    for (int t = 1; t <= B + 1; t++) printf("  T=%d  %9.3f ms  %5.2fx\n", t, pol.t_fwd[t] * 1e3, pol.t_fwd[t] / t1);
    printf("projected speed-up over plain decoding (tokens/s ratio):\n");
    printf("  accept  policy  always-B   | draft cost excluded: policy  always-B\n");
    static const double rates[] = {0.5, 0.7, 0.9};
    double proj[3][4];
    for (int k = 0; k < 3; k++) {
        pol.t_draft = td;
        proj[k][0] = spec_project(&pol, rates[k], B, false);
        proj[k][1] = spec_project(&pol, rates[k], B, true);
        pol.t_draft = 0;
        proj[k][2] = spec_project(&pol, rates[k], B, false);
        proj[k][3] = spec_project(&pol, rates[k], B, true);
        printf("  %4.0f %%  %6.2fx  %7.2fx   |                      %6.2fx  %7.2fx\n", rates[k] * 100, proj[k][0],
               proj[k][1], proj[k][2], proj[k][3]);
    }
    printf("draft_ms=%.3f draft_steps=%.3f", td * 1e3, td / t1);
    for (int t = 1; t <= B + 1; t++) printf(" fwd%d_ratio=%.3f", t, pol.t_fwd[t] / t1);
    for (int k = 0; k < 3; k++)
        printf(" policy%.0f=%.3f always%.0f=%.3f", rates[k] * 100, proj[k][0], rates[k] * 100, proj[k][1]);
    printf("\n");
    dsf_drafter_free(d);
    dsf_engine_close(e);
    return 0;
}
