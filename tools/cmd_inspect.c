/* cmd_inspect.c: `dsflash inspect MODEL.gguf`: metadata, layer roles and tensors; with --plan,
 * the memory the model needs, from its header alone; with --parallel, how an MPI job of N ranks
 * would spread it (dsf_dist_describe), from its header alone too. On a vision projector (clip /
 * deepseek41v, gguf-layout.md §5) it says so and prints the tower's shape from the keys and the
 * tensors. Never starts MPI (tools/dsflash.c leaves inspect's --parallel to it). */
#include "cmd.h"
#include "dsflash.h"
#include "model/plan.h"
#include "model/model.h"
#include "model/session.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *USAGE =
    "usage: dsflash inspect MODEL.gguf\n"
    "       dsflash inspect --plan MODEL.gguf [--ram GiB] [--ctx N] [--ubatch N]\n"
    "  Prints the metadata, a table of layer roles (ratio, KV source, top-k source, candidate role,\n"
    "  Engram), every tensor with its dtype and bytes, the bytes each dtype takes (tensors, bytes,\n"
    "  share of the file) and the dtypes each tensor class uses (routed and shared experts, dense\n"
    "  projections, hc mixes, router, LM head, token embedding, Engram table, small vectors).\n"
    "  Reads no tensor data (but the small vectors of a file that does not store them as F32).\n"
    "  A vision projector (convert --mmproj, synth --mmproj-preset: clip / deepseek41v) is said to be one,\n"
    "  with the tower's and the aligner's shape, its bytes by type and its tensors.\n"
    "  A dsflash native file (convert --outtype native, quantize ... native; docs/FORMAT.md) is said\n"
    "  to be one, with its FP8_B32 / FP8_R264 sizes and its size against the seed layout's.\n"
    "  --plan     from the header alone (a header-only file will do): the bytes of each tensor class,\n"
    "             what decode streams every token (kept resident) and what it reads a row at a time\n"
    "             (token embedding, Engram table: through the page cache), the KV state per token and\n"
    "             for a context of N tokens (--ctx, default 4096), and whether that fits in --ram GiB\n"
    "             (default: this machine's memory); exit status 3 if it does not fit; the prefill\n"
    "             chunk the sessions take (--ubatch, default auto as the engine picks it for that\n"
    "             RAM: 32 tokens per routed expert, within 1/16 of RAM) and its memory\n"
    "       dsflash inspect --parallel MODE --ranks N [--pp-split L,..] [--stages S] MODEL.gguf\n"
    "  --parallel from the header alone (a header-only file will do; no MPI needed): how an MPI job\n"
    "             of N ranks would spread the model (MODE pipeline, experts or pipeline,experts, as\n"
    "             for mpirun ... --parallel): the bytes per token each cut carries (the stream and\n"
    "             every layer dependency that crosses it), and each rank's stage, layers, experts,\n"
    "             weight bytes and KV bytes per token of context (README \"Several machines\")\n";

#define GIB (1024.0 * 1024.0 * 1024.0)

static void emit(void *ud, const char *line) {
    (void)ud;
    puts(line);
}

/* The GGUF header at path (no tensor data needed), or NULL (said). */
static gguf_file *open_header(const char *path) {
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open_header(path, err);
    if (!g) {
        dsf_err_oneline(err);
        fprintf(stderr, "dsflash inspect: %s\n", err);
    }
    return g;
}

