/* kernels_attn.c: every fast attention / indexer / hc kernel (kernels_attn.h) against its
 * scalar twin on random data and edge sizes, for each table this CPU runs (avx2, avx512).
 *
 * Guards against: dropped or repeated tails (head_dim 8/48/64/512, n_keys 0..700, heads not a
 * multiple of the head tile, index rows not a multiple of the row tile, ih not a multiple of
 * the lane width, D not a multiple of the vector), wrong key order or pointer use, a softmax
 * that forgets the sink or the max shift, candidate-mask handling, writes outside the outputs
 * (sentinels must survive), a vector exp off by more than 2 ulp, and dispatch that ignores
 * the matmul table's choice.
 *
 * Tolerances (values in [-1, 1]): the fast kernels sum fp32 terms in another order and with
 * fused multiply-adds; independent rounding errors of n terms grow like sqrt(n) * 2^-24 times
 * the terms' magnitude, and we allow 8 times that. A real defect (a dropped key among 700,
 * a lost tail lane, a missing sink) moves the result by >= 1e-3, far above the tolerance.
 * Kernels documented as bit-identical (hc collapse/expand, add, RoPE table) are compared
 * exactly. */
#include "dsflash.h"
#include "test.h"
#include "kernels/matmul.h"
#include "kernels/vec.h"
#include "kernels/select.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void ka_exp_avx512(float *y, const float *x, int64_t n);
void ka_exp_avx2(float *y, const float *x, int64_t n);

static uint64_t rng_s = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return rng_s * 0x2545F4914F6CDD1Dull;
}
static float rnd_unit(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }
static void fill(float *x, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) x[i] = amp * rnd_unit();
}

#define SENT 12345.678f
#define GUARD 64

/* A buffer of n floats followed by GUARD sentinels. */
static float *guarded(int64_t n) {
    float *p = malloc((size_t)(n + GUARD) * sizeof(float));
    for (int64_t i = 0; i < n + GUARD; i++) p[i] = SENT;
    return p;
}
static int guard_ok(const float *p, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++)
        if (p[i] != SENT) return 0;
    return 1;
}

static const char *fast_names[] = {"avx2", "avx512"};

/* ---- dispatch --------------------------------------------------------------------------- */

TEST(kernels_attn_dispatch_follows_matmul_table) {
    CHECK(akernels_by_name("ref") == &akernels_ref);
    CHECK(akernels_by_name("nonsense") == NULL);
    const dsf_akernels *a = akernels_get();
    /* the amx matmul table is avx512's plus tiles: its attention table is avx512's */
    const char *mm = kernels_get()->name;
    CHECKF(!strcmp(a->name, strncmp(mm, "amx", 3) ? mm : "avx512"), "attention table %s, matmul table %s", a->name, mm);
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (k) CHECK(!strcmp(k->name, fast_names[s]) && k->attn && k->index);
    }
    /* a NULL table runs the twins */
    float a1[3] = {1, 2, 3}, y[3] = {1, 1, 1};
    ka_add(NULL, a1, y, 3);
    CHECK(a1[0] == 2 && a1[2] == 4);
}

TEST(kernels_attn_dispatch_ref_knob) {
    /* each test runs in its own process: the first akernels_get() here sees the knob */
    setenv("DSF_KERNELS", "ref", 1);
    CHECK(akernels_get() == &akernels_ref);
    CHECK(!strcmp(kernels_get()->name, "ref"));
}

/* ---- exp ------------------------------------------------------------------------------ */

static int64_t ulp_diff(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return llabs((long long)ia - (long long)ib);
}

