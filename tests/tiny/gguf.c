/* gguf.c: the GGUF reader (src/io/gguf.c) on the tiny41 GGUF files of ../shared/testdata
 * (README "GGUF files"), plus a fixed-seed mutation loop over tiny41.gguf's header (run it
 * under `make asan` for the real check). */
#include "test.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_tiny(test_ctx *t, const char *path, uint32_t dense_type) {
    char err[DSF_ERR_LEN];
    gguf_file *f = gguf_open(path, err);
    CHECKF(f, "%s", err);
    CHECKF(f->n_kv == 66 && f->n_tensors == 222, "%llu keys, %llu tensors", (unsigned long long)f->n_kv,
           (unsigned long long)f->n_tensors);
    const gguf_tensor *x = gguf_find_tensor(f, "blk.0.ffn_gate_exps.weight");
    CHECK(x && x->type == GGML_TYPE_MXFP4 && x->n_dims == 3 && x->ne[0] == 128 && x->ne[1] == 64 && x->ne[2] == 8);
    CHECK(x->row_bytes == 4 * 17 && x->nbytes == 4 * 17 * 64 * 8);
    x = gguf_find_tensor(f, "blk.3.ffn_down_exps.weight");
    CHECK(x && x->type == GGML_TYPE_MXFP4 && x->ne[0] == 64 && x->ne[1] == 128 && x->ne[2] == 8);
    x = gguf_find_tensor(f, "per_layer_token_embd.weight");
    CHECK(x && x->type == dense_type && x->ne[0] == 32 && x->ne[1] == 1524);
    x = gguf_find_tensor(f, "blk.1.engram_gate.weight");
    CHECK(x && x->type == GGML_TYPE_F32 && x->ne[0] == 128 && x->ne[1] == 4);
    x = gguf_find_tensor(f, "blk.4.engram_kv.weight");
    CHECK(x && x->ne[0] == 192 && x->ne[1] == 640);
    x = gguf_find_tensor(f, "blk.0.ffn_gate_inp.weight");
    CHECK(x && x->type == GGML_TYPE_F32);
    x = gguf_find_tensor(f, "blk.0.hc_attn_fn.weight");
    CHECK(x && x->type == GGML_TYPE_F32 && x->ne[0] == 512 && x->ne[1] == 24);
    x = gguf_find_tensor(f, "blk.7.attn_output_a.weight");
    CHECK(x && x->type == dense_type && x->n_dims == 2 && x->ne[0] == 128 && x->ne[1] == 64);
    uint64_t *m = NULL, n = 0;
    CHECKF(gguf_get_arr_u64(f, "deepseek41.ple.layer_multipliers", &m, &n, err) == 0, "%s", err);
    static const uint64_t want[8] = {8891835669103785ull, 561584311286445ull, 4172500994694337ull,
                                     8584956959516423ull, 9544882418453959ull, 584549048184837ull,
                                     8546215579075033ull, 2199385574028885ull};
    CHECK(n == 8 && memcmp(m, want, sizeof want) == 0);
    free(m);
    CHECK(gguf_find_kv(f, "deepseek41.ple.layer_multipliers")->arr_type == GGUF_VT_UINT64);
    uint64_t *off = NULL;
    CHECK(gguf_get_arr_u64(f, "deepseek41.ple.head_offsets", &off, &n, err) == 0 && n == 12);
    CHECK(off[0] == 0 && off[1] == 101 && off[5] == 533 && off[6] == 660 && off[11] == 1367);
    free(off);
    uint32_t ft = 0;
    CHECK(gguf_get_u32(f, "general.file_type", &ft, err) == 0 && ft == 38);
    char *pre = NULL;
    CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &pre, err) == 0 && strcmp(pre, "deepseek-v3") == 0);
    free(pre);
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tok && tok->arr_type == GGUF_VT_STRING && tok->arr_n == 1024 && tok->strs);
    /* ids 0..2 are the special tokens (README "Tokenizer"). */
    CHECK(tok->strs[2].len == strlen("<｜▁pad▁｜>") && memcmp(tok->strs[2].ptr, "<｜▁pad▁｜>", tok->strs[2].len) == 0);
    /* Every tensor lies in the file and the last one ends within it. */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *ti = &f->tensors[i];
        CHECK(ti->data >= f->map + f->data_offset && ti->data + ti->nbytes <= f->map + f->size);
    }
    gguf_close(f);
}

