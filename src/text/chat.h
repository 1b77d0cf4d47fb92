/* chat.h: the DeepSeek-V4.1 prompt encoder (spec chat-format.md §2) and the OpenAI-request
 * mapping on top of it (§5). Module-level API on jansson values; the public, jansson-free
 * entry points are dsf_chat_* in include/dsflash.h. */
#ifndef DSF_CHAT_H
#define DSF_CHAT_H

#include <jansson.h>

#include "base/util.h"

/* encode_messages(messages, **args) of the official encoding.py, byte-exact.
 * messages: JSON array of message objects. args: NULL or an object of keyword arguments
 * (thinking_mode [required], reasoning_effort, drop_thinking, add_default_bos_token, context,
 * return_multi_modal_data). Appends the prompt to out (bytes; may contain NUL). images:
 * NULL, or receives a new array of the image records in prompt order. On error returns -1
 * with the official exception message in err (e.g. "Unknown role: developer") and appends
 * nothing useful to out. */
int chat_encode(const json_t *messages, const json_t *args, dsf_buf *out, json_t **images, char *err);

/* Maps an OpenAI-style chat request onto (messages, args) for chat_encode (spec §5, llama.cpp
 * PR behaviour): request tools go onto a system message at index 0 (inserted when needed,
 * omitted when tool_choice is "none"); a json_schema response_format goes there as
 * response_format; `reasoning` is an alias of reasoning_content; content parts that carry a
 * "text" but have another type (media markers) become text parts; a user content null becomes
 * "" (the official encoder raises TypeError); `developer` stays an error (official behaviour);
 * reasoning_effort names
 * minimal->low, xhigh->max, medium->default, none->chat mode; thinking is switched by
 * thinking_mode / thinking / enable_thinking / chat_template_kwargs (default: thinking);
 * continue_final_message renders the final assistant message without EOS, and without its
 * closing </think> when it has reasoning but no content yet (continuation inside reasoning).
 * Returns new references in *messages and *args; *continue_reasoning tells whether a
 * continuation re-opened the reasoning. */
int chat_map_openai(const json_t *request, json_t **messages, json_t **args, int *continue_reasoning,
                    char *err);

#endif
