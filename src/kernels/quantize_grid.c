/* quantize_grid.c: the encoders of the non-uniform grid and few-level types: IQ4_NL (and the
 * grid search IQ4_XS shares, quantize_k.c), NVFP4, Q1_0, Q2_0, TQ1_0, TQ2_0.
 *
 * Owns: their scale searches and bit packing (layouts: TYPE.json of ../shared/testdata/quants),
 * written to be read by dequant.c's decoders.
 * Must not: allocate (scratch is a block on the stack), do I/O, keep state, or contract
 * floating-point expressions.
 * Invariant: as quantize_impl.h's: finite inputs, weights >= 0 with a positive sum; every byte
 * of the block is written. */
#include "kernels/quantize_impl.h"
#include "kernels/quant.h"
#include "kernels/grids.h"

#include <math.h>
#include <string.h>

/* ================================================================ IQ4_NL grid */

double qz_assign_nl(const float *x, const float *w, int n, float a, int lo, int hi, int8_t *q) {
    (void)lo;
    (void)hi;
    float e = 0.0f, inv = fabsf(a) < QZ_TINY ? 0.0f : 1.0f / a;
    for (int i = 0; i < n; i++) {
        float v = x[i] * inv;
        int k = 0; /* grid_iq4nl ascends: the nearest value by the midpoints */
        while (k < 15 && v > 0.5f * (float)(grid_iq4nl[k] + grid_iq4nl[k + 1])) k++;
        if (q) q[i] = (int8_t)k;
        float diff = x[i] - a * (float)grid_iq4nl[k];
        e += w[i] * diff * diff; /* fp32: at most 256 terms >= 0, only compared */
    }
    return e;
}

/* sum(w x v)^2 / sum(w v v) for the assignment of scale a (the E it saves), and its optimum
 * scale in *s; -1 when every value is 0. */
static double nl_score(const float *x, const float *w, int n, float a, int8_t *q, float *s) {
    qz_assign_nl(x, w, n, a, 0, 15, q);
    double sxv = 0, svv = 0;
    for (int i = 0; i < n; i++) {
        double v = grid_iq4nl[q[i]];
        sxv += (double)w[i] * x[i] * v;
        svv += (double)w[i] * v * v;
    }
    if (!(svv > 0)) return -1;
    *s = (float)(sxv / svv);
    return sxv * sxv / svv;
}

float qz_fit_nl(const float *x, const float *w, int n, int8_t *q) {
    float amax = 0.0f, xm = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            xm = x[i];
        }
    }
    if (amax < QZ_TINY) {
        qz_assign_nl(x, w, n, 0.0f, 0, 15, q);
        return 0.0f;
    }
    /* Candidates: the largest |x| at grid level l, l from 0.7 to 1.2 times either end (-127,
     * 113), in steps of 0.025; each scored by its least-squares optimum. */
    double best = -1;
    float best_s = 0.0f;
    int8_t qc[256];
    for (int side = 0; side < 2; side++) {
        for (int k = 0; k <= 20; k++) {
            float l = (float)(side ? grid_iq4nl[15] : grid_iq4nl[0]) * (0.7f + 0.025f * (float)k), s;
            double sc = nl_score(x, w, n, xm / l, qc, &s);
            if (sc > best) {
                best = sc;
                best_s = s;
            }
        }
    }
    /* Alternate: nearest assignment, then least squares, while E decreases. */
    float s = best_s;
    double e = qz_assign_nl(x, w, n, s, 0, 15, q);
    for (int it = 0; it < 16; it++) {
        float s2;
        if (nl_score(x, w, n, s, qc, &s2) < 0 || s2 == s) break;
        double e2 = qz_assign_nl(x, w, n, s2, 0, 15, qc);
        if (!(e2 < e)) break;
        s = s2;
        e = e2;
        memcpy(q, qc, (size_t)n);
    }
    return s;
}

/* Four bits per value, 32 values in 16 bytes: element j in the low nibble of byte j, element
 * j + 16 in the high nibble (Q4_0's placement). */
