/* dsflash.h: the one public header of dsflash, a C inference engine for
 * DeepSeek-V4.1-Flash (Hugging Face DeepseekV41ForCausalLM, GGUF arch "deepseek41").
 *
 * Engine, session, tokenizer, chat encoder, tool-call parser and sampler. No tensors.
 * Conventions: functions that can fail return 0 (or a pointer) on success and -1 (or NULL)
 * on failure, writing one line naming the problem into `err` (DSF_ERR_LEN bytes, may be
 * NULL). Nothing here calls exit(). */
#ifndef DSFLASH_H
#define DSFLASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSF_ERR_LEN 512

/* ==== engine and session =============================================================== */

typedef struct dsf_engine dsf_engine;
typedef struct dsf_session dsf_session;

typedef enum {
    /* The official QAT contract (architecture.md §3.3-3.4, §6): FP8 QDQ of every input to a
     * projection that is FP8/FP4 in the official checkpoint, FP8 window KV, FP4 (E4M3/16)
     * compressed rows, FP4 (E8M0/32) index q/k. The default. */
    DSF_NUMERICS_REFERENCE = 0,
    /* No quantize-dequantize anywhere: exact arithmetic in fp32 (debugging, llama.cpp parity). */
    DSF_NUMERICS_PLAIN = 1,
} dsf_numerics;

typedef struct {
    dsf_numerics numerics;
    int n_threads; /* <= 0: all online cores */
    /* Routed experts (MXFP4) repacked into memory at open for the AVX-512 decode kernels:
     * 0 = auto (reference numerics, AVX-512 kernels, and the weights read through the file
     * mapping fit in 80 % of RAM with the copy: every tensor but the token embedding and the
     * Engram table, which are read a row at a time; in an MPI job this rank's share. RAM is
     * DSF_RAM_BYTES when set; DSF_REPACK=0/1 in the environment overrides auto), > 0 =
     * whenever the kernels can use it, < 0 = never. The copy is as large as the experts in the file; the values
     * and the logits are bit for bit the same either way. */
    int repack;
    /* Dense weights (every matrix a token reads in full: attention, indexer, shared experts,
     * hc mixes, router, Engram projections, LM head) copied at open into anonymous memory in
     * 2 MiB pages, their file pages then unmapped: 0 = auto (the mapped weights fit in 80 %
     * of RAM with the copies, as for repack; DSF_RESIDENT=0/1 in the environment overrides
     * auto), > 0 = always, < 0 = never (they are read from the file mapping). Decode read them ~2 % faster from
     * the copy on the bench host (docs/perf-log.md, item 41). The values and the logits
     * are bit for bit the same either way. */
    int resident;
    /* Opt-in (default false): the activations entering a product whose weights are a K-quant
     * (Q2_K..Q6_K) or an IQ type with a Q8_K dot (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
     * IQ3_XXS, IQ3_S, IQ4_XS), with n_in a multiple of 256 (at most 16384), are quantized to
     * ggml's Q8_K (per 256 values an fp32 scale and int8 codes: ggml's own activation format
     * for these types; after reference mode's FP8 QDQ when that is on) and the products are
     * integer dots, as llama.cpp computes them: faster on those weights, but the results
     * change (a relative error of the activations up to ~1/254 per block). Other products
     * are unchanged. Decode and prefill still agree bit for bit. */
    bool act_q8k;
    /* The Engram table is read from the file, a chunk's rows at a time, by reader threads of
     * the engine's own (not the compute threads: they wait on the disk) while the layers before
     * each Engram layer compute. engram_readers: 0 = the default (8), < 0 = none (each Engram
     * layer then reads its rows itself, one at a time, when it needs them). */
    int engram_readers;
    /* A cache of the table's hot rows (raw, as the file stores them; CLOCK eviction) in at most
     * this many MiB: 0 = the default (256), < 0 = none. It never grows past the bound; a table
     * smaller than it is cached whole as its rows are read. The values and the logits are bit
     * for bit the same with any readers and cache. */
    int engram_cache_mb;
    /* Tokens per forward of a prefill (llama.cpp's --ubatch): > 0 = that many; 0 = auto: the
     * smallest of 512, 1024, ... 8192 that gives each routed expert 32 tokens of a chunk on
     * average (512 on 32 experts top-6, 2048 on the released 384 top-6), halved while a
     * session's chunk memory (its scratch and window-ring rows) would exceed 1/16 of RAM;
     * DSF_CHUNK=N in the environment overrides auto. Every session of the engine takes it (in
     * an MPI job, rank 0's). The logits are bit for bit the same whatever the chunk. */
    int ubatch;
} dsf_engine_params;

void dsf_engine_params_default(dsf_engine_params *p);
/* Maps a deepseek41 GGUF, validates its shape and binds every tensor. Reads no tensor data,
 * except the routed experts when it repacks them and the dense weights when it copies them
 * (see repack and resident above). In an MPI job (dsf_dist_init) the first engine is spread
 * over the ranks: rank 0 gets it back and every session call on it runs on all ranks; on any
 * other rank this call does not return: the rank follows rank 0 until rank 0 closes the
 * engine, then ends its process. */
