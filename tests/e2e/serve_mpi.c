/* serve_mpi.c: `dsflash serve` as an MPI job on tiny41 (mpirun -np N ... --parallel MODE: rank 0
 * serves HTTP, the other ranks follow its engine), over raw sockets (tests/lib/http.h).
 *
 * Expected values: the single-process server's replies to the same requests, in the same
 * order (the same binary without mpirun; that server is itself checked against the goldens and
 * the OpenAI shapes by tests/e2e/server.c and serve_cache.c): every reply's text, tokens and
 * log-probabilities (greedy, top_logprobs), and the cached-token count of each request sent
 * alone. The fault cases expect what docs/ARCHITECTURE.md promises: 503 with the failure's
 * message in the API's error JSON (code mpi_job_failed; a stream: an error event, then
 * [DONE]), a non-zero exit of mpirun, no process left.
 * Timing: only "no hang" bounds, written beside their checks.
 * Every case kills what it started (mpirun and any process with its port file in its command
 * line) whether its checks pass or not. */
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "helpers.h"
#include "http.h"
#include "mpi.h"
#include "serve.h"
#include "test.h"

#define TINY "testdata/tiny41/tiny41.gguf"

/* ==== processes ============================================================================ */

/* The processes whose command line holds tag (the server's port file: mpirun's ranks); with
 * kill_them, each gets SIGKILL. Returns how many there were. */
static int tagged(const char *tag, bool kill_them) {
    DIR *d = opendir("/proc");
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        int pid = atoi(de->d_name);
        if (pid <= 0 || pid == getpid()) continue;
        char p[64], buf[4096];
        snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[len] = 0;
        if (!strstr(buf, tag)) continue;
        n++;
        if (kill_them) kill(pid, SIGKILL);
    }
    if (d) closedir(d);
    return n;
}

/* Ends the job whatever state it is in: mpirun, then every rank it may have left behind. */
static void reap(test_server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
    if (s->port_file[0]) tagged(s->port_file, true);
}

/* Waits up to wait_s seconds for the server (mpirun) to exit by itself: its status (128 + N
 * after signal N), or -1 if it had to be killed. */
static int wait_exit(test_server *s, int wait_s) { return test_server_signal(s, 0, wait_s); }

/* ==== requests ============================================================================= */

typedef struct {
    const char *body;
    int port;
    int status;
    char *out;            /* the reply's text, tokens and log-probabilities, as a comparable string */
    long long prompt, cached;
    bool stream_error;    /* a stream that ended with an error event */
    char error[512];      /* the message of the error JSON or event ("" none) */
    char code[64];        /* its code */
    int n_content;        /* stream: content chunks before the end */
} call;

static const char *jstr(const json_t *o, const char *path) {
    const json_t *v = json_at(o, path);
    return json_is_string(v) ? json_string_value(v) : "";
}

