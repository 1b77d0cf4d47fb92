/* server_msg.c: `dsflash serve` Messages request parsing (src/server/server_msg.c) with the
 * tiny41 tokenizer, without sockets or an engine: the request it becomes and count_tokens. */
#include <stdlib.h>
#include <string.h>

#include "server/server_msg.h"
#include "test.h"

/* Guards against a Messages request that reaches the scheduler as something else than the
 * chat request it stands for: the same prompt tokens as the equivalent chat body parsed by
 * server_api.c (an independent path), its options (kind, stream, stop strings, max_tokens,
 * sampling, parallel calls, reasoning start), and count_tokens reporting that prompt. */
TEST(server_msg_parse_matches_chat) {
    NEED_SHARED(gguf, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tok = dsf_tokenizer_load(gguf, err);
    CHECKF(tok, "%s", err);
    static const char msg[] =
        "{\"model\": \"x\", \"max_tokens\": 1500, \"stream\": true, \"temperature\": 0.25, \"top_k\": 3, "
        "\"stop_sequences\": [\"END\"], \"system\": \"Be kind.\", \"thinking\": {\"type\": \"enabled\", "
        "\"budget_tokens\": 1024}, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}}], "
        "\"tool_choice\": {\"type\": \"auto\", \"disable_parallel_tool_use\": true}, \"messages\": [{\"role\": \"user\", "
        "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"t1\", \"name\": "
        "\"f\", \"input\": {\"a\": 1}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
        "\"t1\", \"content\": \"ok\"}]}]}";
    static const char chat[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
        "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"t1\", \"type\": \"function\", "
        "\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
        "\"t1\", \"content\": \"ok\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"parameters\": {\"type\": \"object\"}}}], \"reasoning_effort\": \"low\"}";
    srv_req r, c;
    srv_error e;
    CHECKF(srv_msg_parse(msg, strlen(msg), tok, 4096, false, &r, &e) == 0, "%s", e.message);
    CHECKF(srv_parse_request(SRV_CHAT, chat, strlen(chat), tok, 4096, &c, &e) == 0, "%s", e.message);
    CHECK(r.kind == SRV_MESSAGES && r.stream && r.max_tokens == 1500 && r.top_k == 3 && r.temperature == 0.25f);
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END") && !r.parallel_tool_calls && r.tools && r.gen_reasoning);
    CHECKF(r.n_prompt == c.n_prompt && !memcmp(r.prompt, c.prompt, (size_t)r.n_prompt * sizeof *r.prompt),
           "Messages prompt %d tokens, chat prompt %d", r.n_prompt, c.n_prompt);

    char *cnt = srv_msg_count_json(msg, strlen(msg), tok, &e);
    CHECKF(cnt, "%s", e.message);
    char want[64];
    snprintf(want, sizeof want, "{\"input_tokens\":%d}", r.n_prompt);
    CHECKF(!strcmp(cnt, want), "%s, want %s", cnt, want);
    free(cnt);

    /* the prompt must fit the context; max_tokens may exceed what is left (the context then
     * ends the generation) */
    srv_req_free(&r);
    CHECK(srv_msg_parse(msg, strlen(msg), tok, c.n_prompt, false, &r, &e) == -1 && e.status == 400);
    CHECKF(strstr(e.message, "prompt is too long") != NULL && r.prompt == NULL, "%s", e.message);
    CHECKF(srv_msg_parse(msg, strlen(msg), tok, c.n_prompt + 1, false, &r, &e) == 0, "%s", e.message);
    CHECK(r.max_tokens == 1500);
    srv_req_free(&r);
    /* thinking off by default: the prompt ends in chat mode, no reasoning start */
    static const char plain[] = "{\"model\": \"x\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}";
    CHECKF(srv_msg_parse(plain, strlen(plain), tok, 4096, false, &r, &e) == 0, "%s", e.message);
    CHECK(!r.gen_reasoning && !r.stream && r.parallel_tool_calls && r.temperature == 1.0f);
    srv_req_free(&r);
    srv_req_free(&c);
    dsf_tokenizer_free(tok);
}
