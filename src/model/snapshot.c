/* snapshot.c: versioned session snapshots (dsflash.h: dsf_session_save/restore) and the two
 * ids that tie a snapshot to its model (the header hash and the sampled weight bytes), also
 * offered combined with the numerics mode as dsf_engine_state_id (the prefix cache's key).
 *
 * Owns: the snapshot format (a header, the token history with its image spans, the window
 * rows the next token can see, the KV sources' compressed rows, index keys and pending compressor token, an FNV-1a
 * checksum) and its version. Rows are saved as the session stores them (packed or fp32,
 * session.h; the header's kv_format), so a snapshot is as small as the state.
 * Must not: leave a session half restored (the whole layout is checked before anything is
 * overwritten), or accept a snapshot of another model, shape or numerics mode.
 * Invariant: restore(save(s)) continues with the same logits as s. */
#include "dsflash.h"
#include "model/session.h"
#include "model/snapshot.h"
#include "model/dist.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}
#define FNV_INIT 14695981039346656037ULL

uint64_t snapshot_model_id(const gguf_file *g) { return fnv1a(FNV_INIT, g->map, (size_t)g->data_offset); }

/* Identifies the weights, not only the header: two files with the same keys and tensor
 * table but other weights must not accept each other's snapshots. Samples 3 x 64 bytes of
 * every tensor (start, middle, end), so it touches a few pages per tensor, once. */
static uint64_t data_id(dsf_engine *e) {
    uint64_t id = __atomic_load_n(&e->data_id, __ATOMIC_ACQUIRE);
    if (id) return id;
    uint64_t h = FNV_INIT;
    const gguf_file *g = e->gguf;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        uint64_t n = t->nbytes < 64 ? t->nbytes : 64;
        uint64_t offs[3] = {0, t->nbytes / 2 - (t->nbytes / 2 < n ? t->nbytes / 2 : n / 2), t->nbytes - n};
        for (int k = 0; k < 3; k++) h = fnv1a(h, t->data + offs[k], (size_t)n);
    }
    if (!h) h = 1;
    __atomic_store_n(&e->data_id, h, __ATOMIC_RELEASE);
    return h;
}

#define SNAP_MAGIC "DSFSNAP\0"
/* 4: the KV rows are stored as the session holds them (packed in reference numerics, spec
 * §5.1), and the header says which (kv_format) */
#define SNAP_VERSION 5u
/* 5: after the token ids, the image spans (vision.md §5-§8): u64 n_span, then when n_span > 0
 * the types (token type + 1, 0 text) [n] u8, the keys [n] u64 and the span rows [n_span][n_embd]
 * f32 (a rollback's re-prefill needs them). A version 4 snapshot (no spans) restores as all
 * text. */
#define SNAP_VERSION_TEXT 4u
/* The header's numerics field: the numerics mode, plus SNAP_Q8K when the engine runs the Q8_K
 * activation mode (its products differ, so its state is not the exact mode's). Snapshots of the
 * exact modes keep the values 0 and 1 they always had. */
#define SNAP_Q8K 0x100u
static uint32_t snap_mode(const dsf_engine *e) { return (uint32_t)e->numerics | (e->act_q8k ? SNAP_Q8K : 0u); }

uint64_t dsf_engine_state_id(dsf_engine *e) {
    uint64_t h = fnv1a(FNV_INIT, &e->model_id, sizeof e->model_id);
    uint64_t d = data_id(e), m = snap_mode(e);
    h = fnv1a(h, &d, sizeof d);
    h = fnv1a(h, &m, sizeof m);
    if (e->dist && e->dist->n_stages > 1) h = fnv1a(h, &e->dist->signature, sizeof e->dist->signature); /* parts of a split */
    return h ? h : 1;
}

/* Which layers a snapshot holds: 0 for all (one process, or one MPI stage); otherwise the
 * split's signature with this rank's stage (model/dist.h), never 0. */
static uint32_t held_id(const dsf_session *s) {
    const dist_plan *d = s->e->dist;
    if (!d || d->n_stages == 1) return 0;
    uint32_t id = (uint32_t)(d->signature ^ (d->signature >> 32)) + (uint32_t)d->stage * 0x9e3779b9u;
    return id ? id : 1;
}

typedef struct {
    char magic[8];
    uint32_t version, numerics;
    uint64_t model_id, data_id, n, n_layer, head_dim, idx_dim;
    uint32_t kv_format, held; /* kv_format: 1 packed rows, 0 fp32 rows; held: held_id */
} snap_header;

