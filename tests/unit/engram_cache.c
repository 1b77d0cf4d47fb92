/* engram_cache.c: the Engram hot-row cache (src/model/engram_cache.h). Guards against a cache
 * that grows past its byte budget, a hit that returns another row's bytes (a hash-table
 * deletion that breaks a probe run, an eviction that leaves a stale key), CLOCK evicting a
 * row that was just used, and lost updates under concurrent readers. */
#include "test.h"
#include "model/engram_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The bytes every test stores for row r: a pure function of (r, i), so a hit can be checked. */
static void row_bytes_of(int64_t r, uint8_t *out, size_t n) {
    uint64_t s = (uint64_t)r * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (uint8_t)(s >> 56);
    }
}

TEST(engram_cache_bound_holds) {
    static const uint64_t budgets[] = {4096, 65536, 1 << 20};
    static const uint64_t rbs[] = {512, 264, 1024};
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 3; k++) {
            engram_cache *c = engram_cache_new(budgets[b], rbs[k], 1 << 30);
            CHECKF(c, "budget %llu row %llu", (unsigned long long)budgets[b], (unsigned long long)rbs[k]);
            if (!c) continue;
            const int64_t cap = engram_cache_capacity(c);
            /* the bound: every byte the cache holds, slots and tables together */
            CHECKF(engram_cache_bytes(c) <= budgets[b], "%llu > %llu", (unsigned long long)engram_cache_bytes(c),
                   (unsigned long long)budgets[b]);
            /* and it is not wasted: the slots' bytes take most of it */
            CHECKF((uint64_t)cap * rbs[k] * 10 >= budgets[b] * 7, "capacity %lld of %llu-byte rows in %llu bytes",
                   (long long)cap, (unsigned long long)rbs[k], (unsigned long long)budgets[b]);
            uint8_t want[1024], got[1024];
            for (int64_t r = 0; r < 10 * cap + 7; r++) {
                row_bytes_of(r * 7 + 3, want, rbs[k]);
                engram_cache_put(c, r * 7 + 3, want);
                CHECK(engram_cache_rows(c) <= cap);
            }
            int64_t hits = 0;
            for (int64_t r = 0; r < 10 * cap + 7; r++)
                if (engram_cache_get(c, r * 7 + 3, got)) {
                    hits++;
                    row_bytes_of(r * 7 + 3, want, rbs[k]);
                    CHECKF(!memcmp(got, want, rbs[k]), "row %lld: a hit returned other bytes", (long long)(r * 7 + 3));
                }
            /* full after 10x its capacity of distinct rows, each held once */
            CHECKF(hits == cap, "%lld hits, capacity %lld", (long long)hits, (long long)cap);
            CHECK(!engram_cache_get(c, 1, got)); /* never stored */
            engram_cache_free(c);
        }
    CHECK(!engram_cache_new(300, 512, 100)); /* a budget below one row: no cache */
}

TEST(engram_cache_capped_by_table) {
    /* a table of 10 rows needs no more than 10 slots, whatever the budget */
    engram_cache *c = engram_cache_new(1 << 20, 512, 10);
    CHECK(c && engram_cache_capacity(c) == 10 && engram_cache_bytes(c) < 16384);
    engram_cache_free(c);
}

TEST(engram_cache_clock_keeps_used_rows) {
    engram_cache *c = engram_cache_new(8192, 256, 1000);
    CHECK(c);
    if (!c) return;
    const int64_t n = engram_cache_capacity(c);
    uint8_t b[256];
    for (int64_t r = 0; r < n; r++) {
        row_bytes_of(r, b, sizeof b);
        engram_cache_put(c, r, b);
    }
    CHECK(engram_cache_get(c, 0, b)); /* row 0 gets its reference bit */
    row_bytes_of(n, b, sizeof b);
    engram_cache_put(c, n, b);
    /* CLOCK from slot 0: row 0 is spared (bit cleared), row 1 is the first without a bit */
    CHECK(engram_cache_get(c, 0, b));
    CHECK(!engram_cache_get(c, 1, b));
    CHECK(engram_cache_get(c, n, b));
    for (int64_t r = 2; r < n; r++) CHECKF(engram_cache_get(c, r, b), "row %lld lost", (long long)r);
    engram_cache_free(c);
}

typedef struct {
    engram_cache *c;
    int seed, bad;
} hammer_arg;

static void *hammer(void *p) {
    hammer_arg *a = p;
    uint8_t want[264], got[264];
    uint64_t s = (uint64_t)a->seed;
    for (int i = 0; i < 20000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int64_t r = (int64_t)((s >> 33) % 3000);
        if (engram_cache_get(a->c, r, got)) {
            row_bytes_of(r, want, sizeof want);
            a->bad += memcmp(got, want, sizeof want) != 0;
        } else {
            row_bytes_of(r, want, sizeof want);
            engram_cache_put(a->c, r, want);
        }
    }
    return NULL;
}

TEST(engram_cache_threads) {
    /* 4 threads share a cache of ~1/3 of the rows they touch: every hit must be its own row */
    engram_cache *c = engram_cache_new(300 * 1024, 264, 1 << 20);
    CHECK(c);
    if (!c) return;
    pthread_t th[4];
    hammer_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (hammer_arg){c, i + 1, 0};
        pthread_create(&th[i], NULL, hammer, &a[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECKF(a[i].bad == 0, "thread %d: %d hits with other bytes", i, a[i].bad);
    CHECK(engram_cache_rows(c) <= engram_cache_capacity(c));
    engram_cache_free(c);
}
