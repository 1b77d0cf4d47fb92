/* loader.c: every loader rule of gguf-layout.md §6.1/§6.2 that applies to a text
 * GGUF (S1-S14, B1-B5; B6 is the tokenizer's, which dsf_engine_open does not read) and the
 * engine's own shape requirements, each as one invalid variant of a valid random-weight base
 * model (tests/tmodel.h). Each variant must fail dsf_engine_open with an error that names the
 * key, the layer or the tensor, as the rule's message in the spec does. Plus: wrong key types,
 * every required key of B2 missing, extra/missing/mis-shaped tensors;
 * variants the spec says a loader must ACCEPT (scalar get_key_or_arr, 2-D/3-D wo_a, a larger
 * Engram table, the optional exp_probs_b_vl, ...), with the base model's exact logits where
 * only the encoding changed; and edge values no rule forbids (refused cleanly or run).
 * DSF_TEST_VERBOSE=1 prints every variant's error message. */
#include "dsflash.h"
#include "io/gguf.h"
#include "test.h"
#include "tmodel.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ================================================================ edit operations */

typedef enum {
    OP_END = 0,
    OP_DROP_KEY,   /* key */
    OP_SET_U32,    /* key = a */
    OP_SET_I32,    /* key = (int32)a */
    OP_SET_F32,    /* key = f */
    OP_SET_STR,    /* key = s */
    OP_RETYPE,     /* key -> value type a */
    OP_ARR_SET,    /* key[a] = b */
    OP_ARR_RESIZE, /* len(key) = a */
    OP_ARR_U32,    /* key = vals[0..a) as UINT32 array */
    OP_DROP_T,     /* tensor key */
    OP_ADD_T,      /* tensor key, type a, nd dims ne */
    OP_RESHAPE_T,  /* tensor key -> nd dims ne */
    OP_RETYPE_T,   /* tensor key -> ggml type a */
} opk;

typedef struct {
    opk op;
    const char *key; /* a leading '.' stands for "deepseek41." */
    uint64_t a, b;
    double f;
    const char *s;
    uint32_t nd;
    int64_t ne[4];
    uint32_t vals[8];
} edit_op;

typedef struct {
    const char *id;              /* rule id and what the variant does */
    void (*tweak)(tm_params *p); /* parameter change before the build (may be NULL) */
    edit_op ops[8];
    const char *want[3];         /* substrings the error must contain (NULL-terminated) */
} rcase;

static const char *kname(const char *k) {
    static char buf[4][160];
    static unsigned i;
    if (k[0] != '.') return k;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "deepseek41%s", k);
    return b;
}

static void apply(tm_model *m, void *ud) {
    const edit_op *ops = ud;
    for (int i = 0; i < 8 && ops[i].op != OP_END; i++) {
        const edit_op *o = &ops[i];
        const char *k = kname(o->key);
        switch (o->op) {
        case OP_END: break;
        case OP_DROP_KEY: tm_drop_key(m, k); break;
        case OP_SET_U32: tm_set_u32(m, k, (uint32_t)o->a); break;
        case OP_SET_I32: tm_set_i32(m, k, (int32_t)(int64_t)o->a); break;
        case OP_SET_F32: tm_set_f32(m, k, (float)o->f); break;
        case OP_SET_STR: tm_set_str(m, k, o->s); break;
        case OP_RETYPE: tm_retype_key(m, k, (uint32_t)o->a); break;
        case OP_ARR_SET: tm_arr_set(m, k, o->a, o->b); break;
        case OP_ARR_RESIZE: tm_arr_resize(m, k, o->a); break;
        case OP_ARR_U32: tm_set_arr_u32(m, k, o->vals, o->a); break;
        case OP_DROP_T: tm_drop_tensor(m, k); break;
        case OP_ADD_T: tm_add_tensor(m, k, (uint32_t)o->a, o->nd, o->ne); break;
        case OP_RESHAPE_T: tm_reshape_tensor(m, k, o->nd, o->ne); break;
        case OP_RETYPE_T: tm_retype_tensor(m, k, (uint32_t)o->a); break;
        }
    }
}

/* Builds the variant; returns the engine (NULL on refusal, err set). *werr is set when the
 * builder or writer itself refused (a test bug, reported as such). */
static dsf_engine *open_variant(void (*tweak)(tm_params *), const edit_op *ops, char *err, int *werr) {
    tm_params p;
    tm_params_default(&p);
    if (tweak) tweak(&p);
    const char *path = tm_path("rule");
    *werr = 0;
    if (tm_write(&p, path, ops ? apply : NULL, (void *)ops, err) < 0) {
        *werr = 1;
        return NULL;
    }
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = DSF_NUMERICS_PLAIN;
    ep.n_threads = 1;
    err[0] = 0;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    unlink(path); /* the mapping stays valid after unlink */
    return e;
}

/* Runs a table of invalid variants; every one must be refused with all its substrings in
 * the message. Reports every failing case, not just the first. */
static void run_cases(test_ctx *t, const rcase *cs, int n) {
    int bad = 0;
    char all[900] = "";
    for (int i = 0; i < n; i++) {
        char err[DSF_ERR_LEN];
        int werr;
        dsf_engine *e = open_variant(cs[i].tweak, cs[i].ops, err, &werr);
        const char *why = NULL;
        char buf[DSF_ERR_LEN + 200];
        if (werr) {
            snprintf(buf, sizeof buf, "%s: could not build the variant: %s", cs[i].id, err);
            why = buf;
        } else if (e) {
            dsf_engine_close(e);
            snprintf(buf, sizeof buf, "%s: ACCEPTED (the rule is not enforced)", cs[i].id);
            why = buf;
        } else {
            for (int w = 0; w < 3 && cs[i].want[w]; w++)
                if (!strstr(err, kname(cs[i].want[w]))) {
                    snprintf(buf, sizeof buf, "%s: error lacks '%s': %s", cs[i].id, kname(cs[i].want[w]), err);
                    why = buf;
                    break;
                }
        }
        if (getenv("DSF_TEST_VERBOSE")) fprintf(stderr, "  %-60s -> %s\n", cs[i].id, e ? "(accepted)" : err);
        if (why) {
            bad++;
            fprintf(stderr, "  loader_rules: %s\n", why);
            if (strlen(all) + strlen(why) + 3 < sizeof all) {
                strcat(all, why);
                strcat(all, " | ");
            }
        }
    }
    CHECKF(bad == 0, "%d of %d variants wrong: %s", bad, n, all);
}

