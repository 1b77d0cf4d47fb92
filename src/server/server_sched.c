/* server_sched.c: the slots and the scheduler thread of `dsflash serve`.
 *
 * Owns: assignment of queued jobs to slots (srv_assign, under srv->mu), and on the scheduler
 * thread each slot's generation: a job's start and prefill chunks, the batched decode
 * forward of every decoding slot, the generation callbacks that hand text and DSML events to
 * the job's wire format (srv_api_of: SSE bytes into j->out, or the non-streaming reply in
 * j->body), and the job's completion, which releases the slot.
 * Must not: touch sockets or MHD (the connection threads do); call the engine under srv->mu.
 * Speculative decoding (--draft, src/runtime/spec.c): a decoding slot with a drafter plans its
 * round first; when the policy verifies drafts the slot runs its own multi-token forward
 * (spec_verify) and the other slots keep batching; otherwise its token joins the batch.
 * Invariant: only this thread evaluates (one forward at a time across the server);
 * srv_assign, which connection threads call too, only reads idle slots' histories.
 * The scheduler round, assignment and locking are described at the top of server.c. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

/* ==== the job's output (scheduler thread) ================================================= */

/* Appends bytes to the job's stream and wakes its connection (takes srv->mu). */
static void job_emit(srv_server *s, job *j, const dsf_buf *b) {
    pthread_mutex_lock(&s->mu);
    dsf_buf_append(&j->out, b->data, b->len);
    srv_job_wake(s, j); /* resumes its suspended connection */
    pthread_mutex_unlock(&s->mu);
}

/* ==== generation callbacks (scheduler thread) ============================================ */

static int cb_cancel(void *ud) {
    gen_ctx *c = ud;
    return atomic_load(&c->j->cancelled) || c->s->stopping;
}

static void cb_token(void *ud, const dsf_gen_token *t) {
    gen_ctx *c = ud;
    job *j = c->j;
    j->n_gen++;
    const srv_api *api = srv_api_of(j->req.kind);
    if (api->on_token) api->on_token(c->s, j, t);
    if (j->req.logprobs < 0 || t->is_eos) return;
    if (j->n_lp == j->cap_lp) {
        j->cap_lp = j->cap_lp ? 2 * j->cap_lp : 64;
        j->lp = dsf_xrealloc(j->lp, (size_t)j->cap_lp * sizeof *j->lp);
    }
    srv_tokprob *p = &j->lp[j->n_lp++];
    memset(p, 0, sizeof *p);
    p->id = t->id;
    p->logprob = t->logprob;
    p->n_top = t->n_top < 20 ? t->n_top : 20;
    for (int k = 0; k < p->n_top; k++) p->top_ids[k] = t->top_ids[k], p->top_lp[k] = t->top_logprobs[k];
}

/* Runs one of the job's stream writers and hands its bytes to the connection. */
#define EMIT(s, j, CALL)                                                                                         \
    do {                                                                                                         \
        dsf_buf b_ = {0};                                                                                        \
        CALL;                                                                                                    \
        if (b_.len) job_emit(s, j, &b_);                                                                         \
        dsf_buf_free(&b_);                                                                                       \
    } while (0)

static void cb_text(void *ud, const char *text, size_t len) {
    gen_ctx *c = ud;
    job *j = c->j;
    const srv_api *api = srv_api_of(j->req.kind);
    if (!j->req.stream || !api->stream_text || !len) return;
    EMIT(c->s, j, api->stream_text(c->s, j, text, len, &b_));
}

const char *srv_job_call_id(job *j, int index) {
    while (j->n_ids <= index) {
        if (j->n_ids == j->cap_ids) {
            j->cap_ids = j->cap_ids ? 2 * j->cap_ids : 4;
            j->ids = dsf_xrealloc(j->ids, (size_t)j->cap_ids * sizeof *j->ids);
        }
        srv_call_id(j->ids[j->n_ids++], &j->rng);
    }
    return j->ids[index];
}

