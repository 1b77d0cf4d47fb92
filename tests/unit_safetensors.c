/* unit_safetensors.c: the safetensors reader (src/safetensors.c) on small synthetic files,
 * and the GGUF writer (src/gguf_write.c) read back by the GGUF reader.
 *
 * Guards against: misread shapes/offsets/values; hostile headers (absurd lengths, bad JSON,
 * duplicate names, unknown dtypes, shape/size mismatches, overlapping or out-of-bounds
 * ranges, truncation) that crash or are accepted; sharded indexes pointing outside the
 * directory or at missing shards; and a writer whose offsets, padding or per-tensor byte
 * accounting a reader would refuse. */
#include "io/gguf.h"
#include "io/safetensors.h"
#include "test.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void write_raw(const char *path, uint64_t hlen, const char *hdr, const void *data, size_t dlen) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(hlen >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    if (dlen) fwrite(data, 1, dlen, f);
    fclose(f);
}

static void write_st(const char *path, const char *hdr, const void *data, size_t dlen) {
    write_raw(path, strlen(hdr), hdr, data, dlen);
}

static const char *tmp_path(const char *name) {
    static char p[4][512];
    static int k;
    char *s = p[k++ & 3];
    snprintf(s, 512, "%s/%s", test_tmpdir(), name);
    return s;
}

TEST(st_valid_file) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3F80, 0x4000, 0xC040, 0x0000}; /* bf16 1, 2, -3, 0 */
    uint8_t data[32];
    memcpy(data, a, 24);
    memcpy(data + 24, b, 8);
    const char *p = tmp_path("ok.safetensors");
    write_st(p, "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}", data, 32);
    char err[DSF_ERR_LEN];
    st_checkpoint *c = st_open_file(p, err);
    CHECKF(c, "%s", err);
    CHECK(st_count(c) == 2);
    const st_tensor *w = st_find(c, "w"), *bt = st_find(c, "b");
    CHECK(w && bt && !st_find(c, "x") && !st_find(c, "__metadata__"));
    CHECK(st_at(c, 0) == w && st_at(c, 1) == bt); /* header order */
    CHECK(w->dtype == ST_F32 && w->n_dims == 2 && w->shape[0] == 2 && w->shape[1] == 3 && w->nelem == 6 && w->nbytes == 24);
    CHECK(bt->dtype == ST_BF16 && bt->n_dims == 1 && bt->shape[0] == 4 && bt->nbytes == 8);
    float r[3];
    CHECKF(st_read(c, w, 12, 12, r, err) == 0, "%s", err);
    CHECK(r[0] == 4 && r[1] == 5 && r[2] == 6);
    uint16_t rb[4];
    CHECK(st_read(c, bt, 0, 8, rb, err) == 0 && rb[2] == 0xC040);
    CHECK(st_read(c, bt, 4, 8, rb, err) == -1 && strstr(err, "outside")); /* past the tensor */
    /* truncated after open: the read must fail, not return garbage */
    CHECK(truncate(p, (off_t)(w->offset + 16)) == 0);
    CHECK(st_read(c, w, 12, 12, r, err) == -1 && strstr(err, "truncated"));
    st_close(c);
}

TEST(st_hostile_headers) {
    uint8_t data[64] = {0};
    static const struct { const char *hdr; size_t dlen; const char *want; } c[] = {
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":", 0, "bad JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "bad JSON"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "needs dtype"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'Q4'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "bad shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}", 4, "bad shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dims"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "bad data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "4 bytes of data for 2 elements"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "runs past the end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 16, "overlap"},
    };
    char err[DSF_ERR_LEN];
    const char *p = tmp_path("bad.safetensors");
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        write_st(p, c[i].hdr, data, c[i].dlen);
        err[0] = 0;
        st_checkpoint *ck = st_open_file(p, err);
        st_close(ck);
        CHECKF(!ck && strstr(err, c[i].want), "case %zu: %s (want '%s')", i, ck ? "accepted" : err, c[i].want);
    }
    /* header lengths: absurd, larger than the file, zero; and a file shorter than 8 bytes */
    const uint64_t lens[3] = {(uint64_t)1 << 62, 1000, 0};
    for (int i = 0; i < 3; i++) {
        write_raw(p, lens[i], "{}", NULL, 0);
        st_checkpoint *ck = st_open_file(p, err);
        st_close(ck);
        CHECKF(!ck && strstr(err, "header length"), "length %llu: %s", (unsigned long long)lens[i], ck ? "accepted" : err);
    }
    FILE *f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    CHECK(!st_open_file(p, err) && strstr(err, "too short"));
}

