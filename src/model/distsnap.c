/* distsnap.c: the public dsf_session_save / dsf_session_restore, and a split session's
 * snapshots (dist.h). With one stage every rank holds the whole state, and rank 0's snapshot
 * is the single-process one (restore sends it to every rank); with several, the container
 * holds each stage leader's part (the layers that stage holds) and restore sends each stage
 * its part, after checking every part.
 * Must not: know the layout of a part (snapshot.c writes and checks it). */
#include "model/dist.h"
#include "model/session.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SNAPD_MAGIC "DSFSNAPD"

static int dist_save(const dsf_session *s, uint8_t **out, size_t *len, char *err);
static int dist_restore(dsf_session *s, const uint8_t *data, size_t len, char *err);

int dsf_session_save(const dsf_session *s, uint8_t **out, size_t *len, char *err) {
    return s->e->dist ? dist_save(s, out, len, err) : session_save_local(s, out, len, err);
}

int dsf_session_restore(dsf_session *s, const uint8_t *data, size_t len, char *err) {
    return s->e->dist ? dist_restore(s, data, len, err) : session_restore_local(s, data, len, err);
}

typedef struct {
    char magic[8];
    uint32_t version, n_parts;
    uint64_t signature;
} snapd_head;

static int dist_save(const dsf_session *s, uint8_t **out, size_t *len, char *err) {
    const dsf_engine *e = s->e;
    const dist_plan *d = e->dist;
    if (d->n_stages == 1 || !dist_root(e)) return session_save_local(s, out, len, err);
    op_head h = {0, OP_SAVE, s->dist_id, 0, 0, 0};
    if (dist_send_all(e, h, NULL, err) < 0) return -1;
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
                         : comm_recv_blob(d->first[st], COMM_TAG_REPLY, &part, &n, DIST_MAX_PAYLOAD, false, err);
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

static int dist_restore(dsf_session *s, const uint8_t *data, size_t len, char *err) {
    dsf_engine *e = s->e;
    const dist_plan *d = e->dist;
    if (!dist_root(e)) return session_restore_local(s, data, len, err);
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
        rc = dist_send_op(e, h, part, d->first[st], d->first[st + 1], err);
    }
    if (rc == 0) rc = dist_replies(e, err);
    if (rc < 0) { /* a follower refused its part: no rank keeps a mixed state */
        char keep[DSF_ERR_LEN];
        snprintf(keep, sizeof keep, "%s", err);
        dsf_session_rollback(s, 0, err);
        return dsf_seterr(err, "%s (the session was emptied)", keep);
    }
    return 0;
}

