/* kernels_avx512.c: AVX-512 matmul kernels (compiled with the Makefile's AVX512_FLAGS only;
 * kernels.c selects this table only on CPUs that have every one of those features).
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
#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "quant.h"

#define RB 4     /* rows per tile, T = 1: one row from each of NS far-apart row streams */
#define RBN 4    /* rows per tile, T > 1 */
#define TB 4     /* tokens per tile, T > 1 */
#define TC 32    /* tokens per chunk */
#define KC 4096  /* reduction elements per chunk */
#ifndef PF_DIST
#define PF_DIST 2048 /* software prefetch distance in bytes along each weight row (decode) */
#endif

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

/* ---- T = 1 row order ----
 * A decode tile takes RB x pw rows: pw adjacent rows from each of RB far-apart streams (the
 * row range [r0, r1) is cut into RB contiguous streams of `len` steps of pw rows; tile k
 * takes step k of each). Each thread then reads RB long sequential streams, which the memory
 * system serves much better than RB adjacent rows (short streams the hardware prefetchers
 * keep re-learning: about 0.75 of the read probe against 0.95). Rows past r1 (the tail of
 * the last stream) repeat row r1 - 1 and their results are dropped. The order of rows does
 * not change any value. */
INLINE int64_t t1_stream_len(int64_t r0, int64_t r1, int ns, int pw) { return (r1 - r0 + ns * pw - 1) / (ns * pw); }
INLINE void t1_tile_rows(const dsf_wmat *w, int64_t r0, int64_t r1, int64_t len, int64_t k, int ns, int pw,
                         int64_t *rr, const uint8_t **wr) {
    for (int s = 0; s < ns; s++)
        for (int j = 0; j < pw; j++) {
            int64_t r = r0 + (s * len + k) * pw + j;
            rr[s * pw + j] = r < r1 ? r : -1;
            wr[s * pw + j] = w->data + (uint64_t)(r < r1 ? r : r1 - 1) * w->row_bytes;
        }
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
        UNROLL for (int r = 0; r < RB; r++) out[r] = _mm512_reduce_add_ps(a[r]);               \
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
        UNROLL for (int r = 0; r < RBN; r++)                                                   \
            UNROLL for (int t = 0; t < TB; t++) out[r * TB + t] = _mm512_reduce_add_ps(a[r][t]); \
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

#define TN_LOOP(XT, TILE, R, TBK, TCH, KCG)                                                    \
    do {                                                                                       \
        const uint8_t *wr_[R];                                                                 \
        for (int64_t tc = 0; tc < T; tc += (TCH)) {                                            \
            int64_t tc1 = tc + (TCH) < T ? tc + (TCH) : T;                                     \
            for (int64_t g0 = 0; g0 < ng; g0 += (KCG)) {                                       \
                int64_t g1 = g0 + (KCG) < ng ? g0 + (KCG) : ng;                                \
                int64_t rr_[R], len_ = t1_stream_len(r0, r1, R, 1);                            \
                for (int64_t k_ = 0; k_ < len_; k_++) {                                        \
                    t1_tile_rows(w, r0, r1, len_, k_, R, 1, rr_, wr_);                         \
                    for (int64_t t = tc; t < tc1; t += (TBK)) {                                \
                        const XT *xt[TBK];                                                     \
                        float out[(R) * (TBK)];                                                \
                        for (int j = 0; j < (TBK); j++)                                        \
                            xt[j] = x + (t + j < tc1 ? t + j : tc1 - 1) * w->n_in;             \
                        TILE(wr_, xt, g0, g1, out);                                            \
                        for (int i = 0; i < (R); i++)                                          \
                            for (int j = 0; j < (TBK) && rr_[i] >= 0 && t + j < tc1; j++) {    \
                                float *yy = &y[(t + j) * ldy + rr_[i]];                        \
                                *yy = g0 == 0 ? out[i * (TBK) + j] : *yy + out[i * (TBK) + j]; \
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
        else TN_LOOP(float, NAME##_tn, RBN, TB, TC, KC / 32);                                  \
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
    UNROLL for (int r = 0; r < RB; r++) out[r] = _mm512_reduce_add_ps(a[r]);
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
 * pairwise into fp32 lanes (flushing subnormals). Tiles: BF16 4 rows x 4 tokens (one 64-byte
 * weight load feeds 4 dot instructions), MXFP4 2 rows x 4 tokens x 2 accumulator chains (the
 * nibble decode, a vpermw lookup into a 32-word BF16 table whose exponents carry the block
 * scale, is amortized over 4 tokens). K is cut into XKC-element chunks and tokens into XTC
 * chunks (activation chunk XTC x XKC x 2 bytes = 256 KiB stays in L2). T = 1 has its own
 * tiles (xb_bf16_t1, xb_mx_t1) with the same per-output operations. */
#define XKC 2048
#define XTC 64

INLINE __m512bh as_bh(__m512i v) { return (__m512bh)v; }

INLINE double mx_block_exact(const uint8_t *p, const uint16_t *x) {
    float wf[32];
    dequant_row(GGML_TYPE_MXFP4, p, wf, 32);
    double s = 0;
    for (int i = 0; i < 32; i++) s += (double)wf[i] * (double)bf16_to_f32(x[i]);
    return s;
}

/* Exact contribution of the blocks of one row in [g0, g1) whose scale is outside [2, 252]
 * (kept out of the hot loops: a call there would force the accumulators into memory). */
static double mx_row_exceptions(const uint8_t *row, const uint16_t *x, int64_t g0, int64_t g1) {
    double s = 0;
    for (int64_t g = g0; g < g1; g++) {
        int e = row[g * 17];
        if (e < 2 || e > 252) s += mx_block_exact(row + g * 17, x + g * 32);
    }
    return s;
}

/* keep = 1: the block's BF16 weights; keep = 0: all zero (exceptional block, added exactly
 * elsewhere). The zero-masked add multiplies the nonzero table entries by 2^(e-128) (an
 * exponent add) and leaves the zero codes (entries 0, 8, 16, 24) at zero. (A zero-masked
 * table rather than a masked vdpbf16ps: GCC 12 narrows the latter's mask to 8 bits.)
 * Indices: the 16 code bytes broadcast to both halves and widened to words; the upper 16
 * words are shifted right by 4 (the high nibbles, codes 16-31); vpermw reads 5 index bits
 * and the table repeats, so the stray bit 4 of the low half does not matter. */
INLINE __m512i mx_decode_bf16(const uint8_t *p, __m512i base, __m512i kvec, int keep) {
    __m512i tbl = _mm512_maskz_add_epi16((__mmask32)(keep ? 0xFEFEFEFEu : 0u), base, kvec);
    __m512i id = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + 1))));
    id = _mm512_mask_srli_epi16(id, (__mmask32)0xFFFF0000u, id, 4);
    return _mm512_permutexvar_epi16(id, tbl);
}

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
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) out[r * 4 + t] = _mm512_reduce_add_ps(a[r][t]);
}

/* kvalues_mxfp4 as BF16 bits, repeated so that vpermw (5 index bits) ignores bit 4 */
#define KV_BF16 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40C0, 0x4100, 0x4140, \
                0x0000, (short)0xBF80, (short)0xC000, (short)0xC040, (short)0xC080, (short)0xC0C0, (short)0xC100, (short)0xC140

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
    UNROLL for (int r = 0; r < 4; r++) out[r] = _mm512_reduce_add_ps(a[r]);
}

/* MXFP4 x BF16 activations, T = 1: per 16 blocks of a row, the exponent increments
 * (e - 128) << 7 are computed in one vector step and stored as doubled 16-bit words so that
 * the inner loop broadcasts them with a plain 32-bit load; blocks with e < 2 or e > 252
 * (values not normal BF16) are flagged and take the exact scalar path. */
INLINE void mx_kw16(const uint8_t *p, int32_t *kw, uint32_t *exc) {
    const __m512i idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        127, 110, 93, 76, 59, 42, 25, 8, 119, 102, 85, 68, 51, 34, 17, 0);
    __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)p), idx,
                                          _mm512_loadu_si512((const void *)(p + 64)));
    __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(p + 128)), idx,
                                          _mm512_loadu_si512((const void *)(p + 192)));
    __m512i e = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(_mm512_mask_blend_epi8((__mmask64)0xFF00, lo, hi)));
    __m512i k = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(128)), 7),
                                 _mm512_set1_epi32(0xFFFF));
    _mm512_storeu_si512((void *)kw, _mm512_or_si512(k, _mm512_slli_epi32(k, 16)));
    *exc = (uint32_t)(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)) | _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(252)));
}

