/* dsml.c: the V4.1 output parser (reasoning / content / DSML tool calls).
 * Guards against: drift from the official parser on the fixture parse cases (results and
 * errors), streaming results that depend on how the text is split, partial markers leaking
 * into content deltas, the llama.cpp PR behaviours (bare </think>, tool call inside the
 * reasoning, block without the blank line, parallel calls), tolerant mode failing or
 * crashing on malformed output (deterministic fuzz; the ASan run is the real check). */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsflash.h"
#include "text/dsml.h"
#include "text/pyjson.h"
#include "base/util.h"

#define EOS "<｜end▁of▁sentence｜>"

/* ==== helpers ============================================================================== */

typedef struct {
    dsf_buf reasoning, content;
    dsf_buf args[16];
    char names[16][64];
    int n_start, n_end, bad_order;
    int partial_marker; /* a content/reasoning delta ended with a proper prefix of a marker */
} collector;

static bool ends_with_marker_prefix(const char *s, size_t n) {
    static const char *const marks[] = {"<｜DSML｜", "</think>"};
    for (int m = 0; m < 2; m++) {
        size_t ml = strlen(marks[m]);
        for (size_t l = 2; l < ml && l <= n; l++) /* "<" alone may be real text; 2+ bytes of a marker may not */
            if (!memcmp(s + n - l, marks[m], l)) return true;
    }
    return false;
}

static void collect(void *ud, const dsf_dsml_event *ev) {
    collector *c = ud;
    switch (ev->type) {
    case DSF_DSML_REASONING:
    case DSF_DSML_CONTENT:
        dsf_buf_append(ev->type == DSF_DSML_REASONING ? &c->reasoning : &c->content, ev->text, ev->len);
        if (ends_with_marker_prefix(ev->text, ev->len)) c->partial_marker = 1;
        break;
    case DSF_DSML_TOOL_START:
        if (ev->index != c->n_start) c->bad_order = 1;
        if (ev->index < 16) snprintf(c->names[ev->index], 64, "%s%s%s", ev->ns ? ev->ns : "", ev->ns ? "::" : "", ev->name);
        c->n_start++;
        break;
    case DSF_DSML_TOOL_ARGS:
        if (ev->index != c->n_start - 1) c->bad_order = 1;
        if (ev->index < 16) dsf_buf_append(&c->args[ev->index], ev->text, ev->len);
        break;
    case DSF_DSML_TOOL_END:
        if (ev->index != c->n_end) c->bad_order = 1;
        c->n_end++;
        break;
    }
}

static void collector_free(collector *c) {
    dsf_buf_free(&c->reasoning);
    dsf_buf_free(&c->content);
    for (int i = 0; i < 16; i++) dsf_buf_free(&c->args[i]);
}

static bool buf_is(const dsf_buf *b, const char *s, size_t n) {
    return b->len == n && (n == 0 || !memcmp(b->data, s, n));
}

/* Feeds text in pieces (split = 0: all at once, 1: byte by byte, else random sizes from
 * seed); returns the JSON of the final result (or "ERROR: msg"), checks the events agree. */
static char *stream_parse(const char *text, size_t n, bool thinking, bool strict, int split, uint32_t seed,
                          collector *c) {
    dsf_dsml_parser *p = dsf_dsml_parser_new(thinking, strict);
    size_t i = 0;
    while (i < n) {
        size_t k = n - i;
        if (split == 1) k = 1;
        else if (split == 2) {
            seed = seed * 1664525u + 1013904223u;
            k = 1 + (seed >> 16) % 23;
            if (k > n - i) k = n - i;
        }
        dsf_dsml_feed(p, text + i, k, collect, c);
        i += k;
    }
    dsf_dsml_result r;
    char err[DSF_ERR_LEN] = "";
    int rc = dsf_dsml_finish(p, collect, c, &r, err);
    dsf_dsml_parser_free(p);
    char *json;
    if (rc) {
        size_t l = strlen(err) + 8;
        json = malloc(l);
        snprintf(json, l, "ERROR: %s", err);
    } else {
        json = dsf_dsml_result_json(&r);
        dsf_dsml_result_free(&r);
    }
    return json;
}

