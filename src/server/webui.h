/* webui.h: the browser chat page (webui/ in the source tree) that `dsflash serve` answers on
 * GET / (server layer). The files' bytes are compiled in: scripts/gen_webui.py writes
 * $(BUILD)/webui_data.c, which defines webui_files and webui_n_files. */
#ifndef DSF_SERVER_WEBUI_H
#define DSF_SERVER_WEBUI_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

/* One embedded file: its URL path, Content-Type, bytes and strong ETag (quoted). */
typedef struct {
    const char *path;
    const char *ctype;
    const unsigned char *data;
    size_t len;
    const char *etag;
} webui_file;

extern const webui_file webui_files[];
extern const int webui_n_files;

/* True when url names a file of the page ("/" is "/index.html") or its config. */
bool srv_webui_path(const char *url);

/* The answer to GET url (srv_webui_path(url) true): the file with its security headers, 304
 * when if_none_match carries its ETag, or the config JSON ({"api_key": true|false}: whether
 * the API needs a key, so that the page asks for one before its first call). *status is set;
 * NULL only when libmicrohttpd cannot allocate. The caller queues and destroys it. */
struct MHD_Response *srv_webui_response(const char *url, const char *if_none_match, bool api_key, int *status);

#endif
