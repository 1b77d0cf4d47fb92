/* dist.c: the MPI plan (src/model/dist.c) on the released layer roles, without MPI and without
 * weights: the "real" synth preset written header-only gives the real shape and tensor sizes.
 * Expected values come from the spec, never from dist.c:
 *   gguf-layout.md §2.5 / architecture.md §1.3: kv_src = 2 for layers 2-7, 8 for 8-13, 14 for
 *   14-19, 20 for 20-39; topk_src = 2, 8, 14, 20, 24, 28, 32, 36 for their runs of 6, 6, 6, 4,
 *   4, 4, 4, 4 layers; layer 20 computes the candidate blocks (§4.4.6) that the re-indexing
 *   layers 24, 28, 32 and 36 are restricted to; layers 0-1 have ratio 0;
 *   architecture.md §5.1: packed rows of 288 B (compressed) and 68 B (index key), a row per
 *   ratio tokens; fp32 rows (plain numerics) of 512 and 128 floats; index_topk 512 and
 *   2048 candidate blocks, a list being a count (8 B) and its int32 entries.
 * Guards against: a cut that leaves out a dependency crossing it (a stage would read rows,
 * a top-k or candidates it never received: wrong logits only on long contexts), a cut that
 * ships what does not cross (wasted bandwidth in every decoded token), and a plan that cuts the
 * released model somewhere other than the free cut at layer 20 for two stages. */
#include "test.h"
#include "base/util.h"
#include "convert/synth.h"
#include "io/gguf.h"
#include "model/dist.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The real preset's header, its shape, and an engine that holds only those two. */
typedef struct {
    gguf_file *g;
    dsf_engine e;
} real_fx;

