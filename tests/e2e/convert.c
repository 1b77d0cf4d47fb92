/* convert.c: `dsflash convert`.
 *
 * Guards against: a converted file that differs from the maintainers' GGUFs in any key,
 * value type, value, tensor name, dtype, shape or data byte (convert_tiny41_*); and malformed
 * checkpoints or configs that crash, produce garbage, exit 0, or leave a file (or a .tmp)
 * behind (convert_bad_*). The Engram constants are checked in tests/unit/convert.c and
 * tests/tiny/convert.c. */
#include "io/gguf.h"
#include "kernels/quant.h"
#include "helpers.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ================================================================ helpers */

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void check_convert_matches_from(test_ctx *t, const char *hfrel, const char *ref, const char *tag,
                                      const char *extra) {
    const char *hf = test_shared(hfrel);
    if (!hf) SKIP("needs ../shared/%s (absent)", hfrel);
    char out[512], cmd[2048], log[4096];
    snprintf(out, sizeof out, "%s/conv%s.gguf", test_tmpdir(), tag);
    snprintf(cmd, sizeof cmd, "%s convert %s %s %s 2>&1", test_bin(), hf, out, extra);
    int rc = test_run(cmd, log, sizeof log);
    CHECKF(rc == 0, "convert failed (%d): %s", rc, log);
    CHECKF(!file_exists(strcat(strcpy(cmd, out), ".tmp")), ".tmp left behind");
    char err[DSF_ERR_LEN];
    gguf_file *a = gguf_open(ref, err);
    CHECKF(a, "%s", err);
    gguf_file *b = gguf_open(out, err);
    CHECKF(b, "%s", err);
    char msg[512] = "";
    int same = test_gguf_same(a, b, TG_ORDER | TG_DATA, NULL, msg, sizeof msg);
    gguf_close(a);
    gguf_close(b);
    CHECKF(same == 0, "%s vs converted: %s", ref, msg);
    unlink(out);
}

static void check_convert_matches(test_ctx *t, const char *ref, const char *tag, const char *extra) {
    check_convert_matches_from(t, "testdata/tiny41/hf", ref, tag, extra);
}

/* ================================================================ acceptance: tiny41 */

TEST(convert_tiny41_matches) {
    NEED_SHARED(ref, "testdata/tiny41/tiny41.gguf");
    check_convert_matches(t, ref, "bf16", "");
}

TEST(convert_tiny41_f32_matches) {
    NEED_SHARED(ref, "testdata/tiny41/tiny41-f32.gguf");
    check_convert_matches(t, ref, "f32", "--outtype f32 --threads 2");
}

/* ================================================================ acceptance: the DSpark draft */

/* Guards against a dflash file (gguf-layout.md §4) that differs from the maintainers' in any key,
 * value type, value, tensor name, dtype, shape or data byte. */
TEST(convert_tinyds_dspark_matches) {
    NEED_SHARED(ref, "testdata/tinyds/tinyds-dspark.gguf");
    check_convert_matches_from(t, "testdata/tinyds/hf", ref, "dspark", "--dspark");
}

TEST(convert_tinyds_dspark_f32_matches) {
    NEED_SHARED(ref, "testdata/tinyds/tinyds-dspark-f32.gguf");
    check_convert_matches_from(t, "testdata/tinyds/hf", ref, "dspark32", "--dspark --outtype f32 --threads 2");
}

/* ================================================================ acceptance: tinyvl (issue 38) */

/* Guards against files that differ from the shipped ones in any key, key order, value type, value,
 * tensor name, order, dtype, shape or data byte: the main model (blk.N.exp_probs_b_vl.bias from
 * ffn.gate.bias_vl, gguf-layout.md §3.2, and the checkpoint's vision tensors left out; the shipped
 * general.name "tinyvl" is what the default name gives for tinyvl/hf), and the projector
 * (gguf-layout.md §5: the w1 split, the patch-embedding reshape and its F32 type, 1-D F32,
 * general.file_type 32 or 0) with the default outtype and with --outtype f32. */
