/* grammar.c: the byte-level recognizer of constrained decoding (text layer).
 *
 * Owns: the grammar's storage and shortest-completion costs (dsf_grammar_new/free), and the
 * runtime gr_rt: parse stacks as interned frames (pos, aux, parent), DFA states as interned
 * sets of top frames, their transitions (built lazily, one table of GR_N_INPUT entries per
 * state) and their costs; the marker filter of text runs; gr_match_text for tests.
 * Must not: know tokens (grammar_vocab.c does) or schemas (grammar_schema.c does).
 * Invariants: every top frame of a state sits on a terminal (GE_BYTES, GE_SYM, GE_STR) and can
 * complete (finite cost); a state with no frame and no accept flag does not exist (-1);
 * a frame's parent is the frame to continue with after its alternative ends (-1: the root).
 *
 * A stack is the chain frame -> parent -> ...: expanding a rule reference pushes the
 * continuation only when the reference is not the last element (tail calls keep repetition
 * flat). Left recursion without progress is cut by a depth limit (the compiler never makes
 * it; a hostile $ref could). */
#include "text/grammar.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* ==== the marker filter ================================================================== */

/* Text runs must not spell these: the output parser (dsml.c) would read them as markers
 * (spec chat-format.md §3.2 step 5; "｜DSML｜" would also end a raw parameter early). An
 * Aho-Corasick automaton over them, built once. */
static const char *const markers[] = {
    "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c", "<think>", "</think>",
    "<\xef\xbd\x9c" "begin\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
};
#define AC_MAX 128
static uint8_t ac_next[AC_MAX][256];
static bool ac_bad[AC_MAX];
static pthread_once_t ac_once = PTHREAD_ONCE_INIT;

static void ac_build(void) {
    int n = 1, fail[AC_MAX] = {0}, queue[AC_MAX];
    int16_t go[AC_MAX][256];
    memset(go, -1, sizeof go);
    for (size_t k = 0; k < sizeof markers / sizeof *markers; k++) {
        int s = 0;
        for (const unsigned char *p = (const unsigned char *)markers[k]; *p; p++) {
            if (go[s][*p] < 0) go[s][*p] = (int16_t)n++;
            s = go[s][*p];
        }
        ac_bad[s] = true;
    }
    DSF_ASSERT(n <= AC_MAX);
    int qh = 0, qt = 0;
    for (int c = 0; c < 256; c++) {
        if (go[0][c] < 0) ac_next[0][c] = 0;
        else ac_next[0][c] = (uint8_t)go[0][c], fail[go[0][c]] = 0, queue[qt++] = go[0][c];
    }
    while (qh < qt) {
        int s = queue[qh++];
        ac_bad[s] = ac_bad[s] || ac_bad[fail[s]];
        for (int c = 0; c < 256; c++) {
            int t = go[s][c];
            if (t < 0) ac_next[s][c] = ac_next[fail[s]][c];
            else ac_next[s][c] = (uint8_t)t, fail[t] = ac_next[fail[s]][c], queue[qt++] = t;
        }
    }
}

bool gr_has_marker(const char *text, size_t n) {
    for (size_t k = 0; k < sizeof markers / sizeof *markers; k++)
        if (memmem(text, n, markers[k], strlen(markers[k]))) return true;
    return false;
}

/* ==== construction ======================================================================= */

#define GROW(p, n, cap)                                                                        \
    do {                                                                                       \
        if ((n) >= (cap)) {                                                                    \
            (cap) = (cap) ? 2 * (cap) : 64;                                                    \
            (p) = dsf_xrealloc((p), (size_t)(cap) * sizeof *(p));                              \
        }                                                                                      \
    } while (0)

int gr_rule_new(dsf_grammar *g) {
    GROW(g->rules, g->n_rules, g->cap_rules);
    g->rules[g->n_rules] = (gr_rule){0, 0};
    return g->n_rules++;
}