static int plan(const char *path, double ram_gib, long long ctx, long long ubatch) {
    char err[DSF_ERR_LEN];
    gguf_file *g = open_header(path);
    if (!g) return 1;
    const char *src = "given";
    if (ram_gib <= 0) {
        ram_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / GIB;
        src = "this machine's";
    }
    /* the sessions' chunk as the engine picks it (engine.c) for that RAM, reference numerics */
    dsf_shape sh;
    if (shape_load(&sh, g, err) < 0) {
        dsf_err_oneline(err);
        fprintf(stderr, "dsflash inspect: %s: %s\n", path, err);
        gguf_close(g);
        return 1;
    }
    const int64_t chunk = ubatch > 0 ? ubatch : chunk_auto(&sh, kv_pack_default(1), ram_gib * GIB);
    const double cbytes = (double)chunk_bytes(&sh, chunk, kv_pack_default(1));
    const double tpe = sh.n_expert > 0 ? (double)chunk * (double)sh.n_expert_used / (double)sh.n_expert : 0;
    shape_free(&sh);
    model_plan_t p;
    if (model_plan(g, ctx, chunk, &p, err) < 0) {
        dsf_err_oneline(err);
        fprintf(stderr, "dsflash inspect: %s: %s\n", path, err);
        gguf_close(g);
        return 1;
    }
    bool header_only = false;
    for (uint64_t i = 0; i < g->n_tensors; i++) header_only |= !g->tensors[i].data;
    printf("plan: %s (%s), %lld layers, context_length %lld\n", path, header_only ? "header only" : "whole file",
           (long long)p.n_layer, (long long)p.n_ctx_train);
    model_native_t nat;
    if (model_native(g, &nat, err) < 0) {
        fprintf(stderr, "dsflash inspect: %s: %s\n", path, err);
        gguf_close(g);
        return 1;
    }
    model_native_describe(&nat, emit, NULL);
    printf("== tensor bytes by class ==\n");
    for (int c = 0; c < TC_COUNT; c++)
        if (p.class_bytes[c])
            printf("  %-18s %10.3f GiB  %6.2f%%  %s\n", tensor_class_names[c], (double)p.class_bytes[c] / GIB,
                   100.0 * (double)p.class_bytes[c] / (double)p.total,
                   c == TC_EMBED || c == TC_ENGRAM ? "read by row" : "resident");
    printf("  %-18s %10.3f GiB\n", "all", (double)p.total / GIB);
    printf("== decode ==\n");
    printf("  resident (streamed every token): %.3f GiB\n", (double)p.resident / GIB);
    printf("  read by row (page cache, a row per token and Engram head): %.3f GiB\n", (double)p.by_row / GIB);
    for (int m = 0; m < 2; m++) {
        const uint64_t wrow = p.kv_window[m] / (uint64_t)(p.n_layer * p.window);
        printf("  KV state, %s numerics (%s rows): %.0f bytes per token of context (compressed rows and index keys, "
               "+4 B token id); window %lld x %lld x %llu B = %.2f MB (the rings: %.3f GiB); %.3f GiB for %lld tokens "
               "(chunk %d)\n",
               m == DSF_NUMERICS_REFERENCE ? "reference" : "plain", p.kv_packed[m] ? "packed" : "fp32",
               p.kv_rows_per_token[m], (long long)p.n_layer, (long long)p.window, (unsigned long long)wrow,
               (double)p.kv_window[m] / 1e6, (double)p.kv_ring[m] / GIB, (double)p.kv_bytes[m] / GIB, ctx, (int)chunk);
    }
    printf("== prefill ==\n");
    printf("  chunk %lld tokens (%s): %.1f tokens per routed expert on average; its scratch and window-ring rows "
           "take %.3f GiB per session\n",
           (long long)chunk, ubatch > 0 ? "--ubatch" : "auto for this RAM", tpe, cbytes / GIB);
    /* the default numerics (reference) */
    const double need = (double)(p.resident + p.kv_bytes[DSF_NUMERICS_REFERENCE]) / GIB;
    printf("== memory ==\n");
    if (need <= ram_gib)
        printf("  fits: the resident weights and the KV state take %.3f GiB of the %.3f GiB of %s RAM; %.3f GiB "
               "are left for the page cache (%.1f%% of the bytes read by row)\n",
               need, ram_gib, src, ram_gib - need,
               p.by_row ? 100.0 * fmin((ram_gib - need) * GIB / (double)p.by_row, 1.0) : 100.0);
    else
        printf("  does not fit: the resident weights and the KV state take %.3f GiB, %.3f GiB more than the %.3f GiB "
               "of %s RAM\n",
               need, need - ram_gib, ram_gib, src);
    gguf_close(g);
    return need <= ram_gib ? 0 : 3;
}

