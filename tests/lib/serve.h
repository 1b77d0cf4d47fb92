/* serve.h: a `dsflash serve` child process for end-to-end tests (tests/e2e/server.c,
 * tests/e2e/sdk.c). No TEST here. */
#ifndef DSF_TEST_SERVE_H
#define DSF_TEST_SERVE_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int port;
    char log[512];       /* the server's stderr */
    char port_file[512]; /* unique to this server: every process of it has the path in its command line */
} test_server;

/* Starts `dsflash serve -m model --port 0 --threads 1 extra` (the binary under test) and waits
 * for its port (up to 60 s). The child dies with the test process. 0, or -1 with why in msg. */
int test_server_start(test_server *s, const char *model, const char *extra, char *msg, size_t cap);
/* The same with a shell prefix before the binary (environment assignments, test_mpirun(N) and
 * its options: s->pid is then mpirun, and rank 0 serves); prefix NULL: test_server_start. */
int test_server_start_with(test_server *s, const char *prefix, const char *model, const char *extra, char *msg,
                           size_t cap);
/* SIGTERM, then waits; the exit status (0 = clean), or -1 if it had to be killed. */
int test_server_stop(test_server *s);
/* Sends sig, then waits up to wait_s seconds: the exit status (128 + N after signal N), or
 * -1 if it had to be killed. */
int test_server_signal(test_server *s, int sig, int wait_s);

/* Starts a server into the new variable s (test_server_start), or fails the test. */
#define START(s, model, extra)                                                           \
    test_server s;                                                                       \
    do {                                                                                 \
        char why_[256];                                                                  \
        CHECKF(test_server_start(&s, model, extra, why_, sizeof why_) == 0, "%s", why_); \
    } while (0)
void test_sleep_ms(int ms);

#endif
