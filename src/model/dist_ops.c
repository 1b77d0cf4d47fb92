/* dist_ops.c: rank 0's session calls, mirrored on the other ranks of an MPI job (dist.h).
 *
 * Rank 0 runs the program (the CLI, the server); before a public session call changes state
 * it sends the call as an op (a header, then its payload) to every other rank, whose
 * dist_follow loop makes the same call on its part of the state. The forward's own messages
 * (dist_pipe.c, dist_moe.c) then flow between the ranks as the call runs on each. A follower
 * that fails ends the job (its message names it); rank 0 sees the failure at its next wait.
 *
 * Snapshots: with one stage every rank holds the whole state, and rank 0's snapshot is the
 * single-process one; with several, the container holds each stage leader's part (the
 * layers that stage holds) and restore sends each stage its part.
 * Must not: know the forward's arithmetic or the snapshot's layout (snapshot.c). */
#include "model/dist.h"
#include "model/session.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OP_MAGIC 0x5053464fu /* "OFSP" */
#define SNAPD_MAGIC "DSFSNAPD"
#define MAX_PAYLOAD ((size_t)1 << 40)

enum { OP_QUIT = 1, OP_NEW, OP_FREE, OP_EVAL, OP_BATCH, OP_ROLLBACK, OP_SAVE, OP_RESTORE, OP_STATS };

typedef struct {
    uint32_t magic, op;
    uint64_t sid;
    int64_t a, b;
    uint64_t len;
} op_head;

typedef struct {
    int32_t status;
    char err[DSF_ERR_LEN];
} op_reply;

static bool g_quit_sent;

static bool root(const dsf_engine *e) { return e->dist && e->dist->rank == 0 && e->dist->size > 1; }

/* Sends op h with its payload to the ranks [r0, r1) (all followers: 1, size). */
static int send_op(const dsf_engine *e, op_head h, const void *payload, int r0, int r1, char *err) {
    h.magic = OP_MAGIC;
    for (int p = r0; p < r1; p++) {
        if (p == 0) continue;
        if (comm_send(p, COMM_TAG_OP, &h, sizeof h, err) < 0) return -1;
        if (h.len && comm_send(p, COMM_TAG_OP, payload, (size_t)h.len, err) < 0) return -1;
    }
    (void)e;
    return 0;
}

static int send_all(const dsf_engine *e, op_head h, const void *payload, char *err) {
    return send_op(e, h, payload, 1, e->dist->size, err);
}

/* Every follower's reply: the first failure, named, into err. */
static int replies(const dsf_engine *e, char *err) {
    int rc = 0;
    for (int p = 1; p < e->dist->size; p++) {
        op_reply r;
        if (comm_recv(p, COMM_TAG_REPLY, &r, sizeof r, false, err) < 0) return -1;
        r.err[DSF_ERR_LEN - 1] = 0;
        if (r.status < 0 && rc == 0) rc = dsf_seterr(err, "rank %d (host %s): %s", p, comm_host(p), r.err);
    }
    return rc;
}

int dist_op_new(dsf_session *s, int max_ctx, char *err) {
    dsf_engine *e = s->e;
    if (!root(e)) return 0;
    s->dist_id = e->dist->next_sid++;
    op_head h = {0, OP_NEW, s->dist_id, max_ctx, s->sc.max_chunk, 0};
    if (send_all(e, h, NULL, err) < 0) return -1;
    if (replies(e, err) < 0) {
        dist_op_free(s);
        return -1;
    }
    return 0;
}

void dist_op_free(dsf_session *s) {
    if (!root(s->e) || !s->dist_id || comm_failed()) return;
    op_head h = {0, OP_FREE, s->dist_id, 0, 0, 0};
    send_all(s->e, h, NULL, NULL);
}

