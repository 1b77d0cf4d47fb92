/* engram_cache.c: the bounded hot-row cache of the Engram table (see engram_cache.h).
 *
 * Owns: n slots of row_bytes each, the key of each slot (row + 1; 0 = empty), a CLOCK bit per
 * slot and an open-addressing hash table (linear probing, backward-shift deletion) of slot + 1
 * per bucket, 2n..4n buckets. One mutex guards all of it.
 * Must not: allocate after creation, or read the file (engram_io.c fills it).
 * Invariant: a key present in the hash table names exactly one slot whose key matches it, and
 * the bytes accounted by engram_cache_bytes never exceed the budget given at creation. */
#include "model/engram_cache.h"
#include "base/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct engram_cache {
    pthread_mutex_t mu;
    uint64_t row_bytes, bytes;
    int64_t n, used, hand; /* slots, slots filled, the CLOCK hand */
    uint8_t *data;         /* [n][row_bytes] */
    int64_t *key;          /* [n] row + 1, 0: empty */
    uint8_t *ref;          /* [n] the CLOCK reference bits */
    uint32_t *tab;         /* [mask + 1] slot + 1, 0: empty bucket */
    uint64_t mask;
};

/* Bytes of a cache of n slots: what the three per-slot arrays and the table take. */
static uint64_t cache_size(uint64_t n, uint64_t row_bytes, uint64_t *buckets) {
    uint64_t h = 2;
    while (h < 2 * n) h <<= 1;
    *buckets = h;
    return sizeof(engram_cache) + n * (row_bytes + sizeof(int64_t) + 1) + h * sizeof(uint32_t);
}

engram_cache *engram_cache_new(uint64_t max_bytes, uint64_t row_bytes, int64_t max_rows) {
    if (!row_bytes || max_rows <= 0) return NULL;
    /* the table takes at most 4 buckets of 4 bytes per slot */
    uint64_t n = max_bytes / (row_bytes + sizeof(int64_t) + 1 + 4 * sizeof(uint32_t));
    if (n > (uint64_t)max_rows) n = (uint64_t)max_rows;
    if (n > (uint64_t)1 << 30) n = (uint64_t)1 << 30; /* slot + 1 fits the table's uint32 */
    uint64_t h, bytes = n ? cache_size(n, row_bytes, &h) : 0;
    while (n && bytes > max_bytes) bytes = --n ? cache_size(n, row_bytes, &h) : 0;
    if (!n) return NULL;
    engram_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    /* calloc'd (zero) and malloc'd arrays of this size are fresh mappings: their pages cost
     * nothing until a row lands in them */
    c->data = malloc(n * row_bytes);
    c->key = calloc(n, sizeof *c->key);
    c->ref = calloc(n, 1);
    c->tab = calloc(h, sizeof *c->tab);
    if (!c->data || !c->key || !c->ref || !c->tab) {
        engram_cache_free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->row_bytes = row_bytes;
    c->bytes = bytes;
    c->n = (int64_t)n;
    c->mask = h - 1;
    return c;
}

void engram_cache_free(engram_cache *c) {
    if (!c) return;
    if (c->n) pthread_mutex_destroy(&c->mu);
    free(c->data);
    free(c->key);
    free(c->ref);
    free(c->tab);
    free(c);
}

static uint64_t home(const engram_cache *c, int64_t key) {
    return ((uint64_t)key * 0x9E3779B97F4A7C15ull >> 17) & c->mask;
}

/* The bucket holding key, or the empty bucket where its probe ends. */
static uint64_t find(const engram_cache *c, int64_t key) {
    uint64_t b = home(c, key);
    while (c->tab[b] && c->key[c->tab[b] - 1] != key) b = (b + 1) & c->mask;
    return b;
}

/* Removes the entry in bucket b, shifting back the entries of its probe run that may move. */
static void unlink_bucket(engram_cache *c, uint64_t b) {
    uint64_t i = b;
    for (uint64_t j = (i + 1) & c->mask; c->tab[j]; j = (j + 1) & c->mask) {
        uint64_t k = home(c, c->key[c->tab[j] - 1]);
        /* the entry at j stays unless its home k lies cyclically outside (i, j] */
        bool stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (!stays) {
            c->tab[i] = c->tab[j];
            i = j;
        }
    }
    c->tab[i] = 0;
}

bool engram_cache_get(engram_cache *c, int64_t row, uint8_t *dst) {
    pthread_mutex_lock(&c->mu);
    uint64_t b = find(c, row + 1);
    bool hit = c->tab[b] != 0;
    if (hit) {
        const int64_t s = c->tab[b] - 1;
        c->ref[s] = 1;
        memcpy(dst, c->data + (uint64_t)s * c->row_bytes, c->row_bytes);
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void engram_cache_put(engram_cache *c, int64_t row, const uint8_t *src) {
    DSF_ASSERT(row >= 0);
    pthread_mutex_lock(&c->mu);
    uint64_t b = find(c, row + 1);
    if (c->tab[b]) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    int64_t s;
    if (c->used < c->n) {
        s = c->used++;
    } else {
        /* CLOCK: clear reference bits until a slot without one comes round (at most n steps) */
        while (c->ref[c->hand]) {
            c->ref[c->hand] = 0;
            c->hand = (c->hand + 1) % c->n;
        }
        s = c->hand;
        c->hand = (c->hand + 1) % c->n;
        unlink_bucket(c, find(c, c->key[s]));
        b = find(c, row + 1); /* the shift may have moved the empty bucket of row's probe */
    }
    c->key[s] = row + 1;
    c->ref[s] = 0; /* a new row has to be used again to outlive one turn of the hand */
    memcpy(c->data + (uint64_t)s * c->row_bytes, src, c->row_bytes);
    c->tab[b] = (uint32_t)(s + 1);
    pthread_mutex_unlock(&c->mu);
}

uint64_t engram_cache_bytes(const engram_cache *c) { return c ? c->bytes : 0; }
int64_t engram_cache_capacity(const engram_cache *c) { return c ? c->n : 0; }

int64_t engram_cache_rows(engram_cache *c) {
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    int64_t n = c->used;
    pthread_mutex_unlock(&c->mu);
    return n;
}
