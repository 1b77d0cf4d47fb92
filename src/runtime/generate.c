/* generate.c: the generation loop (runtime layer).
 *
 * Owns: prefix reuse at prefill (longest common prefix with the session's history, ids and
 * image-span keys, exact rollback, chunked eval with progress; a chunk never ends inside an
 * image span), and the decode loop: sample -> detokenize -> stop
 * strings -> callbacks, with EOS / max_tokens / context / cancel handling, optional DSML
 * event forwarding and per-token logprobs.
 * Must not: know about HTTP, terminals or chat rendering (callers do that); allocate inside
 * the token loop (buffers come from dsf_gen_new), except for growing the collected text.
 * Invariant: g->ready is true exactly when g->logits holds the logits after the session's
 * last token, i.e. right after a successful prefill and before decode consumes them.
 *
 * One code path: the decode loop is a step machine (dsf_gen_begin / dsf_gen_next /
 * dsf_gen_end) that samples from logits the caller provides and returns the token to
 * evaluate; dsf_gen_decode drives it with dsf_session_eval, the server's scheduler with
 * dsf_batch_eval over several generators. Prefill likewise: dsf_gen_prefill is a loop over
 * dsf_gen_prefill_step. */
#include "runtime/generate.h"
#include "base/util.h"
#include "text/grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { GEN_IDLE = 0, GEN_RUNNING, GEN_FINISHED } gen_state;

struct dsf_gen {
    dsf_engine *e;
    dsf_session *s;
    const dsf_tokenizer *tok;
    int n_vocab_model;  /* logits row length */
    int n_vocab;        /* ids that can be sampled: min(model, tokenizer) */
    int32_t eos;
    float *logits;      /* [n_vocab_model] after the session's last token */
    void *scratch;      /* dsf_sample_scratch_bytes(n_vocab) */
    int32_t top_ids[DSF_GEN_MAX_LOGPROBS];
    float top_lp[DSF_GEN_MAX_LOGPROBS];
    bool ready;
    int n_prompt, n_cached;
    double prefill_s;
    /* step-wise prefill (dsf_gen_prefill_begin/step) */
    bool pf_active;
    const int32_t *pf_prompt;
    int pf_n, pf_pos, pf_chunk;
    dsf_media pf_m;     /* the prompt's image spans (the caller's arrays); types NULL: text */
    int64_t pf_erow;    /* the span row of pf_pos (the spans of the prompt before it) */
    /* the running generation (dsf_gen_begin .. dsf_gen_end) */
    gen_state st;
    dsf_gen_params p;       /* copy of the caller's parameters */
    dsf_sampler_params sp;  /* p.sampler with eos_id resolved */
    uint64_t rng;
    bool logits_fresh;      /* g->logits may be consumed by the next dsf_gen_next(NULL) */
    dsf_stop_matcher *stop;
    dsf_detok *dt;
    dsf_dsml_parser *dsml;
    gr_matcher *gm;         /* constrained decoding (p.grammar), else NULL */
    float *masked;          /* [n_vocab] the constrained logits (allocated on first use) */
    dsf_buf text;           /* visible text */
    int stopped;            /* a stop string matched */
    int stop_index;
    int n_completion;
    bool hit_eos, failed;
    dsf_finish_reason fin;
    double t0;
    char errmsg[DSF_ERR_LEN];
    gen_hooks hk;           /* the speculative loop's hooks (zero: none) */
};

static void gen_release(dsf_gen *g);

/* ==== small helpers ==================================================================== */

const char *dsf_finish_reason_str(dsf_finish_reason r) {
    switch (r) {
    case DSF_FINISH_STOP: return "stop";
    case DSF_FINISH_LENGTH: return "length";
    case DSF_FINISH_TOOL_CALLS: return "tool_calls";
    case DSF_FINISH_CANCELLED: return "cancelled";
    case DSF_FINISH_ERROR: return "error";
    case DSF_FINISH_NONE: break;
    }
    return "none";
}

