/* fuzz_responses.c: libFuzzer harness for the Responses API's request mapping
 * (src/server/responses.c: resp_map_request, a body -> the chat request, the echo fields and
 * the conversation), followed by the chat parse of the mapped request (srv_parse_json, which
 * renders and tokenizes it) as POST /v1/responses does; no sockets, no engine, no store.
 *
 * Bodies that are not JSON stop at the parser (fuzz_chat covers it).
 * Byte 0: bit 0 passes the body's own "input" list as the previous response's history (the
 * shape a stored conversation has), bit 7 a small context (8 + bits 1..6), else 4096. The rest
 * is the body.
 * Checks: a refused request has a 4xx status and a message, its error JSON parses with the
 * OpenAI shape, and nothing stays allocated in the mapped request; an accepted mapping has a
 * chat request with a non-empty "messages" list, an echo with "tools" (a list), "tool_choice",
 * "text".format and "store", a conversation of at least one item, and the chat parse either
 * refuses it with a 4xx or yields 1..n_ctx-1 prompt ids inside the vocabulary. The tokenizer
 * is tiny41's (fuzz_common.h). */
#include "fuzz_common.h"
#include "server/responses.h"
#include "text/pyjson.h"

#include <jansson.h>

static void fz_resp_check_error(const srv_error *e) {
    FZ_REQUIRE(e->status >= 400 && e->status < 500, "refused with HTTP status %d", e->status);
    FZ_REQUIRE(e->message[0] != 0, "refused without a message");
    char *js = srv_error_json(e);
    json_error_t je;
    json_t *v = json_loads(js, 0, &je);
    FZ_REQUIRE(v != NULL, "error JSON does not parse: %s", je.text);
    FZ_REQUIRE(json_is_string(json_object_get(json_object_get(v, "error"), "message")), "error JSON lacks error.message");
    json_decref(v);
    free(js);
}

static int fz_responses_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    int n_ctx = (flags & 0x80) ? 8 + ((flags >> 1) & 0x3F) : 4096;
    char err[DSF_ERR_LEN];
    json_t *body = pyjson_loads((const char *)in.p, in.n, err); /* as server_resp.c parses */
    if (!body) return 0;
    const json_t *hist = (flags & 1) && json_is_object(body) ? json_object_get(body, "input") : NULL;
    if (!json_is_array(hist)) hist = NULL;
    resp_request rq;
    srv_error e;
    memset(&e, 0, sizeof e);
    int rc = resp_map_request(body, hist, &rq, &e);
    json_decref(body);
    if (rc) {
        fz_resp_check_error(&e);
        FZ_REQUIRE(!rq.chat && !rq.echo && !rq.conv, "a refused mapping kept allocations");
        return 0;
    }
    const json_t *msgs = json_object_get(rq.chat, "messages");
    FZ_REQUIRE(json_is_array(msgs), "the chat request has no messages list");
    FZ_REQUIRE(json_array_size(rq.conv) >= 1, "accepted an empty conversation");
    FZ_REQUIRE(json_is_array(json_object_get(rq.echo, "tools")), "echo.tools is not a list");
    FZ_REQUIRE(json_object_get(rq.echo, "tool_choice") != NULL, "echo lacks tool_choice");
    FZ_REQUIRE(json_is_object(json_object_get(json_object_get(rq.echo, "text"), "format")), "echo lacks text.format");
    FZ_REQUIRE(json_is_boolean(json_object_get(rq.echo, "store")), "echo lacks store");
    srv_req r;
    memset(&e, 0, sizeof e);
    rc = srv_parse_json(SRV_CHAT, rq.chat, fz_tokenizer(), n_ctx, &r, &e);
    resp_request_free(&rq);
    if (rc) {
        fz_resp_check_error(&e);
        FZ_REQUIRE(r.prompt == NULL && r.n_stop == 0, "a refused request kept allocations");
        return 0;
    }
    int nv = dsf_tokenizer_n_vocab(fz_tokenizer());
    FZ_REQUIRE(r.n_prompt >= 1 && r.n_prompt < n_ctx && r.prompt, "accepted %d prompt tokens with n_ctx %d", r.n_prompt,
               n_ctx);
    for (int i = 0; i < r.n_prompt; i++)
        FZ_REQUIRE(r.prompt[i] >= 0 && r.prompt[i] < nv, "prompt id %d outside [0, %d)", r.prompt[i], nv);
    FZ_REQUIRE(r.max_tokens >= 0 && (long long)r.n_prompt + r.max_tokens <= n_ctx, "max_tokens %d does not fit",
               r.max_tokens);
    srv_req_free(&r);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_responses_one(data, size);
    return 0;
}
#endif
