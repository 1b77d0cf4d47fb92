/* mxfp4_avx512.c: AVX-512 products of MXFP4 weights, in the file's layout and repacked
 * (DSF_TYPE_MXFP4R, mxfp4r.h), with BF16 activations: the decode tile (T = 1), the panels and
 * the prefill tile (T > 1), and the exact handling of exceptional scale bytes. Compiled with
 * the Makefile's AVX512_FLAGS only; its two entries sit in the kernels_avx512 table
 * (matmul_avx512.c) and run only where select.c chose that table.
 *
 * Owns: the MXFP4 x BF16 tiles. Must not: allocate (the permuted activations and the panels
 * are on the stack), or call select.c; rows it does not handle go to the scalar twin.
 * Numerics and batch invariance as matmul_avx512.c: exact products, fp32 sums in a fixed
 * order, every output computed by the same operations whatever T, the tile and the row range;
 * both layouts give the same bits. */
#include "kernels/matmul.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/mxfp4r.h"
#include "kernels/quant.h"
#include "kernels/tile512.h"

#ifndef MX_PF
/* PF_DIST (tile512.h) for the repacked MXFP4 decode tile (mxr_t1_unit), which computes much
 * longer per 64-byte line than the BF16 tiles and so prefetches further ahead, its scale
 * stream MX_PF / 16 ahead (docs/perf-log.md, item 39). */
#define MX_PF 2048
#endif

/* ---- MXFP4 x BF16 activations ----
 * A unit is 16 consecutive blocks (512 weights). Each of its 4 code lines holds one dword of
 * each block (dword lane j = block j): the repacked layout (DSF_TYPE_MXFP4R, mxfp4r.h) is
 * those lines; MXFP4 rows (272 bytes per unit) are gathered into them by 3 byte permutes per
 * line (mx_r0_line). vpermw reads the low 5 bits of each 16-bit word (the table repeats, so
 * bit 4 does not matter): line h's words, shifted right by 0, 4, 8 and 12, select in lane j
 * the element pairs (a, a + 2) of block j, a = 4h + 0, 16, 1 and 17, as unscaled e2m1 values
 * in BF16: W_k, k = 4h + s. The activations are permuted to match (X_k, mx_perm_unit), so
 * the unit's 16 vdpbf16ps into a zeroed P leave in lane j the exact products of block j
 * only, summed in fp32; one FMA applies each block's scale S = 2^(e-127) (its scale byte
 * shifted into the exponent field of lane j: e2m1 x 2^(e-127) is gguf-layout §1.5's
 * kvalues x 2^(e-128)) and adds P into the row's accumulator. Per 128 weights and row that
 * is a load, 3 shifts, 4 vpermw and 4 dots, plus a quarter of the scale work and the FMA
 * (docs/perf-log.md, item 30). The last unit of a row may hold fewer blocks (mx_unit); its
 * missing lanes are zero codes and scale byte 0.
 * Scale e = 0 is 2^-127, a subnormal S (vpmaxud raises e << 23 = 0 to it; the FMA is exact up
 * to the rounding of a subnormal result). e = 255 is 2^128, not finite in fp32: S = +inf.
 * Such an exceptional block gets a zero S lane (masked tile) and its exact contribution is
 * added per K chunk in double (mx_row_exceptions). The fast tile checks nothing in its loop:
 * the activations are finite, so an exceptional block makes the row's result non-finite, and
 * a chunk with a non-finite result is recomputed by the masked tile (which gives a genuine
 * overflow again).
 * Batch invariance: T > 1 decodes the W_k and the masked S of 4 rows into a panel and runs,
 * for each token, the same P = 16 dots from zero and acc = fma(P, S, acc) over the same K
 * chunks, so every output gets exactly the operations of T = 1. Where the scales and the
 * activations allow it (nearly always), the panel holds W x S instead, and acc + P' (P' the
 * same 16 dots on those weights) gives the same bits with an add for the FMA (mx_tn_tile,
 * mx_panel_ps; docs/perf-log.md, item 13). */
#ifndef MXKC
#define MXKC 2048 /* K chunk (elements) of the MXFP4 kernels: 4 units */
#endif
#define MXU 512 /* elements per unit */
_Static_assert(MXKC % MXU == 0, "a K chunk is whole units");
#ifndef MXTC
/* T > 1 token chunk: its permuted activations, MXTC x MXKC x 2 = 512 KiB (stack; the
 * engine's threads have the default 2-8 MiB). Each chunk decodes every row's panel again, so
 * an expert with ~96 tokens (the MoE prefill at 512-token chunks) decodes it once
 * (docs/perf-log.md, item 14). */
#define MXTC 128
#endif

static const uint16_t mx_e2m1_bf16[32] __attribute__((aligned(64))) = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, /* 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
    0x0000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0, /* -0 is 0, as in kvalues */
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
    0x0000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

/* The same values times 2^8 (exponent field + 8; zero stays 0): the prescaled panel's table. */
static const uint16_t mx_e2m1_bf16_x256[32] __attribute__((aligned(64))) = {
    0x0000, 0x4300, 0x4380, 0x43C0, 0x4400, 0x4440, 0x4480, 0x44C0,
    0x0000, 0xC300, 0xC380, 0xC3C0, 0xC400, 0xC440, 0xC480, 0xC4C0,
    0x0000, 0x4300, 0x4380, 0x43C0, 0x4400, 0x4440, 0x4480, 0x44C0,
    0x0000, 0xC300, 0xC380, 0xC3C0, 0xC400, 0xC440, 0xC480, 0xC4C0};

