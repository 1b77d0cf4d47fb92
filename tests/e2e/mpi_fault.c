/* mpi_fault.c: a rank of an MPI job that dies or hangs mid-decode (issue 39 "Faults"): the
 * job ends with a non-zero exit, its output names the rank, no dsflash process is left, and
 * it never hangs. The fault is the knob DSF_DIST_FAULT=RANK:N:SIG (src/model/distpipe.c:
 * rank RANK raises SIG as its N-th forward begins; 9 kills it, 19 stops it) during
 * `logits --chunk 1` (64 single-token decode steps; N = 30).
 *
 * Time: the only timing checks are generous "no hang" bounds (the job ends in 2-4 s here; the
 * bound is 60 s, and `timeout` kills the launcher at 120 s so that a hang fails the test
 * instead of stalling the suite). Whatever a check finds, every process of the job (found by
 * its unique output path in the test's folder) is killed before the checks, so a stopped rank
 * never outlives the test. Skips without MPI (tests/lib/mpi.h) or ../shared. */
#include "test.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "golden.h"
#include "mpi.h"

#define NO_HANG_S 60.0 /* a generous bound: the job ends in 2-4 s (liveness 2 s, mpirun's 1 s grace) */

typedef struct {
    int rc;         /* the launcher's exit status (124: `timeout` had to stop it) */
    double secs;    /* from the start to the launcher's exit */
    int left;       /* processes of the job still running 3 s after the launcher exited */
    char log[8192]; /* everything the ranks and mpirun printed */
} fault_out;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The processes whose command line matches pat (the job's output path, written so that the
 * shell running pgrep does not match itself). */
static int count_procs(const char *pat) {
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "pgrep -f '%s' | wc -l", pat);
    if (test_run(cmd, out, sizeof out) != 0) return -1;
    return atoi(out);
}

/* Runs `logits --chunk 1` as np ranks with --parallel par (and extra options) and the fault
 * knob; fills o. Returns -1 (after a test failure) when the test cannot run. */
static int run_fault(test_ctx *t, int np, const char *par, const char *extra, const char *fault, fault_out *o) {
    memset(o, 0, sizeof *o);
    const char *why = test_mpi_missing();
    if (why) {
        test_skip(t, "%s", why);
        return -1;
    }
    golden g;
    if (golden_load("plain-prefill", &g) < 0) {
        test_skip(t, "needs ../shared/" GDIR "plain-prefill.*");
        return -1;
    }
    const char *model = test_shared("testdata/tiny41/tiny41.gguf");
    char tok[512], out[512], pat[512], log[512], cmd[8192];
    snprintf(tok, sizeof tok, "%s/tokens", test_tmpdir());
    snprintf(out, sizeof out, "%s/fault.f32", test_tmpdir());
    snprintf(pat, sizeof pat, "%s/[f]ault.f32", test_tmpdir());
    snprintf(log, sizeof log, "%s/log", test_tmpdir());
    FILE *f = fopen(tok, "w");
    if (!f || !model) {
        if (f) fclose(f);
        golden_free(&g);
        test_fail(t, __FILE__, __LINE__, "no model or cannot write %s", tok);
        return -1;
    }
    for (int i = 0; i < g.n; i++) fprintf(f, i ? ",%d" : "%d", g.tokens[i]);
    fclose(f);
    golden_free(&g);
    /* the output goes to a file: a rank that outlived the launcher would hold a pipe open */
    snprintf(cmd, sizeof cmd,
             "DSF_DIST_FAULT=%s timeout -k 5 120 env %s -x DSF_DIST_FAULT %s logits -m %s --tokens-file %s --chunk 1 "
             "--threads 1 --parallel %s %s --out %s > %s 2>&1",
             fault, test_mpirun(np), test_bin(), model, tok, par, extra, out, log);
    const double t0 = now_s();
    o->rc = test_run(cmd, NULL, 0);
    o->secs = now_s() - t0;
    for (int k = 0; k < 30 && (o->left = count_procs(pat)) > 0; k++) usleep(100000);
    /* cleanup first, so that a failed check below never leaves a stopped rank behind */
    snprintf(cmd, sizeof cmd, "pkill -KILL -f '%s'", pat);
    test_run(cmd, NULL, 0);
    FILE *l = fopen(log, "r");
    if (l) {
        size_t n = fread(o->log, 1, sizeof o->log - 1, l);
        o->log[n] = 0;
        fclose(l);
    }
    printf("  np %d --parallel %s %s, DSF_DIST_FAULT=%s: exit %d after %.1f s, %d processes left\n", np, par, extra, fault,
           o->rc, o->secs, o->left);
    return 0;
}