int dist_op_eval(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, char *err) {
    dsf_engine *e = s->e;
    if (!root(e)) return 0;
    const int64_t D = e->shape.n_embd;
    int64_t nspan = 0;
    const bool media = m && m->types;
    for (int i = 0; media && i < n; i++) nspan += m->types[i] >= 0;
    /* tokens; with media: types, keys, then (stage 0 only) the span rows */
    dsf_buf b = {0};
    dsf_buf_append(&b, tokens, (size_t)n * sizeof(int32_t));
    if (media) {
        dsf_buf_append(&b, m->types, (size_t)n);
        for (int i = 0; i < n; i++) {
            uint64_t k = m->keys ? m->keys[i] : 0;
            dsf_buf_append(&b, &k, sizeof k);
        }
    }
    const size_t base = b.len;
    if (media && nspan) dsf_buf_append(&b, m->embd, (size_t)(nspan * D) * sizeof(float));
    const dist_plan *d = e->dist;
    op_head h = {0, OP_EVAL, s->dist_id, n, media, b.len};
    int rc = send_op(e, h, b.data, 1, d->first[1], err); /* stage 0 gets the rows */
    h.len = base;
    if (rc == 0) rc = send_op(e, h, b.data, d->first[1], d->size, err);
    dsf_buf_free(&b);
    return rc;
}

int dist_op_batch(dsf_session **ss, const int32_t *tokens, int n, char *err) {
    dsf_engine *e = ss[0]->e;
    if (!root(e)) return 0;
    dsf_buf b = {0};
    for (int i = 0; i < n; i++) dsf_buf_append(&b, &ss[i]->dist_id, sizeof(uint64_t));
    dsf_buf_append(&b, tokens, (size_t)n * sizeof(int32_t));
    op_head h = {0, OP_BATCH, 0, n, 0, b.len};
    int rc = send_all(e, h, b.data, err);
    dsf_buf_free(&b);
    return rc;
}

int dist_op_rollback(dsf_session *s, int n, char *err) {
    if (!root(s->e)) return 0;
    op_head h = {0, OP_ROLLBACK, s->dist_id, n, 0, 0};
    return send_all(s->e, h, NULL, err);
}

void dist_op_quit(dsf_engine *e) {
    if (!root(e) || g_quit_sent) return;
    g_quit_sent = true;
    if (!comm_failed()) {
        op_head h = {0, OP_QUIT, 0, 0, 0, 0};
        send_all(e, h, NULL, NULL);
    }
    comm_finish();
}

/* ---- snapshots ------------------------------------------------------------------------ */

typedef struct {
    char magic[8];
    uint32_t version, n_parts;
    uint64_t signature;
} snapd_head;

int dist_save(const dsf_session *s, uint8_t **out, size_t *len, char *err) {
    const dsf_engine *e = s->e;
    const dist_plan *d = e->dist;
    if (d->n_stages == 1 || !root(e)) return session_save_local(s, out, len, err);
    op_head h = {0, OP_SAVE, s->dist_id, 0, 0, 0};
    if (send_all(e, h, NULL, err) < 0) return -1;
    dsf_buf b = {0};
    snapd_head sh;
    memset(&sh, 0, sizeof sh);
    memcpy(sh.magic, SNAPD_MAGIC, 8);
    sh.version = 1, sh.n_parts = (uint32_t)d->n_stages, sh.signature = d->signature;
    dsf_buf_append(&b, &sh, sizeof sh);
    for (int st = 0; st < d->n_stages; st++) {
        uint8_t *part;
        size_t n;
        int rc = st == 0 ? session_save_local(s, &part, &n, err)
                         : comm_recv_blob(d->first[st], COMM_TAG_REPLY, &part, &n, MAX_PAYLOAD, false, err);
        if (rc < 0) {
            dsf_buf_free(&b);
            return -1;
        }
        uint64_t n64 = n;
        dsf_buf_append(&b, &n64, sizeof n64);
        dsf_buf_append(&b, part, n);
        free(part);
    }
    *out = b.data;
    *len = b.len;
    return 0;
}

/* Part st of a container, checked against this plan. */
static int find_part(const dist_plan *d, const uint8_t *data, size_t len, int st, const uint8_t **part, size_t *n,
                     char *err) {
    snapd_head sh;
    if (len < sizeof sh) return dsf_seterr(err, "snapshot truncated (%zu bytes)", len);
    memcpy(&sh, data, sizeof sh);
    if (memcmp(sh.magic, SNAPD_MAGIC, 8) != 0)
        return dsf_seterr(err, "not a snapshot of a pipeline-parallel session (it was made by a single process or "
                               "--parallel experts)");
    if (sh.version != 1 || sh.n_parts != (uint32_t)d->n_stages || sh.signature != d->signature)
        return dsf_seterr(err, "the snapshot was made with another split of the layers over the ranks (%u stages)",
                          sh.n_parts);
    size_t off = sizeof sh;
    for (int k = 0; k <= st; k++) {
        uint64_t n64;
        if (len - off < sizeof n64) return dsf_seterr(err, "snapshot truncated in part %d", k);
        memcpy(&n64, data + off, sizeof n64);
        off += sizeof n64;
        if (n64 > len - off) return dsf_seterr(err, "snapshot truncated in part %d", k);
        *part = data + off, *n = (size_t)n64;
        off += (size_t)n64;
    }
    return 0;
}

