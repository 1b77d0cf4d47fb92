/* quantize.c: quantize_row (the input checks and the dispatch), the element types (F32, F16,
 * BF16), the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) and the weighted scale
 * searches that every block type shares (quantize_impl.h). The K-quants are quantize_k.c's.
 *
 * Owns: encoders that write exactly what quant.c's decoders read (layouts: TYPE.json of
 * ../shared/testdata/quants, gguf-layout.md §1.4-1.5).
 * Must not: allocate (scratch is a block on the stack), do I/O, keep state, or contract
 * floating-point expressions (the Makefile's -ffp-contract=off): the bytes of a row depend
 * on the row, its importances and the type only.
 * Invariant: quantize_row writes nothing unless the whole row (and imatrix) passed its checks. */
#include "kernels/quantize.h"
#include "kernels/quantize_impl.h"
#include "kernels/quant.h"
#include "kernels/dtype.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

/* ================================================================ small pieces */

int qz_nearest(float v, int lo, int hi) {
    float f = floorf(v + 0.5f);
    if (!(f >= (float)lo)) return lo; /* also catches a NaN, which the checks exclude anyway */
    if (f > (float)hi) return hi;
    return (int)f;
}

float qz_f16_round(float v) {
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    return f16_to_f32(f32_to_f16(v));
}

float qz_f16_step(float v, int k) {
    uint16_t h = f32_to_f16(v);
    int mag = (h & 0x7FFF) + k;
    if (mag < 0 || mag > 0x7BFF) return NAN;
    return f16_to_f32((uint16_t)((h & 0x8000) | mag));
}

void qz_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

void qz_put32(uint8_t *p, uint32_t v) {
    qz_put16(p, (uint16_t)v);
    qz_put16(p + 2, (uint16_t)(v >> 16));
}

#define ONES4 1.0f, 1.0f, 1.0f, 1.0f
#define ONES16 ONES4, ONES4, ONES4, ONES4
#define ONES64 ONES16, ONES16, ONES16, ONES16
static const float ones[256] = {ONES64, ONES64, ONES64, ONES64};

const float *qz_weights(const float *imatrix, int64_t off, int n) {
    DSF_ASSERT(n <= 256);
    if (!imatrix) return ones;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += imatrix[off + i];
    return sum > 0 ? imatrix + off : ones;
}

static float group_amax(const float *x, int n, float *signed_max) {
    float amax = 0.0f, xm = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            xm = x[i];
        }
    }
    if (signed_max) *signed_max = xm;
    return amax;
}

/* ================================================================ symmetric grid search */

/* Rounds v to the nearest level in [lo, hi] as a float (halves upward); v is never NaN. */
static inline float level(float v, float lo, float hi) {
    float f = floorf(v + 0.5f);
    return f < lo ? lo : f > hi ? hi : f;
}

double qz_assign_sym(const float *x, const float *w, int n, float a, int lo, int hi, int8_t *q) {
    float e = 0.0f, inv = fabsf(a) < QZ_TINY ? 0.0f : 1.0f / a;
    for (int i = 0; i < n; i++) {
        float qf = level(x[i] * inv, (float)lo, (float)hi);
        if (q) q[i] = (int8_t)qf;
        float diff = x[i] - a * qf;
        e += w[i] * diff * diff; /* fp32: at most 256 terms >= 0, only compared */
    }
    return e;
}

/* Least-squares s for a fixed assignment; false when every q is 0. */
static bool ls_sym(const float *x, const float *w, int n, const int8_t *q, float *s) {
    double sxq = 0, sqq = 0;
    for (int i = 0; i < n; i++) {
        sxq += (double)w[i] * x[i] * q[i];
        sqq += (double)w[i] * q[i] * q[i];
    }
    if (sqq <= 0) return false;
    *s = (float)(sxq / sqq);
    return true;
}

