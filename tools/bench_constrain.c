/* bench_constrain.c: `dsflash bench --constrain VOCAB.gguf`: the cost of constrained decoding
 * per token on a real vocabulary, against the unconstrained sampler.
 *
 * Measures, on random logits over the tokenizer's whole vocabulary (default sampling:
 * temperature 1, no filters): the unconstrained draw; for typical grammar states (at a DSML
 * tag, inside a raw string parameter, inside a JSON string, in a number, at an object key)
 * the first mask of a state (the trie walk that builds it, cold), the cached mask + draw
 * (warm), and the mask under a binding budget (a walk every step); a 400-step constrained
 * random generation (mean and worst step); the compile times. Timings only: nothing here is
 * asserted (tests/unit/grammar.c and the SDK suite check correctness). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "bench_constrain.h"
#include "text/grammar.h"

extern const char dsf_build_commit[];

#define TRIP_SCHEMA                                                                                                   \
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"celsius\", "      \
    "\"fahrenheit\"]}, \"budget\": {\"type\": \"number\"}, \"stops\": {\"type\": \"array\", \"items\": {\"type\": "      \
    "\"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"nights\": {\"type\": \"integer\"}}, \"required\": " \
    "[\"name\", \"nights\"]}}}, \"required\": [\"city\", \"unit\", \"budget\"]}"

static double ns_since(double t0) { return (dsf_now() - t0) * 1e9; }

typedef struct {
    const char *name, *spec, *prefix;
} bstate;

#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"

/* A matcher advanced by the tokens of prefix, "｜DSML｜" as the grammar's DSML token. */
static gr_matcher *matcher_at(const dsf_grammar *g, const dsf_tokenizer *tok, const char *prefix) {
    char err[DSF_ERR_LEN] = "";
    gr_matcher *m = gr_matcher_new(g, tok, err);
    for (const char *p = prefix; m && *p;) {
        const char *d = strstr(p, DSML);
        size_t len = d ? (size_t)(d - p) : strlen(p), n = 0;
        int32_t *ids = NULL;
        if (dsf_tokenize(tok, p, len, false, false, &ids, &n, err)) break;
        for (size_t i = 0; i < n && m; i++)
            if (gr_matcher_accept(m, ids[i]) < 0) gr_matcher_free(m), m = NULL;
        free(ids);
        if (m && d && gr_matcher_accept(m, g->sym_id[GR_SYM_DSML]) < 0) gr_matcher_free(m), m = NULL;
        p = d ? d + strlen(DSML) : p + len;
    }
    if (!m) fprintf(stderr, "bench --constrain: the prefix \"%s\" is refused %s\n", prefix, err);
    return m;
}

/* A vocabulary without ｜DSML｜ (DeepSeek-V3's): an unused control token stands in for it;
 * the cost is the same for any id. Returns the id used. */
static int32_t dsml_stand_in(dsf_grammar *g, const dsf_tokenizer *tok) {
    if (g->sym_id[GR_SYM_DSML] >= 0) return g->sym_id[GR_SYM_DSML];
    for (int32_t id = dsf_tokenizer_n_vocab(tok) - 1; id >= 0; id--)
        if (dsf_token_type(tok, id) == 3 && id != g->sym_id[GR_SYM_EOS] && id != g->sym_id[GR_SYM_THINK_END] &&
            id != dsf_tokenizer_bos(tok))
            return g->sym_id[GR_SYM_DSML] = id;
    return -1;
}

static void fill_logits(float *l, int n, uint64_t *rng) {
    for (int i = 0; i < n; i++) { /* roughly normal, sd 3: a plausible spread of logits */
        double u = dsf_rng_uniform(rng) + dsf_rng_uniform(rng) + dsf_rng_uniform(rng) - 1.5;
        l[i] = (float)(u * 6.0);
    }
}

