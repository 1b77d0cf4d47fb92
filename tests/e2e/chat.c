/* chat.c: `dsflash render`, the prompt encoder's command.
 * Guards against: `dsflash render` adding or losing bytes against the official fixtures of
 * ../shared/fixtures/chat, and an official error that does not reach stderr and the exit
 * status. */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsflash.h"
#include "text/pyjson.h"
#include "base/util.h"

static json_t *loads(const char *s) { return pyjson_loads(s, strlen(s), NULL); }

/* ==== dsflash render ======================================================================= */

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static char *slurp(const char *path, size_t *len) {
    uint8_t *d;
    if (dsf_read_file(path, &d, len, NULL)) return NULL;
    return (char *)d;
}

/* Runs `dsflash render [opt]` on the case's {"messages", "args"}; returns the exit status. */
static int cli_render(const json_t *c, const char *opt, char **out, size_t *out_len, char **errtext) {
    char in[512], o[512], e[512], cmd[2048];
    snprintf(in, sizeof in, "%s/render_in.json", test_tmpdir());
    snprintf(o, sizeof o, "%s/render_out.txt", test_tmpdir());
    snprintf(e, sizeof e, "%s/render_err.txt", test_tmpdir());
    json_t *req = json_pack("{s:O,s:O}", "messages", json_object_get(c, "messages"), "args",
                            json_object_get(c, "args"));
    dsf_buf b = {0};
    pyjson_dumps(&b, req, NULL);
    json_decref(req);
    write_file(in, b.data, b.len);
    dsf_buf_free(&b);
    snprintf(cmd, sizeof cmd, "%s render %s < %s > %s 2> %s", test_bin(), opt, in, o, e);
    int rc = test_run(cmd, NULL, 0);
    size_t el;
    *out = slurp(o, out_len);
    *errtext = slurp(e, &el);
    return rc;
}

TEST(chat_cli_render_exact_bytes) {
    NEED_SHARED(p, "fixtures/chat/official_vllm_reference_encoder.json");
    json_t *fx = test_load_json(p);
    CHECK(fx);
    const json_t *cases = json_object_get(fx, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        char *out, *errt;
        size_t n;
        int rc = cli_render(c, "", &out, &n, &errt);
        const json_t *want = json_object_get(json_object_get(c, "expected"), "prompt");
        CHECKF(rc == 0, "exit %d: %s", rc, errt ? errt : "");
        CHECKF(out && n == json_string_length(want) && !memcmp(out, json_string_value(want), n),
               "case %zu: stdout is not the exact prompt (%zu vs %zu bytes)", i, n, json_string_length(want));
        free(out);
        free(errt);
    }
    json_decref(fx);
}

TEST(chat_cli_render_official_error) {
    json_t *c = loads("{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"}],\"args\":{\"thinking_mode\":\"chat\"}}");
    CHECK(c);
    char *out, *errt;
    size_t n;
    int rc = cli_render(c, "", &out, &n, &errt);
    CHECKF(rc == 1, "exit status %d, want 1", rc);
    CHECKF(out && n == 0, "no prompt bytes on stdout on error");
    CHECKF(errt && !strcmp(errt, "dsflash render: Unknown role: developer\n"), "stderr: %s", errt ? errt : "");
    free(out);
    free(errt);
    json_decref(c);
    /* NUL and \r\n in content pass through raw */
    c = loads("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\\r\\n\"}],\"args\":{\"thinking_mode\":\"chat\"}}");
    CHECK(c);
    rc = cli_render(c, "", &out, &n, &errt);
    static const char want[] = "<｜begin▁of▁sentence｜><｜User｜>a\0b\r\n<｜Assistant｜></think>";
    CHECKF(rc == 0 && n == sizeof want - 1 && !memcmp(out, want, n), "NUL/CRLF not passed through (%zu bytes)", n);
    free(out);
    free(errt);
    json_decref(c);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "echo '{' | %s render 2>/dev/null", test_bin());
    CHECKF(test_run(cmd, NULL, 0) == 1, "invalid JSON must exit 1");
}
