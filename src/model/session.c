/* session.c: the public session API (dsflash.h): create a session with its memory computed
 * up front, evaluate tokens in chunks (text, or with image spans: their types, keys and
 * substituted rows kept with the token history, vision.md §5-§8), evaluate a batch of
 * sessions' next tokens, and roll back exactly (architecture.md §5.3), spans included.
 *
 * Owns: the session's lifetime (its chunk is the engine's); the request checks (context
 * length, token ids) before any state changes.
 * Must not: compute model arithmetic (forward.c does), or allocate in the token loop
 * (kvcache.c sizes everything at creation).
 * Invariant: evaluating tokens in one call, in chunks, or after a rollback gives the same
 * state and logits (everything is indexed by absolute position). */
#include "dsflash.h"
#include "model/forward.h"
#include "model/session.h"
#include "model/engram_io.h"
#include "model/dist.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

dsf_session *dsf_session_new(dsf_engine *e, int max_ctx, char *err) {
    /* the engine's chunk (engine.c: dsf_engine_params.ubatch, DSF_CHUNK or chunk_auto); the
     * other ranks of an MPI job take rank 0's */
    const int64_t chunk = e->chunk > 0 ? e->chunk : 512;
    dsf_session *s = session_new(e, max_ctx, chunk, err);
    if (s && dist_op_new(s, max_ctx, err) < 0) { /* the other ranks of an MPI job make theirs */
        char keep[DSF_ERR_LEN];
        snprintf(keep, sizeof keep, "%s", err);
        dsf_session_free(s);
        dsf_seterr(err, "%s", keep);
        return NULL;
    }
    return s;
}

dsf_session *session_new(dsf_engine *e, int max_ctx, int64_t chunk, char *err) {
    const dsf_shape *sh = &e->shape;
    const dist_plan *d = e->dist;
    if (max_ctx <= 0) max_ctx = sh->n_ctx_train > 0 && sh->n_ctx_train < 4096 ? (int)sh->n_ctx_train : 4096;
    if (sh->n_ctx_train > 0 && max_ctx > sh->n_ctx_train)
        dsf_log(2, "dsflash: context %d exceeds the model's context_length %lld", max_ctx, (long long)sh->n_ctx_train);
    /* Refuse up front what would not fit in memory (STYLE: compute session memory first); a
     * rank of an MPI job holds its stage's layers only. */
    const int packed = kv_pack_default(e->numerics == DSF_NUMERICS_REFERENCE);
    int64_t wrow, crow, irow;
    kv_row_bytes(sh, packed, &wrow, &crow, &irow);
    double per_tok = 4.0;
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (dist_holds(d, il)) per_tok += (double)wrow;
        if (sh->kv_src[il] == il && (!d || d->hold_src[il])) per_tok += (double)(crow + irow) / (double)sh->ratio[il];
    }
    double need = per_tok * (double)max_ctx;
    const double ram = dsf_ram_bytes();
    if (ram > 0 && need > 0.8 * ram) {
        dsf_seterr(err, "a context of %d tokens needs %.1f GB of session state, more than this machine's memory "
                        "(%.1f GB) allows", max_ctx, need / 1e9, ram / 1e9);
        return NULL;
    }
    dsf_session *s = dsf_xcalloc(1, sizeof *s);
    s->e = e;
    if (chunk > max_ctx) chunk = max_ctx;
    if (kv_init_held(&s->kv, &e->shape, max_ctx, chunk, packed, d ? d->hold : NULL, d ? d->hold_src : NULL, &s->bytes,
                     err) < 0) {
        free(s);
        return NULL;
    }
    if (scratch_init(&s->sc, &e->shape, chunk, max_ctx, s->kv.packed, &s->bytes) < 0) {
        kv_free(&s->kv, &e->shape);
        free(s);
        dsf_seterr(err, "out of memory allocating the forward scratch");
        return NULL;
    }
    if (d && d->split_experts) { /* a stage member keeps its expert outputs (moe.c) */
        const size_t rows = (size_t)chunk * (size_t)(sh->n_expert_used + 1);
        s->sc.ystore = malloc(rows * (size_t)sh->n_embd * sizeof(float));
        s->sc.eslot = malloc((size_t)chunk * sizeof(int32_t));
        s->bytes += rows * (size_t)sh->n_embd * sizeof(float) + (size_t)chunk * sizeof(int32_t);
        if (!s->sc.ystore || !s->sc.eslot) {
            dsf_session_free(s);
            dsf_seterr(err, "out of memory allocating the experts' outputs of a stage member");
            return NULL;
        }
    }
    if (e->eio) s->sc.ereq = engram_req_new(e->eio, (int)sh->n_engram, chunk * sh->ple_cols, &s->bytes);
    return s;
}