/* ================================================================ the base model */

/* Guards the harness itself: the base model (and its F32 twin) must load and produce finite
 * logits, or every refusal below would prove nothing. */
TEST(loader_base_model_loads_and_runs) {
    for (int v = 0; v < 2; v++) {
        tm_params p;
        tm_params_default(&p);
        if (v) {
            p.dense_type = GGML_TYPE_F32;
            p.expert_type = GGML_TYPE_F32;
        }
        const char *path = tm_path("base");
        char err[DSF_ERR_LEN];
        CHECKF(tm_write(&p, path, NULL, NULL, err) == 0, "write: %s", err);
        for (int num = 0; num < 2; num++) {
            dsf_engine_params ep;
            dsf_engine_params_default(&ep);
            ep.numerics = num ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
            ep.n_threads = 1;
            dsf_engine *e = dsf_engine_open(path, &ep, err);
            CHECKF(e, "base model (variant %d) refused: %s", v, err);
            CHECK(dsf_engine_n_vocab(e) == (int)p.n_vocab);
            dsf_session *s = dsf_session_new(e, 64, err);
            CHECKF(s, "session: %s", err);
            int32_t tok[24];
            for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 37 + 5) % (int)p.n_vocab);
            float *lg = malloc(24 * (size_t)p.n_vocab * sizeof(float));
            CHECKF(dsf_session_eval(s, tok, 24, lg, true, err) == 0, "eval: %s", err);
            for (size_t i = 0; i < 24 * (size_t)p.n_vocab; i++) CHECKF(isfinite(lg[i]), "logit %zu not finite", i);
            free(lg);
            dsf_session_free(s);
            dsf_engine_close(e);
        }
        unlink(path);
    }
}

/* ================================================================ §6.1 S1-S14 */

static void tw_mult9(tm_params *p) { /* 3 Engram layers x 3-grams = 9 multipliers > 8 */
    p->n_engram = 3;
    p->engram[0] = 0;
    p->engram[1] = 2;
    p->engram[2] = 4;
    p->engram_heads = 1;
}
static void tw_cols66(tm_params *p) { /* 1 Engram layer x 2 orders x 33 heads = 66 columns > 64 */
    p->n_engram = 1;
    p->engram_heads = 33;
}

