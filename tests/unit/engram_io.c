/* engram_io.c: the Engram table's reader pool (src/model/engram_io.h) over a file it did not
 * write. Guards against rows read from the wrong offset or into the wrong slot (the sort and
 * de-duplication map each hashed row back to its bytes), rows lost or doubled between the
 * readers and the waiting thread, a cache hit that differs from the file, a short read or an
 * I/O error that passes as zeros, and readers that do not stop (engram_io_free joins them;
 * ASan reports leaks). The expected bytes come from the file itself, written here. */
#include "test.h"
#include "model/engram_io.h"
#include "base/util.h"
#include "helpers.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAD 100 /* bytes before the table: the table need not be aligned */

/* A file of HEAD bytes and then n_rows rows of rb random bytes; returns its bytes (malloc'd). */
static uint8_t *write_table(const char *path, uint64_t rb, int64_t n_rows, uint64_t seed) {
    const size_t n = HEAD + (size_t)(rb * (uint64_t)n_rows);
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (uint8_t)(seed >> 56);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        if (f) fclose(f);
        free(b);
        return NULL;
    }
    fclose(f);
    return b;
}

/* Fills module m's rows with n random rows below n_rows (many repeats when n_rows is small). */
static void fill_rows(engram_req *r, int m, int64_t n, int64_t n_rows, uint64_t seed) {
    int64_t *rows = engram_req_rows(r, m);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        rows[i] = (int64_t)((seed >> 33) % (uint64_t)n_rows);
    }
}

/* Every hashed row of module m has the file's bytes. Returns the first bad index, or -1. */
static int64_t first_bad(const engram_req *r, engram_req *rw, int m, int64_t n, const uint8_t *file, uint64_t rb) {
    const int64_t *rows = engram_req_rows(rw, m);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(engram_req_row(r, m, i), file + HEAD + (uint64_t)rows[i] * rb, rb)) return i;
    return -1;
}

TEST(engram_io_same_rows_as_file) {
    const char *path = test_tmpfile("engram_io_table.bin");
    const uint64_t rb = 264; /* an FP8_R264 row: not a multiple of 64 */
    const int64_t n_rows = 5000, n = 700;
    uint8_t *file = write_table(path, rb, n_rows, 7);
    CHECK(file);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    static const int readers[] = {0, 1, 3, 8};
    static const uint64_t caches[] = {0, 40000, 4 << 20}; /* none, evicting, the whole table */
    for (int ir = 0; ir < 4; ir++)
        for (int ic = 0; ic < 3; ic++)
            for (int mem = 0; mem < 2; mem++) {
                char err[DSF_ERR_LEN] = "";
                engram_io *io = engram_io_new(mem ? -1 : fd, mem ? file + HEAD : NULL, HEAD, rb, n_rows, readers[ir],
                                              caches[ic], err);
                CHECKF(io, "%s", err);
                size_t bytes = 0;
                engram_req *r = engram_req_new(io, 2, n, &bytes);
                CHECK(bytes >= (size_t)(2 * n) * rb);
                for (int pass = 0; pass < 3; pass++) { /* later passes hit the cache */
                    /* module 0 over a few rows (duplicates), module 1 over the whole table */
                    fill_rows(r, 0, n, 37, (uint64_t)pass + 1);
                    fill_rows(r, 1, n - 3 * pass, n_rows, (uint64_t)pass + 11);
                    engram_io_start(io, r, 0, n);
                    engram_io_start(io, r, 1, n - 3 * pass);
                    CHECK(engram_req_pending(r) == 2);
                    /* waited in the other order: module 1 must not need module 0's wait */
                    CHECKF(engram_io_wait(io, r, 1, err) == 0, "%s", err);
                    CHECKF(engram_io_wait(io, r, 0, err) == 0, "%s", err);
                    CHECK(engram_req_pending(r) == 0);
                    int64_t b0 = first_bad(r, r, 0, n, file, rb), b1 = first_bad(r, r, 1, n - 3 * pass, file, rb);
                    CHECKF(b0 < 0 && b1 < 0, "readers %d cache %llu mem %d pass %d: rows %lld / %lld differ", readers[ir],
                           (unsigned long long)caches[ic], mem, pass, (long long)b0, (long long)b1);
                }
                engram_io_stats st;
                engram_io_get_stats(io, &st);
                CHECK(st.modules == 6 && st.unique <= st.rows);
                /* each unique row is read or found in the cache exactly once per module */
                CHECKF(mem || st.cache_hits + st.bytes / rb == st.unique, "hits %llu + reads %llu != unique %llu",
                       (unsigned long long)st.cache_hits, (unsigned long long)(st.bytes / rb),
                       (unsigned long long)st.unique);
                if (caches[ic] == (4 << 20)) CHECK(st.cache_hits > 0);
                if (!caches[ic]) CHECK(st.cache_hits == 0);
                CHECK(engram_req_take_error(r, err) == 0);
                engram_req_free(r);
                engram_io_free(io);
            }
    close(fd);
    free(file);
}

