/* comm.c: MPI point-to-point messages with bounded waits, heartbeats and counters (comm.h).
 *
 * Every wait polls (MPI_Test) rather than blocks, so that it can give up: when the peer has
 * not been heard for liveness_s, when a data wait passes timeout_s, when the launcher asked
 * this process to stop, or when another rank was found dead (the job is broken then). The
 * heartbeat thread has its own communicator and sends one byte to every rank every 100 ms;
 * a rank whose last byte is older than liveness_s is dead. Messages larger than 1 GiB go in
 * pieces (MPI counts are ints). */
#include "net/comm.h"
#include "base/util.h"

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_fail[512];
static atomic_int g_failed; /* 0: no failure; 1: its message is being written; 2: written */
static volatile sig_atomic_t g_stop;

bool comm_failed(void) { return atomic_load(&g_failed) != 0 || g_stop; }
const char *comm_failure(void) {
    int f = atomic_load(&g_failed);
    if (!f && g_stop) return "the MPI launcher is stopping the job (a rank died or was killed; mpirun names it)";
    while (f == 1) f = atomic_load(&g_failed); /* another thread is writing it (a few microseconds) */
    return g_fail;
}
void comm_note_stop(void) { g_stop = 1; }

#ifndef DSF_HAVE_MPI

int comm_start(int *argc, char ***argv, const comm_params *p, char *err) {
    (void)argc, (void)argv, (void)p;
    return dsf_seterr(err, "this dsflash was built without MPI (install libopenmpi-dev and rebuild: the Makefile "
                           "finds it with pkg-config ompi-c)");
}
bool comm_started(void) { return false; }
int comm_rank(void) { return 0; }
int comm_size(void) { return 1; }
const char *comm_host(int rank) { (void)rank; return "?"; }
static int no_peer(char *err) { return dsf_seterr(err, "no MPI in this build: there is no other rank"); }
int comm_send(int peer, int tag, const void *buf, size_t n, char *err) { (void)peer, (void)tag, (void)buf, (void)n; return no_peer(err); }
int comm_recv(int peer, int tag, void *buf, size_t n, bool idle, char *err) { (void)peer, (void)tag, (void)buf, (void)n, (void)idle; return no_peer(err); }
int comm_send_blob(int peer, int tag, const void *buf, size_t n, char *err) { return comm_send(peer, tag, buf, n, err); }
int comm_recv_blob(int peer, int tag, uint8_t **buf, size_t *n, size_t max, bool idle, char *err) {
    (void)buf, (void)n, (void)max;
    return comm_recv(peer, tag, NULL, 0, idle, err);
}
int comm_isend(int peer, int tag, const void *buf, size_t n, comm_req *r, char *err) {
    memset(r, 0, sizeof *r);
    return comm_send(peer, tag, buf, n, err);
}
int comm_isend_blob(int peer, int tag, const void *buf, size_t n, comm_req *r, char *err) {
    return comm_isend(peer, tag, buf, n, r, err);
}
int comm_wait(comm_req *r, char *err) { (void)r, (void)err; return 0; }
bool comm_check(void) { return true; }
void comm_stats_get(comm_stats *s) { memset(s, 0, sizeof *s); }
void comm_stats_reset(void) {}
_Noreturn void comm_exit(int code, bool failed) { (void)failed; exit(code); }
void comm_finish(void) {}

#else

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

/* The first failure wins; later ones keep its message. */
static int fail(char *err, const char *fmt, ...) DSF_PRINTF(2, 3);
static int fail(char *err, const char *fmt, ...) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&g_failed, &expect, 1)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_fail, sizeof g_fail, fmt, ap);
        va_end(ap);
        atomic_store(&g_failed, 2); /* readers on other threads (a server's) see it whole */
    }
    return dsf_seterr(err, "%s", comm_failure());
}

#define PIECE ((size_t)1 << 30)
#define HB_PERIOD_US 100000

static struct {
    bool started;
    int rank, size;
    double timeout_s, liveness_s;
    char host[COMM_MAX_RANKS][64];
    MPI_Comm hb; /* the heartbeat thread's own communicator */
    pthread_t hb_thread;
    atomic_int hb_run;
    _Atomic double seen[COMM_MAX_RANKS]; /* dsf_now() of each rank's last heartbeat */
    pthread_mutex_t stats_mu;
    comm_stats st;
} C;

