/* snapshot.h: what snapshot.c offers the rest of src/model besides the public
 * dsf_session_save/restore (dsflash.h). */
#ifndef DSF_SNAPSHOT_H
#define DSF_SNAPSHOT_H

#include <stdint.h>

#include "io/gguf.h"

/* The id of a model's header (keys + tensor table: the bytes before the tensor data),
 * recorded in every snapshot; engine.c stores it in e->model_id at open. */
uint64_t snapshot_model_id(const gguf_file *g);

#endif
