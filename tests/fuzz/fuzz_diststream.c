/* fuzz_diststream.c: libFuzzer harness for the stream message between the stages of an MPI
 * job (dist_stream_unpack in src/model/distpipe.c), which every rank of a later stage reads
 * into its scratch and its mirror of the crossing KV rows: a corrupted, truncated or
 * mismatched message must be refused, never overread or written past the scratch.
 *
 * Input: byte 0 = T - 1 (mod 8), byte 1 = the position of the chunk's first token (mod 40),
 * byte 2 = the cut (1 + low bits mod (layers - 1); bit 7 also carries the top-k lists, bit 6
 * the candidate lists, whatever tiny41's roles say), byte 3 = flags (bit 0: truncate to the
 * length in bytes 4..5, bit 1: rank 0 wants logits, bit 2: move 1 + (byte 5 mod 16) entries of the top-k
 * counts from token 1 to token 0, keeping the length), then (u16 offset, u8 value) patches of
 * the message dist_stream_pack wrote for a chunk filled with a pattern (tiny41.gguf, reference
 * numerics: packed KV rows).
 * Checks: the return is 0 or -1 with a one-line error; the message as written is accepted and
 * gives back the stream, the crossing rows, the lists, want and row0 exactly; an accepted
 * patched message never leaves a list count outside the scratch's room. */
#include "fuzz_common.h"
#include "model/dist.h"
#include "model/forward.h"

#define FZ_DS_CTX 64

typedef struct {
    dsf_engine *e;
    dsf_session *src, *dst;
} fz_ds_env;

static fz_ds_env *fz_ds_env_get(void) {
    static fz_ds_env env;
    if (env.e) return &env;
    char err[DSF_ERR_LEN], path[4096];
    const char *shared = getenv("DSF_SHARED");
    snprintf(path, sizeof path, "%s/testdata/tiny41/tiny41.gguf", shared ? shared : "../shared");
    dsf_engine_params p;
    dsf_engine_params_default(&p);
    p.n_threads = 1;
    env.e = dsf_engine_open(path, &p, err);
    if (!env.e) return NULL;
    env.src = dsf_session_new(env.e, FZ_DS_CTX, err);
    env.dst = dsf_session_new(env.e, FZ_DS_CTX, err);
    FZ_REQUIRE(env.src && env.dst, "cannot create sessions: %s", err);
    return &env;
}

/* The chunk of T tokens at position p0 of session s, as a stage sees it. */
static void fz_ds_begin(fwd *f, const fz_ds_env *env, dsf_session *s, int64_t p0, int64_t T, dsf_kvstate **tkv) {
    static const int32_t toks[8] = {3, 5, 7, 9, 11, 13, 15, 17};
    s->kv.n = p0;
    for (int64_t t = 0; t < T; t++) tkv[t] = &s->kv;
    fwd_begin(f, env->e, &s->sc, tkv, toks, T);
}

/* The compressed row j that the token at position p emits at source il, or -1 (distpipe.c). */
static int64_t fz_ds_row(const dsf_shape *sh, int64_t il, int64_t p) {
    const int64_t r = sh->ratio[il];
    return (p + 1) % r == 0 ? (p + 1) / r - 1 : -1;
}

