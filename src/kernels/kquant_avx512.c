/* kquant_avx512.c: AVX-512 matmul kernels of the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K,
 * both families (fp32 activations: mm_*_avx512; BF16 activations: xmm_*_avx512), decode
 * (T = 1) and prefill (T > 1). Compiled with the Makefile's AVX512_FLAGS only; its entries sit
 * in the kernels_avx512 table (matmul_avx512.c) and run only where select.c chose that table.
 *
 * Owns: the K-quant decoders (a super-block's scales, then its 8 groups of 32 weights, as in
 * dequant.c's deq_q*_k, which stay the reference for what each byte means), the tiles and the
 * drivers. Must not: allocate (the activations' sub-block sums are on the stack), call
 * select.c; rows it does not handle (n_in not a multiple of 256; BF16 rows over 16384) go to
 * the scalar twins.
 *
 * fp32 family: every weight is formed exactly as the twin forms it (dequant.c: d*sc exact,
 * then *q exact, then one rounding for - dmin*m or for Q6_K's product), through a 16- or
 * 32-entry fp32 table of the sub-block's values (vpermps / vpermt2ps on the codes) or, for
 * Q6_K, a conversion; then fp32 FMA with the activations, as matmul_avx512.c does for Q8_0.
 * BF16 family (vdpbf16ps; products exact, fp32 sums): the codes become BF16 through a word
 * permute of a table of q (exact). Q2_K, Q3_K and Q4_K: each dot's lanes hold 4 sub-blocks
 * (4 lanes each) of one 2-bit plane / nibble, the activations permuted to match once per
 * token and K chunk (kq_perm), so that the dots of a plane / nibble add into one P and one
 * FMA applies its 4 scales d*sc (kq2_w, kq3_w, kq4_idx). Q5_K, Q6_K: each group's dot starts
 * from zero and y += (d * sc) * P. The offsets of Q2_K, Q4_K and Q5_K are factored:
 * - (dmin * m) * X with X the sum of the activations of the sub-block, computed once per token
 * and K chunk (kq_xsums), not per row.
 *
 * Tiles and batch invariance as matmul_avx512.c: T = 1 takes 4 rows from far-apart streams,
 * T > 1 tiles of 4 rows x 4 tokens decode each row's super-block once for the 4 tokens; every
 * output gets the same operations (same super-block and group order, same accumulator lanes,
 * same K chunks, the same sums of X) whatever T, the tile and the row range. */
#include "kernels/kquant.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/kquant_x86.h"
#include "kernels/tile512.h"

#define QK 256 /* elements per super-block */
/* K chunks (super-blocks) and token chunks of the two families; changing a K chunk changes the
 * order of that family's sums (for every T alike). fp32: a chunk of 64 tokens' activations is
 * 256 KiB; BF16: 128 tokens x 2048 x 2 = 512 KiB plus their sub-block sums (64 KiB). */
#define FKB 4
#define FTC 64
#define XKB 8
#define XTC 64

enum { K2, K3, K4, K5, K6 };
static const int kq_bytes[5] = {84, 110, 144, 176, 210};

/* A super-block's decoded scales (kq_prep). */
typedef struct {
    __m512 v;     /* Q2_K, Q3_K, Q6_K: d * sc per sub-block of 16 (BF16 family Q2_K, Q3_K: in plane
                     order, kq2_w); Q4_K, Q5_K: [d*sc_0..7 | dmin*m_0..7] */
    __m512 m;     /* Q2_K: dmin * m per sub-block of 16 */
    float s[16];  /* v's lanes, broadcast from memory */
} kq_row;

