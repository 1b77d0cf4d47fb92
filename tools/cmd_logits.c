/* cmd_logits.c: `dsflash logits`: runs a token sequence through the engine and writes every
 * row of logits as raw little-endian float32 [n_tokens][n_vocab] (row i = after token i).
 * --chunk, --rollback-to and --snapshot-at exercise the session state; all of them must
 * reproduce the uninterrupted rows. --batch K runs K sessions on rotations of the list and
 * decodes them together (one dsf_batch_eval per step), writing [K][n_tokens][n_vocab]: each
 * session's rows must equal a single run on its own list. This is the acceptance contract:
 * keep it stable. */
#include "cmd.h"
#include "dsflash.h"
#include "frontend.h"
#include "logits_image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *USAGE =
    "usage: dsflash logits -m MODEL.gguf (--tokens 1,2,3 | --tokens-file FILE) --out OUT.f32\n"
    "                      [--chunk N] [--numerics reference|plain] [--threads T]\n"
    "                      [--rollback-to K] [--snapshot-at K] [--batch K [--prefill P]] [--ctx N] [--act-q8k]\n"
    "  Writes float32 [n_tokens][n_vocab]; row i holds the logits after consuming token i.\n"
    "  --chunk N        feed N tokens per eval (1 = token-by-token decode; default: all at once)\n"
    "  --ubatch N       tokens per forward within an eval (default 0: auto; the logits do not change)\n"
    "  --rollback-to K  after all tokens, roll back to K and feed tokens[K:] again (rows >= K from that pass)\n"
    "  --snapshot-at K  after K tokens, save the state, drop the session, restore it into a new one, continue\n"
    "  --batch K        K sessions; session i runs the list rotated left by i (tokens[(j + i) % n] at j): each\n"
    "                   prefills its first P tokens (--chunk applies), then all K decode the rest in lockstep,\n"
    "                   one batched step per token; writes [K][n_tokens][n_vocab], session-major\n"
    "  --prefill P      with --batch: the tokens each session prefills before the batched decode (default n/2)\n"
    "  --act-q8k        quantize the activations of K / IQ weights to Q8_K as ggml does (changes the logits)\n"
    "With images: dsflash logits -m MAIN --mmproj PROJ --prompt-text TEXT --image FILE ... --out OUT.f32\n"
    "  (dsflash logits --mmproj x --help for its options)\n";

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "dsflash logits: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

int cli_parse_tokens(const char *s, int32_t **out, int *n, char *err) {
    int cap = 64, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return snprintf(err, DSF_ERR_LEN, "out of memory"), -1;
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        if (*p < '0' || *p > '9') {
            snprintf(err, DSF_ERR_LEN, "bad token list: unexpected character '%c' at offset %ld", *p, (long)(p - s));
            free(v);
            return -1;
        }
        errno = 0;
        char *end;
        long long x = strtoll(p, &end, 10);
        if (errno || x > 2147483647LL) {
            snprintf(err, DSF_ERR_LEN, "bad token list: id out of range at offset %ld", (long)(p - s));
            free(v);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                return snprintf(err, DSF_ERR_LEN, "out of memory"), -1;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            snprintf(err, DSF_ERR_LEN, "bad token list: unexpected character '%c' at offset %ld", *p, (long)(p - s));
            free(v);
            return -1;
        }
    }
    if (k == 0) {
        free(v);
        snprintf(err, DSF_ERR_LEN, "the token list is empty");
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

static int read_text_file(const char *path, char **out, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, DSF_ERR_LEN, "%s: %s", path, strerror(errno)), -1;
    size_t cap = 4096, n = 0, r;
    char *b = malloc(cap + 1);
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb) {
                free(b);
                b = NULL;
            } else b = nb;
        }
    }
    fclose(f);
    if (!b) return snprintf(err, DSF_ERR_LEN, "out of memory"), -1;
    b[n] = 0;
    if (strlen(b) != n) {
        free(b);
        return snprintf(err, DSF_ERR_LEN, "%s: contains a NUL byte", path), -1;
    }
    *out = b;
    return 0;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > 1 << 30) return -1;
    *out = (int)v;
    return 0;
}

/* Feeds tokens[from, to) in chunks, writing rows into logits. */
static int feed(dsf_session *s, const int32_t *tok, int from, int to, int chunk, float *logits, int V, char *err) {
    for (int i = from; i < to;) {
        int n = to - i < chunk ? to - i : chunk;
        if (dsf_session_eval(s, tok + i, n, logits + (size_t)i * (size_t)V, true, err) < 0) return -1;
        i += n;
    }
    return 0;
}

