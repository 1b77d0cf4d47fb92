/* iq13_avx512.c: AVX-512 matmul kernels of the grid types IQ3_XXS, IQ3_S, IQ1_S and IQ1_M,
 * both families (fp32 activations, BF16 activations), decode (T = 1) and prefill (T > 1).
 * Compiled with the Makefile's AVX512_FLAGS only; its entries (iq13.h) sit in the
 * kernels_avx512 table (matmul_avx512.c).
 *
 * Owns: the block decoders of these four types into 4-bit value codes, and the tiles over
 * them. Must not: allocate (panels are on the stack), or call select.c; rows whose n_in is not
 * a multiple of 256 go to the scalar twins.
 *
 * Method: every weight of these types is sc * v, sc a per-sub-block scale (d times a small odd
 * integer, /4 for IQ3_XXS) and v one of 8 magnitudes with a sign (IQ3: grid values 4..62 or
 * 1..15), or one of 6 values (IQ1: grid value -1, 0, 1 plus the delta +-1/8). A block
 * decodes to one 16-bit code per weight, an index into a 16-entry table of v (bits 0-2 the
 * magnitude and bit 3 the sign for IQ3; bits 0-1 the grid value + 1 and bit 2 the delta's
 * sign for IQ1) and 2 scales per group of 32 weights (IQ1_M's per 16 weights; the others'
 * twice the same). IQ3 grid entries are looked up 32 at a time (vpermt2w) in a table of
 * their class codes built per call (iq3_classes, 0.5-1 KiB; 1.5-2x as fast as vpgatherdd or
 * scalar loads of the entries), IQ1's (4 KiB) by vpgatherdd. vpmultishiftqb spreads the
 * 4-bit (IQ3) and 2-bit (IQ1) fields into bytes.
 * - fp32 family: the table times the scale (exact: at most 11 + 5 + 6 significant bits) is
 *   permuted into fp32 weights, exactly dequant.c's values, and FMA'd with the activations.
 * - BF16 family: v is exact in BF16, so the codes permute (vpermw) into BF16 weights whose
 *   products with the BF16 activations are exact; per group of 32, P = vdpbf16ps from zero
 *   and acc = fma(P, S, acc), S the group's scales (lanes 0-7 hold weights 0-15, lanes 8-15
 *   weights 16-31).
 * Numerics: the weights' exact dot up to fp32 summation order (and, BF16 family, the flush
 * of subnormal activations of vdpbf16ps, matmul.h).
 *
 * Batch invariance: T = 1 takes 4 rows from far-apart streams (tile512.h), T > 1 tiles of 4
 * adjacent rows x 4 tokens over a panel of the rows' decoded K chunk; both run, per output,
 * the same operations in the same order over the same K chunks (IQ_KB blocks), and sum the
 * 16 lanes by the same tree (red4, red4x4). */
#include "kernels/iq13.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/grids.h"
#include "kernels/tile512.h"

#define IQ_KB 4   /* K chunk in 256-weight blocks, both families, every T */
#define IQ_TC 64  /* T > 1: tokens per chunk (the chunk's activations stay in L2) */

