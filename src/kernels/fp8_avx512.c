/* fp8_avx512.c: the AVX-512 products of DSF_TYPE_FP8B32 weights (fp8.h): the fused T = 1 kernels
 * of both families, the row decoder to BF16 for the scratch path, and the entries that
 * matmul_avx512.c and matmul_amx.c register (compiled with the Makefile's AVX512_FLAGS only).
 *
 * Decode (fp8.h): 32 e4m3 codes sign-extended to words and shifted left by 7 are the fp16 bits of
 * value x 2^-8 once bit 14 (a copy of the sign) is cleared; vcvtph2ps widens them exactly and one
 * multiplication by 2^(S-119) gives the weight, exact for 3 <= S <= 246. The multipliers of 16
 * groups are prepared at once and broadcast from memory in the inner loop.
 *
 * The fused T = 1 kernels repeat the BF16 T = 1 tiles of matmul_avx512.c operation for operation:
 * per row one accumulator, per group of 32 the two fp32 FMAs (elements 0-15 then 16-31) or the one
 * vdpbf16ps (BF16 activations; the weights rounded to BF16 by vcvtne2ps2bf16, exact for them but
 * for the subnormals, which it flushes as vdpbf16ps would), K chunks of the caller's kc with the
 * chunk sums added into y in order, each chunk's lanes summed by red4. A tile is 4 rows from 4
 * far-apart streams (tile512.h), which changes no value. Exceptional blocks (a scale outside
 * 3..246, a NaN code: tracked per row by byte maxima) make the tile's row go through the scratch
 * path, whose decoder takes such blocks element by element. */
#include "kernels/fp8.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/tile512.h"

#define FRB 4 /* rows per fused tile */

/* ---- decode: a table lookup, no fp16 and no subnormal operand ----
 * BF16 bits of the e4m3 magnitude j = code & 0x7F at unit scale (architecture.md §3.1: e >= 1:
 * (8 + m) 2^(e-10), exponent field e + 120; e = 0: m 2^-9, normalized; 127 is NaN), split into
 * high and low bytes: two vpermi2b (128 entries each) give them for 64 codes at once. */
#define E4M3_SUB(m) ((m) == 0 ? 0 : (m) == 1 ? 0x3B00 : (m) < 4 ? 0x3B80 | ((m) - 2) << 6 : 0x3C00 | ((m) - 4) << 5)
#define E4M3_BF16(j) ((j) == 127 ? 0x7FC0 : ((j) >> 3) ? (((j) >> 3) + 120) << 7 | ((j) & 7) << 4 : E4M3_SUB(j))
#define LUT_HI(j) (uint8_t)(E4M3_BF16(j) >> 8)
#define LUT_LO(j) (uint8_t)(E4M3_BF16(j) & 0xFF)
#define R8(F, j) F(j), F(j + 1), F(j + 2), F(j + 3), F(j + 4), F(j + 5), F(j + 6), F(j + 7)
#define R64(F, j) R8(F, j), R8(F, j + 8), R8(F, j + 16), R8(F, j + 24), R8(F, j + 32), R8(F, j + 40), R8(F, j + 48), R8(F, j + 56)
static const uint8_t lut_hi[128] __attribute__((aligned(64))) = {R64(LUT_HI, 0), R64(LUT_HI, 64)};
static const uint8_t lut_lo[128] __attribute__((aligned(64))) = {R64(LUT_LO, 0), R64(LUT_LO, 64)};

/* The tables and the byte gathers that place code i's BF16 bytes (low, high) in bytes 2 and 3 of
 * dword i % 16 of vector i / 16 (bytes 0 and 1 are zeroed: the fp32 whose top half is the BF16). */
typedef struct {
    __m512i h0, h1, l0, l1, ix[4];
} lut;

static inline void lut_load(lut *L) {
    L->h0 = _mm512_load_si512((const void *)lut_hi);
    L->h1 = _mm512_load_si512((const void *)(lut_hi + 64));
    L->l0 = _mm512_load_si512((const void *)lut_lo);
    L->l1 = _mm512_load_si512((const void *)(lut_lo + 64));
    for (int k = 0; k < 4; k++) {
        _Alignas(64) uint8_t ix[64];
        for (int d = 0; d < 16; d++) {
            ix[4 * d] = ix[4 * d + 1] = 0;
            ix[4 * d + 2] = (uint8_t)(16 * k + d);
            ix[4 * d + 3] = (uint8_t)(64 + 16 * k + d);
        }
        L->ix[k] = _mm512_load_si512((const void *)ix);
    }
}

/* The unit-scale weights of 64 codes q (two groups) as fp32: v[0], v[1] the first group's
 * elements 0-15 and 16-31, v[2], v[3] the second's. The sign is the code's bit 7 (-0 stays -0). */
