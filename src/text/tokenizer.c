/* tokenizer.c: DeepSeek-V3/V4.1 byte-level BPE tokenizer (GGUF tokenizer.ggml.*).
 *
 * Owns: the vocabulary (id <-> string, token types, the bytes each token stands for), the
 * merge ranks, the added-token matcher, the DeepSeek pre-tokenizer (PCRE2), BPE, and
 * UTF-8-safe (streaming) detokenization. Holds no model state and no mutable state after
 * tokenizer_build(): encode/decode allocate their scratch per call, so one tokenizer can
 * serve several threads.
 *
 * The pipeline of Hugging Face's tokenizer.json for DeepSeek-V3 (no normalizer):
 *   1. added tokens are cut out of the text first, leftmost-longest (HF AddedVocabulary);
 *      CONTROL tokens only when parse_special, USER_DEFINED always (as llama.cpp does);
 *   2. the rest goes through three Split(Isolated) regexes in sequence: each splits every
 *      piece of the previous one into matches and the gaps between them;
 *   3. ByteLevel (use_regex=false): each byte becomes its GPT-2 unicode stand-in;
 *   4. BPE per piece: repeatedly merge the adjacent pair with the lowest merge rank
 *      (leftmost on ties), as HF's BPE::merge_all.
 *
 * Pre-tokenizer choice (tokenizer.ggml.pre): only "deepseek-v3" (and "joyai-llm", which
 * llama.cpp maps to the same regexes) is accepted; anything else is refused with an error
 * rather than silently falling back to GPT-2's regex, because a different split gives ids
 * the model never saw.
 *
 * The regexes are tokenizer.json's, with \s / \S spelled out as the Unicode White_Space
 * property (what Oniguruma, HF's Rust regex engine, and @huggingface/tokenizers' rewrite
 * both use; PCRE2's UCP \s differs at U+0085). */
#include "text/tokenizer.h"
#include "base/util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== the DeepSeek-V3 pre-tokenizer ===================================================== */

#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"

static const char *const ds3_patterns[3] = {
    "\\p{N}{1,3}",
    /* [一-龥぀-ゟ゠-ヿ]+ : U+4E00-U+9FA5, U+3040-U+309F, U+30A0-U+30FF */
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
     "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
     "| ?[\\p{P}\\p{S}]+[\\r\\n]*"
     "|[" WS "]*[\\r\\n]+"
     "|[" WS "]+(?![^" WS "])"
     "|[" WS "]+"),
};
#define N_PRE 3

/* ==== tables ============================================================================ */

typedef struct {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} merge_slot;

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
};

/* GPT-2's byte <-> unicode map: printable latin-1 bytes stand for themselves, the other 68
 * bytes are moved to U+0100.. in byte order. */
static void byte_unicode_map(uint32_t cp_of_byte[256]) {
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of_byte[b] = keep ? (uint32_t)b : (uint32_t)next++;
    }
}

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Classifies the UTF-8 sequence at s[0..n) (n >= 1) per Unicode Table 3-7.
 * Returns the length of a complete well-formed character (> 0); or 0 when s is a proper
 * prefix of one that the end of the buffer cut off; or -k for an ill-formed sequence whose
 * maximal subpart is k bytes (k >= 1, to be replaced by one U+FFFD). */