#define KEY(k) .key = "." k
static const rcase s_cases[] = {
    {"S1 top_k 0", NULL, {{OP_SET_U32, KEY("attention.indexer.top_k"), .a = 0}}, {"indexer top_k must be > 0"}},
    {"S2 kv_source_layers missing", NULL, {{OP_DROP_KEY, KEY("attention.kv_source_layers")}},
     {"not found", ".attention.kv_source_layers"}},
    {"S2 indexer.source_layers missing", NULL, {{OP_DROP_KEY, KEY("attention.indexer.source_layers")}},
     {"not found", ".attention.indexer.source_layers"}},
    {"S3 kv source = block_count", NULL, {{OP_ARR_SET, KEY("attention.kv_source_layers"), .a = 1, .b = 6}},
     {"source layer out of range"}},
    {"S3 index source past block_count", NULL, {{OP_ARR_SET, KEY("attention.indexer.source_layers"), .a = 2, .b = 9}},
     {"source layer out of range"}},
    {"S4 kv source with ratio 0", NULL, {{OP_ARR_U32, KEY("attention.kv_source_layers"), .a = 3, .vals = {0, 1, 3}}},
     {"source layer 0 has compress ratio 0"}},
    {"S4 index source with ratio 0", NULL,
     {{OP_ARR_U32, KEY("attention.indexer.source_layers"), .a = 4, .vals = {0, 1, 3, 5}}},
     {"source layer 0 has compress ratio 0"}},
    {"S5 ratio 3", NULL, {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 2, .b = 3}}, {"layer 2: ratio 3"}},
    {"S5 ratio 3 on a source", NULL,
     {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 1, .b = 3},
      {OP_ARR_SET, KEY("attention.compress_ratios"), .a = 2, .b = 3}},
     {"layer 1: ratio 3"}},
    {"S5 no KV source at or before", NULL, {{OP_ARR_U32, KEY("attention.kv_source_layers"), .a = 1, .vals = {3}}},
     {"layer 1: ratio 2 without a matching kv/index source"}},
    {"S5 index source older than KV source", NULL,
     {{OP_ARR_U32, KEY("attention.indexer.source_layers"), .a = 2, .vals = {1, 5}}},
     {"layer 3: ratio 1 without a matching kv/index source"}},
    {"S5 KV source ratio differs", NULL, {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 2, .b = 1}},
     {"layer 2: ratio 1 without a matching kv/index source"}},
    {"S5 ratio>0 after the last ratio-2 source, before any ratio-1 source", NULL,
     {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 0, .b = 1}},
     {"layer 0: ratio 1 without"}},
    {"S6 candidate_top_k_blocks missing", NULL, {{OP_DROP_KEY, KEY("attention.indexer.candidate_top_k_blocks")}},
     {"not found", ".attention.indexer.candidate_top_k_blocks"}},
    {"S6 candidate_block_size missing", NULL, {{OP_DROP_KEY, KEY("attention.indexer.candidate_block_size")}},
     {"not found", ".attention.indexer.candidate_block_size"}},
    {"S7 candidate source = block_count", NULL, {{OP_SET_I32, KEY("attention.indexer.candidate_source_layer"), .a = 6}},
     {"invalid candidate selection"}},
    {"S7 candidate source not its own index source", NULL,
     {{OP_SET_I32, KEY("attention.indexer.candidate_source_layer"), .a = 4}},
     {"invalid candidate selection"}},
    {"S7 candidate source with ratio 0", NULL, {{OP_SET_I32, KEY("attention.indexer.candidate_source_layer"), .a = 0}},
     {"invalid candidate selection"}},
    {"S7 block size 0", NULL, {{OP_SET_U32, KEY("attention.indexer.candidate_block_size"), .a = 0}},
     {"invalid candidate selection"}},
    {"S7 top-k blocks 0", NULL, {{OP_SET_U32, KEY("attention.indexer.candidate_top_k_blocks"), .a = 0}},
     {"invalid candidate selection"}},
    {"S8 consumers with another ratio", NULL, {{OP_SET_I32, KEY("attention.indexer.candidate_source_layer"), .a = 1}},
     {"candidate consumers must share the source's compress ratio"}},
    {"S9 ple.ngram_size missing", NULL, {{OP_DROP_KEY, KEY("ple.ngram_size")}}, {"not found", ".ple.ngram_size"}},
    {"S9 ple.heads_per_ngram missing", NULL, {{OP_DROP_KEY, KEY("ple.heads_per_ngram")}},
     {"not found", ".ple.heads_per_ngram"}},
    {"S9 embedding_length_per_layer_input missing", NULL, {{OP_DROP_KEY, KEY("embedding_length_per_layer_input")}},
     {"not found", ".embedding_length_per_layer_input"}},
    {"S9 ple.layer_multipliers missing", NULL, {{OP_DROP_KEY, KEY("ple.layer_multipliers")}},
     {"not found", ".ple.layer_multipliers"}},
    {"S9 ple.head_offsets missing", NULL, {{OP_DROP_KEY, KEY("ple.head_offsets")}}, {"not found", ".ple.head_offsets"}},
    {"S9 ple.head_vocab_sizes missing", NULL, {{OP_DROP_KEY, KEY("ple.head_vocab_sizes")}},
     {"not found", ".ple.head_vocab_sizes"}},
    {"S9 engram.pad_token_id missing", NULL, {{OP_DROP_KEY, KEY("engram.pad_token_id")}},
     {"not found", ".engram.pad_token_id"}},
    {"S9 engram.token_map missing", NULL, {{OP_DROP_KEY, KEY("engram.token_map")}}, {"not found", ".engram.token_map"}},
    {"S10 ngram 1 (no columns)", NULL, {{OP_SET_U32, KEY("ple.ngram_size"), .a = 1}}, {"engram metadata is inconsistent"}},
    {"S10 heads 0", NULL, {{OP_SET_U32, KEY("ple.heads_per_ngram"), .a = 0}}, {"engram metadata is inconsistent"}},
    {"S10 dim 0", NULL, {{OP_SET_U32, KEY("embedding_length_per_layer_input"), .a = 0}},
     {"engram metadata is inconsistent"}},
    {"S10 multipliers length", NULL, {{OP_ARR_RESIZE, KEY("ple.layer_multipliers"), .a = 5}},
     {"engram metadata is inconsistent"}},
    {"S10 vocab sizes length", NULL, {{OP_ARR_RESIZE, KEY("ple.head_vocab_sizes"), .a = 7}},
     {"engram metadata is inconsistent"}},
    {"S10 offsets length", NULL, {{OP_ARR_RESIZE, KEY("ple.head_offsets"), .a = 9}}, {"engram metadata is inconsistent"}},
    {"S10 more than 8 multipliers", tw_mult9, {{.op = OP_END}}, {"engram metadata is inconsistent"}},
    {"S10 more than 64 heads", tw_cols66, {{.op = OP_END}}, {"engram metadata is inconsistent"}},
    {"S10 pad >= len(token_map)", NULL, {{OP_SET_U32, KEY("engram.pad_token_id"), .a = 256}},
     {"engram metadata is inconsistent"}},
    {"S11 Engram layer = block_count", NULL, {{OP_ARR_SET, KEY("ple.layers"), .a = 1, .b = 6}},
     {"engram layer 6 is out of range or out of order"}},
    {"S11 Engram layers decreasing", NULL, {{OP_ARR_U32, KEY("ple.layers"), .a = 2, .vals = {4, 0}}},
     {"engram layer 0 is out of range or out of order"}},
    {"S11 Engram layers repeated", NULL, {{OP_ARR_U32, KEY("ple.layers"), .a = 2, .vals = {4, 4}}},
     {"engram layer 4 is out of range or out of order"}},
    {"S12 vocab size 1", NULL, {{OP_ARR_SET, KEY("ple.head_vocab_sizes"), .a = 5, .b = 1}},
     {"engram head 5: bucket range out of range"}},
    {"S12 offset + size > INT32_MAX", NULL, {{OP_ARR_SET, KEY("ple.head_offsets"), .a = 3, .b = 2147483640u}},
     {"engram head 3: bucket range out of range"}},
    {"S12 offset > INT32_MAX", NULL, {{OP_ARR_SET, KEY("ple.head_offsets"), .a = 7, .b = 4294967296ull + 5}},
     {"engram head 7: bucket range out of range"}},
};

TEST(loader_rules_s1_to_s12) { run_cases(t, s_cases, (int)(sizeof s_cases / sizeof *s_cases)); }

/* The Engram table of the base model has exactly max(offset + size) rows: 8 columns, the
 * primes from 29 on: 29+31+37+41+43+47+53+59 = 340. */
