/* tmodel.c: test-only random-weight deepseek41 GGUF builder (see tmodel.h).
 *
 * Owns: the parameter -> keys/tensors mapping of gguf-layout.md §2.3-§2.5 and §3.2, the edit
 * operations of the hook, and seeded weight generation.
 * Must not: depend on the engine's own shape code (the roles are derived here, from the
 * spec, so that a loader bug is not mirrored by the builder). */
#include "tmodel.h"

#include "dsflash.h"
#include "io/gguf.h"
#include "test.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "deepseek41"

/* ================================================================ numbers */

typedef struct {
    uint64_t s;
} tm_rng;

static uint64_t rng_next(tm_rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(tm_rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static double rng_normal(tm_rng *r) { /* Box-Muller */
    double u = rng_unit(r), v = rng_unit(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint64_t hash_name(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static uint16_t to_bf16(float f) { /* round to nearest even (values here are finite) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static bool is_prime(uint64_t n) {
    if (n < 2) return false;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return false;
    return true;
}

/* ================================================================ the model */

typedef struct {
    uint64_t u;
    int64_t i;
    double f;
} num;

static num num_u(uint64_t v) { return (num){v, (int64_t)v, (double)v}; }
static num num_i(int64_t v) { return (num){(uint64_t)v, v, (double)v}; }
static num num_f(double v) { return (num){(uint64_t)(int64_t)v, (int64_t)v, v}; }

typedef struct {
    char key[128];
    uint32_t type;     /* enum gguf_vtype */
    num v;             /* numeric scalars and BOOL */
    char *s;           /* STRING */
    uint32_t arr_type; /* ARRAY: numeric element type */
    uint64_t n;
    uint8_t *arr;
} tkv;

enum kind { K_DENSE, K_NORM, K_EMBED, K_SINK, K_BIAS, K_HC_BASE, K_HC_SCALE, K_OTHER };

typedef struct {
    char name[96];
    uint32_t type, n_dims;
    int64_t ne[4];
    enum kind kind;
    int64_t fan_in;
} tten;

struct tm_model {
    const tm_params *p;
    tkv *kv;
    int n_kv, cap_kv;
    tten *t;
    int n_t, cap_t;
};

static uint32_t vsize(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

static num get_elem(uint32_t t, const uint8_t *p) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: return num_u(p[0]);
    case GGUF_VT_INT8: return num_i((int8_t)p[0]);
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, p, 2); return num_u(x); }
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, p, 2); return num_i(x); }
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, p, 4); return num_u(x); }
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, p, 4); return num_i(x); }
    case GGUF_VT_FLOAT32: { float x; memcpy(&x, p, 4); return num_f(x); }
    case GGUF_VT_UINT64: { uint64_t x; memcpy(&x, p, 8); return num_u(x); }
    case GGUF_VT_INT64: { int64_t x; memcpy(&x, p, 8); return num_i(x); }
    case GGUF_VT_FLOAT64: { double x; memcpy(&x, p, 8); return num_f(x); }
    default: return num_u(0);
    }
}

static void put_elem(uint32_t t, uint8_t *p, num v) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: p[0] = (uint8_t)v.u; break;
    case GGUF_VT_INT8: p[0] = (uint8_t)(int8_t)v.i; break;
    case GGUF_VT_UINT16: { uint16_t x = (uint16_t)v.u; memcpy(p, &x, 2); break; }
    case GGUF_VT_INT16: { int16_t x = (int16_t)v.i; memcpy(p, &x, 2); break; }
    case GGUF_VT_UINT32: { uint32_t x = (uint32_t)v.u; memcpy(p, &x, 4); break; }
    case GGUF_VT_INT32: { int32_t x = (int32_t)v.i; memcpy(p, &x, 4); break; }
    case GGUF_VT_FLOAT32: { float x = (float)v.f; memcpy(p, &x, 4); break; }
    case GGUF_VT_UINT64: memcpy(p, &v.u, 8); break;
    case GGUF_VT_INT64: memcpy(p, &v.i, 8); break;
    case GGUF_VT_FLOAT64: memcpy(p, &v.f, 8); break;
    default: break;
    }
}

