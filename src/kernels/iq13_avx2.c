/* iq13_avx2.c: AVX2/FMA/F16C matmul kernels of the grid types IQ3_XXS, IQ3_S, IQ1_S and IQ1_M,
 * both families, decode (T = 1) and prefill (T > 1). Compiled with the Makefile's AVX2_FLAGS
 * only; its entries (iq13.h) sit in the kernels_avx2 table (matmul_avx2.c).
 *
 * Owns: the 8-lane decoders of these types into exact fp32 weights and the tiles over them.
 * Must not: allocate (panels and widened activations are on the stack), or call select.c;
 * rows whose n_in is not a multiple of 256 go to the scalar twins.
 *
 * Method (iq13_avx512.c explains the codes): each 8-weight sub-group becomes 8 indices into an
 * 8-entry table of values x the sub-block's scale (exact), picked by vpermps: IQ3 magnitude
 * classes (grid byte >> 3 or >> 1) with the sign XORed in from the sign byte, IQ1 grid value
 * + 1 with the delta's sign in bit 2. The weights are exactly dequant.c's; they are FMA'd with
 * the fp32 activations in lanes of 8. BF16 activations are widened exactly to fp32 and take
 * the fp32 kernels (AVX2 has no BF16 dot), as matmul_avx2.c does for the other types.
 *
 * Batch invariance: T = 1 takes 4 rows from far-apart streams, T > 1 tiles of 2 adjacent rows
 * x 4 tokens over a panel of the rows' decoded K chunk; per output the same FMAs in the same
 * order over the same K chunks (IQ2_KB blocks) and the same horizontal sum (lane_sum). */
#include "kernels/iq13.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "kernels/dtype.h"
#include "kernels/grids.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define IQ2_KB 4    /* K chunk in 256-weight blocks, every T */
#define IQ2_TC 32   /* T > 1: tokens per chunk */

INLINE float f16s(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }


/* The sign byte m as 8 lanes of sign bits (bit j -> lane j's bit 31). */
INLINE __m256 sign_bits(uint32_t m) {
    __m256i v = _mm256_sllv_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24));
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0x80000000u)));
}

/* IQ3: the 8 values of grid entries e0 (values 0-3) and e1 (4-7): magnitude class = byte >>
 * sh through tbl (the 8 magnitudes x scale), sign from m. */
INLINE __m256 iq3_sub(uint32_t e0, uint32_t e1, int sh, __m256 tbl, uint32_t m) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)((uint64_t)e0 | (uint64_t)e1 << 32)));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(tbl, _mm256_srli_epi32(v, sh)), sign_bits(m));
}

/* IQ1: the 8 values of grid entry e (2-bit fields, value + 1) with delta sign ds (0/1). */
INLINE __m256 iq1_sub(uint16_t e, int ds, __m256 tbl) {
    __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(e), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    c = _mm256_or_si256(_mm256_and_si256(c, _mm256_set1_epi32(3)), _mm256_set1_epi32(4 * ds));
    return _mm256_permutevar8x32_ps(tbl, c);
}

/* IQ1 values by code (grid value c - 1 plus the delta: +1/8 for codes 0-3, -1/8 for 4-7). */
INLINE __m256 iq1_values(void) { return _mm256_setr_ps(-0.875f, 0.125f, 1.125f, 0, -1.125f, -0.125f, 0.875f, 0); }

