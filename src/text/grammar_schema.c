/* grammar_schema.c: constraint specs -> grammars (text layer): JSON schemas to the grammar of
 * their JSON values, and tool sets to the grammar of the DSML tool-calls block (spec
 * chat-format.md §3.1).
 *
 * Owns: the spec format (dsf_grammar_new in dsflash.h), the JSON-schema subset and how each
 * keyword is treated, the output forms chosen (below). Must not: run the grammar (grammar.c).
 * Invariant: every string the grammar can produce parses with dsml.c's strict parser and
 * jansson, and validates against the schema once the ignored keywords are dropped.
 *
 * Output forms: JSON is written compact, with at most one space after ':' and ','; numbers as
 * -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? with at most 18 digits before the point, 20 after it and 2
 * in the exponent, so that every number is a finite double and every integer fits int64
 * (integers: no fraction, no exponent);
 * object properties in the schema's order (optional ones may be left out); literals (enum,
 * const, property names) escape '<' and U+FF5C so that no marker string can appear.
 * Keywords: type (and type lists), properties, required, additionalProperties (absent with
 * properties = false, as in OpenAI's strict mode), items, minItems/maxItems (maxItems above
 * 1024 = unbounded), minLength/maxLength, enum, const, anyOf, oneOf (as anyOf), allOf (merged
 * shallowly: properties, required, then the first value of every other keyword), nullable,
 * $ref to "#", "#/$defs/..", "#/definitions/.." (siblings of $ref are ignored). Ignored: pattern,
 * format, minimum/maximum and their exclusive forms, multipleOf, uniqueItems,
 * min/maxProperties, patternProperties, prefixItems and tuple items, not, if/then/else, and
 * every annotation (title, description, examples, default, ...). */
#include "text/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "text/pyjson.h"

#define MAX_NODES 20000   /* schema nodes compiled per spec */
#define MAX_DEPTH 64      /* schema nesting */
#define MAX_ITEMS 1024    /* explicit array counts */
#define MAX_ELEMS (1 << 22)

/* ==== sequences and alternatives ========================================================= */

typedef struct {
    gr_elem *e;
    int n, cap;
} seq;

typedef struct {
    seq *s;
    int n, cap;
} alts;

static void s_push(seq *s, gr_elem e) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->e = dsf_xrealloc(s->e, (size_t)s->cap * sizeof *s->e);
    }
    s->e[s->n++] = e;
}

static void s_byte(dsf_grammar *g, seq *s, int c) {
    uint8_t set[32] = {0};
    set[c >> 3] |= (uint8_t)(1u << (c & 7));
    s_push(s, (gr_elem){GE_BYTES, gr_set_index(g, set)});
}
static void s_range(dsf_grammar *g, seq *s, const char *chars) {
    uint8_t set[32] = {0};
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++) set[*p >> 3] |= (uint8_t)(1u << (*p & 7));
    s_push(s, (gr_elem){GE_BYTES, gr_set_index(g, set)});
}
static void s_lit(dsf_grammar *g, seq *s, const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) s_byte(g, s, (unsigned char)t[i]);
}
static void s_cstr(dsf_grammar *g, seq *s, const char *t) { s_lit(g, s, t, strlen(t)); }
static void s_ref(seq *s, int r) { s_push(s, (gr_elem){GE_REF, r}); }
static void s_sym(seq *s, int y) { s_push(s, (gr_elem){GE_SYM, y}); }

static seq *a_new(alts *a) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 4;
        a->s = dsf_xrealloc(a->s, (size_t)a->cap * sizeof *a->s);
    }
    a->s[a->n] = (seq){0};
    return &a->s[a->n++];
}

/* Moves the alternatives into rule r (or a new rule when r < 0); returns the rule. */
static int a_commit(dsf_grammar *g, alts *a, int r) {
    if (r < 0) r = gr_rule_new(g);
    gr_elem **sq = dsf_xmalloc((size_t)(a->n ? a->n : 1) * sizeof *sq);
    int *len = dsf_xmalloc((size_t)(a->n ? a->n : 1) * sizeof *len);
    for (int i = 0; i < a->n; i++) sq[i] = a->s[i].e, len[i] = a->s[i].n;
    gr_rule_set(g, r, sq, len, a->n);
    for (int i = 0; i < a->n; i++) free(a->s[i].e);
    free(a->s);
    free(sq);
    free(len);
    *a = (alts){0};
    return r;
}

/* A rule with one alternative: the sequence s (consumed). */
static int rule_of(dsf_grammar *g, seq *s) {
    alts a = {0};
    *a_new(&a) = *s;
    *s = (seq){0};
    return a_commit(g, &a, -1);
}

/* ==== the compiler's context ============================================================= */

