/* chat.c: the V4.1 prompt encoder.
 * Guards against: any byte of drift from the official encoding.py on the fixtures in
 * ../shared/fixtures/chat (render cases and official error messages), and regressions of the
 * OpenAI-level mapping of the llama.cpp PR (effort names, system-message tools, extra keys,
 * media markers, continuation). `dsflash render` is checked in tests/e2e/chat.c. */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "dsflash.h"
#include "text/pyjson.h"
#include "base/util.h"

static json_t *loads(const char *s) { return pyjson_loads(s, strlen(s), NULL); }

/* ==== fixtures ============================================================================= */

/* Checks one render case; returns NULL if it passes, else a description (static buffer). */
static const char *check_case(const json_t *c) {
    static char why[1024];
    const char *name = json_string_value(json_object_get(c, "name"));
    dsf_buf out = {0};
    json_t *images = NULL;
    char err[DSF_ERR_LEN] = "";
    int rc = chat_encode(json_object_get(c, "messages"), json_object_get(c, "args"), &out, &images, err);
    const char *res = NULL;
    const json_t *ee = json_object_get(c, "expected_error");
    const char *got = out.data ? (const char *)out.data : "";
    if (ee) {
        const char *exact = json_string_value(json_object_get(ee, "message"));
        const char *sub = json_string_value(json_object_get(ee, "message_contains"));
        if (rc == 0) snprintf(why, sizeof why, "%s: expected error, got a prompt", name), res = why;
        else if (exact && strcmp(err, exact)) snprintf(why, sizeof why, "%s: error '%s', want '%s'", name, err, exact), res = why;
        else if (sub && !strstr(err, sub)) snprintf(why, sizeof why, "%s: error '%s' lacks '%s'", name, err, sub), res = why;
        goto done;
    }
    if (rc) {
        snprintf(why, sizeof why, "%s: unexpected error: %s", name, err);
        res = why;
        goto done;
    }
    const json_t *exp = json_object_get(c, "expected");
    const json_t *prompt = json_object_get(exp, "prompt");
    if (prompt && (out.len != json_string_length(prompt) || memcmp(got, json_string_value(prompt), out.len))) {
        size_t k = 0;
        while (k < out.len && k < json_string_length(prompt) && got[k] == json_string_value(prompt)[k]) k++;
        snprintf(why, sizeof why, "%s: prompt differs at byte %zu: got '%.60s' want '%.60s'", name, k, got + k,
                 json_string_value(prompt) + k);
        res = why;
        goto done;
    }
    const json_t *eimg = json_object_get(exp, "images");
    if (eimg) {
        dsf_buf a = {0}, b = {0};
        pyjson_dumps(&a, eimg, NULL);
        pyjson_dumps(&b, images, NULL);
        bool same = a.len == b.len && !memcmp(a.data, b.data, a.len);
        if (!same) snprintf(why, sizeof why, "%s: images %s, want %s", name, (char *)b.data, (char *)a.data), res = why;
        dsf_buf_free(&a);
        dsf_buf_free(&b);
        if (res) goto done;
    }
    const json_t *arr;
    size_t i;
    json_t *s;
    arr = json_object_get(c, "expected_contains");
    json_array_foreach(arr, i, s) {
        if (!memmem(got, out.len, json_string_value(s), json_string_length(s))) {
            snprintf(why, sizeof why, "%s: prompt lacks '%.200s'", name, json_string_value(s));
            res = why;
            goto done;
        }
    }
    arr = json_object_get(c, "expected_not_contains");
    json_array_foreach(arr, i, s) {
        if (memmem(got, out.len, json_string_value(s), json_string_length(s))) {
            snprintf(why, sizeof why, "%s: prompt contains '%.200s'", name, json_string_value(s));
            res = why;
            goto done;
        }
    }
    s = json_object_get(c, "expected_endswith");
    if (s && (out.len < json_string_length(s) ||
              memcmp(got + out.len - json_string_length(s), json_string_value(s), json_string_length(s)))) {
        snprintf(why, sizeof why, "%s: prompt does not end with '%.200s'", name, json_string_value(s));
        res = why;
    }
done:
    dsf_buf_free(&out);
    json_decref(images);
    return res;
}

