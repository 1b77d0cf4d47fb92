/* iq2_avx512.c: AVX-512 matmul kernels for IQ2_XXS, IQ2_XS, IQ2_S and IQ4_XS weights, both
 * activation families (fp32: mm_*_avx512; BF16: xmm_*_avx512), decode (T = 1) and prefill
 * (T > 1). Compiled with the Makefile's AVX512_FLAGS only; the entries sit in kernels_avx512
 * (matmul_avx512.c) and run only where select.c chose that table.
 *
 * Owns: the super-block decoders of these four types and their tiles. Must not: allocate (the
 * panels and the permuted activations are on the stack), call select.c, or round an activation.
 * Rows whose n_in is not a multiple of 256 or is above 16384 go to the scalar twins.
 *
 * Numerics (factoring): a weight is m * q with q a small signed integer (IQ2: +-8, 25 or 43, a
 * grid value with its sign; IQ4_XS: a kvalues_iq4nl entry) and m the multiplier of its group
 * of 32 (IQ2_XXS, IQ4_XS) or 16 (IQ2_XS, IQ2_S) weights: d * (0.5 + s) * 0.25 or d * (ls - 32),
 * both exact in fp32 (an f16 times a 5- or 6-bit integer). The q become BF16 words (exact) and
 * meet the activations in dot lanes (lane l: words 2l, 2l + 1): vdpbf16ps for BF16 activations
 * (exact products, fp32 sums), or for fp32 ones the words' even and odd halves widened to fp32
 * (exact) and two FMAs. The lane sums P are then scaled by the lanes' multipliers S with one
 * FMA into the accumulator: acc = fma(P, S, acc). So each output differs from the exact sum
 * only by fp32 summation order, as the other kernels of the table. Two layouts:
 * - per group (IQ2_XS, IQ2_S): a super-block decodes to W_g (the 32 q of group g, in order) and
 *   S_g (lanes 0-7: elements 0-15's multiplier, lanes 8-15: 16-31's); per group P from zero,
 *   then the FMA. The grid entries come from plain 8-byte loads (vpgatherqq was ~1.5x slower).
 * - one lane pair per group (IQ2_XXS, IQ4_XS: one multiplier per 32 weights): 8 dots per
 *   super-block, each taking 4 elements of every group, into P from zero, then one FMA for the
 *   8 multipliers; the activations are permuted to match (perm_x, perm_xf), once per call for
 *   T = 1 and per chunk for T > 1. See "lane per group" below.
 *
 * Batch invariance: every output y[t][r] is, for both families, the sum over K chunks of KB
 * super-blocks (in chunk order) of red4's lane tree over one accumulator that runs the
 * operations above in order, whatever T, the tile and the row range: the T = 1 tiles decode
 * each super-block on the fly; T > 1 decodes a row tile's K chunk once into a panel (the BF16
 * weight words and S) and runs each token tile over it with the same operations. */
#include "kernels/iq2k.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/grids.h"
#include "kernels/tile512.h"

#define QK 256      /* weights per super-block */
#define KB 4        /* K chunk in super-blocks (1024 weights), every T, both families */
#define ITC 64      /* tokens per chunk (T > 1): the chunk's activations stay in L2 */
#define IQ_MAX_IN 16384

/* ---- decoders (per group layout): one super-block -> W[8] (BF16 q) and S[8] (lane multipliers) ---- */

/* A 32-entry BF16 table from 32 floats that BF16 holds exactly. */
INLINE __m512i bf16_table(const float *t) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(t + 16), _mm512_loadu_ps(t));
}

/* IQ2 grid bytes are 8, 25 or 43: their low 5 bits (8, 25, 11) index the BF16 values. */
static const float iq2_vals[32] = {[8] = 8.0f, [25] = 25.0f, [11] = 43.0f};
static const float iq4_vals[32] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                   -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ2_XXS: grid_iq2xxs as 2-bit codes 0, 1, 2 (values 8, 25, 43): [0][i] elements 0-3 of entry i,
 * [1][i] elements 4-7, element j in bits 2(j % 4). Derived from grids.json's iq2xxs_grid (the
 * fixture tests decode every entry through it). */
