/* serve_vision.c: images in `dsflash serve` end to end on tinyvl (../shared/testdata/tinyvl).
 * Expected values: the official goldens (golden/grad-plain.{json,f32}: the expanded prompt,
 * its span, and row i = the logits after token i, so the row of the prompt's last token is the
 * first generated token's distribution), the image facts of tinyvl/README.md, the limits'
 * documented statuses (serve --help, README "Images"), and the APIs' usage fields.
 * The projector tests skip (saying so) while the build's vision tower is the placeholder. */
#include "http.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "helpers.h"
#include "npm.h"
#include "serve.h"
#include "test.h"

#define VL "testdata/tinyvl/"
#define Q "What is in this picture?"

/* "data:image/png;base64,..." of a file. */
static char *data_url(const char *path) {
    long n = 0;
    unsigned char *p = test_slurp(path, &n);
    if (!p) return NULL;
    char *b64 = test_base64(p, (size_t)n);
    dsf_buf b = {0};
    dsf_buf_appendf(&b, "data:image/png;base64,%s", b64);
    dsf_buf_append(&b, "", 1);
    free(b64);
    free(p);
    return (char *)b.data;
}

/* A chat body: Q then one image_url part per url (chat mode: the prompt ends "</think>"). */
static char *chat_body(const char *const *urls, int n, const char *extra) {
    dsf_buf b = {0};
    dsf_buf_appendf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"" Q "\"}");
    for (int i = 0; i < n; i++) dsf_buf_appendf(&b, ",{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}", urls[i]);
    dsf_buf_appendf(&b, "]}],\"thinking_mode\":\"chat\",\"max_tokens\":1,\"temperature\":0%s}", extra ? extra : "");
    dsf_buf_append(&b, "", 1);
    return (char *)b.data;
}

/* POST body; the status, and the error message or NULL in *msg (owned by *r). */
static int post(int port, const char *path, const char *body, response *r, json_t **js) {
    memset(r, 0, sizeof *r);
    if (http(port, "POST", path, body, NULL, r)) return -1;
    *js = body_json(r);
    return r->status;
}

static const char *err_msg(const json_t *v) {
    const json_t *m = json_at(v, "error.message");
    return json_is_string(m) ? json_string_value(m) : "";
}

/* Whether POST body (freed here) is answered status with an error message containing says;
 * the reply in got otherwise. */
static bool refused(int port, const char *path, char *body, int status, const char *says, char *got, size_t cap) {
    response r;
    json_t *v = NULL;
    int st = post(port, path, body, &r, &v);
    bool ok = st == status && strstr(err_msg(v), says);
    snprintf(got, cap, "%d %s", st, r.body.data ? (const char *)r.body.data : "");
    free(body);
    json_decref(v);
    response_free(&r);
    return ok;
}

/* Starts the projector server; false (test skipped) while the tower is the build's placeholder. */
static bool start_vision(test_ctx *t, test_server *s, const char *extra) {
    const char *model = test_shared(VL "tinyvl.gguf"), *proj = test_shared(VL "mmproj-tinyvl-f32.gguf");
    if (!model || !proj) return test_skip(t, "needs ../shared/" VL " (absent)"), false;
    char ex[1024], why[256];
    snprintf(ex, sizeof ex, "--mmproj %s --numerics plain %s", proj, extra ? extra : "");
    if (test_server_start(s, model, ex, why, sizeof why) == 0) return true;
    uint8_t *log = NULL;
    size_t n = 0;
    bool placeholder = dsf_read_file(s->log, &log, &n, NULL) == 0 &&
                       (strstr((char *)log, "no vision tower") || strstr((char *)log, "cannot read image spans"));
    free(log);
    if (placeholder) return test_skip(t, "this build's vision tower or text side is a placeholder (%s)", s->log), false;
    test_fail(t, __FILE__, __LINE__, "%s", why);
    return false;
}

/* Guards against requests the server must refuse before any work (and without a projector):
 * remote URLs fetched or passed on, bad base64 or a broken PNG header reaching the decoder,
 * limits not enforced or not named, images silently dropped by a text-only server. */
