/* q8k_iq_avx512.c: AVX-512 (VNNI, VBMI) matmul kernels of IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S and IQ1_M weights with Q8_K activations (matmul.h matmul_q8k_fn, the
 * opt-in mode), decode (T = 1) and prefill (T > 1). Compiled with the Makefile's AVX512_FLAGS
 * only; the entries sit in kernels_avx512 (matmul_avx512.c) and run only where select.c chose
 * that table.
 *
 * Owns: these types' super-block decoders to int8 weight codes, the activations' per-call
 * reordering (q8_sb) and the tiles. Must not: allocate (the panels and the reordered activations
 * are on the stack), call select.c, or change an activation code. Rows whose n_in is not a
 * multiple of 256 or is above 16384 go to the scalar twin matmul_q8k_any_ref.
 *
 * Numerics. A weight is m * q: q a small integer (IQ4_XS: a grid_iq4nl entry, -127..113; IQ2:
 * +-8, 25 or 43, IQ3: 1..62, a grid value with its sign; IQ1: 8 (grid value) + 8 delta, +-1,
 * +-7, +-9) and m its group's multiplier (one per 32 weights: d * (ls - 32), d * (0.5 + s) *
 * 0.25 for IQ2_XXS, d * (0.5 + s) * 0.5 for IQ3_XXS, d * (1 + 2s) for IQ3_S, d / 8 * (2s + 1)
 * for IQ1_S; one per 16 for IQ2_XS and IQ2_S: d * (0.5 + s) * 0.25, IQ1_M: d / 8 * (2s + 1);
 * all exact in fp32). The q are stored as the unsigned bytes 128 + q and meet the int8
 * activation codes in vpdpbusd, each dword lane summing products of one group; the lane starts
 * from -128 times the sum of the activation codes it will meet (q8_sb.nc, computed once per
 * token by vpdpbusd of 128s), so it ends holding the exact integer sum of q * code over its 16
 * products (|.| < 2^19, exact in fp32). Per super-block and (row, token): f = float(lane) * m
 * (IQ2_XS, IQ2_S, IQ1_M: two lanes, one per half of the group, f = fma(float(lane_1), m_1,
 * float(lane_0) * m_0)), then acc = fma(f, d_x, acc) in 16 lanes; the accumulator is summed by
 * red4 / red4x4's lane tree per K chunk of KB super-blocks and the chunks' sums are added in
 * order. Each output is thus the exact product up to fp32 rounding.
 *
 * Layout: a super-block of a row becomes 4 byte vectors W[k] (qword q: 8 weights of group q;
 * which 8: the q8_sb permutation of the type; IQ2_XS, IQ2_S, IQ3, IQ1: elements 8k .. 8k + 7,
 * sub-group k: the grid entries' class codes (IQ2: 2 bits, IQ3: 3 bits per value) by vpermt2w
 * from a table built per call (IQ2_XS, IQ2_S: 1.4-1.5x, IQ3: 2.5-3x as fast as scalar loads or
 * gathers of the entries), or scalar loads (IQ1)) and S
 * (dword lanes 2q, 2q + 1: group q's m); the activations are reordered to match (q8_sb.x[k],
 * byte 8q + b <- element 32q + f(k, b)).
 *
 * Batch invariance: the integer lane sums are exact, so their order is free; the fp32 steps
 * above run in the same order for every (row, token) whatever T, the tile and the row range:
 * T = 1 decodes each super-block on the fly; T > 1 decodes a row tile's K chunk once into a
 * panel and runs 4-token tiles over it. */
#include "kernels/q8k_iq.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/grids.h"
#include "kernels/tile512.h"

#define QK 256      /* weights per super-block */
#define KB 4        /* K chunk in super-blocks, every T */
#define ITC 64      /* tokens per chunk (T > 1): the chunk's reordered activations stay in L2 */
#define Q8_MAX_IN 16384

/* One token's super-block, reordered for a type. */
typedef struct {
    int8_t x[4][64];  /* vector k, byte 8q + b: the code of element 32q + f(k, b) */
    int32_t nc[16];   /* -128 * the sum of the codes that meet dword lane l (over the 4 vectors) */
    int32_t nh[2][16]; /* the same over vectors 0, 1 (nh[0]) and over vectors 2, 3 (nh[1]) */
    float d;          /* the block's scale */
    uint8_t pad_[60];
} q8_sb;
_Static_assert(sizeof(q8_sb) == 512, "q8_sb: eight cache lines");

/* The reorder within a pair of groups (64 codes): byte 8j + b <- 32 (j / 4) + f(j % 4, b).
 * IQ2_XXS f(k, b) = 16 (k / 2) + 2b + k % 2; IQ4_XS f(k, b) = 8 (k / 2) + b + 16 (k % 2). */