static void cb_dsml(void *ud, const dsf_dsml_event *ev) {
    gen_ctx *c = ud;
    job *j = c->j;
    const srv_api *api = srv_api_of(j->req.kind);
    if (ev->type == DSF_DSML_TOOL_START || ev->type == DSF_DSML_TOOL_ARGS) srv_job_call_id(j, ev->index);
    if (!j->req.stream || !api->stream_dsml) return;
    EMIT(c->s, j, api->stream_dsml(c->s, j, ev, &b_));
}

/* ==== running jobs (scheduler thread) ====================================================== */

/* The scheduler lets go of the slot's job: it is done; the slot takes the next one. */
static void slot_release(slot *sl) {
    srv_server *s = sl->srv;
    job *j = sl->cur;
    sl->cur = NULL;
    sl->phase = SL_IDLE;
    pthread_mutex_lock(&s->mu);
    sl->j = NULL;
    sl->last_used = dsf_now();
    j->done = true;
    srv_job_wake(s, j); /* resumes its suspended connection */
    srv_assign(s);
    pthread_mutex_unlock(&s->mu);
    srv_job_unref(s, j);
}

/* Builds the job's reply from the generation result (rc: dsf_gen_end's, or -1 when the
 * prefill failed) and releases the slot. */
static void job_complete(slot *sl, int rc, dsf_gen_result *res, bool cancelled, const char *err) {
    srv_server *s = sl->srv;
    job *j = sl->cur;
    j->n_prompt = j->req.n_prompt;
    if (sl->sq) {
        j->sp = *spec_seq_stats(sl->sq);
        atomic_fetch_add(&s->st_sp_rounds, (unsigned long long)j->sp.rounds);
        atomic_fetch_add(&s->st_sp_drafted, (unsigned long long)j->sp.drafted);
        atomic_fetch_add(&s->st_sp_verified, (unsigned long long)j->sp.verified);
        atomic_fetch_add(&s->st_sp_accepted, (unsigned long long)j->sp.accepted);
    }
    j->tps = res->decode_tps;
    j->prefill_s = res->prefill_s, j->decode_s = res->decode_s;
    srv_usage u = {.prompt_tokens = j->req.n_prompt, .completion_tokens = res->n_completion,
                   .cached_tokens = j->n_cached};
    const srv_api *api = srv_api_of(j->req.kind);
    const char *fail = rc ? srv_failure(s) : NULL; /* the MPI job failed: 503, naming why */
    if (cancelled) {
        j->outcome = "cancelled";
    } else if (rc) {
        srv_error e;
        if (fail) srv_fail_mpi(&e, fail);
        else srv_fail(&e, 500, NULL, "generation_failed", "%s", err);
        j->outcome = fail ? "failed" : "error";
        j->status = e.status;
        if (j->req.stream) EMIT(s, j, api->stream_end(s, j, res, &u, &e, &b_));
        else j->body = api->error_body(&e);
    } else {
        j->outcome = srv_finish_reason(res);
        j->status = 200;
        if (j->req.stream) EMIT(s, j, api->stream_end(s, j, res, &u, NULL, &b_));
        else j->body = api->reply(s, j, res, &u);
    }
    dsf_gen_result_free(res);
    slot_release(sl);
}

/* A request the scheduler refuses before its prefill (an image that does not decode, a prompt
 * that its images make too long): its error status and body, in the API's shape. */
static void job_refuse(slot *sl, const srv_error *e) {
    job *j = sl->cur;
    j->outcome = "refused";
    j->status = e->status;
    j->body = srv_api_of(j->req.kind)->error_body(e);
    slot_release(sl);
}

/* A job with images: encodes them and expands its prompt, then lets a waiting stream start. */
static bool job_media(slot *sl, job *j) {
    srv_server *s = sl->srv;
    srv_error e;
    if (srv_media_prepare(s, j, &e)) {
        job_refuse(sl, &e);
        return false;
    }
    pthread_mutex_lock(&s->mu);
    j->ready = true;
    srv_job_wake(s, j);
    pthread_mutex_unlock(&s->mu);
    return true;
}

