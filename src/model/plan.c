/* plan.c: the memory a deepseek41 model needs, from its GGUF header alone (dsflash inspect
 * --plan; issue 33 "Memory on the real model").
 *
 * Owns: the split of the tensor bytes into what decode streams every token (kept resident:
 * every class but the two tables read a row at a time) and what it reads by row (the token
 * embedding and the Engram table, through the page cache), and the session state a context
 * takes (kvcache.c's arrays: per token, and fixed).
 * Must not: read tensor data (the file may be a header only) or allocate a session.
 * Invariant: kv_bytes[mode] is what kvcache.c's kv_init takes for the same shape, context,
 * chunk and row storage (tests/tiny/plan.c compares the two). */
#include "model/plan.h"
#include "model/session.h"
#include "base/util.h"

#include <string.h>

int model_plan(const gguf_file *g, int64_t ctx, int64_t chunk, model_plan_t *p, char *err) {
    memset(p, 0, sizeof *p);
    dsf_shape s;
    if (shape_load(&s, g, err) < 0) return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const tensor_class c = tensor_class_of(t->name);
        p->class_bytes[c] += t->nbytes;
        if (c == TC_EMBED || c == TC_ENGRAM) p->by_row += t->nbytes;
        else p->resident += t->nbytes;
        p->total += t->nbytes;
    }
    /* kvcache.c's arrays, per numerics mode: the token ids; the window ring of every layer
     * (window + chunk + margin rows, at most ctx); on each KV source ctx / ratio + 1
     * compressed rows and index keys, and a carry of 2 fp32 rows */
    const uint64_t F = sizeof(float);
    int64_t wslots = s.window + chunk + DSF_ROLLBACK_MARGIN;
    if (wslots > ctx) wslots = ctx;
    for (int m = 0; m < 2; m++) {
        int64_t wrow, crow, irow;
        p->kv_packed[m] = kv_row_bytes(&s, m == DSF_NUMERICS_REFERENCE, &wrow, &crow, &irow);
        p->kv_bytes[m] = (uint64_t)ctx * sizeof(int32_t);
        for (int64_t il = 0; il < s.n_layer; il++) {
            p->kv_ring[m] += (uint64_t)wslots * (uint64_t)wrow;
            p->kv_window[m] += (uint64_t)s.window * (uint64_t)wrow;
            if (s.kv_src[il] != il) continue;
            p->kv_bytes[m] += ((uint64_t)(ctx / s.ratio[il]) + 1) * (uint64_t)(crow + irow);
            p->kv_bytes[m] += 2 * (uint64_t)s.head_dim * F;
            p->kv_rows_per_token[m] += (double)(crow + irow) / (double)s.ratio[il];
        }
        p->kv_bytes[m] += p->kv_ring[m];
        p->kv_per_token[m] = p->kv_rows_per_token[m] + (double)sizeof(int32_t);
    }
    p->n_layer = s.n_layer;
    p->window = s.window;
    p->n_ctx_train = s.n_ctx_train;
    shape_free(&s);
    return 0;
}
