/* gguf.c: the GGUF reader (src/io/gguf.c) on images built byte by byte here (no use of the
 * writer), following gguf-layout.md §1.1-1.3: a valid v3 and v2 file with every value type,
 * arrays and tensors of several types; one malformed image per validation rule, each checked
 * for an error naming the right thing; truncation at every byte; the type-strict getters
 * (§1.6). The tiny41 GGUF files are read in tests/tiny/gguf.c. */
#include "test.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- byte builder */

typedef struct {
    uint8_t *d;
    size_t n, cap;
} bb;

static void put(bb *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->d = realloc(b->d, cap);
        if (!b->d) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void u8(bb *b, uint8_t v) { put(b, &v, 1); }
static void u16(bb *b, uint16_t v) { u8(b, (uint8_t)v); u8(b, (uint8_t)(v >> 8)); }
static void u32(bb *b, uint32_t v) { u16(b, (uint16_t)v); u16(b, (uint16_t)(v >> 16)); }
static void u64(bb *b, uint64_t v) { u32(b, (uint32_t)v); u32(b, (uint32_t)(v >> 32)); }
static void f32(bb *b, float f) { uint32_t u; memcpy(&u, &f, 4); u32(b, u); }
static void strn(bb *b, const char *s, size_t n) { u64(b, n); put(b, s, n); }
static void str(bb *b, const char *s) { strn(b, s, strlen(s)); }
static void key(bb *b, const char *k, uint32_t type) { str(b, k); u32(b, type); }
static void hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(bb *b, const char *k, uint32_t v) { key(b, k, GGUF_VT_UINT32); u32(b, v); }
/* Tensor info with up to 2 dims (ne1 = 0 means 1-D). */
static void tinfo(bb *b, const char *name, int64_t ne0, int64_t ne1, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, ne1 ? 2 : 1);
    u64(b, (uint64_t)ne0);
    if (ne1) u64(b, (uint64_t)ne1);
    u32(b, type);
    u64(b, off);
}
static void pad(bb *b, size_t a) { while (b->n % a) u8(b, 0); }
static void zeros(bb *b, size_t n) { while (n--) u8(b, 0); }

static gguf_file *open_bb(const bb *b, char *err) { return gguf_open_mem(b->d, b->n, "t.gguf", err); }

