/* dspark.c: the DSpark draft in-process (src/model/dspark*.c) on tinyds.
 *
 * Guards against: a dflash loader that accepts a malformed file (missing or mis-shaped tensor,
 * wrong or missing keys, another architecture) or a draft that does not fit the main model
 * (vocab, width, target layers), or refuses the maintainers' files (dspark_load_*); target
 * features that are recorded when not asked, differ from the official code's, or change
 * under a rollback (dspark_features); round 0's intermediates (rings, final collapse, head
 * logits) off the official dump (dspark_round0_dump); a draft call that samples from
 * something other than softmax(l / tau), is not reproducible under its rng, or accepts rings
 * that do not reach p (dspark_draft_*). */
#include "golden.h"
#include "helpers.h"
#include "test.h"
#include "dsflash.h"
#include "model/dspark.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TDS "testdata/tinyds/"

/* ---- edited copies of the draft file ------------------------------------------------------ */

typedef struct {
    const char *drop_key;      /* dropped */
    const char *set_key;       /* written as UINT32 set_u32 (replacing or appended) */
    uint32_t set_u32;
    const char *arr_key;       /* written as INT32 [arr[0..2]] */
    int32_t arr[3];
    const char *tensor;        /* dropped (ne0 == 0) or reshaped to {ne0, ne1} with zero data */
    int64_t ne0, ne1;
} edit;

/* src with the edit applied, written to the temp dir as NAME; NULL on failure. */
static const char *edited(const char *src, const char *name, const edit *ed) {
    static char path[512];
    char err[DSF_ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    gguf_file *f = gguf_open(src, err);
    if (!f) return NULL;
    gguf_writer *w = gguf_writer_new();
    int rc = 0;
    bool set_done = false;
    for (uint64_t i = 0; i < f->n_kv && !rc; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (ed->drop_key && !strcmp(kv->key, ed->drop_key)) continue;
        if (ed->set_key && !strcmp(kv->key, ed->set_key)) {
            rc = gguf_writer_kv_u32(w, kv->key, ed->set_u32, err);
            set_done = true;
        } else if (ed->arr_key && !strcmp(kv->key, ed->arr_key)) {
            rc = gguf_writer_kv_arr(w, kv->key, GGUF_VT_INT32, ed->arr, 3, err);
        } else rc = gguf_writer_copy_kv(w, kv, err);
    }
    if (!rc && ed->set_key && !set_done) rc = gguf_writer_kv_u32(w, ed->set_key, ed->set_u32, err);
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (ed->tensor && !strcmp(t->name, ed->tensor)) {
            if (!ed->ne0) continue;
            int64_t ne[2] = {ed->ne0, ed->ne1};
            rc = gguf_writer_tensor(w, t->name, t->type, 2, ne, err);
        } else rc = gguf_writer_tensor(w, t->name, t->type, t->n_dims, t->ne, err);
    }
    if (!rc) rc = gguf_writer_begin(w, path, err);
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (ed->tensor && !strcmp(t->name, ed->tensor)) {
            if (!ed->ne0) continue;
            uint64_t n = (uint64_t)(ed->ne0 * ed->ne1) / ggml_blck_size(t->type) * ggml_type_size(t->type);
            uint8_t *z = calloc(n, 1);
            rc = gguf_writer_write(w, z, n, err);
            free(z);
        } else rc = gguf_writer_write(w, t->data, t->nbytes, err);
    }
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    gguf_close(f);
    return rc ? NULL : path;
}

static dsf_engine *open_main(dsf_numerics num) {
    const char *m = test_shared(TDS "tinyds.gguf");
    if (!m) return NULL;
    char err[DSF_ERR_LEN];
    return test_open_numerics(m, num, err);
}

TEST(dspark_load_files) {
    dsf_engine *e = open_main(DSF_NUMERICS_PLAIN);
    if (!e) SKIP("needs ../shared/" TDS "tinyds.gguf");
    static const char *const files[] = {TDS "tinyds-dspark.gguf", TDS "tinyds-dspark-f32.gguf"};
    for (int i = 0; i < 2; i++) {
        char err[DSF_ERR_LEN] = "";
        dsf_dspark *d = dspark_open(test_shared(files[i]), e, err);
        CHECKF(d, "%s: %s", files[i], err);
        dsf_dspark_info di;
        dspark_info(d, &di);
        /* tinyds README: 3 stages, block 5, targets [5, 6, 7], window 8, rank 16, noise 1008 */
        CHECK(di.n_stages == 3 && di.block == 5 && di.n_targets == 3 && di.window == 8 && di.markov_rank == 16);
        CHECK(di.noise == 1008 && di.targets[0] == 5 && di.targets[2] == 7 && di.feat_dim == 384);
        dspark_close(d);
    }
    dsf_engine_close(e);
}