/* A clip file: a deepseek41v projector's shape from its keys (gguf-layout.md §5.1), its bytes by
 * type and its tensors; another projector type is refused. The tower's loader validates the rest. */
static int inspect_projector(const gguf_file *g, const char *path) {
    char err[DSF_ERR_LEN], *ptype = NULL;
    if (gguf_get_str(g, "clip.projector_type", &ptype, err)) {
        fprintf(stderr, "dsflash inspect: %s: a clip file without a projector type: %s\n", path, err);
        return 1;
    }
    if (strcmp(ptype, "deepseek41v")) {
        fprintf(stderr, "dsflash inspect: %s: a clip projector of type '%s'; dsflash runs only 'deepseek41v'\n", path,
                ptype);
        free(ptype);
        return 1;
    }
    free(ptype);
    static const char *const keys[] = {"block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                                       "patch_size", "projector.scale_factor", "projection_dim", "image_min_pixels"};
    uint32_t v[8];
    float eps = 0;
    for (int i = 0; i < 8; i++) {
        char key[96];
        snprintf(key, sizeof key, "clip.vision.%s", keys[i]);
        if (gguf_get_u32(g, key, &v[i], err) || (i == 2 && !v[i])) {
            fprintf(stderr, "dsflash inspect: %s: %s\n", path, i == 2 && !v[i] ? "clip.vision.attention.head_count is 0" : err);
            return 1;
        }
    }
    if (gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &eps, err)) {
        fprintf(stderr, "dsflash inspect: %s: %s\n", path, err);
        return 1;
    }
    printf("file: %s (GGUF v%u, %llu keys, %llu tensors, %llu bytes)\n", path, g->version, (unsigned long long)g->n_kv,
           (unsigned long long)g->n_tensors, (unsigned long long)g->size);
    printf("a deepseek41v vision projector (clip mmproj): give it to logits, run, chat or serve with --mmproj,\n"
           "beside a deepseek41 model of hidden size %u\n", v[6]);
    printf("== shape ==\n  tower: %u blocks, width %u, %u heads x %u, SwiGLU %u, patch %u x %u, RMSNorm eps %g\n", v[0],
           v[1], v[2], v[1] / v[2], v[3], v[4], v[4], (double)eps);
    printf("  aligner: %u x %u merge, %llu -> %u -> %u; image_min_pixels %u\n", v[5], v[5],
           (unsigned long long)v[1] * v[5] * v[5], v[6], v[6], v[7]);
    uint64_t count[GGML_TYPE_COUNT] = {0}, bytes[GGML_TYPE_COUNT] = {0};
    printf("== tensors ==\n");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        printf("  %-32s %-5s", t->name, ggml_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%lld", d ? " x " : " ", (long long)t->ne[d]);
        printf("  (%llu bytes)\n", (unsigned long long)t->nbytes);
        if (t->type < GGML_TYPE_COUNT) count[t->type]++, bytes[t->type] += t->nbytes;
    }
    printf("== bytes by type ==\n");
    for (int ty = 0; ty < GGML_TYPE_COUNT; ty++)
        if (count[ty])
            printf("  %-5s %4llu tensors %12llu bytes\n", ggml_type_name((uint32_t)ty), (unsigned long long)count[ty],
                   (unsigned long long)bytes[ty]);
    return 0;
}

/* 1 and a projector's description when path is a clip file, 0 (nothing printed) when it is not,
 * -1 when the header cannot be read (dsf_engine_open reports it). */