const char *tm_k(const char *suffix) {
    static char buf[8][128];
    static unsigned i;
    char *b = buf[i++ & 7];
    snprintf(b, sizeof buf[0], ARCH ".%s", suffix);
    return b;
}

static tkv *find_kv(const tm_model *m, const char *key) {
    for (int i = 0; i < m->n_kv; i++)
        if (!strcmp(m->kv[i].key, key)) return &m->kv[i];
    return NULL;
}

static void kv_clear(tkv *k) {
    free(k->s);
    free(k->arr);
    k->s = NULL;
    k->arr = NULL;
    k->n = 0;
}

/* The key's slot (existing, cleared; or appended). */
static tkv *kv_slot(tm_model *m, const char *key) {
    tkv *k = find_kv(m, key);
    if (k) {
        kv_clear(k);
        return k;
    }
    if (m->n_kv == m->cap_kv) {
        m->cap_kv = m->cap_kv ? 2 * m->cap_kv : 64;
        m->kv = realloc(m->kv, (size_t)m->cap_kv * sizeof *m->kv);
        if (!m->kv) abort();
    }
    k = &m->kv[m->n_kv++];
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", key);
    return k;
}

bool tm_has_key(const tm_model *m, const char *key) { return find_kv(m, key) != NULL; }

int tm_drop_key(tm_model *m, const char *key) {
    tkv *k = find_kv(m, key);
    if (!k) return -1;
    kv_clear(k);
    int i = (int)(k - m->kv);
    memmove(&m->kv[i], &m->kv[i + 1], (size_t)(m->n_kv - i - 1) * sizeof *m->kv);
    m->n_kv--;
    return 0;
}

static void set_num(tm_model *m, const char *key, uint32_t type, num v) {
    tkv *k = kv_slot(m, key);
    k->type = type;
    k->v = v;
}

void tm_set_u32(tm_model *m, const char *key, uint32_t v) { set_num(m, key, GGUF_VT_UINT32, num_u(v)); }
void tm_set_i32(tm_model *m, const char *key, int32_t v) { set_num(m, key, GGUF_VT_INT32, num_i(v)); }
void tm_set_u64(tm_model *m, const char *key, uint64_t v) { set_num(m, key, GGUF_VT_UINT64, num_u(v)); }
void tm_set_f32(tm_model *m, const char *key, float v) { set_num(m, key, GGUF_VT_FLOAT32, num_f(v)); }
void tm_set_bool(tm_model *m, const char *key, bool v) { set_num(m, key, GGUF_VT_BOOL, num_u(v ? 1 : 0)); }

void tm_set_str(tm_model *m, const char *key, const char *v) {
    tkv *k = kv_slot(m, key);
    k->type = GGUF_VT_STRING;
    k->s = strdup(v);
    if (!k->s) abort();
}

void tm_set_arr(tm_model *m, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    tkv *k = kv_slot(m, key);
    k->type = GGUF_VT_ARRAY;
    k->arr_type = elem_type;
    k->n = n;
    size_t nb = (size_t)n * vsize(elem_type);
    k->arr = malloc(nb ? nb : 1);
    if (!k->arr) abort();
    if (nb) memcpy(k->arr, data, nb);
}

void tm_set_arr_u32(tm_model *m, const char *key, const uint32_t *v, uint64_t n) {
    tm_set_arr(m, key, GGUF_VT_UINT32, v, n);
}

int tm_retype_key(tm_model *m, const char *key, uint32_t new_type) {
    tkv *k = find_kv(m, key);
    if (!k || !vsize(new_type)) return -1;
    if (k->type == GGUF_VT_ARRAY) {
        uint32_t es = vsize(k->arr_type), ns = vsize(new_type);
        if (!es) return -1;
        uint8_t *a = malloc((size_t)(k->n ? k->n : 1) * ns);
        if (!a) abort();
        for (uint64_t i = 0; i < k->n; i++) put_elem(new_type, a + i * ns, get_elem(k->arr_type, k->arr + i * es));
        free(k->arr);
        k->arr = a;
        k->arr_type = new_type;
        return 0;
    }
    if (!vsize(k->type)) return -1;
    k->type = new_type;
    return 0;
}

