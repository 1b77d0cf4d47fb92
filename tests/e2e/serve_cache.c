/* serve_cache.c: `dsflash serve --cache-dir` end to end on tiny41: the disk prefix cache across
 * server processes. Requests go through curl (an independent HTTP client); replies are read
 * with jansson. Expected values: the reply of a server without a cache (the cold run: greedy,
 * so the tokens and their logprobs are the reference), and the APIs' documented usage fields
 * (chat usage.prompt_tokens_details.cached_tokens, Messages usage.cache_read_input_tokens next
 * to input_tokens, Responses usage.input_tokens_details.cached_tokens). The server stores a
 * prompt's state one token before its end (docs/ARCHITECTURE.md, server_pcache.c), so a
 * repeated prompt of P tokens reports P - 1 cached tokens. No timing assertions. */
#include "http.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "helpers.h"
#include "serve.h"
#include "test.h"

#define SYS "You are terse and helpful. Answer in one line, and never apologise."
#define Q "Hello there, how are you doing on this fine day?"
#define CHAT_REQ                                                                                                 \
    "{\"messages\":[{\"role\":\"system\",\"content\":\"" SYS "\"},{\"role\":\"user\",\"content\":\"" Q "\"}],"   \
    "\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3}"
#define MSG_REQ                                                                                                  \
    "{\"model\":\"tiny\",\"system\":\"" SYS "\",\"messages\":[{\"role\":\"user\",\"content\":\"" Q "\"}],"       \
    "\"max_tokens\":12,\"temperature\":0}"
#define RESP_REQ "{\"instructions\":\"" SYS "\",\"input\":\"" Q "\",\"max_output_tokens\":12,\"temperature\":0}"

/* POST body to path with curl; the parsed JSON reply (NULL on failure), its status in *status. */
static json_t *post(int port, const char *path, const char *body, int *status) {
    static int n;
    char in[512], out[512], cmd[2048], code[64] = "";
    snprintf(in, sizeof in, "%s/cache-req-%d-%d.json", test_tmpdir(), (int)getpid(), n);
    snprintf(out, sizeof out, "%s/cache-rep-%d-%d.json", test_tmpdir(), (int)getpid(), n++);
    FILE *f = fopen(in, "w");
    if (!f || fputs(body, f) < 0 || fclose(f)) return NULL;
    snprintf(cmd, sizeof cmd,
             "curl -s -m 120 -o '%s' -w '%%{http_code}' -X POST -H 'Content-Type: application/json' "
             "-H 'anthropic-version: 2023-06-01' --data-binary @'%s' http://127.0.0.1:%d%s",
             out, in, port, path);
    if (test_run(cmd, code, sizeof code) != 0) return NULL;
    *status = atoi(code);
    json_error_t e;
    return json_load_file(out, JSON_ALLOW_NUL, &e);
}

static long long jint(const json_t *o, const char *path) {
    const json_t *v = json_at(o, path);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* The generated output of any of the three APIs: every string under a key "text", "content",
 * "reasoning_content" or "thinking", in order (ids and timestamps left out). */
static void gather(const json_t *v, const char *key, dsf_buf *b) {
    if (json_is_string(v) && key &&
        (!strcmp(key, "text") || !strcmp(key, "content") || !strcmp(key, "reasoning_content") || !strcmp(key, "thinking"))) {
        dsf_buf_append(b, json_string_value(v), json_string_length(v));
        dsf_buf_append(b, "|", 1);
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) gather(json_array_get(v, i), key, b);
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) if (strcmp(k, "usage")) gather(x, k, b);
    }
}

typedef struct {
    int status;
    char *text;       /* the output (gather) */
    json_t *logprobs; /* chat: choices.0.logprobs */
    long long prompt, cached;
} result;

static void result_free(result *r) {
    free(r->text);
    json_decref(r->logprobs);
    memset(r, 0, sizeof *r);
}

enum { API_CHAT, API_MSG, API_RESP };

