/* logits_image.c: `dsflash logits -m MAIN --mmproj PROJ --prompt-text TEXT --image FILE ...`:
 * the logits of a prompt with images (vision.md §5-§8), written as cmd_logits.c writes them
 * (raw float32 [n_tokens][n_vocab], row i = after expanded token i).
 * The prompt text is tokenized as a whole with special tokens parsed; each <｜deepseek_image｜>
 * is replaced by its image's span (the images in order, encoded by the projector); the first
 * --prefill N expanded tokens go in one forward, the rest one per step (the goldens'
 * prefill_len). The tower follows --numerics (plain: fp32, reference: bf16) unless --tower
 * says otherwise. --print-tokens prints the expanded ids and types ("i id type" lines). */
#include "logits_image.h"
#include "cmd.h"
#include "dsflash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LI_MAX_IMAGES 64
#define IMAGE_TOKEN "<｜deepseek_image｜>"

static const char *USAGE =
    "usage: dsflash logits -m MAIN.gguf --mmproj PROJ.gguf --prompt-text TEXT --image FILE [--image FILE ...]\n"
    "                      --out OUT.f32 [--image-max-tokens N] [--prefill N] [--tower bf16|fp32]\n"
    "                      [--numerics reference|plain] [--threads T] [--ctx N] [--print-tokens]\n"
    "  TEXT holds one <｜deepseek_image｜> per --image, in order (special tokens are parsed).\n"
    "  --prefill N      the first N expanded tokens in one forward, then one per step (default: all)\n"
    "  --tower          the vision tower's arithmetic (default: fp32 with plain, bf16 with reference)\n"
    "  --print-tokens   print the expanded prompt: one 'index id type' line per token\n";

typedef struct {
    const char *model, *mmproj, *text, *out;
    const char *images[LI_MAX_IMAGES];
    int n_images, max_tokens, prefill, tower, threads, ctx;
    bool print;
    dsf_numerics numerics;
} li_opts;

static int li_fail(const char *fmt, const char *a) {
    fprintf(stderr, "dsflash logits: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 1;
}

static int li_int(const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > 1 << 30) return -1;
    *out = (int)v;
    return 0;
}

bool logits_image_wanted(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mmproj") || !strcmp(argv[i], "--image") || !strcmp(argv[i], "--prompt-text"))
            return true;
    return false;
}

/* 0, or the exit status of a refused command line. */
static int parse(int argc, char **argv, li_opts *o) {
    memset(o, 0, sizeof *o);
    o->tower = -1;
    dsf_engine_params d;
    dsf_engine_params_default(&d);
    o->numerics = d.numerics;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const bool flag = !strcmp(a, "--print-tokens");
        if (!flag && !v) return li_fail("option %s needs a value", a);
        if (flag) o->print = true;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--mmproj")) o->mmproj = v;
        else if (!strcmp(a, "--prompt-text")) o->text = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) o->out = v;
        else if (!strcmp(a, "--image")) {
            if (o->n_images == LI_MAX_IMAGES) return li_fail("more than %s images", "64");
            o->images[o->n_images++] = v;
        } else if (!strcmp(a, "--image-max-tokens")) {
            if (li_int(v, 3, &o->max_tokens)) return li_fail("bad --image-max-tokens '%s'", v);
        } else if (!strcmp(a, "--prefill")) {
            if (li_int(v, 1, &o->prefill)) return li_fail("bad --prefill '%s'", v);
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (li_int(v, 1, &o->threads)) return li_fail("bad --threads '%s'", v);
        } else if (!strcmp(a, "--ctx")) {
            if (li_int(v, 1, &o->ctx)) return li_fail("bad --ctx '%s'", v);
        } else if (!strcmp(a, "--tower")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) return li_fail("--tower must be bf16 or fp32, not '%s'", v);
            o->tower = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--numerics")) {
            if (!strcmp(v, "reference")) o->numerics = DSF_NUMERICS_REFERENCE;
            else if (!strcmp(v, "plain")) o->numerics = DSF_NUMERICS_PLAIN;
            else return li_fail("--numerics must be reference or plain, not '%s'", v);
        } else return li_fail("unknown option '%s' (see --help)", a);
        if (!flag) i++;
    }
    if (!o->model) return li_fail("missing -m MAIN.gguf%s", "");
    if (!o->mmproj) return li_fail("missing --mmproj PROJ.gguf%s", "");
    if (!o->text) return li_fail("missing --prompt-text TEXT%s", "");
    if (!o->out) return li_fail("missing --out OUT.f32%s", "");
    if (o->tower < 0) o->tower = o->numerics == DSF_NUMERICS_REFERENCE;
    return 0;
}

static int read_bytes(const char *path, uint8_t **out, size_t *len, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, DSF_ERR_LEN, "%.400s: %s", path, strerror(errno)), -1;
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *b = malloc(cap);
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0)
        if ((n += r) == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    const int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        return snprintf(err, DSF_ERR_LEN, "%.400s: %s", path, b ? "read error" : "out of memory"), -1;
    }
    *out = b;
    *len = n;
    return 0;
}

