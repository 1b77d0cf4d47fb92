/* kvpack.c: the packed KV state of reference numerics (architecture.md §5.1, §5.5; issue 36
 * "Packed KV state").
 * Expected values come from the spec, never from kvcache.c: a window row of 512 values is
 * 512 e4m3 + 16 E8M0 = 528 B, a compressed row 256 B e2m1 + 32 B e4m3 = 288 B, an index key
 * of 128 values 64 B + 4 B E8M0 = 68 B (the same per-group rule for tiny41's widths); the
 * released shape grows by 3 * (288 + 68) / 2 + (288 + 68) = 890 B per token and holds a
 * window of 40 x 128 x 528 B.
 * Guards against: packing silently off (a reference session holding fp32 rows), packed rows
 * that do not decode to the fp32 state's values bit for bit, a plan whose KV figures drift
 * from the spec's, and snapshots of another version, of the other row storage or truncated
 * ones that are not refused with a clear error (the session left as it was). */
#include "dsflash.h"
#include "test.h"
#include "helpers.h"
#include "model/session.h"
#include "model/plan.h"
#include "kernels/quant.h"
#include "convert/synth.h"
#include "io/gguf.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dsf_engine *open_tiny(test_ctx *t, dsf_numerics num) {
    const char *p = test_shared("testdata/tiny41/tiny41.gguf");
    if (!p) return NULL;
    char err[DSF_ERR_LEN];
    dsf_engine *e = test_open_numerics(p, num, err);
    if (!e) test_fail(t, __FILE__, __LINE__, "open tiny41: %s", err);
    return e;
}

static void tokens(int32_t *tk, int n, int V) {
    for (int i = 0; i < n; i++) tk[i] = (int32_t)((i * 7919 + 13) % V);
}

/* Reference sessions hold packed rows of the spec's sizes; plain sessions and DSF_KV_PACK=0
 * hold fp32; and every stored row (window, compressed, index key, every layer) decodes to
 * exactly the fp32 state's values after a prefill in chunks and a decode step. */
TEST(kvpack_reference_rows_are_packed_and_exact) {
    dsf_engine *e = open_tiny(t, DSF_NUMERICS_REFERENCE), *ep = open_tiny(t, DSF_NUMERICS_PLAIN);
    if (!e || !ep) {
        if (!t->failed) SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
        dsf_engine_close(e);
        dsf_engine_close(ep);
        return;
    }
    char err[DSF_ERR_LEN];
    enum { N = 150 };
    int32_t tk[N];
    tokens(tk, N, dsf_engine_n_vocab(e));
    unsetenv("DSF_KV_PACK");
    dsf_session *s = dsf_session_new(e, 256, err), *sp = dsf_session_new(ep, 256, err);
    setenv("DSF_KV_PACK", "0", 1);
    dsf_session *s32 = dsf_session_new(e, 256, err);
    unsetenv("DSF_KV_PACK");
    CHECKF(s && sp && s32, "%s", err);
    const dsf_shape *sh = &s->e->shape;
    const int64_t dh = sh->head_dim, id = sh->idx_dim;
    CHECKF(s->kv.packed && s->kv.wrow == dh + dh / 32 && s->kv.crow == dh / 2 + dh / 16 && s->kv.irow == id / 2 + id / 32,
           "reference session: packed %d, rows %lld/%lld/%lld B (want %lld/%lld/%lld)", s->kv.packed,
           (long long)s->kv.wrow, (long long)s->kv.crow, (long long)s->kv.irow, (long long)(dh + dh / 32),
           (long long)(dh / 2 + dh / 16), (long long)(id / 2 + id / 32));
    CHECK(!sp->kv.packed && sp->kv.wrow == dh * 4 && !s32->kv.packed && s32->kv.irow == id * 4);
    CHECKF(dsf_session_bytes(s) < dsf_session_bytes(s32), "packed session %zu B, fp32 %zu B", dsf_session_bytes(s),
           dsf_session_bytes(s32));
    dsf_session *both[2] = {s, s32};
    for (int k = 0; k < 2; k++) {
        CHECK(dsf_session_eval(both[k], tk, 37, NULL, false, err) == 0);
        CHECK(dsf_session_eval(both[k], tk + 37, N - 38, NULL, false, err) == 0);
        CHECK(dsf_session_eval(both[k], tk + N - 1, 1, NULL, false, err) == 0);
    }
    float *a = malloc((size_t)dh * sizeof(float));
    int bad = 0, rows = 0;
    for (int64_t il = 0; il < sh->n_layer; il++) {
        for (int64_t p = N - (sh->window < N ? sh->window : N); p < N; p++, rows++) {
            const uint8_t *r = kv_win(&s->kv, il, p);
            unpack_fp8_e8m0(a, r, r + dh, dh);
            bad += memcmp(a, kv_win(&s32->kv, il, p), (size_t)dh * sizeof(float)) != 0;
        }
        if (sh->kv_src[il] != il) continue;
        for (int64_t j = 0; j < N / sh->ratio[il]; j++, rows += 2) {
            const uint8_t *c = kv_ckv(&s->kv, il, j), *x = kv_ik(&s->kv, il, j);
            unpack_fp4_e4m3(a, c, c + dh / 2, dh);
            bad += memcmp(a, kv_ckv(&s32->kv, il, j), (size_t)dh * sizeof(float)) != 0;
            unpack_fp4_e8m0(a, x, x + id / 2, id);
            bad += memcmp(a, kv_ik(&s32->kv, il, j), (size_t)id * sizeof(float)) != 0;
        }
    }
    CHECKF(bad == 0 && rows > 40, "%d of %d packed rows differ from the fp32 state", bad, rows);
    free(a);
    dsf_session_free(s);
    dsf_session_free(sp);
    dsf_session_free(s32);
    dsf_engine_close(e);
    dsf_engine_close(ep);
}

