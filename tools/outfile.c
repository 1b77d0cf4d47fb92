/* outfile.c: see outfile.h. */
#include "outfile.h"
#include "base/util.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[4096]; /* the .tmp path, removed by the signal handler */
static const char *g_out;

static void on_signal(int sig) {
    if (g_tmp[0]) unlink(g_tmp); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

const char *outfile_begin(const char *out) {
    if (snprintf(g_tmp, sizeof g_tmp, "%s.tmp", out) >= (int)sizeof g_tmp) {
        g_tmp[0] = 0;
        return NULL;
    }
    g_out = out;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    return g_tmp;
}

int outfile_end(int rc, char *err) {
    if (rc == 0 && rename(g_tmp, g_out) != 0) {
        rc = dsf_seterr(err, "cannot rename %s to %s", g_tmp, g_out);
    }
    if (rc) unlink(g_tmp);
    g_tmp[0] = 0;
    return rc;
}
