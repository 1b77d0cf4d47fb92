/* server_conn.c: the server's connections: how many are open, each one's read deadline, and
 * the watcher thread.
 *
 * Owns: the list of open connections (libmicrohttpd's connection notifications), the read
 * deadline of each (--read-timeout: a request's headers and body must have arrived that many
 * seconds after the connection opened or its previous answer ended; a connection past it is
 * shut down, which libmicrohttpd sees as a hang-up and closes), and the watcher thread, which
 * enforces the deadlines and runs srv_job_watch (hang-ups and keep-alive comments of
 * connections suspended on a job).
 * Must not: call libmicrohttpd on a connection from the watcher (only shutdown(2) on its
 * socket, which is thread-safe: the socket stays open until the connection's CLOSED
 * notification, which takes conn_mu first); answer requests (server.c does).
 * Why a deadline beside libmicrohttpd's --timeout: that one is an idle timeout, restarted by
 * every byte, so a client that sends one byte per second holds its connection forever. The
 * deadline does not apply while a request is answered, so long SSE streams are not cut.
 * Locking: conn_mu protects the list and the deadlines; it is never held with srv->mu. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server_int.h"

struct srv_conn {
    int fd;
    double deadline; /* conn_mu: when the request must have arrived (dsf_now seconds); 0: none */
    srv_conn *prev, *next;
};

void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code) {
    srv_server *s = cls;
    srv_conn *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        k = dsf_xcalloc(1, sizeof *k);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->deadline = dsf_now() + s->p.read_timeout_s;
        pthread_mutex_lock(&s->conn_mu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->conn_mu);
        atomic_fetch_add(&s->n_conn, 1);
        *socket_context = k;
        return;
    }
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    if (k->prev) k->prev->next = k->next;
    else s->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&s->conn_mu);
    atomic_fetch_sub(&s->n_conn, 1);
    free(k);
    *socket_context = NULL;
}

static void set_deadline(srv_server *s, struct MHD_Connection *c, double deadline) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conn *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->deadline = deadline;
    pthread_mutex_unlock(&s->conn_mu);
}

void srv_conn_received(srv_server *s, struct MHD_Connection *c) { set_deadline(s, c, 0); }

void srv_conn_answered(srv_server *s, struct MHD_Connection *c) { set_deadline(s, c, dsf_now() + s->p.read_timeout_s); }

int srv_conn_busy(srv_server *s) {
    int n = 0;
    pthread_mutex_lock(&s->conn_mu);
    for (srv_conn *k = s->conns; k; k = k->next) n += k->deadline == 0; /* no deadline while answering */
    pthread_mutex_unlock(&s->conn_mu);
    return n;
}

void *srv_conn_watch_main(void *arg) {
    srv_server *s = arg;
    /* the period bounds how late a keep-alive comment or a hang-up is noticed */
    int ms = s->p.keepalive_ms < 50 ? s->p.keepalive_ms : 50;
    struct timespec ts = {0, (long)(ms > 0 ? ms : 1) * 1000000L};
    while (!atomic_load(&s->watch_stop)) {
        nanosleep(&ts, NULL);
        double now = dsf_now();
        int closed = 0;
        pthread_mutex_lock(&s->conn_mu);
        for (srv_conn *k = s->conns; k; k = k->next)
            if (k->deadline > 0 && now >= k->deadline && k->fd >= 0) {
                shutdown(k->fd, SHUT_RDWR);
                k->deadline = 0;
                closed++;
            }
        pthread_mutex_unlock(&s->conn_mu);
        for (int i = 0; i < closed; i++) srv_metrics_read_timeout(s);
        if (closed)
            dsf_log(2, "serve: closed %d connection%s without a complete request after %d s", closed,
                    closed == 1 ? "" : "s", s->p.read_timeout_s);
        pthread_mutex_lock(&s->mu);
        srv_job_watch(s, now);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}
