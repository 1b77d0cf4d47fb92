/* safetensors.h: a hostile-input reader for Hugging Face safetensors checkpoints, single
 * file (`model.safetensors`) or sharded (`model.safetensors.index.json` + shards).
 *
 * Format: u64 LE header length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]},
 * "__metadata__": {...}}, then the data section; offsets are relative to its start.
 * Every header is validated when the checkpoint is opened: header length against the file
 * size and a sanity cap, JSON syntax, duplicate names, known dtypes, shape products against
 * the byte range, ranges inside the file and not overlapping. Tensor data is never held:
 * callers read byte ranges with st_read() (pread) into their own bounded buffers, so
 * memory and RSS stay small whatever the checkpoint size. */
#ifndef DSF_SAFETENSORS_H
#define DSF_SAFETENSORS_H

#include <stdint.h>

enum st_dtype {
    ST_F8_E4M3 = 0, ST_F8_E8M0, ST_I8, ST_U8, ST_BF16, ST_F16, ST_F32, ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;     /* NUL-terminated, owned by the checkpoint */
    int dtype;            /* enum st_dtype */
    int n_dims;           /* 0 = scalar */
    int64_t shape[ST_MAX_DIMS]; /* torch order: shape[n_dims-1] is the contiguous one */
    uint64_t nelem;
    uint64_t nbytes;
    int shard;            /* index into the checkpoint's shard list */
    uint64_t offset;      /* absolute file offset of the first byte */
} st_tensor;

typedef struct st_checkpoint st_checkpoint;

/* Opens dir/model.safetensors.index.json if present (every shard it names must exist and
 * hold exactly the tensors the index assigns to it), else dir/model.safetensors. Returns
 * NULL with err on any problem. */
st_checkpoint *st_open_dir(const char *dir, char *err);
/* Opens one safetensors file. */
st_checkpoint *st_open_file(const char *path, char *err);
void st_close(st_checkpoint *c);

int st_count(const st_checkpoint *c);
/* Tensors in checkpoint order: shards in sorted file-name order, then header order. */
const st_tensor *st_at(const st_checkpoint *c, int i);
const st_tensor *st_find(const st_checkpoint *c, const char *name);
const char *st_dtype_name(int dtype);
uint32_t st_dtype_size(int dtype);

/* Reads n bytes at byte offset off within tensor t into buf. 0 / -1 with err (a short read
 * means the shard was truncated after it was opened). */
int st_read(const st_checkpoint *c, const st_tensor *t, uint64_t off, uint64_t n, void *buf, char *err);
/* Tells the kernel the byte range [off, off+n) of t will not be read again (page cache
 * hint only; never fails). */
void st_release(const st_checkpoint *c, const st_tensor *t, uint64_t off, uint64_t n);

#endif
