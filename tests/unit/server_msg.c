/* server_msg.c: the Anthropic Messages mapping of `dsflash serve` (src/server/server_msg.c,
 * server_msg_reply.c) without sockets, a model or a tokenizer: request -> chat body, the
 * rendered prompt against the chat-format fixtures, errors naming the field, and the reply /
 * stream event / error JSON shapes.
 *
 * Expected values come from ../shared/fixtures/chat (official encoder outputs) and from the
 * shapes @anthropic-ai/sdk 1.17.0 types (tests/npm/node_modules/@anthropic-ai/sdk/resources/
 * messages/messages.d.ts and core/error.js), and the mapping the issue and server_msg.h state. */
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server_msg.h"
#include "test.h"

#include "helpers.h"

static json_t *parse(const char *s) {
    char err[DSF_ERR_LEN];
    return pyjson_loads(s, strlen(s), err);
}

static bool str_is_json(const json_t *v, const char *s) {
    return pyjson_is_str(v) && !strcmp(json_string_value(v), s);
}

/* The chat body of a Messages body (text), or NULL with e. */
static json_t *to_chat(const char *body, bool count, srv_error *e) {
    json_t *b = parse(body);
    if (!b) return NULL;
    json_t *c = srv_msg_to_chat(b, count, e);
    json_decref(b);
    return c;
}

static bool json_eq_text(const json_t *v, const char *want) {
    json_t *w = parse(want);
    bool eq = w && json_equal((json_t *)v, w);
    json_decref(w);
    return eq;
}

/* ==== fixture cases expressed as Messages requests ======================================== */

/* A fixture's OpenAI tools as Anthropic tools, NULL when not expressible (namespaces, extra
 * keys, no parameters). */