static int ask(int port, int api, result *r) {
    memset(r, 0, sizeof *r);
    static const char *const path[] = {"/v1/chat/completions", "/v1/messages", "/v1/responses"};
    static const char *const body[] = {CHAT_REQ, MSG_REQ, RESP_REQ};
    json_t *v = post(port, path[api], body[api], &r->status);
    if (!v) return -1;
    dsf_buf b = {0};
    gather(v, NULL, &b);
    dsf_buf_append(&b, "", 1);
    r->text = (char *)b.data;
    if (api == API_CHAT) {
        r->prompt = jint(v, "usage.prompt_tokens");
        r->cached = jint(v, "usage.prompt_tokens_details.cached_tokens");
        r->logprobs = json_incref((json_t *)json_at(v, "choices.0.logprobs"));
    } else if (api == API_MSG) {
        r->cached = jint(v, "usage.cache_read_input_tokens");
        r->prompt = jint(v, "usage.input_tokens") + r->cached; /* input_tokens excludes the cache reads */
    } else {
        r->prompt = jint(v, "usage.input_tokens");
        r->cached = jint(v, "usage.input_tokens_details.cached_tokens");
    }
    json_decref(v);
    return r->status == 200 && r->prompt > 0 && r->cached >= 0 ? 0 : -1;
}

/* Files in dir ending in ext; their total size in *bytes. */
static int count_files(const char *dir, const char *ext, long long *bytes) {
    DIR *d = opendir(dir);
    int n = 0;
    if (bytes) *bytes = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t l = strlen(de->d_name), k = strlen(ext);
        if (l <= k || strcmp(de->d_name + l - k, ext)) continue;
        n++;
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (bytes && !stat(p, &sb)) *bytes += sb.st_size;
    }
    if (d) closedir(d);
    return n;
}

/* Applies fn to every entry file of dir. */
static void each_entry(const char *dir, void (*fn)(const char *path)) {
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l < 7 || strcmp(de->d_name + l - 6, ".dsfpc")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        fn(p);
    }
    if (d) closedir(d);
}

static bool log_has(const test_server *s, const char *what) {
    uint8_t *d = NULL;
    size_t n = 0;
    if (dsf_read_file(s->log, &d, &n, NULL)) return false;
    bool ok = strstr((char *)d, what) != NULL;
    free(d);
    return ok;
}

/* Starts a server (the reason on stderr when it fails). */
static int start(test_server *s, const char *model, const char *extra) {
    char why[256];
    if (test_server_start(s, model, extra, why, sizeof why) == 0) return 0;
    fprintf(stderr, "serve_cache: %s\n", why);
    return -1;
}

/* One chat request on a server with this cache: the entries it stored. */
static int populate(const char *model, const char *extra, const char *dir) {
    test_server s;
    result r;
    if (start(&s, model, extra)) return -1;
    int rc = ask(s.port, API_CHAT, &r);
    result_free(&r);
    if (test_server_stop(&s) || rc) return -1;
    return count_files(dir, ".dsfpc", NULL);
}

/* The cold reference: a server without a cache, chat API. */
static int cold_chat(const char *model, const char *extra, result *r) {
    test_server s;
    if (start(&s, model, extra)) return -1;
    int rc = ask(s.port, API_CHAT, r);
    return test_server_stop(&s) == 0 ? rc : -1;
}

static bool same_output(const result *a, const result *b) {
    return !strcmp(a->text, b->text) && (!a->logprobs || json_equal(a->logprobs, b->logprobs));
}

/* Guards the round trip across a restart: a second server process on the same directory
 * restores the prompt's prefix (cached_tokens = P - 1 in all three APIs' usage) and gives
 * the cold run's tokens and logprobs exactly (greedy). */
