/* helpers.h: small helpers that test files of more than one tier share (a file split by tier
 * keeps one copy of what both halves use). No TEST here; the framework is test.h.
 *
 * Must not: hold expected values of a test (they stay beside their checks). */
#ifndef DSF_TEST_HELPERS_H
#define DSF_TEST_HELPERS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsflash.h"

/* A whole JSON file read with Python semantics (pyjson: key order, ints vs floats), as the
 * fixtures of ../shared/fixtures are written; NULL if it cannot be read or parsed. */
json_t *test_load_json(const char *path);

/* Every encoder case of the four case files of ../shared/fixtures/chat ({"name", "messages",
 * "args", "expected": {"prompt"} | "expected_error"}) in one new array; NULL when a file is
 * absent or unreadable, its path relative to ../shared in missing. */
json_t *test_chat_cases(char *missing, size_t cap);

/* A whole (test-sized) file in a malloc'ed buffer, its length in *size; NULL on failure. */
unsigned char *test_slurp(const char *path, long *size);

/* Writes the first n bytes of the file src to dst (e.g. a GGUF's header without its data).
 * 0, or -1 if src is shorter or a file operation fails. */
int test_copy_head(const char *src, uint64_t n, const char *dst);

/* "<test_tmpdir()>/<name>" in one of 4 rotating static buffers. */
const char *test_tmpfile(const char *name);

/* The synth "tiny" preset with the given seed, written to <test_tmpdir()>/<file> on the first
 * call for this path buffer (path[0] == 0); later calls return path as it is. NULL (the reason
 * on stderr, path left empty) if synth fails. cap: size of path. */
const char *test_synth_tiny(char *path, size_t cap, const char *file, uint64_t seed);

/* The model at path opened in numerics num with 2 threads, or NULL with err. */
dsf_engine *test_open_numerics(const char *path, dsf_numerics num, char *err);

/* A model opened for generation: engine (2 threads), its tokenizer, one session of max_ctx
 * tokens and a generator on it. test_gen_open: 0, or -1 (what was opened is closed by
 * test_gen_close, which accepts a partly opened fixture). */
typedef struct {
    dsf_engine *e;
    dsf_tokenizer *tok;
    dsf_session *s;
    dsf_gen *g;
} test_gen_fx;
int test_gen_open(test_gen_fx *f, const char *path, int max_ctx);
void test_gen_close(test_gen_fx *f);

/* Compares every KV and tensor of a against b, and the counts (so the sets are equal): key
 * types and values (but only the type of the key named skip, which may be NULL), tensor types
 * and shapes; with TG_ORDER also the order of both, with TG_DATA also every tensor's bytes.
 * Returns 0, or -1 with the first difference in msg. */
struct gguf_file;
enum { TG_ORDER = 1, TG_DATA = 2 };
int test_gguf_same(const struct gguf_file *a, const struct gguf_file *b, int flags, const char *skip, char *msg,
                   size_t cap);
/* p[0..n) in standard base64 with padding (RFC 4648 §4), NUL-terminated, malloc'ed; written
 * here, apart from the server's decoder that the image tests check against it. */
char *test_base64(const uint8_t *p, size_t n);

/* ids as "1 2 3" (truncated to cap). */
void test_fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n);
/* Whether arr is a JSON array of exactly the n integers ids. */
bool test_ids_equal_json(const int32_t *ids, size_t n, json_t *arr);

#endif