int dist_restore(dsf_session *s, const uint8_t *data, size_t len, char *err) {
    dsf_engine *e = s->e;
    const dist_plan *d = e->dist;
    if (!root(e)) return session_restore_local(s, data, len, err);
    const uint8_t *part = data;
    size_t n = len;
    if (d->n_stages > 1 && find_part(d, data, len, 0, &part, &n, err) < 0) return -1;
    if (d->n_stages > 1) { /* every part is checked before any rank changes its state */
        const uint8_t *p2;
        size_t n2;
        if (find_part(d, data, len, d->n_stages - 1, &p2, &n2, err) < 0) return -1;
    }
    if (session_restore_local(s, part, n, err) < 0) return -1;
    int rc = 0;
    for (int st = 0; st < d->n_stages && rc == 0; st++) {
        if (d->n_stages > 1) find_part(d, data, len, st, &part, &n, err);
        op_head h = {0, OP_RESTORE, s->dist_id, 0, 0, n};
        rc = send_op(e, h, part, d->first[st], d->first[st + 1], err);
    }
    if (rc == 0) rc = replies(e, err);
    if (rc < 0) { /* a follower refused its part: no rank keeps a mixed state */
        char keep[DSF_ERR_LEN];
        snprintf(keep, sizeof keep, "%s", err);
        dsf_session_rollback(s, 0, err);
        return dsf_seterr(err, "%s (the session was emptied)", keep);
    }
    return 0;
}

/* ---- statistics --------------------------------------------------------------------- */

/* A follower's answer to OP_STATS. */
typedef struct {
    comm_stats st;
    uint64_t rss;
} stats_reply;

/* This process's VmRSS in bytes (0 unknown). */
static uint64_t vm_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib << 10;
}

int dsf_dist_stats(dsf_engine *e, dsf_dist_rank_stats *out, int max, char *err) {
    if (!e->dist) return 0;
    const int N = e->dist->size < max ? e->dist->size : max;
    comm_stats st;
    comm_stats_get(&st);
    out[0] = (dsf_dist_rank_stats){st.bytes_sent, st.msgs_sent, st.bytes_recv, st.msgs_recv, st.wait_s, vm_rss()};
    if (!root(e)) return 1;
    op_head h = {0, OP_STATS, 0, 0, 0, 0};
    if (send_all(e, h, NULL, err) < 0) return -1;
    for (int p = 1; p < e->dist->size; p++) {
        stats_reply r;
        if (comm_recv(p, COMM_TAG_REPLY, &r, sizeof r, false, err) < 0) return -1;
        if (p < N)
            out[p] = (dsf_dist_rank_stats){r.st.bytes_sent, r.st.msgs_sent, r.st.bytes_recv, r.st.msgs_recv, r.st.wait_s, r.rss};
    }
    return N;
}

/* Every rank resets after the reset's own messages, so that they count in no phase. */
void dsf_dist_stats_reset(dsf_engine *e) {
    if (!e->dist) return;
    if (root(e)) {
        op_head h = {0, OP_STATS, 0, 1, 0, 0};
        send_all(e, h, NULL, NULL);
        for (int p = 1; p < e->dist->size; p++) {
            stats_reply r;
            comm_recv(p, COMM_TAG_REPLY, &r, sizeof r, false, NULL);
        }
    }
    comm_stats_reset();
}

/* ---- the followers ------------------------------------------------------------------ */

typedef struct {
    uint64_t sid;
    dsf_session *s;
} sess_slot;

static struct {
    sess_slot *v;
    int n, cap;
} T;

static dsf_session *find(uint64_t sid) {
    for (int i = 0; i < T.n; i++)
        if (T.v[i].sid == sid) return T.v[i].s;
    return NULL;
}

_Noreturn static void die(const char *what) {
    dsf_log(0, "dsflash: rank %d (host %s): %s", comm_rank(), comm_host(comm_rank()), what);
    comm_exit(1, true);
}

