/* engine.c: the public engine API (include/dsflash.h): open a deepseek41 GGUF, validate its
 * shape, bind its weights, place them (residency.c), describe it (dsflash inspect), close it.
 *
 * Owns: the engine's lifetime and the order of its opening steps; the RoPE frequency tables.
 * Must not: run the forward pass or hold session state (session.c, snapshot.c), or keep
 * anything of a failed open (every step's failure frees what the steps before built).
 * Invariant: after dsf_engine_open returns, e->shape and e->w are read-only. */
#include "dsflash.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/residency.h"
#include "model/session.h"
#include "model/dist.h"
#include "model/snapshot.h"
#include "model/engram_io.h"
#include "kernels/ops.h"
#include "kernels/mxfp4r.h"
#include "kernels/select.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dsf_engine_params_default(dsf_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->numerics = DSF_NUMERICS_REFERENCE;
    p->n_threads = 0;
}

void engine_set_mm_observer(dsf_engine *e, dsf_mm_observer fn, void *user) {
    e->mm_obs = fn;
    e->mm_obs_user = fn ? user : NULL;
}

/* The sessions' prefill chunk: p->ubatch, else DSF_CHUNK, else the automatic one (session.h). */
static int64_t engine_chunk(const dsf_shape *sh, const dsf_engine_params *p) {
    if (p->ubatch > 0) return p->ubatch;
    const char *kc = dsf_knob("DSF_CHUNK");
    if (kc && atoi(kc) > 0) return atoi(kc);
    return chunk_auto(sh, kv_pack_default(p->numerics == DSF_NUMERICS_REFERENCE), dsf_ram_bytes());
}

/* The Engram table's readers and cache (engram_io.h), sized by p (0: the defaults). */
static int open_engram_io(dsf_engine *e, const dsf_engine_params *p, char *err) {
    const gguf_tensor *ple = e->w.ple;
    const gguf_file *g = e->gguf;
    if (!ple || !ple->row_bytes || (g->fd < 0 && !ple->data))
        return dsf_seterr(err, "tensor 'per_layer_token_embd.weight': the Engram table is missing or empty");
    const int readers = p->engram_readers < 0 ? 0 : p->engram_readers ? p->engram_readers : ENGRAM_READERS_DEFAULT;
    const int64_t mb = p->engram_cache_mb < 0 ? 0 : p->engram_cache_mb ? p->engram_cache_mb : ENGRAM_CACHE_MB_DEFAULT;
    const uint64_t off = g->data_offset + ple->offset;
    e->eio = engram_io_new(g->fd, g->fd < 0 ? ple->data : NULL, off, ple->row_bytes, ple->ne[1], readers,
                           (uint64_t)mb << 20, err);
    return e->eio ? 0 : -1;
}

dsf_engine *dsf_engine_open(const char *path, const dsf_engine_params *p, char *err) {
    dsf_engine_params def;
    if (!p) {
        dsf_engine_params_default(&def);
        p = &def;
    }
    if (p->numerics != DSF_NUMERICS_REFERENCE && p->numerics != DSF_NUMERICS_PLAIN) {
        dsf_seterr(err, "unknown numerics mode %d", (int)p->numerics);
        return NULL;
    }
    if (p->ubatch < 0) {
        dsf_seterr(err, "bad ubatch %d (expected tokens per prefill forward, or 0 for auto)", p->ubatch);
        return NULL;
    }
    gguf_file *g = gguf_open(path, err);
    if (!g) return NULL;
    dsf_engine *e = dsf_xcalloc(1, sizeof *e);
    e->gguf = g;
    if (shape_load(&e->shape, g, err) < 0) goto fail;
    {
        const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
        if (!t) {
            dsf_seterr(err, "tensor 'token_embd.weight' not found");
            goto fail_shape;
        }
        e->shape.n_vocab = t->ne[1];
    }
    if (weights_bind(&e->w, &e->shape, g, err) < 0) goto fail_shape;
    if (dist_configured() && dist_attach(e, err) < 0) { /* an MPI job: this rank's part (dist.h) */
        weights_free(&e->w, &e->shape);
        goto fail_shape;
    }
    residency_advise_pages(g);
    const int64_t half = e->shape.n_rot / 2;
    e->rope.freq_main = dsf_xmalloc((size_t)(half ? half : 1) * sizeof(float));
    e->rope.freq_compress = dsf_xmalloc((size_t)(half ? half : 1) * sizeof(float));
    op_rope_freqs(e->rope.freq_main, e->shape.n_rot, e->shape.rope_base, 0, 1, 0, 0, 0);
    op_rope_freqs(e->rope.freq_compress, e->shape.n_rot, e->shape.compress_rope_base, e->shape.yarn,
                  e->shape.yarn_factor, e->shape.yarn_orig_ctx, e->shape.yarn_beta_fast, e->shape.yarn_beta_slow);
    e->numerics = p->numerics;
    e->chunk = engine_chunk(&e->shape, p);
    e->act_q8k = p->act_q8k;
    e->kern = kernels_get();
    int nt = p->n_threads;
    if (nt <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nt = n > 0 ? (int)n : 1;
    }
    e->pool = dsf_pool_new(nt);
    if (e->shape.n_engram && open_engram_io(e, p, err) < 0) {
        dsf_engine_close(e);
        return NULL;
    }
    residency_repack_experts(e, p);
    residency_copy_dense(e, p);
    e->model_id = snapshot_model_id(g);
    e->name = dsf_xstrdup(path);
    if (e->dist) e->dist_forward = dist_forward;
    if (e->dist && e->dist->rank > 0) { /* a follower: rank 0's ops until it closes the engine */
        const int rc = dist_follow(e);
        dsf_engine_close(e);
        comm_exit(rc, rc != 0);
    }
    return e;
fail_shape:
    shape_free(&e->shape);
fail:
    dsf_err_oneline(err); /* messages quote metadata strings from the file */
    gguf_close(g);
    free(e);
    return NULL;
}