/* Word indices of one block's 32 activations: words 2k and 2k + 1 are the elements of X_k's
 * lane, a and a + 2 with a = 4h + (0, 16, 1, 17)[s], k = 4h + s. */
static const uint16_t mx_idx_pair[32] __attribute__((aligned(64))) = {
    0, 2, 16, 18, 1, 3, 17, 19, 4,  6,  20, 22, 5,  7,  21, 23,
    8, 10, 24, 26, 9, 11, 25, 27, 12, 14, 28, 30, 13, 15, 29, 31};

/* A 16 x 16 dword transpose in 4 butterfly stages (m = 8, 4, 2, 1): registers r and r + m
 * (r & m = 0) swap their 2 x 2 blocks of m lanes through these vpermt2d indices. */
static const uint32_t mx_tr_idx[4][2][16] __attribute__((aligned(64))) = {
    {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
    {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
    {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
    {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}}};

/* MXFP4 rows: byte indices of a unit's lines in its 272 bytes p[0..271], taken modulo 256 by
 * the permutes: line h (dword j: p[17j + 1 + 4h .. +3]) and, as row 4, the scale bytes p[17j]
 * in byte 0 of dword j. Positions 0-127 come from p[0..127] (vpermt2b), 128-255 (mx_r0_k1)
 * from p[128..255] (vpermt2b), 256-271 (mx_r0_k2) from p[256..] (vpermb). */
#define MX_R0_L(j, o) (uint8_t)(17 * (j) + (o)), (uint8_t)(17 * (j) + (o) + 1), (uint8_t)(17 * (j) + (o) + 2), (uint8_t)(17 * (j) + (o) + 3)
#define MX_R0_S(j, o) (uint8_t)(17 * (j)), (uint8_t)(17 * (j)), (uint8_t)(17 * (j)), (uint8_t)(17 * (j))
#define MX_R0_ROW(B, o)                                                                                           \
    {B(0, o), B(1, o), B(2, o),  B(3, o),  B(4, o),  B(5, o),  B(6, o),  B(7, o),                                 \
     B(8, o), B(9, o), B(10, o), B(11, o), B(12, o), B(13, o), B(14, o), B(15, o)}
static const uint8_t mx_r0_idx[5][64] __attribute__((aligned(64))) = {
    MX_R0_ROW(MX_R0_L, 1), MX_R0_ROW(MX_R0_L, 5), MX_R0_ROW(MX_R0_L, 9), MX_R0_ROW(MX_R0_L, 13), MX_R0_ROW(MX_R0_S, 0)};
static const uint64_t mx_r0_k1[5] = {0x0FFFFFFF00000000ull, 0x0FFFFFFF00000000ull, 0x0FFFFFFFF0000000ull,
                                     0x0FFFFFFFF0000000ull, 0x1111111100000000ull};
#define MX_R0_K2 0xF000000000000000ull /* lines 0-3: block 15's dword */

INLINE int mx_exceptional(int e) { return e == 255; }

INLINE double mx_block_exact(const uint8_t *p, const uint16_t *x) {
    float wf[32];
    dequant_row(GGML_TYPE_MXFP4, p, wf, 32);
    double s = 0;
    for (int i = 0; i < 32; i++) s += (double)wf[i] * (double)bf16_to_f32(x[i]);
    return s;
}

/* Exact contribution of the exceptional blocks of one row in [b0, b1) (natural activations;
 * kept out of the hot loops: a call there would force the accumulators into memory). */
static double mx_row_exceptions(const uint8_t *row, const uint16_t *x, int64_t b0, int64_t b1) {
    double s = 0;
    for (int64_t b = b0; b < b1; b++)
        if (mx_exceptional(row[b * 17])) s += mx_block_exact(row + b * 17, x + b * 32);
    return s;
}

/* The same for a DSF_TYPE_MXFP4R row of nbk blocks (codes c, scales sc). */
static double mxr_row_exceptions(const uint8_t *c, const uint8_t *sc, int64_t nbk, const uint16_t *x, int64_t b0,
                                 int64_t b1) {
    double s = 0;
    for (int64_t b = b0; b < b1; b++)
        if (mx_exceptional(sc[b])) {
            uint8_t blk[17];
            mxfp4r_block(c, sc, nbk, b, blk);
            s += mx_block_exact(blk, x + b * 32);
        }
    return s;
}

INLINE double mx_exceptions(const uint8_t *row, const uint8_t *sc, int64_t nbk, const uint16_t *x, int64_t b0,
                            int64_t b1, const int R) {
    return R ? mxr_row_exceptions(row, sc, nbk, x, b0, b1) : mx_row_exceptions(row, x, b0, b1);
}

/* The exponent range of nonzero BF16 values, 32 at a time: lo gets min(|v| - 1) (zero wraps to
 * 0xFFFF), hi max(|v|), per word; mx_range_end reduces them. */
INLINE void mx_range_acc(__m512i v, __m512i *lo, __m512i *hi) {
    __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    *lo = _mm512_min_epu16(*lo, _mm512_sub_epi16(a, _mm512_set1_epi16(1)));
    *hi = _mm512_max_epu16(*hi, a);
}

/* The activations of one unit (blocks 0 .. nb-1 of x; missing blocks are zeros) in the order
 * of W_0..W_15: xp[32k + 2j], xp[32k + 2j + 1] are the elements of lane j of X_k; for a
 * short unit (nb <= 8), of the 8 paired W' (mx_unit). lo, hi (or NULL): the exponent range
 * of the unit's values is added to them (mx_range_acc). */
INLINE void mx_perm_unit(const uint16_t *x, int nb, uint16_t *xp, __m512i *lo, __m512i *hi) {
    const __m512i idx = _mm512_load_si512((const void *)mx_idx_pair);
    __m512i y[16];
    UNROLL for (int j = 0; j < 16; j++) {
        if (j < nb) {
            __m512i v = _mm512_loadu_si512((const void *)(x + 32 * j));
            if (lo) mx_range_acc(v, lo, hi);
            y[j] = _mm512_permutexvar_epi16(idx, v);
        } else
            y[j] = _mm512_setzero_si512();
    }
    /* y[j]'s dword k is lane j of X_k: transpose */
    UNROLL for (int s = 0; s < 4; s++) {
        const int m = 8 >> s;
        const __m512i ilo = _mm512_load_si512((const void *)mx_tr_idx[s][0]);
        const __m512i ihi = _mm512_load_si512((const void *)mx_tr_idx[s][1]);
        UNROLL for (int r = 0; r < 16; r++) {
            if (r & m) continue;
            const __m512i a = y[r], b = y[r | m];
            y[r] = _mm512_permutex2var_epi32(a, ilo, b);
            y[r | m] = _mm512_permutex2var_epi32(a, ihi, b);
        }
    }
    if (nb > 8) {
        UNROLL for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(xp + 32 * k), y[k]);
        return;
    }
    /* a short unit's paired lines (mx_unit): X'_{4l+s} = lanes 0-7 of X_{8l+s} | of X_{8l+4+s} */
    UNROLL for (int l = 0; l < 2; l++)
        UNROLL for (int s = 0; s < 4; s++)
            _mm512_store_si512((void *)(xp + 32 * (4 * l + s)), _mm512_shuffle_i64x2(y[8 * l + s], y[8 * l + 4 + s], 0x44));
}

/* Units [u0, u1) of a row of nbk blocks, permuted into xp (MXU elements per unit). */
INLINE void mx_perm_x(const uint16_t *x, int64_t nbk, int64_t u0, int64_t u1, uint16_t *xp, __m512i *lo, __m512i *hi) {
    for (int64_t u = u0; u < u1; u++) {
        int64_t nb = nbk - 16 * u;
        mx_perm_unit(x + u * MXU, nb < 16 ? (int)nb : 16, xp + (u - u0) * MXU, lo, hi);
    }
}

/* A code line (lane j: dword h of block j) -> the unscaled e2m1 values W_{4h}..W_{4h+3} in BF16. */
INLINE void mx_codes_to_w(__m512i c, __m512i *W, const __m512i tbl) {
    W[0] = _mm512_permutexvar_epi16(c, tbl);
    W[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tbl);
    W[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 8), tbl);
    W[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 12), tbl);
}

