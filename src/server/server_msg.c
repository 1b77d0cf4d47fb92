/* server_msg.c: an Anthropic Messages request (POST /v1/messages, /v1/messages/count_tokens)
 * mapped onto the one internal request: the chat-completions body that server_api.c validates,
 * renders through the V4.1 encoder and tokenizes. So tool calls, tool results and reasoning
 * take the same DSML / encoder path as chat completions, and the constraint keys of the chat
 * request (tool_choice "required" / named, parallel_tool_calls, response_format) apply here.
 *
 * Owns: validation of the Messages fields with 400s naming the field in Anthropic's style
 * ("messages.1.content.0: ..."), the block -> message mapping, the thinking budget -> effort
 * mapping (server_msg.h), count_tokens. Must not: touch sockets, threads or the engine; build
 * reply JSON (server_msg_reply.c). Bodies are hostile input: every field is type-checked
 * before use; unknown fields are ignored, as SDKs send optional extras (cache_control...). */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server_msg.h"

#define MAX_STOP 16 /* server_api.c's limit on stop strings */

static int bad(srv_error *e, const char *param, const char *fmt, ...) DSF_PRINTF(3, 4);

/* A 400 naming param: "<param>: <message>". */
static int bad(srv_error *e, const char *param, const char *fmt, ...) {
    char msg[DSF_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return srv_fail(e, 400, param, "invalid_request_error", "%s: %s", param, msg);
}

static bool is_null(const json_t *v) { return !v || json_is_null(v); }
static bool str_is(const json_t *v, const char *s) { return pyjson_is_str(v) && !strcmp(json_string_value(v), s); }
static const char *type_of(const json_t *block) {
    const json_t *t = json_object_get(block, "type");
    return pyjson_is_str(t) ? json_string_value(t) : NULL;
}

const char *srv_msg_effort(long long budget_tokens) {
    return budget_tokens < 4096 ? "low" : budget_tokens < 16384 ? "high" : "max";
}

/* ==== content blocks ====================================================================== */

/* A block type the model cannot read: a 400 that names it. */
static int unsupported(const char *type, const char *param, srv_error *e) {
    if (!strcmp(type, "image")) return bad(e, param, "image blocks are read in user turns only");
    if (!strcmp(type, "document")) return bad(e, param, "document blocks are not supported: send text or images");
    return bad(e, param, "content blocks of type '%s' are not supported here", type);
}

/* Copies a text block {type: "text", text} (other keys dropped). NULL with e. */
static json_t *text_part(const json_t *b, const char *param, srv_error *e) {
    const json_t *t = json_object_get(b, "text");
    if (!pyjson_is_str(t)) return bad(e, param, "'text' must be a string"), NULL;
    return json_pack("{s:s,s:O}", "type", "text", "text", t);
}

/* An image block {type: image, source: {type: base64, media_type, data} | {type: url, url}} ->
 * the chat part {type: image_url, image_url: {url}} with a data: URL (server_image.c decodes
 * it, and refuses remote URLs). NULL with e. */
static json_t *image_part(const json_t *b, const char *param, srv_error *e) {
    const json_t *src = json_object_get(b, "source");
    char p[200];
    snprintf(p, sizeof p, "%s.source", param);
    if (!json_is_object(src)) return bad(e, p, "must be an object"), NULL;
    const json_t *t = json_object_get(src, "type");
    snprintf(p, sizeof p, "%s.source.type", param);
    if (str_is(t, "url")) {
        const json_t *u = json_object_get(src, "url");
        snprintf(p, sizeof p, "%s.source.url", param);
        if (!pyjson_is_str(u)) return bad(e, p, "must be a string"), NULL;
        return json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url", u);
    }
    if (!str_is(t, "base64")) return bad(e, p, "must be \"base64\" or \"url\""), NULL;
    const json_t *mt = json_object_get(src, "media_type"), *d = json_object_get(src, "data");
    snprintf(p, sizeof p, "%s.source.%s", param, !pyjson_is_str(mt) ? "media_type" : "data");
    if (!pyjson_is_str(mt) || !pyjson_is_str(d)) return bad(e, p, "must be a string"), NULL;
    dsf_buf url = {0};
    dsf_buf_appendf(&url, "data:%s;base64,", json_string_value(mt));
    dsf_buf_append(&url, json_string_value(d), json_string_length(d));
    json_t *us = json_stringn((const char *)url.data, url.len);
    dsf_buf_free(&url);
    if (!us) return bad(e, p, "must be valid UTF-8"), NULL;
    return json_pack("{s:s,s:{s:o}}", "type", "image_url", "image_url", "url", us);
}

/* A string, or a list of text blocks -> a string or a list of {type: text, text} parts. */
static json_t *text_content(const json_t *c, const char *param, srv_error *e) {
    if (pyjson_is_str(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) return bad(e, param, "must be a string or a list of text blocks"), NULL;
    json_t *parts = json_array();
    char p[160];
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *b = json_array_get(c, i);
        snprintf(p, sizeof p, "%s.%zu", param, i);
        const char *ty = json_is_object(b) ? type_of(b) : NULL;
        json_t *part = NULL;
        if (!ty) bad(e, p, "must be an object with a string 'type'");
        else if (strcmp(ty, "text")) unsupported(ty, p, e);
        else part = text_part(b, p, e);
        if (!part) {
            json_decref(parts);
            return NULL;
        }
        json_array_append_new(parts, part);
    }
    return parts;
}

/* The text of a string or a list of text parts, joined with "\n\n" (as the encoder joins
 * content blocks, spec chat-format.md §2.1), after prefix. */
static json_t *joined_text(const json_t *c, const char *prefix) {
    dsf_buf b = {0};
    dsf_buf_append(&b, prefix, strlen(prefix));
    if (pyjson_is_str(c)) dsf_buf_append(&b, json_string_value(c), json_string_length(c));
    for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++) {
        const json_t *t = json_object_get(json_array_get(c, i), "text");
        if (i) dsf_buf_append(&b, "\n\n", 2);
        dsf_buf_append(&b, json_string_value(t), json_string_length(t));
    }
    json_t *s = json_stringn(b.data ? (const char *)b.data : "", b.len);
    dsf_buf_free(&b);
    return s ? s : json_string("");
}

