/* server.c: `dsflash serve`: the HTTP endpoints (libmicrohttpd) and the server's lifetime,
 * which starts and stops its threads; the threads and locking of all its files are below.
 *
 * Files: server.c (this one: routing, authentication, body limits, /health, /v1/models,
 * /tokenize, a generation request's validation and queueing; start and stop);
 * server_job.c (a job on its connection's side: reference count, cancellation, suspending
 * and resuming its connection, the SSE content reader); server_sched.c (the slots and the
 * scheduler thread); server_conn.c (open connections, read deadlines, the watcher thread);
 * metrics.c (GET /metrics); server_api.c (OpenAI JSON <-> srv_req, no sockets, no engine);
 * server_msg*.c (Anthropic Messages: /v1/messages, /v1/messages/count_tokens);
 * server_resp.c + responses.c + store.c (OpenAI Responses: its srv_api table, its pure JSON,
 * the stored responses); webui.c (GET /: the browser chat page); server_int.h (the internal types they share).
 * Must not: call the engine from a connection thread except to read idle slots' histories
 * (srv_assign) and the vocabulary; hold srv->mu while it answers a connection.
 *
 * Threads:
 *   - libmicrohttpd runs an epoll loop on each of a small pool of threads (--http-threads,
 *     MHD_USE_EPOLL_INTERNAL_THREAD + MHD_OPTION_THREAD_POOL_SIZE), so an idle or slow
 *     connection costs a socket and a few KB, not a thread. A pool thread reads the body,
 *     validates it (server_api.c), tokenizes, and either answers an error at once or queues a
 *     job. No pool thread ever waits for a job: a connection with nothing to send is
 *     suspended (MHD_ALLOW_SUSPEND_RESUME) and the scheduler resumes it when output or the end
 *     arrives (srv_job_wake, server_job.c). Non-streaming: the access handler suspends the
 *     connection and is called again after the resume, when it sends the reply. Streaming:
 *     the SSE content reader returns the bytes it has, or suspends the connection and returns
 *     0. (libmicrohttpd 0.9.75 documents 0 from a content reader as legal with internal
 *     polling only together with MHD_suspend_connection, "to avoid busy waiting"; a reader
 *     that returned 0 alone would spin.)
 *   - one watcher thread (server_conn.c) every 50 ms at most: shuts down connections past
 *     their read deadline (--read-timeout; libmicrohttpd's --timeout is an idle timeout that
 *     a client sending a byte a second never reaches), cancels the jobs of suspended
 *     connections whose client hung up (libmicrohttpd does not poll a suspended connection)
 *     and resumes streams whose keep-alive comment is due.
 *   - one scheduler thread runs every forward. A slot owns one dsf_session + dsf_gen and is
 *     idle, prefilling or decoding. Each scheduler round (1) starts the jobs newly assigned to
 *     slots and ends the cancelled ones, (2) evaluates the pending token of every decoding
 *     slot in one dsf_batch_eval (weights read once for all of them; at most SRV_MAX_BATCH per
 *     forward) and hands each slot its logits row (generate.c's step API samples, streams and
 *     decides whether to continue), (3) evaluates one --prefill-chunk of one prefilling slot
 *     (round robin), so a long prompt delays the streams by one chunk per round at most.
 *     Batching changes no result: dsf_batch_eval equals separate evals.
 *
 * Assignment: a queued job goes to the free slot whose session history shares the longest
 * prefix with its prompt (ties: least recently used), so follow-up requests reuse the KV
 * state (generate.c rolls back exactly to the common prefix).
 *
 * Connections: --max-conn-per-ip is libmicrohttpd's per-address limit (it refuses more
 * silently); beyond --max-conn open connections a request gets 503 with Retry-After and the
 * connection is closed; libmicrohttpd's own hard limit sits above that (--max-conn + 64, so
 * the 503 can be sent) and below RLIMIT_NOFILE. /health and /metrics need no --api-key (probes
 * and scrapers carry none; they reveal counters, no content), nor do the chat page's static files
 * (a browser loads them before the page can ask for the key; they hold no data).
 *
 * Shutdown: srv_drain (SIGTERM) stops accepting (MHD_quiesce_daemon), answers new requests
 * on open connections with 503, lets queued and running jobs finish for up to
 * --shutdown-grace seconds and calls the prefix cache's flush hook; srv_stop then cancels
 * what is left, resumes every suspended connection (stopping libmicrohttpd with one
 * suspended is an API violation) and joins the threads. A failed MPI job (srv_failure, server.h)
 * has no grace: the scheduler answers every job 503 without calling the engine again, every
 * other request gets 503 (/health naming the failure), and srv_abort waits only until those
 * answers are sent, then srv_stop.
 *
 * Locking: srv->mu protects the queue, slot ownership, every job's output buffer and flags,
 * and the suspension of a job's connection (MHD_suspend/resume_connection are called under
 * it; libmicrohttpd never calls back into dsflash while holding its own locks). srv->conn_mu
 * protects the connection list and is never held with srv->mu.
 * No engine work happens under srv->mu. A job is freed when its reference count drops to 0
 * (the connection holds one reference, the queue/slot one). */
