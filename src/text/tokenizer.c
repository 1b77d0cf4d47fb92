/* tokenizer.c: DeepSeek-V3/V4.1 byte-level BPE tokenizer (GGUF tokenizer.ggml.*): building it.
 *
 * Owns: the vocabulary (id <-> string, token types, the bytes each token stands for), the
 * merge ranks, the added-token matcher and the compiled pre-tokenizer, all validated once in
 * tokenizer_build(); the lookups of dsflash.h. Encoding and decoding are in tokenize.c; the
 * tables both halves share are in tokenizer_impl.h.
 * Must not: hold model state, or change anything after tokenizer_build(): encode/decode
 * allocate their scratch per call, so one tokenizer can serve several threads.
 *
 * The pipeline of Hugging Face's tokenizer.json for DeepSeek-V3 (no normalizer):
 *   1. added tokens are cut out of the text first, leftmost-longest (HF AddedVocabulary);
 *      CONTROL tokens only when parse_special, USER_DEFINED always (as llama.cpp does);
 *   2. the rest goes through three Split(Isolated) regexes in sequence: each splits every
 *      piece of the previous one into matches and the gaps between them;
 *   3. ByteLevel (use_regex=false): each byte becomes its GPT-2 unicode stand-in (bytelevel.h);
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
#include "text/tokenizer_impl.h"
#include "base/util.h"
#include "text/bytelevel.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== the DeepSeek-V3 pre-tokenizer ===================================================== */

#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"

static const char *const ds3_patterns[N_PRE] = {
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

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
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
    dsf_tok_cache *c = atomic_load(&tok->cache);
    if (c) c->free(c);
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

/* ---- tokenizer_build, one rule group per function; each returns 0, or -1 with err ------- */

/* Token strings, NUL-checked, copied into one arena (*total: its size); token types checked. */
static int build_strings(dsf_tokenizer *tok, const tokenizer_spec *sp, uint64_t *total_out, char *err) {
    int32_t n = tok->n_vocab;
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (sp->token_lens[i] > UINT32_MAX / 4 || !dsf_add_ok(total, sp->token_lens[i] + 1, &total))
            return dsf_seterr(err, "tokenizer.ggml.tokens[%d]: too long", i);
        if (memchr(sp->tokens[i], 0, sp->token_lens[i]))
            return dsf_seterr(err, "tokenizer.ggml.tokens[%d]: contains a NUL byte", i);
    }
    *total_out = total;
    tok->str_arena = malloc(total ? total : 1);
    tok->str_off = malloc((size_t)n * sizeof *tok->str_off);
    tok->str_len = malloc((size_t)n * sizeof *tok->str_len);
    tok->types = malloc((size_t)n * sizeof *tok->types);
    if (!tok->str_arena || !tok->str_off || !tok->str_len || !tok->types)
        return dsf_seterr(err, "tokenizer: out of memory for %d tokens", n);
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        memcpy(tok->str_arena + off, sp->tokens[i], sp->token_lens[i]);
        tok->str_arena[off + sp->token_lens[i]] = 0;
        tok->str_off[i] = off;
        tok->str_len[i] = (uint32_t)sp->token_lens[i];
        off += sp->token_lens[i] + 1;
        int32_t ty = sp->token_types ? sp->token_types[i] : TOKEN_TYPE_NORMAL;
        if (ty < TOKEN_TYPE_NORMAL || ty > TOKEN_TYPE_BYTE)
            return dsf_seterr(err, "tokenizer.ggml.token_type[%d] = %d is not a token type", i, ty);
        tok->types[i] = ty;
    }
    return 0;
}