static long long jint(const json_t *o, const char *path) {
    const json_t *v = json_at(o, path);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* A stream's chunks -> content | reasoning | logprobs | finish, as the non-streaming shape. */
static void read_stream(call *c, const response *r) {
    sse ev;
    sse_decode((const char *)r->body.data, r->body.len, &ev);
    dsf_buf content = {0}, reasoning = {0};
    json_t *lp = json_array();
    const char *finish = "";
    for (size_t i = 0; i < json_array_size(ev.events); i++) {
        const json_t *e = json_array_get(ev.events, i);
        if (json_object_get(e, "error")) {
            c->stream_error = true;
            snprintf(c->error, sizeof c->error, "%s", jstr(e, "error.message"));
            snprintf(c->code, sizeof c->code, "%s", jstr(e, "error.code"));
            continue;
        }
        const char *t = jstr(e, "choices.0.delta.content"), *rs = jstr(e, "choices.0.delta.reasoning_content");
        c->n_content += t[0] || rs[0];
        dsf_buf_append(&content, t, strlen(t));
        dsf_buf_append(&reasoning, rs, strlen(rs));
        json_array_extend(lp, (json_t *)json_at(e, "choices.0.logprobs.content"));
        if (jstr(e, "choices.0.finish_reason")[0]) finish = jstr(e, "choices.0.finish_reason");
        if (json_at(e, "usage.prompt_tokens")) {
            c->prompt = jint(e, "usage.prompt_tokens");
            c->cached = jint(e, "usage.prompt_tokens_details.cached_tokens");
        }
    }
    char *lps = json_dumps(lp, JSON_COMPACT);
    dsf_buf o = {0};
    dsf_buf_appendf(&o, "%.*s|%.*s|%s|%s|%s", (int)content.len, content.data ? (char *)content.data : "",
                    (int)reasoning.len, reasoning.data ? (char *)reasoning.data : "", lps, finish, ev.done ? "DONE" : "");
    c->out = (char *)o.data;
    free(lps);
    json_decref(lp);
    dsf_buf_free(&content);
    dsf_buf_free(&reasoning);
    sse_free(&ev);
}

/* POSTs c->body to /v1/chat/completions; fills the rest of c. 0, or -1 with no response. */
static int ask(call *c) {
    free(c->out);
    c->out = NULL;
    c->error[0] = c->code[0] = 0;
    c->stream_error = false;
    c->n_content = 0;
    c->prompt = c->cached = -1;
    response r;
    if (http(c->port, "POST", "/v1/chat/completions", c->body, NULL, &r)) return c->status = -1;
    c->status = r.status;
    if (r.status == 200 && strstr(r.ctype, "text/event-stream")) {
        read_stream(c, &r);
    } else {
        json_t *v = body_json(&r);
        snprintf(c->error, sizeof c->error, "%s", jstr(v, "error.message"));
        snprintf(c->code, sizeof c->code, "%s", jstr(v, "error.code"));
        char *lps = json_dumps(json_at(v, "choices.0.logprobs.content"), JSON_COMPACT | JSON_ENCODE_ANY);
        dsf_buf o = {0};
        dsf_buf_appendf(&o, "%s|%s|%s|%s", jstr(v, "choices.0.message.content"),
                        jstr(v, "choices.0.message.reasoning_content"), lps ? lps : "null",
                        jstr(v, "choices.0.finish_reason"));
        c->out = (char *)o.data;
        c->prompt = jint(v, "usage.prompt_tokens");
        c->cached = jint(v, "usage.prompt_tokens_details.cached_tokens");
        free(lps);
        json_decref(v);
    }
    response_free(&r);
    return 0;
}

static void *ask_main(void *arg) {
    ask(arg);
    return NULL;
}

/* Sends the calls at once, each on its own thread. */
static void ask_all(call *cs, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, ask_main, &cs[i])) ask(&cs[i]), th[i] = 0;
    for (int i = 0; i < n; i++)
        if (th[i]) pthread_join(th[i], NULL);
}

/* ==== exactness ============================================================================ */

/* Greedy chats with top log-probabilities, sent at once (the scheduler batches them); they
 * share a system prompt (the disk cache's preamble boundary). */
#define SYS "{\"role\":\"system\",\"content\":\"You are a terse assistant. Answer in one short line.\"},"
#define GEN ",\"temperature\":0,\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":3"
static const char *const R[3] = {
    "{\"messages\":[" SYS "{\"role\":\"user\",\"content\":\"Tell me about the sea.\"}],\"max_tokens\":24" GEN "}",
    "{\"messages\":[" SYS "{\"role\":\"user\",\"content\":\"Why is the sky blue, in three short sentences?\"}],"
    "\"max_tokens\":24,\"stream\":true,\"stream_options\":{\"include_usage\":true}" GEN "}",
    "{\"messages\":[" SYS "{\"role\":\"user\",\"content\":\"Count from one to ten.\"}],\"max_tokens\":24,"
    "\"chat_template_kwargs\":{\"thinking\":true}" GEN "}",
};

/* The replies of one configuration, in order: R0-R2 at once, R1 again (its prefix from the
 * slot that holds it: a rollback), then on a second server over the same --cache-dir R0 again
 * (its prefix restored from the disk: dsf_session_restore; no slot holds anything yet). */
enum { N_CALLS = 5 };
typedef struct {
    call c[N_CALLS];
    long long max_batch;
} session_out;

static void session_free(session_out *o) {
    for (int i = 0; i < N_CALLS; i++) free(o->c[i].out);
    memset(o, 0, sizeof *o);
}

static long long health_max_batch(int port) {
    response r;
    if (http(port, "GET", "/health", NULL, NULL, &r)) return -1;
    json_t *v = body_json(&r);
    long long mb = jint(v, "decode.max_batch");
    json_decref(v);
    response_free(&r);
    return mb;
}

