/* session.h: per-sequence state (architecture.md §5.1) and the forward pass's scratch.
 *
 * State, all indexed by absolute position so that prefill, chunked prefill and decode see
 * exactly the same values (§5.2):
 *   - tokens[0..n): the token history (also the Engram history: compressed ids are looked
 *     up from it, and positions < 0 are "sequence start");
 *   - win[il]: every layer's window KV (post-norm, post-RoPE, QDQ'd in reference mode) in a
 *     ring of wslots = window + max_chunk + rollback margin rows (position p at slot
 *     p % wslots); positions >= win_lo are intact. A rollback further back than the ring
 *     re-prefills from the token history (exact: chunking never changes the result);
 *   - ckv[s][j], ik[s][j]: compressed rows and index keys of the KV source layers;
 *   - carry[s]: the ratio-2 compressor's pending token (a, g), valid while n is odd.
 * Row storage (kv->packed): in reference numerics the rows are exactly the QDQ'd values, so
 * they are stored packed (spec §5.1, quant.h *_pack), losslessly: a window row as dh e4m3
 * codes + dh/32 E8M0 scales (528 B for 512), a compressed row as dh/2 bytes of e2m1 nibbles +
 * dh/16 e4m3 scales (288 B), an index key as id/2 bytes of nibbles + id/32 E8M0 (68 B for 128).
 * In plain numerics (or DSF_KV_PACK=0) every row is fp32. The readers decode packed rows into
 * the scratch (attn.c, indexer.c) and get the fp32 values bit for bit.
 * Scratch: buffers for one chunk of up to max_chunk tokens, allocated once. */
#ifndef DSF_SESSION_H
#define DSF_SESSION_H

#ifndef DSF_Q_PAD
/* Floats of padding after each token's query heads in the chunk scratch: unpadded, the
 * tokens' wq_b rows start a multiple of 4 KiB apart and share one cache set (docs/perf-log.md,
 * item 33). */
#define DSF_Q_PAD 16
#endif

#include "model/model.h"

typedef struct dsf_kvstate_s {
    int64_t max_ctx;
    int64_t n;          /* tokens consumed */
    int32_t *tokens;    /* [max_ctx] */
    int64_t wslots;     /* window ring rows */
    int64_t win_lo;     /* lowest position whose window row is intact */
    int packed;         /* rows in the packed formats (above); else fp32 */
    int64_t wrow, crow, irow; /* bytes of a window row, a compressed row, an index key */
    uint8_t **win;      /* [n_layer] -> [wslots][wrow] */
    uint8_t **ckv;      /* [n_layer] -> [max_ctx/ratio + 1][crow] (KV sources only) */
    uint8_t **ik;       /* [n_layer] -> [max_ctx/ratio + 1][irow] (KV sources only) */
    float **carry;      /* [n_layer] -> [2][head_dim]: a then g (ratio-2 KV sources) */
    /* DSpark target features (dspark.md §3), off (NULL) unless dsf_session_set_features asked:
     * position p's row [nfeat][n_embd] at slot p % fslots, written by every forward */
    float *feat;
    int64_t fslots;
    int32_t nfeat;
    int32_t *feat_of;   /* [n_layer]: the layer's place in the row, or -1 */
    int64_t feat_lo;    /* positions below it were not recorded (consumed before recording started,
                         * restored from a snapshot); fslots == wslots, so win_lo bounds the rest */
    /* Image spans (vision.md §5-§8), kept with the token history so that a rollback's
     * re-prefill and a snapshot see them: vtype[p] = token type + 1 (0: text) and keys[p]
     * (0: text; dsf_media.keys) for p < n, both 0 at every p >= n; [max_ctx], calloc'd and
     * never written by a session without spans (untouched pages). erows: the substituted
     * embeddings of the span positions in position order, [erows_cap][n_embd], grown by
     * dsf_session_eval_media; the first n_erows belong to positions < n, the rows after them
     * are the pending chunk's (or stale). media: the session has held a span. */
    uint8_t *vtype;
    uint64_t *keys;
    float *erows;
    int64_t erows_cap, n_erows;
    bool media;
} dsf_kvstate;

/* The token type (DSF_TOKEN_*) of position p (< n, or of the chunk being evaluated). */
static inline int kv_type(const dsf_kvstate *kv, int64_t p) { return (int)kv->vtype[p] - 1; }