/* Expected JSON for (reasoning, content, calls...) in dsf_dsml_result_json's format. */
static char *expect_json(const char *reasoning, const char *content, int n, const char *const *names,
                         const char *const *args) {
    dsf_dsml_result r = {0};
    r.reasoning = (char *)reasoning;
    r.reasoning_len = strlen(reasoning);
    r.content = (char *)content;
    r.content_len = strlen(content);
    dsf_tool_call calls[8];
    for (int i = 0; i < n; i++) {
        const char *sep = strstr(names[i], "::");
        calls[i].ns = sep ? strndup(names[i], (size_t)(sep - names[i])) : NULL;
        calls[i].name = (char *)(sep ? sep + 2 : names[i]);
        calls[i].arguments = (char *)args[i];
    }
    r.calls = calls;
    r.n_calls = n;
    char *j = dsf_dsml_result_json(&r);
    for (int i = 0; i < n; i++) free(calls[i].ns);
    return j;
}

/* ==== official parse fixtures ================================================================ */

static json_t *load_json(const char *path) {
    uint8_t *d;
    size_t n;
    if (dsf_read_file(path, &d, &n, NULL)) return NULL;
    json_t *v = pyjson_loads((const char *)d, n, NULL);
    free(d);
    return v;
}

/* The fixture's expected_parsed (official OpenAI shape) in dsf_dsml_result_json's shape. */
static char *expected_from_fixture(const json_t *ep) {
    const json_t *tcs = json_object_get(ep, "tool_calls");
    const char *names[8], *args[8];
    char qn[8][256];
    size_t n = json_array_size(tcs);
    if (n > 8) n = 8;
    for (size_t i = 0; i < n; i++) {
        const json_t *tc = json_array_get(tcs, i);
        const json_t *fn = json_object_get(tc, "function");
        const char *ns = json_string_value(json_object_get(tc, "namespace"));
        snprintf(qn[i], sizeof qn[i], "%s%s%s", ns ? ns : "", ns ? "::" : "", json_string_value(json_object_get(fn, "name")));
        names[i] = qn[i];
        args[i] = json_string_value(json_object_get(fn, "arguments"));
    }
    return expect_json(json_string_value(json_object_get(ep, "reasoning_content")),
                       json_string_value(json_object_get(ep, "content")), (int)n, names, args);
}

static void run_parse_fixture(test_ctx *t, const char *path, const char *label) {
    json_t *fx = load_json(path);
    CHECKF(fx, "cannot load %s", path);
    const json_t *cases = json_object_get(fx, "parse_cases");
    size_t n = json_array_size(cases), ok = 0;
    char first[1024] = "";
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *comp = json_object_get(c, "completion");
        bool thinking = !strcmp(json_string_value(json_object_get(c, "thinking_mode")), "thinking");
        dsf_buf text = {0};
        dsf_buf_append(&text, json_string_value(comp), json_string_length(comp));
        dsf_buf_append(&text, EOS, strlen(EOS));
        const json_t *ep = json_object_get(c, "expected_parsed");
        char *want = ep ? expected_from_fixture(ep) : NULL;
        bool good = true;
        /* the official parser on completion + EOS, and the streaming parser in strict mode fed
         * the completion without EOS in three different splits */
        for (int mode = 0; mode < 4 && good; mode++) {
            char *got;
            collector col = {0};
            if (mode == 0) {
                dsf_dsml_result r;
                char err[DSF_ERR_LEN] = "";
                if (dsml_parse_official((const char *)text.data, text.len, thinking, &r, err)) {
                    size_t l = strlen(err) + 8;
                    got = malloc(l);
                    snprintf(got, l, "ERROR: %s", err);
                } else {
                    got = dsf_dsml_result_json(&r);
                    dsf_dsml_result_free(&r);
                }
            } else {
                got = stream_parse(json_string_value(comp), json_string_length(comp), thinking, true, mode - 1, 7, &col);
            }
            if (want) good = !strcmp(got, want);
            else good = !strncmp(got, "ERROR: ", 7); /* expected_error_type: the official parser raises */
            if (!good && !first[0]) snprintf(first, sizeof first, "%s (mode %d): got %s want %s", name, mode, got, want ? want : "an error");
            free(got);
            collector_free(&col);
        }
        ok += good;
        free(want);
        dsf_buf_free(&text);
    }
    json_decref(fx);
    printf("     %s: %zu/%zu parse cases pass (strict)\n", label, ok, n);
    CHECKF(ok == n, "%s", first);
}

