/* pyjson.c: Python json.loads / json.dumps(ensure_ascii=False) / str() on jansson values.
 * See pyjson.h for the contract. Must not: depend on the chat format; allocate on error
 * paths without freeing. Invariant: every string node built here is valid UTF-8, except
 * raw numbers, which start with the byte 0xFF. */
#include "text/pyjson.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define RAW_TAG '\xff'
#define MAX_DEPTH 512        /* Python raises RecursionError near 1000 levels */
#define MAX_INT_DIGITS 4300  /* Python's default int max_str_digits */

/* ==== raw numbers and type helpers ================================================= */

json_t *pyjson_raw_number(char kind, const char *text) {
    size_t n = strlen(text);
    char *b = dsf_xmalloc(n + 2);
    b[0] = RAW_TAG;
    b[1] = kind;
    memcpy(b + 2, text, n);
    json_t *v = json_stringn_nocheck(b, n + 2);
    free(b);
    return v;
}

static bool is_raw(const json_t *v) {
    return json_is_string(v) && json_string_length(v) >= 2 && json_string_value(v)[0] == RAW_TAG;
}
static char raw_kind(const json_t *v) { return json_string_value(v)[1]; }
static const char *raw_text(const json_t *v) { return json_string_value(v) + 2; }

bool pyjson_is_str(const json_t *v) { return json_is_string(v) && !is_raw(v); }

bool pyjson_is_int(const json_t *v) {
    return json_is_integer(v) || (is_raw(v) && raw_kind(v) == 'i');
}

bool pyjson_truthy(const json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_NULL: case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_STRING: return json_string_length(v) > 0; /* raw numbers are never zero */
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    }
    return false;
}

const char *pyjson_type_name(const json_t *v) {
    if (!v) return "NoneType";
    switch (json_typeof(v)) {
    case JSON_NULL: return "NoneType";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_STRING: return is_raw(v) ? (raw_kind(v) == 'i' ? "int" : "float") : "str";
    case JSON_ARRAY: return "list";
    case JSON_OBJECT: return "dict";
    }
    return "object";
}

json_t *pyjson_get(const json_t *obj, const char *key) {
    if (!json_is_object(obj)) return NULL;
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* ==== float repr ====================================================================== */

/* Decimal digits (no dot) and exponent of a %.*e rendering: value = 0.DIGITS x 10^decpt. */
static void split_e(const char *s, char *digits, int *ndig, int *decpt) {
    int n = 0;
    if (*s == '-') s++;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[n++] = *s;
    int e = (*s == 'e') ? atoi(s + 1) : 0;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = 0;
    *ndig = n;
    *decpt = e + 1;
}

/* Shortest digit string that round-trips (Python's repr uses David Gay's shortest mode). */
static void shortest_digits(double d, char *digits, int *ndig, int *decpt) {
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d) {
            split_e(tmp, digits, ndig, decpt);
            return;
        }
        /* At a power of two the rounding interval is lopsided: a p-digit neighbour of the
         * nearest p-digit value may round-trip when the nearest does not. */
        char dg[32];
        int nd, dp;
        split_e(tmp, dg, &nd, &dp);
        unsigned long long m = strtoull(dg, NULL, 10);
        for (int k = nd; k < p; k++) m *= 10;
        for (int delta = -1; delta <= 1; delta += 2) {
            unsigned long long mm = m + (unsigned long long)(long long)delta;
            if (mm == 0) continue;
            snprintf(tmp, sizeof tmp, "%s%llue%d", d < 0 ? "-" : "", mm, dp - p);
            if (strtod(tmp, NULL) == d) {
                char buf[32];
                snprintf(buf, sizeof buf, "%llu", mm);
                int len = (int)strlen(buf);
                int ndp = dp - p + len;
                while (len > 1 && buf[len - 1] == '0') len--;
                buf[len] = 0;
                memcpy(digits, buf, (size_t)len + 1);
                *ndig = len;
                *decpt = ndp;
                return;
            }
        }
    }
    snprintf(tmp, sizeof tmp, "%.16e", d);
    split_e(tmp, digits, ndig, decpt);
}

