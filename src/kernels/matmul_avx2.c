/* matmul_avx2.c: AVX2/FMA/F16C matmul kernels (compiled with the Makefile's AVX2_FLAGS only;
 * select.c selects this table only on CPUs with AVX2, FMA and F16C).
 *
 * Same method and numerics as matmul_avx512.c, with 8-lane vectors: weights widened exactly
 * to fp32, fp32 FMA against the fp32 activations (never rounded), groups of 32 weights, row x
 * token tiles, K and token chunks, batch-invariant results (every output is computed by the
 * same operations whatever T and the tile). Only the register budget differs (16 ymm): the
 * T > 1 tile is 2 rows x 4 tokens. */
#include "kernels/matmul.h"
#include "kernels/kquant.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kernels/fp8.h"
#include "kernels/iq2k.h"
#include "kernels/red256.h"
#include "kernels/iq13.h"
#include "kernels/q8k_iq.h"

#define RB1 8    /* rows per tile, T == 1 (8 independent accumulator chains) */
#define RBN 2    /* rows per tile, T > 1 */
#define TB 4     /* tokens per tile */
#define TC 32    /* tokens per chunk */
#define KC 4096  /* reduction elements per chunk */

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* ---- decoders: one group of 32 weights -> four fp32 vectors of 8 ---- */

INLINE void dec_f32(const uint8_t *p, __m256 *w) {
    const float *f = (const float *)(const void *)p;
    UNROLL for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps(f + 8 * k);
}

INLINE void dec_bf16(const uint8_t *p, __m256 *w) {
    UNROLL for (int k = 0; k < 4; k++) {
        __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k)));
        w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)); /* exact */
    }
}

INLINE void dec_f16(const uint8_t *p, __m256 *w) {
    UNROLL for (int k = 0; k < 4; k++)
        w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k)));
}

INLINE void dec_q8_0(const uint8_t *p, __m256 *w) {
    uint16_t dh;
    memcpy(&dh, p, 2);
    __m256 d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dh))));
    UNROLL for (int k = 0; k < 4; k++) {
        __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 2 + 8 * k)));
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d); /* exact */
    }
}

/* gguf-layout §1.5: magnitude from the low 3 bits through an 8-entry table (vpermps reads
 * only the low 3 bits of each index), sign from bit 3; scale 2^(e-128), e = 0/1 subnormal.
 * The code shifted left by 28 puts its sign bit in bit 31 and its 3 magnitude bits k in bits
 * 28-30; entry k of the table is stored with k already XORed into bits 28-30, so one XOR with
 * the shifted code restores the entry and sets the sign (no mask per vector). */
INLINE void dec_mxfp4(const uint8_t *p, __m256 *w) {
    uint8_t e = p[0];
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    __m256 tbl = _mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12),
                               _mm256_castsi256_ps(_mm256_set1_epi32((int)bits)));
    tbl = _mm256_xor_ps(tbl, _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28,
                                                                    6 << 28, 7 << 28)));
    UNROLL for (int k = 0; k < 2; k++) {
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 1 + 8 * k)));
        __m256i lo = q, hi = _mm256_srli_epi32(q, 4);
        __m256 vlo = _mm256_permutevar8x32_ps(tbl, lo);
        __m256 vhi = _mm256_permutevar8x32_ps(tbl, hi);
        /* low nibble: q << 28 keeps bits 0-3 only; high nibble: hi = q >> 4 is 0..15 */
        w[k] = _mm256_xor_ps(vlo, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 28)));     /* elements 8k .. 8k+7 */
        w[k + 2] = _mm256_xor_ps(vhi, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 28))); /* elements 16+8k .. */
    }
}


/* dst[i] = the fp32 value of BF16 src[i] (exact: the bits shifted into the high half). */
static void widen_bf16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* T = 1 row order (as matmul_avx512.c): a tile takes R / NS adjacent rows from each of NS
 * far-apart streams (the row range cut into NS contiguous pieces), so each thread reads NS
 * long sequential streams; rows past r1 repeat row r1 - 1 and their results are dropped.
 * The order of rows changes no value. */
