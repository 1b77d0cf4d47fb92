/* cmd_quantize.c: `dsflash quantize IN.gguf OUT.gguf TYPE [--tensor-type PATTERN=TYPE ...]
 * [--imatrix FILE] [--threads N]`: the recipes and rules of src/convert/quantize_model.h,
 * written through OUT.tmp (outfile.h). */
#include "cmd.h"
#include "outfile.h"
#include "convert/quantize_model.h"
#include "kernels/quant.h"
#include "kernels/quantize.h"
#include "base/util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_TT 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsflash quantize IN.gguf OUT.gguf TYPE [--tensor-type PATTERN=TYPE ...] [--imatrix FILE]\n"
            "                        [--threads N]\n\n"
            "Rewrites a deepseek41 GGUF with quantized weights, streaming row chunks (memory stays at a few\n"
            "chunks). TYPE is a whole-file recipe with llama.cpp's names; general.file_type is set to its\n"
            "llama.cpp ftype. The recipes (types per tensor class):\n\n"
            "  %-8s %5s  %-8s %-8s %-8s %-8s %-8s %s\n", "recipe", "ftype", "experts", "dense", "shexp", "engram",
            "embd", "head");
    for (int i = 0; i < quantize_recipe_count(); i++) {
        const quantize_recipe *r = quantize_recipe_at(i);
        char note[64] = "";
        for (int c = 0; c < QC_COUNT; c++)
            if (!quantize_type_supported(r->type[c])) {
                snprintf(note, sizeof note, "  (%s: not writable yet)", ggml_type_name(r->type[c]));
                break;
            }
        char line[160];
        int n = snprintf(line, sizeof line, "  %-8s %5u ", r->name, r->ftype);
        for (int c = 0; c < QC_COUNT; c++) {
            /* quantize_model.h: MXFP4 experts stay MXFP4 under types of >= 4.25 bits per weight */
            bool keep = c == QC_EXPERTS && 8.0 * ggml_type_size(r->type[c]) / ggml_blck_size(r->type[c]) >= 4.25;
            n += snprintf(line + n, sizeof line - (size_t)n, " %s%-*s", ggml_type_name(r->type[c]),
                          8 - (int)strlen(ggml_type_name(r->type[c])), keep ? "*" : "");
        }
        while (n > 0 && line[n - 1] == ' ') line[--n] = 0;
        fprintf(f, "%s%s\n", line, note);
    }
    fprintf(f,
            "\n  * routed experts already in MXFP4 (as dsflash convert writes them) stay MXFP4.\n"
            "  IQ2_S puts IQ2_XS on the experts, as llama.cpp's IQ2_S recipe does (it differs from its IQ2_XS\n"
            "  in upgrades of single tensors that these classes do not make); IQ2_M puts IQ2_S there.\n"
            "  experts: the routed experts (ffn_{gate,up,down}_exps); dense: the attention, compressor,\n"
            "  indexer and engram_kv projections; shexp: the shared expert; engram: per_layer_token_embd;\n"
            "  embd: token_embd; head: output.weight.\n\n"
            "Rules:\n"
            "  - Never quantized, kept as they are (F32 in files from dsflash convert): 1-D tensors, the norms,\n"
            "    the router (ffn_gate_inp), engram_gate, attn_sinks, exp_probs_b, the hc_* fn/base/scale tensors.\n"
            "  - Routed experts already in MXFP4 stay MXFP4 when the recipe's expert type has >= 4.25 bits per\n"
            "    weight (requantizing them would only lose precision); --tensor-type can force a type.\n"
            "  - A row (ne0) that is not a multiple of the type's block size falls back, with a log line:\n"
            "    Q2_K, Q3_K, IQ1_*, IQ2_*, IQ3_*, IQ4_XS -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0\n"
            "    (llama-quantize's rule); a row that fits none of these -> BF16 (llama-quantize: F16; BF16\n"
            "    keeps the range of the BF16 checkpoint).\n"
            "  - A tensor already in its target type is copied byte for byte.\n\n"
            "TYPE native: dsflash's lossless native file (docs/FORMAT.md; llama.cpp cannot load it) from a\n"
            "  BF16 (or F32) file of dsflash convert: the weights the checkpoint stores as FP8 (attn_q_a/q_b,\n"
            "  attn_kv, attn_output_a/b, indexer.attn_q_b, engram_kv, the shared experts) back to their\n"
            "  e4m3 bytes + 32x32 E8M0 scales (FP8_B32), the Engram table (rows of a multiple of 256) to\n"
            "  FP8_R264, everything else copied. Per block the smallest power-of-two scale that holds its\n"
            "  largest value; a value that is not an e4m3 value times it is an error naming the tensor and\n"
            "  block (the file's weights are not FP8 values). No --tensor-type or --imatrix.\n\n"
            "Options:\n"
            "  --tensor-type PATTERN=TYPE  type TYPE (a ggml type name, e.g. q8_0) for the quantized tensors whose\n"
            "                 name matches the PCRE2 regex PATTERN (searched); repeatable, the first match wins\n"
            "  --imatrix FILE  importance matrix in llama.cpp's GGUF imatrix format (llama-imatrix); required by\n"
            "                 the types IQ2_XXS, IQ2_XS and IQ1_S, so by the recipes IQ2_XXS, IQ2_XS, IQ2_S and IQ1_S\n"
            "  --threads N    worker threads (default: all cores); the output does not depend on N\n"
            "The file is written as OUT.gguf.tmp and renamed when complete; on failure no file is left.\n");
}

