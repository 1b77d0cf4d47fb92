/* inspect.c: `dsflash inspect`'s summaries, run as a process.
 * Guards against: the bytes by type or the types by tensor class missing or misfiled (tiny41
 * is a converter output: gguf-layout.md §3.1 puts MXFP4 on the routed experts, F32 on the
 * router, the hc mixes and the vectors, BF16 on the other matrices and the tables), and a
 * --plan that does not read a header-only file or misjudges what fits. */
#include "test.h"
#include "helpers.h"
#include "io/gguf.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(inspect_type_summary) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char cmd[1200];
    static char out[1 << 20];
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_bin(), model);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    const char *s = strstr(out, "== bytes by type ==");
    CHECKF(s && strstr(s, "MXFP4") && strstr(s, "== types by tensor class =="), "%s", s ? s : out);
    static const char *const want[] = {"routed experts        24 tensors", "MXFP4 x24", "router                 8 tensors",
                                       "hc mixes              16 tensors", "Engram table           1 tensors"};
    for (int i = 0; i < 5; i++) CHECKF(strstr(s, want[i]), "no '%s' in:\n%s", want[i], s);
    const char *router = strstr(s, "router "), *embd = strstr(s, "token embedding");
    CHECK(router && strstr(router, "F32 x8") && embd && strstr(embd, "BF16 x1"));
}

TEST(inspect_plan_cli) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char cmd[1200], out[8192], err[DSF_ERR_LEN], path[512];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    const uint64_t head = g->data_offset;
    gguf_close(g);
    snprintf(path, sizeof path, "%s/inspect-header.gguf", test_tmpdir());
    CHECK(test_copy_head(model, head, path) == 0);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 64 2>&1", test_bin(), path);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "(header only)") && strstr(out, "fits:") &&
               strstr(out, "KV state, reference numerics (packed rows)") &&
               strstr(out, "KV state, plain numerics (fp32 rows)") &&
               strstr(out, "Engram table") && strstr(out, "read by row"),
           "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 0.001 2>&1", test_bin(), model);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 3 && strstr(out, "(whole file)") && strstr(out, "does not fit"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ctx x 2>&1", test_bin(), model);
    CHECK(test_run(cmd, out, sizeof out) == 2);
}
