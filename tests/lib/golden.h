/* golden.h: the golden logits of the official reference code in
 * ../shared/testdata/tiny41/golden (read its README), loaded, and compared by the README's
 * metrics; shared by tests/tiny/golden.c (the library) and tests/e2e/golden.c (`dsflash
 * logits`). No TEST here. */
#ifndef DSF_TEST_GOLDEN_H
#define DSF_TEST_GOLDEN_H

#include <stdint.h>

#define GDIR "testdata/tiny41/golden/"

typedef struct {
    int32_t *tokens;
    int n, vocab;
    float *gold; /* [n][vocab] */
} golden;

/* Loads GDIR NAME.json (tokens, vocab) and NAME.f32 (the logits); -1 if either is absent or short. */
int golden_load(const char *name, golden *g);
void golden_free(golden *g);

typedef struct {
    double max_abs, mean_abs;
    int bad_rows, top1_miss;
} cmp_stats;

/* The README's metrics: per-row max |diff| against atol, mean |diff|, tie-aware top-1 (a
 * different argmax is a miss only if the golden logit of our pick is more than atol below
 * the golden maximum). */
cmp_stats golden_compare(const float *a, const float *gold, int rows, int V, double atol);

struct dsf_engine;
/* Runs tokens in a fresh session in chunks of `chunk` (0 = all at once) and returns their
 * [n][V] logits (malloc'd), or NULL with err. */
float *golden_run(struct dsf_engine *e, const int32_t *tok, int n, int chunk, char *err);

#endif
