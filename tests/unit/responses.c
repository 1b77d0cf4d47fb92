/* responses.c: the OpenAI Responses API's pure mapping (src/server/responses.c), without
 * sockets or a model: request -> chat request, the echo fields, the conversation; output
 * items, the Response object and the stream event framing. The endpoint itself runs in
 * tests/npm/sdk/responses.test.mjs (tests/e2e/sdk.c) against the official openai client.
 *
 * Expected values come from ../shared/fixtures/chat (official encoder outputs: a Responses
 * request that says the same as a fixture's messages must render the same prompt bytes), from
 * the chat-completions request shape that /v1/chat/completions documents, and from the
 * openai SDK's types (resources/responses/responses.d.ts). */
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/responses.h"
#include "test.h"

#include "helpers.h"

static json_t *parse(const char *s) {
    char err[DSF_ERR_LEN];
    return pyjson_loads(s, strlen(s), err);
}

/* v equals the JSON text want (parsed here). */
static bool eq_json(const json_t *v, const char *want) {
    json_t *w = parse(want);
    bool eq = w && json_equal(v, w);
    json_decref(w);
    return eq;
}

/* ==== fixture messages -> Responses input items ========================================== */

static bool only_keys(const json_t *o, const char *const *keys) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool ok = false;
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k, keys[i]);
        if (!ok) return false;
    }
    return true;
}

static bool role_is(const json_t *m, const char *r) {
    const json_t *v = json_object_get(m, "role");
    return json_is_string(v) && !strcmp(json_string_value(v), r);
}

/* The request tools of a fixture's first system message, as Responses function tools; false
 * when they cannot be said that way (other shapes, or function keys in another order than
 * the one the mapping writes back: name, description, parameters). */
static bool tools_of(const json_t *tools, json_t *out) {
    static const char *const order[] = {"name", "description", "parameters"};
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *f = json_object_get(t, "function");
        static const char *const tkeys[] = {"type", "function", NULL};
        if (!json_is_object(f) || !only_keys(t, tkeys) || !json_is_string(json_object_get(f, "name"))) return false;
        int at = 0;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)f, k, v) {
            while (at < 3 && strcmp(k, order[at])) at++;
            if (at == 3) return false;
        }
        json_t *rt = json_pack("{s:s}", "type", "function");
        json_object_update(rt, (json_t *)f);
        json_array_append_new(out, rt);
    }
    return true;
}

/* One fixture assistant message -> reasoning, message and function_call items. */
static bool assistant_items(const json_t *m, size_t im, json_t *items, json_t *ids) {
    const json_t *rc = json_object_get(m, "reasoning_content"), *c = json_object_get(m, "content"),
                 *tc = json_object_get(m, "tool_calls");
    if (json_is_string(rc) && json_string_length(rc))
        json_array_append_new(items, json_pack("{s:s,s:[],s:[{s:s,s:O}]}", "type", "reasoning", "summary", "content",
                                               "type", "reasoning_text", "text", rc));
    else if (rc && !json_is_null(rc) && !json_is_string(rc)) return false;
    if (json_is_string(c))
        json_array_append_new(items, json_pack("{s:s,s:s,s:[{s:s,s:O,s:[]}]}", "type", "message", "role", "assistant",
                                               "content", "type", "output_text", "text", c, "annotations"));
    else if (c && !json_is_null(c)) return false;
    json_array_clear(ids);
    for (size_t k = 0; json_is_array(tc) && k < json_array_size(tc); k++) {
        const json_t *call = json_array_get(tc, k), *f = json_object_get(call, "function");
        const json_t *id = json_object_get(call, "id");
        if (!json_is_string(json_object_get(f, "name")) || !json_is_string(json_object_get(f, "arguments"))) return false;
        char gen[64];
        snprintf(gen, sizeof gen, "call_fx_%zu_%zu", im, k);
        json_t *cid = json_is_string(id) ? json_incref((json_t *)id) : json_string(gen);
        json_array_append(ids, cid);
        json_t *item = json_pack("{s:s,s:o,s:O,s:O}", "type", "function_call", "call_id", cid, "name",
                                 json_object_get(f, "name"), "arguments", json_object_get(f, "arguments"));
        const json_t *ns = json_object_get(call, "namespace");
        if (!ns) ns = json_object_get(f, "namespace");
        if (json_is_string(ns)) json_object_set(item, "namespace", (json_t *)ns);
        else if (ns && !json_is_null(ns)) return json_decref(item), false;
        json_array_append_new(items, item);
    }
    return true;
}

