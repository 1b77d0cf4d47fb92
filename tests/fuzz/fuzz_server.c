/* fuzz_server.c: libFuzzer harness for the HTTP server's request parsing (src/server/server_api.c:
 * srv_parse_request, the pure body -> srv_req mapping; no sockets, no engine).
 *
 * Byte 0: bit 0 picks /v1/completions (else /v1/chat/completions), bit 7 a small context
 * (8 + bits 1..6, to reach the context-length errors), else 4096. The rest is the body.
 * Checks: a refused request has a 4xx status, a message, and an error JSON that parses with
 * the OpenAI shape {"error": {"message", ...}}, and leaves nothing allocated in the request;
 * an accepted one has 1..n_ctx-1 prompt ids inside the vocabulary, max_tokens that fit the
 * context, logprobs in -1..20, sampling values in their documented ranges and non-NULL
 * stop strings. The tokenizer is tiny41's (fuzz_common.h). */
#include "fuzz_common.h"
#include "server/server.h"

#include <jansson.h>
#include <math.h>

static int fz_server_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    srv_kind kind = (flags & 1) ? SRV_COMPLETION : SRV_CHAT;
    int n_ctx = (flags & 0x80) ? 8 + ((flags >> 1) & 0x3F) : 4096;
    const dsf_tokenizer *tok = fz_tokenizer();
    srv_req r;
    srv_error e;
    memset(&e, 0, sizeof e);
    int rc = srv_parse_request(kind, (const char *)in.p, in.n, tok, n_ctx, &r, &e);
    if (rc) {
        FZ_REQUIRE(e.status >= 400 && e.status < 500, "refused with HTTP status %d", e.status);
        FZ_REQUIRE(e.message[0] != 0, "refused without a message");
        FZ_REQUIRE(r.prompt == NULL && r.stop == NULL && r.n_stop == 0, "a refused request kept allocations");
        char *js = srv_error_json(&e);
        json_error_t je;
        json_t *v = json_loads(js, 0, &je);
        FZ_REQUIRE(v != NULL, "error JSON does not parse: %s", je.text);
        json_t *m = json_object_get(json_object_get(v, "error"), "message");
        FZ_REQUIRE(json_is_string(m), "error JSON lacks error.message");
        json_decref(v);
        free(js);
        return 0; /* refused */
    }
    int nv = dsf_tokenizer_n_vocab(tok);
    FZ_REQUIRE(r.kind == kind, "kind changed");
    FZ_REQUIRE(r.n_prompt >= 1 && r.n_prompt < n_ctx && r.prompt, "accepted %d prompt tokens with n_ctx %d",
               r.n_prompt, n_ctx);
    for (int i = 0; i < r.n_prompt; i++)
        FZ_REQUIRE(r.prompt[i] >= 0 && r.prompt[i] < nv, "prompt id %d outside [0, %d)", r.prompt[i], nv);
    FZ_REQUIRE(r.max_tokens >= 0 && (long long)r.n_prompt + r.max_tokens <= n_ctx, "max_tokens %d does not fit",
               r.max_tokens);
    FZ_REQUIRE(r.logprobs >= -1 && r.logprobs <= 20, "logprobs %d", r.logprobs);
    FZ_REQUIRE(isfinite(r.temperature) && r.temperature >= 0 && r.temperature <= 100, "temperature %g",
               (double)r.temperature);
    FZ_REQUIRE(isfinite(r.top_p) && r.top_p >= 0 && r.top_p <= 1, "top_p %g", (double)r.top_p);
    FZ_REQUIRE(isfinite(r.min_p) && r.min_p >= 0 && r.min_p <= 1, "min_p %g", (double)r.min_p);
    FZ_REQUIRE(r.n_stop >= 0 && (r.n_stop == 0 || r.stop), "stop list");
    for (int i = 0; i < r.n_stop; i++) FZ_REQUIRE(r.stop[i] != NULL, "stop[%d] is NULL", i);
    srv_req_free(&r);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_server_one(data, size);
    return 0;
}
#endif
