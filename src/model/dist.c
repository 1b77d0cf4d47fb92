/* dist.c: the job's options and the plan of an engine spread over MPI ranks (dist.h): which
 * stage owns which layers, what crosses each cut, which experts each member owns, and what
 * each rank holds.
 *
 * Cuts: the layers are split so that the largest stage's weight bytes are as small as
 * possible; among the splits within 10 % of that, the one whose cuts carry the fewest extra
 * bytes per token wins (for the released roles: cuts at 2, 8, 14 and 20 carry nothing but the
 * stream; at 24, 28, 32 and 36 layer 20's new rows and candidates; elsewhere also a top-k).
 * Owns: the public dsf_dist_* calls (dsflash.h).
 * Must not: send anything (distpipe.c, distmoe.c, distops.c, distfollow.c, distsnap.c do). */
#include "model/dist.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    bool on;
    bool pipeline, experts;
    int stages;
    char split[256];
    bool attached; /* one engine per job */
} G;

bool dist_configured(void) { return G.on; }

/* Takes "--name value" or "--name=value" at argv[*i]; advances *i past it. */
static const char *take_opt(int argc, char **argv, int *i, const char *name, bool *bad) {
    const size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[(*i)++] + n + 1;
    if (argv[*i][n] != 0) return NULL;
    if (*i + 1 >= argc) {
        *bad = true;
        (*i)++;
        return NULL;
    }
    *i += 2;
    return argv[*i - 1];
}

int dsf_dist_init(int *argc, char ***argv, char *err) {
    const char *parallel = NULL, *split = NULL, *stages = NULL, *timeout = NULL, *live = NULL;
    int out = 1;
    char **av = *argv;
    for (int i = 1; i < *argc;) {
        bool bad = false;
        const char *v;
        if ((v = take_opt(*argc, av, &i, "--parallel", &bad))) parallel = v;
        else if ((v = take_opt(*argc, av, &i, "--pp-split", &bad))) split = v;
        else if ((v = take_opt(*argc, av, &i, "--stages", &bad))) stages = v;
        else if ((v = take_opt(*argc, av, &i, "--mpi-timeout", &bad))) timeout = v;
        else if ((v = take_opt(*argc, av, &i, "--mpi-liveness", &bad))) live = v;
        else if (bad) return dsf_seterr(err, "%s needs a value", av[i - 1]);
        else av[out++] = av[i++];
        if (bad) return dsf_seterr(err, "%s needs a value", av[i - 1]);
    }
    *argc = out;
    av[out] = NULL;
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    if (!env) env = getenv("PMI_SIZE");
    if (!parallel) {
        if (env && atoi(env) > 1)
            return dsf_seterr(err, "started as one of %s ranks of an MPI job: pass --parallel pipeline, experts or "
                                   "pipeline,experts", env);
        if (split || stages) return dsf_seterr(err, "--pp-split and --stages need --parallel");
        return 0; /* single process, exactly as without MPI */
    }
    if (!strcmp(parallel, "pipeline")) G.pipeline = true;
    else if (!strcmp(parallel, "experts")) G.experts = true;
    else if (!strcmp(parallel, "pipeline,experts") || !strcmp(parallel, "experts,pipeline")) G.pipeline = G.experts = true;
    else return dsf_seterr(err, "--parallel '%s': want pipeline, experts or pipeline,experts", parallel);
    if (split) {
        if (!G.pipeline) return dsf_seterr(err, "--pp-split needs --parallel pipeline");
        snprintf(G.split, sizeof G.split, "%s", split);
    }
    if (stages) {
        char *end;
        long k = strtol(stages, &end, 10);
        if (*end || k < 1 || k > DIST_MAX_STAGES) return dsf_seterr(err, "--stages '%s': want a count of 1..%d", stages, DIST_MAX_STAGES);
        if (!(G.pipeline && G.experts)) return dsf_seterr(err, "--stages needs --parallel pipeline,experts");
        G.stages = (int)k;
    }
    comm_params cp = {0, 0};
    if (timeout && (cp.timeout_s = atof(timeout)) <= 0) return dsf_seterr(err, "--mpi-timeout '%s': want seconds > 0", timeout);
    if (live && (cp.liveness_s = atof(live)) <= 0) return dsf_seterr(err, "--mpi-liveness '%s': want seconds > 0", live);
    if (comm_start(argc, argv, &cp, err) < 0) return -1;
    G.on = true;
    return 0;
}

int dsf_dist_rank(void) { return comm_rank(); }
int dsf_dist_size(void) { return comm_size(); }
void dsf_dist_signal_stop(void) { comm_note_stop(); }
const char *dsf_dist_failure(void) { return comm_check() ? NULL : comm_failure(); }
void dsf_dist_end(int code) {
    if (!G.on) return;
    comm_exit(code, code != 0);
}

