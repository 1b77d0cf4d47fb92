/* webui.c: the chat page that `dsflash serve` answers on GET / (src/server/webui.c, webui/).
 * The HTTP side against the real binary (the bytes served are the files of webui/, the headers,
 * --no-webui, --api-key), then the page itself in a real browser: Debian's chromium driven
 * headless over the DevTools protocol by tests/npm/webui/browser.test.mjs (node, npm
 * chrome-remote-interface), which saves a screenshot next to the binary (build/webui.png). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "http.h"
#include "npm.h"
#include "serve.h"
#include "test.h"

/* The value of header name in r->head ("" if absent), into out. */
static const char *header(const response *r, const char *name, char *out, size_t cap) {
    out[0] = 0;
    size_t n = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        if (!strncasecmp(p + 2, name, n) && p[2 + n] == ':') {
            const char *v = p + 3 + n, *e = strstr(v, "\r\n");
            while (*v == ' ') v++;
            size_t l = e ? (size_t)(e - v) : strlen(v);
            snprintf(out, cap, "%.*s", (int)(l < cap ? l : cap - 1), v);
            break;
        }
    }
    return out;
}

/* GET path with extra request headers (e.g. If-None-Match); one request per connection. */
static int get_with(int port, const char *path, const char *extra, response *r) {
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    char req[1024];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s\r\n", path, port,
             extra ? extra : "");
    int rc = send_str(fd, req) || read_response(fd, r);
    close(fd);
    return rc;
}

/* Guards against: a page that is not the source files (a stale or truncated embedding), a
 * missing Content-Security-Policy or content type, ETag revalidation that does not answer 304,
 * and other methods than GET. */
TEST(webui_page) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    START(s, model, NULL);
    static const char *const files[][2] = {{"/", "webui/index.html"},
                                          {"/index.html", "webui/index.html"},
                                          {"/webui/app.js", "webui/app.js"},
                                          {"/webui/markdown.js", "webui/markdown.js"},
                                          {"/webui/app.css", "webui/app.css"}};
    static const char *const ctypes[] = {"text/html", "text/html", "text/javascript", "text/javascript", "text/css"};
    for (int i = 0; i < 5; i++) {
        long n = 0;
        unsigned char *want = test_slurp(files[i][1], &n);
        CHECKF(want, "cannot read %s (run from the repo root)", files[i][1]);
        response r = {0};
        CHECK(http(s.port, "GET", files[i][0], NULL, NULL, &r) == 0);
        CHECKF(r.status == 200, "GET %s: %d", files[i][0], r.status);
        CHECKF(!strncmp(r.ctype, ctypes[i], strlen(ctypes[i])), "GET %s: Content-Type %s", files[i][0], r.ctype);
        CHECKF(r.body.len == (size_t)n && !memcmp(r.body.data, want, (size_t)n),
               "GET %s: %zu bytes that differ from %s (%ld bytes)", files[i][0], r.body.len, files[i][1], n);
        char csp[512], etag[128], nosniff[64];
        header(&r, "Content-Security-Policy", csp, sizeof csp);
        CHECKF(strstr(csp, "default-src 'none'") && strstr(csp, "script-src 'self';") && strstr(csp, "connect-src 'self'") &&
                   !strstr(csp, "unsafe-inline") && !strstr(csp, "unsafe-eval"),
               "GET %s: Content-Security-Policy '%s'", files[i][0], csp);
        CHECKF(!strcmp(header(&r, "X-Content-Type-Options", nosniff, sizeof nosniff), "nosniff"), "nosniff: '%s'", nosniff);
        header(&r, "ETag", etag, sizeof etag);
        CHECKF(etag[0] == '"', "GET %s: ETag '%s'", files[i][0], etag);
        response_free(&r);
        free(want);
        char inm[256];
        snprintf(inm, sizeof inm, "If-None-Match: W/\"other\", %s\r\n", etag);
        CHECK(get_with(s.port, files[i][0], inm, &r) == 0);
        CHECKF(r.status == 304 && r.body.len == 0, "GET %s with its ETag: %d, %zu bytes", files[i][0], r.status, r.body.len);
        response_free(&r);
        CHECK(get_with(s.port, files[i][0], "If-None-Match: \"other\"\r\n", &r) == 0);
        CHECKF(r.status == 200, "GET %s with another ETag: %d", files[i][0], r.status);
        response_free(&r);
    }
    response r = {0};
    CHECK(http(s.port, "GET", "/webui/config.json", NULL, NULL, &r) == 0);
    CHECKF(r.status == 200 && !strcmp((const char *)r.body.data, "{\"api_key\":false}"), "%d %s", r.status,
           (const char *)r.body.data);
    response_free(&r);
    CHECK(http(s.port, "POST", "/", "{}", NULL, &r) == 0);
    CHECKF(r.status == 405, "POST /: %d", r.status);
    response_free(&r);
    CHECK(http(s.port, "GET", "/webui/nothing.js", NULL, NULL, &r) == 0);
    CHECKF(r.status == 404, "GET /webui/nothing.js: %d", r.status);
    response_free(&r);
    CHECK(test_server_stop(&s) == 0);
}