static void reply(int status, const char *msg) {
    op_reply r;
    memset(&r, 0, sizeof r);
    r.status = status;
    snprintf(r.err, sizeof r.err, "%s", msg ? msg : "");
    char err[DSF_ERR_LEN];
    if (comm_send(0, COMM_TAG_REPLY, &r, sizeof r, err) < 0) die(err);
}

/* Payload bytes [*off, *off + n), or NULL when the payload is shorter. */
static const uint8_t *field(const uint8_t *p, size_t len, size_t *off, size_t n) {
    if (*off > len || n > len - *off) return NULL;
    const uint8_t *q = p + *off;
    *off += n;
    return q;
}

int dist_parse_eval(const uint8_t *p, size_t len, int64_t n, bool media, int64_t n_embd, dist_eval_msg *out, char *err) {
    memset(out, 0, sizeof *out);
    if (n < 1 || n > INT32_MAX / 8) return dsf_seterr(err, "op: an eval of %lld tokens", (long long)n);
    size_t off = 0;
    const uint8_t *tok = field(p, len, &off, (size_t)n * sizeof(int32_t));
    if (!tok) return dsf_seterr(err, "op: an eval payload of %zu bytes cannot hold %lld tokens", len, (long long)n);
    out->n = (int)n;
    out->tokens = dsf_xmalloc((size_t)n * sizeof(int32_t));
    memcpy(out->tokens, tok, (size_t)n * sizeof(int32_t));
    if (media) {
        const uint8_t *ty = field(p, len, &off, (size_t)n), *ky = field(p, len, &off, (size_t)n * sizeof(uint64_t));
        if (!ty || !ky) {
            dist_eval_msg_free(out);
            return dsf_seterr(err, "op: an eval payload of %zu bytes cannot hold %lld tokens' types and keys", len, (long long)n);
        }
        out->types = dsf_xmalloc((size_t)n);
        out->keys = dsf_xmalloc((size_t)n * sizeof(uint64_t));
        memcpy(out->types, ty, (size_t)n);
        memcpy(out->keys, ky, (size_t)n * sizeof(uint64_t));
        int64_t nspan = 0;
        for (int64_t i = 0; i < n; i++) nspan += out->types[i] >= 0;
        const size_t rows = (size_t)nspan * (size_t)n_embd * sizeof(float);
        /* stages after the first get no rows (they do not embed): zeros stand in */
        out->embd = dsf_xcalloc(rows ? rows : 1, 1);
        if (len - off == rows && rows) memcpy(out->embd, field(p, len, &off, rows), rows);
    }
    if (off != len) {
        dist_eval_msg_free(out);
        return dsf_seterr(err, "op: an eval payload of %zu bytes for %lld tokens has %zu bytes too many", len, (long long)n,
                          len - off);
    }
    return 0;
}

void dist_eval_msg_free(dist_eval_msg *m) {
    free(m->tokens), free(m->types), free(m->keys), free(m->embd);
    memset(m, 0, sizeof *m);
}

int dist_parse_batch(const uint8_t *p, size_t len, int64_t n, uint64_t **sids, int32_t **tokens, char *err) {
    *sids = NULL, *tokens = NULL;
    if (n < 1 || n > INT32_MAX / 16) return dsf_seterr(err, "op: a batch of %lld entries", (long long)n);
    if (len != (size_t)n * (sizeof(uint64_t) + sizeof(int32_t)))
        return dsf_seterr(err, "op: a batch payload of %zu bytes for %lld entries", len, (long long)n);
    *sids = dsf_xmalloc((size_t)n * sizeof(uint64_t));
    *tokens = dsf_xmalloc((size_t)n * sizeof(int32_t));
    memcpy(*sids, p, (size_t)n * sizeof(uint64_t));
    memcpy(*tokens, p + (size_t)n * sizeof(uint64_t), (size_t)n * sizeof(int32_t));
    return 0;
}

static void do_eval(dsf_engine *e, const op_head *h, const uint8_t *p, size_t len) {
    dsf_session *s = find(h->sid);
    char err[DSF_ERR_LEN];
    if (!s) die("rank 0 sent an eval for an unknown session");
    dist_eval_msg m;
    if (dist_parse_eval(p, len, h->a, h->b != 0, e->shape.n_embd, &m, err) < 0) die(err);
    dsf_media md = {m.types, m.embd, m.keys};
    if (dsf_session_eval_media(s, m.tokens, m.types ? &md : NULL, m.n, NULL, false, err) < 0) die(err);
    dist_eval_msg_free(&m);
}

