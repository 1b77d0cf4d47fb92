/* amx_emu.h: the AMX tile instructions matmul_amx.c uses, emulated in C. matmul_amx.c includes
 * it when compiled with DSF_AMX_EMU (the Makefile's matmul_amx_emu.o, with the avx512 flags
 * only): the amx tables' code then runs, slowly, on any CPU with the avx512 table's features,
 * as the tables "amx-emu" and "amx-mxfp4-emu" (select.c; never chosen automatically). The
 * tests run them beside the real ones, so the tile layouts, panels, K chunks and batch
 * invariance of matmul_amx.c are checked on hosts without AMX too. Speed means nothing here.
 *
 * Semantics (Intel SDM: LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBF16PS; palette 1):
 * 8 tiles of at most 16 rows x 64 bytes, shaped by the last LDTILECFG; a load fills the
 * configured rows and columns and zeroes the rest of the tile. TDPBF16PS adds to each fp32
 * C[m][n], for each BF16 pair k of A's row m, A[m][2k] x B[k][2n] + A[m][2k+1] x B[k][2n+1],
 * with subnormal inputs taken as zero and subnormal results flushed to zero. The hardware's
 * order of additions within one instruction is not documented (matmul_amx.c); here each pair's
 * sum is rounded, then added to the accumulator in k order: one of the orders the kernel
 * contract allows, and like the hardware's it depends on nothing but the element's own inputs. */
#ifndef DSF_AMX_EMU_H
#define DSF_AMX_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} amx_emu_tiles;
static _Thread_local amx_emu_tiles amx_emu;

/* LDTILECFG: byte 0 the palette, bytes 16.. the bytes per row (16-bit), bytes 48.. the rows. */
static inline void amx_emu_loadconfig(const void *cfg) {
    const uint8_t *c = cfg;
    memset(&amx_emu, 0, sizeof amx_emu);
    for (int i = 0; i < 8; i++) {
        uint16_t cb;
        memcpy(&cb, c + 16 + 2 * i, 2);
        amx_emu.colsb[i] = cb > 64 ? 64 : cb;
        amx_emu.rows[i] = c[48 + i] > 16 ? 16 : c[48 + i];
    }
}

static inline void amx_emu_zero(int t) { memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]); }

static inline void amx_emu_loadd(int t, const void *base, long stride) {
    amx_emu_zero(t);
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy(amx_emu.t[t][r], (const uint8_t *)base + (long)r * stride, amx_emu.colsb[t]);
}

static inline void amx_emu_stored(int t, void *base, long stride) {
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy((uint8_t *)base + (long)r * stride, amx_emu.t[t][r], amx_emu.colsb[t]);
}

/* A BF16 value (2 bytes at p) as fp32, subnormals as zero. */
static inline float amx_emu_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (h & 0x7F80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void amx_emu_dpbf16ps(int c, int a, int b) {
    const int M = amx_emu.rows[c], N = amx_emu.colsb[c] / 4, K = amx_emu.colsb[a] / 4;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
            for (int k = 0; k < K; k++) {
                const float p0 = amx_emu_bf16(&amx_emu.t[a][m][4 * k]) * amx_emu_bf16(&amx_emu.t[b][k][4 * n]);
                const float p1 = amx_emu_bf16(&amx_emu.t[a][m][4 * k + 2]) * amx_emu_bf16(&amx_emu.t[b][k][4 * n + 2]);
                acc += p0 + p1;
                if (fabsf(acc) < 0x1p-126f) acc = 0.0f; /* results flushed to zero */
            }
            memcpy(&amx_emu.t[c][m][4 * n], &acc, 4);
        }
}

/* The intrinsics' names (macros or inline functions of <immintrin.h>) at matmul_amx.c's call
 * sites, and the suffix of the emulated tables' names. */
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#define _tile_loadconfig(c) amx_emu_loadconfig(c)
#define _tile_release() ((void)0)
#define _tile_zero(t) amx_emu_zero(t)
#define _tile_loadd(t, p, s) amx_emu_loadd((t), (p), (long)(s))
#define _tile_stored(t, p, s) amx_emu_stored((t), (p), (long)(s))
#define _tile_dpbf16ps(c, a, b) amx_emu_dpbf16ps((c), (a), (b))
#define AMX_TABLE_SUFFIX "-emu"

#endif
