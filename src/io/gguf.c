/* gguf.c: the reading half of gguf.h, a GGUF v2/v3 reader over mmap or a memory buffer
 * (gguf-layout.md §1.1-1.3, §1.6; the writer is gguf_write.c).
 *
 * Owns: parsing and validating the header, the KV pairs and the tensor infos; the lookup
 * tables for keys and tensor names; the type-strict getters.
 * Must not: touch tensor data (pages fault in lazily when a kernel reads them), or allocate
 * in proportion to a count read from the file before that count has been bounded by the
 * bytes that remain (a file claiming 2^60 tensors fails at once, without a large malloc).
 * Invariants after a successful open: every key is non-empty, NUL-free and unique; every
 * tensor name is non-empty, NUL-free, < 64 bytes and unique; every tensor has 1..4 dims,
 * each >= 1 (zero-sized dimensions are refused: no tensor of this model is empty, and a
 * zero ne0 would make "bytes per row" and "rows" meaningless for every consumer), a known
 * non-retired type (it may still be unsupported by dequant_row), ne0 a whole number of
 * blocks, an element count and byte size that fit in int64, and data that lies inside the
 * file; tensors are exactly contiguous in file order, each at an offset aligned to the
 * file's alignment (gguf.cpp's rule, so a file this reader accepts is one llama.cpp
 * accepts, and no two tensors can overlap). Multi-byte values are read byte-wise
 * (little-endian, no alignment assumed). */
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define GGUF_MAX_STRING (1ull << 30)   /* GGUF_MAX_STRING_LENGTH */
#define GGUF_MAX_ARRAY (1ull << 30)    /* GGUF_MAX_ARRAY_ELEMENTS */
/* Sanity caps on the counts (a real model has ~70 keys and ~1,000 tensors). Together with
 * "each entry needs this many bytes of the file" they bound the tables we allocate. */
#define GGUF_MAX_KV (1ull << 20)
#define GGUF_MAX_TENSORS (1ull << 24)
#define KV_MIN_BYTES 14     /* key length 8 + 1 key byte + type 4 + 1 value byte */
#define TINFO_MIN_BYTES 33  /* name length 8 + 1 + n_dims 4 + one ne 8 + type 4 + offset 8 */

/* ================================================================ lookup tables */

/* Open addressing over indices (stored +1; 0 = empty), FNV-1a hash, load <= 1/2. */
typedef struct {
    uint32_t *slot;
    uint64_t cap; /* power of two or 0 */
} htab;

typedef struct {
    htab kv, tensors;
    bool mapped;
} reader_priv;

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static const char *kv_name(const gguf_file *f, uint32_t i) { return f->kv[i].key; }
static const char *tensor_name(const gguf_file *f, uint32_t i) { return f->tensors[i].name; }

static int64_t ht_find(const htab *h, const gguf_file *f, const char *(*name)(const gguf_file *, uint32_t),
                       const char *key) {
    if (!h->cap) return -1;
    uint64_t mask = h->cap - 1;
    for (uint64_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
        uint32_t s = h->slot[i];
        if (!s) return -1;
        if (strcmp(name(f, s - 1), key) == 0) return s - 1;
    }
}

/* Inserts index idx (whose name is already set) after a failed ht_find; n is the number
 * of entries after insertion. */
static void ht_insert(htab *h, const gguf_file *f, const char *(*name)(const gguf_file *, uint32_t),
                      uint32_t idx, uint64_t n) {
    if (2 * n > h->cap) {
        uint64_t cap = h->cap ? 2 * h->cap : 64;
        while (2 * n > cap) cap *= 2;
        uint32_t *slot = dsf_xcalloc(cap, sizeof *slot);
        for (uint64_t i = 0; i < h->cap; i++) {
            uint32_t s = h->slot[i];
            if (!s) continue;
            uint64_t j = hash_str(name(f, s - 1)) & (cap - 1);
            while (slot[j]) j = (j + 1) & (cap - 1);
            slot[j] = s;
        }
        free(h->slot);
        h->slot = slot;
        h->cap = cap;
    }
    uint64_t j = hash_str(name(f, idx)) & (h->cap - 1);
    while (h->slot[j]) j = (j + 1) & (h->cap - 1);
    h->slot[j] = idx + 1;
}

