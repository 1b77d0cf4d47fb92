/* fuzz_dspark.c: libFuzzer harness for DSpark draft loading (dspark_open: src/model/
 * dspark_load.c, weights.c in draft mode) on hostile metadata: tinyds-dspark.gguf with byte
 * patches in its header, its non-tokenizer key/values and its tensor table (the patching of
 * fuzz_model.c), opened against tinyds.gguf.
 *
 * Checks: a refused draft gets a one-line error; an accepted one takes three committed
 * positions and drafts a block after them, or refuses with an error (never a crash, overread
 * or abort). */
#ifndef FUZZ_NO_MAIN
#define FUZZ_NO_MAIN
#include "fuzz_model.c"
#undef FUZZ_NO_MAIN
#define FZ_DSPARK_MAIN
#endif
#include "model/dspark.h"

static int fz_dspark_one(const uint8_t *data, size_t size) {
    static fz_model_env env;
    static dsf_engine *mainm;
    FZ_REQUIRE(fz_tpl_env(&env, "testdata/tinyds/tinyds-dspark.gguf"), "needs ../shared/testdata/tinyds (or DSF_SHARED)");
    char err[DSF_ERR_LEN] = "";
    if (!mainm) {
        char path[4096];
        const char *shared = getenv("DSF_SHARED");
        snprintf(path, sizeof path, "%s/testdata/tinyds/tinyds.gguf", shared ? shared : "../shared");
        dsf_engine_params p;
        dsf_engine_params_default(&p);
        p.n_threads = 1;
        p.numerics = DSF_NUMERICS_PLAIN;
        mainm = dsf_engine_open(path, &p, err);
        FZ_REQUIRE(mainm, "main model: %s", err);
    }
    enum { MAX_PATCH = 64 };
    uint32_t at[MAX_PATCH];
    const int np = fz_patch(&env, data, size, at, MAX_PATCH);
    dsf_dspark *d = dspark_open(env.path, mainm, err);
    if (!d) fz_check_err(err, "dspark_open");
    else {
        dsf_dspark_info di;
        dspark_info(d, &di);
        dsf_dspark_seq *q = dspark_seq_new(d, err);
        if (!q) fz_check_err(err, "dspark_seq_new");
        else {
            float *f = calloc((size_t)di.feat_dim * 3, sizeof *f);
            for (int64_t i = 0; i < di.feat_dim * 3; i++) f[i] = (float)(i % 7) - 3.0f;
            dspark_seq_commit(q, f, 0, 3);
            int32_t ids[64];
            int n = di.block < 64 ? di.block : 64;
            if (dspark_draft(q, 2, 1, n, 0.0f, NULL, ids, NULL, NULL, NULL, err) < 0) fz_check_err(err, "dspark_draft");
            else
                for (int i = 0; i < n; i++) FZ_REQUIRE(ids[i] >= 0 && ids[i] < dsf_engine_n_vocab(mainm), "drafted id %d", ids[i]);
            free(f);
            dspark_seq_free(q);
        }
        dspark_close(d);
    }
    fz_unpatch(&env, at, np);
    return d != NULL;
}

#ifdef FZ_DSPARK_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fz_model_one; /* fuzz_model.c's harness, included for its template patching */
    fz_dspark_one(data, size);
    return 0;
}
#endif
