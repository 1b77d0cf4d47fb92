/* pyjson.c: the Python-JSON emitter and reader the V4.1 prompt encoder relies on.
 * Guards against: float/escape/key-order differences from Python json.dumps(ensure_ascii=False),
 * and JSON input parsing that loses what Python keeps (int vs float, big ints, key order,
 * duplicate keys). */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "base/util.h"

static json_t *loads(const char *s) { return pyjson_loads(s, strlen(s), NULL); }

/* ==== pyjson: expected strings are Python 3 json.dumps(x, ensure_ascii=False) / repr output
 * (generated once with python3 on the dev machine and hard-coded here) ===================== */

TEST(pyjson_float_repr_table) {
    static const struct { double d; const char *py; } tab[] = {
        {1e-05, "1e-05"}, {1e+16, "1e+16"}, {0.1, "0.1"}, {100.0, "100.0"}, {-0.0, "-0.0"}, {0.0, "0.0"},
        {1e-07, "1e-07"}, {5e-324, "5e-324"}, {1.7976931348623157e+308, "1.7976931348623157e+308"},
        {1.5, "1.5"}, {1e5, "100000.0"}, {0.0001, "0.0001"}, {1e15, "1000000000000000.0"},
        {123456789.123, "123456789.123"}, {2.5e-5, "2.5e-05"}, {-1.25e+20, "-1.25e+20"},
        {1.0 / 3.0, "0.3333333333333333"}, {1.5e-323, "1.5e-323"}, {9007199254740993.0, "9007199254740992.0"},
        {1e22, "1e+22"}, {1e21, "1e+21"}, {0.30000000000000004, "0.30000000000000004"},
        {1152921504606846976.0, "1.152921504606847e+18"}, {4.35, "4.35"},
        {0.00030000000000000003, "0.00030000000000000003"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char buf[40];
        pyjson_float_repr(tab[i].d, buf);
        CHECKF(!strcmp(buf, tab[i].py), "repr(%.17g): got %s, Python gives %s", tab[i].d, buf, tab[i].py);
    }
}

static char *dumps_of(const char *json_text) {
    json_t *v = pyjson_loads(json_text, strlen(json_text), NULL);
    if (!v) return NULL;
    dsf_buf b = {0};
    pyjson_dumps(&b, v, NULL);
    json_decref(v);
    return (char *)b.data;
}

TEST(pyjson_dumps_matches_python) {
    static const struct { const char *in, *py; } tab[] = {
        /* escapes: only " \ and C0 controls; DEL, U+2028 and non-ASCII raw */
        {"\"tab\\tnl\\nq\\\"bs\\\\ \\u0000\\u0001\\u001f\x7f \xe2\x80\xa8 é😀 \\b\\f\\r\"",
         "\"tab\\tnl\\nq\\\"bs\\\\ \\u0000\\u0001\\u001f\x7f \xe2\x80\xa8 é😀 \\b\\f\\r\""},
        {"\"\\ud83d\\ude00\\/\"", "\"😀/\""},
        /* key order = insertion order, separators ", " and ": " */
        {"{\"b\":[1,2.0,null,true,false,{}],\"a\":{\"x\":[]}}", "{\"b\": [1, 2.0, null, true, false, {}], \"a\": {\"x\": []}}"},
        /* duplicate keys: first position, last value (dict semantics) */
        {"{\"a\":1,\"b\":2,\"a\":3}", "{\"a\": 3, \"b\": 2}"},
        /* ints stay ints of any size; floats go through repr */
        {"[123456789012345678901234567890, -9223372036854775809, 9223372036854775807, -0, 1E5, 1.50, -0.0]",
         "[123456789012345678901234567890, -9223372036854775809, 9223372036854775807, 0, 100000.0, 1.5, -0.0]"},
        {"[1e400, -1e400, NaN, Infinity, -Infinity]", "[Infinity, -Infinity, NaN, Infinity, -Infinity]"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char *got = dumps_of(tab[i].in);
        CHECKF(got && !strcmp(got, tab[i].py), "case %zu: got %s, want %s", i, got ? got : "(error)", tab[i].py);
        free(got);
    }
}

TEST(pyjson_loads_rejects_what_python_rejects) {
    static const char *const bad[] = {"", "[1,]", "{\"a\" 1}", "01", "1.", "\"a\tb\"", "\"\\x\"", "[1] x",
                                      "\"\\ud800\"", "\"\xff\"", "\"\xc0\x80\"", "tru", "-", "{\"a\":1,}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[DSF_ERR_LEN] = "";
        json_t *v = pyjson_loads(bad[i], strlen(bad[i]), err);
        CHECKF(!v && err[0], "input %zu (%s) should be rejected", i, bad[i]);
    }
    /* deep nesting is an error, not a stack overflow */
    size_t n = 100000;
    char *deep = malloc(n);
    memset(deep, '[', n);
    char err[DSF_ERR_LEN];
    CHECK(pyjson_loads(deep, n, err) == NULL);
    free(deep);
}

TEST(pyjson_str_matches_python) {
    /* str({'k': "it's", 'q': 'a"b', 'n': None, 'l': [1.0, True], 'u': 'é\u2028\x00'}) in Python 3 */
    json_t *v = loads("{\"k\":\"it's\",\"q\":\"a\\\"b\",\"n\":null,\"l\":[1.0,true],\"u\":\"é\\u2028\\u0000\"}");
    CHECK(v);
    dsf_buf b = {0};
    pyjson_str(&b, v);
    const char *want = "{'k': \"it's\", 'q': 'a\"b', 'n': None, 'l': [1.0, True], 'u': 'é\\u2028\\x00'}";
    CHECKF(b.data && !strcmp((char *)b.data, want), "got %s", b.data ? (char *)b.data : "");
    dsf_buf_free(&b);
    json_decref(v);
}
