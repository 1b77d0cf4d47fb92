/* moe.h: the MoE FFN of one layer (architecture.md §4.5), moe.c. Not a public interface. */
#ifndef DSF_MOE_H
#define DSF_MOE_H

#include "model/forward.h"

/* out[T][n_embd] = the routed experts and the shared expert of layer il on the normed input
 * v[T][n_embd]. */
void moe_forward(const fwd *f, int64_t il, const float *v, float *out);

#endif
