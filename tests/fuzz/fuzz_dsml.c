/* fuzz_dsml.c: libFuzzer harness for the V4.1 output parser (src/text/dsml.c): reasoning /
 * content / DSML tool calls, streaming and one-shot, strict and tolerant.
 *
 * Input: byte 0 = flags (bit 0 thinking, bit 1 append the EOS string, bit 2 parallel tool
 * calls in the reply), bytes 1..8 = seed of
 * the stream's split points, the rest = generated text (any bytes). Checks:
 *   - the stream's events do not depend on how the text is split: one feed and random
 *     splits (down to single bytes) give the same reasoning, content and tool calls;
 *   - every text delta is valid UTF-8 (invalid input bytes become U+FFFD);
 *   - the tolerant result is the accumulation of the events (spec §3.3), never fails, and
 *     dsf_dsml_parse gives the same; strict mode equals dsml_parse_official on the text
 *     (with EOS appended when absent), success and error alike;
 *   - dsf_dsml_result_json is valid JSON, and so is the server's chat reply built from the
 *     tolerant result (srv_chat_reply: what a client receives). */
#include "fuzz_common.h"
#include "text/dsml.h"
#include "server/server.h"

#include <jansson.h>

typedef struct {
    dsf_buf reasoning, content;
    int n_calls, cap;
    struct fz_dsml_call { dsf_buf name, ns, args; bool has_ns, ended; } *calls;
} fz_dsml_rec;

static void fz_dsml_cb(void *ud, const dsf_dsml_event *ev) {
    fz_dsml_rec *r = ud;
    if (ev->type == DSF_DSML_REASONING || ev->type == DSF_DSML_CONTENT || ev->type == DSF_DSML_TOOL_ARGS)
        FZ_REQUIRE(fz_utf8_valid((const uint8_t *)ev->text, ev->len), "event %d: invalid UTF-8 text", ev->type);
    switch (ev->type) {
    case DSF_DSML_REASONING: dsf_buf_append(&r->reasoning, ev->text, ev->len); break;
    case DSF_DSML_CONTENT: dsf_buf_append(&r->content, ev->text, ev->len); break;
    case DSF_DSML_TOOL_START:
        FZ_REQUIRE(ev->index == r->n_calls, "TOOL_START index %d, expected %d", ev->index, r->n_calls);
        FZ_REQUIRE(r->n_calls == 0 || r->calls[r->n_calls - 1].ended, "TOOL_START before the previous TOOL_END");
        FZ_REQUIRE(ev->name != NULL, "TOOL_START without a name");
        if (r->n_calls == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 4;
            r->calls = dsf_xrealloc(r->calls, (size_t)r->cap * sizeof *r->calls);
        }
        memset(&r->calls[r->n_calls], 0, sizeof r->calls[0]);
        dsf_buf_append(&r->calls[r->n_calls].name, ev->name, strlen(ev->name));
        if (ev->ns) {
            r->calls[r->n_calls].has_ns = true;
            dsf_buf_append(&r->calls[r->n_calls].ns, ev->ns, strlen(ev->ns));
        }
        r->n_calls++;
        break;
    case DSF_DSML_TOOL_ARGS:
        FZ_REQUIRE(ev->index == r->n_calls - 1 && !r->calls[ev->index].ended, "TOOL_ARGS for call %d", ev->index);
        dsf_buf_append(&r->calls[ev->index].args, ev->text, ev->len);
        break;
    case DSF_DSML_TOOL_END:
        FZ_REQUIRE(ev->index == r->n_calls - 1 && !r->calls[ev->index].ended, "TOOL_END for call %d", ev->index);
        r->calls[ev->index].ended = true;
        break;
    default: FZ_REQUIRE(0, "unknown event type %d", ev->type);
    }
}

static void fz_dsml_rec_free(fz_dsml_rec *r) {
    dsf_buf_free(&r->reasoning);
    dsf_buf_free(&r->content);
    for (int i = 0; i < r->n_calls; i++) {
        dsf_buf_free(&r->calls[i].name);
        dsf_buf_free(&r->calls[i].ns);
        dsf_buf_free(&r->calls[i].args);
    }
    free(r->calls);
}

static bool fz_buf_eq(const dsf_buf *a, const dsf_buf *b) {
    return a->len == b->len && (a->len == 0 || !memcmp(a->data, b->data, a->len));
}

static bool fz_bytes_eq(const dsf_buf *a, const char *s, size_t n) {
    return a->len == n && (n == 0 || !memcmp(a->data, s, n));
}

