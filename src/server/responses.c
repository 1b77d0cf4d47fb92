/* responses.c: the OpenAI Responses API's JSON (responses.h): a request body -> the chat
 * request, the conversation items kept for previous_response_id, and the Response object,
 * its output items, usage and stream events. The wire shapes follow the openai SDK's types
 * (resources/responses/responses.d.ts: Response, ResponseOutputMessage,
 * ResponseReasoningItem, ResponseFunctionToolCall, ResponseUsage, the stream events), and
 * the stream state machine that turns the generation's DSML events into those events.
 * Must not: touch sockets, threads, the engine or the store; render prompts (the chat path
 * does). Bodies are hostile input: every field is type-checked before use.
 * Invariants: item ids derive from the response id (rs_<rid>, msg_<rid>, fc_<rid>_<i>), so a
 * stream, its final Response and the non-streaming reply name the same items; a stream has
 * at most one item open, and only the last item can end "incomplete". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/responses.h"

/* ==== field checks ======================================================================== */

static bool is_null(const json_t *v) { return !v || json_is_null(v); }
static bool is_str(const json_t *v) { return pyjson_is_str(v); }
static bool str_is(const json_t *v, const char *s) { return is_str(v) && !strcmp(json_string_value(v), s); }

/* Checks body[key] against a JSON type ('s' string, 'b' boolean, 'o' object, 'a' array,
 * 'n' number, 'i' integer); null and absent pass. */
static int check_type(const json_t *body, const char *key, char type, srv_error *e) {
    const json_t *v = json_object_get(body, key);
    if (is_null(v)) return 0;
    bool ok = type == 's' ? is_str(v) : type == 'b' ? json_is_boolean(v) : type == 'o' ? json_is_object(v)
            : type == 'a' ? json_is_array(v) : type == 'n' ? json_is_number(v) : json_is_integer(v);
    if (ok) return 0;
    const char *what = type == 's' ? "a string" : type == 'b' ? "a boolean" : type == 'o' ? "an object"
                     : type == 'a' ? "a list" : type == 'n' ? "a number" : "an integer";
    return srv_fail(e, 400, key, "invalid_type", "'%s' must be %s", key, what);
}

/* ==== input items -> chat messages ======================================================== */

/* The text of a message's content: a string, or parts of type input_text / output_text
 * (joined into one string when there is one part, else kept as chat text parts) and
 * input_image (a chat image_url part; the server decodes its data: URL). */