static const uint8_t iq2xxs_codes[2][256] __attribute__((aligned(64))) = {
  {
    0x00, 0x02, 0x05, 0x08, 0x0A, 0x11, 0x14, 0x20, 0x22, 0x28, 0x2A, 0x41, 0x44, 0x50, 0x58, 0x61,
    0x64, 0x80, 0x82, 0x8A, 0xA2, 0x01, 0x04, 0x10, 0x15, 0x40, 0x84, 0x98, 0x00, 0x02, 0x22, 0x82,
    0x01, 0x04, 0x10, 0x21, 0x24, 0x40, 0x42, 0x48, 0x60, 0x81, 0x84, 0x90, 0xA4, 0x00, 0x02, 0x08,
    0x20, 0x46, 0x69, 0x80, 0x91, 0x09, 0x10, 0x40, 0x84, 0xA4, 0x00, 0x05, 0x08, 0x14, 0x28, 0x41,
    0x44, 0x50, 0x52, 0x88, 0x04, 0x40, 0x02, 0x14, 0x01, 0x04, 0x10, 0x21, 0x40, 0x60, 0x84, 0x90,
    0x95, 0x00, 0x08, 0x20, 0x50, 0x5A, 0x80, 0x24, 0x45, 0x00, 0x08, 0x20, 0x25, 0x49, 0x80, 0x18,
    0x62, 0x00, 0x16, 0x01, 0x04, 0x10, 0x40, 0x81, 0x00, 0x05, 0xA0, 0x51, 0x00, 0x02, 0x0A, 0x44,
    0x61, 0x80, 0x82, 0x29, 0x48, 0x00, 0x02, 0x01, 0x04, 0x10, 0x40, 0x56, 0x00, 0x41, 0x64, 0x90,
    0x08, 0x20, 0x94, 0x44, 0x01, 0x04, 0x10, 0x18, 0x21, 0x24, 0x40, 0x48, 0x56, 0x60, 0x81, 0x84,
    0x90, 0x00, 0x20, 0x61, 0x80, 0x85, 0x01, 0x10, 0x48, 0x56, 0x68, 0x00, 0x08, 0x20, 0x80, 0x99,
    0x12, 0x24, 0x00, 0x01, 0x04, 0x10, 0x40, 0x45, 0x00, 0x58, 0x61, 0x82, 0x45, 0x90, 0x00, 0x08,
    0x11, 0x19, 0x20, 0x80, 0x88, 0x04, 0x42, 0xA4, 0x91, 0x90, 0x92, 0x0A, 0x01, 0x54, 0x00, 0x11,
    0x19, 0x64, 0x40, 0x08, 0x04, 0x10, 0x40, 0x68, 0x00, 0x55, 0x18, 0x60, 0x00, 0x05, 0x10, 0x12,
    0x84, 0x42, 0x00, 0x02, 0x0A, 0x41, 0x82, 0x04, 0x18, 0x40, 0x11, 0x01, 0x04, 0x10, 0x15, 0x40,
    0x60, 0x00, 0x46, 0x94, 0x09, 0x40, 0x60, 0x02, 0x04, 0x11, 0x04, 0x10, 0x24, 0x40, 0xA1, 0x16,
    0x80, 0x45, 0x00, 0x22, 0x44, 0x51, 0x81, 0x20, 0x02, 0x50, 0x85, 0x09, 0x00, 0x18, 0x50, 0x04,
  }, {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x02, 0x02, 0x02, 0x02,
    0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x05, 0x05, 0x05,
    0x05, 0x05, 0x05, 0x05, 0x05, 0x06, 0x06, 0x06, 0x06, 0x06, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08,
    0x08, 0x08, 0x08, 0x08, 0x09, 0x09, 0x0A, 0x0A, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
    0x10, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x12, 0x12, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x15,
    0x15, 0x16, 0x16, 0x18, 0x18, 0x18, 0x18, 0x18, 0x19, 0x19, 0x19, 0x1A, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x21, 0x21, 0x22, 0x22, 0x24, 0x24, 0x24, 0x24, 0x24, 0x25, 0x25, 0x25, 0x26,
    0x28, 0x28, 0x28, 0x2A, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x42, 0x42, 0x42, 0x42, 0x42, 0x44, 0x44, 0x44, 0x44, 0x44,
    0x45, 0x45, 0x46, 0x48, 0x48, 0x48, 0x48, 0x48, 0x49, 0x49, 0x49, 0x49, 0x4A, 0x4A, 0x50, 0x50,
    0x50, 0x50, 0x50, 0x50, 0x50, 0x51, 0x51, 0x51, 0x52, 0x54, 0x54, 0x55, 0x56, 0x56, 0x58, 0x58,
    0x58, 0x58, 0x59, 0x5A, 0x60, 0x60, 0x60, 0x60, 0x61, 0x61, 0x62, 0x62, 0x64, 0x64, 0x65, 0x65,
    0x65, 0x68, 0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x81, 0x81, 0x82, 0x84, 0x84, 0x84, 0x84, 0x84,
    0x84, 0x85, 0x85, 0x85, 0x86, 0x86, 0x86, 0x88, 0x89, 0x8A, 0x90, 0x90, 0x90, 0x90, 0x90, 0x91,
    0x91, 0x92, 0x94, 0x94, 0x94, 0x95, 0x98, 0x99, 0xA0, 0xA0, 0xA0, 0xA1, 0xA2, 0xA4, 0xA8, 0xA9,
  }};

/* The 256-byte table t at the byte indices of idx. */
INLINE __m512i lut256(const uint8_t *t, __m512i idx) {
    __m512i a = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)t), idx, _mm512_load_si512((const void *)(t + 64)));
    __m512i b = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)(t + 128)), idx,
                                         _mm512_load_si512((const void *)(t + 192)));
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), a, b);
}

INLINE float f16at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 32 grid bytes (4 sub-groups) -> BF16 words; bit e of m negates element e (adding 0x8000 flips
 * the BF16 sign bit). */
INLINE __m512i iq2_expand(__m256i g8, uint32_t m, __m512i tb) {
    __m512i w = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(g8), tb);
    return _mm512_mask_add_epi16(w, _cvtu32_mask32(m), w, _mm512_set1_epi16((short)0x8000));
}

/* 7-bit selectors (bytes of sel; bit 7 ignored) -> sign masks (grid_iq2_signs), byte for byte. */
INLINE __m512i iq2_signs(__m512i sel) {
    return _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)grid_iq2_signs), sel,
                                    _mm512_loadu_si512((const void *)(grid_iq2_signs + 64)));
}

/* IQ2_XS/IQ2_S: the 16 multipliers d * (0.5 + s) * 0.25 of a super-block's halves of groups
 * (lane 2g: low nibble of sc[g], elements 0-15; lane 2g + 1: high nibble) -> S[g]. */
