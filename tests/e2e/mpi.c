/* mpi.c: `dsflash logits` as an MPI job (`mpirun -np 2|3 ... --parallel pipeline|experts|
 * pipeline,experts`, issue 39) against the same binary in one process, byte for byte, on
 * tiny41 (every golden case, both numerics modes) and on the synthetic topology "tiny-roles"
 * (synth: 12 layers with roles shaped like the release's), and `logits --batch` against
 * separate runs. Expected values are the single-process outputs of the same binary (which
 * tests/tiny/golden.c checks against the goldens) and, where the run's mode is the golden's,
 * the golden itself with the tolerances of tests/e2e/golden.c.
 *
 * The matrix (each mpirun costs ~0.5-1 s, so a covering subset): per configuration (ranks,
 * --parallel, forced cuts) 8 runs in which every golden case, both modes and every option set
 * (prefill in one call, chunked prefill, decode, rollback, rollback re-prefilled from the
 * history, snapshot, batched decode whole and in micro-batches) appear at least once; the pairing rotates with the
 * configuration, so each case meets both modes and most option sets across configurations.
 * The forced cuts 3,7 and 6,7 (and 6 with two stages) cross compressed rows, a top-k list
 * and the candidate list (tiny41's role table: layer 3 reuses 2's rows and top-k, 6 reuses 5's,
 * 7 re-indexes inside 5's candidates). Each test prints one line: runs, differing files.
 * Skips when mpirun or an MPI build is missing (tests/lib/mpi.h) or ../shared is absent. */
#include "dsflash.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/synth.h"
#include "golden.h"
#include "helpers.h"
#include "mpi.h"

static const char *const CASES[] = {"plain-prefill", "plain-decode", "contract-prefill",
                                    "contract-decode", "plain-long", "text-prompt"};
enum { N_CASES = 6 };
static const char *const MODES[] = {"reference", "plain"};
#define VOCAB 1024 /* tiny41's and tiny-roles' */

/* An option set; a position K in args is n * num / den of the case's n tokens. */
typedef struct {
    const char *what, *args;
    int num, den;
    const char *env; /* NAME=VALUE on every rank, or "": DSF_ROLLBACK_MARGIN=0 makes the rollback re-prefill
                      * from the history; DSF_DIST_MICROBATCH=3 sends a batch through the stages in
                      * micro-batches (off by default: model/distpipe.c) */
    int batch;    /* sessions written ([batch][n][V]) */
} optset;

static const optset OPTS[] = {
    {"prefill in one call", "", 0, 1, "", 1},
    {"chunked prefill", "--chunk 7", 0, 1, "", 1},
    {"decode", "--chunk 1", 0, 1, "", 1},
    {"rollback", "--chunk 5 --rollback-to %d", 1, 3, "", 1},
    {"rollback re-prefilled", "--chunk 9 --rollback-to %d", 1, 2, "DSF_ROLLBACK_MARGIN=0", 1},
    {"snapshot", "--chunk 4 --snapshot-at %d", 2, 5, "", 1},
    {"batched decode", "--batch 3", 0, 1, "", 3},
    {"batched decode in micro-batches", "--batch 3", 0, 1, "DSF_DIST_MICROBATCH=3", 3},
};
enum { N_OPTS = 8 };

typedef struct {
    golden g[N_CASES];
    char tokfile[N_CASES][512];
    bool loaded;
} cases_fx;

/* The goldens and their token lists as files; false (after SKIP or a failure) when absent. */
static bool cases_load(test_ctx *t, cases_fx *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_CASES; i++) {
        if (golden_load(CASES[i], &c->g[i]) < 0) {
            for (int j = 0; j < i; j++) golden_free(&c->g[j]);
            test_skip(t, "needs ../shared/" GDIR "%s.*", CASES[i]);
            return false;
        }
        snprintf(c->tokfile[i], sizeof c->tokfile[i], "%s/%s.tok", test_tmpdir(), CASES[i]);
        FILE *f = fopen(c->tokfile[i], "w");
        if (!f) {
            test_fail(t, __FILE__, __LINE__, "cannot write %s", c->tokfile[i]);
            return false;
        }
        for (int k = 0; k < c->g[i].n; k++) fprintf(f, k ? ",%d" : "%d", c->g[i].tokens[k]);
        fclose(f);
    }
    c->loaded = true;
    return true;
}

