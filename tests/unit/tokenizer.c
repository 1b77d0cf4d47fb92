/* tokenizer.c: the BPE tokenizer (src/text/tokenizer.c) on a toy vocabulary.
 *
 * Expected values come from outside the code under test: hand-computed merges on a toy
 * vocabulary. The tiny41 tokenizer and the vocabulary converter are checked in
 * tests/tiny/tokenizer.c, `dsflash tokenize` and the real DeepSeek-V3 tokenizer in
 * tests/e2e/tokenizer.c. */
#include "test.h"
#include "dsflash.h"
#include "io/gguf.h"
#include "text/tokenizer.h"
#include "base/util.h"
#include "convert/vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- helpers ------------------------------------------------------------------------- */

/* A toy byte-level vocabulary: the 256 byte tokens (ids 0..255 in byte order, GPT-2 unicode
 * stand-ins), then `extra` tokens, with the given merges. */
static dsf_tokenizer *toy_tokenizer(const char *const *extra, const int32_t *extra_types,
                                    int n_extra, const char *const *merges, int n_merges,
                                    const char *pre, char *err) {
    static char bytes[256][4];
    const char *toks[512];
    uint64_t lens[512], mlens[64];
    int32_t types[512];
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)next++;
        memset(bytes[b], 0, 4);
        if (cp < 0x80) bytes[b][0] = (char)cp;
        else {
            bytes[b][0] = (char)(0xC0 | (cp >> 6));
            bytes[b][1] = (char)(0x80 | (cp & 0x3F));
        }
        toks[b] = bytes[b];
        lens[b] = strlen(bytes[b]);
        types[b] = TOKEN_TYPE_NORMAL;
    }
    for (int i = 0; i < n_extra; i++) {
        toks[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
        types[256 + i] = extra_types ? extra_types[i] : TOKEN_TYPE_NORMAL;
    }
    for (int i = 0; i < n_merges; i++) mlens[i] = strlen(merges[i]);
    tokenizer_spec sp = {
        .model = "gpt2", .pre = pre, .n_tokens = (uint64_t)(256 + n_extra), .tokens = toks,
        .token_lens = lens, .token_types = types, .n_merges = (uint64_t)n_merges,
        .merges = merges, .merge_lens = mlens, .bos = -1, .eos = -1, .pad = -1,
    };
    return tokenizer_build(&sp, err);
}


/* ---- BPE core on a toy vocabulary ---------------------------------------------------- */

/* Guards against merging in text order instead of rank order: "abc" must take "b c"
 * (rank 0) before "a b" (rank 1), then "a bc" (rank 2) -> one token; "abab" -> ab ab. */
TEST(tokenizer_bpe_merge_rank_order) {
    const char *extra[] = {"bc", "ab", "abc", "abab_unused"};
    const char *merges[] = {"b c", "a b", "a bc"};
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = toy_tokenizer(extra, NULL, 4, merges, 3, "deepseek-v3", err);
    CHECKF(tok, "build: %s", err);
    int32_t *ids;
    size_t n;
    CHECK(dsf_tokenize(tok, "abc", 3, false, true, &ids, &n, err) == 0);
    CHECKF(n == 1 && ids[0] == 258, "abc -> %zu ids, first %d (want [258])", n, ids[0]);
    free(ids);
    CHECK(dsf_tokenize(tok, "abab", 4, false, true, &ids, &n, err) == 0);
    CHECKF(n == 2 && ids[0] == 257 && ids[1] == 257, "abab -> n=%zu", n);
    free(ids);
    /* "xabcx": no merge touches x ('x' = byte 0x78 = id 0x78) */
    CHECK(dsf_tokenize(tok, "xabcx", 5, false, true, &ids, &n, err) == 0);
    CHECKF(n == 3 && ids[0] == 'x' && ids[1] == 258 && ids[2] == 'x', "xabcx -> n=%zu", n);
    free(ids);
    /* pre-tokenization isolates " abc" (a space then letters: one piece, no merge with the
     * space) and "123" from "4" (digits in groups of at most 3) */
    CHECK(dsf_tokenize(tok, "1234 abc", 8, false, true, &ids, &n, err) == 0);
    const int32_t want[6] = {'1', '2', '3', '4', ' ', 258};
    CHECKF(n == 6 && !memcmp(ids, want, sizeof want), "1234 abc -> n=%zu", n);
    free(ids);
    dsf_tokenizer_free(tok);
}

