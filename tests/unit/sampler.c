/* sampler.c: src/runtime/sampler.c (dsf_sample, filters, rng, logprobs, stop matcher).
 *
 * The reference distribution used throughout: logits L = [2.0, 1.0, 0.5, -1.0], whose
 * softmax (by hand: e^2, e^1, e^0.5, e^-1 = 7.389, 2.718, 1.649, 0.368; sum 12.124) is
 *   p = [0.60946, 0.22421, 0.13599, 0.03034], cumulative [0.60946, 0.83367, 0.96966, 1].
 * top-p 0.9 keeps {0,1,2} (0.83 < 0.9 <= 0.97), top-p 0.8 keeps {0,1};
 * min-p 0.2 keeps p_i >= 0.1219: {0,1,2}; min-p 0.25 keeps p_i >= 0.1524: {0,1};
 * after top-k 2 the renormalized p0 = e^2 / (e^2 + e) = 0.73106. */
#include "test.h"
#include "dsflash.h"
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float L4[4] = {2.0f, 1.0f, 0.5f, -1.0f};

/* survivors of L4 under p, as a bit mask of ids */
static unsigned survivors(const dsf_sampler_params *p) {
    int32_t ids[4];
    char scratch[64];
    int n = sampler_survivors(L4, 4, p, ids, scratch);
    unsigned mask = 0;
    for (int i = 0; i < n; i++) mask |= 1u << ids[i];
    return mask;
}

/* Guards the filter semantics and their llama.cpp order (top-k -> top-p -> min-p, temperature
 * last). */
TEST(sampler_filters_hand_computed) {
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    CHECK(survivors(&p) == 0xF);
    p.top_p = 0.9f;
    CHECKF(survivors(&p) == 0x7, "top-p 0.9: %x", survivors(&p));
    p.top_p = 0.8f;
    CHECKF(survivors(&p) == 0x3, "top-p 0.8: %x", survivors(&p));
    p.top_p = 0.5f;
    CHECKF(survivors(&p) == 0x1, "top-p 0.5: %x", survivors(&p));
    p.top_p = 1.0f;
    p.min_p = 0.2f;
    CHECKF(survivors(&p) == 0x7, "min-p 0.2: %x", survivors(&p));
    p.min_p = 0.25f;
    CHECKF(survivors(&p) == 0x3, "min-p 0.25: %x", survivors(&p));
    p.min_p = 0.0f;
    p.top_k = 2;
    CHECKF(survivors(&p) == 0x3, "top-k 2: %x", survivors(&p));
    /* top-k before top-p: after top-k 2, p0 = 0.731 >= 0.7 keeps {0}; without top-k,
     * 0.609 < 0.7 keeps {0,1} */
    p.top_p = 0.7f;
    CHECKF(survivors(&p) == 0x1, "top-k 2, top-p 0.7: %x", survivors(&p));
    p.top_k = 0;
    CHECKF(survivors(&p) == 0x3, "top-p 0.7: %x", survivors(&p));
    /* temperature does not enter the filters: at T = 0.5, p0 would be 0.842 and top-p 0.8
     * would keep {0} alone if temperature came first */
    p.top_p = 0.8f;
    p.temperature = 0.5f;
    CHECKF(survivors(&p) == 0x3, "T 0.5, top-p 0.8: %x", survivors(&p));
    /* ignore_eos masks EOS */
    dsf_sampler_params_default(&p);
    p.ignore_eos = true;
    p.eos_id = 0;
    CHECK(survivors(&p) == 0xE);
    /* at least one survivor, whatever the thresholds */
    dsf_sampler_params_default(&p);
    p.top_p = 1e-9f;
    p.min_p = 1.0f;
    p.top_k = 1;
    CHECK(survivors(&p) == 0x1);
}

/* Greedy: argmax, lowest id on ties; NaN ignored; no rng use. */
TEST(sampler_greedy) {
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    p.temperature = 0.0f;
    uint64_t rng = dsf_rng_init(7), rng0 = rng;
    const float a[5] = {1.0f, 3.0f, 3.0f, NAN, 2.0f};
    CHECK(dsf_sample(a, 5, &p, &rng) == 1);
    CHECK(rng == rng0);
    p.ignore_eos = true;
    p.eos_id = 1;
    CHECK(dsf_sample(a, 5, &p, &rng) == 2);
    const float none[3] = {-INFINITY, NAN, -INFINITY};
    CHECK(dsf_sample(none, 3, &p, &rng) == -1);
    p.temperature = 1.0f;
    CHECK(dsf_sample(none, 3, &p, &rng) == -1);
    CHECK(dsf_sample(a, 0, &p, &rng) == -1);
    /* top-k 1 at any temperature is greedy */
    p.ignore_eos = false;
    p.top_k = 1;
    for (int i = 0; i < 20; i++) CHECK(dsf_sample(L4, 4, &p, &rng) == 0);
}

/* Greedy over vocabularies longer than the sampler's 8 interleaved maxima: the winner in
 * every lane position and in the tail, ties across lanes (the lowest id wins), NaN and -inf
 * never winning, EOS masked in the middle; the expected id is found by a plain scan here. */