static int utf8_class(const uint8_t *s, size_t n, uint32_t *cp) {
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

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static int32_t vocab_find(const dsf_tokenizer *tok, const char *s, size_t n) {
    uint64_t h = fnv1a(s, n) & tok->vhash_mask;
    for (;;) {
        int32_t id = tok->vhash[h];
        if (id < 0) return -1;
        if (tok->str_len[id] == n && memcmp(tok->str_arena + tok->str_off[id], s, n) == 0)
            return id;
        h = (h + 1) & tok->vhash_mask;
    }
}

static const merge_slot *merge_find(const dsf_tokenizer *tok, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = mix64(key) & tok->mhash_mask;
    for (;;) {
        const merge_slot *m = &tok->mhash[h];
        if (m->key == UINT64_MAX) return NULL;
        if (m->key == key) return m;
        h = (h + 1) & tok->mhash_mask;
    }
}

/* ==== construction ====================================================================== */

void dsf_tokenizer_free(dsf_tokenizer *tok) {
    if (!tok) return;
    free(tok->str_arena);
    free(tok->str_off);
    free(tok->str_len);
    free(tok->byte_arena);
    free(tok->byte_off);
    free(tok->byte_len);
    free(tok->types);
    free(tok->vhash);
    free(tok->mhash);
    free(tok->sp_ids);
    for (int i = 0; i < N_PRE; i++) pcre2_code_free(tok->re[i]);
    free(tok);
}

/* Added tokens: by first byte, then longest first, then lowest id (qsort_r, ctx = tokenizer). */
static int sp_cmp(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const dsf_tokenizer *t = ctx;
    uint8_t fx = (uint8_t)t->str_arena[t->str_off[x]], fy = (uint8_t)t->str_arena[t->str_off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->str_len[x] != t->str_len[y]) return t->str_len[x] > t->str_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static bool is_added_type(int32_t ty) {
    return ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED;
}

/* The largest vocabulary we accept (GGUF arrays hold at most 2^30 elements). */
#define MAX_VOCAB (1u << 30)

dsf_tokenizer *tokenizer_build(const tokenizer_spec *sp, char *err) {
    if (!sp->model || strcmp(sp->model, "gpt2")) {
        dsf_seterr(err, "tokenizer.ggml.model '%s' is not supported (only gpt2 byte-level BPE)",
                   sp->model ? sp->model : "(absent)");
        return NULL;
    }
    if (!sp->pre || (strcmp(sp->pre, "deepseek-v3") && strcmp(sp->pre, "joyai-llm"))) {
        dsf_seterr(err, "tokenizer.ggml.pre '%s' is not supported (only deepseek-v3)",
                   sp->pre ? sp->pre : "(absent)");
        return NULL;
    }
    if (sp->n_tokens == 0 || sp->n_tokens >= MAX_VOCAB) {
        dsf_seterr(err, "tokenizer.ggml.tokens: %llu tokens (need 1..%u)",
                   (unsigned long long)sp->n_tokens, MAX_VOCAB - 1);
        return NULL;
    }
    dsf_tokenizer *tok = dsf_xcalloc(1, sizeof *tok);
    int32_t n = (int32_t)sp->n_tokens;
    tok->n_vocab = n;
    tok->bos = tok->eos = tok->pad = -1;

    /* Strings. */
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (sp->token_lens[i] > UINT32_MAX / 4 || !dsf_add_ok(total, sp->token_lens[i] + 1, &total)) {
            dsf_seterr(err, "tokenizer.ggml.tokens[%d]: too long", i);
            goto fail;
        }
        if (memchr(sp->tokens[i], 0, sp->token_lens[i])) {
            dsf_seterr(err, "tokenizer.ggml.tokens[%d]: contains a NUL byte", i);
            goto fail;
        }
    }
    tok->str_arena = malloc(total ? total : 1);
    tok->str_off = malloc((size_t)n * sizeof *tok->str_off);
    tok->str_len = malloc((size_t)n * sizeof *tok->str_len);
    tok->types = malloc((size_t)n * sizeof *tok->types);
    if (!tok->str_arena || !tok->str_off || !tok->str_len || !tok->types) {
        dsf_seterr(err, "tokenizer: out of memory for %d tokens", n);
        goto fail;
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        memcpy(tok->str_arena + off, sp->tokens[i], sp->token_lens[i]);
        tok->str_arena[off + sp->token_lens[i]] = 0;
        tok->str_off[i] = off;
        tok->str_len[i] = (uint32_t)sp->token_lens[i];
        off += sp->token_lens[i] + 1;
        int32_t ty = sp->token_types ? sp->token_types[i] : TOKEN_TYPE_NORMAL;
        if (ty < TOKEN_TYPE_NORMAL || ty > TOKEN_TYPE_BYTE) {
            dsf_seterr(err, "tokenizer.ggml.token_type[%d] = %d is not a token type", i, ty);
            goto fail;
        }
        tok->types[i] = ty;
    }

    /* String -> id. */
    uint64_t cap = pow2_at_least((uint64_t)n * 2);
    tok->vhash = malloc(cap * sizeof *tok->vhash);
    if (!tok->vhash) {
        dsf_seterr(err, "tokenizer: out of memory");
        goto fail;
    }
    memset(tok->vhash, 0xff, cap * sizeof *tok->vhash);
    tok->vhash_mask = cap - 1;
    for (int32_t i = 0; i < n; i++) {
        const char *s = tok->str_arena + tok->str_off[i];
        int32_t prev = vocab_find(tok, s, tok->str_len[i]);
        if (prev >= 0) {
            dsf_seterr(err, "tokenizer.ggml.tokens: '%s' appears twice (ids %d and %d)", s, prev, i);
            goto fail;
        }
        uint64_t h = fnv1a(s, tok->str_len[i]) & tok->vhash_mask;
        while (tok->vhash[h] >= 0) h = (h + 1) & tok->vhash_mask;
        tok->vhash[h] = i;
    }

    /* Bytes of each token: byte-level decoding for normal tokens, the text for added ones. */
    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[324]; /* the map's code points are all < 324 */
    byte_unicode_map(cp_of_byte);
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    tok->byte_arena = malloc(total ? total : 1); /* decoded bytes are never longer */
    tok->byte_off = malloc((size_t)n * sizeof *tok->byte_off);
    tok->byte_len = malloc((size_t)n * sizeof *tok->byte_len);
    if (!tok->byte_arena || !tok->byte_off || !tok->byte_len) {
        dsf_seterr(err, "tokenizer: out of memory");
        goto fail;
    }
    off = 0;
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)tok->str_arena + tok->str_off[i];
        size_t len = tok->str_len[i], o0 = off;
        tok->byte_off[i] = off;
        if (tok->types[i] == TOKEN_TYPE_NORMAL || tok->types[i] == TOKEN_TYPE_BYTE) {
            for (size_t k = 0; k < len;) {
                uint32_t cp = 0;
                int c = utf8_class(s + k, len - k, &cp);
                if (c > 0 && cp < 324 && byte_of_cp[cp] >= 0) {
                    tok->byte_arena[off++] = (char)byte_of_cp[cp];
                    k += (size_t)c;
                } else { /* not a byte-level character: keep it verbatim */
                    size_t m = c > 0 ? (size_t)c : c < 0 ? (size_t)-c : len - k;
                    memcpy(tok->byte_arena + off, s + k, m);
                    off += m;
                    k += m;
                }
            }
        } else if (tok->types[i] != TOKEN_TYPE_UNUSED) {
            memcpy(tok->byte_arena + off, s, len);
            off += len;
        }
        tok->byte_len[i] = (uint32_t)(off - o0);
        if (tok->byte_len[i] > tok->max_bytes) tok->max_bytes = tok->byte_len[i];
    }

    /* Single-byte tokens. */
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t m = utf8_put(u, cp_of_byte[b]);
        tok->byte_id[b] = vocab_find(tok, u, m);
        if (tok->byte_id[b] < 0) {
            dsf_seterr(err, "tokenizer: the byte-level vocabulary has no token for byte 0x%02x", b);
            goto fail;
        }
    }

    /* Merge ranks. */
    if (sp->n_merges >= MAX_VOCAB) {
        dsf_seterr(err, "tokenizer.ggml.merges: too many (%llu)", (unsigned long long)sp->n_merges);
        goto fail;
    }
    cap = pow2_at_least(sp->n_merges * 2 + 2);
    tok->mhash = malloc(cap * sizeof *tok->mhash);
    if (!tok->mhash) {
        dsf_seterr(err, "tokenizer: out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < cap; i++) tok->mhash[i].key = UINT64_MAX;
    tok->mhash_mask = cap - 1;
    {
        dsf_buf cat = {0};
        for (uint64_t r = 0; r < sp->n_merges; r++) {
            const char *m = sp->merges[r];
            size_t ml = sp->merge_lens[r];
            /* split at the first space after the first byte (as llama.cpp does) */
            const char *sp1 = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
            if (!sp1) {
                dsf_buf_free(&cat);
                dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s' is not \"a b\"",
                           (unsigned long long)r, (int)(ml > 64 ? 64 : ml), m);
                goto fail;
            }
            size_t la = (size_t)(sp1 - m), lb = ml - la - 1;
            int32_t a = vocab_find(tok, m, la), b = vocab_find(tok, sp1 + 1, lb);
            cat.len = 0;
            dsf_buf_append(&cat, m, la);
            dsf_buf_append(&cat, sp1 + 1, lb);
            int32_t ab = vocab_find(tok, (const char *)cat.data, cat.len);
            if (a < 0 || b < 0 || ab < 0) {
                dsf_buf_free(&cat);
                dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s': %s is not a token",
                           (unsigned long long)r, (int)(ml > 64 ? 64 : ml), m,
                           a < 0 ? "the left part" : b < 0 ? "the right part" : "the result");
                goto fail;
            }
            /* BPE works on byte-level text: a merge into an added or unused token (whose
             * bytes are its literal text, or nothing) would decode to other bytes than it
             * encoded (the real vocabularies have none) */
            if (tok->types[ab] != TOKEN_TYPE_NORMAL && tok->types[ab] != TOKEN_TYPE_BYTE) {
                dsf_buf_free(&cat);
                dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s': the result is a token of type %d, not a "
                           "normal (byte-level) token", (unsigned long long)r, (int)(ml > 64 ? 64 : ml), m,
                           tok->types[ab]);
                goto fail;
            }
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            uint64_t h = mix64(key) & tok->mhash_mask;
            while (tok->mhash[h].key != UINT64_MAX && tok->mhash[h].key != key)
                h = (h + 1) & tok->mhash_mask;
            if (tok->mhash[h].key == key) continue; /* a repeated merge keeps its first rank */
            tok->mhash[h].key = key;
            tok->mhash[h].rank = (int32_t)r;
            tok->mhash[h].result = ab;
        }
        dsf_buf_free(&cat);
    }

    /* Added tokens. */
    {
        uint32_t n_sp = 0;
        for (int32_t i = 0; i < n; i++)
            if (is_added_type(tok->types[i]) && tok->str_len[i] > 0) n_sp++;
        tok->sp_ids = dsf_xmalloc((n_sp ? n_sp : 1) * sizeof *tok->sp_ids);
        n_sp = 0;
        for (int32_t i = 0; i < n; i++)
            if (is_added_type(tok->types[i]) && tok->str_len[i] > 0) tok->sp_ids[n_sp++] = i;
        qsort_r(tok->sp_ids, n_sp, sizeof *tok->sp_ids, sp_cmp, tok);
        uint32_t k = 0;
        for (int b = 0; b < 256; b++) {
            tok->sp_start[b] = k;
            while (k < n_sp && (uint8_t)tok->str_arena[tok->str_off[tok->sp_ids[k]]] == b) k++;
        }
        tok->sp_start[256] = k;
    }

    /* Special ids. */
    int64_t ids[3] = {sp->bos, sp->eos, sp->pad};
    const char *names[3] = {"bos", "eos", "padding"};
    for (int k = 0; k < 3; k++) {
        if (ids[k] >= n) {
            dsf_seterr(err, "tokenizer.ggml.%s_token_id = %lld is outside the vocabulary (%d)",
                       names[k], (long long)ids[k], n);
            goto fail;
        }
    }
    tok->bos = (int32_t)(sp->bos < 0 ? -1 : sp->bos);
    tok->eos = (int32_t)(sp->eos < 0 ? -1 : sp->eos);
    tok->pad = (int32_t)(sp->pad < 0 ? -1 : sp->pad);
    tok->add_bos = sp->add_bos;

    /* Regexes. */
    for (int i = 0; i < N_PRE; i++) {
        int ec;
        PCRE2_SIZE eo;
        tok->re[i] = pcre2_compile((PCRE2_SPTR)ds3_patterns[i], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        if (!tok->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            dsf_seterr(err, "tokenizer: pre-tokenizer regex %d: %s at %zu", i, (char *)msg,
                       (size_t)eo);
            goto fail;
        }
        (void)pcre2_jit_compile(tok->re[i], PCRE2_JIT_COMPLETE); /* interpreter if no JIT */
    }
    return tok;

fail:
    dsf_err_oneline(err); /* token and merge texts in messages come from the file */
    dsf_tokenizer_free(tok);
    return NULL;
}

