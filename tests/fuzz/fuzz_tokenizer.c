/* fuzz_tokenizer.c: libFuzzer harness for the tokenizer (src/text/tokenize.c) on arbitrary bytes.
 *
 * The input is used twice:
 *   - as text: tokenized with and without special-token parsing (and with BOS); every id
 *     must be in the vocabulary; byte-level BPE loses nothing, so detokenizing the ids of
 *     valid UTF-8 text gives the text back exactly (rendering specials);
 *   - as little-endian int32 ids (any value): dsf_detokenize and the streaming detokenizer
 *     must agree byte for byte, always emit valid UTF-8, and refuse an out-of-range id with
 *     an error instead of reading outside the vocabulary.
 * The tokenizer is tiny41.gguf's (the real V4.1 vocabulary and specials), or the in-memory
 * toy one when ../shared is absent (fuzz_common.h). */
#include "fuzz_common.h"

static void fz_tok_roundtrip(const dsf_tokenizer *tok, const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN] = "";
    int n_vocab = dsf_tokenizer_n_vocab(tok);
    bool valid = fz_utf8_valid(data, size);
    for (int mode = 0; mode < 3; mode++) {
        bool special = mode >= 1, bos = mode == 2 && dsf_tokenizer_bos(tok) >= 0;
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = dsf_tokenize(tok, (const char *)data, size, bos, special, &ids, &n, err);
        if (rc) {
            /* The tokenizer accepts any bytes (invalid UTF-8 is tokenized bytewise). */
            fz_check_err(err, "dsf_tokenize");
            FZ_REQUIRE(0, "dsf_tokenize refused %zu bytes: %s", size, err);
        }
        FZ_REQUIRE(ids != NULL, "dsf_tokenize succeeded with a NULL array");
        FZ_REQUIRE(n <= size + 1, "%zu ids for %zu bytes", n, size);
        for (size_t i = 0; i < n; i++)
            FZ_REQUIRE(ids[i] >= 0 && ids[i] < n_vocab, "id %d outside [0, %d)", ids[i], n_vocab);
        char *text = NULL;
        size_t len = 0;
        rc = dsf_detokenize(tok, ids + (bos ? 1 : 0), n - (bos ? 1 : 0), true, &text, &len, err);
        FZ_REQUIRE(rc == 0, "detokenize of our own ids failed: %s", err);
        FZ_REQUIRE(text[len] == 0, "detokenized text not NUL-terminated");
        FZ_REQUIRE(fz_utf8_valid((const uint8_t *)text, len), "detokenized text is not valid UTF-8");
        if (valid)
            FZ_REQUIRE(len == size && !memcmp(text, data, size),
                       "round trip lost data (mode %d): %zu bytes in, %zu out", mode, size, len);
        free(text);
        free(ids);
    }
}

static void fz_tok_ids(const dsf_tokenizer *tok, const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN] = "";
    int n_vocab = dsf_tokenizer_n_vocab(tok);
    size_t n = size / 4;
    if (n == 0) return;
    int32_t *ids = malloc(n * sizeof *ids);
    bool in_range = true;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 |
                     (uint32_t)data[4 * i + 2] << 16 | (uint32_t)data[4 * i + 3] << 24;
        /* Mostly ids inside the vocabulary (the top byte picks): else the check stops at
         * the first id. */
        ids[i] = (v >> 24) < 0xF0 ? (int32_t)((v & 0xFFFFFF) % (uint32_t)n_vocab) : (int32_t)v;
        if (ids[i] < 0 || ids[i] >= n_vocab) in_range = false;
        FZ_REQUIRE((ids[i] < 0 || ids[i] >= n_vocab) == !dsf_token_str(tok, ids[i]),
                   "dsf_token_str(%d) disagrees with the vocabulary size", ids[i]);
    }
    for (int rs = 0; rs < 2; rs++) {
        char *all = NULL;
        size_t all_len = 0;
        int rc = dsf_detokenize(tok, ids, n, rs, &all, &all_len, err);
        FZ_REQUIRE((rc == 0) == in_range, "detokenize returned %d with ids %s", rc,
                   in_range ? "in range" : "out of range");
        if (rc) {
            fz_check_err(err, "dsf_detokenize");
            FZ_REQUIRE(all == NULL, "failed detokenize left an output");
        } else {
            FZ_REQUIRE(fz_utf8_valid((const uint8_t *)all, all_len), "detokenize: invalid UTF-8 out");
        }
        /* The stream must produce the same bytes, each piece valid UTF-8. */
        dsf_detok *d = dsf_detok_new(tok, rs);
        dsf_buf acc = {0};
        const char *t;
        size_t l;
        bool failed = false;
        for (size_t i = 0; i < n; i++) {
            if (dsf_detok_push(d, ids[i], &t, &l, err)) {
                fz_check_err(err, "dsf_detok_push");
                FZ_REQUIRE(ids[i] < 0 || ids[i] >= n_vocab, "push refused id %d", ids[i]);
                FZ_REQUIRE(l == 0, "a refused push produced text");
                failed = true;
                break;
            }
            FZ_REQUIRE(fz_utf8_valid((const uint8_t *)t, l), "detok piece is not valid UTF-8");
            dsf_buf_append(&acc, t, l);
        }
        if (!failed) {
            dsf_detok_flush(d, &t, &l);
            FZ_REQUIRE(fz_utf8_valid((const uint8_t *)t, l), "detok flush is not valid UTF-8");
            dsf_buf_append(&acc, t, l);
            FZ_REQUIRE(acc.len == all_len && (!all_len || !memcmp(acc.data, all, all_len)),
                       "streaming and one-shot detokenization differ");
        }
        dsf_detok_free(d);
        dsf_buf_free(&acc);
        free(all);
    }
    free(ids);
}

static int fz_tokenizer_one(const uint8_t *data, size_t size) {
    const dsf_tokenizer *tok = fz_tokenizer();
    fz_tok_roundtrip(tok, data, size);
    fz_tok_ids(tok, data, size);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_tokenizer_one(data, size);
    return 0;
}
#endif
