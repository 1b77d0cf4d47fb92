/* vision/tower.c: the ViT and the aligner (see tower.h for what it owns, the numerics of both
 * modes and the memory bound). Reads like vision.md §3-§5: patch embedding, then per block
 * norm1 -> qkv -> 2-D RoPE -> attention -> out + residual, norm2 -> SwiGLU -> down + residual;
 * final norm; aligner; the block in span order. The attention core is vision/attn2d.c. */
#include "vision/tower.h"
#include "vision/attn2d.h"
#include "vision/vbf16.h"
#include "kernels/ops.h"
#include "kernels/select.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the threaded product: y = rnd(x W^T + b), or res = rnd(res + rnd(x W^T + b)) ----------
 * Work units are tiles of PT_TOK tokens x PT_ROW rows (the activations of a token tile stay in
 * L2 while the rows stream), claimed dynamically; each unit finishes its tile (bias, rounding,
 * residual add) right after the kernel wrote it. */
#define PT_TOK 128
#define PT_ROW 128

typedef struct {
    const dsf_kernels *k;
    const dsf_wmat *w;
    const float *x;     /* [T][n_in] fp32, or NULL: */
    const uint16_t *xb; /* [T][n_in] bf16 bits */
    int64_t T, n_rt;
    float *y;           /* [T][ldy] */
    int64_t ldy;
    const float *bias;  /* [n_out] or NULL */
    bool rnd;           /* round the result to bf16 */
    float *res;         /* [T][ldy] or NULL: res += result (rounded when rnd), y is scratch */
} prod_job;

static void prod_range(void *ctx, int64_t u0, int64_t u1, int tid) {
    (void)tid;
    const prod_job *j = ctx;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t t0 = u / j->n_rt * PT_TOK, r0 = u % j->n_rt * PT_ROW;
        const int64_t nt = j->T - t0 < PT_TOK ? j->T - t0 : PT_TOK;
        const int64_t r1 = r0 + PT_ROW < j->w->n_out ? r0 + PT_ROW : j->w->n_out;
        float *y = j->y + t0 * j->ldy;
        if (j->xb) kern_matmul_xbf16(j->k, j->w, j->xb + t0 * j->w->n_in, nt, y, j->ldy, r0, r1);
        else kern_matmul(j->k, j->w, j->x + t0 * j->w->n_in, nt, y, j->ldy, r0, r1);
        /* one simple loop per step (bias, rounding, residual), so that each vectorises */
        for (int64_t t = 0; t < nt; t++) {
            float *yr = y + t * j->ldy;
            if (j->bias && j->rnd)
                for (int64_t r = r0; r < r1; r++) yr[r] += vis_bf16(j->bias[r]);
            else if (j->bias)
                for (int64_t r = r0; r < r1; r++) yr[r] += j->bias[r];
            if (j->rnd)
                for (int64_t r = r0; r < r1; r++) yr[r] = vis_bf16(yr[r]);
            if (!j->res) continue;
            float *p = j->res + (t0 + t) * j->ldy;
            for (int64_t r = r0; r < r1; r++) p[r] += yr[r];
            if (j->rnd)
                for (int64_t r = r0; r < r1; r++) p[r] = vis_bf16(p[r]);
        }
    }
}

typedef struct {
    const vis_model *m;
    dsf_pool *pool;
    const dsf_kernels *k;
    bool bf16;
    int64_t N, nh, nw;
    float *x;      /* [N][D] the residual stream */
    float *a;      /* [N][max(D, kp)] a product's input (normed stream, padded patches) */
    uint16_t *ab;  /* [N][max(D, I, D r^2)] its bf16 copy (bf16 mode) */
    float *big;    /* [N][max(3D, 2 I)] qkv, or the MLP's gate | up halves */
    float *o;      /* [N][D] attention output; also a residual product's scratch */
    vis_attn att;
} tower;

/* A product of w on a's (or ab's) first T rows: a is fp32 [T][w->n_in]; in bf16 mode its bf16
 * copy is made first (the values are bf16 already: exact). */
