/* quantize_iq2.c: the encoders of the 2-bit grid types IQ2_XXS, IQ2_XS and IQ2_S: 256-value
 * super-blocks of 8-value sub-groups, each one entry of a fixed grid (grid_iq2xxs/xs/s, values
 * {8, 25, 43}) with a sign per value, under a 4-bit scale s per 32 values (IQ2_XXS) or 16 values
 * (IQ2_XS, IQ2_S) and one f16 super-scale d: deq = d * (0.5 + s) * 0.25 * grid value * sign.
 *
 * Owns: the grid search, the scale search and the bit packing of the three layouts (TYPE.json of
 * ../shared/testdata/quants), written to be read by dequant.c's decoders.
 * Must not: allocate (a super-block's scratch, about 70 KiB, is on the stack), do I/O, keep state,
 * or contract floating-point expressions.
 * Invariant: as quantize_impl.h's: finite inputs, weights >= 0 with a positive sum; every byte
 * of the block is written. IQ2_XXS/IQ2_XS store 7 sign bits per sub-group; the decoder's 8th is
 * their parity (the count of negated values is even), so the encoder only writes such patterns.
 *
 * The search, per super-block, minimizing E = sum w (x - deq)^2:
 *  1. sub-group: for the multiplier m (= d (0.5 + s) / 4) the best signs follow x, and E of grid
 *     entry n is C - 2m P_n + m^2 Q_n with P_n = sum w |x| g, Q_n = sum w g^2, C = sum w x^2.
 *     Under the parity rule, an odd count of negative x costs the cheapest flip, 4 m min(w |x| g):
 *     P_n drops by 2 min(w |x| g). So the best entry for m maximizes P_n - (m / 2) Q_n over the
 *     grid: it lies on the upper convex hull of the points (Q_n, P_n), computed once per sub-group
 *     (quickhull over all entries, exact); any m then costs a scan of a few hull vertices.
 *  2. scale group (the values under one 4-bit s): the exact minimum of its E over a free m (E is
 *     piecewise quadratic in m between the hulls' breakpoints).
 *  3. super-scale: f16 values of d around the one that puts the largest group optimum at s = 15,
 *     each group taking the better of the two s next to its optimum; then the f16 steps next to
 *     the best d. Cost: see quantize.h. */
#include "kernels/quantize_impl.h"
#include "kernels/quant.h"
#include "kernels/grids.h"

#include <math.h>
#include <string.h>

#define IQ2_NMAX 1024 /* the largest grid (IQ2_S) */
#define IQ2_HMAX 40   /* hull vertices kept per sub-group (the hulls seen are far smaller) */

typedef struct {
    const uint64_t *grid;
    int n;       /* grid entries: 256, 512 or 1024 */
    int per;     /* sub-groups under one 4-bit scale: 4 (IQ2_XXS) or 2 */
    bool parity; /* 7 stored sign bits, the 8th their parity */
} iq2_fmt;

/* One sub-group of 8 values: its hull vertices in order of increasing t (decreasing Q): vertex
 * i is the best entry for t = m / 2 in [bp[i - 1], bp[i]]. */
typedef struct {
    double c; /* sum w x^2 */
    int h;
    uint16_t id[IQ2_HMAX];
    float p[IQ2_HMAX], q[IQ2_HMAX], bp[IQ2_HMAX];
} iq2_sub;

/* A super-block's scratch: the grid as floats (value j of entry n at v[j][n]) and one sub-group's
 * scores. */
typedef struct {
    float v[8][IQ2_NMAX];
    float P[IQ2_NMAX], Q[IQ2_NMAX], V[IQ2_NMAX];
    uint8_t fl[IQ2_NMAX];
    uint16_t ids[IQ2_NMAX];
} iq2_scratch;

/* ================================================================ sub-group hulls */

/* P_n (parity-adjusted) and Q_n of every entry for values x, weights w. N is a constant in each
 * caller (iq2_hull inlines hull_n three times) so that the loops over n vectorize. */
