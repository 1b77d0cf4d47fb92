/* fuzz_common.h: shared pieces of the parser fuzz harnesses (tests/fuzz/fuzz_*.c).
 *
 * Each harness defines one function `int fz_<name>_one(const uint8_t *data, size_t size)`
 * that runs one input, returns 1 if the parser accepted it (0 if it refused it, cleanly),
 * and checks the module's promises with FZ_REQUIRE (which prints what
 * broke and aborts, so libFuzzer saves the input and the in-suite test fails). Built alone
 * (`make fuzz`), a harness also defines LLVMFuzzerTestOneInput; tests/fuzz/replay.c
 * includes the harnesses with FUZZ_NO_MAIN defined and feeds them a fixed-seed mutation
 * loop, so `make test` / `make asan` exercise the same checks deterministically.
 *
 * Static functions only (every harness is one translation unit with this header). */
#ifndef DSF_FUZZ_COMMON_H
#define DSF_FUZZ_COMMON_H

#include "dsflash.h"
#include "text/tokenizer.h"
#include "base/util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Called before FZ_REQUIRE aborts (the in-suite driver prints the offending input). */
static void (*fz_on_fail)(void);

#define FZ_REQUIRE(c, ...)                                                                \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "%s:%d: fuzz invariant broken: %s: ", __FILE__, __LINE__, #c);\
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            if (fz_on_fail) fz_on_fail();                                                 \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* Every error message is one non-empty line (util.h convention). */
static inline void fz_check_err(const char *err, const char *what) {
    size_t n = strnlen(err, DSF_ERR_LEN);
    FZ_REQUIRE(n > 0 && n < DSF_ERR_LEN, "%s: empty or unterminated error message", what);
    FZ_REQUIRE(!memchr(err, '\n', n), "%s: error message spans lines: %s", what, err);
}

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
static inline bool fz_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

/* A byte cursor for harness parameters: takes bytes from the front of the input. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint8_t fz_u8(fz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fz_u32(fz_in *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

/* splitmix64: split points and mutations derived from a seed. */
static inline uint64_t fz_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- a tokenizer to fuzz with ---------------------------------------------------------- */

/* A small byte-level vocabulary built in memory: the 256 byte tokens (GPT-2 stand-ins),
 * a few merges ("th", "the", "Ġthe", "in", "ing", "Ġ<"), one CONTROL token per V4.1
 * special string that the chat format uses and the USER_DEFINED "<think>"/"</think>". */
static inline dsf_tokenizer *fz_toy_tokenizer(char *err) {
    static char bytes[256][4];
    static const char *const extra[] = {
        "th", "the", "\xC4\xA0" "the", "in", "ing", "\xC4\xA0<",
        "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
        "<\xEF\xBD\x9CUser\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>",
        "<think>", "</think>",
    };
    static const int32_t extra_types[] = {1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 4, 4};
    static const char *const merges[] = {"t h", "th e", "\xC4\xA0 the", "i n", "in g", "\xC4\xA0 <"};
    enum { N_EXTRA = sizeof extra / sizeof extra[0], N_MERGES = sizeof merges / sizeof merges[0] };
    const char *toks[256 + N_EXTRA];
    uint64_t lens[256 + N_EXTRA], mlens[N_MERGES];
    int32_t types[256 + N_EXTRA];
    int next = 256;
    for (int b = 0; b < 256; b++) {
        /* GPT-2 byte-level: printable Latin-1 bytes stand for themselves, the others are
         * numbered from U+0100 in byte order. */
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
    for (int i = 0; i < N_EXTRA; i++) {
        toks[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
        types[256 + i] = extra_types[i];
    }
    for (int i = 0; i < N_MERGES; i++) mlens[i] = strlen(merges[i]);
    tokenizer_spec sp = {
        .model = "gpt2", .pre = "deepseek-v3", .n_tokens = 256 + N_EXTRA, .tokens = toks,
        .token_lens = lens, .token_types = types, .n_merges = N_MERGES, .merges = merges,
        .merge_lens = mlens, .bos = 256 + 6, .eos = 256 + 7, .pad = -1, .add_bos = true,
    };
    return tokenizer_build(&sp, err);
}

/* The tokenizer the harnesses use: $DSF_FUZZ_GGUF, else ../shared/testdata/tiny41/tiny41.gguf
 * (the real V4.1 vocabulary, cut down), else the toy one. Loaded once, never freed. */
static inline const dsf_tokenizer *fz_tokenizer(void) {
    static dsf_tokenizer *tok;
    if (tok) return tok;
    char err[DSF_ERR_LEN];
    const char *env = getenv("DSF_FUZZ_GGUF");
    const char *shared = getenv("DSF_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/testdata/tiny41/tiny41.gguf", shared ? shared : "../shared");
    tok = dsf_tokenizer_load(env ? env : path, err);
    if (!tok) tok = fz_toy_tokenizer(err);
    if (!tok) {
        fprintf(stderr, "fuzz: cannot build the toy tokenizer: %s\n", err);
        abort();
    }
    return tok;
}

#endif
