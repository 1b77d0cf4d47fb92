/* metrics.c: GET /metrics, the server's counters in Prometheus' text exposition format 0.0.4
 * (one "# HELP" and one "# TYPE" line per family; counters end in _total; label values
 * quoted and escaped; one sample per line).
 *
 * Owns: the request, token and time counters it keeps itself (struct srv_metrics, under its
 * own mutex), and the exposition, which also reads the server's live figures (queue, slots,
 * connections, decode batches, the prefix cache's srv_cache_stats).
 * Must not: take srv->mu while it holds its own mutex (it never nests them), or format
 * anything a scrape could not parse (names [a-zA-Z_:][a-zA-Z0-9_:]*, no NaN from a division).
 * Invariant: every counter only grows. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

/* The endpoints of dsflash_requests_total's label, as routed (with or without /v1). */
static const char *const endpoints[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                        "/v1/messages/count_tokens", "/v1/responses", "/v1/responses/{id}",
                                        "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize", "other"};
enum { N_EP = sizeof endpoints / sizeof *endpoints, MIN_STATUS = 100, MAX_STATUS = 599 };

struct srv_metrics {
    pthread_mutex_t mu;
    unsigned long long req[N_EP][MAX_STATUS - MIN_STATUS + 1];
    unsigned long long jobs, prompt_tokens, cached_tokens, prefill_tokens, gen_tokens;
    double prefill_s, decode_s;        /* summed wall times of the jobs' prefills and decodes */
    double last_prefill_tps, last_decode_tps;
    unsigned long long conn_refused, read_timeouts;
};