/* tool_result -> {role: tool, tool_call_id, content}; is_error prefixes "Error: ". */
static json_t *tool_message(const json_t *b, const char *param, srv_error *e) {
    char p[160];
    const json_t *id = json_object_get(b, "tool_use_id");
    snprintf(p, sizeof p, "%s.tool_use_id", param);
    if (!pyjson_is_str(id)) return bad(e, p, "must be a string"), NULL;
    const json_t *ie = json_object_get(b, "is_error");
    snprintf(p, sizeof p, "%s.is_error", param);
    if (!is_null(ie) && !json_is_boolean(ie)) return bad(e, p, "must be a boolean"), NULL;
    const json_t *c = json_object_get(b, "content");
    snprintf(p, sizeof p, "%s.content", param);
    json_t *content = is_null(c) ? json_string("") : text_content(c, p, e);
    if (!content) return NULL;
    if (json_is_true(ie)) {
        json_t *s = joined_text(content, "Error: ");
        json_decref(content);
        content = s;
    }
    return json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", content);
}

/* tool_use -> an OpenAI tool call {id, type: function, function: {name, arguments: input}}. */
static json_t *tool_call(const json_t *b, const char *param, srv_error *e) {
    const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
    char p[160];
    snprintf(p, sizeof p, "%s.%s", param, !pyjson_is_str(id) ? "id" : !pyjson_is_str(name) ? "name" : "input");
    if (!pyjson_is_str(id) || !pyjson_is_str(name)) return bad(e, p, "must be a string"), NULL;
    if (!json_is_object(in)) return bad(e, p, "must be an object"), NULL;
    return json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", name, "arguments", in);
}