/* S from the scale bytes in byte 0 of each dword: e << 23 is 2^(e-127); e = 0 gives 0, raised
 * to 0x00400000, the subnormal 2^-127. */
INLINE __m512 mx_scale_s(__m512i e) {
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_slli_epi32(e, 23), _mm512_set1_epi32(0x00400000)));
}

INLINE __mmask64 mx_bytes_mask(int n) { return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1; }

/* MXFP4 rows: the unit at p (nb blocks, 17 nb bytes; nb < 16 only for a row's last unit)
 * loaded into A[0..4] with masked loads, so that nothing past it is touched. */
INLINE void mx_r0_load(const uint8_t *p, int nb, __m512i *A) {
    if (nb == 16) {
        UNROLL for (int i = 0; i < 4; i++) A[i] = _mm512_loadu_si512((const void *)(p + 64 * i));
        A[4] = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p + 256)));
        return;
    }
    UNROLL for (int i = 0; i < 4; i++) A[i] = _mm512_maskz_loadu_epi8(mx_bytes_mask(17 * nb - 64 * i), p + 64 * i);
    A[4] = _mm512_setzero_si512();
}

/* Line h (0-3) of a unit loaded by mx_r0_load, or (h = 4) its scale bytes as mx_scale_s takes them. */
INLINE __m512i mx_r0_line(const __m512i *A, int h) {
    const __m512i idx = _mm512_load_si512((const void *)mx_r0_idx[h]);
    if (h == 4)
        return _mm512_or_si512(_mm512_maskz_permutex2var_epi8((__mmask64)0x0000000011111111ull, A[0], idx, A[1]),
                               _mm512_maskz_permutex2var_epi8((__mmask64)mx_r0_k1[4], A[2], idx, A[3]));
    __m512i r = _mm512_permutex2var_epi8(A[0], idx, A[1]);
    r = _mm512_mask_mov_epi8(r, (__mmask64)mx_r0_k1[h], _mm512_permutex2var_epi8(A[2], idx, A[3]));
    return _mm512_mask_mov_epi8(r, (__mmask64)MX_R0_K2, _mm512_permutexvar_epi8(idx, A[4]));
}

/* DSF_TYPE_MXFP4R: line h of the unit at c (nb blocks: lines of 4 nb bytes), and its scale
 * bytes at sc. */
INLINE __m512i mxr_line(const uint8_t *c, int nb, int h) {
    if (nb == 16) return _mm512_loadu_si512((const void *)(c + 64 * h));
    return _mm512_maskz_loadu_epi8(mx_bytes_mask(4 * nb), c + 4 * nb * h);
}
INLINE __m512i mxr_scale_bytes(const uint8_t *sc, int nb) {
    if (nb == 16) return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)sc));
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << nb) - 1), sc));
}

/* DSF_TYPE_MXFP4R: line h of whole unit u of an interleaved pair (units 2p, 2p + 1, both
 * whole: mxfp4r.h) in the row at c. */
INLINE const uint8_t *mxr_pair_line(const uint8_t *c, int64_t u, int h) { return c + 256 * (u & ~(int64_t)1) + 128 * h + 64 * (u & 1); }

