/* kernels_avx512.c: AVX-512 matmul kernels (compiled with the Makefile's AVX512_FLAGS only;
 * kernels.c selects this table only on CPUs that have every one of those features).
 *
 * Numerics: weights are widened exactly to fp32 and multiplied with the fp32 activations by
 * fp32 FMA, so the result differs from the exact sum only by fp32 summation order (lanes of
 * 16, per-block partial sums for T > 1). No activation is ever rounded: plain mode stays fp32.
 *
 * Blocking: every weight type is consumed in groups of 32 elements (one ggml block for Q8_0
 * and MXFP4). A tile is RB = 4 weight rows x TB tokens; the weight group is decoded once per
 * tile and reused for the TB tokens. For T > 1 the reduction dimension is cut into chunks of
 * KC elements and the tokens into chunks of TC, so the activation chunk stays in L2 while
 * each weight row chunk is read from memory once per token chunk (once per call for T <= TC).
 * Edge tiles (fewer than RB rows / TB tokens) reuse the last valid row / token and drop the
 * extra results, so every tile runs the same code. */
#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "quant.h"

#define RB 4     /* rows per tile */
#define TB 4     /* tokens per tile (T > 1) */
#define TC 64    /* tokens per chunk */
#define KC 1024  /* reduction elements per chunk (T > 1) */
#define PF_DIST 1024 /* software prefetch distance in bytes along each weight row (decode) */

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* ---- decoders: one group of 32 weights -> two fp32 vectors (elements 0-15, 16-31) ---- */

INLINE void dec_f32(const uint8_t *p, __m512 *w0, __m512 *w1) {
    *w0 = _mm512_loadu_ps((const float *)(const void *)p);
    *w1 = _mm512_loadu_ps((const float *)(const void *)(p + 64));
}

INLINE void dec_bf16(const uint8_t *p, __m512 *w0, __m512 *w1) {
    /* bf16 -> fp32 is exact: the 16 bits become the high half of the binary32 */
    __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32)));
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}

INLINE void dec_f16(const uint8_t *p, __m512 *w0, __m512 *w1) {
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32)));
}

INLINE void dec_q8_0(const uint8_t *p, __m512 *w0, __m512 *w1) {
    uint16_t dh;
    memcpy(&dh, p, 2);
    __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dh))));
    __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 2)));
    __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 18)));
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(a), d); /* int8 x f16 fits fp32 exactly */
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(b), d);
}

/* gguf-layout §1.5: value = kvalues_mxfp4[code] * 2^(e-128), code j in the low nibble of
 * byte j, code j+16 in its high nibble; e = 0/1 give the subnormals 2^-128 / 2^-127. */
INLINE __m512 mxfp4_table(uint8_t e) {
    const __m512 kv = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    /* kv * 2^(e-128) is exact: |kv| has at most 2 significant bits */
    return _mm512_mul_ps(kv, _mm512_castsi512_ps(_mm512_set1_epi32((int)bits)));
}

INLINE void dec_mxfp4(const uint8_t *p, __m512 *w0, __m512 *w1) {
    __m512 tbl = mxfp4_table(p[0]);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 1)));
    /* vpermps reads only the low 4 bits of each index: the low nibble directly */
    *w0 = _mm512_permutexvar_ps(q, tbl);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
}

/* ---- tiles ---- */

/* RB rows x 1 token over groups [g0, g1); two accumulators per row (halves) so that the FMA
 * latency chains stay independent in decode. */
#define TILE_T1(NAME, DEC, GB)                                                                 \
    INLINE void NAME(const uint8_t *const *wr, const float *x, int64_t g0, int64_t g1,         \
                     float *out) {                                                             \
        __m512 a0[RB], a1[RB];                                                                 \
        UNROLL for (int r = 0; r < RB; r++) a0[r] = a1[r] = _mm512_setzero_ps();                      \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            __m512 x0 = _mm512_loadu_ps(x + g * 32), x1 = _mm512_loadu_ps(x + g * 32 + 16);    \
            UNROLL for (int r = 0; r < RB; r++) {                                                     \
                __m512 w0, w1;                                                                 \
                _mm_prefetch((const char *)(wr[r] + g * (GB) + PF_DIST), _MM_HINT_T0);         \
                DEC(wr[r] + g * (GB), &w0, &w1);                                               \
                a0[r] = _mm512_fmadd_ps(w0, x0, a0[r]);                                        \
                a1[r] = _mm512_fmadd_ps(w1, x1, a1[r]);                                        \
            }                                                                                  \
        }                                                                                      \
        UNROLL for (int r = 0; r < RB; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r])); \
    }

/* RB rows x TB tokens; x[t] points at each token's activation row. */
#define TILE_TN(NAME, DEC, GB)                                                                 \
    INLINE void NAME(const uint8_t *const *wr, const float *const *x, int64_t g0, int64_t g1,  \
                     float *out) {                                                             \
        __m512 a[RB][TB];                                                                      \
        UNROLL for (int r = 0; r < RB; r++)                                                           \
            UNROLL for (int t = 0; t < TB; t++) a[r][t] = _mm512_setzero_ps();                        \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            UNROLL for (int r = 0; r < RB; r++) {                                                     \
                __m512 w0, w1;                                                                 \
                DEC(wr[r] + g * (GB), &w0, &w1);                                               \
                UNROLL for (int t = 0; t < TB; t++) {                                                 \
                    a[r][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + g * 32), a[r][t]);    \
                    a[r][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[t] + g * 32 + 16), a[r][t]); \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        UNROLL for (int r = 0; r < RB; r++)                                                           \
            UNROLL for (int t = 0; t < TB; t++) out[r * TB + t] = _mm512_reduce_add_ps(a[r][t]);      \
    }

