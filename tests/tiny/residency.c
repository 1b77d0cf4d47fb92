/* residency.c: the automatic rule of the in-memory copies (dsf_engine_params.repack and
 * .resident; src/model/residency.c) against the memory it is given (DSF_RAM_BYTES stands in
 * for the machine's).
 * Guards against: a rule that counts the whole file, though the token embedding and the
 * Engram table are read a row at a time with pread and never mapped (on the released model
 * they are 56 % of the file: a 512 GiB machine, where the mapped weights and the copies fit,
 * lost the repacked experts and the dense copy); and a rule that copies where they do not fit. */
#include "dsflash.h"
#include "test.h"
#include "io/gguf.h"
#include "kernels/select.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine's copies of tiny41 in reference numerics with ram bytes of RAM. */
static void copies_at(test_ctx *t, const char *p, double ram, size_t *repacked, size_t *resident) {
    char v[64], err[DSF_ERR_LEN];
    snprintf(v, sizeof v, "%.0f", ram);
    setenv("DSF_RAM_BYTES", v, 1);
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(p, &ep, err);
    CHECKF(e, "open: %s", err);
    *repacked = e ? dsf_engine_repacked_bytes(e) : 0;
    *resident = e ? dsf_engine_resident_bytes(e) : 0;
    if (e) dsf_engine_close(e);
    unsetenv("DSF_RAM_BYTES");
}

TEST(residency_counts_the_mapped_weights) {
    const char *p = test_shared("testdata/tiny41/tiny41.gguf");
    if (!p) SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
    unsetenv("DSF_REPACK");
    unsetenv("DSF_RESIDENT");
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open_header(p, err);
    CHECKF(g, "%s", err);
    double all = 0, rows = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        all += (double)g->tensors[i].nbytes;
        if (!strcmp(g->tensors[i].name, "token_embd.weight") || !strcmp(g->tensors[i].name, "per_layer_token_embd.weight"))
            rows += (double)g->tensors[i].nbytes;
    }
    gguf_close(g);
    const double mapped = all - rows;
    CHECKF(rows > 0.05 * all, "tiny41's row-read tables are %.0f of %.0f bytes", rows, all);
    /* the copies replace their file bytes (the repacked layout adds a little padding): what the
     * rule weighs is about the mapped bytes; 80 % of RAM halfway between those and the file */
    const int can_repack = kernels_get()->mxfp4r_xbf16 != NULL;
    size_t rp = 0, rs = 0;
    copies_at(t, p, (mapped + rows / 2) / 0.8, &rp, &rs);
    CHECKF(rs > 0 && (rp > 0) == can_repack, "80 %% of RAM above the mapped %.0f bytes (file %.0f): repacked %zu, "
           "dense copy %zu", mapped, all, rp, rs);
    copies_at(t, p, mapped * 0.9 / 0.8, &rp, &rs);
    CHECKF(rs == 0 && rp == 0, "80 %% of RAM below the mapped %.0f bytes: repacked %zu, dense copy %zu", mapped, rp, rs);
    copies_at(t, p, 1e12, &rp, &rs);
    CHECKF(rs > 0 && (rp > 0) == can_repack, "1 TB of RAM: repacked %zu, dense copy %zu", rp, rs);
}