static void cases_free(cases_fx *c) {
    for (int i = 0; c->loaded && i < N_CASES; i++) golden_free(&c->g[i]);
}

/* Runs `logits` on tokfile (n tokens) with option set o, in one process (np 0) or as np ranks
 * with --parallel par, into out; its output (errors) into msg. Returns the exit status. */
static int run_logits(int np, const char *par, const char *model, const char *tokfile, int n, const char *mode,
                      const optset *o, const char *out, char *msg, size_t cap) {
    char args[128], cmd[4096];
    snprintf(args, sizeof args, o->args, n * o->num / o->den);
    char env[96] = "", xenv[96] = "";
    if (o->env[0]) {
        snprintf(env, sizeof env, "%s ", o->env);
        snprintf(xenv, sizeof xenv, "-x %.*s", (int)strcspn(o->env, "="), o->env);
    }
    if (np == 0)
        snprintf(cmd, sizeof cmd, "%s%s logits -m %s --tokens-file %s --numerics %s --threads 1 %s --out %s 2>&1", env,
                 test_bin(), model, tokfile, mode, args, out);
    else
        snprintf(cmd, sizeof cmd, "%s%s %s %s logits -m %s --tokens-file %s --numerics %s --threads 1 %s --parallel %s "
                                  "--out %s 2>&1",
                 env, test_mpirun(np), xenv, test_bin(), model, tokfile, mode,
                 args, par, out);
    return test_run(cmd, msg, cap);
}

/* -1 when files a and b hold the same bytes; else the first float that differs (0 when
 * either is missing or their sizes differ). */
static long first_diff(const char *a, const char *b) {
    long na = 0, nb = 0, at = 0;
    unsigned char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    if (x && y && na == nb) {
        while (at < na && x[at] == y[at]) at++;
        at = at == na ? -1 : at / 4;
    }
    free(x);
    free(y);
    return at;
}

/* The first n rows of the logits file against the case's golden, by the tolerances of
 * tests/e2e/golden.c and tests/tiny/golden.c; 0, or -1 with why in msg. */
static int golden_ok(const golden *g, bool contract, const char *path, char *msg, size_t cap) {
    long size = 0;
    float *lg = (float *)test_slurp(path, &size);
    if (!lg || size < (long)((size_t)g->n * (size_t)g->vocab * sizeof(float))) {
        free(lg);
        return snprintf(msg, cap, "%s is short", path), -1;
    }
    cmp_stats st = golden_compare(lg, g->gold, g->n, g->vocab, 1e-3);
    free(lg);
    /* plain: every row within 1e-3, mean <= 1e-4, top-1 100 % (the README's plain preset);
     * contract: a smoke test, mean <= 0.5, top-1 >= 35 % (fp32 noise flips fp8/fp4 roundings) */
    const bool ok = contract ? st.mean_abs <= 0.5 && st.top1_miss <= g->n - (int)ceil(0.35 * g->n)
                             : st.bad_rows == 0 && st.mean_abs <= 1e-4 && st.top1_miss == 0;
    if (!ok) snprintf(msg, cap, "max %.3g mean %.3g bad rows %d top-1 misses %d", st.max_abs, st.mean_abs, st.bad_rows, st.top1_miss);
    return ok ? 0 : -1;
}

/* One run of the matrix: a token list (with its golden when the modes agree), a mode, an option set. */
typedef struct {
    const char *tokfile;
    int n;
    const golden *g; /* NULL: no golden check */
    bool contract;
    int mode; /* index into MODES */
    int opt;
    const char *label;
} mrun;

/* Runs every entry single-process and as np ranks with --parallel par; prints the summary
 * line; fails on the first difference (after running everything). */