void gr_rule_set(dsf_grammar *g, int r, gr_elem *const *seq, const int *len, int n) {
    g->rules[r].alt0 = g->n_alts;
    g->rules[r].nalt = n;
    for (int a = 0; a < n; a++) {
        GROW(g->alts, g->n_alts, g->cap_alts);
        g->alts[g->n_alts++] = g->n_el;
        for (int i = 0; i <= len[a]; i++) {
            GROW(g->el, g->n_el, g->cap_el);
            g->el[g->n_el++] = i < len[a] ? seq[a][i] : (gr_elem){GE_END, 0};
        }
    }
}

int gr_set_index(dsf_grammar *g, const uint8_t set[32]) {
    for (int i = g->n_sets - 1; i >= 0 && i >= g->n_sets - 64; i--)
        if (!memcmp(g->sets[i], set, 32)) return i;
    GROW(g->sets, g->n_sets, g->cap_sets);
    memcpy(g->sets[g->n_sets], set, 32);
    return g->n_sets++;
}

int gr_str_index(dsf_grammar *g, int32_t min, int32_t max, bool raw) {
    for (int i = 0; i < g->n_strs; i++)
        if (g->strs[i].min == min && g->strs[i].max == max && g->strs[i].raw == raw) return i;
    GROW(g->strs, g->n_strs, g->cap_strs);
    g->strs[g->n_strs] = (gr_strspec){min, max, raw};
    return g->n_strs++;
}

static int32_t sat_add(int32_t a, int32_t b) { return a >= GR_INF - b ? GR_INF : a + b; }

static int32_t elem_cost(const dsf_grammar *g, gr_elem e) {
    switch (e.kind) {
    case GE_BYTES:
    case GE_SYM: return 1;
    case GE_REF: return g->rmin[e.arg];
    case GE_STR: return sat_add(g->strs[e.arg].min, g->strs[e.arg].raw ? 0 : 1);
    default: return 0;
    }
}

int gr_finalize(dsf_grammar *g, char *err) {
    g->rmin = dsf_xmalloc((size_t)(g->n_rules ? g->n_rules : 1) * sizeof *g->rmin);
    g->rem = dsf_xmalloc((size_t)(g->n_el ? g->n_el : 1) * sizeof *g->rem);
    for (int r = 0; r < g->n_rules; r++) g->rmin[r] = GR_INF;
    /* Bellman-Ford style: each round can only lower a rule's cost; n_rules + 1 rounds settle. */
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < g->n_rules; r++)
            for (int a = 0; a < g->rules[r].nalt; a++) {
                int32_t c = 0;
                for (int p = g->alts[g->rules[r].alt0 + a]; g->el[p].kind != GE_END; p++) c = sat_add(c, elem_cost(g, g->el[p]));
                if (c < g->rmin[r]) g->rmin[r] = c, changed = true;
            }
    }
    for (int a = 0; a < g->n_alts; a++) {
        int end = g->alts[a];
        while (g->el[end].kind != GE_END) end++;
        g->rem[end] = 0;
        for (int p = end - 1; p >= g->alts[a]; p--) g->rem[p] = sat_add(g->rem[p + 1], elem_cost(g, g->el[p]));
    }
    if (g->rmin[g->root] >= GR_INF) return dsf_seterr(err, "the schema admits no value");
    g->min_tokens = g->rmin[g->root];
    return 0;
}

static void grammar_release(dsf_grammar *g) {
    free(g->el);
    free(g->alts);
    free(g->rules);
    free(g->sets);
    free(g->strs);
    free(g->rem);
    free(g->rmin);
}

void dsf_grammar_free(dsf_grammar *g) {
    if (!g) return;
    grammar_release(g);
    free(g);
}

static const char *const sym_text[GR_N_SYM] = {
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c",
    "</think>",
};