#define ROW8(F, j) F(j, 0), F(j, 1), F(j, 2), F(j, 3), F(j, 4), F(j, 5), F(j, 6), F(j, 7)
#define ALL64(F) ROW8(F, 0), ROW8(F, 1), ROW8(F, 2), ROW8(F, 3), ROW8(F, 4), ROW8(F, 5), ROW8(F, 6), ROW8(F, 7)
#define F_IQ2(j, b) (32 * ((j) >> 2) + 16 * (((j) & 3) >> 1) + 2 * (b) + ((j) & 1))
#define F_IQ4(j, b) (32 * ((j) >> 2) + 8 * (((j) & 3) >> 1) + (b) + 16 * ((j) & 1))
#define F_NAT(j, b) (32 * ((j) >> 2) + 8 * ((j) & 3) + (b))
static const uint8_t pair_iq2xxs[64] __attribute__((aligned(64))) = {ALL64(F_IQ2)};
static const uint8_t pair_iq4xs[64] __attribute__((aligned(64))) = {ALL64(F_IQ4)};
static const uint8_t pair_nat[64] __attribute__((aligned(64))) = {ALL64(F_NAT)}; /* IQ2_XS, IQ2_S */

/* IQ2_XXS, two rows' 64 grid indices in one vector: byte 16L + 8t + 4m + k <- row t's group
 * 2L + m, index k (row t's super-block from byte 64t), so that unpacklo / unpackhi of the two
 * looked-up code bytes give row 0's / row 1's group q codes in qword q. */
#define IX2(j, b) (64 * ((j) & 1) + 16 * ((j) >> 1) + 8 * ((b) >> 2) + ((b) & 3))
static const uint8_t ix_iq2xxs[64] __attribute__((aligned(64))) = {ALL64(IX2)};
/* IQ2_XS / IQ2_S: byte 8q + j <- mask byte 4q (of sub-group 0; + k for sub-group k) */
#define SPR(j, b) (4 * (j))
static const uint8_t spread_sg[64] __attribute__((aligned(64))) = {ALL64(SPR)};
/* IQ2_S: byte 4q + k <- bit 8q + 2k of qh (the high index bits of entry (q, k)), 32 bytes */
#define QHB(j, b) (8 * ((8 * (j) + (b)) >> 2 & 7) + 2 * ((b) & 3))
static const uint8_t qh_iq2s[64] __attribute__((aligned(64))) = {ALL64(QHB)};
/* IQ1: (code c | sign << 2; bits 3-5 zero) -> 128 + 8 (c - 1) + (sign ? -1 : 1) */
#define V1(j, b) (uint8_t)(128 + 8 * (((8 * (j) + (b)) & 3) - 1) + (((8 * (j) + (b)) >> 2 & 1) ? -1 : 1))
static const uint8_t iq1_vals[64] __attribute__((aligned(64))) = {ALL64(V1)};


/* (c0 | c1 << 2 | s0 << 4 | s1 << 5; bits 6, 7 ignored) -> 128 + element 0's signed value
 * (lo), resp. element 1's (hi); class code c: 0, 1, 2 = 8, 25, 43. */
#define GV(c) ((c) == 0 ? 8 : (c) == 1 ? 25 : (c) == 2 ? 43 : 0)
#define SV(c, s) (uint8_t)(128 + ((s) ? -GV(c) : GV(c)))
#define T_LO(j, b) SV((8 * (j) + (b)) & 3, ((8 * (j) + (b)) >> 4) & 1)
#define T_HI(j, b) SV(((8 * (j) + (b)) >> 2) & 3, ((8 * (j) + (b)) >> 5) & 1)
static const uint8_t iq2_lo[64] __attribute__((aligned(64))) = {ALL64(T_LO)};
static const uint8_t iq2_hi[64] __attribute__((aligned(64))) = {ALL64(T_HI)};
#undef T_HI
#undef T_LO
#undef SV
#undef GV
#undef IX2
#undef SPR
#undef QHB
#undef V1
#undef F_IQ4
#undef F_NAT
#undef F_IQ2
#undef ALL64
#undef ROW8

INLINE float f16at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Reorders nb super-blocks of one token's activations by the pair table pt into o. */
static void prep_x(const dsf_q8k *x, int64_t nb, const uint8_t *pt, q8_sb *o) {
    const __m512i pi = _mm512_load_si512((const void *)pt), ones = _mm512_set1_epi8((char)0x80);
    const __m512i qi = _mm512_setr_epi64(0, 4, 8, 12, 0, 4, 8, 12);
    for (int64_t b = 0; b < nb; b++) {
        __m512i v[4], c = _mm512_setzero_si512(), h0 = c;
        UNROLL for (int i = 0; i < 4; i++) v[i] = _mm512_permutexvar_epi8(pi, _mm512_loadu_si512((const void *)(x[b].qs + 64 * i)));
        UNROLL for (int k = 0; k < 4; k++) { /* qword q <- v[q / 2] qword 4 (q % 2) + k */
            const __m512i ik = _mm512_add_epi64(qi, _mm512_set1_epi64(k));
            __m512i xk = _mm512_shuffle_i64x2(_mm512_permutex2var_epi64(v[0], ik, v[1]), _mm512_permutex2var_epi64(v[2], ik, v[3]), 0x44);
            _mm512_store_si512((void *)o[b].x[k], xk);
            c = _mm512_dpbusd_epi32(c, ones, xk);
            if (k == 1) h0 = c;
        }
        _mm512_store_si512((void *)o[b].nc, _mm512_sub_epi32(_mm512_setzero_si512(), c));
        _mm512_store_si512((void *)o[b].nh[0], _mm512_sub_epi32(_mm512_setzero_si512(), h0));
        _mm512_store_si512((void *)o[b].nh[1], _mm512_sub_epi32(h0, c));
        o[b].d = x[b].d;
    }
}

