/* synth_impl.h: what the synthetic-model builder's two halves share, private to them:
 * synth.c lays models out (presets, roles, tokenizer, keys, tensor list) and synth_model.c
 * holds the editable model and generates and writes its data.
 * Must not: be included outside src/convert/synth*.c (the interface is synth.h). */
#ifndef DSF_SYNTH_IMPL_H
#define DSF_SYNTH_IMPL_H

#include <stdint.h>

#include "base/util.h"
#include "convert/synth.h"

/* ---- random numbers: splitmix64, and a seeded FNV-1a of a string ---- */

typedef struct { uint64_t s; } rng;

static inline uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline float rng_uniform(rng *r) { /* [-1, 1) */
    return (float)(int32_t)(uint32_t)(rng_next(r) >> 32) * (1.0f / 2147483648.0f);
}

static inline uint64_t hash_str(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* ---- tensors as laid out ---- */

/* A tensor's value distribution (synth_model.c: sample). */
enum synth_kind { K_NORM, K_DENSE, K_BIAS, K_SINK, K_HC_BASE, K_HC_SCALE, K_EMBED };

/* Appends a tensor named by fmt: type, distribution, fan_in (K_DENSE: the std is
 * 1/sqrt(fan_in)), n_dims and ne[0..2] (unused dims 1). */
void synth_tensor(synth_model *m, uint32_t type, enum synth_kind kind, int64_t fan_in, uint32_t n_dims, int64_t ne0,
                  int64_t ne1, int64_t ne2, const char *fmt, ...) DSF_PRINTF(9, 10);

/* The sum of the data bytes of the model's tensors (0 if a type cannot be sized). */
uint64_t synth_model_data_bytes(const synth_model *m);

/* An empty model whose weights will be seeded by seed (synth.c fills the lists). */
synth_model *synth_model_alloc(uint64_t seed);

#endif