/* Reads an optional UINT32 token id key: -1 if absent. */
static int get_id(const gguf_file *f, const char *key, int64_t *out, char *err) {
    uint32_t v;
    int r = gguf_get_u32(f, key, &v, err);
    if (r < 0) return -1;
    *out = r == 0 ? (int64_t)v : -1;
    return 0;
}

dsf_tokenizer *tokenizer_from_gguf(const gguf_file *f, char *err) {
    tokenizer_spec sp;
    memset(&sp, 0, sizeof sp);
    char *model = NULL, *pre = NULL;
    int32_t *types = NULL;
    const char **toks = NULL, **merges = NULL;
    uint64_t *tlens = NULL, *mlens = NULL;
    dsf_tokenizer *tok = NULL;

    int rm = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (rm < 0) goto done;
    if (rm > 0) {
        dsf_seterr(err, "tokenizer.ggml.model is missing (the file has no tokenizer)");
        goto done;
    }
    if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, err) < 0) goto done;
    const gguf_kv *kt = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!kt || kt->type != GGUF_VT_ARRAY || kt->arr_type != GGUF_VT_STRING || !kt->strs) {
        dsf_seterr(err, "tokenizer.ggml.tokens: %s", kt ? "not an array of strings" : "missing");
        goto done;
    }
    uint64_t n = kt->arr_n;
    if (n == 0 || n >= MAX_VOCAB) {
        dsf_seterr(err, "tokenizer.ggml.tokens: %llu entries", (unsigned long long)n);
        goto done;
    }
    uint64_t nty = 0;
    int r = gguf_get_arr_i32(f, "tokenizer.ggml.token_type", &types, &nty, err);
    if (r < 0) goto done;
    if (r == 0 && nty != n) {
        dsf_seterr(err, "tokenizer.ggml.token_type has %llu entries, tokens has %llu",
                   (unsigned long long)nty, (unsigned long long)n);
        goto done;
    }
    const gguf_kv *km = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!km || km->type != GGUF_VT_ARRAY || km->arr_type != GGUF_VT_STRING || !km->strs) {
        dsf_seterr(err, "tokenizer.ggml.merges: %s",
                   km ? "not an array of strings" : "missing (cannot find tokenizer merges)");
        goto done;
    }
    toks = dsf_xmalloc(n * sizeof *toks);
    tlens = dsf_xmalloc(n * sizeof *tlens);
    for (uint64_t i = 0; i < n; i++) {
        toks[i] = kt->strs[i].ptr;
        tlens[i] = kt->strs[i].len;
    }
    uint64_t nm = km->arr_n;
    merges = dsf_xmalloc((nm ? nm : 1) * sizeof *merges);
    mlens = dsf_xmalloc((nm ? nm : 1) * sizeof *mlens);
    for (uint64_t i = 0; i < nm; i++) {
        merges[i] = km->strs[i].ptr;
        mlens[i] = km->strs[i].len;
    }
    sp.model = model;
    sp.pre = pre;
    sp.n_tokens = n;
    sp.tokens = toks;
    sp.token_lens = tlens;
    sp.token_types = types;
    sp.n_merges = nm;
    sp.merges = merges;
    sp.merge_lens = mlens;
    if (get_id(f, "tokenizer.ggml.bos_token_id", &sp.bos, err) ||
        get_id(f, "tokenizer.ggml.eos_token_id", &sp.eos, err) ||
        get_id(f, "tokenizer.ggml.padding_token_id", &sp.pad, err))
        goto done;
    bool ab = false;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &ab, err) < 0) goto done;
    sp.add_bos = ab;
    tok = tokenizer_build(&sp, err);

