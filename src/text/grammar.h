/* grammar.h: constrained decoding, module interface (text layer). The public API
 * (dsf_grammar_*) is in dsflash.h; this header holds what the three files share:
 *   - grammar_schema.c compiles a constraint spec (a JSON schema, or the DSML tool-calls block
 *     of a set of tools; spec chat-format.md §3.1) into a context-free grammar over bytes and
 *     three special-token symbols (struct dsf_grammar, immutable once built);
 *   - grammar.c runs it: a lazily built DFA whose states are sets of interned parse stacks
 *     (gr_rt), with the shortest completion of each state (the budget);
 *   - grammar_vocab.c lifts it to tokens: a byte trie of the vocabulary walked with the DFA,
 *     per-state token masks with a cache, and the budget restriction (gr_matcher).
 * Layout of the grammar: rule r has alternatives alts[rules[r].alt0 .. + nalt], each an
 * offset into el[] where a sequence of elements ends with GE_END. */
#ifndef DSF_GRAMMAR_H
#define DSF_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsflash.h"

/* Special-token symbols (atomic: the token, never its bytes). */
enum { GR_SYM_EOS = 0, GR_SYM_DSML, GR_SYM_THINK_END, GR_N_SYM };
#define GR_N_INPUT (256 + GR_N_SYM) /* a byte, or 256 + symbol */
#define GR_INF (1 << 29)            /* cost of what cannot complete */

enum { GE_END = 0, GE_BYTES, GE_SYM, GE_REF, GE_STR };

typedef struct {
    uint8_t kind;
    int32_t arg; /* GE_BYTES: byte-set index; GE_SYM: symbol; GE_REF: rule; GE_STR: string spec */
} gr_elem;

/* A run of text with a length in code points [min, max] (max < 0: none). json: a JSON string
 * body with escapes, ended by its closing quote (part of the element); raw: UTF-8 text without
 * escapes (DSML string="true" values, the reasoning), ended by whatever follows it. Both refuse
 * NUL, invalid UTF-8 and the marker strings (gr_marker_*), so the output parses. */
typedef struct {
    int32_t min, max;
    bool raw;
} gr_strspec;

typedef struct {
    int32_t alt0, nalt;
} gr_rule;

struct dsf_grammar {
    gr_elem *el;
    int n_el, cap_el;
    int32_t *alts;
    int n_alts, cap_alts;
    gr_rule *rules;
    int n_rules, cap_rules;
    uint8_t (*sets)[32]; /* byte sets (bitmaps) */
    int n_sets, cap_sets;
    gr_strspec *strs;
    int n_strs, cap_strs;
    int32_t root;
    int32_t *rem;  /* [n_el] fewest symbols from el[i] to the end of its alternative */
    int32_t *rmin; /* [n_rules] fewest symbols that complete the rule */
    int32_t sym_id[GR_N_SYM]; /* token ids (-1: no tokenizer given) */
    int min_tokens;           /* shortest complete output, in tokens */
};

/* ---- grammar.c: construction helpers used by the compiler ---- */
int gr_rule_new(dsf_grammar *g);
/* Sets rule r's alternatives: n sequences, seq[i] with len[i] elements (GE_END appended). */
void gr_rule_set(dsf_grammar *g, int r, gr_elem *const *seq, const int *len, int n);
int gr_set_index(dsf_grammar *g, const uint8_t set[32]);
int gr_str_index(dsf_grammar *g, int32_t min, int32_t max, bool raw);
/* Computes rem/rmin and the shortest output (min_tokens); -1 with err if the root cannot
 * complete (the schema admits no value). */
int gr_finalize(dsf_grammar *g, char *err);

/* Whether text[0..n) contains a marker string (which no text run may spell). */
bool gr_has_marker(const char *text, size_t n);

/* ---- grammar_schema.c ---- */
/* Compiles spec (see dsf_grammar_new) into g (empty on entry); -1 with err naming the field. */
int gr_compile(dsf_grammar *g, const char *spec_json, size_t len, char *err);

/* ---- grammar.c: the runtime (dynamic state of one generation or one test) ---- */
typedef struct gr_rt gr_rt;
gr_rt *gr_rt_new(const dsf_grammar *g);
void gr_rt_free(gr_rt *rt);
/* The start state (>= 0). */
int gr_rt_start(gr_rt *rt);
/* The state after input c (a byte, or 256 + symbol) from state s; -1 if c is not allowed. */
int gr_rt_next(gr_rt *rt, int s, int c);
/* Fewest symbols (bytes or special tokens) that complete state s (0 once EOS was taken). */
int gr_rt_cost(gr_rt *rt, int s);
/* Whether the whole output is complete in s (EOS consumed). */
bool gr_rt_done(gr_rt *rt, int s);
/* Memory the runtime holds (frames, states, transition tables), for the cache limits. */
size_t gr_rt_bytes(const gr_rt *rt);
/* Runs text through the grammar, reading the special tokens' strings in it as symbols
 * ("｜DSML｜", "</think>", "<｜end▁of▁sentence｜>"). Returns 1 if the text is a complete output,
 * 0 if it is a proper prefix of one, -1 if it is rejected (*at: the byte offset). */
int gr_match_text(const dsf_grammar *g, const char *text, size_t len, size_t *at);

/* ---- grammar_vocab.c: tokens ---- */
/* The byte trie of a tokenizer's ordinary tokens; built once per tokenizer on first use and
 * freed with it (attached as the tokenizer's cache, whose free pointer calls gr_vocab_free). */
struct gr_vocab;
void gr_vocab_free(struct gr_vocab *v);
typedef struct gr_matcher gr_matcher;
/* A matcher for one generation (the grammar and tokenizer must outlive it). NULL with err
 * when the grammar needs a special token the tokenizer lacks. */
gr_matcher *gr_matcher_new(const dsf_grammar *g, const dsf_tokenizer *tok, char *err);
void gr_matcher_free(gr_matcher *m);
/* out[i] = logits[i] where token i is allowed in the current state with budget tokens left
 * (this one included), else -INFINITY. Returns the number of allowed tokens (0: none). */
int gr_matcher_mask(gr_matcher *m, const float *logits, float *out, int n_vocab, int budget);
/* Advances by token id; -1 if it was not allowed. */
int gr_matcher_accept(gr_matcher *m, int32_t id);
/* Fewest tokens that complete the output from the current state (GR_INF: dead). */
int gr_matcher_cost(const gr_matcher *m);
/* The allowed token ids of the current state (ids room for n_vocab); returns the count. */
int gr_matcher_allowed(gr_matcher *m, int budget, int32_t *ids, int cap);

#endif
