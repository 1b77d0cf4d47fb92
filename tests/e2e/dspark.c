/* dspark.c: `dsflash spec-replay` against the DSpark goldens of ../shared/testdata/tinyds
 * (README "How to use them", "Suggested tolerances").
 *
 * Guards against: a draft (rings, block attention, lagged mHC stages, draft MoE, shared head,
 * Markov chain, confidence), target features, verification or rollback that drifts from the
 * official code's scenarios: plain mode, every draft / verify / feature row within 1e-3 (mean
 * <= 1e-4), identical drafted ids, anchors and final tokens, confidences within 1e-3
 * (dspark_replay_plain_*); the F32 draft file giving other results than the BF16 one
 * (dspark_replay_f32_draft); contract numerics of the draft fed the golden features outside the
 * tight tolerance (one bad round allowed, README) and a full contract loop failing the smoke
 * preset (dspark_replay_contract_*); bad arguments or scenarios that crash or exit 0
 * (dspark_replay_bad_input). */
#include "golden.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TDS "testdata/tinyds/"
#define V 1024

/* n floats of path (exactly), or NULL. */
static float *load_f32(const char *path, int64_t n) {
    uint8_t *b;
    size_t len;
    char err[DSF_ERR_LEN];
    if (dsf_read_file(path, &b, &len, err)) return NULL;
    if (len != (size_t)n * sizeof(float)) {
        free(b);
        return NULL;
    }
    return (float *)(void *)b;
}

static char *golden_path(const char *file) {
    static char rel[4][512];
    static int k;
    char *r = rel[k++ & 3];
    snprintf(r, 512, TDS "golden/%.200s", file);
    return (char *)test_shared(r);
}

/* Runs spec-replay on CASE with DRAFT and OPTS into a fresh directory; returns it or NULL. */
static const char *replay(test_ctx *t, const char *cas, const char *draft, const char *opts, char *log, size_t cap) {
    static char dir[512];
    const char *mainm = test_shared(TDS "tinyds.gguf"), *dr = test_shared(draft);
    char rel[256];
    snprintf(rel, sizeof rel, TDS "golden/%s.json", cas);
    const char *sc = test_shared(rel);
    if (!mainm || !dr || !sc) return NULL;
    snprintf(dir, sizeof dir, "%s/replay-%s-%d", test_tmpdir(), cas, (int)strlen(opts) + (int)strlen(draft));
    mkdir(dir, 0755);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s spec-replay -m %s --draft %s --scenario %s --out-dir %s %s 2>&1", test_bin(), mainm, dr,
             sc, dir, opts);
    int rc = test_run(cmd, log, cap);
    (void)t;
    return rc == 0 ? dir : NULL;
}

/* Compares the rows of DIR/mine against the golden CASE.suffix ([rows][width]); plain preset. */
static int rows_plain(test_ctx *t, const char *dir, const char *mine, const char *gold, int rows, int width, char *msg) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, mine);
    float *a = load_f32(p, (int64_t)rows * width), *g = load_f32(golden_path(gold), (int64_t)rows * width);
    int ok = a && g;
    if (ok) {
        cmp_stats st = golden_compare(a, g, rows, width, 1e-3);
        ok = st.bad_rows == 0 && st.mean_abs <= 1e-4 && st.top1_miss == 0;
        snprintf(msg, 256, "%s: max %.3g mean %.3g bad rows %d top-1 misses %d", mine, st.max_abs, st.mean_abs,
                 st.bad_rows, st.top1_miss);
    } else snprintf(msg, 256, "%.100s or %.100s missing or short", p, gold);
    (void)t;
    free(a);
    free(g);
    return ok;
}

/* The per-round ids, anchors and confidences of DIR/replay.json against the scenario; the
 * rounds whose ids or confidences differ are counted in *bad (ids/anchors must match for
 * allowed == 0). Returns the worst confidence difference. */
