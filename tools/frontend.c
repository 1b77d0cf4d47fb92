/* frontend.c: the CLI front end shared by `dsflash run` and `dsflash chat` (see frontend.h):
 * the common options and their --help lines, model loading, prompt rendering and the printer
 * that shows reasoning apart from the answer.
 * Owns only argument handling and terminal I/O; generation is src/runtime/generate.c.
 * Must not: be linked into the library (it lives in tools/ and is part of the dsflash binary
 * only); exit the process (errors are printed as "dsflash CMD: ..." and returned). */
#include "frontend.h"
#include "dsflash.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== common options =================================================================== */

const char *const GEN_CLI_OPTIONS_HELP =
    "  -m, --model FILE   deepseek41 GGUF (its tokenizer is used too)                [required]\n"
    "  -n, --n-predict N  at most N generated tokens (default: until EOS or the context is full)\n"
    "  --temp T           temperature, 0 = greedy                                       [0.6]\n"
    "  --top-k K          keep the K most likely tokens, 0 = off                        [0]\n"
    "  --top-p P          nucleus sampling, 1 = off                                     [0.95]\n"
    "  --min-p P          drop tokens below P x the top probability, 0 = off            [0]\n"
    "  --seed S           sampling seed (default: from the clock)\n"
    "  --stop S           stop before the text S (repeatable, at most 16)\n"
    "  --ignore-eos       keep generating through the end-of-sentence token\n"
    "  --think            thinking mode: reasoning, then the answer                     [default]\n"
    "  --no-think         chat mode: the answer only\n"
    "  --effort E         reasoning effort: 1..100 or low|medium|high|max|minimal|xhigh [high = 75]\n"
    "  --system S         system prompt\n"
    "  --ctx N            context size in tokens (default: min(4096, training context))\n"
    "  --threads T        worker threads (default: all cores)\n"
    "  --numerics M       reference (official FP8/FP4 QDQ, default) | plain (fp32)\n"
    "  --no-repack        keep the routed experts in the file instead of repacking them in memory\n"
    "  --mmap             read the dense weights from the file mapping instead of copying them into memory\n"
    "  --act-q8k          quantize the activations of K / IQ weights to Q8_K as ggml does (faster there;\n"
    "                     changes the results: opt-in)\n";

const char *const GEN_CLI_ENGRAM_HELP =
    "  --engram-readers N threads that read the Engram table's rows from the file ahead of the layers\n"
    "                     that use them; 0 = none (each Engram layer reads its rows when it needs them) [8]\n"
    "  --engram-cache MB  memory for the Engram table's hot rows (raw, CLOCK eviction); 0 = none  [256]\n";

const char *const GEN_CLI_UBATCH_HELP =
    "  --ubatch N         tokens per forward of a prefill (0 = auto: 32 per routed expert on average,\n"
    "                     512..8192, within 1/16 of RAM per session; `inspect --plan` shows it) [0]\n";

const char *const GEN_CLI_DRAFT_HELP =
    "  --draft FILE       speculative decoding with this DSpark draft GGUF (same output; faster when\n"
    "                     drafts are accepted). \"oracle[:K]\": the test drafter (the model's own argmax,\n"
    "                     draft K corrupted)\n"
    "  --draft-max N      verify at most N drafted tokens per round (0 = the draft's block)  [0]\n"
    "  --draft-min-p P    stop the block where the estimated chance that all drafts so far are\n"
    "                     accepted falls below P (0 = the cost model alone)                  [0]\n"
    "  --draft-policy P   cost: choose the drafts to verify by the cost model (docs/SPECULATIVE.md);\n"
    "                     always: verify every drafted token                              [cost]\n";

void gen_cli_defaults(gen_cli_opts *o, const char *cmd) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->numerics = DSF_NUMERICS_REFERENCE;
    dsf_sampler_params_default(&o->sp);
    o->sp.temperature = 0.6f;
    o->sp.top_p = 0.95f;
    o->sp.stop = o->stops;
    o->think = true;
}

