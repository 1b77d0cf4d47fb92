/* vision/attn2d.c: the ViT's attention core (see attn2d.h): heads split with 2-D RoPE, then
 * per (head, block of VIS_ATT_QB queries): scores = K q (a product of the kernel table with
 * the keys as the weight), softmax in fp32 (the vec table's softmax), values = V^T p (a
 * product with the transposed values as the weight). Also vis_to_bf16 (vbf16.h). */
#include "vision/attn2d.h"
#include "vision/vbf16.h"
#include "kernels/select.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *x;
    uint16_t *xb;
} bf_job;

static void bf_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const bf_job *j = ctx;
    kern_act_to_bf16(j->x + i0, j->xb + i0, i1 - i0);
}

void vis_to_bf16(dsf_pool *pool, const float *x, uint16_t *xb, int64_t n) {
    bf_job j = {x, xb};
    dsf_parallel_for(pool, n, 65536, bf_range, &j);
}

uint64_t vis_attn_bytes(const vis_hparams *hp, uint64_t N, int n_threads) {
    const uint64_t D = (uint64_t)hp->n_embd, npad = (N + 31) / 32 * 32, th = n_threads > 0 ? (uint64_t)n_threads : 1;
    uint64_t heads, cs, scratch, tot;
    /* q, k, vt in one of fp32 (plain) or bf16: count fp32, the larger */
    if (!dsf_mul_ok(npad, 3 * D * 4, &heads) || !dsf_mul_ok(N, (uint64_t)hp->head_dim * 4, &cs) ||
        !dsf_mul_ok(th, (uint64_t)VIS_ATT_QB * (npad * 6 + (uint64_t)hp->head_dim * 4), &scratch) ||
        !dsf_add_ok(heads, cs, &tot) || !dsf_add_ok(tot, scratch, &tot))
        return 0;
    return tot;
}

void vis_attn_free(vis_attn *a) {
    free(a->cs), free(a->sn), free(a->q), free(a->k), free(a->vt), free(a->qb), free(a->kb), free(a->vtb);
    free(a->S), free(a->Pb), free(a->O);
    memset(a, 0, sizeof *a);
}

/* The angles of vision.md §3: inv[j] = 1 / theta^(2j / half) in fp32 for j < d/4; patch
 * (row, col) turns pair j < d/4 by row * inv[j] and pair j >= d/4 by col * inv[j - d/4]. */
static void rope_table(vis_attn *a) {
    const int64_t d = a->hp->head_dim, half = d / 2, quarter = d / 4;
    for (int64_t t = 0; t < a->N; t++)
        for (int64_t j = 0; j < half; j++) {
            const int64_t jj = j < quarter ? j : j - quarter;
            const float inv = 1.0f / powf(10000.0f, (float)(2 * jj) / (float)half);
            const float ang = (float)(j < quarter ? t / a->nw : t % a->nw) * inv;
            a->cs[t * half + j] = cosf(ang);
            a->sn[t * half + j] = sinf(ang);
        }
}

int vis_attn_init(vis_attn *a, const vis_hparams *hp, int n_vit_h, int n_vit_w, bool bf16, int n_threads) {
    memset(a, 0, sizeof *a);
    const int64_t N = (int64_t)n_vit_h * n_vit_w, d = hp->head_dim, H = hp->n_head, th = n_threads > 0 ? n_threads : 1;
    *a = (vis_attn){.hp = hp, .bf16 = bf16, .N = N, .npad = (N + 31) / 32 * 32, .nh = n_vit_h, .nw = n_vit_w};
    /* 1/sqrt(d) is a power of two for d = 4^k (16, 64: the release): then it multiplies the
     * queries, exactly, instead of every score */
    const float sc = 1.0f / sqrtf((float)d);
    int ex;
    a->qscale = frexpf(sc, &ex) == 0.5f ? sc : 1.0f;
    const size_t hn = (size_t)(H * N * d), hv = (size_t)(H * d * a->npad), es = bf16 ? 2 : 4;
    a->cs = malloc((size_t)(N * d / 2) * sizeof(float));
    a->sn = malloc((size_t)(N * d / 2) * sizeof(float));
    a->S = malloc((size_t)(th * VIS_ATT_QB * a->npad) * sizeof(float));
    a->O = malloc((size_t)(th * VIS_ATT_QB * d) * sizeof(float));
    void *q = malloc(hn * es), *k = malloc(hn * es), *vt = calloc(hv, es); /* vt: zero padding columns */
    if (bf16) a->qb = q, a->kb = k, a->vtb = vt, a->Pb = malloc((size_t)(th * VIS_ATT_QB * a->npad) * 2);
    else a->q = q, a->k = k, a->vt = vt;
    if (!a->cs || !a->sn || !a->S || !a->O || !q || !k || !vt || (bf16 && !a->Pb)) {
        vis_attn_free(a);
        return -1;
    }
    rope_table(a);
    return 0;
}

/* ---- heads and RoPE ---- */

typedef struct {
    vis_attn *a;
    const float *qkv;
} split_job;

/* Rotate-half of one head's row x[0..d) by the patch's table (fp32), times sc (1, or the
 * attention scale when it is a power of two: exact), stored as fp32 or bf16. */
static void rope_put(const vis_attn *a, const float *x, const float *cs, const float *sn, float sc, float *yf,
                     uint16_t *yb) {
    const int64_t half = a->hp->head_dim / 2;
    for (int64_t j = 0; j < half; j++) {
        const float x1 = x[j], x2 = x[half + j];
        const float r1 = (x1 * cs[j] - x2 * sn[j]) * sc, r2 = (x2 * cs[j] + x1 * sn[j]) * sc;
        if (yb) {
            yb[j] = f32_to_bf16(r1);
            yb[half + j] = f32_to_bf16(r2);
        } else {
            yf[j] = r1;
            yf[half + j] = r2;
        }
    }
}