static void do_batch(const op_head *h, const uint8_t *p, size_t len) {
    char err[DSF_ERR_LEN];
    uint64_t *sids;
    int32_t *tok;
    if (dist_parse_batch(p, len, h->a, &sids, &tok, err) < 0) die(err);
    const int n = (int)h->a;
    dsf_session **ss = dsf_xmalloc((size_t)n * sizeof *ss);
    for (int i = 0; i < n; i++)
        if (!(ss[i] = find(sids[i]))) die("rank 0 sent a batch with an unknown session");
    if (dsf_batch_eval(ss, tok, n, NULL, err) < 0) die(err);
    free(ss), free(tok), free(sids);
}

static void do_new(dsf_engine *e, const op_head *h) {
    char err[DSF_ERR_LEN];
    dsf_session *s = session_new(e, (int)h->a, h->b, err);
    if (!s) {
        reply(-1, err);
        return;
    }
    s->dist_id = h->sid;
    if (T.n == T.cap) T.v = dsf_xrealloc(T.v, (size_t)(T.cap = T.cap ? 2 * T.cap : 16) * sizeof *T.v);
    T.v[T.n++] = (sess_slot){h->sid, s};
    reply(0, NULL);
}

static void do_free(const op_head *h) {
    for (int i = 0; i < T.n; i++)
        if (T.v[i].sid == h->sid) {
            dsf_session_free(T.v[i].s);
            T.v[i] = T.v[--T.n];
            return;
        }
}

static void do_save(dsf_engine *e, const op_head *h) {
    dsf_session *s = find(h->sid);
    char err[DSF_ERR_LEN];
    if (!s) die("rank 0 asked to save an unknown session");
    if (e->dist->member != 0) return; /* the stage leader answers */
    uint8_t *b;
    size_t n;
    if (session_save_local(s, &b, &n, err) < 0) die(err);
    if (comm_send_blob(0, COMM_TAG_REPLY, b, n, err) < 0) die(err);
    free(b);
}

_Noreturn void dist_follow(dsf_engine *e) {
    char err[DSF_ERR_LEN];
    for (;;) {
        op_head h;
        if (comm_recv(0, COMM_TAG_OP, &h, sizeof h, true, err) < 0) die(err);
        if (h.magic != OP_MAGIC || h.len > MAX_PAYLOAD) die("rank 0 sent a malformed op");
        uint8_t *p = NULL;
        if (h.len) {
            p = malloc((size_t)h.len);
            if (!p) die("out of memory for an op's payload");
            if (comm_recv(0, COMM_TAG_OP, p, (size_t)h.len, false, err) < 0) die(err);
        }
        switch (h.op) {
        case OP_QUIT:
            free(p);
            for (int i = 0; i < T.n; i++) dsf_session_free(T.v[i].s);
            free(T.v);
            dsf_engine_close(e);
            comm_exit(0, false);
        case OP_NEW: do_new(e, &h); break;
        case OP_FREE: do_free(&h); break;
        case OP_EVAL: do_eval(e, &h, p, (size_t)h.len); break;
        case OP_BATCH: do_batch(&h, p, (size_t)h.len); break;
        case OP_ROLLBACK: {
            dsf_session *s = find(h.sid);
            if (!s || h.a < 0 || h.a > INT32_MAX) die("rank 0 sent a rollback for an unknown session");
            if (dsf_session_rollback(s, (int)h.a, err) < 0) die(err);
            break;
        }
        case OP_SAVE: do_save(e, &h); break;
        case OP_RESTORE: {
            dsf_session *s = find(h.sid);
            if (!s) die("rank 0 sent a restore for an unknown session");
            int rc = session_restore_local(s, p, (size_t)h.len, err);
            reply(rc, rc < 0 ? err : NULL);
            break;
        }
        case OP_STATS: {
            stats_reply r;
            memset(&r, 0, sizeof r);
            comm_stats_get(&r.st);
            r.rss = vm_rss();
            if (comm_send(0, COMM_TAG_REPLY, &r, sizeof r, err) < 0) die(err);
            if (h.a) comm_stats_reset();
            break;
        }
        default: die("rank 0 sent an unknown op");
        }
        free(p);
    }
}