static void run_matrix(test_ctx *t, const char *tag, const char *model, int np, const char *par, const mrun *runs, int nr) {
    int diff = 0, gbad = 0, gchk = 0;
    char first[1024] = "", msg[8192];
    for (int k = 0; k < nr; k++) {
        const mrun *r = &runs[k];
        const optset *o = &OPTS[r->opt];
        char one[512], many[512];
        snprintf(one, sizeof one, "%s/one-%d.f32", test_tmpdir(), k);
        snprintf(many, sizeof many, "%s/many-%d.f32", test_tmpdir(), k);
        int rc = run_logits(0, NULL, model, r->tokfile, r->n, MODES[r->mode], o, one, msg, sizeof msg);
        CHECKF(rc == 0, "%s %s %s, one process: exit %d: %s", r->label, MODES[r->mode], o->what, rc, msg);
        rc = run_logits(np, par, model, r->tokfile, r->n, MODES[r->mode], o, many, msg, sizeof msg);
        CHECKF(rc == 0, "%s %s %s, np %d --parallel %s: exit %d: %s", r->label, MODES[r->mode], o->what, np, par, rc, msg);
        const long at = first_diff(one, many);
        if (at >= 0) {
            if (!diff++)
                snprintf(first, sizeof first, "%s %s, %s: the logits differ from one process's from row %ld (of [%d x %d])",
                         r->label, MODES[r->mode], o->what, at / VOCAB, o->batch, r->n);
        } else if (r->g && (gchk++, golden_ok(r->g, r->contract, many, msg, sizeof msg) < 0)) {
            if (!gbad++) snprintf(first, sizeof first, "%s %s, %s: against the golden: %.500s", r->label, MODES[r->mode], o->what, msg);
        }
    }
    printf("  %s np %d --parallel %s: %d runs, %d files differ; %d checked against their golden, %d off it\n", tag, np,
           par, nr, diff, gchk, gbad);
    CHECKF(diff == 0 && gbad == 0, "np %d --parallel %s: %s", np, par, first);
}

/* The tiny41 matrix of one configuration (cfg numbers it for the rotation). */
static void tiny41_config(test_ctx *t, int np, const char *par, int cfg) {
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    NEED_SHARED(shared_model, "testdata/tiny41/tiny41.gguf");
    char model[4096]; /* test_shared's buffers rotate: golden_load reuses them */
    snprintf(model, sizeof model, "%s", shared_model);
    cases_fx c;
    if (!cases_load(t, &c)) return;
    mrun runs[8];
    for (int k = 0; k < 8; k++) {
        const int ci = (k + cfg) % N_CASES, mode = k < N_CASES ? k % 2 : 1 - k % 2;
        const bool contract = !strncmp(CASES[ci], "contract", 8);
        runs[k] = (mrun){c.tokfile[ci], c.g[ci].n, contract == (mode == 0) ? &c.g[ci] : NULL, contract, mode,
                         (k + 3 * cfg) % N_OPTS, CASES[ci]};
    }
    run_matrix(t, "tiny41", model, np, par, runs, 8);
    cases_free(&c);
}

/* Guards against: logits of an MPI job that differ from one process in any bit (a stage that
 * runs a layer with other inputs, a crossing dependency shipped late or not at all, experts
 * summed in another order, a follower's session state that drifts through chunked prefill,
 * rollback, snapshot or batched decode), on two ranks. */
TEST(mpi_tiny41_np2_pipeline) { tiny41_config(t, 2, "pipeline", 0); }
TEST(mpi_tiny41_np2_experts) { tiny41_config(t, 2, "experts", 1); }
TEST(mpi_tiny41_np2_pipeline_experts) { tiny41_config(t, 2, "pipeline,experts", 2); }
/* a cut at 6 ships layer 5's compressed rows, its top-k and the candidate list */
TEST(mpi_tiny41_np2_crossing_cut) { tiny41_config(t, 2, "pipeline --pp-split 6", 3); }
/* The same on three ranks: three stages, three expert shares, a stage of two expert halves. */
TEST(mpi_tiny41_np3_pipeline) { tiny41_config(t, 3, "pipeline", 4); }
TEST(mpi_tiny41_np3_experts) { tiny41_config(t, 3, "experts", 5); }
TEST(mpi_tiny41_np3_pipeline_experts) { tiny41_config(t, 3, "pipeline,experts", 6); }
/* cuts at 3 (2's rows and top-k) and 7 (5's rows and the candidates); at 6 and 7 (5's rows,
 * top-k and candidates, then a one-layer stage); a crossing cut in front of split experts */
TEST(mpi_tiny41_np3_cuts_3_7) { tiny41_config(t, 3, "pipeline --pp-split 3,7", 7); }
TEST(mpi_tiny41_np3_cuts_6_7) { tiny41_config(t, 3, "pipeline --pp-split 6,7", 8); }
TEST(mpi_tiny41_np3_pipeline_experts_cut_6) { tiny41_config(t, 3, "pipeline,experts --pp-split 6", 9); }

/* ---- the synthetic topology ------------------------------------------------------------- */