/* Whether unit u of a K chunk [u0, u1) (u0 even; units whole except the last, of nbl blocks)
 * is one of an interleaved pair: itself and u ^ 1 whole units of the chunk. A pair never
 * straddles a chunk: chunks start at multiples of 4 units, and only a row's last chunk ends
 * elsewhere. */
INLINE int mxr_paired(int64_t u, int64_t u1, int nbl) {
    const int64_t v = u ^ 1;
    return v < u1 && (u < u1 - 1 || nbl == 16) && (v < u1 - 1 || nbl == 16);
}

/* Decodes unit u of a row in either layout (R = 0: MXFP4, row the row; R = 1: the repacked
 * codes and scales sc): W[0..15] with the given table, and S. A short unit of nb <= 8 blocks
 * (the last of a 2304-wide row) takes half the work: its lines are paired, line 0 in lanes
 * 0-7 and line 1 in lanes 8-15 of one register, lines 2 and 3 in another, and decode to 8
 * W' (W[0..7]); lane j of the 8 dots' P then holds the products of block j for k = 0-3 and
 * 8-11, lane 8 + j those for k = 4-7 and 12-15, and mx_fold adds the two. (Otherwise half
 * of each operation on a short unit is idle, and 256-bit operations cost as much as 512-bit
 * ones here: a 256-bit tile for it ran no faster.) */
INLINE void mx_unit(const uint8_t *row, const uint8_t *sc, int64_t u, int nb, __m512i *W, __m512 *S, const int R,
                    const uint16_t *table, const int paired) {
    const __m512i tbl = _mm512_load_si512((const void *)table);
    __m512i L[4], e;
    if (R) {
        const uint8_t *c = row + 256 * u;
        if (paired) { /* a whole unit of an interleaved pair (mxfp4r.h) */
            UNROLL for (int h = 0; h < 4; h++) L[h] = _mm512_loadu_si512((const void *)mxr_pair_line(row, u, h));
        } else if (nb > 8) {
            UNROLL for (int h = 0; h < 4; h++) L[h] = mxr_line(c, nb, h);
        } else if (nb == 8) {
            L[0] = _mm512_loadu_si512((const void *)c);
            L[1] = _mm512_loadu_si512((const void *)(c + 64));
        } else {
            /* lines of nb dwords: 2 nb dwords into lanes 0 .. nb-1 and 8 .. 8+nb-1 */
            const __mmask16 m = (__mmask16)(((1u << nb) - 1) * 0x0101u);
            L[0] = _mm512_maskz_expandloadu_epi32(m, c);
            L[1] = _mm512_maskz_expandloadu_epi32(m, c + 8 * nb);
        }
        e = mxr_scale_bytes(sc + 16 * u, nb);
    } else {
        __m512i A[5];
        mx_r0_load(row + 272 * u, nb, A);
        UNROLL for (int h = 0; h < 4; h++) L[h] = mx_r0_line(A, h);
        if (nb <= 8) {
            L[0] = _mm512_shuffle_i64x2(L[0], L[1], 0x44);
            L[1] = _mm512_shuffle_i64x2(L[2], L[3], 0x44);
        }
        e = mx_r0_line(A, 4);
    }
    const int nl = nb > 8 ? 4 : 2;
    for (int h = 0; h < nl; h++) mx_codes_to_w(L[h], W + 4 * h, tbl);
    *S = mx_scale_s(e);
}

/* W per unit: 16, or 8 paired for a short unit (mx_unit). */
INLINE int mx_nw(int nb) { return nb > 8 ? 16 : 8; }

/* A short unit's P: lane j (j < 8) gets lane j + lane 8 + j, lanes 8-15 get 0 (so that
 * fma(P, S, acc) and acc + P leave them as they are: acc is never -0, it starts at +0 and a
 * sum that cancels to zero is +0). */
INLINE __m512 mx_fold(__m512 P) { return _mm512_maskz_add_ps(0x00FF, P, _mm512_shuffle_f32x4(P, P, 0x4E)); }

/* The exceptional lanes of a unit's S: +inf (e = 255). */
INLINE __mmask16 mx_bad_lanes(__m512 S) { return _mm512_fpclass_ps_mask(S, 0x08); }

/* P: a unit's 16 dots from zero (lane j: the products of block j only), activations at xu;
 * a short unit's 8, folded. */
INLINE __m512 mx_unit_p(const __m512i *W, const uint16_t *xu, int nb) {
    __m512 P = _mm512_setzero_ps();
    if (nb <= 8) {
        UNROLL for (int k = 0; k < 8; k++)
            P = _mm512_dpbf16_ps(P, as_bh(W[k]), as_bh(_mm512_load_si512((const void *)(xu + 32 * k))));
        return mx_fold(P);
    }
    UNROLL for (int k = 0; k < 16; k++)
        P = _mm512_dpbf16_ps(P, as_bh(W[k]), as_bh(_mm512_load_si512((const void *)(xu + 32 * k))));
    return P;
}

/* T = 1, repacked: unit u (nb blocks; full = nb == 16) of 4 rows: line h of the 4 rows in
 * turn, 4 dots each into the row's own P (the same 16 dots in the same order as mx_unit_p),
 * and the rows' S. nv = 2 (full units only): units u and u + 1 at once, their lines
 * interleaved, into P[0..3] and P[4..7] (S likewise), so that 8 chains of dots run instead of
 * 4; each P still gets the same dots in the same order (the same bits). With 4 chains the
 * tile waited on the latency of vdpbf16ps (docs/perf-log.md, item 32). */
