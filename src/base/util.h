/* util.h: the lowest layer's small services: error strings, checked allocation, overflow-checked
 * arithmetic, growable buffers, whole-file reading, the monotonic clock, logging and the DSF_*
 * knobs. Must not: include any other dsflash header (only the C library).
 *
 * Error convention for every module: a function that can fail on bad input
 * returns 0 on success and -1 on failure, and writes one line naming the problem
 * into a caller-provided `char *err` of DSF_ERR_LEN bytes (err may be NULL).
 * Library code never calls exit(). An impossible state aborts through DSF_ASSERT,
 * with file and line, in release builds too. */
#ifndef DSF_UTIL_H
#define DSF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdarg.h>

#define DSF_ERR_LEN 512

#if defined(__GNUC__)
#define DSF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DSF_PRINTF(a, b)
#endif

/* Writes a formatted message into err (DSF_ERR_LEN bytes) if err != NULL; returns -1. */
int dsf_seterr(char *err, const char *fmt, ...) DSF_PRINTF(2, 3);
/* Prefixes an existing message in err with "prefix: ". Returns -1. */
int dsf_prefixerr(char *err, const char *fmt, ...) DSF_PRINTF(2, 3);
/* Keeps a message that quotes input (a tensor, token or file name) on one line: control bytes
 * in err become '?'. err may be NULL. */
void dsf_err_oneline(char *err);

_Noreturn void dsf_panic(const char *file, int line, const char *what);
#define DSF_ASSERT(c) do { if (!(c)) dsf_panic(__FILE__, __LINE__, #c); } while (0)

/* Allocation that aborts on exhaustion of small, computed sizes. For sizes that come
 * from input, use the checked helpers and report an error instead. */
void *dsf_xmalloc(size_t n);
void *dsf_xcalloc(size_t n, size_t sz);
void *dsf_xrealloc(void *p, size_t n);
char *dsf_xstrdup(const char *s);
/* 64-byte aligned allocation (free with free()); NULL on failure. */
void *dsf_aligned_alloc(size_t n);

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool dsf_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool dsf_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Growable byte buffer. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
} dsf_buf;
void dsf_buf_reserve(dsf_buf *b, size_t extra);
void dsf_buf_append(dsf_buf *b, const void *p, size_t n);
void dsf_buf_appendf(dsf_buf *b, const char *fmt, ...) DSF_PRINTF(2, 3);
void dsf_buf_free(dsf_buf *b);

/* Reads a whole (small) file. Returns 0 and a malloc'ed buffer (NUL-terminated, len excludes it). */
int dsf_read_file(const char *path, uint8_t **out, size_t *len, char *err);

double dsf_now(void); /* monotonic seconds */

/* Logging to stderr, filtered by DSF_LOG (0 quiet, 1 info [default], 2 debug). */
void dsf_log(int level, const char *fmt, ...) DSF_PRINTF(2, 3);
int dsf_log_level(void);

/* The DSF_* environment knobs, read once. */
const char *dsf_knob(const char *name); /* getenv wrapper; NULL if unset */
/* The machine's memory in bytes (0 if unknown); DSF_RAM_BYTES=N stands in for it, so that the
 * tests can exercise the rules that depend on it (residency, the prefill chunk, session memory). */
double dsf_ram_bytes(void);

#endif
