/* quantize_iq13.c: the encoders of the grid types IQ3_XXS, IQ3_S, IQ1_S and IQ1_M: 256-value
 * super-blocks of one f16 scale, small integer group scales, and grid entries (4 values for the
 * IQ3 grids, 8 for the IQ1 grid) with signs (IQ3) or a +-1/8 offset (IQ1).
 *
 * Owns: the grid-entry search, the two-level scale search and the bit packing of the four
 * layouts (TYPE.json of ../shared/testdata/quants), written to be read by dequant.c's decoders.
 * Must not: allocate (a super-block's scratch is on the stack), do I/O, keep state, or contract
 * floating-point expressions.
 * Invariant: as quantize_impl.h's: finite inputs, weights >= 0 with a positive sum; every byte
 * of the block is written.
 *
 * The search, per super-block, minimizing E = sum w (x - deq)^2 with deq as decoded:
 *  1. each group (the values under one integer scale: 32, or 16 for IQ1_M) gets its best float
 *     scale a: candidates putting the largest |x| near the top grid level, each assigned and
 *     solved by least squares, then alternating assignment and least squares from the best;
 *  2. the f16 super-scale d is the one that best fits the group scales a_g by the integer
 *     multipliers m(s) (E of a group grows as C_g (a - a_g)^2, C_g = sum w v^2 of its
 *     assignment), then each group picks the best of the codes s next to a_g / d;
 *  3. d is re-solved by least squares for those codes and assignments, rounded to f16, and
 *     kept when it lowers E with every group reassigned (trying the f16 values next to it as
 *     well changed no fixture row's error by 0.1%, at 1.3 x the time).
 * An assignment for a fixed effective scale a: each value's nearest level, and when those levels
 * are not a grid entry, the cheapest entry within two level steps (grid_maps.h finds entries by
 * their levels), else within one step of three values, else the cheapest of the whole grid (the
 * three-value stage made IQ3_XXS 1.4 x faster and moved no weight-like fixture row's error by
 * more than 2%). IQ3_XXS stores 7 sign
 * bits per 8 values with even parity: an odd sub-group flips the sign of the value where that
 * costs least (its 4-value entry searched again). IQ1 tries both offsets (per group for IQ1_S,
 * per 8 values for IQ1_M). */
#include "kernels/quantize_impl.h"
#include "kernels/quant.h"
#include "kernels/grids.h"
#include "kernels/grid_maps.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

/* ================================================================ grid entries */

enum { G_IQ3XXS, G_IQ3S, G_IQ1S };

/* A grid as the search sees it: n entries of w values, each one of nl levels. */
typedef struct {
    int kind, w, nl, n;
    const uint16_t *map; /* key sum_j level_j nl^j -> entry + 1, 0 = none (grid_maps.h) */
} qgrid;

static const qgrid grid3xxs = {G_IQ3XXS, 4, 8, 256, gridmap_iq3xxs};
static const qgrid grid3s = {G_IQ3S, 4, 8, 512, gridmap_iq3s};
static const qgrid grid1s = {G_IQ1S, 8, 3, 2048, gridmap_iq1s};

/* IQ3_XXS: a grid byte (4, 12, .., 52, 62) -> its level. */
static const int8_t lvl3xxs[63] = {
    [4] = 0, [12] = 1, [20] = 2, [28] = 3, [36] = 4, [44] = 5, [52] = 6, [62] = 7,
};

/* The level of value j of entry e (the inverse of gen_grid_maps.py's level lists). */
static int entry_level(const qgrid *g, int e, int j) {
    switch (g->kind) {
    case G_IQ3XXS: return lvl3xxs[(grid_iq3xxs[e] >> (8 * j)) & 0xFF];
    case G_IQ3S: return (int)(((grid_iq3s[e] >> (8 * j)) & 0xFF) - 1) / 2;
    default: return (grid_iq1s[e] >> (2 * j)) & 3;
    }
}

/* The cheapest entry of the whole grid (the IQ3 grids' 4-value entries), its cost in *cost. */
static int grid_brute(const qgrid *g, const float *c, float *cost) {
    int be = 0;
    float best = INFINITY;
    for (int e = 0; e < g->n; e++) {
        uint32_t v = g->kind == G_IQ3XXS ? grid_iq3xxs[e] : grid_iq3s[e];
        float s = 0.0f;
        for (int j = 0; j < 4; j++) {
            int b = (int)((v >> (8 * j)) & 0xFF);
            s += c[8 * j + (g->kind == G_IQ3XXS ? lvl3xxs[b] : (b - 1) >> 1)];
        }
        if (s < best) {
            best = s;
            be = e;
        }
    }
    *cost = best;
    return be;
}

