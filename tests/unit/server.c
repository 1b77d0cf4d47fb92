/* server.c: `dsflash serve` request -> encoder mapping and parser output -> response
 * JSON (src/server/server_api.c), without sockets or a model. Request parsing, which needs
 * a tokenizer, is checked in tests/tiny/server.c; the server itself in tests/e2e/server.c.
 *
 * Expected values come from ../shared/fixtures/chat (official encoder outputs and the
 * official parser's results) and from the OpenAI API's documented shapes. */
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server.h"
#include "test.h"

#include "helpers.h"

static json_t *parse(const char *s) {
    char err[DSF_ERR_LEN];
    return pyjson_loads(s, strlen(s), err);
}

/* Builds the OpenAI request that stands for an encoder-level fixture case: the messages as
 * they are, thinking switched through chat_template_kwargs, the effort as reasoning_effort. */
static json_t *openai_request(const json_t *c) {
    const json_t *args = json_object_get(c, "args");
    const json_t *mode = json_object_get(args, "thinking_mode");
    bool thinking = json_is_string(mode) && !strcmp(json_string_value(mode), "thinking");
    json_t *r = json_object();
    json_object_set(r, "messages", json_object_get(c, "messages"));
    json_object_set_new(r, "chat_template_kwargs", json_pack("{s:b}", "thinking", thinking));
    const json_t *eff = json_object_get(args, "reasoning_effort");
    if (eff && !json_is_null(eff)) json_object_set(r, "reasoning_effort", (json_t *)eff);
    return r;
}

/* Cases the serving layer maps on purpose instead of reproducing the encoder (spec §5):
 * developer -> system, a null user content -> "", the serving-level effort names, and an
 * empty message list (a 400 here, as in the OpenAI API). */
static bool served_differently(const char *name) {
    if (!strncmp(name, "empty_messages", 14)) return true;
    static const char *const skip[] = {"role_developer_rejected", "user_content_none_raises",
                                       "effort_invalid_in_chat_still_raises", "effort_invalid_medium", NULL};
    for (int i = 0; skip[i]; i++)
        if (!strcmp(name, skip[i])) return true;
    return false;
}

/* Guards against a server-side request mapping that changes the prompt the official encoder
 * builds (every fixture with a prompt and no encoder-only arguments must render byte-exact
 * through srv_chat_render), or that accepts input the encoder rejects. */
TEST(server_render_matches_chat_fixtures) {
    int n_prompt = 0, n_error = 0;
    char missing[128];
    json_t *cases = test_chat_cases(missing, sizeof missing);
    if (!cases) SKIP("needs ../shared/%s (absent)", missing);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *args = json_object_get(c, "args");
        /* encoder-only arguments have no OpenAI request equivalent */
        if (json_object_get(args, "context") || json_object_get(args, "drop_thinking") ||
            json_object_get(args, "add_default_bos_token"))
            continue;
        if (served_differently(name)) continue;
        const json_t *exp = json_object_get(json_object_get(c, "expected"), "prompt");
        const json_t *experr = json_object_get(c, "expected_error");
        if (!exp && !experr) continue;
        json_t *req = openai_request(c);
        dsf_chat_prompt p;
        srv_error e;
        int rc = srv_chat_render(req, &p, &e);
        json_decref(req);
        if (exp) {
            CHECKF(rc == 0, "%s: %s", name, e.message);
            size_t el = json_string_length(exp);
            CHECKF(p.prompt_len == el && !memcmp(p.prompt, json_string_value(exp), el),
                   "%s: prompt differs from the official encoder's", name);
            dsf_chat_prompt_free(&p);
            n_prompt++;
        } else {
            CHECKF(rc != 0, "%s: accepted, the official encoder raises", name);
            CHECKF(e.status == 400, "%s: status %d", name, e.status);
            const json_t *msg = json_object_get(experr, "message");
            const json_t *sub = json_object_get(experr, "message_contains");
            const char *want = json_string_value(msg ? msg : sub);
            CHECKF(want && strstr(e.message, want), "%s: error '%s' lacks '%s'", name, e.message, want);
            n_error++;
        }
    }
    json_decref(cases);
    /* counts of the fixture files at the time of writing: most cases must have run */
    CHECKF(n_prompt >= 40 && n_error >= 10, "only %d prompt and %d error cases ran", n_prompt, n_error);
}

static int render(const char *req, dsf_chat_prompt *p, srv_error *e) {
    json_t *r = parse(req);
    if (!r) return -2;
    int rc = srv_chat_render(r, p, e);
    json_decref(r);
    return rc;
}

