/* kernels.c: every fast matmul kernel against its scalar twin (matmul_any_ref, which
 * dequantizes with dequant.c and accumulates in double) on random data and edge sizes.
 *
 * Guards against: wrong block decoding (nibble order, e8m0 subnormal scales, f16 scales, the
 * K-quants' packed 6-bit sub-scales, 2-bit planes, high bits and the activation permutations
 * of their BF16-activation kernels),
 * dropped or repeated tails (n_in = 32/64/96/4128, n_out not a multiple of the row tile,
 * T not a multiple of the token tile, K chunk boundaries), writes outside [r0, r1) or past
 * the rows of y (NaN sentinels must survive), wrong ldy handling, dispatch that ignores
 * DSF_KERNELS or crashes on an unsupported one.
 *
 * Tolerance (fp32 summation, products exact by FMA): a fast kernel adds n_in/16 + log2 terms
 * per lane chain plus chunk adds, each with one rounding of at most 2^-24 relative, so
 * |y - y_ref| <= (n_in/16 + 64) * 2^-24 * sum_i |w_i x_i| + 1e-40 (the last term covers
 * subnormal absolute rounding when the scales are 2^-128). A decoding error is O(|w x|), many
 * orders above this. */
#include "test.h"
#include "io/gguf.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4r.h"
#include "kernels/select.h"
#include "kernels/quant.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return rng_s * 0x2545F4914F6CDD1Dull;
}
static float rnd_unit(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

/* K-quant (and Q4_1) blocks (random bytes: every code and sub-scale) get finite f16 d / dmin
 * of moderate size at their layout's offsets (gguf-layout §1.5), so that sums stay far from
 * overflow. */
static void kq_sane(uint32_t type, uint8_t *b) {
    int off[2] = {-1, -1};
    switch (type) {
    case GGML_TYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    case GGML_TYPE_Q3_K: off[0] = 108; break;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q4_1: off[0] = 0, off[1] = 2; break;
    case GGML_TYPE_Q6_K: off[0] = 208; break;
    default: return;
    }
    for (int k = 0; k < 2 && off[k] >= 0; k++) {
        uint16_t h = f32_to_f16(0.0005f + 0.01f * (rnd_unit() + 1.0f));
        memcpy(b + off[k], &h, 2);
    }
}

/* Fills a [n_out][n_in] matrix of the given type with random, never-constant content. */
static uint8_t *make_weights(uint32_t type, int64_t n_in, int64_t n_out, uint64_t *row_bytes) {
    uint64_t rb = (uint64_t)n_in / ggml_blck_size(type) * ggml_type_size(type);
    uint8_t *d = malloc(rb * (uint64_t)n_out + 64);
    for (int64_t r = 0; r < n_out; r++) {
        uint8_t *row = d + (uint64_t)r * rb;
        for (int64_t i = 0; i < n_in; i += (int64_t)ggml_blck_size(type)) {
            switch (type) {
            case GGML_TYPE_F32: {
                float v = rnd_unit();
                memcpy(row + i * 4, &v, 4);
                break;
            }
            case GGML_TYPE_BF16: {
                uint16_t h = f32_to_bf16(rnd_unit());
                memcpy(row + i * 2, &h, 2);
                break;
            }
            case GGML_TYPE_F16: {
                uint16_t h = f32_to_f16(rnd_unit());
                memcpy(row + i * 2, &h, 2);
                break;
            }
            case GGML_TYPE_Q8_0: {
                uint8_t *b = row + i / 32 * 34;
                uint16_t h = f32_to_f16(0.001f + 0.05f * (rnd_unit() + 1.0f));
                memcpy(b, &h, 2);
                for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)rnd(); /* -128..127, all codes */
                break;
            }
            case GGML_TYPE_MXFP4: {
                uint8_t *b = row + i / 32 * 17;
                /* mostly sane exponents around 2^0, plus the subnormal-scale edges e = 0, 1, 2 */
                static const uint8_t edge[] = {0, 1, 2, 3, 120, 127, 128, 135};
                uint64_t u = rnd();
                b[0] = (u & 7) == 0 ? edge[(u >> 3) & 7] : (uint8_t)(118 + (u >> 8) % 18);
                for (int j = 0; j < 16; j++) b[1 + j] = (uint8_t)rnd();
                break;
            }
            case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ4_XS: {
                /* random indices, signs and sub-scales (all values); a moderate finite f16 d first */
                uint8_t *b = row + i / 256 * ggml_type_size(type);
                for (uint32_t j = 2; j < ggml_type_size(type); j++) b[j] = (uint8_t)rnd();
                uint16_t h = f32_to_f16(0.001f + 0.05f * (rnd_unit() + 1.0f));
                memcpy(b, &h, 2);
                break;
            }
            case GGML_TYPE_IQ3_XXS:
            case GGML_TYPE_IQ3_S:
            case GGML_TYPE_IQ1_S:
            case GGML_TYPE_IQ1_M: {
                /* random grid indices, signs and sub-scales; a moderate f16 d (IQ1_M: in the
                 * top nibbles of its 4 scale words) */
                uint8_t *b = row + i / 256 * ggml_type_size(type);
                for (uint32_t j = 0; j < ggml_type_size(type); j++) b[j] = (uint8_t)rnd();
                uint16_t h = f32_to_f16(0.001f + 0.05f * (rnd_unit() + 1.0f));
                if (type != GGML_TYPE_IQ1_M) memcpy(b, &h, 2);
                else
                    for (int j = 0; j < 4; j++) b[49 + 2 * j] = (uint8_t)((b[49 + 2 * j] & 0x0F) | ((h >> (4 * j)) & 0xF) << 4);
                break;
            }
            default: {
                for (uint32_t j = 0; j < ggml_type_size(type); j++)
                    row[(uint64_t)i / ggml_blck_size(type) * ggml_type_size(type) + j] = (uint8_t)rnd();
                kq_sane(type, row + (uint64_t)i / ggml_blck_size(type) * ggml_type_size(type));
            }
            }
        }
    }
    *row_bytes = rb;
    return d;
}

