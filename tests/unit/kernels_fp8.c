/* kernels_fp8.c: the DSF_TYPE_FP8B32 products (kernels/fp8.h) of every table the CPU runs, against
 * the same table's BF16 kernel on the BF16 matrix holding the same values (bit for bit: the
 * acceptance's "logits on a native file equal the BF16 file's") and against the scalar twin.
 *
 * The BF16 matrix is built here from the format's definition (dtype.h; architecture.md §3.1-3.2):
 * w(r, i) = e4m3(q) * 2^(S-127) with S the grid byte of row block r/32, column block i/32; its
 * BF16 bits are the top half of that fp32, and the test checks that the low half is zero (the
 * value is a BF16 value) wherever it claims bit identity.
 *
 * Guards against: a decode that is off for some code (subnormal e4m3, +-0, the largest 448, the
 * sign), a scale taken from the wrong row block or column block (n_out and row ranges that cut
 * blocks, grid rows shared by 32 rows), scales near the ends of the fast decode's range (3..10,
 * 240..246) and beyond it (0..2, 247..255, which must take the exact path), NaN codes, a fused
 * T = 1 kernel whose K chunks or lane sums differ from the BF16 kernel's (n_in crossing 1024,
 * 2048 and 4096), dropped tails (T not a multiple of the token tile, n_out not a multiple of the
 * row tile), writes outside [r0, r1), decode and prefill that disagree, and dispatch that loses
 * the entries. */
#include "test.h"
#include "kernels/fp8.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/select.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_s = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A random e4m3 code that is not NaN (0x7F, 0xFF). */
static uint8_t code(void) {
    uint8_t c = (uint8_t)rnd();
    return (c & 0x7F) == 0x7F ? (uint8_t)(c - 1) : c;
}

/* An FP8_B32 matrix [n_out][n_in] (codes, then the grid, as dtype.h) and the BF16 matrix of its
 * values. edge: 0 real-like scales only (S in 116..127); 1 also edge blocks whose values are
 * all BF16 values (subnormal codes, zeros of both signs, S = 3..10 and 240..250 with codes small
 * enough not to overflow); 2 also exceptional scales that leave BF16 (S = 0..2) or fp32's range
 * of the fast decode (247..254). */
typedef struct {
    dsf_wmat w, b;
    uint8_t *q;
    uint16_t *bf;
} mats;

static void block_edge(uint8_t *q, int64_t n_in, int64_t bi, int64_t bj, int64_t n_out, uint8_t *s, int edge) {
    const int kind = (int)(rnd() % 8);
    for (int64_t r = bi * 32; r < bi * 32 + 32 && r < n_out; r++)
        for (int64_t i = bj * 32; i < bj * 32 + 32 && i < n_in; i++) {
            uint8_t *c = &q[r * n_in + i];
            if (kind == 0 || kind == 4 || kind == 5) *c = (uint8_t)((rnd() & 0x80) | (rnd() & 7)); /* subnormals, +-0 */
            else if (kind == 1) *c = (rnd() & 1) ? 0x80 : 0x00;                      /* zeros of both signs */
            else if (kind == 2) *c = (uint8_t)((rnd() & 0x80) | (0x78 + rnd() % 7)); /* e = 15, up to 448 */
            else if (kind == 7) *c = (uint8_t)((rnd() & 0x80) | (rnd() & 1));      /* +-2^-9, +-0 */
        }
    /* large scales get small codes: sums stay far below fp32's overflow */
    if (kind == 3) *s = (uint8_t)(3 + rnd() % 8);   /* 3..10: BF16 subnormal weights */
    if (kind == 4) *s = (uint8_t)(240 + rnd() % 7); /* 240..246: the top of the fast range */
    if (kind == 5) *s = (uint8_t)(247 + rnd() % 4); /* 247..250: the exact path, still BF16 values */
    if (kind == 6 && edge >= 2) *s = (uint8_t)(rnd() % 3);       /* 0..2: below BF16's reach */
    if (kind == 7 && edge >= 2) *s = (uint8_t)(251 + rnd() % 4); /* 251..254: the exact path */
}

