/* npm.c: installing the test-only npm packages (npm.h). */
#include "npm.h"

#include <stdio.h>
#include <sys/stat.h>

#include "test.h"

const char *test_npm_ready(const char *const *need, char *why, size_t cap) {
    struct stat st;
    if (stat("tests/npm/package.json", &st) != 0) return "tests/npm/package.json not found (run from the repo root)";
    if (test_run("command -v node >/dev/null && command -v npm >/dev/null", NULL, 0) != 0)
        return "node/npm not installed";
    int missing = 0;
    for (int i = 0; need && need[i]; i++) {
        char p[512];
        snprintf(p, sizeof p, "tests/npm/node_modules/%s", need[i]);
        if (stat(p, &st) != 0) missing = 1;
    }
    if (!missing) return NULL;
    char out[2048];
    int rc = test_run("cd tests/npm && npm ci --no-audit --no-fund 2>&1", out, sizeof out);
    if (rc != 0) {
        snprintf(why, cap, "npm ci failed (registry unreachable?): %.300s", out);
        return why;
    }
    return NULL;
}