#define PLE_ROWS 340
static const rcase t_cases[] = {
    {"S13 Engram table one row short", NULL,
     {{OP_RESHAPE_T, .key = "per_layer_token_embd.weight", .nd = 2, .ne = {32, PLE_ROWS - 1}}},
     {"per_layer_token_embd.weight", "too few for the Engram heads"}},
    {"S13 Engram table wrong width", NULL,
     {{OP_RESHAPE_T, .key = "per_layer_token_embd.weight", .nd = 2, .ne = {64, PLE_ROWS}}},
     {"per_layer_token_embd.weight"}},
    {"S13 Engram table missing", NULL, {{OP_DROP_T, .key = "per_layer_token_embd.weight"}},
     {"per_layer_token_embd.weight", "not found"}},
    {"S14 missing global", NULL, {{OP_DROP_T, .key = "output.weight"}}, {"'output.weight' not found"}},
    {"S14 missing output_norm", NULL, {{OP_DROP_T, .key = "output_norm.weight"}}, {"'output_norm.weight' not found"}},
    {"S14 missing compressor kv", NULL, {{OP_DROP_T, .key = "blk.3.attn_compressor_kv.weight"}},
     {"'blk.3.attn_compressor_kv.weight' not found"}},
    {"S14 missing compressor gate (ratio-2 source)", NULL, {{OP_DROP_T, .key = "blk.1.attn_compressor_gate.weight"}},
     {"'blk.1.attn_compressor_gate.weight' not found"}},
    {"S14 missing index key norm", NULL, {{OP_DROP_T, .key = "blk.1.indexer.k_norm.weight"}},
     {"'blk.1.indexer.k_norm.weight' not found"}},
    {"S14 missing indexer query (index-only source)", NULL, {{OP_DROP_T, .key = "blk.5.indexer.attn_q_b.weight"}},
     {"'blk.5.indexer.attn_q_b.weight' not found"}},
    {"S14 missing indexer proj", NULL, {{OP_DROP_T, .key = "blk.3.indexer.proj.weight"}},
     {"'blk.3.indexer.proj.weight' not found"}},
    {"S14 missing engram_kv", NULL, {{OP_DROP_T, .key = "blk.4.engram_kv.weight"}},
     {"'blk.4.engram_kv.weight' not found"}},
    {"S14 missing engram_gate", NULL, {{OP_DROP_T, .key = "blk.0.engram_gate.weight"}},
     {"'blk.0.engram_gate.weight' not found"}},
    {"S14 missing routed experts", NULL, {{OP_DROP_T, .key = "blk.5.ffn_down_exps.weight"}},
     {"'blk.5.ffn_down_exps.weight' not found"}},
    {"S14 missing sinks", NULL, {{OP_DROP_T, .key = "blk.2.attn_sinks.weight"}}, {"'blk.2.attn_sinks.weight' not found"}},
    {"S14 missing hc scale", NULL, {{OP_DROP_T, .key = "blk.0.hc_ffn_scale.weight"}},
     {"'blk.0.hc_ffn_scale.weight' not found"}},
    {"S14 missing router bias", NULL, {{OP_DROP_T, .key = "blk.4.exp_probs_b.bias"}},
     {"'blk.4.exp_probs_b.bias' not found"}},
    {"S14 wrong shape q_b", NULL, {{OP_RESHAPE_T, .key = "blk.2.attn_q_b.weight", .nd = 2, .ne = {32, 96}}},
     {"blk.2.attn_q_b.weight", "wrong shape"}},
    {"S14 wrong shape (transposed) kv", NULL, {{OP_RESHAPE_T, .key = "blk.0.attn_kv.weight", .nd = 2, .ne = {32, 64}}},
     {"blk.0.attn_kv.weight", "wrong shape"}},
    {"S14 wrong shape experts (n_expert)", NULL,
     {{OP_RESHAPE_T, .key = "blk.1.ffn_up_exps.weight", .nd = 3, .ne = {64, 32, 5}}},
     {"blk.1.ffn_up_exps.weight", "wrong shape"}},
    {"S14 wrong shape experts (2-D)", NULL,
     {{OP_RESHAPE_T, .key = "blk.1.ffn_gate_exps.weight", .nd = 2, .ne = {64, 128}}},
     {"blk.1.ffn_gate_exps.weight", "wrong shape"}},
    {"S14 wrong shape norm", NULL, {{OP_RESHAPE_T, .key = "blk.3.ffn_norm.weight", .nd = 1, .ne = {32}}},
     {"blk.3.ffn_norm.weight", "wrong shape"}},
    {"S14 wrong shape engram_gate", NULL, {{OP_RESHAPE_T, .key = "blk.4.engram_gate.weight", .nd = 2, .ne = {64, 3}}},
     {"blk.4.engram_gate.weight", "wrong shape"}},
    {"S14 wrong shape engram_kv", NULL, {{OP_RESHAPE_T, .key = "blk.0.engram_kv.weight", .nd = 2, .ne = {128, 256}}},
     {"blk.0.engram_kv.weight", "wrong shape"}},
    {"S14 wrong element count wo_a", NULL,
     {{OP_RESHAPE_T, .key = "blk.0.attn_output_a.weight", .nd = 3, .ne = {64, 16, 3}}},
     {"blk.0.attn_output_a.weight"}},
    {"S14 wrong shape token_embd vs output", NULL, {{OP_RESHAPE_T, .key = "output.weight", .nd = 2, .ne = {64, 255}}},
     {"output.weight", "wrong shape"}},
    {"S14 extra tensor (compressor on a non-source layer)", NULL,
     {{OP_ADD_T, .key = "blk.2.attn_compressor_kv.weight", .a = GGML_TYPE_BF16, .nd = 2, .ne = {64, 32}}},
     {"blk.2.attn_compressor_kv.weight"}},
    {"S14 extra tensor (gate on a ratio-1 source)", NULL,
     {{OP_ADD_T, .key = "blk.3.attn_compressor_gate.weight", .a = GGML_TYPE_BF16, .nd = 2, .ne = {64, 32}}},
     {"blk.3.attn_compressor_gate.weight"}},
    {"S14 extra tensor (indexer query on a reuse layer)", NULL,
     {{OP_ADD_T, .key = "blk.4.indexer.attn_q_b.weight", .a = GGML_TYPE_BF16, .nd = 2, .ne = {32, 128}}},
     {"blk.4.indexer.attn_q_b.weight"}},
    {"S14 extra tensor (engram on a non-Engram layer)", NULL,
     {{OP_ADD_T, .key = "blk.2.engram_gate.weight", .a = GGML_TYPE_F32, .nd = 2, .ne = {64, 4}}},
     {"blk.2.engram_gate.weight"}},
    {"S14 extra tensor (output_hc_fn, not in V4.1)", NULL,
     {{OP_ADD_T, .key = "output_hc_fn.weight", .a = GGML_TYPE_F32, .nd = 2, .ne = {256, 4}}},
     {"output_hc_fn.weight"}},
    {"S14 extra tensor (layer past block_count)", NULL,
     {{OP_ADD_T, .key = "blk.6.attn_norm.weight", .a = GGML_TYPE_F32, .nd = 1, .ne = {64}}},
     {"blk.6.attn_norm.weight"}},
};