/* A Responses request that says what a fixture case says, or NULL when it cannot. */
static json_t *responses_request(const json_t *c) {
    const json_t *args = json_object_get(c, "args");
    static const char *const akeys[] = {"thinking_mode", "reasoning_effort", NULL};
    if (!only_keys(args, akeys)) return NULL;
    bool thinking = !strcmp(json_string_value(json_object_get(args, "thinking_mode")), "thinking");
    const json_t *eff = json_object_get(args, "reasoning_effort");
    if (eff && !json_is_null(eff) && (!thinking || !json_is_string(eff))) return NULL; /* Responses efforts are names */
    json_t *body = json_object(), *items = json_array(), *ids = json_array();
    json_object_set_new(body, "input", items);
    if (!thinking) json_object_set_new(body, "reasoning", json_pack("{s:s}", "effort", "none"));
    else if (json_is_string(eff)) json_object_set_new(body, "reasoning", json_pack("{s:O}", "effort", eff));
    const json_t *msgs = json_object_get(c, "messages");
    size_t n_tool = 0;
    bool ok = json_array_size(msgs) > 0;
    for (size_t i = 0; ok && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        static const char *const mkeys[] = {"role", "content", "tool_calls", "reasoning_content", "tool_call_id", "tools", NULL};
        const json_t *content = json_object_get(m, "content");
        ok = json_is_object(m) && only_keys(m, mkeys);
        if (!ok) break;
        if (json_object_get(m, "tools")) {
            json_t *tools = json_array();
            json_object_set_new(body, "tools", tools);
            ok = i == 0 && role_is(m, "system") && tools_of(json_object_get(m, "tools"), tools);
            if (!ok) break;
        }
        if (role_is(m, "assistant")) {
            ok = assistant_items(m, i, items, ids);
            n_tool = 0;
        } else if (role_is(m, "tool")) {
            const json_t *id = json_object_get(m, "tool_call_id");
            json_t *cid = json_is_string(id) ? json_incref((json_t *)id) : json_incref(json_array_get(ids, n_tool));
            ok = cid && json_is_string(content);
            if (ok)
                json_array_append_new(items, json_pack("{s:s,s:O,s:O}", "type", "function_call_output", "call_id", cid,
                                                       "output", content));
            json_decref(cid);
            n_tool++;
        } else if (role_is(m, "user") || role_is(m, "system")) {
            ok = json_is_string(content) && !json_object_get(m, "tool_calls") && !json_object_get(m, "reasoning_content");
            if (ok)
                json_array_append_new(items, json_pack("{s:s,s:O,s:[{s:s,s:O}]}", "type", "message", "role",
                                                       json_object_get(m, "role"), "content", "type", "input_text",
                                                       "text", content));
        } else {
            ok = false;
        }
    }
    json_decref(ids);
    if (!ok) {
        json_decref(body);
        return NULL;
    }
    return body;
}

/* Guards against a Responses mapping that renders another prompt than the official encoder
 * for the same conversation: every fixture whose messages, tools and thinking switch a
 * Responses request can say (input items: messages with input_text / output_text parts,
 * reasoning items, function_call and function_call_output; request tools; reasoning.effort)
 * must render byte-exact through resp_map_request + srv_chat_render. */
TEST(responses_render_matches_chat_fixtures) {
    int ran = 0, with_tools = 0, with_calls = 0, with_reasoning = 0;
    char missing[128];
    json_t *cases = test_chat_cases(missing, sizeof missing);
    if (!cases) SKIP("needs ../shared/%s (absent)", missing);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *exp = json_object_get(json_object_get(c, "expected"), "prompt");
        if (!exp || !strncmp(name, "effort_invalid", 14)) continue;
        json_t *body = responses_request(c);
        if (!body) continue;
        resp_request rq;
        srv_error e;
        int rc = resp_map_request(body, NULL, &rq, &e);
        CHECKF(rc == 0, "%s: %s", name, e.message);
        dsf_chat_prompt p;
        rc = srv_chat_render(rq.chat, &p, &e);
        CHECKF(rc == 0, "%s: %s", name, e.message);
        size_t el = json_string_length(exp);
        CHECKF(p.prompt_len == el && !memcmp(p.prompt, json_string_value(exp), el),
               "%s: prompt differs from the official encoder's:\n%s\n----\n%s", name, p.prompt, json_string_value(exp));
        with_tools += json_object_get(body, "tools") != NULL;
        bool outputs = false, reasoning = false;
        const json_t *items = json_object_get(body, "input");
        for (size_t k = 0; k < json_array_size(items); k++) {
            const char *ty = json_string_value(json_object_get(json_array_get(items, k), "type"));
            outputs |= !strcmp(ty, "function_call_output");
            reasoning |= !strcmp(ty, "reasoning");
        }
        with_calls += outputs;
        with_reasoning += reasoning;
        dsf_chat_prompt_free(&p);
        resp_request_free(&rq);
        json_decref(body);
        ran++;
    }
    json_decref(cases);
    /* counts of the fixture files at the time of writing: most expressible cases must run */
    CHECKF(ran >= 25 && with_tools >= 3 && with_calls >= 4 && with_reasoning >= 3,
           "only %d cases ran (%d with tools, %d with tool results, %d with reasoning)", ran, with_tools, with_calls,
           with_reasoning);
}

/* ==== request mapping ====================================================================== */