static void split_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const split_job *j = ctx;
    vis_attn *a = j->a;
    const int64_t d = a->hp->head_dim, H = a->hp->n_head, D = a->hp->n_embd, N = a->N, half = d / 2;
    for (int64_t t = t0; t < t1; t++) {
        const float *row = j->qkv + t * 3 * D, *cs = a->cs + t * half, *sn = a->sn + t * half;
        for (int64_t h = 0; h < H; h++) {
            const int64_t o = (h * N + t) * d;
            rope_put(a, row + h * d, cs, sn, a->qscale, a->q ? a->q + o : NULL, a->qb ? a->qb + o : NULL);
            rope_put(a, row + D + h * d, cs, sn, 1.0f, a->k ? a->k + o : NULL, a->kb ? a->kb + o : NULL);
            const float *v = row + 2 * D + h * d;
            for (int64_t i = 0; i < d; i++) {
                const int64_t at = (h * d + i) * a->npad + t;
                if (a->vtb) a->vtb[at] = f32_to_bf16(v[i]);
                else a->vt[at] = v[i];
            }
        }
    }
}

/* ---- the core ---- */

typedef struct {
    vis_attn *a;
    const dsf_kernels *k;
    const dsf_akernels *ak;
    float *out;
    int64_t n_qb;
} core_job;

/* Softmax of the rows of S [nt][npad] over the first N columns, the scores scaled by 1/sqrt(d)
 * (unless the queries carry it), normalised by one reciprocal of the sum (as ATen's softmax
 * does); the padding columns get probability 0. bf16 mode: the probabilities as bf16 into Pb
 * (and rounded in S too where the fp32 family multiplies them). */
static void softmax_rows(const core_job *j, float *S, uint16_t *Pb, int64_t nt) {
    const vis_attn *a = j->a;
    const float scale = 1.0f / sqrtf((float)a->hp->head_dim);
    for (int64_t t = 0; t < nt; t++) {
        float *s = S + t * a->npad;
        if (a->qscale == 1.0f)
            for (int64_t c = 0; c < a->N; c++) s[c] *= scale;
        const float inv = 1.0f / ka_softmax(j->ak, s, a->N);
        for (int64_t c = 0; c < a->N; c++) s[c] *= inv;
        memset(s + a->N, 0, (size_t)(a->npad - a->N) * sizeof(float));
        if (!Pb) continue;
        kern_act_to_bf16(s, Pb + t * a->npad, a->npad);
        if (a->npad > 16384)
            for (int64_t c = 0; c < a->N; c++) s[c] = vis_bf16(s[c]);
    }
}

static void core_range(void *ctx, int64_t u0, int64_t u1, int tid) {
    const core_job *j = ctx;
    vis_attn *a = j->a;
    const int64_t d = a->hp->head_dim, N = a->N, npad = a->npad, D = a->hp->n_embd;
    float *S = a->S + (int64_t)tid * VIS_ATT_QB * npad, *O = a->O + (int64_t)tid * VIS_ATT_QB * d;
    uint16_t *Pb = a->Pb ? a->Pb + (int64_t)tid * VIS_ATT_QB * npad : NULL;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t h = u / j->n_qb, t0 = u % j->n_qb * VIS_ATT_QB, nt = N - t0 < VIS_ATT_QB ? N - t0 : VIS_ATT_QB;
        const int64_t ho = h * N * d;
        /* the keys as a weight [N][d], the transposed values as a weight [d][npad] */
        dsf_wmat kw = {a->bf16 ? GGML_TYPE_BF16 : GGML_TYPE_F32, d, N, (uint64_t)d * (a->bf16 ? 2 : 4), NULL, NULL};
        dsf_wmat vw = {kw.type, npad, d, (uint64_t)npad * (a->bf16 ? 2 : 4), NULL, NULL};
        if (a->bf16) {
            kw.data = (const uint8_t *)(a->kb + ho), vw.data = (const uint8_t *)(a->vtb + h * d * npad);
            kern_matmul_xbf16(j->k, &kw, a->qb + ho + t0 * d, nt, S, npad, 0, N);
        } else {
            kw.data = (const uint8_t *)(a->k + ho), vw.data = (const uint8_t *)(a->vt + h * d * npad);
            kern_matmul(j->k, &kw, a->q + ho + t0 * d, nt, S, npad, 0, N);
        }
        softmax_rows(j, S, Pb, nt);
        /* the BF16-activation kernels take rows of at most 16384; longer ones (over ~1,800
         * tokens per image) multiply the same bf16-exact probabilities through the fp32 family */
        if (Pb && npad <= 16384) kern_matmul_xbf16(j->k, &vw, Pb, nt, O, d, 0, d);
        else kern_matmul(j->k, &vw, S, nt, O, d, 0, d);
        for (int64_t t = 0; t < nt; t++) {
            float *o = j->out + (t0 + t) * D + h * d;
            for (int64_t i = 0; i < d; i++) o[i] = a->bf16 ? vis_bf16(O[t * d + i]) : O[t * d + i];
        }
    }
}

void vis_attn_run(vis_attn *a, dsf_pool *pool, const dsf_kernels *k, const float *qkv, float *out) {
    split_job s = {a, qkv};
    dsf_parallel_for(pool, a->N, 16, split_range, &s);
    core_job j = {a, k, akernels_get(), out, (a->N + VIS_ATT_QB - 1) / VIS_ATT_QB};
    dsf_parallel_for_dyn(pool, a->hp->n_head * j.n_qb, 1, core_range, &j);
}
