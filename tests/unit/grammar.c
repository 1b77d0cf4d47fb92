/* grammar.c: the constrained-decoding automaton at the text level (src/text/grammar*.c).
 * Guards against: accepting text that is not JSON or does not satisfy the schema (numbers
 * with leading zeros or bare signs, bad escapes, lone surrogates, invalid UTF-8, missing
 * required keys, extra keys under additionalProperties false, values outside an enum or
 * anyOf, strings outside their length bounds), refusing valid text of the forms the grammar
 * promises (escapes, \u surrogate pairs, raw UTF-8, nesting, $ref recursion), marker strings
 * slipping into text runs, the DSML grammar refusing the official encoder's rendered calls
 * (chat-format fixtures) or accepting broken blocks, malformed schemas crashing instead of
 * failing with a message, and a wrong shortest-output bound.
 * Expected verdicts follow JSON (RFC 8259) and JSON-schema rules (checked against ajv 8).
 * Note: properties are accepted in the schema's order only (a documented restriction), so
 * every accepted object below lists them in that order. */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsflash.h"
#include "text/grammar.h"
#include "text/pyjson.h"
#include "base/util.h"

#define EOS "<｜end▁of▁sentence｜>"

/* 1 complete, 0 proper prefix, -1 rejected; -2 the spec did not compile */
static int verdict(const char *spec, const char *text) {
    char err[DSF_ERR_LEN];
    dsf_grammar *g = dsf_grammar_new(NULL, spec, strlen(spec), err);
    if (!g) return -2;
    int v = gr_match_text(g, text, strlen(text), NULL);
    dsf_grammar_free(g);
    return v;
}

#define SCHEMA(s) "{\"json_schema\": " s "}"
#define ACCEPT(spec, text) CHECKF(verdict(spec, text EOS) == 1, "should accept %s", text)
#define REJECT(spec, text) CHECKF(verdict(spec, text EOS) == -1, "should reject %s", text)

TEST(grammar_numbers) {
    const char *num = SCHEMA("{\"type\": \"number\"}"), *in = SCHEMA("{\"type\": \"integer\"}");
    static const char *const good[] = {"0", "-0", "12", "1.5", "-2.25e-3", "1e5", "1E+5", "10.0e07"};
    static const char *const bad[] = {"01", "-01", "1.", ".5", "+1", "1e", "1e+", "--1", "0x1", "NaN", "Infinity", "-", "1.e3", "00"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char txt[64];
        snprintf(txt, sizeof txt, "%s" EOS, good[i]);
        CHECKF(verdict(num, txt) == 1, "number %s", good[i]);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char txt[64];
        snprintf(txt, sizeof txt, "%s" EOS, bad[i]);
        CHECKF(verdict(num, txt) == -1, "not a number: %s", bad[i]);
        CHECKF(verdict(in, txt) == -1, "not an integer: %s", bad[i]);
    }
    ACCEPT(in, "-42");
    REJECT(in, "1.5");
    REJECT(in, "\"1\"");
    CHECK(verdict(num, "12") == 0); /* a prefix: EOS (or more digits) must follow */
}