static json_t *map_ok(test_ctx *t, const char *body, resp_request *rq, const json_t *history) {
    json_t *b = parse(body);
    srv_error e;
    if (!b || resp_map_request(b, history, rq, &e)) {
        test_fail(t, __FILE__, __LINE__, "refused: %s", b ? e.message : "bad JSON in the test");
        json_decref(b);
        return NULL;
    }
    json_decref(b);
    return rq->chat;
}

/* Guards the field-by-field mapping onto the chat request that /v1/chat/completions (and the
 * constrained decoding keyed on its tool_choice / parallel_tool_calls / response_format)
 * reads: instructions first, input items into turns, function tools, tool_choice forms,
 * reasoning.effort, max_output_tokens, sampling, text.format; and the Response's echo. */
TEST(responses_request_mapping) {
    resp_request rq;
    json_t *chat = map_ok(t,
        "{\"model\": \"m\", \"instructions\": \"Be brief.\", \"input\": ["
        "{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"q\"}]},"
        "{\"type\": \"reasoning\", \"summary\": [], \"content\": [{\"type\": \"reasoning_text\", \"text\": \"hm\"}]},"
        "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"},"
        "{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"ok\"},"
        "{\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"done\", \"annotations\": []}]},"
        "{\"role\": \"developer\", \"content\": \"d\"}],"
        "\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\"}, \"strict\": true}],"
        "\"tool_choice\": {\"type\": \"function\", \"name\": \"f\"}, \"parallel_tool_calls\": false,"
        "\"reasoning\": {\"effort\": \"high\", \"summary\": \"auto\"}, \"max_output_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9,"
        "\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\", \"schema\": {\"type\": \"object\"}, \"strict\": true}},"
        "\"stream\": true, \"store\": false, \"metadata\": {\"k\": \"v\"}, \"user\": \"u\", \"include\": [], \"truncation\": \"disabled\"}",
        &rq, NULL);
    if (!chat) return;
    json_t *want = parse(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"q\"},"
        "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hm\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
        "\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"ok\"},"
        "{\"role\": \"assistant\", \"content\": \"done\"}, {\"role\": \"developer\", \"content\": \"d\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\"}}}],"
        "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}, \"parallel_tool_calls\": false,"
        "\"reasoning_effort\": \"high\", \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9,"
        "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": {\"type\": \"object\"}, \"strict\": true}},"
        "\"stream\": true}");
    char *got = json_dumps(chat, JSON_COMPACT);
    CHECKF(json_equal(chat, want), "chat request: %s", got);
    free(got);
    json_decref(want);
    /* the echo: SDK Response fields */
    const json_t *echo = rq.echo;
    json_t *tool = json_array_get(json_object_get(echo, "tools"), 0);
    CHECK(eq_json(tool, "{\"type\": \"function\", \"name\": \"f\", \"description\": \"d\", "
                        "\"parameters\": {\"type\": \"object\"}, \"strict\": true}"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(echo, "tool_choice"), "name")), "f"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_object_get(echo, "text"), "format"), "name")), "n"));
    CHECK(json_is_false(json_object_get(echo, "store")) && !rq.store);
    CHECK(json_is_false(json_object_get(echo, "parallel_tool_calls")));
    CHECK(json_integer_value(json_object_get(echo, "max_output_tokens")) == 7);
    CHECK(!strcmp(json_string_value(json_object_get(echo, "instructions")), "Be brief."));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(echo, "reasoning"), "effort")), "high"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(echo, "metadata"), "k")), "v"));
    CHECK(!strcmp(json_string_value(json_object_get(echo, "user")), "u"));
    CHECK(json_array_size(rq.conv) == 6);
    resp_request_free(&rq);

    /* a string input is one user message; defaults: store, auto, text, no tools */
    chat = map_ok(t, "{\"input\": \"hello\"}", &rq, NULL);
    if (!chat) return;
    CHECK(eq_json(json_object_get(chat, "messages"), ("[{\"role\": \"user\", \"content\": \"hello\"}]")));
    CHECK(!json_object_get(chat, "tool_choice") && !json_object_get(chat, "response_format") &&
          !json_object_get(chat, "reasoning_effort") && !json_object_get(chat, "max_tokens"));
    CHECK(rq.store && json_is_true(json_object_get(rq.echo, "store")));
    CHECK(!strcmp(json_string_value(json_object_get(rq.echo, "tool_choice")), "auto"));
    CHECK(eq_json(json_object_get(rq.echo, "text"), ("{\"format\": {\"type\": \"text\"}}")));
    CHECK(json_array_size(json_object_get(rq.echo, "tools")) == 0);
    CHECK(eq_json(rq.conv, ("[{\"type\": \"message\", \"role\": \"user\", \"content\": \"hello\"}]")));

    /* history (a stored conversation) goes first; the conversation keeps both */
    json_t *hist = json_incref(rq.conv);
    resp_request_free(&rq);
    json_array_append_new(hist, parse("{\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"hi\", \"annotations\": []}]}"));
    chat = map_ok(t, "{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\"}, {\"type\": \"input_text\", \"text\": \"b\"}]}],"
                     "\"tool_choice\": \"required\", \"tools\": [{\"type\": \"function\", \"name\": \"g\"}], \"text\": {\"format\": {\"type\": \"json_object\"}}}",
                  &rq, hist);
    json_decref(hist);
    if (!chat) return;
    CHECK(eq_json(json_object_get(chat, "messages"),
                     ("[{\"role\": \"user\", \"content\": \"hello\"}, {\"role\": \"assistant\", \"content\": \"hi\"},"
                           "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}]")));
    CHECK(json_array_size(rq.conv) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(chat, "tool_choice")), "required"));
    CHECK(eq_json(json_object_get(chat, "response_format"), ("{\"type\": \"json_object\"}")));
    CHECK(json_is_true(json_object_get(json_array_get(json_object_get(rq.echo, "tools"), 0), "strict")));
    resp_request_free(&rq);

    /* reasoning effort none switches thinking off as chat's reasoning_effort does */
    chat = map_ok(t, "{\"input\": \"x\", \"reasoning\": {\"effort\": \"none\"}, \"tool_choice\": \"none\"}", &rq, NULL);
    if (!chat) return;
    CHECK(!strcmp(json_string_value(json_object_get(chat, "reasoning_effort")), "none"));
    CHECK(!strcmp(json_string_value(json_object_get(chat, "tool_choice")), "none"));
    resp_request_free(&rq);
}

