/* matmul_avx512.c: AVX-512 matmul kernels of the fp32-activation family (every weight type)
 * and the BF16-activation products of the non-MXFP4 types, the probes and the kernels_avx512
 * table (compiled with the Makefile's AVX512_FLAGS only; select.c selects this table only on
 * CPUs that have every one of those features). The MXFP4 x BF16-activation products, both
 * layouts, are mxfp4_avx512.c's; the helpers both files use are tile512.h's.
 *
 * Numerics: weights are widened exactly to fp32 and multiplied with the fp32 activations by
 * fp32 FMA, so the result differs from the exact sum only by fp32 summation order (lanes of
 * 16, per-block partial sums for T > 1). No activation is ever rounded: plain mode stays fp32.
 *
 * Blocking: every weight type is consumed in groups of 32 elements (one ggml block for Q8_0
 * and MXFP4). A tile is RB = 4 weight rows x 1 token (decode) or RBN = 4 rows x TB = 4 tokens;
 * its rows come from 4 far-apart streams (t1_tile_rows), so each thread reads 4 long
 * sequential streams. The weight group is decoded once per tile and reused for its tokens.
 * The reduction is cut into chunks of KC elements and the tokens into chunks of TC, so the
 * activation chunk stays in L2 while each weight row chunk is read from memory once per token
 * chunk. Edge tiles (fewer rows / tokens) reuse the last valid row / token and drop the extra
 * results.
 *
 * Batch invariance: within a kernel family (fp32 activations; BF16 activations) every output
 * y[t][r] is computed by the same sequence of operations whatever T, the token's position in
 * the batch, the tile and the row range: decode, chunked prefill and one long prefill give
 * bit-identical results (reference mode's QDQ would turn any difference into rounding flips). */
#include "kernels/matmul.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/fp8.h"
#include "kernels/iq2k.h"
#include "kernels/q8k_iq.h"
#include "kernels/kquant.h"
#include "kernels/q8k.h"
#include "kernels/iq13.h"
#include "kernels/tile512.h"

#define RB 4     /* rows per tile, T = 1: one row from each of NS far-apart row streams */
#define RBN 4    /* rows per tile, T > 1 */
#define TB 4     /* tokens per tile, T > 1 */
/* fp32-activation family (T > 1): a token tile's activations (TB x KC x 4 bytes, 16 KiB) and a
 * row tile's weights stay in L1, the chunk's activations (TC x KC x 4 = 256 KiB) in L2
 * (docs/perf-log.md, item 24). Changing KC changes the order of the fp32 family's sums (for
 * every T alike). */
#define TC 64    /* tokens per chunk */
#define KC 1024  /* reduction elements per chunk */
_Static_assert(RB == 4 && RBN == 4 && TB == 4, "the tiles' sums (red4, red4x4) take 4 rows x 4 tokens");

/* The same for a tile of two pairs of adjacent rows (from ra and from rb): two 2-float
 * accesses per token. */
INLINE void tile_put2x2x4(const float *out, float *y, int64_t ldy, int64_t t, int64_t ra, int64_t rb, int64_t k) {
    UNROLL for (int j = 0; j < 4; j++)
        UNROLL for (int h = 0; h < 2; h++) {
            float *yy = y + (t + j) * ldy + (h ? rb : ra);
            __m128 v = _mm_castpd_ps(_mm_load_sd((const double *)(const void *)(out + 4 * j + 2 * h)));
            if (k) v = _mm_add_ps(v, _mm_castpd_ps(_mm_load_sd((const double *)(const void *)yy)));
            _mm_store_sd((double *)(void *)yy, _mm_castps_pd(v));
        }
}

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

/* Scales of 16 consecutive MXFP4 blocks of a row as floats 2^(e-128), computed 16 at a time
 * (gguf-layout §1.5: (e-1) << 23 for e >= 2; e = 0/1 are the subnormals 2^-128/2^-127). */