typedef struct {
    dsf_grammar *g;
    json_t *spec;
    const json_t *root;     /* the schema $refs resolve against */
    json_t *keep;           /* merged allOf schemas, kept alive until the end */
    const json_t **memo_k;  /* schema node -> rule */
    int *memo_r;
    int n_memo, cap_memo;
    int nodes;
    int r_ws, r_any, r_num, r_int, r_digits[20];
    char *err;
} cc;

static int memo_find(const cc *c, const json_t *s) {
    for (int i = c->n_memo - 1; i >= 0; i--)
        if (c->memo_k[i] == s) return c->memo_r[i];
    return -1;
}

static void memo_add(cc *c, const json_t *s, int r) {
    if (c->n_memo == c->cap_memo) {
        c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 64;
        c->memo_k = dsf_xrealloc(c->memo_k, (size_t)c->cap_memo * sizeof *c->memo_k);
        c->memo_r = dsf_xrealloc(c->memo_r, (size_t)c->cap_memo * sizeof *c->memo_r);
    }
    c->memo_k[c->n_memo] = s;
    c->memo_r[c->n_memo++] = r;
}

/* ==== literals =========================================================================== */

/* A JSON string literal; '<' and U+FF5C are escaped so that no marker can be spelled. */
static void lit_string(dsf_buf *b, const char *s, size_t n) {
    dsf_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') dsf_buf_appendf(b, "\\%c", c);
        else if (c == '\n') dsf_buf_append(b, "\\n", 2);
        else if (c < 0x20 || c == '<') dsf_buf_appendf(b, "\\u%04x", c);
        else if (c == 0xEF && i + 2 < n && (unsigned char)s[i + 1] == 0xBD && (unsigned char)s[i + 2] == 0x9C) {
            dsf_buf_append(b, "\\uff5c", 6);
            i += 2;
        } else dsf_buf_append(b, &s[i], 1);
    }
    dsf_buf_append(b, "\"", 1);
}

/* A compact JSON text of v; -1 for values JSON cannot write (NaN, Infinity). */
static int lit_value(dsf_buf *b, const json_t *v) {
    if (pyjson_is_str(v)) {
        lit_string(b, json_string_value(v), json_string_length(v));
    } else if (json_is_string(v)) { /* a raw number (pyjson) */
        const char *t = json_string_value(v);
        if (t[1] != 'i') return -1;
        dsf_buf_append(b, t + 2, strlen(t + 2));
    } else if (json_is_integer(v)) {
        dsf_buf_appendf(b, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        char t[40];
        pyjson_float_repr(json_real_value(v), t);
        dsf_buf_append(b, t, strlen(t));
    } else if (json_is_true(v) || json_is_false(v) || json_is_null(v)) {
        const char *t = json_is_true(v) ? "true" : json_is_false(v) ? "false" : "null";
        dsf_buf_append(b, t, strlen(t));
    } else if (json_is_array(v)) {
        dsf_buf_append(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) dsf_buf_append(b, ",", 1);
            if (lit_value(b, json_array_get(v, i))) return -1;
        }
        dsf_buf_append(b, "]", 1);
    } else {
        const char *k;
        const json_t *x;
        bool first = true;
        dsf_buf_append(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) dsf_buf_append(b, ",", 1);
            first = false;
            lit_string(b, k, strlen(k));
            dsf_buf_append(b, ":", 1);
            if (lit_value(b, x)) return -1;
        }
        dsf_buf_append(b, "}", 1);
    }
    return 0;
}

/* Whether raw text may appear as a DSML string="true" value or a name: valid UTF-8, no NUL,
 * no marker string, and no '"' when it is a name (attribute values have no escapes). */
static bool raw_ok(const char *s, size_t n, bool name) {
    if (name && memchr(s, '"', n)) return false;
    if (memchr(s, 0, n) || gr_has_marker(s, n)) return false;
    json_t *js = json_stringn(s, n);
    json_decref(js);
    return js != NULL;
}

/* ==== shared rules ======================================================================= */

static int r_ws(cc *c) { /* "" | " " */
    if (c->r_ws >= 0) return c->r_ws;
    alts a = {0};
    a_new(&a);
    s_byte(c->g, a_new(&a), ' ');
    return c->r_ws = a_commit(c->g, &a, -1);
}

/* up to k more digits (k <= 19): bounded so that every number is a finite double */
static int r_digits(cc *c, int k) {
    if (c->r_digits[k] >= 0) return c->r_digits[k];
    alts a = {0};
    a_new(&a);
    if (k > 0) {
        seq *s = a_new(&a);
        s_range(c->g, s, "0123456789");
        s_ref(s, r_digits(c, k - 1));
    }
    return c->r_digits[k] = a_commit(c->g, &a, -1);
}