static json_t *anthropic_tools(const json_t *tools) {
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
        const char *key;
        const json_t *v;
        int k = 0;
        bool ok = json_is_object(f) && json_object_size(t) == 2 && json_object_get(f, "parameters");
        json_t *at = json_object();
        json_object_foreach((json_t *)f, key, v) {
            /* the function keys in the order a Messages tool maps back to */
            static const char *const order[] = {"name", "description", "parameters"};
            while (k < 3 && strcmp(order[k], key)) k++;
            ok &= k < 3;
            if (k < 3) json_object_set(at, k == 2 ? "input_schema" : key, (json_t *)v);
        }
        json_array_append_new(out, at);
        if (!ok) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* An assistant message as Messages blocks: thinking, text, tool_use. NULL if not expressible. */
static json_t *assistant_blocks(const json_t *m) {
    json_t *blocks = json_array();
    const json_t *rc = json_object_get(m, "reasoning_content"), *c = json_object_get(m, "content");
    const json_t *calls = json_object_get(m, "tool_calls");
    bool ok = (!rc || pyjson_is_str(rc)) && (!c || json_is_null(c) || pyjson_is_str(c));
    if (ok && rc) json_array_append_new(blocks, json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", rc, "signature", ""));
    if (ok && pyjson_is_str(c) && json_string_length(c))
        json_array_append_new(blocks, json_pack("{s:s,s:O}", "type", "text", "text", c));
    for (size_t i = 0; ok && i < json_array_size(calls); i++) {
        const json_t *call = json_array_get(calls, i), *f = json_object_get(call, "function");
        const json_t *args = json_object_get(f, "arguments"), *id = json_object_get(call, "id");
        char err[DSF_ERR_LEN];
        json_t *in = pyjson_is_str(args) ? pyjson_loads(json_string_value(args), json_string_length(args), err) : NULL;
        ok = json_is_object(in) && pyjson_is_str(id) && !json_object_get(call, "namespace") &&
             !json_object_get(f, "namespace");
        if (ok)
            json_array_append_new(blocks, json_pack("{s:s,s:O,s:O,s:O}", "type", "tool_use", "id", id, "name",
                                                    json_object_get(f, "name"), "input", in));
        json_decref(in);
    }
    if (!ok) json_decref(blocks);
    return ok ? blocks : NULL;
}

/* Appends a turn, or its blocks to the previous turn of the same role (a Messages request
 * may hold consecutive user turns; the server merges them, as the encoder merges users). */
static void add_turn(json_t *msgs, const char *role, json_t *blocks) {
    json_t *last = json_array_size(msgs) ? json_array_get(msgs, json_array_size(msgs) - 1) : NULL;
    if (last && !strcmp(json_string_value(json_object_get(last, "role")), role) && strcmp(role, "system"))
        json_array_extend(json_object_get(last, "content"), blocks), json_decref(blocks);
    else
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", role, "content", blocks));
}

/* The Messages request standing for an encoder-level fixture case, or NULL when the case has
 * no Messages equivalent (tasks, wo_eos, content blocks, response_format, namespaces,
 * consecutive assistants (Anthropic merges them), a final assistant with tool calls, efforts
 * other than the three levels, encoder-only arguments). A final assistant is a prefill in
 * Messages: see prefill_prompt. */
static json_t *messages_request(const json_t *c) {
    const json_t *args = json_object_get(c, "args"), *in = json_object_get(c, "messages");
    if (json_object_get(args, "context") || json_object_get(args, "drop_thinking") ||
        json_object_get(args, "add_default_bos_token") || json_object_get(c, "expected_error"))
        return NULL;
    bool thinking = str_is_json(json_object_get(args, "thinking_mode"), "thinking");
    const json_t *eff = json_object_get(args, "reasoning_effort");
    long long budget = 8192; /* "high", the encoder's default (75) */
    if (eff && !json_is_null(eff)) {
        const char *s = pyjson_is_str(eff) ? json_string_value(eff) : "";
        long long n = json_is_integer(eff) ? json_integer_value(eff) : 0;
        if (!strcmp(s, "low") || n == 50) budget = 1024;
        else if (!strcmp(s, "max") || n == 100) budget = 20000;
        else if (strcmp(s, "high") && n != 75) return NULL;
    }
    json_t *r = json_pack("{s:s,s:i}", "model", "m", "max_tokens", 30000), *msgs = json_array();
    if (thinking) json_object_set_new(r, "thinking", json_pack("{s:s,s:I}", "type", "enabled", "budget_tokens", budget));
    json_object_set_new(r, "messages", msgs);
    bool ok = json_array_size(in) > 0;
    for (size_t i = 0; ok && i < json_array_size(in); i++) {
        const json_t *m = json_array_get(in, i), *content = json_object_get(m, "content");
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *tools = json_object_get(m, "tools");
        static const char *const other[] = {"task", "wo_eos", "content_blocks", "response_format", NULL};
        for (int k = 0; other[k]; k++) ok &= !json_object_get(m, other[k]);
        ok &= role && (!tools || (i == 0 && !strcmp(role, "system")));
        if (!ok) break;
        if (tools) {
            json_t *at = anthropic_tools(tools);
            ok = at != NULL;
            json_object_set_new(r, "tools", at ? at : json_null());
        }
        if (!strcmp(role, "system")) {
            ok &= pyjson_is_str(content);
            if (!ok) break;
            if (i == 0) json_object_set(r, "system", (json_t *)content);
            else add_turn(msgs, "system", json_incref((json_t *)content));
        } else if (!strcmp(role, "user")) {
            ok = pyjson_is_str(content);
            if (ok) add_turn(msgs, "user", json_pack("[{s:s,s:O}]", "type", "text", "text", content));
        } else if (!strcmp(role, "tool")) {
            const json_t *id = json_object_get(m, "tool_call_id");
            ok = pyjson_is_str(id) && pyjson_is_str(content);
            if (ok)
                add_turn(msgs, "user", json_pack("[{s:s,s:O,s:O}]", "type", "tool_result", "tool_use_id", id, "content", content));
        } else if (!strcmp(role, "assistant")) {
            const json_t *prev = i ? json_array_get(in, i - 1) : NULL;
            json_t *blocks = assistant_blocks(m);
            bool last = i + 1 == json_array_size(in);
            ok = blocks && !(last && json_array_size(json_object_get(m, "tool_calls"))) &&
                 !(prev && !strcmp(json_string_value(json_object_get(prev, "role")), "assistant"));
            if (ok) add_turn(msgs, "assistant", blocks);
            else json_decref(blocks);
        } else {
            ok = false;
        }
    }
    ok &= json_array_size(msgs) > 0; /* Messages requires one turn besides the system */
    if (!ok) json_decref(r);
    return ok ? r : NULL;
}

/* The fixture's prompt as a prefill renders it (continue_final_message, chat.c): the final
 * assistant turn without its EOS, and when that turn is reasoning only (thinking mode) without
 * its "</think>" either, so that the reply continues the reasoning. */
static void prefill_prompt(const json_t *c, const json_t *req, dsf_buf *out) {
    static const char eos[] = "<｜end▁of▁sentence｜>", think[] = "</think>";
    const json_t *exp = json_object_get(json_object_get(c, "expected"), "prompt");
    const json_t *msgs = json_object_get(c, "messages"), *last = json_array_get(msgs, json_array_size(msgs) - 1);
    size_t n = json_string_length(exp);
    dsf_buf_append(out, json_string_value(exp), n);
    if (!str_is_json(json_object_get(last, "role"), "assistant")) return;
    if (out->len >= sizeof eos - 1 && !memcmp(out->data + out->len - (sizeof eos - 1), eos, sizeof eos - 1))
        out->len -= sizeof eos - 1;
    const json_t *rc = json_object_get(last, "reasoning_content"), *ct = json_object_get(last, "content");
    bool reasoning_only = json_object_get(req, "thinking") && pyjson_truthy(rc) && !pyjson_truthy(ct);
    if (reasoning_only && out->len >= sizeof think - 1 &&
        !memcmp(out->data + out->len - (sizeof think - 1), think, sizeof think - 1))
        out->len -= sizeof think - 1;
}

/* Guards against a Messages mapping that renders a conversation differently from the
 * official encoder: every fixture case a Messages request can express must render the
 * fixture's expected prompt byte for byte through srv_msg_to_chat + srv_chat_render (system,
 * tools, tool_use / tool_result, thinking blocks, merged user turns, the effort levels). */
TEST(server_msg_render_matches_chat_fixtures) {
    char missing[256];
    json_t *cases = test_chat_cases(missing, sizeof missing);
    if (!cases) SKIP("needs ../shared/%s (absent)", missing);
    int n = 0, n_tools = 0, n_thinking = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *exp = json_object_get(json_object_get(c, "expected"), "prompt");
        json_t *req = exp ? messages_request(c) : NULL;
        if (!req) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        srv_error e;
        json_t *chat = srv_msg_to_chat(req, false, &e);
        CHECKF(chat, "%s: %s", name, e.message);
        dsf_chat_prompt p;
        int rc = srv_chat_render(chat, &p, &e);
        CHECKF(rc == 0, "%s: %s", name, e.message);
        dsf_buf want = {0};
        prefill_prompt(c, req, &want);
        bool same = p.prompt_len == want.len && !memcmp(p.prompt, want.data, want.len);
        CHECKF(same, "%s: the Messages request renders a different prompt:\n%.*s\n---- expected ----\n%.*s", name,
               (int)p.prompt_len, p.prompt, (int)want.len, (const char *)want.data);
        dsf_buf_free(&want);
        n++;
        n_tools += json_object_get(req, "tools") != NULL;
        n_thinking += json_object_get(req, "thinking") != NULL;
        dsf_chat_prompt_free(&p);
        json_decref(chat);
        json_decref(req);
    }
    json_decref(cases);
    /* most fixtures are expressible: a converter that silently skips them all must fail */
    CHECKF(n >= 20 && n_tools >= 4 && n_thinking >= 10, "only %d fixture cases compared (%d with tools, %d thinking)", n,
           n_tools, n_thinking);
}

/* ==== request -> chat body ================================================================ */

/* Guards against a Messages field that is dropped or lands on the wrong chat key: each field
 * of the issue's list against the chat body it must produce (the keys server_api.c and the
 * constrained decoder read: tool_choice "required" / named, parallel_tool_calls,
 * response_format, reasoning_effort, thinking). */
TEST(server_msg_request_mapping) {
    static const struct {
        const char *body, *want;
    } cases[] = {
        /* sampling, stop_sequences, stream, system string; metadata is accepted and not sent on */
        {"{\"model\": \"m\", \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 5, \"stream\": true, "
         "\"stop_sequences\": [\"a\", \"b\"], \"metadata\": {\"user_id\": \"u\"}, \"system\": \"S\", "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", "
         "\"text\": \"q\"}]}], \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 5, \"stream\": true, "
         "\"stop\": [\"a\", \"b\"], \"thinking\": false}"},
        /* system as text blocks; consecutive user turns merged; an empty system adds nothing */
        {"{\"model\": \"m\", \"max_tokens\": 1, \"system\": [{\"type\": \"text\", \"text\": \"A\", \"cache_control\": "
         "{\"type\": \"ephemeral\"}}, {\"type\": \"text\", \"text\": \"B\"}], \"messages\": [{\"role\": \"user\", "
         "\"content\": \"x\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"y\"}]}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"A\"}, {\"type\": \"text\", "
         "\"text\": \"B\"}]}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}, {\"type\": "
         "\"text\", \"text\": \"y\"}]}], \"max_tokens\": 1, \"thinking\": false}"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"system\": \"\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}], \"max_tokens\": 1, "
         "\"thinking\": false}"},
        /* tools, tool_use -> tool_calls (input as the arguments object), thinking ->
         * reasoning_content, redacted_thinking dropped, tool_result (text blocks, is_error) ->
         * tool messages in order with the user's text */
        {"{\"model\": \"m\", \"max_tokens\": 9, \"tools\": [{\"name\": \"f\", \"description\": \"d\", \"input_schema\": "
         "{\"type\": \"object\"}}, {\"type\": \"custom\", \"name\": \"g\", \"input_schema\": {}}], \"messages\": "
         "[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", "
         "\"thinking\": \"r\", \"signature\": \"s\"}, {\"type\": \"redacted_thinking\", \"data\": \"zz\"}, {\"type\": "
         "\"text\", \"text\": \"t\"}, {\"type\": \"tool_use\", \"id\": \"toolu_1\", \"name\": \"f\", \"input\": {\"x\": 1.50}}, "
         "{\"type\": \"tool_use\", \"id\": \"toolu_2\", \"name\": \"g\", \"input\": {}}]}, {\"role\": \"user\", \"content\": "
         "[{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_1\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}, "
         "{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_2\", \"is_error\": true, \"content\": [{\"type\": \"text\", "
         "\"text\": \"b\"}, {\"type\": \"text\", \"text\": \"c\"}]}, {\"type\": \"text\", \"text\": \"more\"}]}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}, {\"role\": "
         "\"assistant\", \"content\": \"t\", \"reasoning_content\": \"r\", \"tool_calls\": [{\"id\": \"toolu_1\", \"type\": "
         "\"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}, {\"id\": \"toolu_2\", \"type\": "
         "\"function\", \"function\": {\"name\": \"g\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"tool_call_id\": "
         "\"toolu_1\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}, {\"role\": \"tool\", \"tool_call_id\": "
         "\"toolu_2\", \"content\": \"Error: b\\n\\nc\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
         "\"more\"}]}], \"max_tokens\": 9, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
         "\"description\": \"d\", \"parameters\": {\"type\": \"object\"}}}, {\"type\": \"function\", \"function\": "
         "{\"name\": \"g\", \"parameters\": {}}}], \"thinking\": false}"},
        /* tool_choice any + disable_parallel_tool_use; tool {name}; none; auto */
        {"{\"model\": \"m\", \"max_tokens\": 1, \"tool_choice\": {\"type\": \"any\", \"disable_parallel_tool_use\": true}, "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 1, "
         "\"tool_choice\": \"required\", \"parallel_tool_calls\": false, \"thinking\": false}"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"tool_choice\": {\"type\": \"tool\", \"name\": \"f\"}, \"messages\": "
         "[{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 1, "
         "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}, \"thinking\": false}"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"tool_choice\": {\"type\": \"none\"}, \"messages\": [{\"role\": \"user\", "
         "\"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 1, "
         "\"tool_choice\": \"none\", \"thinking\": false}"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"tool_choice\": {\"type\": \"auto\", \"disable_parallel_tool_use\": false}, "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 1, "
         "\"tool_choice\": \"auto\", \"thinking\": false}"},
        /* thinking budgets -> the three effort levels (server_msg.h); adaptive; disabled */
        {"{\"model\": \"m\", \"max_tokens\": 5000, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}, "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 5000, "
         "\"thinking\": true, \"reasoning_effort\": \"low\"}"},
        {"{\"model\": \"m\", \"max_tokens\": 5000, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 4096}, "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 5000, "
         "\"thinking\": true, \"reasoning_effort\": \"high\"}"},
        {"{\"model\": \"m\", \"max_tokens\": 40000, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 31999}, "
         "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 40000, "
         "\"thinking\": true, \"reasoning_effort\": \"max\"}"},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"thinking\": {\"type\": \"adaptive\"}, \"output_config\": {\"effort\": "
         "\"xhigh\", \"format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"object\"}}}, \"messages\": [{\"role\": "
         "\"user\", \"content\": \"q\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}], \"max_tokens\": 5, "
         "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"output\", \"schema\": {\"type\": "
         "\"object\"}}}, \"thinking\": true, \"reasoning_effort\": \"xhigh\"}"},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"thinking\": {\"type\": \"disabled\"}, \"messages\": [{\"role\": \"user\", "
         "\"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"The answer is\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}, {\"role\": "
         "\"assistant\", \"content\": \"The answer is\"}], \"max_tokens\": 5, \"thinking\": false, "
         "\"continue_final_message\": true}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_error e;
        json_t *c = to_chat(cases[i].body, false, &e);
        CHECKF(c, "case %zu: %s", i, e.message);
        char *got = json_dumps(c, JSON_COMPACT);
        CHECKF(json_eq_text(c, cases[i].want), "case %zu: chat body\n%s\nwant\n%s", i, got, cases[i].want);
        free(got);
        json_decref(c);
    }
    /* count_tokens bodies need no max_tokens, and do not carry generation keys */
    srv_error e;
    json_t *c = to_chat("{\"model\": \"m\", \"stream\": true, \"stop_sequences\": [\"x\"], \"thinking\": {\"type\": "
                        "\"enabled\", \"budget_tokens\": 2048}, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
                        true, &e);
    CHECKF(c, "%s", e.message);
    CHECK(!json_object_get(c, "max_tokens") && !json_object_get(c, "stream") && !json_object_get(c, "stop"));
    CHECK(json_is_true(json_object_get(c, "thinking")));
    json_decref(c);
    CHECK(!strcmp(srv_msg_effort(1024), "low") && !strcmp(srv_msg_effort(4095), "low"));
    CHECK(!strcmp(srv_msg_effort(4096), "high") && !strcmp(srv_msg_effort(16383), "high"));
    CHECK(!strcmp(srv_msg_effort(16384), "max"));
}

