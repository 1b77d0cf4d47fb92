/* server_int.h: the server's internal types and the functions its files share
 * (server.c: HTTP and lifetime; server_job.c: a job on its connection's side;
 * server_sched.c: the slots and the scheduler thread; server_conn.c: connection accounting,
 * read deadlines and the watcher thread; metrics.c: /metrics).
 * Must not: be included outside src/server/ (tools and tests use server.h); declare anything
 * that only one of its files uses.
 * Threads and locking: see the top of server.c; fields marked "srv->mu" are read and written
 * only under srv->mu, fields marked "scheduler thread only" only by the scheduler. */
#ifndef DSF_SERVER_INT_H
#define DSF_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "server/pcache.h"
#include "server/server.h"
#include "server/store.h"

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
    /* the connection waiting for this job (srv->mu; NULL once it let go); while `suspended`
     * libmicrohttpd does not poll it: srv_job_wake resumes it when output or the end arrives */
    struct MHD_Connection *conn;
    bool suspended;      /* srv->mu */
    double last_send;    /* srv->mu, streaming: when bytes last went out (keep-alive comments) */
    char method[8];      /* the request, for the log line written when the job is freed */
    char url[48];
    int req_no;
    atomic_int cancelled;
    bool done;           /* srv->mu: the slot (or the queue) let go; out is complete */
    int slot_id;
    job *next;           /* queue link */
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
    void *api_state;     /* the wire format's per-job stream state (malloc'ed, freed with the job) */
    /* for the log line */
    int n_prompt, n_cached, n_gen;
    long long batch_sum; /* scheduler: sum of the batch sizes of this job's decode forwards */
    int batch_n, batch_max;
    double tps;
    double prefill_s, decode_s; /* scheduler: the generation's wall times (/metrics) */
    const char *outcome;
    spec_stats sp;       /* scheduler: speculative decoding of this job (--draft) */
    int n_preamble;      /* scheduler: tokens before the prompt's first User/Assistant token */
    /* images (server_media.c): the expanded prompt (its tokens replace req.prompt) and its view */
    dsf_mm_prompt mm;    /* scheduler; mm.n == 0: a text prompt */
    dsf_media media;
    char img_log[96];    /* the log line's images part ("" without images) */
    /* srv->mu: a streaming job with images answers (200 and its stream, or an error status)
     * only once its images are encoded: its connection waits for this */
    bool ready;
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
    job *j;              /* srv->mu: set by srv_assign(), cleared when the scheduler lets go */
    double last_used;    /* srv->mu */
    /* scheduler thread only: */
    slot_phase phase;
    job *cur;            /* the job started on this slot (NULL: none yet) */
    gen_ctx ctx;
    dsf_gen_params gp;
    int32_t next_tok;    /* SL_DECODE: the token the next round evaluates */
    spec_seq *sq;        /* --draft: the slot's speculative state (attached to g), else NULL */
    bool in_batch_spec;  /* this round: sq is set and the slot's token joined the batch */
    int pf_end;          /* SL_PREFILL: where this prefill segment ends (a cache boundary or the prompt's end) */
    int pf_left;         /* SL_PREFILL: tokens of the segment not yet evaluated */
};

/* The prefix cache's counters for /metrics (the cache fills them through srv->cache_stats). */
typedef struct {
    unsigned long long hits, misses;  /* lookups that restored a prefix / found none */
    unsigned long long hit_tokens;    /* prompt tokens restored from the cache */
    unsigned long long evictions;     /* entries dropped to stay within the byte bound */
    unsigned long long bytes, entries; /* held now */
} srv_cache_stats;

typedef struct srv_conn srv_conn;

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
    /* speculative decoding (/health): rounds with a verification, drafted, verified and
     * accepted tokens, over completed jobs */
    atomic_ullong st_sp_rounds, st_sp_drafted, st_sp_verified, st_sp_accepted;
    srv_store *store;         /* stored responses (/v1/responses), thread-safe itself */
    /* connections (server_conn.c): every open one, with its read deadline */
    pthread_mutex_t conn_mu;
    srv_conn *conns;          /* conn_mu */
    atomic_int n_conn;
    int n_suspended;          /* srv->mu: connections suspended on a job */
    atomic_bool draining;     /* srv_drain: new requests get 503 */
    pthread_t watch;
    bool watch_running;
    atomic_bool watch_stop;
    struct srv_metrics *metrics; /* metrics.c */
    bool mpi;                 /* rank 0 of an MPI job of several ranks (srv_failure) */
    /* the prefix cache's hooks (NULL: none): its counters, and its flush at shutdown */
    void (*cache_stats)(srv_server *s, srv_cache_stats *out);
    void (*cache_flush)(srv_server *s);
    /* the disk prefix cache (--cache-dir; NULL: off), thread-safe itself; the rest: scheduler
     * thread only */
    pcache *pc;
    uint64_t pc_ident;        /* dsf_engine_state_id, the keys' seed */
    int32_t pc_user, pc_assistant; /* the turn tokens that end the preamble (-1: none) */
    double pc_prefill_tps;    /* measured prefill tokens/s (0: not yet) */
    double pc_restore_bps;    /* measured restore bytes/s (0: not yet) */
    atomic_ullong pc_hit_tokens; /* prompt tokens restored from the disk (/metrics) */
    /* images (server_media.c): the projector (NULL: none), scheduler thread only after start */
    dsf_vision *vis;
    int32_t image_tok;        /* <｜deepseek_image｜> */
};

