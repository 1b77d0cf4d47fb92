/* bench_constrain.h: `dsflash bench --constrain VOCAB.gguf` (tools/bench_constrain.c). */
#ifndef DSF_BENCH_CONSTRAIN_H
#define DSF_BENCH_CONSTRAIN_H

/* Prints the per-token cost of constrained decoding against the unconstrained sampler on the
 * vocabulary of a (vocab-only) GGUF; reps samples per figure. Returns the exit status. */
int bench_constrain(const char *vocab_path, int reps);

#endif