TEST(kernels_attn_vector_exp_within_2ulp) {
    int tested = 0;
    enum { N = 200000 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = -104.0f + 193.0f * (float)i / (float)N; /* [-104, 89) */
    for (int i = 0; i < 64; i++) x[i] = (float)(rnd_unit() * 1e-3); /* near 0 */
    x[64] = 0.0f;
    x[65] = -0.0f;
    x[66] = -INFINITY;
    x[67] = INFINITY;
    x[68] = 88.72f;
    x[69] = -87.33f;
    x[70] = -87.34f;
    for (int s = 0; s < 2; s++) {
        if (!akernels_by_name(fast_names[s])) continue;
        tested++;
        if (s == 0) ka_exp_avx2(y, x, N);
        else ka_exp_avx512(y, x, N);
        int64_t worst = 0;
        for (int i = 0; i < N; i++) {
            float r = expf(x[i]);
            if (isinf(r) || r == 0.0f) {
                CHECKF(y[i] == r, "%s exp(%.9g) = %.9g, expf %.9g", fast_names[s], x[i], y[i], r);
                continue;
            }
            if (r < FLT_MIN) { /* subnormal result: within 2 steps of 2^-149 */
                CHECKF(fabsf(y[i] - r) <= 2.0f * 0x1p-149f, "%s exp(%.9g) = %.9g, expf %.9g", fast_names[s], x[i],
                       y[i], r);
                continue;
            }
            int64_t u = ulp_diff(y[i], r);
            if (u > worst) worst = u;
            CHECKF(u <= 2, "%s exp(%.9g) = %.9g, expf %.9g (%lld ulp)", fast_names[s], x[i], y[i], r, (long long)u);
        }
        float nanin = NAN, nanout = 0.0f;
        if (s == 0) {
            float v8[8] = {NAN, 0, 0, 0, 0, 0, 0, 0}, o8[8];
            ka_exp_avx2(o8, v8, 8);
            nanout = o8[0];
        } else {
            ka_exp_avx512(&nanout, &nanin, 1);
        }
        CHECKF(isnan(nanout), "%s exp(NaN) = %g", fast_names[s], nanout);
    }
    free(x);
    free(y);
    if (!tested) SKIP("no AVX2/AVX-512 on this CPU");
}

/* ---- attention -------------------------------------------------------------------------- */

/* One case: nh heads of dim dh over nk keys picked at random (with repeats) from a pool. */
static int attn_case(test_ctx *t, const dsf_akernels *k, int64_t nh, int64_t dh, int64_t nk, float qamp) {
    const int64_t pool = nk + 5;
    float *keysbuf = malloc((size_t)(pool * dh) * sizeof(float));
    fill(keysbuf, pool * dh, 1.0f);
    const float **keys = malloc((size_t)(nk + 1) * sizeof(float *));
    for (int64_t i = 0; i < nk; i++) keys[i] = keysbuf + (int64_t)(rnd() % (uint64_t)pool) * dh;
    float *q = malloc((size_t)(nh * dh) * sizeof(float)), *sinks = malloc((size_t)nh * sizeof(float));
    fill(q, nh * dh, qamp);
    fill(sinks, nh, 2.0f);
    float *o0 = guarded(nh * dh), *o1 = guarded(nh * dh), *a0 = guarded(nh * nk), *a1 = guarded(nh * nk);
    const float scale = (float)(1.0 / sqrt((double)dh));
    attn_ref(o0, q, nh, dh, keys, nk, scale, sinks, a0);
    k->attn(o1, q, nh, dh, keys, nk, scale, sinks, a1);
    double worst = 0.0;
    for (int64_t i = 0; i < nh * dh; i++) worst = fmax(worst, fabs((double)o0[i] - (double)o1[i]));
    /* see the header: 8 sqrt(n) 2^-24, n = dh (score sums) + nk (weighted sum), |o| <= 1;
     * scores are O(qamp) so their absolute error scales with it */
    const double tol = 8.0 * sqrt((double)(dh + nk + 1)) * 0x1p-24 * (1.0 + qamp);
    int ok = guard_ok(o1, nh * dh) && guard_ok(a1, nh * nk) && worst <= tol;
    if (!ok)
        test_fail(t, __FILE__, __LINE__, "%s attn nh %lld dh %lld nk %lld: max diff %.3g (tol %.3g), guards %d/%d",
                  k->name, (long long)nh, (long long)dh, (long long)nk, worst, tol, guard_ok(o1, nh * dh),
                  guard_ok(a1, nh * nk));
    free(keysbuf);
    free(keys);
    free(q);
    free(sinks);
    free(o0);
    free(o1);
    free(a0);
    free(a1);
    return ok;
}

TEST(kernels_attn_attention_matches_twin) {
    int tested = 0;
    static const int64_t dhs[] = {64, 512, 48, 8};
    static const int64_t nhs[] = {1, 3, 4, 5, 8};
    static const int64_t nks[] = {0, 1, 2, 15, 17, 128, 640, 700};
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (!k) continue;
        tested++;
        for (size_t a = 0; a < sizeof dhs / sizeof *dhs; a++)
            for (size_t b = 0; b < sizeof nhs / sizeof *nhs; b++)
                for (size_t c = 0; c < sizeof nks / sizeof *nks; c++) {
                    if (dhs[a] == 512 && nks[c] > 128 && nhs[b] > 4) continue; /* keep the suite fast */
                    if (!attn_case(t, k, nhs[b], dhs[a], nks[c], 1.0f)) return;
                }
        /* peaked softmax: large queries make one key dominate (max shift and sink matter) */
        if (!attn_case(t, k, 64, 512, 640, 8.0f)) return;
        if (!attn_case(t, k, 4, 64, 33, 30.0f)) return;
    }
    if (!tested) SKIP("no AVX2/AVX-512 on this CPU");
}

