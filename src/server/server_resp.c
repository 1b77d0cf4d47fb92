/* server_resp.c: OpenAI's Responses API on `dsflash serve` (the srv_api table
 * srv_api_responses, and GET|DELETE /v1/responses/{id}): the request mapped by responses.c
 * onto the chat path (srv_parse_json), the job's stream (responses.c's resp_stream turns the
 * generation's DSML events into Responses events), the non-streaming Response, the
 * reasoning-token count (per sampled token), and the store behind "store" and
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

/* A request's own state (srv_req.api_data). */
typedef struct {
    resp_request rq; /* echo, conv and store (rq.chat is dropped once parsed) */
    /* the stream and the reasoning-token count: stream_begin on the connection thread before
     * the job is queued, then the scheduler thread */
    resp_stream st;
} resp_job;

static void resp_job_free(void *p) {
    resp_job *rj = p;
    if (!rj) return;
    resp_request_free(&rj->rq);
    resp_stream_free(&rj->st);
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

/* Replaces the first "'from'" in the message by "'to'". */
static void rename_quoted(srv_error *e, const char *from, const char *to) {
    char q[64];
    snprintf(q, sizeof q, "'%s'", from);
    char *at = strstr(e->message, q);
    if (!at) return;
    char rest[DSF_ERR_LEN];
    snprintf(rest, sizeof rest, "%s", at + strlen(q));
    snprintf(at, sizeof e->message - (size_t)(at - e->message), "'%s'%s", to, rest);
}

/* The chat parse names chat fields; name the Responses ones instead (the field and the message). */
static void rename_param(srv_error *e) {
    static const char *const names[][2] = {{"messages", "input"}, {"max_tokens", "max_output_tokens"},
                                           {"response_format", "text.format"}};
    for (int i = 0; i < 3; i++) {
        if (!strcmp(e->param, names[i][0])) snprintf(e->param, sizeof e->param, "%s", names[i][1]);
        rename_quoted(e, names[i][0], names[i][1]);
    }
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
    /* the stream state is set up by resp_begin, once the id is known; a non-streaming job
     * uses only its reasoning-token count */
    rj->st.in_reasoning = out->gen_reasoning;
    out->api_data = rj;
    out->api_free = resp_job_free;
    rc = 0;
done:
    json_decref(hist);
    json_decref(b);
    return rc;
}

/* ==== the stream (scheduler; resp_begin on the connection thread) ========================= */

static void resp_token(srv_server *s, job *j, const dsf_gen_token *t) {
    (void)s;
    resp_stream_token(&state(j)->st, t->piece, t->piece_len);
}

static void resp_dsml(srv_server *s, job *j, const dsf_dsml_event *ev, dsf_buf *out) {
    (void)s;
    const char *call_id = ev->type == DSF_DSML_TOOL_START ? srv_job_call_id(j, ev->index) : NULL;
    resp_stream_dsml(&state(j)->st, ev, call_id, out);
}

static void resp_begin(srv_server *s, job *j, dsf_buf *out) {
    (void)s;
    resp_job *rj = state(j);
    resp_stream_init(&rj->st, rid_of(j), j->req.parallel_tool_calls, rj->st.in_reasoning);
    resp_stream_begin(&rj->st, resp_object(&j->meta, rj->rq.echo, "in_progress", NULL, NULL, NULL, NULL), out);
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
    resp_usage ru = {u->prompt_tokens, u->cached_tokens, u->completion_tokens, rj->st.reasoning_tokens};
    if (ru.reasoning > ru.output) ru.reasoning = ru.output;
    return ru;
}

static void resp_end(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u, const srv_error *err,
                     dsf_buf *out) {
    resp_job *rj = state(j);
    bool length = !err && res->finish == DSF_FINISH_LENGTH;
    const json_t *items = resp_stream_close(&rj->st, length ? "incomplete" : "completed", out);
    resp_usage ru = usage_of(j, u);
    json_t *r = resp_object(&j->meta, rj->rq.echo, err ? "failed" : length ? "incomplete" : "completed",
                            json_incref((json_t *)items), &ru, length ? "max_output_tokens" : NULL, err ? err->message : NULL);
    if (!err) store_response(s, j, r, items);
    resp_stream_end(&rj->st, r, out);
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
