/* residency.h: where an open engine's weights live (residency.c): page advice on the file
 * mapping, the repacked routed experts and the dense weights copied into memory.
 * Internal to src/model: engine.c calls it while opening and closing an engine. */
#ifndef DSF_RESIDENCY_H
#define DSF_RESIDENCY_H

#include "model/model.h"

/* MADV_HUGEPAGE on the mapping, MADV_NOHUGEPAGE on the tables read a row at a time. */
void residency_advise_pages(const gguf_file *g);
/* Repacks the routed experts (e->repack_map) when p->repack and the auto rule allow it;
 * needs e->pool and e->kern. Leaves them in the file on any failure. */
void residency_repack_experts(dsf_engine *e, const dsf_engine_params *p);
/* Copies the dense weights (e->dense_map) when p->resident and the auto rule allow it;
 * call after residency_repack_experts (the auto rule counts the repacked copy). */
void residency_copy_dense(dsf_engine *e, const dsf_engine_params *p);
/* Unmaps both copies (the weights that pointed into them are gone with the engine). */
void residency_free(dsf_engine *e);

#endif
