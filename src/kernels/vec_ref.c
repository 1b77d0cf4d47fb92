/* vec_ref.c: the scalar twins of the attention / indexer / hc kernels (vec.h), the ref table
 * made of them, and the RoPE table helpers.
 *
 * Must not: choose a table or dispatch (select.c); call anything but the twins, quant.c's
 * QDQ and ops.c's scalar math.
 *
 * The twins are the model's loops as first written (attn.c, forward.c, moe.c): fp32 sums in
 * index order, products and sums rounded separately, libm expf. They stay the definition the
 * fast tables are tested against, and DSF_KERNELS=ref runs them. */
#include "kernels/vec.h"
#include "kernels/quant.h"
#include "kernels/ops.h"

#include <math.h>
#include <string.h>

/* ---- scalar twins ---------------------------------------------------------------------- */

void attn_ref(float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys, int64_t nk, float scale,
              const float *sinks, float *att) {
    for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + h * dh;
        float *s = att + h * nk, *oh = o + h * dh;
        float m = sinks[h];
        for (int64_t k = 0; k < nk; k++) {
            const float *key = keys[k];
            float d = 0.0f;
            for (int64_t x = 0; x < dh; x++) d += qh[x] * key[x];
            s[k] = d * scale;
            m = fmaxf(m, s[k]);
        }
        /* one joint softmax; the sink is a raw logit in the denominator only */
        float den = expf(sinks[h] - m);
        memset(oh, 0, (size_t)dh * sizeof(float));
        for (int64_t k = 0; k < nk; k++) {
            const float *key = keys[k];
            float pk = expf(s[k] - m);
            den += pk;
            for (int64_t x = 0; x < dh; x++) oh[x] += pk * key[x];
        }
        for (int64_t x = 0; x < dh; x++) oh[x] /= den;
    }
}

void index_ref(float *scores, const float *q, const float *w, const float *ik, int64_t j0, int64_t j1, int64_t ih,
               int64_t id, const uint8_t *cmask, int64_t B) {
    for (int64_t j = j0; j < j1; j++) {
        if (cmask && !cmask[j / B]) {
            scores[j] = -INFINITY;
            continue;
        }
        const float *kj = ik + j * id;
        float s = 0.0f;
        for (int64_t h = 0; h < ih; h++) {
            const float *qh = q + h * id;
            float d = 0.0f;
            for (int64_t x = 0; x < id; x++) d += qh[x] * kj[x];
            s += w[h] * (d > 0.0f ? d : 0.0f);
        }
        scores[j] = s;
    }
}

double sumsq_ref(const float *x, int64_t n) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    return ss;
}

void hc_collapse_ref(float *out, const float *X, const float *pre, int64_t hc, int64_t D, int64_t ld) {
    for (int64_t d = 0; d < D; d++) {
        float s = 0.0f;
        for (int64_t c = 0; c < hc; c++) s += pre[c] * X[c * ld + d];
        out[d] = s;
    }
}

void hc_expand_ref(float *Y, const float *fo, const float *R, const float *post, const float *comb, int64_t hc,
                   int64_t D, int64_t ld) {
    for (int64_t j = 0; j < hc; j++)
        for (int64_t d = 0; d < D; d++) {
            float s = 0.0f;
            for (int64_t i = 0; i < hc; i++) s += comb[i * hc + j] * R[i * ld + d];
            Y[j * ld + d] = post[j] * fo[d] + s;
        }
}

void swiglu_ref(float *z, const float *g, const float *u, int64_t n, float lim, float wt) {
    for (int64_t i = 0; i < n; i++) {
        float gg = g[i], uu = u[i];
        if (lim > 0.0f) {
            gg = fminf(gg, lim);
            uu = fminf(fmaxf(uu, -lim), lim);
        }
        z[i] = wt * (op_silu(gg) * uu);
    }
}

void add_ref(float *a, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] += y[i];
}

float softmax_ref(float *s, int64_t n) {
    float m = s[0], den = 0.0f;
    for (int64_t k = 1; k < n; k++) m = fmaxf(m, s[k]);
    for (int64_t k = 0; k < n; k++) {
        s[k] = expf(s[k] - m);
        den += s[k];
    }
    return den;
}

const dsf_akernels akernels_ref = {
    .name = "ref",
    .attn = attn_ref,
    .index = index_ref,
    .sumsq = sumsq_ref,
    .hc_collapse = hc_collapse_ref,
    .hc_expand = hc_expand_ref,
    .swiglu = swiglu_ref,
    .add = add_ref,
    .softmax = softmax_ref,
    .qdq_fp8 = qdq_fp8_e8m0,
    .qdq_fp4 = qdq_fp4_e8m0,
    .qdq_fp4_e4m3 = qdq_fp4_e4m3,
    .unpack_fp8 = unpack_fp8_e8m0,
    .unpack_fp4 = unpack_fp4_e8m0,
    .unpack_fp4_e4m3 = unpack_fp4_e4m3,
};

/* ---- RoPE with a per-position table ----------------------------------------------------- */

void ka_rope_table(float *cs, int64_t n_rot, const float *freq, int64_t pos) {
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float ang = (float)pos * freq[i]; /* fp32 angle, as op_rope */
        cs[2 * i] = (float)cos((double)ang);
        cs[2 * i + 1] = (float)sin((double)ang);
    }
}

void ka_rope_apply(float *x, int64_t n_rot, const float *cs, int inverse) {
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}
