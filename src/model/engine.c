/* engine.c: the public engine and session API (include/dsflash.h): open a deepseek41 GGUF,
 * validate its shape, bind its weights, and run sessions: eval in chunks, exact rollback,
 * and versioned snapshots. */
#include "dsflash.h"
#include "model/forward.h"
#include "kernels/ops.h"
#include "kernels/mxfp4r.h"
#include "kernels/select.h"
#include "kernels/quant.h"
#include "model/session.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Tokens per forward of a prefill. 512 rather than 256: each routed expert then sees ~2x the
 * tokens per call (the MXFP4 panels are decoded once per 4 rows, K chunk and token chunk) and
 * each weight is read half as often; the bench model's 512-token prefill ran 4.4 % faster
 * (6 of 6 interleaved pairs in one process). Scratch grows with it (+0.2 GB per session on
 * the bench model). DSF_CHUNK overrides it. */
#define DSF_DEFAULT_CHUNK 512

void dsf_engine_params_default(dsf_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->numerics = DSF_NUMERICS_REFERENCE;
    p->n_threads = 0;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}
#define FNV_INIT 14695981039346656037ULL

/* Decode streams every weight once per token, with 4 far-apart row streams per thread: with
 * 4 KiB pages that is a TLB miss every 4 KiB per stream, and under a hypervisor (nested page
 * walks) it costs up to half of the bandwidth. MADV_HUGEPAGE makes the kernel read pages that
 * are not cached yet in 2 MiB folios and map them with PMDs (Linux >= 6.x, filesystems with
 * large folios; elsewhere it is a no-op). The tables read a row at a time at random (the token
 * embeddings, the Engram table) are excluded: a 2 MiB read per row would turn a cold table into
 * a disk storm (measured on the bench model: a cold token row cost 1.4 ms per decode step).
 * Their rows are read with pread (gguf_read_span). Failures are ignored (advice only). */
static void advise_pages(const gguf_file *g) {
    static const char *const random_rows[] = {"token_embd.weight", "per_layer_token_embd.weight"};
#ifdef MADV_HUGEPAGE
    madvise((void *)g->map, (size_t)g->size, MADV_HUGEPAGE);
#endif
    for (int i = 0; i < 2; i++) {
        const gguf_tensor *t = gguf_find_tensor(g, random_rows[i]);
        if (!t || !t->nbytes) continue;
#ifdef MADV_NOHUGEPAGE
        uintptr_t lo = (uintptr_t)t->data & ~(uintptr_t)4095, hi = ((uintptr_t)t->data + t->nbytes + 4095) & ~(uintptr_t)4095;
        madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
#endif
    }
}

/* ---- repacked experts --------------------------------------------------------------- */

enum { REPACK_MATS = 3 };
static dsf_wmat *repack_mat(dsf_engine *e, int64_t il, int m) {
    dsf_layer *L = &e->w.layers[il];
    return m == 0 ? &L->gate_exps : m == 1 ? &L->up_exps : &L->down_exps;
}

/* Stacked rows of a repackable expert tensor (0 if it is not one). */
static int64_t repack_rows(const dsf_engine *e, const dsf_wmat *w) {
    if (w->type != GGML_TYPE_MXFP4 || !w->data || !mxfp4r_row_bytes(w->n_in) || w->n_in > 16384) return 0;
    return w->n_out * e->shape.n_expert;
}

typedef struct {
    dsf_wmat *dst[64 * REPACK_MATS]; /* the engine's tensor */
    dsf_wmat src[64 * REPACK_MATS];  /* its MXFP4 copy with n_out = all stacked rows */
    uint8_t *codes[64 * REPACK_MATS], *scales[64 * REPACK_MATS];
    int64_t first[64 * REPACK_MATS + 1]; /* prefix sums of rows */
    int n;
} repack_job;

static void repack_range(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const repack_job *j = ctx;
    for (int i = 0; i < j->n && r0 < r1; i++) {
        int64_t a = r0 > j->first[i] ? r0 : j->first[i], b = r1 < j->first[i + 1] ? r1 : j->first[i + 1];
        if (a < b) mxfp4r_repack(&j->src[i], a - j->first[i], b - j->first[i], j->codes[i], j->scales[i]);
    }
}