uint64_t tm_arr_len(const tm_model *m, const char *key) {
    const tkv *k = find_kv(m, key);
    return k && k->type == GGUF_VT_ARRAY ? k->n : 0;
}

int tm_arr_get(const tm_model *m, const char *key, uint64_t i, uint64_t *v) {
    const tkv *k = find_kv(m, key);
    if (!k || k->type != GGUF_VT_ARRAY || i >= k->n || !vsize(k->arr_type)) return -1;
    *v = get_elem(k->arr_type, k->arr + i * vsize(k->arr_type)).u;
    return 0;
}

int tm_arr_set(tm_model *m, const char *key, uint64_t i, uint64_t v) {
    tkv *k = find_kv(m, key);
    if (!k || k->type != GGUF_VT_ARRAY || i >= k->n || !vsize(k->arr_type)) return -1;
    num x = k->arr_type == GGUF_VT_FLOAT32 || k->arr_type == GGUF_VT_FLOAT64 ? num_f((double)v) : num_u(v);
    put_elem(k->arr_type, k->arr + i * vsize(k->arr_type), x);
    return 0;
}

int tm_arr_resize(tm_model *m, const char *key, uint64_t n) {
    tkv *k = find_kv(m, key);
    if (!k || k->type != GGUF_VT_ARRAY || !k->n || !vsize(k->arr_type)) return -1;
    uint32_t es = vsize(k->arr_type);
    uint8_t *a = malloc((size_t)(n ? n : 1) * es);
    if (!a) abort();
    for (uint64_t i = 0; i < n; i++) memcpy(a + i * es, k->arr + (i < k->n ? i : k->n - 1) * es, es);
    free(k->arr);
    k->arr = a;
    k->n = n;
    return 0;
}