/* Expects the image to be refused with a message containing each of the given strings. */
#define EXPECT_ERR(b, ...)                                                                     \
    do {                                                                                       \
        char err_[DSF_ERR_LEN] = "";                                                           \
        gguf_file *f_ = open_bb(&(b), err_);                                                   \
        if (f_) gguf_close(f_);                                                                \
        CHECKF(!f_, "accepted a bad image (expected an error with: %s)", #__VA_ARGS__);       \
        const char *want_[] = {__VA_ARGS__};                                                   \
        for (size_t k_ = 0; k_ < sizeof want_ / sizeof want_[0]; k_++)                         \
            CHECKF(strstr(err_, want_[k_]), "error \"%s\" lacks \"%s\"", err_, want_[k_]);     \
        CHECKF(strncmp(err_, "t.gguf: ", 8) == 0, "error \"%s\" does not name the file", err_); \
        free((b).d);                                                                           \
    } while (0)

/* ---------------------------------------------------------------- a valid image */

enum { N_VALID_KV = 20, N_VALID_T = 5 };

/* Every value type, arrays (incl. strings, empty), and five tensors:
 *   a F32 {4,2} off 0 (32 B), b BF16 {8} off 32 (16 B), c Q8_0 {64,2} off 64 (136 B),
 *   d MXFP4 {32,3} off 224 (51 B), e IQ2_XXS {256} off 288 (66 B, known but unsupported).
 * Sets *data_end to the end of e's data (the file may stop there: no trailing padding). */
static void build_valid(bb *b, uint32_t version, size_t *data_start, size_t *data_end) {
    hdr(b, version, N_VALID_T, N_VALID_KV);
    key(b, "general.architecture", GGUF_VT_STRING); str(b, "deepseek41");
    key(b, "v.u8", GGUF_VT_UINT8); u8(b, 200);
    key(b, "v.i8", GGUF_VT_INT8); u8(b, 0x80);
    key(b, "v.u16", GGUF_VT_UINT16); u16(b, 65535);
    key(b, "v.i16", GGUF_VT_INT16); u16(b, 0xFFFE);
    kv_u32(b, "v.u32", 4000000000u);
    key(b, "v.i32", GGUF_VT_INT32); u32(b, (uint32_t)-7);
    key(b, "v.f32", GGUF_VT_FLOAT32); f32(b, 1.5f);
    key(b, "v.bool", GGUF_VT_BOOL); u8(b, 1);
    key(b, "v.u64", GGUF_VT_UINT64); u64(b, 0xFEDCBA9876543210ull);
    key(b, "v.i64", GGUF_VT_INT64); u64(b, (uint64_t)INT64_MIN);
    key(b, "v.f64", GGUF_VT_FLOAT64); { double d = -2.25; uint64_t u; memcpy(&u, &d, 8); u64(b, u); }
    key(b, "a.u32", GGUF_VT_ARRAY); u32(b, GGUF_VT_UINT32); u64(b, 3); u32(b, 1); u32(b, 2); u32(b, 4000000000u);
    key(b, "a.i32", GGUF_VT_ARRAY); u32(b, GGUF_VT_INT32); u64(b, 3); u32(b, 5); u32(b, (uint32_t)-1); u32(b, 7);
    key(b, "a.f32", GGUF_VT_ARRAY); u32(b, GGUF_VT_FLOAT32); u64(b, 2); f32(b, 0.25f); f32(b, -8.0f);
    key(b, "a.u64", GGUF_VT_ARRAY); u32(b, GGUF_VT_UINT64); u64(b, 2); u64(b, 8891835669103785ull); u64(b, 1ull << 63);
    key(b, "a.str", GGUF_VT_ARRAY); u32(b, GGUF_VT_STRING); u64(b, 3); str(b, "<s>"); str(b, ""); str(b, "h\xC3\xA9");
    key(b, "a.empty", GGUF_VT_ARRAY); u32(b, GGUF_VT_INT32); u64(b, 0);
    key(b, "a.bool", GGUF_VT_ARRAY); u32(b, GGUF_VT_BOOL); u64(b, 2); u8(b, 0); u8(b, 1);
    key(b, "v.str_nul", GGUF_VT_STRING); strn(b, "a\0b", 3);
    tinfo(b, "a", 4, 2, GGML_TYPE_F32, 0);
    tinfo(b, "b", 8, 0, GGML_TYPE_BF16, 32);
    tinfo(b, "c", 64, 2, GGML_TYPE_Q8_0, 64);
    tinfo(b, "d", 32, 3, GGML_TYPE_MXFP4, 224);
    tinfo(b, "e", 256, 0, GGML_TYPE_IQ2_XXS, 288);
    pad(b, 32);
    *data_start = b->n;
    for (int i = 0; i < 8; i++) f32(b, (float)i - 3.0f);       /* a */
    for (int i = 0; i < 8; i++) u16(b, (uint16_t)(0x3F80 + i)); /* b: bf16 1.0, 1.0078125, ... */
    pad(b, 32);
    for (int r = 0; r < 4; r++) { /* c: 4 blocks, d = 0.5, qs[j] = j - r */
        u16(b, 0x3800);
        for (int j = 0; j < 32; j++) u8(b, (uint8_t)(int8_t)(j - r));
    }
    pad(b, 32);
    for (int r = 0; r < 3; r++) { /* d: e = 127 + r, qs[0] = 0x71 (elem 0 = 0.5, elem 16 = 6) */
        u8(b, (uint8_t)(127 + r));
        u8(b, 0x71);
        zeros(b, 15);
    }
    pad(b, 32);
    zeros(b, 66); /* e */
    *data_end = b->n;
}

/* Guards the happy path: every value type, arrays, tensors, offsets and data pointers. */
static void check_valid(test_ctx *t, uint32_t version) {
    bb b = {0};
    size_t ds, de;
    build_valid(&b, version, &ds, &de);
    char err[DSF_ERR_LEN] = "";
    gguf_file *f = open_bb(&b, err);
    CHECKF(f, "valid v%u image refused: %s", version, err);
    CHECK(f->version == version && f->n_kv == N_VALID_KV && f->n_tensors == N_VALID_T);
    CHECK(f->alignment == 32 && f->data_offset == ds && ds % 32 == 0);

    const gguf_kv *kv = gguf_find_kv(f, "general.architecture");
    CHECK(kv && kv->type == GGUF_VT_STRING && kv->str.len == 10 && memcmp(kv->str.ptr, "deepseek41", 10) == 0);
    CHECK((kv = gguf_find_kv(f, "v.u8")) && kv->type == GGUF_VT_UINT8 && kv->u == 200);
    CHECK((kv = gguf_find_kv(f, "v.i8")) && kv->type == GGUF_VT_INT8 && kv->i == -128);
    CHECK((kv = gguf_find_kv(f, "v.u16")) && kv->u == 65535);
    CHECK((kv = gguf_find_kv(f, "v.i16")) && kv->i == -2);
    CHECK((kv = gguf_find_kv(f, "v.u32")) && kv->u == 4000000000u);
    CHECK((kv = gguf_find_kv(f, "v.i32")) && kv->i == -7);
    CHECK((kv = gguf_find_kv(f, "v.f32")) && kv->type == GGUF_VT_FLOAT32 && kv->f == 1.5);
    CHECK((kv = gguf_find_kv(f, "v.bool")) && kv->type == GGUF_VT_BOOL && kv->u == 1);
    CHECK((kv = gguf_find_kv(f, "v.u64")) && kv->u == 0xFEDCBA9876543210ull);
    CHECK((kv = gguf_find_kv(f, "v.i64")) && kv->i == INT64_MIN);
    CHECK((kv = gguf_find_kv(f, "v.f64")) && kv->type == GGUF_VT_FLOAT64 && kv->f == -2.25);
    CHECK((kv = gguf_find_kv(f, "a.str")) && kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING);
    CHECK(kv->arr_n == 3 && kv->strs[0].len == 3 && memcmp(kv->strs[0].ptr, "<s>", 3) == 0);
    CHECK(kv->strs[1].len == 0 && kv->strs[2].len == 3 && memcmp(kv->strs[2].ptr, "h\xC3\xA9", 3) == 0);
    CHECK((kv = gguf_find_kv(f, "a.empty")) && kv->arr_n == 0);
    CHECK((kv = gguf_find_kv(f, "a.bool")) && kv->arr_type == GGUF_VT_BOOL && kv->arr_n == 2 && kv->arr_data[1] == 1);
    CHECK(gguf_find_kv(f, "v.u3") == NULL && gguf_find_kv(f, "") == NULL);
    CHECK(strcmp(f->kv[0].key, "general.architecture") == 0); /* file order kept */

    const gguf_tensor *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b"), *tc = gguf_find_tensor(f, "c");
    const gguf_tensor *td = gguf_find_tensor(f, "d"), *te = gguf_find_tensor(f, "e");
    CHECK(ta && tb && tc && td && te && !gguf_find_tensor(f, "f") && !gguf_find_tensor(f, "a "));
    CHECK(ta->n_dims == 2 && ta->ne[0] == 4 && ta->ne[1] == 2 && ta->ne[2] == 1 && ta->ne[3] == 1);
    CHECK(ta->nbytes == 32 && ta->row_bytes == 16 && ta->offset == 0 && ta->data == b.d + ds);
    CHECK(tb->n_dims == 1 && tb->ne[1] == 1 && tb->nbytes == 16 && tb->row_bytes == 16 && tb->data == b.d + ds + 32);
    CHECK(tc->type == GGML_TYPE_Q8_0 && tc->row_bytes == 68 && tc->nbytes == 136 && tc->data == b.d + ds + 64);
    CHECK(td->type == GGML_TYPE_MXFP4 && td->row_bytes == 17 && td->nbytes == 51 && td->offset == 224);
    CHECK(te->type == GGML_TYPE_IQ2_XXS && te->nbytes == 66 && te->offset == 288);

    float y[64];
    dequant_row(ta->type, ta->data + ta->row_bytes, y, 4);
    CHECK(y[0] == 1.0f && y[3] == 4.0f); /* row 1 = elements 4..7 = i - 3 */
    dequant_row(tb->type, tb->data, y, 8);
    CHECK(y[0] == 1.0f && y[1] == 1.0078125f);
    dequant_row(tc->type, tc->data + tc->row_bytes, y, 64);
    CHECK(y[0] == -1.0f && y[32] == -1.5f && y[63] == 14.0f); /* row 1 = blocks r = 2, 3 */
    dequant_row(td->type, td->data + 2 * td->row_bytes, y, 32);
    CHECK(y[0] == 2.0f && y[16] == 24.0f && y[1] == 0); /* e = 129: 0.5 * 4, 6 * 4 */
    gguf_close(f);

    /* The data may end right after the last tensor (no trailing padding). */
    f = gguf_open_mem(b.d, de, "t.gguf", err);
    CHECKF(f, "file ending at the last tensor refused: %s", err);
    gguf_close(f);
    free(b.d);
}

TEST(gguf_valid_v3) { check_valid(t, 3); }
TEST(gguf_valid_v2) { check_valid(t, 2); }

/* Guards against reads past the end: every strict prefix short of the last tensor's data
 * must be refused cleanly (the ASan run checks no byte beyond the prefix is touched). */
TEST(gguf_truncated_everywhere) {
    bb b = {0};
    size_t ds, de;
    build_valid(&b, 3, &ds, &de);
    for (size_t n = 0; n < de; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy so ASan sees overreads */
        memcpy(copy, b.d, n);
        char err[DSF_ERR_LEN] = "";
        gguf_file *f = gguf_open_mem(copy, n, "t.gguf", err);
        if (f) gguf_close(f);
        free(copy);
        CHECKF(!f, "prefix of %zu bytes (of %zu) accepted", n, de);
        CHECKF(err[0] && strncmp(err, "t.gguf: ", 8) == 0, "prefix %zu: message \"%s\"", n, err);
        if (n >= 24 && n < ds - 32)
            CHECKF(strstr(err, "truncated") || strstr(err, "cannot fit") || strstr(err, "impossible") ||
                   strstr(err, "runs past"), "prefix %zu: %s", n, err);
    }
    free(b.d);
}

/* ---------------------------------------------------------------- malformed headers */

TEST(gguf_bad_magic_version) {
    bb b = {0};
    put(&b, "GGUX", 4); u32(&b, 3); u64(&b, 0); u64(&b, 0);
    EXPECT_ERR(b, "magic");
    b = (bb){0}; hdr(&b, 1, 0, 0);
    EXPECT_ERR(b, "version 1");
    b = (bb){0}; hdr(&b, 4, 0, 0);
    EXPECT_ERR(b, "version 4");
    b = (bb){0}; hdr(&b, 0x03000000u, 0, 0); /* byte-swapped 3 */
    EXPECT_ERR(b, "endianness");
    b = (bb){0}; hdr(&b, 0, 0, 0);
    EXPECT_ERR(b, "endianness");
    /* An empty but valid file (no KVs, no tensors) is fine. */
    b = (bb){0}; hdr(&b, 3, 0, 0);
    char err[DSF_ERR_LEN];
    gguf_file *f = open_bb(&b, err);
    CHECKF(f && f->n_kv == 0 && f->n_tensors == 0, "%s", err);
    CHECK(!gguf_find_kv(f, "x") && !gguf_find_tensor(f, "x"));
    gguf_close(f);
    free(b.d);
    CHECK(!gguf_open_mem("", 0, "t.gguf", err) && strstr(err, "magic"));
}

/* Guards against allocating from absurd counts and lengths (must fail fast, not malloc). */
TEST(gguf_absurd_counts) {
    bb b = {0};
    hdr(&b, 3, 0, 1ull << 62);
    EXPECT_ERR(b, "KV count");
    b = (bb){0}; hdr(&b, 3, 1ull << 62, 0);
    EXPECT_ERR(b, "tensor count");
    b = (bb){0}; hdr(&b, 3, 0, 1); u64(&b, 1ull << 62); put(&b, "k", 1); u32(&b, 4); u32(&b, 0);
    EXPECT_ERR(b, "1 GiB");
    b = (bb){0}; hdr(&b, 3, 0, 1); u64(&b, 1000); put(&b, "k", 1); u32(&b, 4); u32(&b, 0);
    EXPECT_ERR(b, "truncated", "key");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "s", GGUF_VT_STRING); u64(&b, 1ull << 62);
    EXPECT_ERR(b, "key 's'", "1 GiB");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, GGUF_VT_UINT8); u64(&b, 1ull << 62);
    EXPECT_ERR(b, "key 'arr'", "2^30");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, GGUF_VT_UINT64); u64(&b, 1ull << 29);
    EXPECT_ERR(b, "key 'arr'", "runs past the end");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, GGUF_VT_STRING); u64(&b, 1ull << 30);
    EXPECT_ERR(b, "key 'arr'", "cannot fit");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, GGUF_VT_STRING); u64(&b, 2);
    str(&b, "x"); u64(&b, 1ull << 62);
    EXPECT_ERR(b, "key 'arr'", "element 1", "1 GiB");
    /* tensor count that fits the header check but not what is left after the KVs */
    b = (bb){0}; hdr(&b, 3, 2, 1); kv_u32(&b, "k", 1); zeros(&b, 40);
    EXPECT_ERR(b, "tensor");
}

