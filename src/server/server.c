/* server.c: `dsflash serve`: HTTP glue (libmicrohttpd), slots and the forward scheduler.
 *
 * Threads:
 *   - libmicrohttpd runs one thread per connection. The connection thread reads the body,
 *     validates it (server_api.c), tokenizes, and either answers an error at once or queues a
 *     job; it then waits for the job (non-streaming) or streams its SSE bytes from the
 *     response's content reader (streaming), polling its socket so that a client that hangs
 *     up cancels the job.
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
 * Locking: srv->mu protects the queue, slot ownership, every job's output buffer and flags.
 * No engine work happens under srv->mu. A job is freed when its reference count drops to 0
 * (the connection holds one reference, the queue/slot one). */
#include <errno.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "runtime/generate.h"
#include "server/server.h"
#include "base/threads.h"

#define WAIT_SLICE_MS 50 /* how often waiting connection threads check their socket */

/* ==== types =============================================================================== */

typedef struct job job;
typedef struct slot slot;

struct job {
    int refs;            /* srv->mu */
    srv_req req;
    srv_meta meta;
    uint64_t rng;
    int fd;              /* the client's socket, polled for hang-up */
    double t0;
    atomic_int cancelled;
    bool done;           /* srv->mu: the slot (or the queue) let go; out is complete */
    int slot_id;
    job *next;           /* queue link */
    pthread_cond_t cv;   /* signalled (with srv->mu) when out grows or done is set */
    /* streaming: SSE bytes produced by the slot, consumed by the content reader */
    dsf_buf out;
    size_t out_pos;
    /* tool call ids, one per call in output order */
    char (*ids)[32];
    int n_ids, cap_ids;
    /* logprobs: every token; streamed ones from lp_sent on */
    srv_tokprob *lp;
    int n_lp, cap_lp, lp_sent;
    size_t text_off;     /* completions: text offset of the next token */
    /* non-streaming result */
    int status;
    char *body;          /* JSON reply */
    /* for the log line */
    int n_prompt, n_cached, n_gen;
    long long batch_sum; /* scheduler: sum of the batch sizes of this job's decode forwards */
    int batch_n, batch_max;
    double tps;
    const char *outcome;
};

/* The generation callbacks' context (one per slot, for the job it runs). */
typedef struct {
    srv_server *s;
    slot *sl;
    job *j;
} gen_ctx;

typedef enum { SL_IDLE = 0, SL_PREFILL, SL_DECODE } slot_phase;

struct slot {
    int id;
    srv_server *srv;
    dsf_session *s;
    dsf_gen *g;
    job *j;              /* srv->mu: set by assign(), cleared when the scheduler lets go */
    double last_used;    /* srv->mu */
    /* scheduler thread only: */
    slot_phase phase;
    job *cur;            /* the job started on this slot (NULL: none yet) */
    gen_ctx ctx;
    dsf_gen_params gp;
    int32_t next_tok;    /* SL_DECODE: the token the next round evaluates */
};

/* Most decode steps in one forward (the logits buffer holds this many rows). */
#define SRV_MAX_BATCH 32

struct srv_server {
    srv_params p;
    char *model_name;
    dsf_engine *e;
    dsf_tokenizer *tok;
    int n_ctx;
    long long created;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    atomic_bool stopping;
    job *qhead, *qtail;
    int n_queued;
    slot *slots;
    int n_slots;
    atomic_int next_req;
    /* the scheduler */
    pthread_t sched;
    bool sched_running;
    pthread_cond_t sched_cv;  /* with mu: a job was assigned, or stopping */
    int max_batch;
    dsf_session **b_sess;     /* [max_batch] */
    int32_t *b_tok;
    slot **b_slot;
    float *b_logits;          /* [max_batch][n_vocab] */
    int n_vocab;
    /* batching statistics (/health): decode forwards, tokens in them, largest batch */
    atomic_ullong st_forwards, st_tokens;
    atomic_int st_max_batch;
};

void srv_params_default(srv_params *p) {
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->n_slots = 1;
    p->max_body = 8u << 20;
    p->max_queue = 256;
    p->keepalive_ms = 5000;
    p->prefill_chunk = 256;
    p->idle_timeout_s = 600;
    p->numerics = DSF_NUMERICS_REFERENCE;
}