/* ---- cuts ---------------------------------------------------------------------------- */

void dist_cut_of(const dsf_shape *sh, int64_t c, dist_cut *out) {
    memset(out, 0, sizeof *out);
    for (int64_t s = 0; s < c && s < sh->n_layer; s++) {
        if (sh->kv_src[s] != s) continue;
        for (int64_t il = c; il < sh->n_layer; il++)
            if (sh->kv_src[il] == s) {
                out->src[out->n_src++] = (int32_t)s;
                break;
            }
    }
    for (int64_t il = c; il < sh->n_layer; il++) {
        if (sh->ratio[il] <= 0) continue;
        if (sh->topk_src[il] >= 0 && sh->topk_src[il] < c) out->sel = true;
        if (sh->cand_src >= 0 && sh->cand_src < c && il > sh->cand_src && sh->topk_src[il] == il) out->cand = true;
    }
}

double dist_cut_bytes(const dsf_shape *sh, const dist_cut *cut, int packed) {
    int64_t wrow, crow, irow;
    kv_row_bytes(sh, packed, &wrow, &crow, &irow);
    double b = 0;
    for (int k = 0; k < cut->n_src; k++) b += (double)(crow + irow) / (double)sh->ratio[cut->src[k]];
    if (cut->sel) b += 8.0 + 4.0 * (double)sh->idx_topk;
    if (cut->cand) b += 8.0 + 4.0 * (double)sh->cand_topk_blocks;
    return b;
}

/* Weight bytes of each layer (every blk.N.* tensor) into lb[n_layer]. */
static void layer_bytes(const dsf_engine *e, double *lb) {
    const gguf_file *g = e->gguf;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *nm = g->tensors[i].name;
        if (strncmp(nm, "blk.", 4) != 0) continue;
        long il = strtol(nm + 4, NULL, 10);
        if (il >= 0 && il < e->shape.n_layer) lb[il] += (double)g->tensors[i].nbytes;
    }
}

/* Splits [0, L) into S stages: cuts[1..S-1] (cuts[0] = 0, cuts[S] = L). */
static void choose_cuts(const dsf_engine *e, int S, int64_t *cuts) {
    const dsf_shape *sh = &e->shape;
    const int64_t L = sh->n_layer;
    double *lb = dsf_xcalloc((size_t)L, sizeof *lb), *pre = dsf_xcalloc((size_t)L + 1, sizeof *pre),
           *cost = dsf_xcalloc((size_t)L + 1, sizeof *cost);
    layer_bytes(e, lb);
    for (int64_t i = 0; i < L; i++) pre[i + 1] = pre[i] + lb[i] + 1.0; /* +1: weightless layers still count */
    for (int64_t c = 1; c < L; c++) {
        dist_cut cut;
        dist_cut_of(sh, c, &cut);
        cost[c] = dist_cut_bytes(sh, &cut, 1);
    }
    /* best[s][c]: the smallest largest stage over [0, c) in s stages; then, within 10 % of the
     * optimum, the smallest total cut cost */
    const size_t W = (size_t)L + 1;
    double *best = dsf_xmalloc((size_t)(S + 1) * W * sizeof *best), *acc = dsf_xmalloc((size_t)(S + 1) * W * sizeof *acc);
    int64_t *from = dsf_xmalloc((size_t)(S + 1) * W * sizeof *from);
    for (int pass = 0; pass < 2; pass++) {
        const double bound = pass ? best[(size_t)S * W + (size_t)L] * 1.10 : 0;
        for (size_t k = 0; k < (size_t)(S + 1) * W; k++) best[k] = acc[k] = 1e300, from[k] = -1;
        best[0] = acc[0] = 0;
        for (int s = 1; s <= S; s++)
            for (int64_t c = s; c <= L; c++)
                for (int64_t b = s - 1; b < c; b++) {
                    const size_t pb = (size_t)(s - 1) * W + (size_t)b, pc = (size_t)s * W + (size_t)c;
                    if (best[pb] >= 1e300) continue;
                    const double stage = pre[c] - pre[b], mx = stage > best[pb] ? stage : best[pb];
                    const double cc = acc[pb] + (b > 0 ? cost[b] : 0);
                    if (!pass ? mx < best[pc] : (mx <= bound && (cc < acc[pc] || (cc == acc[pc] && mx < best[pc])))) {
                        best[pc] = mx, acc[pc] = cc, from[pc] = b;
                    }
                }
    }
    cuts[S] = L;
    for (int s = S; s >= 1; s--) cuts[s - 1] = from[(size_t)s * W + (size_t)cuts[s]];
    free(lb), free(pre), free(cost), free(best), free(acc), free(from);
}

