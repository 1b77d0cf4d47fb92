/* gguf_write.c: the streaming half of gguf.h, a GGUF v3 writer (gguf-layout.md §1.1-1.2).
 *
 * Owns: serializing KVs and tensor infos, computing contiguous 32-aligned tensor offsets
 * (the reader's "offsets must be exactly contiguous" rule, §1.3), and streaming tensor data
 * to the file with zero padding between tensors.
 * Must not: hold tensor data (only a small write buffer), or accept a file that a reader
 * would refuse (duplicate keys or names, names >= 64 bytes, bad dims, ne0 not a multiple of
 * the block size, empty arrays).
 * Invariant: every tensor receives exactly its declared byte count; a write that would
 * cross into the next tensor, or a finish with a tensor short, is an error. */
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WBUF_SIZE (1u << 20)

typedef struct {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} wtensor;

struct gguf_writer {
    dsf_buf kv;          /* serialized KV pairs */
    uint64_t n_kv;
    char **keys;         /* for duplicate detection */
    wtensor *t;
    uint64_t n_t, cap_t;
    /* streaming state */
    int fd;
    char *path;
    uint8_t *buf;
    size_t buf_len;
    uint64_t cur;        /* tensor being written */
    uint64_t cur_done;   /* bytes of it written so far */
    bool begun, failed;
};

/* ---- serialization helpers ---- */

static void put_u32(dsf_buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    dsf_buf_append(b, x, 4);
}

static void put_u64(dsf_buf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    dsf_buf_append(b, x, 8);
}

static void put_str(dsf_buf *b, const char *s, uint64_t n) {
    put_u64(b, n);
    dsf_buf_append(b, s, (size_t)n);
}

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = dsf_xcalloc(1, sizeof *w);
    w->fd = -1;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    dsf_buf_free(&w->kv);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->path);
    free(w->buf);
    free(w);
}

/* Checks and records a new key, then writes its name and value type. */
static int kv_head(gguf_writer *w, const char *key, uint32_t vtype, char *err) {
    if (w->begun) return dsf_seterr(err, "gguf writer: key '%s' added after the header was written", key);
    if (!key || !key[0]) return dsf_seterr(err, "gguf writer: empty key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return dsf_seterr(err, "gguf writer: duplicate key '%s'", key);
    w->keys = dsf_xrealloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *w->keys);
    w->keys[w->n_kv++] = dsf_xstrdup(key);
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, vtype);
    return 0;
}

int gguf_writer_kv_u32(gguf_writer *w, const char *key, uint32_t v, char *err) {
    if (kv_head(w, key, GGUF_VT_UINT32, err)) return -1;
    put_u32(&w->kv, v);
    return 0;
}

int gguf_writer_kv_i32(gguf_writer *w, const char *key, int32_t v, char *err) {
    if (kv_head(w, key, GGUF_VT_INT32, err)) return -1;
    put_u32(&w->kv, (uint32_t)v);
    return 0;
}

int gguf_writer_kv_u64(gguf_writer *w, const char *key, uint64_t v, char *err) {
    if (kv_head(w, key, GGUF_VT_UINT64, err)) return -1;
    put_u64(&w->kv, v);
    return 0;
}

int gguf_writer_kv_f32(gguf_writer *w, const char *key, float v, char *err) {
    if (kv_head(w, key, GGUF_VT_FLOAT32, err)) return -1;
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(&w->kv, u);
    return 0;
}

int gguf_writer_kv_scalar(gguf_writer *w, const char *key, uint32_t vtype, const void *le_value, char *err) {
    uint32_t es = gguf_vtype_size(vtype);
    if (!es) return dsf_seterr(err, "gguf writer: key '%s': bad scalar type %u", key, vtype);
    if (kv_head(w, key, vtype, err)) return -1;
    dsf_buf_append(&w->kv, le_value, es);
    return 0;
}

int gguf_writer_kv_bool(gguf_writer *w, const char *key, bool v, char *err) {
    if (kv_head(w, key, GGUF_VT_BOOL, err)) return -1;
    uint8_t b = v ? 1 : 0;
    dsf_buf_append(&w->kv, &b, 1);
    return 0;
}

int gguf_writer_kv_str(gguf_writer *w, const char *key, const char *v, char *err) {
    if (!v) return dsf_seterr(err, "gguf writer: key '%s': NULL string", key);
    if (kv_head(w, key, GGUF_VT_STRING, err)) return -1;
    put_str(&w->kv, v, strlen(v));
    return 0;
}

int gguf_writer_kv_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                       uint64_t n, char *err) {
    uint32_t es = gguf_vtype_size(elem_type);
    if (!es) return dsf_seterr(err, "gguf writer: key '%s': bad array element type %u", key, elem_type);
    /* gguf-py refuses empty arrays (§1.1); so do we, so our files match its. */
    if (n == 0) return dsf_seterr(err, "gguf writer: key '%s': empty array", key);
    uint64_t nb;
    if (!dsf_mul_ok(n, es, &nb) || nb > ((uint64_t)1 << 40))
        return dsf_seterr(err, "gguf writer: key '%s': array too large", key);
    if (kv_head(w, key, GGUF_VT_ARRAY, err)) return -1;
    put_u32(&w->kv, elem_type);
    put_u64(&w->kv, n);
    dsf_buf_append(&w->kv, data, (size_t)nb);
    return 0;
}

