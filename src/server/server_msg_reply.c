/* server_msg_reply.c: the Anthropic Messages reply and stream events as JSON, in the shapes
 * @anthropic-ai/sdk 1.17.0 types them (resources/messages/messages.d.ts: Message, Usage,
 * MessageDeltaUsage, ContentBlock, RawMessageStreamEvent), and Anthropic's error body.
 *
 * Owns: the Message object, its content blocks (thinking, text, tool_use), usage, stop_reason,
 * the stream events (message_start, content_block_start / _delta / _stop, message_delta,
 * message_stop, ping) and their SSE framing ("event: <type>" + "data: <json>"), tool_use ids
 * and thinking signatures. Must not: touch sockets, threads or the engine; decide the order of
 * events (server_msg_api.c does). Nullable fields the SDK types as required are sent as null. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_msg.h"

/* Text as a JSON string; invalid UTF-8 (not produced by the detokenizer's streams, but
 * possible in a cut) becomes U+FFFD so the reply always serializes. */
static json_t *str_n(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    if (v) return v;
    dsf_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) dsf_buf_append(&b, &s[i], 1);
        else if ((c & 0xC0) != 0x80) dsf_buf_append(&b, "\xEF\xBF\xBD", 3);
    }
    v = json_stringn(b.data ? (const char *)b.data : "", b.len);
    dsf_buf_free(&b);
    return v ? v : json_string("");
}

/* ==== errors ============================================================================== */

const char *srv_msg_error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_msg_error_json(const srv_error *e) {
    json_t *o = json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", srv_msg_error_type(e->status),
                          "message", str_n(e->message, strlen(e->message)));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ==== pieces ============================================================================== */

const char *srv_msg_stop_reason(const dsf_gen_result *res, int n_calls, int max_tokens) {
    if (res->finish == DSF_FINISH_LENGTH)
        return max_tokens > 0 && res->n_completion < max_tokens ? "model_context_window_exceeded" : "max_tokens";
    if (n_calls > 0) return "tool_use";
    if (res->stop_index >= 0) return "stop_sequence";
    return "end_turn";
}

void srv_msg_tool_id(char out[32], const char *call_id) {
    const char *r = strncmp(call_id, "call_", 5) ? call_id : call_id + 5;
    snprintf(out, 32, "toolu_%.24s", r);
}

uint64_t srv_msg_sig_update(uint64_t h, const char *text, size_t len) {
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 0x100000001b3ull;
    return h;
}

void srv_msg_sig_text(uint64_t h, char out[24]) { snprintf(out, 24, "dsf1:%016llx", (unsigned long long)h); }

json_t *srv_msg_usage(const srv_usage *u, bool delta) {
    int cached = u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
    json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:n,s:n}", "input_tokens", u->prompt_tokens - cached, "output_tokens",
                          u->completion_tokens, "cache_read_input_tokens", cached, "cache_creation_input_tokens", 0,
                          "output_tokens_details", "server_tool_use");
    if (!delta) {
        json_object_set_new(o, "cache_creation", json_null());
        json_object_set_new(o, "inference_geo", json_null());
        json_object_set_new(o, "service_tier", json_string("standard"));
        json_object_set_new(o, "speed", json_null());
    }
    return o;
}

static json_t *thinking_block(const char *text, size_t len, const char *signature) {
    return json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking", str_n(text, len), "signature", signature);
}

static json_t *text_block(const char *text, size_t len) {
    return json_pack("{s:s,s:o,s:n}", "type", "text", "text", str_n(text, len), "citations");
}

static json_t *tool_block(const char *id, const char *name, json_t *input) {
    return json_pack("{s:s,s:s,s:o,s:o,s:{s:s}}", "type", "tool_use", "id", id, "name", str_n(name, strlen(name)),
                     "input", input, "caller", "type", "direct");
}

/* A call's arguments as the tool_use input object. Text that is not a JSON object becomes
 * {"arguments": text}, which the encoder renders back exactly as it rendered the raw text
 * (spec chat-format.md §2.8), so the round trip keeps what the model wrote. */