INLINE void dec64(__m512i q, const lut *L, __m512 *v) {
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(L->h0, q, L->h1), q,
                                                 _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (q & 0x80) */
    const __m512i lo = _mm512_permutex2var_epi8(L->l0, q, L->l1);
    UNROLL for (int k = 0; k < 4; k++)
        v[k] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8((__mmask64)0xCCCCCCCCCCCCCCCCull, lo, L->ix[k], hi));
}

/* 64 codes at p, or 32 (the upper half zero) when one group is left. */
INLINE __m512i codes(const uint8_t *p, int two) {
    return two ? _mm512_loadu_si512((const void *)p) : _mm512_maskz_loadu_epi8((__mmask64)0xFFFFFFFFull, p);
}

/* The multipliers 2^(S-127) (fp32 bits S << 23) of n <= 16 groups' scales sc into out; returns
 * the mask of the exceptional ones (S outside 3..246; their multiplier is not used). */
INLINE __mmask16 mults16(const uint8_t *sc, int n, float *out) {
    const __mmask16 live = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, sc));
    _mm512_store_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(s, 23)));
    return _mm512_mask_cmpgt_epu32_mask(live, _mm512_sub_epi32(s, _mm512_set1_epi32(3)), _mm512_set1_epi32(243));
}

/* One group's product into row accumulator a: its weights v0, v1 (unit scale) times m, against
 * the activations x0, x1 (fp32) or xb (BF16, XBF). */
#define GROUP(XBF, a, v0, v1, m, x0, x1, xb)                                                      \
    do {                                                                                          \
        const __m512 w0_ = _mm512_mul_ps(v0, m), w1_ = _mm512_mul_ps(v1, m);                      \
        if (XBF) {                                                                                \
            a = _mm512_dpbf16_ps(a, _mm512_cvtne2ps_pbh(w1_, w0_), as_bh(xb));                    \
        } else {                                                                                  \
            a = _mm512_fmadd_ps(w0_, x0, a);                                                      \
            a = _mm512_fmadd_ps(w1_, x1, a);                                                      \
        }                                                                                         \
    } while (0)

/* One fused tile: FRB rows (codes wr, grid rows sc) over groups [g0, g1) of one K chunk, two
 * groups a step; out[r] = the chunk's sum of row r. XBF: BF16 activations (x is uint16_t) with
 * vdpbf16ps, else fp32 activations with two FMAs per group. Returns the mask of rows that met an
 * exceptional scale. */
