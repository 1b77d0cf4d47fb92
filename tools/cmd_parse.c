/* cmd_parse.c: `dsflash parse` splits a V4.1 completion on stdin into reasoning, content and
 * tool calls (spec chat-format.md §3) and prints them as one JSON object. Owns only argument
 * handling and I/O; the parser is src/text/dsml.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "dsflash.h"
#include "base/util.h"

static int cmd_parse(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        printf("usage: dsflash parse [--thinking] [--strict] < completion.txt\n\n"
               "Reads a completion (the text generated after the prompt, with or without the final\n"
               "<｜end▁of▁sentence｜>) and prints\n"
               "  {\"reasoning_content\": ..., \"content\": ..., \"tool_calls\": [{\"name\": ..., \"arguments\": ...}]}\n"
               "(a namespaced call also has \"namespace\").\n\n"
               "  --thinking  the completion starts inside the reasoning (thinking-mode prompt)\n"
               "  --strict    the official parser: malformed output is an error (exit 1)\n"
               "Without --strict the tolerant parser is used, which never fails.\n");
        return 0;
    }
    bool thinking = false, strict = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--thinking")) thinking = true;
        else if (!strcmp(argv[i], "--strict")) strict = true;
        else {
            fprintf(stderr, "dsflash parse: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    char err[DSF_ERR_LEN] = "";
    uint8_t *in;
    size_t len;
    if (dsf_read_file("/dev/stdin", &in, &len, err)) {
        fprintf(stderr, "dsflash parse: %s\n", err);
        return 1;
    }
    dsf_dsml_result r;
    int rc = dsf_dsml_parse((const char *)in, len, thinking, strict, &r, err);
    free(in);
    if (rc) {
        for (char *c = err; *c; c++) /* one line on stderr */
            if (*c == '\n') *c = ' ';
        fprintf(stderr, "dsflash parse: %s\n", err);
        return 1;
    }
    char *json = dsf_dsml_result_json(&r);
    printf("%s\n", json);
    free(json);
    dsf_dsml_result_free(&r);
    return fflush(stdout) ? 1 : 0;
}

DSF_COMMAND(parse, "split a V4.1 completion on stdin into reasoning, content and tool calls", cmd_parse)
