/* engram_cache.h: a bounded, thread-safe cache of Engram table rows (engram_cache.c), keyed by
 * the row's index in per_layer_token_embd. Not a public interface.
 *
 * It holds RAW rows (the file's bytes, any row type), not decoded ones: a BF16 row is half the
 * size of its fp32 values and an FP8_R264 row about a quarter, so the same megabytes hold 2-4x
 * the rows, and dequant_row of one row costs far less than the pread it saves. Eviction is
 * CLOCK (one reference bit per slot): a hit costs no list surgery under the lock.
 *
 * Memory: every array is sized at creation from the byte budget and never grows; the slots'
 * pages are touched only as rows arrive. engram_cache_bytes() <= the budget, always. */
#ifndef DSF_ENGRAM_CACHE_H
#define DSF_ENGRAM_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct engram_cache engram_cache;

/* A cache of rows of row_bytes bytes in at most max_bytes of memory (slots, keys, bits and the
 * hash table together), holding no more than max_rows rows (the table's size: more would never
 * fill). NULL when the budget does not hold a single row (the caller then runs without). */
engram_cache *engram_cache_new(uint64_t max_bytes, uint64_t row_bytes, int64_t max_rows);
void engram_cache_free(engram_cache *c);

/* Copies row `row` (row_bytes) into dst and marks it recently used; false (dst untouched) if
 * the cache does not hold it. Thread-safe. */
bool engram_cache_get(engram_cache *c, int64_t row, uint8_t *dst);
/* Stores a copy of row `row` (row >= 0), evicting the first slot the CLOCK hand finds without
 * its reference bit when full. A row already held is left as it is. Thread-safe. */
void engram_cache_put(engram_cache *c, int64_t row, const uint8_t *src);

/* The memory the cache holds (fixed at creation), its capacity in rows and the rows it holds. */
uint64_t engram_cache_bytes(const engram_cache *c);
int64_t engram_cache_capacity(const engram_cache *c);
int64_t engram_cache_rows(engram_cache *c);

#endif
