/* dsml.c: splitting DeepSeek-V4.1 output into reasoning, content and DSML tool calls
 * (spec chat-format.md §3).
 *
 * Two parsers over the same text:
 *   - the official one (dsml_parse_official): a faithful port of the behaviour of
 *     parse_message_from_completion_text, errors included (§3.2). Strict mode's result.
 *   - the streaming router: routes text as it arrives (§3.3), never emits a suffix that may
 *     still become a marker, understands malformed output seen in the wild (§3.4). Its
 *     events are the same in both modes; its accumulation is tolerant mode's result.
 * Must not: fail in tolerant mode, emit invalid UTF-8 (input is sanitized: invalid bytes
 * become U+FFFD), split a character across events, or rescan the whole text per byte. */
#include "text/dsml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"

#define S_BOS "<｜begin▁of▁sentence｜>"
#define S_EOS "<｜end▁of▁sentence｜>"
#define S_THINK_OPEN "<think>"
#define S_THINK_CLOSE "</think>"
#define S_DSML "｜DSML｜"
#define S_CALLS_START "\n\n<｜DSML｜ calls"
#define S_CALLS_END "</｜DSML｜ calls>"
#define S_INVOKE_START "<｜DSML｜ invoke"
#define S_INVOKE_END "</｜DSML｜ invoke"
#define S_PARAM_START "<｜DSML｜ parameter"
#define S_PARAM_END "/｜DSML｜ parameter"

#define MAX_TAG 4096 /* an unfinished tag longer than this is not a tag */

/* ==== shared helpers ===================================================================== */

static size_t slen(const char *s) { return strlen(s); }

static const char *find(const char *t, size_t n, size_t from, const char *needle) {
    if (from > n) return NULL;
    return memmem(t + from, n - from, needle, slen(needle));
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = dsf_xmalloc(n + 1);
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Length of at most max bytes of s[0,n) that does not end inside a UTF-8 character (for
 * quoting input in error messages). */
static int cut(const char *s, size_t n, size_t max) {
    if (n <= max) return (int)n;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    return (int)max;
}

/* Python str.isspace() for the \s of the official regexes. */
static bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Decodes one UTF-8 character of valid text; returns its length. */
static size_t utf8_next(const char *s, size_t n, uint32_t *cp) {
    unsigned char c = (unsigned char)s[0];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (k > n) k = n;
    uint32_t v = k == 1 ? c : k == 2 ? (c & 0x1Fu) : k == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t i = 1; i < k; i++) v = (v << 6) | ((unsigned char)s[i] & 0x3Fu);
    *cp = v;
    return k;
}

/* "ns::name" -> ns, name (split at the first "::"). */
static void split_ns(const char *q, size_t n, char **ns, char **name) {
    const char *sep = memmem(q, n, "::", 2);
    if (sep) {
        *ns = dup_bytes(q, (size_t)(sep - q));
        *name = dup_bytes(sep + 2, n - (size_t)(sep - q) - 2);
    } else {
        *ns = NULL;
        *name = dup_bytes(q, n);
    }
}

static void add_call(dsf_dsml_result *r, const char *qname, size_t qlen, const char *args, size_t alen) {
    r->calls = dsf_xrealloc(r->calls, (size_t)(r->n_calls + 1) * sizeof *r->calls);
    dsf_tool_call *c = &r->calls[r->n_calls++];
    split_ns(qname, qlen, &c->ns, &c->name);
    c->arguments = dup_bytes(args, alen);
}

void dsf_dsml_result_free(dsf_dsml_result *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].ns);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

char *dsf_dsml_result_json(const dsf_dsml_result *r) {
    dsf_buf b = {0};
    dsf_buf_append(&b, "{\"reasoning_content\": ", 22);
    pyjson_dump_string(&b, r->reasoning ? r->reasoning : "", r->reasoning_len);
    dsf_buf_append(&b, ", \"content\": ", 13);
    pyjson_dump_string(&b, r->content ? r->content : "", r->content_len);
    dsf_buf_append(&b, ", \"tool_calls\": [", 17);
    for (int i = 0; i < r->n_calls; i++) {
        const dsf_tool_call *c = &r->calls[i];
        if (i) dsf_buf_append(&b, ", ", 2);
        dsf_buf_append(&b, "{\"name\": ", 9);
        pyjson_dump_string(&b, c->name, slen(c->name));
        if (c->ns) {
            dsf_buf_append(&b, ", \"namespace\": ", 15);
            pyjson_dump_string(&b, c->ns, slen(c->ns));
        }
        dsf_buf_append(&b, ", \"arguments\": ", 15);
        pyjson_dump_string(&b, c->arguments, slen(c->arguments));
        dsf_buf_append(&b, "}", 1);
    }
    dsf_buf_append(&b, "]}", 2);
    return (char *)b.data;
}

