/* sdk.c: `dsflash serve` driven by the official client SDKs (tests/npm/sdk/NAME.test.mjs, run
 * with `node --test`): the openai and @anthropic-ai/sdk npm packages must parse every reply
 * and every stream. Each TEST starts the real binary on the tiny41 model with an API key,
 * runs one suite file against it (environment: DSF_BASE_URL = http://127.0.0.1:PORT,
 * DSF_API_KEY, DSF_MODEL) and requires node's exit status 0 and a clean server exit.
 * Expected values live in the suites: the APIs' documented shapes, a JSON-schema validator
 * (ajv), and the server's replies compared with each other. Skips when node/npm or the npm
 * registry is unavailable. */
#include <stdio.h>
#include <string.h>

#include "npm.h"
#include "serve.h"
#include "test.h"

static const char *const sdk_need[] = {"openai/package.json", "@anthropic-ai/sdk/package.json", "ajv/package.json",
                                       NULL};

#define SDK_KEY "sk-dsflash-test"

/* Runs tests/npm/sdk/<suite> against a fresh server (serve_extra: more `serve` options). */
static void run_suite(test_ctx *t, const char *suite, const char *serve_extra) {
    char why[512];
    const char *skip = test_npm_ready(sdk_need, why, sizeof why);
    if (skip) {
        test_skip(t, "%s", skip);
        return;
    }
    const char *model = test_shared("testdata/tiny41/tiny41.gguf");
    if (!model) {
        test_skip(t, "../shared/testdata/tiny41/tiny41.gguf not found");
        return;
    }
    char extra[512], msg[512];
    snprintf(extra, sizeof extra, "--api-key %s --slots 2 %s", SDK_KEY, serve_extra ? serve_extra : "");
    test_server s = {0};
    if (test_server_start(&s, model, extra, msg, sizeof msg)) {
        CHECKF(0, "%s", msg);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd tests/npm && DSF_BASE_URL=http://127.0.0.1:%d DSF_API_KEY=%s DSF_MODEL=tiny41.gguf "
             "timeout 600 node --test --test-reporter=spec sdk/%s 2>&1",
             s.port, SDK_KEY, suite);
    static char out[1 << 16];
    int rc = test_run(cmd, out, sizeof out);
    size_t n = strlen(out);
    CHECKF(rc == 0, "node --test sdk/%s failed (rc %d); server log %s; last output:\n%s", suite, rc, s.log,
           n > 6000 ? out + n - 6000 : out);
    CHECKF(test_server_stop(&s) == 0, "the server did not exit cleanly (log %s)", s.log);
}

/* The existing /v1/chat/completions through the official openai client: the harness itself. */
TEST(sdk_openai_chat_completions) { run_suite(t, "chat_completions.test.mjs", NULL); }

/* POST /v1/messages and /v1/messages/count_tokens through the official @anthropic-ai/sdk client. */
TEST(sdk_anthropic_messages) { run_suite(t, "messages.test.mjs", NULL); }
/* /v1/responses (create, stream, retrieve, delete, previous_response_id) through the openai client. */
TEST(sdk_openai_responses) { run_suite(t, "responses.test.mjs", NULL); }
/* Constrained decoding: a required tool / response_format schema always parses and validates. */
TEST(sdk_constrained_chat) { run_suite(t, "constrained_chat.test.mjs", NULL); }
