/* fp8_avx2.c: the AVX2 products of DSF_TYPE_FP8B32 weights (fp8.h): the fused T = 1 kernel, the
 * row decoder to BF16 for the scratch path and the entries matmul_avx2.c registers (compiled with
 * the Makefile's AVX2_FLAGS only).
 *
 * Decode as fp8_avx512.c, 8 lanes at a time: codes sign-extended to words, shifted left by 7,
 * bit 14 cleared (fp16 of value x 2^-8), vcvtph2ps, times 2^(S-119).
 *
 * The fused T = 1 kernel repeats matmul_avx2.c's BF16 T = 1 tile operation for operation: per
 * row one 8-lane accumulator, per group of 32 four FMAs (elements 0-7, 8-15, 16-23, 24-31), K
 * chunks of the caller's kc with the chunk sums added into y in order, each chunk summed by the
 * same hsum. The avx2 table's BF16-activation kernel widens the activations and runs those same
 * operations, so the BF16-activation entry widens too and shares the kernel. Rows are taken one
 * from each of 4 far-apart streams (the row range cut in 4), which changes no value. Exceptional
 * blocks (fp8.h) send the tile's row through the scratch path. */
#include "kernels/fp8.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kernels/red256.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define FRB 4      /* rows per fused tile */
#define PF 1024    /* prefetch distance along each row, bytes */

/* The fp16 bits of 16 e4m3 codes q (value x 2^-8). */
INLINE __m256i f16_of(__m128i q) {
    return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(q), 7), _mm256_set1_epi16((short)0xBFFF));
}

/* The 32 weights of a group (codes q) times m = 2^(S-119): w[k] = elements 8k .. 8k+7; h[0..1]:
 * the fp16 bits of elements 0-15 and 16-31. */
INLINE void dec_w(__m256i q, __m256 m, __m256 *w, __m256i *h) {
    h[0] = f16_of(_mm256_castsi256_si128(q));
    h[1] = f16_of(_mm256_extracti128_si256(q, 1));
    UNROLL for (int k = 0; k < 2; k++) {
        w[2 * k] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h[k])), m);
        w[2 * k + 1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h[k], 1)), m);
    }
}

/* The multipliers 2^(S-119) of n <= 8 groups' scales sc into out; returns the mask of the
 * exceptional ones (S outside 3..246). */
INLINE int mults8(const uint8_t *sc, int n, float *out) {
    uint8_t b[8] = {127, 127, 127, 127, 127, 127, 127, 127}; /* no read past the grid */
    memcpy(b, sc, (size_t)n);
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)b));
    _mm256_storeu_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(s, _mm256_set1_epi32(8)), 23)));
    const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(3), s), _mm256_cmpgt_epi32(s, _mm256_set1_epi32(246)));
    return _mm256_movemask_ps(_mm256_castsi256_ps(bad));
}

/* One fused tile: FRB rows over the groups [g0, g1) of one K chunk; out[r] = row r's chunk sum.
 * Returns the mask of rows that met an exceptional block (a scale, or a NaN code seen by the
 * byte maxima: 0x7F the largest signed byte, 0xFF the largest unsigned one). */
INLINE unsigned t1_tile(const uint8_t *const *wr, const uint8_t *const *sc, const float *x, int64_t g0, int64_t g1,
                        float *out) {
    __m256 a[FRB];
    __m256i mx[FRB], mu[FRB];
    float m[FRB][8];
    unsigned bad = 0;
    UNROLL for (int r = 0; r < FRB; r++) {
        a[r] = _mm256_setzero_ps();
        mx[r] = mu[r] = _mm256_setzero_si256();
    }
    for (int64_t g = g0; g < g1; g += 8) {
        const int n = g1 - g < 8 ? (int)(g1 - g) : 8;
        UNROLL for (int r = 0; r < FRB; r++) bad |= (mults8(sc[r] + g, n, m[r]) != 0) << r;
        for (int b = 0; b < n; b++) {
            const float *xg = x + (g + b) * 32;
            UNROLL for (int r = 0; r < FRB; r++) {
                const uint8_t *p = wr[r] + (g + b) * 32;
                _mm_prefetch((const char *)(p + PF), _MM_HINT_T0);
                const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)p);
                mx[r] = _mm256_max_epi8(mx[r], q);
                mu[r] = _mm256_max_epu8(mu[r], q);
                __m256 w[4];
                __m256i h[2];
                dec_w(q, _mm256_broadcast_ss(&m[r][b]), w, h);
                UNROLL for (int k = 0; k < 4; k++) a[r] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xg + 8 * k), a[r]);
            }
        }
    }
    UNROLL for (int r = 0; r < FRB; r++) {
        out[r] = red256(a[r]); /* matmul_avx2.c's tile sum */
        const __m256i nan = _mm256_or_si256(_mm256_cmpeq_epi8(mx[r], _mm256_set1_epi8(0x7F)),
                                            _mm256_cmpeq_epi8(mu[r], _mm256_set1_epi8((char)0xFF)));
        bad |= (unsigned)(_mm256_movemask_epi8(nan) != 0) << r;
    }
    return bad;
}