TEST(dsml_fixture_official_parse_cases) {
    NEED_SHARED(p, "fixtures/chat/official_test_encoding_assertions.json");
    run_parse_fixture(t, p, "official_test_encoding_assertions");
}

/* Held back from this repository (chat-format.md §6): strict column only. */
TEST(dsml_fixture_apathy_atlas_parse) {
    NEED_SHARED(p, "fixtures/chat/peer_apathy_atlas_parse.json");
    json_t *fx = load_json(p);
    CHECK(fx);
    size_t n = json_array_size(json_object_get(fx, "parse_cases"));
    json_decref(fx);
    if (!n) SKIP("peer_apathy_atlas_parse.json has no parse_cases array (schema differs)");
    run_parse_fixture(t, p, "peer_apathy_atlas_parse");
}

/* Every assistant turn rendered by the encoder fixtures parses back to itself: the official
 * round trip (test_v41_parses_spaced_dsml_roundtrip), for every split. */
TEST(dsml_roundtrip_render_fixtures) {
    static const char *full =
        "  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n<｜DSML｜ parameter "
        "name=\"query\" string=\"true\">value</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"limit\" "
        "string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"f\">\n\n</｜DSML｜ "
        "invoke>\n</｜DSML｜ calls>" EOS;
    const char *names[] = {"lookup", "f"}, *args[] = {"{\"query\": \"value\", \"limit\": 2}", "{}"};
    char *want = expect_json("  reason  ", "summary", 2, names, args);
    for (int strict = 0; strict < 2; strict++)
        for (int split = 0; split < 3; split++) {
            collector c = {0};
            char *got = stream_parse(full, strlen(full), true, strict, split, 99, &c);
            CHECKF(!strcmp(got, want), "strict %d split %d: %s", strict, split, got);
            CHECKF(buf_is(&c.reasoning, "  reason  ", 10) && buf_is(&c.content, "summary", 7), "deltas differ");
            CHECKF(c.n_start == 2 && c.n_end == 2 && !c.bad_order && !c.partial_marker, "events");
            CHECKF(!strcmp(c.names[0], "lookup") && buf_is(&c.args[0], args[0], strlen(args[0])), "call 0 events");
            free(got);
            collector_free(&c);
        }
    free(want);
}

/* ==== the official parser's errors (encoding.py behaviour, spec §3.2) ======================== */

TEST(dsml_strict_errors) {
    static const struct { const char *text; bool thinking; const char *err; } tab[] = {
        {"no close" EOS, true, "Invalid thinking format: missing </think>"},
        {"r\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>" EOS, true, "Invalid thinking format: missing </think>"},
        {"no eos", false, "Invalid format: missing EOS token"},
        {"a" EOS "b", false, "Unexpected content at end"},
        {"a<think>b" EOS, false, "Unexpected special token '<think>' in content"},
        {"a</think>b" EOS, false, "Unexpected special token '</think>' in content"},
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ "
         "parameter>\n<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
         "</｜DSML｜ calls>" EOS, false, "Duplicate parameter name: 'a'"},
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\nmore" EOS, false,
         "Unexpected content after tool calls"},
        {"\n\n<｜DSML｜ calls><｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" EOS, false,
         "Tool call format error: expected '>\\n' but got '>'"},
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nam=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" EOS, false,
         "Tool name format error: ' nam=\"f\">\n'"},
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" string=\"rust\">"
         "</｜DSML｜ invoke>\n</｜DSML｜ calls>" EOS, false, NULL /* Parameter format error */},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        dsf_dsml_result r;
        char err[DSF_ERR_LEN] = "";
        int rc = dsml_parse_official(tab[i].text, strlen(tab[i].text), tab[i].thinking, &r, err);
        CHECKF(rc == -1, "case %zu parsed", i);
        if (tab[i].err) CHECKF(!strcmp(err, tab[i].err), "case %zu: '%s' want '%s'", i, err, tab[i].err);
        else CHECKF(!strncmp(err, "Parameter format error", 22), "case %zu: %s", i, err);
    }
    /* regex corner cases the official parser accepts: an empty invoke with two newlines,
     * leading whitespace before name=, a value containing '<', quotes and newlines */
    const char *ok = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke  name=\"f\">\n\n</｜DSML｜ invoke>\n<｜DSML｜ invoke "
                     "name=\"g\">\n<｜DSML｜ parameter name=\"v\" string=\"true\">a<b \"c\"\nd</｜DSML｜ parameter>\n"
                     "</｜DSML｜ invoke>\n</｜DSML｜ calls>" EOS;
    dsf_dsml_result r;
    char err[DSF_ERR_LEN] = "";
    CHECKF(dsml_parse_official(ok, strlen(ok), false, &r, err) == 0, "%s", err);
    CHECK(r.n_calls == 2 && !strcmp(r.calls[0].arguments, "{}") &&
          !strcmp(r.calls[1].arguments, "{\"v\": \"a<b \\\"c\\\"\\nd\"}"));
    dsf_dsml_result_free(&r);
    /* string="false" is copied verbatim, not validated (official quirk) */
    const char *bad_json = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"n\" "
                           "string=\"false\">{oops</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" EOS;
    CHECK(dsml_parse_official(bad_json, strlen(bad_json), false, &r, err) == 0);
    CHECK(!strcmp(r.calls[0].arguments, "{\"n\": {oops}"));
    dsf_dsml_result_free(&r);
    /* ... while tolerant mode degrades it to a string */
    CHECK(dsf_dsml_parse(bad_json, strlen(bad_json), false, false, &r, err) == 0);
    CHECKF(!strcmp(r.calls[0].arguments, "{\"n\": \"{oops\"}"), "%s", r.calls[0].arguments);
    dsf_dsml_result_free(&r);
}