TEST(gguf_bad_values) {
    bb b = {0};
    hdr(&b, 3, 0, 2); kv_u32(&b, "ok", 1); key(&b, "bad.type", 13); u32(&b, 0);
    EXPECT_ERR(b, "key 'bad.type'", "unknown value type 13");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, 99); u64(&b, 1); u32(&b, 0);
    EXPECT_ERR(b, "key 'arr'", "unknown value type 99");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "arr", GGUF_VT_ARRAY); u32(&b, GGUF_VT_ARRAY); u64(&b, 1); zeros(&b, 16);
    EXPECT_ERR(b, "key 'arr'", "nested");
    b = (bb){0}; hdr(&b, 3, 0, 2); kv_u32(&b, "dup", 1); kv_u32(&b, "dup", 2);
    EXPECT_ERR(b, "key 'dup'", "duplicate key");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "", GGUF_VT_UINT32); u32(&b, 0);
    EXPECT_ERR(b, "empty key");
    b = (bb){0}; hdr(&b, 3, 0, 1); strn(&b, "a\0b", 3); u32(&b, GGUF_VT_UINT32); u32(&b, 0);
    EXPECT_ERR(b, "NUL");
    b = (bb){0}; hdr(&b, 3, 0, 1); key(&b, "flag", GGUF_VT_BOOL); u8(&b, 2); zeros(&b, 8);
    EXPECT_ERR(b, "key 'flag'", "BOOL");
    /* A long key with unprintable bytes is shown escaped and cut, never overflowing. */
    char longkey[301];
    memset(longkey, '\x01', 300);
    longkey[300] = 0;
    b = (bb){0}; hdr(&b, 3, 0, 2); kv_u32(&b, longkey, 1); kv_u32(&b, longkey, 2);
    EXPECT_ERR(b, "key '\\x01\\x01", "...'", "duplicate key");
}