static tten *find_t(const tm_model *m, const char *name) {
    for (int i = 0; i < m->n_t; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

bool tm_has_tensor(const tm_model *m, const char *name) { return find_t(m, name) != NULL; }

int tm_drop_tensor(tm_model *m, const char *name) {
    tten *t = find_t(m, name);
    if (!t) return -1;
    int i = (int)(t - m->t);
    memmove(&m->t[i], &m->t[i + 1], (size_t)(m->n_t - i - 1) * sizeof *m->t);
    m->n_t--;
    return 0;
}

static tten *add_t(tm_model *m, uint32_t type, enum kind kind, int64_t fan_in, uint32_t n_dims, const int64_t *ne,
                   const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static tten *add_t(tm_model *m, uint32_t type, enum kind kind, int64_t fan_in, uint32_t n_dims, const int64_t *ne,
                   const char *fmt, ...) {
    if (m->n_t == m->cap_t) {
        m->cap_t = m->cap_t ? 2 * m->cap_t : 128;
        m->t = realloc(m->t, (size_t)m->cap_t * sizeof *m->t);
        if (!m->t) abort();
    }
    tten *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->type = type;
    t->kind = kind;
    t->fan_in = fan_in > 0 ? fan_in : 1;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    return t;
}

void tm_add_tensor(tm_model *m, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne) {
    add_t(m, type, K_DENSE, ne[0], n_dims, ne, "%s", name);
}

int tm_reshape_tensor(tm_model *m, const char *name, uint32_t n_dims, const int64_t *ne) {
    tten *t = find_t(m, name);
    if (!t || n_dims < 1 || n_dims > 4) return -1;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    return 0;
}

int tm_retype_tensor(tm_model *m, const char *name, uint32_t type) {
    tten *t = find_t(m, name);
    if (!t) return -1;
    t->type = type;
    return 0;
}

static void model_free(tm_model *m) {
    for (int i = 0; i < m->n_kv; i++) kv_clear(&m->kv[i]);
    free(m->kv);
    free(m->t);
}

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

/* gguf-layout §2.5: the latest listed source at or before il, for layers with ratio > 0. */
static int latest(const tm_params *p, const uint32_t *src, int n, uint32_t il) {
    if (p->ratio[il] == 0) return -1;
    int s = -1;
    for (int i = 0; i < n; i++)
        if (src[i] <= il && (int)src[i] > s) s = (int)src[i];
    return s;
}

static bool listed(const uint32_t *v, int n, uint32_t x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

#define NE(...) ((const int64_t[]){__VA_ARGS__})

static void build(tm_model *m, const tm_params *p, uint64_t ple_rows) {
    const int64_t D = p->n_embd, H = p->n_head, dh = p->head_dim, E = p->n_expert, ff = p->n_ff;
    const int64_t mix = (int64_t)(2 + p->hc) * p->hc, hcd = (int64_t)p->hc * D;
    const uint32_t dt = p->dense_type, et = p->expert_type;
    const int64_t gin = H * dh / (p->o_groups ? p->o_groups : 1), orows = (int64_t)p->o_groups * p->o_lora;
    const int64_t fsh = ff * p->n_shared;
    if (p->n_engram) add_t(m, dt, K_EMBED, 0, 2, NE(p->engram_dim, (int64_t)ple_rows), "per_layer_token_embd.weight");
    add_t(m, dt, K_EMBED, 0, 2, NE(D, p->n_vocab), "token_embd.weight");
    add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(D), "output_norm.weight");
    add_t(m, dt, K_DENSE, D, 2, NE(D, p->n_vocab), "output.weight");
    for (uint32_t il = 0; il < p->n_layer; il++) {
        int kv = latest(p, p->kv_src, p->n_kv_src, il), ix = latest(p, p->idx_src, p->n_idx_src, il);
        add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(D), "blk.%u.attn_norm.weight", il);
        add_t(m, GGML_TYPE_F32, K_SINK, 0, 1, NE(H), "blk.%u.attn_sinks.weight", il);
        add_t(m, dt, K_DENSE, D, 2, NE(D, p->q_lora), "blk.%u.attn_q_a.weight", il);
        add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(p->q_lora), "blk.%u.attn_q_a_norm.weight", il);
        add_t(m, dt, K_DENSE, p->q_lora, 2, NE(p->q_lora, H * dh), "blk.%u.attn_q_b.weight", il);
        add_t(m, dt, K_DENSE, D, 2, NE(D, dh), "blk.%u.attn_kv.weight", il);
        add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(dh), "blk.%u.attn_kv_a_norm.weight", il);
        add_t(m, dt, K_DENSE, gin, 2, NE(gin, orows), "blk.%u.attn_output_a.weight", il);
        add_t(m, dt, K_DENSE, orows, 2, NE(orows, D), "blk.%u.attn_output_b.weight", il);
        add_t(m, GGML_TYPE_F32, K_DENSE, hcd, 2, NE(hcd, mix), "blk.%u.hc_attn_fn.weight", il);
        add_t(m, GGML_TYPE_F32, K_HC_BASE, 0, 1, NE(mix), "blk.%u.hc_attn_base.weight", il);
        add_t(m, GGML_TYPE_F32, K_HC_SCALE, 0, 1, NE(3), "blk.%u.hc_attn_scale.weight", il);
        add_t(m, GGML_TYPE_F32, K_DENSE, hcd, 2, NE(hcd, mix), "blk.%u.hc_ffn_fn.weight", il);
        add_t(m, GGML_TYPE_F32, K_HC_BASE, 0, 1, NE(mix), "blk.%u.hc_ffn_base.weight", il);
        add_t(m, GGML_TYPE_F32, K_HC_SCALE, 0, 1, NE(3), "blk.%u.hc_ffn_scale.weight", il);
        if (kv == (int)il) {
            add_t(m, dt, K_DENSE, D, 2, NE(D, dh), "blk.%u.attn_compressor_kv.weight", il);
            if (p->ratio[il] > 1) add_t(m, dt, K_DENSE, D, 2, NE(D, dh), "blk.%u.attn_compressor_gate.weight", il);
            add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(dh), "blk.%u.attn_compressor_norm.weight", il);
            add_t(m, dt, K_DENSE, dh, 2, NE(dh, p->idx_dim), "blk.%u.indexer.attn_k.weight", il);
            add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(p->idx_dim), "blk.%u.indexer.k_norm.weight", il);
        }
        if (ix == (int)il) {
            add_t(m, dt, K_DENSE, p->q_lora, 2, NE(p->q_lora, (int64_t)p->idx_heads * p->idx_dim),
                  "blk.%u.indexer.attn_q_b.weight", il);
            add_t(m, dt, K_DENSE, D, 2, NE(D, p->idx_heads), "blk.%u.indexer.proj.weight", il);
        }
        if (listed(p->engram, p->n_engram, il)) {
            int64_t w = (int64_t)(p->ngram - 1) * p->engram_heads * p->engram_dim;
            add_t(m, dt, K_DENSE, w, 2, NE(w, D * (p->hc + 1)), "blk.%u.engram_kv.weight", il);
            add_t(m, GGML_TYPE_F32, K_DENSE, D, 2, NE(D, p->hc), "blk.%u.engram_gate.weight", il);
        }
        add_t(m, GGML_TYPE_F32, K_DENSE, D, 2, NE(D, E), "blk.%u.ffn_gate_inp.weight", il);
        add_t(m, GGML_TYPE_F32, K_BIAS, 0, 1, NE(E), "blk.%u.exp_probs_b.bias", il);
        add_t(m, GGML_TYPE_F32, K_NORM, 0, 1, NE(D), "blk.%u.ffn_norm.weight", il);
        add_t(m, et, K_DENSE, D, 3, NE(D, ff, E), "blk.%u.ffn_gate_exps.weight", il);
        add_t(m, et, K_DENSE, ff, 3, NE(ff, D, E), "blk.%u.ffn_down_exps.weight", il);
        add_t(m, et, K_DENSE, D, 3, NE(D, ff, E), "blk.%u.ffn_up_exps.weight", il);
        add_t(m, dt, K_DENSE, D, 2, NE(D, fsh), "blk.%u.ffn_gate_shexp.weight", il);
        add_t(m, dt, K_DENSE, fsh, 2, NE(fsh, D), "blk.%u.ffn_down_shexp.weight", il);
        add_t(m, dt, K_DENSE, D, 2, NE(D, fsh), "blk.%u.ffn_up_shexp.weight", il);
    }
}

