/* chat.c: the DeepSeek-V4.1 prompt encoder, byte-exact with the checkpoint's own
 * encoding/encoding.py (spec chat-format.md §2), and the OpenAI-request mapping (§5).
 *
 * Owns: image-block preprocessing, merging tool messages into user turns, sorting tool
 * results by call order, thinking retention, per-message rendering, the public dsf_chat_*
 * entry points. Tool schemas and DSML tool calls are rendered by chat_tools.c.
 * Must not: interpret model output (dsml.c does), tokenize, or touch the network.
 * Invariants: the caller's JSON is never modified (every step works on copies); errors
 * carry the official exception text so that servers and tests can compare them. */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsflash.h"
#include "text/chat_impl.h"
#include "text/pyjson.h"

/* ==== constants (spec §1, v41_constants.json) ======================================== */

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define SYSTEM_SP "<｜System｜>"
#define USER_SP "<｜User｜>"
#define ASSISTANT_SP "<｜Assistant｜>"
#define REMINDER_SP "<｜latest_reminder｜>"
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define IMAGE_SP "<｜deepseek_image｜>"

static const char RESPONSE_FORMAT_HEAD[] =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
static const char EFFORT_FMT[] =
    "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

/* Task tokens; the error lists them in the order the official message shows (a Python set). */
static const char *const TASK_NAMES[] = {"read_url", "authority", "action", "title", "query", "domain"};
static const char *const TASK_TOKENS[] = {"<｜read_url｜>", "<｜authority｜>", "<｜action｜>",
                                          "<｜title｜>", "<｜query｜>", "<｜domain｜>"};

/* ==== small helpers ===================================================================== */

static const char *role_of(const json_t *m) {
    const json_t *r = pyjson_get(m, "role");
    return pyjson_is_str(r) ? json_string_value(r) : NULL;
}
static bool role_is(const json_t *m, const char *role) {
    const char *r = role_of(m);
    return r && !strcmp(r, role);
}
static bool str_eq(const json_t *v, const char *s) {
    return pyjson_is_str(v) && json_string_length(v) == strlen(s) && !memcmp(json_string_value(v), s, strlen(s));
}
static bool contains(const json_t *v, const char *needle) {
    return pyjson_is_str(v) && memmem(json_string_value(v), json_string_length(v), needle, strlen(needle));
}
static int type_error_join(char *err, size_t item, const json_t *v) {
    return dsf_seterr(err, "sequence item %zu: expected str instance, %s found", item, pyjson_type_name(v));
}
/* "\n\n".join(parts): every part must be a str (Python raises TypeError otherwise). */
static int join_parts(dsf_buf *b, json_t *parts, char *err) {
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *p = json_array_get(parts, i);
        if (!pyjson_is_str(p)) return type_error_join(err, i, p);
    }
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *p = json_array_get(parts, i);
        if (i) put(b, "\n\n");
        dsf_buf_append(b, json_string_value(p), json_string_length(p));
    }
    return 0;
}
/* block.get(key, "") where a missing key gives "" and a present value stays as is. */
static json_t *get_default_empty(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v ? json_incref(v) : json_string("");
}

/* ==== 2.1 image preprocessing ============================================================ */

static int extract_image(json_t *block, json_t *images, char *err) {
    json_t *rec = json_object();
    json_object_set_new(rec, "type", json_string("image"));
    if (str_eq(json_object_get(block, "type"), "image_url")) {
        json_t *iu = json_object_get(block, "image_url");
        if (pyjson_is_str(iu)) json_object_set(rec, "url", iu);
        else {
            json_t *u = json_is_object(iu) ? json_object_get(iu, "url") : NULL;
            json_object_set_new(rec, "url", u ? json_incref(u) : json_string(""));
        }
    } else {
        static const char *const keys[] = {"source", "url", "data"};
        for (int k = 0; k < 3; k++) {
            json_t *v = json_object_get(block, keys[k]);
            if (v) json_object_set(rec, keys[k], v);
        }
    }
    if (!pyjson_truthy(json_object_get(rec, "source")) && !pyjson_truthy(json_object_get(rec, "url")) &&
        !pyjson_truthy(json_object_get(rec, "data"))) {
        json_decref(rec);
        return dsf_seterr(err, "Image block does not contain a valid source");
    }
    json_array_append_new(images, rec);
    return 0;
}

