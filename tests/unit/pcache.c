/* pcache.c: the disk prefix cache's storage (src/server/pcache.c) without a model: keys,
 * the entry files and their header, the index rebuilt across a reopen, corruption and
 * truncation, stale temp files, the LRU bound and the directory lock.
 * Expected values come from pcache.h's contracts (a prefix's key is the same however it is
 * computed; a lookup returns the longest stored prefix of this identity; a bad entry is never
 * returned and is deleted; the bytes stay within the budget, least recently used out first). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/pcache.h"
#include "base/util.h"
#include "helpers.h"
#include "test.h"

/* A payload of len bytes derived from seed (malloc'ed: pcache_put takes it). */
static uint8_t *payload(size_t len, unsigned seed) {
    uint8_t *p = dsf_xmalloc(len);
    for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
    return p;
}

static void put(pcache *c, uint64_t ident, const int32_t *toks, int n, size_t len, unsigned seed) {
    pcache_put(c, pcache_key_of(ident, toks, n), n, payload(len, seed), len);
}

/* The entry files (*.dsfpc) in dir, and whether any *.tmp is left. */
static int count_files(const char *dir, const char *ext) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t l = strlen(de->d_name), k = strlen(ext);
        if (l > k && !strcmp(de->d_name + l - k, ext)) n++;
    }
    if (d) closedir(d);
    return n;
}

/* The path of the entry of tokens[0..n). */
static void entry_file(const char *dir, uint64_t ident, const int32_t *toks, int n, char *out, size_t cap) {
    pcache_key k = pcache_key_of(ident, toks, n);
    snprintf(out, cap, "%s/%016llx%016llx.dsfpc", dir, (unsigned long long)k.hi, (unsigned long long)k.lo);
}

static const int32_t TOKS[12] = {0, 5, 9, 200, 17, 3, 3, 8, 1000, 42, 7, 11};
#define IDENT 0x1234ULL

/* Guards against a key that depends on how it was computed (incremental vs whole), on
 * nothing but the tokens (identity and length must change it), or that ignores a token. */
TEST(pcache_keys) {
    pcache_hasher h;
    pcache_hasher_init(&h, IDENT);
    for (int n = 1; n <= 12; n++) {
        pcache_hasher_push(&h, TOKS[n - 1]);
        pcache_key a = pcache_hasher_key(&h), b = pcache_key_of(IDENT, TOKS, n);
        CHECKF(a.hi == b.hi && a.lo == b.lo, "incremental key differs at n=%d", n);
        pcache_key o = pcache_key_of(IDENT + 1, TOKS, n);
        CHECKF(o.hi != a.hi && o.lo != a.lo, "another identity gives the same key at n=%d", n);
        if (n > 1) {
            pcache_key p = pcache_key_of(IDENT, TOKS, n - 1);
            CHECKF(p.hi != a.hi || p.lo != a.lo, "a prefix has the key of its extension at n=%d", n);
        }
    }
    int32_t t2[12];
    memcpy(t2, TOKS, sizeof t2);
    t2[4] ^= 1;
    pcache_key x = pcache_key_of(IDENT, TOKS, 12), y = pcache_key_of(IDENT, t2, 12);
    CHECK(x.hi != y.hi && x.lo != y.lo);
}

/* Guards against the same text with another image hitting the cache: a content key changes
 * the prefix's key (an image's key on any span position, in both lanes), keys of 0 (text)
 * keep the text key, and a lookup with another image's keys does not find the entry. */
