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
    uint64_t kv_bytes;              /* one session's KV state (kvcache.c) at ctx tokens */
    double kv_per_token;            /* its growth per token of context */
    int64_t n_layer, n_ctx_train;
} model_plan_t;

/* The plan of the model whose header g holds (g may come from gguf_open_header: no tensor
 * data is read), for a session of ctx tokens prefilled in chunks of chunk tokens. 0, or -1
 * with err (a shape the loader refuses). */
int model_plan(const gguf_file *g, int64_t ctx, int64_t chunk, model_plan_t *p, char *err);

#endif