#include <errno.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_int.h"
#include "server/server_msg.h"
#include "server/server_image.h"
#include "server/webui.h"
#include "base/threads.h"

/* ==== HTTP =============================================================================== */

typedef struct {
    dsf_buf body;
    bool too_large;
    bool early; /* a response was queued before the body was read */
    double t0;
    int req_no;
    job *j; /* a non-streaming job the suspended connection waits for */
    bool wait_ready; /* j is a stream waiting for its images (j->ready) */
} conn_state;

/* The one log line per request (DSF_LOG >= 1). */
static void log_line(srv_server *s, int req_no, const char *method, const char *url, int slot_id, int n_prompt,
                     int n_cached, int n_gen, double tps, int status, const char *outcome, double t0) {
    dsf_log(1, "serve: req %d %s %s slot %d prompt %d cached %d gen %d %.1f tok/s %.3f s status %d %s", req_no, method,
            url, slot_id, n_prompt, n_cached, n_gen, tps, dsf_now() - t0, status, outcome ? outcome : "");
    srv_metrics_request(s, url, status);
}

/* ctype: NULL for JSON. A 429 or 503 tells when to retry; close: the connection closes after. */
static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *body, const char *ctype,
                                 bool close) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype ? ctype : "application/json");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (close) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, const char *body) {
    return send_body(c, status, body, NULL, false);
}

/* An error reply; api: the endpoint's wire format (its error shape), NULL for OpenAI's. */
static enum MHD_Result send_api_error(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                                      const char *url, const srv_error *e, const srv_api *api) {
    char *body = api ? api->error_body(e) : srv_error_json(e);
    /* refused for the server's state (connection limit, shutdown): the connection closes */
    bool close = e->code && (!strcmp(e->code, "too_many_connections") || !strcmp(e->code, "server_stopping") ||
                             !strcmp(e->code, "mpi_job_failed"));
    enum MHD_Result r = send_body(c, e->status, body, NULL, close);
    free(body);
    log_line(s, cs ? cs->req_no : 0, method, url, -1, 0, 0, 0, 0, e->status, e->message, cs ? cs->t0 : dsf_now());
    return r;
}

/* The wire format whose error shape a path's failures take: /v1/messages and everything
 * under it answer in Anthropic's shape (401, 404, 405, 413 included); NULL: OpenAI's. */
static const srv_api *path_api(const char *url) {
    const char *p = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    return !strncmp(p, "/messages", 9) && (p[9] == 0 || p[9] == '/') ? &srv_api_messages : NULL;
}

static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                                  const char *url, const srv_error *e) {
    return send_api_error(s, c, cs, method, url, e, path_api(url));
}

/* Non-streaming: the job is done (or cancelled); its reply, then the connection lets go. */
static enum MHD_Result answer_job(srv_server *s, struct MHD_Connection *c, conn_state *cs) {
    job *j = cs->j;
    cs->j = NULL;
    enum MHD_Result ret = MHD_NO; /* the client is gone: close the connection */
    if (!atomic_load(&j->cancelled) && j->body) ret = send_json(c, j->status, j->body);
    srv_job_release(s, j);
    return ret;
}

/* The connection waits for cs->j (first call, or resumed): the reply when it is done; a
 * stream waiting for its images starts once they are encoded. */
static enum MHD_Result resume_job(srv_server *s, struct MHD_Connection *c, conn_state *cs) {
    if (srv_job_park(s, cs->j, cs->wait_ready)) return MHD_YES; /* called again when woken */
    pthread_mutex_lock(&s->mu);
    bool stream = cs->wait_ready && cs->j->ready;
    pthread_mutex_unlock(&s->mu);
    if (!stream) return answer_job(s, c, cs);
    job *j = cs->j;
    cs->j = NULL;
    cs->wait_ready = false;
    return srv_job_stream(s, c, j); /* the response takes the connection's reference */
}

