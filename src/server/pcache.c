/* pcache.c: the disk prefix cache (pcache.h): keys, entry files, the index, LRU eviction by
 * bytes and the writer thread.
 *
 * Must not: hold c->mu across file I/O (the scheduler calls pcache_lookup between forwards);
 * trust a file (every header and payload is checked before use).
 * Invariants: c->bytes is the sum of the indexed entries' file sizes; an indexed entry's file
 * was complete when indexed (written here and renamed, or its header and length checked at
 * open); the writer is the only thread that creates entry files. */
#include "server/pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/threads.h"
#include "base/util.h"

#define PC_MAGIC "DSFPCE1\0"
#define PC_VERSION 1u
#define PC_EXT ".dsfpc"
/* The writer queue's limit: a put beyond it is dropped (the scheduler never waits). */
#define PC_QUEUE_MAX ((uint64_t)1 << 30)

/* ==== keys and checksums ================================================================= */

/* Two independent 64-bit lanes (FNV-1a over the token bytes; a multiply-xorshift chain), so
 * that two prefixes collide only if both lanes do. The token count is mixed in at the end. */
void pcache_hasher_init(pcache_hasher *h, uint64_t ident) {
    h->a = 14695981039346656037ULL ^ ident;
    h->b = 0x9E3779B97F4A7C15ULL + ident * 0xD6E8FEB86659FD93ULL;
    h->n = 0;
}

void pcache_hasher_push(pcache_hasher *h, int32_t token) {
    uint32_t t = (uint32_t)token;
    for (int i = 0; i < 4; i++) h->a = (h->a ^ ((t >> (8 * i)) & 0xFF)) * 1099511628211ULL;
    uint64_t b = (h->b ^ t) * 0xBF58476D1CE4E5B9ULL;
    h->b = b ^ (b >> 31);
    h->n++;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void pcache_hasher_push_media(pcache_hasher *h, int32_t token, uint64_t key) {
    pcache_hasher_push(h, token);
    if (!key) return;
    /* both lanes take the whole key: a collision needs both to agree */
    for (int i = 0; i < 8; i++) h->a = (h->a ^ ((key >> (8 * i)) & 0xFF)) * 1099511628211ULL;
    h->b = mix64(h->b ^ key ^ 0xA24BAED4963EE407ULL);
}

pcache_key pcache_hasher_key(const pcache_hasher *h) {
    return (pcache_key){.hi = mix64(h->a ^ h->n), .lo = mix64(h->b + 0x632BE59BD9B4E019ULL * h->n)};
}

pcache_key pcache_key_of_media(uint64_t ident, const int32_t *tokens, const uint64_t *keys, int n) {
    pcache_hasher h;
    pcache_hasher_init(&h, ident);
    for (int i = 0; i < n; i++) pcache_hasher_push_media(&h, tokens[i], keys ? keys[i] : 0);
    return pcache_hasher_key(&h);
}

pcache_key pcache_key_of(uint64_t ident, const int32_t *tokens, int n) {
    return pcache_key_of_media(ident, tokens, NULL, n);
}

static bool key_eq(pcache_key x, pcache_key y) { return x.hi == y.hi && x.lo == y.lo; }

/* Four lanes over 8-byte words (memory speed, unlike a byte-wise FNV), then the tail bytes. */
uint64_t pcache_sum(const uint8_t *p, size_t n) {
    uint64_t l[4] = {0x243F6A8885A308D3ULL, 0x13198A2E03707344ULL, 0xA4093822299F31D0ULL, 0x082EFA98EC4E6C89ULL};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * (size_t)k, 8);
            l[k] = (l[k] ^ w) * 0x100000001B3ULL;
            l[k] ^= l[k] >> 29;
        }
    uint64_t h = mix64(l[0]) ^ mix64(l[1] + 1) ^ mix64(l[2] + 2) ^ mix64(l[3] + 3) ^ (uint64_t)n;
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return mix64(h);
}

/* ==== the entry header ==================================================================== */

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Layout (little-endian): magic[8] version:u32 n_tokens:u32 key.hi key.lo ident payload_len
 * payload_sum header_sum (u64 each; header_sum covers bytes [0, 56)). */