/* sum_i |w_i x_i| for row r and token t (dequantized by the scalar codec) */
static double abs_dot(const dsf_wmat *w, const float *x, int64_t r, int64_t t) {
    float *row = malloc((size_t)w->n_in * sizeof *row);
    dequant_row(w->type, w->data + (uint64_t)r * w->row_bytes, row, w->n_in);
    double s = 0;
    for (int64_t i = 0; i < w->n_in; i++) s += fabs((double)row[i] * x[t * w->n_in + i]);
    free(row);
    return s;
}

/* Runs one case; returns 0 if it matches, else fails the test and returns -1. */
static int check_case(test_ctx *t, const dsf_kernels *k, uint32_t type, int64_t n_in, int64_t n_out,
                      int64_t T, int64_t r0, int64_t r1) {
    dsf_wmat w = {.type = type, .n_in = n_in, .n_out = n_out};
    uint8_t *data = make_weights(type, n_in, n_out, &w.row_bytes);
    w.data = data;
    float *x = malloc((size_t)(T * n_in) * sizeof *x);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = rnd_unit() * 2.0f;
    int64_t ldy = n_out + 3; /* ldy > n_out: the gap must stay untouched */
    float *y = malloc((size_t)(T * ldy) * sizeof *y), *yr = malloc((size_t)(T * ldy) * sizeof *yr);
    for (int64_t i = 0; i < T * ldy; i++) y[i] = yr[i] = NAN;
    kern_matmul(k, &w, x, T, y, ldy, r0, r1);
    matmul_any_ref(&w, x, T, yr, ldy, r0, r1);
    int rc = 0;
    for (int64_t tt = 0; tt < T && !rc; tt++) {
        for (int64_t r = 0; r < ldy && !rc; r++) {
            float a = y[tt * ldy + r], b = yr[tt * ldy + r];
            if (r < r0 || r >= r1) {
                if (!isnan(a)) {
                    test_fail(t, __FILE__, __LINE__, "%s %s n_in=%lld T=%lld: wrote y[%lld][%lld] outside rows [%lld,%lld)",
                              k->name, ggml_type_name(type), (long long)n_in, (long long)T, (long long)tt, (long long)r, (long long)r0, (long long)r1);
                    rc = -1;
                }
                continue;
            }
            double tol = ((double)n_in / 16 + 64) * 0x1p-24 * abs_dot(&w, x, r, tt) + 1e-40;
            if (!(fabs((double)a - (double)b) <= tol)) {
                test_fail(t, __FILE__, __LINE__, "%s %s n_in=%lld n_out=%lld T=%lld rows [%lld,%lld): y[%lld][%lld] = %.9g, ref %.9g (tol %.3g)",
                          k->name, ggml_type_name(type), (long long)n_in, (long long)n_out, (long long)T, (long long)r0, (long long)r1,
                          (long long)tt, (long long)r, a, b, tol);
                rc = -1;
            }
        }
    }
    free(data);
    free(x);
    free(y);
    free(yr);
    return rc;
}

static const uint32_t k_types[] = {GGML_TYPE_F32,    GGML_TYPE_BF16,   GGML_TYPE_F16,     GGML_TYPE_Q8_0,
                                   GGML_TYPE_MXFP4,  GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,    GGML_TYPE_Q4_K,
                                   GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K,   GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
                                   GGML_TYPE_IQ2_S,  GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M};

/* A row length for a test's n_in: types of 256-weight super-blocks get 8 n_in for the short rows
 * (32, 64, 96 -> 256, 512, 768: one to three super-blocks) and the long ones rounded up to whole
 * super-blocks (2048 + 96 -> 2304, 4096 + 32 -> 4352: whole K chunks, then a partial one). */
static int64_t n_in_for(uint32_t type, int64_t n_in) {
    if (ggml_blck_size(type) != 256) return n_in;
    return n_in < 256 ? n_in * 8 : (n_in + 255) / 256 * 256;
}

static void run_table(test_ctx *t, const char *name) {
    const dsf_kernels *k = kernels_by_name(name);
    if (!k) SKIP("this CPU cannot run the %s kernels", name);
    CHECK(!strcmp(k->name, name));
    static const int64_t n_ins[] = {32, 64, 96, 4096 + 32};
    static const int64_t Ts[] = {1, 2, 3, 7, 17};
    for (unsigned a = 0; a < sizeof k_types / sizeof *k_types; a++) {
        CHECKF(k->matmul[k_types[a]] != NULL, "%s has no %s kernel", name, ggml_type_name(k_types[a]));
        for (unsigned b = 0; b < sizeof n_ins / sizeof *n_ins; b++)
            for (unsigned c = 0; c < sizeof Ts / sizeof *Ts; c++) {
                int64_t n_in = n_in_for(k_types[a], n_ins[b]), T = Ts[c];
                int64_t n_out = n_in > 1000 ? 7 : 13; /* not a multiple of the 4-row tile */
                if (check_case(t, k, k_types[a], n_in, n_out, T, 0, n_out)) return;
                if (check_case(t, k, k_types[a], n_in, n_out, T, 1, n_out - 1)) return; /* unaligned */
                if (check_case(t, k, k_types[a], n_in, n_out, T, 2, 3)) return;         /* one row */
            }
    }
    /* a prefill-sized case crossing the token chunk (64) and K chunk (1024) boundaries */
    if (check_case(t, k, GGML_TYPE_MXFP4, 2048 + 96, 9, 67, 0, 9)) return;
    if (check_case(t, k, GGML_TYPE_BF16, 1024 + 32, 5, 130, 1, 5)) return;
}

