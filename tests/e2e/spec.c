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

#include "helpers.h"
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

/* Guards greedy identity with the real DSpark draft (tinyds-dspark.gguf, BF16, and the F32
 * file with shorter blocks), verifying every drafted token (--draft-policy always: the random
 * draft is nearly always rejected, so the cost policy would soon stop drafting). */
TEST(spec_cli_dspark_identical) {
    NEED_SHARED(m, MODEL);
    NEED_SHARED(dbf, "testdata/tinyds/tinyds-dspark.gguf");
    NEED_SHARED(df32, "testdata/tinyds/tinyds-dspark-f32.gguf");
    static char ref[65536], out[65536], err[4096];
    char cmd[2048], b[512];
    snprintf(b, sizeof b, "run -m %s -p 'Once upon a time' --raw -n 200 --ignore-eos --temp 0 --threads 2", m);
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", test_bin(), b);
    CHECK(test_run(cmd, ref, sizeof ref) == 0 && strlen(ref) > 100);
    const char *opts[][2] = {{dbf, "--draft-policy always"}, {df32, "--draft-policy always --draft-max 3"}};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --draft %s %s 2>%s/spec.err", test_bin(), b, opts[i][0], opts[i][1],
                 test_tmpdir());
        CHECK(test_run(cmd, out, sizeof out) == 0);
        CHECKF(!strcmp(out, ref), "--draft %s %s changed the text", opts[i][0], opts[i][1]);
        snprintf(cmd, sizeof cmd, "cat %s/spec.err", test_tmpdir());
        CHECK(test_run(cmd, err, sizeof err) == 0);
        /* a round per committed token but the first two, none of them a plain step */
        CHECKF(strstr(err, "completion 200 tokens") && strstr(err, "198 rounds, 0 plain steps"), "stderr: %s", err);
    }
}

/* Writes tinyds-dspark.gguf with the u32 at `at` bytes after key's name replaced by v each
 * (an edited copy: the layout's other values stay). Returns the copy's path or NULL. */
static const char *patched_draft(const char *src, const char *key, int skip, const uint32_t *v, int n,
                                 const char *name) {
    long size;
    unsigned char *b = test_slurp(src, &size);
    if (!b) return NULL;
    size_t kl = strlen(key);
    unsigned char *at = NULL;
    for (long i = 0; i + (long)kl < size && !at; i++)
        if (!memcmp(b + i, key, kl)) at = b + i + kl + skip;
    const char *out = at ? test_tmpfile(name) : NULL;
    FILE *f = out ? fopen(out, "wb") : NULL;
    if (f) {
        memcpy(at, v, (size_t)n * sizeof *v);
        if (fwrite(b, 1, (size_t)size, f) != (size_t)size) out = NULL;
        fclose(f);
    }
    free(b);
    return f ? out : NULL;
}

/* Guards the draft's generality (the held-back set varies them): a block of 3 and of 8
 * tokens, and other target layers ([1, 3, 6]), keep greedy identity, each round verifying the
 * file's block (the same weights: the block size and the targets are metadata). */
