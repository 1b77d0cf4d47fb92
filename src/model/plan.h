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

/* dsflash's native types in a file (docs/FORMAT.md), from its header alone. */
typedef struct {
    uint32_t version;            /* dsflash.native_version, 0: not a native file */
    uint64_t n[2], bytes[2];     /* tensors and bytes of FP8_B32 ([0]) and FP8_R264 ([1]) */
    uint64_t data;               /* all tensor bytes */
    uint64_t seed_data;          /* the same tensors in the seed layout (BF16 in place of the native types) */
} model_native_t;

/* Fills *n; -1 with err as weights_native_version (a bad or missing dsflash.native_version). */
int model_native(const gguf_file *g, model_native_t *n, char *err);
/* Prints the native lines of `dsflash inspect` (what the file is, who cannot read it, the sizes)
 * through emit; nothing for a file without native types. */
void model_native_describe(const model_native_t *n, void (*emit)(void *ud, const char *line), void *ud);

/* The plan of the model whose header g holds (g may come from gguf_open_header: no tensor
 * data is read), for a session of ctx tokens prefilled in chunks of chunk tokens. 0, or -1
 * with err (a shape the loader refuses). */
int model_plan(const gguf_file *g, int64_t ctx, int64_t chunk, model_plan_t *p, char *err);

#endif
