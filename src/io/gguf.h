/* gguf.h: GGUF v2/v3 reader over mmap, and a streaming writer (shared with the converter
 * and `dsflash synth`).
 *
 * The reader treats the file as hostile (gguf-layout.md §1.3): every length and offset is
 * checked against the file size and every product for overflow; duplicate keys and tensor
 * names, bad alignment, unknown or retired types, ne0 not a multiple of the block size,
 * non-contiguous tensor offsets and data past the end of the file are all refused with a
 * message naming the key or tensor. Loading reads the header only: tensor data is never
 * touched (pages fault in lazily when a kernel reads them).
 *
 * Lifetime: every pointer returned by the reader (names, strings, tensor data) points into
 * the mapping or into tables owned by the gguf_file, and is valid until gguf_close(). */
#ifndef DSF_GGUF_H
#define DSF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h" /* enum ggml_type: the tensor type ids */

/* GGUF value types (gguf-layout.md §1.2). */
enum gguf_vtype {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT = 13
};

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64 /* names must be < 64 bytes */
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const char *ptr; /* into the mapping; NOT NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct {
    const char *key;     /* NUL-terminated copy owned by the gguf_file */
    uint32_t type;       /* enum gguf_vtype */
    /* Scalars (type != STRING/ARRAY): the value widened; exactly one of these is meaningful
     * according to type (unsigned types -> u, signed -> i, FLOAT32/64 -> f, BOOL -> u 0/1). */
    uint64_t u;
    int64_t i;
    double f;
    gguf_str str;        /* type == STRING */
    /* type == ARRAY: element type, count, and the raw little-endian elements in the mapping
     * (for non-string element types). For string arrays, strs[0..n) is filled instead. */
    uint32_t arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    gguf_str *strs;
} gguf_kv;

typedef struct {
    const char *name;     /* NUL-terminated copy owned by the gguf_file */
    uint32_t type;        /* enum ggml_type */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] fastest; unused dims are 1 */
    uint64_t offset;      /* relative to the data section */
    uint64_t nbytes;      /* exact size of the data */
    uint64_t row_bytes;   /* bytes of one ne[0] row */
    const uint8_t *data;  /* into the mapping (NULL: past the end of a file opened by gguf_open_header) */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t data_offset;  /* file offset of the data section */
    const uint8_t *map;
    uint64_t size;
    char *path;
    int fd;                /* the file, kept open for pread (gguf_open), or -1 (gguf_open_mem) */
    void *priv;            /* reader-private state (hash tables etc.) */
} gguf_file;

/* Opens and validates a GGUF file (mmap, read-only, MAP_SHARED). Returns NULL on error with
 * the reason in err (DSF_ERR_LEN), e.g. "model.gguf: tensor 'blk.3.x.weight': data
 * [offset 1024, 4096 bytes] runs past the end of the file (3000 bytes)". */
gguf_file *gguf_open(const char *path, char *err);
/* The header alone (the tables of keys and tensors, every check but one): tensor data may lie
 * past the end of the file, as in a header-only file or a file still being written, and such a
 * tensor has data == NULL. For the questions a header answers (dsflash inspect --plan); never
 * for a model that runs. */
gguf_file *gguf_open_header(const char *path, char *err);
/* Same, over a caller-owned memory buffer (used by the fuzzer and tests). The buffer must
 * outlive the gguf_file. */
gguf_file *gguf_open_mem(const void *data, uint64_t size, const char *name, char *err);
void gguf_close(gguf_file *f);

/* Bytes [src, src + n) of the mapping, for tables read a row at a time at random (the token
 * embeddings, the Engram table): returns buf filled by pread when the file is open and the
 * span fits buf (cap bytes), else src itself (then the caller reads through the mapping). A
 * first touch through the mapping is a page fault per page (~20 us under a hypervisor), where
 * a pread of a cached page costs ~1 us. nowait: only if that needs no disk read (all of it in
 * the page cache, preadv2 RWF_NOWAIT); returns NULL where it would (or where the kernel cannot
 * tell), and the caller then asks for it the blocking way. */
const uint8_t *gguf_read_span(const gguf_file *f, const uint8_t *src, size_t n, uint8_t *buf, size_t cap, bool nowait);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Type-strict getters (gguf-layout.md §1.6): return 0 if found with the exact type, 1 if the
 * key is absent (out untouched), -1 with a message if it has another type. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, char *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err);
/* String: out receives a malloc'ed NUL-terminated copy (refused if it contains NUL). */
int gguf_get_str(const gguf_file *f, const char *key, char **out, char *err);
/* Integer arrays: accepts INT32/UINT32 (and, for u64, UINT64/INT64) element types with
 * non-negative values where unsigned; *out is malloc'ed; *n the count. */
int gguf_get_arr_u32(const gguf_file *f, const char *key, uint32_t **out, uint64_t *n, char *err);
int gguf_get_arr_i32(const gguf_file *f, const char *key, int32_t **out, uint64_t *n, char *err);
int gguf_get_arr_u64(const gguf_file *f, const char *key, uint64_t **out, uint64_t *n, char *err);
int gguf_get_arr_f32(const gguf_file *f, const char *key, float **out, uint64_t *n, char *err);

const char *gguf_vtype_name(uint32_t t);
/* Byte size of a fixed-size value type; 0 for STRING/ARRAY/unknown. */
uint32_t gguf_vtype_size(uint32_t t);

/* ---- writer --------------------------------------------------------------------------
 * Streaming writer. Usage: gguf_writer_new(); add KVs and tensor infos (name, type, ne)
 * in any order; gguf_writer_begin(path) writes the header; then gguf_writer_write() the
 * tensor data in the order the infos were added (chunks may be split arbitrarily);
 * gguf_writer_finish() pads, flushes, fsyncs and closes. Alignment 32, version 3.
 * All functions return 0 / -1 with err. The writer never holds tensor data. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
int gguf_writer_kv_u32(gguf_writer *w, const char *key, uint32_t v, char *err);
int gguf_writer_kv_i32(gguf_writer *w, const char *key, int32_t v, char *err);
int gguf_writer_kv_u64(gguf_writer *w, const char *key, uint64_t v, char *err);
int gguf_writer_kv_f32(gguf_writer *w, const char *key, float v, char *err);
int gguf_writer_kv_bool(gguf_writer *w, const char *key, bool v, char *err);
int gguf_writer_kv_str(gguf_writer *w, const char *key, const char *v, char *err);
/* Any numeric scalar type (not STRING/ARRAY): vtype_size(vtype) raw little-endian bytes. */
int gguf_writer_kv_scalar(gguf_writer *w, const char *key, uint32_t vtype, const void *le_value, char *err);
/* Arrays: elements given as raw little-endian values of elem_type (not STRING). */
int gguf_writer_kv_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                       uint64_t n, char *err);
int gguf_writer_kv_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                           const uint64_t *lens, uint64_t n, char *err);
/* Copies kv (read by gguf_open) with its type and value; strings with a NUL byte and empty
 * arrays are refused. */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv, char *err);
int gguf_writer_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, char *err);
int gguf_writer_begin(gguf_writer *w, const char *path, char *err);
int gguf_writer_write(gguf_writer *w, const void *data, uint64_t n, char *err);
int gguf_writer_finish(gguf_writer *w, char *err);
/* Instead of writing data: flushes the header (with every tensor's offset) and closes, leaving a
 * header-only file that gguf_open_header reads and gguf_open refuses (synth --header-only). */
int gguf_writer_finish_header(gguf_writer *w, char *err);

#endif