/* The plan of the released shape (synth --preset real, header only) against §5.1's figures. */
TEST(kvpack_plan_real_shape_figures) {
    char err[DSF_ERR_LEN] = "", note[DSF_ERR_LEN], path[512];
    snprintf(path, sizeof path, "%s/kvpack-real.gguf", test_tmpdir());
    const synth_write_opts o = {.header_only = true, .type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    CHECKF(synth_write_ex("real", path, 1, &o, note, sizeof note, NULL, err) == 0, "synth: %s", err);
    gguf_file *g = gguf_open_header(path, err);
    CHECKF(g, "%s", err);
    model_plan_t p;
    CHECKF(model_plan(g, 65536, 512, &p, err) == 0, "%s", err);
    const int R = DSF_NUMERICS_REFERENCE, P = DSF_NUMERICS_PLAIN;
    CHECKF(p.kv_packed[R] && !p.kv_packed[P], "packed: reference %d, plain %d", p.kv_packed[R], p.kv_packed[P]);
    CHECKF(p.kv_rows_per_token[R] == 3.0 * (288 + 68) / 2 + (288 + 68), "reference: %.2f B/token (want 890)",
           p.kv_rows_per_token[R]);
    CHECKF(p.kv_window[R] == 40ull * 128 * 528, "reference window %llu B (want 40 x 128 x 528)",
           (unsigned long long)p.kv_window[R]);
    /* fp32 rows: 512 and 128 floats */
    CHECKF(p.kv_rows_per_token[P] == 3.0 * (2048 + 512) / 2 + (2048 + 512), "plain: %.2f B/token",
           p.kv_rows_per_token[P]);
    CHECK(p.kv_window[P] == 40ull * 128 * 2048);
    CHECK(p.kv_per_token[R] == p.kv_rows_per_token[R] + 4 && p.kv_bytes[R] < p.kv_bytes[P]);
    gguf_close(g);
    remove(path);
}

/* Rewrites the header field at off (a u32) and the trailing FNV-1a checksum. */
static void patch_u32(uint8_t *buf, size_t len, size_t off, uint32_t v) {
    memcpy(buf + off, &v, 4);
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len - 8; i++) {
        h ^= buf[i];
        h *= 1099511628211ULL;
    }
    memcpy(buf + len - 8, &h, 8);
}