float qz_fit_sym(const float *x, const float *w, int n, int lo, int hi, int8_t *q) {
    float xm;
    if (group_amax(x, n, &xm) < QZ_TINY) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    /* Candidates: the largest |x| lands at level l, |l| from |end| + 0.5 (that value is
     * clipped a little) down to |end| - 1.5 (head room) in steps of 0.2, at either end of the
     * grid. Each is scored by its least-squares optimum sum(wxq)^2 / sum(wqq) (= sum(wxx) - E),
     * summed in fp32 (they only rank the candidates; the alternation below solves with double
     * sums). */
    float wx[256];
    for (int i = 0; i < n; i++) wx[i] = w[i] * x[i];
    double best = -1;
    float best_s = 0.0f, flo = (float)lo, fhi = (float)hi;
    for (int side = 0; side < 2; side++) {
        float end = side ? fhi : flo, dir = side ? 1.0f : -1.0f;
        for (int k = 0; k <= 10; k++) {
            float l = end + dir * (0.5f - 0.2f * (float)k);
            if (l * dir < 0.75f) continue;
            float inv = l / xm, sxq = 0.0f, sqq = 0.0f;
            for (int i = 0; i < n; i++) {
                float qf = level(x[i] * inv, flo, fhi);
                sxq += wx[i] * qf;
                sqq += w[i] * qf * qf;
            }
            if (sqq > 0.0f && (double)sxq * sxq / sqq > best) {
                best = (double)sxq * sxq / sqq;
                best_s = sxq / sqq;
            }
        }
    }
    /* Alternate: nearest assignment for s, then least squares for that assignment; E never
     * increases, so stop at the first step that does not lower it. */
    float s = best_s;
    double e = qz_assign_sym(x, w, n, s, lo, hi, q);
    for (int it = 0; it < 16; it++) {
        int8_t q2[256];
        float s2;
        if (!ls_sym(x, w, n, q, &s2) || s2 == s) break;
        double e2 = qz_assign_sym(x, w, n, s2, lo, hi, q2);
        if (!(e2 < e)) break;
        s = s2;
        e = e2;
        memcpy(q, q2, (size_t)n);
    }
    return s;
}

/* ================================================================ affine grid search */

double qz_assign_affine(const float *x, const float *w, int n, float a, float c, int nmax, uint8_t *q) {
    float e = 0.0f, inv = a < QZ_TINY ? 0.0f : 1.0f / a;
    for (int i = 0; i < n; i++) {
        float qf = level((x[i] + c) * inv, 0.0f, (float)nmax);
        if (q) q[i] = (uint8_t)qf;
        float diff = x[i] - (a * qf - c);
        e += w[i] * diff * diff; /* fp32: at most 256 terms >= 0, only compared */
    }
    return e;
}

/* The weighted sums of one group (sw, sx, sxx) and of one assignment (sq, sqq, sxq). */
typedef struct {
    double sw, sx, sxx, sq, sqq, sxq;
} affine_sums;

/* Weighted least squares of x ~ s*q + b from the sums (s >= 0; b <= 0 with neg_b). Returns E of
 * the solution, or -1 when every q is 0 (s undetermined). */
static double solve_affine(const affine_sums *m, bool neg_b, float *s, float *b) {
    double det = m->sw * m->sqq - m->sq * m->sq, ss, bb;
    if (!(m->sqq > 0)) return -1;
    if (det > 1e-5 * m->sw * m->sqq) { /* below: q constant up to the fp32 rounding of the sums */
        ss = (m->sw * m->sxq - m->sq * m->sx) / det;
        bb = (m->sqq * m->sx - m->sq * m->sxq) / det;
    } else { /* every q (nearly) equal: the offset is free; put the value on the scale */
        ss = m->sxq / m->sqq;
        bb = 0;
    }
    if (neg_b && bb > 0) {
        bb = 0;
        ss = m->sxq / m->sqq;
    }
    if (ss < 0) {
        ss = 0;
        bb = m->sx / m->sw;
        if (neg_b && bb > 0) bb = 0;
    }
    *s = (float)ss;
    *b = (float)bb;
    double e = m->sxx - 2 * ss * m->sxq - 2 * bb * m->sx + ss * ss * m->sqq + 2 * ss * bb * m->sq + bb * bb * m->sw;
    return e > 0 ? e : 0;
}

/* From (s, b): nearest assignment, then least squares with exact sums, while E decreases.
 * m holds the group's sums; writes q and the final (s, b); returns E. */
