/* quant.c: element codecs, block dequantization, QDQ operators and the MXFP4 repack
 * (src/kernels/quant.c) against values worked by hand from architecture.md §3 / §11.3 and the
 * block definitions of gguf-layout.md §1.4-1.5. Expected values are either literal
 * hand-worked numbers or an element-index formula written here independently of the
 * block-loop structure of quant.c. */
#include "test.h"
#include "kernels/quant.h"
#include "kernels/dtype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Deterministic PRNG (xorshift64*) for filling blocks. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static void fill(uint8_t *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd(); }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* ---------------------------------------------------------------- e4m3 */

/* Guards against a wrong bias, subnormal rule or NaN code: every one of the 256 codes
 * against arch §3.1's formula, plus anchors worked by hand. */
TEST(quant_e4m3_all_codes) {
    for (int b = 0; b < 256; b++) {
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        float got = e4m3_to_f32((uint8_t)b);
        if (e == 15 && m == 7) { CHECKF(isnan(got), "code 0x%02x should be NaN", b); continue; }
        double want = e ? (8 + m) * ldexp(1, e - 10) : m * ldexp(1, -9);
        if (s) want = -want;
        CHECKF(got == (float)want, "code 0x%02x: got %a want %a", b, got, want);
        /* Every finite code round-trips (incl. -0 -> 0x80). */
        CHECKF(f32_to_e4m3(got) == b, "code 0x%02x: round trip gave 0x%02x", b, f32_to_e4m3(got));
    }
    CHECK(e4m3_to_f32(0x7E) == 448.0f);
    CHECK(e4m3_to_f32(0xFE) == -448.0f);
    CHECK(e4m3_to_f32(0x38) == 1.0f);
    CHECK(e4m3_to_f32(0x08) == 0x1p-6f);  /* smallest normal */
    CHECK(e4m3_to_f32(0x07) == 7 * 0x1p-9f); /* largest subnormal */
    CHECK(e4m3_to_f32(0x01) == 0x1p-9f);
    CHECK(e4m3_to_f32(0x39) == 1.125f);
}

/* Guards against truncation instead of RNE, ties going up, and NaN/overflow on large input. */
TEST(quant_e4m3_rounding) {
    CHECK(f32_to_e4m3(1.0625f) == 0x38);              /* tie 1.0|1.125 -> even mantissa 0 */
    CHECK(f32_to_e4m3(1.1875f) == 0x3A);              /* tie 1.125|1.25 -> even (1.25) */
    CHECK(f32_to_e4m3(nextafterf(1.0625f, 2)) == 0x39);
    CHECK(f32_to_e4m3(-1.0625f) == 0xB8);
    CHECK(f32_to_e4m3(400.0f) == 0x7C);               /* tie 384|416 -> 384 (m=4) */
    CHECK(f32_to_e4m3(432.0f) == 0x7E);               /* tie 416|448 -> 448 (m=6) */
    CHECK(f32_to_e4m3(448.0f) == 0x7E);
    CHECK(f32_to_e4m3(460.0f) == 0x7E);               /* saturate, never NaN */
    CHECK(f32_to_e4m3(464.0f) == 0x7E);
    CHECK(f32_to_e4m3(1e30f) == 0x7E);
    CHECK(f32_to_e4m3(INFINITY) == 0x7E);
    CHECK(f32_to_e4m3(-INFINITY) == 0xFE);
    CHECK(f32_to_e4m3(-3e38f) == 0xFE);
    CHECK(isnan(e4m3_to_f32(f32_to_e4m3(NAN))));
    /* Subnormals: step 2^-9. */
    CHECK(f32_to_e4m3(0x1p-10f) == 0x00);             /* tie 0|2^-9 -> 0 */
    CHECK(f32_to_e4m3(nextafterf(0x1p-10f, 1)) == 0x01);
    CHECK(f32_to_e4m3(3 * 0x1p-10f) == 0x02);         /* tie 1|2 -> 2 */
    CHECK(f32_to_e4m3(7.5f * 0x1p-9f) == 0x08);       /* tie 7 (sub) | 8 = 2^-6 -> 8 */
    CHECK(f32_to_e4m3(0x1p-30f) == 0x00);
    CHECK(f32_to_e4m3(1e-45f) == 0x00);               /* fp32 subnormal input */
    CHECK(f32_to_e4m3(15.5f) == 0x58);                /* tie 15|16 -> 16 = 8*2^(11-10): exponent carry */
    CHECK(e4m3_to_f32(0x58) == 16.0f);
}

/* ---------------------------------------------------------------- bf16 / f16 */

/* Guards against truncation, wrong tie handling and NaN becoming Inf. */
TEST(quant_bf16_rne) {
    CHECK(f32_to_bf16(1.0f) == 0x3F80);
    CHECK(f32_to_bf16(-2.0f) == 0xC000);
    CHECK(f32_to_bf16(1.0f + 0x1p-8f) == 0x3F80);          /* tie -> even */
    CHECK(f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);      /* tie -> even (up) */
    CHECK(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81); /* above tie */
    CHECK(f32_to_bf16(3.4028235e38f) == 0x7F80);           /* FLT_MAX rounds to inf (RNE) */
    CHECK(f32_to_bf16(INFINITY) == 0x7F80);
    uint16_t n = f32_to_bf16(u2f(0x7F800001u));            /* signalling NaN, payload in low bits */
    CHECKF((n & 0x7F80) == 0x7F80 && (n & 0x0040), "NaN -> 0x%04x", n);
    CHECK(bf16_to_f32(0x4049) == 3.140625f);
    CHECK(bf16_to_f32(0x0001) == 0x1p-133f);               /* bf16 subnormal */
    CHECK(f2u(bf16_to_f32(0x8000)) == 0x80000000u);
}