int32_t gen_resolve_eos(const dsf_tokenizer *tok) {
    int32_t eos = dsf_tokenizer_eos(tok);
    if (eos >= 0) return eos;
    return dsf_token_id(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>");
}

void dsf_gen_params_default(dsf_gen_params *p) {
    memset(p, 0, sizeof *p);
    dsf_sampler_params_default(&p->sampler);
}

void dsf_gen_result_free(dsf_gen_result *r) {
    if (!r) return;
    free(r->text);
    if (r->has_dsml) dsf_dsml_result_free(&r->dsml);
    memset(r, 0, sizeof *r);
    r->stop_index = -1;
}

/* ==== lifetime ========================================================================= */

dsf_gen *dsf_gen_new(dsf_engine *e, dsf_session *s, const dsf_tokenizer *tok, char *err) {
    if (!e || !s || !tok) {
        dsf_seterr(err, "dsf_gen_new: engine, session and tokenizer are required");
        return NULL;
    }
    int nm = dsf_engine_n_vocab(e), nt = dsf_tokenizer_n_vocab(tok);
    if (nm <= 0 || nt <= 0) {
        dsf_seterr(err, "dsf_gen_new: empty vocabulary (model %d, tokenizer %d)", nm, nt);
        return NULL;
    }
    dsf_gen *g = calloc(1, sizeof *g);
    if (!g) {
        dsf_seterr(err, "dsf_gen_new: out of memory");
        return NULL;
    }
    g->e = e;
    g->s = s;
    g->tok = tok;
    g->n_vocab_model = nm;
    /* A model id the tokenizer cannot render is never sampled (the real release pads both
     * to the same size, so this only matters for mismatched files). */
    g->n_vocab = nm < nt ? nm : nt;
    g->eos = gen_resolve_eos(tok);
    g->logits = malloc((size_t)nm * sizeof *g->logits);
    g->scratch = malloc(dsf_sample_scratch_bytes(g->n_vocab));
    if (!g->logits || !g->scratch) {
        dsf_gen_free(g);
        dsf_seterr(err, "dsf_gen_new: out of memory for %d logits", nm);
        return NULL;
    }
    return g;
}

void dsf_gen_free(dsf_gen *g) {
    if (!g) return;
    gen_release(g);
    free(g->logits);
    free(g->scratch);
    free(g->masked);
    free(g);
}

int dsf_gen_n_cached(const dsf_gen *g) { return g ? g->n_cached : 0; }

/* ==== hooks for the speculative loop (generate.h) ====================================== */

void gen_set_hooks(dsf_gen *g, const gen_hooks *h) {
    if (h) g->hk = *h;
    else memset(&g->hk, 0, sizeof g->hk);
}
dsf_session *gen_session(dsf_gen *g) { return g->s; }
int gen_n_vocab(const dsf_gen *g) { return g->n_vocab; }
const dsf_sampler_params *gen_sampler(const dsf_gen *g) { return &g->sp; }
uint64_t *gen_rng(dsf_gen *g) { return &g->rng; }
float *gen_logits(dsf_gen *g) { return g->logits; }
bool gen_constrained(const dsf_gen *g) { return g->gm != NULL; }

/* ==== prefill ========================================================================== */

/* The prompt's positions that can be reused from the session: ids and keys agree (a missing
 * key is 0; a span position without a key is never reused: its content is unknown). */
static int common_prefix(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n) {
    const int32_t *have = dsf_session_tokens(g->s);
    const uint64_t *hkeys = dsf_session_keys(g->s);
    const int n_have = dsf_session_n_past(g->s);
    int lcp = 0;
    while (lcp < n_have && lcp < n && have[lcp] == prompt[lcp]) {
        const uint64_t k = m && m->keys ? m->keys[lcp] : 0;
        if ((hkeys ? hkeys[lcp] : 0) != k) break;
        if (m && m->types && m->types[lcp] >= 0 && !k) break;
        lcp++;
    }
    return lcp;
}

int dsf_gen_prefill_begin(dsf_gen *g, const int32_t *prompt, int n, int chunk, char *err) {
    return dsf_gen_prefill_begin_media(g, prompt, NULL, n, chunk, err);
}

int dsf_gen_prefill_begin_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                                char *err) {
    if (!g) return dsf_seterr(err, "dsf_gen_prefill_begin: no generator");
    g->ready = false;
    g->pf_active = false;
    g->n_prompt = n > 0 ? n : 0;
    g->n_cached = 0;
    g->prefill_s = 0;
    if (g->st == GEN_RUNNING) return dsf_seterr(err, "a generation is running: end it before the next prefill");
    if (!prompt || n < 1) return dsf_seterr(err, "the prompt is empty");
    int max_ctx = dsf_session_max_ctx(g->s);
    if (n > max_ctx)
        return dsf_seterr(err, "the prompt has %d tokens but the context holds %d", n, max_ctx);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= g->n_vocab_model)
            return dsf_seterr(err, "prompt token %d (id %d) is outside the vocabulary (%d)", i,
                              (int)prompt[i], g->n_vocab_model);

    double t0 = dsf_now();
    const int n_have = dsf_session_n_past(g->s);
    int lcp = common_prefix(g, prompt, m, n);
    /* The logits after the last prompt token are needed, so at least one token is evaluated. */
    if (lcp == n) lcp = n - 1;
    if (lcp < n_have && dsf_session_rollback(g->s, lcp, err) < 0) return -1;
    g->n_cached = lcp;
    memset(&g->pf_m, 0, sizeof g->pf_m);
    g->pf_erow = 0;
    if (m && m->types) {
        g->pf_m = *m;
        for (int i = 0; i < lcp; i++) g->pf_erow += m->types[i] >= 0;
    }
    g->pf_prompt = prompt;
    g->pf_n = n;
    g->pf_pos = lcp;
    g->pf_chunk = chunk > 0 ? chunk : dsf_engine_ubatch(g->e); /* one forward per step */
    g->pf_active = true;
    g->prefill_s = dsf_now() - t0;
    return n - lcp;
}

