/* engram_io.h: the Engram table's rows read from the file by a small pool of reader threads
 * (engram_io.c), ahead of the layers that use them. Not a public interface.
 *
 * The hash of an Engram row depends only on the tokens and positions (architecture.md §4.2.3),
 * so a forward knows every module's rows before its first layer: forward_tokens starts the
 * reads of every module at once (engram_start), the readers pread them while layers
 * 0 .. engram layer - 1 compute, and engram_forward waits only for its own module's rows. The
 * table is ~200 GB on the real model: mostly not in the page cache (docs/perf-log.md, item 42).
 *
 * Two objects:
 *   - engram_io, one per engine: the reader threads (not the compute pool: they block in the
 *     kernel, not on the cores), their job queue, the hot-row cache (engram_cache.h) and the
 *     read statistics;
 *   - engram_req, one per session scratch: for each module, the chunk's hashed rows, their
 *     sorted unique set and the raw bytes read for it, sized once for max_chunk tokens.
 * Rows are read as raw bytes of the tensor's row_bytes: nothing here knows the row type. */
#ifndef DSF_ENGRAM_IO_H
#define DSF_ENGRAM_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct engram_io engram_io;
typedef struct engram_req engram_req;

#define ENGRAM_READERS_DEFAULT 8
#define ENGRAM_CACHE_MB_DEFAULT 256

/* Readers of a table of n_rows rows of row_bytes bytes at file offset off of fd (fd < 0: the
 * rows are copied from base instead, a table in memory: gguf_open_mem). n_readers threads (0:
 * none; the waiting forward then reads every row itself), a cache of at most cache_bytes (0:
 * none). The fd stays the caller's. NULL with err if a thread cannot start. */
engram_io *engram_io_new(int fd, const uint8_t *base, uint64_t off, uint64_t row_bytes, int64_t n_rows, int n_readers,
                         uint64_t cache_bytes, char *err);
/* Stops and joins the readers. Every request must have been waited for (forward does). */
void engram_io_free(engram_io *io);
int engram_io_readers(const engram_io *io);
uint64_t engram_io_cache_bytes(const engram_io *io);

/* Room for n_modules modules of up to max_rows hashed rows each; *bytes grows by the size. */
engram_req *engram_req_new(const engram_io *io, int n_modules, int64_t max_rows, size_t *bytes);
void engram_req_free(engram_req *r);
/* Where the caller writes module m's hashed rows before engram_io_start (max_rows of them). */
int64_t *engram_req_rows(engram_req *r, int m);

/* Queues the reads of module m's first n hashed rows: sorts and de-duplicates them, then the
 * readers take the unique rows in queue order (earlier modules first). Not thread-safe per r. */
void engram_io_start(engram_io *io, engram_req *r, int m, int64_t n);
/* Returns when every unique row of module m is read, reading unclaimed ones itself meanwhile.
 * 0, or -1 with err naming the row, the file offset and the cause (a short read: the file is
 * shorter than its header says; an I/O error) when a read failed: its bytes are then zeros
 * and the forward must not be trusted. Without a start for m (n = 0) it returns 0 at once. */
int engram_io_wait(engram_io *io, engram_req *r, int m, char *err);
/* The raw bytes of module m's hashed row i (after engram_io_wait). */
const uint8_t *engram_req_row(const engram_req *r, int m, int64_t i);
/* Whether module m's reads were started and not yet waited for. */
bool engram_req_started(const engram_req *r, int m);
/* Modules started and not yet waited for (0 after every forward). */
int engram_req_pending(const engram_req *r);
/* The first failure engram_io_wait reported since the last call: -1 with its message (and
 * clears it), or 0. The forward's caller asks once per forward. */
int engram_req_take_error(engram_req *r, char *err);

/* What the readers did since the last reset (bench reports it per token). Times are seconds of
 * the monotonic clock: read_s is the time during which some module had a row claimed and not
 * all its rows read (the union of the modules' read intervals, first claim to last row);
 * wait_s sums the time engram_io_wait spent reading or blocked. read_s - wait_s is what the
 * layers before each Engram layer hid. */
typedef struct {
    uint64_t modules, rows, unique, cache_hits, preads, bytes;
    double read_s, wait_s;
} engram_io_stats;
void engram_io_get_stats(engram_io *io, engram_io_stats *out);
void engram_io_reset_stats(engram_io *io);

#endif
