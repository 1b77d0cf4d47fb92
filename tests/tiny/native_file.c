/* native_file.c: dsflash's native files (docs/FORMAT.md, issue 36): `convert --outtype native`
 * of the tiny41 checkpoint against tiny41.gguf (the seed layout of the same checkpoint) on every
 * golden case, `quantize ... native` against the converter, the FP8_R264 Engram rows (a
 * 256-wide variant of the checkpoint, and synth models), and the loader's refusals.
 *
 * Guards against: a native file whose values differ from the seed layout's anywhere (a grid
 * read at the wrong row block, wo_a's groups sharing group 0's scales, an Engram row decoded
 * with the wrong scale), a file that is not smaller, a quantizer that rounds instead of
 * recovering the checkpoint's bytes, and native files that load although they are malformed
 * (no or another dsflash.native_version, FP8_B32 where no matrix kernel reads it, wo_a re-viewed
 * across its grid's rows, a grid cut short).
 *
 * Logits must be byte-identical, not close: FP8 x E8M0 is exact in BF16 and in fp32, so both
 * files describe the same numbers and the same products (FORMAT.md). Until the FP8_B32 SIMD
 * kernels exist, the default table's BF16 kernels and the FP8_B32 scalar twin sum in another
 * order: the *_default tests then skip (saying so) and the *_ref tests run both files on the
 * scalar twins (DSF_KERNELS=ref, set in the test's own forked process). */
#include "dsflash.h"
#include "test.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert.h"
#include "convert/quantize_model.h"
#include "convert/synth.h"
#include "golden.h"
#include "helpers.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/select.h"
#include "model/cost.h"
#include "model/model.h"
#include "tmodel.h"

/* ---- helpers -------------------------------------------------------------------------- */

static const char *convert_native(const char *hf, const char *stem, bool native, char *err) {
    const char *out = tm_path(stem);
    convert_opts o = {.f32 = false, .native = native, .threads = 2};
    return convert_checkpoint(hf, out, &o, err) ? NULL : out;
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) ? -1 : (long)st.st_size;
}

/* Logits [n][V] of tokens, prefilled in chunks of chunk (0: all) after the first `first`
 * tokens fed at once (decode cases: first = prefill_len, chunk = 1). NULL with err. */
static float *logits(const char *path, dsf_numerics num, const int32_t *tok, int n, int first, int chunk, int *V,
                     char *err) {
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = num;
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    if (!e) return NULL;
    *V = dsf_engine_n_vocab(e);
    float *out = malloc((size_t)n * (size_t)*V * sizeof(float));
    dsf_session *s = dsf_session_new(e, n, err);
    int rc = s ? 0 : -1;
    for (int i = 0; i < n && !rc;) {
        int m = i == 0 && first ? first : chunk ? chunk : n;
        if (m > n - i) m = n - i;
        rc = dsf_session_eval(s, tok + i, m, out + (size_t)i * (size_t)*V, true, err) < 0 ? -1 : 0;
        i += m;
    }
    dsf_session_free(s);
    dsf_engine_close(e);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Whether this table's FP8_B32 products are bit-identical to its BF16 ones (the FP8 kernels'
 * contract): a random 64x96 matrix of e4m3 x E8M0 values, as FP8_B32 and as BF16, times 1 and 5
 * activation rows, fp32 and bf16 activations. */