dsf_grammar *dsf_grammar_new(const dsf_tokenizer *tok, const char *spec, size_t len, char *err) {
    pthread_once(&ac_once, ac_build);
    dsf_grammar *g = dsf_xcalloc(1, sizeof *g);
    g->root = -1;
    if (gr_compile(g, spec ? spec : "", spec ? len : 0, err) || gr_finalize(g, err)) {
        dsf_grammar_free(g);
        return NULL;
    }
    for (int s = 0; s < GR_N_SYM; s++) g->sym_id[s] = tok ? dsf_token_id(tok, sym_text[s]) : -1;
    if (tok) {
        int32_t eos = dsf_tokenizer_eos(tok);
        if (eos >= 0) g->sym_id[GR_SYM_EOS] = eos;
    }
    return g;
}

int dsf_grammar_min_tokens(const dsf_grammar *g) { return g ? g->min_tokens : 0; }

/* ==== runtime: frames ==================================================================== */

/* aux of a GE_STR top frame (a text run in progress) */
#define AX_CNT(a) ((uint32_t)((a) & 0xFFFFFFu))             /* code points so far */
#define AX_ESC(a) ((unsigned)(((a) >> 24) & 15u))           /* escape state, below */
#define AX_ZERO ((uint64_t)1 << 28)                         /* \u digits all 0 so far */
#define AX_HI ((uint64_t)1 << 29)                           /* \u: first digit d / high surrogate */
#define AX_NEED(a) ((unsigned)(((a) >> 30) & 3u))           /* UTF-8 continuation bytes due */
#define AX_RNG(a) ((unsigned)(((a) >> 32) & 7u))            /* range of the next continuation */
#define AX_PAT(a) ((unsigned)(((a) >> 40) & 0xFFu))         /* marker filter state */
/* escape states: 0 none; 1 after '\'; 2..5 in \uXXXX with 0..3 digits read; 6..11 after a high
 * surrogate: '\', 'u', [dD], [c-fC-F], hex, hex */
enum { ESC_BS = 1, ESC_U0 = 2, ESC_LOW = 6 };

typedef struct {
    int32_t pos, parent;
    uint64_t aux;
    int32_t ccost; /* cost of continuing at pos, then the parents (this frame as a parent) */
    uint32_t stamp;
} frame;

typedef struct {
    int32_t off, n;  /* top frames: pool[off .. off + n) */
    bool accept;     /* the empty stack (everything, EOS included, consumed) */
    int32_t cost;
    int32_t *next;   /* [GR_N_INPUT] lazily; -2: not computed */
} state;

struct gr_rt {
    const dsf_grammar *g;
    frame *fr;
    int n_fr, cap_fr;
    int32_t *fh; /* frame hash (open addressing), -1 empty */
    size_t fh_mask;
    state *st;
    int n_st, cap_st;
    int32_t *pool;
    size_t n_pool, cap_pool;
    int32_t *sh; /* state hash */
    size_t sh_mask;
    size_t next_bytes;
    uint32_t stamp;
    /* scratch of one transition */
    int32_t *tmp;
    int n_tmp, cap_tmp;
    bool tmp_accept;
    int start;
};

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static uint64_t frame_hash(int32_t pos, int32_t parent, uint64_t aux) {
    return mix(((uint64_t)(uint32_t)pos << 32 | (uint32_t)parent) ^ mix(aux + 0x9E3779B97F4A7C15ULL));
}

/* A hash table of ids twice the size (or cap0), all empty (-1). */
static void table_grow(int32_t **t, size_t *mask, size_t cap0) {
    size_t cap = *t ? 2 * (*mask + 1) : cap0;
    free(*t);
    *t = dsf_xmalloc(cap * sizeof **t);
    memset(*t, 0xFF, cap * sizeof **t);
    *mask = cap - 1;
}

static void fh_rehash(gr_rt *rt) {
    table_grow(&rt->fh, &rt->fh_mask, 1024);
    for (int i = 0; i < rt->n_fr; i++) {
        size_t h = frame_hash(rt->fr[i].pos, rt->fr[i].parent, rt->fr[i].aux) & rt->fh_mask;
        while (rt->fh[h] >= 0) h = (h + 1) & rt->fh_mask;
        rt->fh[h] = i;
    }
}

