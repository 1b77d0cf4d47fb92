/* server_resp.c: OpenAI's Responses API on `dsflash serve` (the srv_api table
 * srv_api_responses, and GET|DELETE /v1/responses/{id}): the request mapped by responses.c
 * onto the chat path (srv_parse_json), the stream that turns the generation's DSML events
 * into Responses events (response.created ... response.completed, sequence_number 0, 1, ...),
 * the non-streaming Response, the reasoning-token count, and the store behind "store" and
 * previous_response_id (store.c: each stored response keeps its whole conversation, so a
 * follow-up renders the same prefix and the slots' prefix reuse serves it from the cache).
 * Must not: touch sockets or the engine; hold srv->mu. The JSON shapes are responses.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "server/responses.h"
#include "server/server_int.h"

#define ID_PREFIX "resp_"

typedef enum { OPEN_NONE = 0, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL } open_kind;

/* A request's own state (srv_req.api_data). */
typedef struct {
    resp_request rq; /* echo, conv and store (rq.chat is dropped once parsed) */
    /* the stream (stream_begin on the connection thread before the job is queued, then the
     * scheduler thread) */
    int seq;              /* the next sequence_number */
    json_t *items;        /* output items done, in order */
    open_kind open;       /* the item being streamed */
    int open_call;        /* its DSML call index (OPEN_CALL) */
    char open_id[64];
    char *open_name, *open_ns;
    dsf_buf text;         /* its text or arguments so far */
    /* reasoning tokens: counted while the output is inside the reasoning (scheduler) */
    bool in_reasoning;
    char tail[32];        /* the last bytes of the output, to see the reasoning end */
    size_t tail_len;
    int reasoning_tokens;
} resp_job;

static void resp_job_free(void *p) {
    resp_job *rj = p;
    if (!rj) return;
    resp_request_free(&rj->rq);
    json_decref(rj->items);
    dsf_buf_free(&rj->text);
    free(rj->open_name);
    free(rj->open_ns);
    free(rj);
}

static resp_job *state(job *j) { return j->req.api_data; }
static const char *rid_of(const job *j) { return j->meta.id + strlen(ID_PREFIX); }

/* ==== the request ========================================================================= */

/* The conversation of previous_response_id (404 when unknown or evicted). */
static int load_history(srv_server *s, const json_t *b, json_t **hist, srv_error *e) {
    const json_t *prev = json_object_get(b, "previous_response_id");
    *hist = NULL;
    if (!prev || json_is_null(prev)) return 0;
    if (!pyjson_is_str(prev))
        return srv_fail(e, 400, "previous_response_id", "invalid_type", "'previous_response_id' must be a string");
    const char *id = json_string_value(prev);
    size_t n = 0;
    char *txt = srv_store_get(s->store, id, &n);
    json_t *st = txt ? json_loadb(txt, n, 0, NULL) : NULL;
    free(txt);
    const json_t *conv = json_object_get(st, "conversation");
    if (!json_is_array(conv)) {
        json_decref(st);
        srv_fail(e, 404, "previous_response_id", "previous_response_not_found",
                 "Previous response with id '%.200s' not found.", id);
        e->type = "invalid_request_error";
        return -1;
    }
    *hist = json_incref((json_t *)conv);
    json_decref(st);
    return 0;
}

/* The chat parse names chat fields; name the Responses ones instead. */
static void rename_param(srv_error *e) {
    if (!strcmp(e->param, "messages")) snprintf(e->param, sizeof e->param, "input");
    else if (!strcmp(e->param, "max_tokens")) snprintf(e->param, sizeof e->param, "max_output_tokens");
    else if (!strcmp(e->param, "response_format")) snprintf(e->param, sizeof e->param, "text.format");
}