static json_t *content_text(const json_t *c, const char *param, srv_error *e) {
    if (is_null(c)) return json_string("");
    if (is_str(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        srv_fail(e, 400, param, "invalid_type", "'%s' must be a string or a list of content parts", param);
        return NULL;
    }
    json_t *parts = json_array();
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *p = json_array_get(c, k);
        const json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!is_str(t)) {
            srv_fail(e, 400, param, "invalid_type", "'%s[%zu]' must be an object with a string 'type'", param, k);
            goto fail;
        }
        if (str_is(t, "input_image")) { /* {image_url: "data:..."} -> a chat image_url part */
            const json_t *u = json_object_get(p, "image_url");
            if (!is_str(u)) {
                srv_fail(e, 400, param, "invalid_type", "'%s[%zu].image_url' must be a string (a data: URL)", param, k);
                goto fail;
            }
            json_array_append_new(parts, json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url", u));
            continue;
        }
        if (!str_is(t, "input_text") && !str_is(t, "output_text")) {
            srv_fail(e, 400, param, "unsupported_content",
                     "'%s[%zu]': content of type '%s' is not supported (only input_text, output_text and input_image)",
                     param, k, json_string_value(t));
            goto fail;
        }
        const json_t *tx = json_object_get(p, "text");
        if (!is_str(tx)) {
            srv_fail(e, 400, param, "invalid_type", "'%s[%zu].text' must be a string", param, k);
            goto fail;
        }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
    }
    bool one_text = json_array_size(parts) == 1 && str_is(json_object_get(json_array_get(parts, 0), "type"), "text");
    if (json_array_size(parts) == 0 || one_text) {
        json_t *one = json_array_size(parts) ? json_incref(json_object_get(json_array_get(parts, 0), "text"))
                                             : json_string("");
        json_decref(parts);
        return one;
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* A joined text of the parts' "text" fields (reasoning content or summary parts). */
static json_t *parts_text(const json_t *parts) {
    dsf_buf b = {0};
    for (size_t k = 0; json_is_array(parts) && k < json_array_size(parts); k++) {
        const json_t *t = json_object_get(json_array_get(parts, k), "text");
        if (is_str(t)) dsf_buf_append(&b, json_string_value(t), json_string_length(t));
    }
    json_t *s = json_stringn(b.data ? (const char *)b.data : "", b.len);
    dsf_buf_free(&b);
    return s ? s : json_string("");
}

typedef struct {
    json_t *msgs; /* borrowed: the chat messages */
    json_t *asst; /* the assistant turn being gathered (owned) or NULL */
} conv_builder;

static void flush(conv_builder *cb) {
    if (!cb->asst) return;
    json_array_append_new(cb->msgs, cb->asst);
    cb->asst = NULL;
}

static json_t *assistant(conv_builder *cb) {
    if (!cb->asst) cb->asst = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    return cb->asst;
}

static int item_message(conv_builder *cb, const json_t *it, const char *param, srv_error *e) {
    char p[96];
    const json_t *role = json_object_get(it, "role");
    snprintf(p, sizeof p, "%s.role", param);
    if (!is_str(role)) return srv_fail(e, 400, p, "invalid_type", "'%s' must be a string", p);
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
        return srv_fail(e, 400, p, "invalid_value",
                        "'%s' must be \"user\", \"assistant\", \"system\" or \"developer\", got \"%s\"", p, r);
    snprintf(p, sizeof p, "%s.content", param);
    json_t *c = content_text(json_object_get(it, "content"), p, e);
    if (!c) return -1;
    if (!strcmp(r, "assistant")) {
        /* a message after the reasoning item of the same turn joins it; after text or calls
         * it starts a new turn */
        if (cb->asst && (json_object_get(cb->asst, "tool_calls") || !str_is(json_object_get(cb->asst, "content"), "")))
            flush(cb);
        json_object_set_new(assistant(cb), "content", c);
        return 0;
    }
    flush(cb);
    json_array_append_new(cb->msgs, json_pack("{s:s,s:o}", "role", r, "content", c));
    return 0;
}

static int item_call(conv_builder *cb, const json_t *it, const char *param, srv_error *e) {
    static const char *const keys[] = {"call_id", "name", "arguments"};
    for (int k = 0; k < 3; k++)
        if (!is_str(json_object_get(it, keys[k])))
            return srv_fail(e, 400, param, "invalid_type", "'%s.%s' must be a string", param, keys[k]);
    json_t *a = assistant(cb);
    json_t *calls = json_object_get(a, "tool_calls");
    if (!calls) json_object_set_new(a, "tool_calls", calls = json_array());
    const json_t *ns = json_object_get(it, "namespace");
    if (!is_null(ns) && !is_str(ns)) return srv_fail(e, 400, param, "invalid_type", "'%s.namespace' must be a string", param);
    json_t *call = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(it, "call_id"), "type", "function",
                             "function", "name", json_object_get(it, "name"), "arguments", json_object_get(it, "arguments"));
    /* "ns::name" calls (spec chat-format.md: namespaced tools) keep their namespace */
    if (is_str(ns)) json_object_set(call, "namespace", (json_t *)ns);
    json_array_append_new(calls, call);
    return 0;
}

static int item_call_output(conv_builder *cb, const json_t *it, const char *param, srv_error *e) {
    char p[96];
    if (!is_str(json_object_get(it, "call_id")))
        return srv_fail(e, 400, param, "invalid_type", "'%s.call_id' must be a string", param);
    snprintf(p, sizeof p, "%s.output", param);
    const json_t *o = json_object_get(it, "output");
    if (is_null(o)) return srv_fail(e, 400, p, "invalid_type", "'%s' must be a string or a list of content parts", p);
    json_t *c = content_text(o, p, e);
    if (!c) return -1;
    flush(cb);
    json_array_append_new(cb->msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                              json_object_get(it, "call_id"), "content", c));
    return 0;
}

/* A reasoning item opens an assistant turn whose reasoning_content is its text (content
 * parts, else the summary's). */
static int item_reasoning(conv_builder *cb, const json_t *it, const char *param, srv_error *e) {
    const json_t *c = json_object_get(it, "content"), *s = json_object_get(it, "summary");
    if ((!is_null(c) && !json_is_array(c)) || (!is_null(s) && !json_is_array(s)))
        return srv_fail(e, 400, param, "invalid_type", "'%s.content' and '%s.summary' must be lists", param, param);
    flush(cb);
    json_t *text = parts_text(json_array_size(c) ? c : s);
    json_object_set_new(assistant(cb), "reasoning_content", text);
    return 0;
}

