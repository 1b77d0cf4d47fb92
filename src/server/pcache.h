/* pcache.h: the disk prefix cache of `dsflash serve --cache-dir` (server layer), pure storage.
 *
 * An entry is an opaque byte string (a dsf_session_save snapshot) stored under the key of a
 * token prefix: a 128-bit hash of (the model's state identity, the tokens). One entry is one
 * file DIR/<32 hex digits of the key>.dsfpc: a 64-byte header (magic, version, the key, the
 * identity, the token count, the payload length and checksum, the header's own checksum)
 * followed by the payload. The index in memory (key, tokens, bytes, last use) is rebuilt from
 * the headers when the cache opens; the files' modification times carry the LRU order across
 * restarts.
 *
 * Owns: keys, the files (atomic writes: DIR/<key>.tmp, fsync, rename, fsync of DIR), the index,
 * eviction (least recently used first while the bytes exceed the budget), the writer thread,
 * the detection of corrupted, truncated or foreign entries (deleted and logged, never
 * returned) and the counters (pcache_stats).
 * Must not: know sessions, slots or HTTP (callers hand it bytes and tokens); block its caller
 * on a write (pcache_put queues, the writer thread writes).
 * Thread safety: every function may be called from any thread (one mutex inside, never held
 * across file I/O); one process per DIR (an flock on DIR/.lock refuses a second).
 * Invariant: a file named <key>.dsfpc exists only complete (rename is the last step), and
 * pcache_load returns only bytes whose key, identity, length and checksum all match. */
#ifndef DSF_PCACHE_H
#define DSF_PCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pcache pcache;

/* The key of a token prefix. */
typedef struct {
    uint64_t hi, lo;
} pcache_key;

/* Incremental key computation: the key of tokens[0..n) after n pushes. */
typedef struct {
    uint64_t a, b;
    uint32_t n;
} pcache_hasher;

void pcache_hasher_init(pcache_hasher *h, uint64_t ident);
void pcache_hasher_push(pcache_hasher *h, int32_t token);
/* A position with its content key (dsf_media.keys: 0 for text, the image's hash on a span
 * position): key 0 hashes exactly as pcache_hasher_push, so text prefixes keep their keys;
 * a non-zero key is mixed in, so the same ids with another image give another key. */
void pcache_hasher_push_media(pcache_hasher *h, int32_t token, uint64_t key);
pcache_key pcache_hasher_key(const pcache_hasher *h);
pcache_key pcache_key_of(uint64_t ident, const int32_t *tokens, int n);
/* The key of tokens[0..n) with their content keys (NULL: all text). */
pcache_key pcache_key_of_media(uint64_t ident, const int32_t *tokens, const uint64_t *keys, int n);

/* Counters since the cache opened, and its current size (for /metrics). */
typedef struct {
    uint64_t hits;          /* entries loaded and returned */
    uint64_t misses;        /* lookups that found no entry */
    uint64_t stores;        /* entries written */
    uint64_t bytes_written; /* file bytes written by those */
    uint64_t evictions;     /* entries deleted to stay within the budget */
    uint64_t discarded;     /* entries found corrupted, truncated or unusable, deleted */
    uint64_t dropped;       /* puts not written: duplicate, larger than the budget, queue full, write error */
    uint64_t entries;       /* entries now */
    uint64_t bytes;         /* their file bytes now */
    uint64_t queued_bytes;  /* bytes waiting for the writer */
} pcache_stats;

/* Opens (creating it if needed) DIR as a cache of at most max_bytes file bytes for a model of
 * state identity `ident` (dsf_engine_state_id). Removes stale DIR/ *.tmp files (a write cut by a
 * crash), indexes the entries (any identity: the budget covers the whole DIR) after checking
 * their headers (a bad one is deleted and logged), evicts down to the budget and starts the
 * writer thread. NULL with err on failure (not a directory, not writable, in use). */
pcache *pcache_open(const char *dir, uint64_t max_bytes, uint64_t ident, char *err);
/* Writes what is queued, stops the writer and frees everything (NULL: nothing). */
void pcache_close(pcache *c);
/* Blocks until every put queued so far is written (or dropped). */
void pcache_flush(pcache *c);

/* The longest entry of this cache's identity whose tokens are a prefix of tokens[0..n_max):
 * its token count (0: none) with *key and *bytes (the payload length) set. Counts a miss when
 * there is none. Does not read the file. */
int pcache_lookup(pcache *c, const int32_t *tokens, int n_max, pcache_key *key, uint64_t *bytes);
/* pcache_lookup over tokens with their content keys (NULL: all text). */
int pcache_lookup_media(pcache *c, const int32_t *tokens, const uint64_t *keys, int n_max, pcache_key *key,
                        uint64_t *bytes);
/* Reads the entry: its payload (malloc'ed, *data, *len) after checking the file's header
 * against the key, the identity and n_tokens, and the payload against its length and checksum.
 * A failed check deletes the entry and logs why; -1 with err (also when the entry is gone).
 * Marks the entry most recently used. */
int pcache_load(pcache *c, pcache_key key, int n_tokens, uint8_t **data, size_t *len, char *err);
/* Deletes an entry whose payload the caller found unusable (reason: logged). */
void pcache_discard(pcache *c, pcache_key key, const char *reason);
/* Queues data[0..len) (taken over: freed by the cache) as the entry of key (n_tokens tokens)
 * for the writer thread; returns at once. Dropped when the key is already stored or queued,
 * when the entry alone exceeds the budget or when the queue holds more than its limit. */
void pcache_put(pcache *c, pcache_key key, int n_tokens, uint8_t *data, size_t len);
/* NULL c: all zeros. */
void pcache_get_stats(pcache *c, pcache_stats *out);

/* ---- the entry header (also for the fuzz target) ---- */

#define PCACHE_HDR_BYTES 64

typedef struct {
    uint32_t version;
    uint32_t n_tokens;
    pcache_key key;
    uint64_t ident;
    uint64_t payload_len;
    uint64_t payload_sum;
} pcache_hdr;

/* Serializes h (with its checksum) into out[PCACHE_HDR_BYTES]. */
void pcache_hdr_write(const pcache_hdr *h, uint8_t out[PCACHE_HDR_BYTES]);
/* Parses the first n bytes of an entry file of file_size bytes: magic, version, checksum,
 * n_tokens >= 1, payload_len >= 1 and == file_size - PCACHE_HDR_BYTES (a truncated or
 * extended file fails). 0, or -1 with err naming the field. */
int pcache_hdr_parse(const uint8_t *p, size_t n, uint64_t file_size, pcache_hdr *out, char *err);
/* The payload checksum the header records. */
uint64_t pcache_sum(const uint8_t *p, size_t n);

#endif