TEST(kernels_avx512_vs_ref) { run_table(t, "avx512"); }
TEST(kernels_avx2_vs_ref) { run_table(t, "avx2"); }
TEST(kernels_amx_vs_ref) { run_table(t, "amx"); }
TEST(kernels_amx_mxfp4_vs_ref) { run_table(t, "amx-mxfp4"); }
/* the amx code on emulated tiles (amx_emu.h): checked on hosts without AMX too */
TEST(kernels_amx_emu_vs_ref) { run_table(t, "amx-emu"); }
TEST(kernels_amx_mxfp4_emu_vs_ref) { run_table(t, "amx-mxfp4-emu"); }

TEST(kernels_mxfp4_extreme_scales) {
    /* e = 255 decodes to 2^127 (gguf-layout §1.5, not NaN); e = 0 to 2^-128. Codes limited to
     * {0, +-1} so that every product stays finite with x ~ 2^-100. Expected values are exact. */
    uint8_t blk[2 * 17];
    blk[0] = 255;
    blk[17] = 0;
    for (int j = 0; j < 16; j++) {
        blk[1 + j] = (uint8_t)(j % 3 == 0 ? 0x91 : j % 3 == 1 ? 0x19 : 0x00); /* codes 1 / 9 (-1) */
        blk[18 + j] = blk[1 + j];
    }
    dsf_wmat w = {.type = GGML_TYPE_MXFP4, .n_in = 32, .n_out = 2, .row_bytes = 17, .data = blk};
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = ldexpf(1.0f + (float)i / 32.0f, -100);
    /* kvalues: code 1 -> 1, code 9 -> -1; value = kv * 2^(e-128) */
    double want[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        int j = i % 16, hi = i >= 16;
        uint8_t code = hi ? (uint8_t)(blk[1 + j] >> 4) : (uint8_t)(blk[1 + j] & 15);
        double kv = code == 1 ? 1 : code == 9 ? -1 : 0;
        want[0] += kv * ldexp(1, 127) * x[i];
        want[1] += kv * ldexp(1, -128) * x[i];
    }
    const char *names[] = {"ref", "avx2", "avx512", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};
    for (int n = 0; n < 7; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        float y[2] = {NAN, NAN};
        kern_matmul(k, &w, x, 1, y, 2, 0, 2);
        /* row 0: |sum| ~ 2^27 in fp32: relative 1e-6; row 1 ~ 2^-228 underflows to 0 in fp32
         * (the min subnormal is 2^-149), so only "finite and tiny" can be asked */
        CHECKF(fabs(y[0] - want[0]) <= 1e-6 * fabs(want[0]) + 1, "%s: e=255 row %.9g vs %.9g", names[n], y[0], want[0]);
        CHECKF(isfinite(y[1]) && fabsf(y[1]) < 1e-37f, "%s: e=0 row %.9g", names[n], y[1]);
        /* the BF16-activation kernels (x is exact in BF16) take these blocks on their exact
         * path, for decode (T = 1) and prefill (T = 2: the same token twice) */
        uint16_t xb[64];
        kern_act_to_bf16(x, xb, 32);
        memcpy(xb + 32, xb, 32 * sizeof *xb);
        for (int T = 1; T <= 2; T++) {
            float yt[4] = {NAN, NAN, NAN, NAN};
            kern_matmul_xbf16(k, &w, xb, T, yt, 2, 0, 2);
            for (int tt = 0; tt < T; tt++) {
                CHECKF(fabs(yt[2 * tt] - want[0]) <= 1e-6 * fabs(want[0]) + 1, "%s xbf16 T=%d: e=255 row %.9g vs %.9g",
                       names[n], T, yt[2 * tt], want[0]);
                CHECKF(isfinite(yt[2 * tt + 1]) && fabsf(yt[2 * tt + 1]) < 1e-37f, "%s xbf16 T=%d: e=0 row %.9g", names[n], T,
                       yt[2 * tt + 1]);
            }
        }
    }
}

/* An e = 255 block inside full groups of 4 blocks (the AVX-512 BF16-activation decode detects
 * it only through the row's non-finite result there) and an e = 0 block (a subnormal scale),
 * among ordinary blocks, in rows not a multiple of the row tile, for T = 1 and T = 3. The
 * expected sums are computed here in double from the bytes (value = kv * 2^(e-128)). */
