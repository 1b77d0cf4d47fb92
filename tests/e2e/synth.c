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
