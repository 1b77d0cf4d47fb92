/* imatrix_collect.c: see imatrix_collect.h. The observer runs on the thread that issues each
 * product (the pool is idle then), so the accumulators need no lock; its work per product is
 * T x n_in multiply-adds, n_out times less than the product's. */
#include "convert/imatrix_collect.h"
#include "model/model.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[GGUF_MAX_NAME];
    const uint8_t *base;       /* the engine's view of matrix 0 */
    uint64_t span, mat_bytes;  /* bytes of all n_mat matrices in the view, of one */
    int64_t n_in, n_mat;
    float *sum2;               /* [n_mat][n_in]; NULL until a row arrives */
    float *counts;             /* [n_mat] */
} entry;

struct imatrix_collector {
    dsf_engine *e;
    entry *ent; /* sorted by base */
    int64_t n, unmapped;
};

/* The layer matrices and their GGUF names (model/weights.c binds them under these names). */
static const struct {
    size_t off;
    const char *name;
    int stacked; /* one view per expert: the view spans n_expert matrices */
} MATS[] = {
    {offsetof(dsf_layer, wq_a), "attn_q_a", 0},
    {offsetof(dsf_layer, wq_b), "attn_q_b", 0},
    {offsetof(dsf_layer, wkv), "attn_kv", 0},
    {offsetof(dsf_layer, wo_a), "attn_output_a", 0},
    {offsetof(dsf_layer, wo_b), "attn_output_b", 0},
    {offsetof(dsf_layer, hc_attn_fn), "hc_attn_fn", 0},
    {offsetof(dsf_layer, hc_ffn_fn), "hc_ffn_fn", 0},
    {offsetof(dsf_layer, comp_wkv), "attn_compressor_kv", 0},
    {offsetof(dsf_layer, comp_wgate), "attn_compressor_gate", 0},
    {offsetof(dsf_layer, idx_k), "indexer.attn_k", 0},
    {offsetof(dsf_layer, idx_q_b), "indexer.attn_q_b", 0},
    {offsetof(dsf_layer, idx_proj), "indexer.proj", 0},
    {offsetof(dsf_layer, engram_kv), "engram_kv", 0},
    {offsetof(dsf_layer, router), "ffn_gate_inp", 0},
    {offsetof(dsf_layer, gate_exps), "ffn_gate_exps", 1},
    {offsetof(dsf_layer, up_exps), "ffn_up_exps", 1},
    {offsetof(dsf_layer, down_exps), "ffn_down_exps", 1},
    {offsetof(dsf_layer, gate_sh), "ffn_gate_shexp", 0},
    {offsetof(dsf_layer, up_sh), "ffn_up_shexp", 0},
    {offsetof(dsf_layer, down_sh), "ffn_down_shexp", 0},
};
#define N_MATS (sizeof MATS / sizeof MATS[0])

/* Views lie in different mappings: they are ordered as addresses. */
static int cmp_base(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)((const entry *)a)->base, y = (uintptr_t)((const entry *)b)->base;
    return x < y ? -1 : x > y;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

/* The entry whose view holds p, or NULL. */
static entry *find(const imatrix_collector *c, const uint8_t *p) {
    const uintptr_t a = (uintptr_t)p;
    int64_t lo = 0, hi = c->n; /* the first entry with base > p is at hi */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)c->ent[mid].base <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    entry *x = &c->ent[lo - 1];
    return a - (uintptr_t)x->base < x->span ? x : NULL;
}

static void observe(void *user, const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T) {
    imatrix_collector *c = user;
    entry *m = find(c, w->data);
    if (!m || w->n_in != m->n_in) {
        c->unmapped++;
        return;
    }
    const int64_t k = (int64_t)((uint64_t)(w->data - m->base) / m->mat_bytes), n = m->n_in;
    if (!m->sum2) {
        m->sum2 = dsf_xcalloc((size_t)(m->n_mat * n), sizeof(float));
        m->counts = dsf_xcalloc((size_t)m->n_mat, sizeof(float));
    }
    float *s = m->sum2 + k * n;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) {
            const float v = x ? x[t * n + i] : bf16_to_f32(xb[t * n + i]);
            s[i] += v * v;
        }
    m->counts[k] += (float)T;
}