/* Replaces image blocks by placeholder text blocks (recursing into tool_result lists). */
static int process_image_blocks(json_t *blocks, json_t *images, int depth, char *err) {
    if (depth > 64) return dsf_seterr(err, "content blocks nested too deeply");
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        json_t *b = json_array_get(blocks, i);
        if (!json_is_object(b)) continue;
        json_t *type = json_object_get(b, "type");
        if (str_eq(type, "image") || str_eq(type, "image_url")) {
            if (extract_image(b, images, err)) return -1;
            json_t *t = json_pack("{s:s,s:s}", "type", "text", "text", IMAGE_SP);
            json_array_set_new(blocks, i, t);
        } else if (str_eq(type, "tool_result") && json_is_array(json_object_get(b, "content"))) {
            json_t *copy = json_copy(b);
            json_t *inner = json_deep_copy(json_object_get(b, "content"));
            json_object_set_new(copy, "content", inner);
            json_array_set_new(blocks, i, copy);
            if (process_image_blocks(inner, images, depth + 1, err)) return -1;
        } else if (str_eq(type, "text")) {
            json_t *text = json_object_get(b, "text");
            if (contains(text, IMAGE_SP)) {
                /* f"'{text[:100]}'" cuts at 100 code points */
                const char *s = json_string_value(text);
                size_t n = json_string_length(text), cut = 0;
                for (int cps = 0; cut < n && cps < 100; cps++) {
                    cut++;
                    while (cut < n && ((unsigned char)s[cut] & 0xC0) == 0x80) cut++;
                }
                return dsf_seterr(err, "Text block contains image placeholder '" IMAGE_SP "': '%.*s'. Images "
                                       "should be separate content blocks.", (int)cut, s);
            }
        }
    }
    return 0;
}

/* process_image_messages: returns a new array of new message objects. */
static json_t *process_image_messages(const json_t *msgs, json_t *images, char *err) {
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_deep_copy(json_array_get(msgs, i));
        json_array_append_new(out, m);
        if (!json_is_object(m)) {
            dsf_seterr(err, "message %zu is not an object", i);
            goto bad;
        }
        if (contains(json_object_get(m, "content"), IMAGE_SP)) {
            dsf_seterr(err, "Message content contains image special token '" IMAGE_SP "'. Images should be "
                            "provided as image content blocks.");
            goto bad;
        }
        if (contains(json_object_get(m, "reasoning_content"), IMAGE_SP)) {
            dsf_seterr(err, "reasoning_content contains image special token '" IMAGE_SP "'");
            goto bad;
        }
        if (json_is_array(json_object_get(m, "content")) && !json_object_get(m, "content_blocks")) {
            json_object_set(m, "content_blocks", json_object_get(m, "content"));
            json_object_del(m, "content");
        }
        json_t *cb = json_object_get(m, "content_blocks");
        if (pyjson_truthy(cb)) {
            if (!json_is_array(cb)) {
                dsf_seterr(err, "content_blocks of message %zu is not a list", i);
                goto bad;
            }
            if (process_image_blocks(cb, images, 0, err)) goto bad;
            if (!pyjson_is_str(json_object_get(m, "content"))) {
                json_t *texts = json_array();
                for (size_t k = 0; k < json_array_size(cb); k++) {
                    json_t *b = json_array_get(cb, k);
                    if (json_is_object(b) && str_eq(json_object_get(b, "type"), "text"))
                        json_array_append_new(texts, get_default_empty(b, "text"));
                }
                dsf_buf j = {0};
                int rc = join_parts(&j, texts, err);
                json_decref(texts);
                if (rc) {
                    dsf_buf_free(&j);
                    goto bad;
                }
                json_object_set_new(m, "content", json_stringn_nocheck(j.data ? (const char *)j.data : "", j.len));
                dsf_buf_free(&j);
            }
        }
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}

/* ==== 2.2 merge tool messages, 2.3 sort tool results ===================================== */

