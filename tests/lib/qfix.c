/* qfix.c: the quantization fixtures (see qfix.h). */
#include "qfix.h"
#include "helpers.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *path_of(const char *file) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/quants/%s", file);
    return test_shared(rel);
}

int qfix_types(char names[][16], int cap) {
    const char *p = path_of("index.json");
    json_t *j = p ? test_load_json(p) : NULL;
    json_t *types = j ? json_object_get(j, "types") : NULL;
    int n = 0;
    const char *k;
    json_t *v;
    if (types) json_object_foreach(types, k, v) {
            if (n < cap && strlen(k) < 16) snprintf(names[n++], 16, "%s", k);
        }
    json_decref(j);
    return n;
}

static void *slurp_type(const char *name, const char *suffix, long *size) {
    char file[64];
    snprintf(file, sizeof file, "%s%s", name, suffix);
    const char *p = path_of(file);
    return p ? test_slurp(p, size) : NULL;
}

bool qfix_load(const char *name, qfix *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    char file[64];
    snprintf(file, sizeof file, "%s.json", name);
    const char *jp = path_of(file), *ip = path_of("index.json");
    json_t *j = jp ? test_load_json(jp) : NULL, *ix = ip ? test_load_json(ip) : NULL;
    bool ok = false;
    long qn = 0, dn = 0, rqn = 0, rdn = 0;
    if (!j || !ix) goto done;
    f->id = (uint32_t)json_integer_value(json_object_get(j, "ggml_type_id"));
    f->bs = (uint32_t)json_integer_value(json_object_get(j, "block_size"));
    f->ts = (uint32_t)json_integer_value(json_object_get(j, "bytes_per_block"));
    json_t *rows = json_object_get(ix, "rows");
    if (!f->bs || !f->ts || json_array_size(rows) != QFIX_ROWS) goto done;
    for (int r = 0; r < QFIX_ROWS; r++) {
        f->row_len[r] = json_integer_value(json_object_get(json_array_get(rows, (size_t)r), "len"));
        if (f->row_len[r] <= 0 || f->row_len[r] % f->bs) goto done;
        f->n_values += f->row_len[r];
    }
    f->q = slurp_type(name, ".q", &qn);
    f->deq = slurp_type(name, ".deq.f32", &dn);
    f->rq = slurp_type(name, ".rand.q", &rqn);
    f->rdeq = slurp_type(name, ".rand.deq.f32", &rdn);
    if (!f->q || !f->deq || !f->rq || !f->rdeq) goto done;
    f->rn = rqn / f->ts * f->bs;
    ok = qn == f->n_values / f->bs * f->ts && dn == f->n_values * 4 && rqn % f->ts == 0 && rdn == f->rn * 4;
done:
    json_decref(j);
    json_decref(ix);
    if (!ok) qfix_free(f);
    return ok;
}

void qfix_free(qfix *f) {
    free(f->q);
    free(f->deq);
    free(f->rq);
    free(f->rdeq);
    f->q = f->rq = NULL;
    f->deq = f->rdeq = NULL;
}

int64_t qfix_row_values_at(const qfix *f, int r) {
    int64_t v = 0;
    for (int i = 0; i < r; i++) v += f->row_len[i];
    return v;
}

int64_t qfix_row_bytes_at(const qfix *f, int r) { return qfix_row_values_at(f, r) / f->bs * f->ts; }

int64_t qfix_wblocks(const qfix *f) { return (f->row_len[0] + f->row_len[4] + f->row_len[5]) / f->bs; }

/* Block k of the run as (row, block in row). */
static int64_t run_block(const qfix *f, int64_t k, int *row) {
    k %= qfix_wblocks(f);
    const int64_t b0 = f->row_len[0] / f->bs, b4 = f->row_len[4] / f->bs;
    if (k < b0) return *row = 0, k;
    if (k < b0 + b4) return *row = 4, k - b0;
    return *row = 5, k - b0 - b4;
}

const uint8_t *qfix_wblock(const qfix *f, int64_t k) {
    int r;
    int64_t b = run_block(f, k, &r);
    return f->q + qfix_row_bytes_at(f, r) + b * f->ts;
}

const float *qfix_wvalues(const qfix *f, int64_t k) {
    int r;
    int64_t b = run_block(f, k, &r);
    return f->deq + qfix_row_values_at(f, r) + b * f->bs;
}
