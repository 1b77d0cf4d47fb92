/* convert.h: the Hugging Face DeepSeek-V4.1 checkpoint -> `deepseek41` GGUF converter
 * (gguf-layout.md §2-§3, §6; architecture.md §2-§4.2), and the Engram constants it computes
 * (architecture.md §4.2.1-§4.2.2), which live in engram_consts.c. */
#ifndef DSF_CONVERT_H
#define DSF_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Engram constants (engram_consts.c) ---- */

/* Bucket moduli of every (layer, n-gram order, head), layer-major then order then head
 * (architecture.md §4.2.2): for each order, start from vocab-1 and take the next prime not
 * used by any earlier column. out holds n_layers*(ngram-1)*n_heads values. vocab must be
 * in [2, 2^31). Returns 0 / -1 with err. */
int engram_primes(int n_layers, int ngram, int n_heads, uint64_t vocab, uint64_t *out, char *err);

/* numpy.random.default_rng(seed).integers(low, high, size=n, dtype=int64) with high
 * exclusive, reproduced bit for bit (SeedSequence -> PCG64 XSL-RR -> Lemire bounded ints).
 * seed < 2^64, low < high. */
void numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int n, int64_t *out);

/* Odd hash multipliers, module-major: out[e*ngram + s] = 2*v+1 with
 * v = default_rng(10007*layer_ids[e]).integers(0, max(1, (INT64_MAX // cvocab) // 2), ngram). */
void engram_multipliers(const uint32_t *layer_ids, int n_layers, int ngram, uint64_t cvocab, uint64_t *out);

/* The compressed token map (architecture.md §4.2.1) of tokenizer.json: for each id in
 * [0, len(tokenizer)), decode the single token (byte-level), normalize it (NFKC, NFD,
 * strip combining marks, lowercase, whitespace rules with the sentinel step) and number
 * the distinct keys in order of first appearance. *map is malloc'ed with *n entries;
 * *n_compressed is the number of distinct keys. 0 / -1 with err. */
int engram_token_map(const char *tokenizer_json, int32_t **map, int64_t *n, int64_t *n_compressed, char *err);

/* The normalizer pipeline alone, on one UTF-8 string: returns a malloc'ed string
 * (possibly empty) and its length, or NULL for invalid UTF-8. Exposed for tests. */
char *engram_normalize(const char *s, size_t len, size_t *out_len);

/* ---- converter (convert.c, convert_tensors.c) ---- */

typedef struct {
    bool f32;            /* --outtype f32 */
    bool native;         /* --outtype native: FP8 weights and Engram rows as dsflash's native types
                          * (docs/FORMAT.md), everything else as bf16 */
    int threads;         /* <= 1: single-threaded */
    bool progress;       /* draw a progress bar on stderr */
    const char *name;    /* general.name; NULL: derived from the directory name */
    bool dspark;         /* --dspark: write the DSpark draft (`dflash`, gguf-layout.md §4) instead */
} convert_opts;

/* Converts hf_dir (config.json, tokenizer files, model.safetensors[.index.json]) into a GGUF
 * written at out_path (the caller handles .tmp and rename): the `deepseek41` main model, or with
 * o->dspark the `dflash` draft of its mtp.* stages (gguf-layout.md §4; default name DIR-dspark). Validates the whole checkpoint
 * and config before writing anything. Returns 0 / -1 with err. */
int convert_checkpoint(const char *hf_dir, const char *out_path, const convert_opts *o, char *err);

/* Converts hf_dir's vision tower, aligner and image delimiters (vision_config, vision.*, aligner.*,
 * image_start/end/newline) into the deepseek41v projector GGUF at out_path (gguf-layout.md §5;
 * convert_mmproj.c): 2-D weights BF16, or F32 with o->f32; o->name, o->threads and o->progress as
 * above (default name: the model's). Refuses o->native and o->dspark. 0 / -1 with err. */
int convert_mmproj(const char *hf_dir, const char *out_path, const convert_opts *o, char *err);

/* Writes a GGUF holding only general.architecture and the tokenizer metadata of dir. */
int convert_vocab_only(const char *dir, const char *out_path, char *err);

#endif
