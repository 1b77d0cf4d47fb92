/* residency.c: where the weights live once the file is open: page advice on the mapping,
 * the routed experts repacked into DSF_TYPE_MXFP4R, and the dense weights copied into
 * anonymous memory (dsflash.h: repack, resident).
 *
 * Owns: the two anonymous mappings (e->repack_map, e->dense_map) and the auto rule that
 * decides them; the release of the file pages a copy replaces.
 * Must not: change a value (a copy holds the same bits, the repacked layout decodes to the
 * same operations: kernels_mxfp4r_same_bits), or fail the open (a copy that cannot be made
 * leaves the weights in the file).
 * Invariant: a dsf_wmat points either into the file mapping or into one of the copies;
 * the file bytes a copy replaces are counted in e->copied_orig; an FP8_B32 matrix's copy holds
 * its rows and its scale grid, contiguous as in the file, and its scales point into the copy. */
#include "model/residency.h"
#include "model/dist.h"
#include "kernels/mxfp4r.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Advises MADV_HUGEPAGE on the whole mapping: decode streams every weight once per token,
 * and 4 KiB pages cost a TLB miss (a nested page walk under a hypervisor) every 4 KiB per
 * stream (docs/perf-log.md, item 1). The tables read a row at a time at random (token
 * embeddings, the Engram table) are excluded: a 2 MiB read per row would turn a cold table
 * into a disk storm; their rows are read with pread (gguf_read_span; items 6 and 11).
 * Failures are ignored (advice only). */
void residency_advise_pages(const gguf_file *g) {
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
    int64_t lo[64 * REPACK_MATS];        /* the rows repacked: this rank's experts (model/dist.h) */
    int64_t first[64 * REPACK_MATS + 1]; /* prefix sums of the rows repacked */
    int n;
} repack_job;

static void repack_range(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const repack_job *j = ctx;
    for (int i = 0; i < j->n && r0 < r1; i++) {
        int64_t a = r0 > j->first[i] ? r0 : j->first[i], b = r1 < j->first[i + 1] ? r1 : j->first[i + 1];
        if (a < b) mxfp4r_repack(&j->src[i], j->lo[i] + a - j->first[i], j->lo[i] + b - j->first[i], j->codes[i], j->scales[i]);
    }
}

/* The file bytes this process reads through the mapping: every tensor but the two read a row
 * at a time with pread (the token embedding and the Engram table, 56 % of the released file),
 * and in an MPI job only its stage's tensors and its share of their experts. */
static double mapped_bytes(const dsf_engine *e) {
    if (e->dist) return dist_weight_bytes(e, e->dist);
    double b = 0;
    for (uint64_t i = 0; i < e->gguf->n_tensors; i++) {
        const tensor_class c = tensor_class_of(e->gguf->tensors[i].name);
        if (c != TC_EMBED && c != TC_ENGRAM) b += (double)e->gguf->tensors[i].nbytes;
    }
    return b;
}

/* The auto rule of repack and resident (dsflash.h): the part of the mapping still read plus
 * the copies fit in 80 % of RAM; the knob (DSF_REPACK, DSF_RESIDENT) overrides it. orig: the
 * file bytes the copies replace. */