static int32_t frame_get(gr_rt *rt, int32_t pos, int32_t parent, uint64_t aux) {
    if (!rt->fh || (size_t)rt->n_fr * 2 >= rt->fh_mask) fh_rehash(rt);
    size_t h = frame_hash(pos, parent, aux) & rt->fh_mask;
    for (; rt->fh[h] >= 0; h = (h + 1) & rt->fh_mask) {
        const frame *f = &rt->fr[rt->fh[h]];
        if (f->pos == pos && f->parent == parent && f->aux == aux) return rt->fh[h];
    }
    GROW(rt->fr, rt->n_fr, rt->cap_fr);
    /* parents exist before their children, so the continuation cost is a sum known now */
    int32_t cc = sat_add(rt->g->rem[pos], parent >= 0 ? rt->fr[parent].ccost : 0);
    rt->fr[rt->n_fr] = (frame){pos, parent, aux, cc, 0};
    rt->fh[h] = rt->n_fr;
    return rt->n_fr++;
}

/* Fewest symbols that finish the text run of a top frame (its closing quote included). */
static int32_t str_cost(const gr_strspec *sp, uint64_t a) {
    unsigned esc = AX_ESC(a), need = AX_NEED(a);
    int32_t c = 0;
    bool inprog = esc || need;
    if (esc == ESC_BS) c = 1;
    else if (esc >= ESC_U0 && esc < ESC_LOW) c = (int32_t)(ESC_U0 + 4 - esc) + ((a & AX_HI) && esc >= ESC_U0 + 2 ? 6 : 0);
    else if (esc >= ESC_LOW) c = (int32_t)(ESC_LOW + 6 - esc);
    c += (int32_t)need;
    int32_t left = sp->min - (int32_t)AX_CNT(a) - (inprog ? 1 : 0);
    if (left > 0) c += left;
    return c + (sp->raw ? 0 : 1);
}

static int32_t top_cost(gr_rt *rt, int32_t f) {
    const dsf_grammar *g = rt->g;
    const frame *fr = &rt->fr[f];
    gr_elem e = g->el[fr->pos];
    int32_t c = e.kind == GE_STR ? str_cost(&g->strs[e.arg], fr->aux) : 1;
    c = sat_add(c, g->rem[fr->pos + 1]);
    return sat_add(c, fr->parent >= 0 ? rt->fr[fr->parent].ccost : 0);
}

/* ==== runtime: closure and steps ========================================================= */

#define MAX_DEPTH 256
#define MAX_TOPS 65536

static void tmp_push(gr_rt *rt, int32_t f) {
    if (rt->n_tmp >= MAX_TOPS) return;
    GROW(rt->tmp, rt->n_tmp, rt->cap_tmp);
    rt->tmp[rt->n_tmp++] = f;
}

static bool str_can_end(const gr_strspec *sp, uint64_t a) {
    return !AX_ESC(a) && !AX_NEED(a) && (int32_t)AX_CNT(a) >= sp->min;
}

static void closure(gr_rt *rt, int32_t pos, int32_t parent, int depth);

/* Adds a top frame on the terminal at pos (aux: its run state); a raw run that may end here
 * also continues past it. */
static void add_top(gr_rt *rt, int32_t pos, int32_t parent, uint64_t aux, int depth) {
    const dsf_grammar *g = rt->g;
    gr_elem e = g->el[pos];
    int32_t f = frame_get(rt, pos, parent, aux);
    if (top_cost(rt, f) < GR_INF) tmp_push(rt, f);
    if (e.kind == GE_STR && g->strs[e.arg].raw && str_can_end(&g->strs[e.arg], aux)) closure(rt, pos + 1, parent, depth + 1);
}