/* 16 blocks x MXR rows of xb_mx_t1; `masked` is a compile-time constant after inlining. */
#define MXR 4
INLINE void mx_t1_group(const uint8_t *const *wr, const uint16_t *x, int64_t g, __m512i base, int32_t (*kw)[16],
                        const uint32_t *exc, __m512 *a, const int masked) {
    for (int b = 0; b < 16; b++) {
        __m512i xv = _mm512_loadu_si512((const void *)(x + (g + b) * 32));
        UNROLL for (int r = 0; r < MXR; r++) {
            const uint8_t *p = wr[r] + (g + b) * 17;
            _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
            __m512i wv = mx_decode_bf16(p, base, _mm512_set1_epi32(kw[r][b]), !masked || !((exc[r] >> b) & 1));
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(wv), as_bh(xv));
        }
    }
}

/* One accumulator per row (blocks in order), exceptional blocks added exactly per chunk:
 * the operations of the T > 1 path (an MXFP4 panel decoded to BF16, then xb_bf16_tile),
 * for batch invariance; only the scale preparation differs, which changes no value. */
INLINE void xb_mx_t1(const uint8_t *const *wr, const uint16_t *x, int64_t g0, int64_t g1, float *out) {
    static const short kv_bf16[32] __attribute__((aligned(64))) = {KV_BF16, KV_BF16};
    const __m512i base = _mm512_load_si512((const void *)kv_bf16);
    __m512 a[MXR];
    uint32_t any_exc = 0;
    UNROLL for (int r = 0; r < MXR; r++) a[r] = _mm512_setzero_ps();
    int64_t g = g0;
    for (; g + 16 <= g1; g += 16) {
        int32_t kw[MXR][16];
        uint32_t exc[MXR], exc_any = 0;
        UNROLL for (int r = 0; r < MXR; r++) {
            mx_kw16(wr[r] + g * 17, kw[r], &exc[r]);
            any_exc |= exc[r] ? 1u << r : 0;
            exc_any |= exc[r];
        }
        /* the common case (no exceptional block among these 16 x MXR) runs without per-block
         * masks; otherwise exceptional blocks are zeroed here and added exactly afterwards */
        if (!exc_any) mx_t1_group(wr, x, g, base, kw, exc, a, 0);
        else mx_t1_group(wr, x, g, base, kw, exc, a, 1);
    }
    for (; g < g1; g++) {
        __m512i xv = _mm512_loadu_si512((const void *)(x + g * 32));
        UNROLL for (int r = 0; r < MXR; r++) {
            const uint8_t *p = wr[r] + g * 17;
            int e = p[0];
            int bad = e < 2 || e > 252;
            any_exc |= bad ? 1u << r : 0;
            __m512i wv = mx_decode_bf16(p, base, _mm512_set1_epi16((short)((e - 128) * 128)), !bad);
            a[r] = _mm512_dpbf16_ps(a[r], as_bh(wv), as_bh(xv));
        }
    }
    UNROLL for (int r = 0; r < MXR; r++) {
        double v = (double)_mm512_reduce_add_ps(a[r]);
        if (any_exc >> r & 1) v += mx_row_exceptions(wr[r], x, g0, g1);
        out[r] = (float)v;
    }
}

