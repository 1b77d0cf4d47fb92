/* bench_vision.h: `dsflash bench --vision MMPROJ|synth` (tools/bench_vision.c): the vision
 * tower and aligner timed on one image of a real plan, in ms per image and GFLOP/s as a
 * fraction of the BF16 dot peak measured in the same run (cmd_bench.c's probe). */
#ifndef DSF_BENCH_VISION_H
#define DSF_BENCH_VISION_H

#include "kernels/matmul.h"
#include "base/threads.h"

/* The best of 3 BF16 dot-peak probes on pool, GFLOP/s (cmd_bench.c). */
double bench_bf16_peak(dsf_pool *pool, const dsf_kernels *k);

/* what: an mmproj GGUF, or "synth" for random BF16 weights of the release shapes built in
 * memory (32 blocks, width 1024, 16 heads, 2816, patch 14, merge 3, text width 5120). grid:
 * "WxH" patches (NULL: 108x81, the plan of a 4000x3000 photo under the default cap of 1024
 * tokens). plain: the fp32 tower instead of the reference bf16. Returns the exit status. */
int bench_vision(const char *what, const char *grid, int n_threads, int plain);

#endif