static bool fp8_kernels_match_bf16(const dsf_kernels *k) {
    enum { NO = 64, NI = 96, T = 5 };
    static uint8_t q[NO * NI + 2 * 3];
    static uint16_t b[NO * NI], xb[T * NI];
    static float x[T * NI], y1[T * NO], y2[T * NO];
    uint64_t s = 12345;
    for (int i = 0; i < NO * NI; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        q[i] = (uint8_t)(s >> 56) & 0x7F ? (uint8_t)(s >> 56) : 0x38;
        if ((q[i] & 0x7F) == 0x7F) q[i] = 0x3C;
    }
    for (int g = 0; g < 6; g++) q[NO * NI + g] = (uint8_t)(120 + g);
    dsf_wmat w8 = {DSF_TYPE_FP8B32, NI, NO, NI, q, q + NO * NI}, w16 = {GGML_TYPE_BF16, NI, NO, 2 * NI, NULL, NULL};
    float row[NI];
    for (int r = 0; r < NO; r++) {
        wmat_dequant_row(&w8, r, row);
        for (int i = 0; i < NI; i++) b[r * NI + i] = f32_to_bf16(row[i]);
    }
    w16.data = (const uint8_t *)b;
    for (int i = 0; i < T * NI; i++) {
        x[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
        xb[i] = f32_to_bf16(x[i]);
    }
    for (int tt = 1; tt <= T; tt += T - 1) {
        kern_matmul(k, &w8, x, tt, y1, NO, 0, NO);
        kern_matmul(k, &w16, x, tt, y2, NO, 0, NO);
        if (memcmp(y1, y2, (size_t)(tt * NO) * sizeof(float))) return false;
        kern_matmul_xbf16(k, &w8, xb, tt, y1, NO, 0, NO);
        kern_matmul_xbf16(k, &w16, xb, tt, y2, NO, 0, NO);
        if (memcmp(y1, y2, (size_t)(tt * NO) * sizeof(float))) return false;
    }
    return true;
}

/* ---- the tiny41 checkpoint, native vs the seed layout, every golden case ------------------ */

static void goldens_identical(test_ctx *t, bool ref) {
    if (ref) setenv("DSF_KERNELS", "ref", 1); /* this test's own process (runner.c forks) */
    else if (!fp8_kernels_match_bf16(kernels_get()))
        SKIP("the %s table's FP8_B32 products are not yet bit-identical to its BF16 ones (no FP8 SIMD kernels); "
             "native_file_goldens_ref checks the files on the scalar twins", kernels_get()->name);
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed_p, "testdata/tiny41/tiny41.gguf");
    char dir[512], seed[512], err[DSF_ERR_LEN] = "";
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(hf, '/') - hf), hf);
    snprintf(seed, sizeof seed, "%s", seed_p); /* test_shared's buffers rotate (golden_load uses them) */
    const char *nat = convert_native(dir, "tiny41-native", true, err);
    CHECKF(nat, "convert --outtype native: %s", err);
    /* FORMAT.md: 1 byte per FP8 weight (+1/1024 for the grid) instead of BF16's 2 */
    CHECKF(file_size(nat) > 0 && file_size(nat) < file_size(seed) * 85 / 100, "native %ld bytes vs seed layout %ld",
           file_size(nat), file_size(seed));
    static const char *const cases[] = {"plain-prefill", "plain-decode", "plain-long", "text-prompt", "contract-prefill",
                                        "contract-decode"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        golden g;
        if (golden_load(cases[c], &g) < 0) SKIP("needs ../shared/" GDIR "%s.*", cases[c]);
        const bool contract = !strncmp(cases[c], "contract", 8), decode = strstr(cases[c], "decode") != NULL;
        const dsf_numerics num = contract ? DSF_NUMERICS_REFERENCE : DSF_NUMERICS_PLAIN;
        int V1 = 0, V2 = 0;
        float *a = logits(seed, num, g.tokens, g.n, decode ? 20 : 0, decode ? 1 : 0, &V1, err); /* prefill_len 20 */
        float *b = a ? logits(nat, num, g.tokens, g.n, decode ? 20 : 0, decode ? 1 : 0, &V2, err) : NULL;
        bool same = a && b && V1 == V2 && V1 == g.vocab && !memcmp(a, b, (size_t)g.n * (size_t)V1 * sizeof(float));
        cmp_stats st = golden_compare(b ? b : g.gold, g.gold, g.n, g.vocab, 1e-3);
        free(a);
        free(b);
        golden_free(&g);
        CHECKF(same, "%s: %s", cases[c], err[0] ? err : "native logits differ from tiny41.gguf's");
        /* and so they pass the case as tiny41.gguf does (tests/tiny/golden.c: the README's plain preset) */
        CHECKF(contract || (st.bad_rows == 0 && st.top1_miss == 0), "%s: max %.3g, %d bad rows", cases[c], st.max_abs,
               st.bad_rows);
    }
}

TEST(native_file_goldens_ref) { goldens_identical(t, true); }
TEST(native_file_goldens_default) { goldens_identical(t, false); }

/* ---- quantize tiny41.gguf native against the converter --------------------------------- */

static bool kv_equal(const gguf_kv *a, const gguf_kv *b) {
    if (a->type != b->type || a->u != b->u || a->i != b->i || !(a->f == b->f || (a->f != a->f && b->f != b->f)))
        return false;
    if (a->type == GGUF_VT_STRING) return a->str.len == b->str.len && !memcmp(a->str.ptr, b->str.ptr, a->str.len);
    if (a->type != GGUF_VT_ARRAY) return true;
    if (a->arr_type != b->arr_type || a->arr_n != b->arr_n) return false;
    if (a->arr_type != GGUF_VT_STRING) return !memcmp(a->arr_data, b->arr_data, (size_t)(a->arr_n * gguf_vtype_size(a->arr_type)));
    for (uint64_t i = 0; i < a->arr_n; i++)
        if (a->strs[i].len != b->strs[i].len || memcmp(a->strs[i].ptr, b->strs[i].ptr, a->strs[i].len)) return false;
    return true;
}

