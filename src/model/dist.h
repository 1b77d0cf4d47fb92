/* dist.h: an engine spread over the ranks of an MPI job (README "Several machines (MPI)";
 * docs/ARCHITECTURE.md, model/). Not a public interface.
 *
 * The ranks form stages: stage s owns the layers [l0[s], l1[s]) (stage 0 also the embedding,
 * the last stage the head) and holds only their weights and KV. The members of a stage split
 * its routed experts by id ranges and compute everything else alike. `--parallel pipeline`:
 * one member per stage; `experts`: one stage; `pipeline,experts`: both.
 *
 * What a cut carries (the stream, and every layer dependency that crosses it: gguf-layout.md
 * §2.5) is computed once here (dist_cut); the forward's messages (distpipe.c), the
 * experts' fixed-order combination (distmoe.c), rank 0's mirrored session operations
 * (distops.c), the followers' loop (distfollow.c) and the snapshots of a split session
 * (distsnap.c) use it. (Separate files, so that no two of them link each other in a circle:
 * `make links`.)
 * Invariant: every rank's values are bit for bit those of one process. */
#ifndef DSF_DIST_H
#define DSF_DIST_H

#include "model/session.h"
#include "net/comm.h"
#include "base/util.h"

#define DIST_MAX_STAGES COMM_MAX_RANKS

struct fwd_ctx; /* model/forward.h */

/* What crosses the cut in front of a stage's first layer c, besides the stream. */
typedef struct {
    int32_t n_src;
    int32_t src[DSF_MAX_LAYERS]; /* KV sources < c read at >= c: their new compressed rows and index keys */
    bool sel;                    /* a layer >= c reuses the top-k of an index source < c */
    bool cand;                   /* a layer >= c is restricted to the candidates of cand_src < c */
} dist_cut;

typedef struct dist_plan {
    int rank, size;
    int n_stages, stage;
    int first[DIST_MAX_STAGES + 1]; /* ranks of stage s: [first[s], first[s + 1]) */
    int64_t l0[DIST_MAX_STAGES], l1[DIST_MAX_STAGES];
    dist_cut cut[DIST_MAX_STAGES]; /* cut[s]: in front of stage s (s >= 1) */
    int member, members;           /* this rank within its stage */
    int64_t e0, e1;                /* its routed experts [e0, e1) */
    bool split_experts;            /* members > 1 */
    uint8_t *hold;                 /* [n_layer]: 1 for this stage's layers */
    uint8_t *hold_src;             /* [n_layer]: KV sources whose rows this rank keeps (own or mirrored) */
    uint64_t signature;            /* of the layout: snapshots and the state id carry it */
    uint64_t next_sid;             /* rank 0: the next session id */
} dist_plan;

/* The split asked for (--parallel, --stages, --pp-split). */
typedef struct {
    bool pipeline, experts;
    int stages;        /* pipeline,experts: 0 = 2 */
    const char *split; /* NULL or "": chosen */
} dist_opts;

/* dist.c: rank me's plan among N ranks, from the engine's shape and tensor sizes (pure: no MPI;
 * dsflash inspect --parallel shows every rank's). -1 with err on an impossible split. */
int dist_plan_make(const dsf_engine *e, const dist_opts *o, int N, int me, dist_plan **out, char *err);
void dist_plan_free(dist_plan *d);
/* The weight bytes rank d reads (its layers, its share of their routed experts, the head). */
double dist_weight_bytes(const dsf_engine *e, const dist_plan *d);
/* dist.c: the job's options (dsf_dist_init) are set; dsf_engine_open then calls dist_attach. */
bool dist_configured(void);
/* Builds e->dist for the job (layers by weight bytes, cuts where no dependency crosses when
 * the balance allows), logs what this rank holds. -1 with err on a bad --pp-split. */
int dist_attach(dsf_engine *e, char *err);
void dist_detach(dsf_engine *e);
static inline bool dist_holds(const dist_plan *d, int64_t il) { return !d || d->hold[il]; }
static inline bool dist_owns_expert(const dist_plan *d, int64_t ex) { return !d || (ex >= d->e0 && ex < d->e1); }
static inline bool dist_is_head(const dist_plan *d) { return !d || (d->stage == d->n_stages - 1 && d->member == 0); }
/* The extra bytes per token a cut at layer c carries for the shape (reported, and the cost
 * dist_attach minimizes): compressed rows and keys of the crossing sources, worst-case top-k
 * and candidate lists. */
void dist_cut_of(const dsf_shape *sh, int64_t c, dist_cut *out);
double dist_cut_bytes(const dsf_shape *sh, const dist_cut *cut, int packed);

/* distpipe.c: forward_tokens on a spread engine (forward.c calls it through e->dist_forward,
 * which dsf_engine_open sets). */