static enum MHD_Result handle_generate(srv_server *s, struct MHD_Connection *c, conn_state *cs, srv_kind kind,
                                       const char *method, const char *url) {
    const srv_api *api = srv_api_of(kind);
    srv_req req;
    srv_error e;
    if (api->parse(s, (const char *)cs->body.data, cs->body.len, &req, &e))
        return send_api_error(s, c, cs, method, url, &e, api);
    int nv = dsf_engine_n_vocab(s->e); /* the tokenizer may name more ids than the model has rows */
    for (int i = 0; i < req.n_prompt; i++)
        if (req.prompt[i] >= nv) {
            srv_fail(&e, 400, "prompt", "invalid_value", "token id %d at prompt[%d] is outside the model's vocabulary (%d)",
                     (int)req.prompt[i], i, nv);
            srv_req_free(&req);
            return send_api_error(s, c, cs, method, url, &e, api);
        }
    if (srv_media_request(s, &req, &e)) { /* the images within the limits (server_media.c) */
        srv_req_free(&req);
        return send_api_error(s, c, cs, method, url, &e, api);
    }
    pthread_mutex_lock(&s->mu);
    if (s->n_queued >= s->p.max_queue || s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_req_free(&req);
        if (s->stopping) srv_fail(&e, 503, NULL, "server_stopping", "the server is shutting down");
        else srv_fail(&e, api->busy_status ? api->busy_status : 503, NULL, "server_busy",
                      "too many requests are waiting (%d); retry later", s->p.max_queue);
        return send_api_error(s, c, cs, method, url, &e, api);
    }
    job *j = srv_job_new(s, &req, c, cs->req_no, method, url);
    j->t0 = cs->t0;
    if (j->req.stream && api->stream_begin) api->stream_begin(s, j, &j->out);
    if (s->qtail) s->qtail->next = j;
    else s->qhead = j;
    s->qtail = j;
    s->n_queued++;
    srv_assign(s);
    pthread_mutex_unlock(&s->mu);

    /* a stream with images answers once they are encoded: a bad image still gets its status */
    cs->wait_ready = j->req.stream && j->req.n_images > 0;
    if (j->req.stream && !cs->wait_ready) return srv_job_stream(s, c, j);
    cs->j = j;
    return resume_job(s, c, cs);
}

/* GET / DELETE /v1/responses/{id}: the store's answer (server_resp.c). */
static enum MHD_Result handle_stored_response(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *id,
                                              bool del, const char *method, const char *url) {
    srv_error e;
    char *body = srv_resp_lookup(s, id, del, &e);
    if (!body) return send_error(s, c, cs, method, url, &e);
    enum MHD_Result r = send_json(c, 200, body);
    free(body);
    log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
    return r;
}

static enum MHD_Result handle_tokenize(srv_server *s, struct MHD_Connection *c, conn_state *cs, bool detok,
                                       const char *method, const char *url) {
    srv_error e;
    json_error_t je;
    json_t *b = json_loadb((const char *)cs->body.data, cs->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!b) {
        srv_fail(&e, 400, NULL, "invalid_json", "invalid JSON body: %s (line %d)", je.text, je.line);
        return send_error(s, c, cs, method, url, &e);
    }
    json_t *out = NULL;
    char err[DSF_ERR_LEN] = "";
    if (!json_is_object(b)) {
        srv_fail(&e, 400, NULL, "invalid_type", "request body must be a JSON object");
    } else if (!detok) {
        const json_t *t = json_object_get(b, "content");
        const json_t *as = json_object_get(b, "add_special"), *ps = json_object_get(b, "parse_special"),
                     *wp = json_object_get(b, "with_pieces");
        if (!json_is_string(t)) srv_fail(&e, 400, "content", "invalid_type", "'content' must be a string");
        else if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)) || (wp && !json_is_boolean(wp)))
            srv_fail(&e, 400, NULL, "invalid_type", "'add_special', 'parse_special' and 'with_pieces' must be booleans");
        else {
            int32_t *ids = NULL;
            size_t n = 0;
            bool bos = json_is_true(as) && dsf_tokenizer_bos(s->tok) >= 0;
            if (dsf_tokenize(s->tok, json_string_value(t), json_string_length(t), bos, !ps || json_is_true(ps), &ids, &n,
                             err)) {
                srv_fail(&e, 400, "content", "invalid_value", "%s", err);
            } else {
                json_t *arr = json_array();
                for (size_t i = 0; i < n; i++) {
                    if (json_is_true(wp)) {
                        size_t pl = 0;
                        const char *p = dsf_token_bytes(s->tok, ids[i], &pl);
                        json_t *piece = p ? json_stringn(p, pl) : NULL;
                        if (!piece) { /* not valid UTF-8 alone: give the bytes, as llama.cpp does */
                            piece = json_array();
                            for (size_t k = 0; p && k < pl; k++) json_array_append_new(piece, json_integer((unsigned char)p[k]));
                        }
                        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", ids[i], "piece", piece));
                    } else {
                        json_array_append_new(arr, json_integer(ids[i]));
                    }
                }
                free(ids);
                out = json_pack("{s:o}", "tokens", arr);
            }
        }
    } else {
        const json_t *t = json_object_get(b, "tokens");
        size_t n = json_is_array(t) ? json_array_size(t) : 0;
        int nv = dsf_tokenizer_n_vocab(s->tok);
        int32_t *ids = dsf_xmalloc((n ? n : 1) * sizeof *ids);
        bool ok = json_is_array(t);
        if (!ok) srv_fail(&e, 400, "tokens", "invalid_type", "'tokens' must be a list of token ids");
        for (size_t i = 0; ok && i < n; i++) {
            const json_t *v = json_array_get(t, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
                srv_fail(&e, 400, "tokens", "invalid_value", "tokens[%zu] is not a token id in [0, %d)", i, nv);
                ok = false;
            } else {
                ids[i] = (int32_t)json_integer_value(v);
            }
        }
        char *text = NULL;
        size_t tl = 0;
        if (ok && dsf_detokenize(s->tok, ids, n, true, &text, &tl, err)) {
            srv_fail(&e, 400, "tokens", "invalid_value", "%s", err);
            ok = false;
        }
        free(ids);
        if (ok) {
            json_t *str = json_stringn(text, tl);
            out = json_pack("{s:o}", "content", str ? str : json_string(""));
        }
        free(text);
    }
    json_decref(b);
    if (!out) return send_error(s, c, cs, method, url, &e);
    char *body = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    enum MHD_Result r = send_json(c, 200, body);
    log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
    free(body);
    return r;
}

