/* cmd_serve.c: `dsflash serve`, the OpenAI-compatible HTTP server (src/server/). Owns only
 * argument handling, signals and the process lifetime.
 * In an MPI job (mpirun ... --parallel) every rank runs this; the ranks other than 0 never
 * return from srv_start (they follow rank 0's engine inside dsf_engine_open). Rank 0 serves,
 * and ends the job at the first failure: a SIGTERM or SIGINT (mpirun's stop when a rank died,
 * SIGKILL following 1 s later) or a rank that stopped answering (srv_failure). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "frontend.h"
#include "server/server.h"

static void usage(void) {
    printf("usage: dsflash serve -m MODEL.gguf [options]\n\n"
           "OpenAI-compatible HTTP server and a chat page for the browser (GET /, http://127.0.0.1:8080/):\n"
           "POST /v1/chat/completions, POST /v1/completions,\n"
           "POST /v1/responses, GET|DELETE /v1/responses/ID, GET /v1/models, GET /health, GET /metrics (Prometheus),\n"
           "POST /tokenize, POST /detokenize.\n\n"
           "  -m, --model FILE     deepseek41 GGUF (required)\n"
           "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
           "  --port N             port (default 8080; 0 = any free port)\n"
           "  --slots N            concurrent sequences, one session each (default 1)\n"
           "  --ctx N              tokens per slot (default: min(training context, 4096))\n"
           "  --api-key KEY        require 'Authorization: Bearer KEY' (not on /health and /metrics)\n"
           "  --no-webui           do not serve the chat page on GET / (404)\n"
           "  --threads T          engine worker threads (default: all cores)\n"
           "  --no-repack          keep the routed experts in the file instead of repacking them in memory\n"
           "  --mmap               read the dense weights from the file mapping instead of copying them into memory\n"
           "  --alias NAME         model id in /v1/models and replies (default: file name)\n"
           "  --max-body BYTES     request body limit (default 8388608); larger -> 413\n"
           "  --max-queue N        requests waiting for a slot before 503 (default 256)\n"
           "  --keepalive-ms MS    SSE ': keep-alive' comment period while waiting (default 5000)\n"
           "  --prefill-chunk N    prompt tokens per prefill step; other slots run between steps (default: the\n"
           "                       engine's --ubatch, one forward per step; smaller: less wait for the other\n"
           "                       slots, slower prefill)\n"
           "  --timeout S          close a connection idle for S seconds (default 600)\n"
           "  --read-timeout S     close a connection whose request (headers and body) has not arrived S seconds\n"
           "                       after it opened or its previous answer ended (default 30; not while answering)\n"
           "  --max-conn N         open connections beyond which a request gets 503 + Retry-After (default 4096)\n"
           "  --max-conn-per-ip N  open connections per client address; more are refused (default 256; 0 = no limit)\n"
           "  --http-threads N     HTTP threads, each an epoll loop over its connections (default 4)\n"
           "  --shutdown-grace S   on SIGTERM, let running requests finish for up to S seconds (default 30)\n"
           "  --store-mb N         memory for stored responses (/v1/responses \"store\", previous_response_id),\n"
           "                       least recently used dropped first (default 64; 0 = store nothing)\n"
           "  --cache-dir DIR      disk prefix cache: session snapshots at the end of the system/tools preamble,\n"
           "                       every --cache-every tokens and one token before each prompt's end; a later\n"
           "                       request (also after a restart) restores the longest one when that is\n"
           "                       cheaper than prefilling it (measured rates)\n"
           "  --cache-max-gb N     the cache's size on disk, least recently used deleted first (default 16)\n"
           "  --cache-every N      also store every N tokens of a long prefill (default 4096; 0 = off)\n"
           "  --mmproj FILE        the vision projector (mmproj GGUF, deepseek41v): image_url content parts\n"
           "                       (OpenAI chat, Responses input_image) and image blocks (Messages) with\n"
           "                       base64 data: URLs; the default --max-body becomes 67108864\n"
           "  --image-max-tokens N the token cap of one image's block (default: the projector's, 1024)\n"
           "  --max-images N       images per request; more -> 400 (default 8)\n"
           "  --max-image-bytes B  bytes of one image, decoded; larger -> 413 (default 16777216)\n"
           "  --max-image-pixels P width x height of one image, from its header; larger -> 413 (default 50000000)\n"
           "  --numerics MODE      reference (default) or plain\n"
           "  --act-q8k            quantize the activations of K / IQ weights to Q8_K as ggml does (faster\n"
           "                       there; changes the results: opt-in)\n"
           "  --port-file FILE     write the bound port to FILE once listening\n"
           "  --parallel MODE      as an MPI job: mpirun -np N dsflash serve ... --parallel pipeline|experts|\n"
           "                       pipeline,experts spreads the model over the ranks; rank 0 serves HTTP\n"
           "%s%s%s"
           "\nDecoding slots share one batched forward per token (weights read once for all).\n"
           "One log line per request goes to stderr (DSF_LOG=0 silences it; DSF_LOG=2 adds one line\n"
           "per decode forward with its batch size).\n"
           "SIGTERM or SIGINT: stop accepting, answer new requests 503, let running ones finish (--shutdown-grace),\n"
           "flush, exit 0. A second SIGINT exits at once. In an MPI job, SIGTERM or SIGINT (mpirun's stop, e.g.\n"
           "when a rank died) or a rank silent for --mpi-liveness: every request, running or new, gets 503 naming\n"
           "the failure (/health too), then exit 1 at once.\n",
           GEN_CLI_ENGRAM_HELP, GEN_CLI_UBATCH_HELP, GEN_CLI_DRAFT_HELP);
}

static int parse_int(const char *name, const char *v, long long lo, long long hi, long long *out) {
    char *end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "dsflash serve: %s needs an integer within %lld..%lld, got '%s'\n", name, lo, hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* The graceful stop runs on its own thread so that the main thread can still take a second SIGINT. */
