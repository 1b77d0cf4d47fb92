/* attn.c: the attention forward's two paths on a synthetic topology (tests/lib/tmodel.h).
 * Guards against: a fallback path (the serial scalar loop for long windows) that disagrees
 * with the threaded fast kernels beyond fp32 summation order. */
#include "dsflash.h"
#include "test.h"
#include "tmodel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* xorshift64* with the seed of tests/unit/kernels_attn.c, whose token ids this test has
 * always used. */
static uint64_t rnd(void) {
    static uint64_t s = 0x243F6A8885A308D3ull;
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
}

/* ---- the forward's fallback path ----------------------------------------------------------
 * attn.c runs the attention core threaded with stack arrays when window + idx_topk fits them
 * (2048 keys) and otherwise serially with the scalar loop. Two models that differ only in the
 * window (3000: fallback, 1000: threaded fast kernels) must agree on a 40-token sequence,
 * shorter than both windows, so both see every earlier position. Plain numerics; the paths
 * differ by fp32 summation order and the vector exp only, so 1e-4 of each row's largest
 * |logit| is far above their difference and far below a wrong key set or a lost sink. */
TEST(attn_forward_fallback_path_agrees) {
    static const uint32_t windows[2] = {3000, 1000};
    enum { N = 40 };
    float *lg[2] = {NULL, NULL};
    int V = 0;
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(3 + (rnd() % 250));
    for (int m = 0; m < 2; m++) {
        tm_params p;
        tm_params_default(&p);
        p.window = windows[m];
        char err[DSF_ERR_LEN];
        const char *path = tm_path("kattn-window");
        CHECKF(tm_write(&p, path, NULL, NULL, err) == 0, "tm_write: %s", err);
        dsf_engine_params ep;
        dsf_engine_params_default(&ep);
        ep.numerics = DSF_NUMERICS_PLAIN;
        ep.n_threads = 2;
        dsf_engine *e = dsf_engine_open(path, &ep, err);
        CHECKF(e, "open window %u: %s", windows[m], err);
        V = dsf_engine_n_vocab(e);
        dsf_session *s = dsf_session_new(e, N, err);
        CHECKF(s, "session: %s", err);
        lg[m] = malloc((size_t)N * (size_t)V * sizeof(float));
        CHECKF(dsf_session_eval(s, tok, N, lg[m], true, err) == 0, "eval window %u: %s", windows[m], err);
        dsf_session_free(s);
        dsf_engine_close(e);
    }
    for (int r = 0; r < N; r++) {
        double mx = 0.0, d = 0.0;
        for (int v = 0; v < V; v++) {
            float a = lg[0][(size_t)r * V + v], b = lg[1][(size_t)r * V + v];
            CHECKF(isfinite(a) && isfinite(b), "row %d: non-finite logit", r);
            mx = fmax(mx, fabs(a));
            d = fmax(d, fabs((double)a - b));
        }
        CHECKF(d <= 1e-4 * mx, "row %d: fallback and threaded paths differ by %.3g (max |logit| %.3g)", r, d, mx);
    }
    free(lg[0]);
    free(lg[1]);
}