TEST(quant_f16_rne) {
    CHECK(f32_to_f16(1.0f) == 0x3C00);
    CHECK(f32_to_f16(-2.0f) == 0xC000);
    CHECK(f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(f32_to_f16(65519.0f) == 0x7BFF);
    CHECK(f32_to_f16(65520.0f) == 0x7C00);                 /* tie 65504|65536 -> even = inf */
    CHECK(f32_to_f16(1e10f) == 0x7C00);
    CHECK(f32_to_f16(-INFINITY) == 0xFC00);
    CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);          /* tie -> even */
    CHECK(f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02);
    CHECK(f32_to_f16(0x1p-24f) == 0x0001);                 /* smallest subnormal */
    CHECK(f32_to_f16(0x1p-25f) == 0x0000);                 /* tie 0|1 -> 0 */
    CHECK(f32_to_f16(3 * 0x1p-25f) == 0x0002);             /* tie 1|2 -> 2 */
    CHECK(f32_to_f16(1023.5f * 0x1p-24f) == 0x0400);       /* tie largest subnormal|min normal */
    CHECK(f32_to_f16(0x1p-14f) == 0x0400);
    uint16_t n = f32_to_f16(NAN);
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x03FF));
    CHECK(f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(f16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    CHECK(f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(isinf(f16_to_f32(0x7C00)) && f16_to_f32(0xFC00) < 0);
    CHECK(isnan(f16_to_f32(0x7E00)));
    /* All finite f16 round-trip. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00) continue;
        CHECKF(f32_to_f16(f16_to_f32((uint16_t)h)) == h, "f16 0x%04x", h);
    }
}

/* ---------------------------------------------------------------- e2m1 / e8m0 / pow2ceil */

/* arch §3.1: the midpoint table, ties to the even code. */
TEST(quant_e2m1_midpoints) {
    static const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = e2m1_to_f32((uint8_t)c);
        CHECKF(v == ((c & 8) ? -mags[c & 7] : mags[c & 7]), "code %d", c);
        if (c != 8) CHECKF(f32_to_e2m1(v) == c, "exact value of code %d", c); /* -0 is code 8 */
    }
    struct { float x; float want; } mid[] = {
        {0.25f, 0}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f}, {2.5f, 2.0f}, {3.5f, 4.0f}, {5.0f, 4.0f},
    };
    for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++) {
        CHECKF(e2m1_to_f32(f32_to_e2m1(mid[i].x)) == mid[i].want, "midpoint %g", mid[i].x);
        CHECKF(e2m1_to_f32(f32_to_e2m1(-mid[i].x)) == -mid[i].want, "midpoint -%g", mid[i].x);
    }
    CHECK(f32_to_e2m1(0.26f) == 1);
    CHECK(f32_to_e2m1(5.01f) == 7);
    CHECK(f32_to_e2m1(6.5f) == 7);     /* clamp */
    CHECK(f32_to_e2m1(1e30f) == 7);
    CHECK(f32_to_e2m1(-INFINITY) == 15);
    CHECK(f32_to_e2m1(0x1p-140f) == 0);
}

TEST(quant_e8m0_pow2ceil) {
    CHECK(e8m0_to_f32(127) == 1.0f);
    CHECK(e8m0_to_f32(0) == 0x1p-127f);
    CHECK(e8m0_to_f32(1) == 0x1p-126f);
    CHECK(e8m0_to_f32(254) == 0x1p127f);
    CHECK(isnan(e8m0_to_f32(255)));
    CHECK(pow2ceil_f32(1.0f) == 1.0f);
    CHECK(pow2ceil_f32(nextafterf(1.0f, 2)) == 2.0f);
    CHECK(pow2ceil_f32(0.75f) == 1.0f);
    CHECK(pow2ceil_f32(3.0f) == 4.0f);
    CHECK(pow2ceil_f32(0.1f) == 0.125f);
    CHECK(pow2ceil_f32(0x1p-126f) == 0x1p-126f);
    CHECK(pow2ceil_f32(3.2f / 448) == 0x1p-7f);
    CHECK(pow2ceil_f32(0x1.8p-140f) == 0x1p-139f); /* subnormal input: 2^ceil(log2 t) */
}

/* ---------------------------------------------------------------- QDQ (§11.3) */

static void qdq_input(float *x, int n) {
    for (int k = 0; k < n; k++) x[k] = bf16_to_f32(f32_to_bf16(0.1f * (float)(k + 1) * ((k & 1) ? -1 : 1)));
}

