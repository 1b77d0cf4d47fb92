/* http.c: an HTTP/1.1 client over raw sockets and the SSE decoding of the official SDKs, for
 * the end-to-end server tests (http.h). No TEST here. */
#include "http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* ==== the server process ================================================================== */

long proc_status(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) v = strtol(line + n, NULL, 10);
    if (f) fclose(f);
    return v;
}

long rss_kb(pid_t pid) { return proc_status(pid, "VmRSS:"); }

/* ==== HTTP/1.1 client ===================================================================== */

int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {120, 0}; /* a hung server fails the test instead of hanging it */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

int send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int send_str(int fd, const char *s) { return send_all(fd, s, strlen(s)); }

/* The request exactly as the OpenAI Python SDK (httpx) frames it. */
int send_request(int fd, int port, const char *method, const char *path, const char *body, const char *key) {
    dsf_buf b = {0};
    size_t bl = body ? strlen(body) : 0;
    dsf_buf_appendf(&b,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
                    "Accept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.54.0\r\n"
                    "X-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.54.0\r\nX-Stainless-OS: Linux\r\n"
                    "X-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.11.9\r\n"
                    "X-Stainless-Async: false\r\nx-stainless-retry-count: 0\r\n",
                    method, path, port);
    if (key) dsf_buf_appendf(&b, "Authorization: Bearer %s\r\n", key);
    if (body) dsf_buf_appendf(&b, "Content-Length: %zu\r\n", bl);
    dsf_buf_append(&b, "\r\n", 2);
    if (body) dsf_buf_append(&b, body, bl);
    int rc = send_all(fd, b.data, b.len);
    dsf_buf_free(&b);
    return rc;
}

/* Reads one response: status line, headers, then a Content-Length, chunked or until-close body. */
int read_response(int fd, response *r) {
    memset(r, 0, sizeof *r);
    dsf_buf raw = {0};
    char tmp[8192];
    size_t hend = 0;
    for (;;) {
        dsf_buf_append(&raw, "", 0);
        char *h = raw.len ? strstr((char *)raw.data, "\r\n\r\n") : NULL;
        if (h) {
            hend = (size_t)(h - (char *)raw.data) + 4;
            break;
        }
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) {
            dsf_buf_free(&raw);
            return -1;
        }
        dsf_buf_append(&raw, tmp, (size_t)n);
    }
    char *hdr = (char *)raw.data;
    snprintf(r->head, sizeof r->head, "%.*s", (int)hend, hdr);
    if (sscanf(hdr, "HTTP/1.%*d %d", &r->status) != 1) {
        dsf_buf_free(&raw);
        return -1;
    }
    long long clen = -1;
    bool chunked = false;
    for (char *l = strstr(hdr, "\r\n"); l && (size_t)(l - hdr) < hend - 4; l = strstr(l + 2, "\r\n")) {
        char *v = l + 2;
        if (!strncasecmp(v, "Content-Length:", 15)) clen = atoll(v + 15);
        if (!strncasecmp(v, "Transfer-Encoding:", 18) && strstr(v, "chunked") && strstr(v, "chunked") < strstr(v, "\r\n"))
            chunked = true;
        if (!strncasecmp(v, "Content-Type:", 13)) {
            const char *e = strstr(v, "\r\n");
            const char *s = v + 13;
            while (*s == ' ') s++;
            snprintf(r->ctype, sizeof r->ctype, "%.*s", (int)(e - s), s);
        }
    }
    size_t pos = hend;
    for (;;) {
        size_t have = raw.len - pos;
        if (!chunked && clen >= 0 && have >= (size_t)clen) {
            dsf_buf_append(&r->body, raw.data + pos, (size_t)clen);
            break;
        }
        if (chunked) {
            /* consume whole chunks */
            bool progress = true, end = false;
            while (progress) {
                progress = false;
                dsf_buf_append(&raw, "", 0);
                char *p = (char *)raw.data + pos;
                char *le = strstr(p, "\r\n");
                if (!le) break;
                unsigned long sz = strtoul(p, NULL, 16);
                size_t need = (size_t)(le - p) + 2 + sz + 2;
                if (raw.len - pos < need) break;
                if (sz == 0) {
                    end = true;
                    break;
                }
                dsf_buf_append(&r->body, le + 2, sz);
                pos += need;
                progress = true;
            }
            if (end) break;
        }
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) {
            if (!chunked && clen < 0) {
                dsf_buf_append(&r->body, raw.data + pos, raw.len - pos);
                break;
            }
            dsf_buf_free(&raw);
            return -1;
        }
        dsf_buf_append(&raw, tmp, (size_t)n);
    }
    dsf_buf_append(&r->body, "", 0);
    dsf_buf_free(&raw);
    return 0;
}

