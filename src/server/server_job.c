/* server_job.c: a generation job on its connection's side (libmicrohttpd's pool threads and
 * the watcher thread).
 *
 * Owns: a job's creation and reference count, its cancellation from the connection (a queued
 * job leaves the queue at once; a running one is noticed by the scheduler at its next token),
 * the suspension of the connection while the job has nothing for it and its resumption
 * (srv_job_wake, called by the scheduler when output or the end arrives; srv_job_watch,
 * called by the watcher thread for hang-ups and keep-alive comments), the SSE content reader
 * of a streaming request, and the request's log line (written when the job is freed, by
 * whichever side lets go last).
 * Must not: call the engine or touch a slot (server_sched.c does); block a pool thread: a
 * connection with nothing to send is suspended (MHD_suspend_connection), never waited on.
 * Invariant: j->suspended (srv->mu) is true exactly between MHD_suspend_connection and
 * MHD_resume_connection on j->conn, both called under srv->mu, so a resume always follows
 * its suspend and a connection is never suspended twice; s->n_suspended counts them.
 * Threads and locking: see the top of server.c. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server_int.h"

/* ==== a job's lifetime ==================================================================== */

void srv_job_unref(srv_server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&s->mu);
    if (left) return;
    int status = atomic_load(&j->cancelled) || !j->status ? 499 : j->status;
    srv_metrics_job(s, j); /* before the request's count (srv_log_job): a scrape that sees the
                            * request counted sees its tokens too */
    srv_log_job(s, j->req_no, j->method, j->url, j, status, j->outcome ? j->outcome : "cancelled", j->t0);
    srv_req_free(&j->req);
    dsf_mm_prompt_free(&j->mm);
    dsf_buf_free(&j->out);
    free(j->ids);
    free(j->lp);
    free(j->body);
    free(j->api_state);
    free(j);
}

static void rand_alnum(char *out, int n, uint64_t *rng) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < n; i++) out[i] = al[(int)(dsf_rng_uniform(rng) * 62) % 62];
    out[n] = 0;
}

job *srv_job_new(srv_server *s, srv_req *req, struct MHD_Connection *c, int req_no, const char *method,
                 const char *url) {
    job *j = dsf_xcalloc(1, sizeof *j);
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->refs = 2;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = c;
    j->slot_id = -1;
    j->t0 = j->last_send = dsf_now();
    j->req_no = req_no;
    snprintf(j->method, sizeof j->method, "%s", method);
    snprintf(j->url, sizeof j->url, "%s", url);
    j->rng = dsf_rng_init((uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)j ^
                          ((uint64_t)req_no << 32) ^ (uint64_t)(dsf_now() * 1e9));
    char rid[32];
    rand_alnum(rid, 24, &j->rng);
    snprintf(j->meta.id, sizeof j->meta.id, "%s%s", srv_api_of(j->req.kind)->id_prefix, rid);
    j->meta.model = s->model_name;
    j->meta.created = (long long)time(NULL);
    return j;
}

/* The log line of a generation request, with its decode batch sizes (mean and largest). */
void srv_log_job(srv_server *s, int req_no, const char *method, const char *url, const job *j, int status,
                 const char *outcome, double t0) {
    char sp[96] = "";
    if (s->p.spec.draft)
        snprintf(sp, sizeof sp, " draft %lld/%lld accepted in %lld rounds", j->sp.accepted, j->sp.verified,
                 j->sp.rounds);
    dsf_log(1, "serve: req %d %s %s slot %d prompt %d%s cached %d gen %d %.1f tok/s batch %.1f/%d%s %.3f s status %d %s",
            req_no, method, url, j->slot_id, j->req.n_prompt, j->img_log, j->n_cached, j->n_gen, j->tps,
            j->batch_n ? (double)j->batch_sum / j->batch_n : 0.0, j->batch_max, sp, dsf_now() - t0, status,
            outcome ? outcome : "");
    srv_metrics_request(s, url, status);
}

/* ==== suspension and wake-ups ============================================================== */

/* Under srv->mu: the connection has nothing to do until srv_job_wake. */
static void job_suspend(srv_server *s, job *j) {
    j->suspended = true;
    s->n_suspended++;
    MHD_suspend_connection(j->conn);
}