/* ==== the official parser (spec §3.2) ===================================================== */

/* _read_until_stop: content [*idx, pos) before the earliest stop (earlier list entry wins a
 * tie); *idx moves past the stop, or to the end. Returns the stop's index or -1. */
static int read_until(const char *t, size_t n, size_t *idx, const char *const *stops, int ns, size_t *c0,
                      size_t *c1) {
    size_t best = n;
    int which = -1;
    for (int i = 0; i < ns; i++) {
        const char *p = find(t, n, *idx, stops[i]);
        if (p && (size_t)(p - t) < best) {
            best = (size_t)(p - t);
            which = i;
        }
    }
    *c0 = *idx;
    *c1 = best;
    *idx = which >= 0 ? best + slen(stops[which]) : n;
    return which;
}

static bool span_eq(const char *t, size_t a, size_t b, const char *s) {
    return b - a == slen(s) && !memcmp(t + a, s, b - a);
}
static bool ends_with(const char *t, size_t a, size_t b, const char *s) {
    size_t l = slen(s);
    return b - a >= l && !memcmp(t + b - l, s, l);
}

/* Arguments JSON of decode_dsml_to_arguments for one invoke. */
typedef struct {
    char **keys, **vals;
    size_t *klen, *vlen;
    bool *is_str;
    int n;
} param_list;

static void params_free(param_list *pl) {
    for (int i = 0; i < pl->n; i++) {
        free(pl->keys[i]);
        free(pl->vals[i]);
    }
    free(pl->keys);
    free(pl->vals);
    free(pl->klen);
    free(pl->vlen);
    free(pl->is_str);
    memset(pl, 0, sizeof *pl);
}

static int params_find(const param_list *pl, const char *k, size_t kl) {
    for (int i = 0; i < pl->n; i++)
        if (pl->klen[i] == kl && !memcmp(pl->keys[i], k, kl)) return i;
    return -1;
}

/* Adds or (tolerant, Python dict semantics) replaces a parameter. */
static void params_set(param_list *pl, const char *k, size_t kl, const char *v, size_t vl, bool is_str) {
    int i = params_find(pl, k, kl);
    if (i < 0) {
        int n = pl->n + 1;
        pl->keys = dsf_xrealloc(pl->keys, (size_t)n * sizeof *pl->keys);
        pl->vals = dsf_xrealloc(pl->vals, (size_t)n * sizeof *pl->vals);
        pl->klen = dsf_xrealloc(pl->klen, (size_t)n * sizeof *pl->klen);
        pl->vlen = dsf_xrealloc(pl->vlen, (size_t)n * sizeof *pl->vlen);
        pl->is_str = dsf_xrealloc(pl->is_str, (size_t)n * sizeof *pl->is_str);
        i = pl->n++;
        pl->keys[i] = dup_bytes(k, kl);
        pl->klen[i] = kl;
    } else {
        free(pl->vals[i]);
    }
    pl->vals[i] = dup_bytes(v, vl);
    pl->vlen[i] = vl;
    pl->is_str[i] = is_str;
}

/* tolerant: a string="false" value that is not JSON degrades to a JSON string */
static void params_json(const param_list *pl, dsf_buf *b, bool tolerant) {
    dsf_buf_append(b, "{", 1);
    for (int i = 0; i < pl->n; i++) {
        if (i) dsf_buf_append(b, ", ", 2);
        pyjson_dump_string(b, pl->keys[i], pl->klen[i]);
        dsf_buf_append(b, ": ", 2);
        bool as_str = pl->is_str[i];
        if (!as_str && tolerant) {
            json_t *v = pyjson_loads(pl->vals[i], pl->vlen[i], NULL);
            as_str = v == NULL;
            json_decref(v);
        }
        if (as_str) pyjson_dump_string(b, pl->vals[i], pl->vlen[i]);
        else dsf_buf_append(b, pl->vals[i], pl->vlen[i]);
    }
    dsf_buf_append(b, "}", 1);
}