static int render_official(const char *req, dsf_chat_prompt *p) {
    char err[DSF_ERR_LEN];
    return dsf_chat_render_json(req, strlen(req), p, err);
}

static bool same_prompt(const dsf_chat_prompt *a, const dsf_chat_prompt *b) {
    return a->prompt_len == b->prompt_len && !memcmp(a->prompt, b->prompt, a->prompt_len);
}

#define TOOL_A "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"
#define TOOL_B "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}"

/* Guards the OpenAI-level mapping of spec §5: request tools go onto a system message at
 * index 0 (as the official load_cases does), tool_choice none drops them, a named choice keeps
 * that tool only, developer == system, and the thinking switch / effort names. The expected
 * prompts come from the encoder-level API given the equivalent official input. */
TEST(server_render_request_mapping) {
    dsf_chat_prompt got, want;
    srv_error e;
    /* tools -> empty system message at 0 carrying them */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" TOOL_A "," TOOL_B "]}", &got, &e) == 0);
    CHECK(render_official("{\"messages\":[{\"role\":\"system\",\"content\":\"\",\"tools\":[" TOOL_A "," TOOL_B
                          "]},{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"thinking\"}}",
                          &want) == 0);
    CHECK(same_prompt(&got, &want));
    CHECK(strstr(got.prompt, "## Tools") && strstr(got.prompt, "get_time"));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
    /* a named tool_choice offers only that tool */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" TOOL_A "," TOOL_B
                 "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", &got, &e) == 0);
    CHECK(render_official("{\"messages\":[{\"role\":\"system\",\"content\":\"\",\"tools\":[" TOOL_A
                          "]},{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"thinking\"}}",
                          &want) == 0);
    CHECK(same_prompt(&got, &want));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
    /* tool_choice none: no tools block at all */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" TOOL_A "],\"tool_choice\":\"none\"}", &got, &e) == 0);
    CHECK(render_official("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"thinking\"}}", &want) == 0);
    CHECK(same_prompt(&got, &want));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
    /* developer is served as system */
    CHECK(render("{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}]}", &got, &e) == 0);
    CHECK(render_official("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"thinking\"}}", &want) == 0);
    CHECK(same_prompt(&got, &want));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
    /* thinking off three ways; the chat-mode generation header ends with </think> (spec §2.6) */
    static const char *const off[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"thinking\":false}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"none\"}"};
    CHECK(render_official("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"chat\"}}", &want) == 0);
    for (int i = 0; i < 3; i++) {
        CHECKF(render(off[i], &got, &e) == 0, "%s", e.message);
        CHECKF(same_prompt(&got, &want) && !got.gen_reasoning, "case %d", i);
        dsf_chat_prompt_free(&got);
    }
    dsf_chat_prompt_free(&want);
    /* effort: names and numbers (spec §2.9: high -> 75) */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"high\"}", &got, &e) == 0);
    CHECK(strstr(got.prompt, "Reasoning Effort: 75 (range 1-100") && got.gen_reasoning);
    dsf_chat_prompt_free(&got);
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":33}", &got, &e) == 0);
    CHECK(strstr(got.prompt, "Reasoning Effort: 33 (range 1-100"));
    dsf_chat_prompt_free(&got);
    /* response_format json_schema renders its schema on the system message (spec §2.12) */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\","
                 "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\"}}}}", &got, &e) == 0);
    CHECK(render_official("{\"messages\":[{\"role\":\"system\",\"content\":\"\",\"response_format\":{\"type\":\"object\"}},"
                          "{\"role\":\"user\",\"content\":\"hi\"}],\"args\":{\"thinking_mode\":\"thinking\"}}", &want) == 0);
    CHECK(same_prompt(&got, &want));
    CHECK(strstr(got.prompt, "## Response Format:"));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
    /* content as parts == content as a string joined by "\n\n" (spec §2.1 step 4) */
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}", &got, &e) == 0);
    CHECK(render("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\n\\nb\"}]}", &want, &e) == 0);
    CHECK(same_prompt(&got, &want));
    dsf_chat_prompt_free(&got);
    dsf_chat_prompt_free(&want);
}

