/* fuzz_snapshot.c: libFuzzer harness for session snapshots (dsf_session_restore in
 * src/model/snapshot.c), a binary format read back from files or clients, on tiny41.gguf, or
 * on tinyvl.gguf with an image span at positions 2..6 (flags bit 2; the section of types,
 * keys and span rows of version 5; tiny41 when tinyvl is absent).
 *
 * Input: byte 0 = tokens evaluated before the snapshot (0..15, a fixed sequence), byte 1 =
 * flags (bit 0: keep the checksum as patched instead of recomputing it, bit 1: truncate to
 * the length in bytes 2..3, bit 2: the tinyvl session with a span), then (u16 offset, u8
 * value) patches applied to the snapshot.
 * The checksum is recomputed after patching (unless bit 0), so the fuzzer reaches the header
 * and layout checks behind it. Checks: a refused snapshot leaves the target session exactly
 * as it was (n_past and token history) with an error message; an accepted one holds <= the
 * session's context, valid ids, and the next token evaluates; an unpatched snapshot restores
 * to the same logits as the session it was taken from (bit-exact: same arithmetic). */
#include "fuzz_common.h"

#include <math.h>

#define FZ_SNAP_CTX 32

typedef struct {
    dsf_engine *e;
    dsf_session *src, *dst;
    int n_vocab;
    /* per token count: the snapshot and the logits of token 42 after it (computed once) */
    uint8_t *snap[16];
    size_t snap_len[16];
    float *next_logits[16];
    int vl; /* tinyvl with a span */
} fz_snap_env;

static fz_snap_env *fz_snap_env_get(int vl) {
    static fz_snap_env envs[2];
    fz_snap_env *penv = &envs[vl];
    if (penv->e) return penv;
    fz_snap_env env = {0};
    char err[DSF_ERR_LEN], path[4096];
    const char *shared = getenv("DSF_SHARED");
    snprintf(path, sizeof path, "%s/testdata/%s", shared ? shared : "../shared",
             vl ? "tinyvl/tinyvl.gguf" : "tiny41/tiny41.gguf");
    dsf_engine_params p;
    dsf_engine_params_default(&p);
    p.n_threads = 1;
    env.e = dsf_engine_open(path, &p, err);
    if (!env.e) return vl ? fz_snap_env_get(0) : NULL;
    env.src = dsf_session_new(env.e, FZ_SNAP_CTX, err);
    env.dst = dsf_session_new(env.e, FZ_SNAP_CTX, err);
    FZ_REQUIRE(env.src && env.dst, "cannot create sessions: %s", err);
    env.n_vocab = dsf_engine_n_vocab(env.e);
    env.vl = vl;
    *penv = env;
    return penv;
}

/* The first n tokens into env->src: text, or (vl) with positions 2..6 an image span (types
 * START IMAGE NEWLINE IMAGE END, constant rows, keys 1000 + index). */
static int fz_snap_fill(fz_snap_env *env, const int32_t *toks, int n, char *err) {
    if (!env->vl) return dsf_session_eval(env->src, toks, n, NULL, false, err);
    static const int8_t span[5] = {0, 1, 2, 1, 3};
    const int D = dsf_engine_n_embd(env->e);
    int8_t types[16];
    uint64_t keys[16];
    float *rows = malloc((size_t)(5 * D) * sizeof(float));
    for (int i = 0; i < 5 * D; i++) rows[i] = 0.01f * (float)(i / D + 1);
    for (int i = 0; i < n; i++) {
        const bool in = i >= 2 && i < 7;
        types[i] = in ? span[i - 2] : DSF_TOKEN_TEXT;
        keys[i] = in ? 1000u + (uint64_t)i : 0;
    }
    dsf_media m = {types, rows, keys};
    int rc = dsf_session_eval_media(env->src, toks, &m, n, NULL, false, err);
    free(rows);
    return rc;
}