/* The bytes of the rows a snapshot of n tokens holds (everything after the token ids). */
static uint64_t rows_bytes(const dsf_shape *sh, const dsf_kvstate *kv, int64_t n) {
    const int64_t nw = n < sh->window ? n : sh->window;
    uint64_t b = 0;
    for (int64_t il = 0; il < sh->n_layer; il++)
        if (kv->win[il]) b += (uint64_t)nw * (uint64_t)kv->wrow;
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (sh->kv_src[il] != il || !kv->ckv[il]) continue;
        b += (uint64_t)(n / sh->ratio[il]) * (uint64_t)(kv->crow + kv->irow);
        if (kv->carry[il] && sh->ratio[il] > 1 && n % sh->ratio[il]) b += (uint64_t)(2 * sh->head_dim) * sizeof(float);
    }
    return b;
}

/* Packed rows (after the token ids at p) that no QDQ of finite values stores: the first one
 * named in err, -1; 0 when all are valid. */
static int check_packed(const dsf_shape *sh, const dsf_kvstate *kv, const uint8_t *p, int64_t n, char *err) {
    const int64_t dh = sh->head_dim, id = sh->idx_dim, nw = n < sh->window ? n : sh->window;
    for (int64_t il = 0; il < sh->n_layer; il++)
        for (int64_t k = 0; kv->win[il] && k < nw; k++, p += kv->wrow)
            if (!packed_fp8_valid(p, p + dh, dh))
                return dsf_seterr(err, "snapshot window row %lld of layer %lld holds a NaN code or a scale out of "
                                       "range (not a QDQ_FP8 row)", (long long)(n - nw + k), (long long)il);
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (sh->kv_src[il] != il || !kv->ckv[il]) continue;
        const int64_t rows = n / sh->ratio[il];
        for (int64_t j = 0; j < rows; j++, p += kv->crow)
            if (!packed_fp4_e4m3_valid(p + dh / 2, dh))
                return dsf_seterr(err, "snapshot compressed row %lld of layer %lld has a scale out of range",
                                  (long long)j, (long long)il);
        for (int64_t j = 0; j < rows; j++, p += kv->irow)
            if (!packed_fp4_valid(p + id / 2, id))
                return dsf_seterr(err, "snapshot index key %lld of layer %lld has a scale out of range", (long long)j,
                                  (long long)il);
        if (kv->carry[il] && sh->ratio[il] > 1 && n % sh->ratio[il]) p += 2 * dh * (int64_t)sizeof(float);
    }
    return 0;
}

typedef struct {
    const uint8_t *p;
    size_t left;
} rdr;

static int take_bytes(rdr *r, void *dst, size_t n) {
    if (n > r->left) return -1;
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

/* The image spans of a version 5 snapshot (at p: types, keys, rows): the types are 0..4 and
 * n_span of them are spans, text positions have key 0, the rows are finite, and the model
 * can route spans. -1 with err naming the first problem. */
static int check_media(const dsf_session *s, const uint8_t *p, int64_t n, int64_t n_span, char *err) {
    const int64_t D = s->e->shape.n_embd;
    if (!s->e->w.vision)
        return dsf_seterr(err, "snapshot holds image spans, but this model has no image routing bias (exp_probs_b_vl)");
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t key;
        memcpy(&key, p + n + i * 8, 8);
        if (p[i] > DSF_TOKEN_IMAGE_END + 1)
            return dsf_seterr(err, "snapshot position %lld has token type %d (not -1..3)", (long long)i, p[i] - 1);
        if (!p[i] && key) return dsf_seterr(err, "snapshot text position %lld has a non-zero key", (long long)i);
        c += p[i] != 0;
    }
    if (c != n_span)
        return dsf_seterr(err, "snapshot marks %lld image-span positions, its header says %lld", (long long)c,
                          (long long)n_span);
    const uint8_t *rows = p + n * 9;
    for (int64_t i = 0; i < n_span * D; i++) {
        float v;
        memcpy(&v, rows + i * 4, 4);
        if (!isfinite(v)) return dsf_seterr(err, "snapshot span row %lld holds a NaN or an infinity", (long long)(i / D));
    }
    return 0;
}

/* Takes the checked media section (version 5) into the session's history: types, keys and
 * rows for [0, n), clean marks beyond (session.h). A version 4 snapshot is all text. */
