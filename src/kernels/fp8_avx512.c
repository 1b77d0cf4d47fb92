/* fp8_avx512.c: the AVX-512 products of DSF_TYPE_FP8B32 weights (fp8.h): the fused T = 1 kernels
 * of both families, the row decoder to BF16 for the scratch path, and the entries that
 * matmul_avx512.c and matmul_amx.c register (compiled with the Makefile's AVX512_FLAGS only).
 *
 * Decode: a table lookup. Two vpermi2b give the high and low bytes of the BF16 of 64 codes'
 * magnitudes at unit scale (exact: every e4m3 value is a normal BF16 value, NaN included), the
 * code's sign joins the high byte. The fp32 family places those bytes in the top halves of
 * dwords and multiplies by 2^(S-127) (exact for 3 <= S <= 246); the BF16 family interleaves them
 * into BF16 words and adds (S-127) << 7 to the exponent field of each nonzero, non-NaN value
 * (exact for 10 <= S <= 246). No fp16 conversion and no subnormal operand: on the Zen 5 host,
 * vcvtph2ps of fp16 subnormals and multiplications of fp32 subnormals (the e4m3 subnormal codes,
 * one code in 16 of random data) were several times slower (docs/perf-log.md). Per-group
 * multipliers (addends) of 16 groups are prepared at once and broadcast from memory.
 *
 * The fused T = 1 kernels repeat the BF16 T = 1 tiles of matmul_avx512.c operation for operation:
 * per row one accumulator, per group of 32 the two fp32 FMAs (elements 0-15 then 16-31) or the one
 * vdpbf16ps, K chunks of the caller's kc with the chunk sums added into y in order, each chunk's
 * lanes summed by red4. A tile is 4 rows from 4 far-apart streams (tile512.h), which changes no
 * value. A row that meets an exceptional scale (fp8.h; for this decode also 3..9 in the BF16
 * family) is computed again through the scratch path, whose decoder takes such blocks element
 * by element. NaN codes need no care: the table's NaN stays NaN (the scale is not added to it). */
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
#define E4M3_SUB(m) ((m) == 0 ? 0 : (m) == 1 ? 0x3B00 : (m) < 4 ? 0x3B80 | ((m) & 1) << 6 : 0x3C00 | ((m) & 3) << 5)
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
    __m512i h0, h1, l0, l1, ix[4], iw[2];
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
    for (int h = 0; h < 2; h++) { /* word i of group h: (low, high) bytes of code 32 h + i */
        _Alignas(64) uint8_t iw[64];
        for (int i = 0; i < 32; i++) {
            iw[2 * i] = (uint8_t)(32 * h + i);
            iw[2 * i + 1] = (uint8_t)(64 + 32 * h + i);
        }
        L->iw[h] = _mm512_load_si512((const void *)iw);
    }
}

/* The BF16 weights of 64 codes q (two groups, w[0] and w[1], element order), scaled by adding
 * sa[h] = (S_h - 127) << 7 to the exponent field of each nonzero, non-NaN value (10 <= S <= 246
 * keeps the field in 1..254: exact); zeros and NaN keep their bits. */
INLINE void dec64_bf16(__m512i q, const lut *L, const int32_t *sa, __m512i *w) {
    const __m512i hr = _mm512_permutex2var_epi8(L->h0, q, L->h1), lo = _mm512_permutex2var_epi8(L->l0, q, L->l1);
    /* the high bytes of the nonzero, non-NaN magnitudes are 0x3B .. 0x43 */
    const __mmask64 live = _mm512_cmplt_epu8_mask(_mm512_sub_epi8(hr, _mm512_set1_epi8(0x3B)), _mm512_set1_epi8(9));
    const __m512i hi = _mm512_ternarylogic_epi32(hr, q, _mm512_set1_epi8((char)0x80), 0xF8);
    const __m512i w0 = _mm512_permutex2var_epi8(lo, L->iw[0], hi), w1 = _mm512_permutex2var_epi8(lo, L->iw[1], hi);
    w[0] = _mm512_mask_add_epi16(w0, (__mmask32)live, w0, _mm512_set1_epi32(sa[0]));
    w[1] = _mm512_mask_add_epi16(w1, (__mmask32)(live >> 32), w1, _mm512_set1_epi32(sa[1]));
}