int dist_forward(const dsf_engine *e, dsf_scratch *sc, dsf_kvstate **tkv, const int32_t *tok, int64_t T,
                 float *logits, int64_t logit_row0, char *err);

/* distmoe.c: the fixed-order combination of a stage's experts (moe.c). acc [T][D] holds
 * this member's partial start on return of dist_moe_begin (zeros for member 0, the previous
 * member's sum otherwise); dist_moe_end passes the sum on and leaves the stage's total in acc
 * on every member. */
/* distpipe.c: the message a stage's leader sends the next stage for chunk f (the stream, the
 * crossing sources' new compressed rows and index keys, the top-k and candidate lists the cut
 * carries; want: rank 0 wants logits, row0: their first row), appended to b; and its reading
 * into f's scratch and KV mirrors, which refuses (-1, err) any message whose layout is not the
 * one this chunk implies (lengths, list counts above the scratch's room). */
void dist_stream_pack(dsf_buf *b, const struct fwd_ctx *f, const dist_cut *cut, bool want, int64_t row0);
int dist_stream_unpack(const uint8_t *msg, size_t len, const struct fwd_ctx *f, const dist_cut *cut, bool *want,
                       int64_t *row0, char *err);
void dist_moe_begin(const struct fwd_ctx *f, float *acc);
void dist_moe_end(const struct fwd_ctx *f, float *acc);

/* distops.c: rank 0 tells the other ranks what each public session call does, so that they
 * run the same call on their part of the state. Each returns 0 (nothing to do when
 * single-process) or -1 with err when the job has failed. */
int dist_op_new(dsf_session *s, int max_ctx, char *err);
void dist_op_free(dsf_session *s);
int dist_op_eval(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, char *err);
int dist_op_batch(dsf_session **ss, const int32_t *tokens, int n, char *err);
int dist_op_rollback(dsf_session *s, int n, char *err);
/* distfollow.c: the payloads of the eval and batch ops, checked against the header's counts (pure: the
 * fuzzer's entry points). An eval holds n tokens, and with media their types, keys and (for
 * stage 0) the span rows; a batch n session ids and n tokens. -1 with err naming the
 * mismatch; the out arrays are malloc'ed. */
typedef struct {
    int n;
    int32_t *tokens;
    int8_t *types;  /* NULL: text */
    uint64_t *keys;
    float *embd;
} dist_eval_msg;
int dist_parse_eval(const uint8_t *p, size_t len, int64_t n, bool media, int64_t n_embd, dist_eval_msg *out, char *err);
void dist_eval_msg_free(dist_eval_msg *m);
int dist_parse_batch(const uint8_t *p, size_t len, int64_t n, uint64_t **sids, int32_t **tokens, char *err);
/* distfollow.c: a follower rank (rank > 0) runs rank 0's operations until rank 0 closes the
 * engine: 0 then (dsf_engine_open closes the engine and ends the process); a failure ends the
 * process at once, named. */
int dist_follow(dsf_engine *e);
/* rank 0, dsf_engine_close: tells the followers to end. */
void dist_op_quit(dsf_engine *e);


/* ---- the op protocol (distops.c sends, distfollow.c runs, distsnap.c uses both) ---------- */

#define DIST_OP_MAGIC 0x5053464fu /* "OFSP" */
#define DIST_MAX_PAYLOAD ((size_t)1 << 40)
enum { OP_QUIT = 1, OP_NEW, OP_FREE, OP_EVAL, OP_BATCH, OP_ROLLBACK, OP_SAVE, OP_RESTORE, OP_STATS };

/* An op: a header, then len payload bytes (eval: tokens, types, keys, rows; batch: ids, tokens;
 * restore: the rank's part). */
typedef struct {
    uint32_t magic, op;
    uint64_t sid;
    int64_t a, b;
    uint64_t len;
} op_head;

/* A follower's answer to an op that needs one (new, restore). */
typedef struct {
    int32_t status;
    char err[DSF_ERR_LEN];
} op_reply;

/* A follower's answer to OP_STATS. */
typedef struct {
    comm_stats st;
    uint64_t rss;
} stats_reply;

/* distops.c: whether e is rank 0 of a job of several ranks; op h with its payload to the ranks
 * [r0, r1) (rank 0 skipped), to every follower; every follower's op_reply (the first failure,
 * named, into err); this process's VmRSS. */
bool dist_root(const dsf_engine *e);
int dist_send_op(const dsf_engine *e, op_head h, const void *payload, int r0, int r1, char *err);
int dist_send_all(const dsf_engine *e, op_head h, const void *payload, char *err);
int dist_replies(const dsf_engine *e, char *err);
uint64_t dist_vm_rss(void);

#endif
