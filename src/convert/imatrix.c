/* imatrix.c: see imatrix.h. The file is opened with the hostile-input GGUF reader (io/gguf.c);
 * this file adds the imatrix format's own rules on top. */
#include "convert/imatrix.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct imatrix {
    gguf_file *f;
    int64_t n;
    imatrix_entry *e; /* sorted by weight name */
    char **names;
};

static const char SUM2[] = ".in_sum2", COUNTS[] = ".counts";

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n > k && !memcmp(s + n - k, suf, k);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const imatrix_entry *)a)->weight, ((const imatrix_entry *)b)->weight);
}

void imatrix_close(imatrix *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n; i++) free(m->names[i]);
    free(m->names);
    free(m->e);
    gguf_close(m->f);
    free(m);
}

int64_t imatrix_count(const imatrix *m) { return m->n; }

/* Binds the pair of weight w (its in_sum2 tensor s) into e. */
static int bind_pair(const gguf_file *f, const gguf_tensor *s, imatrix_entry *e, char *name, char *err) {
    char cn[GGUF_MAX_NAME + 16];
    snprintf(cn, sizeof cn, "%s%s", name, COUNTS);
    const gguf_tensor *c = gguf_find_tensor(f, cn);
    if (!c) return dsf_seterr(err, "tensor '%s' has no partner '%s'", s->name, cn);
    if (s->type != GGML_TYPE_F32 || c->type != GGML_TYPE_F32)
        return dsf_seterr(err, "tensors '%s' and '%s' must be F32 (got %s and %s)", s->name, cn,
                          ggml_type_name(s->type), ggml_type_name(c->type));
    if (s->n_dims > 2 || c->n_dims > 2 || c->ne[0] != 1 || c->ne[1] != s->ne[1])
        return dsf_seterr(err, "'%s' ne {%lld, %lld} and '%s' ne {%lld, %lld}: expected {n_in, n_mat} and {1, n_mat}",
                          s->name, (long long)s->ne[0], (long long)s->ne[1], cn, (long long)c->ne[0], (long long)c->ne[1]);
    e->weight = name;
    e->n_in = s->ne[0];
    e->n_mat = s->ne[1];
    e->sum2 = (const float *)(const void *)s->data;
    e->counts = (const float *)(const void *)c->data;
    return 0;
}

imatrix *imatrix_open(const char *path, char *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return NULL;
    imatrix *m = dsf_xcalloc(1, sizeof *m);
    m->f = f;
    char *type = NULL;
    int r = gguf_get_str(f, "general.type", &type, err);
    if (r == 1 || (r == 0 && strcmp(type, "imatrix"))) {
        dsf_seterr(err, "general.type is %s%s%s, not \"imatrix\" (not a llama.cpp GGUF importance matrix)",
                   type ? "\"" : "", type ? type : "absent", type ? "\"" : "");
        r = -1;
    }
    free(type);
    if (r) goto fail;
    m->e = dsf_xcalloc((size_t)f->n_tensors + 1, sizeof *m->e);
    m->names = dsf_xcalloc((size_t)f->n_tensors + 1, sizeof *m->names);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (ends_with(t->name, COUNTS)) {
            char sn[GGUF_MAX_NAME + 16];
            snprintf(sn, sizeof sn, "%.*s%s", (int)(strlen(t->name) - strlen(COUNTS)), t->name, SUM2);
            if (!gguf_find_tensor(f, sn)) {
                dsf_seterr(err, "tensor '%s' has no partner '%s'", t->name, sn);
                goto fail;
            }
            continue; /* bound with its in_sum2 */
        }
        if (!ends_with(t->name, SUM2)) {
            dsf_seterr(err, "unexpected tensor '%s' (an imatrix holds only <weight>.in_sum2 and <weight>.counts)", t->name);
            goto fail;
        }
        char *name = dsf_xstrdup(t->name);
        name[strlen(name) - strlen(SUM2)] = 0;
        m->names[m->n] = name;
        if (bind_pair(f, t, &m->e[m->n], name, err)) {
            m->n++;
            goto fail;
        }
        m->n++;
    }
    qsort(m->e, (size_t)m->n, sizeof *m->e, cmp_entry);
    return m;
fail:
    dsf_prefixerr(err, "imatrix %s", path);
    dsf_err_oneline(err); /* tensor names come from the file */
    imatrix_close(m);
    return NULL;
}

/* imatrix_find's checks; its messages quote the weight's name as given. */
static int check_entry(const imatrix_entry *x, const char *weight, int64_t n_in, int64_t n_mat, char *err) {
    if (x->n_in != n_in || x->n_mat != n_mat)
        return dsf_seterr(err, "imatrix entry '%s' covers %lld columns x %lld matrices, the weight has %lld x %lld",
                          weight, (long long)x->n_in, (long long)x->n_mat, (long long)n_in, (long long)n_mat);
    for (int64_t k = 0; k < n_mat; k++) {
        if (!isfinite(x->counts[k]) || x->counts[k] < 0)
            return dsf_seterr(err, "imatrix entry '%s': count of matrix %lld is %g", weight, (long long)k, x->counts[k]);
        for (int64_t i = 0; i < n_in; i++) {
            float v = x->sum2[k * n_in + i];
            if (!isfinite(v) || v < 0)
                return dsf_seterr(err, "imatrix entry '%s': in_sum2[%lld][%lld] is %g (must be finite and >= 0)", weight,
                                  (long long)k, (long long)i, v);
        }
    }
    return 0;
}

int imatrix_find(const imatrix *m, const char *weight, int64_t n_in, int64_t n_mat, imatrix_entry *e, char *err) {
    imatrix_entry key = {.weight = weight};
    const imatrix_entry *x = bsearch(&key, m->e, (size_t)m->n, sizeof *m->e, cmp_entry);
    if (!x) return 1;
    if (check_entry(x, weight, n_in, n_mat, err)) {
        dsf_err_oneline(err); /* the name comes from a file (the model's or the imatrix's) */
        return -1;
    }
    *e = *x;
    return 0;
}

int imatrix_row(const imatrix_entry *e, int64_t k, float *out) {
    float c = e->counts[k];
    if (c == 0) return 1;
    for (int64_t i = 0; i < e->n_in; i++) out[i] = e->sum2[k * e->n_in + i] / c;
    return 0;
}
