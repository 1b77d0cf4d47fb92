/* plan.h: the memory a deepseek41 model needs, from its GGUF header alone (plan.c). */
#ifndef DSF_PLAN_H
#define DSF_PLAN_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    uint64_t class_bytes[TC_COUNT]; /* tensor bytes by class (model.h tensor_class) */
    uint64_t total;                 /* all tensor bytes */
    uint64_t resident;              /* streamed by every decode step: keep in memory */
    uint64_t by_row;                /* token embedding + Engram table: read a row at a time */
    /* one session's KV state per numerics mode (index: dsf_numerics; reference rows packed,
     * plain rows fp32, session.h): */
    uint64_t kv_bytes[2];           /* what kvcache.c's kv_init takes at ctx tokens */
    double kv_per_token[2];         /* growth per token: compressed rows + index keys (spec §5.1's
                                     * 890 B for the released shape, packed) + the 4 B token id */
    double kv_rows_per_token[2];    /* the same without the token id (the spec's figure) */
    uint64_t kv_window[2];          /* n_layer x window rows: the window state a context needs */
    uint64_t kv_ring[2];            /* the window rings kv_init allocates (window + chunk + margin) */
    int kv_packed[2];               /* whether that mode's rows are packed */
    int64_t n_layer, n_ctx_train, window;
} model_plan_t;

/* The plan of the model whose header g holds (g may come from gguf_open_header: no tensor
 * data is read), for a session of ctx tokens prefilled in chunks of chunk tokens. 0, or -1
 * with err (a shape the loader refuses). */
int model_plan(const gguf_file *g, int64_t ctx, int64_t chunk, model_plan_t *p, char *err);

#endif
