/* quantize_recipe.c: the recipes of `dsflash quantize` and the per-tensor type rules
 * (quantize_model.h states them).
 *
 * Owns: the recipe table (llama.cpp's recipe names and ftype numbers; the types per tensor
 * class are ours, chosen for this model: the routed experts carry the recipe's type, the
 * small dense and shared-expert tensors one step above in the _M/_L mixes, the LM head Q6_K
 * below Q6_K), the tensor classes by name, and the block-size fallbacks.
 * Must not: read tensor data, or know any file (quantize_model.c streams).
 * Invariant: the table is what `--help` prints; the tests state their own copy of it. */
#include "convert/quantize_model.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <string.h>
#include <strings.h>

#define T(x) GGML_TYPE_##x
/* experts, dense, shared experts, Engram table, token embedding, LM head */
#define R(n, ft, a, b, c, d, e, f) {n, ft, {T(a), T(b), T(c), T(d), T(e), T(f)}}
static const quantize_recipe recipes[] = {
    R("F32", 0, F32, F32, F32, F32, F32, F32),
    R("F16", 1, F16, F16, F16, F16, F16, F16),
    R("BF16", 32, BF16, BF16, BF16, BF16, BF16, BF16),
    R("Q8_0", 7, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0),
    R("Q6_K", 18, Q6_K, Q6_K, Q6_K, Q6_K, Q6_K, Q6_K),
    R("Q5_K_M", 17, Q5_K, Q6_K, Q6_K, Q5_K, Q5_K, Q6_K),
    R("Q5_K_S", 16, Q5_K, Q5_K, Q5_K, Q5_K, Q5_K, Q6_K),
    R("Q5_1", 9, Q5_1, Q5_1, Q5_1, Q5_1, Q5_1, Q6_K),
    R("Q5_0", 8, Q5_0, Q5_0, Q5_0, Q5_0, Q5_0, Q6_K),
    R("Q4_K_M", 15, Q4_K, Q5_K, Q5_K, Q4_K, Q4_K, Q6_K),
    R("Q4_K_S", 14, Q4_K, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("Q4_1", 3, Q4_1, Q4_1, Q4_1, Q4_1, Q4_1, Q6_K),
    R("Q4_0", 2, Q4_0, Q4_0, Q4_0, Q4_0, Q4_0, Q6_K),
    R("IQ4_XS", 30, IQ4_XS, Q5_K, Q5_K, IQ4_XS, IQ4_XS, Q6_K),
    R("IQ4_NL", 25, IQ4_NL, Q5_K, Q5_K, IQ4_NL, IQ4_NL, Q6_K),
    R("Q3_K_L", 13, Q3_K, Q5_K, Q5_K, Q4_K, Q4_K, Q6_K),
    R("Q3_K_M", 12, Q3_K, Q4_K, Q4_K, Q4_K, Q3_K, Q6_K),
    R("Q3_K_S", 11, Q3_K, Q3_K, Q3_K, Q3_K, Q3_K, Q6_K),
    R("IQ3_M", 27, IQ3_S, Q5_K, Q5_K, Q4_K, Q4_K, Q6_K),
    R("IQ3_S", 26, IQ3_S, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("IQ3_XXS", 23, IQ3_XXS, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("Q2_K", 10, Q2_K, Q4_K, Q4_K, Q3_K, Q3_K, Q6_K),
    R("IQ2_M", 29, IQ2_S, Q5_K, Q5_K, Q4_K, Q4_K, Q6_K),
    /* llama.cpp's IQ2_S recipe puts IQ2_XS on most weights, as its IQ2_XS does; the two differ
     * in upgrades of single tensors that these classes do not make */
    R("IQ2_S", 28, IQ2_XS, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("IQ2_XS", 20, IQ2_XS, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("IQ2_XXS", 19, IQ2_XXS, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("IQ1_M", 31, IQ1_M, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
    R("IQ1_S", 24, IQ1_S, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K),
};
#undef R
#undef T

int quantize_recipe_count(void) { return (int)(sizeof recipes / sizeof recipes[0]); }

const quantize_recipe *quantize_recipe_at(int i) {
    return i >= 0 && i < quantize_recipe_count() ? &recipes[i] : NULL;
}

const quantize_recipe *quantize_recipe_find(const char *name) {
    for (int i = 0; i < quantize_recipe_count(); i++)
        if (!strcasecmp(recipes[i].name, name)) return &recipes[i];
    return NULL;
}

const char *quantize_class_name(int qc) {
    static const char *const n[QC_COUNT + 1] = {"routed experts", "dense", "shared experts", "Engram table",
                                                "token embedding", "LM head", "kept"};
    return qc >= 0 && qc <= QC_COUNT ? n[qc] : "?";
}

int quantize_type_from_name(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (ggml_blck_size((uint32_t)t) && !strcasecmp(ggml_type_name((uint32_t)t), name)) return t;
    return -1;
}

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static bool ends(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

int quantize_tensor_class(const char *name, uint32_t n_dims, uint32_t src_type) {
    bool numeric = src_type == GGML_TYPE_F32 || src_type == GGML_TYPE_F16 || src_type == GGML_TYPE_BF16 ||
                   ggml_blck_size(src_type) > 1;
    /* The seed's rules (llama-quant.cpp, issue 33): what is not a matmul weight, or is too
     * small and precision-critical to quantize, keeps its type. */
    if (!numeric || n_dims < 2 || ends(name, "_norm.weight") || has(name, "ffn_gate_inp") || has(name, "engram_gate") ||
        has(name, "attn_sinks") || has(name, "exp_probs_b") || !strncmp(name, "hc_", 3) || has(name, ".hc_"))
        return QC_KEEP;
    if (has(name, "_exps.")) return QC_EXPERTS;
    if (has(name, "_shexp.")) return QC_SHEXP;
    if (!strcmp(name, "per_layer_token_embd.weight")) return QC_ENGRAM;
    if (!strcmp(name, "token_embd.weight")) return QC_EMBD;
    if (!strcmp(name, "output.weight")) return QC_HEAD;
    return QC_DENSE;
}

uint32_t quantize_fallback_type(uint32_t type, int64_t ne0) {
    uint32_t b = ggml_blck_size(type);
    if (b && ne0 % b == 0) return type;
    uint32_t f;
    switch (type) {
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ2_XXS:
    case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ4_XS:
        f = GGML_TYPE_IQ4_NL;
        break;
    case GGML_TYPE_Q4_K: f = GGML_TYPE_Q5_0; break;
    case GGML_TYPE_Q5_K: f = GGML_TYPE_Q5_1; break;
    case GGML_TYPE_Q6_K: f = GGML_TYPE_Q8_0; break;
    default: f = GGML_TYPE_BF16; break;
    }
    return ne0 % ggml_blck_size(f) == 0 ? f : GGML_TYPE_BF16;
}

double quantize_bpw(uint32_t type) { return 8.0 * ggml_type_size(type) / ggml_blck_size(type); }

uint32_t quantize_recipe_type(const quantize_recipe *r, const char *name, uint32_t n_dims, uint32_t src_type,
                              int64_t ne0) {
    int qc = quantize_tensor_class(name, n_dims, src_type);
    if (qc == QC_KEEP) return src_type;
    uint32_t fb = quantize_fallback_type(r->type[qc], ne0);
    if (qc == QC_EXPERTS && src_type == GGML_TYPE_MXFP4 && quantize_bpw(fb) >= quantize_bpw(GGML_TYPE_MXFP4))
        return GGML_TYPE_MXFP4; /* requantizing MXFP4 into as many bits or more only loses */
    return fb;
}