TEST(sampler_greedy_long) {
    enum { N = 1003 };
    static float a[N];
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    p.temperature = 0.0f;
    uint64_t rng = dsf_rng_init(3);
    for (int trial = 0; trial < 200; trial++) {
        uint64_t s = dsf_rng_init((uint64_t)trial + 11);
        for (int i = 0; i < N; i++) {
            double u = dsf_rng_uniform(&s);
            a[i] = u < 0.05 ? NAN : u < 0.1 ? -INFINITY : (float)(int)(u * 40.0); /* many ties */
        }
        if (trial % 4 == 1) a[N - 1 - trial % 7] = 1000.0f; /* the winner in the tail */
        if (trial % 4 == 2) a[8 * (trial % 100) + trial % 8] = 1000.0f;
        p.ignore_eos = trial % 3 == 0;
        p.eos_id = (trial * 37) % N;
        int want = -1;
        for (int i = 0; i < N; i++) {
            if (isnan(a[i]) || a[i] == -INFINITY || (p.ignore_eos && i == p.eos_id)) continue;
            if (want < 0 || a[i] > a[want]) want = i;
        }
        CHECKF(dsf_sample(a, N, &p, &rng) == want, "trial %d: want %d", trial, want);
        for (int n = 1; n <= 17; n++) { /* short vocabularies: lanes partly or not at all */
            int w = -1;
            for (int i = 0; i < n; i++) {
                if (isnan(a[i]) || a[i] == -INFINITY || (p.ignore_eos && i == p.eos_id)) continue;
                if (w < 0 || a[i] > a[w]) w = i;
            }
            CHECKF(dsf_sample(a, n, &p, &rng) == w, "trial %d, n %d: want %d", trial, n, w);
        }
    }
}

/* splitmix64 with state 0 yields 0xE220A8397B1DCDAF first (the published test vector). */
TEST(sampler_rng_vector) {
    uint64_t s = dsf_rng_init(0);
    double u = dsf_rng_uniform(&s);
    CHECK(u == (double)(0xE220A8397B1DCDAFULL >> 11) / 9007199254740992.0);
    u = dsf_rng_uniform(&s);
    CHECK(u == (double)(0x6E789E6AA1B965F4ULL >> 11) / 9007199254740992.0);
}

/* Same seed -> same tokens; the scratch variant equals the allocating one. */
TEST(sampler_seed_reproducible) {
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    p.temperature = 1.5f;
    p.top_p = 0.95f;
    uint64_t r1 = dsf_rng_init(1234), r2 = dsf_rng_init(1234), r3 = dsf_rng_init(99);
    char scratch[64];
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t a = dsf_sample(L4, 4, &p, &r1);
        int32_t b = dsf_sample_ws(L4, 4, &p, &r2, scratch);
        int32_t c = dsf_sample(L4, 4, &p, &r3);
        CHECK(a == b && a >= 0 && a < 4);
        differ += a != c;
    }
    CHECK(r1 == r2);
    CHECK(differ > 0); /* another seed gives another sequence */
}

/* Frequencies over 200000 seeded draws match the hand-computed distributions. The run is
 * deterministic (fixed seed), so this cannot flake; the tolerance 0.006 is > 5 standard
 * deviations of a frequency (sqrt(0.25 / 200000) = 0.0011), so a correct sampler passes
 * for any seed and a wrong distribution (e.g. temperature applied twice) fails. */
TEST(sampler_frequencies) {
    const int N = 200000;
    struct { float t, top_p; double want[4]; } cases[] = {
        {1.0f, 1.0f, {0.60946, 0.22421, 0.13599, 0.03034}},
        {2.0f, 1.0f, {0.43440, 0.26348, 0.20520, 0.09693}}, /* softmax(L / 2) */
        {1.0f, 0.9f, {0.62853, 0.23122, 0.14024, 0.0}},     /* {0,1,2} renormalized */
        {0.5f, 1.0f, {0.84203, 0.11396, 0.04192, 0.00209}}, /* softmax(2 L) */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dsf_sampler_params p;
        dsf_sampler_params_default(&p);
        p.temperature = cases[c].t;
        p.top_p = cases[c].top_p;
        uint64_t rng = dsf_rng_init(42 + c);
        int count[4] = {0};
        char scratch[64];
        for (int i = 0; i < N; i++) {
            int32_t id = dsf_sample_ws(L4, 4, &p, &rng, scratch);
            CHECK(id >= 0 && id < 4);
            count[id]++;
        }
        for (int k = 0; k < 4; k++) {
            double f = (double)count[k] / N;
            CHECKF(fabs(f - cases[c].want[k]) < 0.006, "case %zu token %d: %.4f vs %.4f", c, k,
                   f, cases[c].want[k]);
        }
        if (cases[c].want[3] == 0.0) CHECK(count[3] == 0);
    }
}

