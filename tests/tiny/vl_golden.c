/* vl_golden.c: the text side of image prompts against the official reference's goldens
 * (../shared/testdata/tinyvl, read its README; spec vision.md §5-§8): every case's prompt is
 * expanded by dsf_mm_expand from CASE.json's prompt_ids and the golden image blocks (the fp32
 * tower's IMAGE.block.f32; the contract case the bf16 tower's), its tokens and types must equal
 * the reference's, and dsf_session_eval_media (prefill_len tokens, then single steps) must
 * give the golden logits. Plus: splitting the prompt anywhere (also inside a span), rollback
 * into the span, snapshots mid-span and after it, the refusal on a model without bias_vl, the
 * loader's all-or-none rule for bias_vl, and media prefill's prefix reuse by keys.
 * The blocks come from the goldens, not from dsf_vision_encode (tests/e2e/vl_logits.c runs
 * the whole path). Skips cleanly when ../shared/testdata is absent. */
#include "dsflash.h"
#include "test.h"

#include "golden.h"
#include "helpers.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VDIR "testdata/tinyvl/"
#define VL_MAX_IMAGES 4

typedef struct {
    int32_t *prompt; /* prompt_ids */
    int n_prompt;
    int32_t *tokens; /* the reference's expanded prompt */
    int8_t *types;
    int n, vocab, prefill_len, image_token;
    float *gold; /* [n][vocab] */
    dsf_image images[VL_MAX_IMAGES];
    int n_images;
} vl_case;

static void vl_free(vl_case *c) {
    free(c->prompt);
    free(c->tokens);
    free(c->types);
    free(c->gold);
    for (int i = 0; i < c->n_images; i++) free(c->images[i].block);
    memset(c, 0, sizeof *c);
}

static float *read_f32(const char *rel, size_t count) {
    const char *p = test_shared(rel);
    FILE *f = p ? fopen(p, "rb") : NULL;
    if (!f) return NULL;
    float *x = malloc(count * sizeof(float));
    size_t got = fread(x, sizeof(float), count, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != count || extra != EOF) {
        free(x);
        return NULL;
    }
    return x;
}

