/* native_encode.c: the lossless encoders of `dsflash quantize ... native` (convert/quantize_native.c)
 * against values worked out by hand from architecture.md §3.1-3.2 (e4m3 (8+m) 2^(e-10), subnormal
 * m 2^-9; E8M0 2^(b-127)) and docs/FORMAT.md's block rule (the smallest S with
 * amax / 2^(S-127) <= 448), and the native type of each seed-layout tensor.
 *
 * Guards against: a scale one off (the largest value must land on 448, not 224), a block
 * measured over the wrong rows or columns (a partial last block), the sign of zero lost, a
 * value rounded to the nearest code instead of refused, and FP8 roles given to tensors the
 * checkpoint does not store as FP8 (or missed). */
#include "test.h"
#include "convert/quantize_model.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

TEST(native_encode_stripe) {
    enum { NE0 = 40 }; /* two column blocks, the second 8 wide */
    float x[2 * NE0] = {0};
    x[0] = 448.0f * 0x1p-10f;      /* the block's largest: S = 127 - 10 = 117, code 0x7E */
    x[1] = -1.5f * 0x1p-10f;       /* -1.5: 0xBC */
    x[NE0 + 5] = 0x1p-19f;         /* 2^-9 after the scale: subnormal code 0x01 */
    x[NE0 + 6] = -0.0f;            /* 0x80 */
    uint8_t q[2 * NE0], g[2];
    memset(q, 0xAA, sizeof q);
    CHECK(quantize_native_stripe(x, 2, NE0, q, g) == -1);
    CHECKF(g[0] == 117 && g[1] == 127, "grid %u %u (an all-zero block: 127)", g[0], g[1]);
    CHECK(q[0] == 0x7E && q[1] == 0xBC && q[NE0 + 5] == 0x01 && q[NE0 + 6] == 0x80 && q[2] == 0x00 && q[NE0 + 39] == 0x00);
    /* second block: 3 x 2^-12 is its largest -> S = 108 (3 x 2^7 = 384 = code 0x7C) */
    x[33] = 3.0f * 0x1p-12f;
    CHECK(quantize_native_stripe(x, 2, NE0, q, g) == -1);
    CHECKF(g[1] == 108 && q[33] == 0x7C, "grid %u code 0x%02X", g[1], q[33]);
    /* a value with more mantissa than e4m3 holds at that scale is refused, by index */
    x[NE0 + 34] = (1.0f + 0x1p-10f) * 0x1p-12f;
    CHECK(quantize_native_stripe(x, 2, NE0, q, g) == NE0 + 34);
    x[NE0 + 34] = INFINITY;
    CHECK(quantize_native_stripe(x, 2, NE0, q, g) >= 32);
}

TEST(native_encode_r264) {
    float x[512] = {0};
    x[0] = -448.0f;                               /* group 0: S = 127 */
    for (int i = 32; i < 64; i++) x[i] = 1.0f;    /* group 1: 1.0 -> S = 119 (1 / 2^-8 = 256, code 0x78) */
    x[256 + 200] = 0x1p-20f;                      /* block 1, group 6 (192..223): 2^-20 / 448 > 2^-29: S = 99, 2^8: 0x78 */
    uint8_t out[528];
    CHECK(quantize_native_r264(x, 512, out) == -1);
    CHECK(out[0] == 0xFE && out[256] == 127 && out[33] == 0x78 && out[257] == 119);
    CHECKF(out[264 + 200] == 0x78 && out[264 + 256 + 6] == 99, "0x%02X %u", out[264 + 200], out[264 + 256 + 6]);
    /* decoding gives the values back (dequant.c's FP8_R264 decoder) */
    float y[512];
    dequant_row(DSF_TYPE_FP8R264, out, y, 512);
    CHECK(!memcmp(x, y, sizeof x));
    x[100] = 0.1f; /* not a power-of-two multiple of an e4m3 value at group 3's scale */
    CHECK(quantize_native_r264(x, 512, out) == 100);
}

TEST(native_encode_types) {
    static const struct { const char *name; uint32_t n_dims, src; int64_t ne0; uint32_t want; } c[] = {
        {"blk.3.attn_q_a.weight", 2, GGML_TYPE_BF16, 4096, DSF_TYPE_FP8B32},
        {"blk.3.attn_q_b.weight", 2, GGML_TYPE_F32, 1024, DSF_TYPE_FP8B32},
        {"blk.3.indexer.attn_q_b.weight", 2, GGML_TYPE_BF16, 1024, DSF_TYPE_FP8B32},
        {"blk.3.attn_kv.weight", 2, GGML_TYPE_BF16, 4096, DSF_TYPE_FP8B32},
        {"blk.3.attn_output_a.weight", 2, GGML_TYPE_BF16, 4096, DSF_TYPE_FP8B32},
        {"blk.3.attn_output_a.weight", 3, GGML_TYPE_BF16, 4096, GGML_TYPE_BF16}, /* 3-D: no 2-D grid to keep */
        {"blk.3.attn_output_b.weight", 2, GGML_TYPE_Q8_0, 8192, DSF_TYPE_FP8B32},
        {"blk.1.engram_kv.weight", 2, GGML_TYPE_BF16, 6144, DSF_TYPE_FP8B32},
        {"blk.3.ffn_down_shexp.weight", 2, GGML_TYPE_BF16, 2048, DSF_TYPE_FP8B32},
        {"fc.weight", 2, GGML_TYPE_BF16, 15360, DSF_TYPE_FP8B32},
        {"per_layer_token_embd.weight", 2, GGML_TYPE_BF16, 256, DSF_TYPE_FP8R264},
        {"per_layer_token_embd.weight", 2, GGML_TYPE_BF16, 32, GGML_TYPE_BF16},
        /* BF16 in the checkpoint: stay as they are */
        {"blk.3.attn_compressor_kv.weight", 2, GGML_TYPE_BF16, 4096, GGML_TYPE_BF16},
        {"blk.3.indexer.attn_k.weight", 2, GGML_TYPE_BF16, 512, GGML_TYPE_BF16},
        {"blk.3.indexer.proj.weight", 2, GGML_TYPE_BF16, 4096, GGML_TYPE_BF16},
        {"token_embd.weight", 2, GGML_TYPE_BF16, 4096, GGML_TYPE_BF16},
        {"output.weight", 2, GGML_TYPE_BF16, 4096, GGML_TYPE_BF16},
        {"blk.3.ffn_gate_inp.weight", 2, GGML_TYPE_F32, 4096, GGML_TYPE_F32},
        {"blk.3.ffn_up_exps.weight", 3, GGML_TYPE_MXFP4, 4096, GGML_TYPE_MXFP4},
        {"blk.3.attn_q_a.weight", 2, DSF_TYPE_FP8B32, 4096, DSF_TYPE_FP8B32},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint32_t got = quantize_native_type(c[i].name, c[i].n_dims, c[i].src, c[i].ne0);
        CHECKF(got == c[i].want, "%s (%u-D %s): %s, expected %s", c[i].name, c[i].n_dims, ggml_type_name(c[i].src),
               ggml_type_name(got), ggml_type_name(c[i].want));
    }
}
