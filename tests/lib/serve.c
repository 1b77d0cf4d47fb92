/* serve.c: a `dsflash serve` child process for end-to-end tests (serve.h). */
#include "serve.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "test.h"

void test_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int test_server_start(test_server *s, const char *model, const char *extra, char *msg, size_t cap) {
    return test_server_start_with(s, NULL, model, extra, msg, cap);
}

int test_server_start_with(test_server *s, const char *prefix, const char *model, const char *extra, char *msg,
                           size_t cap) {
    static int n;
    char *pf = s->port_file;
    snprintf(pf, sizeof s->port_file, "%s/port-%d-%d", test_tmpdir(), (int)getpid(), n);
    snprintf(s->log, sizeof s->log, "%s/serve-%d-%d.log", test_tmpdir(), (int)getpid(), n++);
    unlink(pf);
    dsf_buf cb = {0};
    dsf_buf_appendf(&cb, "exec %s %s serve -m %s --port 0 --port-file %s --threads 1 %s 2>%s >/dev/null",
                    prefix ? prefix : "", test_bin(), model, pf, extra ? extra : "", s->log);
    const char *cmd = (const char *)cb.data;
    pid_t pid = fork();
    if (pid < 0) {
        dsf_buf_free(&cb);
        return snprintf(msg, cap, "fork failed"), -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test never leaves a server behind */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    dsf_buf_free(&cb);
    s->pid = pid;
    for (int i = 0; i < 600; i++) { /* up to 60 s: sanitizer builds start slowly */
        FILE *f = fopen(pf, "r");
        int port = 0;
        if (f) {
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok && port > 0) {
                s->port = port;
                return 0;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            snprintf(msg, cap, "server exited at start (see %.200s)", s->log);
            s->pid = 0;
            return -1;
        }
        test_sleep_ms(100);
    }
    snprintf(msg, cap, "server did not start");
    return -1;
}

int test_server_stop(test_server *s) { return test_server_signal(s, SIGTERM, 30); }

int test_server_signal(test_server *s, int sig, int wait_s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, sig);
    for (int i = 0; i < wait_s * 10; i++) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        test_sleep_ms(100);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}