/* dsf_gen_prefill_begin of the job's prompt up to n, with its images. */
static int prefill_begin(slot *sl, const job *j, int n, char *err) {
    if (!j->mm.n) return dsf_gen_prefill_begin(sl->g, j->req.prompt, n, sl->srv->p.prefill_chunk, err);
    return dsf_gen_prefill_begin_media(sl->g, j->req.prompt, &j->media, n, sl->srv->p.prefill_chunk, err);
}

/* A prefill that failed or was cancelled: no generation ran. */
static void job_abort_prefill(slot *sl, const char *err) {
    dsf_gen_result res;
    memset(&res, 0, sizeof res);
    res.n_cached = sl->cur->n_cached;
    bool cancelled = atomic_load(&sl->cur->cancelled) || sl->srv->stopping;
    job_complete(sl, -1, &res, cancelled, err);
}

/* Ends the slot's generation (a running one counts as cancelled) and completes the job. */
static void job_end_generation(slot *sl) {
    char err[DSF_ERR_LEN] = "";
    dsf_gen_result res;
    int rc = dsf_gen_end(sl->g, &res, err);
    job_complete(sl, rc, &res, res.finish == DSF_FINISH_CANCELLED, err);
}

/* One generation step on the slot's logits (NULL: the prefill's); the slot then waits for
 * the next decode round or its job is complete. */
static void slot_step(slot *sl, const float *logits) {
    char err[DSF_ERR_LEN] = "";
    if (dsf_gen_next(sl->g, logits, &sl->next_tok, err) == DSF_FINISH_NONE) sl->phase = SL_DECODE;
    else job_end_generation(sl);
}