done:
    free(model);
    free(pre);
    free(types);
    free(toks);
    free(tlens);
    free(merges);
    free(mlens);
    return tok;
}

dsf_tokenizer *dsf_tokenizer_load(const char *gguf_path, char *err) {
    gguf_file *f = gguf_open(gguf_path, err);
    if (!f) return NULL;
    dsf_tokenizer *tok = tokenizer_from_gguf(f, err);
    if (!tok) dsf_prefixerr(err, "%s", gguf_path);
    gguf_close(f);
    return tok;
}

/* ==== lookups =========================================================================== */

int dsf_tokenizer_n_vocab(const dsf_tokenizer *tok) { return tok->n_vocab; }
int32_t dsf_tokenizer_bos(const dsf_tokenizer *tok) { return tok->bos; }
int32_t dsf_tokenizer_eos(const dsf_tokenizer *tok) { return tok->eos; }
int32_t dsf_tokenizer_pad(const dsf_tokenizer *tok) { return tok->pad; }
bool dsf_tokenizer_add_bos(const dsf_tokenizer *tok) { return tok->add_bos; }

const char *dsf_token_str(const dsf_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    return tok->str_arena + tok->str_off[id];
}

int32_t dsf_token_id(const dsf_tokenizer *tok, const char *text) {
    if (!text) return -1;
    return vocab_find(tok, text, strlen(text));
}