INLINE __m512 iota16(float o) {
    return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(o));
}
INLINE __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)(const void *)p); }
INLINE __m512i zx32w(const uint8_t *p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
INLINE __m512i zx16d(const uint8_t *p) { return _mm512_cvtepu8_epi32(ld16(p)); }
/* lane i of the result: lane k + i / n of v (n = 4: Q2_K, 8: Q3_K) */
INLINE __m512 rep_only(__m512 v, int k, int n) {
    __m512i i = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), n == 4 ? 2 : 3);
    return _mm512_permutexvar_ps(_mm512_add_epi32(i, _mm512_set1_epi32(k)), v);
}
INLINE __m512 pat_mod(int n, float o) { /* lane i: i % n + o */
    __m512i i = _mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(n - 1));
    return _mm512_add_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(o));
}
/* (a & c) | (b & ~c) and (a & b) | c */
#define SEL(a, b, c) _mm512_ternarylogic_epi32(a, b, c, 0xE4)
#define ANDOR(a, b, c) _mm512_ternarylogic_epi32(a, b, c, 0xEA)
/* v with bit `from` of each element moved to bit `to` (other bits move along) */
#define MOVB16(v, from, to) ((from) >= (to) ? _mm512_srli_epi16(v, (from) - (to)) : _mm512_slli_epi16(v, (to) - (from)))
#define MOVB32(v, from, to) ((from) >= (to) ? _mm512_srli_epi32(v, (from) - (to)) : _mm512_slli_epi32(v, (to) - (from)))

/* ---- scales: one super-block ---- */

/* Q4_K/Q5_K: [d*sc_j | dmin*m_j], j < 8 (exact: 11-bit x 6-bit) */
INLINE __m512 k45_scales(const uint8_t *b) {
    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(kq_k45_bytes(b)));
    __m512 dd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                      _mm512_castps128_ps512(kq_f16x2(b)));
    return _mm512_mul_ps(q, dd);
}

/* Decodes a super-block's scales; bf: for the BF16 family (the Q2_K/Q3_K code tables). */
INLINE void kq_prep(const int K, const uint8_t *b, kq_row *st, const int bf) {
    if (K == K4 || K == K5) {
        st->v = k45_scales(b);
    } else if (K == K2) {
        const __m128i s = ld16(b); /* BF16 family: sc in plane order (kq2_w), 4s + c <- sub-block 8(c/2) + 2s + c%2 */
        const __m128i sp = bf ? _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)) : s;
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(sp, _mm_set1_epi8(15))));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15))));
        const __m128 dd = kq_f16x2(b + 80);
        st->m = _mm512_mul_ps(mn, _mm512_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dd)))); /* exact */
        st->v = _mm512_mul_ps(sc, _mm512_set1_ps(_mm_cvtss_f32(dd))); /* exact */
    } else if (K == K3) { /* d at 108: the block's last 2 bytes; BF16 family: plane order, as Q2_K */
        __m128i q = kq_k3_bytes(b + 94);
        if (bf) q = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
        st->v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(kq_f16x2(b + 106)))));
    } else {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld16(b + 192)));
        st->v = _mm512_mul_ps(sc, _mm512_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(kq_f16x2(b + 206))))); /* exact */
    }
    if (K == K4 || K == K5 || K == K6) _mm512_storeu_ps(st->s, st->v);
}

/* ---- BF16 family: group g (elements 32g..32g+31) of a super-block as 32 BF16 words ---- */

/* The constant code tables (word i): Q4_K bf16(i % 16) (vpermw reads 5 index bits: bit 4 of
 * a low nibble's word is the high nibble's, ignored by the repetition), Q5_K bf16(i), Q6_K
 * (two registers) bf16(i - 32). */
typedef struct {
    __m512i q2, q3, q4, q5, q6lo, q6hi;
} kq_tabs;
INLINE kq_tabs kq_tables(void) {
    kq_tabs c;
    c.q2 = (__m512i)_mm512_cvtne2ps_pbh(pat_mod(4, 0), pat_mod(4, 0));
    c.q3 = (__m512i)_mm512_cvtne2ps_pbh(pat_mod(8, -4), pat_mod(8, -4));
    c.q4 = (__m512i)_mm512_cvtne2ps_pbh(iota16(0), iota16(0));
    c.q5 = (__m512i)_mm512_cvtne2ps_pbh(iota16(16), iota16(0));
    c.q6lo = (__m512i)_mm512_cvtne2ps_pbh(iota16(-16), iota16(-32));
    c.q6hi = (__m512i)_mm512_cvtne2ps_pbh(iota16(16), iota16(0));
    return c;
}