/* grid_iq2xxs as 2-bit class codes (value >> 4: 8, 25, 43 -> 0, 1, 2): c[i] elements 0-3 of
 * entry i, c[256 + i] elements 4-7, element j at bits 2 (j % 4). Built per call (~60 cycles). */
static void iq2xxs_class_codes(uint8_t *c) {
    const __m128i ev = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int i = 0; i < 256; i += 8) {
        __m512i k = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(grid_iq2xxs + i)), 4), _mm512_set1_epi8(3));
        __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(k, _mm512_set1_epi16(0x0401)), _mm512_set1_epi32(0x00100001));
        __m128i b = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(d), ev);
        _mm_storel_epi64((__m128i *)(void *)(c + i), b);
        _mm_storel_epi64((__m128i *)(void *)(c + 256 + i), _mm_unpackhi_epi64(b, b));
    }
}

/* 64 lookups (byte indices idx) in the 256-byte table t. */
INLINE __m512i look256(const uint8_t *t, __m512i idx) {
    const __m512i *v = (const __m512i *)(const void *)t;
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), _mm512_permutex2var_epi8(v[0], idx, v[1]),
                                  _mm512_permutex2var_epi8(v[2], idx, v[3]));
}

/* IQ2_XXS {f16 d; 8 x (u8 idx[4]; u32 signs 7k.. | s << 28)}, two rows -> W[t][k], S[t]. */
INLINE void dec2_iq2xxs(const uint8_t *const *p, const uint8_t *codes, __m512i (*W)[4], __m512 *S) {
    const __m512i g0 = _mm512_loadu_si512((const void *)(p[0] + 2)), g1 = _mm512_loadu_si512((const void *)(p[1] + 2));
    const __m512i idx = _mm512_permutex2var_epi8(g0, _mm512_load_si512((const void *)ix_iq2xxs), g1);
    const __m512i lo = look256(codes, idx), hi = look256(codes + 256, idx);
    const __m512i cq[2] = {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
    /* sign masks: qword q bytes 0-3 row 0's group q, bytes 4-7 row 1's (selectors at 32 + 7k) */
    const __m512i sel = _mm512_mask_blend_epi8(0xF0F0F0F0F0F0F0F0ull, _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720ll), g0),
                                               _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E272000000000ll), g1));
    const __m512i sg = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)grid_iq2_signs), sel,
                                                _mm512_loadu_si512((const void *)(grid_iq2_signs + 64)));
    const __m512i tlo = _mm512_load_si512((const void *)iq2_lo), thi = _mm512_load_si512((const void *)iq2_hi);
    const __m512 mul = _mm512_setr_ps(0.125f, 0.375f, 0.625f, 0.875f, 1.125f, 1.375f, 1.625f, 1.875f, 2.125f, 2.375f,
                                      2.625f, 2.875f, 3.125f, 3.375f, 3.625f, 3.875f); /* (0.5 + s) / 4 */
    UNROLL for (int t = 0; t < 2; t++) {
        UNROLL for (int h = 0; h < 2; h++) {
            /* byte b: codes of elements 16h + 2b, + 1 (bits 0-3), their signs (bits 4-5) */
            const uint64_t cb = (uint64_t)(32 * h) * 0x0101010101010101ull + 0x1C1814100C080400ull;
            const uint64_t sb = ((uint64_t)(16 * h + 32 * t) * 0x0101010101010101ull + 0x0A08060402003E3Cull) & 0x3F3F3F3F3F3F3F3Full;
            __m512i n = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)cb), cq[t]),
                                                  _mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)sb), sg),
                                                  _mm512_set1_epi8(0x0F), 0xE4);
            W[t][2 * h] = _mm512_permutexvar_epi8(n, tlo);
            W[t][2 * h + 1] = _mm512_permutexvar_epi8(n, thi);
        }
        const __m512i sc = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0000003C0000003Cll), t ? g1 : g0);
        S[t] = _mm512_mul_ps(_mm512_set1_ps(f16at(p[t])), _mm512_permutexvar_ps(sc, mul));
    }
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]} -> W[k], S. tab: 128 + grid_iq4nl
 * at every index's low 4 bits. */