/* A packed snapshot restores exactly, and the refusals say what is wrong: another version,
 * the other row storage, truncated bytes; a refused restore leaves the session as it was. */
TEST(kvpack_snapshot_versions_and_storage) {
    dsf_engine *e = open_tiny(t, DSF_NUMERICS_REFERENCE);
    if (!e) {
        if (!t->failed) SKIP("needs ../shared/testdata/tiny41/tiny41.gguf");
        return;
    }
    char err[DSF_ERR_LEN];
    enum { N = 90, K = 61 };
    const int V = dsf_engine_n_vocab(e);
    int32_t tk[N];
    tokens(tk, N, V);
    float *ref = malloc((size_t)N * V * sizeof(float)), *lg = malloc((size_t)N * V * sizeof(float));
    dsf_session *s = dsf_session_new(e, N, err);
    CHECK(dsf_session_eval(s, tk, N, ref, true, err) == 0);
    CHECK(dsf_session_rollback(s, K, err) == 0);
    uint8_t *buf;
    size_t len;
    CHECK(dsf_session_save(s, &buf, &len, err) == 0);
    dsf_session_free(s);
    /* the window rows and compressed rows travel packed: far less than fp32 would take */
    setenv("DSF_KV_PACK", "0", 1);
    dsf_session *s32 = dsf_session_new(e, N, err);
    unsetenv("DSF_KV_PACK");
    CHECK(dsf_session_eval(s32, tk, K, NULL, false, err) == 0);
    uint8_t *buf32;
    size_t len32;
    CHECK(dsf_session_save(s32, &buf32, &len32, err) == 0);
    CHECKF(len * 3 < len32, "packed snapshot %zu B, fp32 %zu B", len, len32);

    dsf_session *r = dsf_session_new(e, N, err);
    CHECKF(dsf_session_restore(r, buf, len, err) == 0, "%s", err);
    CHECK(dsf_session_eval(r, tk + K, N - K, lg + (size_t)K * V, true, err) == 0);
    /* the restored state continues with the uninterrupted run's rows (same chunking of the tail
     * is not required: both modes agree exactly, spec §5.2) */
    double d = 0;
    for (size_t i = (size_t)K * V; i < (size_t)N * V; i++) {
        double x = fabs((double)lg[i] - ref[i]);
        if (x > d) d = x;
    }
    CHECKF(d <= 1e-4, "restored packed snapshot: rows differ by %.3g", d);
    CHECK(dsf_session_rollback(r, 10, err) == 0);

    /* the other storage: refused by name */
    CHECK(dsf_session_restore(s32, buf, len, err) < 0 && strstr(err, "packed") && strstr(err, "fp32"));
    CHECK(dsf_session_restore(r, buf32, len32, err) < 0 && strstr(err, "fp32 KV rows"));
    /* another version (the checksum made right, so only the version is wrong) */
    patch_u32(buf, len, 8, 3);
    CHECKF(dsf_session_restore(r, buf, len, err) < 0 && strstr(err, "version 3") && strstr(err, "want 5"), "%s", err);
    patch_u32(buf, len, 8, 5);
    /* truncated anywhere: refused, nothing changed */
    static const size_t cuts[] = {0, 7, 40, 100, 1000};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        size_t n = cuts[c] < len ? cuts[c] : len / 2;
        CHECKF(dsf_session_restore(r, buf, n, err) < 0 && err[0], "truncated at %zu accepted", n);
    }
    CHECK(dsf_session_restore(r, buf, len - 1, err) < 0 && err[0]);
    CHECK(dsf_session_n_past(r) == 10);
    CHECKF(dsf_session_restore(r, buf, len, err) == 0, "%s", err); /* the intact one still restores */
    CHECK(dsf_session_n_past(r) == K);
    free(buf);
    free(buf32);
    free(ref);
    free(lg);
    dsf_session_free(r);
    dsf_session_free(s32);
    dsf_engine_close(e);
}
