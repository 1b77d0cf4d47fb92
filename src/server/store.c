/* store.c: the LRU store of stored responses (store.h): a doubly linked list, most recently
 * used first, searched linearly. The budget bounds the list: with the smallest real entries
 * (about 1 KiB) the default 64 MiB holds some 65k, a lookup of which costs well under a
 * millisecond next to a generation's seconds.
 * Must not: parse the texts; call anything under its mutex that can block. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "server/store.h"

typedef struct entry {
    struct entry *prev, *next;
    char *id;
    char *text;
    size_t len;
    size_t bytes; /* what the entry counts against the budget */
} entry;

struct srv_store {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    int n;
    entry *head, *tail; /* head: most recently used */
};

srv_store *srv_store_new(size_t max_bytes) {
    srv_store *st = dsf_xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->max_bytes = max_bytes;
    return st;
}

static void unlink_entry(srv_store *st, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(srv_store *st, entry *e) {
    e->prev = NULL;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

static void drop(srv_store *st, entry *e) {
    unlink_entry(st, e);
    st->bytes -= e->bytes;
    st->n--;
    free(e->id);
    free(e->text);
    free(e);
}

static entry *find(srv_store *st, const char *id) {
    for (entry *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

void srv_store_free(srv_store *st) {
    if (!st) return;
    while (st->head) drop(st, st->head);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

bool srv_store_put(srv_store *st, const char *id, const char *text, size_t len) {
    size_t il = strlen(id);
    size_t bytes = sizeof(entry) + il + 1 + len + 1;
    if (bytes > st->max_bytes) return false;
    entry *n = dsf_xcalloc(1, sizeof *n);
    n->id = dsf_xstrdup(id);
    n->text = dsf_xmalloc(len + 1);
    memcpy(n->text, text, len);
    n->text[len] = 0;
    n->len = len;
    n->bytes = bytes;
    pthread_mutex_lock(&st->mu);
    entry *old = find(st, id);
    if (old) drop(st, old);
    while (st->tail && st->bytes + bytes > st->max_bytes) drop(st, st->tail);
    push_front(st, n);
    st->bytes += bytes;
    st->n++;
    pthread_mutex_unlock(&st->mu);
    return true;
}

char *srv_store_get(srv_store *st, const char *id, size_t *len) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    char *out = NULL;
    if (e) {
        unlink_entry(st, e);
        push_front(st, e);
        out = dsf_xmalloc(e->len + 1);
        memcpy(out, e->text, e->len + 1);
        if (len) *len = e->len;
    }
    pthread_mutex_unlock(&st->mu);
    return out;
}

bool srv_store_del(srv_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    entry *e = find(st, id);
    if (e) drop(st, e);
    pthread_mutex_unlock(&st->mu);
    return e != NULL;
}

size_t srv_store_bytes(srv_store *st, int *n_entries) {
    pthread_mutex_lock(&st->mu);
    size_t b = st->bytes;
    if (n_entries) *n_entries = st->n;
    pthread_mutex_unlock(&st->mu);
    return b;
}