/* The keys of gguf-layout §2.3/§2.4 (no tokenizer: dsf_engine_open does not read it). */
static void build_keys(tm_model *m, const tm_params *p, const uint64_t *mult, const uint64_t *offs,
                       const uint64_t *sizes, const int32_t *tmap) {
    const uint32_t L = p->n_layer;
    tm_set_str(m, "general.architecture", ARCH);
    tm_set_str(m, "general.type", "model");
    tm_set_str(m, "general.name", "tmodel");
    tm_set_u32(m, tm_k("block_count"), L);
    tm_set_u32(m, tm_k("context_length"), p->n_ctx);
    tm_set_u32(m, tm_k("embedding_length"), p->n_embd);
    tm_set_u32(m, tm_k("attention.head_count"), p->n_head);
    tm_set_u32(m, tm_k("attention.head_count_kv"), 1);
    if (p->yarn) {
        tm_set_str(m, tm_k("rope.scaling.type"), "yarn");
        tm_set_f32(m, tm_k("rope.scaling.factor"), p->yarn_factor);
        tm_set_u32(m, tm_k("rope.scaling.original_context_length"), p->yarn_orig_ctx);
        tm_set_f32(m, tm_k("rope.scaling.yarn_beta_fast"), 32.0f);
        tm_set_f32(m, tm_k("rope.scaling.yarn_beta_slow"), 1.0f);
    }
    tm_set_f32(m, tm_k("rope.freq_base"), 10000.0f);
    tm_set_f32(m, tm_k("attention.layer_norm_rms_epsilon"), p->eps);
    tm_set_u32(m, tm_k("expert_count"), p->n_expert);
    tm_set_u32(m, tm_k("expert_used_count"), p->n_used);
    tm_set_u32(m, tm_k("expert_gating_func"), 4);
    tm_set_u32(m, tm_k("attention.key_length"), p->head_dim);
    tm_set_u32(m, tm_k("attention.value_length"), p->head_dim);
    tm_set_u32(m, "general.file_type", 38);
    tm_set_u32(m, tm_k("rope.dimension_count"), p->n_rot);
    tm_set_u32(m, tm_k("attention.q_lora_rank"), p->q_lora);
    tm_set_u32(m, tm_k("attention.sliding_window"), p->window);
    tm_set_u32(m, tm_k("expert_feed_forward_length"), p->n_ff);
    tm_set_u32(m, tm_k("expert_shared_count"), p->n_shared);
    tm_set_f32(m, tm_k("expert_weights_scale"), p->route_scale);
    tm_set_bool(m, tm_k("expert_weights_norm"), true);
    float clamp[TM_MAX_LAYERS];
    for (uint32_t i = 0; i < L && i < TM_MAX_LAYERS; i++) clamp[i] = p->swiglu;
    tm_set_arr(m, tm_k("swiglu_clamp_exp"), GGUF_VT_FLOAT32, clamp, L);
    tm_set_arr(m, tm_k("swiglu_clamp_shexp"), GGUF_VT_FLOAT32, clamp, L);
    tm_set_u32(m, tm_k("attention.indexer.head_count"), p->idx_heads);
    tm_set_u32(m, tm_k("attention.indexer.key_length"), p->idx_dim);
    tm_set_u32(m, tm_k("attention.indexer.top_k"), p->idx_topk);
    tm_set_u32(m, tm_k("attention.output_group_count"), p->o_groups);
    tm_set_u32(m, tm_k("attention.output_lora_rank"), p->o_lora);
    tm_set_arr(m, tm_k("attention.compress_ratios"), GGUF_VT_INT32, p->ratio,
               (uint64_t)(p->n_ratio ? p->n_ratio : (int)L));
    tm_set_f32(m, tm_k("attention.compress_rope_freq_base"), 160000.0f);
    tm_set_u32(m, tm_k("hyper_connection.count"), p->hc);
    tm_set_u32(m, tm_k("hyper_connection.sinkhorn_iterations"), p->sinkhorn);
    tm_set_f32(m, tm_k("hyper_connection.epsilon"), p->hc_eps);
    tm_set_u32(m, tm_k("hash_layer_count"), 0);
    tm_set_arr_u32(m, tm_k("attention.kv_source_layers"), p->kv_src, (uint64_t)p->n_kv_src);
    tm_set_arr_u32(m, tm_k("attention.indexer.source_layers"), p->idx_src, (uint64_t)p->n_idx_src);
    if (p->cand_src >= 0) {
        tm_set_i32(m, tm_k("attention.indexer.candidate_source_layer"), p->cand_src);
        tm_set_u32(m, tm_k("attention.indexer.candidate_top_k_blocks"), p->cand_blocks);
        tm_set_u32(m, tm_k("attention.indexer.candidate_block_size"), p->cand_block);
    }
    if (p->n_engram) {
        uint64_t ncol = (uint64_t)p->n_engram * (p->ngram - 1) * p->engram_heads;
        tm_set_arr_u32(m, tm_k("ple.layers"), p->engram, (uint64_t)p->n_engram);
        tm_set_u32(m, tm_k("ple.ngram_size"), p->ngram);
        tm_set_u32(m, tm_k("ple.heads_per_ngram"), p->engram_heads);
        tm_set_u32(m, tm_k("embedding_length_per_layer_input"), p->engram_dim);
        tm_set_arr(m, tm_k("ple.layer_multipliers"), GGUF_VT_UINT64, mult, (uint64_t)p->n_engram * p->ngram);
        tm_set_arr(m, tm_k("ple.head_offsets"), GGUF_VT_UINT64, offs, ncol);
        tm_set_arr(m, tm_k("ple.head_vocab_sizes"), GGUF_VT_UINT64, sizes, ncol);
        tm_set_u32(m, tm_k("engram.pad_token_id"), p->engram_pad);
        tm_set_arr(m, tm_k("engram.token_map"), GGUF_VT_INT32, tmap, p->n_token_map ? p->n_token_map : p->n_vocab);
    }
    tm_set_u32(m, "general.quantization_version", 2);
}