/* Q2_K in the BF16 family. A super-block's 16 sub-blocks of 16 are sub-block j = 8h + 2s + p
 * (half h, 2-bit plane s, part p: codes = bits 2s.. of qs[32h + 16p + l], dequant.c deq_q2_k).
 * The dots go plane by plane: the 4 sub-blocks of plane s, c = 2h + p, take 4 lanes each (lane
 * 4i + c, elements 2i, 2i+1 and, in the second dot, 8 + 2i, 8 + 2i + 1), so that both dots of a
 * plane shift the codes alike and add into one P, and one FMA applies the plane's 4 scales
 * (a 128-bit broadcast of them in plane order, kq_row.s). kq2_idx[k]: the code byte of word
 * 2(4i + c) + e of dot k (its high byte zero); the activations are permuted to the same order
 * (kq_perm). */
static const uint8_t kq2_idx[64] __attribute__((aligned(64))) = {
    0,  0,  1,  1,  16, 16, 17, 17, 32, 32, 33, 33, 48, 48, 49, 49, 2,  2,  3,  3,  18, 18,
    19, 19, 34, 34, 35, 35, 50, 50, 51, 51, 4,  4,  5,  5,  20, 20, 21, 21, 36, 36, 37, 37,
    52, 52, 53, 53, 6,  6,  7,  7,  22, 22, 23, 23, 38, 38, 39, 39, 54, 54, 55, 55}; /* dot k: + 8k */

/* A token's activations, super-blocks [0, nb), in the order of the Q2_K/Q3_K or Q4_K dots (q4):
 * Q2_K/Q3_K dot g = 2s + k, dword 4i + c is dword 8j + 4k + i of the super-block, j the sub-block
 * of (plane s, c); Q4_K dot g = 4k + m, dword 4i + c is dword 16(2c + k) + 4m + i. */
static void kq_perm(const uint16_t *x, int64_t nb, int q4, uint16_t *xp) {
    const __m512i i0 = q4 ? _mm512_setr_epi32(0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99)
                          : _mm512_setr_epi32(0, 8, 64, 72, 1, 9, 65, 73, 2, 10, 66, 74, 3, 11, 67, 75);
    for (int64_t b = 0; b < nb; b++)
        UNROLL for (int g = 0; g < 8; g++) {
            const int o = q4 ? 16 * (g >> 2) + 4 * (g & 3) : 16 * (g >> 1) + 4 * (g & 1);
            const __m512i i = _mm512_add_epi32(i0, _mm512_set1_epi32(o));
            _mm512_storeu_si512((void *)(xp + b * QK + 32 * g), _mm512_i32gather_epi32(i, (const void *)(x + b * QK), 4));
        }
}

/* Q4_K in the BF16 family, the same way: sub-block j = 2c + k (nibble k of qs[32c + l]); the dots
 * go nibble by nibble, the 4 sub-blocks of nibble k taking 4 lanes each (lane 4i + c, elements
 * 8m + 2i, +1 in dot m), one FMA per nibble applies their 4 scales. kq4_idx: the code byte of
 * word 2(4i + c) + e of dot m = 0 (+ 8m), from the 128 code bytes. */
static const uint8_t kq4_idx[64] __attribute__((aligned(64))) = {
    0, 0, 1, 1, 32, 32, 33, 33, 64, 64, 65, 65, 96, 96, 97, 97, 2, 2, 3, 3, 34, 34, 35, 35, 66, 66, 67, 67, 98, 98, 99, 99,
    4, 4, 5, 5, 36, 36, 37, 37, 68, 68, 69, 69, 100, 100, 101, 101, 6, 6, 7, 7, 38, 38, 39, 39, 70, 70, 71, 71, 102, 102, 103, 103};

/* Q3_K: the same dots, code q + 4 * (bit 4h + s of hmask[16p + l]), value code - 4 (a period-8
 * table of code - 4; hb: the hmask bytes of the dot's words, shifted so that the lane's bit
 * lands on bit 2). */