/* String -> id; refuses a string that appears twice. */
static int build_string_index(dsf_tokenizer *tok, char *err) {
    int32_t n = tok->n_vocab;
    uint64_t cap = pow2_at_least((uint64_t)n * 2);
    tok->vhash = malloc(cap * sizeof *tok->vhash);
    if (!tok->vhash) return dsf_seterr(err, "tokenizer: out of memory");
    memset(tok->vhash, 0xff, cap * sizeof *tok->vhash);
    tok->vhash_mask = cap - 1;
    for (int32_t i = 0; i < n; i++) {
        const char *s = tok->str_arena + tok->str_off[i];
        int32_t prev = vocab_find(tok, s, tok->str_len[i]);
        if (prev >= 0) return dsf_seterr(err, "tokenizer.ggml.tokens: '%s' appears twice (ids %d and %d)", s, prev, i);
        uint64_t h = fnv1a(s, tok->str_len[i]) & tok->vhash_mask;
        while (tok->vhash[h] >= 0) h = (h + 1) & tok->vhash_mask;
        tok->vhash[h] = i;
    }
    return 0;
}

/* Bytes of each token: byte-level decoding for normal tokens, the text for added ones.
 * total: the size of the string arena (decoded bytes are never longer). */
static int build_token_bytes(dsf_tokenizer *tok, uint64_t total, char *err) {
    int32_t n = tok->n_vocab;
    int16_t byte_of_cp[BYTELEVEL_CP_END];
    for (uint32_t i = 0; i < BYTELEVEL_CP_END; i++) byte_of_cp[i] = (int16_t)bytelevel_byte(i);
    tok->byte_arena = malloc(total ? total : 1);
    tok->byte_off = malloc((size_t)n * sizeof *tok->byte_off);
    tok->byte_len = malloc((size_t)n * sizeof *tok->byte_len);
    if (!tok->byte_arena || !tok->byte_off || !tok->byte_len) return dsf_seterr(err, "tokenizer: out of memory");
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)tok->str_arena + tok->str_off[i];
        size_t len = tok->str_len[i], o0 = off;
        tok->byte_off[i] = off;
        if (tok->types[i] == TOKEN_TYPE_NORMAL || tok->types[i] == TOKEN_TYPE_BYTE) {
            for (size_t k = 0; k < len;) {
                uint32_t cp = 0;
                int c = utf8_class(s + k, len - k, &cp);
                if (c > 0 && cp < BYTELEVEL_CP_END && byte_of_cp[cp] >= 0) {
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
    return 0;
}

/* The single-byte tokens: every byte must have one. */
static int build_byte_ids(dsf_tokenizer *tok, char *err) {
    for (int b = 0; b < 256; b++) {
        char u[2];
        size_t m = bytelevel_utf8((uint8_t)b, u);
        tok->byte_id[b] = vocab_find(tok, u, m);
        if (tok->byte_id[b] < 0)
            return dsf_seterr(err, "tokenizer: the byte-level vocabulary has no token for byte 0x%02x", b);
    }
    return 0;
}

/* Checks merge r, "a b", and files it under (a, b) unless that pair already has a rank.
 * cat: scratch for the concatenation. */
static int add_merge(dsf_tokenizer *tok, const tokenizer_spec *sp, uint64_t r, dsf_buf *cat, char *err) {
    const char *m = sp->merges[r];
    size_t ml = sp->merge_lens[r];
    /* split at the first space after the first byte (as llama.cpp does) */
    const char *sp1 = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
    if (!sp1)
        return dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s' is not \"a b\"", (unsigned long long)r,
                          (int)(ml > 64 ? 64 : ml), m);
    size_t la = (size_t)(sp1 - m), lb = ml - la - 1;
    int32_t a = vocab_find(tok, m, la), b = vocab_find(tok, sp1 + 1, lb);
    cat->len = 0;
    dsf_buf_append(cat, m, la);
    dsf_buf_append(cat, sp1 + 1, lb);
    int32_t ab = vocab_find(tok, (const char *)cat->data, cat->len);
    if (a < 0 || b < 0 || ab < 0)
        return dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s': %s is not a token", (unsigned long long)r,
                          (int)(ml > 64 ? 64 : ml), m,
                          a < 0 ? "the left part" : b < 0 ? "the right part" : "the result");
    /* BPE works on byte-level text: a merge into an added or unused token (whose
     * bytes are its literal text, or nothing) would decode to other bytes than it
     * encoded (the real vocabularies have none) */
    if (tok->types[ab] != TOKEN_TYPE_NORMAL && tok->types[ab] != TOKEN_TYPE_BYTE)
        return dsf_seterr(err, "tokenizer.ggml.merges[%llu] '%.*s': the result is a token of type %d, not a "
                          "normal (byte-level) token", (unsigned long long)r, (int)(ml > 64 ? 64 : ml), m,
                          tok->types[ab]);
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = mix64(key) & tok->mhash_mask;
    while (tok->mhash[h].key != UINT64_MAX && tok->mhash[h].key != key) h = (h + 1) & tok->mhash_mask;
    if (tok->mhash[h].key == key) return 0; /* a repeated merge keeps its first rank */
    tok->mhash[h].key = key;
    tok->mhash[h].rank = (int32_t)r;
    tok->mhash[h].result = ab;
    return 0;
}

