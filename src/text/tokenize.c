/* tokenize.c: text -> ids and ids -> text with a built tokenizer (tokenizer_impl.h).
 *
 * Owns: steps 1, 2 and 4 of the pipeline described in tokenizer.c (added-token matching,
 * the three-regex pre-tokenizer, BPE with a per-call word cache) and the UTF-8-safe
 * streaming detokenizer.
 * Must not: write to the tokenizer; every call allocates its own scratch, so one tokenizer
 * serves several threads. */
#include "text/tokenizer_impl.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== encoding ========================================================================== */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ids_vec;

static void ids_push(ids_vec *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->v = dsf_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

/* Per-call word cache: word bytes -> the ids BPE produced (ids stored in `pool`). */
typedef struct {
    uint64_t hash;
    size_t word_off, word_len; /* into words */
    size_t ids_off, ids_n;     /* into pool */
    bool used;
} cache_slot;

#define CACHE_MAX_WORD 128 /* longer words are not cached */

typedef struct { int32_t rank; int32_t pos; } heap_ent;

typedef struct {
    const dsf_tokenizer *tok;
    pcre2_match_data *md[N_PRE];
    ids_vec out;
    /* BPE scratch */
    int32_t *sym, *prv, *nxt;
    heap_ent *heap;
    size_t sym_cap, heap_cap, heap_n;
    /* cache */
    cache_slot *slots;
    size_t slots_cap, slots_used;
    dsf_buf words;
    ids_vec pool;
    char *err;
    int failed;
} enc_state;

static bool heap_less(heap_ent a, heap_ent b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(enc_state *st, int32_t rank, int32_t pos) {
    if (st->heap_n == st->heap_cap) {
        st->heap_cap = st->heap_cap ? st->heap_cap * 2 : 64;
        st->heap = dsf_xrealloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    size_t i = st->heap_n++;
    heap_ent e = {rank, pos};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, st->heap[p])) break;
        st->heap[i] = st->heap[p];
        i = p;
    }
    st->heap[i] = e;
}

static heap_ent heap_pop(enc_state *st) {
    heap_ent top = st->heap[0], last = st->heap[--st->heap_n];
    size_t i = 0, n = st->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(st->heap[c + 1], st->heap[c])) c++;
        if (!heap_less(st->heap[c], last)) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (n) st->heap[i] = last;
    return top;
}

static void try_pair(enc_state *st, int32_t pos) {
    int32_t r = st->nxt[pos];
    if (r < 0) return;
    const merge_slot *m = merge_find(st->tok, st->sym[pos], st->sym[r]);
    if (m) heap_push(st, m->rank, pos);
}

