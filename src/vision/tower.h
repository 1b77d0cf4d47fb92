/* vision/tower: the ViT (patch embedding, L pre-norm blocks with 2-D RoPE and bidirectional
 * attention over all patches, SwiGLU MLP, final RMSNorm) and the aligner (r x r channel-major
 * merge, W1, exact GELU, W2), vision.md §3-§4, and the image block in span order (§5).
 *
 * Owns: the tower's arithmetic in both numerics: plain = fp32 everywhere from the bf16-exact
 * patches and weights; bf16 = the official dtype flow (§11): every activation rounded to bf16
 * (products with fp32 accumulation, bias added before the one rounding; RMSNorm in fp32 then
 * bf16; RoPE in fp32 then bf16; softmax in fp32, its probabilities rounded to bf16 for the
 * value product; SiLU, the gate product, GELU and every residual add rounded to bf16).
 * Must not: read files or images (vision/mmproj, vision/prep do), keep state between calls.
 * Invariants: products go through the kernel tables (kernels/select.h) on the caller's pool;
 * every result is independent of the thread count and of how the work is split (the kernels
 * are batch-invariant, every other step is per row). Memory: vis_tower_bytes, allocated per
 * call and freed before returning; for the release shapes (D 1024, I 2816, 16 heads, text
 * width 5120) 556 MiB at N = 8,748 patches (a 4000x3000 photo under the default cap), with the
 * attention scores in blocks of 64 queries x N keys per thread (2.2 MB), never N x N. */
#ifndef DSF_VISION_TOWER_H
#define DSF_VISION_TOWER_H

#include <stdbool.h>
#include <stddef.h>

#include "vision/mmproj.h"
#include "kernels/matmul.h"
#include "base/threads.h"

/* The bytes vis_tower_run allocates for an image of n_vit_h x n_vit_w patches on n_threads
 * threads; 0 when that overflows. */
size_t vis_tower_bytes(const vis_hparams *hp, int n_vit_h, int n_vit_w, int n_threads);

/* Runs the tower and the aligner on patches [n_vit_h * n_vit_w][3 p^2] (vision.md §2.6
 * order). vit: NULL or [N][D], the output of the final RMSNorm; block: NULL or
 * [n_llm_h * (n_llm_w + 1) + 2][proj_dim], START, per LLM row its aligner rows then NEWLINE,
 * END. bf16: the reference numerics. k: the kernel table. -1 + err when the scratch cannot be
 * allocated or the grid is out of range (n_vit_h, n_vit_w >= 1, N < 2^20). */
int vis_tower_run(const vis_model *m, dsf_pool *pool, const dsf_kernels *k, bool bf16, const float *patches,
                  int n_vit_h, int n_vit_w, float *vit, float *block, char *err);

/* FLOPs of one image (products and attention, 2 per multiply-add), for the benchmark. */
double vis_tower_flops(const vis_hparams *hp, int n_vit_h, int n_vit_w);

#endif