static int official_calls(const char *t, size_t n, size_t *idx, int *stop_out, dsf_dsml_result *r, char *err) {
    static const char *const s_call[] = {S_INVOKE_START, S_CALLS_END};
    static const char *const s_name[] = {S_PARAM_START, S_INVOKE_END};
    static const char *const s_pend[] = {S_PARAM_END};
    size_t a, b;
    int stop = -1; /* -1 None; otherwise an identifier below */
    enum { ST_NONE = -1, ST_INVOKE_START, ST_CALLS_END, ST_PARAM_START, ST_INVOKE_END, ST_PARAM_END };
    while (*idx < n) {
        int w = read_until(t, n, idx, s_call, 2, &a, &b);
        if (!span_eq(t, a, b, ">\n"))
            return dsf_seterr(err, "Tool call format error: expected '>\\n' but got '%.*s'", cut(t + a, b - a, 200), t + a);
        stop = w < 0 ? ST_NONE : w == 0 ? ST_INVOKE_START : ST_CALLS_END;
        if (stop == ST_CALLS_END) break;
        if (stop == ST_NONE) return dsf_seterr(err, "Missing special token in tool calls");
        w = read_until(t, n, idx, s_name, 2, &a, &b);
        stop = w < 0 ? ST_NONE : w == 0 ? ST_PARAM_START : ST_INVOKE_END;
        /* ^\s*name="(.*?)">\n$ */
        size_t p = a;
        while (p < b) {
            uint32_t cp;
            size_t k = utf8_next(t + p, b - p, &cp);
            if (!py_isspace(cp)) break;
            p += k;
        }
        size_t name0 = p + 6, name1;
        bool ok = b - p >= 6 && !memcmp(t + p, "name=\"", 6);
        if (ok && ends_with(t, name0, b, "\">\n\n")) name1 = b - 4;
        else if (ok && ends_with(t, name0, b, "\">\n")) name1 = b - 3;
        else ok = false;
        if (!ok) return dsf_seterr(err, "Tool name format error: '%.*s'", cut(t + a, b - a, 200), t + a);
        param_list pl = {0};
        while (stop == ST_PARAM_START) {
            w = read_until(t, n, idx, s_pend, 1, &a, &b);
            stop = w < 0 ? ST_NONE : ST_PARAM_END;
            /* ^ name="(.*?)" string="(true|false)">(.*?)<$ */
            size_t vend = ends_with(t, a, b, "<") ? b - 1 : ends_with(t, a, b, "<\n") ? b - 2 : (size_t)-1;
            bool good = vend != (size_t)-1 && b - a >= 7 && !memcmp(t + a, " name=\"", 7);
            size_t k0 = a + 7, k1 = 0, v0 = 0;
            bool is_str = false;
            if (good) {
                good = false;
                for (size_t q = k0; q <= vend && !good; q++) {
                    static const char st[] = "\" string=\"true\">", sf[] = "\" string=\"false\">";
                    if (vend - q >= sizeof st - 1 && !memcmp(t + q, st, sizeof st - 1)) {
                        good = true, is_str = true, k1 = q, v0 = q + sizeof st - 1;
                    } else if (vend - q >= sizeof sf - 1 && !memcmp(t + q, sf, sizeof sf - 1)) {
                        good = true, is_str = false, k1 = q, v0 = q + sizeof sf - 1;
                    }
                }
            }
            if (!good) {
                params_free(&pl);
                return dsf_seterr(err, "Parameter format error: '%.*s'", cut(t + a, b - a, 200), t + a);
            }
            if (params_find(&pl, t + k0, k1 - k0) >= 0) {
                dsf_seterr(err, "Duplicate parameter name: '%.*s'", cut(t + k0, k1 - k0, 200), t + k0);
                params_free(&pl);
                return -1;
            }
            params_set(&pl, t + k0, k1 - k0, t + v0, vend - v0, is_str);
            w = read_until(t, n, idx, s_name, 2, &a, &b);
            stop = w < 0 ? ST_NONE : w == 0 ? ST_PARAM_START : ST_INVOKE_END;
            if (!span_eq(t, a, b, ">\n")) {
                params_free(&pl);
                return dsf_seterr(err, "Parameter format error: expected '>\\n' but got '%.*s'",
                                  cut(t + a, b - a, 200), t + a);
            }
        }
        dsf_buf args = {0};
        params_json(&pl, &args, false);
        add_call(r, t + name0, name1 - name0, (const char *)args.data, args.len);
        dsf_buf_free(&args);
        params_free(&pl);
    }
    *stop_out = stop;
    return 0;
}

