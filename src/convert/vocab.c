/* vocab.c: Hugging Face tokenizer files -> the GGUF tokenizer.ggml.* keys, as llama.cpp's
 * converter writes them (gguf-layout.md §2.2: TextModel._set_vocab_gpt2 + SpecialVocab).
 *
 * Owns: parsing tokenizer.json / tokenizer_config.json / config.json (jansson) and adding,
 * in the converter's order, model, pre, tokens, token_type, merges, the special token ids,
 * the add_*_token flags and chat_template. It does not tokenize anything and writes no
 * tensor. The input files are hostile: every id is range-checked, duplicates are refused.
 *
 * The converter's rules reproduced here:
 *   - tokens: index i is id i, over range(vocab_size); ids without a token become
 *     "[PAD{i}]" with type UNUSED (5); model vocab entries are NORMAL (1).
 *   - added tokens (tokenizer.json "added_tokens"): CONTROL (3) when "special" is true or the
 *     text "looks special" (does_token_look_special: "<|...|>", "<｜...｜>", "<pad>", "<mask>",
 *     "<2mass>", "[@BOS@]", "<unused...>"); otherwise USER_DEFINED (4) with every U+2581
 *     replaced by a space. (The converter also round-trips non-normalized added tokens
 *     through the HF normalizer; DeepSeek's tokenizer has no normalizer, so that is the
 *     identity and is not reproduced.)
 *   - merges: "a b" strings as stored; [a, b] pairs are joined with one space after mapping
 *     spaces inside a part to U+0120 (gguf-py SpecialVocab).
 *   - special ids (UINT32): tokenizer_config.json "<typ>_token" (string or {content}) looked
 *     up by content among added_tokens; then config.json "<typ>_token_id" for the types
 *     still unset (then config.json text_config, an extension for multimodal configs).
 *     Ids outside the vocabulary are ignored, as gguf-py does.
 *   - add_<typ>_token (BOOL): only when tokenizer_config.json has a JSON boolean.
 *   - pre: "deepseek-v3" when the pre_tokenizer is DeepSeek-V3's Split sequence; any other
 *     pre-tokenizer is refused (the converter fails with "BPE pre-tokenizer was not
 *     recognized" for unknown hashes; we cannot hash, so we compare the regexes).
 *   - chat_template: tokenizer_config.json "chat_template" string, else chat_template.jinja
 *     beside it; absent otherwise. */
#include "convert/vocab.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

/* The three Split regexes of DeepSeek-V3's tokenizer.json, in order (kept in sync with
 * src/text/tokenizer.c, which hard-codes their PCRE2 translation for pre = "deepseek-v3"). */
static const char *const ds3_regexes[3] = {
    "\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
     " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
};

/* gguf-py SpecialVocab.special_token_types and the GGUF key of each (llama.cpp spells
 * "seperator" that way). */
static const char *const special_types[7] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
static const char *const special_keys[7] = {
    "tokenizer.ggml.bos_token_id",     "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id",
};

/* ---- helpers -------------------------------------------------------------------------- */

/* Loads dir/name as a JSON object into *out. An absent optional file gives *out = NULL and
 * returns 0; an absent required file, a parse error or a non-object returns -1 with err. */
static int load_json(const char *dir, const char *name, bool required, json_t **out, char *err) {
    *out = NULL;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return dsf_seterr(err, "%s/%s: path too long", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return required ? dsf_seterr(err, "%s: cannot open", path) : 0;
    fclose(f);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return dsf_seterr(err, "%s:%d: %s", path, je.line, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return dsf_seterr(err, "%s: top level is not a JSON object", path);
    }
    *out = j;
    return 0;
}

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool has_suffix(const char *s, const char *x) {
    size_t n = strlen(s), m = strlen(x);
    return n >= m && memcmp(s + n - m, x, m) == 0;
}

/* gguf-py TextModel.does_token_look_special. */
static bool looks_special(const char *t) {
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") ||
        !strcmp(t, "[@BOS@]"))
        return true;
    if (has_prefix(t, "<|") && has_suffix(t, "|>") && strlen(t) >= 4) return true;
    /* "<｜" = '<' U+FF5C, "｜>" = U+FF5C '>' (deepseek-coder style) */
    if (has_prefix(t, "<\xef\xbd\x9c") && has_suffix(t, "\xef\xbd\x9c>") && strlen(t) >= 8)
        return true;
    if (has_prefix(t, "<unused") && has_suffix(t, ">")) return true;
    return false;
}

