/* cmd_render.c: `dsflash render` prints the V4.1 prompt for a chat on stdin, byte-exact with
 * the official encoder (spec chat-format.md §2). Owns only argument handling and I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "dsflash.h"
#include "base/util.h"

static int cmd_render(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        printf("usage: dsflash render [--openai] [--images] < request.json\n\n"
               "Reads {\"messages\": [...], \"args\": {...}} on stdin (args = the official encode_messages\n"
               "keyword arguments: thinking_mode, reasoning_effort, drop_thinking, context, ...) and prints\n"
               "the prompt text exactly, with nothing added. An encoder error exits 1 with the official\n"
               "error message.\n\n"
               "  --openai   stdin is an OpenAI chat request (messages, tools, reasoning_effort, ...)\n"
               "  --images   print the image records (JSON) instead of the prompt\n");
        return 0;
    }
    int openai = 0, images = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--openai")) openai = 1;
        else if (!strcmp(argv[i], "--images")) images = 1;
        else {
            fprintf(stderr, "dsflash render: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    char err[DSF_ERR_LEN] = "";
    uint8_t *in;
    size_t len;
    if (dsf_read_file("/dev/stdin", &in, &len, err)) {
        fprintf(stderr, "dsflash render: %s\n", err);
        return 1;
    }
    dsf_chat_prompt p;
    int rc = openai ? dsf_chat_render_openai((const char *)in, len, &p, err)
                    : dsf_chat_render_json((const char *)in, len, &p, err);
    free(in);
    if (rc) {
        fprintf(stderr, "dsflash render: %s\n", err);
        return 1;
    }
    if (images) printf("%s\n", p.images_json);
    else fwrite(p.prompt, 1, p.prompt_len, stdout);
    dsf_chat_prompt_free(&p);
    return fflush(stdout) ? 1 : 0;
}

DSF_COMMAND(render, "print the V4.1 chat prompt for a JSON chat on stdin", cmd_render)
