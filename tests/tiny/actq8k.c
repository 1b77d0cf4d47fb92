/* actq8k.c: the opt-in Q8_K activation mode (dsf_engine_params.act_q8k, `--act-q8k`) through
 * the whole engine, on the 256-wide synthetic topology quantized to K types (as quantize.c
 * builds it: attention inputs, experts and head hold whole 256-blocks).
 *
 * Guards against: a mode that is not engaged (the logits must differ from the exact mode's), one
 * that breaks the model (mean KL against the exact mode within the stated bound, both numerics
 * modes: reference mode's bound is loose, see below), prefill and decode that take different kernels or quantize differently (decode token
 * by token must equal the one-chunk prefill bit for bit: the MoE prefill's BF16 copies must not
 * be taken for a product of the mode), and a mode that touches products it must not (tiny41,
 * whose rows are 64/128 wide, never Q8_K: bit for bit the same logits with the flag on). */
#include "convert/quantize_model.h"
#include "dsflash.h"
#include "kernels/quant.h"
#include "test.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tmodel.h"

#define NT 8
static const int32_t q8_tok[NT] = {1, 17, 33, 200, 5, 90, 91, 12};

/* The NT rows of logits of model: in one chunk (chunk = 0) or token by token; NULL on failure. */
static float *q8_logits(const char *model, bool q8k, dsf_numerics num, int chunk1, int *V, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    ep.numerics = num;
    ep.act_q8k = q8k;
    dsf_engine *e = dsf_engine_open(model, &ep, err);
    if (!e) return NULL;
    dsf_session *s = dsf_session_new(e, 64, err);
    *V = dsf_engine_n_vocab(e);
    float *lg = s ? malloc((size_t)NT * (size_t)*V * sizeof(float)) : NULL;
    for (int i = 0; lg && i < (chunk1 ? NT : 1); i++) {
        const int n = chunk1 ? 1 : NT;
        if (dsf_session_eval(s, q8_tok + i * n, n, lg + (size_t)i * (size_t)*V, !chunk1, err) < 0) {
            free(lg);
            lg = NULL;
        }
    }
    dsf_session_free(s);
    dsf_engine_close(e);
    return lg;
}

/* mean over the rows of KL(softmax(a) || softmax(b)) */
static double q8_kl(const float *a, const float *b, int V) {
    double kl = 0;
    for (int r = 0; r < NT; r++) {
        const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
        double mx = x[0], my = y[0], sx = 0, sy = 0;
        for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx, my = y[i] > my ? y[i] : my;
        for (int i = 0; i < V; i++) sx += exp(x[i] - mx), sy += exp(y[i] - my);
        for (int i = 0; i < V; i++) {
            double lx = x[i] - mx - log(sx), ly = y[i] - my - log(sy);
            kl += exp(lx) * (lx - ly);
        }
    }
    return kl / NT;
}

static void q8_check_recipe(test_ctx *t, const char *recipe, const double *max_kl) {
    tm_params p;
    tm_params_default(&p);
    p.n_embd = 256;
    p.n_ff = 256;
    p.expert_type = GGML_TYPE_F32;
    char err[DSF_ERR_LEN];
    const char *in = tm_path("q8in"), *out = tm_path("q8out");
    CHECKF(tm_write(&p, in, NULL, NULL, err) == 0, "%s", err);
    quantize_opts o = {.recipe = recipe, .threads = 2};
    CHECKF(quantize_model(in, out, &o, err) == 0, "%s: %s", recipe, err);
    int Vr = 0, Vp = 0;
    float *er = q8_logits(out, false, DSF_NUMERICS_REFERENCE, 0, &Vr, err);
    float *ep = er ? q8_logits(out, false, DSF_NUMERICS_PLAIN, 0, &Vp, err) : NULL;
    CHECKF(er && ep && Vr == Vp, "%s: %s", recipe, err);
    const double kl_fp8 = q8_kl(ep, er, Vr);
    free(er);
    free(ep);
    for (int m = 0; m < 2; m++) {
        const dsf_numerics num = m ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
        int V = 0, V1 = 0, V2 = 0;
        float *ex = q8_logits(out, false, num, 0, &V, err);
        float *pf = ex ? q8_logits(out, true, num, 0, &V1, err) : NULL;
        float *dc = pf ? q8_logits(out, true, num, 1, &V2, err) : NULL;
        CHECKF(ex && pf && dc && V == V1 && V == V2, "%s: %s", recipe, err);
        size_t n = (size_t)NT * (size_t)V, differ = 0;
        for (size_t i = 0; i < n; i++) {
            CHECKF(isfinite(pf[i]), "%s: non-finite logit %zu", recipe, i);
            differ += pf[i] != ex[i];
        }
        CHECKF(memcmp(pf, dc, n * sizeof(float)) == 0, "%s %s: --act-q8k decode differs from its prefill", recipe,
               m ? "plain" : "reference");
        const double kl = q8_kl(ex, pf, V);
        fprintf(stderr, "actq8k %s %s: mean KL against the exact mode %.3g (FP8 QDQ against plain: %.3g), %zu of %zu logits differ\n", recipe,
                m ? "plain" : "reference", kl, kl_fp8, differ, n);
        /* engaged: the K-quant products see other activations, so (nearly) every logit moves */
        CHECKF(differ > n / 2, "%s: only %zu of %zu logits differ from the exact mode", recipe, differ, n);
        /* Bounds: the measured KL with a margin of about 2 (measured: Q4_K_M 0.0339 reference,
         * 2.75e-4 plain; Q2_K 0.0347, 2.76e-4). Plain mode: Q8_K's activation error (~1/254 of a
         * block's largest value) costs ~100 times less than reference mode's FP8 QDQ does against
         * plain (0.033). Reference mode: as much as that, because this random model amplifies
         * any change that moves a later FP8 rounding (each such flip is a step of 1/16), so
         * the KL saturates near the FP8 one; a decoding error scores near an unrelated model's
         * ~1.0 (tests/e2e/quantize.c). Fast kernels vs the twin (DSF_KERNELS=ref) on this file:
         * the logits agree to 2.7e-7 of their largest (measured with dsflash logits). */
        CHECKF(kl <= max_kl[m], "%s: mean KL %.3g > %.3g", recipe, kl, max_kl[m]);
        free(ex);
        free(pf);
        free(dc);
    }
}

