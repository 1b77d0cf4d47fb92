/* server_pcache.c: the scheduler's use of the disk prefix cache (--cache-dir, pcache.h): which
 * prefixes are stored, and whether a new job restores one or prefills.
 *
 * Boundaries: a prefill stops (and the slot's session is saved into the cache) at
 *   - the end of the system/tools preamble: the prompt up to its first <｜User｜> or
 *     <｜Assistant｜> token. The V4.1 encoder (spec chat-format.md §2) renders BOS, then the
 *     leading <｜System｜> block (system text, tools, response format, effort line), then the
 *     turns, each opened by one of those two added tokens; an added token is matched whole by
 *     the tokenizer, never merged with its neighbours, so the preamble's tokens are the same in
 *     every request that shares it and ends exactly there, whatever follows;
 *   - every --cache-every tokens of a long prefill;
 *   - one token before the end of the prompt: the last prompt token is always evaluated for its
 *     logits (generate.c), so an entry of the whole prompt could not serve the same prompt again,
 *     and rolling a restored snapshot back is not exact without re-prefilling (snapshots keep the
 *     window only). n_prompt - 1 serves both a repeated prompt and its continuations.
 * Restore or prefill: a job first reuses what its slot holds (srv_assign chose the slot with
 * the longest common prefix in RAM); a longer entry on disk is restored only when its measured
 * cost is lower: bytes / restore rate (measured on each restore: read, checks and
 * dsf_session_restore) against the extra tokens / prefill rate (measured on each prefill
 * chunk). Before any measurement both rates take conservative defaults (a slow disk, a fast
 * prefill), so a restore must win clearly. DSF_PCACHE_RESTORE=always|never overrides the
 * decision (tests, and measuring the crossover).
 * Images: a key hashes each position's content key with its id (pcache_key_of_media), a restore
 * is checked against the job's keys as well as its ids, and no boundary falls inside an image
 * span, so an entry holds whole spans and the same text with another image never hits.
 * Must not: run under srv->mu (files and the engine); write files itself (pcache's writer does).
 * Invariant: a restored session holds exactly a prefix of the job's prompt (checked after the
 * restore; anything else is discarded and the session rolled back to empty). */
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

/* Conservative defaults: a slow disk (restores read at 100 MB/s) and a fast prefill (5,000
 * tokens/s, above what a CPU reaches on the full model); plus a fixed cost per restore. */
#define PC_DEFAULT_RESTORE_BPS 100e6
#define PC_DEFAULT_PREFILL_TPS 5000.0
#define PC_RESTORE_OVERHEAD_S 0.002

/* The id of a special token written alone, or -1. */
static int32_t special_id(const dsf_tokenizer *tok, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[DSF_ERR_LEN];
    int32_t id = dsf_tokenize(tok, text, strlen(text), false, true, &ids, &n, err) == 0 && n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}

/* /metrics' view of the cache (srv->cache_stats). */
static void metrics_stats(srv_server *s, srv_cache_stats *out) {
    pcache_stats st;
    pcache_get_stats(s->pc, &st);
    *out = (srv_cache_stats){.hits = st.hits, .misses = st.misses, .hit_tokens = atomic_load(&s->pc_hit_tokens),
                             .evictions = st.evictions, .bytes = st.bytes, .entries = st.entries};
}

/* srv_drain's flush (srv->cache_flush): the queued writes reach the disk. */
static void flush(srv_server *s) { pcache_flush(s->pc); }

int srv_pc_open(srv_server *s, char *err) {
    if (!s->p.cache_dir) return 0;
    if (!(s->p.cache_max_gb > 0)) return dsf_seterr(err, "--cache-max-gb must be > 0 with --cache-dir");
    s->pc_ident = dsf_engine_state_id(s->e);
    s->pc = pcache_open(s->p.cache_dir, (uint64_t)(s->p.cache_max_gb * 1073741824.0), s->pc_ident, err);
    if (!s->pc) return -1;
    s->pc_user = special_id(s->tok, "<｜User｜>");
    s->pc_assistant = special_id(s->tok, "<｜Assistant｜>");
    s->cache_stats = metrics_stats;
    s->cache_flush = flush;
    return 0;
}

void srv_pc_close(srv_server *s) {
    pcache_close(s->pc);
    s->pc = NULL;
}

void srv_pcache_stats(srv_server *s, pcache_stats *out) { pcache_get_stats(s ? s->pc : NULL, out); }

void srv_pc_prefill_rate(srv_server *s, int tokens, double secs) {
    if (tokens < 8 || secs <= 0) return; /* too short to measure a throughput */
    double r = tokens / secs;
    s->pc_prefill_tps = s->pc_prefill_tps > 0 ? 0.7 * s->pc_prefill_tps + 0.3 * r : r;
}

static void restore_rate(srv_server *s, size_t bytes, double secs) {
    if (secs <= 0) return;
    double r = (double)bytes / secs;
    s->pc_restore_bps = s->pc_restore_bps > 0 ? 0.7 * s->pc_restore_bps + 0.3 * r : r;
}