typedef struct {
    srv_server *s;
    pthread_t th;
    atomic_bool done;
} stopper;

static void *stop_main(void *arg) {
    stopper *st = arg;
    srv_drain(st->s);
    srv_stop(st->s);
    atomic_store(&st->done, true);
    return NULL;
}

/* ==== an MPI job ============================================================================
 * mpirun sends SIGTERM to every survivor when a rank dies and SIGKILL 1 s later, or as soon as
 * one of them exits (Open MPI 4.1 moves on to the next signal when a process ends). On rank 0
 * the handler ends the waits on the other ranks at once (dsf_dist_signal_stop), so that the
 * scheduler's engine call returns and answers its requests 503, and wakes the main thread
 * through a pipe; any thread may run it (a signal mask cannot cover MPI's own threads). The
 * other ranks ignore both signals: were they to exit at once, the SIGKILL would cut rank 0's
 * answers short; they end with rank 0 (its QUIT, or the launcher's SIGKILL once it has
 * exited) or when a wait of theirs fails. */

static int g_sig_pipe[2] = {-1, -1};

static void on_job_signal(int sig) {
    dsf_dist_signal_stop();
    int keep = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_sig_pipe[1], &b, 1) < 0) { /* full: a wake-up is pending already */
    }
    errno = keep;
}

/* Before srv_start (the engine's followers wait inside it): SIGTERM and SIGINT go to
 * on_job_signal on rank 0 and are ignored elsewhere. 0, or -1 with a message. */
static int mpi_signals(void) {
    if (dsf_dist_rank() > 0) {
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        return 0;
    }
    if (pipe(g_sig_pipe) < 0) {
        fprintf(stderr, "dsflash serve: cannot create a pipe (%s)\n", strerror(errno));
        return -1;
    }
    for (int k = 0; k < 2; k++) fcntl(g_sig_pipe[k], F_SETFL, fcntl(g_sig_pipe[k], F_GETFL) | O_NONBLOCK);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_job_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return 0;
}

/* Rank 0 serving: waits for a signal or a failure found by a wait, answers what runs 503 and
 * stops. Returns the exit status, 1: the job is over either way. */
static int mpi_serve_until_failure(srv_server *s) {
    const char *fail;
    while (!(fail = srv_failure(s))) {
        struct pollfd p = {.fd = g_sig_pipe[0], .events = POLLIN};
        poll(&p, 1, 50); /* a failure found by the scheduler's wait sends no signal: look again */
    }
    fprintf(stderr, "dsflash serve: the MPI job failed: %s: answering every request 503 and exiting\n", fail);
    srv_abort(s, 0.5); /* mpirun's SIGKILL follows its SIGTERM 1 s later */
    fprintf(stderr, "dsflash serve: stopped\n");
    return 1;
}