TEST(st_fuzz_no_crash) {
    /* Random byte damage to a valid file: every result must be a clean accept or refuse
     * (ASan/UBSan builds check there is no out-of-bounds access). */
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    size_t hl = strlen(hdr), n = 8 + hl + 32;
    uint8_t *img = calloc(1, n), *mut = malloc(n);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, hdr, hl);
    const char *p = tmp_path("fuzz.safetensors");
    uint64_t s = 12345;
    char err[DSF_ERR_LEN];
    int accepted = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(mut, img, n);
        int k = 1 + (int)(s % 4);
        for (int j = 0; j < k; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            mut[(s >> 33) % n] = (uint8_t)(s >> 17);
        }
        FILE *f = fopen(p, "wb");
        fwrite(mut, 1, n - (it % 7 == 0 ? (s >> 40) % 16 : 0), f);
        fclose(f);
        st_checkpoint *c = st_open_file(p, err);
        if (c) {
            accepted++;
            uint8_t buf[64];
            for (int i = 0; i < st_count(c); i++) {
                const st_tensor *x = st_at(c, i);
                if (x->nbytes <= sizeof buf) (void)st_read(c, x, 0, x->nbytes, buf, err);
            }
        }
        st_close(c);
    }
    free(img);
    free(mut);
    CHECK(accepted < 300);
}