INLINE void iq2_scales16(const uint8_t *sc, float d, __m512 *S) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)sc);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    __m512 m = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_add_ps(f, _mm512_set1_ps(0.5f))), _mm512_set1_ps(0.25f));
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    UNROLL for (int g = 0; g < 8; g++) S[g] = _mm512_permutexvar_ps(_mm512_add_epi32(half, _mm512_set1_epi32(2 * g)), m);
}

/* The 8 grid entries ix[0..7] as qwords (plain loads: a gather is much slower here). */
INLINE __m512i grid8q(const uint64_t *grid, const uint16_t *ix) {
    return _mm512_set_epi64((long long)grid[ix[7]], (long long)grid[ix[6]], (long long)grid[ix[5]], (long long)grid[ix[4]],
                            (long long)grid[ix[3]], (long long)grid[ix[2]], (long long)grid[ix[1]], (long long)grid[ix[0]]);
}

/* IQ2_XS {f16 d; u16 qs[32]; u8 scales[8]}: word = 9-bit index | 7-bit sign selector << 9. */
INLINE void sb_iq2_xs(const uint8_t *b, __m512i *W, __m512 *S) {
    const __m512i tb = bf16_table(iq2_vals);
    const __m512i V = _mm512_loadu_si512((const void *)(b + 2)); /* word i: sub-group i */
    uint32_t m[16];
    _mm512_storeu_si512((void *)m, iq2_signs(_mm512_zextsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(V, 9)))));
    iq2_scales16(b + 66, f16at(b), S);
    uint16_t ix[32];
    _mm512_storeu_si512((void *)ix, _mm512_and_si512(V, _mm512_set1_epi16(511)));
    UNROLL for (int p = 0; p < 4; p++) {
        __m512i q = grid8q(grid_iq2xs, ix + 8 * p);
        W[2 * p] = iq2_expand(_mm512_castsi512_si256(q), m[2 * p], tb);
        W[2 * p + 1] = iq2_expand(_mm512_extracti64x4_epi64(q, 1), m[2 * p + 1], tb);
    }
}

/* IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: index = qs[4g+k] | bits 2k..
 * of qh[g] << 8; the sign bytes are the masks. */
INLINE void sb_iq2_s(const uint8_t *b, __m512i *W, __m512 *S) {
    const __m512i tb = bf16_table(iq2_vals);
    const __m512i V = _mm512_loadu_si512((const void *)(b + 2)); /* qs, then the sign bytes */
    const __m512i H = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(const void *)(b + 66)));
    uint32_t m[16];
    _mm512_storeu_si512((void *)m, V);
    iq2_scales16(b + 74, f16at(b), S);
    /* word i: qs[i] | (qh[i / 4] >> 2(i % 4) & 3) << 8 */
    const __m512i hpos = _mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i hsh = _mm512_set_epi16(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0);
    __m512i hw = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(hpos, _mm512_cvtepu8_epi16(_mm512_castsi512_si256(H))), hsh),
                                  _mm512_set1_epi16(3));
    uint16_t ix[32];
    _mm512_storeu_si512((void *)ix, _mm512_or_si512(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(V)), _mm512_slli_epi16(hw, 8)));
    UNROLL for (int p = 0; p < 4; p++) {
        __m512i q = grid8q(grid_iq2s, ix + 8 * p);
        W[2 * p] = iq2_expand(_mm512_castsi512_si256(q), m[8 + 2 * p], tb);
        W[2 * p + 1] = iq2_expand(_mm512_extracti64x4_epi64(q, 1), m[9 + 2 * p], tb);
    }
}

/* ---- tiles ---- */

/* A row tile's K chunk decoded (T > 1): 4 rows x KB super-blocks x 8 groups. */
typedef struct {
    __m512i w[4][KB * 8];
    __m512 s[4][KB * 8];
} iq_panel;

/* One group of the fp32 family: the even and odd elements of W (BF16 -> fp32 is exact), against
 * the activations' even (xe) and odd (xo) elements. */
INLINE __m512 f32_group(__m512i w, __m512 xe, __m512 xo, __m512 s, __m512 acc) {
    __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
    return _mm512_fmadd_ps(_mm512_fmadd_ps(wo, xo, _mm512_mul_ps(we, xe)), s, acc);
}

INLINE __m512 x16_group(__m512i w, __m512i x, __m512 s, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w, (__m512bh)x), s, acc);
}

/* The activations of one group, even elements then odd ones (xp: 16 + 16 floats). */
INLINE void split_x(const float *x, __m512 *xe, __m512 *xo) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    *xe = _mm512_permutex2var_ps(a, ie, b);
    *xo = _mm512_permutex2var_ps(a, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), b);
}

/* T > 1: 4 rows (panel) x 4 tokens over ng groups; out[t * 4 + r]. xbf16: xt are BF16 rows,
 * else fp32 rows (split per group, as split_x). */
INLINE void n_tile(const iq_panel *pn, const void *const *xt, int ng, float *out, const int xbf16) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i xv[4];
        __m512 xe[4], xo[4];
        UNROLL for (int t = 0; t < 4; t++) {
            if (xbf16) xv[t] = _mm512_loadu_si512((const void *)((const uint16_t *)xt[t] + 32 * g));
            else split_x((const float *)xt[t] + 32 * g, &xe[t], &xo[t]);
        }
        UNROLL for (int r = 0; r < 4; r++) {
            __m512i w = pn->w[r][g];
            __m512 s = pn->s[r][g];
            UNROLL for (int t = 0; t < 4; t++)
                a[r][t] = xbf16 ? x16_group(w, xv[t], s, a[r][t]) : f32_group(w, xe[t], xo[t], s, a[r][t]);
        }
    }
    red4x4(a, out);
}
static void xn_tile(const iq_panel *pn, const void *const *xt, int ng, float *out) { n_tile(pn, xt, ng, out, 1); }
static void fn_tile(const iq_panel *pn, const void *const *xt, int ng, float *out) { n_tile(pn, xt, ng, out, 0); }

