/* ubatch.c: the prefill chunk (--ubatch; dsf_engine_params.ubatch) through the commands.
 * Guards against: --ubatch not reaching the engine (the forwards a prefill runs, counted by
 * DSF_PROFILE=1, must be ceil(tokens / ubatch)); run's generator stepping a prefill in pieces
 * smaller than the engine's chunk (it took 64 tokens per step: a 114-token prompt ran as two
 * forwards); logits that depend on the chunk; bench's --ubatch list missing a size; and bad
 * values that do not fail with one line naming the option. */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The prefill forwards of a profile report: the prefill phase's calls plus the decode phase's
 * (a forward of one token counts there), or -1 when the report is missing. */
static long forwards(const char *out) {
    const char *p = strstr(out, "dsflash profile, prefill: "), *d = strstr(out, "dsflash profile, decode: ");
    long np = 0, nd = 0;
    if (!p && !d) return -1;
    if (p && sscanf(p, "dsflash profile, prefill: %ld calls", &np) != 1) return -1;
    if (d && sscanf(d, "dsflash profile, decode: %ld calls", &nd) != 1) return -1;
    return np + nd;
}

TEST(ubatch_run_prefill_forwards) {
    /* run -n 1 evaluates the prompt only (the sampled token is not evaluated): 60 words make
     * 114 tokens with tiny41's tokenizer and the chat encoding; the default chunk (512 on
     * tiny41's 8 experts) takes them in one forward */
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char words[400] = "", cmd[1600], out[8192];
    for (int i = 0; i < 60; i++) strcat(words, "word ");
    static const struct {
        const char *opt;
        long want;
    } ck[] = {{"", 1}, {"--ubatch 0", 1}, {"--ubatch 100", 2}, {"--ubatch 7", 17}, {"--ubatch 114", 1}};
    for (int k = 0; k < 5; k++) {
        snprintf(cmd, sizeof cmd, "DSF_PROFILE=1 %s run -m %s -n 1 --temp 0 --threads 2 %s -p '%s' 2>&1", test_bin(),
                 model, ck[k].opt, words);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "prompt 114 tokens") && forwards(out) == ck[k].want, "'%s': rc %d, %ld forwards "
               "(want %ld): %s", ck[k].opt, rc, forwards(out), ck[k].want, out);
    }
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 1 --ubatch -1 -p hi 2>&1", test_bin(), model);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash run: bad --ubatch '-1'"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s serve -m %s --ubatch lots 2>&1", test_bin(), model);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash serve: bad --ubatch 'lots'"), "rc %d: %s", rc, out);
}

TEST(ubatch_logits_do_not_change) {
    /* the logits of every position, bit for bit, whatever the chunk; the forwards counted */
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char toks[400] = "", cmd[2600], out[8192], path[3][600];
    for (int i = 0; i < 40; i++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", i ? "," : "", 3 + 7 * i);
    static const char *const opt[3] = {"", "--ubatch 3", "--ubatch 16"};
    static const long want[3] = {1, 14, 3};
    long size[3] = {0};
    unsigned char *data[3] = {NULL};
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "%s/ubatch-%d.f32", test_tmpdir(), k);
        snprintf(cmd, sizeof cmd, "DSF_PROFILE=1 %s logits -m %s --tokens %s --out %s --threads 2 %s 2>&1", test_bin(),
                 model, toks, path[k], opt[k]);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 0 && forwards(out) == want[k], "'%s': rc %d, %ld forwards (want %ld): %s", opt[k], rc,
               forwards(out), want[k], out);
        data[k] = test_slurp(path[k], &size[k]);
        CHECK(data[k] && size[k] > 0);
    }
    for (int k = 1; k < 3; k++)
        CHECKF(data[0] && data[k] && size[k] == size[0] && !memcmp(data[0], data[k], (size_t)size[0]),
               "'%s' differs from the default chunk", opt[k]);
    for (int k = 0; k < 3; k++) free(data[k]);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens 1,2 --out %s --ubatch 2x 2>&1", test_bin(), model, path[0]);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash logits: bad --ubatch '2x'"), "rc %d: %s", rc, out);
}

TEST(ubatch_bench_list) {
    /* bench --ubatch A,B: a line and a key line per size, then the run at A (its prefill line
     * names it); no timing is checked */
    char m[512], cmd[1600], out[16384];
    CHECK(test_synth_tiny(m, sizeof m, "ubatch-tiny.gguf", 7));
    snprintf(cmd, sizeof cmd, "%s bench -m %s --prompt 12 --gen 2 --threads 2 --arena-mb 64 --ubatch 4,12,5 2>&1",
             test_bin(), m);
    int rc = test_run(cmd, out, sizeof out);
    const char *a = strstr(out, "\nubatch=4 prefill_tps="), *b = strstr(out, "\nubatch=12 prefill_tps="),
               *c = strstr(out, "\nubatch=5 prefill_tps=");
    CHECKF(rc == 0 && a && b && c && a < b && b < c && strstr(out, "prefill 12 tokens at ubatch 12 (") &&
               strstr(out, "mxfp4_read_share=") && strstr(out, "prefill 12 tokens (ubatch 4):") &&
               strstr(out, "decode_bw_fraction="),
           "rc %d: %s", rc, out);
    /* one size: no list lines, the run at that size (3 forwards of the 12 tokens) */
    snprintf(cmd, sizeof cmd, "DSF_PROFILE=1 %s bench -m %s --prompt 12 --gen 2 --threads 2 --arena-mb 64 --ubatch 4 "
             "2>&1", test_bin(), m);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && !strstr(out, "\nubatch=") && strstr(out, "dsflash profile, prefill: 3 calls, 12 tokens"),
           "rc %d: %s", rc, out);
    static const char *const bad[] = {"0", "4,", "4,x", "-2", "1,2,3,4,5,6,7,8,9"};
    for (int k = 0; k < 5; k++) {
        snprintf(cmd, sizeof cmd, "%s bench -m %s --ubatch %s 2>&1", test_bin(), m, bad[k]);
        rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, "dsflash bench: --ubatch wants"), "'%s': rc %d: %s", bad[k], rc, out);
    }
}