TEST(loader_rules_s13_s14_tensors) { run_cases(t, t_cases, (int)(sizeof t_cases / sizeof *t_cases)); }

/* ================================================================ §6.2 B1-B5 and key types */

static const rcase b_cases[] = {
    {"B1 block_count 0", NULL, {{OP_SET_U32, KEY("block_count"), .a = 0}}, {".block_count"}},
    {"B1 block_count 513", NULL, {{OP_SET_U32, KEY("block_count"), .a = 513}}, {".block_count"}},
    {"B1 expert_count 1025", NULL, {{OP_SET_U32, KEY("expert_count"), .a = 1025}}, {".expert_count"}},
    {"B1 used > count", NULL, {{OP_SET_U32, KEY("expert_used_count"), .a = 5}}, {".expert_used_count"}},
    {"B1 used 0", NULL, {{OP_SET_U32, KEY("expert_used_count"), .a = 0}}, {".expert_used_count"}},
    {"B1 expert_group_count >= expert_count", NULL, {{OP_SET_U32, KEY("expert_group_count"), .a = 4}},
     {".expert_group_count"}},
    {"B1 nextn_predict_layers > block_count", NULL, {{OP_SET_U32, KEY("nextn_predict_layers"), .a = 7}},
     {".nextn_predict_layers"}},
    {"B3 swiglu_clamp_exp length", NULL, {{OP_ARR_RESIZE, KEY("swiglu_clamp_exp"), .a = 5}},
     {".swiglu_clamp_exp", "wrong array length"}},
    {"B3 swiglu_clamp_exp too long", NULL, {{OP_ARR_RESIZE, KEY("swiglu_clamp_exp"), .a = 7}},
     {".swiglu_clamp_exp", "wrong array length"}},
    {"B3 swiglu_clamp_shexp length", NULL, {{OP_ARR_RESIZE, KEY("swiglu_clamp_shexp"), .a = 3}},
     {".swiglu_clamp_shexp", "wrong array length"}},
    {"B4 compress_ratios shorter than block_count", NULL, {{OP_ARR_RESIZE, KEY("attention.compress_ratios"), .a = 5}},
     {"compress_ratios is shorter than block_count"}},
    {"B4 compress_ratios longer than 512", NULL, {{OP_ARR_RESIZE, KEY("attention.compress_ratios"), .a = 513}},
     {"compress_ratios"}},
    {"B5 gating func 3", NULL, {{OP_SET_U32, KEY("expert_gating_func"), .a = 3}},
     {"expects sqrtsoftplus MoE scoring"}},
    {"arch missing", NULL, {{OP_DROP_KEY, .key = "general.architecture"}}, {"general.architecture"}},
    {"arch llama", NULL, {{OP_SET_STR, .key = "general.architecture", .s = "deepseek4"}}, {"general.architecture"}},
};

TEST(loader_rules_b1_to_b5) { run_cases(t, b_cases, (int)(sizeof b_cases / sizeof *b_cases)); }

/* B2's list, plus the keys gguf-layout §2.3 marks "R" or "R (in effect)". */
static const char *const required_keys[] = {
    "attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.sliding_window",
    "expert_feed_forward_length", "expert_shared_count", "expert_weights_scale", "expert_weights_norm",
    "swiglu_clamp_exp", "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.output_group_count", "attention.output_lora_rank", "attention.compress_rope_freq_base",
    "hyper_connection.count", "hyper_connection.sinkhorn_iterations", "hyper_connection.epsilon", "hash_layer_count",
    "attention.compress_ratios", "expert_gating_func",
    /* §2.3 R / R in effect */
    "block_count", "context_length", "embedding_length", "attention.head_count", "expert_count", "expert_used_count",
};

TEST(loader_rules_b2_each_required_key_missing) {
    int n = (int)(sizeof required_keys / sizeof *required_keys);
    rcase *cs = calloc((size_t)n, sizeof *cs);
    char (*keys)[128] = calloc((size_t)n, sizeof *keys);
    char (*ids)[160] = calloc((size_t)n, sizeof *ids);
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], ".%s", required_keys[i]);
        snprintf(ids[i], sizeof ids[i], "B2 %s missing", required_keys[i]);
        cs[i].id = ids[i];
        cs[i].ops[0] = (edit_op){.op = OP_DROP_KEY, .key = keys[i]};
        cs[i].want[0] = "not found";
        cs[i].want[1] = keys[i];
    }
    run_cases(t, cs, n);
    free(cs);
    free(keys);
    free(ids);
}

/* llama.cpp's get_key is type-strict (gguf-layout §1.6): a UINT32 key written as INT32, or a
 * FLOAT32 key written as FLOAT64, is a type error naming the key. */
static const char *const u32_keys[] = {
    "block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
    "expert_count", "expert_used_count", "expert_gating_func", "attention.key_length", "attention.value_length",
    "rope.dimension_count", "attention.q_lora_rank", "attention.sliding_window", "expert_feed_forward_length",
    "expert_shared_count", "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.output_group_count", "attention.output_lora_rank", "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations", "hash_layer_count", "attention.indexer.candidate_top_k_blocks",
    "attention.indexer.candidate_block_size", "ple.ngram_size", "ple.heads_per_ngram",
    "embedding_length_per_layer_input", "engram.pad_token_id", "rope.scaling.original_context_length",
};
static const char *const f32_keys[] = {
    "attention.layer_norm_rms_epsilon", "expert_weights_scale", "attention.compress_rope_freq_base",
    "hyper_connection.epsilon", "rope.freq_base", "rope.scaling.factor",
};