int dsf_token_type(const dsf_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return -1;
    return tok->types[id];
}

const char *dsf_token_bytes(const dsf_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tok->byte_len[id];
    return tok->byte_arena + tok->byte_off[id];
}

/* ==== encoding ========================================================================== */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ids_vec;

static void ids_push(ids_vec *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->v = dsf_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

/* Per-call word cache: word bytes -> the ids BPE produced (ids stored in `pool`). */
typedef struct {
    uint64_t hash;
    size_t word_off, word_len; /* into words */
    size_t ids_off, ids_n;     /* into pool */
    bool used;
} cache_slot;

#define CACHE_MAX_WORD 128 /* longer words are not cached */

typedef struct { int32_t rank; int32_t pos; } heap_ent;

typedef struct {
    const dsf_tokenizer *tok;
    pcre2_match_data *md[N_PRE];
    ids_vec out;
    /* BPE scratch */
    int32_t *sym, *prv, *nxt;
    heap_ent *heap;
    size_t sym_cap, heap_cap, heap_n;
    /* cache */
    cache_slot *slots;
    size_t slots_cap, slots_used;
    dsf_buf words;
    ids_vec pool;
    char *err;
    int failed;
} enc_state;

static bool heap_less(heap_ent a, heap_ent b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(enc_state *st, int32_t rank, int32_t pos) {
    if (st->heap_n == st->heap_cap) {
        st->heap_cap = st->heap_cap ? st->heap_cap * 2 : 64;
        st->heap = dsf_xrealloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    size_t i = st->heap_n++;
    heap_ent e = {rank, pos};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, st->heap[p])) break;
        st->heap[i] = st->heap[p];
        i = p;
    }
    st->heap[i] = e;
}

