/* synth.c: the synth module (`dsflash synth`; the command itself is checked in
 * tests/e2e/synth.c). Expected keys, types and the tensor set come from
 * gguf-layout.md §2-§3 (written out below) and from ../shared/testdata/tiny41/tiny41.gguf, an
 * independent converter's output with the same topology as the tiny preset; never from
 * synth.c itself.
 *
 * Guards against: a missing or mistyped required key (the loader is type-strict, §1.6), a
 * wrong tensor name/shape/dtype or an extra tensor ("no unused tensors"), inconsistent PLE
 * keys (offsets not the running sum, sizes not prime, table too short), a tokenizer that is
 * not GPT-2 byte order or lacks the V4.1 special tokens, constant weights, a file that the
 * engine refuses or that produces non-finite logits. */
#include "test.h"
#include "dsflash.h"
#include "io/gguf.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"
#include "convert/synth.h"
#include "tmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *tiny_path(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s/synth-tiny.gguf", test_tmpdir());
    return p;
}

static gguf_file *open_tiny(test_ctx *t, char *err) {
    if (synth_write("tiny", tiny_path(), 7, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "synth_write: %s", err);
        return NULL;
    }
    gguf_file *f = gguf_open(tiny_path(), err);
    if (!f) test_fail(t, __FILE__, __LINE__, "gguf_open: %s", err);
    return f;
}

/* Required keys of a deepseek41 file and their exact types (gguf-layout §2.1-§2.4, "R", plus
 * the keys that are required because this file has Engram layers and a candidate source). */