/* POST /v1/messages/count_tokens: the prompt tokens of a Messages body (server_msg.c). */
static enum MHD_Result handle_count_tokens(srv_server *s, struct MHD_Connection *c, conn_state *cs,
                                           const char *method, const char *url) {
    srv_error e;
    char *body = srv_msg_count_json((const char *)cs->body.data, cs->body.len, s->tok, &e);
    if (!body) return send_error(s, c, cs, method, url, &e);
    enum MHD_Result r = send_json(c, 200, body);
    free(body);
    log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
    return r;
}

/* GET / and the page's files (webui.c): served without the API key (the page asks for it and
 * sends it with its API calls); with --no-webui they do not exist. */
static enum MHD_Result handle_webui(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                                   const char *url) {
    srv_error e;
    if (s->p.no_webui) {
        srv_fail(&e, 404, NULL, "not_found", "no endpoint %s %s (the web page is off: --no-webui)", method, url);
        return send_error(s, c, cs, method, url, &e);
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        srv_fail(&e, 405, NULL, "method_not_allowed", "method %s is not allowed on %s", method, url);
        return send_error(s, c, cs, method, url, &e);
    }
    int status = 200;
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    struct MHD_Response *r = srv_webui_response(url, inm, s->p.api_key != NULL, &status);
    if (!r) return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, status, "ok", cs->t0);
    return ret;
}

/* GET /health: the slots and the decode batching; 503 naming the failure once an MPI job failed. */
static enum MHD_Result handle_health(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                                     const char *url) {
    unsigned long long fw = atomic_load(&s->st_forwards), tk = atomic_load(&s->st_tokens);
    const char *fail = srv_failure(s);
    json_t *h = json_pack("{s:s,s:i,s:{s:I,s:I,s:i,s:f}}", "status", fail ? "failed" : "ok", "slots", s->n_slots, "decode",
                          "forwards", (json_int_t)fw, "tokens", (json_int_t)tk, "max_batch",
                          atomic_load(&s->st_max_batch), "avg_batch", fw ? (double)tk / (double)fw : 0.0);
    if (s->p.spec.draft) {
        unsigned long long ver = atomic_load(&s->st_sp_verified), acc = atomic_load(&s->st_sp_accepted);
        json_object_set_new(h, "speculative",
                            json_pack("{s:s,s:I,s:I,s:I,s:I,s:f}", "draft", s->p.spec.draft, "rounds",
                                      (json_int_t)atomic_load(&s->st_sp_rounds), "drafted",
                                      (json_int_t)atomic_load(&s->st_sp_drafted), "verified", (json_int_t)ver,
                                      "accepted", (json_int_t)acc, "acceptance", ver ? (double)acc / (double)ver : 0.0));
    }
    if (fail) { /* the error object of the API's error JSON, beside the counters */
        srv_error e;
        srv_fail_mpi(&e, fail);
        char *eb = srv_error_json(&e);
        json_t *ej = json_loads(eb, 0, NULL);
        free(eb);
        json_object_set_new(h, "error", json_incref(json_object_get(ej, "error")));
        json_decref(ej);
    }
    char *body = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    const int status = fail ? 503 : 200;
    enum MHD_Result r = send_body(c, status, body, NULL, fail != NULL);
    free(body);
    log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, status, fail ? "failed" : "ok", cs->t0);
    return r;
}

