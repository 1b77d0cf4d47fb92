/* fuzz_vocab.c: libFuzzer harness for hostile vocabularies: the HF tokenizer.json reader
 * (src/convert/vocab.c) and the tokenizer builder's validation (tokenizer_build, src/text/tokenizer.c).
 *
 * Byte 0 picks the mode:
 *   even: the rest is tokenizer.json, next to a fixed tokenizer_config.json, converted by
 *         vocab_write_gguf; when accepted, the GGUF is written, read back and, if the
 *         tokenizer loader accepts it too, a sample text must survive a round trip;
 *   odd:  an in-memory vocabulary: the 256 GPT-2 byte tokens, then NUL-separated extra
 *         tokens (first byte of each = its type), an empty string, then NUL-separated
 *         merges "a b"; byte 1 picks bos/eos. tokenizer_build must refuse it with a message
 *         (duplicates, merges over unknown tokens, ...) or give a tokenizer that tokenizes
 *         the fixed sample and each extra token's own text losslessly.
 * Checks: no crash, leak or overread; one-line errors; accepted vocabularies tokenize any
 * text losslessly with ids in range. */
#include "fuzz_common.h"
#include "io/gguf.h"
#include "convert/vocab.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fz_vocab_dir(void) {
    static char dir[4096];
    if (dir[0]) return dir;
#ifdef FUZZ_NO_MAIN
    snprintf(dir, sizeof dir, "%s/fuzz-vocab", test_tmpdir());
    FZ_REQUIRE(mkdir(dir, 0700) == 0 || errno == EEXIST, "cannot create %s", dir);
#else
    snprintf(dir, sizeof dir, "/tmp/dsf-fuzz-vocab-XXXXXX");
    FZ_REQUIRE(mkdtemp(dir) != NULL, "mkdtemp failed");
#endif
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(p, "wb");
    FZ_REQUIRE(f != NULL, "cannot write %s", p);
    fputs("{\"add_bos_token\": true, \"add_eos_token\": false, "
          "\"bos_token\": {\"content\": \"<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>\"}, "
          "\"eos_token\": \"<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>\"}", f);
    fclose(f);
    return dir;
}

static const char k_fz_sample[] = "Hello, world! 12345 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD\n\t<think>x</think> \xF0\x9F\x98\x80";

/* Any accepted tokenizer must tokenize the sample losslessly with ids in range. */
static void fz_vocab_roundtrip(const dsf_tokenizer *tok) {
    char err[DSF_ERR_LEN] = "";
    int32_t *ids;
    size_t n;
    FZ_REQUIRE(dsf_tokenize(tok, k_fz_sample, sizeof k_fz_sample - 1, false, false, &ids, &n, err) == 0,
               "tokenize failed: %s", err);
    for (size_t i = 0; i < n; i++)
        FZ_REQUIRE(ids[i] >= 0 && ids[i] < dsf_tokenizer_n_vocab(tok), "id %d out of range", ids[i]);
    char *text;
    size_t len;
    FZ_REQUIRE(dsf_detokenize(tok, ids, n, true, &text, &len, err) == 0, "detokenize failed: %s", err);
    FZ_REQUIRE(len == sizeof k_fz_sample - 1 && !memcmp(text, k_fz_sample, len), "round trip lost data");
    free(text);
    free(ids);
}

static int fz_vocab_json(const uint8_t *data, size_t size) {
    const char *dir = fz_vocab_dir();
    char p[4200], out[4200], err[DSF_ERR_LEN] = "";
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "wb");
    FZ_REQUIRE(f && (size == 0 || fwrite(data, 1, size, f) == size) && fclose(f) == 0, "cannot write %s", p);
    gguf_writer *w = gguf_writer_new();
    FZ_REQUIRE(gguf_writer_kv_str(w, "general.architecture", "deepseek41", err) == 0, "kv: %s", err);
    int rc = vocab_write_gguf(w, dir, 0, err);
    if (rc) {
        fz_check_err(err, "vocab_write_gguf");
        gguf_writer_free(w);
        return 0;
    }
    snprintf(out, sizeof out, "%s/vocab.gguf", dir);
    FZ_REQUIRE(gguf_writer_begin(w, out, err) == 0 && gguf_writer_finish(w, err) == 0, "writing the GGUF failed: %s",
               err);
    gguf_writer_free(w);
    dsf_tokenizer *tok = dsf_tokenizer_load(out, err);
    if (!tok) {
        /* The converter keeps what tokenizer.json says; the loader may still refuse it
         * (e.g. a merge over unknown tokens), but cleanly. */
        fz_check_err(err, "dsf_tokenizer_load");
        return 0;
    }
    fz_vocab_roundtrip(tok);
    dsf_tokenizer_free(tok);
    return 1;
}