static inline __attribute__((always_inline)) void scores_n(int N, bool odd, const float a[8], const float b[8],
                                                           const float (*restrict v)[IQ2_NMAX], float *restrict P,
                                                           float *restrict Q) {
    for (int n = 0; n < N; n++) {
        float p = 0.0f, q = 0.0f;
        for (int j = 0; j < 8; j++) {
            p += a[j] * v[j][n];
            q += b[j] * v[j][n] * v[j][n];
        }
        P[n] = p;
        Q[n] = q;
    }
    if (!odd) return;
    for (int n = 0; n < N; n++) {
        float r = a[0] * v[0][n];
        for (int j = 1; j < 8; j++) {
            float rj = a[j] * v[j][n];
            r = rj < r ? rj : r;
        }
        P[n] -= 2.0f * r;
    }
}

static void hull_push(iq2_sub *h, const iq2_scratch *s, int n) {
    h->id[h->h] = (uint16_t)n;
    h->p[h->h] = s->P[n];
    h->q[h->h] = s->Q[n];
    h->h++;
}

/* The hull vertices strictly between a and b (Q_a > Q_b, P_a > P_b: a wins at smaller t) among
 * ids[0..cnt), appended in order. The best entry at the knot t of a and b is a vertex when it
 * beats them there; the entries that can still be vertices lie above one of the two new knots'
 * chords (any other lies below the convex envelope of a, k and b everywhere). */
static void hull_between(const iq2_scratch *s, uint16_t *ids, int cnt, int a, int b, iq2_sub *h) {
    const float *P = s->P, *Q = s->Q;
    if (cnt == 0 || h->h >= IQ2_HMAX - 1) return;
    float tx = (P[a] - P[b]) / (Q[a] - Q[b]), best = P[a] - tx * Q[a];
    int k = -1;
    for (int i = 0; i < cnt; i++) {
        float v = P[ids[i]] - tx * Q[ids[i]];
        if (v > best) {
            best = v;
            k = ids[i];
        }
    }
    if (k < 0 || !(Q[k] < Q[a] && Q[k] > Q[b])) return; /* the second: rounding at a near-tie */
    float t1 = (P[a] - P[k]) / (Q[a] - Q[k]), b1 = P[a] - t1 * Q[a];
    float t2 = (P[k] - P[b]) / (Q[k] - Q[b]), b2 = P[k] - t2 * Q[k];
    int nl = 0, nr;
    for (int i = 0; i < cnt; i++) {
        uint16_t u = ids[i];
        if (u != k && P[u] - t1 * Q[u] > b1) {
            ids[i] = ids[nl];
            ids[nl++] = u;
        }
    }
    nr = nl;
    for (int i = nl; i < cnt; i++) {
        uint16_t u = ids[i];
        if (u != k && P[u] - t2 * Q[u] > b2) {
            ids[i] = ids[nr];
            ids[nr++] = u;
        }
    }
    hull_between(s, ids, nl, a, k, h);
    if (h->h < IQ2_HMAX - 1) hull_push(h, s, k);
    hull_between(s, ids + nl, nr - nl, k, b, h);
}

/* The last n with v[n] the largest of v[0..N) (N a multiple of 8): lane maxima, then the index,
 * in loops that vectorize (a scalar running argmax does not). */
static inline __attribute__((always_inline)) int argmax_n(int N, const float *restrict v) {
    float lane[8];
    for (int l = 0; l < 8; l++) lane[l] = v[l];
    for (int n = 8; n < N; n += 8)
        for (int l = 0; l < 8; l++) lane[l] = v[n + l] > lane[l] ? v[n + l] : lane[l];
    float mx = lane[0];
    for (int l = 1; l < 8; l++) mx = lane[l] > mx ? lane[l] : mx;
    int k = 0;
    for (int n = 0; n < N; n++) k = v[n] >= mx ? n : k;
    return k;
}

/* The hull's ends and its first split over the whole grid (N entries), in passes that vectorize;
 * the few entries left go to hull_between. The ends: A, the best entry at t = 0 (the largest P),
 * and entry 0 (all values 8, the grids' first entry: no entry has a smaller Q, every grid value
 * being >= 8), the best as t grows. Then k, the best at the knot of A and 0, and the entries
 * above the chord of A and k (kept from the front of ids) or of k and 0 (from the back). */