/* Per type: the decode tiles (T = 1; x: BF16 natural, or fp32 split per group by split_x into
 * xp) and the panel decoder (T > 1). */
#define IQ_TILES(NAME, SB, BB)                                                                                   \
    INLINE void NAME##_1(const uint8_t *const *wr, const void *xv, int64_t b0, int64_t b1, float *out,           \
                         const int xbf16) {                                                                      \
        __m512 a[4];                                                                                             \
        UNROLL for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();                                          \
        for (int64_t b = b0; b < b1; b++) {                                                                      \
            UNROLL for (int r = 0; r < 4; r++) {                                                                 \
                __m512i W[8];                                                                                    \
                __m512 S[8];                                                                                     \
                for (int ln_ = 0; ln_ < (BB); ln_ += 64) /* every line of the block */                          \
                    _mm_prefetch((const char *)(wr[r] + b * (BB) + PF_DIST + ln_), _MM_HINT_T0);                \
                SB(wr[r] + b * (BB), W, S);                                                                      \
                UNROLL for (int g = 0; g < 8; g++) {                                                             \
                    const int64_t e = b * QK + 32 * g;                                                           \
                    if (xbf16) a[r] = x16_group(W[g], _mm512_loadu_si512((const uint16_t *)xv + e), S[g], a[r]); \
                    else                                                                                         \
                        a[r] = f32_group(W[g], _mm512_loadu_ps((const float *)xv + e),                           \
                                         _mm512_loadu_ps((const float *)xv + e + 16), S[g], a[r]);               \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        red4(a, out);                                                                                            \
    }                                                                                                            \
    static void NAME##_x1(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out) {        \
        NAME##_1(wr, x, b0, b1, out, 1);                                                                         \
    }                                                                                                            \
    static void NAME##_f1(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out) {        \
        NAME##_1(wr, x, b0, b1, out, 0);                                                                         \
    }                                                                                                            \
    static void NAME##_panel(const uint8_t *const *wr, int64_t b0, int64_t b1, iq_panel *pn) {                  \
        UNROLL for (int r = 0; r < 4; r++)                                                                       \
            for (int64_t b = b0; b < b1; b++) SB(wr[r] + b * (BB), pn->w[r] + (b - b0) * 8, pn->s[r] + (b - b0) * 8); \
    }

/* x1/f1: the decode tiles; panel: the T > 1 panel; xu1, fu1, upanel (or NULL): the decode tiles
 * and the panel in the lane-per-group layout (x permuted by perm_x / perm_xf first). */
typedef struct {
    void (*x1)(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out);
    void (*f1)(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out);
    void (*panel)(const uint8_t *const *wr, int64_t b0, int64_t b1, iq_panel *pn);
    void (*xu1)(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out);
    void (*fu1)(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out);
    void (*upanel)(const uint8_t *const *wr, int64_t b0, int64_t b1, iq_panel *pn);
    const uint16_t *xperm; /* perm_x's word permutation for xu1/upanel */
} iq_ops;

IQ_TILES(iq2_xs, sb_iq2_xs, 74)
IQ_TILES(iq2_s, sb_iq2_s, 82)

/* ---- lane per group (IQ2_XXS, IQ4_XS) ----
 * A super-block's 8 dots each take 4 elements of every group: in dot c = 4h + j, qword q
 * (lanes 2q, 2q + 1: group q) holds 4 elements of group q's half h. The products of a lane
 * pair all share the group's multiplier, so the 8 dots run into P from zero and one FMA
 * applies the 8 multipliers (S: lanes 2q, 2q + 1 = group q's) per super-block. The weights
 * come from two vectors N_h of 4-bit codes (qword q: 16 codes of group q's half h, code n in
 * bits 4n): dot c's words are N_h >> 4j (word m: code 4m + j) through a 16-entry vpermw table
 * (bit 4, the next code's, is ignored). IQ2_XXS: code = grid code | sign << 2 of element
 * 16h + n (iq2_xxs_nib); IQ4_XS: the qs nibbles as they lie (iq4_xs_nib). The activations
 * are permuted to match (word 4c + m of a group's copy: its element behind code 4m + j of
 * half h; xperm tables). Per super-block and row: 8 vpermw, 6 shifts, 8 dots and one FMA,
 * plus the decode of N_h and S, which for IQ2_XXS takes two rows at a time (their 64 indices
 * and selectors share the table lookups). With the weights in L2 the BF16 family is bound by
 * the shuffle and dot pipes: per 32 weights one vpermw and one vdpbf16ps at least, plus
 * (IQ2_XXS) about one more shuffle of decode. */

/* 16-bit word 4j + m of group q's permuted copy <- element 16h + 4m + j (per half h) */
static const uint16_t iq2xxs_xperm[32] __attribute__((aligned(64))) = {
    0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 16, 20, 24, 28, 17, 21, 25, 29, 18, 22, 26, 30, 19, 23, 27, 31};

/* IQ4_XS (iq4_xs_nib): word 4c + m <- element 8h + 2m + j / 2 + 16 (j % 2), c = 4h + j */
static const uint16_t iq4xs_xperm[32] __attribute__((aligned(64))) = {
    0, 2, 4, 6, 16, 18, 20, 22, 1, 3, 5, 7, 17, 19, 21, 23, 8, 10, 12, 14, 24, 26, 28, 30, 9, 11, 13, 15, 25, 27, 29, 31};

