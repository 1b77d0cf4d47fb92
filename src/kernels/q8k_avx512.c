/* q8k_avx512.c: AVX-512 kernels of the opt-in Q8_K activation mode (matmul.h matmul_q8k_fn) for
 * the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, decode (T = 1) and prefill (T > 1). Compiled
 * with the Makefile's AVX512_FLAGS only; its entries sit in kernels_avx512's matmul_q8k
 * (matmul_avx512.c).
 *
 * Owns: the integer dot of a super-block's weight codes with the activation codes and its
 * scaling, the tiles and the driver. Must not: allocate (the permuted activations are on the
 * stack), call select.c; rows it does not handle (n_in not a multiple of 256, or over XBUF)
 * go to the scalar twin. dequant.c (deq_q*_k) stays the reference for what each byte means;
 * kquant_x86.h decodes the Q3_K, Q4_K and Q5_K scales.
 *
 * The arithmetic, per super-block of one row and one token (weights w = d sc q - dmin m, codes q
 * unsigned, activation a = dx * c, c int8):
 *   sum w a = (d dx) * sum_j sc_j sum_{i in j} q_i c_i - (dmin dx) * sum_j m_j sum_{i in j} c_i
 * The inner sums are integers, exact: vpmaddubsw (u8 code x s8 activation, pairs summed: at most
 * 2 * 63 * 128 in magnitude, no saturation) then vpdpwssd with the sub-block scales as words
 * (4 registers of 64 codes, 16 int32 lanes); Q2_K instead looks up code x scale (<= 45) in a
 * vpermb table and dots with vpdpbusd. The minima's sums come from the Q8_K block's bsums
 * (vpmaddwd with the minima as words). Q3_K and Q6_K have signed codes q - 4 / q - 32: their
 * codes q are unsigned and the bias, a multiple of d, joins isum through the bsums. Then per
 * super-block, in this order: acc += cvt(isum) * (d dx); acc -= cvt(imin) * (dmin dx) (fp32
 * lanes, one accumulator per row and token; Q3_K, Q6_K: the first only), and at the end the 16
 * lanes' sum by red4 / red4x4's tree.
 *
 * Layout: the weights' code registers are what one 64-byte load gives after a shift and a mask
 * (Q4_K, Q5_K: the low or high nibbles of 64 code bytes = sub-blocks 2c+k and 2c+2+k, 32
 * elements each; Q2_K, Q3_K: plane s of the 64 code bytes = elements 32s.. and 128 + 32s.., 16
 * per sub-block; Q6_K: the nibbles of 64 ql bytes = 64 elements in order), the high bits (Q3_K,
 * Q5_K, Q6_K) rotated into place per 256-bit half and merged by one ternlog; the activations
 * are permuted once per token to match (q8_perm: 32-byte pieces moved).
 *
 * Batch invariance: every output gets the same operations (same super-block order, same lanes,
 * same final tree) whatever T, the tile and the row range: there are no K chunks. */
#include "kernels/q8k.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "kernels/kquant_x86.h"
#include "kernels/tile512.h"

#define QK 256
/* The permuted activations on the stack: one token for T = 1, XBUF / n_in tokens per chunk for
 * T > 1 (so n_in <= XBUF). */
#define XBUF (128 * 1024)

enum { Q2, Q3, Q4, Q5, Q6 };
static const int q8_bytes[5] = {84, 110, 144, 176, 210};

/* 32-byte piece i of a permuted super-block is piece q8_order[K][i] of the original (Q2_K and
 * Q3_K: planes; Q4_K and Q5_K: nibbles; Q6_K: already in order) */
static const uint8_t q8_order[5][8] = {{0, 4, 1, 5, 2, 6, 3, 7}, {0, 4, 1, 5, 2, 6, 3, 7}, {0, 2, 1, 3, 4, 6, 5, 7},
                                       {0, 2, 1, 3, 4, 6, 5, 7}, {0, 1, 2, 3, 4, 5, 6, 7}};

static void q8_perm(const int K, const dsf_q8k *x, int64_t nb, int8_t *xp) {
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < 8; i++)
            _mm256_storeu_si256((__m256i *)(void *)(xp + b * QK + 32 * i),
                                _mm256_loadu_si256((const __m256i *)(const void *)(x[b].qs + 32 * q8_order[K][i])));
}

