/* native_cli.c: dsflash's native files (docs/FORMAT.md) through the command line: `convert
 * --outtype native`, `inspect` (and --plan) on the result, `tensor` on an FP8_B32 tensor,
 * `quantize ... native` and the errors of both commands.
 *
 * Guards against: an inspect that does not say plainly that a native file is one (and that
 * llama.cpp cannot load it) or reports wrong sizes, a `tensor` dump of an FP8_B32 matrix that
 * differs from the seed layout's BF16 one, and refusals that leave a file behind or do not
 * say what was wrong. */
#include "test.h"
#include "helpers.h"
#include "io/gguf.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* tiny41/hf converted natively into the test's folder; NULL (and a failure) if it fails. */
static const char *native_tiny41(test_ctx *t, const char *hf_config) {
    static char out[512];
    char cmd[1600], log[4096];
    snprintf(out, sizeof out, "%s/tiny41-native.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s convert %.*s %s --outtype native 2>&1", test_bin(),
             (int)(strrchr(hf_config, '/') - hf_config), hf_config, out);
    int rc = test_run(cmd, log, sizeof log);
    if (rc) test_fail(t, __FILE__, __LINE__, "convert --outtype native: rc %d: %s", rc, log);
    return rc ? NULL : out;
}

TEST(native_cli_inspect) {
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN], want[160], seed_path[512];
    snprintf(seed_path, sizeof seed_path, "%s", seed);
    const char *nat = native_tiny41(t, hf);
    if (!nat) return;
    /* the seed layout's tensor bytes, read from tiny41.gguf's own tensor table */
    gguf_file *g = gguf_open(seed_path, err);
    CHECKF(g, "%s", err);
    uint64_t seed_data = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) seed_data += g->tensors[i].nbytes;
    gguf_close(g);
    snprintf(want, sizeof want, "the seed layout's (BF16 in their place) %llu bytes", (unsigned long long)seed_data);
    static char out[1 << 20];
    char cmd[1600];
    for (int plan = 0; plan < 2; plan++) {
        snprintf(cmd, sizeof cmd, "%s inspect %s%s 2>&1", test_bin(), plan ? "--plan " : "", nat);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "this is a dsflash native file (dsflash.native_version 1") &&
                   strstr(out, "llama.cpp and other GGUF readers cannot load it") && strstr(out, "FP8_B32 ") &&
                   strstr(out, want),
               "inspect%s: rc %d, no native lines or not '%s':\n%.3000s", plan ? " --plan" : "", rc, want, out);
    }
    CHECK(strstr(out, "FP8_B32  (e4m3 + 32x32 E8M0 grid)     70 tensors")); /* tiny41: 70 FP8 weights (+.scale) */
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_bin(), seed_path);
    CHECK(test_run(cmd, out, sizeof out) == 0 && !strstr(out, "native file"));
}

TEST(native_cli_tensor) {
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed, "testdata/tiny41/tiny41.gguf");
    char seed_path[512];
    snprintf(seed_path, sizeof seed_path, "%s", seed);
    const char *nat = native_tiny41(t, hf);
    if (!nat) return;
    static const char *const names[] = {"blk.2.attn_output_a.weight", "blk.4.engram_kv.weight", "blk.0.attn_q_b.weight"};
    for (int i = 0; i < 3; i++) {
        char cmd[4096], a[512], b[512];
        snprintf(a, sizeof a, "%s/t-native.f32", test_tmpdir());
        snprintf(b, sizeof b, "%s/t-seed.f32", test_tmpdir());
        snprintf(cmd, sizeof cmd, "%s tensor %s %s --out %s && %s tensor %s %s --out %s && cmp -s %s %s", test_bin(), nat,
                 names[i], a, test_bin(), seed_path, names[i], b, a, b);
        CHECKF(test_run(cmd, NULL, 0) == 0, "%s: the FP8_B32 dump differs from tiny41.gguf's BF16 one", names[i]);
    }
}

TEST(native_cli_errors) {
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed, "testdata/tiny41/tiny41.gguf");
    char cmd[1600], out[4096], q8[512], x[512];
    snprintf(x, sizeof x, "%s/never.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s convert %.*s %s --outtype fp8 2>&1", test_bin(), (int)(strrchr(hf, '/') - hf), hf, x);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--outtype must be bf16, f32 or native, not 'fp8'"), "rc %d: %s", rc, out);
    /* Q8_0 weights are not FP8 values: refused, naming the tensor and block, no file left */
    snprintf(q8, sizeof q8, "%s/q8.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s quantize %s %s Q8_0 --threads 2 2>&1", test_bin(), seed, q8);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s native --threads 2 2>&1", test_bin(), q8, x);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "tensor 'blk.0.attn_q_a.weight'") && strstr(out, "not FP8 values"), "rc %d: %s", rc, out);
    CHECKF(access(x, F_OK) != 0, "%s left behind", x);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s native --tensor-type attn=q8_0 2>&1", test_bin(), seed, x);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "--tensor-type does not apply"), "rc %d: %s", rc, out);
    /* and the good path through the CLI: a native file that loads */
    snprintf(cmd, sizeof cmd, "%s quantize %s %s native --threads 2 2>&1 && %s inspect %s 2>&1", test_bin(), seed, x,
             test_bin(), x);
    static char big[1 << 20];
    rc = test_run(cmd, big, sizeof big);
    CHECKF(rc == 0 && strstr(big, "dsflash native file"), "rc %d: %.2000s", rc, big);
}
