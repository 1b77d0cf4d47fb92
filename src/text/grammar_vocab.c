/* grammar_vocab.c: constrained decoding over tokens (text layer).
 *
 * Owns: the byte trie of a tokenizer's ordinary tokens (built once, attached to the
 * tokenizer), and gr_matcher, the per-generation driver: for the current grammar state, the
 * set of token ids that may come next (a walk of the trie with the lazy DFA of grammar.c,
 * pruning every subtree whose prefix the grammar refuses), the budget restriction, the mask
 * cache, and the advance by a sampled token.
 * Must not: sample or touch logits beyond masking (runtime does); know schemas.
 * Invariants: special tokens (CONTROL, USER_DEFINED, ...) are atomic: only the grammar's
 * symbols (EOS, ｜DSML｜, </think>) can ever be allowed, and only as their token id; a cached
 * mask is the budget-free one of its state, used only when no allowed token would break the
 * budget (maxcost <= budget - 1).
 *
 * Budget: gr_rt_cost(s) is the fewest symbols that complete state s, and every byte is one
 * ordinary token in a byte-level vocabulary (tokenizer_build requires the 256 byte tokens),
 * so a token t is allowed with B tokens left (t included) only if cost(after t) <= B - 1.
 * From a state whose cost fits the budget, some token always fits again (the first symbol
 * of its shortest completion), so the output completes. */
#include "text/grammar.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "text/tokenizer_impl.h"

/* ==== the vocabulary trie ================================================================ */

typedef struct {
    uint8_t byte;   /* edge label from the parent */
    uint16_t depth; /* 1 for the root's children */
    int32_t skip;   /* index of the first node after this subtree */
    int32_t tok;    /* first token whose bytes end here, -1 none (more in dup[]) */
} tnode;

struct gr_vocab {
    dsf_tok_cache base; /* first: attached to the tokenizer, freed through base.free */
    tnode *nodes; /* depth-first order: a subtree is nodes[i .. skip) */
    int n_nodes;
    int32_t *dup; /* [n_vocab] next token with the same bytes, -1 */
    int max_depth;
};

void gr_vocab_free(struct gr_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->dup);
    free(v);
}

static void vocab_cache_free(dsf_tok_cache *c) { gr_vocab_free((struct gr_vocab *)c); }

static const dsf_tokenizer *sort_tok;
static int by_bytes(const void *a, const void *b) {
    size_t la, lb;
    const char *x = dsf_token_bytes(sort_tok, *(const int32_t *)a, &la), *y = dsf_token_bytes(sort_tok, *(const int32_t *)b, &lb);
    int c = memcmp(x, y, la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b);
}

static struct gr_vocab *vocab_build(const dsf_tokenizer *tok) {
    int n = dsf_tokenizer_n_vocab(tok), m = 0;
    int32_t *ids = dsf_xmalloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) {
        size_t len;
        int ty = tok->types[i];
        if ((ty == TOKEN_TYPE_NORMAL || ty == TOKEN_TYPE_BYTE) && dsf_token_bytes(tok, i, &len) && len > 0 && len < 65535)
            ids[m++] = i;
    }
    /* qsort has no context argument in C11: the comparator reads a static, so builds are
     * serialized (they happen once per tokenizer) */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    sort_tok = tok;
    qsort(ids, (size_t)m, sizeof *ids, by_bytes);
    pthread_mutex_unlock(&mu);
    struct gr_vocab *v = dsf_xcalloc(1, sizeof *v);
    v->dup = dsf_xmalloc((size_t)n * sizeof *v->dup);
    for (int i = 0; i < n; i++) v->dup[i] = -1;
    int cap = 1024, *path = dsf_xmalloc(65536 * sizeof *path), depth = 0;
    v->nodes = dsf_xmalloc((size_t)cap * sizeof *v->nodes);
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int k = 0; k < m; k++) {
        size_t len;
        const char *b = dsf_token_bytes(tok, ids[k], &len);
        size_t common = 0;
        while (prev && common < prev_len && common < len && prev[common] == b[common]) common++;
        if (prev && common == len && len == prev_len) { /* same bytes as the previous token */
            int32_t *t = &v->nodes[path[depth - 1]].tok;
            while (*t >= 0 && v->dup[*t] >= 0) t = &v->dup[*t];
            v->dup[*t] = ids[k];
            continue;
        }
        while ((size_t)depth > common) v->nodes[path[--depth]].skip = v->n_nodes; /* close subtrees */
        for (size_t i = common; i < len; i++) {
            if (v->n_nodes == cap) cap *= 2, v->nodes = dsf_xrealloc(v->nodes, (size_t)cap * sizeof *v->nodes);
            v->nodes[v->n_nodes] = (tnode){(uint8_t)b[i], (uint16_t)(i + 1), 0, -1};
            path[depth++] = v->n_nodes++;
        }
        v->nodes[path[depth - 1]].tok = ids[k];
        if (depth > v->max_depth) v->max_depth = depth;
        prev = b, prev_len = len;
    }
    while (depth > 0) v->nodes[path[--depth]].skip = v->n_nodes;
    free(path);
    free(ids);
    return v;
}