INLINE __m512i kq3_w(const uint8_t *b, const __m512i t8, int s, int k) {
    const __m512i idx = _mm512_add_epi8(_mm512_load_si512((const void *)kq2_idx), _mm512_set1_epi8((char)(8 * k)));
    __m512i z = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, idx, _mm512_loadu_si512((const void *)(b + 32)));
    __m512i hb = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_and_si512(idx, _mm512_set1_epi8(31)),
                                               _mm512_loadu_si512((const void *)b));
    /* lane 4i + c, c = 2h + p: bit 4h + s -> bit 2 */
    hb = _mm512_srlv_epi16(_mm512_slli_epi16(hb, 2), _mm512_add_epi16(_mm512_set4_epi32(0x00040004, 0x00040004, 0, 0), _mm512_set1_epi16((short)s)));
    return _mm512_permutex2var_epi16(t8, SEL(_mm512_srli_epi16(z, 2 * s), hb, _mm512_set1_epi16(3)), t8);
}

/* Q2_K: the BF16 codes of dot k of plane s (a period-4 table: vpermt2w reads 6 index bits,
 * the shifted word holds the higher planes' bits above bit 1) */
INLINE __m512i kq2_w(const uint8_t *b, const __m512i t4, int s, int k) {
    __m512i z = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull,
                                              _mm512_add_epi8(_mm512_load_si512((const void *)kq2_idx), _mm512_set1_epi8((char)(8 * k))),
                                              _mm512_loadu_si512((const void *)(b + 16)));
    return _mm512_permutex2var_epi16(t4, _mm512_srli_epi16(z, 2 * s), t4);
}


INLINE __m512i kq_wx(const int K, const uint8_t *b, const kq_tabs *c, const int g) {
    const int h = g >> 2, s = g & 3;
    if (K == K5) { /* sub-block g: nibble g % 2 of qs[32(g/2) + l] + 16 * bit g of qh[l] */
        __m512i z = zx32w(b + 48 + 32 * (g >> 1));
        if (g & 1) z = _mm512_srli_epi16(z, 4);
        return _mm512_permutex2var_epi16(c->q5, SEL(z, MOVB16(zx32w(b + 16), g, 4), _mm512_set1_epi16(15)), c->q5);
    }
    /* Q6_K, half h, k = s: low 4 bits from nibble k / 2 of ql[64h + 32(k % 2) + l], high 2 from
     * bits 2k.. of qh[32h + l] */
    __m512i z = zx32w(b + 64 * h + 32 * (s & 1));
    if (s >= 2) z = _mm512_srli_epi16(z, 4);
    __m512i i = SEL(z, MOVB16(zx32w(b + 128 + 32 * h), 2 * s, 4), _mm512_set1_epi16(15));
    return _mm512_permutex2var_epi16(c->q6lo, i, c->q6hi);
}

/* Q5_K: the group's scale; Q6_K: lanes 0-7 sub-block 2g's, 8-15 2g+1's */
INLINE __m512 kq_gscale(const int K, const kq_row *st, const int g) {
    if (K == K6) return _mm512_permutexvar_ps(_mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(2 * g), _mm512_set1_epi32(2 * g + 1)), st->v);
    return _mm512_set1_ps(st->s[g]);
}

/* The activations' sub-block sums of super-blocks [0, nb) of one token, 16 floats per
 * super-block: Q2_K (pairs = 0) lane j = the sum of elements 16j..16j+15; Q4_K/Q5_K
 * (pairs = 1) lanes 0-7 zero, lane 8 + j = the sum of elements 32j..32j+31, matching
 * kq_row.v's [d*sc | dmin*m] so that one fnmadd subtracts the mins. */
static void kq_xsums(const uint16_t *x, int64_t nb, int pairs, float *X) {
    for (int64_t b = 0; b < nb; b++) {
        __m512 a[16];
        UNROLL for (int m = 0; m < 16; m++) {
            __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(x + b * QK + 16 * m)));
            a[4 * (m & 3) + (m >> 2)] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        }
        __m512 s = red16(a); /* lane m: sub-block m's sum */
        if (pairs) {
            const __m512i e = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 6, 8, 10, 12, 14);
            s = _mm512_maskz_add_ps(0xFF00, _mm512_permutexvar_ps(e, s),
                                    _mm512_permutexvar_ps(_mm512_add_epi32(e, _mm512_set1_epi32(1)), s));
        }
        _mm512_storeu_ps(X + 16 * b, s);
    }
}

INLINE int kq_permuted(const int K) { return K == K2 || K == K3 || K == K4; } /* kq_perm */
INLINE int kq_hasx(const int K) { return K == K2 || K == K4 || K == K5; }

