/* dequant.c: the scalar block decoders of every ggml type the kernels read (dequant_row,
 * ggml_type_supported; declared in quant.h), the reference twins of any SIMD decode.
 *
 * Owns: one decoder per block format, written from the layouts of gguf-layout.md §1.5 and
 * ../shared/testdata/quants/TYPE.json (ggml 0.25.1); the lookup tables are data (grids.c,
 * generated from the fixtures' grids.json).
 * Must not: allocate, do I/O, keep state, flush subnormals to zero, or be compiled with
 * contraction into FMA (the Makefile's -ffp-contract=off): the outputs are ggml's bits.
 * Invariant: products are formed in ggml's order -- scale, then sub-scale, then quant or grid
 * value, each integer converted to float before it is multiplied -- so that a negative
 * scale times a zero quant gives ggml's -0.0. Every such product is exact in fp32 (Q8_K's fp32
 * scale times int8 aside: one rounding, as ggml's); the only other rounding step is adding a
 * block minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), one fp32 operation.
 * All block reads are byte-wise (little-endian, unaligned-safe). */
#include "kernels/quant.h"
#include "kernels/dtype.h"
#include "kernels/grids.h"
#include "base/util.h"

#include <string.h>

/* ================================================================ bytes */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}

static inline float f16at(const uint8_t *p) { return f16_to_f32(rd16(p)); }

static inline float f32at(const uint8_t *p) {
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ================================================================ legacy and K block decoders
 * Each decodes one block at b into y (block-size elements). */

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b));
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0xF) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b)), m = f16_to_f32(rd16(b + 2));
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0xF) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0/Q5_1: bit j of the 32-bit qh is the 5th bit of element j (j = 0..31). */
static void deq_q5_0(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b));
    uint32_t qh = rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b)), m = f16_to_f32(rd16(b + 2));
    uint32_t qh = rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)lo * d + m;
        y[j + 16] = (float)hi * d + m;
    }
}

/* Q8_0 {f16 d; int8 qs[32]}, Q8_1 {f16 d; f16 s; int8 qs[32]} (s is a sum, unused here). */
static void deq_q8_0(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b));
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void deq_q8_1(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b));
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[4 + j] * d;
}

/* Q8_K {f32 d; int8 qs[256]; int16 bsums[16]}. */
static void deq_q8_k(const uint8_t *b, float *y) {
    float d = f32at(b);
    for (int j = 0; j < 256; j++) y[j] = (float)(int8_t)b[4 + j] * d;
}

/* Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: two halves of 128; per half 32 qs bytes,
 * four 2-bit planes (shift 0, 2, 4, 6), each plane 16 elements from qs[0..15] then 16 from
 * qs[16..31], each 16 with its own scale byte (low nibble scale, high nibble min). */
static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16_to_f32(rd16(b + 80)), dmin = f16_to_f32(rd16(b + 82));
    int is = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *q = qs + 32 * h;
        for (int shift = 0; shift < 8; shift += 2) {
            for (int part = 0; part < 2; part++) {
                uint8_t s = sc[is++];
                float dl = d * (float)(s & 0xF), ml = dmin * (float)(s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[16 * part + l] >> shift) & 3) - ml;
            }
        }
    }
}

/* Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 signed 6-bit scales (bias 32):
 * low 4 bits from scales[i] (i < 8) or scales[i-8] >> 4, high 2 bits from bits 2(i/4)..+1 of
 * scales[8 + i%4]. Elements come in eight groups of 32 (two halves x four 2-bit planes, as
 * Q2_K); group g's third bit is bit g of hmask[l]; a clear bit subtracts 4. */
static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sb = b + 96;
    float d = f16_to_f32(rd16(b + 108));
    int sc[16];
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (sb[i] & 0xF) : (sb[i - 8] >> 4);
        int hi = (sb[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        sc[i] = (lo | (hi << 4)) - 32;
    }
    int is = 0, g = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *q = qs + 32 * h;
        for (int shift = 0; shift < 8; shift += 2, g++) {
            for (int part = 0; part < 2; part++) {
                float dl = d * (float)sc[is++];
                for (int l = 16 * part; l < 16 * part + 16; l++) {
                    int v = ((q[l] >> shift) & 3) - (((hm[l] >> g) & 1) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
        }
    }
}

/* The 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K (gguf-layout §1.5). */
static void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]} and Q5_K {f16 d; f16 dmin; u8 scales[12];
 * u8 qh[32]; u8 qs[128]} (qh NULL for Q4_K): chunk c of 64 uses qs[32c..32c+31], low nibbles =
 * sub-block 2c, high nibbles = sub-block 2c+1; Q5_K adds a fifth bit (+16) for sub-block k from
 * bit k of qh[l]. y = d*sc*q - dmin*m. */
