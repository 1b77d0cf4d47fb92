/* quant.c: element codecs (bf16, f16, e4m3fn, e8m0, e2m1), the ggml block-type table, the
 * reference QDQ operators, their packed twins (codes + scales) and the MXFP4 nibble repack
 * (gguf-layout.md §1.4-1.5, architecture.md §3, §5.1). The block decoders (dequant_row) live in dequant.c.
 *
 * Owns: pure functions on arrays. No allocation, no I/O, no global state except constant
 * tables. Every conversion is done on IEEE bits with integer arithmetic, so the results
 * do not depend on the floating-point rounding mode. */
#include "kernels/quant.h"
#include "kernels/dtype.h"

#include <math.h>
#include <string.h>

/* ================================================================ bits */

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 2^e as fp32 for e in [-149, 127] (exact, subnormals included). */
static float pow2f(int e) {
    if (e >= -126) return u2f((uint32_t)(e + 127) << 23);
    return u2f(1u << (e + 149));
}

/* Rounds the magnitude of a finite fp32 (bits without sign) to a small float format with
 * `mbits` mantissa bits and minimum normal exponent `emin`, round to nearest, ties to
 * even. Returns the format's magnitude code ((biased exponent << mbits) | mantissa); the
 * code may exceed the format's largest finite code (the caller saturates or maps to inf).
 * Works for subnormal results: the unit in the last place is 2^(max(E, emin) - mbits). */
static uint32_t mini_round(uint32_t abits, int mbits, int emin) {
    uint32_t ef = abits >> 23;
    if (ef == 0) return 0; /* fp32 subnormal: far below half the smallest step of every target */
    int e = (int)ef - 127;
    int eq = e < emin ? emin : e;
    int s = 23 - mbits + (eq - e); /* right shift that leaves units of 2^(eq - mbits) */
    uint64_t m = (abits & 0x7FFFFFu) | 0x800000u;
    if (s > 25) return 0; /* m < 2^24 < half a unit */
    uint64_t q = m >> s;
    uint64_t rem = m & ((1ull << s) - 1), half = 1ull << (s - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    /* Normal: ((eq - emin + 1) << mbits) + q - 2^mbits; subnormal (eq == emin): q. Both are
     * this expression, and a carry of q into 2^(mbits+1) bumps the exponent correctly. */
    return ((uint32_t)(eq - emin) << mbits) + (uint32_t)q;
}

/* ================================================================ element codecs */

float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * pow2f(-24); /* exact: m < 2^10 */
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF)); /* quiet NaN */
    if (a == 0x7F800000u) return (uint16_t)(sign | 0x7C00);
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7C00); /* >= 65536: inf */
    uint32_t c = mini_round(a, 10, -14);
    if (c > 0x7C00) c = 0x7C00; /* rounded up past 65504: inf */
    return (uint16_t)(sign | c);
}

float e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    float v;
    if (e == 0xF && m == 7) return NAN;
    if (e == 0) v = (float)m * pow2f(-9);
    else v = (float)(8 + m) * pow2f((int)e - 10);
    return (b & 0x80) ? -v : v;
}

uint8_t f32_to_e4m3(float f) {
    uint32_t u = f2u(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7F;                  /* NaN stays NaN */
    if (a >= 0x43E00000u) return (uint8_t)(sign | 0x7E); /* |f| >= 448 (inf too): saturate */
    uint32_t c = mini_round(a, 3, -6);
    if (c > 0x7E) c = 0x7E; /* (448, 464) rounds to 448 already; this catches 464+ */
    return (uint8_t)(sign | c);
}

float e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    return pow2f((int)b - 127);
}

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float e2m1_to_f32(uint8_t code) {
    float v = e2m1_mag[code & 7];
    return (code & 8) ? -v : v;
}

/* NaN maps to code 0 (the callers never pass one: the QDQ operators clamp first). */
uint8_t f32_to_e2m1(float f) {
    uint32_t u = f2u(f);
    uint8_t sign = (uint8_t)((u >> 28) & 0x8);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0;
    if (a >= 0x40C00000u) return (uint8_t)(sign | 7); /* |f| >= 6 */
    uint32_t c = mini_round(a, 1, 0);                 /* ties to the even code (§3.1) */
    if (c > 7) c = 7;
    return (uint8_t)(sign | c);
}