/* ---- tensor data ---- */

static int type_size(uint32_t type, uint32_t *blck, uint32_t *size) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_I32: *blck = 1; *size = 4; return 0;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_I16: *blck = 1; *size = 2; return 0;
    case GGML_TYPE_F64: case GGML_TYPE_I64: *blck = 1; *size = 8; return 0;
    case GGML_TYPE_I8: *blck = 1; *size = 1; return 0;
    case GGML_TYPE_Q4_0: *blck = 32; *size = 18; return 0;
    case GGML_TYPE_Q8_0: *blck = 32; *size = 34; return 0;
    case GGML_TYPE_MXFP4: *blck = 32; *size = 17; return 0;
    case GGML_TYPE_IQ2_XXS: *blck = 256; *size = 66; return 0;
    case GGML_TYPE_IQ2_XS: *blck = 256; *size = 74; return 0;
    case GGML_TYPE_Q4_K: *blck = 256; *size = 144; return 0;
    default: return -1;
    }
}

static double sample(const tten *t, tm_rng *r) {
    double g = rng_normal(r);
    switch (t->kind) {
    case K_DENSE: return g / sqrt((double)t->fan_in);
    case K_NORM: return 1.0 + 0.1 * g;
    case K_EMBED: return g;
    case K_SINK: return g;
    case K_BIAS: return 0.1 * g;
    case K_HC_BASE: return 0.5 * g;
    case K_HC_SCALE: return 0.3 + 0.1 * g;
    case K_OTHER: return g;
    }
    return g;
}

