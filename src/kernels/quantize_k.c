/* quantize_k.c: the K-quant encoders (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-value super-blocks
 * whose sub-blocks carry small integer scales under one or two f16 super-scales.
 *
 * Owns: the two-level scale search and the bit packing of the five layouts (TYPE.json of
 * ../shared/testdata/quants; gguf-layout.md §1.5), written to be read by quant.c's decoders.
 * Must not: allocate (a super-block's scratch is on the stack), do I/O, keep state.
 *
 * The search, per super-block, minimizing E = sum w (x - deq)^2 with deq as decoded:
 *  1. each sub-block gets its own best float scale (and offset) from the grid searches of
 *     quantize.c (candidate scales, then alternating assignment and least squares);
 *  2. the super-scale maps the largest sub-scale to the end of the integer range, and each
 *     sub-scale is rounded to an integer;
 *  3. then, while E decreases: the super-scale(s) are re-solved by weighted least squares for
 *     the current integers and quants, rounded to f16, and every sub-block picks the best of
 *     the integer scales (and mins) next to its float optimum, reassigning its quants. */
#include "kernels/quantize_impl.h"
#include "kernels/quant.h"
#include "kernels/grids.h"

#include <math.h>
#include <string.h>

/* ================================================================ scales with mins
 * deq = (d * sc_j) * q - (dmin * m_j), q in [0, nmax], sc_j, m_j in [0, scmax]: Q2_K (16 x 16,
 * nmax 3, 4-bit sc/m), Q4_K and Q5_K (8 x 32, nmax 15 / 31, 6-bit sc/m). */

typedef struct {
    int nsub, len, nmax, scmax;
    bool both_ends; /* sub-block candidates anchored at the maximum too (qz_fit_affine) */
} kmin_fmt;

typedef struct {
    float d, dmin;
    uint8_t sc[16], m[16];
    uint8_t q[256];
} kmin_blk;

/* Sub-block j's best (sc, m) next to its float optimum (s, mn) for the block's d and dmin: the
 * rounded pair, then sc +-1 with that m, then m +-1 with the best sc. Writes them and the quants
 * into k, returns the sub-block's E. */
static double kmin_pick(const float *x, const float *w, const kmin_fmt *f, kmin_blk *k, int j, float s,
                        float mn) {
    static const int8_t step[5][2] = {{0, 0}, {-1, 0}, {1, 0}, {0, -1}, {0, 1}};
    int len = f->len;
    int c0 = k->d > 0 ? qz_nearest(s / k->d, 0, f->scmax) : 0;
    int m0 = k->dmin > 0 ? qz_nearest(mn / k->dmin, 0, f->scmax) : 0;
    double best = -1;
    for (int t = 0; t < 5; t++) {
        if (t == 3) c0 = k->sc[j]; /* the m steps start from the best sc */
        int c = c0 + step[t][0], m = m0 + step[t][1];
        if (c < 0 || c > f->scmax || m < 0 || m > f->scmax) continue;
        uint8_t q[32];
        double e = qz_assign_affine(x + j * len, w + j * len, len, k->d * (float)c, k->dmin * (float)m, f->nmax, q);
        if (best < 0 || e < best) {
            best = e;
            k->sc[j] = (uint8_t)c;
            k->m[j] = (uint8_t)m;
            memcpy(k->q + j * len, q, (size_t)len);
        }
    }
    return best;
}

static double kmin_pick_all(const float *x, const float *w, const kmin_fmt *f, kmin_blk *k, const float *s,
                            const float *mn) {
    double e = 0;
    for (int j = 0; j < f->nsub; j++) e += kmin_pick(x, w, f, k, j, s[j], mn[j]);
    return e;
}

/* Least squares for (d, dmin) with the integers and quants of k fixed: deq_i = d*A_i - dmin*B_i,
 * A_i = sc_j q_i, B_i = m_j; when the two are not separable, d alone for the dmin passed in
 * *dmin. False when every A is 0. */
