/* sampler.h: token sampling (the public API is in dsflash.h @sampler). This header exposes
 * the filter stage alone, so tests can check which tokens survive top-k/top-p/min-p. */
#ifndef DSF_SAMPLER_H
#define DSF_SAMPLER_H

#include "dsflash.h"

/* Applies top-k -> top-p -> min-p (and the ignore_eos mask) to the logits, ignoring the
 * temperature. Writes the surviving ids, most likely first (lower id first on ties), to
 * ids (room for n_vocab) and returns their count (0 if none is possible). scratch: at least
 * dsf_sample_scratch_bytes(n_vocab) bytes. */
int sampler_survivors(const float *logits, int n_vocab, const dsf_sampler_params *p,
                      int32_t *ids, void *scratch);

#endif