/* Fills the tensor's bytes. F32/BF16 from the kind's distribution; MXFP4 with random codes
 * and a scale giving std ~1/sqrt(fan_in) (E[kv^2] = 34.25 over the 16 doubled E2M1 codes of
 * gguf-layout §1.5, so 2^(e-128) * sqrt(34.25) = 1/sqrt(fan_in)); any other type random bytes
 * (only the loader looks at those). */
static void fill(const tten *t, uint64_t seed, uint8_t *dst, uint64_t nbytes) {
    tm_rng r = {hash_name(t->name, seed)};
    if (t->type == GGML_TYPE_F32) {
        for (uint64_t i = 0; i < nbytes / 4; i++) {
            float f = (float)sample(t, &r);
            memcpy(dst + 4 * i, &f, 4);
        }
    } else if (t->type == GGML_TYPE_BF16) {
        for (uint64_t i = 0; i < nbytes / 2; i++) {
            uint16_t h = to_bf16((float)sample(t, &r));
            memcpy(dst + 2 * i, &h, 2);
        }
    } else if (t->type == GGML_TYPE_MXFP4) {
        int e0 = (int)lround(128.0 - log2(sqrt(34.25 * (double)t->fan_in)));
        for (uint64_t b = 0; b < nbytes / 17; b++) {
            dst[b * 17] = (uint8_t)(e0 - 1 + (int)(rng_next(&r) % 3));
            for (int j = 0; j < 16; j++) dst[b * 17 + 1 + j] = (uint8_t)rng_next(&r);
        }
    } else {
        for (uint64_t i = 0; i < nbytes; i++) dst[i] = (uint8_t)rng_next(&r);
    }
}

static int tensor_nbytes(const tten *t, uint64_t *n, char *err) {
    uint32_t bs, ts;
    if (type_size(t->type, &bs, &ts) < 0) {
        snprintf(err, DSF_ERR_LEN, "tmodel: no size known for type %u of '%s'", t->type, t->name);
        return -1;
    }
    if (t->ne[0] % bs) {
        snprintf(err, DSF_ERR_LEN, "tmodel: '%s': ne0 %lld is not a multiple of %u", t->name, (long long)t->ne[0], bs);
        return -1;
    }
    uint64_t v = (uint64_t)t->ne[0] / bs * ts;
    for (int d = 1; d < 4; d++) v *= (uint64_t)t->ne[d];
    *n = v;
    return 0;
}

static int write_kv(gguf_writer *w, const tkv *k, char *err) {
    switch (k->type) {
    case GGUF_VT_STRING: return gguf_writer_kv_str(w, k->key, k->s, err);
    case GGUF_VT_ARRAY: return gguf_writer_kv_arr(w, k->key, k->arr_type, k->arr, k->n, err);
    default: {
        uint8_t le[8];
        if (!vsize(k->type)) {
            snprintf(err, DSF_ERR_LEN, "tmodel: key '%s': bad type %u", k->key, k->type);
            return -1;
        }
        put_elem(k->type, le, k->v);
        return gguf_writer_kv_scalar(w, k->key, k->type, le, err);
    }
    }
}

