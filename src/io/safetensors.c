/* safetensors.c: see safetensors.h. Owns header parsing and validation, the shard index,
 * name lookup and bounded reads. Never maps or holds tensor data. */
#include "io/safetensors.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Real shard headers are a few hundred KB; anything near this is not a checkpoint. */
#define ST_MAX_HEADER ((uint64_t)256 << 20)

typedef struct {
    char *path;
    int fd;
    uint64_t size;
} st_shard;

struct st_checkpoint {
    st_shard *shards;
    int n_shards;
    st_tensor *t;
    int n, cap;
    int *by_name; /* indices into t sorted by name */
};

static const struct { const char *name; uint32_t size; } k_dtypes[ST_DTYPE_COUNT] = {
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E8M0] = {"F8_E8M0", 1}, [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_F32] = {"F32", 4},
};

const char *st_dtype_name(int dtype) {
    return dtype >= 0 && dtype < ST_DTYPE_COUNT ? k_dtypes[dtype].name : "?";
}

uint32_t st_dtype_size(int dtype) {
    return dtype >= 0 && dtype < ST_DTYPE_COUNT ? k_dtypes[dtype].size : 0;
}

void st_close(st_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_shards; i++) {
        if (c->shards[i].fd >= 0) close(c->shards[i].fd);
        free(c->shards[i].path);
    }
    free(c->shards);
    for (int i = 0; i < c->n; i++) free((char *)c->t[i].name);
    free(c->t);
    free(c->by_name);
    free(c);
}

int st_count(const st_checkpoint *c) { return c->n; }
const st_tensor *st_at(const st_checkpoint *c, int i) { return i >= 0 && i < c->n ? &c->t[i] : NULL; }

static int cmp_name(const void *a, const void *b, void *ctx) {
    const st_checkpoint *c = ctx;
    return strcmp(c->t[*(const int *)a].name, c->t[*(const int *)b].name);
}

const st_tensor *st_find(const st_checkpoint *c, const char *name) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int r = strcmp(c->t[c->by_name[mid]].name, name);
        if (r == 0) return &c->t[c->by_name[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

static int pread_all(int fd, void *buf, uint64_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n) {
        size_t c = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
        ssize_t r = pread(fd, p, c, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) {
            errno = 0;
            return -1; /* EOF: truncated */
        }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int st_read(const st_checkpoint *c, const st_tensor *t, uint64_t off, uint64_t n, void *buf, char *err) {
    uint64_t end;
    if (!dsf_add_ok(off, n, &end) || end > t->nbytes)
        return dsf_seterr(err, "tensor '%s': read [%llu, +%llu) outside its %llu bytes", t->name,
                          (unsigned long long)off, (unsigned long long)n, (unsigned long long)t->nbytes);
    const st_shard *s = &c->shards[t->shard];
    if (pread_all(s->fd, buf, n, t->offset + off) != 0)
        return dsf_seterr(err, "%s: tensor '%s': read failed: %s", s->path, t->name,
                          errno ? strerror(errno) : "file is shorter than its header says (truncated)");
    return 0;
}

void st_release(const st_checkpoint *c, const st_tensor *t, uint64_t off, uint64_t n) {
    (void)posix_fadvise(c->shards[t->shard].fd, (off_t)(t->offset + off), (off_t)n, POSIX_FADV_DONTNEED);
}

/* ---- header parsing ---- */

static int parse_dtype(const char *s) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(s, k_dtypes[i].name)) return i;
    return -1;
}

static bool get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

typedef struct { uint64_t b, e; int i; } range;
static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : x->e < y->e ? -1 : x->e > y->e;
}