static int resp_parse(srv_server *s, const char *body, size_t len, srv_req *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = SRV_RESPONSES;
    char err[DSF_ERR_LEN] = "";
    json_t *b = pyjson_loads(body, len, err);
    if (!b) return srv_fail(e, 400, NULL, "invalid_json", "invalid JSON body: %s", err);
    json_t *hist = NULL;
    resp_request rq;
    int rc = -1;
    if (!json_is_object(b)) {
        srv_fail(e, 400, NULL, "invalid_type", "request body must be a JSON object");
        goto done;
    }
    if (load_history(s, b, &hist, e) || resp_map_request(b, hist, &rq, e)) goto done;
    if (srv_parse_json(SRV_CHAT, rq.chat, s->tok, s->n_ctx, out, e)) {
        rename_param(e);
        resp_request_free(&rq);
        out->kind = SRV_RESPONSES;
        goto done;
    }
    out->kind = SRV_RESPONSES;
    json_decref(rq.chat);
    rq.chat = NULL;
    /* the effective sampling values where the request left them out */
    if (json_is_null(json_object_get(rq.echo, "temperature")))
        json_object_set_new(rq.echo, "temperature", json_real(out->temperature));
    if (json_is_null(json_object_get(rq.echo, "top_p"))) json_object_set_new(rq.echo, "top_p", json_real(out->top_p));
    resp_job *rj = dsf_xcalloc(1, sizeof *rj);
    rj->rq = rq;
    rj->items = json_array();
    rj->in_reasoning = out->gen_reasoning;
    out->api_data = rj;
    out->api_free = resp_job_free;
    rc = 0;
done:
    json_decref(hist);
    json_decref(b);
    return rc;
}

/* ==== the reasoning-token count (scheduler) =============================================== */

/* Counts the tokens sampled while the output is inside the reasoning: up to and including
 * the one that completes "</think>" (or a tool call's start, which also ends it). */
static void resp_token(srv_server *s, job *j, const dsf_gen_token *t) {
    (void)s;
    resp_job *rj = state(j);
    if (!rj->in_reasoning) return;
    rj->reasoning_tokens++;
    for (size_t i = 0; i < t->piece_len; i++) {
        if (rj->tail_len == sizeof rj->tail) {
            memmove(rj->tail, rj->tail + 1, sizeof rj->tail - 1);
            rj->tail_len--;
        }
        rj->tail[rj->tail_len++] = t->piece[i];
    }
    static const char *const ends[] = {"</think>", "<\xef\xbd\x9c" "DSML\xef\xbd\x9c"};
    for (int k = 0; k < 2; k++)
        if (memmem(rj->tail, rj->tail_len, ends[k], strlen(ends[k]))) rj->in_reasoning = false;
}

/* ==== the stream (scheduler) ============================================================== */

static void emit(resp_job *rj, dsf_buf *out, json_t *ev) { resp_event(out, ev, &rj->seq); }

/* An item-scoped event {type, item_id, output_index} (+ content_index when >= 0). */
static json_t *item_event(resp_job *rj, const char *type, int content_index) {
    json_t *ev = json_pack("{s:s,s:s,s:i}", "type", type, "item_id", rj->open_id, "output_index",
                           (int)json_array_size(rj->items));
    if (content_index >= 0) json_object_set_new(ev, "content_index", json_integer(content_index));
    return ev;
}

static void open_item(resp_job *rj, job *j, open_kind k, const dsf_dsml_event *ev, dsf_buf *out) {
    int index = (int)json_array_size(rj->items);
    json_t *item, *part = NULL;
    rj->open = k;
    rj->text.len = 0;
    if (k == OPEN_REASONING) {
        resp_item_id(rj->open_id, "rs", rid_of(j), -1);
        item = json_pack("{s:s,s:s,s:[],s:[],s:s}", "id", rj->open_id, "type", "reasoning", "summary", "content",
                         "status", "in_progress");
        part = json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "");
    } else if (k == OPEN_MESSAGE) {
        resp_item_id(rj->open_id, "msg", rid_of(j), -1);
        item = json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", rj->open_id, "type", "message", "role", "assistant", "status",
                         "in_progress", "content");
        part = json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", "", "annotations");
    } else {
        rj->open_call = ev->index;
        resp_item_id(rj->open_id, "fc", rid_of(j), ev->index);
        free(rj->open_name);
        free(rj->open_ns);
        rj->open_name = dsf_xstrdup(ev->name ? ev->name : "");
        rj->open_ns = ev->ns ? dsf_xstrdup(ev->ns) : NULL;
        item = resp_item_call(rj->open_id, srv_job_call_id(j, ev->index), rj->open_name, rj->open_ns, "", 0,
                              "in_progress");
    }
    emit(rj, out, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index", index, "item", item));
    if (part) {
        json_t *pe = item_event(rj, "response.content_part.added", 0);
        json_object_set_new(pe, "part", part);
        emit(rj, out, pe);
    }
}

