/* server_api.c: OpenAI request validation and response JSON for `dsflash serve`.
 *
 * Owns: body -> srv_req (validation with OpenAI-style 400 errors, the chat prompt through
 * the official-encoder mapping of chat.c, tokenization, the context limit) and generated
 * output -> OpenAI JSON (chat.completion, text_completion, their stream chunks, usage,
 * logprobs). Must not: touch sockets, threads or the engine. Bodies are hostile input:
 * every field is type-checked before use; nothing here aborts on a bad request. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/server.h"
#include "server/server_image.h"

#define MAX_STOP 16

/* ==== errors ============================================================================== */

int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = status == 401 ? "authentication_error"
              : status >= 500 ? "server_error"
              : status == 404 ? "not_found_error"
                              : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* Replaces invalid UTF-8 by U+FFFD so that jansson accepts the text (messages may quote
 * request bytes). Returns a new JSON string. */
static json_t *json_str_lossy(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    dsf_buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = k > 0 && i + k <= n && c != 0xC0 && c != 0xC1 && c <= 0xF4;
        for (size_t j = 1; ok && j < k; j++) ok = (u[i + j] & 0xC0) == 0x80;
        if (ok && k == 3) {
            unsigned cp = ((c & 15u) << 12) | ((u[i + 1] & 63u) << 6);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && k == 4) {
            unsigned cp = ((c & 7u) << 18) | ((u[i + 1] & 63u) << 12);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            dsf_buf_append(&b, s + i, k);
            i += k;
        } else {
            dsf_buf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    v = json_stringn(b.data ? (const char *)b.data : "", b.len);
    dsf_buf_free(&b);
    return v ? v : json_string("");
}

char *srv_error_json(const srv_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", json_str_lossy(e->message, strlen(e->message)));
    json_object_set_new(o, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(o, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code ? json_string(e->code) : json_null());
    json_t *w = json_pack("{s:o}", "error", o);
    char *s = json_dumps(w, JSON_COMPACT);
    json_decref(w);
    return s;
}

/* ==== field readers ======================================================================= */

static bool is_null(const json_t *v) { return !v || json_is_null(v); }

static int get_bool(const json_t *body, const char *key, bool *out, srv_error *e) {
    const json_t *v = json_object_get(body, key);
    if (is_null(v)) return 0;
    if (!json_is_boolean(v)) return srv_fail(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int get_num(const json_t *body, const char *key, double lo, double hi, float *out, srv_error *e) {
    const json_t *v = json_object_get(body, key);
    if (is_null(v)) return 0;
    if (!json_is_number(v)) return srv_fail(e, 400, key, "invalid_type", "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return srv_fail(e, 400, key, "invalid_value", "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = (float)d;
    return 0;
}

static int get_int(const json_t *body, const char *key, long long lo, long long hi, long long *out, bool *set,
                   srv_error *e) {
    const json_t *v = json_object_get(body, key);
    if (is_null(v)) return 0;
    if (!json_is_integer(v)) return srv_fail(e, 400, key, "invalid_type", "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_fail(e, 400, key, "invalid_value", "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    if (set) *set = true;
    return 0;
}

static bool str_is(const json_t *v, const char *s) { return pyjson_is_str(v) && !strcmp(json_string_value(v), s); }

/* Sampling and output options shared by both endpoints. */
static int parse_common(const json_t *b, srv_kind kind, srv_req *r, srv_error *e) {
    dsf_sampler_params sp;
    dsf_sampler_params_default(&sp);
    r->temperature = sp.temperature;
    r->top_p = sp.top_p;
    r->min_p = sp.min_p;
    r->top_k = sp.top_k;
    r->logprobs = -1;
    r->parallel_tool_calls = true;
    long long x = 0;
    bool set = false;
    if (get_bool(b, "stream", &r->stream, e)) return -1;
    const json_t *so = json_object_get(b, "stream_options");
    if (!is_null(so)) {
        if (!json_is_object(so)) return srv_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    if (get_num(b, "temperature", 0, 100, &r->temperature, e)) return -1;
    if (get_num(b, "top_p", 0, 1, &r->top_p, e)) return -1;
    if (get_num(b, "min_p", 0, 1, &r->min_p, e)) return -1;
    float ignored;
    if (get_num(b, "frequency_penalty", -2, 2, &ignored, e)) return -1;
    if (get_num(b, "presence_penalty", -2, 2, &ignored, e)) return -1;
    x = 0;
    if (get_int(b, "top_k", -1, 1 << 30, &x, NULL, e)) return -1;
    r->top_k = (int)x;
    if (get_int(b, "seed", INT64_MIN, INT64_MAX, &x, &r->has_seed, e)) return -1;
    r->seed = r->has_seed ? (uint64_t)x : 0;
    x = 1;
    if (get_int(b, "n", 1, 1, &x, NULL, e)) return -1;
    x = 0;
    if (get_int(b, "max_tokens", 1, 1 << 30, &x, NULL, e)) return -1;
    if (kind == SRV_CHAT && get_int(b, "max_completion_tokens", 1, 1 << 30, &x, NULL, e)) return -1;
    r->max_tokens = (int)x;
    if (get_bool(b, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (kind == SRV_CHAT && get_bool(b, "parallel_tool_calls", &r->parallel_tool_calls, e)) return -1;

    /* logprobs: chat has a boolean plus top_logprobs; completions an integer (top count) */
    const json_t *lp = json_object_get(b, "logprobs");
    if (kind == SRV_CHAT) {
        bool on = false;
        if (get_bool(b, "logprobs", &on, e)) return -1;
        x = 0;
        set = false;
        if (get_int(b, "top_logprobs", 0, 20, &x, &set, e)) return -1;
        if (set && !on)
            return srv_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs': true");
        if (on) r->logprobs = (int)x;
    } else if (!is_null(lp)) {
        x = 0;
        if (get_int(b, "logprobs", 0, 20, &x, NULL, e)) return -1;
        r->logprobs = (int)x;
    }

    const json_t *st = json_object_get(b, "stop");
    if (!is_null(st)) {
        size_t n = pyjson_is_str(st) ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (n == (size_t)-1) return srv_fail(e, 400, "stop", "invalid_type", "'stop' must be a string or a list of strings");
        if (n > MAX_STOP) return srv_fail(e, 400, "stop", "invalid_value", "at most %d stop strings are supported", MAX_STOP);
        r->stop = dsf_xcalloc(n ? n : 1, sizeof *r->stop);
        for (size_t i = 0; i < n; i++) {
            const json_t *s = pyjson_is_str(st) ? st : json_array_get(st, i);
            if (!pyjson_is_str(s)) return srv_fail(e, 400, "stop", "invalid_type", "'stop' must be a string or a list of strings");
            r->stop[r->n_stop++] = dsf_xstrdup(json_string_value(s));
        }
    }
    return 0;
}

void srv_req_free(srv_req *r) {
    if (!r) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    if (r->api_free) r->api_free(r->api_data);
    dsf_grammar_free(r->grammar);
    free(r->images_json);
    srv_images_free(r->images, r->n_images);
    memset(r, 0, sizeof *r);
}

/* ==== chat request -> encoder ============================================================= */

static int check_content(const json_t *c, const char *param, srv_error *e) {
    if (is_null(c) || pyjson_is_str(c)) return 0;
    if (!json_is_array(c)) return srv_fail(e, 400, param, "invalid_type", "'%s' must be a string, a list of parts or null", param);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *p = json_array_get(c, i);
        if (!json_is_object(p) || !pyjson_is_str(json_object_get(p, "type")))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu]' must be an object with a string 'type'", param, i);
        const json_t *t = json_object_get(p, "text");
        if (str_is(json_object_get(p, "type"), "text") && !pyjson_is_str(t))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu].text' must be a string", param, i);
    }
    return 0;
}

static int check_tool_calls(const json_t *tc, const char *param, srv_error *e) {
    if (is_null(tc)) return 0;
    if (!json_is_array(tc)) return srv_fail(e, 400, param, "invalid_type", "'%s' must be a list", param);
    for (size_t i = 0; i < json_array_size(tc); i++) {
        const json_t *c = json_array_get(tc, i);
        const json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
        if (!json_is_object(f) || !pyjson_is_str(json_object_get(f, "name")))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu]' must be {\"function\": {\"name\": ..., \"arguments\": ...}}", param, i);
        const json_t *a = json_object_get(f, "arguments");
        if (!is_null(a) && !pyjson_is_str(a) && !json_is_object(a))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu].function.arguments' must be a string", param, i);
    }
    return 0;
}

static const char *tool_name(const json_t *t) {
    const json_t *f = json_is_object(t) ? json_object_get(t, "function") : NULL;
    const json_t *n = json_is_object(f) ? json_object_get(f, "name") : NULL;
    return pyjson_is_str(n) ? json_string_value(n) : NULL;
}

/* Builds the request chat.c maps (a copy of body with validated, normalized fields). */
static json_t *normalize_chat(const json_t *body, srv_error *e) {
    if (!json_is_object(body)) { srv_fail(e, 400, NULL, "invalid_type", "request body must be a JSON object"); return NULL; }
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) { srv_fail(e, 400, "messages", "invalid_type", "'messages' must be a list"); return NULL; }
    if (json_array_size(msgs) == 0) { srv_fail(e, 400, "messages", "invalid_value", "'messages' must not be empty"); return NULL; }
    json_t *req = json_deep_copy(body);
    json_t *m2 = json_object_get(req, "messages");
    char param[64];
    for (size_t i = 0; i < json_array_size(m2); i++) {
        json_t *m = json_array_get(m2, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) { srv_fail(e, 400, param, "invalid_type", "'%s' must be an object", param); goto fail; }
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!pyjson_is_str(role)) { srv_fail(e, 400, param, "invalid_type", "'%s' must be a string", param); goto fail; }
        const char *r = json_string_value(role);
        /* spec chat-format.md §5.2: V4.1 has no developer role; map it to system (OpenAI
         * SDKs send developer for system prompts of reasoning models). */
        if (!strcmp(r, "developer")) json_object_set_new(m, "role", json_string("system")), r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") &&
            strcmp(r, "latest_reminder")) {
            srv_fail(e, 400, param, "invalid_value", "Unknown role: %s", r);
            goto fail;
        }
        snprintf(param, sizeof param, "messages[%zu].content", i);
        json_t *c = json_object_get(m, "content");
        if (check_content(c, param, e)) goto fail;
        /* spec §2.14: a null user content is a TypeError in the official code; map it to "" */
        if (!strcmp(r, "user") && json_is_null(c)) json_object_set_new(m, "content", json_string(""));
        snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
        if (check_tool_calls(json_object_get(m, "tool_calls"), param, e)) goto fail;
        json_t *rc = json_object_get(m, "reasoning_content");
        if (is_null(rc)) rc = json_object_get(m, "reasoning");
        snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
        if (!is_null(rc) && !pyjson_is_str(rc)) { srv_fail(e, 400, param, "invalid_type", "'%s' must be a string", param); goto fail; }
        json_t *id = json_object_get(m, "tool_call_id");
        snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
        if (!is_null(id) && !pyjson_is_str(id)) { srv_fail(e, 400, param, "invalid_type", "'%s' must be a string", param); goto fail; }
    }

    json_t *tools = json_object_get(req, "tools");
    if (!is_null(tools)) {
        if (!json_is_array(tools)) { srv_fail(e, 400, "tools", "invalid_type", "'tools' must be a list"); goto fail; }
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            if (!tool_name(t)) { srv_fail(e, 400, "tools", "invalid_type", "'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i); goto fail; }
            const json_t *ty = json_object_get(t, "type");
            if (!is_null(ty) && !str_is(ty, "function")) { srv_fail(e, 400, "tools", "invalid_value", "'tools[%zu].type' must be \"function\"", i); goto fail; }
        }
    }
    size_t n_tools = json_is_array(tools) ? json_array_size(tools) : 0;
    json_t *tc = json_object_get(req, "tool_choice");
    if (!is_null(tc)) {
        if (pyjson_is_str(tc)) {
            const char *s = json_string_value(tc);
            if (strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required")) {
                srv_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got \"%s\"", s);
                goto fail;
            }
            if (!strcmp(s, "required") && n_tools == 0) { srv_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' \"required\" needs 'tools'"); goto fail; }
        } else if (json_is_object(tc)) {
            const char *want = tool_name(tc);
            if (!want) { srv_fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}"); goto fail; }
            json_t *keep = NULL;
            for (size_t i = 0; i < n_tools; i++)
                if (!strcmp(tool_name(json_array_get(tools, i)), want)) keep = json_array_get(tools, i);
            if (!keep) { srv_fail(e, 400, "tool_choice", "invalid_value", "tool_choice names function '%s', which is not in 'tools'", want); goto fail; }
            /* A named choice offers the model that one tool (and constrains the output to a call of
             * it: derive_constraint). */
            json_t *only = json_pack("[O]", keep);
            json_object_set_new(req, "tools", only);
            json_object_set_new(req, "tool_choice", json_string("auto"));
        } else {
            srv_fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be a string or an object");
            goto fail;
        }
    }
    const json_t *rf = json_object_get(req, "response_format");
    if (!is_null(rf)) {
        const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!str_is(t, "text") && !str_is(t, "json_object") && !str_is(t, "json_schema")) {
            srv_fail(e, 400, "response_format", "invalid_value", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
            goto fail;
        }
        const json_t *js = json_object_get(rf, "json_schema");
        if (str_is(t, "json_schema") && (!json_is_object(js) || !json_is_object(json_object_get(js, "schema")))) {
            srv_fail(e, 400, "response_format", "invalid_value", "'response_format.json_schema.schema' must be an object");
            goto fail;
        }
    }
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (!is_null(kw) && !json_is_object(kw)) { srv_fail(e, 400, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object"); goto fail; }
    return req;
fail:
    json_decref(req);
    return NULL;
}

int srv_chat_render(const json_t *body, dsf_chat_prompt *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    json_t *req = normalize_chat(body, e);
    if (!req) return -1;
    dsf_buf b = {0};
    char err[DSF_ERR_LEN] = "";
    int rc = pyjson_dumps(&b, req, err);
    json_decref(req);
    if (rc == 0 && dsf_chat_render_openai((const char *)b.data, b.len, out, err)) rc = -1;
    dsf_buf_free(&b);
    if (rc) return srv_fail(e, 400, "messages", "invalid_request", "%s", err);
    return 0;
}

/* ==== whole requests ====================================================================== */

static int check_ctx(srv_req *r, int n_ctx, const char *param, srv_error *e) {
    if (r->n_prompt >= n_ctx)
        return srv_fail(e, 400, param, "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, your request has %d prompt "
                        "tokens. Please reduce the length of the %s.",
                        n_ctx, r->n_prompt, param);
    if (r->max_tokens > 0 && (long long)r->n_prompt + r->max_tokens > n_ctx)
        return srv_fail(e, 400, "max_tokens", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                        "(%d in the %s, %d in the completion). Please reduce the length of the %s or the "
                        "completion.",
                        n_ctx, (long long)r->n_prompt + r->max_tokens, r->n_prompt, param, r->max_tokens, param);
    return 0;
}

static int tokenize_into(const dsf_tokenizer *tok, const char *s, size_t n, bool bos, srv_req *r, srv_error *e) {
    char err[DSF_ERR_LEN] = "";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (dsf_tokenize(tok, s, n, bos, true, &ids, &n_ids, err))
        return srv_fail(e, 400, "prompt", "invalid_value", "cannot tokenize the prompt: %s", err);
    if (n_ids > (size_t)(1 << 30)) {
        free(ids);
        return srv_fail(e, 400, "prompt", "invalid_value", "prompt too long");
    }
    r->prompt = ids;
    r->n_prompt = (int)n_ids;
    return 0;
}

static int parse_completion_prompt(const json_t *b, const dsf_tokenizer *tok, srv_req *r, srv_error *e) {
    const json_t *p = json_object_get(b, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] or [[ids]]: one prompt in a batch of one */
    bool bos = dsf_tokenizer_add_bos(tok) && dsf_tokenizer_bos(tok) >= 0;
    if (pyjson_is_str(p)) {
        size_t n = json_string_length(p); /* pyjson keeps NUL bytes */
        if (tokenize_into(tok, json_string_value(p), n, bos, r, e)) return -1;
    } else if (json_is_array(p)) {
        size_t n = json_array_size(p);
        if (n == 0) return srv_fail(e, 400, "prompt", "invalid_value", "'prompt' must not be empty");
        if (n > (size_t)(1 << 30)) return srv_fail(e, 400, "prompt", "invalid_value", "prompt too long");
        r->prompt = dsf_xmalloc(n * sizeof *r->prompt);
        r->n_prompt = (int)n;
        int nv = dsf_tokenizer_n_vocab(tok);
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_array_get(p, i);
            if (!json_is_integer(v))
                return srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string or a list of token ids (only one prompt is supported)");
            long long id = json_integer_value(v);
            if (id < 0 || id >= nv) return srv_fail(e, 400, "prompt", "invalid_value", "token id %lld at prompt[%zu] is outside the vocabulary [0, %d)", id, i, nv);
            r->prompt[i] = (int32_t)id;
        }
    } else {
        return srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string or a list of token ids");
    }
    if (r->n_prompt == 0) return srv_fail(e, 400, "prompt", "invalid_value", "the prompt is empty");
    bool echo = false;
    if (get_bool(b, "echo", &echo, e)) return -1;
    if (echo) return srv_fail(e, 400, "echo", "unsupported", "'echo' is not supported");
    const json_t *suffix = json_object_get(b, "suffix");
    if (!is_null(suffix)) return srv_fail(e, 400, "suffix", "unsupported", "'suffix' is not supported");
    return 0;
}

/* ==== constrained decoding ================================================================ */

/* "ns::name" as the model writes it in <｜DSML｜ invoke name="..."> (spec chat-format.md §2.10:
 * the tool-level namespace wins over the function-level one). Returns a new string. */
static json_t *qualified_name(const json_t *tool) {
    const char *name = tool_name(tool);
    const json_t *ns = json_object_get(tool, "namespace");
    if (is_null(ns)) ns = json_object_get(json_object_get(tool, "function"), "namespace");
    if (json_is_object(ns)) ns = json_object_get(ns, "name");
    if (!pyjson_is_str(ns) || !*json_string_value(ns) || strstr(name, "::")) return json_string(name);
    dsf_buf b = {0};
    dsf_buf_appendf(&b, "%s::%s", json_string_value(ns), name);
    json_t *q = json_stringn((const char *)b.data, b.len);
    dsf_buf_free(&b);
    return q ? q : json_string(name);
}

/* The constraint spec of dsf_grammar_new from the chat keys (NULL: unconstrained):
 * tool_choice "required" or a named function -> the calls block over those tools;
 * otherwise response_format json_object / json_schema -> the content. */
static json_t *constraint_spec(const json_t *b, const srv_req *r, const char **param) {
    const json_t *tools = json_object_get(b, "tools"), *tc = json_object_get(b, "tool_choice");
    const json_t *rf = json_object_get(b, "response_format");
    json_t *spec = json_pack("{s:b}", "thinking", r->gen_reasoning);
    const char *want = json_is_object(tc) ? tool_name(tc) : NULL;
    if (json_is_array(tools) && json_array_size(tools) && (str_is(tc, "required") || want)) {
        json_t *list = json_array();
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            if (want && strcmp(tool_name(t), want)) continue;
            const json_t *params = json_object_get(json_object_get(t, "function"), "parameters");
            json_t *one = json_pack("{s:o}", "name", qualified_name(t));
            if (params) json_object_set(one, "parameters", (json_t *)params);
            json_array_append_new(list, one);
        }
        json_object_set_new(spec, "tools", list);
        json_object_set_new(spec, "parallel", json_boolean(r->parallel_tool_calls && !want));
        *param = "tools";
        return spec;
    }
    const json_t *t = json_object_get(rf, "type");
    if (str_is(t, "json_object")) {
        json_object_set_new(spec, "json_object", json_true());
    } else if (str_is(t, "json_schema")) {
        json_object_set(spec, "json_schema", json_object_get(json_object_get(rf, "json_schema"), "schema"));
    } else {
        json_decref(spec);
        return NULL;
    }
    *param = "response_format";
    return spec;
}

/* Compiles the request's constraint into r->grammar; 400 for a schema that cannot be
 * compiled or a budget (max_tokens, else the context left) below the shortest valid output. */
static int derive_constraint(const json_t *b, const dsf_tokenizer *tok, int n_ctx, srv_req *r, srv_error *e) {
    const char *param = NULL;
    json_t *spec = constraint_spec(b, r, &param);
    if (!spec) return 0;
    dsf_buf txt = {0};
    char err[DSF_ERR_LEN] = "";
    int rc = pyjson_dumps(&txt, spec, err);
    json_decref(spec);
    if (rc == 0) r->grammar = dsf_grammar_new(tok, (const char *)txt.data, txt.len, err);
    dsf_buf_free(&txt);
    if (!r->grammar) return srv_fail(e, 400, param, "invalid_value", "'%s': %s", param, err);
    int need = dsf_grammar_min_tokens(r->grammar);
    int budget = r->max_tokens > 0 ? r->max_tokens : n_ctx - r->n_prompt;
    if (need > budget)
        return srv_fail(e, 400, "max_tokens", "invalid_value",
                        "%s %d tokens, but the shortest output that satisfies '%s' needs %d", r->max_tokens > 0 ? "'max_tokens' allows" : "the context leaves",
                        budget, param, need);
    return 0;
}

int srv_parse_request(srv_kind kind, const char *body, size_t len, const dsf_tokenizer *tok, int n_ctx, srv_req *out,
                      srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    char err[DSF_ERR_LEN] = "";
    json_t *b = pyjson_loads(body, len, err);
    if (!b) return srv_fail(e, 400, NULL, "invalid_json", "invalid JSON body: %s", err);
    int rc = srv_parse_json(kind, b, tok, n_ctx, out, e);
    json_decref(b);
    return rc;
}

int srv_parse_json(srv_kind kind, const json_t *b, const dsf_tokenizer *tok, int n_ctx, srv_req *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    int rc = -1;
    if (!json_is_object(b)) {
        srv_fail(e, 400, NULL, "invalid_type", "request body must be a JSON object");
        goto done;
    }
    if (parse_common(b, kind, out, e)) goto done;
    if (kind == SRV_CHAT) {
        dsf_chat_prompt cp;
        if (srv_chat_render(b, &cp, e)) goto done;
        out->gen_reasoning = cp.gen_reasoning;
        const json_t *tools = json_object_get(b, "tools");
        out->tools = json_is_array(tools) && json_array_size(tools) > 0 && !str_is(json_object_get(b, "tool_choice"), "none");
        /* The rendered prompt starts with BOS text: tokenize it with special tokens parsed
         * and no extra BOS (spec chat-format.md §1). */
        rc = tokenize_into(tok, cp.prompt, cp.prompt_len, false, out, e);
        if (cp.images_json && strcmp(cp.images_json, "[]")) out->images_json = dsf_xstrdup(cp.images_json);
        dsf_chat_prompt_free(&cp);
        if (rc) goto done;
        rc = -1;
        if (check_ctx(out, n_ctx, "messages", e)) goto done;
        if (derive_constraint(b, tok, n_ctx, out, e)) goto done;
    } else {
        if (parse_completion_prompt(b, tok, out, e)) goto done;
        if (check_ctx(out, n_ctx, "prompt", e)) goto done;
    }
    rc = 0;
done:
    if (rc) srv_req_free(out), out->kind = kind;
    return rc;
}

/* ==== responses =========================================================================== */

void srv_call_id(char out[32], uint64_t *rng) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) out[5 + i] = al[(int)(dsf_rng_uniform(rng) * 62) % 62];
    out[29] = 0;
}