/* The largest |code| of a 32x32 block of an FP8_B32 tensor's e4m3 bytes, as a code (0..0x7E). */
static int block_max_code(const uint8_t *q, int64_t ne0, int64_t rows, int64_t br, int64_t bc) {
    int m = 0;
    for (int64_t r = br * 32; r < rows && r < br * 32 + 32; r++)
        for (int64_t c = bc * 32; c < ne0 && c < bc * 32 + 32; c++)
            if ((q[r * ne0 + c] & 0x7F) > m) m = q[r * ne0 + c] & 0x7F;
    return m;
}

/* Every key of a in b with the same type and value, and the same count. */
static int same_kvs(const gguf_file *a, const gguf_file *b, char *msg, size_t cap) {
    if (a->n_kv != b->n_kv) return snprintf(msg, cap, "%llu keys vs %llu", (unsigned long long)a->n_kv, (unsigned long long)b->n_kv), -1;
    for (uint64_t i = 0; i < a->n_kv; i++) {
        const gguf_kv *k = gguf_find_kv(b, a->kv[i].key);
        if (!k || !kv_equal(&a->kv[i], k)) return snprintf(msg, cap, "key %s differs", a->kv[i].key), -1;
    }
    return 0;
}

/* The converter keeps the checkpoint's bytes; quantize recovers them from the BF16 values with
 * the smallest exponent per block (quantize_native.c). They agree on every byte except the
 * blocks whose checkpoint exponent is one above the smallest: those whose largest code is 224
 * (= 448 / 2, the same values as code 448 at S-1). For those the test asserts exactly that
 * shape, and that the decoded values agree everywhere. */
TEST(native_file_quantize_matches_convert) {
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed, "testdata/tiny41/tiny41.gguf");
    char dir[512], err[DSF_ERR_LEN], msg[256];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(hf, '/') - hf), hf);
    const char *conv = convert_native(dir, "conv-native", true, err);
    CHECKF(conv, "convert: %s", err);
    const char *qn = tm_path("quant-native");
    quantize_opts o = {.recipe = "native", .threads = 2};
    CHECKF(quantize_model(seed, qn, &o, err) == 0, "quantize native: %s", err);
    gguf_file *a = gguf_open(conv, err), *b = a ? gguf_open(qn, err) : NULL;
    CHECKF(a && b, "%s", err);
    int rc = same_kvs(a, b, msg, sizeof msg);
    int64_t blocks = 0, moved = 0;
    for (uint64_t i = 0; !rc && i < a->n_tensors; i++) {
        const gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        rc = !y || y->type != x->type || y->nbytes != x->nbytes || memcmp(y->ne, x->ne, sizeof x->ne);
        if (rc) {
            snprintf(msg, sizeof msg, "tensor %s: type or shape differs", x->name);
            break;
        }
        if (x->type != DSF_TYPE_FP8B32) {
            rc = memcmp(x->data, y->data, x->nbytes) != 0;
            if (rc) snprintf(msg, sizeof msg, "tensor %s (%s): bytes differ", x->name, ggml_type_name(x->type));
            continue;
        }
        const int64_t ne0 = x->ne[0], rows = x->ne[1], gc = (ne0 + 31) / 32;
        const uint8_t *gx = x->data + ne0 * rows, *gy = y->data + ne0 * rows;
        for (int64_t br = 0; !rc && br < (rows + 31) / 32; br++)
            for (int64_t bc = 0; !rc && bc < gc; bc++) {
                blocks++;
                if (gx[br * gc + bc] == gy[br * gc + bc]) continue;
                moved++;
                rc = gx[br * gc + bc] != gy[br * gc + bc] + 1 || block_max_code(x->data, ne0, rows, br, bc) != 0x76;
                if (rc) snprintf(msg, sizeof msg, "%s block (%lld, %lld): exponents %d vs %d", x->name, (long long)br,
                                 (long long)bc, gx[br * gc + bc], gy[br * gc + bc]);
            }
        const dsf_wmat wx = {x->type, ne0, rows, (uint64_t)ne0, x->data, gx}, wy = {y->type, ne0, rows, (uint64_t)ne0, y->data, gy};
        float *rx = malloc((size_t)ne0 * sizeof(float)), *ry = malloc((size_t)ne0 * sizeof(float));
        for (int64_t r = 0; !rc && r < rows; r++) {
            wmat_dequant_row(&wx, r, rx);
            wmat_dequant_row(&wy, r, ry);
            rc = memcmp(rx, ry, (size_t)ne0 * sizeof(float)) != 0;
            if (rc) snprintf(msg, sizeof msg, "%s row %lld: values differ", x->name, (long long)r);
        }
        free(rx);
        free(ry);
    }
    gguf_close(a);
    gguf_close(b);
    CHECKF(!rc, "%s", msg);
    fprintf(stderr, "native_file: %lld of %lld FP8 blocks have the checkpoint's exponent one above the smallest "
            "(largest code 224); every other byte is the converter's\n", (long long)moved, (long long)blocks);
    CHECKF(blocks > 0, "no FP8_B32 tensor");
}