int dsml_parse_official(const char *t, size_t n, bool thinking, dsf_dsml_result *out, char *err) {
    memset(out, 0, sizeof *out);
    size_t idx = 0, a, b, r0 = 0, r1 = 0, c0, c1;
    static const char *const s_think[] = {S_THINK_CLOSE, S_CALLS_START};
    static const char *const s_content[] = {S_EOS, S_CALLS_START};
    static const char *const s_eos[] = {S_EOS};
    if (thinking) {
        int w = read_until(t, n, &idx, s_think, 2, &r0, &r1);
        if (w != 0) return dsf_seterr(err, "Invalid thinking format: missing </think>");
    }
    int w = read_until(t, n, &idx, s_content, 2, &c0, &c1);
    bool eos_last; /* stop_token in [eos, None] */
    if (w == 1) {
        int stop;
        if (official_calls(t, n, &idx, &stop, out, err)) goto bad;
        (void)stop;
        w = read_until(t, n, &idx, s_eos, 1, &a, &b);
        if (b > a) {
            dsf_seterr(err, "Unexpected content after tool calls");
            goto bad;
        }
        eos_last = true; /* the last stop is EOS or None here */
    } else {
        if (w != 0) {
            dsf_seterr(err, "Invalid format: missing EOS token");
            goto bad;
        }
        eos_last = true;
    }
    if (idx != n || !eos_last) {
        dsf_seterr(err, "Unexpected content at end");
        goto bad;
    }
    static const char *const sp[] = {S_BOS, S_EOS, S_THINK_OPEN, S_THINK_CLOSE, S_DSML};
    for (int i = 0; i < 5; i++) {
        if (memmem(t + c0, c1 - c0, sp[i], slen(sp[i])) || memmem(t + r0, r1 - r0, sp[i], slen(sp[i]))) {
            dsf_seterr(err, "Unexpected special token '%s' in content", sp[i]);
            goto bad;
        }
    }
    out->reasoning = dup_bytes(t + r0, r1 - r0);
    out->reasoning_len = r1 - r0;
    out->content = dup_bytes(t + c0, c1 - c0);
    out->content_len = c1 - c0;
    return 0;
bad:
    dsf_dsml_result_free(out);
    return -1;
}

/* ==== streaming router (spec §3.3, §3.4) =================================================== */

enum { R_REASONING, R_CONTENT, R_TOOLS, R_DONE };
enum { T_BLOCK, T_INVOKE, T_VALUE };

struct dsf_dsml_parser {
    bool thinking, strict;
    unsigned char carry[4]; /* an unfinished UTF-8 sequence */
    int ncarry;
    dsf_buf raw;  /* everything fed, sanitized: the official parser's input */
    dsf_buf pend; /* text not yet routed */
    int state;
    bool content_seen; /* any content byte routed (a leading bare </think> is dropped) */
    /* tool block */
    int tstate;
    size_t tpos, scan;  /* parse position and search restart in pend */
    size_t vstart;      /* T_VALUE: value start */
    bool vstr;          /* T_VALUE: string="true" (or missing) */
    char *pkey;         /* T_VALUE: parameter name */
    size_t pkey_len;
    int block_calls;    /* calls started since the block began */
    param_list params;  /* the open invoke */
    char *qname;        /* the open invoke's name */
    size_t qname_len;
    /* accumulated (tolerant) result */
    dsf_dsml_result res;
    dsf_buf reasoning, content;
    dsf_dsml_cb cb;
    void *ud;
};

dsf_dsml_parser *dsf_dsml_parser_new(bool thinking, bool strict) {
    dsf_dsml_parser *p = dsf_xcalloc(1, sizeof *p);
    p->thinking = thinking;
    p->strict = strict;
    p->state = thinking ? R_REASONING : R_CONTENT;
    dsf_buf_append(&p->pend, "", 0); /* data is never NULL */
    dsf_buf_append(&p->raw, "", 0);
    return p;
}

void dsf_dsml_parser_free(dsf_dsml_parser *p) {
    if (!p) return;
    dsf_buf_free(&p->raw);
    dsf_buf_free(&p->pend);
    dsf_buf_free(&p->reasoning);
    dsf_buf_free(&p->content);
    params_free(&p->params);
    free(p->pkey);
    free(p->qname);
    dsf_dsml_result_free(&p->res);
    free(p);
}

static void emit_text(dsf_dsml_parser *p, bool reasoning, const char *s, size_t n) {
    if (!n) return;
    dsf_buf_append(reasoning ? &p->reasoning : &p->content, s, n);
    if (!reasoning) p->content_seen = true;
    if (p->cb) {
        dsf_dsml_event ev = {.type = reasoning ? DSF_DSML_REASONING : DSF_DSML_CONTENT, .text = s, .len = n};
        p->cb(p->ud, &ev);
    }
}

static void pend_consume(dsf_dsml_parser *p, size_t n) {
    memmove(p->pend.data, p->pend.data + n, p->pend.len - n);
    p->pend.len -= n;
    if (p->pend.data) p->pend.data[p->pend.len] = 0;
}

