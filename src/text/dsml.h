/* dsml.h: the V4.1 output parser (spec chat-format.md §3): reasoning / content / DSML tool
 * calls. The public streaming API is dsf_dsml_* in include/dsflash.h; this header adds the
 * one-shot official (strict) parser for tests and tools. */
#ifndef DSF_DSML_H
#define DSF_DSML_H

#include <stdbool.h>
#include <stddef.h>

#include "dsflash.h"
#include "base/util.h"

/* parse_message_from_completion_text(text, thinking_mode) of the official encoding.py:
 * text must include the final EOS string. Fills out (caller frees with dsf_dsml_result_free)
 * or returns -1 with the official error message. */
int dsml_parse_official(const char *text, size_t len, bool thinking, dsf_dsml_result *out, char *err);

#endif