/* BF16 weights that are not FP8 values (a plain random synth model) are refused, with the tensor
 * and the block named: native storage is lossless or nothing. */
TEST(native_file_quantize_refuses_non_fp8) {
    tm_params p;
    tm_params_default(&p);
    p.dense_type = GGML_TYPE_BF16;
    char err[DSF_ERR_LEN];
    const char *in = tm_path("plain-bf16"), *out = tm_path("plain-native");
    CHECKF(tm_write(&p, in, NULL, NULL, err) == 0, "%s", err);
    quantize_opts o = {.recipe = "native", .threads = 2};
    CHECKF(quantize_model(in, out, &o, err) != 0, "a random BF16 model was stored as FP8 without loss?");
    CHECKF(strstr(err, "tensor 'blk.") && strstr(err, "block of rows 0..") && strstr(err, "not FP8 values"), "%s", err);
}

/* ---- FP8_R264: a 256-wide Engram variant of the tiny41 checkpoint ---------------------- */

typedef struct {
    uint8_t *buf;
    size_t n, cap;
} bytes;

static void put_bytes(bytes *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->buf = realloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}

static uint64_t lcg(uint64_t *s) { return (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 33; }

/* n random e4m3 codes (never NaN), in groups of 32 led by a +-448 code: each group's smallest
 * exponent is then the one written beside it, so quantize recovers these bytes. */
static void fp8_codes(bytes *b, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)lcg(s);
        if (i % 32 == 0) c = (uint8_t)(0x7E | (c & 0x80));
        if ((c & 0x7F) == 0x7F) c ^= 1;
        put_bytes(b, &c, 1);
    }
}

static void e8m0(bytes *b, size_t n, int lo, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        uint8_t e = (uint8_t)(lo + (int)(lcg(s) % 6));
        put_bytes(b, &e, 1);
    }
}

/* Writes dir/ (config.json with engram_head_dim 256, the tokenizer files, model.safetensors):
 * tiny41's tensors, but the Engram tables [rows, 256] + [rows, 8] and engram.wkv
 * [640, 6 * 256] + its 32x32 scales random, and the other FP8 grids varied. 0 / -1. */