/* Guards against a bad request that crashes, is accepted, or answers without naming the
 * field: each 400 must say which field and what was expected (Anthropic's "a.0.b: ..." style),
 * including the blocks this text-only model cannot read and Anthropic's own limits
 * (max_tokens required, budget_tokens >= 1024 and < max_tokens, custom tools only). */
TEST(server_msg_errors_name_the_field) {
#define MSG(...) "{\"model\": \"m\", \"max_tokens\": 2000, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]" __VA_ARGS__ "}"
    static const struct {
        const char *body, *param, *says;
    } cases[] = {
        {"[1]", "body", "JSON object"},
        {"{\"max_tokens\": 1, \"messages\": []}", "model", "required"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "max_tokens", "required"},
        {"{\"model\": \"m\", \"max_tokens\": 0, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "max_tokens", "between"},
        {"{\"model\": \"m\", \"max_tokens\": 1.5, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "max_tokens", "integer"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": []}", "messages", "at least one"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": {}}", "messages", "list"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"tool\", \"content\": \"q\"}]}", "messages.0.role", "user"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages.0.content", "string"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
         "\"content\": [{\"type\": \"image\", \"source\": {}}]}]}", "messages.1.content.0.source.type", "base64"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", "
         "\"source\": {\"type\": \"base64\", \"data\": \"AA==\"}}]}]}", "messages.0.content.0.source.media_type", "string"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
         "\"assistant\", \"content\": [{\"type\": \"image\", \"source\": {}}]}]}", "messages.1.content.0", "user turns"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
         "\"text\": \"a\"}, {\"type\": \"document\", \"source\": {}}]}]}", "messages.0.content.1", "document"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
         "\"tool_use_id\": \"x\", \"content\": [{\"type\": \"image\"}]}]}]}", "messages.0.content.0.content.0", "image"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\"}]}]}",
         "messages.0.content.0.tool_use_id", "string"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"text\": \"a\"}]}]}",
         "messages.0.content.0", "type"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": "
         "\"tool_use\", \"id\": \"t\", \"name\": \"f\", \"input\": \"{}\"}]}, {\"role\": \"user\", \"content\": \"q\"}]}",
         "messages.0.content.0.input", "object"},
        {"{\"model\": \"m\", \"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
         "\"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"f\", \"input\": {}}]}]}",
         "messages.1", "tool_use"},
        {MSG(", \"system\": [{\"type\": \"image\"}]"), "system.0", "image"},
        {MSG(", \"tools\": [{\"type\": \"web_search_20250305\", \"name\": \"web_search\"}]"), "tools.0", "web_search_20250305"},
        {MSG(", \"tools\": [{\"name\": \"f\"}]"), "tools.0", "input_schema"},
        {MSG(", \"tool_choice\": {\"type\": \"some\"}"), "tool_choice.type", "auto"},
        {MSG(", \"tool_choice\": {\"type\": \"tool\"}"), "tool_choice.name", "string"},
        {MSG(", \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1023}"), "thinking.budget_tokens", "1024"},
        {MSG(", \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 2000}"), "thinking.budget_tokens", "max_tokens"},
        {MSG(", \"thinking\": {\"type\": \"on\"}"), "thinking.type", "enabled"},
        {MSG(", \"output_config\": {\"effort\": \"huge\"}"), "output_config.effort", "low"},
        {MSG(", \"temperature\": 1.5"), "temperature", "between 0 and 1"},
        {MSG(", \"top_k\": -1"), "top_k", "between"},
        {MSG(", \"stop_sequences\": \"x\""), "stop_sequences", "list"},
        {MSG(", \"stream\": 1"), "stream", "boolean"},
        {MSG(", \"metadata\": {\"user_id\": 3}"), "metadata", "user_id"},
    };
