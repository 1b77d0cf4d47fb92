/* synth.c: `dsflash synth`, the command, and the synth module's refusals.
 * Guards against: an unknown preset or a bad output path that does not fail cleanly (one
 * "dsflash synth:" line, non-zero exit), and a bench preset that outgrows 24 GiB. */
#include "test.h"
#include "dsflash.h"
#include "convert/synth.h"

#include <stdio.h>
#include <string.h>

TEST(synth_unknown_preset_and_cli) {
    char err[DSF_ERR_LEN] = "";
    CHECK(synth_write("huge", "/nonexistent/x.gguf", 1, err) < 0 && strstr(err, "huge"));
    CHECK(synth_data_bytes("bench") > 8000000000ull && synth_data_bytes("bench") < 16000000000ull); /* fits 24 GiB */
    char cmd[1200], out[2048];
    snprintf(cmd, sizeof cmd, "%s synth --preset nope %s/x.gguf 2>&1", test_bin(), test_tmpdir());
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash synth:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny 2>&1", test_bin());
    CHECK(test_run(cmd, out, sizeof out) != 0);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny /nonexistent-dir/x.gguf 2>&1", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash synth:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "--preset"));
}

/* Guards against: --header-only, --type or --expert-type not reaching the file through the
 * command line (--type alone must retype the experts too, as llama-quantize does), a header-only file that `inspect --plan` cannot read, and an unknown type
 * name accepted. The plan's "all" line is the sum of the tensor bytes: about 698.8 GB with the
 * released dtypes (gguf-layout §3.2), i.e. 650.8 GiB; the two-decimal print is checked to the
 * spec's precision. */
TEST(synth_real_header_only_plan) {
    char cmd[1600], out[8192], path[600];
    snprintf(path, sizeof path, "%s/real-hdr.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only 2>&1", test_bin(), path);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "header only") && strstr(out, "650.8"), "rc %d: %s", rc, out);
    /* --type alone reaches the experts (like llama-quantize): Q4_K experts are 40 x 3 x 384 x
     * 2304 x 5120 / 256 x 144 bytes (gguf-layout §1.4: 256 values in 144 bytes) = 284.766 GiB */
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only --type Q4_K 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "routed experts        284.766"), "rc %d: %s", rc, out);
    /* --expert-type overrides it: MXFP4 experts are 288,777,830,400 B (gguf-layout §3.2) = 268.945 GiB */
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only --type Q8_0 --expert-type mxfp4 2>&1",
             test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "routed experts        268.945"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s --type Q9_X 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "Q9_X"), "rc %d: %s", rc, out);
}