/* The auto rule of repack and resident (dsflash.h): the part of the file still read plus the
 * copies fit in 80 % of RAM; the knob (DSF_REPACK, DSF_RESIDENT) overrides it. orig: the file
 * bytes the copies replace. */
static bool copy_wanted(const dsf_engine *e, int param, const char *knob, uint64_t bytes, uint64_t orig) {
    if (!bytes || param < 0) return false;
    if (param > 0) return true;
    const char *v = dsf_knob(knob);
    if (v && *v) return strcmp(v, "0") != 0;
    const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    const double kept = (double)e->gguf->size - (double)e->copied_orig - (double)orig;
    return ram > 0 && kept + (double)e->repack_size + (double)e->dense_size + (double)bytes <= 0.8 * ram;
}

static bool repack_wanted(const dsf_engine *e, const dsf_engine_params *p, uint64_t bytes, uint64_t orig) {
    if (e->numerics != DSF_NUMERICS_REFERENCE || !e->kern->mxfp4r_xbf16) return false;
    return copy_wanted(e, p->repack, "DSF_REPACK", bytes, orig);
}

/* Anonymous memory in 2 MiB pages for a copy of `what` (NULL, said, if it cannot be mapped:
 * the weights then stay in the file). Not MAP_NORESERVE: under the kernel's overcommit checks
 * a copy that cannot fit is refused here. */
static void *copy_map(uint64_t bytes, const char *what) {
    void *map = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        dsf_log(1, "dsflash: cannot map %.1f GB for %s; reading them from the file", bytes / 1e9, what);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(map, (size_t)bytes, MADV_HUGEPAGE);
#endif
    return map;
}

/* Unmaps the whole pages of [p, p + n) of the file mapping once a copy replaces them: they
 * leave the process's RSS (the page cache keeps them while the kernel has room), and a later
 * read would fault them in again, so nothing depends on their staying. Advice only. */
static void release_file_range(const uint8_t *p, uint64_t n) {
#ifdef MADV_DONTNEED
    const uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
#endif
}

/* A tensor's repacked bytes: its codes, then its scales padded to 64 bytes. */
static uint64_t repack_codes_bytes(const dsf_wmat *w) { return mxfp4r_row_bytes(w->n_in) * (uint64_t)w->n_out; }
static uint64_t repack_scales_bytes(const dsf_wmat *w) { return (repack_codes_bytes(w) / 16 + 63) / 64 * 64; }

/* Copies the routed experts into DSF_TYPE_MXFP4R (kernels.h) when repack_wanted says so;
 * the copy is anonymous memory in 2 MiB pages, filled by the pool. Failure to map it only
 * leaves the experts in the file. */
static void repack_experts(dsf_engine *e, const dsf_engine_params *p) {
    if (e->shape.n_expert <= 0) return;
    if (e->shape.n_layer > 64) { /* repack_job's arrays; V4.1-Flash has 43 */
        dsf_log(2, "dsflash: %lld layers: the routed experts are read from the file (repacking handles 64)",
                (long long)e->shape.n_layer);
        return;
    }
    repack_job *j = dsf_xcalloc(1, sizeof *j);
    uint64_t bytes = 0, orig = 0;
    for (int64_t il = 0; il < e->shape.n_layer; il++)
        for (int m = 0; m < REPACK_MATS; m++) {
            dsf_wmat *w = repack_mat(e, il, m);
            int64_t rows = repack_rows(e, w);
            if (!rows) continue;
            int i = j->n++;
            j->dst[i] = w;
            j->src[i] = *w;
            j->src[i].n_out = rows;
            j->first[i + 1] = j->first[i] + rows;
            bytes += repack_codes_bytes(&j->src[i]) + repack_scales_bytes(&j->src[i]);
            orig += (uint64_t)rows * w->row_bytes;
        }
    if (!repack_wanted(e, p, bytes, orig)) {
        free(j);
        return;
    }
    void *map = copy_map(bytes, "the repacked experts");
    if (!map) {
        free(j);
        return;
    }
    const double t0 = dsf_now();
    uint8_t *at = map;
    for (int i = 0; i < j->n; i++) {
        j->codes[i] = at;
        j->scales[i] = at + repack_codes_bytes(&j->src[i]);
        at = j->scales[i] + repack_scales_bytes(&j->src[i]);
    }
    dsf_parallel_for(e->pool, j->first[j->n], 256, repack_range, j);
    for (int i = 0; i < j->n; i++) {
        release_file_range(j->src[i].data, (uint64_t)j->src[i].n_out * j->src[i].row_bytes);
        *j->dst[i] = mxfp4r_view(j->dst[i], j->codes[i], j->scales[i]);
    }
    e->repack_map = map;
    e->repack_size = (size_t)bytes;
    e->copied_orig += orig;
    /* the time is mostly the first touch of fresh memory (kernel zeroing; under some
     * hypervisors well below 1 GB/s): say so when it is noticeable */
    const double dt = dsf_now() - t0;
    dsf_log(dt >= 1.0 ? 1 : 2, "dsflash: repacked the routed experts (%d tensors, %.2f GB) for the %s kernels in %.1f s "
            "(--no-repack or DSF_REPACK=0 reads them from the file)", j->n, bytes / 1e9, e->kern->name, dt);
    free(j);
}