static void make_mats(mats *m, int64_t n_in, int64_t n_out, int edge) {
    const int64_t gi = (n_in + 31) / 32, go = (n_out + 31) / 32;
    m->q = malloc((size_t)(n_in * n_out + gi * go));
    m->bf = malloc((size_t)(n_in * n_out) * 2);
    uint8_t *grid = m->q + n_in * n_out;
    for (int64_t i = 0; i < n_in * n_out; i++) m->q[i] = code();
    for (int64_t b = 0; b < gi * go; b++) {
        grid[b] = (uint8_t)(116 + rnd() % 12); /* a checkpoint's spread: 2^-11 .. 2^0 */
        if (edge && rnd() % 4 == 0) block_edge(m->q, n_in, b / gi, b % gi, n_out, &grid[b], edge);
    }
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t i = 0; i < n_in; i++) {
            float v = e4m3_to_f32(m->q[r * n_in + i]) * ldexpf(1.0f, (int)grid[(r / 32) * gi + i / 32] - 127);
            uint32_t u;
            memcpy(&u, &v, 4);
            m->bf[r * n_in + i] = (uint16_t)(u >> 16);
        }
    m->w = (dsf_wmat){DSF_TYPE_FP8B32, n_in, n_out, (uint64_t)n_in, m->q, grid};
    m->b = (dsf_wmat){GGML_TYPE_BF16, n_in, n_out, (uint64_t)n_in * 2, (const uint8_t *)m->bf, NULL};
}

static void free_mats(mats *m) {
    free(m->q);
    free(m->bf);
}

/* Whether every value of the matrix is a BF16 value (the low half of its fp32 is zero). */
static int all_bf16(const mats *m) {
    const int64_t gi = (m->w.n_in + 31) / 32;
    for (int64_t r = 0; r < m->w.n_out; r++)
        for (int64_t i = 0; i < m->w.n_in; i++) {
            float v = e4m3_to_f32(m->q[r * m->w.n_in + i]) * ldexpf(1.0f, (int)m->w.scales[(r / 32) * gi + i / 32] - 127);
            uint32_t u;
            memcpy(&u, &v, 4);
            if (u & 0xFFFF) return 0;
        }
    return 1;
}

/* Activations at the edges of the formats' ranges (same_bits draws them when act_edges is set):
 * 1 the lowest normals (2^-126 .. 2^-120: a negative scale exponent moves them below the range),
 * 2 values near the top (2^110 .. 2^118: a positive one moves them past it), 3 subnormals and
 * zeros of both signs among ordinary values (the BF16 dots take a subnormal as zero), 4 ordinary
 * values with an infinity now and then, 5 magnitudes in [1, 2). */
static int act_edges;
static float edge_act(float v, int64_t i) {
    const float u = 1.0f + (float)(rnd() % 1000) / 1000.0f, sg = (rnd() & 1) ? -1.0f : 1.0f;
    switch (act_edges) {
    case 1: return sg * ldexpf(u, -126 + (int)(rnd() % 7));
    case 2: return sg * ldexpf(u, 110 + (int)(rnd() % 9));
    case 3: return rnd() % 2 ? v : rnd() % 2 ? sg * ldexpf(u, -140 + (int)(rnd() % 12)) : sg * 0.0f;
    case 5: return sg * u;
    default: return i % 97 == 5 ? sg * INFINITY : v;
    }
}

/* Runs both families of table k on the FP8 and the BF16 matrix for T tokens, rows [r0, r1), and
 * compares bit for bit (rows outside must stay NaN). Returns 0 or fails the test. */