static int fz_diststream_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    const int64_t T = 1 + fz_u8(&in) % 8, p0 = fz_u8(&in) % 40;
    const uint8_t cb = fz_u8(&in), flags = fz_u8(&in);
    const uint16_t trunc = (uint16_t)(fz_u8(&in) | fz_u8(&in) << 8);
    fz_ds_env *env = fz_ds_env_get();
    FZ_REQUIRE(env != NULL, "needs ../shared/testdata/tiny41/tiny41.gguf (or DSF_SHARED)");
    const dsf_shape *sh = &env->e->shape;
    dist_cut cut;
    dist_cut_of(sh, 1 + (cb & 63) % (sh->n_layer - 1), &cut);
    cut.sel |= (cb >> 7) & 1;
    cut.cand |= (cb >> 6) & 1;
    /* the sending stage's chunk, filled with a pattern */
    dsf_kvstate *ts[8], *td[8];
    fwd fs, fd;
    fz_ds_begin(&fs, env, env->src, p0, T, ts);
    dsf_scratch *a = &env->src->sc, *b = &env->dst->sc;
    const size_t nx = (size_t)(T * sh->hc * sh->n_embd), np = (size_t)(T * sh->hc);
    for (size_t i = 0; i < nx; i++) a->X[i] = (float)(i % 251) * 0.25f + (float)p0;
    for (size_t i = 0; i < np; i++) a->pre[i] = -(float)i;
    for (int64_t t = 0; t < T; t++) {
        a->n_sel[t] = (t * 7 + p0) % (a->ksel + 1);
        a->n_cand[t] = (t * 5 + p0) % (a->kcand + 1);
        for (int64_t k = 0; k < a->ksel; k++) a->sel[t * a->ksel + k] = (int32_t)(k * 3 + t);
        for (int64_t k = 0; k < a->kcand; k++) a->cand[t * a->kcand + k] = (int32_t)(k + 100 * t);
    }
    for (int k = 0; k < cut.n_src; k++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t j = fz_ds_row(sh, cut.src[k], p0 + t);
            if (j < 0) continue;
            memset(kv_ckv(&env->src->kv, cut.src[k], j), (int)(j * 7 + k + 1), (size_t)env->src->kv.crow);
            memset(kv_ik(&env->src->kv, cut.src[k], j), (int)(j * 11 + k + 2), (size_t)env->src->kv.irow);
        }
    const bool want = (flags >> 1) & 1;
    const int64_t row0 = p0 * 3 + T;
    dsf_buf msg = {0};
    dist_stream_pack(&msg, &fs, &cut, want, row0);
    /* the message as received: truncated and patched */
    size_t len = msg.len;
    bool intact = true;
    if ((flags & 1) && trunc < len) {
        len = trunc;
        intact = false;
    }
    uint8_t *m = dsf_xmalloc(len ? len : 1);
    memcpy(m, msg.data, len);
    if ((flags & 4) && cut.sel && T >= 2) {
        /* moves d entries of the top-k counts from token 1 to token 0: the length still adds up,
         * so only the counts' bounds can refuse it (header, stream, rows, then the counts) */
        size_t at = 24 + (nx + np) * sizeof(float);
        for (int k = 0; k < cut.n_src; k++)
            for (int64_t t = 0; t < T; t++)
                if (fz_ds_row(sh, cut.src[k], p0 + t) >= 0) at += (size_t)(env->src->kv.crow + env->src->kv.irow);
        const int64_t d = 1 + (trunc >> 8) % 16;
        int64_t c[2];
        if (at + sizeof c <= len) {
            memcpy(c, m + at, sizeof c);
            c[0] += d;
            c[1] -= d;
            memcpy(m + at, c, sizeof c);
            intact = false;
        }
    }
    while (in.n >= 3 && len) {
        const uint16_t off = (uint16_t)(fz_u8(&in) | fz_u8(&in) << 8);
        const uint8_t v = fz_u8(&in);
        if (m[off % len] != v) intact = false;
        m[off % len] = v;
    }
    fz_ds_begin(&fd, env, env->dst, p0, T, td);
    bool want2 = !want;
    int64_t row02 = -1;
    char err[DSF_ERR_LEN] = "";
    const int rc = dist_stream_unpack(m, len, &fd, &cut, &want2, &row02, err);
    FZ_REQUIRE(rc == 0 || rc == -1, "dist_stream_unpack returned %d", rc);
    if (rc < 0) {
        fz_check_err(err, "dist_stream_unpack");
        FZ_REQUIRE(!intact, "refused the message as written (%zu bytes, T %lld): %s", len, (long long)T, err);
    } else {
        for (int64_t t = 0; t < T; t++)
            FZ_REQUIRE((!cut.sel || (b->n_sel[t] >= 0 && b->n_sel[t] <= b->ksel)) &&
                           (!cut.cand || (b->n_cand[t] >= 0 && b->n_cand[t] <= b->kcand)),
                       "accepted list counts %lld / %lld outside the room %lld / %lld", (long long)b->n_sel[t],
                       (long long)b->n_cand[t], (long long)b->ksel, (long long)b->kcand);
    }
    if (intact) {
        FZ_REQUIRE(rc == 0 && want2 == want && row02 == row0, "want %d row0 %lld came back as %d %lld", want,
                   (long long)row0, want2, (long long)row02);
        FZ_REQUIRE(!memcmp(a->X, b->X, nx * sizeof(float)) && !memcmp(a->pre, b->pre, np * sizeof(float)),
                   "the stream came back different");
        for (int64_t t = 0; t < T; t++) {
            if (cut.sel)
                FZ_REQUIRE(b->n_sel[t] == a->n_sel[t] &&
                               !memcmp(b->sel + t * b->ksel, a->sel + t * a->ksel, (size_t)a->n_sel[t] * 4),
                           "token %lld's top-k came back different", (long long)t);
            if (cut.cand)
                FZ_REQUIRE(b->n_cand[t] == a->n_cand[t] &&
                               !memcmp(b->cand + t * b->kcand, a->cand + t * a->kcand, (size_t)a->n_cand[t] * 4),
                           "token %lld's candidates came back different", (long long)t);
        }
        for (int k = 0; k < cut.n_src; k++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t j = fz_ds_row(sh, cut.src[k], p0 + t);
                if (j < 0) continue;
                FZ_REQUIRE(!memcmp(kv_ckv(&env->src->kv, cut.src[k], j), kv_ckv(&env->dst->kv, cut.src[k], j),
                                   (size_t)env->src->kv.crow) &&
                               !memcmp(kv_ik(&env->src->kv, cut.src[k], j), kv_ik(&env->dst->kv, cut.src[k], j),
                                       (size_t)env->src->kv.irow),
                           "source %d's row %lld came back different", cut.src[k], (long long)j);
            }
    }
    free(m);
    dsf_buf_free(&msg);
    return rc == 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_diststream_one(data, size);
    return 0;
}
#endif