TEST(convert_tinyvl_matches) {
    static const struct { const char *ref, *tag, *extra; } c[] = {
        {"testdata/tinyvl/tinyvl.gguf", "vl", ""},
        {"testdata/tinyvl/mmproj-tinyvl.gguf", "mmproj", "--mmproj"},
        {"testdata/tinyvl/mmproj-tinyvl-f32.gguf", "mmproj32", "--mmproj --outtype f32 --threads 2"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        NEED_SHARED(ref, c[i].ref);
        check_convert_matches_from(t, "testdata/tinyvl/hf", ref, c[i].tag, c[i].extra);
    }
}

/* ================================================================ malformed checkpoints */

typedef struct {
    json_t *hdr;
    uint8_t *data;
    size_t len;
} st_image;

static int load_st(const char *path, st_image *im) {
    uint8_t *buf;
    size_t n;
    char err[DSF_ERR_LEN];
    if (dsf_read_file(path, &buf, &n, err)) return -1;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    im->hdr = json_loadb((const char *)buf + 8, (size_t)hl, 0, NULL);
    im->len = n - 8 - (size_t)hl;
    im->data = malloc(im->len + 64);
    memcpy(im->data, buf + 8 + hl, im->len);
    free(buf);
    return im->hdr ? 0 : -1;
}

static int save_st(const char *path, const st_image *im) {
    char *h = json_dumps(im->hdr, JSON_COMPACT);
    size_t hl = strlen(h);
    FILE *f = fopen(path, "wb");
    if (!f) return free(h), -1;
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(h, 1, hl, f);
    fwrite(im->data, 1, im->len, f);
    free(h);
    return fclose(f);
}

static void copy_file(const char *src, const char *dst) {
    uint8_t *b;
    size_t n;
    char err[DSF_ERR_LEN];
    if (dsf_read_file(src, &b, &n, err)) return;
    FILE *f = fopen(dst, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
    free(b);
}

typedef void (*st_mut)(st_image *im);
typedef void (*cfg_mut)(json_t *cfg);

/* The malformed-checkpoint tests start from tiny41/hf: without it they skip. */
#define NEED_HF() \
    do { \
        if (!test_shared("testdata/tiny41/hf")) SKIP("needs ../shared/testdata/tiny41/hf (absent)"); \
    } while (0)

/* Builds dir NAME in the temp dir from ../shared/HFREL with the mutations applied. */
static const char *make_variant_from(const char *hfrel, const char *name, st_mut sm, cfg_mut cm) {
    static char dir[512];
    const char *hf = test_shared(hfrel);
    if (!hf) return NULL;
    char src[1024], dst[1024];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", hf, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        copy_file(src, dst);
    }
    snprintf(src, sizeof src, "%s/config.json", hf);
    json_t *cfg = json_load_file(src, 0, NULL);
    if (!cfg) return NULL;
    if (cm) cm(json_object_get(cfg, "text_config") ? json_object_get(cfg, "text_config") : cfg);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    json_dump_file(cfg, dst, JSON_INDENT(1));
    json_decref(cfg);
    st_image im;
    snprintf(src, sizeof src, "%s/model.safetensors", hf);
    if (load_st(src, &im)) return NULL;
    if (sm) sm(&im);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    save_st(dst, &im);
    json_decref(im.hdr);
    free(im.data);
    return dir;
}

static const char *make_variant(const char *name, st_mut sm, cfg_mut cm) {
    return make_variant_from("testdata/tiny41/hf", name, sm, cm);
}

/* Runs convert [opt] on dir; the conversion must fail with a message containing want, and leave
 * neither the output nor its .tmp. */
static void expect_refused_opt(test_ctx *t, const char *opt, const char *dir, const char *want) {
    CHECKF(dir, "could not build the variant");
    char out[1024], tmp[1100], cmd[4096], log[4096];
    snprintf(out, sizeof out, "%s.gguf", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    snprintf(cmd, sizeof cmd, "%s convert %s %s %s 2>&1", test_bin(), opt, dir, out);
    int rc = test_run(cmd, log, sizeof log);
    CHECKF(rc == 1, "%s: exit %d (want 1): %s", dir, rc, log);
    CHECKF(strstr(log, "dsflash convert: ") && strstr(log, want), "%s: message '%s' lacks '%s'", dir, log, want);
    CHECKF(!strchr(log, '\n') || strchr(log, '\n') == log + strlen(log) - 1, "%s: more than one line: %s", dir, log);
    CHECKF(!file_exists(out) && !file_exists(tmp), "%s: output or .tmp left behind", dir);
}

static void expect_refused(test_ctx *t, const char *dir, const char *want) { expect_refused_opt(t, "", dir, want); }

static json_t *ent(st_image *im, const char *name) { return json_object_get(im->hdr, name); }

static uint64_t data_begin(st_image *im, const char *name) {
    return (uint64_t)json_integer_value(json_array_get(json_object_get(ent(im, name), "data_offsets"), 0));
}

static void m_missing(st_image *im) { json_object_del(im->hdr, "layers.3.attn.wkv.weight"); }
/* Appends a one-element F32 tensor NAME. */
static void add_extra(st_image *im, const char *name) {
    json_t *e = json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "F32", "shape", 1, "data_offsets",
                          (json_int_t)im->len, (json_int_t)im->len + 4);
    json_object_set_new(im->hdr, name, e);
    memset(im->data + im->len, 0, 4);
    im->len += 4;
}
static void m_extra(st_image *im) { add_extra(im, "layers.0.attn.extra.weight"); }
static void m_shape(st_image *im) {
    json_object_set_new(ent(im, "layers.0.attn.q_norm.weight"), "shape", json_pack("[i, i]", 2, 32));
}
static void m_dtype(st_image *im) {
    json_object_set_new(ent(im, "layers.0.attn.attn_sink"), "dtype", json_string("F64"));
}
static void m_scale_shape(st_image *im) {
    json_object_set_new(ent(im, "layers.0.attn.wq_a.scale"), "shape", json_pack("[i, i]", 4, 2));
}
static void m_e8m0_dense(st_image *im) { im->data[data_begin(im, "layers.2.attn.wkv.scale") + 3] = 250; }
static void m_e8m0_engram(st_image *im) { im->data[data_begin(im, "layers.4.engram.embed.scale") + 500] = 2; }
static void m_overlap(st_image *im) {
    json_t *a = ent(im, "layers.0.attn.attn_sink"), *b = ent(im, "layers.1.attn.attn_sink");
    json_object_set(b, "data_offsets", json_object_get(a, "data_offsets"));
}
static void m_oob(st_image *im) {
    json_object_set_new(ent(im, "norm.weight"), "data_offsets",
                        json_pack("[I, I]", (json_int_t)im->len, (json_int_t)im->len + 256));
}
static void m_no_scale(st_image *im) { json_object_del(im->hdr, "layers.6.ffn.shared_experts.w2.scale"); }
static void m_fp8_nan(st_image *im) { im->data[data_begin(im, "layers.5.attn.wo_b.weight") + 7] = 0x7F; }

TEST(convert_bad_tensors) {
    NEED_HF();
    expect_refused(t, make_variant("missing", m_missing, NULL), "missing tensor 'layers.3.attn.wkv.weight'");
    expect_refused(t, make_variant("extra", m_extra, NULL), "unexpected tensor 'layers.0.attn.extra.weight'");
    expect_refused(t, make_variant("shape", m_shape, NULL), "expected shape [64], got [2, 32]");
    expect_refused(t, make_variant("dtype", m_dtype, NULL), "unknown dtype 'F64'");
    expect_refused(t, make_variant("scaleshape", m_scale_shape, NULL), "does not match (32, 32) blocks");
    expect_refused(t, make_variant("nan", m_fp8_nan, NULL), "FP8 NaN");
    expect_refused(t, make_variant("noscale", m_no_scale, NULL), "has no block scales");
}

TEST(convert_bad_e8m0) {
    NEED_HF();
    expect_refused(t, make_variant("e8m0d", m_e8m0_dense, NULL), "E8M0 scale exponents outside [3, 246]");
    /* found while streaming the Engram table: the partial .tmp must be removed */
    expect_refused(t, make_variant("e8m0e", m_e8m0_engram, NULL), "E8M0 scale exponents outside [3, 246]");
}

TEST(convert_bad_safetensors) {
    NEED_HF();
    expect_refused(t, make_variant("overlap", m_overlap, NULL), "overlap");
    expect_refused(t, make_variant("oob", m_oob, NULL), "runs past the end of the file");
    /* byte-level damage on a copy of the valid file */
    const char *dir = make_variant("trunc", NULL, NULL);
    CHECK(dir);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat st;
    CHECK(stat(p, &st) == 0 && truncate(p, st.st_size - 100) == 0);
    expect_refused(t, dir, "truncated");
    dir = make_variant("hdrlen", NULL, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    CHECK(f);
    uint8_t big[8] = {0, 0, 0, 0, 0, 1, 0, 0}; /* 2^40 */
    fwrite(big, 1, 8, f);
    fclose(f);
    expect_refused(t, dir, "header length");
    dir = make_variant("badjson", NULL, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    f = fopen(p, "r+b");
    CHECK(f);
    fseek(f, 8, SEEK_SET);
    fputc('[', f);
    fputc('"', f);
    fclose(f);
    expect_refused(t, dir, "bad JSON header");
}

TEST(convert_bad_index) {
    NEED_HF();
    /* a sharded checkpoint whose index names a shard that is not there */
    const char *dir = make_variant("index", NULL, NULL);
    CHECK(dir);
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(q, sizeof q, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(rename(p, q) == 0);
    st_image im;
    CHECK(load_st(q, &im) == 0);
    json_t *wm = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(im.hdr, k, v) {
        if (strcmp(k, "__metadata__")) json_object_set_new(wm, k, json_string("model-00001-of-00002.safetensors"));
    }
    json_object_set_new(wm, "layers.0.attn.attn_sink", json_string("model-00002-of-00002.safetensors"));
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, p, 0);
    json_decref(idx);
    json_decref(im.hdr);
    free(im.data);
    expect_refused(t, dir, "which is missing");
}

TEST(convert_sharded_matches) {
    /* tiny41 split into two shards + model.safetensors.index.json (tensors of one shard not
     * contiguous in checkpoint order) must convert to the same file as the single one. */
    NEED_SHARED(ref, "testdata/tiny41/tiny41.gguf");
    const char *dir = make_variant("sharded", NULL, NULL);
    CHECK(dir);
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_image im, a, b;
    CHECK(load_st(p, &im) == 0);
    CHECK(unlink(p) == 0);
    a.hdr = json_object();
    b.hdr = json_object();
    a.data = malloc(im.len);
    b.data = malloc(im.len);
    a.len = b.len = 0;
    json_t *wm = json_object();
    const char *k;
    json_t *v;
    int i = 0;
    json_object_foreach(im.hdr, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        st_image *dst = (i++ % 3 == 1) ? &b : &a;
        json_int_t b0 = json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0));
        json_int_t b1 = json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 1));
        memcpy(dst->data + dst->len, im.data + b0, (size_t)(b1 - b0));
        json_object_set_new(dst->hdr, k, json_pack("{s:O, s:O, s:[I, I]}", "dtype", json_object_get(v, "dtype"), "shape",
                                                   json_object_get(v, "shape"), "data_offsets", (json_int_t)dst->len,
                                                   (json_int_t)(dst->len + (size_t)(b1 - b0))));
        dst->len += (size_t)(b1 - b0);
        json_object_set_new(wm, k, json_string(dst == &a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors"));
    }
    snprintf(q, sizeof q, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(save_st(q, &a) == 0);
    snprintf(q, sizeof q, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(save_st(q, &b) == 0);
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", wm);
    snprintf(q, sizeof q, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, q, 0);
    json_decref(idx);
    json_decref(im.hdr);
    json_decref(a.hdr);
    json_decref(b.hdr);
    free(im.data);
    free(a.data);
    free(b.data);
    char out[1024], cmd[4096], log[4096], err[DSF_ERR_LEN];
    snprintf(out, sizeof out, "%s.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s convert %s %s --name tiny41 2>&1", test_bin(), dir, out);
    CHECKF(test_run(cmd, log, sizeof log) == 0, "%s", log);
    gguf_file *x = gguf_open(ref, err), *y = x ? gguf_open(out, err) : NULL;
    CHECKF(x && y, "%s", err);
    char msg[512] = "";
    /* the tensor order follows the checkpoint's, which the sharding changes (gguf-layout.md §3.4) */
    int same = test_gguf_same(x, y, TG_DATA, NULL, msg, sizeof msg);
    gguf_close(x);
    gguf_close(y);
    CHECKF(same == 0, "sharded: %s", msg);
}

static void c_kv_ratio0(json_t *c) { json_array_set_new(json_object_get(c, "compress_ratios"), 4, json_integer(0)); }
static void c_scale_fmt(json_t *c) {
    (void)c; /* quantization_config lives at the top level: handled in the caller's file below */
}
static void c_gate_temp(json_t *c) { json_object_set_new(c, "gate_temp", json_real(2.0)); }
static void c_prime_sum(json_t *c) { json_array_set_new(json_object_get(c, "engram_num_embeddings"), 1, json_integer(865)); }
static void c_cvocab(json_t *c) { json_object_set_new(c, "engram_compressed_vocab_size", json_integer(853)); }
static void c_topk0(json_t *c) { json_object_set_new(c, "index_topk", json_integer(0)); }
static void c_ratio3(json_t *c) {
    json_t *r = json_object_get(c, "compress_ratios");
    for (int i = 2; i <= 4; i++) json_array_set_new(r, (size_t)i, json_integer(3));
}
static void c_engram_order(json_t *c) { json_object_set_new(c, "engram_layer_ids", json_pack("[i, i]", 4, 1)); }

TEST(convert_bad_config) {
    NEED_HF();
    expect_refused(t, make_variant("ratio0", NULL, c_kv_ratio0), "source layer 4 has compress ratio 0");
    expect_refused(t, make_variant("gatetemp", NULL, c_gate_temp), "gate_temp");
    expect_refused(t, make_variant("primesum", NULL, c_prime_sum), "prime sum 864 != engram_num_embeddings 865");
    expect_refused(t, make_variant("cvocab", NULL, c_cvocab), "compressed token map (1024 -> 854) does not match");
    expect_refused(t, make_variant("topk0", NULL, c_topk0), "index_topk must be > 0");
    expect_refused(t, make_variant("ratio3", NULL, c_ratio3), "ratio 3 without a matching kv/index source");
    expect_refused(t, make_variant("engorder", NULL, c_engram_order), "out of range or out of order");
    /* scale_fmt sits in the top-level quantization_config */
    const char *dir = make_variant("scalefmt", NULL, c_scale_fmt);
    CHECK(dir);
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    CHECK(cfg);
    json_object_set_new(json_object_get(cfg, "quantization_config"), "scale_fmt", json_string("e4m3"));
    json_dump_file(cfg, p, 0);
    json_decref(cfg);
    expect_refused(t, dir, "unsupported FP8 scale format e4m3");
}

static void d_stage3(st_image *im) { add_extra(im, "mtp.3.attn_norm.weight"); }
static void d_no_markov(st_image *im) { json_object_del(im->hdr, "mtp.2.markov_head.head.weight"); }
static void d_norm_shape(st_image *im) {
    json_object_set_new(ent(im, "mtp.0.main_norm.weight"), "shape", json_pack("[i, i]", 2, 64));
}
static void d_no_block(json_t *c) { json_object_del(c, "dspark_block_size"); }
static void d_target_oob(json_t *c) { json_array_set_new(json_object_get(c, "dspark_target_layer_ids"), 2, json_integer(8)); }
static void d_stage_ratio(json_t *c) { json_array_set_new(json_object_get(c, "compress_ratios"), 9, json_integer(2)); }

/* Guards against a DSpark conversion that accepts a checkpoint or config the dflash layout cannot
 * hold (gguf-layout.md §4, §6.3) or writes a partial file. */
TEST(convert_bad_dspark) {
    if (!test_shared("testdata/tinyds/hf")) SKIP("needs ../shared/testdata/tinyds/hf (absent)");
    const char *hf = "testdata/tinyds/hf";
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_stage3", d_stage3, NULL), "unexpected DSpark stage 3");
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_markov", d_no_markov, NULL),
                       "missing tensor 'mtp.2.markov_head.head.weight'");
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_shape", d_norm_shape, NULL),
                       "'mtp.0.main_norm.weight': expected shape [128]");
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_noblock", NULL, d_no_block), "dspark_block_size");
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_target", NULL, d_target_oob), "dspark_target_layer_ids");
    expect_refused_opt(t, "--dspark", make_variant_from(hf, "ds_ratio", NULL, d_stage_ratio), "compress_ratios[9] = 2");
}

static void v_no_w1(st_image *im) { json_object_del(im->hdr, "vision.blocks.1.mlp.w1.weight"); }
static void v_w1_shape(st_image *im) {
    json_object_set_new(ent(im, "vision.blocks.0.mlp.w1.weight"), "shape", json_pack("[i, i]", 176, 128));
}
static void v_split_q(st_image *im) { add_extra(im, "vision.blocks.0.attn.wq.weight"); }
static void v_pad(st_image *im) { add_extra(im, "image_pad"); }
static void v_fp8(st_image *im) { /* [128, 128] as F8_E4M3: the first half of its BF16 bytes */
    json_object_set_new(ent(im, "aligner.w2.weight"), "dtype", json_string("F8_E4M3"));
    uint64_t b0 = data_begin(im, "aligner.w2.weight");
    json_object_set_new(ent(im, "aligner.w2.weight"), "data_offsets", json_pack("[I, I]", (json_int_t)b0, (json_int_t)b0 + 16384));
}
/* vision_config mutations (they get the top-level object: make_variant_from's cfg_mut gets text_config) */
static json_t *vcfg(json_t *c) { return json_object_get(c, "vision_config"); }
static void vc_none(json_t *c) { json_object_del(c, "vision_config"); }
static void vc_zero(json_t *c) { json_object_set_new(vcfg(c), "num_hidden_layers", json_integer(0)); }
static void vc_cap(json_t *c) { json_object_set_new(vcfg(c), "max_image_tokens", json_integer(2048)); }
static void vc_ratio(json_t *c) { json_object_set_new(vcfg(c), "max_wh_ratio", json_real(2.0)); }
static void vc_theta(json_t *c) { json_object_set_new(vcfg(c), "rope_theta", json_real(5000.0)); }
static void vc_heads(json_t *c) { json_object_set_new(vcfg(c), "num_attention_heads", json_integer(5)); }
static void vc_no_patch(json_t *c) { json_object_del(vcfg(c), "patch_size"); }

/* tinyvl/hf as NAME with the checkpoint mutation sm and the top-level config mutation vm. */
static const char *vl_variant(const char *name, st_mut sm, cfg_mut vm) {
    const char *dir = make_variant_from("testdata/tinyvl/hf", name, sm, NULL);
    if (!dir || !vm) return dir;
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    if (!cfg) return NULL;
    vm(cfg);
    json_dump_file(cfg, p, 0);
    json_decref(cfg);
    return dir;
}

/* Guards against a projector conversion that accepts a checkpoint or config the deepseek41v
 * layout cannot hold (gguf-layout.md §5, §6.3: no tower, max_image_tokens != 1024, a
 * max_wh_ratio, rope_theta != 10000; a missing, misshapen, unknown or non-float tower tensor),
 * crashes on it, or leaves a file behind; and against --mmproj combined with what it cannot do. */
TEST(convert_bad_mmproj) {
    if (!test_shared("testdata/tinyvl/hf")) SKIP("needs ../shared/testdata/tinyvl/hf (absent)");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_now1", v_no_w1, NULL),
                       "missing tensor 'vision.blocks.1.mlp.w1.weight'");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_w1", v_w1_shape, NULL),
                       "'vision.blocks.0.mlp.w1.weight': expected shape [352, 64], got [176, 128]");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_splitq", v_split_q, NULL),
                       "unexpected tensor 'vision.blocks.0.attn.wq.weight'");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_pad", v_pad, NULL), "unexpected tensor 'image_pad'");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_fp8", v_fp8, NULL),
                       "'aligner.w2.weight': dtype F8_E4M3, expected BF16, F16 or F32");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_none", NULL, vc_none), "no vision_config");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_zero", NULL, vc_zero), "num_hidden_layers must be > 0");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_cap", NULL, vc_cap), "max_image_tokens is 2048");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_ratio", NULL, vc_ratio), "max_wh_ratio must be null");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_theta", NULL, vc_theta), "rope_theta must be 10000");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_heads", NULL, vc_heads), "not num_attention_heads (5)");
    expect_refused_opt(t, "--mmproj", vl_variant("vl_patch", NULL, vc_no_patch),
                       "'vision_config.patch_size' is missing");
    char cmd[2048], log[4096];
    snprintf(cmd, sizeof cmd, "%s convert --mmproj %s %s/n.gguf --outtype native 2>&1", test_bin(), test_shared("testdata/tinyvl/hf"),
             test_tmpdir());
    CHECKF(test_run(cmd, log, sizeof log) == 2 && strstr(log, "--mmproj"), "native: %s", log);
}

