/* golden.c: `dsflash logits` against the golden logits of the official reference code
 * (../shared/testdata/tiny41, read its README), and model files that are truncated or not
 * deepseek41, through the library and the command. Skips cleanly when ../shared/testdata
 * is absent. */
#include "dsflash.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"
#include "helpers.h"

/* The CLI contract: `dsflash logits` with --chunk/--rollback-to/--snapshot-at writes the
 * same rows; bad arguments give one error line and a non-zero exit. */
TEST(golden_cli_logits_contract) {
    golden g;
    if (golden_load("plain-prefill", &g) < 0) SKIP("needs ../shared/" GDIR "plain-prefill.*");
    const char *model = test_shared("testdata/tiny41/tiny41.gguf");
    char *toks = malloc((size_t)g.n * 12 + 1), *p = toks;
    for (int i = 0; i < g.n; i++) p += sprintf(p, i ? ",%d" : "%d", g.tokens[i]);
    const char *variants[] = {"", "--chunk 1", "--chunk 5 --rollback-to 21", "--snapshot-at 13 --chunk 4",
                              "--snapshot-at 0 --rollback-to 63"};
    char *cmd = malloc(strlen(toks) + 2048), out[4096];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        sprintf(cmd, "%s logits -m %s --tokens %s --numerics plain --threads 2 %s --out %s/cli.f32 2>&1", test_bin(),
                model, toks, variants[v], test_tmpdir());
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 0, "'%s' exited %d: %s", variants[v], rc, out);
        char path[512];
        snprintf(path, sizeof path, "%s/cli.f32", test_tmpdir());
        FILE *f = fopen(path, "rb");
        CHECK(f);
        float *lg = malloc((size_t)g.n * g.vocab * sizeof(float));
        size_t got = fread(lg, sizeof(float), (size_t)g.n * g.vocab, f);
        fclose(f);
        CHECK(got == (size_t)g.n * g.vocab);
        cmp_stats st = golden_compare(lg, g.gold, g.n, g.vocab, 1e-3);
        CHECKF(st.bad_rows == 0 && st.top1_miss == 0, "'%s': max %.3g", variants[v], st.max_abs);
        free(lg);
    }
    const char *bad[] = {"--tokens 1,2,x", "--tokens 1,2,99999", "--tokens ''", "--tokens 1,2 --chunk 0",
                         "--tokens 1,2 --numerics fp8", "--tokens 1,2 --rollback-to 5", "--tokens-file /nonexistent"};
    for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
        sprintf(cmd, "%s logits -m %s %s --out %s/bad.f32 2>&1", test_bin(), model, bad[v], test_tmpdir());
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc != 0 && rc < 128, "'%s' exited %d", bad[v], rc);
        CHECKF(strncmp(out, "dsflash logits: ", 16) == 0 && strchr(out, '\n') == out + strlen(out) - 1,
               "'%s' did not print one error line: %s", bad[v], out);
    }
    free(cmd);
    free(toks);
    golden_free(&g);
}

/* A truncated or corrupted model file gives a clear error, never a crash: every cut of the
 * header region and a sample of cuts in the data of tiny41.gguf, through the library. */
TEST(golden_truncated_model_refused) {
    const char *model = test_shared("testdata/tiny41/tiny41.gguf");
    if (!model) SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
    long size = 0;
    unsigned char *buf = test_slurp(model, &size);
    CHECKF(buf, "cannot read %s", model);
    char path[512], err[DSF_ERR_LEN];
    snprintf(path, sizeof path, "%s/trunc.gguf", test_tmpdir());
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 1;
    int tried = 0;
    for (long cut = 0; cut < size; cut += cut < 70000 ? 97 : 40009) {
        FILE *o = fopen(path, "wb");
        fwrite(buf, 1, (size_t)cut, o);
        fclose(o);
        err[0] = 0;
        dsf_engine *e = dsf_engine_open(path, &ep, err);
        CHECKF(!e, "truncated at %ld of %ld: opened", cut, size);
        CHECKF(err[0], "truncated at %ld: no message", cut);
        tried++;
    }
    CHECK(tried > 100);
    /* a model that is not deepseek41 */
    unsigned char *copy = malloc((size_t)size);
    memcpy(copy, buf, (size_t)size);
    unsigned char *a = memmem(copy, (size_t)size, "deepseek41", 10);
    CHECK(a);
    memcpy(a, "deepseek40", 10);
    FILE *o = fopen(path, "wb");
    fwrite(copy, 1, (size_t)size, o);
    fclose(o);
    CHECK(!dsf_engine_open(path, &ep, err) && strstr(err, "deepseek41"));
    free(copy);
    free(buf);
    /* the CLI: one error line and exit 1, never a signal */
    char cmd[4096], out[2048];
    snprintf(cmd, sizeof cmd, "head -c 5000 %s > %s && %s logits -m %s --tokens 1,2 --out %s/x.f32 2>&1", model, path,
             test_bin(), path, test_tmpdir());
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "dsflash logits: "), "rc %d: %s", rc, out);
}