int dsf_gen_prefill_step(dsf_gen *g, char *err) {
    if (!g) return dsf_seterr(err, "dsf_gen_prefill_step: no generator");
    if (!g->pf_active) return dsf_seterr(err, "dsf_gen_prefill_step: no prefill in progress");
    double t0 = dsf_now();
    int i = g->pf_pos, n = g->pf_n;
    int c = n - i < g->pf_chunk ? n - i : g->pf_chunk;
    const dsf_media *m = &g->pf_m;
    /* a chunk never ends inside a span: it is extended to the span's end */
    while (m->types && i + c < n && m->types[i + c - 1] >= 0 && m->types[i + c - 1] != DSF_TOKEN_IMAGE_END) c++;
    bool last = i + c == n;
    int rc;
    if (m->types) {
        const dsf_media sub = {m->types + i, m->embd ? m->embd + g->pf_erow * dsf_engine_n_embd(g->e) : NULL,
                               m->keys ? m->keys + i : NULL};
        rc = dsf_session_eval_media(g->s, g->pf_prompt + i, &sub, c, last ? g->logits : NULL, false, err);
        for (int k = 0; k < c && rc == 0; k++) g->pf_erow += m->types[i + k] >= 0;
    } else {
        rc = dsf_session_eval(g->s, g->pf_prompt + i, c, last ? g->logits : NULL, false, err);
    }
    if (rc < 0) {
        g->pf_active = false;
        return dsf_prefixerr(err, "prefill at position %d", i);
    }
    g->pf_pos = i + c;
    g->prefill_s += dsf_now() - t0;
    if (last) {
        g->pf_active = false;
        g->pf_prompt = NULL;
        memset(&g->pf_m, 0, sizeof g->pf_m);
        if (g->hk.prefilled && g->hk.prefilled(g->hk.ud, g, g->n_cached, n, err) < 0) return -1;
        g->ready = true;
    }
    return n - g->pf_pos;
}

/* Returns 0 done, -1 error, 1 cancelled (by progress or cancel). */
static int prefill(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                   dsf_gen_progress_cb progress, void *pud, int (*cancel)(void *), void *cud, char *err) {
    int total = dsf_gen_prefill_begin_media(g, prompt, m, n, chunk, err);
    if (total < 0) return -1;
    for (int left = total; left > 0;) {
        if ((progress && progress(pud, total - left, total)) || (cancel && cancel(cud))) {
            g->pf_active = false;
            return 1;
        }
        left = dsf_gen_prefill_step(g, err);
        if (left < 0) return -1;
    }
    if (progress) progress(pud, total, total); /* done: a late cancel changes nothing */
    return 0;
}