static void run_fixture(test_ctx *t, const char *path, const char *label, size_t min_cases) {
    json_t *fx = test_load_json(path);
    CHECKF(fx, "cannot load %s", path);
    const json_t *cases = json_object_get(fx, "cases");
    size_t n = json_array_size(cases), ok = 0;
    const char *first_fail = NULL;
    char keep[1024] = "";
    for (size_t i = 0; i < n; i++) {
        const char *why = check_case(json_array_get(cases, i));
        if (!why) ok++;
        else if (!first_fail) {
            snprintf(keep, sizeof keep, "%s", why);
            first_fail = keep;
        }
    }
    json_decref(fx);
    printf("     %s: %zu/%zu render cases pass\n", label, ok, n);
    CHECKF(n >= min_cases, "%s: only %zu cases (fixture truncated?)", label, n);
    CHECKF(ok == n, "%s: %zu of %zu failed; first: %s", label, n - ok, n, first_fail);
}

TEST(chat_fixture_official_kiojuvr) {
    NEED_SHARED(p, "fixtures/chat/official_kiojuvr_encoding_fixtures.json");
    run_fixture(t, p, "official_kiojuvr_encoding_fixtures", 5);
}
TEST(chat_fixture_official_vllm) {
    NEED_SHARED(p, "fixtures/chat/official_vllm_reference_encoder.json");
    run_fixture(t, p, "official_vllm_reference_encoder", 2);
}
TEST(chat_fixture_official_test_assertions) {
    NEED_SHARED(p, "fixtures/chat/official_test_encoding_assertions.json");
    run_fixture(t, p, "official_test_encoding_assertions", 40);
}
TEST(chat_fixture_generated_edge_cases) {
    NEED_SHARED(p, "fixtures/chat/generated_reconstructed_edge_cases.json");
    run_fixture(t, p, "generated_reconstructed_edge_cases", 56);
}
/* Held back from this repository (chat-format.md §6); run when someone drops it in. */
TEST(chat_fixture_apathy_atlas_render) {
    NEED_SHARED(p, "fixtures/chat/peer_apathy_atlas_render.json");
    run_fixture(t, p, "peer_apathy_atlas_render", 1);
}

/* The tools head/tail constants must be the exact bytes of v41_constants.json. */
TEST(chat_tools_block_constants) {
    NEED_SHARED(p, "fixtures/chat/v41_constants.json");
    json_t *k = test_load_json(p);
    CHECK(k);
    const json_t *st = json_object_get(k, "strings");
    const char *head = json_string_value(json_object_get(st, "tools_block_head"));
    const char *tail = json_string_value(json_object_get(st, "tools_block_tail"));
    CHECK(head && tail);
    json_t *msgs = loads("[{\"role\":\"system\",\"content\":\"\",\"tools\":[{\"type\":\"function\","
                                "\"function\":{\"name\":\"f\"}}]}]");
    CHECK(msgs);
    json_t *args = json_pack("{s:s}", "thinking_mode", "chat");
    dsf_buf out = {0};
    char err[DSF_ERR_LEN];
    CHECKF(chat_encode(msgs, args, &out, NULL, err) == 0, "%s", err);
    dsf_buf want = {0};
    dsf_buf_appendf(&want, "<｜begin▁of▁sentence｜><｜System｜>\n\n%s{\"name\": \"f\"}%s", head, tail);
    CHECKF(out.len == want.len && !memcmp(out.data, want.data, out.len), "got %s", (char *)out.data);
    dsf_buf_free(&out);
    dsf_buf_free(&want);
    json_decref(msgs);
    json_decref(args);
    json_decref(k);
}

/* ==== OpenAI-level mapping (llama.cpp PR test_deepseek_v4_1_message_fields) ================= */

static char *render_openai(const char *req, char *err) {
    dsf_chat_prompt p;
    if (dsf_chat_render_openai(req, strlen(req), &p, err)) return NULL;
    char *s = p.prompt;
    p.prompt = NULL;
    dsf_chat_prompt_free(&p);
    return s;
}