dsf_engine *dsf_engine_open(const char *path, const dsf_engine_params *p, char *err);
void dsf_engine_close(dsf_engine *e);
int dsf_engine_n_vocab(const dsf_engine *e);
/* Bytes of routed experts repacked in memory at open (0: they are read from the file). */
size_t dsf_engine_repacked_bytes(const dsf_engine *e);
/* Bytes of dense weights copied into memory at open (0: they are read from the file). */
size_t dsf_engine_resident_bytes(const dsf_engine *e);
int dsf_engine_n_ctx_train(const dsf_engine *e);
/* The tokens per prefill forward its sessions take (dsf_engine_params.ubatch, resolved). */
int dsf_engine_ubatch(const dsf_engine *e);
/* Human-readable description of the model (dsflash inspect): metadata, layer roles, tensors. */
void dsf_engine_describe(const dsf_engine *e, void (*emit)(void *ud, const char *line), void *ud);

/* A session holds one sequence's state (spec §5): window rings, compressed rows and index
 * keys of the KV sources, the compressor carry, the Engram history. max_ctx bounds the
 * number of tokens; its memory is allocated up front and reported by dsf_session_bytes. */
dsf_session *dsf_session_new(dsf_engine *e, int max_ctx, char *err);
void dsf_session_free(dsf_session *s);
size_t dsf_session_bytes(const dsf_session *s);
int dsf_session_n_past(const dsf_session *s);
int dsf_session_max_ctx(const dsf_session *s);

/* Feeds n tokens at positions n_past..n_past+n-1 (one forward, any n >= 1).
 * logits: NULL, or [n][n_vocab] if all_rows, else [n_vocab] for the last token only.
 * Row i holds the logits after consuming token i. Fails (state unchanged) on a token id
 * outside the vocabulary, when the context would exceed max_ctx, or when a logits row it
 * returns holds a NaN or an infinity (a weight holds one: e.g. a quantized block's scale). */
int dsf_session_eval(dsf_session *s, const int32_t *tokens, int n, float *logits, bool all_rows,
                     char *err);
/* One decode step for several sessions of the same engine in a single forward (weights are
 * read once for all): tokens[i] is appended to sessions[i] (distinct sessions). logits:
 * NULL or [n][n_vocab]. Same results (and refusals) as n separate dsf_session_eval calls. */
int dsf_batch_eval(dsf_session **sessions, const int32_t *tokens, int n, float *logits, char *err);
/* Rolls the state back exactly to n tokens (0 <= n <= n_past). */
int dsf_session_rollback(dsf_session *s, int n, char *err);
/* The token history (n_past ids). */
const int32_t *dsf_session_tokens(const dsf_session *s);
/* Serializes the state to a malloc'ed buffer in a versioned format that records the model
 * and shape; restore refuses a state from another model, shape or numerics mode. */
int dsf_session_save(const dsf_session *s, uint8_t **out, size_t *len, char *err);
int dsf_session_restore(dsf_session *s, const uint8_t *data, size_t len, char *err);
/* The identity of what a session's state depends on: the model file (its header and sampled
 * weight bytes, as a snapshot records them) and the numerics mode (with act_q8k). Engines with
 * equal ids accept each other's snapshots; a cache keyed by it never serves another model's
 * state. Never 0. The first call samples the weights (a few pages per tensor). */
uint64_t dsf_engine_state_id(dsf_engine *e);

/* ==== images (deepseek41v; spec vision.md) ============================================== */

/* Token types of an expanded prompt (vision.md §5). Every span position carries the image
 * token's id; only the type tells them apart. */
#define DSF_TOKEN_TEXT (-1)
#define DSF_TOKEN_IMAGE_START 0
#define DSF_TOKEN_IMAGE 1
#define DSF_TOKEN_IMAGE_NEWLINE 2
#define DSF_TOKEN_IMAGE_END 3

/* The per-position extras of an expanded prompt of n tokens (passed with the token ids). */
typedef struct {
    const int8_t *types;  /* [n] DSF_TOKEN_*; NULL: every position is text */
    /* One row of dsf_engine_n_embd floats per position with types[i] >= 0, packed in the
     * order of those positions: the embedding that replaces the token's (vision.md §5). */
    const float *embd;
    /* [n] or NULL (all 0): what each position's content is, for prefix reuse: 0 for text;
     * for a span position a non-zero hash of the image (its bytes and token cap) and the
     * position's index in the span. Two prompts share a prefix only where ids AND keys agree. */
    const uint64_t *keys;
} dsf_media;

/* Width of the residual stream (the image block's row width). */
int dsf_engine_n_embd(const dsf_engine *e);
/* Whether the model can take image spans (its layers carry ffn.gate.bias_vl). */
bool dsf_engine_has_vision(const dsf_engine *e);

/* dsf_session_eval with per-position types and embeddings (m may be NULL: all text). Span
 * positions use their row of m->embd instead of the token embedding, route with bias_vl, are
 * DEAD in the Engram history and get Engram gate 0 (vision.md §5-§7). Fails (state unchanged)
 * when the model has no vision bias and a type is >= 0, on a type outside -1..3. */
int dsf_session_eval_media(dsf_session *s, const int32_t *tokens, const dsf_media *m, int n, float *logits,
                           bool all_rows, char *err);
/* The content keys of the session's n_past positions (0 for text; see dsf_media.keys). */
const uint64_t *dsf_session_keys(const dsf_session *s);

