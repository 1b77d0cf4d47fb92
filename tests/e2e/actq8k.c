/* actq8k.c: the `--act-q8k` flag (dsf_engine_params.act_q8k, the opt-in Q8_K activation mode) on
 * the commands that open an engine: run, chat, serve, logits and bench.
 *
 * Guards against: a command that lacks the flag or does not document it in --help, a malformed
 * spelling (--act-q8k=1) accepted silently instead of refused with the option named, and a flag
 * that changes a model without K / IQ weights (tiny41: its rows are 64 and 128 wide, no product
 * qualifies, so `dsflash logits` must write the same bytes with and without it). */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(actq8k_cli) {
    NEED_SHARED(tiny, "testdata/tiny41/tiny41.gguf");
    static const char *cmds[] = {"run", "chat", "serve", "logits", "bench"};
    char cmd[1400], out[8192];
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", test_bin(), cmds[i]);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "--act-q8k"), "%s --help (rc %d) does not document --act-q8k", cmds[i], rc);
        snprintf(cmd, sizeof cmd, "%s %s -m %s --act-q8k=1 </dev/null 2>&1", test_bin(), cmds[i], tiny);
        rc = test_run(cmd, out, sizeof out);
        CHECKF(rc != 0 && strstr(out, "option") && strstr(out, "'--act-q8k=1'"), "%s --act-q8k=1: rc %d: %s", cmds[i], rc,
               out);
    }
    const char *a = test_tmpfile("actq8k_off.f32"), *b = test_tmpfile("actq8k_on.f32");
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s", a);
    snprintf(pb, sizeof pb, "%s", b);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens 1,2,3,4 --threads 2 --out %s", test_bin(), tiny, pa);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens 1,2,3,4 --threads 2 --act-q8k --out %s", test_bin(), tiny, pb);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    long na = 0, nb = 0;
    unsigned char *x = test_slurp(pa, &na), *y = test_slurp(pb, &nb);
    CHECKF(x && y && na == nb && na > 0 && memcmp(x, y, (size_t)na) == 0, "tiny41 logits differ with --act-q8k");
    free(x);
    free(y);
}