void dsf_session_free(dsf_session *s) {
    if (!s) return;
    dist_op_free(s);
    engram_req_free(s->sc.ereq);
    scratch_free(&s->sc);
    kv_free(&s->kv, &s->e->shape);
    free(s);
}

size_t dsf_session_bytes(const dsf_session *s) { return s->bytes; }
int dsf_session_n_past(const dsf_session *s) { return (int)s->kv.n; }
int dsf_session_max_ctx(const dsf_session *s) { return (int)s->kv.max_ctx; }
const int32_t *dsf_session_tokens(const dsf_session *s) { return s->kv.tokens; }

/* Refuses logits rows that hold a NaN or an infinity. A finite model cannot produce one (every
 * activation is normalized, the softmaxes are max-shifted), but a weight can hold one: a block
 * of a quantized file with a NaN or Inf scale, which nothing scans at open (500 GB). Where it
 * lies is found by `dsflash tensor MODEL NAME --check`. rows [n][V]; pos: the first row's
 * position. */
static int check_logits(const float *rows, int64_t n, int64_t V, int64_t pos, char *err) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < V; i++)
            if (!isfinite(rows[r * V + i]))
                return dsf_seterr(err, "the forward pass produced a non-finite logit (%s for token %lld at position %lld): "
                                       "a weight of this model holds a NaN or an infinity (a quantized block with a "
                                       "NaN/Inf scale?); `dsflash tensor MODEL NAME --check` reports the rows and blocks",
                                  isnan(rows[r * V + i]) ? "NaN" : "Inf", (long long)i, (long long)(pos + r));
    return 0;
}

