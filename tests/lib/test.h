/* test.h: the one test framework. Each tests/TIER/NAME.c file (tiers: unit, tiny, e2e, fuzz)
 * declares tests with TEST(NAME_something); they register themselves (constructors) with the
 * runner in tests/lib/runner.c, which refuses a name without its file's prefix.
 *
 * A test passes unless a CHECK fails; SKIP() marks it skipped (e.g. when
 * ../shared/testdata is absent). Every tolerance is written beside its check. */
#ifndef DSF_TEST_H
#define DSF_TEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>

typedef struct test_ctx {
    int failed;
    int skipped;
    char msg[1024];
} test_ctx;

typedef void (*test_fn)(test_ctx *t);
void test_register(const char *name, const char *file, test_fn fn);
void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void test_skip(test_ctx *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Path of a file under ../shared (or $DSF_SHARED); NULL if that file does not exist.
 * Returns a static buffer rotated over 8 slots. */
const char *test_shared(const char *rel);
/* Path of the dsflash binary built with the tests ($DSF_BIN, default build/dsflash). */
const char *test_bin(void);
/* A fresh temporary directory for this process (created once). */
const char *test_tmpdir(void);
/* Runs a shell command; returns its exit status (or -1 / 128+signal). Output goes to
 * out (NUL-terminated, truncated to cap) if out != NULL, else discarded. */
int test_run(const char *cmd, char *out, size_t cap);

#define TEST(name)                                                              \
    static void test_##name(test_ctx *t);                                       \
    __attribute__((constructor)) static void test_reg_##name(void) {            \
        test_register(#name, __FILE__, test_##name);                            \
    }                                                                           \
    static void test_##name(test_ctx *t)

#define CHECK(c) do { if (!(c)) { test_fail(t, __FILE__, __LINE__, "%s", #c); return; } } while (0)
#define CHECKF(c, ...) do { if (!(c)) { test_fail(t, __FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define SKIP(...) do { test_skip(t, __VA_ARGS__); return; } while (0)
/* Requires a file under ../shared; skips the test (saying so) if it is absent. */
#define NEED_SHARED(var, rel) \
    const char *var = test_shared(rel); \
    if (!var) SKIP("needs ../shared/%s (absent)", rel)

#endif