int resp_items_to_messages(const json_t *items, const char *param, json_t *messages, srv_error *e) {
    conv_builder cb = {messages, NULL};
    char p[80];
    for (size_t i = 0; i < json_array_size(items); i++) {
        const json_t *it = json_array_get(items, i);
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        if (!json_is_object(it)) {
            flush(&cb);
            return srv_fail(e, 400, p, "invalid_type", "'%s' must be an object", p);
        }
        const json_t *t = json_object_get(it, "type");
        int rc;
        if (is_null(t) || str_is(t, "message")) rc = item_message(&cb, it, p, e);
        else if (str_is(t, "function_call")) rc = item_call(&cb, it, p, e);
        else if (str_is(t, "function_call_output")) rc = item_call_output(&cb, it, p, e);
        else if (str_is(t, "reasoning")) rc = item_reasoning(&cb, it, p, e);
        else if (is_str(t))
            rc = srv_fail(e, 400, p, "unsupported_item",
                          "'%s': items of type '%s' are not supported (message, function_call, "
                          "function_call_output and reasoning are)", p, json_string_value(t));
        else rc = srv_fail(e, 400, p, "invalid_type", "'%s.type' must be a string", p);
        if (rc) {
            flush(&cb);
            return -1;
        }
    }
    flush(&cb);
    return 0;
}

/* ==== the request ========================================================================= */

/* tools: function tools only -> the chat's {"type": "function", "function": {...}}; the
 * echo's FunctionTool list (strict defaults to true, as OpenAI's). */
static int map_tools(const json_t *tools, json_t *chat, json_t *echo, srv_error *e) {
    json_t *ct = json_array(), *et = json_array();
    json_object_set_new(chat, "tools", ct);
    json_object_set_new(echo, "tools", et);
    for (size_t i = 0; json_is_array(tools) && i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *ty = json_is_object(t) ? json_object_get(t, "type") : NULL;
        if (!is_str(ty)) return srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu]' must be an object with a string 'type'", i);
        if (!str_is(ty, "function"))
            return srv_fail(e, 400, "tools", "unsupported_tool",
                            "'tools[%zu]': tools of type '%s' are not supported (only function tools)", i,
                            json_string_value(ty));
        const json_t *nm = json_object_get(t, "name"), *d = json_object_get(t, "description"),
                     *pa = json_object_get(t, "parameters"), *st = json_object_get(t, "strict");
        if (!is_str(nm)) return srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu].name' must be a string", i);
        if (!is_null(d) && !is_str(d))
            return srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu].description' must be a string", i);
        if (!is_null(pa) && !json_is_object(pa))
            return srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu].parameters' must be an object", i);
        if (!is_null(st) && !json_is_boolean(st))
            return srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu].strict' must be a boolean", i);
        json_t *f = json_pack("{s:O}", "name", nm);
        if (!is_null(d)) json_object_set(f, "description", (json_t *)d);
        if (!is_null(pa)) json_object_set(f, "parameters", (json_t *)pa);
        json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", f));
        json_array_append_new(et, json_pack("{s:s,s:O,s:O,s:O,s:b}", "type", "function", "name", nm, "description",
                                            d ? d : json_null(), "parameters", pa ? pa : json_null(), "strict",
                                            is_null(st) || json_is_true(st)));
    }
    return 0;
}

/* tool_choice: "auto" / "none" / "required" as they are; {"type": "function", "name"} ->
 * the chat's {"type": "function", "function": {"name"}}. */
static int map_tool_choice(const json_t *tc, json_t *chat, json_t *echo, srv_error *e) {
    if (is_null(tc)) {
        json_object_set_new(echo, "tool_choice", json_string("auto"));
        return 0;
    }
    if (is_str(tc)) {
        if (!str_is(tc, "auto") && !str_is(tc, "none") && !str_is(tc, "required"))
            return srv_fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                            "\"name\": ...}, got \"%s\"", json_string_value(tc));
        json_object_set(chat, "tool_choice", (json_t *)tc);
    } else if (json_is_object(tc)) {
        const json_t *ty = json_object_get(tc, "type"), *nm = json_object_get(tc, "name");
        if (!str_is(ty, "function"))
            return srv_fail(e, 400, "tool_choice", "unsupported_tool_choice",
                            "'tool_choice' of type '%s' is not supported (only \"function\")",
                            is_str(ty) ? json_string_value(ty) : "?");
        if (!is_str(nm)) return srv_fail(e, 400, "tool_choice", "invalid_type", "'tool_choice.name' must be a string");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm));
    } else {
        return srv_fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be a string or an object");
    }
    json_object_set(echo, "tool_choice", (json_t *)tc);
    return 0;
}