static int r_int(cc *c) {
    if (c->r_int >= 0) return c->r_int;
    alts a = {0};
    for (int neg = 0; neg < 2; neg++) {
        seq *s = a_new(&a);
        if (neg) s_byte(c->g, s, '-');
        s_byte(c->g, s, '0');
        s = a_new(&a);
        if (neg) s_byte(c->g, s, '-');
        s_range(c->g, s, "123456789");
        s_ref(s, r_digits(c, 17)); /* 18 digits: every integer fits int64 (jansson refuses more) */
    }
    return c->r_int = a_commit(c->g, &a, -1);
}

static int r_num(cc *c) {
    if (c->r_num >= 0) return c->r_num;
    alts fr = {0}, ex = {0};
    a_new(&fr);
    seq *s = a_new(&fr);
    s_byte(c->g, s, '.');
    s_range(c->g, s, "0123456789");
    s_ref(s, r_digits(c, 19));
    int frac = a_commit(c->g, &fr, -1);
    a_new(&ex);
    for (int sign = 0; sign < 2; sign++) {
        s = a_new(&ex);
        s_range(c->g, s, "eE");
        if (sign) s_range(c->g, s, "+-");
        s_range(c->g, s, "0123456789");
        s_ref(s, r_digits(c, 1));
    }
    int exp = a_commit(c->g, &ex, -1);
    seq q = {0};
    s_ref(&q, r_int(c));
    s_ref(&q, frac);
    s_ref(&q, exp);
    return c->r_num = rule_of(c->g, &q);
}

static void s_jstr(cc *c, seq *s, int32_t min, int32_t max) {
    s_byte(c->g, s, '"');
    s_push(s, (gr_elem){GE_STR, gr_str_index(c->g, min, max, false)});
}

/* "" | sep item rest (rest = this rule): the tail of a list of items */
static int r_list_tail(cc *c, const char *sep, int item) {
    int r = gr_rule_new(c->g);
    alts a = {0};
    a_new(&a);
    seq *s = a_new(&a);
    s_cstr(c->g, s, sep);
    s_ref(s, r_ws(c));
    s_ref(s, item);
    s_ref(s, r);
    return a_commit(c->g, &a, r);
}

/* A member with any key: "KEY": VALUE (value: a rule). */
static int r_member(cc *c, int value) {
    seq kv = {0};
    s_jstr(c, &kv, 0, -1);
    s_byte(c->g, &kv, ':');
    s_ref(&kv, r_ws(c));
    s_ref(&kv, value);
    return rule_of(c->g, &kv);
}

/* Any JSON value (schema true, json_object's members). */
static int r_any(cc *c) {
    if (c->r_any >= 0) return c->r_any;
    dsf_grammar *g = c->g;
    int any = c->r_any = gr_rule_new(g);
    int r_kv = r_member(c, any);
    alts a = {0};
    seq *s = a_new(&a);
    s_cstr(g, s, "{}");
    s = a_new(&a);
    s_byte(g, s, '{');
    s_ref(s, r_kv);
    s_ref(s, r_list_tail(c, ",", r_kv));
    s_byte(g, s, '}');
    s = a_new(&a);
    s_cstr(g, s, "[]");
    s = a_new(&a);
    s_byte(g, s, '[');
    s_ref(s, any);
    s_ref(s, r_list_tail(c, ",", any));
    s_byte(g, s, ']');
    s_jstr(c, a_new(&a), 0, -1);
    s_ref(a_new(&a), r_num(c));
    s_cstr(g, a_new(&a), "true");
    s_cstr(g, a_new(&a), "false");
    s_cstr(g, a_new(&a), "null");
    return a_commit(g, &a, any);
}

/* ==== schemas ============================================================================ */

static int value_rule(cc *c, const json_t *sch, int depth, const char *where);

static int fail(cc *c, const char *where, const char *fmt, const char *what) {
    char m[256];
    snprintf(m, sizeof m, fmt, what);
    return dsf_seterr(c->err, "%s: %s", where, m);
}

/* Resolves a local $ref ("#", "#/a/b" with ~0 ~1); NULL with err. */
static const json_t *resolve(cc *c, const char *ref, const char *where) {
    if (ref[0] != '#') {
        fail(c, where, "only local $ref (\"#...\") is supported, got \"%s\"", ref);
        return NULL;
    }
    const json_t *v = c->root;
    const char *p = ref + 1;
    while (*p == '/' && v) {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = p[1] == '0' ? '~' : '/', p++;
            if (n + 1 < sizeof tok) tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(v)) v = json_object_get(v, tok);
        else if (json_is_array(v)) {
            char *end;
            long i = strtol(tok, &end, 10);
            v = *tok && !*end && i >= 0 ? json_array_get(v, (size_t)i) : NULL;
        } else v = NULL;
    }
    if (*p || !v) {
        fail(c, where, "$ref \"%s\" does not resolve", ref);
        return NULL;
    }
    return v;
}