static inline __attribute__((always_inline)) void hull_n(int N, bool odd, const float a[8], const float b[8],
                                                         iq2_scratch *s, iq2_sub *h) {
    scores_n(N, odd, a, b, s->v, s->P, s->Q);
    const float *P = s->P, *Q = s->Q;
    float *V = s->V;
    int A = argmax_n(N, P);
    h->h = 0;
    hull_push(h, s, A);
    if (A == 0) return;
    float tx = (P[A] - P[0]) / (Q[A] - Q[0]), base = P[0] - tx * Q[0];
    for (int n = 0; n < N; n++) V[n] = P[n] - tx * Q[n];
    V[A] = V[0] = -INFINITY;
    int k = argmax_n(N, V);
    if (V[k] > base && Q[k] < Q[A] && Q[k] > Q[0]) {
        float t1 = (P[A] - P[k]) / (Q[A] - Q[k]), b1 = P[A] - t1 * Q[A];
        float t2 = (P[k] - P[0]) / (Q[k] - Q[0]), b2 = P[k] - t2 * Q[k];
        uint8_t *fl = s->fl;
        for (int n = 0; n < N; n++) fl[n] = (uint8_t)((P[n] - t1 * Q[n] > b1) | (P[n] - t2 * Q[n] > b2) << 1);
        fl[A] = fl[k] = fl[0] = 0;
        int nl = 0, nr = 0;
        for (int n = 0; n < N; n += 8) {
            uint64_t any;
            memcpy(&any, fl + n, 8);
            if (!any) continue; /* most entries lie below both chords */
            for (int n2 = n; n2 < n + 8; n2++) {
                if (fl[n2] & 1) s->ids[nl++] = (uint16_t)n2;
                else if (fl[n2]) s->ids[N - 1 - nr++] = (uint16_t)n2;
            }
        }
        hull_between(s, s->ids, nl, A, k, h);
        if (h->h < IQ2_HMAX - 1) hull_push(h, s, k);
        hull_between(s, s->ids + N - nr, nr, k, 0, h);
    }
    hull_push(h, s, 0);
}

/* Sub-group x (8 values, weights w): its sum w x^2 and its hull over t in [0, inf). */
static void iq2_hull(const iq2_fmt *f, const float *x, const float *w, iq2_scratch *s, iq2_sub *h) {
    float a[8], b[8];
    int neg = 0;
    double cc = 0;
    for (int j = 0; j < 8; j++) {
        a[j] = w[j] * fabsf(x[j]);
        b[j] = w[j];
        neg += x[j] < 0.0f;
        cc += (double)w[j] * x[j] * x[j];
    }
    h->c = cc;
    bool odd = f->parity && (neg & 1);
    if (f->n == 256) hull_n(256, odd, a, b, s, h);
    else if (f->n == 512) hull_n(512, odd, a, b, s, h);
    else hull_n(1024, odd, a, b, s, h);
    for (int i = 0; i + 1 < h->h; i++) h->bp[i] = (h->p[i] - h->p[i + 1]) / (h->q[i] - h->q[i + 1]);
    h->bp[h->h - 1] = INFINITY;
}

/* E of the sub-group for multiplier m > 0 (its best entry's vertex in *vi): the vertex whose
 * stretch of t holds m / 2. */
static double sub_err(const iq2_sub *h, float m, int *vi) {
    float t = 0.5f * m;
    int i = 0;
    while (h->bp[i] < t) i++; /* bp[h - 1] is +inf */
    if (vi) *vi = i;
    double e = h->c - 2.0 * m * (h->p[i] - t * h->q[i]);
    return e > 0 ? e : 0;
}

/* ================================================================ scales */

/* The m > 0 that minimizes the summed E of the per sub-groups h[0..per) (0 when none helps): on
 * each stretch of t between consecutive hull breakpoints every sub-group keeps its vertex, E is
 * C - 2m sum P + m^2 sum Q, and its stationary point counts when it lies in the stretch. */