int dsf_gen_prefill(dsf_gen *g, const int32_t *prompt, int n, int chunk, dsf_gen_progress_cb progress,
                    void *ud, char *err) {
    return dsf_gen_prefill_media(g, prompt, NULL, n, chunk, progress, ud, err);
}

int dsf_gen_prefill_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                          dsf_gen_progress_cb progress, void *ud, char *err) {
    if (!g) return dsf_seterr(err, "dsf_gen_prefill: no generator");
    int rc = prefill(g, prompt, m, n, chunk, progress, ud, NULL, NULL, err);
    if (rc == 1) return dsf_seterr(err, "cancelled");
    return rc;
}

/* ==== decode: the step machine ========================================================= */

/* Frees the per-generation state (the text buffer is handed out by dsf_gen_end). */
static void gen_release(dsf_gen *g) {
    dsf_stop_matcher_free(g->stop);
    dsf_detok_free(g->dt);
    dsf_dsml_parser_free(g->dsml);
    gr_matcher_free(g->gm);
    g->gm = NULL;
    dsf_buf_free(&g->text);
    g->stop = NULL;
    g->dt = NULL;
    g->dsml = NULL;
    g->st = GEN_IDLE;
}

/* Sends detokenized text through the stop matcher; what is safe goes to the caller. */
static void emit_text(dsf_gen *g, const char *o, size_t on) {
    if (!on) return;
    dsf_buf_append(&g->text, o, on);
    if (g->p.on_text) g->p.on_text(g->p.ud, o, on);
    if (g->dsml) dsf_dsml_feed(g->dsml, o, on, g->p.on_dsml, g->p.ud);
}

static void emit(dsf_gen *g, const char *s, size_t n, bool final) {
    const char *o = NULL;
    size_t on = 0;
    if (!g->stopped && n) {
        int si = -1;
        if (dsf_stop_matcher_push(g->stop, s, n, &o, &on, &si) == 1) {
            g->stopped = 1;
            g->stop_index = si;
        }
        emit_text(g, o, on);
    }
    if (final && !g->stopped) {
        dsf_stop_matcher_flush(g->stop, &o, &on);
        emit_text(g, o, on);
    }
}

static const char *token_text(const dsf_tokenizer *tok, int32_t id, size_t *len) {
    const char *s = dsf_token_bytes(tok, id, len);
    if (!s) *len = 0;
    return s ? s : "";
}

int dsf_gen_begin(dsf_gen *g, const dsf_gen_params *p, char *err) {
    if (!g || !p) return dsf_seterr(err, "dsf_gen_begin: no generator or parameters");
    if (g->st == GEN_RUNNING) return dsf_seterr(err, "dsf_gen_begin: a generation is already running");
    if (!g->ready) return dsf_seterr(err, "no successful prefill to continue from");
    if (p->top_logprobs < 0 || p->top_logprobs > DSF_GEN_MAX_LOGPROBS)
        return dsf_seterr(err, "top_logprobs must be within 0..%d, got %d", DSF_GEN_MAX_LOGPROBS,
                          p->top_logprobs);
    if (p->sampler.n_stop < 0 || (p->sampler.n_stop > 0 && !p->sampler.stop))
        return dsf_seterr(err, "bad stop string list");
    gen_release(g); /* a finished generation that was never ended */
    g->p = *p;
    g->sp = p->sampler;
    if (g->sp.eos_id < 0) g->sp.eos_id = g->eos;
    g->rng = dsf_rng_init(g->sp.seed);
    g->stop = dsf_stop_matcher_new(g->sp.stop, g->sp.n_stop);
    g->dt = dsf_detok_new(g->tok, false);
    if (p->parse_dsml) g->dsml = dsf_dsml_parser_new(p->dsml_thinking, false);
    if (!g->stop || !g->dt || (p->parse_dsml && !g->dsml)) {
        gen_release(g);
        return dsf_seterr(err, "dsf_gen_begin: out of memory");
    }
    if (p->grammar) {
        g->gm = gr_matcher_new(p->grammar, g->tok, err);
        if (!g->masked) g->masked = malloc((size_t)g->n_vocab * sizeof *g->masked);
        if (!g->gm || !g->masked) {
            gen_release(g);
            return g->masked ? -1 : dsf_seterr(err, "dsf_gen_begin: out of memory");
        }
        g->sp.ignore_eos = false; /* the grammar decides where EOS goes */
    }
    dsf_buf_reserve(&g->text, 256);
    g->ready = false;
    g->logits_fresh = true;
    g->stopped = 0;
    g->stop_index = -1;
    g->n_completion = 0;
    g->hit_eos = g->failed = false;
    g->fin = DSF_FINISH_NONE;
    g->errmsg[0] = 0;
    g->t0 = dsf_now();
    g->st = GEN_RUNNING;
    return 0;
}

