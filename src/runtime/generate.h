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

/* Default number of tokens per eval during prefill (one progress callback per chunk). */
#define DSF_GEN_PREFILL_CHUNK 64
/* Most top logprobs a caller may ask for per token (OpenAI's limit). */
#define DSF_GEN_MAX_LOGPROBS 20

/* The EOS id: the tokenizer's eos, else the id of "<｜end▁of▁sentence｜>"; -1 if neither. */
int32_t gen_resolve_eos(const dsf_tokenizer *tok);

#endif
