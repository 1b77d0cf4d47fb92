/* engram.h: Engram n-gram memory (architecture.md §4.2), engram.c. Not a public interface. */
#ifndef DSF_ENGRAM_H
#define DSF_ENGRAM_H

#include "model/forward.h"

/* Starts the reads of the rows of every module applied before a layer in [l0, l1) for the
 * chunk f describes (forward_tokens calls it before the first layer: the rows depend only on
 * the tokens and positions). */
void engram_start(const fwd *f, int64_t l0, int64_t l1);
/* Adds layer il's gated Engram values into every hc copy of the stream sc->X (before the
 * block); the layer must have an Engram (sh->engram_of[il] >= 0). Waits for the module's rows
 * (starting their reads if engram_start did not). When a row cannot be read the stream is left
 * as it is and sc->ereq records why (engram_req_take_error): the forward's caller fails. */
void engram_forward(const fwd *f, int64_t il);
/* Engram rows of one token (absolute per_layer_token_embd rows, [ple_cols]). */
void engram_hash(const dsf_shape *sh, int64_t e, const int32_t *tokens, int64_t p, int64_t *rows);
/* The same with the history's image-span marks (vtype[q] != 0: position q is DEAD whatever its
 * id, vision.md §7; session.h); vtype NULL: all text. */
void engram_hash_spans(const dsf_shape *sh, int64_t e, const int32_t *tokens, const uint8_t *vtype, int64_t p,
                       int64_t *rows);

#endif
