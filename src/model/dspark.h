/* dspark.h: the DSpark speculative draft of DeepSeek-V4.1 (dspark.md), the model layer's API:
 * loading a `dflash` GGUF against a main engine (dspark_load.c), the target features the main
 * forward records (dspark.md §3), the per-sequence draft state (the per-stage rings, §4.1) and
 * one draft call (§4.2: the stages, the shared head, the Markov chain, the confidence head).
 * Must not: hold the speculative loop (verification, acceptance: the runtime's), or sample with
 * the runtime's transforms (a draft call samples from softmax(l / tau) only).
 * Invariant: the rings hold only committed positions (dspark_seq_commit); a draft call changes
 * no state. */
#ifndef DSF_DSPARK_H
#define DSF_DSPARK_H

#include "dsflash.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct dsf_dspark dsf_dspark;         /* a loaded draft bound to its main engine */
typedef struct dsf_dspark_seq dsf_dspark_seq; /* one sequence's draft state and scratch */

typedef struct {
    int n_stages, block, n_targets, window, markov_rank;
    int32_t noise;          /* the block's filler token (tokenizer.ggml.mask_token_id) */
    const int32_t *targets; /* [n_targets] main layers, increasing */
    int64_t feat_dim;       /* n_targets * n_embd: one position's target feature */
} dsf_dspark_info;

/* dspark_load.c: opens a dflash file (gguf-layout.md §4) for the main engine `main` (which must
 * outlive it; the draft shares its token_embd and output and its thread pool, and follows its
 * numerics). Refuses a malformed file (keys, tensors, shapes, types) and a draft whose vocab,
 * width or target layers do not fit the main model, naming the mismatch. */
dsf_dspark *dspark_open(const char *path, dsf_engine *main, char *err);
void dspark_close(dsf_dspark *d);
void dspark_info(const dsf_dspark *d, dsf_dspark_info *out);

/* Target features (dspark.md §3) on a main-model session: from now on every forward records,
 * for each evaluated position p, the mean over the hc copies of the stream entering each of
 * the n layers (increasing order), as one row [n][n_embd]; off by default (no cost). The rows
 * live in a ring indexed by position (as the window KV), so a rollback needs nothing; n = 0
 * turns recording off. */
int dsf_session_set_features(dsf_session *s, const int32_t *layers, int n, char *err);
/* The feature row of position pos, or NULL when not recorded (consumed before recording was
 * turned on, restored from a snapshot) or no longer in the ring (pos must be < n_past; rows for
 * the last window + chunk + 1024 positions are kept, as the window KV: that many rows of
 * n_layers x n_embd floats per session, ~100 MB on the released model). */
const float *dsf_session_feature(const dsf_session *s, int pos);

/* dspark.c: one sequence's draft state: empty rings. */
dsf_dspark_seq *dspark_seq_new(dsf_dspark *d, char *err);
void dspark_seq_free(dsf_dspark_seq *q);
/* Writes every stage's ring entry of the committed positions pos0..pos0+n-1 from their target
 * features feat[n][feat_dim] (§4.1); positions must follow the rings' last one (or restart
 * them). Only the last `window` of them are computed. */
void dspark_seq_commit(dsf_dspark_seq *q, const float *feat, int64_t pos0, int64_t n);
/* The sequence was rolled back to n_past positions: ring entries at or above it are dropped. */
void dspark_seq_reset(dsf_dspark_seq *q, int64_t n_past);
/* The positions the rings hold, [*lo, *hi). */
void dspark_seq_range(const dsf_dspark_seq *q, int64_t *lo, int64_t *hi);

/* One draft call (§4.2) after the last committed position p with the anchor a: drafts the
 * block's B tokens (n <= B of them are returned: ids[0..n)), sequentially through the Markov
 * chain: argmax at tau = 0, else a sample of softmax(l_i / tau) drawn with *rng, on which the
 * next row's Markov term is conditioned. logits: NULL or [n][n_vocab] (l_i after the Markov
 * term); probs: NULL or [n][n_vocab] (softmax(l_i / tau), tau > 0 only); conf: NULL or [n] raw
 * confidence logits. The rings must hold positions max(0, p - window + 1)..p. Returns n or -1
 * with err. */
int dspark_draft(dsf_dspark_seq *q, int64_t p, int32_t anchor, int n, float tau, uint64_t *rng, int32_t *ids,
                 float *logits, float *probs, float *conf, char *err);

/* Debug/test view of the last draft call (round-0 intermediates of the goldens): the final
 * collapse xc [B][n_embd] and the head logits before the Markov term [B][n_vocab]. */
const float *dspark_last_xc(const dsf_dspark_seq *q);
const float *dspark_last_base(const dsf_dspark_seq *q);
/* The ring entry of stage s for position pos (NULL outside dspark_seq_range). */
const float *dspark_ring_entry(const dsf_dspark_seq *q, int s, int64_t pos);

#endif
