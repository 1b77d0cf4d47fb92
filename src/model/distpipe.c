/* distpipe.c: forward_tokens on an engine spread over stages (dist.h).
 *
 * Stage 0 embeds; each stage runs its layers and its leader sends the stream to every member
 * of the next stage with what crosses the cut (dist_cut: the crossing KV sources' new
 * compressed rows and index keys, which the receivers keep in their mirror of those rows; the
 * top-k and candidate lists the next layers reuse); the last stage's leader computes the head
 * and sends the logits to rank 0. A send does not wait for the receiver: rank 0 goes on with
 * the next chunk of a prefill while the later stages work on this one. A batch of several
 * sequences (batched decode) goes through whole, or in micro-batches on request (below).
 * Must not: change a value (the stages run forward.c's steps on the same inputs). */
#include "model/dist.h"
#include "model/forward.h"
#include "model/engram.h"
#include "model/engram_io.h"
#include "base/util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_MAGIC 0x4d525453u /* "STRM" */
#define RING 4                   /* sends in flight per rank */

typedef struct {
    uint32_t magic, T, want, pad;
    int64_t row0;
} stream_head;

/* Outgoing buffers: slot k is reused once its sends have completed. */
static struct {
    dsf_buf buf[RING];
    comm_req req[RING][COMM_MAX_RANKS];
    int nreq[RING];
    int next;
} R;

static int ring_take(char *err) {
    const int k = R.next;
    R.next = (R.next + 1) % RING;
    int rc = 0;
    for (int i = 0; i < R.nreq[k]; i++) rc |= comm_wait(&R.req[k][i], err);
    R.nreq[k] = 0;
    R.buf[k].len = 0;
    return rc < 0 ? -1 : k;
}

/* The compressed row j that token t emits at source il, or -1. */
static int64_t emitted_row(const fwd *f, int64_t il, int64_t t) {
    const int64_t r = f->sh->ratio[il], p = f->tpos[t];
    return (p + 1) % r == 0 ? (p + 1) / r - 1 : -1;
}

void dist_stream_pack(dsf_buf *b, const fwd *f, const dist_cut *cut, bool want, int64_t row0) {
    const dsf_shape *sh = f->sh;
    const dsf_scratch *sc = f->sc;
    const int64_t T = f->T, hc = sh->hc, D = sh->n_embd;
    stream_head h = {STREAM_MAGIC, (uint32_t)T, want, 0, row0};
    dsf_buf_append(b, &h, sizeof h);
    dsf_buf_append(b, sc->X, (size_t)(T * hc * D) * sizeof(float));
    dsf_buf_append(b, sc->pre, (size_t)(T * hc) * sizeof(float));
    for (int k = 0; k < cut->n_src; k++) {
        const int64_t il = cut->src[k];
        for (int64_t t = 0; t < T; t++) {
            const int64_t j = emitted_row(f, il, t);
            if (j < 0) continue;
            dsf_buf_append(b, kv_ckv(f->tkv[t], il, j), (size_t)f->tkv[t]->crow);
            dsf_buf_append(b, kv_ik(f->tkv[t], il, j), (size_t)f->tkv[t]->irow);
        }
    }
    if (cut->sel) {
        dsf_buf_append(b, sc->n_sel, (size_t)T * sizeof(int64_t));
        for (int64_t t = 0; t < T; t++) dsf_buf_append(b, sc->sel + t * sc->ksel, (size_t)sc->n_sel[t] * sizeof(int32_t));
    }
    if (cut->cand) {
        dsf_buf_append(b, sc->n_cand, (size_t)T * sizeof(int64_t));
        for (int64_t t = 0; t < T; t++) dsf_buf_append(b, sc->cand + t * sc->kcand, (size_t)sc->n_cand[t] * sizeof(int32_t));
    }
}

typedef struct {
    const uint8_t *p;
    size_t left;
    bool bad;
} rd;

static void take(rd *r, void *dst, size_t n) {
    if (r->bad || n > r->left) {
        r->bad = true;
        return;
    }
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
}