static int fz_vocab_spec(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t ids = fz_u8(&in);
    enum { MAX_EXTRA = 64, MAX_MERGES = 64 };
    static char bytes[256][4];
    const char *toks[256 + MAX_EXTRA];
    uint64_t lens[256 + MAX_EXTRA], mlens[MAX_MERGES];
    int32_t types[256 + MAX_EXTRA];
    const char *merges[MAX_MERGES];
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)next++;
        memset(bytes[b], 0, 4);
        if (cp < 0x80) {
            bytes[b][0] = (char)cp;
        } else {
            bytes[b][0] = (char)(0xC0 | (cp >> 6));
            bytes[b][1] = (char)(0x80 | (cp & 0x3F));
        }
        toks[b] = bytes[b];
        lens[b] = strlen(bytes[b]);
        types[b] = TOKEN_TYPE_NORMAL;
    }
    int n_extra = 0, n_merges = 0;
    bool in_merges = false;
    while (in.n) {
        const uint8_t *z = memchr(in.p, 0, in.n);
        size_t l = z ? (size_t)(z - in.p) : in.n;
        const char *s = (const char *)in.p;
        in.p += z ? l + 1 : l;
        in.n -= z ? l + 1 : l;
        if (!in_merges) {
            if (l == 0) {
                in_merges = true;
                continue;
            }
            if (n_extra == MAX_EXTRA) continue;
            types[256 + n_extra] = (uint8_t)s[0] % 7; /* 0..6: includes invalid types 0 */
            toks[256 + n_extra] = s + 1;
            lens[256 + n_extra] = l - 1;
            n_extra++;
        } else if (n_merges < MAX_MERGES) {
            merges[n_merges] = s;
            mlens[n_merges] = l;
            n_merges++;
        }
    }
    int nt = 256 + n_extra;
    tokenizer_spec sp = {
        .model = "gpt2", .pre = "deepseek-v3", .n_tokens = (uint64_t)nt, .tokens = toks, .token_lens = lens,
        .token_types = types, .n_merges = (uint64_t)n_merges, .merges = merges, .merge_lens = mlens,
        .bos = (ids & 15) == 15 ? -1 : (int64_t)(ids & 15) * 37 % (nt + 2),
        .eos = (ids >> 4) == 15 ? -1 : (int64_t)(ids >> 4) * 41 % (nt + 2), .pad = -1, .add_bos = ids & 1,
    };
    char err[DSF_ERR_LEN] = "";
    dsf_tokenizer *tok = tokenizer_build(&sp, err);
    if (!tok) {
        fz_check_err(err, "tokenizer_build");
        return 0;
    }
    FZ_REQUIRE(dsf_tokenizer_n_vocab(tok) == nt, "n_vocab %d, built from %d", dsf_tokenizer_n_vocab(tok), nt);
    FZ_REQUIRE(dsf_tokenizer_bos(tok) < nt && dsf_tokenizer_eos(tok) < nt, "bos/eos outside the vocabulary");
    fz_vocab_roundtrip(tok);
    /* every extra token's own text tokenizes and detokenizes without loss (the byte tokens
     * are covered by the sample) */
    for (int i = 256; i < nt; i++) {
        size_t bl;
        const char *b = dsf_token_bytes(tok, i, &bl);
        FZ_REQUIRE(b != NULL, "no bytes for id %d", i);
        int32_t *v;
        size_t n;
        char *text;
        size_t len;
        FZ_REQUIRE(dsf_tokenize(tok, b, bl, false, true, &v, &n, err) == 0, "tokenize failed: %s", err);
        FZ_REQUIRE(dsf_detokenize(tok, v, n, true, &text, &len, err) == 0, "detokenize failed: %s", err);
        if (fz_utf8_valid((const uint8_t *)b, bl))
            FZ_REQUIRE(len == bl && !memcmp(text, b, bl), "token %d's text does not round-trip", i);
        free(text);
        free(v);
    }
    dsf_tokenizer_free(tok);
    return 1;
}

static int fz_vocab_one(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    return (data[0] & 1) ? fz_vocab_spec(data + 1, size - 1) : fz_vocab_json(data + 1, size - 1);
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_vocab_one(data, size);
    return 0;
}
#endif
