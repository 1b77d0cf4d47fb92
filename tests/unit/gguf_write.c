/* gguf_write.c: the GGUF writer (src/io/gguf_write.c) read back by the GGUF reader.
 *
 * Guards against: a writer whose offsets, padding or per-tensor byte accounting a reader
 * would refuse, and duplicate or malformed keys and tensors that it accepts. */
#include "io/gguf.h"
#include "test.h"
#include "helpers.h"
#include "base/util.h"

#include <stdint.h>
#include <string.h>

TEST(gguf_write_roundtrip) {
    const char *p = test_tmpfile("w.gguf");
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

TEST(gguf_write_byte_accounting) {
    /* A tensor given too many bytes, or too few before finish, is an error (the
     * _StreamedBytes check of gguf-layout.md §6.3), never a silently shifted file. */
    char err[DSF_ERR_LEN];
    int64_t ne[1] = {4};
    for (int mode = 0; mode < 2; mode++) {
        gguf_writer *w = gguf_writer_new();
        CHECK(gguf_writer_tensor(w, "a", 0, 1, ne, err) == 0 && gguf_writer_tensor(w, "b", 0, 1, ne, err) == 0);
        CHECK(gguf_writer_begin(w, test_tmpfile("acct.gguf"), err) == 0);
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