INLINE void dec_iq4xs(const uint8_t *b, __m512i tab, __m512i *W, __m512 *S) {
    const __m512i z0 = _mm512_loadu_si512((const void *)(b + 8)), z1 = _mm512_loadu_si512((const void *)(b + 72));
    const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    UNROLL for (int h = 0; h < 2; h++) { /* qword q: bytes 8h .. 8h + 7 of group q */
        __m512i n = _mm512_permutex2var_epi64(z0, _mm512_add_epi64(ev, _mm512_set1_epi64(h)), z1);
        W[2 * h] = _mm512_permutexvar_epi8(n, tab);
        W[2 * h + 1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(n, 4), tab);
    }
    /* byte l: group l / 2's scales_l nibble (bits 0-3) and scales_h bits (bits 4-5) */
    uint64_t hd;
    memcpy(&hd, b, 8); /* d | scales_h << 16 | scales_l << 32 */
    const __m128i v = _mm_set1_epi64x((long long)hd);
    const __m128i lo = _mm_multishift_epi64_epi8(_mm_set_epi64x(0x3C3C383834343030ll, 0x2C2C282824242020ll), v);
    const __m128i hi = _mm_multishift_epi64_epi8(_mm_set_epi64x(0x1A1A181816161414ll, 0x121210100E0E0C0Cll), v);
    const __m512i ls = _mm512_and_si512(_mm512_cvtepu8_epi32(_mm_ternarylogic_epi32(lo, hi, _mm_set1_epi8(0x0F), 0xE4)),
                                        _mm512_set1_epi32(63));
    const float d = f16at(b);
    *S = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ls), _mm512_set1_ps(d), _mm512_set1_ps(-32.0f * d)); /* d (ls - 32), exact */
}

/* ---- IQ2_XS, IQ2_S: a multiplier per 16 weights, vectors 0-1 and 2-3 (pair_nat) ---- */

/* grid (n 8-value entries of 8, 25, 43) as 16-bit class codes (value >> 4: 0, 1, 2; value j at
 * bits 2j) into c. Built per call (n / 8 steps of 5 instructions). */
static void iq2_class_words(const uint64_t *grid, int n, uint16_t *c) {
    for (int i = 0; i < n; i += 8) {
        __m512i k = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(grid + i)), 4), _mm512_set1_epi8(3));
        __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(k, _mm512_set1_epi16(0x0401)), _mm512_set1_epi32(0x00100001));
        _mm_storeu_si128((__m128i *)(void *)(c + i), _mm512_cvtepi32_epi8(d)); /* byte 2e: values 0-3, 2e + 1: 4-7 */
    }
}

/* The words t[ix] of a table of n (a power of two, 64 .. 1024) for 32 indices: vpermt2w per
 * 64 entries, then a blend tree on index bits 6, 7, ... */
INLINE __m512i look_w(const uint16_t *t, const int n, __m512i ix) {
    const __m512i *v = (const __m512i *)(const void *)t;
    __m512i r[16];
    UNROLL for (int c = 0; c < n / 64; c++) r[c] = _mm512_permutex2var_epi16(v[2 * c], ix, v[2 * c + 1]);
    UNROLL for (int m = n / 64, bit = 64; m > 1; m /= 2, bit *= 2) {
        const __mmask32 hi = _mm512_test_epi16_mask(ix, _mm512_set1_epi16((short)bit));
        UNROLL for (int c = 0; c < m / 2; c++) r[c] = _mm512_mask_blend_epi16(hi, r[2 * c], r[2 * c + 1]);
    }
    return r[0];
}

/* Vector k of grid values g (0 < g < 128; qword q: sub-group k of group q) -> 128 + g, or
 * 128 - g where bit j of the mask byte 4q + k of sm is set. */
INLINE __m512i signed_w(__m512i g, __m512i sm, int k) {
    const __m512i bits = _mm512_set1_epi64((long long)0x8040201008040201ull);
    const __m512i u = _mm512_or_si512(g, _mm512_set1_epi8((char)0x80));
    const __m512i sp = _mm512_add_epi8(_mm512_load_si512((const void *)spread_sg), _mm512_set1_epi8((char)k));
    return _mm512_mask_sub_epi8(u, _mm512_test_epi8_mask(_mm512_permutexvar_epi8(sp, sm), bits), _mm512_setzero_si512(), u);
}

/* W[k] (qword q: the grid entry of sub-group k of group q, index word 4q + k of ix, through the
 * class table cls of n entries), signed by sm (signed_w). */
INLINE void grid_h(const uint16_t *cls, const int n, __m512i ix, __m512i sm, __m512i *W) {
    const __m512i c = look_w(cls, n, ix), mag = _mm512_set1_epi32(0x002B1908); /* code -> 8, 25, 43 */
    UNROLL for (int k = 0; k < 4; k++) {
        const uint64_t ctl = (uint64_t)(16 * k) * 0x0101010101010101ull + 0x0E0C0A0806040200ull;
        W[k] = signed_w(_mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)ctl), c), mag), sm, k);
    }
}

/* S[h] lanes 2q, 2q + 1: d (0.5 + s) / 4 of group q's half h (s: nibble h of sc[q]), exact. */
INLINE void scales_h(const uint8_t *sc, float d, __m512 *S) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)sc), dup = _mm_unpacklo_epi8(v, v);
    const __m128i n[2] = {_mm_and_si128(dup, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(dup, 4), _mm_set1_epi8(15))};
    UNROLL for (int h = 0; h < 2; h++)
        S[h] = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(n[h])), _mm512_set1_ps(0.25f),
                                                                _mm512_set1_ps(0.125f)));
}

