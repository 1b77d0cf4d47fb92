/* tokenizer.c: the BPE tokenizer (src/text/tokenizer.c) on ../shared/testdata/tiny41, and
 * the HF -> GGUF vocabulary converter (src/convert/vocab.c).
 *
 * Expected values come from outside the code under test: tokenizer_cases.json and the
 * README's text-prompt ids (cross-checked there against @huggingface/tokenizers), and
 * tiny41.gguf's tokenizer keys written by the maintainers' converter. */
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

#include "helpers.h"
#include "tiny41.h"

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

/* ---- tiny41 ---------------------------------------------------------------------------- */

/* Every case of tokenizer_cases.json: ids (no BOS), the decoded text, and the per-id pieces. */
TEST(tokenizer_tiny41_cases) {
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
        test_fmt_ids(got, sizeof got, ids, n);
        CHECKF(test_ids_equal_json(ids, n, json_object_get(c, "ids")), "case %zu (%s): got %s", i,
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

/* README text-prompt ids (BOS included); special ids resolved by string. */
TEST(tokenizer_tiny41_text_prompt_and_specials) {
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
TEST(tokenizer_tiny41_long_roundtrip) {
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

/* Any bytes tokenize (invalid UTF-8 included) and the tokens' bytes give the input back;
 * valid UTF-8 also decodes back exactly. Seeded, so reproducible. */
TEST(tokenizer_tiny41_random_roundtrip) {
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
TEST(tokenizer_vocab_matches_tiny41_gguf) {
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
TEST(tokenizer_vocab_pads_holes) {
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
TEST(tokenizer_vocab_refuses_bad_json) {
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