/* One layer matrix into the map (absent optional ones are skipped). */
static int add_mat(imatrix_collector *c, int64_t il, int j, char *err) {
    const dsf_engine *e = c->e;
    const dsf_wmat *w = (const dsf_wmat *)(const void *)((const char *)&e->w.layers[il] + MATS[j].off);
    if (!w->data || w->n_out <= 0) return 0;
    entry *m = &c->ent[c->n];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "blk.%lld.%s.weight", (long long)il, MATS[j].name);
    const gguf_tensor *t = gguf_find_tensor(e->gguf, m->name);
    if (!t) return dsf_seterr(err, "imatrix: weight '%s' is bound but not in the file", m->name);
    m->n_in = t->ne[0];
    m->n_mat = t->ne[2] * t->ne[3];
    m->base = w->data;
    m->span = (uint64_t)w->n_out * w->row_bytes * (uint64_t)(MATS[j].stacked ? e->shape.n_expert : 1);
    if (m->n_in != w->n_in) { /* a re-viewed attn_output_a whose file rows are not the groups' */
        dsf_log(1, "dsflash imatrix: %s: file rows of %lld columns, products of %lld: not collected", m->name,
                (long long)m->n_in, (long long)w->n_in);
        return 0;
    }
    if (m->n_mat < 1 || m->span % (uint64_t)m->n_mat)
        return dsf_seterr(err, "imatrix: %s: %lld matrices do not divide its %llu bytes", m->name, (long long)m->n_mat,
                          (unsigned long long)m->span);
    m->mat_bytes = m->span / (uint64_t)m->n_mat;
    c->n++;
    return 0;
}

imatrix_collector *imatrix_collector_new(dsf_engine *e, char *err) {
    imatrix_collector *c = dsf_xcalloc(1, sizeof *c);
    c->e = e;
    c->ent = dsf_xcalloc((size_t)(e->shape.n_layer * (int64_t)N_MATS) + 1, sizeof *c->ent);
    for (int64_t il = 0; il < e->shape.n_layer; il++)
        for (int j = 0; j < (int)N_MATS; j++)
            if (add_mat(c, il, j, err)) {
                imatrix_collector_free(c);
                return NULL;
            }
    qsort(c->ent, (size_t)c->n, sizeof *c->ent, cmp_base);
    for (int64_t i = 1; i < c->n; i++) /* views never overlap: each is its own tensor's bytes */
        DSF_ASSERT((uintptr_t)c->ent[i - 1].base + c->ent[i - 1].span <= (uintptr_t)c->ent[i].base);
    engine_set_mm_observer(e, observe, c);
    return c;
}

void imatrix_collector_free(imatrix_collector *c) {
    if (!c) return;
    if (c->e->mm_obs_user == c) engine_set_mm_observer(c->e, NULL, NULL);
    for (int64_t i = 0; i < c->n; i++) {
        free(c->ent[i].sum2);
        free(c->ent[i].counts);
    }
    free(c->ent);
    free(c);
}

int64_t imatrix_collector_count(const imatrix_collector *c) {
    int64_t n = 0;
    for (int64_t i = 0; i < c->n; i++) n += c->ent[i].sum2 != NULL;
    return n;
}

int64_t imatrix_collector_unmapped(const imatrix_collector *c) { return c->unmapped; }

/* The header: general.type, the meta keys, and the tensor pairs of the entries in names[]. */
static int write_header(gguf_writer *g, const entry *const *names, int64_t n, const imatrix_meta *m, char *err) {
    if (gguf_writer_kv_str(g, "general.type", "imatrix", err) ||
        (m->dataset && gguf_writer_kv_arr_str(g, "imatrix.datasets", &m->dataset, NULL, 1, err)) ||
        gguf_writer_kv_u32(g, "imatrix.chunk_count", m->chunk_count, err) ||
        gguf_writer_kv_u32(g, "imatrix.chunk_size", m->chunk_size, err))
        return -1;
    for (int64_t i = 0; i < n; i++) {
        char tn[GGUF_MAX_NAME + 16];
        const int64_t ne_s[2] = {names[i]->n_in, names[i]->n_mat}, ne_c[2] = {1, names[i]->n_mat};
        snprintf(tn, sizeof tn, "%s.in_sum2", names[i]->name);
        if (gguf_writer_tensor(g, tn, GGML_TYPE_F32, 2, ne_s, err)) return -1;
        snprintf(tn, sizeof tn, "%s.counts", names[i]->name);
        if (gguf_writer_tensor(g, tn, GGML_TYPE_F32, 2, ne_c, err)) return -1;
    }
    return 0;
}

int imatrix_collector_write(const imatrix_collector *c, const char *path, const imatrix_meta *m, char *err) {
    const entry **names = dsf_xcalloc((size_t)c->n + 1, sizeof *names);
    int64_t n = 0;
    for (int64_t i = 0; i < c->n; i++)
        if (c->ent[i].sum2) names[n++] = &c->ent[i];
    qsort(names, (size_t)n, sizeof *names, cmp_name); /* llama-imatrix writes in name order */
    gguf_writer *g = gguf_writer_new();
    int rc = write_header(g, names, n, m, err) || gguf_writer_begin(g, path, err) ? -1 : 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        const entry *x = names[i];
        if (gguf_writer_write(g, x->sum2, (uint64_t)(x->n_in * x->n_mat) * sizeof(float), err) ||
            gguf_writer_write(g, x->counts, (uint64_t)x->n_mat * sizeof(float), err))
            rc = -1;
    }
    if (!rc && gguf_writer_finish(g, err)) rc = -1;
    gguf_writer_free(g);
    free(names);
    return rc;
}