/* Longest suffix of t[0,n) that is a proper prefix of one of the markers. */
static size_t held_suffix(const char *t, size_t n, const char *const *marks, int nm) {
    size_t best = 0;
    for (int i = 0; i < nm; i++) {
        size_t ml = slen(marks[i]);
        for (size_t l = ml - 1 < n ? ml - 1 : n; l > best; l--)
            if (!memcmp(t + n - l, marks[i], l)) {
                best = l;
                break;
            }
    }
    return best;
}

/* Classifies the DSML tag whose '<' is at t[i]: 1 block/invoke opener, 0 other, -1 need more.
 * The answer depends on t[i, i + OPENER_MAX] only: a tag whose name (after any spaces) does
 * not end within OPENER_MAX bytes of its '<' is not an opener, whether the rest of it has
 * arrived or not. (Deciding that only when the input ran out made the routing depend on how
 * the stream was split: the fuzzer's "<｜DSML｜", 51 spaces, "function_calls" opened a tool
 * block when fed whole and stayed text when fed in pieces.) */
#define OPENER_MAX 64
static int classify_opener(const char *t, size_t n, size_t i) {
    const size_t end = i + OPENER_MAX + 1; /* k - i <= OPENER_MAX below */
    size_t j = i + 1 + slen(S_DSML);
    while (j < n && j < end && t[j] == ' ') j++;
    size_t k = j;
    while (k < n && k < end && ((t[k] >= 'a' && t[k] <= 'z') || t[k] == '_')) k++;
    if (k >= end) return 0;
    if (k >= n) return -1;
    size_t l = k - j;
    static const char *const names[] = {"calls", "tool_calls", "function_calls", "invoke"};
    for (int q = 0; q < 4; q++)
        if (l == slen(names[q]) && !memcmp(t + j, names[q], l)) return 1;
    return 0;
}

static void tools_step(dsf_dsml_parser *p, bool final);

/* Routes reasoning/content text in pend; returns when more input is needed. */
static void route_text(dsf_dsml_parser *p, bool final) {
    /* "\n<｜DSML｜" too: up to two newlines before a tag are dropped with it, so a lone "\n"
     * must be held until the tag is known (else the split changes the content). */
    static const char *const m_reason[] = {S_THINK_CLOSE, "\n\n<｜DSML｜", "\n<｜DSML｜", "<｜DSML｜", S_EOS};
    static const char *const m_content[] = {"\n\n<｜DSML｜", "\n<｜DSML｜", "<｜DSML｜", S_EOS};
    size_t from = 0; /* bytes of pend before `from` are known not to start a marker */
    while (p->state == R_REASONING || p->state == R_CONTENT) {
        bool reasoning = p->state == R_REASONING;
        const char *t = (const char *)p->pend.data;
        size_t n = p->pend.len;
        if (n == 0) return;
        if (!reasoning && !p->content_seen && from == 0) { /* a bare </think>: empty reasoning */
            size_t cl = slen(S_THINK_CLOSE);
            if (n >= cl && !memcmp(t, S_THINK_CLOSE, cl)) {
                pend_consume(p, cl);
                continue;
            }
            if (n < cl && !memcmp(t, S_THINK_CLOSE, n) && !final) return;
        }
        const char *pt = reasoning ? find(t, n, from, S_THINK_CLOSE) : NULL;
        const char *pd = find(t, n, from, "<" S_DSML);
        const char *pe = find(t, n, from, S_EOS);
        const char *first = NULL;
        int kind = 0;
        if (pt) { first = pt; kind = 1; }
        if (pd && (!first || pd < first)) { first = pd; kind = 2; }
        if (pe && (!first || pe < first)) { first = pe; kind = 3; }
        if (!first) {
            size_t keep = final ? 0 : held_suffix(t, n, reasoning ? m_reason : m_content, reasoning ? 5 : 4);
            emit_text(p, reasoning, t, n - keep);
            pend_consume(p, n - keep);
            return;
        }
        size_t i = (size_t)(first - t);
        if (kind == 1) {
            emit_text(p, true, t, i);
            pend_consume(p, i + slen(S_THINK_CLOSE));
            p->state = R_CONTENT;
            from = 0;
            continue;
        }
        if (kind == 3) {
            emit_text(p, reasoning, t, i);
            pend_consume(p, n);
            p->state = R_DONE;
            return;
        }
        int c = classify_opener(t, n, i);
        if (c < 0 && !final) { /* hold the tag and the blank line before it */
            size_t nl = 0;
            while (nl < 2 && nl < i && t[i - 1 - nl] == '\n') nl++;
            emit_text(p, reasoning, t, i - nl);
            pend_consume(p, i - nl);
            return;
        }
        if (c <= 0) { /* not a block opener: ordinary text */
            from = i + 1;
            continue;
        }
        size_t nl = 0; /* the "\n\n" separator belongs to the block */
        while (nl < 2 && nl < i && t[i - 1 - nl] == '\n') nl++;
        emit_text(p, reasoning, t, i - nl);
        pend_consume(p, i);
        p->state = R_TOOLS;
        p->tstate = T_BLOCK;
        p->tpos = p->scan = 0;
        p->block_calls = 0;
    }
}