INLINE float f16s(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

/* The 16 values v of a type's codes (see the header). */
INLINE __m512 code_values(const int ty) {
    if (ty == GGML_TYPE_IQ3_XXS)
        return _mm512_setr_ps(4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62);
    if (ty == GGML_TYPE_IQ3_S) return _mm512_setr_ps(1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15);
    /* IQ1: grid value c - 1 plus the delta, +1/8 (bit 2 clear) or -1/8; c = 3 never occurs */
    return _mm512_setr_ps(-0.875f, 0.125f, 1.125f, 0, -1.125f, -0.125f, 0.875f, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* ---- block decoders: one 256-weight block -> q[g] (32 codes of group g, 16-bit words) and
 * sc[2g], sc[2g + 1] (the scales of its weights 0-15 and 16-31) ---- */

/* The sign masks of IQ3_XXS's 8 groups (32 bits each, bit 8k + j: value j of sub-group k
 * negated): selector k of group g is bits 7k..7k+6 of the group's word, its mask the
 * selector with its parity in bit 7 (grid_iq2_signs' rule, grids.json), computed for all 32
 * selectors at once. */
INLINE void iq3xxs_signs(const uint8_t *b, uint32_t *m) {
    /* per qword (2 words): selectors at bits 0, 7, 14, 21 and 32, 39, 46, 53 */
    const __m256i ctl = _mm256_set1_epi64x(0x352E2720150E0700ll);
    const __m256i sel = _mm256_and_si256(_mm256_multishift_epi64_epi8(ctl, _mm256_loadu_si256((const __m256i *)(const void *)(b + 66))),
                                         _mm256_set1_epi8(0x7F));
    const __m256i par4 = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0,
                                          1, 1, 0); /* parity of a nibble */
    const __m256i lo = _mm256_and_si256(sel, _mm256_set1_epi8(0x0F)), hi = _mm256_srli_epi16(sel, 4); /* sel < 128 */
    const __m256i par = _mm256_xor_si256(_mm256_shuffle_epi8(par4, lo),
                                         _mm256_shuffle_epi8(par4, _mm256_and_si256(hi, _mm256_set1_epi8(0x0F))));
    _mm256_storeu_si256((__m256i *)(void *)m, _mm256_or_si256(sel, _mm256_slli_epi16(par, 7)));
}

/* The IQ3 grids as class codes (byte >> sh, 0..7 for both grids), 4 nibbles per entry:
 * built once per call into a 16-bit table small enough for vpermt2w lookups. */
INLINE void iq3_classes(const uint32_t *grid, int n, int sh, uint16_t *out) {
    for (int i = 0; i < n; i += 16) {
        /* byte j: (byte >> sh) & 7 (sh <= 5: the bits shifted in from byte j + 1 are masked) */
        __m512i t = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512((const void *)(grid + i)), sh),
                                     _mm512_set1_epi32(0x07070707));
        t = _mm512_and_si512(_mm512_or_si512(t, _mm512_srli_epi32(t, 4)), _mm512_set1_epi32(0x00FF00FF));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm512_cvtepi32_epi16(_mm512_or_si512(t, _mm512_srli_epi32(t, 8))));
    }
}

/* 32 entries tab[idx] (idx < 64 np, words), np pairs of 32-word table registers. */
INLINE __m512i iq3_lookup(const uint16_t *tab, __m512i idx, const int np) {
    __m512i r = _mm512_permutex2var_epi16(_mm512_load_si512((const void *)tab), idx, _mm512_load_si512((const void *)(tab + 32)));
    const __m512i hi = _mm512_srli_epi16(idx, 6);
    for (int j = 1; j < np; j++) {
        __m512i v = _mm512_permutex2var_epi16(_mm512_load_si512((const void *)(tab + 64 * j)), idx,
                                              _mm512_load_si512((const void *)(tab + 64 * j + 32)));
        r = _mm512_mask_mov_epi16(r, _mm512_cmpeq_epi16_mask(hi, _mm512_set1_epi16((short)j)), v);
    }
    return r;
}

/* sc[i] = d * (2 s_i + 1) for the 16 lanes s (dequant.c's products, exact). */
INLINE void odd_scales(float *sc, __m512i s, float d) {
    __m512i o = _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1));
    _mm512_storeu_ps(sc, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(o)));
}

/* Lane 2g and 2g + 1 = lane g (a group's two halves share its scale). */
INLINE __m512i dup_lanes(__m512i v) {
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), v);
}

/* IQ3_XXS (dequant.c deq_iq3_xxs) and IQ3_S (deq_iq3_s): codes = the grid values' classes
 * (cls: iq3_classes; IQ3_XXS's values are 4, 12, .., 52, 62, class byte >> 3; IQ3_S's odd
 * 1..15, class byte >> 1; IQ3_S's indices take bit 8 from qh), bit 3 from the group's sign
 * mask (IQ3_XXS: iq3xxs_signs; IQ3_S: the sub-groups' sign bytes). */
