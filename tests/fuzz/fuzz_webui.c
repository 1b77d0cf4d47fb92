/* fuzz_webui.c: libFuzzer harness for the chat page's answers (src/server/webui.c:
 * srv_webui_response), whose hostile input is the If-None-Match header.
 *
 * Byte 0 picks the path (one of the embedded files, or the config) and, in bit 7, whether the
 * server has an API key; the rest is the header value. Checks: an answer always comes; the
 * config is always 200; a file is 200 or 304, and 304 only when the value holds the file's
 * ETag or '*'; the ETag alone always gets 304. Returns 1 for a 304. */
#include "fuzz_common.h"
#include "server/webui.h"

static int fz_webui_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t sel = fz_u8(&in);
    int pick = (sel & 0x7F) % (webui_n_files + 1);
    const char *url = pick == webui_n_files ? "/webui/config.json" : webui_files[pick].path;
    const char *etag = pick == webui_n_files ? NULL : webui_files[pick].etag;
    char *inm = dsf_xmalloc(in.n + 1);
    memcpy(inm, in.p, in.n);
    inm[in.n] = 0;
    int status = 0;
    struct MHD_Response *r = srv_webui_response(url, inm, (sel & 0x80) != 0, &status);
    FZ_REQUIRE(r != NULL, "no answer for %s", url);
    MHD_destroy_response(r);
    if (!etag) {
        FZ_REQUIRE(status == 200, "the config answered %d", status);
    } else {
        FZ_REQUIRE(status == 200 || status == 304, "%s answered %d", url, status);
        FZ_REQUIRE(status == 200 || strstr(inm, etag) || strchr(inm, '*'), "304 for '%s' without its ETag %s", inm, etag);
        int s2 = 0;
        r = srv_webui_response(url, etag, false, &s2);
        FZ_REQUIRE(r && s2 == 304, "its own ETag answered %d", s2);
        MHD_destroy_response(r);
    }
    free(inm);
    return status == 304;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_webui_one(data, size);
    return 0;
}
#endif