TEST(actq8k_q4_k_m_engine) { q8_check_recipe(t, "Q4_K_M", (const double[2]){0.07, 6e-4}); }
TEST(actq8k_q2_k_engine) { q8_check_recipe(t, "Q2_K", (const double[2]){0.07, 6e-4}); }

/* tiny41 (rows 64 and 128 wide): no product qualifies, so the flag changes nothing */
TEST(actq8k_tiny41_unchanged) {
    tm_params p;
    tm_params_default(&p);
    char err[DSF_ERR_LEN];
    const char *in = tm_path("q8tiny");
    CHECKF(tm_write(&p, in, NULL, NULL, err) == 0, "%s", err);
    int V = 0, V1 = 0;
    float *a = q8_logits(in, false, DSF_NUMERICS_REFERENCE, 0, &V, err);
    float *b = a ? q8_logits(in, true, DSF_NUMERICS_REFERENCE, 0, &V1, err) : NULL;
    CHECKF(a && b && V == V1, "%s", err);
    CHECKF(memcmp(a, b, (size_t)NT * (size_t)V * sizeof(float)) == 0, "tiny41 logits change with act_q8k");
    free(a);
    free(b);
}

/* A snapshot records the activation mode: a session saved with Q8_K activations is refused by an
 * engine of the same model without them (its state holds other values), and the other way round;
 * the same mode restores. */
TEST(actq8k_snapshot_mode_checked) {
    tm_params p;
    tm_params_default(&p);
    char err[DSF_ERR_LEN];
    const char *in = tm_path("q8snap");
    CHECKF(tm_write(&p, in, NULL, NULL, err) == 0, "%s", err);
    dsf_engine *e[2];
    for (int m = 0; m < 2; m++) {
        dsf_engine_params ep;
        dsf_engine_params_default(&ep);
        ep.n_threads = 2;
        ep.act_q8k = m == 1;
        e[m] = dsf_engine_open(in, &ep, err);
        CHECKF(e[m], "%s", err);
    }
    for (int m = 0; m < 2; m++) {
        dsf_session *s = dsf_session_new(e[m], 32, err), *o = dsf_session_new(e[1 - m], 32, err),
                    *same = dsf_session_new(e[m], 32, err);
        CHECK(s && o && same && dsf_session_eval(s, q8_tok, 4, NULL, false, err) == 0);
        uint8_t *buf = NULL;
        size_t len = 0;
        CHECK(dsf_session_save(s, &buf, &len, err) == 0);
        CHECKF(dsf_session_restore(o, buf, len, err) < 0 && strstr(err, "Q8_K activations"), "mode %d: '%s'", m, err);
        CHECKF(dsf_session_restore(same, buf, len, err) == 0 && dsf_session_n_past(same) == 4, "%s", err);
        free(buf);
        dsf_session_free(s);
        dsf_session_free(o);
        dsf_session_free(same);
    }
    dsf_engine_close(e[0]);
    dsf_engine_close(e[1]);
}
