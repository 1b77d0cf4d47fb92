/* fuzz_messages.c: libFuzzer harness for the Anthropic Messages request parsing
 * (src/server/server_msg.c: srv_msg_parse, the body -> chat request -> srv_req mapping, and
 * count_tokens; no sockets, no engine).
 *
 * Byte 0: bit 0 parses as count_tokens (no max_tokens), bit 7 a small context (8 + bits 1..6,
 * to reach the context-length errors), else 4096. The rest is the body.
 * Checks: a refused request has a 4xx status and a message, its error JSON has Anthropic's
 * shape {"type": "error", "error": {"type", "message"}}, and nothing stays allocated in the
 * request; an accepted one is kind SRV_MESSAGES with 1..n_ctx-1 prompt ids inside the
 * vocabulary (any length when counting), max_tokens >= 1 unless counting, temperature and top_p
 * in [0, 1] and non-NULL stop strings, and count_tokens reports the same prompt length. The
 * tokenizer is tiny41's (fuzz_common.h). */
#include "fuzz_common.h"
#include "server/server_msg.h"

#include <jansson.h>
#include <math.h>

static int fz_messages_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    bool count = flags & 1;
    int n_ctx = (flags & 0x80) ? 8 + ((flags >> 1) & 0x3F) : 4096;
    const dsf_tokenizer *tok = fz_tokenizer();
    srv_req r;
    srv_error e;
    memset(&e, 0, sizeof e);
    int rc = srv_msg_parse((const char *)in.p, in.n, tok, n_ctx, count, &r, &e);
    if (rc) {
        FZ_REQUIRE(e.status >= 400 && e.status < 500, "refused with HTTP status %d", e.status);
        FZ_REQUIRE(e.message[0] != 0, "refused without a message");
        FZ_REQUIRE(r.prompt == NULL && r.stop == NULL && r.n_stop == 0, "a refused request kept allocations");
        char *js = srv_msg_error_json(&e);
        json_error_t je;
        json_t *v = json_loads(js, 0, &je);
        FZ_REQUIRE(v != NULL, "error JSON does not parse: %s", je.text);
        const json_t *err = json_object_get(v, "error");
        FZ_REQUIRE(json_is_string(json_object_get(v, "type")) && json_is_string(json_object_get(err, "type")) &&
                       json_is_string(json_object_get(err, "message")),
                   "error JSON lacks type / error.type / error.message");
        json_decref(v);
        free(js);
        return 0; /* refused */
    }
    int nv = dsf_tokenizer_n_vocab(tok);
    FZ_REQUIRE(r.kind == SRV_MESSAGES, "kind %d", (int)r.kind);
    FZ_REQUIRE(r.n_prompt >= 1 && (count || r.n_prompt < n_ctx) && r.prompt, "accepted %d prompt tokens with n_ctx %d",
               r.n_prompt, n_ctx);
    for (int i = 0; i < r.n_prompt; i++)
        FZ_REQUIRE(r.prompt[i] >= 0 && r.prompt[i] < nv, "prompt id %d outside [0, %d)", r.prompt[i], nv);
    FZ_REQUIRE(count ? r.max_tokens == 0 : r.max_tokens >= 1, "max_tokens %d (count %d)", r.max_tokens, (int)count);
    FZ_REQUIRE(isfinite(r.temperature) && r.temperature >= 0 && r.temperature <= 1, "temperature %g",
               (double)r.temperature);
    FZ_REQUIRE(isfinite(r.top_p) && r.top_p >= 0 && r.top_p <= 1, "top_p %g", (double)r.top_p);
    FZ_REQUIRE(r.n_stop >= 0 && r.n_stop <= 16 && (r.n_stop == 0 || r.stop), "stop list");
    for (int i = 0; i < r.n_stop; i++) FZ_REQUIRE(r.stop[i] != NULL, "stop[%d] is NULL", i);
    if (count) {
        char *cj = srv_msg_count_json((const char *)in.p, in.n, tok, &e);
        FZ_REQUIRE(cj != NULL, "count_tokens refused an accepted body: %s", e.message);
        json_t *v = json_loads(cj, 0, NULL);
        FZ_REQUIRE(json_integer_value(json_object_get(v, "input_tokens")) == r.n_prompt, "count_tokens %s, prompt %d",
                   cj, r.n_prompt);
        json_decref(v);
        free(cj);
    }
    srv_req_free(&r);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_messages_one(data, size);
    return 0;
}
#endif