/* True when restoring `bytes` should beat prefilling `tokens`. */
static bool restore_wins(const srv_server *s, uint64_t bytes, int tokens) {
    const char *force = dsf_knob("DSF_PCACHE_RESTORE");
    if (force && !strcmp(force, "always")) return true;
    if (force && !strcmp(force, "never")) return false;
    double bps = s->pc_restore_bps > 0 ? s->pc_restore_bps : PC_DEFAULT_RESTORE_BPS;
    double tps = s->pc_prefill_tps > 0 ? s->pc_prefill_tps : PC_DEFAULT_PREFILL_TPS;
    return PC_RESTORE_OVERHEAD_S + (double)bytes / bps < tokens / tps;
}

/* The content key of position i (0: text) of the session / of the job's prompt. */
static uint64_t key_at(const uint64_t *keys, int i) { return keys ? keys[i] : 0; }

/* Whether the session's first n positions hold the job's images (and text where it has text). */
static bool keys_agree(const slot *sl, const job *j, int n) {
    const uint64_t *hk = dsf_session_keys(sl->s), *jk = srv_job_keys(j);
    for (int i = 0; i < n; i++)
        if (key_at(hk, i) != key_at(jk, i)) return false;
    return true;
}

/* Loads and restores the entry into the slot's session; false (logged, session as it was or
 * empty) when anything fails. */
static bool restore(srv_server *s, slot *sl, const job *j, pcache_key key, int n) {
    char err[DSF_ERR_LEN] = "";
    uint8_t *data = NULL;
    size_t len = 0;
    double t0 = dsf_now();
    if (pcache_load(s->pc, key, n, &data, &len, err)) {
        dsf_log(1, "serve: prefix cache: entry of %d tokens not used: %s", n, err);
        return false;
    }
    int rc = dsf_session_restore(sl->s, data, len, err);
    free(data);
    if (rc) { /* the file was intact but its snapshot is not this engine's: never use it */
        pcache_discard(s->pc, key, err);
        return false;
    }
    restore_rate(s, len, dsf_now() - t0);
    if (dsf_session_n_past(sl->s) != n || memcmp(dsf_session_tokens(sl->s), j->req.prompt, (size_t)n * sizeof(int32_t)) ||
        !keys_agree(sl, j, n)) {
        pcache_discard(s->pc, key, "its tokens are not the prefix its key names");
        dsf_session_rollback(sl->s, 0, err);
        return false;
    }
    atomic_fetch_add(&s->pc_hit_tokens, (unsigned long long)n);
    dsf_log(1, "serve: prefix cache: restored %d tokens (%zu bytes) from disk in %.6f s", n, len, dsf_now() - t0);
    return true;
}

/* The tokens of the session that the prompt's first n_prompt - 1 tokens repeat. */
static int shared_prefix(const slot *sl, const job *j) {
    const int32_t *h = dsf_session_tokens(sl->s);
    const uint64_t *hk = dsf_session_keys(sl->s), *jk = srv_job_keys(j);
    int n_have = dsf_session_n_past(sl->s), have = 0;
    while (have < n_have && have < j->req.n_prompt - 1 && h[have] == j->req.prompt[have] &&
           key_at(hk, have) == key_at(jk, have))
        have++;
    return have;
}

int srv_pc_start_job(srv_server *s, slot *sl, job *j) {
    int P = j->req.n_prompt;
    j->n_preamble = 0;
    for (int i = 0; i < P; i++)
        if (j->req.prompt[i] == s->pc_user || j->req.prompt[i] == s->pc_assistant) {
            j->n_preamble = i;
            break;
        }
    int have = shared_prefix(sl, j);
    if (!s->pc || P < 2) return have;
    /* a bad entry is discarded by the failed restore: the next lookup finds the next longest */
    for (int tries = 0; tries < 3; tries++) {
        pcache_key key;
        uint64_t bytes = 0;
        int n = pcache_lookup_media(s->pc, j->req.prompt, srv_job_keys(j), P - 1, &key, &bytes);
        if (n <= have || !restore_wins(s, bytes, n - have)) break;
        if (restore(s, sl, j, key, n)) return n;
        have = shared_prefix(sl, j);
    }
    return have;
}

int srv_pc_boundary(const srv_server *s, const job *j, int after) {
    int P = j->req.n_prompt, b = P;
    if (!s->pc || P < 2) return P;
    if (after < P - 1) b = P - 1;
    if (j->n_preamble > after && j->n_preamble < b) b = j->n_preamble;
    int every = s->p.cache_every;
    if (every > 0) {
        long long k = ((long long)after / every + 1) * every;
        if (k < b) b = (int)k;
    }
    /* never inside an image span (it is prefilled in one forward): on to its END, which is
     * followed by text, so b stays <= P - 1 */
    const int8_t *ty = j->mm.n ? j->mm.types : NULL;
    while (ty && b < P && ty[b - 1] >= 0 && ty[b - 1] != DSF_TOKEN_IMAGE_END) b++;
    return b;
}

void srv_pc_store(srv_server *s, slot *sl, const job *j, int n) {
    char err[DSF_ERR_LEN] = "";
    uint8_t *data = NULL;
    size_t len = 0;
    if (dsf_session_n_past(sl->s) != n || dsf_session_save(sl->s, &data, &len, err)) {
        dsf_log(1, "serve: prefix cache: cannot save %d tokens: %s", n, err[0] ? err : "the session moved");
        return;
    }
    pcache_put(s->pc, pcache_key_of_media(s->pc_ident, j->req.prompt, srv_job_keys(j), n), n, data, len);
}