int gguf_writer_kv_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                           const uint64_t *lens, uint64_t n, char *err) {
    if (n == 0) return dsf_seterr(err, "gguf writer: key '%s': empty array", key);
    if (kv_head(w, key, GGUF_VT_ARRAY, err)) return -1;
    put_u32(&w->kv, GGUF_VT_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&w->kv, strs[i], lens ? lens[i] : strlen(strs[i]));
    return 0;
}

int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, char *err) {
    if (w->begun) return dsf_seterr(err, "gguf writer: tensor '%s' added after the header was written", name);
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl >= GGUF_MAX_NAME)
        return dsf_seterr(err, "gguf writer: tensor name '%s' is empty or >= %d bytes", name ? name : "", GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return dsf_seterr(err, "gguf writer: tensor '%s': %u dims (1..%d allowed)", name, n_dims, GGUF_MAX_DIMS);
    uint32_t bs = ggml_blck_size(type), ts = ggml_type_size(type);
    if (!bs || !ts) return dsf_seterr(err, "gguf writer: tensor '%s': unknown type %u", name, type);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return dsf_seterr(err, "gguf writer: duplicate tensor '%s'", name);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1) return dsf_seterr(err, "gguf writer: tensor '%s': ne[%u] = %lld", name, d, (long long)ne[d]);
        if (!dsf_mul_ok(nel, (uint64_t)ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return dsf_seterr(err, "gguf writer: tensor '%s': element count overflows", name);
    }
    if ((uint64_t)ne[0] % bs)
        return dsf_seterr(err, "gguf writer: tensor '%s': ne0 %lld is not a multiple of the block size %u",
                          name, (long long)ne[0], bs);
    uint64_t nbytes;
    if (!dsf_mul_ok(nel / bs, ts, &nbytes)) return dsf_seterr(err, "gguf writer: tensor '%s': size overflows", name);
    /* FP8_B32's scale grid follows its rows (as gguf.c counts it): < nel / 512 more, no wrap */
    nbytes += dsf_type_extra_bytes(type, (uint64_t)ne[0], nel / (uint64_t)ne[0]);
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 256;
        w->t = dsf_xrealloc(w->t, (size_t)w->cap_t * sizeof *w->t);
    }
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = dsf_xstrdup(name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    return 0;
}

/* ---- streaming ---- */

static int flush_buf(gguf_writer *w, char *err) {
    size_t off = 0;
    while (off < w->buf_len) {
        ssize_t r = write(w->fd, w->buf + off, w->buf_len - off);
        if (r < 0) {
            if (errno == EINTR) continue;
            w->failed = true;
            return dsf_seterr(err, "%s: write failed: %s", w->path, strerror(errno));
        }
        off += (size_t)r;
    }
    w->buf_len = 0;
    return 0;
}

static int emit(gguf_writer *w, const void *p, uint64_t n, char *err) {
    const uint8_t *s = p;
    while (n) {
        if (w->buf_len == WBUF_SIZE && flush_buf(w, err)) return -1;
        size_t c = WBUF_SIZE - w->buf_len;
        if (c > n) c = (size_t)n;
        memcpy(w->buf + w->buf_len, s, c);
        w->buf_len += c;
        s += c;
        n -= c;
    }
    return 0;
}

static int emit_zeros(gguf_writer *w, uint64_t n, char *err) {
    static const uint8_t z[GGUF_DEFAULT_ALIGNMENT];
    while (n) {
        uint64_t c = n < sizeof z ? n : sizeof z;
        if (emit(w, z, c, err)) return -1;
        n -= c;
    }
    return 0;
}

static uint64_t pad_to(uint64_t x) {
    return (GGUF_DEFAULT_ALIGNMENT - x % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT;
}

int gguf_writer_begin(gguf_writer *w, const char *path, char *err) {
    if (w->begun) return dsf_seterr(err, "gguf writer: begin called twice");
    /* Offsets: contiguous, each tensor padded to the alignment (gguf-layout.md §1.3). */
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t end;
        if (!dsf_add_ok(off, w->t[i].nbytes, &end) || !dsf_add_ok(end, pad_to(end), &off))
            return dsf_seterr(err, "gguf writer: total tensor size overflows");
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return dsf_seterr(err, "%s: cannot create: %s", path, strerror(errno));
    w->path = dsf_xstrdup(path);
    w->buf = dsf_xmalloc(WBUF_SIZE);
    w->begun = true;

    dsf_buf h = {0};
    dsf_buf_append(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv);
    int rc = emit(w, h.data, h.len, err);
    uint64_t pos = h.len;
    dsf_buf_free(&h);
    if (rc || emit(w, w->kv.data, w->kv.len, err)) return -1;
    pos += w->kv.len;
    dsf_buf ti = {0};
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(&ti, t->name, strlen(t->name));
        put_u32(&ti, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&ti, (uint64_t)t->ne[d]);
        put_u32(&ti, t->type);
        put_u64(&ti, t->offset);
    }
    rc = emit(w, ti.data, ti.len, err);
    pos += ti.len;
    dsf_buf_free(&ti);
    if (rc) return -1;
    if (w->n_t && emit_zeros(w, pad_to(pos), err)) return -1;
    w->cur = 0;
    w->cur_done = 0;
    return 0;
}