/* The twin itself against a hand-computable case: two keys, dh 2, sink 0. */
TEST(kernels_attn_attention_twin_by_hand) {
    const float k0[2] = {1, 0}, k1[2] = {0, 1};
    const float *keys[2] = {k0, k1};
    const float q[2] = {2, 0}, sink = 0.0f;
    float o[2], att[2];
    attn_ref(o, q, 1, 2, keys, 2, 1.0f, &sink, att);
    /* scores 2 and 0, sink 0: o = (e^2, e^0) / (e^0 + e^2 + e^0) */
    double den = 1.0 + exp(2.0) + 1.0;
    CHECKF(fabs(o[0] - exp(2.0) / den) < 1e-6 && fabs(o[1] - 1.0 / den) < 1e-6, "o = %g %g", o[0], o[1]);
}

/* ---- indexer ---------------------------------------------------------------------------- */

static int index_case(test_ctx *t, const dsf_akernels *k, int64_t ih, int64_t id, int64_t C, int64_t j0, int64_t j1,
                      int64_t B) {
    float *q = malloc((size_t)(ih * id) * sizeof(float)), *w = malloc((size_t)ih * sizeof(float));
    float *ik = malloc((size_t)(C * id + 1) * sizeof(float));
    fill(q, ih * id, 1.0f);
    fill(w, ih, 1.0f);
    fill(ik, C * id, 1.0f);
    uint8_t *cmask = NULL;
    if (B > 0) {
        int64_t nb = (C + B - 1) / B;
        cmask = malloc((size_t)nb);
        for (int64_t b = 0; b < nb; b++) cmask[b] = (uint8_t)(rnd() & 1);
    }
    float *s0 = guarded(C), *s1 = guarded(C);
    index_ref(s0, q, w, ik, j0, j1, ih, id, cmask, B > 0 ? B : 1);
    k->index(s1, q, w, ik, j0, j1, ih, id, cmask, B > 0 ? B : 1);
    int ok = guard_ok(s1, C);
    double worst = 0.0, tol = 0.0;
    for (int64_t j = 0; j < C && ok; j++) {
        if (j < j0 || j >= j1) {
            ok = s1[j] == SENT; /* rows outside [j0, j1) untouched */
            continue;
        }
        if (isinf(s0[j])) {
            ok = s1[j] == s0[j];
            continue;
        }
        /* magnitude of the terms: sum_h |w_h| sum_x |q_hx k_jx|; n = id + ih terms per chain */
        double mag = 0.0;
        for (int64_t h = 0; h < ih; h++) {
            double d = 0.0;
            for (int64_t x = 0; x < id; x++) d += fabs((double)q[h * id + x] * ik[j * id + x]);
            mag += fabs((double)w[h]) * d;
        }
        double tj = 8.0 * sqrt((double)(id + ih)) * 0x1p-24 * mag;
        double dj = fabs((double)s0[j] - (double)s1[j]);
        if (dj > tj) ok = 0;
        if (dj > worst) {
            worst = dj;
            tol = tj;
        }
    }
    if (!ok)
        test_fail(t, __FILE__, __LINE__, "%s index ih %lld id %lld rows [%lld,%lld) of %lld B %lld: max diff %.3g (tol %.3g)",
                  k->name, (long long)ih, (long long)id, (long long)j0, (long long)j1, (long long)C, (long long)B,
                  worst, tol);
    free(q);
    free(w);
    free(ik);
    free(cmask);
    free(s0);
    free(s1);
    return ok;
}