/* ---- the scratch path's decoder ---- */

static void row_bf16(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *o) {
    float m[8];
    for (int64_t g = 0; g < ng; g += 8) {
        const int nb = ng - g < 8 ? (int)(ng - g) : 8;
        const int exc = mults8(sc + g, nb, m);
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = q + (g + b) * 32;
            if (exc >> b & 1) {
                fp8_block_bf16_ref(p, sc[g + b], o + (g + b) * 32);
                continue;
            }
            __m256 wv[4];
            __m256i h[2];
            dec_w(_mm256_loadu_si256((const __m256i *)(const void *)p), _mm256_broadcast_ss(&m[b]), wv, h);
            UNROLL for (int k = 0; k < 2; k++) {
                /* BF16 by truncation (exact: the values are BF16 values); packus works per
                 * 128-bit lane, the permute restores the element order */
                __m256i v = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(wv[2 * k]), 16),
                                                _mm256_srli_epi32(_mm256_castps_si256(wv[2 * k + 1]), 16));
                v = _mm256_permute4x64_epi64(v, 0xD8);
                /* a NaN code (fp16 magnitude 0x3F80 here) is f32_to_bf16's quiet NaN */
                const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h[k], _mm256_set1_epi16(0x7FFF)),
                                                       _mm256_set1_epi16(0x3F80));
                v = _mm256_blendv_epi8(v, _mm256_set1_epi16(0x7FC0), nan);
                _mm256_storeu_si256((__m256i *)(void *)(o + (g + b) * 32 + 16 * k), v);
            }
        }
    }
}

/* ---- drivers ---- */

/* T = 1 over rows [r0, r1): tile k takes row k of each of FRB contiguous streams; K chunks of
 * kc elements summed into y in order; a row that met an exceptional block is computed again by
 * the scratch path with the fp32-family BF16 kernel mm. */
static void t1_rows(const dsf_wmat *w, const float *x, float *y, int64_t r0, int64_t r1, int kc, matmul_fn mm) {
    const int64_t ng = w->n_in / 32, kcg = kc / 32, len = (r1 - r0 + FRB - 1) / FRB;
    const uint8_t *wr[FRB], *sc[FRB];
    int64_t rr[FRB];
    for (int64_t k = 0; k < len; k++) {
        for (int s = 0; s < FRB; s++) {
            const int64_t r = r0 + s * len + k, rv = r < r1 ? r : r1 - 1; /* past r1: repeat, drop */
            rr[s] = r < r1 ? r : -1;
            wr[s] = w->data + (uint64_t)rv * w->row_bytes;
            sc[s] = w->scales + (uint64_t)(rv / 32) * (uint64_t)ng;
        }
        unsigned bad = 0;
        for (int64_t g0 = 0; g0 < ng; g0 += kcg) {
            float o[FRB];
            bad |= t1_tile(wr, sc, x, g0, g0 + kcg < ng ? g0 + kcg : ng, o);
            for (int i = 0; i < FRB; i++)
                if (rr[i] >= 0) y[rr[i]] = g0 == 0 ? o[i] : y[rr[i]] + o[i];
        }
        for (int i = 0; bad && i < FRB; i++)
            if ((bad >> i & 1) && rr[i] >= 0) fp8b32_via_bf16(w, x, NULL, 1, y, 1, rr[i], rr[i] + 1, mm, NULL, row_bf16);
    }
}

void fp8b32_mm_avx2(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                    matmul_fn bf16, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0) matmul_any_ref(w, x, T, y, ldy, r0, r1); /* as mm_bf16_any */
    else if (T == 1) t1_rows(w, x, y, r0, r1, kc, bf16);
    else fp8b32_via_bf16(w, x, NULL, T, y, ldy, r0, r1, bf16, NULL, row_bf16);
}

void fp8b32_xbf16_avx2(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                       int64_t r1, matmul_xbf16_fn xmm, matmul_fn mm, int kc) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0 || w->n_in > 16384) { /* as the table's BF16 kernel */
        matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    if (T > 1) {
        fp8b32_via_bf16(w, NULL, x, T, y, ldy, r0, r1, NULL, xmm, row_bf16);
        return;
    }
    float xw[16384]; /* the token widened (exact), as the BF16 kernel does */
    for (int64_t i = 0; i < w->n_in; i++) {
        const uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&xw[i], &u, 4);
    }
    t1_rows(w, xw, y, r0, r1, kc, mm);
}
#endif