static json_t *merge_tool_messages(const json_t *msgs) {
    json_t *merged = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        size_t nm = json_array_size(merged);
        json_t *prev = nm ? json_array_get(merged, nm - 1) : NULL;
        bool prev_user_blocks = prev && role_is(prev, "user") && json_object_get(prev, "content_blocks");
        if (role_is(m, "tool")) {
            json_t *block = json_object();
            json_object_set_new(block, "type", json_string("tool_result"));
            json_object_set_new(block, "tool_use_id", get_default_empty(m, "tool_call_id"));
            json_object_set_new(block, "content", get_default_empty(m, "content"));
            if (prev_user_blocks && json_is_array(json_object_get(prev, "content_blocks"))) {
                json_array_append_new(json_object_get(prev, "content_blocks"), block);
            } else {
                json_t *u = json_object();
                json_object_set_new(u, "role", json_string("user"));
                json_object_set_new(u, "content_blocks", json_pack("[o]", block));
                json_array_append_new(merged, u);
            }
        } else if (role_is(m, "user")) {
            json_t *blocks = pyjson_get(m, "content_blocks");
            json_t *own = blocks ? json_incref(blocks)
                                 : json_pack("[{s:s,s:o}]", "type", "text", "text", get_default_empty(m, "content"));
            if (prev_user_blocks && !pyjson_get(prev, "task") && json_is_array(json_object_get(prev, "content_blocks")) &&
                json_is_array(own)) {
                json_array_extend(json_object_get(prev, "content_blocks"), own);
                json_decref(own);
            } else {
                json_t *c = json_copy(m);
                json_object_set_new(c, "content_blocks", own);
                json_array_append_new(merged, c);
            }
        } else {
            json_array_append(merged, m);
        }
    }
    return merged;
}

static const char *call_id(const json_t *tc) {
    const json_t *id = pyjson_get(tc, "id");
    if (pyjson_truthy(id)) return pyjson_is_str(id) ? json_string_value(id) : NULL;
    const json_t *fid = pyjson_get(pyjson_get(tc, "function"), "id");
    return pyjson_is_str(fid) && json_string_length(fid) ? json_string_value(fid) : NULL;
}

/* Stable sort of the tool_result blocks of each user message by the position of their id in
 * the most recent assistant's tool_calls (unknown ids count as 0). Mutates the messages. */
static void sort_tool_results(json_t *msgs) {
    json_t *order = NULL; /* the last assistant's tool_calls array */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "assistant") && pyjson_truthy(json_object_get(m, "tool_calls")) &&
            json_is_array(json_object_get(m, "tool_calls"))) {
            order = json_object_get(m, "tool_calls");
            continue;
        }
        json_t *cb = json_object_get(m, "content_blocks");
        if (!role_is(m, "user") || !json_is_array(cb) || !order) continue;
        size_t nb = json_array_size(cb), nt = 0;
        bool any_id = false;
        for (size_t k = 0; k < json_array_size(order); k++) any_id |= call_id(json_array_get(order, k)) != NULL;
        if (!any_id) continue; /* Python: `and last_tool_call_order` (an empty dict) */
        json_t **tb = dsf_xcalloc(nb ? nb : 1, sizeof *tb);
        size_t *key = dsf_xcalloc(nb ? nb : 1, sizeof *key);
        for (size_t k = 0; k < nb; k++) {
            json_t *b = json_array_get(cb, k);
            if (!json_is_object(b) || !str_eq(json_object_get(b, "type"), "tool_result")) continue;
            json_t *uid = json_object_get(b, "tool_use_id");
            size_t pos = 0;
            for (size_t c = 0; pyjson_is_str(uid) && c < json_array_size(order); c++) {
                const char *id = call_id(json_array_get(order, c));
                if (id && !strcmp(id, json_string_value(uid)) && strlen(id) == json_string_length(uid))
                    pos = c; /* the dict keeps the last index of a repeated id */
            }
            tb[nt] = json_incref(b);
            key[nt++] = pos;
        }
        if (nt > 1) {
            for (size_t a = 1; a < nt; a++) { /* insertion sort: stable */
                json_t *vb = tb[a];
                size_t vk = key[a], z = a;
                while (z > 0 && key[z - 1] > vk) {
                    tb[z] = tb[z - 1];
                    key[z] = key[z - 1];
                    z--;
                }
                tb[z] = vb;
                key[z] = vk;
            }
            size_t s = 0;
            for (size_t k = 0; k < nb; k++) {
                json_t *b = json_array_get(cb, k);
                if (json_is_object(b) && str_eq(json_object_get(b, "type"), "tool_result"))
                    json_array_set(cb, k, tb[s++]);
            }
        }
        for (size_t k = 0; k < nt; k++) json_decref(tb[k]);
        free(tb);
        free(key);
    }
}

/* ==== 2.4 thinking retention ============================================================= */

