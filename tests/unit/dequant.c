/* dequant.c: the block decoders (kernels/dequant.c) and the dequantizing matmul twins against
 * ggml 0.25.1's own outputs, the fixtures of ../shared/testdata/quants (its README.md says how
 * they were made). Every expected value comes from those files: ggml's to_float output
 * (TYPE.deq.f32, TYPE.rand.deq.f32) and its vec_dot results beside the exact dots
 * (TYPE.dot.f32: [ggml vec_dot, exact(deqW.deqA), sum|deqW.deqA|, exact(deqW.x), sum|deqW.x|]).
 *
 * Guards against: a wrong layout (nibble or bit order, scale packing, grid index bits, sign
 * masks, the IQ1 delta, the TQ1_0 digit order), a wrong lookup-table entry (the crafted
 * TYPE.rand.q blocks read every grid entry, sign selector and scale code), the sign of zero
 * lost by multiplying integers first, flushed subnormals, a twin (matmul_any_ref,
 * matmul_xbf16_any_ref) that cannot take a type or its block size, and a SIMD table whose entry
 * for a type disagrees with the twin or breaks batch invariance.
 *
 * All tests skip (NEED_SHARED) when ../shared/testdata/quants is absent. */
#include "test.h"
#include "helpers.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/select.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QDIR "testdata/quants/"
#define MAX_ROWS 8

/* The fixture rows (index.json) and the activations (act.f32), shared by every type. */
typedef struct {
    json_t *index;
    int n_rows;
    int64_t len[MAX_ROWS], off[MAX_ROWS]; /* values per row, offset of the row in values */
    float *act;                           /* [sum len] act.f32 */
} fixtures;

/* One type of index.json with its TYPE.json row sizes. */
typedef struct {
    const char *name;
    uint32_t id, vdt;                /* ggml id; vec_dot type id (UINT32_MAX: none) */
    int64_t row_bytes[MAX_ROWS];
} qtype;

static unsigned char *slurp_q(const char *file, long *size) {
    char rel[128];
    snprintf(rel, sizeof rel, QDIR "%s", file);
    const char *p = test_shared(rel);
    return p ? test_slurp(p, size) : NULL;
}

static void fix_free(fixtures *f) {
    json_decref(f->index);
    free(f->act);
}

/* Loads index.json and act.f32; returns an error text or NULL. */
static const char *fix_load(fixtures *f) {
    memset(f, 0, sizeof *f);
    const char *index_path = test_shared(QDIR "index.json"); /* a rotating buffer: used at once */
    f->index = index_path ? test_load_json(index_path) : NULL;
    if (!f->index) return "index.json does not parse";
    json_t *rows = json_object_get(f->index, "rows");
    if (!json_is_array(rows) || json_array_size(rows) == 0 || json_array_size(rows) > MAX_ROWS)
        return "index.json: rows";
    f->n_rows = (int)json_array_size(rows);
    int64_t total = 0;
    for (int r = 0; r < f->n_rows; r++) {
        json_t *row = json_array_get(rows, (size_t)r);
        f->len[r] = json_integer_value(json_object_get(row, "len"));
        f->off[r] = json_integer_value(json_object_get(row, "offset_values"));
        if (f->off[r] != total || f->len[r] <= 0 || f->len[r] % 256) return "index.json: row offsets";
        total += f->len[r];
    }
    long sz = 0;
    f->act = (float *)slurp_q("act.f32", &sz);
    if (!f->act || sz != total * 4) return "act.f32: missing or wrong size";
    return NULL;
}

static uint32_t type_id_by_name(const char *name) {
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++)
        if (strcmp(ggml_type_name(id), name) == 0) return id;
    return UINT32_MAX;
}

