/* tokenizer.h: byte-level BPE tokenizer of DeepSeek-V3/V4.1 (GGUF tokenizer.ggml.*), module
 * interface. The public API (dsf_tokenizer_*, dsf_token_*, dsf_detok_*) is in dsflash.h;
 * this header adds the constructors the engine and the tests use. */
#ifndef DSF_TOKENIZER_H
#define DSF_TOKENIZER_H

#include "dsflash.h"
#include "io/gguf.h"

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

/* Everything a tokenizer is built from, as plain arrays (the GGUF keys, or test data).
 * Strings are (ptr, len) and need not be NUL-terminated; they are copied. */
typedef struct {
    const char *model;          /* "gpt2" (the only model supported) */
    const char *pre;            /* "deepseek-v3" (the only pre-tokenizer supported) */
    uint64_t n_tokens;
    const char *const *tokens;  /* [n_tokens] */
    const uint64_t *token_lens; /* [n_tokens] */
    const int32_t *token_types; /* [n_tokens], NULL = all NORMAL */
    uint64_t n_merges;
    const char *const *merges;  /* [n_merges] "a b" */
    const uint64_t *merge_lens; /* [n_merges] */
    int64_t bos, eos, pad;      /* -1 = none */
    bool add_bos;
} tokenizer_spec;

/* Builds a tokenizer; NULL with err on bad input (unknown model/pre, duplicate tokens,
 * a merge whose parts or result are not tokens, a missing byte token, ...). */
dsf_tokenizer *tokenizer_build(const tokenizer_spec *spec, char *err);
/* Builds it from an open GGUF's tokenizer.ggml.* keys (the file may be closed afterwards). */
dsf_tokenizer *tokenizer_from_gguf(const gguf_file *f, char *err);

/* The pre-tokenizer alone (for tests): splits text[0..len) into pieces; calls fn for each
 * piece in order. Returns 0 / -1 with err. */
int tokenizer_pretokenize(const dsf_tokenizer *tok, const char *text, size_t len,
                          void (*fn)(void *ud, const char *piece, size_t n), void *ud, char *err);

#endif