/* BPE of one pre-tokenized piece; appends its ids to dst. */
static void bpe_word(enc_state *st, const uint8_t *w, size_t n, ids_vec *dst) {
    if (n > st->sym_cap) {
        st->sym_cap = n * 2;
        st->sym = dsf_xrealloc(st->sym, st->sym_cap * sizeof *st->sym);
        st->prv = dsf_xrealloc(st->prv, st->sym_cap * sizeof *st->prv);
        st->nxt = dsf_xrealloc(st->nxt, st->sym_cap * sizeof *st->nxt);
    }
    for (size_t i = 0; i < n; i++) {
        st->sym[i] = st->tok->byte_id[w[i]];
        st->prv[i] = (int32_t)i - 1;
        st->nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    st->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(st, (int32_t)i);
    while (st->heap_n) {
        heap_ent e = heap_pop(st);
        int32_t p = e.pos, r = st->nxt[p];
        if (st->sym[p] < 0 || r < 0) continue; /* merged away, or no right neighbour */
        const merge_slot *m = merge_find(st->tok, st->sym[p], st->sym[r]);
        if (!m || m->rank != e.rank) continue; /* stale entry */
        st->sym[p] = m->result;
        st->sym[r] = -1;
        st->nxt[p] = st->nxt[r];
        if (st->nxt[r] >= 0) st->prv[st->nxt[r]] = p;
        if (st->prv[p] >= 0) try_pair(st, st->prv[p]);
        try_pair(st, p);
    }
    for (int32_t i = 0; i >= 0; i = st->nxt[i]) ids_push(dst, st->sym[i]);
}

static void encode_word(enc_state *st, const uint8_t *w, size_t n) {
    if (n == 0) return;
    if (n > CACHE_MAX_WORD) {
        bpe_word(st, w, n, &st->out);
        return;
    }
    if (st->slots_used * 2 >= st->slots_cap) { /* grow (or start) the cache */
        size_t ncap = st->slots_cap ? st->slots_cap * 2 : 1024;
        cache_slot *ns = dsf_xcalloc(ncap, sizeof *ns);
        for (size_t i = 0; i < st->slots_cap; i++) {
            if (!st->slots[i].used) continue;
            size_t h = st->slots[i].hash & (ncap - 1);
            while (ns[h].used) h = (h + 1) & (ncap - 1);
            ns[h] = st->slots[i];
        }
        free(st->slots);
        st->slots = ns;
        st->slots_cap = ncap;
    }
    uint64_t hv = fnv1a(w, n);
    size_t h = hv & (st->slots_cap - 1);
    while (st->slots[h].used) {
        cache_slot *c = &st->slots[h];
        if (c->hash == hv && c->word_len == n && memcmp(st->words.data + c->word_off, w, n) == 0) {
            for (size_t i = 0; i < c->ids_n; i++) ids_push(&st->out, st->pool.v[c->ids_off + i]);
            return;
        }
        h = (h + 1) & (st->slots_cap - 1);
    }
    cache_slot *c = &st->slots[h];
    c->used = true;
    c->hash = hv;
    c->word_off = st->words.len;
    c->word_len = n;
    dsf_buf_append(&st->words, w, n);
    c->ids_off = st->pool.n;
    bpe_word(st, w, n, &st->pool);
    c->ids_n = st->pool.n - c->ids_off;
    st->slots_used++;
    for (size_t i = 0; i < c->ids_n; i++) ids_push(&st->out, st->pool.v[c->ids_off + i]);
}

typedef void (*piece_fn)(void *ud, const char *piece, size_t n);

/* Applies regex `level` to s[0..n): every match and every gap between matches goes on to
 * the next level (HF Split, behavior Isolated); after the last level, fn(piece). */
static int split_level(enc_state *st, int level, const char *s, size_t n, piece_fn fn, void *ud) {
    if (n == 0) return 0;
    if (level == N_PRE) {
        fn(ud, s, n);
        return 0;
    }
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_match(st->tok->re[level], (PCRE2_SPTR)s, n, pos, 0, st->md[level], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dsf_seterr(st->err, "tokenizer: pre-tokenizer regex %d failed: %s", level,
                              (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md[level]);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match (impossible with these patterns): step one byte */
            pos = ms + 1;
            continue;
        }
        if (ms > gap && split_level(st, level + 1, s + gap, ms - gap, fn, ud)) return -1;
        if (split_level(st, level + 1, s + ms, me - ms, fn, ud)) return -1;
        gap = pos = me;
    }
    if (n > gap && split_level(st, level + 1, s + gap, n - gap, fn, ud)) return -1;
    return 0;
}

static void piece_to_ids(void *ud, const char *piece, size_t n) {
    encode_word(ud, (const uint8_t *)piece, n);
}

static void enc_init(enc_state *st, const dsf_tokenizer *tok, char *err) {
    memset(st, 0, sizeof *st);
    st->tok = tok;
    st->err = err;
    for (int i = 0; i < N_PRE; i++) st->md[i] = pcre2_match_data_create_from_pattern(tok->re[i], NULL);
}

static void enc_free(enc_state *st) {
    for (int i = 0; i < N_PRE; i++) pcre2_match_data_free(st->md[i]);
    free(st->sym);
    free(st->prv);
    free(st->nxt);
    free(st->heap);
    free(st->slots);
    dsf_buf_free(&st->words);
    free(st->pool.v);
}

int tokenizer_pretokenize(const dsf_tokenizer *tok, const char *text, size_t len,
                          void (*fn)(void *ud, const char *piece, size_t n), void *ud, char *err) {
    enc_state st;
    enc_init(&st, tok, err);
    for (int i = 0; i < N_PRE; i++)
        if (!st.md[i]) {
            enc_free(&st);
            return dsf_seterr(err, "tokenizer: out of memory");
        }
    int rc = split_level(&st, 0, text, len, fn, ud);
    enc_free(&st);
    return rc;
}

/* The longest added token matching text at s[0..n), or -1. */
static int32_t match_added(const dsf_tokenizer *tok, const char *s, size_t n, bool parse_special) {
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = tok->sp_start[b]; k < tok->sp_start[b + 1]; k++) {
        int32_t id = tok->sp_ids[k];
        if (tok->types[id] == TOKEN_TYPE_CONTROL && !parse_special) continue;
        uint32_t l = tok->str_len[id];
        if (l <= n && memcmp(s, tok->str_arena + tok->str_off[id], l) == 0) return id;
    }
    return -1;
}

int dsf_tokenize(const dsf_tokenizer *tok, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **out, size_t *n_out, char *err) {
    *out = NULL;
    *n_out = 0;
    if (!text && len) return dsf_seterr(err, "tokenize: NULL text");
    if (add_bos && tok->bos < 0)
        return dsf_seterr(err, "tokenize: BOS requested but the tokenizer has no bos_token_id");
    enc_state st;
    enc_init(&st, tok, err);
    for (int i = 0; i < N_PRE; i++)
        if (!st.md[i]) {
            enc_free(&st);
            return dsf_seterr(err, "tokenizer: out of memory");
        }
    if (add_bos) ids_push(&st.out, tok->bos);
    size_t seg = 0;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t id = tok->sp_start[(uint8_t)text[i]] < tok->sp_start[(uint8_t)text[i] + 1]
                         ? match_added(tok, text + i, len - i, parse_special)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        rc = split_level(&st, 0, text + seg, i - seg, piece_to_ids, &st);
        ids_push(&st.out, id);
        i += tok->str_len[id];
        seg = i;
    }
    if (rc == 0) rc = split_level(&st, 0, text + seg, len - seg, piece_to_ids, &st);
    if (rc == 0) {
        *out = st.out.v ? st.out.v : dsf_xmalloc(sizeof(int32_t));
        *n_out = st.out.n;
        st.out.v = NULL;
    }
    free(st.out.v);
    enc_free(&st);
    return rc;
}

