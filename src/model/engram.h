/* engram.h: Engram n-gram memory (architecture.md §4.2), engram.c. Not a public interface. */
#ifndef DSF_ENGRAM_H
#define DSF_ENGRAM_H

#include "model/forward.h"

/* Adds layer il's gated Engram values into every hc copy of the stream sc->X (before the
 * block); the layer must have an Engram (sh->engram_of[il] >= 0). */
void engram_forward(const fwd *f, int64_t il);
/* Engram rows of one token (absolute per_layer_token_embd rows, [ple_cols]). */
void engram_hash(const dsf_shape *sh, int64_t e, const int32_t *tokens, int64_t p, int64_t *rows);

#endif