static int real_open(test_ctx *t, real_fx *fx) {
    char err[DSF_ERR_LEN] = "", path[512];
    memset(fx, 0, sizeof *fx);
    snprintf(path, sizeof path, "%s/real-header.gguf", test_tmpdir());
    const synth_write_opts o = {.header_only = true, .type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    if (synth_write_ex("real", path, 1, &o, NULL, 0, NULL, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "synth_write_ex: %s", err);
        return -1;
    }
    if (!(fx->g = gguf_open_header(path, err)) || shape_load(&fx->e.shape, fx->g, err) < 0) {
        test_fail(t, __FILE__, __LINE__, "%s", err);
        return -1;
    }
    fx->e.gguf = fx->g;
    fx->e.numerics = DSF_NUMERICS_REFERENCE;
    return 0;
}

static void real_close(real_fx *fx) {
    shape_free(&fx->e.shape);
    gguf_close(fx->g);
}

/* The spec's roles (header comment), layer by layer. */
static int spec_kv_src(int il) { return il < 2 ? -1 : il < 8 ? 2 : il < 14 ? 8 : il < 20 ? 14 : 20; }
static int spec_topk_src(int il) { return il < 2 ? -1 : il < 20 ? spec_kv_src(il) : 20 + (il - 20) / 4 * 4; }

TEST(dist_real_roles_cuts) {
    real_fx fx;
    if (real_open(t, &fx) < 0) return;
    const dsf_shape *sh = &fx.e.shape;
    CHECKF(sh->n_layer == 40 && sh->cand_src == 20 && sh->idx_topk == 512 && sh->cand_topk_blocks == 2048,
           "layers %lld, candidate source %lld, top-k %lld, candidate blocks %lld", (long long)sh->n_layer,
           (long long)sh->cand_src, (long long)sh->idx_topk, (long long)sh->cand_topk_blocks);
    for (int il = 0; il < 40; il++)
        CHECKF(sh->kv_src[il] == spec_kv_src(il) && sh->topk_src[il] == spec_topk_src(il),
               "layer %d: kv_src %lld topk_src %lld, the spec says %d and %d", il, (long long)sh->kv_src[il],
               (long long)sh->topk_src[il], spec_kv_src(il), spec_topk_src(il));
    /* c, the crossing sources (-1: none), top-k, candidates, extra bytes per token packed / fp32 */
    static const struct {
        int c, src, sel, cand;
        double packed, plain;
    } want[] = {
        {1, -1, 0, 0, 0, 0},                 /* only window layers before it */
        {2, -1, 0, 0, 0, 0},                 /* a group starts: its source is behind the cut */
        {8, -1, 0, 0, 0, 0},                 {14, -1, 0, 0, 0, 0},
        {20, -1, 0, 0, 0, 0},                /* the free cut: 20 computes its own rows and candidates */
        {3, 2, 1, 0, 356.0 / 2 + 2056, 2560.0 / 2 + 2056}, /* layer 2's rows (ratio 2) + its top-k */
        {13, 8, 1, 0, 356.0 / 2 + 2056, 2560.0 / 2 + 2056},
        {21, 20, 1, 1, 356 + 2056 + 8200, 2560 + 2056 + 8200}, /* 21-23 reuse 20's top-k; 24.. its candidates */
        {24, 20, 0, 1, 356 + 8200, 2560 + 8200},                /* 24 re-indexes with 20's keys and candidates */
        {28, 20, 0, 1, 356 + 8200, 2560 + 8200}, {36, 20, 0, 1, 356 + 8200, 2560 + 8200},
        {37, 20, 1, 0, 356 + 2056, 2560 + 2056}, /* 37-39 reuse 36's top-k; no re-indexing layer after 36 */
        {39, 20, 1, 0, 356 + 2056, 2560 + 2056},
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        dist_cut cut;
        dist_cut_of(sh, want[k].c, &cut);
        const int nsrc = want[k].src >= 0;
        CHECKF(cut.n_src == nsrc && (!nsrc || cut.src[0] == want[k].src) && cut.sel == (want[k].sel != 0) &&
                   cut.cand == (want[k].cand != 0),
               "cut at %d: %d sources (first %d), top-k %d, candidates %d", want[k].c, cut.n_src,
               cut.n_src ? cut.src[0] : -1, cut.sel, cut.cand);
        const double bp = dist_cut_bytes(sh, &cut, 1), bf = dist_cut_bytes(sh, &cut, 0);
        CHECKF(bp == want[k].packed && bf == want[k].plain, "cut at %d: %.1f bytes packed, %.1f fp32; want %.1f, %.1f",
               want[k].c, bp, bf, want[k].packed, want[k].plain);
    }
    /* every cut: the crossing sources are exactly those a later layer reads */
    for (int c = 1; c < 40; c++) {
        dist_cut cut;
        dist_cut_of(sh, c, &cut);
        int n = 0, sel = 0, cand = 0;
        for (int s = 2; s < c; s++) {
            int read = 0;
            for (int il = c; il < 40; il++) read |= spec_kv_src(il) == s;
            if (read) CHECKF(n < cut.n_src && cut.src[n++] == s, "cut at %d: layer %d's rows do not cross", c, s);
        }
        for (int il = c; il < 40; il++) {
            sel |= spec_topk_src(il) >= 0 && spec_topk_src(il) < c;
            cand |= c > 20 && il > 20 && spec_topk_src(il) == il;
        }
        CHECKF(n == cut.n_src && sel == cut.sel && cand == cut.cand, "cut at %d: %d/%d sources, top-k %d/%d, candidates %d/%d",
               c, cut.n_src, n, cut.sel, sel, cut.cand, cand);
    }
    real_close(&fx);
}

/* Guards against: a plan that does not split the released model at the free cut (20) for two
 * pipeline stages, splits the experts unevenly or off by one, or counts weights twice. */
TEST(dist_real_plan) {
    real_fx fx;
    if (real_open(t, &fx) < 0) return;
    char err[DSF_ERR_LEN] = "";
    dist_opts pp = {true, false, 0, NULL};
    dist_plan *d[3];
    for (int r = 0; r < 2; r++) CHECKF(dist_plan_make(&fx.e, &pp, 2, r, &d[r], err) == 0, "%s", err);
    CHECKF(d[0]->n_stages == 2 && d[0]->l0[1] == 20 && d[0]->l1[1] == 40 && d[1]->stage == 1 && d[1]->l0[1] == 20,
           "2 stages: cut at %lld", (long long)d[0]->l0[1]);
    CHECK(d[1]->cut[1].n_src == 0 && !d[1]->cut[1].sel && !d[1]->cut[1].cand);
    CHECK(!dist_is_head(d[0]) && dist_is_head(d[1]) && d[0]->e0 == 0 && d[0]->e1 == 384);
    double total = 0, two = dist_weight_bytes(&fx.e, d[0]) + dist_weight_bytes(&fx.e, d[1]);
    for (uint64_t i = 0; i < fx.g->n_tensors; i++) {
        const char *nm = fx.g->tensors[i].name;
        if (!strncmp(nm, "blk.", 4) || !strcmp(nm, "output.weight") || !strcmp(nm, "output_norm.weight"))
            total += (double)fx.g->tensors[i].nbytes;
    }
    CHECKF(two == total, "the two stages read %.0f bytes, the layers and head are %.0f", two, total);
    for (int r = 0; r < 2; r++) dist_plan_free(d[r]);
    /* pipeline,experts on 3 ranks: stage 0 = rank 0, stage 1 = ranks 1-2 with 192 experts each */
    dist_opts pe = {true, true, 0, NULL};
    for (int r = 0; r < 3; r++) CHECKF(dist_plan_make(&fx.e, &pe, 3, r, &d[r], err) == 0, "%s", err);
    CHECK(d[0]->n_stages == 2 && d[0]->l0[1] == 20 && d[0]->first[1] == 1 && d[0]->first[2] == 3);
    CHECK(d[1]->stage == 1 && d[1]->e0 == 0 && d[1]->e1 == 192 && d[2]->e0 == 192 && d[2]->e1 == 384);
    CHECK(dist_is_head(d[1]) && !dist_is_head(d[2]));
    for (int r = 0; r < 3; r++) dist_plan_free(d[r]);
    /* a forced split is taken as given; a bad one is refused with a message */
    dist_opts bad = {true, false, 0, "21,20"};
    CHECK(dist_plan_make(&fx.e, &bad, 3, 0, &d[0], err) < 0 && strstr(err, "--pp-split"));
    real_close(&fx);
}