static int32_t *json_ints(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof(int32_t));
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* The image of images.json whose PNG is `png` (a case's image_files entry) under the token cap
 * `cap`, filled from its plan and its block file (`kind`: "block" or "block-bf16"). */
static int load_image(json_t *imgs, const char *png, int cap, const char *kind, dsf_image *im) {
    const char *base = strrchr(png, '/') ? strrchr(png, '/') + 1 : png;
    const char *key;
    json_t *v;
    json_object_foreach(imgs, key, v) {
        if (strcmp(json_string_value(json_object_get(v, "png")), base) != 0 ||
            json_integer_value(json_object_get(v, "max_image_tokens")) != cap)
            continue;
        json_t *p = json_object_get(v, "plan");
        memset(im, 0, sizeof *im);
#define PI(f) im->plan.f = (int)json_integer_value(json_object_get(p, #f))
        PI(best_w), PI(best_h), PI(n_vit_w), PI(n_vit_h), PI(n_llm_w), PI(n_llm_h), PI(n_tokens);
        PI(resized_w), PI(resized_h), PI(off_x), PI(off_y);
#undef PI
        im->plan.width = (int)json_integer_value(json_object_get(v, "width"));
        im->plan.height = (int)json_integer_value(json_object_get(v, "height"));
        im->n_embd = 128; /* the README: image block width = text hidden 128 */
        char rel[256];
        snprintf(rel, sizeof rel, VDIR "golden/%s.%s.f32", key, kind);
        im->block = read_f32(rel, (size_t)im->plan.n_tokens * 128);
        /* a key per image: its name and cap (distinct images, distinct keys) */
        uint64_t h = 1469598103934665603ull;
        for (const char *s = key; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
        im->key = (h ^ (uint64_t)cap) | 1;
        return im->block ? 0 : -1;
    }
    return -1;
}

static int vl_load(const char *name, vl_case *c) {
    memset(c, 0, sizeof *c);
    char rel[256];
    snprintf(rel, sizeof rel, VDIR "golden/%s.json", name);
    const char *p = test_shared(rel);
    const char *pi = test_shared(VDIR "golden/images.json");
    if (!p || !pi) return -1;
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je), *imgs = json_load_file(pi, 0, &je);
    int rc = -1;
    if (!j || !imgs) goto out;
    c->prompt = json_ints(json_object_get(j, "prompt_ids"), &c->n_prompt);
    c->tokens = json_ints(json_object_get(j, "tokens"), &c->n);
    int nt;
    int32_t *ty = json_ints(json_object_get(j, "token_types"), &nt);
    c->types = malloc((size_t)nt);
    for (int i = 0; i < nt; i++) c->types[i] = (int8_t)ty[i];
    free(ty);
    c->vocab = (int)json_integer_value(json_object_get(j, "vocab"));
    c->prefill_len = (int)json_integer_value(json_object_get(j, "prefill_len"));
    c->image_token = (int)json_integer_value(json_object_get(j, "image_token_id"));
    const int cap = (int)json_integer_value(json_object_get(j, "max_image_tokens"));
    const bool contract = !strcmp(json_string_value(json_object_get(j, "mode")), "contract");
    json_t *files = json_object_get(j, "image_files");
    if (nt != c->n || json_array_size(files) > VL_MAX_IMAGES) goto out;
    for (size_t i = 0; i < json_array_size(files); i++, c->n_images++)
        if (load_image(imgs, json_string_value(json_array_get(files, i)), cap, contract ? "block-bf16" : "block",
                       &c->images[i]) < 0)
            goto out;
    snprintf(rel, sizeof rel, VDIR "golden/%s.f32", name);
    c->gold = read_f32(rel, (size_t)c->n * (size_t)c->vocab);
    rc = c->gold ? 0 : -1;
out:
    json_decref(j);
    json_decref(imgs);
    if (rc < 0) vl_free(c);
    return rc;
}

static dsf_engine *vl_open(const char *file, dsf_numerics num, test_ctx *t) {
    char rel[256], err[DSF_ERR_LEN];
    snprintf(rel, sizeof rel, "testdata/%s", file);
    const char *p = test_shared(rel);
    dsf_engine *e = p ? test_open_numerics(p, num, err) : NULL;
    if (p && !e) test_fail(t, __FILE__, __LINE__, "open %s: %s", file, err);
    return e;
}

/* The sub-view of media m for positions [i, i + n) (span rows start at the spans before i). */
static dsf_media sub_media(const dsf_mm_prompt *mp, int i) {
    dsf_media m = dsf_mm_media(mp);
    int64_t r = 0;
    for (int k = 0; k < i; k++) r += mp->types[k] >= 0;
    m.types += i;
    m.keys += i;
    if (m.embd) m.embd += r * mp->n_embd;
    return m;
}

/* Evaluates positions [0, n) of mp into s in pieces: the first `first` tokens in one call,
 * then pieces of `step` tokens; all rows of logits into lg (NULL: none). -1 with err. */
static int eval_pieces(dsf_session *s, const dsf_mm_prompt *mp, int from, int n, int first, int step, float *lg,
                       int V, char *err) {
    for (int i = from; i < n;) {
        int c = i == from && first > 0 ? first : step;
        if (c > n - i) c = n - i;
        dsf_media m = sub_media(mp, i);
        if (dsf_session_eval_media(s, mp->tokens + i, &m, c, lg ? lg + (size_t)i * V : NULL, true, err) < 0)
            return -1;
        i += c;
    }
    return 0;
}

/* Expands the case's prompt and checks it against the reference's tokens and types. */
static int expand_case(test_ctx *t, const char *name, const vl_case *c, dsf_mm_prompt *mp) {
    char err[DSF_ERR_LEN];
    if (dsf_mm_expand(c->prompt, c->n_prompt, c->image_token, c->images, c->n_images, mp, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "%s: expand: %s", name, err);
        return -1;
    }
    if (mp->n != c->n || memcmp(mp->tokens, c->tokens, (size_t)c->n * sizeof(int32_t)) ||
        memcmp(mp->types, c->types, (size_t)c->n)) {
        test_fail(t, __FILE__, __LINE__, "%s: the expanded prompt (%d tokens) differs from the reference's (%d)", name,
                  mp->n, c->n);
        return -1;
    }
    return 0;
}

/* One case: prefill_len tokens in one forward, the rest one per step, against the golden rows
 * with the README's preset (plain: every row within 1e-3, mean <= 1e-4, top-1 100 %;
 * contract: mean <= 0.5, top-1 >= 35 %). */
static void vl_case_run(test_ctx *t, const char *name) {
    vl_case c;
    if (vl_load(name, &c) < 0) SKIP("needs ../shared/" VDIR "golden/%s.* and images.json", name);
    const bool contract = strstr(name, "contract") != NULL;
    dsf_engine *e = vl_open("tinyvl/tinyvl.gguf", contract ? DSF_NUMERICS_REFERENCE : DSF_NUMERICS_PLAIN, t);
    dsf_mm_prompt mp = {0};
    float *lg = NULL;
    dsf_session *s = NULL;
    char err[DSF_ERR_LEN];
    if (!e || expand_case(t, name, &c, &mp) < 0) goto out;
    s = dsf_session_new(e, c.n + 8, err);
    lg = malloc((size_t)c.n * (size_t)c.vocab * sizeof(float));
    if (eval_pieces(s, &mp, 0, c.n, c.prefill_len, 1, lg, c.vocab, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "%s: eval: %s", name, err);
        goto out;
    }
    cmp_stats st = golden_compare(lg, c.gold, c.n, c.vocab, 1e-3);
    if (!contract && !(st.bad_rows == 0 && st.mean_abs <= 1e-4 && st.top1_miss == 0))
        test_fail(t, __FILE__, __LINE__, "%s: max %.3g mean %.3g bad rows %d top-1 misses %d", name, st.max_abs,
                  st.mean_abs, st.bad_rows, st.top1_miss);
    if (contract && !(st.mean_abs <= 0.5 && st.top1_miss <= c.n - (int)ceil(0.35 * c.n)))
        test_fail(t, __FILE__, __LINE__, "%s: mean %.3g top-1 misses %d/%d", name, st.mean_abs, st.top1_miss, c.n);
out:
    free(lg);
    dsf_session_free(s);
    dsf_mm_prompt_free(&mp);
    dsf_engine_close(e);
    vl_free(&c);
}

/* Guards against: a wrong span layout or substitution, bias instead of bias_vl, image
 * positions hashed or gated like text in Engram (README "What typical mistakes cost"). */
TEST(vl_golden_grad_plain) { vl_case_run(t, "grad-plain"); }
/* Guards against: decode steps after a span that lose its Engram DEAD marks or its state. */
TEST(vl_golden_grad_decode) { vl_case_run(t, "grad-decode"); }
TEST(vl_golden_wide_plain) { vl_case_run(t, "wide-plain"); }
TEST(vl_golden_tall_plain) { vl_case_run(t, "tall-plain"); }
TEST(vl_golden_tiny_plain) { vl_case_run(t, "tiny-plain"); }
/* Guards against: a span right after <|User|> (Engram look-back into a span at its start). */
TEST(vl_golden_cap20_plain) { vl_case_run(t, "cap20-plain"); }
/* Guards against: a second span's rows taken from the first, or keys/rows misaligned. */
TEST(vl_golden_two_plain) { vl_case_run(t, "two-plain"); }
/* Reference numerics with the bf16 tower's block: a smoke test (README). */
TEST(vl_golden_grad_contract) { vl_case_run(t, "grad-contract"); }

/* The plain engine and grad-plain's expanded prompt, or a skip. */
typedef struct {
    vl_case c;
    dsf_engine *e;
    dsf_mm_prompt mp;
    float *ref; /* [n][V]: one prefill */
} vl_fix;

static int fix_open(test_ctx *t, vl_fix *x) {
    memset(x, 0, sizeof *x);
    if (vl_load("grad-plain", &x->c) < 0) {
        test_skip(t, "needs ../shared/" VDIR "golden/grad-plain.*");
        return -1;
    }
    x->e = vl_open("tinyvl/tinyvl.gguf", DSF_NUMERICS_PLAIN, t);
    if (!x->e || expand_case(t, "grad-plain", &x->c, &x->mp) < 0) return -1;
    char err[DSF_ERR_LEN];
    dsf_session *s = dsf_session_new(x->e, x->c.n + 8, err);
    x->ref = malloc((size_t)x->c.n * (size_t)x->c.vocab * sizeof(float));
    int rc = eval_pieces(s, &x->mp, 0, x->c.n, x->c.n, 1, x->ref, x->c.vocab, err);
    dsf_session_free(s);
    if (rc < 0) test_fail(t, __FILE__, __LINE__, "one prefill: %s", err);
    return rc;
}

/* A fresh session with positions [0, n) evaluated (first, then pieces of step), every row
 * into lg; NULL with err. */
static dsf_session *eval_fresh(const vl_fix *x, int first, int step, float *lg, char *err) {
    dsf_session *s = dsf_session_new(x->e, x->c.n + 8, err);
    if (s && eval_pieces(s, &x->mp, 0, x->c.n, first, step, lg, x->c.vocab, err) < 0) {
        dsf_session_free(s);
        return NULL;
    }
    return s;
}

/* Whether rows [from, n) of lg are the one-prefill rows, bit for bit. */
static bool same_rows(const vl_fix *x, const float *lg, int from) {
    const size_t V = (size_t)x->c.vocab;
    return !memcmp(lg + from * V, x->ref + from * V, (size_t)(x->c.n - from) * V * sizeof(float));
}

static void fix_close(vl_fix *x) {
    free(x->ref);
    dsf_mm_prompt_free(&x->mp);
    dsf_engine_close(x->e);
    vl_free(&x->c);
}

/* Guards against: per-batch decisions (bias, Engram) or span rows taken from the wrong offset
 * when a chunk starts or ends inside a span (vision.md §8: any split gives the same logits).
 * Bit for bit: every operation is per position. */
TEST(vl_golden_splits) {
    vl_fix x;
    if (fix_open(t, &x) < 0) goto out;
    const int n = x.c.n, V = x.c.vocab;
    float *lg = malloc((size_t)n * V * sizeof(float));
    char err[DSF_ERR_LEN];
    static const int steps[] = {1, 5, 17, 20};
    for (int k = 0; k < 4 && !t->failed; k++) {
        dsf_session *s = eval_fresh(&x, steps[k], steps[k], lg, err);
        CHECKF(s, "chunks of %d: %s", steps[k], err);
        dsf_session_free(s);
        CHECKF(same_rows(&x, lg, 0), "chunks of %d differ from one prefill", steps[k]);
    }
    free(lg);
out:
    fix_close(&x);
}

/* Rollback to each of Ks after one prefill, then the rest again: the one-prefill rows and the
 * prompt's keys. */
static void rollback_all(test_ctx *t, const vl_fix *x, float *lg, const char *mname) {
    static const int Ks[] = {20, 14, 15, 30, 31, 40, 3, 0};
    const int n = x->c.n;
    char err[DSF_ERR_LEN] = "";
    for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++) {
        dsf_session *s = eval_fresh(x, n, n, lg, err);
        bool ok = s && dsf_session_rollback(s, Ks[k], err) == 0 &&
                  eval_pieces(s, &x->mp, Ks[k], n, n, n, lg, x->c.vocab, err) == 0;
        bool keys = ok && !memcmp(dsf_session_keys(s), x->mp.keys, (size_t)n * sizeof(uint64_t));
        dsf_session_free(s);
        CHECKF(ok, "margin %s rollback to %d: %s", mname, Ks[k], err);
        CHECKF(same_rows(x, lg, 0), "margin %s: rollback to %d and re-eval differs", mname, Ks[k]);
        CHECKF(keys, "rollback to %d: the session's keys differ from the prompt's", Ks[k]);
    }
}