/* Guards the scale rules and the value paths of all three operators against the spec's vectors. */
TEST(quant_qdq_vectors) {
    float x[32];
    qdq_input(x, 32);
    qdq_fp8_e8m0(x, 32);
    static const float fp8_head[8] = {0.1015625f, -0.203125f, 0.3125f, -0.40625f, 0.5f, -0.625f, 0.6875f, -0.8125f};
    static const float fp8_tail[4] = {3.0f, -3.0f, 3.0f, -3.25f};
    for (int k = 0; k < 8; k++) CHECKF(x[k] == fp8_head[k], "fp8 out[%d] = %.9g", k, x[k]);
    for (int k = 0; k < 4; k++) CHECKF(x[28 + k] == fp8_tail[k], "fp8 out[%d] = %.9g", 28 + k, x[28 + k]);
    /* Scale 2^-7: every output is an e4m3 value times 2^-7. */
    for (int k = 0; k < 32; k++) {
        float q = x[k] * 128.0f;
        CHECKF(e4m3_to_f32(f32_to_e4m3(q)) == q, "fp8 out[%d] not on the 2^-7 e4m3 grid", k);
    }

    qdq_input(x, 32);
    qdq_fp4_e8m0(x, 32);
    static const float fp4_head[8] = {0, 0, 0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -1.0f};
    static const float fp4_tail[4] = {3, -3, 3, -3};
    for (int k = 0; k < 8; k++) CHECKF(x[k] == fp4_head[k], "fp4e8 out[%d] = %.9g", k, x[k]);
    for (int k = 0; k < 4; k++) CHECKF(x[28 + k] == fp4_tail[k], "fp4e8 out[%d] = %.9g", 28 + k, x[28 + k]);
    for (int k = 0; k < 32; k++) CHECK(e2m1_to_f32(f32_to_e2m1(x[k])) == x[k]); /* scale 1.0 */

    qdq_input(x, 16);
    qdq_fp4_e4m3(x, 16);
    static const float fp4e4[16] = {0.140625f, -0.140625f, 0.28125f, -0.421875f, 0.5625f, -0.5625f,
                                    0.5625f, -0.84375f, 0.84375f, -1.125f, 1.125f, -1.125f,
                                    1.125f, -1.125f, 1.6875f, -1.6875f};
    for (int k = 0; k < 16; k++) CHECKF(x[k] == fp4e4[k], "fp4e4 out[%d] = %.9g", k, x[k]);
    CHECK(e4m3_to_f32(f32_to_e4m3(1.6015625f / 6.0f)) == 0.28125f); /* the listed scale */
}

/* Guards against NaN/Inf from zero groups, huge or tiny groups, and group independence. */
TEST(quant_qdq_edge) {
    float x[64];
    for (int op = 0; op < 3; op++) {
        memset(x, 0, sizeof x);
        x[40] = 1e38f; x[41] = -1e38f; x[42] = 1e-40f; x[43] = 0x1p-149f;
        for (int i = 48; i < 64; i++) x[i] = 1e-30f * (float)(i - 50);
        if (op == 0) qdq_fp8_e8m0(x, 64);
        else if (op == 1) qdq_fp4_e8m0(x, 64);
        else qdq_fp4_e4m3(x, 64);
        for (int i = 0; i < 64; i++) CHECKF(isfinite(x[i]), "op %d: x[%d] = %g", op, i, x[i]);
        for (int i = 0; i < 32; i++) CHECKF(x[i] == 0, "op %d: zero group changed at %d", op, i);
        if (op < 2) CHECKF(x[40] > 1e37f && x[41] < -1e37f, "op %d: large values lost (%g)", op, x[40]);
        /* e4m3 scale saturates at 448 and x/s clamps to 6: 6 * 448 (what §3.3's formula gives). */
        else CHECKF(x[40] == 2688.0f && x[41] == -2688.0f, "op 2: %g", x[40]);
    }
    /* fp8 on a group whose amax is exactly a power of two times 448: scale exact, values kept. */
    for (int i = 0; i < 32; i++) x[i] = (i & 1) ? -448.0f * 0x1p-3f : 0x1p-3f;
    qdq_fp8_e8m0(x, 32);
    CHECK(x[1] == -56.0f && x[0] == 0.125f);
}

/* ---------------------------------------------------------------- packed QDQ (§5.1) */

typedef void (*qdq_op)(float *, int64_t);
typedef void (*pack_op)(const float *, int64_t, uint8_t *, uint8_t *);
typedef void (*unpack_op)(float *, const uint8_t *, const uint8_t *, int64_t);

/* Packs x, unpacks it, runs the QDQ on a copy: the index of the first element whose bits
 * differ (two NaNs count as equal), or -1. */
static int pack_vs_qdq(const float *x, int n, qdq_op qdq, pack_op pack, unpack_op unpack) {
    static float a[1024], b[1024];
    static uint8_t codes[1024], scales[64];
    memcpy(a, x, (size_t)n * sizeof *x);
    qdq(a, n);
    memset(b, 0x5A, sizeof b);
    pack(x, n, codes, scales);
    unpack(b, codes, scales, n);
    for (int i = 0; i < n; i++)
        if (f2u(a[i]) != f2u(b[i]) && !(isnan(a[i]) && isnan(b[i]))) return i;
    return -1;
}

/* Guards against a packed KV state that is not lossless: unpack(pack(x)) must equal the QDQ
 * operator's output bit for bit (the engine stores the packed form in reference numerics, and
 * its goldens must not move), on random groups over many scales, zeros of both signs, all-zero
 * groups, results in the fp32 / e4m3 subnormal range, values that saturate (448 for FP8, 6 for
 * FP4, the e4m3 scale's 448), midpoints (ties to even), and NaN / infinity groups. */
