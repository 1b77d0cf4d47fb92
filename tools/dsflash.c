/* dsflash.c: the dsflash binary's entry point. Dispatches to the registered subcommands. */
#include "cmd.h"
#include "dsflash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct { const char *name, *summary; dsf_cmd_fn fn; } cmd_entry;
static cmd_entry g_cmds[64];
static int g_ncmd;

void dsf_cmd_register(const char *name, const char *summary, dsf_cmd_fn fn) {
    if (g_ncmd < 64) g_cmds[g_ncmd++] = (cmd_entry){name, summary, fn};
}

int dsf_cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

static int cmp_cmd(const void *a, const void *b) {
    return strcmp(((const cmd_entry *)a)->name, ((const cmd_entry *)b)->name);
}

static void usage(FILE *f) {
    fprintf(f, "dsflash: a C inference engine for DeepSeek-V4.1-Flash (GGUF arch deepseek41)\n\n"
               "usage: dsflash COMMAND [options]   (dsflash COMMAND --help for details)\n"
               "       dsflash --version\n\ncommands:\n");
    for (int i = 0; i < g_ncmd; i++) fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].summary);
}

/* This thread runs a share of every engine job (the pool's caller is thread 0), and the
 * matmul kernels keep chunk buffers of up to 512 KiB on the stack. The main thread's stack
 * grows on demand up to the soft RLIMIT_STACK, so a small soft limit is raised (within the
 * hard one) to what the engine's other threads get (threads.h DSF_THREAD_STACK). */
static void raise_stack_limit(void) {
    const rlim_t want = (rlim_t)16 << 20;
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    setrlimit(RLIMIT_STACK, &rl);
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < ((rlim_t)2 << 20))
        fprintf(stderr, "dsflash: warning: the stack limit is %llu KiB (ulimit -s) and cannot be raised; running a "
                        "model needs at least 2048 KiB\n", (unsigned long long)(rl.rlim_cur >> 10));
}

int main(int argc, char **argv) {
    raise_stack_limit();
    qsort(g_cmds, (size_t)g_ncmd, sizeof g_cmds[0], cmp_cmd);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("dsflash %s\n", dsf_build_commit);
        return 0;
    }
    /* an MPI job (--parallel): every rank runs the command; the engine it opens is spread
     * over them (dsflash.h, dsf_dist_init) */
    char err[DSF_ERR_LEN];
    /* inspect --parallel describes a job without starting one (cmd_inspect.c) */
    if (strcmp(argv[1], "inspect") != 0 && dsf_dist_init(&argc, &argv, err) < 0) {
        fprintf(stderr, "dsflash: %s\n", err);
        return 2;
    }
    for (int i = 0; i < g_ncmd; i++)
        if (!strcmp(argv[1], g_cmds[i].name)) {
            int rc = g_cmds[i].fn(argc - 1, argv + 1);
            dsf_dist_end(rc);
            return rc;
        }
    fprintf(stderr, "dsflash: unknown command '%s' (try dsflash --help)\n", argv[1]);
    return 2;
}