bool comm_started(void) { return C.started; }
int comm_rank(void) { return C.started ? C.rank : 0; }
int comm_size(void) { return C.started ? C.size : 1; }
const char *comm_host(int rank) { return C.started && rank >= 0 && rank < C.size ? C.host[rank] : "?"; }

/* dir > 0: one message of bytes sent; < 0: received; wait: seconds spent waiting */
static void count(int dir, size_t bytes, double wait) {
    pthread_mutex_lock(&C.stats_mu);
    if (dir > 0) C.st.bytes_sent += bytes, C.st.msgs_sent++;
    if (dir < 0) C.st.bytes_recv += bytes, C.st.msgs_recv++;
    C.st.wait_s += wait;
    pthread_mutex_unlock(&C.stats_mu);
}
void comm_stats_get(comm_stats *s) {
    pthread_mutex_lock(&C.stats_mu);
    *s = C.st;
    pthread_mutex_unlock(&C.stats_mu);
}
void comm_stats_reset(void) {
    pthread_mutex_lock(&C.stats_mu);
    memset(&C.st, 0, sizeof C.st);
    pthread_mutex_unlock(&C.stats_mu);
}

/* The first rank (other than self) not heard for liveness_s, or -1. */
static int silent_rank(void) {
    const double now = dsf_now();
    for (int p = 0; p < C.size; p++)
        if (p != C.rank && now - atomic_load(&C.seen[p]) > C.liveness_s) return p;
    return -1;
}

bool comm_check(void) {
    if (!C.started || C.size < 2 || comm_failed()) return !comm_failed();
    const int dead = silent_rank();
    if (dead >= 0)
        fail(NULL, "rank %d (host %s) has not answered for %.0f s: it died or hangs", dead, comm_host(dead), C.liveness_s);
    return !comm_failed();
}