/* Guards against bad input that is accepted, crashes, or gets an error that does not say
 * what is wrong: each refused body names its field (param) and the offending value. */
TEST(responses_errors_name_the_field) {
    static const struct { const char *body, *param, *needle; } cases[] = {
        {"[]", "", "object"},
        {"{}", "input", "required"},
        {"{\"input\": [], \"instructions\": \"x\"}", "input", "empty"},
        {"{\"input\": 42}", "input", "input"},
        {"{\"input\": [7]}", "input[0]", "object"},
        {"{\"input\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "input[0].role", "wizard"},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\", \"file_id\": \"u\"}]}]}",
         "input[0].content", "input_file"},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"file_id\": \"u\"}]}]}",
         "input[0].content", "image_url"},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\"}]}]}", "input[0].content", "text"},
        {"{\"input\": [{\"type\": \"item_reference\", \"id\": \"x\"}]}", "input[0]", "item_reference"},
        {"{\"input\": [{\"type\": \"function_call\", \"name\": \"f\", \"arguments\": \"{}\"}]}", "input[0]", "call_id"},
        {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\"}]}", "input[0].output", "output"},
        {"{\"input\": [{\"type\": \"reasoning\", \"content\": \"x\"}]}", "input[0]", "content"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "tools", "web_search"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\"}]}", "tools", "name"},
        {"{\"input\": \"x\", \"tools\": {}}", "tools", "list"},
        {"{\"input\": \"x\", \"tool_choice\": \"always\"}", "tool_choice", "always"},
        {"{\"input\": \"x\", \"tool_choice\": {\"type\": \"file_search\"}}", "tool_choice", "file_search"},
        {"{\"input\": \"x\", \"temperature\": \"hot\"}", "temperature", "number"},
        {"{\"input\": \"x\", \"max_output_tokens\": 0}", "max_output_tokens", "at least 1"},
        {"{\"input\": \"x\", \"max_output_tokens\": 1.5}", "max_output_tokens", "integer"},
        {"{\"input\": \"x\", \"reasoning\": {\"effort\": 3}}", "reasoning.effort", "string"},
        {"{\"input\": \"x\", \"reasoning\": {\"effort\": \"ultra\"}}", "reasoning.effort", "ultra"},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\"}}}", "text.format.schema", "schema"},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"yaml\"}}}", "text.format", "json_schema"},
        {"{\"input\": \"x\", \"metadata\": {\"k\": 1}}", "metadata", "metadata.k"},
        {"{\"input\": \"x\", \"store\": \"yes\"}", "store", "boolean"},
        {"{\"input\": \"x\", \"background\": true}", "background", "background"},
        {"{\"input\": \"x\", \"conversation\": \"conv_1\"}", "conversation", "previous_response_id"},
        {"{\"input\": \"x\", \"previous_response_id\": 5}", "previous_response_id", "string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *b = parse(cases[i].body);
        CHECKF(b, "test body %zu is not JSON", i);
        resp_request rq;
        srv_error e;
        memset(&e, 0, sizeof e);
        int rc = resp_map_request(b, NULL, &rq, &e);
        json_decref(b);
        CHECKF(rc != 0, "accepted %s", cases[i].body);
        CHECKF(e.status == 400, "%s: status %d", cases[i].body, e.status);
        CHECKF(!strcmp(e.param, cases[i].param), "%s: param '%s', want '%s'", cases[i].body, e.param, cases[i].param);
        CHECKF(strstr(e.message, cases[i].needle), "%s: message '%s' lacks '%s'", cases[i].body, e.message, cases[i].needle);
        CHECK(!rq.chat && !rq.echo && !rq.conv);
    }
}