/* The entry with the least cost sum_j c[j * nl + level_j]: among the entries within two level
 * steps of the per-value cheapest levels (the steps of two values only when one step does not
 * already beat them), else within one step of three values, else over the whole grid. Writes the entry's levels to lv and its cost
 * to *cost; returns the entry. */
static int grid_nearest(const qgrid *g, const float *c, int *lv, float *cost) {
    int w = g->w, nl = g->nl, b[8], pw[8], key = 0, p = 1;
    float base = 0.0f;
    for (int j = 0; j < w; j++) {
        const float *cj = c + j * nl;
        b[j] = 0;
        for (int l = 1; l < nl; l++) b[j] = cj[l] < cj[b[j]] ? l : b[j];
        base += cj[b[j]];
        pw[j] = p;
        key += b[j] * p;
        p *= nl;
    }
    if (g->map[key]) {
        memcpy(lv, b, (size_t)w * sizeof *lv);
        *cost = base;
        return g->map[key] - 1;
    }
    /* The one-level steps by their cost (insertion sort, at most 16), then: the cheapest step
     * that lands on an entry, the two-level steps of one value, and the pairs of steps of two
     * values, each pair only while its cost can still beat the best. */
    float sd[16], best = INFINITY;
    int so[16], sj[16], ns = 0, bk = -1;
    for (int j = 0; j < w; j++) {
        for (int s = -1; s <= 1; s += 2) {
            int l = b[j] + s, at = ns++;
            if (l < 0 || l >= nl) {
                ns--;
                continue;
            }
            float dd = c[j * nl + l] - c[j * nl + b[j]];
            for (; at > 0 && sd[at - 1] > dd; at--) {
                sd[at] = sd[at - 1];
                so[at] = so[at - 1];
                sj[at] = sj[at - 1];
            }
            sd[at] = dd;
            so[at] = s * pw[j];
            sj[at] = j;
            l += s;
            float d2 = l >= 0 && l < nl ? c[j * nl + l] - c[j * nl + b[j]] : INFINITY;
            if (d2 < best && g->map[key + 2 * s * pw[j]]) {
                best = d2;
                bk = key + 2 * s * pw[j];
            }
        }
    }
    for (int i = 0; i < ns && sd[i] < best; i++) {
        if (g->map[key + so[i]]) {
            best = sd[i];
            bk = key + so[i];
            break;
        }
    }
    for (int i = 0; i + 1 < ns && sd[i] + sd[i + 1] < best; i++) {
        for (int k = i + 1; k < ns && sd[i] + sd[k] < best; k++) {
            if (sj[k] != sj[i] && g->map[key + so[i] + so[k]]) {
                best = sd[i] + sd[k];
                bk = key + so[i] + so[k];
            }
        }
    }
    for (int i = 0; bk < 0 && i + 2 < ns; i++) { /* none within two steps: three values' steps */
        for (int k = i + 1; k + 1 < ns; k++) {
            for (int m = k + 1; m < ns && sd[i] + sd[k] + sd[m] < best; m++) {
                if (sj[i] != sj[k] && sj[k] != sj[m] && sj[i] != sj[m] && g->map[key + so[i] + so[k] + so[m]]) {
                    best = sd[i] + sd[k] + sd[m];
                    bk = key + so[i] + so[k] + so[m];
                }
            }
        }
    }
    if (bk >= 0) {
        int e = g->map[bk] - 1;
        for (int j = 0; j < w; j++) lv[j] = entry_level(g, e, j);
        *cost = base + best;
        return e;
    }
    /* far from every entry (rare: 1% of the IQ3_XXS searches on the fixtures; the IQ1 grid has one
     * within two steps of every point) */
    DSF_ASSERT(g->w == 4);
    int be = grid_brute(g, c, cost);
    for (int j = 0; j < w; j++) lv[j] = entry_level(g, be, j);
    return be;
}

/* ================================================================ group assignments */