/* Pads the finished tensor and moves on to the next one (skipping empty ones). */
static int advance(gguf_writer *w, char *err) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        if (emit_zeros(w, pad_to(w->t[w->cur].nbytes), err)) return -1;
        w->cur++;
        w->cur_done = 0;
    }
    return 0;
}

int gguf_writer_write(gguf_writer *w, const void *data, uint64_t n, char *err) {
    if (!w->begun || w->failed) return dsf_seterr(err, "gguf writer: write before begin or after a failure");
    if (n == 0) return 0;
    if (advance(w, err)) return -1;
    if (w->cur >= w->n_t)
        return dsf_seterr(err, "gguf writer: %llu bytes written past the last tensor", (unsigned long long)n);
    const wtensor *t = &w->t[w->cur];
    uint64_t left = t->nbytes - w->cur_done;
    if (n > left) {
        w->failed = true;
        return dsf_seterr(err, "gguf writer: tensor '%s': write of %llu bytes exceeds the %llu bytes left of %llu declared",
                          t->name, (unsigned long long)n, (unsigned long long)left,
                          (unsigned long long)t->nbytes);
    }
    if (emit(w, data, n, err)) return -1;
    w->cur_done += n;
    return advance(w, err);
}

/* Flushes, fsyncs and closes the output. */
static int close_out(gguf_writer *w, char *err) {
    if (flush_buf(w, err)) return -1;
    if (fsync(w->fd) != 0 && errno != EINVAL && errno != EROFS) {
        w->failed = true;
        return dsf_seterr(err, "%s: fsync failed: %s", w->path, strerror(errno));
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        w->failed = true;
        return dsf_seterr(err, "%s: close failed: %s", w->path, strerror(errno));
    }
    return 0;
}

int gguf_writer_finish(gguf_writer *w, char *err) {
    if (!w->begun || w->failed) return dsf_seterr(err, "gguf writer: finish before begin or after a failure");
    if (advance(w, err)) return -1;
    if (w->cur < w->n_t) {
        w->failed = true;
        return dsf_seterr(err, "gguf writer: tensor '%s': %llu of %llu bytes written", w->t[w->cur].name,
                          (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
    }
    return close_out(w, err);
}

int gguf_writer_finish_header(gguf_writer *w, char *err) {
    if (!w->begun || w->failed || w->cur || w->cur_done)
        return dsf_seterr(err, "gguf writer: header-only finish needs begin and no tensor data");
    return close_out(w, err);
}

/* A KV of a file read by gguf.c, as that file had it (quantize, the tests' file edits). */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv, char *err) {
    switch (kv->type) {
    case GGUF_VT_STRING: {
        if (memchr(kv->str.ptr, 0, kv->str.len))
            return dsf_seterr(err, "key '%s': a string with a NUL byte cannot be copied", kv->key);
        char *s = dsf_xmalloc(kv->str.len + 1);
        memcpy(s, kv->str.ptr, kv->str.len);
        s[kv->str.len] = 0;
        int r = gguf_writer_kv_str(w, kv->key, s, err);
        free(s);
        return r;
    }
    case GGUF_VT_ARRAY:
        if (kv->arr_type != GGUF_VT_STRING) return gguf_writer_kv_arr(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_n, err);
        {
            const char **s = dsf_xmalloc((size_t)(kv->arr_n + 1) * sizeof *s);
            uint64_t *len = dsf_xmalloc((size_t)(kv->arr_n + 1) * sizeof *len);
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                s[i] = kv->strs[i].ptr;
                len[i] = kv->strs[i].len;
            }
            int r = kv->arr_n ? gguf_writer_kv_arr_str(w, kv->key, s, len, kv->arr_n, err)
                              : dsf_seterr(err, "key '%s': an empty array cannot be written", kv->key);
            free(s);
            free(len);
            return r;
        }
    default: {
        /* the value as the file had it: little-endian, the type's width (x86-64 and the
         * reader are little-endian) */
        uint8_t b[8];
        float f32 = (float)kv->f;
        bool sgn = kv->type == GGUF_VT_INT8 || kv->type == GGUF_VT_INT16 || kv->type == GGUF_VT_INT32 ||
                   kv->type == GGUF_VT_INT64;
        if (kv->type == GGUF_VT_FLOAT32) memcpy(b, &f32, 4);
        else if (kv->type == GGUF_VT_FLOAT64) memcpy(b, &kv->f, 8);
        else if (sgn) memcpy(b, &kv->i, 8);
        else memcpy(b, &kv->u, 8);
        return gguf_writer_kv_scalar(w, kv->key, kv->type, b, err);
    }
    }
}