INLINE void dec_iq3(const uint8_t *b, __m512i *q, float *sc, const uint16_t *cls, const int ty) {
    const float d = f16s(iq13_rd16(b));
    const int xxs = ty == GGML_TYPE_IQ3_XXS;
    uint32_t m[8];
    if (xxs) iq3xxs_signs(b, m);
    else memcpy(m, b + 74, 32);
    __m512i e[2];
    for (int h = 0; h < 2; h++) {
        __m512i ix = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(b + 2 + 32 * h)));
        if (!xxs) ix = _mm512_mask_add_epi16(ix, _cvtu32_mask32(iq13_rd32(b + 66 + 4 * h)), ix, _mm512_set1_epi16(256));
        e[h] = iq3_lookup(cls, ix, xxs ? 4 : 8);
    }
    /* pair p: lane l holds values 8l..8l+7, nibbles 8(l % 2).. of qword (l % 4) / 2 of group
     * 2p + l / 4 (4 qwords per half) */
    const __m512i ctl = _mm512_set_epi64(0x3C3834302C282420ll, 0x1C1814100C080400ll, 0x3C3834302C282420ll, 0x1C1814100C080400ll,
                                         0x3C3834302C282420ll, 0x1C1814100C080400ll, 0x3C3834302C282420ll, 0x1C1814100C080400ll);
    for (int p = 0; p < 4; p++) {
        const long long o = 4 * (p % 2);
        __m512i data = _mm512_permutexvar_epi64(_mm512_set_epi64(o + 3, o + 3, o + 2, o + 2, o + 1, o + 1, o, o), e[p / 2]);
        __m512i c = _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, data), _mm512_set1_epi8(7));
        c = _mm512_mask_add_epi8(c, _cvtu64_mask64((uint64_t)m[2 * p] | (uint64_t)m[2 * p + 1] << 32), c, _mm512_set1_epi8(8));
        q[2 * p] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(c));
        q[2 * p + 1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(c, 1));
    }
    if (xxs) { /* d * (0.5 + s) * 0.5, s = the top 4 bits of the group's word */
        __m512i sv = _mm512_srli_epi32(dup_lanes(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b + 66)))), 28);
        _mm512_storeu_ps(sc, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_add_ps(_mm512_set1_ps(0.5f), _mm512_cvtepi32_ps(sv))),
                                           _mm512_set1_ps(0.5f)));
    } else { /* d * (1 + 2s), s nibble g of the 4 scale bytes */
        const __m512i sh = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
        odd_scales(sc, _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)iq13_rd32(b + 106)), sh), _mm512_set1_epi32(15)), d);
    }
}

/* The IQ1 grid entries of 32 sub-groups (11-bit indices in the dword lanes of idx[0], idx[1])
 * as 8 qwords, qword g = the 4 entries of group g. vpgatherdd reads the dword at entry
 * idx & ~1 (entries idx & ~1 and idx | 1, both inside the table) and the shift keeps entry
 * idx. (Scalar loads were ~10 % slower here.) */
INLINE __m512i iq1_lookup(const __m512i *idx) {
    const __m512i one = _mm512_set1_epi32(1);
    __m256i e[2];
    for (int h = 0; h < 2; h++) {
        __m512i v = _mm512_i32gather_epi32(_mm512_andnot_si512(one, idx[h]), (const void *)grid_iq1s, 2);
        e[h] = _mm512_cvtepi32_epi16(_mm512_srlv_epi32(v, _mm512_slli_epi32(_mm512_and_si512(idx[h], one), 4)));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(e[0]), e[1], 1);
}

/* The 2-bit fields of groups 2p and 2p + 1 (E: qword g = the 4 grid entries of group g, value
 * j of sub-group k at bits 16k + 2j) as 64 bytes, element order. */
