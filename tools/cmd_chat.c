/* cmd_chat.c: `dsflash chat`: an interactive multi-turn REPL on stdin (a terminal or a pipe).
 * Keeps the message history and re-renders the whole conversation with the V4.1 encoder each
 * turn; the generator's prefix reuse makes that cheap (only the new turn is evaluated).
 * Commands: /think, /nothink, /effort N, /reset, /quit (and EOF), /help. Ctrl-C interrupts a
 * generation; two Ctrl-C in a row at the prompt quit. Owns only the REPL and terminal I/O. */
#include "cmd.h"
#include "dsflash.h"
#include "frontend.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *CHAT_USAGE =
    "usage: dsflash chat -m MODEL.gguf [options]\n\n"
    "Interactive chat: type a message and press Enter. Each answer streams its reasoning first\n"
    "(dim on a terminal, else prefixed \"[thinking] \" and followed by a blank line), then the\n"
    "answer, then a stats line (tok/s) on stderr. Reads stdin, so it also works through a pipe.\n\n"
    "commands:\n"
    "  /think       thinking mode (reasoning, then the answer)\n"
    "  /nothink     chat mode (the answer only)\n"
    "  /effort E    reasoning effort: 1..100 or low|medium|high|max|minimal|xhigh\n"
    "  /reset       forget the conversation\n"
    "  /quit        leave (also: end of input, or Ctrl-C twice at the prompt)\n"
    "  Ctrl-C       interrupt the answer being generated\n\n"
    "options:\n";

/* Incremented by SIGINT; the cancel callback reads it during generation. */
static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig) {
    (void)sig;
    if (g_sigint < 8) g_sigint++;
}

static int chat_cancel(void *ud) {
    (void)ud;
    return g_sigint > 0;
}

typedef struct {
    bool tty;
    bool shown;
} progress_state;

/* A prefill indicator for long prompts, on a terminal only (stderr). */
static int chat_progress(void *ud, int done, int total) {
    progress_state *ps = ud;
    if (!ps->tty || total < 256) return 0;
    if (done < total) {
        fprintf(stderr, "\rprefill %d/%d tokens", done, total);
        ps->shown = true;
    } else if (ps->shown) {
        fprintf(stderr, "\r\033[K");
        ps->shown = false;
    }
    return g_sigint > 0;
}

typedef struct {
    gen_cli_printer *pr;
    progress_state *ps;
} chat_ud;

static void ud_on_dsml(void *ud, const dsf_dsml_event *ev) { gen_cli_on_dsml(((chat_ud *)ud)->pr, ev); }
static int ud_cancel(void *ud) { return chat_cancel(ud); }
static int ud_progress(void *ud, int done, int total) { return chat_progress(((chat_ud *)ud)->ps, done, total); }

/* Reads one line (without its newline) into a growing buffer. Returns 1 line, 0 EOF,
 * -1 interrupted by a signal (EINTR). */
static int read_line(dsf_buf *line) {
    line->len = 0;
    dsf_buf_reserve(line, 1);
    line->data[0] = 0;
    for (;;) {
        int c = getchar();
        if (c == EOF) {
            if (ferror(stdin) && errno == EINTR) {
                clearerr(stdin);
                return -1;
            }
            return line->len ? 1 : 0;
        }
        if (c == '\n') break;
        char ch = (char)c;
        dsf_buf_append(line, &ch, 1);
    }
    if (line->len && line->data[line->len - 1] == '\r') line->data[--line->len] = 0;
    return 1;
}