static int same_bits(test_ctx *t, const dsf_kernels *k, const mats *m, int64_t T, int64_t r0, int64_t r1) {
    const int64_t n_in = m->w.n_in, ldy = m->w.n_out + 3;
    float *x = malloc((size_t)(T * n_in) * sizeof *x), *ya = malloc((size_t)(T * ldy) * sizeof *ya),
          *yb = malloc((size_t)(T * ldy) * sizeof *yb);
    uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0) * 4.0f - 2.0f;
    if (act_edges)
        for (int64_t i = 0; i < T * n_in; i++) x[i] = edge_act(x[i], i);
    act_to_bf16_ref(x, xb, T * n_in);
    int rc = 0;
    for (int fam = 0; fam < 2 && !rc; fam++) {
        for (int64_t i = 0; i < T * ldy; i++) ya[i] = yb[i] = NAN;
        if (fam == 0) {
            kern_matmul(k, &m->w, x, T, ya, ldy, r0, r1);
            kern_matmul(k, &m->b, x, T, yb, ldy, r0, r1);
        } else {
            kern_matmul_xbf16(k, &m->w, xb, T, ya, ldy, r0, r1);
            kern_matmul_xbf16(k, &m->b, xb, T, yb, ldy, r0, r1);
        }
        for (int64_t tt = 0; tt < T && !rc; tt++)
            for (int64_t r = 0; r < ldy && !rc; r++) {
                const float a = ya[tt * ldy + r], b = yb[tt * ldy + r];
                if (memcmp(&a, &b, 4) != 0 || ((r < r0 || r >= r1) && !isnan(a))) {
                    test_fail(t, __FILE__, __LINE__, "%s %s n_in=%lld n_out=%lld T=%lld rows [%lld,%lld): y[%lld][%lld] = %.9g, BF16 kernel %.9g",
                              k->name, fam ? "xbf16" : "fp32", (long long)n_in, (long long)m->w.n_out, (long long)T,
                              (long long)r0, (long long)r1, (long long)tt, (long long)r, a, b);
                    rc = -1;
                }
            }
    }
    free(x);
    free(xb);
    free(ya);
    free(yb);
    return rc;
}

static const char *const tables[] = {"ref", "avx2", "avx512", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};

/* Every table, both families, T in {1, 2, 3, 7, 16, 33}, shapes that cut the grid's blocks and
 * cross the K chunks of the BF16 kernels (1024, 2048, 4096), odd row ranges; real-like scales
 * (where a different order of additions shows in the last bits), then with edge blocks (every
 * value still a BF16 value; their large scales dominate their rows' sums). */
TEST(kernels_fp8_same_bits_as_bf16) {
    static const int64_t shapes[][2] = {{32, 5}, {64, 33}, {96, 70}, {1024 + 160, 37}, {2048 + 96, 9}, {4096 + 64, 6}};
    static const int64_t Ts[] = {1, 2, 3, 7, 16, 33};
    int ran = 0;
    for (unsigned n = 0; n < sizeof tables / sizeof *tables * 2; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n / 2]);
        if (!k) continue;
        ran++;
        for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            mats m;
            make_mats(&m, shapes[s][0], shapes[s][1], (int)(n % 2));
            const int64_t no = shapes[s][1];
            CHECKF(all_bf16(&m), "test data: a value that is not a BF16 value");
            for (unsigned c = 0; c < sizeof Ts / sizeof *Ts; c++) {
                if (shapes[s][0] > 2000 && Ts[c] > 16) continue; /* keep the test fast */
                int rc = same_bits(t, k, &m, Ts[c], 0, no);
                if (!rc && no > 2) rc = same_bits(t, k, &m, Ts[c], 1, no - 1);
                if (!rc && no > 3) rc = same_bits(t, k, &m, Ts[c], 2, 3);
                if (!rc && no > 33) rc = same_bits(t, k, &m, Ts[c], 31, no); /* a range that starts in a row block */
                if (rc) {
                    free_mats(&m);
                    return;
                }
            }
            free_mats(&m);
        }
    }
    CHECK(ran >= 1);
}

/* The model's shapes are multiples of 32; a row length that is not goes to the twin, as the BF16
 * kernels' does, and the last partial block of the grid counts. */
TEST(kernels_fp8_partial_blocks) {
    for (unsigned n = 0; n < sizeof tables / sizeof *tables; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n]);
        if (!k) continue;
        mats m;
        make_mats(&m, 40, 45, 1);
        int rc = same_bits(t, k, &m, 1, 0, 45);
        if (!rc) rc = same_bits(t, k, &m, 5, 3, 44);
        free_mats(&m);
        if (rc) return;
    }
}