/* Equal-rank ties go to the leftmost pair: "aaa" with merge "a a" -> [aa, a], not [a, aa]. */
TEST(tokenizer_bpe_leftmost_tie) {
    const char *extra[] = {"aa"};
    const char *merges[] = {"a a"};
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = toy_tokenizer(extra, NULL, 1, merges, 1, "deepseek-v3", err);
    CHECKF(tok, "build: %s", err);
    int32_t *ids;
    size_t n;
    CHECK(dsf_tokenize(tok, "aaa", 3, false, true, &ids, &n, err) == 0);
    CHECKF(n == 2 && ids[0] == 256 && ids[1] == 'a', "aaa -> n=%zu [%d ...]", n, ids[0]);
    free(ids);
    CHECK(dsf_tokenize(tok, "aaaaa", 5, false, true, &ids, &n, err) == 0);
    CHECKF(n == 3 && ids[0] == 256 && ids[1] == 256 && ids[2] == 'a', "aaaaa -> n=%zu", n);
    free(ids);
    dsf_tokenizer_free(tok);
}

/* Added tokens: leftmost-longest, control tokens only with parse_special, user-defined
 * always; resolved by string. */
TEST(tokenizer_added_tokens_atomic) {
    const char *extra[] = {"<|a|>", "<|a|>b", "<t>"};
    const int32_t types[] = {TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};
    const char *merges[] = {"a b"};
    char err[DSF_ERR_LEN];
    /* "a b" needs "ab" as a token: refused otherwise (the merge result is not a token) */
    dsf_tokenizer *bad = toy_tokenizer(extra, types, 3, merges, 1, "deepseek-v3", err);
    CHECK(bad == NULL);
    CHECKF(strstr(err, "merges[0]") && strstr(err, "result"), "error: %s", err);
    dsf_tokenizer *tok = toy_tokenizer(extra, types, 3, NULL, 0, "deepseek-v3", err);
    CHECKF(tok, "build: %s", err);
    CHECK(dsf_token_id(tok, "<|a|>") == 256 && dsf_token_id(tok, "<t>") == 258);
    CHECK(dsf_token_id(tok, "<|nope|>") == -1);
    int32_t *ids;
    size_t n;
    const char *s = "x<|a|>b<t>";
    CHECK(dsf_tokenize(tok, s, strlen(s), false, true, &ids, &n, err) == 0);
    CHECKF(n == 3 && ids[0] == 'x' && ids[1] == 257 && ids[2] == 258, "n=%zu", n);
    free(ids);
    CHECK(dsf_tokenize(tok, s, strlen(s), false, false, &ids, &n, err) == 0);
    /* without parse_special: x < | a | > b as bytes (pre-tokenized), then <t> */
    CHECKF(n >= 2 && ids[n - 1] == 258 && ids[1] == '<', "n=%zu", n);
    for (size_t i = 0; i + 1 < n; i++) CHECK(ids[i] < 256);
    free(ids);
    dsf_tokenizer_free(tok);
}

/* The streaming detokenizer holds back an unfinished UTF-8 character and replaces
 * ill-formed bytes by U+FFFD (one per maximal subpart, Unicode Table 3-7). */
TEST(tokenizer_detok_utf8_streaming) {
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = toy_tokenizer(NULL, NULL, 0, NULL, 0, "deepseek-v3", err);
    CHECKF(tok, "build: %s", err);
    dsf_detok *d = dsf_detok_new(tok, false);
    const char *txt;
    size_t l;
    /* "€" = E2 82 AC, one byte token each (ids = byte values in the toy vocab) */
    CHECK(dsf_detok_push(d, 'A', &txt, &l, err) == 0 && l == 1 && txt[0] == 'A');
    CHECK(dsf_detok_push(d, 0xE2, &txt, &l, err) == 0 && l == 0);
    CHECK(dsf_detok_push(d, 0x82, &txt, &l, err) == 0 && l == 0);
    CHECK(dsf_detok_push(d, 0xAC, &txt, &l, err) == 0);
    CHECKF(l == 3 && !memcmp(txt, "\xE2\x82\xAC", 3), "euro: %zu bytes", l);
    /* a lone continuation byte: U+FFFD at once */
    CHECK(dsf_detok_push(d, 0x80, &txt, &l, err) == 0 && l == 3 && !memcmp(txt, "\xEF\xBF\xBD", 3));
    /* F0 9F then 'x': the held F0 9F is one maximal subpart -> one U+FFFD, then x */
    CHECK(dsf_detok_push(d, 0xF0, &txt, &l, err) == 0 && l == 0);
    CHECK(dsf_detok_push(d, 0x9F, &txt, &l, err) == 0 && l == 0);
    CHECK(dsf_detok_push(d, 'x', &txt, &l, err) == 0);
    CHECKF(l == 4 && !memcmp(txt, "\xEF\xBF\xBDx", 4), "F0 9F x: %zu bytes", l);
    /* E0 80: E0 needs A0..BF next, so E0 alone is the subpart, then 80 is another */
    CHECK(dsf_detok_push(d, 0xE0, &txt, &l, err) == 0 && l == 0);
    CHECK(dsf_detok_push(d, 0x80, &txt, &l, err) == 0);
    CHECKF(l == 6 && !memcmp(txt, "\xEF\xBF\xBD\xEF\xBF\xBD", 6), "E0 80: %zu bytes", l);
    /* flush with a held prefix -> U+FFFD */
    CHECK(dsf_detok_push(d, 0xE2, &txt, &l, err) == 0 && l == 0);
    dsf_detok_flush(d, &txt, &l);
    CHECK(l == 3 && !memcmp(txt, "\xEF\xBF\xBD", 3));
    dsf_detok_flush(d, &txt, &l);
    CHECK(l == 0);
    CHECK(dsf_detok_push(d, 99999, &txt, &l, err) == -1);
    dsf_detok_free(d);
    dsf_tokenizer_free(tok);
}

