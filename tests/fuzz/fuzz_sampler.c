/* fuzz_sampler.c: libFuzzer harness for the sampler and the stop-string matcher
 * (src/runtime/sampler.c) on arbitrary logits (NaN, +-inf, denormals, huge values) and parameters.
 *
 * Byte 0 bit 0 picks the part:
 *   0, sampler: bytes 1..16 = parameters (temperature, top_k, top_p, min_p, ignore_eos,
 *      eos_id, seed); the rest = float32 logits, raw bit patterns. Checks: the id is -1
 *      exactly when no logit can be sampled (all NaN/-inf after the EOS mask), else inside
 *      the vocabulary, with a sampleable logit, never the masked EOS, and a survivor of the
 *      filters; greedy gives the argmax (lowest id on ties); dsf_sample and dsf_sample_ws
 *      agree and advance the rng by one draw (none when greedy); survivors are distinct and
 *      sorted; log-probabilities are <= 0, not NaN, sorted, and agree with dsf_logprob_of.
 *   1, stop matcher: byte 1 = number of stop strings, then NUL-separated stop strings and
 *      text. Checks: the output is a prefix of the text; when a stop string matched, the text
 *      continues with it there; otherwise the output is the whole text and contains none;
 *      with one stop string the result does not depend on how the text is split. */
#include "fuzz_common.h"
#include "runtime/sampler.h"

#include <float.h>
#include <math.h>

static bool fz_sampleable(float l) { return !isnan(l) && l != -INFINITY; }

static int fz_sampler_part(fz_in *in) {
    dsf_sampler_params p;
    dsf_sampler_params_default(&p);
    uint8_t b = fz_u8(in);
    p.temperature = b < 64 ? 0.0f : b < 250 ? (float)(b - 64) / 32.0f : b == 250 ? NAN : b == 251 ? INFINITY
                    : b == 252 ? 1e-30f : -1.0f;
    b = fz_u8(in);
    p.top_k = (int)b - 8;
    b = fz_u8(in);
    p.top_p = b == 255 ? NAN : (float)b / 200.0f;
    b = fz_u8(in);
    p.min_p = b == 255 ? NAN : (float)b / 200.0f;
    b = fz_u8(in);
    p.ignore_eos = b & 1;
    uint32_t eos = fz_u32(in);
    uint64_t seed = (uint64_t)fz_u32(in) << 32 | fz_u32(in);
    size_t nn = in->n / 4 < ((size_t)1 << 20) ? in->n / 4 : ((size_t)1 << 20);
    int n = (int)nn;
    p.eos_id = n > 0 ? (int32_t)(eos % (uint32_t)(n + 1)) - 1 : -1;
    float *lg = malloc((nn ? nn : 1) * sizeof *lg);
    if (nn) memcpy(lg, in->p, nn * 4);

    int any = 0, best = -1;
    for (int i = 0; i < n; i++) {
        if (!fz_sampleable(lg[i]) || (p.ignore_eos && i == p.eos_id)) continue;
        any = 1;
        if (best < 0 || lg[i] > lg[best]) best = i;
    }
    uint64_t r1 = dsf_rng_init(seed), r2 = r1, r0 = r1;
    int32_t id = dsf_sample(lg, n, &p, &r1);
    void *ws = malloc(dsf_sample_scratch_bytes(n));
    int32_t id2 = dsf_sample_ws(lg, n, &p, &r2, ws);
    FZ_REQUIRE(id == id2 && r1 == r2, "dsf_sample %d != dsf_sample_ws %d", id, id2);
    bool greedy = !(p.temperature > 0.0f);
    if (!any) {
        FZ_REQUIRE(id == -1, "sampled %d with no sampleable logit", id);
    } else {
        FZ_REQUIRE(id >= 0 && id < n, "sampled %d of %d with a sampleable logit", id, n);
        FZ_REQUIRE(fz_sampleable(lg[id]), "sampled a NaN/-inf logit (id %d)", id);
        FZ_REQUIRE(!(p.ignore_eos && id == p.eos_id), "sampled the masked EOS");
        if (greedy) FZ_REQUIRE(id == best, "greedy gave %d, argmax is %d", id, best);
    }
    if (greedy || !any) FZ_REQUIRE(r1 == r0, "greedy or impossible sampling advanced the rng");
    else {
        uint64_t r3 = r0;
        (void)dsf_rng_uniform(&r3);
        FZ_REQUIRE(r1 == r3, "sampling advanced the rng by more than one draw");
    }

    int32_t *ids = malloc((nn ? nn : 1) * sizeof *ids);
    int m = sampler_survivors(lg, n, &p, ids, ws);
    FZ_REQUIRE(m >= 0 && m <= n && (m > 0) == (any != 0), "%d survivors (sampleable: %d)", m, any);
    for (int i = 0; i < m; i++) {
        FZ_REQUIRE(ids[i] >= 0 && ids[i] < n && fz_sampleable(lg[ids[i]]), "bad survivor %d", ids[i]);
        if (i) {
            float a = lg[ids[i - 1]], c = lg[ids[i]];
            FZ_REQUIRE(a > c || (a == c && ids[i - 1] < ids[i]) || (a >= FLT_MAX && c >= FLT_MAX && ids[i - 1] < ids[i]),
                       "survivors not sorted at %d", i);
        }
    }
    if (!greedy && id >= 0) {
        bool found = false;
        for (int i = 0; i < m && !found; i++) found = ids[i] == id;
        FZ_REQUIRE(found, "sampled id %d is not a survivor of the filters", id);
    }

    int n_top = (int)(seed % 21);
    float lps[20];
    int32_t tids[20];
    int k = dsf_logprobs_top(lg, n, n_top, tids, lps);
    int n_fin = 0;
    for (int i = 0; i < n; i++) n_fin += fz_sampleable(lg[i]);
    FZ_REQUIRE(k == (n_top < n_fin ? n_top : n_fin), "logprobs_top returned %d of %d (finite %d)", k, n_top, n_fin);
    for (int i = 0; i < k; i++) {
        FZ_REQUIRE(tids[i] >= 0 && tids[i] < n, "top id %d", tids[i]);
        FZ_REQUIRE(!isnan(lps[i]) && lps[i] <= 1e-4f, "logprob %g", (double)lps[i]); /* fp32 rounding of 0 */
        if (i) FZ_REQUIRE(lps[i] <= lps[i - 1], "top logprobs not sorted");
        float lo = dsf_logprob_of(lg, n, tids[i]);
        FZ_REQUIRE(lo == lps[i] || (isinf(lo) && isinf(lps[i])), "logprob_of %g != top %g", (double)lo,
                   (double)lps[i]);
    }
    if (id >= 0) {
        float lo = dsf_logprob_of(lg, n, id);
        FZ_REQUIRE(!isnan(lo) && lo <= 1e-4f, "logprob of the sampled id is %g", (double)lo);
    }
    FZ_REQUIRE(dsf_logprob_of(lg, n, -1) == -INFINITY && dsf_logprob_of(lg, n, n) == -INFINITY,
               "logprob_of out of range is not -inf");
    free(ids);
    free(ws);
    free(lg);
    return id >= 0;
}