INLINE void kq_pf(const int K, const uint8_t *p) {
    for (int o = 0; o < kq_bytes[K]; o += 64) _mm_prefetch((const char *)(p + PF_DIST + o), _MM_HINT_T0);
}

/* The tiles' common parts: zeroed accumulators; super-block b of the 4 rows (prefetched ahead
 * when decoding, NT = 1) with its scales; the sums (red4 / red4x4: the same tree per lane). */
INLINE void kq_zero(const int NT, __m512 a[4][4]) {
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < NT; t++) a[r][t] = _mm512_setzero_ps();
}
INLINE void kq_rows(const int K, const int NT, const uint8_t *const *wr, int64_t b, const int bf, const uint8_t **blk,
                    kq_row *st) {
    UNROLL for (int r = 0; r < 4; r++) {
        blk[r] = wr[r] + b * kq_bytes[K];
        if (NT == 1) kq_pf(K, blk[r]);
        kq_prep(K, blk[r], &st[r], bf);
    }
    /* the scales kq_row.s are read back from memory (as broadcast loads) rather than moved lane
     * by lane out of kq_row.v (a permute each) */
    __asm__ volatile("" ::: "memory");
}
INLINE void kq_red(const int NT, __m512 a[4][4], float *out) {
    if (NT == 1) {
        __m512 a1[4] = {a[0][0], a[1][0], a[2][0], a[3][0]};
        red4(a1, out);
    } else
        red4x4(a, out);
}

/* BF16 family tile: 4 rows (wr) x NT tokens (x[t], X[t]: its activations and sub-block sums
 * from super-block b0 on) over super-blocks [b0, b1); out[t * 4 + r]. NT = 1 is the decode tile (prefetching);
 * every output gets the same operations for NT = 1 and 4. */