void pyjson_float_repr(double d, char buf[40]) {
    if (isnan(d)) { strcpy(buf, "nan"); return; }
    if (isinf(d)) { strcpy(buf, d < 0 ? "-inf" : "inf"); return; }
    if (d == 0) { strcpy(buf, signbit(d) ? "-0.0" : "0.0"); return; }
    char digits[32];
    int nd, decpt;
    shortest_digits(d, digits, &nd, &decpt);
    char *o = buf;
    if (d < 0) *o++ = '-';
    if (decpt <= -4 || decpt > 16) { /* Python float_repr_style 'short' switches here */
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int e = decpt - 1;
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
}

/* ==== dumps ============================================================================ */

void pyjson_dump_string(dsf_buf *out, const char *s, size_t len) {
    dsf_buf_reserve(out, len + 2);
    dsf_buf_append(out, "\"", 1);
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { /* ensure_ascii=False escapes only C0 controls, lowercase hex */
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            dsf_buf_append(out, s + i - run, run);
            run = 0;
            dsf_buf_append(out, esc, strlen(esc));
        } else {
            run++;
        }
    }
    dsf_buf_append(out, s + len - run, run);
    dsf_buf_append(out, "\"", 1);
}

static int dumps_rec(dsf_buf *out, const json_t *v, int depth, char *err) {
    if (depth > MAX_DEPTH) return dsf_seterr(err, "JSON value nested too deeply");
    char num[40];
    switch (json_typeof(v)) {
    case JSON_NULL: dsf_buf_append(out, "null", 4); return 0;
    case JSON_TRUE: dsf_buf_append(out, "true", 4); return 0;
    case JSON_FALSE: dsf_buf_append(out, "false", 5); return 0;
    case JSON_INTEGER: dsf_buf_appendf(out, "%lld", (long long)json_integer_value(v)); return 0;
    case JSON_REAL: {
        double d = json_real_value(v);
        if (isnan(d)) dsf_buf_append(out, "NaN", 3);
        else if (isinf(d)) dsf_buf_appendf(out, "%s", d < 0 ? "-Infinity" : "Infinity");
        else {
            pyjson_float_repr(d, num);
            dsf_buf_append(out, num, strlen(num));
        }
        return 0;
    }
    case JSON_STRING:
        if (is_raw(v)) dsf_buf_append(out, raw_text(v), json_string_length(v) - 2);
        else pyjson_dump_string(out, json_string_value(v), json_string_length(v));
        return 0;
    case JSON_ARRAY: {
        dsf_buf_append(out, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) dsf_buf_append(out, ", ", 2);
            if (dumps_rec(out, json_array_get(v, i), depth + 1, err)) return -1;
        }
        dsf_buf_append(out, "]", 1);
        return 0;
    }
    case JSON_OBJECT: {
        const char *k;
        size_t klen;
        json_t *x;
        int first = 1;
        dsf_buf_append(out, "{", 1);
        json_object_keylen_foreach((json_t *)v, k, klen, x) {
            if (!first) dsf_buf_append(out, ", ", 2);
            first = 0;
            pyjson_dump_string(out, k, klen);
            dsf_buf_append(out, ": ", 2);
            if (dumps_rec(out, x, depth + 1, err)) return -1;
        }
        dsf_buf_append(out, "}", 1);
        return 0;
    }
    }
    return dsf_seterr(err, "unknown JSON type");
}

int pyjson_dumps(dsf_buf *out, const json_t *v, char *err) {
    if (!v) {
        dsf_buf_append(out, "null", 4);
        return 0;
    }
    return dumps_rec(out, v, 0, err);
}

/* ==== str() / repr() =================================================================== */

static bool py_isprintable(int32_t cp) {
    if (cp == ' ') return true;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static void repr_string(dsf_buf *out, const char *s, size_t len) {
    bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    dsf_buf_append(out, &q, 1);
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            if (c == (unsigned char)q || c == '\\') dsf_buf_appendf(out, "\\%c", c);
            else if (c == '\t') dsf_buf_append(out, "\\t", 2);
            else if (c == '\n') dsf_buf_append(out, "\\n", 2);
            else if (c == '\r') dsf_buf_append(out, "\\r", 2);
            else if (c < 0x20 || c == 0x7f) dsf_buf_appendf(out, "\\x%02x", c);
            else dsf_buf_append(out, s + i, 1);
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0) { /* not reachable for pyjson strings; keep the byte visible */
            dsf_buf_appendf(out, "\\x%02x", c);
            i++;
            continue;
        }
        if (py_isprintable(cp)) dsf_buf_append(out, s + i, (size_t)n);
        else if (cp <= 0xff) dsf_buf_appendf(out, "\\x%02x", (unsigned)cp);
        else if (cp <= 0xffff) dsf_buf_appendf(out, "\\u%04x", (unsigned)cp);
        else dsf_buf_appendf(out, "\\U%08x", (unsigned)cp);
        i += (size_t)n;
    }
    dsf_buf_append(out, &q, 1);
}