static dsf_finish_reason gen_finish(dsf_gen *g, dsf_finish_reason why) {
    g->fin = why;
    g->st = GEN_FINISHED;
    return why;
}

void dsf_gen_fail(dsf_gen *g, const char *msg) {
    if (!g || g->st != GEN_RUNNING) return;
    if (msg != g->errmsg) snprintf(g->errmsg, sizeof g->errmsg, "%s", msg && *msg ? msg : "generation failed");
    g->failed = true;
    gen_finish(g, DSF_FINISH_ERROR);
}

/* The step failed with g->errmsg: the generation ends with DSF_FINISH_ERROR. */
static dsf_finish_reason gen_error(dsf_gen *g, char *err) {
    if (err) snprintf(err, DSF_ERR_LEN, "%s", g->errmsg);
    dsf_gen_fail(g, g->errmsg);
    return DSF_FINISH_ERROR;
}

dsf_finish_reason dsf_gen_next(dsf_gen *g, const float *logits, int32_t *tok_to_eval, char *err) {
    if (!g || !tok_to_eval) {
        dsf_seterr(err, "dsf_gen_next: no generator or token output");
        return DSF_FINISH_ERROR;
    }
    *tok_to_eval = -1;
    if (g->st == GEN_FINISHED) return g->fin;
    if (g->st != GEN_RUNNING) {
        dsf_seterr(err, "dsf_gen_next: no generation running (dsf_gen_begin)");
        return DSF_FINISH_ERROR;
    }
    if (!logits) {
        if (!g->logits_fresh) {
            dsf_seterr(g->errmsg, "dsf_gen_next: no logits given for the token evaluated last");
            return gen_error(g, err);
        }
        logits = g->logits;
    }
    g->logits_fresh = false;
    if (gen_poll_cancel(g) != DSF_FINISH_NONE) return g->fin;
    if (g->gm) {
        /* tokens left, this one included: max_tokens, and the context (the step after the
         * one that fills it ends the generation) */
        long long left = dsf_session_max_ctx(g->s) - dsf_session_n_past(g->s) + 1;
        if (g->sp.max_tokens > 0 && g->sp.max_tokens - g->n_completion < left) left = g->sp.max_tokens - g->n_completion;
        if (gr_matcher_mask(g->gm, logits, g->masked, g->n_vocab, left > INT32_MAX ? INT32_MAX : (int)left) == 0) {
            dsf_seterr(g->errmsg, "constrained decoding: no token can complete the required output within %lld tokens", left);
            return gen_error(g, err);
        }
        logits = g->masked;
    }
    int32_t id = dsf_sample_ws(logits, g->n_vocab, &g->sp, &g->rng, g->scratch);
    if (id < 0) {
        dsf_seterr(g->errmsg, "no token can be sampled (every logit is -inf or NaN)");
        return gen_error(g, err);
    }
    if (g->gm && gr_matcher_accept(g->gm, id) < 0) {
        dsf_seterr(g->errmsg, "constrained decoding: token %d is not allowed", (int)id);
        return gen_error(g, err);
    }
    return gen_push(g, logits, id, tok_to_eval, err);
}