static long last_user_index(const json_t *msgs) {
    for (size_t i = json_array_size(msgs); i-- > 0;) {
        const json_t *m = json_array_get(msgs, i);
        if (role_is(m, "user") || (role_is(m, "system") && i > 0)) return (long)i;
    }
    return -1;
}

static json_t *drop_thinking_messages(const json_t *msgs) {
    long lu = last_user_index(msgs);
    json_t *out = json_array();
    static const char *const keep[] = {"user", "system", "tool", "latest_reminder", "direct_search_results"};
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        bool kept = (long)i >= lu;
        for (int k = 0; k < 5 && !kept; k++) kept = role_is(m, keep[k]);
        if (kept) json_array_append(out, m);
        else if (role_is(m, "assistant")) {
            json_t *c = json_copy(m);
            json_object_del(c, "reasoning_content");
            json_array_append_new(out, c);
        }
    }
    return out;
}

/* ==== 2.9 effort (2.10 tools and 2.8 tool calls: chat_tools.c) ========================== */

static int effort_value(const json_t *effort, int *n, char *err) {
    if (!effort || json_is_null(effort)) { *n = 75; return 0; }
    if (json_is_integer(effort) && json_integer_value(effort) >= 1 && json_integer_value(effort) <= 100) {
        *n = (int)json_integer_value(effort);
        return 0;
    }
    if (str_eq(effort, "low")) { *n = 50; return 0; }
    if (str_eq(effort, "high")) { *n = 75; return 0; }
    if (str_eq(effort, "max")) { *n = 100; return 0; }
    dsf_buf b = {0};
    pyjson_str(&b, effort);
    dsf_seterr(err, "Invalid reasoning effort for deepseek_v41: %.*s, should be int within [1,100] or ['low', "
                    "'high', 'max']", cut(b.data ? (const char *)b.data : "", 300), b.data ? (const char *)b.data : "");
    dsf_buf_free(&b);
    return -1;
}

/* ==== 2.5 / 2.6 one message ================================================================ */

typedef struct {
    bool thinking;          /* thinking_mode == "thinking" */
    const json_t *mode;     /* thinking_mode as given */
    bool drop;              /* effective drop_thinking */
    const json_t *effort;   /* reasoning_effort (NULL = None) */
} render_opts;

static int render_user_blocks(dsf_buf *b, const json_t *blocks, char *err) {
    json_t *parts = json_array();
    int rc = 0;
    for (size_t i = 0; i < json_array_size(blocks) && !rc; i++) {
        json_t *blk = json_array_get(blocks, i);
        if (!json_is_object(blk)) {
            rc = dsf_seterr(err, "content block %zu is not an object", i);
            break;
        }
        json_t *type = json_object_get(blk, "type");
        if (str_eq(type, "text")) {
            json_array_append_new(parts, get_default_empty(blk, "text"));
        } else if (str_eq(type, "tool_result")) {
            json_t *tc = get_default_empty(blk, "content");
            dsf_buf t = {0};
            put(&t, "<tool_result>");
            if (json_is_array(tc)) {
                json_t *tp = json_array();
                for (size_t k = 0; k < json_array_size(tc); k++) {
                    json_t *x = json_array_get(tc, k);
                    if (!json_is_object(x)) {
                        rc = dsf_seterr(err, "tool result part %zu is not an object", k);
                        break;
                    }
                    if (str_eq(json_object_get(x, "type"), "text")) json_array_append_new(tp, get_default_empty(x, "text"));
                    else {
                        dsf_buf u = {0};
                        put(&u, "[Unsupported ");
                        put_pystr(&u, json_object_get(x, "type"));
                        put(&u, "]");
                        json_array_append_new(tp, json_stringn_nocheck((const char *)u.data, u.len));
                        dsf_buf_free(&u);
                    }
                }
                if (!rc) rc = join_parts(&t, tp, err);
                json_decref(tp);
            } else {
                put_pystr(&t, tc);
            }
            put(&t, "</tool_result>");
            json_array_append_new(parts, json_stringn_nocheck((const char *)t.data, t.len));
            dsf_buf_free(&t);
            json_decref(tc);
        } else {
            dsf_buf u = {0};
            put(&u, "[Unsupported ");
            put_pystr(&u, type);
            put(&u, "]");
            json_array_append_new(parts, json_stringn_nocheck((const char *)u.data, u.len));
            dsf_buf_free(&u);
        }
    }
    if (!rc) rc = join_parts(b, parts, err);
    json_decref(parts);
    return rc;
}

