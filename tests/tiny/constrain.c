/* constrain.c: constrained decoding at the token level (src/text/grammar_vocab.c) and in the
 * generation loop (dsf_gen_params.grammar), on tiny41 (random weights, the real V4.1
 * special tokens in a 1024-token byte-level vocabulary).
 * Guards against: ｜DSML｜ allowed as spelled bytes instead of the special token, special
 * tokens or EOS allowed where the grammar does not take them, a mask that admits a token the
 * automaton then refuses, the budget rule letting the output run out of tokens before EOS,
 * and a constrained generation (thinking first, budget tight) that does not end in a tool
 * call the official strict parser accepts. Expected values: the DSML grammar of spec
 * chat-format.md §3.1 and the strict parser (src/text/dsml.c), not the matcher. */
#include "helpers.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

#include "dsflash.h"
#include "text/dsml.h"
#include "text/grammar.h"

#define DSML "｜DSML｜"
#define EOS "<｜end▁of▁sentence｜>"
#define TOOLS "{\"tools\": [{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {" \
              "\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}]"

static bool has(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

TEST(constrain_tokens) {
    NEED_SHARED(path, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(path, err);
    CHECKF(tok, "%s", err);
    const char *spec = TOOLS ", \"parallel\": false}";
    dsf_grammar *g = dsf_grammar_new(tok, spec, strlen(spec), err);
    CHECKF(g, "%s", err);
    int nv = dsf_tokenizer_n_vocab(tok), big = 1 << 30;
    int32_t dsml = dsf_token_id(tok, DSML), eos = dsf_tokenizer_eos(tok), *ids = malloc((size_t)nv * sizeof *ids);
    CHECK(dsml >= 0 && eos >= 0);
    gr_matcher *m = gr_matcher_new(g, tok, err);
    CHECKF(m, "%s", err);
    /* chat mode: the block starts the output with "\n\n<" (spec §3.1, content empty) */
    int n = gr_matcher_allowed(m, big, ids, nv);
    CHECK(n > 0);
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *b = dsf_token_bytes(tok, ids[i], &len);
        CHECKF(dsf_token_type(tok, ids[i]) == 1 && len <= 3 && !memcmp(b, "\n\n<", len), "token %d allowed at the start", ids[i]);
    }
    CHECK(gr_matcher_accept(m, dsf_token_id(tok, "Ċ")) == 0 && gr_matcher_accept(m, dsf_token_id(tok, "Ċ")) == 0);
    CHECK(gr_matcher_accept(m, dsf_token_id(tok, "<")) == 0);
    n = gr_matcher_allowed(m, big, ids, nv);
    CHECKF(n == 1 && ids[0] == dsml, "after \"\\n\\n<\": %d tokens allowed, first %d (DSML is %d)", n, n ? ids[0] : -1, dsml);
    gr_matcher_free(m);

    /* a whole valid block, special tokens parsed: accepted token by token, EOS only at the end */
    const char *block = "\n\n<" DSML " calls>\n<" DSML " invoke name=\"get_weather\">\n<" DSML
                        " parameter name=\"city\" string=\"true\">Paris <b>&</" DSML " parameter>\n</" DSML
                        " invoke>\n</" DSML " calls>";
    int32_t *bt = NULL;
    size_t bn = 0;
    CHECK(dsf_tokenize(tok, block, strlen(block), false, true, &bt, &bn, err) == 0);
    m = gr_matcher_new(g, tok, err);
    for (size_t i = 0; i < bn; i++) {
        n = gr_matcher_allowed(m, big, ids, nv);
        CHECKF(has(ids, n, bt[i]) && !has(ids, n, eos), "block token %zu (id %d): allowed %d, EOS %d", i, bt[i],
               has(ids, n, bt[i]), has(ids, n, eos));
        CHECK(gr_matcher_accept(m, bt[i]) == 0);
    }
    n = gr_matcher_allowed(m, big, ids, nv);
    CHECKF(n == 1 && ids[0] == eos, "after the block: %d allowed", n);
    CHECK(gr_matcher_accept(m, eos) == 0 && gr_matcher_cost(m) == 0);
    gr_matcher_free(m);
    free(bt);

    /* the budget: with exactly the shortest output's tokens, every allowed token keeps it
     * completable, and random choices always finish with EOS in time */
    uint64_t rng = 5;
    for (int walk = 0; walk < 20; walk++) {
        m = gr_matcher_new(g, tok, err);
        int left = dsf_grammar_min_tokens(g) + walk;
        bool done = false;
        for (; left > 0 && !done; left--) {
            n = gr_matcher_allowed(m, left, ids, nv);
            CHECKF(n > 0, "walk %d: nothing allowed with %d tokens left", walk, left);
            int32_t id = ids[(int)(dsf_rng_uniform(&rng) * n)];
            CHECK(gr_matcher_accept(m, id) == 0);
            CHECKF(gr_matcher_cost(m) <= left - 1, "walk %d: cost %d after a token with %d left", walk, gr_matcher_cost(m), left);
            done = id == eos;
        }
        CHECKF(done, "walk %d did not reach EOS", walk);
        gr_matcher_free(m);
    }
    free(ids);
    dsf_grammar_free(g);
    dsf_tokenizer_free(tok);
}

/* The generation loop, thinking first with a tight budget: </think> must come in time and
 * the output must be one call that the strict parser accepts. */
TEST(constrain_generate) {
    NEED_SHARED(path, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    test_gen_fx fx;
    if (test_gen_open(&fx, path, 512)) {
        test_gen_close(&fx);
        CHECKF(0, "cannot open %s for generation", path);
    }
    dsf_tokenizer *tok = fx.tok;
    dsf_gen *gen = fx.g;
    const char *spec = TOOLS ", \"parallel\": true, \"thinking\": true}";
    dsf_grammar *g = dsf_grammar_new(tok, spec, strlen(spec), err);
    CHECKF(g, "%s", err);
    const char *prompt = "<｜begin▁of▁sentence｜><｜User｜>weather in Paris?<｜Assistant｜><think>";
    int32_t *p = NULL;
    size_t pn = 0;
    CHECK(dsf_tokenize(tok, prompt, strlen(prompt), false, true, &p, &pn, err) == 0);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        dsf_gen_params gp;
        dsf_gen_params_default(&gp);
        gp.sampler.seed = seed;
        gp.sampler.max_tokens = dsf_grammar_min_tokens(g) + 30;
        gp.sampler.ignore_eos = seed == 3; /* ignored under a grammar */
        gp.parse_dsml = true;
        gp.dsml_thinking = true;
        gp.grammar = g;
        dsf_gen_result r;
        CHECKF(dsf_gen_run(gen, p, (int)pn, &gp, NULL, &r, err) == 0, "seed %d: %s", (int)seed, err);
        CHECKF(r.finish == DSF_FINISH_TOOL_CALLS && r.dsml_strict_ok && r.dsml.n_calls >= 1,
               "seed %d: finish %s, strict %d, %d calls: %s", (int)seed, dsf_finish_reason_str(r.finish), r.dsml_strict_ok,
               r.dsml.n_calls, r.text);
        CHECK(r.n_completion <= gp.sampler.max_tokens && strstr(r.text, "</think>"));
        for (int i = 0; i < r.dsml.n_calls; i++) CHECK(!strcmp(r.dsml.calls[i].name, "get_weather"));
        dsf_gen_result_free(&r);
    }
    free(p);
    dsf_grammar_free(g);
    test_gen_close(&fx);
}