static double rounds_check(const char *dir, const char *cas, int *bad, int *n_rounds, char *msg) {
    char p[600], rel[256];
    snprintf(p, sizeof p, "%s/replay.json", dir);
    snprintf(rel, sizeof rel, "%s.json", cas);
    json_t *mine = json_load_file(p, 0, NULL), *g = json_load_file(golden_path(rel), 0, NULL);
    double worst = 0;
    *bad = 0;
    *n_rounds = 0;
    json_t *mr = json_object_get(mine, "rounds"), *gr = json_object_get(g, "rounds");
    if (!mr || !gr || json_array_size(mr) != json_array_size(gr)) {
        snprintf(msg, 256, "replay.json rounds missing or a different count");
        *bad = 1000;
    }
    for (size_t i = 0; !*bad && i < json_array_size(mr); i++) {
        json_t *a = json_array_get(mr, i), *b = json_array_get(gr, i);
        int same = json_equal(json_object_get(a, "draft_ids"), json_object_get(b, "draft_ids")) &&
                   json_equal(json_object_get(a, "anchor"), json_object_get(b, "anchor"));
        double cw = 0;
        for (size_t k = 0; k < json_array_size(json_object_get(b, "confidence")); k++) {
            double d = fabs(json_number_value(json_array_get(json_object_get(a, "confidence"), k)) -
                            json_number_value(json_array_get(json_object_get(b, "confidence"), k)));
            if (!(d <= cw)) cw = d;
        }
        if (cw > worst) worst = cw;
        if (!same || !(cw <= 1e-3)) {
            (*bad)++;
            snprintf(msg, 256, "round %zu: ids/anchor %s, confidence off by %.3g", i, same ? "equal" : "differ", cw);
        }
        (*n_rounds)++;
    }
    json_t *ft = json_object_get(mine, "final_tokens");
    if (ft && !json_equal(ft, json_object_get(g, "final_tokens"))) {
        snprintf(msg, 256, "final tokens differ from the scenario's");
        *bad = 1000;
    }
    json_decref(mine);
    json_decref(g);
    return worst;
}

static void check_plain_case(test_ctx *t, const char *cas, const char *draft) {
    char log[4096], msg[256] = "", f[128], f2[128];
    const char *dir = replay(t, cas, draft, "--numerics plain --threads 2", log, sizeof log);
    if (!dir && !test_shared(TDS "tinyds.gguf")) SKIP("needs ../shared/" TDS " (absent)");
    CHECKF(dir, "spec-replay %s failed: %s", cas, log);
    char rel[256];
    snprintf(rel, sizeof rel, "%s.json", cas);
    json_t *sc = json_load_file(golden_path(rel), 0, NULL);
    CHECK(sc);
    const int rounds = (int)json_array_size(json_object_get(sc, "rounds"));
    const int flen = (int)json_integer_value(json_object_get(sc, "final_len"));
    json_decref(sc);
    snprintf(f, sizeof f, "%s.draft.f32", cas);
    CHECKF(rows_plain(t, dir, "draft.f32", f, rounds * 5, V, msg), "%s", msg);
    snprintf(f, sizeof f, "%s.verify.f32", cas);
    CHECKF(rows_plain(t, dir, "verify.f32", f, rounds * 6, V, msg), "%s", msg);
    snprintf(f2, sizeof f2, "%s.hidden.f32", cas);
    /* target features: rows of 384 (no argmax meaning, but the same per-row tolerance) */
    char p[600];
    snprintf(p, sizeof p, "%s/hidden.f32", dir);
    float *a = load_f32(p, (int64_t)flen * 384), *g = load_f32(golden_path(f2), (int64_t)flen * 384);
    CHECKF(a && g, "hidden.f32 missing or short");
    cmp_stats st = golden_compare(a, g, flen, 384, 1e-3);
    free(a);
    free(g);
    CHECKF(st.bad_rows == 0 && st.mean_abs <= 1e-4, "hidden: max %.3g mean %.3g", st.max_abs, st.mean_abs);
    int bad, n;
    double cw = rounds_check(dir, cas, &bad, &n, msg);
    CHECKF(bad == 0 && n == rounds, "%s (worst confidence %.3g)", msg, cw);
}

TEST(dspark_replay_plain_spec) { check_plain_case(t, "plain-spec", TDS "tinyds-dspark.gguf"); }
TEST(dspark_replay_plain_greedy) { check_plain_case(t, "plain-greedy", TDS "tinyds-dspark.gguf"); }
TEST(dspark_replay_f32_draft) { check_plain_case(t, "plain-spec", TDS "tinyds-dspark-f32.gguf"); }

/* Contract numerics, the draft in isolation (rings from contract-spec.hidden.f32): the tight
 * tolerance, one round may flip an FP8 rounding (README). */
TEST(dspark_replay_contract_isolated) {
    char log[4096], msg[256] = "";
    const char *dir = replay(t, "contract-spec", TDS "tinyds-dspark.gguf", "--golden-features --threads 2", log, sizeof log);
    if (!dir && !test_shared(TDS "tinyds.gguf")) SKIP("needs ../shared/" TDS " (absent)");
    CHECKF(dir, "spec-replay failed: %s", log);
    char p[600];
    snprintf(p, sizeof p, "%s/draft.f32", dir);
    float *a = load_f32(p, 9 * 5 * V), *g = load_f32(golden_path("contract-spec.draft.f32"), 9 * 5 * V);
    CHECKF(a && g, "draft.f32 missing or short");
    int bad_rounds = 0;
    double worst = 0;
    for (int r = 0; r < 9; r++) {
        cmp_stats st = golden_compare(a + (size_t)r * 5 * V, g + (size_t)r * 5 * V, 5, V, 1e-3);
        bad_rounds += st.bad_rows > 0 || st.top1_miss > 0;
        if (st.max_abs > worst) worst = st.max_abs;
    }
    free(a);
    free(g);
    CHECKF(bad_rounds <= 1, "%d rounds outside 1e-3 (worst %.3g)", bad_rounds, worst);
    int bad, n;
    rounds_check(dir, "contract-spec", &bad, &n, msg);
    CHECKF(bad <= 1 && n == 9, "%s", msg);
}

