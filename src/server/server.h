/* server.h: `dsflash serve`, the OpenAI-compatible HTTP server (server layer).
 *
 * Two halves:
 *   - server_api.c: pure request/response mapping, no sockets and no engine: an OpenAI
 *     request body -> a validated srv_req (prompt tokens, sampling, output options), and
 *     generated output -> OpenAI response JSON / SSE chunks. Unit-tested without a model.
 *   - server.c, server_job.c, server_sched.c, server_conn.c, metrics.c (internal header
 *     server_int.h): the HTTP glue (libmicrohttpd: epoll and a small thread pool; a connection
 *     waiting for a job is suspended, never a blocked thread), the slots (one dsf_session each) and the
 *     scheduler thread that runs every forward. Threads and locking: the top of server.c.
 *     Each endpoint's wire format is a srv_api table (server_int.h; server_oai.c for
 *     OpenAI's chat and completions), which they call without knowing the API.
 *
 * Invariants: a malformed request is answered from its own connection thread and never
 * reaches the scheduler; only the scheduler thread calls the engine (one forward at a time
 * across the whole server); a request is freed only when both its connection and the
 * scheduler have let go of it (reference count). */
#ifndef DSF_SERVER_H
#define DSF_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dsflash.h"
#include "base/util.h"
#include "runtime/spec.h"

/* ==== parameters and lifetime ============================================================ */

typedef struct {
    const char *model_path;
    const char *model_name; /* the id in /v1/models and in replies; NULL: the file's basename */
    const char *host;       /* default 127.0.0.1 */
    int port;               /* 0: any free port (server_port tells which) */
    int n_slots;            /* sessions (concurrent sequences); default 1 */
    int n_ctx;              /* tokens per slot; <= 0: min(model's training context, 4096) */
    const char *api_key;    /* NULL: no authentication */
    bool no_webui;          /* --no-webui: no chat page on GET / (webui.h) */
    int n_threads;          /* engine worker threads; <= 0: all cores */
    int repack;             /* dsf_engine_params.repack */
    int resident;           /* dsf_engine_params.resident */
    bool act_q8k;           /* dsf_engine_params.act_q8k */
    int engram_readers;     /* dsf_engine_params.engram_readers */
    int engram_cache_mb;    /* dsf_engine_params.engram_cache_mb */
    int ubatch;             /* dsf_engine_params.ubatch */
    size_t max_body;        /* request body limit in bytes; default 8 MiB */
    int max_queue;          /* requests waiting for a slot before 503; default 256 */
    int keepalive_ms;       /* SSE keep-alive comment period while nothing is sent; default 5000 */
    int prefill_chunk;      /* prompt tokens per prefill step (other slots run between); 0 (the
                             * default): the engine's dsf_engine_ubatch, one forward per step */
    int idle_timeout_s;     /* an idle connection is closed after this; default 600 */
    int read_timeout_s;     /* a request's headers and body must arrive within this; default 30 */
    int max_conn;           /* open connections beyond which a request gets 503; default 4096 */
    int max_conn_per_ip;    /* open connections per client address (more are refused); default 256; 0: no limit */
    int http_threads;       /* libmicrohttpd's thread pool; default 4 */
    int shutdown_grace_s;   /* srv_drain waits this long for running requests; default 30 */
    int store_mb;           /* stored responses (/v1/responses "store"), LRU by bytes; default 64; 0: none */
    dsf_numerics numerics;
    spec_opts spec;         /* --draft ...: speculative decoding per slot (spec.draft NULL: off) */
    const char *cache_dir;  /* --cache-dir: the disk prefix cache (NULL: off) */
    double cache_max_gb;    /* --cache-max-gb: its budget, LRU by bytes; default 16 */
    int cache_every;        /* --cache-every: also store every N tokens of a long prefill (0: off); default 4096 */
    /* images (server_image.h): the projector (NULL: a request with images gets 400) and limits */
    const char *mmproj_path;  /* --mmproj */
    int image_max_tokens;     /* --image-max-tokens: the token cap per image; 0: the projector's default */
    size_t max_image_bytes;   /* --max-image-bytes: per image, decoded; default 16 MiB */
    long max_image_pixels;    /* --max-image-pixels: per image, from its header; default 50,000,000 */
    int max_images;           /* --max-images: per request; default 8 */
} srv_params;