/* Decodes blocks [g0, g1) of one MXFP4 row into BF16 (dst[(g - g0) * 32 ...]); exceptional
 * blocks (scale outside [2, 252]) become zeros. Returns 1 if there was any. */
INLINE int mx_panel_row(const uint8_t *row, int64_t g0, int64_t g1, uint16_t *dst) {
    static const short kv_bf16[32] __attribute__((aligned(64))) = {KV_BF16, KV_BF16};
    const __m512i base = _mm512_load_si512((const void *)kv_bf16);
    int any = 0;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *p = row + g * 17;
        int e = p[0], bad = e < 2 || e > 252;
        any |= bad;
        _mm512_storeu_si512((void *)(dst + (g - g0) * 32),
                            mx_decode_bf16(p, base, _mm512_set1_epi16((short)((e - 128) * 128)), !bad));
    }
    return any;
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
        else TN_LOOP(uint16_t, TILE, XRB, XTB, XTC, XKC / 32);                                 \
    }

XMATMUL(xmm_bf16, xb_bf16_tile, 4, 4, xb_bf16_t1, 1)
XMATMUL(xmm_mx_t1only, xb_bf16_tile, 4, 4, xb_mx_t1, 1) /* its T > 1 branch is never used */

/* MXFP4 x BF16 activations. T = 1: xb_mx_t1 on far-apart row streams. T > 1: per token chunk,
 * K chunk and 4 rows, the weights are decoded once into a BF16 panel (16 KiB, L1) and the
 * BF16 tile runs over it for every 4 tokens of the chunk: the decode is amortized over up to
 * XTC tokens, and each output gets exactly the operations of xb_mx_t1 (one chain, blocks in
 * order, exceptional blocks zero in the dot and added exactly per chunk). */