static void str_rec(dsf_buf *out, const json_t *v, bool repr, int depth) {
    char num[40];
    if (!v || json_is_null(v)) {
        dsf_buf_append(out, "None", 4);
        return;
    }
    if (depth > MAX_DEPTH) {
        dsf_buf_append(out, "...", 3);
        return;
    }
    switch (json_typeof(v)) {
    case JSON_NULL: break;
    case JSON_TRUE: dsf_buf_append(out, "True", 4); break;
    case JSON_FALSE: dsf_buf_append(out, "False", 5); break;
    case JSON_INTEGER: dsf_buf_appendf(out, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL:
        pyjson_float_repr(json_real_value(v), num);
        dsf_buf_append(out, num, strlen(num));
        break;
    case JSON_STRING:
        if (is_raw(v)) {
            const char *t = raw_text(v);
            if (raw_kind(v) == 'f') t = !strcmp(t, "NaN") ? "nan" : !strcmp(t, "Infinity") ? "inf" : "-inf";
            dsf_buf_append(out, t, strlen(t));
        } else if (repr) {
            repr_string(out, json_string_value(v), json_string_length(v));
        } else {
            dsf_buf_append(out, json_string_value(v), json_string_length(v));
        }
        break;
    case JSON_ARRAY:
        dsf_buf_append(out, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) dsf_buf_append(out, ", ", 2);
            str_rec(out, json_array_get(v, i), true, depth + 1);
        }
        dsf_buf_append(out, "]", 1);
        break;
    case JSON_OBJECT: {
        const char *k;
        size_t klen;
        json_t *x;
        int first = 1;
        dsf_buf_append(out, "{", 1);
        json_object_keylen_foreach((json_t *)v, k, klen, x) {
            if (!first) dsf_buf_append(out, ", ", 2);
            first = 0;
            repr_string(out, k, klen);
            dsf_buf_append(out, ": ", 2);
            str_rec(out, x, true, depth + 1);
        }
        dsf_buf_append(out, "}", 1);
        break;
    }
    }
}

void pyjson_str(dsf_buf *out, const json_t *v) { str_rec(out, v, false, 0); }

/* ==== loads ============================================================================ */

typedef struct {
    const char *s;
    size_t n, i;
    char *err;
} reader;

static json_t *fail(reader *r, const char *what) {
    dsf_seterr(r->err, "invalid JSON: %s at char %zu", what, r->i);
    return NULL;
}

static void skip_ws(reader *r) {
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->i++;
    }
}

static bool lit(reader *r, const char *w) {
    size_t l = strlen(w);
    if (r->n - r->i >= l && !memcmp(r->s + r->i, w, l)) {
        r->i += l;
        return true;
    }
    return false;
}

static int hex4(const char *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    return v;
}

static void put_utf8(dsf_buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    dsf_buf_append(b, u, n);
}

/* Reads a string literal (r->i at the opening quote) into b. */
static int read_string(reader *r, dsf_buf *b) {
    r->i++;
    for (;;) {
        if (r->i >= r->n) return fail(r, "unterminated string") ? 0 : -1;
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            return 0;
        }
        if (c < 0x20) return fail(r, "invalid control character in string") ? 0 : -1;
        if (c == '\\') {
            if (r->i + 1 >= r->n) return fail(r, "unterminated string") ? 0 : -1;
            char e = r->s[r->i + 1];
            char one = 0;
            switch (e) {
            case '"': one = '"'; break;
            case '\\': one = '\\'; break;
            case '/': one = '/'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'n': one = '\n'; break;
            case 'r': one = '\r'; break;
            case 't': one = '\t'; break;
            case 'u': break;
            default: return fail(r, "invalid \\escape") ? 0 : -1;
            }
            if (one) {
                dsf_buf_append(b, &one, 1);
                r->i += 2;
                continue;
            }
            if (r->n - r->i < 6 || hex4(r->s + r->i + 2) < 0) return fail(r, "invalid \\uXXXX escape") ? 0 : -1;
            uint32_t cp = (uint32_t)hex4(r->s + r->i + 2);
            r->i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = (r->n - r->i >= 6 && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') ? hex4(r->s + r->i + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(r, "lone surrogate in \\u escape") ? 0 : -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                r->i += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(r, "lone surrogate in \\u escape") ? 0 : -1;
            }
            put_utf8(b, cp);
            continue;
        }
        if (c < 0x80) {
            size_t j = r->i;
            while (j < r->n && (unsigned char)r->s[j] >= 0x20 && r->s[j] != '"' && r->s[j] != '\\' &&
                   (unsigned char)r->s[j] < 0x80)
                j++;
            dsf_buf_append(b, r->s + r->i, j - r->i);
            r->i = j;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)r->s + r->i, (utf8proc_ssize_t)(r->n - r->i), &cp);
        if (k <= 0) return fail(r, "invalid UTF-8 in string") ? 0 : -1;
        dsf_buf_append(b, r->s + r->i, (size_t)k);
        r->i += (size_t)k;
    }
}