static int render_message(size_t index, const json_t *msgs, const render_opts *o, dsf_buf *b, char *err) {
    if (!o->mode || !(str_eq(o->mode, "chat") || str_eq(o->mode, "thinking"))) {
        dsf_buf s = {0};
        pyjson_str(&s, o->mode);
        dsf_seterr(err, "Invalid thinking_mode `%.*s`", cut(s.data ? (const char *)s.data : "", 200),
                   s.data ? (const char *)s.data : "");
        dsf_buf_free(&s);
        return -1;
    }
    const json_t *m = json_array_get(msgs, index);
    size_t n = json_array_size(msgs);
    long lu = last_user_index(msgs);
    const char *role = role_of(m);
    const json_t *content = pyjson_get(m, "content");

    int effort;
    if (effort_value(o->effort, &effort, err)) return -1;
    bool effort_line = index == 0 && o->thinking;
    if (index == 0 && (effort_line || (role && !strcmp(role, "system")))) put(b, SYSTEM_SP);
    if (effort_line) dsf_buf_appendf(b, EFFORT_FMT, effort);

    if (role && !strcmp(role, "system")) {
        if (index > 0) put(b, SYSTEM_SP);
        put_or_empty(b, content);
        const json_t *tools = json_object_get(m, "tools");
        if (pyjson_truthy(tools)) {
            put(b, "\n\n");
            if (chat_render_tools(b, tools, err)) return -1;
        }
        const json_t *rf = json_object_get(m, "response_format");
        if (pyjson_truthy(rf)) {
            put(b, RESPONSE_FORMAT_HEAD);
            if (pyjson_dumps(b, rf, err)) return -1;
        }
    } else if (role && !strcmp(role, "user")) {
        put(b, USER_SP);
        const json_t *cb = json_object_get(m, "content_blocks");
        if (pyjson_truthy(cb)) {
            if (!json_is_array(cb)) return dsf_seterr(err, "content_blocks must be a list");
            if (render_user_blocks(b, cb, err)) return -1;
        } else if (pyjson_truthy(content)) {
            if (!pyjson_is_str(content))
                return dsf_seterr(err, "can only concatenate str (not \"%s\") to str", pyjson_type_name(content));
            put_pystr(b, content);
        }
    } else if (role && !strcmp(role, "latest_reminder")) {
        put(b, REMINDER_SP);
        put_pystr(b, content);
    } else if (role && !strcmp(role, "tool")) {
        return dsf_seterr(err, "deepseek_v41 merges tool messages into user; please preprocess with "
                               "merge_tool_messages()");
    } else if (role && !strcmp(role, "assistant")) {
        const json_t *prev = index > 0 ? json_array_get(msgs, index - 1) : NULL;
        bool prev_task = prev && pyjson_get(prev, "task");
        if (o->thinking && !prev_task && (!o->drop || (long)index > lu)) {
            put_or_empty(b, pyjson_get(m, "reasoning_content"));
            put(b, THINK_CLOSE);
        }
        put_or_empty(b, content);
        const json_t *calls = json_object_get(m, "tool_calls");
        if (pyjson_truthy(calls) && chat_render_tool_calls(b, calls, err)) return -1;
        if (!pyjson_truthy(json_object_get(m, "wo_eos"))) put(b, EOS);
    } else {
        dsf_buf s = {0};
        pyjson_str(&s, pyjson_get(m, "role"));
        dsf_seterr(err, "Unknown role: %.*s", cut(s.data ? (const char *)s.data : "", 200), s.data ? (const char *)s.data : "");
        dsf_buf_free(&s);
        return -1;
    }

    /* transition: the generation header appears only before an assistant/reminder or at the end */
    if (index + 1 < n) {
        const json_t *next = json_array_get(msgs, index + 1);
        if (!role_is(next, "assistant") && !role_is(next, "latest_reminder")) return 0;
    }
    const json_t *task = pyjson_get(m, "task");
    if (task) {
        int t = -1;
        for (int k = 0; k < 6; k++)
            if (str_eq(task, TASK_NAMES[k])) t = k;
        if (t < 0) {
            dsf_buf s = {0};
            pyjson_str(&s, task);
            dsf_seterr(err, "Invalid task: '%.*s'. Valid tasks are: ['read_url', 'authority', 'action', 'title', "
                            "'query', 'domain']", cut(s.data ? (const char *)s.data : "", 200), s.data ? (const char *)s.data : "");
            dsf_buf_free(&s);
            return -1;
        }
        if (strcmp(TASK_NAMES[t], "action")) put(b, TASK_TOKENS[t]);
        else {
            put(b, ASSISTANT_SP);
            put(b, o->thinking ? THINK_OPEN : THINK_CLOSE);
            put(b, TASK_TOKENS[t]);
        }
    } else if ((role && !strcmp(role, "user")) || (role && !strcmp(role, "system") && index > 0)) {
        put(b, ASSISTANT_SP);
        put(b, o->thinking && (!o->drop || (long)index >= lu) ? THINK_OPEN : THINK_CLOSE);
    }
    return 0;
}