/* ==== llama.cpp PR behaviours (tests/test-chat.cpp, deepseek-v4.1-min) ======================== */

typedef struct {
    const char *text;
    bool thinking;
    const char *reasoning, *content;
    int n;
    const char *names[2], *args[2];
} pr_case;

TEST(dsml_seed_behaviours) {
    static const pr_case tab[] = {
        {"Hello, world!\nWhat's up?", false, "", "Hello, world!\nWhat's up?", 0, {0}, {0}},
        {"I'm\nthinking</think>Hello, world!\nWhat's up?", true, "I'm\nthinking", "Hello, world!\nWhat's up?", 0, {0}, {0}},
        {"Let me check the time</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter "
         "name=\"city\" string=\"true\">Tokyo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
         true, "Let me check the time", "", 1, {"get_time"}, {"{\"city\": \"Tokyo\"}"}},
        /* block right at the start, no blank line (tolerant) */
        {"<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"special_function\">\n<｜DSML｜ parameter name=\"arg1\" "
         "string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
         false, "", "", 1, {"special_function"}, {"{\"arg1\": 1}"}},
        {"Calling both</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"city\" "
         "string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"get_weather\">\n"
         "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
         true, "Calling both", "", 2, {"get_time", "get_weather"}, {"{\"city\": \"Paris\"}", "{\"city\": \"Paris\"}"}},
        /* continuation inside the reasoning */
        {" thinking</think>Hello, world!\nWhat's up?", true, " thinking", "Hello, world!\nWhat's up?", 0, {0}, {0}},
        /* a bare </think>: continuation without reasoning renders <｜Assistant｜></think> */
        {"</think>Hello", true, "", "Hello", 0, {0}, {0}},
        {"</think>Hello", false, "", "Hello", 0, {0}, {0}},
        /* tool call inside the reasoning, no </think> */
        {"Let me check the time\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter "
         "name=\"city\" string=\"true\">Tokyo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
         true, "Let me check the time", "", 1, {"get_time"}, {"{\"city\": \"Tokyo\"}"}},
        /* chat mode, empty content (common_chat_session test) */
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">"
         "Tokyo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
         false, "", "", 1, {"get_time"}, {"{\"city\": \"Tokyo\"}"}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char *want = expect_json(tab[i].reasoning, tab[i].content, tab[i].n, tab[i].names, tab[i].args);
        for (int split = 0; split < 3; split++) {
            collector c = {0};
            char *got = stream_parse(tab[i].text, strlen(tab[i].text), tab[i].thinking, false, split, (uint32_t)i, &c);
            CHECKF(!strcmp(got, want), "case %zu split %d: %s\nwant %s", i, split, got, want);
            CHECKF(buf_is(&c.reasoning, tab[i].reasoning, strlen(tab[i].reasoning)) &&
                   buf_is(&c.content, tab[i].content, strlen(tab[i].content)) && c.n_end == tab[i].n && !c.bad_order,
                   "case %zu split %d: streamed events disagree with the result", i, split);
            free(got);
            collector_free(&c);
        }
        free(want);
    }
}