/* Every scale of m set to S, and the BF16 matrix made again. */
static void set_scales(mats *m, uint8_t S) {
    const int64_t gi = (m->w.n_in + 31) / 32, n = gi * ((m->w.n_out + 31) / 32), n_in = m->w.n_in;
    memset(m->q + n_in * m->w.n_out, S, (size_t)n);
    for (int64_t i = 0; i < n_in * m->w.n_out; i++) {
        float v = e4m3_to_f32(m->q[i]) * ldexpf(1.0f, (int)S - 127);
        uint32_t u;
        memcpy(&u, &v, 4);
        m->bf[i] = (uint16_t)(u >> 16);
    }
}

/* The fused AVX-512 decode moves each block's scale onto the activations (fp8_avx512.c): it must
 * still give the BF16 kernel's bits where the moved factor would leave the range (tiny
 * activations and S = 116: below it; huge ones and S = 139: past it), for subnormal activations
 * (taken as zero), at infinities, and for a block whose weights are BF16 subnormals (S = 5 and
 * weights 1.875 2^-127, the only nonzero block of its rows: the BF16 dots flush them, so those
 * rows are 0, while the moved factor would make products above 2^-126 with |x| > 1.07: the
 * activations are drawn in [1, 2)). */
TEST(kernels_fp8_activation_edges) {
    static const struct { int edges; uint8_t S; } cases[] = {{1, 116}, {2, 139}, {3, 120}, {3, 116}, {4, 120}};
    for (unsigned n = 0; n < sizeof tables / sizeof *tables; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n]);
        if (!k) continue;
        int rc = 0;
        for (unsigned c = 0; c < sizeof cases / sizeof *cases && !rc; c++) {
            mats m;
            make_mats(&m, 2048 + 64, 70, 0);
            set_scales(&m, cases[c].S);
            act_edges = cases[c].edges;
            rc = same_bits(t, k, &m, 1, 0, 70);
            if (!rc) rc = same_bits(t, k, &m, 3, 5, 69);
            act_edges = 0;
            free_mats(&m);
        }
        if (!rc) {
            mats m;
            make_mats(&m, 2048 + 64, 70, 0);
            set_scales(&m, 120);
            for (int64_t r = 0; r < 32; r++) /* row block 0: codes only in its group 1 */
                for (int64_t i = 0; i < 2048 + 64; i++)
                    m.q[r * (2048 + 64) + i] = i / 32 != 1 ? 0 : (uint8_t)((rnd() & 0x80) | 0x17); /* 1.875 2^-5 */
            m.q[(2048 + 64) * 70 + 1] = 5;
            for (int64_t r = 0; r < 32; r++)
                for (int64_t i = 0; i < 2048 + 64; i++) {
                    float v = e4m3_to_f32(m.q[r * (2048 + 64) + i]) * ldexpf(1.0f, i / 32 == 1 ? 5 - 127 : 120 - 127);
                    uint32_t u;
                    memcpy(&u, &v, 4);
                    m.bf[r * (2048 + 64) + i] = (uint16_t)(u >> 16);
                }
            CHECKF(all_bf16(&m), "test data: a value that is not a BF16 value");
            act_edges = 5;
            rc = same_bits(t, k, &m, 1, 0, 70);
            act_edges = 0;
            free_mats(&m);
        }
        if (rc) return;
    }
}

/* The tolerance of row r, token tt against the twin: fp32 summation as tests/unit/kernels.c,
 * (n_in/16 + 64) 2^-24 sum|w x|; plus, for weights below 2^-126 (S <= 10), what BF16 rounding
 * (S <= 2) or the BF16 dots' flushing may drop: their |w x| and 2^-126 per partial sum. */
static double tol_of(const dsf_wmat *w, const float *x, int64_t r, int64_t tt) {
    float row[8192];
    wmat_dequant_row(w, r, row);
    double s = 0, tiny = 0;
    for (int64_t i = 0; i < w->n_in; i++) {
        const double p = fabs((double)row[i] * x[tt * w->n_in + i]);
        s += p;
        if (fabsf(row[i]) < 0x1p-126f) tiny += p;
    }
    return ((double)w->n_in / 16 + 64) * 0x1p-24 * s + tiny + (double)w->n_in * 0x1p-126;
}

/* Every table against the twin, with the exceptional scales too (S = 0..2: values BF16 cannot
 * hold; 247..254: the exact path); tolerance: tol_of. */