/* xp (nb super-blocks): super-block b's dot c at xp + 256b + 32c, its qword q from group q
 * (words 4c .. 4c + 3 of group q permuted by perm). */
static void perm_x(const uint16_t *x, int64_t nb, uint16_t *xp, const uint16_t *perm) {
    const __m512i pi = _mm512_load_si512((const void *)perm);
    for (int64_t b = 0; b < nb; b++) {
        uint64_t t[8][8];
        for (int q = 0; q < 8; q++)
            _mm512_storeu_si512((void *)t[q], _mm512_permutexvar_epi16(pi, _mm512_loadu_si512((const void *)(x + 256 * b + 32 * q))));
        uint64_t *o = (uint64_t *)(void *)(xp + 256 * b);
        for (int c = 0; c < 8; c++)
            for (int q = 0; q < 8; q++) o[8 * c + q] = t[q][c];
    }
}

/* The same for fp32 activations, each dot's 32 split into its words' even positions (the
 * lanes' first elements) then odd ones, as f32_group splits the weights. */
static void perm_xf(const float *x, int64_t nb, float *xp, const uint16_t *perm) {
    for (int64_t b = 0; b < nb; b++)
        for (int c = 0; c < 8; c++)
            for (int q = 0; q < 8; q++)
                for (int m = 0; m < 4; m++) xp[256 * b + 32 * c + 16 * (m & 1) + 2 * q + (m >> 1)] = x[256 * b + 32 * q + perm[4 * c + m]];
}

/* the sub-group indices of two rows' super-blocks: byte 16L + 8t + 4m + k (L < 4, m < 2) <-
 * row t's group 2L + m, index k, so that unpacklo (row 0) and unpackhi (row 1) of the two code
 * bytes give each group's code qword in qword q */
#define IQ2L(L, t) 64 * (t) + 16 * (L), 64 * (t) + 16 * (L) + 1, 64 * (t) + 16 * (L) + 2, 64 * (t) + 16 * (L) + 3, \
                   64 * (t) + 16 * (L) + 8, 64 * (t) + 16 * (L) + 9, 64 * (t) + 16 * (L) + 10, 64 * (t) + 16 * (L) + 11
static const uint8_t iq2xxs_idx_lane[64] __attribute__((aligned(64))) = {
    IQ2L(0, 0), IQ2L(0, 1), IQ2L(1, 0), IQ2L(1, 1), IQ2L(2, 0), IQ2L(2, 1), IQ2L(3, 0), IQ2L(3, 1)};
#undef IQ2L

/* byte b of qword q of N_h: elements 16h + 2b, + 1 of group q. Codes: bits 32h + 4b.. of the
 * code qword (into bits 0-3); signs: bits 16h + 2b.. of the sign dword, into bits 4-5 (the
 * multishift rotates, so the offset 16h + 2b - 4 is taken mod 64). */
#define IQ2XXS_CB(h) ((uint64_t)(32 * (h)) * 0x0101010101010101ull + 0x1C1814100C080400ull)
#define IQ2XXS_SB(h) (((uint64_t)(16 * (h)) * 0x0101010101010101ull + 0x0A08060402003E3Cull) & 0x3F3F3F3F3F3F3F3Full)

/* (c0 | c1 << 2 | s0 << 4 | s1 << 5) -> nibbles (c0 | s0 << 2) | (c1 | s1 << 2) << 4 */
static const uint8_t iq2xxs_nib[64] __attribute__((aligned(64))) = {
#define IQ2N(i) (uint8_t)(((i) & 3) | ((i) >> 4 & 1) << 2 | (((i) >> 2 & 3) | ((i) >> 5 & 1) << 2) << 4)
#define IQ2N8(i) IQ2N(i), IQ2N(i + 1), IQ2N(i + 2), IQ2N(i + 3), IQ2N(i + 4), IQ2N(i + 5), IQ2N(i + 6), IQ2N(i + 7)
    IQ2N8(0), IQ2N8(8), IQ2N8(16), IQ2N8(24), IQ2N8(32), IQ2N8(40), IQ2N8(48), IQ2N8(56)};
#undef IQ2N8
#undef IQ2N

/* nibble (code | sign << 2; bit 3 zero) -> BF16 of +-8, 25, 43 */
static const float iq2_nib_vals[32] = {8, 25, 43, 0, -8, -25, -43, 0, 8, 25, 43, 0, -8, -25, -43, 0,
                                       8, 25, 43, 0, -8, -25, -43, 0, 8, 25, 43, 0, -8, -25, -43, 0};

/* The IQ2_XXS super-blocks of two rows (p[0], p[1]) -> N[2t + h] and S[t] (row t's lane
 * multipliers); the two rows share the table lookups (64 indices, 64 selectors at a time). */
