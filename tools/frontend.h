/* frontend.h: the CLI front end shared by `dsflash run` and `dsflash chat` (tools/frontend.c):
 * the common options, model loading, prompt rendering and the terminal printer.
 * Part of the dsflash binary only (tools/): nothing in src/ may include this header. */
#ifndef DSF_FRONTEND_H
#define DSF_FRONTEND_H

#include "dsflash.h"
#include "base/util.h"
#include "runtime/spec.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#define GEN_CLI_MAX_STOP 16
#define GEN_CLI_MAX_IMAGES 16

typedef struct {
    const char *cmd;          /* "run" or "chat", for error lines */
    const char *model;
    int n_ctx;                /* session max_ctx (<= 0: min(4096, training context)) */
    int n_threads;            /* <= 0: all cores */
    dsf_numerics numerics;
    int repack;               /* dsf_engine_params.repack (--no-repack: -1) */
    int resident;             /* dsf_engine_params.resident (--mmap: -1) */
    bool act_q8k;             /* dsf_engine_params.act_q8k (--act-q8k) */
    int engram_readers;       /* dsf_engine_params.engram_readers (--engram-readers) */
    int engram_cache_mb;      /* dsf_engine_params.engram_cache_mb (--engram-cache) */
    int ubatch;               /* dsf_engine_params.ubatch (--ubatch) */
    dsf_sampler_params sp;    /* sampling + max_tokens (-n) + stop strings */
    bool seed_set;
    bool think;               /* thinking_mode "thinking" (default) or "chat" */
    char effort[16];          /* reasoning effort as given ("" = the encoder's default) */
    const char *system;       /* system prompt or NULL */
    const char *stops[GEN_CLI_MAX_STOP];
    spec_opts spec;           /* --draft, --draft-max, --draft-min-p */
    const char *mmproj;       /* --mmproj: the vision projector (NULL: text only) */
    int image_max_tokens;     /* --image-max-tokens (0: the projector's default) */
    const char *images[GEN_CLI_MAX_IMAGES]; /* --image FILE (repeatable), into the first user message */
    int n_images;
} gen_cli_opts;

void gen_cli_defaults(gen_cli_opts *o, const char *cmd);
/* Parses the option at argv[*i] if it is a common one: returns 1 (and advances *i past its
 * value), 0 if it is not a common option, -1 after printing "dsflash CMD: ..." on stderr. */
int gen_cli_option(gen_cli_opts *o, int argc, char **argv, int *i);
/* --engram-readers N and --engram-cache MB, shared by run, chat, bench and serve: returns 1
 * (and advances *i past the value) with *readers / *cache_mb set as dsf_engine_params wants
 * them (the command line's 0 = none becomes -1), 0 if argv[*i] is neither, -1 after printing
 * "dsflash CMD: ..." on stderr. */
int gen_cli_engram_option(const char *cmd, int argc, char **argv, int *i, int *readers, int *cache_mb);
extern const char *const GEN_CLI_ENGRAM_HELP;
/* --ubatch N (0..1048576, 0 = auto), shared by run, chat, bench, logits and serve: returns 1
 * (and advances *i past the value) with *ubatch set, 0 if argv[*i] is not --ubatch, -1 after
 * printing "dsflash CMD: ..." on stderr. */
int gen_cli_ubatch_option(const char *cmd, int argc, char **argv, int *i, int *ubatch);
extern const char *const GEN_CLI_UBATCH_HELP;
/* Checks a reasoning effort: 1..100 or low|medium|high|max|minimal|xhigh. 0 ok / -1 + err. */
int gen_cli_check_effort(const char *s, char *err);
/* The option lines shared by both --help texts. */
extern const char *const GEN_CLI_OPTIONS_HELP;

typedef struct {
    dsf_engine *e;
    dsf_tokenizer *tok;
    dsf_session *s;
    dsf_gen *g;
    spec_seq *sq;             /* --draft: the speculative state attached to g (else NULL) */
    dsf_vision *vis;          /* --mmproj (else NULL) */
    dsf_image *images;        /* [n_images] the --image files, encoded once (frontend_media.c) */
    int n_images;
    int32_t image_tok;        /* <｜deepseek_image｜> */
} gen_cli_model;

