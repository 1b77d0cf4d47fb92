/* bytelevel.c: GPT-2's byte <-> stand-in code point mapping (see bytelevel.h).
 *
 * Owns: the mapping and the byte-token order, nothing else (no tokenizer, no vocabulary).
 * Invariant: bytelevel_byte(bytelevel_cp(b)) == b for every byte, and the stand-ins of the
 * moved bytes are dense in [256, BYTELEVEL_CP_END). */
#include "text/bytelevel.h"

#include <stdbool.h>

/* The bytes that stand for themselves (bytes_to_unicode's `bs` before the extension). */
static bool printable(uint32_t b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bytelevel_cp(uint8_t b) {
    if (printable(b)) return b;
    uint32_t moved = 0; /* how many non-printable bytes come before b */
    for (uint32_t i = 0; i < b; i++) moved += !printable(i);
    return 256 + moved;
}

int bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= BYTELEVEL_CP_END) return -1;
    uint32_t k = cp - 256; /* cp is the stand-in of the k-th non-printable byte */
    for (uint32_t b = 0; b < 256; b++)
        if (!printable(b) && k-- == 0) return (int)b;
    return -1;
}

size_t bytelevel_utf8(uint8_t b, char out[2]) {
    uint32_t cp = bytelevel_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

void bytelevel_order(uint8_t order[256]) {
    int n = 0;
    for (uint32_t b = 0; b < 256; b++)
        if (printable(b)) order[n++] = (uint8_t)b;
    for (uint32_t b = 0; b < 256; b++)
        if (!printable(b)) order[n++] = (uint8_t)b;
}