/* gguf_open's own failures name the path. */
TEST(gguf_open_errors) {
    char err[DSF_ERR_LEN], path[512];
    CHECK(!gguf_open("/nonexistent/x.gguf", err) && strstr(err, "/nonexistent/x.gguf") && strstr(err, "cannot open"));
    CHECK(!gguf_open(test_tmpdir(), err) && strstr(err, "not a regular file"));
    snprintf(path, sizeof path, "%s/empty.gguf", test_tmpdir());
    FILE *fp = fopen(path, "wb");
    CHECK(fp);
    fclose(fp);
    CHECK(!gguf_open(path, err) && strstr(err, "empty.gguf") && strstr(err, "empty"));
    /* A small valid image written to disk opens through mmap. */
    bb b = {0};
    size_t ds, de;
    build_valid(&b, 3, &ds, &de);
    snprintf(path, sizeof path, "%s/valid.gguf", test_tmpdir());
    fp = fopen(path, "wb");
    CHECK(fp && fwrite(b.d, 1, b.n, fp) == b.n);
    fclose(fp);
    free(b.d);
    gguf_file *f = gguf_open(path, err);
    CHECKF(f && f->n_tensors == N_VALID_T && strcmp(f->path, path) == 0, "%s", err);
    const gguf_tensor *c = gguf_find_tensor(f, "c");
    CHECK(c && c->data == f->map + f->data_offset + 64 && c->data[0] == 0x00 && c->data[1] == 0x38);
    gguf_close(f);
}

