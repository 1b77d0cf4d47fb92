/* fp8.c: the ISA-independent half of the FP8_B32 products (fp8.h): the scalar row decoder to
 * BF16 and the driver that runs a table's BF16 kernel over decoded rows.
 *
 * Must not: call select.c; pick a table (the registering ISA file hands over its kernels).
 * Invariant: a decoded row holds, element for element, the BF16 matrix's values (fp8.h), so the
 * BF16 kernel run on it gives the BF16 matrix's results bit for bit; rows are decoded whole, so
 * the kernel's own K chunks and sums are those of the BF16 matrix. */
#include "kernels/fp8.h"
#include "kernels/quant.h"

/* Scratch: whole BF16 rows, 256 KiB (L2-sized: the BF16 kernel reads it once per token chunk);
 * token chunks of FP8_TCH, the largest token chunk of the BF16 kernels (their activation chunk
 * then stays in L2 across the row groups). */
#define FP8_SCRATCH 131072
#define FP8_TCH 128

void fp8_block_bf16_ref(const uint8_t *q, uint8_t s, uint16_t *dst) {
    const float sc = e8m0_to_f32(s);
    for (int i = 0; i < 32; i++) dst[i] = f32_to_bf16(e4m3_to_f32(q[i]) * sc);
}

void fp8_row_bf16_ref(const uint8_t *q, const uint8_t *sc, int64_t ng, uint16_t *dst) {
    for (int64_t g = 0; g < ng; g++) fp8_block_bf16_ref(q + g * 32, sc[g], dst + g * 32);
}

void fp8_rows_bf16(const dsf_wmat *w, int64_t r, int64_t n, uint16_t *dst, fp8_row_fn dec) {
    const int64_t ng = w->n_in / 32;
    for (int64_t i = 0; i < n; i++)
        dec(w->data + (uint64_t)(r + i) * w->row_bytes, w->scales + (uint64_t)((r + i) / 32) * (uint64_t)ng, ng,
            dst + i * w->n_in);
}

void fp8b32_via_bf16(const dsf_wmat *w, const float *x, const uint16_t *xb, int64_t T, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, matmul_fn mm, matmul_xbf16_fn xmm, fp8_row_fn dec) {
    if (r1 <= r0 || T <= 0) return;
    if (w->n_in % 32 != 0 || w->n_in > FP8_SCRATCH) { /* as the BF16 kernels: the twin */
        if (x) matmul_any_ref(w, x, T, y, ldy, r0, r1);
        else matmul_xbf16_any_ref(w, xb, T, y, ldy, r0, r1);
        return;
    }
    _Alignas(64) uint16_t buf[FP8_SCRATCH];
    int64_t per = FP8_SCRATCH / w->n_in;
    if (per >= 8) per = per / 4 * 4; /* whole row tiles of the BF16 kernels */
    dsf_wmat b = {.type = GGML_TYPE_BF16, .n_in = w->n_in, .row_bytes = (uint64_t)w->n_in * 2, .data = (const uint8_t *)buf};
    for (int64_t tc = 0; tc < T; tc += FP8_TCH) {
        const int64_t nt = T - tc < FP8_TCH ? T - tc : FP8_TCH;
        for (int64_t r = r0; r < r1; r += per) {
            const int64_t n = r1 - r < per ? r1 - r : per;
            fp8_rows_bf16(w, r, n, buf, dec);
            b.n_out = n;
            if (x) mm(&b, x + tc * w->n_in, nt, y + tc * ldy + r, ldy, 0, n);
            else xmm(&b, xb + tc * w->n_in, nt, y + tc * ldy + r, ldy, 0, n);
        }
    }
}