INLINE void mxfp4_scales16(const uint8_t *p, float *out) {
    /* the 16 scale bytes sit at offsets 17b, all inside p[0..255]: two 2-source byte
     * permutes (VBMI) pick them out of four loads */
    const __m512i idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        127, 110, 93, 76, 59, 42, 25, 8, 119, 102, 85, 68, 51, 34, 17, 0);
    __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)p), idx,
                                          _mm512_loadu_si512((const void *)(p + 64)));
    __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(p + 128)), idx,
                                          _mm512_loadu_si512((const void *)(p + 192)));
    __m512i e = _mm512_mask_blend_epi8((__mmask64)0xFF00, lo, hi);
    __m512i v = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(e));
    __m512i bits = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00200000));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(v, _mm512_set1_epi32(1)),
                                 _mm512_set1_epi32(0x00400000));
    _mm512_storeu_ps(out, _mm512_castsi512_ps(bits));
}

/* ---- tiles ---- */

/* RB rows x 1 token over groups [g0, g1): one accumulator per row, the group's elements 0-15
 * then 16-31 fused into it (the same operations as TILE_TN, for batch invariance); RB rows
 * give RB independent FMA chains. */
#define TILE_T1(NAME, DEC, GB)                                                                 \
    INLINE void NAME(const uint8_t *const *wr, const float *x, int64_t g0, int64_t g1,         \
                     float *out) {                                                             \
        __m512 a[RB];                                                                          \
        UNROLL for (int r = 0; r < RB; r++) a[r] = _mm512_setzero_ps();                        \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            __m512 x0 = _mm512_loadu_ps(x + g * 32), x1 = _mm512_loadu_ps(x + g * 32 + 16);    \
            UNROLL for (int r = 0; r < RB; r++) {                                              \
                __m512 w0, w1;                                                                 \
                _mm_prefetch((const char *)(wr[r] + g * (GB) + PF_DIST), _MM_HINT_T0);         \
                DEC(wr[r] + g * (GB), &w0, &w1);                                               \
                a[r] = _mm512_fmadd_ps(w0, x0, a[r]);                                          \
                a[r] = _mm512_fmadd_ps(w1, x1, a[r]);                                          \
            }                                                                                  \
        }                                                                                      \
        red4(a, out);                                                                          \
    }