/* ==== messages ============================================================================ */

/* A message's content as a list of blocks (a string is one text block). NULL with e. */
static json_t *blocks_of(const json_t *m, const char *param, srv_error *e) {
    const json_t *c = json_object_get(m, "content");
    char p[160];
    snprintf(p, sizeof p, "%s.content", param);
    if (pyjson_is_str(c)) return json_pack("[{s:s,s:O}]", "type", "text", "text", c);
    if (!json_is_array(c)) return bad(e, p, "must be a string or a list of content blocks"), NULL;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *b = json_array_get(c, i);
        if (!json_is_object(b) || !type_of(b)) {
            snprintf(p, sizeof p, "%s.content.%zu", param, i);
            return bad(e, p, "must be an object with a string 'type'"), NULL;
        }
    }
    return json_incref((json_t *)c);
}

/* One user turn's blocks (in order): runs of text and images -> user messages, tool_result -> tool
 * messages (the encoder merges both back into one user turn, spec §2.2). */
static int map_user(const json_t *blocks, const char *const *params, json_t *out, srv_error *e) {
    json_t *text = json_array();
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *b = json_array_get(blocks, i);
        const char *ty = type_of(b), *p = params[i];
        json_t *add = NULL;
        if (!strcmp(ty, "text") || !strcmp(ty, "image")) {
            json_t *part = ty[0] == 't' ? text_part(b, p, e) : image_part(b, p, e);
            if (!part) goto fail;
            json_array_append_new(text, part);
            continue;
        }
        if (strcmp(ty, "tool_result")) {
            unsupported(ty, p, e);
            goto fail;
        }
        if (!(add = tool_message(b, p, e))) goto fail;
        if (json_array_size(text)) json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", text));
        json_array_clear(text);
        json_array_append_new(out, add);
    }
    if (json_array_size(text)) json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", text));
    if (json_array_size(blocks) == 0) json_array_append_new(out, json_pack("{s:s,s:s}", "role", "user", "content", ""));
    json_decref(text);
    return 0;
fail:
    json_decref(text);
    return -1;
}

/* One assistant turn: text -> content ("\n\n" between blocks), thinking -> reasoning_content,
 * redacted_thinking dropped (its data is opaque), tool_use -> tool_calls. *n_calls: calls. */
static int map_assistant(const json_t *blocks, const char *const *params, json_t *out, int *n_calls, srv_error *e) {
    dsf_buf text = {0}, reasoning = {0};
    json_t *calls = json_array();
    int n_text = 0, n_think = 0;
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *b = json_array_get(blocks, i);
        const char *ty = type_of(b), *p = params[i];
        if (!strcmp(ty, "text") || !strcmp(ty, "thinking")) {
            bool think = ty[1] == 'h';
            const json_t *t = json_object_get(b, think ? "thinking" : "text");
            const json_t *sig = json_object_get(b, "signature");
            char pp[160];
            snprintf(pp, sizeof pp, "%s.%s", p, think && pyjson_is_str(t) ? "signature" : think ? "thinking" : "text");
            if (!pyjson_is_str(t) || (think && !is_null(sig) && !pyjson_is_str(sig))) {
                bad(e, pp, "must be a string");
                goto fail;
            }
            dsf_buf *dst = think ? &reasoning : &text;
            if (!think && n_text++) dsf_buf_append(dst, "\n\n", 2);
            if (think) n_think++;
            dsf_buf_append(dst, json_string_value(t), json_string_length(t));
        } else if (!strcmp(ty, "tool_use")) {
            json_t *c = tool_call(b, p, e);
            if (!c) goto fail;
            json_array_append_new(calls, c);
        } else if (strcmp(ty, "redacted_thinking")) {
            unsupported(ty, p, e);
            goto fail;
        }
    }
    json_t *content = json_stringn(text.data ? (const char *)text.data : "", text.len);
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", content ? content : json_string(""));
    if (n_think)
        json_object_set_new(m, "reasoning_content", json_stringn(reasoning.data ? (const char *)reasoning.data : "",
                                                                 reasoning.len));
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    *n_calls = (int)json_array_size(calls);
    json_array_append_new(out, m);
    dsf_buf_free(&text);
    dsf_buf_free(&reasoning);
    json_decref(calls);
    return 0;