/* The snapshot after tokens 0..n-1 of a fixed sequence, and the logits that follow it. */
static void fz_snap_cached(fz_snap_env *env, int n) {
    if (env->snap[n]) return;
    char err[DSF_ERR_LEN] = "";
    int32_t toks[16];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)(7 + 13 * i) % env->n_vocab;
    FZ_REQUIRE(dsf_session_rollback(env->src, 0, err) == 0, "rollback failed: %s", err);
    if (n) FZ_REQUIRE(fz_snap_fill(env, toks, n, err) == 0, "eval failed: %s", err);
    FZ_REQUIRE(dsf_session_save(env->src, &env->snap[n], &env->snap_len[n], err) == 0, "save failed: %s", err);
    env->next_logits[n] = malloc((size_t)env->n_vocab * sizeof(float));
    int32_t next = 42;
    FZ_REQUIRE(dsf_session_eval(env->src, &next, 1, env->next_logits[n], false, err) == 0, "eval failed: %s", err);
}

static uint64_t fz_snap_fnv(const uint8_t *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int fz_snapshot_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int n_tok = fz_u8(&in) % 16;
    uint8_t flags = fz_u8(&in);
    fz_snap_env *env = fz_snap_env_get((flags >> 2) & 1);
    FZ_REQUIRE(env != NULL, "needs ../shared/testdata/tiny41/tiny41.gguf (or DSF_SHARED)");
    uint16_t trunc = (uint16_t)(fz_u8(&in) | fz_u8(&in) << 8);
    char err[DSF_ERR_LEN] = "";
    fz_snap_cached(env, n_tok);
    size_t len = env->snap_len[n_tok];
    uint8_t *snap = malloc(len);
    memcpy(snap, env->snap[n_tok], len);
    bool patched = false;
    while (in.n >= 3) {
        uint16_t off = (uint16_t)(fz_u8(&in) | fz_u8(&in) << 8);
        uint8_t v = fz_u8(&in);
        if (len && snap[off % len] != v) {
            snap[off % len] = v;
            patched = true;
        }
    }
    if ((flags & 2) && trunc < len) {
        len = trunc;
        patched = true;
    }
    if (!(flags & 1) && len >= 8) {
        uint64_t sum = fz_snap_fnv(snap, len - 8);
        memcpy(snap + len - 8, &sum, 8);
    }

    /* the target holds 3 other tokens, which a refused snapshot must leave alone */
    int32_t other[3] = {5, 6, 7};
    FZ_REQUIRE(dsf_session_rollback(env->dst, 0, err) == 0, "rollback failed: %s", err);
    FZ_REQUIRE(dsf_session_eval(env->dst, other, 3, NULL, false, err) == 0, "eval failed: %s", err);
    int rc = dsf_session_restore(env->dst, snap, len, err);
    free(snap);
    if (rc) {
        fz_check_err(err, "dsf_session_restore");
        FZ_REQUIRE(dsf_session_n_past(env->dst) == 3 && !memcmp(dsf_session_tokens(env->dst), other, sizeof other),
                   "a refused snapshot changed the session");
        FZ_REQUIRE(patched, "an unpatched snapshot was refused: %s", err);
        return 0;
    }
    int n = dsf_session_n_past(env->dst);
    FZ_REQUIRE(n >= 0 && n <= FZ_SNAP_CTX, "restored %d tokens into a %d context", n, FZ_SNAP_CTX);
    const int32_t *h = dsf_session_tokens(env->dst);
    for (int i = 0; i < n; i++) FZ_REQUIRE(h[i] >= 0 && h[i] < env->n_vocab, "restored token id %d", h[i]);
    if (n < FZ_SNAP_CTX) {
        float *a = malloc((size_t)env->n_vocab * sizeof *a);
        int32_t next = 42;
        FZ_REQUIRE(dsf_session_eval(env->dst, &next, 1, a, false, err) == 0, "eval after restore failed: %s", err);
        if (!patched)
            FZ_REQUIRE(!memcmp(a, env->next_logits[n_tok], (size_t)env->n_vocab * sizeof *a),
                       "restored session gives other logits");
        free(a);
    }
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_snapshot_one(data, size);
    return 0;
}
#endif