/* Guards against: a rollback into a span (or a re-prefill from the history past the window
 * ring, through the span) that loses the span's types, rows or keys. Bit for bit. The default
 * ring keeps the span; DSF_ROLLBACK_MARGIN=0 with chunks of 4 holds window + 4 rows, so a
 * rollback re-prefills from the history. */
TEST(vl_golden_rollback) {
    vl_fix x;
    if (fix_open(t, &x) == 0) {
        float *lg = malloc((size_t)x.c.n * (size_t)x.c.vocab * sizeof(float));
        rollback_all(t, &x, lg, "default");
        setenv("DSF_ROLLBACK_MARGIN", "0", 1);
        setenv("DSF_CHUNK", "4", 1);
        if (!t->failed) rollback_all(t, &x, lg, "0");
        unsetenv("DSF_ROLLBACK_MARGIN");
        unsetenv("DSF_CHUNK");
        free(lg);
    }
    fix_close(&x);
}

/* A snapshot after `at` tokens restored into a new session, the rest evaluated there, then a
 * rollback to 10 and the rest again: the one-prefill rows each time. */
static void snapshot_at(test_ctx *t, const vl_fix *x, int at, float *lg) {
    const int n = x->c.n, V = x->c.vocab;
    char err[DSF_ERR_LEN] = "";
    dsf_session *a = dsf_session_new(x->e, n + 8, err), *b = dsf_session_new(x->e, n + 8, err);
    uint8_t *snap = NULL;
    size_t len = 0;
    bool ok = eval_pieces(a, &x->mp, 0, at, at, n, lg, V, err) == 0 && dsf_session_save(a, &snap, &len, err) == 0 &&
              dsf_session_restore(b, snap, len, err) == 0 && eval_pieces(b, &x->mp, at, n, n, n, lg, V, err) == 0;
    bool same = ok && same_rows(x, lg, at);
    bool back = same && dsf_session_rollback(b, 10, err) == 0 && eval_pieces(b, &x->mp, 10, n, n, n, lg, V, err) == 0 &&
                same_rows(x, lg, 10);
    free(snap);
    dsf_session_free(a);
    dsf_session_free(b);
    CHECKF(ok, "snapshot at %d: %s", at, err);
    CHECKF(same, "restored at %d: the rows after it differ", at);
    CHECKF(back, "restored at %d, rolled back to 10: differs (%s)", at, err);
}