TEST(gguf_bad_alignment) {
    static const struct { uint32_t type; uint32_t v; const char *want; } cases[] = {
        {GGUF_VT_UINT32, 0, "power of two"}, {GGUF_VT_UINT32, 3, "power of two"},
        {GGUF_VT_INT32, 32, "UINT32"}, {GGUF_VT_UINT16, 32, "UINT32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bb b = {0};
        hdr(&b, 3, 0, 1);
        key(&b, "general.alignment", cases[i].type);
        if (cases[i].type == GGUF_VT_UINT16) u16(&b, (uint16_t)cases[i].v);
        else u32(&b, cases[i].v);
        EXPECT_ERR(b, "general.alignment", cases[i].want);
    }
    /* A valid alignment of 64 moves the data section and the offsets' granularity. */
    bb b = {0};
    hdr(&b, 3, 2, 1);
    kv_u32(&b, "general.alignment", 64);
    tinfo(&b, "x", 4, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "y", 4, 0, GGML_TYPE_F32, 64);
    pad(&b, 64);
    size_t ds = b.n;
    zeros(&b, 80);
    char err[DSF_ERR_LEN];
    gguf_file *f = open_bb(&b, err);
    CHECKF(f, "%s", err);
    CHECK(f->alignment == 64 && f->data_offset == ds && f->tensors[1].data == b.d + ds + 64);
    gguf_close(f);
    free(b.d);
    /* ... and an offset of 32 is then misaligned. */
    b = (bb){0};
    hdr(&b, 3, 2, 1);
    kv_u32(&b, "general.alignment", 64);
    tinfo(&b, "x", 4, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "y", 4, 0, GGML_TYPE_F32, 32);
    pad(&b, 64);
    zeros(&b, 128);
    EXPECT_ERR(b, "tensor 'y'", "offset 32 is not a multiple of the alignment 64");
}

/* ---------------------------------------------------------------- malformed tensor infos */

/* One F32 tensor 'w' {8} described by the caller's raw info bytes, then 64 data bytes. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    hdr(b, 3, 1, 0);
    str(b, name);
    u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
    pad(b, 32);
    zeros(b, 64);
}

TEST(gguf_bad_tensor_info) {
    uint64_t ne[5] = {8, 1, 1, 1, 1};
    bb b = {0};
    one_tensor(&b, "w", 0, ne, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "n_dims 0");
    b = (bb){0}; one_tensor(&b, "w", 5, ne, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "n_dims 5");
    b = (bb){0}; one_tensor(&b, "w", 1, ne, 43, 0);
    EXPECT_ERR(b, "tensor 'w'", "unknown ggml type 43");
    b = (bb){0}; one_tensor(&b, "w", 1, ne, 0xFFFFFFFFu, 0);
    EXPECT_ERR(b, "tensor 'w'", "unknown ggml type 4294967295");
    static const uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38};
    for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++) {
        b = (bb){0}; one_tensor(&b, "w", 1, ne, retired[i], 0);
        EXPECT_ERR(b, "tensor 'w'", "retired");
    }
    uint64_t ne48[1] = {48};
    b = (bb){0}; one_tensor(&b, "w", 1, ne48, GGML_TYPE_Q8_0, 0);
    EXPECT_ERR(b, "tensor 'w'", "ne0 = 48", "Q8_0 block size 32");
    uint64_t ne_neg[2] = {8, 1ull << 63};
    b = (bb){0}; one_tensor(&b, "w", 2, ne_neg, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "dimension 1", "negative");
    uint64_t ne_big[3] = {1ull << 40, 1ull << 20, 1ull << 10};
    b = (bb){0}; one_tensor(&b, "w", 3, ne_big, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "overflows");
    uint64_t ne_bytes[2] = {1ull << 61, 2}; /* 2^62 elements fit int64, 2^64 bytes do not */
    b = (bb){0}; one_tensor(&b, "w", 2, ne_bytes, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "byte size overflows");
    uint64_t ne0[2] = {8, 0};
    b = (bb){0}; one_tensor(&b, "w", 2, ne0, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "tensor 'w'", "dimension 1 is 0");
    b = (bb){0}; one_tensor(&b, "", 1, ne, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "empty tensor name");
    char name64[65];
    memset(name64, 'n', 64);
    name64[64] = 0;
    b = (bb){0}; one_tensor(&b, name64, 1, ne, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "64 bytes");
    name64[63] = 0; /* 63 bytes: the longest allowed */
    b = (bb){0}; one_tensor(&b, name64, 1, ne, GGML_TYPE_F32, 0);
    char err[DSF_ERR_LEN];
    gguf_file *f = open_bb(&b, err);
    CHECKF(f && gguf_find_tensor(f, name64), "63-byte name refused: %s", err);
    gguf_close(f);
    free(b.d);
    /* An unsupported but known type loads (the loader refuses it later, by name). */
    uint64_t ne256[1] = {256};
    b = (bb){0}; one_tensor(&b, "w", 1, ne256, GGML_TYPE_IQ4_XS, 0);
    zeros(&b, 136);
    f = open_bb(&b, err);
    CHECKF(f && f->tensors[0].nbytes == 136, "IQ4_XS tensor refused: %s", err);
    gguf_close(f);
    free(b.d);
}