typedef struct dsf_scratch_s {
    int64_t max_chunk;
    int64_t ksel, kcand;         /* idx_topk and cand_topk_blocks capped by what max_ctx can
                                  * reach (the file's values are untrusted sizes) */
    float *X, *X1;               /* [T][hc][D] */
    float *pre, *a_pre, *f_pre;  /* [T][hc] */
    float *post, *comb;          /* [T][hc], [T][hc][hc] */
    float *mix;                  /* [T][mix] */
    float *h, *u;                /* [T][D] */
    float *qa, *qr, *qrq, *uq;   /* [T][q_lora], uq: [T][D] QDQ'd input */
    float *q;                    /* [T][H * dh + DSF_Q_PAD]: token t's heads from q + t * (H * dh + DSF_Q_PAD) */
    float *kvw;                  /* [T][dh] */
    float *o;                    /* [T][H][dh] */
    float *ya, *yaq;             /* [T][og*olr] */
    float *out;                  /* [T][D] */
    float *ca, *cg;              /* [T][dh] compressor projections */
    float *lat;                  /* [T][dh] */
    float *ikt;                  /* [T][idx_dim] */
    float *iq, *iw;              /* [T][ih][id], [T][ih] */
    float *scores;               /* [max_ctx] */
    float *blk;                  /* [max_ctx/cand_block+1] */
    int32_t *sel;                /* [T][idx_topk] selected compressed rows */
    int64_t *n_sel;              /* [T] */
    int32_t *cand;               /* [T][cand_topk_blocks] candidate blocks (sorted) */
    int64_t *n_cand;             /* [T] */
    int32_t *heap;               /* [max(idx_topk, cand_topk_blocks, n_expert_used)] */
    uint8_t *cmask;              /* [max_ctx/cand_block+1] */
    float *att;                  /* [window + idx_topk] */
    float *rcs;                  /* [T][n_rot]: a layer's RoPE cos/sin at each token's position (attn.c) */
    int32_t *keys;               /* [window + idx_topk] key ids (>=0 window pos, <0 compressed) */
    /* packed KV (kvstate.packed): the keys of up to kdec_tok tokens decoded at once (attn.c),
     * kdec_rows rows of head_dim; kptr/kfmt: each row's packed source and format */
    float *kdec;                 /* [kdec_rows][dh] */
    const uint8_t **kptr;        /* [kdec_rows] */
    uint8_t *kfmt;               /* [kdec_rows]: 0 window row, 1 compressed row */
    int64_t *koff;               /* [T]: token t's first row in kdec */
    int64_t kdec_rows, kdec_tok;
    /* MoE */
    float *rlog;                 /* [T][n_expert] */
    int32_t *esel;               /* [T][n_used] */
    float *ewt;                  /* [T][n_used] */
    int32_t *etok;               /* [T] tokens routed to the current expert */
    float *ewtok;                /* [T] */
    float *ex, *exq;             /* [T][D] gathered inputs */
    float *eg, *eu;              /* [T][ff] */
    float *ey;                   /* [T][D] */
    float *acc;                  /* [T][D] fp32 accumulator */
    float *ystore;               /* [T][n_used + 1][D]: a stage member's expert outputs by position
                                  * in increasing id, then the shared one (model/dist.h), or NULL */
    int32_t *eslot;              /* [T]: the ystore row of each row of the current expert, or NULL */
    /* Engram */
    struct engram_req *ereq;     /* the chunk's table rows, read by the engine's readers
                                  * (engram_io.h; dsf_session_new; NULL without Engram) */
    float *erow;                 /* [T][cols*ple_dim] */
    float *ekv;                  /* [T][(hc+1)*D] */
    float *fin;                  /* [T][D] final norm */
    uint16_t *xb;                /* [T][max projection input] BF16 activations */
    int64_t xb_cap;              /* elements of xb */
    dsf_kvstate **tkv;           /* [T] */
    int8_t *ttype;               /* [T] token types of the chunk (forward.c) */
    int64_t *tpos;               /* [T] */
    int64_t *tjrow;              /* [T] compressed row emitted by each latent */
    dsf_kvstate **tjkv;          /* [T] its sequence */
} dsf_scratch;

