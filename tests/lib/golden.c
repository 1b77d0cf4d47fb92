/* golden.c: see golden.h. */
#include "golden.h"

#include "test.h"
#include "dsflash.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int golden_load(const char *name, golden *g) {
    char rel[256];
    snprintf(rel, sizeof rel, GDIR "%s.json", name);
    const char *p = test_shared(rel);
    if (!p) return -1;
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) return -1;
    json_t *toks = json_object_get(j, "tokens");
    g->n = (int)json_array_size(toks);
    g->vocab = (int)json_integer_value(json_object_get(j, "vocab"));
    g->tokens = malloc((size_t)g->n * sizeof(int32_t));
    for (int i = 0; i < g->n; i++) g->tokens[i] = (int32_t)json_integer_value(json_array_get(toks, (size_t)i));
    json_decref(j);
    snprintf(rel, sizeof rel, GDIR "%s.f32", name);
    p = test_shared(rel);
    FILE *f = p ? fopen(p, "rb") : NULL;
    if (!f) return -1;
    g->gold = malloc((size_t)g->n * (size_t)g->vocab * sizeof(float));
    size_t got = fread(g->gold, sizeof(float), (size_t)g->n * (size_t)g->vocab, f);
    fclose(f);
    return got == (size_t)g->n * (size_t)g->vocab ? 0 : -1;
}

void golden_free(golden *g) {
    free(g->tokens);
    free(g->gold);
}

cmp_stats golden_compare(const float *a, const float *gold, int rows, int V, double atol) {
    cmp_stats st = {0, 0, 0, 0};
    double sum = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * V, *g = gold + (size_t)r * V;
        double rmax = 0;
        int ax = 0, ag = 0;
        for (int i = 0; i < V; i++) {
            double d = fabs((double)x[i] - g[i]);
            if (!(d == d)) d = INFINITY;
            if (d > rmax) rmax = d;
            sum += d;
            if (x[i] > x[ax]) ax = i;
            if (g[i] > g[ag]) ag = i;
        }
        if (rmax > st.max_abs) st.max_abs = rmax;
        if (rmax > atol) st.bad_rows++;
        if (ax != ag && g[ax] < g[ag] - atol) st.top1_miss++;
    }
    st.mean_abs = sum / ((double)rows * V);
    return st;
}

float *golden_run(dsf_engine *e, const int32_t *tok, int n, int chunk, char *err) {
    int V = dsf_engine_n_vocab(e);
    float *out = malloc((size_t)n * (size_t)V * sizeof(float));
    dsf_session *s = dsf_session_new(e, n, err);
    if (!s) {
        free(out);
        return NULL;
    }
    if (!chunk) chunk = n;
    for (int i = 0; i < n; i += chunk) {
        int m = n - i < chunk ? n - i : chunk;
        if (dsf_session_eval(s, tok + i, m, out + (size_t)i * V, true, err) < 0) {
            free(out);
            dsf_session_free(s);
            return NULL;
        }
    }
    dsf_session_free(s);
    return out;
}
