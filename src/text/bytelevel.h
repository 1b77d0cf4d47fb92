/* bytelevel.h: GPT-2's byte-level mapping (bytes_to_unicode of openai/gpt-2 encoder.py, the
 * ByteLevel pre-tokenizer and decoder of Hugging Face tokenizers), the one copy in the tree.
 *
 * Every byte has a printable stand-in code point: the 188 printable latin-1 bytes ('!'..'~',
 * U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other 68 bytes are moved, in byte
 * order, to U+0100..U+0143. A byte-level BPE vocabulary spells every token with these stand-ins.
 * Pure functions, no state: usable from any thread. */
#ifndef DSF_BYTELEVEL_H
#define DSF_BYTELEVEL_H

#include <stddef.h>
#include <stdint.h>

/* Every stand-in code point is below this (256 + 68). */
#define BYTELEVEL_CP_END 324u

/* The code point standing for byte b. */
uint32_t bytelevel_cp(uint8_t b);

/* The byte that code point cp stands for, or -1 when cp is no stand-in. */
int bytelevel_byte(uint32_t cp);

/* The UTF-8 spelling of b's stand-in (the text of its single-byte token) in out; returns its
 * length (1 or 2, every stand-in being below U+0800). */
size_t bytelevel_utf8(uint8_t b, char out[2]);

/* The bytes in GPT-2's byte-token order (the order of bytes_to_unicode's table, i.e. by
 * stand-in code point): the 188 printable bytes ascending, then the 68 moved ones ascending. */
void bytelevel_order(uint8_t order[256]);

#endif