TEST(serve_vision_refusals) {
    NEED_SHARED(model, VL "tinyvl.gguf");
    NEED_SHARED(grad, VL "images/grad.png");
    NEED_SHARED(cap, VL "images/cap.png");
    char *g = data_url(grad), *c = data_url(cap);
    CHECK(g && c);
    START(s, model, "--max-images 2 --max-image-bytes 40000 --max-image-pixels 20000");
    static const struct { const char *url; int status; const char *says; } one[] = {
        {"https://example.com/a.png", 400, "remote image URLs are not fetched; send a data: URL"},
        {"data:image/png;base64,iVBORw0KGgo*", 400, "invalid base64"},
        {"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", 400, "PNG: truncated"},
        {NULL, 413, "--max-image-bytes"},  /* cap.png: 42809 bytes */
        {NULL, 413, "--max-image-pixels"}, /* cap.png through a larger byte limit: below */
        {NULL, 400, "this model has no vision projector (start serve with --mmproj)"},
    };
    char got[4096];
    for (size_t i = 0; i < 4; i++) { /* 4, the pixel limit, needs another server: below */
        const char *u = one[i].url ? one[i].url : c;
        CHECKF(refused(s.port, "/v1/chat/completions", chat_body(&u, 1, NULL), one[i].status, one[i].says, got, sizeof got),
               "case %zu: %s", i, got);
    }
    const char *three[3] = {g, g, g};
    CHECKF(refused(s.port, "/v1/chat/completions", chat_body(three, 3, NULL), 400, "--max-images", got, sizeof got), "%s", got);
    /* a valid image on a server without --mmproj; streaming too; and Anthropic's shape */
    for (int stream = 0; stream < 2; stream++)
        CHECKF(refused(s.port, "/v1/chat/completions", chat_body((const char *const *)&g, 1, stream ? ",\"stream\":true" : NULL),
                       400, one[5].says, got, sizeof got), "%s", got);
    response r;
    json_t *v = NULL;
    dsf_buf mb = {0};
    dsf_buf_appendf(&mb, "{\"model\":\"m\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
                         "\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"%s\"}}]}]}",
                    g + strlen("data:image/png;base64,"));
    dsf_buf_append(&mb, "", 1);
    CHECK(post(s.port, "/v1/messages", (const char *)mb.data, &r, &v) == 400);
    const json_t *am = json_at(v, "error.message"), *at = json_at(v, "type");
    CHECKF(json_is_string(am) && strstr(json_string_value(am), "no vision projector") && json_is_string(at) &&
               !strcmp(json_string_value(at), "error"), "%s", r.body.data);
    dsf_buf_free(&mb);
    json_decref(v);
    response_free(&r);
    CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0 && r.status == 200);
    v = body_json(&r);
    const json_t *caps = json_at(v, "data.0.capabilities");
    CHECKF(json_is_array(caps) && json_array_size(caps) == 1 && json_is_false(json_at(v, "data.0.meta.vision")), "%s",
           r.body.data);
    json_decref(v);
    response_free(&r);
    CHECK(test_server_stop(&s) == 0);

    START(s2, model, "--max-image-pixels 20000"); /* cap.png: 200 x 150 = 30000 pixels */
    CHECKF(refused(s2.port, "/v1/chat/completions", chat_body((const char *const *)&c, 1, NULL), 413,
                   "200 x 150 = 30000 pixels, over the limit of 20000 pixels per image (--max-image-pixels)", got, sizeof got),
           "%s", got);
    CHECK(test_server_stop(&s2) == 0);
    free(g);
    free(c);
}

/* log_softmax of a golden row. */
static void log_softmax(const float *x, int n, double *out) {
    double m = x[0], s = 0;
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - m);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - m - log(s);
}

/* Guards against an image request that reaches the model wrongly (the span not expanded, the
 * wrong rows, bias_vl or Engram DEAD lost on the way, the wrong projector numerics): the first
 * token's top logprobs equal the official golden's row after "</think>" (grad-plain), and the
 * prompt has the golden's token count; a stream with an image gives the same. */