/* ==== output =============================================================================== */

static bool str_eq(const json_t *v, const char *s) { return json_is_string(v) && !strcmp(json_string_value(v), s); }

/* Guards the output items and Response object against the SDK's types (ResponseReasoningItem
 * with reasoning_text content, ResponseOutputMessage with output_text + annotations,
 * ResponseFunctionToolCall with id / call_id, ResponseUsage with its details; output_text is
 * not a wire field), item order, ids, the status of a cut-off item and parallel_tool_calls. */
TEST(responses_output_items_and_object) {
    dsf_tool_call calls[2] = {{"get_weather", NULL, "{\"city\": \"Paris\"}"}, {"f", "ns", "{}"}};
    dsf_dsml_result r = {.reasoning = "think", .reasoning_len = 5, .content = "hello", .content_len = 5,
                         .calls = calls, .n_calls = 2};
    char ids[2][32] = {"call_A", "call_B"};
    json_t *out = resp_output(&r, "RID", ids, true, "incomplete");
    CHECK(json_array_size(out) == 4);
    const json_t *rs = json_array_get(out, 0), *msg = json_array_get(out, 1), *c0 = json_array_get(out, 2),
                 *c1 = json_array_get(out, 3);
    CHECK(str_eq(json_object_get(rs, "type"), "reasoning") && str_eq(json_object_get(rs, "id"), "rs_RID"));
    CHECK(json_array_size(json_object_get(rs, "summary")) == 0);
    const json_t *rp = json_array_get(json_object_get(rs, "content"), 0);
    CHECK(str_eq(json_object_get(rp, "type"), "reasoning_text") && str_eq(json_object_get(rp, "text"), "think"));
    CHECK(str_eq(json_object_get(msg, "type"), "message") && str_eq(json_object_get(msg, "id"), "msg_RID"));
    CHECK(str_eq(json_object_get(msg, "role"), "assistant") && str_eq(json_object_get(msg, "status"), "completed"));
    const json_t *mp = json_array_get(json_object_get(msg, "content"), 0);
    CHECK(str_eq(json_object_get(mp, "type"), "output_text") && str_eq(json_object_get(mp, "text"), "hello"));
    CHECK(json_is_array(json_object_get(mp, "annotations")));
    CHECK(str_eq(json_object_get(c0, "type"), "function_call") && str_eq(json_object_get(c0, "id"), "fc_RID_0"));
    CHECK(str_eq(json_object_get(c0, "call_id"), "call_A") && str_eq(json_object_get(c0, "name"), "get_weather"));
    CHECK(str_eq(json_object_get(c0, "arguments"), "{\"city\": \"Paris\"}") && !json_object_get(c0, "namespace"));
    CHECK(str_eq(json_object_get(c0, "status"), "completed"));
    CHECK(str_eq(json_object_get(c1, "namespace"), "ns") && str_eq(json_object_get(c1, "call_id"), "call_B"));
    CHECK(str_eq(json_object_get(c1, "status"), "incomplete")); /* only the last item is cut off */
    json_t *one = resp_output(&r, "RID", ids, false, "completed");
    CHECK(json_array_size(one) == 3);
    json_decref(one);
    dsf_dsml_result empty = {0};
    one = resp_output(&empty, "RID", ids, true, "completed");
    CHECK(json_array_size(one) == 0);
    json_decref(one);

    srv_meta m = {.id = "resp_RID", .model = "tiny", .created = 42};
    resp_request rq;
    json_t *b = parse("{\"input\": \"x\", \"max_output_tokens\": 9}");
    srv_error e;
    CHECK(resp_map_request(b, NULL, &rq, &e) == 0);
    json_decref(b);
    resp_usage u = {.input = 10, .cached = 4, .output = 9, .reasoning = 3};
    json_t *o = resp_object(&m, rq.echo, "incomplete", out, &u, "max_output_tokens", NULL);
    static const char *const required[] = {"id", "object", "created_at", "status", "error", "incomplete_details",
                                           "instructions", "metadata", "model", "output", "parallel_tool_calls",
                                           "temperature", "tool_choice", "tools", "top_p", "usage", "text", "store",
                                           "reasoning", "max_output_tokens", "previous_response_id", NULL};
    for (int i = 0; required[i]; i++) CHECKF(json_object_get(o, required[i]), "Response lacks '%s'", required[i]);
    CHECK(!json_object_get(o, "output_text"));
    CHECK(str_eq(json_object_get(o, "object"), "response") && str_eq(json_object_get(o, "id"), "resp_RID"));
    CHECK(json_integer_value(json_object_get(o, "created_at")) == 42 && str_eq(json_object_get(o, "model"), "tiny"));
    CHECK(str_eq(json_object_get(json_object_get(o, "incomplete_details"), "reason"), "max_output_tokens"));
    CHECK(json_is_null(json_object_get(o, "error")));
    const json_t *us = json_object_get(o, "usage");
    CHECK(json_integer_value(json_object_get(us, "input_tokens")) == 10);
    CHECK(json_integer_value(json_object_get(us, "output_tokens")) == 9);
    CHECK(json_integer_value(json_object_get(us, "total_tokens")) == 19);
    CHECK(json_integer_value(json_object_get(json_object_get(us, "input_tokens_details"), "cached_tokens")) == 4);
    CHECK(json_integer_value(json_object_get(json_object_get(us, "output_tokens_details"), "reasoning_tokens")) == 3);
    json_decref(o);
    o = resp_object(&m, rq.echo, "failed", NULL, NULL, NULL, "boom");
    CHECK(json_is_null(json_object_get(o, "usage")) && json_array_size(json_object_get(o, "output")) == 0);
    CHECK(str_eq(json_object_get(json_object_get(o, "error"), "code"), "server_error"));
    CHECK(str_eq(json_object_get(json_object_get(o, "error"), "message"), "boom"));
    json_decref(o);
    resp_request_free(&rq);
}