/* tiny-roles written to the test's folder; NULL after a failure. */
static const char *roles_model(test_ctx *t) {
    static char path[512];
    char err[DSF_ERR_LEN];
    snprintf(path, sizeof path, "%s/tiny-roles.gguf", test_tmpdir());
    if (synth_write("tiny-roles", path, 7, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "synth tiny-roles: %s", err);
        return NULL;
    }
    return path;
}

/* Guards against: a tiny-roles model that is not a usable second topology (non-finite
 * logits, decode that differs from prefill), which would make its MPI matrix prove nothing. */
TEST(mpi_roles_single_process) {
    cases_fx c;
    if (!cases_load(t, &c)) return;
    const char *model = roles_model(t);
    if (!model) return;
    const int ci = 4; /* plain-long: 200 tokens, past every top-k and candidate selection */
    char a[512], b[512], msg[4096];
    snprintf(a, sizeof a, "%s/prefill.f32", test_tmpdir());
    snprintf(b, sizeof b, "%s/decode.f32", test_tmpdir());
    for (int m = 0; m < 2; m++) {
        CHECKF(run_logits(0, NULL, model, c.tokfile[ci], c.g[ci].n, MODES[m], &OPTS[0], a, msg, sizeof msg) == 0, "%s", msg);
        CHECKF(run_logits(0, NULL, model, c.tokfile[ci], c.g[ci].n, MODES[m], &OPTS[2], b, msg, sizeof msg) == 0, "%s", msg);
        long na = 0, nb = 0;
        float *x = (float *)test_slurp(a, &na), *y = (float *)test_slurp(b, &nb);
        CHECK(x && y && na == nb && na == (long)c.g[ci].n * VOCAB * 4);
        double worst = 0;
        int finite = 1;
        for (long i = 0; i < na / 4; i++) {
            finite &= isfinite(x[i]) && isfinite(y[i]);
            double d = fabs((double)x[i] - (double)y[i]);
            worst = d > worst ? d : worst;
        }
        free(x);
        free(y);
        /* decode == prefill within 1e-4: the engine's chunked paths agree to fp32 noise (they are
         * bit-identical on tiny41; 1e-4 leaves room for a summation order that is not) */
        CHECKF(finite && worst <= 1e-4, "%s: finite %d, decode vs prefill max %.3g", MODES[m], finite, worst);
    }
    cases_free(&c);
}

/* The smaller matrix of the synthetic topology: 4 runs per configuration over the 64- and
 * 200-token lists, both modes, the option sets rotated. */
static void roles_config(test_ctx *t, int np, const char *const *pars, int npar) {
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    cases_fx c;
    if (!cases_load(t, &c)) return;
    const char *model = roles_model(t);
    if (!model) return;
    for (int p = 0; p < npar && !t->failed; p++) {
        mrun runs[4];
        for (int k = 0; k < 4; k++) {
            const int ci = k % 2 ? 4 : 0, cfg = np * 8 + p;
            runs[k] = (mrun){c.tokfile[ci], c.g[ci].n, NULL, false, (k / 2 + p) % 2, (4 * cfg + k) % N_OPTS, CASES[ci]};
        }
        run_matrix(t, "tiny-roles", model, np, pars[p], runs, 4);
    }
    cases_free(&c);
}

/* Guards against: exactness that holds only for tiny41's roles (more layers, two ratio-2
 * groups, the candidate source at 7 with two re-indexing layers, Engram before a group's
 * source). Forced cuts: 8 (7's rows, top-k and candidates), 3 (2's rows and top-k), 10 (7's
 * rows, 9's top-k and the candidates), 6 (5's rows and top-k). */
TEST(mpi_roles_np2) {
    static const char *const pars[] = {"pipeline", "experts", "pipeline,experts", "pipeline --pp-split 8"};
    roles_config(t, 2, pars, 4);
}
TEST(mpi_roles_np3) {
    static const char *const pars[] = {"pipeline", "experts", "pipeline,experts", "pipeline --pp-split 3,10",
                                       "pipeline,experts --pp-split 6"};
    roles_config(t, 3, pars, 5);
}

/* ---- batched decode in one process ------------------------------------------------------- */

/* Guards against: `logits --batch` rows that are not each session's own (a batched step that
 * mixes sessions' state or rows, or a session order that is not the documented rotation): K
 * sessions' rows equal K separate runs on each rotated list, byte for byte, as dsf_batch_eval
 * promises. Needs no MPI. */