/* Expands "continue at pos with parent" into top frames (rt->tmp) or the accept flag. */
static void closure(gr_rt *rt, int32_t pos, int32_t parent, int depth) {
    const dsf_grammar *g = rt->g;
    if (depth > MAX_DEPTH) return;
    for (;;) {
        gr_elem e = g->el[pos];
        if (e.kind == GE_END) {
            if (parent < 0) {
                rt->tmp_accept = true;
                return;
            }
            pos = rt->fr[parent].pos;
            parent = rt->fr[parent].parent;
            continue;
        }
        if (e.kind != GE_REF) {
            add_top(rt, pos, parent, 0, depth);
            return;
        }
        /* visit each (pos, parent) once per transition: cuts cycles and repeated work */
        int32_t mark = frame_get(rt, pos, parent, UINT64_MAX);
        if (rt->fr[mark].stamp == rt->stamp) return;
        rt->fr[mark].stamp = rt->stamp;
        int32_t cont = g->el[pos + 1].kind == GE_END ? parent : frame_get(rt, pos + 1, parent, 0);
        const gr_rule *r = &g->rules[e.arg];
        for (int a = 0; a < r->nalt; a++) closure(rt, g->alts[r->alt0 + a], cont, depth + 1);
        return;
    }
}

/* One byte of a text run: the new aux, or UINT64_MAX if the byte is not allowed. For a JSON
 * run, *closed is set when the byte is the closing quote. */