INLINE void mxr_t1_unit(const uint8_t *const *wr, const uint8_t *const *sr, const uint16_t *xu, int64_t u, int nb,
                        __m512 *P, __m512 *S, const __m512i tbl, const int full, const int nv) {
    UNROLL for (int i = 0; i < 4 * nv; i++) P[i] = _mm512_setzero_ps();
    UNROLL for (int h = 0; h < 4; h++)
        UNROLL for (int v = 0; v < nv; v++)
            UNROLL for (int r = 0; r < 4; r++) {
                const uint8_t *c = wr[r] + 256 * (u + v);
                __m512i W[4];
                if (full) {
                    /* units u, u + 1 (nv = 2, u even) are an interleaved pair, so that this
                     * loop reads each row at rising addresses; the address is mxr_pair_line's
                     * for an even u, written out because its masking of u was slower here
                     * (docs/perf-log.md, item 36).
                     * A whole unit alone (nv = 1) is a row's last whole unit, not in a pair.
                     * One prefetch per line read, MX_PF ahead. */
                    const uint8_t *cl = nv == 2 ? wr[r] + 256 * u + 128 * h + 64 * v : c + 64 * h;
                    _mm_prefetch((const char *)(cl + MX_PF), _MM_HINT_T0);
                    /* and the scales as far ahead, once per 64-byte line of them (4 units; u
                     * is even, and 0 mod 4 every other pair) */
                    if (h == 0 && v == 0 && (u & 3) == 0)
                        _mm_prefetch((const char *)(sr[r] + 16 * u + MX_PF / 16), _MM_HINT_T0);
                    mx_codes_to_w(_mm512_loadu_si512((const void *)cl), W, tbl);
                } else
                    mx_codes_to_w(mxr_line(c, nb, h), W, tbl);
                UNROLL for (int s = 0; s < 4; s++)
                    P[4 * v + r] = _mm512_dpbf16_ps(P[4 * v + r], as_bh(W[s]),
                                                    as_bh(_mm512_load_si512((const void *)(xu + MXU * v + 32 * (4 * h + s)))));
            }
    UNROLL for (int v = 0; v < nv; v++)
        UNROLL for (int r = 0; r < 4; r++)
            S[4 * v + r] = mx_scale_s(mxr_scale_bytes(sr[r] + 16 * (u + v), full ? 16 : nb));
}

/* T = 1, repacked: a short unit of 8 blocks (2304-wide rows) of 4 rows, its paired lines
 * (mx_unit) taken in turn for the 4 rows: the dots and the fold of mx_unit_p. */
INLINE void mxr_t1_pair8(const uint8_t *const *wr, const uint8_t *const *sr, const uint16_t *xu, int64_t u, __m512 *P,
                         __m512 *S, const __m512i tbl) {
    UNROLL for (int r = 0; r < 4; r++) P[r] = _mm512_setzero_ps();
    UNROLL for (int l = 0; l < 2; l++)
        UNROLL for (int r = 0; r < 4; r++) {
            __m512i W[4];
            mx_codes_to_w(_mm512_loadu_si512((const void *)(wr[r] + 256 * u + 64 * l)), W, tbl);
            UNROLL for (int s = 0; s < 4; s++)
                P[r] = _mm512_dpbf16_ps(P[r], as_bh(W[s]), as_bh(_mm512_load_si512((const void *)(xu + 32 * (4 * l + s)))));
        }
    UNROLL for (int r = 0; r < 4; r++) {
        P[r] = mx_fold(P[r]);
        S[r] = mx_scale_s(mxr_scale_bytes(sr[r] + 16 * u, 8));
    }
}

/* One unit's step for 4 rows: acc += P x S (masked: the exceptional S lanes zeroed and noted
 * in any). */
INLINE void mx_t1_step(const __m512 *P, const __m512 *S, __m512 *acc, __mmask16 *any, const int masked) {
    UNROLL for (int r = 0; r < 4; r++) {
        __m512 Sr = S[r];
        if (masked) {
            __mmask16 k = mx_bad_lanes(Sr);
            any[r] |= k;
            Sr = _mm512_maskz_mov_ps((__mmask16)~k, Sr);
        }
        acc[r] = _mm512_fmadd_ps(P[r], Sr, acc[r]);
    }
}

/* T = 1: 4 rows over units [u0, u1) of the permuted activations xp (unit u0 first); nbl:
 * blocks in unit u1 - 1. masked = 0: returns nonzero if a result is not finite, which an
 * exceptional block (S = +inf) always causes (the activations are finite), and then the
 * results are to be discarded; the hot loop checks nothing. masked = 1: zeroes the
 * exceptional S lanes, bad[r] tells which rows had any. */
