/* synth_model.c: the synthetic model between its layout and its file (see synth.h): the
 * ordered key list and tensor list, the edit operations on them, and the writer that
 * generates every tensor's data while streaming it.
 *
 * Owns: the value representation of keys (numeric scalars, strings, numeric and string
 * arrays), the value distributions, and the seeded generation of tensor data.
 * Must not: know the model's topology (synth.c lays it out), or hold tensor data (it is
 * generated in 1 MiB chunks).
 * Invariant: a tensor's data is a function of (seed, name, type, distribution) only, in
 * element order; keys are written in list order, tensors in list order. */
#include "convert/synth_impl.h"
#include "convert/quantize_model.h"
#include "io/gguf.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    uint32_t arr_type; /* ARRAY: element type (numeric, or STRING) */
    uint64_t n;
    uint8_t *arr;      /* numeric elements */
    char **strs;       /* string elements, NUL-terminated */
    uint64_t *lens;
} skv;

typedef struct {
    char name[GGUF_MAX_NAME];
    uint32_t type, n_dims;
    int64_t ne[4];
    enum synth_kind kind;
    int64_t fan_in;    /* K_DENSE: std 1/sqrt(fan_in); MXFP4: the scale's target */
} stensor;

struct synth_model {
    uint64_t seed;
    skv *kv;
    int n_kv, cap_kv;
    stensor *t;
    int n_t, cap_t;
    synth_head_fn head; /* keys written before kv[] (NULL: none) */
    const void *head_ctx;
    bool fp8_exact;     /* synth_fp8_exact: the FP8-role weights are FP8-exact */
};