/* IQ2_XS {f16 d; u16 qs[32] (9-bit index | 7-bit sign selector << 9); u8 scales[8]} */
INLINE void dec_iq2xs(const uint8_t *b, const uint16_t *cls, __m512i *W, __m512 *S) {
    const __m512i v = _mm512_loadu_si512((const void *)(b + 2)); /* the selectors -> mask bytes */
    const __m512i sel = _mm512_zextsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 9)));
    grid_h(cls, 512, _mm512_and_si512(v, _mm512_set1_epi16(511)),
           _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)grid_iq2_signs), sel, _mm512_loadu_si512((const void *)(grid_iq2_signs + 64))), W);
    scales_h(b + 66, f16at(b), S);
}

/* IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: index (q, k) = qs[4q + k] |
 * (qh[q] >> 2k & 3) << 8; the sign bytes are the masks. */
INLINE void dec_iq2s(const uint8_t *b, const uint16_t *cls, __m512i *W, __m512 *S) {
    uint64_t qh;
    memcpy(&qh, b + 66, 8);
    const __m512i hb = _mm512_and_si512(_mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)qh_iq2s), _mm512_set1_epi64((long long)qh)),
                                        _mm512_set1_epi8(3));
    const __m512i ix = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(b + 2))),
                                       _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(hb)), 8));
    grid_h(cls, 1024, ix, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b + 34))), W);
    scales_h(b + 74, f16at(b), S);
}

/* ---- IQ3_XXS, IQ3_S: 4-value grid entries, two per sub-group, a multiplier per 32 (pair_nat) ---- */

/* grid (n 4-value entries of 8 magnitudes v: code v >> sh) as 12-bit class codes (value j at
 * bits 3j) into c, built per call. */
static void iq3_class_words(const uint32_t *grid, int n, int sh, uint16_t *c) {
    for (int i = 0; i < n; i += 16) {
        __m512i k = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512((const void *)(grid + i)), _mm_cvtsi32_si128(sh)), _mm512_set1_epi8(7));
        __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(k, _mm512_set1_epi16(0x0801)), _mm512_set1_epi32(0x00400001));
        _mm256_storeu_si256((__m256i *)(void *)(c + i), _mm512_cvtepi32_epi16(d));
    }
}

/* W[k] (qword q: the entries of index bytes 8q + 2k, + 1 of ix, plus 256 where the same bit
 * of hi is set; n entries) through the class table cls and the magnitudes mag (code -> value),
 * signed by sm (signed_w). */
INLINE void grid4_h(const uint16_t *cls, const int n, __m512i ix, __mmask64 hi, __m512i mag, __m512i sm, __m512i *W) {
    __m512i r[2];
    UNROLL for (int h = 0; h < 2; h++) { /* index bytes 32h .. 32h + 31 as words */
        __m512i i = _mm512_cvtepu8_epi16(h ? _mm512_extracti64x4_epi64(ix, 1) : _mm512_castsi512_si256(ix));
        if (n > 256) i = _mm512_mask_add_epi16(i, (__mmask32)(_cvtmask64_u64(hi) >> 32 * h), i, _mm512_set1_epi16(256));
        r[h] = look_w(cls, n, i);
    }
    const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    /* V[p] qword q: the codes of entries 8q + 4p .. + 3 (16 bits each) */
    const __m512i V[2] = {_mm512_permutex2var_epi64(r[0], ev, r[1]),
                          _mm512_permutex2var_epi64(r[0], _mm512_add_epi64(ev, _mm512_set1_epi64(1)), r[1])};
    UNROLL for (int k = 0; k < 4; k++) { /* byte b: value b % 4 of entry 8q + 2k + b / 4 */
        const uint64_t ctl = (uint64_t)(32 * (k % 2)) * 0x0101010101010101ull + 0x1916131009060300ull;
        W[k] = signed_w(_mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)ctl), V[k / 2]), mag), sm, k);
    }
}

/* S lanes 2q, 2q + 1 <- v[q] (8 dwords) as fp32 times a, plus c, times d (all exact) */
INLINE __m512 mult8(__m256i v, float a, float c, float d) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512 s = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(v)));
    return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_fmadd_ps(s, _mm512_set1_ps(a), _mm512_set1_ps(c)));
}

/* IQ3_XXS {f16 d; u8 qs[64]; u32 scales_signs[8] (selector k at bits 7k, s at bits 28-31)}:
 * m = d (0.5 + s) / 2 */
INLINE void dec_iq3xxs(const uint8_t *b, const uint16_t *cls, __m512i *W, __m512 *S) {
    const __m256i ss = _mm256_loadu_si256((const __m256i *)(const void *)(b + 66));
    /* byte 4q + k <- bits 7k.. of group q's word (qword Q holds groups 2Q, 2Q + 1) */
    const __m512i sel = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720150E0700ll), _mm512_castsi256_si512(ss));
    const __m512i sm = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)grid_iq2_signs), sel,
                                                _mm512_loadu_si512((const void *)(grid_iq2_signs + 64)));
    grid4_h(cls, 256, _mm512_loadu_si512((const void *)(b + 2)), 0, _mm512_set1_epi64(0x3E342C241C140C04ll), sm, W);
    *S = mult8(_mm256_srli_epi32(ss, 28), 0.5f, 0.25f, f16at(b));
}