#undef MSG
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_error e;
        memset(&e, 0, sizeof e);
        json_t *c = to_chat(cases[i].body, false, &e);
        CHECKF(!c, "case %zu was accepted: %s", i, cases[i].body);
        CHECKF(e.status == 400 && !strcmp(e.param, cases[i].param) && strstr(e.message, cases[i].says) &&
                   !strncmp(e.message, cases[i].param, strlen(cases[i].param)),
               "case %zu: status %d param '%s' message '%s' (want %s: ...%s...)", i, e.status, e.param, e.message,
               cases[i].param, cases[i].says);
    }
}

/* ==== replies, events, errors ============================================================= */

/* Guards against replies the SDK types differently (messages.d.ts Message, ContentBlock,
 * Usage, StopReason): block order thinking, text, tool_use; tool ids "toolu_"; input objects
 * (text that is not a JSON object kept as {"arguments": text}); stop reasons; Anthropic's usage arithmetic
 * (input_tokens + cache_read_input_tokens = the prompt); one call when parallel is off. */
TEST(server_msg_reply_shapes) {
    dsf_tool_call calls[2] = {{.name = "f", .arguments = "{\"city\": \"Paris\", \"n\": 2}"}, {.name = "g", .arguments = "[1"}};
    dsf_dsml_result r = {.reasoning = "hmm", .reasoning_len = 3, .content = "Hi", .content_len = 2, .calls = calls, .n_calls = 2};
    char ids[2][32] = {"call_ABCDEFGHIJKLMNOPQRSTUVWX", "call_abcdefghijklmnopqrstuvwx"};
    srv_meta m = {.id = "msg_0123456789abcdefghijklmn", .model = "tiny"};
    srv_usage u = {.prompt_tokens = 10, .completion_tokens = 4, .cached_tokens = 7};
    json_t *o = srv_msg_reply(&m, &r, ids, "tool_use", NULL, &u, true);
    char sig[24];
    srv_msg_sig_text(srv_msg_sig_update(SRV_MSG_SIG0, "hmm", 3), sig);
    char want[2048];
    snprintf(want, sizeof want,
             "{\"id\": \"msg_0123456789abcdefghijklmn\", \"type\": \"message\", \"role\": \"assistant\", \"model\": "
             "\"tiny\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"hmm\", \"signature\": \"%s\"}, {\"type\": "
             "\"text\", \"text\": \"Hi\", \"citations\": null}, {\"type\": \"tool_use\", \"id\": "
             "\"toolu_ABCDEFGHIJKLMNOPQRSTUVWX\", \"name\": \"f\", \"input\": {\"city\": \"Paris\", \"n\": 2}, \"caller\": "
             "{\"type\": \"direct\"}}, {\"type\": \"tool_use\", \"id\": \"toolu_abcdefghijklmnopqrstuvwx\", \"name\": \"g\", "
             "\"input\": {\"arguments\": \"[1\"}, \"caller\": {\"type\": \"direct\"}}], \"stop_reason\": \"tool_use\", "
             "\"stop_sequence\": null, \"stop_details\": null, \"container\": null, \"diagnostics\": null, \"usage\": "
             "{\"input_tokens\": 3, \"output_tokens\": 4, \"cache_read_input_tokens\": 7, \"cache_creation_input_tokens\": 0, "
             "\"output_tokens_details\": null, \"server_tool_use\": null, \"cache_creation\": null, \"inference_geo\": null, "
             "\"service_tier\": \"standard\", \"speed\": null}}",
             sig);
    char *got = json_dumps(o, JSON_COMPACT);
    CHECKF(json_eq_text(o, want), "reply\n%s", got);
    free(got);
    json_decref(o);
    CHECK(!strncmp(sig, "dsf1:", 5) && strlen(sig) == 21);

    /* parallel off: the first call only; no reasoning / content: no such blocks */
    dsf_dsml_result r2 = {.calls = calls, .n_calls = 2};
    o = srv_msg_reply(&m, &r2, ids, "stop_sequence", "END", &u, false);
    const json_t *content = json_object_get(o, "content");
    CHECK(json_array_size(content) == 1 && !strcmp(json_string_value(json_object_get(json_array_get(content, 0), "name")), "f"));
    CHECK(!strcmp(json_string_value(json_object_get(o, "stop_sequence")), "END"));
    json_decref(o);

    dsf_gen_result res = {.finish = DSF_FINISH_STOP, .stop_index = -1, .n_completion = 3};
    CHECK(!strcmp(srv_msg_stop_reason(&res, 0, 8), "end_turn"));
    CHECK(!strcmp(srv_msg_stop_reason(&res, 1, 8), "tool_use"));
    res.finish = DSF_FINISH_TOOL_CALLS;
    CHECK(!strcmp(srv_msg_stop_reason(&res, 1, 8), "tool_use"));
    res.finish = DSF_FINISH_STOP, res.stop_index = 0;
    CHECK(!strcmp(srv_msg_stop_reason(&res, 0, 8), "stop_sequence"));
    res.finish = DSF_FINISH_LENGTH, res.n_completion = 8;
    CHECK(!strcmp(srv_msg_stop_reason(&res, 1, 8), "max_tokens"));
    res.n_completion = 5; /* the context filled up before max_tokens */
    CHECK(!strcmp(srv_msg_stop_reason(&res, 0, 8), "model_context_window_exceeded"));
}

