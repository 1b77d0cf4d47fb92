/* bench.c: `dsflash bench`, end to end on a synthesized tiny model (no timing is checked:
 * benchmarks measure, tests assert).
 * Guards against: usage errors that do not fail with one line, an arena too small for the
 * kernel cases (a crash), a stack limit handled without
 * a word, a CSV whose commit is not the binary's, a profile that miscounts calls, and a
 * decode step's weight bytes that count the indexer's query projections where they are not
 * computed. */
#include "test.h"
#include "io/gguf.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(bench_cli) {
    /* `dsflash bench`: usage errors fail with one "dsflash bench:" line; -m on a synthesized tiny
     * model runs end to end and ends with the machine-readable line (no timing is checked) */
    char cmd[1400], out[8192];
    snprintf(cmd, sizeof cmd, "%s bench 2>&1", test_bin());
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash bench:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s bench -m /nonexistent.gguf 2>&1", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash bench:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s bench --kernels --threads 0 2>&1", test_bin());
    CHECK(test_run(cmd, out, sizeof out) != 0);
    snprintf(cmd, sizeof cmd, "%s bench --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "--kernels"));
    /* an arena smaller than a case's matrix is refused before anything runs (it used to write
     * past the arena and crash) */
    snprintf(cmd, sizeof cmd, "%s bench --kernels --arena-mb 64 2>&1", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "more than --arena-mb 64 holds") && !strstr(out, "GB/s"), "rc %d: %s", rc, out);
    /* a small stack limit: raised when only the soft limit is small (no warning), a warning
     * naming it when the hard limit is small too (the kernels keep 512 KiB chunk buffers on
     * the caller's stack) */
    snprintf(cmd, sizeof cmd, "sh -c 'ulimit -s 256 && %s bench --help 2>&1'", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "stack limit is 256 KiB"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "sh -c 'ulimit -S -s 256 && %s bench --help 2>&1'", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && !strstr(out, "stack limit"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s/bench-tiny.gguf 2>/dev/null && %s bench -m %s/bench-tiny.gguf "
             "--prompt 6 --gen 3 --threads 2 --arena-mb 64 --csv %s/bench.csv 2>&1", test_bin(), test_tmpdir(),
             test_bin(), test_tmpdir(), test_tmpdir());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "decode_bw_fraction=") && strstr(out, "prefill_peak_fraction="), "rc %d: %s", rc, out);
    /* the commit in the CSV (column 2) is the one the binary was built from, as `dsflash
     * --version` prints it: a short hash (+ "-modified") or "unknown", also when bench runs
     * outside the source tree (it used to ask git about the current directory) */
    char ver[256] = "", csv[4096] = "", path[1100], abs[PATH_MAX], cmd2[PATH_MAX + 1400];
    CHECK(realpath(test_bin(), abs) != NULL);
    snprintf(cmd2, sizeof cmd2, "cd %s && %s bench -m bench-tiny.gguf --prompt 2 --gen 1 --threads 1 --arena-mb 64 "
             "--csv bench2.csv >/dev/null 2>&1", test_tmpdir(), abs);
    CHECK(test_run(cmd2, out, sizeof out) == 0);
    snprintf(cmd, sizeof cmd, "%s --version", test_bin());
    rc = test_run(cmd, ver, sizeof ver);
    const int vok = rc == 0 && !strncmp(ver, "dsflash ", 8);
    const char *vs = vok ? ver + 8 : ""; /* the stamp */
    size_t hl = strspn(vs, "0123456789abcdef");
    CHECKF(vok && ((hl >= 7 && (!strcmp(vs + hl, "\n") || !strcmp(vs + hl, "-modified\n"))) || !strcmp(vs, "unknown\n")),
           "rc %d: '%s'", rc, ver);
    snprintf(path, sizeof path, "%s/bench2.csv", test_tmpdir());
    FILE *cf = fopen(path, "r");
    CHECK(cf && fgets(csv, sizeof csv, cf) && fgets(csv, sizeof csv, cf));
    if (cf) fclose(cf);
    const char *c1 = strchr(csv, ',');
    size_t vl = strcspn(vs, "\n");
    CHECKF(c1 && vl && !strncmp(c1 + 1, vs, vl) && c1[1 + vl] == ',', "CSV row '%s' against '%s'", csv, ver);
    /* --cold (drops the file's cached pages first) and DSF_PROFILE=1 (the time split at exit) */
    snprintf(cmd, sizeof cmd, "DSF_PROFILE=1 %s bench -m %s/bench-tiny.gguf --cold --prompt 6 --gen 3 --threads 2 "
             "--arena-mb 64 2>&1", test_bin(), test_tmpdir());
    rc = test_run(cmd, out, sizeof out);
    /* the warm-up prefill is not in the report: one prefill chunk of 6 tokens */
    CHECKF(rc == 0 && strstr(out, "decode_bw_fraction=") && strstr(out, "dsflash profile, decode: 3 calls") &&
               strstr(out, "dsflash profile, prefill: 1 calls, 6 tokens"),
           "rc %d: %s", rc, out);
    /* DSF_PROFILE=2: the table by product. The tiny preset (vocab 1024, hidden 128, 8 layers,
     * top-2 routed + 1 shared expert of 64): 3 decode steps run the LM head 3 times and the
     * MoE gate/up job (2 products per expert, 3 experts) 8 x 3 times. The experts are
     * repacked (mxfp4r) for the avx512 kernels and MXFP4 otherwise. */
    snprintf(cmd, sizeof cmd, "DSF_PROFILE=2 %s bench -m %s/bench-tiny.gguf --prompt 6 --gen 3 --threads 2 "
             "--arena-mb 64 2>&1", test_bin(), test_tmpdir());
    rc = test_run(cmd, out, sizeof out);
    const char *dec = strstr(out, "dsflash profile by product, decode");
    const char *pre = dec ? strstr(dec, "dsflash profile, prefill") : NULL;
    CHECKF(rc == 0 && dec && pre && strstr(pre, "dsflash profile by product, prefill"), "rc %d: %s", rc, out);
    long head = -1, moe = -1;
    for (const char *l = dec; l && l < pre; l = strchr(l + 1, '\n')) {
        long n;
        if (sscanf(l, " 1024 x 128 BF16 %ld", &n) == 1) head = n;
        char ty[16];
        if (sscanf(l, " job of 6: 64 x 128 %15s %ld", ty, &n) == 2 && (!strcmp(ty, "mxfp4r") || !strcmp(ty, "MXFP4")))
            moe = n;
    }
    CHECKF(head == 3 && moe == 24, "LM head calls %ld (want 3), MoE gate/up jobs %ld (want 24): %s", head, moe, out);
}