fail:
    dsf_buf_free(&text);
    dsf_buf_free(&reasoning);
    json_decref(calls);
    return -1;
}

/* system (top-level, or a system turn): a string or text blocks -> a system message; an empty
 * string or list adds nothing. */
static int map_system(const json_t *sys, const char *param, json_t *out, srv_error *e) {
    if (is_null(sys)) return 0;
    json_t *c = text_content(sys, param, e);
    if (!c) return -1;
    if ((pyjson_is_str(c) && json_string_length(c) == 0) || (json_is_array(c) && json_array_size(c) == 0)) {
        json_decref(c);
        return 0;
    }
    json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", c));
    return 0;
}

/* One run of consecutive same-role messages [i0, i1) merged into one turn (as Anthropic
 * merges them): its blocks in order, each with its own "messages.I.content.J" name. */
static int map_turn(const json_t *msgs, size_t i0, size_t i1, const char *role, json_t *out, bool last,
                    srv_error *e) {
    json_t *blocks = json_array();
    char(*names)[96] = NULL;
    const char **params = NULL;
    size_t n = 0;
    int rc = -1, n_calls = 0;
    char p[96];
    for (size_t i = i0; i < i1; i++) {
        snprintf(p, sizeof p, "messages.%zu", i);
        const json_t *m = json_array_get(msgs, i);
        if (!strcmp(role, "system")) {
            snprintf(p, sizeof p, "messages.%zu.content", i);
            if (map_system(json_object_get(m, "content"), p, out, e)) goto done;
            continue;
        }
        json_t *bl = blocks_of(m, p, e);
        if (!bl) goto done;
        names = dsf_xrealloc(names, (n + json_array_size(bl) + 1) * sizeof *names);
        for (size_t k = 0; k < json_array_size(bl); k++, n++) {
            snprintf(names[n], sizeof names[n], "messages.%zu.content.%zu", i, k);
            json_array_append(blocks, json_array_get(bl, k));
        }
        json_decref(bl);
    }
    if (!strcmp(role, "system")) {
        rc = 0;
        goto done;
    }
    params = dsf_xcalloc(n + 1, sizeof *params);
    for (size_t k = 0; k < n; k++) params[k] = names[k];
    if (!strcmp(role, "user")) {
        rc = map_user(blocks, params, out, e);
    } else {
        rc = map_assistant(blocks, params, out, &n_calls, e);
        if (!rc && last && n_calls) {
            snprintf(p, sizeof p, "messages.%zu", i1 - 1);
            rc = bad(e, p, "a final assistant message (a prefill to continue) must not end with tool_use: send the "
                           "tool_result in a user message");
        }
    }
done:
    free(names);
    free(params);
    json_decref(blocks);
    return rc;
}

/* messages -> chat messages appended to out; *prefill: the last turn is the assistant's (the
 * reply continues it, as Anthropic's prefill does). */
