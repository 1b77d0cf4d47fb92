/* fuzz_grammar.c: libFuzzer harness for the constraint compiler and its automaton
 * (src/text/grammar*.c).
 *
 * Input: byte 0 = flags (bit 0 thinking, bit 1 the rest is a tool list, bit 2 parallel
 * calls), bytes 1..8 = the seed of a random walk, the rest = a JSON schema (or a tool list
 * [{"name", "parameters"}]) as text (any bytes). Checks:
 *   - dsf_grammar_new either fails with a one-line message or gives a grammar whose shortest
 *     output is at least one symbol;
 *   - a random walk through the automaton that only takes inputs keeping the output
 *     completable within min_tokens + 48 symbols always has an input to take and ends with
 *     EOS within that budget (the budget guarantee of grammar_vocab.c, at the byte level);
 *   - what the walk wrote is accepted by gr_match_text, and it parses: a JSON value for
 *     jansson (schemas), the official strict DSML parser with at least one call whose
 *     arguments are JSON (tools); a thinking walk's reasoning ends at its </think>. */
#include "fuzz_common.h"
#include "text/dsml.h"
#include "text/grammar.h"

#include <jansson.h>

static const char *const fz_gr_sym[GR_N_SYM] = {"<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
                                                "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c", "</think>"};

static uint64_t fz_gr_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void fz_gr_check_output(const dsf_buf *out, bool thinking, bool tools) {
    const char *t = (const char *)out->data;
    size_t n = out->len;
    FZ_REQUIRE(n >= strlen(fz_gr_sym[0]) && !memcmp(t + n - strlen(fz_gr_sym[0]), fz_gr_sym[0], strlen(fz_gr_sym[0])),
               "the walk did not end with EOS");
    if (tools) {
        dsf_dsml_result r;
        char err[DSF_ERR_LEN] = "";
        FZ_REQUIRE(dsml_parse_official(t, n, thinking, &r, err) == 0, "strict parser: %s on %.*s", err, (int)n, t);
        FZ_REQUIRE(r.n_calls >= 1 && r.content_len == 0, "%d calls, content %zu bytes", r.n_calls, r.content_len);
        for (int i = 0; i < r.n_calls; i++) {
            json_error_t je;
            json_t *a = json_loads(r.calls[i].arguments, 0, &je);
            FZ_REQUIRE(json_is_object(a), "call %d: arguments are not a JSON object: %s", i, r.calls[i].arguments);
            json_decref(a);
        }
        dsf_dsml_result_free(&r);
        return;
    }
    size_t from = 0;
    if (thinking) {
        const char *e = memmem(t, n, "</think>", 8);
        FZ_REQUIRE(e != NULL, "no </think>");
        from = (size_t)(e - t) + 8;
    }
    json_error_t je;
    json_t *v = json_loadb(t + from, n - from - strlen(fz_gr_sym[0]), JSON_DECODE_ANY, &je);
    FZ_REQUIRE(v != NULL, "not JSON (%s): %.*s", je.text, (int)(n - from), t + from);
    json_decref(v);
}

static int fz_grammar_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    uint64_t seed = 0;
    for (int i = 0; i < 8; i++) seed = seed << 8 | fz_u8(&in);
    bool thinking = flags & 1, tools = flags & 2;
    dsf_buf spec = {0};
    dsf_buf_appendf(&spec, "{\"thinking\": %s, %s", thinking ? "true" : "false", tools ? "\"tools\": " : "\"json_schema\": ");
    dsf_buf_append(&spec, in.p, in.n);
    dsf_buf_appendf(&spec, "%s}", tools ? (flags & 4 ? ", \"parallel\": true" : ", \"parallel\": false") : "");
    char err[DSF_ERR_LEN] = "";
    dsf_grammar *g = dsf_grammar_new(NULL, (const char *)spec.data, spec.len, err);
    dsf_buf_free(&spec);
    if (!g) {
        fz_check_err(err, "dsf_grammar_new");
        return 0;
    }
    int budget = dsf_grammar_min_tokens(g) + 48;
    FZ_REQUIRE(budget > 48, "min_tokens %d", dsf_grammar_min_tokens(g));
    gr_rt *rt = gr_rt_new(g);
    int s = gr_rt_start(rt);
    FZ_REQUIRE(s >= 0 && gr_rt_cost(rt, s) == dsf_grammar_min_tokens(g), "start cost %d vs min_tokens %d",
               gr_rt_cost(rt, s), dsf_grammar_min_tokens(g));
    dsf_buf out = {0};
    int ok[GR_N_INPUT];
    for (int left = budget; !gr_rt_done(rt, s); left--) {
        FZ_REQUIRE(left > 0, "budget exhausted before EOS");
        int n = 0;
        for (int c = 0; c < GR_N_INPUT; c++) {
            int nx = gr_rt_next(rt, s, c);
            if (nx >= 0 && gr_rt_cost(rt, nx) <= left - 1) ok[n++] = c;
        }
        FZ_REQUIRE(n > 0, "no input keeps the output completable (%d left, cost %d)", left, gr_rt_cost(rt, s));
        int c = ok[fz_gr_rng(&seed) % (uint64_t)n];
        s = gr_rt_next(rt, s, c);
        if (c < 256) dsf_buf_append(&out, &(char){(char)c}, 1);
        else dsf_buf_append(&out, fz_gr_sym[c - 256], strlen(fz_gr_sym[c - 256]));
    }
    gr_rt_free(rt);
    FZ_REQUIRE(gr_match_text(g, (const char *)out.data, out.len, NULL) == 1, "the walk's text is not accepted");
    fz_gr_check_output(&out, thinking, tools);
    dsf_buf_free(&out);
    dsf_grammar_free(g);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_grammar_one(data, size);
    return 0;
}
#endif