INLINE __m512i iq1_fields(__m512i E, int p) {
    static const uint8_t ctrl[64] __attribute__((aligned(64))) = {
        0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
        44, 46, 48, 50, 52, 54, 56, 58, 60, 62, 0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22,
        24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
    __m512i data = _mm512_permutexvar_epi64(_mm512_set_epi64(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p,
                                                             2 * p, 2 * p), E);
    return _mm512_and_si512(_mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)ctrl), data),
                            _mm512_set1_epi8(3));
}

/* IQ1_S (deq_iq1_s): index = qs[4g + k] | bits 3k.. of the group's word << 8; delta sign per
 * group (bit 15). */
INLINE void dec_iq1s(const uint8_t *b, __m512i *q, float *sc) {
    const float d = f16s(iq13_rd16(b));
    const __m512i hv = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(b + 34))));
    const __m512i sh = _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
    __m512i iv[2];
    for (int h = 0; h < 2; h++) {
        __m512i gi = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(4 * h));
        __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(gi, hv), sh), _mm512_set1_epi32(7));
        __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 2 + 16 * h)));
        iv[h] = _mm512_or_si512(ix, _mm512_slli_epi32(hi, 8));
    }
    const __m512i E = iq1_lookup(iv);
    for (int p = 0; p < 4; p++) {
        const uint16_t w0 = iq13_rd16(b + 34 + 4 * p), w1 = iq13_rd16(b + 36 + 4 * p);
        const __mmask64 neg = (w0 & 0x8000 ? 0xFFFFFFFFull : 0) | (w1 & 0x8000 ? 0xFFFFFFFF00000000ull : 0);
        __m512i c = iq1_fields(E, p);
        c = _mm512_mask_add_epi8(c, neg, c, _mm512_set1_epi8(4));
        q[2 * p] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(c));
        q[2 * p + 1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(c, 1));
    }
    odd_scales(sc, _mm512_and_si512(_mm512_srli_epi32(dup_lanes(hv), 12), _mm512_set1_epi32(7)), d);
}

/* IQ1_M (deq_iq1_m): index = qs[4g + k] | bits 0-2 of nibble k%2 of qh[2g + k/2] << 8, bit 3
 * of that nibble the sub-group's delta sign; the f16 d from the scale words' top nibbles. */
INLINE void dec_iq1m(const uint8_t *b, __m512i *q, float *sc) {
    uint16_t sw[4];
    for (int i = 0; i < 4; i++) sw[i] = iq13_rd16(b + 48 + 2 * i);
    const float d = f16s((uint16_t)((sw[0] >> 12) | ((sw[1] >> 12) << 4) | ((sw[2] >> 12) << 8) | ((sw[3] >> 12) << 12)));
    const __m512i qv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 32)));
    const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    __m512i iv[2];
    for (int h = 0; h < 2; h++) {
        __m512i bi = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_set1_epi32(8 * h));
        __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(bi, qv), sh), _mm512_set1_epi32(7));
        __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 16 * h)));
        iv[h] = _mm512_or_si512(ix, _mm512_slli_epi32(hi, 8));
    }
    const __m512i E = iq1_lookup(iv);
    /* byte e of a pair takes the sign of sub-group e / 8, bit 4(e/8) + 3 of the pair's 4 qh
     * bytes, moved to bit 2 */
    static const uint8_t sctl[64] __attribute__((aligned(64))) = {
        1,  1,  1,  1,  1,  1,  1,  1,  5,  5,  5,  5,  5,  5,  5,  5,  9,  9,  9,  9,  9,  9,
        9,  9,  13, 13, 13, 13, 13, 13, 13, 13, 17, 17, 17, 17, 17, 17, 17, 17, 21, 21, 21, 21,
        21, 21, 21, 21, 25, 25, 25, 25, 25, 25, 25, 25, 29, 29, 29, 29, 29, 29, 29, 29};
    for (int p = 0; p < 4; p++) {
        __m512i sg = _mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)sctl),
                                                  _mm512_set1_epi64((long long)iq13_rd32(b + 32 + 4 * p)));
        __m512i c = _mm512_or_si512(iq1_fields(E, p), _mm512_and_si512(sg, _mm512_set1_epi8(4)));
        q[2 * p] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(c));
        q[2 * p + 1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(c, 1));
    }
    /* lane 2g + h: bits 6(g % 2) + 3h.. of word g / 2 */
    const __m512i wv = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(const void *)(b + 48))));
    const __m512i wi = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i wsh = _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
    odd_scales(sc, _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(wi, wv), wsh), _mm512_set1_epi32(7)), d);
}