static int opt_err(const gen_cli_opts *o, const char *fmt, const char *a) {
    fprintf(stderr, "dsflash %s: ", o->cmd);
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return -1;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float lo, float hi, float *out) {
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = (float)v;
    return 0;
}

int gen_cli_check_effort(const char *s, char *err) {
    static const char *const names[] = {"low", "medium", "high", "max", "minimal", "xhigh"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i])) return 0;
    long v;
    if (parse_long(s, 1, 100, &v) == 0) return 0;
    return dsf_seterr(err, "bad reasoning effort '%s' (expected 1..100 or low|medium|high|max|minimal|xhigh)", s);
}

int gen_cli_draft_option(spec_opts *o, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (strcmp(a, "--draft") && strcmp(a, "--draft-max") && strcmp(a, "--draft-min-p") && strcmp(a, "--draft-policy"))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "dsflash %s: option %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    long l;
    float f;
    if (!strcmp(a, "--draft")) {
        o->draft = v;
    } else if (!strcmp(a, "--draft-policy")) {
        if (strcmp(v, "cost") && strcmp(v, "always")) {
            fprintf(stderr, "dsflash %s: bad --draft-policy '%s' (expected cost or always)\n", cmd, v);
            return -1;
        }
        o->always = !strcmp(v, "always");
    } else if (!strcmp(a, "--draft-max")) {
        if (parse_long(v, 0, SPEC_MAX_BLOCK, &l)) {
            fprintf(stderr, "dsflash %s: bad --draft-max '%s' (expected 0..%d)\n", cmd, v, SPEC_MAX_BLOCK);
            return -1;
        }
        o->max_draft = (int)l;
    } else {
        if (parse_float(v, 0, 1, &f)) {
            fprintf(stderr, "dsflash %s: bad --draft-min-p '%s' (expected 0..1)\n", cmd, v);
            return -1;
        }
        o->min_p = f;
    }
    return 1;
}

int gen_cli_engram_option(const char *cmd, int argc, char **argv, int *i, int *readers, int *cache_mb) {
    const char *a = argv[*i];
    const bool rd = !strcmp(a, "--engram-readers");
    if (!rd && strcmp(a, "--engram-cache")) return 0;
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long l;
    if (!v || parse_long(v, 0, rd ? 256 : 1L << 20, &l)) {
        fprintf(stderr, "dsflash %s: bad %s '%s' (expected %s)\n", cmd, a, v ? v : "",
                rd ? "0..256 threads" : "0..1048576 MiB");
        return -1;
    }
    *(rd ? readers : cache_mb) = l ? (int)l : -1;
    ++*i;
    return 1;
}

int gen_cli_ubatch_option(const char *cmd, int argc, char **argv, int *i, int *ubatch) {
    if (strcmp(argv[*i], "--ubatch")) return 0;
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long l;
    if (!v || parse_long(v, 0, 1L << 20, &l)) {
        fprintf(stderr, "dsflash %s: bad --ubatch '%s' (expected 0..1048576 tokens, 0 = auto)\n", cmd, v ? v : "");
        return -1;
    }
    *ubatch = (int)l;
    ++*i;
    return 1;
}