TEST(quant_pack_matches_qdq) {
    static const qdq_op qdq[3] = {qdq_fp8_e8m0, qdq_fp4_e8m0, qdq_fp4_e4m3};
    static const pack_op pack[3] = {qdq_fp8_e8m0_pack, qdq_fp4_e8m0_pack, qdq_fp4_e4m3_pack};
    static const unpack_op unpack[3] = {unpack_fp8_e8m0, unpack_fp4_e8m0, unpack_fp4_e4m3};
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.5f, 1e-3f};
    enum { N = 512 };
    float x[N];
    for (int op = 0; op < 3; op++) {
        const int G = op == 2 ? 16 : 32;
        for (int rep = 0; rep < 300; rep++) {
            for (int g = 0; g < N / G; g++) {
                float *v = x + g * G, amp = ldexpf(1.0f, (int)(rnd() % 200) - 140);
                for (int i = 0; i < G; i++) v[i] = ((float)(rnd() % 2001) / 1000.0f - 1.0f) * amp;
                switch (rnd() % 10) {
                case 0: memset(v, 0, (size_t)G * sizeof *v); break;
                case 1: for (int i = 0; i < G; i++) v[i] = (rnd() & 1) ? -0.0f : 0.0f; break;
                case 2: v[rnd() % G] = -0.0f; v[rnd() % G] = -1e-30f; break; /* rounds to -0 */
                case 3: v[rnd() % G] = (rnd() & 1) ? 3e38f : -3e38f; break;  /* saturation */
                case 4: /* midpoints of the element grid at the group's scale */
                    for (int i = 1; i < G; i++) v[i] = mids[rnd() % 9] * amp * ((rnd() & 1) ? 1.0f : -1.0f);
                    v[0] = 6.0f * amp;
                    break;
                case 5: for (int i = 0; i < G; i++) v[i] = u2f(rnd() % 0x00800000u) * ((rnd() & 1) ? 1.0f : -1.0f); break;
                case 6: if (rep % 8 == 0) v[rnd() % G] = NAN; break;
                case 7: if (rep % 8 == 1) v[rnd() % G] = (rnd() & 1) ? INFINITY : -INFINITY; break;
                default: break;
                }
            }
            const int d = pack_vs_qdq(x, N, qdq[op], pack[op], unpack[op]);
            /* what a QDQ stores for finite groups passes the snapshot check; NaN codes do not */
            for (int g = 0; g < N / G; g++) {
                int finite = 1;
                for (int i = 0; i < G; i++) finite &= isfinite(x[g * G + i]) != 0;
                if (!finite) continue;
                uint8_t c[32], sc[2];
                pack[op](x + g * G, G, c, sc);
                const bool ok = op == 0 ? packed_fp8_valid(c, sc, G) : op == 1 ? packed_fp4_valid(sc, G)
                                                                          : packed_fp4_e4m3_valid(sc, G);
                CHECKF(ok, "op %d: the pack of a finite group (scale byte %u) fails the validity check", op, sc[0]);
                if (!ok) return;
            }
            CHECKF(d < 0, "op %d rep %d: element %d (input %a) differs from the QDQ", op, rep, d, d < 0 ? 0.0 : (double)x[d]);
            if (d >= 0) return;
        }
    }
}

/* Guards the stored bytes against the spec's own figures (§11.3 vectors; §3.1 code layout):
 * the scales 2^-7 (E8M0 120), 1.0 (E8M0 127) and e4m3(0.28125) = 0x29, the codes of the first
 * outputs, the nibble order (element 2c low, 2c+1 high) and -0.0 kept as code 8. */
TEST(quant_pack_bytes) {
    float x[32];
    uint8_t c[32], sc[2];
    qdq_input(x, 32);
    qdq_fp8_e8m0_pack(x, 32, c, sc);
    CHECKF(sc[0] == 120, "fp8 scale byte %u (want 2^-7 -> 120)", sc[0]);
    /* out[0] = 0.1015625 = 13 * 2^-7: e4m3 13 = 1.625 * 2^3 -> exp 10, mantissa 5 -> 0x55;
     * out[1] = -0.203125 = -26 * 2^-7: 1.625 * 2^4 -> 0x80 | 11 << 3 | 5 = 0xDD */
    CHECKF(c[0] == 0x55 && c[1] == 0xDD, "fp8 codes %02x %02x", c[0], c[1]);
    qdq_input(x, 32);
    qdq_fp4_e8m0_pack(x, 32, c, sc);
    CHECKF(sc[0] == 127, "fp4 scale byte %u (want 1.0 -> 127)", sc[0]);
    /* out[0..3] = 0, -0 (x[1] = -0.2 rounds to -0), 0.5, -0.5: codes 0, 8, 1, 9 */
    CHECKF(c[0] == 0x80 && c[1] == 0x91, "fp4 nibbles %02x %02x", c[0], c[1]);
    qdq_input(x, 16);
    qdq_fp4_e4m3_pack(x, 16, c, sc);
    CHECKF(sc[0] == 0x29, "fp4/e4m3 scale byte %02x (want 0.28125 -> 0x29)", sc[0]);
    /* out[0..3] = 0.5, -0.5, 1, -1.5 times the scale: codes 1, 9, 2, 0xB */
    CHECKF(c[0] == 0x91 && c[1] == 0xB2, "fp4/e4m3 nibbles %02x %02x", c[0], c[1]);
    /* the validity checks refuse NaN codes and scales no QDQ stores */
    memset(c, 0x38, 32);
    sc[0] = 120;
    CHECK(packed_fp8_valid(c, sc, 32));
    c[5] = 0xFF;
    CHECK(!packed_fp8_valid(c, sc, 32));
    c[5] = 0x38, sc[0] = 255;
    CHECK(!packed_fp8_valid(c, sc, 32) && !packed_fp4_valid(sc, 32));
    sc[0] = 0x7F;
    CHECK(!packed_fp4_e4m3_valid(sc, 16));
    sc[0] = 0x80 | 0x29; /* a negative scale */
    CHECK(!packed_fp4_e4m3_valid(sc, 16));
}

/* ---------------------------------------------------------------- block types */