TEST(gguf_bad_tensor_layout) {
    bb b = {0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "b", 8, 0, GGML_TYPE_F32, 16); /* misaligned */
    pad(&b, 32); zeros(&b, 64);
    EXPECT_ERR(b, "tensor 'b'", "offset 16 is not a multiple of the alignment 32");
    b = (bb){0};
    hdr(&b, 3, 3, 0);
    tinfo(&b, "a", 16, 0, GGML_TYPE_F32, 0);  /* [0, 64) */
    tinfo(&b, "b", 8, 0, GGML_TYPE_F32, 64);  /* [64, 96) */
    tinfo(&b, "c", 8, 0, GGML_TYPE_F32, 32);  /* inside a */
    pad(&b, 32); zeros(&b, 160);
    EXPECT_ERR(b, "tensor 'c'", "overlaps tensor 'a'");
    b = (bb){0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "b", 8, 0, GGML_TYPE_F32, 0); /* same offset */
    pad(&b, 32); zeros(&b, 64);
    EXPECT_ERR(b, "tensor 'b'", "overlaps tensor 'a'");
    b = (bb){0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "b", 8, 0, GGML_TYPE_F32, 64); /* gap: gguf.cpp requires contiguity */
    pad(&b, 32); zeros(&b, 96);
    EXPECT_ERR(b, "tensor 'b'", "expected 32");
    b = (bb){0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "b", 8, 0, GGML_TYPE_F32, 32);
    pad(&b, 32); zeros(&b, 63); /* b needs [32, 64) */
    EXPECT_ERR(b, "tensor 'b'", "data [offset 32, 32 bytes] runs past the end of the file");
    b = (bb){0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0x7FFFFFFFFFFFFFE0ull);
    pad(&b, 32); zeros(&b, 32);
    EXPECT_ERR(b, "tensor 'a'");
    b = (bb){0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 32);
    pad(&b, 32); zeros(&b, 64);
    EXPECT_ERR(b, "tensor 'a'", "duplicate tensor name");
    /* data section itself past the end (infos end at a non-aligned spot, nothing follows) */
    b = (bb){0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "a", 8, 0, GGML_TYPE_F32, 0);
    EXPECT_ERR(b, "past the end");
}