static void *heartbeat(void *arg) {
    (void)arg;
    MPI_Request sreq[COMM_MAX_RANKS], rreq[COMM_MAX_RANKS];
    char sb = 1, rb[COMM_MAX_RANKS];
    for (int p = 0; p < C.size; p++) {
        sreq[p] = rreq[p] = MPI_REQUEST_NULL;
        if (p != C.rank) MPI_Irecv(&rb[p], 1, MPI_CHAR, p, 0, C.hb, &rreq[p]);
    }
    while (atomic_load(&C.hb_run)) {
        for (int p = 0; p < C.size; p++) {
            if (p == C.rank) continue;
            int done = 0;
            if (sreq[p] != MPI_REQUEST_NULL) MPI_Test(&sreq[p], &done, MPI_STATUS_IGNORE);
            if (sreq[p] == MPI_REQUEST_NULL) MPI_Isend(&sb, 1, MPI_CHAR, p, 0, C.hb, &sreq[p]);
            for (;;) { /* drain what arrived */
                done = 0;
                if (MPI_Test(&rreq[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
                atomic_store(&C.seen[p], dsf_now());
                MPI_Irecv(&rb[p], 1, MPI_CHAR, p, 0, C.hb, &rreq[p]);
            }
        }
        usleep(HB_PERIOD_US);
    }
    /* a peer's last byte may never come: cancel the receives; a send the peer never takes
     * is left to MPI_Finalize */
    for (int p = 0; p < C.size; p++) {
        if (rreq[p] != MPI_REQUEST_NULL) {
            MPI_Cancel(&rreq[p]);
            MPI_Request_free(&rreq[p]);
        }
        if (sreq[p] != MPI_REQUEST_NULL) MPI_Request_free(&sreq[p]);
    }
    return NULL;
}

static void on_term(int sig) {
    (void)sig;
    comm_note_stop();
}

int comm_start(int *argc, char ***argv, const comm_params *p, char *err) {
    if (C.started) return 0;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return dsf_seterr(err, "MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE) {
        MPI_Finalize();
        return dsf_seterr(err, "this MPI library does not support MPI_THREAD_MULTIPLE (the heartbeat thread needs it)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &C.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &C.size);
    if (C.size > COMM_MAX_RANKS) {
        MPI_Finalize();
        return dsf_seterr(err, "%d ranks: at most %d are supported", C.size, COMM_MAX_RANKS);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    C.timeout_s = p && p->timeout_s > 0 ? p->timeout_s : 600.0;
    C.liveness_s = p && p->liveness_s > 0 ? p->liveness_s : 10.0;
    char me[64] = {0};
    int len = 0;
    char name[MPI_MAX_PROCESSOR_NAME];
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS) snprintf(me, sizeof me, "%.*s", len, name);
    else snprintf(me, sizeof me, "?");
    MPI_Allgather(me, 64, MPI_CHAR, C.host, 64, MPI_CHAR, MPI_COMM_WORLD);
    pthread_mutex_init(&C.stats_mu, NULL);
    const double now = dsf_now();
    for (int r = 0; r < C.size; r++) atomic_store(&C.seen[r], now);
    C.started = true;
    struct sigaction old;
    if (sigaction(SIGTERM, NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (C.size > 1) {
        MPI_Comm_dup(MPI_COMM_WORLD, &C.hb);
        MPI_Comm_set_errhandler(C.hb, MPI_ERRORS_RETURN);
        atomic_store(&C.hb_run, 1);
        if (pthread_create(&C.hb_thread, NULL, heartbeat, NULL) != 0) {
            atomic_store(&C.hb_run, 0);
            return dsf_seterr(err, "cannot start the MPI heartbeat thread");
        }
    }
    return 0;
}

/* One poll of what a wait waits for: 1 done, 0 not yet, -1 an MPI error. */
typedef int (*poll_fn)(void *ctx);

typedef struct {
    int n;
    MPI_Request *r;
} reqs_ctx;

static int poll_reqs(void *ctx) {
    reqs_ctx *c = ctx;
    int done = 0;
    if (MPI_Testall(c->n, c->r, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return -1;
    return done;
}

/* Polls until done or the wait must end (comm.h). what/peer name the wait in the message. */
static int wait_poll(poll_fn fn, void *ctx, int peer, bool idle, const char *what, char *err) {
    const double t0 = dsf_now();
    long spins = 0;
    useconds_t nap = 0;
    for (;;) {
        const int done = fn(ctx);
        if (done < 0) return fail(err, "MPI reported an error %s rank %d (host %s)", what, peer, comm_host(peer));
        if (done) {
            count(0, 0, dsf_now() - t0);
            return 0;
        }
        if (comm_failed()) return dsf_seterr(err, "%s", comm_failure());
        if ((++spins & 63) == 0) {
            const int dead = silent_rank();
            if (dead >= 0)
                return fail(err, "rank %d (host %s) has not answered for %.0f s: it died or hangs", dead,
                            comm_host(dead), C.liveness_s);
            if (!idle && dsf_now() - t0 > C.timeout_s)
                return fail(err, "waited %.0f s %s rank %d (host %s) (--mpi-timeout)", C.timeout_s, what, peer,
                            comm_host(peer));
        }
        if (spins > 4096) { /* then back off, up to 0.5 ms, so that a waiting rank leaves the core */
            nap = nap < 500 ? nap + 10 : 500;
            usleep(nap);
        } else {
            sched_yield();
        }
    }
}

static int wait_all(int n, MPI_Request *r, int peer, bool idle, const char *what, char *err) {
    reqs_ctx c = {n, r};
    return wait_poll(poll_reqs, &c, peer, idle, what, err);
}

static int check_peer(int peer, char *err) {
    if (!C.started || peer < 0 || peer >= C.size || peer == C.rank)
        return dsf_seterr(err, "internal: no rank %d to talk to", peer);
    if (comm_failed()) return dsf_seterr(err, "%s", comm_failure());
    return 0;
}

static int post(bool send, int peer, int tag, void *buf, size_t n, MPI_Request **out, int *nreq, char *err) {
    if (check_peer(peer, err) < 0) return -1;
    const int pieces = n ? (int)((n + PIECE - 1) / PIECE) : 1;
    MPI_Request *r = dsf_xcalloc((size_t)pieces, sizeof *r);
    for (int k = 0; k < pieces; k++) {
        const size_t off = (size_t)k * PIECE, len = n - off < PIECE ? n - off : PIECE;
        int rc = send ? MPI_Isend((char *)buf + off, (int)len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r[k])
                      : MPI_Irecv((char *)buf + off, (int)len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r[k]);
        if (rc != MPI_SUCCESS) {
            free(r);
            return fail(err, "MPI refused a message %s rank %d (host %s)", send ? "to" : "from", peer, comm_host(peer));
        }
    }
    *out = r;
    *nreq = pieces;
    if (send) count(1, n, 0.0);
    return 0;
}

int comm_isend(int peer, int tag, const void *buf, size_t n, comm_req *q, char *err) {
    MPI_Request *r;
    memset(q, 0, sizeof *q);
    if (post(true, peer, tag, (void *)buf, n, &r, &q->n, err) < 0) return -1;
    q->reqs = r;
    q->peer = peer;
    return 0;
}

int comm_wait(comm_req *q, char *err) {
    if (!q->n) return 0;
    int rc = wait_all(q->n, q->reqs, q->peer, false, "sending to", err);
    free(q->reqs);
    memset(q, 0, sizeof *q);
    return rc;
}

int comm_send(int peer, int tag, const void *buf, size_t n, char *err) {
    comm_req q;
    if (comm_isend(peer, tag, buf, n, &q, err) < 0) return -1;
    return comm_wait(&q, err);
}

int comm_recv(int peer, int tag, void *buf, size_t n, bool idle, char *err) {
    MPI_Request *r;
    int nreq;
    if (post(false, peer, tag, buf, n, &r, &nreq, err) < 0) return -1;
    int rc = wait_all(nreq, r, peer, idle, "waiting for", err);
    free(r);
    if (rc == 0) count(-1, n, 0.0);
    return rc;
}

int comm_send_blob(int peer, int tag, const void *buf, size_t n, char *err) {
    if (n > (size_t)INT_MAX) return fail(err, "a message of %zu bytes to rank %d is too large (at most 2 GiB)", n, peer);
    return comm_send(peer, tag, buf, n, err);
}

int comm_isend_blob(int peer, int tag, const void *buf, size_t n, comm_req *r, char *err) {
    if (n > (size_t)INT_MAX) return fail(err, "a message of %zu bytes to rank %d is too large (at most 2 GiB)", n, peer);
    return comm_isend(peer, tag, buf, n, r, err);
}

typedef struct {
    int peer, tag, found;
    MPI_Message msg;
    MPI_Status st;
} probe_ctx;

static int poll_probe(void *ctx) {
    probe_ctx *c = ctx;
    if (MPI_Improbe(c->peer, c->tag, MPI_COMM_WORLD, &c->found, &c->msg, &c->st) != MPI_SUCCESS) return -1;
    return c->found != 0;
}

int comm_recv_blob(int peer, int tag, uint8_t **buf, size_t *n, size_t max, bool idle, char *err) {
    *buf = NULL;
    *n = 0;
    if (check_peer(peer, err) < 0) return -1;
    probe_ctx c;
    memset(&c, 0, sizeof c);
    c.peer = peer, c.tag = tag, c.msg = MPI_MESSAGE_NULL;
    if (wait_poll(poll_probe, &c, peer, idle, "waiting for", err) < 0) return -1;
    int len = 0;
    MPI_Get_count(&c.st, MPI_BYTE, &len);
    if (len < 0 || (size_t)len > max)
        return fail(err, "rank %d (host %s) sent a message of %d bytes (at most %zu expected)", peer, comm_host(peer),
                    len, max);
    uint8_t *b = malloc(len ? (size_t)len : 1);
    if (!b) return fail(err, "out of memory for a message of %d bytes from rank %d", len, peer);
    if (MPI_Mrecv(b, len, MPI_BYTE, &c.msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        free(b);
        return fail(err, "MPI reported an error receiving from rank %d (host %s)", peer, comm_host(peer));
    }
    count(-1, (size_t)len, 0.0);
    *buf = b;
    *n = (size_t)len;
    return 0;
}

static void stop_heartbeat(void) {
    if (C.size > 1 && atomic_exchange(&C.hb_run, 0)) pthread_join(C.hb_thread, NULL);
}

void comm_finish(void) {
    if (!C.started || comm_failed()) return;
    if (C.size > 1) { /* every rank reaches here before any finalizes; bounded by liveness */
        MPI_Request b;
        MPI_Ibarrier(MPI_COMM_WORLD, &b);
        char err[DSF_ERR_LEN];
        if (wait_all(1, &b, 0, true, "at the end, waiting for", err) < 0) return;
    }
    stop_heartbeat();
    if (C.size > 1) MPI_Comm_free(&C.hb);
    MPI_Finalize();
    C.started = false;
}

_Noreturn void comm_exit(int code, bool failed) {
    fflush(stdout);
    fflush(stderr);
    if (failed || comm_failed()) _exit(code ? code : 1); /* MPI_Finalize could wait on a dead rank */
    comm_finish();
    exit(code);
}

#endif