TEST(quant_type_table) {
    struct { uint32_t id, blck, size; const char *name; } tt[] = {
        {0, 1, 4, "F32"}, {1, 1, 2, "F16"}, {2, 32, 18, "Q4_0"}, {3, 32, 20, "Q4_1"},
        {6, 32, 22, "Q5_0"}, {7, 32, 24, "Q5_1"}, {8, 32, 34, "Q8_0"}, {10, 256, 84, "Q2_K"},
        {11, 256, 110, "Q3_K"}, {12, 256, 144, "Q4_K"}, {13, 256, 176, "Q5_K"}, {14, 256, 210, "Q6_K"},
        {15, 256, 292, "Q8_K"}, {16, 256, 66, "IQ2_XXS"}, {17, 256, 74, "IQ2_XS"}, {18, 256, 98, "IQ3_XXS"},
        {19, 256, 50, "IQ1_S"}, {20, 32, 18, "IQ4_NL"}, {21, 256, 110, "IQ3_S"}, {22, 256, 82, "IQ2_S"},
        {23, 256, 136, "IQ4_XS"}, {24, 1, 1, "I8"}, {25, 1, 2, "I16"}, {26, 1, 4, "I32"},
        {27, 1, 8, "I64"}, {28, 1, 8, "F64"}, {29, 256, 56, "IQ1_M"}, {30, 1, 2, "BF16"},
        {34, 256, 54, "TQ1_0"}, {35, 256, 66, "TQ2_0"}, {39, 32, 17, "MXFP4"}, {40, 64, 36, "NVFP4"},
        {41, 128, 18, "Q1_0"}, {42, 64, 18, "Q2_0"},
    };
    for (size_t i = 0; i < sizeof tt / sizeof tt[0]; i++) {
        CHECKF(ggml_blck_size(tt[i].id) == tt[i].blck && ggml_type_size(tt[i].id) == tt[i].size,
               "type %u: %u/%u", tt[i].id, ggml_blck_size(tt[i].id), ggml_type_size(tt[i].id));
        CHECKF(strcmp(ggml_type_name(tt[i].id), tt[i].name) == 0, "type %u named %s", tt[i].id,
               ggml_type_name(tt[i].id));
    }
    static const uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38, 43, 44, 1000, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++) {
        uint32_t id = retired[i];
        CHECKF(ggml_blck_size(id) == 0 && ggml_type_size(id) == 0 && !ggml_type_supported(id) &&
               strcmp(ggml_type_name(id), "?") == 0, "retired/unknown id %u", id);
    }
    /* dequant_row decodes every type of the table (ggml 0.25.1's, tests/unit/dequant.c checks them
     * against the fixtures). */
    for (size_t i = 0; i < sizeof tt / sizeof tt[0]; i++) CHECKF(ggml_type_supported(tt[i].id), "%u", tt[i].id);
}

static bool close_to(float got, double want) {
    /* quant.c evaluates in fp32 with one rounding per operation; the formulas here run in
     * double: allow 2 fp32 ulps of the magnitude of the result. */
    double tol = 2.5e-7 * fabs(want) + 1e-30;
    return fabs((double)got - want) <= tol;
}

/* Plain element types "as values". */
TEST(quant_dequant_plain) {
    float y[4];
    uint8_t b[32];
    float f[2] = {1.5f, -0.0f};
    memcpy(b, f, 8);
    dequant_row(GGML_TYPE_F32, b, y, 2);
    CHECK(y[0] == 1.5f && f2u(y[1]) == 0x80000000u);
    put16(b, 0x3C00); put16(b + 2, 0xC500); /* f16 1.0, -5.0 */
    dequant_row(GGML_TYPE_F16, b, y, 2);
    CHECK(y[0] == 1.0f && y[1] == -5.0f);
    put16(b, 0x3F80); put16(b + 2, 0xC0A0); /* bf16 1.0, -5.0 */
    dequant_row(GGML_TYPE_BF16, b, y, 2);
    CHECK(y[0] == 1.0f && y[1] == -5.0f);
    double d = -0.25;
    memcpy(b, &d, 8);
    dequant_row(GGML_TYPE_F64, b, y, 1);
    CHECK(y[0] == -0.25f);
    b[0] = 0x80; b[1] = 0x7F; b[2] = 0xFF;
    dequant_row(GGML_TYPE_I8, b, y, 3);
    CHECK(y[0] == -128 && y[1] == 127 && y[2] == -1);
    put16(b, 0x8000); put16(b + 2, 0x1234);
    dequant_row(GGML_TYPE_I16, b, y, 2);
    CHECK(y[0] == -32768 && y[1] == 4660);
    b[0] = 0xFE; b[1] = 0xFF; b[2] = 0xFF; b[3] = 0xFF; b[4] = 0x00; b[5] = 0x00; b[6] = 0x01; b[7] = 0x00;
    dequant_row(GGML_TYPE_I32, b, y, 2);
    CHECK(y[0] == -2 && y[1] == 65536);
    b[0] = 0xFF; b[1] = 0xFF; b[2] = 0xFF; b[3] = 0xFF; b[4] = 0xFF; b[5] = 0xFF; b[6] = 0xFF; b[7] = 0xFF;
    dequant_row(GGML_TYPE_I64, b, y, 1);
    CHECK(y[0] == -1.0f);
    /* unaligned source */
    put16(b + 1, 0x4000);
    dequant_row(GGML_TYPE_BF16, b + 1, y, 1);
    CHECK(y[0] == 2.0f);
}