/* Guards against: --api-key locking the page out (a browser cannot send a key before the page
 * asks for it) or the key check being skipped for the API. --no-webui: no page at all. */
TEST(webui_key_and_off) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    START(s, model, "--api-key sk-page");
    response r = {0};
    CHECK(http(s.port, "GET", "/", NULL, NULL, &r) == 0);
    CHECKF(r.status == 200 && strstr((const char *)r.body.data, "<!doctype html>"), "GET / with --api-key: %d", r.status);
    response_free(&r);
    CHECK(http(s.port, "GET", "/webui/config.json", NULL, NULL, &r) == 0);
    CHECKF(r.status == 200 && !strcmp((const char *)r.body.data, "{\"api_key\":true}"), "%d %s", r.status,
           (const char *)r.body.data);
    response_free(&r);
    CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    CHECKF(r.status == 401, "GET /v1/models without the key: %d", r.status);
    response_free(&r);
    CHECK(http(s.port, "GET", "/v1/models", NULL, "sk-page", &r) == 0);
    CHECKF(r.status == 200, "GET /v1/models with the key: %d", r.status);
    response_free(&r);
    CHECK(test_server_stop(&s) == 0);

    START(o, model, "--no-webui");
    static const char *const paths[] = {"/", "/index.html", "/webui/app.js", "/webui/config.json"};
    for (int i = 0; i < 4; i++) {
        CHECK(http(o.port, "GET", paths[i], NULL, NULL, &r) == 0);
        CHECKF(r.status == 404, "--no-webui: GET %s: %d", paths[i], r.status);
        response_free(&r);
    }
    CHECK(http(o.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    CHECKF(r.status == 200, "--no-webui: GET /v1/models: %d", r.status);
    response_free(&r);
    CHECK(test_server_stop(&o) == 0);
}

static const char *const browser_need[] = {"chrome-remote-interface/package.json", NULL};

/* The page in chromium (tests/npm/webui/browser.test.mjs: loading without console errors, the
 * API key, streaming, stop, reasoning, regenerate, XSS replies, tool calls, images, reload,
 * phone width). Guards against a page that breaks in a browser while its files look right.
 * Skips only without chromium or node outside CI; in CI (`make deps` installs chromium) it fails. */
TEST(webui_browser) {
    const char *chromium = getenv("DSF_CHROMIUM") ? getenv("DSF_CHROMIUM") : "/usr/bin/chromium";
    bool ci = getenv("CI") && strcmp(getenv("CI"), "") && strcmp(getenv("CI"), "false");
    struct stat st;
    if (stat(chromium, &st) != 0) {
        CHECKF(!ci, "%s is missing in CI (make deps installs Debian's chromium)", chromium);
        SKIP("%s is not installed (make deps, or apt-get install chromium)", chromium);
    }
    char why[512];
    const char *skip = test_npm_ready(browser_need, why, sizeof why);
    if (skip) {
        CHECKF(!ci, "%s", skip);
        SKIP("%s", skip);
    }
    NEED_SHARED(model0, "testdata/tiny41/tiny41.gguf");
    NEED_SHARED(image0, "testdata/tinyvl/images/grad.png");
    char model[1024], image[1024], mmproj[1024] = "";
    snprintf(model, sizeof model, "%s", model0);
    snprintf(image, sizeof image, "%s", image0);
    /* with a server that takes images (--mmproj), the upload goes to the model for real (the
     * test reads /v1/models); a server that cannot start with one falls back to tiny41 */
    char help[16384];
    test_run("\"${DSF_BIN:-build/dsflash}\" serve --help 2>&1", help, sizeof help);
    const char *vl = test_shared("testdata/tinyvl/tinyvl.gguf"), *mp = test_shared("testdata/tinyvl/mmproj-tinyvl.gguf");
    if (strstr(help, "--mmproj") && vl && mp) {
        snprintf(model, sizeof model, "%s", vl);
        snprintf(mmproj, sizeof mmproj, "--mmproj %s", mp);
    }
    char extra[1536];
    snprintf(extra, sizeof extra, "--api-key sk-browser --ctx 8192 %s", mmproj);
    test_server s = {0};
    char msg[512];
    if (mmproj[0] && test_server_start(&s, model, extra, msg, sizeof msg) != 0) {
        /* the projector's own tests (serve_vision) say why; the page's side is still tested */
        fprintf(stderr, "webui_browser: serve --mmproj did not start (%s): the images are checked in the browser only\n",
                msg);
        snprintf(model, sizeof model, "%s", test_shared("testdata/tiny41/tiny41.gguf"));
        mmproj[0] = 0;
        snprintf(extra, sizeof extra, "--api-key sk-browser --ctx 8192");
        if (s.pid > 0) test_server_stop(&s);
        s.pid = 0;
    }
    if (!s.pid) CHECKF(test_server_start(&s, model, extra, msg, sizeof msg) == 0, "%s", msg);
    char shot[1024], abs_img[PATH_MAX], abs_shot[PATH_MAX + 1200];
    snprintf(shot, sizeof shot, "%s", test_bin());
    char *slash = strrchr(shot, '/');
    snprintf(slash ? slash + 1 : shot, sizeof shot - (size_t)(slash ? slash + 1 - shot : 0), "webui.png");
    CHECK(realpath(image, abs_img));
    char cwd[2048];
    CHECK(getcwd(cwd, sizeof cwd));
    snprintf(abs_shot, sizeof abs_shot, "%s%s%s", shot[0] == '/' ? "" : cwd, shot[0] == '/' ? "" : "/", shot);
    const char *base = strrchr(model, '/');
    char cmd[3 * PATH_MAX + 4096];
    snprintf(cmd, sizeof cmd,
             "cd tests/npm && DSF_BASE_URL=http://127.0.0.1:%d DSF_API_KEY=sk-browser DSF_MODEL=%s DSF_SERVER_LOG=%s "
             "DSF_IMAGE=%s DSF_SCREENSHOT=%s CHROMIUM=%s timeout 240 node --test --test-reporter=spec "
             "webui/browser.test.mjs 2>&1",
             s.port, base ? base + 1 : model, s.log, abs_img, abs_shot, chromium);
    static char out[1 << 16];
    int rc = test_run(cmd, out, sizeof out);
    size_t n = strlen(out);
    CHECKF(rc == 0, "node --test webui/browser.test.mjs failed (rc %d); server log %s; output:\n%s", rc, s.log,
           n > 8000 ? out + n - 8000 : out);
    CHECKF(stat(abs_shot, &st) == 0 && st.st_size > 1000, "no screenshot at %s", abs_shot);
    CHECKF(test_server_stop(&s) == 0, "the server did not exit cleanly (log %s)", s.log);
}