/* Opens the model, its tokenizer, a session and a generator (and with --mmproj the projector
 * and the --image files, encoded); prints the error itself. */
int gen_cli_load(const gen_cli_opts *o, gen_cli_model *m);
void gen_cli_unload(gen_cli_model *m);

/* ---- images (frontend_media.c) ---- */

/* The option lines of --mmproj, --image and --image-max-tokens. */
extern const char *const GEN_CLI_IMAGE_HELP;
/* gen_cli_load's part: opens o->mmproj and encodes o->images into m. 0, or -1 with err. */
int gen_cli_load_images(const gen_cli_opts *o, gen_cli_model *m, char *err);
void gen_cli_unload_images(gen_cli_model *m);
/* A user message {"role": "user", "content": text}; with images and first set, the content is
 * the images' image_url blocks followed by the text block. NULL when text is not UTF-8. */
json_t *gen_cli_user_message(const gen_cli_model *m, const char *text, size_t len, bool first);
/* dsf_gen_run of the rendered prompt, its image placeholders expanded with m's images
 * (dsf_gen_prefill_media + dsf_gen_decode) when it has any. Same contract as dsf_gen_run. */
int gen_cli_generate(gen_cli_model *m, const int32_t *ids, int n, const dsf_gen_params *p,
                     dsf_gen_progress_cb progress, dsf_gen_result *out, char *err);

/* Renders an OpenAI-style message list (JSON array text) with the V4.1 encoder under the
 * options' thinking switch and effort, and tokenizes it (the BOS is in the text).
 * *ids is malloc'ed. 0 / -1 + err. */
int gen_cli_prompt(const gen_cli_opts *o, const dsf_tokenizer *tok, const char *messages_json,
                   int32_t **ids, int *n, bool *gen_reasoning, char *err);

/* Streams reasoning apart from the answer: on a terminal the reasoning is dim; otherwise it
 * is prefixed "[thinking] " and followed by a blank line before the answer. */
typedef struct {
    FILE *out;
    bool tty;
    int state;        /* 0 nothing yet, 1 in reasoning, 2 in content */
    char last;        /* last byte written ('\n' when nothing yet) */
    dsf_buf reasoning, content; /* collected, for the chat history */
} gen_cli_printer;

void gen_cli_printer_init(gen_cli_printer *pr, FILE *out);
void gen_cli_printer_free(gen_cli_printer *pr);
void gen_cli_on_dsml(void *ud, const dsf_dsml_event *ev);  /* ud = gen_cli_printer */
void gen_cli_on_text(void *ud, const char *s, size_t n);   /* raw text (no DSML) */
/* Ends the stream: resets the colour, prints the tool calls as JSON lines
 * ({"name", ["namespace",] "arguments"}) and a final newline when needed. */
void gen_cli_printer_end(gen_cli_printer *pr, const dsf_dsml_result *r);
/* One stats line on stderr: tokens, cache reuse, tok/s, finish reason. */
void gen_cli_print_stats(const char *cmd, const dsf_gen_result *r);
/* With --draft: one line on stderr with the acceptance since the last call (then resets it). */
void gen_cli_print_spec(const char *cmd, gen_cli_model *m);
/* The --draft option lines (run, chat; serve and bench print them too). */
extern const char *const GEN_CLI_DRAFT_HELP;
/* Parses --draft / --draft-max / --draft-min-p at argv[*i]: 1 (consumed), 0 (not one), -1
 * (printed "dsflash CMD: ..."). */
int gen_cli_draft_option(spec_opts *o, const char *cmd, int argc, char **argv, int *i);

/* `dsflash bench -m MODEL --draft D` (tools/bench_draft.c): the cost table, the draft's time
 * and the projected speed-ups. Returns the exit status. */
int bench_draft(const char *model, const spec_opts *so, const dsf_engine_params *ep);

#endif