void pcache_hdr_write(const pcache_hdr *h, uint8_t out[PCACHE_HDR_BYTES]) {
    memcpy(out, PC_MAGIC, 8);
    put64(out + 8, (uint64_t)h->version | (uint64_t)h->n_tokens << 32);
    put64(out + 16, h->key.hi);
    put64(out + 24, h->key.lo);
    put64(out + 32, h->ident);
    put64(out + 40, h->payload_len);
    put64(out + 48, h->payload_sum);
    put64(out + 56, pcache_sum(out, 56));
}

int pcache_hdr_parse(const uint8_t *p, size_t n, uint64_t file_size, pcache_hdr *out, char *err) {
    if (n < PCACHE_HDR_BYTES || file_size < PCACHE_HDR_BYTES)
        return dsf_seterr(err, "entry header truncated (%llu bytes, want %d)", (unsigned long long)file_size,
                          PCACHE_HDR_BYTES);
    if (memcmp(p, PC_MAGIC, 8)) return dsf_seterr(err, "entry magic is not %s", "DSFPCE1");
    if (get64(p + 56) != pcache_sum(p, 56)) return dsf_seterr(err, "entry header checksum mismatch");
    uint64_t vn = get64(p + 8);
    memset(out, 0, sizeof *out);
    out->version = (uint32_t)vn;
    out->n_tokens = (uint32_t)(vn >> 32);
    out->key.hi = get64(p + 16);
    out->key.lo = get64(p + 24);
    out->ident = get64(p + 32);
    out->payload_len = get64(p + 40);
    out->payload_sum = get64(p + 48);
    if (out->version != PC_VERSION) return dsf_seterr(err, "entry version %u (want %u)", out->version, PC_VERSION);
    if (out->n_tokens < 1 || out->n_tokens > INT32_MAX)
        return dsf_seterr(err, "entry n_tokens %u outside 1..%d", out->n_tokens, INT32_MAX);
    if (out->payload_len < 1 || out->payload_len != file_size - PCACHE_HDR_BYTES)
        return dsf_seterr(err, "entry payload_len %llu does not match the file (%llu bytes after the header)",
                          (unsigned long long)out->payload_len, (unsigned long long)(file_size - PCACHE_HDR_BYTES));
    return 0;
}

/* ==== the cache ============================================================================ */

typedef struct {
    pcache_key key;
    uint64_t ident;
    int n_tokens;
    uint64_t bytes;     /* file size */
    uint64_t last_use;  /* c->clock when last put or loaded */
} pc_entry;

typedef struct pc_job {
    pcache_key key;
    int n_tokens;
    uint8_t *data;
    size_t len;
    uint64_t last_use;  /* c->clock at the put: recency counts from the use, not the write */
    struct pc_job *next;
} pc_job;

struct pcache {
    char *dir;
    int dir_fd, lock_fd;
    uint64_t max_bytes, ident;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* with mu: the queue grew, the writer went idle, or stopping */
    pc_entry *e;             /* mu: the index */
    int n, cap;
    uint64_t bytes, clock;   /* mu */
    pc_job *qhead, *qtail;   /* mu: the writer's queue */
    pc_job *writing;         /* mu: the entry the writer is writing (valid while busy) */
    bool busy, stop;         /* mu */
    pcache_stats st;         /* mu (entries, bytes, queued_bytes filled in by pcache_get_stats) */
    pthread_t writer;
    bool writer_running;
};

static void key_hex(pcache_key k, char out[33]) { snprintf(out, 33, "%016llx%016llx", (unsigned long long)k.hi, (unsigned long long)k.lo); }

static void entry_path(const pcache *c, pcache_key k, const char *ext, char *out, size_t cap) {
    char hex[33];
    key_hex(k, hex);
    snprintf(out, cap, "%s/%s%s", c->dir, hex, ext);
}

/* Under mu. */
static int find(const pcache *c, pcache_key k) {
    for (int i = 0; i < c->n; i++)
        if (key_eq(c->e[i].key, k)) return i;
    return -1;
}

/* Under mu: drops entry i from the index (not the file). */
static void drop_at(pcache *c, int i) {
    c->bytes -= c->e[i].bytes;
    c->e[i] = c->e[--c->n];
}