void srv_params_default(srv_params *p);

typedef struct srv_server srv_server;

/* Loads the model, opens the slots and starts listening. NULL with err on failure. */
srv_server *srv_start(const srv_params *p, char *err);
int srv_port(const srv_server *s);
/* Graceful shutdown, first half: stops accepting connections, answers new requests on open
 * ones with 503, lets queued and running requests finish for up to shutdown_grace_s seconds,
 * then flushes the prefix cache. srv_stop follows. */
void srv_drain(srv_server *s);
/* Stops listening, cancels every request, joins the threads and frees everything. */
void srv_stop(srv_server *s);

/* ==== an MPI job (dsflash.h "several processes"; rank 0 serves) ============================
 * The job fails when a rank dies (the launcher then stops the survivors: the caller's
 * SIGTERM handler calls dsf_dist_signal_stop) or stops answering (a wait on it fails after
 * --mpi-liveness). From then on every generation request, running or new, gets 503 with the
 * failure's message in its API's error shape (a stream: an error event, then its end), and
 * /health answers 503 naming it. */

/* The failure of the server's MPI job (dsf_dist_failure), else NULL; always NULL in a single
 * process. Any thread. */
const char *srv_failure(const srv_server *s);
/* After a failure: waits at most wait_s seconds until every request has been answered (the
 * scheduler answers them 503 at its engine call's return) and its answer sent, then srv_stop
 * (no draining, no grace). */
void srv_abort(srv_server *s, double wait_s);

/* ==== requests (server_api.c) ============================================================ */

typedef enum {
    SRV_CHAT = 1,
    SRV_COMPLETION,
    SRV_MESSAGES,  /* Anthropic /v1/messages (server_msg.h) */
    SRV_RESPONSES, /* OpenAI /v1/responses (responses.h) */
} srv_kind;

/* An OpenAI-style error: HTTP status, message, type, param (may be NULL), code (may be NULL). */
typedef struct {
    int status;
    char message[DSF_ERR_LEN];
    const char *type;
    char param[64];
    const char *code;
} srv_error;

/* Sets e and returns -1. */
int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    DSF_PRINTF(5, 6);
/* {"error": {"message", "type", "param", "code"}} (malloc'ed). */
char *srv_error_json(const srv_error *e);

/* One image of a request: its bytes (decoded from a data: URL; malloc'ed) and the size its
 * header gives (0 x 0: a format left to the decoder). The scheduler encodes it. */
typedef struct {
    uint8_t *data;
    size_t len;
    int w, h;
} srv_image;

/* A validated request. */
typedef struct {
    srv_kind kind;
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    int32_t *prompt;             /* [n_prompt] token ids (malloc'ed) */
    int n_prompt;
    bool gen_reasoning;          /* chat: the output starts inside the reasoning */
    bool parallel_tool_calls;    /* false: keep only the first tool call */
    bool tools;                  /* chat: tools were rendered into the prompt */
    int logprobs;                /* -1: off, else the number of top logprobs (0..20) */
    int max_tokens;              /* <= 0: up to the context */
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
    bool has_seed;
    char **stop;                 /* [n_stop] (malloc'ed strings) */
    int n_stop;
    bool ignore_eos;
    /* the endpoint's own request state (e.g. what a Responses reply repeats), freed by
     * srv_req_free with api_free; NULL for chat and completions */
    void *api_data;
    void (*api_free)(void *api_data);
    /* chat: the output constraint (NULL: none), derived from tool_choice "required" / a named
     * function (the DSML calls block) or response_format json_object / json_schema (the
     * content); owned, freed by srv_req_free */
    dsf_grammar *grammar;
    /* chat: the encoder's image records (dsf_chat_prompt.images_json; NULL: no image), one per
     * <｜deepseek_image｜> of the prompt; the server turns them into images within its limits */
    char *images_json;
    /* the images in prompt order (owned), filled by the server (server_image.h) */
    srv_image *images;
    int n_images;
} srv_req;