/* text.format -> response_format: text, json_object, or json_schema {name, schema, strict,
 * description}. */
static int map_text(const json_t *text, json_t *chat, json_t *echo, srv_error *e) {
    const json_t *f = json_is_object(text) ? json_object_get(text, "format") : NULL;
    if (!is_null(text) && !json_is_object(text)) return srv_fail(e, 400, "text", "invalid_type", "'text' must be an object");
    if (is_null(f)) {
        json_object_set_new(echo, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
        return 0;
    }
    const json_t *ty = json_is_object(f) ? json_object_get(f, "type") : NULL;
    if (str_is(ty, "text") || str_is(ty, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:O}", "type", ty));
    } else if (str_is(ty, "json_schema")) {
        const json_t *nm = json_object_get(f, "name"), *sc = json_object_get(f, "schema"),
                     *st = json_object_get(f, "strict"), *d = json_object_get(f, "description");
        if (!is_str(nm)) return srv_fail(e, 400, "text.format.name", "invalid_type", "'text.format.name' must be a string");
        if (!json_is_object(sc))
            return srv_fail(e, 400, "text.format.schema", "invalid_type", "'text.format.schema' must be an object");
        if (!is_null(st) && !json_is_boolean(st))
            return srv_fail(e, 400, "text.format.strict", "invalid_type", "'text.format.strict' must be a boolean");
        if (!is_null(d) && !is_str(d))
            return srv_fail(e, 400, "text.format.description", "invalid_type", "'text.format.description' must be a string");
        json_t *js = json_pack("{s:O,s:O}", "name", nm, "schema", sc);
        if (!is_null(st)) json_object_set(js, "strict", (json_t *)st);
        if (!is_null(d)) json_object_set(js, "description", (json_t *)d);
        json_object_set_new(chat, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
    } else {
        return srv_fail(e, 400, "text.format", "invalid_value",
                        "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    json_object_set_new(echo, "text", json_pack("{s:O}", "format", f));
    return 0;
}

/* The sampling, length and switch fields: types checked here, ranges by the chat parse. */
static int map_scalars(const json_t *b, json_t *chat, json_t *echo, resp_request *out, srv_error *e) {
    static const struct { const char *key; char type; } fields[] = {
        {"model", 's'}, {"instructions", 's'}, {"parallel_tool_calls", 'b'}, {"reasoning", 'o'},
        {"max_output_tokens", 'i'}, {"temperature", 'n'}, {"top_p", 'n'}, {"stream", 'b'}, {"store", 'b'},
        {"metadata", 'o'}, {"user", 's'}, {"previous_response_id", 's'}, {"tools", 'a'}, {"include", 'a'},
        {"seed", 'i'}, {"top_k", 'i'}, {"truncation", 's'}, {"service_tier", 's'}, {"prompt_cache_key", 's'},
        {"safety_identifier", 's'}, {"max_tool_calls", 'i'}, {"top_logprobs", 'i'}, {"background", 'b'}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (check_type(b, fields[i].key, fields[i].type, e)) return -1;
    if (json_is_true(json_object_get(b, "background")))
        return srv_fail(e, 400, "background", "unsupported", "'background' responses are not supported");
    static const char *const unsupported[] = {"conversation", "prompt", NULL};
    for (int i = 0; unsupported[i]; i++)
        if (!is_null(json_object_get(b, unsupported[i])))
            return srv_fail(e, 400, unsupported[i], "unsupported",
                            "'%s' is not supported (use previous_response_id to continue a conversation)", unsupported[i]);
    /* the chat keys of the same meaning */
    static const char *const same[][2] = {{"parallel_tool_calls", "parallel_tool_calls"}, {"max_output_tokens", "max_tokens"},
                                          {"temperature", "temperature"}, {"top_p", "top_p"}, {"stream", "stream"},
                                          {"seed", "seed"}, {"top_k", "top_k"}};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        const json_t *v = json_object_get(b, same[i][0]);
        if (!is_null(v)) json_object_set(chat, same[i][1], (json_t *)v);
    }
    const json_t *mo = json_object_get(b, "max_output_tokens");
    if (json_is_integer(mo) && json_integer_value(mo) < 1)
        return srv_fail(e, 400, "max_output_tokens", "invalid_value", "'max_output_tokens' must be at least 1");
    const json_t *rs = json_object_get(b, "reasoning");
    const json_t *eff = json_is_object(rs) ? json_object_get(rs, "effort") : NULL;
    if (!is_null(eff) && !is_str(eff)) return srv_fail(e, 400, "reasoning.effort", "invalid_type", "'reasoning.effort' must be a string");
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", NULL};
    bool known = is_null(eff);
    for (int i = 0; !known && efforts[i]; i++) known = str_is(eff, efforts[i]);
    if (!known)
        return srv_fail(e, 400, "reasoning.effort", "invalid_value",
                        "'reasoning.effort' must be none, minimal, low, medium, high, xhigh or max, got \"%.40s\"",
                        json_string_value(eff));
    if (!is_null(eff)) json_object_set(chat, "reasoning_effort", (json_t *)eff);
    const json_t *md = json_object_get(b, "metadata");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)md, k, v) if (!is_str(v))
        return srv_fail(e, 400, "metadata", "invalid_type", "'metadata.%s' must be a string", k);

    out->store = !json_is_false(json_object_get(b, "store"));
    const json_t *pt = json_object_get(b, "parallel_tool_calls");
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(is_null(pt) || json_is_true(pt)));
    json_object_set_new(echo, "reasoning", json_pack("{s:O,s:n}", "effort", eff ? eff : json_null(), "summary"));
    json_object_set_new(echo, "store", json_boolean(out->store));
    json_object_set_new(echo, "metadata", md && json_is_object(md) ? json_incref((json_t *)md) : json_object());
    static const char *const copied[] = {"instructions", "max_output_tokens", "previous_response_id", "temperature",
                                         "top_p", NULL};
    for (int i = 0; copied[i]; i++) {
        const json_t *c = json_object_get(b, copied[i]);
        json_object_set_new(echo, copied[i], c ? json_incref((json_t *)c) : json_null());
    }
    const json_t *user = json_object_get(b, "user");
    if (is_str(user)) json_object_set(echo, "user", (json_t *)user);
    json_object_set_new(echo, "truncation", json_string("disabled"));
    json_object_set_new(echo, "background", json_false());
    json_object_set_new(echo, "max_tool_calls", json_null());
    return 0;
}

void resp_request_free(resp_request *r) {
    if (!r) return;
    json_decref(r->chat);
    json_decref(r->echo);
    json_decref(r->conv);
    memset(r, 0, sizeof *r);
}

int resp_map_request(const json_t *b, const json_t *history, resp_request *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(b)) return srv_fail(e, 400, NULL, "invalid_type", "request body must be a JSON object");
    out->chat = json_object();
    out->echo = json_object();
    out->conv = json_array();
    if (map_scalars(b, out->chat, out->echo, out, e)) goto fail;
    const json_t *tools = json_object_get(b, "tools");
    if (!is_null(tools) && map_tools(tools, out->chat, out->echo, e)) goto fail;
    if (is_null(tools)) json_object_set_new(out->echo, "tools", json_array());
    if (map_tool_choice(json_object_get(b, "tool_choice"), out->chat, out->echo, e)) goto fail;
    if (map_text(json_object_get(b, "text"), out->chat, out->echo, e)) goto fail;

    /* the conversation: history, then this input ("input": a string is one user message) */
    if (json_is_array(history)) json_array_extend(out->conv, (json_t *)history);
    const json_t *in = json_object_get(b, "input");
    if (is_str(in)) {
        json_array_append_new(out->conv, json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user", "content", in));
    } else if (json_is_array(in)) {
        json_t *copy = json_deep_copy(in);
        json_array_extend(out->conv, copy);
        json_decref(copy);
    } else if (!is_null(in)) {
        srv_fail(e, 400, "input", "invalid_type", "'input' must be a string or a list of input items");
        goto fail;
    }
    if (!json_array_size(out->conv)) { /* nothing to answer: no history and no input items */
        srv_fail(e, 400, "input", "missing_required_parameter",
                 is_null(in) ? "'input' is required" : "'input' must not be empty");
        goto fail;
    }
    json_t *msgs = json_array();
    json_object_set_new(out->chat, "messages", msgs);
    const json_t *ins = json_object_get(b, "instructions");
    if (is_str(ins)) json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    /* history items were checked when they were stored; errors name this request's input */
    size_t n_hist = json_is_array(history) ? json_array_size(history) : 0;
    if (n_hist && resp_items_to_messages(history, "previous_response", msgs, e)) goto fail;
    json_t *now = json_array();
    for (size_t i = n_hist; i < json_array_size(out->conv); i++) json_array_append(now, json_array_get(out->conv, i));
    int rc = resp_items_to_messages(now, "input", msgs, e);
    json_decref(now);
    if (rc) goto fail;
    return 0;
fail:
    resp_request_free(out);
    return -1;
}

/* ==== output ============================================================================== */

static json_t *str_lossy(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    if (v) return v;
    /* not valid UTF-8 (the generation stops inside a character): keep the valid prefix */
    while (n > 0 && !(v = json_stringn(s, --n))) {}
    return v ? v : json_string("");
}

void resp_item_id(char out[64], const char *kind, const char *rid, int index) {
    if (index >= 0) snprintf(out, 64, "%s_%s_%d", kind, rid, index);
    else snprintf(out, 64, "%s_%s", kind, rid);
}

json_t *resp_item_reasoning(const char *id, const char *text, size_t len, const char *status) {
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o}],s:s}", "id", id, "type", "reasoning", "summary", "content", "type",
                     "reasoning_text", "text", str_lossy(text, len), "status", status);
}