/* ==== jobs ================================================================================ */

static void job_unref(srv_server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&s->mu);
    if (left) return;
    srv_req_free(&j->req);
    dsf_buf_free(&j->out);
    free(j->ids);
    free(j->lp);
    free(j->body);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void rand_alnum(char *out, int n, uint64_t *rng) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < n; i++) out[i] = al[(int)(dsf_rng_uniform(rng) * 62) % 62];
    out[n] = 0;
}

/* Appends bytes to the job's stream and wakes its connection (takes srv->mu). */
static void job_emit(srv_server *s, job *j, const dsf_buf *b) {
    pthread_mutex_lock(&s->mu);
    dsf_buf_append(&j->out, b->data, b->len);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
}

static void emit_chunk(srv_server *s, job *j, json_t *chunk) {
    dsf_buf b = {0};
    srv_sse_json(&b, chunk);
    json_decref(chunk);
    job_emit(s, j, &b);
    dsf_buf_free(&b);
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

/* ==== generation callbacks (scheduler thread) ============================================ */

static int cb_cancel(void *ud) {
    gen_ctx *c = ud;
    return atomic_load(&c->j->cancelled) || c->s->stopping;
}

static void cb_token(void *ud, const dsf_gen_token *t) {
    gen_ctx *c = ud;
    job *j = c->j;
    j->n_gen++;
    if (j->req.logprobs < 0 || t->is_eos) return;
    if (j->n_lp == j->cap_lp) {
        j->cap_lp = j->cap_lp ? 2 * j->cap_lp : 64;
        j->lp = dsf_xrealloc(j->lp, (size_t)j->cap_lp * sizeof *j->lp);
    }
    srv_tokprob *p = &j->lp[j->n_lp++];
    memset(p, 0, sizeof *p);
    p->id = t->id;
    p->logprob = t->logprob;
    p->n_top = t->n_top < 20 ? t->n_top : 20;
    for (int k = 0; k < p->n_top; k++) p->top_ids[k] = t->top_ids[k], p->top_lp[k] = t->top_logprobs[k];
}

static void cb_text(void *ud, const char *text, size_t len) {
    gen_ctx *c = ud;
    job *j = c->j;
    if (!j->req.stream || j->req.kind != SRV_COMPLETION || !len) return;
    json_t *choice;
    json_t *ch = srv_chunk(&j->meta, SRV_COMPLETION, &choice);
    json_t *tx = json_stringn(text, len);
    json_object_set_new(choice, "text", tx ? tx : json_string(""));
    attach_logprobs(c->s, j, choice);
    emit_chunk(c->s, j, ch);
}

static const char *call_id(job *j, int index) {
    while (j->n_ids <= index) {
        if (j->n_ids == j->cap_ids) {
            j->cap_ids = j->cap_ids ? 2 * j->cap_ids : 4;
            j->ids = dsf_xrealloc(j->ids, (size_t)j->cap_ids * sizeof *j->ids);
        }
        srv_call_id(j->ids[j->n_ids++], &j->rng);
    }
    return j->ids[index];
}

static void cb_dsml(void *ud, const dsf_dsml_event *ev) {
    gen_ctx *c = ud;
    job *j = c->j;
    const char *id = NULL;
    if (ev->type == DSF_DSML_TOOL_START || ev->type == DSF_DSML_TOOL_ARGS) id = call_id(j, ev->index);
    if (!j->req.stream) return;
    json_t *ch = srv_dsml_chunk(&j->meta, ev, id, j->req.parallel_tool_calls);
    if (!ch) return;
    attach_logprobs(c->s, j, json_array_get(json_object_get(ch, "choices"), 0));
    emit_chunk(c->s, j, ch);
}

/* ==== running jobs (scheduler thread) ====================================================== */

static void finish_stream(srv_server *s, job *j, const char *finish, const srv_usage *u, const char *errmsg) {
    dsf_buf b = {0};
    if (errmsg) {
        srv_error e;
        srv_fail(&e, 500, NULL, "generation_failed", "%s", errmsg);
        char *body = srv_error_json(&e);
        dsf_buf_appendf(&b, "data: %s\n\n", body);
        free(body);
    } else {
        json_t *choice;
        json_t *ch = srv_chunk(&j->meta, j->req.kind, &choice);
        json_object_set_new(choice, "finish_reason", json_string(finish));
        attach_logprobs(s, j, choice);
        srv_sse_json(&b, ch);
        json_decref(ch);
        if (j->req.include_usage) {
            json_t *uc = srv_usage_chunk(&j->meta, j->req.kind, u);
            srv_sse_json(&b, uc);
            json_decref(uc);
        }
    }
    dsf_buf_append(&b, "data: [DONE]\n\n", 14);
    job_emit(s, j, &b);
    dsf_buf_free(&b);
}

/* Forward declaration: assign() is below. */
static void assign(srv_server *s);

/* The scheduler lets go of the slot's job: it is done; the slot takes the next one. */
static void slot_release(slot *sl) {
    srv_server *s = sl->srv;
    job *j = sl->cur;
    sl->cur = NULL;
    sl->phase = SL_IDLE;
    pthread_mutex_lock(&s->mu);
    sl->j = NULL;
    sl->last_used = dsf_now();
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    assign(s);
    pthread_mutex_unlock(&s->mu);
    job_unref(s, j);
}

/* Builds the job's reply from the generation result (rc: dsf_gen_end's, or -1 when the
 * prefill failed) and releases the slot. */
static void job_complete(slot *sl, int rc, dsf_gen_result *res, bool cancelled, const char *err) {
    srv_server *s = sl->srv;
    job *j = sl->cur;
    j->n_prompt = j->req.n_prompt;
    j->n_cached = res->n_cached;
    j->tps = res->decode_tps;
    srv_usage u = {.prompt_tokens = j->req.n_prompt, .completion_tokens = res->n_completion,
                   .cached_tokens = res->n_cached};
    const char *finish = res->finish == DSF_FINISH_LENGTH ? "length" : "stop";
    bool tool_calls = res->has_dsml && res->dsml.n_calls > 0;
    if (tool_calls && res->finish != DSF_FINISH_LENGTH) finish = "tool_calls";
    if (cancelled) {
        j->outcome = "cancelled";
    } else if (rc) {
        j->outcome = "error";
        j->status = 500;
        if (j->req.stream) finish_stream(s, j, NULL, &u, err);
        else {
            srv_error e;
            srv_fail(&e, 500, NULL, "generation_failed", "%s", err);
            j->body = srv_error_json(&e);
        }
    } else {
        j->outcome = finish;
        j->status = 200;
        if (j->req.stream) {
            finish_stream(s, j, finish, &u, NULL);
        } else {
            json_t *reply;
            const srv_tokprob *lp = j->req.logprobs >= 0 ? j->lp : NULL;
            if (j->req.kind == SRV_CHAT) {
                for (int i = 0; i < res->dsml.n_calls; i++) call_id(j, i);
                reply = srv_chat_reply(&j->meta, &res->dsml, j->ids, finish, &u, lp, j->n_lp, s->tok,
                                       j->req.parallel_tool_calls);
            } else {
                reply = srv_completion_reply(&j->meta, res->text, res->text_len, finish, &u, lp, j->n_lp, s->tok);
            }
            j->body = json_dumps(reply, JSON_COMPACT);
            json_decref(reply);
        }
    }
    dsf_gen_result_free(res);
    slot_release(sl);
}

/* A prefill that failed or was cancelled: no generation ran. */
static void job_abort_prefill(slot *sl, const char *err) {
    dsf_gen_result res;
    memset(&res, 0, sizeof res);
    res.n_cached = dsf_gen_n_cached(sl->g);
    bool cancelled = atomic_load(&sl->cur->cancelled) || sl->srv->stopping;
    job_complete(sl, -1, &res, cancelled, err);
}

/* Ends the slot's generation (a running one counts as cancelled) and completes the job. */
static void job_end_generation(slot *sl) {
    char err[DSF_ERR_LEN] = "";
    dsf_gen_result res;
    int rc = dsf_gen_end(sl->g, &res, err);
    job_complete(sl, rc, &res, res.finish == DSF_FINISH_CANCELLED, err);
}

/* One generation step on the slot's logits (NULL: the prefill's); the slot then waits for
 * the next decode round or its job is complete. */
static void slot_step(slot *sl, const float *logits) {
    char err[DSF_ERR_LEN] = "";
    if (dsf_gen_next(sl->g, logits, &sl->next_tok, err) == DSF_FINISH_NONE) sl->phase = SL_DECODE;
    else job_end_generation(sl);
}

/* Starts the job assigned to an idle slot: its generation parameters and its prefill. */
static void job_start(slot *sl, job *j) {
    srv_server *s = sl->srv;
    char err[DSF_ERR_LEN] = "";
    sl->cur = j;
    sl->ctx = (gen_ctx){.s = s, .sl = sl, .j = j};
    dsf_gen_params *gp = &sl->gp;
    dsf_gen_params_default(gp);
    gp->sampler.temperature = j->req.temperature;
    gp->sampler.top_k = j->req.top_k;
    gp->sampler.top_p = j->req.top_p;
    gp->sampler.min_p = j->req.min_p;
    gp->sampler.seed = j->req.has_seed ? j->req.seed : j->rng;
    gp->sampler.max_tokens = j->req.max_tokens;
    gp->sampler.stop = (const char *const *)j->req.stop;
    gp->sampler.n_stop = j->req.n_stop;
    gp->sampler.ignore_eos = j->req.ignore_eos;
    gp->logprobs = j->req.logprobs >= 0;
    gp->top_logprobs = j->req.logprobs > 0 ? j->req.logprobs : 0;
    gp->parse_dsml = j->req.kind == SRV_CHAT;
    gp->dsml_thinking = j->req.gen_reasoning;
    gp->on_text = cb_text;
    gp->on_dsml = cb_dsml;
    gp->on_token = cb_token;
    gp->cancel = cb_cancel;
    gp->ud = &sl->ctx;
    if (dsf_gen_prefill_begin(sl->g, j->req.prompt, j->req.n_prompt, s->p.prefill_chunk, err) < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    sl->phase = SL_PREFILL;
}

/* One prefill chunk; when the prompt is complete, the generation starts with its first token. */
static void slot_prefill_step(slot *sl) {
    char err[DSF_ERR_LEN] = "";
    int left = dsf_gen_prefill_step(sl->g, err);
    if (left < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    if (left > 0) return;
    if (dsf_gen_begin(sl->g, &sl->gp, err) < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    slot_step(sl, NULL);
}

/* One forward for the pending tokens of up to max_batch decoding slots. */
static void decode_batch(srv_server *s, int n) {
    char err[DSF_ERR_LEN] = "";
    int rc = dsf_batch_eval(s->b_sess, s->b_tok, n, s->b_logits, err);
    unsigned long long fw = atomic_fetch_add(&s->st_forwards, 1) + 1;
    atomic_fetch_add(&s->st_tokens, (unsigned long long)n);
    if (n > atomic_load(&s->st_max_batch)) atomic_store(&s->st_max_batch, n);
    dsf_log(2, "serve: decode forward %llu batch %d", fw, n);
    for (int k = 0; k < n; k++) {
        slot *sl = s->b_slot[k];
        job *j = sl->cur;
        j->batch_sum += n;
        j->batch_n++;
        if (n > j->batch_max) j->batch_max = n;
        if (rc < 0) {
            dsf_gen_fail(sl->g, err);
            job_end_generation(sl);
        } else {
            slot_step(sl, s->b_logits + (size_t)k * (size_t)s->n_vocab);
        }
    }
}

/* Under srv->mu: hands queued jobs to free slots (longest common prefix, then LRU). */
static void assign(srv_server *s) {
    /* while stopping, slot threads may already have exited: queued jobs are cancelled by
     * their connections instead */
    while (s->qhead && !s->stopping) {
        slot *best = NULL;
        int best_lcp = -1;
        job *j = s->qhead;
        slot *lru = NULL;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->j) continue;
            if (!lru || sl->last_used < lru->last_used) lru = sl;
            const int32_t *h = dsf_session_tokens(sl->s);
            int n = dsf_session_n_past(sl->s), l = 0;
            while (l < n && l < j->req.n_prompt && h[l] == j->req.prompt[l]) l++;
            /* Reuse a slot only when the prompt continues what it holds (at least half of
             * the slot's history or of the prompt is shared); otherwise take the least
             * recently used slot and leave other conversations' caches alone. */
            if (l == 0 || (2 * l < n && 2 * l < j->req.n_prompt)) continue;
            if (l > best_lcp || (l == best_lcp && sl->last_used < best->last_used)) best = sl, best_lcp = l;
        }
        if (!best) best = lru;
        if (!best) return;
        s->qhead = j->next;
        if (!s->qhead) s->qtail = NULL;
        s->n_queued--;
        j->next = NULL;
        j->slot_id = best->id;
        best->j = j;
        pthread_cond_signal(&s->sched_cv);
    }
}

static void *sched_main(void *arg) {
    srv_server *s = arg;
    job **assigned = dsf_xcalloc((size_t)s->n_slots, sizeof *assigned);
    int rr = 0; /* the slot after the one that prefilled last */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool any = false;
        for (;;) {
            for (int i = 0; i < s->n_slots; i++) any |= (assigned[i] = s->slots[i].j) != NULL;
            if (any || s->stopping) break;
            pthread_cond_wait(&s->sched_cv, &s->mu);
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);

        /* (1) new jobs in, cancelled jobs out (all of them when stopping) */
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->cur && assigned[i]) {
                if (stopping) {
                    sl->cur = assigned[i];
                    sl->cur->outcome = "cancelled";
                    slot_release(sl);
                    continue;
                }
                job_start(sl, assigned[i]);
            }
            if (!sl->cur || (!stopping && !atomic_load(&sl->cur->cancelled))) continue;
            if (sl->phase == SL_PREFILL) job_abort_prefill(sl, "cancelled");
            else job_end_generation(sl);
        }
        if (stopping) break;

        /* (2) one batched forward for every decoding slot */
        int n = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->phase != SL_DECODE) continue;
            s->b_sess[n] = sl->s;
            s->b_tok[n] = sl->next_tok;
            s->b_slot[n] = sl;
            if (++n == s->max_batch) {
                decode_batch(s, n);
                n = 0;
            }
        }
        if (n) decode_batch(s, n);

        /* (3) one prefill chunk, slots taking turns */
        for (int k = 0; k < s->n_slots; k++) {
            slot *sl = &s->slots[(rr + k) % s->n_slots];
            if (sl->phase != SL_PREFILL) continue;
            rr = (sl->id + 1) % s->n_slots;
            slot_prefill_step(sl);
            break;
        }
    }
    free(assigned);
    return NULL;
}

