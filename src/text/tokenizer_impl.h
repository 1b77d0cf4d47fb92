/* tokenizer_impl.h: the tokenizer's tables, shared by its two halves and by nothing else:
 * tokenizer.c builds and validates them, tokenize.c encodes and decodes with them.
 *
 * Must not: be included outside src/text/tokenizer*.c and src/text/tokenize.c (the public
 * type is opaque in dsflash.h).
 * Invariant: after tokenizer_build() nothing here is written again, so the lookups below are
 * safe from any number of threads. */
#ifndef DSF_TOKENIZER_IMPL_H
#define DSF_TOKENIZER_IMPL_H

#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#define N_PRE 3 /* the pre-tokenizer's regexes, applied in sequence */

typedef struct {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} merge_slot;

/* A cache attached to a tokenizer (see dsf_tokenizer.cache): embedded first in its owner's
 * struct; free releases the whole owner. */
typedef struct dsf_tok_cache {
    void (*free)(struct dsf_tok_cache *c);
} dsf_tok_cache;

struct dsf_tokenizer {
    int32_t n_vocab;
    char *str_arena;      /* token strings, each NUL-terminated */
    uint64_t *str_off;    /* [n_vocab] */
    uint32_t *str_len;    /* [n_vocab] */
    char *byte_arena;     /* decoded bytes of each token */
    uint64_t *byte_off;   /* [n_vocab] */
    uint32_t *byte_len;   /* [n_vocab] */
    uint32_t max_bytes;   /* longest byte_len */
    int32_t *types;       /* [n_vocab] */

    int32_t *vhash;       /* open addressing over strings; -1 empty */
    uint64_t vhash_mask;

    merge_slot *mhash;
    uint64_t mhash_mask;

    int32_t byte_id[256]; /* the token of each single byte */

    /* added tokens (CONTROL / USER_DEFINED), grouped by first byte, longest first */
    int32_t *sp_ids;
    uint32_t sp_start[257];

    int32_t bos, eos, pad;
    bool add_bos;

    pcre2_code *re[N_PRE];

    /* a cache a higher module builds on first use and attaches here (constrained decoding's
     * byte trie, grammar_vocab.c); freed through its own function pointer, so the tokenizer
     * does not link to that module */
    dsf_tok_cache *_Atomic cache;
};

/* Classifies the UTF-8 sequence at s[0..n) (n >= 1) per Unicode Table 3-7.
 * Returns the length of a complete well-formed character (> 0); or 0 when s is a proper
 * prefix of one that the end of the buffer cut off; or -k for an ill-formed sequence whose
 * maximal subpart is k bytes (k >= 1, to be replaced by one U+FFFD). */
static inline int utf8_class(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { if (cp) *cp = c; return 1; }
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return -1;
    uint32_t v = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return 0;
        uint8_t b = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return -k;
        v = (v << 6) | (b & 0x3F);
    }
    if (cp) *cp = v;
    return len;
}

static inline uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline int32_t vocab_find(const dsf_tokenizer *tok, const char *s, size_t n) {
    uint64_t h = fnv1a(s, n) & tok->vhash_mask;
    for (;;) {
        int32_t id = tok->vhash[h];
        if (id < 0) return -1;
        if (tok->str_len[id] == n && memcmp(tok->str_arena + tok->str_off[id], s, n) == 0)
            return id;
        h = (h + 1) & tok->vhash_mask;
    }
}

static inline const merge_slot *merge_find(const dsf_tokenizer *tok, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = mix64(key) & tok->mhash_mask;
    for (;;) {
        const merge_slot *m = &tok->mhash[h];
        if (m->key == UINT64_MAX) return NULL;
        if (m->key == key) return m;
        h = (h + 1) & tok->mhash_mask;
    }
}

#endif