TEST(grammar_strings) {
    const char *s = SCHEMA("{\"type\": \"string\"}");
    ACCEPT(s, "\"\"");
    ACCEPT(s, "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"");
    ACCEPT(s, "\"\\u00e9\\u00E9\"");
    ACCEPT(s, "\"\\ud83d\\ude00\"");      /* a surrogate pair */
    ACCEPT(s, "\"é😀 raw UTF-8\"");
    ACCEPT(s, "\"\\u003cthink>\"");        /* an escaped marker is not the marker */
    REJECT(s, "\"\\x\"");
    REJECT(s, "\"\\u12\"");
    REJECT(s, "\"\\ud83dx\"");             /* high surrogate without its low half */
    REJECT(s, "\"\\ud83d\\u0041\"");
    REJECT(s, "\"\\udc00\"");              /* a lone low surrogate */
    REJECT(s, "\"a\x01\"");                /* raw control character */
    REJECT(s, "\"a\nb\"");
    REJECT(s, "\"\xc0\x80\"");             /* overlong */
    REJECT(s, "\"\xed\xa0\x80\"");         /* UTF-8 surrogate */
    REJECT(s, "\"\xf4\x90\x80\x80\"");     /* above U+10FFFF */
    REJECT(s, "\"\xe9\"");                 /* truncated character */
    REJECT(s, "\"a</think>\"");            /* marker strings: the output parser would cut there */
    REJECT(s, "\"x｜DSML｜\"");
    REJECT(s, "\"<｜end▁of▁sentence｜>\"");
    REJECT(s, "\"abc");
    const char *len = SCHEMA("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}");
    ACCEPT(len, "\"ab\"");
    ACCEPT(len, "\"é😀\"");                /* code points, not bytes */
    ACCEPT(len, "\"\\ud83d\\ude00x\"");    /* a pair is one character */
    ACCEPT(len, "\"\\n\\t\\u0041\"");
    REJECT(len, "\"a\"");
    REJECT(len, "\"abcd\"");
    const char *en = SCHEMA("{\"enum\": [\"red\", \"green\", 3, null, {\"a\": [1]}]}");
    ACCEPT(en, "\"red\"");
    ACCEPT(en, "3");
    ACCEPT(en, "null");
    ACCEPT(en, "{\"a\":[1]}");
    REJECT(en, "\"blue\"");
    REJECT(en, "\"re\"");
    REJECT(en, "4");
}

#define PERSON "{\"type\": \"object\", \"properties\": {" \
    "\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}," \
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\"]}, \"maxItems\": 2}," \
    "\"pos\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}, \"y\": {\"type\": [\"number\", \"null\"]}}, \"required\": [\"x\"]}}," \
    "\"required\": [\"name\", \"pos\"], \"additionalProperties\": false}"

TEST(grammar_objects) {
    const char *p = SCHEMA(PERSON);
    ACCEPT(p, "{\"name\":\"x\",\"pos\":{\"x\":1}}");
    ACCEPT(p, "{\"name\": \"x\", \"age\": -3, \"tags\": [\"a\", \"b\"], \"pos\": {\"x\": -1.5e+3, \"y\": null}}");
    ACCEPT(p, "{\"name\":\"x\",\"tags\":[],\"pos\":{\"x\":0,\"y\":2}}");
    REJECT(p, "{\"name\":\"x\"}");                              /* required pos missing */
    REJECT(p, "{\"pos\":{\"x\":1}}");                           /* required name missing */
    REJECT(p, "{\"name\":\"x\",\"pos\":{\"y\":1}}");            /* nested required x */
    REJECT(p, "{\"name\":\"x\",\"pos\":{\"x\":1},\"z\":1}");    /* additionalProperties false */
    REJECT(p, "{\"name\":\"x\",\"name\":\"y\",\"pos\":{\"x\":1}}"); /* duplicate key */
    REJECT(p, "{\"name\":\"x\",\"tags\":[\"c\"],\"pos\":{\"x\":1}}"); /* enum */
    REJECT(p, "{\"name\":\"x\",\"tags\":[\"a\",\"a\",\"b\"],\"pos\":{\"x\":1}}"); /* maxItems */
    REJECT(p, "{\"name\":1,\"pos\":{\"x\":1}}");
    REJECT(p, "{\"name\":\"x\",\"pos\":{\"x\":1},}");            /* trailing comma */
    REJECT(p, "[]");
    CHECK(verdict(p, "{\"name\":\"x\"") == 0);
    const char *any = "{\"json_object\": true}";
    ACCEPT(any, "{}");
    ACCEPT(any, "{\"a\": [1, {\"b\": null}, \"c\", true, -0.5]}");
    REJECT(any, "[1]");
    REJECT(any, "\"x\"");
    REJECT(any, "{\"a\" 1}");
    const char *mi = SCHEMA("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2}");
    ACCEPT(mi, "[1,2]");
    ACCEPT(mi, "[1,2,3,4,5]");
    REJECT(mi, "[1]");
    REJECT(mi, "[]");
}

TEST(grammar_combinators) {
    const char *any_of = SCHEMA("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}]}");
    ACCEPT(any_of, "5");
    ACCEPT(any_of, "\"x\"");
    REJECT(any_of, "\"xy\"");
    REJECT(any_of, "true");
    const char *list = SCHEMA("{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"},"
                              "\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}},"
                              "\"required\": [\"v\", \"next\"]}}, \"$ref\": \"#/$defs/node\"}");
    ACCEPT(list, "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}");
    REJECT(list, "{\"v\":1,\"next\":{\"v\":2}}");
    const char *all = SCHEMA("{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]},"
                             "{\"properties\": {\"b\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}]}");
    ACCEPT(all, "{\"a\":1,\"b\":true}");
    REJECT(all, "{\"a\":1}");
    /* annotations and unsupported constraining keywords compile (ignored, documented) */
    CHECK(verdict(SCHEMA("{\"type\": \"string\", \"title\": \"t\", \"description\": \"d\", \"format\": \"date\","
                         " \"pattern\": \"^a\", \"examples\": [\"a\"], \"default\": \"a\"}"), "\"b\"" EOS) == 1);
}

