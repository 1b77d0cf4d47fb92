/* matmul_ref.c: the scalar twins of every matmul kernel (matmul.h) and the ref table made of
 * them. Slow and obviously right: each weight row is dequantized to fp32 and dotted with the
 * activation row, accumulating in double so that the twin is at least as exact as any fast
 * kernel it checks.
 *
 * Must not: call select.c (a twin is what the dispatch falls back to). */
#include "kernels/matmul.h"
#include "kernels/mxfp4r.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <string.h>

void wmat_dequant_row(const dsf_wmat *w, int64_t r, float *out) {
    if (w->type == DSF_TYPE_FP8B32) { /* e4m3 x the row block's E8M0 (dtype.h): exact in fp32 */
        const uint8_t *q = w->data + (uint64_t)r * w->row_bytes;
        const uint8_t *sc = w->scales + (uint64_t)(r / 32) * (uint64_t)((w->n_in + 31) / 32);
        for (int64_t i = 0; i < w->n_in; i++) out[i] = e4m3_to_f32(q[i]) * e8m0_to_f32(sc[i / 32]);
        return;
    }
    if (w->type != DSF_TYPE_MXFP4R) {
        dequant_row(w->type, w->data + (uint64_t)r * w->row_bytes, out, w->n_in);
        return;
    }
    /* each block back in its ggml form: the scale byte, then its 16 code bytes */
    const uint8_t *c = w->data + (uint64_t)r * w->row_bytes, *sc = w->scales + (uint64_t)r * (w->row_bytes / 16);
    for (int64_t b = 0; b < w->n_in / 32; b++) {
        uint8_t blk[17];
        mxfp4r_block(c, sc, w->n_in / 32, b, blk);
        dequant_row(GGML_TYPE_MXFP4, blk, out + b * 32, 32);
    }
}

void matmul_any_ref(const dsf_wmat *w, const float *x, int64_t T, float *y, int64_t ldy,
                    int64_t r0, int64_t r1) {
    float row[16384];
    DSF_ASSERT(w->n_in <= 16384 || w->type == GGML_TYPE_F32);
    for (int64_t r = r0; r < r1; r++) {
        const float *wr;
        if (w->type == GGML_TYPE_F32) {
            wr = (const float *)(const void *)(w->data + (uint64_t)r * w->row_bytes);
        } else {
            wmat_dequant_row(w, r, row);
            wr = row;
        }
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * w->n_in;
            double acc = 0.0;
            for (int64_t i = 0; i < w->n_in; i++) acc += (double)wr[i] * (double)xt[i];
            y[t * ldy + r] = (float)acc;
        }
    }
}

void matmul_xbf16_any_ref(const dsf_wmat *w, const uint16_t *x, int64_t T, float *y, int64_t ldy,
                          int64_t r0, int64_t r1) {
    float row[16384];
    DSF_ASSERT(w->n_in <= 16384 || w->type == GGML_TYPE_F32);
    for (int64_t r = r0; r < r1; r++) {
        const float *wr;
        if (w->type == GGML_TYPE_F32) {
            wr = (const float *)(const void *)(w->data + (uint64_t)r * w->row_bytes);
        } else {
            wmat_dequant_row(w, r, row);
            wr = row;
        }
        for (int64_t t = 0; t < T; t++) {
            const uint16_t *xt = x + t * w->n_in;
            double acc = 0.0;
            for (int64_t i = 0; i < w->n_in; i++) acc += (double)wr[i] * (double)bf16_to_f32(xt[i]);
            y[t * ldy + r] = (float)acc;
        }
    }
}

void matmul_q8k_any_ref(const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y, int64_t ldy,
                        int64_t r0, int64_t r1) {
    float wr[16384];
    const int64_t nb = w->n_in / 256;
    DSF_ASSERT(w->n_in <= 16384 && w->n_in % 256 == 0);
    for (int64_t r = r0; r < r1; r++) {
        wmat_dequant_row(w, r, wr);
        for (int64_t t = 0; t < T; t++) {
            const dsf_q8k *xb = x + t * nb;
            double acc = 0.0;
            for (int64_t b = 0; b < nb; b++)
                for (int i = 0; i < 256; i++) acc += (double)wr[b * 256 + i] * ((double)xb[b].d * xb[b].qs[i]);
            y[t * ldy + r] = (float)acc;
        }
    }
}

static double read_probe_ref(const uint8_t *p, uint64_t n) {
    uint64_t acc[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; j++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * j, 8);
            acc[j] += v;
        }
    }
    return (double)(acc[0] ^ acc[1] ^ acc[2] ^ acc[3]);
}

static uint64_t peak_probe_ref(int64_t iters, int bf16, float *sink) {
    (void)bf16;
    float a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 8; j++) a[j] = a[j] * 0.999999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < 8; j++) s += a[j];
    *sink = s;
    return (uint64_t)iters * 16;
}

const dsf_kernels kernels_ref = {
    .name = "ref",
    .matmul = {0},
    .read_probe = read_probe_ref,
    .peak_probe = peak_probe_ref,
};

bool act_to_bf16_ref(const float *x, uint16_t *xb, int64_t n) {
    bool exact = true;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        /* round to nearest even; NaN stays a quiet NaN (quant.c's f32_to_bf16 rule) */
        uint16_t h = (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)((u >> 16) | 0x40)
                                                     : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
        xb[i] = h;
        exact &= (u & 0xFFFFu) == 0;
    }
    return exact;
}