static int parse_split(const char *txt, int64_t L, int S, int64_t *cuts, char *err) {
    const char *p = txt;
    int k = 1;
    cuts[0] = 0;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= cuts[k - 1] || v >= L || k >= S)
            return dsf_seterr(err, "--pp-split '%s': want %d increasing layer numbers in 1..%lld (one per cut)", txt,
                              S - 1, (long long)L - 1);
        cuts[k++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return dsf_seterr(err, "--pp-split '%s': not a list of layer numbers", txt);
    }
    if (k != S) return dsf_seterr(err, "--pp-split '%s': %d stages need %d cuts", txt, S, S - 1);
    cuts[S] = L;
    return 0;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

int dist_plan_make(const dsf_engine *e, const dist_opts *o, int N, int me, dist_plan **out, char *err) {
    const dsf_shape *sh = &e->shape;
    *out = NULL;
    if (N < 1 || N > COMM_MAX_RANKS || me < 0 || me >= N) return dsf_seterr(err, "%d ranks: want 1..%d", N, COMM_MAX_RANKS);
    const int S = !o->pipeline ? 1 : !o->experts ? N : o->stages ? o->stages : (N >= 2 ? 2 : 1);
    if (S > N) return dsf_seterr(err, "%d stages need at least %d ranks (the job has %d)", S, S, N);
    if (S > sh->n_layer) return dsf_seterr(err, "%d stages for %lld layers", S, (long long)sh->n_layer);
    int64_t cuts[DIST_MAX_STAGES + 1];
    if (o->split && o->split[0]) {
        if (parse_split(o->split, sh->n_layer, S, cuts, err) < 0) return -1;
    } else {
        choose_cuts(e, S, cuts);
    }
    dist_plan *d = dsf_xcalloc(1, sizeof *d);
    d->rank = me, d->size = N, d->n_stages = S;
    for (int s = 0; s <= S; s++) d->first[s] = (int)((int64_t)s * N / S);
    for (int s = 0; s < S; s++) {
        d->l0[s] = cuts[s], d->l1[s] = cuts[s + 1];
        if (d->first[s] <= me && me < d->first[s + 1]) d->stage = s;
        if (s > 0) dist_cut_of(sh, cuts[s], &d->cut[s]);
    }
    d->members = d->first[d->stage + 1] - d->first[d->stage];
    d->member = me - d->first[d->stage];
    d->split_experts = d->members > 1;
    if (d->split_experts && sh->n_expert < d->members) {
        const int m = d->members;
        free(d);
        return dsf_seterr(err, "%d ranks share a stage's %lld experts", m, (long long)sh->n_expert);
    }
    d->e0 = sh->n_expert * d->member / d->members;
    d->e1 = sh->n_expert * (d->member + 1) / d->members;
    d->hold = dsf_xcalloc((size_t)sh->n_layer, 1);
    d->hold_src = dsf_xcalloc((size_t)sh->n_layer, 1);
    const int64_t l0 = d->l0[d->stage], l1 = d->l1[d->stage];
    for (int64_t il = l0; il < l1; il++) {
        d->hold[il] = 1;
        if (sh->kv_src[il] >= 0) d->hold_src[sh->kv_src[il]] = 1;
    }
    if (d->stage + 1 < S) /* rows this stage passes on to the next */
        for (int k = 0; k < d->cut[d->stage + 1].n_src; k++) d->hold_src[d->cut[d->stage + 1].src[k]] = 1;
    uint64_t sig = mix(0x6473666c61736821ull, (uint64_t)S);
    for (int s = 0; s < S; s++) sig = mix(mix(sig, (uint64_t)cuts[s + 1]), (uint64_t)(d->first[s + 1] - d->first[s]));
    d->signature = sig;
    d->next_sid = 1;
    *out = d;
    return 0;
}

void dist_plan_free(dist_plan *d) {
    if (!d) return;
    free(d->hold);
    free(d->hold_src);
    free(d);
}

/* Weight bytes rank d reads: its layers' tensors, of the routed experts its share; the head on
 * the head rank (the embedding is read a row per token and not counted). */
double dist_weight_bytes(const dsf_engine *e, const dist_plan *d) {
    const gguf_file *g = e->gguf;
    double b = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *nm = g->tensors[i].name;
        const double nb = (double)g->tensors[i].nbytes;
        if (strncmp(nm, "blk.", 4) == 0) {
            long il = strtol(nm + 4, NULL, 10);
            if (il < 0 || il >= e->shape.n_layer || !d->hold[il]) continue;
            const bool routed = strstr(nm, "_exps.") != NULL;
            b += routed ? nb * (double)(d->e1 - d->e0) / (double)e->shape.n_expert : nb;
        } else if (!strcmp(nm, "output.weight") || !strcmp(nm, "output_norm.weight")) {
            if (dist_is_head(d)) b += nb;
        }
    }
    return b;
}