/* Guards: malformed specs fail with a message, never a crash. */
TEST(grammar_bad_specs) {
    static const char *const bad[] = {
        "", "[]", "{}", "{\"json_schema\": 5}", "{\"json_schema\": \"x\"}", "{\"json_schema\": false}",
        "{\"json_schema\": {\"$ref\": \"#/$defs/none\"}}", "{\"json_schema\": {\"$ref\": \"http://x\"}}",
        "{\"json_schema\": {\"$ref\": \"#\"}}", "{\"json_schema\": {\"type\": \"frog\"}}",
        "{\"json_schema\": {\"type\": \"string\", \"minLength\": 5, \"maxLength\": 2}}",
        "{\"json_schema\": {\"type\": \"object\", \"properties\": {}, \"required\": [\"a\"]}}",
        "{\"json_schema\": {\"enum\": []}}", "{\"json_schema\": {\"anyOf\": []}}",
        "{\"tools\": []}", "{\"tools\": [{\"name\": \"a\\\"b\"}]}", "{\"tools\": [{\"name\": \"\"}]}",
        "{\"tools\": [{\"name\": \"f\", \"parameters\": 3}]}",
        "{\"tools\": [{\"name\": \"f\", \"parameters\": {\"properties\": {\"a\\\"\": {}}, \"required\": [\"a\\\"\"]}}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[DSF_ERR_LEN] = "";
        dsf_grammar *g = dsf_grammar_new(NULL, bad[i], strlen(bad[i]), err);
        CHECKF(!g && err[0], "spec %zu should fail with a message: %s", i, bad[i]);
    }
    /* deep nesting is refused, not recursed into */
    dsf_buf b = {0};
    dsf_buf_appendf(&b, "{\"json_schema\": ");
    for (int i = 0; i < 200; i++) dsf_buf_appendf(&b, "{\"type\": \"array\", \"items\": ");
    dsf_buf_appendf(&b, "true");
    for (int i = 0; i < 200; i++) dsf_buf_appendf(&b, "}");
    dsf_buf_appendf(&b, "}");
    char err[DSF_ERR_LEN] = "";
    dsf_grammar *g = dsf_grammar_new(NULL, (const char *)b.data, b.len, err);
    dsf_buf_free(&b);
    CHECKF(!g && strstr(err, "deeper"), "%s", err);
}

