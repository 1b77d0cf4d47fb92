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
 * tokenizer.c, which hard-codes their PCRE2 translation for pre = "deepseek-v3"). */
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

int vocab_write_gguf(gguf_writer *w, const char *hf_dir, int64_t vocab_size, char *err) {
    int rc = -1;
    json_t *tj = NULL, *tc = NULL, *cj = NULL;
    char **tokens = NULL;    /* [n] owned copies or NULL for holes */
    int32_t *types = NULL;   /* [n] */
    char **merges = NULL;    /* [n_merges] owned */
    size_t n_merges = 0;
    int64_t n = 0;
    char *tmpl = NULL;

    if (load_json(hf_dir, "tokenizer.json", true, &tj, err) ||
        load_json(hf_dir, "tokenizer_config.json", false, &tc, err) ||
        load_json(hf_dir, "config.json", false, &cj, err))
        goto done;

    json_t *model = json_object_get(tj, "model");
    if (!json_is_object(model)) {
        dsf_seterr(err, "%s/tokenizer.json: no \"model\" object", hf_dir);
        goto done;
    }
    json_t *mty = json_object_get(model, "type");
    if (mty && (!json_is_string(mty) || strcmp(json_string_value(mty), "BPE"))) {
        dsf_seterr(err, "%s/tokenizer.json: model type %s is not BPE", hf_dir,
                   json_is_string(mty) ? json_string_value(mty) : "(not a string)");
        goto done;
    }
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(tj, "added_tokens");
    if (!json_is_object(vocab)) {
        dsf_seterr(err, "%s/tokenizer.json: model.vocab is not an object", hf_dir);
        goto done;
    }
    if (added && !json_is_array(added)) {
        dsf_seterr(err, "%s/tokenizer.json: added_tokens is not an array", hf_dir);
        goto done;
    }

    /* Vocabulary size: the caller's (the model's), else the largest id + 1. */
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= VOCAB_MAX) {
            dsf_seterr(err, "tokenizer.json: vocab entry '%s' has an invalid id", key);
            goto done;
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t ia;
    json_t *at;
    json_array_foreach(added, ia, at) {
        json_t *id = json_object_get(at, "id");
        json_t *content = json_object_get(at, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= VOCAB_MAX || !json_is_string(content) ||
            !json_string_length(content)) {
            dsf_seterr(err, "tokenizer.json: added_tokens[%zu] has an invalid id or content", ia);
            goto done;
        }
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) {
        dsf_seterr(err, "%s/tokenizer.json: empty vocabulary", hf_dir);
        goto done;
    }
    if (vocab_size < 0 || vocab_size > VOCAB_MAX) {
        dsf_seterr(err, "vocab_size %lld out of range", (long long)vocab_size);
        goto done;
    }
    n = vocab_size > 0 ? vocab_size : max_id + 1;
    if (max_id >= n) {
        dsf_seterr(err, "tokenizer.json: token id %lld does not fit the model's vocab_size %lld",
                   (long long)max_id, (long long)n);
        goto done;
    }

    tokens = dsf_xcalloc((size_t)n, sizeof *tokens);
    types = dsf_xcalloc((size_t)n, sizeof *types);
    json_object_foreach(vocab, key, val) {
        int64_t id = json_integer_value(val);
        if (tokens[id]) {
            dsf_seterr(err, "tokenizer.json: id %lld used by '%s' and '%s'", (long long)id,
                       tokens[id], key);
            goto done;
        }
        tokens[id] = dsf_xstrdup(key);
        types[id] = TT_NORMAL;
    }
    /* Added tokens: their content replaces the vocab string for that id (HF get_vocab). */
    json_array_foreach(added, ia, at) {
        int64_t id = json_integer_value(json_object_get(at, "id"));
        const char *content = json_string_value(json_object_get(at, "content"));
        json_t *sp = json_object_get(at, "special");
        bool special = json_is_true(sp);
        free(tokens[id]);
        if (special || looks_special(content)) {
            tokens[id] = dsf_xstrdup(content);
            types[id] = TT_CONTROL;
        } else {
            tokens[id] = lower_blank(content);
            types[id] = TT_USER_DEFINED;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        tokens[i] = dsf_xstrdup(pad);
        types[i] = TT_UNUSED;
    }

    /* Merges. */
    json_t *jm = json_object_get(model, "merges");
    if (!json_is_array(jm) || json_array_size(jm) == 0) {
        dsf_seterr(err, "%s/tokenizer.json: no model.merges (a BPE tokenizer needs them)", hf_dir);
        goto done;
    }
    merges = dsf_xcalloc(json_array_size(jm), sizeof *merges);
    json_array_foreach(jm, ia, val) {
        if (json_is_string(val)) {
            const char *s = json_string_value(val);
            if (!strchr(s, ' ')) {
                dsf_seterr(err, "tokenizer.json: merges[%zu] '%s' is not \"a b\"", ia, s);
                goto done;
            }
            merges[n_merges++] = dsf_xstrdup(s);
        } else if (json_is_array(val) && json_array_size(val) == 2 &&
                   json_is_string(json_array_get(val, 0)) &&
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
            merges[n_merges++] = (char *)b.data;
        } else {
            dsf_seterr(err, "tokenizer.json: merges[%zu] is neither \"a b\" nor [a, b]", ia);
            goto done;
        }
    }

    if (!is_deepseek_v3_pre(json_object_get(tj, "pre_tokenizer"))) {
        dsf_seterr(err, "%s/tokenizer.json: BPE pre-tokenizer was not recognized (only "
                   "DeepSeek-V3's Split sequence is supported)", hf_dir);
        goto done;
    }

    /* Special ids. */
    int64_t special[7];
    for (int t = 0; t < 7; t++) special[t] = -1;
    if (tc) {
        for (int t = 0; t < 7; t++) {
            char k[32];
            snprintf(k, sizeof k, "%s_token", special_types[t]);
            const char *content = config_token_content(json_object_get(tc, k));
            if (!content) continue;
            json_array_foreach(added, ia, at) {
                if (!strcmp(json_string_value(json_object_get(at, "content")), content)) {
                    int64_t id = json_integer_value(json_object_get(at, "id"));
                    if (id < n) special[t] = id;
                    break;
                }
            }
        }
    }
    json_t *cfgs[2] = {cj, cj ? json_object_get(cj, "text_config") : NULL};
    for (int c = 0; c < 2; c++) {
        if (!json_is_object(cfgs[c])) continue;
        for (int t = 0; t < 7; t++) {
            if (special[t] >= 0) continue;
            char k[32];
            snprintf(k, sizeof k, "%s_token_id", special_types[t]);
            json_t *v = json_object_get(cfgs[c], k);
            if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < n)
                special[t] = json_integer_value(v);
        }
    }

    if (tc) {
        json_t *ct = json_object_get(tc, "chat_template");
        if (json_is_string(ct) && json_string_length(ct)) {
            tmpl = dsf_xstrdup(json_string_value(ct));
        } else {
            char path[4096];
            uint8_t *data = NULL;
            size_t len = 0;
            char e2[DSF_ERR_LEN];
            snprintf(path, sizeof path, "%s/chat_template.jinja", hf_dir);
            FILE *f = fopen(path, "rb");
            if (f) {
                fclose(f);
                if (dsf_read_file(path, &data, &len, e2) != 0) {
                    dsf_seterr(err, "%s", e2);
                    goto done;
                }
                if (len) tmpl = (char *)data;
                else free(data);
            }
        }
    }

    /* ---- write, in the converter's order ---- */
    uint64_t *lens = dsf_xmalloc((size_t)n * sizeof *lens);
    for (int64_t i = 0; i < n; i++) lens[i] = strlen(tokens[i]);
    int wr = gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", err);
    if (!wr) wr = gguf_writer_kv_str(w, "tokenizer.ggml.pre", "deepseek-v3", err);
    if (!wr)
        wr = gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, lens,
                                    (uint64_t)n, err);
    free(lens);
    if (!wr)
        wr = gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, (uint64_t)n,
                                err);
    if (!wr) {
        uint64_t *ml = dsf_xmalloc(n_merges * sizeof *ml);
        for (size_t i = 0; i < n_merges; i++) ml[i] = strlen(merges[i]);
        wr = gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, ml,
                                    n_merges, err);
        free(ml);
    }
    for (int t = 0; t < 7 && !wr; t++)
        if (special[t] >= 0) wr = gguf_writer_kv_u32(w, special_keys[t], (uint32_t)special[t], err);
    for (int t = 0; t < 7 && !wr && tc; t++) {
        char k[32], gk[64];
        snprintf(k, sizeof k, "add_%s_token", special_types[t]);
        json_t *v = json_object_get(tc, k);
        if (!json_is_boolean(v)) continue;
        snprintf(gk, sizeof gk, "tokenizer.ggml.%s", k);
        wr = gguf_writer_kv_bool(w, gk, json_is_true(v), err);
    }
    if (!wr && tmpl) wr = gguf_writer_kv_str(w, "tokenizer.chat_template", tmpl, err);
    if (wr) goto done;
    rc = 0;

done:
    if (rc) dsf_err_oneline(err); /* token texts in messages come from the file */
    if (tokens)
        for (int64_t i = 0; i < n; i++) free(tokens[i]);
    free(tokens);
    free(types);
    for (size_t i = 0; i < n_merges; i++) free(merges[i]);
    free(merges);
    free(tmpl);
    json_decref(tj);
    json_decref(tc);
    json_decref(cj);
    return rc;
}