/* Starts one server of a configuration: prefix "" or mpirun's (with -x for the environment). */
static void start_server(test_ctx *t, const char *what, const char *prefix, const char *opts, test_server *s) {
    char why[256];
    memset(s, 0, sizeof *s);
    CHECKF(test_server_start_with(s, prefix, test_shared(TINY), opts, why, sizeof why) == 0, "%s: %s", what, why);
}

/* Stops a server: one process exits 0 after SIGTERM; an MPI job ends non-zero (mpirun's SIGTERM
 * reaches every rank: docs/ARCHITECTURE.md) and leaves no process. */
static void stop_server(test_ctx *t, const char *what, bool mpi, test_server *s) {
    int rc = test_server_signal(s, SIGTERM, 30); /* no hang: it takes well under a second */
    if (!mpi) {
        CHECKF(rc == 0, "%s: exit status %d after SIGTERM", what, rc);
        return;
    }
    CHECKF(rc > 0, "%s: mpirun after SIGTERM: status %d (want non-zero; -1: killed after 30 s)", what, rc);
    CHECKF(tagged(s->port_file, false) == 0, "%s: processes left after mpirun ended", what);
}

static bool log_has(const test_server *s, const char *what) {
    uint8_t *log = NULL;
    size_t n = 0;
    if (dsf_read_file(s->log, &log, &n, NULL)) return false;
    bool ok = strstr((char *)log, what) != NULL;
    free(log);
    return ok;
}

/* Runs a configuration's two servers (prefix: the environment, and mpirun's when mpi). Under
 * MPI the concurrent round is retried (at most 3 times) until a decode forward carried two
 * sequences or more. s: the server running now (the caller reaps it whatever happens). */
static void run_config(test_ctx *t, const char *what, const char *prefix, const char *opts, bool mpi, session_out *o,
                       test_server *s) {
    const bool need_batch = mpi;
    memset(o, 0, sizeof *o);
    for (int k = 0; k < 3; k++) o->c[k].body = R[k];
    o->c[3].body = R[1];
    o->c[4].body = R[0];
    start_server(t, what, prefix, opts, s);
    if (t->failed) return;
    for (int i = 0; i < N_CALLS; i++) o->c[i].port = s->port;
    for (int attempt = 0; attempt < 3; attempt++) {
        ask_all(o->c, 3);
        o->max_batch = health_max_batch(s->port);
        if (!need_batch || o->max_batch >= 2) break;
    }
    ask(&o->c[3]);
    stop_server(t, what, mpi, s);
    if (t->failed) return;
    start_server(t, what, prefix, opts, s);
    if (t->failed) return;
    o->c[4].port = s->port;
    ask(&o->c[4]);
    stop_server(t, what, mpi, s);
    for (int i = 0; i < N_CALLS; i++)
        CHECKF(o->c[i].status == 200 && o->c[i].out && o->c[i].prompt > 0 && !o->c[i].stream_error,
               "%s: request %d: status %d, prompt %lld, error '%s'", what, i, o->c[i].status, o->c[i].prompt, o->c[i].error);
    CHECKF(!need_batch || o->max_batch >= 2, "%s: no decode forward carried two sequences in 3 rounds of 3 requests", what);
    CHECKF(o->c[3].cached == o->c[3].prompt - 1, "%s: R1 again: cached %lld of %lld", what, o->c[3].cached, o->c[3].prompt);
    CHECKF(!strcmp(o->c[3].out, o->c[1].out), "%s: R1 reusing its slot's prefix differs", what);
    CHECKF(o->c[4].cached == o->c[4].prompt - 1, "%s: R0 on the second server: cached %lld of %lld", what, o->c[4].cached,
           o->c[4].prompt);
    CHECKF(log_has(s, "prefix cache: restored"), "%s: no restore from the disk cache in %s", what, s->log);
    CHECKF(!strcmp(o->c[4].out, o->c[0].out), "%s: R0 restored from the disk cache differs:\n  %.300s\n  %.300s", what,
           o->c[0].out, o->c[4].out);
}

/* Guards serve over MPI (issue 39): three concurrent greedy requests (batched: /health's
 * max_batch >= 2), a prefix reused from a slot's memory (rollback, mirrored on the followers)
 * and one restored from the disk cache (dsf_session_save / restore: per-stage parts under
 * pipeline) give exactly the single-process server's tokens, log-probabilities and cached
 * counts under -np 2 pipeline, -np 3 pipeline,experts and -np 2 experts. */
