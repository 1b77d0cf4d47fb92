/* runtime/media.c: placeholder expansion of image prompts (dsf_mm_*; vision.md §5).
 *
 * Owns: turning a tokenized prompt with one image_token_id per image into the expanded prompt:
 * each placeholder becomes its image's span [START] ([IMAGE] x n_llm_w [NEWLINE]) x n_llm_h
 * [END], every span position carrying image_token_id, with its type, its row of the image's
 * block and a content key (the image's key mixed with the index in the span, never 0).
 * Must not: encode images (vision/ does) or evaluate anything (the session does).
 * Invariant: the placeholders and the images correspond one to one, in order; text tokens keep
 * their ids, type TEXT and key 0. */
#include "dsflash.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

/* A span position's key: the image's key and the index in the span, mixed (splitmix64's
 * finalizer), never 0 (0 is text). */
static uint64_t span_key(uint64_t image_key, int64_t idx) {
    uint64_t z = image_key + 0x9E3779B97F4A7C15ull * (uint64_t)(idx + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

/* The span layout of image i is consistent with its block: -1 with err otherwise. */
static int check_image(const dsf_image *im, int i, int n_embd, char *err) {
    const dsf_image_plan *p = &im->plan;
    if (!im->block) return dsf_seterr(err, "image %d has no block (not encoded?)", i);
    if (im->n_embd != n_embd)
        return dsf_seterr(err, "image %d has rows of %d floats, image 0 of %d", i, im->n_embd, n_embd);
    if (p->n_llm_w < 1 || p->n_llm_h < 1 || p->n_llm_w > 1 << 20 || p->n_llm_h > 1 << 20 ||
        (int64_t)p->n_llm_h * (p->n_llm_w + 1) + 2 != p->n_tokens)
        return dsf_seterr(err, "image %d: a span of %d tokens does not fit its %d x %d grid (want h*(w+1)+2)", i,
                          p->n_tokens, p->n_llm_w, p->n_llm_h);
    return 0;
}

int dsf_mm_expand(const int32_t *prompt, int n, int32_t image_token_id, const dsf_image *images, int n_images,
                  dsf_mm_prompt *out, char *err) {
    memset(out, 0, sizeof *out);
    if (n < 0 || n_images < 0 || (n_images && !images)) return dsf_seterr(err, "dsf_mm_expand: bad arguments");
    int found = 0;
    for (int i = 0; i < n; i++) found += prompt[i] == image_token_id;
    if (found != n_images) return dsf_seterr(err, "Found %d image tokens but got %d images", found, n_images);
    const int n_embd = n_images ? images[0].n_embd : 0;
    if (n_images && n_embd < 1) return dsf_seterr(err, "image 0 has rows of %d floats", n_embd);
    int64_t total = n - n_images, rows = 0;
    for (int i = 0; i < n_images; i++) {
        if (check_image(&images[i], i, n_embd, err) < 0) return -1;
        rows += images[i].plan.n_tokens;
    }
    total += rows;
    if (total > 0x7fffffff) return dsf_seterr(err, "the expanded prompt has %lld tokens (too many)", (long long)total);
    out->n = (int)total;
    out->n_embd = n_embd;
    out->tokens = dsf_xmalloc((size_t)(total ? total : 1) * sizeof(int32_t));
    out->types = dsf_xmalloc((size_t)(total ? total : 1));
    out->keys = dsf_xcalloc((size_t)(total ? total : 1), sizeof(uint64_t));
    out->embd = rows ? dsf_xmalloc((size_t)(rows * n_embd) * sizeof(float)) : NULL;
    int64_t o = 0, r = 0;
    for (int i = 0, im = 0; i < n; i++) {
        if (prompt[i] != image_token_id) {
            out->tokens[o] = prompt[i];
            out->types[o++] = DSF_TOKEN_TEXT;
            continue;
        }
        const dsf_image *x = &images[im++];
        const int w = x->plan.n_llm_w, len = x->plan.n_tokens;
        memcpy(out->embd + r * n_embd, x->block, (size_t)len * (size_t)n_embd * sizeof(float));
        r += len;
        for (int k = 0; k < len; k++, o++) {
            int8_t t = DSF_TOKEN_IMAGE;
            if (k == 0) t = DSF_TOKEN_IMAGE_START;
            else if (k == len - 1) t = DSF_TOKEN_IMAGE_END;
            else if ((k - 1) % (w + 1) == w) t = DSF_TOKEN_IMAGE_NEWLINE;
            out->tokens[o] = image_token_id;
            out->types[o] = t;
            out->keys[o] = span_key(x->key, k);
        }
    }
    return 0;
}

void dsf_mm_prompt_free(dsf_mm_prompt *p) {
    if (!p) return;
    free(p->tokens);
    free(p->types);
    free(p->embd);
    free(p->keys);
    memset(p, 0, sizeof *p);
}

dsf_media dsf_mm_media(const dsf_mm_prompt *p) {
    dsf_media m = {p->types, p->embd, p->keys};
    return m;
}