static double alternate_affine(const float *x, const float *w, const float *wx, int n, int nmax, bool neg_b,
                               affine_sums *m, float *s, float *b, uint8_t *q) {
    double e = qz_assign_affine(x, w, n, *s, -*b, nmax, q);
    for (int it = 0; it < 16; it++) {
        uint8_t q2[256];
        float s2, b2;
        m->sq = m->sqq = m->sxq = 0;
        for (int i = 0; i < n; i++) {
            m->sq += (double)w[i] * q[i];
            m->sqq += (double)w[i] * q[i] * q[i];
            m->sxq += (double)wx[i] * q[i];
        }
        if (solve_affine(m, neg_b, &s2, &b2) < 0 || (s2 == *s && b2 == *b)) break;
        double e2 = qz_assign_affine(x, w, n, s2, -b2, nmax, q2);
        if (!(e2 < e)) break;
        *s = s2;
        *b = b2;
        e = e2;
        memcpy(q, q2, (size_t)n);
    }
    return e;
}

void qz_fit_affine(const float *x, const float *w, int n, int nmax, bool neg_b, bool both_ends, uint8_t *q,
                   float *s, float *b) {
    affine_sums m = {0, 0, 0, 0, 0, 0};
    float mn = x[0], mx = x[0], wx[256];
    for (int i = 0; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
        wx[i] = w[i] * x[i];
        m.sw += w[i];
        m.sx += wx[i];
        m.sxx += (double)wx[i] * x[i];
    }
    if (neg_b && mn > 0) mn = 0;
    *s = 0.0f;
    *b = mn;
    memset(q, 0, (size_t)n);
    if (!(mx - mn >= QZ_TINY)) return; /* constant (or all tiny): deq = b everywhere */
    /* Candidates: the range [mn, mx] split into l levels, l from nmax - 1 to nmax + 1 in steps
     * of 0.2 (assignment sums in fp32: they only rank), each solved once by least squares; the
     * best two are then alternated to a fixed point with exact sums. */
    double best[2] = {-1, -1};
    float bs[2] = {0, 0}, bb[2] = {mn, mn}, fmax_ = (float)nmax;
    for (int k = 0; k < (both_ends ? 22 : 11); k++) {
        bool anchor = k >= 11;
        float l = fmax_ - 1.0f + 0.2f * (float)(k % 11), inv = l / (mx - mn), sq = 0, sqq = 0, sxq = 0;
        if (l < 1.0f) continue;
        for (int i = 0; i < n; i++) {
            float qf = level(anchor ? (x[i] - mx) * inv + fmax_ : (x[i] - mn) * inv, 0.0f, fmax_);
            sq += w[i] * qf;
            sqq += w[i] * qf * qf;
            sxq += wx[i] * qf;
        }
        m.sq = sq;
        m.sqq = sqq;
        m.sxq = sxq;
        float cs, cb;
        double e = solve_affine(&m, neg_b, &cs, &cb);
        if (e < 0) continue;
        int slot = best[0] < 0 || e < best[0] ? 0 : best[1] < 0 || e < best[1] ? 1 : 2;
        if (slot == 0) {
            best[1] = best[0];
            bs[1] = bs[0];
            bb[1] = bb[0];
        }
        if (slot < 2) {
            best[slot] = e;
            bs[slot] = cs;
            bb[slot] = cb;
        }
    }
    double e_best = -1;
    for (int c = 0; c < 2 && best[c] >= 0; c++) {
        uint8_t qc[256];
        double e = alternate_affine(x, w, wx, n, nmax, neg_b, &m, &bs[c], &bb[c], qc);
        if (e_best < 0 || e < e_best) {
            e_best = e;
            *s = bs[c];
            *b = bb[c];
            memcpy(q, qc, (size_t)n);
        }
    }
}

/* ================================================================ 32-value blocks */

/* Q4_0 {f16 d; u8 qs[16]}, Q5_0 {f16 d; u32 qh; u8 qs[16]}, Q8_0 {f16 d; i8 qs[32]}: deq =
 * d * q with q in [lo, hi]; the scale is searched, rounded to f16, then q is reassigned for
 * the stored scale. Q4_0/Q5_0 element j sits in the low nibble of qs[j % 16] for j < 16, the
 * high nibble for j >= 16; Q5_0's fifth bit of element j is bit j of qh. */
