/* amx_emu.c: the amx tables' code on emulated tiles (src/kernels/amx_emu.h: "amx-emu" and
 * "amx-mxfp4-emu") through the whole model, on any host with the avx512 table's features.
 * Guards against: a tile layout, panel or K-chunk bug of matmul_amx.c that only an AMX host
 * would have shown (the unit tests in tests/unit/kernels.c compare each product with its twin;
 * here the reference numerics, whose BF16-activation products run on the tiles, must meet the
 * tiny41 goldens' early rows and the contract preset), and a prefill whose logits depend on the
 * chunking (batch invariance: bit for bit). Each test forks (runner.c), so DSF_KERNELS set here
 * picks that process's table. */
#include "dsflash.h"
#include "test.h"
#include "kernels/select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"

static void contract_on_table(test_ctx *t, const char *table) {
    if (!kernels_by_name(table)) SKIP("this CPU cannot run the %s kernels (the avx512 table's features)", table);
    golden g;
    if (golden_load("contract-prefill", &g) < 0) SKIP("needs ../shared/" GDIR "contract-prefill.*");
    const char *p = test_shared("testdata/tiny41/tiny41.gguf");
    if (!p) {
        golden_free(&g);
        SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
    }
    setenv("DSF_KERNELS", table, 1);
    CHECKF(!strcmp(kernels_get()->name, table), "DSF_KERNELS=%s picked %s", table, kernels_get()->name);
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = DSF_NUMERICS_REFERENCE;
    ep.n_threads = 2;
    char err[DSF_ERR_LEN];
    dsf_engine *e = dsf_engine_open(p, &ep, err);
    CHECKF(e, "open: %s", err);
    float *first = NULL;
    static const int chunks[] = {0, 1, 7};
    for (int c = 0; c < 3; c++) {
        float *lg = golden_run(e, g.tokens, g.n, chunks[c], err);
        CHECKF(lg, "%s chunk %d: %s", table, chunks[c], err);
        /* rows 0..5 precede any fp8 flip's cascade (tests/tiny/golden.c); then the README's
         * contract preset: mean <= 0.5, top-1 >= 35 % */
        cmp_stats early = golden_compare(lg, g.gold, 6, g.vocab, 1e-4);
        cmp_stats st = golden_compare(lg, g.gold, g.n, g.vocab, 1e-3);
        CHECKF(early.bad_rows == 0, "%s chunk %d: rows 0..5 max %.3g", table, chunks[c], early.max_abs);
        CHECKF(st.mean_abs <= 0.5 && st.top1_miss <= g.n - (int)ceil(0.35 * g.n),
               "%s chunk %d: mean %.3g top-1 misses %d/%d", table, chunks[c], st.mean_abs, st.top1_miss, g.n);
        if (!first) first = lg;
        else {
            CHECKF(!memcmp(first, lg, (size_t)g.n * (size_t)g.vocab * sizeof *lg),
                   "%s: chunk %d differs from one prefill", table, chunks[c]);
            free(lg);
        }
    }
    free(first);
    dsf_engine_close(e);
    golden_free(&g);
}

TEST(amx_emu_contract_prefill) { contract_on_table(t, "amx-emu"); }
TEST(amx_emu_mxfp4_contract_prefill) { contract_on_table(t, "amx-mxfp4-emu"); }
