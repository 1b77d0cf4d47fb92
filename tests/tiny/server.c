/* server.c: `dsflash serve` request parsing (src/server/server_api.c) with the tiny41
 * tokenizer, without sockets or an engine: fields, their errors, the context limit. */
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server.h"
#include "test.h"

#define TOOL_A "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"

typedef struct {
    const char *body;
    const char *param; /* expected param ("" for null) */
    const char *in_message;
} bad_case;

/* Guards against malformed requests reaching the scheduler: each must be a 400 with an
 * OpenAI error naming the offending field. */
TEST(server_parse_rejects_bad_requests) {
    NEED_SHARED(gguf, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gguf, err);
    CHECKF(tok, "%s", err);
    static const bad_case cases[] = {
        {"{\"messages\": [", "", "invalid JSON"},
        {"[1,2]", "", "JSON object"},
        {"{}", "messages", "list"},
        {"{\"messages\":\"hi\"}", "messages", "list"},
        {"{\"messages\":[]}", "messages", "empty"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role", "Unknown role: wizard"},
        {"{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", "messages[0].role", "string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", "messages[0].content", "type"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature", "number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", "top_p", "between"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "n", "between"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens", "between"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "max_tokens", "integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", "stream", "boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}", "stop", "string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", "top_logprobs", "logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "between"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "tools", "list"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools", "name"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_A "],\"tool_choice\":\"sometimes\"}", "tool_choice", "none"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_A "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}", "tool_choice", "'nope'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", "tool_choice", "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", "response_format", "json_schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"ludicrous\"}", "messages", "Invalid reasoning effort"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"function\":{}}]}]}", "messages[0].tool_calls", "name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_req r;
        srv_error e;
        memset(&e, 0, sizeof e);
        int rc = srv_parse_request(SRV_CHAT, cases[i].body, strlen(cases[i].body), tok, 4096, &r, &e);
        CHECKF(rc == -1, "case %zu accepted: %s", i, cases[i].body);
        CHECKF(e.status == 400, "case %zu: status %d", i, e.status);
        CHECKF(!strcmp(e.param, cases[i].param), "case %zu: param '%s', want '%s'", i, e.param, cases[i].param);
        CHECKF(strstr(e.message, cases[i].in_message), "case %zu: message '%s' lacks '%s'", i, e.message, cases[i].in_message);
        char *j = srv_error_json(&e);
        json_error_t je;
        json_t *v = json_loads(j, 0, &je);
        free(j);
        const json_t *o = json_object_get(v, "error");
        CHECKF(json_is_string(json_object_get(o, "message")) && json_is_string(json_object_get(o, "type")) &&
                   json_object_get(o, "param") && json_object_get(o, "code"),
               "case %zu: error body is not OpenAI-shaped", i);
        json_decref(v);
    }
    /* completions: prompt shapes */
    static const bad_case comp[] = {
        {"{\"prompt\":5}", "prompt", "string"},
        {"{\"prompt\":[1,2000]}", "prompt", "vocabulary"},
        {"{\"prompt\":[1,-1]}", "prompt", "vocabulary"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt"},
        {"{\"prompt\":[]}", "prompt", "empty"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "integer"},
        {"{\"prompt\":\"x\",\"echo\":true}", "echo", "not supported"},
    };
    for (size_t i = 0; i < sizeof comp / sizeof *comp; i++) {
        srv_req r;
        srv_error e;
        int rc = srv_parse_request(SRV_COMPLETION, comp[i].body, strlen(comp[i].body), tok, 4096, &r, &e);
        CHECKF(rc == -1 && e.status == 400, "completion case %zu accepted", i);
        CHECKF(!strcmp(e.param, comp[i].param), "completion case %zu: param '%s'", i, e.param);
        CHECKF(strstr(e.message, comp[i].in_message), "completion case %zu: '%s'", i, e.message);
    }
    dsf_tokenizer_free(tok);
}

/* Guards the mapping of sampling/output fields and the context limit (a prompt that does not
 * fit gets a 400 naming the limit; max_tokens counts against it, as OpenAI does). */
TEST(server_parse_fields_and_context_limit) {
    NEED_SHARED(gguf, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gguf, err);
    CHECKF(tok, "%s", err);
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,"
                    "\"min_p\":0.1,\"seed\":42,\"max_completion_tokens\":9,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":4,"
                    "\"parallel_tool_calls\":false}";
    srv_req r;
    srv_error e;
    CHECKF(srv_parse_request(SRV_CHAT, b, strlen(b), tok, 4096, &r, &e) == 0, "%s", e.message);
    CHECK(r.kind == SRV_CHAT && r.stream && r.include_usage && !r.parallel_tool_calls);
    CHECK(r.temperature == 0.5f && r.top_p == 0.9f && r.top_k == 7 && r.min_p == 0.1f);
    CHECK(r.has_seed && r.seed == 42 && r.max_tokens == 9 && r.logprobs == 4);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "a") && !strcmp(r.stop[1], "bc"));
    CHECK(r.gen_reasoning); /* thinking is the default: the prompt ends with <think> */
    /* the prompt tokens are the tokenization of the rendered prompt (BOS is in the text) */
    dsf_chat_prompt p;
    const char *pr = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";
    CHECK(dsf_chat_render_openai(pr, strlen(pr), &p, err) == 0);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(dsf_tokenize(tok, p.prompt, p.prompt_len, false, true, &ids, &n, err) == 0);
    CHECK((size_t)r.n_prompt == n && !memcmp(ids, r.prompt, n * sizeof *ids));
    CHECK(r.prompt[0] == dsf_tokenizer_bos(tok));
    int np = r.n_prompt;
    free(ids);
    dsf_chat_prompt_free(&p);
    srv_req_free(&r);

    /* context limit: n_ctx == n_prompt does not fit (one token must be generated) */
    CHECK(srv_parse_request(SRV_CHAT, pr, strlen(pr), tok, np, &r, &e) == -1);
    CHECK(e.status == 400 && !strcmp(e.code, "context_length_exceeded"));
    char lim[32];
    snprintf(lim, sizeof lim, "%d tokens", np);
    CHECKF(strstr(e.message, lim), "message '%s' does not name the limit %d", e.message, np);
    CHECK(srv_parse_request(SRV_CHAT, pr, strlen(pr), tok, np + 1, &r, &e) == 0);
    srv_req_free(&r);
    const char *pm = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":2}";
    CHECK(srv_parse_request(SRV_CHAT, pm, strlen(pm), tok, np + 1, &r, &e) == -1 && e.status == 400);
    CHECK(srv_parse_request(SRV_CHAT, pm, strlen(pm), tok, np + 2, &r, &e) == 0);
    srv_req_free(&r);

    /* completions: a string gets BOS (tokenizer.ggml.add_bos_token is true in tiny41);
     * the ids come from testdata/tiny41/README.md's text-prompt case */
    const char *cs = "{\"prompt\":\"The capital of France is Paris, and the weather there is quite warm today.\",\"logprobs\":3}";
    static const int32_t want[] = {0, 322, 842, 298, 827, 360, 618, 285, 408, 14, 292, 272, 271,
                                   71, 276, 724, 272, 264, 360, 460, 269, 71, 903, 310, 440, 16};
    CHECKF(srv_parse_request(SRV_COMPLETION, cs, strlen(cs), tok, 4096, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompt == 26 && !memcmp(r.prompt, want, sizeof want) && r.logprobs == 3);
    srv_req_free(&r);
    const char *ci = "{\"prompt\":[[0,322,842]]}";
    CHECK(srv_parse_request(SRV_COMPLETION, ci, strlen(ci), tok, 4096, &r, &e) == 0);
    CHECK(r.n_prompt == 3 && r.prompt[2] == 842 && r.logprobs == -1 && !r.stream);
    srv_req_free(&r);
    dsf_tokenizer_free(tok);
}