int dist_stream_unpack(const uint8_t *msg, size_t len, const fwd *f, const dist_cut *cut, bool *want, int64_t *row0,
                       char *err) {
    const dsf_shape *sh = f->sh;
    dsf_scratch *sc = f->sc;
    const int64_t T = f->T, hc = sh->hc, D = sh->n_embd;
    rd r = {msg, len, false};
    stream_head h = {0, 0, 0, 0, 0};
    take(&r, &h, sizeof h);
    if (r.bad || h.magic != STREAM_MAGIC || h.T != (uint32_t)T)
        return dsf_seterr(err, "the previous stage sent a stream for another chunk (%u tokens, want %lld)", h.T, (long long)T);
    *want = h.want != 0;
    *row0 = h.row0;
    take(&r, sc->X, (size_t)(T * hc * D) * sizeof(float));
    take(&r, sc->pre, (size_t)(T * hc) * sizeof(float));
    for (int k = 0; k < cut->n_src; k++) {
        const int64_t il = cut->src[k];
        for (int64_t t = 0; t < T; t++) {
            const int64_t j = emitted_row(f, il, t);
            if (j < 0) continue;
            take(&r, kv_ckv(f->tkv[t], il, j), (size_t)f->tkv[t]->crow);
            take(&r, kv_ik(f->tkv[t], il, j), (size_t)f->tkv[t]->irow);
        }
    }
    if (cut->sel) {
        take(&r, sc->n_sel, (size_t)T * sizeof(int64_t));
        for (int64_t t = 0; t < T && !r.bad; t++) {
            if (sc->n_sel[t] < 0 || sc->n_sel[t] > sc->ksel) r.bad = true;
            else take(&r, sc->sel + t * sc->ksel, (size_t)sc->n_sel[t] * sizeof(int32_t));
        }
    }
    if (cut->cand) {
        take(&r, sc->n_cand, (size_t)T * sizeof(int64_t));
        for (int64_t t = 0; t < T && !r.bad; t++) {
            if (sc->n_cand[t] < 0 || sc->n_cand[t] > sc->kcand) r.bad = true;
            else take(&r, sc->cand + t * sc->kcand, (size_t)sc->n_cand[t] * sizeof(int32_t));
        }
    }
    if (r.bad || r.left) return dsf_seterr(err, "the previous stage's stream message (%zu bytes) does not fit this chunk", len);
    return 0;
}

/* One micro-batch through this rank's stage. logits: rank 0's rows for this micro-batch. */
static int stage_run(const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T,
                     float *logits, int64_t row0, char *err) {
    const dist_plan *d = e->dist;
    const int S = d->n_stages, s = d->stage;
    const int64_t l0 = d->l0[s], l1 = d->l1[s], V = e->shape.n_vocab;
    fwd f;
    fwd_begin(&f, e, sc, tkv, tok, T);
    bool want = logits != NULL;
    if (s == 0) {
        if (e->shape.n_engram) engram_start(&f, l0, l1);
        fwd_embed(&f, tok);
    } else {
        if (e->shape.n_engram) engram_start(&f, l0, l1);
        uint8_t *msg;
        size_t len;
        const size_t most = sizeof(stream_head) + ((size_t)(T * e->shape.n_embd * e->shape.hc) + (size_t)(T * e->shape.hc)) * 4 +
                            (size_t)T * (size_t)(tkv[0]->crow + tkv[0]->irow) * DSF_MAX_LAYERS +
                            (size_t)T * (size_t)(sc->ksel + sc->kcand + 4) * 8;
        if (comm_recv_blob(d->first[s - 1], COMM_TAG_STREAM, &msg, &len, most, false, err) < 0) return -1;
        int rc = dist_stream_unpack(msg, len, &f, &d->cut[s], &want, &row0, err);
        free(msg);
        if (rc < 0) return -1;
    }
    for (int64_t il = l0; il < l1; il++) forward_layer(&f, il);
    fwd_commit(&f);
    if (d->member != 0) return 0; /* the leader sends for the stage */
    if (s < S - 1) {
        const int k = ring_take(err);
        if (k < 0) return -1;
        dist_stream_pack(&R.buf[k], &f, &d->cut[s + 1], want, row0);
        for (int p = d->first[s + 1]; p < d->first[s + 2]; p++)
            if (comm_isend_blob(p, COMM_TAG_STREAM, R.buf[k].data, R.buf[k].len, &R.req[k][R.nreq[k]++], err) < 0) return -1;
        return 0;
    }
    if (!want) return 0;
    if (d->rank == 0) {
        fwd_head(&f, row0, logits);
        return 0;
    }
    float *lg = malloc((size_t)(T - row0) * (size_t)V * sizeof(float));
    if (!lg) return dsf_seterr(err, "out of memory for %lld logits rows", (long long)(T - row0));
    fwd_head(&f, row0, lg);
    int rc = comm_send(0, COMM_TAG_LOGITS, lg, (size_t)(T - row0) * (size_t)V * sizeof(float), err);
    free(lg);
    return rc;
}