/* A loaded projector (mmproj GGUF, clip / deepseek41v; gguf-layout.md §5). */
typedef struct dsf_vision dsf_vision;

typedef struct {
    /* Tower arithmetic: DSF_NUMERICS_PLAIN = fp32 (the tight goldens); DSF_NUMERICS_REFERENCE =
     * bf16 activations as the official code runs it (vision.md §11). */
    dsf_numerics numerics;
    int n_threads;      /* <= 0: all online cores */
    int max_tokens;     /* default token cap per image (vision.md §2.2 M); 0 = 1024 */
    long max_pixels;    /* decoded pixel cap, checked before decoding; 0 = the default (50 Mpixel) */
} dsf_vision_params;

void dsf_vision_params_default(dsf_vision_params *p);
dsf_vision *dsf_vision_open(const char *mmproj_path, const dsf_vision_params *p, char *err);
void dsf_vision_close(dsf_vision *v);
/* The block's row width (the text model's hidden size: clip.vision.projection_dim). */
int dsf_vision_n_embd(const dsf_vision *v);

/* What the preprocessing planned for one image (vision.md §2.2-§2.3). */
typedef struct {
    int width, height;                       /* decoded size */
    int best_w, best_h;                      /* padded canvas */
    int n_vit_w, n_vit_h, n_llm_w, n_llm_h;  /* ViT patch grid, aligner grid */
    int n_tokens;                            /* span length: n_llm_h * (n_llm_w + 1) + 2 */
    int resized_w, resized_h, off_x, off_y;  /* the resize target and where it is pasted */
} dsf_image_plan;

/* One encoded image: its span's rows in span order (START, per LLM row its aligner rows then
 * NEWLINE, END), as the text model receives them. Free with dsf_image_free. */
typedef struct {
    dsf_image_plan plan;
    int n_embd;
    float *block;   /* [plan.n_tokens][n_embd] */
    uint64_t key;   /* non-zero hash of the image bytes and the token cap */
} dsf_image;

/* Decodes PNG or JPEG bytes (RGB; alpha dropped, not composited; EXIF orientation not applied),
 * plans, resizes (Pillow-exact bicubic), pads, normalises, runs the tower and the aligner.
 * max_tokens <= 0: the projector's default. A corrupt, truncated, unsupported or oversized
 * image, or one whose resize target is empty, gets -1 and a message naming the problem. */
int dsf_vision_encode(dsf_vision *v, const uint8_t *bytes, size_t len, int max_tokens, dsf_image *out,
                      char *err);
void dsf_image_free(dsf_image *im);

/* A prompt with its image placeholders expanded: tokens, types, the span rows and the keys
 * (the arrays dsf_media points at). Free with dsf_mm_prompt_free. */
typedef struct {
    int32_t *tokens;
    int8_t *types;
    float *embd;
    uint64_t *keys;
    int n;
    int n_embd;
} dsf_mm_prompt;

/* Replaces the i-th image_token_id of prompt[0..n) with images[i]'s span (vision.md §5). The
 * number of placeholders must equal n_images ("Found N image tokens but got M images"). */
int dsf_mm_expand(const int32_t *prompt, int n, int32_t image_token_id, const dsf_image *images, int n_images,
                  dsf_mm_prompt *out, char *err);
void dsf_mm_prompt_free(dsf_mm_prompt *p);
/* The dsf_media view of an expanded prompt. */
dsf_media dsf_mm_media(const dsf_mm_prompt *p);

/* ==== tokenizer ======================================================================== */

/* Byte-level BPE tokenizer read from a GGUF's tokenizer.ggml.* keys (model "gpt2", pre
 * "deepseek-v3"). Immutable once loaded: every function below may be called from several
 * threads at once. Special tokens are resolved by their text (dsf_token_id), never by a
 * hard-coded id. */
typedef struct dsf_tokenizer dsf_tokenizer;

/* Loads the tokenizer of a GGUF file (the tensors are not needed: a vocab-only file works). */
dsf_tokenizer *dsf_tokenizer_load(const char *gguf_path, char *err);
void dsf_tokenizer_free(dsf_tokenizer *tok);

int dsf_tokenizer_n_vocab(const dsf_tokenizer *tok);
int32_t dsf_tokenizer_bos(const dsf_tokenizer *tok); /* -1 if the file names none */
int32_t dsf_tokenizer_eos(const dsf_tokenizer *tok); /* -1 if none */
int32_t dsf_tokenizer_pad(const dsf_tokenizer *tok); /* -1 if none */
/* tokenizer.ggml.add_bos_token (false when absent). */
bool dsf_tokenizer_add_bos(const dsf_tokenizer *tok);

/* Text -> ids. text[0..len) is UTF-8 (invalid bytes are tokenized as single bytes).
 * add_bos: prepend the BOS id (fails if the file has none). parse_special: match CONTROL
 * tokens (e.g. "<｜User｜>") written in the text as single ids; USER_DEFINED added tokens
 * ("<think>") are matched either way, as Hugging Face and llama.cpp do. On success *out is
 * a malloc'ed array of *n_out ids (free()); returns 0 / -1 with err. */
int dsf_tokenize(const dsf_tokenizer *tok, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **out, size_t *n_out, char *err);