/* ---------------------------------------------------------------- getters (§1.6) */

TEST(gguf_getters_strict) {
    bb b = {0};
    size_t ds, de;
    build_valid(&b, 3, &ds, &de);
    char err[DSF_ERR_LEN];
    gguf_file *f = open_bb(&b, err);
    CHECKF(f, "%s", err);
    uint32_t u = 77;
    int32_t i = 0;
    float x = 0;
    bool bo = false;
    char *s = NULL;
    CHECK(gguf_get_u32(f, "v.u32", &u, err) == 0 && u == 4000000000u);
    u = 77;
    CHECK(gguf_get_u32(f, "absent", &u, err) == 1 && u == 77);
    err[0] = 0;
    CHECK(gguf_get_u32(f, "v.i32", &u, err) == -1 && u == 77);
    CHECKF(strstr(err, "v.i32") && strstr(err, "INT32") && strstr(err, "UINT32"), "%s", err);
    CHECK(gguf_get_u32(f, "v.u64", &u, err) == -1); /* no widening or narrowing */
    CHECK(gguf_get_u32(f, "a.u32", &u, err) == -1 && strstr(err, "ARRAY"));
    CHECK(gguf_get_i32(f, "v.i32", &i, err) == 0 && i == -7);
    CHECK(gguf_get_i32(f, "v.u32", &i, err) == -1);
    CHECK(gguf_get_f32(f, "v.f32", &x, err) == 0 && x == 1.5f);
    CHECK(gguf_get_f32(f, "v.f64", &x, err) == -1 && strstr(err, "FLOAT64"));
    CHECK(gguf_get_bool(f, "v.bool", &bo, err) == 0 && bo);
    CHECK(gguf_get_bool(f, "v.u8", &bo, err) == -1);
    CHECK(gguf_get_str(f, "general.architecture", &s, err) == 0 && strcmp(s, "deepseek41") == 0);
    free(s);
    CHECK(gguf_get_str(f, "v.str_nul", &s, err) == -1 && strstr(err, "NUL"));
    CHECK(gguf_get_str(f, "v.u8", &s, err) == -1);

    uint32_t *au = NULL;
    int32_t *ai = NULL;
    uint64_t *a64 = NULL, n = 0;
    float *af = NULL;
    CHECK(gguf_get_arr_u32(f, "a.u32", &au, &n, err) == 0 && n == 3 && au[2] == 4000000000u);
    free(au);
    CHECK(gguf_get_arr_u32(f, "a.i32", &au, &n, err) == -1 && strstr(err, "negative")); /* -1 in it */
    CHECK(gguf_get_arr_i32(f, "a.i32", &ai, &n, err) == 0 && n == 3 && ai[1] == -1 && ai[2] == 7);
    free(ai);
    CHECK(gguf_get_arr_i32(f, "a.u32", &ai, &n, err) == -1 && strstr(err, "int32")); /* 4e9 */
    CHECK(gguf_get_arr_i32(f, "a.empty", &ai, &n, err) == 0 && n == 0);
    free(ai);
    CHECK(gguf_get_arr_u64(f, "a.u64", &a64, &n, err) == 0 && n == 2 && a64[0] == 8891835669103785ull &&
          a64[1] == 1ull << 63);
    free(a64);
    CHECK(gguf_get_arr_u64(f, "a.u32", &a64, &n, err) == 0 && n == 3 && a64[2] == 4000000000u);
    free(a64);
    CHECK(gguf_get_arr_u64(f, "a.i32", &a64, &n, err) == -1);
    CHECK(gguf_get_arr_u64(f, "a.f32", &a64, &n, err) == -1 && strstr(err, "FLOAT32"));
    CHECK(gguf_get_arr_f32(f, "a.f32", &af, &n, err) == 0 && n == 2 && af[0] == 0.25f && af[1] == -8.0f);
    free(af);
    CHECK(gguf_get_arr_f32(f, "a.i32", &af, &n, err) == -1);
    CHECK(gguf_get_arr_f32(f, "v.f32", &af, &n, err) == -1 && strstr(err, "array"));
    CHECK(gguf_get_arr_u32(f, "a.str", &au, &n, err) == -1 && strstr(err, "STRING"));
    CHECK(gguf_get_arr_f32(f, "absent", &af, &n, err) == 1);
    CHECK(strcmp(gguf_vtype_name(GGUF_VT_FLOAT64), "FLOAT64") == 0 && strcmp(gguf_vtype_name(13), "?") == 0);
    gguf_close(f);
    free(b.d);
}

