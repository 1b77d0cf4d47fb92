/* http.h: an HTTP/1.1 client over raw sockets, with the headers the official OpenAI Python SDK
 * sends, and the SSE decoding of the official SDKs (lines split on \r\n, \n or \r; a blank
 * line ends an event; ':' lines are comments; "field: value" with one optional space; data
 * lines joined by "\n"; "[DONE]" ends the stream), for the end-to-end server tests
 * (tests/e2e/server*.c). No TEST here. */
#ifndef DSF_TEST_HTTP_H
#define DSF_TEST_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/util.h"

/* A number from /proc/PID/status (field with its colon, e.g. "Threads:"), -1 if unknown. */
long proc_status(pid_t pid, const char *field);
/* The resident set of a process in kB (/proc/PID/status VmRSS), -1 if unknown. */
long rss_kb(pid_t pid);

/* A loopback connection with 120 s send/receive timeouts (a hung server fails the test
 * instead of hanging it); -1 on failure. */
int tcp_connect(int port);
int send_all(int fd, const void *p, size_t n);
int send_str(int fd, const char *s);
/* The request exactly as the OpenAI Python SDK (httpx) frames it; key: a bearer key or NULL. */
int send_request(int fd, int port, const char *method, const char *path, const char *body, const char *key);

typedef struct {
    int status;
    char ctype[128];
    char head[2048]; /* the status line and the headers (cut at 2047 bytes) */
    dsf_buf body;    /* decoded (chunked encoding removed), NUL-terminated */
} response;

/* Reads one response: status line, headers, then a Content-Length, chunked or until-close body. */
int read_response(int fd, response *r);
void response_free(response *r);
/* One request on a fresh connection. */
int http(int port, const char *method, const char *path, const char *body, const char *key, response *r);
/* The body as JSON (NULL if it is not). */
json_t *body_json(const response *r);
/* The value at a dotted path with numeric array indices ("choices.0.message.content"), NULL if none. */
const json_t *json_at(const json_t *o, const char *path);

typedef struct {
    json_t *events;  /* array of the parsed data objects, in order, up to [DONE] */
    bool done;       /* saw data: [DONE] */
    int comments;    /* ':' lines (ignored by the SDK) */
    bool bad_json;   /* an event's data was not JSON */
    bool error;      /* an event carried "error" (the SDK raises) */
} sse;

void sse_decode(const char *s, size_t n, sse *out);
void sse_free(sse *s);

/* The texts a client assembles from chat chunks, the last finish_reason and the usage. */
typedef struct {
    dsf_buf content, reasoning;
    const char *finish;
    json_t *usage;
    bool role_first;
    int n_chunks;
    int n_logprobs;
} assembled;

void assemble(const sse *s, assembled *a);
void assembled_free(assembled *a);

#endif