INLINE void kq_xtile(const int K, const int NT, const uint8_t *const *wr, const uint16_t *const *x,
                     const float *const *X, int64_t b0, int64_t b1, float *out) {
    const kq_tabs c = kq_tables();
    __m512 a[4][4];
    kq_zero(NT, a);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *blk[4];
        kq_row st[4];
        kq_rows(K, NT, wr, b, 1, blk, st);
        if (K == K2 || K == K3) {
            /* per (row, plane): P = 2 dots from zero, acc += P * the plane's scales; then
             * (Q2_K) the mins. Decode interleaves the rows (s outer), prefill keeps one row. */
            UNROLL for (int i = 0; i < 16; i++) {
                const int r = NT == 1 ? i & 3 : i >> 2, s = NT == 1 ? i >> 2 : i & 3;
                __m512 p[4];
                UNROLL for (int k = 0; k < 2; k++) {
                    const __m512i wv = K == K2 ? kq2_w(blk[r], c.q2, s, k) : kq3_w(blk[r], c.q3, s, k);
                    UNROLL for (int t = 0; t < NT; t++) {
                        __m512i xv = _mm512_loadu_si512((const void *)(x[t] + (b - b0) * QK + 32 * (2 * s + k)));
                        p[t] = _mm512_dpbf16_ps(k ? p[t] : _mm512_setzero_ps(), as_bh(wv), as_bh(xv));
                    }
                }
                const __m512 sc = _mm512_permutexvar_ps( /* the plane's 4 scales, 4 times */
                    _mm512_add_epi32(_mm512_set4_epi32(3, 2, 1, 0), _mm512_set1_epi32(4 * s)), st[r].v);
                UNROLL for (int t = 0; t < NT; t++) {
                    a[r][t] = _mm512_fmadd_ps(p[t], sc, a[r][t]);
                    if (K == K2 && s == 3) a[r][t] = _mm512_fnmadd_ps(st[r].m, _mm512_loadu_ps(X[t] + 16 * (b - b0)), a[r][t]);
                }
            }
            continue;
        }
        if (K == K4) {
            /* per row: P_k = the 4 dots of nibble k from zero, acc += P_0 * S_0 + P_1 * S_1 (S_k:
             * the nibble's 4 scales), then the mins. Decode interleaves the rows (m outer). */
            const __m512i t16 = c.q4;
            __m512 p[4][4][2];
            UNROLL for (int i = 0; i < 16; i++) {
                const int r = NT == 1 ? i & 3 : i >> 2, m = NT == 1 ? i >> 2 : i & 3;
                const __m512i z = _mm512_maskz_permutex2var_epi8(
                    0x5555555555555555ull, _mm512_loadu_si512((const void *)(blk[r] + 16)),
                    _mm512_add_epi8(_mm512_load_si512((const void *)kq4_idx), _mm512_set1_epi8((char)(8 * m))),
                    _mm512_loadu_si512((const void *)(blk[r] + 80)));
                UNROLL for (int k = 0; k < 2; k++) {
                    const __m512i wv = _mm512_permutex2var_epi16(t16, k ? _mm512_srli_epi16(z, 4) : z, t16);
                    UNROLL for (int t = 0; t < NT; t++) {
                        __m512i xv = _mm512_loadu_si512((const void *)(x[t] + (b - b0) * QK + 32 * (4 * k + m)));
                        p[r][t][k] = _mm512_dpbf16_ps(m ? p[r][t][k] : _mm512_setzero_ps(), as_bh(wv), as_bh(xv));
                    }
                }
                if (m < 3) continue;
                UNROLL for (int k = 0; k < 2; k++) {
                    const __m512 sc = _mm512_permutexvar_ps(_mm512_set4_epi32(6 + k, 4 + k, 2 + k, k), st[r].v);
                    UNROLL for (int t = 0; t < NT; t++) a[r][t] = _mm512_fmadd_ps(p[r][t][k], sc, a[r][t]);
                }
                UNROLL for (int t = 0; t < NT; t++)
                    a[r][t] = _mm512_fnmadd_ps(st[r].v, _mm512_loadu_ps(X[t] + 16 * (b - b0)), a[r][t]);
            }
            continue;
        }
        UNROLL for (int g = 0; g < 8; g++)
            UNROLL for (int r = 0; r < 4; r++) {
                const __m512i wv = kq_wx(K, blk[r], &c, g);
                const __m512 sc = kq_gscale(K, &st[r], g);
                UNROLL for (int t = 0; t < NT; t++) {
                    __m512i xv = _mm512_loadu_si512((const void *)(x[t] + (b - b0) * QK + 32 * g));
                    __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(wv), as_bh(xv));
                    a[r][t] = _mm512_fmadd_ps(p, sc, a[r][t]);
                }
            }
        if (kq_hasx(K))
            UNROLL for (int r = 0; r < 4; r++)
                UNROLL for (int t = 0; t < NT; t++)
                    a[r][t] = _mm512_fnmadd_ps(st[r].v, _mm512_loadu_ps(X[t] + 16 * (b - b0)), a[r][t]);
    }
    kq_red(NT, a, out);
}

/* ---- fp32 family: group g as two fp32 vectors (elements 0-15, 16-31), the twin's values ---- */