static void run_retyped(test_ctx *t, const char *const *keys, int n, uint32_t to) {
    rcase *cs = calloc((size_t)n, sizeof *cs);
    char (*kk)[128] = calloc((size_t)n, sizeof *kk);
    char (*ids)[160] = calloc((size_t)n, sizeof *ids);
    for (int i = 0; i < n; i++) {
        snprintf(kk[i], sizeof kk[i], ".%s", keys[i]);
        snprintf(ids[i], sizeof ids[i], "type %s as %s", keys[i], gguf_vtype_name(to));
        cs[i].id = ids[i];
        cs[i].ops[0] = (edit_op){.op = OP_RETYPE, .key = kk[i], .a = to};
        cs[i].want[0] = kk[i];
        cs[i].want[1] = "wrong type";
    }
    run_cases(t, cs, n);
    free(cs);
    free(kk);
    free(ids);
}

TEST(loader_rules_u32_keys_as_int32) {
    run_retyped(t, u32_keys, (int)(sizeof u32_keys / sizeof *u32_keys), GGUF_VT_INT32);
}
TEST(loader_rules_f32_keys_as_float64) {
    run_retyped(t, f32_keys, (int)(sizeof f32_keys / sizeof *f32_keys), GGUF_VT_FLOAT64);
}

static const rcase type_cases[] = {
    {"type expert_weights_norm as UINT8", NULL, {{OP_RETYPE, KEY("expert_weights_norm"), .a = GGUF_VT_UINT8}},
     {".expert_weights_norm", "wrong type"}},
    {"type candidate_source_layer as UINT32", NULL,
     {{OP_RETYPE, KEY("attention.indexer.candidate_source_layer"), .a = GGUF_VT_UINT32}},
     {".attention.indexer.candidate_source_layer", "wrong type"}},
    {"type block_count as UINT64", NULL, {{OP_RETYPE, KEY("block_count"), .a = GGUF_VT_UINT64}},
     {".block_count", "wrong type"}},
    {"type swiglu_clamp_exp as FLOAT64[]", NULL, {{OP_RETYPE, KEY("swiglu_clamp_exp"), .a = GGUF_VT_FLOAT64}},
     {".swiglu_clamp_exp"}},
    {"type compress_ratios as FLOAT32[]", NULL, {{OP_RETYPE, KEY("attention.compress_ratios"), .a = GGUF_VT_FLOAT32}},
     {".attention.compress_ratios"}},
    {"type kv_source_layers as FLOAT32[]", NULL,
     {{OP_RETYPE, KEY("attention.kv_source_layers"), .a = GGUF_VT_FLOAT32}},
     {".attention.kv_source_layers"}},
    {"type ple.layer_multipliers as FLOAT64[]", NULL,
     {{OP_RETYPE, KEY("ple.layer_multipliers"), .a = GGUF_VT_FLOAT64}},
     {".ple.layer_multipliers"}},
    {"type engram.token_map as FLOAT32[]", NULL, {{OP_RETYPE, KEY("engram.token_map"), .a = GGUF_VT_FLOAT32}},
     {".engram.token_map"}},
    {"type rope.scaling.type as UINT32", NULL, {{OP_SET_U32, KEY("rope.scaling.type"), .a = 1}},
     {".rope.scaling.type", "wrong type"}},
    {"negative kv source (INT32[])", NULL,
     {{OP_RETYPE, KEY("attention.kv_source_layers"), .a = GGUF_VT_INT32},
      {OP_ARR_SET, KEY("attention.kv_source_layers"), .a = 0, .b = (uint64_t)-1}},
     {".attention.kv_source_layers"}},
};

TEST(loader_rules_other_key_types) { run_cases(t, type_cases, (int)(sizeof type_cases / sizeof *type_cases)); }

/* ================================================================ engine requirements */

static const rcase e_cases[] = {
    {"head_count_kv 2", NULL, {{OP_SET_U32, KEY("attention.head_count_kv"), .a = 2}}, {".attention.head_count_kv"}},
    {"key_length != value_length", NULL, {{OP_SET_U32, KEY("attention.value_length"), .a = 64}},
     {".attention.key_length", ".attention.value_length"}},
    {"key_length 48 (FP8 groups of 32)", NULL,
     {{OP_SET_U32, KEY("attention.key_length"), .a = 48}, {OP_SET_U32, KEY("attention.value_length"), .a = 48}},
     {"attention.key_length"}},
    {"rope dims odd", NULL, {{OP_SET_U32, KEY("rope.dimension_count"), .a = 15}}, {"rope.dimension_count"}},
    {"rope dims > key_length", NULL, {{OP_SET_U32, KEY("rope.dimension_count"), .a = 64}}, {"rope.dimension_count"}},
    {"embedding_length 80", NULL, {{OP_SET_U32, KEY("embedding_length"), .a = 80}}, {"embedding_length"}},
    {"q_lora 48", NULL, {{OP_SET_U32, KEY("attention.q_lora_rank"), .a = 48}}, {"q_lora_rank"}},
    {"expert ff 48", NULL, {{OP_SET_U32, KEY("expert_feed_forward_length"), .a = 48}}, {"expert_feed_forward_length"}},
    {"o_groups 3 (heads 4)", NULL, {{OP_SET_U32, KEY("attention.output_group_count"), .a = 3}},
     {"output_group_count"}},
    {"o_groups 0", NULL, {{OP_SET_U32, KEY("attention.output_group_count"), .a = 0}}, {"output_group_count"}},
    {"o_groups * o_lora = 16", NULL, {{OP_SET_U32, KEY("attention.output_lora_rank"), .a = 8}}, {"output_lora_rank"}},
    {"indexer key_length 48", NULL, {{OP_SET_U32, KEY("attention.indexer.key_length"), .a = 48}},
     {"indexer.key_length"}},
    {"indexer heads 0", NULL, {{OP_SET_U32, KEY("attention.indexer.head_count"), .a = 0}}, {"indexer"}},
    {"hc 0", NULL, {{OP_SET_U32, KEY("hyper_connection.count"), .a = 0}}, {"hyper_connection.count"}},
    {"hc 17", NULL, {{OP_SET_U32, KEY("hyper_connection.count"), .a = 17}}, {"hyper_connection.count"}},
    {"window 0", NULL, {{OP_SET_U32, KEY("attention.sliding_window"), .a = 0}}, {"sliding_window"}},
    {"Engram width 16", NULL, {{OP_SET_U32, KEY("embedding_length_per_layer_input"), .a = 4}}, {"Engram"}},
    {"hash layers", NULL, {{OP_SET_U32, KEY("hash_layer_count"), .a = 1}}, {".hash_layer_count"}},
    {"grouped experts", NULL, {{OP_SET_U32, KEY("expert_group_count"), .a = 2}}, {".expert_group_count"}},
    {"rope scaling linear", NULL, {{OP_SET_STR, KEY("rope.scaling.type"), .s = "linear"}}, {".rope.scaling.type"}},
    {"yarn factor 0", NULL, {{OP_SET_F32, KEY("rope.scaling.factor"), .f = 0.0}}, {".rope.scaling.factor"}},
    {"head_count per-layer values differ", NULL,
     {{OP_ARR_U32, KEY("attention.head_count"), .a = 6, .vals = {4, 4, 4, 2, 4, 4}}},
     {".attention.head_count"}},
    {"negative compress ratio", NULL, {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 4, .b = (uint64_t)-1}},
     {".attention.compress_ratios"}},
    {"negative token_map entry", NULL, {{OP_ARR_SET, KEY("engram.token_map"), .a = 9, .b = (uint64_t)-7}},
     {".engram.token_map"}},
};