/* ==== encode_messages ====================================================================== */

static const char *const ARG_NAMES[] = {"thinking_mode", "context", "drop_thinking", "add_default_bos_token",
                                        "reasoning_effort", "return_multi_modal_data", "tool_history"};

int chat_encode(const json_t *messages, const json_t *args, dsf_buf *out, json_t **images, char *err) {
    if (args && !json_is_object(args)) return dsf_seterr(err, "args must be an object");
    if (!json_is_array(messages)) return dsf_seterr(err, "messages must be a list");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)args, k, v) {
        bool known = false;
        for (int i = 0; i < 7; i++) known |= !strcmp(k, ARG_NAMES[i]);
        if (!known) return dsf_seterr(err, "encode_messages() got an unexpected keyword argument '%.*s'", cut(k, 100), k);
    }
    json_t *mode = args ? json_object_get(args, "thinking_mode") : NULL;
    if (!mode) return dsf_seterr(err, "encode_messages() missing 1 required positional argument: 'thinking_mode'");
    json_t *ctx_in = args ? json_object_get(args, "context") : NULL;
    if (pyjson_truthy(ctx_in) && !json_is_array(ctx_in)) return dsf_seterr(err, "context must be a list");
    json_t *dt = args ? json_object_get(args, "drop_thinking") : NULL;
    json_t *bos = args ? json_object_get(args, "add_default_bos_token") : NULL;
    render_opts o = {
        .thinking = str_eq(mode, "thinking"),
        .mode = mode,
        .drop = dt ? pyjson_truthy(dt) : true,
        .effort = args ? pyjson_get(args, "reasoning_effort") : NULL,
    };

    int rc = -1;
    json_t *imgs = json_array(), *ctx_imgs = json_array();
    json_t *ctx = NULL, *msgs = NULL, *mctx = NULL, *mmsgs = NULL, *full = NULL, *dropped = NULL;
    ctx = process_image_messages(pyjson_truthy(ctx_in) ? ctx_in : NULL, ctx_imgs, err);
    if (!ctx) goto done;
    msgs = process_image_messages(messages, imgs, err);
    if (!msgs) goto done;
    mctx = merge_tool_messages(ctx);
    mmsgs = merge_tool_messages(msgs);
    full = json_array();
    json_array_extend(full, mctx);
    json_array_extend(full, mmsgs);
    sort_tool_results(full);

    if ((bos ? pyjson_truthy(bos) : true) && json_array_size(ctx) == 0) put(out, BOS);

    for (size_t i = 0; i < json_array_size(full); i++)
        if (pyjson_truthy(pyjson_get(json_array_get(full, i), "tools"))) o.drop = false;

    long n_render, ctx_len;
    const json_t *render_list = full;
    if (o.thinking && o.drop) {
        dropped = drop_thinking_messages(full);
        json_t *dctx = drop_thinking_messages(mctx);
        n_render = (long)json_array_size(dropped) - (long)json_array_size(dctx);
        ctx_len = (long)json_array_size(dropped) - n_render;
        json_decref(dctx);
        render_list = dropped;
    } else {
        n_render = (long)json_array_size(mmsgs);
        ctx_len = (long)json_array_size(mctx);
    }
    for (long i = 0; i < n_render; i++)
        if (render_message((size_t)(i + ctx_len), render_list, &o, out, err)) goto done;
    rc = 0;
    if (images) {
        *images = imgs;
        imgs = NULL;
    }
done:
    json_decref(imgs);
    json_decref(ctx_imgs);
    json_decref(ctx);
    json_decref(msgs);
    json_decref(mctx);
    json_decref(mmsgs);
    json_decref(full);
    json_decref(dropped);
    return rc;
}