/* Starts the job assigned to an idle slot: its generation parameters and its prefill. */
static void job_start(slot *sl, job *j) {
    srv_server *s = sl->srv;
    char err[DSF_ERR_LEN] = "";
    sl->cur = j;
    sl->ctx = (gen_ctx){.s = s, .sl = sl, .j = j};
    if (sl->sq) spec_seq_stats_reset(sl->sq);
    dsf_gen_params *gp = &sl->gp;
    dsf_gen_params_default(gp);
    gp->sampler.temperature = j->req.temperature;
    gp->sampler.top_k = j->req.top_k;
    gp->sampler.top_p = j->req.top_p;
    gp->sampler.min_p = j->req.min_p;
    gp->sampler.seed = j->req.has_seed ? j->req.seed : j->rng;
    gp->sampler.max_tokens = j->req.max_tokens;
    gp->sampler.stop = (const char *const *)j->req.stop;
    gp->sampler.n_stop = j->req.n_stop;
    gp->sampler.ignore_eos = j->req.ignore_eos;
    gp->logprobs = j->req.logprobs >= 0;
    gp->top_logprobs = j->req.logprobs > 0 ? j->req.logprobs : 0;
    gp->parse_dsml = srv_api_of(j->req.kind)->stream_dsml != NULL; /* a chat-shaped generation */
    gp->dsml_thinking = j->req.gen_reasoning;
    gp->grammar = j->req.grammar;
    gp->on_text = cb_text;
    gp->on_dsml = cb_dsml;
    gp->on_token = cb_token;
    gp->cancel = cb_cancel;
    gp->ud = &sl->ctx;
    /* the prefix reused from the slot's session, or restored from the disk cache; the prefill
     * then runs in segments that end at the cache's boundaries (server_pcache.c) */
    if (j->req.n_images && !job_media(sl, j)) return;
    int have = srv_pc_start_job(s, sl, j);
    sl->pf_end = srv_pc_boundary(s, j, have);
    sl->pf_left = prefill_begin(sl, j, sl->pf_end, err);
    j->n_cached = dsf_gen_n_cached(sl->g); /* known now: a stream's first event may report it */
    if (sl->pf_left < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    sl->phase = SL_PREFILL;
}

/* One prefill chunk; when the prompt is complete, the generation starts with its first token. */
static void slot_prefill_step(slot *sl) {
    srv_server *s = sl->srv;
    job *j = sl->cur;
    char err[DSF_ERR_LEN] = "";
    double t0 = dsf_now();
    int left = dsf_gen_prefill_step(sl->g, err);
    if (left < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    srv_pc_prefill_rate(s, sl->pf_left - left, dsf_now() - t0);
    sl->pf_left = left;
    if (left > 0) return;
    if (sl->pf_end < j->req.n_prompt) { /* a cache boundary: store it, prefill the next segment */
        srv_pc_store(s, sl, j, sl->pf_end);
        sl->pf_end = srv_pc_boundary(s, j, sl->pf_end);
        sl->pf_left = prefill_begin(sl, j, sl->pf_end, err);
        if (sl->pf_left < 0) job_abort_prefill(sl, err);
        return;
    }
    if (dsf_gen_begin(sl->g, &sl->gp, err) < 0) {
        job_abort_prefill(sl, err);
        return;
    }
    slot_step(sl, NULL);
}

/* One forward for the pending tokens of up to max_batch decoding slots. */
static void decode_batch(srv_server *s, int n) {
    char err[DSF_ERR_LEN] = "";
    double t0 = dsf_now();
    int rc = dsf_batch_eval(s->b_sess, s->b_tok, n, s->b_logits, err);
    double dt = dsf_now() - t0;
    unsigned long long fw = atomic_fetch_add(&s->st_forwards, 1) + 1;
    atomic_fetch_add(&s->st_tokens, (unsigned long long)n);
    if (n > atomic_load(&s->st_max_batch)) atomic_store(&s->st_max_batch, n);
    dsf_log(2, "serve: decode forward %llu batch %d", fw, n);
    for (int k = 0; k < n; k++) {
        slot *sl = s->b_slot[k];
        job *j = sl->cur;
        j->batch_sum += n;
        j->batch_n++;
        if (n > j->batch_max) j->batch_max = n;
        /* a drafting slot tells its drafter (and, alone in the forward, its cost table) */
        if (rc == 0 && sl->in_batch_spec) rc = spec_plain_done(sl->sq, sl->g, n == 1 ? dt : 0.0, err);
        sl->in_batch_spec = false;
        if (rc < 0) {
            dsf_gen_fail(sl->g, err);
            job_end_generation(sl);
        } else {
            slot_step(sl, s->b_logits + (size_t)k * (size_t)s->n_vocab);
        }
    }
}

/* A decoding slot with a drafter: plans its round and, when the policy verifies drafts, runs
 * it alone (one multi-token forward). Returns true when the slot's token should join the
 * batched forward instead. */
static bool slot_spec_round(srv_server *s, slot *sl) {
    char err[DSF_ERR_LEN] = "";
    int n = spec_plan(sl->sq, sl->g, sl->next_tok, err);
    if (n == 0) return sl->in_batch_spec = true;
    dsf_finish_reason fin = DSF_FINISH_ERROR;
    if (n > 0) {
        fin = spec_verify(sl->sq, sl->g, sl->next_tok, &sl->next_tok, err);
        atomic_fetch_add(&s->st_forwards, 1);
        atomic_fetch_add(&s->st_tokens, (unsigned long long)n + 1);
    } else {
        dsf_gen_fail(sl->g, err);
    }
    if (fin != DSF_FINISH_NONE) job_end_generation(sl);
    return false;
}

/* The MPI job failed (srv_failure: every engine call fails at once now): every job on a slot
 * gets its 503 without another engine call; queued jobs follow as srv_assign hands them over. */
static void sched_fail(srv_server *s, job **assigned, const char *fail) {
    srv_error e;
    srv_fail_mpi(&e, fail);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->cur && assigned[i]) { /* not started: the same answer as a failed prefill */
            sl->cur = assigned[i];
            pthread_mutex_lock(&s->mu);
            sl->cur->ready = true; /* a stream waiting for its images starts, and reads the error event */
            pthread_mutex_unlock(&s->mu);
            job_abort_prefill(sl, e.message);
        } else if (sl->phase == SL_PREFILL) {
            job_abort_prefill(sl, e.message);
        } else if (sl->phase == SL_DECODE) {
            dsf_gen_fail(sl->g, e.message);
            job_end_generation(sl);
        }
    }
}