#define NS 4
INLINE int64_t t1_stream_len(int64_t r0, int64_t r1, int R) { return (r1 - r0 + R - 1) / R; }
INLINE void t1_tile_rows(const dsf_wmat *w, int64_t r0, int64_t r1, int64_t len, int64_t k, int64_t *rr,
                         const uint8_t **wr, int R) {
    const int pw = R / NS;
    for (int s = 0; s < NS; s++)
        for (int j = 0; j < pw; j++) {
            int64_t r = r0 + (s * len + k) * pw + j;
            rr[s * pw + j] = r < r1 ? r : -1;
            wr[s * pw + j] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
        }
}

/* One accumulator per row, the group's four vectors fused in order (the same operations as
 * TILE_TN, for batch invariance); R rows give R independent FMA chains (RB1; 4 for the
 * types whose decode needs registers of its own: with 8 the MXFP4 tile spilled). Each row is
 * prefetched 2 KiB ahead. */
#define TILE_T1(NAME, DEC, GB, R)                                                              \
    INLINE void NAME(const uint8_t *const *wr, const float *x, int64_t g0, int64_t g1,         \
                     float *out) {                                                             \
        __m256 a[R];                                                                           \
        UNROLL for (int r = 0; r < (R); r++) a[r] = _mm256_setzero_ps();                       \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            const float *xg = x + g * 32;                                                      \
            UNROLL for (int r = 0; r < (R); r++) {                                             \
                __m256 w[4];                                                                   \
                _mm_prefetch((const char *)(wr[r] + g * (GB) + 2048), _MM_HINT_T0);            \
                DEC(wr[r] + g * (GB), w);                                                      \
                UNROLL for (int k = 0; k < 4; k++)                                             \
                    a[r] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xg + 8 * k), a[r]);           \
            }                                                                                  \
        }                                                                                      \
        UNROLL for (int r = 0; r < (R); r++) out[r] = red256(a[r]);                            \
    }

#define TILE_TN(NAME, DEC, GB)                                                                 \
    INLINE void NAME(const uint8_t *const *wr, const float *const *x, int64_t g0, int64_t g1,  \
                     float *out) {                                                             \
        __m256 a[RBN][TB];                                                                     \
        UNROLL for (int r = 0; r < RBN; r++)                                                   \
            UNROLL for (int t = 0; t < TB; t++) a[r][t] = _mm256_setzero_ps();                 \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            UNROLL for (int r = 0; r < RBN; r++) {                                             \
                __m256 w[4];                                                                   \
                DEC(wr[r] + g * (GB), w);                                                      \
                UNROLL for (int t = 0; t < TB; t++)                                            \
                    UNROLL for (int k = 0; k < 4; k++)                                         \
                        a[r][t] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x[t] + (g - g0) * 32 + 8 * k), a[r][t]); \
            }                                                                                  \
        }                                                                                      \
        UNROLL for (int r = 0; r < RBN; r++)                                                   \
            UNROLL for (int t = 0; t < TB; t++) out[r * TB + t] = red256(a[r][t]);             \
    }