static int parse_tt(const char *arg, quantize_override *o) {
    const char *eq = strrchr(arg, '=');
    if (!eq || eq == arg) {
        fprintf(stderr, "dsflash quantize: --tensor-type wants PATTERN=TYPE, not '%s'\n", arg);
        return -1;
    }
    int t = quantize_type_from_name(eq + 1);
    if (t < 0) {
        fprintf(stderr, "dsflash quantize: --tensor-type '%s': unknown ggml type '%s'\n", arg, eq + 1);
        return -1;
    }
    o->pattern = dsf_xstrdup(arg);
    ((char *)o->pattern)[eq - arg] = 0;
    o->type = (uint32_t)t;
    return 0;
}

static int cmd_quantize(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    quantize_override tt[MAX_TT];
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    quantize_opts o = {.tt = tt, .threads = nc > 0 ? (int)nc : 1};
    const char *pos[3] = {NULL, NULL, NULL};
    int npos = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tensor-type") && i + 1 < argc) {
            if (o.n_tt == MAX_TT) {
                fprintf(stderr, "dsflash quantize: at most %d --tensor-type options\n", MAX_TT);
                goto out;
            }
            if (parse_tt(argv[++i], &tt[o.n_tt])) goto out;
            o.n_tt++;
        } else if (!strcmp(a, "--imatrix") && i + 1 < argc) o.imatrix = argv[++i];
        else if (!strcmp(a, "--threads") && i + 1 < argc) {
            char *end;
            long t = strtol(argv[++i], &end, 10);
            if (*end || t < 1 || t > 1024) {
                fprintf(stderr, "dsflash quantize: --threads must be a number in 1..1024\n");
                goto out;
            }
            o.threads = (int)t;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsflash quantize: unknown option '%s' (see --help)\n", a);
            goto out;
        } else if (npos < 3) pos[npos++] = a;
        else {
            fprintf(stderr, "dsflash quantize: too many arguments (see --help)\n");
            goto out;
        }
    }
    if (npos != 3) {
        fprintf(stderr, "usage: dsflash quantize IN.gguf OUT.gguf TYPE [options] (see --help)\n");
        goto out;
    }
    o.recipe = pos[2];
    if (!quantize_recipe_find(o.recipe) && strcasecmp(o.recipe, "native")) {
        fprintf(stderr, "dsflash quantize: unknown recipe '%s' (see --help for the list)\n", o.recipe);
        goto out;
    }
    const char *tmp = outfile_begin(pos[1]);
    if (!tmp) {
        fprintf(stderr, "dsflash quantize: output path too long\n");
        goto out;
    }
    o.progress = isatty(STDERR_FILENO);
    char err[DSF_ERR_LEN] = "";
    rc = 0;
    if (outfile_end(quantize_model(pos[0], tmp, &o, err), err)) {
        fprintf(stderr, "dsflash quantize: %s\n", err[0] ? err : "failed");
        rc = 1;
    }
out:
    for (int k = 0; k < o.n_tt; k++) free((char *)tt[k].pattern);
    return rc;
}

DSF_COMMAND(quantize, "quantize a GGUF with a llama.cpp recipe (Q8_0, Q4_K_M, Q2_K, ...) or into a native file", cmd_quantize)
