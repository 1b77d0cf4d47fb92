/* imatrix.h: reader of llama.cpp's GGUF importance-matrix files (`llama-imatrix` output,
 * the format `dsflash quantize --imatrix` takes).
 *
 * The format: a GGUF with general.type = "imatrix"; for each matmul weight W it holds
 * "W.in_sum2" (F32, ne {n_in, n_mat}: the sum over the collected tokens of each input
 * column's squared activation, per matrix) and "W.counts" (F32, ne {1, n_mat}: how many
 * tokens reached each matrix). n_mat is 1 for a plain matrix and n_expert for a stacked
 * expert tensor. The importance of column i of matrix k is in_sum2[k][i] / counts[k].
 *
 * Owns: validating the file (type key, tensor pairs, their types and shapes) and computing
 * importance rows. Must not: know which weights a recipe quantizes (the quantizer asks).
 * Lifetime: entries point into the imatrix's mapping; valid until imatrix_close(). */
#ifndef DSF_IMATRIX_H
#define DSF_IMATRIX_H

#include <stdint.h>

typedef struct imatrix imatrix;

typedef struct {
    const char *weight;   /* the weight's name (NUL-terminated, owned by the imatrix) */
    int64_t n_in, n_mat;
    const float *sum2;    /* [n_mat][n_in], into the mapping */
    const float *counts;  /* [n_mat] */
} imatrix_entry;

/* Opens and validates path: general.type must be "imatrix"; every tensor is "W.in_sum2" or
 * "W.counts", each with its partner, both F32, shapes {n_in, n_mat} and {1, n_mat}. NULL
 * with a message naming the tensor on error. */
imatrix *imatrix_open(const char *path, char *err);
void imatrix_close(imatrix *m);
/* Number of weights the file covers. */
int64_t imatrix_count(const imatrix *m);

/* The entry of weight `weight`, checked against the weight's n_in columns and n_mat
 * matrices and for finite, non-negative values. Returns 0 (filled), 1 if the file has no
 * entry for it, or -1 with a message naming the weight and the mismatch. */
int imatrix_find(const imatrix *m, const char *weight, int64_t n_in, int64_t n_mat, imatrix_entry *e, char *err);

/* Importance of matrix k (0 <= k < n_mat) into out[n_in]: sum2[k][i] / counts[k]. Returns
 * 0, or 1 (out untouched) when counts[k] is 0: no token reached that matrix, so there is
 * no importance to give. */
int imatrix_row(const imatrix_entry *e, int64_t k, float *out);

#endif
