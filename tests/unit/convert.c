/* convert.c: the converter's Engram constants, computed from the config alone.
 *
 * Guards against: wrong primes / offsets / numpy-PCG64 multipliers of the released model
 * (expected values from architecture.md §11.2) and a normalizer that departs from the HF
 * sequence (§4.2.1). */
#include "convert/convert.h"
#include "test.h"
#include "base/util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ Engram constants */

TEST(convert_engram_consts_release) {
    /* architecture.md §11.2 / gguf-layout.md §2.4 (the released model: layers 1 and 14,
     * 8 heads, n-grams 2..4, engram_vocab_size 16000000, compressed vocab 99092). */
    static const uint64_t primes[48] = {
        16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
        16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
        16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463,
        16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
        16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
        16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
    static const uint64_t off14[24] = {
        0, 16000477, 32000964, 48001463, 64001970, 80002481, 96003054, 112003663,
        128004290, 144004957, 160005626, 176006319, 192007016, 208007727, 224008456, 240009215,
        256009984, 272010765, 288011564, 304012377, 320013196, 336014037, 352014914, 368015793};
    static const uint64_t mult[8] = {76632096046245, 4839876093313, 35959672319349, 73987337458391,
                                     67716810739261, 51510806800915, 30921347202721, 82619226485591};
    uint64_t p[48], m[8];
    char err[DSF_ERR_LEN];
    CHECKF(engram_primes(2, 4, 8, 16000000, p, err) == 0, "%s", err);
    for (int i = 0; i < 48; i++) CHECKF(p[i] == primes[i], "prime %d: %llu", i, (unsigned long long)p[i]);
    /* layer 14's offsets relative to its own table (§11.2), and its row total */
    uint64_t off = 0, sum1 = 0;
    for (int i = 0; i < 24; i++) sum1 += p[i];
    for (int i = 0; i < 24; i++) {
        CHECKF(off == off14[i], "offset %d: %llu", i, (unsigned long long)off);
        off += p[24 + i];
    }
    CHECK(sum1 == 384006168 && off == 384016682);
    uint32_t layers[2] = {1, 14};
    engram_multipliers(layers, 2, 4, 99092, m);
    for (int i = 0; i < 8; i++) CHECKF(m[i] == mult[i], "multiplier %d: %llu", i, (unsigned long long)m[i]);
}

TEST(convert_engram_normalize) {
    /* The HF normalizer sequence of architecture.md §4.2.1, case by case. */
    static const struct { const char *in, *out; } c[] = {
        {"Hello", "hello"},
        {"  Hello\t\n", "hello"},           /* whitespace run -> ' ', then Strip */
        {" ", " "},                          /* the sentinel keeps a lone space */
        {"\t\n", " "},                       /* ... also after the collapse */
        {"a \t b", "a b"},
        {"\xC3\x89t\xC3\xA9", "ete"},        /* Été: NFD + strip accents + lowercase */
        {"\xEF\xAC\x81", "fi"},              /* U+FB01 ligature: NFKC */
        {"\xE0\xA4\x95\xE0\xA4\xBE", "\xE0\xA4\x95"}, /* क + ा (Mc, a spacing mark) is stripped too */
        {"\xCC\x81", ""},                    /* a lone combining acute: empty */
        {"\xC2\xA0x\xE3\x80\x80", "x"},      /* NBSP (NFKC -> space) and U+3000 stripped */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t n;
        char *o = engram_normalize(c[i].in, strlen(c[i].in), &n);
        CHECKF(o, "case %zu: NULL", i);
        int ok = n == strlen(c[i].out) && !memcmp(o, c[i].out, n);
        free(o);
        CHECKF(ok, "case %zu ('%s')", i, c[i].in);
    }
}
