/* cmd_synth.c: `dsflash synth --preset tiny|tiny-roles|bench|bench-moe|real OUT.gguf [--seed S] [--header-only]
 * [--dspark DRAFT.gguf] [--type T] [--expert-type T] [--recipe R] [--fp8-exact | --native]`: writes a random-weight deepseek41 GGUF in the exact layout
 * (src/convert/synth.c), or its header alone; `dsflash synth --mmproj-preset tinyvl|release OUT.gguf` a
 * random-weight deepseek41v projector instead (src/convert/synth_mmproj.c). */
#include "cmd.h"
#include "convert/synth.h"
#include "base/util.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dsflash synth --preset tiny|tiny-roles|bench|bench-moe|real OUT.gguf [--seed S] [--header-only]\n"
               "                     [--dspark DRAFT.gguf] [--type TYPE] [--expert-type TYPE] [--recipe R]\n"
               "                     [--engram-rows N] [--fp8-exact | --native]\n"
               "       dsflash synth --mmproj-preset tinyvl|release OUT.gguf [--seed S] [--header-only] [--type BF16|F32]\n"
               "\n"
               "Writes a random-weight deepseek41 GGUF in the exact layout of a converted V4.1-Flash.\n"
               "  tiny    tiny41's topology (hidden 128, 8 layers, every layer role) with a usable\n"
               "          1024-token byte-level BPE tokenizer and the V4.1 special tokens (~4 MB)\n"
               "  tiny-roles tiny's widths on 12 layers with roles shaped like the release's (two ratio-2\n"
               "          groups, a ratio-1 candidate group with re-indexing layers, Engram before 1 and 5)\n"
               "  bench   every real per-layer shape and dtype of V4.1-Flash, 8 layers, 32 experts,\n"
               "          vocab 129280 (~11 GB; ~4.5 GB of weights read per decoded token)\n"
               "  bench-moe the real 384 experts (top 6) at the real widths on 1 layer (every layer role):\n"
               "          a multi-token forward reads as many distinct experts per layer as the release\n"
               "          (`bench --draft`; ~10.6 GB, and ~8.4 GB for its --dspark draft: both fit 24 GiB)\n"
               "  real    the released V4.1-Flash: 40 layers, 384 experts, the Engram table (~699 GB):\n"
               "          use it with --header-only (for `dsflash inspect --plan`)\n"
               "  --seed S          any unsigned integer (default 1); the file is a pure function of its arguments\n"
               "  --dspark FILE     also write a random-weight DSpark draft (`dflash`, for `run --draft FILE`) that\n"
               "                    fits this model: 3 stages, block size 5, targets its last 3 layers, the\n"
               "                    preset's widths, its experts up to the release draft's 128 (top 3);\n"
               "                    --type, --expert-type, --recipe and --header-only apply to it too\n"
               "  --header-only     the keys and tensor infos with their offsets, no tensor data (a small file)\n"
               "  --type T          ggml type (Q8_0, Q4_K, ...) of every quantizable matrix; 1-D tensors, norms,\n"
               "                    biases, the router, engram_gate and hc_* stay F32. A tensor whose ne0 is not\n"
               "                    a whole number of T's blocks falls back as `dsflash quantize` does, with a note\n"
               "  --expert-type T   ggml type of the routed experts (default: --type's if given, like\n"
               "                    llama-quantize, else the preset's MXFP4)\n"
               "  --recipe R        every tensor gets the type `dsflash quantize R` would give it (Q4_K_M, Q2_K, ...;\n"
               "                    see its --help); instead of --type/--expert-type\n"
               "  --engram-rows N   an Engram table of about N rows instead of the preset's (bench: 17000000 is\n"
               "                    ~8.7 GB, for `dsflash bench --cold` reading it from the disk)\n"
               "  --fp8-exact       the weights the real checkpoint stores as FP8 (attention, shared experts, engram_kv,\n"
               "                    a 256-wide Engram table) get FP8-exact values (e4m3 x a power of two per 32x32\n"
               "                    block), still BF16: `dsflash quantize OUT X native` then works on the file\n"
               "  --native          a dsflash native file (docs/FORMAT.md) of the --fp8-exact model of the same seed,\n"
               "                    as `dsflash quantize` would write it (FP8_B32, FP8_R264), byte for byte: the two\n"
               "                    files hold the same values, for `bench` comparisons\n"
               "  --mmproj-preset P a random-weight vision projector (clip / deepseek41v mmproj, the layout of\n"
               "                    `convert --mmproj`) instead of a model: tinyvl is testdata/tinyvl's tower (2 blocks,\n"
               "                    width 64) for --preset tiny (projection 128); release is the released tower (32\n"
               "                    blocks, width 1024, 16 heads, SwiGLU 2816, patch 14, merge 3; ~970 MB) for --preset\n"
               "                    bench, bench-moe or real (projection 5120). 2-D weights BF16, or F32 with --type F32\n");
}