TEST(engram_io_short_read_fails) {
    /* the table promises 1000 rows, the file holds 600 and half a row: rows past it must fail
     * loudly, naming the row and its offset, never come back as zeros that look like data */
    const char *path = test_tmpfile("engram_io_short.bin");
    const uint64_t rb = 512;
    uint8_t *file = write_table(path, rb, 1000, 3);
    CHECK(file);
    CHECK(truncate(path, HEAD + 600 * 512 + 256) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    for (int readers = 0; readers <= 4; readers += 4) {
        char err[DSF_ERR_LEN] = "";
        engram_io *io = engram_io_new(fd, NULL, HEAD, rb, 1000, readers, 0, err);
        CHECKF(io, "%s", err);
        engram_req *r = engram_req_new(io, 1, 16, NULL);
        int64_t *rows = engram_req_rows(r, 0);
        for (int i = 0; i < 16; i++) rows[i] = i < 8 ? i * 50 : 590 + i; /* 598..605: 600 is half there */
        engram_io_start(io, r, 0, 16);
        CHECK(engram_io_wait(io, r, 0, err) < 0);
        /* row 600 (half there) or a later one: with readers, whichever fails first is reported */
        CHECKF(strstr(err, "short read") && strstr(err, "row 60") && strstr(err, "truncated"), "%s", err);
        /* the forward's caller learns it once */
        char e2[DSF_ERR_LEN] = "";
        CHECK(engram_req_take_error(r, e2) < 0 && !strcmp(e2, err));
        CHECK(engram_req_take_error(r, e2) == 0);
        /* the rows before the end are still right */
        for (int i = 0; i < 10; i++)
            CHECKF(!memcmp(engram_req_row(r, 0, i), file + HEAD + (uint64_t)rows[i] * rb, rb), "row %lld", (long long)rows[i]);
        /* a later request over good rows succeeds */
        rows[0] = 5;
        engram_io_start(io, r, 0, 1);
        CHECKF(engram_io_wait(io, r, 0, err) == 0, "%s", err);
        engram_req_free(r);
        engram_io_free(io);
    }
    close(fd);
    free(file);
}

TEST(engram_io_read_error_and_range) {
    /* an I/O error (here EISDIR: a directory's description) is reported with its cause */
    char err[DSF_ERR_LEN] = "";
    int dfd = open(test_tmpdir(), O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0);
    engram_io *io = engram_io_new(dfd, NULL, 0, 512, 100, 2, 1 << 20, err);
    CHECKF(io, "%s", err);
    engram_req *r = engram_req_new(io, 1, 4, NULL);
    engram_req_rows(r, 0)[0] = 3;
    engram_io_start(io, r, 0, 1);
    CHECK(engram_io_wait(io, r, 0, err) < 0);
    CHECKF(strstr(err, "read failed") && strstr(err, "row 3"), "%s", err);
    /* a row outside the table (a hash bug, a lying header) is refused, not read */
    engram_req_rows(r, 0)[0] = 100;
    engram_io_start(io, r, 0, 1);
    CHECK(engram_io_wait(io, r, 0, err) < 0);
    CHECKF(strstr(err, "outside the table"), "%s", err);
    engram_req_free(r);
    engram_io_free(io);
    close(dfd);
}

TEST(engram_io_idle_shutdown) {
    /* readers that never got work, and readers stopped right after a request: both join */
    const char *path = test_tmpfile("engram_io_idle.bin");
    uint8_t *file = write_table(path, 512, 64, 5);
    CHECK(file);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    for (int k = 0; k < 20; k++) {
        char err[DSF_ERR_LEN];
        engram_io *io = engram_io_new(fd, NULL, HEAD, 512, 64, 8, (uint64_t)(k % 2) << 20, err);
        CHECKF(io, "%s", err);
        CHECK(engram_io_readers(io) == 8);
        if (k % 4 >= 2) {
            engram_req *r = engram_req_new(io, 1, 64, NULL);
            fill_rows(r, 0, 64, 64, (uint64_t)k);
            engram_io_start(io, r, 0, 64);
            CHECK(engram_io_wait(io, r, 0, err) == 0);
            engram_req_free(r);
        }
        engram_io_free(io);
    }
    close(fd);
    free(file);
}