static void fz_dsml_rec_eq(const fz_dsml_rec *a, const fz_dsml_rec *b, const char *what) {
    FZ_REQUIRE(fz_buf_eq(&a->reasoning, &b->reasoning), "%s: reasoning differs with the split", what);
    FZ_REQUIRE(fz_buf_eq(&a->content, &b->content), "%s: content differs with the split", what);
    FZ_REQUIRE(a->n_calls == b->n_calls, "%s: %d vs %d tool calls with the split", what, a->n_calls, b->n_calls);
    for (int i = 0; i < a->n_calls; i++) {
        FZ_REQUIRE(fz_buf_eq(&a->calls[i].name, &b->calls[i].name) && a->calls[i].has_ns == b->calls[i].has_ns &&
                       fz_buf_eq(&a->calls[i].ns, &b->calls[i].ns) && fz_buf_eq(&a->calls[i].args, &b->calls[i].args) &&
                       a->calls[i].ended == b->calls[i].ended,
                   "%s: tool call %d differs with the split", what, i);
    }
}

static bool fz_dsml_result_eq(const dsf_dsml_result *a, const dsf_dsml_result *b) {
    if (a->reasoning_len != b->reasoning_len || a->content_len != b->content_len || a->n_calls != b->n_calls)
        return false;
    if (a->reasoning_len && memcmp(a->reasoning, b->reasoning, a->reasoning_len)) return false;
    if (a->content_len && memcmp(a->content, b->content, a->content_len)) return false;
    for (int i = 0; i < a->n_calls; i++) {
        const dsf_tool_call *x = &a->calls[i], *y = &b->calls[i];
        if (strcmp(x->name, y->name) || strcmp(x->arguments, y->arguments) || !x->ns != !y->ns ||
            (x->ns && strcmp(x->ns, y->ns)))
            return false;
    }
    return true;
}

static void fz_dsml_check_json(const dsf_dsml_result *r) {
    char *js = dsf_dsml_result_json(r);
    json_error_t je;
    json_t *v = json_loads(js, JSON_ALLOW_NUL, &je);
    FZ_REQUIRE(v != NULL, "dsf_dsml_result_json is not JSON: %s", je.text);
    json_decref(v);
    free(js);
}

static void fz_dsml_check_reply(const dsf_dsml_result *r, bool parallel) {
    srv_meta m = {.id = "chatcmpl-fuzz", .model = "m", .created = 1};
    srv_usage u = {1, 2, 0};
    char(*ids)[32] = dsf_xcalloc((size_t)(r->n_calls ? r->n_calls : 1), 32);
    uint64_t rng = 1;
    for (int i = 0; i < r->n_calls; i++) srv_call_id(ids[i], &rng);
    json_t *o = srv_chat_reply(&m, r, ids, "stop", &u, NULL, 0, NULL, parallel);
    FZ_REQUIRE(o != NULL, "srv_chat_reply returned NULL");
    char *js = json_dumps(o, JSON_COMPACT);
    FZ_REQUIRE(js != NULL, "the chat reply does not serialize");
    json_error_t je;
    json_t *v = json_loads(js, JSON_ALLOW_NUL, &je);
    FZ_REQUIRE(v != NULL, "the chat reply is not JSON: %s", je.text);
    json_t *msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    size_t n_calls = json_array_size(json_object_get(msg, "tool_calls"));
    FZ_REQUIRE(n_calls == (size_t)(parallel || r->n_calls < 1 ? r->n_calls : 1), "reply has %zu tool calls of %d",
               n_calls, r->n_calls);
    json_decref(v);
    free(js);
    json_decref(o);
    free(ids);
}

/* Streams text through a parser, split at points drawn from seed (seed 0: one feed). */
static int fz_dsml_stream(const char *text, size_t n, bool thinking, bool strict, uint64_t seed, fz_dsml_rec *rec,
                          dsf_dsml_result *out, char *err) {
    dsf_dsml_parser *p = dsf_dsml_parser_new(thinking, strict);
    memset(rec, 0, sizeof *rec);
    size_t off = 0;
    uint64_t s = seed;
    while (off < n) {
        size_t take = n - off;
        if (seed) {
            uint64_t r = fz_rand(&s);
            /* mostly short pieces (what a token stream gives), sometimes single bytes */
            take = (r & 3) == 0 ? 1 : 1 + (size_t)((r >> 8) % 24);
            if (take > n - off) take = n - off;
        }
        dsf_dsml_feed(p, text + off, take, fz_dsml_cb, rec);
        off += take;
    }
    if (seed & 1) dsf_dsml_feed(p, text + n, 0, fz_dsml_cb, rec); /* an empty feed is harmless */
    int rc = dsf_dsml_finish(p, fz_dsml_cb, rec, out, err);
    dsf_dsml_parser_free(p);
    return rc;
}