TEST(dspark_load_refusals) {
    dsf_engine *e = open_main(DSF_NUMERICS_PLAIN);
    if (!e) SKIP("needs ../shared/" TDS "tinyds.gguf");
    const char *src = test_shared(TDS "tinyds-dspark.gguf");
    static const struct { edit ed; const char *want; } cases[] = {
        {{.drop_key = "dflash.target_layers"}, "requires 'target_layers'"},
        {{.arr_key = "dflash.target_layers", .arr = {5, 6, 8}}, "target layer 8 is outside its 8 layers"},
        {{.arr_key = "dflash.target_layers", .arr = {5, 6, 6}}, "target layer 6 is listed twice"},
        {{.set_key = "dflash.embedding_length", .set_u32 = 256}, "embedding_length 256 vs the main model's 128"},
        {{.set_key = "tokenizer.ggml.mask_token_id", .set_u32 = 5000}, "mask_token_id 5000 is outside its vocab"},
        {{.set_key = "dflash.expert_gating_func", .set_u32 = 3}, "sqrtsoftplus"},
        {{.drop_key = "dflash.block_size"}, "key not found: dflash.block_size"},
        {{.drop_key = "dflash.hyper_connection.single_pass"}, "dflash.hyper_connection.single_pass"},
        {{.tensor = "markov_w1.weight", .ne0 = 16, .ne1 = 512}, "markov_w1.weight has 512 rows, the main vocab is 1024"},
        {{.tensor = "blk.1.attn_kv.weight"}, "tensor 'blk.1.attn_kv.weight' not found"},
        {{.tensor = "fc.weight", .ne0 = 256, .ne1 = 128}, "tensor 'fc.weight' has wrong shape; expected [384, 128]"},
        {{.tensor = "conf_proj.weight", .ne0 = 128, .ne1 = 1}, "'conf_proj.weight' has wrong shape"},
    };
    char name[64], err[DSF_ERR_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(name, sizeof name, "dspark-bad-%zu.gguf", i);
        const char *p = edited(src, name, &cases[i].ed);
        CHECKF(p, "case %zu: could not write the edited file", i);
        err[0] = 0;
        dsf_dspark *d = dspark_open(p, e, err);
        CHECKF(!d && strstr(err, cases[i].want), "case %zu: %s (want '%s')", i, d ? "accepted" : err, cases[i].want);
    }
    /* the main model is no draft */
    CHECK(!dspark_open(test_shared(TDS "tinyds.gguf"), e, err) && strstr(err, "a DSpark draft is 'dflash'"));
    dsf_engine_close(e);
}

/* ---- features, round 0 ------------------------------------------------------------------- */

static float *load_gold(const char *rel, int64_t n) {
    char r[256];
    snprintf(r, sizeof r, TDS "golden/%s", rel);
    const char *p = test_shared(r);
    uint8_t *b;
    size_t len;
    char err[DSF_ERR_LEN];
    if (!p || dsf_read_file(p, &b, &len, err)) return NULL;
    if (len != (size_t)n * 4) {
        free(b);
        return NULL;
    }
    return (float *)(void *)b;
}