INLINE void dec_blk(const uint8_t *b, __m512i *q, float *sc, const uint16_t *cls, const int ty) {
    if (ty == GGML_TYPE_IQ3_XXS || ty == GGML_TYPE_IQ3_S) dec_iq3(b, q, sc, cls, ty);
    else if (ty == GGML_TYPE_IQ1_S) dec_iq1s(b, q, sc);
    else dec_iq1m(b, q, sc);
}

/* The scales of a group as a vector: lanes 0-7 lo (a dot lane j holds weights 2j, 2j + 1),
 * lanes 8-15 hi. Only IQ1_M has lo != hi. */
INLINE __m512 scale_vec(const float *s, const int ty) {
    if (ty != GGML_TYPE_IQ1_M) return _mm512_set1_ps(s[0]);
    return _mm512_insertf32x8(_mm512_set1_ps(s[0]), _mm256_set1_ps(s[1]), 1);
}

/* ---- fp32 activations ---- */

/* Group g's 32 fp32 weights (exactly dequant.c's: code value x scale, both exact); one table
 * for both halves but for IQ1_M. */
INLINE void f32_weights(__m512i q, const float *s, __m512 kv, __m512 *w0, __m512 *w1, const int ty) {
    const __m512 t0 = _mm512_mul_ps(kv, _mm512_set1_ps(s[0]));
    const __m512 t1 = ty == GGML_TYPE_IQ1_M ? _mm512_mul_ps(kv, _mm512_set1_ps(s[1])) : t0;
    *w0 = _mm512_permutexvar_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(q)), t0);
    *w1 = _mm512_permutexvar_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(q, 1)), t1);
}

/* T > 1: 4 rows x 4 tokens over a panel of nb blocks (pw[r]: row r's fp32 weights) and the
 * tokens' activations x[t] (at the chunk's first block). */
INLINE void f32_tile(const float *const *pw, const float *const *x, int64_t nb, float *out) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb * 256; i += 32) {
        __m512 x0[4], x1[4];
        UNROLL for (int t = 0; t < 4; t++) {
            x0[t] = _mm512_loadu_ps(x[t] + i);
            x1[t] = _mm512_loadu_ps(x[t] + i + 16);
        }
        UNROLL for (int r = 0; r < 4; r++) {
            __m512 w0 = _mm512_load_ps(pw[r] + i), w1 = _mm512_load_ps(pw[r] + i + 16);
            UNROLL for (int t = 0; t < 4; t++) {
                a[r][t] = _mm512_fmadd_ps(w0, x0[t], a[r][t]);
                a[r][t] = _mm512_fmadd_ps(w1, x1[t], a[r][t]);
            }
        }
    }
    red4x4(a, out);
}

/* Stores (k = 0) or adds a T > 1 tile's sums (red4x4's order) for rows rr[] and tokens t.. */
INLINE void tile_out(const float *out, float *y, int64_t ldy, int64_t t, int64_t tc1, const int64_t *rr, int64_t k) {
    if (rr[3] >= 0 && t + 4 <= tc1) {
        tile_put4x4(out, y, ldy, t, rr[0], k);
        return;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4 && rr[i] >= 0 && t + j < tc1; j++) {
            float *yy = &y[(t + j) * ldy + rr[i]];
            *yy = k == 0 ? out[j * 4 + i] : *yy + out[j * 4 + i];
        }
}

/* ---- BF16 activations ---- */