TEST(kernels_mxfp4_extreme_scale_in_full_group) {
    static const double kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    enum { NI = 256, NO = 5, NB = NI / 32 };
    uint8_t wb[NO * NB * 17];
    for (int r = 0; r < NO; r++)
        for (int b = 0; b < NB; b++) {
            uint8_t *p = wb + (r * NB + b) * 17;
            int big = r == 1 && b == 5, tiny = r == 3 && b == 1;
            p[0] = big ? 255 : tiny ? 0 : (uint8_t)(120 + rnd() % 10);
            for (int j = 0; j < 16; j++) /* the e = 255 block: codes 0 / +-1 keep it below FLT_MAX */
                p[1 + j] = big ? (uint8_t)(j % 3 == 0 ? 0x91 : j % 3 == 1 ? 0x19 : 0x00) : (uint8_t)rnd();
        }
    dsf_wmat w = {.type = GGML_TYPE_MXFP4, .n_in = NI, .n_out = NO, .row_bytes = NB * 17, .data = wb};
    float x[3 * NI];
    uint16_t xb[3 * NI];
    for (int i = 0; i < 3 * NI; i++) x[i] = ldexpf(1.0f + (float)(i % 97) / 128.0f, -100);
    kern_act_to_bf16(x, xb, 3 * NI);
    for (int i = 0; i < 3 * NI; i++) x[i] = bf16_to_f32(xb[i]);
    double want[3][NO], mag[3][NO];
    for (int tt = 0; tt < 3; tt++)
        for (int r = 0; r < NO; r++) {
            want[tt][r] = mag[tt][r] = 0;
            for (int i = 0; i < NI; i++) {
                const uint8_t *p = wb + (r * NB + i / 32) * 17;
                int j = i % 32, code = j < 16 ? p[1 + j] & 15 : p[1 + j - 16] >> 4;
                double v = kv[code] * ldexp(1.0, p[0] - 128) * x[tt * NI + i];
                want[tt][r] += v;
                mag[tt][r] += fabs(v);
            }
        }
    const char *names[] = {"ref", "avx2", "avx512", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};
    for (int n = 0; n < 7; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        for (int fam = 0; fam < 2; fam++)
            for (int T = 1; T <= 3; T += 2) {
                float y[3 * NO];
                for (int i = 0; i < 3 * NO; i++) y[i] = NAN;
                if (fam) kern_matmul_xbf16(k, &w, xb, T, y, NO, 0, NO);
                else kern_matmul(k, &w, x, T, y, NO, 0, NO);
                for (int tt = 0; tt < T; tt++)
                    for (int r = 0; r < NO; r++)
                        CHECKF(fabs(y[tt * NO + r] - want[tt][r]) <= 1e-5 * mag[tt][r] + 1e-37,
                               "%s %s T=%d: y[%d][%d] = %.9g, want %.9g", names[n], fam ? "xbf16" : "fp32", T, tt, r,
                               y[tt * NO + r], want[tt][r]);
            }
    }
}

TEST(kernels_dispatch_env) {
    /* DSF_KERNELS=ref must force the twins (bisecting relies on it) */
    setenv("DSF_KERNELS", "ref", 1);
    CHECK(!strcmp(kernels_get()->name, "ref"));
}

TEST(kernels_dispatch_bad_name) {
    /* an unknown name must not crash or pick nothing: it falls back to the automatic choice */
    setenv("DSF_KERNELS", "sse9", 1);
    setenv("DSF_LOG", "0", 1);
    const dsf_kernels *k = kernels_get();
    CHECK(k != NULL);
    const dsf_kernels *best = kernels_by_name("amx")      ? kernels_by_name("amx")
                              : kernels_by_name("avx512") ? kernels_by_name("avx512")
                              : kernels_by_name("avx2")   ? kernels_by_name("avx2")
                                                          : &kernels_ref;
    CHECK(k == best);
    CHECK(kernels_by_name("sse9") == NULL);
}

TEST(kernels_fallback_untabled_type) {
    /* a type without a fast kernel (Q4_1) goes to the generic twin, never crashes */
    const dsf_kernels *k = kernels_get();
    if (check_case(t, k, GGML_TYPE_Q4_1, 512, 5, 3, 0, 5)) return;
    /* and odd row lengths of plain types go to the twin too */
    if (check_case(t, k, GGML_TYPE_F32, 40, 5, 2, 0, 5)) return;
}

/* BF16-activation kernels against their twin. x is rounded to BF16 first (kern_act_to_bf16),
 * as reference mode's FP8-QDQ'd activations are exact in BF16. Same tolerance as above: the
 * products are exact and only fp32 summation order differs (subnormal flushing cannot matter:
 * weights and activations here are normal, and the AVX-512 MXFP4 kernel scales each block's fp32
 * sum by 2^(e-127) for e = 1 .. 254, exact unless the result is subnormal, which the 1e-40
 * term covers; e = 0 and 255 take the exact path). */
static int check_xbf16(test_ctx *t, const dsf_kernels *k, uint32_t type, int64_t n_in, int64_t n_out, int64_t T,
                       int64_t r0, int64_t r1) {
    dsf_wmat w = {.type = type, .n_in = n_in, .n_out = n_out};
    uint8_t *data = make_weights(type, n_in, n_out, &w.row_bytes);
    w.data = data;
    float *x = malloc((size_t)(T * n_in) * sizeof *x);
    uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = rnd_unit() * 2.0f;
    kern_act_to_bf16(x, xb, T * n_in);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = bf16_to_f32(xb[i]);
    int64_t ldy = n_out + 1;
    float *y = malloc((size_t)(T * ldy) * sizeof *y), *yr = malloc((size_t)(T * ldy) * sizeof *yr);
    for (int64_t i = 0; i < T * ldy; i++) y[i] = yr[i] = NAN;
    kern_matmul_xbf16(k, &w, xb, T, y, ldy, r0, r1);
    matmul_xbf16_any_ref(&w, xb, T, yr, ldy, r0, r1);
    int rc = 0;
    for (int64_t tt = 0; tt < T && !rc; tt++)
        for (int64_t r = 0; r < ldy && !rc; r++) {
            float a = y[tt * ldy + r], b = yr[tt * ldy + r];
            if (r < r0 || r >= r1) {
                if (!isnan(a)) { test_fail(t, __FILE__, __LINE__, "xbf16 wrote outside rows"); rc = -1; }
                continue;
            }
            double tol = ((double)n_in / 16 + 64) * 0x1p-24 * abs_dot(&w, x, r, tt) + 1e-37;
            if (!(fabs((double)a - (double)b) <= tol)) {
                test_fail(t, __FILE__, __LINE__, "%s xbf16 %s n_in=%lld T=%lld rows [%lld,%lld): y[%lld][%lld] = %.9g, ref %.9g (tol %.3g)",
                          k->name, ggml_type_name(type), (long long)n_in, (long long)T, (long long)r0, (long long)r1,
                          (long long)tt, (long long)r, a, b, tol);
                rc = -1;
            }
        }
    free(data);
    free(x);
    free(xb);
    free(y);
    free(yr);
    return rc;
}