/* Fills q from index.json's entry and TYPE.json; returns an error text or NULL. */
static const char *type_load(const fixtures *f, const char *name, json_t *entry, qtype *q, char *err, size_t cap) {
    memset(q, 0, sizeof *q);
    q->name = name;
    q->id = (uint32_t)json_integer_value(json_object_get(entry, "id"));
    uint32_t bs = (uint32_t)json_integer_value(json_object_get(entry, "block_size"));
    uint32_t ts = (uint32_t)json_integer_value(json_object_get(entry, "type_size"));
    if (strcmp(ggml_type_name(q->id), name) != 0 || ggml_blck_size(q->id) != bs || ggml_type_size(q->id) != ts) {
        snprintf(err, cap, "%s: id %u is %s with %u/%u, fixture says %u/%u", name, q->id, ggml_type_name(q->id),
                 ggml_blck_size(q->id), ggml_type_size(q->id), bs, ts);
        return err;
    }
    json_t *vd = json_object_get(entry, "vec_dot_type");
    q->vdt = json_is_string(vd) ? type_id_by_name(json_string_value(vd)) : UINT32_MAX;
    char rel[128];
    snprintf(rel, sizeof rel, QDIR "%s.json", name);
    const char *p = test_shared(rel);
    json_t *tj = p ? test_load_json(p) : NULL;
    json_t *rb = json_object_get(tj, "row_bytes");
    if (!json_is_array(rb) || (int)json_array_size(rb) != f->n_rows) {
        json_decref(tj);
        snprintf(err, cap, "%s.json: row_bytes missing", name);
        return err;
    }
    for (int r = 0; r < f->n_rows; r++) {
        q->row_bytes[r] = json_integer_value(json_array_get(rb, (size_t)r));
        if (q->row_bytes[r] != f->len[r] / bs * ts) {
            json_decref(tj);
            snprintf(err, cap, "%s row %d: row_bytes %lld, block table gives %lld", name, r,
                     (long long)q->row_bytes[r], (long long)(f->len[r] / bs * ts));
            return err;
        }
    }
    json_decref(tj);
    return NULL;
}

/* Buffers a per-type check may use, and the table under test (dequant_fixtures_simd). */
typedef struct {
    float *f;      /* [2 * 16384] */
    uint16_t *xb;  /* [16384] */
    const dsf_kernels *k;
} scratch;

typedef const char *(*type_check)(const fixtures *f, const qtype *q, scratch *s, char *err, size_t cap);

/* Runs fn on every type of index.json (Q8_K too unless skip_q8k); the first error text or NULL;
 * the count of types checked in *n. */
static const char *each_type(const fixtures *f, type_check fn, scratch *s, bool skip_q8k, char *err, size_t cap,
                             int *n) {
    json_t *entry;
    const char *name;
    *n = 0;
    json_object_foreach(json_object_get(f->index, "types"), name, entry) {
        qtype q;
        const char *bad = type_load(f, name, entry, &q, err, cap);
        if (bad) return bad;
        if (skip_q8k && q.id == GGML_TYPE_Q8_K) continue; /* activation type only: no act.q / dot.f32 */
        if ((bad = fn(f, &q, s, err, cap))) return bad;
        ++*n;
    }
    return NULL;
}

/* Loads the fixtures, runs fn on every type with table k, checks that want types were checked;
 * the first error text or NULL. */
static const char *run_all(type_check fn, const dsf_kernels *k, bool skip_q8k, int want,
                           char *err, size_t cap) {
    fixtures f;
    scratch s = {malloc(2 * 16384 * sizeof(float)), malloc(16384 * sizeof(uint16_t)), k};
    int n = 0;
    const char *bad = fix_load(&f);
    if (!bad) bad = each_type(&f, fn, &s, skip_q8k, err, cap, &n);
    if (!bad && n != want) {
        snprintf(err, cap, "index.json: %d types checked, expected %d", n, want);
        bad = err;
    }
    free(s.f);
    free(s.xb);
    fix_free(&f);
    return bad;
}

/* memcmp of n decoded floats against ggml's; on a difference, the first index in *first. */
static bool same_bits(const float *got, const float *want, int64_t n, int64_t *first) {
    if (memcmp(got, want, (size_t)n * 4) == 0) return true;
    for (*first = 0; *first < n && memcmp(got + *first, want + *first, 4) == 0; ++*first) {}
    return false;
}