/* ==== HTTP =============================================================================== */

typedef struct {
    dsf_buf body;
    bool too_large;
    bool early; /* a response was queued before the body was read */
    double t0;
    int req_no;
} conn_state;

/* The one log line per request (DSF_LOG >= 1). */
static void log_line(srv_server *s, int req_no, const char *method, const char *url, int slot_id, int n_prompt,
                     int n_cached, int n_gen, double tps, int status, const char *outcome, double t0) {
    (void)s;
    dsf_log(1, "serve: req %d %s %s slot %d prompt %d cached %d gen %d %.1f tok/s %.3f s status %d %s", req_no, method,
            url, slot_id, n_prompt, n_cached, n_gen, tps, dsf_now() - t0, status, outcome ? outcome : "");
}

/* The log line of a generation request, with its decode batch sizes (mean and largest). */
static void log_job(srv_server *s, int req_no, const char *method, const char *url, const job *j, int status,
                    const char *outcome, double t0) {
    dsf_log(1, "serve: req %d %s %s slot %d prompt %d cached %d gen %d %.1f tok/s batch %.1f/%d %.3f s status %d %s",
            req_no, method, url, j->slot_id, j->req.n_prompt, j->n_cached, j->n_gen, j->tps,
            j->batch_n ? (double)j->batch_sum / j->batch_n : 0.0, j->batch_max, dsf_now() - t0, status,
            outcome ? outcome : "");
    (void)s;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, const char *body) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                                  const char *url, const srv_error *e) {
    char *body = srv_error_json(e);
    enum MHD_Result r = send_json(c, e->status, body);
    free(body);
    log_line(s, cs ? cs->req_no : 0, method, url, -1, 0, 0, 0, 0, e->status, e->message, cs ? cs->t0 : dsf_now());
    return r;
}