/* One row's super-block, decoded: 4 registers of 64 unsigned codes, their sub-block scales as
 * words (in 128-bit quarters: quarter L holds the scale of the codes of quarter L), the words
 * that multiply the Q8_K block's 16 bsums for the offset term, d and the offset's factor dmin:
 * the block's sum is d dx isum - dmin dx imin. Offsets: Q2_K, Q4_K, Q5_K their minima (m
 * words, dmin); Q3_K and Q6_K their code bias (codes u = q + 4 resp. q + 32 are unsigned: m
 * the scales times -4 resp. -32, added to isum in q8_dot; dmin unused). */
typedef struct {
    __m512i w[4], s[4];
    __m256i m;
    float d, dmin;
} q8_row;

/* vpshufb / vpermw sources: quarter L of register i belongs to sub-block q8_sidx[K][i][L] (Q2_K,
 * Q3_K, Q6_K: sub-blocks of 16; Q4_K, Q5_K: of 32) */
static const uint8_t q8_sidx[5][4][4] = {
    {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}, /* Q2_K: 2s, 2s+1, 8+2s, 9+2s */
    {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}, /* Q3_K: as Q2_K */
    {{0, 0, 2, 2}, {1, 1, 3, 3}, {4, 4, 6, 6}, {5, 5, 7, 7}},       /* Q4_K: 2c+k, 2c+2+k */
    {{0, 0, 2, 2}, {1, 1, 3, 3}, {4, 4, 6, 6}, {5, 5, 7, 7}},       /* Q5_K: as Q4_K */
    {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}, /* Q6_K: in order */
};

/* the quarters' sub-block indices j, 4 x 2 per 64 bits: as vpshufb bytes (j, high byte zeroed)
 * or as vpermw word indices (j) */
INLINE __m512i q8_sshuf(const int K, int i, int words) {
    const uint8_t *s = q8_sidx[K][i];
    const uint64_t rep = 0x0001000100010001ull, z = words ? 0 : 0x8000u;
    const uint64_t q0 = (z | s[0]) * rep, q1 = (z | s[1]) * rep, q2 = (z | s[2]) * rep, q3 = (z | s[3]) * rep;
    return _mm512_set_epi64((long long)q3, (long long)q3, (long long)q2, (long long)q2, (long long)q1, (long long)q1,
                            (long long)q0, (long long)q0);
}

/* 32 bytes at p in both halves, rotated in each 64 bits right by ra (low half) or rb (high
 * half): brings bit `from` of every byte to bit `to` with ra = (from - to) mod 64 */
INLINE __m512i q8_hbits(const uint8_t *p, int ra, int rb) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_rorv_epi64(h, _mm512_set_epi64(rb, rb, rb, rb, ra, ra, ra, ra));
}
#define ANDOR(a, b, c) _mm512_ternarylogic_epi32(a, b, c, 0xEA) /* (a & b) | c */
#define OR_MASKED(a, b, m) _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi8(m), 0xF8) /* a | (b & m) */