void srv_job_wake(srv_server *s, job *j) {
    if (!j->suspended) return;
    j->suspended = false;
    s->n_suspended--;
    MHD_resume_connection(j->conn);
}

/* Under srv->mu: cancels a job from its connection's side; a queued job leaves the queue at
 * once (the connection still holds its own reference). */
static void job_cancel_locked(srv_server *s, job *j) {
    atomic_store(&j->cancelled, 1);
    if (j->done || j->slot_id >= 0) return;
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
    j->refs--; /* the queue's reference */
}

void srv_job_cancel_queued(srv_server *s) {
    while (s->qhead) {
        job *j = s->qhead;
        job_cancel_locked(s, j);
        srv_job_wake(s, j);
    }
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

/* Under srv->mu: one waiting job (queued or on a slot, not done). */
static void watch_job(srv_server *s, job *j, double now) {
    if (!j->suspended) return;
    if (peer_gone(j->fd)) { /* libmicrohttpd does not poll a suspended connection */
        job_cancel_locked(s, j);
        srv_job_wake(s, j);
    } else if (j->req.stream && now - j->last_send >= s->p.keepalive_ms / 1000.0) {
        srv_job_wake(s, j); /* the content reader writes the keep-alive comment */
    }
}

void srv_job_watch(srv_server *s, double now) {
    for (job *j = s->qhead, *next; j; j = next) {
        next = j->next; /* watch_job may unlink j */
        watch_job(s, j, now);
    }
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].j && !s->slots[i].j->done) watch_job(s, s->slots[i].j, now);
}

void srv_job_release(srv_server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    j->conn = NULL;
    if (!j->done) job_cancel_locked(s, j); /* a running job: the slot notices at its next token */
    pthread_mutex_unlock(&s->mu);
    srv_job_unref(s, j);
}

/* ==== non-streaming ======================================================================== */

bool srv_job_park(srv_server *s, job *j, bool until_ready) {
    pthread_mutex_lock(&s->mu);
    bool park = !j->done && !(until_ready && j->ready);
    if (park) {
        j->last_send = dsf_now(); /* no keep-alive before the headers: the watcher need not wake it */
        job_suspend(s, j);
    }
    pthread_mutex_unlock(&s->mu);
    return park;
}

/* ==== streaming: the SSE content reader ==================================================== */

typedef struct {
    srv_server *s;
    job *j;
} stream_ctx;

/* Returns the bytes the scheduler appended to j->out, a keep-alive comment when one is due,
 * the end, or 0 after suspending the connection (libmicrohttpd 0.9.75: returning 0 without
 * suspending would make its internal loop call again at once, a busy wait). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    srv_server *s = sc->s;
    job *j = sc->j;
    static const char ka[] = ": keep-alive\n\n";
    ssize_t ret = 0;
    pthread_mutex_lock(&s->mu);
    double now = dsf_now();
    if (j->out_pos < j->out.len) {
        size_t n = j->out.len - j->out_pos;
        if (n > max) n = max;
        memcpy(buf, j->out.data + j->out_pos, n);
        j->out_pos += n;
        j->last_send = now;
        ret = (ssize_t)n;
    } else if (j->done) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (atomic_load(&j->cancelled)) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (now - j->last_send >= s->p.keepalive_ms / 1000.0 && max >= sizeof ka - 1) {
        /* spec: keep-alive comments while the prompt waits or is prefilled */
        memcpy(buf, ka, sizeof ka - 1);
        j->last_send = now;
        ret = (ssize_t)(sizeof ka - 1);
    } else {
        job_suspend(s, j);
    }
    pthread_mutex_unlock(&s->mu);
    return ret;
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    srv_job_release(sc->s, sc->j);
    free(sc);
}

/* The streaming answer: stream_reader drains j->out; the response owns the connection's
 * reference to j (stream_free drops it). */
enum MHD_Result srv_job_stream(srv_server *s, struct MHD_Connection *c, job *j) {
    stream_ctx *sc = dsf_xcalloc(1, sizeof *sc);
    sc->s = s;
    sc->j = j;
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