static int write_r264_checkpoint(const char *src, const char *dir) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) return -1;
    json_object_set_new(json_object_get(cfg, "text_config"), "engram_head_dim", json_integer(256));
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = json_dump_file(cfg, path, JSON_INDENT(1));
    json_decref(cfg);
    static const char *const tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && !rc; i++) {
        char a[PATH_MAX + 64], b[PATH_MAX + 64];
        snprintf(a, sizeof a, "%s/%s", src, tok[i]);
        snprintf(b, sizeof b, "%s/%s", dir, tok[i]);
        rc = symlink(a, b);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    long size = 0;
    unsigned char *st = test_slurp(path, &size);
    if (rc || !st || size < 8) return free(st), -1;
    uint64_t hl;
    memcpy(&hl, st, 8);
    json_t *h = json_loadb((const char *)st + 8, (size_t)hl, 0, NULL), *oh = json_object();
    bytes data = {0};
    uint64_t s = 41;
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *off = json_object_get(v, "data_offsets"), *shape = json_deep_copy(json_object_get(v, "shape"));
        const size_t b0 = data.n;
        const int64_t d0 = json_integer_value(json_array_get(shape, 0));
        if (strstr(name, "engram.embed.weight") || strstr(name, "engram.embed.scale")) {
            bool w = strstr(name, ".weight") != NULL;
            json_array_set_new(shape, 1, json_integer(w ? 256 : 8));
            if (w) fp8_codes(&data, (size_t)d0 * 256, &s);
            else e8m0(&data, (size_t)d0 * 8, 118, &s);
        } else if (strstr(name, "engram.wkv.weight") || strstr(name, "engram.wkv.scale")) {
            bool w = strstr(name, ".weight") != NULL;
            json_array_set_new(shape, 1, json_integer(w ? 6 * 256 : 6 * 256 / 32));
            if (w) fp8_codes(&data, (size_t)d0 * 6 * 256, &s);
            else e8m0(&data, (size_t)d0 * 6 * 256 / 32, 112, &s);
        } else {
            uint64_t a = (uint64_t)json_integer_value(json_array_get(off, 0)), e = (uint64_t)json_integer_value(json_array_get(off, 1));
            put_bytes(&data, st + 8 + hl + a, (size_t)(e - a));
            /* tiny41's 32x32 grids hold one exponent per tensor: vary them (+-2) so that a grid
             * row or column read for another block changes the values */
            if (strstr(name, ".scale") && !strstr(name, "experts"))
                for (size_t i = b0; i < data.n; i++) data.buf[i] = (uint8_t)(data.buf[i] + (int)(lcg(&s) % 5) - 2);
        }
        json_t *o = json_object();
        json_object_set(o, "dtype", json_object_get(v, "dtype"));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "data_offsets", json_pack("[I, I]", (json_int_t)b0, (json_int_t)data.n));
        json_object_set_new(oh, name, o);
    }
    char *hs = json_dumps(oh, JSON_COMPACT);
    size_t hn = (strlen(hs) + 7) / 8 * 8;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t hn64 = hn;
    rc = !f || fwrite(&hn64, 8, 1, f) != 1 || fwrite(hs, 1, strlen(hs), f) != strlen(hs) ||
         fwrite("        ", 1, hn - strlen(hs), f) != hn - strlen(hs) || fwrite(data.buf, 1, data.n, f) != data.n;
    if (f && fclose(f)) rc = 1;
    free(hs);
    free(data.buf);
    json_decref(h);
    json_decref(oh);
    free(st);
    return rc ? -1 : 0;
}

/* The converter writes the checkpoint's Engram bytes as FP8_R264 rows (256 e4m3, then the 8
 * scales), the engine reads them (and FP8_B32 grids that vary per block, wo_a's groups, the
 * resident copies) to the seed layout's logits, and quantize recovers them. */