/* A ggml type by name (case-insensitive), -1 if none has a block size. */
static int type_by_name(const char *s) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (ggml_blck_size((uint32_t)t) && !strcasecmp(ggml_type_name((uint32_t)t), s)) return t;
    return -1;
}

/* --mmproj-preset: the projector alone; the options that shape a model do not apply to it. */
static int synth_projector(const char *name, const char *preset, const char *out, uint64_t seed,
                           const synth_write_opts *o, const char *dspark) {
    if (preset || dspark || o->recipe || o->native || o->fp8_exact || o->engram_rows || o->expert_type != SYNTH_TYPE_KEEP) {
        fprintf(stderr, "dsflash synth: --mmproj-preset takes only --seed, --header-only and --type BF16|F32\n");
        return 2;
    }
    if (!out) {
        fprintf(stderr, "dsflash synth: need an output file (try --help)\n");
        return 2;
    }
    char err[DSF_ERR_LEN] = "";
    double t0 = dsf_now();
    if (synth_write_mmproj(name, out, seed, o, err) < 0) {
        fprintf(stderr, "dsflash synth: %s\n", err);
        return 1;
    }
    dsf_log(1, "dsflash synth: wrote %s (projector preset %s, seed %llu%s) in %.1f s", out, name,
            (unsigned long long)seed, o->header_only ? ", header only" : "", dsf_now() - t0);
    return 0;
}

static int cmd_synth(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *preset = NULL, *out = NULL, *dspark = NULL, *mmproj = NULL;
    uint64_t seed = 1;
    synth_write_opts o = {.type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
            preset = argv[++i];
        } else if (!strcmp(argv[i], "--mmproj-preset") && i + 1 < argc) {
            mmproj = argv[++i];
        } else if (!strcmp(argv[i], "--dspark") && i + 1 < argc) {
            dspark = argv[++i];
        } else if (!strcmp(argv[i], "--recipe") && i + 1 < argc) {
            o.recipe = argv[++i];
        } else if (!strcmp(argv[i], "--header-only")) {
            o.header_only = true;
        } else if (!strcmp(argv[i], "--native")) {
            o.native = true;
        } else if (!strcmp(argv[i], "--fp8-exact")) {
            o.fp8_exact = true;
        } else if ((!strcmp(argv[i], "--type") || !strcmp(argv[i], "--expert-type")) && i + 1 < argc) {
            int t = type_by_name(argv[i + 1]);
            if (t < 0) {
                fprintf(stderr, "dsflash synth: %s: unknown ggml type '%s'\n", argv[i], argv[i + 1]);
                return 2;
            }
            *(argv[i][2] == 't' ? &o.type : &o.expert_type) = t;
            i++;
        } else if (!strcmp(argv[i], "--engram-rows") && i + 1 < argc) {
            char *end;
            errno = 0;
            unsigned long long r = strtoull(argv[++i], &end, 0);
            if (errno || *end || argv[i][0] == '-' || !r) {
                fprintf(stderr, "dsflash synth: --engram-rows wants a positive integer, got '%s'\n", argv[i]);
                return 2;
            }
            o.engram_rows = r;
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
    if (mmproj) return synth_projector(mmproj, preset, out, seed, &o, dspark);
    if (o.expert_type == SYNTH_TYPE_KEEP) o.expert_type = o.type; /* --type alone: everything, like llama-quantize */
    if (!preset || !out) {
        fprintf(stderr, "dsflash synth: need --preset NAME and an output file (try --help)\n");
        return 2;
    }
    if (!synth_data_bytes(preset)) {
        fprintf(stderr, "dsflash synth: unknown preset '%s' (tiny, tiny-roles, bench, bench-moe, real)\n", preset);
        return 2;
    }
    char err[DSF_ERR_LEN] = "", note[DSF_ERR_LEN] = "";
    uint64_t bytes = 0;
    double t0 = dsf_now();
    if (synth_write_ex(preset, out, seed, &o, note, sizeof note, &bytes, err) < 0) {
        fprintf(stderr, "dsflash synth: %s\n", err);
        return 1;
    }
    if (note[0]) fprintf(stderr, "dsflash synth: note: %s\n", note);
    if (dspark && synth_write_dspark(preset, dspark, seed, &o, err) < 0) {
        fprintf(stderr, "dsflash synth: --dspark %s: %s\n", dspark, err);
        return 1;
    }
    dsf_log(1, "dsflash synth: wrote %s (preset %s, seed %llu, %.1f MB of tensor data%s) in %.1f s", out, preset,
            (unsigned long long)seed, (double)bytes / 1e6, o.header_only ? " described, header only" : "",
            dsf_now() - t0);
    return 0;
}

DSF_COMMAND(synth, "write a random-weight deepseek41 GGUF (--preset tiny|tiny-roles|bench|bench-moe|real)", cmd_synth)
