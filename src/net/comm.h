/* comm.h: the processes of an MPI job, and the only door to MPI (comm.c is the one file that
 * includes mpi.h). Point-to-point messages between ranks, each wait bounded twice: by the
 * peer's liveness (a heartbeat thread hears from every rank several times a second) and, for
 * a wait on data, by a deadline; the launcher's stop (SIGTERM from mpirun when a rank died)
 * ends every wait too. Traffic counters for the measurements.
 *
 * Owns: MPI's start and end, the heartbeat thread, the failure message and its stickiness
 * (after the first failure every call fails at once with the same message).
 * Must not: know what the bytes mean (model/dist*.c do).
 * Built without MPI (no DSF_HAVE_MPI: pkg-config found no ompi-c), comm_start fails with a
 * message saying so and nothing else is ever called. */
#ifndef DSF_COMM_H
#define DSF_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COMM_MAX_RANKS 64

/* Tags: the op stream (rank 0 to the others), the forward's messages, replies to rank 0. */
enum { COMM_TAG_OP = 1, COMM_TAG_STREAM = 2, COMM_TAG_LOGITS = 3, COMM_TAG_MOE = 4, COMM_TAG_REPLY = 5 };

typedef struct {
    double timeout_s;  /* a wait on data: at most this long (<= 0: 600 s) */
    double liveness_s; /* a rank silent this long is dead (<= 0: 10 s) */
} comm_params;

/* Starts MPI (MPI_THREAD_MULTIPLE) and, with more than one rank, the heartbeat thread.
 * Returns 0, or -1 with err (no MPI in this build, MPI would not start). */
int comm_start(int *argc, char ***argv, const comm_params *p, char *err);
bool comm_started(void);
int comm_rank(void); /* 0 when not started */
int comm_size(void); /* 1 when not started */
const char *comm_host(int rank); /* the rank's host name ("?" unknown) */

/* Blocking sends and receives of n bytes; the receive wants exactly n. idle (receives only):
 * the wait has no deadline, only liveness (a follower waiting for rank 0's next op). */
int comm_send(int peer, int tag, const void *buf, size_t n, char *err);
int comm_recv(int peer, int tag, void *buf, size_t n, bool idle, char *err);
/* One message of a size the receiver does not know (< 2 GiB), received into malloc'ed memory
 * of at most max bytes. */
int comm_send_blob(int peer, int tag, const void *buf, size_t n, char *err);
int comm_recv_blob(int peer, int tag, uint8_t **buf, size_t *n, size_t max, bool idle, char *err);

/* A send in flight: the buffer must stay untouched until comm_wait returns. */
typedef struct {
    int n;
    int peer;
    void *reqs; /* MPI_Request[n] */
} comm_req;
int comm_isend(int peer, int tag, const void *buf, size_t n, comm_req *r, char *err);
int comm_isend_blob(int peer, int tag, const void *buf, size_t n, comm_req *r, char *err);
int comm_wait(comm_req *r, char *err);

/* Whether the job has failed (a dead or silent rank, a missed deadline, the launcher's stop),
 * and the message (empty while it has not). */
bool comm_failed(void);
const char *comm_failure(void);
/* Checks every rank's liveness now (a process that waits on nothing, e.g. an idle server,
 * asks): false, with the failure recorded, when a rank has been silent too long. */
bool comm_check(void);
/* Async-signal-safe: the launcher asked this process to stop (the caller's SIGTERM handler;
 * comm_start installs one that calls it when the program has none). */
void comm_note_stop(void);

/* Traffic since the last reset: what this rank sent and received, and the seconds it spent
 * waiting in comm calls. */
typedef struct {
    uint64_t bytes_sent, msgs_sent, bytes_recv, msgs_recv;
    double wait_s;
} comm_stats;
void comm_stats_get(comm_stats *s);
void comm_stats_reset(void);

/* Ends the job: with fail == false, waits (bounded) for every rank and finalizes MPI; with
 * fail == true (or after a failure) skips both, which can hang on a dead peer. Then exits
 * with code. */
_Noreturn void comm_exit(int code, bool fail);
/* Finalizes MPI if it was started and has not failed (a normal end of rank 0's main). */
void comm_finish(void);

#endif
