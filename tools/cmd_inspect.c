/* cmd_inspect.c: `dsflash inspect MODEL.gguf`: metadata, layer roles and tensors. */
#include "cmd.h"
#include "dsflash.h"

#include <stdio.h>
#include <string.h>

static void emit(void *ud, const char *line) {
    (void)ud;
    puts(line);
}

static int cmd_inspect(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv) || argc != 2) {
        fputs("usage: dsflash inspect MODEL.gguf\n"
              "  Prints the metadata, a table of layer roles (ratio, KV source, top-k source, candidate role,\n"
              "  Engram), every tensor with its dtype and bytes, the bytes each dtype takes (tensors, bytes,\n"
              "  share of the file) and the dtypes each tensor class uses (routed and shared experts, dense\n"
              "  projections, hc mixes, router, LM head, token embedding, Engram table, small vectors).\n"
              "  Reads no tensor data (but the small vectors of a file that does not store them as F32).\n",
              argc == 2 ? stdout : stderr);
        return argc == 2 ? 0 : 2;
    }
    char err[DSF_ERR_LEN];
    dsf_engine_params p;
    dsf_engine_params_default(&p);
    p.n_threads = 1;
    p.repack = -1; /* reads no tensor data */
    p.resident = -1;
    dsf_engine *e = dsf_engine_open(argv[1], &p, err);
    if (!e) {
        fprintf(stderr, "dsflash inspect: %s\n", err);
        return 1;
    }
    dsf_engine_describe(e, emit, NULL);
    dsf_engine_close(e);
    return 0;
}

DSF_COMMAND(inspect, "print a model's metadata, layer roles and tensors", cmd_inspect)