/* --batch: K sessions, session i on tok rotated left by i; each feeds its first P tokens in
 * chunks, then one dsf_batch_eval per position j in [P, n) appends the K sessions' j-th tokens.
 * rows: [K][n][V]. 0, or -1 with err. */
static int feed_batch(dsf_engine *e, const int32_t *tok, int n, int K, int P, int chunk, int ctx, float *rows, int V,
                      char *err) {
    int32_t *rot = malloc((size_t)K * (size_t)n * sizeof *rot), *step = malloc((size_t)K * sizeof *step);
    dsf_session **ss = calloc((size_t)K, sizeof *ss);
    float *lg = malloc((size_t)K * (size_t)V * sizeof *lg);
    int rc = rot && step && ss && lg ? 0 : -1;
    if (rc < 0) snprintf(err, DSF_ERR_LEN, "out of memory for a batch of %d", K);
    for (int i = 0; rc == 0 && i < K; i++) {
        for (int j = 0; j < n; j++) rot[(size_t)i * (size_t)n + (size_t)j] = tok[(j + i) % n];
        if (!(ss[i] = dsf_session_new(e, ctx, err))) rc = -1;
        else rc = feed(ss[i], rot + (size_t)i * (size_t)n, 0, P, chunk, rows + (size_t)i * (size_t)n * (size_t)V, V, err);
    }
    for (int j = P; rc == 0 && j < n; j++) {
        for (int i = 0; i < K; i++) step[i] = rot[(size_t)i * (size_t)n + (size_t)j];
        rc = dsf_batch_eval(ss, step, K, lg, err);
        for (int i = 0; rc == 0 && i < K; i++)
            memcpy(rows + ((size_t)i * (size_t)n + (size_t)j) * (size_t)V, lg + (size_t)i * (size_t)V, (size_t)V * sizeof *lg);
    }
    for (int i = 0; ss && i < K; i++) dsf_session_free(ss[i]);
    free(rot), free(step), free(ss), free(lg);
    return rc;
}

static int cmd_logits(int argc, char **argv) {
    if (logits_image_wanted(argc, argv)) return logits_image_main(argc, argv);
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    const char *model = NULL, *toks = NULL, *tfile = NULL, *outp = NULL;
    int chunk = 0, threads = 0, rollback = -1, snap = -1, ctx = 0, batch = 0, prefill = -1;
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) return fail("option %s needs a value%s", a, ""); i++; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEEDV(); model = v; }
        else if (!strcmp(a, "--tokens")) { NEEDV(); toks = v; }
        else if (!strcmp(a, "--tokens-file")) { NEEDV(); tfile = v; }
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) { NEEDV(); outp = v; }
        else if (!strcmp(a, "--chunk")) { NEEDV(); if (parse_int(v, 1, &chunk)) return fail("bad --chunk '%s'%s", v, ""); }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { NEEDV(); if (parse_int(v, 1, &threads)) return fail("bad --threads '%s'%s", v, ""); }
        else if (!strcmp(a, "--rollback-to")) { NEEDV(); if (parse_int(v, 0, &rollback)) return fail("bad --rollback-to '%s'%s", v, ""); }
        else if (!strcmp(a, "--snapshot-at")) { NEEDV(); if (parse_int(v, 0, &snap)) return fail("bad --snapshot-at '%s'%s", v, ""); }
        else if (!strcmp(a, "--batch")) { NEEDV(); if (parse_int(v, 1, &batch) || batch > 1024) return fail("bad --batch '%s'%s (want 1..1024 sessions)", v, ""); }
        else if (!strcmp(a, "--prefill")) { NEEDV(); if (parse_int(v, 0, &prefill)) return fail("bad --prefill '%s'%s", v, ""); }
        else if (!strcmp(a, "--ctx")) { NEEDV(); if (parse_int(v, 1, &ctx)) return fail("bad --ctx '%s'%s", v, ""); }
        else if (!strcmp(a, "--act-q8k")) ep.act_q8k = true;
        else if (!strcmp(a, "--ubatch")) {
            if (gen_cli_ubatch_option("logits", argc, argv, &i, &ep.ubatch) < 0) return 1;
        }
        else if (!strcmp(a, "--numerics")) {
            NEEDV();
            if (!strcmp(v, "reference")) ep.numerics = DSF_NUMERICS_REFERENCE;
            else if (!strcmp(v, "plain")) ep.numerics = DSF_NUMERICS_PLAIN;
            else return fail("--numerics must be reference or plain, not '%s'%s", v, "");
        } else return fail("unknown option '%s'%s (see --help)", a, "");