json_t *resp_item_message(const char *id, const char *text, size_t len, const char *status) {
    return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o,s:[]}]}", "id", id, "type", "message", "role", "assistant",
                     "status", status, "content", "type", "output_text", "text", str_lossy(text, len), "annotations");
}

json_t *resp_item_call(const char *id, const char *call_id, const char *name, const char *ns, const char *args,
                       size_t args_len, const char *status) {
    json_t *o = json_pack("{s:s,s:s,s:s,s:o,s:o,s:s}", "id", id, "type", "function_call", "call_id", call_id, "name",
                          str_lossy(name, strlen(name)), "arguments", str_lossy(args, args_len), "status", status);
    if (ns) json_object_set_new(o, "namespace", str_lossy(ns, strlen(ns)));
    return o;
}

json_t *resp_output(const dsf_dsml_result *r, const char *rid, char ids[][32], bool parallel, const char *last_status) {
    json_t *out = json_array();
    char id[64];
    int n = r->n_calls > 1 && !parallel ? 1 : r->n_calls;
    /* the items before the last one ended: only the last can be cut off */
    const char *st_rs = r->content_len || n ? "completed" : last_status;
    if (r->reasoning_len) {
        resp_item_id(id, "rs", rid, -1);
        json_array_append_new(out, resp_item_reasoning(id, r->reasoning, r->reasoning_len, st_rs));
    }
    if (r->content_len) {
        resp_item_id(id, "msg", rid, -1);
        json_array_append_new(out, resp_item_message(id, r->content, r->content_len, n ? "completed" : last_status));
    }
    for (int i = 0; i < n; i++) {
        const dsf_tool_call *c = &r->calls[i];
        resp_item_id(id, "fc", rid, i);
        json_array_append_new(out, resp_item_call(id, ids[i], c->name, c->ns, c->arguments, strlen(c->arguments),
                                                  i == n - 1 ? last_status : "completed"));
    }
    return out;
}