/* The expanded prompt's logits: prefill tokens in one forward, then one per step. */
static int run_prompt(dsf_engine *e, const dsf_mm_prompt *p, const li_opts *o, float *rows, char *err) {
    const int V = dsf_engine_n_vocab(e), n = p->n, pre = o->prefill && o->prefill < n ? o->prefill : n;
    dsf_session *s = dsf_session_new(e, o->ctx ? o->ctx : n, err);
    if (!s) return -1;
    int64_t r = 0; /* the span rows before position i */
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        const int c = i == 0 ? pre : 1;
        const dsf_media m = {p->types + i, p->embd ? p->embd + r * p->n_embd : NULL, p->keys + i};
        rc = dsf_session_eval_media(s, p->tokens + i, &m, c, rows + (size_t)i * (size_t)V, true, err);
        for (int k = 0; k < c; k++) r += p->types[i + k] >= 0;
        i += c;
    }
    dsf_session_free(s);
    return rc;
}

/* Tokenizes the text, encodes the images and expands the placeholders. */
static int build_prompt(dsf_engine *e, const li_opts *o, dsf_mm_prompt *p, char *err) {
    dsf_tokenizer *tk = dsf_tokenizer_load(o->model, err);
    if (!tk) return -1;
    const int32_t image_id = dsf_token_id(tk, IMAGE_TOKEN);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = image_id < 0 ? (snprintf(err, DSF_ERR_LEN, "the tokenizer has no %s token", IMAGE_TOKEN), -1)
                          : dsf_tokenize(tk, o->text, strlen(o->text), false, true, &ids, &n, err);
    dsf_tokenizer_free(tk);
    dsf_vision_params vp;
    dsf_vision_params_default(&vp);
    vp.numerics = o->tower ? DSF_NUMERICS_REFERENCE : DSF_NUMERICS_PLAIN;
    vp.n_threads = o->threads;
    dsf_vision *v = rc == 0 ? dsf_vision_open(o->mmproj, &vp, err) : NULL;
    if (rc == 0 && !v) rc = -1;
    if (rc == 0 && dsf_vision_n_embd(v) != dsf_engine_n_embd(e))
        rc = (snprintf(err, DSF_ERR_LEN, "the projector's rows have %d floats, the model's stream %d",
                       dsf_vision_n_embd(v), dsf_engine_n_embd(e)), -1);
    dsf_image im[LI_MAX_IMAGES];
    memset(im, 0, sizeof im);
    for (int i = 0; i < o->n_images && rc == 0; i++) {
        uint8_t *bytes = NULL;
        size_t len = 0;
        rc = read_bytes(o->images[i], &bytes, &len, err);
        if (rc == 0 && dsf_vision_encode(v, bytes, len, o->max_tokens, &im[i], err) < 0) {
            char keep[DSF_ERR_LEN];
            snprintf(keep, sizeof keep, "%s", err);
            snprintf(err, DSF_ERR_LEN, "%.200s: %.300s", o->images[i], keep);
            rc = -1;
        }
        free(bytes);
    }
    if (rc == 0) rc = dsf_mm_expand(ids, (int)n, image_id, im, o->n_images, p, err);
    for (int i = 0; i < o->n_images; i++) dsf_image_free(&im[i]);
    dsf_vision_close(v);
    free(ids);
    return rc;
}

int logits_image_main(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    li_opts o;
    int bad = parse(argc, argv, &o);
    if (bad) return bad;
    char err[DSF_ERR_LEN] = "";
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = o.numerics;
    ep.n_threads = o.threads;
    dsf_engine *e = dsf_engine_open(o.model, &ep, err);
    if (!e) return li_fail("%s", err);
    dsf_mm_prompt p = {0};
    float *rows = NULL;
    int ok = build_prompt(e, &o, &p, err) == 0;
    if (ok && o.print)
        for (int i = 0; i < p.n; i++) printf("%d %d %d\n", i, (int)p.tokens[i], (int)p.types[i]);
    const int V = dsf_engine_n_vocab(e);
    if (ok && !(rows = calloc((size_t)p.n * (size_t)V, sizeof(float))))
        ok = 0, snprintf(err, sizeof err, "out of memory for %d x %d logits", p.n, V);
    if (ok) ok = run_prompt(e, &p, &o, rows, err) == 0;
    if (ok) {
        FILE *f = fopen(o.out, "wb");
        ok = f && fwrite(rows, sizeof(float), (size_t)p.n * (size_t)V, f) == (size_t)p.n * (size_t)V;
        if (f && fclose(f)) ok = 0;
        if (!ok) snprintf(err, sizeof err, "cannot write %.400s: %s", o.out, strerror(errno));
    }
    if (!ok) li_fail("%s", err); /* before the engine closes: cmd_logits.c says why */
    free(rows);
    dsf_mm_prompt_free(&p);
    dsf_engine_close(e);
    return ok ? 0 : 1;
}