static heap_ent heap_pop(enc_state *st) {
    heap_ent top = st->heap[0], last = st->heap[--st->heap_n];
    size_t i = 0, n = st->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(st->heap[c + 1], st->heap[c])) c++;
        if (!heap_less(st->heap[c], last)) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (n) st->heap[i] = last;
    return top;
}

static void try_pair(enc_state *st, int32_t pos) {
    int32_t r = st->nxt[pos];
    if (r < 0) return;
    const merge_slot *m = merge_find(st->tok, st->sym[pos], st->sym[r]);
    if (m) heap_push(st, m->rank, pos);
}

/* BPE of one pre-tokenized piece; appends its ids to dst. */
static void bpe_word(enc_state *st, const uint8_t *w, size_t n, ids_vec *dst) {
    if (n > st->sym_cap) {
        st->sym_cap = n * 2;
        st->sym = dsf_xrealloc(st->sym, st->sym_cap * sizeof *st->sym);
        st->prv = dsf_xrealloc(st->prv, st->sym_cap * sizeof *st->prv);
        st->nxt = dsf_xrealloc(st->nxt, st->sym_cap * sizeof *st->nxt);
    }
    for (size_t i = 0; i < n; i++) {
        st->sym[i] = st->tok->byte_id[w[i]];
        st->prv[i] = (int32_t)i - 1;
        st->nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    st->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(st, (int32_t)i);
    while (st->heap_n) {
        heap_ent e = heap_pop(st);
        int32_t p = e.pos, r = st->nxt[p];
        if (st->sym[p] < 0 || r < 0) continue; /* merged away, or no right neighbour */
        const merge_slot *m = merge_find(st->tok, st->sym[p], st->sym[r]);
        if (!m || m->rank != e.rank) continue; /* stale entry */
        st->sym[p] = m->result;
        st->sym[r] = -1;
        st->nxt[p] = st->nxt[r];
        if (st->nxt[r] >= 0) st->prv[st->nxt[r]] = p;
        if (st->prv[p] >= 0) try_pair(st, st->prv[p]);
        try_pair(st, p);
    }
    for (int32_t i = 0; i >= 0; i = st->nxt[i]) ids_push(dst, st->sym[i]);
}

static void encode_word(enc_state *st, const uint8_t *w, size_t n) {
    if (n == 0) return;
    if (n > CACHE_MAX_WORD) {
        bpe_word(st, w, n, &st->out);
        return;
    }
    if (st->slots_used * 2 >= st->slots_cap) { /* grow (or start) the cache */
        size_t ncap = st->slots_cap ? st->slots_cap * 2 : 1024;
        cache_slot *ns = dsf_xcalloc(ncap, sizeof *ns);
        for (size_t i = 0; i < st->slots_cap; i++) {
            if (!st->slots[i].used) continue;
            size_t h = st->slots[i].hash & (ncap - 1);
            while (ns[h].used) h = (h + 1) & (ncap - 1);
            ns[h] = st->slots[i];
        }
        free(st->slots);
        st->slots = ns;
        st->slots_cap = ncap;
    }
    uint64_t hv = fnv1a(w, n);
    size_t h = hv & (st->slots_cap - 1);
    while (st->slots[h].used) {
        cache_slot *c = &st->slots[h];
        if (c->hash == hv && c->word_len == n && memcmp(st->words.data + c->word_off, w, n) == 0) {
            for (size_t i = 0; i < c->ids_n; i++) ids_push(&st->out, st->pool.v[c->ids_off + i]);
            return;
        }
        h = (h + 1) & (st->slots_cap - 1);
    }
    cache_slot *c = &st->slots[h];
    c->used = true;
    c->hash = hv;
    c->word_off = st->words.len;
    c->word_len = n;
    dsf_buf_append(&st->words, w, n);
    c->ids_off = st->pool.n;
    bpe_word(st, w, n, &st->pool);
    c->ids_n = st->pool.n - c->ids_off;
    st->slots_used++;
    for (size_t i = 0; i < c->ids_n; i++) ids_push(&st->out, st->pool.v[c->ids_off + i]);
}

typedef void (*piece_fn)(void *ud, const char *piece, size_t n);

/* Applies regex `level` to s[0..n): every match and every gap between matches goes on to
 * the next level (HF Split, behavior Isolated); after the last level, fn(piece). */
static int split_level(enc_state *st, int level, const char *s, size_t n, piece_fn fn, void *ud) {
    if (n == 0) return 0;
    if (level == N_PRE) {
        fn(ud, s, n);
        return 0;
    }
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_match(st->tok->re[level], (PCRE2_SPTR)s, n, pos, 0, st->md[level], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dsf_seterr(st->err, "tokenizer: pre-tokenizer regex %d failed: %s", level,
                              (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md[level]);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match (impossible with these patterns): step one byte */
            pos = ms + 1;
            continue;
        }
        if (ms > gap && split_level(st, level + 1, s + gap, ms - gap, fn, ud)) return -1;
        if (split_level(st, level + 1, s + ms, me - ms, fn, ud)) return -1;
        gap = pos = me;
    }
    if (n > gap && split_level(st, level + 1, s + gap, n - gap, fn, ud)) return -1;
    return 0;
}

static void piece_to_ids(void *ud, const char *piece, size_t n) {
    encode_word(ud, (const uint8_t *)piece, n);
}

static void enc_init(enc_state *st, const dsf_tokenizer *tok, char *err) {
    memset(st, 0, sizeof *st);
    st->tok = tok;
    st->err = err;
    for (int i = 0; i < N_PRE; i++) st->md[i] = pcre2_match_data_create_from_pattern(tok->re[i], NULL);
}

static void enc_free(enc_state *st) {
    for (int i = 0; i < N_PRE; i++) pcre2_match_data_free(st->md[i]);
    free(st->sym);
    free(st->prv);
    free(st->nxt);
    free(st->heap);
    free(st->slots);
    dsf_buf_free(&st->words);
    free(st->pool.v);
}

int tokenizer_pretokenize(const dsf_tokenizer *tok, const char *text, size_t len,
                          void (*fn)(void *ud, const char *piece, size_t n), void *ud, char *err) {
    enc_state st;
    enc_init(&st, tok, err);
    for (int i = 0; i < N_PRE; i++)
        if (!st.md[i]) {
            enc_free(&st);
            return dsf_seterr(err, "tokenizer: out of memory");
        }
    int rc = split_level(&st, 0, text, len, fn, ud);
    enc_free(&st);
    return rc;
}

/* The longest added token matching text at s[0..n), or -1. */
static int32_t match_added(const dsf_tokenizer *tok, const char *s, size_t n, bool parse_special) {
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = tok->sp_start[b]; k < tok->sp_start[b + 1]; k++) {
        int32_t id = tok->sp_ids[k];
        if (tok->types[id] == TOKEN_TYPE_CONTROL && !parse_special) continue;
        uint32_t l = tok->str_len[id];
        if (l <= n && memcmp(s, tok->str_arena + tok->str_off[id], l) == 0) return id;
    }
    return -1;
}

