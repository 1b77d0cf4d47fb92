/* dsflash.c: the dsflash binary's entry point. Dispatches to the registered subcommands. */
#include "cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
               "usage: dsflash COMMAND [options]   (dsflash COMMAND --help for details)\n\ncommands:\n");
    for (int i = 0; i < g_ncmd; i++) fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].summary);
}

int main(int argc, char **argv) {
    qsort(g_cmds, (size_t)g_ncmd, sizeof g_cmds[0], cmp_cmd);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < g_ncmd; i++)
        if (!strcmp(argv[1], g_cmds[i].name)) return g_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsflash: unknown command '%s' (try dsflash --help)\n", argv[1]);
    return 2;
}
