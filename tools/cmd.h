/* cmd.h: subcommands of the dsflash binary register themselves with DSF_COMMAND, so each
 * lives in its own tools/cmd_*.c file and no shared table needs editing.
 * A command returns the process exit status. It prints one clear error line on stderr
 * ("dsflash NAME: ...") and returns non-zero on failure. This header also declares the few
 * helpers that several commands share. */
#ifndef DSF_CMD_H
#define DSF_CMD_H

#include <stdint.h>

typedef int (*dsf_cmd_fn)(int argc, char **argv); /* argv[0] is the command name */
void dsf_cmd_register(const char *name, const char *summary, dsf_cmd_fn fn);

#define DSF_COMMAND(name, summary, fn)                                         \
    __attribute__((constructor)) static void dsf_cmd_reg_##name(void) {         \
        dsf_cmd_register(#name, summary, fn);                                   \
    }

/* The commit the binary was built from (the Makefile's generated commit.c): a short hash,
 * with "-modified" if tracked files differed from it, or "unknown". */
extern const char dsf_build_commit[];

/* True if argv contains -h or --help. */
int dsf_cmd_wants_help(int argc, char **argv);

/* A token list "1,2,3" (ids separated by commas and/or whitespace; `logits`, `imatrix`) into a
 * malloc'ed array of *n >= 1 ids. 0, or -1 with a message naming the offset. */
int cli_parse_tokens(const char *s, int32_t **out, int *n, char *err);

#endif
