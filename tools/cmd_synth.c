/* cmd_synth.c: `dsflash synth --preset tiny|bench OUT.gguf [--seed S]`: writes a random-weight
 * deepseek41 GGUF in the exact layout (src/convert/synth.c). */
#include "cmd.h"
#include "convert/synth.h"
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dsflash synth --preset tiny|bench OUT.gguf [--seed S]\n"
               "\n"
               "Writes a random-weight deepseek41 GGUF in the exact layout of a converted V4.1-Flash.\n"
               "  tiny    tiny41's topology (hidden 128, 8 layers, every layer role) with a usable\n"
               "          1024-token byte-level BPE tokenizer and the V4.1 special tokens (~4 MB)\n"
               "  bench   every real per-layer shape and dtype of V4.1-Flash, 8 layers, 32 experts,\n"
               "          vocab 129280 (~11 GB; ~4.5 GB of weights read per decoded token)\n"
               "  --seed S  any unsigned integer (default 1); the file is a pure function of preset and seed\n");
}

static int cmd_synth(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *preset = NULL, *out = NULL;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
            preset = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(argv[++i], &end, 0);
            if (errno || *end || argv[i][0] == '-' || !argv[i][0]) {
                fprintf(stderr, "dsflash synth: --seed wants an unsigned integer, got '%s'\n", argv[i]);
                return 2;
            }
            seed = s;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dsflash synth: unknown or incomplete option '%s' (try --help)\n", argv[i]);
            return 2;
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "dsflash synth: more than one output file ('%s', '%s')\n", out, argv[i]);
            return 2;
        }
    }
    if (!preset || !out) {
        fprintf(stderr, "dsflash synth: need --preset NAME and an output file (try --help)\n");
        return 2;
    }
    if (!synth_data_bytes(preset)) {
        fprintf(stderr, "dsflash synth: unknown preset '%s' (tiny, bench)\n", preset);
        return 2;
    }
    char err[DSF_ERR_LEN] = "";
    double t0 = dsf_now();
    if (synth_write(preset, out, seed, err) < 0) {
        fprintf(stderr, "dsflash synth: %s\n", err);
        return 1;
    }
    dsf_log(1, "dsflash synth: wrote %s (preset %s, seed %llu, %.1f MB of tensor data) in %.1f s", out, preset,
            (unsigned long long)seed, (double)synth_data_bytes(preset) / 1e6, dsf_now() - t0);
    return 0;
}

DSF_COMMAND(synth, "write a random-weight deepseek41 GGUF (--preset tiny|bench)", cmd_synth)