TEST(kernels_attn_index_scores_match_twin) {
    int tested = 0;
    static const int64_t ihs[] = {1, 5, 8, 17, 32, 64, 65};
    static const int64_t ids[] = {32, 128, 7, 256, 300};
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (!k) continue;
        tested++;
        for (size_t a = 0; a < sizeof ihs / sizeof *ihs; a++)
            for (size_t b = 0; b < sizeof ids / sizeof *ids; b++) {
                if (!index_case(t, k, ihs[a], ids[b], 37, 0, 37, 0)) return;
                if (!index_case(t, k, ihs[a], ids[b], 50, 3, 46, 4)) return;
            }
        if (!index_case(t, k, 64, 128, 700, 0, 700, 8)) return;
        if (!index_case(t, k, 32, 128, 701, 100, 701, 0)) return;
        if (!index_case(t, k, 8, 32, 1, 0, 1, 0)) return;
        if (!index_case(t, k, 8, 32, 5, 2, 2, 0)) return; /* empty range */
    }
    if (!tested) SKIP("no AVX2/AVX-512 on this CPU");
}

/* ---- small vector operations ------------------------------------------------------------ */

TEST(kernels_attn_hc_collapse_expand_add_bit_identical) {
    int tested = 0;
    static const int64_t Ds[] = {1, 7, 8, 15, 16, 17, 128, 5125};
    static const int64_t hcs[] = {1, 4};
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (!k) continue;
        tested++;
        for (size_t a = 0; a < sizeof Ds / sizeof *Ds; a++)
            for (size_t b = 0; b < sizeof hcs / sizeof *hcs; b++) {
                const int64_t D = Ds[a], hc = hcs[b];
                float *X = malloc((size_t)(hc * D) * sizeof(float)), *fo = malloc((size_t)D * sizeof(float));
                float pre[4], post[4], comb[16];
                fill(X, hc * D, 3.0f);
                fill(fo, D, 3.0f);
                fill(pre, hc, 1.0f);
                fill(post, hc, 2.0f);
                fill(comb, hc * hc, 1.0f);
                float *c0 = guarded(D), *c1 = guarded(D), *y0 = guarded(hc * D), *y1 = guarded(hc * D);
                hc_collapse_ref(c0, X, pre, hc, D, D);
                k->hc_collapse(c1, X, pre, hc, D, D);
                hc_expand_ref(y0, fo, X, post, comb, hc, D, D);
                k->hc_expand(y1, fo, X, post, comb, hc, D, D);
                int ok = !memcmp(c0, c1, (size_t)(D + GUARD) * sizeof(float)) &&
                         !memcmp(y0, y1, (size_t)(hc * D + GUARD) * sizeof(float));
                /* a column range [d0, d0 + n) of the rows (ld = D): the same elements */
                const int64_t d0 = D / 3, n = D - d0 > 5 ? D - d0 - 5 : D - d0;
                float *c2 = guarded(D), *y2 = guarded(hc * D);
                memcpy(y2, y0, (size_t)(hc * D) * sizeof(float));
                for (int64_t i = 0; i < hc; i++)
                    for (int64_t d = d0; d < d0 + n; d++) y2[i * D + d] = -1.0f;
                k->hc_collapse(c2 + d0, X + d0, pre, hc, n, D);
                k->hc_expand(y2 + d0, fo + d0, X + d0, post, comb, hc, n, D);
                ok = ok && !memcmp(c2 + d0, c0 + d0, (size_t)n * sizeof(float)) &&
                     !memcmp(y2, y0, (size_t)(hc * D) * sizeof(float)) && guard_ok(y2, hc * D);
                free(c2);
                free(y2);
                memcpy(c1, c0, (size_t)D * sizeof(float));
                add_ref(c0, fo, D);
                k->add(c1, fo, D);
                ok = ok && !memcmp(c0, c1, (size_t)(D + GUARD) * sizeof(float));
                free(X);
                free(fo);
                free(c0);
                free(c1);
                free(y0);
                free(y1);
                CHECKF(ok, "%s hc %lld D %lld: collapse/expand/add differ from the twin", k->name, (long long)hc,
                       (long long)D);
            }
    }
    if (!tested) SKIP("no AVX2/AVX-512 on this CPU");
}