/* The token's string as stored in the GGUF (byte-level form for normal tokens, e.g.
 * "Ġthe"; the literal text for added tokens). NULL for an id out of range. */
const char *dsf_token_str(const dsf_tokenizer *tok, int32_t id);
/* The id of the token whose GGUF string is exactly text; -1 if there is none. */
int32_t dsf_token_id(const dsf_tokenizer *tok, const char *text);
/* GGUF token type (1 normal, 3 control, 4 user-defined, 5 unused, ...); -1 if out of range. */
int dsf_token_type(const dsf_tokenizer *tok, int32_t id);
/* The raw bytes a token stands for (not NUL-terminated, may be an incomplete UTF-8
 * sequence); for control tokens, their text. NULL for an id out of range. */
const char *dsf_token_bytes(const dsf_tokenizer *tok, int32_t id, size_t *len);

/* Ids -> text: the tokens' bytes concatenated, control tokens included only if
 * render_special; invalid UTF-8 replaced by U+FFFD. *out is malloc'ed and NUL-terminated. */
int dsf_detokenize(const dsf_tokenizer *tok, const int32_t *ids, size_t n, bool render_special,
                   char **out, size_t *out_len, char *err);

/* Streaming detokenizer: push one token at a time, get back the text that is complete so
 * far; bytes of an unfinished UTF-8 character are held back until the next push (or
 * flush). Output is always valid UTF-8 (invalid bytes become U+FFFD). */
typedef struct dsf_detok dsf_detok;
dsf_detok *dsf_detok_new(const dsf_tokenizer *tok, bool render_special);
void dsf_detok_free(dsf_detok *d);
/* *text points into d and stays valid until the next call on d. Fails on a bad id. */
int dsf_detok_push(dsf_detok *d, int32_t id, const char **text, size_t *len, char *err);
/* Emits whatever is held back (an incomplete character becomes U+FFFD) and resets. */
void dsf_detok_flush(dsf_detok *d, const char **text, size_t *len);

/* ==== chat encoder (spec chat-format.md §2, §5) ======================================== */

/* A rendered prompt. prompt: prompt_len bytes (+ a NUL; the text itself may contain NUL bytes
 * from user content). images_json: JSON array of the image records in prompt order, one per
 * <｜deepseek_image｜>. gen_reasoning: generation starts inside the reasoning (the prompt ends
 * with <think>, or a continuation re-opened the reasoning): create the output parser with
 * thinking = gen_reasoning. Free with dsf_chat_prompt_free. */
typedef struct {
    char *prompt;
    size_t prompt_len;
    char *images_json;
    bool gen_reasoning;
} dsf_chat_prompt;

/* Encoder level, byte-exact with the official encoding.py: request_json is
 * {"messages": [...], "args": {...}} where args are encode_messages' keyword arguments
 * (thinking_mode "chat"|"thinking" [required], reasoning_effort, drop_thinking, context,
 * add_default_bos_token, return_multi_modal_data). On error returns -1 and err holds the
 * official exception message (e.g. "Unknown role: developer"). */
int dsf_chat_render_json(const char *request_json, size_t len, dsf_chat_prompt *out, char *err);
/* OpenAI level: an OpenAI chat request ({"messages", "tools", "tool_choice", "response_format",
 * "reasoning_effort", "thinking"/"enable_thinking"/"thinking_mode", "chat_template_kwargs",
 * "continue_final_message"}) mapped onto the encoder as src/text/chat.h chat_map_openai documents. */
int dsf_chat_render_openai(const char *request_json, size_t len, dsf_chat_prompt *out, char *err);
void dsf_chat_prompt_free(dsf_chat_prompt *p);

/* ==== DSML tool-call output parser (spec chat-format.md §3) ============================ */

/* Streaming events. Text deltas are valid UTF-8, never split a character and never hold a
 * partial marker (e.g. "<｜DSML｜ inv"); the "\n\n" before a tool block is not content. */
typedef enum {
    DSF_DSML_REASONING = 1, /* text: reasoning_content delta */
    DSF_DSML_CONTENT,       /* text: content delta */
    DSF_DSML_TOOL_START,    /* index, name (without namespace), ns (NULL if none) */
    DSF_DSML_TOOL_ARGS,     /* index, text: the next fragment of the arguments JSON string */
    DSF_DSML_TOOL_END,      /* index: the call is complete */
} dsf_dsml_event_type;

typedef struct {
    dsf_dsml_event_type type;
    int index; /* tool call index, 0-based in output order */
    const char *text;
    size_t len;
    const char *name;
    const char *ns;
} dsf_dsml_event;

typedef void (*dsf_dsml_cb)(void *ud, const dsf_dsml_event *ev);

typedef struct {
    char *name;      /* function name without namespace */
    char *ns;        /* namespace ("ns" of "ns::name") or NULL */
    char *arguments; /* JSON object text, as the official parser builds it */
} dsf_tool_call;

typedef struct {
    char *reasoning;
    size_t reasoning_len;
    char *content;
    size_t content_len;
    dsf_tool_call *calls;
    int n_calls;
} dsf_dsml_result;

typedef struct dsf_dsml_parser dsf_dsml_parser;

