/* mpi_cli.c: the commands that measure and describe an MPI job, run as processes:
 * `dsflash inspect --parallel` (no MPI needed) and `dsflash bench -m` under mpirun.
 * The expected plans come from the released layer roles (gguf-layout.md §2.5, architecture.md
 * §1.3): only layers 2, 8, 14 and 20 own compressed rows and 20 the candidates, so a cut in
 * front of 2, 8, 14 or 20 carries the hyper-connection stream alone (4 x 5120 + 4 fp32 = 81936
 * bytes per token); the message counts come from the ops and the forward's messages (dist*.c
 * headers). No timing is checked. */
#include "test.h"
#include "helpers.h"
#include "mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The real model's header (synth --preset real --header-only) in the tmpdir, or NULL. */
static const char *real_header(void) {
    static char path[512];
    if (path[0]) return path;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s synth --preset real --header-only %s/mpi-real.gguf >/dev/null 2>&1", test_bin(),
             test_tmpdir());
    if (test_run(cmd, NULL, 0) != 0) return NULL;
    snprintf(path, sizeof path, "%s/mpi-real.gguf", test_tmpdir());
    return path;
}

static int inspect(const char *args, const char *path, char *out, size_t cap) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s inspect --parallel %s %s 2>&1", test_bin(), args, path);
    return test_run(cmd, out, cap);
}

/* Guards against inspect --parallel failing on a header-only file (or starting MPI), against a
 * plan that cuts the real model where a layer dependency crosses when the balance allows a
 * clean cut (2 ranks: layer 20; 3 ranks: 14; 2 stages of 2: 20 with the experts halved), a
 * clean cut reported as carrying more than the stream, a forced crossing cut reported as
 * carrying nothing, and bad options taken silently. */
TEST(mpi_cli_inspect) {
    const char *real = real_header();
    CHECK(real);
    static char out[16384];
    int rc = inspect("pipeline --ranks 2", real, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "2 ranks, 2 stages (--parallel pipeline)") &&
               strstr(out, "cut before layer 20: 81936 bytes per token (the stream 81936; at most 0 more)") &&
               strstr(out, "rank 0: stage 0, layers 0-19, experts 0-383") &&
               strstr(out, "rank 1: stage 1, layers 20-39, experts 0-383") && strstr(out, "+ the head"),
           "rc %d: %s", rc, out);
    rc = inspect("pipeline --ranks 3", real, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "cut before layer 14: 81936 bytes per token (the stream 81936; at most 0 more)"),
           "rc %d: %s", rc, out);
    /* every clean cut of the roles at once, forced */
    rc = inspect("pipeline --ranks 5 --pp-split 2,8,14,20", real, out, sizeof out);
    int clean = 0;
    for (const char *p = out; (p = strstr(p, "(the stream 81936; at most 0 more)")); p++) clean++;
    CHECKF(rc == 0 && clean == 4 && strstr(out, "rank 4: stage 4, layers 20-39"), "rc %d, %d clean cuts: %s", rc, clean, out);
    /* a crossing cut: layer 2's rows and its top-k are used up to layer 7 */
    rc = inspect("pipeline --ranks 2 --pp-split 5", real, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "cut before layer 5:") && strstr(out, "layer 2's new rows") && strstr(out, "a top-k list") &&
               !strstr(out, "at most 0 more"),
           "rc %d: %s", rc, out);
    rc = inspect("pipeline,experts --ranks 4 --stages 2", real, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "4 ranks, 2 stages (--parallel pipeline,experts)") &&
               strstr(out, "cut before layer 20: 81936 bytes per token (the stream 81936; at most 0 more)") &&
               strstr(out, "rank 1: stage 0, layers 0-19, experts 192-383") &&
               strstr(out, "rank 3: stage 1, layers 20-39, experts 192-383"),
           "rc %d: %s", rc, out);
    rc = inspect("experts --ranks 2", real, out, sizeof out);
    CHECKF(rc == 0 && !strstr(out, "cut before") && strstr(out, "rank 1: stage 0, layers 0-39, experts 192-383"), "rc %d: %s",
           rc, out);
    /* bad options: usage errors (2), impossible plans (1), each with one line naming it */
    static const struct {
        const char *args, *want;
        int rc;
    } bad[] = {{"pipeline --ranks 0", "--ranks wants 1..64", 2},
               {"pipeline --ranks 2 --stages 2", "--stages needs --parallel pipeline,experts", 2},
               {"experts --ranks 2 --pp-split 20", "--pp-split needs --parallel pipeline", 2},
               {"pipeline", "--parallel wants a MODE, --ranks N", 2},
               {"ring --ranks 2", "--parallel 'ring'", 1},
               {"pipeline --ranks 2 --pp-split 20,30", "want 1 increasing layer numbers", 1},
               {"pipeline,experts --ranks 2 --stages 3", "3 stages need at least 3 ranks", 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = inspect(bad[i].args, real, out, sizeof out);
        CHECKF(rc == bad[i].rc && strstr(out, "dsflash inspect:") && strstr(out, bad[i].want), "%s: rc %d: %s", bad[i].args,
               rc, out);
    }
    rc = inspect("pipeline --ranks 2", "/nonexistent.gguf", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "dsflash inspect:"), "rc %d: %s", rc, out);
}

