/* matmul_amx.c: BF16-activation products on Intel AMX tiles (compiled with the Makefile's
 * AMX_FLAGS only; select.c selects the "amx" table only on CPUs with AMX-TILE, AMX-BF16 and
 * every AVX-512 feature of the avx512 table, once the kernel has granted the process the
 * tile data state).
 *
 * The "amx" table is the avx512 table with the BF16-activation product of BF16 weights
 * (matmul_xbf16) and the BF16 peak probe replaced; "amx-mxfp4" also replaces the MXFP4 one
 * (kernels_amx_init). Everything else (the fp32-activation family, the other weight types,
 * the read probe) is the avx512 code.
 *
 * Numerics: TDPBF16PS multiplies BF16 pairs exactly and adds them into fp32 accumulators,
 * flushing subnormal inputs and results (like vdpbf16ps); its internal order of additions
 * within one instruction is not documented (it does not match a sequential fp32 sum), so the
 * result is within fp32 summation-order noise of the exact sum, as the kernel contract asks.
 * MXFP4 weights are decoded exactly into BF16 (e2m1 value x 2^(e-127): a normal BF16 for
 * 2 <= e <= 252); a row with any other scale byte is computed by the scalar twin.
 *
 * Batch invariance: an output y[t][r] is the accumulator of one tile element that starts at
 * zero and receives one TDPBF16PS per block of 32 weights, in block order; between K chunks it
 * is stored to y and loaded back (exact). T = 1 puts the weights in A (16 rows x 32) and the
 * activations in B (16 pairs x 1 token); T > 1 puts the activations in A (16 tokens x 32) and
 * the weights, transposed into pairs, in B (a panel). Each element then sees the same pairs of
 * products in the same order, and the instruction's result for an element does not depend on
 * the tile's other rows and columns or its shape (tests/unit/kernels.c checks this bit for
 * bit: kernels_batch_invariant).
 *
 * Compiled a second time with DSF_AMX_EMU (the Makefile's matmul_amx_emu.o, avx512 flags only),
 * the same code runs on emulated tiles (amx_emu.h) as kernels_amxemu_init's tables "amx-emu"
 * and "amx-mxfp4-emu", which the tests run on hosts without AMX. */
#include "kernels/matmul.h"
#include "kernels/fp8.h"

#ifdef DSF_AMX_EMU
#define kernels_amx_init kernels_amxemu_init
#define kernels_amx_built kernels_amxemu_built
#endif

#if defined(__x86_64__) && ((defined(__AMX_TILE__) && defined(__AMX_BF16__)) || defined(DSF_AMX_EMU)) && \
    defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>
#ifdef DSF_AMX_EMU
#include "kernels/amx_emu.h"
#else
#define AMX_TABLE_SUFFIX ""
#endif

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* The LDTILECFG operand: palette 1, then bytes per row and rows of each of the 8 tiles. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;
_Static_assert(sizeof(amx_cfg) == 64, "LDTILECFG reads 64 bytes");

#define AKB 16     /* T > 1: K chunk in blocks of 32 (a panel of 2 x 16 KiB) */
#ifndef APF
#define APF 1024 /* T = 1: software prefetch distance along each weight row */
#endif

static void amx_config(int c_rows[4], int c_colsb[4], int a_rows[2], int b_colsb[2]) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) {
        c.rows[i] = (uint8_t)c_rows[i];
        c.colsb[i] = (uint16_t)c_colsb[i];
    }
    for (int i = 0; i < 2; i++) {
        c.rows[4 + i] = (uint8_t)a_rows[i];
        c.colsb[4 + i] = 64;
        c.rows[6 + i] = 16;
        c.colsb[6 + i] = (uint16_t)b_colsb[i];
    }
    /* gcc 12 does not know that LDTILECFG reads all 64 bytes and drops stores to c without this */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* ---- MXFP4 decode ---- */