/* Ends the open item with its .done events; the item joins rj->items. */
static void close_item(resp_job *rj, job *j, const char *status, dsf_buf *out) {
    if (rj->open == OPEN_NONE) return;
    const char *t = rj->text.data ? (const char *)rj->text.data : "";
    size_t n = rj->text.len;
    json_t *item, *ev;
    if (rj->open == OPEN_REASONING || rj->open == OPEN_MESSAGE) {
        bool rs = rj->open == OPEN_REASONING;
        item = rs ? resp_item_reasoning(rj->open_id, t, n, status) : resp_item_message(rj->open_id, t, n, status);
        json_t *part = json_array_get(json_object_get(item, "content"), 0);
        ev = item_event(rj, rs ? "response.reasoning_text.done" : "response.output_text.done", 0);
        json_object_set(ev, "text", json_object_get(part, "text"));
        if (!rs) json_object_set_new(ev, "logprobs", json_array());
        emit(rj, out, ev);
        ev = item_event(rj, "response.content_part.done", 0);
        json_object_set(ev, "part", part);
        emit(rj, out, ev);
    } else {
        item = resp_item_call(rj->open_id, srv_job_call_id(j, rj->open_call), rj->open_name, rj->open_ns, t, n, status);
        ev = item_event(rj, "response.function_call_arguments.done", -1);
        json_object_set(ev, "arguments", json_object_get(item, "arguments"));
        emit(rj, out, ev);
    }
    emit(rj, out, json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index",
                            (int)json_array_size(rj->items), "item", item));
    json_array_append_new(rj->items, item);
    rj->open = OPEN_NONE;
}

/* A text delta of the open reasoning / message item, or the open call's arguments. */
static void delta(resp_job *rj, const dsf_dsml_event *ev, dsf_buf *out) {
    static const char *const type[] = {NULL, "response.reasoning_text.delta", "response.output_text.delta",
                                       "response.function_call_arguments.delta"};
    /* the parser's text deltas are valid UTF-8; keep what jansson accepts regardless */
    json_t *d = json_stringn(ev->text, ev->len);
    if (!d) return;
    dsf_buf_append(&rj->text, ev->text, ev->len);
    json_t *e = item_event(rj, type[rj->open], rj->open == OPEN_CALL ? -1 : 0);
    json_object_set_new(e, "delta", d);
    if (rj->open == OPEN_MESSAGE) json_object_set_new(e, "logprobs", json_array());
    emit(rj, out, e);
}

static void resp_dsml(srv_server *s, job *j, const dsf_dsml_event *ev, dsf_buf *out) {
    (void)s;
    resp_job *rj = state(j);
    bool first_only = !j->req.parallel_tool_calls;
    switch (ev->type) {
    case DSF_DSML_REASONING:
    case DSF_DSML_CONTENT: {
        if (!ev->len) return;
        open_kind k = ev->type == DSF_DSML_REASONING ? OPEN_REASONING : OPEN_MESSAGE;
        if (rj->open != k) {
            close_item(rj, j, "completed", out);
            open_item(rj, j, k, ev, out);
        }
        delta(rj, ev, out);
        return;
    }
    case DSF_DSML_TOOL_START:
        if (first_only && ev->index > 0) return;
        close_item(rj, j, "completed", out);
        open_item(rj, j, OPEN_CALL, ev, out);
        return;
    case DSF_DSML_TOOL_ARGS:
        if (rj->open == OPEN_CALL && rj->open_call == ev->index && ev->len) delta(rj, ev, out);
        return;
    default: /* DSF_DSML_TOOL_END */
        if (rj->open == OPEN_CALL && rj->open_call == ev->index) close_item(rj, j, "completed", out);
        return;
    }
}