/* Guards the budget bound: the shortest output counts every byte and symbol. */
TEST(grammar_min_tokens) {
    const char *s = SCHEMA("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"minLength\": 3}}, \"required\": [\"a\"]}");
    dsf_grammar *g = dsf_grammar_new(NULL, s, strlen(s), NULL);
    CHECK(g);
    CHECKF(dsf_grammar_min_tokens(g) == (int)strlen("{\"a\":\"xxx\"}") + 1, "%d", dsf_grammar_min_tokens(g)); /* + EOS */
    dsf_grammar_free(g);
}

/* ==== the DSML tool-calls grammar against the official encoder's rendering ================ */

/* The JSON-schema type of a rendered argument value (any for containers); big integers
 * (beyond the grammar's 20 digits, a documented bound) set *skip. */
static json_t *schema_of(const json_t *v, bool *skip) {
    if (pyjson_is_str(v)) return json_pack("{s:s}", "type", "string");
    if (json_is_string(v)) *skip = true; /* pyjson raw number */
    if (json_is_integer(v)) return json_pack("{s:s}", "type", "integer");
    if (json_is_real(v)) return json_pack("{s:s}", "type", "number");
    if (json_is_boolean(v)) return json_pack("{s:s}", "type", "boolean");
    if (json_is_null(v)) return json_pack("{s:s}", "type", "null");
    return json_true();
}

/* A tool per called name, derived from the call's arguments as the encoder reads them
 * (spec §2.8: decode a string up to twice; a non-object becomes {"arguments": original}). */
static void add_call_tool(json_t *tools, const json_t *call, bool *skip) {
    const json_t *f = json_object_get(call, "function");
    if (!f) f = call;
    const char *name = json_string_value(json_object_get(f, "name"));
    const json_t *ns = json_object_get(call, "namespace");
    if (!ns) ns = json_object_get(f, "namespace");
    if (json_is_object(ns)) ns = json_object_get(ns, "name");
    char q[256];
    snprintf(q, sizeof q, "%s%s%s", pyjson_is_str(ns) ? json_string_value(ns) : "", pyjson_is_str(ns) ? "::" : "", name ? name : "");
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(tools, i), "name")), q)) return;
    const json_t *orig = json_object_get(f, "arguments");
    json_t *args = json_incref((json_t *)orig);
    for (int k = 0; k < 2 && pyjson_is_str(args); k++) {
        json_t *d = pyjson_loads(json_string_value(args), json_string_length(args), NULL);
        if (!d) break;
        json_decref(args);
        args = d;
    }
    if (!json_is_object(args)) {
        json_decref(args);
        args = json_pack("{s:O}", "arguments", orig ? orig : json_null());
    }
    json_t *props = json_object(), *req = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v) {
        json_object_set_new(props, k, schema_of(v, skip));
        json_array_append_new(req, json_string(k));
    }
    json_decref(args);
    json_array_append_new(tools, json_pack("{s:s,s:{s:s,s:o,s:o}}", "name", q, "parameters", "type", "object", "properties",
                                           props, "required", req));
}

static int block_verdict(const char *spec, const char *block, size_t n, const char *tail) {
    dsf_buf b = {0};
    dsf_buf_append(&b, block, n);
    dsf_buf_appendf(&b, "%s", tail);
    int v = verdict(spec, (const char *)b.data);
    dsf_buf_free(&b);
    return v;
}

