/* store.c: the stored-responses LRU of `dsflash serve` (src/server/store.c): a map from id to
 * text bounded by bytes, least recently used evicted first, safe across threads.
 * Expected values follow from the contract in store.h (sizes are computed from it here). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/store.h"
#include "test.h"

/* Guards against a store that grows past its budget, evicts the wrong entry (the least
 * recently *used*, not the oldest stored: a get refreshes), loses an entry on replace, or
 * stores an entry that alone exceeds the budget. */
TEST(store_lru_by_bytes) {
    char text[1000];
    memset(text, 'x', sizeof text);
    size_t one = 0;
    srv_store *probe = srv_store_new(1 << 20);
    CHECK(srv_store_put(probe, "a", text, sizeof text));
    one = srv_store_bytes(probe, NULL); /* what one 1000-byte entry with a 1-byte id costs */
    srv_store_free(probe);
    CHECK(one >= sizeof text);

    srv_store *st = srv_store_new(3 * one); /* room for exactly three such entries */
    CHECK(srv_store_put(st, "a", text, sizeof text));
    CHECK(srv_store_put(st, "b", text, sizeof text));
    CHECK(srv_store_put(st, "c", text, sizeof text));
    int n = 0;
    CHECK(srv_store_bytes(st, &n) == 3 * one && n == 3);
    size_t len = 0;
    char *got = srv_store_get(st, "a", &len); /* a becomes the most recently used */
    CHECK(got && len == sizeof text && !memcmp(got, text, len) && got[len] == 0);
    free(got);
    CHECK(srv_store_put(st, "d", text, sizeof text)); /* evicts b, the least recently used */
    got = srv_store_get(st, "b", NULL);
    CHECK(!got);
    for (const char *k = "acd"; *k; k++) {
        char id[2] = {*k, 0};
        got = srv_store_get(st, id, NULL);
        CHECKF(got, "%s was evicted", id);
        free(got);
    }
    CHECK(srv_store_bytes(st, &n) <= 3 * one && n == 3);
    /* replacing an id keeps one entry with the new text */
    CHECK(srv_store_put(st, "c", "new", 3));
    got = srv_store_get(st, "c", &len);
    CHECK(got && len == 3 && !strcmp(got, "new"));
    free(got);
    CHECK(srv_store_bytes(st, &n) < 3 * one && n == 3);
    /* an entry bigger than the whole budget is refused and evicts nothing */
    char *big = calloc(4 * one, 1);
    CHECK(!srv_store_put(st, "big", big, 4 * one));
    free(big);
    CHECK(srv_store_bytes(st, &n) > 0 && n == 3);
    /* delete */
    CHECK(srv_store_del(st, "a"));
    CHECK(!srv_store_del(st, "a"));
    CHECK(!srv_store_get(st, "a", NULL));
    srv_store_free(st);
    /* a zero budget stores nothing */
    st = srv_store_new(0);
    CHECK(!srv_store_put(st, "a", "t", 1));
    CHECK(!srv_store_get(st, "a", NULL));
    srv_store_free(st);
}

typedef struct {
    srv_store *st;
    int k;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    char id[32], text[300];
    memset(text, 'a' + a->k, sizeof text);
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "w%d_%d", a->k, i % 50);
        srv_store_put(a->st, id, text, sizeof text);
        char *g = srv_store_get(a->st, id, NULL);
        free(g);
        if (i % 7 == 0) srv_store_del(a->st, id);
    }
    return NULL;
}

/* Guards against races between connection threads (get) and the scheduler (put): four
 * threads hammer one store (run under ASan/TSan builds to see corruption); the budget holds
 * throughout and the counts stay consistent. */
TEST(store_threads) {
    srv_store *st = srv_store_new(20000);
    pthread_t th[4];
    worker_arg a[4];
    for (int k = 0; k < 4; k++) {
        a[k] = (worker_arg){st, k};
        CHECK(pthread_create(&th[k], NULL, worker, &a[k]) == 0);
    }
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    int n = 0;
    size_t b = srv_store_bytes(st, &n);
    CHECKF(b <= 20000 && n > 0 && n <= 200, "%zu bytes in %d entries", b, n);
    srv_store_free(st);
}