TEST(native_file_r264_engram) {
    setenv("DSF_KERNELS", "ref", 1); /* as native_file_goldens_ref */
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    char src[PATH_MAX], dir[512], err[DSF_ERR_LEN] = "";
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(hf, '/') - hf), hf);
    CHECKF(realpath(dir, src), "realpath %s", dir); /* the tokenizer files are linked from another folder */
    snprintf(dir, sizeof dir, "%s/hf256", test_tmpdir());
    CHECKF(mkdir(dir, 0755) == 0 && write_r264_checkpoint(src, dir) == 0, "cannot write %s", dir);
    const char *nat = convert_native(dir, "r264-native", true, err), *bf = nat ? convert_native(dir, "r264-bf16", false, err) : NULL;
    CHECKF(nat && bf, "convert: %s", err);
    gguf_file *g = gguf_open(nat, err);
    CHECKF(g, "%s", err);
    const gguf_tensor *ple = gguf_find_tensor(g, "per_layer_token_embd.weight");
    CHECKF(ple && ple->type == DSF_TYPE_FP8R264 && ple->ne[0] == 256 && ple->ne[1] == 660 + 864,
           "per_layer_token_embd: %s", ple ? ggml_type_name(ple->type) : "missing");
    /* FORMAT.md: row r = its 256 checkpoint codes, then its 8 scales (layer 1's rows, then layer 4's) */
    st_checkpoint *ck = st_open_dir(dir, err);
    CHECKF(ck, "%s", err);
    uint8_t q[256], e[8];
    bool same = true;
    for (int64_t r = 0; r < ple->ne[1] && same; r++) {
        const int layer = r < 660 ? 1 : 4;
        const int64_t lr = r < 660 ? r : r - 660;
        char wn[64], sn[64];
        snprintf(wn, sizeof wn, "layers.%d.engram.embed.weight", layer);
        snprintf(sn, sizeof sn, "layers.%d.engram.embed.scale", layer);
        same = !st_read(ck, st_find(ck, wn), (uint64_t)lr * 256, 256, q, err) &&
               !st_read(ck, st_find(ck, sn), (uint64_t)lr * 8, 8, e, err) && !memcmp(ple->data + r * 264, q, 256) &&
               !memcmp(ple->data + r * 264 + 256, e, 8);
        CHECKF(same, "row %lld is not the checkpoint's bytes %s", (long long)r, err);
    }
    st_close(ck);
    /* quantize from the BF16 conversion gets the same bytes (every group led by a 448 code) */
    const char *qn = tm_path("r264-quant");
    quantize_opts o = {.recipe = "native", .threads = 2};
    CHECKF(quantize_model(bf, qn, &o, err) == 0, "quantize: %s", err);
    gguf_file *gq = gguf_open(qn, err);
    CHECKF(gq, "%s", err);
    static const char *const exact[] = {"per_layer_token_embd.weight", "blk.1.engram_kv.weight", "blk.4.engram_kv.weight"};
    for (int i = 0; i < 3; i++) {
        const gguf_tensor *a = gguf_find_tensor(g, exact[i]), *b = gguf_find_tensor(gq, exact[i]);
        CHECKF(a && b && a->type == b->type && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes),
               "%s: quantize's bytes differ from the converter's", exact[i]);
    }
    gguf_close(gq);
    gguf_close(g);
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)(3 + (i * 97) % 1000);
    for (int m = 0; m < 3; m++) {
        if (m == 2) setenv("DSF_RESIDENT", "1", 1); /* residency.c's dense copies: rows and grid */
        err[0] = 0;
        const dsf_numerics num = m ? DSF_NUMERICS_REFERENCE : DSF_NUMERICS_PLAIN;
        int V1 = 0, V2 = 0;
        float *a = logits(bf, num, tok, 40, 0, 0, &V1, err), *b = a ? logits(nat, num, tok, 40, 0, 0, &V2, err) : NULL;
        same = a && b && V1 == V2 && !memcmp(a, b, (size_t)40 * (size_t)V1 * sizeof(float));
        free(a);
        free(b);
        CHECKF(same, "%s logits%s: %s", m ? "reference" : "plain", m == 2 ? " (resident)" : "",
               err[0] ? err : "native differs from bf16");
    }
    /* and in the copies the grid follows its rows, as in the file (matmul.h: scales = the grid) */
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.resident = 1;
    dsf_engine *eng = dsf_engine_open(nat, &ep, err);
    CHECKF(eng && eng->dense_map, "%s", eng ? "no dense copy made" : err);
    const dsf_layer *L = &eng->w.layers[4];
    const dsf_wmat *const mats[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->engram_kv, &L->gate_sh};
    bool in_copy = true;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        in_copy &= mats[i]->type == DSF_TYPE_FP8B32 && mats[i]->scales == mats[i]->data + mats[i]->n_out * mats[i]->n_in &&
                   mats[i]->data >= (const uint8_t *)eng->dense_map && mats[i]->data < (const uint8_t *)eng->dense_map + eng->dense_size;
    dsf_engine_close(eng);
    CHECKF(in_copy, "an FP8_B32 matrix of layer 4 is not a copy with its grid after its rows");
}

/* ---- synth: --fp8-exact and --native -------------------------------------------------- */

/* tm_params_default with BF16 weights and o_lora 32 (FP8_B32 wo_a: whole 32-row blocks per group). */
static void native_params(tm_params *p) {
    tm_params_default(p);
    p->dense_type = GGML_TYPE_BF16;
    p->o_lora = 32;
}

static void edit_fp8_exact(tm_model *m, void *ud) {
    (void)ud;
    synth_fp8_exact(m);
}

static void edit_native(tm_model *m, void *ud) {
    (void)ud;
    synth_native(m);
}

/* A synth model with a 256-wide Engram table: --native holds the --fp8-exact model's values
 * (same logits), and is what quantize native writes from it, tensor for tensor. */