/* allOf: one schema with the parts' properties and required merged; every other keyword
 * takes its first value (the schema's own, then the parts' in order). */
static const json_t *merge_all_of(cc *c, const json_t *sch, const char *where) {
    json_t *m = json_object(), *props = json_object(), *req = json_array();
    const json_t *parts = json_object_get(sch, "allOf");
    for (size_t i = 0; i <= json_array_size(parts); i++) {
        const json_t *p = i == 0 ? sch : json_array_get(parts, i - 1);
        while (json_is_object(p) && pyjson_is_str(json_object_get(p, "$ref")) && p != NULL) {
            const json_t *q = resolve(c, json_string_value(json_object_get(p, "$ref")), where);
            if (!q || q == p) break;
            p = q;
        }
        if (!json_is_object(p)) continue;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)p, k, v) {
            if (!strcmp(k, "allOf") || !strcmp(k, "$ref")) continue;
            if (!strcmp(k, "properties") && json_is_object(v)) {
                const char *pk;
                json_t *pv;
                json_object_foreach(v, pk, pv) if (!json_object_get(props, pk)) json_object_set(props, pk, pv);
            } else if (!strcmp(k, "required") && json_is_array(v)) {
                for (size_t j = 0; j < json_array_size(v); j++) json_array_append(req, json_array_get(v, j));
            } else if (!json_object_get(m, k)) {
                json_object_set(m, k, v);
            }
        }
    }
    if (json_object_size(props)) json_object_set(m, "properties", props);
    if (json_array_size(req)) json_object_set(m, "required", req);
    json_decref(props);
    json_decref(req);
    json_array_append_new(c->keep, m);
    return m;
}

/* Alternatives for enum/const: one literal each. */
static int enum_alts(cc *c, const json_t *vals, alts *a, const char *where) {
    for (size_t i = 0; i < json_array_size(vals); i++) {
        dsf_buf b = {0};
        if (lit_value(&b, json_array_get(vals, i)) == 0) s_lit(c->g, a_new(a), (const char *)b.data, b.len);
        dsf_buf_free(&b);
    }
    if (a->n == 0) return fail(c, where, "%s admits no value", "enum");
    return 0;
}

static bool has(const json_t *s, const char *k) { return json_object_get(s, k) != NULL; }

static long long get_count(const json_t *s, const char *k, long long dflt) {
    const json_t *v = json_object_get(s, k);
    if (json_is_integer(v)) return json_integer_value(v) < 0 ? 0 : json_integer_value(v);
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) < 1e9) return (long long)json_real_value(v);
    return dflt;
}

/* The ordered-properties family: F_i (nothing written yet) / N_i (something written), items
 * item[j] (a sequence each), sep before every item but the first, then tail. Returns F_0. */
static int ordered_family(cc *c, int n, seq *item, const bool *req, const char *sep, bool sep_ws, int tail) {
    dsf_grammar *g = c->g;
    int *F = dsf_xmalloc((size_t)(n + 1) * sizeof *F), *N = dsf_xmalloc((size_t)(n + 1) * sizeof *N);
    F[n] = N[n] = tail;
    for (int i = n - 1; i >= 0; i--) {
        alts fa = {0}, na = {0};
        int j = i;
        for (; j < n; j++) {
            for (int w = 0; w < 2; w++) {
                seq *s = a_new(w ? &na : &fa);
                if (w) {
                    s_cstr(g, s, sep);
                    if (sep_ws) s_ref(s, r_ws(c));
                }
                for (int k = 0; k < item[j].n; k++) s_push(s, item[j].e[k]);
                s_ref(s, N[j + 1]);
            }
            if (req[j]) break;
        }
        if (j == n) { /* everything from i on is optional */
            s_ref(a_new(&fa), F[n]);
            s_ref(a_new(&na), N[n]);
        }
        F[i] = a_commit(g, &fa, -1);
        N[i] = a_commit(g, &na, -1);
    }
    int f0 = F[0];
    free(F);
    free(N);
    return f0;
}

static int param_item(cc *c, const char *key, const json_t *sch, seq *out, const char *where);

/* "KEY": VALUE of one object member */
static int member_item(cc *c, const char *key, const json_t *sch, seq *out, int depth, const char *where) {
    char w[160];
    snprintf(w, sizeof w, "%.100s.%.50s", where, key);
    int vr = value_rule(c, sch, depth + 1, w);
    if (vr < 0) return -1;
    dsf_buf b = {0};
    lit_string(&b, key, strlen(key));
    s_lit(c->g, out, (const char *)b.data, b.len);
    dsf_buf_free(&b);
    s_byte(c->g, out, ':');
    s_ref(out, r_ws(c));
    s_ref(out, vr);
    return 0;
}

/* The items of the properties in schema order (object members, or DSML parameters when
 * dsml) into *item / *req_out (n_props entries allocated, *n = their count); properties that
 * cannot be written are left out unless required. Returns how many items were made, or -1. */
