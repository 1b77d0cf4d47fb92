/* synth.c: the layout of synthetic deepseek41 GGUF files (see synth.h).
 *
 * Owns: the presets' parameters, which layers own compressor / indexer / Engram tensors
 * (gguf-layout §3.2: membership in the source lists; the derived roles are model/roles.c's),
 * the tensor set of §3.2 with its dtypes (dense BF16 or F32, F32 norms/router/hc/sinks/biases/engram_gate,
 * MXFP4 or F32 experts, the Engram table as dense), the keys of §2.3/§2.4 with the Engram/PLE
 * constants (primes, absolute offsets, odd multipliers, token map) and a byte-level BPE
 * tokenizer trained on a built-in text. The editable model and the data are synth_model.c's.
 * Must not: depend on the engine's shape code, or lay out anything a deepseek41 loader would
 * refuse (only the caller's edits may).
 * Invariant: output = f(parameters, seed); a different seed changes every tensor. */
#include "convert/synth_impl.h"
#include "convert/dspark_meta.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"
#include "text/bytelevel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ presets */

typedef synth_params preset;

#define PRESET_COMMON                                                                                    \
    .hc_eps = 1e-6f, .engram_pad = 2, .yarn = true, .eps = 1e-20f, .route_scale = 1.5f, .swiglu = 10.0f, \
    .dense_type = GGML_TYPE_BF16, .expert_type = GGML_TYPE_MXFP4, .tokenizer = true

/* Both presets share tiny41's topology (README "The model"): layer 0/1 window only, 2-4
 * ratio 2 (2 and 4 KV + index sources, 3 reuses 2), 5-7 ratio 1 (5 source + candidate
 * source, 6 reuses 5, 7 re-indexes with 5's keys), Engram before layers 1 and 4. The extra
 * trailing compress_ratios entry mirrors the release's disabled MTP/DSpark stages. */
static const struct {
    const char *id;
    preset p;
} presets[] = {
    {"tiny",
     {.name = "dsflash-synth-tiny", .n_embd = 128, .n_layer = 8, .n_head = 4, .head_dim = 64, .n_rot = 16,
      .q_lora = 64, .o_groups = 2, .o_lora = 32, .window = 8, .n_expert = 8, .n_used = 2, .ff = 64, .n_shared = 1,
      .idx_heads = 8, .idx_dim = 32, .idx_topk = 8, .cand_layer = 5, .cand_blocks = 3, .cand_bsize = 4,
      .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 2, .engram_dim = 32, .engram_vocab = 101,
      .vocab = 1024, .ctx = 4096, .orig_ctx = 64, .yarn_factor = 4.0f,
      .n_ratio = 9, .ratios = {0, 0, 2, 2, 2, 1, 1, 1, 0},
      .n_kvsrc = 3, .kvsrc = {2, 4, 5}, .n_idxsrc = 4, .idxsrc = {2, 4, 5, 7}, .n_engram = 2, .engram = {1, 4},
      PRESET_COMMON}},
    /* tiny's widths on the release's shape of roles (architecture.md §1.3), for the MPI tests'
     * second topology: 12 layers, window-only 0-1, two ratio-2 groups (KV + index sources 2
     * and 5; 3-4 and 6 reuse them), a ratio-1 group 7-11 whose source 7 is the candidate source,
     * 9 and 11 re-indexing with 7's keys inside its candidates (8 and 10 reuse a top-k), Engram
     * before 1 and before 5, a group's source as on the release's layer 14. */
    {"tiny-roles",
     {.name = "dsflash-synth-tiny-roles", .n_embd = 128, .n_layer = 12, .n_head = 4, .head_dim = 64, .n_rot = 16,
      .q_lora = 64, .o_groups = 2, .o_lora = 32, .window = 8, .n_expert = 8, .n_used = 2, .ff = 64, .n_shared = 1,
      .idx_heads = 8, .idx_dim = 32, .idx_topk = 8, .cand_layer = 7, .cand_blocks = 3, .cand_bsize = 4,
      .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 2, .engram_dim = 32, .engram_vocab = 101,
      .vocab = 1024, .ctx = 4096, .orig_ctx = 64, .yarn_factor = 4.0f,
      .n_ratio = 13, .ratios = {0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0},
      .n_kvsrc = 3, .kvsrc = {2, 5, 7}, .n_idxsrc = 5, .idxsrc = {2, 5, 7, 9, 11}, .n_engram = 2, .engram = {1, 5},
      PRESET_COMMON}},
    {"bench",
     {.name = "dsflash-synth-bench", .n_embd = 5120, .n_layer = 8, .n_head = 64, .head_dim = 512, .n_rot = 64,
      .q_lora = 1280, .o_groups = 8, .o_lora = 1024, .window = 128, .n_expert = 32, .n_used = 6, .ff = 2304,
      .n_shared = 1, .idx_heads = 32, .idx_dim = 128, .idx_topk = 512, .cand_layer = 5, .cand_blocks = 2048,
      .cand_bsize = 8, .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 8, .engram_dim = 256,
      .engram_vocab = 4001, .vocab = 129280, .ctx = 1048576, .orig_ctx = 65536, .yarn_factor = 16.0f,
      .n_ratio = 9, .ratios = {0, 0, 2, 2, 2, 1, 1, 1, 0},
      .n_kvsrc = 3, .kvsrc = {2, 4, 5}, .n_idxsrc = 4, .idxsrc = {2, 4, 5, 7}, .n_engram = 2, .engram = {1, 4},
      PRESET_COMMON}},
    /* The real routed-expert count (384, top 6) at the real widths on 1 layer, so that a
     * multi-token forward (speculative verification, `bench --draft`) reads as many distinct
     * experts per layer as the release: about 10.6 GB (6.7 GiB of MXFP4 experts + 2.5 GiB of
     * embedding and LM head), so that it and its `--dspark` draft (about 8.4 GB) fit together in
     * 24 GiB; 2 layers would take 18 GB. The layer is ratio 1 with every role (KV, index and
     * candidate source) and Engram before it. */
    {"bench-moe",
     {.name = "dsflash-synth-bench-moe", .n_embd = 5120, .n_layer = 1, .n_head = 64, .head_dim = 512, .n_rot = 64,
      .q_lora = 1280, .o_groups = 8, .o_lora = 1024, .window = 128, .n_expert = 384, .n_used = 6, .ff = 2304,
      .n_shared = 1, .idx_heads = 32, .idx_dim = 128, .idx_topk = 512, .cand_layer = 0, .cand_blocks = 2048,
      .cand_bsize = 8, .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 8, .engram_dim = 256,
      .engram_vocab = 4001, .vocab = 129280, .ctx = 1048576, .orig_ctx = 65536, .yarn_factor = 16.0f,
      .n_ratio = 2, .ratios = {1, 0},
      .n_kvsrc = 1, .kvsrc = {0}, .n_idxsrc = 1, .idxsrc = {0}, .n_engram = 1, .engram = {0},
      PRESET_COMMON}},
    /* architecture.md §1.1 / §1.3 and gguf-layout §3.2 (with the optional VL router bias the
     * released checkpoint has on every layer): 40 layers, 43 ratios (2 window-only layers, 18
     * of ratio 2, 20 of ratio 1, the 3 DSpark stages), Engram tables of 24 primes >= 16000000. */
    {"real",
     {.name = "dsflash-synth-real", .n_embd = 5120, .n_layer = 40, .n_head = 64, .head_dim = 512, .n_rot = 64,
      .q_lora = 1280, .o_groups = 8, .o_lora = 1024, .window = 128, .n_expert = 384, .n_used = 6, .ff = 2304,
      .n_shared = 1, .idx_heads = 32, .idx_dim = 128, .idx_topk = 512, .cand_layer = 20, .cand_blocks = 2048,
      .cand_bsize = 8, .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 8, .engram_dim = 256,
      .engram_vocab = 16000000, .vocab = 129280, .ctx = 1048576, .orig_ctx = 65536, .yarn_factor = 16.0f,
      .n_ratio = 43, .ratios = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1,
                                1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
      .n_kvsrc = 4, .kvsrc = {2, 8, 14, 20}, .n_idxsrc = 8, .idxsrc = {2, 8, 14, 20, 24, 28, 32, 36},
      .n_engram = 2, .engram = {1, 14}, .vl_bias = true, PRESET_COMMON}},
};