/* ================================================================ cursor */

typedef struct {
    const uint8_t *p;
    uint64_t pos, size;
    const char *name; /* file name for messages */
    char *err;
    char what[160];   /* the item being parsed, for messages: "key 'x'", "tensor #3", ... */
    bool header_only; /* gguf_open_header: tensor data may lie past the end (data = NULL) */
} cursor;

static int fail(cursor *c, const char *fmt, ...) DSF_PRINTF(2, 3);
static int fail(cursor *c, const char *fmt, ...) {
    if (c->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, DSF_ERR_LEN, fmt, ap);
        va_end(ap);
        if (c->what[0]) dsf_prefixerr(c->err, "%s: %s", c->name, c->what);
        else dsf_prefixerr(c->err, "%s", c->name);
    }
    return -1;
}

static uint64_t remain(const cursor *c) { return c->size - c->pos; }

static int need(cursor *c, uint64_t n, const char *thing) {
    if (n > remain(c))
        return fail(c, "truncated: %s (%llu bytes) at offset %llu runs past the end of the file (%llu bytes)",
                    thing, (unsigned long long)n, (unsigned long long)c->pos, (unsigned long long)c->size);
    return 0;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(cursor *c, uint32_t *out, const char *thing) {
    if (need(c, 4, thing) < 0) return -1;
    *out = (uint32_t)le(c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *out, const char *thing) {
    if (need(c, 8, thing) < 0) return -1;
    *out = le(c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* "thing" or "thing idx", built only on error paths (string arrays have 10^5 elements). */
static const char *label(char *buf, size_t cap, const char *thing, int64_t idx) {
    if (idx < 0) return thing;
    snprintf(buf, cap, "%s %lld", thing, (long long)idx);
    return buf;
}

static int rd_str(cursor *c, gguf_str *s, const char *thing, int64_t idx) {
    char buf[96];
    if (remain(c) < 8) return need(c, 8, label(buf, sizeof buf, thing, idx));
    uint64_t len = le(c->p + c->pos, 8);
    c->pos += 8;
    if (len > GGUF_MAX_STRING)
        return fail(c, "%s length %llu exceeds the 1 GiB limit", label(buf, sizeof buf, thing, idx),
                    (unsigned long long)len);
    if (len > remain(c)) return need(c, len, label(buf, sizeof buf, thing, idx));
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

/* A printable rendering of a name from the file, for messages: non-printable bytes and
 * quotes escaped as \xNN, cut with "..." to fit cap (>= 8) bytes. */
static void show(char *dst, size_t cap, const char *p, uint64_t len) {
    size_t n = 0;
    for (uint64_t i = 0; i < len; i++) {
        if (n + 8 > cap) { /* keep room for one escape (4), "..." (3) and the NUL */
            memcpy(dst + n, "...", 3);
            n += 3;
            break;
        }
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 0x20 && ch < 0x7F && ch != '\'') dst[n++] = (char)ch;
        else n += (size_t)snprintf(dst + n, cap - n, "\\x%02x", ch);
    }
    dst[n] = 0;
}

/* ================================================================ value types */

static const char *vtype_names[GGUF_VT_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
    "UINT64", "INT64", "FLOAT64",
};

const char *gguf_vtype_name(uint32_t t) { return t < GGUF_VT_COUNT ? vtype_names[t] : "?"; }

uint32_t gguf_vtype_size(uint32_t t) {
    static const uint8_t sz[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_VT_COUNT ? sz[t] : 0;
}

static int rd_scalar(cursor *c, gguf_kv *kv, uint32_t t) {
    uint32_t n = gguf_vtype_size(t);
    if (need(c, n, "value") < 0) return -1;
    uint64_t v = le(c->p + c->pos, (int)n);
    c->pos += n;
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64: kv->u = v; break;
    case GGUF_VT_INT8: kv->i = (int8_t)v; break;
    case GGUF_VT_INT16: kv->i = (int16_t)v; break;
    case GGUF_VT_INT32: kv->i = (int32_t)v; break;
    case GGUF_VT_INT64: kv->i = (int64_t)v; break;
    case GGUF_VT_FLOAT32: {
        uint32_t u = (uint32_t)v;
        float f;
        memcpy(&f, &u, 4);
        kv->f = f;
        break;
    }
    case GGUF_VT_FLOAT64: memcpy(&kv->f, &v, 8); break;
    case GGUF_VT_BOOL:
        if (v > 1) return fail(c, "BOOL value %llu is not 0 or 1", (unsigned long long)v);
        kv->u = v;
        break;
    default: return fail(c, "internal: bad scalar type %u", t);
    }
    return 0;
}

static int rd_value(cursor *c, gguf_kv *kv) {
    uint32_t t = kv->type;
    if (t >= GGUF_VT_COUNT) return fail(c, "unknown value type %u", t);
    if (t == GGUF_VT_STRING) return rd_str(c, &kv->str, "string value", -1);
    if (t != GGUF_VT_ARRAY) return rd_scalar(c, kv, t);

    uint32_t et;
    uint64_t n;
    if (rd_u32(c, &et, "array element type") < 0 || rd_u64(c, &n, "array length") < 0) return -1;
    if (et >= GGUF_VT_COUNT) return fail(c, "array of unknown value type %u", et);
    if (et == GGUF_VT_ARRAY) return fail(c, "nested arrays are not supported");
    if (n > GGUF_MAX_ARRAY)
        return fail(c, "array length %llu exceeds the limit of 2^30 elements", (unsigned long long)n);
    kv->arr_type = et;
    kv->arr_n = n;
    kv->arr_data = c->p + c->pos;
    if (et != GGUF_VT_STRING) {
        uint64_t bytes = n * gguf_vtype_size(et); /* <= 2^33: no overflow */
        if (bytes > remain(c))
            return fail(c, "array of %llu %s (%llu bytes) runs past the end of the file (%llu bytes left)",
                        (unsigned long long)n, gguf_vtype_name(et), (unsigned long long)bytes,
                        (unsigned long long)remain(c));
        if (et == GGUF_VT_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->p[c->pos + i] > 1) return fail(c, "BOOL array element %llu is not 0 or 1", (unsigned long long)i);
        c->pos += bytes;
        return 0;
    }
    /* Strings: each needs at least its 8-byte length, so bound n before allocating. */
    if (n > remain(c) / 8)
        return fail(c, "array of %llu strings cannot fit in the %llu bytes left", (unsigned long long)n,
                    (unsigned long long)remain(c));
    kv->strs = dsf_xmalloc((size_t)(n ? n : 1) * sizeof *kv->strs);
    for (uint64_t i = 0; i < n; i++)
        if (rd_str(c, &kv->strs[i], "string array element", (int64_t)i) < 0) return -1;
    return 0;
}

/* ================================================================ open */

static void free_tables(gguf_file *f) {
    if (f->kv) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free((char *)f->kv[i].key);
            free(f->kv[i].strs);
        }
    }
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    reader_priv *pv = f->priv;
    if (pv) {
        free(pv->kv.slot);
        free(pv->tensors.slot);
        free(pv);
    }
    f->kv = NULL;
    f->tensors = NULL;
    f->priv = NULL;
}

/* Copies a name from the file into a NUL-terminated string; refuses empty and NUL-holding
 * names. */
static int dup_name(cursor *c, const gguf_str *s, const char *what, char **out) {
    if (s->len == 0) return fail(c, "empty %s", what);
    if (memchr(s->ptr, 0, s->len)) return fail(c, "%s contains a NUL byte", what);
    char *d = dsf_xmalloc(s->len + 1);
    memcpy(d, s->ptr, s->len);
    d[s->len] = 0;
    *out = d;
    return 0;
}

static int parse_kvs(cursor *c, gguf_file *f, uint64_t n_kv) {
    reader_priv *pv = f->priv;
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(c->what, sizeof c->what, "key #%llu", (unsigned long long)i);
        if (i == cap) {
            uint64_t ncap = cap ? 2 * cap : 64;
            f->kv = dsf_xrealloc(f->kv, (size_t)ncap * sizeof *f->kv);
            memset(f->kv + cap, 0, (size_t)(ncap - cap) * sizeof *f->kv);
            cap = ncap;
        }
        gguf_kv *kv = &f->kv[i];
        gguf_str key;
        char *name;
        if (rd_str(c, &key, "key", -1) < 0 || dup_name(c, &key, "key", &name) < 0) return -1;
        kv->key = name;
        f->n_kv = i + 1; /* owned from now on: freed by free_tables */
        char shown[96];
        show(shown, sizeof shown, name, key.len);
        snprintf(c->what, sizeof c->what, "key '%s'", shown);
        if (ht_find(&pv->kv, f, kv_name, name) >= 0) return fail(c, "duplicate key");
        ht_insert(&pv->kv, f, kv_name, (uint32_t)i, i + 1);
        if (rd_u32(c, &kv->type, "value type") < 0 || rd_value(c, kv) < 0) return -1;
    }
    c->what[0] = 0;
    return 0;
}

static int parse_alignment(cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv) return 0;
    snprintf(c->what, sizeof c->what, "key 'general.alignment'");
    if (kv->type != GGUF_VT_UINT32) return fail(c, "has type %s, expected UINT32", gguf_vtype_name(kv->type));
    if (kv->u == 0 || (kv->u & (kv->u - 1)))
        return fail(c, "alignment %llu is not a non-zero power of two", (unsigned long long)kv->u);
    f->alignment = kv->u;
    c->what[0] = 0;
    return 0;
}