/* ==== one API's wire format ================================================================
 * Each generation endpoint maps its request onto one srv_req and writes the job's output in
 * its own shape: server_oai.c for /v1/chat/completions and /v1/completions, server_msg_api.c
 * for /v1/messages, server_resp.c for /v1/responses. The scheduler and
 * the connection threads call these and know no API. Every function runs on the thread named
 * beside it; those writing to `out` append bytes for the client (SSE events, or nothing). */
typedef struct {
    const char *id_prefix; /* of j->meta.id, e.g. "chatcmpl-" */
    /* connection thread: body -> *out (400s etc. in e); 0 or -1 */
    int (*parse)(srv_server *s, const char *body, size_t len, srv_req *out, srv_error *e);
    /* connection thread, before the job is queued: the stream's first bytes (NULL: none) */
    void (*stream_begin)(srv_server *s, job *j, dsf_buf *out);
    /* scheduler: visible text as generated (NULL: not streamed this way) */
    void (*stream_text)(srv_server *s, job *j, const char *text, size_t len, dsf_buf *out);
    /* scheduler: one DSML event of a chat-shaped generation (NULL: not streamed this way) */
    void (*stream_dsml)(srv_server *s, job *j, const dsf_dsml_event *ev, dsf_buf *out);
    /* scheduler: the stream's last bytes after the generation (err: it failed with that error:
     * 500 generation_failed, or 503 mpi_job_failed when the MPI job failed) */
    void (*stream_end)(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u, const srv_error *err,
                       dsf_buf *out);
    /* scheduler, non-streaming: the reply body (malloc'ed JSON) */
    char *(*reply)(srv_server *s, job *j, const dsf_gen_result *res, const srv_usage *u);
    /* any thread: an error body in this API's shape (malloc'ed) */
    char *(*error_body)(const srv_error *e);
    int busy_status;       /* HTTP status of "too many requests waiting" (0: 503) */
    /* scheduler: each sampled token, before its text is streamed (NULL: none) */
    void (*on_token)(srv_server *s, job *j, const dsf_gen_token *t);
} srv_api;

/* The wire format of a request kind. */
const srv_api *srv_api_of(srv_kind kind);
extern const srv_api srv_api_messages; /* server_msg_api.c */
/* OpenAI Responses (server_resp.c). */
extern const srv_api srv_api_responses;
/* GET / DELETE /v1/responses/{id} (server_resp.c): the stored response, or its deletion
 * notice; a 404 in e when the id is unknown or evicted. Returns the malloc'ed JSON body or NULL. */
char *srv_resp_lookup(srv_server *s, const char *id, bool del, srv_error *e);
/* OpenAI's finish_reason for a generation result: stop, length or tool_calls. */
const char *srv_finish_reason(const dsf_gen_result *res);
/* The id of tool call `index` of the job, made on first use (scheduler thread). */
const char *srv_job_call_id(job *j, int index);

/* ==== jobs (server_job.c, connection threads) ============================================ */

/* A new job for req (taken over: *req is zeroed) with two references, the connection's and
 * the queue's; not yet queued. c: the connection that waits for it (its socket is polled for
 * hang-up). The request's log line is written when the job is freed. */
job *srv_job_new(srv_server *s, srv_req *req, struct MHD_Connection *c, int req_no, const char *method,
                 const char *url);
/* Drops one reference (takes srv->mu); the last one logs the request and frees the job. */
void srv_job_unref(srv_server *s, job *j);
/* Answers c with the job's SSE stream; the response owns the connection's reference. */
enum MHD_Result srv_job_stream(srv_server *s, struct MHD_Connection *c, job *j);
/* Non-streaming, from the access handler: true when the job is not done yet and the
 * connection was suspended (the handler is called again once srv_job_wake resumes it);
 * false when the answer can be sent now. until_ready: also stop waiting once j->ready (a
 * streaming job with images, whose status is known then). */
bool srv_job_park(srv_server *s, job *j, bool until_ready);
/* The connection lets go of the job (its answer was sent or it closed): a job that is not
 * done is cancelled; drops the connection's reference. */