TEST(kernels_attn_sumsq_and_rmsnorm) {
    static const int64_t ns[] = {1, 7, 31, 33, 128, 5120, 20483};
    for (int s = 0; s < 3; s++) {
        const dsf_akernels *k = s == 2 ? &akernels_ref : akernels_by_name(fast_names[s]);
        if (!k) continue;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            const int64_t n = ns[a];
            float *x = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
            fill(x, n, 10.0f);
            fill(w, n, 1.0f);
            double r0 = sumsq_ref(x, n), r1 = k->sumsq(x, n);
            /* double sums of n positive terms in two orders: each within n 2^-53 relative */
            CHECKF(fabs(r0 - r1) <= 2.0 * (double)n * 0x1p-53 * r0, "%s sumsq n %lld: %.17g vs %.17g", k->name,
                   (long long)n, r0, r1);
            float *y0 = malloc((size_t)n * sizeof(float)), *y1 = malloc((size_t)n * sizeof(float));
            op_rmsnorm(y0, x, w, n, 1e-6f);
            ka_rmsnorm(k, y1, x, w, n, 1e-6f);
            /* the same float formula on a scale that can differ by one rounding of the sum: 1 ulp */
            for (int64_t i = 0; i < n; i++)
                CHECKF(ulp_diff(y0[i], y1[i]) <= 1, "%s rmsnorm n %lld [%lld]: %.9g vs %.9g", k->name, (long long)n,
                       (long long)i, y0[i], y1[i]);
            free(x);
            free(w);
            free(y0);
            free(y1);
        }
    }
}

TEST(kernels_attn_swiglu_matches_twin) {
    int tested = 0;
    static const int64_t ns[] = {1, 7, 8, 17, 100, 2304};
    static const float lims[] = {0.0f, 1.0f, 10.0f};
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (!k) continue;
        tested++;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof lims / sizeof *lims; b++) {
                const int64_t n = ns[a];
                float *g = malloc((size_t)n * sizeof(float)), *u = malloc((size_t)n * sizeof(float));
                fill(g, n, 30.0f); /* past the clamps and far into silu's tails */
                fill(u, n, 30.0f);
                if (n > 4) {
                    g[0] = -100.0f; /* exp(100) overflows: silu = -0 */
                    g[1] = 100.0f;
                    g[2] = 0.0f;
                }
                float *z0 = guarded(n), *z1 = guarded(n);
                swiglu_ref(z0, g, u, n, lims[b], 0.75f);
                k->swiglu(z1, g, u, n, lims[b], 0.75f);
                int ok = guard_ok(z1, n);
                for (int64_t i = 0; i < n && ok; i++) {
                    /* exp within 2 ulp, then add, divide and two multiplies (0.5 ulp each): 8 ulp */
                    double tol = 8.0 * 0x1p-24 * fabs((double)z0[i]) + 1e-37;
                    if (!(fabs((double)z0[i] - (double)z1[i]) <= tol)) {
                        test_fail(t, __FILE__, __LINE__, "%s swiglu n %lld lim %g [%lld] g %g u %g: %.9g vs %.9g",
                                  k->name, (long long)n, lims[b], (long long)i, g[i], u[i], z0[i], z1[i]);
                        ok = 0;
                    }
                }
                free(g);
                free(u);
                free(z0);
                free(z1);
                if (!ok) return;
            }
    }
    if (!tested) SKIP("no AVX2/AVX-512 on this CPU");
}

/* Guards against: a fast sink-free softmax (the vision tower's attention) whose numerators or
 * sum drift from the twin's, or that reads or writes past n (odd lengths, a tail under one
 * vector). Tolerance: each numerator is one exp (2 ulp, as above) of the same difference; the
 * sum adds n of them in another order (n ulp of the sum). */
TEST(kernels_attn_softmax_matches_twin) {
    static const int64_t ns[] = {1, 7, 16, 17, 100, 9216};
    for (int s = 0; s < 2; s++) {
        const dsf_akernels *k = akernels_by_name(fast_names[s]);
        if (!k) continue;
        CHECKF(k->softmax, "%s has no softmax", k->name);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            const int64_t n = ns[a];
            float *x0 = guarded(n), *x1 = guarded(n);
            fill(x0, n, 30.0f);
            memcpy(x1, x0, (size_t)n * sizeof(float));
            const float d0 = softmax_ref(x0, n), d1 = k->softmax(x1, n);
            int ok = guard_ok(x1, n) && fabs((double)d0 - (double)d1) <= (double)n * 0x1p-23 * fabs((double)d0);
            for (int64_t i = 0; i < n && ok; i++)
                ok = fabs((double)x0[i] - (double)x1[i]) <= 2.0 * 0x1p-23 * fabs((double)x0[i]) + 1e-37;
            free(x0), free(x1);
            CHECKF(ok, "%s softmax n %lld: sum %.9g vs %.9g, or a numerator off, or a guard overwritten", k->name,
                   (long long)n, d0, d1);
        }
    }
}