/* thinking: the output starts inside the reasoning (prompt ended with <think>). strict: the
 * final result is the official parser's (parse_message_from_completion_text), including its
 * errors; otherwise the tolerant result (never fails). Streaming events are the same in both. */
dsf_dsml_parser *dsf_dsml_parser_new(bool thinking, bool strict);
/* Feeds generated text (any split, the EOS string may be included); cb may be NULL. */
void dsf_dsml_feed(dsf_dsml_parser *p, const char *text, size_t len, dsf_dsml_cb cb, void *ud);
/* Ends the stream: emits the held-back events, then fills out. Strict mode returns -1 with
 * the official error message when the output is malformed (out is then empty). */
int dsf_dsml_finish(dsf_dsml_parser *p, dsf_dsml_cb cb, void *ud, dsf_dsml_result *out, char *err);
void dsf_dsml_parser_free(dsf_dsml_parser *p);
void dsf_dsml_result_free(dsf_dsml_result *r);
/* One-shot parse of a whole completion. */
int dsf_dsml_parse(const char *text, size_t len, bool thinking, bool strict, dsf_dsml_result *out, char *err);
/* {"reasoning_content": ..., "content": ..., "tool_calls": [{"name", ["namespace",] "arguments"}]}
 * (malloc'ed, NUL-terminated). */
char *dsf_dsml_result_json(const dsf_dsml_result *r);

/* ==== constrained decoding (src/text/grammar*.c) ======================================== */

/* A compiled output constraint: what the generated text must be, as a grammar over bytes and
 * the special tokens EOS, ｜DSML｜ and </think>. Immutable once built (share it freely); the
 * generation loop applies it token by token (dsf_gen_params.grammar). spec is JSON:
 *   {"json_schema": SCHEMA}   the output is one JSON value of SCHEMA, then EOS;
 *   {"json_object": true}     the output is one JSON object, then EOS;
 *   {"tools": [{"name": QUALIFIED_NAME, "parameters": SCHEMA}, ...], "parallel": BOOL}
 *                             the output is exactly one DSML tool-calls block (spec
 *                             chat-format.md §3.1; one invoke unless parallel) after an empty
 *                             content, then EOS;
 * each with "thinking": true when the output starts inside the reasoning (free text up to
 * </think>, which must come; the constraint starts after it). The JSON-schema subset, the
 * output forms and the ignored keywords are listed at the top of src/text/grammar_schema.c.
 * tok resolves the special tokens (NULL: text-level use only). NULL + err (naming the field)
 * for a spec that is malformed, unsupported or admits no output. */
typedef struct dsf_grammar dsf_grammar;
dsf_grammar *dsf_grammar_new(const dsf_tokenizer *tok, const char *spec, size_t len, char *err);
void dsf_grammar_free(dsf_grammar *g);
/* Tokens of the shortest complete output (EOS and, when thinking, </think> included): a
 * generation needs at least this many tokens of budget. */
int dsf_grammar_min_tokens(const dsf_grammar *g);

/* ==== sampler ========================================================================== */

/* Sampling parameters. Filters are applied in llama.cpp's default order:
 *   top-k -> top-p -> min-p -> temperature -> draw,
 * top-p and min-p on the softmax of the unscaled logits (temperature 1), temperature only
 * shaping the final draw. temperature <= 0 is greedy (argmax, lowest id on ties; the
 * filters cannot change the argmax). NaN logits count as -inf.
 * max_tokens, stop strings and EOS are the generation loop's business (the sampler never
 * stops anything); ignore_eos with eos_id >= 0 makes EOS impossible to sample. */
typedef struct {
    float temperature;        /* <= 0: greedy. Default 1. */
    int top_k;                /* <= 0: off. Default 0 */
    float top_p;              /* >= 1 (or <= 0): off. Default 1 */
    float min_p;              /* <= 0: off. Default 0 */
    uint64_t seed;            /* initial rng state = dsf_rng_init(seed). Default 0 */
    int max_tokens;           /* <= 0: up to the context. Default 0 */
    const char *const *stop;  /* n_stop stop strings (the loop cuts the text before one) */
    int n_stop;
    bool ignore_eos;          /* keep generating through EOS (EOS is masked) */
    int32_t eos_id;           /* the EOS id masked by ignore_eos (-1 = none). Default -1 */
} dsf_sampler_params;

void dsf_sampler_params_default(dsf_sampler_params *p);

/* RNG state for dsf_sample: splitmix64 over one 64-bit word, so a run is reproduced by its
 * seed. Each non-greedy dsf_sample call advances the state by exactly one draw; greedy calls
 * leave it untouched. */
uint64_t dsf_rng_init(uint64_t seed);
/* Uniform double in [0, 1) (53 bits); advances the state. */
double dsf_rng_uniform(uint64_t *state);

/* Picks the next token: a pure function of (logits, params, *rng_state); the only side
 * effect is advancing *rng_state. Returns the token id, or -1 if no token is possible
 * (n_vocab <= 0, every logit -inf/NaN, or out of memory). dsf_sample allocates scratch per
 * call; dsf_sample_ws uses the caller's (dsf_sample_scratch_bytes(n_vocab) bytes, any
 * alignment of 8) and never allocates: use it in a token loop. */
int32_t dsf_sample(const float *logits, int n_vocab, const dsf_sampler_params *p,
                   uint64_t *rng_state);