/* The driver: row tiles over [r0, r1), token tiles, chunks over K for T > 1. The partial sums
 * of chunk k > 0 are added to y; the split depends only on the shapes (deterministic). */
#define MATMUL(NAME, DEC, GB)                                                                  \
    TILE_T1(NAME##_t1, DEC, GB)                                                                \
    TILE_TN(NAME##_tn, DEC, GB)                                                                \
    static void NAME(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,      \
                     int64_t r0, int64_t r1) {                                                 \
        const int64_t ng = w->n_in / 32;                                                       \
        const uint8_t *wr[RB];                                                                 \
        if (T == 1) {                                                                          \
            for (int64_t r = r0; r < r1; r += RB) {                                            \
                float out[RB];                                                                 \
                for (int i = 0; i < RB; i++)                                                   \
                    wr[i] = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes;  \
                NAME##_t1(wr, x, 0, ng, out);                                                  \
                for (int i = 0; i < RB && r + i < r1; i++) y[r + i] = out[i];                  \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        const int64_t kcg = KC / 32;                                                           \
        for (int64_t tc = 0; tc < T; tc += TC) {                                               \
            int64_t tc1 = tc + TC < T ? tc + TC : T;                                           \
            for (int64_t g0 = 0; g0 < ng; g0 += kcg) {                                         \
                int64_t g1 = g0 + kcg < ng ? g0 + kcg : ng;                                    \
                for (int64_t r = r0; r < r1; r += RB) {                                        \
                    for (int i = 0; i < RB; i++)                                               \
                        wr[i] = w->data + (uint64_t)(r + i < r1 ? r + i : r1 - 1) * w->row_bytes; \
                    for (int64_t t = tc; t < tc1; t += TB) {                                   \
                        const float *xt[TB];                                                   \
                        float out[RB * TB];                                                    \
                        for (int j = 0; j < TB; j++)                                           \
                            xt[j] = x + (t + j < tc1 ? t + j : tc1 - 1) * w->n_in;             \
                        NAME##_tn(wr, xt, g0, g1, out);                                        \
                        for (int i = 0; i < RB && r + i < r1; i++)                             \
                            for (int j = 0; j < TB && t + j < tc1; j++) {                      \
                                float *yy = &y[(t + j) * ldy + r + i];                         \
                                *yy = g0 == 0 ? out[i * TB + j] : *yy + out[i * TB + j];       \
                            }                                                                  \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

MATMUL(mm_f32, dec_f32, 128)
MATMUL(mm_bf16, dec_bf16, 64)
MATMUL(mm_f16, dec_f16, 64)
MATMUL(mm_q8_0, dec_q8_0, 34)
MATMUL(mm_mxfp4, dec_mxfp4, 17)

/* Rows whose length is not a multiple of 32 go to the scalar twin (no V4.1 matrix has one). */
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

/* ---- benchmark probes ---- */

static double read_probe(const uint8_t *p, uint64_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (uint64_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (double)_mm512_reduce_add_epi64(a0);
}

/* 12 independent accumulators cover the latency of vdpbf16ps / vfmadd at full throughput. */
static uint64_t peak_probe(int64_t iters, int bf16, float *sink) {
    __m512 acc[12];
    UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_ps((float)j);
    __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    if (bf16) {
        __m512bh bb = (__m512bh)_mm512_cvtne2ps_pbh(b, b), cc = (__m512bh)_mm512_cvtne2ps_pbh(c, c);
        for (int64_t i = 0; i < iters; i++) {
            __asm__ volatile("" : "+v"(bb), "+v"(cc));
            UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbf16_ps(acc[j], bb, cc);
        }
    } else {
        for (int64_t i = 0; i < iters; i++) {
            __asm__ volatile("" : "+v"(b), "+v"(c));
            UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_fmadd_ps(acc[j], b, c);
        }
    }
    __m512 s = acc[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, acc[j]);
    *sink = _mm512_reduce_add_ps(s);
    /* per instruction: bf16 32 pairs x 2 FLOP = 64; fp32 FMA 16 x 2 = 32 */
    return (uint64_t)iters * 12 * (bf16 ? 64 : 32);
}

const dsf_kernels kernels_avx512 = {
    .name = "avx512",
    .read_probe = read_probe,
    .peak_probe = peak_probe,
    .matmul = {
        [GGML_TYPE_F32] = mm_f32_any,
        [GGML_TYPE_BF16] = mm_bf16_any,
        [GGML_TYPE_F16] = mm_f16_any,
        [GGML_TYPE_Q8_0] = mm_q8_0_any,
        [GGML_TYPE_MXFP4] = mm_mxfp4_any,
    },
};

#else
const dsf_kernels kernels_avx512 = {.name = "avx512", .matmul = {0}};
#endif