/* e2m1 values in BF16 times 2^125 (exponent field + 125; zero stays 0): scaling a value by
 * 2^(e-127) is then one saturating subtraction of (252 - e) << 7 from its magnitude, which
 * leaves zeros at zero (they saturate) and the sign bit alone (for 2 <= e <= 252 the result's
 * exponent field is 1 .. 254). The table repeats every 16 entries: vpermw reads 5 index bits. */
#define AMX_E2M1_X125(s) 0, (s) | 0x7D80, (s) | 0x7E00, (s) | 0x7E40, (s) | 0x7E80, (s) | 0x7EC0, (s) | 0x7F00, (s) | 0x7F40
static const uint16_t amx_e2m1_x125[32] __attribute__((aligned(64))) = {
    AMX_E2M1_X125(0), AMX_E2M1_X125(0x8000), AMX_E2M1_X125(0), AMX_E2M1_X125(0x8000)}; /* -0 is 0 */
/* vpsrlvw counts: words 0-15 keep the low nibble of code byte i, words 16-31 take the high */
static const uint16_t amx_nib_shift[32] __attribute__((aligned(64))) = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};

/* The scale operands of block b of 16 rows (row i's block at a + i rb + 17 b; rows i >= m are
 * not read): s32[i] = (252 - e) << 7 in both halves; rows whose scale is outside 2 .. 252
 * (not exact in BF16 after scaling, amx_dec_mx) are returned as a mask. */
INLINE uint32_t amx_scales(const uint8_t *a, const __m512i ridx, int64_t b, int m, int32_t *s32) {
    const __mmask16 rows = m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1);
    __m512i e = _mm512_mask_i32gather_epi32(_mm512_set1_epi32(127), rows, ridx, (const void *)(a + 17 * b), 1);
    e = _mm512_and_si512(e, _mm512_set1_epi32(0xFF));
    const __mmask16 bad = _mm512_mask_cmpgt_epu32_mask(rows, _mm512_sub_epi32(e, _mm512_set1_epi32(2)), _mm512_set1_epi32(250));
    __m512i S = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(252), e), 7);
    _mm512_store_si512((void *)s32, _mm512_or_si512(S, _mm512_slli_epi32(S, 16)));
    return bad;
}

/* The 16 codes of a block (blk + 1) as 32 BF16 values in element order: element i < 16 is the
 * low nibble of code byte i, i >= 16 the high nibble of byte i - 16; value e2m1 x 2^(e-127)
 * (kvalues x 2^(e-128)) given s = amx_scales' operand, exact for 2 <= e <= 252. */
INLINE __m512i amx_dec_mx(const uint8_t *codes, const __m512i tbl, const __m512i sh, int32_t s) {
    __m512i v = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)codes)));
    v = _mm512_permutexvar_epi16(_mm512_srlv_epi16(v, sh), tbl);
    return _mm512_subs_epu16(v, _mm512_set1_epi32(s));
}

/* ---- T = 1: weights in A, activations in B ---- */

/* BF16 rows [r, r + m) (m <= 16) over all blocks into tile CT, A from tile AT, straight from
 * the rows. */
#define T1_ROWS(CT, AT)                                                                         \
    do {                                                                                        \
        _tile_zero(CT);                                                                         \
        const uint8_t *a_ = w->data + (uint64_t)r * rb;                                         \
        for (int64_t kb = 0; kb < nkb; kb++) {                                                  \
            _tile_loadd(6, x + kb * 32, 4);                                                     \
            const uint64_t o_ = (uint64_t)kb * 64 + APF; /* past the row: the next tile's */  \
            const uint8_t *f_ = o_ < rb ? a_ + o_ : a_ + 16 * rb + (o_ - rb);                   \
            for (int i = 0; i < 16; i++) _mm_prefetch((const char *)(f_ + (uint64_t)i * rb), _MM_HINT_T0); \
            _tile_loadd(AT, a_ + kb * 64, (long)rb);                                            \
            _tile_dpbf16ps(CT, AT, 6);                                                          \
        }                                                                                       \
        _tile_stored(CT, y + r, 4);                                                             \
    } while (0)