/* IQ3_S {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: m = d (1 + 2s) */
INLINE void dec_iq3s(const uint8_t *b, const uint16_t *cls, __m512i *W, __m512 *S) {
    uint64_t qh;
    uint32_t sc;
    memcpy(&qh, b + 66, 8);
    memcpy(&sc, b + 106, 4);
    grid4_h(cls, 512, _mm512_loadu_si512((const void *)(b + 2)), _cvtu64_mask64(qh), _mm512_set1_epi64(0x0F0D0B0907050301ll),
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b + 74))), W);
    const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sc), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(15));
    *S = mult8(s, 2.0f, 1.0f, f16at(b));
}

/* ---- IQ1_S, IQ1_M: 8-value entries of 2-bit codes (value + 1), q = 8 value +- 1 (the delta
 * times 8; m carries the 1/8), pair_nat ---- */

/* (entry index, delta sign) of sub-group k of group q: IQ1_M (m1) or IQ1_S (b its super-block) */
INLINE uint32_t iq1_entry(const uint8_t *b, const int m1, int q, int k) {
    if (m1) {
        const unsigned h = (unsigned)b[32 + 2 * q + k / 2] >> 4 * (k % 2);
        return (uint32_t)grid_iq1s[b[4 * q + k] | (h & 7) << 8] | (uint32_t)(h >> 3 & 1) << 31;
    }
    const unsigned h = (unsigned)(b[34 + 2 * q] | b[35 + 2 * q] << 8);
    return (uint32_t)grid_iq1s[b[2 + 4 * q + k] | (h >> 3 * k & 7) << 8] | (uint32_t)(h >> 15) << 31;
}

/* W[k]: byte j of qword q <- 128 + 8 (code j - 1) + (sign ? -1 : 1) of entry (q, k) */
INLINE void grid1_h(const uint8_t *b, const int m1, __m512i *W) {
    const __m512i tab = _mm512_load_si512((const void *)iq1_vals);
    UNROLL for (int k = 0; k < 4; k++) {
#define EQ(q) (long long)iq1_entry(b, m1, q, k)
        const __m512i e = _mm512_set_epi64(EQ(7), EQ(6), EQ(5), EQ(4), EQ(3), EQ(2), EQ(1), EQ(0));
#undef EQ
        /* bits 0-1: code j (bits 2j..); bit 2: the sign (bit 31); bits 3-5: bits 32.. (zero) */
        const __m512i n = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0E0C0A0806040200ll), e),
                                                    _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x1D1D1D1D1D1D1D1Dll), e),
                                                    _mm512_set1_epi8(3), 0xE4);
        W[k] = _mm512_permutexvar_epi8(n, tab);
    }
}

/* IQ1_S {f16 d; u8 qs[32]; u16 qh[8] (index bits 3k.., s at 12-14, delta sign 15)}: m = d (2s + 1) / 8 */
INLINE void dec_iq1s(const uint8_t *b, __m512i *W, __m512 *S) {
    grid1_h(b, 0, W);
    const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 34)));
    *S = mult8(_mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7)), 2.0f, 1.0f, f16at(b) * 0.125f);
}

/* IQ1_M {u8 qs[32]; u8 qh[16]; u16 sc[4] (s of group q's half h: bits 6 (q % 2) + 3h of sc[q / 2];
 * d: the top nibbles)}: m = d (2s + 1) / 8 per 16 weights */
INLINE void dec_iq1m(const uint8_t *b, __m512i *W, __m512 *S) {
    grid1_h(b, 1, W);
    uint16_t sc[4];
    memcpy(sc, b + 48, 8);
    const uint16_t dh = (uint16_t)(sc[0] >> 12 | (sc[1] >> 12) << 4 | (sc[2] >> 12) << 8 | (sc[3] >> 12) << 12);
    const float d = _cvtsh_ss(dh) * 0.125f;
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b + 48)));
    const __m256i wq = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    UNROLL for (int h = 0; h < 2; h++) {
        const __m256i sh = _mm256_setr_epi32(3 * h, 6 + 3 * h, 3 * h, 6 + 3 * h, 3 * h, 6 + 3 * h, 3 * h, 6 + 3 * h);
        S[h] = mult8(_mm256_and_si256(_mm256_srlv_epi32(wq, sh), _mm256_set1_epi32(7)), 2.0f, 1.0f, d);
    }
}

/* ---- per type ---- */
enum { TY_IQ4XS, TY_IQ2XXS, TY_IQ2XS, TY_IQ2S, TY_IQ3XXS, TY_IQ3S, TY_IQ1S, TY_IQ1M };
static const int ty_bytes[] = {136, 66, 74, 82, 98, 110, 50, 56};
#define TY_BYTES(ty) ty_bytes[ty]
#define TY_PAIR(ty) ((ty) == TY_IQ4XS ? pair_iq4xs : (ty) == TY_IQ2XXS ? pair_iq2xxs : pair_nat)
#define TY_HALVES(ty) ((ty) == TY_IQ2XS || (ty) == TY_IQ2S || (ty) == TY_IQ1M) /* a multiplier per 16 weights: S[0] vectors 0-1, S[1] 2-3 */

