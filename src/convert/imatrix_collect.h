/* imatrix_collect.h: the collector of `dsflash imatrix`: it observes the products of an open
 * engine's forward passes and writes llama.cpp's GGUF importance-matrix format (the format
 * convert/imatrix.h reads and documents).
 *
 * What is collected: for every matmul weight W of the layers ("blk.N.*.weight": attention,
 * compressor, indexer, Engram projections, hc mixes, router, routed and shared experts),
 * in_sum2[k][i] = the sum over the activation rows that reached matrix k of W of the square
 * of column i, and counts[k] = the number of those rows. k is the expert of a stacked expert
 * tensor (n_mat = n_expert), the matrix of a 3-D tensor, else 0. The activation is the one the
 * product receives (model.h dsf_mm_observer): after reference numerics' FP8 QDQ when that mode
 * is on, the raw input in plain numerics. Rows are tokens, except idx_k (its input rows are the
 * compressed latents of the chunk) and a grouped attn_output_a of n_mat 1 (each group's
 * product adds its T rows to the one matrix: the groups share the columns). The LM head
 * (output.weight) is not collected: llama-imatrix leaves it out by default, and a prefill
 * computes it for the last token only.
 *
 * Owns: the map from the engine's weight views to GGUF names and matrix indices, built from
 * the engine's bound weights after open, so that repacked (DSF_TYPE_MXFP4R), resident and
 * widened copies map as the file mapping does; the accumulators; the writer.
 * Must not: run the model (the caller evaluates chunks), or change a value of the forward.
 * Invariant: at most one collector per engine; it is the engine's observer from
 * imatrix_collector_new until imatrix_collector_free. */
#ifndef DSF_IMATRIX_COLLECT_H
#define DSF_IMATRIX_COLLECT_H

#include <stdint.h>

#include "dsflash.h"

typedef struct imatrix_collector imatrix_collector;

/* Maps e's layer weights and installs the observer. NULL with a message on error (a weight
 * whose file tensor does not match its view). */
imatrix_collector *imatrix_collector_new(dsf_engine *e, char *err);
/* Removes the observer and frees the accumulators. */
void imatrix_collector_free(imatrix_collector *c);
/* Weights that received at least one activation row so far. */
int64_t imatrix_collector_count(const imatrix_collector *c);
/* Products whose weight the map does not hold (0 unless the forward multiplies a matrix that
 * is not a layer weight). */
int64_t imatrix_collector_unmapped(const imatrix_collector *c);

/* The metadata keys llama-imatrix writes: imatrix.datasets (an array of one string, written
 * only when dataset is not NULL), imatrix.chunk_count and imatrix.chunk_size (u32). */
typedef struct {
    const char *dataset;
    uint32_t chunk_count, chunk_size;
} imatrix_meta;

/* Writes the GGUF: general.type = "imatrix", the meta keys, and for each weight that received
 * rows "W.in_sum2" (F32 {n_in, n_mat}) and "W.counts" (F32 {1, n_mat}), in name order.
 * 0, or -1 with a message. */
int imatrix_collector_write(const imatrix_collector *c, const char *path, const imatrix_meta *m, char *err);

#endif