static void deq_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    float d = f16at(b), dmin = f16at(b + 2);
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = qs + 32 * c;
        for (int k = 0; k < 2; k++, y += 32) {
            int sc, m;
            scale_min_k4(b + 4, 2 * c + k, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int v = k ? q[l] >> 4 : q[l] & 0xF;
                if (qh) v += ((qh[l] >> (2 * c + k)) & 1) << 4;
                y[l] = dl * (float)v - ml;
            }
        }
    }
}

static void deq_q4_k(const uint8_t *b, float *y) { deq_k45(b, NULL, b + 16, y); }
static void deq_q5_k(const uint8_t *b, float *y) { deq_k45(b, b + 16, b + 48, y); }

/* Q6_K {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d} (gguf-layout §1.5). */
static void deq_q6_k(const uint8_t *b, float *y) {
    float d = f16_to_f32(rd16(b + 208));
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is + 0] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
    }
}

/* ================================================================ small-block types */

/* Q1_0 {f16 d; u8 qs[16]}: bit j%8 of qs[j/8] set -> +d, clear -> -d. */
static void deq_q1_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 128; j++) y[j] = ((b[2 + j / 8] >> (j % 8)) & 1) ? d : -d;
}

/* Q2_0 {f16 d; u8 qs[16]}: code = bits 2(j%4).. of qs[j/4]; value (code - 1) * d. */
static void deq_q2_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 64; j++) y[j] = (float)(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
}

/* IQ4_NL {f16 d; u8 qs[16]}: nibbles as Q4_0 (low = element j, high = j+16) index grid_iq4nl. */
static void deq_iq4_nl(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)grid_iq4nl[b[2 + j] & 0xF];
        y[j + 16] = d * (float)grid_iq4nl[b[2 + j] >> 4];
    }
}

/* ================================================================ FP4 */

/* n E2M1 codes in qs[0..n/2): low nibbles -> y[0..n/2), high nibbles -> y[n/2..n), each
 * the doubled E2M1 integer times the half scale s. */
static void fp4_codes(const uint8_t *qs, int n, float s, float *y) {
    for (int j = 0; j < n / 2; j++) {
        y[j] = (float)grid_fp4[qs[j] & 0xF] * s;
        y[j + n / 2] = (float)grid_fp4[qs[j] >> 4] * s;
    }
}

/* MXFP4 {u8 e; u8 qs[16]}: half scale 2^(e-128) for every e (0/1 give subnormals, 255 is not
 * NaN); code 8 (E2M1 -0) gives +0. */
static void deq_mxfp4(const uint8_t *b, float *y) { fp4_codes(b + 1, 32, grid_e8m0_half[b[0]], y); }

/* NVFP4 {u8 d[4]; u8 qs[32]}: sub-block s (16 values) has UE4M3 scale byte d[s] and code
 * bytes qs[8s..8s+7] (low nibble = value j, high = value j+8). No per-tensor scale. */
static void deq_nvfp4(const uint8_t *b, float *y) {
    for (int s = 0; s < 4; s++) fp4_codes(b + 4 + 8 * s, 16, grid_ue4m3_half[b[s]], y + 16 * s);
}

/* ================================================================ ternary */

/* TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}: ternary digits (grid_tq1_digits) as value + 1. Digit n
 * of qs[j] is element 32n + j (j < 32) or 160 + 16n + (j - 32) (j >= 32, n < 5); digit n < 4
 * of qh[j] is element 240 + 4n + j. */
