/* roles.c: per-layer KV source and top-k source (gguf-layout §2.5), and the checks of §6
 * S3-S8 on them (see roles.h).
 *
 * Owns: the one derivation of the layer roles used by the loader, the converter and the
 * synthesizer.
 * Must not: read a file or allocate (callers pass the lists and own the outputs).
 * Invariant: for a ratio > 0 layer il, kv_src[il] <= topk_src[il] <= il, and both sources
 * are their own source with il's ratio. */
#include "model/roles.h"
#include "base/util.h"

#include <stdbool.h>

static bool in_list(const uint32_t *v, int64_t n, int64_t x) {
    for (int64_t i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

int roles_derive(const int32_t *ratio, int64_t n_layer, const uint32_t *kv, int64_t n_kv, const uint32_t *idx,
                 int64_t n_idx, int32_t *kv_src, int32_t *topk_src, const char *who, char *err) {
    for (int64_t i = 0; i < n_kv; i++)
        if (kv[i] >= n_layer)
            return dsf_seterr(err, "%skv source layer out of range (%u; %lld layers)", who, kv[i], (long long)n_layer);
    for (int64_t i = 0; i < n_idx; i++)
        if (idx[i] >= n_layer)
            return dsf_seterr(err, "%sindex source layer out of range (%u; %lld layers)", who, idx[i],
                              (long long)n_layer);
    int32_t last_kv = -1, last_idx = -1;
    for (int64_t il = 0; il < n_layer; il++) {
        const int32_t r = ratio[il];
        const bool is_kv = in_list(kv, n_kv, il), is_idx = in_list(idx, n_idx, il);
        kv_src[il] = topk_src[il] = -1;
        if ((is_kv || is_idx) && r == 0)
            return dsf_seterr(err, "%s%s source layer %lld has compress ratio 0", who, is_kv ? "kv" : "index",
                              (long long)il);
        if (is_kv) last_kv = (int32_t)il;
        if (is_idx) last_idx = (int32_t)il;
        if (r == 0) continue;
        if (r > 2 || last_kv < 0 || last_idx < last_kv || ratio[last_kv] != r || ratio[last_idx] != r)
            return dsf_seterr(err, "%slayer %lld: ratio %d without a matching kv/index source", who, (long long)il, r);
        kv_src[il] = last_kv;
        topk_src[il] = last_idx;
    }
    return 0;
}

int roles_check_candidates(const int32_t *ratio, const int32_t *topk_src, int64_t n_layer, int64_t cand,
                           int64_t top_k_blocks, int64_t block_size, const char *who, char *err) {
    if (cand >= n_layer || topk_src[cand] != cand || block_size <= 0 || top_k_blocks <= 0)
        return dsf_seterr(err, "%sinvalid candidate selection (source must be an index source, block size and top-k "
                               "blocks > 0)", who);
    for (int64_t il = cand + 1; il < n_layer; il++)
        if (topk_src[il] == il && ratio[il] != ratio[cand])
            return dsf_seterr(err, "%scandidate consumers must share the source's compress ratio (layer %lld)", who,
                              (long long)il);
    return 0;
}