/* Whether one line of log holds both a and b (every rank's start-up line names its rank, so a
 * rank's number alone proves nothing). */
static bool line_with(const char *log, const char *a, const char *b) {
    for (const char *p = log; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), p);
        if (strstr(line, a) && strstr(line, b)) return true;
        p += n + (e != NULL);
    }
    return false;
}

/* The checks every fault shares: non-zero, bounded, nothing left, the rank named in a line
 * holding both a and b. */
#define CHECK_FAULT(o, a, b)                                                                                         \
    do {                                                                                                             \
        CHECKF((o).rc != 0 && (o).rc != 124, "exit %d (124: still running at 120 s): %s", (o).rc, (o).log);          \
        CHECKF((o).secs < NO_HANG_S, "the job took %.1f s to end (no-hang bound %.0f s)", (o).secs, NO_HANG_S);      \
        CHECKF((o).left == 0, "%d processes of the job outlived the launcher", (o).left);                            \
        CHECKF(line_with((o).log, a, b), "no line names the rank ('%s' ... '%s'): %s", a, b, (o).log);               \
    } while (0)

/* Guards against: survivors that wait forever for a dead peer, a launcher that exits 0, and
 * an error that does not say which rank died: rank 1 of 2 is killed mid-decode. Rank 0 (the
 * one that prints) reports the failure as its error line. */
TEST(mpi_fault_kill_rank1_of_2) {
    fault_out o;
    if (run_fault(t, 2, "pipeline", "", "1:30:9", &o) < 0) return;
    CHECK_FAULT(o, "process rank 1 ", "signal 9"); /* mpirun's report */
    CHECKF(strstr(o.log, "dsflash logits: "), "rank 0 printed no error: %s", o.log);
}

/* The same with a member of a stage that splits its experts (rank 2 of 3, pipeline,experts):
 * its stage partner and the other stage end too. */
TEST(mpi_fault_kill_rank2_of_3) {
    fault_out o;
    if (run_fault(t, 3, "pipeline,experts", "", "2:30:9", &o) < 0) return;
    CHECK_FAULT(o, "process rank 2 ", "signal 9");
    CHECKF(strstr(o.log, "dsflash logits: "), "rank 0 printed no error: %s", o.log);
}

/* Guards against: a hung rank (alive to the launcher, so mpirun never notices) that blocks the
 * others: rank 1 of 3 is stopped; with --mpi-liveness 2 the survivors say it has not answered
 * and end the job. Whichever survivor notices first says so: a follower ("dsflash: rank 2 (host
 * H): rank 1 (host H) has not answered ...") or rank 0 in its error line ("dsflash logits: rank
 * 1 (host H) has not answered ..."); the start-up lines say "rank 1 of 3", never "rank 1 (host". */
TEST(mpi_fault_stop_rank1_of_3) {
    fault_out o;
    if (run_fault(t, 3, "pipeline", "--mpi-liveness 2", "1:30:19", &o) < 0) return;
    CHECK_FAULT(o, "rank 1 (host", "has not answered");
}

/* Guards against: followers that wait forever for the rank that drives them: rank 0 is killed
 * mid-decode; the followers end, non-zero. */
TEST(mpi_fault_kill_rank0) {
    fault_out o;
    if (run_fault(t, 2, "pipeline", "", "0:30:9", &o) < 0) return;
    CHECK_FAULT(o, "process rank 0 ", "signal 9");
}