/* Guards against stream events the SDK's MessageStream rejects or accumulates wrongly
 * (RawMessageStreamEvent shapes; SSE frames whose "event:" names data.type, which the SDK's
 * Stream needs: it skips frames without an event name), and errors of the wrong class:
 * core/error.js maps 400/401/404/413/429/529 to its classes, the body is
 * {"type": "error", "error": {"type", "message"}}. */
TEST(server_msg_events_and_errors) {
    srv_meta m = {.id = "msg_x", .model = "tiny"};
    srv_usage u = {.prompt_tokens = 5, .completion_tokens = 0, .cached_tokens = 2};
    dsf_buf b = {0};
    srv_msg_sse(&b, srv_msg_ev_block_delta(1, "input_json_delta", "{\"a\": ", 6));
    const char *want = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":"
                       "{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\": \"}}\n\n";
    CHECKF(b.len == strlen(want) && !memcmp(b.data, want, b.len), "%.*s", (int)b.len, (const char *)b.data);
    dsf_buf_free(&b);

    json_t *ev = srv_msg_ev_message_start(&m, &u);
    const json_t *msg = json_object_get(ev, "message");
    CHECK(json_array_size(json_object_get(msg, "content")) == 0 && json_is_null(json_object_get(msg, "stop_reason")));
    CHECK(json_integer_value(json_object_get(json_object_get(msg, "usage"), "input_tokens")) == 3);
    json_decref(ev);
    ev = srv_msg_ev_block_start(0, "thinking", NULL, NULL);
    CHECK(json_eq_text(ev, "{\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": "
                           "\"thinking\", \"thinking\": \"\", \"signature\": \"\"}}"));
    json_decref(ev);
    ev = srv_msg_ev_block_start(2, "tool_use", "toolu_1", "f");
    CHECK(json_eq_text(ev, "{\"type\": \"content_block_start\", \"index\": 2, \"content_block\": {\"type\": "
                           "\"tool_use\", \"id\": \"toolu_1\", \"name\": \"f\", \"input\": {}, \"caller\": {\"type\": \"direct\"}}}"));
    json_decref(ev);
    static const char *const deltas[][2] = {{"text_delta", "text"}, {"thinking_delta", "thinking"},
                                            {"signature_delta", "signature"}, {"input_json_delta", "partial_json"}};
    for (int i = 0; i < 4; i++) {
        ev = srv_msg_ev_block_delta(0, deltas[i][0], "x", 1);
        const json_t *d = json_object_get(ev, "delta");
        CHECKF(json_object_size(d) == 2 && !strcmp(json_string_value(json_object_get(d, deltas[i][1])), "x"), "%s",
               deltas[i][0]);
        json_decref(ev);
    }
    u.completion_tokens = 4;
    ev = srv_msg_ev_message_delta("stop_sequence", "##", &u);
    CHECK(json_eq_text(ev, "{\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"stop_sequence\", "
                           "\"stop_sequence\": \"##\", \"stop_details\": null, \"container\": null}, \"usage\": "
                           "{\"input_tokens\": 3, \"output_tokens\": 4, \"cache_read_input_tokens\": 2, "
                           "\"cache_creation_input_tokens\": 0, \"output_tokens_details\": null, \"server_tool_use\": null}}"));
    json_decref(ev);

    static const struct {
        int status;
        const char *type;
    } types[] = {{400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
                 {404, "not_found_error"}, {405, "invalid_request_error"}, {413, "request_too_large"},
                 {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"}, {529, "overloaded_error"}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        srv_error e;
        srv_fail(&e, types[i].status, "x", "c", "bad \xff thing %d", 1);
        char *s = srv_msg_error_json(&e);
        json_error_t je;
        json_t *v = json_loads(s, 0, &je);
        CHECKF(v, "%s", s);
        const json_t *err = json_object_get(v, "error");
        CHECKF(json_object_size(v) == 2 && str_is_json(json_object_get(v, "type"), "error") &&
                   str_is_json(json_object_get(err, "type"), types[i].type) && json_object_size(err) == 2 &&
                   !strncmp(json_string_value(json_object_get(err, "message")), "bad ", 4),
               "status %d: %s", types[i].status, s);
        json_decref(v);
        free(s);
    }
}