/* Group g (32 weights, 4 sub-groups of 8) of block b as exact fp32 weights (dequant.c's). */
INLINE void dec_group(const uint8_t *b, int g, __m256 *w, const int ty) {
    if (ty == GGML_TYPE_IQ3_XXS) {
        const uint32_t W = iq13_rd32(b + 66 + 4 * g);
        const __m256 tbl = _mm256_mul_ps(_mm256_setr_ps(4, 12, 20, 28, 36, 44, 52, 62),
                                         _mm256_set1_ps(f16s(iq13_rd16(b)) * (0.5f + (float)(W >> 28)) * 0.5f));
        const uint8_t *q = b + 2 + 8 * g;
        UNROLL for (int k = 0; k < 4; k++)
            w[k] = iq3_sub(grid_iq3xxs[q[2 * k]], grid_iq3xxs[q[2 * k + 1]], 3, tbl, grid_iq2_signs[(W >> (7 * k)) & 127]);
    } else if (ty == GGML_TYPE_IQ3_S) {
        const int s = (b[106 + g / 2] >> (4 * (g % 2))) & 0xF, qh = b[66 + g];
        const __m256 tbl = _mm256_mul_ps(_mm256_setr_ps(1, 3, 5, 7, 9, 11, 13, 15), _mm256_set1_ps(f16s(iq13_rd16(b)) * (float)(1 + 2 * s)));
        const uint8_t *q = b + 2 + 8 * g;
        UNROLL for (int k = 0; k < 4; k++)
            w[k] = iq3_sub(grid_iq3s[q[2 * k] | ((qh >> (2 * k)) & 1) << 8], grid_iq3s[q[2 * k + 1] | ((qh >> (2 * k + 1)) & 1) << 8],
                           1, tbl, b[74 + 4 * g + k]);
    } else if (ty == GGML_TYPE_IQ1_S) {
        const uint16_t W = iq13_rd16(b + 34 + 2 * g);
        const __m256 tbl = _mm256_mul_ps(iq1_values(), _mm256_set1_ps(f16s(iq13_rd16(b)) * (float)(2 * ((W >> 12) & 7) + 1)));
        UNROLL for (int k = 0; k < 4; k++) w[k] = iq1_sub(grid_iq1s[b[2 + 4 * g + k] | ((W >> (3 * k)) & 7) << 8], W >> 15, tbl);
    } else {
        uint16_t sw[4];
        for (int i = 0; i < 4; i++) sw[i] = iq13_rd16(b + 48 + 2 * i);
        const float d = f16s((uint16_t)((sw[0] >> 12) | ((sw[1] >> 12) << 4) | ((sw[2] >> 12) << 8) | ((sw[3] >> 12) << 12)));
        const int s = sw[g / 2] >> (6 * (g % 2));
        const __m256 tl = _mm256_mul_ps(iq1_values(), _mm256_set1_ps(d * (float)(2 * (s & 7) + 1)));
        const __m256 th = _mm256_mul_ps(iq1_values(), _mm256_set1_ps(d * (float)(2 * ((s >> 3) & 7) + 1)));
        UNROLL for (int k = 0; k < 4; k++) {
            const int nib = (b[32 + 2 * g + k / 2] >> (4 * (k % 2))) & 0xF;
            w[k] = iq1_sub(grid_iq1s[b[4 * g + k] | (nib & 7) << 8], nib >> 3, k < 2 ? tl : th);
        }
    }
}

/* The sum of the 8 lanes (one tree for every tile of this file). */
INLINE float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* T = 1: 4 rows over blocks [b0, b1), one accumulator per row, the sub-groups in order. */
INLINE void iq_t1(const uint8_t *const *wr, const float *x, int64_t b0, int64_t b1, float *out, const int ty) {
    const int bb = iq13_block_bytes(ty);
    __m256 a[4];
    UNROLL for (int r = 0; r < 4; r++) a[r] = _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; b++)
        UNROLL for (int r = 0; r < 4; r++) {
            _mm_prefetch((const char *)(wr[r] + b * bb + 1024), _MM_HINT_T0);
            for (int g = 0; g < 8; g++) {
                __m256 w[4];
                dec_group(wr[r] + b * bb, g, w, ty);
                UNROLL for (int k = 0; k < 4; k++) a[r] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + b * 256 + 32 * g + 8 * k), a[r]);
            }
        }
    UNROLL for (int r = 0; r < 4; r++) out[r] = lane_sum(a[r]);
}

/* T > 1: 2 panel rows (fp32 weights) x 4 tokens over n weights. */
INLINE void iq_tile(const float *const *pw, const float *const *x, int64_t n, float *out) {
    __m256 a[2][4];
    UNROLL for (int r = 0; r < 2; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 xv[4];
        UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm256_loadu_ps(x[t] + i);
        UNROLL for (int r = 0; r < 2; r++) {
            __m256 wv = _mm256_load_ps(pw[r] + i);
            UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm256_fmadd_ps(wv, xv[t], a[r][t]);
        }
    }
    UNROLL for (int r = 0; r < 2; r++)
        UNROLL for (int t = 0; t < 4; t++) out[r * 4 + t] = lane_sum(a[r][t]);
}

