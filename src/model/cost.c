/* cost.c: what a token costs in this model, from its tensor shapes: the weight bytes a
 * decoded token reads and the matmul FLOPs it does (`dsflash bench` divides them by the
 * measured times to get GB/s and GFLOP/s).
 *
 * Owns: the model arithmetic of those counts (which tensors a token reads in full, the
 * routed experts' top-k share, the table rows, the LM head's share, the indexer projections
 * that a position skips).
 * Must not: time or run anything (the caller measures), or change a value the engine
 * computes.
 * Invariant: the counts depend only on the file and the session's positions and sizes. */
#include "model/cost.h"
#include "model/attn.h"
#include "base/util.h"

#include <stdio.h>
#include <string.h>

/* Weight bytes and matmul FLOPs (2 x the weight elements) one decoded token touches, from the
 * tensor shapes: every per-layer weight and the LM head in full, n_used / n_expert of each
 * routed-expert tensor, one row of token_embd and one row per Engram column of
 * per_layer_token_embd. (indexer.attn_k is counted every token although ratio-2 layers apply
 * it every second token: < 0.01 %.) head_flops: the LM head's share of the FLOPs, which a
 * prefill spends on its last token only. Bytes are the file's (gguf.c's nbytes), so a native
 * file (docs/FORMAT.md) counts at its sizes: FP8_B32 one byte per weight plus its grid,
 * FP8_R264 264 bytes per 256-value Engram row. */
int cost_token(const char *path, double *bytes, double *flops, double *head_flops, char *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return -1;
    uint32_t n_expert = 0, n_used = 0;
    if (gguf_get_u32(f, "deepseek41.expert_count", &n_expert, err) != 0 ||
        gguf_get_u32(f, "deepseek41.expert_used_count", &n_used, err) != 0 || !n_expert) {
        gguf_close(f);
        return dsf_seterr(err, "%s: no deepseek41 expert_count/expert_used_count", path);
    }
    const gguf_kv *cols = gguf_find_kv(f, "deepseek41.ple.head_vocab_sizes");
    double b = 0, fl = 0, hf = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        double elems = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) elems *= (double)t->ne[d];
        double frac = 1;
        int matmul = t->n_dims >= 2;
        if (strstr(t->name, "_exps.weight")) frac = (double)n_used / n_expert;
        if (!strcmp(t->name, "token_embd.weight")) { frac = 1.0 / (double)t->ne[1]; matmul = 0; }
        if (!strcmp(t->name, "per_layer_token_embd.weight")) {
            frac = (cols ? (double)cols->arr_n : 0) / (double)t->ne[1];
            matmul = 0;
        }
        b += (double)t->nbytes * frac;
        if (matmul) fl += 2.0 * elems * frac;
        if (matmul && !strcmp(t->name, "output.weight")) hf += 2.0 * elems;
    }
    gguf_close(f);
    *bytes = b;
    *flops = fl;
    *head_flops = hf;
    return 0;
}

/* The indexer's query projections (idx_q_b, idx_proj) run only at the positions where a query
 * sees more compressed rows than it selects (attn_index_projects); cost_token counts
 * them for every token. il_bytes / il_flops get, per layer, what they add to a token that
 * computes them. */
void cost_index_proj(const dsf_engine *e, double *il_bytes, double *il_flops) {
    static const char *const fmt[2] = {"blk.%lld.indexer.attn_q_b.weight", "blk.%lld.indexer.proj.weight"};
    for (int64_t il = 0; il < e->shape.n_layer; il++) {
        il_bytes[il] = il_flops[il] = 0;
        for (int i = 0; i < 2; i++) {
            char name[96];
            snprintf(name, sizeof name, fmt[i], (long long)il);
            const gguf_tensor *t = gguf_find_tensor(e->gguf, name);
            if (!t) continue;
            double elems = 1;
            for (uint32_t d = 0; d < t->n_dims; d++) elems *= (double)t->ne[d];
            il_bytes[il] += (double)t->nbytes;
            il_flops[il] += 2.0 * elems;
        }
    }
}

/* v[il] summed over the layers whose projections a chunk ending at position p_last computes,
 * minus v summed over all layers (what cost_token counted). */
static double index_proj_adjust(const dsf_session *ss, const double *v, int64_t p_last) {
    const dsf_shape *sh = &ss->e->shape;
    double d = 0;
    for (int64_t il = 0; il < sh->n_layer; il++)
        if (!attn_index_projects(sh, il, p_last, ss->sc.ksel, ss->sc.kcand)) d -= v[il];
    return d;
}

double cost_prefill_flops(const dsf_session *ss, int n_prompt, double tok_flops, double head_flops,
                          const double *il_flops) {
    double prefill_flops = (tok_flops - head_flops) * n_prompt + head_flops;
    for (int64_t i = 0; i < n_prompt; i += ss->sc.max_chunk) {
        int64_t T = n_prompt - i < ss->sc.max_chunk ? n_prompt - i : ss->sc.max_chunk;
        prefill_flops += (double)T * index_proj_adjust(ss, il_flops, i + T - 1);
    }
    return prefill_flops;
}

double cost_decode_bytes(const dsf_session *ss, int64_t pos, double tok_bytes, const double *il_bytes) {
    return tok_bytes + index_proj_adjust(ss, il_bytes, pos);
}