int dsf_tokenize(const dsf_tokenizer *tok, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **out, size_t *n_out, char *err) {
    *out = NULL;
    *n_out = 0;
    if (!text && len) return dsf_seterr(err, "tokenize: NULL text");
    if (add_bos && tok->bos < 0)
        return dsf_seterr(err, "tokenize: BOS requested but the tokenizer has no bos_token_id");
    enc_state st;
    enc_init(&st, tok, err);
    for (int i = 0; i < N_PRE; i++)
        if (!st.md[i]) {
            enc_free(&st);
            return dsf_seterr(err, "tokenizer: out of memory");
        }
    if (add_bos) ids_push(&st.out, tok->bos);
    size_t seg = 0;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t id = tok->sp_start[(uint8_t)text[i]] < tok->sp_start[(uint8_t)text[i] + 1]
                         ? match_added(tok, text + i, len - i, parse_special)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        rc = split_level(&st, 0, text + seg, i - seg, piece_to_ids, &st);
        ids_push(&st.out, id);
        i += tok->str_len[id];
        seg = i;
    }
    if (rc == 0) rc = split_level(&st, 0, text + seg, len - seg, piece_to_ids, &st);
    if (rc == 0) {
        *out = st.out.v ? st.out.v : dsf_xmalloc(sizeof(int32_t));
        *n_out = st.out.n;
        st.out.v = NULL;
    }
    free(st.out.v);
    enc_free(&st);
    return rc;
}

/* ==== decoding ========================================================================== */

struct dsf_detok {
    const dsf_tokenizer *tok;
    bool render_special;
    uint8_t held[4];
    size_t n_held;
    dsf_buf out;
};