/* Guards against: a snapshot that drops the span marks, keys or rows: restoring it mid-span
 * or after the span must continue with the same logits, and a later rollback through the
 * span (re-prefill from the restored history, small ring) too. Bit for bit. */
TEST(vl_golden_snapshot) {
    vl_fix x;
    if (fix_open(t, &x) == 0) {
        float *lg = malloc((size_t)x.c.n * (size_t)x.c.vocab * sizeof(float));
        setenv("DSF_ROLLBACK_MARGIN", "0", 1);
        setenv("DSF_CHUNK", "4", 1);
        static const int at[] = {20, 31, 40};
        for (int k = 0; k < 3 && !t->failed; k++) snapshot_at(t, &x, at[k], lg);
        unsetenv("DSF_ROLLBACK_MARGIN");
        unsetenv("DSF_CHUNK");
        free(lg);
    }
    fix_close(&x);
}

static uint64_t fnv(const uint8_t *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Guards against: the version 5 format refusing the version 4 snapshots already on disk (a
 * text session's prefix cache). The version 4 image of a text snapshot is the version 5 one
 * without the span count (8 bytes after the token ids); it must restore to the same logits.
 * A version 5 snapshot with spans must be refused by a model without bias_vl. */
TEST(vl_golden_snapshot_versions) {
    vl_fix x;
    if (fix_open(t, &x) < 0) goto out;
    const int V = x.c.vocab, n = 10; /* text only: the first 10 tokens precede the span */
    char err[DSF_ERR_LEN];
    dsf_session *a = dsf_session_new(x.e, 64, err), *b = dsf_session_new(x.e, 64, err);
    uint8_t *snap = NULL;
    size_t len = 0;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    int32_t next = 42;
    CHECK(dsf_session_eval(a, x.mp.tokens, n, NULL, false, err) == 0 && dsf_session_save(a, &snap, &len, err) == 0);
    /* header: magic[8], version u32 (at 8) ... 72 bytes; then n token ids, then the count */
    const size_t hdr = 72, cnt = hdr + (size_t)n * 4;
    uint32_t ver;
    memcpy(&ver, snap + 8, 4);
    CHECKF(ver == 5, "snapshot version %u (want 5)", ver);
    uint8_t *old = malloc(len - 8);
    memcpy(old, snap, cnt);
    memcpy(old + cnt, snap + cnt + 8, len - cnt - 8);
    ver = 4;
    memcpy(old + 8, &ver, 4);
    uint64_t sum = fnv(old, len - 16);
    memcpy(old + len - 16, &sum, 8);
    CHECKF(dsf_session_restore(b, old, len - 8, err) == 0, "version 4 snapshot refused: %s", err);
    CHECK(dsf_session_eval(a, &next, 1, la, false, err) == 0 && dsf_session_eval(b, &next, 1, lb, false, err) == 0);
    CHECKF(!memcmp(la, lb, (size_t)V * sizeof(float)), "version 4 snapshot restores to other logits");
    free(old);
    free(snap);
    /* spans into a model without bias_vl */
    dsf_engine *e41 = vl_open("tiny41/tiny41.gguf", DSF_NUMERICS_PLAIN, t);
    if (e41) {
        CHECK(dsf_session_rollback(a, 0, err) == 0 && eval_pieces(a, &x.mp, 0, 20, 20, 20, NULL, V, err) == 0);
        CHECK(dsf_session_save(a, &snap, &len, err) == 0);
        dsf_session *c41 = dsf_session_new(e41, 64, err);
        /* other model: refused either way; the message must not be a crash */
        CHECK(dsf_session_restore(c41, snap, len, err) < 0 && dsf_session_n_past(c41) == 0);
        dsf_session_free(c41);
        dsf_engine_close(e41);
        free(snap);
    }
    free(la);
    free(lb);
    dsf_session_free(a);
    dsf_session_free(b);
out:
    fix_close(&x);
}

/* Guards against: a model without exp_probs_b_vl silently routing image positions with the
 * text bias (vision.md §6); the refusal must leave the session as it was. */
TEST(vl_golden_refuse_without_bias_vl) {
    vl_fix x;
    if (fix_open(t, &x) < 0) goto out;
    dsf_engine *e41 = vl_open("tiny41/tiny41.gguf", DSF_NUMERICS_PLAIN, t);
    if (!e41) goto out;
    CHECK(!dsf_engine_has_vision(e41) && dsf_engine_has_vision(x.e) && dsf_engine_n_embd(x.e) == 128);
    char err[DSF_ERR_LEN] = "";
    dsf_session *s = dsf_session_new(e41, 64, err);
    CHECK(dsf_session_eval(s, x.mp.tokens, 3, NULL, false, err) == 0);
    dsf_media m = dsf_mm_media(&x.mp);
    CHECK(dsf_session_eval_media(s, x.mp.tokens + 3, &m, 20, NULL, false, err) < 0);
    CHECKF(strstr(err, "cannot take images") != NULL, "message: %s", err);
    CHECK(dsf_session_n_past(s) == 3);
    /* a type outside -1..3 */
    int8_t bad[2] = {-1, 4};
    dsf_media mb = {bad, x.mp.embd, NULL};
    dsf_session *sv = dsf_session_new(x.e, 64, err);
    CHECK(dsf_session_eval_media(sv, x.mp.tokens, &mb, 2, NULL, false, err) < 0 && strstr(err, "token type 4"));
    CHECK(dsf_session_n_past(sv) == 0);
    dsf_session_free(sv);
    dsf_session_free(s);
    dsf_engine_close(e41);
out:
    fix_close(&x);
}

/* Guards against: a file with exp_probs_b_vl on some layers only being accepted (the other
 * layers would route image positions with the text bias): gguf-layout.md §3.2, all or none.
 * The file is tinyvl.gguf with layer 3's tensor renamed (same length). */
TEST(vl_golden_loader_partial_bias_vl) {
    NEED_SHARED(src, VDIR "tinyvl.gguf");
    FILE *f = fopen(src, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz);
    CHECK(fread(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    const char *name = "blk.3.exp_probs_b_vl.bias";
    const size_t nl = strlen(name);
    long at = -1;
    for (long i = 0; i + (long)nl <= sz && at < 0; i++)
        if (!memcmp(b + i, name, nl)) at = i;
    CHECK(at >= 0);
    b[at + 4] = '9'; /* blk.9...: a layer tinyvl does not have */
    char path[512], err[DSF_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/partial_vl.gguf", test_tmpdir());
    f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    free(b);
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 1;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    remove(path);
    CHECKF(!e, "a file with bias_vl on 7 of 8 layers was accepted");
    CHECKF(strstr(err, "blk.3.exp_probs_b_vl.bias") && strstr(err, "every layer or none"), "message: %s", err);
}

/* Guards against: media prefill reusing a cached prefix whose image differs (same ids, other
 * keys) or not reusing an identical one, and a chunk that ends inside a span. */
TEST(vl_golden_gen_prefix_keys) {
    vl_fix x;
    if (fix_open(t, &x) < 0) goto out;
    const int n = x.c.n, V = x.c.vocab;
    char err[DSF_ERR_LEN];
    dsf_tokenizer *tk = dsf_tokenizer_load(test_shared(VDIR "tinyvl.gguf"), err);
    CHECKF(tk, "%s", err);
    dsf_session *s = dsf_session_new(x.e, n + 8, err);
    dsf_gen *g = dsf_gen_new(x.e, s, tk, err);
    CHECKF(g, "%s", err);
    dsf_media m = dsf_mm_media(&x.mp);
    /* chunks of 5: 10..14 is text, then the span (14..30) in one chunk (15..30 extended) */
    CHECKF(dsf_gen_prefill_begin_media(g, x.mp.tokens, &m, n, 5, err) == n, "%s", err);
    int steps = 0, left, span_chunk = 0;
    for (left = n; left > 0; steps++) {
        int before = dsf_session_n_past(s);
        left = dsf_gen_prefill_step(g, err);
        CHECKF(left >= 0, "%s", err);
        int after = dsf_session_n_past(s);
        CHECKF(after == n || x.mp.types[after - 1] < 0 || x.mp.types[after - 1] == DSF_TOKEN_IMAGE_END,
               "a chunk ended inside the span at %d", after);
        if (before < 20 && after > 20) span_chunk = after - before;
    }
    CHECKF(span_chunk > 5, "the span's chunk has %d tokens (not extended)", span_chunk);
    CHECK(dsf_gen_n_cached(g) == 0);
    /* the same prompt again: everything but the last token is reused */
    CHECK(dsf_gen_prefill_media(g, x.mp.tokens, &m, n, 0, NULL, NULL, err) == 0);
    CHECKF(dsf_gen_n_cached(g) == n - 1, "same prompt: %d cached", dsf_gen_n_cached(g));
    /* another image (keys differ) at the same place: reuse stops at the span's start (14) */
    uint64_t *keys = malloc((size_t)n * sizeof(uint64_t));
    for (int i = 0; i < n; i++) keys[i] = x.mp.keys[i] ? x.mp.keys[i] ^ 0x5555 : 0;
    dsf_media m2 = {x.mp.types, x.mp.embd, keys};
    CHECK(dsf_gen_prefill_media(g, x.mp.tokens, &m2, n, 0, NULL, NULL, err) == 0);
    CHECKF(dsf_gen_n_cached(g) == 14, "other image: %d cached (want 14)", dsf_gen_n_cached(g));
    /* a text prompt with the same ids: the span positions are not text, nothing past 14 */
    CHECK(dsf_gen_prefill(g, x.mp.tokens, 20, 0, NULL, NULL, err) == 0);
    CHECKF(dsf_gen_n_cached(g) == 14, "text prompt: %d cached (want 14)", dsf_gen_n_cached(g));
    free(keys);
    (void)V;
    dsf_gen_free(g);
    dsf_session_free(s);
    dsf_tokenizer_free(tk);
out:
    fix_close(&x);
}