/* ---- dense weights in memory ---------------------------------------------------------- */

/* Every matrix a token reads in full: all but the routed experts (repacked above, or read
 * from the file: a token reads top-k of them) and token_embd (a row per token). Returns the
 * count (at most cap). */
static int dense_mats(dsf_engine *e, dsf_wmat **m, int cap) {
    int n = 0;
#define DENSE(w)                                                                               \
    do {                                                                                       \
        if ((w).data && (w).n_out > 0 && n < cap) m[n++] = &(w);                               \
    } while (0)
    for (int64_t il = 0; il < e->shape.n_layer; il++) {
        dsf_layer *L = &e->w.layers[il];
        dsf_wmat *const all[17] = {&L->wq_a,     &L->wq_b,       &L->wkv,        &L->wo_a,    &L->wo_b,    &L->hc_attn_fn,
                                   &L->hc_ffn_fn, &L->comp_wkv,   &L->comp_wgate, &L->idx_k,   &L->idx_q_b, &L->idx_proj,
                                   &L->engram_kv, &L->router,     &L->gate_sh,    &L->up_sh,   &L->down_sh};
        for (int k = 0; k < 17; k++) DENSE(*all[k]);
    }
    DENSE(e->w.output);
#undef DENSE
    return n;
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t n;
} dense_job;

static void dense_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const dense_job *j = ctx;
    const uint64_t a = (uint64_t)i0 << 21, b = (uint64_t)i1 << 21 < j->n ? (uint64_t)i1 << 21 : j->n;
    memcpy(j->dst + a, j->src + a, (size_t)(b - a));
}

/* Copies the dense weights into one anonymous mapping in 2 MiB pages when copy_wanted says
 * so, a matrix at a time on the pool (each thread first-touches the pages it fills), and
 * unmaps each matrix's file pages once copied, so that RSS holds one copy. Decode reads the
 * copy faster on the bench host (docs/PERFORMANCE.md, item 41; why was not found). Failure
 * to map it leaves the weights in the file. */