INLINE int mx_t1_tile(const uint8_t *const *wr, const uint8_t *const *sr, const uint16_t *xp, int64_t u0, int64_t u1,
                      int nbl, float *out, const int masked, int *bad, const int R) {
    __m512 acc[4];
    __mmask16 any[4] = {0, 0, 0, 0};
    UNROLL for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    const __m512i tbl = _mm512_load_si512((const void *)mx_e2m1_bf16);
    for (int64_t u = u0; u < u1; u++) {
        const uint16_t *xu = xp + (u - u0) * MXU;
        const int nb = u == u1 - 1 ? nbl : 16;
        __m512 P[8], S[8];
        if (R && u + 1 < u1 && (u + 2 < u1 || nbl == 16)) {
            /* units u and u + 1, both full: their P and S, then each unit's step in turn */
            mxr_t1_unit(wr, sr, xu, u, 16, P, S, tbl, 1, 2);
            mx_t1_step(P, S, acc, any, masked);
            mx_t1_step(P + 4, S + 4, acc, any, masked);
            u++;
            continue;
        }
        if (R && nb == 16) mxr_t1_unit(wr, sr, xu, u, 16, P, S, tbl, 1, 1);
        else if (R && nb > 8) mxr_t1_unit(wr, sr, xu, u, nb, P, S, tbl, 0, 1);
        else if (R && nb == 8) mxr_t1_pair8(wr, sr, xu, u, P, S, tbl);
        else
            UNROLL for (int r = 0; r < 4; r++) {
                if (nb == 16)
                    UNROLL for (int i = 0; i < 5; i++)
                        _mm_prefetch((const char *)(wr[r] + 272 * u + 64 * i + PF_DIST), _MM_HINT_T0);
                __m512i W[16];
                mx_unit(wr[r], R ? sr[r] : NULL, u, nb, W, &S[r], R, mx_e2m1_bf16, R && mxr_paired(u, u1, nbl));
                P[r] = mx_unit_p(W, xu, nb);
            }
        mx_t1_step(P, S, acc, any, masked);
    }
    red4(acc, out);
    if (masked)
        for (int r = 0; r < 4; r++) bad[r] = any[r] != 0;
    int redo = 0;
    for (int r = 0; r < 4; r++) redo |= !isfinite(out[r]);
    return redo;
}

/* T > 1: decodes units [u0, u1) of one row into a panel (W_0..W_15 and the masked S per
 * unit, exactly as mx_t1_tile's masked pass computes them); returns 1 if any was
 * exceptional. */
INLINE int mx_panel(const uint8_t *row, const uint8_t *sc, int64_t u0, int64_t u1, int nbl, __m512i (*panel)[17],
                    const int R) {
    __mmask16 any = 0;
    for (int64_t u = u0; u < u1; u++) {
        __m512i W[16];
        __m512 S;
        const int nb = u == u1 - 1 ? nbl : 16;
        mx_unit(row, sc, u, nb, W, &S, R, mx_e2m1_bf16, R && mxr_paired(u, u1, nbl));
        __mmask16 k = mx_bad_lanes(S);
        any |= k;
        for (int j = 0; j < mx_nw(nb); j++) _mm512_store_si512((void *)&panel[u - u0][j], W[j]);
        _mm512_store_si512((void *)&panel[u - u0][16], _mm512_castps_si512(_mm512_maskz_mov_ps((__mmask16)~k, S)));
    }
    return any != 0;
}

/* T > 1, prescaled: the same panel with each weight multiplied by its block's scale, W_k' =
 * W_k x S in BF16, and S left out. The table holds the e2m1 values times 2^8, and one
 * saturating subtraction of (135 - e) << 7 from each word moves the exponent field to that of
 * value x 2^(e-127); zero saturates to zero. Exact for 2 <= e <= 135 (every result a normal
 * BF16). Returns 1 if every block in [u0, u1) has such a scale and e >= emin (when it returns
 * 0, the caller builds mx_panel's panels for the whole tile instead). pf > 0: prefetches into
 * L2 the same units pf bytes further on (the next row tile's row; its scales pfs further):
 * the loads of a panel waited on memory (docs/perf-log.md, item 16). */
INLINE int mx_panel_ps(const uint8_t *row, const uint8_t *sc, int64_t u0, int64_t u1, int nbl, __m512i (*panel)[17],
                       const int R, int emin, int64_t pf, int64_t pfs) {
    if (pf && R) _mm_prefetch((const char *)(sc + u0 * 16 + pfs), _MM_HINT_T1);
    __m512i smin = _mm512_set1_epi32(-1), smax = _mm512_setzero_si512();
    const __m512i top = _mm512_set1_epi32(135 << 23);
    for (int64_t u = u0; u < u1; u++) {
        __m512i W[16];
        __m512 S;
        const int nb = u == u1 - 1 ? nbl : 16;
        if (pf)
            for (int i = 0; i < (R ? 4 : 5); i++)
                _mm_prefetch((const char *)(row + u * (R ? 256 : 272) + 64 * i + pf), _MM_HINT_T1);
        mx_unit(row, sc, u, nb, W, &S, R, mx_e2m1_bf16_x256, R && mxr_paired(u, u1, nbl));
        const __mmask16 live = (__mmask16)((1u << nb) - 1); /* a short unit's missing blocks */
        const __m512i si = _mm512_castps_si512(S);
        smin = _mm512_mask_min_epu32(smin, live, smin, si);
        smax = _mm512_mask_max_epu32(smax, live, smax, si);
        /* (135 - e) << 23, then its high word into both words of the dword */
        __m512i d = _mm512_sub_epi32(top, si);
        d = _mm512_or_si512(d, _mm512_srli_epi32(d, 16));
        if (nb <= 8) d = _mm512_shuffle_i64x2(d, d, 0x44); /* paired lines: lane 8 + j is block j */
        for (int j = 0; j < mx_nw(nb); j++) _mm512_store_si512((void *)&panel[u - u0][j], _mm512_subs_epu16(W[j], d));
    }
    if (emin < 2) emin = 2;
    return _mm512_reduce_min_epu32(smin) >= ((uint32_t)emin << 23) && _mm512_reduce_max_epu32(smax) <= (135u << 23);
}

/* The exponent range of the nonzero BF16 values mx_range_acc saw (lo starts at all ones, hi at
 * zero): *fmin, *fmax (biased; a subnormal counts as 0, no nonzero value gives fmin 255, fmax 0). */
