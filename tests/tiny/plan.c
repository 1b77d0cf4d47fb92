/* plan.c: the memory plan of a model from its header (model/plan.h; dsflash inspect --plan).
 * Guards against: class bytes that do not add up to the file's tensors, the two tables read by
 * row counted as resident (or the reverse), a KV figure that drifts from what kvcache.c really
 * allocates, and a header-only file that gguf_open_header refuses or reads differently from
 * the whole file. */
#include "test.h"
#include "helpers.h"
#include "model/plan.h"
#include "model/session.h"
#include "io/gguf.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(plan_adds_up_and_matches_kvcache) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    uint64_t all = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) all += g->tensors[i].nbytes;
    const uint64_t rows = gguf_find_tensor(g, "token_embd.weight")->nbytes +
                          gguf_find_tensor(g, "per_layer_token_embd.weight")->nbytes;
    dsf_shape s;
    CHECKF(shape_load(&s, g, err) == 0, "%s", err);
    static const int64_t ctxs[][2] = {{100, 512}, {4096, 512}, {10000, 64}, {1, 1}};
    for (int k = 0; k < 4; k++) {
        model_plan_t p;
        CHECKF(model_plan(g, ctxs[k][0], ctxs[k][1], &p, err) == 0, "%s", err);
        uint64_t sum = 0;
        for (int c = 0; c < TC_COUNT; c++) sum += p.class_bytes[c];
        CHECK(sum == all && p.total == all && p.by_row == rows && p.resident == all - rows);
        CHECK(p.class_bytes[TC_ROUTED] == 24 * gguf_find_tensor(g, "blk.0.ffn_up_exps.weight")->nbytes);
        for (int m = 0; m < 2; m++) {
            dsf_kvstate kv;
            size_t bytes = 0;
            CHECKF(kv_init(&kv, &s, ctxs[k][0], ctxs[k][1], m == DSF_NUMERICS_REFERENCE, &bytes, err) == 0, "%s", err);
            CHECK(kv.packed == (m == DSF_NUMERICS_REFERENCE) && p.kv_packed[m] == kv.packed);
            kv_free(&kv, &s);
            CHECKF(p.kv_bytes[m] == bytes, "mode %d ctx %lld chunk %lld: plan %llu, kv_init %zu", m,
                   (long long)ctxs[k][0], (long long)ctxs[k][1], (unsigned long long)p.kv_bytes[m], bytes);
        }
    }
    shape_free(&s);
    gguf_close(g);
}

TEST(plan_reads_a_header_only_file) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN], path[512];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    model_plan_t whole, head;
    CHECKF(model_plan(g, 4096, 512, &whole, err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/plan-header.gguf", test_tmpdir());
    CHECK(test_copy_head(model, g->data_offset, path) == 0);
    gguf_close(g);
    g = gguf_open(path, err); /* a model that runs needs its data */
    CHECKF(!g && strstr(err, "runs past the end of the file"), "%s", g ? "accepted" : err);
    g = gguf_open_header(path, err);
    CHECKF(g, "%s", err);
    for (uint64_t i = 0; i < g->n_tensors; i++) CHECK(g->tensors[i].data == NULL);
    CHECKF(model_plan(g, 4096, 512, &head, err) == 0, "%s", err);
    CHECK(memcmp(&whole, &head, sizeof whole) == 0);
    gguf_close(g);
}

TEST(plan_chunk_sizing) {
    /* kvcache.c's chunk sizing: scratch_bytes counts what scratch_init allocates, chunk_bytes is
     * that plus the chunk's rows in the window rings (what kv_init adds per chunk token), and
     * chunk_auto follows its rule (dsflash.h, dsf_engine_params.ubatch): the smallest power of
     * two from 512 to 8192 giving each routed expert 32 tokens on average, halved (not below
     * 512) while chunk_bytes exceeds 1/16 of the RAM */
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    dsf_shape s;
    CHECKF(shape_load(&s, g, err) == 0, "%s", err);
    static const int64_t tc[][2] = {{1, 64}, {7, 100}, {512, 4096}, {2048, 2048}};
    for (int k = 0; k < 4; k++)
        for (int packed = 0; packed < 2; packed++) {
            dsf_scratch sc;
            size_t bytes = 0;
            CHECK(scratch_init(&sc, &s, tc[k][0], tc[k][1], packed, &bytes) == 0);
            scratch_free(&sc);
            CHECKF(scratch_bytes(&s, tc[k][0], tc[k][1], packed) == bytes, "T %lld ctx %lld packed %d: %zu != %zu",
                   (long long)tc[k][0], (long long)tc[k][1], packed, scratch_bytes(&s, tc[k][0], tc[k][1], packed),
                   bytes);
        }
    for (int packed = 0; packed < 2; packed++) {
        const int64_t c = 1024, ctx = 1 << 16; /* a ring of window + chunk + margin rows, below ctx */
        dsf_kvstate kv;
        size_t with = 0, without = 0, sb = 0;
        CHECKF(kv_init(&kv, &s, ctx, c, packed, &with, err) == 0, "%s", err);
        kv_free(&kv, &s);
        CHECKF(kv_init(&kv, &s, ctx, 0, packed, &without, err) == 0, "%s", err);
        kv_free(&kv, &s);
        dsf_scratch sc;
        CHECK(scratch_init(&sc, &s, c, c, packed, &sb) == 0);
        scratch_free(&sc);
        CHECKF(chunk_bytes(&s, c, packed) == sb + (with - without), "packed %d: %zu != %zu + %zu", packed,
               chunk_bytes(&s, c, packed), sb, with - without);
    }
    /* the expert counts of other shapes: the released 384 top-6, the bench preset's 32 top-6 */
    static const int64_t ex[][3] = {{384, 6, 2048}, {32, 6, 512}, {384, 8, 2048}, {256, 8, 1024},
                                    {4096, 1, 8192}, {1, 1, 512}, {0, 0, 512}};
    for (int k = 0; k < 7; k++) {
        dsf_shape x = s;
        x.n_expert = ex[k][0];
        x.n_expert_used = ex[k][1];
        CHECKF(chunk_auto(&x, 1, 0) == ex[k][2], "%lld experts top-%lld: %lld, want %lld", (long long)ex[k][0],
               (long long)ex[k][1], (long long)chunk_auto(&x, 1, 0), (long long)ex[k][2]);
    }
    dsf_shape x = s;
    x.n_expert = 384;
    x.n_expert_used = 6;
    const double c1k = (double)chunk_bytes(&x, 1024, 1), c2k = (double)chunk_bytes(&x, 2048, 1);
    CHECK(chunk_auto(&x, 1, 16 * c2k) == 2048 && chunk_auto(&x, 1, 16 * c2k - 1) == 1024);
    CHECK(chunk_auto(&x, 1, 16 * c1k) == 1024 && chunk_auto(&x, 1, 16 * c1k - 1) == 512 && chunk_auto(&x, 1, 1) == 512);
    shape_free(&s);
    gguf_close(g);
}