static int fz_dsml_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    uint64_t seed = (uint64_t)fz_u32(&in) | (uint64_t)fz_u32(&in) << 32;
    bool thinking = flags & 1;
    dsf_buf text = {0};
    dsf_buf_append(&text, in.p, in.n);
    if (flags & 2) dsf_buf_append(&text, "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 27);
    const char *t = text.data ? (const char *)text.data : "";
    char err[DSF_ERR_LEN] = "", err2[DSF_ERR_LEN] = "";

    /* tolerant: whole vs split, events vs result */
    fz_dsml_rec whole, split;
    dsf_dsml_result rw, rs;
    FZ_REQUIRE(fz_dsml_stream(t, text.len, thinking, false, 0, &whole, &rw, err) == 0, "tolerant mode failed: %s", err);
    FZ_REQUIRE(fz_dsml_stream(t, text.len, thinking, false, seed | 2, &split, &rs, err) == 0, "tolerant mode failed");
    fz_dsml_rec_eq(&whole, &split, "tolerant");
    FZ_REQUIRE(fz_dsml_result_eq(&rw, &rs), "tolerant result differs with the split");
    FZ_REQUIRE(fz_bytes_eq(&whole.reasoning, rw.reasoning, rw.reasoning_len), "tolerant reasoning != its events");
    FZ_REQUIRE(fz_bytes_eq(&whole.content, rw.content, rw.content_len), "tolerant content != its events");
    FZ_REQUIRE(rw.n_calls == whole.n_calls, "tolerant result has %d calls, events %d", rw.n_calls, whole.n_calls);
    for (int i = 0; i < rw.n_calls; i++) {
        FZ_REQUIRE(whole.calls[i].ended, "tool call %d in the result never got TOOL_END", i);
        const dsf_tool_call *c = &rw.calls[i];
        FZ_REQUIRE(fz_bytes_eq(&whole.calls[i].name, c->name, strlen(c->name)), "call %d name != TOOL_START's", i);
        FZ_REQUIRE(fz_bytes_eq(&whole.calls[i].args, c->arguments, strlen(c->arguments)),
                   "call %d arguments != its TOOL_ARGS", i);
    }
    FZ_REQUIRE(fz_utf8_valid((const uint8_t *)rw.reasoning, rw.reasoning_len) &&
                   fz_utf8_valid((const uint8_t *)rw.content, rw.content_len), "tolerant result is not UTF-8");
    fz_dsml_check_json(&rw);
    fz_dsml_check_reply(&rw, flags & 4);
    dsf_dsml_result r1;
    FZ_REQUIRE(dsf_dsml_parse(t, text.len, thinking, false, &r1, err) == 0, "one-shot tolerant parse failed");
    FZ_REQUIRE(fz_dsml_result_eq(&rw, &r1), "one-shot tolerant result != streamed");
    dsf_dsml_result_free(&r1);
    dsf_dsml_result_free(&rw);
    dsf_dsml_result_free(&rs);

    /* strict: same events as tolerant; the result is the official parser's */
    fz_dsml_rec sw;
    dsf_dsml_result rst;
    int rc = fz_dsml_stream(t, text.len, thinking, true, seed, &sw, &rst, err);
    fz_dsml_rec_eq(&whole, &sw, "strict vs tolerant events");
    if (fz_utf8_valid(text.data, text.len)) {
        /* The stream hands the official parser its sanitized text (U+FFFD for invalid
         * bytes), so the two are comparable on valid UTF-8 only. */
        dsf_buf full = {0};
        dsf_buf_append(&full, t, text.len);
        if (!memmem(t, text.len, "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 27))
            dsf_buf_append(&full, "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 27);
        dsf_dsml_result ro;
        int rco = dsml_parse_official((const char *)full.data, full.len, thinking, &ro, err2);
        FZ_REQUIRE(rc == rco, "strict stream returned %d, official parser %d", rc, rco);
        if (rc == 0) {
            FZ_REQUIRE(fz_dsml_result_eq(&rst, &ro), "strict stream result != official parser's");
            dsf_dsml_result_free(&ro);
        } else {
            FZ_REQUIRE(err[0] && !strcmp(err, err2), "strict errors differ: '%s' vs '%s'", err, err2);
        }
        dsf_buf_free(&full);
    }
    if (rc == 0) fz_dsml_check_json(&rst);
    else
        FZ_REQUIRE(err[0] && rst.n_calls == 0 && !rst.reasoning && !rst.content,
                   "failed strict parse: no message, or a result left");
    dsf_dsml_result_free(&rst);
    fz_dsml_rec_free(&whole);
    fz_dsml_rec_free(&split);
    fz_dsml_rec_free(&sw);
    dsf_buf_free(&text);
    return rc == 0; /* the strict parser accepted it */
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_dsml_one(data, size);
    return 0;
}
#endif