INLINE void kq_wf(const int K, const uint8_t *b, const kq_row *st, const int g, __m512 *w) {
    const int h = g >> 2, s = g & 3;
    if (K == K2) { /* table of sub-blocks 4k..4k+3, k = g / 2: entry 4(j % 4) + q = d*sc_j*q - dmin*m_j */
        const int k = 4 * (g >> 1);
        const __m512 tb = _mm512_fmsub_ps(pat_mod(4, 0), rep_only(st->v, k, 4), rep_only(st->m, k, 4));
        UNROLL for (int p = 0; p < 2; p++) {
            __m512i z = _mm512_srli_epi32(zx16d(b + 16 + 32 * h + 16 * p), 2 * s);
            w[p] = _mm512_permutexvar_ps(ANDOR(z, _mm512_set1_epi32(3), _mm512_set1_epi32(4 * ((2 * g + p) & 3))), tb);
        }
    } else if (K == K3) { /* table of sub-blocks 2g, 2g+1: entry 8p + c = d*sc_j*(c - 4) */
        const __m512 tb = _mm512_mul_ps(pat_mod(8, -4), rep_only(st->v, 2 * g, 8));
        UNROLL for (int p = 0; p < 2; p++) {
            __m512i z = _mm512_srli_epi32(zx16d(b + 32 + 32 * h + 16 * p), 2 * s);
            __m512i hb = MOVB32(zx16d(b + 16 * p), g, 2);
            w[p] = _mm512_permutexvar_ps(ANDOR(SEL(z, hb, _mm512_set1_epi32(3)), _mm512_set1_epi32(7), _mm512_set1_epi32(8 * p)), tb);
        }
    } else if (K == K4 || K == K5) { /* entry q = d*sc*q - dmin*m */
        const __m512 ds = _mm512_set1_ps(st->s[g]), dm = _mm512_set1_ps(st->s[8 + g]);
        const __m512 tlo = _mm512_fmsub_ps(iota16(0), ds, dm);
        UNROLL for (int p = 0; p < 2; p++) {
            __m512i z = zx16d(b + (K == K4 ? 16 : 48) + 32 * (g >> 1) + 16 * p);
            if (g & 1) z = _mm512_srli_epi32(z, 4);
            if (K == K4) w[p] = _mm512_permutexvar_ps(z, tlo);
            else {
                __m512i i = SEL(z, MOVB32(zx16d(b + 16 + 16 * p), g, 4), _mm512_set1_epi32(15));
                w[p] = _mm512_permutex2var_ps(tlo, i, _mm512_fmsub_ps(iota16(16), ds, dm));
            }
        }
    } else { /* Q6_K: d*sc_j*(q - 32), rounded once as the twin */
        UNROLL for (int p = 0; p < 2; p++) {
            __m512i z = zx16d(b + 64 * h + 32 * (s & 1) + 16 * p);
            if (s >= 2) z = _mm512_srli_epi32(z, 4);
            __m512i q = SEL(z, MOVB32(zx16d(b + 128 + 32 * h + 16 * p), 2 * s, 4), _mm512_set1_epi32(15));
            q = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(63)), _mm512_set1_epi32(32));
            w[p] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(st->s[2 * g + p]));
        }
    }
}

/* fp32 family tile: 4 rows x NT tokens over super-blocks [b0, b1); out[t * 4 + r]. */
INLINE void kq_ftile(const int K, const int NT, const uint8_t *const *wr, const float *const *x, int64_t b0,
                     int64_t b1, float *out) {
    __m512 a[4][4];
    kq_zero(NT, a);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *blk[4];
        kq_row st[4];
        kq_rows(K, NT, wr, b, 0, blk, st);
        UNROLL for (int g = 0; g < 8; g++) {
            __m512 x0[4], x1[4];
            UNROLL for (int t = 0; t < NT; t++) {
                x0[t] = _mm512_loadu_ps(x[t] + b * QK + 32 * g);
                x1[t] = _mm512_loadu_ps(x[t] + b * QK + 32 * g + 16);
            }
            UNROLL for (int r = 0; r < 4; r++) {
                __m512 wv[2];
                kq_wf(K, blk[r], &st[r], g, wv);
                UNROLL for (int t = 0; t < NT; t++) {
                    a[r][t] = _mm512_fmadd_ps(wv[0], x0[t], a[r][t]);
                    a[r][t] = _mm512_fmadd_ps(wv[1], x1[t], a[r][t]);
                }
            }
        }
    }
    kq_red(NT, a, out);
}

/* ---- drivers ----
 * K chunks of KB super-blocks (each output: the fp32 sum, in chunk order, of per-chunk tile
 * sums, for every T); T = 1: tiles of 4 rows from far-apart streams (tile512.h); T > 1: token
 * chunks of TC, then K chunks, then row tiles x token tiles of 4 (edge tiles repeat the last
 * row / token and drop those results). BF16 family: the sub-block sums of a chunk's tokens
 * are computed once per token and K chunk (per call for T = 1). */