TEST(kernels_xbf16_vs_ref) {
    static const char *names[] = {"avx512", "avx2", "ref", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};
    static const uint32_t types[] = {GGML_TYPE_BF16,   GGML_TYPE_MXFP4,   GGML_TYPE_F32,    GGML_TYPE_F16,
                                     GGML_TYPE_Q8_0,   GGML_TYPE_Q2_K,    GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,
                                     GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K,    GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
                                     GGML_TYPE_IQ2_S,  GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M};
    static const int64_t n_ins[] = {32, 96, 2048 + 96};
    static const int64_t Ts[] = {1, 2, 3, 7, 9, 17, 70, 133}; /* 133: two token chunks of XTC, MXTC (128) */
    for (int n = 0; n < 7; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        for (unsigned a = 0; a < sizeof types / sizeof *types; a++)
            for (unsigned b = 0; b < 3; b++)
                for (unsigned c = 0; c < sizeof Ts / sizeof *Ts; c++) {
                    if (n_ins[b] > 1000 && Ts[c] > 17) continue; /* keep the test fast */
                    const int64_t n_in = n_in_for(types[a], n_ins[b]);
                    if (check_xbf16(t, k, types[a], n_in, 11, Ts[c], 0, 11)) return;
                    if (check_xbf16(t, k, types[a], n_in, 11, Ts[c], 3, 10)) return;
                }
    }
}

TEST(kernels_act_to_bf16) {
    /* exactness flag and round-to-nearest-even (values from the BF16 definition, §1.5) */
    /* BF16 ulp at 1 is 2^-7: 1 + 2^-8 and 1 + 3*2^-8 are ties (to even), 1 + 2^-8 + 2^-16 is above */
    float x[5] = {1.0f, -2.5f, 0x1.01p0f, 0x1.03p0f, 0x1.0101p0f};
    uint16_t h[5];
    CHECK(kern_act_to_bf16(x, h, 2));
    CHECK(h[0] == 0x3F80 && h[1] == 0xC020);
    CHECK(!kern_act_to_bf16(x, h, 5));
    CHECK(h[2] == 0x3F80);
    CHECK(h[3] == 0x3F82);
    CHECK(h[4] == 0x3F81);
}

/* Batch invariance: within a kernel family, y[t][r] must not depend on T, on the token's
 * place in the batch or on the row range (reference mode's QDQ turns any last-bit difference
 * between prefill and token-by-token decode into rounding flips that cascade; STYLE.md asks
 * decode, chunked prefill and one prefill to agree). Checked bit for bit. */
/* The amx table's tiles are 16 rows x 16 tokens (two of each per step) with K chunks of 16
 * blocks, so it also runs a shape with whole and partial tiles of both (batch_shape 1). */
static void batch_invariant(test_ctx *t, const char *name, int shape) {
    static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4,
                                     GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                     GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ4_XS,
                                     GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M};
    /* shape 0: two K chunks plus a partial one; shape 1: 3 row tiles + 2 rows, 2 token tiles + 8;
     * shape 2 (the super-block types only): a prefill crossing the K chunks (1024, 2048) and the
     * token chunks (64, 128) of the super-block kernels */
    const int64_t n_in0 = shape == 2 ? 4096 + 256 : shape ? 1024 + 96 : 4096 + 2048 + 96;
    const int64_t n_out = shape == 1 ? 50 : 11, T = shape == 2 ? 133 : shape ? 40 : 9;
    const int64_t cut[4] = {0, shape == 1 ? 5 : 3, shape == 1 ? 37 : 10, n_out}, first = shape == 1 ? 17 : 5;
    {
        const dsf_kernels *k = kernels_by_name(name);
        if (!k) return;
        for (unsigned a = 0; a < sizeof types / sizeof *types; a++) {
            const int sb = ggml_blck_size(types[a]) == 256; /* n_in: whole super-blocks */
            if (shape == 2 && !sb) continue;
            const int64_t n_in = sb ? n_in0 / 256 * 256 + 256 * (n_in0 % 256 != 0) : n_in0;
            dsf_wmat w = {.type = types[a], .n_in = n_in, .n_out = n_out};
            uint8_t *data = make_weights(types[a], n_in, n_out, &w.row_bytes);
            w.data = data;
            float *x = malloc((size_t)(T * n_in) * sizeof *x);
            uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
            for (int64_t i = 0; i < T * n_in; i++) x[i] = rnd_unit();
            kern_act_to_bf16(x, xb, T * n_in);
            float yb[133 * 11 > 40 * 50 ? 133 * 11 : 40 * 50], y1[50], yc[sizeof yb / sizeof *yb];
            const size_t ny = (size_t)(T * n_out) * sizeof *yb;
            for (int fam = 0; fam < 2; fam++) {
                if (fam == 0) kern_matmul(k, &w, x, T, yb, n_out, 0, n_out);
                else kern_matmul_xbf16(k, &w, xb, T, yb, n_out, 0, n_out);
                /* chunked prefill: first + the rest of the tokens */
                if (fam == 0) {
                    kern_matmul(k, &w, x, first, yc, n_out, 0, n_out);
                    kern_matmul(k, &w, x + first * n_in, T - first, yc + first * n_out, n_out, 0, n_out);
                } else {
                    kern_matmul_xbf16(k, &w, xb, first, yc, n_out, 0, n_out);
                    kern_matmul_xbf16(k, &w, xb + first * n_in, T - first, yc + first * n_out, n_out, 0, n_out);
                }
                CHECKF(!memcmp(yb, yc, ny), "%s %s %s: chunked prefill differs from one prefill", name,
                       fam ? "xbf16" : "fp32", ggml_type_name(types[a]));
                for (int64_t tt = 0; tt < T; tt++) {
                    /* token by token, rows split unevenly at cut[] */
                    for (int c = 0; c < 3; c++) {
                        if (fam == 0) kern_matmul(k, &w, x + tt * n_in, 1, y1, n_out, cut[c], cut[c + 1]);
                        else kern_matmul_xbf16(k, &w, xb + tt * n_in, 1, y1, n_out, cut[c], cut[c + 1]);
                    }
                    CHECKF(!memcmp(y1, yb + tt * n_out, (size_t)n_out * sizeof *y1),
                           "%s %s %s: token %lld decoded alone differs from the batch", name, fam ? "xbf16" : "fp32",
                           ggml_type_name(types[a]), (long long)tt);
                }
            }
            free(data);
            free(x);
            free(xb);
        }
    }
}

