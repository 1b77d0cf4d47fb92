/* qfix.h: the ggml quantization fixtures of ../shared/testdata/quants (their README.md
 * describes every file) as the tests of the quantized-tensor reading use them: each type's id,
 * block size and bytes per block from TYPE.json, its blocks (TYPE.q, TYPE.rand.q) and ggml's
 * dequantization of them (TYPE.deq.f32, TYPE.rand.deq.f32).
 *
 * Must not: hold expected values of a test, or decode a block itself (the fixtures' .deq.f32
 * files are the expected values). */
#ifndef DSF_TEST_QFIX_H
#define DSF_TEST_QFIX_H

#include <stdbool.h>
#include <stdint.h>

#define QFIX_MAX_TYPES 40
#define QFIX_ROWS 6

typedef struct {
    char name[16];          /* "Q4_K": the files' prefix */
    uint32_t id, bs, ts;    /* ggml type id, values and bytes per block (TYPE.json) */
    uint8_t *q;             /* TYPE.q: rows 0..5 of inputs.f32, quantized by ggml */
    float *deq;             /* TYPE.deq.f32: ggml's dequantization of q */
    uint8_t *rq;            /* TYPE.rand.q: crafted blocks, one row of rn values */
    float *rdeq;            /* TYPE.rand.deq.f32 */
    int64_t rn;
    int64_t row_len[QFIX_ROWS]; /* values per row (index.json) */
    int64_t n_values;           /* in q / deq */
} qfix;

/* The fixture types in index.json's order (names written into names[i]); 0 if the fixtures
 * are missing. */
int qfix_types(char names[][16], int cap);
/* Loads one type's files; false (nothing to free) if any is missing or inconsistent. */
bool qfix_load(const char *name, qfix *f);
void qfix_free(qfix *f);
/* Bytes before row r in q, values before row r in deq. */
int64_t qfix_row_bytes_at(const qfix *f, int r);
int64_t qfix_row_values_at(const qfix *f, int r);

/* The weight-like rows 0, 4 and 5 (README: 0.02 g with outliers, drifting 0.05 g, Laplace
 * 0.01) as one cyclic run of blocks: block k's bytes and ggml's values of it, for k >= 0 any
 * (taken modulo the run's qfix_wblocks blocks). */
int64_t qfix_wblocks(const qfix *f);
const uint8_t *qfix_wblock(const qfix *f, int64_t k);
const float *qfix_wvalues(const qfix *f, int64_t k);

#endif