static int props_items(cc *c, const json_t *props, const json_t *req, bool dsml, seq **item_out, bool **req_out, int *n_out,
                       int depth, const char *where) {
    if (props && !json_is_object(props)) return fail(c, where, "'%s' must be an object", "properties");
    if (req && !json_is_array(req)) return fail(c, where, "'%s' must be a list", "required");
    int n = (int)json_object_size(props), m = 0;
    seq *item = *item_out = dsf_xcalloc((size_t)(n ? n : 1), sizeof *item);
    bool *rq = *req_out = dsf_xcalloc((size_t)(n ? n : 1), sizeof *rq);
    *n_out = n;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        bool required = false;
        for (size_t i = 0; i < json_array_size(req); i++)
            if (pyjson_is_str(json_array_get(req, i)) && !strcmp(json_string_value(json_array_get(req, i)), k)) required = true;
        if (json_is_false(v) || (dsml && !raw_ok(k, strlen(k), true))) {
            if (required)
                return fail(c, where, "required property '%.100s' cannot be written (schema false, or a '\"' or marker in a DSML name)", k);
            continue;
        }
        if (dsml ? param_item(c, k, v, &item[m], where) : member_item(c, k, v, &item[m], depth, where)) return -1;
        rq[m++] = required;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!pyjson_is_str(r) || !json_object_get(props, json_string_value(r)))
            return fail(c, where, "required property '%s' is not in 'properties'", pyjson_is_str(r) ? json_string_value(r) : "?");
    }
    return m;
}

static int object_alt(cc *c, const json_t *sch, seq *out, int depth, const char *where) {
    dsf_grammar *g = c->g;
    const json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required");
    const json_t *addl = json_object_get(sch, "additionalProperties");
    seq *item = NULL;
    bool *rq = NULL;
    int n = 0, m = props_items(c, props, req, false, &item, &rq, &n, depth, where), rc = m < 0 ? -1 : 0;
    if (rc == 0) {
        /* extra members: allowed by additionalProperties true / a schema, or by default when
         * the schema lists no properties */
        bool extra = addl ? !json_is_false(addl) : n == 0;
        int tail_f = -1, tail_n = -1;
        if (extra) {
            int vr = json_is_object(addl) ? value_rule(c, addl, depth + 1, where) : r_any(c);
            if (vr < 0) rc = -1;
            else {
                int r_kv = r_member(c, vr);
                tail_n = r_list_tail(c, ",", r_kv);
                alts a = {0};
                a_new(&a);
                seq *s = a_new(&a);
                s_ref(s, r_kv);
                s_ref(s, tail_n);
                tail_f = a_commit(g, &a, -1);
            }
        }
        if (rc == 0) {
            seq e = {0};
            int empty = rule_of(g, &e);
            /* F_n / N_n: the extras (first or after a member), else nothing */
            int fam;
            if (m == 0) fam = extra ? tail_f : empty;
            else {
                int tail = extra ? tail_n : empty;
                fam = ordered_family(c, m, item, rq, ",", true, tail);
                if (extra) { /* nothing declared written: extras start without a comma */
                    alts a = {0};
                    s_ref(a_new(&a), fam);
                    bool any_req = false;
                    for (int i = 0; i < m; i++) any_req |= rq[i];
                    if (!any_req) s_ref(a_new(&a), tail_f);
                    fam = a_commit(g, &a, -1);
                }
            }
            s_byte(g, out, '{');
            s_ref(out, fam);
            s_byte(g, out, '}');
        }
    }
    for (int i = 0; i < n; i++) free(item[i].e);
    free(item);
    free(rq);
    return rc;
}

static int array_alt(cc *c, const json_t *sch, seq *out, int depth, const char *where) {
    dsf_grammar *g = c->g;
    const json_t *items = json_object_get(sch, "items");
    int it = json_is_object(items) || json_is_true(items) ? value_rule(c, items, depth + 1, where) : r_any(c);
    if (it < 0) return -1;
    long long lo = get_count(sch, "minItems", 0), hi = get_count(sch, "maxItems", -1);
    if (json_is_false(items)) hi = 0;
    if (hi > MAX_ITEMS) hi = -1;
    if (lo > MAX_ITEMS) return fail(c, where, "%s above 1024 is not supported", "minItems");
    if (hi >= 0 && lo > hi) return fail(c, where, "%s: minItems > maxItems", "array");
    s_byte(g, out, '[');
    if (hi != 0) {
        /* rest[k]: k items written; unbounded from lo on (one rule, repeated) */
        int top = hi >= 0 ? (int)hi : (int)(lo > 1 ? lo : 1);
        int *rest = dsf_xmalloc((size_t)(top + 1) * sizeof *rest);
        for (int k = top; k >= 1; k--) {
            if (hi < 0 && k == top) {
                rest[k] = r_list_tail(c, ",", it);
                continue;
            }
            alts a = {0};
            if (k >= lo) a_new(&a);
            if (hi < 0 || k < hi) {
                seq *s = a_new(&a);
                s_byte(g, s, ',');
                s_ref(s, r_ws(c));
                s_ref(s, it);
                s_ref(s, rest[k + 1]);
            }
            rest[k] = a_commit(g, &a, -1);
        }
        alts a = {0};
        if (lo == 0) a_new(&a);
        seq *s = a_new(&a);
        s_ref(s, it);
        s_ref(s, rest[1]);
        s_ref(out, a_commit(g, &a, -1));
        free(rest);
    }
    s_byte(g, out, ']');
    return 0;
}