TEST(kernels_batch_invariant) {
    batch_invariant(t, "avx512", 0);
    batch_invariant(t, "avx2", 0);
    batch_invariant(t, "amx", 0);
    batch_invariant(t, "amx", 1);
    batch_invariant(t, "amx-mxfp4", 0);
    batch_invariant(t, "amx-mxfp4", 1);
    batch_invariant(t, "amx-emu", 0);
    batch_invariant(t, "amx-emu", 1);
    batch_invariant(t, "amx-mxfp4-emu", 0);
    batch_invariant(t, "amx-mxfp4-emu", 1);
    batch_invariant(t, "avx512", 1);
    batch_invariant(t, "avx512", 2);
    batch_invariant(t, "avx2", 2);
}

/* DSF_TYPE_MXFP4R (the experts repacked at load) against the MXFP4 rows it was made from.
 * The repacked kernel runs the same operations on the same values, so its results must be
 * the same bits as the MXFP4 kernel's, for decode and prefill token counts, short units
 * (n_in = 32, 64, 96, 160: one; 512 + 96, 512 + 384, 2304: whole units, then a short one), the
 * decode tile's pairs of whole units (1024 + 256: a pair, then 8 blocks; 1536 + 96: a pair, a
 * unit alone, a short one), K chunk
 * boundaries (2048 + 96, 2048 + 512), row ranges and the exceptional scales (e = 0 and
 * e = 255); the twins (both activation families) must also agree bit for
 * bit, and the row dequantizer must give the same floats. Guards against a wrong scale lane,
 * a wrong code layout (a row's short last unit), and a scale row offset that is off. */
static int check_repacked(test_ctx *t, int64_t n_in, int64_t n_out, int64_t T, int64_t r0, int64_t r1, int extreme) {
    dsf_wmat w = {.type = GGML_TYPE_MXFP4, .n_in = n_in, .n_out = n_out};
    uint8_t *data = make_weights(GGML_TYPE_MXFP4, n_in, n_out, &w.row_bytes);
    w.data = data;
    const int64_t nbk = n_in / 32;
    if (extreme) /* an e = 255 block with codes 0 / +-1 in the middle row, e = 0 in the last */
        for (int64_t b = 0; b < nbk; b += 3) {
            uint8_t *p = data + (uint64_t)(n_out / 2) * w.row_bytes + b * 17;
            p[0] = 255;
            for (int j = 0; j < 16; j++) p[1 + j] = (uint8_t)(j % 3 == 0 ? 0x91 : j % 3 == 1 ? 0x19 : 0x00);
            data[(uint64_t)(n_out - 1) * w.row_bytes + b * 17] = 0;
        }
    const uint64_t rb = mxfp4r_row_bytes(n_in);
    uint8_t *codes = aligned_alloc(64, (rb * (uint64_t)n_out + 63) / 64 * 64), *scales = malloc(rb / 16 * (uint64_t)n_out);
    memset(codes, 0xAA, rb * (uint64_t)n_out); /* every byte must be written */
    memset(scales, 0xAA, rb / 16 * (uint64_t)n_out);
    mxfp4r_repack(&w, 0, n_out, codes, scales);
    dsf_wmat wr = mxfp4r_view(&w, codes, scales);
    float *x = malloc((size_t)(T * n_in) * sizeof *x);
    uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = extreme ? ldexpf(1.0f + rnd_unit(), -100) : rnd_unit() * 2.0f;
    kern_act_to_bf16(x, xb, T * n_in);
    for (int64_t i = 0; i < T * n_in; i++) x[i] = bf16_to_f32(xb[i]);
    const int64_t ldy = n_out + 1;
    const size_t ny = (size_t)(T * ldy);
    float *ya = malloc(ny * sizeof *ya), *yb = malloc(ny * sizeof *yb);
    float *ra = malloc((size_t)n_in * sizeof *ra), *rb_ = malloc((size_t)n_in * sizeof *rb_);
    int rc = 0;
    for (int64_t r = 0; r < n_out && !rc; r++) {
        wmat_dequant_row(&w, r, ra);
        wmat_dequant_row(&wr, r, rb_);
        if (memcmp(ra, rb_, (size_t)n_in * sizeof *ra)) rc = -1;
    }
    if (rc) test_fail(t, __FILE__, __LINE__, "mxfp4r n_in=%lld: repacked rows differ", (long long)n_in);
    const char *names[] = {"avx512", "avx2", "ref", "amx", "amx-mxfp4", "amx-emu", "amx-mxfp4-emu"};
    for (int n = 0; n < 7 && !rc; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k) continue;
        for (int fam = 0; fam < 2 && !rc; fam++) {
            for (size_t i = 0; i < ny; i++) ya[i] = yb[i] = NAN;
            if (fam) {
                kern_matmul_xbf16(k, &w, xb, T, ya, ldy, r0, r1);
                kern_matmul_xbf16(k, &wr, xb, T, yb, ldy, r0, r1);
            } else {
                kern_matmul(k, &w, x, T, ya, ldy, r0, r1);
                kern_matmul(k, &wr, x, T, yb, ldy, r0, r1);
            }
            /* the fp32 family, and tables without a repacked kernel, run repacked weights
             * through the twin: compare with the twin on the MXFP4 rows */
            if (!fam) matmul_any_ref(&w, x, T, ya, ldy, r0, r1);
            else if (!k->mxfp4r_xbf16) matmul_xbf16_any_ref(&w, xb, T, ya, ldy, r0, r1);
            for (int64_t tt = 0; tt < T && !rc; tt++)
                for (int64_t r = 0; r < ldy && !rc; r++) {
                    float a = ya[tt * ldy + r], b = yb[tt * ldy + r];
                    bool same = r < r0 || r >= r1 ? isnan(b) : !memcmp(&a, &b, sizeof a);
                    if (!same) {
                        test_fail(t, __FILE__, __LINE__, "%s %s mxfp4r n_in=%lld T=%lld rows [%lld,%lld)%s: y[%lld][%lld] = %.9g, mxfp4 %.9g",
                                  names[n], fam ? "xbf16" : "fp32", (long long)n_in, (long long)T, (long long)r0,
                                  (long long)r1, extreme ? " extreme" : "", (long long)tt, (long long)r, b, a);
                        rc = -1;
                    }
                }
        }
    }
    free(data);
    free(codes);
    free(scales);
    free(x);
    free(xb);
    free(ya);
    free(yb);
    free(ra);
    free(rb_);
    return rc;
}