static const struct gr_vocab *vocab_get(const dsf_tokenizer *tok) {
    dsf_tokenizer *t = (dsf_tokenizer *)tok; /* the trie is a cache: the tokenizer stays immutable */
    dsf_tok_cache *c = atomic_load(&t->cache);
    if (c) return (const struct gr_vocab *)c;
    struct gr_vocab *mine = vocab_build(tok);
    mine->base.free = vocab_cache_free;
    dsf_tok_cache *expect = NULL;
    if (atomic_compare_exchange_strong(&t->cache, &expect, &mine->base)) return mine;
    gr_vocab_free(mine); /* another thread won */
    return (const struct gr_vocab *)expect;
}

/* ==== the matcher ======================================================================== */

typedef struct {
    uint64_t *bits; /* [n_words] allowed tokens, budget-free */
    int32_t maxcost; /* largest cost after an allowed token */
    int n_allowed;
} mask_entry;

#define CACHE_BYTES ((size_t)64 << 20)

struct gr_matcher {
    const dsf_grammar *g;
    const dsf_tokenizer *tok;
    const struct gr_vocab *v;
    gr_rt *rt;
    int state;
    int n_vocab, n_words;
    mask_entry **cache; /* by state id */
    int cap_cache;
    size_t cache_bytes;
    uint64_t *work;   /* a mask computed under a binding budget */
    int *walk;        /* [max_depth + 1] states along the trie path */
};

gr_matcher *gr_matcher_new(const dsf_grammar *g, const dsf_tokenizer *tok, char *err) {
    if (!g || !tok) {
        dsf_seterr(err, "constrained decoding needs a grammar and a tokenizer");
        return NULL;
    }
    static const char *const names[GR_N_SYM] = {"EOS", "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c", "</think>"};
    int n = dsf_tokenizer_n_vocab(tok);
    for (int y = 0; y < GR_N_SYM; y++)
        if (g->sym_id[y] < 0 || g->sym_id[y] >= n) {
            /* only a symbol the grammar uses must exist */
            bool used = false;
            for (int i = 0; i < g->n_el; i++) used |= g->el[i].kind == GE_SYM && g->el[i].arg == y;
            if (used) {
                dsf_seterr(err, "the tokenizer has no %s token, which the constraint needs", names[y]);
                return NULL;
            }
        }
    gr_matcher *m = dsf_xcalloc(1, sizeof *m);
    m->g = g;
    m->tok = tok;
    m->v = vocab_get(tok);
    m->rt = gr_rt_new(g);
    m->state = gr_rt_start(m->rt);
    m->n_vocab = n;
    m->n_words = (n + 63) / 64;
    m->work = dsf_xmalloc((size_t)m->n_words * sizeof *m->work);
    m->walk = dsf_xmalloc((size_t)(m->v->max_depth + 1) * sizeof *m->walk);
    return m;
}

void gr_matcher_free(gr_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->cap_cache; i++)
        if (m->cache[i]) free(m->cache[i]->bits), free(m->cache[i]);
    free(m->cache);
    free(m->work);
    free(m->walk);
    gr_rt_free(m->rt);
    free(m);
}

static void allow(const gr_matcher *m, uint64_t *bits, int32_t id, int *count) {
    for (; id >= 0; id = m->v->dup[id])
        if (!(bits[id >> 6] >> (id & 63) & 1)) bits[id >> 6] |= (uint64_t)1 << (id & 63), ++*count;
}

/* The tokens allowed from state s with budget tokens left (INT32_MAX: none binding) into
 * bits; *maxcost: the largest cost after an allowed token. Returns their count. */
static int compute_mask(gr_matcher *m, int s, int32_t budget, uint64_t *bits, int32_t *maxcost) {
    memset(bits, 0, (size_t)m->n_words * sizeof *bits);
    int count = 0;
    int32_t mc = 0, limit = budget == INT32_MAX ? GR_INF - 1 : budget - 1;
    for (int y = 0; y < GR_N_SYM; y++) {
        int32_t id = m->g->sym_id[y];
        if (id < 0 || id >= m->n_vocab) continue;
        int t = gr_rt_next(m->rt, s, 256 + y);
        int32_t c = gr_rt_cost(m->rt, t);
        if (t >= 0 && c <= limit) {
            bits[id >> 6] |= (uint64_t)1 << (id & 63), count++;
            if (c > mc) mc = c;
        }
    }
    const tnode *nd = m->v->nodes;
    int *walk = m->walk;
    walk[0] = s;
    for (int i = 0; i < m->v->n_nodes;) {
        int t = gr_rt_next(m->rt, walk[nd[i].depth - 1], nd[i].byte);
        if (t < 0) {
            i = nd[i].skip; /* no token with this prefix */
            continue;
        }
        walk[nd[i].depth] = t;
        if (nd[i].tok >= 0) {
            int32_t c = gr_rt_cost(m->rt, t);
            if (c <= limit) {
                allow(m, bits, nd[i].tok, &count);
                if (c > mc) mc = c;
            }
        }
        i++;
    }
    *maxcost = mc;
    return count;
}

