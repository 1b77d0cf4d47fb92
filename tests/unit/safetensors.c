/* safetensors.c: the safetensors reader (src/io/safetensors.c) on small synthetic files.
 *
 * Guards against: misread shapes/offsets/values; hostile headers (absurd lengths, bad JSON,
 * duplicate names, unknown dtypes, shape/size mismatches, overlapping or out-of-bounds
 * ranges, truncation) that crash or are accepted; and sharded indexes pointing outside the
 * directory or at missing shards. */
#include "io/gguf.h"
#include "io/safetensors.h"
#include "test.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

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

TEST(safetensors_valid_file) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3F80, 0x4000, 0xC040, 0x0000}; /* bf16 1, 2, -3, 0 */
    uint8_t data[32];
    memcpy(data, a, 24);
    memcpy(data + 24, b, 8);
    const char *p = test_tmpfile("ok.safetensors");
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

TEST(safetensors_hostile_headers) {
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
    const char *p = test_tmpfile("bad.safetensors");
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

TEST(safetensors_fuzz_no_crash) {
    /* Random byte damage to a valid file: every result must be a clean accept or refuse
     * (ASan/UBSan builds check there is no out-of-bounds access). */
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    size_t hl = strlen(hdr), n = 8 + hl + 32;
    uint8_t *img = calloc(1, n), *mut = malloc(n);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, hdr, hl);
    const char *p = test_tmpfile("fuzz.safetensors");
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

TEST(safetensors_sharded_index) {
    const char *dir = test_tmpfile("shards");
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