/* One group's codes for an effective scale a: deq_i = a * v[i]. */
typedef struct {
    float v[32];
    uint16_t idx[8]; /* grid entries, in value order */
    uint8_t neg[4];  /* IQ3: sign mask of each 8 values, bit j = value j negated */
    uint8_t dneg[4]; /* IQ1: offset -1/8 (1) or +1/8 (0) of each 8 values */
} gcodes;

/* Assigns n values (a group) for the effective scale a into q; returns E. */
typedef float (*gassign)(const float *x, const float *w, int n, float a, gcodes *q);

static const float lv3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
static const float lv3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};

/* The 4 magnitudes t (the values with their stored signs taken off) at entry h of q: the
 * nearest entry for a; returns its cost. */
static float iq3_entry(const qgrid *g, const float *lvals, const float *t, const float *w, float a, gcodes *q,
                       int h) {
    float c[32], cost;
    int lv[4];
    for (int j = 0; j < 4; j++) {
        for (int l = 0; l < 8; l++) {
            float diff = t[j] - a * lvals[l];
            c[j * 8 + l] = w[j] * diff * diff;
        }
    }
    q->idx[h] = (uint16_t)grid_nearest(g, c, lv, &cost);
    for (int j = 0; j < 4; j++) q->v[4 * h + j] = lvals[lv[j]];
    return cost;
}

/* IQ3: signs follow x; with parity (IQ3_XXS) a sub-group with an odd count of negatives flips
 * one sign: of the two values where flipping costs least for the current entries (4 w |x| a v),
 * the one whose entry, searched again, costs least. */
static float iq3_assign(const qgrid *g, const float *lvals, bool parity, const float *x, const float *w, float a,
                        gcodes *q) {
    float e = 0.0f;
    for (int k = 0; k < 4; k++) {
        const float *xk = x + 8 * k, *wk = w + 8 * k;
        float t[8], hc[2];
        int nneg = 0;
        q->neg[k] = 0;
        for (int j = 0; j < 8; j++) {
            t[j] = fabsf(xk[j]);
            if (xk[j] < 0.0f) {
                q->neg[k] |= (uint8_t)(1u << j);
                nneg++;
            }
        }
        for (int h = 0; h < 2; h++) hc[h] = iq3_entry(g, lvals, t + 4 * h, wk + 4 * h, a, q, 2 * k + h);
        if (parity && (nneg & 1)) {
            int cand[2] = {-1, -1};
            float fc[2] = {INFINITY, INFINITY};
            for (int j = 0; j < 8; j++) {
                float f = 4.0f * wk[j] * t[j] * a * q->v[8 * k + j];
                if (f < fc[0]) {
                    fc[1] = fc[0];
                    cand[1] = cand[0];
                    fc[0] = f;
                    cand[0] = j;
                } else if (f < fc[1]) {
                    fc[1] = f;
                    cand[1] = j;
                }
            }
            float bestc = INFINITY;
            gcodes trial = *q, keep = *q;
            int bj = cand[0];
            for (int ci = 0; ci < 2; ci++) {
                int j = cand[ci], h = j / 4;
                t[j] = -t[j];
                float nc = iq3_entry(g, lvals, t + 4 * h, wk + 4 * h, a, &trial, 2 * k + h) - hc[h];
                t[j] = -t[j];
                if (nc < bestc) {
                    bestc = nc;
                    bj = j;
                    keep = trial;
                }
                trial = *q;
            }
            *q = keep;
            q->neg[k] ^= (uint8_t)(1u << bj);
            e += bestc;
        }
        e += hc[0] + hc[1];
        for (int j = 0; j < 8; j++)
            if ((q->neg[k] >> j) & 1) q->v[8 * k + j] = -q->v[8 * k + j];
    }
    return e;
}

static float assign_iq3xxs(const float *x, const float *w, int n, float a, gcodes *q) {
    (void)n;
    return iq3_assign(&grid3xxs, lv3xxs, true, x, w, a, q);
}

static float assign_iq3s(const float *x, const float *w, int n, float a, gcodes *q) {
    (void)n;
    return iq3_assign(&grid3s, lv3s, false, x, w, a, q);
}

/* IQ1: the 8 values at x for scale a and offset delta: entry, levels v (grid value + delta). */
static float iq1_entry(const float *x, const float *w, float a, float delta, uint16_t *idx, float *v) {
    float c[24], cost;
    int lv[8];
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 3; l++) {
            float diff = x[j] - a * ((float)(l - 1) + delta);
            c[j * 3 + l] = w[j] * diff * diff;
        }
    }
    *idx = (uint16_t)grid_nearest(&grid1s, c, lv, &cost);
    for (int j = 0; j < 8; j++) v[j] = (float)(lv[j] - 1) + delta;
    return cost;
}

