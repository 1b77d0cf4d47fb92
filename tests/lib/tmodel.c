/* tmodel.c: the tests' models (see tmodel.h): default parameters, their mapping onto synth's,
 * and temporary paths.
 * Must not: build keys or tensors itself (synth does, src/convert/synth.c), or depend on the
 * engine's own shape code. */
#include "tmodel.h"

#include "dsflash.h"
#include "io/gguf.h"
#include "test.h"

#include <stdio.h>
#include <string.h>

/* ================================================================ defaults */

void tm_params_default(tm_params *p) {
    memset(p, 0, sizeof *p);
    p->seed = 41;
    p->n_layer = 6;
    p->n_embd = 64;
    p->n_head = 4;
    p->head_dim = 32;
    p->n_rot = 16;
    p->q_lora = 32;
    p->o_groups = 2;
    p->o_lora = 16;
    p->window = 8;
    p->n_vocab = 256;
    p->n_ctx = 4096;
    static const int32_t ratio[] = {0, 2, 2, 1, 1, 1, 0};
    p->n_ratio = 7;
    memcpy(p->ratio, ratio, sizeof ratio);
    p->n_kv_src = 2;
    p->kv_src[0] = 1;
    p->kv_src[1] = 3;
    p->n_idx_src = 3;
    p->idx_src[0] = 1;
    p->idx_src[1] = 3;
    p->idx_src[2] = 5;
    p->idx_heads = 4;
    p->idx_dim = 32;
    p->idx_topk = 4;
    p->cand_src = 3;
    p->cand_blocks = 2;
    p->cand_block = 4;
    p->hc = 4;
    p->sinkhorn = 20;
    p->hc_eps = 1e-6f;
    p->n_expert = 4;
    p->n_used = 2;
    p->n_ff = 32;
    p->n_shared = 1;
    p->route_scale = 1.5f;
    p->swiglu = 2.0f;
    p->eps = 1e-6f;
    p->n_engram = 2;
    p->engram[0] = 0;
    p->engram[1] = 4;
    p->ngram = 3;
    p->engram_heads = 2;
    p->engram_dim = 32;
    p->engram_vocab = 29;
    p->engram_pad = 2;
    p->n_token_map = 0;
    p->n_compressed = 200;
    p->yarn = true;
    p->yarn_factor = 4.0f;
    p->yarn_orig_ctx = 64;
    p->dense_type = GGML_TYPE_BF16;
    p->expert_type = GGML_TYPE_MXFP4;
}

/* ================================================================ build */

/* The synth parameters of p (tm_params names the same things as the tests know them). */
static void to_synth(const tm_params *p, synth_params *s) {
    memset(s, 0, sizeof *s);
    s->name = "tmodel";
    s->n_embd = p->n_embd;
    s->n_layer = p->n_layer;
    s->n_head = p->n_head;
    s->head_dim = p->head_dim;
    s->n_rot = p->n_rot;
    s->q_lora = p->q_lora;
    s->o_groups = p->o_groups;
    s->o_lora = p->o_lora;
    s->window = p->window;
    s->n_expert = p->n_expert;
    s->n_used = p->n_used;
    s->ff = p->n_ff;
    s->n_shared = p->n_shared;
    s->idx_heads = p->idx_heads;
    s->idx_dim = p->idx_dim;
    s->idx_topk = p->idx_topk;
    s->cand_layer = p->cand_src;
    s->cand_blocks = p->cand_blocks;
    s->cand_bsize = p->cand_block;
    s->hc = p->hc;
    s->sinkhorn = p->sinkhorn;
    s->hc_eps = p->hc_eps;
    s->ngram = p->ngram;
    s->heads_per_ngram = p->engram_heads;
    s->engram_dim = p->engram_dim;
    s->engram_vocab = p->engram_vocab;
    s->engram_pad = p->engram_pad;
    s->vocab = p->n_vocab;
    s->ctx = p->n_ctx;
    s->yarn = p->yarn;
    s->yarn_factor = p->yarn_factor;
    s->orig_ctx = p->yarn_orig_ctx;
    s->eps = p->eps;
    s->route_scale = p->route_scale;
    s->swiglu = p->swiglu;
    s->n_ratio = p->n_ratio;
    memcpy(s->ratios, p->ratio, sizeof s->ratios);
    s->n_kvsrc = p->n_kv_src;
    s->n_idxsrc = p->n_idx_src;
    s->n_engram = p->n_engram;
    memcpy(s->kvsrc, p->kv_src, sizeof s->kvsrc);
    memcpy(s->idxsrc, p->idx_src, sizeof s->idxsrc);
    memcpy(s->engram, p->engram, sizeof s->engram);
    s->dense_type = p->dense_type;
    s->expert_type = p->expert_type;
    s->tokenizer = false;
    s->n_token_map = p->n_token_map;
    s->n_compressed = p->n_compressed;
}

int tm_write(const tm_params *p, const char *path, tm_edit_fn edit, void *ud, char *err) {
    synth_params sp;
    to_synth(p, &sp);
    synth_model *m = synth_model_new(&sp, p->seed, err);
    if (!m) return -1;
    if (edit) edit(m, ud);
    int rc = synth_model_write(m, path, err);
    synth_model_free(m);
    return rc;
}

const char *tm_k(const char *suffix) {
    static char buf[8][128];
    static unsigned i;
    char *b = buf[i++ & 7];
    snprintf(b, sizeof buf[0], "deepseek41.%s", suffix);
    return b;
}

const char *tm_path(const char *stem) {
    static char buf[4][512];
    static unsigned n;
    char *b = buf[n & 3];
    snprintf(b, sizeof buf[0], "%s/%s-%u.gguf", test_tmpdir(), stem, n);
    n++;
    return b;
}