/* The codes' values as BF16 (exact), in both halves of a 32-word vpermw table. */
INLINE __m512i bf16_values(const int ty) {
    const __m512 kv = code_values(ty);
    return (__m512i)_mm512_cvtne2ps_pbh(kv, kv);
}

/* One group: P = the 32 exact products summed pairwise from zero, acc = fma(P, S, acc). */
INLINE __m512 bf16_group(__m512 acc, __m512i wv, __m512i xv, __m512 s) {
    return _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(wv), as_bh(xv)), s, acc);
}

/* T = 1: 4 rows (far-apart streams) over blocks [b0, b1), one accumulator per row. Per group,
 * fp32: acc = fma(w0, x0, acc), fma(w1, x1, acc) (f32_tile's order); BF16 (bf): bf16_group
 * (bf16_tile's). The 4 rows' blocks are decoded before any is consumed: independent lookups
 * side by side (IQ1 ~10 % faster). */
INLINE void iq_t1(const uint8_t *const *wr, const void *xv, int64_t b0, int64_t b1, float *out, const uint16_t *cls,
                  const int ty, const int bf) {
    const __m512 kv = code_values(ty);
    const __m512i tbl = bf16_values(ty);
    const int bb = iq13_block_bytes(ty);
    const float *x = xv;
    const uint16_t *xb = xv;
    __m512 a[4];
    UNROLL for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();
    for (int64_t b = b0; b < b1; b++) {
        __m512i qq[4][8];
        float scs[4][16];
        UNROLL for (int r = 0; r < 4; r++) {
            const uint8_t *p = wr[r] + b * bb;
            for (int64_t ln = 0; ln < bb; ln += 64) _mm_prefetch((const char *)(p + PF_DIST + ln), _MM_HINT_T0);
            dec_blk(p, qq[r], scs[r], cls, ty);
        }
        UNROLL for (int r = 0; r < 4; r++) {
            const __m512i *q = qq[r];
            const float *sc = scs[r];
            UNROLL for (int g = 0; g < 8; g++) {
                if (bf) {
                    a[r] = bf16_group(a[r], _mm512_permutexvar_epi16(q[g], tbl),
                                      _mm512_loadu_si512((const void *)(xb + b * 256 + 32 * g)), scale_vec(sc + 2 * g, ty));
                    continue;
                }
                __m512 w0, w1;
                f32_weights(q[g], sc + 2 * g, kv, &w0, &w1, ty);
                a[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + b * 256 + 32 * g), a[r]);
                a[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + b * 256 + 32 * g + 16), a[r]);
            }
        }
    }
    red4(a, out);
}

/* T > 1: 4 panel rows (BF16 weights pw[r], scales ps[r]: 2 per group) x 4 tokens. */
INLINE void bf16_tile(const uint16_t *const *pw, const float *const *ps, const uint16_t *const *x, int64_t nb,
                      float *out, const int ty) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb * 8; g++) {
        __m512i xv[4];
        UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm512_loadu_si512((const void *)(x[t] + 32 * g));
        UNROLL for (int r = 0; r < 4; r++) {
            __m512i wv = _mm512_load_si512((const void *)(pw[r] + 32 * g));
            __m512 s = scale_vec(ps[r] + 2 * g, ty);
            UNROLL for (int t = 0; t < 4; t++) a[r][t] = bf16_group(a[r][t], wv, xv[t], s);
        }
    }
    red4x4(a, out);
}

/* The driver of both families (bf: BF16 activations). T = 1: tiles of 4 far-apart rows, K
 * chunks of IQ_KB blocks, results summed in chunk order. T > 1: per token chunk and K chunk,
 * each tile of 4 adjacent rows is decoded once into a panel (fp32 weights, or BF16 weights and
 * their scales) and the 4 x 4 tile runs over it for every 4 tokens of the chunk. */