#define MATMUL(NAME, DEC, GB, R1)                                                              \
    TILE_T1(NAME##_t1, DEC, GB, R1)                                                            \
    TILE_TN(NAME##_tn, DEC, GB)                                                                \
    static void NAME##_tchunks(const dsf_wmat *w, const float *x, const uint16_t *xb, float *xw, \
                               int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1);      \
    static void NAME(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,      \
                     int64_t r0, int64_t r1) {                                                 \
        const int64_t ng = w->n_in / 32, kcg = KC / 32;                                        \
        if (T == 1) {                                                                          \
            const uint8_t *wr[R1];                                                             \
            int64_t rr[R1], len = t1_stream_len(r0, r1, R1);                                   \
            for (int64_t k = 0; k < len; k++) {                                                \
                t1_tile_rows(w, r0, r1, len, k, rr, wr, R1);                                   \
                for (int64_t g0 = 0; g0 < ng; g0 += kcg) {                                     \
                    float out[R1];                                                             \
                    NAME##_t1(wr, x, g0, g0 + kcg < ng ? g0 + kcg : ng, out);                  \
                    for (int i = 0; i < (R1); i++)                                             \
                        if (rr[i] >= 0) y[rr[i]] = g0 == 0 ? out[i] : y[rr[i]] + out[i];       \
                }                                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        NAME##_tchunks(w, x, NULL, NULL, T, y, ldy, r0, r1);                                   \
    }                                                                                          \
    /* T > 1: token chunks x K chunks x row tiles x token tiles. xb (BF16 activations, x      \
     * NULL): each chunk's activations are widened (exactly) into xw[TC * KC] first. */        \
    static void NAME##_tchunks(const dsf_wmat *w, const float *x, const uint16_t *xb, float *xw, \
                               int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {     \
        const int64_t ng = w->n_in / 32, kcg = KC / 32;                                        \
        const uint8_t *wr[RBN];                                                                \
        for (int64_t tc = 0; tc < T; tc += TC) {                                               \
            int64_t tc1 = tc + TC < T ? tc + TC : T;                                           \
            for (int64_t g0 = 0; g0 < ng; g0 += kcg) {                                         \
                int64_t g1 = g0 + kcg < ng ? g0 + kcg : ng;                                    \
                const float *xc = xb ? xw : x + tc * w->n_in + g0 * 32;                        \
                const int64_t ldx = xb ? (g1 - g0) * 32 : w->n_in;                             \
                if (xb)                                                                        \
                    for (int64_t t = tc; t < tc1; t++)                                         \
                        widen_bf16(xb + t * w->n_in + g0 * 32, xw + (t - tc) * ldx, ldx);      \
                for (int64_t r = r0; r < r1; r += RBN) {                                       \
                    for (int i = 0; i < RBN; i++)                                              \
                        wr[i] = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes; \
                    for (int64_t t = tc; t < tc1; t += TB) {                                   \
                        const float *xt[TB];                                                   \
                        float out[RBN * TB];                                                   \
                        for (int j = 0; j < TB; j++)                                           \
                            xt[j] = xc + ((t + j < tc1 ? t + j : tc1 - 1) - tc) * ldx;         \
                        NAME##_tn(wr, xt, g0, g1, out);                                        \
                        for (int i = 0; i < RBN && r + i < r1; i++)                            \
                            for (int j = 0; j < TB && t + j < tc1; j++) {                      \
                                float *yy = &y[(t + j) * ldy + r + i];                         \
                                *yy = g0 == 0 ? out[i * TB + j] : *yy + out[i * TB + j];       \
                            }                                                                  \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

MATMUL(mm_f32, dec_f32, 128, RB1)
MATMUL(mm_bf16, dec_bf16, 64, RB1)
MATMUL(mm_f16, dec_f16, 64, RB1)
MATMUL(mm_q8_0, dec_q8_0, 34, RB1)
MATMUL(mm_mxfp4, dec_mxfp4, 17, 4)

#define GUARDED(NAME)                                                                          \
    static void NAME##_any(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, \
                           int64_t r0, int64_t r1) {                                           \
        if (w->n_in % 32 != 0 || r1 <= r0 || T <= 0) {                                         \
            if (r1 > r0 && T > 0) matmul_any_ref(w, x, T, y, ldy, r0, r1);                     \
            return;                                                                            \
        }                                                                                      \
        NAME(w, x, T, y, ldy, r0, r1);                                                         \
    }
GUARDED(mm_f32)
GUARDED(mm_bf16)
GUARDED(mm_f16)
GUARDED(mm_q8_0)
GUARDED(mm_mxfp4)

/* BF16 activations for weight types without a BF16-dot tile: the fp32 kernel's operations on
 * the exactly widened values (same numbers). T = 1 widens the token into a stack buffer; T > 1
 * widens each token x K chunk once, inside the chunk loop (a 3-token buffer made every few
 * tokens re-read the weights from memory). */
#define XWIDEN(NAME, FP32)                                                                     \
    static void NAME(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,   \
                     int64_t r0, int64_t r1) {                                                 \
        if (r1 <= r0 || T <= 0) return;                                                        \
        if (w->n_in > 16384 || w->n_in % 32 != 0) {                                            \
            matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);                                     \
            return;                                                                            \
        }                                                                                      \
        if (T > 1) { /* 512 KiB on the stack, as mxfp4_avx512.c's MXFP4 activations */       \
            float xw[TC * KC];                                                                 \
            FP32##_tchunks(w, NULL, x, xw, T, y, ldy, r0, r1);                                 \
            return;                                                                            \
        }                                                                                      \
        float buf[16384];                                                                      \
        widen_bf16(x, buf, w->n_in);                                                           \
        FP32(w, buf, 1, y, ldy, r0, r1);                                                       \
    }
XWIDEN(xw_f32, mm_f32)
XWIDEN(xw_f16, mm_f16)
XWIDEN(xw_q8_0, mm_q8_0)
XWIDEN(xw_bf16, mm_bf16)
XWIDEN(xw_mxfp4, mm_mxfp4)

/* DSF_TYPE_FP8B32 (fp8_avx2.c): bit for bit the BF16 kernels above, handed over with the K
 * chunk of their T = 1 tile, which its fused T = 1 kernel repeats. */
static void mm_fp8b32(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    fp8b32_mm_avx2(w, x, T, y, ldy, r0, r1, mm_bf16_any, KC);
}
static void xmm_fp8b32(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    fp8b32_xbf16_avx2(w, x, T, y, ldy, r0, r1, xw_bf16, mm_bf16_any, KC);
}

/* ---- benchmark probes ---- */

/* Four concurrent streams, as in matmul_avx512.c. */
static double read_probe(const uint8_t *p, uint64_t n) {
    __m256i a[8];
    UNROLL for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_si256();
    uint64_t q = n / 4 / 64 * 64;
    for (uint64_t i = 0; i < q; i += 64)
        UNROLL for (int s = 0; s < 4; s++) {
            a[2 * s] = _mm256_add_epi64(a[2 * s], _mm256_load_si256((const __m256i *)(const void *)(p + s * q + i)));
            a[2 * s + 1] = _mm256_add_epi64(a[2 * s + 1], _mm256_load_si256((const __m256i *)(const void *)(p + s * q + i + 32)));
        }
    for (uint64_t i = 4 * q; i + 32 <= n; i += 32) a[0] = _mm256_add_epi64(a[0], _mm256_load_si256((const __m256i *)(const void *)(p + i)));
    for (int j = 1; j < 8; j++) a[0] = _mm256_add_epi64(a[0], a[j]);
    uint64_t v[4];
    memcpy(v, &a[0], sizeof v);
    return (double)(v[0] + v[1] + v[2] + v[3]);
}

/* fp32 FMA only (AVX2 has no BF16 dot): 10 independent accumulators. */
static uint64_t peak_probe(int64_t iters, int bf16, float *sink) {
    if (bf16) {
        *sink = 0;
        return 0;
    }
    __m256 acc[10];
    UNROLL for (int j = 0; j < 10; j++) acc[j] = _mm256_set1_ps((float)j);
    __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int64_t i = 0; i < iters; i++) {
        __asm__ volatile("" : "+x"(b), "+x"(c));
        UNROLL for (int j = 0; j < 10; j++) acc[j] = _mm256_fmadd_ps(acc[j], b, c);
    }
    for (int j = 1; j < 10; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    *sink = red256(acc[0]);
    return (uint64_t)iters * 10 * 16;
}

const dsf_kernels kernels_avx2 = {
    .name = "avx2",
    .read_probe = read_probe,
    .peak_probe = peak_probe,
    .fp8b32 = mm_fp8b32,
    .fp8b32_xbf16 = xmm_fp8b32,
    .matmul_q8k = {
        [GGML_TYPE_IQ4_XS] = q8k_iq4_xs_avx2, /* q8k_iq_avx2.c */
        [GGML_TYPE_IQ2_XXS] = q8k_iq2_xxs_avx2,
    },
    .matmul_xbf16 = {
        [GGML_TYPE_F32] = xw_f32,
        [GGML_TYPE_BF16] = xw_bf16,
        [GGML_TYPE_F16] = xw_f16,
        [GGML_TYPE_Q8_0] = xw_q8_0,
        [GGML_TYPE_MXFP4] = xw_mxfp4,
        [GGML_TYPE_IQ2_XXS] = xmm_iq2_xxs_avx2,
        [GGML_TYPE_IQ2_XS] = xmm_iq2_xs_avx2,
        [GGML_TYPE_IQ2_S] = xmm_iq2_s_avx2,
        [GGML_TYPE_IQ4_XS] = xmm_iq4_xs_avx2,
        [GGML_TYPE_Q2_K] = xmm_q2_k_avx2, /* kquant_avx2.c */
        [GGML_TYPE_Q3_K] = xmm_q3_k_avx2,
        [GGML_TYPE_Q4_K] = xmm_q4_k_avx2,
        [GGML_TYPE_Q5_K] = xmm_q5_k_avx2,
        [GGML_TYPE_Q6_K] = xmm_q6_k_avx2,
        [GGML_TYPE_IQ3_XXS] = matmul_iq3xxs_bf16_avx2, /* iq13_avx2.c */
        [GGML_TYPE_IQ3_S] = matmul_iq3s_bf16_avx2,
        [GGML_TYPE_IQ1_S] = matmul_iq1s_bf16_avx2,
        [GGML_TYPE_IQ1_M] = matmul_iq1m_bf16_avx2,
    },
    .matmul = {
        [GGML_TYPE_F32] = mm_f32_any,
        [GGML_TYPE_BF16] = mm_bf16_any,
        [GGML_TYPE_F16] = mm_f16_any,
        [GGML_TYPE_Q8_0] = mm_q8_0_any,
        [GGML_TYPE_MXFP4] = mm_mxfp4_any,
        [GGML_TYPE_IQ2_XXS] = mm_iq2_xxs_avx2,
        [GGML_TYPE_IQ2_XS] = mm_iq2_xs_avx2,
        [GGML_TYPE_IQ2_S] = mm_iq2_s_avx2,
        [GGML_TYPE_IQ4_XS] = mm_iq4_xs_avx2,
        [GGML_TYPE_Q2_K] = mm_q2_k_avx2, /* kquant_avx2.c */
        [GGML_TYPE_Q3_K] = mm_q3_k_avx2,
        [GGML_TYPE_Q4_K] = mm_q4_k_avx2,
        [GGML_TYPE_Q5_K] = mm_q5_k_avx2,
        [GGML_TYPE_Q6_K] = mm_q6_k_avx2,
        [GGML_TYPE_IQ3_XXS] = matmul_iq3xxs_f32_avx2, /* iq13_avx2.c */
        [GGML_TYPE_IQ3_S] = matmul_iq3s_f32_avx2,
        [GGML_TYPE_IQ1_S] = matmul_iq1s_f32_avx2,
        [GGML_TYPE_IQ1_M] = matmul_iq1m_f32_avx2,
    },
};

#else
const dsf_kernels kernels_avx2 = {.name = "avx2", .matmul = {0}};
#endif
