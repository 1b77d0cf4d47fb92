/* helpers.c: see helpers.h. */
#include "helpers.h"

#include "test.h"
#include "base/util.h"
#include "convert/synth.h"
#include "io/gguf.h"
#include "text/pyjson.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>

json_t *test_load_json(const char *path) {
    uint8_t *d = NULL;
    size_t n = 0;
    char err[DSF_ERR_LEN];
    if (dsf_read_file(path, &d, &n, err)) return NULL;
    json_t *v = pyjson_loads((const char *)d, n, err); /* Python semantics: key order, floats */
    free(d);
    return v;
}

json_t *test_chat_cases(char *missing, size_t cap) {
    static const char *const files[] = {
        "fixtures/chat/official_test_encoding_assertions.json", "fixtures/chat/official_kiojuvr_encoding_fixtures.json",
        "fixtures/chat/official_vllm_reference_encoder.json", "fixtures/chat/generated_reconstructed_edge_cases.json"};
    json_t *all = json_array();
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        const char *path = test_shared(files[f]);
        json_t *fx = path ? test_load_json(path) : NULL;
        if (!json_is_array(json_object_get(fx, "cases"))) {
            snprintf(missing, cap, "%s", files[f]);
            json_decref(fx);
            json_decref(all);
            return NULL;
        }
        json_array_extend(all, json_object_get(fx, "cases"));
        json_decref(fx);
    }
    return all;
}

unsigned char *test_slurp(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = *size > 0 ? malloc((size_t)*size) : NULL;
    if (buf && fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

const char *test_tmpfile(const char *name) {
    static char p[4][512];
    static int k;
    char *s = p[k++ & 3];
    snprintf(s, 512, "%s/%s", test_tmpdir(), name);
    return s;
}

const char *test_synth_tiny(char *path, size_t cap, const char *file, uint64_t seed) {
    if (!path[0]) {
        char err[DSF_ERR_LEN];
        snprintf(path, cap, "%s/%s", test_tmpdir(), file);
        if (synth_write("tiny", path, seed, err) < 0) {
            fprintf(stderr, "synth: %s\n", err);
            path[0] = 0;
            return NULL;
        }
    }
    return path;
}

void test_fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? " %d" : "%d", ids[i]);
}

bool test_ids_equal_json(const int32_t *ids, size_t n, json_t *arr) {
    if (!json_is_array(arr) || json_array_size(arr) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i]) return false;
    return true;
}

int test_copy_head(const char *src, uint64_t n, const char *dst) {
    long size = 0;
    unsigned char *buf = test_slurp(src, &size);
    FILE *fp = buf && (uint64_t)size >= n ? fopen(dst, "wb") : NULL;
    int ok = fp && fwrite(buf, 1, (size_t)n, fp) == (size_t)n;
    if (fp && fclose(fp)) ok = 0;
    free(buf);
    return ok ? 0 : -1;
}

dsf_engine *test_open_numerics(const char *path, dsf_numerics num, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = num;
    ep.n_threads = 2;
    return dsf_engine_open(path, &ep, err);
}

int test_gen_open(test_gen_fx *f, const char *path, int max_ctx) {
    char err[DSF_ERR_LEN];
    memset(f, 0, sizeof *f);
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    if (!path || !(f->e = dsf_engine_open(path, &ep, err))) return -1;
    if (!(f->tok = dsf_tokenizer_load(path, err))) return -1;
    if (!(f->s = dsf_session_new(f->e, max_ctx, err))) return -1;
    if (!(f->g = dsf_gen_new(f->e, f->s, f->tok, err))) return -1;
    return 0;
}

void test_gen_close(test_gen_fx *f) {
    dsf_gen_free(f->g);
    dsf_session_free(f->s);
    dsf_tokenizer_free(f->tok);
    dsf_engine_close(f->e);
    memset(f, 0, sizeof *f);
}

static uint32_t vt_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    default: return 8;
    }
}

static bool kv_value_same(const gguf_kv *x, const gguf_kv *y) {
    if (x->type == GGUF_VT_STRING) return x->str.len == y->str.len && !memcmp(x->str.ptr, y->str.ptr, x->str.len);
    if (x->type != GGUF_VT_ARRAY) return x->u == y->u && x->i == y->i && (x->f == y->f || (x->f != x->f && y->f != y->f));
    if (x->arr_type != y->arr_type || x->arr_n != y->arr_n) return false;
    if (x->arr_type != GGUF_VT_STRING) return !memcmp(x->arr_data, y->arr_data, x->arr_n * vt_size(x->arr_type));
    for (uint64_t j = 0; j < x->arr_n; j++)
        if (x->strs[j].len != y->strs[j].len || memcmp(x->strs[j].ptr, y->strs[j].ptr, x->strs[j].len)) return false;
    return true;
}

int test_gguf_same(const gguf_file *a, const gguf_file *b, int flags, const char *skip, char *msg, size_t cap) {
    if (a->n_kv != b->n_kv) return snprintf(msg, cap, "KV count %llu vs %llu", (unsigned long long)a->n_kv, (unsigned long long)b->n_kv), -1;
    if (a->n_tensors != b->n_tensors)
        return snprintf(msg, cap, "tensor count %llu vs %llu", (unsigned long long)a->n_tensors, (unsigned long long)b->n_tensors), -1;
    for (uint64_t i = 0; i < a->n_kv; i++) {
        const gguf_kv *x = &a->kv[i], *y = gguf_find_kv(b, x->key);
        if (!y) return snprintf(msg, cap, "key %s missing", x->key), -1;
        if ((flags & TG_ORDER) && y != &b->kv[i])
            return snprintf(msg, cap, "key %s: at position %llu, not %llu", x->key, (unsigned long long)(y - b->kv),
                            (unsigned long long)i), -1;
        if (x->type != y->type) return snprintf(msg, cap, "key %s: type %u vs %u", x->key, x->type, y->type), -1;
        if ((!skip || strcmp(skip, x->key)) && !kv_value_same(x, y)) return snprintf(msg, cap, "key %s: values differ", x->key), -1;
    }
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        if (!y) return snprintf(msg, cap, "tensor %s missing", x->name), -1;
        if ((flags & TG_ORDER) && y != &b->tensors[i])
            return snprintf(msg, cap, "tensor %s: at position %llu, not %llu", x->name,
                            (unsigned long long)(y - b->tensors), (unsigned long long)i), -1;
        if (x->type != y->type || x->n_dims != y->n_dims) return snprintf(msg, cap, "tensor %s: type/dims differ", x->name), -1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (x->ne[d] != y->ne[d]) return snprintf(msg, cap, "tensor %s: ne[%d] %lld vs %lld", x->name, d, (long long)x->ne[d], (long long)y->ne[d]), -1;
        if (x->nbytes != y->nbytes || ((flags & TG_DATA) && memcmp(x->data, y->data, x->nbytes)))
            return snprintf(msg, cap, "tensor %s: data differs", x->name), -1;
    }
    return 0;
}

char *test_base64(const uint8_t *p, size_t n) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    dsf_buf b = {0};
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {al[v >> 18], al[(v >> 12) & 63], i + 1 < n ? al[(v >> 6) & 63] : '=', i + 2 < n ? al[v & 63] : '='};
        dsf_buf_append(&b, q, 4);
    }
    dsf_buf_append(&b, "", 1);
    return (char *)b.data;
}