/* §3.3: E = exponent field - 127, +1 if the mantissa is non-zero. For a subnormal t the
 * literal recipe would be wrong, so it is handled by the position of the top bit (t that
 * small never occurs in the QDQ operators: their floors keep t >= 2^-126). Returns +inf
 * when the result exceeds fp32. */
float pow2ceil_f32(float t) {
    uint32_t u = f2u(t) & 0x7FFFFFFFu;
    uint32_t ef = u >> 23, m = u & 0x7FFFFFu;
    int e;
    if (ef == 0) {
        if (m == 0) return 0.0f;
        int top = 31 - __builtin_clz(m); /* t = m * 2^-149 */
        e = top - 149 + ((m & (m - 1)) != 0);
    } else {
        e = (int)ef - 127 + (m != 0);
    }
    if (e > 127) return INFINITY;
    return pow2f(e);
}

/* ================================================================ ggml block types */

typedef struct {
    const char *name;
    uint32_t blck, size;
} type_info;

static const type_info types[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"F32", 1, 4},          [GGML_TYPE_F16] = {"F16", 1, 2},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 18},      [GGML_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 22},      [GGML_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 34},      [GGML_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [GGML_TYPE_Q2_K] = {"Q2_K", 256, 84},     [GGML_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [GGML_TYPE_Q4_K] = {"Q4_K", 256, 144},    [GGML_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [GGML_TYPE_Q6_K] = {"Q6_K", 256, 210},    [GGML_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [GGML_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [GGML_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},  [GGML_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [GGML_TYPE_IQ2_S] = {"IQ2_S", 256, 82},   [GGML_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [GGML_TYPE_I8] = {"I8", 1, 1},            [GGML_TYPE_I16] = {"I16", 1, 2},
    [GGML_TYPE_I32] = {"I32", 1, 4},          [GGML_TYPE_I64] = {"I64", 1, 8},
    [GGML_TYPE_F64] = {"F64", 1, 8},          [GGML_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [GGML_TYPE_BF16] = {"BF16", 1, 2},        [GGML_TYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [GGML_TYPE_TQ2_0] = {"TQ2_0", 256, 66},   [GGML_TYPE_MXFP4] = {"MXFP4", 32, 17},
    [GGML_TYPE_NVFP4] = {"NVFP4", 64, 36},    [GGML_TYPE_Q1_0] = {"Q1_0", 128, 18},
    [GGML_TYPE_Q2_0] = {"Q2_0", 64, 18},
};

/* dsflash's native types (dtype.h): FP8B32's rows are its e4m3 bytes (the grid is extra). */
static const type_info native_types[2] = {{"FP8_B32", 1, 1}, {"FP8_R264", 256, 264}};

static const type_info *type_of(uint32_t type) {
    if (type < GGML_TYPE_COUNT) return &types[type];
    if (type == DSF_TYPE_FP8B32 || type == DSF_TYPE_FP8R264) return &native_types[type - DSF_TYPE_FP8B32];
    return NULL;
}

uint32_t ggml_blck_size(uint32_t type) { return type_of(type) ? type_of(type)->blck : 0; }
uint32_t ggml_type_size(uint32_t type) { return type_of(type) ? type_of(type)->size : 0; }

const char *ggml_type_name(uint32_t type) {
    return type_of(type) && type_of(type)->name ? type_of(type)->name : "?";
}

bool dsf_type_native(uint32_t type) { return type == DSF_TYPE_FP8B32 || type == DSF_TYPE_FP8R264; }

uint64_t dsf_type_extra_bytes(uint32_t type, uint64_t ne0, uint64_t rows) {
    if (type != DSF_TYPE_FP8B32) return 0;
    return ((rows + 31) / 32) * ((ne0 + 31) / 32); /* ne0, rows < 2^63: no overflow */
}

/* ================================================================ QDQ (§3.3) */

static float group_amax(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > a) a = v;
    }
    return a;
}

static float clampf(float v, float lim) { return v > lim ? lim : (v < -lim ? -lim : v); }

void qdq_fp8_e8m0(float *x, int64_t n) {
    const float inv448 = 1.0f / 448.0f; /* fp32(1/448) */
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        float *v = x + g;
        float s = pow2ceil_f32(fmaxf(group_amax(v, 32), 1e-4f) * inv448);
        for (int i = 0; i < 32; i++) v[i] = e4m3_to_f32(f32_to_e4m3(clampf(v[i] / s, 448.0f))) * s;
    }
}

void qdq_fp4_e8m0(float *x, int64_t n) {
    const float inv6 = 1.0f / 6.0f, floor_ = 6.0f * 0x1p-126f;
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        float *v = x + g;
        float s = pow2ceil_f32(fmaxf(group_amax(v, 32), floor_) * inv6);
        for (int i = 0; i < 32; i++) v[i] = e2m1_to_f32(f32_to_e2m1(clampf(v[i] / s, 6.0f))) * s;
    }
}

void qdq_fp4_e4m3(float *x, int64_t n) {
    const float floor_ = 6.0f * 0x1p-9f;
    for (int64_t g = 0; g + 16 <= n; g += 16) {
        float *v = x + g;
        /* fp32 divide, then e4m3 RNE: s is not a power of two, so x/s below is inexact. */
        float s = e4m3_to_f32(f32_to_e4m3(fmaxf(group_amax(v, 16), floor_) / 6.0f));
        for (int i = 0; i < 16; i++) v[i] = e2m1_to_f32(f32_to_e2m1(clampf(v[i] / s, 6.0f))) * s;
    }
}

/* ================================================================ packed QDQ (§5.1, §5.5) */

/* The E8M0 byte of a QDQ scale s = 2^E (normal or subnormal fp32); 255 (NaN) for s = inf,
 * which only a group holding an infinity produces (the QDQ then outputs NaNs, and so does
 * the decode). */
static uint8_t e8m0_of_pow2(float s) {
    uint32_t u = f2u(s) & 0x7FFFFFFFu, ef = u >> 23;
    if (ef == 0xFF) return 255;
    if (ef) return (uint8_t)ef;
    /* subnormal 2^E, E = top - 149; the byte E + 127 is >= 0 only down to 2^-127 */
    int b = (31 - __builtin_clz(u | 1u)) - 149 + 127;
    return (uint8_t)(b > 0 ? b : 0);
}

void qdq_fp8_e8m0_pack(const float *x, int64_t n, uint8_t *codes, uint8_t *scales) {
    const float inv448 = 1.0f / 448.0f;
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const float *v = x + g;
        float s = pow2ceil_f32(fmaxf(group_amax(v, 32), 1e-4f) * inv448); /* qdq_fp8_e8m0's scale */
        scales[g / 32] = e8m0_of_pow2(s);
        for (int i = 0; i < 32; i++) codes[g + i] = f32_to_e4m3(clampf(v[i] / s, 448.0f));
    }
}

void unpack_fp8_e8m0(float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const float s = e8m0_to_f32(scales[g / 32]);
        for (int i = 0; i < 32; i++) y[g + i] = e4m3_to_f32(codes[g + i]) * s;
    }
}

/* The FP4 QDQ's codes of a group of n values at scale s, two per byte (2c low, 2c+1 high). */
static void e2m1_codes(const float *v, int n, float s, uint8_t *nib) {
    for (int i = 0; i < n; i += 2)
        nib[i / 2] = (uint8_t)(f32_to_e2m1(clampf(v[i] / s, 6.0f)) | f32_to_e2m1(clampf(v[i + 1] / s, 6.0f)) << 4);
}

void qdq_fp4_e8m0_pack(const float *x, int64_t n, uint8_t *nib, uint8_t *scales) {
    const float inv6 = 1.0f / 6.0f, floor_ = 6.0f * 0x1p-126f;
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const float *v = x + g;
        float s = pow2ceil_f32(fmaxf(group_amax(v, 32), floor_) * inv6); /* qdq_fp4_e8m0's scale */
        scales[g / 32] = e8m0_of_pow2(s);
        e2m1_codes(v, 32, s, nib + g / 2);
    }
}

void unpack_fp4_e8m0(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 32 <= n; g += 32) {
        const float s = e8m0_to_f32(scales[g / 32]);
        for (int i = 0; i < 32; i++) y[g + i] = e2m1_to_f32((uint8_t)(nib[(g + i) / 2] >> (4 * (i & 1)))) * s;
    }
}