TEST(gguf_tiny41) {
    NEED_SHARED(p, "testdata/tiny41/tiny41.gguf");
    check_tiny(t, p, GGML_TYPE_BF16);
}

TEST(gguf_tiny41_f32) {
    NEED_SHARED(p, "testdata/tiny41/tiny41-f32.gguf");
    check_tiny(t, p, GGML_TYPE_F32);
}

/* Deterministic mutation loop over the first 64 KiB of tiny41.gguf (its whole header):
 * byte flips, truncations, insertions and deletions driven by a fixed-seed PRNG. Passes if
 * nothing crashes (the forked runner reports a crash as a failure; ASan catches overreads). */
TEST(gguf_tiny41_mutations) {
    NEED_SHARED(p, "testdata/tiny41/tiny41.gguf");
    FILE *fp = fopen(p, "rb");
    CHECK(fp);
    enum { CAP = 64 * 1024 };
    uint8_t *orig = malloc(CAP);
    size_t n0 = fread(orig, 1, CAP, fp);
    fclose(fp);
    CHECK(n0 == CAP);
    uint64_t s = 0x243F6A8885A308D3ull;
#define NEXT() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    int accepted = 0;
    uint8_t *buf = malloc(CAP + 64);
    for (int it = 0; it < 3000; it++) {
        size_t n = n0;
        memcpy(buf, orig, n);
        int muts = 1 + (int)(NEXT() % 4);
        for (int k = 0; k < muts; k++) {
            uint64_t r = NEXT();
            size_t pos;
            /* Bias towards the first 1 KiB (header, counts, first keys) and the tensor infos. */
            if (r % 3 == 0) pos = (size_t)(NEXT() % 1024);
            else pos = (size_t)(NEXT() % n);
            if (pos >= n) pos = n - 1;
            switch ((r >> 8) % 6) {
            case 0: buf[pos] ^= (uint8_t)(1u << ((r >> 16) % 8)); break;          /* bit flip */
            case 1: buf[pos] = (uint8_t)(r >> 24); break;                         /* random byte */
            case 2: n = pos + 1; break;                                           /* truncate */
            case 3: if (n < CAP + 63) { memmove(buf + pos + 1, buf + pos, n - pos); buf[pos] = (uint8_t)(r >> 32); n++; } break;
            case 4: if (n > 1) { memmove(buf + pos, buf + pos + 1, n - pos - 1); n--; } break;
            default: /* a length/count field set to a huge or boundary value */
                if (pos + 8 <= n) { uint64_t v = (r >> 40) % 2 ? ~0ull >> ((r >> 44) % 64) : (r >> 48); memcpy(buf + pos, &v, 8); }
                break;
            }
        }
        uint8_t *exact = malloc(n); /* exact-size copy so ASan sees any overread */
        memcpy(exact, buf, n);
        char err[DSF_ERR_LEN] = "";
        gguf_file *f = gguf_open_mem(exact, n, "mut.gguf", err);
        if (f) {
            accepted++;
            /* Touch what the reader promises is valid. */
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const gguf_tensor *ti = &f->tensors[i];
                CHECK(gguf_find_tensor(f, ti->name) == ti);
                if (ti->nbytes) { volatile uint8_t z = ti->data[ti->nbytes - 1]; (void)z; }
            }
            for (uint64_t i = 0; i < f->n_kv; i++) CHECK(gguf_find_kv(f, f->kv[i].key) == &f->kv[i]);
            gguf_close(f);
        } else {
            CHECKF(strncmp(err, "mut.gguf: ", 10) == 0, "iteration %d: message \"%s\"", it, err);
        }
        free(exact);
    }
#undef NEXT
    free(buf);
    free(orig);
    (void)accepted;
}
