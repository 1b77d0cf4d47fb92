/* quantize_native.c: `dsflash quantize IN OUT native` (quantize_model.h): which tensors of a
 * seed-layout GGUF go back to dsflash's native types (docs/FORMAT.md), and the lossless
 * encoders that recover the checkpoint's FP8 bytes from their BF16 (or F32) values.
 *
 * Owns: the native type rule by tensor name (the tensors the checkpoint stores as FP8 with a
 * 32x32 grid, gguf-layout.md §3.2; the Engram table), and the block rule: per block, the
 * smallest E8M0 exponent S with amax / 2^(S-127) <= 448, then every value / 2^(S-127) must be
 * an e4m3 value, decoded back bit for bit (the sign of zero included).
 * The bytes are the checkpoint's wherever its block's largest code is above 224: a block whose
 * largest value rounded down to code 224 holds the same values as S-1 with largest code 448, and
 * the values alone cannot tell which the checkpoint chose (tiny41 has both: 61 of its 880 FP8
 * blocks have largest code 224, 56 have 448, 52 of which would also be exact at S+1). The
 * values, so the logits, are the same either way (tests/tiny/native.c).
 * Must not: round anything (a value that does not decode back exactly is an error, never a
 * nearest code), read files or allocate (quantize_model.c streams and reports).
 * Invariant: decoding what the encoders write (wmat_dequant_row, dequant_row) gives the input
 * values bit for bit. */
#include "convert/quantize_model.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

static bool ends(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

uint32_t quantize_native_type(const char *name, uint32_t n_dims, uint32_t src_type, int64_t ne0) {
    /* gguf-layout.md §3.2: the FP8 + .scale weights of the checkpoint (main model and DSpark draft) */
    static const char *const fp8[] = {".attn_q_a.weight",      ".attn_q_b.weight", ".attn_kv.weight",
                                      ".attn_output_a.weight", ".attn_output_b.weight", ".engram_kv.weight",
                                      "_shexp.weight"};
    if (!ggml_type_supported(src_type)) return src_type; /* FP8_B32 already (or undecodable: copied) */
    if (!strcmp(name, "per_layer_token_embd.weight")) return ne0 % 256 == 0 ? DSF_TYPE_FP8R264 : src_type;
    if (n_dims != 2) return src_type;
    if (!strcmp(name, "fc.weight")) return DSF_TYPE_FP8B32;
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++)
        if (ends(name, fp8[i])) return DSF_TYPE_FP8B32;
    return src_type;
}

/* The block's exponent: the smallest S with amax <= 448 * 2^(S-127); 127 for an all-zero block
 * (any S decodes zeros). -1 if no E8M0 value (<= 254) is large enough. */
static int block_exponent(float amax) {
    if (amax == 0.0f) return 127;
    int e = ilogbf(amax) - 9; /* 448 < 2^9: 2^e * 448 < amax, so e is below the answer */
    while (amax > ldexpf(448.0f, e)) e++;
    int s = e + 127;
    return s < 0 ? 0 : s > 254 ? -1 : s;
}

/* Encodes x[0..n) with exponent s into q; -1, or the first i that does not decode back to
 * x[i] bit for bit. */
static int64_t encode_group(const float *x, int64_t n, int s, uint8_t *q) {
    const float sc = e8m0_to_f32((uint8_t)s);
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const uint8_t c = f32_to_e4m3(v / sc); /* exact when v is e4m3 x sc; the check decides */
        const float back = e4m3_to_f32(c) * sc;
        if (memcmp(&back, &v, sizeof v)) return i;
        q[i] = c;
    }
    return -1;
}

/* One block (rows of w values, ld apart) at exponent s: -1, or the first inexact value's index. */
static int64_t encode_block(const float *x, int64_t n, int64_t w, int64_t ld, int s, uint8_t *q) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t bad = encode_group(x + r * ld, w, s, q + r * ld);
        if (bad >= 0) return r * ld + bad;
    }
    return -1;
}

/* The block's exponent by the rule in the header (*s), and its codes in q; -1, or the index
 * (r * ld + i) of the first value that is not exact. */
static int64_t encode_rule(const float *x, int64_t n, int64_t w, int64_t ld, uint8_t *q, uint8_t *s) {
    float amax = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < w; i++) amax = fmaxf(amax, fabsf(x[r * ld + i]));
    if (!isfinite(amax)) return 0; /* an infinity (a NaN fails its own round trip below) */
    const int e = block_exponent(amax);
    if (e < 0) return 0;
    *s = (uint8_t)e;
    return encode_block(x, n, w, ld, e, q);
}

int64_t quantize_native_stripe(const float *x, int64_t n, int64_t ne0, uint8_t *q, uint8_t *grid) {
    for (int64_t c0 = 0; c0 < ne0; c0 += 32) {
        const int64_t bad = encode_rule(x + c0, n, ne0 - c0 < 32 ? ne0 - c0 : 32, ne0, q + c0, grid + c0 / 32);
        if (bad >= 0) return c0 + bad;
    }
    return -1;
}

int64_t quantize_native_r264(const float *x, int64_t ne0, uint8_t *out) {
    for (int64_t b = 0; b < ne0 / 256; b++, out += 264)
        for (int64_t j = 0; j < 8; j++) {
            const int64_t bad = encode_rule(x + b * 256 + j * 32, 1, 32, 32, out + j * 32, out + 256 + j);
            if (bad >= 0) return b * 256 + j * 32 + bad;
        }
    return -1;
}
