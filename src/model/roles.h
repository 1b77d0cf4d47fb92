/* roles.h: the layer roles of gguf-layout §2.5 (rules S3-S8 of §6), derived once from the
 * compress ratios and the KV / index source lists. The loader (shape.c), the converter
 * (convert/convert.c) and the synthesizer (convert/synth.c) all derive them here.
 *
 * Errors go to err prefixed by `who` ("DeepSeek-V4.1 " for a GGUF, "config.json: " for a
 * checkpoint's config), so each caller keeps its own wording. */
#ifndef DSF_ROLES_H
#define DSF_ROLES_H

#include <stdint.h>

/* kv_src[il] / topk_src[il] for il < n_layer: the latest listed KV / index source at or
 * before il, for layers with ratio > 0, and -1 for ratio-0 layers. Checks, in this order:
 * every listed source < n_layer (S3); then layer by layer, a listed source has ratio > 0
 * (S4), and a layer with ratio > 0 has ratio <= 2 and a KV source and an index source at
 * or before it, the index source no older than the KV source, both with its ratio (S5).
 * Returns 0, or -1 with err set (kv_src and topk_src are then partly written). */
int roles_derive(const int32_t *ratio, int64_t n_layer, const uint32_t *kv, int64_t n_kv, const uint32_t *idx,
                 int64_t n_idx, int32_t *kv_src, int32_t *topk_src, const char *who, char *err);

/* The candidate stage's layers (S7-S8), on roles from roles_derive: the candidate source
 * cand (>= 0) is an index source of its own (topk_src[cand] == cand), the block size and
 * top-k blocks are > 0, and every later layer that is its own index source shares cand's
 * compress ratio. Returns 0, or -1 with err set. */
int roles_check_candidates(const int32_t *ratio, const int32_t *topk_src, int64_t n_layer, int64_t cand,
                           int64_t top_k_blocks, int64_t block_size, const char *who, char *err);

#endif