/* Copy of s with every U+2581 (e2 96 81) replaced by ' '. */
static char *lower_blank(const char *s) {
    size_t n = strlen(s);
    char *d = dsf_xmalloc(n + 1), *o = d;
    for (size_t i = 0; i < n;) {
        if (i + 2 < n && (unsigned char)s[i] == 0xe2 && (unsigned char)s[i + 1] == 0x96 &&
            (unsigned char)s[i + 2] == 0x81) {
            *o++ = ' ';
            i += 3;
        } else {
            *o++ = s[i++];
        }
    }
    *o = 0;
    return d;
}

/* Content of a tokenizer_config "<typ>_token" entry (string or {"content": ...}); NULL if none. */
static const char *config_token_content(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

/* True if the pre_tokenizer object is DeepSeek-V3's: Sequence [Split x3 (the regexes above,
 * Isolated), ByteLevel(use_regex=false)]. */
static bool is_deepseek_v3_pre(json_t *pre) {
    if (!json_is_object(pre)) return false;
    json_t *ty = json_object_get(pre, "type");
    json_t *seq = json_object_get(pre, "pretokenizers");
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "Sequence") || !json_is_array(seq))
        return false;
    if (json_array_size(seq) != 4) return false;
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(seq, i);
        json_t *sty = json_object_get(s, "type");
        json_t *pat = json_object_get(s, "pattern");
        json_t *rx = pat ? json_object_get(pat, "Regex") : NULL;
        json_t *beh = json_object_get(s, "behavior");
        json_t *inv = json_object_get(s, "invert");
        if (!json_is_string(sty) || strcmp(json_string_value(sty), "Split")) return false;
        if (!json_is_string(rx) || strcmp(json_string_value(rx), ds3_regexes[i])) return false;
        if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated")) return false;
        if (inv && !json_is_false(inv)) return false;
    }
    json_t *bl = json_array_get(seq, 3);
    json_t *bty = json_object_get(bl, "type");
    json_t *ur = json_object_get(bl, "use_regex");
    if (!json_is_string(bty) || strcmp(json_string_value(bty), "ByteLevel")) return false;
    if (ur && !json_is_false(ur)) return false;
    return true;
}

/* ---- the converter -------------------------------------------------------------------- */

/* Upper bound on the vocabulary (GGUF arrays hold at most 2^30 elements, gguf-layout §1.3). */
#define VOCAB_MAX (1 << 30)

/* What vocab_write_gguf reads, step by step, before writing any key. */
typedef struct {
    json_t *tj, *tc, *cj;          /* tokenizer.json; tokenizer_config.json, config.json or NULL */
    json_t *model, *vocab, *added; /* borrowed from tj: model, model.vocab, added_tokens (or NULL) */
    int64_t n;                     /* vocabulary size */
    char **tokens;                 /* [n] owned copies (NULL for holes until padded) */
    int32_t *types;                /* [n] */
    char **merges;                 /* [n_merges] owned */
    size_t n_merges;
    int64_t special[7];            /* per special_types; -1 = unset */
    char *tmpl;                    /* chat template, or NULL */
} hf_vocab;

static void hf_vocab_free(hf_vocab *v) {
    if (v->tokens)
        for (int64_t i = 0; i < v->n; i++) free(v->tokens[i]);
    free(v->tokens);
    free(v->types);
    for (size_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->merges);
    free(v->tmpl);
    json_decref(v->tj);
    json_decref(v->tc);
    json_decref(v->cj);
}

/* The three files, and tokenizer.json's model (a BPE with a vocab object) and added tokens. */
static int read_files(hf_vocab *v, const char *hf_dir, char *err) {
    if (load_json(hf_dir, "tokenizer.json", true, &v->tj, err) ||
        load_json(hf_dir, "tokenizer_config.json", false, &v->tc, err) ||
        load_json(hf_dir, "config.json", false, &v->cj, err))
        return -1;
    v->model = json_object_get(v->tj, "model");
    if (!json_is_object(v->model)) return dsf_seterr(err, "%s/tokenizer.json: no \"model\" object", hf_dir);
    json_t *mty = json_object_get(v->model, "type");
    if (mty && (!json_is_string(mty) || strcmp(json_string_value(mty), "BPE")))
        return dsf_seterr(err, "%s/tokenizer.json: model type %s is not BPE", hf_dir,
                          json_is_string(mty) ? json_string_value(mty) : "(not a string)");
    v->vocab = json_object_get(v->model, "vocab");
    v->added = json_object_get(v->tj, "added_tokens");
    if (!json_is_object(v->vocab)) return dsf_seterr(err, "%s/tokenizer.json: model.vocab is not an object", hf_dir);
    if (v->added && !json_is_array(v->added))
        return dsf_seterr(err, "%s/tokenizer.json: added_tokens is not an array", hf_dir);
    return 0;
}

