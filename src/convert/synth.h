/* synth.h: random-weight deepseek41 GGUF files in the exact layout of gguf-layout.md §2-§3
 * (`dsflash synth`). Presets:
 *   "tiny":  the topology of testdata/tiny41 (hidden 128, 8 layers, every layer role) with a
 *            usable byte-level BPE tokenizer (vocab 1024) for demos and server tests;
 *   "bench": every real per-layer shape and dtype of V4.1-Flash, 8 layers with every layer
 *            role, 32 routed experts, vocab 129280 (about 11 GB on disk) for benchmarks.
 * Weights are random, never constant, scaled so that activations stay O(1). The output is a
 * pure function of (preset, seed). */
#ifndef DSF_SYNTH_H
#define DSF_SYNTH_H

#include <stdint.h>

/* Writes the preset to path (streamed through the GGUF writer; tensor data is never held in
 * memory). Returns 0, or -1 with err (DSF_ERR_LEN) naming the problem. */
int synth_write(const char *preset, const char *path, uint64_t seed, char *err);
/* Bytes the file will have (approximately: tensor data only); 0 for an unknown preset. */
uint64_t synth_data_bytes(const char *preset);

#endif