/* ==== streaming: holding back partial markers ================================================ */

TEST(dsml_stream_holds_partial_markers) {
    dsf_dsml_parser *p = dsf_dsml_parser_new(false, false);
    collector c = {0};
    const char *part = "Hello\n\n<｜DSML｜ inv";
    dsf_dsml_feed(p, part, strlen(part), collect, &c);
    CHECKF(buf_is(&c.content, "Hello", 5), "content so far: '%.*s'", (int)c.content.len, c.content.data ? (char *)c.content.data : "");
    const char *rest = "oke name=\"f\">\n</｜DSML｜ invoke>";
    dsf_dsml_feed(p, rest, strlen(rest), collect, &c);
    CHECK(c.n_start == 1 && c.n_end == 1 && !strcmp(c.names[0], "f"));
    dsf_dsml_result r;
    char err[DSF_ERR_LEN];
    CHECK(dsf_dsml_finish(p, collect, &c, &r, err) == 0);
    CHECK(r.n_calls == 1 && !strcmp(r.calls[0].arguments, "{}") && r.content_len == 5);
    dsf_dsml_result_free(&r);
    dsf_dsml_parser_free(p);
    collector_free(&c);

    /* text that only looks like a marker start is released once disproved */
    p = dsf_dsml_parser_new(true, false);
    collector d = {0};
    const char *s1 = "a </th";
    dsf_dsml_feed(p, s1, strlen(s1), collect, &d);
    CHECK(buf_is(&d.reasoning, "a ", 2));
    dsf_dsml_feed(p, "ing", 3, collect, &d);
    CHECK(buf_is(&d.reasoning, "a </thing", 9));
    dsf_dsml_feed(p, "</think>x <｜DSML｜ parameter y", strlen("</think>x <｜DSML｜ parameter y"), collect, &d);
    CHECK(dsf_dsml_finish(p, collect, &d, &r, err) == 0);
    CHECKF(buf_is(&d.content, "x <｜DSML｜ parameter y", strlen("x <｜DSML｜ parameter y")), "non-block DSML tag stays content");
    dsf_dsml_result_free(&r);
    dsf_dsml_parser_free(p);
    collector_free(&d);

    /* a multi-byte character split across feeds is never split across events */
    p = dsf_dsml_parser_new(false, false);
    collector e = {0};
    const char *emoji = "x😀y";
    for (size_t i = 0; i < strlen(emoji); i++) dsf_dsml_feed(p, emoji + i, 1, collect, &e);
    CHECK(dsf_dsml_finish(p, collect, &e, &r, err) == 0);
    CHECK(buf_is(&e.content, emoji, strlen(emoji)));
    dsf_dsml_result_free(&r);
    dsf_dsml_parser_free(p);
    collector_free(&e);
}

/* ==== tolerant handling of malformed output (spec §3.4) ======================================= */

