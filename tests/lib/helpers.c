/* helpers.c: see helpers.h. */
#include "helpers.h"

#include "test.h"
#include "base/util.h"
#include "convert/synth.h"
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