/* The fault tests' knob DSF_DIST_FAULT=RANK:N:SIG: rank RANK raises signal SIG (9 kills it,
 * 19 stops it) as its N-th forward begins. */
static void fault_knob(const dist_plan *d) {
    static long seen;
    const char *k = dsf_knob("DSF_DIST_FAULT");
    int rank, sig;
    long n;
    if (!k || sscanf(k, "%d:%ld:%d", &rank, &n, &sig) != 3 || rank != d->rank) return;
    if (++seen == n) raise(sig);
}

int dist_forward(const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T,
                 float *logits, int64_t logit_row0, char *err) {
    const dist_plan *d = e->dist;
    fault_knob(d);
    const int S = d->n_stages;
    const int64_t V = e->shape.n_vocab;
    dsf_kvstate **kv = dsf_xmalloc((size_t)T * sizeof *kv); /* tkv may be sc->tkv, which fwd_begin rewrites */
    memcpy(kv, tkv, (size_t)T * sizeof *kv);
    /* A batch of several sequences goes through the stages whole by default: split into
     * micro-batches (DSF_DIST_MICROBATCH=M, at most one per stage and sequence), the stages
     * overlap, but each micro-batch reads its stage's weights again, and decode is bound by
     * those reads: 2 ranks, bench model, 4 sequences: 6.42 tok/s in 2 micro-batches against
     * 8.99 whole; 32 sequences: 7.86 against 12.43 (docs/PERFORMANCE.md, MPI). A prefill chunk
     * is one sequence: a prefill's chunks pipeline instead. */
    int64_t cut[DIST_MAX_STAGES + 1];
    int nmb = 1;
    cut[0] = 0;
    int64_t nseq = 1;
    for (int64_t t = 1; t < T; t++) nseq += kv[t] != kv[t - 1];
    const char *mk = dsf_knob("DSF_DIST_MICROBATCH");
    const int64_t ask = mk && atoi(mk) > 1 ? atoi(mk) : 1, most = nseq < S ? nseq : S;
    const int want_mb = (int)(ask < most ? ask : most);
    for (int m = 1; m < want_mb; m++) {
        int64_t c = T * m / want_mb;
        while (c < T && c > cut[nmb - 1] && kv[c] == kv[c - 1]) c++;
        if (c > cut[nmb - 1] && c < T) cut[nmb++] = c;
    }
    cut[nmb] = T;
    /* an Engram read error does not stop the chunk (the other ranks run it through): it is
     * reported at the end, as forward_tokens does */
    int rc = 0;
    char e1[DSF_ERR_LEN] = "", eram[DSF_ERR_LEN] = "";
    for (int m = 0; m < nmb && rc == 0; m++) {
        const int64_t a = cut[m], n = cut[m + 1] - a;
        const int64_t r0 = logit_row0 > a ? logit_row0 - a : 0;
        float *lg = logits && r0 < n ? logits + (a + r0 - logit_row0) * V : NULL;
        rc = stage_run(e, sc, kv + a, tok + a, n, lg, lg ? r0 : 0, err);
        if (rc == 0 && sc->ereq && engram_req_take_error(sc->ereq, e1) < 0 && !eram[0]) snprintf(eram, sizeof eram, "%s", e1);
    }
    /* rank 0 collects the logits of every micro-batch from the last stage's leader */
    const int head = d->first[S - 1];
    if (rc == 0 && logits && d->rank == 0 && head != 0)
        for (int m = 0; m < nmb && rc == 0; m++) {
            const int64_t a = cut[m], n = cut[m + 1] - a;
            const int64_t r0 = logit_row0 > a ? logit_row0 - a : 0;
            if (r0 >= n) continue;
            rc = comm_recv(head, COMM_TAG_LOGITS, logits + (a + r0 - logit_row0) * V, (size_t)(n - r0) * (size_t)V * sizeof(float),
                           false, err);
        }
    free(kv);
    if (rc == 0 && comm_failed()) rc = dsf_seterr(err, "%s", comm_failure());
    if (rc == 0 && eram[0]) rc = dsf_seterr(err, "%s", eram);
    return rc;
}
