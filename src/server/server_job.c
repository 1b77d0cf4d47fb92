/* server_job.c: a generation job on its connection's side (connection threads).
 *
 * Owns: a job's creation and reference count, its cancellation from the connection (a queued
 * job leaves the queue at once; a running one is noticed by the scheduler at its next token),
 * the wait of a non-streaming request and the SSE content reader of a streaming one, which
 * drains the bytes the scheduler appends to j->out and sends keep-alive comments meanwhile;
 * and the request's log line.
 * Must not: call the engine or touch a slot (server_sched.c does); hold srv->mu while it
 * polls the socket or sleeps (it waits on j->cv, which releases srv->mu).
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

#define WAIT_SLICE_MS 50 /* how often waiting connection threads check their socket */

/* ==== a job's lifetime ==================================================================== */

void srv_job_unref(srv_server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&s->mu);
    if (left) return;
    srv_req_free(&j->req);
    dsf_buf_free(&j->out);
    free(j->ids);
    free(j->lp);
    free(j->body);
    free(j->api_state);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void rand_alnum(char *out, int n, uint64_t *rng) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < n; i++) out[i] = al[(int)(dsf_rng_uniform(rng) * 62) % 62];
    out[n] = 0;
}

job *srv_job_new(srv_server *s, srv_req *req, int fd, int req_no) {
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
    snprintf(j->meta.id, sizeof j->meta.id, "%s%s", srv_api_of(j->req.kind)->id_prefix, rid);
    j->meta.model = s->model_name;
    j->meta.created = (long long)time(NULL);
    return j;
}

/* ==== waiting and streaming (connection threads) ========================================= */

/* The log line of a generation request, with its decode batch sizes (mean and largest). */
void srv_log_job(srv_server *s, int req_no, const char *method, const char *url, const job *j, int status,
                 const char *outcome, double t0) {
    char sp[96] = "";
    if (s->p.spec.draft)
        snprintf(sp, sizeof sp, " draft %lld/%lld accepted in %lld rounds", j->sp.accepted, j->sp.verified,
                 j->sp.rounds);
    dsf_log(1, "serve: req %d %s %s slot %d prompt %d cached %d gen %d %.1f tok/s batch %.1f/%d%s %.3f s status %d %s",
            req_no, method, url, j->slot_id, j->req.n_prompt, j->n_cached, j->n_gen, j->tps,
            j->batch_n ? (double)j->batch_sum / j->batch_n : 0.0, j->batch_max, sp, dsf_now() - t0, status,
            outcome ? outcome : "");
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
    srv_log_job(sc->s, sc->req_no, sc->method, sc->url, j,
                atomic_load(&j->cancelled) ? 499 : j->status ? j->status : 200, j->outcome ? j->outcome : "cancelled",
                j->t0);
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
    srv_job_unref(sc->s, j);
    free(sc);
}

/* The streaming answer: stream_reader drains j->out; the response owns the connection's
 * reference to j (stream_free drops it). */
enum MHD_Result srv_job_stream(srv_server *s, struct MHD_Connection *c, job *j, int req_no, const char *method,
                               const char *url) {
    stream_ctx *sc = dsf_xcalloc(1, sizeof *sc);
    sc->s = s;
    sc->j = j;
    sc->last_send = dsf_now();
    sc->req_no = req_no;
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

/* Non-streaming: the connection thread waits here (thread per connection), watching the socket. */
void srv_job_wait(srv_server *s, job *j, int fd) {
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
}