TEST(kernels_fp8_vs_twin) {
    static const int64_t Ts[] = {1, 3, 16};
    for (unsigned n = 0; n < sizeof tables / sizeof *tables; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n]);
        if (!k) continue;
        mats m;
        make_mats(&m, 2048 + 32, 70, 2);
        const int64_t n_in = m.w.n_in, no = m.w.n_out;
        for (unsigned c = 0; c < 3; c++) {
            const int64_t T = Ts[c];
            float *x = malloc((size_t)(T * n_in) * sizeof *x), *y = malloc((size_t)(T * no) * sizeof *y),
                  *yr = malloc((size_t)(T * no) * sizeof *yr);
            uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
            for (int64_t i = 0; i < T * n_in; i++) x[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0) * 4.0f - 2.0f;
            act_to_bf16_ref(x, xb, T * n_in);
            for (int64_t i = 0; i < T * n_in; i++) x[i] = bf16_to_f32(xb[i]);
            int bad = 0;
            for (int fam = 0; fam < 2 && !bad; fam++) {
                if (fam == 0) {
                    kern_matmul(k, &m.w, x, T, y, no, 0, no);
                    matmul_any_ref(&m.w, x, T, yr, no, 0, no);
                } else {
                    kern_matmul_xbf16(k, &m.w, xb, T, y, no, 0, no);
                    matmul_xbf16_any_ref(&m.w, xb, T, yr, no, 0, no);
                }
                for (int64_t i = 0; i < T * no && !bad; i++) {
                    const double tol = tol_of(&m.w, x, i % no, i / no);
                    if (!(fabs((double)y[i] - (double)yr[i]) <= tol)) {
                        test_fail(t, __FILE__, __LINE__, "%s %s T=%lld y[%lld][%lld] = %.9g, twin %.9g (tol %.3g)", k->name,
                                  fam ? "xbf16" : "fp32", (long long)T, (long long)(i / no), (long long)(i % no), y[i], yr[i], tol);
                        bad = 1;
                    }
                }
            }
            free(x);
            free(xb);
            free(y);
            free(yr);
            if (bad) {
                free_mats(&m);
                return;
            }
        }
        free_mats(&m);
    }
}

/* A NaN code (0x7F, 0xFF) or a NaN scale (255) makes its rows NaN in every table and family, as
 * the twin's and the BF16 matrix's; the other rows keep the BF16 kernel's bits. */
TEST(kernels_fp8_nan) {
    for (unsigned n = 0; n < sizeof tables / sizeof *tables; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n]);
        if (!k) continue;
        for (int64_t T = 1; T <= 3; T += 2) {
            mats m;
            make_mats(&m, 1024, 70, 0);
            m.q[5 * 1024 + 77] = 0x7F;      /* row 5 */
            m.q[40 * 1024 + 1000] = 0xFF;   /* row 40 */
            uint8_t *grid = (uint8_t *)(uintptr_t)m.w.scales;
            grid[2 * 32 + 3] = 255;         /* rows 64..69 */
            float x[3 * 1024], y[3 * 70], yb[3 * 70];
            uint16_t xb[3 * 1024];
            for (int i = 0; i < 3 * 1024; i++) x[i] = (float)(i % 7) - 3.0f;
            act_to_bf16_ref(x, xb, 3 * 1024);
            for (int fam = 0; fam < 2; fam++) {
                if (fam == 0) {
                    kern_matmul(k, &m.w, x, T, y, 70, 0, 70);
                    kern_matmul(k, &m.b, x, T, yb, 70, 0, 70);
                } else {
                    kern_matmul_xbf16(k, &m.w, xb, T, y, 70, 0, 70);
                    kern_matmul_xbf16(k, &m.b, xb, T, yb, 70, 0, 70);
                }
                for (int64_t i = 0; i < T * 70; i++) {
                    const int64_t r = i % 70;
                    if (r == 5 || r == 40 || r >= 64)
                        CHECKF(isnan(y[i]), "%s %s T=%lld row %lld: %g, not NaN", k->name, fam ? "xbf16" : "fp32",
                               (long long)T, (long long)r, y[i]);
                    else
                        CHECKF(!memcmp(&y[i], &yb[i], 4), "%s %s T=%lld row %lld: %.9g, BF16 kernel %.9g", k->name,
                               fam ? "xbf16" : "fp32", (long long)T, (long long)r, y[i], yb[i]);
                }
            }
            free_mats(&m);
        }
    }
}