static bool kmin_ls(const float *x, const float *w, const kmin_fmt *f, const kmin_blk *k, float *d,
                    float *dmin) {
    double aa = 0, ab = 0, bb = 0, xa = 0, xb = 0;
    for (int j = 0; j < f->nsub; j++) {
        for (int l = 0; l < f->len; l++) {
            int i = j * f->len + l;
            double a = (double)k->sc[j] * k->q[i], b = k->m[j], wi = w[i];
            aa += wi * a * a;
            ab += wi * a * b;
            bb += wi * b * b;
            xa += wi * x[i] * a;
            xb += wi * x[i] * b;
        }
    }
    double det = aa * bb - ab * ab;
    if (det > 1e-9 * aa * bb) { /* below: A and B (nearly) proportional, d and dmin not separable */
        *d = (float)((xa * bb - ab * xb) / det);
        *dmin = (float)((xa * ab - aa * xb) / det);
        return true;
    }
    if (aa > 0) { /* every m is 0, or no separate min: fit d alone with dmin as it is */
        *d = (float)((xa + (double)*dmin * ab) / aa);
        return true;
    }
    return false;
}

static void kmin_solve(const float *x, const float *w, const kmin_fmt *f, kmin_blk *k) {
    float s[16], mn[16], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < f->nsub; j++) {
        float b;
        qz_fit_affine(x + j * f->len, w + j * f->len, f->len, f->nmax, true, f->both_ends, k->q + j * f->len, &s[j],
                      &b);
        mn[j] = -b;
        if (s[j] > smax) smax = s[j];
        if (mn[j] > mmax) mmax = mn[j];
    }
    k->d = qz_f16_round(smax / (float)f->scmax);
    k->dmin = qz_f16_round(mmax / (float)f->scmax);
    double e = kmin_pick_all(x, w, f, k, s, mn);
    for (int it = 0; it < 8; it++) {
        kmin_blk t = *k;
        if (!kmin_ls(x, w, f, k, &t.d, &t.dmin)) break;
        t.d = qz_f16_round(t.d);
        t.dmin = qz_f16_round(t.dmin);
        if (t.d == k->d && t.dmin == k->dmin) break;
        double e2 = kmin_pick_all(x, w, f, &t, s, mn);
        if (!(e2 < e)) break;
        *k = t;
        e = e2;
    }
}

/* Q4_K/Q5_K scales[12]: sub-block j < 4: sc in the low 6 bits of byte j, m in the low 6 bits
 * of byte j + 4; j >= 4: the low nibbles of sc and m in byte j + 4 (sc low, m high), their top
 * 2 bits in bits 6-7 of byte j - 4 (sc) and byte j (m). */
static void pack_scales_k4(const kmin_blk *k, uint8_t *s) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        int sc = k->sc[j], m = k->m[j];
        if (j < 4) {
            s[j] |= (uint8_t)sc;
            s[j + 4] |= (uint8_t)m;
        } else {
            s[j + 4] = (uint8_t)((sc & 15) | ((m & 15) << 4));
            s[j - 4] |= (uint8_t)((sc >> 4) << 6);
            s[j] |= (uint8_t)((m >> 4) << 6);
        }
    }
}

/* Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: element e = 64c + r: r < 32 in the low
 * nibble of qs[32c + r], else the high nibble of qs[32c + r - 32].
 * Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: the low 4 bits as Q4_K; the
 * fifth bit of element e (sub-block j = e / 32, l = e % 32) is bit j of qh[l]. */
static void block_q45_k(const float *x, const float *w, uint8_t *out, bool five) {
    const kmin_fmt f = {8, 32, five ? 31 : 15, 63, true};
    kmin_blk k;
    kmin_solve(x, w, &f, &k);
    qz_put16(out, f32_to_f16(k.d));
    qz_put16(out + 2, f32_to_f16(k.dmin));
    pack_scales_k4(&k, out + 4);
    uint8_t *qh = out + 16, *qs = out + (five ? 48 : 16);
    memset(qs, 0, 128);
    if (five) memset(qh, 0, 32);
    for (int e = 0; e < 256; e++) {
        int c = e / 64, r = e % 64, v = k.q[e];
        qs[32 * c + r % 32] |= (uint8_t)((v & 15) << (r < 32 ? 0 : 4));
        if (five) qh[e % 32] |= (uint8_t)((v >> 4) << (e / 32));
    }
}

void qz_block_q4_k(const float *x, const float *w, uint8_t *out) { block_q45_k(x, w, out, false); }
void qz_block_q5_k(const float *x, const float *w, uint8_t *out) { block_q45_k(x, w, out, true); }

/* Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: scales[j] = sc_j | m_j << 4 for sub-block
 * j = e / 16; element e = 128h + 32p + l (p the 2-bit plane) sits at bits 2p of qs[32h + l]. */
void qz_block_q2_k(const float *x, const float *w, uint8_t *out) {
    /* Anchored at the minimum only: with 4 levels and 4-bit mins, the candidates that clip the
     * low end pick sub-block mins that the shared dmin then holds worse (measured on the
     * fixtures: RMSE 0.88 instead of 0.80 x ggml's on row 0). */
    const kmin_fmt f = {16, 16, 3, 15, false};
    kmin_blk k;
    kmin_solve(x, w, &f, &k);
    for (int j = 0; j < 16; j++) out[j] = (uint8_t)(k.sc[j] | (k.m[j] << 4));
    uint8_t *qs = out + 16;
    memset(qs, 0, 64);
    for (int e = 0; e < 256; e++) qs[32 * (e / 128) + e % 32] |= (uint8_t)(k.q[e] << (2 * ((e % 128) / 32)));
    qz_put16(out + 80, f32_to_f16(k.d));
    qz_put16(out + 82, f32_to_f16(k.dmin));
}

/* ================================================================ signed scales
 * deq = (d * sc_j) * v(q), nsub sub-blocks of len, sc_j in [sclo, schi]: Q3_K (16 x 16, v = q in
 * [-4, 3], sc in [-32, 31]), Q6_K (16 x 16, v = q in [-32, 31], sc an int8) and IQ4_XS (8 x 32,
 * v = grid_iq4nl[q], sc in [-32, 31]). */

typedef struct {
    int nsub, len, lo, hi, sclo, schi;
    bool nl; /* v = grid_iq4nl[q] (q in [0, 15]) instead of q in [lo, hi] */
} ksym_fmt;

typedef struct {
    float d;
    int8_t sc[16];
    int8_t q[256];
} ksym_blk;

static int ksym_value(const ksym_fmt *f, int q) { return f->nl ? grid_iq4nl[q] : q; }

static double ksym_pick_all(const float *x, const float *w, const ksym_fmt *f, ksym_blk *k, const float *s) {
    qz_assign_fn assign = f->nl ? qz_assign_nl : qz_assign_sym;
    int len = f->len;
    double e = 0;
    for (int j = 0; j < f->nsub; j++) {
        int c0 = k->d != 0.0f ? qz_nearest(s[j] / k->d, f->sclo, f->schi) : 0;
        double best = -1;
        for (int c = c0 - 1; c <= c0 + 1; c++) {
            if (c < f->sclo || c > f->schi) continue;
            int8_t q[32];
            double ej = assign(x + len * j, w + len * j, len, k->d * (float)c, f->lo, f->hi, q);
            if (best < 0 || ej < best) {
                best = ej;
                k->sc[j] = (int8_t)c;
                memcpy(k->q + len * j, q, (size_t)len);
            }
        }
        e += best;
    }
    return e;
}

/* From the starting super-scale d0: integers, then least squares on d while E decreases. */
static double ksym_refine(const float *x, const float *w, const ksym_fmt *f, const float *s, float d0,
                          ksym_blk *k) {
    k->d = qz_f16_round(d0);
    double e = ksym_pick_all(x, w, f, k, s);
    for (int it = 0; it < 8; it++) {
        double xa = 0, aa = 0;
        for (int i = 0; i < f->nsub * f->len; i++) {
            double a = (double)k->sc[i / f->len] * ksym_value(f, k->q[i]);
            xa += (double)w[i] * x[i] * a;
            aa += (double)w[i] * a * a;
        }
        if (!(aa > 0)) break;
        ksym_blk t = *k;
        t.d = qz_f16_round((float)(xa / aa));
        if (t.d == k->d) break;
        double e2 = ksym_pick_all(x, w, f, &t, s);
        if (!(e2 < e)) break;
        *k = t;
        e = e2;
    }
    return e;
}