/* The request checks every eval makes before any state changes. */
static int check_tokens(const dsf_session *s, const int32_t *tokens, int n, char *err) {
    const int64_t V = s->e->shape.n_vocab;
    if (n < 1) return dsf_seterr(err, "no tokens to evaluate");
    if (s->kv.n + n > s->kv.max_ctx)
        return dsf_seterr(err, "context too long: %lld + %d tokens exceed the session's %lld", (long long)s->kv.n, n,
                          (long long)s->kv.max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dsf_seterr(err, "token %d at index %d is outside the vocabulary (0..%lld)", tokens[i], i,
                              (long long)V - 1);
    return 0;
}

/* Evaluates checked tokens in chunks. types/keys (NULL for text): the positions' types and
 * keys, written into the history chunk by chunk just before the chunk runs (a failed chunk's
 * rollback clears them again); the span rows wait in kv->erows from n_erows on. */
static int eval_chunks(dsf_session *s, const int32_t *tokens, const int8_t *types, const uint64_t *keys, int n,
                       float *logits, bool all_rows, char *err) {
    const int64_t V = s->e->shape.n_vocab, start = s->kv.n;
    char failed[DSF_ERR_LEN] = "";
    for (int64_t i = 0; i < n;) {
        int64_t T = n - i < s->sc.max_chunk ? n - i : s->sc.max_chunk;
        float *lg = NULL;
        if (logits && all_rows) lg = logits + i * V;
        else if (logits && i + T == n) lg = logits;
        const int64_t n0 = s->kv.n;
        for (int64_t k = 0; types && k < T; k++) {
            s->kv.vtype[n0 + k] = (uint8_t)(types[i + k] + 1);
            s->kv.keys[n0 + k] = keys ? keys[i + k] : 0;
        }
        if (forward_chunk(s, tokens + i, T, lg, all_rows, err) < 0 ||
            (lg && check_logits(lg, all_rows ? T : 1, V, all_rows ? n0 : n0 + T - 1, err) < 0)) {
            /* the call changes no state (unless the rollback's own re-prefill fails: then
             * the session is empty, and says so); in an MPI job the other ranks run every
             * chunk they were told of, so rank 0 does too before it rolls back */
            if (!failed[0]) snprintf(failed, sizeof failed, "%s", err);
            if (s->e->dist && comm_failed()) return dsf_seterr(err, "%s", failed); /* the job is over */
            if (s->e->dist) {
                i += T;
                continue;
            }
            if (dsf_session_rollback(s, (int)(n0 - i), err) < 0) return -1;
            return dsf_seterr(err, "%s", failed);
        }
        i += T;
    }
    if (failed[0]) {
        if (dsf_session_rollback(s, (int)start, err) < 0) return -1;
        return dsf_seterr(err, "%s", failed);
    }
    return 0;
}

int dsf_session_eval(dsf_session *s, const int32_t *tokens, int n, float *logits, bool all_rows, char *err) {
    if (check_tokens(s, tokens, n, err) < 0 || dist_op_eval(s, tokens, NULL, n, err) < 0) return -1;
    return eval_chunks(s, tokens, NULL, NULL, n, logits, all_rows, err);
}

/* ---- image spans (vision.md §5-§8) ------------------------------------------------------- */

int dsf_engine_n_embd(const dsf_engine *e) { return (int)e->shape.n_embd; }
bool dsf_engine_has_vision(const dsf_engine *e) { return e->w.vision; }
const uint64_t *dsf_session_keys(const dsf_session *s) { return s->kv.keys; }

/* Room for `more` span rows after the first n_erows (the rows beyond them are free). */
static void erows_reserve(dsf_session *s, int64_t more) {
    dsf_kvstate *kv = &s->kv;
    const int64_t need = kv->n_erows + more, D = s->e->shape.n_embd;
    if (need <= kv->erows_cap) return;
    int64_t cap = kv->erows_cap ? kv->erows_cap : 64;
    while (cap < need) cap *= 2;
    kv->erows = dsf_xrealloc(kv->erows, (size_t)(cap * D) * sizeof(float));
    s->bytes += (size_t)((cap - kv->erows_cap) * D) * sizeof(float);
    kv->erows_cap = cap;
}

int dsf_session_eval_media(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, float *logits,
                           bool all_rows, char *err) {
    if (!m || !m->types) {
        for (int i = 0; m && m->keys && i < n; i++)
            if (m->keys[i]) return dsf_seterr(err, "key at index %d is not 0, but the position is text", i);
        return dsf_session_eval(s, tokens, n, logits, all_rows, err);
    }
    if (check_tokens(s, tokens, n, err) < 0) return -1;
    int64_t nspan = 0;
    for (int i = 0; i < n; i++) {
        const int t = m->types[i];
        if (t < DSF_TOKEN_TEXT || t > DSF_TOKEN_IMAGE_END)
            return dsf_seterr(err, "token type %d at index %d is not one of -1 (text), 0..3 (image span)", t, i);
        if (t == DSF_TOKEN_TEXT && m->keys && m->keys[i])
            return dsf_seterr(err, "key at index %d is not 0, but the position is text", i);
        nspan += t >= 0;
    }
    if (nspan && !s->e->w.vision)
        return dsf_seterr(err, "this model cannot take images: its layers carry no image routing bias "
                               "(blk.N.exp_probs_b_vl.bias; vision.md §6)");
    if (nspan && !m->embd) return dsf_seterr(err, "%lld image-span positions but no embedding rows", (long long)nspan);
    if (dist_op_eval(s, tokens, m, n, err) < 0) return -1;
    if (nspan) {
        const int64_t D = s->e->shape.n_embd;
        erows_reserve(s, nspan);
        memcpy(s->kv.erows + s->kv.n_erows * D, m->embd, (size_t)(nspan * D) * sizeof(float));
        s->kv.media = true;
    }
    return eval_chunks(s, tokens, m->types, m->keys, n, logits, all_rows, err);
}

/* The image-span positions below p (the index of p's span row, when p is one). */
static int64_t spans_below(const dsf_kvstate *kv, int64_t p) {
    int64_t c = 0;
    for (int64_t i = 0; i < p; i++) c += kv->vtype[i] != 0;
    return c;
}

/* Positions [from, to) hold no span marks any more (session.h: both 0 at every p >= n). */
static void clear_marks(dsf_kvstate *kv, int64_t from, int64_t to) {
    if (!kv->media || from >= to) return;
    memset(kv->vtype + from, 0, (size_t)(to - from));
    memset(kv->keys + from, 0, (size_t)(to - from) * sizeof(uint64_t));
}

int dsf_batch_eval(dsf_session **ss, const int32_t *tokens, int n, float *logits, char *err) {
    if (n < 1) return dsf_seterr(err, "no tokens to evaluate");
    dsf_engine *e = ss[0]->e;
    const int64_t V = e->shape.n_vocab;
    dsf_session *own = ss[0];
    for (int i = 0; i < n; i++) {
        if (ss[i]->e != e) return dsf_seterr(err, "batch entry %d belongs to another engine", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return dsf_seterr(err, "batch entries %d and %d are the same session", j, i);
        if (ss[i]->kv.n + 1 > ss[i]->kv.max_ctx)
            return dsf_seterr(err, "context too long: session %d is full (%lld tokens)", i, (long long)ss[i]->kv.max_ctx);
        if (tokens[i] < 0 || tokens[i] >= V)
            return dsf_seterr(err, "token %d at index %d is outside the vocabulary (0..%lld)", tokens[i], i,
                              (long long)V - 1);
        if (ss[i]->kv.packed != ss[0]->kv.packed) /* only DSF_KV_PACK changed between sessions */
            return dsf_seterr(err, "batch entries 0 and %d store their KV rows differently (packed / fp32)", i);
        if (ss[i]->kv.max_ctx > own->kv.max_ctx) own = ss[i];
    }
    if (dist_op_batch(ss, tokens, n, err) < 0) return -1;
    /* the scratch of the participant with the largest context serves the whole batch. A failure
     * rolls back every entry that ran; in an MPI job every group runs first (the other ranks
     * run them all) */
    char first[DSF_ERR_LEN] = "";
    int ran = 0;
    while (ran < n && (!first[0] || e->dist)) {
        const int64_t g = n - ran < own->sc.max_chunk ? n - ran : own->sc.max_chunk;
        for (int64_t k = 0; k < g; k++) own->sc.tkv[k] = &ss[ran + k]->kv;
        float *lg = logits ? logits + (size_t)ran * (size_t)V : NULL;
        if (forward_tokens(e, &own->sc, own->sc.tkv, tokens + ran, g, lg, 0, err) < 0 && !first[0])
            snprintf(first, sizeof first, "%s", err);
        for (int64_t k = 0; lg && !first[0] && k < g; k++)
            if (check_logits(lg + k * V, 1, V, ss[ran + k]->kv.n - 1, err) < 0)
                snprintf(first, sizeof first, "batch entry %d: %s", ran + (int)k, err);
        ran += (int)g;
    }
    if (!first[0]) return 0;
    if (e->dist && comm_failed()) return dsf_seterr(err, "%s", first); /* the job is over */
    int emptied = -1; /* a rollback whose re-feed failed too (engram_io.h) */
    for (int j = 0; j < ran; j++)
        if (dsf_session_rollback(ss[j], ss[j]->kv.n - 1, err) < 0) emptied = j;
    if (emptied >= 0) return dsf_seterr(err, "%s (batch entry %d could not be restored: it was emptied)", first, emptied);
    return dsf_seterr(err, "%s", first);
}

static int needs_carry(const dsf_shape *sh) {
    for (int64_t il = 0; il < sh->n_layer; il++)
        if (sh->kv_src[il] == il && sh->ratio[il] > 1) return 1;
    return 0;
}

int dsf_session_rollback(dsf_session *s, int n, char *err) {
    if (n < 0 || n > s->kv.n)
        return dsf_seterr(err, "cannot roll back to %d tokens: the session holds %lld", n, (long long)s->kv.n);
    if (dist_op_rollback(s, n, err) < 0) return -1;
    dsf_kvstate *kv = &s->kv;
    /* spec §5.3: everything is indexed by position, so truncation is exact, except (a) the
     * ratio-2 compressor's pending token, recomputed by re-feeding that token, and (b) window
     * rows that the ring has already overwritten: then re-prefill from the token history
     * (exact: chunking never changes the result). */
    const int64_t old_n = kv->n;
    int64_t keep = n;
    if (needs_carry(&s->e->shape) && n % 2) keep = n - 1;
    int64_t need_lo = keep - s->e->shape.window + 1;
    if (need_lo < 0) need_lo = 0;
    if (need_lo < kv->win_lo) {
        keep = 0;
        kv->win_lo = 0;
    }
    kv->n = keep;
    if (kv->feat_lo > keep) kv->feat_lo = keep; /* the re-prefill below records them */
    /* the re-prefill takes the span marks and rows of [keep, n) as they are (rows [n_erows,
     * ...) past keep's are those positions' rows, in order) */
    if (kv->media) kv->n_erows = spans_below(kv, keep);
    clear_marks(kv, n, old_n);
    for (int64_t i = keep; i < n;) {
        int64_t T = n - i < s->sc.max_chunk ? n - i : s->sc.max_chunk;
        if (forward_chunk(s, kv->tokens + i, T, NULL, 0, err) < 0) {
            /* what the re-prefill wrote cannot be trusted: keep nothing rather than a state
             * that differs from the tokens */
            kv->n = kv->win_lo = kv->feat_lo = kv->n_erows = 0;
            clear_marks(kv, 0, n);
            return dsf_prefixerr(err, "rollback to %d tokens: the session was emptied", n);
        }
        i += T;
    }
    return 0;
}