static void restore_media(dsf_session *s, rdr *r, int64_t n, int64_t n_span, bool v5) {
    dsf_kvstate *kv = &s->kv;
    const int64_t D = s->e->shape.n_embd;
    if (kv->media) {
        memset(kv->vtype, 0, (size_t)kv->max_ctx);
        memset(kv->keys, 0, (size_t)kv->max_ctx * sizeof(uint64_t));
    }
    kv->n_erows = 0;
    if (v5) r->p += 8, r->left -= 8;
    if (!n_span) return;
    if (n_span > kv->erows_cap) {
        kv->erows = dsf_xrealloc(kv->erows, (size_t)(n_span * D) * sizeof(float));
        s->bytes += (size_t)((n_span - kv->erows_cap) * D) * sizeof(float);
        kv->erows_cap = n_span;
    }
    take_bytes(r, kv->vtype, (size_t)n);
    take_bytes(r, kv->keys, (size_t)n * sizeof(uint64_t));
    take_bytes(r, kv->erows, (size_t)(n_span * D) * sizeof(float));
    kv->n_erows = n_span;
    kv->media = true;
}

int session_save_local(const dsf_session *s, uint8_t **out, size_t *len, char *err) {
    const dsf_shape *sh = &s->e->shape;
    const int64_t n = s->kv.n, dh = sh->head_dim, id = sh->idx_dim;
    dsf_buf b = {0};
    snap_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SNAP_MAGIC, 8);
    h.version = SNAP_VERSION;
    h.numerics = snap_mode(s->e);
    h.model_id = s->e->model_id;
    h.data_id = data_id(s->e);
    h.n = (uint64_t)n;
    h.n_layer = (uint64_t)sh->n_layer;
    h.head_dim = (uint64_t)dh;
    h.idx_dim = (uint64_t)id;
    h.kv_format = (uint32_t)s->kv.packed;
    h.held = held_id(s);
    dsf_buf_append(&b, &h, sizeof h);
    dsf_buf_append(&b, s->kv.tokens, (size_t)n * sizeof(int32_t));
    const uint64_t n_span = (uint64_t)s->kv.n_erows;
    dsf_buf_append(&b, &n_span, sizeof n_span);
    if (n_span) {
        dsf_buf_append(&b, s->kv.vtype, (size_t)n);
        dsf_buf_append(&b, s->kv.keys, (size_t)n * sizeof(uint64_t));
        dsf_buf_append(&b, s->kv.erows, (size_t)(n_span * (uint64_t)sh->n_embd) * sizeof(float));
    }
    /* the window rows the next token can see: positions [n - nw, n), as stored */
    const int64_t nw = n < sh->window ? n : sh->window;
    for (int64_t il = 0; il < sh->n_layer; il++)
        for (int64_t p = n - nw; s->kv.win[il] && p < n; p++) dsf_buf_append(&b, kv_win(&s->kv, il, p), (size_t)s->kv.wrow);
    for (int64_t il = 0; il < sh->n_layer; il++) {
        if (sh->kv_src[il] != il || !s->kv.ckv[il]) continue;
        int64_t rows = n / sh->ratio[il];
        dsf_buf_append(&b, s->kv.ckv[il], (size_t)(rows * s->kv.crow));
        dsf_buf_append(&b, s->kv.ik[il], (size_t)(rows * s->kv.irow));
        if (s->kv.carry[il] && sh->ratio[il] > 1 && n % sh->ratio[il])
            dsf_buf_append(&b, s->kv.carry[il], (size_t)(2 * dh) * sizeof(float));
    }
    uint64_t sum = fnv1a(FNV_INIT, b.data, b.len);
    dsf_buf_append(&b, &sum, sizeof sum);
    (void)err;
    *out = b.data;
    *len = b.len;
    return 0;
}