/* Decodes TYPE.q (row by row) and TYPE.rand.q into out and compares the bytes with ggml's. */
static const char *check_type_bits(const fixtures *f, const qtype *q, scratch *s, char *err, size_t cap) {
    float *out = s->f;
    char fn[64];
    if (!ggml_type_supported(q->id)) {
        snprintf(err, cap, "%s: ggml_type_supported is false", q->name);
        return err;
    }
    long qsz = 0, dsz = 0;
    snprintf(fn, sizeof fn, "%s.q", q->name);
    uint8_t *qb = slurp_q(fn, &qsz);
    snprintf(fn, sizeof fn, "%s.deq.f32", q->name);
    float *want = (float *)slurp_q(fn, &dsz);
    const char *res = NULL;
    int64_t total = f->off[f->n_rows - 1] + f->len[f->n_rows - 1], qoff = 0, first;
    if (!qb || !want || dsz != total * 4) {
        res = "fixture files missing or wrong size";
        goto done;
    }
    for (int r = 0; r < f->n_rows; r++) {
        if (qoff + q->row_bytes[r] > qsz) { res = "TYPE.q shorter than row_bytes"; goto done; }
        dequant_row(q->id, qb + qoff, out, f->len[r]);
        if (!same_bits(out, want + f->off[r], f->len[r], &first)) {
            snprintf(err, cap, "%s row %d index %lld: got %a, want %a", q->name, r, (long long)first,
                     (double)out[first], (double)want[f->off[r] + first]);
            res = err;
            goto done;
        }
        qoff += q->row_bytes[r];
    }
    free(qb);
    free(want);
    snprintf(fn, sizeof fn, "%s.rand.q", q->name);
    qb = slurp_q(fn, &qsz);
    snprintf(fn, sizeof fn, "%s.rand.deq.f32", q->name);
    want = (float *)slurp_q(fn, &dsz);
    int64_t n = dsz / 4, bs = ggml_blck_size(q->id);
    if (!qb || !want || n % bs || qsz != n / bs * (int64_t)ggml_type_size(q->id) || n > 16384) {
        res = "rand fixture files missing or of inconsistent sizes";
        goto done;
    }
    dequant_row(q->id, qb, out, n);
    if (!same_bits(out, want, n, &first)) {
        snprintf(err, cap, "%s.rand index %lld (block %lld): got %a, want %a", q->name, (long long)first,
                 (long long)(first / bs), (double)out[first], (double)want[first]);
        res = err;
    }
done:
    free(qb);
    free(want);
    return res;
}

/* Bit-exact, signed zeros included: the README's arithmetic notes say the exact-product order
 * (scale, sub-scale, quant) reproduces ggml's bits, and verify_deq.py reaches 56 of 56 files. */
TEST(dequant_fixtures_bitexact) {
    NEED_SHARED(index_, QDIR "index.json");
    char err[256];
    const char *bad = run_all(check_type_bits, NULL, false, 28, err, sizeof err);
    CHECKF(!bad, "%s", bad);
}

/* The twin's dot with f32 activations, and with the activations quantized to the vec_dot type:
 * s = fp32(double sum of deqW * x), the computation behind dot[3] and dot[1]. Tolerances are the
 * README's: |s - dot[3]| <= 2e-6 * dot[4] (f32 activations); |s - dot[1]| <= 1e-6 * dot[2]
 * (exact kernel on quantized operands); |s - dot[0]| <= 2e-6 * dot[2], 2e-4 for Q4_1/Q5_1
 * (ggml's own kernel; Q8_1's f16-rounded sum field moves those two by up to 5.4e-5). */