static bool is_call_id(const char *s) {
    if (!s || strncmp(s, "call_", 5) || strlen(s) != 29) return false;
    for (int i = 5; i < 29; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9'))) return false;
    return true;
}

/* Guards parser output -> chat.completion: reasoning_content split from content, tool calls
 * with ids/names/JSON arguments (and namespace), finish_reason tool_calls, for the official
 * parser's fixture results. */
TEST(server_reply_from_parse_fixtures) {
    NEED_SHARED(path, "fixtures/chat/official_test_encoding_assertions.json");
    json_t *fx = test_load_json(path);
    CHECK(fx);
    const json_t *cases = json_object_get(fx, "parse_cases");
    int ran = 0;
    uint64_t rng = dsf_rng_init(7);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *ep = json_object_get(c, "expected_parsed");
        if (!ep) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        bool thinking = !strcmp(json_string_value(json_object_get(c, "thinking_mode")), "thinking");
        const json_t *comp = json_object_get(c, "completion");
        dsf_buf text = {0};
        dsf_buf_append(&text, json_string_value(comp), json_string_length(comp));
        dsf_buf_appendf(&text, "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>");
        dsf_dsml_result r;
        char err[DSF_ERR_LEN];
        CHECKF(dsf_dsml_parse((const char *)text.data, text.len, thinking, true, &r, err) == 0, "%s: %s", name, err);
        dsf_buf_free(&text);
        char ids[8][32];
        for (int k = 0; k < r.n_calls && k < 8; k++) srv_call_id(ids[k], &rng);
        srv_meta m = {.id = "chatcmpl-test", .model = "m", .created = 1};
        srv_usage u = {.prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 3};
        json_t *reply = srv_chat_reply(&m, &r, ids, "stop", &u, NULL, 0, NULL, true);
        const json_t *ch = json_array_get(json_object_get(reply, "choices"), 0);
        const json_t *msg = json_object_get(ch, "message");
        CHECKF(!strcmp(json_string_value(json_object_get(reply, "object")), "chat.completion"), "%s", name);
        CHECKF(!strcmp(json_string_value(json_object_get(msg, "role")), "assistant"), "%s", name);
        CHECKF(json_equal(json_object_get(msg, "content"), json_object_get(ep, "content")), "%s: content", name);
        const json_t *erc = json_object_get(ep, "reasoning_content");
        const json_t *grc = json_object_get(msg, "reasoning_content");
        bool rc_ok = json_string_length(erc) ? json_equal(grc, erc) : json_is_null(grc);
        CHECKF(rc_ok, "%s: reasoning_content", name);
        const json_t *ecalls = json_object_get(ep, "tool_calls"), *gcalls = json_object_get(msg, "tool_calls");
        CHECKF(json_array_size(gcalls) == json_array_size(ecalls), "%s: %zu calls", name, json_array_size(gcalls));
        for (size_t k = 0; k < json_array_size(ecalls); k++) {
            const json_t *e = json_array_get(ecalls, k), *g = json_array_get(gcalls, k);
            CHECKF(json_equal(json_object_get(e, "function"), json_object_get(g, "function")), "%s: call %zu", name, k);
            const json_t *ens = json_object_get(e, "namespace"), *gns = json_object_get(g, "namespace");
            CHECKF(ens ? json_equal(ens, gns) : !gns, "%s: ns %zu", name, k);
            CHECKF(!strcmp(json_string_value(json_object_get(g, "type")), "function"), "%s", name);
            CHECKF(is_call_id(json_string_value(json_object_get(g, "id"))), "%s: id", name);
        }
        if (json_array_size(ecalls) == 2) CHECK(strcmp(ids[0], ids[1]));
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        CHECKF(!strcmp(fr, json_array_size(ecalls) ? "tool_calls" : "stop"), "%s: finish %s", name, fr);
        const json_t *us = json_object_get(reply, "usage");
        CHECK(json_integer_value(json_object_get(us, "total_tokens")) == 15);
        CHECK(json_integer_value(json_object_get(json_object_get(us, "prompt_tokens_details"), "cached_tokens")) == 3);
        /* parallel_tool_calls false keeps the first call */
        json_t *one = srv_chat_reply(&m, &r, ids, "length", &u, NULL, 0, NULL, false);
        const json_t *ch1 = json_array_get(json_object_get(one, "choices"), 0);
        CHECK(json_array_size(json_object_get(json_object_get(ch1, "message"), "tool_calls")) == (json_array_size(ecalls) ? 1u : 0u));
        CHECK(!strcmp(json_string_value(json_object_get(ch1, "finish_reason")), "length"));
        json_decref(one);
        json_decref(reply);
        dsf_dsml_result_free(&r);
        ran++;
    }
    CHECKF(ran >= 3, "only %d parse cases", ran);
    json_decref(fx);
    /* a tool call without content: content is null, as OpenAI sends it */
    const char *dsml = "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"f\">\n</\xef\xbd\x9c"
                    "DSML\xef\xbd\x9c invoke>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c calls><\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81"
                    "sentence\xef\xbd\x9c>";
    dsf_dsml_result r;
    char err[DSF_ERR_LEN];
    CHECKF(dsf_dsml_parse(dsml, strlen(dsml), false, true, &r, err) == 0, "%s", err);
    char ids[1][32];
    srv_call_id(ids[0], &rng);
    srv_meta m = {.id = "chatcmpl-x", .model = "m", .created = 1};
    srv_usage u = {0};
    json_t *reply = srv_chat_reply(&m, &r, ids, "stop", &u, NULL, 0, NULL, true);
    const json_t *msg = json_object_get(json_array_get(json_object_get(reply, "choices"), 0), "message");
    CHECK(json_is_null(json_object_get(msg, "content")));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function"), "arguments")), "{}"));
    json_decref(reply);
    dsf_dsml_result_free(&r);
}