/* Parses one shard's header and appends its tensors to c. */
static int load_shard(st_checkpoint *c, int si, char *err) {
    st_shard *s = &c->shards[si];
    s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) return dsf_seterr(err, "%s: cannot open: %s", s->path, strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return dsf_seterr(err, "%s: not a regular file", s->path);
    s->size = (uint64_t)st.st_size;
    uint8_t lenb[8];
    if (s->size < 8 || pread_all(s->fd, lenb, 8, 0) != 0)
        return dsf_seterr(err, "%s: too short for a safetensors header (%llu bytes)", s->path,
                          (unsigned long long)s->size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)lenb[i] << (8 * i);
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > s->size - 8)
        return dsf_seterr(err, "%s: header length %llu is absurd (file has %llu bytes)", s->path,
                          (unsigned long long)hlen, (unsigned long long)s->size);
    char *hbuf = dsf_xmalloc((size_t)hlen);
    if (pread_all(s->fd, hbuf, hlen, 8) != 0) {
        free(hbuf);
        return dsf_seterr(err, "%s: cannot read the header", s->path);
    }
    json_error_t jerr;
    json_t *root = json_loadb(hbuf, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    free(hbuf);
    if (!root) return dsf_seterr(err, "%s: bad JSON header: %s (at byte %d)", s->path, jerr.text, jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return dsf_seterr(err, "%s: the header is not a JSON object", s->path);
    }
    uint64_t data0 = 8 + hlen, data_size = s->size - data0;
    int first = c->n;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        if (!key[0] || strlen(key) > 1024) { rc = dsf_seterr(err, "%s: bad tensor name", s->path); break; }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            rc = dsf_seterr(err, "%s: tensor '%s': entry needs dtype, shape and data_offsets [begin, end]", s->path, key);
            break;
        }
        int dt = parse_dtype(json_string_value(jd));
        if (dt < 0) {
            rc = dsf_seterr(err, "%s: tensor '%s': unknown dtype '%s'", s->path, key, json_string_value(jd));
            break;
        }
        size_t nd = json_array_size(js);
        if (nd > ST_MAX_DIMS) { rc = dsf_seterr(err, "%s: tensor '%s': %zu dims", s->path, key, nd); break; }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 256;
            c->t = dsf_xrealloc(c->t, (size_t)c->cap * sizeof *c->t);
        }
        st_tensor *t = &c->t[c->n];
        memset(t, 0, sizeof *t);
        t->dtype = dt;
        t->n_dims = (int)nd;
        t->shard = si;
        uint64_t nel = 1, b, e;
        bool ok = true;
        for (size_t d = 0; d < nd && ok; d++) {
            uint64_t x = 0;
            ok = get_u64(json_array_get(js, d), &x) && x <= (uint64_t)INT64_MAX && dsf_mul_ok(nel, x, &nel);
            t->shape[d] = (int64_t)x;
        }
        if (!ok) { rc = dsf_seterr(err, "%s: tensor '%s': bad shape", s->path, key); break; }
        if (!get_u64(json_array_get(jo, 0), &b) || !get_u64(json_array_get(jo, 1), &e) || b > e) {
            rc = dsf_seterr(err, "%s: tensor '%s': bad data_offsets", s->path, key);
            break;
        }
        if (e > data_size) {
            rc = dsf_seterr(err, "%s: tensor '%s': data [%llu, %llu) runs past the end of the file "
                            "(data section has %llu bytes; truncated?)", s->path, key,
                            (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
            break;
        }
        uint64_t nb;
        if (!dsf_mul_ok(nel, k_dtypes[dt].size, &nb) || nb != e - b) {
            rc = dsf_seterr(err, "%s: tensor '%s': %llu bytes of data for %llu elements of %s", s->path, key,
                            (unsigned long long)(e - b), (unsigned long long)nel, k_dtypes[dt].name);
            break;
        }
        t->nelem = nel;
        t->nbytes = nb;
        t->offset = data0 + b;
        t->name = dsf_xstrdup(key);
        c->n++;
    }
    json_decref(root);
    if (rc) return -1;
    /* Ranges must not overlap (safetensors requires disjoint tensors). */
    int nt = c->n - first;
    range *r = dsf_xmalloc((size_t)(nt ? nt : 1) * sizeof *r);
    for (int i = 0; i < nt; i++) r[i] = (range){c->t[first + i].offset, c->t[first + i].offset + c->t[first + i].nbytes, first + i};
    qsort(r, (size_t)nt, sizeof *r, cmp_range);
    int prev = -1; /* the range with the largest end so far */
    for (int i = 0; i < nt; i++) {
        if (r[i].e == r[i].b) continue; /* empty tensors occupy nothing */
        if (prev >= 0 && r[i].b < r[prev].e) {
            rc = dsf_seterr(err, "%s: tensors '%s' and '%s' overlap in the data section", s->path,
                            c->t[r[prev].i].name, c->t[r[i].i].name);
            break;
        }
        if (prev < 0 || r[i].e > r[prev].e) prev = i;
    }
    free(r);
    return rc;
}