int session_restore_local(dsf_session *s, const uint8_t *data, size_t len, char *err) {
    const dsf_shape *sh = &s->e->shape;
    snap_header h;
    if (len < sizeof h + 8) return dsf_seterr(err, "snapshot truncated (%zu bytes)", len);
    memcpy(&h, data, sizeof h);
    if (memcmp(h.magic, SNAP_MAGIC, 8) != 0) return dsf_seterr(err, "not a dsflash session snapshot");
    if (h.version != SNAP_VERSION && h.version != SNAP_VERSION_TEXT)
        return dsf_seterr(err, "snapshot version %u is not supported (want %u, or %u without images)", h.version,
                          SNAP_VERSION, SNAP_VERSION_TEXT);
    uint64_t sum;
    memcpy(&sum, data + len - 8, 8);
    if (fnv1a(FNV_INIT, data, len - 8) != sum) return dsf_seterr(err, "snapshot checksum mismatch (corrupted)");
    if (h.model_id != s->e->model_id || h.data_id != data_id(s->e) || h.n_layer != (uint64_t)sh->n_layer || h.head_dim != (uint64_t)sh->head_dim ||
        h.idx_dim != (uint64_t)sh->idx_dim)
        return dsf_seterr(err, "snapshot was made with a different model or shape");
    if (h.numerics != snap_mode(s->e))
        return dsf_seterr(err, "snapshot was made in numerics mode %s%s, the engine runs %s%s",
                          h.numerics & 0xFF ? "plain" : "reference", h.numerics & SNAP_Q8K ? " with Q8_K activations" : "",
                          s->e->numerics ? "plain" : "reference", s->e->act_q8k ? " with Q8_K activations" : "");
    if (h.held != held_id(s))
        return dsf_seterr(err, "the snapshot holds another part of the layers (it was made by another split over MPI "
                               "ranks, or by a single process)");
    if (h.kv_format != (uint32_t)s->kv.packed)
        return dsf_seterr(err, "snapshot stores %s KV rows, the session %s ones (DSF_KV_PACK differs)",
                          h.kv_format ? "packed" : "fp32", s->kv.packed ? "packed" : "fp32");
    if (h.n > (uint64_t)s->kv.max_ctx)
        return dsf_seterr(err, "snapshot holds %llu tokens; the session's context is %lld", (unsigned long long)h.n,
                          (long long)s->kv.max_ctx);
    const int64_t n = (int64_t)h.n;
    /* the whole layout is checked before anything is overwritten: a bad snapshot leaves
     * the session as it was */
    const int64_t nw = n < sh->window ? n : sh->window;
    const uint8_t *media = data + sizeof h + (size_t)n * sizeof(int32_t);
    uint64_t n_span = 0, media_bytes = 0;
    if (h.version == SNAP_VERSION) {
        if (len < sizeof h + 8 + (uint64_t)n * sizeof(int32_t) + 8) return dsf_seterr(err, "snapshot truncated (%zu bytes)", len);
        memcpy(&n_span, media, 8);
        if (n_span > (uint64_t)n) return dsf_seterr(err, "snapshot claims %llu image-span positions in %lld tokens",
                                                    (unsigned long long)n_span, (long long)n);
        media_bytes = 8 + (n_span ? (uint64_t)n * 9 + n_span * (uint64_t)sh->n_embd * sizeof(float) : 0);
    }
    uint64_t want = sizeof h + 8 + (uint64_t)n * sizeof(int32_t) + media_bytes + rows_bytes(sh, &s->kv, n);
    if (want != len) return dsf_seterr(err, "snapshot size %zu does not match its header (%llu)", len, (unsigned long long)want);
    for (int64_t i = 0; i < n; i++) {
        int32_t tk;
        memcpy(&tk, data + sizeof h + (size_t)i * sizeof tk, sizeof tk);
        if (tk < 0 || tk >= sh->n_vocab) return dsf_seterr(err, "snapshot holds an invalid token id %d", tk);
    }
    if (n_span && check_media(s, media + 8, n, (int64_t)n_span, err) < 0) return -1;
    if (s->kv.packed && check_packed(sh, &s->kv, media + media_bytes, n, err) < 0) return -1;
    rdr r = {data + sizeof h, len - 8 - sizeof h};
    int bad = take_bytes(&r, s->kv.tokens, (size_t)n * sizeof(int32_t));
    restore_media(s, &r, n, (int64_t)n_span, h.version == SNAP_VERSION);
    for (int64_t il = 0; il < sh->n_layer && !bad; il++)
        for (int64_t p = n - nw; s->kv.win[il] && p < n && !bad; p++) bad |= take_bytes(&r, kv_win(&s->kv, il, p), (size_t)s->kv.wrow);
    for (int64_t il = 0; il < sh->n_layer && !bad; il++) {
        if (sh->kv_src[il] != il || !s->kv.ckv[il]) continue;
        int64_t rows = n / sh->ratio[il];
        bad |= take_bytes(&r, s->kv.ckv[il], (size_t)(rows * s->kv.crow));
        bad |= take_bytes(&r, s->kv.ik[il], (size_t)(rows * s->kv.irow));
        if (!bad && s->kv.carry[il] && sh->ratio[il] > 1 && n % sh->ratio[il])
            bad |= take_bytes(&r, s->kv.carry[il], (size_t)(2 * sh->head_dim) * sizeof(float));
    }
    DSF_ASSERT(!bad && r.left == 0);
    s->kv.n = n;
    s->kv.win_lo = n - nw; /* older window rows are not in the snapshot: a rollback past them re-prefills */
    s->kv.feat_lo = n; /* target features are not in the snapshot */
    return 0;
}