struct srv_metrics *srv_metrics_new(void) {
    struct srv_metrics *m = dsf_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_free(struct srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int endpoint_of(const char *url) {
    const char *p = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    for (int i = 0; i < N_EP - 1; i++) {
        const char *e = endpoints[i] + (strncmp(endpoints[i], "/v1/", 4) ? 0 : 3);
        size_t n = strlen(e);
        if (!strcmp(e, "/responses/{id}")) {
            if (!strncmp(p, "/responses/", 11) && p[11]) return i;
        } else if (!strncmp(p, e, n) && (p[n] == 0 || p[n] == '?')) {
            return i;
        }
    }
    return N_EP - 1;
}

void srv_metrics_request(srv_server *s, const char *url, int status) {
    struct srv_metrics *m = s->metrics;
    if (!m || status < MIN_STATUS || status > MAX_STATUS) return;
    int ep = endpoint_of(url ? url : "");
    pthread_mutex_lock(&m->mu);
    m->req[ep][status - MIN_STATUS]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_job(srv_server *s, const job *j) {
    struct srv_metrics *m = s->metrics;
    if (!m) return;
    int evaluated = j->req.n_prompt - j->n_cached;
    pthread_mutex_lock(&m->mu);
    m->jobs++;
    m->prompt_tokens += (unsigned long long)(j->req.n_prompt > 0 ? j->req.n_prompt : 0);
    m->cached_tokens += (unsigned long long)(j->n_cached > 0 ? j->n_cached : 0);
    m->gen_tokens += (unsigned long long)(j->n_gen > 0 ? j->n_gen : 0);
    if (j->prefill_s > 0 && evaluated > 0) {
        m->prefill_tokens += (unsigned long long)evaluated;
        m->prefill_s += j->prefill_s;
        m->last_prefill_tps = evaluated / j->prefill_s;
    }
    if (j->decode_s > 0 && j->n_gen > 0) {
        m->decode_s += j->decode_s;
        m->last_decode_tps = j->tps;
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_conn_refused(srv_server *s) {
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->conn_refused++;
    pthread_mutex_unlock(&s->metrics->mu);
}

void srv_metrics_read_timeout(srv_server *s) {
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->read_timeouts++;
    pthread_mutex_unlock(&s->metrics->mu);
}

/* ==== the exposition ======================================================================= */

static void family(dsf_buf *b, const char *name, const char *type, const char *help) {
    dsf_buf_appendf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_u(dsf_buf *b, const char *name, const char *type, const char *help, unsigned long long v) {
    family(b, name, type, help);
    dsf_buf_appendf(b, "%s %llu\n", name, v);
}

static void sample_f(dsf_buf *b, const char *name, const char *type, const char *help, double v) {
    family(b, name, type, help);
    dsf_buf_appendf(b, "%s %.6f\n", name, v);
}

char *srv_metrics_text(srv_server *s) {
    /* the live figures first (srv->mu), then a copy of the counters (the metrics' mutex) */
    pthread_mutex_lock(&s->mu);
    int queued = s->n_queued, busy = 0, suspended = s->n_suspended;
    for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].j != NULL;
    pthread_mutex_unlock(&s->mu);
    srv_cache_stats cs;
    memset(&cs, 0, sizeof cs);
    if (s->cache_stats) s->cache_stats(s, &cs);
    struct srv_metrics *m = dsf_xmalloc(sizeof *m);
    pthread_mutex_lock(&s->metrics->mu);
    memcpy(m, s->metrics, sizeof *m);
    pthread_mutex_unlock(&s->metrics->mu);

    dsf_buf b = {0};
    family(&b, "dsflash_requests_total", "counter", "HTTP requests answered, by endpoint and status (499: the client left).");
    for (int e = 0; e < N_EP; e++)
        for (int st = MIN_STATUS; st <= MAX_STATUS; st++)
            if (m->req[e][st - MIN_STATUS])
                dsf_buf_appendf(&b, "dsflash_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", endpoints[e], st,
                                m->req[e][st - MIN_STATUS]);
    sample_u(&b, "dsflash_queue_length", "gauge", "Generation requests waiting for a slot.", (unsigned long long)queued);
    sample_u(&b, "dsflash_slots", "gauge", "Slots (concurrent sequences).", (unsigned long long)s->n_slots);
    sample_u(&b, "dsflash_slots_busy", "gauge", "Slots running a request.", (unsigned long long)busy);
    sample_u(&b, "dsflash_generation_requests_total", "counter", "Generation requests finished (any outcome).", m->jobs);
    sample_u(&b, "dsflash_prompt_tokens_total", "counter", "Prompt tokens of finished generation requests.",
             m->prompt_tokens);
    sample_u(&b, "dsflash_prompt_cached_tokens_total", "counter",
             "Prompt tokens reused from a slot's or the prefix cache's state instead of prefilled.", m->cached_tokens);
    sample_u(&b, "dsflash_prefill_tokens_total", "counter", "Prompt tokens evaluated by prefills.", m->prefill_tokens);
    sample_f(&b, "dsflash_prefill_seconds_total", "counter", "Wall seconds spent in prefills.", m->prefill_s);
    sample_u(&b, "dsflash_generated_tokens_total", "counter", "Tokens sampled by finished generation requests.",
             m->gen_tokens);
    sample_f(&b, "dsflash_decode_seconds_total", "counter", "Wall seconds spent decoding.", m->decode_s);
    sample_f(&b, "dsflash_prefill_tokens_per_second", "gauge", "Prefill speed of the last request that prefilled.",
             m->last_prefill_tps);
    sample_f(&b, "dsflash_decode_tokens_per_second", "gauge", "Decode speed of the last request that decoded.",
             m->last_decode_tps);
    sample_u(&b, "dsflash_decode_forwards_total", "counter", "Decode forwards (each evaluates a batch of sequences).",
             atomic_load(&s->st_forwards));
    sample_u(&b, "dsflash_decode_batch_tokens_total", "counter",
             "Tokens evaluated by decode forwards (divided by the forwards: the mean batch size).",
             atomic_load(&s->st_tokens));
    sample_u(&b, "dsflash_decode_batch_size_max", "gauge", "Largest decode batch so far.",
             (unsigned long long)atomic_load(&s->st_max_batch));
    sample_u(&b, "dsflash_prefix_cache_hits_total", "counter", "Prefix-cache lookups that restored a prefix.", cs.hits);
    sample_u(&b, "dsflash_prefix_cache_misses_total", "counter", "Prefix-cache lookups that found none.", cs.misses);
    sample_u(&b, "dsflash_prefix_cache_hit_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
             cs.hit_tokens);
    sample_u(&b, "dsflash_prefix_cache_evictions_total", "counter", "Prefix-cache entries evicted.", cs.evictions);
    sample_u(&b, "dsflash_prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", cs.bytes);
    sample_u(&b, "dsflash_prefix_cache_entries", "gauge", "Entries held by the prefix cache.", cs.entries);
    sample_u(&b, "dsflash_connections_open", "gauge", "Open client connections.",
             (unsigned long long)atomic_load(&s->n_conn));
    sample_u(&b, "dsflash_connections_waiting", "gauge", "Connections suspended while their request waits or runs.",
             (unsigned long long)suspended);
    sample_u(&b, "dsflash_connections_refused_total", "counter", "Requests answered 503 beyond --max-conn.",
             m->conn_refused);
    sample_u(&b, "dsflash_read_timeouts_total", "counter",
             "Connections closed without a complete request within --read-timeout.", m->read_timeouts);
    free(m);
    dsf_buf_append(&b, "", 0);
    return (char *)b.data;
}