int bench_constrain(const char *vocab_path, int reps) {
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(vocab_path, err);
    if (!tok) {
        fprintf(stderr, "dsflash bench --constrain: %s\n", err);
        return 1;
    }
    int n = dsf_tokenizer_n_vocab(tok);
    float *logits = malloc((size_t)n * sizeof *logits), *masked = malloc((size_t)n * sizeof *masked);
    void *scratch = malloc(dsf_sample_scratch_bytes(n));
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp);
    uint64_t rng = 1, srng = 2;
    fill_logits(logits, n, &rng);
    printf("dsflash bench --constrain: vocabulary %s (%d tokens), reps %d, commit %s\n", vocab_path, n, reps, dsf_build_commit);

    /* unconstrained */
    double sum = 0, worst = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = dsf_now();
        dsf_sample_ws(logits, n, &sp, &srng, scratch);
        double d = ns_since(t0);
        sum += d, worst = d > worst ? d : worst;
    }
    double base = sum / reps;
    printf("  unconstrained sample: mean %.0f us, worst %.0f us\n", base / 1e3, worst / 1e3);

    /* compile times */
    const char *tools = "{\"tools\": [{\"name\": \"plan_trip\", \"parameters\": " TRIP_SCHEMA "}, {\"name\": \"get_time\"}], "
                        "\"parallel\": true}";
    const char *json = "{\"json_schema\": " TRIP_SCHEMA "}";
    double t0 = dsf_now();
    dsf_grammar *gt = dsf_grammar_new(tok, tools, strlen(tools), err);
    double c_tools = ns_since(t0);
    t0 = dsf_now();
    dsf_grammar *gj = dsf_grammar_new(tok, json, strlen(json), err);
    double c_json = ns_since(t0);
    if (!gt || !gj) {
        fprintf(stderr, "dsflash bench --constrain: %s\n", err);
        return 1;
    }
    int32_t dsml = dsml_stand_in(gt, tok);
    if (dsf_token_id(tok, DSML) < 0) printf("  (no %s token in this vocabulary: control token %d stands in)\n", DSML, (int)dsml);
    t0 = dsf_now();
    gr_matcher *first = gr_matcher_new(gt, tok, err); /* builds the vocabulary trie */
    double c_trie = ns_since(t0);
    gr_matcher_free(first);
    printf("  compile: tools %.0f us, json_schema %.0f us; vocabulary trie (once per tokenizer) %.1f ms\n", c_tools / 1e3,
           c_json / 1e3, c_trie / 1e6);

    static const bstate states[] = {
        {"at a DSML tag", NULL, "\n\n<" DSML " calls>\n<" DSML " invoke name=\"plan_trip\">\n"},
        {"raw string parameter", NULL, "\n\n<" DSML " calls>\n<" DSML " invoke name=\"plan_trip\">\n<" DSML " parameter name=\"city\" string=\"true\">Lis"},
        {"inside a JSON string", "j", "{\"city\": \"Lis"},
        {"in a number", "j", "{\"city\": \"x\", \"unit\": \"celsius\", \"budget\": 12"},
        {"at an object key", "j", "{\"city\": \"x\", \"unit\": \"celsius\", \"budget\": 1, \"stops\": [{"},
    };
    double warm_worst = 0;
    for (size_t k = 0; k < sizeof states / sizeof *states; k++) {
        const dsf_grammar *g = states[k].spec ? gj : gt;
        double cold = 0, cold_w = 0, warm = 0, warm_w = 0, bud = 0, bud_w = 0, mk = 0, mk_w = 0;
        int allowed = 0;
        for (int r = 0; r < reps; r++) {
            gr_matcher *m = matcher_at(g, tok, states[k].prefix);
            if (!m) return 1;
            t0 = dsf_now();
            allowed = gr_matcher_mask(m, logits, masked, n, 1 << 30);
            double d = ns_since(t0);
            cold += d, cold_w = d > cold_w ? d : cold_w;
            t0 = dsf_now(); /* the state's mask is cached now: the mask alone, then mask + draw */
            gr_matcher_mask(m, logits, masked, n, 1 << 30);
            d = ns_since(t0);
            mk += d, mk_w = d > mk_w ? d : mk_w;
            t0 = dsf_now();
            gr_matcher_mask(m, logits, masked, n, 1 << 30);
            dsf_sample_ws(masked, n, &sp, &srng, scratch);
            d = ns_since(t0);
            warm += d, warm_w = d > warm_w ? d : warm_w;
            t0 = dsf_now(); /* a budget that binds: the walk again, on a warm automaton */
            gr_matcher_mask(m, logits, masked, n, gr_matcher_cost(m) + 2);
            d = ns_since(t0);
            bud += d, bud_w = d > bud_w ? d : bud_w;
            gr_matcher_free(m);
        }
        warm_worst = mk_w > warm_worst ? mk_w : warm_worst;
        printf("  %-21s %6d allowed: first mask %5.0f us (worst %5.0f); cached mask %4.0f us (worst %4.0f), mask+sample"
               " %5.0f us (worst %5.0f); budget-bound mask %5.0f us (worst %5.0f)\n",
               states[k].name, allowed, cold / reps / 1e3, cold_w / 1e3, mk / reps / 1e3, mk_w / 1e3, warm / reps / 1e3,
               warm_w / 1e3, bud / reps / 1e3, bud_w / 1e3);
    }

    /* a constrained random generation: what a request pays per token, new states included */
    double gsum = 0, gworst = 0;
    int steps = 0;
    gr_matcher *m = gr_matcher_new(gt, tok, err);
    for (int left = 400; left > 0; left--) {
        fill_logits(logits, n, &rng);
        t0 = dsf_now();
        int a = gr_matcher_mask(m, logits, masked, n, left);
        int32_t id = a ? dsf_sample_ws(masked, n, &sp, &srng, scratch) : -1;
        double d = ns_since(t0);
        if (id < 0 || gr_matcher_accept(m, id) < 0) break;
        gsum += d, gworst = d > gworst ? d : gworst, steps++;
        if (id == gt->sym_id[GR_SYM_EOS]) break;
    }
    gr_matcher_free(m);
    printf("  tool-call generation (random logits), %d steps: mask + sample mean %.0f us per token, worst step %.0f us\n",
           steps, gsum / (steps ? steps : 1) / 1e3, gworst / 1e3);
    printf("constrain_base_ns=%.0f constrain_gen_mean_ns=%.0f constrain_gen_worst_ns=%.0f constrain_cached_mask_worst_ns=%.0f "
           "trie_ms=%.1f\n",
           base, gsum / (steps ? steps : 1), gworst, warm_worst, c_trie / 1e6);
    dsf_grammar_free(gt);
    dsf_grammar_free(gj);
    free(logits);
    free(masked);
    free(scratch);
    dsf_tokenizer_free(tok);
    return 0;
}