/* Runs the matcher over text split at points from seed (0: one push); returns the output. */
static int fz_stop_run(const char *const *stops, int ns, const uint8_t *t, size_t n, uint64_t seed, dsf_buf *out,
                       int *which) {
    dsf_stop_matcher *m = dsf_stop_matcher_new(stops, ns);
    int stopped = 0;
    *which = -1;
    size_t off = 0;
    do {
        size_t take = n - off;
        if (seed) {
            uint64_t r = fz_rand(&seed);
            take = (size_t)(r % 5);
            if (take > n - off) take = n - off;
        }
        const char *o;
        size_t ol;
        int w = -7;
        int rc = dsf_stop_matcher_push(m, (const char *)t + off, take, &o, &ol, &w);
        FZ_REQUIRE(o && o[ol] == 0, "push output not NUL-terminated");
        dsf_buf_append(out, o, ol);
        off += take;
        if (rc) {
            FZ_REQUIRE(w >= 0 && w < ns, "stopped with stop_index %d", w);
            FZ_REQUIRE(!stopped || w == *which, "stop_index changed");
            stopped = 1;
            *which = w;
        } else {
            FZ_REQUIRE(!stopped && w == -1, "no stop but stop_index %d", w);
        }
    } while (off < n);
    const char *o;
    size_t ol;
    dsf_stop_matcher_flush(m, &o, &ol);
    FZ_REQUIRE(!stopped || ol == 0, "flush after a stop returned text");
    dsf_buf_append(out, o, ol);
    dsf_stop_matcher_free(m);
    return stopped;
}

static int fz_stop_part(fz_in *in) {
    int ns = fz_u8(in) % 5;
    char *stops[4];
    for (int i = 0; i < ns; i++) {
        const uint8_t *z = memchr(in->p, 0, in->n);
        size_t l = z ? (size_t)(z - in->p) : in->n;
        if (l > 12) l = 12;
        stops[i] = malloc(l + 1);
        memcpy(stops[i], in->p, l);
        stops[i][l] = 0;
        size_t adv = z && (size_t)(z - in->p) == l ? l + 1 : l;
        in->p += adv;
        in->n -= adv;
    }
    dsf_buf out = {0};
    int which;
    int stopped = fz_stop_run((const char *const *)stops, ns, in->p, in->n, 0, &out, &which);
    FZ_REQUIRE(out.len <= in->n && (!out.len || !memcmp(out.data, in->p, out.len)), "output is not a prefix");
    if (stopped) {
        size_t sl = strlen(stops[which]);
        FZ_REQUIRE(sl > 0 && out.len + sl <= in->n && !memcmp(in->p + out.len, stops[which], sl),
                   "the text does not continue with stop string %d", which);
    } else {
        FZ_REQUIRE(out.len == in->n, "no stop, but %zu of %zu bytes returned", out.len, in->n);
        for (int i = 0; i < ns; i++)
            FZ_REQUIRE(!stops[i][0] || !memmem(in->p, in->n, stops[i], strlen(stops[i])),
                       "stop string %d occurs but did not stop", i);
    }
    if (ns == 1) {
        dsf_buf o2 = {0};
        int w2;
        int s2 = fz_stop_run((const char *const *)stops, ns, in->p, in->n, 0x1234 + in->n, &o2, &w2);
        FZ_REQUIRE(s2 == stopped && w2 == which && o2.len == out.len && (!out.len || !memcmp(o2.data, out.data, out.len)),
                   "stop matching depends on the split");
        dsf_buf_free(&o2);
    }
    dsf_buf_free(&out);
    for (int i = 0; i < ns; i++) free(stops[i]);
    return stopped;
}

static int fz_sampler_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    return (fz_u8(&in) & 1) ? fz_stop_part(&in) : fz_sampler_part(&in);
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_sampler_one(data, size);
    return 0;
}
#endif
