/* spec.c: speculative decoding end to end (the dsflash binary): `run` and `serve` with
 * --draft oracle[:K] (the test drafter: the main model's own greedy tokens, K corrupted)
 * produce exactly the greedy text of the same commands without --draft, over 200 tokens on
 * tinyds; the server reports acceptance in /health and in its request log line; bad --draft
 * options get clear errors. The HTTP requests go through curl (skipped when it is absent);
 * the expected texts are the plain commands' own outputs. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"
#include "test.h"

#define MODEL "testdata/tinyds/tinyds.gguf"

/* Guards greedy identity of `dsflash run` with and without drafting (long accepts and a
 * rejection inside every block). */
TEST(spec_cli_run_identical) {
    NEED_SHARED(m, MODEL);
    static char ref[65536], out[65536], err[4096];
    char cmd[2048];
    const char *base = "run -m %s -p 'Once upon a time' --raw -n 200 --ignore-eos --temp 0 --threads 2";
    char b[512];
    snprintf(b, sizeof b, base, m);
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", test_bin(), b);
    CHECK(test_run(cmd, ref, sizeof ref) == 0 && strlen(ref) > 100);
    const char *drafts[] = {"oracle", "oracle:0", "oracle:3"};
    for (size_t i = 0; i < sizeof drafts / sizeof *drafts; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --draft %s 2>%s/spec.err", test_bin(), b, drafts[i], test_tmpdir());
        CHECK(test_run(cmd, out, sizeof out) == 0);
        CHECKF(!strcmp(out, ref), "--draft %s changed the text", drafts[i]);
        snprintf(cmd, sizeof cmd, "cat %s/spec.err", test_tmpdir());
        CHECK(test_run(cmd, err, sizeof err) == 0);
        CHECKF(strstr(err, "completion 200 tokens") && strstr(err, "verified drafts"), "stderr: %s", err);
        if (!strcmp(drafts[i], "oracle")) CHECKF(strstr(err, "(100.0 %)"), "the oracle was rejected: %s", err);
    }
}

/* Guards `dsflash chat` with drafting across turns: the second turn reuses the first's cache
 * (the drafter is reset to the reused prefix) and the text equals the plain chat's. */
TEST(spec_cli_chat_identical) {
    NEED_SHARED(m, MODEL);
    static char ref[65536], out[65536];
    char cmd[2048];
    const char *fmt = "printf 'Hello\\nTell me more\\n' | %s chat -m %s --temp 0 -n 40 --threads 2 %s 2>&1 >%s/%s";
    snprintf(cmd, sizeof cmd, fmt, test_bin(), m, "", test_tmpdir(), "chat-plain.txt");
    CHECK(test_run(cmd, out, sizeof out) == 0);
    snprintf(cmd, sizeof cmd, fmt, test_bin(), m, "--draft oracle:1", test_tmpdir(), "chat-spec.txt");
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "cached") && strstr(out, "accepted 20 of 100 verified drafts"), "stderr: %s", out);
    snprintf(cmd, sizeof cmd, "cat %s/chat-plain.txt", test_tmpdir());
    CHECK(test_run(cmd, ref, sizeof ref) == 0 && strlen(ref) > 20);
    snprintf(cmd, sizeof cmd, "cat %s/chat-spec.txt", test_tmpdir());
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(ref, out), "the drafted chat differs:\n%s\nagainst\n%s", out, ref);
}

/* Guards the option errors: a DSpark file before the loader exists, a bad oracle index,
 * out-of-range --draft-max / --draft-min-p, a missing value. */