static int type_alt(cc *c, const json_t *sch, const char *t, alts *a, int depth, const char *where) {
    if (!strcmp(t, "null")) s_cstr(c->g, a_new(a), "null");
    else if (!strcmp(t, "boolean")) s_cstr(c->g, a_new(a), "true"), s_cstr(c->g, a_new(a), "false");
    else if (!strcmp(t, "integer")) s_ref(a_new(a), r_int(c));
    else if (!strcmp(t, "number")) s_ref(a_new(a), r_num(c));
    else if (!strcmp(t, "string")) {
        long long lo = get_count(sch, "minLength", 0), hi = get_count(sch, "maxLength", -1);
        if (lo > (1 << 20)) lo = 1 << 20;
        if (hi > (1 << 20)) hi = -1;
        if (hi >= 0 && lo > hi) return fail(c, where, "%s: minLength > maxLength", "string");
        s_jstr(c, a_new(a), (int32_t)lo, (int32_t)hi);
    } else if (!strcmp(t, "object")) return object_alt(c, sch, a_new(a), depth, where);
    else if (!strcmp(t, "array")) return array_alt(c, sch, a_new(a), depth, where);
    else return fail(c, where, "unknown type \"%s\"", t);
    return 0;
}

static int schema_alts(cc *c, const json_t *sch, alts *a, int depth, const char *where) {
    const json_t *v;
    if ((v = json_object_get(sch, "$ref"))) {
        if (!pyjson_is_str(v)) return fail(c, where, "'%s' must be a string", "$ref");
        const json_t *t = resolve(c, json_string_value(v), where);
        if (!t) return -1;
        int r = value_rule(c, t, depth + 1, where);
        if (r < 0) return -1;
        s_ref(a_new(a), r);
        return 0;
    }
    if ((v = json_object_get(sch, "const"))) {
        json_t *one = json_pack("[O]", v);
        int rc = enum_alts(c, one, a, where);
        json_decref(one);
        return rc;
    }
    if ((v = json_object_get(sch, "enum"))) {
        if (!json_is_array(v)) return fail(c, where, "'%s' must be a list", "enum");
        return enum_alts(c, v, a, where);
    }
    const char *comb = has(sch, "anyOf") ? "anyOf" : has(sch, "oneOf") ? "oneOf" : NULL;
    if (comb) {
        v = json_object_get(sch, comb);
        if (!json_is_array(v) || !json_array_size(v)) return fail(c, where, "'%s' must be a non-empty list", comb);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (json_is_false(json_array_get(v, i))) continue;
            int r = value_rule(c, json_array_get(v, i), depth + 1, where);
            if (r < 0) return -1;
            s_ref(a_new(a), r);
        }
        if (!a->n) return fail(c, where, "%s admits no value", comb);
        return 0;
    }
    if (has(sch, "allOf")) {
        if (!json_is_array(json_object_get(sch, "allOf"))) return fail(c, where, "'%s' must be a list", "allOf");
        const json_t *m = merge_all_of(c, sch, where);
        int r = value_rule(c, m, depth + 1, where);
        if (r < 0) return -1;
        s_ref(a_new(a), r);
        return 0;
    }
    v = json_object_get(sch, "type");
    if (pyjson_is_str(v)) {
        if (type_alt(c, sch, json_string_value(v), a, depth, where)) return -1;
    } else if (json_is_array(v) && json_array_size(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *t = json_array_get(v, i);
            if (!pyjson_is_str(t)) return fail(c, where, "'%s' entries must be strings", "type");
            if (type_alt(c, sch, json_string_value(t), a, depth, where)) return -1;
        }
    } else if (v) {
        return fail(c, where, "'%s' must be a string or a list of strings", "type");
    } else if (has(sch, "properties") || has(sch, "required") || has(sch, "additionalProperties")) {
        if (type_alt(c, sch, "object", a, depth, where)) return -1;
    } else if (has(sch, "items") || has(sch, "minItems") || has(sch, "maxItems")) {
        if (type_alt(c, sch, "array", a, depth, where)) return -1;
    } else {
        s_ref(a_new(a), r_any(c));
    }
    if (json_is_true(json_object_get(sch, "nullable"))) s_cstr(c->g, a_new(a), "null");
    return 0;
}