/* Decode (T = 1, rows split unevenly) and prefill (one batch; two chunks) agree bit for bit in
 * each table and family: the fused T = 1 kernels and the scratch path must not differ. */
TEST(kernels_fp8_batch_invariant) {
    enum { NI = 2048 + 64, NO = 41, T = 19, FIRST = 6 };
    static const int64_t cut[4] = {0, 3, 30, NO};
    for (unsigned n = 0; n < sizeof tables / sizeof *tables; n++) {
        const dsf_kernels *k = kernels_by_name(tables[n]);
        if (!k) continue;
        mats m;
        make_mats(&m, NI, NO, 2);
        float *x = malloc(sizeof(float) * T * NI);
        uint16_t *xb = malloc(sizeof(uint16_t) * T * NI);
        for (int64_t i = 0; i < T * NI; i++) x[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
        act_to_bf16_ref(x, xb, T * NI);
        static float yb[T * NO], yc[T * NO], y1[NO];
        int bad = 0;
        for (int fam = 0; fam < 2 && !bad; fam++) {
            if (fam == 0) {
                kern_matmul(k, &m.w, x, T, yb, NO, 0, NO);
                kern_matmul(k, &m.w, x, FIRST, yc, NO, 0, NO);
                kern_matmul(k, &m.w, x + FIRST * NI, T - FIRST, yc + FIRST * NO, NO, 0, NO);
            } else {
                kern_matmul_xbf16(k, &m.w, xb, T, yb, NO, 0, NO);
                kern_matmul_xbf16(k, &m.w, xb, FIRST, yc, NO, 0, NO);
                kern_matmul_xbf16(k, &m.w, xb + FIRST * NI, T - FIRST, yc + FIRST * NO, NO, 0, NO);
            }
            if (memcmp(yb, yc, sizeof yb)) {
                test_fail(t, __FILE__, __LINE__, "%s %s: chunked prefill differs from one prefill", k->name, fam ? "xbf16" : "fp32");
                bad = 1;
            }
            for (int64_t tt = 0; tt < T && !bad; tt++) {
                for (int c = 0; c < 3; c++) {
                    if (fam == 0) kern_matmul(k, &m.w, x + tt * NI, 1, y1, NO, cut[c], cut[c + 1]);
                    else kern_matmul_xbf16(k, &m.w, xb + tt * NI, 1, y1, NO, cut[c], cut[c + 1]);
                }
                if (memcmp(y1, yb + tt * NO, sizeof y1)) {
                    test_fail(t, __FILE__, __LINE__, "%s %s: token %lld decoded alone differs from the batch", k->name,
                              fam ? "xbf16" : "fp32", (long long)tt);
                    bad = 1;
                }
            }
        }
        free(x);
        free(xb);
        free_mats(&m);
        if (bad) return;
    }
}

/* The fast tables carry both entries (the amx ones replace the BF16-activation entry); the ref
 * table has none, so the dispatch falls back to the twins; the scalar decoder to BF16 gives the
 * format's values. */
TEST(kernels_fp8_dispatch) {
    static const char *const fast[] = {"avx2", "avx512", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};
    for (unsigned n = 0; n < 6; n++) {
        const dsf_kernels *k = kernels_by_name(fast[n]);
        if (k) CHECKF(k->fp8b32 && k->fp8b32_xbf16, "%s lacks an FP8_B32 entry", fast[n]);
    }
    CHECK(!kernels_ref.fp8b32 && !kernels_ref.fp8b32_xbf16);
    mats m;
    make_mats(&m, 64, 40, 2);
    uint16_t row[40 * 64];
    fp8_rows_bf16(&m.w, 0, 40, row, fp8_row_bf16_ref);
    int same = 1;
    for (int i = 0; i < 40 * 64; i++) {
        const float v = e4m3_to_f32(m.q[i]) * ldexpf(1.0f, (int)m.w.scales[(i / 64 / 32) * 2 + (i % 64) / 32] - 127);
        same &= row[i] == f32_to_bf16(v);
    }
    free_mats(&m);
    CHECK(same);
}