static json_t *call_input(const char *args) {
    json_error_t je;
    json_t *v = json_loads(args, JSON_DECODE_ANY, &je);
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_pack("{s:o}", "arguments", str_n(args, strlen(args)));
}

/* ==== the Message ========================================================================= */

static json_t *message(const srv_meta *m, json_t *content, const char *stop_reason, const char *stop_sequence,
                       const srv_usage *u) {
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", m->id, "type", "message", "role", "assistant", "model",
                          m->model ? m->model : "dsflash", "content", content);
    json_object_set_new(o, "stop_reason", stop_reason ? json_string(stop_reason) : json_null());
    json_object_set_new(o, "stop_sequence", stop_sequence ? str_n(stop_sequence, strlen(stop_sequence)) : json_null());
    json_object_set_new(o, "stop_details", json_null());
    json_object_set_new(o, "container", json_null());
    json_object_set_new(o, "diagnostics", json_null());
    json_object_set_new(o, "usage", srv_msg_usage(u, false));
    return o;
}

json_t *srv_msg_reply(const srv_meta *m, const dsf_dsml_result *r, char ids[][32], const char *stop_reason,
                      const char *stop_sequence, const srv_usage *u, bool parallel) {
    json_t *content = json_array();
    if (r->reasoning_len) {
        char sig[24];
        srv_msg_sig_text(srv_msg_sig_update(SRV_MSG_SIG0, r->reasoning, r->reasoning_len), sig);
        json_array_append_new(content, thinking_block(r->reasoning, r->reasoning_len, sig));
    }
    if (r->content_len) json_array_append_new(content, text_block(r->content, r->content_len));
    int n_calls = parallel || r->n_calls < 1 ? r->n_calls : 1;
    for (int i = 0; i < n_calls; i++) {
        char tid[32];
        srv_msg_tool_id(tid, ids[i]);
        json_array_append_new(content, tool_block(tid, r->calls[i].name, call_input(r->calls[i].arguments)));
    }
    return message(m, content, stop_reason, stop_sequence, u);
}

/* ==== stream events ======================================================================= */

json_t *srv_msg_ev_message_start(const srv_meta *m, const srv_usage *u) {
    return json_pack("{s:s,s:o}", "type", "message_start", "message", message(m, json_array(), NULL, NULL, u));
}

json_t *srv_msg_ev_block_start(int index, const char *type, const char *id, const char *name) {
    json_t *block = !strcmp(type, "thinking") ? thinking_block("", 0, "")
                    : !strcmp(type, "text")   ? text_block("", 0)
                                              : tool_block(id ? id : "", name ? name : "", json_object());
    return json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", index, "content_block", block);
}

json_t *srv_msg_ev_block_delta(int index, const char *dtype, const char *text, size_t len) {
    const char *field = !strcmp(dtype, "text_delta")        ? "text"
                        : !strcmp(dtype, "thinking_delta")  ? "thinking"
                        : !strcmp(dtype, "signature_delta") ? "signature"
                                                            : "partial_json";
    return json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index", index, "delta", "type", dtype,
                     field, str_n(text, len));
}

json_t *srv_msg_ev_block_stop(int index) {
    return json_pack("{s:s,s:i}", "type", "content_block_stop", "index", index);
}

json_t *srv_msg_ev_message_delta(const char *stop_reason, const char *stop_sequence, const srv_usage *u) {
    json_t *d = json_pack("{s:s,s:o,s:n,s:n}", "stop_reason", stop_reason, "stop_sequence",
                          stop_sequence ? str_n(stop_sequence, strlen(stop_sequence)) : json_null(), "stop_details",
                          "container");
    return json_pack("{s:s,s:o,s:o}", "type", "message_delta", "delta", d, "usage", srv_msg_usage(u, true));
}

void srv_msg_sse(dsf_buf *b, json_t *ev) {
    const char *type = json_string_value(json_object_get(ev, "type"));
    char *s = json_dumps(ev, JSON_COMPACT);
    dsf_buf_appendf(b, "event: %s\ndata: %s\n\n", type ? type : "message", s ? s : "{}");
    free(s);
    json_decref(ev);
}