static uint64_t str_step(const gr_strspec *sp, uint64_t a, int c, bool *closed) {
    unsigned esc = AX_ESC(a), need = AX_NEED(a), cnt = AX_CNT(a);
    const uint64_t BAD = UINT64_MAX;
    *closed = false;
    bool room = sp->max < 0 || (int32_t)cnt < sp->max;
    bool done_char = false;
    uint64_t keep = a & ~(((uint64_t)15 << 24) | AX_ZERO | AX_HI | ((uint64_t)3 << 30) | ((uint64_t)7 << 32));
    uint64_t na = keep;
    if (need) {
        static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        unsigned r = AX_RNG(a);
        if (c < lo[r] || c > hi[r]) return BAD;
        if (need > 1) na |= (uint64_t)(need - 1) << 30;
        else done_char = true;
    } else if (esc == ESC_BS) {
        if (c == 'u') na |= (uint64_t)ESC_U0 << 24 | AX_ZERO;
        else if (strchr("\"\\/bfnrt", c) && c) done_char = true;
        else return BAD;
    } else if (esc >= ESC_U0 && esc < ESC_LOW) {
        int k = (int)esc - ESC_U0; /* digits read before this one */
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex) return BAD;
        int v = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
        bool zero = (a & AX_ZERO) && v == 0, hi_flag = false;
        if (k == 0) hi_flag = v == 0xD;
        else if (k == 1 && (a & AX_HI)) {
            if (v >= 0xC) return BAD; /* a lone low surrogate */
            hi_flag = v >= 0x8;
        } else hi_flag = (a & AX_HI) != 0;
        if (k == 3) {
            if (zero) return BAD; /* \u0000: refused by jansson */
            if (hi_flag) na |= (uint64_t)ESC_LOW << 24;
            else done_char = true;
        } else {
            na |= (uint64_t)(esc + 1) << 24 | (zero ? AX_ZERO : 0) | (hi_flag ? AX_HI : 0);
        }
    } else if (esc >= ESC_LOW) {
        int k = (int)esc - ESC_LOW;
        bool ok = k == 0 ? c == '\\' : k == 1 ? c == 'u' : k == 2 ? (c | 0x20) == 'd'
                : k == 3 ? ((c | 0x20) >= 'c' && (c | 0x20) <= 'f')
                         : ((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'));
        if (!ok) return BAD;
        if (k == 5) done_char = true;
        else na |= (uint64_t)(esc + 1) << 24;
    } else if (!sp->raw && c == '"') {
        if ((int32_t)cnt < sp->min) return BAD;
        *closed = true;
        return a;
    } else {
        /* a new character */
        if (!room || c == 0) return BAD;
        if (!sp->raw && c < 0x20) return BAD;
        if (!sp->raw && c == '\\') {
            na |= (uint64_t)ESC_BS << 24;
        } else if (c < 0x80) {
            done_char = true;
        } else {
            unsigned n2, r = 0;
            if (c >= 0xC2 && c <= 0xDF) n2 = 1;
            else if (c >= 0xE0 && c <= 0xEF) n2 = 2, r = c == 0xE0 ? 1 : c == 0xED ? 2 : 0;
            else if (c >= 0xF0 && c <= 0xF4) n2 = 3, r = c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
            else return BAD;
            na |= (uint64_t)n2 << 30 | (uint64_t)r << 32;
        }
    }
    unsigned ps = ac_next[AX_PAT(a)][c];
    if (ac_bad[ps]) return BAD;
    na = (na & ~((uint64_t)0xFF << 40)) | (uint64_t)ps << 40;
    if (done_char && cnt < 0xFFFFFFu) {
        uint32_t nc = cnt + 1;
        /* past both bounds the count no longer matters: saturate so that states repeat */
        if (sp->max < 0 && (int32_t)nc > sp->min) nc = (uint32_t)sp->min;
        na = (na & ~(uint64_t)0xFFFFFF) | nc;
    }
    return na;
}

/* The top frames reached from top frame f by input c go to rt->tmp. */
static void step_frame(gr_rt *rt, int32_t f, int c) {
    const dsf_grammar *g = rt->g;
    frame fr = rt->fr[f];
    gr_elem e = g->el[fr.pos];
    if (e.kind == GE_BYTES) {
        if (c < 256 && (g->sets[e.arg][c >> 3] >> (c & 7) & 1)) closure(rt, fr.pos + 1, fr.parent, 0);
    } else if (e.kind == GE_SYM) {
        if (c == 256 + e.arg) closure(rt, fr.pos + 1, fr.parent, 0);
    } else if (e.kind == GE_STR && c < 256) {
        bool closed;
        uint64_t na = str_step(&g->strs[e.arg], fr.aux, c, &closed);
        if (na == UINT64_MAX) return;
        if (closed) closure(rt, fr.pos + 1, fr.parent, 0);
        else add_top(rt, fr.pos, fr.parent, na, 0);
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t set_hash(const int32_t *v, int n, bool accept) {
    uint64_t h = accept ? 0x1234567ULL : 0x7654321ULL;
    for (int i = 0; i < n; i++) h = mix(h ^ (uint64_t)(uint32_t)v[i]);
    return h;
}

static void sh_rehash(gr_rt *rt) {
    table_grow(&rt->sh, &rt->sh_mask, 256);
    for (int i = 0; i < rt->n_st; i++) {
        const state *s = &rt->st[i];
        size_t h = set_hash(rt->pool + s->off, s->n, s->accept) & rt->sh_mask;
        while (rt->sh[h] >= 0) h = (h + 1) & rt->sh_mask;
        rt->sh[h] = i;
    }
}

/* Interns the set in rt->tmp (sorted, deduplicated here) as a state; -1 if empty. */
static int intern_tmp(gr_rt *rt) {
    int n = rt->n_tmp;
    if (n > 1) {
        qsort(rt->tmp, (size_t)n, sizeof *rt->tmp, cmp_i32);
        int m = 1;
        for (int i = 1; i < n; i++)
            if (rt->tmp[i] != rt->tmp[m - 1]) rt->tmp[m++] = rt->tmp[i];
        n = m;
    }
    bool acc = rt->tmp_accept;
    if (n == 0 && !acc) return -1;
    if (!rt->sh || (size_t)rt->n_st * 2 >= rt->sh_mask) sh_rehash(rt);
    size_t h = set_hash(rt->tmp, n, acc) & rt->sh_mask;
    for (; rt->sh[h] >= 0; h = (h + 1) & rt->sh_mask) {
        const state *s = &rt->st[rt->sh[h]];
        if (s->n == n && s->accept == acc && !memcmp(rt->pool + s->off, rt->tmp, (size_t)n * sizeof *rt->tmp))
            return rt->sh[h];
    }
    while (rt->n_pool + (size_t)n > rt->cap_pool) {
        rt->cap_pool = rt->cap_pool ? 2 * rt->cap_pool : 1024;
        rt->pool = dsf_xrealloc(rt->pool, rt->cap_pool * sizeof *rt->pool);
    }
    memcpy(rt->pool + rt->n_pool, rt->tmp, (size_t)n * sizeof *rt->tmp);
    GROW(rt->st, rt->n_st, rt->cap_st);
    state *s = &rt->st[rt->n_st];
    *s = (state){(int32_t)rt->n_pool, n, acc, acc ? 0 : GR_INF, NULL};
    rt->n_pool += (size_t)n;
    for (int i = 0; i < n; i++) {
        int32_t c = top_cost(rt, rt->tmp[i]);
        if (c < s->cost) s->cost = c;
    }
    rt->sh[h] = rt->n_st;
    return rt->n_st++;
}

gr_rt *gr_rt_new(const dsf_grammar *g) {
    pthread_once(&ac_once, ac_build);
    gr_rt *rt = dsf_xcalloc(1, sizeof *rt);
    rt->g = g;
    rt->stamp = 1;
    const gr_rule *r = &g->rules[g->root];
    for (int a = 0; a < r->nalt; a++) closure(rt, g->alts[r->alt0 + a], -1, 0);
    rt->start = intern_tmp(rt);
    rt->n_tmp = 0;
    return rt;
}

void gr_rt_free(gr_rt *rt) {
    if (!rt) return;
    for (int i = 0; i < rt->n_st; i++) free(rt->st[i].next);
    free(rt->st);
    free(rt->fr);
    free(rt->fh);
    free(rt->pool);
    free(rt->sh);
    free(rt->tmp);
    free(rt);
}

int gr_rt_start(gr_rt *rt) { return rt->start; }

int gr_rt_next(gr_rt *rt, int s, int c) {
    if (s < 0 || c < 0 || c >= GR_N_INPUT) return -1;
    state *st = &rt->st[s];
    if (!st->next) {
        st->next = dsf_xmalloc(GR_N_INPUT * sizeof *st->next);
        for (int i = 0; i < GR_N_INPUT; i++) st->next[i] = -2;
        rt->next_bytes += GR_N_INPUT * sizeof *st->next;
    }
    if (st->next[c] != -2) return st->next[c];
    rt->n_tmp = 0;
    rt->tmp_accept = false;
    rt->stamp++;
    int32_t off = st->off, n = st->n; /* rt->st may move while interning */
    for (int i = 0; i < n; i++) step_frame(rt, rt->pool[off + i], c);
    int t = intern_tmp(rt);
    rt->st[s].next[c] = t;
    return t;
}

int gr_rt_cost(gr_rt *rt, int s) { return s < 0 ? GR_INF : rt->st[s].cost; }

bool gr_rt_done(gr_rt *rt, int s) { return s >= 0 && rt->st[s].accept && rt->st[s].n == 0; }

size_t gr_rt_bytes(const gr_rt *rt) {
    return rt->next_bytes + (size_t)rt->cap_fr * sizeof(frame) + (size_t)rt->cap_st * sizeof(state) +
           rt->cap_pool * sizeof(int32_t) + (rt->fh_mask + 1 + rt->sh_mask + 1) * sizeof(int32_t);
}

int gr_match_text(const dsf_grammar *g, const char *text, size_t len, size_t *at) {
    gr_rt *rt = gr_rt_new(g);
    int s = gr_rt_start(rt);
    size_t i = 0;
    while (s >= 0 && i < len) {
        int c = (unsigned char)text[i], k = 1;
        for (int y = 0; y < GR_N_SYM; y++) {
            size_t sl = strlen(sym_text[y]);
            if (len - i >= sl && !memcmp(text + i, sym_text[y], sl)) {
                c = 256 + y, k = (int)sl;
                break;
            }
        }
        s = gr_rt_next(rt, s, c);
        if (s >= 0) i += (size_t)k;
    }
    if (at) *at = i;
    int rc = s < 0 ? -1 : gr_rt_done(rt, s) ? 1 : 0;
    gr_rt_free(rt);
    return rc;
}
