/* chat_tools.c: tools in the DeepSeek-V4.1 prompt (spec chat-format.md §2.8, §2.10): the
 * tool schemas of a system message, with namespaces, and assistant tool calls rendered as
 * DSML, byte-exact with the checkpoint's encoding/encoding.py.
 *
 * Must not: parse model output (dsml.c does) or modify the caller's JSON (schemas are
 * rendered from copies).
 * Invariant: errors carry the official exception text, as in chat.c. */
#include "text/chat_impl.h"

#include <stdlib.h>
#include <string.h>

static const char TOOLS_HEAD[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
    "tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n"
    "...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified as is and set "
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON "
    "format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST "
    "output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool "
    "Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
/* Namespace name/description from a string or {name, description}; NULL when absent. */
static void ns_parts(const json_t *ns, const json_t **name, const json_t **desc) {
    *name = *desc = NULL;
    if (!pyjson_truthy(ns)) return;
    if (pyjson_is_str(ns)) *name = ns;
    else if (json_is_object(ns)) {
        *name = pyjson_get(ns, "name");
        *desc = pyjson_get(ns, "description");
        if (!pyjson_truthy(*name)) *name = NULL;
    }
}

/* Resolves (explicit namespace, possibly qualified name) into qualified name "ns::name" or
 * "name" appended to out. */
static int qualify_name(const json_t *ns_name, const json_t *name, dsf_buf *out, char *err) {
    if (!pyjson_is_str(name)) return dsf_seterr(err, "Tool name must be a string, got %s", pyjson_type_name(name));
    const char *nm = json_string_value(name);
    size_t nl = json_string_length(name);
    if (ns_name && !pyjson_is_str(ns_name))
        return dsf_seterr(err, "Tool namespace must be a string, got %s", pyjson_type_name(ns_name));
    if (ns_name && memmem(json_string_value(ns_name), json_string_length(ns_name), "::", 2))
        return dsf_seterr(err, "Tool namespace must not contain '::': %.*s", cut(json_string_value(ns_name), 200),
                          json_string_value(ns_name));
    const char *sep = memmem(nm, nl, "::", 2);
    const char *base = nm;
    size_t bl = nl;
    if (sep) {
        size_t pl = (size_t)(sep - nm);
        base = sep + 2;
        bl = nl - pl - 2;
        if (memmem(base, bl, "::", 2)) return dsf_seterr(err, "Tool name must not contain '::': %.*s", cut(nm, 200), nm);
        if (ns_name && (json_string_length(ns_name) != pl || memcmp(json_string_value(ns_name), nm, pl)))
            return dsf_seterr(err, "Conflicting tool namespaces: %.*s != %.*s", cut(json_string_value(ns_name), 200),
                              json_string_value(ns_name),
                              (int)pl, nm);
        dsf_buf_append(out, nm, pl);
        put(out, "::");
    } else if (ns_name) {
        dsf_buf_append(out, json_string_value(ns_name), json_string_length(ns_name));
        put(out, "::");
    }
    dsf_buf_append(out, base, bl);
    return 0;
}

/* The schema object rendered for one OpenAI tool entry (new reference). */
static json_t *tool_schema(const json_t *tool, char *err) {
    const json_t *fn = json_is_object(tool) ? json_object_get(tool, "function") : NULL;
    if (!json_is_object(fn)) {
        dsf_seterr(err, "tool has no 'function' object");
        return NULL;
    }
    const json_t *ns = pyjson_get(tool, "namespace");
    if (!pyjson_truthy(ns)) ns = pyjson_get(fn, "namespace");
    const json_t *ns_name, *ns_desc;
    ns_parts(ns, &ns_name, &ns_desc);
    json_t *schema = json_copy((json_t *)fn);
    json_object_del(schema, "namespace");
    const json_t *name = json_object_get(fn, "name");
    if (!name) {
        json_decref(schema);
        dsf_seterr(err, "tool function has no 'name'");
        return NULL;
    }
    if (ns_name || (pyjson_is_str(name) && memmem(json_string_value(name), json_string_length(name), "::", 2))) {
        dsf_buf q = {0};
        if (qualify_name(ns_name, name, &q, err)) {
            dsf_buf_free(&q);
            json_decref(schema);
            return NULL;
        }
        json_object_set_new(schema, "name", json_stringn_nocheck((const char *)q.data, q.len));
        dsf_buf_free(&q);
    }
    if (pyjson_is_str(ns_desc) && json_string_length(ns_desc)) {
        dsf_buf d = {0};
        dsf_buf_append(&d, json_string_value(ns_desc), json_string_length(ns_desc));
        put(&d, "\n");
        put_or_empty(&d, json_object_get(fn, "description"));
        json_object_set_new(schema, "description", json_stringn_nocheck((const char *)d.data, d.len));
        dsf_buf_free(&d);
    }
    return schema;
}

int chat_render_tools(dsf_buf *b, const json_t *tools, char *err) {
    if (!json_is_array(tools)) return dsf_seterr(err, "tools must be a list");
    put(b, TOOLS_HEAD);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *s = tool_schema(json_array_get(tools, i), err);
        if (!s) return -1;
        if (i) put(b, "\n");
        int rc = pyjson_dumps(b, s, err);
        json_decref(s);
        if (rc) return -1;
    }
    put(b, TOOLS_TAIL);
    return 0;
}

