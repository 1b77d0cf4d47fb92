/* fp8_avx512.c: the AVX-512 products of DSF_TYPE_FP8B32 weights (fp8.h): the fused T = 1 kernels
 * of both families, the row decoder to BF16 for the scratch path, and the entries that
 * matmul_avx512.c and matmul_amx.c register (compiled with the Makefile's AVX512_FLAGS only).
 *
 * Decode: a table lookup. Two vpermi2b give the high and low bytes of the BF16 of 64 codes'
 * magnitudes at unit scale (exact: every e4m3 value is a normal BF16 value, NaN included), the
 * code's sign joins the high byte. No fp16 conversion and no subnormal operand: on the Zen 5
 * host, vcvtph2ps of fp16 subnormals and multiplications of fp32 subnormals (the e4m3 subnormal
 * codes, one code in 16 of random data) were several times slower (docs/perf-log.md).
 *   - fp32 family: the bytes go to the top halves of dwords and are multiplied by 2^(S-127)
 *     (exact for 3 <= S <= 246; the multipliers of 16 groups are prepared at once).
 *   - BF16 family: the bytes are interleaved into BF16 words at unit scale and the block's scale
 *     is moved onto the activations, once per row block (xs_block, below): the decode then has no
 *     scale operation at all.
 *
 * The fused T = 1 kernels repeat the BF16 T = 1 tiles of matmul_avx512.c operation for operation:
 * per row one accumulator, per group of 32 the two fp32 FMAs (elements 0-15 then 16-31) or the one
 * vdpbf16ps, K chunks of the caller's kc with the chunk sums added into y in order, each chunk's
 * lanes summed by red4. A tile is 4 rows from 4 far-apart streams (tile512.h), which changes no
 * value. A row that meets an exceptional scale (fp8.h; for the BF16 family also 3..9, and a row
 * block whose scaled activations leave the range) is computed again through the scratch path,
 * whose decoder takes such blocks element by element. NaN codes need no care: the table's NaN
 * stays NaN. */
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

static void row_bf16(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *o);

/* ---- the BF16 family with the scales moved onto the activations ----
 * Within a row block the 32 rows share the grid row, so x(i) 2^(S_g-127) is computed once per row
 * block (xs_block) and the codes are decoded at unit scale (dec64_unit: two lookups, the sign, two
 * interleaves; no scale operation). The products are the same real numbers as the BF16 kernel's,
 * w 2^(S-127) x = w (x 2^(S-127)), and vdpbf16ps sees them exactly (both factors are normal BF16
 * values, a product of two is exact in fp32), so the sums are bit for bit the BF16 kernel's where
 * the moved factor is exact: every nonzero activation of the block is a normal BF16 whose scaled
 * exponent stays normal (a subnormal one counts as zero, as vdpbf16ps takes it) and every scale
 * is in 10..246 (the BF16 matrix's weight is then normal too). A row block that breaks this is
 * computed through the scratch path. */

/* xs[i] = x[i] 2^(S_g-127) for the ng groups of one row block (grid row sc), as BF16 bits (a
 * zero or subnormal x gives +0). Returns 0 when that is exact for every element and every scale
 * is fine for this decode, else 1 (xs is then not used). */
static int xs_block(const uint16_t *x, const uint8_t *sc, int64_t ng, uint16_t *xs) {
    const __m512i ef = _mm512_set1_epi16(0xFF), one = _mm512_set1_epi16(1), top = _mm512_set1_epi16(253);
    __mmask32 bad = 0;
    for (int64_t g = 0; g < ng; g++) {
        const int s = (int)sc[g] - 127;
        if (sc[g] < 10 || sc[g] > 246) return 1;
        const __m512i v = _mm512_loadu_si512((const void *)(x + g * 32));
        const __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), ef);
        const __mmask32 nz = _mm512_test_epi16_mask(e, e);
        /* the scaled exponent field e + s must stay in 1..254, and e = 255 (inf, NaN) never moves */
        const __m512i es = _mm512_add_epi16(e, _mm512_set1_epi16((short)s));
        bad |= _mm512_mask_cmpgt_epu16_mask(nz, _mm512_sub_epi16(es, one), top) |
               _mm512_mask_cmpeq_epi16_mask(nz, e, ef);
        _mm512_storeu_si512((void *)(xs + g * 32), _mm512_maskz_add_epi16(nz, v, _mm512_set1_epi16((short)(s * 128))));
    }
    return bad != 0;
}

