/* attn.h: the attention of one layer (architecture.md §4.4), in three files: attn.c (the
 * RoPE tables, q LoRA and window KV, the attention core, the grouped output projection),
 * compressor.c (the compressed KV rows of source layers, §4.4.4) and indexer.c (the lightning
 * indexer, top-k and candidate blocks, §4.4.5-4.4.7). Not a public interface.
 * forward.c calls attn_forward only; bench counts work with attn_index_projects. The second
 * part is internal to the three files: keep it narrow. */
#ifndef DSF_ATTN_H
#define DSF_ATTN_H

#include "model/forward.h"
#include "kernels/vec.h"

/* out[T][n_embd] = attention of layer il over the normed input u[T][n_embd]; appends the
 * chunk's window rows (and, on a KV source layer, its compressed rows) to the sequences. */
void attn_forward(const fwd *f, int64_t il, const float *u, float *out);
/* Whether layer il's indexer computes its query projections (idx_q_b, idx_proj) for a chunk
 * whose last query sits at position p_last, with the session's ksel and kcand: only when a
 * query can see more compressed rows than it selects (or than the candidate stage keeps);
 * otherwise every visible row is selected and the projections are skipped (spec §4.4.5).
 * Layers that are no index source (or have ratio 0) never compute them. */
bool attn_index_projects(const dsf_shape *sh, int64_t il, int64_t p_last, int64_t ksel, int64_t kcand);

/* ---- internal to attn.c, compressor.c and indexer.c ----------------------------------- */

/* compressor.c: the compressor of KV source layer il (ratio 1 or 2) over the chunk's input
 * u[T][n_embd]: emits the compressed KV rows and index keys that the chunk completes, and
 * carries an incomplete group's first token to the next forward. */
void compressor_forward(const fwd *f, int64_t il, const float *u);
/* indexer.c: each token's selected compressed rows (sc->sel, sc->n_sel) and, on the
 * candidate source layer, its candidate blocks (sc->cand, sc->n_cand), from the q LoRA
 * output sc->qr and u; takes the layer's RoPE tables (sc->rcs, built by attn_forward). */
void indexer_forward(const fwd *f, int64_t il, const float *u);

/* The cos/sin table of the layer's frequencies at token t's position, sc->rcs + t * n_rot
 * (built once per layer by attn.c's rope_tables: every head of a token rotates by the same
 * angles). */
static inline const float *rope_cs(const fwd *f, int64_t t) { return f->sc->rcs + t * f->sh->n_rot; }

/* RoPE of n rows (stride apart) of token t with the layer's table. */
static inline void rope_rows(const fwd *f, float *x, int64_t n, int64_t stride, int64_t t, int inverse) {
    const int64_t nrot = f->sh->n_rot;
    for (int64_t i = 0; i < n; i++) ka_rope_apply(x + i * stride, nrot, rope_cs(f, t), inverse);
}

#endif