TEST(kernels_attn_rope_table_bit_identical) {
    static const int64_t nrots[] = {2, 16, 64};
    static const int64_t poss[] = {0, 1, 7, 1000, 1 << 20};
    for (size_t a = 0; a < sizeof nrots / sizeof *nrots; a++) {
        const int64_t nr = nrots[a];
        float freq[32], cs[64];
        op_rope_freqs(freq, nr, 160000.0f, 1, 16.0f, 65536, 32.0f, 1.0f);
        for (size_t b = 0; b < sizeof poss / sizeof *poss; b++)
            for (int inv = 0; inv < 2; inv++) {
                float x0[64], x1[64];
                fill(x0, nr, 2.0f);
                memcpy(x1, x0, sizeof x0);
                op_rope(x0, nr, freq, poss[b], inv);
                ka_rope_table(cs, nr, freq, poss[b]);
                ka_rope_apply(x1, nr, cs, inv);
                CHECKF(!memcmp(x0, x1, (size_t)nr * sizeof(float)), "rope n_rot %lld pos %lld inverse %d differs",
                       (long long)nr, (long long)poss[b], inv);
            }
    }
}

/* The first element whose bits differ (any two NaNs count as equal), or -1. */
static int first_bit_diff(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t ua, ub;
        memcpy(&ua, &a[i], 4);
        memcpy(&ub, &b[i], 4);
        if (ua != ub && !(isnan(a[i]) && isnan(b[i]))) return i;
    }
    return -1;
}

/* Copies a into b, runs the twin on a and the fast version on b; first_bit_diff of the two. */
static int qdq_vs_twin(float *a, float *b, int n, qdq_fn twin, qdq_fn fast) {
    memcpy(b, a, (size_t)n * sizeof *a);
    twin(a, n);
    fast(b, n);
    return first_bit_diff(a, b, n);
}

/* QDQ_FP8 fast versions must equal qdq_fp8_e8m0 bit for bit: random groups over many scales,
 * e4m3 midpoints (normal and subnormal), values at the 448 clamp, zeros of both signs, tiny
 * values, groups with NaN / inf (scalar fallback), and a tail that is left alone. */
TEST(kernels_attn_qdq_fp8_bit_identical) {
    enum { N = 32 * 64 + 7 };
    static float a[N], b[N];
    for (unsigned ni = 0; ni < sizeof fast_names / sizeof *fast_names; ni++) {
        const dsf_akernels *k = akernels_by_name(fast_names[ni]);
        if (!k || !k->qdq_fp8) continue;
        for (int rep = 0; rep < 40; rep++) {
            for (int g = 0; g < N / 32; g++) {
                float amp = ldexpf(1.0f, (int)(rnd() % 60) - 30);
                for (int i = 0; i < 32; i++) a[g * 32 + i] = rnd_unit() * amp;
                switch (rnd() % 8) {
                case 0: /* e4m3 midpoints at a scale s: (m + 0.5) * 2^e * s */
                    for (int i = 0; i < 32; i++)
                        a[g * 32 + i] = ldexpf((float)(8 + (int)(rnd() % 8)) + 0.5f, (int)(rnd() % 12) - 12) *
                                        (rnd() & 1 ? 1.0f : -1.0f);
                    a[g * 32] = 448.0f;
                    break;
                case 1: /* subnormal e4m3 midpoints */
                    for (int i = 1; i < 32; i++) a[g * 32 + i] = ldexpf((float)(rnd() % 16) + 0.5f, -10);
                    a[g * 32] = 448.0f;
                    break;
                case 2: a[g * 32 + rnd() % 32] = -0.0f; a[g * 32 + rnd() % 32] = 0.0f; break;
                case 3: a[g * 32 + rnd() % 32] = 1e-30f; break;
                case 4: if (rep % 4 == 0) a[g * 32 + rnd() % 32] = NAN; break;
                case 5: if (rep % 4 == 1) a[g * 32 + rnd() % 32] = -INFINITY; break;
                default: break;
                }
            }
            for (int i = N - 7; i < N; i++) a[i] = rnd_unit() * 3.3f;
            const int d = qdq_vs_twin(a, b, N, qdq_fp8_e8m0, k->qdq_fp8);
            CHECKF(d < 0, "%s: element %d: %a vs twin %a", fast_names[ni], d, (double)b[d], (double)a[d]);
        }
    }
}