/* The better of the two starts that put the largest sub-scale at either end of [sclo, schi]. */
static void ksym_solve(const float *x, const float *w, const ksym_fmt *f, ksym_blk *k) {
    float s[16], smax = 0.0f;
    for (int j = 0; j < f->nsub; j++) {
        int8_t *q = k->q + f->len * j;
        s[j] = f->nl ? qz_fit_nl(x + f->len * j, w + f->len * j, f->len, q)
                     : qz_fit_sym(x + f->len * j, w + f->len * j, f->len, f->lo, f->hi, q);
        if (fabsf(s[j]) > fabsf(smax)) smax = s[j];
    }
    double e0 = ksym_refine(x, w, f, s, smax / (float)f->sclo, k);
    ksym_blk t;
    double e1 = ksym_refine(x, w, f, s, smax / (float)f->schi, &t);
    if (e1 < e0) *k = t;
}

/* Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: element e = 128h + 32p + l stores
 * u = q + 4: its low 2 bits at bits 2p of qs[32h + l], its bit 2 as bit 4h + p of hmask[l].
 * Scale u_j = sc_j + 32 (6 bits): low nibble in scales[j] (j < 8) or the high nibble of
 * scales[j - 8]; top 2 bits at bits 2 * (j / 4) of scales[8 + j % 4]. */
void qz_block_q3_k(const float *x, const float *w, uint8_t *out) {
    const ksym_fmt f = {16, 16, -4, 3, -32, 31, false};
    ksym_blk k;
    ksym_solve(x, w, &f, &k);
    memset(out, 0, 108);
    uint8_t *hm = out, *qs = out + 32, *sb = out + 96;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, p = (e % 128) / 32, l = e % 32, u = k.q[e] + 4;
        qs[32 * h + l] |= (uint8_t)((u & 3) << (2 * p));
        hm[l] |= (uint8_t)((u >> 2) << (4 * h + p));
    }
    for (int j = 0; j < 16; j++) {
        int u = k.sc[j] + 32;
        sb[j % 8] |= (uint8_t)((u & 15) << (j < 8 ? 0 : 4));
        sb[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
    }
    qz_put16(out + 108, f32_to_f16(k.d));
}

/* Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: element e = 128h + 32p + l stores u = q + 32:
 * its low 4 bits in ql[64h + 32(p % 2) + l] (low nibble for p < 2, high for p >= 2), its top 2
 * bits at bits 2p of qh[32h + l]; sub-block j = e / 16 has scales[j]. */
void qz_block_q6_k(const float *x, const float *w, uint8_t *out) {
    const ksym_fmt f = {16, 16, -32, 31, -128, 127, false};
    ksym_blk k;
    ksym_solve(x, w, &f, &k);
    memset(out, 0, 192);
    uint8_t *ql = out, *qh = out + 128;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, p = (e % 128) / 32, l = e % 32, u = k.q[e] + 32;
        ql[64 * h + 32 * (p % 2) + l] |= (uint8_t)((u & 15) << (p < 2 ? 0 : 4));
        qh[32 * h + l] |= (uint8_t)((u >> 4) << (2 * p));
    }
    for (int j = 0; j < 16; j++) out[192 + j] = (uint8_t)k.sc[j];
    qz_put16(out + 208, f32_to_f16(k.d));
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: group g (32 values) has 6-bit
 * u = sc_g + 32, its low nibble as nibble g % 2 of scales_l[g / 2], its top 2 bits at bits 2g
 * of scales_h; its 16 bytes qs[16g..] hold element j in the low nibble, j + 16 in the high. */
void qz_block_iq4_xs(const float *x, const float *w, uint8_t *out) {
    const ksym_fmt f = {8, 32, 0, 15, -32, 31, true};
    ksym_blk k;
    ksym_solve(x, w, &f, &k);
    uint16_t sh = 0;
    memset(out + 4, 0, 4);
    for (int g = 0; g < 8; g++) {
        int u = k.sc[g] + 32;
        out[4 + g / 2] |= (uint8_t)((u & 15) << (4 * (g % 2)));
        sh |= (uint16_t)((u >> 4) << (2 * g));
        for (int j = 0; j < 16; j++) out[8 + 16 * g + j] = (uint8_t)(k.q[32 * g + j] | (k.q[32 * g + j + 16] << 4));
    }
    qz_put16(out, f32_to_f16(k.d));
    qz_put16(out + 2, sh);
}
