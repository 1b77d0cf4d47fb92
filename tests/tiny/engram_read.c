/* engram_read.c: the Engram table read by the engine's reader pool, with and without its
 * hot-row cache, on tiny41 (../shared/testdata/tiny41, its goldens). Guards against:
 *   - a reader pool or cache that changes a single bit of the logits (a row read into the
 *     wrong slot, a stale cache entry, rows of module 1 used by module 0), in prefill, chunked
 *     prefill, decode and batched decode, in both numerics modes and both table types
 *     (BF16 in tiny41.gguf, F32 in tiny41-f32.gguf);
 *   - a table that cannot be read passing silently: the eval must fail with the reason, leave
 *     the session where it was, and the session must go on exactly as if nothing happened.
 * The expected logits: the goldens (within the README's tolerances) and the run without
 * readers or cache (bit for bit). */
#include "dsflash.h"
#include "test.h"
#include "model/model.h"
#include "model/engram_io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "golden.h"
#include "helpers.h"

/* tiny41's FILE with these readers and cache (dsf_engine_params' units); NULL with err, or
 * NULL and an empty err when the file is absent. */
static dsf_engine *open_cfg(const char *file, dsf_numerics num, int readers, int cache_mb, char *err) {
    char rel[256];
    snprintf(rel, sizeof rel, "testdata/tiny41/%s", file);
    const char *path = test_shared(rel);
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = num;
    ep.n_threads = 2;
    ep.engram_readers = readers;
    ep.engram_cache_mb = cache_mb;
    err[0] = 0;
    return path ? dsf_engine_open(path, &ep, err) : NULL;
}

static void same_logits(test_ctx *t, const char *file, const char *cname) {
    golden g;
    if (golden_load(cname, &g) < 0) SKIP("needs ../shared/" GDIR "%s.*", cname);
    const dsf_numerics num = strncmp(cname, "contract", 8) ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
    /* readers / cache: none / none (the twin), the defaults, 3 / none, none / 1 MiB, 1 / 1 MiB */
    static const int cfg[][2] = {{-1, -1}, {0, 0}, {3, -1}, {-1, 1}, {1, 1}};
    static const int chunks[] = {0, 1, 5};
    const size_t V = (size_t)g.vocab, bytes = (size_t)g.n * V * sizeof(float);
    float *twin[3] = {NULL, NULL, NULL};
    for (int c = 0; c < 5; c++) {
        char err[DSF_ERR_LEN] = "";
        dsf_engine *e = open_cfg(file, num, cfg[c][0], cfg[c][1], err);
        if (!e && !err[0]) {
            golden_free(&g);
            SKIP("needs ../shared/testdata/tiny41/%s", file);
        }
        CHECKF(e, "%s", err);
        CHECK(engram_io_readers(e->eio) == (cfg[c][0] < 0 ? 0 : cfg[c][0] ? cfg[c][0] : ENGRAM_READERS_DEFAULT));
        CHECK((engram_io_cache_bytes(e->eio) > 0) == (cfg[c][1] >= 0));
        for (int k = 0; k < 3; k++) {
            float *lg = golden_run(e, g.tokens, g.n, chunks[k], err);
            CHECKF(lg, "%s", err);
            if (!c) {
                /* the twin is the engine as it was: the goldens' tolerances hold */
                cmp_stats st = golden_compare(lg, g.gold, g.n, g.vocab, 1e-3);
                if (num == DSF_NUMERICS_PLAIN)
                    CHECKF(st.bad_rows == 0 && st.top1_miss == 0, "%s %s chunk %d: max %.3g", file, cname, chunks[k],
                           st.max_abs);
                twin[k] = lg;
            } else {
                CHECKF(!memcmp(lg, twin[k], bytes), "%s %s: readers %d cache %d chunk %d: logits differ from the run "
                       "without readers or cache", file, cname, cfg[c][0], cfg[c][1], chunks[k]);
                free(lg);
            }
        }
        engram_io_stats st;
        engram_io_get_stats(e->eio, &st);
        CHECK(st.rows > 0 && st.unique <= st.rows);
        if (cfg[c][1] >= 0) CHECK(st.cache_hits > 0); /* the table is smaller than the cache */
        dsf_engine_close(e);
    }
    for (int k = 0; k < 3; k++) free(twin[k]);
    golden_free(&g);
}

