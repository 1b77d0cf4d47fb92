/* vocab.h: Hugging Face tokenizer files -> GGUF tokenizer metadata (tokenizer.ggml.*), as
 * llama.cpp's converter writes them (gguf-layout.md §2.2). Shared by `dsflash convert` and
 * `dsflash convert --vocab-only`. */
#ifndef DSF_VOCAB_H
#define DSF_VOCAB_H

#include "io/gguf.h"

/* Reads hf_dir/tokenizer.json and hf_dir/tokenizer_config.json (and hf_dir/config.json for
 * fallbacks such as pad_token_id) and adds every tokenizer.ggml.* key to w.
 * vocab_size: the model's vocabulary size (ids without a token become "[PAD{i}]"); pass 0
 * to use the tokenizer's own size. Returns 0 / -1 with err. */
int vocab_write_gguf(gguf_writer *w, const char *hf_dir, int64_t vocab_size, char *err);

#endif