float qz_f16_refine(qz_assign_fn assign, const float *x, const float *w, int n, int lo, int hi, float d0,
                    int8_t *q) {
    float d = d0;
    double best = assign(x, w, n, d, lo, hi, q);
    for (int k = -2; k <= 2; k++) { /* the f16 scales around the rounded optimum */
        float dk = qz_f16_step(d0, k);
        int8_t qk[256];
        double e = k && !isnan(dk) ? assign(x, w, n, dk, lo, hi, qk) : best;
        if (e < best) {
            best = e;
            d = dk;
            memcpy(q, qk, (size_t)n);
        }
    }
    return d;
}

float qz_fit_sym_f16(const float *x, const float *w, int n, int lo, int hi, int8_t *q) {
    return qz_f16_refine(qz_assign_sym, x, w, n, lo, hi, qz_f16_round(qz_fit_sym(x, w, n, lo, hi, q)), q);
}

static void block_sym32(uint32_t type, const float *x, const float *w, uint8_t *out) {
    int lo = type == GGML_TYPE_Q8_0 ? -127 : type == GGML_TYPE_Q5_0 ? -16 : -8;
    int hi = type == GGML_TYPE_Q8_0 ? 127 : -lo - 1;
    int8_t q[32];
    float d = qz_fit_sym_f16(x, w, 32, lo, hi, q);
    qz_put16(out, f32_to_f16(d));
    if (type == GGML_TYPE_Q8_0) {
        for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)q[j];
        return;
    }
    uint8_t *qs = out + (type == GGML_TYPE_Q5_0 ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int c0 = q[j] - lo, c1 = q[j + 16] - lo;
        qs[j] = (uint8_t)((c0 & 15) | ((c1 & 15) << 4));
        qh |= (uint32_t)(c0 >> 4) << j;
        qh |= (uint32_t)(c1 >> 4) << (j + 16);
    }
    if (type == GGML_TYPE_Q5_0) qz_put32(out + 2, qh);
}

/* Q4_1 {f16 d; f16 m; u8 qs[16]}, Q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}: deq = d * q + m,
 * q in [0, 15] / [0, 31]; the nibble and qh placement of Q4_0/Q5_0. */
static void block_affine32(uint32_t type, const float *x, const float *w, uint8_t *out) {
    bool five = type == GGML_TYPE_Q5_1;
    int nmax = five ? 31 : 15;
    uint8_t q[32];
    float s, b;
    qz_fit_affine(x, w, 32, nmax, false, true, q, &s, &b);
    float d0 = qz_f16_round(s), m0 = qz_f16_round(b), d = d0, m = m0;
    double best = qz_assign_affine(x, w, 32, d, -m, nmax, q);
    for (int kd = -1; kd <= 1; kd++) { /* the f16 pairs around the rounded optimum */
        for (int km = -1; km <= 1; km++) {
            float dk = qz_f16_step(d0, kd), mk = qz_f16_step(m0, km);
            uint8_t qk[32];
            if ((!kd && !km) || isnan(dk) || isnan(mk)) continue;
            double e = qz_assign_affine(x, w, 32, dk, -mk, nmax, qk);
            if (e < best) {
                best = e;
                d = dk;
                m = mk;
                memcpy(q, qk, 32);
            }
        }
    }
    qz_put16(out, f32_to_f16(d));
    qz_put16(out + 2, f32_to_f16(m));
    uint8_t *qs = out + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    if (five) qz_put32(out + 4, qh);
}

/* MXFP4 {u8 e; u8 qs[16]}: deq = kv[code] * 2^(e - 128), kv the doubled E2M1 magnitudes
 * {0, 1, 2, 3, 4, 6, 8, 12} with bit 3 the sign; the nibble placement of Q4_0. The exponent
 * is searched over the four values around the one that just fits the largest |x| (e <= 254:
 * 255 is NaN in OCP E8M0, though ggml decodes it as 2^127), each code is the nearest value. */
static const float mx_mag[8] = {0, 1, 2, 3, 4, 6, 8, 12};