/* Decodes super-block b of a row (its first byte at p). */
INLINE void q8_decode(const int K, const uint8_t *p, q8_row *o) {
    const __m512i lo2 = _mm512_set1_epi8(3), lo4 = _mm512_set1_epi8(15);
    if (K == Q2) { /* plane s as below, each code times its scale (<= 45: u8) by a vpermb table */
        const __m512i q = _mm512_loadu_si512((const void *)(p + 16));
        const __m128i sc = _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)p), _mm_set1_epi8(15));
        const __m512i tab = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(sc), _mm512_set1_epi32(0x03020100)); /* 4j + c: sc_j c */
        UNROLL for (int s = 0; s < 4; s++) {
            const uint8_t *j = q8_sidx[Q2][s];
            const uint64_t r = 0x0404040404040404ull; /* quarter L: 4 j_L */
            const __m512i base = _mm512_set_epi64((long long)(r * j[3]), (long long)(r * j[3]), (long long)(r * j[2]),
                                                  (long long)(r * j[2]), (long long)(r * j[1]), (long long)(r * j[1]),
                                                  (long long)(r * j[0]), (long long)(r * j[0]));
            o->w[s] = _mm512_permutexvar_epi8(ANDOR(s ? _mm512_srli_epi16(q, 2 * s) : q, lo2, base), tab);
        }
    } else if (K == Q3) { /* plane s of the 64 code bytes: elements 32s.. and 128 + 32s.. */
        const __m512i q = _mm512_loadu_si512((const void *)(p + 32));
        UNROLL for (int s = 0; s < 4; s++) {
            o->w[s] = _mm512_and_si512(s ? _mm512_srli_epi16(q, 2 * s) : q, lo2);
            /* Q3_K: + 4 * bit 4h + s of hmask[l] (element 128h + 32s + l) */
            if (K == Q3) o->w[s] = OR_MASKED(o->w[s], q8_hbits(p, (s - 2) & 63, (s + 2) & 63), 4);
        }
    } else if (K == Q4 || K == Q5) { /* nibble k of 64 code bytes: sub-blocks 2c + k, 2c + 2 + k */
        UNROLL for (int c = 0; c < 2; c++) {
            const __m512i q = _mm512_loadu_si512((const void *)(p + (K == Q4 ? 16 : 48) + 64 * c));
            o->w[2 * c] = _mm512_and_si512(q, lo4);
            o->w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), lo4);
        }
        if (K == Q5) /* + 16 * bit j of qh[l] (element 32j + l) */
            UNROLL for (int i = 0; i < 4; i++)
                o->w[i] = OR_MASKED(o->w[i], q8_hbits(p + 16, (q8_sidx[Q5][i][0] - 4) & 63, (q8_sidx[Q5][i][2] - 4) & 63), 16);
    } else { /* Q6_K, half h: nibbles of ql[64h + l] (elements 128h + l, + 64), + 16 * 2 bits of qh[32h + l] */
        UNROLL for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512((const void *)(p + 64 * h));
            o->w[2 * h] = OR_MASKED(_mm512_and_si512(q, lo4), q8_hbits(p + 128 + 32 * h, 60, 62), 0x30);
            o->w[2 * h + 1] = OR_MASKED(_mm512_and_si512(_mm512_srli_epi16(q, 4), lo4), q8_hbits(p + 128 + 32 * h, 0, 2), 0x30);
        }
    }
    if (K == Q2 || K == Q4 || K == Q5) { /* unsigned scales as bytes, minima */
        __m128i sc, mn;
        float d, dmin;
        if (K == Q2) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
            sc = _mm_and_si128(b, _mm_set1_epi8(15));
            mn = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)); /* minimum j against bsum j */
            const __m128 dd = kq_f16x2(p + 80);
            d = _mm_cvtss_f32(dd), dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        } else {
            sc = kq_k45_bytes(p); /* sc_0..7, m_0..7 */
            mn = _mm_shuffle_epi8(sc, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)); /* bsums 2j, 2j+1 */
            const __m128 dd = kq_f16x2(p);
            d = _mm_cvtss_f32(dd), dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        }
        o->m = _mm256_cvtepu8_epi16(mn);
        o->d = d, o->dmin = dmin;
        const __m512i sb = _mm512_broadcast_i32x4(sc);
        if (K != Q2) UNROLL for (int i = 0; i < 4; i++) o->s[i] = _mm512_shuffle_epi8(sb, q8_sshuf(K, i, 0));
    } else { /* signed scales as words: Q3_K 6-bit (bias removed), Q6_K int8 */
        const __m128i sc = K == Q3 ? kq_k3_bytes(p + 94) : _mm_loadu_si128((const __m128i *)(const void *)(p + 192));
        const __m256i sw = _mm256_cvtepi8_epi16(sc);
        UNROLL for (int i = 0; i < 4; i++) o->s[i] = _mm512_permutexvar_epi16(q8_sshuf(K, i, 1), _mm512_castsi256_si512(sw));
        o->m = _mm256_mullo_epi16(sw, _mm256_set1_epi16(K == Q3 ? -4 : -32)); /* |.| <= 128 resp. 4096 */
        o->d = _mm_cvtss_f32(_mm_movehdup_ps(kq_f16x2(p + (K == Q3 ? 106 : 206))));
        o->dmin = 0;
    }
}

/* acc += the super-block's contribution of one row (st) and one token (xp: its permuted codes
 * of the super-block, xb: its Q8_K block). Q3_K, Q6_K: their bias is a multiple of d, so it
 * joins the integer sum (st->m holds -4 resp. -32 times the scales) and one FMA scales both. */