INLINE void mx_range_end(__m512i lo, __m512i hi, int *fmin, int *fmax) {
    uint32_t mn = _mm512_reduce_min_epu32(_mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(lo)),
                                                           _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(lo, 1))));
    uint32_t mx = _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)),
                                                           _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1))));
    *fmin = mn == 0xFFFF ? 255 : (int)((mn + 1) >> 7);
    *fmax = (int)(mx >> 7);
}

#ifndef MXTB
#define MXTB 4 /* tokens per T > 1 tile */
#endif
_Static_assert(MXTB == 4, "mx_tn_tile's sums (red4x4) take 4 rows x 4 tokens");
/* T > 1: 4 panel rows x MXTB tokens (permuted activations x[t]) over nu units, 16
 * accumulators. ps = 0: per row and token, P = mx_unit_p from the panel; acc = fma(P, S, acc).
 * ps = 1: a prescaled panel (mx_panel_ps), acc += P'. When every value involved is far enough
 * from the ends of the fp32 range (xmm_mx checks), P' is exactly S x P (scaling by a power of
 * two commutes with every rounding of the sum), so acc + P' is fma(P, S, acc): the same bits,
 * with an add (which runs on other pipes) for the FMA. */
/* The prescaled tile's unit u (nw = 16 W, or 8 paired and folded): for each k the 4 rows' W_k
 * and the 4 tokens' X_k feed all 16 partial P (each the dots of mx_unit_p in the same order),
 * 8 loads per 16 dots and 16 independent dot chains; the accumulators are a local array
 * (acc), one add per (row, token) and unit; 8 chains (tokens in pairs) would not cover
 * vdpbf16ps's latency (docs/perf-log.md, item 37). */
INLINE void mx_tn_ps(__m512i (*const *panel)[17], const uint16_t *const *x, int64_t u, __m512 *acc, const int nw) {
    __m512 P[4][MXTB];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < MXTB; t++) P[r][t] = _mm512_setzero_ps();
    UNROLL for (int k = 0; k < nw; k++) {
        __m512i W[4], X[MXTB];
        UNROLL for (int r = 0; r < 4; r++) W[r] = _mm512_load_si512((const void *)&panel[r][u][k]);
        UNROLL for (int t = 0; t < MXTB; t++) X[t] = _mm512_load_si512((const void *)(x[t] + u * MXU + 32 * k));
        UNROLL for (int r = 0; r < 4; r++)
            UNROLL for (int t = 0; t < MXTB; t++) P[r][t] = _mm512_dpbf16_ps(P[r][t], as_bh(W[r]), as_bh(X[t]));
    }
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < MXTB; t++)
            acc[r * MXTB + t] = _mm512_add_ps(acc[r * MXTB + t], nw == 8 ? mx_fold(P[r][t]) : P[r][t]);
}

INLINE void mx_tn_tile(__m512i (*const *panel)[17], const uint16_t *const *x, int64_t nu, int nbl, float *out,
                       const int ps) {
    if (ps) { /* accm[4 r + t]: red4x4's order, so red16 sums it directly */
        __m512 accm[4 * MXTB];
        UNROLL for (int i = 0; i < 4 * MXTB; i++) accm[i] = _mm512_setzero_ps();
        for (int64_t u = 0; u < nu; u++) mx_tn_ps(panel, x, u, accm, u < nu - 1 || nbl > 8 ? 16 : 8);
        _mm512_storeu_ps(out, red16(accm));
        return;
    }
    __m512 acc[4][MXTB];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < MXTB; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t u = 0; u < nu; u++) {
        const int nb = u == nu - 1 ? nbl : 16;
        for (int r = 0; r < 4; r++) {
            const __m512 S = _mm512_castsi512_ps(_mm512_load_si512((const void *)&panel[r][u][16]));
            UNROLL for (int t = 0; t < MXTB; t++)
                acc[r][t] = _mm512_fmadd_ps(mx_unit_p(panel[r][u], x[t] + u * MXU, nb), S, acc[r][t]);
        }
    }
    red4x4(acc, out);
}

/* The scale rows of a tile's code rows wr (DSF_TYPE_MXFP4R). */
INLINE void mxr_scale_rows(const dsf_wmat *w, const uint8_t *const *wr, const uint8_t **sr) {
    for (int i = 0; i < 4; i++) sr[i] = w->scales + (uint64_t)(wr[i] - w->data) / 16;
}

/* MXFP4 x BF16 activations. T = 1: tiles of 4 far-apart row streams, K chunks of MXKC.
 * T > 1: per token chunk and K chunk, the activations are permuted once; per 4 adjacent rows
 * the weights are decoded once into a panel (4 x 4 x 17 x 64 bytes = 17 KiB, L1) and the tile
 * runs over it for every MXTB (4) tokens of the chunk. Adjacent rows let a whole tile's 16
 * sums go to y as one 4-float access per token (tile_put4x4; docs/perf-log.md, item 15). (The
 * BF16 tiles read their weights in the hot loop, where far-apart rows read faster; they take
 * 2 pairs, matmul_avx512.c.) */