/* Refusals: an unknown pre-tokenizer or model is an error, never a silent fallback. */
TEST(tokenizer_refuses_unknown_pre) {
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = toy_tokenizer(NULL, NULL, 0, NULL, 0, "llama3", err);
    CHECK(tok == NULL);
    CHECKF(strstr(err, "tokenizer.ggml.pre") && strstr(err, "llama3"), "error: %s", err);
    tok = toy_tokenizer(NULL, NULL, 0, NULL, 0, NULL, err);
    CHECK(tok == NULL);
    const char *merges[] = {"ab"};
    tok = toy_tokenizer(NULL, NULL, 0, merges, 1, "deepseek-v3", err);
    CHECKF(tok == NULL && strstr(err, "merges[0]"), "error: %s", err);
}

/* Hostile GGUF tokenizer keys: each file is refused with a message naming the key. */
TEST(tokenizer_gguf_refusals) {
    char bytes[256][4];
    const char *toks[257];
    uint64_t lens[257];
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)next++;
        memset(bytes[b], 0, 4);
        if (cp < 0x80) bytes[b][0] = (char)cp;
        else {
            bytes[b][0] = (char)(0xC0 | (cp >> 6));
            bytes[b][1] = (char)(0x80 | (cp & 0x3F));
        }
        toks[b] = bytes[b];
        lens[b] = strlen(bytes[b]);
    }
    toks[256] = "ab";
    lens[256] = 2;
    const char *merges[1] = {"a b"};
    uint64_t mlen[1] = {3};
    int32_t types[257];
    for (int i = 0; i < 257; i++) types[i] = 1;
    /* variants: 0 ok, 1 no merges, 2 short token_type, 3 bos out of range, 4 pre llama3,
     * 5 token_type UINT8, 6 no model */
    const char *want[] = {NULL, "merges", "token_type", "bos", "pre", "token_type", "model"};
    for (int v = 0; v < 7; v++) {
        char path[1024], err[DSF_ERR_LEN];
        snprintf(path, sizeof path, "%s/tok_bad%d.gguf", test_tmpdir(), v);
        gguf_writer *w = gguf_writer_new();
        int rc = 0;
        if (v != 6) rc |= gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", err);
        rc |= gguf_writer_kv_str(w, "tokenizer.ggml.pre", v == 4 ? "llama3" : "deepseek-v3", err);
        rc |= gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", toks, lens, 257, err);
        if (v == 5) {
            uint8_t t8[257];
            memset(t8, 1, sizeof t8);
            rc |= gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_UINT8, t8, 257, err);
        } else {
            rc |= gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                                     v == 2 ? 100 : 257, err);
        }
        if (v != 1) rc |= gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", merges, mlen, 1, err);
        rc |= gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", v == 3 ? 257 : 0, err);
        rc |= gguf_writer_begin(w, path, err);
        rc |= gguf_writer_finish(w, err);
        gguf_writer_free(w);
        CHECKF(rc == 0, "writing variant %d: %s", v, err);
        dsf_tokenizer *tok = dsf_tokenizer_load(path, err);
        if (v == 0) {
            CHECKF(tok, "variant 0: %s", err);
            int32_t *ids;
            size_t n;
            CHECK(dsf_tokenize(tok, "ab", 2, true, true, &ids, &n, err) == 0);
            CHECK(n == 2 && ids[0] == 0 && ids[1] == 256);
            free(ids);
            dsf_tokenizer_free(tok);
        } else {
            CHECKF(!tok && strstr(err, want[v]), "variant %d: %s", v, tok ? "accepted" : err);
        }
    }
}