/* Two rows' super-blocks of a type (p[t]) -> W[t], S[t]. */
INLINE void dec2(const int ty, const uint8_t *const *p, const uint8_t *codes, __m512i (*W)[4], __m512 (*S)[2]) {
    if (ty == TY_IQ2XXS) {
        __m512 s[2];
        dec2_iq2xxs(p, codes, W, s);
        S[0][0] = s[0], S[1][0] = s[1];
        return;
    }
    const __m512i tab = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)grid_iq4nl)),
                                         _mm512_set1_epi8((char)0x80));
    UNROLL for (int t = 0; t < 2; t++) {
        if (ty == TY_IQ4XS) dec_iq4xs(p[t], tab, W[t], &S[t][0]);
        else if (ty == TY_IQ2XS) dec_iq2xs(p[t], (const uint16_t *)(const void *)codes, W[t], S[t]);
        else if (ty == TY_IQ2S) dec_iq2s(p[t], (const uint16_t *)(const void *)codes, W[t], S[t]);
        else if (ty == TY_IQ3XXS) dec_iq3xxs(p[t], (const uint16_t *)(const void *)codes, W[t], &S[t][0]);
        else if (ty == TY_IQ3S) dec_iq3s(p[t], (const uint16_t *)(const void *)codes, W[t], &S[t][0]);
        else if (ty == TY_IQ1S) dec_iq1s(p[t], W[t], &S[t][0]);
        else dec_iq1m(p[t], W[t], S[t]);
    }
}

/* One super-block of one (row, token) into acc (the order every tile keeps). */
INLINE __m512 sb_dot(const int ty, const __m512i *W, const __m512 *S, const q8_sb *xb, __m512 acc) {
    __m512 f;
    if (!TY_HALVES(ty)) {
        __m512i a = _mm512_load_si512((const void *)xb->nc);
        UNROLL for (int k = 0; k < 4; k++) a = _mm512_dpbusd_epi32(a, W[k], _mm512_load_si512((const void *)xb->x[k]));
        f = _mm512_mul_ps(_mm512_cvtepi32_ps(a), S[0]);
    } else {
        __m512i a[2];
        UNROLL for (int h = 0; h < 2; h++) {
            a[h] = _mm512_load_si512((const void *)xb->nh[h]);
            UNROLL for (int k = 2 * h; k < 2 * h + 2; k++) a[h] = _mm512_dpbusd_epi32(a[h], W[k], _mm512_load_si512((const void *)xb->x[k]));
        }
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[1]), S[1], _mm512_mul_ps(_mm512_cvtepi32_ps(a[0]), S[0]));
    }
    return _mm512_fmadd_ps(f, _mm512_set1_ps(xb->d), acc);
}

/* ---- tiles ---- */

/* T = 1: the 4 rows wr (their outputs' indices rr, -1: dropped) against the reordered token xs,
 * chunk by chunk (KB super-blocks: acc from zero, red4, added to y in chunk order). */
INLINE void t1_tile(const int ty, const uint8_t *const *wr, const int64_t *rr, const q8_sb *xs, int64_t nb,
                    const uint8_t *codes, float *y) {
    const int64_t bb = TY_BYTES(ty);
    for (int64_t b0 = 0; b0 < nb; b0 += KB) {
        __m512 a[4];
        float o[4];
        UNROLL for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();
        for (int64_t b = b0; b < b0 + KB && b < nb; b++)
            UNROLL for (int rp = 0; rp < 4; rp += 2) {
                const uint8_t *p[2] = {wr[rp] + b * bb, wr[rp + 1] + b * bb};
                __m512i W[2][4];
                __m512 S[2][2];
                for (int64_t ln = 0; ln < bb; ln += 64) { /* every line of the block (IQ4_XS: 136 bytes) */
                    _mm_prefetch((const char *)(p[0] + PF_DIST + ln), _MM_HINT_T0);
                    _mm_prefetch((const char *)(p[1] + PF_DIST + ln), _MM_HINT_T0);
                }
                dec2(ty, p, codes, W, S);
                UNROLL for (int t = 0; t < 2; t++) a[rp + t] = sb_dot(ty, W[t], S[t], xs + b, a[rp + t]);
            }
        red4(a, o);
        for (int i = 0; i < 4; i++)
            if (rr[i] >= 0) y[rr[i]] = b0 == 0 ? o[i] : y[rr[i]] + o[i];
    }
}

/* A row tile's K chunk decoded (T > 1). */
typedef struct {
    __m512i w[4][KB][4];
    __m512 s[4][KB][2];
} q8_panel;

INLINE void fill_panel(const int ty, const uint8_t *const *wr, int64_t b0, int64_t b1, const uint8_t *codes,
                       q8_panel *pn) {
    const int64_t bb = TY_BYTES(ty);
    for (int rp = 0; rp < 4; rp += 2)
        for (int64_t b = b0; b < b1; b++) {
            const uint8_t *p[2] = {wr[rp] + b * bb, wr[rp + 1] + b * bb};
            __m512i W[2][4];
            __m512 S[2][2];
            dec2(ty, p, codes, W, S);
            UNROLL for (int t = 0; t < 2; t++) {
                UNROLL for (int k = 0; k < 4; k++) pn->w[rp + t][b - b0][k] = W[t][k];
                for (int h = 0; h < 1 + TY_HALVES(ty); h++) pn->s[rp + t][b - b0][h] = S[t][h];
            }
        }
}