TEST(engram_read_contract_decode_bf16) { same_logits(t, "tiny41.gguf", "contract-decode"); }
TEST(engram_read_plain_long_bf16) { same_logits(t, "tiny41.gguf", "plain-long"); }
TEST(engram_read_plain_prefill_f32) { same_logits(t, "tiny41-f32.gguf", "plain-prefill"); }

/* A reader over a file that holds no rows (the table's bytes, a header's worth, then EOF):
 * every read of it is short, as on a model file truncated under a running engine. */
static engram_io *broken_io(const dsf_engine *e, int readers, char *err) {
    const char *path = test_tmpfile("engram_read_cut.bin");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return NULL;
    if (write(fd, "GGUF", 4) != 4) {
        close(fd);
        return NULL;
    }
    engram_io *io = engram_io_new(fd, NULL, 4, e->w.ple->row_bytes, e->w.ple->ne[1], readers, 0, err);
    close(fd);
    return io;
}

TEST(engram_read_failure_is_reported) {
    golden g;
    if (golden_load("plain-long", &g) < 0) SKIP("needs ../shared/" GDIR "plain-long.*");
    char err[DSF_ERR_LEN] = "";
    dsf_engine *e = open_cfg("tiny41.gguf", DSF_NUMERICS_PLAIN, 2, 0, err);
    if (!e && !err[0]) {
        golden_free(&g);
        SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
    }
    CHECKF(e, "%s", err);
    const size_t V = (size_t)g.vocab;
    float *want = golden_run(e, g.tokens, 60, 0, err), *lg = malloc(60 * V * sizeof(float));
    CHECKF(want, "%s", err);
    dsf_session *s = dsf_session_new(e, 60, err), *s2 = dsf_session_new(e, 60, err), *s3 = dsf_session_new(e, 60, err);
    CHECK(s && s2 && s3 && dsf_session_eval(s, g.tokens, 30, lg, true, err) == 0);
    CHECK(dsf_session_eval(s2, g.tokens, 28, NULL, false, err) == 0);
    engram_io *good = e->eio;
    for (int readers = 0; readers <= 3; readers += 3) {
        CHECK(dsf_session_eval(s3, g.tokens, 31, NULL, false, err) == 0);
        e->eio = broken_io(e, readers, err);
        CHECKF(e->eio, "%s", err);
        /* prefill (a chunk), decode (one token) and a batch: each fails, naming the cause */
        CHECK(dsf_session_eval(s, g.tokens + 30, 9, lg + 30 * V, true, err) < 0);
        CHECKF(strstr(err, "Engram table") && strstr(err, "short read"), "%s", err);
        CHECK(dsf_session_eval(s, g.tokens + 30, 1, lg + 30 * V, true, err) < 0);
        CHECKF(strstr(err, "short read"), "%s", err);
        dsf_session *both[2] = {s, s2};
        int32_t tk[2] = {g.tokens[30], g.tokens[28]};
        CHECK(dsf_batch_eval(both, tk, 2, NULL, err) < 0 && strstr(err, "short read"));
        /* and the sessions are where they were */
        CHECK(dsf_session_n_past(s) == 30 && dsf_session_n_past(s2) == 28);
        /* at an odd position the way back re-feeds a token (the ratio-2 compressor's pending
         * one, spec §5.3), which needs the table too: the session is emptied, and says so */
        CHECK(dsf_session_eval(s3, g.tokens + 31, 1, NULL, false, err) < 0);
        CHECKF(strstr(err, "emptied") && strstr(err, "short read"), "%s", err);
        CHECK(dsf_session_n_past(s3) == 0);
        engram_io_free(e->eio);
        e->eio = good;
    }
    /* the session goes on as if nothing had happened: bit for bit the uninterrupted run */
    CHECKF(dsf_session_eval(s, g.tokens + 30, 30, lg + 30 * V, true, err) == 0, "%s", err);
    CHECK(!memcmp(lg, want, 60 * V * sizeof(float)));
    CHECK(dsf_session_eval(s2, g.tokens + 28, 1, lg, false, err) == 0);
    CHECK(!memcmp(lg, want + 28 * V, V * sizeof(float)));
    CHECK(dsf_session_eval(s3, g.tokens, 20, lg, false, err) == 0);
    CHECK(!memcmp(lg, want + 19 * V, V * sizeof(float)));
    dsf_session_free(s3);
    dsf_session_free(s);
    dsf_session_free(s2);
    free(want);
    free(lg);
    dsf_engine_close(e);
    golden_free(&g);
}