#define EFFORT_LINE(n) "<｜System｜>Reasoning Effort: " n " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"

TEST(chat_openai_effort_names) {
    static const struct { const char *effort, *line; } tab[] = {
        {"\"minimal\"", EFFORT_LINE("50")}, {"\"low\"", EFFORT_LINE("50")},   {"\"medium\"", EFFORT_LINE("75")},
        {"\"high\"", EFFORT_LINE("75")},    {"\"xhigh\"", EFFORT_LINE("100")}, {"\"max\"", EFFORT_LINE("100")},
        {"33", EFFORT_LINE("33")},          {"null", EFFORT_LINE("75")},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char req[256], err[DSF_ERR_LEN];
        snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"reasoning_effort\":%s}",
                 tab[i].effort);
        char *got = render_openai(req, err);
        char want[512];
        snprintf(want, sizeof want, "<｜begin▁of▁sentence｜>%s<｜User｜>q<｜Assistant｜><think>", tab[i].line);
        CHECKF(got && !strcmp(got, want), "effort %s: got %s", tab[i].effort, got ? got : err);
        free(got);
    }
    char err[DSF_ERR_LEN];
    char *got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"reasoning_effort\":\"none\"}", err);
    CHECKF(got && !strcmp(got, "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>"), "none -> chat: %s", got);
    free(got);
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"reasoning_effort\":\"bogus\"}", err);
    CHECKF(!got && strstr(err, "Invalid reasoning effort for deepseek_v41: bogus"), "unknown names keep the official error");
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"chat_template_kwargs\":{\"thinking\":false}}", err);
    CHECKF(got && !strcmp(got, "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>"), "thinking off: %s", got);
    free(got);
}

TEST(chat_openai_extra_keys_and_media) {
    char err[DSF_ERR_LEN];
    /* task on a user message passes through */
    char *got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"task\":\"action\"}],\"thinking\":false}", err);
    CHECKF(got && !strcmp(got, "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think><｜action｜>"), "task: %s", got ? got : err);
    free(got);
    /* tool-call namespace passes through */
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
                        "\"tool_calls\":[{\"type\":\"function\",\"namespace\":\"ns\",\"function\":{\"name\":\"f\","
                        "\"arguments\":{\"x\":1}}}]}],\"thinking\":false}", err);
    CHECKF(got && strstr(got, "<｜DSML｜ invoke name=\"ns::f\">"), "namespace: %s", got ? got : err);
    free(got);
    /* media markers stay separate parts joined by \n\n */
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":"
                        "\"media_marker\",\"text\":\"<__media__>\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"thinking\":false}", err);
    CHECKF(got && !strcmp(got, "<｜begin▁of▁sentence｜><｜User｜>a\n\n<__media__>\n\nb<｜Assistant｜></think>"), "media: %s", got ? got : err);
    free(got);
    /* `reasoning` is an alias of reasoning_content */
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\","
                        "\"reasoning\":\"r\"}]}", err);
    CHECKF(got && strstr(got, "<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>"), "reasoning alias: %s", got ? got : err);
    free(got);
    /* user content null: "" at the OpenAI level (the encoder itself raises TypeError) */
    got = render_openai("{\"messages\":[{\"role\":\"user\",\"content\":null}],\"thinking\":false}", err);
    CHECKF(got && !strcmp(got, "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜></think>"), "null content: %s", got ? got : err);
    free(got);
}