static void xmm_mxfp4(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                      int64_t r1) {
    if (r1 <= r0 || T <= 0) return;
    if (T == 1 || w->n_in % 32 != 0 || w->n_in > 16384) {
        xmm_mx_t1only(w, x, T, y, ldy, r0, r1);
        return;
    }
    _Alignas(64) uint16_t panel[4][XKC];
    const int64_t ng = w->n_in / 32, kcg = XKC / 32;
    for (int64_t tc = 0; tc < T; tc += XTC) {
        int64_t tc1 = tc + XTC < T ? tc + XTC : T;
        for (int64_t g0 = 0; g0 < ng; g0 += kcg) {
            int64_t g1 = g0 + kcg < ng ? g0 + kcg : ng;
            int64_t rr[4], len = t1_stream_len(r0, r1, 4, 1);
            for (int64_t k = 0; k < len; k++) {
                const uint8_t *wr[4], *pr[4];
                int exc[4];
                t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
                for (int i = 0; i < 4; i++) {
                    /* rows past r1 repeat row r1 - 1 (results dropped): decode it once */
                    exc[i] = rr[i] >= 0 || i == 0 ? mx_panel_row(wr[i], g0, g1, panel[i]) : exc[i - 1];
                    if (rr[i] < 0 && i > 0) memcpy(panel[i], panel[i - 1], (size_t)(g1 - g0) * 64);
                    pr[i] = (const uint8_t *)panel[i];
                }
                for (int64_t t = tc; t < tc1; t += 4) {
                    const uint16_t *xt[4];
                    float out[16];
                    for (int j = 0; j < 4; j++) xt[j] = x + (t + j < tc1 ? t + j : tc1 - 1) * w->n_in + g0 * 32;
                    xb_bf16_tile(pr, xt, 0, g1 - g0, out);
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4 && rr[i] >= 0 && t + j < tc1; j++) {
                            double v = (double)out[i * 4 + j];
                            if (exc[i]) v += mx_row_exceptions(wr[i], x + (t + j) * w->n_in, g0, g1);
                            float *yy = &y[(t + j) * ldy + rr[i]];
                            *yy = g0 == 0 ? (float)v : *yy + (float)v;
                        }
                }
            }
        }
    }
}

/* BF16 activations for weight types without a BF16-dot tile: widen a few tokens at a time
 * into a stack buffer and run the fp32 kernel (same numbers, exact widening). */
#define XWIDEN(NAME, FP32)                                                                     \
    static void NAME(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,   \
                     int64_t r0, int64_t r1) {                                                 \
        if (r1 <= r0 || T <= 0) return;                                                        \
        if (w->n_in > 16384 || w->n_in % 32 != 0) {                                            \
            matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);                                     \
            return;                                                                            \
        }                                                                                      \
        float buf[16384];                                                                      \
        int64_t per = 16384 / w->n_in;                                                         \
        for (int64_t t0 = 0; t0 < T; t0 += per) {                                              \
            int64_t nb = T - t0 < per ? T - t0 : per;                                          \
            for (int64_t i = 0; i < nb * w->n_in; i++) {                                       \
                uint32_t u = (uint32_t)x[t0 * w->n_in + i] << 16;                              \
                memcpy(&buf[i], &u, 4);                                                        \
            }                                                                                  \
            FP32(w, buf, nb, y + t0 * ldy, ldy, r0, r1);                                       \
        }                                                                                      \
    }
XWIDEN(xw_f32, mm_f32)
XWIDEN(xw_f16, mm_f16)
XWIDEN(xw_q8_0, mm_q8_0)

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
        [GGML_TYPE_MXFP4] = xmm_mxfp4,
    },
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