/* Merge ranks: merge r has rank r. */
static int build_merges(dsf_tokenizer *tok, const tokenizer_spec *sp, char *err) {
    if (sp->n_merges >= MAX_VOCAB)
        return dsf_seterr(err, "tokenizer.ggml.merges: too many (%llu)", (unsigned long long)sp->n_merges);
    uint64_t cap = pow2_at_least(sp->n_merges * 2 + 2);
    tok->mhash = malloc(cap * sizeof *tok->mhash);
    if (!tok->mhash) return dsf_seterr(err, "tokenizer: out of memory");
    for (uint64_t i = 0; i < cap; i++) tok->mhash[i].key = UINT64_MAX;
    tok->mhash_mask = cap - 1;
    dsf_buf cat = {0};
    int rc = 0;
    for (uint64_t r = 0; r < sp->n_merges && !rc; r++) rc = add_merge(tok, sp, r, &cat, err);
    dsf_buf_free(&cat);
    return rc;
}

/* Added tokens (non-empty CONTROL / USER_DEFINED), grouped by first byte, longest first. */
static void build_added(dsf_tokenizer *tok) {
    int32_t n = tok->n_vocab;
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

/* bos / eos / padding: inside the vocabulary, or negative for none. */
static int set_special_ids(dsf_tokenizer *tok, const tokenizer_spec *sp, char *err) {
    int64_t ids[3] = {sp->bos, sp->eos, sp->pad};
    const char *names[3] = {"bos", "eos", "padding"};
    for (int k = 0; k < 3; k++) {
        if (ids[k] >= tok->n_vocab)
            return dsf_seterr(err, "tokenizer.ggml.%s_token_id = %lld is outside the vocabulary (%d)", names[k],
                              (long long)ids[k], tok->n_vocab);
    }
    tok->bos = (int32_t)(sp->bos < 0 ? -1 : sp->bos);
    tok->eos = (int32_t)(sp->eos < 0 ? -1 : sp->eos);
    tok->pad = (int32_t)(sp->pad < 0 ? -1 : sp->pad);
    tok->add_bos = sp->add_bos;
    return 0;
}

/* The pre-tokenizer's regexes, JIT-compiled where PCRE2 can. */
static int compile_regexes(dsf_tokenizer *tok, char *err) {
    for (int i = 0; i < N_PRE; i++) {
        int ec;
        PCRE2_SIZE eo;
        tok->re[i] = pcre2_compile((PCRE2_SPTR)ds3_patterns[i], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        if (!tok->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return dsf_seterr(err, "tokenizer: pre-tokenizer regex %d: %s at %zu", i, (char *)msg, (size_t)eo);
        }
        (void)pcre2_jit_compile(tok->re[i], PCRE2_JIT_COMPLETE); /* interpreter if no JIT */
    }
    return 0;
}

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
    tok->n_vocab = (int32_t)sp->n_tokens;
    tok->bos = tok->eos = tok->pad = -1;
    uint64_t total = 0;
    if (build_strings(tok, sp, &total, err) || build_string_index(tok, err) ||
        build_token_bytes(tok, total, err) || build_byte_ids(tok, err) || build_merges(tok, sp, err))
        goto fail;
    build_added(tok);
    if (set_special_ids(tok, sp, err) || compile_regexes(tok, err)) goto fail;
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