double qz_fp4_codes(const float *x, const float *w, int n, float scale, float i1, float i2, uint8_t *codes) {
    float err = 0.0f;
    for (int j = 0; j < n; j++) {
        float v = fabsf(x[j]) * i1 * i2; /* exact unless it overflows, far above 12 (clipped) */
        int c = (v > 0.5f) + (v > 1.5f) + (v > 2.5f) + (v > 3.5f) + (v > 5.0f) + (v > 7.0f) + (v > 10.0f);
        codes[j] = (uint8_t)(c | (x[j] < 0 && c ? 8 : 0));
        float deq = (x[j] < 0 ? -mx_mag[c] : mx_mag[c]) * scale;
        float diff = x[j] - deq;
        err += w[j] * diff * diff;
    }
    return err;
}

static void block_mxfp4(const float *x, const float *w, uint8_t *out) {
    int ex = 0;
    frexpf(group_amax(x, 32, NULL), &ex); /* amax in [2^(ex-1), 2^ex); 0 gives ex = 0 */
    double best = -1;
    int be = 0;
    uint8_t codes[32], bc[32];
    for (int k = ex - 5; k <= ex - 2; k++) {
        int e = k + 128 < 0 ? 0 : k + 128 > 254 ? 254 : k + 128;
        /* The scale 2^(e-128), and its inverse as two powers of two (2^128 is not an fp32). */
        float i1 = ldexpf(1.0f, (128 - e) / 2), i2 = ldexpf(1.0f, 128 - e - (128 - e) / 2);
        double err = qz_fp4_codes(x, w, 32, ldexpf(1.0f, e - 128), i1, i2, codes);
        if (best < 0 || err < best) {
            best = err;
            be = e;
            memcpy(bc, codes, 32);
        }
    }
    out[0] = (uint8_t)be;
    for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(bc[j] | (bc[j + 16] << 4));
}

/* ================================================================ quantize_row */

bool quantize_type_supported(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_MXFP4:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_NVFP4: case GGML_TYPE_Q2_0:
    case GGML_TYPE_Q1_0: case GGML_TYPE_TQ2_0: case GGML_TYPE_TQ1_0:
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
    case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M:
        return true;
    default:
        return false;
    }
}

bool quantize_requires_imatrix(uint32_t type) {
    return type == GGML_TYPE_IQ2_XXS || type == GGML_TYPE_IQ2_XS || type == GGML_TYPE_IQ1_S;
}

float quantize_max_abs(uint32_t type) {
    const float h = 65504.0f; /* the largest f16, every scale field's limit */
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_MXFP4: return INFINITY;
    case GGML_TYPE_NVFP4: return INFINITY; /* saturates beyond 2688 (quantize.h) */
    case GGML_TYPE_F16: return nextafterf(65520.0f, 0.0f); /* 65520 rounds (to even) to inf */
    case GGML_TYPE_BF16: {
        uint32_t u = 0x7F7F7FFFu; /* 0x7F7F8000 is the tie that rounds up to inf */
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case GGML_TYPE_Q8_0: return h * 127.0f;
    case GGML_TYPE_Q4_0: return h * 8.0f;
    case GGML_TYPE_Q5_0: return h * 16.0f;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: return h; /* the minimum m is an f16 itself */
    case GGML_TYPE_Q2_K: return h * 15.0f;              /* a min dmin * m, m <= 15 */
    case GGML_TYPE_Q3_K: return h * 32.0f * 4.0f;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return h * 63.0f;
    case GGML_TYPE_Q6_K: return h * 128.0f * 32.0f;
    case GGML_TYPE_IQ4_NL: return h * 127.0f;
    case GGML_TYPE_IQ4_XS: return h * 32.0f * 127.0f;
    case GGML_TYPE_Q2_0: return h * 2.0f;
    case GGML_TYPE_Q1_0: case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0: return h;
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: return h * 3.875f * 43.0f;
    case GGML_TYPE_IQ3_XXS: return h * 7.75f * 62.0f; /* (0.5 + 15) * 0.5 x the grid's 62 */
    case GGML_TYPE_IQ3_S: return h * 31.0f * 15.0f;
    case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: return h * 15.0f * 1.125f; /* (2s + 1) x (1 + 1/8) */
    default: return 0.0f;
    }
}