TEST(pcache_media_keys) {
    uint64_t keys[12] = {0}, other[12] = {0};
    for (int i = 4; i < 9; i++) keys[i] = 0xABCDEF0000000000ULL + (uint64_t)i, other[i] = keys[i] ^ (1ULL << 40);
    pcache_key tk = pcache_key_of(IDENT, TOKS, 12), z = pcache_key_of_media(IDENT, TOKS, other, 4);
    pcache_key zt = pcache_key_of(IDENT, TOKS, 4);
    CHECK(z.hi == zt.hi && z.lo == zt.lo); /* the text before the span keeps its key */
    pcache_key a = pcache_key_of_media(IDENT, TOKS, keys, 12), b = pcache_key_of_media(IDENT, TOKS, other, 12);
    CHECK(a.hi != tk.hi && a.lo != tk.lo && a.hi != b.hi && a.lo != b.lo);
    pcache_hasher h;
    pcache_hasher_init(&h, IDENT);
    for (int i = 0; i < 12; i++) pcache_hasher_push_media(&h, TOKS[i], keys[i]);
    pcache_key inc = pcache_hasher_key(&h);
    CHECK(inc.hi == a.hi && inc.lo == a.lo);
    const char *dir = test_tmpfile("pcache-media");
    char err[DSF_ERR_LEN];
    pcache *c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    pcache_put(c, pcache_key_of_media(IDENT, TOKS, keys, 11), 11, payload(100, 1), 100);
    pcache_flush(c);
    pcache_key k;
    uint64_t bytes = 0;
    CHECK(pcache_lookup_media(c, TOKS, keys, 12, &k, &bytes) == 11 && k.hi == pcache_key_of_media(IDENT, TOKS, keys, 11).hi);
    CHECK(pcache_lookup_media(c, TOKS, other, 12, &k, &bytes) == 0);
    CHECK(pcache_lookup(c, TOKS, 12, &k, &bytes) == 0);
    pcache_close(c);
}

/* Guards against a header that round-trips wrongly, or a parser that accepts a bad magic, a
 * changed byte (checksum), another version, a truncated or extended file. */
TEST(pcache_header) {
    pcache_hdr h = {.version = 1, .n_tokens = 77, .key = {1, 2}, .ident = 3, .payload_len = 1000, .payload_sum = 4};
    uint8_t b[PCACHE_HDR_BYTES];
    pcache_hdr_write(&h, b);
    pcache_hdr o;
    char err[DSF_ERR_LEN];
    CHECKF(pcache_hdr_parse(b, sizeof b, 1064, &o, err) == 0, "%s", err);
    CHECK(o.n_tokens == 77 && o.key.hi == 1 && o.key.lo == 2 && o.ident == 3 && o.payload_len == 1000 &&
          o.payload_sum == 4);
    CHECK(pcache_hdr_parse(b, sizeof b, 1063, &o, err) == -1 && strstr(err, "payload_len"));
    CHECK(pcache_hdr_parse(b, sizeof b, 1065, &o, err) == -1 && strstr(err, "payload_len"));
    CHECK(pcache_hdr_parse(b, 63, 1064, &o, err) == -1 && strstr(err, "truncated"));
    for (int i = 0; i < PCACHE_HDR_BYTES; i++) {
        uint8_t c[PCACHE_HDR_BYTES];
        memcpy(c, b, sizeof c);
        c[i] ^= 0x10;
        CHECKF(pcache_hdr_parse(c, sizeof c, 1064, &o, err) == -1, "a flipped byte %d was accepted", i);
    }
    h.version = 2;
    pcache_hdr_write(&h, b);
    CHECK(pcache_hdr_parse(b, sizeof b, 1064, &o, err) == -1 && strstr(err, "version"));
}

/* Guards the round trip: the longest stored prefix of the prompt is found (not a longer or
 * foreign one), its bytes come back intact, and a reopened cache (a restart) indexes the same
 * entries from the files. */