void response_free(response *r) { dsf_buf_free(&r->body); }

/* One request on a fresh connection. */
int http(int port, const char *method, const char *path, const char *body, const char *key, response *r) {
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    int rc = send_request(fd, port, method, path, body, key);
    if (rc == 0) rc = read_response(fd, r);
    close(fd);
    return rc;
}

json_t *body_json(const response *r) {
    json_error_t e;
    return json_loadb((const char *)r->body.data, r->body.len, JSON_ALLOW_NUL, &e); /* generated text may hold U+0000 */
}

/* strtok_r: tests call this from several client threads at once (strtok's state is global) */
const json_t *json_at(const json_t *o, const char *path) {
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = o;
    for (char *tok = strtok_r(buf, ".", &save); tok && v; tok = strtok_r(NULL, ".", &save))
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    return v;
}

/* ==== SSE, as the OpenAI SDK decodes it =================================================== */

void sse_decode(const char *s, size_t n, sse *out) {
    memset(out, 0, sizeof *out);
    out->events = json_array();
    dsf_buf data = {0};
    bool have = false;
    size_t i = 0;
    while (i <= n && !out->done) {
        size_t j = i;
        while (j < n && s[j] != '\n' && s[j] != '\r') j++;
        const char *line = s + i;
        size_t ll = j - i;
        bool at_end = j >= n;
        if (j < n && s[j] == '\r' && j + 1 < n && s[j + 1] == '\n') j++;
        i = j + 1;
        if (ll == 0) {
            if (have) { /* dispatch */
                dsf_buf_append(&data, "", 0);
                const char *d = (const char *)data.data;
                if (!strncmp(d, "[DONE]", 6)) {
                    out->done = true;
                } else {
                    json_error_t e;
                    json_t *v = json_loadb(d, data.len, JSON_ALLOW_NUL, &e);
                    if (!v) out->bad_json = true;
                    else {
                        if (json_object_get(v, "error")) out->error = true;
                        json_array_append_new(out->events, v);
                    }
                }
                data.len = 0;
                have = false;
            }
            if (at_end) break;
            continue;
        }
        if (line[0] == ':') {
            out->comments++;
            continue;
        }
        const char *colon = memchr(line, ':', ll);
        size_t fl = colon ? (size_t)(colon - line) : ll;
        const char *v = colon ? colon + 1 : line + ll;
        size_t vl = ll - (size_t)(v - line);
        if (vl && *v == ' ') v++, vl--;
        if (fl == 4 && !memcmp(line, "data", 4)) {
            if (have) dsf_buf_append(&data, "\n", 1);
            dsf_buf_append(&data, v, vl);
            have = true;
        } else if ((fl == 5 && !memcmp(line, "event", 5)) || (fl == 2 && !memcmp(line, "id", 2)) ||
                   (fl == 5 && !memcmp(line, "retry", 5))) {
            have = true;
        }
    }
    dsf_buf_free(&data);
}

void sse_free(sse *s) { json_decref(s->events); }

void assemble(const sse *s, assembled *a) {
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < json_array_size(s->events); i++) {
        json_t *ev = json_array_get(s->events, i);
        a->n_chunks++;
        if (json_object_get(ev, "usage") && !json_is_null(json_object_get(ev, "usage"))) a->usage = json_object_get(ev, "usage");
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        if (!ch) continue;
        json_t *d = json_object_get(ch, "delta");
        if (i == 0 && d) a->role_first = json_is_string(json_object_get(d, "role")) &&
                                       !strcmp(json_string_value(json_object_get(d, "role")), "assistant");
        json_t *c = d ? json_object_get(d, "content") : json_object_get(ch, "text");
        if (json_is_string(c)) dsf_buf_append(&a->content, json_string_value(c), json_string_length(c));
        json_t *rc = d ? json_object_get(d, "reasoning_content") : NULL;
        if (json_is_string(rc)) dsf_buf_append(&a->reasoning, json_string_value(rc), json_string_length(rc));
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) a->finish = json_string_value(fr);
        json_t *lp = json_object_get(ch, "logprobs");
        if (json_is_object(lp)) a->n_logprobs += (int)json_array_size(json_object_get(lp, "content"));
    }
    dsf_buf_append(&a->content, "", 0);
    dsf_buf_append(&a->reasoning, "", 0);
}

void assembled_free(assembled *a) {
    dsf_buf_free(&a->content);
    dsf_buf_free(&a->reasoning);
}