/* QDQ_FP4_E8M0 fast versions must equal qdq_fp4_e8m0 bit for bit: random groups over many
 * scales, e2m1 midpoints in each of the grid's three step sizes (the ties go to the even
 * code), values at and beyond the 6 clamp, zeros of both signs, tiny values (fp32 subnormal
 * after the scaling), groups with NaN / inf (scalar fallback), and a tail that is left alone. */
TEST(kernels_attn_qdq_fp4_bit_identical) {
    enum { N = 32 * 64 + 5 };
    static float a[N], b[N];
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.1f, 1.1f, 2.9f, 4.9f, 5.9f};
    int checked = 0;
    for (unsigned ni = 0; ni < sizeof fast_names / sizeof *fast_names; ni++) {
        const dsf_akernels *k = akernels_by_name(fast_names[ni]);
        if (!k || !k->qdq_fp4) continue;
        checked++;
        for (int rep = 0; rep < 40; rep++) {
            for (int g = 0; g < N / 32; g++) {
                float amp = ldexpf(1.0f, (int)(rnd() % 80) - 40);
                for (int i = 0; i < 32; i++) a[g * 32 + i] = rnd_unit() * amp;
                switch (rnd() % 8) {
                case 0: /* grid midpoints at a power-of-two scale: the group's max sets s = 2^e */
                case 1: {
                    int e = (int)(rnd() % 40) - 20;
                    for (int i = 1; i < 32; i++)
                        a[g * 32 + i] = ldexpf(mids[rnd() % (sizeof mids / sizeof *mids)], e) * (rnd() & 1 ? 1.0f : -1.0f);
                    a[g * 32] = ldexpf(6.0f, e);
                    break;
                }
                case 2: a[g * 32 + rnd() % 32] = -0.0f; a[g * 32 + rnd() % 32] = 0.0f; break;
                case 3: a[g * 32 + rnd() % 32] = 1e-38f; a[g * 32 + rnd() % 32] = -3e-39f; break;
                case 4: if (rep % 4 == 0) a[g * 32 + rnd() % 32] = NAN; break;
                case 5: if (rep % 4 == 1) a[g * 32 + rnd() % 32] = -INFINITY; break;
                case 6: /* all tiny: the floor 6 x 2^-126 sets the scale */
                    for (int i = 0; i < 32; i++) a[g * 32 + i] = rnd_unit() * 1e-37f;
                    break;
                default: break;
                }
            }
            for (int i = N - 5; i < N; i++) a[i] = rnd_unit() * 3.3f;
            const int d = qdq_vs_twin(a, b, N, qdq_fp4_e8m0, k->qdq_fp4);
            CHECKF(d < 0, "%s: element %d: %a vs twin %a", fast_names[ni], d, (double)b[d], (double)a[d]);
        }
    }
    if (!checked) SKIP("no fast QDQ_FP4 kernel on this CPU");
}

/* QDQ_FP4_E4M3 fast versions must equal qdq_fp4_e4m3 bit for bit: random groups of 16 over
 * many scales, e2m1 midpoints at e4m3 scales (the group's max 6 x s makes amax / 6 == s, so
 * v / s lands exactly on each midpoint), scales that round below amax / 6 (the clamp at 6
 * saturates), the floor 6 x 2^-9 and the 448 saturation of the scale, zeros of both signs,
 * groups with NaN / inf (scalar fallback), and a tail that is left alone. */