INLINE __m512 q8_dot(const int K, const q8_row *st, const int8_t *xp, const dsf_q8k *xb, __m512 acc) {
    __m512i is = _mm512_setzero_si512();
    UNROLL for (int i = 0; i < 4; i++) {
        const __m512i x = _mm512_loadu_si512((const void *)(xp + 64 * i));
        if (K == Q2) { /* the codes carry their scales */
            is = _mm512_dpbusd_epi32(is, st->w[i], x);
            continue;
        }
        const __m512i p = _mm512_maddubs_epi16(st->w[i], x);
        is = i ? _mm512_dpwssd_epi32(is, p, st->s[i]) : _mm512_madd_epi16(p, st->s[i]);
    }
    const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)xb->bsums);
    if (K == Q3 || K == Q6) {
        is = _mm512_dpwssd_epi32(is, _mm512_zextsi256_si512(bs), _mm512_zextsi256_si512(st->m));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(st->d * xb->d), acc);
    }
    const __m256i im = _mm256_madd_epi16(st->m, bs);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(st->d * xb->d), acc);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(im)), _mm512_set1_ps(st->dmin * xb->d), acc);
}

/* A tile: 4 rows (wr) x NT tokens (xp[t]: permuted codes, xq[t]: Q8_K blocks) over all nb
 * super-blocks; out[t * 4 + r]. NT = 1 is the decode tile (prefetching). */
INLINE void q8_tile(const int K, const int NT, const uint8_t *const *wr, const int8_t *const *xp,
                    const dsf_q8k *const *xq, int64_t nb, float *out) {
    __m512 a[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int t = 0; t < NT; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        UNROLL for (int r = 0; r < 4; r++) {
            const uint8_t *p = wr[r] + b * q8_bytes[K];
            if (NT == 1)
                for (int o = 0; o < q8_bytes[K]; o += 64) _mm_prefetch((const char *)(p + PF_DIST + o), _MM_HINT_T0);
            q8_row st;
            q8_decode(K, p, &st);
            UNROLL for (int t = 0; t < NT; t++) a[r][t] = q8_dot(K, &st, xp[t] + b * QK, &xq[t][b], a[r][t]);
        }
    }
    if (NT == 1) {
        __m512 a1[4] = {a[0][0], a[1][0], a[2][0], a[3][0]};
        red4(a1, out);
    } else
        red4x4(a, out);
}

/* The driver: row tiles of 4 rows from far-apart streams (tile512.h), for T = 1 and T > 1
 * alike; T > 1: token chunks of XBUF / n_in (permuted once), then row tiles x token tiles of 4
 * (an edge tile repeats the last token and drops its results). */
INLINE void q8_run(const int K, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy, int64_t r0,
                   int64_t r1) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % QK != 0 || w->n_in > XBUF) {
        matmul_q8k_any_ref(w, x, T, y, ldy, r0, r1);
        return;
    }
    const int64_t nb = w->n_in / QK, tch = XBUF / w->n_in, len = t1_stream_len(r0, r1, 4, 1);
    _Alignas(64) int8_t xp[XBUF];
    const uint8_t *wr[4];
    int64_t rr[4];
    for (int64_t tc = 0; tc < T; tc += tch) {
        const int64_t tc1 = tc + tch < T ? tc + tch : T;
        for (int64_t t = tc; t < tc1; t++) q8_perm(K, x + t * nb, nb, xp + (t - tc) * w->n_in);
        for (int64_t k = 0; k < len; k++) {
            t1_tile_rows(w, r0, r1, len, k, 4, 1, rr, wr);
            if (T == 1) {
                const int8_t *xp1 = xp;
                float out[4];
                q8_tile(K, 1, wr, &xp1, &x, nb, out);
                kq_put(y, ldy, rr, 4, 0, 1, out, 1);
                continue;
            }
            for (int64_t t = tc; t < tc1; t += 4) {
                const int8_t *xt[4];
                const dsf_q8k *qt[4];
                float out[16];
                for (int j = 0; j < 4; j++) {
                    const int64_t tt = t + j < tc1 ? t + j : tc1 - 1;
                    xt[j] = xp + (tt - tc) * w->n_in;
                    qt[j] = x + tt * nb;
                }
                q8_tile(K, 4, wr, xt, qt, nb, out);
                kq_put(y, ldy, rr, 4, t, tc1 - t < 4 ? tc1 - t : 4, out, 1);
            }
        }
    }
}

#define MQ8_ENTRY(T, K)                                                                                        \
    void mq8_##T##_avx512(const dsf_wmat *w, const dsf_q8k *x, int64_t T_, float *y, int64_t ldy, int64_t r0,  \
                          int64_t r1) {                                                                      \
        q8_run(K, w, x, T_, y, ldy, r0, r1);                                                                 \
    }
MQ8_ENTRY(q2_k, Q2)
MQ8_ENTRY(q3_k, Q3)
MQ8_ENTRY(q4_k, Q4)
MQ8_ENTRY(q5_k, Q5)
MQ8_ENTRY(q6_k, Q6)

#endif