/* IQ1, n values (16 or 32) with an offset per 8 (per8) or one for all n: the better offset. */
static float iq1_assign(const float *x, const float *w, int n, float a, bool per8, gcodes *q) {
    gcodes alt[2];
    float e[2] = {0.0f, 0.0f}, total = 0.0f;
    for (int k = 0; k < n / 8; k++) {
        float ek[2];
        for (int s = 0; s < 2; s++) {
            ek[s] = iq1_entry(x + 8 * k, w + 8 * k, a, s ? -GRID_IQ1_DELTA : GRID_IQ1_DELTA, &alt[s].idx[k],
                              alt[s].v + 8 * k);
            alt[s].dneg[k] = (uint8_t)s;
            e[s] += ek[s];
        }
        if (per8) {
            int s = ek[1] < ek[0];
            q->idx[k] = alt[s].idx[k];
            q->dneg[k] = (uint8_t)s;
            memcpy(q->v + 8 * k, alt[s].v + 8 * k, 8 * sizeof(float));
            total += ek[s];
        }
    }
    if (per8) return total;
    int s = e[1] < e[0];
    *q = alt[s];
    return e[s];
}

static float assign_iq1s(const float *x, const float *w, int n, float a, gcodes *q) {
    return iq1_assign(x, w, n, a, false, q);
}

static float assign_iq1m(const float *x, const float *w, int n, float a, gcodes *q) {
    return iq1_assign(x, w, n, a, true, q);
}

/* ================================================================ scale searches */

/* A type as the scale search sees it: groups of gsize values, each with an integer code s in
 * [0, ns) and effective scale d * (m0 + mstep * s); vtop is the largest |v| of an assignment. */
typedef struct {
    gassign assign;
    int gsize, ns;
    float m0, mstep, vtop;
} iqfmt;

/* The sums of the least-squares scale of an assignment: sum w x v, sum w v v. */
static void ls_sums(const float *x, const float *w, int n, const gcodes *q, double *sxv, double *svv) {
    *sxv = *svv = 0;
    for (int i = 0; i < n; i++) {
        *sxv += (double)w[i] * x[i] * q->v[i];
        *svv += (double)w[i] * q->v[i] * q->v[i];
    }
}

/* Step 1: the group's best float scale (>= 0), its codes in q and C = sum w v^2 in *curv. */
static float fit_group(const iqfmt *f, const float *x, const float *w, gcodes *q, double *curv) {
    int n = f->gsize;
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    *curv = 0;
    if (amax < QZ_TINY) {
        f->assign(x, w, n, 0.0f, q);
        return 0.0f;
    }
    double best = -1, sxv, svv;
    float a = 0.0f;
    gcodes c;
    for (int k = 0; k <= 3; k++) { /* the largest |x| at 0.7 .. 1.3 x the top level */
        f->assign(x, w, n, amax / (f->vtop * (0.7f + 0.2f * (float)k)), &c);
        ls_sums(x, w, n, &c, &sxv, &svv);
        if (svv > 0 && sxv > 0 && sxv * sxv / svv > best) {
            best = sxv * sxv / svv;
            a = (float)(sxv / svv);
        }
    }
    if (best < 0) a = amax / f->vtop;
    float e = f->assign(x, w, n, a, q);
    for (int it = 0; it < 8; it++) {
        ls_sums(x, w, n, q, &sxv, &svv);
        if (!(svv > 0 && sxv > 0)) break;
        float a2 = (float)(sxv / svv);
        if (a2 == a) break;
        float e2 = f->assign(x, w, n, a2, &c);
        if (!(e2 < e)) break;
        a = a2;
        e = e2;
        *q = c;
    }
    ls_sums(x, w, n, q, &sxv, &svv);
    *curv = svv;
    return a;
}

/* The code s in [0, ns) whose multiplier is nearest to r. */
static int nearest_code(const iqfmt *f, float r) { return qz_nearest((r - f->m0) / f->mstep, 0, f->ns - 1); }

static float mult(const iqfmt *f, int s) { return f->m0 + f->mstep * (float)s; }

