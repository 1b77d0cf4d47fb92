/* ops.c: see ops.h. Scalar reference code; the forward pass's small mechanisms. */
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* mean(x^2) in fp32, summed in the order of torch's vectorized CPU reduction (8 lanes x 4
 * accumulators over 32-element chunks, then the accumulators in order, then the lanes in
 * order; products rounded before the adds). The official reference computes every RMS this
 * way in fp32; matching its order bit for bit removes a noise source that otherwise flips
 * FP8/FP4 rounding decisions downstream (checked: tiny41's L00.attn_in dump is reproduced
 * exactly, 8192/8192 values). A tail that is not a whole chunk is added afterwards in order. */
float op_meansq(const float *x, int64_t n) {
    float acc[32];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 32; k++) {
            float v = x[i + k] * x[i + k];
            acc[k] = acc[k] + v;
        }
    float s = 0.0f;
    for (int l = 0; l < 8; l++) {
        float v = acc[l] + acc[8 + l];
        v = v + acc[16 + l];
        v = v + acc[24 + l];
        s = l ? s + v : v;
    }
    for (; i < n; i++) {
        float v = x[i] * x[i];
        s = s + v;
    }
    return s / (float)n;
}

void op_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    float r = 1.0f / sqrtf(op_meansq(x, n) + eps);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * r;
        y[i] = w ? v * w[i] : v;
    }
}

/* fp32 formulas as torch evaluates them: the reference's QDQ roundings sit downstream of
 * these, so matching their rounding keeps FP8 decisions aligned with the oracle. */
float op_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float op_silu(float x) { return x / (1.0f + expf(-x)); }
float op_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void op_rope_freqs(float *freq, int64_t n_rot, float base, int yarn, float factor, int64_t orig_ctx,
                   float beta_fast, float beta_slow) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)n_rot;
        freq[i] = 1.0f / powf(base, e);
    }
    if (!yarn) return;
    /* [R] find_correction_range: dim * ln(orig / (beta * 2 pi)) / (2 ln base), floor/ceil
     * and clamped to [0, dim-1]; linear ramp over the pair index. */
    double lo = floor((double)n_rot * log((double)orig_ctx / ((double)beta_fast * 2.0 * M_PI)) / (2.0 * log((double)base)));
    double hi = ceil((double)n_rot * log((double)orig_ctx / ((double)beta_slow * 2.0 * M_PI)) / (2.0 * log((double)base)));
    if (lo < 0) lo = 0;
    if (hi > (double)(n_rot - 1)) hi = (double)(n_rot - 1);
    float low = (float)lo, high = (float)hi;
    if (low == high) high += 0.001f;
    for (int64_t i = 0; i < half; i++) {
        float r = ((float)i - low) / (high - low);
        r = r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);
        float smooth = 1.0f - r;
        freq[i] = freq[i] / factor * (1.0f - smooth) + freq[i] * smooth;
    }
}

void op_rope(float *x, int64_t n_rot, const float *freq, int64_t pos, int inverse) {
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float ang = (float)pos * freq[i]; /* fp32 angle, as torch.outer in fp32 */
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        if (inverse) s = -s;
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

void op_sinkhorn(float *C, const float *A, int64_t n, int64_t iters, float eps) {
    for (int64_t i = 0; i < n; i++) {
        float m = A[i * n];
        for (int64_t j = 1; j < n; j++) m = fmaxf(m, A[i * n + j]);
        float s = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            C[i * n + j] = expf(A[i * n + j] - m);
            s += C[i * n + j];
        }
        for (int64_t j = 0; j < n; j++) C[i * n + j] = C[i * n + j] / s + eps;
    }
    for (int64_t it = 0; it < iters; it++) {
        if (it > 0) {
            for (int64_t i = 0; i < n; i++) {
                float s = 0.0f;
                for (int64_t j = 0; j < n; j++) s += C[i * n + j];
                for (int64_t j = 0; j < n; j++) C[i * n + j] /= (s + eps);
            }
        }
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t i = 0; i < n; i++) s += C[i * n + j];
            for (int64_t i = 0; i < n; i++) C[i * n + j] /= (s + eps);
        }
    }
}

/* heap of indices ordered so that the root is the current worst kept entry */
static int worse(const float *s, int32_t a, int32_t b) { /* a ranks below b? */
    float x = s[a], y = s[b];
    if (x != x) return 1;
    if (y != y) return 0;
    if (x != y) return x < y;
    return a > b;
}

static void sift_down(const float *s, int32_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(s, h[l], h[m])) m = l;
        if (r < n && worse(s, h[r], h[m])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int64_t op_topk(const float *s, int64_t n, int64_t k, int32_t *out, int32_t *heap) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    if (k == n) {
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)i;
        return n;
    }
    for (int64_t i = 0; i < k; i++) heap[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(s, heap, k, i);
    for (int64_t i = k; i < n; i++) {
        if (worse(s, heap[0], (int32_t)i)) {
            heap[0] = (int32_t)i;
            sift_down(s, heap, k, 0);
        }
    }
    memcpy(out, heap, (size_t)k * sizeof *out);
    qsort(out, (size_t)k, sizeof *out, cmp_i32);
    return k;
}
