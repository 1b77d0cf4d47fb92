/* gen_step.c: the generation loop's step API (dsf_gen_prefill_begin/step, dsf_gen_begin/
 * next/fail/end in src/runtime/generate.c), driven the way the server's scheduler drives it: several
 * generators whose decode steps share one dsf_batch_eval.
 *
 * Expected ids come from an independent greedy loop written here (dsf_session_eval on a fresh
 * session + argmax, lowest id on ties: the sampler's documented greedy rule), never from the
 * code under test. The model is the synth module's random-weight tiny model. */
#include "test.h"

#include "dsflash.h"
#include "runtime/generate.h"
#include "convert/synth.h"

#include <stdlib.h>
#include <string.h>

static const char *step_model(void) {
    static char path[512];
    if (!path[0]) {
        char err[DSF_ERR_LEN];
        snprintf(path, sizeof path, "%s/gen-step-tiny.gguf", test_tmpdir());
        if (synth_write("tiny", path, 11, err) < 0) {
            fprintf(stderr, "synth: %s\n", err);
            path[0] = 0;
            return NULL;
        }
    }
    return path;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* n_gen greedy ids after prompt on a fresh session. */
static int ref_greedy(dsf_engine *e, const int32_t *prompt, int n, int n_gen, int32_t *out) {
    char err[DSF_ERR_LEN];
    int nv = dsf_engine_n_vocab(e), rc = -1;
    dsf_session *s = dsf_session_new(e, n + n_gen + 1, err);
    float *lg = malloc((size_t)nv * sizeof *lg);
    if (!s || !lg || dsf_session_eval(s, prompt, n, lg, false, err) < 0) goto done;
    for (int i = 0; i < n_gen; i++) {
        out[i] = argmax(lg, nv);
        if (dsf_session_eval(s, &out[i], 1, lg, false, err) < 0) goto done;
    }
    rc = 0;
done:
    free(lg);
    dsf_session_free(s);
    return rc;
}

typedef struct {
    int32_t ids[256];
    int n;
    int cancel_at; /* > 0: cancel once this many tokens were sampled */
} rec;

static void rec_token(void *ud, const dsf_gen_token *t) {
    rec *r = ud;
    if (r->n < 256) r->ids[r->n++] = t->id;
}

static int rec_cancel(void *ud) {
    rec *r = ud;
    return r->cancel_at > 0 && r->n >= r->cancel_at;
}

static void prompt_of(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = 100 + (i * 29 + salt * 13) % 800;
}

enum { NG = 3 };

/* Guards the step API under batching: three generators with prompts of different lengths
 * and different max_tokens, prefilled chunk by chunk in turns, then decoded with one
 * dsf_batch_eval per round over the ones still running; each must sample exactly the ids of
 * its own independent greedy loop, stop at its own max_tokens (finish "length"), and leave
 * its session holding the prompt plus all but the last sampled token. */
TEST(gen_step_batched_matches_reference) {
    const char *path = step_model();
    CHECK(path != NULL);
    char err[DSF_ERR_LEN];
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    CHECKF(e, "%s", err);
    dsf_tokenizer *tok = dsf_tokenizer_load(path, err);
    CHECKF(tok, "%s", err);
    int nv = dsf_engine_n_vocab(e);
    static const int plen[NG] = {5, 23, 12}, ngen[NG] = {9, 14, 4};
    int32_t prompts[NG][32], ref[NG][16];
    dsf_session *ss[NG];
    dsf_gen *g[NG];
    rec rc[NG];
    memset(rc, 0, sizeof rc);
    for (int i = 0; i < NG; i++) {
        prompt_of(prompts[i], plen[i], i);
        CHECK(ref_greedy(e, prompts[i], plen[i], ngen[i], ref[i]) == 0);
        ss[i] = dsf_session_new(e, 64, err);
        CHECKF(ss[i], "%s", err);
        g[i] = dsf_gen_new(e, ss[i], tok, err);
        CHECKF(g[i], "%s", err);
    }
    /* prefill in chunks of 4, the generators taking turns */
    int left[NG];
    for (int i = 0; i < NG; i++) {
        left[i] = dsf_gen_prefill_begin(g[i], prompts[i], plen[i], 4, err);
        CHECKF(left[i] == plen[i], "%d: %d left (%s)", i, left[i], err);
    }
    for (bool busy = true; busy;) {
        busy = false;
        for (int i = 0; i < NG; i++)
            if (left[i] > 0) {
                left[i] = dsf_gen_prefill_step(g[i], err);
                CHECKF(left[i] >= 0, "%s", err);
                busy = true;
            }
    }
    CHECK(dsf_gen_prefill_step(g[0], err) == -1); /* nothing left to step */
    dsf_gen_params p[NG];
    int32_t next[NG];
    dsf_finish_reason fin[NG];
    for (int i = 0; i < NG; i++) {
        dsf_gen_params_default(&p[i]);
        p[i].sampler.temperature = 0;
        p[i].sampler.max_tokens = ngen[i];
        p[i].sampler.ignore_eos = true;
        p[i].on_token = rec_token;
        p[i].ud = &rc[i];
        CHECKF(dsf_gen_begin(g[i], &p[i], err) == 0, "%s", err);
        fin[i] = dsf_gen_next(g[i], NULL, &next[i], err);
    }
    float *lg = malloc((size_t)NG * (size_t)nv * sizeof *lg);
    CHECK(lg != NULL);
    int rounds = 0;
    for (;;) {
        dsf_session *bs[NG];
        int32_t bt[NG];
        int who[NG], n = 0;
        for (int i = 0; i < NG; i++)
            if (fin[i] == DSF_FINISH_NONE) bs[n] = ss[i], bt[n] = next[i], who[n++] = i;
        if (!n) break;
        CHECKF(dsf_batch_eval(bs, bt, n, lg, err) == 0, "%s", err);
        for (int k = 0; k < n; k++) fin[who[k]] = dsf_gen_next(g[who[k]], lg + (size_t)k * (size_t)nv, &next[who[k]], err);
        rounds++;
    }
    CHECK(rounds == 13); /* the longest run: 14 tokens, the first from the prefill's logits */
    for (int i = 0; i < NG; i++) {
        CHECKF(fin[i] == DSF_FINISH_LENGTH, "%d: finish %s", i, dsf_finish_reason_str(fin[i]));
        CHECK(next[i] == -1);
        CHECKF(rc[i].n == ngen[i], "%d: %d tokens", i, rc[i].n);
        for (int q = 0; q < ngen[i]; q++) CHECKF(rc[i].ids[q] == ref[i][q], "gen %d token %d: %d != %d", i, q, rc[i].ids[q], ref[i][q]);
        CHECK(dsf_session_n_past(ss[i]) == plen[i] + ngen[i] - 1);
        dsf_gen_result r;
        CHECKF(dsf_gen_end(g[i], &r, err) == 0, "%s", err);
        CHECK(r.finish == DSF_FINISH_LENGTH && r.n_completion == ngen[i] && r.n_prompt == plen[i] && r.text);
        dsf_gen_result_free(&r);
    }
    free(lg);
    for (int i = 0; i < NG; i++) dsf_gen_free(g[i]), dsf_session_free(ss[i]);
    dsf_tokenizer_free(tok);
    dsf_engine_close(e);
}

/* Guards misuse and the non-happy endings: next before begin, NULL logits after the first
 * step, an eval failure reported with dsf_gen_fail (end: -1, finish "error", the message),
 * ending a running generation (cancelled), the cancel callback, and freeing a generator in
 * the middle of a generation (ASan: nothing leaks). */
TEST(gen_step_misuse_and_endings) {
    const char *path = step_model();
    CHECK(path != NULL);
    char err[DSF_ERR_LEN];
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.n_threads = 2;
    dsf_engine *e = dsf_engine_open(path, &ep, err);
    CHECKF(e, "%s", err);
    dsf_tokenizer *tok = dsf_tokenizer_load(path, err);
    dsf_session *s = dsf_session_new(e, 64, err);
    dsf_gen *g = dsf_gen_new(e, s, tok, err);
    CHECKF(tok && s && g, "%s", err);
    int nv = dsf_engine_n_vocab(e);
    float *lg = malloc((size_t)nv * sizeof *lg);
    int32_t prompt[10], tk = 0;
    prompt_of(prompt, 10, 7);
    rec r0 = {0};
    dsf_gen_params p;
    dsf_gen_params_default(&p);
    p.sampler.temperature = 0;
    p.sampler.ignore_eos = true;
    p.on_token = rec_token;
    p.cancel = rec_cancel;
    p.ud = &r0;
    dsf_gen_result res;

    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_ERROR && strstr(err, "begin") && tk == -1);
    CHECK(dsf_gen_end(g, &res, err) == -1 && res.finish == DSF_FINISH_ERROR);
    dsf_gen_result_free(&res);
    CHECK(dsf_gen_begin(g, &p, err) == -1 && strstr(err, "prefill"));
    CHECK(dsf_gen_prefill_step(g, err) == -1);
    CHECK(dsf_gen_prefill_begin(g, prompt, 0, 4, err) == -1);

    /* NULL logits on a later step */
    CHECK(dsf_gen_prefill(g, prompt, 10, 0, NULL, NULL, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == -1); /* already running */
    CHECK(dsf_gen_prefill_begin(g, prompt, 10, 4, err) == -1 && strstr(err, "running"));
    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_NONE && tk >= 0);
    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_ERROR && strstr(err, "logits"));
    CHECK(dsf_gen_next(g, lg, &tk, err) == DSF_FINISH_ERROR); /* over: keeps saying so */
    CHECK(dsf_gen_end(g, &res, err) == -1 && res.finish == DSF_FINISH_ERROR && strstr(err, "logits"));
    CHECK(res.n_completion == 1 && res.text);
    dsf_gen_result_free(&res);

    /* the caller's eval failed */
    CHECK(dsf_gen_prefill(g, prompt, 10, 0, NULL, NULL, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == 0);
    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_NONE);
    dsf_gen_fail(g, "the batch forward failed");
    CHECK(dsf_gen_end(g, &res, err) == -1 && res.finish == DSF_FINISH_ERROR && !strcmp(err, "the batch forward failed"));
    dsf_gen_result_free(&res);

    /* ended while running: cancelled, not an error */
    CHECK(dsf_gen_prefill(g, prompt, 10, 0, NULL, NULL, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == 0);
    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_NONE);
    CHECK(dsf_session_eval(s, &tk, 1, lg, false, err) == 0);
    CHECK(dsf_gen_next(g, lg, &tk, err) == DSF_FINISH_NONE);
    CHECK(dsf_gen_end(g, &res, err) == 0 && res.finish == DSF_FINISH_CANCELLED && res.n_completion == 2);
    dsf_gen_result_free(&res);
    CHECK(dsf_gen_end(g, &res, err) == -1); /* nothing left to end */
    dsf_gen_result_free(&res);

    /* the cancel callback, polled before each token */
    r0.n = 0;
    r0.cancel_at = 3;
    CHECK(dsf_gen_prefill(g, prompt, 10, 0, NULL, NULL, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == 0);
    dsf_finish_reason f = dsf_gen_next(g, NULL, &tk, err);
    while (f == DSF_FINISH_NONE) {
        CHECK(dsf_session_eval(s, &tk, 1, lg, false, err) == 0);
        f = dsf_gen_next(g, lg, &tk, err);
    }
    CHECK(f == DSF_FINISH_CANCELLED && r0.n == 3);
    CHECK(dsf_gen_end(g, &res, err) == 0 && res.finish == DSF_FINISH_CANCELLED);
    dsf_gen_result_free(&res);

    /* freed mid-generation */
    r0.cancel_at = 0;
    CHECK(dsf_gen_prefill(g, prompt, 10, 0, NULL, NULL, err) == 0);
    CHECK(dsf_gen_begin(g, &p, err) == 0);
    CHECK(dsf_gen_next(g, NULL, &tk, err) == DSF_FINISH_NONE);
    free(lg);
    dsf_gen_free(g);
    dsf_session_free(s);
    dsf_tokenizer_free(tok);
    dsf_engine_close(e);
}