static bool path_is(const char *url, const char *p) {
    if (!strcmp(url, p)) return true;
    /* both /v1/x and /x, as OpenAI-compatible servers accept */
    return !strncmp(p, "/v1/", 4) && !strcmp(url, p + 3);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *s = cls;
    conn_state *cs = *con_cls;
    srv_error e;
    if (!cs) {
        cs = dsf_xcalloc(1, sizeof *cs);
        cs->t0 = dsf_now();
        cs->req_no = atomic_fetch_add(&s->next_req, 1) + 1;
        *con_cls = cs;
        if (atomic_load(&s->n_conn) > s->p.max_conn) {
            cs->early = true;
            srv_metrics_conn_refused(s);
            srv_fail(&e, 503, NULL, "too_many_connections", "the server has more than %d open connections; retry later",
                     s->p.max_conn);
            return send_error(s, c, cs, method, url, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end = NULL;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > s->p.max_body) {
                cs->early = true;
                srv_fail(&e, 413, NULL, "request_too_large", "request body exceeds the limit of %zu bytes", s->p.max_body);
                return send_error(s, c, cs, method, url, &e);
            }
        }
        return MHD_YES;
    }
    if (cs->j) return resume_job(s, c, cs); /* resumed: the job is done, or its stream can start */
    if (cs->early) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_large && cs->body.len + *upload_size <= s->p.max_body)
            dsf_buf_append(&cs->body, upload, *upload_size);
        else
            cs->too_large = true, dsf_buf_free(&cs->body);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->too_large) {
        srv_fail(&e, 413, NULL, "request_too_large", "request body exceeds the limit of %zu bytes", s->p.max_body);
        return send_error(s, c, cs, method, url, &e);
    }
    if (!cs->body.data) dsf_buf_append(&cs->body, "", 0);
    srv_conn_received(s, c);

    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (path_is(url, "/metrics")) { /* open like /health, and answered while draining */
        if (!get) goto not_allowed;
        char *body = srv_metrics_text(s);
        enum MHD_Result r = send_body(c, 200, body, "text/plain; version=0.0.4; charset=utf-8", false);
        free(body);
        log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
        return r;
    }
    const char *fail = srv_failure(s);
    if (fail && !path_is(url, "/health") && !path_is(url, "/v1/health")) { /* the MPI job failed: nothing is served */
        srv_fail_mpi(&e, fail);
        return send_error(s, c, cs, method, url, &e);
    }
    if (atomic_load(&s->draining) && !fail) {
        srv_fail(&e, 503, NULL, "server_stopping", "the server is shutting down");
        return send_error(s, c, cs, method, url, &e);
    }
    if (srv_webui_path(url)) return handle_webui(s, c, cs, method, url);
    if (s->p.api_key && !path_is(url, "/health")) {
        /* OpenAI clients send a bearer key, Anthropic clients x-api-key: either one, anywhere */
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
        bool ok = (auth && !strncmp(auth, "Bearer ", 7) && !strcmp(auth + 7, s->p.api_key)) ||
                  (xkey && !strcmp(xkey, s->p.api_key));
        if (!ok) {
            srv_fail(&e, 401, NULL, "invalid_api_key",
                     auth || xkey ? "Incorrect API key provided"
                                  : "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
            return send_error(s, c, cs, method, url, &e);
        }
    }
    if (path_is(url, "/health") || path_is(url, "/v1/health")) {
        if (!get) goto not_allowed;
        return handle_health(s, c, cs, method, url);
    }
    if (path_is(url, "/v1/models")) {
        if (!get) goto not_allowed;
        /* capabilities: ["vision"] when --mmproj is loaded (llama.cpp-style; the browser page reads it) */
        json_t *m = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:{s:i,s:i,s:b},s:o}]}", "object", "list", "data", "id",
                              s->model_name, "object", "model", "created", (json_int_t)s->created, "owned_by", "dsflash",
                              "meta", "n_ctx", s->n_ctx, "n_slots", s->n_slots, "vision", s->vis != NULL,
                              "capabilities", s->vis ? json_pack("[s,s]", "completion", "vision") : json_pack("[s]", "completion"));
        char *body = json_dumps(m, JSON_COMPACT);
        json_decref(m);
        enum MHD_Result r = send_json(c, 200, body);
        free(body);
        log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
        return r;
    }
    if (path_is(url, "/v1/chat/completions")) {
        if (!post) goto not_allowed;
        return handle_generate(s, c, cs, SRV_CHAT, method, url);
    }
    if (path_is(url, "/v1/completions")) {
        if (!post) goto not_allowed;
        return handle_generate(s, c, cs, SRV_COMPLETION, method, url);
    }
    if (path_is(url, "/v1/messages")) {
        if (!post) goto not_allowed;
        return handle_generate(s, c, cs, SRV_MESSAGES, method, url);
    }
    if (path_is(url, "/v1/messages/count_tokens")) {
        if (!post) goto not_allowed;
        return handle_count_tokens(s, c, cs, method, url);
    }
    if (path_is(url, "/v1/responses")) {
        if (!post) goto not_allowed;
        return handle_generate(s, c, cs, SRV_RESPONSES, method, url);
    }
    if (!strncmp(url, "/v1/responses/", 14) || !strncmp(url, "/responses/", 11)) {
        bool del = !strcmp(method, "DELETE");
        if (!get && !del) goto not_allowed;
        return handle_stored_response(s, c, cs, url + (url[1] == 'v' ? 14 : 11), del, method, url);
    }
    if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
        if (!post) goto not_allowed;
        return handle_tokenize(s, c, cs, url[1] == 'd', method, url);
    }
    srv_fail(&e, 404, NULL, "not_found", "no endpoint %s %s", method, url);
    return send_error(s, c, cs, method, url, &e);