json_t *resp_usage_json(const resp_usage *u) {
    return json_pack("{s:i,s:{s:i,s:i},s:i,s:{s:i},s:i}", "input_tokens", u->input, "input_tokens_details",
                     "cached_tokens", u->cached, "cache_write_tokens", 0, "output_tokens", u->output,
                     "output_tokens_details", "reasoning_tokens", u->reasoning, "total_tokens", u->input + u->output);
}

json_t *resp_object(const srv_meta *m, const json_t *echo, const char *status, json_t *output, const resp_usage *u,
                    const char *incomplete, const char *error) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", m->id, "object", "response", "created_at",
                          (json_int_t)m->created, "status", status, "model", m->model ? m->model : "dsflash");
    json_object_update(o, (json_t *)echo);
    json_object_set_new(o, "output", output ? output : json_array());
    json_object_set_new(o, "usage", u ? resp_usage_json(u) : json_null());
    json_object_set_new(o, "incomplete_details", incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
    json_object_set_new(o, "error", error ? json_pack("{s:s,s:o}", "code", "server_error", "message",
                                                      str_lossy(error, strlen(error)))
                                          : json_null());
    json_object_set_new(o, "access_programs", json_null());
    return o;
}

void resp_event(dsf_buf *b, json_t *ev, int *seq) {
    json_object_set_new(ev, "sequence_number", json_integer((*seq)++));
    const char *type = json_string_value(json_object_get(ev, "type"));
    dsf_buf_appendf(b, "event: %s\n", type ? type : "message");
    srv_sse_json(b, ev);
    json_decref(ev);
}