/* T > 1: the panel's 4 rows x 4 tokens (xt[j]: token j's reordered chunk) over nsb super-blocks;
 * out[t * 4 + r]. */
INLINE void tn_tile(const int ty, const q8_panel *pn, const q8_sb *const *xt, int nsb, float *out) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (int k = 0; k < nsb; k++)
        UNROLL for (int r = 0; r < 4; r++)
            UNROLL for (int t = 0; t < 4; t++) a[r][t] = sb_dot(ty, pn->w[r][k], pn->s[r][k], xt[t] + k, a[r][t]);
    red4x4(a, out);
}

/* ---- drivers ---- */

/* T = 1: tiles of 4 rows from far-apart streams (tile512.h). */
INLINE void run_t1(const int ty, const dsf_wmat *w, const q8_sb *xs, float *y, int64_t r0, int64_t r1,
                   const uint8_t *codes) {
    const int64_t len = t1_stream_len(r0, r1, 4, 1);
    for (int64_t k = 0; k < len; k++) {
        const uint8_t *wr[4];
        int64_t rr[4];
        t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
        t1_tile(ty, wr, rr, xs, w->n_in / QK, codes, y);
    }
}

/* T > 1: token chunks of ITC (reordered per K chunk), K chunks of KB super-blocks, row tiles of
 * 4 rows decoded once into a panel, token tiles of 4 over it; edge tiles repeat the last row or
 * token and drop those results. */
INLINE void run_tn(const int ty, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                   int64_t r1, const uint8_t *codes) {
    const int64_t nb = w->n_in / QK, len = t1_stream_len(r0, r1, 4, 1);
    q8_panel pn __attribute__((aligned(64)));
    q8_sb xs[ITC][KB] __attribute__((aligned(64))); /* 96 KiB */
    for (int64_t tc = 0, nt; tc < T; tc += nt) {
        nt = T - tc < ITC ? T - tc : ITC;
        for (int64_t b0 = 0, kb; b0 < nb; b0 += kb) {
            kb = nb - b0 < KB ? nb - b0 : KB;
            for (int64_t j = 0; j < nt; j++) prep_x(x + (tc + j) * nb + b0, kb, TY_PAIR(ty), xs[j]);
            for (int64_t k = 0; k < len; k++) {
                const uint8_t *wr[4];
                int64_t rr[4];
                t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
                fill_panel(ty, wr, b0, b0 + kb, codes, &pn);
                for (int64_t j0 = 0; j0 < nt; j0 += 4) { /* tokens tc + j0 .. + 3 */
                    float out[16];
                    const q8_sb *xt[4];
                    for (int j = 0; j < 4; j++) xt[j] = xs[j0 + j < nt ? j0 + j : nt - 1];
                    tn_tile(ty, &pn, xt, (int)kb, out);
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4 && rr[i] >= 0 && j0 + j < nt; j++) {
                            float *yy = &y[(tc + j0 + j) * ldy + rr[i]];
                            *yy = b0 == 0 ? out[j * 4 + i] : *yy + out[j * 4 + i];
                        }
                }
            }
        }
    }
}

INLINE void q8_run(const int ty, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                   int64_t r1) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % QK != 0 || w->n_in > Q8_MAX_IN) {
        matmul_q8k_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    uint8_t codes[2048] __attribute__((aligned(64))); /* the type's class table, if any */
    if (ty == TY_IQ2XXS) iq2xxs_class_codes(codes);
    if (ty == TY_IQ2XS) iq2_class_words(grid_iq2xs, 512, (uint16_t *)(void *)codes);
    if (ty == TY_IQ2S) iq2_class_words(grid_iq2s, 1024, (uint16_t *)(void *)codes);
    if (ty == TY_IQ3XXS) iq3_class_words(grid_iq3xxs, 256, 3, (uint16_t *)(void *)codes);
    if (ty == TY_IQ3S) iq3_class_words(grid_iq3s, 512, 1, (uint16_t *)(void *)codes);
    if (T > 1) {
        run_tn(ty, w, x, T, y, ldy, r0, r1, codes);
        return;
    }
    q8_sb xs[Q8_MAX_IN / QK] __attribute__((aligned(64)));
    prep_x(x, w->n_in / QK, TY_PAIR(ty), xs);
    run_t1(ty, w, xs, y, r0, r1, codes);
}

#define Q8_ENTRY(NAME, TY) \
    Q8K_FN(NAME) { q8_run(TY, w, x, T, y, ldy, r0, r1); }
Q8_ENTRY(q8k_iq4_xs_avx512, TY_IQ4XS)
Q8_ENTRY(q8k_iq2_xxs_avx512, TY_IQ2XXS)
Q8_ENTRY(q8k_iq2_xs_avx512, TY_IQ2XS)
Q8_ENTRY(q8k_iq2_s_avx512, TY_IQ2S)
Q8_ENTRY(q8k_iq3_xxs_avx512, TY_IQ3XXS)
Q8_ENTRY(q8k_iq3_s_avx512, TY_IQ3S)
Q8_ENTRY(q8k_iq1_s_avx512, TY_IQ1S)
Q8_ENTRY(q8k_iq1_m_avx512, TY_IQ1M)

#endif