TEST(kernels_attn_qdq_fp4_e4m3_bit_identical) {
    enum { N = 16 * 128 + 9 };
    static float a[N], b[N];
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.1f, 1.1f, 2.9f, 4.9f, 5.9f};
    int checked = 0;
    for (unsigned ni = 0; ni < sizeof fast_names / sizeof *fast_names; ni++) {
        const dsf_akernels *k = akernels_by_name(fast_names[ni]);
        if (!k || !k->qdq_fp4_e4m3) continue;
        checked++;
        for (int rep = 0; rep < 40; rep++) {
            for (int g = 0; g < N / 16; g++) {
                float *v = a + g * 16, amp = ldexpf(1.0f, (int)(rnd() % 40) - 20);
                for (int i = 0; i < 16; i++) v[i] = rnd_unit() * amp;
                switch (rnd() % 9) {
                case 0: /* midpoints at an e4m3 scale s = (8 + m) x 2^e */
                case 1: {
                    float s = ldexpf((float)(8 + (int)(rnd() % 8)), (int)(rnd() % 16) - 12);
                    for (int i = 1; i < 16; i++)
                        v[i] = mids[rnd() % (sizeof mids / sizeof *mids)] * s * (rnd() & 1 ? 1.0f : -1.0f);
                    v[0] = (rnd() & 1 ? 6.0f : -6.0f) * s;
                    break;
                }
                case 2: /* amax / 6 just above an e4m3 value: s rounds down, |v / s| > 6 clamps */
                    v[rnd() % 16] = 6.0f * 1.0624f * ldexpf(1.0f, (int)(rnd() % 10) - 5);
                    break;
                case 3: v[rnd() % 16] = -0.0f; v[rnd() % 16] = 0.0f; break;
                case 4: /* all below the floor: s = 2^-9 */
                    for (int i = 0; i < 16; i++) v[i] = rnd_unit() * 1e-3f;
                    break;
                case 5: /* amax / 6 beyond 448: s saturates */
                    v[rnd() % 16] = 5000.0f * (rnd() & 1 ? 1.0f : -1.0f);
                    break;
                case 6: if (rep % 4 == 0) v[rnd() % 16] = NAN; break;
                case 7: if (rep % 4 == 1) v[rnd() % 16] = INFINITY; break;
                default: break;
                }
            }
            for (int i = N - 9; i < N; i++) a[i] = rnd_unit() * 3.3f;
            const int d = qdq_vs_twin(a, b, N, qdq_fp4_e4m3, k->qdq_fp4_e4m3);
            CHECKF(d < 0, "%s: element %d: %a vs twin %a", fast_names[ni], d, (double)b[d], (double)a[d]);
        }
    }
    if (!checked) SKIP("no fast QDQ_FP4_E4M3 kernel on this CPU");
}

/* The packed KV decoders (vec.h unpack_*) must equal their twins (quant.h unpack_*) bit for
 * bit: random code and scale bytes (every e4m3 code, NaN codes 0x7F / 0xFF and scale byte
 * 255 included), every nibble in both halves, and lengths of 1 to 24 groups. Guards against a
 * wrong nibble order, a lost sign (code 8 is -0.0), subnormal e4m3 codes decoded as zero, and
 * a wrong scale per group. */
TEST(kernels_attn_unpack_bit_identical) {
    enum { N = 32 * 24 };
    static uint8_t codes[N], scales[N / 16];
    static float a[N], b[N];
    int checked = 0;
    for (unsigned ni = 0; ni < sizeof fast_names / sizeof *fast_names; ni++) {
        const dsf_akernels *k = akernels_by_name(fast_names[ni]);
        if (!k) continue;
        const unpack_fn fast[3] = {k->unpack_fp8, k->unpack_fp4, k->unpack_fp4_e4m3};
        const unpack_fn twin[3] = {unpack_fp8_e8m0, unpack_fp4_e8m0, unpack_fp4_e4m3};
        for (int op = 0; op < 3; op++) {
            if (!fast[op]) continue;
            checked++;
            const int G = op == 2 ? 16 : 32;
            for (int rep = 0; rep < 64; rep++) {
                for (int i = 0; i < N; i++) codes[i] = (uint8_t)(rep < 2 ? (uint32_t)(i + rep) : rnd());
                for (int i = 0; i < N / 16; i++) scales[i] = (uint8_t)rnd();
                if (op == 2) /* e4m3 scales of real groups are positive and finite; test both anyway */
                    for (int i = 0; i < N / 16; i += 2) scales[i] &= 0x7E;
                const int n = G * (1 + (int)(rnd() % (N / G)));
                memset(a, 0, sizeof a);
                memset(b, 0, sizeof b);
                twin[op](a, codes, scales, n);
                fast[op](b, codes, scales, n);
                const int d = first_bit_diff(a, b, N);
                CHECKF(d < 0, "%s op %d n %d: element %d: %a vs twin %a", fast_names[ni], op, n, d, (double)b[d],
                       (double)a[d]);
                if (d >= 0) return;
            }
        }
    }
    if (!checked) SKIP("no fast unpack kernel on this CPU");
}