TEST(native_file_synth_native) {
    setenv("DSF_KERNELS", "ref", 1); /* as native_file_goldens_ref */
    tm_params p;
    native_params(&p);
    p.engram_dim = 256;
    char err[DSF_ERR_LEN];
    const char *bf = tm_path("sx-bf16"), *nat = tm_path("sx-native"), *qn = tm_path("sx-quant");
    CHECKF(tm_write(&p, bf, edit_fp8_exact, NULL, err) == 0 && tm_write(&p, nat, edit_native, NULL, err) == 0, "%s", err);
    quantize_opts o = {.recipe = "native", .threads = 2};
    CHECKF(quantize_model(bf, qn, &o, err) == 0, "quantize: %s", err);
    gguf_file *a = gguf_open(nat, err), *b = a ? gguf_open(qn, err) : NULL;
    CHECKF(a && b && a->n_tensors == b->n_tensors, "%s", err);
    int n_native = 0;
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const gguf_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        CHECKF(!strcmp(x->name, y->name) && x->type == y->type && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes),
               "tensor %s (%s): synth --native and quantize native differ", x->name, ggml_type_name(x->type));
        n_native += dsf_type_native(x->type);
    }
    const gguf_tensor *ple = gguf_find_tensor(a, "per_layer_token_embd.weight");
    CHECKF(ple && ple->type == DSF_TYPE_FP8R264 && n_native > 10, "%d native tensors, table %s", n_native,
           ple ? ggml_type_name(ple->type) : "missing");
    gguf_close(a);
    gguf_close(b);
    int32_t tok[24];
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 53 + 7) % (int)p.n_vocab);
    int V1 = 0, V2 = 0;
    float *x = logits(bf, DSF_NUMERICS_REFERENCE, tok, 24, 0, 0, &V1, err);
    float *y = x ? logits(nat, DSF_NUMERICS_REFERENCE, tok, 24, 0, 0, &V2, err) : NULL;
    bool same = x && y && V1 == V2 && !memcmp(x, y, (size_t)24 * (size_t)V1 * sizeof(float));
    free(x);
    free(y);
    CHECKF(same, "%s", err[0] ? err : "synth --native logits differ from --fp8-exact's");
}

/* ---- malformed native files: each refused with the key or the tensor named --------------- */

typedef struct {
    const char *what;
    void (*edit)(tm_model *m); /* NULL: a native model with tensor `fp8` retyped to FP8_B32 */
    const char *fp8;
    const char *want[2];       /* substrings of the error */
} bad_case;

static void no_key(tm_model *m) { synth_retype_tensor(m, "blk.0.attn_q_a.weight", DSF_TYPE_FP8B32); }
static void version2(tm_model *m) {
    synth_native(m);
    synth_set_u32(m, DSF_NATIVE_KEY, 2);
}
static void key_str(tm_model *m) {
    synth_native(m);
    synth_set_str(m, DSF_NATIVE_KEY, "1");
}
static void wo_a_3d(tm_model *m) { /* tm_params_default: H*dh/og = 4*64/2 = 128 wide, og 2, o_lora 32 */
    synth_native(m);
    const int64_t ne[3] = {128, 32, 2};
    synth_reshape_tensor(m, "blk.2.attn_output_a.weight", 3, ne);
}

static void run_case(tm_model *m, void *ud) {
    const bad_case *c = ud;
    if (c->edit) return c->edit(m);
    synth_native(m);
    synth_retype_tensor(m, c->fp8, DSF_TYPE_FP8B32);
}

TEST(native_file_malformed_refused) {
    static const bad_case cases[] = {
        {"native type, no key", no_key, NULL, {"blk.0.attn_q_a.weight", DSF_NATIVE_KEY}},
        {"version 2", version2, NULL, {DSF_NATIVE_KEY " = 2", "version 1"}},
        {"key of type string", key_str, NULL, {DSF_NATIVE_KEY, "u32"}},
        {"FP8_B32 norm", NULL, "blk.0.attn_norm.weight", {"blk.0.attn_norm.weight", "FP8_B32"}},
        {"FP8_B32 stacked experts", NULL, "blk.1.ffn_up_exps.weight", {"blk.1.ffn_up_exps.weight", "FP8_B32"}},
        {"FP8_B32 token embedding", NULL, "token_embd.weight", {"token_embd.weight", "FP8_B32"}},
        {"FP8_B32 Engram table", NULL, "per_layer_token_embd.weight", {"per_layer_token_embd.weight", "FP8_B32"}},
        {"FP8_B32 wo_a stored 3-D", wo_a_3d, NULL, {"blk.2.attn_output_a.weight", "2-D"}},
    };
    tm_params p;
    native_params(&p);
    char err[DSF_ERR_LEN];
    const char *ok = tm_path("bad-base");
    CHECKF(tm_write(&p, ok, edit_native, NULL, err) == 0, "%s", err);
    dsf_engine *e = dsf_engine_open(ok, NULL, err);
    CHECKF(e, "the valid native base model is refused: %s", err); /* the cases below are refused for their edit */
    dsf_engine_close(e);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *path = tm_path("bad-native");
        CHECKF(tm_write(&p, path, run_case, (void *)&cases[c], err) == 0, "%s: %s", cases[c].what, err);
        err[0] = 0;
        e = dsf_engine_open(path, NULL, err);
        dsf_engine_close(e);
        CHECKF(!e, "%s: opened", cases[c].what);
        CHECKF(strstr(err, cases[c].want[0]) && strstr(err, cases[c].want[1]), "%s: '%s' lacks '%s' / '%s'",
               cases[c].what, err, cases[c].want[0], cases[c].want[1]);
    }
    p.o_lora = 16; /* wo_a's groups of 16 rows would split its grid's 32-row blocks */
    const char *path = tm_path("bad-native-lora");
    CHECKF(tm_write(&p, path, edit_native, NULL, err) == 0, "%s", err);
    e = dsf_engine_open(path, NULL, err);
    dsf_engine_close(e);
    CHECKF(!e && strstr(err, "attn_output_a.weight") && strstr(err, "o_lora (16)"), "o_lora 16: %s", e ? "opened" : err);
}