static json_t *read_number(reader *r) {
    size_t st = r->i;
    bool is_float = false;
    if (r->s[r->i] == '-') r->i++;
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return fail(r, "expecting value");
    if (r->s[r->i] == '0') r->i++;
    else while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    if (r->i + 1 < r->n && r->s[r->i] == '.' && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9') {
        is_float = true;
        r->i++;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        size_t j = r->i + 1;
        if (j < r->n && (r->s[j] == '+' || r->s[j] == '-')) j++;
        if (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') {
            is_float = true;
            while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') j++;
            r->i = j;
        }
    }
    size_t len = r->i - st;
    if (!is_float && len > MAX_INT_DIGITS + 1) return fail(r, "integer exceeds 4300 digits");
    char small[64];
    char *text = len < sizeof small ? small : dsf_xmalloc(len + 1);
    memcpy(text, r->s + st, len);
    text[len] = 0;
    json_t *v;
    errno = 0;
    if (is_float) {
        double d = strtod(text, NULL);
        v = isinf(d) ? pyjson_raw_number('f', d < 0 ? "-Infinity" : "Infinity") : json_real(d);
    } else {
        long long x = strtoll(text, NULL, 10);
        v = errno == ERANGE ? pyjson_raw_number('i', text) : json_integer(x);
    }
    if (text != small) free(text);
    return v;
}

static json_t *read_value(reader *r, int depth);

static json_t *read_container(reader *r, int depth, bool obj) {
    json_t *c = obj ? json_object() : json_array();
    dsf_buf key = {0};
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == (obj ? '}' : ']')) {
        r->i++;
        return c;
    }
    for (;;) {
        json_t *v;
        if (obj) {
            skip_ws(r);
            if (r->i >= r->n || r->s[r->i] != '"') {
                fail(r, "expecting property name enclosed in double quotes");
                goto bad;
            }
            key.len = 0;
            dsf_buf_append(&key, "", 0);
            if (read_string(r, &key)) goto bad;
            skip_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') {
                fail(r, "expecting ':' delimiter");
                goto bad;
            }
            r->i++;
            if (!(v = read_value(r, depth + 1))) goto bad;
            /* Python dict semantics: a repeated key keeps its first position, last value */
            json_object_setn_new_nocheck(c, (const char *)key.data, key.len, v);
        } else {
            if (!(v = read_value(r, depth + 1))) goto bad;
            json_array_append_new(c, v);
        }
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == (obj ? '}' : ']')) {
            r->i++;
            break;
        }
        fail(r, "expecting ',' delimiter");
        goto bad;
    }
    dsf_buf_free(&key);
    return c;
bad:
    dsf_buf_free(&key);
    json_decref(c);
    return NULL;
}

static json_t *read_value(reader *r, int depth) {
    if (depth > MAX_DEPTH) return fail(r, "nested too deeply");
    skip_ws(r);
    if (r->i >= r->n) return fail(r, "expecting value");
    char c = r->s[r->i];
    if (c == '{' || c == '[') return read_container(r, depth, c == '{');
    if (c == '"') {
        dsf_buf b = {0};
        dsf_buf_append(&b, "", 0);
        if (read_string(r, &b)) {
            dsf_buf_free(&b);
            return NULL;
        }
        json_t *v = json_stringn_nocheck((const char *)b.data, b.len);
        dsf_buf_free(&b);
        return v;
    }
    if (lit(r, "null")) return json_null();
    if (lit(r, "true")) return json_true();
    if (lit(r, "false")) return json_false();
    if (lit(r, "NaN")) return pyjson_raw_number('f', "NaN");
    if (lit(r, "Infinity")) return pyjson_raw_number('f', "Infinity");
    if (lit(r, "-Infinity")) return pyjson_raw_number('f', "-Infinity");
    return read_number(r);
}

json_t *pyjson_loads(const char *s, size_t len, char *err) {
    reader r = {s, len, 0, err};
    json_t *v = read_value(&r, 0);
    if (!v) return NULL;
    skip_ws(&r);
    if (r.i != r.n) {
        json_decref(v);
        return fail(&r, "extra data");
    }
    return v;
}
