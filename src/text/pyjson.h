/* pyjson.h: JSON with Python's semantics, on jansson values.
 *
 * The V4.1 chat encoder (spec chat-format.md §2.13) is byte-exact with Python's
 * `json.loads` / `json.dumps(x, ensure_ascii=False)` and with Python's `str(x)`.
 * This file owns those three behaviours:
 *   - pyjson_loads: a JSON reader that keeps what Python keeps: key order (jansson 2.14
 *     iterates objects in insertion order; a duplicate key keeps its first position and
 *     takes the last value, as a Python dict does), int vs float, integers of any size,
 *     NaN/Infinity/-Infinity, NUL inside strings.
 *   - pyjson_dumps: `json.dumps(x, ensure_ascii=False)` with separators ", " and ": ".
 *   - pyjson_str: `str(x)` (what str.format prints), including repr of dicts/lists.
 * Numbers jansson cannot hold (integers outside int64, non-finite floats) are stored as
 * "raw numbers": a jansson string whose first byte is 0xFF (never valid UTF-8, so never a
 * real string from pyjson_loads) followed by a kind byte ('i' int, 'f' float) and the text
 * Python prints for it. Use pyjson_is_str() instead of json_is_string() for "is a str". */
#ifndef DSF_PYJSON_H
#define DSF_PYJSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

/* Parses len bytes like Python json.loads (strict: control characters inside strings are
 * rejected; the input must be valid UTF-8; lone surrogates are rejected). Returns a new
 * reference, or NULL with a message in err. */
json_t *pyjson_loads(const char *s, size_t len, char *err);

/* Appends json.dumps(v, ensure_ascii=False) to out. Returns 0, or -1 (err) for a value
 * Python cannot serialize (never for values built by pyjson_loads). */
int pyjson_dumps(dsf_buf *out, const json_t *v, char *err);
/* Appends a string as a JSON string literal exactly like json.dumps(str, ensure_ascii=False). */
void pyjson_dump_string(dsf_buf *out, const char *s, size_t len);
/* Appends Python str(v): a str as is, None, True/False, ints, float repr, repr of containers. */
void pyjson_str(dsf_buf *out, const json_t *v);
/* Python float repr: shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
void pyjson_float_repr(double d, char buf[40]);

/* Python truthiness: None, False, 0, 0.0, "", [], {} are false. */
bool pyjson_truthy(const json_t *v);
/* True for a real Python str (a jansson string that is not a raw number). */
bool pyjson_is_str(const json_t *v);
/* True for a Python int (jansson integer or raw big integer); bools are not ints here. */
bool pyjson_is_int(const json_t *v);
/* A raw number node (kind 'i' or 'f', text as Python prints it). */
json_t *pyjson_raw_number(char kind, const char *text);
/* Python's type name for error messages: str, int, float, bool, NoneType, list, dict. */
const char *pyjson_type_name(const json_t *v);

/* Object lookup that treats a missing key and a JSON null the same (Python dict.get). */
json_t *pyjson_get(const json_t *obj, const char *key);

#endif
