/* quantize.c: the quantizer library (src/convert/quantize_model.h) on a synthetic topology
 * whose rows hold whole 256-blocks, so that the K and IQ grid types are written and run for real
 * (tiny41's rows are 64 and 128 wide: every K type falls back there; tests/e2e/quantize.c).
 *
 * Guards against: K- or IQ-quantized experts, dense tensors and head that the recipe promises but
 * the file does not hold, that the engine cannot load, or that give non-finite or unrelated
 * logits; and a fallback that is not the one --help states. */
#include "convert/imatrix_collect.h"
#include "convert/quantize_model.h"
#include "dsflash.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "test.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tmodel.h"

/* The rows of 4 tokens' logits of model (all rows); NULL on failure. */
static float *logits(const char *model, const int32_t *tok, int n, int *V, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(model, &ep, err);
    if (!e) return NULL;
    dsf_session *s = dsf_session_new(e, 64, err);
    *V = dsf_engine_n_vocab(e);
    float *lg = s ? malloc((size_t)n * (size_t)*V * sizeof(float)) : NULL;
    if (lg && dsf_session_eval(s, tok, n, lg, true, err) < 0) {
        free(lg);
        lg = NULL;
    }
    dsf_session_free(s);
    dsf_engine_close(e);
    return lg;
}

/* An importance matrix of model, collected by the library of `dsflash imatrix` over one chunk of
 * n tokens, written to path. 0, or -1 with a message. */
static int collect_imatrix(const char *model, const int32_t *tok, int n, const char *path, char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(model, &ep, err);
    imatrix_collector *c = e ? imatrix_collector_new(e, err) : NULL;
    dsf_session *s = c ? dsf_session_new(e, 64, err) : NULL;
    int rc = s && dsf_session_eval(s, tok, n, NULL, false, err) >= 0 ? 0 : -1;
    imatrix_meta m = {NULL, 1, (uint32_t)n};
    if (rc == 0) rc = imatrix_collector_write(c, path, &m, err);
    dsf_session_free(s);
    imatrix_collector_free(c);
    dsf_engine_close(e);
    return rc;
}