/* RBN rows x TB tokens; x[t] points at each token's activation row. */
#define TILE_TN(NAME, DEC, GB)                                                                 \
    INLINE void NAME(const uint8_t *const *wr, const float *const *x, int64_t g0, int64_t g1,  \
                     float *out) {                                                             \
        __m512 a[RBN][TB];                                                                     \
        UNROLL for (int r = 0; r < RBN; r++)                                                   \
            UNROLL for (int t = 0; t < TB; t++) a[r][t] = _mm512_setzero_ps();                 \
        for (int64_t g = g0; g < g1; g++) {                                                    \
            __m512 x0[TB], x1[TB];                                                             \
            UNROLL for (int t = 0; t < TB; t++) {                                              \
                x0[t] = _mm512_loadu_ps(x[t] + g * 32);                                        \
                x1[t] = _mm512_loadu_ps(x[t] + g * 32 + 16);                                   \
            }                                                                                  \
            UNROLL for (int r = 0; r < RBN; r++) {                                             \
                __m512 w0, w1;                                                                 \
                DEC(wr[r] + g * (GB), &w0, &w1);                                               \
                UNROLL for (int t = 0; t < TB; t++) {                                          \
                    a[r][t] = _mm512_fmadd_ps(w0, x0[t], a[r][t]);                             \
                    a[r][t] = _mm512_fmadd_ps(w1, x1[t], a[r][t]);                             \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        red4x4(a, out);                                                                        \
    }

/* The driver: K chunks of KC elements (for every T: each output is the fp32 sum, in chunk
 * order, of per-chunk partial sums, so decode and prefill give bit-identical results), row
 * tiles over [r0, r1), token tiles within token chunks of TC. Edge tiles repeat the last
 * row/token and drop the extra results. */
/* The two loop nests shared by every matmul below; they expect w, x, T, y, ldy, r0, r1 and
 * ng (groups of 32 per row) in scope. T1_LOOP: tiles of NS x PW rows from far-apart streams,
 * K chunks of KCG groups, results summed in chunk order. TN_LOOP: token chunks of TCH, K
 * chunks of KCG groups, tiles of R rows (from far-apart streams) x TBK tokens (XT: the
 * activation element type); edge tiles repeat the last row / token and drop their results. */
#define T1_LOOP(T1, NS, PW, KCG)                                                               \
    do {                                                                                       \
        const uint8_t *wr_[(NS) * (PW)];                                                       \
        int64_t rr_[(NS) * (PW)], len_ = t1_stream_len(r0, r1, NS, PW);                        \
        for (int64_t k_ = 0; k_ < len_; k_++) {                                                \
            t1_tile_rows(w, r0, r1, len_, k_, NS, PW, rr_, wr_);                               \
            for (int64_t g0 = 0; g0 < ng; g0 += (KCG)) {                                       \
                float o_[(NS) * (PW)];                                                         \
                T1(wr_, x, g0, g0 + (KCG) < ng ? g0 + (KCG) : ng, o_);                         \
                for (int i = 0; i < (NS) * (PW); i++)                                          \
                    if (rr_[i] >= 0) y[rr_[i]] = g0 == 0 ? o_[i] : y[rr_[i]] + o_[i];          \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#define TN_LOOP(XT, TILE, R, TBK, TCH, KCG, PW)                                                \
    do {                                                                                       \
        const uint8_t *wr_[R];                                                                 \
        for (int64_t tc = 0; tc < T; tc += (TCH)) {                                            \
            int64_t tc1 = tc + (TCH) < T ? tc + (TCH) : T;                                     \
            for (int64_t g0 = 0; g0 < ng; g0 += (KCG)) {                                       \
                int64_t g1 = g0 + (KCG) < ng ? g0 + (KCG) : ng;                                \
                int64_t rr_[R], len_ = t1_stream_len(r0, r1, (R) / (PW), PW);                  \
                for (int64_t k_ = 0; k_ < len_; k_++) {                                        \
                    t1_tile_rows(w, r0, r1, len_, k_, (R) / (PW), PW, rr_, wr_);               \
                    for (int64_t t = tc; t < tc1; t += (TBK)) {                                \
                        const XT *xt[TBK];                                                     \
                        float out[(R) * (TBK)];                                                \
                        for (int j = 0; j < (TBK); j++)                                        \
                            xt[j] = x + (t + j < tc1 ? t + j : tc1 - 1) * w->n_in;             \
                        TILE(wr_, xt, g0, g1, out);                                            \
                        if ((PW) == 2 && rr_[1] >= 0 && rr_[3] >= 0 && t + (TBK) <= tc1) {     \
                            tile_put2x2x4(out, y, ldy, t, rr_[0], rr_[2], g0);                 \
                            continue;                                                          \
                        }                                                                      \
                        for (int i = 0; i < (R); i++)                                          \
                            for (int j = 0; j < (TBK) && rr_[i] >= 0 && t + j < tc1; j++) {    \
                                float *yy = &y[(t + j) * ldy + rr_[i]];                        \
                                *yy = g0 == 0 ? out[j * (R) + i] : *yy + out[j * (R) + i];     \
                            }                                                                  \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#define MATMUL(NAME, DEC, GB) TILE_T1(NAME##_t1, DEC, GB) MATMUL_WITH(NAME, NAME##_t1, DEC, GB)
#define MATMUL_WITH(NAME, T1, DEC, GB)                                                         \
    TILE_TN(NAME##_tn, DEC, GB)                                                                \
    static void NAME(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,      \
                     int64_t r0, int64_t r1) {                                                 \
        const int64_t ng = w->n_in / 32;                                                       \
        if (T == 1) T1_LOOP(T1, RB, 1, KC / 32);                                               \
        else TN_LOOP(float, NAME##_tn, RBN, TB, TC, KC / 32, 1);                               \
    }

/* MXFP4 decode tile (T = 1): the hot loop of MoE decode. Scales are prepared 16 blocks at a
 * time so that the inner loop broadcasts them from memory (a plain load) instead of moving
 * each through the integer pipes; the rest is as dec_mxfp4. */
INLINE void mm_mxfp4_t1_fast(const uint8_t *const *wr, const float *x, int64_t g0, int64_t g1, float *out) {
    const __m512 kv = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m512 a[RB];
    UNROLL for (int r = 0; r < RB; r++) a[r] = _mm512_setzero_ps();
    int64_t g = g0;
    for (; g + 16 <= g1; g += 16) {
        float sc[RB][16];
        UNROLL for (int r = 0; r < RB; r++) mxfp4_scales16(wr[r] + g * 17, sc[r]);
        for (int b = 0; b < 16; b++) {
            const float *xg = x + (g + b) * 32;
            __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
            UNROLL for (int r = 0; r < RB; r++) {
                const uint8_t *p = wr[r] + (g + b) * 17;
                _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
                __m512 tbl = _mm512_mul_ps(kv, _mm512_set1_ps(sc[r][b])); /* exact */
                __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 1)));
                a[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q, tbl), x0, a[r]);
                a[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl), x1, a[r]);
            }
        }
    }
    for (; g < g1; g++) {
        __m512 x0 = _mm512_loadu_ps(x + g * 32), x1 = _mm512_loadu_ps(x + g * 32 + 16);
        UNROLL for (int r = 0; r < RB; r++) {
            __m512 w0, w1;
            dec_mxfp4(wr[r] + g * 17, &w0, &w1);
            a[r] = _mm512_fmadd_ps(w0, x0, a[r]);
            a[r] = _mm512_fmadd_ps(w1, x1, a[r]);
        }
    }
    red4(a, out);
}

MATMUL(mm_f32, dec_f32, 128)
MATMUL(mm_bf16, dec_bf16, 64)
MATMUL(mm_f16, dec_f16, 64)
MATMUL(mm_q8_0, dec_q8_0, 34)
MATMUL_WITH(mm_mxfp4, mm_mxfp4_t1_fast, dec_mxfp4, 17)

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

/* ---- BF16-activation kernels (vdpbf16ps) ----
 * Products of BF16/MXFP4 weights and BF16 activations are exact in fp32; vdpbf16ps adds them
 * pairwise into fp32 lanes (flushing subnormals). BF16: tiles of 4 rows x 4 tokens (one
 * 64-byte weight load feeds 4 dot instructions); T = 1 has its own tile (xb_bf16_t1) with
 * the same per-output operations. K is cut into XKC-element chunks and tokens into XTC
 * chunks (activation chunk XTC x XKC x 2 bytes = 512 KiB stays in L2). A row tile's weights
 * come from memory for its first token tile and from L1 for the others, so a larger XTC has
 * fewer of those slower first tiles (docs/perf-log.md, item 20). For T > 1 a tile's rows are
 * 2 adjacent rows from each of 2 far-apart streams, so that its 16 sums go to y as two 2-float
 * accesses per token (tile_put2x2x4; docs/perf-log.md, item 17); the fp32 family keeps 4
 * streams. MXFP4: mxfp4_avx512.c. */
#define XKC 2048
#define XTC 128

INLINE void xb_bf16_tile(const uint8_t *const *wr, const uint16_t *const *x, int64_t g0, int64_t g1, float *out) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g++) {
        __m512i xv[4];
        UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm512_loadu_si512((const void *)(x[t] + g * 32));
        UNROLL for (int r = 0; r < 4; r++) {
            __m512i wv = _mm512_loadu_si512((const void *)(wr[r] + g * 64));
            UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_dpbf16_ps(a[r][t], as_bh(wv), as_bh(xv[t]));
        }
    }
    red4x4(a, out);
}

/* T = 1 (decode) with BF16 activations: 4 rows share each 64-byte activation load; one
 * accumulator per row as in xb_bf16_tile (batch invariance). */
INLINE void xb_bf16_t1(const uint8_t *const *wr, const uint16_t *x, int64_t g0, int64_t g1, float *out) {
    __m512 a[4];
    UNROLL for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g++) {
        __m512i xv = _mm512_loadu_si512((const void *)(x + g * 32));
        UNROLL for (int r = 0; r < 4; r++) {
            _mm_prefetch((const char *)(wr[r] + g * 64 + PF_DIST), _MM_HINT_T0);
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(_mm512_loadu_si512((const void *)(wr[r] + g * 64))), as_bh(xv));
        }
    }
    red4(a, out);
}

#define XMATMUL(NAME, TILE, XRB, XTB, T1, PW)                                                \
    static void NAME(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,   \
                     int64_t r0, int64_t r1) {                                                 \
        if (r1 <= r0 || T <= 0) return;                                                        \
        if (w->n_in % 32 != 0 || w->n_in > 16384) {                                            \
            matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);                                     \
            return;                                                                            \
        }                                                                                      \
        const int64_t ng = w->n_in / 32;                                                       \
        if (T == 1) T1_LOOP(T1, RB, PW, XKC / 32);                                             \
        else TN_LOOP(uint16_t, TILE, XRB, XTB, XTC, XKC / 32, 2);                              \
    }

XMATMUL(xmm_bf16, xb_bf16_tile, 4, 4, xb_bf16_t1, 1)

/* dst[i] = the fp32 value of BF16 src[i] (exact: the bits shifted into the high half). */
static void widen_bf16(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* BF16 activations for weight types without a BF16-dot tile: widen whole token tiles at a
 * time into a stack buffer (512 KiB, as mxfp4_avx512.c's MXFP4 activations) and run the fp32
 * kernel (same numbers, exact widening; batch invariance makes the split into calls change no
 * value). The buffer holds whole 4-token tiles of the widest rows (docs/perf-log.md, item 28). */
#define XW_BUF 131072
#define XWIDEN(NAME, FP32)                                                                     \
    static void NAME(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,   \
                     int64_t r0, int64_t r1) {                                                 \
        if (r1 <= r0 || T <= 0) return;                                                        \
        if (w->n_in > 16384 || w->n_in % 32 != 0) {                                            \
            matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);                                     \
            return;                                                                            \
        }                                                                                      \
        float buf[XW_BUF];                                                                     \
        int64_t per = XW_BUF / w->n_in / TB * TB;                                              \
        for (int64_t t0 = 0; t0 < T; t0 += per) {                                              \
            int64_t nb = T - t0 < per ? T - t0 : per;                                          \
            widen_bf16(x + t0 * w->n_in, buf, nb * w->n_in);                                   \
            FP32(w, buf, nb, y + t0 * ldy, ldy, r0, r1);                                       \
        }                                                                                      \
    }
XWIDEN(xw_f32, mm_f32)
XWIDEN(xw_f16, mm_f16)
XWIDEN(xw_q8_0, mm_q8_0)

/* DSF_TYPE_FP8B32 (fp8_avx512.c): bit for bit the BF16 kernels above, handed over with the K
 * chunks of their T = 1 tiles, which its fused T = 1 kernels repeat. */
static void mm_fp8b32(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    fp8b32_mm_avx512(w, x, T, y, ldy, r0, r1, mm_bf16_any, KC);
}
static void xmm_fp8b32(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    fp8b32_xbf16_avx512(w, x, T, y, ldy, r0, r1, xmm_bf16, XKC);
}

/* kern_act_to_bf16, 16 values at a time with the twin's integer rounding (vcvtneps2bf16
 * would flush subnormal inputs): round to nearest even, a NaN keeps its bits with the quiet
 * bit set; exact iff no value had low bits. */
static bool act_to_bf16(const float *x, uint16_t *xb, int64_t n) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), low = _mm512_set1_epi32(0xFFFF);
    __mmask16 inexact = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i u = _mm512_maskz_loadu_epi32(m, x + i);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
        __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
        h = _mm512_mask_mov_epi32(h, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
        _mm256_mask_storeu_epi16(xb + i, m, _mm512_cvtepi32_epi16(h));
        inexact |= _mm512_test_epi32_mask(u, low);
    }
    return inexact == 0;
}

/* ---- benchmark probes ---- */

/* Four concurrent streams (one per quarter of the range), like a matmul tile's rows: one
 * stream per thread underestimates what the memory system delivers to multi-row kernels. */
static double read_probe(const uint8_t *p, uint64_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    uint64_t q = n / 4 / 128 * 128;
    const uint8_t *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
    for (uint64_t i = 0; i < q; i += 128) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p0 + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p1 + i)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p2 + i)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p3 + i)));
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p0 + i + 64)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p1 + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p2 + i + 64)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p3 + i + 64)));
    }
    for (uint64_t i = 4 * q; i + 64 <= n; i += 64) a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
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
    .matmul_xbf16 = {
        [GGML_TYPE_F32] = xw_f32,
        [GGML_TYPE_BF16] = xmm_bf16,
        [GGML_TYPE_F16] = xw_f16,
        [GGML_TYPE_Q8_0] = xw_q8_0,
        [GGML_TYPE_MXFP4] = xmm_mxfp4_avx512,
        [GGML_TYPE_IQ2_XXS] = xmm_iq2_xxs_avx512,
        [GGML_TYPE_IQ2_XS] = xmm_iq2_xs_avx512,
        [GGML_TYPE_IQ2_S] = xmm_iq2_s_avx512,
        [GGML_TYPE_IQ4_XS] = xmm_iq4_xs_avx512,
        [GGML_TYPE_Q2_K] = xmm_q2_k_avx512, /* kquant_avx512.c */
        [GGML_TYPE_Q3_K] = xmm_q3_k_avx512,
        [GGML_TYPE_Q4_K] = xmm_q4_k_avx512,
        [GGML_TYPE_Q5_K] = xmm_q5_k_avx512,
        [GGML_TYPE_Q6_K] = xmm_q6_k_avx512,
        [GGML_TYPE_IQ3_XXS] = matmul_iq3xxs_bf16_avx512, /* iq13_avx512.c */
        [GGML_TYPE_IQ3_S] = matmul_iq3s_bf16_avx512,
        [GGML_TYPE_IQ1_S] = matmul_iq1s_bf16_avx512,
        [GGML_TYPE_IQ1_M] = matmul_iq1m_bf16_avx512,
    },
    .matmul = {
        [GGML_TYPE_F32] = mm_f32_any,
        [GGML_TYPE_BF16] = mm_bf16_any,
        [GGML_TYPE_F16] = mm_f16_any,
        [GGML_TYPE_Q8_0] = mm_q8_0_any,
        [GGML_TYPE_MXFP4] = mm_mxfp4_any,
        [GGML_TYPE_IQ2_XXS] = mm_iq2_xxs_avx512,
        [GGML_TYPE_IQ2_XS] = mm_iq2_xs_avx512,
        [GGML_TYPE_IQ2_S] = mm_iq2_s_avx512,
        [GGML_TYPE_IQ4_XS] = mm_iq4_xs_avx512,
        [GGML_TYPE_Q2_K] = mm_q2_k_avx512, /* kquant_avx512.c */
        [GGML_TYPE_Q3_K] = mm_q3_k_avx512,
        [GGML_TYPE_Q4_K] = mm_q4_k_avx512,
        [GGML_TYPE_Q5_K] = mm_q5_k_avx512,
        [GGML_TYPE_Q6_K] = mm_q6_k_avx512,
        [GGML_TYPE_IQ3_XXS] = matmul_iq3xxs_f32_avx512, /* iq13_avx512.c */
        [GGML_TYPE_IQ3_S] = matmul_iq3s_f32_avx512,
        [GGML_TYPE_IQ1_S] = matmul_iq1s_f32_avx512,
        [GGML_TYPE_IQ1_M] = matmul_iq1m_f32_avx512,
    },
    .matmul_q8k = {
        [GGML_TYPE_Q2_K] = mq8_q2_k_avx512, /* q8k_avx512.c */
        [GGML_TYPE_Q3_K] = mq8_q3_k_avx512,
        [GGML_TYPE_Q4_K] = mq8_q4_k_avx512,
        [GGML_TYPE_Q5_K] = mq8_q5_k_avx512,
        [GGML_TYPE_Q6_K] = mq8_q6_k_avx512,
        [GGML_TYPE_IQ4_XS] = q8k_iq4_xs_avx512, /* q8k_iq_avx512.c */
        [GGML_TYPE_IQ2_XXS] = q8k_iq2_xxs_avx512,
        [GGML_TYPE_IQ2_XS] = q8k_iq2_xs_avx512,
        [GGML_TYPE_IQ2_S] = q8k_iq2_s_avx512,
        [GGML_TYPE_IQ3_XXS] = q8k_iq3_xxs_avx512,
        [GGML_TYPE_IQ3_S] = q8k_iq3_s_avx512,
        [GGML_TYPE_IQ1_S] = q8k_iq1_s_avx512,
        [GGML_TYPE_IQ1_M] = q8k_iq1_m_avx512,
    },
    .mxfp4r_xbf16 = xmm_mxfp4r_avx512,
    .fp8b32 = mm_fp8b32,
    .fp8b32_xbf16 = xmm_fp8b32,
    .act_to_bf16 = act_to_bf16,
};

#else
const dsf_kernels kernels_avx512 = {.name = "avx512", .matmul = {0}};
#endif