static float group_opt(const iq2_sub *h, int per) {
    int ptr[4] = {0, 0, 0, 0};
    float tlo = 0.0f, mbest = 0.0f;
    double gain = 0; /* the largest (sum P)^2 / sum Q found: E = C - gain */
    for (;;) {
        double sp = 0, sq = 0;
        float thi = INFINITY;
        int kmin = -1;
        for (int k = 0; k < per; k++) {
            sp += h[k].p[ptr[k]];
            sq += h[k].q[ptr[k]];
            if (h[k].bp[ptr[k]] < thi) {
                thi = h[k].bp[ptr[k]];
                kmin = k;
            }
        }
        if (sp > 0 && sq > 0) {
            double t = 0.5 * sp / sq;
            if (t >= tlo && t <= thi && sp * sp / sq > gain) {
                gain = sp * sp / sq;
                mbest = (float)(sp / sq);
            }
        }
        if (kmin < 0) break;
        ptr[kmin]++;
        tlo = thi;
    }
    return mbest;
}

/* The IQ2 multiplier of the 4-bit scale s, in the decoder's order (dequant.c iq2_scale). */
static inline float iq2_mult(float d, int s) { return d * (0.5f + (float)s) * 0.25f; }

static double group_err(const iq2_sub *h, int per, float m) {
    double e = 0;
    for (int k = 0; k < per; k++) e += sub_err(&h[k], m, NULL);
    return e;
}

/* The super-block's E for the stored scale d, each group taking the best of the two 4-bit scales
 * around its optimum mopt[g] (written to sc when not NULL). */
static double block_err(const iq2_fmt *f, const iq2_sub *h, const float *mopt, float d, uint8_t *sc) {
    int ng = 32 / f->per;
    double e = 0;
    for (int g = 0; g < ng; g++) {
        const iq2_sub *hg = h + g * f->per;
        int s0 = qz_nearest(4.0f * mopt[g] / d - 1.0f, 0, 15), s1 = s0 < 15 ? s0 + 1 : s0;
        double e0 = group_err(hg, f->per, iq2_mult(d, s0));
        double e1 = s1 != s0 ? group_err(hg, f->per, iq2_mult(d, s1)) : e0;
        e += e1 < e0 ? e1 : e0;
        if (sc) sc[g] = (uint8_t)(e1 < e0 ? s1 : s0);
    }
    return e;
}

/* Finds d (an f16 value), the 4-bit scales sc[ng] and, per sub-group, the grid entry id[32] and
 * sign mask sg[32] (bit j: value j negated). d = 0 (with any entries) for an all-tiny block. */
static float iq2_solve(const iq2_fmt *f, const float *x, const float *w, uint8_t *sc, uint16_t *id, uint8_t *sg) {
    iq2_scratch s;
    iq2_sub h[32];
    float mopt[16], mmax = 0.0f, amax = 0.0f;
    int ng = 32 / f->per;
    for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[i]));
    memset(sc, 0, (size_t)ng);
    memset(id, 0, 32 * sizeof *id);
    memset(sg, 0, 32);
    if (amax < QZ_TINY) return 0.0f;
    for (int j = 0; j < 8; j++)
        for (int n = 0; n < f->n; n++) s.v[j][n] = (float)((f->grid[n] >> (8 * j)) & 0xFF);
    for (int k = 0; k < 32; k++) iq2_hull(f, x + 8 * k, w + 8 * k, &s, &h[k]);
    for (int g = 0; g < ng; g++) {
        mopt[g] = group_opt(h + g * f->per, f->per);
        mmax = fmaxf(mmax, mopt[g]);
    }
    if (!(mmax > 0.0f)) return 0.0f;
    /* Candidates: the largest group optimum at s = 15 (d0), d from 0.8 d0 to 1.3 d0 in 1% steps,
     * each rounded to f16; then the f16 values up to 3 steps from the best. */
    float d0 = mmax / 3.875f, d = 0.0f;
    double best = -1;
    for (int k = -20; k <= 30; k++) {
        float dk = qz_f16_round(d0 * (1.0f + 0.01f * (float)k));
        if (!(dk > 0.0f) || dk == d) continue;
        double e = block_err(f, h, mopt, dk, NULL);
        if (best < 0 || e < best) {
            best = e;
            d = dk;
        }
    }
    if (!(d > 0.0f)) return 0.0f; /* every candidate below the smallest f16: the block stays 0 */
    float dc = d;
    for (int k = -3; k <= 3; k++) {
        float dk = qz_f16_step(dc, k);
        if (!k || isnan(dk) || !(dk > 0.0f)) continue;
        double e = block_err(f, h, mopt, dk, NULL);
        if (e < best) {
            best = e;
            d = dk;
        }
    }
    block_err(f, h, mopt, d, sc);
    /* The entries and signs for the chosen multipliers. */
    for (int k = 0; k < 32; k++) {
        int vi;
        sub_err(&h[k], iq2_mult(d, sc[k / f->per]), &vi);
        int n = h[k].id[vi];
        const float *xk = x + 8 * k, *wk = w + 8 * k;
        uint8_t mask = 0;
        int jmin = 0;
        float cmin = INFINITY;
        for (int j = 0; j < 8; j++) {
            mask |= (uint8_t)((xk[j] < 0.0f) << j);
            float cost = wk[j] * fabsf(xk[j]) * s.v[j][n]; /* what negating value j against x costs, / 4m */
            if (cost < cmin) {
                cmin = cost;
                jmin = j;
            }
        }
        if (f->parity && (__builtin_popcount(mask) & 1)) mask ^= (uint8_t)(1u << jmin);
        id[k] = (uint16_t)n;
        sg[k] = mask;
    }
    return d;
}

