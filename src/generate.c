/* generate.c: the generation loop (runtime layer).
 *
 * Owns: prefix reuse at prefill (longest common prefix with the session's history, exact
 * rollback, chunked eval with progress), and the decode loop: sample -> detokenize -> stop
 * strings -> callbacks, with EOS / max_tokens / context / cancel handling, optional DSML
 * event forwarding and per-token logprobs.
 * Must not: know about HTTP, terminals or chat rendering (callers do that); allocate inside
 * the token loop (buffers come from dsf_gen_new), except for growing the collected text.
 * Invariant: g->ready is true exactly when g->logits holds the logits after the session's
 * last token, i.e. right after a successful prefill and before decode consumes them. */
#include "generate.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
};

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
    free(g->logits);
    free(g->scratch);
    free(g);
}

int dsf_gen_n_cached(const dsf_gen *g) { return g ? g->n_cached : 0; }

/* ==== prefill ========================================================================== */

/* Returns 0 done, -1 error, 1 cancelled (by progress or cancel). */
static int prefill(dsf_gen *g, const int32_t *prompt, int n, int chunk, dsf_gen_progress_cb progress,
                   void *pud, int (*cancel)(void *), void *cud, char *err) {
    g->ready = false;
    g->n_prompt = n > 0 ? n : 0;
    g->n_cached = 0;
    g->prefill_s = 0;
    if (!prompt || n < 1) return dsf_seterr(err, "the prompt is empty");
    int max_ctx = dsf_session_max_ctx(g->s);
    if (n > max_ctx)
        return dsf_seterr(err, "the prompt has %d tokens but the context holds %d", n, max_ctx);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= g->n_vocab_model)
            return dsf_seterr(err, "prompt token %d (id %d) is outside the vocabulary (%d)", i,
                              (int)prompt[i], g->n_vocab_model);
    if (chunk <= 0) chunk = DSF_GEN_PREFILL_CHUNK;

    double t0 = dsf_now();
    const int32_t *have = dsf_session_tokens(g->s);
    int n_have = dsf_session_n_past(g->s), lcp = 0;
    while (lcp < n_have && lcp < n && have[lcp] == prompt[lcp]) lcp++;
    /* The logits after the last prompt token are needed, so at least one token is evaluated. */
    if (lcp == n) lcp = n - 1;
    if (lcp < n_have && dsf_session_rollback(g->s, lcp, err) < 0) return -1;
    g->n_cached = lcp;

    int total = n - lcp;
    for (int i = lcp; i < n;) {
        if (progress && progress(pud, i - lcp, total)) return 1;
        if (cancel && cancel(cud)) return 1;
        int c = n - i < chunk ? n - i : chunk;
        bool last = i + c == n;
        if (dsf_session_eval(g->s, prompt + i, c, last ? g->logits : NULL, false, err) < 0)
            return dsf_prefixerr(err, "prefill at position %d", i);
        i += c;
    }
    if (progress) progress(pud, total, total); /* done: a late cancel changes nothing */
    g->prefill_s = dsf_now() - t0;
    g->ready = true;
    return 0;
}

int dsf_gen_prefill(dsf_gen *g, const int32_t *prompt, int n, int chunk, dsf_gen_progress_cb progress,
                    void *ud, char *err) {
    if (!g) return dsf_seterr(err, "dsf_gen_prefill: no generator");
    int rc = prefill(g, prompt, n, chunk, progress, ud, NULL, NULL, err);
    if (rc == 1) return dsf_seterr(err, "cancelled");
    return rc;
}

/* ==== decode =========================================================================== */

typedef struct {
    dsf_gen *g;
    const dsf_gen_params *p;
    dsf_stop_matcher *stop;
    dsf_dsml_parser *dsml;
    dsf_buf text;  /* visible text */
    int stopped;   /* a stop string matched */
    int stop_index;
} loop;

/* Sends detokenized text through the stop matcher; what is safe goes to the caller. */
static void emit(loop *L, const char *s, size_t n, bool final) {
    const char *o = NULL;
    size_t on = 0;
    if (!L->stopped && n) {
        int si = -1;
        if (dsf_stop_matcher_push(L->stop, s, n, &o, &on, &si) == 1) {
            L->stopped = 1;
            L->stop_index = si;
        }
        if (on) {
            dsf_buf_append(&L->text, o, on);
            if (L->p->on_text) L->p->on_text(L->p->ud, o, on);
            if (L->dsml) dsf_dsml_feed(L->dsml, o, on, L->p->on_dsml, L->p->ud);
        }
    }
    if (final && !L->stopped) {
        dsf_stop_matcher_flush(L->stop, &o, &on);
        if (on) {
            dsf_buf_append(&L->text, o, on);
            if (L->p->on_text) L->p->on_text(L->p->ud, o, on);
            if (L->dsml) dsf_dsml_feed(L->dsml, o, on, L->p->on_dsml, L->p->ud);
        }
    }
}