static const struct { const char *key; uint32_t type, arr_type; } required[] = {
    {"general.architecture", GGUF_VT_STRING, 0},
    {"deepseek41.block_count", GGUF_VT_UINT32, 0},
    {"deepseek41.context_length", GGUF_VT_UINT32, 0},
    {"deepseek41.embedding_length", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.head_count", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.layer_norm_rms_epsilon", GGUF_VT_FLOAT32, 0},
    {"deepseek41.expert_count", GGUF_VT_UINT32, 0},
    {"deepseek41.expert_used_count", GGUF_VT_UINT32, 0},
    {"deepseek41.expert_gating_func", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.key_length", GGUF_VT_UINT32, 0},
    {"deepseek41.rope.dimension_count", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.q_lora_rank", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.sliding_window", GGUF_VT_UINT32, 0},
    {"deepseek41.expert_feed_forward_length", GGUF_VT_UINT32, 0},
    {"deepseek41.expert_shared_count", GGUF_VT_UINT32, 0},
    {"deepseek41.expert_weights_scale", GGUF_VT_FLOAT32, 0},
    {"deepseek41.expert_weights_norm", GGUF_VT_BOOL, 0},
    {"deepseek41.swiglu_clamp_exp", GGUF_VT_ARRAY, GGUF_VT_FLOAT32},
    {"deepseek41.attention.indexer.head_count", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.indexer.key_length", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.indexer.top_k", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.output_group_count", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.output_lora_rank", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.compress_ratios", GGUF_VT_ARRAY, GGUF_VT_INT32},
    {"deepseek41.attention.compress_rope_freq_base", GGUF_VT_FLOAT32, 0},
    {"deepseek41.hyper_connection.count", GGUF_VT_UINT32, 0},
    {"deepseek41.hyper_connection.sinkhorn_iterations", GGUF_VT_UINT32, 0},
    {"deepseek41.hyper_connection.epsilon", GGUF_VT_FLOAT32, 0},
    {"deepseek41.hash_layer_count", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.kv_source_layers", GGUF_VT_ARRAY, GGUF_VT_UINT32},
    {"deepseek41.attention.indexer.source_layers", GGUF_VT_ARRAY, GGUF_VT_UINT32},
    {"deepseek41.attention.indexer.candidate_source_layer", GGUF_VT_INT32, 0},
    {"deepseek41.attention.indexer.candidate_top_k_blocks", GGUF_VT_UINT32, 0},
    {"deepseek41.attention.indexer.candidate_block_size", GGUF_VT_UINT32, 0},
    {"deepseek41.ple.layers", GGUF_VT_ARRAY, GGUF_VT_UINT32},
    {"deepseek41.ple.ngram_size", GGUF_VT_UINT32, 0},
    {"deepseek41.ple.heads_per_ngram", GGUF_VT_UINT32, 0},
    {"deepseek41.embedding_length_per_layer_input", GGUF_VT_UINT32, 0},
    {"deepseek41.ple.layer_multipliers", GGUF_VT_ARRAY, GGUF_VT_UINT64},
    {"deepseek41.ple.head_offsets", GGUF_VT_ARRAY, GGUF_VT_UINT64},
    {"deepseek41.ple.head_vocab_sizes", GGUF_VT_ARRAY, GGUF_VT_UINT64},
    {"deepseek41.engram.pad_token_id", GGUF_VT_UINT32, 0},
    {"deepseek41.engram.token_map", GGUF_VT_ARRAY, GGUF_VT_INT32},
    {"tokenizer.ggml.model", GGUF_VT_STRING, 0},
    {"tokenizer.ggml.tokens", GGUF_VT_ARRAY, GGUF_VT_STRING},
    {"tokenizer.ggml.token_type", GGUF_VT_ARRAY, GGUF_VT_INT32},
    {"tokenizer.ggml.merges", GGUF_VT_ARRAY, GGUF_VT_STRING},
};

TEST(synth_tiny_required_keys) {
    char err[DSF_ERR_LEN];
    gguf_file *f = open_tiny(t, err);
    if (!f) return;
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        const gguf_kv *kv = gguf_find_kv(f, required[i].key);
        CHECKF(kv, "missing key %s", required[i].key);
        CHECKF(kv->type == required[i].type, "%s: type %s, want %s", required[i].key, gguf_vtype_name(kv->type),
               gguf_vtype_name(required[i].type));
        if (kv->type == GGUF_VT_ARRAY)
            CHECKF(kv->arr_type == required[i].arr_type, "%s: element type %s", required[i].key,
                   gguf_vtype_name(kv->arr_type));
    }
    char *s = NULL;
    CHECK(gguf_get_str(f, "general.architecture", &s, err) == 0 && !strcmp(s, "deepseek41"));
    free(s);
    uint32_t gating = 0;
    CHECK(gguf_get_u32(f, "deepseek41.expert_gating_func", &gating, err) == 0 && gating == 4); /* §2.3: must be 4 */
    gguf_close(f);
}

TEST(synth_tiny_matches_tiny41_layout) {
    /* Same topology as tiny41: same keys with the same types, same tensor names, shapes and
     * dtypes (the independent converter's output). Values differ (random weights). */
    NEED_SHARED(ref_path, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    gguf_file *f = open_tiny(t, err);
    if (!f) return;
    gguf_file *r = gguf_open(ref_path, err);
    CHECKF(r, "%s", err);
    for (uint64_t i = 0; i < r->n_kv; i++) {
        const gguf_kv *a = &r->kv[i];
        const gguf_kv *b = gguf_find_kv(f, a->key);
        CHECKF(b, "key %s of tiny41 missing", a->key);
        CHECKF(a->type == b->type && (a->type != GGUF_VT_ARRAY || a->arr_type == b->arr_type),
               "key %s: type differs from tiny41", a->key);
        if (a->type == GGUF_VT_ARRAY && strcmp(a->key, "tokenizer.ggml.merges"))
            CHECKF(a->arr_n == b->arr_n, "key %s: %llu entries, tiny41 has %llu", a->key, (unsigned long long)b->arr_n,
                   (unsigned long long)a->arr_n);
    }
    CHECKF(f->n_kv == r->n_kv, "%llu keys, tiny41 has %llu", (unsigned long long)f->n_kv, (unsigned long long)r->n_kv);
    CHECKF(f->n_tensors == r->n_tensors, "%llu tensors, tiny41 has %llu", (unsigned long long)f->n_tensors,
           (unsigned long long)r->n_tensors);
    for (uint64_t i = 0; i < r->n_tensors; i++) {
        const gguf_tensor *a = &r->tensors[i];
        const gguf_tensor *b = gguf_find_tensor(f, a->name);
        CHECKF(b, "tensor %s missing", a->name);
        CHECKF(a->type == b->type, "tensor %s: type %s, tiny41 %s", a->name, ggml_type_name(b->type), ggml_type_name(a->type));
        CHECKF(a->n_dims == b->n_dims && !memcmp(a->ne, b->ne, sizeof a->ne), "tensor %s: shape differs", a->name);
    }
    /* tokenizer: specials, the 256 byte tokens in GPT-2 order and the added tokens are the
     * same strings and types as tiny41's (ids 0..258 and 1009..1023) */
    const gguf_kv *ta = gguf_find_kv(r, "tokenizer.ggml.tokens"), *tb = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *ya = gguf_find_kv(r, "tokenizer.ggml.token_type"), *yb = gguf_find_kv(f, "tokenizer.ggml.token_type");
    for (uint64_t i = 0; i < 1024; i++) {
        if (i >= 259 && i < 1009) continue;
        CHECKF(ta->strs[i].len == tb->strs[i].len && !memcmp(ta->strs[i].ptr, tb->strs[i].ptr, ta->strs[i].len),
               "token %llu differs from tiny41", (unsigned long long)i);
        int32_t x, y;
        memcpy(&x, ya->arr_data + 4 * i, 4);
        memcpy(&y, yb->arr_data + 4 * i, 4);
        CHECKF(x == y, "token %llu: type %d, tiny41 %d", (unsigned long long)i, y, x);
    }
    gguf_close(r);
    gguf_close(f);
}

static int is_prime_u64(uint64_t n) {
    if (n < 2) return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

TEST(synth_tiny_ple_consistent) {
    /* §2.4/§2.5: offsets are absolute running sums, sizes prime, offset+size within the table
     * (ne1 >= max) and <= INT32_MAX, multipliers odd, token_map values in [0, n) with a
     * compressed pad id, merges realistic (a few hundred, every side a token) */
    char err[DSF_ERR_LEN];
    gguf_file *f = open_tiny(t, err);
    if (!f) return;
    uint64_t *off = NULL, *sz = NULL, *mul = NULL, n_off, n_sz, n_mul;
    CHECK(gguf_get_arr_u64(f, "deepseek41.ple.head_offsets", &off, &n_off, err) == 0);
    CHECK(gguf_get_arr_u64(f, "deepseek41.ple.head_vocab_sizes", &sz, &n_sz, err) == 0);
    CHECK(gguf_get_arr_u64(f, "deepseek41.ple.layer_multipliers", &mul, &n_mul, err) == 0);
    CHECK(n_off == 12 && n_sz == 12 && n_mul == 8); /* 2 layers x (4-1) x 2 heads; 2 x 4 */
    const gguf_tensor *tab = gguf_find_tensor(f, "per_layer_token_embd.weight");
    CHECK(tab);
    uint64_t run = 0;
    for (uint64_t c = 0; c < n_off; c++) {
        CHECKF(off[c] == run, "offset %llu = %llu, running sum %llu", (unsigned long long)c, (unsigned long long)off[c], (unsigned long long)run);
        CHECKF(is_prime_u64(sz[c]), "size %llu not prime", (unsigned long long)sz[c]);
        run += sz[c];
        CHECK(run <= (uint64_t)tab->ne[1] && run <= 2147483647u);
    }
    for (uint64_t i = 0; i < n_mul; i++) CHECKF(mul[i] & 1, "multiplier %llu even", (unsigned long long)i);
    int32_t *map = NULL;
    uint64_t n_map;
    CHECK(gguf_get_arr_i32(f, "deepseek41.engram.token_map", &map, &n_map, err) == 0);
    CHECK(n_map == 1024);
    for (uint64_t i = 0; i < n_map; i++) CHECK(map[i] >= 0 && (uint64_t)map[i] < n_map);
    const gguf_kv *m = gguf_find_kv(f, "tokenizer.ggml.merges");
    CHECKF(m->arr_n >= 200, "only %llu merges", (unsigned long long)m->arr_n);
    free(off);
    free(sz);
    free(mul);
    free(map);
    gguf_close(f);
}

TEST(synth_tiny_weights_random) {
    /* no tensor is constant (constant pages inflate bandwidth figures) and every value decodes
     * finite; MXFP4 scales sit near 2^0/sqrt(fan_in), not at the subnormal/overflow ends */
    char err[DSF_ERR_LEN];
    gguf_file *f = open_tiny(t, err);
    if (!f) return;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *x = &f->tensors[i];
        int differs = 0;
        for (uint64_t b = 1; b < x->nbytes && !differs; b++) differs = x->data[b] != x->data[0];
        CHECKF(differs, "tensor %s is constant", x->name);
        uint64_t rows = x->nbytes / x->row_bytes;
        float *row = malloc((size_t)x->ne[0] * sizeof *row);
        for (uint64_t r = 0; r < rows; r++) {
            dequant_row(x->type, x->data + r * x->row_bytes, row, x->ne[0]);
            for (int64_t j = 0; j < x->ne[0]; j++)
                if (!isfinite(row[j]) || fabsf(row[j]) > 100.0f) {
                    free(row);
                    CHECKF(0, "tensor %s row %llu: value %g", x->name, (unsigned long long)r, row[j]);
                }
        }
        free(row);
        if (x->type == GGML_TYPE_MXFP4)
            for (uint64_t b = 0; b < x->nbytes; b += 17) CHECK(x->data[b] >= 100 && x->data[b] <= 130);
    }
    gguf_close(f);
}

TEST(synth_tiny_deterministic) {
    /* the same seed gives the same bytes; another seed other weights */
    char err[DSF_ERR_LEN], p2[512], p3[512];
    snprintf(p2, sizeof p2, "%s/synth-a.gguf", test_tmpdir());
    snprintf(p3, sizeof p3, "%s/synth-b.gguf", test_tmpdir());
    CHECKF(synth_write("tiny", p2, 5, err) == 0, "%s", err);
    CHECKF(synth_write("tiny", p3, 5, err) == 0, "%s", err);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", p2, p3);
    CHECK(test_run(cmd, NULL, 0) == 0);
    CHECKF(synth_write("tiny", p3, 6, err) == 0, "%s", err);
    CHECK(test_run(cmd, NULL, 0) != 0);
}

TEST(synth_tiny_engine_runs) {
    /* the engine accepts the file, and a short prefill + decode gives finite logits in both
     * numerics modes (random weights scaled for O(1) activations must not blow up) */
    char err[DSF_ERR_LEN];
    if (synth_write("tiny", tiny_path(), 3, err) < 0) CHECKF(0, "%s", err);
    for (int mode = 0; mode < 2; mode++) {
        dsf_engine_params ep;
        dsf_engine_params_default(&ep);
        ep.numerics = mode ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
        ep.n_threads = 2;
        dsf_engine *e = dsf_engine_open(tiny_path(), &ep, err);
        CHECKF(e, "dsf_engine_open: %s", err);
        CHECK(dsf_engine_n_vocab(e) == 1024);
        dsf_session *s = dsf_session_new(e, 64, err);
        CHECKF(s, "dsf_session_new: %s", err);
        int32_t toks[24];
        for (int i = 0; i < 24; i++) toks[i] = i == 0 ? 0 : 3 + (i * 37) % 1000;
        float *lg = malloc(24 * 1024 * sizeof *lg);
        CHECKF(dsf_session_eval(s, toks, 20, lg, true, err) == 0, "eval: %s", err);
        CHECKF(dsf_session_eval(s, toks + 20, 1, lg + 20 * 1024, false, err) == 0, "eval: %s", err);
        int bad = 0;
        double mx = 0;
        for (int i = 0; i < 21 * 1024; i++) {
            if (!isfinite(lg[i])) bad++;
            else if (fabs(lg[i]) > mx) mx = fabs(lg[i]);
        }
        CHECKF(bad == 0, "mode %d: %d non-finite logits", mode, bad);
        CHECKF(mx > 1e-6, "mode %d: all logits ~0", mode);
        free(lg);
        dsf_session_free(s);
        dsf_engine_close(e);
    }
}

/* ---- quantized types (synth_write_opts, synth_add_tensor) ---- */

static void add_every_block_type(tm_model *m, void *ud) {
    (void)ud;
    for (uint32_t ty = 0; ty < GGML_TYPE_COUNT; ty++) {
        if (ggml_blck_size(ty) <= 1 || !ggml_type_supported(ty)) continue;
        char name[64];
        snprintf(name, sizeof name, "synth_q.%s.weight", ggml_type_name(ty));
        const int64_t ne[2] = {512, 8}; /* 512: whole blocks of 32, 64, 128 and 256 */
        synth_add_tensor(m, name, ty, 2, ne);
    }
}

/* Guards against: quantized blocks with random f16/e8m0/ue4m3 scale bits (NaN, Inf, or values
 * like 6e4 that overflow any matmul), which made a "synth --type Q2_K" model unusable. Every
 * block type the dequantizer knows decodes to finite values below 4, and not all zero. Bound:
 * the scales are at most 1/(64 sqrt(512)) = 6.9e-4 here, and the largest code x sub-scale of
 * any layout (TYPE.json) is 127 x 32 = 4064 (Q6_K, IQ4_XS), so |v| <= 2.8. */
TEST(synth_quant_blocks_finite) {
    tm_params p;
    tm_params_default(&p);
    char err[DSF_ERR_LEN] = "";
    const char *path = tm_path("synth-blocks");
    CHECKF(tm_write(&p, path, add_every_block_type, NULL, err) == 0, "%s", err);
    gguf_file *f = gguf_open(path, err);
    CHECKF(f, "%s", err);
    float row[512];
    int n_types = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *x = &f->tensors[i];
        if (strncmp(x->name, "synth_q.", 8)) continue;
        n_types++;
        float amax = 0;
        bool finite = true;
        for (int64_t r = 0; r < x->ne[1]; r++) {
            dequant_row(x->type, x->data + r * x->row_bytes, row, 512);
            for (int k = 0; k < 512; k++) {
                finite &= isfinite(row[k]) != 0;
                if (fabsf(row[k]) > amax) amax = fabsf(row[k]);
            }
        }
        if (!finite || !(amax > 0 && amax < 4.0f)) {
            char name[64];
            snprintf(name, sizeof name, "%s", x->name);
            gguf_close(f);
            CHECKF(0, "%s: finite %d, max |v| %g", name, finite, (double)amax);
        }
    }
    gguf_close(f);
    CHECKF(n_types >= 26, "%d block types", n_types); /* the 26 of testdata/quants less Q8_K, plus Q8_1 */
}

/* Guards against: a --type whose blocks do not divide a tensor's ne0 written anyway (a file no
 * reader accepts) or refused, instead of the documented fallback (`dsflash quantize`'s: Q4_K ->
 * Q5_0, Q2_K -> Q4_0 when 32 divides ne0, else BF16) with a note; and --expert-type not reaching
 * the experts. The tiny preset's widths are 32..512, so Q4_K (256 per block) fits some and not
 * others. */
TEST(synth_type_fallback) {
    char err[DSF_ERR_LEN] = "", note[DSF_ERR_LEN] = "";
    const char *path = tm_path("synth-fallback");
    const synth_write_opts o = {.type = GGML_TYPE_Q4_K, .expert_type = GGML_TYPE_Q2_K};
    CHECKF(synth_write_ex("tiny", path, 3, &o, note, sizeof note, NULL, err) == 0, "%s", err);
    CHECKF(strstr(note, "fell back"), "note '%s'", note);
    gguf_file *f = gguf_open(path, err);
    CHECKF(f, "%s", err);
    int bad = -1;
    for (uint64_t i = 0; i < f->n_tensors && bad < 0; i++) {
        const gguf_tensor *x = &f->tensors[i];
        bool exps = strstr(x->name, "_exps.") != NULL;
        uint32_t want = exps ? GGML_TYPE_Q2_K : GGML_TYPE_Q4_K;
        if (!exps && (x->n_dims < 2 || strstr(x->name, "hc_") || strstr(x->name, "ffn_gate_inp") ||
                      strstr(x->name, "engram_gate")))
            want = GGML_TYPE_F32;
        else if (x->ne[0] % 256) /* Q4_K and Q2_K: 256 per block (gguf-layout §1.4); the fallbacks that
                                  * `dsflash quantize --help` states: Q4_K -> Q5_0, Q2_K -> IQ4_NL (32 per
                                  * block), else BF16 */
            want = x->ne[0] % 32 ? GGML_TYPE_BF16 : exps ? GGML_TYPE_IQ4_NL : GGML_TYPE_Q5_0;
        if (x->type != want) bad = (int)i;
    }
    char name[GGUF_MAX_NAME];
    snprintf(name, sizeof name, "%s", bad >= 0 ? f->tensors[bad].name : "");
    uint32_t got = bad >= 0 ? f->tensors[bad].type : 0;
    gguf_close(f);
    CHECKF(bad < 0, "%s: type %s", name, ggml_type_name(got));
}