/* Each connection holds a descriptor: take the hard limit (say so: a low one caps --max-conn). */
static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl)) return;
    }
    if (was != rl.rlim_cur)
        fprintf(stderr, "dsflash serve: RLIMIT_NOFILE raised from %llu to its hard limit %llu\n",
                (unsigned long long)was, (unsigned long long)rl.rlim_cur);
    else
        fprintf(stderr, "dsflash serve: RLIMIT_NOFILE %llu (its hard limit)\n", (unsigned long long)rl.rlim_cur);
}

static int cmd_serve(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        usage();
        return 0;
    }
    srv_params p;
    srv_params_default(&p);
    const char *port_file = NULL;
    bool body_set = false;
    for (int i = 1; i < argc; i++) {
        int dr = gen_cli_draft_option(&p.spec, "serve", argc, argv, &i);
        if (!dr) dr = gen_cli_engram_option("serve", argc, argv, &i, &p.engram_readers, &p.engram_cache_mb);
        if (!dr) dr = gen_cli_ubatch_option("serve", argc, argv, &i, &p.ubatch);
        if (dr < 0) return 2;
        if (dr) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x = 0;
        int takes = 1;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) p.model_path = v;
        else if (!strcmp(a, "--host")) p.host = v;
        else if (!strcmp(a, "--api-key")) p.api_key = v;
        else if (!strcmp(a, "--alias")) p.model_name = v;
        else if (!strcmp(a, "--port-file")) port_file = v;
        else if (!strcmp(a, "--cache-dir")) p.cache_dir = v;
        else if (!strcmp(a, "--mmproj")) p.mmproj_path = v;
        else if (!strcmp(a, "--cache-max-gb")) {
            char *end = NULL;
            p.cache_max_gb = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(p.cache_max_gb > 0) || p.cache_max_gb > 1e6) {
                fprintf(stderr, "dsflash serve: --cache-max-gb needs a number of GB within (0, 1e6], got '%s'\n", v ? v : "");
                return 2;
            }
        }
        else if (!strcmp(a, "--no-repack")) {
            p.repack = -1;
            takes = 0;
        } else if (!strcmp(a, "--no-webui")) {
            p.no_webui = true;
            takes = 0;
        } else if (!strcmp(a, "--mmap")) {
            p.resident = -1;
            takes = 0;
        } else if (!strcmp(a, "--act-q8k")) {
            p.act_q8k = true;
            takes = 0;
        }
        else if (!strcmp(a, "--numerics")) {
            if (v && !strcmp(v, "plain")) p.numerics = DSF_NUMERICS_PLAIN;
            else if (v && !strcmp(v, "reference")) p.numerics = DSF_NUMERICS_REFERENCE;
            else {
                fprintf(stderr, "dsflash serve: --numerics must be reference or plain\n");
                return 2;
            }
        } else if (!strcmp(a, "--port")) {
            if (parse_int(a, v, 0, 65535, &x)) return 2;
            p.port = (int)x;
        } else if (!strcmp(a, "--slots")) {
            if (parse_int(a, v, 1, 256, &x)) return 2;
            p.n_slots = (int)x;
        } else if (!strcmp(a, "--ctx")) {
            if (parse_int(a, v, 2, INT_MAX, &x)) return 2;
            p.n_ctx = (int)x;
        } else if (!strcmp(a, "--threads")) {
            if (parse_int(a, v, 0, 4096, &x)) return 2;
            p.n_threads = (int)x;
        } else if (!strcmp(a, "--max-body")) {
            if (parse_int(a, v, 1, 1LL << 34, &x)) return 2;
            p.max_body = (size_t)x;
            body_set = true;
        } else if (!strcmp(a, "--image-max-tokens")) {
            if (parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.image_max_tokens = (int)x;
        } else if (!strcmp(a, "--max-image-bytes")) {
            if (parse_int(a, v, 1, 1LL << 34, &x)) return 2;
            p.max_image_bytes = (size_t)x;
        } else if (!strcmp(a, "--max-image-pixels")) {
            if (parse_int(a, v, 1, 1LL << 40, &x)) return 2;
            p.max_image_pixels = (long)x;
        } else if (!strcmp(a, "--max-images")) {
            if (parse_int(a, v, 0, 4096, &x)) return 2;
            p.max_images = (int)x;
        } else if (!strcmp(a, "--max-queue")) {
            if (parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.max_queue = (int)x;
        } else if (!strcmp(a, "--keepalive-ms")) {
            if (parse_int(a, v, 1, 3600000, &x)) return 2;
            p.keepalive_ms = (int)x;
        } else if (!strcmp(a, "--timeout")) {
            if (parse_int(a, v, 1, 86400, &x)) return 2;
            p.idle_timeout_s = (int)x;
        } else if (!strcmp(a, "--read-timeout")) {
            if (parse_int(a, v, 1, 86400, &x)) return 2;
            p.read_timeout_s = (int)x;
        } else if (!strcmp(a, "--max-conn")) {
            if (parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.max_conn = (int)x;
        } else if (!strcmp(a, "--max-conn-per-ip")) {
            if (parse_int(a, v, 0, 1 << 20, &x)) return 2;
            p.max_conn_per_ip = (int)x;
        } else if (!strcmp(a, "--http-threads")) {
            if (parse_int(a, v, 1, 256, &x)) return 2;
            p.http_threads = (int)x;
        } else if (!strcmp(a, "--shutdown-grace")) {
            if (parse_int(a, v, 0, 86400, &x)) return 2;
            p.shutdown_grace_s = (int)x;
        } else if (!strcmp(a, "--store-mb")) {
            if (parse_int(a, v, 0, 1 << 20, &x)) return 2;
            p.store_mb = (int)x;
        } else if (!strcmp(a, "--cache-every")) {
            if (parse_int(a, v, 0, INT_MAX, &x)) return 2;
            p.cache_every = (int)x;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.prefill_chunk = (int)x;
        } else {
            fprintf(stderr, "dsflash serve: unknown option '%s' (try --help)\n", a);
            return 2;
        }
        if (takes && !v) {
            fprintf(stderr, "dsflash serve: %s needs a value\n", a);
            return 2;
        }
        i += takes;
    }
    if (!p.model_path) {
        fprintf(stderr, "dsflash serve: no model (-m MODEL.gguf; try --help)\n");
        return 2;
    }
    /* base64 images take 4/3 of their bytes: with a projector the default body limit grows */
    if (p.mmproj_path && !body_set) p.max_body = 64u << 20;

    /* Every thread inherits this mask; the main thread waits for the signals synchronously.
     * An MPI job takes them with a handler instead (mpi_signals). */
    const bool mpi = dsf_dist_size() > 1;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (mpi && mpi_signals() < 0) return 1;
    if (!mpi) pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (dsf_dist_rank() == 0) raise_nofile();
    char err[DSF_ERR_LEN] = "";
    srv_server *s = srv_start(&p, err);
    if (!s) {
        fprintf(stderr, "dsflash serve: %s\n", err);
        return 1;
    }
    fprintf(stderr, "dsflash serve: listening on http://%s:%d (%d slot%s)\n", p.host, srv_port(s), p.n_slots,
            p.n_slots == 1 ? "" : "s");
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%d\n", srv_port(s)) < 0 || fclose(f)) {
            fprintf(stderr, "dsflash serve: cannot write %s\n", port_file);
            srv_stop(s);
            return 1;
        }
    }
    if (mpi) return mpi_serve_until_failure(s);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "dsflash serve: %s: draining (up to %d s; SIGINT again exits at once)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", p.shutdown_grace_s);
    stopper st = {.s = s};
    if (pthread_create(&st.th, NULL, stop_main, &st)) {
        srv_stop(s); /* no thread: stop without draining */
        return 0;
    }
    while (!atomic_load(&st.done)) {
        struct timespec ts = {0, 100 * 1000000L};
        if (sigtimedwait(&set, NULL, &ts) == SIGINT) {
            fprintf(stderr, "dsflash serve: SIGINT again: exiting now\n");
            _exit(130);
        }
    }
    pthread_join(st.th, NULL);
    fprintf(stderr, "dsflash serve: stopped\n");
    return 0;
}

DSF_COMMAND(serve, "OpenAI-compatible HTTP server (chat, completions, streaming, tools)", cmd_serve)