/* Vocabulary size: the caller's (the model's), else the largest id + 1; checks every id. */
static int read_size(hf_vocab *v, const char *hf_dir, int64_t vocab_size, char *err) {
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(v->vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= VOCAB_MAX)
            return dsf_seterr(err, "tokenizer.json: vocab entry '%s' has an invalid id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t ia;
    json_t *at;
    json_array_foreach(v->added, ia, at) {
        json_t *id = json_object_get(at, "id");
        json_t *content = json_object_get(at, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= VOCAB_MAX ||
            !json_is_string(content) || !json_string_length(content))
            return dsf_seterr(err, "tokenizer.json: added_tokens[%zu] has an invalid id or content", ia);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return dsf_seterr(err, "%s/tokenizer.json: empty vocabulary", hf_dir);
    if (vocab_size < 0 || vocab_size > VOCAB_MAX)
        return dsf_seterr(err, "vocab_size %lld out of range", (long long)vocab_size);
    v->n = vocab_size > 0 ? vocab_size : max_id + 1;
    if (max_id >= v->n)
        return dsf_seterr(err, "tokenizer.json: token id %lld does not fit the model's vocab_size %lld",
                          (long long)max_id, (long long)v->n);
    return 0;
}

/* Tokens and types: the model vocab, then the added tokens over it, then "[PAD{i}]" holes. */
static int read_tokens(hf_vocab *v, char *err) {
    v->tokens = dsf_xcalloc((size_t)v->n, sizeof *v->tokens);
    v->types = dsf_xcalloc((size_t)v->n, sizeof *v->types);
    const char *key;
    json_t *val;
    json_object_foreach(v->vocab, key, val) {
        int64_t id = json_integer_value(val);
        if (v->tokens[id])
            return dsf_seterr(err, "tokenizer.json: id %lld used by '%s' and '%s'", (long long)id, v->tokens[id], key);
        v->tokens[id] = dsf_xstrdup(key);
        v->types[id] = TT_NORMAL;
    }
    /* Added tokens: their content replaces the vocab string for that id (HF get_vocab). */
    size_t ia;
    json_t *at;
    json_array_foreach(v->added, ia, at) {
        int64_t id = json_integer_value(json_object_get(at, "id"));
        const char *content = json_string_value(json_object_get(at, "content"));
        json_t *sp = json_object_get(at, "special");
        bool special = json_is_true(sp);
        free(v->tokens[id]);
        if (special || looks_special(content)) {
            v->tokens[id] = dsf_xstrdup(content);
            v->types[id] = TT_CONTROL;
        } else {
            v->tokens[id] = lower_blank(content);
            v->types[id] = TT_USER_DEFINED;
        }
    }
    for (int64_t i = 0; i < v->n; i++) {
        if (v->tokens[i]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        v->tokens[i] = dsf_xstrdup(pad);
        v->types[i] = TT_UNUSED;
    }
    return 0;
}

/* Merges: "a b" strings as stored; [a, b] pairs joined (spaces in a part become U+0120). */
static int read_merges(hf_vocab *v, const char *hf_dir, char *err) {
    json_t *jm = json_object_get(v->model, "merges");
    if (!json_is_array(jm) || json_array_size(jm) == 0)
        return dsf_seterr(err, "%s/tokenizer.json: no model.merges (a BPE tokenizer needs them)", hf_dir);
    v->merges = dsf_xcalloc(json_array_size(jm), sizeof *v->merges);
    size_t ia;
    json_t *val;
    json_array_foreach(jm, ia, val) {
        if (json_is_string(val)) {
            const char *s = json_string_value(val);
            if (!strchr(s, ' ')) return dsf_seterr(err, "tokenizer.json: merges[%zu] '%s' is not \"a b\"", ia, s);
            v->merges[v->n_merges++] = dsf_xstrdup(s);
        } else if (json_is_array(val) && json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            dsf_buf b = {0};
            for (int p = 0; p < 2; p++) {
                const char *s = json_string_value(json_array_get(val, (size_t)p));
                if (p) dsf_buf_append(&b, " ", 1);
                for (; *s; s++) {
                    if (*s == ' ') dsf_buf_append(&b, "\xc4\xa0", 2); /* U+0120 */
                    else dsf_buf_append(&b, s, 1);
                }
            }
            dsf_buf_append(&b, "", 1);
            v->merges[v->n_merges++] = (char *)b.data;
        } else {
            return dsf_seterr(err, "tokenizer.json: merges[%zu] is neither \"a b\" nor [a, b]", ia);
        }
    }
    return 0;
}

/* Special ids: tokenizer_config.json "<typ>_token" looked up among the added tokens, then
 * config.json (and its text_config) "<typ>_token_id" for the types still unset. */
static void read_special_ids(hf_vocab *v) {
    for (int t = 0; t < 7; t++) v->special[t] = -1;
    if (v->tc) {
        for (int t = 0; t < 7; t++) {
            char k[32];
            snprintf(k, sizeof k, "%s_token", special_types[t]);
            const char *content = config_token_content(json_object_get(v->tc, k));
            if (!content) continue;
            size_t ia;
            json_t *at;
            json_array_foreach(v->added, ia, at) {
                if (!strcmp(json_string_value(json_object_get(at, "content")), content)) {
                    int64_t id = json_integer_value(json_object_get(at, "id"));
                    if (id < v->n) v->special[t] = id;
                    break;
                }
            }
        }
    }
    json_t *cfgs[2] = {v->cj, v->cj ? json_object_get(v->cj, "text_config") : NULL};
    for (int c = 0; c < 2; c++) {
        if (!json_is_object(cfgs[c])) continue;
        for (int t = 0; t < 7; t++) {
            if (v->special[t] >= 0) continue;
            char k[32];
            snprintf(k, sizeof k, "%s_token_id", special_types[t]);
            json_t *jv = json_object_get(cfgs[c], k);
            if (json_is_integer(jv) && json_integer_value(jv) >= 0 && json_integer_value(jv) < v->n)
                v->special[t] = json_integer_value(jv);
        }
    }
}

/* The chat template: tokenizer_config.json "chat_template", else chat_template.jinja beside it. */
static int read_chat_template(hf_vocab *v, const char *hf_dir, char *err) {
    if (!v->tc) return 0;
    json_t *ct = json_object_get(v->tc, "chat_template");
    if (json_is_string(ct) && json_string_length(ct)) {
        v->tmpl = dsf_xstrdup(json_string_value(ct));
        return 0;
    }
    char path[4096];
    uint8_t *data = NULL;
    size_t len = 0;
    char e2[DSF_ERR_LEN];
    snprintf(path, sizeof path, "%s/chat_template.jinja", hf_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    if (dsf_read_file(path, &data, &len, e2) != 0) return dsf_seterr(err, "%s", e2);
    if (len) v->tmpl = (char *)data;
    else free(data);
    return 0;
}

/* Adds the keys to w, in the converter's order. */
static int write_keys(const hf_vocab *v, gguf_writer *w, char *err) {
    int64_t n = v->n;
    uint64_t *lens = dsf_xmalloc((size_t)n * sizeof *lens);
    for (int64_t i = 0; i < n; i++) lens[i] = strlen(v->tokens[i]);
    int wr = gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", err);
    if (!wr) wr = gguf_writer_kv_str(w, "tokenizer.ggml.pre", "deepseek-v3", err);
    if (!wr)
        wr = gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, lens, (uint64_t)n,
                                    err);
    free(lens);
    if (!wr) wr = gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->types, (uint64_t)n, err);
    if (!wr) {
        uint64_t *ml = dsf_xmalloc(v->n_merges * sizeof *ml);
        for (size_t i = 0; i < v->n_merges; i++) ml[i] = strlen(v->merges[i]);
        wr = gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, ml, v->n_merges,
                                    err);
        free(ml);
    }
    for (int t = 0; t < 7 && !wr; t++)
        if (v->special[t] >= 0) wr = gguf_writer_kv_u32(w, special_keys[t], (uint32_t)v->special[t], err);
    for (int t = 0; t < 7 && !wr && v->tc; t++) {
        char k[32], gk[64];
        snprintf(k, sizeof k, "add_%s_token", special_types[t]);
        json_t *jv = json_object_get(v->tc, k);
        if (!json_is_boolean(jv)) continue;
        snprintf(gk, sizeof gk, "tokenizer.ggml.%s", k);
        wr = gguf_writer_kv_bool(w, gk, json_is_true(jv), err);
    }
    if (!wr && v->tmpl) wr = gguf_writer_kv_str(w, "tokenizer.chat_template", v->tmpl, err);
    return wr ? -1 : 0;
}

int vocab_write_gguf(gguf_writer *w, const char *hf_dir, int64_t vocab_size, char *err) {
    hf_vocab v;
    memset(&v, 0, sizeof v);
    int rc = -1;
    if (read_files(&v, hf_dir, err) || read_size(&v, hf_dir, vocab_size, err) || read_tokens(&v, err) ||
        read_merges(&v, hf_dir, err))
        goto done;
    if (!is_deepseek_v3_pre(json_object_get(v.tj, "pre_tokenizer"))) {
        dsf_seterr(err, "%s/tokenizer.json: BPE pre-tokenizer was not recognized (only "
                   "DeepSeek-V3's Split sequence is supported)", hf_dir);
        goto done;
    }
    read_special_ids(&v);
    if (read_chat_template(&v, hf_dir, err) || write_keys(&v, w, err)) goto done;
    rc = 0;

done:
    if (rc) dsf_err_oneline(err); /* token texts in messages come from the file */
    hf_vocab_free(&v);
    return rc;
}