not_allowed:
    srv_fail(&e, 405, NULL, "method_not_allowed", "method %s is not allowed on %s", method, url);
    return send_error(s, c, cs, method, url, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv_server *s = cls;
    conn_state *cs = *con_cls;
    srv_conn_answered(s, c);
    if (!cs) return;
    if (cs->j) srv_job_release(s, cs->j); /* closed before its answer */
    dsf_buf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ==== lifetime ============================================================================ */

void srv_params_default(srv_params *p) {
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->n_slots = 1;
    p->max_body = 8u << 20;
    p->max_queue = 256;
    p->keepalive_ms = 5000;
    p->prefill_chunk = 0;
    p->idle_timeout_s = 600;
    p->read_timeout_s = 30;
    p->max_conn = 4096;
    p->max_conn_per_ip = 256;
    p->http_threads = 4;
    p->shutdown_grace_s = 30;
    p->store_mb = 64;
    p->cache_max_gb = 16;
    p->cache_every = 4096;
    p->numerics = DSF_NUMERICS_REFERENCE;
    p->max_images = SRV_DEFAULT_MAX_IMAGES;
    p->max_image_bytes = SRV_DEFAULT_MAX_IMAGE_BYTES;
    p->max_image_pixels = SRV_DEFAULT_MAX_IMAGE_PIXELS;
}

static void free_server(srv_server *s) {
    srv_pc_close(s); /* the scheduler has stopped: write what is queued */
    srv_media_close(s);
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        dsf_gen_free(s->slots[i].g);
        spec_seq_free(s->slots[i].sq);
        dsf_session_free(s->slots[i].s);
    }
    free(s->b_sess);
    free(s->b_tok);
    free(s->b_slot);
    free(s->b_logits);
    free(s->slots);
    srv_store_free(s->store);
    srv_metrics_free(s->metrics);
    dsf_tokenizer_free(s->tok);
    dsf_engine_close(s->e);
    free(s->model_name);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->sched_cv);
    free(s);
}

/* libmicrohttpd's own connection limit: above --max-conn so that the 503 can be answered,
 * below the open-file limit (model files, pipes and epoll descriptors need some too). */
static unsigned mhd_conn_limit(int max_conn) {
    unsigned want = (unsigned)max_conn + 64;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)want + 64) {
        unsigned have = rl.rlim_cur > 128 ? (unsigned)rl.rlim_cur - 64 : 64;
        dsf_log(1, "serve: RLIMIT_NOFILE is %llu: at most %u connections instead of %u", (unsigned long long)rl.rlim_cur,
                have, want);
        return have;
    }
    return want;
}