static int parse_tensor_info(cursor *c, gguf_file *f, uint64_t i) {
    reader_priv *pv = f->priv;
    gguf_tensor *t = &f->tensors[i];
    gguf_str s;
    char *name;
    snprintf(c->what, sizeof c->what, "tensor #%llu", (unsigned long long)i);
    if (rd_str(c, &s, "tensor name", -1) < 0) return -1;
    char shown[96];
    show(shown, sizeof shown, s.ptr, s.len);
    if (s.len >= GGUF_MAX_NAME)
        return fail(c, "name '%s' is %llu bytes long (the limit is %d)", shown, (unsigned long long)s.len,
                    GGUF_MAX_NAME - 1);
    if (dup_name(c, &s, "tensor name", &name) < 0) return -1;
    t->name = name;
    f->n_tensors = i + 1;
    snprintf(c->what, sizeof c->what, "tensor '%s'", shown);
    if (ht_find(&pv->tensors, f, tensor_name, name) >= 0) return fail(c, "duplicate tensor name");
    ht_insert(&pv->tensors, f, tensor_name, (uint32_t)i, i + 1);

    if (rd_u32(c, &t->n_dims, "n_dims") < 0) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) return fail(c, "n_dims %u is not in 1..%d", t->n_dims, GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && rd_u64(c, &ne, "dimension") < 0) return -1;
        if (ne == 0) return fail(c, "dimension %u is 0 (empty tensors are not supported)", d);
        if (ne > (uint64_t)INT64_MAX) return fail(c, "dimension %u (%llu) is negative as int64", d, (unsigned long long)ne);
        if (!dsf_mul_ok(nel, ne, &nel) || nel > (uint64_t)INT64_MAX)
            return fail(c, "element count overflows int64");
        t->ne[d] = (int64_t)ne;
    }
    if (rd_u32(c, &t->type, "type") < 0 || rd_u64(c, &t->offset, "offset") < 0) return -1;
    uint32_t bs = ggml_blck_size(t->type), ts = ggml_type_size(t->type);
    if (bs == 0) {
        if (t->type < GGML_TYPE_COUNT) return fail(c, "type %u is a retired ggml type", t->type);
        return fail(c, "unknown ggml type %u", t->type);
    }
    if (t->ne[0] % bs)
        return fail(c, "ne0 = %lld is not a multiple of the %s block size %u", (long long)t->ne[0],
                    ggml_type_name(t->type), bs);
    uint64_t rows = nel / (uint64_t)t->ne[0];
    t->row_bytes = (uint64_t)t->ne[0] / bs * ts;
    if (!dsf_mul_ok(t->row_bytes, rows, &t->nbytes) || t->nbytes > (uint64_t)INT64_MAX)
        return fail(c, "byte size overflows");
    t->nbytes += dsf_type_extra_bytes(t->type, (uint64_t)t->ne[0], rows); /* < 2^63 / 512 more: no wrap */
    if (t->nbytes > (uint64_t)INT64_MAX) return fail(c, "byte size overflows");
    if (t->offset % f->alignment)
        return fail(c, "offset %llu is not a multiple of the alignment %llu", (unsigned long long)t->offset,
                    (unsigned long long)f->alignment);
    return 0;
}