/* The unit-scale BF16 weights of 64 codes q (two groups, element order): the table's bytes, the
 * code's sign joined to the high byte, interleaved into words. The 64 codes' qwords are first put in
 * the order (A0, B0, A1, B1, ...) of the two groups A and B, so that the in-lane byte interleaves give
 * each group's words in element order: one cross-lane permute instead of two. */
INLINE void dec64_unit(__m512i q, __m512i h0, __m512i h1, __m512i l0, __m512i l1, __m512i pair, __m512i sgn,
                       __m512i *w0, __m512i *w1) {
    q = _mm512_permutexvar_epi64(pair, q); /* 128-bit lane L: the first group's qword L, then the second's */
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(h0, q, h1), q, sgn, 0xF8);
    const __m512i lo = _mm512_permutex2var_epi8(l0, q, l1);
    *w0 = _mm512_unpacklo_epi8(lo, hi); /* in-lane interleaves: the first group's words, in order */
    *w1 = _mm512_unpackhi_epi8(lo, hi); /* the second group's */
}

/* One tile over groups [g0, g1) of one K chunk: FRB rows (codes wr), each with its row block's
 * scaled activations xs[r]; per group and row one vdpbf16ps, as xb_bf16_t1. */
INLINE void t1_xs(const uint8_t *const *wr, const uint16_t *const *xs, int64_t g0, int64_t g1, float *out) {
    const __m512i h0 = _mm512_load_si512((const void *)lut_hi), h1 = _mm512_load_si512((const void *)(lut_hi + 64));
    const __m512i l0 = _mm512_load_si512((const void *)lut_lo), l1 = _mm512_load_si512((const void *)(lut_lo + 64));
    const __m512i pair = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);
    const __m512i sgn = _mm512_set1_epi8((char)0x80);
    __m512 a[FRB];
    UNROLL for (int r = 0; r < FRB; r++) a[r] = _mm512_setzero_ps();
    int64_t g = g0;
    for (; g + 2 <= g1; g += 2) {
        UNROLL for (int r = 0; r < FRB; r++) {
            const uint8_t *p = wr[r] + g * 32;
            _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
            __m512i w0, w1, q = _mm512_loadu_si512((const void *)p);
            __asm__("" : "+v"(q)); /* one load of the codes: the decode's copies are register moves */
            dec64_unit(q, h0, h1, l0, l1, pair, sgn, &w0, &w1);
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(w0), as_bh(_mm512_loadu_si512((const void *)(xs[r] + g * 32))));
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(w1), as_bh(_mm512_loadu_si512((const void *)(xs[r] + g * 32 + 32))));
        }
    }
    if (g < g1) {
        UNROLL for (int r = 0; r < FRB; r++) {
            __m512i w0, w1;
            dec64_unit(codes(wr[r] + g * 32, 0), h0, h1, l0, l1, pair, sgn, &w0, &w1);
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(w0), as_bh(_mm512_loadu_si512((const void *)(xs[r] + g * 32))));
        }
    }
    red4(a, out);
}

/* T = 1, BF16 activations, rows [r0, r1): the streams and K chunks of T1_ROWS; each stream keeps
 * its current row block's scaled activations (rebuilt when the stream enters a new block); a row
 * of a block that xs_block refuses is computed through the scratch path. */
