/* util.c: see util.h. Owns error formatting, checked allocation, buffers, file reading, the
 * clock, logging and the knobs. Must not: include any other dsflash header; exit() (an
 * impossible state aborts through dsf_panic). */
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ==== errors ============================================================================== */

int dsf_seterr(char *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, DSF_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void dsf_err_oneline(char *err) {
    for (char *q = err; q && *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7F) *q = '?';
}

int dsf_prefixerr(char *err, const char *fmt, ...) {
    if (err) {
        char pre[DSF_ERR_LEN / 2], old[DSF_ERR_LEN / 2];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pre, sizeof pre, fmt, ap);
        va_end(ap);
        snprintf(old, sizeof old, "%s", err);
        snprintf(err, DSF_ERR_LEN, "%.250s: %.250s", pre, old);
    }
    return -1;
}

_Noreturn void dsf_panic(const char *file, int line, const char *what) {
    fprintf(stderr, "dsflash: internal error at %s:%d: %s\n", file, line, what);
    abort();
}

/* ==== allocation ========================================================================== */

void *dsf_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) dsf_panic(__FILE__, __LINE__, "out of memory");
    return p;
}

void *dsf_xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) dsf_panic(__FILE__, __LINE__, "out of memory");
    return p;
}

void *dsf_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) dsf_panic(__FILE__, __LINE__, "out of memory");
    return q;
}

char *dsf_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = dsf_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

void *dsf_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}

/* ==== buffers and files =================================================================== */

void dsf_buf_reserve(dsf_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = dsf_xrealloc(b->data, cap);
    b->cap = cap;
}

void dsf_buf_append(dsf_buf *b, const void *p, size_t n) {
    dsf_buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void dsf_buf_appendf(dsf_buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) {
        dsf_buf_reserve(b, (size_t)n);
        vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void dsf_buf_free(dsf_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int dsf_read_file(const char *path, uint8_t **out, size_t *len, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return dsf_seterr(err, "%s: %s", path, strerror(errno));
    dsf_buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) dsf_buf_append(&b, tmp, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        dsf_buf_free(&b);
        return dsf_seterr(err, "%s: read error", path);
    }
    if (!b.data) dsf_buf_append(&b, "", 0);
    *out = b.data;
    *len = b.len;
    return 0;
}

/* ==== clock, log and knobs ================================================================ */

double dsf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dsf_log_level(void) {
    static int level = -1;
    if (level < 0) {
        const char *s = getenv("DSF_LOG");
        level = s ? atoi(s) : 1;
    }
    return level;
}

void dsf_log(int level, const char *fmt, ...) {
    if (level > dsf_log_level()) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

const char *dsf_knob(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

double dsf_ram_bytes(void) {
    const char *k = dsf_knob("DSF_RAM_BYTES");
    if (k && strtod(k, NULL) > 0) return strtod(k, NULL);
    const double r = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    return r > 0 ? r : 0;
}