/* ==== the stream ========================================================================== */

enum { OPEN_NONE = 0, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL };

void resp_stream_init(resp_stream *rs, const char *rid, bool parallel, bool reasoning) {
    memset(rs, 0, sizeof *rs);
    snprintf(rs->rid, sizeof rs->rid, "%s", rid);
    rs->parallel = parallel;
    rs->in_reasoning = reasoning;
    rs->items = json_array();
}

void resp_stream_free(resp_stream *rs) {
    json_decref(rs->items);
    dsf_buf_free(&rs->text);
    free(rs->open_name);
    free(rs->open_ns);
    memset(rs, 0, sizeof *rs);
}

static void emit(resp_stream *rs, dsf_buf *out, json_t *ev) { resp_event(out, ev, &rs->seq); }

/* An event of the open item {type, item_id, output_index} (+ content_index when >= 0). */
static json_t *item_event(resp_stream *rs, const char *type, int content_index) {
    json_t *ev = json_pack("{s:s,s:s,s:i}", "type", type, "item_id", rs->open_id, "output_index",
                           (int)json_array_size(rs->items));
    if (content_index >= 0) json_object_set_new(ev, "content_index", json_integer(content_index));
    return ev;
}

static void open_item(resp_stream *rs, int kind, const dsf_dsml_event *ev, const char *call_id, dsf_buf *out) {
    json_t *item, *part = NULL;
    rs->open = kind;
    rs->text.len = 0;
    if (kind == OPEN_REASONING) {
        resp_item_id(rs->open_id, "rs", rs->rid, -1);
        item = json_pack("{s:s,s:s,s:[],s:[],s:s}", "id", rs->open_id, "type", "reasoning", "summary", "content",
                         "status", "in_progress");
        part = json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "");
    } else if (kind == OPEN_MESSAGE) {
        resp_item_id(rs->open_id, "msg", rs->rid, -1);
        item = json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", rs->open_id, "type", "message", "role", "assistant", "status",
                         "in_progress", "content");
        part = json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", "", "annotations");
    } else {
        rs->open_call = ev->index;
        resp_item_id(rs->open_id, "fc", rs->rid, ev->index);
        snprintf(rs->open_call_id, sizeof rs->open_call_id, "%s", call_id ? call_id : "");
        free(rs->open_name);
        free(rs->open_ns);
        rs->open_name = dsf_xstrdup(ev->name ? ev->name : "");
        rs->open_ns = ev->ns ? dsf_xstrdup(ev->ns) : NULL;
        item = resp_item_call(rs->open_id, rs->open_call_id, rs->open_name, rs->open_ns, "", 0, "in_progress");
    }
    emit(rs, out, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index",
                            (int)json_array_size(rs->items), "item", item));
    if (part) {
        json_t *pe = item_event(rs, "response.content_part.added", 0);
        json_object_set_new(pe, "part", part);
        emit(rs, out, pe);
    }
}