/* Contract numerics, the full loop: the smoke preset (mean <= 0.5, top-1 >= 35 %) on the
 * draft and verify rows, as for tiny41's contract goldens. */
TEST(dspark_replay_contract_loop) {
    char log[4096];
    const char *dir = replay(t, "contract-spec", TDS "tinyds-dspark.gguf", "--threads 2", log, sizeof log);
    if (!dir && !test_shared(TDS "tinyds.gguf")) SKIP("needs ../shared/" TDS " (absent)");
    CHECKF(dir, "spec-replay failed: %s", log);
    static const struct { const char *mine, *gold; int rows; } f[] = {
        {"draft.f32", "contract-spec.draft.f32", 45}, {"verify.f32", "contract-spec.verify.f32", 54}};
    for (int i = 0; i < 2; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, f[i].mine);
        float *a = load_f32(p, (int64_t)f[i].rows * V), *g = load_f32(golden_path(f[i].gold), (int64_t)f[i].rows * V);
        CHECKF(a && g, "%s missing or short", f[i].mine);
        cmp_stats st = golden_compare(a, g, f[i].rows, V, 1e-3);
        free(a);
        free(g);
        CHECKF(st.mean_abs <= 0.5 && st.top1_miss <= f[i].rows - (int)ceil(0.35 * f[i].rows),
               "%s: mean %.3g top-1 misses %d/%d", f[i].mine, st.mean_abs, st.top1_miss, f[i].rows);
    }
}

/* Bad input: one clear line and exit 1, never a crash or exit 0. */
TEST(dspark_replay_bad_input) {
    const char *mainm = test_shared(TDS "tinyds.gguf"), *dr = test_shared(TDS "tinyds-dspark.gguf");
    if (!mainm || !dr) SKIP("needs ../shared/" TDS " (absent)");
    char sc[600], cmd[4096], log[4096];
    static const struct { const char *json, *want; } cases[] = {
        {"{\"prompt\": [0, 5], \"accept_schedule\": [9]}", "accept_schedule[0] = 9 is outside 0..5"},
        {"{\"prompt\": [0, 5], \"accept_schedule\": [\"most\"]}", "must be an integer or \"natural\""},
        {"{\"prompt\": [], \"accept_schedule\": [1]}", "'prompt' must be a non-empty array"},
        {"{\"prompt\": [0, 5000], \"accept_schedule\": [1]}", "outside the vocabulary"},
        {"{\"prompt\": [0, 5], \"accept_schedule\": 3}", "'accept_schedule' must be an array"},
        {"{\"prompt\": [0, 5", "line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(sc, sizeof sc, "%s/bad-%zu.json", test_tmpdir(), i);
        FILE *f = fopen(sc, "w");
        CHECK(f);
        fputs(cases[i].json, f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "%s spec-replay -m %s --draft %s --scenario %s --out-dir %s --plain 2>&1", test_bin(),
                 mainm, dr, sc, test_tmpdir());
        int rc = test_run(cmd, log, sizeof log);
        CHECKF(rc == 1 && strstr(log, "dsflash spec-replay: ") && strstr(log, cases[i].want), "case %zu: exit %d: %s", i,
               rc, log);
    }
    /* the main model as the draft */
    snprintf(cmd, sizeof cmd, "%s spec-replay -m %s --draft %s --scenario %s --out-dir %s 2>&1", test_bin(), mainm, mainm,
             sc, test_tmpdir());
    CHECKF(test_run(cmd, log, sizeof log) == 1 && strstr(log, "a DSpark draft is 'dflash'"), "%s", log);
    snprintf(cmd, sizeof cmd, "%s spec-replay -m %s 2>&1", test_bin(), mainm);
    CHECKF(test_run(cmd, log, sizeof log) == 2 && strstr(log, "usage"), "%s", log);
    snprintf(cmd, sizeof cmd, "%s spec-replay -m %s --draft %s --scenario %s --out-dir %s --numerics fp8 2>&1",
             test_bin(), mainm, dr, sc, test_tmpdir());
    CHECKF(test_run(cmd, log, sizeof log) == 2 && strstr(log, "--numerics must be reference, contract or plain"), "%s", log);
}
