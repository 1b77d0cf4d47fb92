/* runner.c: runs every registered test (optionally only those whose name or "tier/file.c"
 * path contains one of argv[1..]: `make test T=unit/`, `T=golden`) and ends with the line
 * "N passed, N failed, N skipped". Each test runs in a forked child so that a crash counts
 * as a failure and the run goes on.
 *
 * Each test gets its own empty temp dir (test_tmpdir: /tmp/dsflash-test-<runner pid>-<test index>,
 * removed first if a reused pid left one, and removed with everything in it when the test ends
 * unless DSF_TEST_KEEP is set): a stale file of an earlier run can neither pass nor fail a test,
 * and runs leave nothing in /tmp.
 *
 * Invariant, checked before anything runs (exit 2 with one line per offender): a test's name
 * starts with its file's base name and "_" (every TEST in tests/unit/tokenizer.c is
 * tokenizer_<something>), and no two tests share a name. */
#include "test.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { const char *name, *file; test_fn fn; } test_entry;
static test_entry *g_tests;
static int g_n, g_cap;

void test_register(const char *name, const char *file, test_fn fn) {
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_tests = realloc(g_tests, (size_t)g_cap * sizeof *g_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n++] = (test_entry){name, file, fn};
}

void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...) {
    int n = snprintf(t->msg, sizeof t->msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof t->msg) vsnprintf(t->msg + n, sizeof t->msg - (size_t)n, fmt, ap);
    va_end(ap);
    t->failed = 1;
}

void test_skip(test_ctx *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->msg, sizeof t->msg, fmt, ap);
    va_end(ap);
    t->skipped = 1;
}

const char *test_shared(const char *rel) {
    static char slots[8][4096];
    static int k;
    const char *root = getenv("DSF_SHARED");
    char *p = slots[k++ & 7];
    snprintf(p, 4096, "%s/%s", root ? root : "../shared", rel);
    struct stat st;
    return stat(p, &st) == 0 ? p : NULL;
}

const char *test_bin(void) {
    const char *b = getenv("DSF_BIN");
    return b ? b : "build/dsflash";
}

static char g_tmpdir[256]; /* set by main before each test's fork */

const char *test_tmpdir(void) {
    if (!g_tmpdir[0]) snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/dsflash-test-%d", (int)getpid());
    mkdir(g_tmpdir, 0700); /* the test may have removed it */
    return g_tmpdir;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path); /* best effort: what cannot be removed stays, and the walk goes on */
    return 0;
}

/* Removes dir and everything below it (no symlink is followed). */
static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int test_run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0;
    char tmp[4096];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, p)) > 0) {
        if (out && cap > 1 && n < cap - 1) {
            size_t c = r < cap - 1 - n ? r : cap - 1 - n;
            memcpy(out + n, tmp, c);
            n += c;
        }
    }
    if (out && cap) out[n] = 0;
    int st = pclose(p);
    if (st == -1) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

/* The test's file as "tier/file.c": __FILE__ without what precedes "tests/". */
static const char *rel_path(const char *file) {
    const char *p = strstr(file, "tests/");
    return p ? p + 6 : file;
}

static int matches(const test_entry *e, int argc, char **argv) {
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(e->name, argv[i]) || strstr(rel_path(e->file), argv[i])) return 1;
    return 0;
}

/* Counts (and names on stderr) the tests whose name does not start with their file's base
 * name + "_", and the names used twice (the entries are sorted by file, then name). */
static int bad_names(void) {
    int bad = 0;
    for (int i = 0; i < g_n; i++) {
        const char *f = strrchr(g_tests[i].file, '/');
        f = f ? f + 1 : g_tests[i].file;
        size_t n = strcspn(f, ".");
        if (strncmp(g_tests[i].name, f, n) != 0 || g_tests[i].name[n] != '_') {
            fprintf(stderr, "%s: test %s must be named %.*s_<something> (the file's base name + \"_\")\n",
                    rel_path(g_tests[i].file), g_tests[i].name, (int)n, f);
            bad++;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(g_tests[i].name, g_tests[j].name)) {
                fprintf(stderr, "%s: test %s is also defined in %s\n", rel_path(g_tests[i].file), g_tests[i].name,
                        rel_path(g_tests[j].file));
                bad++;
            }
    }
    return bad;
}

static int cmp_entry(const void *a, const void *b) {
    const test_entry *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    const char *failed_names[64]; /* repeated before the summary, so that a log's tail names them */
    qsort(g_tests, (size_t)g_n, sizeof *g_tests, cmp_entry);
    int bad = bad_names();
    if (bad) {
        fprintf(stderr, "dsflash-test: %d naming error(s) above; no test was run\n", bad);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < g_n; i++) {
        test_entry *e = &g_tests[i];
        if (!matches(e, argc, argv)) continue;
        test_ctx *shared = mmap(NULL, sizeof(test_ctx), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (shared == MAP_FAILED) abort();
        memset(shared, 0, sizeof *shared);
        double t0 = (double)clock();
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/dsflash-test-%d-%d", (int)getpid(), i);
        rm_tree(g_tmpdir);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            e->fn(shared);
            fflush(NULL);
            _exit(0);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        if (!getenv("DSF_TEST_KEEP")) rm_tree(g_tmpdir);
        clock_gettime(CLOCK_MONOTONIC, &b);
        (void)t0;
        double secs = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        if (WIFSIGNALED(st)) {
            shared->failed = 1;
            snprintf(shared->msg, sizeof shared->msg, "killed by signal %d", WTERMSIG(st));
        } else if (WIFEXITED(st) && WEXITSTATUS(st) != 0 && !shared->failed) {
            shared->failed = 1;
            snprintf(shared->msg, sizeof shared->msg, "exited with status %d", WEXITSTATUS(st));
        }
        if (shared->failed) {
            if (failed < 64) failed_names[failed] = e->name;
            failed++;
            printf("FAIL %-40s %s\n", e->name, shared->msg);
        } else if (shared->skipped) {
            skipped++;
            printf("SKIP %-40s %s\n", e->name, shared->msg);
        } else {
            passed++;
            printf("ok   %-40s (%.2fs)\n", e->name, secs);
        }
        munmap(shared, sizeof *shared);
    }
    if (failed) {
        printf("failed:");
        for (int i = 0; i < failed && i < 64; i++) printf(" %s", failed_names[i]);
        printf("%s\n", failed > 64 ? " ..." : "");
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