/* bytes_per_token of `dsflash bench -m GGUF --prompt P --gen G`, or -1. */
static double bench_step_bytes(const char *gguf, int prompt, int gen) {
    char cmd[PATH_MAX + 256], out[16384];
    snprintf(cmd, sizeof cmd, "%s bench -m %s --prompt %d --gen %d --threads 2 --arena-mb 64 2>&1", test_bin(), gguf,
             prompt, gen);
    const char *b = test_run(cmd, out, sizeof out) == 0 ? strstr(out, "bytes_per_token=") : NULL;
    return b ? strtod(b + 16, NULL) : -1;
}

TEST(bench_cold_engram) {
    /* `bench --cold` on a model with Engram: the table is evicted before each decode step and
     * the reader statistics come out per token (tiny: 2 modules x 6 columns = 12 rows a token),
     * with and without readers; a bad --engram-* value is refused naming the option. No timing
     * is checked. */
    char cmd[1400], out[8192];
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s/bench-cold.gguf 2>/dev/null", test_bin(), test_tmpdir());
    CHECK(test_run(cmd, out, sizeof out) == 0);
    for (int readers = 0; readers <= 3; readers += 3) {
        snprintf(cmd, sizeof cmd, "%s bench -m %s/bench-cold.gguf --cold --prompt 4 --gen 3 --threads 2 --arena-mb 64 "
                 "--engram-readers %d --engram-cache 0 2>&1", test_bin(), test_tmpdir(), readers);
        int rc = test_run(cmd, out, sizeof out);
        char want[64];
        snprintf(want, sizeof want, "engram_cold readers=%d ", readers);
        CHECKF(rc == 0 && strstr(out, want) && strstr(out, "before each of 3 steps") &&
                   strstr(out, "Engram per token: 12.0 rows") && strstr(out, "random-read probe") &&
                   strstr(out, "decode_bw_fraction="),
               "rc %d: %s", rc, out);
    }
    snprintf(cmd, sizeof cmd, "%s bench -m %s/bench-cold.gguf --engram-cache lots 2>&1", test_bin(), test_tmpdir());
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "dsflash bench: bad --engram-cache 'lots'"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s run -m %s/bench-cold.gguf --engram-readers 9999 2>&1", test_bin(), test_tmpdir());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "bad --engram-readers '9999' (expected 0..256 threads)"), "rc %d: %s", rc, out);
}