TEST(serve_cache_restart) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    const char *dir = test_tmpfile("cache-restart");
    char extra[700];
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1 --cache-every 16", dir);
    result cold;
    CHECK(cold_chat(model, NULL, &cold) == 0);
    CHECKF(cold.cached == 0 && cold.prompt > 20, "cold run: prompt %lld cached %lld", cold.prompt, cold.cached);
    result first[3];
    {
        test_server s;
        CHECK(start(&s, model, extra) == 0);
        for (int api = 0; api < 3; api++) CHECKF(ask(s.port, api, &first[api]) == 0, "api %d, first server", api);
        CHECK(test_server_stop(&s) == 0);
    }
    CHECKF(first[API_CHAT].cached == 0 && same_output(&first[API_CHAT], &cold), "first chat: cached %lld, %s vs %s",
           first[API_CHAT].cached, first[API_CHAT].text, cold.text);
    CHECK(count_files(dir, ".dsfpc", NULL) >= 3);
    test_server s;
    CHECK(start(&s, model, extra) == 0);
    long long restored = 0;
    for (int api = 0; api < 3; api++) {
        result r;
        CHECKF(ask(s.port, api, &r) == 0, "api %d, second server", api);
        restored += r.cached;
        CHECKF(r.prompt == first[api].prompt && r.cached == r.prompt - 1, "api %d after the restart: prompt %lld cached %lld",
               api, r.prompt, r.cached);
        CHECKF(same_output(&r, &first[api]), "api %d after the restart: '%s' vs '%s'", api, r.text, first[api].text);
        result_free(&r);
        result_free(&first[api]);
    }
    CHECK(log_has(&s, "restored"));
    /* /metrics counts the disk hits and their tokens (the wiring of pcache's counters) */
    response mr;
    CHECK(http(s.port, "GET", "/metrics", NULL, NULL, &mr) == 0 && mr.status == 200);
    const char *h = strstr((const char *)mr.body.data, "\ndsflash_prefix_cache_hits_total "), *ht = strstr((const char *)mr.body.data, "\ndsflash_prefix_cache_hit_tokens_total ");
    long long hits = h ? atoll(h + 33) : -1, htok = ht ? atoll(ht + 39) : -1;
    response_free(&mr);
    CHECKF(hits >= 3 && htok == restored, "metrics: prefix cache hits %lld, hit tokens %lld (restored %lld)", hits, htok, restored);
    CHECK(test_server_stop(&s) == 0);
    result_free(&cold);
}

static void flip_middle(const char *path) {
    int fd = open(path, O_RDWR);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) return;
    off_t at = 64 + (sb.st_size - 64) / 2;
    unsigned char b;
    if (pread(fd, &b, 1, at) == 1) {
        b ^= 0x40;
        if (pwrite(fd, &b, 1, at) != 1) b = 0;
    }
    close(fd);
}
static void truncate_half(const char *path) {
    struct stat sb;
    if (!stat(path, &sb) && truncate(path, sb.st_size / 2)) return;
}

/* Guards against using a corrupted or a truncated entry: every entry file is damaged
 * (a payload byte flipped: found when read; or cut in half: found at startup); the server
 * discards them (logged, deleted), reports no cached tokens and gives the cold output. */
TEST(serve_cache_damaged) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    result cold;
    CHECK(cold_chat(model, NULL, &cold) == 0);
    for (int mode = 0; mode < 2; mode++) {
        const char *dir = test_tmpfile(mode ? "cache-truncated" : "cache-corrupted");
        char extra[700];
        snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1 --cache-every 16", dir);
        int n0 = populate(model, extra, dir);
        CHECK(n0 >= 3);
        each_entry(dir, mode ? truncate_half : flip_middle);
        test_server s;
        CHECK(start(&s, model, extra) == 0);
        result r;
        CHECK(ask(s.port, API_CHAT, &r) == 0);
        CHECKF(r.cached == 0 && same_output(&r, &cold), "%s entries: cached %lld, '%s' vs '%s'",
               mode ? "truncated" : "corrupted", r.cached, r.text, cold.text);
        result_free(&r);
        CHECK(test_server_stop(&s) == 0);
        CHECK(log_has(&s, "discarded"));
        CHECK(log_has(&s, mode ? "payload_len" : "checksum"));
        /* the damaged files are gone (a corrupted one once it was tried; the truncated all at
         * startup), and what the second server stored is intact */
        CHECK(count_files(dir, ".dsfpc", NULL) <= n0);
        if (mode) CHECK(!log_has(&s, "restored"));
    }
    result_free(&cold);
}

/* Guards the recovery from a kill -9 in the middle of a cache write (DSF_PCACHE_WRITE_DELAY_MS
 * holds the writer after half of the payload): the next server starts cleanly, removes the
 * unfinished temp file, never uses it, and answers with the cold output. */