size_t dsf_sample_scratch_bytes(int n_vocab);
int32_t dsf_sample_ws(const float *logits, int n_vocab, const dsf_sampler_params *p,
                      uint64_t *rng_state, void *scratch);

/* Log-softmax of the (unscaled) logits: the n_top most likely tokens, most likely first
 * (lower id first on ties), into ids[n_top] / logprobs[n_top]. Returns how many were
 * written (min(n_top, finite logits)). */
int dsf_logprobs_top(const float *logits, int n_vocab, int n_top, int32_t *ids, float *logprobs);
/* Log-softmax value of one token (-INFINITY if its logit is -inf/NaN or id out of range). */
float dsf_logprob_of(const float *logits, int n_vocab, int32_t id);

/* Stop-string matcher over streamed text. Feed it the detokenizer's output piece by piece;
 * it returns the text that is safe to show: everything except a tail that could still grow
 * into a stop string, which it holds back. When a stop string appears, the text before it
 * is returned, dsf_stop_matcher_push returns 1, and everything after is dropped. */
typedef struct dsf_stop_matcher dsf_stop_matcher;
/* Copies the strings; empty strings are ignored. */
dsf_stop_matcher *dsf_stop_matcher_new(const char *const *stop, int n_stop);
void dsf_stop_matcher_free(dsf_stop_matcher *m);
/* *out points into m, valid until the next call. Returns 1 when a stop string completed
 * (now or earlier), else 0. stop_index (may be NULL) receives the index of that string. */
int dsf_stop_matcher_push(dsf_stop_matcher *m, const char *text, size_t len, const char **out,
                          size_t *out_len, int *stop_index);
/* End of generation: returns the held-back tail (nothing if a stop string matched). */
void dsf_stop_matcher_flush(dsf_stop_matcher *m, const char **out, size_t *out_len);

/* ==== @generate: the generation loop (src/runtime/generate.c) ==================================== */

/* A dsf_gen drives one session: prefill with prefix reuse, then a sampling loop that streams
 * text (never a partial UTF-8 character, never a tail that could still become a stop string)
 * and, optionally, the DSML parser's typed events. It does not own the engine, session or
 * tokenizer (they must outlive it). One dsf_gen per session; not thread-safe. The decode
 * loop does not allocate (buffers are sized at dsf_gen_new), except to collect the text. */
typedef struct dsf_gen dsf_gen;

typedef enum {
    DSF_FINISH_NONE = 0,   /* not finished (internal) */
    DSF_FINISH_STOP,       /* EOS or a stop string */
    DSF_FINISH_LENGTH,     /* max_tokens reached, or the context (session max_ctx) is full */
    DSF_FINISH_TOOL_CALLS, /* EOS after a DSML tool-call block (parse_dsml only) */
    DSF_FINISH_CANCELLED,  /* the cancel callback said so */
    DSF_FINISH_ERROR,      /* an eval or sampling failure (the call returned -1) */
} dsf_finish_reason;

/* "stop", "length", "tool_calls", "cancelled", "error" ("none" for DSF_FINISH_NONE). */
const char *dsf_finish_reason_str(dsf_finish_reason r);

/* Prefill progress: done of total tokens to evaluate (the cached prefix is not counted);
 * called once with done = 0 before the first chunk and after every chunk. Return non-zero
 * to cancel the prefill (dsf_gen_prefill then fails with "cancelled"). */
typedef int (*dsf_gen_progress_cb)(void *ud, int done, int total);

/* One sampled token, passed to dsf_gen_params.on_token before its text is streamed. */
typedef struct {
    int32_t id;
    const char *piece;   /* the text this token completed (detokenizer output before stop
                            matching; may be empty while a UTF-8 character is unfinished) */
    size_t piece_len;
    bool is_eos;
    float logprob;       /* log-softmax (unscaled logits) of id; 0 unless params.logprobs */
    int n_top;           /* entries in top_ids/top_logprobs (0 unless params.top_logprobs > 0) */
    const int32_t *top_ids;
    const float *top_logprobs;
} dsf_gen_token;

typedef struct {
    /* Sampling and stopping: temperature/top-k/top-p/min-p/seed; max_tokens (<= 0: until the
     * context is full); stop strings; ignore_eos. eos_id < 0 is resolved from the tokenizer
     * (its eos, else "<｜end▁of▁sentence｜>" by string). The rng starts at dsf_rng_init(seed). */
    dsf_sampler_params sampler;
    bool logprobs;          /* fill dsf_gen_token.logprob */
    int top_logprobs;       /* 0..20 alternatives per token in dsf_gen_token */
    /* DSML: feed the generated text (EOS string included at the end) to a parser created
     * with thinking = dsml_thinking (dsf_chat_prompt.gen_reasoning) and forward its events. */
    bool parse_dsml;
    bool dsml_thinking;
    /* Callbacks (each may be NULL), all with ud: */
    void (*on_text)(void *ud, const char *text, size_t len); /* visible text, in order */
    dsf_dsml_cb on_dsml;                                     /* parse_dsml events */
    void (*on_token)(void *ud, const dsf_gen_token *tok);    /* per sampled token */
    int (*cancel)(void *ud);  /* polled before each token; non-zero stops with "cancelled" */
    void *ud;
    /* Constrained decoding (NULL: off): before each draw the logits of tokens the grammar
     * does not allow next are set to -inf, and so are those after which the output could
     * no longer be completed within the tokens left (max_tokens and the context); EOS is
     * allowed only where the grammar accepts, and ignore_eos is then ignored. logprob and
     * top logprobs are those of the constrained (sampled) distribution. The grammar must
     * outlive the generation; built with the generation's tokenizer. */
    const dsf_grammar *grammar;
} dsf_gen_params;