static int map_messages(const json_t *msgs, json_t *out, bool *prefill, srv_error *e) {
    if (!json_is_array(msgs)) return bad(e, "messages", "must be a list of messages");
    if (json_array_size(msgs) == 0) return bad(e, "messages", "at least one message is required");
    char p[96];
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(p, sizeof p, "messages.%zu.role", i);
        if (!json_is_object(m)) {
            snprintf(p, sizeof p, "messages.%zu", i);
            return bad(e, p, "must be an object with 'role' and 'content'");
        }
        const json_t *r = json_object_get(m, "role");
        if (!str_is(r, "user") && !str_is(r, "assistant") && !str_is(r, "system"))
            return bad(e, p, "must be \"user\" or \"assistant\"");
    }
    size_t n = json_array_size(msgs);
    for (size_t i0 = 0; i0 < n;) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, i0), "role"));
        size_t i1 = i0 + 1;
        while (i1 < n && !strcmp(json_string_value(json_object_get(json_array_get(msgs, i1), "role")), role)) i1++;
        if (map_turn(msgs, i0, i1, role, out, i1 == n, e)) return -1;
        *prefill = i1 == n && !strcmp(role, "assistant");
        i0 = i1;
    }
    return 0;
}

/* ==== tools, thinking, sampling =========================================================== */

static int map_tools(const json_t *tools, json_t *chat, srv_error *e) {
    if (is_null(tools)) return 0;
    if (!json_is_array(tools)) return bad(e, "tools", "must be a list of tools");
    json_t *out = json_array();
    char p[64];
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        snprintf(p, sizeof p, "tools.%zu", i);
        const json_t *ty = json_object_get(t, "type"), *name = json_object_get(t, "name");
        const json_t *schema = json_object_get(t, "input_schema"), *desc = json_object_get(t, "description");
        int rc = 0;
        if (!json_is_object(t)) rc = bad(e, p, "must be an object");
        else if (!is_null(ty) && !str_is(ty, "custom"))
            rc = bad(e, p, "tool type '%s' is not supported: only custom tools (name, description, input_schema)",
                     pyjson_is_str(ty) ? json_string_value(ty) : "?");
        else if (!pyjson_is_str(name)) rc = bad(e, p, "'name' must be a string");
        else if (!json_is_object(schema)) rc = bad(e, p, "'input_schema' must be a JSON schema object");
        else if (!is_null(desc) && !pyjson_is_str(desc)) rc = bad(e, p, "'description' must be a string");
        if (rc) {
            json_decref(out);
            return -1;
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        if (!is_null(desc)) json_object_set(fn, "description", (json_t *)desc);
        json_object_set(fn, "parameters", (json_t *)schema);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(chat, "tools", out);
    return 0;
}

/* tool_choice auto / any / tool {name} / none -> "auto" / "required" / named / "none";
 * disable_parallel_tool_use -> parallel_tool_calls false. */
static int map_tool_choice(const json_t *tc, json_t *chat, srv_error *e) {
    if (is_null(tc)) return 0;
    const json_t *ty = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
    const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (!pyjson_is_str(ty)) return bad(e, "tool_choice", "must be an object with 'type'");
    if (!is_null(dp) && !json_is_boolean(dp))
        return bad(e, "tool_choice.disable_parallel_tool_use", "must be a boolean");
    const char *t = json_string_value(ty);
    json_t *v;
    if (!strcmp(t, "auto")) v = json_string("auto");
    else if (!strcmp(t, "any")) v = json_string("required");
    else if (!strcmp(t, "none")) v = json_string("none");
    else if (!strcmp(t, "tool")) {
        const json_t *name = json_object_get(tc, "name");
        if (!pyjson_is_str(name)) return bad(e, "tool_choice.name", "must be a string");
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return bad(e, "tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", got \"%s\"", t);
    }
    json_object_set_new(chat, "tool_choice", v);
    if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    return 0;
}

/* thinking and output_config -> the chat thinking switch, reasoning_effort, response_format. */
static int map_thinking(const json_t *b, long long max_tokens, bool count, json_t *chat, srv_error *e) {
    const json_t *th = json_object_get(b, "thinking");
    bool on = false;
    const char *effort = NULL;
    if (!is_null(th)) {
        const json_t *ty = json_is_object(th) ? json_object_get(th, "type") : NULL;
        if (!pyjson_is_str(ty)) return bad(e, "thinking", "must be an object with 'type'");
        const char *t = json_string_value(ty);
        if (!strcmp(t, "enabled")) {
            const json_t *bt = json_object_get(th, "budget_tokens");
            if (!json_is_integer(bt)) return bad(e, "thinking.budget_tokens", "must be an integer");
            long long budget = json_integer_value(bt);
            if (budget < 1024) return bad(e, "thinking.budget_tokens", "must be at least 1024");
            if (!count && budget >= max_tokens)
                return bad(e, "thinking.budget_tokens", "must be less than max_tokens");
            on = true;
            effort = srv_msg_effort(budget);
        } else if (!strcmp(t, "adaptive")) {
            on = true;
        } else if (strcmp(t, "disabled")) {
            return bad(e, "thinking.type", "must be \"enabled\", \"adaptive\" or \"disabled\", got \"%s\"", t);
        }
    }
    const json_t *oc = json_object_get(b, "output_config");
    if (!is_null(oc)) {
        if (!json_is_object(oc)) return bad(e, "output_config", "must be an object");
        const json_t *ef = json_object_get(oc, "effort"), *fmt = json_object_get(oc, "format");
        static const char *const names[] = {"low", "medium", "high", "xhigh", "max"};
        bool known = false;
        for (int i = 0; i < 5; i++) known |= str_is(ef, names[i]);
        if (!is_null(ef) && !known)
            return bad(e, "output_config.effort", "must be one of low, medium, high, xhigh, max");
        if (known) effort = json_string_value(ef);
        if (!is_null(fmt)) {
            const json_t *schema = json_is_object(fmt) ? json_object_get(fmt, "schema") : NULL;
            if (!str_is(json_object_get(fmt, "type"), "json_schema") || !json_is_object(schema))
                return bad(e, "output_config.format", "must be {\"type\": \"json_schema\", \"schema\": {...}}");
            json_object_set_new(chat, "response_format",
                                json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name", "output",
                                          "schema", schema));
        }
    }
    json_object_set_new(chat, "thinking", json_boolean(on));
    if (effort) json_object_set_new(chat, "reasoning_effort", json_string(effort));
    return 0;
}