static void pack_nibbles32(const int8_t *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* IQ4_NL {f16 d; u8 qs[16]}: deq = d * grid_iq4nl[q]. */
void qz_block_iq4_nl(const float *x, const float *w, uint8_t *out) {
    int8_t q[32];
    float d = qz_f16_refine(qz_assign_nl, x, w, 32, 0, 15, qz_f16_round(qz_fit_nl(x, w, 32, q)), q);
    qz_put16(out, f32_to_f16(d));
    pack_nibbles32(q, out + 2);
}

/* ================================================================ NVFP4 */

/* NVFP4 {u8 d[4]; u8 qs[32]}: sub-block s (16 values) has UE4M3 scale byte d[s] (multiplier
 * grid_ue4m3_half[byte]) and codes in qs[8s..8s+7] (value j low nibble, j + 8 high). Each
 * sub-block tries every scale byte 0x01..0x7E whose largest level (12 x multiplier) lies within
 * a factor 4 of its largest |x| (0x01 and 0x7E always), codes nearest: exact per sub-block.
 * 0x7F (0 in ggml, NaN in E4M3) and bytes with bit 7 set are never written; values beyond
 * 12 x 224 = 2688 saturate there, as ggml's quantizer clamps. */
void qz_block_nvfp4(const float *x, const float *w, uint8_t *out) {
    for (int s = 0; s < 4; s++) {
        const float *xs = x + 16 * s, *ws = w + 16 * s;
        float amax = 0.0f;
        for (int j = 0; j < 16; j++) amax = fmaxf(amax, fabsf(xs[j]));
        double best = -1;
        uint8_t codes[16], bc[16], bb = 0;
        memset(bc, 0, sizeof bc);
        for (int b = 1; b <= 0x7E && amax > 0.0f; b++) {
            float m = grid_ue4m3_half[b];
            if ((b < 0x7E && 48.0f * m < amax) || (b > 1 && 3.0f * m > 4.0f * amax)) continue;
            double e = qz_fp4_codes(xs, ws, 16, m, 1.0f / m, 1.0f, codes);
            if (best < 0 || e < best) {
                best = e;
                bb = (uint8_t)b;
                memcpy(bc, codes, 16);
            }
        }
        out[s] = bb;
        for (int j = 0; j < 8; j++) out[4 + 8 * s + j] = (uint8_t)(bc[j] | (bc[j + 8] << 4));
    }
}

/* ================================================================ Q1_0, Q2_0 */

/* Q1_0 {f16 d; u8 qs[16]}: deq = +d where bit j % 8 of qs[j / 8] is set, else -d. The sign
 * follows x; d = the weighted mean |x| (the least-squares optimum), rounded to f16. */
void qz_block_q1_0(const float *x, const float *w, uint8_t *out) {
    double sa = 0, sw = 0;
    for (int j = 0; j < 128; j++) {
        sa += (double)w[j] * fabsf(x[j]);
        sw += w[j];
    }
    qz_put16(out, f32_to_f16(qz_f16_round((float)(sa / sw))));
    memset(out + 2, 0, 16);
    for (int j = 0; j < 128; j++) out[2 + j / 8] |= (uint8_t)((x[j] >= 0.0f) << (j % 8));
}

/* Q2_0 {f16 d; u8 qs[16]}: deq = d * q, q in [-1, 2], stored as q + 1 at bits 2(j % 4) of
 * qs[j / 4]. */
void qz_block_q2_0(const float *x, const float *w, uint8_t *out) {
    int8_t q[64];
    qz_put16(out, f32_to_f16(qz_fit_sym_f16(x, w, 64, -1, 2, q)));
    memset(out + 2, 0, 16);
    for (int j = 0; j < 64; j++) out[2 + j / 4] |= (uint8_t)((q[j] + 1) << (2 * (j % 4)));
}

/* ================================================================ ternary */

/* TQ2_0 {u8 qs[64]; f16 d}: deq = d * q, q in [-1, 1] stored as q + 1; element e = 128c + 32n + m
 * at bits 2n of qs[32c + m]. */
void qz_block_tq2_0(const float *x, const float *w, uint8_t *out) {
    int8_t q[256];
    float d = qz_fit_sym_f16(x, w, 256, -1, 1, q);
    memset(out, 0, 64);
    for (int e = 0; e < 256; e++) out[32 * (e / 128) + e % 32] |= (uint8_t)((q[e] + 1) << (2 * ((e % 128) / 32)));
    qz_put16(out + 64, f32_to_f16(d));
}

/* One TQ1_0 byte from up to 5 ternary digits u_0..u_{nd-1} (u = q + 1; missing digits 0):
 * v = sum u_n 3^(4-n), written as ceil(v * 256 / 243) (README: digit n of a byte b decodes as
 * floor(((b * 3^n) mod 256) * 3 / 256)). */
static uint8_t tq1_byte(const int8_t *q, int stride, int nd) {
    int v = 0;
    for (int n = 0; n < 5; n++) v = 3 * v + (n < nd ? q[n * stride] + 1 : 0);
    return (uint8_t)((v * 256 + 242) / 243);
}

/* TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}: deq = d * q, q in [-1, 1]; digit n of qs[j] is element
 * 32n + j (j < 32) or 160 + 16n + (j - 32) (32 <= j < 48); digit n < 4 of qh[j] is element
 * 240 + 4n + j. */
void qz_block_tq1_0(const float *x, const float *w, uint8_t *out) {
    int8_t q[256];
    float d = qz_fit_sym_f16(x, w, 256, -1, 1, q);
    for (int j = 0; j < 32; j++) out[j] = tq1_byte(q + j, 32, 5);
    for (int j = 0; j < 16; j++) out[32 + j] = tq1_byte(q + 160 + j, 16, 5);
    for (int j = 0; j < 4; j++) out[48 + j] = tq1_byte(q + 240 + j, 4, 4);
    qz_put16(out + 52, f32_to_f16(d));
}