TEST(kernels_mxfp4r_same_bits) {
    static const int64_t n_ins[] = {32, 64, 96, 160, 512 + 96, 512 + 384, 1024 + 256, 1536 + 96, 2048 + 96, 2048 + 512, 2304};
    static const int64_t Ts[] = {1, 2, 3, 7, 9, 33};
    for (unsigned a = 0; a < sizeof n_ins / sizeof *n_ins; a++)
        for (unsigned c = 0; c < sizeof Ts / sizeof *Ts; c++)
            for (int ex = 0; ex < 2; ex++) {
                if (check_repacked(t, n_ins[a], 11, Ts[c], 0, 11, ex)) return;
                if (check_repacked(t, n_ins[a], 11, Ts[c], 3, 10, ex)) return;
            }
    CHECK(mxfp4r_row_bytes(5120) == 40 * 64 && mxfp4r_row_bytes(2304) == 18 * 64 && mxfp4r_row_bytes(48) == 0);
}

/* The AVX-512 MXFP4 prefill tile runs over weights prescaled to BF16 (W x 2^(e-127)) when
 * the scales and the activations' exponents keep every partial sum of both forms normal and
 * finite (xmm_mx); it must then give the bits of the T = 1 tile, which scales each block's
 * sum by one FMA. Scales e and activation exponents f are drawn around the bounds of that
 * rule (fmin + emin >= 136 with 2 <= e <= 135, fmax <= 237), the activation exponents in a
 * narrow range so that sums often cancel down to the smallest steps; checked bit for bit,
 * one prefill against token by token and a chunked prefill, MXFP4 and repacked rows, row
 * ranges that start and end inside a 4-row tile. Guards against a bound that lets a subnormal
 * or an overflow into the prescaled sums, a wrong exponent shift, a zero code that does not
 * stay zero, and a tile's 4-float stores into y (tile_put4x4) at a wrong place. */