/* Guards the wire framing: one SSE event = "data: " + one-line JSON + blank line; chunk and
 * usage-chunk shapes of the OpenAI streaming format. */
TEST(server_chunks_and_sse_framing) {
    srv_meta m = {.id = "chatcmpl-abc", .model = "tiny", .created = 123};
    json_t *choice;
    json_t *c = srv_chunk(&m, SRV_CHAT, &choice);
    json_object_set_new(json_object_get(choice, "delta"), "content", json_string("line1\nline2"));
    dsf_buf b = {0};
    srv_sse_json(&b, c);
    json_decref(c);
    dsf_buf_append(&b, "", 0);
    const char *s = (const char *)b.data;
    CHECK(!strncmp(s, "data: {", 7));
    CHECK(b.len >= 2 && s[b.len - 1] == '\n' && s[b.len - 2] == '\n');
    CHECK(!memchr(s, '\n', b.len - 2)); /* newlines inside values are escaped */
    json_error_t je;
    json_t *v = json_loadb(s + 6, b.len - 8, 0, &je);
    CHECK(v);
    CHECK(!strcmp(json_string_value(json_object_get(v, "object")), "chat.completion.chunk"));
    CHECK(json_integer_value(json_object_get(v, "created")) == 123);
    const json_t *ch = json_array_get(json_object_get(v, "choices"), 0);
    CHECK(json_integer_value(json_object_get(ch, "index")) == 0 && json_is_null(json_object_get(ch, "finish_reason")));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")), "line1\nline2"));
    json_decref(v);
    dsf_buf_free(&b);
    srv_usage u = {.prompt_tokens = 7, .completion_tokens = 2, .cached_tokens = 6};
    v = srv_usage_chunk(&m, SRV_COMPLETION, &u);
    CHECK(!strcmp(json_string_value(json_object_get(v, "object")), "text_completion"));
    CHECK(json_array_size(json_object_get(v, "choices")) == 0);
    CHECK(json_integer_value(json_object_get(json_object_get(v, "usage"), "total_tokens")) == 9);
    json_decref(v);
}

typedef struct {
    srv_meta m;
    char ids[8][32];
    uint64_t rng;
    json_t *chunks;
} stream_sink;

static void sink_event(void *ud, const dsf_dsml_event *ev) {
    stream_sink *s = ud;
    const char *id = NULL;
    if ((ev->type == DSF_DSML_TOOL_START || ev->type == DSF_DSML_TOOL_ARGS) && ev->index >= 0 && ev->index < 8) {
        if (!s->ids[ev->index][0]) srv_call_id(s->ids[ev->index], &s->rng);
        id = s->ids[ev->index];
    }
    json_t *ch = srv_dsml_chunk(&s->m, ev, id, true);
    if (ch) json_array_append_new(s->chunks, ch);
}

/* Guards streamed tool calls: feeding the official parse fixtures' completions byte by byte
 * through the DSML parser and srv_dsml_chunk, a client that accumulates the deltas the way
 * the OpenAI SDK does (content and reasoning concatenated; tool_calls by index: id, name once,
 * arguments concatenated) gets exactly the official parser's result. */