/* Guards the SSE framing of the Responses stream: "event: <type>" then one "data:" line of
 * JSON carrying the same type and the next sequence_number, then a blank line. */
TEST(responses_event_framing) {
    dsf_buf b = {0};
    int seq = 0;
    resp_event(&b, json_pack("{s:s,s:i}", "type", "response.output_text.delta", "output_index", 0), &seq);
    resp_event(&b, json_pack("{s:s}", "type", "response.completed"), &seq);
    CHECK(seq == 2);
    dsf_buf_append(&b, "", 1);
    const char *s = (const char *)b.data;
    const char *want1 = "event: response.output_text.delta\ndata: {";
    CHECKF(!strncmp(s, want1, strlen(want1)), "%s", s);
    const char *d1 = strstr(s, "data: "), *end1 = strstr(s, "\n\n");
    CHECK(d1 && end1 && !memchr(d1, '\n', (size_t)(end1 - d1)));
    json_t *ev = json_loadb(d1 + 6, (size_t)(end1 - d1 - 6), 0, NULL);
    CHECK(ev && json_integer_value(json_object_get(ev, "sequence_number")) == 0);
    CHECK(str_eq(json_object_get(ev, "type"), "response.output_text.delta"));
    json_decref(ev);
    const char *two = end1 + 2;
    CHECKF(!strncmp(two, "event: response.completed\ndata: ", 32), "%s", two);
    ev = json_loadb(two + 32, strlen(two + 32) - 2, 0, NULL);
    CHECK(ev && json_integer_value(json_object_get(ev, "sequence_number")) == 1);
    CHECK(!strcmp(two + strlen(two) - 2, "\n\n"));
    json_decref(ev);
    dsf_buf_free(&b);
}

/* ==== the stream =========================================================================== */

typedef struct {
    resp_stream *rs;
    dsf_buf *out;
} feed_ctx;

static void on_event(void *ud, const dsf_dsml_event *ev) {
    feed_ctx *f = ud;
    char id[32];
    snprintf(id, sizeof id, "call_%d", ev->index);
    resp_stream_dsml(f->rs, ev, ev->type == DSF_DSML_TOOL_START ? id : NULL, f->out);
}

/* Parses an SSE text of "event: T\ndata: J\n\n" blocks into a list of the J objects, checking
 * that each block's event name is its JSON's type. NULL when the framing is broken. */
static json_t *sse_events(const char *s, size_t n) {
    json_t *list = json_array();
    const char *p = s, *end = s + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || strncmp(p, "event: ", 7) || strncmp(nl + 1, "data: ", 6)) goto bad;
        const char *d = nl + 7, *de = memchr(d, '\n', (size_t)(end - d));
        if (!de || de + 1 >= end || de[1] != '\n') goto bad;
        json_t *ev = json_loadb(d, (size_t)(de - d), 0, NULL);
        const char *ty = json_string_value(json_object_get(ev, "type"));
        if (!ty || strlen(ty) != (size_t)(nl - p - 7) || strncmp(ty, p + 7, strlen(ty))) {
            json_decref(ev);
            goto bad;
        }
        json_array_append_new(list, ev);
        p = de + 2;
    }
    return list;
bad:
    json_decref(list);
    return NULL;
}

/* Checks a Responses event list the way the openai SDK's stream accumulator reads it:
 * sequence numbers 0, 1, ...; created and in_progress first, the final Response last; items
 * added in output_index order, each item event naming the open item; text events inside their
 * content part; deltas adding up to the .done text; the final output = the items done.
 * Returns NULL when fine, else what is wrong (static text). */
