/* convert.c: the converter's Engram constants on the tiny41 checkpoint.
 *
 * Guards against: wrong primes / offsets / multipliers / token map for tiny41's config
 * (expected values from ../shared/testdata/tiny41/README.md). */
#include "convert/convert.h"
#include "test.h"
#include "base/util.h"

#include <stdint.h>
#include <stdlib.h>

TEST(convert_engram_consts_tiny41) {
    /* testdata/tiny41/README.md: Engram on layers [1, 4], 2 heads, n-grams 2..4, vocab 101,
     * compressed vocab 854 */
    static const uint64_t sizes[12] = {101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157};
    static const uint64_t offs[12] = {0, 101, 204, 311, 420, 533, 660, 791, 928, 1067, 1216, 1367};
    static const uint64_t mult[8] = {8891835669103785, 561584311286445, 4172500994694337, 8584956959516423,
                                     9544882418453959, 584549048184837, 8546215579075033, 2199385574028885};
    uint64_t p[12], m[8], off = 0;
    char err[DSF_ERR_LEN];
    CHECKF(engram_primes(2, 4, 2, 101, p, err) == 0, "%s", err);
    for (int i = 0; i < 12; i++) {
        CHECKF(p[i] == sizes[i] && off == offs[i], "column %d: size %llu offset %llu", i, (unsigned long long)p[i],
               (unsigned long long)off);
        off += p[i];
    }
    uint32_t layers[2] = {1, 4};
    engram_multipliers(layers, 2, 4, 854, m);
    for (int i = 0; i < 8; i++) CHECKF(m[i] == mult[i], "multiplier %d: %llu", i, (unsigned long long)m[i]);
    NEED_SHARED(tj, "testdata/tiny41/hf/tokenizer.json");
    int32_t *map;
    int64_t n, nc;
    CHECKF(engram_token_map(tj, &map, &n, &nc, err) == 0, "%s", err);
    int ok = n == 1024 && nc == 854 && map[2] == 2;
    free(map);
    CHECKF(ok, "token map: %lld ids -> %lld compressed", (long long)n, (long long)nc);
}