static void amx_t1_bf16(const dsf_wmat *w, const uint16_t *x, float *y, int64_t r0, int64_t r1) {
    const int64_t nkb = w->n_in / 32;
    const uint64_t rb = w->row_bytes;
    const int tail = (int)((r1 - r0) % 16);
    amx_config((int[4]){16, tail ? tail : 16, 1, 1}, (int[4]){4, 4, 4, 4}, (int[2]){16, tail ? tail : 16},
               (int[2]){4, 4});
    for (int64_t r = r0; r < r1; r += 16) {
        int m = r + 16 <= r1 ? 16 : tail;
        if (m == 16) T1_ROWS(0, 4);
        else T1_ROWS(1, 5);
    }
    _tile_release();
}

/* MXFP4, T = 1: per 16 rows, 4 blocks at a time are decoded into 4 KiB (rows past r1 are left
 * as they are: their sums are dropped), then 4 TDPBF16PS with alternating tiles. */
#define MX_STEP(j, AT, BT)                                                                      \
    if (nb4 > (j)) {                                                                            \
        _tile_loadd(BT, x + (kb + (j)) * 32, 4);                                                \
        _tile_loadd(AT, abuf[j], 64);                                                           \
        _tile_dpbf16ps(0, AT, BT);                                                              \
    }

static void amx_t1_mx(const dsf_wmat *w, const uint16_t *x, float *y, int64_t r0, int64_t r1) {
    const int64_t nkb = w->n_in / 32;
    const uint64_t rb = w->row_bytes;
    const __m512i tbl = _mm512_load_si512((const void *)amx_e2m1_x125), sh = _mm512_load_si512((const void *)amx_nib_shift);
    _Alignas(64) uint16_t abuf[4][16][32];
    _Alignas(64) int32_t s32[4][16];
    _Alignas(64) float cb[16];
    const __m512i ridx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    memset(abuf, 0, sizeof abuf);
    amx_config((int[4]){16, 1, 1, 1}, (int[4]){4, 4, 4, 4}, (int[2]){16, 16}, (int[2]){4, 4});
    for (int64_t r = r0; r < r1; r += 16) {
        const int m = r + 16 <= r1 ? 16 : (int)(r1 - r);
        const uint8_t *a = w->data + (uint64_t)r * rb;
        uint32_t bad = 0;
        _tile_zero(0);
        for (int64_t kb = 0; kb < nkb; kb += 4) {
            const int nb4 = kb + 4 <= nkb ? 4 : (int)(nkb - kb);
            for (int j = 0; j < nb4; j++) bad |= amx_scales(a, ridx, kb + j, m, s32[j]);
            for (int i = 0; i < m; i++) {
                const uint8_t *p = a + (uint64_t)i * rb + (uint64_t)kb * 17 + 1;
                _mm_prefetch((const char *)(p + APF), _MM_HINT_T0);
                if (nb4 == 4) {
                    UNROLL for (int j = 0; j < 4; j++)
                        _mm512_store_si512((void *)abuf[j][i], amx_dec_mx(p + 17 * j, tbl, sh, s32[j][i]));
                } else {
                    for (int j = 0; j < nb4; j++)
                        _mm512_store_si512((void *)abuf[j][i], amx_dec_mx(p + 17 * j, tbl, sh, s32[j][i]));
                }
            }
            MX_STEP(0, 4, 6)
            MX_STEP(1, 5, 7)
            MX_STEP(2, 4, 6)
            MX_STEP(3, 5, 7)
        }
        _tile_stored(0, cb, 4);
        memcpy(y + r, cb, (size_t)m * sizeof *cb);
        for (int i = 0; bad && i < m; i++)
            if (bad & (1u << i)) matmul_xbf16_any_ref(w, x, 1, y, 1, r + i, r + i + 1);
    }
    _tile_release();
}

