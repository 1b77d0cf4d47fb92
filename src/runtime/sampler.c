/* sampler.c: next-token sampling, log-probabilities and the stop-string matcher.
 *
 * Owns: the filters (top-k, top-p, min-p), temperature, the seeded draw, and stop-string
 * hold-back. Knows nothing of models or tokenizers: logits in, an id out.
 * Invariants: dsf_sample is a pure function of (logits, params, rng state); ties are broken
 * by the lower id everywhere, so results do not depend on sort stability; the only state
 * that changes is *rng_state, by exactly one draw per non-greedy call.
 *
 * Filter order (llama.cpp's default chain, common/sampling): top-k -> top-p -> min-p ->
 * temperature -> draw. top-p and min-p therefore see the softmax at temperature 1 and the
 * temperature only reshapes the draw among the survivors. top-p keeps the shortest
 * most-likely-first prefix whose probability reaches p (the token that crosses p is kept);
 * min-p keeps the tokens with p_i >= min_p * p_max. At least one token always survives. */
#include "runtime/sampler.h"
#include "base/util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== rng =============================================================================== */

uint64_t dsf_rng_init(uint64_t seed) { return seed; }

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit word of state, full period 2^64. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double dsf_rng_uniform(uint64_t *state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

void dsf_sampler_params_default(dsf_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->eos_id = -1;
}

/* ==== candidates ======================================================================== */

typedef struct {
    float logit;
    int32_t id;
} cand;

/* a ranks before b: higher logit, then lower id */
static bool before(cand a, cand b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

static int cand_cmp(const void *x, const void *y) {
    cand a = *(const cand *)x, b = *(const cand *)y;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

size_t dsf_sample_scratch_bytes(int n_vocab) {
    return n_vocab > 0 ? (size_t)n_vocab * sizeof(cand) : sizeof(cand);
}

/* The tokens that can be sampled at all: finite logits (+inf clamped to FLT_MAX), EOS
 * masked under ignore_eos. */
static int collect(const float *logits, int n, const dsf_sampler_params *p, cand *c) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (p->ignore_eos && i == p->eos_id) continue;
        c[m].logit = l > FLT_MAX ? FLT_MAX : l;
        c[m].id = i;
        m++;
    }
    return m;
}

/* Min-heap by rank (the worst candidate at the root) for top-k selection. */
static void sift_down(cand *h, int n, int i) {
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(h[w], h[l])) w = l;
        if (r < n && before(h[w], h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Sorts c[0..m) most likely first, keeping only the best k when 0 < k < m. Returns the new m. */
static int sort_topk(cand *c, int m, int k) {
    if (k > 0 && k < m) {
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
        for (int i = k; i < m; i++)
            if (before(c[i], c[0])) {
                c[0] = c[i];
                sift_down(c, k, 0);
            }
        m = k;
    }
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
    return m;
}

static bool top_p_on(const dsf_sampler_params *p) { return p->top_p > 0.0f && p->top_p < 1.0f; }
static bool min_p_on(const dsf_sampler_params *p) { return p->min_p > 0.0f; }

/* top-k -> top-p -> min-p over c[0..m) (sorted on return). Returns the survivors' count. */
static int filter(cand *c, int m, const dsf_sampler_params *p) {
    m = sort_topk(c, m, p->top_k);
    double lmax = c[0].logit;
    if (top_p_on(p) && m > 1) {
        double sum = 0.0, cum = 0.0;
        for (int i = 0; i < m; i++) sum += exp((double)c[i].logit - lmax);
        for (int i = 0; i < m; i++) {
            cum += exp((double)c[i].logit - lmax) / sum;
            if (cum >= (double)p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (min_p_on(p) && m > 1) {
        int keep = 1;
        while (keep < m && exp((double)c[keep].logit - lmax) >= (double)p->min_p) keep++;
        m = keep;
    }
    return m;
}

int sampler_survivors(const float *logits, int n_vocab, const dsf_sampler_params *p,
                      int32_t *ids, void *scratch) {
    if (n_vocab <= 0) return 0;
    cand *c = scratch;
    int m = collect(logits, n_vocab, p, c);
    if (m == 0) return 0;
    m = filter(c, m, p);
    for (int i = 0; i < m; i++) ids[i] = c[i].id;
    return m;
}

/* ==== sampling ========================================================================== */

/* Greedy over logits [i0, i1), merged into (*best, *bl): the largest logit, the lowest id
 * among equal ones; NaN and -inf never win (best stays -1 if nothing does). Eight running
 * maxima over interleaved ids, merged at the end, so that no id waits on the previous
 * compare (docs/perf-log.md, item 35). */
static void greedy_scan(const float *logits, int i0, int i1, int32_t *best, float *bl) {
    float m[8];
    int32_t id[8];
    for (int j = 0; j < 8; j++) {
        m[j] = -INFINITY;
        id[j] = -1;
    }
    int i = i0;
    for (; i + 8 <= i1; i += 8)
        for (int j = 0; j < 8; j++)
            if (logits[i + j] > m[j]) {
                m[j] = logits[i + j];
                id[j] = i + j;
            }
    for (; i < i1; i++) /* the tail's ids exceed lane 0's, and > keeps the lowest on ties */
        if (logits[i] > m[0]) {
            m[0] = logits[i];
            id[0] = i;
        }
    for (int j = 0; j < 8; j++)
        if (id[j] >= 0 && (*best < 0 || m[j] > *bl || (m[j] == *bl && id[j] < *best))) {
            *best = id[j];
            *bl = m[j];
        }
}

int32_t dsf_sample_ws(const float *logits, int n_vocab, const dsf_sampler_params *p,
                      uint64_t *rng_state, void *scratch) {
    if (n_vocab <= 0 || !logits) return -1;
    if (!(p->temperature > 0.0f)) { /* greedy (also for a NaN temperature) */
        int32_t best = -1;
        float bl = 0.0f;
        if (p->ignore_eos && p->eos_id >= 0 && p->eos_id < n_vocab) {
            greedy_scan(logits, 0, p->eos_id, &best, &bl);
            greedy_scan(logits, p->eos_id + 1, n_vocab, &best, &bl);
        } else greedy_scan(logits, 0, n_vocab, &best, &bl);
        return best;
    }
    cand *c = scratch;
    int m = collect(logits, n_vocab, p, c);
    if (m == 0) return -1;
    double lmax;
    if (p->top_k > 0 || top_p_on(p) || min_p_on(p)) {
        m = filter(c, m, p);
        lmax = c[0].logit;
    } else {
        lmax = c[0].logit;
        for (int i = 1; i < m; i++)
            if (c[i].logit > lmax) lmax = c[i].logit;
    }
    double inv_t = 1.0 / (double)p->temperature;
    double total = 0.0;
    for (int i = 0; i < m; i++) total += exp(((double)c[i].logit - lmax) * inv_t);
    double u = dsf_rng_uniform(rng_state) * total, acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += exp(((double)c[i].logit - lmax) * inv_t);
        if (u < acc) return c[i].id;
    }
    /* u landed in the rounding gap at the top: the last candidate with weight > 0 */
    for (int i = m - 1; i >= 0; i--)
        if (exp(((double)c[i].logit - lmax) * inv_t) > 0.0) return c[i].id;
    return c[0].id;
}

int32_t dsf_sample(const float *logits, int n_vocab, const dsf_sampler_params *p,
                   uint64_t *rng_state) {
    if (n_vocab <= 0) return -1;
    void *scratch = malloc(dsf_sample_scratch_bytes(n_vocab));
    if (!scratch) return -1;
    int32_t id = dsf_sample_ws(logits, n_vocab, p, rng_state, scratch);
    free(scratch);
    return id;
}

/* ==== log-probabilities ================================================================= */

/* max finite logit and log(sum(exp(l - max))) over the finite logits; false if none. */
static bool log_norm(const float *logits, int n, double *lmax, double *lse) {
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (!isnan(l) && l != -INFINITY && l > mx) mx = l > FLT_MAX ? FLT_MAX : l;
    }
    if (mx == -INFINITY) return false;
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        s += exp((double)(l > FLT_MAX ? FLT_MAX : l) - mx);
    }
    *lmax = mx;
    *lse = log(s);
    return true;
}

float dsf_logprob_of(const float *logits, int n_vocab, int32_t id) {
    double mx, lse;
    if (id < 0 || id >= n_vocab || !log_norm(logits, n_vocab, &mx, &lse)) return -INFINITY;
    float l = logits[id];
    if (isnan(l) || l == -INFINITY) return -INFINITY;
    return (float)((double)(l > FLT_MAX ? FLT_MAX : l) - mx - lse);
}

int dsf_logprobs_top(const float *logits, int n_vocab, int n_top, int32_t *ids, float *logprobs) {
    double mx, lse;
    if (n_top <= 0 || n_vocab <= 0 || !log_norm(logits, n_vocab, &mx, &lse)) return 0;
    int k = 0;
    /* insertion into the sorted top list (ids/logprobs hold raw logits meanwhile) */
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (l > FLT_MAX) l = FLT_MAX;
        if (k == n_top && !(l > logprobs[k - 1])) continue; /* ties keep the lower id */
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && l > logprobs[j - 1]) {
            logprobs[j] = logprobs[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        logprobs[j] = l;
        ids[j] = i;
    }
    for (int j = 0; j < k; j++) logprobs[j] = (float)((double)logprobs[j] - mx - lse);
    return k;
}

/* ==== stop strings ====================================================================== */

struct dsf_stop_matcher {
    char **stop;
    size_t *len;
    int n;
    dsf_buf pend; /* text not yet returned */
    dsf_buf out;  /* what the last call returned */
    bool stopped;
    int which;
};

dsf_stop_matcher *dsf_stop_matcher_new(const char *const *stop, int n_stop) {
    dsf_stop_matcher *m = dsf_xcalloc(1, sizeof *m);
    int n = n_stop > 0 ? n_stop : 0;
    m->stop = dsf_xcalloc((size_t)(n ? n : 1), sizeof *m->stop);
    m->len = dsf_xcalloc((size_t)(n ? n : 1), sizeof *m->len);
    /* Empty strings are kept (length 0, never matched) so that stop_index is the caller's. */
    for (int i = 0; i < n; i++) {
        m->stop[i] = dsf_xstrdup(stop[i] ? stop[i] : "");
        m->len[i] = strlen(m->stop[i]);
    }
    m->n = n;
    m->which = -1;
    return m;
}

void dsf_stop_matcher_free(dsf_stop_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) free(m->stop[i]);
    free(m->stop);
    free(m->len);
    dsf_buf_free(&m->pend);
    dsf_buf_free(&m->out);
    free(m);
}

static void set_out(dsf_stop_matcher *m, const void *p, size_t n, const char **out,
                    size_t *out_len) {
    m->out.len = 0;
    dsf_buf_append(&m->out, p, n);
    dsf_buf_append(&m->out, "", 1);
    m->out.len--;
    *out = (const char *)m->out.data;
    *out_len = m->out.len;
}

int dsf_stop_matcher_push(dsf_stop_matcher *m, const char *text, size_t len, const char **out,
                          size_t *out_len, int *stop_index) {
    if (stop_index) *stop_index = m->which;
    if (m->stopped) {
        set_out(m, "", 0, out, out_len);
        return 1;
    }
    dsf_buf_append(&m->pend, text, len);
    const char *s = (const char *)m->pend.data;
    size_t n = m->pend.len;
    /* earliest stop string (lower index on ties) */
    size_t best = SIZE_MAX;
    int which = -1;
    for (int i = 0; i < m->n; i++) {
        const char *f = n && m->len[i] ? memmem(s, n, m->stop[i], m->len[i]) : NULL;
        if (f && (size_t)(f - s) < best) {
            best = (size_t)(f - s);
            which = i;
        }
    }
    if (which >= 0) {
        set_out(m, s, best, out, out_len);
        m->stopped = true;
        m->which = which;
        m->pend.len = 0;
        if (stop_index) *stop_index = which;
        return 1;
    }
    /* hold back the longest tail that is a proper prefix of some stop string */
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
        if (!m->len[i]) continue;
        size_t kmax = m->len[i] - 1 < n ? m->len[i] - 1 : n;
        for (size_t k = kmax; k > hold; k--)
            if (memcmp(s + n - k, m->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    set_out(m, s, n - hold, out, out_len);
    memmove(m->pend.data, m->pend.data + (n - hold), hold);
    m->pend.len = hold;
    return 0;
}

void dsf_stop_matcher_flush(dsf_stop_matcher *m, const char **out, size_t *out_len) {
    if (m->stopped) set_out(m, "", 0, out, out_len);
    else set_out(m, m->pend.data ? (const char *)m->pend.data : "", m->pend.len, out, out_len);
    m->pend.len = 0;
}