int gen_cli_option(gen_cli_opts *o, int argc, char **argv, int *i) {
    int dr = gen_cli_draft_option(&o->spec, o->cmd, argc, argv, i);
    if (dr) return dr;
    dr = gen_cli_engram_option(o->cmd, argc, argv, i, &o->engram_readers, &o->engram_cache_mb);
    if (dr) return dr;
    dr = gen_cli_ubatch_option(o->cmd, argc, argv, i, &o->ubatch);
    if (dr) return dr;
    const char *a = argv[*i];
    static const char *const with_value[] = {"-m", "--model", "-n", "--n-predict", "--temp", "--top-k",
                                             "--top-p", "--min-p", "--seed", "--stop", "--effort",
                                             "--system", "--ctx", "--threads", "--numerics", "--mmproj",
                                             "--image", "--image-max-tokens"};
    bool takes = false;
    for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
        if (!strcmp(a, with_value[k])) takes = true;
    if (!takes) {
        if (!strcmp(a, "--think")) o->think = true;
        else if (!strcmp(a, "--no-think")) o->think = false;
        else if (!strcmp(a, "--ignore-eos")) o->sp.ignore_eos = true;
        else if (!strcmp(a, "--no-repack")) o->repack = -1;
        else if (!strcmp(a, "--mmap")) o->resident = -1;
        else if (!strcmp(a, "--act-q8k")) o->act_q8k = true;
        else return 0;
        return 1;
    }
    if (*i + 1 >= argc) return opt_err(o, "option %s needs a value", a);
    const char *v = argv[++*i];
    long l;
    float f;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        o->model = v;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
        if (parse_long(v, -1, 1L << 30, &l)) return opt_err(o, "bad -n '%s' (expected an integer >= -1)", v);
        o->sp.max_tokens = l < 0 ? 0 : (int)l;
        if (l == 0) return opt_err(o, "bad -n '%s' (0 tokens would generate nothing)", v);
    } else if (!strcmp(a, "--temp")) {
        if (parse_float(v, 0, 100, &f)) return opt_err(o, "bad --temp '%s' (expected 0..100)", v);
        o->sp.temperature = f;
    } else if (!strcmp(a, "--top-k")) {
        if (parse_long(v, 0, 1L << 30, &l)) return opt_err(o, "bad --top-k '%s' (expected an integer >= 0)", v);
        o->sp.top_k = (int)l;
    } else if (!strcmp(a, "--top-p")) {
        if (parse_float(v, 0, 1, &f)) return opt_err(o, "bad --top-p '%s' (expected 0..1)", v);
        o->sp.top_p = f;
    } else if (!strcmp(a, "--min-p")) {
        if (parse_float(v, 0, 1, &f)) return opt_err(o, "bad --min-p '%s' (expected 0..1)", v);
        o->sp.min_p = f;
    } else if (!strcmp(a, "--seed")) {
        errno = 0;
        char *end;
        unsigned long long s = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') return opt_err(o, "bad --seed '%s' (expected an unsigned integer)", v);
        o->sp.seed = s;
        o->seed_set = true;
    } else if (!strcmp(a, "--stop")) {
        if (o->sp.n_stop >= GEN_CLI_MAX_STOP) return opt_err(o, "too many --stop strings (at most %s)", "16");
        if (!*v) return opt_err(o, "empty --stop string%s", "");
        o->stops[o->sp.n_stop++] = v;
    } else if (!strcmp(a, "--effort")) {
        char err[DSF_ERR_LEN];
        if (gen_cli_check_effort(v, err)) return opt_err(o, "%s", err);
        snprintf(o->effort, sizeof o->effort, "%s", v);
    } else if (!strcmp(a, "--system")) {
        o->system = v;
    } else if (!strcmp(a, "--ctx")) {
        if (parse_long(v, 1, 1L << 24, &l)) return opt_err(o, "bad --ctx '%s' (expected 1..16777216)", v);
        o->n_ctx = (int)l;
    } else if (!strcmp(a, "--threads")) {
        if (parse_long(v, 1, 4096, &l)) return opt_err(o, "bad --threads '%s' (expected 1..4096)", v);
        o->n_threads = (int)l;
    } else if (!strcmp(a, "--mmproj")) {
        o->mmproj = v;
    } else if (!strcmp(a, "--image")) {
        if (o->n_images >= GEN_CLI_MAX_IMAGES) return opt_err(o, "too many --image files (at most %s)", "16");
        o->images[o->n_images++] = v;
    } else if (!strcmp(a, "--image-max-tokens")) {
        if (parse_long(v, 1, 1L << 20, &l)) return opt_err(o, "bad --image-max-tokens '%s' (expected 1..1048576)", v);
        o->image_max_tokens = (int)l;
    } else if (!strcmp(a, "--numerics")) {
        if (!strcmp(v, "reference")) o->numerics = DSF_NUMERICS_REFERENCE;
        else if (!strcmp(v, "plain")) o->numerics = DSF_NUMERICS_PLAIN;
        else return opt_err(o, "bad --numerics '%s' (expected reference or plain)", v);
    }
    return 1;
}