json_t *srv_usage_json(const srv_usage *u) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u->cached_tokens);
}

static json_t *token_entry(const dsf_tokenizer *tok, int32_t id, float lp) {
    size_t n = 0;
    const char *s = dsf_token_bytes(tok, id, &n);
    if (!s) s = "", n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)s[i]));
    return json_pack("{s:o,s:f,s:o}", "token", json_str_lossy(s, n), "logprob", (double)lp, "bytes", bytes);
}

json_t *srv_chat_logprobs(const srv_tokprob *lp, int n, const dsf_tokenizer *tok) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *e = token_entry(tok, lp[i].id, lp[i].logprob);
        json_t *top = json_array();
        for (int k = 0; k < lp[i].n_top; k++) json_array_append_new(top, token_entry(tok, lp[i].top_ids[k], lp[i].top_lp[k]));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    return json_pack("{s:o}", "content", content);
}

json_t *srv_completion_logprobs(const srv_tokprob *lp, int n, const dsf_tokenizer *tok, size_t off) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *s = dsf_token_bytes(tok, lp[i].id, &len);
        if (!s) s = "", len = 0;
        json_array_append_new(toks, json_str_lossy(s, len));
        json_array_append_new(lps, json_real(lp[i].logprob));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += len;
        json_t *top = json_object();
        for (int k = 0; k < lp[i].n_top; k++) {
            size_t tl = 0;
            const char *ts = dsf_token_bytes(tok, lp[i].top_ids[k], &tl);
            json_t *key = json_str_lossy(ts ? ts : "", ts ? tl : 0);
            /* object keys are C strings: a token with a NUL byte is keyed up to it */
            json_object_set_new(top, json_string_value(key), json_real(lp[i].top_lp[k]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

static json_t *base_object(const srv_meta *m, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", m->id, "object", object, "created", (json_int_t)m->created, "model",
                     m->model ? m->model : "dsflash");
}

json_t *srv_chat_reply(const srv_meta *m, const dsf_dsml_result *r, char ids[][32], const char *finish,
                       const srv_usage *u, const srv_tokprob *lp, int n_lp, const dsf_tokenizer *tok,
                       bool parallel_tool_calls) {
    int n_calls = r->n_calls;
    if (!parallel_tool_calls && n_calls > 1) n_calls = 1;
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    bool empty = r->content_len == 0;
    json_object_set_new(msg, "content", empty && n_calls ? json_null() : json_str_lossy(r->content ? r->content : "", r->content_len));
    json_object_set_new(msg, "reasoning_content",
                        r->reasoning_len ? json_str_lossy(r->reasoning, r->reasoning_len) : json_null());
    if (n_calls) {
        json_t *calls = json_array();
        for (int i = 0; i < n_calls; i++) {
            const dsf_tool_call *c = &r->calls[i];
            json_t *f = json_pack("{s:o,s:o}", "name", json_str_lossy(c->name, strlen(c->name)), "arguments",
                                  json_str_lossy(c->arguments, strlen(c->arguments)));
            json_t *call = json_pack("{s:s,s:s,s:o}", "id", ids[i], "type", "function", "function", f);
            if (c->ns) json_object_set_new(call, "namespace", json_str_lossy(c->ns, strlen(c->ns)));
            json_array_append_new(calls, call);
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    if (n_calls && !strcmp(finish, "stop")) finish = "tool_calls";
    json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs",
                               lp ? srv_chat_logprobs(lp, n_lp, tok) : json_null(), "finish_reason", finish);
    json_t *o = base_object(m, "chat.completion");
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", srv_usage_json(u));
    return o;
}

json_t *srv_completion_reply(const srv_meta *m, const char *text, size_t len, const char *finish, const srv_usage *u,
                             const srv_tokprob *lp, int n_lp, const dsf_tokenizer *tok) {
    json_t *choice = json_pack("{s:o,s:i,s:o,s:s}", "text", json_str_lossy(text ? text : "", len), "index", 0,
                               "logprobs", lp ? srv_completion_logprobs(lp, n_lp, tok, 0) : json_null(),
                               "finish_reason", finish);
    json_t *o = base_object(m, "text_completion");
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", srv_usage_json(u));
    return o;
}

json_t *srv_chunk(const srv_meta *m, srv_kind kind, json_t **choice) {
    json_t *o = base_object(m, kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_t *c = kind == SRV_CHAT
                    ? json_pack("{s:i,s:{},s:n,s:n}", "index", 0, "delta", "logprobs", "finish_reason")
                    : json_pack("{s:s,s:i,s:n,s:n}", "text", "", "index", 0, "logprobs", "finish_reason");
    json_object_set_new(o, "choices", json_pack("[o]", c));
    if (choice) *choice = c;
    return o;
}

json_t *srv_usage_chunk(const srv_meta *m, srv_kind kind, const srv_usage *u) {
    json_t *o = base_object(m, kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", srv_usage_json(u));
    return o;
}

void srv_sse_json(dsf_buf *b, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    dsf_buf_append(b, "data: ", 6);
    if (s) dsf_buf_append(b, s, strlen(s));
    dsf_buf_append(b, "\n\n", 2);
    free(s);
}

json_t *srv_dsml_chunk(const srv_meta *m, const dsf_dsml_event *ev, const char *call_id, bool parallel_tool_calls) {
    bool text = ev->type == DSF_DSML_REASONING || ev->type == DSF_DSML_CONTENT;
    if ((text || ev->type == DSF_DSML_TOOL_ARGS) && !ev->len) return NULL;
    if (ev->type == DSF_DSML_TOOL_END) return NULL;
    if (!text && !parallel_tool_calls && ev->index > 0) return NULL;
    json_t *choice;
    json_t *ch = srv_chunk(m, SRV_CHAT, &choice);
    json_t *delta = json_object_get(choice, "delta");
    switch (ev->type) {
    case DSF_DSML_REASONING: json_object_set_new(delta, "reasoning_content", json_str_lossy(ev->text, ev->len)); break;
    case DSF_DSML_CONTENT: json_object_set_new(delta, "content", json_str_lossy(ev->text, ev->len)); break;
    case DSF_DSML_TOOL_START: {
        const char *nm = ev->name ? ev->name : "";
        json_t *call = json_pack("{s:i,s:s,s:s,s:{s:o,s:s}}", "index", ev->index, "id", call_id ? call_id : "", "type",
                                 "function", "function", "name", json_str_lossy(nm, strlen(nm)), "arguments", "");
        if (ev->ns) json_object_set_new(call, "namespace", json_str_lossy(ev->ns, strlen(ev->ns)));
        json_object_set_new(delta, "tool_calls", json_pack("[o]", call));
        break;
    }
    default: /* DSF_DSML_TOOL_ARGS */
        json_object_set_new(delta, "tool_calls", json_pack("[{s:i,s:{s:o}}]", "index", ev->index, "function",
                                                           "arguments", json_str_lossy(ev->text, ev->len)));
        break;
    }
    return ch;
}