/* Defaults: dsf_sampler_params_default, no logprobs, no DSML, no callbacks. */
void dsf_gen_params_default(dsf_gen_params *p);

typedef struct {
    dsf_finish_reason finish;
    int stop_index;          /* index of the stop string that matched, else -1 */
    int n_prompt;            /* prompt tokens of the last prefill */
    int n_cached;            /* of those, reused from the session (not evaluated) */
    int n_completion;        /* sampled tokens (EOS included) */
    double prefill_s, decode_s;        /* wall seconds */
    double prefill_tps, decode_tps;    /* evaluated prompt tokens / s; sampled tokens / s (0 if none) */
    char *text;              /* the visible text (after stop cutting; no EOS), malloc'ed, NUL-ended */
    size_t text_len;
    /* parse_dsml only: the final parse. dsml_strict_ok: the official strict parser accepted
     * the output (it then is the result); otherwise the tolerant parser's result. */
    bool has_dsml;
    bool dsml_strict_ok;
    dsf_dsml_result dsml;
} dsf_gen_result;

void dsf_gen_result_free(dsf_gen_result *r);

/* Binds (engine, session, tokenizer); allocates the decode buffers. NULL + err on failure
 * (e.g. the tokenizer's vocabulary is larger than the model's). */
dsf_gen *dsf_gen_new(dsf_engine *e, dsf_session *s, const dsf_tokenizer *tok, char *err);
void dsf_gen_free(dsf_gen *g);

/* Makes the session hold exactly prompt[0..n) and keeps the logits after its last token.
 * Reuses the longest common prefix of dsf_session_tokens() and the prompt (rolling the
 * session back to it; at least one token is always evaluated, so a fully cached prompt
 * rolls back by one), then evaluates the rest in chunks of `chunk` tokens (<= 0: the engine's
 * dsf_engine_ubatch, one forward each), calling progress after each. n >= 1. On failure (bad id, context too small, cancelled)
 * returns -1 with err; the session then holds some prefix of the prompt. */
int dsf_gen_prefill(dsf_gen *g, const int32_t *prompt, int n, int chunk, dsf_gen_progress_cb progress,
                    void *ud, char *err);
/* dsf_gen_prefill with image spans (see dsf_gen_prefill_begin_media). */
int dsf_gen_prefill_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                          dsf_gen_progress_cb progress, void *ud, char *err);
/* Tokens reused by the last prefill (0 before any). */
int dsf_gen_n_cached(const dsf_gen *g);

/* Decodes after a successful dsf_gen_prefill (the session must not have been touched in
 * between). Fills *out (free with dsf_gen_result_free) and returns 0; finish says why it
 * stopped. Returns -1 with err (and out->finish = DSF_FINISH_ERROR, the text so far kept) when
 * an eval fails or no token can be sampled. The last sampled token is not evaluated when the
 * loop ends (the session holds the prompt and all but the last completion token). */
int dsf_gen_decode(dsf_gen *g, const dsf_gen_params *p, dsf_gen_result *out, char *err);

/* prefill (default chunk) + decode in one call. progress (may be NULL) is called with p->ud;
 * p->cancel is also polled between prefill chunks. A cancelled prefill returns 0 with
 * finish = DSF_FINISH_CANCELLED and no completion; other prefill failures return -1. */
int dsf_gen_run(dsf_gen *g, const int32_t *prompt, int n, const dsf_gen_params *p,
                dsf_gen_progress_cb progress, dsf_gen_result *out, char *err);

/* ---- step-wise use: the caller evaluates the tokens (e.g. several generators' decode steps
 * in one dsf_batch_eval). dsf_gen_prefill and dsf_gen_decode are these steps in a loop:
 *
 *     left = dsf_gen_prefill_begin(g, prompt, n, chunk, err);      // -1: error
 *     while (left > 0) left = dsf_gen_prefill_step(g, err);         // one chunk each
 *     dsf_gen_begin(g, &params, err);
 *     const float *lg = NULL;                                       // the prefill's logits
 *     while (dsf_gen_next(g, lg, &tok, err) == DSF_FINISH_NONE) {
 *         evaluate tok on the session into row (alone or batched); lg = row;
 *         if that failed: dsf_gen_fail(g, why); break;
 *     }
 *     dsf_gen_end(g, &result, err);
 */

/* Starts a prefill: prefix reuse and rollback as in dsf_gen_prefill, no eval. Returns the
 * number of tokens left to evaluate (>= 1), or -1 with err. prompt must stay valid until the
 * prefill completes. */