static void prod(tower *tw, const dsf_wmat *w, const float *a, int64_t T, float *y, int64_t ldy, const float *bias,
                 float *res) {
    prod_job j = {tw->k, w, a, NULL, T, (w->n_out + PT_ROW - 1) / PT_ROW, y, ldy, bias, tw->bf16, res};
    if (tw->bf16 && w->type == GGML_TYPE_BF16) {
        vis_to_bf16(tw->pool, a, tw->ab, T * w->n_in);
        j.x = NULL, j.xb = tw->ab;
    }
    dsf_parallel_for_dyn(tw->pool, (T + PT_TOK - 1) / PT_TOK * j.n_rt, 1, prod_range, &j);
}

/* ---- per-row steps ---- */

typedef struct {
    const tower *tw;
    const float *src;
    float *dst;
    const float *w;
    int64_t n, ld_src, ld_dst;
} norm_job;

static void norm_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const norm_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        float *d = j->dst + t * j->ld_dst;
        op_rmsnorm(d, j->src + t * j->ld_src, j->w, j->n, j->tw->m->hp.eps);
        if (j->tw->bf16)
            for (int64_t i = 0; i < j->n; i++) d[i] = vis_bf16(d[i]);
    }
}

/* dst = RMSNorm(x; w) row by row (fp32, then bf16 in bf16 mode). */
static void rmsnorm_rows(tower *tw, const float *w, float *dst) {
    const int64_t D = tw->m->hp.n_embd;
    norm_job j = {tw, tw->x, dst, w, D, D, D};
    dsf_parallel_for(tw->pool, tw->N, 16, norm_range, &j);
}

typedef struct {
    const tower *tw;
    float *g;        /* [T][I] gate, then the SwiGLU product silu(g) * u */
    const float *u;  /* [T][I] up */
    int64_t I;
} glu_job;

static void glu_range(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const glu_job *j = ctx;
    const bool rb = j->tw->bf16;
    for (int64_t i = t0 * j->I; i < t1 * j->I; i++) {
        const float s = op_silu(j->g[i]);
        j->g[i] = rb ? vis_bf16(vis_bf16(s) * j->u[i]) : s * j->u[i];
    }
}

/* ---- the ViT ---- */

/* x = patches W_e^T + b_e: the patches padded to the weight's kp inputs (zeros). */
static void patch_embed(tower *tw, const float *patches) {
    const vis_model *m = tw->m;
    const int64_t k = 3 * (int64_t)m->hp.patch * m->hp.patch, kp = m->patch_w.n_in;
    for (int64_t t = 0; t < tw->N; t++) {
        memcpy(tw->a + t * kp, patches + t * k, (size_t)k * sizeof(float));
        memset(tw->a + t * kp + k, 0, (size_t)(kp - k) * sizeof(float));
    }
    /* the fp32 family in both modes: the patch values and weights are bf16-exact, so the
     * products are exact either way, and F32 weights would only be widened again */
    prod_job j = {tw->k, &m->patch_w, tw->a, NULL, tw->N, (m->patch_w.n_out + PT_ROW - 1) / PT_ROW,
                  tw->x, m->hp.n_embd, m->patch_b, tw->bf16, NULL};
    dsf_parallel_for_dyn(tw->pool, (tw->N + PT_TOK - 1) / PT_TOK * j.n_rt, 1, prod_range, &j);
}

static void vit_block(tower *tw, const vis_layer *l) {
    const vis_hparams *hp = &tw->m->hp;
    const int64_t D = hp->n_embd, I = hp->n_ff, N = tw->N;
    rmsnorm_rows(tw, l->ln1, tw->a);
    if (!l->split) {
        prod(tw, &l->qkv, tw->a, N, tw->big, 3 * D, l->bqkv, NULL);
    } else { /* the same [N][3D] layout from the three products */
        prod(tw, &l->q, tw->a, N, tw->big, 3 * D, l->bq, NULL);
        prod(tw, &l->k, tw->a, N, tw->big + D, 3 * D, l->bk, NULL);
        prod(tw, &l->v, tw->a, N, tw->big + 2 * D, 3 * D, l->bv, NULL);
    }
    vis_attn_run(&tw->att, tw->pool, tw->k, tw->big, tw->a); /* RoPE + attention -> a [N][D] */
    prod(tw, &l->out, tw->a, N, tw->o, D, l->bout, tw->x);
    rmsnorm_rows(tw, l->ln2, tw->a);
    prod(tw, &l->gate, tw->a, N, tw->big, I, NULL, NULL);
    prod(tw, &l->up, tw->a, N, tw->big + N * I, I, NULL, NULL);
    glu_job g = {tw, tw->big, tw->big + N * I, I};
    dsf_parallel_for(tw->pool, N, 16, glu_range, &g);
    prod(tw, &l->down, tw->big, N, tw->o, D, NULL, tw->x);
}