TEST(serve_mpi_exact) {
    NEED_SHARED(model, TINY);
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    static const struct {
        int np;
        const char *parallel;
    } cases[] = {{1, NULL}, {2, "pipeline"}, {3, "pipeline,experts"}, {2, "experts"}};
    session_out ref;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !t->failed; k++) {
        char what[96], opts[1024], prefix[512] = "env DSF_PCACHE_RESTORE=always"; /* restores are chosen, not measured */
        char dir[32];
        snprintf(dir, sizeof dir, "cache-%zu", k);
        snprintf(opts, sizeof opts, "--slots 3 --ctx 512 --cache-every 16 --cache-dir %s", test_tmpfile(dir));
        if (cases[k].parallel) {
            snprintf(what, sizeof what, "-np %d --parallel %s", cases[k].np, cases[k].parallel);
            snprintf(opts + strlen(opts), sizeof opts - strlen(opts), " --parallel %s", cases[k].parallel);
            snprintf(prefix + strlen(prefix), sizeof prefix - strlen(prefix), " %s -x DSF_PCACHE_RESTORE", test_mpirun(cases[k].np));
        } else {
            snprintf(what, sizeof what, "one process");
        }
        test_server s;
        session_out o;
        memset(&s, 0, sizeof s);
        run_config(t, what, prefix, opts, cases[k].parallel != NULL, k ? &o : &ref, &s);
        reap(&s);
        for (int i = 0; k && !t->failed && i < N_CALLS; i++) {
            /* the concurrent round's cached counts depend on timing (an entry another request
             * stored a moment earlier may be restored); the later requests' do not */
            CHECKF(o.c[i].prompt == ref.c[i].prompt && (i < 3 || o.c[i].cached == ref.c[i].cached),
                   "%s: request %d: prompt %lld cached %lld, one process: %lld %lld", what, i, o.c[i].prompt,
                   o.c[i].cached, ref.c[i].prompt, ref.c[i].cached);
            CHECKF(!strcmp(o.c[i].out, ref.c[i].out), "%s: request %d differs from one process:\n  mpi: %.400s\n  one: %.400s",
                   what, i, o.c[i].out, ref.c[i].out);
        }
        if (k) session_free(&o);
    }
    session_free(&ref);
}

/* ==== faults =============================================================================== */

/* Long greedy generations, one streamed and one not: both are running when the fault strikes. */
#define LONG_GEN ",\"max_tokens\":3000,\"temperature\":0,\"ignore_eos\":true"
static const char *const LONG[2] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a very long story.\"}],\"stream\":true" LONG_GEN "}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a very long poem.\"}]" LONG_GEN "}",
};

/* A fault in rank 1 of an MPI server (DSF_DIST_FAULT=1:N:SIG at its N-th forward, while both
 * long requests run): each gets its 503 naming the failure (want in the message), mpirun ends
 * non-zero within a "no hang" bound, and no process is left. */
