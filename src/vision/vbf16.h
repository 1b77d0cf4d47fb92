/* vision/vbf16: the tower's bf16 rounding (vision.md §11: every activation of the reference
 * numerics is rounded to bf16 after the operation that made it), inline for the per-element
 * loops, and the threaded fp32 -> bf16 copy that feeds the BF16-activation kernels.
 * Must not: hold state. Invariant: vis_bf16 rounds to nearest even, the rule of quant.h's
 * f32_to_bf16 (NaN stays NaN), so vis_bf16(x) == bf16_to_f32(f32_to_bf16(x)). */
#ifndef DSF_VISION_VBF16_H
#define DSF_VISION_VBF16_H

#include <stdint.h>
#include <string.h>

#include "base/threads.h"

static inline float vis_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* xb[i] = the bf16 bits of x[i] for i < n, threaded on pool (x is bf16-exact in the tower's
 * bf16 numerics, so the copy is exact). */
void vis_to_bf16(dsf_pool *pool, const float *x, uint16_t *xb, int64_t n);

#endif