TEST(serve_vision_golden_first_token) {
    NEED_SHARED(grad, VL "images/grad.png");
    NEED_SHARED(gj, VL "golden/grad-plain.json");
    NEED_SHARED(gf, VL "golden/grad-plain.f32");
    json_t *gold = test_load_json(gj);
    CHECK(gold);
    const json_t *span = json_at(gold, "images.0");
    int start = (int)json_integer_value(json_object_get(span, "start"));
    int len = (int)json_integer_value(json_object_get(span, "length"));
    int V = (int)json_integer_value(json_object_get(gold, "vocab"));
    int P = start + len + 2; /* the span, <｜Assistant｜>, </think>: the rendered chat-mode prompt */
    CHECKF(start == 14 && len == 17 && V == 1024, "golden: span (%d, %d), vocab %d", start, len, V);
    long fsize = 0;
    float *rows = (float *)test_slurp(gf, &fsize);
    CHECK(rows && fsize == (long)json_integer_value(json_object_get(gold, "rows")) * V * 4);
    test_server s;
    if (!start_vision(t, &s, NULL)) {
        free(rows);
        json_decref(gold);
        return;
    }
    char *g = data_url(grad);
    double *lp = dsf_xmalloc((size_t)V * sizeof *lp);
    log_softmax(rows + (size_t)(P - 1) * (size_t)V, V, lp);
    char *body = chat_body((const char *const *)&g, 1, ",\"logprobs\":true,\"top_logprobs\":5");
    response r;
    json_t *v = NULL;
    CHECKF(post(s.port, "/v1/chat/completions", body, &r, &v) == 200, "%s", r.body.data);
    CHECKF(json_integer_value(json_at(v, "usage.prompt_tokens")) == P, "prompt_tokens %lld, golden %d",
           (long long)json_integer_value(json_at(v, "usage.prompt_tokens")), P);
    const json_t *top = json_at(v, "choices.0.logprobs.content.0.top_logprobs");
    CHECKF(json_array_size(top) == 5, "%s", r.body.data);
    /* the ids come back as token text: compare the values, best first (atol: check_logits.py's
     * plain preset, 1e-3 on a logit, twice that on a log-softmax) */
    double sorted[5];
    for (int k = 0; k < 5; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool used = false;
            for (int q = 0; q < k; q++) used |= lp[i] == sorted[q];
            if (!used && (best < 0 || lp[i] > lp[best])) best = i;
        }
        sorted[k] = lp[best];
        double got = json_real_value(json_object_get(json_array_get(top, (size_t)k), "logprob"));
        CHECKF(fabs(got - sorted[k]) <= 2e-3, "top %d: logprob %.6f, golden %.6f", k, got, sorted[k]);
    }
    json_decref(v);
    response_free(&r);
    free(body);
    body = chat_body((const char *const *)&g, 1, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    CHECK(post(s.port, "/v1/chat/completions", body, &r, &v) == 200 && strstr(r.ctype, "text/event-stream"));
    sse ev;
    sse_decode((const char *)r.body.data, r.body.len, &ev);
    assembled a;
    assemble(&ev, &a);
    CHECKF(ev.done && a.usage && json_integer_value(json_object_get(a.usage, "prompt_tokens")) == P, "%s", r.body.data);
    assembled_free(&a);
    sse_free(&ev);
    json_decref(v);
    response_free(&r);
    free(body);
    CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    v = body_json(&r);
    CHECKF(json_is_true(json_at(v, "data.0.meta.vision")) && json_array_size(json_at(v, "data.0.capabilities")) == 2 &&
               !strcmp(json_string_value(json_at(v, "data.0.capabilities.1")), "vision"), "%s", r.body.data);
    json_decref(v);
    response_free(&r);
    CHECK(test_server_stop(&s) == 0);
    free(g);
    free(lp);
    free(rows);
    json_decref(gold);
}

static long long cached_of(int port, const char *url, const char *disk) {
    char *body = chat_body(&url, 1, NULL);
    response r;
    json_t *v = NULL;
    long long c = post(port, "/v1/chat/completions", body, &r, &v) == 200
                      ? json_integer_value(json_at(v, "usage.prompt_tokens_details.cached_tokens"))
                      : -1;
    if (c < 0) fprintf(stderr, "serve_vision (%s): %s\n", disk, r.body.data ? (char *)r.body.data : "no reply");
    free(body);
    json_decref(v);
    response_free(&r);
    return c;
}

/* Guards against serving an image from another image's state: the same text with another
 * image of the same span length (grad, tiny, wide: 17 tokens each, so the ids are identical)
 * is not reused past the span's start, in RAM (one slot) and from the disk cache (a restarted
 * server, where grad's and tiny's states are stored and wide's is not); the same image is
 * reused through its span. Also: a PNG whose header is fine but
 * whose data is not gets 400 from the decoder, streamed or not. */
