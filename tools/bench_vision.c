/* bench_vision.c: `dsflash bench --vision MMPROJ|synth` (see bench_vision.h).
 *
 * Owns: the in-memory random projector of the release shapes (random, never constant: the
 * weights are read from memory as a real file's would be), the random patches and the report.
 * Must not: change what it measures: the tower runs exactly as dsf_vision_encode runs it
 * (vis_tower_run, the process's kernel table, a pool of --threads).
 * The FLOPs are vis_tower_flops' (products and attention, 2 per multiply-add); the peak is the
 * best of 3 BF16 dot probes before and after the image (the larger: a disturbed probe only
 * reads low). */
#include "bench_vision.h"
#include "cmd.h"
#include "vision/mmproj.h"
#include "vision/tower.h"
#include "vision/vbf16.h"
#include "kernels/select.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}
/* uniform in [-a, a) */
static float rnd(uint64_t *s, float a) { return a * ((float)(rng_next(s) >> 40) * 0x1p-23f - 1.0f); }

typedef struct {
    vis_model m;
    uint16_t *arena;  /* every 2-D weight, BF16 */
    float *vecs;      /* every 1-D vector */
    size_t n_arena, n_vecs, used_a, used_v;
    uint64_t rng;
} synth;

static dsf_wmat synth_mat(synth *s, int64_t n_in, int64_t n_out) {
    uint16_t *p = s->arena + s->used_a;
    s->used_a += (size_t)(n_in * n_out);
    DSF_ASSERT(s->used_a <= s->n_arena);
    const float a = 1.7f / (float)n_in; /* ~unit-variance outputs: 1.7 / n_in * sqrt(n_in / 3) */
    for (int64_t i = 0; i < n_in * n_out; i++) p[i] = f32_to_bf16(rnd(&s->rng, a * 20.0f));
    return (dsf_wmat){GGML_TYPE_BF16, n_in, n_out, (uint64_t)n_in * 2, (const uint8_t *)p, NULL};
}

static const float *synth_vec(synth *s, int64_t n, float base, float amp) {
    float *p = s->vecs + s->used_v;
    s->used_v += (size_t)n;
    DSF_ASSERT(s->used_v <= s->n_vecs);
    for (int64_t i = 0; i < n; i++) p[i] = vis_bf16(base + rnd(&s->rng, amp));
    return p;
}

/* The release shapes (vision.md §1) with random BF16 weights, as a converted file holds them. */
static vis_model *synth_release(synth *s) {
    vis_hparams hp = {.n_layer = 32, .n_embd = 1024, .n_head = 16, .head_dim = 64, .n_ff = 2816, .patch = 14,
                      .merge = 3, .proj_dim = 5120, .min_pixels = 295936, .eps = 1e-6f};
    const int64_t D = hp.n_embd, I = hp.n_ff, dim = hp.proj_dim, kp = (3 * 14 * 14 + 31) / 32 * 32;
    s->n_arena = (size_t)(hp.n_layer * (4 * D * D + 3 * D * I) + D * 9 * dim + dim * dim);
    s->n_vecs = (size_t)(D + hp.n_layer * 6 * D + D + 5 * dim);
    s->arena = dsf_aligned_alloc(s->n_arena * 2);
    s->vecs = dsf_aligned_alloc(s->n_vecs * 4);
    s->m.patch_w_data = dsf_aligned_alloc((size_t)(kp * D) * 4);
    s->m.layers = dsf_xcalloc((size_t)hp.n_layer, sizeof *s->m.layers);
    if (!s->arena || !s->vecs || !s->m.patch_w_data) return NULL;
    s->rng = 0x9E3779B97F4A7C15ull;
    s->m.hp = hp;
    for (int64_t o = 0; o < D; o++)
        for (int64_t i = 0; i < kp; i++) s->m.patch_w_data[o * kp + i] = i < 588 ? vis_bf16(rnd(&s->rng, 0.07f)) : 0.0f;
    s->m.patch_w = (dsf_wmat){GGML_TYPE_F32, kp, D, (uint64_t)kp * 4, (const uint8_t *)s->m.patch_w_data, NULL};
    s->m.patch_b = synth_vec(s, D, 0.0f, 0.1f);
    for (int il = 0; il < hp.n_layer; il++) {
        vis_layer *l = &s->m.layers[il];
        l->ln1 = synth_vec(s, D, 1.0f, 0.1f), l->ln2 = synth_vec(s, D, 1.0f, 0.1f);
        l->qkv = synth_mat(s, D, 3 * D), l->bqkv = synth_vec(s, 3 * D, 0.0f, 0.1f);
        l->out = synth_mat(s, D, D), l->bout = synth_vec(s, D, 0.0f, 0.1f);
        l->gate = synth_mat(s, D, I), l->up = synth_mat(s, D, I), l->down = synth_mat(s, I, D);
    }
    s->m.post_ln = synth_vec(s, D, 1.0f, 0.1f);
    s->m.mm1 = synth_mat(s, D * 9, dim), s->m.mm1_b = synth_vec(s, dim, 0.0f, 0.1f);
    s->m.mm2 = synth_mat(s, dim, dim), s->m.mm2_b = synth_vec(s, dim, 0.0f, 0.1f);
    s->m.img_start = synth_vec(s, dim, 0.0f, 1.0f);
    s->m.img_end = synth_vec(s, dim, 0.0f, 1.0f);
    s->m.img_newline = synth_vec(s, dim, 0.0f, 1.0f);
    return &s->m;
}