dsf_finish_reason gen_poll_cancel(dsf_gen *g) {
    if (g->st != GEN_RUNNING) return g->fin;
    if (g->p.cancel && g->p.cancel(g->p.ud)) return gen_finish(g, DSF_FINISH_CANCELLED);
    return DSF_FINISH_NONE;
}

dsf_finish_reason gen_push(dsf_gen *g, const float *logits, int32_t id, int32_t *tok_to_eval, char *err) {
    *tok_to_eval = -1;
    if (g->st != GEN_RUNNING) return g->fin;
    g->logits_fresh = false;
    const dsf_gen_params *p = &g->p;
    g->n_completion++;
    bool is_eos = id == g->sp.eos_id;
    const char *piece = "";
    size_t plen = 0;
    if (is_eos) {
        dsf_detok_flush(g->dt, &piece, &plen);
    } else if (dsf_detok_push(g->dt, id, &piece, &plen, g->errmsg) < 0) {
        return gen_error(g, err);
    }
    if (p->on_token) {
        dsf_gen_token tk = {.id = id, .piece = piece, .piece_len = plen, .is_eos = is_eos};
        if (p->logprobs) tk.logprob = dsf_logprob_of(logits, g->n_vocab, id);
        if (p->top_logprobs > 0) {
            tk.n_top = dsf_logprobs_top(logits, g->n_vocab, p->top_logprobs, g->top_ids, g->top_lp);
            tk.top_ids = g->top_ids;
            tk.top_logprobs = g->top_lp;
        }
        p->on_token(p->ud, &tk);
    }
    emit(g, piece, plen, false);
    if (g->stopped) return gen_finish(g, DSF_FINISH_STOP);
    if (is_eos) {
        g->hit_eos = true;
        return gen_finish(g, DSF_FINISH_STOP);
    }
    if (g->sp.max_tokens > 0 && g->n_completion >= g->sp.max_tokens) return gen_finish(g, DSF_FINISH_LENGTH);
    if (dsf_session_n_past(g->s) >= dsf_session_max_ctx(g->s)) return gen_finish(g, DSF_FINISH_LENGTH);
    *tok_to_eval = id;
    return DSF_FINISH_NONE;
}

int dsf_gen_end(dsf_gen *g, dsf_gen_result *out, char *err) {
    if (!out) return dsf_seterr(err, "dsf_gen_end: no result");
    memset(out, 0, sizeof *out);
    out->stop_index = -1;
    out->finish = DSF_FINISH_ERROR;
    if (!g) return dsf_seterr(err, "dsf_gen_end: no generator");
    if (g->st == GEN_IDLE) return dsf_seterr(err, "dsf_gen_end: no generation to end (dsf_gen_begin)");
    if (g->st == GEN_RUNNING) gen_finish(g, DSF_FINISH_CANCELLED);
    const dsf_gen_params *p = &g->p;
    out->n_prompt = g->n_prompt;
    out->n_cached = g->n_cached;
    out->prefill_s = g->prefill_s;
    if (g->prefill_s > 0) out->prefill_tps = (g->n_prompt - g->n_cached) / g->prefill_s;
    out->n_completion = g->n_completion;
    out->decode_s = dsf_now() - g->t0;
    if (out->decode_s > 0) out->decode_tps = out->n_completion / out->decode_s;

    /* Whatever the detokenizer and the stop matcher still hold is text too. */
    if (!g->stopped) {
        const char *rest;
        size_t rn;
        dsf_detok_flush(g->dt, &rest, &rn);
        emit(g, rest, rn, true);
    }
    out->stop_index = g->stop_index;

    dsf_finish_reason fin = g->fin;
    if (g->dsml) {
        /* The parser expects the EOS string at the end of a finished turn (spec §3.2). */
        size_t en = 0;
        const char *es = g->hit_eos ? token_text(g->tok, g->sp.eos_id, &en) : "";
        if (en) dsf_dsml_feed(g->dsml, es, en, p->on_dsml, p->ud);
        char perr[DSF_ERR_LEN];
        dsf_dsml_result tol;
        memset(&tol, 0, sizeof tol);
        dsf_dsml_finish(g->dsml, p->on_dsml, p->ud, &tol, perr); /* tolerant: never fails */
        dsf_dsml_result strict;
        memset(&strict, 0, sizeof strict);
        dsf_buf raw = {0};
        dsf_buf_append(&raw, g->text.data ? g->text.data : (const uint8_t *)"", g->text.len);
        dsf_buf_append(&raw, es, en);
        if (g->hit_eos && dsf_dsml_parse((const char *)raw.data, raw.len, p->dsml_thinking, true, &strict, perr) == 0) {
            dsf_dsml_result_free(&tol);
            out->dsml = strict;
            out->dsml_strict_ok = true;
        } else {
            out->dsml = tol;
        }
        dsf_buf_free(&raw);
        out->has_dsml = true;
        if (fin == DSF_FINISH_STOP && out->dsml.n_calls > 0) fin = DSF_FINISH_TOOL_CALLS;
    }

    if (!g->text.data) dsf_buf_append(&g->text, "", 0); /* dsf_buf keeps data NUL-terminated */
    out->text = (char *)g->text.data;
    out->text_len = g->text.len;
    memset(&g->text, 0, sizeof g->text); /* handed out */
    bool failed = g->failed;
    if (failed) dsf_seterr(err, "%s", g->errmsg);
    gen_release(g);
    out->finish = failed ? DSF_FINISH_ERROR : fin;
    return failed ? -1 : 0;
}