/* ==== OpenAI request mapping (spec §5) ======================================================= */

static json_t *map_message(const json_t *m) {
    json_t *c = json_deep_copy(m);
    if (!json_is_object(c)) return c;
    if (!json_object_get(c, "reasoning_content") && json_object_get(c, "reasoning"))
        json_object_set(c, "reasoning_content", json_object_get(c, "reasoning"));
    json_object_del(c, "reasoning");
    /* a user turn with content null is a TypeError in the official encoder (spec §2.14) */
    if (role_is(c, "user") && json_is_null(json_object_get(c, "content")) && !json_object_get(c, "content_blocks"))
        json_object_set_new(c, "content", json_string(""));
    json_t *parts = json_object_get(c, "content");
    for (size_t i = 0; json_is_array(parts) && i < json_array_size(parts); i++) {
        json_t *p = json_array_get(parts, i);
        json_t *type = json_object_get(p, "type");
        /* media markers and other text-carrying parts stay separate text parts ("\n\n"-joined) */
        if (json_is_object(p) && pyjson_is_str(json_object_get(p, "text")) && !str_eq(type, "text") &&
            !str_eq(type, "tool_result"))
            json_object_set_new(p, "type", json_string("text"));
    }
    return c;
}

static bool truthy_flag(const json_t *v, bool *out) {
    if (json_is_boolean(v)) { *out = json_is_true(v); return true; }
    if (json_is_object(v)) { /* DeepSeek API style {"type": "enabled"|"disabled"} */
        const json_t *t = json_object_get(v, "type");
        if (str_eq(t, "enabled")) { *out = true; return true; }
        if (str_eq(t, "disabled")) { *out = false; return true; }
    }
    return false;
}

int chat_map_openai(const json_t *req, json_t **messages_out, json_t **args_out, int *continue_reasoning,
                    char *err) {
    if (!json_is_object(req)) return dsf_seterr(err, "request must be a JSON object");
    const json_t *in = json_object_get(req, "messages");
    if (!json_is_array(in)) return dsf_seterr(err, "request has no 'messages' list");
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    json_t *msgs = json_array();
    for (size_t i = 0; i < json_array_size(in); i++) json_array_append_new(msgs, map_message(json_array_get(in, i)));

    /* thinking switch and effort */
    bool thinking = true;
    const json_t *mode = json_object_get(req, "thinking_mode");
    bool f;
    if (truthy_flag(json_object_get(req, "thinking"), &f)) thinking = f;
    if (truthy_flag(json_object_get(req, "enable_thinking"), &f)) thinking = f;
    if (json_is_object(kw) && truthy_flag(json_object_get(kw, "thinking"), &f)) thinking = f;
    if (json_is_object(kw) && truthy_flag(json_object_get(kw, "enable_thinking"), &f)) thinking = f;
    if (str_eq(mode, "chat")) thinking = false;
    if (str_eq(mode, "thinking")) thinking = true;
    const json_t *effort = pyjson_get(req, "reasoning_effort");
    if (json_is_object(kw) && pyjson_get(kw, "reasoning_effort")) effort = pyjson_get(kw, "reasoning_effort");
    json_t *eff = effort ? json_incref((json_t *)effort) : json_null();
    if (str_eq(effort, "minimal")) { json_decref(eff); eff = json_string("low"); }
    else if (str_eq(effort, "xhigh")) { json_decref(eff); eff = json_string("max"); }
    else if (str_eq(effort, "medium")) { json_decref(eff); eff = json_null(); }
    else if (str_eq(effort, "none")) { json_decref(eff); eff = json_null(); thinking = false; }

    /* request tools and response_format go on a system message at index 0 */
    const json_t *tools = json_object_get(req, "tools");
    bool use_tools = json_is_array(tools) && json_array_size(tools) > 0 &&
                     !str_eq(json_object_get(req, "tool_choice"), "none");
    const json_t *rf = json_object_get(req, "response_format"), *schema = NULL;
    if (json_is_object(rf) && str_eq(json_object_get(rf, "type"), "json_schema")) {
        const json_t *js = json_object_get(rf, "json_schema");
        schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
    }
    if (use_tools || schema) {
        json_t *sys = json_array_size(msgs) ? json_array_get(msgs, 0) : NULL;
        if (!sys || !role_is(sys, "system")) {
            sys = json_pack("{s:s,s:s}", "role", "system", "content", "");
            json_array_insert_new(msgs, 0, sys);
        }
        if (use_tools) {
            json_t *have = json_object_get(sys, "tools");
            if (json_is_array(have)) json_array_extend(have, (json_t *)tools);
            else json_object_set(sys, "tools", (json_t *)tools);
        }
        if (schema && !json_object_get(sys, "response_format")) json_object_set(sys, "response_format", (json_t *)schema);
    }

    /* continuation of the final assistant message */
    *continue_reasoning = 0;
    bool cont = json_is_true(json_object_get(req, "continue_final_message"));
    size_t n = json_array_size(msgs);
    if (cont) {
        json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
        if (!last || !role_is(last, "assistant")) {
            json_decref(msgs);
            json_decref(eff);
            return dsf_seterr(err, "continue_final_message needs a final assistant message");
        }
        json_object_set_new(last, "wo_eos", json_true());
        if (thinking && pyjson_truthy(pyjson_get(last, "reasoning_content")) &&
            !pyjson_truthy(pyjson_get(last, "content")) && !pyjson_truthy(pyjson_get(last, "tool_calls")))
            *continue_reasoning = 1;
    }
    *messages_out = msgs;
    *args_out = json_pack("{s:s,s:o}", "thinking_mode", thinking ? "thinking" : "chat", "reasoning_effort", eff);
    return 0;
}