static void feed_routed(dsf_dsml_parser *p, bool final) {
    for (;;) { /* until no state changes and nothing is consumed */
        int s0 = p->state;
        size_t l0 = p->pend.len;
        if (p->state == R_REASONING || p->state == R_CONTENT) route_text(p, final);
        if (p->state == R_TOOLS) tools_step(p, final);
        if (p->state == R_DONE || (p->state == s0 && p->pend.len == l0)) return;
    }
}

/* -- tool block -- */

static void call_begin(dsf_dsml_parser *p, const char *q, size_t ql) {
    free(p->qname);
    p->qname = dup_bytes(q, ql);
    p->qname_len = ql;
    params_free(&p->params);
    char *ns, *name;
    split_ns(q, ql, &ns, &name);
    if (p->cb) {
        dsf_dsml_event ev = {.type = DSF_DSML_TOOL_START, .index = p->res.n_calls, .name = name, .ns = ns};
        p->cb(p->ud, &ev);
    }
    free(ns);
    free(name);
    p->tstate = T_INVOKE;
    p->block_calls++;
}

static void call_end(dsf_dsml_parser *p) {
    dsf_buf args = {0};
    params_json(&p->params, &args, true);
    int index = p->res.n_calls;
    add_call(&p->res, p->qname, p->qname_len, (const char *)args.data, args.len);
    if (p->cb) {
        dsf_dsml_event ev = {.type = DSF_DSML_TOOL_ARGS, .index = index, .text = (const char *)args.data, .len = args.len};
        p->cb(p->ud, &ev);
        dsf_dsml_event end = {.type = DSF_DSML_TOOL_END, .index = index};
        p->cb(p->ud, &end);
    }
    dsf_buf_free(&args);
    params_free(&p->params);
    p->tstate = T_BLOCK;
}

typedef struct {
    bool closing;
    const char *name; /* tag name (after optional spaces) */
    size_t name_len;
    const char *a_name, *a_string; /* attribute values (NULL if absent) */
    size_t a_name_len, a_string_len;
    size_t end; /* offset just past '>' */
} tag_info;

/* Parses the tag starting at t[ts] ('<'). 1 parsed, 0 malformed, -1 incomplete. */
static int parse_tag(const char *t, size_t n, size_t ts, tag_info *tg) {
    memset(tg, 0, sizeof *tg);
    size_t i = ts + 1;
    if (i < n && t[i] == '/') {
        tg->closing = true;
        i++;
    }
    i += slen(S_DSML);
    while (i < n && t[i] == ' ') i++;
    tg->name = t + i;
    while (i < n && ((t[i] >= 'a' && t[i] <= 'z') || t[i] == '_')) i++;
    tg->name_len = (size_t)(t + i - tg->name);
    for (;;) {
        if (i - ts > MAX_TAG) return 0;
        while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i++;
        if (i >= n) return -1;
        if (t[i] == '>') {
            tg->end = i + 1;
            return 1;
        }
        if (t[i] == '/' && i + 1 < n && t[i + 1] == '>') {
            tg->end = i + 2;
            return 1;
        }
        size_t a0 = i;
        while (i < n && t[i] != '=' && t[i] != '>' && t[i] != ' ' && t[i] != '\n') i++;
        if (i >= n) return -1;
        size_t a1 = i;
        if (t[i] != '=') {
            if (i == a0) i++; /* stray character */
            continue;
        }
        i++;
        const char *v;
        size_t vl;
        if (i >= n) return -1;
        if (t[i] == '"' || t[i] == '\'') {
            char q = t[i++];
            /* attribute values are not escaped: a quote ends the value only where the tag
             * goes on (space, '>', '/', end of line), as the official regex reads name="a"b" */
            const char *e = t + i;
            for (;;) {
                e = memchr(e, q, (size_t)(t + n - e));
                if (!e || e + 1 >= t + n) return (n - ts > MAX_TAG) ? 0 : -1;
                char nx = e[1];
                if (nx == ' ' || nx == '>' || nx == '/' || nx == '\n' || nx == '\t' || nx == '\r') break;
                e++;
            }
            v = t + i;
            vl = (size_t)(e - v);
            i = (size_t)(e - t) + 1;
        } else {
            v = t + i;
            while (i < n && t[i] != ' ' && t[i] != '>' && t[i] != '\n') i++;
            if (i >= n) return -1;
            vl = (size_t)(t + i - v);
        }
        if (a1 - a0 == 4 && !memcmp(t + a0, "name", 4)) tg->a_name = v, tg->a_name_len = vl;
        else if (a1 - a0 == 6 && !memcmp(t + a0, "string", 6)) tg->a_string = v, tg->a_string_len = vl;
    }
}