/* True when the peer has closed its end of the socket. */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLRDHUP) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    return false;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Cancels a job from its connection: a queued job leaves the queue at once. */
static void job_cancel(srv_server *s, job *j) {
    atomic_store(&j->cancelled, 1);
    pthread_mutex_lock(&s->mu);
    if (!j->done && j->slot_id < 0) {
        for (job **pp = &s->qhead; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                s->n_queued--;
                break;
            }
        s->qtail = NULL;
        for (job *q = s->qhead; q; q = q->next) s->qtail = q;
        j->done = true;
        j->outcome = "cancelled";
        j->refs--; /* the queue's reference (the connection still holds its own) */
    }
    pthread_mutex_unlock(&s->mu);
}

typedef struct {
    srv_server *s;
    job *j;
    double last_send;
    bool logged;
    char method[8];
    char url[40];
    int req_no;
} stream_ctx;

static void stream_log(stream_ctx *sc) {
    if (sc->logged) return;
    sc->logged = true;
    job *j = sc->j;
    log_job(sc->s, sc->req_no, sc->method, sc->url, j, atomic_load(&j->cancelled) ? 499 : j->status ? j->status : 200,
            j->outcome ? j->outcome : "cancelled", j->t0);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    srv_server *s = sc->s;
    job *j = sc->j;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (j->out_pos < j->out.len) {
            size_t n = j->out.len - j->out_pos;
            if (n > max) n = max;
            memcpy(buf, j->out.data + j->out_pos, n);
            j->out_pos += n;
            pthread_mutex_unlock(&s->mu);
            sc->last_send = dsf_now();
            return (ssize_t)n;
        }
        if (j->done) {
            pthread_mutex_unlock(&s->mu);
            stream_log(sc);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (atomic_load(&j->cancelled)) break;
        pthread_mutex_unlock(&s->mu);
        if (peer_gone(j->fd) || s->stopping) {
            job_cancel(s, j);
            pthread_mutex_lock(&s->mu);
            break;
        }
        /* spec: keep-alive comments while the prompt waits or is prefilled */
        if (dsf_now() - sc->last_send >= s->p.keepalive_ms / 1000.0) {
            static const char ka[] = ": keep-alive\n\n";
            if (max < sizeof ka - 1) return 0;
            memcpy(buf, ka, sizeof ka - 1);
            sc->last_send = dsf_now();
            return (ssize_t)(sizeof ka - 1);
        }
        pthread_mutex_lock(&s->mu);
        int ms = s->p.keepalive_ms < WAIT_SLICE_MS ? s->p.keepalive_ms : WAIT_SLICE_MS;
        timed_wait(&j->cv, &s->mu, ms > 0 ? ms : 1);
    }
    pthread_mutex_unlock(&s->mu);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    job *j = sc->j;
    pthread_mutex_lock(&sc->s->mu);
    bool done = j->done;
    pthread_mutex_unlock(&sc->s->mu);
    if (!done) job_cancel(sc->s, j);
    /* The slot notices the cancel at its next token; wait so that the log line is final. */
    pthread_mutex_lock(&sc->s->mu);
    while (!j->done) timed_wait(&j->cv, &sc->s->mu, WAIT_SLICE_MS);
    pthread_mutex_unlock(&sc->s->mu);
    stream_log(sc);
    job_unref(sc->s, j);
    free(sc);
}