/* ---- the aligner and the block ---- */

/* f rows of the r x r cells of the normed output out [nh][nw][D], zero-padded bottom/right,
 * channel-major (vision.md §4): f[c r^2 + ky r + kx] = G[Y r + ky][X r + kx][c]. */
static void merge_cells(const tower *tw, const float *out, float *f, int64_t lh, int64_t lw) {
    const int64_t D = tw->m->hp.n_embd, r = tw->m->hp.merge, rr = r * r;
    for (int64_t Y = 0; Y < lh; Y++)
        for (int64_t X = 0; X < lw; X++) {
            float *fr = f + (Y * lw + X) * D * rr;
            for (int64_t ky = 0; ky < r; ky++)
                for (int64_t kx = 0; kx < r; kx++) {
                    const int64_t gy = Y * r + ky, gx = X * r + kx;
                    const float *g = gy < tw->nh && gx < tw->nw ? out + (gy * tw->nw + gx) * D : NULL;
                    for (int64_t c = 0; c < D; c++) fr[c * rr + ky * r + kx] = g ? g[c] : 0.0f;
                }
        }
}

typedef struct {
    float *h;
    int64_t n;
    bool rnd;
} gelu_job;

static void gelu_range(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const gelu_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        float v = j->h[i];
        v = 0.5f * v * (1.0f + erff(v * (float)M_SQRT1_2)); /* the exact (erf) form */
        j->h[i] = j->rnd ? vis_bf16(v) : v;
    }
}

static void put_row(const tower *tw, float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tw->bf16 ? vis_bf16(src[i]) : src[i];
}

/* rows = W2 gelu(W1 f + b1) + b2 for the cells, then the block in span order. vit: the
 * final norm's output [N][D]; scratch f and h come from the tower's buffers. */
static void aligner(tower *tw, const float *vit, float *block) {
    const vis_model *m = tw->m;
    const int64_t r = m->hp.merge, dim = m->hp.proj_dim;
    const int64_t lh = (tw->nh + r - 1) / r, lw = (tw->nw + r - 1) / r, nc = lh * lw;
    float *f = tw->big, *h = tw->o, *rows = tw->big; /* f: [nc][D r^2] (= N' x D <= big) */
    merge_cells(tw, vit, f, lh, lw);
    prod(tw, &m->mm1, f, nc, h, dim, m->mm1_b, NULL);
    gelu_job g = {h, nc * dim, tw->bf16};
    dsf_parallel_for(tw->pool, nc * dim, 4096, gelu_range, &g);
    prod(tw, &m->mm2, h, nc, rows, dim, m->mm2_b, NULL);
    int64_t o = 0;
    put_row(tw, block + dim * o++, m->img_start, dim);
    for (int64_t Y = 0; Y < lh; Y++) {
        for (int64_t X = 0; X < lw; X++) memcpy(block + dim * o++, rows + (Y * lw + X) * dim, (size_t)dim * sizeof(float));
        put_row(tw, block + dim * o++, m->img_newline, dim);
    }
    put_row(tw, block + dim * o, m->img_end, dim);
}

/* ---- sizes ---- */

typedef struct {
    uint64_t x, a, ab, big, o, att;
} tower_sizes;

/* Element counts of each buffer; false on overflow. The aligner reuses big for f and its rows
 * and o for the hidden rows, so they must hold nc x max(D r^2, dim) and nc x dim. */