/* Legacy 32-blocks: a hand-worked block, then random blocks against element-index formulas. */
TEST(quant_dequant_legacy) {
    uint8_t b[36];
    float y[32];
    /* Q8_0, d = 0.5 (f16 0x3800), qs[j] = j - 16: y[j] = (j-16)/2. */
    put16(b, 0x3800);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    dequant_row(GGML_TYPE_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) CHECKF(y[j] == (float)(j - 16) * 0.5f, "q8_0 %d", j);
    /* Q4_0, d = 2 (0x4000), qs[0] = 0x1F: y[0] = (15-8)*2 = 14, y[16] = (1-8)*2 = -14. */
    memset(b, 0, sizeof b);
    put16(b, 0x4000); b[2] = 0x1F;
    dequant_row(GGML_TYPE_Q4_0, b, y, 32);
    CHECK(y[0] == 14 && y[16] == -14 && y[1] == -16);
    /* Q4_1, d = 0.5, m = -1 (0xBC00), qs[3] = 0xA2: y[3] = 2*0.5-1 = 0, y[19] = 10*0.5-1 = 4. */
    memset(b, 0, sizeof b);
    put16(b, 0x3800); put16(b + 2, 0xBC00); b[4 + 3] = 0xA2;
    dequant_row(GGML_TYPE_Q4_1, b, y, 32);
    CHECK(y[3] == 0 && y[19] == 4 && y[0] == -1);
    /* Q5_0, d = 1, qh bit 1 and bit 17 set, qs[1] = 0x21: y[1] = (1|16)-16 = 1, y[17] = (2|16)-16 = 2,
     * y[0] = 0-16 = -16. */
    memset(b, 0, sizeof b);
    put16(b, 0x3C00); b[2] = 0x02; b[4] = 0x02; b[6 + 1] = 0x21;
    dequant_row(GGML_TYPE_Q5_0, b, y, 32);
    CHECK(y[1] == 1 && y[17] == 2 && y[0] == -16 && y[16] == -16);
    /* Q5_1, d = 1, m = 0.5, qh bit 31, qs[15] = 0xF0: y[31] = (15|16)+0.5 = 31.5, y[15] = 0.5. */
    memset(b, 0, sizeof b);
    put16(b, 0x3C00); put16(b + 2, 0x3800); b[7] = 0x80; b[8 + 15] = 0xF0;
    dequant_row(GGML_TYPE_Q5_1, b, y, 32);
    CHECK(y[31] == 31.5f && y[15] == 0.5f);

    /* Q8_1 {f16 d; f16 s; int8 qs[32]}: d = 0.25, s ignored; qs[5] = -8 -> -2. */
    memset(b, 0, sizeof b);
    put16(b, 0x3400); put16(b + 2, 0x7BFF); b[4 + 5] = (uint8_t)-8;
    dequant_row(GGML_TYPE_Q8_1, b, y, 32);
    CHECK(y[5] == -2.0f && y[0] == 0);
    /* Q8_K {f32 d; int8 qs[256]; int16 bsums[16]}: d = 3, qs[255] = 127 -> 381. */
    {
        uint8_t k8[292] = {0};
        float d3 = 3.0f, y8[256];
        memcpy(k8, &d3, 4);
        k8[4 + 255] = 127; k8[4 + 7] = 0x80;
        dequant_row(GGML_TYPE_Q8_K, k8, y8, 256);
        CHECK(y8[255] == 381.0f && y8[7] == -384.0f && y8[0] == 0);
    }

    for (int it = 0; it < 50; it++) {
        fill(b, sizeof b);
        put16(b, (uint16_t)(0x2000 + (rnd() & 0x1FFF)));     /* d: a finite f16 */
        put16(b + 2, (uint16_t)(0x2000 + (rnd() & 0x9FFF))); /* m: finite, either sign */
        double d = f16_to_f32((uint16_t)(b[0] | b[1] << 8)), m = f16_to_f32((uint16_t)(b[2] | b[3] << 8));
        uint32_t qh5_0 = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
        uint32_t qh5_1 = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
        for (int type = 0; type < 5; type++) {
            static const uint32_t ids[5] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                            GGML_TYPE_Q8_0};
            dequant_row(ids[type], b, y, 32);
            for (int i = 0; i < 32; i++) {
                int j = i & 15;
                double want;
                switch (type) {
                case 0: want = (((i < 16) ? b[2 + j] & 15 : b[2 + j] >> 4) - 8) * d; break;
                case 1: want = ((i < 16) ? b[4 + j] & 15 : b[4 + j] >> 4) * d + m; break;
                case 2: {
                    double dd = f16_to_f32((uint16_t)(b[0] | b[1] << 8));
                    int q = ((i < 16) ? b[6 + j] & 15 : b[6 + j] >> 4) + (int)((qh5_0 >> i) & 1) * 16;
                    want = (q - 16) * dd;
                    break;
                }
                case 3: {
                    int q = ((i < 16) ? b[8 + j] & 15 : b[8 + j] >> 4) + (int)((qh5_1 >> i) & 1) * 16;
                    want = q * d + m;
                    break;
                }
                default: want = (int8_t)b[2 + i] * d; break;
                }
                CHECKF(close_to(y[i], want), "type %u block %d elem %d: %g vs %g", ids[type], it, i, y[i], want);
            }
        }
    }
}

/* Q2_K..Q6_K: a hand-worked element per type, then random blocks against index formulas. */
static int q3k_scale(const uint8_t *s, int i) {
    /* ggml's formulation: three LE uint32 words, 4-bit and 2-bit fields moved by masks. */
    uint32_t a0 = (uint32_t)s[0] | s[1] << 8 | s[2] << 16 | (uint32_t)s[3] << 24;
    uint32_t a1 = (uint32_t)s[4] | s[5] << 8 | s[6] << 16 | (uint32_t)s[7] << 24;
    uint32_t t = (uint32_t)s[8] | s[9] << 8 | s[10] << 16 | (uint32_t)s[11] << 24;
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    uint32_t w[4];
    w[0] = (a0 & k2) | (((t >> 0) & k1) << 4);
    w[1] = (a1 & k2) | (((t >> 2) & k1) << 4);
    w[2] = ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4);
    w[3] = ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4);
    return (int)((w[i / 4] >> (8 * (i % 4))) & 0xFF) - 32;
}