static bool tag_is(const tag_info *tg, const char *name) {
    return tg->name_len == slen(name) && !memcmp(tg->name, name, tg->name_len);
}

/* Leaves the block: text after it is content again (tolerant; the official format ends here). */
static void block_leave(dsf_dsml_parser *p, size_t consumed, int next_state) {
    if (p->tstate == T_INVOKE) call_end(p);
    pend_consume(p, consumed);
    p->state = next_state;
    p->tpos = p->scan = 0;
    if (next_state == R_DONE) p->pend.len = 0;
}

static void tools_step(dsf_dsml_parser *p, bool final) {
    const size_t dl = slen(S_DSML);
    while (p->state == R_TOOLS) {
        const char *t = (const char *)p->pend.data;
        size_t n = p->pend.len;
        /* next DSML tag (or EOS) from scan */
        size_t s = p->scan > p->tpos ? p->scan : p->tpos;
        const char *pd = NULL;
        size_t ts = 0;
        for (size_t from = s;;) {
            pd = find(t, n, from, S_DSML);
            if (!pd) break;
            size_t j = (size_t)(pd - t);
            if (j >= 2 && t[j - 2] == '<' && t[j - 1] == '/' && j - 2 >= p->tpos) { ts = j - 2; break; }
            if (j >= 1 && t[j - 1] == '<' && j - 1 >= p->tpos) { ts = j - 1; break; }
            from = j + dl;
        }
        const char *pe = find(t, n, s, S_EOS);
        if (pe && (!pd || (size_t)(pe - t) < ts)) {
            if (p->tstate == T_VALUE) { /* cut by EOS: the value is incomplete, drop it */
                p->tstate = T_INVOKE;
            }
            if (p->block_calls == 0) emit_text(p, false, t, (size_t)(pe - t));
            block_leave(p, n, R_DONE);
            return;
        }
        if (!pd) {
            if (!final) {
                size_t back = slen(S_EOS) + 2; /* the longest marker that may straddle the end */
                p->scan = n > back ? n - back : 0;
                if (p->scan < p->tpos) p->scan = p->tpos;
                return;
            }
            /* end of stream inside the block: keep complete calls, else the text is content */
            if (p->tstate == T_VALUE) p->tstate = T_INVOKE;
            if (p->block_calls == 0) emit_text(p, false, t, n);
            block_leave(p, n, R_DONE);
            return;
        }
        tag_info tg;
        int rc = parse_tag(t, n, ts, &tg);
        if (rc < 0 && !final) {
            p->scan = ts;
            return;
        }
        p->scan = 0;
        if (p->tstate == T_VALUE) {
            bool param_close = rc > 0 && tg.closing && tag_is(&tg, "parameter");
            params_set(&p->params, p->pkey, p->pkey_len, t + p->vstart, ts - p->vstart, p->vstr);
            free(p->pkey);
            p->pkey = NULL;
            p->tstate = T_INVOKE;
            p->tpos = param_close ? tg.end : ts;
            continue;
        }
        if (rc <= 0) { /* malformed: skip past the marker */
            p->tpos = (size_t)(pd - t) + dl;
            continue;
        }
        p->tpos = tg.end;
        bool block_tag = tag_is(&tg, "calls") || tag_is(&tg, "tool_calls") || tag_is(&tg, "function_calls");
        if (tg.closing && block_tag) {
            bool any = p->block_calls > 0;
            if (!any) emit_text(p, false, t, tg.end); /* nothing parsed: the text stays content */
            block_leave(p, tg.end, R_CONTENT);
            return;
        }
        if (tg.closing && tag_is(&tg, "invoke")) {
            if (p->tstate == T_INVOKE) call_end(p);
            continue;
        }
        if (!tg.closing && tag_is(&tg, "invoke")) {
            if (p->tstate == T_INVOKE) call_end(p);
            call_begin(p, tg.a_name ? tg.a_name : "", tg.a_name ? tg.a_name_len : 0);
            continue;
        }
        if (!tg.closing && tag_is(&tg, "parameter") && p->tstate == T_INVOKE) {
            const char *k = tg.a_name ? tg.a_name : "";
            size_t kl = tg.a_name ? tg.a_name_len : 0;
            bool st = tg.a_string && tg.a_string_len == 4 && !memcmp(tg.a_string, "true", 4);
            bool sf = tg.a_string && tg.a_string_len == 5 && !memcmp(tg.a_string, "false", 5);
            if (tg.a_string && !st && !sf) { /* the value was written into the attribute */
                params_set(&p->params, k, kl, tg.a_string, tg.a_string_len, true);
                continue;
            }
            free(p->pkey);
            p->pkey = dup_bytes(k, kl);
            p->pkey_len = kl;
            p->vstr = !sf;
            p->vstart = tg.end;
            p->tstate = T_VALUE;
            continue;
        }
        /* anything else (stray closes, a nested block opener): ignore */
    }
}