/* The value of key=... on the last line of out, or NULL. */
static const char *key(const char *out, const char *k, char *buf, size_t cap) {
    const char *last = out, *nl;
    while ((nl = strchr(last, '\n')) && nl[1]) last = nl + 1;
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", k);
    const char *p = strstr(last, pat);
    if (!p) return NULL;
    p += strlen(pat);
    size_t n = strcspn(p, " \n");
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    return buf;
}

/* Every comma-separated value of v in [lo, hi], and count of them. */
static int all_in(const char *v, double lo, double hi, int count) {
    int n = 0;
    for (const char *p = v; p && *p; n++) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || x < lo || x > hi) return 0;
        p = *end == ',' ? end + 1 : NULL;
    }
    return n == count;
}

/* Guards against bench -m failing or hanging as an MPI job (the followers must reach
 * dsf_engine_open), against a follower printing (one report, and the machine-readable line
 * last), against the counters of a phase counting the reset's or the query's own messages, and
 * against miscounting the messages of a decode step: pipeline, 2 ranks: rank 0's op (header,
 * tokens), the stream, the logits back = 4; experts, 2 ranks over tiny's 8 layers: the op (2)
 * and per layer a partial sum each way = 18. And against bench modes that cannot run as a job
 * being run on every rank. */
TEST(mpi_cli_bench) {
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    static char model[512];
    if (!test_synth_tiny(model, sizeof model, "mpi-bench-tiny.gguf", 1)) CHECK(!"synth --preset tiny failed");
    static const struct {
        const char *mode, *msgs;
    } runs[] = {{"pipeline", "4.000"}, {"experts", "18.000"}};
    static char out[1 << 16];
    for (int i = 0; i < 2; i++) {
        char cmd[1600], v[256];
        /* timeout: no hang (a run takes ~1 s) */
        snprintf(cmd, sizeof cmd, "timeout 120 sh -c '%s %s bench -m %s --prompt 12 --gen 6 --threads 1 --arena-mb 64 "
                 "--parallel %s' 2>/dev/null", test_mpirun(2), test_bin(), model, runs[i].mode);
        int rc = test_run(cmd, out, sizeof out);
        const char *first = strstr(out, "dsflash bench: model");
        CHECKF(rc == 0 && first && !strstr(first + 1, "dsflash bench: model") && strstr(out, "MPI job: 2 ranks") &&
                   strstr(out, "MPI, prefill 12 tokens") && strstr(out, "MPI, decode 6 tokens") &&
                   strstr(out, "MPI, resident memory"),
               "%s: rc %d: %s", runs[i].mode, rc, out);
        CHECKF(key(out, "ranks", v, sizeof v) && !strcmp(v, "2"), "%s: %s", runs[i].mode, out);
        CHECKF(key(out, "decode_mpi_msgs_per_token", v, sizeof v) && !strcmp(v, runs[i].msgs), "%s: msgs %s, want %s",
               runs[i].mode, v, runs[i].msgs);
        /* one wait fraction per rank; no bound on its value: it is a timing (on a busy machine a
         * follower's waits around a phase of a few ms can exceed rank 0's wall time of it) */
        CHECKF(key(out, "decode_mpi_wait", v, sizeof v) && all_in(v, 0, 1e9, 2), "%s: wait %s", runs[i].mode, v);
        CHECKF(key(out, "prefill_mpi_wait", v, sizeof v) && all_in(v, 0, 1e9, 2), "%s: wait %s", runs[i].mode, v);
        CHECKF(key(out, "rss_mib", v, sizeof v) && all_in(v, 1, 1e6, 2), "%s: rss %s", runs[i].mode, v);
        CHECKF(key(out, "decode_mpi_bytes_per_token", v, sizeof v) && atof(v) > 0, "%s: %s", runs[i].mode, out);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "timeout 120 sh -c '%s %s bench --kernels --parallel pipeline' 2>&1", test_mpirun(2), test_bin());
    int rc = test_run(cmd, out, sizeof out);
    const char *m = strstr(out, "dsflash bench: --parallel runs only bench -m MODEL");
    CHECKF(rc != 0 && m && !strstr(m + 1, "dsflash bench: --parallel"), "rc %d: %s", rc, out);
}