static void check_k_recipe_im(test_ctx *t, const char *recipe, uint32_t exps, uint32_t dense, uint32_t dense32,
                              uint32_t head, double max_kl, bool imatrix) {
    tm_params p;
    tm_params_default(&p);
    p.n_embd = 256;          /* attention inputs, experts' gate/up, head: 256-wide rows */
    p.n_ff = 256;            /* experts' down: 256-wide rows */
    p.expert_type = GGML_TYPE_F32; /* F32 experts are requantized (MXFP4 ones would be kept) */
    char err[DSF_ERR_LEN];
    const char *in = tm_path("qin"), *out = tm_path("qout");
    CHECKF(tm_write(&p, in, NULL, NULL, err) == 0, "%s", err);
    const char *im = tm_path("qim");
    /* the imatrix's tokens differ from the evaluated ones below */
    const int32_t itok[24] = {1, 3, 7, 250, 41, 42, 43, 9, 2, 160, 19, 88, 4, 5, 6, 70, 8, 21, 34, 55, 89, 144, 233, 37};
    if (imatrix) CHECKF(collect_imatrix(in, itok, 24, im, err) == 0, "%s: imatrix: %s", recipe, err);
    quantize_opts o = {.recipe = recipe, .threads = 2, .imatrix = imatrix ? im : NULL};
    CHECKF(quantize_model(in, out, &o, err) == 0, "%s: %s", recipe, err);
    gguf_file *f = gguf_open(out, err);
    CHECKF(f, "%s", err);
    const struct { const char *name; uint32_t type; } want[] = {
        {"blk.0.ffn_gate_exps.weight", exps}, {"blk.0.ffn_down_exps.weight", exps},
        {"blk.0.attn_q_a.weight", dense},     {"output.weight", head},
        {"blk.0.attn_norm.weight", GGML_TYPE_F32},
        /* attn_q_b's rows are q_lora = 32 wide: the dense type's fallback (--help) */
        {"blk.0.attn_q_b.weight", dense32},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const gguf_tensor *x = gguf_find_tensor(f, want[k].name);
        CHECKF(x && x->type == want[k].type, "%s %s: %s, want %s", recipe, want[k].name, x ? ggml_type_name(x->type) : "absent",
               ggml_type_name(want[k].type));
    }
    gguf_close(f);
    const int32_t tok[8] = {1, 17, 33, 200, 5, 90, 91, 12};
    int V = 0, V2 = 0;
    float *a = logits(in, tok, 8, &V, err), *b = a ? logits(out, tok, 8, &V2, err) : NULL;
    CHECKF(a && b && V == V2, "%s: %s", recipe, err);
    double kl = 0;
    for (int r = 0; r < 8; r++) {
        const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
        double mx = x[0], my = y[0], sx = 0, sy = 0;
        for (int i = 0; i < V; i++) {
            CHECKF(isfinite(y[i]), "%s: non-finite logit", recipe);
            mx = x[i] > mx ? x[i] : mx;
            my = y[i] > my ? y[i] : my;
        }
        for (int i = 0; i < V; i++) sx += exp(x[i] - mx), sy += exp(y[i] - my);
        for (int i = 0; i < V; i++) {
            double lx = x[i] - mx - log(sx), ly = y[i] - my - log(sy);
            kl += exp(lx) * (lx - ly);
        }
    }
    kl /= 8;
    fprintf(stderr, "quantize %s on a 256-wide synthetic model: mean KL against the unquantized file %.5f\n", recipe, kl);
    /* Bounds: the measured value with a margin of about 2 (measured: Q8_0 0.015, Q6_K 0.050,
     * Q4_K_M 0.093, Q2_K 0.148, IQ2_M 0.155, IQ2_XXS with an imatrix 0.173: this random model amplifies any perturbation, so KL grows
     * far slower than the squared weight error); a broken block layout decodes to garbage
     * and scores near an unrelated model's ~1.0 (tests/e2e/quantize.c). */
    CHECKF(kl <= max_kl, "%s: mean KL %.4f > %.3f", recipe, kl, max_kl);
    free(a);
    free(b);
}

static void check_k_recipe(test_ctx *t, const char *recipe, uint32_t exps, uint32_t dense, uint32_t dense32, uint32_t head,
                           double max_kl) {
    check_k_recipe_im(t, recipe, exps, dense, dense32, head, max_kl, false);
}

TEST(quantize_k_types_q4_k_m) {
    check_k_recipe(t, "Q4_K_M", GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q5_1, GGML_TYPE_Q6_K, 0.2);
}

TEST(quantize_k_types_q2_k) {
    check_k_recipe(t, "Q2_K", GGML_TYPE_Q2_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, 0.35);
}

/* IQ2_M: the routed experts in IQ2_S (2.56 bits per weight), written by quantize_iq2.c and run
 * by the engine; the attention in Q5_K (Q5_1 where 32 wide). Measured KL 0.155 (Q2_K's 0.148:
 * the dense tensors carry more bits here), bound about 2x as for the others. */
TEST(quantize_k_types_iq2_m) {
    check_k_recipe(t, "IQ2_M", GGML_TYPE_IQ2_S, GGML_TYPE_Q5_K, GGML_TYPE_Q5_1, GGML_TYPE_Q6_K, 0.35);
}

/* IQ2_XXS needs an importance matrix (ggml_quantize_requires_imatrix): one collected on the
 * model itself by `dsflash imatrix`'s library; the experts really hold IQ2_XXS blocks here. */
TEST(quantize_k_types_iq2_xxs_imatrix) {
    check_k_recipe_im(t, "IQ2_XXS", GGML_TYPE_IQ2_XXS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, 0.35, true);
}