/* -- input sanitizing and the public API -- */

static void push_valid(dsf_dsml_parser *p, const unsigned char *s, size_t n) {
    dsf_buf_append(&p->raw, s, n);
    dsf_buf_append(&p->pend, s, n);
}

static void push_bad(dsf_dsml_parser *p) { push_valid(p, (const unsigned char *)"\xEF\xBF\xBD", 3); }

/* Valid UTF-8 passes through; each maximal invalid subsequence becomes U+FFFD. */
static void sanitize(dsf_dsml_parser *p, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (p->ncarry == 0) {
            size_t j = i;
            while (j < n && s[j] < 0x80) j++;
            if (j > i) {
                push_valid(p, s + i, j - i);
                i = j;
                continue;
            }
        }
        unsigned char c = s[i];
        if (p->ncarry == 0) {
            if (c >= 0xC2 && c <= 0xF4) p->carry[p->ncarry++] = c;
            else push_bad(p);
            i++;
            continue;
        }
        unsigned char lead = p->carry[0];
        size_t need = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        unsigned char lo = 0x80, hi = 0xBF;
        if (p->ncarry == 1) {
            if (lead == 0xE0) lo = 0xA0;
            else if (lead == 0xED) hi = 0x9F;
            else if (lead == 0xF0) lo = 0x90;
            else if (lead == 0xF4) hi = 0x8F;
        }
        if (c < lo || c > hi) { /* broken sequence: replace it, reread c */
            p->ncarry = 0;
            push_bad(p);
            continue;
        }
        p->carry[p->ncarry++] = c;
        i++;
        if ((size_t)p->ncarry == need) {
            push_valid(p, p->carry, need);
            p->ncarry = 0;
        }
    }
}

void dsf_dsml_feed(dsf_dsml_parser *p, const char *text, size_t len, dsf_dsml_cb cb, void *ud) {
    if (p->state == R_DONE) { /* after EOS only the official parser looks at the text */
        sanitize(p, (const unsigned char *)text, len); /* as it would have been in one feed */
        p->pend.len = 0;
        return;
    }
    p->cb = cb;
    p->ud = ud;
    sanitize(p, (const unsigned char *)text, len);
    if (p->state != R_DONE) feed_routed(p, false);
    p->cb = NULL;
}

int dsf_dsml_finish(dsf_dsml_parser *p, dsf_dsml_cb cb, void *ud, dsf_dsml_result *out, char *err) {
    memset(out, 0, sizeof *out);
    p->cb = cb;
    p->ud = ud;
    if (p->ncarry) {
        p->ncarry = 0;
        push_bad(p);
    }
    if (p->state != R_DONE) feed_routed(p, true);
    p->cb = NULL;
    if (p->strict) {
        dsf_buf txt = {0};
        dsf_buf_append(&txt, p->raw.data ? p->raw.data : (const uint8_t *)"", p->raw.len);
        if (!memmem(txt.data, txt.len, S_EOS, slen(S_EOS))) dsf_buf_append(&txt, S_EOS, slen(S_EOS));
        int rc = dsml_parse_official((const char *)txt.data, txt.len, p->thinking, out, err);
        dsf_buf_free(&txt);
        return rc;
    }
    *out = p->res;
    memset(&p->res, 0, sizeof p->res);
    out->reasoning = dup_bytes(p->reasoning.data ? (const char *)p->reasoning.data : "", p->reasoning.len);
    out->reasoning_len = p->reasoning.len;
    out->content = dup_bytes(p->content.data ? (const char *)p->content.data : "", p->content.len);
    out->content_len = p->content.len;
    return 0;
}

int dsf_dsml_parse(const char *text, size_t len, bool thinking, bool strict, dsf_dsml_result *out, char *err) {
    dsf_dsml_parser *p = dsf_dsml_parser_new(thinking, strict);
    dsf_dsml_feed(p, text, len, NULL, NULL);
    int rc = dsf_dsml_finish(p, NULL, NULL, out, err);
    dsf_dsml_parser_free(p);
    return rc;
}
