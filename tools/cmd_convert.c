/* cmd_convert.c: `dsflash convert`, the Hugging Face checkpoint -> deepseek41 GGUF
 * converter (src/convert/), `--dspark` (the draft), `--mmproj` (the vision projector) and
 * `--vocab-only`.
 *
 * The output is written to OUT.tmp and renamed to OUT only on success: on any error, and on
 * SIGINT/SIGTERM, the .tmp file is removed, so no file ever appears under the target name
 * unless it is complete. */
#include "cmd.h"
#include "outfile.h"
#include "convert/convert.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsflash convert HF_DIR OUT.gguf [--outtype bf16|f32|native] [--threads T] [--name NAME]\n"
            "       dsflash convert --dspark HF_DIR OUT.gguf [--outtype bf16|f32|native] [--threads T] [--name NAME]\n"
            "       dsflash convert --mmproj HF_DIR OUT.gguf [--outtype bf16|f32] [--name NAME]\n"
            "       dsflash convert --vocab-only TOKENIZER_DIR OUT.gguf\n\n"
            "Converts a DeepSeek-V4.1-Flash Hugging Face checkpoint (config.json, tokenizer.json,\n"
            "tokenizer_config.json, model.safetensors or model.safetensors.index.json + shards) into a\n"
            "deepseek41 GGUF: FP8 weights dequantized to BF16 (F32 with --outtype f32), routed experts\n"
            "MXFP4 bit-exact, Engram tables dequantized and concatenated, Engram constants computed.\n"
            "  --outtype T    bf16 (default; also 'auto'), f32, or native: dsflash's lossless native file\n"
            "                 (docs/FORMAT.md): the FP8 weights as their e4m3 bytes + 32x32 E8M0 scales\n"
            "                 (FP8_B32), the Engram rows as e4m3 + per-32 scales (FP8_R264), the rest as\n"
            "                 bf16; smaller and just as exact, but llama.cpp and other GGUF readers\n"
            "                 cannot load it\n"
            "  --threads T    threads for dequantization (default 1)\n"
            "  --name NAME    general.name (default: the directory name, or its parent's for .../hf)\n"
            "  --vocab-only   write only the tokenizer metadata of TOKENIZER_DIR\n"
            "  --dspark       write the DSpark speculative draft (mtp.* stages) as a dflash GGUF instead\n"
            "                 (default name: the model's name + '-dspark')\n"
            "  --mmproj       write the vision projector (vision_config, vision.*, aligner.*, image_start/\n"
            "                 end/newline) as a clip / deepseek41v mmproj GGUF instead, for --mmproj of\n"
            "                 logits, run, chat and serve: 2-D weights BF16 (F32 with --outtype f32), the\n"
            "                 patch embedding and the vectors F32 (default name: the model's name)\n"
            "The file is written as OUT.gguf.tmp and renamed when complete.\n");
}

static int cmd_convert(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    convert_opts o = {.f32 = false, .threads = 1};
    bool vocab_only = false, mmproj = false;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--vocab-only")) vocab_only = true;
        else if (!strcmp(a, "--dspark")) o.dspark = true;
        else if (!strcmp(a, "--mmproj")) mmproj = true;
        else if (!strcmp(a, "--outtype") && i + 1 < argc) {
            const char *t = argv[++i];
            o.f32 = !strcmp(t, "f32");
            o.native = !strcmp(t, "native");
            if (!o.f32 && !o.native && strcmp(t, "bf16") && strcmp(t, "auto")) {
                fprintf(stderr, "dsflash convert: --outtype must be bf16, f32 or native, not '%s'\n", t);
                return 2;
            }
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            char *end;
            long t = strtol(argv[++i], &end, 10);
            if (*end || t < 1 || t > 1024) {
                fprintf(stderr, "dsflash convert: --threads must be a number in 1..1024\n");
                return 2;
            }
            o.threads = (int)t;
        } else if (!strcmp(a, "--name") && i + 1 < argc) o.name = argv[++i];
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsflash convert: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (npos < 2) pos[npos++] = a;
        else {
            fprintf(stderr, "dsflash convert: too many arguments (see --help)\n");
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    if (mmproj && (o.dspark || o.native || vocab_only)) {
        fprintf(stderr, "dsflash convert: --mmproj takes neither --dspark, --vocab-only nor --outtype native\n");
        return 2;
    }
    const char *tmp = outfile_begin(pos[1]);
    if (!tmp) {
        fprintf(stderr, "dsflash convert: output path too long\n");
        return 2;
    }
    o.progress = isatty(STDERR_FILENO);
    char err[DSF_ERR_LEN] = "";
    int rc = vocab_only ? convert_vocab_only(pos[0], tmp, err)
             : mmproj   ? convert_mmproj(pos[0], tmp, &o, err)
                        : convert_checkpoint(pos[0], tmp, &o, err);
    if (outfile_end(rc, err)) {
        fprintf(stderr, "dsflash convert: %s\n", err[0] ? err : "failed");
        return 1;
    }
    return 0;
}

DSF_COMMAND(convert, "convert a Hugging Face V4.1 checkpoint to a deepseek41 GGUF", cmd_convert)