TEST(serve_cache_kill9) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    result cold;
    CHECK(cold_chat(model, NULL, &cold) == 0);
    const char *dir = test_tmpfile("cache-kill9");
    char extra[700];
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1 --cache-every 16", dir);
    setenv("DSF_PCACHE_WRITE_DELAY_MS", "600000", 1);
    test_server s1;
    int st = start(&s1, model, extra);
    unsetenv("DSF_PCACHE_WRITE_DELAY_MS");
    CHECK(st == 0);
    result r;
    CHECK(ask(s1.port, API_CHAT, &r) == 0);
    result_free(&r);
    int tmp = 0;
    for (int i = 0; i < 300 && !(tmp = count_files(dir, ".tmp", NULL)); i++) test_sleep_ms(100);
    CHECK(tmp == 1);                               /* the writer is inside its first write */
    CHECK(count_files(dir, ".dsfpc", NULL) == 0);
    kill(s1.pid, SIGKILL);
    waitpid(s1.pid, NULL, 0);
    test_server s2;
    CHECK(start(&s2, model, extra) == 0);
    CHECK(count_files(dir, ".tmp", NULL) == 0);
    CHECK(log_has(&s2, "unfinished write"));
    CHECK(ask(s2.port, API_CHAT, &r) == 0);
    CHECKF(r.cached == 0 && same_output(&r, &cold), "after kill -9: cached %lld", r.cached);
    result_free(&r);
    CHECK(test_server_stop(&s2) == 0);
    CHECK(count_files(dir, ".dsfpc", NULL) >= 3);
    result_free(&cold);
}

/* Guards the LRU bound: with a budget of a few entries and many boundaries, the entry files
 * never exceed --cache-max-gb, older entries are evicted, and the latest prompt still hits. */
TEST(serve_cache_lru) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    const char *dir = test_tmpfile("cache-lru");
    const double gb = 0.0002; /* 214,748 bytes: a few tiny41 entries (20-90 KB each) */
    const long long budget = (long long)(gb * 1073741824.0);
    char extra[700];
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb %g --cache-every 8", dir, gb);
    {
        test_server s;
        CHECK(start(&s, model, extra) == 0);
        result r;
        for (int api = 0; api < 3; api++) {
            CHECK(ask(s.port, api, &r) == 0);
            result_free(&r);
        }
        CHECK(test_server_stop(&s) == 0);
    }
    long long bytes = 0;
    int n = count_files(dir, ".dsfpc", &bytes);
    CHECKF(n >= 2 && bytes <= budget, "%d entries, %lld bytes, budget %lld", n, bytes, budget);
    test_server s;
    CHECK(start(&s, model, extra) == 0);
    CHECK(log_has(&s, "pcache:"));
    result r;
    CHECK(ask(s.port, API_RESP, &r) == 0); /* the last prompt stored is the most recent */
    CHECKF(r.cached == r.prompt - 1, "latest prompt after the restart: prompt %lld cached %lld", r.prompt, r.cached);
    result_free(&r);
    CHECK(test_server_stop(&s) == 0);
    n = count_files(dir, ".dsfpc", &bytes);
    CHECKF(bytes <= budget, "%d entries, %lld bytes, budget %lld", n, bytes, budget);
}

/* Guards against serving another model's state: the cache written with tiny41.gguf is never
 * hit by tiny41-f32.gguf (another file of the same topology and tokenizer) nor by tiny41.gguf
 * in another numerics mode, and both give their own cold output. */
TEST(serve_cache_other_model) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    NEED_SHARED(other, "testdata/tiny41/tiny41-f32.gguf");
    const char *dir = test_tmpfile("cache-other");
    char extra[700];
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1 --cache-every 16", dir);
    int n0 = populate(model, extra, dir);
    CHECK(n0 >= 3);
    char plain[800];
    snprintf(plain, sizeof plain, "%s --numerics plain", extra);
    const char *models[2] = {other, model};
    const char *extras[2] = {extra, plain};
    const char *colds[2] = {NULL, "--numerics plain"};
    for (int k = 0; k < 2; k++) {
        result cold, r;
        CHECK(cold_chat(models[k], colds[k], &cold) == 0);
        test_server s;
        CHECK(start(&s, models[k], extras[k]) == 0);
        CHECK(ask(s.port, API_CHAT, &r) == 0);
        CHECKF(r.cached == 0 && same_output(&r, &cold), "case %d: cached %lld", k, r.cached);
        CHECK(test_server_stop(&s) == 0);
        CHECK(!log_has(&s, "restored") && !log_has(&s, "discarded"));
        result_free(&r);
        result_free(&cold);
    }
    /* the first model's entries are still there (the budget covers the whole directory) */
    CHECK(count_files(dir, ".dsfpc", NULL) >= n0);
}