static void deq_tq1_0(const uint8_t *b, float *y) {
    float d = f16at(b + 52);
    for (int j = 0; j < 52; j++) {
        unsigned dig = grid_tq1_digits[b[j]];
        int nd = j < 48 ? 5 : 4;
        for (int n = 0; n < nd; n++) {
            int e = j < 32 ? 32 * n + j : j < 48 ? 160 + 16 * n + (j - 32) : 240 + 4 * n + (j - 48);
            y[e] = (float)((int)((dig >> (2 * n)) & 3) - 1) * d;
        }
    }
}

/* TQ2_0 {u8 qs[64]; f16 d}: element e = 128c + 32n + m has code (qs[32c + m] >> 2n) & 3; value
 * (code - 1) * d (code 3, never written by ggml, gives 2d). */
static void deq_tq2_0(const uint8_t *b, float *y) {
    float d = f16at(b + 64);
    for (int e = 0; e < 256; e++) {
        int c = e / 128, n = (e % 128) / 32, m = e % 32;
        y[e] = (float)(((b[32 * c + m] >> (2 * n)) & 3) - 1) * d;
    }
}

/* ================================================================ IQ2 / IQ3 (grids, signs)
 * value = scale * grid value, negated where the sub-group's sign mask has bit j set. */

/* 8 values of an 8-byte grid entry (or two 4-byte ones, lo then hi) times db, signs applied. */
static void grid8(uint64_t gr, uint8_t mask, float db, float *y) {
    for (int j = 0; j < 8; j++) {
        float v = db * (float)((gr >> (8 * j)) & 0xFF);
        y[j] = (mask >> j) & 1 ? -v : v;
    }
}

static inline uint64_t pair32(uint32_t lo, uint32_t hi) { return (uint64_t)lo | ((uint64_t)hi << 32); }

/* The IQ2 multiplier of a 4-bit scale s: d * (0.5 + s) * 0.25, in that order. */
static inline float iq2_scale(float d, int s) { return d * (0.5f + (float)s) * 0.25f; }

/* IQ2_XXS {f16 d; 8 x (u8 idx[4]; u32 w)}: w bits 7k.. sign selector of sub-group k, bits 28..31
 * scale s; multiplier d * (0.5 + s) * 0.25. */
static void deq_iq2_xxs(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        const uint8_t *o = b + 2 + 8 * g;
        uint32_t w = rd32(o + 4);
        float db = iq2_scale(d, (int)(w >> 28));
        for (int k = 0; k < 4; k++, y += 8) grid8(grid_iq2xxs[o[k]], grid_iq2_signs[(w >> (7 * k)) & 127], db, y);
    }
}

/* IQ2_XS {f16 d; u16 qs[32]; u8 scales[8]}: word = 9-bit index | 7-bit sign selector << 9;
 * scales[g] low nibble for sub-groups 0-1 of group g, high nibble for 2-3. */
static void deq_iq2_xs(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        for (int k = 0; k < 4; k++, y += 8) {
            float db = iq2_scale(d, (b[66 + g] >> (k < 2 ? 0 : 4)) & 0xF);
            uint16_t w = rd16(b + 2 + 2 * (4 * g + k));
            grid8(grid_iq2xs[w & 511], grid_iq2_signs[w >> 9], db, y);
        }
    }
}

/* IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: index = qs[4g+k] | bits 2k..
 * of qh[g] << 8; sign byte signs[4g+k] used directly; scales as IQ2_XS. */
static void deq_iq2_s(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        for (int k = 0; k < 4; k++, y += 8) {
            float db = iq2_scale(d, (b[74 + g] >> (k < 2 ? 0 : 4)) & 0xF);
            int idx = b[2 + 4 * g + k] | (((b[66 + g] >> (2 * k)) & 3) << 8);
            grid8(grid_iq2s[idx], b[34 + 4 * g + k], db, y);
        }
    }
}

/* IQ3_XXS {f16 d; u8 qs[64]; u32 scales_signs[8]}: sub-group k of group g is grid_iq3xxs of
 * qs[8g+2k] then qs[8g+2k+1]; the group's word as IQ2_XXS's, multiplier d * (0.5 + s) * 0.5. */
static void deq_iq3_xxs(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = b + 2 + 8 * g;
        uint32_t w = rd32(b + 66 + 4 * g);
        float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
        for (int k = 0; k < 4; k++, y += 8)
            grid8(pair32(grid_iq3xxs[q[2 * k]], grid_iq3xxs[q[2 * k + 1]]), grid_iq2_signs[(w >> (7 * k)) & 127],
                  db, y);
    }
}