static void fault_case(test_ctx *t, int np, const char *parallel, const char *fault, const char *extra, const char *want,
                       const char *want2, test_server *s) {
    char what[128], opts[512], prefix[512], msg[256];
    snprintf(what, sizeof what, "-np %d --parallel %s, DSF_DIST_FAULT=%s", np, parallel, fault);
    snprintf(opts, sizeof opts, "--slots 2 --ctx 4096 --parallel %s %s", parallel, extra);
    snprintf(prefix, sizeof prefix, "env DSF_DIST_FAULT=%s %s -x DSF_DIST_FAULT", fault, test_mpirun(np));
    CHECKF(test_server_start_with(s, prefix, test_shared(TINY), opts, msg, sizeof msg) == 0, "%s: %s", what, msg);
    double t0 = dsf_now();
    call c[2];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 2; i++) c[i].port = s->port, c[i].body = LONG[i];
    ask_all(c, 2);
    /* right after: /health and a new request see the failure, or the server has exited */
    response h;
    int hs = http(s->port, "GET", "/health", NULL, NULL, &h) == 0 ? h.status : -1;
    bool h_names = hs == 503 && strstr((char *)h.body.data, "\"failed\"") && strstr((char *)h.body.data, want);
    if (hs >= 0) response_free(&h);
    call late = {.port = s->port, .body = LONG[1]};
    ask(&late);
    int rc = wait_exit(s, 30); /* no hang: about 1 s after a kill, --mpi-liveness + 1 s after a stop */
    double dt = dsf_now() - t0;
    int left = tagged(s->port_file, false);
    fprintf(stderr, "    %s: mpirun exit %d after %.1f s; then /health %d%s, a new request %d\n", what, rc, dt, hs,
            h_names ? " naming the failure" : "", late.status);
    CHECKF(c[0].status == 200 && c[0].stream_error && strstr(c[0].error, want) && c[0].n_content > 0 &&
               strstr(c[0].out, "|DONE"),
           "%s: the stream: status %d, %d content chunks, error event '%s', then [DONE]: %d", what, c[0].status,
           c[0].n_content, c[0].error, c[0].out && strstr(c[0].out, "|DONE"));
    CHECKF(c[1].status == 503 && strstr(c[1].error, want), "%s: the non-streaming request: status %d, error '%s'", what,
           c[1].status, c[1].error);
    CHECKF(!want2 || (strstr(c[0].error, want2) && strstr(c[1].error, want2)), "%s: the errors do not say '%s'", what, want2);
    CHECKF(!strcmp(c[0].code, "mpi_job_failed") && !strcmp(c[1].code, "mpi_job_failed"), "%s: error codes '%s' '%s'", what,
           c[0].code, c[1].code);
    CHECKF(hs < 0 || h_names, "%s: /health after the failure: status %d", what, hs);
    CHECKF(late.status < 0 || (late.status == 503 && strstr(late.error, want)), "%s: a new request: status %d '%s'", what,
           late.status, late.error);
    CHECKF(rc > 0, "%s: mpirun's exit status %d (want non-zero; -1: still running after 30 s)", what, rc);
    CHECKF(left == 0, "%s: %d processes left after mpirun ended", what, left);
    /* rank 0 ended by itself (after a kill: before mpirun's SIGKILL, 1 s after its SIGTERM) */
    CHECKF(log_has(s, "dsflash serve: the MPI job failed: ") && log_has(s, "dsflash serve: stopped"),
           "%s: rank 0 did not stop by itself (log %s)", what, s->log);
    /* both requests were running when the fault struck: their log lines count generated tokens */
    uint8_t *log = NULL;
    size_t n = 0;
    CHECK(dsf_read_file(s->log, &log, &n, NULL) == 0);
    int running = 0;
    for (const char *p = (char *)log; (p = strstr(p, "serve: req ")); p++) {
        const char *gen = strstr(p, " gen "), *eol = strchr(p, '\n');
        if (gen && (!eol || gen < eol) && atoi(gen + 5) > 0 && strstr(p, "status 503 failed") &&
            (!eol || strstr(p, "status 503 failed") < eol))
            running++;
    }
    free(log);
    CHECKF(running == 2, "%s: %d of the 2 requests were generating when they failed (log %s)", what, running, s->log);
}

/* A fault case on its own server, reaped whatever its checks found. */
static void fault_test(test_ctx *t, int np, const char *parallel, const char *fault, const char *extra, const char *want,
                       const char *want2) {
    NEED_SHARED(model, TINY);
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    test_server s;
    memset(&s, 0, sizeof s);
    fault_case(t, np, parallel, fault, extra, want, want2, &s);
    reap(&s);
}

/* Guards a rank's death under serve (issue 39): rank 1 of -np 3 pipeline,experts is killed
 * mid-decode; mpirun SIGTERMs the survivors and rank 0 answers both running requests 503
 * with the launcher's message within mpirun's 1 s before SIGKILL, then exits non-zero. */
TEST(serve_mpi_kill) {
    fault_test(t, 3, "pipeline,experts", "1:400:9", "", "the MPI launcher is stopping the job", NULL);
}

/* Guards a hung rank under serve (issue 39): rank 1 of -np 2 pipeline stops (SIGSTOP)
 * mid-decode; rank 0's wait fails after --mpi-liveness 2, both running requests get 503
 * naming rank 1, and rank 0 exits non-zero, which ends the job. */
TEST(serve_mpi_hang) {
    fault_test(t, 2, "pipeline", "1:400:19", "--mpi-liveness 2", "rank 1 (host ", "has not answered for 2 s");
}
