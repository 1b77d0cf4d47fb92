/* synth.c: random-weight deepseek41 GGUF files (see synth.h).
 *
 * Owns: the two presets' hyper-parameters, the derivation of per-layer roles (KV source,
 * top-k source, candidate source, Engram) exactly as gguf-layout §2.5 states it, the tensor
 * set of §3.2 with its dtypes (BF16 dense, F32 norms/router/hc/sinks/biases/engram_gate,
 * MXFP4 experts, BF16 Engram table), the Engram/PLE keys (primes, absolute offsets, odd
 * multipliers, token map) and a byte-level BPE tokenizer trained on a built-in text.
 * Must not: hold tensor data (everything is generated in 1 MiB chunks and streamed), or
 * write anything a deepseek41 loader would refuse.
 * Invariant: output = f(preset, seed); a different seed changes every tensor. */
#include "convert/synth.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"
#include "text/bytelevel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ presets */

#define MAX_LAYERS 16

typedef struct {
    const char *name;
    uint32_t n_embd, n_layer, n_head, head_dim, n_rot, q_lora, o_groups, o_lora, window;
    uint32_t n_expert, n_used, ff, n_shared;
    uint32_t idx_heads, idx_dim, idx_topk;
    int32_t cand_layer;
    uint32_t cand_blocks, cand_bsize;
    uint32_t hc, sinkhorn;
    uint32_t ngram, heads_per_ngram, engram_dim, engram_vocab;
    uint32_t vocab, ctx, orig_ctx;
    float yarn_factor;
    int n_ratio;
    int32_t ratios[MAX_LAYERS + 1];
    int n_kvsrc, n_idxsrc, n_engram;
    uint32_t kvsrc[MAX_LAYERS], idxsrc[MAX_LAYERS], engram[MAX_LAYERS];
} preset;

/* Both presets share tiny41's topology (README "The model"): layer 0/1 window only, 2-4
 * ratio 2 (2 and 4 KV + index sources, 3 reuses 2), 5-7 ratio 1 (5 source + candidate
 * source, 6 reuses 5, 7 re-indexes with 5's keys), Engram before layers 1 and 4. The extra
 * trailing compress_ratios entry mirrors the release's disabled MTP/DSpark stages. */
static const preset presets[] = {
    {.name = "tiny", .n_embd = 128, .n_layer = 8, .n_head = 4, .head_dim = 64, .n_rot = 16, .q_lora = 64,
     .o_groups = 2, .o_lora = 32, .window = 8, .n_expert = 8, .n_used = 2, .ff = 64, .n_shared = 1,
     .idx_heads = 8, .idx_dim = 32, .idx_topk = 8, .cand_layer = 5, .cand_blocks = 3, .cand_bsize = 4,
     .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 2, .engram_dim = 32, .engram_vocab = 101,
     .vocab = 1024, .ctx = 4096, .orig_ctx = 64, .yarn_factor = 4.0f,
     .n_ratio = 9, .ratios = {0, 0, 2, 2, 2, 1, 1, 1, 0},
     .n_kvsrc = 3, .kvsrc = {2, 4, 5}, .n_idxsrc = 4, .idxsrc = {2, 4, 5, 7}, .n_engram = 2, .engram = {1, 4}},
    {.name = "bench", .n_embd = 5120, .n_layer = 8, .n_head = 64, .head_dim = 512, .n_rot = 64, .q_lora = 1280,
     .o_groups = 8, .o_lora = 1024, .window = 128, .n_expert = 32, .n_used = 6, .ff = 2304, .n_shared = 1,
     .idx_heads = 32, .idx_dim = 128, .idx_topk = 512, .cand_layer = 5, .cand_blocks = 2048, .cand_bsize = 8,
     .hc = 4, .sinkhorn = 20, .ngram = 4, .heads_per_ngram = 8, .engram_dim = 256, .engram_vocab = 4001,
     .vocab = 129280, .ctx = 1048576, .orig_ctx = 65536, .yarn_factor = 16.0f,
     .n_ratio = 9, .ratios = {0, 0, 2, 2, 2, 1, 1, 1, 0},
     .n_kvsrc = 3, .kvsrc = {2, 4, 5}, .n_idxsrc = 4, .idxsrc = {2, 4, 5, 7}, .n_engram = 2, .engram = {1, 4}},
};

