/* webui.c: the browser chat page's HTTP answers (webui.h): which paths are the page's, and each
 * file's response with its headers. The bytes come from $(BUILD)/webui_data.c (generated).
 * Must not: touch the engine, the slots or the scheduler; read anything from disk.
 * Invariant: every answer carries the Content-Security-Policy below, which allows scripts and
 * styles only from this server (no inline script, no eval) and network calls only to it, so
 * that text a model writes can never load or run anything even if the page rendered it as HTML. */
#include "server/webui.h"

#include <string.h>

#define WEBUI_CONFIG "/webui/config.json"

/* img-src data: blob: for the images a user attaches (shown before they are sent) */
static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                          "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

static const webui_file *find(const char *url) {
    if (!strcmp(url, "/")) url = "/index.html";
    for (int i = 0; i < webui_n_files; i++)
        if (!strcmp(webui_files[i].path, url)) return &webui_files[i];
    return NULL;
}

bool srv_webui_path(const char *url) { return find(url) || !strcmp(url, WEBUI_CONFIG); }

static void add_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
}

/* An If-None-Match list ("a", W/"b", *) holding etag. */
static bool etag_matches(const char *inm, const char *etag) {
    size_t n = strlen(etag);
    for (const char *p = inm; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (*p == '*') return true;
        if (!strncmp(p, "W/", 2)) p += 2;
        if (!strncmp(p, etag, n) && (p[n] == 0 || p[n] == ',' || p[n] == ' ' || p[n] == '\t')) return true;
        p = strchr(p, ',');
    }
    return false;
}

struct MHD_Response *srv_webui_response(const char *url, const char *if_none_match, bool api_key, int *status) {
    struct MHD_Response *r;
    const webui_file *f = find(url);
    if (!f) { /* the config: tiny, and it changes with the server's options */
        const char *body = api_key ? "{\"api_key\":true}" : "{\"api_key\":false}";
        r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
        if (!r) return NULL;
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Cache-Control", "no-store");
        *status = 200;
    } else {
        bool same = if_none_match && etag_matches(if_none_match, f->etag);
        r = MHD_create_response_from_buffer(same ? 0 : f->len, same ? (void *)"" : (void *)f->data,
                                            MHD_RESPMEM_PERSISTENT);
        if (!r) return NULL;
        if (!same) MHD_add_response_header(r, "Content-Type", f->ctype);
        /* revalidated on every load: a new binary serves a new page at once */
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "ETag", f->etag);
        *status = same ? 304 : 200;
    }
    add_headers(r);
    return r;
}
