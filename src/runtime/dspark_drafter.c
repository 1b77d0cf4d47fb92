/* dspark_drafter.c: the DSpark draft behind the drafter interface of the speculative loop
 * (runtime/spec.h, TASK35 interface): propose = one draft call after the session's last
 * committed position (dspark.md §4.2), commit = the rings from the session's recorded target
 * features of the committed positions (§4.1, §7.3 step 5), reset = drop ring entries past a
 * rollback.
 * Must not: touch the session's tokens or KV (it reads its features only), or apply sampling
 * transforms other than the temperature: q rows are softmax(l / tau), so the loop must not
 * filter the main side either when it uses them (dspark.md §7.4).
 * Invariant: the rings hold exactly the positions committed through ops->commit (and those it
 * catches up from the session's features before a draft). */
#include "runtime/dspark_drafter.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
    dsf_drafter base;     /* first: the interface's view */
    dsf_drafter_ops ops;  /* per drafter: block is the file's */
    dsf_dspark *d;
    dsf_dspark_seq *q;
    dsf_dspark_info di;
    float *rows;          /* [block + 1][feat_dim] features of a commit */
    bool own;             /* d was opened by dspark_drafter_open and is closed with the drafter */
} dspark_drafter;

/* Commits [p0, p1) from the session's features, block + 1 rows per draft-side call. */
static int commit_range(dspark_drafter *x, dsf_session *s, int p0, int p1, char *err) {
    const int64_t fd = x->di.feat_dim, cap = x->di.block + 1;
    for (int p = p0; p < p1;) {
        int n = p1 - p < cap ? p1 - p : (int)cap;
        for (int i = 0; i < n; i++) {
            const float *f = dsf_session_feature(s, p + i);
            if (!f) return dsf_seterr(err, "draft: no target feature recorded for position %d (features on since the "
                                           "drafter was made; the ring keeps the recent positions only)", p + i);
            memcpy(x->rows + i * fd, f, (size_t)fd * sizeof(float));
        }
        dspark_seq_commit(x->q, x->rows, p, n);
        p += n;
    }
    return 0;
}

static int dd_commit(dsf_drafter *base, dsf_session *s, int p0, int p1, char *err) {
    dspark_drafter *x = (dspark_drafter *)base;
    if (p0 < 0 || p1 < p0 || p1 > dsf_session_n_past(s))
        return dsf_seterr(err, "draft: commit of positions [%d, %d) outside the session's %d", p0, p1, dsf_session_n_past(s));
    int64_t lo, hi;
    dspark_seq_range(x->q, &lo, &hi);
    if (p0 > hi) p0 = (int)hi; /* positions skipped since: catch up from the features */
    return commit_range(x, s, p0, p1, err);
}

static int dd_propose(dsf_drafter *base, dsf_session *s, int32_t anchor, int n, float tau, uint64_t *rng, int32_t *ids,
                      float *q, float *conf, char *err) {
    dspark_drafter *x = (dspark_drafter *)base;
    const int p = dsf_session_n_past(s) - 1;
    if (p < 0) return dsf_seterr(err, "draft: the session holds no committed position");
    if (n > x->di.block) n = x->di.block;
    /* the verification consumes the anchor and the drafts at p+1..p+n+1 */
    const int room = dsf_session_max_ctx(s) - (p + 2);
    if (n > room) n = room;
    if (n <= 0) return 0;
    /* the rings must hold max(0, p - W + 1)..p: catch up (or rebuild after a rollback) from the
     * session's features */
    int64_t lo, hi;
    dspark_seq_range(x->q, &lo, &hi);
    const int need = p - x->di.window + 1 > 0 ? p - x->di.window + 1 : 0;
    if (hi != p + 1 || lo > need) {
        const int from = lo <= need && hi <= p + 1 ? (int)hi : need;
        if (commit_range(x, s, from, p + 1, err)) return -1;
    }
    const float t = tau > 0.0f ? tau : 0.0f;
    int got = dspark_draft(x->q, p, anchor, n, t, rng, ids, NULL, t > 0.0f ? q : NULL, conf, err);
    return got;
}

static void dd_reset(dsf_drafter *base, int n_past) {
    dspark_drafter *x = (dspark_drafter *)base;
    if (x->q) dspark_seq_reset(x->q, n_past);
}

static void dd_free(dsf_drafter *base) {
    dspark_drafter *x = (dspark_drafter *)base;
    if (!x) return;
    dspark_seq_free(x->q);
    free(x->rows);
    if (x->own) dspark_close(x->d);
    free(x);
}

/* The sequence state for session s: its target features on, the draft's per-sequence rings. */
static int dd_bind(dsf_drafter *base, dsf_session *s, char *err) {
    dspark_drafter *x = (dspark_drafter *)base;
    if (x->q) return dsf_seterr(err, "the DSpark drafter is already bound to a session");
    if (dsf_session_set_features(s, x->di.targets, x->di.n_targets, err)) return -1;
    return (x->q = dspark_seq_new(x->d, err)) ? 0 : -1;
}

static dspark_drafter *dd_alloc(dsf_dspark *d) {
    dspark_drafter *x = dsf_xcalloc(1, sizeof *x);
    x->d = d;
    dspark_info(d, &x->di);
    x->rows = dsf_xmalloc((size_t)((x->di.block + 1) * x->di.feat_dim) * sizeof(float));
    x->ops = (dsf_drafter_ops){.propose = dd_propose, .commit = dd_commit, .reset = dd_reset, .free = dd_free,
                               .block = x->di.block, .bind = dd_bind};
    x->base.ops = &x->ops;
    return x;
}

dsf_drafter *dspark_drafter_new(dsf_dspark *d, dsf_session *s, char *err) {
    dspark_drafter *x = dd_alloc(d);
    if (dd_bind(&x->base, s, err)) {
        dd_free(&x->base);
        return NULL;
    }
    return &x->base;
}

dsf_drafter *dspark_drafter_open(dsf_engine *e, const char *path, char *err) {
    dsf_dspark *d = dspark_open(path, e, err);
    if (!d) return NULL;
    dspark_drafter *x = dd_alloc(d);
    x->own = true;
    return &x->base;
}
