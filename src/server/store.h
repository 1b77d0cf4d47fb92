/* store.h: the stored responses of `dsflash serve` (POST /v1/responses with "store"): a map
 * from an id to a JSON text, bounded by bytes (--store-mb), the least recently used entry
 * evicted first.
 * Must not: know what the texts hold (server_resp.c writes and reads them).
 * Invariants: thread-safe (one mutex per store; connection threads read, the scheduler
 * writes); the bytes held (texts + ids + bookkeeping) never exceed the budget. */
#ifndef DSF_SERVER_STORE_H
#define DSF_SERVER_STORE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct srv_store srv_store;

/* A store of at most max_bytes (0: stores nothing). */
srv_store *srv_store_new(size_t max_bytes);
void srv_store_free(srv_store *st);
/* Stores a copy of text[0..len) under id, replacing an entry with that id, then evicts least
 * recently used entries until the total fits. False (nothing stored) when the entry alone
 * exceeds the budget. */
bool srv_store_put(srv_store *st, const char *id, const char *text, size_t len);
/* A malloc'ed NUL-terminated copy of id's text (its length in *len when len is not NULL),
 * which becomes the most recently used; NULL when absent or evicted. */
char *srv_store_get(srv_store *st, const char *id, size_t *len);
/* Removes id; false when it was absent. */
bool srv_store_del(srv_store *st, const char *id);
/* Bytes held and entries (for tests and /health). */
size_t srv_store_bytes(srv_store *st, int *n_entries);

#endif