dsf_detok *dsf_detok_new(const dsf_tokenizer *tok, bool render_special) {
    dsf_detok *d = dsf_xcalloc(1, sizeof *d);
    d->tok = tok;
    d->render_special = render_special;
    /* worst case: every byte of held + piece becomes a 3-byte U+FFFD */
    dsf_buf_reserve(&d->out, 3 * ((size_t)tok->max_bytes + 4) + 1);
    return d;
}

void dsf_detok_free(dsf_detok *d) {
    if (!d) return;
    dsf_buf_free(&d->out);
    free(d);
}

static void put_fffd(dsf_buf *b) { dsf_buf_append(b, "\xEF\xBF\xBD", 3); }

/* Appends the valid UTF-8 of held + p[0..n) to d->out; keeps an unfinished tail in held. */
static void detok_feed(dsf_detok *d, const uint8_t *p, size_t n) {
    uint8_t tmp[8];
    size_t i = 0;
    /* First complete (or reject) the held prefix with bytes from p. */
    while (d->n_held) {
        size_t m = d->n_held;
        memcpy(tmp, d->held, m);
        size_t take = n - i < 4 - m ? n - i : 4 - m;
        memcpy(tmp + m, p + i, take);
        int c = utf8_class(tmp, m + take, NULL);
        if (c == 0) { /* still incomplete: p is exhausted */
            memcpy(d->held + m, p + i, take);
            d->n_held += take;
            return;
        }
        size_t used = c > 0 ? (size_t)c : (size_t)-c;
        if (c > 0) dsf_buf_append(&d->out, tmp, used);
        else put_fffd(&d->out);
        if (used >= m) { /* consumed all held bytes and used - m of p */
            i += used - m;
            d->n_held = 0;
        } else { /* the maximal subpart ended inside held: re-examine the rest */
            memmove(d->held, d->held + used, m - used);
            d->n_held = m - used;
        }
    }
    while (i < n) {
        size_t run = i;
        while (run < n && p[run] < 0x80) run++;
        if (run > i) {
            dsf_buf_append(&d->out, p + i, run - i);
            i = run;
            continue;
        }
        int c = utf8_class(p + i, n - i, NULL);
        if (c > 0) {
            dsf_buf_append(&d->out, p + i, (size_t)c);
            i += (size_t)c;
        } else if (c < 0) {
            put_fffd(&d->out);
            i += (size_t)-c;
        } else {
            memcpy(d->held, p + i, n - i);
            d->n_held = n - i;
            return;
        }
    }
}

int dsf_detok_push(dsf_detok *d, int32_t id, const char **text, size_t *len, char *err) {
    d->out.len = 0;
    *text = "";
    *len = 0;
    if (id < 0 || id >= d->tok->n_vocab)
        return dsf_seterr(err, "detokenize: token id %d outside the vocabulary (%d)", id,
                          d->tok->n_vocab);
    if (d->tok->types[id] != TOKEN_TYPE_CONTROL || d->render_special)
        detok_feed(d, (const uint8_t *)d->tok->byte_arena + d->tok->byte_off[id],
                   d->tok->byte_len[id]);
    dsf_buf_append(&d->out, "", 0);
    d->out.data[d->out.len] = 0;
    *text = (const char *)d->out.data;
    *len = d->out.len;
    return 0;
}

void dsf_detok_flush(dsf_detok *d, const char **text, size_t *len) {
    d->out.len = 0;
    /* an unfinished character at the end: each maximal subpart becomes one U+FFFD */
    if (d->n_held) put_fffd(&d->out);
    d->n_held = 0;
    dsf_buf_append(&d->out, "", 0);
    d->out.data[d->out.len] = 0;
    *text = (const char *)d->out.data;
    *len = d->out.len;
}

int dsf_detokenize(const dsf_tokenizer *tok, const int32_t *ids, size_t n, bool render_special,
                   char **out, size_t *out_len, char *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    dsf_detok *d = dsf_detok_new(tok, render_special);
    dsf_buf all = {0};
    const char *t;
    size_t l;
    for (size_t i = 0; i < n; i++) {
        if (dsf_detok_push(d, ids[i], &t, &l, err)) {
            dsf_detok_free(d);
            dsf_buf_free(&all);
            return -1;
        }
        dsf_buf_append(&all, t, l);
    }
    dsf_detok_flush(d, &t, &l);
    dsf_buf_append(&all, t, l);
    dsf_buf_append(&all, "", 1);
    dsf_detok_free(d);
    *out = (char *)all.data;
    if (out_len) *out_len = all.len - 1;
    return 0;
}