static bool sizes(const vis_hparams *hp, int64_t nh, int64_t nw, int n_threads, tower_sizes *s) {
    const uint64_t N = (uint64_t)(nh * nw), D = (uint64_t)hp->n_embd, I = (uint64_t)hp->n_ff;
    const uint64_t r = (uint64_t)hp->merge, nc = (uint64_t)((nh + hp->merge - 1) / hp->merge) *
                                                 (uint64_t)((nw + hp->merge - 1) / hp->merge);
    const uint64_t kp = (3 * (uint64_t)hp->patch * (uint64_t)hp->patch + 31) / 32 * 32;
    const uint64_t dim = (uint64_t)hp->proj_dim, fw = D * r * r > dim ? D * r * r : dim;
    uint64_t w_a = D > kp ? D : kp, w_big = 3 * D > 2 * I ? 3 * D : 2 * I, w_ab = D > I ? D : I;
    if (w_ab < D * r * r) w_ab = D * r * r;
    if (w_ab < dim) w_ab = dim;
    bool ok = dsf_mul_ok(N, D, &s->x) && dsf_mul_ok(N, w_a, &s->a) && dsf_mul_ok(N, w_ab, &s->ab) &&
              dsf_mul_ok(N, w_big, &s->big) && dsf_mul_ok(N, D, &s->o);
    uint64_t need;
    if (ok && dsf_mul_ok(nc, fw, &need) && need > s->big) s->big = need;
    if (ok && dsf_mul_ok(nc, dim, &need) && need > s->o) s->o = need;
    s->att = vis_attn_bytes(hp, N, n_threads);
    return ok && s->att > 0 && s->x < (1ull << 40) && s->big < (1ull << 40);
}

size_t vis_tower_bytes(const vis_hparams *hp, int n_vit_h, int n_vit_w, int n_threads) {
    tower_sizes s;
    if (n_vit_h < 1 || n_vit_w < 1 || !sizes(hp, n_vit_h, n_vit_w, n_threads, &s)) return 0;
    return (size_t)(4 * (s.x + s.a + s.big + s.o) + 2 * s.ab + s.att);
}

double vis_tower_flops(const vis_hparams *hp, int n_vit_h, int n_vit_w) {
    const double N = (double)n_vit_h * n_vit_w, D = hp->n_embd, I = hp->n_ff, r = hp->merge, dim = hp->proj_dim;
    const double nc = ceil(n_vit_h / r) * ceil(n_vit_w / r);
    const double per_block = 2 * N * (3 * D * D + D * D + 3 * D * I) + 4 * N * N * D;
    return 2 * N * 3 * hp->patch * hp->patch * D + hp->n_layer * per_block + 2 * nc * (D * r * r * dim + dim * dim);
}

static void tower_free(tower *tw) {
    free(tw->x), free(tw->a), free(tw->ab), free(tw->big), free(tw->o);
    vis_attn_free(&tw->att);
}

int vis_tower_run(const vis_model *m, dsf_pool *pool, const dsf_kernels *k, bool bf16, const float *patches,
                  int n_vit_h, int n_vit_w, float *vit, float *block, char *err) {
    const vis_hparams *hp = &m->hp;
    tower_sizes s;
    if (n_vit_h < 1 || n_vit_w < 1 || (int64_t)n_vit_h * n_vit_w >= (1 << 20) ||
        !sizes(hp, n_vit_h, n_vit_w, dsf_pool_size(pool), &s))
        return dsf_seterr(err, "vision tower: patch grid %d x %d out of range", n_vit_h, n_vit_w);
    tower tw = {m, pool, k, bf16, (int64_t)n_vit_h * n_vit_w, n_vit_h, n_vit_w, NULL, NULL, NULL, NULL, NULL, {0}};
    tw.x = dsf_aligned_alloc(4 * s.x), tw.a = dsf_aligned_alloc(4 * s.a), tw.ab = dsf_aligned_alloc(2 * s.ab);
    tw.big = dsf_aligned_alloc(4 * s.big), tw.o = dsf_aligned_alloc(4 * s.o);
    if (!tw.x || !tw.a || !tw.ab || !tw.big || !tw.o || vis_attn_init(&tw.att, hp, n_vit_h, n_vit_w, bf16, dsf_pool_size(pool))) {
        tower_free(&tw);
        return dsf_seterr(err, "vision tower: out of memory for %d x %d patches (%.1f MiB)", n_vit_h, n_vit_w,
                          (double)vis_tower_bytes(hp, n_vit_h, n_vit_w, dsf_pool_size(pool)) / 1048576.0);
    }
    patch_embed(&tw, patches);
    for (int il = 0; il < hp->n_layer; il++) vit_block(&tw, &m->layers[il]);
    rmsnorm_rows(&tw, m->post_ln, tw.a);
    if (vit) memcpy(vit, tw.a, (size_t)(tw.N * hp->n_embd) * sizeof(float));
    if (block) aligner(&tw, tw.a, block);
    tower_free(&tw);
    return 0;
}