/* The rule of a JSON value of schema sch (memoized per node, so $ref cycles close). */
static int value_rule(cc *c, const json_t *sch, int depth, const char *where) {
    if (json_is_true(sch)) return r_any(c);
    if (json_is_false(sch)) return fail(c, where, "the schema %s admits no value", "false");
    if (!json_is_object(sch)) return fail(c, where, "a schema must be an object or a boolean, got %s", pyjson_type_name(sch));
    if (depth > MAX_DEPTH) return fail(c, where, "schema nested deeper than %s levels", "64");
    if (++c->nodes > MAX_NODES || c->g->n_el > MAX_ELEMS) return fail(c, where, "schema too large (%s)", "over 20000 nodes");
    int r = memo_find(c, sch);
    if (r >= 0) return r;
    r = gr_rule_new(c->g);
    memo_add(c, sch, r);
    alts a = {0};
    if (schema_alts(c, sch, &a, depth, where)) {
        a_commit(c->g, &a, r);
        return -1;
    }
    a_commit(c->g, &a, r);
    return r;
}

/* ==== DSML tool calls (spec chat-format.md §3.1) ========================================= */

static void s_tag(cc *c, seq *s, const char *open, const char *rest) {
    s_cstr(c->g, s, open); /* "<" or "</" */
    s_sym(s, GR_SYM_DSML);
    s_cstr(c->g, s, rest);
}

/* Whether a parameter is written string="true": its schema is a plain string (or enum/const
 * of strings only). */
static bool string_param(const json_t *sch) {
    const json_t *t = json_object_get(sch, "type");
    if (json_object_get(sch, "anyOf") || json_object_get(sch, "oneOf") || json_object_get(sch, "$ref") || json_object_get(sch, "allOf"))
        return false;
    const json_t *e = json_object_get(sch, "enum");
    if (json_object_get(sch, "const")) return pyjson_is_str(json_object_get(sch, "const"));
    if (json_is_array(e)) {
        for (size_t i = 0; i < json_array_size(e); i++)
            if (!pyjson_is_str(json_array_get(e, i))) return false;
        return json_array_size(e) > 0;
    }
    return pyjson_is_str(t) && !strcmp(json_string_value(t), "string") && !json_is_true(json_object_get(sch, "nullable"));
}

/* <｜DSML｜ parameter name="KEY" string="true|false">VALUE</｜DSML｜ parameter> */
static int param_item(cc *c, const char *key, const json_t *sch, seq *out, const char *where) {
    dsf_grammar *g = c->g;
    s_tag(c, out, "<", " parameter name=\"");
    s_cstr(g, out, key);
    if (json_is_object(sch) && string_param(sch)) {
        s_cstr(g, out, "\" string=\"true\">");
        const json_t *cv = json_object_get(sch, "const");
        json_t *e = cv ? json_pack("[O]", cv) : json_incref(json_object_get(sch, "enum"));
        if (e) {
            alts a = {0};
            for (size_t i = 0; i < json_array_size(e); i++) {
                const json_t *x = json_array_get(e, i);
                if (raw_ok(json_string_value(x), json_string_length(x), false))
                    s_lit(g, a_new(&a), json_string_value(x), json_string_length(x));
            }
            json_decref(e);
            if (!a.n) return fail(c, where, "parameter '%s': no enum value can be written as raw text", key);
            s_ref(out, a_commit(g, &a, -1));
        } else {
            long long lo = get_count(sch, "minLength", 0), hi = get_count(sch, "maxLength", -1);
            if (lo > (1 << 20)) lo = 1 << 20;
            if (hi > (1 << 20)) hi = -1;
            if (hi >= 0 && lo > hi) return fail(c, where, "parameter '%s': minLength > maxLength", key);
            s_push(out, (gr_elem){GE_STR, gr_str_index(g, (int32_t)lo, (int32_t)hi, true)});
        }
    } else {
        s_cstr(g, out, "\" string=\"false\">");
        int vr = value_rule(c, sch, 1, where);
        if (vr < 0) return -1;
        s_ref(out, vr);
    }
    s_tag(c, out, "</", " parameter>");
    return 0;
}

/* One tool's <｜DSML｜ invoke ...>...</｜DSML｜ invoke>: its parameters in schema order,
 * every required one present; no parameters -> an empty line (as the encoder writes it). */