/* ==== decoding ========================================================================== */

struct dsf_detok {
    const dsf_tokenizer *tok;
    bool render_special;
    uint8_t held[4];
    size_t n_held;
    dsf_buf out;
};

dsf_detok *dsf_detok_new(const dsf_tokenizer *tok, bool render_special) {
    dsf_detok *d = dsf_xcalloc(1, sizeof *d);
    d->tok = tok;
    d->render_special = render_special;
    /* worst case: every byte of held + piece becomes a 3-byte U+FFFD */
    dsf_buf_reserve(&d->out, 3 * ((size_t)tok->max_bytes + 4) + 1);
    return d;
}

void dsf_detok_free(dsf_detok *d) {
    if (!d) return;
    dsf_buf_free(&d->out);
    free(d);
}

static void put_fffd(dsf_buf *b) { dsf_buf_append(b, "\xEF\xBF\xBD", 3); }

/* Appends the valid UTF-8 of held + p[0..n) to d->out; keeps an unfinished tail in held. */
static void detok_feed(dsf_detok *d, const uint8_t *p, size_t n) {
    uint8_t tmp[8];
    size_t i = 0;
    /* First complete (or reject) the held prefix with bytes from p. */
    while (d->n_held) {
        size_t m = d->n_held;
        memcpy(tmp, d->held, m);
        size_t take = n - i < 4 - m ? n - i : 4 - m;
        memcpy(tmp + m, p + i, take);
        int c = utf8_class(tmp, m + take, NULL);
        if (c == 0) { /* still incomplete: p is exhausted */
            memcpy(d->held + m, p + i, take);
            d->n_held += take;
            return;
        }
        size_t used = c > 0 ? (size_t)c : (size_t)-c;
        if (c > 0) dsf_buf_append(&d->out, tmp, used);
        else put_fffd(&d->out);
        if (used >= m) { /* consumed all held bytes and used - m of p */
            i += used - m;
            d->n_held = 0;
        } else { /* the maximal subpart ended inside held: re-examine the rest */
            memmove(d->held, d->held + used, m - used);
            d->n_held = m - used;
        }
    }
    while (i < n) {
        size_t run = i;
        while (run < n && p[run] < 0x80) run++;
        if (run > i) {
            dsf_buf_append(&d->out, p + i, run - i);
            i = run;
            continue;
        }
        int c = utf8_class(p + i, n - i, NULL);
        if (c > 0) {
            dsf_buf_append(&d->out, p + i, (size_t)c);
            i += (size_t)c;
        } else if (c < 0) {
            put_fffd(&d->out);
            i += (size_t)-c;
        } else {
            memcpy(d->held, p + i, n - i);
            d->n_held = n - i;
            return;
        }
    }
}

int dsf_detok_push(dsf_detok *d, int32_t id, const char **text, size_t *len, char *err) {
    d->out.len = 0;
    *text = "";
    *len = 0;
    if (id < 0 || id >= d->tok->n_vocab)
        return dsf_seterr(err, "detokenize: token id %d outside the vocabulary (%d)", id,
                          d->tok->n_vocab);
    if (d->tok->types[id] != TOKEN_TYPE_CONTROL || d->render_special)
        detok_feed(d, (const uint8_t *)d->tok->byte_arena + d->tok->byte_off[id],
                   d->tok->byte_len[id]);
    dsf_buf_append(&d->out, "", 0);
    d->out.data[d->out.len] = 0;
    *text = (const char *)d->out.data;
    *len = d->out.len;
    return 0;
}

void dsf_detok_flush(dsf_detok *d, const char **text, size_t *len) {
    d->out.len = 0;
    /* an unfinished character at the end: each maximal subpart becomes one U+FFFD */
    if (d->n_held) put_fffd(&d->out);
    d->n_held = 0;
    dsf_buf_append(&d->out, "", 0);
    d->out.data[d->out.len] = 0;
    *text = (const char *)d->out.data;
    *len = d->out.len;
}

int dsf_detokenize(const dsf_tokenizer *tok, const int32_t *ids, size_t n, bool render_special,
                   char **out, size_t *out_len, char *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    dsf_detok *d = dsf_detok_new(tok, render_special);
    dsf_buf all = {0};
    const char *t;
    size_t l;
    for (size_t i = 0; i < n; i++) {
        if (dsf_detok_push(d, ids[i], &t, &l, err)) {
            dsf_detok_free(d);
            dsf_buf_free(&all);
            return -1;
        }
        dsf_buf_append(&all, t, l);
    }
    dsf_detok_flush(d, &t, &l);
    dsf_buf_append(&all, t, l);
    dsf_buf_append(&all, "", 1);
    dsf_detok_free(d);
    *out = (char *)all.data;
    if (out_len) *out_len = all.len - 1;
    return 0;
}