static const preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (name && !strcmp(presets[i].id, name)) return &presets[i].p;
    return NULL;
}

static bool listed(const uint32_t *v, int n, uint32_t x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

static int is_engram(const preset *p, int il) { return listed(p->engram, p->n_engram, (uint32_t)il); }

/* ================================================================ tokenizer */

/* Built-in training text for the tiny preset's merges (written for this file). */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. The capital of France is Paris, and the weather "
    "there is quite warm today. A language model reads a sequence of tokens and predicts the next "
    "one. Each token is a small piece of text: a word, part of a word, a number or a sign. The "
    "model was trained on a large amount of text from books, articles and programs, and it learned "
    "which pieces tend to follow which. When you ask a question, the model writes an answer one "
    "token at a time. It can also think before it answers, and it can call tools when the user "
    "gives it some. This is a small test model with random weights, so its answers mean nothing; "
    "it exists so that the engine, the server and the tests have something to run. "
    "In the morning the children walked to the school near the river. Their teacher told them a "
    "story about the mountains in the north, where the winters are long and the summers are short. "
    "People there build their houses from stone and wood, and they keep the fire burning all night. "
    "We should remember that every system has limits, and that the best engineers test their work "
    "before they trust it. Measure first, then change one thing, then measure again. "
    "The numbers were 12, 345, 6789 and 2026; the total was larger than we expected. "
    "Memory bandwidth decides how fast a large model can generate text on a computer, because "
    "every new token reads all the weights that the token uses. "
    "def main(argc, argv):\n    for i in range(10):\n        print(i, i * i)\n    return 0\n"
    "int main(void) {\n    int total = 0;\n    for (int i = 0; i < 100; i++) total += i;\n"
    "    printf(\"%d\\n\", total);\n    return 0;\n}\n"
    "Hello, world! How are you today? I am fine, thank you. What time is it? It is half past "
    "seven in the evening, and the sun is going down behind the hills. "
    "The user asked the assistant to write a function that returns the sum of a list of numbers, "
    "and the assistant wrote it, tested it and explained how it works. "
    "Once upon a time there was a little house at the edge of a forest. An old man lived there "
    "with his cat and his garden, and every day he watered the flowers and talked to the birds.\n"
    "Scientists study the natural world by asking questions, making careful observations and "
    "running experiments. A good experiment changes only one variable at a time, so that the "
    "result can be explained. Data from many experiments are collected, compared and published, "
    "and other researchers try to reproduce them. Knowledge grows slowly, through mistakes and "
    "corrections, but it grows.\n"
    "Cooking is chemistry in the kitchen. Heat changes the structure of proteins and sugars; salt "
    "draws water out of vegetables; acids such as lemon juice brighten the flavour of a sauce. A "
    "simple recipe for bread needs only flour, water, yeast and salt, and patience while the dough "
    "rises in a warm place.\n"
    "Travelling by train across the country, you can watch the landscape change from fields and "
    "farms to forests, lakes and finally the sea. Stations are busy in the morning and quiet at "
    "night. Some passengers read, some sleep, and some look out of the window for hours, thinking "
    "about nothing in particular.\n"
    "The server listens on a port, accepts a request, parses the JSON body, checks the fields, "
    "renders the prompt, runs the model and streams the tokens back as events. If anything goes "
    "wrong, it returns an error with a clear message instead of crashing. Every function returns "
    "a status code, and every length is checked before it is used.\n"
    "Questions: Where is the station? When does the museum open? Why is the sky blue? Which "
    "number is larger, seventeen or seventy? Who wrote this letter, and what does it say?\n"
    "for (size_t i = 0; i < count; i++) { if (values[i] > limit) return -1; sum += values[i]; }\n"
    "import json\nwith open(\"data.json\") as f:\n    items = json.load(f)\nprint(len(items))\n";

/* V4.1 added tokens (chat-format §1), in tiny41's order, with their token types. */
static const struct { const char *s; int32_t type; } added_tokens[] = {
    {"<\xef\xbd\x9cSystem\xef\xbd\x9c>", 3}, {"<\xef\xbd\x9cUser\xef\xbd\x9c>", 3},
    {"<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", 3}, {"<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>", 3},
    {"\xef\xbd\x9c" "DSML\xef\xbd\x9c", 4}, {"<\xef\xbd\x9c" "deepseek_image\xef\xbd\x9c>", 3},
    {"<think>", 4}, {"</think>", 4},
    {"<\xef\xbd\x9c" "action\xef\xbd\x9c>", 3}, {"<\xef\xbd\x9cquery\xef\xbd\x9c>", 3},
    {"<\xef\xbd\x9c" "authority\xef\xbd\x9c>", 3}, {"<\xef\xbd\x9c" "domain\xef\xbd\x9c>", 3},
    {"<\xef\xbd\x9ctitle\xef\xbd\x9c>", 3}, {"<\xef\xbd\x9cread_url\xef\xbd\x9c>", 3},
    {"<\xef\xbd\x9c" "end_of_query\xef\xbd\x9c>", 3},
};
#define N_ADDED ((int)(sizeof added_tokens / sizeof *added_tokens))
/* BOS, EOS, PAD: "<｜begin▁of▁sentence｜>" etc. (▁ is U+2581, ｜ is U+FF5C) */
static const char *const special_tokens[3] = {
    "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>",
};

typedef struct {
    char **tok;        /* [n] NUL-terminated strings */
    uint64_t *len;
    int32_t *type;
    uint32_t n;
    char **merges;     /* "a b" */
    uint64_t *mlen;
    uint32_t n_merges;
    int32_t *token_map;
    uint32_t n_compressed;
} vocab_out;

static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }

static void vocab_free(vocab_out *v) {
    for (uint32_t i = 0; i < v->n; i++) free(v->tok[i]);
    for (uint32_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->len);
    free(v->type);
    free(v->merges);
    free(v->mlen);
    free(v->token_map);
    memset(v, 0, sizeof *v);
}

static int find_tok(const vocab_out *v, uint32_t n, const char *s) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(v->tok[i], s)) return (int)i;
    return -1;
}

/* Builds: 3 specials, 256 byte tokens, n_merge_tokens merged tokens learned from the corpus
 * (most frequent adjacent pair first, ties to the lowest ids), the V4.1 added tokens, then
 * "[PAD{i}]" (UNUSED) up to `vocab`; and the Engram token map (lowercased string identity,
 * numbered by first occurrence, so that map values are dense and < n_compressed). */
static void build_vocab(vocab_out *v, uint32_t vocab) {
    const uint32_t base = vocab < 1024 ? vocab : 1024;
    const uint32_t n_learned = base - 3 - 256 - N_ADDED;
    v->n = vocab;
    v->tok = dsf_xcalloc(vocab, sizeof *v->tok);
    v->len = dsf_xcalloc(vocab, sizeof *v->len);
    v->type = dsf_xcalloc(vocab, sizeof *v->type);
    v->merges = dsf_xcalloc(4 * n_learned + 1, sizeof *v->merges);
    v->mlen = dsf_xcalloc(4 * n_learned + 1, sizeof *v->mlen);
    uint32_t n = 0;
    for (int i = 0; i < 3; i++) { v->tok[n] = dsf_xstrdup(special_tokens[i]); v->type[n++] = 3; }
    uint8_t order[256];
    bytelevel_order(order);
    int byte_id[256];
    for (int i = 0; i < 256; i++) {
        char s[3] = {0};
        bytelevel_utf8(order[i], s);
        byte_id[order[i]] = (int)n;
        v->tok[n] = dsf_xstrdup(s);
        v->type[n++] = 1;
    }
    /* pre-tokenize the corpus: [space]letters | [space]digits(<=3) | [space]punct | newlines */
    const size_t clen = sizeof corpus - 1;
    int *sym = dsf_xmalloc(clen * sizeof *sym);   /* symbol ids, words separated by -1 */
    size_t ns = 0;
    for (size_t i = 0; i < clen;) {
        size_t j = i;
        int c = (uint8_t)corpus[j];
        if (c == '\n') {
            while (j < clen && corpus[j] == '\n') j++;
        } else {
            if (c == ' ' && j + 1 < clen && corpus[j + 1] != ' ' && corpus[j + 1] != '\n') j++;
            int d = (uint8_t)corpus[j];
            if (is_alpha(d)) while (j < clen && is_alpha((uint8_t)corpus[j])) j++;
            else if (is_digit(d)) { size_t k = j; while (j < clen && is_digit((uint8_t)corpus[j]) && j - k < 3) j++; }
            else if (d == ' ') while (j < clen && corpus[j] == ' ') j++;
            else while (j < clen && !is_alpha((uint8_t)corpus[j]) && !is_digit((uint8_t)corpus[j]) && corpus[j] != ' ' && corpus[j] != '\n') j++;
        }
        for (size_t k = i; k < j; k++) sym[ns++] = byte_id[(uint8_t)corpus[k]];
        sym = dsf_xrealloc(sym, (ns + clen + 2) * sizeof *sym);
        sym[ns++] = -1;
        i = j;
    }
    /* learn merges */
    uint32_t learned = 0, nm = 0;
    const uint32_t hcap = 1u << 15;
    uint64_t *hkey = dsf_xmalloc(hcap * sizeof *hkey);
    uint32_t *hcnt = dsf_xmalloc(hcap * sizeof *hcnt);
    while (learned < n_learned && nm < 4 * n_learned) {
        memset(hkey, 0xFF, hcap * sizeof *hkey);
        memset(hcnt, 0, hcap * sizeof *hcnt);
        uint64_t best = UINT64_MAX;
        uint32_t best_n = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            if (sym[i] < 0 || sym[i + 1] < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)sym[i] << 32) | (uint32_t)sym[i + 1];
            uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 49) & (hcap - 1);
            while (hkey[h] != key && hkey[h] != UINT64_MAX) h = (h + 1) & (hcap - 1);
            hkey[h] = key;
            uint32_t c = ++hcnt[h];
            if (c > best_n || (c == best_n && key < best)) { best_n = c; best = key; }
        }
        if (!best_n) break; /* every word is a single token */
        int a = (int)(best >> 32), b = (int)(uint32_t)best;
        size_t la = strlen(v->tok[a]), lb = strlen(v->tok[b]);
        char *cat = dsf_xmalloc(la + lb + 1);
        memcpy(cat, v->tok[a], la);
        memcpy(cat + la, v->tok[b], lb + 1);
        int id = find_tok(v, n, cat);
        if (id < 0) {
            id = (int)n;
            v->tok[n] = cat;
            v->type[n++] = 1;
            learned++;
        } else {
            free(cat);
        }
        char *m = dsf_xmalloc(la + lb + 2);
        memcpy(m, v->tok[a], la);
        m[la] = ' ';
        memcpy(m + la + 1, v->tok[b], lb + 1);
        v->merges[nm++] = m;
        size_t o = 0;
        for (size_t i = 0; i < ns; i++) {
            if (i + 1 < ns && sym[i] == a && sym[i + 1] == b) { sym[o++] = id; i++; }
            else sym[o++] = sym[i];
        }
        ns = o;
    }
    free(hkey);
    free(hcnt);
    free(sym);
    v->n_merges = nm;
    /* if the corpus ran out of pairs, pad the learned range with unused placeholders */
    while (n < base - N_ADDED) {
        char s[32];
        snprintf(s, sizeof s, "[PAD%u]", n);
        v->tok[n] = dsf_xstrdup(s);
        v->type[n++] = 5;
    }
    for (int i = 0; i < N_ADDED; i++) { v->tok[n] = dsf_xstrdup(added_tokens[i].s); v->type[n++] = added_tokens[i].type; }
    while (n < vocab) {
        char s[32];
        snprintf(s, sizeof s, "[PAD%u]", n);
        v->tok[n] = dsf_xstrdup(s);
        v->type[n++] = 5;
    }
    for (uint32_t i = 0; i < n; i++) v->len[i] = strlen(v->tok[i]);
    for (uint32_t i = 0; i < nm; i++) v->mlen[i] = strlen(v->merges[i]);
    /* Engram token map: lowercase ASCII, then first-occurrence numbering (via a hash table) */
    v->token_map = dsf_xmalloc(vocab * sizeof *v->token_map);
    uint32_t tcap = 1;
    while (tcap < 2 * vocab) tcap <<= 1;
    int32_t *slot = dsf_xmalloc(tcap * sizeof *slot);
    for (uint32_t i = 0; i < tcap; i++) slot[i] = -1;
    char **low = dsf_xmalloc(vocab * sizeof *low);
    uint32_t nc = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        low[i] = dsf_xstrdup(v->tok[i]);
        for (char *q = low[i]; *q; q++)
            if (*q >= 'A' && *q <= 'Z') *q = (char)(*q - 'A' + 'a');
        uint32_t h = (uint32_t)hash_str(low[i], 0) & (tcap - 1);
        while (slot[h] >= 0 && strcmp(low[slot[h]], low[i])) h = (h + 1) & (tcap - 1);
        if (slot[h] < 0) {
            slot[h] = (int32_t)i;
            v->token_map[i] = (int32_t)nc++;
        } else {
            v->token_map[i] = v->token_map[slot[h]];
        }
    }
    for (uint32_t i = 0; i < vocab; i++) free(low[i]);
    free(low);
    free(slot);
    v->n_compressed = nc;
}
/* ================================================================ tensors */