/* ================================================================ block layouts */

/* The block's search (iq2_solve) with its f16 d written at out. */
typedef struct {
    uint8_t sc[16], sg[32];
    uint16_t id[32];
} iq2_blk;

static void iq2_start(const iq2_fmt *f, const float *x, const float *w, uint8_t *out, iq2_blk *b) {
    qz_put16(out, f32_to_f16(iq2_solve(f, x, w, b->sc, b->id, b->sg)));
}

/* IQ2_XS/IQ2_S scales: byte g = the scale of sub-groups 0-1 of group g (low nibble), 2-3 (high). */
static void put_scales16(const uint8_t *sc, uint8_t *p) {
    for (int g = 0; g < 8; g++) p[g] = (uint8_t)(sc[2 * g] | sc[2 * g + 1] << 4);
}

/* IQ2_XXS {f16 d; 8 x (u8 idx[4]; u32 w)}: w bits 7k.. the low 7 sign bits of sub-group k, bits
 * 28..31 the group's scale. */
void qz_block_iq2_xxs(const float *x, const float *w, uint8_t *out) {
    static const iq2_fmt f = {grid_iq2xxs, 256, 4, true};
    iq2_blk b;
    iq2_start(&f, x, w, out, &b);
    for (int g = 0; g < 8; g++) {
        uint32_t word = (uint32_t)b.sc[g] << 28;
        for (int k = 0; k < 4; k++) {
            out[2 + 8 * g + k] = (uint8_t)b.id[4 * g + k];
            word |= (uint32_t)(b.sg[4 * g + k] & 127) << (7 * k);
        }
        qz_put32(out + 2 + 8 * g + 4, word);
    }
}

/* IQ2_XS {f16 d; u16 qs[32]; u8 scales[8]}: qs = 9-bit index | 7 sign bits << 9. */
void qz_block_iq2_xs(const float *x, const float *w, uint8_t *out) {
    static const iq2_fmt f = {grid_iq2xs, 512, 2, true};
    iq2_blk b;
    iq2_start(&f, x, w, out, &b);
    for (int k = 0; k < 32; k++) qz_put16(out + 2 + 2 * k, (uint16_t)(b.id[k] | (b.sg[k] & 127) << 9));
    put_scales16(b.sc, out + 66);
}

/* IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: index = qs[4g+k] | bits 2k..2k+1
 * of qh[g] << 8; the whole sign byte stored. */
void qz_block_iq2_s(const float *x, const float *w, uint8_t *out) {
    static const iq2_fmt f = {grid_iq2s, 1024, 2, false};
    iq2_blk b;
    iq2_start(&f, x, w, out, &b);
    memset(out + 66, 0, 8);
    for (int k = 0; k < 32; k++) {
        out[2 + k] = (uint8_t)b.id[k];
        out[34 + k] = b.sg[k];
        out[66 + k / 4] |= (uint8_t)((b.id[k] >> 8) << (2 * (k % 4)));
    }
    put_scales16(b.sc, out + 74);
}