TEST(chat_openai_tools_on_system) {
    char err[DSF_ERR_LEN];
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":"
                        "\"object\"}}}]";
    char req[1024];
    /* no system message: an empty one is inserted at index 0 */
    snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"thinking\":false}", tools);
    char *got = render_openai(req, err);
    CHECKF(got && !strncmp(got, "<｜begin▁of▁sentence｜><｜System｜>\n\n## Tools\n\n", strlen("<｜begin▁of▁sentence｜><｜System｜>\n\n## Tools\n\n")) &&
           strstr(got, "{\"name\": \"get_time\", \"parameters\": {\"type\": \"object\"}}"), "inserted system: %s", got ? got : err);
    free(got);
    /* an existing system message receives them */
    snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"q\"}],%s,"
             "\"thinking\":false}", tools);
    got = render_openai(req, err);
    CHECKF(got && !strncmp(got, "<｜begin▁of▁sentence｜><｜System｜>s\n\n## Tools", strlen("<｜begin▁of▁sentence｜><｜System｜>s\n\n## Tools")),
           "system tools: %s", got ? got : err);
    free(got);
    /* tool_choice none omits them */
    snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"tool_choice\":\"none\",\"thinking\":false}", tools);
    got = render_openai(req, err);
    CHECKF(got && !strstr(got, "## Tools"), "tool_choice none: %s", got ? got : err);
    free(got);
}

TEST(chat_openai_continuation) {
    char err[DSF_ERR_LEN];
    dsf_chat_prompt p;
    /* content continuation: no EOS, generation continues in content */
    const char *r1 = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"Hello, \","
                     "\"reasoning_content\":\"I'm thinking\"}],\"continue_final_message\":true}";
    CHECKF(dsf_chat_render_openai(r1, strlen(r1), &p, err) == 0, "%s", err);
    const char *w1 = "<｜User｜>q<｜Assistant｜><think>I'm thinking</think>Hello, ";
    CHECKF(p.prompt_len >= strlen(w1) && !strcmp(p.prompt + p.prompt_len - strlen(w1), w1) && !p.gen_reasoning,
           "content continuation: %s", p.prompt);
    dsf_chat_prompt_free(&p);
    /* reasoning continuation: the closing </think> is not rendered, generation is in reasoning */
    const char *r2 = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
                     "\"reasoning_content\":\"I'm\"}],\"continue_final_message\":true}";
    CHECKF(dsf_chat_render_openai(r2, strlen(r2), &p, err) == 0, "%s", err);
    const char *w2 = "<｜User｜>q<｜Assistant｜><think>I'm";
    CHECKF(p.prompt_len >= strlen(w2) && !strcmp(p.prompt + p.prompt_len - strlen(w2), w2) && p.gen_reasoning,
           "reasoning continuation: %s", p.prompt);
    dsf_chat_prompt_free(&p);
    /* a normal thinking prompt starts generation in reasoning; chat mode does not */
    const char *r3 = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}";
    CHECK(dsf_chat_render_openai(r3, strlen(r3), &p, err) == 0 && p.gen_reasoning);
    dsf_chat_prompt_free(&p);
    const char *r4 = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"thinking\":{\"type\":\"disabled\"}}";
    CHECK(dsf_chat_render_openai(r4, strlen(r4), &p, err) == 0 && !p.gen_reasoning);
    dsf_chat_prompt_free(&p);
    const char *r5 = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"continue_final_message\":true}";
    CHECK(dsf_chat_render_openai(r5, strlen(r5), &p, err) == -1 && strstr(err, "final assistant"));
}

/* Hostile input: wrong types everywhere give an error line, never a crash. */
TEST(chat_bad_input_types) {
    static const char *const reqs[] = {
        "[]", "{\"messages\":5,\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[5],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"args\":{}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"args\":{\"thinking_mode\":\"chat\",\"bogus\":1}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"args\":{\"thinking_mode\":\"other\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[5,{\"type\":\"text\",\"text\":7}]}],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"system\",\"tools\":[5]}],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":5}]}],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{\"a\":1}}],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content_blocks\":\"x\"}],\"args\":{\"thinking_mode\":\"chat\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"args\":{\"thinking_mode\":\"chat\",\"context\":7}}",
    };
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
        dsf_chat_prompt p;
        char err[DSF_ERR_LEN] = "";
        int rc = dsf_chat_render_json(reqs[i], strlen(reqs[i]), &p, err);
        CHECKF(rc == -1 && err[0] && !strchr(err, '\n'), "request %zu: rc %d err '%s'", i, rc, err);
    }
}

