/* server_msg_api.c: the srv_api table of POST /v1/messages (Anthropic Messages): the request
 * parse, the non-streaming Message and the stream's event sequence, built from the DSML
 * events of the generation:
 *   message_start (once the prompt is prefilled, so that its usage reports the cached
 *   tokens), ping, then per content block content_block_start / content_block_delta... /
 *   content_block_stop (thinking: thinking_delta, then signature_delta before its stop; text:
 *   text_delta; tool_use: input_json_delta with partial_json), then message_delta (stop_reason,
 *   stop_sequence, usage) and message_stop. A failure after the start is an `error` event.
 * The connection's SSE keep-alive comments stay as they are: the SDK's SSE reader skips
 * comment lines (core/streaming.js), and they are legal SSE.
 * Must not: touch sockets or the engine; hold srv->mu (the scheduler appends the bytes).
 * State: one msg_stream per streaming job (j->api_state, freed with the job), touched only
 * on the scheduler thread. */
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"
#include "server/server_msg.h"

typedef enum { B_NONE = 0, B_THINKING, B_TEXT, B_TOOL } block_kind;

typedef struct {
    bool started;    /* message_start sent */
    int n_blocks;    /* content blocks started */
    block_kind open; /* the block now open */
    int tool;        /* B_TOOL: the DSML index of its call */
    uint64_t sig;    /* the signature hash of the open thinking block */
} msg_stream;

static msg_stream *stream_of(job *j) {
    if (!j->api_state) j->api_state = dsf_xcalloc(1, sizeof(msg_stream));
    return j->api_state;
}

static int parse_messages(srv_server *s, const char *body, size_t len, srv_req *out, srv_error *e) {
    return srv_msg_parse(body, len, s->tok, s->n_ctx, false, out, e);
}

/* message_start and the first ping, once. */
static void ensure_started(job *j, msg_stream *st, const srv_usage *u, dsf_buf *out) {
    if (st->started) return;
    st->started = true;
    srv_msg_sse(out, srv_msg_ev_message_start(&j->meta, u));
    static const char ping[] = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
    dsf_buf_append(out, ping, sizeof ping - 1);
}

static void close_block(msg_stream *st, dsf_buf *out) {
    if (st->open == B_NONE) return;
    int index = st->n_blocks - 1;
    if (st->open == B_THINKING) {
        char sig[24];
        srv_msg_sig_text(st->sig, sig);
        srv_msg_sse(out, srv_msg_ev_block_delta(index, "signature_delta", sig, strlen(sig)));
    }
    srv_msg_sse(out, srv_msg_ev_block_stop(index));
    st->open = B_NONE;
}

static void open_block(msg_stream *st, block_kind k, const char *id, const char *name, dsf_buf *out) {
    close_block(st, out);
    static const char *const types[] = {"", "thinking", "text", "tool_use"};
    srv_msg_sse(out, srv_msg_ev_block_start(st->n_blocks++, types[k], id, name));
    st->open = k;
    st->sig = SRV_MSG_SIG0;
}

static void msg_dsml(srv_server *s, job *j, const dsf_dsml_event *ev, dsf_buf *out) {
    (void)s;
    msg_stream *st = stream_of(j);
    srv_usage u = {.prompt_tokens = j->req.n_prompt, .cached_tokens = j->n_cached};
    ensure_started(j, st, &u, out);
    bool text = ev->type == DSF_DSML_REASONING || ev->type == DSF_DSML_CONTENT;
    if (text && !ev->len) return;
    if (!text && !j->req.parallel_tool_calls && ev->index > 0) return; /* only the first call is kept */
    int index = st->n_blocks - 1;
    switch (ev->type) {
    case DSF_DSML_REASONING:
        if (st->open != B_THINKING) open_block(st, B_THINKING, NULL, NULL, out), index = st->n_blocks - 1;
        st->sig = srv_msg_sig_update(st->sig, ev->text, ev->len);
        srv_msg_sse(out, srv_msg_ev_block_delta(index, "thinking_delta", ev->text, ev->len));
        break;
    case DSF_DSML_CONTENT:
        if (st->open != B_TEXT) open_block(st, B_TEXT, NULL, NULL, out), index = st->n_blocks - 1;
        srv_msg_sse(out, srv_msg_ev_block_delta(index, "text_delta", ev->text, ev->len));
        break;
    case DSF_DSML_TOOL_START: {
        char tid[32];
        srv_msg_tool_id(tid, srv_job_call_id(j, ev->index));
        open_block(st, B_TOOL, tid, ev->name, out);
        st->tool = ev->index;
        break;
    }
    case DSF_DSML_TOOL_ARGS:
        if (st->open == B_TOOL && st->tool == ev->index && ev->len)
            srv_msg_sse(out, srv_msg_ev_block_delta(index, "input_json_delta", ev->text, ev->len));
        break;
    default: /* DSF_DSML_TOOL_END */
        if (st->open == B_TOOL && st->tool == ev->index) close_block(st, out);
        break;
    }
}

/* The stop string that matched, or NULL. */
static const char *stop_sequence(const job *j, const dsf_gen_result *res) {
    return res->stop_index >= 0 && res->stop_index < j->req.n_stop ? j->req.stop[res->stop_index] : NULL;
}

static int kept_calls(const job *j, const dsf_gen_result *res) {
    int n = res->has_dsml ? res->dsml.n_calls : 0;
    return !j->req.parallel_tool_calls && n > 1 ? 1 : n;
}

static void msg_end(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u, const srv_error *err,
                    dsf_buf *out) {
    (void)s;
    msg_stream *st = stream_of(j);
    if (err) {
        char *body = srv_msg_error_json(err);
        dsf_buf_appendf(out, "event: error\ndata: %s\n\n", body);
        free(body);
        return;
    }
    ensure_started(j, st, u, out);
    close_block(st, out);
    srv_msg_sse(out, srv_msg_ev_message_delta(srv_msg_stop_reason(res, kept_calls(j, res), j->req.max_tokens), stop_sequence(j, res), u));
    static const char stop[] = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    dsf_buf_append(out, stop, sizeof stop - 1);
}

static char *msg_reply(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u) {
    (void)s;
    for (int i = 0; i < res->dsml.n_calls; i++) srv_job_call_id(j, i);
    json_t *r = srv_msg_reply(&j->meta, &res->dsml, j->ids, srv_msg_stop_reason(res, kept_calls(j, res), j->req.max_tokens),
                              stop_sequence(j, res), u, j->req.parallel_tool_calls);
    char *body = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    return body;
}

const srv_api srv_api_messages = {
    .id_prefix = "msg_",
    .parse = parse_messages,
    .stream_dsml = msg_dsml,
    .stream_end = msg_end,
    .reply = msg_reply,
    .error_body = srv_msg_error_json,
    .busy_status = 529, /* the SDK's OverloadedError (core/error.js) */
};