TEST(pcache_roundtrip) {
    const char *dir = test_tmpfile("pcache-rt");
    char err[DSF_ERR_LEN];
    pcache *c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    put(c, IDENT, TOKS, 3, 1000, 1);
    put(c, IDENT, TOKS, 8, 3000, 2);
    put(c, IDENT, TOKS, 11, 5000, 3);
    put(c, IDENT + 1, TOKS, 10, 100, 4); /* another model's entry */
    pcache_flush(c);
    pcache_stats st;
    pcache_get_stats(c, &st);
    CHECKF(st.entries == 4 && st.stores == 4 && st.bytes == 9100 + 4 * PCACHE_HDR_BYTES, "entries %llu bytes %llu",
           (unsigned long long)st.entries, (unsigned long long)st.bytes);
    for (int round = 0; round < 2; round++) {
        pcache_key k;
        uint64_t bytes = 0;
        CHECK(pcache_lookup(c, TOKS, 10, &k, &bytes) == 8 && bytes == 3000);
        uint8_t *d = NULL;
        size_t len = 0;
        CHECKF(pcache_load(c, k, 8, &d, &len, err) == 0, "%s", err);
        uint8_t *want = payload(3000, 2);
        CHECK(len == 3000 && !memcmp(d, want, len));
        free(want);
        free(d);
        CHECK(pcache_lookup(c, TOKS, 12, &k, &bytes) == 11);
        CHECK(pcache_load(c, k, 10, &d, &len, err) == -1); /* the wrong length is refused */
        int32_t other[12];
        memcpy(other, TOKS, sizeof other);
        other[1] = 6;
        CHECK(pcache_lookup(c, other, 12, &k, &bytes) == 0);
        pcache_close(c);
        if (round == 0) {
            c = pcache_open(dir, 1 << 20, IDENT, err);
            CHECKF(c, "%s", err);
            pcache_get_stats(c, &st);
            CHECKF(st.entries == 3 && st.discarded == 0, "after reopening: %llu entries, %llu discarded",
                   (unsigned long long)st.entries, (unsigned long long)st.discarded);
            /* the entry refused for its wrong length above was deleted; store it again */
            put(c, IDENT, TOKS, 11, 5000, 3);
            pcache_flush(c);
        }
    }
    CHECK(count_files(dir, ".tmp") == 0);
}

/* Guards against using a corrupted or truncated entry: the payload check and the length
 * check catch them, the file is deleted, and the counters say so. Also: a temp file left by
 * a crash is removed at open. */
TEST(pcache_corrupt) {
    const char *dir = test_tmpfile("pcache-bad");
    char err[DSF_ERR_LEN], path[1024];
    pcache *c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    put(c, IDENT, TOKS, 5, 4000, 7);
    put(c, IDENT, TOKS, 9, 4000, 8);
    pcache_flush(c);
    /* flip one payload byte of the 5-token entry */
    entry_file(dir, IDENT, TOKS, 5, path, sizeof path);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t b;
    CHECK(pread(fd, &b, 1, 2000) == 1);
    b ^= 0x01;
    CHECK(pwrite(fd, &b, 1, 2000) == 1);
    close(fd);
    pcache_key k;
    uint64_t bytes;
    uint8_t *d = NULL;
    size_t len = 0;
    CHECK(pcache_lookup(c, TOKS, 6, &k, &bytes) == 5);
    CHECK(pcache_load(c, k, 5, &d, &len, err) == -1 && strstr(err, "checksum"));
    CHECK(access(path, F_OK) != 0);                  /* deleted */
    CHECK(pcache_lookup(c, TOKS, 6, &k, &bytes) == 0); /* and out of the index */
    /* truncate the 9-token entry: found while open (read) and at the next open (scan) */
    entry_file(dir, IDENT, TOKS, 9, path, sizeof path);
    CHECK(truncate(path, 3000) == 0);
    CHECK(pcache_lookup(c, TOKS, 12, &k, &bytes) == 9);
    CHECK(pcache_load(c, k, 9, &d, &len, err) == -1 && strstr(err, "payload_len"));
    CHECK(access(path, F_OK) != 0);
    pcache_stats st;
    pcache_get_stats(c, &st);
    CHECK(st.discarded == 2 && st.hits == 0 && st.entries == 0);
    put(c, IDENT, TOKS, 9, 4000, 8);
    pcache_close(c); /* writes the queued entry */
    CHECK(truncate(path, 100) == 0);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/0123456789abcdef0123456789abcdef.tmp", dir);
    FILE *f = fopen(tmp, "w");
    CHECK(f && fputs("half a write", f) >= 0 && fclose(f) == 0);
    c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    pcache_get_stats(c, &st);
    CHECK(st.entries == 0 && st.discarded == 1);
    CHECK(access(tmp, F_OK) != 0 && access(path, F_OK) != 0);
    pcache_close(c);
}