static void check_case(test_ctx *t, const json_t *cs, int *n_blocks) {
    const char *prompt = json_string_value(json_object_get(json_object_get(cs, "expected"), "prompt"));
    if (!prompt || !strstr(prompt, "\n\n<｜DSML｜ calls>")) return;
    json_t *tools = json_array();
    bool skip = false, quote = false;
    const json_t *msgs = json_object_get(cs, "messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *calls = json_object_get(json_array_get(msgs, i), "tool_calls");
        for (size_t j = 0; j < json_array_size(calls); j++) add_call_tool(tools, json_array_get(calls, j), &skip);
    }
    if (!json_array_size(tools)) { /* only the tools block's example: no call rendered */
        json_decref(tools);
        return;
    }
    for (size_t i = 0; i < json_array_size(tools); i++)
        quote |= strchr(json_string_value(json_object_get(json_array_get(tools, i), "name")), '"') != NULL;
    json_t *spec = json_pack("{s:o,s:b}", "tools", tools, "parallel", 1);
    dsf_buf sb = {0};
    pyjson_dumps(&sb, spec, NULL);
    json_decref(spec);
    const char *name = json_string_value(json_object_get(cs, "name"));
    char err[DSF_ERR_LEN] = "";
    dsf_grammar *g = dsf_grammar_new(NULL, (const char *)sb.data, sb.len, err);
    dsf_grammar_free(g);
    /* a '"' in a name cannot be written in DSML (spec §2.8): such a spec is refused */
    CHECKF(!g == quote, "%s: compile %s (%s)", name, g ? "ok" : "failed", err);
    for (const char *p = prompt; g && !skip && (p = strstr(p, "\n\n<｜DSML｜ calls>"));) {
        const char *end = strstr(p, "</｜DSML｜ calls>");
        CHECK(end);
        size_t n = (size_t)(end - p) + strlen("</｜DSML｜ calls>");
        if (memmem(p, n, "$TOOL_NAME", 10)) { /* the tools block's own example, not a call */
            p = end;
            continue;
        }
        const char *spec_s = (const char *)sb.data;
        CHECKF(block_verdict(spec_s, p, n, EOS) == 1, "%s: the rendered block is refused", name);
        CHECKF(block_verdict(spec_s, p + 2, n - 2, EOS) == -1, "%s: block without the blank line", name);
        CHECKF(block_verdict(spec_s, p, n, "x" EOS) == -1, "%s: text after the block", name);
        CHECKF(block_verdict(spec_s, p, n, "") == 0, "%s: a block without EOS is a prefix", name);
        dsf_buf m = {0};
        dsf_buf_append(&m, p, n);
        char *s = strstr((char *)m.data, "string=\"");
        if (s) { /* flip string="true" <-> "false" on the first parameter */
            bool tr = !strncmp(s + 8, "true", 4);
            dsf_buf f = {0};
            dsf_buf_append(&f, m.data, (size_t)(s - (char *)m.data) + 8);
            dsf_buf_appendf(&f, "%s", tr ? "false" : "true");
            const char *rest = s + 8 + (tr ? 4 : 5);
            dsf_buf_append(&f, rest, strlen(rest));
            CHECKF(block_verdict(spec_s, (const char *)f.data, f.len, EOS) == -1, "%s: flipped string= accepted", name);
            dsf_buf_free(&f);
        }
        char *nm = strstr((char *)m.data, "invoke name=\"");
        if (nm) {
            nm[13] = nm[13] == 'z' ? 'y' : 'z'; /* another tool name */
            CHECKF(block_verdict(spec_s, (const char *)m.data, m.len, EOS) == -1, "%s: unknown tool accepted", name);
        }
        dsf_buf_free(&m);
        ++*n_blocks;
        p = end;
    }
    dsf_buf_free(&sb);
}

TEST(grammar_dsml_fixtures) {
    static const char *const files[] = {
        "fixtures/chat/official_kiojuvr_encoding_fixtures.json", "fixtures/chat/official_test_encoding_assertions.json",
        "fixtures/chat/official_vllm_reference_encoder.json", "fixtures/chat/generated_reconstructed_edge_cases.json"};
    int n_blocks = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        NEED_SHARED(path, files[fi]);
        json_t *d = test_load_json(path);
        CHECKF(d, "cannot read %s", path);
        const json_t *cases = json_object_get(d, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) {
            check_case(t, json_array_get(cases, i), &n_blocks);
            if (t->failed) break;
        }
        json_decref(d);
        if (t->failed) return;
    }
    CHECKF(n_blocks >= 20, "only %d rendered blocks checked", n_blocks);
}