/* ---- T > 1: activations in A, weights (a panel of pairs) in B ---- */

/* The 16 x 16 dword transpose: v[n] (row n, dwords p) -> v[p] (dword p of each row n, lane n). */
INLINE void amx_tr16(__m512i v[16]) {
    __m512i t[16], s[16];
    UNROLL for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    UNROLL for (int i = 0; i < 4; i++) {
        s[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* s[4i + c], 128-bit lane l: rows 4i .. 4i+3, dword 4l + c */
    UNROLL for (int c = 0; c < 4; c++) {
        __m512i u0 = _mm512_shuffle_i32x4(s[c], s[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(s[c], s[4 + c], 0xEE);
        __m512i u2 = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0x44), u3 = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0xEE);
        v[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        v[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        v[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        v[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
}

/* B tiles for rows [r, r + m) (m <= 16; the others zero) and blocks [kb0, kb0 + nb): tile b
 * row p holds the pair (W[n][32 b + 2p], W[n][32 b + 2p + 1]) of each row n. */
static void amx_panel(const dsf_wmat *w, int64_t r, int m, int64_t kb0, int nb, uint16_t (*dst)[16][32], int mx,
                      uint32_t *bad, int bsh) {
    const __m512i tbl = _mm512_load_si512((const void *)amx_e2m1_x125), sh = _mm512_load_si512((const void *)amx_nib_shift);
    const uint8_t *a = w->data + (uint64_t)r * w->row_bytes;
    const __m512i ridx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)w->row_bytes));
    _Alignas(64) int32_t s32[16];
    for (int b = 0; b < nb; b++) {
        __m512i v[16];
        if (mx) *bad |= amx_scales(a, ridx, kb0 + b, m, s32) << bsh;
        for (int n = 0; n < 16; n++) {
            const uint8_t *p = a + (uint64_t)n * w->row_bytes;
            if (n >= m) v[n] = _mm512_setzero_si512();
            else if (mx) v[n] = amx_dec_mx(p + (uint64_t)(kb0 + b) * 17 + 1, tbl, sh, s32[n]);
            else v[n] = _mm512_loadu_si512((const void *)(p + (uint64_t)(kb0 + b) * 64));
        }
        amx_tr16(v);
        UNROLL for (int p = 0; p < 16; p++) _mm512_store_si512((void *)dst[b][p], v[p]);
    }
}

/* C tile CT <- y[t0 .. t0+16)[r .. r+16) (zero for the first K chunk); a partial tile (mt
 * tokens, mr rows) goes through cb. */
#define C_LOAD(CT, t0, r, mt, mr)                                                               \
    do {                                                                                        \
        if (kb0 == 0) _tile_zero(CT);                                                           \
        else if ((mt) == 16 && (mr) == 16) _tile_loadd(CT, y + (t0) * ldy + (r), (long)(ldy * 4)); \
        else {                                                                                  \
            memset(cb, 0, sizeof cb);                                                           \
            for (int i_ = 0; i_ < (mt); i_++) memcpy(cb[i_], y + ((t0) + i_) * ldy + (r), (size_t)(mr) * 4); \
            _tile_loadd(CT, cb, 64);                                                            \
        }                                                                                       \
    } while (0)
#define C_STORE(CT, t0, r, mt, mr)                                                              \
    do {                                                                                        \
        if ((mt) == 16 && (mr) == 16) _tile_stored(CT, y + (t0) * ldy + (r), (long)(ldy * 4));  \
        else {                                                                                  \
            _tile_stored(CT, cb, 64);                                                           \
            for (int i_ = 0; i_ < (mt); i_++) memcpy(y + ((t0) + i_) * ldy + (r), cb[i_], (size_t)(mr) * 4); \
        }                                                                                       \
    } while (0)

/* The blocks of a K chunk for 1 or 2 token tiles (A: tiles 4, 5) x 1 or 2 row tiles (B: 6, 7)
 * into C tiles 0-3 (C tile 2 i + j: token tile i, row tile j). */
#define TN_STEPS(NT2, NR2)                                                                      \
    do {                                                                                        \
    for (int b = 0; b < nb; b++) {                                                              \
        _tile_loadd(4, a0 + b * 32, s0);                                                        \
        _tile_loadd(6, panel[0][b], 64);                                                        \
        if (NT2) _tile_loadd(5, a1 + b * 32, s1);                                               \
        if (NR2) _tile_loadd(7, panel[1][b], 64);                                               \
        _tile_dpbf16ps(0, 4, 6);                                                                \
        if (NR2) _tile_dpbf16ps(1, 4, 7);                                                       \
        if (NT2) _tile_dpbf16ps(2, 5, 6);                                                       \
        if ((NT2) && (NR2)) _tile_dpbf16ps(3, 5, 7);                                            \
    }                                                                                           \
    } while (0)

static void amx_tn(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                   const int mx) {
    const int64_t nkb = w->n_in / 32, n_in = w->n_in;
    const int64_t ttail = T % 16 ? T - T % 16 : T; /* the first token of a partial tile */
    _Alignas(64) uint16_t panel[2][AKB][16][32];
    _Alignas(64) uint16_t xpad[16][AKB * 32];
    _Alignas(64) float cb[16][16];
    amx_config((int[4]){16, 16, 16, 16}, (int[4]){64, 64, 64, 64}, (int[2]){16, 16}, (int[2]){64, 64});
    for (int64_t rg = r0; rg < r1; rg += 32) {
        const int m0 = rg + 16 <= r1 ? 16 : (int)(r1 - rg);
        const int m1 = rg + 16 >= r1 ? 0 : rg + 32 <= r1 ? 16 : (int)(r1 - rg - 16);
        uint32_t bad = 0;
        for (int64_t kb0 = 0; kb0 < nkb; kb0 += AKB) {
            const int nb = kb0 + AKB <= nkb ? AKB : (int)(nkb - kb0);
            amx_panel(w, rg, m0, kb0, nb, panel[0], mx, &bad, 0);
            if (m1) amx_panel(w, rg + 16, m1, kb0, nb, panel[1], mx, &bad, 16);
            if (ttail < T) {
                memset(xpad, 0, sizeof xpad);
                for (int64_t t = ttail; t < T; t++) memcpy(xpad[t - ttail], x + t * n_in + kb0 * 32, (size_t)nb * 64);
            }
            for (int64_t t = 0; t < T; t += 32) {
                const int mt0 = t + 16 <= T ? 16 : (int)(T - t);
                const int mt1 = t + 16 >= T ? 0 : t + 32 <= T ? 16 : (int)(T - t - 16);
                const uint16_t *a0 = mt0 == 16 ? x + t * n_in + kb0 * 32 : xpad[0];
                const uint16_t *a1 = mt1 == 16 ? x + (t + 16) * n_in + kb0 * 32 : xpad[0];
                const long s0 = mt0 == 16 ? (long)(n_in * 2) : AKB * 64, s1 = mt1 == 16 ? (long)(n_in * 2) : AKB * 64;
                C_LOAD(0, t, rg, mt0, m0);
                if (m1) C_LOAD(1, t, rg + 16, mt0, m1);
                if (mt1) C_LOAD(2, t + 16, rg, mt1, m0);
                if (mt1 && m1) C_LOAD(3, t + 16, rg + 16, mt1, m1);
                if (mt1 && m1) TN_STEPS(1, 1);
                else if (mt1) TN_STEPS(1, 0);
                else if (m1) TN_STEPS(0, 1);
                else TN_STEPS(0, 0);
                C_STORE(0, t, rg, mt0, m0);
                if (m1) C_STORE(1, t, rg + 16, mt0, m1);
                if (mt1) C_STORE(2, t + 16, rg, mt1, m0);
                if (mt1 && m1) C_STORE(3, t + 16, rg + 16, mt1, m1);
            }
        }
        for (int i = 0; bad && i < 32; i++)
            if (bad & (1u << i)) matmul_xbf16_any_ref(w, x, T, y, ldy, rg + i, rg + i + 1);
    }
    _tile_release();
}

static void amx_mm(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                   const int mx, matmul_xbf16_fn other) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0) { /* no V4.1 matrix: the avx512 kernel (or its twin) for every T */
        other(w, x, T, y, ldy, r0, r1);
        return;
    }
    if (T == 1 && mx) amx_t1_mx(w, x, y, r0, r1);
    else if (T == 1) amx_t1_bf16(w, x, y, r0, r1);
    else amx_tn(w, x, T, y, ldy, r0, r1, mx);
}

static void amx_bf16(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    amx_mm(w, x, T, y, ldy, r0, r1, 0, kernels_avx512.matmul_xbf16[GGML_TYPE_BF16]);
}

static void amx_mxfp4(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    amx_mm(w, x, T, y, ldy, r0, r1, 1, kernels_avx512.matmul_xbf16[GGML_TYPE_MXFP4]);
}

/* DSF_TYPE_FP8B32: rows decoded to BF16 (fp8_avx512.c) and amx_bf16 run on them, for every T
 * (the tiles' sums cannot be repeated in registers): bit for bit amx_bf16 on the same values. */
static void amx_fp8b32(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    fp8b32_xbf16_via_avx512(w, x, T, y, ldy, r0, r1, amx_bf16);
}

/* The BF16 peak of this table: independent TDPBF16PS into 4 accumulators from registers. */
static uint64_t amx_peak_probe(int64_t iters, int bf16, float *sink) {
    if (!bf16) return kernels_avx512.peak_probe(iters, bf16, sink);
    _Alignas(64) uint16_t a[16][32];
    _Alignas(64) float c[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++) a[i][j] = (uint16_t)(0x3F80 + ((i * 7 + j) & 15)); /* ~1: no overflow */
    amx_config((int[4]){16, 16, 16, 16}, (int[4]){64, 64, 64, 64}, (int[2]){16, 16}, (int[2]){64, 64});
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, a, 64);
    _tile_loadd(7, a, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const int64_t n = iters / 8 > 0 ? iters / 8 : 1; /* ~the time of the avx512 probe's iters */
    for (int64_t i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    *sink += c[3][5];
    return (uint64_t)n * 4 * 16 * 16 * 32 * 2;
}

/* The amx tables: kernels_avx512 with the entries above. "amx" keeps MXFP4 on the avx512
 * kernels (repacked experts): the T = 1 tile here decodes each block into BF16 rows first and
 * is slower than the avx512 repacked decode, so decode would lose more than prefill gains
 * (docs/perf-log.md, item 31). "amx-mxfp4" (DSF_KERNELS=amx-mxfp4) runs MXFP4 on the
 * tiles too and has no repacked kernel, so the engine keeps the file's rows. */
void kernels_amx_init(dsf_kernels *k, int mxfp4) {
    *k = kernels_avx512;
    k->name = mxfp4 ? "amx-mxfp4" AMX_TABLE_SUFFIX : "amx" AMX_TABLE_SUFFIX;
    k->matmul_xbf16[GGML_TYPE_BF16] = amx_bf16;
    k->fp8b32_xbf16 = amx_fp8b32;
    if (mxfp4) {
        k->matmul_xbf16[GGML_TYPE_MXFP4] = amx_mxfp4;
        k->mxfp4r_xbf16 = NULL;
    }
    k->peak_probe = amx_peak_probe;
}
int kernels_amx_built(void) { return 1; }
#else
void kernels_amx_init(dsf_kernels *k, int mxfp4) {
    (void)mxfp4;
    *k = kernels_ref;
}
int kernels_amx_built(void) { return 0; }
#endif