INLINE void iq_mm(const dsf_wmat *w, const void *xv, int64_t T, float *y, int64_t ldy, int64_t r0, int64_t r1,
                  const int ty, const int bf) {
    if (iq13_twin(w, xv, T, y, ldy, r0, r1, bf)) return;
    const int64_t nbk = w->n_in / 256;
    const int bb = iq13_block_bytes(ty);
    _Alignas(64) uint16_t cls[512];
    if (ty == GGML_TYPE_IQ3_XXS) iq3_classes(grid_iq3xxs, 256, 3, cls);
    if (ty == GGML_TYPE_IQ3_S) iq3_classes(grid_iq3s, 512, 1, cls);
    const uint8_t *wr[4];
    int64_t rr[4];
    if (T == 1) {
        const int64_t len = t1_stream_len(r0, r1, 4, 1);
        for (int64_t k = 0; k < len; k++) {
            t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
            for (int64_t b0 = 0; b0 < nbk; b0 += IQ_KB) {
                const int64_t b1 = b0 + IQ_KB < nbk ? b0 + IQ_KB : nbk;
                float o[4];
                iq_t1(wr, xv, b0, b1, o, cls, ty, bf);
                for (int i = 0; i < 4; i++)
                    if (rr[i] >= 0) y[rr[i]] = b0 == 0 ? o[i] : y[rr[i]] + o[i];
            }
        }
        return;
    }
    /* the panel: fp32 weights, or BF16 weights (first half) and 2 scales per group */
    _Alignas(64) float panel[4][IQ_KB * 256];
    float pscale[4][IQ_KB * 16];
    const float *pw[4] = {panel[0], panel[1], panel[2], panel[3]}, *ps[4] = {pscale[0], pscale[1], pscale[2], pscale[3]};
    const uint16_t *pb[4] = {(const uint16_t *)(void *)panel[0], (const uint16_t *)(void *)panel[1],
                             (const uint16_t *)(void *)panel[2], (const uint16_t *)(void *)panel[3]};
    const __m512 kv = code_values(ty);
    const __m512i tbl = bf16_values(ty);
    const int xs = bf ? 2 : 4; /* activation element bytes */
    const int64_t len = t1_stream_len(r0, r1, 1, 4);
    for (int64_t tc = 0; tc < T; tc += IQ_TC) {
        const int64_t tc1 = tc + IQ_TC < T ? tc + IQ_TC : T;
        for (int64_t b0 = 0; b0 < nbk; b0 += IQ_KB) {
            const int64_t nb = b0 + IQ_KB < nbk ? IQ_KB : nbk - b0;
            for (int64_t k = 0; k < len; k++) {
                t1_tile_rows(w, r0, r1, len, k, 1, 4, rr, wr);
                for (int r = 0; r < 4; r++)
                    for (int64_t b = 0; b < nb; b++) {
                        __m512i q[8];
                        dec_blk(wr[r] + (b0 + b) * bb, q, &pscale[r][b * 16], cls, ty);
                        for (int g = 0; g < 8; g++) {
                            if (bf) {
                                _mm512_store_si512((void *)(pb[r] + b * 256 + 32 * g), _mm512_permutexvar_epi16(q[g], tbl));
                                continue;
                            }
                            __m512 w0, w1;
                            f32_weights(q[g], &pscale[r][b * 16 + 2 * g], kv, &w0, &w1, ty);
                            _mm512_store_ps(&panel[r][b * 256 + 32 * g], w0);
                            _mm512_store_ps(&panel[r][b * 256 + 32 * g + 16], w1);
                        }
                    }
                for (int64_t t = tc; t < tc1; t += 4) {
                    const void *xt[4];
                    float out[16];
                    for (int j = 0; j < 4; j++)
                        xt[j] = (const uint8_t *)xv + ((t + j < tc1 ? t + j : tc1 - 1) * w->n_in + b0 * 256) * xs;
                    if (bf) bf16_tile(pb, ps, (const uint16_t *const *)xt, nb, out, ty);
                    else f32_tile(pw, (const float *const *)xt, nb, out);
                    tile_out(out, y, ldy, t, tc1, rr, b0);
                }
            }
        }
    }
}

IQ13_DEFINE(avx512, iq_mm)

#endif