synth_model *synth_model_alloc(uint64_t seed) {
    synth_model *m = dsf_xcalloc(1, sizeof *m);
    m->seed = seed;
    return m;
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

/* ================================================================ keys */

static skv *find_kv(const synth_model *m, const char *key) {
    for (int i = 0; i < m->n_kv; i++)
        if (!strcmp(m->kv[i].key, key)) return &m->kv[i];
    return NULL;
}

static void kv_clear(skv *k) {
    free(k->s);
    free(k->arr);
    for (uint64_t i = 0; k->strs && i < k->n; i++) free(k->strs[i]);
    free(k->strs);
    free(k->lens);
    k->s = NULL;
    k->arr = NULL;
    k->strs = NULL;
    k->lens = NULL;
    k->n = 0;
}

/* The key's slot (existing, cleared; or appended). */
static skv *kv_slot(synth_model *m, const char *key) {
    skv *k = find_kv(m, key);
    if (k) {
        kv_clear(k);
        return k;
    }
    if (m->n_kv == m->cap_kv) {
        m->cap_kv = m->cap_kv ? 2 * m->cap_kv : 64;
        m->kv = dsf_xrealloc(m->kv, (size_t)m->cap_kv * sizeof *m->kv);
    }
    k = &m->kv[m->n_kv++];
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", key);
    return k;
}

int synth_drop_key(synth_model *m, const char *key) {
    skv *k = find_kv(m, key);
    if (!k) return -1;
    kv_clear(k);
    int i = (int)(k - m->kv);
    memmove(&m->kv[i], &m->kv[i + 1], (size_t)(m->n_kv - i - 1) * sizeof *m->kv);
    m->n_kv--;
    return 0;
}

static void set_num(synth_model *m, const char *key, uint32_t type, num v) {
    skv *k = kv_slot(m, key);
    k->type = type;
    k->v = v;
}

void synth_set_u32(synth_model *m, const char *key, uint32_t v) { set_num(m, key, GGUF_VT_UINT32, num_u(v)); }
void synth_set_i32(synth_model *m, const char *key, int32_t v) { set_num(m, key, GGUF_VT_INT32, num_i(v)); }
void synth_set_f32(synth_model *m, const char *key, float v) { set_num(m, key, GGUF_VT_FLOAT32, num_f(v)); }
void synth_set_bool(synth_model *m, const char *key, bool v) { set_num(m, key, GGUF_VT_BOOL, num_u(v ? 1 : 0)); }

void synth_set_str(synth_model *m, const char *key, const char *v) {
    skv *k = kv_slot(m, key);
    k->type = GGUF_VT_STRING;
    k->s = dsf_xstrdup(v);
}

void synth_set_arr(synth_model *m, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    skv *k = kv_slot(m, key);
    k->type = GGUF_VT_ARRAY;
    k->arr_type = elem_type;
    k->n = n;
    size_t nb = (size_t)n * gguf_vtype_size(elem_type);
    k->arr = dsf_xmalloc(nb ? nb : 1);
    if (nb) memcpy(k->arr, data, nb);
}

void synth_set_arr_str(synth_model *m, const char *key, const char *const *strs, const uint64_t *lens,
                       uint64_t n) {
    skv *k = kv_slot(m, key);
    k->type = GGUF_VT_ARRAY;
    k->arr_type = GGUF_VT_STRING;
    k->n = n;
    k->strs = dsf_xcalloc(n ? n : 1, sizeof *k->strs);
    k->lens = dsf_xcalloc(n ? n : 1, sizeof *k->lens);
    for (uint64_t i = 0; i < n; i++) {
        k->lens[i] = lens ? lens[i] : strlen(strs[i]);
        k->strs[i] = dsf_xmalloc(k->lens[i] + 1);
        memcpy(k->strs[i], strs[i], k->lens[i]);
        k->strs[i][k->lens[i]] = 0;
    }
}

int synth_retype_key(synth_model *m, const char *key, uint32_t new_type) {
    skv *k = find_kv(m, key);
    if (!k || !gguf_vtype_size(new_type)) return -1;
    if (k->type == GGUF_VT_ARRAY) {
        uint32_t es = gguf_vtype_size(k->arr_type), ns = gguf_vtype_size(new_type);
        if (!es) return -1;
        uint8_t *a = dsf_xmalloc((size_t)(k->n ? k->n : 1) * ns);
        for (uint64_t i = 0; i < k->n; i++) put_elem(new_type, a + i * ns, get_elem(k->arr_type, k->arr + i * es));
        free(k->arr);
        k->arr = a;
        k->arr_type = new_type;
        return 0;
    }
    if (!gguf_vtype_size(k->type)) return -1;
    k->type = new_type;
    return 0;
}

int synth_arr_set(synth_model *m, const char *key, uint64_t i, uint64_t v) {
    skv *k = find_kv(m, key);
    if (!k || k->type != GGUF_VT_ARRAY || i >= k->n || !gguf_vtype_size(k->arr_type)) return -1;
    num x = k->arr_type == GGUF_VT_FLOAT32 || k->arr_type == GGUF_VT_FLOAT64 ? num_f((double)v) : num_u(v);
    put_elem(k->arr_type, k->arr + i * gguf_vtype_size(k->arr_type), x);
    return 0;
}

int synth_arr_resize(synth_model *m, const char *key, uint64_t n) {
    skv *k = find_kv(m, key);
    if (!k || k->type != GGUF_VT_ARRAY || !k->n || !gguf_vtype_size(k->arr_type)) return -1;
    uint32_t es = gguf_vtype_size(k->arr_type);
    uint8_t *a = dsf_xmalloc((size_t)(n ? n : 1) * es);
    for (uint64_t i = 0; i < n; i++) memcpy(a + i * es, k->arr + (i < k->n ? i : k->n - 1) * es, es);
    free(k->arr);
    k->arr = a;
    k->n = n;
    return 0;
}

/* ================================================================ tensors */

static stensor *find_t(const synth_model *m, const char *name) {
    for (int i = 0; i < m->n_t; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static stensor *append_t(synth_model *m, uint32_t type, enum synth_kind kind, int64_t fan_in, uint32_t n_dims,
                         const int64_t *ne) {
    if (m->n_t == m->cap_t) {
        m->cap_t = m->cap_t ? 2 * m->cap_t : 256;
        m->t = dsf_xrealloc(m->t, (size_t)m->cap_t * sizeof *m->t);
    }
    stensor *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->kind = kind;
    t->fan_in = fan_in;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    return t;
}

void synth_tensor(synth_model *m, uint32_t type, enum synth_kind kind, int64_t fan_in, uint32_t n_dims, int64_t ne0,
                  int64_t ne1, int64_t ne2, const char *fmt, ...) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    stensor *t = append_t(m, type, kind, fan_in, n_dims, ne);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
}

int synth_drop_tensor(synth_model *m, const char *name) {
    stensor *t = find_t(m, name);
    if (!t) return -1;
    int i = (int)(t - m->t);
    memmove(&m->t[i], &m->t[i + 1], (size_t)(m->n_t - i - 1) * sizeof *m->t);
    m->n_t--;
    return 0;
}

void synth_add_tensor(synth_model *m, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne) {
    stensor *t = append_t(m, type, K_DENSE, ne[0] > 0 ? ne[0] : 1, n_dims, ne);
    snprintf(t->name, sizeof t->name, "%s", name);
}

int synth_reshape_tensor(synth_model *m, const char *name, uint32_t n_dims, const int64_t *ne) {
    stensor *t = find_t(m, name);
    if (!t || n_dims < 1 || n_dims > 4) return -1;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    return 0;
}

int synth_retype_tensor(synth_model *m, const char *name, uint32_t type) {
    stensor *t = find_t(m, name);
    if (!t) return -1;
    t->type = type;
    return 0;
}

int synth_quantize(synth_model *m, int type, int expert_type, char *note, size_t cap, char *err) {
    const int want[2] = {type, expert_type};
    for (int k = 0; k < 2; k++)
        if (want[k] != SYNTH_TYPE_KEEP && (want[k] < 0 || !ggml_blck_size((uint32_t)want[k])))
            return dsf_seterr(err, "synth: no block size known for type %d", want[k]);
    int n_fallback = 0;
    const char *first = NULL;
    uint32_t first_to = 0;
    for (int i = 0; i < m->n_t; i++) {
        stensor *t = &m->t[i];
        int qc = quantize_tensor_class(t->name, t->n_dims, t->type);
        int to = qc == QC_KEEP ? SYNTH_TYPE_KEEP : qc == QC_EXPERTS ? expert_type : type;
        if (to == SYNTH_TYPE_KEEP) continue;
        uint32_t ty = quantize_fallback_type((uint32_t)to, t->ne[0]);
        if (ty != (uint32_t)to && !n_fallback++) first = t->name, first_to = ty;
        t->type = ty;
    }
    if (n_fallback && note && cap)
        snprintf(note, cap, "%d tensor(s) have an ne0 that is not a whole number of blocks and fell back "
                 "(first: '%s' to %s)", n_fallback, first, ggml_type_name(first_to));
    return 0;
}

int synth_quantize_recipe(synth_model *m, const char *recipe, char *err) {
    const quantize_recipe *r = quantize_recipe_find(recipe);
    if (!r) return dsf_seterr(err, "synth: unknown recipe '%s' (see dsflash quantize --help)", recipe);
    for (int i = 0; i < m->n_t; i++) {
        stensor *t = &m->t[i];
        t->type = quantize_recipe_type(r, t->name, t->n_dims, t->type, t->ne[0]);
    }
    synth_set_u32(m, "general.file_type", r->ftype);
    return 0;
}

void synth_fp8_exact(synth_model *m) { m->fp8_exact = true; }

void synth_native(synth_model *m) {
    m->fp8_exact = true;
    for (int i = 0; i < m->n_t; i++) {
        stensor *t = &m->t[i];
        t->type = quantize_native_type(t->name, t->n_dims, t->type, t->ne[0]);
    }
    synth_set_u32(m, DSF_NATIVE_KEY, DSF_NATIVE_VERSION);
}

void synth_model_free(synth_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_kv; i++) kv_clear(&m->kv[i]);
    free(m->kv);
    free(m->t);
    free(m);
}

/* ================================================================ data */

/* The tensor's data bytes; -1 with err when its type has no known size or ne[0] is not a
 * whole number of blocks. */
static int tensor_bytes(const stensor *t, uint64_t *out, char *err) {
    uint32_t bs = ggml_blck_size(t->type), ts = ggml_type_size(t->type);
    if (!bs || !ts) return dsf_seterr(err, "synth: no size known for type %u of '%s'", t->type, t->name);
    if (t->ne[0] % bs)
        return dsf_seterr(err, "synth: '%s': ne0 %lld is not a multiple of %u", t->name, (long long)t->ne[0], bs);
    uint64_t n = (uint64_t)t->ne[0] / bs * ts;
    for (uint32_t d = 1; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
    *out = n + dsf_type_extra_bytes(t->type, (uint64_t)t->ne[0], n / (uint64_t)t->ne[0]); /* FP8_B32: its grid */
    return 0;
}

uint64_t synth_model_data_bytes(const synth_model *m) {
    uint64_t n = 0;
    for (int i = 0; i < m->n_t; i++) {
        uint64_t b;
        if (tensor_bytes(&m->t[i], &b, NULL)) return 0;
        n += b;
    }
    return n;
}

/* A value of the tensor's distribution: uniform with the target standard deviation. */
static float sample(const stensor *t, rng *r) {
    float u = rng_uniform(r);
    switch (t->kind) {
    case K_NORM: return 1.0f + 0.1f * u;
    case K_DENSE: return u * sqrtf(3.0f / (float)t->fan_in); /* std 1/sqrt(fan_in): O(1) outputs */
    case K_BIAS: return 0.01f * u;
    case K_SINK: return u;
    case K_HC_BASE: return 0.5f * u;
    case K_HC_SCALE: return 0.3f + 0.2f * u;
    case K_EMBED: return u * 1.7320508f; /* std 1 */
    }
    return 0;
}

/* FP8-exact values (synth.h): with synth_fp8_exact the weights the checkpoint stores as FP8
 * (quantize_native_type, by name), and always the native types, hold e4m3 codes x 2^(S-127), one S per tensor: the smallest that
 * maps the distribution's bound A to at most 448, or one less when A would map below 240 (the
 * few values above 448 x 2^(S-127) then saturate). Every 32nd value (i % 32 == 0: one per 32
 * columns of every row, so in every 32x32 block and 32-value group when ne0 % 32 == 0) is drawn
 * from the codes 240..448 (within A), so S is each block's smallest exponent and `quantize
 * native` recovers these very bytes; positions depend on the element index only, so a reshaped
 * tensor keeps its values. */
typedef struct {
    bool on;
    int s;             /* E8M0 exponent of every block */
    float top;         /* the largest code magnitude within the bound: min(A / 2^(S-127), 448) */
} fp8_gen;

static fp8_gen fp8_of(const stensor *t, bool fp8_exact) {
    const uint32_t role = quantize_native_type(t->name, 2, GGML_TYPE_BF16, t->ne[0]);
    fp8_gen g = {(fp8_exact && role != GGML_TYPE_BF16) || dsf_type_native(t->type), 127, 448};
    g.on &= t->type == GGML_TYPE_BF16 || t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || dsf_type_native(t->type);
    /* the bound of sample(): sqrt(3/fan_in) for K_DENSE, sqrt(3) for K_EMBED, below 2 for the rest */
    const double a = t->kind == K_DENSE ? sqrt(3.0 / (double)(t->fan_in > 0 ? t->fan_in : 1)) : t->kind == K_EMBED ? 1.7320508 : 2.0;
    g.s = 127 + (int)ceil(log2(a / 448.0));
    if (a / ldexp(1.0, g.s - 127) < 240) g.s--;
    g.top = (float)fmin(a / ldexp(1.0, g.s - 127), 448.0);
    return g;
}

/* The e4m3 code of element i (row-major) of a tensor that fp8_of says is FP8-exact. */
static uint8_t fp8_code(const stensor *t, const fp8_gen *g, rng *r, uint64_t i) {
    const float v = sample(t, r), sc = e8m0_to_f32((uint8_t)g->s);
    if (i % 32) return f32_to_e4m3(v / sc);
    const float u = fabsf(v / sc) / g->top; /* in [0, 1]: a magnitude in [240, top] (codes > 224) */
    return (uint8_t)(f32_to_e4m3(240.0f + (g->top - 240.0f) * fminf(u, 1.0f)) | (v < 0 ? 0x80 : 0));
}

/* The value of element i: sample(), or for an FP8-exact tensor its e4m3 code's value. */
static float value_at(const stensor *t, const fp8_gen *g, rng *r, uint64_t i) {
    return g->on ? e4m3_to_f32(fp8_code(t, g, r, i)) * e8m0_to_f32((uint8_t)g->s) : sample(t, r);
}

/* n_max bytes at most of a native type from byte off on: FP8_B32's codes, then its grid;
 * FP8_R264's blocks of 256 codes and 8 scales. Returns the bytes written. */
static uint64_t fill_native(const stensor *t, const fp8_gen *g, rng *r, uint64_t off, uint64_t total, uint8_t *buf,
                            uint64_t n_max) {
    if (t->type == DSF_TYPE_FP8B32) {
        const uint64_t codes = (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        uint64_t n = 0;
        for (; n < n_max && off + n < total; n++) buf[n] = off + n < codes ? fp8_code(t, g, r, off + n) : (uint8_t)g->s;
        return n;
    }
    uint64_t n = n_max / 264 * 264;
    for (uint64_t b = 0; b < n; b += 264) {
        for (uint64_t j = 0; j < 256; j++) buf[b + j] = fp8_code(t, g, r, (off + b) / 264 * 256 + j);
        memset(buf + b + 256, g->s, 8);
    }
    return n;
}

/* MXFP4 blocks: random codes (all 16), e around the exponent that gives std 1/sqrt(fan_in):
 * E[kv^2] over the 16 codes is 34.25 (kvalues are doubled e2m1, §1.5), so
 * 2^(e-128) * sqrt(34.25) = 1/sqrt(fan_in). */
static void mxfp4_blocks(const stensor *t, rng *r, uint8_t *dst, uint64_t n_blocks) {
    int e0 = (int)lround(128.0 - log2(sqrt(34.25) * sqrt((double)t->fan_in)));
    for (uint64_t b = 0; b < n_blocks; b++) {
        uint64_t u = rng_next(r);
        dst[b * 17] = (uint8_t)(e0 - 1 + (int)(u % 3));
        uint64_t v = rng_next(r), w = rng_next(r);
        memcpy(dst + b * 17 + 1, &v, 8);
        memcpy(dst + b * 17 + 9, &w, 8);
    }
}

/* Where each block type keeps its f16 scales (byte offsets; testdata/quants/TYPE.json, and
 * Q8_1 {f16 d; f16 s; int8 qs[32]}). */
static const struct { uint32_t type; int n; uint8_t off[2]; } f16_scales[] = {
    {GGML_TYPE_Q4_0, 1, {0}}, {GGML_TYPE_Q4_1, 2, {0, 2}}, {GGML_TYPE_Q5_0, 1, {0}}, {GGML_TYPE_Q5_1, 2, {0, 2}},
    {GGML_TYPE_Q8_0, 1, {0}}, {GGML_TYPE_Q8_1, 2, {0, 2}}, {GGML_TYPE_Q2_K, 2, {80, 82}}, {GGML_TYPE_Q3_K, 1, {108}},
    {GGML_TYPE_Q4_K, 2, {0, 2}}, {GGML_TYPE_Q5_K, 2, {0, 2}}, {GGML_TYPE_Q6_K, 1, {208}},
    {GGML_TYPE_IQ1_S, 1, {0}}, {GGML_TYPE_IQ2_XXS, 1, {0}}, {GGML_TYPE_IQ2_XS, 1, {0}},
    {GGML_TYPE_IQ2_S, 1, {0}}, {GGML_TYPE_IQ3_XXS, 1, {0}}, {GGML_TYPE_IQ3_S, 1, {0}},
    {GGML_TYPE_IQ4_NL, 1, {0}}, {GGML_TYPE_IQ4_XS, 1, {0}}, {GGML_TYPE_TQ1_0, 1, {52}},
    {GGML_TYPE_TQ2_0, 1, {64}}, {GGML_TYPE_Q1_0, 1, {0}}, {GGML_TYPE_Q2_0, 1, {0}},
};

/* Replaces the scale fields of one block of random bytes with small finite scales (about
 * 1/(64 sqrt(fan_in)), so that no block decodes to NaN/Inf or to huge values). */
static void block_scales(const stensor *t, rng *r, uint8_t *blk) {
    float d = (0.75f + 0.25f * rng_uniform(r)) / (64.0f * sqrtf((float)(t->fan_in > 0 ? t->fan_in : 1)));
    uint16_t h = f32_to_f16(d);
    for (size_t i = 0; i < sizeof f16_scales / sizeof *f16_scales; i++)
        if (f16_scales[i].type == t->type)
            for (int k = 0; k < f16_scales[i].n; k++) memcpy(blk + f16_scales[i].off[k], &h, 2);
    if (t->type == GGML_TYPE_Q8_K) memcpy(blk, &d, 4);
    if (t->type == GGML_TYPE_IQ1_M) /* the f16 lives in the top nibbles of 4 u16 words at 48 */
        for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0F) | ((h >> (4 * k)) & 0xF) << 4);
    if (t->type == GGML_TYPE_NVFP4) /* UE4M3 0x20..0x2F: 2^-3 .. 2^-2 x 1.875, never the NaN codes */
        for (int k = 0; k < 4; k++) blk[k] = (uint8_t)(0x20 | (blk[k] & 0x0F));
}

/* Generates one chunk of n_max bytes at most (whole elements or blocks) starting at element i0;
 * returns its size. */
static uint64_t fill_chunk(const stensor *t, const fp8_gen *g, rng *r, uint64_t i0, uint8_t *buf, uint64_t n_max) {
    if (t->type == GGML_TYPE_MXFP4) {
        mxfp4_blocks(t, r, buf, n_max / 17);
        return n_max / 17 * 17;
    }
    if (t->type == GGML_TYPE_BF16) {
        for (uint64_t i = 0; i < n_max / 2; i++) {
            uint16_t h = f32_to_bf16(value_at(t, g, r, i0 + i));
            memcpy(buf + 2 * i, &h, 2);
        }
        return n_max / 2 * 2;
    }
    if (t->type == GGML_TYPE_F32) {
        for (uint64_t i = 0; i < n_max / 4; i++) {
            float f = value_at(t, g, r, i0 + i);
            memcpy(buf + 4 * i, &f, 4);
        }
        return n_max / 4 * 4;
    }
    if (t->type == GGML_TYPE_F16) {
        for (uint64_t i = 0; i < n_max / 2; i++) {
            uint16_t h = f32_to_f16(value_at(t, g, r, i0 + i));
            memcpy(buf + 2 * i, &h, 2);
        }
        return n_max / 2 * 2;
    }
    uint64_t ts = ggml_type_size(t->type), n = ts > 1 ? n_max / ts * ts : n_max;
    for (uint64_t i = 0; i < n; i++) buf[i] = (uint8_t)rng_next(r);
    if (ts > 1)
        for (uint64_t b = 0; b < n; b += ts) block_scales(t, r, buf + b);
    return n;
}

static int write_tensor(gguf_writer *w, const stensor *t, uint64_t seed, bool fp8_exact, uint8_t *buf, size_t cap,
                        char *err) {
    rng r = {hash_str(t->name, seed)};
    uint64_t total, done = 0;
    if (tensor_bytes(t, &total, err)) return -1;
    const fp8_gen g = fp8_of(t, fp8_exact);
    const uint32_t es = t->type == GGML_TYPE_F32 ? 4 : 2; /* element bytes of the float types */
    while (done < total) {
        const uint64_t want = cap < total - done ? cap : total - done;
        uint64_t n = dsf_type_native(t->type) ? fill_native(t, &g, &r, done, total, buf, want)
                                               : fill_chunk(t, &g, &r, done / es, buf, want);
        if (gguf_writer_write(w, buf, n, err) < 0) return dsf_prefixerr(err, "tensor %s", t->name);
        done += n;
    }
    return 0;
}

static int write_kv(gguf_writer *w, const skv *k, char *err) {
    if (k->type == GGUF_VT_STRING) return gguf_writer_kv_str(w, k->key, k->s, err);
    if (k->type == GGUF_VT_ARRAY && k->arr_type == GGUF_VT_STRING)
        return gguf_writer_kv_arr_str(w, k->key, (const char *const *)k->strs, k->lens, k->n, err);
    if (k->type == GGUF_VT_ARRAY) return gguf_writer_kv_arr(w, k->key, k->arr_type, k->arr, k->n, err);
    if (!gguf_vtype_size(k->type)) return dsf_seterr(err, "synth: key '%s': bad type %u", k->key, k->type);
    uint8_t le[8];
    put_elem(k->type, le, k->v);
    return gguf_writer_kv_scalar(w, k->key, k->type, le, err);
}

void synth_set_head(synth_model *m, synth_head_fn fn, const void *ctx) {
    m->head = fn;
    m->head_ctx = ctx;
}

/* A writer with every key and tensor info of m added (NULL with err). */
static gguf_writer *writer_for(const synth_model *m, char *err) {
    gguf_writer *w = gguf_writer_new();
    if (m->head && m->head(w, m->head_ctx, err) < 0) goto fail;
    for (int i = 0; i < m->n_kv; i++)
        if (write_kv(w, &m->kv[i], err) < 0) goto fail;
    for (int i = 0; i < m->n_t; i++)
        if (gguf_writer_tensor(w, m->t[i].name, m->t[i].type, m->t[i].n_dims, m->t[i].ne, err) < 0) goto fail;
    return w;
fail:
    gguf_writer_free(w);
    return NULL;
}

int synth_model_write_header(const synth_model *m, const char *path, char *err) {
    gguf_writer *w = writer_for(m, err);
    if (!w) return -1;
    int rc = gguf_writer_begin(w, path, err) < 0 || gguf_writer_finish_header(w, err) < 0 ? -1 : 0;
    gguf_writer_free(w);
    return rc;
}

int synth_model_write(const synth_model *m, const char *path, char *err) {
    int rc = -1;
    uint8_t *buf = NULL;
    gguf_writer *w = writer_for(m, err);
    if (!w) return -1;
    if (gguf_writer_begin(w, path, err) < 0) goto done;
    const size_t cap = 1u << 20; /* chunks end on whole elements or blocks */
    buf = dsf_xmalloc(cap);
    for (int i = 0; i < m->n_t; i++)
        if (write_tensor(w, &m->t[i], m->seed, m->fp8_exact, buf, cap, err) < 0) goto done;
    if (gguf_writer_finish(w, err) < 0) goto done;
    rc = 0;
done:
    free(buf);
    gguf_writer_free(w);
    return rc;
}