static const char *check_type_dots(const fixtures *f, const qtype *q, scratch *sc, char *err, size_t cap) {
    float *a = sc->f;
    uint16_t *xb = sc->xb;
    char fn[64];
    long qsz = 0, asz = 0, dsz = 0, wsz = 0;
    snprintf(fn, sizeof fn, "%s.q", q->name);
    uint8_t *qb = slurp_q(fn, &qsz);
    snprintf(fn, sizeof fn, "%s.act.q", q->name);
    uint8_t *ab = slurp_q(fn, &asz);
    snprintf(fn, sizeof fn, "%s.dot.f32", q->name);
    float *dot = (float *)slurp_q(fn, &dsz);
    snprintf(fn, sizeof fn, "%s.deq.f32", q->name);
    float *deq = (float *)slurp_q(fn, &wsz);
    const char *res = NULL;
    if (!qb || !ab || !dot || !deq || dsz != f->n_rows * 5 * 4 || q->vdt == UINT32_MAX) {
        res = "dot fixture files missing or wrong size";
        goto done;
    }
    double tol0 = (q->id == GGML_TYPE_Q4_1 || q->id == GGML_TYPE_Q5_1) ? 2e-4 : 2e-6;
    int64_t qoff = 0, aoff = 0;
    for (int r = 0; r < f->n_rows; r++) {
        int64_t n = f->len[r], arb = n / ggml_blck_size(q->vdt) * ggml_type_size(q->vdt);
        const float *x = f->act + f->off[r], *d5 = dot + 5 * r, *w = deq + f->off[r];
        if (aoff + arb > asz) { res = "act.q shorter than its rows"; goto done; }
        dsf_wmat wm = {.type = q->id, .n_in = n, .n_out = 1, .row_bytes = (uint64_t)q->row_bytes[r], .data = qb + qoff};
        float s;
        matmul_any_ref(&wm, x, 1, &s, 1, 0, 1);
        if (!(fabs((double)s - d5[3]) <= 2e-6 * d5[4])) {
            snprintf(err, cap, "%s row %d f32 act: %.9g vs exact %.9g (sum|wx| %g)", q->name, r, s, d5[3], d5[4]);
            res = err;
            goto done;
        }
        dequant_row(q->vdt, ab + aoff, a, n);
        matmul_any_ref(&wm, a, 1, &s, 1, 0, 1);
        if (!(fabs((double)s - d5[1]) <= 1e-6 * d5[2]) || !(fabs((double)s - d5[0]) <= tol0 * d5[2])) {
            snprintf(err, cap, "%s row %d %s act: %.9g vs exact %.9g, ggml %.9g (sum|wa| %g)", q->name, r,
                     ggml_type_name(q->vdt), s, d5[1], d5[0], d5[2]);
            res = err;
            goto done;
        }
        /* BF16 twin: activations rounded to BF16 here (nearest even, no NaN in act.f32); the
         * expected dot is the double sum over ggml's deqW, so the twin may differ only by the
         * one fp32 rounding of an equal double sum: 2^-23 * sum|w xb| covers it. */
        double e = 0, sa = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            xb[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
            uint32_t v = (uint32_t)xb[i] << 16;
            float xv;
            memcpy(&xv, &v, 4);
            e += (double)w[i] * xv;
            sa += fabs((double)w[i] * xv);
        }
        matmul_xbf16_any_ref(&wm, xb, 1, &s, 1, 0, 1);
        if (!(fabs((double)s - e) <= 0x1p-23 * sa)) {
            snprintf(err, cap, "%s row %d bf16 act: %.9g vs %.9g", q->name, r, s, e);
            res = err;
            goto done;
        }
        qoff += q->row_bytes[r];
        aoff += arb;
    }
done:
    free(qb);
    free(ab);
    free(dot);
    free(deq);
    return res;
}

TEST(dequant_fixtures_dot) {
    NEED_SHARED(index_, QDIR "index.json");
    char err[256];
    const char *bad = run_all(check_type_dots, NULL, true, 27, err, sizeof err);
    CHECKF(!bad, "%s", bad);
}

/* One product through table k against the twin, fp32 and BF16 families, T = 1 token at a time
 * and all T at once. x: [T][n_in]; w: [n_out][n_in] of type q; deq: ggml's decoded rows.
 * Tolerance: a fast kernel sums n_in products in fp32 in its own order; each of the at most
 * n_in + 2 roundings (product, adds, final) is <= 2^-24 relative, so |y - y_ref| <=
 * (n_in + 3) * 2^-24 * sum|w x| (the twin rounds once, from double). The BF16 family may also
 * flush subnormal inputs and partial sums (matmul.h): at most n_in * 2^-126 * 64 more (|x| <= 64
 * in act.f32 after the x20 channels), covered by the 1e-30 absolute term. A decoding or
 * dispatch error is of order |w x|, orders of magnitude above. Batch invariance (matmul.h):
 * the T-at-once result must equal the token-by-token one bit for bit. */