/* ==== model and prompt ================================================================= */

int gen_cli_load(const gen_cli_opts *o, gen_cli_model *m) {
    memset(m, 0, sizeof *m);
    char err[DSF_ERR_LEN] = "";
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = o->numerics;
    ep.n_threads = o->n_threads;
    ep.repack = o->repack;
    ep.resident = o->resident;
    ep.act_q8k = o->act_q8k;
    ep.engram_readers = o->engram_readers;
    ep.engram_cache_mb = o->engram_cache_mb;
    ep.ubatch = o->ubatch;
    m->e = dsf_engine_open(o->model, &ep, err);
    if (!m->e) goto fail;
    m->tok = dsf_tokenizer_load(o->model, err);
    if (!m->tok) goto fail;
    int ctx = o->n_ctx;
    if (ctx <= 0) {
        int train = dsf_engine_n_ctx_train(m->e);
        ctx = train > 0 && train < 4096 ? train : 4096;
    }
    m->s = dsf_session_new(m->e, ctx, err);
    if (!m->s) goto fail;
    m->g = dsf_gen_new(m->e, m->s, m->tok, err);
    if (!m->g) goto fail;
    if (o->spec.draft) {
        m->sq = spec_open(m->e, &o->spec, ctx, NULL, err);
        if (!m->sq || spec_attach(m->g, m->sq, err) < 0) goto fail;
    }
    if (gen_cli_load_images(o, m, err)) goto fail;
    return 0;
fail:
    fprintf(stderr, "dsflash %s: %s\n", o->cmd, err);
    gen_cli_unload(m);
    return -1;
}

void gen_cli_unload(gen_cli_model *m) {
    gen_cli_unload_images(m);
    dsf_gen_free(m->g);
    spec_seq_free(m->sq);
    dsf_session_free(m->s);
    dsf_tokenizer_free(m->tok);
    dsf_engine_close(m->e);
    memset(m, 0, sizeof *m);
}

int gen_cli_prompt(const gen_cli_opts *o, const dsf_tokenizer *tok, const char *messages_json,
                   int32_t **ids, int *n, bool *gen_reasoning, char *err) {
    json_error_t je;
    json_t *msgs = json_loads(messages_json, 0, &je);
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        return dsf_seterr(err, "internal: bad message list (%s)", je.text);
    }
    json_t *req = json_object();
    json_object_set_new(req, "messages", msgs);
    json_object_set_new(req, "thinking_mode", json_string(o->think ? "thinking" : "chat"));
    if (o->effort[0]) {
        long v;
        if (parse_long(o->effort, 1, 100, &v) == 0) json_object_set_new(req, "reasoning_effort", json_integer(v));
        else json_object_set_new(req, "reasoning_effort", json_string(o->effort));
    }
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text) return dsf_seterr(err, "out of memory");
    dsf_chat_prompt p;
    int rc = dsf_chat_render_openai(text, strlen(text), &p, err);
    free(text);
    if (rc) return -1;
    int32_t *v = NULL;
    size_t nv = 0;
    /* The rendered text holds the BOS and every marker as text: parse them as special tokens. */
    rc = dsf_tokenize(tok, p.prompt, p.prompt_len, false, true, &v, &nv, err);
    *gen_reasoning = p.gen_reasoning;
    dsf_chat_prompt_free(&p);
    if (rc) return -1;
    if (nv > (size_t)1 << 30) {
        free(v);
        return dsf_seterr(err, "the prompt is too long (%zu tokens)", nv);
    }
    *ids = v;
    *n = (int)nv;
    return 0;
}