void srv_req_free(srv_req *r);

/* Maps a chat request (already parsed) onto the encoder: validates messages, roles, content
 * types, tools and tool_choice (a named function must be in tools; "none" drops them; a
 * named choice keeps only that tool), developer -> system, then renders the prompt
 * (dsf_chat_prompt, byte-exact with the official encoder). HTTP 400 errors in e. */
int srv_chat_render(const json_t *body, dsf_chat_prompt *out, srv_error *e);

/* Parses and validates a /v1/chat/completions (kind SRV_CHAT) or /v1/completions body:
 * renders and tokenizes the prompt and checks it against n_ctx (400 naming the limit). */
int srv_parse_request(srv_kind kind, const char *body, size_t len, const dsf_tokenizer *tok,
                      int n_ctx, srv_req *out, srv_error *e);
/* The same for a body already parsed (kind SRV_CHAT or SRV_COMPLETION): the entry point of
 * the endpoints that map their own request onto a chat request (/v1/responses). */
int srv_parse_json(srv_kind kind, const json_t *body, const dsf_tokenizer *tok, int n_ctx, srv_req *out,
                   srv_error *e);

/* ==== responses (server_api.c) =========================================================== */

/* One generated token's log-probabilities (logprobs requests). */
typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[20];
    float top_lp[20];
} srv_tokprob;

/* Identity of one reply. */
typedef struct {
    char id[48];       /* chatcmpl-... / cmpl-... */
    const char *model;
    long long created;
} srv_meta;

typedef struct {
    int prompt_tokens, completion_tokens, cached_tokens;
} srv_usage;

/* Appends "call_" + 24 random alphanumerics (NUL-terminated, 30 bytes). */
void srv_call_id(char out[32], uint64_t *rng);

/* Non-streaming chat reply: message built from the parsed output r (reasoning_content,
 * content, tool_calls with ids from ids[i]); finish_reason "tool_calls" when r has calls and
 * finish is "stop". logprobs: NULL or n_lp entries. Returns new JSON. */
json_t *srv_chat_reply(const srv_meta *m, const dsf_dsml_result *r, char ids[][32], const char *finish,
                       const srv_usage *u, const srv_tokprob *lp, int n_lp, const dsf_tokenizer *tok,
                       bool parallel_tool_calls);
/* Non-streaming completion reply. */
json_t *srv_completion_reply(const srv_meta *m, const char *text, size_t len, const char *finish,
                             const srv_usage *u, const srv_tokprob *lp, int n_lp, const dsf_tokenizer *tok);

/* A chat.completion.chunk / text_completion chunk skeleton with one choice whose delta
 * (chat) or text (completion) the caller fills. Returns new JSON; *choice borrows the choice. */
json_t *srv_chunk(const srv_meta *m, srv_kind kind, json_t **choice);
/* One streamed DSML event as a chat.completion.chunk: reasoning_content / content deltas, a
 * tool call's start (index, id, type, function.name, arguments "") and its argument
 * fragments. NULL for events that send nothing (empty text, a call's end, calls after the
 * first when parallel_tool_calls is false). call_id: the id of call ev->index. */
json_t *srv_dsml_chunk(const srv_meta *m, const dsf_dsml_event *ev, const char *call_id, bool parallel_tool_calls);
/* The final usage chunk (choices: []). */
json_t *srv_usage_chunk(const srv_meta *m, srv_kind kind, const srv_usage *u);
/* usage object. */
json_t *srv_usage_json(const srv_usage *u);
/* Chat logprobs {"content": [...]} / completion logprobs {"tokens", "token_logprobs", ...}. */
json_t *srv_chat_logprobs(const srv_tokprob *lp, int n, const dsf_tokenizer *tok);
json_t *srv_completion_logprobs(const srv_tokprob *lp, int n, const dsf_tokenizer *tok, size_t text_offset0);

/* Appends "data: <compact json>\n\n" to b. */
void srv_sse_json(dsf_buf *b, const json_t *v);

#endif