/* The grid types on the experts, bounds as above (measured: IQ3_XXS 0.089, IQ3_M 0.108, IQ1_M
 * 0.197, IQ1_S with an imatrix 0.211). */
TEST(quantize_k_types_iq3_xxs) {
    check_k_recipe(t, "IQ3_XXS", GGML_TYPE_IQ3_XXS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, 0.22);
}

TEST(quantize_k_types_iq3_m) {
    check_k_recipe(t, "IQ3_M", GGML_TYPE_IQ3_S, GGML_TYPE_Q5_K, GGML_TYPE_Q5_1, GGML_TYPE_Q6_K, 0.22);
}

TEST(quantize_k_types_iq1_m) {
    check_k_recipe(t, "IQ1_M", GGML_TYPE_IQ1_M, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, 0.4);
}

TEST(quantize_k_types_iq1_s_imatrix) {
    check_k_recipe_im(t, "IQ1_S", GGML_TYPE_IQ1_S, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, 0.4, true);
}

/* The fallbacks --help states, and the classes of the never-quantized tensors. */
TEST(quantize_rules_as_stated) {
    CHECK(quantize_fallback_type(GGML_TYPE_Q2_K, 128) == GGML_TYPE_IQ4_NL);
    CHECK(quantize_fallback_type(GGML_TYPE_IQ4_XS, 128) == GGML_TYPE_IQ4_NL);
    CHECK(quantize_fallback_type(GGML_TYPE_IQ2_XXS, 64) == GGML_TYPE_IQ4_NL);
    CHECK(quantize_fallback_type(GGML_TYPE_Q4_K, 64) == GGML_TYPE_Q5_0);
    CHECK(quantize_fallback_type(GGML_TYPE_Q5_K, 96) == GGML_TYPE_Q5_1);
    CHECK(quantize_fallback_type(GGML_TYPE_Q6_K, 32) == GGML_TYPE_Q8_0);
    CHECK(quantize_fallback_type(GGML_TYPE_Q8_0, 48) == GGML_TYPE_BF16);
    CHECK(quantize_fallback_type(GGML_TYPE_Q2_K, 16) == GGML_TYPE_BF16);
    CHECK(quantize_fallback_type(GGML_TYPE_Q4_K, 512) == GGML_TYPE_Q4_K);
    const char *keep[] = {"blk.1.ffn_gate_inp.weight", "blk.1.engram_gate.weight", "blk.0.hc_attn_fn.weight",
                          "hc_head_fn.weight", "blk.2.attn_kv_a_norm.weight"};
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++)
        CHECKF(quantize_tensor_class(keep[k], 2, GGML_TYPE_F32) == QC_KEEP, "%s", keep[k]);
    CHECK(quantize_tensor_class("blk.0.attn_sinks.weight", 1, GGML_TYPE_F32) == QC_KEEP);
    CHECK(quantize_tensor_class("blk.3.ffn_up_exps.weight", 3, GGML_TYPE_MXFP4) == QC_EXPERTS);
    CHECK(quantize_tensor_class("blk.3.ffn_up_shexp.weight", 2, GGML_TYPE_BF16) == QC_SHEXP);
    CHECK(quantize_tensor_class("per_layer_token_embd.weight", 2, GGML_TYPE_BF16) == QC_ENGRAM);
    CHECK(quantize_tensor_class("token_embd.weight", 2, GGML_TYPE_BF16) == QC_EMBD);
    CHECK(quantize_tensor_class("output.weight", 2, GGML_TYPE_BF16) == QC_HEAD);
    CHECK(quantize_tensor_class("blk.3.indexer.attn_q_b.weight", 2, GGML_TYPE_BF16) == QC_DENSE);
    CHECK(quantize_recipe_find("q4_k_m") && quantize_recipe_find("Q4_K_M")->ftype == 15);
    CHECK(quantize_recipe_find("iq3_m") && quantize_recipe_find("IQ3_M")->ftype == 27); /* llama.h */
}