static bool copy_wanted(const dsf_engine *e, int param, const char *knob, uint64_t bytes, uint64_t orig) {
    if (!bytes || param < 0) return false;
    if (param > 0) return true;
    const char *v = dsf_knob(knob);
    if (v && *v) return strcmp(v, "0") != 0;
    const double ram = dsf_ram_bytes();
    const double kept = mapped_bytes(e) - (double)e->copied_orig - (double)orig;
    return ram > 0 && kept + (double)e->repack_touched + (double)e->dense_size + (double)bytes <= 0.8 * ram;
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

/* Copies the routed experts into DSF_TYPE_MXFP4R (kernels/matmul.h) when repack_wanted says
 * so (docs/perf-log.md, item 8); the copy is anonymous memory in 2 MiB pages, filled by the
 * pool. Failure to map it only leaves the experts in the file. A rank of an MPI job repacks
 * only its layers' tensors, and of them only its experts' rows: the others' place in the
 * copy is never touched and takes no memory. */
void residency_repack_experts(dsf_engine *e, const dsf_engine_params *p) {
    if (e->shape.n_expert <= 0) return;
    if (e->shape.n_layer > 64) { /* repack_job's arrays; V4.1-Flash has 43 */
        dsf_log(2, "dsflash: %lld layers: the routed experts are read from the file (repacking handles 64)",
                (long long)e->shape.n_layer);
        return;
    }
    repack_job *j = dsf_xcalloc(1, sizeof *j);
    uint64_t bytes = 0, orig = 0, touched = 0;
    const dist_plan *d = e->dist;
    const int64_t e0 = d ? d->e0 : 0, e1 = d ? d->e1 : e->shape.n_expert;
    for (int64_t il = 0; il < e->shape.n_layer; il++)
        for (int m = 0; m < REPACK_MATS; m++) {
            dsf_wmat *w = repack_mat(e, il, m);
            int64_t rows = repack_rows(e, w);
            if (!rows || !dist_holds(d, il)) continue;
            int i = j->n++;
            j->dst[i] = w;
            j->src[i] = *w;
            j->src[i].n_out = rows;
            j->lo[i] = e0 * w->n_out;
            j->first[i + 1] = j->first[i] + (e1 - e0) * w->n_out;
            bytes += repack_codes_bytes(&j->src[i]) + repack_scales_bytes(&j->src[i]);
            touched += (repack_codes_bytes(&j->src[i]) + repack_scales_bytes(&j->src[i])) / (uint64_t)e->shape.n_expert *
                       (uint64_t)(e1 - e0);
            orig += (uint64_t)(e1 - e0) * (uint64_t)w->n_out * w->row_bytes;
        }
    if (!repack_wanted(e, p, touched, orig)) {
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
        release_file_range(j->src[i].data + (uint64_t)j->lo[i] * j->src[i].row_bytes,
                           (uint64_t)(j->first[i + 1] - j->first[i]) * j->src[i].row_bytes);
        *j->dst[i] = mxfp4r_view(j->dst[i], j->codes[i], j->scales[i]);
    }
    e->repack_map = map;
    e->repack_size = (size_t)bytes;
    e->repack_touched = (size_t)touched;
    e->copied_orig += orig;
    /* the time is mostly the first touch of fresh memory (kernel zeroing; under some
     * hypervisors well below 1 GB/s): say so when it is noticeable */
    const double dt = dsf_now() - t0;
    dsf_log(dt >= 1.0 ? 1 : 2, "dsflash: repacked the routed experts (%d tensors, %.2f GB) for the %s kernels in %.1f s "
            "(--no-repack or DSF_REPACK=0 reads them from the file)", j->n, touched / 1e9, e->kern->name, dt);
    free(j);
}

/* ---- dense weights in memory ---------------------------------------------------------- */

/* Every matrix a token reads in full from the file: all but the routed experts (repacked
 * above, or read from the file: a token reads top-k of them), token_embd (a row per token)
 * and the matrices weights.c already widened into memory of its own (the hc mixes of a
 * quantized file). Returns the count (at most cap). */
static int dense_mats(dsf_engine *e, dsf_wmat **m, int cap) {
    int n = 0;
    const uintptr_t lo = (uintptr_t)e->gguf->map, hi = lo + (uintptr_t)e->gguf->size;
#define DENSE(w)                                                                               \
    do {                                                                                       \
        if ((uintptr_t)(w).data >= lo && (uintptr_t)(w).data < hi && (w).n_out > 0 && n < cap) m[n++] = &(w); \
    } while (0)
    for (int64_t il = 0; il < e->shape.n_layer; il++) {
        if (!dist_holds(e->dist, il)) continue; /* another rank's layer (model/dist.h) */
        dsf_layer *L = &e->w.layers[il];
        dsf_wmat *const all[17] = {&L->wq_a,     &L->wq_b,       &L->wkv,        &L->wo_a,    &L->wo_b,    &L->hc_attn_fn,
                                   &L->hc_ffn_fn, &L->comp_wkv,   &L->comp_wgate, &L->idx_k,   &L->idx_q_b, &L->idx_proj,
                                   &L->engram_kv, &L->router,     &L->gate_sh,    &L->up_sh,   &L->down_sh};
        for (int k = 0; k < 17; k++) DENSE(*all[k]);
    }
    if (dist_is_head(e->dist)) DENSE(e->w.output);
#undef DENSE
    return n;
}

/* A dense matrix's bytes: its rows, and for FP8_B32 the scale grid that follows them. */
static uint64_t mat_bytes(const dsf_wmat *w) {
    return (uint64_t)w->n_out * w->row_bytes + dsf_type_extra_bytes(w->type, (uint64_t)w->n_in, (uint64_t)w->n_out);
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
 * copy faster on the bench host (docs/perf-log.md, item 41). Failure to map it leaves the
 * weights in the file. */
void residency_copy_dense(dsf_engine *e, const dsf_engine_params *p) {
    const int cap = (int)(17 * e->shape.n_layer + 1);
    dsf_wmat **m = dsf_xcalloc((size_t)cap, sizeof *m);
    const int n = dense_mats(e, m, cap);
    uint64_t bytes = 0, orig = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t nb = mat_bytes(m[i]);
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
        dense_job j = {m[i]->data, at, mat_bytes(m[i])};
        dsf_parallel_for(e->pool, (int64_t)((j.n + (1u << 21) - 1) >> 21), 1, dense_range, &j);
        release_file_range(j.src, j.n);
        m[i]->data = at;
        if (m[i]->type == DSF_TYPE_FP8B32) m[i]->scales = at + (uint64_t)m[i]->n_out * m[i]->row_bytes; /* grid follows */
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

void residency_free(dsf_engine *e) {
    if (e->repack_map) munmap(e->repack_map, e->repack_size);
    if (e->dense_map) munmap(e->dense_map, e->dense_size);
}