/* ==== the blocking loop ================================================================ */

int dsf_gen_decode(dsf_gen *g, const dsf_gen_params *p, dsf_gen_result *out, char *err) {
    if (!out) return dsf_seterr(err, "dsf_gen_decode: no result");
    memset(out, 0, sizeof *out);
    out->stop_index = -1;
    out->finish = DSF_FINISH_ERROR;
    if (!g || !p) return dsf_seterr(err, "dsf_gen_decode: no generator or parameters");
    out->n_prompt = g->n_prompt;
    out->n_cached = g->n_cached;
    out->prefill_s = g->prefill_s;
    if (g->prefill_s > 0) out->prefill_tps = (g->n_prompt - g->n_cached) / g->prefill_s;
    if (dsf_gen_begin(g, p, err) < 0) return -1;
    int32_t id;
    dsf_finish_reason fin = dsf_gen_next(g, NULL, &id, err); /* from the prefill's logits */
    while (fin == DSF_FINISH_NONE) {
        if (g->hk.round) { /* speculative decoding (src/runtime/spec.c) */
            fin = g->hk.round(g->hk.ud, g, id, &id, err);
            continue;
        }
        if (dsf_session_eval(g->s, &id, 1, g->logits, false, err) < 0) {
            dsf_prefixerr(err, "decode at position %d", dsf_session_n_past(g->s));
            dsf_gen_fail(g, err);
            break;
        }
        fin = dsf_gen_next(g, g->logits, &id, err);
    }
    return dsf_gen_end(g, out, err);
}

int dsf_gen_run(dsf_gen *g, const int32_t *prompt, int n, const dsf_gen_params *p,
                dsf_gen_progress_cb progress, dsf_gen_result *out, char *err) {
    if (!out) return dsf_seterr(err, "dsf_gen_run: no result");
    if (!g || !p) {
        memset(out, 0, sizeof *out);
        out->stop_index = -1;
        out->finish = DSF_FINISH_ERROR;
        return dsf_seterr(err, "dsf_gen_run: no generator or parameters");
    }
    int rc = prefill(g, prompt, NULL, n, 0, progress, p->ud, p->cancel, p->ud, err);
    if (rc != 0) {
        memset(out, 0, sizeof *out);
        out->stop_index = -1;
        out->n_prompt = g->n_prompt;
        out->n_cached = g->n_cached;
        out->text = dsf_xstrdup("");
        if (rc == 1) {
            out->finish = DSF_FINISH_CANCELLED;
            return 0;
        }
        out->finish = DSF_FINISH_ERROR;
        return -1;
    }
    return dsf_gen_decode(g, p, out, err);
}