struct dsf_session {
    dsf_engine *e;
    uint64_t dist_id; /* the same session on every rank of an MPI job (model/dist.h), 0 otherwise */
    dsf_kvstate kv;
    dsf_scratch sc;
    size_t bytes;
};

/* The window row of position p in layer il (p must be >= win_lo and not yet overwritten),
 * compressed row j and index key j of source layer il: kv->wrow, crow, irow bytes (fp32
 * values when !kv->packed). */
static inline uint8_t *kv_win(const dsf_kvstate *kv, int64_t il, int64_t p) {
    return kv->win[il] + (p % kv->wslots) * kv->wrow;
}
static inline uint8_t *kv_ckv(const dsf_kvstate *kv, int64_t il, int64_t j) { return kv->ckv[il] + j * kv->crow; }
static inline uint8_t *kv_ik(const dsf_kvstate *kv, int64_t il, int64_t j) { return kv->ik[il] + j * kv->irow; }

#define DSF_ROLLBACK_MARGIN 1024
#define KV_IDX_DEC 16384 /* floats of indexer.c's stack block of decoded index keys */

/* session.c: a session with max_chunk chunk (dsf_session_new takes the engine's; the
 * other ranks of an MPI job from rank 0). snapshot.c: the snapshot of the state this process
 * holds (all of it, or its stage's layers in an MPI job: dist.h), and its restore. */
dsf_session *session_new(dsf_engine *e, int max_ctx, int64_t chunk, char *err);
int session_save_local(const dsf_session *s, uint8_t **out, size_t *len, char *err);
int session_restore_local(dsf_session *s, const uint8_t *data, size_t len, char *err);

/* kvcache.c: max_chunk bounds the tokens of one forward (the ring must hold window +
 * max_chunk - 1 rows so that a chunk never overwrites what its own queries read); packed:
 * the row formats above (only for reference numerics: plain rows are not QDQ'd). */
int kv_init(dsf_kvstate *kv, const dsf_shape *s, int64_t max_ctx, int64_t max_chunk, int packed, size_t *bytes,
            char *err);
/* Bytes of a window row, a compressed row and an index key in either storage; returns
 * whether the rows are packed (asked, and idx_dim <= KV_IDX_DEC). */
int kv_row_bytes(const dsf_shape *s, int packed, int64_t *wrow, int64_t *crow, int64_t *irow);
/* Whether a session of engine numerics ref stores packed rows: reference numerics, unless
 * DSF_KV_PACK=0 asks for fp32 rows (benchmarks and the tests that compare the two). */
int kv_pack_default(int ref);
/* kv_init for a rank that holds part of the layers (model/dist.h): window rows (and the carry)
 * only of the layers with hold[il], compressed rows and index keys only of the KV sources
 * with hold_src[il] (its own and those it mirrors); NULL holds all. */
int kv_init_held(dsf_kvstate *kv, const dsf_shape *s, int64_t max_ctx, int64_t max_chunk, int packed,
                 const uint8_t *hold, const uint8_t *hold_src, size_t *bytes, char *err);
void kv_free(dsf_kvstate *kv, const dsf_shape *s);
/* packed: room for attn.c's decoded keys (sessions whose kvstate is packed). */
int scratch_init(dsf_scratch *sc, const dsf_shape *s, int64_t max_chunk, int64_t max_ctx, int packed, size_t *bytes);
void scratch_free(dsf_scratch *sc);
/* The bytes scratch_init takes for these arguments, allocating nothing. */
size_t scratch_bytes(const dsf_shape *s, int64_t max_chunk, int64_t max_ctx, int packed);
/* What a chunk of chunk tokens costs a session: its scratch (at a context of chunk tokens)
 * plus the chunk's rows in every layer's window ring. */
size_t chunk_bytes(const dsf_shape *s, int64_t chunk, int packed);
/* The automatic prefill chunk (kvcache.c): the smallest power of two from 512 to 8192 that
 * gives each routed expert 32 tokens on average (n_expert_used / n_expert of the chunk's
 * tokens), halved (not below 512) while chunk_bytes exceeds 1/16 of ram bytes (ram <= 0: no
 * bound). The logits do not depend on the chunk. */
int64_t chunk_auto(const dsf_shape *s, int packed, double ram);

#endif
