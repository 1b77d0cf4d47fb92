/* chat_impl.h: what the prompt encoder (chat.c) and its tool rendering (chat_tools.c) share;
 * private to those two files.
 * Must not: be included elsewhere (the module API is chat.h). */
#ifndef DSF_CHAT_IMPL_H
#define DSF_CHAT_IMPL_H

#include <jansson.h>
#include <string.h>

#include "base/util.h"
#include "text/pyjson.h"

static inline void put(dsf_buf *b, const char *s) { dsf_buf_append(b, s, strlen(s)); }

/* At most max bytes of a NUL-terminated string, not ending inside a UTF-8 character. */
static inline int cut(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n <= max) return (int)n;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    return (int)max;
}

/* str(x) of a value, appended ("None" for NULL). */
static inline void put_pystr(dsf_buf *b, const json_t *v) { pyjson_str(b, v); }
/* f"{x or ''}" */
static inline void put_or_empty(dsf_buf *b, const json_t *v) {
    if (pyjson_truthy(v)) pyjson_str(b, v);
}
/* render_tools of encoding.py (spec §2.10): the tool block of a system message, with the
 * schemas of `tools` (an OpenAI tool list; namespaces qualify the names). 0 / -1 with the
 * official exception text in err. */
int chat_render_tools(dsf_buf *b, const json_t *tools, char *err);

/* The DSML block of an assistant message's tool_calls (spec §2.8). 0 / -1 with err. */
int chat_render_tool_calls(dsf_buf *b, const json_t *calls, char *err);

#endif
