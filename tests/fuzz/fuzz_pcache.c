/* fuzz_pcache.c: libFuzzer harness for the prefix cache's entry header (pcache_hdr_parse in
 * src/server/pcache.c), read from every file of --cache-dir at startup and before each load:
 * files that a crash, a full disk or another program may have damaged.
 *
 * Input: byte 0 = flags (bit 0: recompute the header checksum after the fuzzer's edits, so
 * that mutants reach the field checks behind it; bit 1: set payload_len to the file's real
 * payload length, so that they reach acceptance), then the entry file (header + payload).
 * Checks: a refusal is one line naming the problem; an accepted header describes this file
 * (version 1, n_tokens >= 1, payload_len == the bytes after the header) and serializes back
 * to the same 64 bytes (no field is read loosely). */
#include "fuzz_common.h"
#include "server/pcache.h"

static void fz_pc_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int fz_pcache_one(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    size_t n = size - 1;
    uint8_t *f = dsf_xmalloc(n ? n : 1);
    memcpy(f, data + 1, n);
    if (n >= PCACHE_HDR_BYTES) {
        if (flags & 2) fz_pc_put64(f + 40, (uint64_t)(n - PCACHE_HDR_BYTES));
        if (flags & 1) fz_pc_put64(f + 56, pcache_sum(f, 56));
    }
    pcache_hdr h;
    char err[DSF_ERR_LEN] = "";
    int rc = pcache_hdr_parse(f, n, (uint64_t)n, &h, err);
    FZ_REQUIRE(rc == 0 || rc == -1, "pcache_hdr_parse returned %d", rc);
    if (rc == 0) {
        FZ_REQUIRE(n >= PCACHE_HDR_BYTES && h.version == 1 && h.n_tokens >= 1 && h.n_tokens <= INT32_MAX,
                   "accepted version %u n_tokens %u", h.version, h.n_tokens);
        FZ_REQUIRE(h.payload_len >= 1 && h.payload_len == n - PCACHE_HDR_BYTES, "accepted payload_len %llu for %zu bytes",
                   (unsigned long long)h.payload_len, n);
        uint8_t back[PCACHE_HDR_BYTES];
        pcache_hdr_write(&h, back);
        FZ_REQUIRE(!memcmp(back, f, PCACHE_HDR_BYTES), "the accepted header does not serialize back to its bytes");
    } else {
        fz_check_err(err, "pcache_hdr_parse");
    }
    free(f);
    return rc == 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_pcache_one(data, size);
    return 0;
}
#endif