TEST(st_sharded_index) {
    const char *dir = tmp_path("shards");
    mkdir(dir, 0755);
    char p[1024];
    float v[2] = {7, 8};
    snprintf(p, sizeof p, "%s/b-2.safetensors", dir);
    write_st(p, "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", v + 1, 4);
    snprintf(p, sizeof p, "%s/a-1.safetensors", dir);
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", v, 4);
    float zq[2] = {1, 2};
    snprintf(p, sizeof p, "%s/c-3.safetensors", dir);
    write_st(p, "{\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"q\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", zq, 8);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"weight_map\":{\"y\":\"b-2.safetensors\",\"x\":\"a-1.safetensors\"}}", f);
    fclose(f);
    char err[DSF_ERR_LEN];
    st_checkpoint *c = st_open_dir(dir, err);
    CHECKF(c, "%s", err);
    float r = 0;
    int ok = st_count(c) == 2 && !strcmp(st_at(c, 0)->name, "x") && st_read(c, st_find(c, "y"), 0, 4, &r, err) == 0 && r == 8;
    st_close(c);
    CHECK(ok);
    static const struct { const char *idx, *want; } bad[] = {
        {"{\"weight_map\":{\"y\":\"b-2.safetensors\",\"x\":\"../a-1.safetensors\"}}", "bad shard name"},
        {"{\"weight_map\":{\"y\":\"b-2.safetensors\",\"x\":\"d-4.safetensors\"}}", "which is missing"},
        {"{\"weight_map\":{\"y\":\"b-2.safetensors\",\"z\":\"c-3.safetensors\"}}", "'q', which the index does not list"},
        {"{\"weight_map\":{\"y\":\"b-2.safetensors\",\"x\":\"a-1.safetensors\",\"z\":\"a-1.safetensors\"}}", "which lacks it"},
        {"{\"weight_map\":{\"y\":\"a-1.safetensors\",\"x\":\"a-1.safetensors\"}}", "names tensor 'y' in shard 'a-1.safetensors', which lacks it"},
        {"{\"weight_map\":{\"y\":\"a-1.safetensors\",\"x\":\"b-2.safetensors\"}}", "assigns to another shard"},
        {"{\"weight_map\":{}}", "no weight_map"},
        {"{\"weight_map\":", "bad JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(p, "w");
        fputs(bad[i].idx, f);
        fclose(f);
        c = st_open_dir(dir, err);
        st_close(c);
        CHECKF(!c && strstr(err, bad[i].want), "case %zu: %s (want '%s')", i, c ? "accepted" : err, bad[i].want);
    }
}

/* ================================================================ GGUF writer */

TEST(gwrite_roundtrip) {
    const char *p = tmp_path("w.gguf");
    char err[DSF_ERR_LEN];
    gguf_writer *w = gguf_writer_new();
    const char *strs[2] = {"a", "bc"};
    uint64_t u64[2] = {1, (uint64_t)1 << 40};
    int64_t ne1[1] = {3}, ne2[2] = {32, 2}, ne3[1] = {5};
    CHECK(gguf_writer_kv_u32(w, "k.u32", 7, err) == 0 && gguf_writer_kv_i32(w, "k.i32", -3, err) == 0 &&
          gguf_writer_kv_f32(w, "k.f32", 1.5f, err) == 0 && gguf_writer_kv_bool(w, "k.b", true, err) == 0 &&
          gguf_writer_kv_str(w, "k.s", "hello", err) == 0 && gguf_writer_kv_u64(w, "k.u64", 9, err) == 0 &&
          gguf_writer_kv_arr(w, "k.arr", GGUF_VT_UINT64, u64, 2, err) == 0 &&
          gguf_writer_kv_arr_str(w, "k.strs", strs, NULL, 2, err) == 0);
    CHECK(gguf_writer_kv_u32(w, "k.u32", 8, err) == -1 && strstr(err, "duplicate key"));
    CHECK(gguf_writer_kv_arr(w, "k.empty", GGUF_VT_INT32, u64, 0, err) == -1);
    CHECK(gguf_writer_tensor(w, "t.f32", 0 /* F32 */, 1, ne1, err) == 0);
    CHECK(gguf_writer_tensor(w, "t.mx", 39 /* MXFP4 */, 2, ne2, err) == 0);
    CHECK(gguf_writer_tensor(w, "t.bf", 30 /* BF16 */, 1, ne3, err) == 0);
    CHECK(gguf_writer_tensor(w, "t.bf", 30, 1, ne3, err) == -1 && strstr(err, "duplicate tensor"));
    int64_t bad[1] = {33};
    CHECK(gguf_writer_tensor(w, "t.badmx", 39, 1, bad, err) == -1 && strstr(err, "block size"));
    CHECK(gguf_writer_tensor(w, "a_name_that_is_far_too_long_for_ggml_tensor_names_0123456789abcdef", 0, 1, ne1, err) == -1);
    CHECKF(gguf_writer_begin(w, p, err) == 0, "%s", err);
    float f[3] = {1, 2, 3};
    uint8_t mx[34];
    for (int i = 0; i < 34; i++) mx[i] = (uint8_t)i;
    uint16_t bf[5] = {1, 2, 3, 4, 5};
    CHECK(gguf_writer_write(w, f, 8, err) == 0 && gguf_writer_write(w, f + 2, 4, err) == 0); /* split chunks */
    CHECK(gguf_writer_write(w, mx, 34, err) == 0);
    CHECK(gguf_writer_write(w, bf, 10, err) == 0);
    CHECKF(gguf_writer_finish(w, err) == 0, "%s", err);
    gguf_writer_free(w);
    gguf_file *g = gguf_open(p, err);
    CHECKF(g, "reader refuses the writer's file: %s", err);
    uint32_t u = 0;
    char *s = NULL;
    const gguf_tensor *t1 = gguf_find_tensor(g, "t.f32"), *t2 = gguf_find_tensor(g, "t.mx"), *t3 = gguf_find_tensor(g, "t.bf");
    const gguf_kv *ka = gguf_find_kv(g, "k.arr"), *ks = gguf_find_kv(g, "k.strs");
    int ok = g->version == 3 && g->n_kv == 8 && g->n_tensors == 3 && gguf_get_u32(g, "k.u32", &u, err) == 0 && u == 7 &&
             gguf_get_str(g, "k.s", &s, err) == 0 && !strcmp(s, "hello") && t1 && t2 && t3 &&
             t1->offset == 0 && t2->offset == 32 && t3->offset == 96 && g->data_offset % 32 == 0 &&
             !memcmp(t1->data, f, 12) && !memcmp(t2->data, mx, 34) && !memcmp(t3->data, bf, 10) &&
             t2->ne[0] == 32 && t2->ne[1] == 2 && ka && ka->arr_n == 2 && ka->arr_type == GGUF_VT_UINT64 &&
             ks && ks->arr_n == 2 && ks->strs[1].len == 2 && g->size == g->data_offset + 96 + 32;
    free(s);
    gguf_close(g);
    CHECK(ok);
}

TEST(gwrite_byte_accounting) {
    /* A tensor given too many bytes, or too few before finish, is an error (the
     * _StreamedBytes check of gguf-layout.md §6.3), never a silently shifted file. */
    char err[DSF_ERR_LEN];
    int64_t ne[1] = {4};
    for (int mode = 0; mode < 2; mode++) {
        gguf_writer *w = gguf_writer_new();
        CHECK(gguf_writer_tensor(w, "a", 0, 1, ne, err) == 0 && gguf_writer_tensor(w, "b", 0, 1, ne, err) == 0);
        CHECK(gguf_writer_begin(w, tmp_path("acct.gguf"), err) == 0);
        float x[12] = {0};
        if (mode == 0) {
            CHECK(gguf_writer_write(w, x, 12, err) == 0);
            CHECK(gguf_writer_write(w, x, 8, err) == -1 && strstr(err, "'a'")); /* crosses into 'b' */
        } else {
            CHECK(gguf_writer_write(w, x, 16, err) == 0 && gguf_writer_write(w, x, 12, err) == 0);
            CHECK(gguf_writer_finish(w, err) == -1 && strstr(err, "'b': 12 of 16 bytes"));
        }
        gguf_writer_free(w);
    }
}