static int try_projector(const char *path, int *rc) {
    char err[DSF_ERR_LEN], *arch = NULL;
    gguf_file *g = gguf_open_header(path, err);
    if (!g) return -1;
    int is_clip = gguf_get_str(g, "general.architecture", &arch, err) == 0 && !strcmp(arch, "clip");
    free(arch);
    if (is_clip) *rc = inspect_projector(g, path);
    gguf_close(g);
    return is_clip;
}

/* `inspect --parallel`: the plan of dsf_dist_describe for the model whose header is at path, on
 * an engine of that header alone (the shape and the tensor table: all the plan reads; no
 * weight is bound). 0, 1 (said) on a bad file or an impossible split, 2 on a bad option. */
static int describe_parallel(int argc, char **argv) {
    const char *mode = NULL, *split = NULL, *path = NULL;
    long ranks = 0, stages = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--parallel") && v) mode = v, i++;
        else if (!strcmp(a, "--pp-split") && v) split = v, i++;
        else if ((!strcmp(a, "--ranks") || !strcmp(a, "--stages")) && v) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 64) {
                fprintf(stderr, "dsflash inspect: %s wants 1..64, got '%s'\n", a, v);
                return 2;
            }
            *(a[2] == 'r' ? &ranks : &stages) = n;
            i++;
        } else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "dsflash inspect: unknown or incomplete option '%s'\n%s", a, USAGE);
            return 2;
        }
    }
    if (!mode || !ranks || !path) {
        fprintf(stderr, "dsflash inspect: --parallel wants a MODE, --ranks N and a MODEL.gguf\n%s", USAGE);
        return 2;
    }
    const bool both = !strcmp(mode, "pipeline,experts") || !strcmp(mode, "experts,pipeline");
    if ((stages && !both) || (split && strcmp(mode, "pipeline") && !both)) {
        fprintf(stderr, "dsflash inspect: %s\n", stages && !both ? "--stages needs --parallel pipeline,experts"
                                                               : "--pp-split needs --parallel pipeline");
        return 2;
    }
    char err[DSF_ERR_LEN];
    gguf_file *g = open_header(path);
    if (!g) return 1;
    dsf_engine e;
    memset(&e, 0, sizeof e);
    e.gguf = g;
    e.numerics = DSF_NUMERICS_REFERENCE; /* the default: the KV bytes of packed rows */
    int rc = shape_load(&e.shape, g, err);
    if (rc == 0) {
        rc = dsf_dist_describe(&e, mode, (int)ranks, split, (int)stages, emit, NULL, err);
        shape_free(&e.shape);
    }
    gguf_close(g);
    if (rc < 0) {
        dsf_err_oneline(err);
        fprintf(stderr, "dsflash inspect: %s: %s\n", path, err);
        return 1;
    }
    return 0;
}

static int cmd_inspect(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "--plan")) {
        double ram = 0;
        long long ctx = 4096, ubatch = 0;
        for (int i = 3; i < argc; i++) {
            char *end = NULL;
            if (!strcmp(argv[i], "--ram") && i + 1 < argc) ram = strtod(argv[++i], &end);
            else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = strtoll(argv[++i], &end, 10);
            else if (!strcmp(argv[i], "--ubatch") && i + 1 < argc) {
                ubatch = strtoll(argv[++i], &end, 10);
                if (ubatch < 1 || ubatch > (1 << 20)) end = NULL;
            }
            if (!end || *end || ram < 0 || ctx < 1 || ctx > (1ll << 31)) {
                fprintf(stderr, "dsflash inspect: bad option %s\n%s", argv[i], USAGE);
                return 2;
            }
        }
        return plan(argv[2], ram, ctx, ubatch);
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--parallel")) return describe_parallel(argc, argv);
    if (argc != 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    int rc = 0;
    if (try_projector(argv[1], &rc) == 1) return rc;
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

DSF_COMMAND(inspect, "print a model's metadata, layer roles and tensors (--plan: the memory it needs; --parallel: an MPI job's plan)", cmd_inspect)