static void t1_xs_rows(const dsf_wmat *w, const uint16_t *x, float *y, int64_t r0, int64_t r1, int kc,
                       matmul_xbf16_fn xmm) {
    const int64_t ng = w->n_in / 32, kcg = kc / 32;
    _Alignas(64) uint16_t xsb[FRB][16384];
    const uint8_t *wr[FRB];
    const uint16_t *xs[FRB];
    int64_t rr[FRB], blk[FRB], len = t1_stream_len(r0, r1, FRB, 1);
    int refused[FRB];
    for (int i = 0; i < FRB; i++) blk[i] = -1, refused[i] = 0, xs[i] = xsb[i];
    for (int64_t k = 0; k < len; k++) {
        t1_tile_rows(w, r0, r1, len, k, FRB, 1, rr, wr);
        for (int i = 0; i < FRB; i++) {
            const int64_t b = (rr[i] >= 0 ? rr[i] : r1 - 1) / 32;
            if (b != blk[i]) blk[i] = b, refused[i] = xs_block(x, w->scales + (uint64_t)b * (uint64_t)ng, ng, xsb[i]);
        }
        for (int64_t g0 = 0; g0 < ng; g0 += kcg) {
            float o[FRB];
            t1_xs(wr, xs, g0, g0 + kcg < ng ? g0 + kcg : ng, o);
            for (int i = 0; i < FRB; i++)
                if (rr[i] >= 0) y[rr[i]] = g0 == 0 ? o[i] : y[rr[i]] + o[i];
        }
        for (int i = 0; i < FRB; i++)
            if (refused[i] && rr[i] >= 0) fp8b32_via_bf16(w, NULL, x, 1, y, 1, rr[i], rr[i] + 1, NULL, xmm, row_bf16);
    }
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

/* T = 1, fp32 activations, rows [r0, r1): tiles of FRB rows from far-apart streams, K chunks of
 * kc elements summed into y in order (T1_LOOP of matmul_avx512.c); a row that met an exceptional
 * block is computed again by the scratch path (mm: the BF16 kernel). */
static void t1_f32_rows(const dsf_wmat *w, const float *x, float *y, int64_t r0, int64_t r1, int kc, matmul_fn mm) {
    const int64_t ng = w->n_in / 32, kcg = kc / 32;
    const uint8_t *wr[FRB], *sc[FRB];
    int64_t rr[FRB], len = t1_stream_len(r0, r1, FRB, 1);
    lut L;
    lut_load(&L);
    for (int64_t k = 0; k < len; k++) {
        t1_tile_rows(w, r0, r1, len, k, FRB, 1, rr, wr);
        for (int i = 0; i < FRB; i++)
            sc[i] = w->scales + (uint64_t)((rr[i] >= 0 ? rr[i] : r1 - 1) / 32) * (uint64_t)ng;
        unsigned bad = 0;
        for (int64_t g0 = 0; g0 < ng; g0 += kcg) {
            float o[FRB];
            bad |= t1_f32(wr, sc, x, g0, g0 + kcg < ng ? g0 + kcg : ng, o, &L);
            for (int i = 0; i < FRB; i++)
                if (rr[i] >= 0) y[rr[i]] = g0 == 0 ? o[i] : y[rr[i]] + o[i];
        }
        for (int i = 0; bad && i < FRB; i++)
            if ((bad >> i & 1) && rr[i] >= 0) fp8b32_via_bf16(w, x, NULL, 1, y, 1, rr[i], rr[i] + 1, mm, NULL, row_bf16);
    }
}

void fp8b32_mm_avx512(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      matmul_fn bf16, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0) matmul_any_ref(w, x, T, y, ldy, r0, r1); /* as mm_bf16_any */
    else if (T == 1) t1_f32_rows(w, x, y, r0, r1, kc, bf16);
    else fp8b32_via_bf16(w, x, NULL, T, y, ldy, r0, r1, bf16, NULL, row_bf16);
}

void fp8b32_xbf16_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                         int64_t r1, matmul_xbf16_fn bf16, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0 || w->n_in > 16384) matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1); /* as xmm_bf16 */
    else if (T == 1) t1_xs_rows(w, x, y, r0, r1, kc, bf16);
    else fp8b32_via_bf16(w, NULL, x, T, y, ldy, r0, r1, NULL, bf16, row_bf16);
}

void fp8b32_xbf16_via_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                             int64_t r1, matmul_xbf16_fn bf16) {
    fp8b32_via_bf16(w, NULL, x, T, y, ldy, r0, r1, NULL, bf16, row_bf16);
}
#endif