int dsf_gen_prefill_begin(dsf_gen *g, const int32_t *prompt, int n, int chunk, char *err);
/* dsf_gen_prefill_begin for a prompt with image spans (m: per-position extras, as in
 * dsf_session_eval_media; NULL = text). Prefix reuse compares ids and keys; a chunk never ends
 * inside a span (it is extended to the span's end). m's arrays must stay valid until the
 * prefill completes. */
int dsf_gen_prefill_begin_media(dsf_gen *g, const int32_t *prompt, const dsf_media *m, int n, int chunk,
                                char *err);
/* Evaluates the next chunk; returns the tokens still left (0: complete, the logits after the
 * last prompt token are kept for dsf_gen_begin) or -1 with err (the prefill is abandoned).
 * Abandon a prefill at any point by simply not stepping it further. */
int dsf_gen_prefill_step(dsf_gen *g, char *err);
/* Starts decoding after a complete prefill with the parameters p (copied; the stop strings
 * and ud must outlive the generation). 0, or -1 with err (bad parameters, no prefill). */
int dsf_gen_begin(dsf_gen *g, const dsf_gen_params *p, char *err);
/* One step: polls p->cancel, samples from logits ([n_vocab] of the model; NULL only on the
 * first step, meaning the prefill's logits), detokenizes, streams, matches stop strings and
 * feeds the DSML parser. Returns DSF_FINISH_NONE with *tok_to_eval = the sampled token,
 * which the caller must append to the session before the next step (passing the logits after
 * it); otherwise the generation is over and the value says why (DSF_FINISH_STOP,
 * DSF_FINISH_LENGTH, DSF_FINISH_CANCELLED; DSF_FINISH_ERROR with err; the upgrade of STOP
 * to TOOL_CALLS is dsf_gen_end's) and *tok_to_eval = -1. Once over it keeps returning that. */
dsf_finish_reason dsf_gen_next(dsf_gen *g, const float *logits, int32_t *tok_to_eval, char *err);
/* The caller could not evaluate the token dsf_gen_next returned: the generation ends with
 * DSF_FINISH_ERROR and msg (copied) becomes dsf_gen_end's error. No-op unless running. */
void dsf_gen_fail(dsf_gen *g, const char *msg);
/* Ends the generation begun by dsf_gen_begin (one still running counts as cancelled): flushes
 * held-back text, finishes the DSML parse and fills *out as dsf_gen_decode does (same return
 * value: -1 with err and finish DSF_FINISH_ERROR after a failed step). */
int dsf_gen_end(dsf_gen *g, dsf_gen_result *out, char *err);

/* ==== several processes: an MPI job (README "Several machines (MPI)"; docs/ARCHITECTURE.md net/, model/dist) */

/* Call first in main. Takes the job's options out of argv: --parallel pipeline|experts|
 * pipeline,experts (starts MPI; the engine opened next is spread over the ranks: stages of
 * layers, experts split within a stage), --pp-split L1,L2,... (the first layer of each stage
 * after the first), --stages S (pipeline,experts: the stages; default 2), --mpi-timeout S (a
 * wait on data, default 600 s) and --mpi-liveness S (a silent rank is dead after it, default
 * 10 s). Without --parallel nothing starts and the process runs alone, as without MPI (it
 * refuses to run as one of several ranks). -1 with err: a bad option, no MPI in this build. */
int dsf_dist_init(int *argc, char ***argv, char *err);
int dsf_dist_rank(void); /* 0 without a job */
int dsf_dist_size(void); /* 1 without a job */
/* Async-signal-safe: a SIGTERM handler of the program calls it (mpirun stops the job that way
 * when a rank dies): every wait on another rank then fails at once. */
void dsf_dist_signal_stop(void);
/* Why the job failed (a rank died or hangs, a wait timed out, the launcher stops the job), or
 * NULL while it has not. It checks every rank's liveness as it is called, so a process that
 * waits on no rank (an idle server polling it) learns of a silent rank too. */
const char *dsf_dist_failure(void);
/* Ends this process of the job with code (finalizes MPI unless the job failed); a no-op
 * without a job. On rank 0 dsf_engine_close already ended the other ranks. */
void dsf_dist_end(int code);

/* How an engine would be spread over `ranks` ranks (no MPI needed: dsflash inspect --parallel):
 * one line per cut (the bytes per token it carries) and per rank (its layers, experts, weight
 * bytes, KV bytes per token). parallel: "pipeline", "experts" or "pipeline,experts"; split,
 * stages: as --pp-split and --stages (NULL, 0: chosen). */
int dsf_dist_describe(const dsf_engine *e, const char *parallel, int ranks, const char *split, int stages,
                      void (*emit)(void *ud, const char *line), void *ud, char *err);

/* The traffic of each rank since the last reset (rank 0 asks the others), and its memory. */
typedef struct {
    uint64_t bytes_sent, msgs_sent, bytes_recv, msgs_recv;
    double wait_s;      /* seconds spent waiting on other ranks */
    uint64_t rss_bytes; /* the rank's resident memory (VmRSS) when asked; 0 unknown */
} dsf_dist_rank_stats;
/* Fills out[0..min(size, max)) (rank order); returns the count, 0 without a job, -1 with err. */
int dsf_dist_stats(dsf_engine *e, dsf_dist_rank_stats *out, int max, char *err);
void dsf_dist_stats_reset(dsf_engine *e);

#ifdef __cplusplus
}
#endif
#endif