static const preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (name && !strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

/* gguf-layout §2.5: the latest listed source <= il, for layers with ratio > 0; else -1. */
static int latest_src(const preset *p, const uint32_t *src, int n, int il) {
    if (p->ratios[il] == 0) return -1;
    int s = -1;
    for (int i = 0; i < n; i++)
        if ((int)src[i] <= il) s = (int)src[i];
    return s;
}

static int is_engram(const preset *p, int il) {
    for (int i = 0; i < p->n_engram; i++)
        if ((int)p->engram[i] == il) return 1;
    return 0;
}

/* ================================================================ random numbers */

typedef struct { uint64_t s; } rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(rng *r) { /* [-1, 1) */
    return (float)(int32_t)(uint32_t)(rng_next(r) >> 32) * (1.0f / 2147483648.0f);
}

static uint64_t hash_str(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

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

enum kind { K_NORM, K_DENSE, K_BIAS, K_SINK, K_HC_BASE, K_HC_SCALE, K_EMBED, K_MXFP4 };

typedef struct {
    char name[GGUF_MAX_NAME];
    uint32_t type, n_dims;
    int64_t ne[3];
    enum kind kind;
    int64_t fan_in; /* for K_DENSE / K_MXFP4 scaling */
} tspec;

typedef struct {
    tspec *t;
    int n, cap;
} tlist;

static void add_t(tlist *l, uint32_t type, enum kind kind, int64_t fan_in, uint32_t n_dims, int64_t ne0,
                  int64_t ne1, int64_t ne2, const char *fmt, ...) DSF_PRINTF(9, 10);
static void add_t(tlist *l, uint32_t type, enum kind kind, int64_t fan_in, uint32_t n_dims, int64_t ne0,
                  int64_t ne1, int64_t ne2, const char *fmt, ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = dsf_xrealloc(l->t, (size_t)l->cap * sizeof *l->t);
    }
    tspec *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->type = type;
    t->kind = kind;
    t->fan_in = fan_in;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
}

#define F32 GGML_TYPE_F32
#define BF16 GGML_TYPE_BF16
#define MX GGML_TYPE_MXFP4

/* The tensor set of gguf-layout §3.2 for this preset, in the converter's order (§3.4): the
 * experts of every layer, the Engram table, then the rest. */
static void build_tensors(const preset *p, tlist *l, uint64_t engram_rows) {
    const int64_t D = p->n_embd, H = p->n_head, dh = p->head_dim, E = p->n_expert, ff = p->ff;
    const int64_t nhc = (int64_t)p->hc * (2 + p->hc); /* 24 mix rows: pre, post, comb */
    for (uint32_t il = 0; il < p->n_layer; il++) {
        add_t(l, MX, K_MXFP4, D, 3, D, ff, E, "blk.%u.ffn_gate_exps.weight", il);
        add_t(l, MX, K_MXFP4, ff, 3, ff, D, E, "blk.%u.ffn_down_exps.weight", il);
        add_t(l, MX, K_MXFP4, D, 3, D, ff, E, "blk.%u.ffn_up_exps.weight", il);
    }
    if (p->n_engram) add_t(l, BF16, K_EMBED, 0, 2, p->engram_dim, (int64_t)engram_rows, 1, "per_layer_token_embd.weight");
    add_t(l, BF16, K_EMBED, 0, 2, D, p->vocab, 1, "token_embd.weight");
    for (uint32_t il = 0; il < p->n_layer; il++) {
        int kv = latest_src(p, p->kvsrc, p->n_kvsrc, (int)il), ix = latest_src(p, p->idxsrc, p->n_idxsrc, (int)il);
        add_t(l, F32, K_DENSE, p->hc * D, 2, p->hc * D, nhc, 1, "blk.%u.hc_attn_fn.weight", il);
        add_t(l, F32, K_DENSE, p->hc * D, 2, p->hc * D, nhc, 1, "blk.%u.hc_ffn_fn.weight", il);
        add_t(l, F32, K_HC_BASE, 0, 1, nhc, 1, 1, "blk.%u.hc_attn_base.weight", il);
        add_t(l, F32, K_HC_BASE, 0, 1, nhc, 1, 1, "blk.%u.hc_ffn_base.weight", il);
        add_t(l, F32, K_HC_SCALE, 0, 1, 3, 1, 1, "blk.%u.hc_attn_scale.weight", il);
        add_t(l, F32, K_HC_SCALE, 0, 1, 3, 1, 1, "blk.%u.hc_ffn_scale.weight", il);
        add_t(l, F32, K_SINK, 0, 1, H, 1, 1, "blk.%u.attn_sinks.weight", il);
        add_t(l, BF16, K_DENSE, D, 2, D, p->q_lora, 1, "blk.%u.attn_q_a.weight", il);
        add_t(l, F32, K_NORM, 0, 1, p->q_lora, 1, 1, "blk.%u.attn_q_a_norm.weight", il);
        add_t(l, BF16, K_DENSE, p->q_lora, 2, p->q_lora, H * dh, 1, "blk.%u.attn_q_b.weight", il);
        add_t(l, BF16, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_kv.weight", il);
        add_t(l, F32, K_NORM, 0, 1, dh, 1, 1, "blk.%u.attn_kv_a_norm.weight", il);
        /* written 2-D like the converter; the loader re-views it as {H*dh/og, olr, og} */
        add_t(l, BF16, K_DENSE, H * dh / p->o_groups, 2, H * dh / p->o_groups, (int64_t)p->o_groups * p->o_lora, 1,
              "blk.%u.attn_output_a.weight", il);
        add_t(l, BF16, K_DENSE, (int64_t)p->o_groups * p->o_lora, 2, (int64_t)p->o_groups * p->o_lora, D, 1,
              "blk.%u.attn_output_b.weight", il);
        if (kv == (int)il) {
            add_t(l, F32, K_NORM, 0, 1, dh, 1, 1, "blk.%u.attn_compressor_norm.weight", il);
            add_t(l, BF16, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_compressor_kv.weight", il);
            if (p->ratios[il] > 1) add_t(l, BF16, K_DENSE, D, 2, D, dh, 1, "blk.%u.attn_compressor_gate.weight", il);
        }
        if (ix == (int)il) {
            add_t(l, BF16, K_DENSE, p->q_lora, 2, p->q_lora, (int64_t)p->idx_heads * p->idx_dim, 1,
                  "blk.%u.indexer.attn_q_b.weight", il);
            add_t(l, BF16, K_DENSE, D, 2, D, p->idx_heads, 1, "blk.%u.indexer.proj.weight", il);
        }
        if (kv == (int)il) {
            add_t(l, BF16, K_DENSE, dh, 2, dh, p->idx_dim, 1, "blk.%u.indexer.attn_k.weight", il);
            add_t(l, F32, K_NORM, 0, 1, p->idx_dim, 1, 1, "blk.%u.indexer.k_norm.weight", il);
        }
        if (is_engram(p, (int)il)) {
            int64_t n_heads = (int64_t)(p->ngram - 1) * p->heads_per_ngram;
            add_t(l, F32, K_DENSE, D, 2, D, p->hc, 1, "blk.%u.engram_gate.weight", il);
            add_t(l, BF16, K_DENSE, n_heads * p->engram_dim, 2, n_heads * p->engram_dim, D * (p->hc + 1), 1,
                  "blk.%u.engram_kv.weight", il);
        }
        add_t(l, F32, K_DENSE, D, 2, D, E, 1, "blk.%u.ffn_gate_inp.weight", il);
        add_t(l, F32, K_BIAS, 0, 1, E, 1, 1, "blk.%u.exp_probs_b.bias", il);
        add_t(l, BF16, K_DENSE, D, 2, D, ff, 1, "blk.%u.ffn_gate_shexp.weight", il);
        add_t(l, BF16, K_DENSE, ff, 2, ff, D, 1, "blk.%u.ffn_down_shexp.weight", il);
        add_t(l, BF16, K_DENSE, D, 2, D, ff, 1, "blk.%u.ffn_up_shexp.weight", il);
        add_t(l, F32, K_NORM, 0, 1, D, 1, 1, "blk.%u.attn_norm.weight", il);
        add_t(l, F32, K_NORM, 0, 1, D, 1, 1, "blk.%u.ffn_norm.weight", il);
    }
    add_t(l, F32, K_NORM, 0, 1, D, 1, 1, "output_norm.weight");
    add_t(l, BF16, K_DENSE, D, 2, D, p->vocab, 1, "output.weight");
}

static uint64_t tensor_bytes(const tspec *t) {
    uint64_t n = (uint64_t)t->ne[0] / ggml_blck_size(t->type) * ggml_type_size(t->type);
    for (uint32_t d = 1; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
    return n;
}

/* A value of the tensor's distribution: uniform with the target standard deviation. */
static float sample(const tspec *t, rng *r) {
    float u = rng_uniform(r);
    switch (t->kind) {
    case K_NORM: return 1.0f + 0.1f * u;
    case K_DENSE: return u * sqrtf(3.0f / (float)t->fan_in); /* std 1/sqrt(fan_in): O(1) outputs */
    case K_BIAS: return 0.01f * u;
    case K_SINK: return u;
    case K_HC_BASE: return 0.5f * u;
    case K_HC_SCALE: return 0.3f + 0.2f * u;
    case K_EMBED: return u * 1.7320508f; /* std 1 */
    case K_MXFP4: return 0;
    }
    return 0;
}

/* MXFP4 blocks: random codes (all 16), e around the exponent that gives std 1/sqrt(fan_in):
 * E[kv^2] over the 16 codes is 34.25 (kvalues are doubled e2m1, §1.5), so
 * 2^(e-128) * sqrt(34.25) = 1/sqrt(fan_in). */
static void mxfp4_blocks(const tspec *t, rng *r, uint8_t *dst, uint64_t n_blocks) {
    int e0 = (int)lround(128.0 - log2(sqrt(34.25) * sqrt((double)t->fan_in)));
    for (uint64_t b = 0; b < n_blocks; b++) {
        uint64_t u = rng_next(r);
        dst[b * 17] = (uint8_t)(e0 - 1 + (int)(u % 3));
        uint64_t v = rng_next(r), w = rng_next(r);
        memcpy(dst + b * 17 + 1, &v, 8);
        memcpy(dst + b * 17 + 9, &w, 8);
    }
}

static int write_tensor(gguf_writer *w, const tspec *t, uint64_t seed, uint8_t *buf, size_t cap, char *err) {
    rng r = {hash_str(t->name, seed)};
    uint64_t total = tensor_bytes(t), done = 0;
    while (done < total) {
        uint64_t n;
        if (t->type == MX) {
            uint64_t nb = (cap / 17 < (total - done) / 17) ? cap / 17 : (total - done) / 17;
            mxfp4_blocks(t, &r, buf, nb);
            n = nb * 17;
        } else if (t->type == BF16) {
            uint64_t ne = (cap / 2 < (total - done) / 2) ? cap / 2 : (total - done) / 2;
            for (uint64_t i = 0; i < ne; i++) {
                uint16_t h = f32_to_bf16(sample(t, &r));
                memcpy(buf + 2 * i, &h, 2);
            }
            n = ne * 2;
        } else {
            uint64_t ne = (cap / 4 < (total - done) / 4) ? cap / 4 : (total - done) / 4;
            for (uint64_t i = 0; i < ne; i++) {
                float f = sample(t, &r);
                memcpy(buf + 4 * i, &f, 4);
            }
            n = ne * 4;
        }
        if (gguf_writer_write(w, buf, n, err) < 0) return dsf_prefixerr(err, "tensor %s", t->name);
        done += n;
    }
    return 0;
}

/* ================================================================ metadata */

static int is_prime(uint64_t n) {
    if (n < 2) return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

#define K(suffix) (snprintf(key, sizeof key, "deepseek41.%s", suffix), key)
#define TRY(x) do { if ((x) < 0) goto fail; } while (0)

static int write_kvs(gguf_writer *w, const preset *p, const vocab_out *v, uint64_t seed, const uint64_t *mult,
                     const uint64_t *offs, const uint64_t *sizes, char *err) {
    char key[128];
    char name[64];
    snprintf(name, sizeof name, "dsflash-synth-%s", p->name);
    TRY(gguf_writer_kv_str(w, "general.architecture", "deepseek41", err));
    TRY(gguf_writer_kv_str(w, "general.type", "model", err));
    TRY(gguf_writer_kv_str(w, "general.name", name, err));
    TRY(gguf_writer_kv_u32(w, K("block_count"), p->n_layer, err));
    TRY(gguf_writer_kv_u32(w, K("context_length"), p->ctx, err));
    TRY(gguf_writer_kv_u32(w, K("embedding_length"), p->n_embd, err));
    TRY(gguf_writer_kv_u32(w, K("attention.head_count"), p->n_head, err));
    TRY(gguf_writer_kv_u32(w, K("attention.head_count_kv"), 1, err));
    TRY(gguf_writer_kv_str(w, K("rope.scaling.type"), "yarn", err));
    TRY(gguf_writer_kv_f32(w, K("rope.scaling.factor"), p->yarn_factor, err));
    TRY(gguf_writer_kv_u32(w, K("rope.scaling.original_context_length"), p->orig_ctx, err));
    TRY(gguf_writer_kv_f32(w, K("rope.scaling.yarn_beta_fast"), 32.0f, err));
    TRY(gguf_writer_kv_f32(w, K("rope.scaling.yarn_beta_slow"), 1.0f, err));
    TRY(gguf_writer_kv_f32(w, K("rope.freq_base"), 10000.0f, err));
    TRY(gguf_writer_kv_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-20f, err));
    TRY(gguf_writer_kv_u32(w, K("expert_count"), p->n_expert, err));
    TRY(gguf_writer_kv_u32(w, K("expert_used_count"), p->n_used, err));
    TRY(gguf_writer_kv_u32(w, K("expert_gating_func"), 4, err)); /* sqrtsoftplus, §2.3 */
    TRY(gguf_writer_kv_u32(w, K("attention.key_length"), p->head_dim, err));
    TRY(gguf_writer_kv_u32(w, K("attention.value_length"), p->head_dim, err));
    TRY(gguf_writer_kv_u32(w, "general.file_type", 38, err));
    TRY(gguf_writer_kv_u32(w, K("rope.dimension_count"), p->n_rot, err));
    TRY(gguf_writer_kv_u32(w, K("attention.q_lora_rank"), p->q_lora, err));
    TRY(gguf_writer_kv_u32(w, K("attention.sliding_window"), p->window, err));
    TRY(gguf_writer_kv_u32(w, K("expert_feed_forward_length"), p->ff, err));
    TRY(gguf_writer_kv_u32(w, K("expert_shared_count"), p->n_shared, err));
    TRY(gguf_writer_kv_f32(w, K("expert_weights_scale"), 1.5f, err));
    TRY(gguf_writer_kv_bool(w, K("expert_weights_norm"), true, err));
    float clamp[MAX_LAYERS];
    for (uint32_t i = 0; i < p->n_layer; i++) clamp[i] = 10.0f;
    TRY(gguf_writer_kv_arr(w, K("swiglu_clamp_exp"), GGUF_VT_FLOAT32, clamp, p->n_layer, err));
    TRY(gguf_writer_kv_arr(w, K("swiglu_clamp_shexp"), GGUF_VT_FLOAT32, clamp, p->n_layer, err));
    TRY(gguf_writer_kv_u32(w, K("attention.indexer.head_count"), p->idx_heads, err));
    TRY(gguf_writer_kv_u32(w, K("attention.indexer.key_length"), p->idx_dim, err));
    TRY(gguf_writer_kv_u32(w, K("attention.indexer.top_k"), p->idx_topk, err));
    TRY(gguf_writer_kv_u32(w, K("attention.output_group_count"), p->o_groups, err));
    TRY(gguf_writer_kv_u32(w, K("attention.output_lora_rank"), p->o_lora, err));
    TRY(gguf_writer_kv_arr(w, K("attention.compress_ratios"), GGUF_VT_INT32, p->ratios, (uint64_t)p->n_ratio, err));
    TRY(gguf_writer_kv_f32(w, K("attention.compress_rope_freq_base"), 160000.0f, err));
    TRY(gguf_writer_kv_u32(w, K("hyper_connection.count"), p->hc, err));
    TRY(gguf_writer_kv_u32(w, K("hyper_connection.sinkhorn_iterations"), p->sinkhorn, err));
    TRY(gguf_writer_kv_f32(w, K("hyper_connection.epsilon"), 1e-6f, err));
    TRY(gguf_writer_kv_u32(w, K("hash_layer_count"), 0, err));
    TRY(gguf_writer_kv_arr(w, K("attention.kv_source_layers"), GGUF_VT_UINT32, p->kvsrc, (uint64_t)p->n_kvsrc, err));
    TRY(gguf_writer_kv_arr(w, K("attention.indexer.source_layers"), GGUF_VT_UINT32, p->idxsrc, (uint64_t)p->n_idxsrc, err));
    if (p->cand_layer >= 0) {
        TRY(gguf_writer_kv_i32(w, K("attention.indexer.candidate_source_layer"), p->cand_layer, err));
        TRY(gguf_writer_kv_u32(w, K("attention.indexer.candidate_top_k_blocks"), p->cand_blocks, err));
        TRY(gguf_writer_kv_u32(w, K("attention.indexer.candidate_block_size"), p->cand_bsize, err));
    }
    if (p->n_engram) {
        uint64_t ncol = (uint64_t)p->n_engram * (p->ngram - 1) * p->heads_per_ngram;
        TRY(gguf_writer_kv_arr(w, K("ple.layers"), GGUF_VT_UINT32, p->engram, (uint64_t)p->n_engram, err));
        TRY(gguf_writer_kv_u32(w, K("ple.ngram_size"), p->ngram, err));
        TRY(gguf_writer_kv_u32(w, K("ple.heads_per_ngram"), p->heads_per_ngram, err));
        TRY(gguf_writer_kv_u32(w, K("embedding_length_per_layer_input"), p->engram_dim, err));
        TRY(gguf_writer_kv_arr(w, K("ple.layer_multipliers"), GGUF_VT_UINT64, mult, (uint64_t)p->n_engram * p->ngram, err));
        TRY(gguf_writer_kv_arr(w, K("ple.head_offsets"), GGUF_VT_UINT64, offs, ncol, err));
        TRY(gguf_writer_kv_arr(w, K("ple.head_vocab_sizes"), GGUF_VT_UINT64, sizes, ncol, err));
        TRY(gguf_writer_kv_u32(w, K("engram.pad_token_id"), 2, err));
        TRY(gguf_writer_kv_arr(w, K("engram.token_map"), GGUF_VT_INT32, v->token_map, v->n, err));
    }
    TRY(gguf_writer_kv_u32(w, "general.quantization_version", 2, err));
    TRY(gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", err));
    TRY(gguf_writer_kv_str(w, "tokenizer.ggml.pre", "deepseek-v3", err));
    TRY(gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->len, v->n, err));
    TRY(gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->type, v->n, err));
    TRY(gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->mlen, v->n_merges, err));
    TRY(gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 0, err));
    TRY(gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 1, err));
    TRY(gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", 2, err));
    TRY(gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", true, err));
    TRY(gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", false, err));
    (void)seed;
    return 0;
fail:
    return -1;
}

/* ================================================================ entry points */

/* Engram constants (gguf-layout §2.4): per column a distinct prime >= engram_vocab (one
 * increasing sequence over all columns, like the seed's global `seen` set), absolute offsets
 * = running sum, multipliers odd and < (INT64_MAX / n_compressed) so the rolling hash of
 * §4.2 never overflows int64 the way the reference computes it. Returns the table rows. */
static uint64_t engram_consts(const preset *p, uint32_t n_compressed, uint64_t seed, uint64_t *mult,
                              uint64_t *offs, uint64_t *sizes) {
    uint64_t ncol = (uint64_t)p->n_engram * (p->ngram - 1) * p->heads_per_ngram;
    uint64_t cur = p->engram_vocab - 1, rows = 0;
    for (uint64_t c = 0; c < ncol; c++) {
        do cur++; while (!is_prime(cur));
        sizes[c] = cur;
        offs[c] = rows;
        rows += cur;
    }
    rng r = {seed ^ 0xE7A3ull};
    uint64_t bound = ((uint64_t)INT64_MAX / (n_compressed ? n_compressed : 1)) / 2;
    for (uint64_t i = 0; i < (uint64_t)p->n_engram * p->ngram; i++) mult[i] = (rng_next(&r) % bound) * 2 + 1;
    return rows;
}

uint64_t synth_data_bytes(const char *name) {
    const preset *p = find_preset(name);
    if (!p) return 0;
    uint64_t mult[64], offs[256], sizes[256];
    uint64_t rows = p->n_engram ? engram_consts(p, p->vocab, 0, mult, offs, sizes) : 0;
    tlist l = {0};
    build_tensors(p, &l, rows);
    uint64_t n = 0;
    for (int i = 0; i < l.n; i++) n += tensor_bytes(&l.t[i]);
    free(l.t);
    return n;
}

int synth_write(const char *name, const char *path, uint64_t seed, char *err) {
    const preset *p = find_preset(name);
    if (!p) return dsf_seterr(err, "unknown preset '%s' (tiny, bench)", name ? name : "(null)");
    uint64_t ncol = (uint64_t)p->n_engram * (p->ngram - 1) * p->heads_per_ngram;
    DSF_ASSERT(ncol <= 256 && (uint64_t)p->n_engram * p->ngram <= 64);
    vocab_out v;
    memset(&v, 0, sizeof v);
    build_vocab(&v, p->vocab);
    uint64_t mult[64], offs[256], sizes[256];
    uint64_t rows = p->n_engram ? engram_consts(p, v.n_compressed, seed, mult, offs, sizes) : 0;
    tlist l = {0};
    build_tensors(p, &l, rows);

    int rc = -1;
    uint8_t *buf = NULL;
    gguf_writer *w = gguf_writer_new();
    if (write_kvs(w, p, &v, seed, mult, offs, sizes, err) < 0) goto done;
    for (int i = 0; i < l.n; i++)
        if (gguf_writer_tensor(w, l.t[i].name, l.t[i].type, l.t[i].n_dims, l.t[i].ne, err) < 0) goto done;
    if (gguf_writer_begin(w, path, err) < 0) goto done;
    const size_t cap = 1u << 20; /* a multiple of 2, 4 and 17 is not needed: chunks end on elements */
    buf = dsf_xmalloc(cap);
    for (int i = 0; i < l.n; i++)
        if (write_tensor(w, &l.t[i], seed, buf, cap, err) < 0) goto done;
    if (gguf_writer_finish(w, err) < 0) goto done;
    rc = 0;
done:
    free(buf);
    gguf_writer_free(w);
    free(l.t);
    vocab_free(&v);
    return rc;
}