static const char *check_events(const json_t *evs) {
    size_t n = json_array_size(evs);
    if (n < 3) return "fewer than 3 events";
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_object_get(json_array_get(evs, i), "sequence_number")) != (json_int_t)i)
            return "sequence_number is not 0, 1, 2, ...";
    if (!str_eq(json_object_get(json_array_get(evs, 0), "type"), "response.created") ||
        !str_eq(json_object_get(json_array_get(evs, 1), "type"), "response.in_progress"))
        return "created / in_progress do not come first";
    json_t *items = json_array();
    const char *why = NULL;
    dsf_buf acc = {0};
    bool in_part = false;
    for (size_t i = 2; i + 1 < n && !why; i++) {
        const json_t *e = json_array_get(evs, i);
        const char *ty = json_string_value(json_object_get(e, "type"));
        json_int_t oi = json_integer_value(json_object_get(e, "output_index"));
        if (!strcmp(ty, "response.output_item.added")) {
            if (oi != (json_int_t)json_array_size(items)) why = "an item added out of order";
            json_array_append(items, json_object_get(e, "item"));
            acc.len = 0;
            continue;
        }
        const json_t *it = json_array_get(items, (size_t)oi);
        if (!it || oi != (json_int_t)json_array_size(items) - 1) { why = "an event for an item not open"; break; }
        const json_t *iid = json_object_get(e, "item_id");
        if (iid && !json_equal(iid, json_object_get(it, "id"))) { why = "item_id is not the open item's"; break; }
        const json_t *delta = json_object_get(e, "delta");
        const json_t *done = json_object_get(e, "text") ? json_object_get(e, "text") : json_object_get(e, "arguments");
        bool text_ev = strstr(ty, "output_text.") || strstr(ty, "reasoning_text.");
        if (text_ev && !in_part) { why = "a text event outside its content part"; break; }
        if (!strcmp(ty, "response.content_part.added")) in_part = true;
        else if (!strcmp(ty, "response.content_part.done")) in_part = false;
        else if (delta) dsf_buf_append(&acc, json_string_value(delta), json_string_length(delta));
        else if (done && (json_string_length(done) != acc.len || memcmp(json_string_value(done), acc.data ? (const char *)acc.data : "", acc.len)))
            why = "the .done text is not the sum of the deltas";
        else if (!strcmp(ty, "response.output_item.done")) json_array_set(items, (size_t)oi, json_object_get(e, "item"));
    }
    const json_t *fin = json_object_get(json_array_get(evs, n - 1), "response");
    if (!why && !json_equal(json_object_get(fin, "output"), items)) why = "the final output is not the items streamed";
    json_decref(items);
    dsf_buf_free(&acc);
    return why;
}

/* Guards the stream state machine against event sequences the SDK rejects and against a
 * stream that differs from the non-streaming reply: each official parse fixture (reasoning,
 * content, tool calls, namespaces) is fed to the DSML parser in small pieces, its events
 * become Responses events, and those must be well formed (check_events), carry the fixture's
 * expected reasoning, content and calls, and end with the items resp_output builds from the
 * parsed result. parallel_tool_calls false keeps the first call only. */