void qdq_fp4_e4m3_pack(const float *x, int64_t n, uint8_t *nib, uint8_t *scales) {
    const float floor_ = 6.0f * 0x1p-9f;
    for (int64_t g = 0; g + 16 <= n; g += 16) {
        const float *v = x + g;
        uint8_t sb = f32_to_e4m3(fmaxf(group_amax(v, 16), floor_) / 6.0f); /* qdq_fp4_e4m3's scale */
        float s = e4m3_to_f32(sb);
        scales[g / 16] = sb;
        e2m1_codes(v, 16, s, nib + g / 2);
    }
}

void unpack_fp4_e4m3(float *y, const uint8_t *nib, const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g + 16 <= n; g += 16) {
        const float s = e4m3_to_f32(scales[g / 16]);
        for (int i = 0; i < 16; i++) y[g + i] = e2m1_to_f32((uint8_t)(nib[(g + i) / 2] >> (4 * (i & 1)))) * s;
    }
}

/* What the QDQ operators can store for finite input (hostile-input checks of snapshots):
 * QDQ_FP8's scale 2^E lies in [2^-22, 2^120] (the 1e-4 floor / 448 and FLT_MAX / 448 rounded
 * up), E8M0 bytes [105, 247], and its codes are never NaN (it saturates); QDQ_FP4_E8M0's
 * scale lies in [2^-126, 2^126], bytes [1, 253]; QDQ_FP4_E4M3's scale is a positive finite
 * e4m3 of at least 2^-9: bytes [0x01, 0x7E]. Every e2m1 code is valid. */