int dist_attach(dsf_engine *e, char *err) {
    if (G.attached) return dsf_seterr(err, "an MPI job spreads one engine; this one opens a second");
    dist_opts o = {G.pipeline, G.experts, G.stages, G.split};
    dist_plan *d;
    if (dist_plan_make(e, &o, comm_size(), comm_rank(), &d, err) < 0) return -1;
    e->dist = d;
    G.attached = true;
    const int s = d->stage;
    char cuts[128] = "";
    for (int k = 1; k < d->n_stages; k++)
        snprintf(cuts + strlen(cuts), sizeof cuts - strlen(cuts), "%s%lld", k > 1 ? "," : "", (long long)d->l0[k]);
    dsf_log(1, "dsflash: rank %d of %d (host %s): stage %d of %d (cuts at %s), layers %lld-%lld, experts %lld-%lld of %lld: "
               "%.2f GB of weights%s%s",
            d->rank, d->size, comm_host(d->rank), s, d->n_stages, cuts[0] ? cuts : "none", (long long)d->l0[s],
            (long long)d->l1[s] - 1, (long long)d->e0, (long long)d->e1 - 1, (long long)e->shape.n_expert,
            dist_weight_bytes(e, d) / 1e9, s == 0 ? " + the embedding" : "", dist_is_head(d) ? " + the head" : "");
    return 0;
}

void dist_detach(dsf_engine *e) {
    dist_plan_free(e->dist);
    e->dist = NULL;
}

int dsf_dist_describe(const dsf_engine *e, const char *parallel, int ranks, const char *split, int stages,
                      void (*emit)(void *ud, const char *line), void *ud, char *err) {
    dist_opts o = {false, false, stages, split};
    if (!parallel || !strcmp(parallel, "pipeline")) o.pipeline = true;
    else if (!strcmp(parallel, "experts")) o.experts = true;
    else if (!strcmp(parallel, "pipeline,experts") || !strcmp(parallel, "experts,pipeline")) o.pipeline = o.experts = true;
    else return dsf_seterr(err, "--parallel '%s': want pipeline, experts or pipeline,experts", parallel);
    const dsf_shape *sh = &e->shape;
    const int packed = kv_pack_default(e->numerics == DSF_NUMERICS_REFERENCE);
    int64_t wrow, crow, irow;
    kv_row_bytes(sh, packed, &wrow, &crow, &irow);
    char line[512];
    for (int r = 0; r < ranks; r++) {
        dist_plan *d;
        if (dist_plan_make(e, &o, ranks, r, &d, err) < 0) return -1;
        const int s = d->stage;
        if (r == 0) {
            snprintf(line, sizeof line, "%d ranks, %d stage%s (--parallel %s)", ranks, d->n_stages, d->n_stages > 1 ? "s" : "",
                     parallel ? parallel : "pipeline");
            emit(ud, line);
            const double stream = (double)(sh->hc * sh->n_embd + sh->hc) * 4.0;
            for (int k = 1; k < d->n_stages; k++) {
                const dist_cut *c = &d->cut[k];
                char what[256] = "";
                for (int i = 0; i < c->n_src; i++)
                    snprintf(what + strlen(what), sizeof what - strlen(what), ", layer %d's new rows", c->src[i]);
                if (c->sel) snprintf(what + strlen(what), sizeof what - strlen(what), ", a top-k list");
                if (c->cand) snprintf(what + strlen(what), sizeof what - strlen(what), ", a candidate list");
                snprintf(line, sizeof line, "cut before layer %lld: %.0f bytes per token (the stream %.0f%s; at most %.0f more)",
                         (long long)d->l0[k], stream + dist_cut_bytes(sh, c, packed), stream, what, dist_cut_bytes(sh, c, packed));
                emit(ud, line);
            }
        }
        double kv = 4.0;
        for (int64_t il = 0; il < sh->n_layer; il++) {
            if (sh->kv_src[il] == il && d->hold_src[il]) kv += (double)(crow + irow) / (double)sh->ratio[il];
        }
        int64_t nl = 0;
        for (int64_t il = 0; il < sh->n_layer; il++) nl += d->hold[il];
        snprintf(line, sizeof line,
                 "rank %d: stage %d, layers %lld-%lld, experts %lld-%lld: %.2f GB of weights%s%s; KV %.0f bytes per token of "
                 "context + %.1f MB of window rings per session",
                 r, s, (long long)d->l0[s], (long long)d->l1[s] - 1, (long long)d->e0, (long long)d->e1 - 1,
                 dist_weight_bytes(e, d) / 1e9, s == 0 ? " + the embedding (a row per token)" : "",
                 dist_is_head(d) ? " + the head" : "", kv, (double)nl * (double)wrow * (double)(sh->window + 512 + 1024) / 1e6);
        emit(ud, line);
        dist_plan_free(d);
    }
    return 0;
}