static void resp_begin(srv_server *s, job *j, dsf_buf *out) {
    (void)s;
    resp_job *rj = state(j);
    json_t *r = resp_object(&j->meta, rj->rq.echo, "in_progress", NULL, NULL, NULL, NULL);
    emit(rj, out, json_pack("{s:s,s:O}", "type", "response.created", "response", r));
    emit(rj, out, json_pack("{s:s,s:o}", "type", "response.in_progress", "response", r));
}

/* ==== completion (scheduler) ============================================================== */

/* Keeps the response and its whole conversation (input items, then output items) for GET
 * and previous_response_id. */
static void store_response(srv_server *s, job *j, const json_t *r, const json_t *output) {
    resp_job *rj = state(j);
    if (!rj->rq.store) return;
    json_array_extend(rj->rq.conv, (json_t *)output);
    json_t *rec = json_pack("{s:O,s:O}", "response", r, "conversation", rj->rq.conv);
    char *txt = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (txt && !srv_store_put(s->store, j->meta.id, txt, strlen(txt)))
        dsf_log(1, "serve: response %s (%zu bytes) exceeds --store-mb: not stored", j->meta.id, strlen(txt));
    free(txt);
}

static resp_usage usage_of(const job *j, const srv_usage *u) {
    resp_job *rj = j->req.api_data;
    resp_usage ru = {u->prompt_tokens, u->cached_tokens, u->completion_tokens, rj->reasoning_tokens};
    if (ru.reasoning > ru.output) ru.reasoning = ru.output;
    return ru;
}

static void resp_end(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u, const char *err,
                     dsf_buf *out) {
    resp_job *rj = state(j);
    bool length = !err && res->finish == DSF_FINISH_LENGTH;
    close_item(rj, j, length ? "incomplete" : "completed", out);
    resp_usage ru = usage_of(j, u);
    const char *status = err ? "failed" : length ? "incomplete" : "completed";
    json_t *r = resp_object(&j->meta, rj->rq.echo, status, json_incref(rj->items), &ru,
                            length ? "max_output_tokens" : NULL, err);
    if (!err) store_response(s, j, r, rj->items);
    char type[32];
    snprintf(type, sizeof type, "response.%s", status);
    emit(rj, out, json_pack("{s:s,s:o}", "type", type, "response", r));
}

static char *resp_reply(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u) {
    resp_job *rj = state(j);
    for (int i = 0; i < res->dsml.n_calls; i++) srv_job_call_id(j, i);
    bool length = res->finish == DSF_FINISH_LENGTH;
    json_t *output = resp_output(&res->dsml, rid_of(j), j->ids, j->req.parallel_tool_calls,
                                 length ? "incomplete" : "completed");
    resp_usage ru = usage_of(j, u);
    json_t *r = resp_object(&j->meta, rj->rq.echo, length ? "incomplete" : "completed", json_incref(output), &ru,
                            length ? "max_output_tokens" : NULL, NULL);
    store_response(s, j, r, output);
    json_decref(output);
    char *body = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    return body;
}

const srv_api srv_api_responses = {
    .id_prefix = ID_PREFIX,
    .parse = resp_parse,
    .stream_begin = resp_begin,
    .stream_dsml = resp_dsml,
    .stream_end = resp_end,
    .reply = resp_reply,
    .error_body = srv_error_json,
    .on_token = resp_token,
};

/* ==== GET / DELETE /v1/responses/{id} (connection threads) ================================ */

char *srv_resp_lookup(srv_server *s, const char *id, bool del, srv_error *e) {
    if (del) {
        if (srv_store_del(s->store, id)) {
            json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1);
            char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
            json_decref(o);
            if (body) return body;
        }
    } else {
        size_t n = 0;
        char *txt = srv_store_get(s->store, id, &n);
        json_t *st = txt ? json_loadb(txt, n, 0, NULL) : NULL;
        free(txt);
        const json_t *r = json_object_get(st, "response");
        char *body = r ? json_dumps(r, JSON_COMPACT) : NULL;
        json_decref(st);
        if (body) return body;
    }
    srv_fail(e, 404, "response_id", "not_found", "Response with id '%.200s' not found.", id);
    e->type = "invalid_request_error";
    return NULL;
}