TEST(bench_bytes) {
    /* `dsflash bench` counts a decode step's weight bytes from the shapes, and the indexer's
     * query projections (idx_q_b, idx_proj) only at the positions that compute them: where a
     * query sees more compressed rows, (p + 1) / ratio, than it selects (idx_topk; spec
     * §4.4.5: otherwise every visible row is selected). The tiny preset has index sources 2
     * and 4 (ratio 2) and 5 and 7 (ratio 1) and idx_topk 8 (the candidate stage of layer 5,
     * blocks of 4 and 3 kept, needs more than 12 rows), so a layer of ratio 1 computes them
     * from position 8 on and one of ratio 2 from 17 on. */
    char path[PATH_MAX], cmd[PATH_MAX + 128], out[4096], err[512] = "";
    snprintf(path, sizeof path, "%s/bench-bytes.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s 2>&1", test_bin(), path);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    gguf_file *g = gguf_open(path, err);
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    double proj[8] = {0};
    for (int il = 0; il < 8; il++) {
        static const char *const fmt[2] = {"blk.%d.indexer.attn_q_b.weight", "blk.%d.indexer.proj.weight"};
        for (int i = 0; i < 2; i++) {
            char name[64];
            snprintf(name, sizeof name, fmt[i], il);
            const gguf_tensor *tt = gguf_find_tensor(g, name);
            if (tt) proj[il] += (double)tt->nbytes;
        }
    }
    gguf_close(g);
    CHECKF(proj[2] > 0 && proj[4] > 0 && proj[5] > 0 && proj[7] > 0 && proj[0] == 0 && proj[6] == 0,
           "projection bytes %g %g %g %g %g %g", proj[0], proj[2], proj[4], proj[5], proj[6], proj[7]);
    const double all = bench_step_bytes(path, 20, 4);  /* positions 20-23: every source layer */
    const double none = bench_step_bytes(path, 2, 4);  /* 2-5: none */
    const double part = bench_step_bytes(path, 12, 8); /* 12-19: ratio 1 all, ratio 2 at 17-19 */
    CHECKF(all > 0 && none > 0 && part > 0, "%g %g %g", all, none, part);
    const double d_none = proj[2] + proj[4] + proj[5] + proj[7], d_part = (proj[2] + proj[4]) * 5.0 / 8.0;
    CHECKF(fabs(all - none - d_none) < 1 && fabs(all - part - d_part) < 1,
           "bytes per step: all %.0f, none %.0f (want all - %.0f), part %.0f (want all - %.1f)", all, none, d_none, part,
           d_part);
}
