/* cmd_imatrix.c: `dsflash imatrix -m M.gguf (-f TEXT | --tokens 1,2,3) [--chunks N] [--ctx N]
 * [--numerics reference|plain] [--threads N] -o FILE`: runs chunks of text through the model
 * and writes the importance matrix of every layer weight in llama.cpp's GGUF imatrix format
 * (convert/imatrix_collect.h says what is collected), for `dsflash quantize --imatrix`.
 *
 * Chunks as llama-imatrix makes them: the text is tokenized with BOS in front, cut into
 * chunks of --ctx tokens (a shorter tail is dropped), the first token of each chunk is BOS,
 * and each chunk is evaluated from an empty context. --tokens takes the ids as they are (no
 * BOS is written over them) and its --ctx defaults to the whole list: one chunk. */
#include "cmd.h"
#include "outfile.h"
#include "dsflash.h"
#include "convert/imatrix_collect.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *USAGE =
    "usage: dsflash imatrix -m MODEL.gguf (-f TEXT | --tokens 1,2,3) -o OUT.gguf [options]\n"
    "  Collects, for every matmul weight of the layers, the sum over the evaluated tokens of each\n"
    "  input column's squared activation (and the token count per matrix; per expert for the\n"
    "  stacked expert tensors), and writes llama.cpp's GGUF imatrix format for\n"
    "  `dsflash quantize --imatrix OUT.gguf`.\n"
    "  -f TEXT          text file, tokenized with the model's tokenizer (BOS in front)\n"
    "  --tokens IDS     token ids instead of text, taken as they are (tests)\n"
    "  --ctx N          tokens per chunk (default 512; with --tokens, the whole list); each chunk starts\n"
    "                   with BOS (text only) and runs from an empty context; a shorter tail is dropped\n"
    "  --chunks N       evaluate at most N chunks (default: all)\n"
    "  --numerics M     reference (default: the activations after the official FP8 QDQ) or plain\n"
    "  --threads N      threads (default: all cores)\n"
    "  -o FILE          output (written to FILE.tmp, then renamed)\n";

static int fail(const char *fmt, const char *a) {
    fprintf(stderr, "dsflash imatrix: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 1;
}

static int parse_count(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > 1 << 30) return -1;
    *out = (int)v;
    return 0;
}

typedef struct {
    const char *model, *text, *toks, *out;
    int ctx, chunks, threads;
    dsf_numerics numerics;
} opts;

static int parse_args(int argc, char **argv, opts *o) {
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] == '-' && a[1] && !v) return fail("option %s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->text = v;
        else if (!strcmp(a, "--tokens")) o->toks = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--ctx")) {
            if (parse_count(v, &o->ctx)) return fail("bad --ctx '%s' (a number of tokens >= 1)", v);
        } else if (!strcmp(a, "--chunks")) {
            if (parse_count(v, &o->chunks)) return fail("bad --chunks '%s' (a number >= 1)", v);
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (parse_count(v, &o->threads)) return fail("bad --threads '%s' (a number >= 1)", v);
        } else if (!strcmp(a, "--numerics")) {
            if (!strcmp(v, "reference")) o->numerics = DSF_NUMERICS_REFERENCE;
            else if (!strcmp(v, "plain")) o->numerics = DSF_NUMERICS_PLAIN;
            else return fail("--numerics must be reference or plain, not '%s'", v);
        } else return fail("unknown argument '%s' (see --help)", a);
    }
    if (!o->model) return fail("missing -m MODEL.gguf%s", "");
    if (!o->out) return fail("missing -o OUT.gguf%s", "");
    if (!o->text == !o->toks) return fail("give exactly one of -f TEXT and --tokens IDS%s", "");
    return 0;
}

/* The token stream: the text tokenized with BOS in front (*bos = its id), or the list. */
static int load_tokens(const opts *o, int32_t **tok, int *n, int32_t *bos, char *err) {
    *bos = -1;
    if (o->toks) return cli_parse_tokens(o->toks, tok, n, err);
    uint8_t *text = NULL;
    size_t len = 0;
    if (dsf_read_file(o->text, &text, &len, err)) return -1;
    if (len == 0) {
        free(text);
        return dsf_seterr(err, "%s is empty: give a text to collect the activations of", o->text);
    }
    dsf_tokenizer *tk = dsf_tokenizer_load(o->model, err);
    int rc = -1;
    size_t nt = 0;
    if (tk) {
        *bos = dsf_tokenizer_bos(tk);
        rc = dsf_tokenize(tk, (const char *)text, len, *bos >= 0, false, tok, &nt, err);
        dsf_tokenizer_free(tk);
    }
    free(text);
    if (rc == 0 && nt > (size_t)(1 << 30)) {
        free(*tok);
        return dsf_seterr(err, "%s: %zu tokens, more than this command takes", o->text, nt);
    }
    *n = (int)nt;
    return rc;
}