static void q_a_as_i8(tm_model *m, void *ud) {
    (void)ud;
    synth_native(m);
    synth_retype_tensor(m, "blk.0.attn_q_a.weight", GGML_TYPE_I8); /* rows only: no room for a grid */
}

/* An FP8_B32 tensor whose grid is missing (written as I8, then its type id patched to 1024 in
 * the header): the reader counts the grid (gguf.c), so the tensor overlaps the next one. */
TEST(native_file_grid_missing) {
    tm_params p;
    native_params(&p);
    char err[DSF_ERR_LEN];
    const char *path = tm_path("grid-missing");
    CHECKF(tm_write(&p, path, q_a_as_i8, NULL, err) == 0, "%s", err);
    long size = 0;
    unsigned char *b = test_slurp(path, &size);
    static const char name[] = "blk.0.attn_q_a.weight";
    unsigned char *at = b ? memmem(b, (size_t)size, name, sizeof name - 1) : NULL;
    CHECKF(at, "no tensor info for %s", name);
    uint32_t nd, type;
    memcpy(&nd, at + sizeof name - 1, 4);
    unsigned char *tp = at + sizeof name - 1 + 4 + 8 * nd;
    memcpy(&type, tp, 4);
    CHECKF(type == GGML_TYPE_I8, "type %u", type);
    type = DSF_TYPE_FP8B32;
    memcpy(tp, &type, 4);
    FILE *f = fopen(path, "wb");
    CHECKF(f && fwrite(b, 1, (size_t)size, f) == (size_t)size && fclose(f) == 0, "rewrite %s", path);
    free(b);
    dsf_engine *e = dsf_engine_open(path, NULL, err);
    dsf_engine_close(e);
    CHECKF(!e && strstr(err, name), "opened, or the error does not name the tensor: %s", e ? "" : err);
}

/* dsflash bench's bytes per token (model/cost.c) count a native file at its sizes: every
 * FP8_B32 matrix is read in full each token, so the seed layout's count exceeds the native one
 * by 2 x its elements - (its elements + its grid) (FORMAT.md), summed over them. */
TEST(native_file_cost_bytes) {
    NEED_SHARED(hf, "testdata/tiny41/hf/config.json");
    NEED_SHARED(seed_p, "testdata/tiny41/tiny41.gguf");
    char dir[512], seed[512], err[DSF_ERR_LEN];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(hf, '/') - hf), hf);
    snprintf(seed, sizeof seed, "%s", seed_p);
    const char *nat = convert_native(dir, "cost-native", true, err);
    CHECKF(nat, "%s", err);
    double bn, fn, hn, bs, fs, hs;
    CHECKF(cost_token(nat, &bn, &fn, &hn, err) == 0 && cost_token(seed, &bs, &fs, &hs, err) == 0, "%s", err);
    gguf_file *g = gguf_open(nat, err);
    CHECKF(g, "%s", err);
    double saved = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *x = &g->tensors[i];
        if (x->type != DSF_TYPE_FP8B32) continue;
        const double el = (double)x->ne[0] * (double)x->ne[1];
        saved += 2 * el - (el + (double)((x->ne[0] + 31) / 32 * ((x->ne[1] + 31) / 32)));
    }
    gguf_close(g);
    CHECKF(bs - bn == saved && fn == fs && hn == hs, "bytes %.0f vs %.0f (saved %.0f, expected %.0f); flops %.0f vs %.0f",
           bs, bn, bs - bn, saved, fs, fn);
}