static int invoke_alt(cc *c, const json_t *tool, seq *out, const char *where) {
    dsf_grammar *g = c->g;
    const json_t *nm = json_object_get(tool, "name"), *params = json_object_get(tool, "parameters");
    if (!pyjson_is_str(nm)) return fail(c, where, "%s must be a string", "name");
    const char *name = json_string_value(nm);
    if (!json_string_length(nm) || !raw_ok(name, json_string_length(nm), true))
        return fail(c, where, "tool name \"%.100s\" cannot be written in DSML (empty, or a '\"' or marker in it)", name);
    if (!params || json_is_null(params) || json_is_true(params)) params = NULL;
    else if (!json_is_object(params)) return fail(c, where, "%s must be a JSON schema object", "parameters");
    c->root = params;
    seq *item = NULL;
    bool *rq = NULL;
    int n = 0, m = props_items(c, json_object_get(params, "properties"), json_object_get(params, "required"), true, &item, &rq,
                               &n, 0, where), rc = m < 0 ? -1 : 0;
    if (rc == 0) {
        seq nl = {0};
        s_byte(g, &nl, '\n');
        int fam = ordered_family(c, m, item, rq, "\n", false, rule_of(g, &nl));
        s_tag(c, out, "<", " invoke name=\"");
        s_cstr(g, out, name);
        s_cstr(g, out, "\">\n");
        s_ref(out, fam);
        s_tag(c, out, "</", " invoke>");
    }
    for (int i = 0; i < n; i++) free(item[i].e);
    free(item);
    free(rq);
    return rc;
}

/* "\n\n<｜DSML｜ calls>\n" INVOKE ("\n" INVOKE)* "\n</｜DSML｜ calls>" (one INVOKE unless parallel) */
static int calls_block(cc *c, const json_t *tools, bool parallel, seq *out) {
    dsf_grammar *g = c->g;
    if (!json_is_array(tools) || !json_array_size(tools)) return dsf_seterr(c->err, "tools: a non-empty list is required");
    alts a = {0};
    for (size_t i = 0; i < json_array_size(tools); i++) {
        char where[64];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const json_t *t = json_array_get(tools, i);
        if (!json_is_object(t)) {
            a_commit(g, &a, -1);
            return fail(c, where, "must be %s", "{\"name\", \"parameters\"}");
        }
        if (invoke_alt(c, t, a_new(&a), where)) {
            a_commit(g, &a, -1);
            return -1;
        }
    }
    int inv = a_commit(g, &a, -1);
    s_cstr(g, out, "\n\n");
    s_tag(c, out, "<", " calls>\n");
    s_ref(out, inv);
    if (parallel) {
        int more = gr_rule_new(g);
        alts m = {0};
        a_new(&m);
        seq *s = a_new(&m);
        s_byte(g, s, '\n');
        s_ref(s, inv);
        s_ref(s, more);
        s_ref(out, a_commit(g, &m, more));
    }
    s_byte(g, out, '\n');
    s_tag(c, out, "</", " calls>");
    return 0;
}

int gr_compile(dsf_grammar *g, const char *spec, size_t len, char *err) {
    cc c = {.g = g, .err = err, .r_ws = -1, .r_any = -1, .r_num = -1, .r_int = -1};
    for (int i = 0; i < 20; i++) c.r_digits[i] = -1;
    c.keep = json_array();
    char perr[DSF_ERR_LEN] = "";
    c.spec = pyjson_loads(spec, len, perr);
    int rc = -1;
    seq root = {0};
    if (!json_is_object(c.spec)) {
        dsf_seterr(err, "constraint spec: %s", c.spec ? "must be a JSON object" : perr);
        goto done;
    }
    if (json_is_true(json_object_get(c.spec, "thinking"))) {
        s_push(&root, (gr_elem){GE_STR, gr_str_index(g, 0, -1, true)});
        s_sym(&root, GR_SYM_THINK_END);
    }
    const json_t *tools = json_object_get(c.spec, "tools"), *sch = json_object_get(c.spec, "json_schema");
    if (tools) {
        if (calls_block(&c, tools, json_is_true(json_object_get(c.spec, "parallel")), &root)) goto done;
    } else {
        if (!sch) {
            if (!json_is_true(json_object_get(c.spec, "json_object"))) {
                dsf_seterr(err, "constraint spec: one of 'tools', 'json_schema' or 'json_object' is required");
                goto done;
            }
            json_t *obj = json_pack("{s:s}", "type", "object");
            json_array_append_new(c.keep, obj);
            sch = obj;
        }
        c.root = sch;
        int vr = value_rule(&c, sch, 0, "schema");
        if (vr < 0) goto done;
        s_ref(&root, vr);
    }
    s_sym(&root, GR_SYM_EOS);
    if (g->n_el > MAX_ELEMS) {
        dsf_seterr(err, "constraint too large (%d grammar elements)", g->n_el);
        goto done;
    }
    g->root = rule_of(g, &root);
    rc = 0;
done:
    free(root.e);
    free(c.memo_k);
    free(c.memo_r);
    json_decref(c.keep);
    json_decref(c.spec);
    return rc;
}