INLINE void iq2_xxs_nib2(const uint8_t *const *p, __m512i *N, __m512 *S) {
    const __m512i G[2] = {_mm512_loadu_si512((const void *)(p[0] + 2)), _mm512_loadu_si512((const void *)(p[1] + 2))};
    const __m512i idx = _mm512_permutex2var_epi8(G[0], _mm512_load_si512((const void *)iq2xxs_idx_lane), G[1]);
    const __m512i lo = lut256(iq2xxs_codes[0], idx), hi = lut256(iq2xxs_codes[1], idx);
    const __m512i cq[2] = {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
    /* sign masks: qword q of sg = row 0's group q mask, then row 1's (the selectors at bits
     * 32 + 7k of qword q into bytes 0-3, resp. 4-7) */
    const __m512i sg = iq2_signs(_mm512_mask_blend_epi8(0xF0F0F0F0F0F0F0F0ull, _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720ll), G[0]),
                                                        _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E272000000000ll), G[1])));
    const __m512i nt = _mm512_load_si512((const void *)iq2xxs_nib);
    /* the scale s (bits 60-63 of qword q) into the low bits of dwords 2q and 2q + 1, then
     * (0.5 + s) * 0.25 from a table and d * that: d * (0.5 + s) * 0.25 exactly (both exact) */
    const __m512 m = _mm512_setr_ps(0.125f, 0.375f, 0.625f, 0.875f, 1.125f, 1.375f, 1.625f, 1.875f, 2.125f, 2.375f,
                                    2.625f, 2.875f, 3.125f, 3.375f, 3.625f, 3.875f);
    UNROLL for (int t = 0; t < 2; t++) {
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i c = _mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)IQ2XXS_CB(h)), cq[t]);
            __m512i s = _mm512_multishift_epi64_epi8(
                _mm512_set1_epi64((long long)((IQ2XXS_SB(h) + 0x2020202020202020ull * (uint64_t)t) & 0x3F3F3F3F3F3F3F3Full)), sg);
            N[2 * t + h] = _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(c, s, _mm512_set1_epi8(0x0F), 0xE4), nt);
        }
        const __m512i sc = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0000003C0000003Cll), G[t]);
        S[t] = _mm512_mul_ps(_mm512_set1_ps(f16at(p[t])), _mm512_permutexvar_ps(sc, m));
    }
}

/* dot c's weights from N (c = 4h + j) */
INLINE __m512i unit_w(const __m512i *N, int c, __m512i tb) {
    const int j = c & 3;
    return _mm512_permutexvar_epi16(j ? _mm512_srli_epi16(N[c >> 2], 4 * j) : N[c >> 2], tb);
}

/* P + one dot of the layout: BF16 activations by vdpbf16ps; fp32 ones (perm_xf) by two FMAs
 * on the weights' even and odd words widened (exactly) to fp32. x + e: the dot's activations. */
INLINE __m512 unit_dot(__m512i w, const void *x, int64_t e, __m512 P, const int xbf16) {
    if (xbf16) return _mm512_dpbf16_ps(P, (__m512bh)w, (__m512bh)_mm512_loadu_si512((const void *)((const uint16_t *)x + e)));
    const float *xf = (const float *)x + e;
    P = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_loadu_ps(xf), P);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u))),
                           _mm512_loadu_ps(xf + 16), P);
}

/* IQ4_XS in the same layout: N_h qword q = bytes 8h .. 8h + 7 of group q's qs as they are
 * (nibble n: byte n / 2, low nibble element j, high element j + 16: iq4xs_xperm), the
 * 16-entry table kvalues; S lanes 2q, 2q + 1 = group q's multiplier. */
INLINE void iq4_xs_nib(const uint8_t *b, __m512i *N, __m512 *S) {
    const __m512i z0 = _mm512_loadu_si512((const void *)(b + 8)), z1 = _mm512_loadu_si512((const void *)(b + 72));
    const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    N[0] = _mm512_permutex2var_epi64(z0, ev, z1);
    N[1] = _mm512_permutex2var_epi64(z0, _mm512_add_epi64(ev, _mm512_set1_epi64(1)), z1);
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, b + 2, 2);
    memcpy(&sl, b + 4, 4);
    const __m512i q = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)sl), _mm512_slli_epi32(q, 2)), _mm512_set1_epi32(15));
    __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(sh), _mm512_slli_epi32(q, 1)), _mm512_set1_epi32(3));
    __m512i ls = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
    *S = _mm512_mul_ps(_mm512_set1_ps(f16at(b)), _mm512_cvtepi32_ps(ls));
}

INLINE void iq4_xs_nib2(const uint8_t *const *p, __m512i *N, __m512 *S) {
    iq4_xs_nib(p[0], N, S);
    iq4_xs_nib(p[1], N + 2, S + 1);
}

/* The lane-per-group decode tile (T = 1, permuted BF16 activations) and panel (w[r][8k + c]:
 * dot c's weights of super-block b0 + k, s[r][8k] its S) of a type. */