/* Evaluates n_chunks chunks of ctx tokens from an empty context each, drawing progress. */
static int run_chunks(dsf_engine *e, const int32_t *tok, int ctx, int n_chunks, int32_t bos, char *err) {
    dsf_session *s = dsf_session_new(e, ctx, err);
    if (!s) return -1;
    int32_t *chunk = dsf_xmalloc((size_t)ctx * sizeof *chunk);
    const double t0 = dsf_now();
    int rc = 0;
    for (int c = 0; c < n_chunks && !rc; c++) {
        memcpy(chunk, tok + (size_t)c * (size_t)ctx, (size_t)ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        rc = dsf_session_rollback(s, 0, err) || dsf_session_eval(s, chunk, ctx, NULL, false, err) ? -1 : 0;
        const double dt = dsf_now() - t0;
        if (!rc)
            fprintf(stderr, "dsflash imatrix: chunk %d/%d, %.1f s, %.0f tokens/s, ETA %.0f s\n", c + 1, n_chunks, dt,
                    (double)(c + 1) * ctx / dt, dt / (c + 1) * (n_chunks - c - 1));
    }
    free(chunk);
    dsf_session_free(s);
    return rc;
}

/* Refuses an output that cannot be written before the model runs (OUT.tmp is created and
 * removed again; the writer creates it anew at the end). */
static int check_writable(const char *tmp, char *err) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return dsf_seterr(err, "cannot write %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return 0;
}

static int collect(const opts *o, const int32_t *tok, int n_tok, int32_t bos, const char *tmp, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = o->numerics;
    ep.n_threads = o->threads;
    dsf_engine *e = dsf_engine_open(o->model, &ep, err);
    if (!e) return -1;
    int rc = -1, ctx = o->ctx ? o->ctx : o->toks ? n_tok : 512;
    int n_chunks = n_tok / ctx;
    if (o->chunks && o->chunks < n_chunks) n_chunks = o->chunks;
    imatrix_collector *c = NULL;
    if (dsf_engine_n_ctx_train(e) > 0 && ctx > dsf_engine_n_ctx_train(e))
        dsf_seterr(err, "--ctx %d is longer than the model's context (%d tokens)", ctx, dsf_engine_n_ctx_train(e));
    else if (n_chunks == 0)
        dsf_seterr(err, "%s gives %d tokens, fewer than one chunk of --ctx %d", o->text ? o->text : "--tokens", n_tok, ctx);
    else if ((c = imatrix_collector_new(e, err)) && !run_chunks(e, tok, ctx, n_chunks, bos, err)) {
        if (imatrix_collector_unmapped(c))
            fprintf(stderr, "dsflash imatrix: warning: %lld products on matrices that are not layer weights (not collected)\n",
                    (long long)imatrix_collector_unmapped(c));
        imatrix_meta m = {o->text, (uint32_t)n_chunks, (uint32_t)ctx};
        rc = imatrix_collector_write(c, tmp, &m, err);
        if (!rc)
            fprintf(stderr, "dsflash imatrix: %lld weights, %d chunks of %d tokens -> %s\n",
                    (long long)imatrix_collector_count(c), n_chunks, ctx, o->out);
    }
    imatrix_collector_free(c);
    if (rc && err[0]) { /* said before the close: in an MPI job the launcher may kill this rank soon */
        dsf_err_oneline(err);
        fail("%s", err);
        err[0] = 0;
        rc = -2;
    }
    dsf_engine_close(e);
    return rc;
}

static int cmd_imatrix(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    opts o = {.numerics = DSF_NUMERICS_REFERENCE};
    if (parse_args(argc, argv, &o)) return 2;
    char err[DSF_ERR_LEN] = "";
    const char *tmp = outfile_begin(o.out);
    if (!tmp) return fail("output path too long%s", "");
    if (check_writable(tmp, err)) return outfile_end(-1, err), fail("%s", err);
    int32_t *tok = NULL, bos = -1;
    int n_tok = 0;
    int rc = load_tokens(&o, &tok, &n_tok, &bos, err);
    if (!rc) rc = collect(&o, tok, n_tok, bos, tmp, err);
    free(tok);
    if (outfile_end(rc, err)) {
        if (rc == -2) return 1; /* collect said why */
        dsf_err_oneline(err);
        return fail("%s", err[0] ? err : "failed");
    }
    return 0;
}

DSF_COMMAND(imatrix, "collect an importance matrix (llama.cpp's GGUF imatrix) for dsflash quantize", cmd_imatrix)