/* Guards the LRU bound: the bytes never exceed the budget after a write, the least recently
 * used entry goes first (a load makes an entry recent), an entry larger than the budget is
 * not stored, and the order survives a reopen (file times). */
TEST(pcache_lru) {
    const char *dir = test_tmpfile("pcache-lru");
    char err[DSF_ERR_LEN];
    const uint64_t budget = 3 * (1000 + PCACHE_HDR_BYTES);
    pcache *c = pcache_open(dir, budget, IDENT, err);
    CHECKF(c, "%s", err);
    pcache_stats st;
    for (int n = 1; n <= 3; n++) put(c, IDENT, TOKS, n, 1000, (unsigned)n);
    pcache_flush(c);
    pcache_key k;
    uint64_t bytes;
    uint8_t *d;
    size_t len;
    CHECK(pcache_lookup(c, TOKS, 1, &k, &bytes) == 1);
    CHECK(pcache_load(c, k, 1, &d, &len, err) == 0); /* entry 1 is now the most recent */
    free(d);
    for (int n = 4; n <= 7; n++) {
        usleep(20 * 1000); /* file times are kept at the kernel's tick: entries written within one tie */
        put(c, IDENT, TOKS, n, 1000, (unsigned)n);
        pcache_flush(c);
        pcache_get_stats(c, &st);
        CHECKF(st.bytes <= budget && st.entries == 3, "after %d puts: %llu bytes, %llu entries", n,
               (unsigned long long)st.bytes, (unsigned long long)st.entries);
        /* after 4 and 5: 2 and 3 went (oldest written), 1 stayed (loaded after them) */
        if (n == 5) CHECK(pcache_lookup(c, TOKS, 3, &k, &bytes) == 1 && pcache_lookup(c, TOKS, 4, &k, &bytes) == 4);
    }
    CHECK(st.evictions == 4);
    CHECK(count_files(dir, ".dsfpc") == 3);
    CHECK(pcache_lookup(c, TOKS, 4, &k, &bytes) == 0); /* survivors: 5, 6, 7 */
    CHECK(pcache_lookup(c, TOKS, 6, &k, &bytes) == 6);
    put(c, IDENT, TOKS, 10, budget, 9); /* larger than the whole budget */
    pcache_flush(c);
    pcache_get_stats(c, &st);
    CHECK(st.dropped == 1 && st.entries == 3);
    pcache_close(c);
    /* reopened with a smaller budget: the oldest by file time goes */
    c = pcache_open(dir, 2 * (1000 + PCACHE_HDR_BYTES), IDENT, err);
    CHECKF(c, "%s", err);
    pcache_get_stats(c, &st);
    CHECK(st.entries == 2 && st.evictions == 1);
    CHECK(pcache_lookup(c, TOKS, 5, &k, &bytes) == 0 && pcache_lookup(c, TOKS, 7, &k, &bytes) == 7);
    pcache_close(c);
}

/* Guards against two processes sharing a directory (their indexes would disagree), and bad
 * directories. */
TEST(pcache_open_errors) {
    const char *dir = test_tmpfile("pcache-lock");
    char err[DSF_ERR_LEN];
    pcache *c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    /* flock locks belong to the open file description: a second open in this process
     * conflicts as another process would */
    CHECK(pcache_open(dir, 1 << 20, IDENT, err) == NULL && strstr(err, "in use"));
    pcache_close(c);
    c = pcache_open(dir, 1 << 20, IDENT, err);
    CHECKF(c, "%s", err);
    pcache_close(c);
    char file[600];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    CHECK(pcache_open(file, 1 << 20, IDENT, err) == NULL && strstr(err, "not a directory"));
    CHECK(pcache_open("", 1 << 20, IDENT, err) == NULL);
}