/* The mask of the current state under budget (cached when the budget does not bind). */
static const uint64_t *current_mask(gr_matcher *m, int budget, int *count) {
    int s = m->state;
    if (s < 0) {
        *count = 0;
        memset(m->work, 0, (size_t)m->n_words * sizeof *m->work);
        return m->work;
    }
    if (s >= m->cap_cache) {
        int cap = m->cap_cache ? m->cap_cache : 64;
        while (cap <= s) cap *= 2;
        m->cache = dsf_xrealloc(m->cache, (size_t)cap * sizeof *m->cache);
        memset(m->cache + m->cap_cache, 0, (size_t)(cap - m->cap_cache) * sizeof *m->cache);
        m->cap_cache = cap;
    }
    mask_entry *e = m->cache[s];
    if (!e) {
        size_t bytes = (size_t)m->n_words * sizeof(uint64_t);
        if (m->cache_bytes + bytes > CACHE_BYTES) { /* full: start over */
            for (int i = 0; i < m->cap_cache; i++)
                if (m->cache[i]) free(m->cache[i]->bits), free(m->cache[i]), m->cache[i] = NULL;
            m->cache_bytes = 0;
        }
        e = dsf_xcalloc(1, sizeof *e);
        e->bits = dsf_xmalloc(bytes);
        e->n_allowed = compute_mask(m, s, INT32_MAX, e->bits, &e->maxcost);
        m->cache[s] = e;
        m->cache_bytes += bytes;
    }
    if (e->maxcost <= budget - 1) {
        *count = e->n_allowed;
        return e->bits;
    }
    int32_t mc;
    *count = compute_mask(m, s, budget < 1 ? 1 : budget, m->work, &mc);
    if (budget < 1) *count = 0, memset(m->work, 0, (size_t)m->n_words * sizeof *m->work);
    return m->work;
}

int gr_matcher_mask(gr_matcher *m, const float *logits, float *out, int n_vocab, int budget) {
    int count;
    const uint64_t *bits = current_mask(m, budget, &count);
    int n = n_vocab < m->n_vocab ? n_vocab : m->n_vocab, allowed = 0;
    /* word by word: empty and full words (most of them, either way) without a branch per id */
    for (int w = 0; w * 64 < n; w++) {
        uint64_t b = bits[w];
        int i0 = w * 64, i1 = i0 + 64 < n ? i0 + 64 : n;
        if (i1 - i0 < 64) b &= ((uint64_t)1 << (i1 - i0)) - 1;
        allowed += __builtin_popcountll(b);
        if (b == 0) {
            for (int i = i0; i < i1; i++) out[i] = -INFINITY;
        } else if (b == UINT64_MAX) {
            memcpy(out + i0, logits + i0, 64 * sizeof *out);
        } else {
            for (int i = i0; i < i1; i++) out[i] = (b >> (i - i0) & 1) ? logits[i] : -INFINITY;
        }
    }
    for (int i = n; i < n_vocab; i++) out[i] = -INFINITY;
    return allowed;
}

int gr_matcher_allowed(gr_matcher *m, int budget, int32_t *ids, int cap) {
    int count, k = 0;
    const uint64_t *bits = current_mask(m, budget, &count);
    for (int i = 0; i < m->n_vocab && k < cap; i++)
        if (bits[i >> 6] >> (i & 63) & 1) ids[k++] = i;
    return k;
}

int gr_matcher_cost(const gr_matcher *m) { return gr_rt_cost(m->rt, m->state); }

int gr_matcher_accept(gr_matcher *m, int32_t id) {
    if (m->state < 0 || id < 0 || id >= m->n_vocab) return -1;
    for (int y = 0; y < GR_N_SYM; y++)
        if (m->g->sym_id[y] == id) {
            m->state = gr_rt_next(m->rt, m->state, 256 + y);
            return m->state >= 0 ? 0 : -1;
        }
    int ty = m->tok->types[id];
    if (ty != TOKEN_TYPE_NORMAL && ty != TOKEN_TYPE_BYTE) return m->state = -1;
    size_t len;
    const char *b = dsf_token_bytes(m->tok, id, &len);
    for (size_t i = 0; i < len && m->state >= 0; i++) m->state = gr_rt_next(m->rt, m->state, (unsigned char)b[i]);
    return m->state >= 0 ? 0 : -1;
}