static void resident_dense(dsf_engine *e, const dsf_engine_params *p) {
    const int cap = (int)(17 * e->shape.n_layer + 1);
    dsf_wmat **m = dsf_xcalloc((size_t)cap, sizeof *m);
    const int n = dense_mats(e, m, cap);
    uint64_t bytes = 0, orig = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t nb = (uint64_t)m[i]->n_out * m[i]->row_bytes;
        orig += nb;
        bytes += (nb + 63) / 64 * 64; /* each copy 64-byte aligned */
    }
    if (!copy_wanted(e, p->resident, "DSF_RESIDENT", bytes, orig)) {
        free(m);
        return;
    }
    void *map = copy_map(bytes, "the dense weights");
    if (!map) {
        free(m);
        return;
    }
    const double t0 = dsf_now();
    uint8_t *at = map;
    for (int i = 0; i < n; i++) {
        dense_job j = {m[i]->data, at, (uint64_t)m[i]->n_out * m[i]->row_bytes};
        dsf_parallel_for(e->pool, (int64_t)((j.n + (1u << 21) - 1) >> 21), 1, dense_range, &j);
        release_file_range(j.src, j.n);
        m[i]->data = at;
        at += (j.n + 63) / 64 * 64;
    }
    e->dense_map = map;
    e->dense_size = (size_t)bytes;
    e->copied_orig += orig;
    const double dt = dsf_now() - t0;
    dsf_log(dt >= 1.0 ? 1 : 2, "dsflash: copied the dense weights (%d matrices, %.2f GB) into memory in %.1f s (--mmap or "
            "DSF_RESIDENT=0 reads them from the file)", n, bytes / 1e9, dt);
    free(m);
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
    advise_pages(g);
    const int64_t half = e->shape.n_rot / 2;
    e->rope.freq_main = dsf_xmalloc((size_t)(half ? half : 1) * sizeof(float));
    e->rope.freq_compress = dsf_xmalloc((size_t)(half ? half : 1) * sizeof(float));
    op_rope_freqs(e->rope.freq_main, e->shape.n_rot, e->shape.rope_base, 0, 1, 0, 0, 0);
    op_rope_freqs(e->rope.freq_compress, e->shape.n_rot, e->shape.compress_rope_base, e->shape.yarn,
                  e->shape.yarn_factor, e->shape.yarn_orig_ctx, e->shape.yarn_beta_fast, e->shape.yarn_beta_slow);
    e->numerics = p->numerics;
    e->kern = kernels_get();
    int nt = p->n_threads;
    if (nt <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nt = n > 0 ? (int)n : 1;
    }
    e->pool = dsf_pool_new(nt);
    repack_experts(e, p);
    resident_dense(e, p);
    e->model_id = fnv1a(FNV_INIT, g->map, (size_t)g->data_offset);
    e->name = dsf_xstrdup(path);
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
    weights_free(&e->w, &e->shape);
    if (e->repack_map) munmap(e->repack_map, e->repack_size);
    if (e->dense_map) munmap(e->dense_map, e->dense_size);
    shape_free(&e->shape);
    free(e->rope.freq_main);
    free(e->rope.freq_compress);
    dsf_pool_free(e->pool);
    gguf_close(e->gguf);
    free(e->name);
    free(e);
}

int dsf_engine_n_vocab(const dsf_engine *e) { return (int)e->shape.n_vocab; }
size_t dsf_engine_repacked_bytes(const dsf_engine *e) { return e->repack_map ? e->repack_size : 0; }
size_t dsf_engine_resident_bytes(const dsf_engine *e) { return e->dense_map ? e->dense_size : 0; }
int dsf_engine_n_ctx_train(const dsf_engine *e) { return (int)e->shape.n_ctx_train; }

/* ---- sessions --------------------------------------------------------------------------- */

dsf_session *dsf_session_new(dsf_engine *e, int max_ctx, char *err) {
    const dsf_shape *sh = &e->shape;
    if (max_ctx <= 0) max_ctx = sh->n_ctx_train > 0 && sh->n_ctx_train < 4096 ? (int)sh->n_ctx_train : 4096;
    if (sh->n_ctx_train > 0 && max_ctx > sh->n_ctx_train)
        dsf_log(2, "dsflash: context %d exceeds the model's context_length %lld", max_ctx, (long long)sh->n_ctx_train);
    /* Refuse up front what would not fit in memory (STYLE: compute session memory first). */
    double per_tok = 4.0 + (double)sh->n_layer * (double)sh->head_dim * 4.0;
    for (int64_t il = 0; il < sh->n_layer; il++)
        if (sh->kv_src[il] == il) per_tok += (double)(sh->head_dim + sh->idx_dim) * 4.0 / (double)sh->ratio[il];
    double need = per_tok * (double)max_ctx;
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (ram > 0 && need > 0.8 * ram) {
        dsf_seterr(err, "a context of %d tokens needs %.1f GB of session state, more than this machine's memory "
                        "(%.1f GB) allows", max_ctx, need / 1e9, ram / 1e9);
        return NULL;
    }
    dsf_session *s = dsf_xcalloc(1, sizeof *s);
    s->e = e;
    int64_t chunk = DSF_DEFAULT_CHUNK;
    const char *kc = dsf_knob("DSF_CHUNK");
    if (kc && atoi(kc) > 0) chunk = atoi(kc);
    if (chunk > max_ctx) chunk = max_ctx;
    if (kv_init(&s->kv, &e->shape, max_ctx, chunk, &s->bytes, err) < 0) {
        free(s);
        return NULL;
    }
    if (scratch_init(&s->sc, &e->shape, chunk, max_ctx, &s->bytes) < 0) {
        kv_free(&s->kv, &e->shape);
        free(s);
        dsf_seterr(err, "out of memory allocating the forward scratch");
        return NULL;
    }
    return s;
}