TEST(loader_rules_engine_requirements) { run_cases(t, e_cases, (int)(sizeof e_cases / sizeof *e_cases)); }

/* ================================================================ variants a loader must accept */

static void tw_noengram(tm_params *p) { p->n_engram = 0; }
static void tw_nocand(tm_params *p) { p->cand_src = -1; }
static void tw_f32(tm_params *p) {
    p->dense_type = GGML_TYPE_F32;
    p->expert_type = GGML_TYPE_F32;
}

static const rcase ok_cases[] = {
    {"= swiglu_clamp_exp as a scalar (get_key_or_arr)", NULL, {{OP_SET_F32, KEY("swiglu_clamp_exp"), .f = 2.0}}, {0}},
    {"= swiglu_clamp_shexp absent (defaults to _exp)", NULL, {{OP_DROP_KEY, KEY("swiglu_clamp_shexp")}}, {0}},
    {"= head_count as a uniform per-layer array", NULL,
     {{OP_ARR_U32, KEY("attention.head_count"), .a = 6, .vals = {4, 4, 4, 4, 4, 4}}}, {0}},
    {"= compress_ratios as UINT32[] (the §7.1 fixture)", NULL,
     {{OP_RETYPE, KEY("attention.compress_ratios"), .a = GGUF_VT_UINT32}}, {0}},
    {"= wo_a stored 3-D {H*dh/og, olr, og}", NULL,
     {{OP_RESHAPE_T, .key = "blk.2.attn_output_a.weight", .nd = 3, .ne = {64, 16, 2}}}, {0}},
    {"= compress_ratios entries past block_count are ignored (ratio 4 there)", NULL,
     {{OP_ARR_SET, KEY("attention.compress_ratios"), .a = 6, .b = 4}}, {0}},
    {"= wo_a stored 2-D {H*dh/og*olr, og} (only the element count is checked)", NULL,
     {{OP_RESHAPE_T, .key = "blk.1.attn_output_a.weight", .nd = 2, .ne = {1024, 2}}}, {0}},
    {"= Engram table larger than needed", NULL,
     {{OP_RESHAPE_T, .key = "per_layer_token_embd.weight", .nd = 2, .ne = {32, PLE_ROWS + 77}}}, {0}},
    /* optional, but on every layer or none (gguf-layout.md §3.2; the partial set is refused:
     * tests/tiny/vl_golden.c) */
    {"= optional exp_probs_b_vl", NULL,
     {{OP_ADD_T, .key = "blk.0.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}},
      {OP_ADD_T, .key = "blk.1.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}},
      {OP_ADD_T, .key = "blk.2.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}},
      {OP_ADD_T, .key = "blk.3.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}},
      {OP_ADD_T, .key = "blk.4.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}},
      {OP_ADD_T, .key = "blk.5.exp_probs_b_vl.bias", .a = GGML_TYPE_F32, .nd = 1, .ne = {4}}},
     {0}},
    {"no rope.scaling keys (plain RoPE)", NULL,
     {{OP_DROP_KEY, KEY("rope.scaling.type")}, {OP_DROP_KEY, KEY("rope.scaling.factor")}}, {0}},
    {"= head_count_kv absent (optional)", NULL, {{OP_DROP_KEY, KEY("attention.head_count_kv")}}, {0}},
    {"candidate_source_layer -1 (no candidate stage)", NULL,
     {{OP_SET_I32, KEY("attention.indexer.candidate_source_layer"), .a = (uint64_t)-1},
      {OP_DROP_KEY, KEY("attention.indexer.candidate_top_k_blocks")},
      {OP_DROP_KEY, KEY("attention.indexer.candidate_block_size")}},
     {0}},
    {"no Engram", tw_noengram, {{.op = OP_END}}, {0}},
    {"no candidate keys", tw_nocand, {{.op = OP_END}}, {0}},
    {"F32 dense and experts", tw_f32, {{.op = OP_END}}, {0}},
};

/* Runs 12 tokens on a loaded variant; returns malloc'ed [12][256] logits or NULL (err). */
static float *run12(dsf_engine *e, char *err) {
    dsf_session *s = dsf_session_new(e, 32, err);
    float *lg = malloc(256 * 12 * sizeof(float));
    int32_t tok[12] = {0, 1, 2, 3, 200, 17, 2, 2, 9, 255, 128, 64};
    if (!s || dsf_session_eval(s, tok, 12, lg, true, err) < 0) {
        free(lg);
        lg = NULL;
    }
    for (int j = 0; lg && j < 256 * 12; j++)
        if (!isfinite(lg[j])) {
            snprintf(err, DSF_ERR_LEN, "non-finite logit %d", j);
            free(lg);
            lg = NULL;
        }
    dsf_session_free(s);
    return lg;
}

/* Each variant loads and runs to finite logits; those marked "=" only change how the same
 * model is written (scalar vs array, dtype of an array, 2-D vs 3-D wo_a, extra table rows, an
 * unused optional tensor) and must give exactly the base model's logits (same data, same
 * code path, one thread). */
TEST(loader_rules_valid_variants_accepted) {
    int n = (int)(sizeof ok_cases / sizeof *ok_cases), bad = 0;
    char all[900] = "", err[DSF_ERR_LEN];
    int werr;
    dsf_engine *be = open_variant(NULL, NULL, err, &werr);
    CHECKF(be, "base: %s", err);
    float *base = run12(be, err);
    dsf_engine_close(be);
    CHECKF(base, "base: %s", err);
    for (int i = 0; i < n; i++) {
        dsf_engine *e = open_variant(ok_cases[i].tweak, ok_cases[i].ops, err, &werr);
        bool ok = e != NULL;
        if (e) {
            float *lg = run12(e, err);
            ok = lg != NULL;
            if (lg && ok_cases[i].id[0] == '=' && memcmp(lg, base, 256 * 12 * sizeof(float)) != 0) {
                snprintf(err, DSF_ERR_LEN, "logits differ from the base model's");
                ok = false;
            }
            free(lg);
            dsf_engine_close(e);
            if (!ok) werr = 2;
        }
        if (!ok) {
            bad++;
            char why[DSF_ERR_LEN + 200];
            snprintf(why, sizeof why, "%s: %s: %s", ok_cases[i].id, werr == 1 ? "build failed" : "refused/failed", err);
            fprintf(stderr, "  loader_rules: %s\n", why);
            if (strlen(all) + strlen(why) + 3 < sizeof all) {
                strcat(all, why);
                strcat(all, " | ");
            }
        }
    }
    free(base);
    CHECKF(bad == 0, "%d of %d valid variants refused: %s", bad, n, all);
}

/* ================================================================ extreme but legal values */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Values no rule forbids, at the edges of their types: the engine must refuse them at open
 * or at session creation with a message, or run them to finite logits; never crash, hang
 * or overflow (the sanitizer build checks the last). */
static const rcase x_cases[] = {
    /* (2^32-1 windows work but size the attention scratch by the window, not by max_ctx:
     * ~34 GB of virtual memory, 90 s under ASan; see the H3b report) */
    {"window 10^6 (longer than any session)", NULL, {{OP_SET_U32, KEY("attention.sliding_window"), .a = 1000000}}, {0}},
    /* (2^32-1 here makes dsf_session_new ask for terabytes of scratch: a clean error in a
     * release build, an abort under ASan's allocator; see the H3b report) */
    {"top_k 100000", NULL, {{OP_SET_U32, KEY("attention.indexer.top_k"), .a = 100000}}, {0}},
    {"candidate blocks 100000", NULL, {{OP_SET_U32, KEY("attention.indexer.candidate_top_k_blocks"), .a = 100000}},
     {0}},
    {"candidate block size 2^32-1", NULL,
     {{OP_SET_U32, KEY("attention.indexer.candidate_block_size"), .a = 0xFFFFFFFFu}}, {0}},
    {"candidate block size 1", NULL, {{OP_SET_U32, KEY("attention.indexer.candidate_block_size"), .a = 1}}, {0}},
    {"context_length 0", NULL, {{OP_SET_U32, KEY("context_length"), .a = 0}}, {0}},
    {"rope dims 0", NULL, {{OP_SET_U32, KEY("rope.dimension_count"), .a = 0}}, {0}},
    {"sinkhorn 0 iterations", NULL, {{OP_SET_U32, KEY("hyper_connection.sinkhorn_iterations"), .a = 0}}, {0}},
    {"yarn original context 0", NULL, {{OP_SET_U32, KEY("rope.scaling.original_context_length"), .a = 0}}, {0}},
    {"pad token = a DEAD id", NULL, {{OP_ARR_RESIZE, KEY("engram.token_map"), .a = 100}, {OP_SET_U32, KEY("engram.pad_token_id"), .a = 99}}, {0}},
    {"token_map longer than the vocabulary", NULL, {{OP_ARR_RESIZE, KEY("engram.token_map"), .a = 4000}}, {0}},
    {"multipliers 2^64-1", NULL, {{OP_ARR_SET, KEY("ple.layer_multipliers"), .a = 2, .b = UINT64_MAX}}, {0}},
};

TEST(loader_extreme_values_refused_or_run) {
    int n = (int)(sizeof x_cases / sizeof *x_cases), bad = 0;
    char all[900] = "";
    for (int i = 0; i < n; i++) {
        char err[DSF_ERR_LEN];
        int werr;
        double t0 = now_s();
        dsf_engine *e = open_variant(x_cases[i].tweak, x_cases[i].ops, err, &werr);
        const char *what = "refused";
        if (e) {
            what = "ran";
            dsf_session *s = dsf_session_new(e, 48, err);
            float *lg = malloc(256 * 40 * sizeof(float));
            int32_t tok[40];
            for (int j = 0; j < 40; j++) tok[j] = (int32_t)((j * 101 + 7) % 256);
            if (!s) what = err[0] ? "session refused" : "session failed without a message";
            else if (dsf_session_eval(s, tok, 40, lg, true, err) < 0) what = "failed to run";
            else
                for (int j = 0; j < 256 * 40; j++)
                    if (!isfinite(lg[j])) {
                        what = "non-finite logits";
                        break;
                    }
            free(lg);
            dsf_session_free(s);
            dsf_engine_close(e);
        }
        if (getenv("DSF_TEST_VERBOSE"))
            fprintf(stderr, "  %-60s -> %s %s (%.2fs)\n", x_cases[i].id, what, e ? "" : err, now_s() - t0);
        if (werr || (e && strcmp(what, "ran") && strcmp(what, "session refused"))) {
            bad++;
            char why[DSF_ERR_LEN + 200];
            snprintf(why, sizeof why, "%s: %s: %s", x_cases[i].id, werr ? "build failed" : what, err);
            if (strlen(all) + strlen(why) + 3 < sizeof all) {
                strcat(all, why);
                strcat(all, " | ");
            }
        }
    }
    CHECKF(bad == 0, "%d of %d variants misbehaved: %s", bad, n, all);
}