/* Large vocabulary: top-k selection picks the k best (ties by id) among 129280 logits. */
TEST(sampler_topk_large_vocab) {
    int n = 129280;
    float *l = malloc((size_t)n * sizeof *l);
    CHECK(l);
    for (int i = 0; i < n; i++) l[i] = (float)((i * 7919) % 1000) / 100.0f; /* 0 .. 9.99 */
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    p.top_k = 5;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    void *scratch = malloc(dsf_sample_scratch_bytes(n));
    int m = sampler_survivors(l, n, &p, ids, scratch);
    CHECK(m == 5);
    /* many logits tie (1000 distinct values): survivor k must have exactly k better ones */
    for (int k = 0; k < 5; k++) {
        int32_t id = ids[k];
        int better = 0;
        for (int i = 0; i < n; i++) better += l[i] > l[id] || (l[i] == l[id] && i < id);
        CHECKF(better == k, "rank of survivor %d is %d", k, better);
    }
    uint64_t rng = dsf_rng_init(5);
    for (int i = 0; i < 50; i++) {
        int32_t id = dsf_sample_ws(l, n, &p, &rng, scratch);
        bool in = false;
        for (int k = 0; k < 5; k++) in |= id == ids[k];
        CHECK(in);
    }
    free(l);
    free(ids);
    free(scratch);
}

/* Log-softmax values: L4 - log(sum e^L) = L4 - 2.4951819; tolerance 1e-5 (float rounding). */
TEST(sampler_logprobs) {
    int32_t ids[3];
    float lp[3];
    int n = dsf_logprobs_top(L4, 4, 3, ids, lp);
    CHECK(n == 3 && ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
    CHECK(fabsf(lp[0] + 0.4951819f) < 1e-5f && fabsf(lp[1] + 1.4951819f) < 1e-5f &&
          fabsf(lp[2] + 1.9951819f) < 1e-5f);
    CHECK(fabsf(dsf_logprob_of(L4, 4, 3) + 3.4951819f) < 1e-5f);
    CHECK(dsf_logprob_of(L4, 4, 4) == -INFINITY);
    const float tie[4] = {1.0f, 5.0f, 5.0f, -INFINITY};
    n = dsf_logprobs_top(tie, 4, 4, ids, lp);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 2 && ids[2] == 0);
}

/* Stop strings: partial matches are held back, text before a stop is released, nothing
 * after it; a multi-byte UTF-8 stop string split across pushes. */
TEST(sampler_stop_matcher) {
    const char *stops[] = {"</s>", "STOP", "", "\xe4\xbd\xa0\xe5\xa5\xbd"};
    dsf_stop_matcher *m = dsf_stop_matcher_new(stops, 4);
    const char *o;
    size_t ol;
    int which;
    CHECK(dsf_stop_matcher_push(m, "Hello <", 7, &o, &ol, &which) == 0);
    CHECK(ol == 6 && !memcmp(o, "Hello ", 6));
    CHECK(dsf_stop_matcher_push(m, "/", 1, &o, &ol, &which) == 0 && ol == 0);
    CHECK(dsf_stop_matcher_push(m, "x", 1, &o, &ol, &which) == 0 && ol == 3 && !memcmp(o, "</x", 3));
    CHECK(dsf_stop_matcher_push(m, "a\xe4", 2, &o, &ol, &which) == 0 && ol == 1 && o[0] == 'a');
    CHECK(dsf_stop_matcher_push(m, "\xbd\xa0!", 3, &o, &ol, &which) == 0);
    CHECK(ol == 4 && !memcmp(o, "\xe4\xbd\xa0!", 4));
    CHECK(dsf_stop_matcher_push(m, "done. ST", 8, &o, &ol, &which) == 0);
    CHECK(ol == 6 && !memcmp(o, "done. ", 6));
    CHECK(dsf_stop_matcher_push(m, "OP and more", 11, &o, &ol, &which) == 1);
    CHECK(ol == 0 && which == 1);
    CHECK(dsf_stop_matcher_push(m, "later", 5, &o, &ol, &which) == 1 && ol == 0);
    dsf_stop_matcher_flush(m, &o, &ol);
    CHECK(ol == 0);
    dsf_stop_matcher_free(m);

    m = dsf_stop_matcher_new(stops, 4);
    CHECK(dsf_stop_matcher_push(m, "x</s", 4, &o, &ol, NULL) == 0 && ol == 1);
    dsf_stop_matcher_flush(m, &o, &ol); /* end of generation: the held tail is text */
    CHECK(ol == 3 && !memcmp(o, "</s", 3));
    CHECK(dsf_stop_matcher_push(m, "ab</s>cd", 8, &o, &ol, &which) == 1);
    CHECK(ol == 2 && !memcmp(o, "ab", 2) && which == 0);
    dsf_stop_matcher_free(m);

    m = dsf_stop_matcher_new(NULL, 0); /* no stop strings: pass-through */
    CHECK(dsf_stop_matcher_push(m, "abc", 3, &o, &ol, NULL) == 0 && ol == 3);
    dsf_stop_matcher_free(m);
}
