/* server_oai.c: the OpenAI wire format of /v1/chat/completions and /v1/completions (the
 * srv_api tables of server_int.h): the request mapping (srv_parse_request), the SSE chunks
 * (a chat stream's role chunk, text / DSML deltas with their logprobs, the finish and usage
 * chunks, "[DONE]") and the non-streaming reply.
 * Must not: touch sockets or the engine; hold srv->mu (the caller appends the bytes).
 * The JSON shapes themselves are built by server_api.c (pure, unit-tested). */
#include <stdlib.h>

#include "server/server_int.h"

const char *srv_finish_reason(const dsf_gen_result *res) {
    if (res->finish == DSF_FINISH_LENGTH) return "length";
    return res->has_dsml && res->dsml.n_calls > 0 ? "tool_calls" : "stop";
}

static int parse_chat(srv_server *s, const char *body, size_t len, srv_req *out, srv_error *e) {
    return srv_parse_request(SRV_CHAT, body, len, s->tok, s->n_ctx, out, e);
}

static int parse_completion(srv_server *s, const char *body, size_t len, srv_req *out, srv_error *e) {
    return srv_parse_request(SRV_COMPLETION, body, len, s->tok, s->n_ctx, out, e);
}

static void sse(dsf_buf *out, json_t *chunk) {
    srv_sse_json(out, chunk);
    json_decref(chunk);
}

/* Attaches the logprobs of the tokens not yet sent to a stream chunk's choice. */
static void attach_logprobs(srv_server *s, job *j, json_t *choice) {
    if (j->req.logprobs < 0 || j->lp_sent >= j->n_lp) return;
    int n = j->n_lp - j->lp_sent;
    json_t *lp = j->req.kind == SRV_CHAT ? srv_chat_logprobs(j->lp + j->lp_sent, n, s->tok)
                                         : srv_completion_logprobs(j->lp + j->lp_sent, n, s->tok, j->text_off);
    if (j->req.kind != SRV_CHAT)
        for (int i = j->lp_sent; i < j->n_lp; i++) {
            size_t len = 0;
            if (dsf_token_bytes(s->tok, j->lp[i].id, &len)) j->text_off += len;
        }
    json_object_set_new(choice, "logprobs", lp);
    j->lp_sent = j->n_lp;
}

/* The role chunk goes first, before the slot can produce anything. */
static void chat_begin(srv_server *s, job *j, dsf_buf *out) {
    (void)s;
    json_t *choice;
    json_t *ch = srv_chunk(&j->meta, SRV_CHAT, &choice);
    json_t *delta = json_object_get(choice, "delta");
    json_object_set_new(delta, "role", json_string("assistant"));
    json_object_set_new(delta, "content", json_string(""));
    sse(out, ch);
}

static void completion_text(srv_server *s, job *j, const char *text, size_t len, dsf_buf *out) {
    json_t *choice;
    json_t *ch = srv_chunk(&j->meta, SRV_COMPLETION, &choice);
    json_t *tx = json_stringn(text, len);
    json_object_set_new(choice, "text", tx ? tx : json_string(""));
    attach_logprobs(s, j, choice);
    sse(out, ch);
}

static void chat_dsml(srv_server *s, job *j, const dsf_dsml_event *ev, dsf_buf *out) {
    const char *id = NULL;
    if (ev->type == DSF_DSML_TOOL_START || ev->type == DSF_DSML_TOOL_ARGS) id = srv_job_call_id(j, ev->index);
    json_t *ch = srv_dsml_chunk(&j->meta, ev, id, j->req.parallel_tool_calls);
    if (!ch) return;
    attach_logprobs(s, j, json_array_get(json_object_get(ch, "choices"), 0));
    sse(out, ch);
}

static void oai_end(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u, const srv_error *err,
                    dsf_buf *out) {
    if (err) {
        char *body = srv_error_json(err);
        dsf_buf_appendf(out, "data: %s\n\n", body);
        free(body);
    } else {
        json_t *choice;
        json_t *ch = srv_chunk(&j->meta, j->req.kind, &choice);
        json_object_set_new(choice, "finish_reason", json_string(srv_finish_reason(res)));
        attach_logprobs(s, j, choice);
        sse(out, ch);
        if (j->req.include_usage) sse(out, srv_usage_chunk(&j->meta, j->req.kind, u));
    }
    dsf_buf_append(out, "data: [DONE]\n\n", 14);
}

static char *oai_reply(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u) {
    const srv_tokprob *lp = j->req.logprobs >= 0 ? j->lp : NULL;
    const char *finish = srv_finish_reason(res);
    json_t *reply;
    if (j->req.kind == SRV_CHAT) {
        for (int i = 0; i < res->dsml.n_calls; i++) srv_job_call_id(j, i);
        reply = srv_chat_reply(&j->meta, &res->dsml, j->ids, finish, u, lp, j->n_lp, s->tok, j->req.parallel_tool_calls);
    } else {
        reply = srv_completion_reply(&j->meta, res->text, res->text_len, finish, u, lp, j->n_lp, s->tok);
    }
    char *body = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    return body;
}

static const srv_api api_chat = {"chatcmpl-", parse_chat, chat_begin, NULL, chat_dsml, oai_end, oai_reply,
                                 srv_error_json, 503, NULL};
static const srv_api api_completion = {"cmpl-", parse_completion, NULL, completion_text, NULL, oai_end, oai_reply,
                                       srv_error_json, 503, NULL};

const srv_api *srv_api_of(srv_kind kind) {
    switch (kind) {
    case SRV_CHAT: return &api_chat;
    case SRV_MESSAGES: return &srv_api_messages;
    case SRV_RESPONSES: return &srv_api_responses;
    default: return &api_completion;
    }
}