TEST(serve_vision_prefix_reuse_keys_on_the_image) {
    NEED_SHARED(grad, VL "images/grad.png");
    NEED_SHARED(tiny, VL "images/tiny.png");
    NEED_SHARED(wide, VL "images/wide.png");
    const char *dir = test_tmpfile("vision-cache");
    char extra[600];
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1", dir);
    test_server s;
    if (!start_vision(t, &s, extra)) return;
    char *g = data_url(grad), *ti = data_url(tiny), *w = data_url(wide);
    const int span_start = 14, span_end = 31; /* grad-plain.json: images.0 (14, 17) */
    CHECK(cached_of(s.port, g, "ram") == 0);
    long long same = cached_of(s.port, g, "ram"), other = cached_of(s.port, ti, "ram");
    CHECKF(same >= span_end && other >= 0 && other <= span_start, "same image: %lld cached, other: %lld", same, other);
    /* broken image data behind a valid header: the decoder's 400, also for a stream */
    long n = 0;
    unsigned char *png = test_slurp(grad, &n);
    CHECK(png && n > 100);
    for (long i = 60; i < n; i++) png[i] ^= 0x5A;
    char bad[256];
    snprintf(bad, sizeof bad, "%s", test_tmpfile("vision-bad.png"));
    FILE *f = fopen(bad, "wb");
    CHECK(f && fwrite(png, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0);
    free(png);
    char *b = data_url(bad);
    char got[4096];
    for (int stream = 0; stream < 2; stream++)
        CHECKF(refused(s.port, "/v1/chat/completions", chat_body((const char *const *)&b, 1, stream ? ",\"stream\":true" : NULL),
                       400, "image 1:", got, sizeof got), "%s", got);
    CHECK(test_server_stop(&s) == 0);
    /* a restarted server: only the disk cache holds states */
    test_server s2;
    snprintf(extra, sizeof extra, "--cache-dir %s --cache-max-gb 1", dir);
    setenv("DSF_PCACHE_RESTORE", "always", 1);
    bool ok = start_vision(t, &s2, extra);
    unsetenv("DSF_PCACHE_RESTORE");
    CHECK(ok);
    other = cached_of(s2.port, w, "disk, a third image");
    CHECKF(other >= 0 && other <= span_start, "a third image restored %lld tokens from disk", other);
    same = cached_of(s2.port, g, "disk, the first image");
    CHECKF(same >= span_end, "the first image restored %lld tokens from disk", same);
    CHECK(test_server_stop(&s2) == 0);
    free(g);
    free(ti);
    free(w);
    free(b);
}

/* Guards against image requests the official SDKs cannot send or parse: the openai client's
 * image_url (chat) and input_image (Responses) parts and the Anthropic client's base64 image
 * block are answered, streamed, and a remote URL raises the SDKs' BadRequestError. */
TEST(serve_vision_sdk) {
    static const char *const need[] = {"openai/package.json", "@anthropic-ai/sdk/package.json", NULL};
    char why[512];
    const char *skip = test_npm_ready(need, why, sizeof why);
    if (skip) SKIP("%s", skip);
    NEED_SHARED(grad, VL "images/grad.png");
    char abs[4096];
    CHECK(realpath(grad, abs)); /* node runs in tests/npm */
    test_server s;
    if (!start_vision(t, &s, "--api-key sk-vision --slots 2")) return;
    char cmd[6000];
    snprintf(cmd, sizeof cmd,
             "cd tests/npm && DSF_BASE_URL=http://127.0.0.1:%d DSF_API_KEY=sk-vision DSF_MODEL=tinyvl.gguf "
             "DSF_IMAGE=%s timeout 600 node --test --test-reporter=spec sdk/vision.test.mjs 2>&1",
             s.port, abs);
    static char out[1 << 16];
    int rc = test_run(cmd, out, sizeof out);
    size_t n = strlen(out);
    CHECKF(rc == 0, "node --test sdk/vision.test.mjs failed (rc %d); server log %s; last output:\n%s", rc, s.log,
           n > 6000 ? out + n - 6000 : out);
    CHECK(test_server_stop(&s) == 0);
}

/* Guards against `dsflash run` / `chat` dropping or misplacing --image: run's prompt has the
 * golden's token count (grad-plain: the span (14, 17), then <｜Assistant｜></think>: 33), a chat's
 * second turn reuses its first (image included), and --image without --mmproj is refused. */
TEST(serve_vision_cli_run_and_chat) {
    NEED_SHARED(model, VL "tinyvl.gguf");
    NEED_SHARED(proj, VL "mmproj-tinyvl-f32.gguf");
    NEED_SHARED(grad, VL "images/grad.png");
    char cmd[4096];
    static char out[1 << 14];
    snprintf(cmd, sizeof cmd, "%s run -m %s --image %s -p x 2>&1", test_bin(), model, grad);
    CHECK(test_run(cmd, out, sizeof out) != 0 && strstr(out, "--image needs the vision projector: --mmproj FILE"));
    snprintf(cmd, sizeof cmd, "%s run -m %s --mmproj %s --image %s -p '" Q "' --no-think -n 2 --temp 0 --numerics plain "
             "--threads 1 2>&1", test_bin(), model, proj, grad);
    int rc = test_run(cmd, out, sizeof out);
    if (rc && (strstr(out, "no vision tower") || strstr(out, "cannot read image spans")))
        SKIP("this build's vision tower or text side is a placeholder");
    CHECKF(rc == 0 && strstr(out, "prompt 33 tokens (0 cached"), "%s", out);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nagain\\n' | %s chat -m %s --mmproj %s --image %s --no-think -n 2 --temp 0 "
             "--numerics plain --threads 1 2>&1", test_bin(), model, proj, grad);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    const char *second = strstr(out, "[chat] prompt");
    second = second ? strstr(second + 1, "[chat] prompt") : NULL;
    int p = 0, c = 0;
    CHECKF(second && sscanf(second, "[chat] prompt %d tokens (%d cached", &p, &c) == 2 && c > 20 && p > c, "%s", out);
}
