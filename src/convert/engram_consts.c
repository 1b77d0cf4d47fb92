/* engram_consts.c: the Engram hash constants that the converter stores in the GGUF
 * (architecture.md §4.2.1-§4.2.2, gguf-layout.md §2.4): bucket primes, numpy's PCG64 stream
 * for the multipliers, and the compressed token map with the Hugging Face normalizer
 * pipeline re-implemented on utf8proc.
 *
 * Must not: depend on Python or numpy at run time; these are computed once at conversion
 * and stored, so the engine never recomputes them. */
#include "convert/convert.h"
#include "base/util.h"
#include "text/bytelevel.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ================================================================ primes (§4.2.2) */

static bool is_prime(uint64_t n) {
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (uint64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return false;
    return true;
}

int engram_primes(int n_layers, int ngram, int n_heads, uint64_t vocab, uint64_t *out, char *err) {
    if (n_layers < 1 || ngram < 2 || n_heads < 1 || vocab < 2 || vocab >= ((uint64_t)1 << 31))
        return dsf_seterr(err, "engram primes: bad parameters (layers %d, ngram %d, heads %d, vocab %llu)",
                          n_layers, ngram, n_heads, (unsigned long long)vocab);
    int k = 0;
    for (int il = 0; il < n_layers; il++) {
        for (int n = 0; n < ngram - 1; n++) {
            uint64_t cur = vocab - 1; /* restarts for each n-gram order, not per head */
            for (int h = 0; h < n_heads; h++) {
                uint64_t cand = cur + 1;
                for (;;) {
                    bool seen = false;
                    for (int j = 0; j < k && !seen; j++) seen = out[j] == cand;
                    if (!seen && is_prime(cand)) break;
                    cand++;
                }
                cur = cand;
                out[k++] = cand;
            }
        }
    }
    return 0;
}

/* ================================================================ numpy PCG64 (§4.2.2)
 * numpy.random.default_rng(seed): SeedSequence(seed) -> 4 uint64 state words -> PCG64
 * (128-bit LCG, XSL-RR output). Generator.integers(low, high, dtype=int64) draws with
 * Lemire's bounded method on rng = high-low-1. */

__extension__ typedef unsigned __int128 u128;

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *hc) {
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    v ^= v >> 16;
    return v;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

typedef struct {
    u128 state, inc;
    bool has32;
    uint32_t u32;
} pcg64;

static void pcg_step(pcg64 *g) {
    const u128 mult = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
    g->state = g->state * mult + g->inc;
}

static uint64_t pcg_next64(pcg64 *g) {
    pcg_step(g);
    uint64_t x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static uint32_t pcg_next32(pcg64 *g) {
    if (g->has32) {
        g->has32 = false;
        return g->u32;
    }
    uint64_t v = pcg_next64(g);
    g->has32 = true;
    g->u32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

static void pcg_seed(pcg64 *g, uint64_t seed) {
    /* SeedSequence: entropy as little-endian uint32 words ([0] for 0), pool of 4. */
    uint32_t ent[2];
    int ne = 0;
    if (seed == 0) ent[ne++] = 0;
    while (seed) {
        ent[ne++] = (uint32_t)seed;
        seed >>= 32;
    }
    uint32_t pool[4], hc = SS_INIT_A;
    for (int i = 0; i < 4; i++) pool[i] = ss_hashmix(i < ne ? ent[i] : 0, &hc);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    /* generate_state(4, uint64): 8 uint32 words, cycling over the pool. */
    uint32_t w[8];
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> 16;
        w[i] = v;
    }
    uint64_t v64[4];
    for (int i = 0; i < 4; i++) v64[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    /* pcg64_set_seed(state = (v0 << 64 | v1), inc = (v2 << 64 | v3)), then srandom. */
    u128 initstate = ((u128)v64[0] << 64) | v64[1];
    u128 initseq = ((u128)v64[2] << 64) | v64[3];
    g->state = 0;
    g->inc = (initseq << 1) | 1;
    pcg_step(g);
    g->state += initstate;
    pcg_step(g);
    g->has32 = false;
    g->u32 = 0;
}

static uint64_t lemire64(pcg64 *g, uint64_t rng) {
    const uint64_t excl = rng + 1;
    u128 m = (u128)pcg_next64(g) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        const uint64_t thr = (UINT64_MAX - rng) % excl;
        while (left < thr) {
            m = (u128)pcg_next64(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

static uint32_t lemire32(pcg64 *g, uint32_t rng) {
    const uint32_t excl = rng + 1;
    uint64_t m = (uint64_t)pcg_next32(g) * excl;
    uint32_t left = (uint32_t)m;
    if (left < excl) {
        const uint32_t thr = (UINT32_MAX - rng) % excl;
        while (left < thr) {
            m = (uint64_t)pcg_next32(g) * excl;
            left = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int n, int64_t *out) {
    pcg64 g;
    pcg_seed(&g, seed);
    uint64_t rng = (uint64_t)high - (uint64_t)low - 1;
    for (int i = 0; i < n; i++) {
        uint64_t v;
        if (rng == 0) v = 0;
        else if (rng < 0xFFFFFFFFull) v = lemire32(&g, (uint32_t)rng);
        else if (rng == 0xFFFFFFFFull) v = pcg_next32(&g);
        else if (rng == UINT64_MAX) v = pcg_next64(&g);
        else v = lemire64(&g, rng);
        out[i] = (int64_t)((uint64_t)low + v);
    }
}

void engram_multipliers(const uint32_t *layer_ids, int n_layers, int ngram, uint64_t cvocab, uint64_t *out) {
    uint64_t bound = ((uint64_t)INT64_MAX / (cvocab ? cvocab : 1)) / 2;
    if (bound < 1) bound = 1;
    int64_t v[64];
    for (int e = 0; e < n_layers; e++) {
        int m = ngram < 64 ? ngram : 64;
        numpy_default_rng_integers(10007ull * layer_ids[e], 0, (int64_t)bound, m, v);
        for (int s = 0; s < m; s++) out[e * ngram + s] = (uint64_t)v[s] * 2 + 1;
    }
}

/* ================================================================ token map (§4.2.1) */

/* Rust char::is_whitespace (the White_Space property), used by the Strip normalizer. */
static bool is_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

char *engram_normalize(const char *s, size_t len, size_t *out_len) {
    utf8proc_uint8_t *nfkc = NULL, *nfd = NULL;
    utf8proc_ssize_t n1 = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &nfkc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (n1 < 0) return NULL;
    utf8proc_ssize_t n2 = utf8proc_map(nfkc, n1, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    free(nfkc);
    if (n2 < 0) return NULL;
    /* StripAccents (all combining marks, General_Category M: tiny41 README), Lowercase,
     * then collapse [ \t\r\n]+ into one space. */
    int32_t *cp = dsf_xmalloc(((size_t)n2 + 1) * sizeof *cp);
    size_t nc = 0;
    for (utf8proc_ssize_t i = 0; i < n2;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t r = utf8proc_iterate(nfd + i, n2 - i, &c);
        if (r <= 0) {
            free(nfd);
            free(cp);
            return NULL;
        }
        i += r;
        utf8proc_category_t cat = utf8proc_category(c);
        if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
        c = utf8proc_tolower(c);
        bool sp = c == ' ' || c == '\t' || c == '\r' || c == '\n';
        if (sp) {
            if (nc && cp[nc - 1] == ' ') continue;
            c = ' ';
        }
        cp[nc++] = c;
    }
    free(nfd);
    if (nc == 1 && cp[0] == ' ') cp[0] = 0xE000; /* Replace(^ $ -> sentinel) */
    size_t b = 0, e = nc;
    while (b < e && is_ws(cp[b])) b++;
    while (e > b && is_ws(cp[e - 1])) e--;
    char *out = dsf_xmalloc((e - b) * 4 + 1);
    size_t o = 0;
    for (size_t i = b; i < e; i++) {
        int32_t c = cp[i] == 0xE000 ? ' ' : cp[i];
        o += (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)out + o);
    }
    out[o] = 0;
    free(cp);
    *out_len = o;
    return out;
}

/* Byte-level decode of one token (the ByteLevel decoder): if every char maps to a byte,
 * the bytes; otherwise the token's own UTF-8 unchanged. */
static uint8_t *bytelevel_decode(const char *tok, size_t len, size_t *out_len) {
    uint8_t *out = dsf_xmalloc(len + 1);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)tok + i, (utf8proc_ssize_t)(len - i), &c);
        int b = r > 0 ? bytelevel_byte((uint32_t)c) : -1;
        if (b < 0) {
            memcpy(out, tok, len);
            *out_len = len;
            return out;
        }
        out[o++] = (uint8_t)b;
        i += (size_t)r;
    }
    *out_len = o;
    return out;
}

/* True if s is valid UTF-8 without U+FFFD, i.e. from_utf8_lossy would leave no U+FFFD. */
static bool clean_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t r = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &c);
        if (r <= 0 || c == 0xFFFD) return false;
        i += (size_t)r;
    }
    return true;
}

typedef struct {
    char **k;
    size_t *klen;
    int32_t *v;
    size_t cap, n;
} strmap;

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* Returns the id of key, inserting it with the next id if absent. Takes ownership of key. */
static int32_t strmap_id(strmap *m, char *key, size_t len) {
    if (2 * (m->n + 1) > m->cap) {
        strmap nm = {0};
        nm.cap = m->cap ? 2 * m->cap : 1024;
        nm.k = dsf_xcalloc(nm.cap, sizeof *nm.k);
        nm.klen = dsf_xcalloc(nm.cap, sizeof *nm.klen);
        nm.v = dsf_xcalloc(nm.cap, sizeof *nm.v);
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->k[i]) continue;
            size_t j = fnv1a(m->k[i], m->klen[i]) & (nm.cap - 1);
            while (nm.k[j]) j = (j + 1) & (nm.cap - 1);
            nm.k[j] = m->k[i];
            nm.klen[j] = m->klen[i];
            nm.v[j] = m->v[i];
        }
        nm.n = m->n;
        free(m->k);
        free(m->klen);
        free(m->v);
        *m = nm;
    }
    size_t j = fnv1a(key, len) & (m->cap - 1);
    while (m->k[j]) {
        if (m->klen[j] == len && !memcmp(m->k[j], key, len)) {
            free(key);
            return m->v[j];
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->k[j] = key;
    m->klen[j] = len;
    m->v[j] = (int32_t)m->n++;
    return m->v[j];
}

static void strmap_free(strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->k[i]);
    free(m->k);
    free(m->klen);
    free(m->v);
}

#define MAX_VOCAB (1 << 24)

int engram_token_map(const char *tokenizer_json, int32_t **map, int64_t *n_out, int64_t *n_compressed, char *err) {
    json_error_t jerr;
    json_t *root = json_load_file(tokenizer_json, 0, &jerr);
    if (!root) return dsf_seterr(err, "%s: bad JSON: %s (line %d)", tokenizer_json, jerr.text, jerr.line);
    int rc = -1;
    const char **tok = NULL;
    size_t *toklen = NULL;
    int64_t max_id = -1, n_distinct = 0;
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens"), *dec = json_object_get(root, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (!json_is_object(vocab)) {
        dsf_seterr(err, "%s: no model.vocab object", tokenizer_json);
        goto done;
    }
    if (!dtype || strcmp(dtype, "ByteLevel")) {
        dsf_seterr(err, "%s: decoder '%s' is not supported (need ByteLevel)", tokenizer_json, dtype ? dtype : "none");
        goto done;
    }
    /* Pass 1: ids and the number of distinct token strings (= len(tokenizer)). */
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= MAX_VOCAB) {
            dsf_seterr(err, "%s: token '%s' has a bad id", tokenizer_json, key);
            goto done;
        }
        if (id > max_id) max_id = id;
    }
    size_t na = json_is_array(added) ? json_array_size(added) : 0;
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!json_is_integer(json_object_get(a, "id")) || id < 0 || id >= MAX_VOCAB ||
            !json_is_string(json_object_get(a, "content"))) {
            dsf_seterr(err, "%s: added token %zu is malformed", tokenizer_json, i);
            goto done;
        }
        if (id > max_id) max_id = id;
    }
    tok = dsf_xcalloc((size_t)max_id + 1, sizeof *tok);
    toklen = dsf_xcalloc((size_t)max_id + 1, sizeof *toklen);
    json_object_foreach(vocab, key, val) {
        tok[json_integer_value(val)] = key;
        toklen[json_integer_value(val)] = strlen(key);
    }
    n_distinct = (int64_t)json_object_size(vocab);
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_object_get(vocab, content)) n_distinct++;
        tok[id] = content; /* added vocabulary wins in id_to_token */
        toklen[id] = json_string_length(json_object_get(a, "content"));
    }
    /* Pass 2: keys in id order. */
    int32_t *m = dsf_xmalloc((size_t)(n_distinct ? n_distinct : 1) * sizeof *m);
    strmap sm = {0};
    for (int64_t id = 0; id < n_distinct; id++) {
        const char *t = id <= max_id ? tok[id] : NULL;
        size_t tl = t ? toklen[id] : 0;
        size_t dl = 0;
        uint8_t *text = t ? bytelevel_decode(t, tl, &dl) : (uint8_t *)dsf_xstrdup("");
        char *k;
        size_t kl;
        if (!clean_utf8(text, dl)) {
            k = dsf_xmalloc(tl + 1); /* partial UTF-8: the raw token string is the key */
            memcpy(k, t, tl);
            kl = tl;
            free(text);
        } else {
            size_t nl;
            char *norm = engram_normalize((const char *)text, dl, &nl);
            if (norm && nl) {
                k = norm;
                kl = nl;
                free(text);
            } else {
                free(norm);
                k = (char *)text;
                kl = dl;
            }
        }
        m[id] = strmap_id(&sm, k, kl);
    }
    *map = m;
    *n_out = n_distinct;
    *n_compressed = (int64_t)sm.n;
    strmap_free(&sm);
    rc = 0;
done:
    free(tok);
    free(toklen);
    json_decref(root);
    return rc;
}