/* The exponent addends (S - 127) << 7 (in both halves of a dword) of n <= 16 groups' scales sc
 * into out; returns the mask of the exceptional ones for this decode (S outside 10..246). */
INLINE __mmask16 adds16(const uint8_t *sc, int n, int32_t *out) {
    const __mmask16 live = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, sc));
    const __m512i a = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(s, _mm512_set1_epi32(127)), 7), _mm512_set1_epi32(0xFFFF));
    _mm512_store_si512((void *)out, _mm512_or_si512(a, _mm512_slli_epi32(a, 16)));
    return _mm512_mask_cmpgt_epu32_mask(live, _mm512_sub_epi32(s, _mm512_set1_epi32(10)), _mm512_set1_epi32(236));
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

/* One fused fp32 tile: FRB rows (codes wr, grid rows sc) over groups [g0, g1) of one K chunk, two
 * groups a step; out[r] = the chunk's sum of row r. Per group and row: the weights (dec64, times
 * 2^(S-127), exact) and two FMAs, elements 0-15 then 16-31, as the BF16 tile. Returns the mask
 * of rows that met an exceptional scale. */
INLINE unsigned t1_f32(const uint8_t *const *wr, const uint8_t *const *sc, const float *x, int64_t g0, int64_t g1,
                       float *out, const lut *L) {
    __m512 a[FRB];
    _Alignas(64) float m[FRB][16];
    unsigned bad = 0;
    UNROLL for (int r = 0; r < FRB; r++) a[r] = _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g += 16) {
        const int n = g1 - g < 16 ? (int)(g1 - g) : 16;
        UNROLL for (int r = 0; r < FRB; r++) bad |= (mults16(sc[r] + g, n, m[r]) != 0) << r;
        for (int b = 0; b < n; b += 2) {
            const int two = b + 1 < n;
            const float *xg = x + (g + b) * 32;
            __m512 xv[4];
            UNROLL for (int k = 0; k < 4; k++) xv[k] = k < 2 || two ? _mm512_loadu_ps(xg + 16 * k) : xv[k - 2];
            UNROLL for (int r = 0; r < FRB; r++) {
                const uint8_t *p = wr[r] + (g + b) * 32;
                _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
                __m512 v[4];
                dec64(codes(p, two), L, v);
                for (int h = 0; h < 1 + two; h++) {
                    const __m512 ms = _mm512_set1_ps(m[r][b + h]);
                    a[r] = _mm512_fmadd_ps(_mm512_mul_ps(v[2 * h], ms), xv[2 * h], a[r]);
                    a[r] = _mm512_fmadd_ps(_mm512_mul_ps(v[2 * h + 1], ms), xv[2 * h + 1], a[r]);
                }
            }
        }
    }
    red4(a, out);
    return bad;
}

/* The BF16-activation tile: the weights decoded straight to BF16 (dec64_bf16), one vdpbf16ps
 * per group and row. */
INLINE unsigned t1_xb(const uint8_t *const *wr, const uint8_t *const *sc, const uint16_t *x, int64_t g0, int64_t g1,
                      float *out, const lut *L) {
    __m512 a[FRB];
    _Alignas(64) int32_t sa[FRB][16];
    unsigned bad = 0;
    UNROLL for (int r = 0; r < FRB; r++) a[r] = _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g += 16) {
        const int n = g1 - g < 16 ? (int)(g1 - g) : 16;
        UNROLL for (int r = 0; r < FRB; r++) bad |= (adds16(sc[r] + g, n, sa[r]) != 0) << r;
        for (int b = 0; b < n; b += 2) {
            const int two = b + 1 < n;
            const uint16_t *xg = x + (g + b) * 32;
            const __m512i x0 = _mm512_loadu_si512((const void *)xg);
            const __m512i x1 = two ? _mm512_loadu_si512((const void *)(xg + 32)) : x0;
            UNROLL for (int r = 0; r < FRB; r++) {
                const uint8_t *p = wr[r] + (g + b) * 32;
                _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
                __m512i w[2];
                dec64_bf16(codes(p, two), L, &sa[r][b], w);
                a[r] = _mm512_dpbf16_ps(a[r], as_bh(w[0]), as_bh(x0));
                if (two) a[r] = _mm512_dpbf16_ps(a[r], as_bh(w[1]), as_bh(x1));
            }
        }
    }
    red4(a, out);
    return bad;
}

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