static int check_prescaled(test_ctx *t, const dsf_kernels *k, int elo, int ehi, int flo, int fhi, int64_t r0, int64_t r1) {
    const int64_t n_in = 4096 + 2048 + 96, n_out = 11, T = 9, ldy = 13;
    dsf_wmat w = {.type = GGML_TYPE_MXFP4, .n_in = n_in, .n_out = n_out};
    w.row_bytes = (uint64_t)n_in / 32 * 17;
    uint8_t *data = malloc(w.row_bytes * (uint64_t)n_out);
    for (uint64_t b = 0; b < w.row_bytes / 17 * (uint64_t)n_out; b++) {
        data[b * 17] = (uint8_t)(elo + (int)(rnd() % (uint64_t)(ehi - elo + 1)));
        for (int j = 0; j < 16; j++) data[b * 17 + 1 + j] = (uint8_t)rnd();
    }
    w.data = data;
    const uint64_t rb = mxfp4r_row_bytes(n_in);
    uint8_t *codes = aligned_alloc(64, (rb * (uint64_t)n_out + 63) / 64 * 64), *scales = malloc(rb / 16 * (uint64_t)n_out);
    mxfp4r_repack(&w, 0, n_out, codes, scales);
    dsf_wmat wr = mxfp4r_view(&w, codes, scales);
    uint16_t *xb = malloc((size_t)(T * n_in) * sizeof *xb);
    for (int64_t i = 0; i < T * n_in; i++) {
        uint64_t u = rnd();
        int f = flo + (int)((u >> 8) % (uint64_t)(fhi - flo + 1));
        xb[i] = (u & 7) == 0 ? 0 : (uint16_t)((u & 8) << 12 | f << 7 | (u >> 32 & 0x7F));
    }
    /* rows [r0, r1) of y with ldy > n_out: everything else must keep its NaN sentinel */
    float yb[9 * 13], yc[9 * 13], y1[13];
    int rc = 0;
    for (int v = 0; v < 2 && !rc; v++) {
        const dsf_wmat *m = v ? &wr : &w;
        for (int i = 0; i < 9 * 13; i++) yb[i] = yc[i] = NAN;
        kern_matmul_xbf16(k, m, xb, T, yb, ldy, r0, r1);
        kern_matmul_xbf16(k, m, xb, 5, yc, ldy, r0, r1);
        kern_matmul_xbf16(k, m, xb + 5 * n_in, 4, yc + 5 * ldy, ldy, r0, r1);
        if (memcmp(yb, yc, sizeof yb)) rc = -1;
        for (int64_t tt = 0; tt < T && !rc; tt++) {
            for (int i = 0; i < 13; i++) y1[i] = NAN;
            kern_matmul_xbf16(k, m, xb + tt * n_in, 1, y1, ldy, r0, r1);
            for (int64_t r = 0; r < ldy && !rc; r++)
                if (memcmp(&y1[r], &yb[tt * ldy + r], sizeof y1[r]) || ((r < r0 || r >= r1) && !isnan(y1[r]))) {
                    test_fail(t, __FILE__, __LINE__, "%s e [%d, %d] f [%d, %d] rows [%lld, %lld): y[%lld][%lld] = %a in the batch, %a alone",
                              v ? "mxfp4r" : "mxfp4", elo, ehi, flo, fhi, (long long)r0, (long long)r1, (long long)tt,
                              (long long)r, (double)yb[tt * ldy + r], (double)y1[r]);
                    rc = -1;
                }
        }
        if (rc && !t->failed) test_fail(t, __FILE__, __LINE__, "%s e [%d, %d] f [%d, %d]: chunked prefill differs",
                                        v ? "mxfp4r" : "mxfp4", elo, ehi, flo, fhi);
    }
    free(data);
    free(codes);
    free(scales);
    free(xb);
    return rc;
}

TEST(kernels_mxfp4_prescaled_bits) {
    const dsf_kernels *k = kernels_by_name("avx512");
    if (!k) {
        test_skip(t, "no AVX-512 table on this CPU");
        return;
    }
    static const int cases[][4] = {
        {118, 135, 100, 130}, /* typical: prescaled everywhere */
        {6, 8, 130, 131},     /* fmin + emin = 136: partial sums down to 2^-126 */
        {2, 3, 134, 135},     /* e = 2, the smallest prescaled scale */
        {4, 6, 130, 131},     /* fmin + emin = 134, 135: refused (sums down to 2^-128) */
        {5, 7, 130, 131},
        {3, 12, 127, 134},    /* mixed: some tiles refused */
        {0, 3, 128, 140},     /* refused (subnormal scales) */
        {128, 135, 226, 237}, /* fmax = 237 with e = 135: the overflow bound */
        {126, 135, 230, 242}, /* refused (fmax > 237) */
        {126, 135, 238, 243}, /* refused: prescaled, some lanes would sum +inf and -inf */
        {136, 140, 100, 120}, /* refused (e > 135) */
    };
    for (unsigned c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int rep = 0; rep < 3; rep++)
            if (check_prescaled(t, k, cases[c][0], cases[c][1], cases[c][2], cases[c][3], rep == 1 ? 3 : 0,
                                rep == 2 ? 10 : 11))
                return;
}

/* The fast activation rounding against its twin, bit for bit, with the exactness flag: random
 * bit patterns (NaNs, infinities, subnormals, ties included), exact values, all tail lengths,
 * and no write past n (sentinels). */
TEST(kernels_act_to_bf16_vs_twin) {
    const char *names[] = {"avx512", "avx2", "ref"};
    enum { N = 600 };
    float x[N];
    uint16_t a[N + 8], b[N + 8];
    for (int n = 0; n < 3; n++) {
        const dsf_kernels *k = kernels_by_name(names[n]);
        if (!k || !k->act_to_bf16) continue;
        for (int round = 0; round < 40; round++) {
            for (int i = 0; i < N; i++) {
                uint32_t u = (uint32_t)rnd();
                int kind = (int)(rnd() % 8);
                if (kind == 0) u &= 0x807FFFFFu;                       /* subnormal or zero */
                else if (kind == 1) u = (u & 0xFFFF0000u) | 0x8000u;   /* a tie */
                else if (kind == 2) u |= 0x7F800000u;                  /* inf or NaN */
                else if (kind == 3 || round % 2) u &= 0xFFFF0000u;     /* exact in BF16 */
                memcpy(&x[i], &u, 4);
            }
            int len = round < 20 ? round * 3 + 1 : N - (int)(rnd() % 40);
            memset(a, 0x5A, sizeof a);
            memset(b, 0x5A, sizeof b);
            bool ea = k->act_to_bf16(x, a, len), eb = act_to_bf16_ref(x, b, len);
            int d = 0;
            while (d < N + 8 && a[d] == b[d]) d++;
            CHECKF(ea == eb && d == N + 8, "%s: len %d, exact %d vs %d, first difference at %d", names[n], len, ea, eb, d);
        }
    }
}