/* ==== public API (include/dsflash.h @chat) =================================================== */

static void set_prompt(dsf_chat_prompt *p, dsf_buf *b) {
    if (!b->data) dsf_buf_append(b, "", 0);
    p->prompt = (char *)b->data;
    p->prompt_len = b->len;
    b->data = NULL;
}

int dsf_chat_render_json(const char *request_json, size_t len, dsf_chat_prompt *out, char *err) {
    memset(out, 0, sizeof *out);
    json_t *req = pyjson_loads(request_json, len, err);
    if (!req) return -1;
    int rc = -1;
    if (!json_is_object(req) || !json_is_array(json_object_get(req, "messages"))) {
        dsf_seterr(err, "expected {\"messages\": [...], \"args\": {...}}");
        goto done;
    }
    dsf_buf b = {0};
    json_t *images = NULL;
    if (chat_encode(json_object_get(req, "messages"), json_object_get(req, "args"), &b, &images, err)) {
        dsf_buf_free(&b);
        goto done;
    }
    set_prompt(out, &b);
    dsf_buf ib = {0};
    pyjson_dumps(&ib, images, NULL);
    out->images_json = (char *)ib.data;
    json_decref(images);
    size_t pl = out->prompt_len, tl = strlen(THINK_OPEN);
    out->gen_reasoning = pl >= tl && !memcmp(out->prompt + pl - tl, THINK_OPEN, tl);
    rc = 0;
done:
    json_decref(req);
    return rc;
}

int dsf_chat_render_openai(const char *request_json, size_t len, dsf_chat_prompt *out, char *err) {
    memset(out, 0, sizeof *out);
    json_t *req = pyjson_loads(request_json, len, err);
    if (!req) return -1;
    json_t *msgs = NULL, *args = NULL, *images = NULL;
    int cont_reasoning = 0, rc = -1;
    dsf_buf b = {0};
    if (chat_map_openai(req, &msgs, &args, &cont_reasoning, err)) goto done;
    if (chat_encode(msgs, args, &b, &images, err)) goto done;
    size_t tc = strlen(THINK_CLOSE), to = strlen(THINK_OPEN);
    if (cont_reasoning && b.len >= tc && !memcmp(b.data + b.len - tc, THINK_CLOSE, tc)) b.len -= tc;
    set_prompt(out, &b);
    out->prompt[out->prompt_len] = 0;
    dsf_buf ib = {0};
    pyjson_dumps(&ib, images, NULL);
    out->images_json = (char *)ib.data;
    out->gen_reasoning = cont_reasoning ||
                         (out->prompt_len >= to && !memcmp(out->prompt + out->prompt_len - to, THINK_OPEN, to));
    rc = 0;
done:
    dsf_buf_free(&b);
    json_decref(images);
    json_decref(msgs);
    json_decref(args);
    json_decref(req);
    return rc;
}

void dsf_chat_prompt_free(dsf_chat_prompt *p) {
    if (!p) return;
    free(p->prompt);
    free(p->images_json);
    memset(p, 0, sizeof *p);
}