static json_t *base_history(const gen_cli_opts *o) {
    json_t *h = json_array();
    if (o->system) json_array_append_new(h, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
    return h;
}

static json_t *string_or_empty(const dsf_buf *b) {
    json_t *s = json_stringn(b->data ? (const char *)b->data : "", b->len);
    return s ? s : json_string("");
}

static int cmd_chat(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        printf("%s%s%s%s%s%s", CHAT_USAGE, GEN_CLI_OPTIONS_HELP, GEN_CLI_IMAGE_HELP, GEN_CLI_ENGRAM_HELP, GEN_CLI_UBATCH_HELP,
               GEN_CLI_DRAFT_HELP);
        return 0;
    }
    gen_cli_opts o;
    gen_cli_defaults(&o, "chat");
    for (int i = 1; i < argc; i++) {
        int r = gen_cli_option(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "dsflash chat: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (!o.model) {
        fprintf(stderr, "dsflash chat: no model (-m MODEL.gguf)\n");
        return 2;
    }
    if (!o.seed_set) o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    /* The engine's worker threads start inside gen_cli_load and inherit this mask: with
     * SIGINT blocked there, a Ctrl-C always lands on this thread and interrupts its read. */
    sigset_t blk, prev;
    sigemptyset(&blk);
    sigaddset(&blk, SIGINT);
    pthread_sigmask(SIG_BLOCK, &blk, &prev);
    gen_cli_model m;
    int lrc = gen_cli_load(&o, &m);
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    if (lrc) return 1;

    /* No SA_RESTART: a Ctrl-C at the prompt must interrupt the blocking read. */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);

    bool in_tty = isatty(STDIN_FILENO);
    progress_state ps = {.tty = isatty(STDERR_FILENO) != 0};
    json_t *hist = base_history(&o);
    dsf_buf line = {0};
    uint64_t turn = 0;
    if (in_tty) fprintf(stderr, "dsflash chat: /help for commands, /quit to leave\n");
    for (;;) {
        if (in_tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        int lr = read_line(&line);
        if (lr < 0) {
            if (g_sigint >= 2) break;
            fprintf(stderr, "\n(Ctrl-C again or /quit to leave)\n");
            continue;
        }
        g_sigint = 0;
        if (lr == 0) break;
        const char *s = (const char *)line.data;
        if (!*s) continue;
        if (s[0] == '/') {
            char err[DSF_ERR_LEN];
            if (!strcmp(s, "/quit") || !strcmp(s, "/exit")) break;
            if (!strcmp(s, "/think")) {
                o.think = true;
                fprintf(stderr, "[thinking mode]\n");
            } else if (!strcmp(s, "/nothink")) {
                o.think = false;
                fprintf(stderr, "[chat mode]\n");
            } else if (!strncmp(s, "/effort", 7) && (s[7] == ' ' || s[7] == 0)) {
                const char *v = s + 7;
                while (*v == ' ') v++;
                if (!*v) fprintf(stderr, "[effort: %s]\n", o.effort[0] ? o.effort : "default (high)");
                else if (gen_cli_check_effort(v, err)) fprintf(stderr, "dsflash chat: %s\n", err);
                else {
                    snprintf(o.effort, sizeof o.effort, "%s", v);
                    fprintf(stderr, "[effort %s]\n", o.effort);
                }
            } else if (!strcmp(s, "/reset")) {
                json_decref(hist);
                hist = base_history(&o);
                fprintf(stderr, "[conversation reset]\n");
            } else if (!strcmp(s, "/help")) {
                fputs(CHAT_USAGE, stderr);
            } else {
                fprintf(stderr, "dsflash chat: unknown command '%s' (/help lists them)\n", s);
            }
            continue;
        }

        bool first = true; /* the --image files go into the conversation's first user message */
        for (size_t k = 0; k < json_array_size(hist); k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(hist, k), "role")), "user")) first = false;
        json_t *user = gen_cli_user_message(&m, s, line.len, first);
        if (!user) {
            fprintf(stderr, "dsflash chat: the message is not valid UTF-8\n");
            continue;
        }
        json_array_append_new(hist, user);
        char *mj = json_dumps(hist, JSON_COMPACT);
        char err[DSF_ERR_LEN] = "";
        int32_t *ids = NULL;
        int n = 0;
        bool gen_reasoning = false;
        if (!mj || gen_cli_prompt(&o, m.tok, mj, &ids, &n, &gen_reasoning, err)) {
            fprintf(stderr, "dsflash chat: %s\n", mj ? err : "out of memory");
            free(mj);
            json_array_remove(hist, json_array_size(hist) - 1);
            continue;
        }
        free(mj);

        gen_cli_printer pr;
        gen_cli_printer_init(&pr, stdout);
        chat_ud cu = {.pr = &pr, .ps = &ps};
        dsf_gen_params gp;
        dsf_gen_params_default(&gp);
        gp.sampler = o.sp;
        gp.sampler.seed = o.sp.seed + turn++;
        gp.parse_dsml = true;
        gp.dsml_thinking = gen_reasoning;
        gp.on_dsml = ud_on_dsml;
        gp.cancel = ud_cancel;
        gp.ud = &cu;
        g_sigint = 0;
        dsf_gen_result res;
        int grc = gen_cli_generate(&m, ids, n, &gp, ud_progress, &res, err);
        free(ids);
        if (ps.shown) chat_progress(&ps, 1, 1);
        gen_cli_printer_end(&pr, res.has_dsml ? &res.dsml : NULL);
        if (res.finish == DSF_FINISH_CANCELLED) fprintf(stderr, "[interrupted]\n");
        if (grc) {
            fprintf(stderr, "dsflash chat: %s\n", err);
            json_array_remove(hist, json_array_size(hist) - 1);
        } else {
            gen_cli_print_stats("chat", &res);
            gen_cli_print_spec("chat", &m);
            /* The answer joins the history even when cut short, so the model sees what it said. */
            json_t *a = json_pack("{s:s,s:o,s:o}", "role", "assistant", "content", string_or_empty(&pr.content),
                                  "reasoning_content", string_or_empty(&pr.reasoning));
            json_array_append_new(hist, a);
        }
        dsf_gen_result_free(&res);
        gen_cli_printer_free(&pr);
        g_sigint = 0;
    }
    if (in_tty) fputc('\n', stdout);
    dsf_buf_free(&line);
    json_decref(hist);
    sigaction(SIGINT, &old, NULL);
    gen_cli_unload(&m);
    return 0;
}

DSF_COMMAND(chat, "interactive multi-turn chat on stdin (/think, /nothink, /effort, /reset, /quit)", cmd_chat)