/* A number (integer: an integer) within [lo, hi], copied to the chat body under the same key. */
static int copy_num(const json_t *b, const char *key, double lo, double hi, bool integer, json_t *chat, srv_error *e) {
    const json_t *v = json_object_get(b, key);
    if (is_null(v)) return 0;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return bad(e, key, "must be %s", integer ? "an integer" : "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        return bad(e, key, "must be between %g and %g, got %g", lo, hi, d);
    }
    json_object_set(chat, key, (json_t *)v);
    return 0;
}

/* model, max_tokens, stop_sequences, sampling, stream, metadata. *max_tokens: its value. */
static int map_options(const json_t *b, bool count, json_t *chat, long long *max_tokens, srv_error *e) {
    if (!pyjson_is_str(json_object_get(b, "model"))) return bad(e, "model", "Field required (a string)");
    const json_t *mt = json_object_get(b, "max_tokens");
    if (!count) {
        if (is_null(mt)) return bad(e, "max_tokens", "Field required");
        if (copy_num(b, "max_tokens", 1, 1 << 30, true, chat, e)) return -1;
        *max_tokens = json_integer_value(mt);
    }
    if (copy_num(b, "temperature", 0, 1, false, chat, e) || copy_num(b, "top_p", 0, 1, false, chat, e) ||
        copy_num(b, "top_k", 0, 1 << 30, true, chat, e))
        return -1;
    const json_t *st = json_object_get(b, "stream");
    if (!is_null(st) && !json_is_boolean(st)) return bad(e, "stream", "must be a boolean");
    if (!count && json_is_true(st)) json_object_set_new(chat, "stream", json_true());
    const json_t *md = json_object_get(b, "metadata");
    if (!is_null(md) && (!json_is_object(md) || (!is_null(json_object_get(md, "user_id")) &&
                                                 !pyjson_is_str(json_object_get(md, "user_id")))))
        return bad(e, "metadata", "must be an object with an optional string 'user_id'");
    const json_t *ss = json_object_get(b, "stop_sequences");
    if (is_null(ss)) return 0;
    if (!json_is_array(ss)) return bad(e, "stop_sequences", "must be a list of strings");
    if (json_array_size(ss) > MAX_STOP) return bad(e, "stop_sequences", "at most 16 stop sequences are supported");
    for (size_t i = 0; i < json_array_size(ss); i++)
        if (!pyjson_is_str(json_array_get(ss, i))) return bad(e, "stop_sequences", "must be a list of strings");
    if (!count) json_object_set(chat, "stop", (json_t *)ss);
    return 0;
}