static const char *token_text(const dsf_tokenizer *tok, int32_t id, size_t *len) {
    const char *s = dsf_token_bytes(tok, id, len);
    if (!s) *len = 0;
    return s ? s : "";
}

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
    if (!g->ready) return dsf_seterr(err, "dsf_gen_decode: no successful prefill to continue from");
    if (p->top_logprobs < 0 || p->top_logprobs > DSF_GEN_MAX_LOGPROBS)
        return dsf_seterr(err, "top_logprobs must be within 0..%d, got %d", DSF_GEN_MAX_LOGPROBS,
                          p->top_logprobs);
    if (p->sampler.n_stop < 0 || (p->sampler.n_stop > 0 && !p->sampler.stop))
        return dsf_seterr(err, "bad stop string list");
    g->ready = false;

    dsf_sampler_params sp = p->sampler;
    if (sp.eos_id < 0) sp.eos_id = g->eos;
    uint64_t rng = dsf_rng_init(sp.seed);
    int max_ctx = dsf_session_max_ctx(g->s);

    loop L = {.g = g, .p = p, .stop_index = -1};
    L.stop = dsf_stop_matcher_new(sp.stop, sp.n_stop);
    dsf_detok *dt = dsf_detok_new(g->tok, false);
    if (p->parse_dsml) L.dsml = dsf_dsml_parser_new(p->dsml_thinking, false);
    if (!L.stop || !dt || (p->parse_dsml && !L.dsml)) {
        dsf_stop_matcher_free(L.stop);
        dsf_detok_free(dt);
        dsf_dsml_parser_free(L.dsml);
        return dsf_seterr(err, "dsf_gen_decode: out of memory");
    }
    dsf_buf_reserve(&L.text, 256);

    dsf_finish_reason fin = DSF_FINISH_NONE;
    bool hit_eos = false, failed = false;
    double t0 = dsf_now();
    for (;;) {
        if (p->cancel && p->cancel(p->ud)) {
            fin = DSF_FINISH_CANCELLED;
            break;
        }
        int32_t id = dsf_sample_ws(g->logits, g->n_vocab, &sp, &rng, g->scratch);
        if (id < 0) {
            dsf_seterr(err, "no token can be sampled (every logit is -inf or NaN)");
            failed = true;
            break;
        }
        out->n_completion++;
        bool is_eos = id == sp.eos_id;
        const char *piece = "";
        size_t plen = 0;
        if (is_eos) {
            dsf_detok_flush(dt, &piece, &plen);
        } else if (dsf_detok_push(dt, id, &piece, &plen, err) < 0) {
            failed = true;
            break;
        }
        if (p->on_token) {
            dsf_gen_token tk = {.id = id, .piece = piece, .piece_len = plen, .is_eos = is_eos};
            if (p->logprobs) tk.logprob = dsf_logprob_of(g->logits, g->n_vocab, id);
            if (p->top_logprobs > 0) {
                tk.n_top = dsf_logprobs_top(g->logits, g->n_vocab, p->top_logprobs, g->top_ids, g->top_lp);
                tk.top_ids = g->top_ids;
                tk.top_logprobs = g->top_lp;
            }
            p->on_token(p->ud, &tk);
        }
        emit(&L, piece, plen, false);
        if (L.stopped) {
            fin = DSF_FINISH_STOP;
            break;
        }
        if (is_eos) {
            hit_eos = true;
            fin = DSF_FINISH_STOP;
            break;
        }
        if (sp.max_tokens > 0 && out->n_completion >= sp.max_tokens) {
            fin = DSF_FINISH_LENGTH;
            break;
        }
        if (dsf_session_n_past(g->s) >= max_ctx) {
            fin = DSF_FINISH_LENGTH;
            break;
        }
        if (dsf_session_eval(g->s, &id, 1, g->logits, false, err) < 0) {
            dsf_prefixerr(err, "decode at position %d", dsf_session_n_past(g->s));
            failed = true;
            break;
        }
    }
    out->decode_s = dsf_now() - t0;
    if (out->decode_s > 0) out->decode_tps = out->n_completion / out->decode_s;

    /* Whatever the detokenizer and the stop matcher still hold is text too. */
    if (!L.stopped) {
        const char *rest;
        size_t rn;
        dsf_detok_flush(dt, &rest, &rn);
        emit(&L, rest, rn, true);
    }
    out->stop_index = L.stop_index;

    if (L.dsml) {
        /* The parser expects the EOS string at the end of a finished turn (spec §3.2). */
        size_t en = 0;
        const char *es = hit_eos ? token_text(g->tok, sp.eos_id, &en) : "";
        if (en) dsf_dsml_feed(L.dsml, es, en, p->on_dsml, p->ud);
        char perr[DSF_ERR_LEN];
        dsf_dsml_result tol;
        memset(&tol, 0, sizeof tol);
        dsf_dsml_finish(L.dsml, p->on_dsml, p->ud, &tol, perr); /* tolerant: never fails */
        dsf_dsml_result strict;
        memset(&strict, 0, sizeof strict);
        dsf_buf raw = {0};
        dsf_buf_append(&raw, L.text.data ? L.text.data : (const uint8_t *)"", L.text.len);
        dsf_buf_append(&raw, es, en);
        if (hit_eos && dsf_dsml_parse((const char *)raw.data, raw.len, p->dsml_thinking, true, &strict, perr) == 0) {
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

    if (!L.text.data) dsf_buf_append(&L.text, "", 0); /* dsf_buf keeps data NUL-terminated */
    out->text = (char *)L.text.data;
    out->text_len = L.text.len;
    dsf_stop_matcher_free(L.stop);
    dsf_detok_free(dt);
    dsf_dsml_parser_free(L.dsml);
    if (failed) {
        out->finish = DSF_FINISH_ERROR;
        return -1;
    }
    out->finish = fin;
    return 0;
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
    int rc = prefill(g, prompt, n, 0, progress, p->ud, p->cancel, p->ud, err);
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
