/* fuzz_mmproj.c: libFuzzer harness for the deepseek41v projector loader (vis_model_open:
 * src/vision/mmproj.c) on hostile metadata: mmproj-tinyvl.gguf with byte patches in its
 * header, its key/values and its tensor table (fuzz_model.c's patching: wrong keys, types,
 * shapes, dtypes, offsets, block counts, projector types).
 *
 * Checks: a refused projector gets a one-line error; an accepted one runs the tower and the
 * aligner on a 4 x 3 grid of patches (vis_tower_run) without a crash, an overread or an abort,
 * or refuses with an error. */
#ifndef FUZZ_NO_MAIN
#define FUZZ_NO_MAIN
#include "fuzz_model.c"
#undef FUZZ_NO_MAIN
#define FZ_MMPROJ_MAIN
#endif
#include "vision/mmproj.h"
#include "vision/tower.h"
#include "kernels/select.h"

static int fz_mmproj_one(const uint8_t *data, size_t size) {
    static fz_model_env env;
    static dsf_pool *pool;
    FZ_REQUIRE(fz_tpl_env(&env, "testdata/tinyvl/mmproj-tinyvl.gguf"), "needs ../shared/testdata/tinyvl (or DSF_SHARED)");
    if (!pool) pool = dsf_pool_new(1);
    char err[DSF_ERR_LEN] = "";
    enum { MAX_PATCH = 64 };
    uint32_t at[MAX_PATCH];
    const int np = fz_patch(&env, data, size, at, MAX_PATCH);
    vis_model *m = vis_model_open(env.path, err);
    if (!m) {
        fz_check_err(err, "vis_model_open");
    } else {
        const vis_hparams *hp = &m->hp;
        const int gw = 4, gh = 3, r = hp->merge, tokens = (gh + r - 1) / r * ((gw + r - 1) / r + 1) + 2;
        const size_t k = 3 * (size_t)hp->patch * (size_t)hp->patch;
        float *px = calloc((size_t)(gw * gh) * k, sizeof *px);
        float *block = malloc((size_t)tokens * (size_t)hp->proj_dim * sizeof *block);
        FZ_REQUIRE(px && block, "out of memory for %d tokens of %d", tokens, hp->proj_dim);
        for (size_t i = 0; i < (size_t)(gw * gh) * k; i++) px[i] = (float)(i % 5) * 0.25f - 0.5f;
        if (vis_tower_run(m, pool, kernels_get(), size % 2, px, gh, gw, NULL, block, err)) fz_check_err(err, "vis_tower_run");
        free(px), free(block);
        vis_model_free(m);
    }
    fz_unpatch(&env, at, np);
    return m != NULL;
}

#ifdef FZ_MMPROJ_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fz_model_one; /* fuzz_model.c's harness, included for its template patching */
    fz_mmproj_one(data, size);
    return 0;
}
#endif