void dsf_session_free(dsf_session *s) {
    if (!s) return;
    scratch_free(&s->sc);
    kv_free(&s->kv, &s->e->shape);
    free(s);
}

size_t dsf_session_bytes(const dsf_session *s) { return s->bytes; }
int dsf_session_n_past(const dsf_session *s) { return (int)s->kv.n; }
int dsf_session_max_ctx(const dsf_session *s) { return (int)s->kv.max_ctx; }
const int32_t *dsf_session_tokens(const dsf_session *s) { return s->kv.tokens; }

int dsf_session_eval(dsf_session *s, const int32_t *tokens, int n, float *logits, bool all_rows, char *err) {
    const int64_t V = s->e->shape.n_vocab;
    if (n < 1) return dsf_seterr(err, "no tokens to evaluate");
    if (s->kv.n + n > s->kv.max_ctx)
        return dsf_seterr(err, "context too long: %lld + %d tokens exceed the session's %lld", (long long)s->kv.n, n,
                          (long long)s->kv.max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dsf_seterr(err, "token %d at index %d is outside the vocabulary (0..%lld)", tokens[i], i,
                              (long long)V - 1);
    for (int64_t i = 0; i < n;) {
        int64_t T = n - i < s->sc.max_chunk ? n - i : s->sc.max_chunk;
        float *lg = NULL;
        if (logits && all_rows) lg = logits + i * V;
        else if (logits && i + T == n) lg = logits;
        forward_chunk(s, tokens + i, T, lg, all_rows);
        i += T;
    }
    return 0;
}

int dsf_batch_eval(dsf_session **ss, const int32_t *tokens, int n, float *logits, char *err) {
    if (n < 1) return dsf_seterr(err, "no tokens to evaluate");
    dsf_engine *e = ss[0]->e;
    const int64_t V = e->shape.n_vocab;
    dsf_session *own = ss[0];
    for (int i = 0; i < n; i++) {
        if (ss[i]->e != e) return dsf_seterr(err, "batch entry %d belongs to another engine", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return dsf_seterr(err, "batch entries %d and %d are the same session", j, i);
        if (ss[i]->kv.n + 1 > ss[i]->kv.max_ctx)
            return dsf_seterr(err, "context too long: session %d is full (%lld tokens)", i, (long long)ss[i]->kv.max_ctx);
        if (tokens[i] < 0 || tokens[i] >= V)
            return dsf_seterr(err, "token %d at index %d is outside the vocabulary (0..%lld)", tokens[i], i,
                              (long long)V - 1);
        if (ss[i]->kv.max_ctx > own->kv.max_ctx) own = ss[i];
    }
    /* the scratch of the participant with the largest context serves the whole batch */
    for (int i = 0; i < n;) {
        int64_t g = n - i < own->sc.max_chunk ? n - i : own->sc.max_chunk;
        for (int64_t k = 0; k < g; k++) own->sc.tkv[k] = &ss[i + k]->kv;
        forward_tokens(e, &own->sc, own->sc.tkv, tokens + i, g, logits ? logits + (size_t)i * (size_t)V : NULL, 0);
        i += (int)g;
    }
    return 0;
}

static int needs_carry(const dsf_shape *sh) {
    for (int64_t il = 0; il < sh->n_layer; il++)
        if (sh->kv_src[il] == il && sh->ratio[il] > 1) return 1;
    return 0;
}

int dsf_session_rollback(dsf_session *s, int n, char *err) {
    if (n < 0 || n > s->kv.n)
        return dsf_seterr(err, "cannot roll back to %d tokens: the session holds %lld", n, (long long)s->kv.n);
    dsf_kvstate *kv = &s->kv;
    /* spec §5.3: everything is indexed by position, so truncation is exact, except (a) the
     * ratio-2 compressor's pending token, recomputed by re-feeding that token, and (b) window
     * rows that the ring has already overwritten: then re-prefill from the token history
     * (exact: chunking never changes the result). */
    int64_t keep = n;
    if (needs_carry(&s->e->shape) && n % 2) keep = n - 1;
    int64_t need_lo = keep - s->e->shape.window + 1;
    if (need_lo < 0) need_lo = 0;
    if (need_lo < kv->win_lo) {
        keep = 0;
        kv->win_lo = 0;
    }
    kv->n = keep;
    for (int64_t i = keep; i < n;) {
        int64_t T = n - i < s->sc.max_chunk ? n - i : s->sc.max_chunk;
        forward_chunk(s, kv->tokens + i, T, NULL, 0);
        i += T;
    }
    return 0;
}

/* ---- snapshots ------------------------------------------------------------------------- */

/* Identifies the weights, not only the header: two files with the same keys and tensor
 * table but other weights must not accept each other's snapshots. Samples 3 x 64 bytes of
 * every tensor (start, middle, end), so it touches a few pages per tensor, once. */
static uint64_t data_id(dsf_engine *e) {
    uint64_t id = __atomic_load_n(&e->data_id, __ATOMIC_ACQUIRE);
    if (id) return id;
    uint64_t h = FNV_INIT;
    const gguf_file *g = e->gguf;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        uint64_t n = t->nbytes < 64 ? t->nbytes : 64;
        uint64_t offs[3] = {0, t->nbytes / 2 - (t->nbytes / 2 < n ? t->nbytes / 2 : n / 2), t->nbytes - n};
        for (int k = 0; k < 3; k++) h = fnv1a(h, t->data + offs[k], (size_t)n);
    }
    if (!h) h = 1;
    __atomic_store_n(&e->data_id, h, __ATOMIC_RELEASE);
    return h;
}

#define SNAP_MAGIC "DSFSNAP\0"
#define SNAP_VERSION 3u

typedef struct {
    char magic[8];
    uint32_t version, numerics;
    uint64_t model_id, data_id, n, n_layer, head_dim, idx_dim;
} snap_header;

int dsf_session_save(const dsf_session *s, uint8_t **out, size_t *len, char *err) {
    const dsf_shape *sh = &s->e->shape;
    const int64_t n = s->kv.n, dh = sh->head_dim, id = sh->idx_dim;
    dsf_buf b = {0};
    snap_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SNAP_MAGIC, 8);
    h.version = SNAP_VERSION;
    h.numerics = (uint32_t)s->e->numerics;
    h.model_id = s->e->model_id;
    h.data_id = data_id(s->e);
    h.n = (uint64_t)n;
    h.n_layer = (uint64_t)sh->n_layer;
    h.head_dim = (uint64_t)dh;
    h.idx_dim = (uint64_t)id;
    dsf_buf_append(&b, &h, sizeof h);
    dsf_buf_append(&b, s->kv.tokens, (size_t)n * sizeof(int32_t));
    /* the window rows the next token can see: positions [n - nw, n) */
    const int64_t nw = n < sh->window ? n : sh->window;
    for (int64_t il = 0; il < sh->n_layer; il++)
        for (int64_t p = n - nw; p < n; p++) dsf_buf_append(&b, kv_win(&s->kv, il, p, dh), (size_t)dh * sizeof(float));
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (sh->kv_src[il] != il) continue;
        int64_t rows = n / sh->ratio[il];
        dsf_buf_append(&b, s->kv.ckv[il], (size_t)(rows * dh) * sizeof(float));
        dsf_buf_append(&b, s->kv.ik[il], (size_t)(rows * id) * sizeof(float));
        if (sh->ratio[il] > 1 && n % sh->ratio[il]) dsf_buf_append(&b, s->kv.carry[il], (size_t)(2 * dh) * sizeof(float));
    }
    uint64_t sum = fnv1a(FNV_INIT, b.data, b.len);
    dsf_buf_append(&b, &sum, sizeof sum);
    (void)err;
    *out = b.data;
    *len = b.len;
    return 0;
}