json_t *srv_msg_to_chat(const json_t *b, bool count, srv_error *e) {
    if (!json_is_object(b)) return bad(e, "body", "the request body must be a JSON object"), NULL;
    json_t *chat = json_object(), *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    long long max_tokens = 0;
    bool prefill = false;
    if (map_options(b, count, chat, &max_tokens, e) || map_system(json_object_get(b, "system"), "system", msgs, e) ||
        map_messages(json_object_get(b, "messages"), msgs, &prefill, e) || map_tools(json_object_get(b, "tools"), chat, e) ||
        map_tool_choice(json_object_get(b, "tool_choice"), chat, e) || map_thinking(b, max_tokens, count, chat, e)) {
        json_decref(chat);
        return NULL;
    }
    if (prefill) json_object_set_new(chat, "continue_final_message", json_true());
    return chat;
}

/* ==== whole requests ====================================================================== */

int srv_msg_parse(const char *body, size_t len, const dsf_tokenizer *tok, int n_ctx, bool count, srv_req *out,
                  srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = SRV_MESSAGES;
    char err[DSF_ERR_LEN] = "";
    json_t *b = pyjson_loads(body, len, err);
    if (!b) return srv_fail(e, 400, NULL, "invalid_request_error", "invalid JSON body: %s", err);
    json_t *chat = srv_msg_to_chat(b, count, e);
    json_decref(b);
    if (!chat) return -1;
    /* the chat parser takes text: re-serialize with Python's semantics (numbers, key order
     * and strings round-trip exactly, so the prompt is the one this body describes) */
    dsf_buf cb = {0};
    int rc = pyjson_dumps(&cb, chat, err);
    json_decref(chat);
    if (rc) {
        dsf_buf_free(&cb);
        return srv_fail(e, 400, NULL, "invalid_request_error", "cannot map the request: %s", err);
    }
    /* Only the prompt must fit: agents ask for max_tokens of tens of thousands whatever the
     * context; the generation then ends when the context is full (stop_reason
     * model_context_window_exceeded), as Anthropic's newer models do. */
    rc = srv_parse_request(SRV_CHAT, (const char *)cb.data, cb.len, tok, INT_MAX, out, e);
    dsf_buf_free(&cb);
    out->kind = SRV_MESSAGES;
    if (rc == 0 && !count && out->n_prompt >= n_ctx) {
        srv_fail(e, 400, "messages", "invalid_request_error",
                 "prompt is too long: %d tokens > %d maximum (the server's context, --ctx)", out->n_prompt, n_ctx - 1);
        srv_req_free(out);
        out->kind = SRV_MESSAGES;
        rc = -1;
    }
    return rc;
}

char *srv_msg_count_json(const char *body, size_t len, const dsf_tokenizer *tok, srv_error *e) {
    srv_req r;
    if (srv_msg_parse(body, len, tok, INT_MAX, true, &r, e)) return NULL;
    json_t *o = json_pack("{s:i}", "input_tokens", r.n_prompt);
    srv_req_free(&r);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