static job *job_new(srv_server *s, srv_req *req, int fd, int req_no) {
    job *j = dsf_xcalloc(1, sizeof *j);
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->refs = 2;
    j->fd = fd;
    j->slot_id = -1;
    j->t0 = dsf_now();
    j->rng = dsf_rng_init((uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)j ^
                          ((uint64_t)req_no << 32) ^ (uint64_t)(dsf_now() * 1e9));
    pthread_cond_init(&j->cv, NULL);
    char rid[32];
    rand_alnum(rid, 24, &j->rng);
    snprintf(j->meta.id, sizeof j->meta.id, "%s%s", j->req.kind == SRV_CHAT ? "chatcmpl-" : "cmpl-", rid);
    j->meta.model = s->model_name;
    j->meta.created = (long long)time(NULL);
    return j;
}

static enum MHD_Result handle_generate(srv_server *s, struct MHD_Connection *c, conn_state *cs, srv_kind kind,
                                       const char *method, const char *url) {
    srv_req req;
    srv_error e;
    if (srv_parse_request(kind, (const char *)cs->body.data, cs->body.len, s->tok, s->n_ctx, &req, &e))
        return send_error(s, c, cs, method, url, &e);
    int nv = dsf_engine_n_vocab(s->e); /* the tokenizer may name more ids than the model has rows */
    for (int i = 0; i < req.n_prompt; i++)
        if (req.prompt[i] >= nv) {
            srv_fail(&e, 400, "prompt", "invalid_value", "token id %d at prompt[%d] is outside the model's vocabulary (%d)",
                     (int)req.prompt[i], i, nv);
            srv_req_free(&req);
            return send_error(s, c, cs, method, url, &e);
        }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;

    pthread_mutex_lock(&s->mu);
    if (s->n_queued >= s->p.max_queue || s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_req_free(&req);
        if (s->stopping) srv_fail(&e, 503, NULL, "server_stopping", "the server is shutting down");
        else srv_fail(&e, 503, NULL, "server_busy", "too many requests are waiting (%d); retry later", s->p.max_queue);
        return send_error(s, c, cs, method, url, &e);
    }
    job *j = job_new(s, &req, fd, cs->req_no);
    j->t0 = cs->t0;
    if (j->req.stream && kind == SRV_CHAT) {
        /* The role chunk goes first, before the slot can produce anything. */
        json_t *choice;
        json_t *ch = srv_chunk(&j->meta, kind, &choice);
        json_t *delta = json_object_get(choice, "delta");
        json_object_set_new(delta, "role", json_string("assistant"));
        json_object_set_new(delta, "content", json_string(""));
        srv_sse_json(&j->out, ch);
        json_decref(ch);
    }
    if (s->qtail) s->qtail->next = j;
    else s->qhead = j;
    s->qtail = j;
    s->n_queued++;
    assign(s);
    pthread_mutex_unlock(&s->mu);

    if (j->req.stream) {
        stream_ctx *sc = dsf_xcalloc(1, sizeof *sc);
        sc->s = s;
        sc->j = j;
        sc->last_send = dsf_now();
        sc->req_no = cs->req_no;
        snprintf(sc->method, sizeof sc->method, "%s", method);
        snprintf(sc->url, sizeof sc->url, "%s", url);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sc, stream_free);
        if (!r) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
    }

    /* Non-streaming: wait here (thread per connection), watching the socket. */
    pthread_mutex_lock(&s->mu);
    while (!j->done) {
        if (!atomic_load(&j->cancelled)) {
            pthread_mutex_unlock(&s->mu);
            if (peer_gone(fd) || s->stopping) job_cancel(s, j);
            pthread_mutex_lock(&s->mu);
            if (j->done) break;
        }
        timed_wait(&j->cv, &s->mu, WAIT_SLICE_MS);
    }
    pthread_mutex_unlock(&s->mu);
    enum MHD_Result ret;
    int status = j->status;
    if (atomic_load(&j->cancelled) || !j->body) {
        status = 499;
        ret = MHD_NO; /* the client is gone: close the connection */
    } else {
        ret = send_json(c, j->status, j->body);
    }
    log_job(s, cs->req_no, method, url, j, status, j->outcome ? j->outcome : "cancelled", cs->t0);
    job_unref(s, j);
    return ret;
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

    if (s->p.api_key && !path_is(url, "/health")) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        bool ok = auth && !strncmp(auth, "Bearer ", 7) && !strcmp(auth + 7, s->p.api_key);
        if (!ok) {
            srv_fail(&e, 401, NULL, "invalid_api_key",
                     auth ? "Incorrect API key provided" : "Missing API key: send 'Authorization: Bearer <key>'");
            return send_error(s, c, cs, method, url, &e);
        }
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (path_is(url, "/health") || path_is(url, "/v1/health")) {
        if (!get) goto not_allowed;
        unsigned long long fw = atomic_load(&s->st_forwards), tk = atomic_load(&s->st_tokens);
        json_t *h = json_pack("{s:s,s:i,s:{s:I,s:I,s:i,s:f}}", "status", "ok", "slots", s->n_slots, "decode",
                              "forwards", (json_int_t)fw, "tokens", (json_int_t)tk, "max_batch",
                              atomic_load(&s->st_max_batch), "avg_batch", fw ? (double)tk / (double)fw : 0.0);
        char *body = json_dumps(h, JSON_COMPACT);
        json_decref(h);
        enum MHD_Result r = send_json(c, 200, body);
        free(body);
        log_line(s, cs->req_no, method, url, -1, 0, 0, 0, 0, 200, "ok", cs->t0);
        return r;
    }
    if (path_is(url, "/v1/models")) {
        if (!get) goto not_allowed;
        json_t *m = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:{s:i,s:i}}]}", "object", "list", "data", "id", s->model_name,
                              "object", "model", "created", (json_int_t)s->created, "owned_by", "dsflash", "meta",
                              "n_ctx", s->n_ctx, "n_slots", s->n_slots);
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
    (void)cls;
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    dsf_buf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ==== lifetime ============================================================================ */