/* Finds the tensor (among 0..i-1, contiguous and sorted by offset) whose data holds `off`. */
static uint64_t find_holder(const gguf_file *f, uint64_t i, uint64_t off) {
    uint64_t lo = 0, hi = i;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (f->tensors[mid].offset <= off) lo = mid;
        else hi = mid;
    }
    return lo;
}

static int parse_tensors(cursor *c, gguf_file *f, uint64_t n_tensors) {
    if (n_tensors) f->tensors = dsf_xcalloc((size_t)n_tensors, sizeof *f->tensors); /* bounded by file size */
    for (uint64_t i = 0; i < n_tensors; i++)
        if (parse_tensor_info(c, f, i) < 0) return -1;
    c->what[0] = 0;
    uint64_t a = f->alignment, end = c->pos;
    f->data_offset = end + (a - end % a) % a; /* GGML_PAD(end of infos, alignment) */
    if (n_tensors && f->data_offset > c->size && !c->header_only)
        return fail(c, "data section at offset %llu starts past the end of the file (%llu bytes)",
                    (unsigned long long)f->data_offset, (unsigned long long)c->size);
    uint64_t expect = 0, room = n_tensors && f->data_offset <= c->size ? c->size - f->data_offset : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        char shown[96];
        show(shown, sizeof shown, t->name, strlen(t->name));
        snprintf(c->what, sizeof c->what, "tensor '%s'", shown);
        if (t->offset < expect) {
            const gguf_tensor *o = &f->tensors[find_holder(f, i, t->offset)];
            char other[96];
            show(other, sizeof other, o->name, strlen(o->name));
            return fail(c, "data [offset %llu, %llu bytes] overlaps tensor '%s' [offset %llu, %llu bytes]",
                        (unsigned long long)t->offset, (unsigned long long)t->nbytes, other,
                        (unsigned long long)o->offset, (unsigned long long)o->nbytes);
        }
        if (t->offset != expect)
            return fail(c, "has offset %llu, expected %llu (tensor data must be contiguous, in file order)",
                        (unsigned long long)t->offset, (unsigned long long)expect);
        if (t->offset > room || t->nbytes > room - t->offset) {
            if (!c->header_only)
                return fail(c, "data [offset %llu, %llu bytes] runs past the end of the file (%llu bytes)",
                            (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)c->size);
            if (t->offset > UINT64_MAX / 4 || t->nbytes > UINT64_MAX / 4) return fail(c, "data offset overflows");
            t->data = NULL;
        } else {
            t->data = c->p + f->data_offset + t->offset;
        }
        /* expect + padded size <= room + a (or < 2^63 + a, header only): no overflow. */
        expect = t->offset + t->nbytes;
        expect += (a - expect % a) % a;
    }
    c->what[0] = 0;
    return 0;
}

