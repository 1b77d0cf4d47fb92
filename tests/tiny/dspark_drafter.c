/* dspark_drafter.c: the DSpark drafter provider (src/runtime/dspark_drafter.c) driven like the
 * speculative loop drives it (TASK35 interface: propose after the last committed position,
 * verify, accept, roll back, commit).
 *
 * Guards against: a provider whose rings drift from the committed positions (commit after
 * prefill and after every verification, catching up, reset after a rollback), so that the
 * drafted ids of plain-spec's rounds (forced accept counts 0..5, full acceptance twice)
 * differ from the official scenario's; proposals that overrun the context; q rows at tau > 0
 * that are not distributions. */
#include "test.h"
#include "dsflash.h"
#include "runtime/dspark_drafter.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TDS "testdata/tinyds/"

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

TEST(dspark_drafter_replays_plain_spec) {
    const char *mp = test_shared(TDS "tinyds.gguf"), *dp = test_shared(TDS "tinyds-dspark.gguf");
    const char *sp = test_shared(TDS "golden/plain-spec.json");
    if (!mp || !dp || !sp) SKIP("needs ../shared/" TDS);
    char err[DSF_ERR_LEN] = "";
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = DSF_NUMERICS_PLAIN;
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(mp, &ep, err);
    CHECKF(e, "%s", err);
    dsf_dspark *d = dspark_open(dp, e, err);
    CHECKF(d, "%s", err);
    dsf_session *s = dsf_session_new(e, 128, err);
    CHECK(s);
    dsf_drafter *dr = dspark_drafter_new(d, s, err);
    CHECKF(dr, "%s", err);
    CHECK(dr->ops->block == 5);
    json_t *sc = json_load_file(sp, 0, NULL);
    json_t *pr = json_object_get(sc, "prompt"), *rounds = json_object_get(sc, "rounds");
    int32_t prompt[64];
    const int n = (int)json_array_size(pr);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
    float *lg = malloc(6 * 1024 * sizeof(float));
    CHECK(dsf_session_eval(s, prompt, n, lg, false, err) == 0);
    CHECK(dr->ops->commit(dr, s, 0, n, err) == 0);
    int32_t a = (int32_t)argmax(lg, 1024), ids[5], vt[6];
    float conf[5];
    for (size_t r = 0; r < json_array_size(rounds); r++) {
        json_t *jr = json_array_get(rounds, r);
        const int p = dsf_session_n_past(s) - 1;
        CHECKF(a == json_integer_value(json_object_get(jr, "anchor")), "round %zu: anchor %d", r, a);
        CHECKF(dr->ops->propose(dr, s, a, 5, 0.0f, NULL, ids, NULL, conf, err) == 5, "round %zu: %s", r, err);
        for (int i = 0; i < 5; i++)
            CHECKF(ids[i] == json_integer_value(json_array_get(json_object_get(jr, "draft_ids"), (size_t)i)),
                   "round %zu: drafted id %d differs", r, i);
        vt[0] = a;
        memcpy(vt + 1, ids, sizeof ids);
        CHECK(dsf_session_eval(s, vt, 6, lg, true, err) == 0);
        const int k = (int)json_integer_value(json_object_get(jr, "accept"));
        CHECK(dsf_session_rollback(s, p + 2 + k, err) == 0);
        dr->ops->reset(dr, p + 2 + k);
        CHECK(dr->ops->commit(dr, s, p + 1, p + 2 + k, err) == 0);
        a = (int32_t)argmax(lg + k * 1024, 1024);
    }
    /* tau > 0: q rows are distributions and the drawn ids have mass */
    float *q = malloc(5 * 1024 * sizeof(float));
    uint64_t rng = 7;
    CHECK(dr->ops->propose(dr, s, a, 5, 0.8f, &rng, ids, q, conf, err) == 5);
    for (int i = 0; i < 5; i++) {
        double sum = 0;
        for (int v = 0; v < 1024; v++) sum += q[i * 1024 + v];
        CHECKF(fabs(sum - 1.0) < 1e-4 && q[i * 1024 + ids[i]] > 0, "row %d: sum %.6f", i, sum);
    }
    /* a rollback below the rings, then proposing: the rings catch up from the features */
    const int np = dsf_session_n_past(s);
    CHECK(dsf_session_rollback(s, np - 3, err) == 0);
    dr->ops->reset(dr, np - 3);
    CHECKF(dr->ops->propose(dr, s, a, 5, 0.0f, NULL, ids, NULL, NULL, err) == 5, "%s", err);
    free(q);
    free(lg);
    json_decref(sc);
    dr->ops->free(dr);
    dsf_session_free(s);
    dspark_close(d);
    dsf_engine_close(e);
}

/* Near the context's end the proposal shrinks so that verification fits (dspark.md §7.6). */
TEST(dspark_drafter_context_end) {
    const char *mp = test_shared(TDS "tinyds.gguf"), *dp = test_shared(TDS "tinyds-dspark.gguf");
    if (!mp || !dp) SKIP("needs ../shared/" TDS);
    char err[DSF_ERR_LEN] = "";
    dsf_engine *e = dsf_engine_open(mp, NULL, err);
    CHECKF(e, "%s", err);
    dsf_dspark *d = dspark_open(dp, e, err);
    dsf_session *s = d ? dsf_session_new(e, 12, err) : NULL;
    dsf_drafter *dr = s ? dspark_drafter_new(d, s, err) : NULL;
    CHECKF(dr, "%s", err);
    int32_t toks[9] = {0, 5, 9, 13, 17, 21, 25, 29, 33}, ids[5];
    CHECK(dsf_session_eval(s, toks, 9, NULL, false, err) == 0 && dr->ops->commit(dr, s, 0, 9, err) == 0);
    /* 9 committed of 12: the anchor and at most 2 drafts fit */
    CHECK(dr->ops->propose(dr, s, 3, 5, 0.0f, NULL, ids, NULL, NULL, err) == 2);
    dr->ops->free(dr);
    dsf_session_free(s);
    dspark_close(d);
    dsf_engine_close(e);
}