bool packed_fp8_valid(const uint8_t *codes, const uint8_t *scales, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((codes[i] & 0x7F) == 0x7F) return false;
    for (int64_t g = 0; g < n / 32; g++)
        if (scales[g] < 105 || scales[g] > 247) return false;
    return true;
}

bool packed_fp4_valid(const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g < n / 32; g++)
        if (scales[g] < 1 || scales[g] > 253) return false;
    return true;
}

bool packed_fp4_e4m3_valid(const uint8_t *scales, int64_t n) {
    for (int64_t g = 0; g < n / 16; g++)
        if (scales[g] < 0x01 || scales[g] > 0x7E) return false;
    return true;
}

/* ================================================================ MXFP4 repack (§3.2) */

void mxfp4_repack_row(const uint8_t *packed, const uint8_t *scales, int64_t n_in, uint8_t *dst) {
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *src = packed + 16 * b; /* checkpoint: byte c = elements (2c, 2c+1) */
        uint8_t *o = dst + 17 * b;
        o[0] = scales[b];
        for (int j = 0; j < 16; j++) {
            uint8_t lo = (uint8_t)((src[j / 2] >> (4 * (j & 1))) & 0xF);
            uint8_t hi = (uint8_t)((src[(16 + j) / 2] >> (4 * (j & 1))) & 0xF);
            o[1 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quantize_row_q8k(const float *x, int64_t n, void *out) {
    uint8_t *o = out;
    for (int64_t b = 0; b < n / 256; b++, x += 256, o += 292) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        int8_t q[256];
        int16_t bs[16];
        float d = 0.0f;
        if (amax == 0.0f) {
            memset(q, 0, sizeof q);
        } else {
            const float iscale = -127.0f / max;
            for (int i = 0; i < 256; i++) {
                long v = lrintf(iscale * x[i]); /* the default rounding: to nearest, ties to even */
                q[i] = (int8_t)(v < 127 ? v : 127);
            }
            d = 1.0f / iscale;
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[16 * j + i];
            bs[j] = (int16_t)s;
        }
        memcpy(o, &d, 4);
        memcpy(o + 4, q, 256);
        memcpy(o + 260, bs, 32);
    }
}