TEST(spec_cli_dspark_other_shapes) {
    NEED_SHARED(m, MODEL);
    NEED_SHARED(dr, "testdata/tinyds/tinyds-dspark.gguf");
    static char ref[65536], out[65536], err[4096];
    char cmd[2048], b[512];
    snprintf(b, sizeof b, "run -m %s -p 'Once upon a time' --raw -n 60 --ignore-eos --temp 0 --threads 2", m);
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", test_bin(), b);
    CHECK(test_run(cmd, ref, sizeof ref) == 0 && strlen(ref) > 20);
    static const uint32_t b3 = 3, b8 = 8, tl[3] = {1, 3, 6};
    /* dflash.block_size: u32 type, then the value; dflash.target_layers: array type, element
     * type, count (u64), then the values */
    const char *files[3] = {patched_draft(dr, "dflash.block_size", 4, &b3, 1, "ds-b3.gguf"),
                            patched_draft(dr, "dflash.block_size", 4, &b8, 1, "ds-b8.gguf"),
                            patched_draft(dr, "dflash.target_layers", 16, tl, 3, "ds-t136.gguf")};
    const int block[3] = {3, 8, 5}; /* drafts verified per round */
    for (int i = 0; i < 3; i++) {
        CHECKF(files[i] != NULL, "cannot write the edited draft %d", i);
        if (!files[i]) continue;
        snprintf(cmd, sizeof cmd, "%s %s --draft %s --draft-policy always 2>%s/spec.err", test_bin(), b, files[i],
                 test_tmpdir());
        CHECK(test_run(cmd, out, sizeof out) == 0);
        CHECKF(!strcmp(out, ref), "--draft %s changed the text", files[i]);
        snprintf(cmd, sizeof cmd, "cat %s/spec.err", test_tmpdir());
        CHECK(test_run(cmd, err, sizeof err) == 0);
        char want[64];
        snprintf(want, sizeof want, "of %d verified drafts", 58 * block[i]);
        CHECKF(strstr(err, "58 rounds, 0 plain steps") && strstr(err, want), "%s: %s", files[i], err);
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
        {"--draft /nonexistent.gguf", "--draft /nonexistent.gguf", 1},
        {"--draft oracle --draft-policy sometimes", "bad --draft-policy 'sometimes'", 2},
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

/* Serves the two requests without drafting and with `--draft` + draft_opts (2 slots, a 230-token
 * context): the texts must be identical; *ver, *acc: /health's verified and accepted drafts. */
static void serve_identical(test_ctx *t, const char *m, const char *draft_opts, long long *ver, long long *acc,
                            char *log, size_t log_cap) {
    char msg[512], out[8192], extra[768];
    static char p1[32768], p2[32768], d1[32768], d2[32768];
    *ver = *acc = -1;
    test_server s;
    CHECKF(test_server_start(&s, m, "--slots 2 --ctx 230", msg, sizeof msg) == 0, "%s", msg);
    int rc = two_texts(&s, p1, p2, sizeof p1);
    CHECK(test_server_stop(&s) == 0);
    CHECK(rc == 0 && strlen(p1) > 100);
    snprintf(extra, sizeof extra, "--slots 2 --ctx 230 --draft %s", draft_opts);
    CHECKF(test_server_start(&s, m, extra, msg, sizeof msg) == 0, "%s", msg);
    rc = two_texts(&s, d1, d2, sizeof d1);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/health", s.port);
    int hrc = test_run(cmd, out, sizeof out);
    CHECK(test_server_stop(&s) == 0);
    snprintf(log, log_cap, "%s", s.log);
    CHECK(rc == 0 && hrc == 0);
    CHECKF(!strcmp(p1, d1), "--draft %s, 200 tokens: the drafted text differs", draft_opts);
    CHECKF(!strcmp(p2, d2), "--draft %s, to the context limit: the drafted text differs", draft_opts);
    json_t *h = json_loads(out, 0, NULL);
    json_t *sp = json_object_get(h, "speculative");
    *ver = json_integer_value(json_object_get(sp, "verified"));
    *acc = json_integer_value(json_object_get(sp, "accepted"));
    json_decref(h);
}

/* Guards greedy identity through `dsflash serve` (per slot, inside the batching), and the
 * acceptance statistics of /health and of the request log line. */
TEST(spec_serve_identical) {
    NEED_SHARED(m, MODEL);
    char out[256], log[512];
    if (test_run("curl --version", out, sizeof out) != 0) SKIP("needs curl");
    long long ver, acc;
    serve_identical(t, m, "oracle:3", &ver, &acc, log, sizeof log);
    /* oracle:3: per round drafts 0..2 accepted, draft 3 rejected */
    CHECKF(ver > 100 && acc > 0 && acc < ver, "/health: verified %lld, accepted %lld", ver, acc);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -c 'draft [0-9]*/[0-9]* accepted in [0-9]* rounds' %s", log);
    CHECK(test_run(cmd, out, sizeof out) == 0 && atoi(out) == 2);
}

/* Guards the real DSpark draft through `dsflash serve` (its rings per slot, bound to the slot's
 * session): the same greedy texts as without drafting, every draft verified. */
TEST(spec_serve_dspark_identical) {
    NEED_SHARED(m, MODEL);
    NEED_SHARED(dr, "testdata/tinyds/tinyds-dspark.gguf");
    char out[256], log[512], opts[600];
    if (test_run("curl --version", out, sizeof out) != 0) SKIP("needs curl");
    long long ver, acc;
    snprintf(opts, sizeof opts, "%s --draft-policy always", dr);
    serve_identical(t, m, opts, &ver, &acc, log, sizeof log);
    CHECKF(ver > 100, "/health: verified %lld", ver);
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