/* Guards the hash tables: many keys and tensors, all found, none confused. */
TEST(gguf_many_entries) {
    enum { NK = 3000, NT = 2000, NV = 129280 /* the release's vocabulary */ };
    bb b = {0};
    hdr(&b, 3, NT, NK + 1);
    char name[64];
    key(&b, "tokenizer.ggml.tokens", GGUF_VT_ARRAY);
    u32(&b, GGUF_VT_STRING);
    u64(&b, NV);
    for (int i = 0; i < NV; i++) {
        snprintf(name, sizeof name, "tok%d", i);
        str(&b, name);
    }
    for (int i = 0; i < NK; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        kv_u32(&b, name, (uint32_t)i * 3);
    }
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "blk.%d.w", i);
        tinfo(&b, name, 8, 0, GGML_TYPE_F32, (uint64_t)i * 32);
    }
    pad(&b, 32);
    zeros(&b, (size_t)NT * 32);
    char err[DSF_ERR_LEN];
    gguf_file *f = open_bb(&b, err);
    CHECKF(f, "%s", err);
    for (int i = 0; i < NK; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        const gguf_kv *kv = gguf_find_kv(f, name);
        CHECKF(kv && kv->u == (uint64_t)i * 3, "%s", name);
    }
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "blk.%d.w", i);
        const gguf_tensor *tt = gguf_find_tensor(f, name);
        CHECKF(tt && tt->offset == (uint64_t)i * 32, "%s", name);
    }
    CHECK(!gguf_find_kv(f, "key.3000") && !gguf_find_tensor(f, "blk.2000.w"));
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tok && tok->arr_n == NV && tok->strs[NV - 1].len == 9 && memcmp(tok->strs[NV - 1].ptr, "tok129279", 9) == 0);
    gguf_close(f);
    free(b.d);
}

/* gguf_read_span: a span of a file-backed tensor comes back in the caller's buffer with the
 * file's bytes, blocking or not (the file was just written, so it is in the page cache);
 * spans that do not fit the buffer or lie outside the mapping, and memory-backed files, come
 * back as the mapping itself. */
TEST(gguf_read_span_rows) {
    bb b = {0};
    hdr(&b, 3, 1, 1);
    key(&b, "general.architecture", GGUF_VT_STRING);
    str(&b, "x");
    tinfo(&b, "t", 64, 4, GGML_TYPE_F32, 0);
    pad(&b, 32);
    const size_t ds = b.n;
    for (int i = 0; i < 256; i++) f32(&b, (float)i * 0.25f - 7.0f);
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/span.gguf", test_tmpdir());
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(b.d, 1, b.n, fp) == b.n && fclose(fp) == 0);
    gguf_file *f = gguf_open(path, err);
    CHECKF(f, "%s", err);
    const gguf_tensor *tt = gguf_find_tensor(f, "t");
    CHECK(tt && tt->row_bytes == 256);
    _Alignas(64) uint8_t buf[512];
    for (int nw = 0; nw < 2; nw++) {
        const uint8_t *src = tt->data + 2 * tt->row_bytes, *got = gguf_read_span(f, src, 256, buf, sizeof buf, nw);
        CHECKF(got == buf || (nw && got == NULL), "nowait %d: not read into the buffer", nw);
        if (got) CHECK(memcmp(buf, b.d + ds + 512, 256) == 0);
    }
    CHECK(gguf_read_span(f, tt->data, 256, buf, 128, false) == tt->data);         /* too long for buf */
    CHECK(gguf_read_span(f, f->map + f->size - 8, 16, buf, sizeof buf, false) == f->map + f->size - 8); /* past the end */
    gguf_close(f);
    f = gguf_open_mem(b.d, b.n, "m.gguf", err);
    CHECKF(f, "%s", err);
    tt = gguf_find_tensor(f, "t");
    CHECK(tt && gguf_read_span(f, tt->data, 256, buf, sizeof buf, true) == tt->data);
    gguf_close(f);
    remove(path);
    free(b.d);
}
