/* vision/attn2d: the ViT's attention core (vision.md §3): q, k, v of every head from the qkv
 * rows, the 2-D rotate-half RoPE on q and k (rows on the first quarter of each half, columns on
 * the second), and softmax(q k^T / sqrt(d)) v over ALL N patches, bidirectional, no mask.
 *
 * Owns: the per-head layouts (q and k [H][N][d]; v transposed, [H][d][npad] with npad = N
 * rounded up to 32 and zero columns, so that the value product is a weight product of the
 * kernel table), the RoPE table, the per-thread score blocks, and the numerics of both modes
 * (tower.h). Must not: know the blocks around it or allocate inside vis_attn_run.
 * Memory: vis_attn_bytes; the scores are computed in blocks of VIS_ATT_QB queries x npad
 * keys per thread (fp32, plus their bf16 copy in bf16 mode), never as an N x N matrix.
 * Invariant: a row's result does not depend on the block it was computed in or the thread. */
#ifndef DSF_VISION_ATTN2D_H
#define DSF_VISION_ATTN2D_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vision/mmproj.h"
#include "kernels/matmul.h"
#include "base/threads.h"

#define VIS_ATT_QB 64

typedef struct {
    const vis_hparams *hp;
    bool bf16;
    int64_t N, npad, nh, nw;
    float qscale;            /* the scale folded into q (exact: a power of two), or 1 */
    float *cs, *sn;          /* [N][d/2] cos, sin of the patch's angles */
    float *q, *k, *vt;       /* plain: [H][N][d], [H][N][d], [H][d][npad] */
    uint16_t *qb, *kb, *vtb; /* bf16: the same layouts */
    float *S;                /* [threads][QB][npad] scores, then probabilities */
    uint16_t *Pb;            /* [threads][QB][npad] bf16 probabilities (bf16 mode) */
    float *O;                /* [threads][QB][d] one head's output block */
} vis_attn;

/* Bytes vis_attn_init allocates for N patches on n_threads threads (0 on overflow). */
uint64_t vis_attn_bytes(const vis_hparams *hp, uint64_t N, int n_threads);
/* 0, or -1 when out of memory (a is then safe to vis_attn_free). */
int vis_attn_init(vis_attn *a, const vis_hparams *hp, int n_vit_h, int n_vit_w, bool bf16, int n_threads);
void vis_attn_free(vis_attn *a);
/* out [N][D] = the attention of qkv [N][3D] (q | k | v, heads h*d .. h*d+d-1 in each),
 * concatenated over heads (rounded to bf16 in bf16 mode). */
void vis_attn_run(vis_attn *a, dsf_pool *pool, const dsf_kernels *k, const float *qkv, float *out);

#endif