TEST(dsml_tolerant_malformed) {
    static const struct { const char *text; const char *content; int n; const char *name0, *args0; } tab[] = {
        /* value written into the attribute, no closing tag */
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"search\">\n<｜DSML｜ parameter name=\"q\" string=\"rust async book\">\n"
         "</｜DSML｜ invoke>\n</｜DSML｜ calls>", "", 1, "search", "{\"q\": \"rust async book\"}"},
        /* duplicate parameter: last value wins, first position */
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ "
         "parameter>\n<｜DSML｜ parameter name=\"b\" string=\"false\">2</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"a\" "
         "string=\"true\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", "", 1, "f", "{\"a\": \"3\", \"b\": 2}"},
        /* cut off: the complete invoke is kept, the unfinished parameter dropped */
        {"text\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ "
         "parameter>\n<｜DSML｜ parameter name=\"b\" string=\"true\">unfinish", "text", 1, "f", "{\"a\": \"1\"}"},
        /* no ">\n", indentation, attribute order, missing parameter close */
        {"\n\n<｜DSML｜ calls><｜DSML｜ invoke name=\"f\">  <｜DSML｜ parameter string=\"false\" name=\"x\">[1, 2]"
         "</｜DSML｜ invoke></｜DSML｜ calls>", "", 1, "f", "{\"x\": [1, 2]}"},
        /* V4 spelling accepted by the tolerant dialect table */
        {"ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">v</｜DSML｜"
         "parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", "ok", 1, "f", "{\"a\": \"v\"}"},
        /* prose after the block is kept as content */
        {"a\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls> and more", "a and more", 1, "f", "{}"},
        /* a block with nothing parseable stays content */
        {"a\n\n<｜DSML｜ calls> nothing here", "a<｜DSML｜ calls> nothing here", 0, NULL, NULL},
        /* attribute values are not escaped: a quote inside a name is kept (official regex reading) */
        {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"we\"ird\">\n<｜DSML｜ parameter name=\"a\"b\" string=\"true\">v"
         "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", "", 1, "we\"ird", "{\"a\\\"b\": \"v\"}"},
        /* EOS ends everything; text after it is ignored */
        {"done" EOS "junk", "done", 0, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        for (int split = 0; split < 3; split++) {
            collector c = {0};
            dsf_dsml_parser *p = dsf_dsml_parser_new(false, false);
            const char *s = tab[i].text;
            size_t n = strlen(s);
            for (size_t k = 0; k < n;) {
                size_t step = split == 0 ? n : split == 1 ? 1 : 5;
                if (step > n - k) step = n - k;
                dsf_dsml_feed(p, s + k, step, collect, &c);
                k += step;
            }
            dsf_dsml_result r;
            char err[DSF_ERR_LEN];
            CHECK(dsf_dsml_finish(p, collect, &c, &r, err) == 0);
            CHECKF(r.content_len == strlen(tab[i].content) && !memcmp(r.content, tab[i].content, r.content_len),
                   "case %zu split %d: content '%s'", i, split, r.content);
            CHECKF(r.n_calls == tab[i].n, "case %zu split %d: %d calls", i, split, r.n_calls);
            if (tab[i].n) {
                CHECKF(!strcmp(r.calls[0].name, tab[i].name0) && !strcmp(r.calls[0].arguments, tab[i].args0),
                       "case %zu split %d: %s %s", i, split, r.calls[0].name, r.calls[0].arguments);
            }
            CHECKF(buf_is(&c.content, r.content, r.content_len), "case %zu: content events disagree", i);
            dsf_dsml_result_free(&r);
            dsf_dsml_parser_free(p);
            collector_free(&c);
        }
    }
}

/* ==== fuzz ================================================================================== */