INLINE void xmm_mx(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                   const int R) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0 || w->n_in > 16384) {
        matmul_xbf16_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    const int64_t nbk = w->n_in / 32, nun = (nbk + 15) / 16, kcu = MXKC / MXU;
    const int nlast = (int)(nbk - 16 * (nun - 1)); /* blocks in a row's last unit */
    int64_t rr[4], len = t1_stream_len(r0, r1, 4, 1);
    const uint8_t *wr[4], *sr[4] = {NULL, NULL, NULL, NULL};
    /* the permuted activations: T = 1 a whole row (n_in <= 16384), T > 1 a chunk */
    _Static_assert(MXTC * MXKC >= 16384, "the T = 1 activations must fit the chunk buffer");
    _Alignas(64) uint16_t xp[MXTC * MXKC];
    if (T == 1) {
        mx_perm_x(x, nbk, 0, nun, xp, NULL, NULL);
        for (int64_t k = 0; k < len; k++) {
            t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
            if (R) mxr_scale_rows(w, wr, sr);
            for (int64_t u0 = 0; u0 < nun; u0 += kcu) {
                int64_t u1 = u0 + kcu < nun ? u0 + kcu : nun;
                int nbl = u1 == nun ? nlast : 16;
                float o[4];
                int bad[4];
                if (mx_t1_tile(wr, sr, xp + u0 * MXU, u0, u1, nbl, o, 0, bad, R)) {
                    mx_t1_tile(wr, sr, xp + u0 * MXU, u0, u1, nbl, o, 1, bad, R);
                    for (int i = 0; i < 4; i++)
                        if (bad[i])
                            o[i] = (float)((double)o[i] +
                                           mx_exceptions(wr[i], sr[i], nbk, x, 16 * u0, u1 == nun ? nbk : 16 * u1, R));
                }
                for (int i = 0; i < 4; i++)
                    if (rr[i] >= 0) y[rr[i]] = u0 == 0 ? o[i] : y[rr[i]] + o[i];
            }
        }
        return;
    }
    _Alignas(64) __m512i panel[4][MXKC / MXU][17];
    __m512i(*pr[4])[17] = {panel[0], panel[1], panel[2], panel[3]};
    for (int64_t tc = 0; tc < T; tc += MXTC) {
        int64_t tc1 = tc + MXTC < T ? tc + MXTC : T;
        for (int64_t u0 = 0; u0 < nun; u0 += kcu) {
            int64_t u1 = u0 + kcu < nun ? u0 + kcu : nun, b1 = u1 == nun ? nbk : 16 * u1;
            int nbl = u1 == nun ? nlast : 16;
            __m512i lo = _mm512_set1_epi16(-1), hi = _mm512_setzero_si512();
            for (int64_t t = tc; t < tc1; t++) mx_perm_x(x + t * w->n_in, nbk, u0, u1, xp + (t - tc) * MXKC, &lo, &hi);
            int fmin, fmax;
            mx_range_end(lo, hi, &fmin, &fmax);
            /* The prescaled tile gives mx_tn_tile's bits when no sum in either form is subnormal
             * or overflows. The products' fp32 partial sums are multiples of 2^(fmin-135) (e2m1
             * steps of 1/2 times BF16 steps): with fmin >= 9 and fmin + e >= 136 neither form
             * has a subnormal one (every scale has 2 <= e <= 135, mx_panel_ps); a lane's 32
             * products are below 2^(fmax+e-245) (|e2m1| <= 6), so fmax + 135 <= 372 keeps
             * both forms finite. */
            const int ps_ok = fmin >= 9 && fmax <= 237, ps_emin = 136 - fmin;
            const int64_t lenn = t1_stream_len(r0, r1, 1, 4);
            for (int64_t k = 0; k < lenn; k++) {
                int exc[4], ps = ps_ok;
                const int64_t pf = k + 1 < lenn ? (int64_t)(4 * w->row_bytes) : 0; /* the next tile's rows */
                t1_tile_rows(w, r0, r1, lenn, k, 1, 4, rr, wr);
                if (R) mxr_scale_rows(w, wr, sr);
                for (int i = 0; i < 4 && ps; i++) {
                    if (rr[i] >= 0 || i == 0)
                        ps = mx_panel_ps(wr[i], sr[i], u0, u1, nbl, panel[i], R, ps_emin, pf, (int64_t)(4 * (w->row_bytes / 16)));
                    else memcpy(panel[i], panel[i - 1], sizeof panel[i]);
                    exc[i] = 0;
                }
                for (int i = 0; i < 4 && !ps; i++) {
                    /* rows past r1 repeat row r1 - 1 (results dropped): decode it once */
                    if (rr[i] >= 0 || i == 0) exc[i] = mx_panel(wr[i], sr[i], u0, u1, nbl, panel[i], R);
                    else {
                        exc[i] = exc[i - 1];
                        memcpy(panel[i], panel[i - 1], sizeof panel[i]);
                    }
                }
                for (int64_t t = tc; t < tc1; t += MXTB) {
                    const uint16_t *xt[MXTB];
                    float out[4 * MXTB];
                    for (int j = 0; j < MXTB; j++) xt[j] = xp + ((t + j < tc1 ? t + j : tc1 - 1) - tc) * MXKC;
                    if (ps) mx_tn_tile(pr, xt, u1 - u0, nbl, out, 1);
                    else mx_tn_tile(pr, xt, u1 - u0, nbl, out, 0);
                    if (ps && rr[3] >= 0 && t + MXTB <= tc1) {
                        tile_put4x4(out, y, ldy, t, rr[0], u0);
                        continue;
                    }
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < MXTB && rr[i] >= 0 && t + j < tc1; j++) {
                            float v = out[j * 4 + i];
                            if (exc[i])
                                v = (float)((double)v + mx_exceptions(wr[i], sr[i], nbk, x + (t + j) * w->n_in, 16 * u0, b1, R));
                            float *yy = &y[(t + j) * ldy + rr[i]];
                            *yy = u0 == 0 ? v : *yy + v;
                        }
                }
            }
        }
    }
}

void xmm_mxfp4_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                      int64_t r1) {
    xmm_mx(w, x, T, y, ldy, r0, r1, 0);
}

/* DSF_TYPE_MXFP4R: the same operations on the repacked layout, so the same bits. */
void xmm_mxfp4r_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    xmm_mx(w, x, T, y, ldy, r0, r1, 1);
}

#endif