/* ==== 2.8 assistant tool calls -> DSML ==================================================== */

static int render_arguments(dsf_buf *b, const json_t *args, char *err) {
    json_t *obj = NULL;
    if (json_is_object(args)) obj = json_incref((json_t *)args);
    else {
        json_t *cur = json_incref((json_t *)args);
        for (int k = 0; k < 2 && pyjson_is_str(cur); k++) { /* double-encoded strings tolerated */
            json_t *d = pyjson_loads(json_string_value(cur), json_string_length(cur), NULL);
            if (!d) break;
            json_decref(cur);
            cur = d;
        }
        if (json_is_object(cur)) obj = cur;
        else {
            json_decref(cur);
            obj = json_object();
            json_object_set(obj, "arguments", args ? (json_t *)args : json_null());
        }
    }
    const char *k;
    size_t kl;
    json_t *v;
    int first = 1;
    json_object_keylen_foreach(obj, k, kl, v) {
        if (!first) put(b, "\n");
        first = 0;
        put(b, "<｜DSML｜ parameter name=\"");
        dsf_buf_append(b, k, kl);
        if (pyjson_is_str(v)) { /* raw, no escaping of anything */
            put(b, "\" string=\"true\">");
            dsf_buf_append(b, json_string_value(v), json_string_length(v));
        } else {
            put(b, "\" string=\"false\">");
            if (pyjson_dumps(b, v, err)) {
                json_decref(obj);
                return -1;
            }
        }
        put(b, "</｜DSML｜ parameter>");
    }
    json_decref(obj);
    return 0;
}

int chat_render_tool_calls(dsf_buf *b, const json_t *calls, char *err) {
    if (!json_is_array(calls)) return dsf_seterr(err, "tool_calls must be a list");
    put(b, "\n\n<｜DSML｜ calls>\n");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *tc = json_array_get(calls, i);
        const json_t *fn = json_is_object(tc) ? json_object_get(tc, "function") : NULL;
        if (!json_is_object(fn)) return dsf_seterr(err, "tool call %zu has no 'function' object", i);
        const json_t *name = json_object_get(fn, "name");
        if (!name) return dsf_seterr(err, "tool call %zu has no function name", i);
        if (!json_object_get(fn, "arguments")) return dsf_seterr(err, "tool call %zu has no function arguments", i);
        const json_t *ns = pyjson_get(tc, "namespace");
        if (!pyjson_truthy(ns)) ns = pyjson_get(fn, "namespace");
        const json_t *ns_name, *ns_desc;
        ns_parts(ns, &ns_name, &ns_desc);
        if (i) put(b, "\n");
        put(b, "<｜DSML｜ invoke name=\"");
        if (ns_name || pyjson_is_str(name)) {
            if (qualify_name(ns_name, name, b, err)) return -1;
        } else {
            put_pystr(b, name);
        }
        put(b, "\">\n");
        if (render_arguments(b, json_object_get(fn, "arguments"), err)) return -1;
        put(b, "\n</｜DSML｜ invoke>");
    }
    put(b, "\n</｜DSML｜ calls>");
    return 0;
}