#define UNIT_TILES(NAME, NIB2, VALS, BB)                                                                         \
    INLINE void NAME##_u1(const uint8_t *const *wr, const void *xv, int64_t b0, int64_t b1, float *out,          \
                          const int xbf16) {                                                                     \
        const __m512i tb = bf16_table(VALS);                                                                     \
        __m512 a[4];                                                                                             \
        UNROLL for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();                                          \
        for (int64_t b = b0; b < b1; b++)                                                                        \
            UNROLL for (int rp = 0; rp < 4; rp += 2) {                                                           \
                const uint8_t *p[2] = {wr[rp] + b * (BB), wr[rp + 1] + b * (BB)};                               \
                __m512i N[4];                                                                                    \
                __m512 S[2];                                                                                     \
                for (int ln_ = 0; ln_ < (BB); ln_ += 64) { /* every line of the block (IQ4_XS: 136 bytes) */     \
                    _mm_prefetch((const char *)(p[0] + PF_DIST + ln_), _MM_HINT_T0);                            \
                    _mm_prefetch((const char *)(p[1] + PF_DIST + ln_), _MM_HINT_T0);                            \
                }                                                                                                \
                NIB2(p, N, S);                                                                                   \
                UNROLL for (int t = 0; t < 2; t++) {                                                             \
                    __m512 P = _mm512_setzero_ps();                                                              \
                    UNROLL for (int c = 0; c < 8; c++) P = unit_dot(unit_w(N + 2 * t, c, tb), xv, b * QK + 32 * c, P, xbf16); \
                    a[rp + t] = _mm512_fmadd_ps(P, S[t], a[rp + t]);                                             \
                }                                                                                                \
            }                                                                                                    \
        red4(a, out);                                                                                            \
    }                                                                                                            \
    static void NAME##_xu1(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out) {       \
        NAME##_u1(wr, x, b0, b1, out, 1);                                                                        \
    }                                                                                                            \
    static void NAME##_fu1(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out) {       \
        NAME##_u1(wr, x, b0, b1, out, 0);                                                                        \
    }                                                                                                            \
    static void NAME##_upanel(const uint8_t *const *wr, int64_t b0, int64_t b1, iq_panel *pn) {                 \
        const __m512i tb = bf16_table(VALS);                                                                     \
        for (int rp = 0; rp < 4; rp += 2)                                                                        \
            for (int64_t b = b0; b < b1; b++) {                                                                  \
                const uint8_t *p[2] = {wr[rp] + b * (BB), wr[rp + 1] + b * (BB)};                               \
                __m512i N[4];                                                                                    \
                __m512 S[2];                                                                                     \
                NIB2(p, N, S);                                                                                   \
                UNROLL for (int t = 0; t < 2; t++) {                                                             \
                    pn->s[rp + t][8 * (b - b0)] = S[t];                                                          \
                    UNROLL for (int c = 0; c < 8; c++) pn->w[rp + t][8 * (b - b0) + c] = unit_w(N + 2 * t, c, tb); \
                }                                                                                                \
            }                                                                                                    \
    }
UNIT_TILES(iq2_xxs, iq2_xxs_nib2, iq2_nib_vals, 66)
UNIT_TILES(iq4_xs, iq4_xs_nib2, iq4_vals, 136)

/* T > 1 over the panel: 4 rows x 2 tokens (P and the accumulators fill the registers), the
 * operations of the decode tile; out[t * 4 + r]. xt: permuted activations (BF16 or fp32). */
INLINE void n_tile_u(const iq_panel *pn, const void *const *xt, int nsb, float *out, const int xbf16) {
    __m512 a[2][4];
    UNROLL for (int t = 0; t < 2; t++)
        UNROLL for (int r = 0; r < 4; r++) a[t][r] = _mm512_setzero_ps();
    for (int k = 0; k < nsb; k++) {
        __m512 P[2][4];
        UNROLL for (int t = 0; t < 2; t++)
            UNROLL for (int r = 0; r < 4; r++) P[t][r] = _mm512_setzero_ps();
        UNROLL for (int c = 0; c < 8; c++)
            UNROLL for (int r = 0; r < 4; r++)
                UNROLL for (int t = 0; t < 2; t++) P[t][r] = unit_dot(pn->w[r][8 * k + c], xt[t], QK * k + 32 * c, P[t][r], xbf16);
        UNROLL for (int t = 0; t < 2; t++)
            UNROLL for (int r = 0; r < 4; r++) a[t][r] = _mm512_fmadd_ps(P[t][r], pn->s[r][8 * k], a[t][r]);
    }
    red4(a[0], out);
    red4(a[1], out + 4);
}
static void xn_tile_u(const iq_panel *pn, const void *const *xt, int nsb, float *out) { n_tile_u(pn, xt, nsb, out, 1); }
static void fn_tile_u(const iq_panel *pn, const void *const *xt, int nsb, float *out) { n_tile_u(pn, xt, nsb, out, 0); }

static const iq_ops iq2_xxs_ops = {NULL, NULL, NULL, iq2_xxs_xu1, iq2_xxs_fu1, iq2_xxs_upanel, iq2xxs_xperm};
static const iq_ops iq2_xs_ops = {iq2_xs_x1, iq2_xs_f1, iq2_xs_panel, NULL, NULL, NULL, NULL};
static const iq_ops iq2_s_ops = {iq2_s_x1, iq2_s_f1, iq2_s_panel, NULL, NULL, NULL, NULL};
static const iq_ops iq4_xs_ops = {NULL, NULL, NULL, iq4_xs_xu1, iq4_xs_fu1, iq4_xs_upanel, iq4xs_xperm};

/* ---- drivers ---- */

/* T = 1: tiles of 4 rows from far-apart streams (tile512.h), K chunks of KB super-blocks, the
 * chunks' sums added in order. x: BF16 (xbf16) or the fp32 activations split per group. */
typedef void (*t1_fn)(const uint8_t *const *wr, const void *x, int64_t b0, int64_t b1, float *out);
static void iq_t1(const dsf_wmat *w, const void *x, float *y, int64_t r0, int64_t r1, t1_fn tile) {
    const int64_t nb = w->n_in / QK, len = t1_stream_len(r0, r1, 4, 1);
    const uint8_t *wr[4];
    int64_t rr[4];
    for (int64_t k = 0; k < len; k++) {
        t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
        for (int64_t b0 = 0; b0 < nb; b0 += KB) {
            float o[4];
            tile(wr, x, b0, b0 + KB < nb ? b0 + KB : nb, o);
            for (int i = 0; i < 4; i++)
                if (rr[i] >= 0) y[rr[i]] = b0 == 0 ? o[i] : y[rr[i]] + o[i];
        }
    }
}