/* IQ3_S {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: 9-bit index = qs[8g+i] | bit i
 * of qh[g] << 8; sign byte per sub-group; scale nibble g of scales, multiplier d * (1 + 2s). */
static void deq_iq3_s(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = b + 2 + 8 * g;
        int s = (b[106 + g / 2] >> (4 * (g % 2))) & 0xF, qh = b[66 + g];
        float db = d * (float)(1 + 2 * s);
        for (int k = 0; k < 4; k++, y += 8) {
            int i0 = q[2 * k] | (((qh >> (2 * k)) & 1) << 8), i1 = q[2 * k + 1] | (((qh >> (2 * k + 1)) & 1) << 8);
            grid8(pair32(grid_iq3s[i0], grid_iq3s[i1]), b[74 + 4 * g + k], db, y);
        }
    }
}

/* ================================================================ IQ1 (grid + delta) */

/* 8 values dl * (grid value + delta) of an IQ1 grid entry (2-bit codes, value + 1). */
static void grid1(uint16_t gr, float dl, float delta, float *y) {
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)((int)((gr >> (2 * j)) & 3) - 1) + delta);
}

/* IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}: qh[g] bits 3k.. = index bits 8..10 of sub-group k, bits
 * 12..14 scale s (multiplier d * (2s + 1)), bit 15 the delta sign of the group. */
static void deq_iq1_s(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int g = 0; g < 8; g++) {
        uint16_t w = rd16(b + 34 + 2 * g);
        float dl = d * (float)(2 * ((w >> 12) & 7) + 1);
        float delta = (w & 0x8000) ? -GRID_IQ1_DELTA : GRID_IQ1_DELTA;
        for (int k = 0; k < 4; k++, y += 8) grid1(grid_iq1s[b[2 + 4 * g + k] | (((w >> (3 * k)) & 7) << 8)], dl, delta, y);
    }
}

/* IQ1_M {u8 qs[32]; u8 qh[16]; u16 sc[4]}: the f16 d is the top nibbles of sc[0..3] (sc[0]'s
 * lowest); sc[g/2] >> 6(g%2): bits 0..2 scale of sub-groups 0-1, bits 3..5 of 2-3. Nibble k%2
 * of qh[2g + k/2]: bits 0..2 index bits 8..10, bit 3 the delta sign of sub-group k. */