/* Step 2's model of E: sum_g C_g (d m(s_g) - a_g)^2, s_g nearest; ng groups. */
static double proxy(const iqfmt *f, int ng, const float *ag, const double *cg, float d) {
    double p = 0;
    for (int g = 0; g < ng; g++) {
        double r = (double)d * mult(f, nearest_code(f, ag[g] / d)) - ag[g];
        p += cg[g] * r * r;
    }
    return p;
}

/* A super-block's result: d, the group codes and assignments. */
typedef struct {
    float d;
    uint8_t s[16];
    gcodes q[16];
} iqblk;

/* Reassigns every group for k->d and the codes k->s; returns E. */
static float assign_all(const iqfmt *f, const float *x, const float *w, iqblk *k) {
    float e = 0.0f;
    int n = f->gsize;
    for (int g = 0; g < 256 / n; g++) e += f->assign(x + g * n, w + g * n, n, k->d * mult(f, k->s[g]), &k->q[g]);
    return e;
}

/* Steps 2 and 3: fills k for the 256 values x. */
static void fit_block(const iqfmt *f, const float *x, const float *w, iqblk *k) {
    int n = f->gsize, ng = 256 / n;
    float ag[16], amx = 0.0f;
    double cg[16];
    for (int g = 0; g < ng; g++) {
        ag[g] = fit_group(f, x + g * n, w + g * n, &k->q[g], &cg[g]);
        amx = fmaxf(amx, ag[g]);
    }
    memset(k->s, 0, sizeof k->s);
    k->d = 0.0f;
    if (amx < QZ_TINY) {
        assign_all(f, x, w, k);
        return;
    }
    /* The largest a_g at 0.8 .. 1.5 x the top multiplier (beyond: clipped there), by the model;
     * then the model's least-squares d for the best one's codes. */
    float mtop = mult(f, f->ns - 1), d = amx / mtop;
    double pbest = -1;
    for (int j = 0; j <= 70; j++) {
        float dj = amx / (mtop * (0.8f + 0.01f * (float)j));
        double p = proxy(f, ng, ag, cg, dj);
        if (pbest < 0 || p < pbest) {
            pbest = p;
            d = dj;
        }
    }
    double num = 0, den = 0;
    for (int g = 0; g < ng; g++) {
        double m = mult(f, nearest_code(f, ag[g] / d));
        num += cg[g] * m * ag[g];
        den += cg[g] * m * m;
    }
    if (den > 0 && proxy(f, ng, ag, cg, (float)(num / den)) < pbest) d = (float)(num / den);
    k->d = qz_f16_round(d);
    if (k->d <= 0.0f) {
        assign_all(f, x, w, k);
        return;
    }
    /* Each group: the best code next to a_g / d. */
    float e = 0.0f;
    for (int g = 0; g < ng; g++) {
        int s0 = nearest_code(f, ag[g] / k->d);
        float eg = INFINITY;
        for (int s = s0 - 1; s <= s0 + 1; s++) {
            gcodes c;
            if (s < 0 || s >= f->ns) continue;
            float es = f->assign(x + g * n, w + g * n, n, k->d * mult(f, s), &c);
            if (es < eg) {
                eg = es;
                k->s[g] = (uint8_t)s;
                k->q[g] = c;
            }
        }
        e += eg;
    }
    /* Step 3: least-squares d for these codes, rounded to f16. */
    num = den = 0;
    for (int g = 0; g < ng; g++) {
        double sxv, svv, m = mult(f, k->s[g]);
        ls_sums(x + g * n, w + g * n, n, &k->q[g], &sxv, &svv);
        num += m * sxv;
        den += m * m * svv;
    }
    if (!(den > 0 && num > 0)) return;
    iqblk t = *k;
    t.d = qz_f16_round((float)(num / den));
    if (t.d != k->d && assign_all(f, x, w, &t) < e) *k = t;
}

/* ================================================================ block layouts */

static const iqfmt fmt3xxs = {assign_iq3xxs, 32, 16, 0.25f, 0.5f, 62.0f};
static const iqfmt fmt3s = {assign_iq3s, 32, 16, 1.0f, 2.0f, 15.0f};
static const iqfmt fmt1s = {assign_iq1s, 32, 8, 1.0f, 2.0f, 1.125f};
static const iqfmt fmt1m = {assign_iq1m, 16, 8, 1.0f, 2.0f, 1.125f};