static gguf_file *parse(const uint8_t *p, uint64_t size, const char *name, bool header_only, char *err) {
    cursor c = {.p = p, .pos = 0, .size = size, .name = name, .err = err, .header_only = header_only};
    gguf_file *f = dsf_xcalloc(1, sizeof *f);
    f->map = p;
    f->size = size;
    f->path = dsf_xstrdup(name);
    f->priv = dsf_xcalloc(1, sizeof(reader_priv));
    f->fd = -1;

    uint32_t version;
    uint64_t n_tensors, n_kv;
    if (size < 4 || memcmp(p, "GGUF", 4) != 0) {
        fail(&c, "not a GGUF file (bad magic)");
        goto fail;
    }
    c.pos = 4;
    if (rd_u32(&c, &version, "version") < 0) goto fail;
    if ((version & 0xFFFF) == 0) {
        fail(&c, "GGUF version %u (0x%08x): endianness mismatch (a big-endian file?)", version, version);
        goto fail;
    }
    if (version == 1) {
        fail(&c, "GGUF version 1 is no longer supported");
        goto fail;
    }
    if (version != 2 && version != 3) {
        fail(&c, "unsupported GGUF version %u (expected 2 or 3)", version);
        goto fail;
    }
    f->version = version;
    if (rd_u64(&c, &n_tensors, "tensor count") < 0 || rd_u64(&c, &n_kv, "KV count") < 0) goto fail;
    if (n_kv > GGUF_MAX_KV || n_kv > remain(&c) / KV_MIN_BYTES) {
        fail(&c, "KV count %llu is impossible for a file of %llu bytes", (unsigned long long)n_kv,
             (unsigned long long)size);
        goto fail;
    }
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > remain(&c) / TINFO_MIN_BYTES) {
        fail(&c, "tensor count %llu is impossible for a file of %llu bytes", (unsigned long long)n_tensors,
             (unsigned long long)size);
        goto fail;
    }
    if (parse_kvs(&c, f, n_kv) < 0 || parse_alignment(&c, f) < 0) goto fail;
    if (n_tensors > remain(&c) / TINFO_MIN_BYTES) {
        fail(&c, "%llu tensor infos cannot fit in the %llu bytes left after the KVs",
             (unsigned long long)n_tensors, (unsigned long long)remain(&c));
        goto fail;
    }
    if (parse_tensors(&c, f, n_tensors) < 0) goto fail;
    return f;