srv_server *srv_start(const srv_params *p, char *err) {
    if (!p->model_path) return dsf_seterr(err, "no model (-m FILE)"), NULL;
    if (p->n_slots < 1 || p->n_slots > 256) return dsf_seterr(err, "--slots must be within 1..256, got %d", p->n_slots), NULL;
    if (p->port < 0 || p->port > 65535) return dsf_seterr(err, "--port must be within 0..65535, got %d", p->port), NULL;
    if (p->store_mb < 0 || p->store_mb > (1 << 20))
        return dsf_seterr(err, "--store-mb must be within 0..%d, got %d", 1 << 20, p->store_mb), NULL;
    if (p->max_conn < 1 || p->max_conn > (1 << 20))
        return dsf_seterr(err, "--max-conn must be within 1..%d, got %d", 1 << 20, p->max_conn), NULL;
    if (p->max_conn_per_ip < 0 || p->max_conn_per_ip > (1 << 20))
        return dsf_seterr(err, "--max-conn-per-ip must be within 0..%d, got %d", 1 << 20, p->max_conn_per_ip), NULL;
    if (p->http_threads < 1 || p->http_threads > 256)
        return dsf_seterr(err, "--http-threads must be within 1..256, got %d", p->http_threads), NULL;
    if (p->read_timeout_s < 1 || p->shutdown_grace_s < 0)
        return dsf_seterr(err, "--read-timeout must be >= 1 and --shutdown-grace >= 0 (got %d, %d)", p->read_timeout_s,
                          p->shutdown_grace_s), NULL;
    srv_server *s = dsf_xcalloc(1, sizeof *s);
    s->p = *p;
    s->mpi = dsf_dist_size() > 1;
    if (s->p.max_body == 0) s->p.max_body = 8u << 20;
    if (s->p.max_queue <= 0) s->p.max_queue = 256;
    if (s->p.keepalive_ms <= 0) s->p.keepalive_ms = 5000;
    if (s->p.idle_timeout_s <= 0) s->p.idle_timeout_s = 600;
    /* libmicrohttpd closes a connection idle for the timeout: keep-alives must come sooner */
    if (s->p.keepalive_ms > s->p.idle_timeout_s * 500) s->p.keepalive_ms = s->p.idle_timeout_s * 500;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    s->metrics = srv_metrics_new();
    s->created = (long long)time(NULL);
    s->store = srv_store_new((size_t)p->store_mb << 20);
    if (p->model_name) {
        s->model_name = dsf_xstrdup(p->model_name);
    } else {
        const char *b = strrchr(p->model_path, '/');
        s->model_name = dsf_xstrdup(b ? b + 1 : p->model_path);
    }

    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = p->n_threads;
    ep.repack = p->repack;
    ep.resident = p->resident;
    ep.act_q8k = p->act_q8k;
    ep.engram_readers = p->engram_readers;
    ep.engram_cache_mb = p->engram_cache_mb;
    ep.ubatch = p->ubatch;
    ep.numerics = p->numerics;
    s->e = dsf_engine_open(p->model_path, &ep, err);
    if (!s->e) goto fail;
    s->tok = dsf_tokenizer_load(p->model_path, err);
    if (!s->tok) goto fail;
    if (srv_pc_open(s, err)) goto fail;
    if (srv_media_open(s, err)) goto fail;
    int train = dsf_engine_n_ctx_train(s->e);
    s->n_ctx = p->n_ctx > 0 ? p->n_ctx : (train > 0 && train < 4096 ? train : 4096);
    s->n_slots = p->n_slots;
    s->slots = dsf_xcalloc((size_t)s->n_slots, sizeof *s->slots);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->id = i;
        sl->srv = s;
        sl->s = dsf_session_new(s->e, s->n_ctx, err);
        if (!sl->s) { dsf_prefixerr(err, "slot %d", i); goto fail; }
        sl->g = dsf_gen_new(s->e, sl->s, s->tok, err);
        if (!sl->g) { dsf_prefixerr(err, "slot %d", i); goto fail; }
        if (p->spec.draft) { /* the cost table is measured once, for slot 0 */
            sl->sq = spec_open(s->e, &p->spec, s->n_ctx, i ? spec_seq_policy(s->slots[0].sq) : NULL, err);
            if (!sl->sq || spec_attach(sl->g, sl->sq, err) < 0) { dsf_prefixerr(err, "slot %d", i); goto fail; }
        }
    }
    s->n_vocab = dsf_engine_n_vocab(s->e);
    s->max_batch = s->n_slots < SRV_MAX_BATCH ? s->n_slots : SRV_MAX_BATCH;
    s->b_sess = dsf_xcalloc((size_t)s->max_batch, sizeof *s->b_sess);
    s->b_tok = dsf_xcalloc((size_t)s->max_batch, sizeof *s->b_tok);
    s->b_slot = dsf_xcalloc((size_t)s->max_batch, sizeof *s->b_slot);
    s->b_logits = malloc((size_t)s->max_batch * (size_t)s->n_vocab * sizeof *s->b_logits);
    if (!s->b_logits) {
        dsf_seterr(err, "out of memory for %d x %d logits", s->max_batch, s->n_vocab);
        goto fail;
    }

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)p->port);
    const char *host = p->host ? p->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        dsf_seterr(err, "--host must be an IPv4 address, got '%s'", host);
        goto fail;
    }
    unsigned hard = mhd_conn_limit(s->p.max_conn);
    s->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
                            (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)s->p.http_threads,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, srv_conn_notify, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)s->p.idle_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, hard, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned int)s->p.max_conn_per_ip, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
                            MHD_OPTION_END);
    if (!s->d) {
        dsf_seterr(err, "cannot listen on %s:%d (%s)", host, p->port, strerror(errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    int perr = dsf_thread_start(&s->sched, srv_sched_main, s);
    if (perr) {
        dsf_seterr(err, "cannot start the scheduler thread (%s)", strerror(perr));
        goto fail;
    }
    s->sched_running = true;
    perr = dsf_thread_start(&s->watch, srv_conn_watch_main, s);
    if (perr) {
        dsf_seterr(err, "cannot start the connection watcher thread (%s)", strerror(perr));
        goto fail;
    }
    s->watch_running = true;
    dsf_log(1, "serve: %d HTTP threads (epoll), up to %d connections (%d per address), read timeout %d s", s->p.http_threads,
            s->p.max_conn, s->p.max_conn_per_ip, s->p.read_timeout_s);
    return s;
fail:
    if (s->sched_running) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->sched_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->sched, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    free_server(s);
    return NULL;
}

int srv_port(const srv_server *s) { return s ? s->port : -1; }

void srv_drain(srv_server *s) {
    if (!s || atomic_exchange(&s->draining, true)) return;
    MHD_socket lfd = MHD_quiesce_daemon(s->d); /* new connections are refused from now on */
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    double t0 = dsf_now();
    int left = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        left = s->n_queued;
        for (int i = 0; i < s->n_slots; i++) left += s->slots[i].j != NULL;
        pthread_mutex_unlock(&s->mu);
        if (!left || dsf_now() - t0 >= s->p.shutdown_grace_s) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    dsf_log(1, "serve: drained in %.1f s, %d request%s still running", dsf_now() - t0, left, left == 1 ? "" : "s");
    if (s->cache_flush) s->cache_flush(s);
}

void srv_stop(srv_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    srv_job_cancel_queued(s);
    pthread_cond_broadcast(&s->sched_cv);
    pthread_mutex_unlock(&s->mu);
    /* The scheduler ends every running job as cancelled (which resumes its connection) and
     * exits; no job is left to suspend a connection on. */
    if (s->sched_running) pthread_join(s->sched, NULL);
    atomic_store(&s->watch_stop, true);
    if (s->watch_running) pthread_join(s->watch, NULL);
    pthread_mutex_lock(&s->mu);
    int suspended = s->n_suspended;
    pthread_mutex_unlock(&s->mu);
    DSF_ASSERT(suspended == 0); /* every job is done, so every connection was resumed */
    MHD_stop_daemon(s->d);
    free_server(s);
}

/* ==== a failed MPI job ===================================================================== */

const char *srv_failure(const srv_server *s) { return s && s->mpi ? dsf_dist_failure() : NULL; }

void srv_fail_mpi(srv_error *e, const char *fail) {
    srv_fail(e, 503, NULL, "mpi_job_failed", "the MPI job serving this model failed: %s", fail);
}

void srv_abort(srv_server *s, double wait_s) {
    if (!s) return;
    const double t0 = dsf_now();
    int left = 0, busy = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->sched_cv); /* an idle scheduler looks at the queue again */
        left = s->n_queued;
        for (int i = 0; i < s->n_slots; i++) left += s->slots[i].j != NULL;
        pthread_mutex_unlock(&s->mu);
        busy = srv_conn_busy(s);
        if ((!left && !busy) || dsf_now() - t0 >= wait_s) break;
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    dsf_log(1, "serve: the MPI job failed: %d request%s left unanswered, %d answer%s unsent after %.3f s; stopping", left,
            left == 1 ? "" : "s", busy, busy == 1 ? "" : "s", dsf_now() - t0);
    srv_stop(s);
}