typedef struct {
    const uint8_t *p;
    size_t left;
} rdr;

static int take_bytes(rdr *r, void *dst, size_t n) {
    if (n > r->left) return -1;
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

int dsf_session_restore(dsf_session *s, const uint8_t *data, size_t len, char *err) {
    const dsf_shape *sh = &s->e->shape;
    snap_header h;
    if (len < sizeof h + 8) return dsf_seterr(err, "snapshot truncated (%zu bytes)", len);
    memcpy(&h, data, sizeof h);
    if (memcmp(h.magic, SNAP_MAGIC, 8) != 0) return dsf_seterr(err, "not a dsflash session snapshot");
    if (h.version != SNAP_VERSION)
        return dsf_seterr(err, "snapshot version %u is not supported (want %u)", h.version, SNAP_VERSION);
    uint64_t sum;
    memcpy(&sum, data + len - 8, 8);
    if (fnv1a(FNV_INIT, data, len - 8) != sum) return dsf_seterr(err, "snapshot checksum mismatch (corrupted)");
    if (h.model_id != s->e->model_id || h.data_id != data_id(s->e) || h.n_layer != (uint64_t)sh->n_layer || h.head_dim != (uint64_t)sh->head_dim ||
        h.idx_dim != (uint64_t)sh->idx_dim)
        return dsf_seterr(err, "snapshot was made with a different model or shape");
    if (h.numerics != (uint32_t)s->e->numerics)
        return dsf_seterr(err, "snapshot was made in numerics mode %s, the engine runs %s",
                          h.numerics ? "plain" : "reference", s->e->numerics ? "plain" : "reference");
    if (h.n > (uint64_t)s->kv.max_ctx)
        return dsf_seterr(err, "snapshot holds %llu tokens; the session's context is %lld", (unsigned long long)h.n,
                          (long long)s->kv.max_ctx);
    const int64_t n = (int64_t)h.n, dh = sh->head_dim, id = sh->idx_dim;
    /* the whole layout is checked before anything is overwritten: a bad snapshot leaves
     * the session as it was */
    const int64_t nw = n < sh->window ? n : sh->window;
    uint64_t want = sizeof h + 8 + (uint64_t)n * sizeof(int32_t) + (uint64_t)(sh->n_layer * nw * dh) * sizeof(float);
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (sh->kv_src[il] != il) continue;
        int64_t rows = n / sh->ratio[il];
        want += (uint64_t)(rows * (dh + id)) * sizeof(float);
        if (sh->ratio[il] > 1 && n % sh->ratio[il]) want += (uint64_t)(2 * dh) * sizeof(float);
    }
    if (want != len) return dsf_seterr(err, "snapshot size %zu does not match its header (%llu)", len, (unsigned long long)want);
    for (int64_t i = 0; i < n; i++) {
        int32_t tk;
        memcpy(&tk, data + sizeof h + (size_t)i * sizeof tk, sizeof tk);
        if (tk < 0 || tk >= sh->n_vocab) return dsf_seterr(err, "snapshot holds an invalid token id %d", tk);
    }
    rdr r = {data + sizeof h, len - 8 - sizeof h};
    int bad = take_bytes(&r, s->kv.tokens, (size_t)n * sizeof(int32_t));
    for (int64_t il = 0; il < sh->n_layer && !bad; il++)
        for (int64_t p = n - nw; p < n && !bad; p++)
            bad |= take_bytes(&r, kv_win(&s->kv, il, p, dh), (size_t)dh * sizeof(float));
    for (int64_t il = 0; il < sh->n_layer && !bad; il++) {
        if (sh->kv_src[il] != il) continue;
        int64_t rows = n / sh->ratio[il];
        bad |= take_bytes(&r, s->kv.ckv[il], (size_t)(rows * dh) * sizeof(float));
        bad |= take_bytes(&r, s->kv.ik[il], (size_t)(rows * id) * sizeof(float));
        if (!bad && sh->ratio[il] > 1 && n % sh->ratio[il])
            bad |= take_bytes(&r, s->kv.carry[il], (size_t)(2 * dh) * sizeof(float));
    }
    DSF_ASSERT(!bad && r.left == 0);
    s->kv.n = n;
    s->kv.win_lo = n - nw; /* older window rows are not in the snapshot: a rollback past them re-prefills */
    return 0;
}

/* ---- describe (dsflash inspect) --------------------------------------------------------- */

void dsf_engine_describe(const dsf_engine *e, void (*emit)(void *ud, const char *line), void *ud) {
    const dsf_shape *sh = &e->shape;
    const gguf_file *g = e->gguf;
    char line[1024];
#define EMIT(...) (snprintf(line, sizeof line, __VA_ARGS__), emit(ud, line))
    EMIT("file: %s (GGUF v%u, %llu keys, %llu tensors, %llu bytes)", e->name, g->version,
         (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)g->size);
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
}