fail:
    free_tables(f);
    free(f->path);
    free(f);
    return NULL;
}

gguf_file *gguf_open_mem(const void *data, uint64_t size, const char *name, char *err) {
    if (!name) name = "<memory>";
    if (!data && size) {
        dsf_seterr(err, "%s: no data", name);
        return NULL;
    }
    static const uint8_t empty[1];
    return parse(data ? data : empty, size, name, false, err);
}

static gguf_file *open_file(const char *path, bool header_only, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        dsf_seterr(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        dsf_seterr(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        dsf_seterr(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        dsf_seterr(err, "%s: empty file (not a GGUF file)", path);
        close(fd);
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        dsf_seterr(err, "%s: mmap failed: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    gguf_file *f = parse(m, size, path, header_only, err);
    if (!f) {
        munmap(m, (size_t)size);
        close(fd);
        return NULL;
    }
    ((reader_priv *)f->priv)->mapped = true;
    f->fd = fd;
    return f;
}

gguf_file *gguf_open(const char *path, char *err) { return open_file(path, false, err); }
gguf_file *gguf_open_header(const char *path, char *err) { return open_file(path, true, err); }

void gguf_close(gguf_file *f) {
    if (!f) return;
    reader_priv *pv = f->priv;
    if (pv && pv->mapped) munmap((void *)f->map, (size_t)f->size);
    if (f->fd >= 0) close(f->fd);
    free_tables(f);
    free(f->path);
    free(f);
}

/* ================================================================ lookup and getters */

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    if (!f || !f->priv || !key) return NULL;
    int64_t i = ht_find(&((reader_priv *)f->priv)->kv, f, kv_name, key);
    return i < 0 ? NULL : &f->kv[i];
}

const uint8_t *gguf_read_span(const gguf_file *f, const uint8_t *src, size_t n, uint8_t *buf, size_t cap, bool nowait) {
    if (!f || f->fd < 0 || n > cap || src < f->map || (uint64_t)(src - f->map) > f->size ||
        n > f->size - (uint64_t)(src - f->map))
        return src; /* not a file span that fits: through the mapping */
    const off_t off = (off_t)(src - f->map);
    if (nowait) {
#ifdef RWF_NOWAIT
        struct iovec v = {buf, n};
        return preadv2(f->fd, &v, 1, off, RWF_NOWAIT) == (ssize_t)n ? buf : NULL;
#else
        return NULL;
#endif
    }
    return pread(f->fd, buf, n, off) == (ssize_t)n ? buf : src; /* failed or short: the mapping */
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !f->priv || !name) return NULL;
    int64_t i = ht_find(&((reader_priv *)f->priv)->tensors, f, tensor_name, name);
    return i < 0 ? NULL : &f->tensors[i];
}

/* Looks up key and checks its type: 1 absent, -1 wrong type (message), 0 found. */
static int lookup(const gguf_file *f, const char *key, uint32_t type, const gguf_kv **out, char *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    if (kv->type != type) {
        if (kv->type == GGUF_VT_ARRAY)
            return dsf_seterr(err, "%s: key %s has wrong type ARRAY of %s but expected type %s", f->path, key,
                              gguf_vtype_name(kv->arr_type), gguf_vtype_name(type));
        return dsf_seterr(err, "%s: key %s has wrong type %s but expected type %s", f->path, key,
                          gguf_vtype_name(kv->type), gguf_vtype_name(type));
    }
    *out = kv;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err) {
    const gguf_kv *kv;
    int rc = lookup(f, key, GGUF_VT_UINT32, &kv, err);
    if (rc == 0) *out = (uint32_t)kv->u;
    return rc;
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, char *err) {
    const gguf_kv *kv;
    int rc = lookup(f, key, GGUF_VT_INT32, &kv, err);
    if (rc == 0) *out = (int32_t)kv->i;
    return rc;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err) {
    const gguf_kv *kv;
    int rc = lookup(f, key, GGUF_VT_FLOAT32, &kv, err);
    if (rc == 0) *out = (float)kv->f;
    return rc;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err) {
    const gguf_kv *kv;
    int rc = lookup(f, key, GGUF_VT_BOOL, &kv, err);
    if (rc == 0) *out = kv->u != 0;
    return rc;
}

int gguf_get_str(const gguf_file *f, const char *key, char **out, char *err) {
    const gguf_kv *kv;
    int rc = lookup(f, key, GGUF_VT_STRING, &kv, err);
    if (rc != 0) return rc;
    if (memchr(kv->str.ptr, 0, kv->str.len))
        return dsf_seterr(err, "%s: key %s: string contains a NUL byte", f->path, key);
    char *s = dsf_xmalloc(kv->str.len + 1);
    memcpy(s, kv->str.ptr, kv->str.len);
    s[kv->str.len] = 0;
    *out = s;
    return 0;
}

/* Looks up an array key whose element type is one of `ok` (a bit mask of value types). */
static int lookup_arr(const gguf_file *f, const char *key, uint32_t ok, const char *want, const gguf_kv **out,
                      char *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    if (kv->type != GGUF_VT_ARRAY)
        return dsf_seterr(err, "%s: key %s has wrong type %s but expected an array of %s", f->path, key,
                          gguf_vtype_name(kv->type), want);
    if (!(ok & (1u << kv->arr_type)))
        return dsf_seterr(err, "%s: key %s is an array of %s but expected an array of %s", f->path, key,
                          gguf_vtype_name(kv->arr_type), want);
    *out = kv;
    return 0;
}

/* Element i of an integer array, as a signed 128-bit-free pair: value and whether it is
 * negative (unsigned 64-bit values do not fit int64). */
static void arr_int(const gguf_kv *kv, uint64_t i, uint64_t *mag, bool *neg) {
    const uint8_t *p = kv->arr_data;
    *neg = false;
    switch (kv->arr_type) {
    case GGUF_VT_UINT32: *mag = le(p + 4 * i, 4); break;
    case GGUF_VT_UINT64: *mag = le(p + 8 * i, 8); break;
    case GGUF_VT_INT32: {
        int64_t v = (int32_t)le(p + 4 * i, 4);
        *neg = v < 0;
        *mag = (uint64_t)v;
        break;
    }
    default: { /* INT64 */
        int64_t v = (int64_t)le(p + 8 * i, 8);
        *neg = v < 0;
        *mag = (uint64_t)v;
        break;
    }
    }
}

#define VT_BIT(t) (1u << (t))

int gguf_get_arr_u32(const gguf_file *f, const char *key, uint32_t **out, uint64_t *n, char *err) {
    const gguf_kv *kv;
    int rc = lookup_arr(f, key, VT_BIT(GGUF_VT_INT32) | VT_BIT(GGUF_VT_UINT32), "INT32/UINT32", &kv, err);
    if (rc != 0) return rc;
    uint32_t *a = dsf_xmalloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *a);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t v;
        bool neg;
        arr_int(kv, i, &v, &neg);
        if (neg) {
            free(a);
            return dsf_seterr(err, "%s: key %s: element %llu is negative (%lld)", f->path, key,
                              (unsigned long long)i, (long long)(int64_t)v);
        }
        a[i] = (uint32_t)v;
    }
    *out = a;
    *n = kv->arr_n;
    return 0;
}

