/* mxfp4r.h: the repacked MXFP4 layout (DSF_TYPE_MXFP4R): its definition, the repack from
 * MXFP4 rows, the view over repacked arrays, and a block read back in its ggml form.
 *
 * Owns: the layout and its byte arithmetic. The caller owns every buffer (mxfp4r_row_bytes
 * sizes them); nothing here allocates, does I/O or keeps state.
 * Must not: include anything outside src/kernels and src/base; choose tables (select.h).
 * Invariant: the repack changes the layout only, never a value: every block reads back
 * (mxfp4r_block) as the MXFP4 block it was made from, bit for bit. */
#ifndef DSF_MXFP4R_H
#define DSF_MXFP4R_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"

/* An internal weight type, never in a file: MXFP4 repacked at load (the engine, model/) so that the
 * AVX-512 decode needs no byte gather and sums each block in one dword lane. A row of
 * n_in = 32 nbk elements is ceil(nbk / 16) units of 16 blocks (the last one nu = nbk mod 16
 * blocks when that is not 0); its codes are 16 nbk bytes at data + r * row_bytes (row_bytes =
 * 16 nbk, the ggml row less its scale bytes): unit u starts at byte 256 u and is 4 lines of
 * 4 nu bytes, line h holding dword h (code bytes 4h .. 4h+3, gguf-layout §1.5) of each of
 * the unit's blocks, block 16u + j at 4j; except that two whole units 2p and 2p + 1 (both of
 * 16 blocks) interleave their lines in the pair's 512 bytes: line h of unit 2p + v at byte
 * 512 p + 128 h + 64 v, so that the decode tile, which takes the lines of such a pair in
 * turn, reads each row at rising addresses (mxfp4_avx512.c). Its scales are nbk bytes, the
 * E8M0 byte of block b at scales[r * nbk + b] (row_bytes / 16 per row). The values are those
 * of the MXFP4 rows it was made from, bit for bit; only the layout differs. */
#define DSF_TYPE_MXFP4R 0x10000u
/* Bytes a product reads per row (codes and scales for DSF_TYPE_MXFP4R). */
static inline uint64_t wmat_row_read_bytes(const dsf_wmat *w) {
    return w->type == DSF_TYPE_MXFP4R ? w->row_bytes + w->row_bytes / 16 : w->row_bytes;
}
static inline bool wmat_is_mxfp4(const dsf_wmat *w) { return w->type == GGML_TYPE_MXFP4 || w->type == DSF_TYPE_MXFP4R; }
/* MXFP4 -> DSF_TYPE_MXFP4R. mxfp4r_row_bytes: a repacked row's code bytes (16 nbk), or 0 if
 * the shape cannot be repacked (n_in not a multiple of 32). mxfp4r_repack converts rows
 * [r0, r1) of src (MXFP4) into codes/scales laid out for the whole matrix. */
uint64_t mxfp4r_row_bytes(int64_t n_in);
void mxfp4r_repack(const dsf_wmat *src, int64_t r0, int64_t r1, uint8_t *codes, uint8_t *scales);
/* The dsf_wmat over the repacked arrays of src (same shape). */
dsf_wmat mxfp4r_view(const dsf_wmat *src, const uint8_t *codes, const uint8_t *scales);
/* Block b of a repacked row of nbk blocks (its codes and scales) back in its ggml form: the scale byte,
 * then the 16 code bytes. */
void mxfp4r_block(const uint8_t *codes, const uint8_t *scales, int64_t nbk, int64_t b, uint8_t blk[17]);

#endif