static void k4_scale(const uint8_t *s, int j, int *sc, int *m) {
    /* gguf-layout §1.5 get_scale_min_k4, written out per case. */
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else { *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}

TEST(quant_dequant_kquants) {
    uint8_t b[292];
    float y[256];
    /* Q2_K hand block: d = 1, dmin = 0.5; scales[5] = 0x23 (sc 3, m 2) covers elements 80..95
     * (half 0, plane shift 4, second 16: qs[16..31]); qs[16+2] = 0x30 -> (0x30>>4)&3 = 3.
     * y[82] = 1*3*3 - 0.5*2 = 8. */
    memset(b, 0, 84);
    b[5] = 0x23; b[16 + 18] = 0x30; put16(b + 80, 0x3C00); put16(b + 82, 0x3800);
    dequant_row(GGML_TYPE_Q2_K, b, y, 256);
    CHECKF(y[82] == 8.0f && y[81] == -1.0f && y[0] == 0, "q2_k %g %g", y[82], y[81]);
    /* Q3_K hand block: d = 1; scale 0 = (scales[0] & 15) | ((scales[8] & 3) << 4) - 32 = 5 + 32 - 32
     * with scales[0] = 5, scales[8] = 2 -> 37 - 32 = 5; element 0: qs[0] & 3 = 2, hmask[0] bit 0
     * clear -> 2 - 4 = -2 -> y[0] = -10; element 1: hmask[1] bit 0 set, qs[1]&3 = 1 -> 5. */
    memset(b, 0, 110);
    b[96 + 0] = 5; b[96 + 8] = 2; b[32 + 0] = 2; b[32 + 1] = 1; b[1] = 1; put16(b + 108, 0x3C00);
    dequant_row(GGML_TYPE_Q3_K, b, y, 256);
    CHECKF(y[0] == -10.0f && y[1] == 5.0f, "q3_k %g %g", y[0], y[1]);
    /* Q4_K hand block: d = 2, dmin = 1; sub-block 5 (elements 160..191, high nibbles of
     * qs[64..95]): sc = (scales[9] & 15) | (scales[1] >> 6) << 4 = 3 | 1<<4 = 19,
     * m = (scales[9] >> 4) | (scales[5] >> 6) << 4 = 2 | 0 = 2. qs[64+7] = 0x90 -> q = 9:
     * y[167] = 2*19*9 - 1*2 = 340. */
    memset(b, 0, 144);
    put16(b, 0x4000); put16(b + 2, 0x3C00); b[4 + 9] = 0x23; b[4 + 1] = 0x40; b[16 + 71] = 0x90;
    dequant_row(GGML_TYPE_Q4_K, b, y, 256);
    CHECKF(y[167] == 340.0f && y[160] == -2.0f, "q4_k %g", y[167]);
    /* Q5_K: same scales, qh[7] bit 5 set -> q = 9 + 16 = 25: y[167] = 2*19*25 - 2 = 948. */
    memset(b, 0, 176);
    put16(b, 0x4000); put16(b + 2, 0x3C00); b[4 + 9] = 0x23; b[4 + 1] = 0x40; b[16 + 7] = 0x20;
    b[48 + 71] = 0x90;
    dequant_row(GGML_TYPE_Q5_K, b, y, 256);
    CHECKF(y[167] == 948.0f, "q5_k %g", y[167]);
    /* Q6_K: d = 0.5; element 128+64+3 = 195 (half 1, third quarter: high nibble of ql[64+3],
     * bits 4-5 of qh[32+3], scale scales[8 + 0 + 4]): ql = 0x70, qh = 0x20 -> q = 7 | 2<<4 = 39,
     * -32 = 7; scale = -3: y = 0.5*-3*7 = -10.5. */
    memset(b, 0, 210);
    b[64 + 3] = 0x70; b[128 + 32 + 3] = 0x20; b[192 + 12] = (uint8_t)-3; put16(b + 208, 0x3800);
    dequant_row(GGML_TYPE_Q6_K, b, y, 256);
    CHECKF(y[195] == -10.5f, "q6_k %g", y[195]);

    for (int it = 0; it < 20; it++) {
        fill(b, sizeof b);
        /* f16 d fields: finite, moderate (exponent field 8..23). */
        uint16_t dv = (uint16_t)(0x2000 + (rnd() & 0x3FFF)), mv = (uint16_t)(0x2000 + (rnd() & 0x3FFF));
        double d = f16_to_f32(dv), dmin = f16_to_f32(mv);

        put16(b + 80, dv); put16(b + 82, mv);
        dequant_row(GGML_TYPE_Q2_K, b, y, 256);
        for (int i = 0; i < 256; i++) {
            int h = i / 128, r = i % 128, p = r / 32, t2 = r % 32;
            int q = (b[16 + 32 * h + t2] >> (2 * p)) & 3, sc = b[i / 16];
            double want = d * (sc & 15) * q - dmin * (sc >> 4);
            CHECKF(close_to(y[i], want), "q2_k %d: %g vs %g", i, y[i], want);
        }

        put16(b + 108, dv);
        dequant_row(GGML_TYPE_Q3_K, b, y, 256);
        for (int i = 0; i < 256; i++) {
            int h = i / 128, r = i % 128, p = r / 32, t2 = r % 32;
            int q = (b[32 + 32 * h + t2] >> (2 * p)) & 3;
            int hb = (b[t2] >> (4 * h + p)) & 1;
            double want = d * q3k_scale(b + 96, i / 16) * (q - (hb ? 0 : 4));
            CHECKF(close_to(y[i], want), "q3_k %d: %g vs %g", i, y[i], want);
        }

        put16(b, dv); put16(b + 2, mv);
        dequant_row(GGML_TYPE_Q4_K, b, y, 256);
        for (int i = 0; i < 256; i++) {
            int sb = i / 32, sc, m;
            k4_scale(b + 4, sb, &sc, &m);
            uint8_t byte = b[16 + 32 * (i / 64) + i % 32];
            int q = (sb & 1) ? byte >> 4 : byte & 15;
            double want = d * sc * q - dmin * m;
            CHECKF(close_to(y[i], want), "q4_k %d: %g vs %g", i, y[i], want);
        }

        dequant_row(GGML_TYPE_Q5_K, b, y, 256);
        for (int i = 0; i < 256; i++) {
            int sb = i / 32, sc, m;
            k4_scale(b + 4, sb, &sc, &m);
            uint8_t byte = b[48 + 32 * (i / 64) + i % 32];
            int q = ((sb & 1) ? byte >> 4 : byte & 15) + 16 * ((b[16 + i % 32] >> sb) & 1);
            double want = d * sc * q - dmin * m;
            CHECKF(close_to(y[i], want), "q5_k %d: %g vs %g", i, y[i], want);
        }

        put16(b + 208, dv);
        dequant_row(GGML_TYPE_Q6_K, b, y, 256);
        for (int i = 0; i < 256; i++) {
            int h = i / 128, r = i % 128, quad = r / 32, l = r % 32;
            uint8_t lb = b[64 * h + l + 32 * (quad & 1)];
            int lo = quad < 2 ? lb & 15 : lb >> 4;
            int hi = (b[128 + 32 * h + l] >> (2 * quad)) & 3;
            int sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * quad];
            double want = d * sc * ((lo | hi << 4) - 32);
            CHECKF(close_to(y[i], want), "q6_k %d: %g vs %g", i, y[i], want);
        }
    }
}