static void free_server(srv_server *s) {
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        dsf_gen_free(s->slots[i].g);
        dsf_session_free(s->slots[i].s);
    }
    free(s->b_sess);
    free(s->b_tok);
    free(s->b_slot);
    free(s->b_logits);
    free(s->slots);
    dsf_tokenizer_free(s->tok);
    dsf_engine_close(s->e);
    free(s->model_name);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->sched_cv);
    free(s);
}

srv_server *srv_start(const srv_params *p, char *err) {
    if (!p->model_path) return dsf_seterr(err, "no model (-m FILE)"), NULL;
    if (p->n_slots < 1 || p->n_slots > 256) return dsf_seterr(err, "--slots must be within 1..256, got %d", p->n_slots), NULL;
    if (p->port < 0 || p->port > 65535) return dsf_seterr(err, "--port must be within 0..65535, got %d", p->port), NULL;
    srv_server *s = dsf_xcalloc(1, sizeof *s);
    s->p = *p;
    if (s->p.max_body == 0) s->p.max_body = 8u << 20;
    if (s->p.max_queue <= 0) s->p.max_queue = 256;
    if (s->p.keepalive_ms <= 0) s->p.keepalive_ms = 5000;
    if (s->p.idle_timeout_s <= 0) s->p.idle_timeout_s = 600;
    /* libmicrohttpd closes a connection idle for the timeout: keep-alives must come sooner */
    if (s->p.keepalive_ms > s->p.idle_timeout_s * 500) s->p.keepalive_ms = s->p.idle_timeout_s * 500;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    s->created = (long long)time(NULL);
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
    ep.numerics = p->numerics;
    s->e = dsf_engine_open(p->model_path, &ep, err);
    if (!s->e) goto fail;
    s->tok = dsf_tokenizer_load(p->model_path, err);
    if (!s->tok) goto fail;
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
    s->d = MHD_start_daemon(MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                MHD_USE_ERROR_LOG,
                            (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned int)s->p.idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)1024,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1, MHD_OPTION_END);
    if (!s->d) {
        dsf_seterr(err, "cannot listen on %s:%d (%s)", host, p->port, strerror(errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    int perr = dsf_thread_start(&s->sched, sched_main, s);
    if (perr) {
        dsf_seterr(err, "cannot start the scheduler thread (%s)", strerror(perr));
        goto fail;
    }
    s->sched_running = true;
    return s;
fail:
    if (s->d) MHD_stop_daemon(s->d);
    free_server(s);
    return NULL;
}

int srv_port(const srv_server *s) { return s ? s->port : -1; }

void srv_stop(srv_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->sched_cv);
    pthread_mutex_unlock(&s->mu);
    /* The scheduler ends every running job as cancelled and exits; connection threads see
     * `stopping`, cancel their queued jobs and finish. */
    MHD_stop_daemon(s->d);
    if (s->sched_running) pthread_join(s->sched, NULL);
    free_server(s);
}