INLINE void kq_run(const int K, const int bf, const dsf_wmat *w, const float *xf, const uint16_t *xb, int64_t T,
                   float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % QK != 0 || (bf && w->n_in > 16384)) {
        if (bf) matmul_xbf16_any_ref(w, xb, T, y, ldy, r0, r1);
        else matmul_any_ref(w, xf, T, y, ldy, r0, r1);
        return;
    }
    const int64_t nb = w->n_in / QK, KB = bf ? XKB : FKB, TCH = bf ? XTC : FTC;
    const int hx = bf && kq_hasx(K);
    const uint8_t *wr[4];
    int64_t rr[4];
    if (T == 1) {
        float X[16384 / 16];
        uint16_t xp[16384]; /* Q2_K, Q3_K, Q4_K: the permuted activations */
        if (hx) kq_xsums(xb, nb, K != K2, X);
        if (bf && kq_permuted(K)) {
            kq_perm(xb, nb, K == K4, xp);
            xb = xp;
        }
        const int64_t len = t1_stream_len(r0, r1, 4, 1);
        for (int64_t k = 0; k < len; k++) {
            t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
            for (int64_t b0 = 0; b0 < nb; b0 += KB) {
                const int64_t b1 = b0 + KB < nb ? b0 + KB : nb;
                const float *Xp[1] = {X + 16 * b0};
                const uint16_t *xbp = bf ? xb + b0 * QK : NULL; /* xb is NULL in the fp32 family */
                float out[4];
                if (bf) kq_xtile(K, 1, wr, &xbp, Xp, b0, b1, out);
                else kq_ftile(K, 1, wr, &xf, b0, b1, out);
                kq_put(y, ldy, rr, 4, 0, 1, out, b0 == 0);
            }
        }
        return;
    }
    float Xc[XTC * XKB * 16];
    uint16_t xpc[XTC * XKB * QK]; /* 256 KiB */
    for (int64_t tc = 0; tc < T; tc += TCH) {
        const int64_t tc1 = tc + TCH < T ? tc + TCH : T;
        for (int64_t b0 = 0; b0 < nb; b0 += KB) {
            const int64_t b1 = b0 + KB < nb ? b0 + KB : nb;
            if (hx)
                for (int64_t t = tc; t < tc1; t++) kq_xsums(xb + t * w->n_in + b0 * QK, b1 - b0, K != K2, Xc + (t - tc) * XKB * 16);
            if (bf && kq_permuted(K))
                for (int64_t t = tc; t < tc1; t++) kq_perm(xb + t * w->n_in + b0 * QK, b1 - b0, K == K4, xpc + (t - tc) * XKB * QK);
            const int64_t len = t1_stream_len(r0, r1, 4, 1);
            for (int64_t k = 0; k < len; k++) {
                t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
                for (int64_t t = tc; t < tc1; t += 4) {
                    const float *xt[4], *Xt[4];
                    const uint16_t *xbt[4];
                    float out[16];
                    for (int j = 0; j < 4; j++) {
                        const int64_t tt = t + j < tc1 ? t + j : tc1 - 1;
                        xt[j] = bf ? NULL : xf + tt * w->n_in; /* one of xf, xb is NULL */
                        xbt[j] = !bf ? NULL : kq_permuted(K) ? xpc + (tt - tc) * XKB * QK : xb + tt * w->n_in + b0 * QK;
                        Xt[j] = Xc + (tt - tc) * XKB * 16;
                    }
                    if (bf) kq_xtile(K, 4, wr, xbt, Xt, b0, b1, out);
                    else kq_ftile(K, 4, wr, xt, b0, b1, out);
                    kq_put(y, ldy, rr, 4, t, tc1 - t < 4 ? tc1 - t : 4, out, b0 == 0);
                }
            }
        }
    }
}

#define KQ_ENTRIES(T, K)                                                                                       \
    void mm_##T##_avx512(const dsf_wmat *w, const float *x, int64_t T_, float *y, int64_t ldy, int64_t r0,     \
                         int64_t r1) {                                                                       \
        kq_run(K, 0, w, x, NULL, T_, y, ldy, r0, r1);                                                        \
    }                                                                                                        \
    void xmm_##T##_avx512(const dsf_wmat *w, const uint16_t *x, int64_t T_, float *y, int64_t ldy, int64_t r0, \
                          int64_t r1) {                                                                      \
        kq_run(K, 1, w, NULL, x, T_, y, ldy, r0, r1);                                                        \
    }
KQ_ENTRIES(q2_k, K2)
KQ_ENTRIES(q3_k, K3)
KQ_ENTRIES(q4_k, K4)
KQ_ENTRIES(q5_k, K5)
KQ_ENTRIES(q6_k, K6)

#endif