/* ==== printer ========================================================================== */

#define DIM "\033[2m"
#define RESET "\033[0m"

void gen_cli_printer_init(gen_cli_printer *pr, FILE *out) {
    memset(pr, 0, sizeof *pr);
    pr->out = out;
    pr->tty = isatty(fileno(out)) && !dsf_knob("NO_COLOR");
    pr->last = '\n';
}

void gen_cli_printer_free(gen_cli_printer *pr) {
    dsf_buf_free(&pr->reasoning);
    dsf_buf_free(&pr->content);
}

static void put(gen_cli_printer *pr, const char *s, size_t n) {
    if (!n) return;
    fwrite(s, 1, n, pr->out);
    fflush(pr->out);
    pr->last = s[n - 1];
}

void gen_cli_on_dsml(void *ud, const dsf_dsml_event *ev) {
    gen_cli_printer *pr = ud;
    if (ev->type == DSF_DSML_REASONING && ev->len) {
        if (pr->state != 1) {
            if (pr->tty) fputs(DIM, pr->out);
            else put(pr, "[thinking] ", 11);
            pr->state = 1;
        }
        put(pr, ev->text, ev->len);
        dsf_buf_append(&pr->reasoning, ev->text, ev->len);
    } else if (ev->type == DSF_DSML_CONTENT && ev->len) {
        if (pr->state == 1) {
            if (pr->tty) fputs(RESET, pr->out);
            put(pr, pr->last == '\n' ? "\n" : "\n\n", pr->last == '\n' ? 1 : 2);
        }
        pr->state = 2;
        put(pr, ev->text, ev->len);
        dsf_buf_append(&pr->content, ev->text, ev->len);
    }
}

void gen_cli_on_text(void *ud, const char *s, size_t n) {
    gen_cli_printer *pr = ud;
    pr->state = 2;
    put(pr, s, n);
    dsf_buf_append(&pr->content, s, n);
}

void gen_cli_printer_end(gen_cli_printer *pr, const dsf_dsml_result *r) {
    if (pr->state == 1 && pr->tty) fputs(RESET, pr->out);
    if (pr->last != '\n') put(pr, "\n", 1);
    for (int i = 0; r && i < r->n_calls; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(r->calls[i].name ? r->calls[i].name : ""));
        if (r->calls[i].ns) json_object_set_new(o, "namespace", json_string(r->calls[i].ns));
        json_object_set_new(o, "arguments", json_string(r->calls[i].arguments ? r->calls[i].arguments : ""));
        char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(o);
        if (line) {
            put(pr, line, strlen(line));
            put(pr, "\n", 1);
            free(line);
        }
    }
    fflush(pr->out);
}

void gen_cli_print_stats(const char *cmd, const dsf_gen_result *r) {
    fprintf(stderr,
            "[%s] prompt %d tokens (%d cached, %.1f tok/s), completion %d tokens (%.2f tok/s), finish: %s\n",
            cmd, r->n_prompt, r->n_cached, r->prefill_tps, r->n_completion, r->decode_tps,
            dsf_finish_reason_str(r->finish));
}

void gen_cli_print_spec(const char *cmd, gen_cli_model *m) {
    if (!m->sq) return;
    const spec_stats *st = spec_seq_stats(m->sq);
    long long steps = st->rounds + st->plain;
    fprintf(stderr,
            "[%s] draft: %lld rounds, %lld plain steps, accepted %lld of %lld verified drafts (%.1f %%), "
            "%.2f tokens per forward\n",
            cmd, st->rounds, st->plain, st->accepted, st->verified,
            st->verified ? 100.0 * (double)st->accepted / (double)st->verified : 0.0,
            steps ? (double)(st->committed + st->plain) / (double)steps : 0.0);
    spec_seq_stats_reset(m->sq);
}