/* IQ3_XXS {f16 d; u8 qs[64]; u32 scales_signs[8]}: group g's entries at qs[8g..8g+7] (value
 * order), word g = sign selectors (7 bits per 8 values, the 8th sign their parity) | s << 28;
 * multiplier d * (0.5 + s) * 0.5. */
void qz_block_iq3_xxs(const float *x, const float *w, uint8_t *out) {
    iqblk k;
    fit_block(&fmt3xxs, x, w, &k);
    qz_put16(out, f32_to_f16(k.d));
    for (int g = 0; g < 8; g++) {
        uint32_t word = (uint32_t)k.s[g] << 28;
        for (int h = 0; h < 8; h++) out[2 + 8 * g + h] = (uint8_t)k.q[g].idx[h];
        for (int j = 0; j < 4; j++) word |= (uint32_t)(k.q[g].neg[j] & 127) << (7 * j);
        qz_put32(out + 66 + 4 * g, word);
    }
}

/* IQ3_S {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: entry bits 0..7 at qs[8g+h],
 * bit 8 at bit h of qh[g]; sign byte per 8 values; s in nibble g of scales; multiplier
 * d * (1 + 2s). */
void qz_block_iq3_s(const float *x, const float *w, uint8_t *out) {
    iqblk k;
    fit_block(&fmt3s, x, w, &k);
    qz_put16(out, f32_to_f16(k.d));
    memset(out + 66, 0, 8);
    memset(out + 106, 0, 4);
    for (int g = 0; g < 8; g++) {
        for (int h = 0; h < 8; h++) {
            out[2 + 8 * g + h] = (uint8_t)k.q[g].idx[h];
            out[66 + g] |= (uint8_t)((k.q[g].idx[h] >> 8) << h);
        }
        memcpy(out + 74 + 4 * g, k.q[g].neg, 4);
        out[106 + g / 2] |= (uint8_t)(k.s[g] << (4 * (g % 2)));
    }
}

/* IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}: entry bits 0..7 at qs[4g+k], bits 8..10 at bits 3k of
 * qh[g]; s at bits 12..14 (multiplier d * (2s + 1)), the offset sign at bit 15. */
void qz_block_iq1_s(const float *x, const float *w, uint8_t *out) {
    iqblk k;
    fit_block(&fmt1s, x, w, &k);
    qz_put16(out, f32_to_f16(k.d));
    for (int g = 0; g < 8; g++) {
        uint32_t qh = (uint32_t)k.s[g] << 12 | (uint32_t)k.q[g].dneg[0] << 15;
        for (int j = 0; j < 4; j++) {
            out[2 + 4 * g + j] = (uint8_t)k.q[g].idx[j];
            qh |= (uint32_t)(k.q[g].idx[j] >> 8) << (3 * j);
        }
        qz_put16(out + 34 + 2 * g, (uint16_t)qh);
    }
}

/* IQ1_M {u8 qs[32]; u8 qh[16]; u16 sc[4]}: 16-value group u = 2g + k/2; entry bits 0..7 at
 * qs[4g+k], bits 8..10 and the offset sign (bit 3) in nibble k%2 of qh[2g + k/2]; the code of
 * group u at bits 3(u%4) of sc[u/4]; the f16 d's nibble i at the top of sc[i]. */
void qz_block_iq1_m(const float *x, const float *w, uint8_t *out) {
    iqblk k;
    fit_block(&fmt1m, x, w, &k);
    uint16_t d16 = f32_to_f16(k.d);
    for (int i = 0; i < 4; i++) {
        uint32_t sc = (uint32_t)((d16 >> (4 * i)) & 0xF) << 12;
        for (int u = 0; u < 4; u++) sc |= (uint32_t)k.s[4 * i + u] << (3 * u);
        qz_put16(out + 48 + 2 * i, (uint16_t)sc);
    }
    for (int u = 0; u < 16; u++) {
        for (int j = 0; j < 2; j++) {
            int k8 = 2 * u + j; /* the 8-value sub-group, 0..31 */
            out[k8] = (uint8_t)k.q[u].idx[j];
            uint8_t nib = (uint8_t)((k.q[u].idx[j] >> 8) | (k.q[u].dneg[j] << 3));
            if (j == 0) out[32 + u] = nib;
            else out[32 + u] |= (uint8_t)(nib << 4);
        }
    }
}