static void deq_iq1_m(const uint8_t *b, float *y) {
    uint16_t sc[4];
    for (int i = 0; i < 4; i++) sc[i] = rd16(b + 48 + 2 * i);
    float d = f16_to_f32((uint16_t)((sc[0] >> 12) | ((sc[1] >> 12) << 4) | ((sc[2] >> 12) << 8) | ((sc[3] >> 12) << 12)));
    for (int g = 0; g < 8; g++) {
        int sw = sc[g / 2] >> (6 * (g % 2));
        for (int k = 0; k < 4; k++, y += 8) {
            float dl = d * (float)(2 * ((sw >> (k < 2 ? 0 : 3)) & 7) + 1);
            int nib = (b[32 + 2 * g + k / 2] >> (4 * (k % 2))) & 0xF;
            grid1(grid_iq1s[b[4 * g + k] | ((nib & 7) << 8)], dl, (nib & 8) ? -GRID_IQ1_DELTA : GRID_IQ1_DELTA, y);
        }
    }
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: 6-bit scale of group g = nibble g%2
 * of scales_l[g/2] | bits 2g.. of scales_h << 4, multiplier d * (ls - 32); group g's 16 bytes
 * as IQ4_NL's. */
static void deq_iq4_xs(const uint8_t *b, float *y) {
    float d = f16at(b);
    uint16_t sh = rd16(b + 2);
    for (int g = 0; g < 8; g++, y += 32) {
        int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        const uint8_t *q = b + 8 + 16 * g;
        for (int j = 0; j < 16; j++) {
            y[j] = dl * (float)grid_iq4nl[q[j] & 0xF];
            y[j + 16] = dl * (float)grid_iq4nl[q[j] >> 4];
        }
    }
}

/* ================================================================ rows */

typedef void (*block_fn)(const uint8_t *b, float *y);

static const block_fn decoders[GGML_TYPE_COUNT] = {
    [GGML_TYPE_Q4_0] = deq_q4_0,       [GGML_TYPE_Q4_1] = deq_q4_1,       [GGML_TYPE_Q5_0] = deq_q5_0,
    [GGML_TYPE_Q5_1] = deq_q5_1,       [GGML_TYPE_Q8_0] = deq_q8_0,       [GGML_TYPE_Q8_1] = deq_q8_1,
    [GGML_TYPE_Q8_K] = deq_q8_k,       [GGML_TYPE_Q2_K] = deq_q2_k,       [GGML_TYPE_Q3_K] = deq_q3_k,
    [GGML_TYPE_Q4_K] = deq_q4_k,       [GGML_TYPE_Q5_K] = deq_q5_k,       [GGML_TYPE_Q6_K] = deq_q6_k,
    [GGML_TYPE_IQ2_XXS] = deq_iq2_xxs, [GGML_TYPE_IQ2_XS] = deq_iq2_xs,   [GGML_TYPE_IQ2_S] = deq_iq2_s,
    [GGML_TYPE_IQ3_XXS] = deq_iq3_xxs, [GGML_TYPE_IQ3_S] = deq_iq3_s,     [GGML_TYPE_IQ1_S] = deq_iq1_s,
    [GGML_TYPE_IQ1_M] = deq_iq1_m,     [GGML_TYPE_IQ4_NL] = deq_iq4_nl,   [GGML_TYPE_IQ4_XS] = deq_iq4_xs,
    [GGML_TYPE_TQ1_0] = deq_tq1_0,     [GGML_TYPE_TQ2_0] = deq_tq2_0,     [GGML_TYPE_MXFP4] = deq_mxfp4,
    [GGML_TYPE_NVFP4] = deq_nvfp4,     [GGML_TYPE_Q1_0] = deq_q1_0,       [GGML_TYPE_Q2_0] = deq_q2_0,
};

/* dsflash's DSF_TYPE_FP8R264 (dtype.h): 256 e4m3 bytes, then 8 E8M0 scales, one per 32. */
static void deq_fp8r264(const uint8_t *b, float *y) {
    for (int j = 0; j < 256; j++) y[j] = e4m3_to_f32(b[j]) * e8m0_to_f32(b[256 + j / 32]);
}

/* The element types dequant_row converts one value at a time. */
static bool is_scalar(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_F64:
    case GGML_TYPE_I8: case GGML_TYPE_I16: case GGML_TYPE_I32: case GGML_TYPE_I64:
        return true;
    default:
        return false;
    }
}

bool ggml_type_supported(uint32_t type) {
    return is_scalar(type) || type == DSF_TYPE_FP8R264 || (type < GGML_TYPE_COUNT && decoders[type] != NULL);
}

void dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case GGML_TYPE_F16: for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(rd16(p + 2 * i)); return;
    case GGML_TYPE_BF16: for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(rd16(p + 2 * i)); return;
    case GGML_TYPE_F64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = rd64(p + 8 * i);
            double v;
            memcpy(&v, &u, 8);
            dst[i] = (float)v; /* IEEE (Annex F) conversion: out of range gives +-inf */
        }
        return;
    case GGML_TYPE_I8: for (int64_t i = 0; i < n; i++) dst[i] = (float)(int8_t)p[i]; return;
    case GGML_TYPE_I16: for (int64_t i = 0; i < n; i++) dst[i] = (float)(int16_t)rd16(p + 2 * i); return;
    case GGML_TYPE_I32: for (int64_t i = 0; i < n; i++) dst[i] = (float)(int32_t)rd32(p + 4 * i); return;
    case GGML_TYPE_I64: for (int64_t i = 0; i < n; i++) dst[i] = (float)(int64_t)rd64(p + 8 * i); return;
    default: break;
    }
    DSF_ASSERT(ggml_type_supported(type)); /* callers check first */
    block_fn fn = type == DSF_TYPE_FP8R264 ? deq_fp8r264 : decoders[type];
    int64_t bs = ggml_blck_size(type), sz = ggml_type_size(type);
    for (int64_t i = 0; i < n / bs; i++) fn(p + i * sz, dst + i * bs);
}