TEST(convert_cli_usage) {
    char cmd[1024], log[4096];
    snprintf(cmd, sizeof cmd, "%s convert --help", test_bin());
    CHECK(test_run(cmd, log, sizeof log) == 0 && strstr(log, "--outtype"));
    snprintf(cmd, sizeof cmd, "%s convert /nonexistent-dir %s/x.gguf 2>&1", test_bin(), test_tmpdir());
    CHECK(test_run(cmd, log, sizeof log) == 1 && strstr(log, "dsflash convert: "));
    snprintf(cmd, sizeof cmd, "%s convert a b --outtype q8 2>&1", test_bin());
    CHECK(test_run(cmd, log, sizeof log) != 0 && strstr(log, "--outtype"));
}

TEST(convert_vocab_only) {
    const char *hf = test_shared("testdata/tiny41/hf");
    if (!hf) SKIP("needs ../shared/testdata/tiny41/hf (absent)");
    NEED_SHARED(ref, "testdata/tiny41/tiny41.gguf");
    char out[512], cmd[2048], log[4096], err[DSF_ERR_LEN];
    snprintf(out, sizeof out, "%s/vocab.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s convert --vocab-only %s %s 2>&1", test_bin(), hf, out);
    CHECKF(test_run(cmd, log, sizeof log) == 0, "%s", log);
    gguf_file *a = gguf_open(out, err), *b = a ? gguf_open(ref, err) : NULL;
    CHECKF(a && b, "%s", err);
    int bad = a->n_tensors != 0;
    /* every tokenizer.* key equals the reference's */
    int ntok = 0;
    for (uint64_t i = 0; i < b->n_kv && !bad; i++) {
        if (strncmp(b->kv[i].key, "tokenizer.", 10)) continue;
        ntok++;
        const gguf_kv *x = gguf_find_kv(a, b->kv[i].key);
        bad = !x || x->type != b->kv[i].type ||
              (x->type == GGUF_VT_ARRAY && (x->arr_n != b->kv[i].arr_n || x->arr_type != b->kv[i].arr_type));
    }
    gguf_close(a);
    gguf_close(b);
    CHECK(!bad && ntok >= 5);
}