void srv_job_release(srv_server *s, job *j);
/* Under srv->mu, scheduler side: output or the end arrived; resumes a suspended connection. */
void srv_job_wake(srv_server *s, job *j);
/* Under srv->mu, the watcher thread: cancels the waiting jobs whose client hung up and
 * resumes streams whose keep-alive comment is due. */
void srv_job_watch(srv_server *s, double now);
/* Under srv->mu, srv_stop: ends every queued job as cancelled and wakes its connection. */
void srv_job_cancel_queued(srv_server *s);
/* The log line of a generation request, with its decode batch sizes (mean and largest). */
void srv_log_job(srv_server *s, int req_no, const char *method, const char *url, const job *j, int status,
                 const char *outcome, double t0);

/* ==== connections (server_conn.c) ======================================================== */

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the server): counts the
 * connection and starts its read deadline. */
void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
/* The request on c has arrived whole: no read deadline until its answer is complete. */
void srv_conn_received(srv_server *s, struct MHD_Connection *c);
/* The answer on c is complete: the next request must arrive within --read-timeout. */
void srv_conn_answered(srv_server *s, struct MHD_Connection *c);
/* Connections whose request has arrived and whose answer is not yet complete (srv_abort). */
int srv_conn_busy(srv_server *s);
/* The watcher thread: read deadlines, hang-ups and keep-alives of waiting jobs (arg: the server). */
void *srv_conn_watch_main(void *arg);

/* ==== metrics (metrics.c) ================================================================ */

struct srv_metrics *srv_metrics_new(void);
void srv_metrics_free(struct srv_metrics *m);
/* One answered request (any thread). */
void srv_metrics_request(srv_server *s, const char *url, int status);
/* One finished generation job (any thread). */
void srv_metrics_job(srv_server *s, const job *j);
/* One connection refused with 503 at --max-conn / closed at its read deadline. */
void srv_metrics_conn_refused(srv_server *s);
void srv_metrics_read_timeout(srv_server *s);
/* The Prometheus text exposition (format 0.0.4), malloc'ed. */
char *srv_metrics_text(srv_server *s);

/* ==== the scheduler (server_sched.c) ===================================================== */

/* Under srv->mu: hands queued jobs to free slots (longest common prefix, then LRU). */
void srv_assign(srv_server *s);
/* The 503 of a failed MPI job (srv_failure's message fail) into e. */
void srv_fail_mpi(srv_error *e, const char *fail);
/* The scheduler thread (arg: the srv_server). */
void *srv_sched_main(void *arg);

/* ==== images (server_media.c) ============================================================= */

/* srv_start: opens --mmproj (nothing without it) and checks it against the model. */
int srv_media_open(srv_server *s, char *err);
void srv_media_close(srv_server *s);
/* Connection thread, after parsing: the request's images (req->images_json) within the
 * limits; 400 when there are images and no projector. */
int srv_media_request(srv_server *s, srv_req *req, srv_error *e);
/* Scheduler, a job with images starting: encodes them (dsf_vision_encode), expands the prompt
 * (dsf_mm_expand; j->req.prompt becomes the expanded ids, j->media its view) and checks the
 * context. 400 / 500 in e. */
int srv_media_prepare(srv_server *s, job *j, srv_error *e);
/* The job's content keys (NULL: a text prompt). */
const uint64_t *srv_job_keys(const job *j);

/* ==== the disk prefix cache (server_pcache.c) ============================================ */

/* srv_start, after the engine and tokenizer: opens --cache-dir (nothing without it). */
int srv_pc_open(srv_server *s, char *err);
/* free_server: writes what is queued and closes the cache. */
void srv_pc_close(srv_server *s);
/* The cache's counters (all zeros without --cache-dir), for /metrics; any thread. */
void srv_pcache_stats(srv_server *s, pcache_stats *out);
/* Scheduler, a job starting on sl: finds the preamble, and restores the longest cached prefix
 * from disk into the slot's session when that beats prefilling past what the slot holds.
 * Returns the prompt tokens the session then holds (at most n_prompt - 1), RAM or disk. */
int srv_pc_start_job(srv_server *s, slot *sl, job *j);
/* Scheduler: the end of the prefill segment after position `after` (the next boundary to
 * store, or n_prompt; always n_prompt without a cache). */
int srv_pc_boundary(const srv_server *s, const job *j, int after);
/* Scheduler: saves the slot's session (n tokens of j's prompt) into the cache (queued). */
void srv_pc_store(srv_server *s, slot *sl, const job *j, int n);
/* Scheduler: one prefill measurement (tokens evaluated in secs). */
void srv_pc_prefill_rate(srv_server *s, int tokens, double secs);

#endif
