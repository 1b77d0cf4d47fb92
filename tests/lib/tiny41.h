/* tiny41.h: facts of ../shared/testdata/tiny41 (its README) that tests of more than one tier
 * check against. No TEST here. */
#ifndef DSF_TEST_TINY41_H
#define DSF_TEST_TINY41_H

#include <stdint.h>

/* The README's text prompt and its ids (BOS included), cross-checked there against
 * @huggingface/tokenizers. */
static const int32_t text_prompt_ids[26] = {0,   322, 842, 298, 827, 360, 618, 285, 408,
                                            14,  292, 272, 271, 71,  276, 724, 272, 264,
                                            360, 460, 269, 71,  903, 310, 440, 16};
static const char *const text_prompt =
    "The capital of France is Paris, and the weather there is quite warm today.";

#endif