TEST(spec_cli_errors) {
    NEED_SHARED(m, MODEL);
    char cmd[1024], out[4096];
    struct {
        const char *opt, *want;
        int rc;
    } cases[] = {
        {"--draft /nonexistent.gguf", "DSpark drafts are not supported yet", 1},
        {"--draft oracle:7", "expected oracle:K", 1},
        {"--draft oracle --draft-max 17", "bad --draft-max '17'", 2},
        {"--draft oracle --draft-min-p 1.5", "bad --draft-min-p '1.5'", 2},
        {"--draft", "needs a value", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --raw -n 2 %s 2>&1", test_bin(), m, cases[i].opt);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == cases[i].rc && strstr(out, cases[i].want), "%s: rc %d, '%s'", cases[i].opt, rc, out);
    }
}

/* Two requests at once (both slots busy): 200 tokens, and one that runs into the context
 * limit (its last tokens are decoded without drafts, inside the batched forward). */
static int two_texts(test_server *s, char *t1, char *t2, size_t cap) {
    char cmd[4096], out[65536];
    const char *r1 = "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true}";
    const char *r2 = "{\"prompt\":\"The capital of\",\"temperature\":0,\"ignore_eos\":true}";
    snprintf(cmd, sizeof cmd,
             "d=%s; (curl -s -m 300 -H 'Content-Type: application/json' -d '%s' http://127.0.0.1:%d/v1/completions "
             ">$d/r1.json &"
             " curl -s -m 300 -H 'Content-Type: application/json' -d '%s' http://127.0.0.1:%d/v1/completions "
             ">$d/r2.json; wait)",
             test_tmpdir(), r1, s->port, r2, s->port);
    if (test_run(cmd, out, sizeof out) != 0) return -1;
    for (int k = 1; k <= 2; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/r%d.json", test_tmpdir(), k);
        json_t *j = json_load_file(path, 0, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *txt = json_string_value(json_object_get(ch, "text"));
        const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
        if (!txt || !fin || strcmp(fin, "length")) {
            json_decref(j);
            return -1;
        }
        snprintf(k == 1 ? t1 : t2, cap, "%s", txt);
        json_decref(j);
    }
    return 0;
}

/* Guards greedy identity through `dsflash serve` (per slot, inside the batching), and the
 * acceptance statistics of /health and of the request log line. */
TEST(spec_serve_identical) {
    NEED_SHARED(m, MODEL);
    char msg[256], out[8192];
    if (test_run("curl --version", out, sizeof out) != 0) SKIP("needs curl");
    static char p1[32768], p2[32768], d1[32768], d2[32768];
    test_server s;
    CHECKF(test_server_start(&s, m, "--slots 2 --ctx 230", msg, sizeof msg) == 0, "%s", msg);
    int rc = two_texts(&s, p1, p2, sizeof p1);
    CHECK(test_server_stop(&s) == 0);
    CHECK(rc == 0 && strlen(p1) > 100);
    CHECKF(test_server_start(&s, m, "--slots 2 --ctx 230 --draft oracle:3", msg, sizeof msg) == 0, "%s", msg);
    rc = two_texts(&s, d1, d2, sizeof d1);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/health", s.port);
    int hrc = test_run(cmd, out, sizeof out);
    CHECK(test_server_stop(&s) == 0);
    CHECK(rc == 0 && hrc == 0);
    CHECKF(!strcmp(p1, d1), "200 tokens: the drafted text differs");
    CHECKF(!strcmp(p2, d2), "to the context limit: the drafted text differs");
    json_t *h = json_loads(out, 0, NULL);
    json_t *sp = json_object_get(h, "speculative");
    long long ver = json_integer_value(json_object_get(sp, "verified"));
    long long acc = json_integer_value(json_object_get(sp, "accepted"));
    /* oracle:3: per round drafts 0..2 accepted, draft 3 rejected */
    CHECKF(ver > 100 && acc > 0 && acc < ver, "/health: %s", out);
    json_decref(h);
    snprintf(cmd, sizeof cmd, "grep -c 'draft [0-9]*/[0-9]* accepted in [0-9]* rounds' %s", s.log);
    CHECK(test_run(cmd, out, sizeof out) == 0 && atoi(out) == 2);
}

/* Guards `bench --draft`: the table has T = 1..B+1 with T = 1 as the unit, the draft's cost,
 * and projections where the policy never falls below plain decoding (>= 1.00; the oracle's
 * draft costs about B decode steps, so drafting mostly loses here). No timing is asserted. */
TEST(spec_bench_draft) {
    NEED_SHARED(m, MODEL);
    static char out[16384];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench -m %s --draft oracle --threads 2 2>&1", test_bin(), m);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "T=1 ") && strstr(out, "T=6 ") && strstr(out, "fwd1_ratio=1.000"), "%s", out);
    const char *last = strstr(out, "draft_ms=");
    CHECKF(last, "no machine-readable line: %s", out);
    const char *keys[] = {"policy50=", "policy70=", "policy90=", "always90="};
    for (size_t k = 0; k < 4; k++) {
        const char *at = strstr(last, keys[k]);
        CHECKF(at, "no %s in %s", keys[k], last);
        double v = atof(at + strlen(keys[k]));
        if (k < 3) CHECKF(v >= 1.0, "%s%.3f: the policy projects a slowdown", keys[k], v);
        else CHECKF(v > 0, "always-B: %.3f", v);
    }
}