TEST(responses_stream_from_dsml_fixtures) {
    NEED_SHARED(path, "fixtures/chat/official_test_encoding_assertions.json");
    json_t *fx = test_load_json(path);
    CHECK(fx);
    json_t *cases = json_object_get(fx, "parse_cases");
    /* two calls (one namespaced) after reasoning and content, written from the DSML spec
     * (chat-format.md §3): the arguments are the official parser's json.dumps of the
     * parameters (string="false" values as JSON) */
#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
    json_array_append_new(cases, json_pack(
        "{s:s,s:s,s:s,s:{s:s,s:s,s:[{s:{s:s,s:s}},{s:{s:s,s:s}}]}}", "name", "local_two_calls", "thinking_mode",
        "thinking", "completion",
        "  plan  </think>Two lookups.\n\n<" D " calls>\n<" D " invoke name=\"weather\">\n<" D
        " parameter name=\"city\" string=\"true\">Paris</" D " parameter>\n<" D
        " parameter name=\"days\" string=\"false\">3</" D " parameter>\n</" D " invoke>\n<" D
        " invoke name=\"search::find\">\n<" D " parameter name=\"q\" string=\"true\">x y</" D " parameter>\n</" D
        " invoke>\n</" D " calls>",
        "expected_parsed", "content", "Two lookups.", "reasoning_content", "  plan  ", "tool_calls", "function", "name",
        "weather", "arguments", "{\"city\": \"Paris\", \"days\": 3}", "function", "name", "find", "arguments",
        "{\"q\": \"x y\"}"));
#undef D
    int ran = 0, with_calls = 0, with_two = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i), *ep = json_object_get(c, "expected_parsed");
        if (!ep) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        bool thinking = str_eq(json_object_get(c, "thinking_mode"), "thinking");
        dsf_buf text = {0};
        const json_t *comp = json_object_get(c, "completion");
        dsf_buf_append(&text, json_string_value(comp), json_string_length(comp));
        dsf_buf_appendf(&text, "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>");
        for (int parallel = 1; parallel >= 0; parallel--) {
            resp_stream rs;
            dsf_buf out = {0};
            resp_stream_init(&rs, "RID", parallel, thinking);
            srv_meta m = {.id = "resp_RID", .model = "m", .created = 1};
            json_t *echo = json_object();
            resp_stream_begin(&rs, resp_object(&m, echo, "in_progress", NULL, NULL, NULL, NULL), &out);
            feed_ctx f = {&rs, &out};
            dsf_dsml_parser *pp = dsf_dsml_parser_new(thinking, false);
            for (size_t at = 0, step = 1; at < text.len; at += step, step = step % 7 + 1)
                dsf_dsml_feed(pp, (const char *)text.data + at, at + step > text.len ? text.len - at : step, on_event, &f);
            dsf_dsml_result r;
            char err[DSF_ERR_LEN];
            CHECKF(dsf_dsml_finish(pp, on_event, &f, &r, err) == 0, "%s: %s", name, err);
            dsf_dsml_parser_free(pp);
            const json_t *items = resp_stream_close(&rs, "completed", &out);
            resp_usage u = {0};
            resp_stream_end(&rs, resp_object(&m, echo, "completed", json_incref((json_t *)items), &u, NULL, NULL), &out);
            json_t *evs = sse_events((const char *)out.data, out.len);
            CHECKF(evs, "%s: broken SSE framing", name);
            const char *why = check_events(evs);
            CHECKF(!why, "%s: %s", name, why);
            /* the fixture's expected output, item by item */
            const json_t *ecalls = json_object_get(ep, "tool_calls");
            size_t n_calls = parallel || json_array_size(ecalls) < 2 ? json_array_size(ecalls) : 1;
            const json_t *erc = json_object_get(ep, "reasoning_content"), *ec = json_object_get(ep, "content");
            size_t k = 0;
            if (json_string_length(erc)) {
                const json_t *it = json_array_get(items, k++);
                CHECKF(str_eq(json_object_get(it, "type"), "reasoning"), "%s: no reasoning item", name);
                CHECKF(json_equal(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"), erc), "%s: reasoning", name);
            }
            if (json_string_length(ec)) {
                const json_t *it = json_array_get(items, k++);
                CHECKF(str_eq(json_object_get(it, "type"), "message"), "%s: no message item", name);
                CHECKF(json_equal(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"), ec), "%s: content", name);
            }
            for (size_t q = 0; q < n_calls; q++) {
                const json_t *it = json_array_get(items, k++), *ef = json_object_get(json_array_get(ecalls, q), "function");
                CHECKF(str_eq(json_object_get(it, "type"), "function_call"), "%s: call %zu missing", name, q);
                CHECKF(json_equal(json_object_get(it, "name"), json_object_get(ef, "name")), "%s: call %zu name", name, q);
                CHECKF(json_equal(json_object_get(it, "arguments"), json_object_get(ef, "arguments")), "%s: call %zu args", name, q);
            }
            CHECKF(k == json_array_size(items), "%s: %zu items, expected %zu", name, json_array_size(items), k);
            /* stream == non-stream */
            char ids[8][32];
            for (int q = 0; q < 8; q++) snprintf(ids[q], sizeof ids[q], "call_%d", q);
            json_t *whole = resp_output(&r, "RID", ids, parallel, "completed");
            CHECKF(json_equal(whole, items), "%s: the stream's items differ from resp_output's", name);
            with_calls += n_calls > 0;
            with_two += n_calls == 2;
            json_decref(whole);
            json_decref(evs);
            json_decref(echo);
            dsf_dsml_result_free(&r);
            resp_stream_free(&rs);
            dsf_buf_free(&out);
        }
        dsf_buf_free(&text);
        ran++;
    }
    json_decref(fx);
    CHECKF(ran >= 4 && with_calls >= 4 && with_two == 1, "only %d parse cases (%d with calls, %d with two)", ran,
           with_calls, with_two);
}

/* Guards the reasoning-token count: tokens count while the output is inside the reasoning, up
 * to and including the one that completes "</think>" (even split across pieces) or starts a
 * tool call; a generation that starts outside the reasoning counts none. */
TEST(responses_reasoning_tokens) {
    resp_stream rs;
    resp_stream_init(&rs, "R", true, true);
    static const char *const pieces[] = {"a", "b", "</th", "ink>", "c", "d"};
    for (int i = 0; i < 6; i++) resp_stream_token(&rs, pieces[i], strlen(pieces[i]));
    CHECK(rs.reasoning_tokens == 4);
    resp_stream_free(&rs);
    resp_stream_init(&rs, "R", true, true);
    resp_stream_token(&rs, "x", 1);
    resp_stream_token(&rs, "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c", 13);
    resp_stream_token(&rs, " calls>", 7);
    CHECK(rs.reasoning_tokens == 2);
    resp_stream_free(&rs);
    resp_stream_init(&rs, "R", true, false);
    resp_stream_token(&rs, "a", 1);
    CHECK(rs.reasoning_tokens == 0);
    resp_stream_free(&rs);
}
