/* server_msg.h: the Anthropic Messages API of `dsflash serve` (POST /v1/messages and
 * /v1/messages/count_tokens), pure halves: the request mapped onto the one internal request
 * (a chat-completions body, server_msg.c) and the reply / stream event JSON in the shapes of
 * @anthropic-ai/sdk 1.17.0 (server_msg_reply.c). No sockets, no engine; unit-tested without a
 * model. The srv_api table that streams a job through these is server_msg_api.c.
 *
 * Mapping decisions (documented for clients in README.md "Agent clients"):
 *   - thinking {type: "enabled", budget_tokens B} -> thinking mode with the V4.1 effort of
 *     srv_msg_effort(B); {type: "adaptive"} -> thinking mode, default effort (75);
 *     {type: "disabled"} or no thinking -> chat mode (Anthropic's default is no thinking).
 *     output_config.effort (low/medium/high/xhigh/max) overrides the budget's level.
 *   - tool_result with is_error: true -> the tool message "Error: " + its text.
 *   - usage.input_tokens = prompt tokens not reused from the cache; cache_read_input_tokens =
 *     the reused ones (their sum is the prompt, as Anthropic counts).
 *   - tool_use ids are "toolu_" + the call id's random part; thinking signatures are an
 *     opaque hash of the thinking text; any signature is accepted back (and ignored). */
#ifndef DSF_SERVER_MSG_H
#define DSF_SERVER_MSG_H

#include "server/server.h"

/* ==== requests (server_msg.c) ============================================================= */

/* The V4.1 effort name for a thinking budget: < 4096 -> "low" (50), < 16384 -> "high" (75),
 * else "max" (100). */
const char *srv_msg_effort(long long budget_tokens);

/* Maps a Messages body onto the chat-completions body that server_api.c parses: system ->
 * a leading system message, consecutive same-role turns merged, tool_use -> tool_calls,
 * tool_result -> tool messages, thinking -> reasoning_content, tools / tool_choice /
 * disable_parallel_tool_use / thinking / output_config / stop_sequences / sampling onto their
 * chat keys. count: a count_tokens body (no max_tokens). Returns a new object, or NULL with
 * a 400 in e naming the field ("messages.1.content.0: ..."). */
json_t *srv_msg_to_chat(const json_t *body, bool count, srv_error *e);

/* Parses a Messages body into *out (kind SRV_MESSAGES): srv_msg_to_chat, then the chat path
 * (rendering, tokenization). The prompt must fit n_ctx (count: no limit); max_tokens may
 * exceed what is left, the generation then stops when the context is full. 0, or -1 with e. */
int srv_msg_parse(const char *body, size_t len, const dsf_tokenizer *tok, int n_ctx, bool count, srv_req *out,
                  srv_error *e);

/* count_tokens: {"input_tokens": N} (malloc'ed JSON), N the prompt tokens the same body
 * renders to in a generation; NULL with e. */
char *srv_msg_count_json(const char *body, size_t len, const dsf_tokenizer *tok, srv_error *e);

/* ==== replies and stream events (server_msg_reply.c) ====================================== */

/* Anthropic's error type for an HTTP status (400 invalid_request_error, 401
 * authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
 * 429 rate_limit_error, 503 / 529 overloaded_error, other 5xx api_error). */
const char *srv_msg_error_type(int status);
/* {"type": "error", "error": {"type", "message"}} (malloc'ed). */
char *srv_msg_error_json(const srv_error *e);

/* stop_reason: max_tokens (max_tokens tokens were generated), model_context_window_exceeded
 * (the context filled up first), tool_use (calls), stop_sequence (a stop string matched),
 * end_turn. n_calls: the tool calls the reply carries; max_tokens: the request's. */
const char *srv_msg_stop_reason(const dsf_gen_result *res, int n_calls, int max_tokens);
/* "toolu_" + the random part of an OpenAI-style call id ("call_..."). */
void srv_msg_tool_id(char out[32], const char *call_id);
/* The thinking signature: FNV-1a 64 over the thinking text, continued from h (start with
 * SRV_MSG_SIG0), and its text form "dsf1:<16 hex>". */
#define SRV_MSG_SIG0 0xcbf29ce484222325ull
uint64_t srv_msg_sig_update(uint64_t h, const char *text, size_t len);
void srv_msg_sig_text(uint64_t h, char out[24]);

/* usage: input_tokens (uncached), output_tokens, cache_read_input_tokens,
 * cache_creation_input_tokens 0 and the SDK's nullable fields. delta: the message_delta form. */
json_t *srv_msg_usage(const srv_usage *u, bool delta);
/* The non-streaming Message: content [thinking?, text?, tool_use...] from the parsed output
 * (tool ids from ids[i]; only the first call when !parallel), stop_reason, stop_sequence
 * (NULL: null), usage. */
json_t *srv_msg_reply(const srv_meta *m, const dsf_dsml_result *r, char ids[][32], const char *stop_reason,
                      const char *stop_sequence, const srv_usage *u, bool parallel);

/* Stream events (each an object with its "type"): */
json_t *srv_msg_ev_message_start(const srv_meta *m, const srv_usage *u);
/* content_block_start: type "thinking", "text" or "tool_use" (id, name; input {}). */
json_t *srv_msg_ev_block_start(int index, const char *type, const char *id, const char *name);
/* content_block_delta: dtype text_delta / thinking_delta / input_json_delta / signature_delta
 * with its field (text / thinking / partial_json / signature) = text[0..len). */
json_t *srv_msg_ev_block_delta(int index, const char *dtype, const char *text, size_t len);
json_t *srv_msg_ev_block_stop(int index);
json_t *srv_msg_ev_message_delta(const char *stop_reason, const char *stop_sequence, const srv_usage *u);
/* Appends "event: <data.type>\ndata: <compact json>\n\n" and drops the reference to ev. */
void srv_msg_sse(dsf_buf *b, json_t *ev);

#endif
