/* generate.h: the generation loop (runtime layer). A dsf_gen binds one engine, one session
 * and one tokenizer; it prefills a prompt (reusing the session's cached prefix), then decodes
 * token by token: sample -> detokenize (whole UTF-8 characters only) -> stop strings ->
 * text callback and, optionally, the DSML parser's typed events.
 *
 * The public API (dsf_gen_*) is declared in include/dsflash.h, section @generate; this
 * header only adds what src/runtime/generate.c defines beyond it. See dsflash.h for the
 * contracts. */
#ifndef DSF_GENERATE_H
#define DSF_GENERATE_H

#include "dsflash.h"

/* Most top logprobs a caller may ask for per token (OpenAI's limit). */
#define DSF_GEN_MAX_LOGPROBS 20

/* The EOS id: the tokenizer's eos, else the id of "<｜end▁of▁sentence｜>"; -1 if neither. */
int32_t gen_resolve_eos(const dsf_tokenizer *tok);

/* ---- hooks for the speculative loop (src/runtime/spec.c); nothing else uses them ---- */

/* round: replaces "evaluate tok, then dsf_gen_next" in dsf_gen_decode (tok: the pending
 * token; returns like dsf_gen_next). prefilled: called when a prefill completes (the session
 * holds the prompt; the first n_cached tokens were reused). Either may be NULL. */
typedef struct {
    dsf_finish_reason (*round)(void *ud, dsf_gen *g, int32_t tok, int32_t *next, char *err);
    int (*prefilled)(void *ud, dsf_gen *g, int n_cached, int n_prompt, char *err);
    void *ud;
} gen_hooks;
/* Installs h (copied; NULL removes them). */
void gen_set_hooks(dsf_gen *g, const gen_hooks *h);
dsf_session *gen_session(dsf_gen *g);
/* Ids that can be sampled (min of the model's and the tokenizer's vocabulary). */
int gen_n_vocab(const dsf_gen *g);
/* The running generation's sampler parameters (eos resolved) and rng state. */
const dsf_sampler_params *gen_sampler(const dsf_gen *g);
uint64_t *gen_rng(dsf_gen *g);
/* The generator's logits buffer ([n_vocab of the model]). */
float *gen_logits(dsf_gen *g);
/* True while the generation runs under a grammar (dsf_gen_params.grammar): the speculative
 * loop then takes plain steps, since its accept rule does not apply the grammar's masks. */
bool gen_constrained(const dsf_gen *g);
/* Polls the cancel callback as dsf_gen_next does before a token: DSF_FINISH_CANCELLED (the
 * generation is over) or DSF_FINISH_NONE. */
dsf_finish_reason gen_poll_cancel(dsf_gen *g);
/* dsf_gen_next after its sampling: commits the token id chosen elsewhere (logits: the row it
 * was chosen from, for logprobs), with the same detokenize / callbacks / stop / EOS /
 * max_tokens / context handling. The context check reads the session's n_past, which must
 * then hold the tokens before id, as in the plain loop. */
dsf_finish_reason gen_push(dsf_gen *g, const float *logits, int32_t id, int32_t *tok_to_eval, char *err);

#endif