static const char *check_table(const dsf_kernels *k, const dsf_wmat *w, const float *deq, const float *x, int64_t T,
                               char *err, size_t cap) {
    enum { MAXT = 4, MAXR = 4 };
    float yr[MAXT * MAXR], y1[MAXT * MAXR], yt[MAXT * MAXR];
    uint16_t *xb = malloc((size_t)(T * w->n_in) * sizeof(uint16_t));
    const char *res = NULL;
    kern_act_to_bf16(x, xb, T * w->n_in);
    for (int fam = 0; fam < 2 && !res; fam++) {
        if (fam == 0) {
            matmul_any_ref(w, x, T, yr, w->n_out, 0, w->n_out);
            for (int64_t t = 0; t < T; t++) kern_matmul(k, w, x + t * w->n_in, 1, y1 + t * w->n_out, w->n_out, 0, w->n_out);
            kern_matmul(k, w, x, T, yt, w->n_out, 0, w->n_out);
        } else {
            matmul_xbf16_any_ref(w, xb, T, yr, w->n_out, 0, w->n_out);
            for (int64_t t = 0; t < T; t++)
                kern_matmul_xbf16(k, w, xb + t * w->n_in, 1, y1 + t * w->n_out, w->n_out, 0, w->n_out);
            kern_matmul_xbf16(k, w, xb, T, yt, w->n_out, 0, w->n_out);
        }
        for (int64_t t = 0; t < T && !res; t++) {
            for (int64_t r = 0; r < w->n_out; r++) {
                double sa = 0;
                for (int64_t i = 0; i < w->n_in; i++) sa += fabs((double)deq[r * w->n_in + i] * x[t * w->n_in + i]);
                float a = yt[t * w->n_out + r], b = y1[t * w->n_out + r], c = yr[t * w->n_out + r];
                double tol = (double)(w->n_in + 3) * 0x1p-24 * sa + 1e-30;
                if (memcmp(&a, &b, 4) != 0 || !(fabs((double)a - c) <= tol)) {
                    snprintf(err, cap, "%s %s %s n_in %lld token %lld row %lld: T=%lld %.9g, T=1 %.9g, twin %.9g (tol %g)",
                             k->name, fam ? "xbf16" : "f32", ggml_type_name(w->type), (long long)w->n_in, (long long)t,
                             (long long)r, (long long)T, a, b, c, tol);
                    res = err;
                    break;
                }
            }
        }
    }
    free(xb);
    return res;
}

/* Every fixture type through every fast table this CPU runs: rows 0-3 as one [4][1024] matrix
 * with T = 1 and 4, rows 4 and 5 as [1][n] with T = 1 and 2 (the second token reversed). */
static const char *check_type_tables(const fixtures *f, const qtype *q, scratch *s, char *err, size_t cap) {
    const dsf_kernels *k = s->k;
    float *x2 = s->f;
    char fn[64];
    long qsz = 0, wsz = 0;
    snprintf(fn, sizeof fn, "%s.q", q->name);
    uint8_t *qb = slurp_q(fn, &qsz);
    snprintf(fn, sizeof fn, "%s.deq.f32", q->name);
    float *deq = (float *)slurp_q(fn, &wsz);
    const char *res = NULL;
    if (!qb || !deq) {
        res = "fixture files missing";
        goto done;
    }
    dsf_wmat w = {.type = q->id, .n_in = f->len[0], .n_out = 4, .row_bytes = (uint64_t)q->row_bytes[0], .data = qb};
    if ((res = check_table(k, &w, deq, f->act, 1, err, cap)) || (res = check_table(k, &w, deq, f->act, 4, err, cap)))
        goto done;
    int64_t qoff = 4 * q->row_bytes[0];
    for (int r = 4; r < f->n_rows; r++) {
        int64_t n = f->len[r];
        dsf_wmat wr = {.type = q->id, .n_in = n, .n_out = 1, .row_bytes = (uint64_t)q->row_bytes[r], .data = qb + qoff};
        memcpy(x2, f->act + f->off[r], (size_t)n * 4);
        for (int64_t i = 0; i < n; i++) x2[n + i] = x2[n - 1 - i];
        if ((res = check_table(k, &wr, deq + f->off[r], x2, 1, err, cap)) ||
            (res = check_table(k, &wr, deq + f->off[r], x2, 2, err, cap)))
            goto done;
        qoff += q->row_bytes[r];
    }
done:
    free(qb);
    free(deq);
    return res;
}

TEST(dequant_fixtures_simd) {
    NEED_SHARED(index_, QDIR "index.json");
    static const char *names[] = {"avx2", "avx512", "amx"};
    char err[320];
    int n_tables = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const dsf_kernels *k = kernels_by_name(names[i]);
        if (!k) continue;
        n_tables++;
        const char *bad = run_all(check_type_tables, k, false, 28, err, sizeof err);
        CHECKF(!bad, "%s", bad);
    }
    if (n_tables == 0) SKIP("no SIMD table runs on this CPU (the scalar twins are checked by dequant_fixtures_dot)");
}
