/* fuzz_chat.c: libFuzzer harness for the chat encoder (src/text/chat.c) and Python-compatible JSON
 * (src/text/pyjson.c) on arbitrary JSON-ish bytes.
 *
 * Every input goes through:
 *   - dsf_chat_render_json (encoder level) and dsf_chat_render_openai (OpenAI level): either an
 *     error with a message and no prompt, or a NUL-terminated prompt whose images_json is a
 *     JSON array; gen_reasoning is true exactly when the encoder-level prompt ends with
 *     "<think>";
 *   - pyjson_loads -> pyjson_dumps -> pyjson_loads -> pyjson_dumps: the two dumps are equal
 *     (a value survives its own serialization), the dump is valid UTF-8, and pyjson_str runs. */
#include "fuzz_common.h"
#include "text/pyjson.h"

#include <jansson.h>

static void fz_chat_check_prompt(int rc, const dsf_chat_prompt *p, const char *err, bool check_think) {
    if (rc) {
        FZ_REQUIRE(err[0] != 0, "render failed without a message");
        FZ_REQUIRE(p->prompt == NULL && p->images_json == NULL, "failed render left a prompt");
        return;
    }
    FZ_REQUIRE(p->prompt != NULL && p->prompt[p->prompt_len] == 0, "prompt missing or not NUL-terminated");
    FZ_REQUIRE(p->images_json != NULL, "no images_json");
    json_error_t je;
    json_t *im = json_loads(p->images_json, 0, &je);
    FZ_REQUIRE(json_is_array(im), "images_json is not a JSON array: %s", p->images_json);
    json_decref(im);
    if (check_think) {
        bool ends = p->prompt_len >= 7 && !memcmp(p->prompt + p->prompt_len - 7, "<think>", 7);
        FZ_REQUIRE(ends == p->gen_reasoning, "gen_reasoning %d but the prompt %s with <think>", p->gen_reasoning,
                   ends ? "ends" : "does not end");
    }
}

static void fz_chat_pyjson(const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN] = "";
    json_t *v = pyjson_loads((const char *)data, size, err);
    if (!v) {
        fz_check_err(err, "pyjson_loads");
        return;
    }
    FZ_REQUIRE(fz_utf8_valid(data, size), "pyjson_loads accepted invalid UTF-8");
    dsf_buf a = {0}, b = {0}, s = {0};
    FZ_REQUIRE(pyjson_dumps(&a, v, err) == 0, "pyjson_dumps refused a value pyjson_loads built: %s", err);
    FZ_REQUIRE(fz_utf8_valid(a.data, a.len), "pyjson_dumps wrote invalid UTF-8");
    json_t *w = pyjson_loads(a.data ? (const char *)a.data : "", a.len, err);
    FZ_REQUIRE(w != NULL, "pyjson_loads refused its own dump: %s", err);
    FZ_REQUIRE(pyjson_dumps(&b, w, err) == 0, "second dump failed: %s", err);
    FZ_REQUIRE(a.len == b.len && (!a.len || !memcmp(a.data, b.data, a.len)), "dump(load(dump(x))) != dump(x)");
    pyjson_str(&s, v);
    (void)pyjson_truthy(v);
    json_decref(v);
    json_decref(w);
    dsf_buf_free(&a);
    dsf_buf_free(&b);
    dsf_buf_free(&s);
}

static int fz_chat_one(const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN] = "";
    dsf_chat_prompt p;
    int rc = dsf_chat_render_json((const char *)data, size, &p, err), ok = rc == 0;
    fz_chat_check_prompt(rc, &p, err, true);
    dsf_chat_prompt_free(&p);
    err[0] = 0;
    rc = dsf_chat_render_openai((const char *)data, size, &p, err);
    fz_chat_check_prompt(rc, &p, err, false);
    dsf_chat_prompt_free(&p);
    fz_chat_pyjson(data, size);
    return ok || rc == 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_chat_one(data, size);
    return 0;
}
#endif