void dsf_engine_close(dsf_engine *e) {
    if (!e) return;
    dist_op_quit(e); /* rank 0 of an MPI job: the other ranks end */
    dist_detach(e);
    engram_io_free(e->eio);
    weights_free(&e->w, &e->shape);
    residency_free(e);
    shape_free(&e->shape);
    free(e->rope.freq_main);
    free(e->rope.freq_compress);
    dsf_pool_free(e->pool);
    gguf_close(e->gguf);
    free(e->name);
    free(e);
}

int dsf_engine_n_vocab(const dsf_engine *e) { return (int)e->shape.n_vocab; }
size_t dsf_engine_repacked_bytes(const dsf_engine *e) { return e->repack_map ? e->repack_touched : 0; }
size_t dsf_engine_resident_bytes(const dsf_engine *e) { return e->dense_map ? e->dense_size : 0; }
int dsf_engine_n_ctx_train(const dsf_engine *e) { return (int)e->shape.n_ctx_train; }
int dsf_engine_ubatch(const dsf_engine *e) { return (int)e->chunk; }

/* ---- describe (dsflash inspect) --------------------------------------------------------- */

/* The bytes each type takes (tensors, bytes, share of the file), then the types each tensor
 * class uses (model.h's tensor_class): what a quantized file's recipe put where. */
enum { TYPE_SLOTS = GGML_TYPE_COUNT + 2 }; /* the ggml types, then dsflash's two native types */
static int type_slot(uint32_t type) { return type < GGML_TYPE_COUNT ? (int)type : GGML_TYPE_COUNT + (int)(type - DSF_TYPE_FP8B32); }
static uint32_t slot_type(int ty) { return ty < GGML_TYPE_COUNT ? (uint32_t)ty : DSF_TYPE_FP8B32 + (uint32_t)(ty - GGML_TYPE_COUNT); }

static void describe_types(const gguf_file *g, void (*emit)(void *ud, const char *line), void *ud) {
    uint64_t n[TC_COUNT + 1][TYPE_SLOTS] = {{0}}, bytes[TC_COUNT + 1][TYPE_SLOTS] = {{0}}; /* TC_COUNT: all */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const int c = (int)tensor_class_of(t->name), ty = type_slot(t->type); /* a bound file: known types only */
        n[c][ty]++;
        n[TC_COUNT][ty]++;
        bytes[c][ty] += t->nbytes;
        bytes[TC_COUNT][ty] += t->nbytes;
    }
    char line[1024];
#define EMIT(...) (snprintf(line, sizeof line, __VA_ARGS__), emit(ud, line))
    EMIT("== bytes by type ==");
    EMIT("  %-8s %8s %16s %7s", "type", "tensors", "bytes", "share");
    for (int ty = 0; ty < TYPE_SLOTS; ty++)
        if (n[TC_COUNT][ty])
            EMIT("  %-8s %8llu %16llu %6.2f%%", ggml_type_name(slot_type(ty)), (unsigned long long)n[TC_COUNT][ty],
                 (unsigned long long)bytes[TC_COUNT][ty], 100.0 * (double)bytes[TC_COUNT][ty] / (double)g->size);
    EMIT("== types by tensor class ==");
    for (int c = 0; c < TC_COUNT; c++) {
        uint64_t nt = 0, nb = 0;
        int o = 0;
        char types[512] = "";
        for (int ty = 0; ty < TYPE_SLOTS; ty++) {
            if (!n[c][ty]) continue;
            nt += n[c][ty];
            nb += bytes[c][ty];
            if (o >= 0 && (size_t)o < sizeof types)
                o += snprintf(types + o, sizeof types - (size_t)o, "%s%s x%llu", o ? ", " : "",
                              ggml_type_name(slot_type(ty)), (unsigned long long)n[c][ty]);
        }
        if (nt)
            EMIT("  %-18s %5llu tensors %16llu bytes %6.2f%%  %s", tensor_class_names[c], (unsigned long long)nt,
                 (unsigned long long)nb, 100.0 * (double)nb / (double)g->size, types);
    }
#undef EMIT
}