#undef NEEDV
    }
    if (!model) return fail("missing -m MODEL.gguf%s%s", "", "");
    if (!outp) return fail("missing --out OUT.f32%s%s", "", "");
    if (!toks == !tfile) return fail("give exactly one of --tokens and --tokens-file%s%s", "", "");
    if (prefill >= 0 && !batch) return fail("--prefill needs --batch%s%s", "", "");
    if (batch && (rollback >= 0 || snap >= 0))
        return fail("--batch does not combine with %s%s", rollback >= 0 ? "--rollback-to" : "--snapshot-at", "");
    char err[DSF_ERR_LEN] = "";
    char *text = NULL;
    if (tfile && read_text_file(tfile, &text, err) < 0) return fail("%s%s", err, "");
    int32_t *tok = NULL;
    int n = 0;
    int rc = cli_parse_tokens(tfile ? text : toks, &tok, &n, err);
    free(text);
    if (rc < 0) return fail("%s%s", err, "");
    if (rollback > n || snap > n || prefill > n) {
        free(tok);
        return fail("%s is beyond the token count%s", rollback > n ? "--rollback-to" : snap > n ? "--snapshot-at" : "--prefill", "");
    }
    if (prefill < 0) prefill = n / 2;
    if (!chunk) chunk = n;
    ep.n_threads = threads;
    dsf_engine *e = dsf_engine_open(model, &ep, err);
    if (!e) {
        free(tok);
        return fail("%s%s", err, "");
    }
    int V = dsf_engine_n_vocab(e);
    const size_t nrows = (size_t)(batch ? batch : 1) * (size_t)n;
    float *rows = calloc(nrows * (size_t)V, sizeof(float));
    dsf_session *s = rows && !batch ? dsf_session_new(e, ctx ? ctx : n, err) : NULL;
    int ok = s != NULL || (rows && batch);
    if (!rows) snprintf(err, sizeof err, "out of memory for %zu x %d logits", nrows, V);
    if (ok && batch) {
        ok = feed_batch(e, tok, n, batch, prefill, chunk, ctx ? ctx : n, rows, V, err) == 0;
    } else if (ok && snap >= 0) {
        ok = feed(s, tok, 0, snap, chunk, rows, V, err) == 0;
        uint8_t *buf = NULL;
        size_t len = 0;
        if (ok) ok = dsf_session_save(s, &buf, &len, err) == 0;
        if (ok) {
            char path[4096];
            snprintf(path, sizeof path, "%s.state", outp);
            FILE *f = fopen(path, "wb");
            ok = f && fwrite(buf, 1, len, f) == len;
            if (f && fclose(f)) ok = 0;
            free(buf);
            buf = NULL;
            if (!ok) snprintf(err, sizeof err, "cannot write %.400s", path);
            dsf_session_free(s);
            s = NULL;
            uint8_t *back = NULL;
            size_t blen = 0;
            if (ok) {
                FILE *g = fopen(path, "rb");
                ok = g != NULL;
                if (g) {
                    back = malloc(len ? len : 1);
                    ok = back && fread(back, 1, len, g) == len;
                    fclose(g);
                }
                remove(path);
                if (!ok) snprintf(err, sizeof err, "cannot read back %.400s", path);
            }
            if (ok) s = dsf_session_new(e, ctx ? ctx : n, err);
            ok = ok && s && dsf_session_restore(s, back, blen ? blen : len, err) == 0;
            free(back);
        }
        free(buf);
        if (ok) ok = feed(s, tok, snap, n, chunk, rows, V, err) == 0;
    } else if (ok) {
        ok = feed(s, tok, 0, n, chunk, rows, V, err) == 0;
    }
    if (ok && rollback >= 0) {
        ok = dsf_session_rollback(s, rollback, err) == 0;
        if (ok) ok = feed(s, tok, rollback, n, chunk, rows, V, err) == 0;
    }
    if (ok) {
        FILE *f = fopen(outp, "wb");
        ok = f && fwrite(rows, sizeof(float), nrows * (size_t)V, f) == nrows * (size_t)V;
        if (f && fclose(f)) ok = 0;
        if (!ok) snprintf(err, sizeof err, "cannot write %s: %s", outp, strerror(errno));
    }
    /* the error first: in an MPI job the launcher kills this rank soon after its stop signal,
     * and closing the engine can outlast that */
    if (!ok) fail("%s%s", err, "");
    dsf_session_free(s);
    dsf_engine_close(e);
    free(rows);
    free(tok);
    return ok ? 0 : 1;
}

DSF_COMMAND(logits, "run tokens through the model and write every row of logits (float32)", cmd_logits)