/* Under mu. */
static void add(pcache *c, const pc_entry *x) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->e = dsf_xrealloc(c->e, (size_t)c->cap * sizeof *c->e);
    }
    c->e[c->n++] = *x;
    c->bytes += x->bytes;
}

/* Under mu: deletes least recently used entries until the bytes fit the budget. unlink is
 * a metadata operation, short enough to do under the lock. */
static void evict(pcache *c) {
    while (c->bytes > c->max_bytes && c->n > 0) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].last_use < c->e[lru].last_use) lru = i;
        char path[4096];
        entry_path(c, c->e[lru].key, PC_EXT, path, sizeof path);
        if (unlink(path) && errno != ENOENT) dsf_log(1, "pcache: cannot delete %s (%s)", path, strerror(errno));
        dsf_log(2, "pcache: evicted %s (%llu bytes)", path, (unsigned long long)c->e[lru].bytes);
        drop_at(c, lru);
        c->st.evictions++;
    }
}

/* Deletes the entry file and its index entry, logging why. */
static void discard(pcache *c, pcache_key k, const char *why) {
    char path[4096];
    entry_path(c, k, PC_EXT, path, sizeof path);
    pthread_mutex_lock(&c->mu);
    int i = find(c, k);
    if (i >= 0) drop_at(c, i);
    c->st.discarded++;
    unlink(path);
    pthread_mutex_unlock(&c->mu);
    dsf_log(1, "pcache: discarded %s: %s", path, why);
}

void pcache_discard(pcache *c, pcache_key key, const char *reason) {
    if (c) discard(c, key, reason);
}

/* Sets the entry file's modification time to now: the LRU order of the next open. */
static void touch(const pcache *c, pcache_key k) {
    char path[4096];
    entry_path(c, k, PC_EXT, path, sizeof path);
    utimensat(AT_FDCWD, path, NULL, 0);
}

/* ==== the writer thread ==================================================================== */

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes one entry: DIR/<key>.tmp, fsync, rename to DIR/<key>.dsfpc, fsync of DIR.
 * DSF_PCACHE_WRITE_DELAY_MS (tests): pauses after half of the payload, so that a test can
 * kill the process in the middle of a write. */