/* dst[i] = the fp32 value of BF16 src[i] (exact), n a multiple of 8. */
INLINE void widen(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
}

/* The driver of both families (bf: BF16 activations, widened exactly: T = 1 the whole token,
 * T > 1 each token chunk's K chunk, so that every panel serves IQ2_TC tokens). T = 1: tiles of
 * 4 rows from far-apart streams; T > 1: per token chunk and K chunk, 2 adjacent rows decoded
 * into a panel, the 2 x 4 tile over it for every 4 tokens. Both sum in K chunks of IQ2_KB
 * blocks, results added in chunk order. */
INLINE void iq_mm(const dsf_wmat *w, const void *xv, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                  const int ty, const int bf) {
    if (iq13_twin(w, xv, T, y, ldy, r0, r1, bf)) return;
    const int64_t nbk = w->n_in / 256;
    const int bb = iq13_block_bytes(ty);
    const float *x = xv;
    if (T == 1 && (!bf || w->n_in <= 16384)) { /* (wider BF16 rows: the T > 1 path, the same operations) */
        float buf[16384];
        if (bf) {
            widen(xv, buf, w->n_in);
            x = buf;
        }
        /* 4 streams of len rows each; rows past r1 repeat row r1 - 1, results dropped */
        const int64_t len = (r1 - r0 + 3) / 4;
        for (int64_t k = 0; k < len; k++) {
            const uint8_t *wr[4];
            int64_t rr[4];
            for (int s = 0; s < 4; s++) {
                const int64_t r = r0 + s * len + k;
                rr[s] = r < r1 ? r : -1;
                wr[s] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
            }
            for (int64_t b0 = 0; b0 < nbk; b0 += IQ2_KB) {
                float o[4];
                iq_t1(wr, x, b0, b0 + IQ2_KB < nbk ? b0 + IQ2_KB : nbk, o, ty);
                for (int i = 0; i < 4; i++)
                    if (rr[i] >= 0) y[rr[i]] = b0 == 0 ? o[i] : y[rr[i]] + o[i];
            }
        }
        return;
    }
    _Alignas(32) float panel[2][IQ2_KB * 256];
    float xw[IQ2_TC * IQ2_KB * 256]; /* bf: a chunk's widened activations (128 KiB) */
    const float *pw[2] = {panel[0], panel[1]};
    for (int64_t tc = 0; tc < T; tc += IQ2_TC) {
        const int64_t tc1 = tc + IQ2_TC < T ? tc + IQ2_TC : T;
        for (int64_t b0 = 0; b0 < nbk; b0 += IQ2_KB) {
            const int64_t nb = b0 + IQ2_KB < nbk ? IQ2_KB : nbk - b0;
            const float *xc = x + tc * w->n_in + b0 * 256;
            int64_t ldx = w->n_in;
            if (bf) {
                for (int64_t t = tc; t < tc1; t++)
                    widen((const uint16_t *)xv + t * w->n_in + b0 * 256, xw + (t - tc) * nb * 256, nb * 256);
                xc = xw;
                ldx = nb * 256;
            }
            for (int64_t r = r0; r < r1; r += 2) {
                for (int i = 0; i < 2; i++) {
                    const uint8_t *row = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes;
                    for (int64_t b = 0; b < nb; b++)
                        for (int g = 0; g < 8; g++) {
                            __m256 wv[4];
                            dec_group(row + (b0 + b) * bb, g, wv, ty);
                            for (int k = 0; k < 4; k++) _mm256_store_ps(&panel[i][b * 256 + 32 * g + 8 * k], wv[k]);
                        }
                }
                for (int64_t t = tc; t < tc1; t += 4) {
                    const float *xt[4];
                    float out[8];
                    for (int j = 0; j < 4; j++) xt[j] = xc + ((t + j < tc1 ? t + j : tc1 - 1) - tc) * ldx;
                    iq_tile(pw, xt, nb * 256, out);
                    for (int i = 0; i < 2 && r + i < r1; i++)
                        for (int j = 0; j < 4 && t + j < tc1; j++) {
                            float *yy = &y[(t + j) * ldy + r + i];
                            *yy = b0 == 0 ? out[i * 4 + j] : *yy + out[i * 4 + j];
                        }
                }
            }
        }
    }
}

IQ13_DEFINE(avx2, iq_mm)

#endif