static uint32_t rnd(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3 : (c >= 0xF0 && c < 0xF5) ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

TEST(dsml_fuzz_tolerant_never_fails) {
    static const char *const frags[] = {
        "<｜DSML｜ calls>", "</｜DSML｜ calls>", "<｜DSML｜ invoke name=\"", "</｜DSML｜ invoke>",
        "<｜DSML｜ parameter name=\"", "\" string=\"true\">", "\" string=\"false\">", "</｜DSML｜ parameter>",
        "<｜DSML｜tool_calls>", "<｜DSML｜", "｜DSML｜", "\n\n", "\n", ">", "\"", "<", "</", "</think>", "<think>",
        EOS, "<｜begin▁of▁sentence｜>", "name=", "x", "hello world", "{\"a\": [1, 2]}", "::", "ns::f", "😀",
        "\xff", "\xc3", "\xe2\x82", "\x00", "\" string=\"oops\">", "   ", "'", "=", "/>",
    };
    const size_t nf = sizeof frags / sizeof frags[0];
    uint32_t seed = 0x9E3779B9u;
    dsf_buf text = {0};
    for (int iter = 0; iter < 3000; iter++) {
        text.len = 0;
        int parts = 1 + (int)(rnd(&seed) % 40);
        for (int k = 0; k < parts; k++) {
            const char *f = frags[rnd(&seed) % nf];
            size_t fl = f[0] ? strlen(f) : 1; /* "\x00" is one NUL byte */
            if (rnd(&seed) % 7 == 0 && fl > 1) fl = 1 + rnd(&seed) % (fl - 1); /* truncated marker */
            dsf_buf_append(&text, f, fl);
        }
        bool thinking = rnd(&seed) & 1, strict = (rnd(&seed) % 4) == 0;
        dsf_dsml_parser *p = dsf_dsml_parser_new(thinking, strict);
        collector c = {0};
        for (size_t i = 0; i < text.len;) {
            size_t k = 1 + rnd(&seed) % 9;
            if (k > text.len - i) k = text.len - i;
            dsf_dsml_feed(p, (const char *)text.data + i, k, collect, &c);
            i += k;
        }
        dsf_dsml_result r;
        char err[DSF_ERR_LEN] = "";
        int rc = dsf_dsml_finish(p, collect, &c, &r, err);
        dsf_dsml_parser_free(p);
        CHECKF(strict || rc == 0, "iteration %d: tolerant mode failed: %s", iter, err);
        CHECKF(c.content.len == 0 || valid_utf8((char *)c.content.data, c.content.len), "iteration %d: invalid UTF-8 content", iter);
        CHECKF(c.reasoning.len == 0 || valid_utf8((char *)c.reasoning.data, c.reasoning.len), "iteration %d: invalid UTF-8 reasoning", iter);
        CHECKF(c.n_start == c.n_end && !c.bad_order, "iteration %d: %d starts, %d ends", iter, c.n_start, c.n_end);
        if (rc == 0) {
            CHECKF(r.reasoning && r.content, "iteration %d: missing strings", iter);
            if (!strict)
                CHECKF(buf_is(&c.content, r.content, r.content_len) && r.n_calls == c.n_end,
                       "iteration %d: events disagree with the tolerant result", iter);
            for (int i = 0; i < r.n_calls; i++) CHECK(r.calls[i].name && r.calls[i].arguments);
            char *j = dsf_dsml_result_json(&r);
            CHECKF(j && valid_utf8(j, strlen(j)), "iteration %d: result JSON", iter);
            free(j);
            dsf_dsml_result_free(&r);
        }
        collector_free(&c);
    }
    dsf_buf_free(&text);
}

/* Large inputs stay linear: a 4 MiB block of parameters fed in 1 KiB chunks, and 1 MiB of
 * one unterminated value fed byte by byte would take minutes if each feed rescanned. */
TEST(dsml_large_inputs) {
    dsf_buf big = {0};
    dsf_buf_append(&big, "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n", strlen("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"));
    for (int i = 0; big.len < (4u << 20); i++)
        dsf_buf_appendf(&big, "<｜DSML｜ parameter name=\"k%d\" string=\"true\">%0100d</｜DSML｜ parameter>\n", i % 500, i);
    dsf_buf_appendf(&big, "</｜DSML｜ invoke>\n</｜DSML｜ calls>");
    dsf_dsml_parser *p = dsf_dsml_parser_new(false, false);
    for (size_t i = 0; i < big.len; i += 1024)
        dsf_dsml_feed(p, (const char *)big.data + i, big.len - i < 1024 ? big.len - i : 1024, NULL, NULL);
    dsf_dsml_result r;
    char err[DSF_ERR_LEN];
    CHECK(dsf_dsml_finish(p, NULL, NULL, &r, err) == 0);
    CHECK(r.n_calls == 1 && r.calls[0].arguments[0] == '{');
    dsf_dsml_result_free(&r);
    dsf_dsml_parser_free(p);

    big.len = 0;
    dsf_buf_append(&big, "<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"a\" string=\"true\">",
                   strlen("<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"a\" string=\"true\">"));
    while (big.len < (1u << 20)) dsf_buf_append(&big, "abcdefgh<<\n\n", 12);
    p = dsf_dsml_parser_new(false, false);
    for (size_t i = 0; i < big.len; i++) dsf_dsml_feed(p, (const char *)big.data + i, 1, NULL, NULL);
    CHECK(dsf_dsml_finish(p, NULL, NULL, &r, err) == 0);
    CHECK(r.n_calls == 1 && !strcmp(r.calls[0].arguments, "{}"));
    dsf_dsml_result_free(&r);
    dsf_dsml_parser_free(p);
    dsf_buf_free(&big);
}