/* plain-spec's prompt (48 tokens; its JSON). */
static int spec_prompt(int32_t *out) {
    const char *p = test_shared(TDS "golden/plain-spec.json");
    json_t *j = p ? json_load_file(p, 0, NULL) : NULL;
    json_t *a = json_object_get(j, "prompt");
    int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < 64; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    json_decref(j);
    return n;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

TEST(dspark_features) {
    dsf_engine *e = open_main(DSF_NUMERICS_PLAIN);
    if (!e) SKIP("needs ../shared/" TDS "tinyds.gguf");
    int32_t prompt[64];
    const int n = spec_prompt(prompt);
    float *gold = load_gold("plain-spec.hidden.f32", 79 * 384);
    CHECK(n == 48 && gold);
    char err[DSF_ERR_LEN];
    dsf_session *s = dsf_session_new(e, 128, err);
    CHECK(s);
    CHECK(dsf_session_eval(s, prompt, 8, NULL, false, err) == 0);
    CHECKF(!dsf_session_feature(s, 3), "features recorded without being asked");
    const int32_t tl[3] = {5, 6, 7}, bad[2] = {6, 5};
    CHECK(dsf_session_set_features(s, bad, 2, err) < 0 && strstr(err, "out of order"));
    CHECK(dsf_session_set_features(s, tl, 3, err) == 0);
    CHECKF(!dsf_session_feature(s, 3), "a position consumed before recording started has a feature row");
    CHECK(dsf_session_rollback(s, 0, err) == 0);
    CHECK(dsf_session_eval(s, prompt, n, NULL, false, err) == 0);
    /* the official features of every prompt position (plain tolerance) */
    double worst = 0;
    for (int p = 0; p < n; p++) {
        const float *f = dsf_session_feature(s, p);
        CHECKF(f, "position %d not recorded", p);
        double d = maxdiff(f, gold + (size_t)p * 384, 384);
        if (d > worst) worst = d;
    }
    CHECKF(worst <= 1e-3, "features off by %.3g", worst);
    CHECK(!dsf_session_feature(s, n));
    /* a rollback and a re-evaluation in another chunking give the same rows */
    float keep[384];
    memcpy(keep, dsf_session_feature(s, 40), sizeof keep);
    CHECK(dsf_session_rollback(s, 30, err) == 0);
    for (int p = 30; p < n; p++) CHECK(dsf_session_eval(s, prompt + p, 1, NULL, false, err) == 0);
    CHECKF(maxdiff(keep, dsf_session_feature(s, 40), 384) <= 1e-5, "a rollback changed position 40's features");
    /* a snapshot does not carry the features: restored positions have none */
    uint8_t *snap;
    size_t snap_len;
    CHECK(dsf_session_save(s, &snap, &snap_len, err) == 0 && dsf_session_restore(s, snap, snap_len, err) == 0);
    free(snap);
    CHECKF(!dsf_session_feature(s, 40), "a restored position reports a feature row");
    CHECK(dsf_session_set_features(s, NULL, 0, err) == 0 && !dsf_session_feature(s, 3));
    free(gold);
    dsf_session_free(s);
    dsf_engine_close(e);
}

/* A main engine, a draft and a sequence whose rings hold plain-spec's prompt. */
typedef struct {
    dsf_engine *e;
    dsf_dspark *d;
    dsf_dspark_seq *q;
    dsf_session *s;
} rig;

static int rig_open(rig *r, char *err) {
    memset(r, 0, sizeof *r);
    int32_t prompt[64];
    const int n = spec_prompt(prompt);
    if (!(r->e = open_main(DSF_NUMERICS_PLAIN)) || n != 48) return -1;
    if (!(r->d = dspark_open(test_shared(TDS "tinyds-dspark.gguf"), r->e, err)) || !(r->q = dspark_seq_new(r->d, err)) ||
        !(r->s = dsf_session_new(r->e, 128, err)))
        return -1;
    const int32_t tl[3] = {5, 6, 7};
    if (dsf_session_set_features(r->s, tl, 3, err) || dsf_session_eval(r->s, prompt, n, NULL, false, err)) return -1;
    for (int p = 0; p < n; p++) dspark_seq_commit(r->q, dsf_session_feature(r->s, p), p, 1);
    return 0;
}

/* The rig's prologue in a TEST: skips without ../shared/NEED, fails if it does not open. */
#define RIG_OPEN(r, err, need)                                                              \
    rig r;                                                                                  \
    char err[DSF_ERR_LEN] = "";                                                             \
    if (!test_shared(need)) SKIP("needs ../shared/%s", need);                               \
    CHECKF(rig_open(&r, err) == 0, "%s", err)

static void rig_close(rig *r) {
    dsf_session_free(r->s);
    dspark_seq_free(r->q);
    dspark_close(r->d);
    dsf_engine_close(r->e);
}

TEST(dspark_round0_dump) {
    RIG_OPEN(r, err, TDS "golden/plain-spec.dump/index.json");
    int32_t ids[5];
    CHECK(dspark_draft(r.q, 47, 744, 5, 0.0f, NULL, ids, NULL, NULL, NULL, err) == 5); /* round 0: p 47, anchor 744 */
    const int32_t want[5] = {425, 471, 482, 7, 513};
    CHECK(!memcmp(ids, want, sizeof want));
    float *xc = load_gold("plain-spec.dump/hc_out.f32", 5 * 128), *hl = load_gold("plain-spec.dump/head_logits.f32", 5 * 1024);
    CHECK(xc && hl);
    CHECKF(maxdiff(xc, dspark_last_xc(r.q), 5 * 128) <= 1e-3, "hc_out off by %.3g", maxdiff(xc, dspark_last_xc(r.q), 640));
    CHECKF(maxdiff(hl, dspark_last_base(r.q), 5 * 1024) <= 1e-3, "head_logits off");
    /* every stage's ring: slot s holds position 40 + s (ring_slot_positions: 40..47 at slots 0..7) */
    for (int st = 0; st < 3; st++) {
        char f[64];
        snprintf(f, sizeof f, "plain-spec.dump/S%d.ring.f32", st);
        float *ring = load_gold(f, 8 * 64);
        CHECK(ring);
        for (int slot = 0; slot < 8; slot++) {
            const float *mine = dspark_ring_entry(r.q, st, 40 + slot);
            CHECKF(mine && maxdiff(mine, ring + slot * 64, 64) <= 1e-3, "stage %d ring slot %d", st, slot);
        }
        free(ring);
    }
    free(xc);
    free(hl);
    rig_close(&r);
}

/* tau > 0: the returned q rows are softmax(l / tau), each id is a draw the rng reproduces, and
 * the chain conditions on the drawn token (row i+1's logits depend on ids[i] only). */
TEST(dspark_draft_sampling) {
    RIG_OPEN(r, err, TDS "tinyds-dspark.gguf");
    const int64_t V = 1024;
    float *l = malloc(5 * V * sizeof(float)), *q = malloc(5 * V * sizeof(float)), *l2 = malloc(5 * V * sizeof(float));
    int32_t ids[5], ids2[5], g[5];
    uint64_t rng = 42, rng2 = 42;
    CHECK(dspark_draft(r.q, 47, 744, 5, 1.5f, &rng, ids, l, q, NULL, err) == 5);
    CHECK(dspark_draft(r.q, 47, 744, 5, 1.5f, &rng2, ids2, l2, NULL, NULL, err) == 5);
    CHECK(!memcmp(ids, ids2, sizeof ids) && rng == rng2 && rng != 42);
    for (int i = 0; i < 5; i++) {
        double m = -1e30, sum = 0, worst = 0;
        for (int64_t v = 0; v < V; v++) m = fmax(m, l[i * V + v]);
        for (int64_t v = 0; v < V; v++) sum += exp((l[i * V + v] - m) / 1.5);
        for (int64_t v = 0; v < V; v++) worst = fmax(worst, fabs(q[i * V + v] - exp((l[i * V + v] - m) / 1.5) / sum));
        CHECKF(worst <= 1e-6, "row %d: q is not softmax(l / tau) (%.3g)", i, worst);
        CHECKF(q[i * V + ids[i]] > 0, "row %d drew a token of probability 0", i);
    }
    /* greedy from the same rings: row 0 is the same (anchor-conditioned); a later row equals the
     * sampled run's exactly when the previous tokens agree */
    CHECK(dspark_draft(r.q, 47, 744, 5, 0.0f, NULL, g, l2, NULL, NULL, err) == 5);
    CHECK(maxdiff(l, l2, V) == 0);
    if (g[0] != ids[0]) CHECK(maxdiff(l + V, l2 + V, V) > 0);
    float *bufs[3] = {l, q, l2};
    for (int i = 0; i < 3; i++) free(bufs[i]);
    rig_close(&r);
}

TEST(dspark_draft_errors) {
    RIG_OPEN(r, err, TDS "tinyds-dspark.gguf");
    int32_t ids[8];
    CHECK(dspark_draft(r.q, 48, 744, 5, 0.0f, NULL, ids, NULL, NULL, NULL, err) < 0 && strstr(err, "rings hold positions 40..47"));
    CHECK(dspark_draft(r.q, 47, 744, 6, 0.0f, NULL, ids, NULL, NULL, NULL, err) < 0 && strstr(err, "at most 5"));
    CHECK(dspark_draft(r.q, 47, 4096, 5, 0.0f, NULL, ids, NULL, NULL, NULL, err) < 0 && strstr(err, "vocabulary"));
    CHECK(dspark_draft(r.q, 47, 744, 5, 1.0f, NULL, ids, NULL, NULL, NULL, err) < 0 && strstr(err, "rng"));
    /* a rollback below the rings' end drops what later positions overwrote */
    dspark_seq_reset(r.q, 45);
    int64_t lo, hi;
    dspark_seq_range(r.q, &lo, &hi);
    CHECK(hi == 45 && lo == 40);
    CHECK(dspark_draft(r.q, 44, 744, 5, 0.0f, NULL, ids, NULL, NULL, NULL, err) < 0 && strstr(err, "needs 37..44"));
    rig_close(&r);
}