#define F32 GGML_TYPE_F32

/* The tensor set of gguf-layout §3.2 for p, in the converter's order (§3.4): the experts of
 * every layer, the Engram table, then the rest. */
static void build_tensors(const preset *p, synth_model *m, uint64_t engram_rows) {
    const int64_t D = p->n_embd, H = p->n_head, dh = p->head_dim, E = p->n_expert, ff = p->ff;
    const int64_t nhc = (int64_t)p->hc * (2 + p->hc); /* 24 mix rows: pre, post, comb */
    const uint32_t DT = p->dense_type, ET = p->expert_type;
    const int64_t og = p->o_groups ? p->o_groups : 1, fsh = ff * p->n_shared;
    for (uint32_t il = 0; il < p->n_layer; il++) {
        synth_tensor(m, ET, K_DENSE, D, 3, D, ff, E, "blk.%u.ffn_gate_exps.weight", il);
        synth_tensor(m, ET, K_DENSE, ff, 3, ff, D, E, "blk.%u.ffn_down_exps.weight", il);
        synth_tensor(m, ET, K_DENSE, D, 3, D, ff, E, "blk.%u.ffn_up_exps.weight", il);
    }
    if (p->n_engram) synth_tensor(m, DT, K_EMBED, 0, 2, p->engram_dim, (int64_t)engram_rows, 1, "per_layer_token_embd.weight");
    synth_tensor(m, DT, K_EMBED, 0, 2, D, p->vocab, 1, "token_embd.weight");
    for (uint32_t il = 0; il < p->n_layer; il++) {
        /* gguf-layout §3.2: a listed source layer with ratio > 0 owns its compressor / indexer
         * tensors. Only membership matters here, not the derived roles, so a caller may build an
         * invalid topology on purpose and the loader's refusal is what a test sees. */
        const bool kv_owner = p->ratios[il] > 0 && listed(p->kvsrc, p->n_kvsrc, il);
        const bool ix_owner = p->ratios[il] > 0 && listed(p->idxsrc, p->n_idxsrc, il);
        synth_tensor(m, F32, K_DENSE, p->hc * D, 2, p->hc * D, nhc, 1, "blk.%u.hc_attn_fn.weight", il);
        synth_tensor(m, F32, K_DENSE, p->hc * D, 2, p->hc * D, nhc, 1, "blk.%u.hc_ffn_fn.weight", il);
        synth_tensor(m, F32, K_HC_BASE, 0, 1, nhc, 1, 1, "blk.%u.hc_attn_base.weight", il);
        synth_tensor(m, F32, K_HC_BASE, 0, 1, nhc, 1, 1, "blk.%u.hc_ffn_base.weight", il);
        synth_tensor(m, F32, K_HC_SCALE, 0, 1, 3, 1, 1, "blk.%u.hc_attn_scale.weight", il);
        synth_tensor(m, F32, K_HC_SCALE, 0, 1, 3, 1, 1, "blk.%u.hc_ffn_scale.weight", il);
        synth_tensor(m, F32, K_SINK, 0, 1, H, 1, 1, "blk.%u.attn_sinks.weight", il);
        synth_tensor(m, DT, K_DENSE, D, 2, D, p->q_lora, 1, "blk.%u.attn_q_a.weight", il);
        synth_tensor(m, F32, K_NORM, 0, 1, p->q_lora, 1, 1, "blk.%u.attn_q_a_norm.weight", il);
        synth_tensor(m, DT, K_DENSE, p->q_lora, 2, p->q_lora, H * dh, 1, "blk.%u.attn_q_b.weight", il);
        synth_tensor(m, DT, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_kv.weight", il);
        synth_tensor(m, F32, K_NORM, 0, 1, dh, 1, 1, "blk.%u.attn_kv_a_norm.weight", il);
        /* written 2-D like the converter; the loader re-views it as {H*dh/og, olr, og} */
        synth_tensor(m, DT, K_DENSE, H * dh / og, 2, H * dh / og, (int64_t)p->o_groups * p->o_lora, 1,
              "blk.%u.attn_output_a.weight", il);
        synth_tensor(m, DT, K_DENSE, (int64_t)p->o_groups * p->o_lora, 2, (int64_t)p->o_groups * p->o_lora, D, 1,
              "blk.%u.attn_output_b.weight", il);
        if (kv_owner) {
            synth_tensor(m, F32, K_NORM, 0, 1, dh, 1, 1, "blk.%u.attn_compressor_norm.weight", il);
            synth_tensor(m, DT, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_compressor_kv.weight", il);
            if (p->ratios[il] > 1) synth_tensor(m, DT, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_compressor_gate.weight", il);
        }
        if (ix_owner) {
            synth_tensor(m, DT, K_DENSE, p->q_lora, 2, p->q_lora, (int64_t)p->idx_heads * p->idx_dim, 1,
                  "blk.%u.indexer.attn_q_b.weight", il);
            synth_tensor(m, DT, K_DENSE, D, 2, D, p->idx_heads, 1, "blk.%u.indexer.proj.weight", il);
        }
        if (kv_owner) {
            synth_tensor(m, DT, K_DENSE, dh, 2, dh, p->idx_dim, 1, "blk.%u.indexer.attn_k.weight", il);
            synth_tensor(m, F32, K_NORM, 0, 1, p->idx_dim, 1, 1, "blk.%u.indexer.k_norm.weight", il);
        }
        if (is_engram(p, (int)il)) {
            int64_t n_heads = (int64_t)(p->ngram - 1) * p->heads_per_ngram;
            synth_tensor(m, F32, K_DENSE, D, 2, D, p->hc, 1, "blk.%u.engram_gate.weight", il);
            synth_tensor(m, DT, K_DENSE, n_heads * p->engram_dim, 2, n_heads * p->engram_dim, D * (p->hc + 1), 1,
                  "blk.%u.engram_kv.weight", il);
        }
        synth_tensor(m, F32, K_DENSE, D, 2, D, E, 1, "blk.%u.ffn_gate_inp.weight", il);
        synth_tensor(m, F32, K_BIAS, 0, 1, E, 1, 1, "blk.%u.exp_probs_b.bias", il);
        if (p->vl_bias) synth_tensor(m, F32, K_BIAS, 0, 1, E, 1, 1, "blk.%u.exp_probs_b_vl.bias", il);
        synth_tensor(m, DT, K_DENSE, D, 2, D, fsh, 1, "blk.%u.ffn_gate_shexp.weight", il);
        synth_tensor(m, DT, K_DENSE, fsh, 2, fsh, D, 1, "blk.%u.ffn_down_shexp.weight", il);
        synth_tensor(m, DT, K_DENSE, D, 2, D, fsh, 1, "blk.%u.ffn_up_shexp.weight", il);
        synth_tensor(m, F32, K_NORM, 0, 1, D, 1, 1, "blk.%u.attn_norm.weight", il);
        synth_tensor(m, F32, K_NORM, 0, 1, D, 1, 1, "blk.%u.ffn_norm.weight", il);
    }
    synth_tensor(m, F32, K_NORM, 0, 1, D, 1, 1, "output_norm.weight");
    synth_tensor(m, DT, K_DENSE, D, 2, D, p->vocab, 1, "output.weight");
}
/* ================================================================ keys */

static int is_prime(uint64_t n) {
    if (n < 2) return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

#define K(suffix) (snprintf(key, sizeof key, "deepseek41.%s", suffix), key)

/* The Engram constants of synth_model_new, laid out for the keys. */
typedef struct {
    uint64_t ncol, rows;      /* bucket columns; table rows = sum of sizes */
    uint64_t *mult;           /* [n_engram * ngram] odd multipliers */
    uint64_t *offs, *sizes;   /* [ncol] absolute offsets, primes */
    const int32_t *tmap;      /* [n_map] compressed token map: the vocab's, or tmap_random */
    uint32_t n_map;
    int32_t *tmap_random;     /* owned, for a model without a tokenizer */
} engram_tables;

/* Model keys of gguf-layout §2.3 in the converter's order. */
static void model_keys(synth_model *m, const preset *p) {
    char key[128];
    synth_set_str(m, "general.architecture", "deepseek41");
    synth_set_str(m, "general.type", "model");
    synth_set_str(m, "general.name", p->name ? p->name : "synth");
    synth_set_u32(m, K("block_count"), p->n_layer);
    synth_set_u32(m, K("context_length"), p->ctx);
    synth_set_u32(m, K("embedding_length"), p->n_embd);
    synth_set_u32(m, K("attention.head_count"), p->n_head);
    synth_set_u32(m, K("attention.head_count_kv"), 1);
    if (p->yarn) {
        synth_set_str(m, K("rope.scaling.type"), "yarn");
        synth_set_f32(m, K("rope.scaling.factor"), p->yarn_factor);
        synth_set_u32(m, K("rope.scaling.original_context_length"), p->orig_ctx);
        synth_set_f32(m, K("rope.scaling.yarn_beta_fast"), 32.0f);
        synth_set_f32(m, K("rope.scaling.yarn_beta_slow"), 1.0f);
    }
    synth_set_f32(m, K("rope.freq_base"), 10000.0f);
    synth_set_f32(m, K("attention.layer_norm_rms_epsilon"), p->eps);
    synth_set_u32(m, K("expert_count"), p->n_expert);
    synth_set_u32(m, K("expert_used_count"), p->n_used);
    synth_set_u32(m, K("expert_gating_func"), 4); /* sqrtsoftplus, §2.3 */
    synth_set_u32(m, K("attention.key_length"), p->head_dim);
    synth_set_u32(m, K("attention.value_length"), p->head_dim);
    synth_set_u32(m, "general.file_type", 38);
    synth_set_u32(m, K("rope.dimension_count"), p->n_rot);
    synth_set_u32(m, K("attention.q_lora_rank"), p->q_lora);
    synth_set_u32(m, K("attention.sliding_window"), p->window);
    synth_set_u32(m, K("expert_feed_forward_length"), p->ff);
    synth_set_u32(m, K("expert_shared_count"), p->n_shared);
    synth_set_f32(m, K("expert_weights_scale"), p->route_scale);
    synth_set_bool(m, K("expert_weights_norm"), true);
    float clamp[SYNTH_MAX_LAYERS];
    for (uint32_t i = 0; i < p->n_layer; i++) clamp[i] = p->swiglu;
    synth_set_arr(m, K("swiglu_clamp_exp"), GGUF_VT_FLOAT32, clamp, p->n_layer);
    synth_set_arr(m, K("swiglu_clamp_shexp"), GGUF_VT_FLOAT32, clamp, p->n_layer);
}

/* Attention keys (indexer, output groups, compression, hyper-connections, sources, the
 * candidate stage), then the Engram/PLE keys of §2.4 when p has Engram layers. */
static void attention_engram_keys(synth_model *m, const preset *p, const engram_tables *e) {
    char key[128];
    synth_set_u32(m, K("attention.indexer.head_count"), p->idx_heads);
    synth_set_u32(m, K("attention.indexer.key_length"), p->idx_dim);
    synth_set_u32(m, K("attention.indexer.top_k"), p->idx_topk);
    synth_set_u32(m, K("attention.output_group_count"), p->o_groups);
    synth_set_u32(m, K("attention.output_lora_rank"), p->o_lora);
    synth_set_arr(m, K("attention.compress_ratios"), GGUF_VT_INT32, p->ratios,
                  (uint64_t)(p->n_ratio ? p->n_ratio : (int)p->n_layer));
    synth_set_f32(m, K("attention.compress_rope_freq_base"), 160000.0f);
    synth_set_u32(m, K("hyper_connection.count"), p->hc);
    synth_set_u32(m, K("hyper_connection.sinkhorn_iterations"), p->sinkhorn);
    synth_set_f32(m, K("hyper_connection.epsilon"), p->hc_eps);
    synth_set_u32(m, K("hash_layer_count"), 0);
    synth_set_arr(m, K("attention.kv_source_layers"), GGUF_VT_UINT32, p->kvsrc, (uint64_t)p->n_kvsrc);
    synth_set_arr(m, K("attention.indexer.source_layers"), GGUF_VT_UINT32, p->idxsrc, (uint64_t)p->n_idxsrc);
    if (p->cand_layer >= 0) {
        synth_set_i32(m, K("attention.indexer.candidate_source_layer"), p->cand_layer);
        synth_set_u32(m, K("attention.indexer.candidate_top_k_blocks"), p->cand_blocks);
        synth_set_u32(m, K("attention.indexer.candidate_block_size"), p->cand_bsize);
    }
    if (p->n_engram) {
        synth_set_arr(m, K("ple.layers"), GGUF_VT_UINT32, p->engram, (uint64_t)p->n_engram);
        synth_set_u32(m, K("ple.ngram_size"), p->ngram);
        synth_set_u32(m, K("ple.heads_per_ngram"), p->heads_per_ngram);
        synth_set_u32(m, K("embedding_length_per_layer_input"), p->engram_dim);
        synth_set_arr(m, K("ple.layer_multipliers"), GGUF_VT_UINT64, e->mult, (uint64_t)p->n_engram * p->ngram);
        synth_set_arr(m, K("ple.head_offsets"), GGUF_VT_UINT64, e->offs, e->ncol);
        synth_set_arr(m, K("ple.head_vocab_sizes"), GGUF_VT_UINT64, e->sizes, e->ncol);
        synth_set_u32(m, K("engram.pad_token_id"), p->engram_pad);
        synth_set_arr(m, K("engram.token_map"), GGUF_VT_INT32, e->tmap, e->n_map);
    }
    synth_set_u32(m, "general.quantization_version", 2);
}

/* The tokenizer keys (gpt2 byte-level BPE, deepseek-v3 pre-tokenizer) of the built vocab. */
static void tokenizer_keys(synth_model *m, const vocab_out *v) {
    synth_set_str(m, "tokenizer.ggml.model", "gpt2");
    synth_set_str(m, "tokenizer.ggml.pre", "deepseek-v3");
    synth_set_arr_str(m, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->len, v->n);
    synth_set_arr(m, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->type, v->n);
    synth_set_arr_str(m, "tokenizer.ggml.merges", (const char *const *)v->merges, v->mlen, v->n_merges);
    synth_set_u32(m, "tokenizer.ggml.bos_token_id", 0);
    synth_set_u32(m, "tokenizer.ggml.eos_token_id", 1);
    synth_set_u32(m, "tokenizer.ggml.padding_token_id", 2);
    synth_set_bool(m, "tokenizer.ggml.add_bos_token", true);
    synth_set_bool(m, "tokenizer.ggml.add_eos_token", false);
}

/* ================================================================ entry points */

/* Engram constants (gguf-layout §2.4): per column a distinct prime >= engram_vocab (one
 * increasing sequence over all columns, like the seed's global `seen` set), absolute offsets
 * = running sum, multipliers odd and < (INT64_MAX / n_compressed) so the rolling hash of
 * §4.2 never overflows int64 the way the reference computes it; then, for a model without a
 * tokenizer, e->n_map random token map values in [0, n_compressed) from the same stream. */
static void engram_consts(const preset *p, uint32_t n_compressed, uint64_t seed, engram_tables *e) {
    e->ncol = p->n_engram ? (uint64_t)p->n_engram * (p->ngram > 1 ? p->ngram - 1 : 0) * p->heads_per_ngram : 0;
    uint64_t nmult = (uint64_t)p->n_engram * p->ngram;
    e->mult = dsf_xcalloc(nmult + 1, sizeof *e->mult);
    e->offs = dsf_xcalloc(e->ncol + 1, sizeof *e->offs);
    e->sizes = dsf_xcalloc(e->ncol + 1, sizeof *e->sizes);
    uint64_t cur = p->engram_vocab ? p->engram_vocab - 1 : 1;
    e->rows = 0;
    for (uint64_t c = 0; c < e->ncol; c++) {
        do cur++; while (!is_prime(cur));
        e->sizes[c] = cur;
        e->offs[c] = e->rows;
        e->rows += cur;
    }
    rng r = {seed ^ 0xE7A3ull};
    uint64_t bound = ((uint64_t)INT64_MAX / (n_compressed ? n_compressed : 1)) / 2;
    for (uint64_t i = 0; i < nmult; i++) e->mult[i] = (rng_next(&r) % bound) * 2 + 1;
    if (!e->tmap) {
        e->tmap_random = dsf_xcalloc(e->n_map + 1u, sizeof *e->tmap_random);
        for (uint32_t i = 0; i < e->n_map; i++)
            e->tmap_random[i] = (int32_t)(rng_next(&r) % (n_compressed ? n_compressed : 1));
        e->tmap = e->tmap_random;
    }
}

static void engram_free(engram_tables *e) {
    free(e->mult);
    free(e->offs);
    free(e->sizes);
    free(e->tmap_random);
}

synth_model *synth_model_new(const synth_params *p, uint64_t seed, char *err) {
    if (p->n_layer < 1 || p->n_layer > SYNTH_MAX_LAYERS || (p->n_ratio && p->n_ratio < (int)p->n_layer) ||
        p->n_ratio > SYNTH_MAX_LAYERS + 4 || p->n_engram > SYNTH_MAX_LAYERS || p->n_kvsrc > SYNTH_MAX_LAYERS ||
        p->n_idxsrc > SYNTH_MAX_LAYERS) {
        dsf_seterr(err, "synth: layer counts outside what the builder supports");
        return NULL;
    }
    vocab_out v;
    memset(&v, 0, sizeof v);
    engram_tables e;
    memset(&e, 0, sizeof e);
    uint32_t n_compressed = p->n_compressed;
    if (p->tokenizer) {
        build_vocab(&v, p->vocab);
        n_compressed = v.n_compressed;
        e.tmap = v.token_map;
        e.n_map = v.n;
    } else {
        e.n_map = p->n_token_map ? p->n_token_map : p->vocab;
    }
    engram_consts(p, n_compressed, seed, &e);
    synth_model *m = synth_model_alloc(seed);
    model_keys(m, p);
    attention_engram_keys(m, p, &e);
    if (p->tokenizer) tokenizer_keys(m, &v);
    build_tensors(p, m, e.rows);
    engram_free(&e);
    vocab_free(&v);
    return m;
}

/* Retypes m as o says, counts its data bytes, writes it to path (NULL: nothing), frees it. */
static int finish(synth_model *m, const char *path, const synth_write_opts *o, char *note, size_t cap,
                  uint64_t *data_bytes, char *err) {
    int rc = o->recipe ? synth_quantize_recipe(m, o->recipe, err) : synth_quantize(m, o->type, o->expert_type, note, cap, err);
    if (!rc && o->fp8_exact) synth_fp8_exact(m);
    if (!rc && o->native) synth_native(m);
    if (!rc && data_bytes) {
        *data_bytes = synth_model_data_bytes(m);
        if (!*data_bytes) rc = dsf_seterr(err, "synth: a tensor's size is unknown");
    }
    if (!rc && path) rc = o->header_only ? synth_model_write_header(m, path, err) : synth_model_write(m, path, err);
    synth_model_free(m);
    return rc;
}

static int head_dspark(gguf_writer *w, const void *ctx, char *err) { return dspark_meta_write(w, ctx, err); }

#define DSPARK_STAGES 3 /* num_nextn_predict_layers (gguf-layout.md §4.1) */
#define DSPARK_BLOCK 5  /* dspark_block_size */

uint64_t synth_data_bytes(const char *name) {
    uint64_t n = 0;
    return synth_write_ex(name, NULL, 0, NULL, NULL, 0, &n, NULL) < 0 ? 0 : n;
}

int synth_write(const char *name, const char *path, uint64_t seed, char *err) {
    return synth_write_ex(name, path, seed, NULL, NULL, 0, NULL, err);
}

/* path NULL: lays out the tensors only (no keys, no tokenizer) to count their bytes. */
int synth_write_ex(const char *name, const char *path, uint64_t seed, const synth_write_opts *o, char *note,
                   size_t cap, uint64_t *data_bytes, char *err) {
    static const synth_write_opts defaults = {.type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    const preset *p = find_preset(name);
    if (!o) o = &defaults;
    if (note && cap) note[0] = 0;
    if (!p) return dsf_seterr(err, "unknown preset '%s' (tiny, tiny-roles, bench, bench-moe, real)", name ? name : "(null)");
    preset big;
    const uint64_t ncol = (uint64_t)p->n_engram * (p->ngram > 1 ? p->ngram - 1 : 0) * p->heads_per_ngram;
    if (o->engram_rows && ncol) {
        if (o->engram_rows / ncol < 2 || o->engram_rows / ncol > 0xF0000000u)
            return dsf_seterr(err, "synth: --engram-rows %llu: wants 2 to 4e9 rows per column (%llu columns)",
                              (unsigned long long)o->engram_rows, (unsigned long long)ncol);
        big = *p;
        big.engram_vocab = (uint32_t)(o->engram_rows / ncol);
        p = &big;
    }
    synth_model *m;
    if (path) {
        m = synth_model_new(p, seed, err);
        if (!m) return -1;
    } else {
        engram_tables e;
        memset(&e, 0, sizeof e);
        engram_consts(p, p->vocab, 0, &e);
        m = synth_model_alloc(0);
        build_tensors(p, m, e.rows);
        engram_free(&e);
    }
    return finish(m, path, o, note, cap, data_bytes, err);
}

/* The DSpark draft of the preset (gguf-layout.md §4): 3 window-only stages with the preset's
 * widths and experts (no compressor, indexer or Engram), no token_embd/output (shared with the
 * main model), the global tensors of §4.1, the converter's keys (dspark_meta.c), the preset's
 * tokenizer and a noise token. Its weights are seeded apart from the main model's. */
int synth_write_dspark(const char *name, const char *path, uint64_t seed, const synth_write_opts *o, char *err) {
    static const synth_write_opts defaults = {.type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    const preset *p = find_preset(name);
    if (!o) o = &defaults;
    if (!p) return dsf_seterr(err, "unknown preset '%s' (tiny, tiny-roles, bench, bench-moe, real)", name ? name : "(null)");
    preset d = *p; /* the stages: blocks with ratio 0 and no roles */
    d.n_layer = DSPARK_STAGES;
    d.n_ratio = 0;
    memset(d.ratios, 0, sizeof d.ratios);
    d.n_kvsrc = d.n_idxsrc = d.n_engram = 0;
    d.cand_layer = -1;
    d.vl_bias = false;
    /* the release's draft MoE (dspark_n_routed_experts 128, top 3; gguf-layout.md §4.3), or the
     * preset's when smaller (tiny: 8, top 2, like tinyds) */
    d.n_expert = p->n_expert < 128 ? p->n_expert : 128;
    d.n_used = p->n_used < 3 ? p->n_used : 3;
    synth_model *m = synth_model_alloc(hash_str("dspark", seed));
    build_tensors(&d, m, 0);
    synth_drop_tensor(m, "token_embd.weight");
    synth_drop_tensor(m, "output.weight");
    synth_drop_tensor(m, "output_norm.weight");
    uint32_t targets[DSPARK_STAGES], nt = p->n_layer < DSPARK_STAGES ? p->n_layer : DSPARK_STAGES;
    for (uint32_t i = 0; i < nt; i++) targets[i] = p->n_layer - nt + i; /* the last layers */
    const int64_t D = p->n_embd, R = D >= 4096 ? 256 : 16; /* the release's Markov rank; tinyds's */
    synth_tensor(m, p->dense_type, K_DENSE, nt * D, 2, nt * D, D, 1, "fc.weight");
    synth_tensor(m, F32, K_NORM, 0, 1, D, 1, 1, "enc.output_norm.weight");
    synth_tensor(m, F32, K_NORM, 0, 1, D, 1, 1, "output_norm.weight");
    synth_tensor(m, p->dense_type, K_EMBED, 0, 2, R, p->vocab, 1, "markov_w1.weight");
    synth_tensor(m, p->dense_type, K_DENSE, R, 2, R, p->vocab, 1, "markov_w2.weight");
    synth_tensor(m, F32, K_DENSE, D + R, 2, D + R, 1, 1, "conf_proj.weight");
    char dname[256];
    snprintf(dname, sizeof dname, "%s-dspark", p->name);
    const dspark_meta meta = {
        .name = dname, .n_stages = DSPARK_STAGES, .ctx = p->ctx, .n_embd = p->n_embd, .ff = p->ff,
        .n_head = p->n_head, .head_dim = p->head_dim, .n_rot = p->n_rot, .q_lora = p->q_lora, .window = p->window,
        .n_expert = d.n_expert, .n_used = d.n_used, .n_shared = p->n_shared, .o_groups = p->o_groups,
        .o_lora = p->o_lora, .hc = p->hc, .sinkhorn = p->sinkhorn, .block = DSPARK_BLOCK, .rope_base = 10000.0f,
        .eps = p->eps, .route_scale = p->route_scale, .swiglu = p->swiglu, .hc_eps = p->hc_eps, .norm_topk = true,
        .targets = targets, .n_targets = nt};
    synth_set_head(m, head_dspark, &meta);
    synth_set_u32(m, "general.file_type", 38); /* a --recipe replaces it */
    synth_set_u32(m, "general.quantization_version", 2);
    if (p->tokenizer) {
        vocab_out v;
        memset(&v, 0, sizeof v);
        build_vocab(&v, p->vocab);
        tokenizer_keys(m, &v);
        vocab_free(&v);
    }
    /* the release's noise token (dspark_noise_token_id 128799); tinyds's 1008 of 1024 */
    synth_set_u32(m, "tokenizer.ggml.mask_token_id", p->vocab == 129280 ? 128799 : p->vocab - 16);
    return finish(m, path, o, NULL, 0, NULL, err);
}