TEST(server_stream_tool_call_chunks) {
    NEED_SHARED(path, "fixtures/chat/official_test_encoding_assertions.json");
    json_t *fx = test_load_json(path);
    CHECK(fx);
    const json_t *cases = json_object_get(fx, "parse_cases");
    int ran = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *ep = json_object_get(c, "expected_parsed");
        if (!ep) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        bool thinking = !strcmp(json_string_value(json_object_get(c, "thinking_mode")), "thinking");
        dsf_buf text = {0};
        const json_t *comp = json_object_get(c, "completion");
        dsf_buf_append(&text, json_string_value(comp), json_string_length(comp));
        dsf_buf_appendf(&text, "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>");
        stream_sink sk = {.m = {.id = "chatcmpl-s", .model = "m", .created = 1}, .rng = dsf_rng_init(3),
                          .chunks = json_array()};
        dsf_dsml_parser *p = dsf_dsml_parser_new(thinking, false);
        CHECK(p);
        for (size_t k = 0; k < text.len; k++) dsf_dsml_feed(p, (const char *)text.data + k, 1, sink_event, &sk);
        dsf_dsml_result res;
        char err[DSF_ERR_LEN];
        dsf_dsml_finish(p, sink_event, &sk, &res, err);
        dsf_dsml_result_free(&res);
        dsf_dsml_parser_free(p);
        dsf_buf_free(&text);
        /* accumulate like a client */
        dsf_buf content = {0}, reasoning = {0};
        json_t *calls = json_array();
        for (size_t k = 0; k < json_array_size(sk.chunks); k++) {
            const json_t *ch = json_array_get(sk.chunks, k);
            CHECK(!strcmp(json_string_value(json_object_get(ch, "object")), "chat.completion.chunk"));
            const json_t *d = json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "delta");
            const json_t *v;
            if ((v = json_object_get(d, "content"))) dsf_buf_append(&content, json_string_value(v), json_string_length(v));
            if ((v = json_object_get(d, "reasoning_content")))
                dsf_buf_append(&reasoning, json_string_value(v), json_string_length(v));
            const json_t *tc = json_object_get(d, "tool_calls");
            for (size_t q = 0; q < json_array_size(tc); q++) {
                const json_t *tcall = json_array_get(tc, q);
                size_t idx = (size_t)json_integer_value(json_object_get(tcall, "index"));
                const json_t *f = json_object_get(tcall, "function");
                if (json_object_get(tcall, "id")) { /* the first delta of a call */
                    CHECKF(idx == json_array_size(calls), "%s: call index %zu out of order", name, idx);
                    json_array_append_new(calls, json_pack("{s:O,s:O,s:s}", "id", json_object_get(tcall, "id"), "name",
                                                           json_object_get(f, "name"), "arguments", ""));
                }
                CHECKF(idx < json_array_size(calls), "%s: arguments before the call started", name);
                json_t *call = json_array_get(calls, idx);
                const json_t *a = json_object_get(f, "arguments");
                if (json_string_length(a)) {
                    dsf_buf acc = {0};
                    dsf_buf_appendf(&acc, "%s%s", json_string_value(json_object_get(call, "arguments")), json_string_value(a));
                    json_object_set_new(call, "arguments", json_stringn((const char *)acc.data, acc.len));
                    dsf_buf_free(&acc);
                }
            }
        }
        dsf_buf_append(&content, "", 0);
        dsf_buf_append(&reasoning, "", 0);
        CHECKF(!strcmp((char *)content.data, json_string_value(json_object_get(ep, "content"))), "%s: content '%s'", name,
               (char *)content.data);
        CHECKF(!strcmp((char *)reasoning.data, json_string_value(json_object_get(ep, "reasoning_content"))),
               "%s: reasoning '%s'", name, (char *)reasoning.data);
        const json_t *ecalls = json_object_get(ep, "tool_calls");
        CHECKF(json_array_size(calls) == json_array_size(ecalls), "%s: %zu calls", name, json_array_size(calls));
        for (size_t k = 0; k < json_array_size(ecalls); k++) {
            const json_t *e = json_object_get(json_array_get(ecalls, k), "function"), *g = json_array_get(calls, k);
            CHECKF(json_equal(json_object_get(e, "name"), json_object_get(g, "name")), "%s: name", name);
            CHECKF(json_equal(json_object_get(e, "arguments"), json_object_get(g, "arguments")), "%s: arguments %s", name,
                   json_string_value(json_object_get(g, "arguments")));
            CHECKF(is_call_id(json_string_value(json_object_get(g, "id"))), "%s: id", name);
        }
        dsf_buf_free(&content);
        dsf_buf_free(&reasoning);
        json_decref(calls);
        json_decref(sk.chunks);
        ran++;
    }
    CHECKF(ran >= 3, "only %d cases", ran);
    json_decref(fx);
}