const json_t *resp_stream_close(resp_stream *rs, const char *status, dsf_buf *out) {
    if (rs->open == OPEN_NONE) return rs->items;
    const char *t = rs->text.data ? (const char *)rs->text.data : "";
    size_t n = rs->text.len;
    json_t *item, *ev;
    if (rs->open == OPEN_REASONING || rs->open == OPEN_MESSAGE) {
        bool reasoning = rs->open == OPEN_REASONING;
        item = reasoning ? resp_item_reasoning(rs->open_id, t, n, status) : resp_item_message(rs->open_id, t, n, status);
        json_t *part = json_array_get(json_object_get(item, "content"), 0);
        ev = item_event(rs, reasoning ? "response.reasoning_text.done" : "response.output_text.done", 0);
        json_object_set(ev, "text", json_object_get(part, "text"));
        if (!reasoning) json_object_set_new(ev, "logprobs", json_array());
        emit(rs, out, ev);
        ev = item_event(rs, "response.content_part.done", 0);
        json_object_set(ev, "part", part);
        emit(rs, out, ev);
    } else {
        item = resp_item_call(rs->open_id, rs->open_call_id, rs->open_name, rs->open_ns, t, n, status);
        ev = item_event(rs, "response.function_call_arguments.done", -1);
        json_object_set(ev, "arguments", json_object_get(item, "arguments"));
        emit(rs, out, ev);
    }
    emit(rs, out, json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index",
                            (int)json_array_size(rs->items), "item", item));
    json_array_append_new(rs->items, item);
    rs->open = OPEN_NONE;
    return rs->items;
}

/* A text delta of the open reasoning / message item, or of the open call's arguments. */
static void delta(resp_stream *rs, const dsf_dsml_event *ev, dsf_buf *out) {
    static const char *const type[] = {NULL, "response.reasoning_text.delta", "response.output_text.delta",
                                       "response.function_call_arguments.delta"};
    json_t *d = json_stringn(ev->text, ev->len); /* the parser's deltas are valid UTF-8 */
    if (!d) return;
    dsf_buf_append(&rs->text, ev->text, ev->len);
    json_t *e = item_event(rs, type[rs->open], rs->open == OPEN_CALL ? -1 : 0);
    json_object_set_new(e, "delta", d);
    if (rs->open == OPEN_MESSAGE) json_object_set_new(e, "logprobs", json_array());
    emit(rs, out, e);
}

void resp_stream_dsml(resp_stream *rs, const dsf_dsml_event *ev, const char *call_id, dsf_buf *out) {
    switch (ev->type) {
    case DSF_DSML_REASONING:
    case DSF_DSML_CONTENT: {
        if (!ev->len) return;
        int kind = ev->type == DSF_DSML_REASONING ? OPEN_REASONING : OPEN_MESSAGE;
        if (rs->open != kind) {
            resp_stream_close(rs, "completed", out);
            open_item(rs, kind, ev, NULL, out);
        }
        delta(rs, ev, out);
        return;
    }
    case DSF_DSML_TOOL_START:
        if (!rs->parallel && ev->index > 0) return;
        resp_stream_close(rs, "completed", out);
        open_item(rs, OPEN_CALL, ev, call_id, out);
        return;
    case DSF_DSML_TOOL_ARGS:
        if (rs->open == OPEN_CALL && rs->open_call == ev->index && ev->len) delta(rs, ev, out);
        return;
    default: /* DSF_DSML_TOOL_END */
        if (rs->open == OPEN_CALL && rs->open_call == ev->index) resp_stream_close(rs, "completed", out);
        return;
    }
}

void resp_stream_begin(resp_stream *rs, json_t *r, dsf_buf *out) {
    emit(rs, out, json_pack("{s:s,s:O}", "type", "response.created", "response", r));
    emit(rs, out, json_pack("{s:s,s:o}", "type", "response.in_progress", "response", r));
}

void resp_stream_end(resp_stream *rs, json_t *r, dsf_buf *out) {
    char type[48];
    snprintf(type, sizeof type, "response.%s", json_string_value(json_object_get(r, "status")));
    emit(rs, out, json_pack("{s:s,s:o}", "type", type, "response", r));
}

void resp_stream_token(resp_stream *rs, const char *piece, size_t len) {
    if (!rs->in_reasoning) return;
    rs->reasoning_tokens++;
    for (size_t i = 0; i < len; i++) {
        if (rs->tail_len == sizeof rs->tail) {
            memmove(rs->tail, rs->tail + 1, sizeof rs->tail - 1);
            rs->tail_len--;
        }
        rs->tail[rs->tail_len++] = piece[i];
    }
    /* the parser leaves the reasoning at "</think>" or at a tool call's start (dsml.c) */
    static const char *const ends[] = {"</think>", "<\xef\xbd\x9c" "DSML\xef\xbd\x9c"};
    for (int k = 0; k < 2; k++)
        if (memmem(rs->tail, rs->tail_len, ends[k], strlen(ends[k]))) rs->in_reasoning = false;
}