int tm_write(const tm_params *p, const char *path, tm_edit_fn edit, void *ud, char *err) {
    if (p->n_layer < 1 || p->n_layer > TM_MAX_LAYERS || (p->n_ratio && p->n_ratio < (int)p->n_layer) ||
        p->n_ratio > TM_MAX_LAYERS + 4 || p->n_engram > TM_MAX_LAYERS) {
        snprintf(err, DSF_ERR_LEN, "tmodel: layer counts outside what the builder supports");
        return -1;
    }
    tm_model m;
    memset(&m, 0, sizeof m);
    m.p = p;
    /* Engram constants (gguf-layout §2.4): one increasing run of primes >= engram_vocab over
     * all columns, absolute offsets = running sum, odd multipliers below
     * (INT64_MAX / n_compressed) / 2, token map into [0, n_compressed). */
    uint64_t ncol = p->n_engram ? (uint64_t)p->n_engram * (p->ngram > 1 ? p->ngram - 1 : 0) * p->engram_heads : 0;
    uint64_t nmult = (uint64_t)p->n_engram * p->ngram;
    uint32_t nmap = p->n_token_map ? p->n_token_map : p->n_vocab;
    uint64_t *offs = calloc(ncol + 1, 8), *sizes = calloc(ncol + 1, 8), *mult = calloc(nmult + 1, 8);
    int32_t *tmap = calloc(nmap + 1u, 4);
    if (!offs || !sizes || !mult || !tmap) abort();
    uint64_t rows = 0, cur = p->engram_vocab ? p->engram_vocab - 1 : 1;
    for (uint64_t c = 0; c < ncol; c++) {
        do cur++;
        while (!is_prime(cur));
        sizes[c] = cur;
        offs[c] = rows;
        rows += cur;
    }
    tm_rng r = {p->seed ^ 0xE6A3u};
    uint32_t ncomp = p->n_compressed ? p->n_compressed : 1;
    uint64_t bound = ((uint64_t)INT64_MAX / ncomp) / 2;
    for (uint64_t i = 0; i < nmult; i++) mult[i] = (rng_next(&r) % bound) * 2 + 1;
    for (uint32_t i = 0; i < nmap; i++) tmap[i] = (int32_t)(rng_next(&r) % ncomp);

    build_keys(&m, p, mult, offs, sizes, tmap);
    build(&m, p, rows);
    free(offs);
    free(sizes);
    free(mult);
    free(tmap);
    if (edit) edit(&m, ud);

    int rc = -1;
    uint8_t *buf = NULL;
    gguf_writer *w = gguf_writer_new();
    for (int i = 0; i < m.n_kv; i++)
        if (write_kv(w, &m.kv[i], err) < 0) goto done;
    for (int i = 0; i < m.n_t; i++)
        if (gguf_writer_tensor(w, m.t[i].name, m.t[i].type, m.t[i].n_dims, m.t[i].ne, err) < 0) goto done;
    if (gguf_writer_begin(w, path, err) < 0) goto done;
    for (int i = 0; i < m.n_t; i++) {
        uint64_t nb;
        if (tensor_nbytes(&m.t[i], &nb, err) < 0) goto done;
        buf = realloc(buf, nb ? nb : 1);
        if (!buf) abort();
        fill(&m.t[i], p->seed, buf, nb);
        if (gguf_writer_write(w, buf, nb, err) < 0) goto done;
    }
    if (gguf_writer_finish(w, err) < 0) goto done;
    rc = 0;
done:
    free(buf);
    gguf_writer_free(w);
    model_free(&m);
    return rc;
}

const char *tm_path(const char *stem) {
    static char buf[4][512];
    static unsigned n;
    char *b = buf[n & 3];
    snprintf(b, sizeof buf[0], "%s/%s-%u.gguf", test_tmpdir(), stem, n);
    n++;
    return b;
}
