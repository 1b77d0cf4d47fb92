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

/* The fp16 bits of 32 e4m3 codes q (value x 2^-8). */
INLINE __m512i f16_of(__m256i q) {
    return _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(q), 7), _mm512_set1_epi16((short)0xBFFF));
}

/* The 32 weights of a group (fp16 bits h, multiplier m = 2^(S-119)) as fp32, elements 0-15 and 16-31. */
INLINE void dec_w(__m512i h, __m512 m, __m512 *w0, __m512 *w1) {
    *w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), m);
    *w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), m);
}

/* The multipliers 2^(S-119) (fp32 bits (S + 8) << 23) of n <= 16 groups' scales sc into out;
 * returns the mask of the exceptional ones (S outside 3..246; their multiplier is not used). */
INLINE __mmask16 mults16(const uint8_t *sc, int n, float *out) {
    const __mmask16 live = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, sc));
    _mm512_store_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(s, _mm512_set1_epi32(8)), 23)));
    return _mm512_mask_cmpgt_epu32_mask(live, _mm512_sub_epi32(s, _mm512_set1_epi32(3)), _mm512_set1_epi32(243));
}

/* Whether the byte maxima of a row's codes saw a NaN code: 0x7F is the largest signed byte,
 * 0xFF the largest unsigned one. */
INLINE int saw_nan(__m256i mx, __m256i mu) {
    return !_mm256_testz_si256(_mm256_or_si256(_mm256_cmpeq_epi8(mx, _mm256_set1_epi8(0x7F)),
                                               _mm256_cmpeq_epi8(mu, _mm256_set1_epi8((char)0xFF))),
                               _mm256_set1_epi8((char)0xFF));
}

/* One fused tile: FRB rows (codes wr, grid rows sc) over groups [g0, g1) of one K chunk; out[r]
 * = the chunk's sum of row r. XBF: BF16 activations (x is uint16_t) with vdpbf16ps, else fp32
 * activations with two FMAs per group. Returns the mask of rows that met an exceptional block. */
#define FUSED_T1(NAME, XT, XBF)                                                                   \
    INLINE unsigned NAME(const uint8_t *const *wr, const uint8_t *const *sc, const XT *x, int64_t g0, \
                         int64_t g1, float *out) {                                                \
        __m512 a[FRB];                                                                            \
        __m256i mx[FRB], mu[FRB];                                                                 \
        _Alignas(64) float m[FRB][16];                                                            \
        unsigned bad = 0;                                                                         \
        UNROLL for (int r = 0; r < FRB; r++) {                                                    \
            a[r] = _mm512_setzero_ps();                                                           \
            mx[r] = mu[r] = _mm256_setzero_si256();                                               \
        }                                                                                         \
        for (int64_t g = g0; g < g1; g += 16) {                                                   \
            const int n = g1 - g < 16 ? (int)(g1 - g) : 16;                                       \
            UNROLL for (int r = 0; r < FRB; r++) bad |= (mults16(sc[r] + g, n, m[r]) != 0) << r;  \
            for (int b = 0; b < n; b++) {                                                         \
                const XT *xg = x + (g + b) * 32;                                                  \
                __m512 x0, x1;                                                                    \
                if (XBF) x0 = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)xg)), x1 = x0; \
                else x0 = _mm512_loadu_ps((const void *)xg), x1 = _mm512_loadu_ps((const void *)(xg + 16)); \
                UNROLL for (int r = 0; r < FRB; r++) {                                            \
                    const uint8_t *p = wr[r] + (g + b) * 32;                                      \
                    _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);                       \
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)p);       \
                    mx[r] = _mm256_max_epi8(mx[r], q);                                            \
                    mu[r] = _mm256_max_epu8(mu[r], q);                                            \
                    __m512 w0, w1;                                                                \
                    dec_w(f16_of(q), _mm512_set1_ps(m[r][b]), &w0, &w1);                          \
                    if (XBF) {                                                                    \
                        a[r] = _mm512_dpbf16_ps(a[r], _mm512_cvtne2ps_pbh(w1, w0),                \
                                                as_bh(_mm512_castps_si512(x0)));                  \
                    } else {                                                                      \
                        a[r] = _mm512_fmadd_ps(w0, x0, a[r]);                                     \
                        a[r] = _mm512_fmadd_ps(w1, x1, a[r]);                                     \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        red4(a, out);                                                                             \
        UNROLL for (int r = 0; r < FRB; r++) bad |= (unsigned)saw_nan(mx[r], mu[r]) << r;         \
        return bad;                                                                               \
    }
FUSED_T1(t1_f32, float, 0)
FUSED_T1(t1_xb, uint16_t, 1)

/* ---- the scratch path's decoder ---- */

static void row_bf16(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *o) {
    /* the high words of two fp32 vectors (BF16 by truncation: exact, the values are BF16 values) */
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    _Alignas(64) float m[16];
    for (int64_t g = 0; g < ng; g += 16) {
        const int nb = ng - g < 16 ? (int)(ng - g) : 16;
        const __mmask16 exc = mults16(sc + g, nb, m);
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = q + (g + b) * 32;
            if (exc >> b & 1) {
                fp8_block_bf16_ref(p, sc[g + b], o + (g + b) * 32);
                continue;
            }
            const __m512i h = f16_of(_mm256_loadu_si256((const __m256i *)(const void *)p));
            __m512 w0, w1;
            dec_w(h, _mm512_set1_ps(m[b]), &w0, &w1);
            __m512i v = _mm512_permutex2var_epi16(_mm512_castps_si512(w0), odd, _mm512_castps_si512(w1));
            /* a NaN code (fp16 magnitude 0x3F80 here) is f32_to_bf16's quiet NaN */
            const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7FFF)),
                                                          _mm512_set1_epi16(0x3F80));
            v = _mm512_mask_mov_epi16(v, nan, _mm512_set1_epi16(0x7FC0));
            _mm512_storeu_si512((void *)(o + (g + b) * 32), v);
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
        for (int64_t k = 0; k < len; k++) {                                                       \
            t1_tile_rows(w, r0, r1, len, k, FRB, 1, rr, wr);                                      \
            for (int i = 0; i < FRB; i++)                                                         \
                sc[i] = w->scales + (uint64_t)((rr[i] >= 0 ? rr[i] : r1 - 1) / 32) * (uint64_t)ng; \
            unsigned bad = 0;                                                                     \
            for (int64_t g0 = 0; g0 < ng; g0 += kcg) {                                            \
                float o[FRB];                                                                     \
                bad |= TILE(wr, sc, x, g0, g0 + kcg < ng ? g0 + kcg : ng, o);                     \
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