int gguf_get_arr_i32(const gguf_file *f, const char *key, int32_t **out, uint64_t *n, char *err) {
    const gguf_kv *kv;
    int rc = lookup_arr(f, key, VT_BIT(GGUF_VT_INT32) | VT_BIT(GGUF_VT_UINT32), "INT32/UINT32", &kv, err);
    if (rc != 0) return rc;
    int32_t *a = dsf_xmalloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *a);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t v;
        bool neg;
        arr_int(kv, i, &v, &neg);
        if (!neg && v > INT32_MAX) {
            free(a);
            return dsf_seterr(err, "%s: key %s: element %llu (%llu) does not fit int32", f->path, key,
                              (unsigned long long)i, (unsigned long long)v);
        }
        a[i] = (int32_t)(int64_t)v;
    }
    *out = a;
    *n = kv->arr_n;
    return 0;
}

int gguf_get_arr_u64(const gguf_file *f, const char *key, uint64_t **out, uint64_t *n, char *err) {
    const gguf_kv *kv;
    int rc = lookup_arr(f, key,
                        VT_BIT(GGUF_VT_INT32) | VT_BIT(GGUF_VT_UINT32) | VT_BIT(GGUF_VT_INT64) | VT_BIT(GGUF_VT_UINT64),
                        "UINT64/INT64/UINT32/INT32", &kv, err);
    if (rc != 0) return rc;
    uint64_t *a = dsf_xmalloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *a);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        bool neg;
        arr_int(kv, i, &a[i], &neg);
        if (neg) {
            int64_t v = (int64_t)a[i];
            free(a);
            return dsf_seterr(err, "%s: key %s: element %llu is negative (%lld)", f->path, key,
                              (unsigned long long)i, (long long)v);
        }
    }
    *out = a;
    *n = kv->arr_n;
    return 0;
}

int gguf_get_arr_f32(const gguf_file *f, const char *key, float **out, uint64_t *n, char *err) {
    const gguf_kv *kv;
    int rc = lookup_arr(f, key, VT_BIT(GGUF_VT_FLOAT32), "FLOAT32", &kv, err);
    if (rc != 0) return rc;
    float *a = dsf_xmalloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *a);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint32_t u = (uint32_t)le(kv->arr_data + 4 * i, 4);
        memcpy(&a[i], &u, 4);
    }
    *out = a;
    *n = kv->arr_n;
    return 0;
}
