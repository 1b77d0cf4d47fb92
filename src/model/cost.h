/* cost.h: weight bytes and matmul FLOPs per token of a deepseek41 model (cost.c), for
 * `dsflash bench`. Counts, not measurements. */
#ifndef DSF_COST_H
#define DSF_COST_H

#include <stdint.h>

#include "model/session.h"

/* Weight bytes and matmul FLOPs (2 x the weight elements) one decoded token touches in the
 * file at path, before the indexer adjustment below; head_flops: the LM head's share of the
 * FLOPs. Returns 0, or -1 with err set (a file that cannot be opened, or no expert counts). */
int cost_token(const char *path, double *bytes, double *flops, double *head_flops, char *err);
/* il_bytes[il], il_flops[il] ([n_layer] each): what layer il's indexer query projections add
 * to a token that computes them. */
void cost_index_proj(const dsf_engine *e, double *il_bytes, double *il_flops);
/* The FLOPs of a prefill of n_prompt tokens in ss's chunks: every matmul for every token, the
 * LM head for the last one only, the indexer projections only in the chunks that compute them. */
double cost_prefill_flops(const dsf_session *ss, int n_prompt, double tok_flops, double head_flops,
                          const double *il_flops);
/* The weight bytes of the decode step at position pos. */
double cost_decode_bytes(const dsf_session *ss, int64_t pos, double tok_bytes, const double *il_bytes);

#endif