/* Under srv->mu: hands queued jobs to free slots (longest common prefix, then LRU). */
void srv_assign(srv_server *s) {
    /* while stopping, slot threads may already have exited: queued jobs are cancelled by
     * their connections instead */
    while (s->qhead && !s->stopping) {
        slot *best = NULL;
        int best_lcp = -1;
        job *j = s->qhead;
        slot *lru = NULL;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->j) continue;
            if (!lru || sl->last_used < lru->last_used) lru = sl;
            const int32_t *h = dsf_session_tokens(sl->s);
            int n = dsf_session_n_past(sl->s), l = 0;
            while (l < n && l < j->req.n_prompt && h[l] == j->req.prompt[l]) l++;
            /* Reuse a slot only when the prompt continues what it holds (at least half of
             * the slot's history or of the prompt is shared); otherwise take the least
             * recently used slot and leave other conversations' caches alone. */
            if (l == 0 || (2 * l < n && 2 * l < j->req.n_prompt)) continue;
            if (l > best_lcp || (l == best_lcp && sl->last_used < best->last_used)) best = sl, best_lcp = l;
        }
        if (!best) best = lru;
        if (!best) return;
        s->qhead = j->next;
        if (!s->qhead) s->qtail = NULL;
        s->n_queued--;
        j->next = NULL;
        j->slot_id = best->id;
        best->j = j;
        pthread_cond_signal(&s->sched_cv);
    }
}

void *srv_sched_main(void *arg) {
    srv_server *s = arg;
    job **assigned = dsf_xcalloc((size_t)s->n_slots, sizeof *assigned);
    int rr = 0; /* the slot after the one that prefilled last */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool any = false;
        for (;;) {
            for (int i = 0; i < s->n_slots; i++) any |= (assigned[i] = s->slots[i].j) != NULL;
            if (any || s->stopping) break;
            pthread_cond_wait(&s->sched_cv, &s->mu);
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        const char *fail = srv_failure(s);
        if (fail && !stopping) {
            sched_fail(s, assigned, fail);
            continue;
        }

        /* (1) new jobs in, cancelled jobs out (all of them when stopping) */
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->cur && assigned[i]) {
                if (stopping) {
                    sl->cur = assigned[i];
                    sl->cur->outcome = "cancelled";
                    slot_release(sl);
                    continue;
                }
                job_start(sl, assigned[i]);
            }
            if (!sl->cur || (!stopping && !atomic_load(&sl->cur->cancelled))) continue;
            if (sl->phase == SL_PREFILL) job_abort_prefill(sl, "cancelled");
            else job_end_generation(sl);
        }
        if (stopping) break;

        /* (2) one batched forward for every decoding slot */
        int n = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->phase != SL_DECODE) continue;
            if (sl->sq && !slot_spec_round(s, sl)) continue;
            s->b_sess[n] = sl->s;
            s->b_tok[n] = sl->next_tok;
            s->b_slot[n] = sl;
            if (++n == s->max_batch) {
                decode_batch(s, n);
                n = 0;
            }
        }
        if (n) decode_batch(s, n);

        /* (3) one prefill chunk, slots taking turns */
        for (int k = 0; k < s->n_slots; k++) {
            slot *sl = &s->slots[(rr + k) % s->n_slots];
            if (sl->phase != SL_PREFILL) continue;
            rr = (sl->id + 1) % s->n_slots;
            slot_prefill_step(sl);
            break;
        }
    }
    free(assigned);
    return NULL;
}
