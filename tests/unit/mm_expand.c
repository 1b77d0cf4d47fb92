/* mm_expand.c: placeholder expansion of image prompts (dsf_mm_expand, src/runtime/media.c)
 * against vision.md §5's layout, written out by hand here: [START] ([IMAGE] x w [NEWLINE]) x h
 * [END], every span position carrying the image token, text untouched, rows in span order,
 * keys non-zero per span position and 0 for text; and the reference's error when the
 * placeholders and the images do not correspond. */
#include "dsflash.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

#define IMG 1014

static dsf_image make_image(int w, int h, int n_embd, uint64_t key, float base) {
    dsf_image im;
    memset(&im, 0, sizeof im);
    im.plan.n_llm_w = w;
    im.plan.n_llm_h = h;
    im.plan.n_tokens = h * (w + 1) + 2;
    im.n_embd = n_embd;
    im.key = key;
    im.block = malloc((size_t)im.plan.n_tokens * (size_t)n_embd * sizeof(float));
    for (int i = 0; i < im.plan.n_tokens * n_embd; i++) im.block[i] = base + (float)i;
    return im;
}

/* Guards against: a wrong span layout (NEWLINE after each row, one START/END), text shifted
 * or retyped, rows out of order between two images, keys 0 or repeated inside a span. */
TEST(mm_expand_layout) {
    dsf_image im[2] = {make_image(2, 3, 4, 77, 0.0f), make_image(1, 1, 4, 78, 1000.0f)};
    const int32_t prompt[] = {0, 5, IMG, 6, IMG, 7};
    dsf_mm_prompt p;
    char err[DSF_ERR_LEN];
    CHECKF(dsf_mm_expand(prompt, 6, IMG, im, 2, &p, err) == 0, "%s", err);
    /* image 0: 3 * (2 + 1) + 2 = 11 tokens; image 1: 1 * 2 + 2 = 4 */
    static const int8_t want_types[] = {-1, -1, 0, 1, 1, 2, 1, 1, 2, 1, 1, 2, 3, -1, 0, 1, 2, 3, -1};
    const int n = (int)(sizeof want_types);
    CHECKF(p.n == n && p.n_embd == 4, "%d tokens (want %d)", p.n, n);
    CHECK(!memcmp(p.types, want_types, (size_t)n));
    static const int32_t want_tok[] = {0, 5, IMG, IMG, IMG, IMG, IMG, IMG, IMG, IMG, IMG, IMG, IMG,
                                       6, IMG, IMG, IMG, IMG, 7};
    CHECK(!memcmp(p.tokens, want_tok, sizeof want_tok));
    CHECK(p.embd[0] == 0.0f && p.embd[11 * 4 - 1] == 43.0f && p.embd[11 * 4] == 1000.0f &&
          p.embd[15 * 4 - 1] == 1015.0f);
    for (int i = 0; i < n; i++) {
        CHECKF((p.keys[i] == 0) == (p.types[i] < 0), "key of position %d", i);
        for (int j = 0; j < i; j++) CHECKF(!p.keys[i] || p.keys[i] != p.keys[j], "keys %d and %d repeat", j, i);
    }
    dsf_media m = dsf_mm_media(&p);
    CHECK(m.types == p.types && m.embd == p.embd && m.keys == p.keys);
    dsf_mm_prompt_free(&p);
    CHECK(p.tokens == NULL);
    free(im[0].block);
    free(im[1].block);
}

/* Guards against: silently dropping or inventing images (the reference: "Found N image tokens
 * but got M images"), and blocks whose size does not match their grid. */
TEST(mm_expand_errors) {
    dsf_image im[2] = {make_image(2, 2, 4, 1, 0.0f), make_image(2, 2, 8, 2, 0.0f)};
    const int32_t prompt[] = {0, IMG, 6, IMG};
    dsf_mm_prompt p;
    char err[DSF_ERR_LEN] = "";
    CHECK(dsf_mm_expand(prompt, 4, IMG, im, 1, &p, err) < 0);
    CHECKF(!strcmp(err, "Found 2 image tokens but got 1 images"), "message: %s", err);
    CHECK(dsf_mm_expand(prompt, 3, IMG, im, 0, &p, err) < 0 && strstr(err, "Found 1 image tokens but got 0"));
    CHECK(dsf_mm_expand(prompt, 4, IMG, im, 2, &p, err) < 0 && strstr(err, "rows of 8"));
    im[1].n_embd = 4;
    im[1].plan.n_tokens = 9;
    CHECK(dsf_mm_expand(prompt, 4, IMG, im, 2, &p, err) < 0 && strstr(err, "does not fit"));
    /* no images, no placeholders: the text as it is */
    const int32_t text[] = {3, 4};
    CHECK(dsf_mm_expand(text, 2, IMG, NULL, 0, &p, err) == 0 && p.n == 2 && p.types[0] == -1 && !p.embd);
    dsf_mm_prompt_free(&p);
    free(im[0].block);
    free(im[1].block);
}