static int write_entry(pcache *c, const pc_job *j, char *err) {
    char tmp[4096], path[4096];
    entry_path(c, j->key, ".tmp", tmp, sizeof tmp);
    entry_path(c, j->key, PC_EXT, path, sizeof path);
    pcache_hdr h = {.version = PC_VERSION, .n_tokens = (uint32_t)j->n_tokens, .key = j->key, .ident = c->ident,
                    .payload_len = j->len, .payload_sum = pcache_sum(j->data, j->len)};
    uint8_t hb[PCACHE_HDR_BYTES];
    pcache_hdr_write(&h, hb);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dsf_seterr(err, "cannot create %s (%s)", tmp, strerror(errno));
    const char *delay = dsf_knob("DSF_PCACHE_WRITE_DELAY_MS");
    size_t half = j->len / 2;
    int rc = write_all(fd, hb, sizeof hb) || write_all(fd, j->data, half);
    if (!rc && delay && atoi(delay) > 0) {
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!rc) rc = write_all(fd, j->data + half, j->len - half) || fsync(fd);
    if (close(fd)) rc = -1;
    if (rc) {
        dsf_seterr(err, "cannot write %s (%s)", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path)) {
        dsf_seterr(err, "cannot rename %s to %s (%s)", tmp, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    fsync(c->dir_fd); /* the rename itself survives a power cut */
    return 0;
}

static void *writer_main(void *arg) {
    pcache *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->qhead && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->qhead) break; /* stopping with nothing left */
        pc_job *j = c->qhead;
        c->qhead = j->next;
        if (!c->qhead) c->qtail = NULL;
        c->writing = j;
        c->busy = true;
        pthread_mutex_unlock(&c->mu);

        char err[DSF_ERR_LEN] = "";
        int rc = write_entry(c, j, err);
        if (rc) dsf_log(1, "pcache: %s", err);

        pthread_mutex_lock(&c->mu);
        c->st.queued_bytes -= j->len;
        if (rc) {
            c->st.dropped++;
        } else {
            pc_entry x = {.key = j->key, .ident = c->ident, .n_tokens = j->n_tokens,
                          .bytes = j->len + PCACHE_HDR_BYTES, .last_use = j->last_use};
            add(c, &x);
            c->st.stores++;
            c->st.bytes_written += x.bytes;
            evict(c);
        }
        c->busy = false;
        pthread_cond_broadcast(&c->cv);
        free(j->data);
        free(j);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void pcache_put(pcache *c, pcache_key key, int n_tokens, uint8_t *data, size_t len) {
    if (!c) {
        free(data);
        return;
    }
    pthread_mutex_lock(&c->mu);
    /* the prefix is used again: stored or on its way, it becomes the most recent */
    int have = find(c, key);
    pc_job *same = c->busy && key_eq(c->writing->key, key) ? c->writing : NULL;
    for (pc_job *q = c->qhead; q && !same; q = q->next)
        if (key_eq(q->key, key)) same = q;
    bool dup = have >= 0 || same;
    if (have >= 0) c->e[have].last_use = ++c->clock;
    if (same) same->last_use = ++c->clock;
    const char *why = dup ? NULL
                      : (uint64_t)len + PCACHE_HDR_BYTES > c->max_bytes ? "larger than the budget"
                      : c->st.queued_bytes + len > PC_QUEUE_MAX          ? "the write queue is full"
                      : n_tokens < 1 || !len                             ? "empty"
                                                                         : NULL;
    if (dup || why) {
        c->st.dropped++;
        pthread_mutex_unlock(&c->mu);
        if (why) dsf_log(1, "pcache: entry of %d tokens (%zu bytes) not stored: %s", n_tokens, len, why);
        free(data);
        if (have >= 0) touch(c, key);
        return;
    }
    pc_job *j = dsf_xcalloc(1, sizeof *j);
    *j = (pc_job){.key = key, .n_tokens = n_tokens, .data = data, .len = len, .last_use = ++c->clock};
    if (c->qtail) c->qtail->next = j;
    else c->qhead = j;
    c->qtail = j;
    c->st.queued_bytes += len;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void pcache_flush(pcache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    while (c->qhead || c->busy) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ==== reading ================================================================================ */

int pcache_lookup(pcache *c, const int32_t *tokens, int n_max, pcache_key *key, uint64_t *bytes) {
    return pcache_lookup_media(c, tokens, NULL, n_max, key, bytes);
}

int pcache_lookup_media(pcache *c, const int32_t *tokens, const uint64_t *keys, int n_max, pcache_key *key,
                        uint64_t *bytes) {
    if (!c || n_max < 1) return 0;
    /* the lengths of this identity's entries, shortest first, then one pass over the tokens */
    pthread_mutex_lock(&c->mu);
    int m = 0;
    pc_entry *cand = dsf_xmalloc((size_t)(c->n ? c->n : 1) * sizeof *cand);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].ident == c->ident && c->e[i].n_tokens <= n_max) cand[m++] = c->e[i];
    pthread_mutex_unlock(&c->mu);
    for (int i = 1; i < m; i++) /* insertion sort by length: the candidates are few */
        for (int k = i; k > 0 && cand[k].n_tokens < cand[k - 1].n_tokens; k--) {
            pc_entry t = cand[k];
            cand[k] = cand[k - 1], cand[k - 1] = t;
        }
    pcache_hasher h;
    pcache_hasher_init(&h, c->ident);
    int best = 0, pos = 0;
    for (int i = 0; i < m; i++) {
        for (; pos < cand[i].n_tokens; pos++) pcache_hasher_push_media(&h, tokens[pos], keys ? keys[pos] : 0);
        if (key_eq(pcache_hasher_key(&h), cand[i].key)) {
            best = cand[i].n_tokens;
            *key = cand[i].key;
            *bytes = cand[i].bytes - PCACHE_HDR_BYTES;
        }
    }
    free(cand);
    if (!best) {
        pthread_mutex_lock(&c->mu);
        c->st.misses++;
        pthread_mutex_unlock(&c->mu);
    }
    return best;
}

/* Reads and checks the entry file of key; 1 when the file is gone (not a corruption). */
static int read_entry(pcache *c, pcache_key key, int n_tokens, uint8_t **data, size_t *len, char *err) {
    char path[4096];
    entry_path(c, key, PC_EXT, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int gone = errno == ENOENT;
        dsf_seterr(err, "cannot open %s (%s)", path, strerror(errno));
        return gone ? 1 : -1;
    }
    struct stat sb;
    uint8_t hb[PCACHE_HDR_BYTES];
    pcache_hdr h;
    int rc = -1;
    uint8_t *buf = NULL;
    ssize_t r = fstat(fd, &sb) ? -1 : pread(fd, hb, sizeof hb, 0);
    if (r < 0) {
        dsf_seterr(err, "cannot read %s (%s)", path, strerror(errno));
    } else if (pcache_hdr_parse(hb, (size_t)r, (uint64_t)sb.st_size, &h, err) == 0) {
        if (!key_eq(h.key, key) || h.ident != c->ident || (int)h.n_tokens != n_tokens) {
            dsf_seterr(err, "its header names another key, model or length (%u tokens, want %d)", h.n_tokens, n_tokens);
        } else if (!(buf = malloc(h.payload_len))) {
            dsf_seterr(err, "out of memory for %llu bytes", (unsigned long long)h.payload_len);
        } else {
            size_t got = 0;
            while (got < h.payload_len) {
                ssize_t k = pread(fd, buf + got, h.payload_len - got, (off_t)(PCACHE_HDR_BYTES + got));
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) break;
                got += (size_t)k;
            }
            if (got != h.payload_len) dsf_seterr(err, "truncated while reading (%zu of %llu bytes)", got, (unsigned long long)h.payload_len);
            else if (pcache_sum(buf, got) != h.payload_sum) dsf_seterr(err, "payload checksum mismatch (corrupted)");
            else rc = 0;
        }
    }
    close(fd);
    if (rc == 0) touch(c, key); /* the LRU order survives a restart */
    if (rc) free(buf);
    else *data = buf, *len = (size_t)h.payload_len;
    return rc;
}

int pcache_load(pcache *c, pcache_key key, int n_tokens, uint8_t **data, size_t *len, char *err) {
    if (!c) return dsf_seterr(err, "no prefix cache");
    int rc = read_entry(c, key, n_tokens, data, len, err);
    if (rc == 1) { /* evicted meanwhile */
        pthread_mutex_lock(&c->mu);
        int i = find(c, key);
        if (i >= 0) drop_at(c, i);
        c->st.misses++;
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    if (rc) {
        discard(c, key, err);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    int i = find(c, key);
    if (i >= 0) c->e[i].last_use = ++c->clock;
    c->st.hits++;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void pcache_get_stats(pcache *c, pcache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->entries = (uint64_t)c->n;
    out->bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}

/* ==== opening ================================================================================= */

typedef struct {
    pc_entry e;
    struct timespec mtime;
} pc_scan;

static int by_mtime(const void *x, const void *y) {
    const struct timespec *a = &((const pc_scan *)x)->mtime, *b = &((const pc_scan *)y)->mtime;
    if (a->tv_sec != b->tv_sec) return a->tv_sec < b->tv_sec ? -1 : 1;
    return a->tv_nsec < b->tv_nsec ? -1 : a->tv_nsec > b->tv_nsec;
}

/* Checks one DIR/<name>.dsfpc: its header, its length and that its name is its key. */
static int scan_entry(pcache *c, const char *name, pc_scan *out, char *err) {
    int fd = openat(c->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dsf_seterr(err, "cannot open (%s)", strerror(errno));
    struct stat sb;
    uint8_t hb[PCACHE_HDR_BYTES];
    ssize_t r = fstat(fd, &sb) ? -1 : pread(fd, hb, sizeof hb, 0);
    close(fd);
    if (r < 0) return dsf_seterr(err, "cannot read (%s)", strerror(errno));
    pcache_hdr h;
    if (pcache_hdr_parse(hb, (size_t)r, (uint64_t)sb.st_size, &h, err)) return -1;
    char want[64];
    key_hex(h.key, want);
    strcat(want, PC_EXT);
    if (strcmp(want, name)) return dsf_seterr(err, "the file name is not its key (%s)", want);
    out->e = (pc_entry){.key = h.key, .ident = h.ident, .n_tokens = (int)h.n_tokens, .bytes = (uint64_t)sb.st_size};
    out->mtime = sb.st_mtim;
    return 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* Removes stale temp files, indexes the entries (oldest first) and deletes bad ones. */
static int scan_dir(pcache *c, char *err) {
    DIR *d = fdopendir(dup(c->dir_fd));
    if (!d) return dsf_seterr(err, "cannot list %s (%s)", c->dir, strerror(errno));
    pc_scan *found = NULL;
    int nf = 0, cap = 0, n_tmp = 0, n_bad = 0;
    for (struct dirent *de; (de = readdir(d));) {
        const char *name = de->d_name;
        if (ends_with(name, ".tmp") && strlen(name) == 32 + 4) {
            if (!unlinkat(c->dir_fd, name, 0)) n_tmp++;
            continue;
        }
        if (!ends_with(name, PC_EXT)) continue;
        char why[DSF_ERR_LEN];
        if (nf == cap) found = dsf_xrealloc(found, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *found);
        if (scan_entry(c, name, &found[nf], why)) {
            dsf_log(1, "pcache: discarded %s/%s: %s", c->dir, name, why);
            unlinkat(c->dir_fd, name, 0);
            n_bad++;
            continue;
        }
        nf++;
    }
    closedir(d);
    if (nf) qsort(found, (size_t)nf, sizeof *found, by_mtime); /* found is NULL when DIR holds no entry */
    for (int i = 0; i < nf; i++) {
        found[i].e.last_use = ++c->clock;
        add(c, &found[i].e);
    }
    free(found);
    c->st.discarded += (uint64_t)n_bad;
    evict(c);
    if (n_tmp) dsf_log(1, "pcache: removed %d unfinished write%s in %s", n_tmp, n_tmp == 1 ? "" : "s", c->dir);
    dsf_log(1, "pcache: %s: %d entries, %.1f MiB (budget %.1f MiB)", c->dir, c->n, (double)c->bytes / 1048576.0,
            (double)c->max_bytes / 1048576.0);
    return 0;
}

static void free_cache(pcache *c) {
    if (c->dir_fd >= 0) close(c->dir_fd);
    if (c->lock_fd >= 0) close(c->lock_fd); /* releases the flock */
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->e);
    free(c->dir);
    free(c);
}

pcache *pcache_open(const char *dir, uint64_t max_bytes, uint64_t ident, char *err) {
    if (!dir || !*dir) return dsf_seterr(err, "--cache-dir is empty"), NULL;
    if (mkdir(dir, 0755) && errno != EEXIST) return dsf_seterr(err, "cannot create --cache-dir %s (%s)", dir, strerror(errno)), NULL;
    pcache *c = dsf_xcalloc(1, sizeof *c);
    c->dir = dsf_xstrdup(dir);
    c->max_bytes = max_bytes;
    c->ident = ident;
    c->lock_fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dir_fd < 0) {
        dsf_seterr(err, "--cache-dir %s is not a directory (%s)", dir, strerror(errno));
        goto fail;
    }
    c->lock_fd = openat(c->dir_fd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c->lock_fd < 0) {
        dsf_seterr(err, "--cache-dir %s is not writable (%s)", dir, strerror(errno));
        goto fail;
    }
    if (flock(c->lock_fd, LOCK_EX | LOCK_NB)) {
        dsf_seterr(err, "--cache-dir %s is in use by another process", dir);
        goto fail;
    }
    if (scan_dir(c, err)) goto fail;
    int perr = dsf_thread_start(&c->writer, writer_main, c);
    if (perr) {
        dsf_seterr(err, "cannot start the cache writer thread (%s)", strerror(perr));
        goto fail;
    }
    c->writer_running = true;
    return c;
fail:
    free_cache(c);
    return NULL;
}

void pcache_close(pcache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->writer_running) pthread_join(c->writer, NULL);
    free_cache(c);
}
