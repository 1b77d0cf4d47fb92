/* bench_batch.c: `dsflash bench -m MODEL --batch N` (bench_batch.h).
 * Must not: change the single-sequence figures (it runs after them, on sessions of its own). */
#include "bench_batch.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t argmax(const float *row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

int bench_batch(dsf_engine *e, int nseq, int prompt, int steps, bench_batch_result *out) {
    char err[DSF_ERR_LEN] = "";
    const int V = dsf_engine_n_vocab(e);
    memset(out, 0, sizeof *out);
    dsf_session **ss = calloc((size_t)nseq, sizeof *ss);
    int32_t *tok = malloc((size_t)(nseq > prompt ? nseq : prompt) * sizeof *tok);
    float *lg = malloc((size_t)nseq * (size_t)V * sizeof *lg);
    int rc = 1;
    if (!ss || !tok || !lg) {
        fprintf(stderr, "dsflash bench: --batch: out of memory\n");
        goto done;
    }
    uint64_t s = 777;
    for (int i = 0; i < nseq; i++) { /* each sequence its own prompt */
        if (!(ss[i] = dsf_session_new(e, prompt + steps + 1, err))) goto fail;
        for (int k = 0; k < prompt; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[k] = 3 + (int32_t)((s >> 33) % (uint64_t)(V > 4 ? V - 3 : 1));
        }
        if (dsf_session_eval(ss[i], tok, prompt, lg + (size_t)i * (size_t)V, false, err) < 0) goto fail;
    }
    const bool job = dsf_dist_size() > 1;
    if (job) bench_dist_begin(e);
    const double t0 = dsf_now();
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < nseq; i++) tok[i] = argmax(lg + (size_t)i * (size_t)V, V);
        if (dsf_batch_eval(ss, tok, nseq, lg, err) < 0) goto fail;
    }
    out->wall = dsf_now() - t0;
    out->nseq = nseq, out->steps = steps;
    out->tps = out->wall > 0 ? (double)nseq * steps / out->wall : 0;
    if (job && bench_dist_end(e, &out->dist, out->wall, nseq * steps) < 0) goto done;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "dsflash bench: --batch: %s\n", err);
done:
    for (int i = 0; ss && i < nseq; i++) dsf_session_free(ss[i]);
    free(ss), free(tok), free(lg);
    return rc;
}

void bench_batch_print(const bench_batch_result *r) {
    printf("  batched decode: %d sequences x %d steps (one dsf_batch_eval per step): %.2f tok/s, %.2f steps/s\n",
           r->nseq, r->steps, r->tps, r->wall > 0 ? r->steps / r->wall : 0);
    if (r->dist.n > 1) bench_dist_print_phase("batched decode", &r->dist);
}