#define FUSED_T1(NAME, XT, XBF)                                                                   \
    INLINE unsigned NAME(const uint8_t *const *wr, const uint8_t *const *sc, const XT *x, int64_t g0, \
                         int64_t g1, float *out, const lut *L) {                                  \
        __m512 a[FRB];                                                                            \
        _Alignas(64) float m[FRB][16];                                                            \
        unsigned bad = 0;                                                                         \
        UNROLL for (int r = 0; r < FRB; r++) a[r] = _mm512_setzero_ps();                          \
        for (int64_t g = g0; g < g1; g += 16) {                                                   \
            const int n = g1 - g < 16 ? (int)(g1 - g) : 16;                                       \
            UNROLL for (int r = 0; r < FRB; r++) bad |= (mults16(sc[r] + g, n, m[r]) != 0) << r;  \
            for (int b = 0; b < n; b += 2) {                                                      \
                const int two = b + 1 < n;                                                        \
                const XT *xg = x + (g + b) * 32;                                                  \
                __m512 x0, x1, x2, x3;                                                            \
                __m512i xb0, xb1;                                                                 \
                if (XBF) {                                                                        \
                    xb0 = _mm512_loadu_si512((const void *)xg);                                   \
                    xb1 = two ? _mm512_loadu_si512((const void *)(xg + 32)) : xb0;                \
                    x0 = x1 = x2 = x3 = _mm512_setzero_ps();                                      \
                } else {                                                                          \
                    x0 = _mm512_loadu_ps((const void *)xg), x1 = _mm512_loadu_ps((const void *)(xg + 16)); \
                    x2 = two ? _mm512_loadu_ps((const void *)(xg + 32)) : x0;                     \
                    x3 = two ? _mm512_loadu_ps((const void *)(xg + 48)) : x1;                     \
                    xb0 = xb1 = _mm512_setzero_si512();                                           \
                }                                                                                 \
                UNROLL for (int r = 0; r < FRB; r++) {                                            \
                    const uint8_t *p = wr[r] + (g + b) * 32;                                      \
                    _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);                       \
                    __m512 v[4];                                                                  \
                    dec64(codes(p, two), L, v);                                                   \
                    GROUP(XBF, a[r], v[0], v[1], _mm512_set1_ps(m[r][b]), x0, x1, xb0);           \
                    if (two) GROUP(XBF, a[r], v[2], v[3], _mm512_set1_ps(m[r][b + 1]), x2, x3, xb1); \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        red4(a, out);                                                                             \
        return bad;                                                                               \
    }
FUSED_T1(t1_f32, float, 0)
FUSED_T1(t1_xb, uint16_t, 1)

/* ---- the scratch path's decoder ---- */

static void row_bf16(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *o) {
    /* the high words of two fp32 vectors: BF16 by truncation, exact (the values are BF16 values,
     * subnormal ones included, which vcvtne2ps2bf16 would flush) */
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    _Alignas(64) float m[16];
    lut L;
    lut_load(&L);
    for (int64_t g = 0; g < ng; g += 16) {
        const int nb = ng - g < 16 ? (int)(ng - g) : 16;
        const __mmask16 exc = mults16(sc + g, nb, m);
        for (int b = 0; b < nb; b += 2) {
            const int two = b + 1 < nb;
            __m512 v[4];
            dec64(codes(q + (g + b) * 32, two), &L, v);
            for (int h = 0; h < 1 + two; h++) {
                uint16_t *dst = o + (g + b + h) * 32;
                if (exc >> (b + h) & 1) {
                    fp8_block_bf16_ref(q + (g + b + h) * 32, sc[g + b + h], dst);
                    continue;
                }
                const __m512 ms = _mm512_set1_ps(m[b + h]);
                _mm512_storeu_si512((void *)dst, _mm512_permutex2var_epi16(_mm512_castps_si512(_mm512_mul_ps(v[2 * h], ms)), odd,
                                                                           _mm512_castps_si512(_mm512_mul_ps(v[2 * h + 1], ms))));
            }
        }
    }
}

/* ---- drivers ---- */

/* T = 1 over rows [r0, r1): tiles of FRB rows from far-apart streams, K chunks of kc elements
 * summed into y in order (T1_LOOP of matmul_avx512.c); a row that met an exceptional block is
 * computed again by the scratch path (mm or xmm: the BF16 kernel). */
#define T1_ROWS(NAME, TILE, XT, XBF)                                                              \
    static void NAME(const dsf_wmat *w, const XT *x, float *y, int64_t r0, int64_t r1, int kc,    \
                     matmul_fn mm, matmul_xbf16_fn xmm) {                                         \
        const int64_t ng = w->n_in / 32, kcg = kc / 32;                                           \
        const uint8_t *wr[FRB], *sc[FRB];                                                         \
        int64_t rr[FRB], len = t1_stream_len(r0, r1, FRB, 1);                                     \
        lut L;                                                                                    \
        lut_load(&L);                                                                             \
        for (int64_t k = 0; k < len; k++) {                                                       \
            t1_tile_rows(w, r0, r1, len, k, FRB, 1, rr, wr);                                      \
            for (int i = 0; i < FRB; i++)                                                         \
                sc[i] = w->scales + (uint64_t)((rr[i] >= 0 ? rr[i] : r1 - 1) / 32) * (uint64_t)ng; \
            unsigned bad = 0;                                                                     \
            for (int64_t g0 = 0; g0 < ng; g0 += kcg) {                                            \
                float o[FRB];                                                                     \
                bad |= TILE(wr, sc, x, g0, g0 + kcg < ng ? g0 + kcg : ng, o, &L);                 \
                for (int i = 0; i < FRB; i++)                                                     \
                    if (rr[i] >= 0) y[rr[i]] = g0 == 0 ? o[i] : y[rr[i]] + o[i];                  \
            }                                                                                     \
            for (int i = 0; bad && i < FRB; i++)                                                  \
                if ((bad >> i & 1) && rr[i] >= 0)                                                 \
                    fp8b32_via_bf16(w, XBF ? NULL : (const float *)(const void *)x,               \
                                    XBF ? (const uint16_t *)(const void *)x : NULL, 1, y, 1, rr[i], rr[i] + 1, mm, \
                                    xmm, row_bf16);                                              \
        }                                                                                         \
    }
T1_ROWS(t1_f32_rows, t1_f32, float, 0)
T1_ROWS(t1_xb_rows, t1_xb, uint16_t, 1)

void fp8b32_mm_avx512(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      matmul_fn bf16, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0) matmul_any_ref(w, x, T, y, ldy, r0, r1); /* as mm_bf16_any */
    else if (T == 1) t1_f32_rows(w, x, y, r0, r1, kc, bf16, NULL);
    else fp8b32_via_bf16(w, x, NULL, T, y, ldy, r0, r1, bf16, NULL, row_bf16);
}

void fp8b32_xbf16_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                         int64_t r1, matmul_xbf16_fn bf16, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0 || w->n_in > 16384) matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1); /* as xmm_bf16 */
    else if (T == 1) t1_xb_rows(w, x, y, r0, r1, kc, NULL, bf16);
    else fp8b32_via_bf16(w, NULL, x, T, y, ldy, r0, r1, NULL, bf16, row_bf16);
}

void fp8b32_xbf16_via_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                             int64_t r1, matmul_xbf16_fn bf16) {
    fp8b32_via_bf16(w, NULL, x, T, y, ldy, r0, r1, NULL, bf16, row_bf16);
}
#endif