static int finish_index(st_checkpoint *c, char *err) {
    c->by_name = dsf_xmalloc((size_t)(c->n ? c->n : 1) * sizeof *c->by_name);
    for (int i = 0; i < c->n; i++) c->by_name[i] = i;
    qsort_r(c->by_name, (size_t)c->n, sizeof *c->by_name, cmp_name, c);
    for (int i = 1; i < c->n; i++)
        if (!strcmp(c->t[c->by_name[i]].name, c->t[c->by_name[i - 1]].name))
            return dsf_seterr(err, "tensor '%s' appears twice in the checkpoint", c->t[c->by_name[i]].name);
    return 0;
}

st_checkpoint *st_open_file(const char *path, char *err) {
    st_checkpoint *c = dsf_xcalloc(1, sizeof *c);
    c->shards = dsf_xcalloc(1, sizeof *c->shards);
    c->n_shards = 1;
    c->shards[0].path = dsf_xstrdup(path);
    c->shards[0].fd = -1;
    if (load_shard(c, 0, err) || finish_index(c, err)) {
        dsf_err_oneline(err); /* names in messages come from the file */
        st_close(c);
        return NULL;
    }
    return c;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

st_checkpoint *st_open_dir(const char *dir, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (stat(path, &st) != 0) {
            dsf_seterr(err, "%s: neither model.safetensors.index.json nor model.safetensors found", dir);
            return NULL;
        }
        return st_open_file(path, err);
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        dsf_seterr(err, "%s: bad JSON: %s (line %d)", path, jerr.text, jerr.line);
        dsf_err_oneline(err);
        return NULL;
    }
    json_t *wm = json_object_get(root, "weight_map");
    st_checkpoint *c = NULL;
    const char **files = NULL;
    size_t nf = 0;
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        dsf_seterr(err, "%s: no weight_map object", path);
        goto fail;
    }
    files = dsf_xmalloc(json_object_size(wm) * sizeof *files);
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        /* Shard names come from the file: plain names only, nothing outside dir. */
        if (!f || !f[0] || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")) {
            dsf_seterr(err, "%s: tensor '%s': bad shard name", path, key);
            goto fail;
        }
        files[nf++] = f;
    }
    qsort(files, nf, sizeof *files, cmp_str);
    size_t nu = 0;
    for (size_t i = 0; i < nf; i++)
        if (nu == 0 || strcmp(files[nu - 1], files[i])) files[nu++] = files[i];
    c = dsf_xcalloc(1, sizeof *c);
    c->shards = dsf_xcalloc(nu, sizeof *c->shards);
    for (size_t i = 0; i < nu; i++) {
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, files[i]);
        c->shards[i].path = dsf_xstrdup(sp);
        c->shards[i].fd = -1;
        c->n_shards = (int)i + 1;
        if (stat(sp, &st) != 0) {
            dsf_seterr(err, "%s: names shard '%s', which is missing", path, files[i]);
            goto fail;
        }
        if (load_shard(c, (int)i, err)) goto fail;
    }
    /* Every shard tensor must be assigned to that shard by the index, and vice versa. */
    for (int i = 0; i < c->n; i++) {
        const char *f = json_string_value(json_object_get(wm, c->t[i].name));
        if (!f || strcmp(f, files[c->t[i].shard])) {
            dsf_seterr(err, "%s: holds tensor '%s', which the index %s", c->shards[c->t[i].shard].path,
                       c->t[i].name, f ? "assigns to another shard" : "does not list");
            goto fail;
        }
    }
    if (finish_index(c, err)) goto fail;
    json_object_foreach(wm, key, val) {
        if (!st_find(c, key)) {
            dsf_seterr(err, "%s: names tensor '%s' in shard '%s', which lacks it", path, key, json_string_value(val));
            goto fail;
        }
    }
    free(files);
    json_decref(root);
    return c;
fail:
    dsf_err_oneline(err);
    free(files);
    json_decref(root);
    st_close(c);
    return NULL;
}
