/* fuzz_distmsg.c: libFuzzer harness for the payloads of rank 0's eval and batch ops
 * (dist_parse_eval, dist_parse_batch in src/model/distfollow.c), which every follower rank of an
 * MPI job parses: a corrupted or mismatched message must be refused, never overread.
 *
 * Input: byte 0 = flags (bit 0: 0 eval, 1 batch; bit 1: the eval carries media; bits 2-3: how
 * the header's count n is made: 0 from the payload's length, 1 any int32 from bytes 2..5
 * (negative and huge ones included), 2 a small count (bytes 2..5 mod 16), 3 the length's count
 * off by -1, 0 or +1); byte 1 mod 9 = n_embd; bytes 2..5 the count's bits; the rest = the
 * payload, copied to a buffer of exactly its size (ASan sees an overread).
 * Checks: the return is 0 or -1; a refusal is one line and leaves every out pointer NULL; an
 * accepted eval is exactly n tokens (+ n types and keys with media, then either no rows or
 * exactly one n_embd row per span) and gives back those bytes (rows the payload lacks are
 * zeros); an accepted batch is exactly n session ids and n tokens, given back. */
#include "fuzz_common.h"
#include "model/dist.h"

static int fz_distmsg_eval(const uint8_t *p, size_t len, int64_t n, bool media, int64_t n_embd) {
    dist_eval_msg m;
    char err[DSF_ERR_LEN] = "";
    int rc = dist_parse_eval(p, len, n, media, n_embd, &m, err);
    FZ_REQUIRE(rc == 0 || rc == -1, "dist_parse_eval returned %d", rc);
    if (rc < 0) {
        fz_check_err(err, "dist_parse_eval");
        FZ_REQUIRE(!m.tokens && !m.types && !m.keys && !m.embd && m.n == 0, "a refused eval left its arrays");
        return 0;
    }
    FZ_REQUIRE(n >= 1 && m.n == n, "accepted an eval of %lld tokens as %d", (long long)n, m.n);
    const size_t nt = (size_t)n;
    FZ_REQUIRE(len >= nt * 4 && !memcmp(m.tokens, p, nt * 4), "the tokens are not the payload's first %zu bytes", nt * 4);
    if (!media) {
        FZ_REQUIRE(len == nt * 4 && !m.types && !m.keys && !m.embd, "a text eval of %zu tokens took %zu bytes", nt, len);
        dist_eval_msg_free(&m);
        return 1;
    }
    const size_t base = nt * 13;
    FZ_REQUIRE(len >= base && m.types && m.keys && m.embd, "a media eval of %zu tokens in %zu bytes", nt, len);
    FZ_REQUIRE(!memcmp(m.types, p + nt * 4, nt) && !memcmp(m.keys, p + nt * 5, nt * 8), "types or keys differ from the payload");
    size_t nspan = 0;
    for (size_t i = 0; i < nt; i++) nspan += m.types[i] >= 0;
    const size_t rows = nspan * (size_t)n_embd * sizeof(float);
    FZ_REQUIRE(len == base || len == base + rows, "accepted %zu bytes for %zu tokens and %zu span rows of %lld", len, nt,
               nspan, (long long)n_embd);
    if (len == base) {
        for (size_t i = 0; i < rows; i++) FZ_REQUIRE(((const uint8_t *)m.embd)[i] == 0, "a missing span row is not zeros");
    } else {
        FZ_REQUIRE(!memcmp(m.embd, p + base, rows), "the span rows differ from the payload");
    }
    dist_eval_msg_free(&m);
    FZ_REQUIRE(!m.tokens && !m.embd, "dist_eval_msg_free left pointers");
    return 1;
}

static int fz_distmsg_batch(const uint8_t *p, size_t len, int64_t n) {
    uint64_t *sids = (uint64_t *)1;
    int32_t *tok = (int32_t *)1;
    char err[DSF_ERR_LEN] = "";
    int rc = dist_parse_batch(p, len, n, &sids, &tok, err);
    FZ_REQUIRE(rc == 0 || rc == -1, "dist_parse_batch returned %d", rc);
    if (rc < 0) {
        fz_check_err(err, "dist_parse_batch");
        FZ_REQUIRE(!sids && !tok, "a refused batch left its arrays");
        return 0;
    }
    const size_t nb = (size_t)n;
    FZ_REQUIRE(n >= 1 && len == nb * 12, "accepted a batch of %lld entries in %zu bytes", (long long)n, len);
    FZ_REQUIRE(!memcmp(sids, p, nb * 8) && !memcmp(tok, p + nb * 8, nb * 4), "the batch differs from its payload");
    free(sids);
    free(tok);
    return 1;
}

static int fz_distmsg_one(const uint8_t *data, size_t size) {
    if (size < 6) return 0;
    const uint8_t flags = data[0];
    const bool batch = flags & 1, media = (flags >> 1) & 1;
    const int64_t n_embd = data[1] % 9;
    const uint32_t x = (uint32_t)data[2] | (uint32_t)data[3] << 8 | (uint32_t)data[4] << 16 | (uint32_t)data[5] << 24;
    const size_t len = size - 6;
    const size_t per = batch ? 12 : media ? 13 : 4; /* bytes per entry without span rows */
    int64_t n;
    switch ((flags >> 2) & 3) {
    case 0: n = (int64_t)(len / per); break;
    case 1: n = (int64_t)(int32_t)x; break;
    case 2: n = (int64_t)(x % 16); break;
    default: n = (int64_t)(len / per) + (int64_t)(x % 3) - 1; break;
    }
    uint8_t *p = dsf_xmalloc(len ? len : 1);
    if (len) memcpy(p, data + 6, len);
    int ok = batch ? fz_distmsg_batch(p, len, n) : fz_distmsg_eval(p, len, n, media, n_embd);
    free(p);
    return ok;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_distmsg_one(data, size);
    return 0;
}
#endif