TEST(mpi_batch_matches_separate_runs) {
    cases_fx c;
    if (!cases_load(t, &c)) return;
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf"); /* after golden_load, whose test_shared calls rotate its buffers */
    const int ci = 5, K = 3, n = c.g[ci].n; /* text-prompt: 26 tokens */
    char out[512], one[512], rot[512], msg[4096];
    snprintf(out, sizeof out, "%s/batch.f32", test_tmpdir());
    snprintf(one, sizeof one, "%s/one.f32", test_tmpdir());
    snprintf(rot, sizeof rot, "%s/rot.tok", test_tmpdir());
    for (int m = 0; m < 2; m++) {
        const optset b = {"batched decode", "--batch 3 --prefill 5 --chunk 2", 0, 1, "", 3};
        CHECKF(run_logits(0, NULL, model, c.tokfile[ci], n, MODES[m], &b, out, msg, sizeof msg) == 0, "%s", msg);
        long nb = 0;
        unsigned char *all = test_slurp(out, &nb);
        const size_t R = (size_t)n * VOCAB * sizeof(float);
        CHECKF(all && nb == (long)(K * R), "%ld bytes, want %zu", nb, K * R);
        for (int i = 0; i < K; i++) {
            FILE *f = fopen(rot, "w");
            CHECK(f);
            for (int j = 0; j < n; j++) fprintf(f, j ? ",%d" : "%d", c.g[ci].tokens[(j + i) % n]);
            fclose(f);
            CHECKF(run_logits(0, NULL, model, rot, n, MODES[m], &OPTS[0], one, msg, sizeof msg) == 0, "%s", msg);
            long ns = 0;
            unsigned char *s = test_slurp(one, &ns);
            CHECKF(s && ns == (long)R && !memcmp(s, all + (size_t)i * R, R), "%s: session %d differs from its separate run",
                   MODES[m], i);
            free(s);
        }
        free(all);
    }
    printf("  logits --batch 3: 2 modes x 3 sessions equal their separate runs\n");
    cases_free(&c);
}

/* DSpark under an MPI job (tinyds and its draft): with `--parallel experts` (rank 0 keeps every
 * layer, so the draft's target features are local) the greedy text of `run --draft` with every
 * round verified (--draft-policy always: multi-token verify forwards and rollbacks on every
 * rank), in prefill forwards of 7 tokens, equals the one-process run's, which equals the run
 * without a draft; `--parallel pipeline` refuses the draft with one line naming why. Guards
 * against a verify forward or a rollback that the followers do not mirror. */
TEST(mpi_dspark_experts) {
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    const char *mainm = test_shared("testdata/tinyds/tinyds.gguf"), *draft = test_shared("testdata/tinyds/tinyds-dspark.gguf");
    if (!mainm || !draft) SKIP("needs ../shared/testdata/tinyds");
    static char one[4096], plain[4096], job[4096], out[1 << 14];
    char cmd[2400], run[1600];
    /* stdout through a pipe on every rank, so that the output is never styled for a terminal */
    snprintf(run, sizeof run, "%s run -m %s -p \"Count to ten, please.\" -n 24 --temp 0 --threads 1", test_bin(), mainm);
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null | cat", run);
    CHECK(test_run(cmd, plain, sizeof plain) == 0 && strlen(plain) > 10);
    snprintf(cmd, sizeof cmd, "%s --draft %s --draft-policy always 2>/dev/null | cat", run, draft);
    CHECK(test_run(cmd, one, sizeof one) == 0);
    CHECKF(!strcmp(one, plain), "one process: the draft changed the greedy text: '%s' against '%s'", one, plain);
    snprintf(cmd, sizeof cmd, "timeout 120 env %s sh -c '%s --draft %s --draft-policy always --ubatch 7 --parallel experts "
             "2>/dev/null | cat' 2>/dev/null", test_mpirun(2), run, draft);
    int rc = test_run(cmd, job, sizeof job);
    CHECKF(rc == 0 && !strcmp(job, one), "np 2 experts: rc %d, '%s' against '%s'", rc, job, one);
    snprintf(cmd, sizeof cmd, "timeout 120 env %s %s --draft %s --parallel pipeline 2>&1", test_mpirun(2), run, draft);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash run: target features (DSpark) need every layer on rank 0: not with --parallel "
                                  "pipeline"), "pipeline: rc %d: %s", rc, out);
}