const char *quantize_strerror(int rc) {
    switch (rc) {
    case 0: return "ok";
    case QUANTIZE_EUNSUPPORTED: return "type not supported by the quantizer, or row not a whole number of blocks";
    case QUANTIZE_ENONFINITE: return "non-finite value (NaN or Inf) in the row, or a non-finite or negative importance";
    case QUANTIZE_ERANGE: return "value too large for the type's scales";
    default: return "unknown quantize error";
    }
}

static int check_row(uint32_t type, const float *x, int64_t n, const float *imatrix) {
    float lim = quantize_max_abs(type);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return QUANTIZE_ENONFINITE;
        if (fabsf(x[i]) > lim) return QUANTIZE_ERANGE;
    }
    if (imatrix) {
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(imatrix[i]) || imatrix[i] < 0) return QUANTIZE_ENONFINITE;
    }
    return 0;
}

int quantize_row(uint32_t type, const float *x, int64_t n, const float *imatrix, void *out) {
    if (!quantize_type_supported(type)) return QUANTIZE_EUNSUPPORTED;
    int64_t bs = ggml_blck_size(type), sz = ggml_type_size(type);
    if (n <= 0 || n % bs) return QUANTIZE_EUNSUPPORTED;
    int rc = check_row(type, x, n, imatrix);
    if (rc) return rc;
    uint8_t *o = out;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(out, x, (size_t)n * 4);
        return 0;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) qz_put16(o + 2 * i, f32_to_f16(x[i]));
        return 0;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) qz_put16(o + 2 * i, f32_to_bf16(x[i]));
        return 0;
    default:
        break;
    }
    for (int64_t ib = 0; ib < n / bs; ib++) {
        const float *xb = x + ib * bs, *w = qz_weights(imatrix, ib * bs, (int)bs);
        uint8_t *ob = o + ib * sz;
        switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: block_sym32(type, xb, w, ob); break;
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: block_affine32(type, xb, w, ob); break;
        case GGML_TYPE_MXFP4: block_mxfp4(xb, w, ob); break;
        case GGML_TYPE_Q2_K: qz_block_q2_k(xb, w, ob); break;
        case GGML_TYPE_Q3_K: qz_block_q3_k(xb, w, ob); break;
        case GGML_TYPE_Q4_K: qz_block_q4_k(xb, w, ob); break;
        case GGML_TYPE_Q5_K: qz_block_q5_k(xb, w, ob); break;
        case GGML_TYPE_Q6_K: qz_block_q6_k(xb, w, ob); break;
        case GGML_TYPE_IQ4_NL: qz_block_iq4_nl(xb, w, ob); break;
        case GGML_TYPE_IQ4_XS: qz_block_iq4_xs(xb, w, ob); break;
        case GGML_TYPE_NVFP4: qz_block_nvfp4(xb, w, ob); break;
        case GGML_TYPE_Q2_0: qz_block_q2_0(xb, w, ob); break;
        case GGML_TYPE_Q1_0: qz_block_q1_0(xb, w, ob); break;
        case GGML_TYPE_TQ2_0: qz_block_tq2_0(xb, w, ob); break;
        case GGML_TYPE_TQ1_0: qz_block_tq1_0(xb, w, ob); break;
        case GGML_TYPE_IQ2_XXS: qz_block_iq2_xxs(xb, w, ob); break;
        case GGML_TYPE_IQ2_XS: qz_block_iq2_xs(xb, w, ob); break;
        case GGML_TYPE_IQ2_S: qz_block_iq2_s(xb, w, ob); break;
        case GGML_TYPE_IQ3_XXS: qz_block_iq3_xxs(xb, w, ob); break;
        case GGML_TYPE_IQ3_S: qz_block_iq3_s(xb, w, ob); break;
        case GGML_TYPE_IQ1_S: qz_block_iq1_s(xb, w, ob); break;
        case GGML_TYPE_IQ1_M: qz_block_iq1_m(xb, w, ob); break;
        default: DSF_ASSERT(!"quantize_type_supported and the dispatch disagree");
        }
    }
    return 0;
}