/* CPU seconds this process has used (user + system), for the share of the machine it got. */
static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
           1e-6 * (double)u.ru_stime.tv_usec;
}

static void synth_free(synth *s) {
    free(s->arena), free(s->vecs), free(s->m.patch_w_data), free(s->m.layers);
}

int bench_vision(const char *what, const char *grid, int n_threads, int plain) {
    char err[DSF_ERR_LEN] = "";
    int gw = 108, gh = 81;
    if (grid && (sscanf(grid, "%dx%d", &gw, &gh) != 2 || gw < 1 || gh < 1 || (long)gw * gh > 65536)) {
        fprintf(stderr, "dsflash bench: --vision-grid wants WxH patches (at most 65536), got '%s'\n", grid);
        return 2;
    }
    synth s = {0};
    vis_model *file = NULL;
    const vis_model *m = NULL;
    if (!strcmp(what, "synth")) {
        m = synth_release(&s);
        if (!m) fprintf(stderr, "dsflash bench: out of memory for the synthetic projector\n");
    } else {
        m = file = vis_model_open(what, err);
        if (!m) fprintf(stderr, "dsflash bench: %s\n", err);
    }
    if (!m) {
        synth_free(&s);
        return 1;
    }
    const vis_hparams *hp = &m->hp;
    const int64_t N = (int64_t)gw * gh, k = 3 * (int64_t)hp->patch * hp->patch;
    const int r = hp->merge, tokens = (gh + r - 1) / r * ((gw + r - 1) / r + 1) + 2;
    float *px = malloc((size_t)(N * k) * sizeof(float));
    float *block = malloc((size_t)tokens * (size_t)hp->proj_dim * sizeof(float));
    uint64_t rs = 12345;
    for (int64_t i = 0; px && i < N * k; i++) px[i] = vis_bf16(rnd(&rs, 1.0f));
    dsf_pool *pool = dsf_pool_new(n_threads);
    const dsf_kernels *kt = kernels_get();
    double pk0 = bench_bf16_peak(pool, kt);
    double t0 = dsf_now(), c0 = cpu_s();
    int rc = px && block ? vis_tower_run(m, pool, kt, !plain, px, gh, gw, NULL, block, err) : dsf_seterr(err, "out of memory");
    double dt = dsf_now() - t0, cpu = cpu_s() - c0;
    double pk1 = bench_bf16_peak(pool, kt), peak = pk0 > pk1 ? pk0 : pk1;
    if (rc) {
        fprintf(stderr, "dsflash bench: %s\n", err);
    } else {
        const double gf = vis_tower_flops(hp, gh, gw) / dt / 1e9;
        printf("vision tower (%s, %d blocks, width %d, %d heads, ffn %d, text width %d), %s tower\n",
               file ? what : "synth release shapes", hp->n_layer, hp->n_embd, hp->n_head, hp->n_ff, hp->proj_dim,
               plain ? "fp32" : "bf16");
        printf("  image %dx%d patches (%lld), %d tokens; scratch %.0f MiB; kernels %s, threads %d, commit %s\n", gw, gh,
               (long long)N, tokens, (double)vis_tower_bytes(hp, gh, gw, n_threads) / 1048576.0, kt->name,
               dsf_pool_size(pool), dsf_build_commit);
        printf("  %.0f ms per image, %.1f GFLOP/s (%.2f TFLOP); measured BF16 peak %.1f GFLOP/s (probes %.1f / %.1f): "
               "%.3f of peak\n",
               1e3 * dt, gf, vis_tower_flops(hp, gh, gw) / 1e12, peak, pk0, pk1, gf / peak);
        printf("  CPU time %.1f s over %.1f s wall on %d threads (%.0f %% of them; other load on the machine lowers it)\n",
               cpu, dt, dsf_pool_size(pool), 100.0 * cpu / dt / dsf_pool_size(pool));
        printf("vision_ms=%.1f vision_gflops=%.1f peak_gflops=%.1f peak_fraction=%.3f patches=%lld threads=%d kernels=%s\n",
               1e3 * dt, gf, peak, gf / peak, (long long)N, dsf_pool_size(pool), kt->name);
    }
    dsf_pool_free(pool);
    free(px), free(block);
    vis_model_free(file);
    synth_free(&s);
    return rc ? 1 : 0;
}
