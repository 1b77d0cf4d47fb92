/* distops.c: rank 0's session calls, mirrored on the other ranks of an MPI job (dist.h).
 *
 * Rank 0 runs the program (the CLI, the server); before a public session call changes state
 * it sends the call as an op (a header, then its payload) to every other rank, whose
 * dist_follow loop makes the same call on its part of the state. The forward's own messages
 * (distpipe.c, distmoe.c) then flow between the ranks as the call runs on each. A follower
 * that fails ends the job (its message names it); rank 0 sees the failure at its next wait.
 *
 * Must not: know the forward's arithmetic or the snapshot's layout (snapshot.c). */
#include "model/dist.h"
#include "model/session.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool g_quit_sent;

bool dist_root(const dsf_engine *e) { return e->dist && e->dist->rank == 0 && e->dist->size > 1; }

/* Sends op h with its payload to the ranks [r0, r1) (all followers: 1, size). */
int dist_send_op(const dsf_engine *e, op_head h, const void *payload, int r0, int r1, char *err) {
    h.magic = DIST_OP_MAGIC;
    for (int p = r0; p < r1; p++) {
        if (p == 0) continue;
        if (comm_send(p, COMM_TAG_OP, &h, sizeof h, err) < 0) return -1;
        if (h.len && comm_send(p, COMM_TAG_OP, payload, (size_t)h.len, err) < 0) return -1;
    }
    (void)e;
    return 0;
}

int dist_send_all(const dsf_engine *e, op_head h, const void *payload, char *err) {
    return dist_send_op(e, h, payload, 1, e->dist->size, err);
}

/* Every follower's reply: the first failure, named, into err. */
int dist_replies(const dsf_engine *e, char *err) {
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
    if (!dist_root(e)) return 0;
    s->dist_id = e->dist->next_sid++;
    op_head h = {0, OP_NEW, s->dist_id, max_ctx, s->sc.max_chunk, 0};
    if (dist_send_all(e, h, NULL, err) < 0) return -1;
    if (dist_replies(e, err) < 0) {
        dist_op_free(s);
        return -1;
    }
    return 0;
}

void dist_op_free(dsf_session *s) {
    if (!dist_root(s->e) || !s->dist_id || comm_failed()) return;
    op_head h = {0, OP_FREE, s->dist_id, 0, 0, 0};
    dist_send_all(s->e, h, NULL, NULL);
}

int dist_op_eval(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, char *err) {
    dsf_engine *e = s->e;
    if (!dist_root(e)) return 0;
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
    int rc = dist_send_op(e, h, b.data, 1, d->first[1], err); /* stage 0 gets the rows */
    h.len = base;
    if (rc == 0) rc = dist_send_op(e, h, b.data, d->first[1], d->size, err);
    dsf_buf_free(&b);
    return rc;
}

int dist_op_batch(dsf_session **ss, const int32_t *tokens, int n, char *err) {
    dsf_engine *e = ss[0]->e;
    if (!dist_root(e)) return 0;
    dsf_buf b = {0};
    for (int i = 0; i < n; i++) dsf_buf_append(&b, &ss[i]->dist_id, sizeof(uint64_t));
    dsf_buf_append(&b, tokens, (size_t)n * sizeof(int32_t));
    op_head h = {0, OP_BATCH, 0, n, 0, b.len};
    int rc = dist_send_all(e, h, b.data, err);
    dsf_buf_free(&b);
    return rc;
}

int dist_op_rollback(dsf_session *s, int n, char *err) {
    if (!dist_root(s->e)) return 0;
    op_head h = {0, OP_ROLLBACK, s->dist_id, n, 0, 0};
    return dist_send_all(s->e, h, NULL, err);
}

void dist_op_quit(dsf_engine *e) {
    if (!dist_root(e) || g_quit_sent) return;
    g_quit_sent = true;
    if (!comm_failed()) {
        op_head h = {0, OP_QUIT, 0, 0, 0, 0};
        dist_send_all(e, h, NULL, NULL);
    }
    comm_finish();
}

/* ---- statistics --------------------------------------------------------------------- */

/* This process's VmRSS in bytes (0 unknown). */
uint64_t dist_vm_rss(void) {
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
    out[0] = (dsf_dist_rank_stats){st.bytes_sent, st.msgs_sent, st.bytes_recv, st.msgs_recv, st.wait_s, dist_vm_rss()};
    if (!dist_root(e)) return 1;
    op_head h = {0, OP_STATS, 0, 0, 0, 0};
    if (dist_send_all(e, h, NULL, err) < 0) return -1;
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
    if (dist_root(e)) {
        op_head h = {0, OP_STATS, 0, 1, 0, 0};
        dist_send_all(e, h, NULL, NULL);
        for (int p = 1; p < e->dist->size; p++) {
            stats_reply r;
            comm_recv(p, COMM_TAG_REPLY, &r, sizeof r, false, NULL);
        }
    }
    comm_stats_reset();
}