/* MXFP4: hand block, the e = 0/1/255 corner cases, and random blocks vs the OCP definition. */
TEST(quant_dequant_mxfp4) {
    uint8_t b[17];
    float y[32];
    memset(b, 0, sizeof b);
    b[0] = 127;    /* kvalues * 2^-1: e2m1 values unchanged */
    b[1] = 0xF7;   /* elem 0 = code 7 (6.0), elem 16 = code 15 (-6.0) */
    b[16] = 0x19;  /* elem 15 = code 9 (-0.5), elem 31 = code 1 (0.5) */
    dequant_row(GGML_TYPE_MXFP4, b, y, 32);
    CHECK(y[0] == 6.0f && y[16] == -6.0f && y[15] == -0.5f && y[31] == 0.5f && y[1] == 0);
    b[0] = 0;
    dequant_row(GGML_TYPE_MXFP4, b, y, 32);
    CHECK(y[31] == 0x1p-128f && y[0] == 12 * 0x1p-128f); /* e = 0 -> 2^-128 */
    b[0] = 1;
    dequant_row(GGML_TYPE_MXFP4, b, y, 32);
    CHECK(y[31] == 0x1p-127f);
    b[0] = 255;
    dequant_row(GGML_TYPE_MXFP4, b, y, 32);
    CHECK(y[31] == 0x1p127f && y[0] == 12 * 0x1p127f); /* no NaN case */
    for (int it = 0; it < 100; it++) {
        fill(b, sizeof b);
        b[0] = (uint8_t)(100 + rnd() % 60);
        dequant_row(GGML_TYPE_MXFP4, b, y, 32);
        for (int i = 0; i < 32; i++) {
            uint8_t nib = i < 16 ? b[1 + i] & 15 : b[1 + i - 16] >> 4;
            double want = e2m1_to_f32(nib) * ldexp(1, b[0] - 127);
            CHECKF(y[i] == (float)want, "mxfp4 %d", i);
        }
    }
}

/* Guards the (2c, 2c+1) -> (j, j+16) re-pairing: after repack, dequant equals the checkpoint
 * definition e2m1(code(i)) * 2^(s - 127) for every element. */
TEST(quant_mxfp4_repack) {
    enum { N = 128 };
    uint8_t packed[N / 2], scales[N / 32], blocks[N / 32 * 17];
    float y[N];
    /* Hand row: element i has code i % 16, so byte c = (2c % 16) | ((2c+1) % 16) << 4. */
    for (int c = 0; c < N / 2; c++) packed[c] = (uint8_t)(((2 * c) & 15) | (((2 * c + 1) & 15) << 4));
    scales[0] = 127; scales[1] = 128; scales[2] = 120; scales[3] = 3;
    mxfp4_repack_row(packed, scales, N, blocks);
    CHECK(blocks[0] == 127 && blocks[17] == 128);
    /* block 0, qs[0] = code(0) | code(16) << 4 = 0 | 0 << 4; qs[1] = 1 | 1 << 4 = 0x11. */
    CHECK(blocks[1] == 0x00 && blocks[2] == 0x11 && blocks[16] == 0xFF);
    dequant_row(GGML_TYPE_MXFP4, blocks, y, N);
    for (int i = 0; i < N; i++) {
        uint8_t code = (uint8_t)((packed[i / 2] >> (4 * (i & 1))) & 15);
        double want = e2m1_to_f32(code) * ldexp(1, scales[i / 32] - 127);
        CHECKF(y[i] == (float)want, "elem %d: %g vs %g", i, y[i], want);
    }
    for (int it = 0; it < 20; it++) {
        fill(packed, sizeof packed);
        fill(scales, sizeof scales);
        for (int k = 0; k < N / 32; k++) scales[k] = (uint8_t)(3 + scales[k] % 244); /* valid range */
        mxfp4_repack_row(packed, scales, N, blocks);
        dequant_row(GGML_TYPE_MXFP4, blocks, y, N);
        for (int i = 0; i < N; i++) {
            uint8_t code = (uint8_t)((packed[i / 2] >> (4 * (i & 1))) & 15);
            double want = e2m1_to_f32(code) * ldexp(1, scales[i / 32] - 127);
            CHECKF(y[i] == (float)want, "random row elem %d", i);
        }
    }
}