void dsf_engine_describe(const dsf_engine *e, void (*emit)(void *ud, const char *line), void *ud) {
    const dsf_shape *sh = &e->shape;
    const gguf_file *g = e->gguf;
    char line[1024];
#define EMIT(...) (snprintf(line, sizeof line, __VA_ARGS__), emit(ud, line))
    EMIT("file: %s (GGUF v%u, %llu keys, %llu tensors, %llu bytes)", e->name, g->version,
         (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)g->size);
    model_native_t nat;
    if (model_native(g, &nat, line) == 0) model_native_describe(&nat, emit, ud); /* the open checked it */
    EMIT("== metadata ==");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        switch (kv->type) {
        case GGUF_VT_STRING:
            EMIT("  %-56s str    %.*s", kv->key, kv->str.len > 80 ? 80 : (int)kv->str.len, kv->str.ptr);
            break;
        case GGUF_VT_ARRAY:
            EMIT("  %-56s array  %s[%llu]", kv->key, gguf_vtype_name(kv->arr_type), (unsigned long long)kv->arr_n);
            break;
        case GGUF_VT_FLOAT32:
        case GGUF_VT_FLOAT64: EMIT("  %-56s %-6s %g", kv->key, gguf_vtype_name(kv->type), kv->f); break;
        case GGUF_VT_INT8:
        case GGUF_VT_INT16:
        case GGUF_VT_INT32:
        case GGUF_VT_INT64: EMIT("  %-56s %-6s %lld", kv->key, gguf_vtype_name(kv->type), (long long)kv->i); break;
        default: EMIT("  %-56s %-6s %llu", kv->key, gguf_vtype_name(kv->type), (unsigned long long)kv->u); break;
        }
    }
    EMIT("== shape ==");
    EMIT("  vocab %lld, hidden %lld, layers %lld, heads %lld x %lld (rope %lld), q_lora %lld, o_groups %lld x %lld",
         (long long)sh->n_vocab, (long long)sh->n_embd, (long long)sh->n_layer, (long long)sh->n_head,
         (long long)sh->head_dim, (long long)sh->n_rot, (long long)sh->q_lora, (long long)sh->o_groups,
         (long long)sh->o_lora);
    EMIT("  window %lld, experts %lld (top %lld, ff %lld, shared %lld), indexer %lld x %lld top-k %lld, hc %lld",
         (long long)sh->window, (long long)sh->n_expert, (long long)sh->n_expert_used, (long long)sh->n_ff_exp,
         (long long)sh->n_expert_shared, (long long)sh->idx_heads, (long long)sh->idx_dim, (long long)sh->idx_topk,
         (long long)sh->hc);
    if (sh->cand_src >= 0)
        EMIT("  candidates: source layer %d, %lld blocks of %lld rows", sh->cand_src, (long long)sh->cand_topk_blocks,
             (long long)sh->cand_block);
    EMIT("  prefill chunk %lld tokens (%.1f per routed expert on average)", (long long)e->chunk,
         sh->n_expert > 0 ? (double)e->chunk * (double)sh->n_expert_used / (double)sh->n_expert : 0.0);
    if (e->repack_map)
        EMIT("  routed experts: repacked in memory for the %s kernels (%.2f GB; DSF_REPACK=0 keeps them in the file)",
             e->kern->name, (double)e->repack_size / 1e9);
    if (e->dense_map)
        EMIT("  dense weights: copied into memory (%.2f GB; DSF_RESIDENT=0 reads them from the file)",
             (double)e->dense_size / 1e9);
    EMIT("== layer roles ==");
    EMIT("  %5s %5s %8s %9s %10s %-22s %s", "layer", "ratio", "rope", "kv_src", "topk_src", "candidate", "engram");
    for (int64_t il = 0; il < sh->n_layer; il++) {
        const char *cand = "-";
        if (sh->cand_src >= 0 && il == sh->cand_src) cand = "publishes";
        else if (sh->cand_src >= 0 && il > sh->cand_src && sh->topk_src[il] == il) cand = "restricted";
        char kvs[32], tks[32], eg[48];
        if (sh->kv_src[il] < 0) snprintf(kvs, sizeof kvs, "-");
        else snprintf(kvs, sizeof kvs, "%d%s", sh->kv_src[il], sh->kv_src[il] == il ? " (own)" : "");
        if (sh->topk_src[il] < 0) snprintf(tks, sizeof tks, "-");
        else snprintf(tks, sizeof tks, "%d%s", sh->topk_src[il], sh->topk_src[il] == il ? " (own)" : "");
        if (sh->engram_of[il] >= 0) snprintf(eg, sizeof eg, "module %d (before block)", sh->engram_of[il]);
        else snprintf(eg, sizeof eg, "-");
        EMIT("  %5lld %5d %8s %9s %10s %-22s %s", (long long)il, sh->ratio[il], sh->ratio[il] ? "compress" : "main",
             kvs, tks, cand, eg);
    }
    EMIT("== tensors ==");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char dims[96];
        int o = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += snprintf(dims + o, sizeof dims - (size_t)o, d ? ", %lld" : "%lld", (long long)t->ne[d]);
        EMIT("  %-44s %-6s {%s} %llu bytes", t->name, ggml_type_name(t->type), dims, (unsigned long long)t->nbytes);
    }
#undef EMIT
    describe_types(g, emit, ud);
}