/* T > 1: token chunks of ITC, K chunks of KB super-blocks, row tiles of 4 rows (far-apart
 * streams) decoded once into a panel, token tiles of 4 (2 in the lane-per-group layout, whose
 * activations are permuted per chunk first) over it; edge tiles repeat the last row or token
 * and drop those results. */
static void iq_tn(const dsf_wmat *w, const void *x, int xbf16, int64_t T, float *y, int64_t ldy, int64_t r0,
                  int64_t r1, const iq_ops *op) {
    const int64_t nb = w->n_in / QK, len = t1_stream_len(r0, r1, 4, 1);
    const int unit = op->upanel != NULL, tb = unit ? 2 : 4;
    iq_panel pn __attribute__((aligned(64)));
    float xpb[ITC * KB * QK] __attribute__((aligned(64))); /* 256 KiB: the permuted chunk (BF16 or fp32) */
    const uint8_t *wr[4];
    int64_t rr[4];
    for (int64_t tc = 0; tc < T; tc += ITC) {
        const int64_t tc1 = tc + ITC < T ? tc + ITC : T;
        for (int64_t b0 = 0; b0 < nb; b0 += KB) {
            const int64_t b1 = b0 + KB < nb ? b0 + KB : nb;
            for (int64_t t = tc; unit && t < tc1; t++) {
                if (xbf16) perm_x((const uint16_t *)x + t * w->n_in + b0 * QK, b1 - b0, (uint16_t *)(void *)xpb + (t - tc) * KB * QK, op->xperm);
                else perm_xf((const float *)x + t * w->n_in + b0 * QK, b1 - b0, xpb + (t - tc) * KB * QK, op->xperm);
            }
            for (int64_t k = 0; k < len; k++) {
                t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
                (unit ? op->upanel : op->panel)(wr, b0, b1, &pn);
                for (int64_t t = tc; t < tc1; t += tb) {
                    float out[16];
                    const void *xt[4];
                    for (int j = 0; j < tb; j++) {
                        int64_t tt = t + j < tc1 ? t + j : tc1 - 1, off = tt * w->n_in + b0 * QK;
                        if (unit) xt[j] = xbf16 ? (const void *)((uint16_t *)(void *)xpb + (tt - tc) * KB * QK)
                                                : (const void *)(xpb + (tt - tc) * KB * QK);
                        else xt[j] = xbf16 ? (const void *)((const uint16_t *)x + off) : (const void *)((const float *)x + off);
                    }
                    if (unit) (xbf16 ? xn_tile_u : fn_tile_u)(&pn, xt, (int)(b1 - b0), out);
                    else (xbf16 ? xn_tile : fn_tile)(&pn, xt, (int)(b1 - b0) * 8, out);
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < tb && rr[i] >= 0 && t + j < tc1; j++) {
                            float *yy = &y[(t + j) * ldy + rr[i]];
                            *yy = b0 == 0 ? out[j * 4 + i] : *yy + out[j * 4 + i];
                        }
                }
            }
        }
    }
}

INLINE int iq_guard(const dsf_wmat *w, int64_t T, int64_t r0, int64_t r1) {
    return r1 > r0 && T > 0 && w->n_in % QK == 0 && w->n_in <= IQ_MAX_IN;
}

static void iq_fp32(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                    const iq_ops *op) {
    if (!iq_guard(w, T, r0, r1)) {
        if (r1 > r0 && T > 0) matmul_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    if (T > 1) {
        iq_tn(w, x, 0, T, y, ldy, r0, r1, op);
        return;
    }
    float xp[IQ_MAX_IN] __attribute__((aligned(64))); /* each group's even elements, then its odd ones */
    if (op->fu1) {
        perm_xf(x, w->n_in / QK, xp, op->xperm);
        iq_t1(w, xp, y, r0, r1, op->fu1);
        return;
    }
    for (int64_t i = 0; i < w->n_in; i += 32) {
        __m512 xe, xo;
        split_x(x + i, &xe, &xo);
        _mm512_store_ps(xp + i, xe);
        _mm512_store_ps(xp + i + 16, xo);
    }
    iq_t1(w, xp, y, r0, r1, op->f1);
}

static void iq_xbf16(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                     const iq_ops *op) {
    if (!iq_guard(w, T, r0, r1)) {
        if (r1 > r0 && T > 0) matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    if (T > 1) iq_tn(w, x, 1, T, y, ldy, r0, r1, op);
    else if (!op->xu1) iq_t1(w, x, y, r0, r1, op->x1);
    else {
        uint16_t xp[IQ_MAX_IN] __attribute__((aligned(64)));
        perm_x(x, w->n_in / QK, xp, op->xperm);
        iq_t1(w, xp, y, r0, r1, op->xu1);
    }
}

#define IQ_ENTRIES(NAME, OPS)                                                                                       \
    void mm_##NAME##_avx512(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy, int64_t r0,    \
                            int64_t r1) {                                                                        \
        iq_fp32(w, x, T, y, ldy, r0, r1, &OPS);                                                           \
    }                                                                                                            \
    void xmm_##NAME##_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, \
                             int64_t r1) {                                                                       \
        iq_xbf16(w, x, T, y, ldy, r0, r1, &OPS);                                                          \
    }
IQ_ENTRIES(iq2_xxs, iq2_xxs_ops)
IQ_ENTRIES(iq2_xs, iq2_xs_ops)
IQ_ENTRIES(iq2_s, iq2_s_ops)
IQ_ENTRIES(iq4_xs, iq4_xs_ops)

#endif
