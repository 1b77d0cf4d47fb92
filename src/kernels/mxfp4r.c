/* mxfp4r.c: MXFP4 rows -> the repacked layout DSF_TYPE_MXFP4R (mxfp4r.h), the view over the
 * repacked arrays, and one repacked block back in its ggml form.
 *
 * Owns: byte moves only (no arithmetic on values), so the repacked rows hold the MXFP4 rows'
 * values bit for bit. Must not: allocate, do I/O, or know which matrices get repacked (the
 * engine decides). */
#include "kernels/mxfp4r.h"

#include <string.h>

uint64_t mxfp4r_row_bytes(int64_t n_in) { return n_in > 0 && n_in % 32 == 0 ? (uint64_t)n_in / 2 : 0; }

/* Byte offset of code bytes 4h .. 4h+3 of block b in a repacked row of nbk blocks (mxfp4r.h):
 * unit u = b / 16 is 4 lines of 4 nu bytes, nu = its blocks (16, or fewer in the last); the
 * two whole units of a pair (2p, 2p + 1) interleave their lines. */
static uint64_t mxfp4r_dword(int64_t nbk, int64_t b, int h) {
    const int64_t u = b / 16, nu = nbk - 16 * u < 16 ? nbk - 16 * u : 16, npair = nbk / 32;
    if (u < 2 * npair) return (uint64_t)(512 * (u / 2) + 128 * h + 64 * (u % 2) + 4 * (b % 16));
    return (uint64_t)(256 * u + 4 * nu * h + 4 * (b % 16));
}

void mxfp4r_repack(const dsf_wmat *src, int64_t r0, int64_t r1, uint8_t *codes, uint8_t *scales) {
    const int64_t nbk = src->n_in / 32;
    const uint64_t rb = mxfp4r_row_bytes(src->n_in);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *in = src->data + (uint64_t)r * src->row_bytes;
        uint8_t *c = codes + (uint64_t)r * rb, *sc = scales + (uint64_t)r * (uint64_t)nbk;
        for (int64_t b = 0; b < nbk; b++) {
            sc[b] = in[b * 17];
            for (int h = 0; h < 4; h++) memcpy(c + mxfp4r_dword(nbk, b, h), in + b * 17 + 1 + 4 * h, 4);
        }
    }
}

void mxfp4r_block(const uint8_t *codes, const uint8_t *scales, int64_t nbk, int64_t b, uint8_t blk[17]) {
    blk[0] = scales[b];
    for (int h = 0; h < 4; h++) memcpy(blk + 1 + 4 * h, codes + mxfp4r_dword(nbk, b, h), 4);
}

dsf_wmat mxfp4r_view(const dsf_wmat *src, const uint8_t *codes, const uint8_t *scales) {
    dsf_wmat m = *src;
    m.type = DSF_TYPE_MXFP4R;
    m.row_bytes = mxfp4r_row_bytes(src->n_in);
    m.data = codes;
    m.scales = scales;
    return m;
}
