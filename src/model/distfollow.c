/* distfollow.c: a follower rank of an MPI job (dist.h): it receives rank 0's ops in order and
 * makes the same public session calls on its part of the state (new, free, eval with the
 * span rows where it embeds, batched eval, rollback, its part of a snapshot, its counters).
 * Its sessions are rank 0's by id. A failure (an op it cannot run, a comm failure) ends the
 * process with the message and the rank named; rank 0 and mpirun see it.
 * Must not: send ops (distops.c) or decide anything rank 0 did not ask. */
#include "model/dist.h"
#include "model/session.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int dist_follow(dsf_engine *e) {
    char err[DSF_ERR_LEN];
    for (;;) {
        op_head h;
        if (comm_recv(0, COMM_TAG_OP, &h, sizeof h, true, err) < 0) die(err);
        if (h.magic != DIST_OP_MAGIC || h.len > DIST_MAX_PAYLOAD) die("rank 0 sent a malformed op");
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
            return 0;
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
            r.rss = dist_vm_rss();
            if (comm_send(0, COMM_TAG_REPLY, &r, sizeof r, err) < 0) die(err);
            if (h.a) comm_stats_reset();
            break;
        }
        default: die("rank 0 sent an unknown op");
        }
        free(p);
    }
}
