/* replay.c: deterministic robustness tests: the libFuzzer harnesses of tests/fuzz, fed
 * by a fixed-seed mutation loop instead of libFuzzer, so that `make test` and `make asan`
 * check every parser on hundreds to thousands of hostile inputs each (about 5 s in all
 * under ASan; `make fuzz` is the long-running, coverage-guided version).
 *
 * Guards against: crashes, overreads, leaks and broken promises of a parser on malformed,
 * truncated or random input (GGUF, model metadata, safetensors, tokenizer text and ids,
 * vocabularies, chat-request JSON, DSML output in random splits, HTTP request bodies (chat,
 * completions, Anthropic Messages and Responses), session snapshots, logits with NaN/inf,
 * stop strings, the MPI followers' eval and batch payloads, the stream between MPI stages, DSpark draft metadata, PNG and JPEG images with the preprocessing behind
 * them, deepseek41v projector metadata, a serve request's images: base64, image headers, data:
 * URLs). What each harness checks is written at the top of its file in tests/fuzz. The seeds are the files in
 * tests/fuzz/seeds/fuzz_NAME (read from the repository root, as `make test` runs) plus a
 * few inline ones, so the tests still run without them; the model and snapshot tests need
 * ../shared/testdata/tiny41 and skip without it. A broken invariant aborts the test child
 * after printing the input (hex) and its iteration number; runs are reproducible (the
 * mutation rng is seeded by the test name). */
#include "test.h"

#define FUZZ_NO_MAIN
#include "fuzz_common.h"
#include "fuzz_chat.c"
#include "fuzz_dataurl.c"
#include "fuzz_distmsg.c"
#include "fuzz_diststream.c"
#include "fuzz_dsml.c"
#include "fuzz_grammar.c"
#include "fuzz_image.c"
#include "fuzz_imatrix.c"
#include "fuzz_messages.c"
#include "fuzz_model.c"
#include "fuzz_pcache.c"
#include "fuzz_dspark.c"
#include "fuzz_mmproj.c"
#include "fuzz_safetensors.c"
#include "fuzz_sampler.c"
#include "fuzz_responses.c"
#include "fuzz_server.c"
#include "fuzz_snapshot.c"
#include "fuzz_tokenizer.c"
#include "fuzz_vocab.c"
#include "fuzz_webui.c"
#define LLVMFuzzerTestOneInput fz_gguf_one
#include "fuzz_gguf.c"
#undef LLVMFuzzerTestOneInput

#include <dirent.h>

/* ---- the mutation loop ------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n;
} fi_seed;

typedef struct {
    fi_seed *v;
    int n;
} fi_seeds;

static const uint8_t *g_cur;
static size_t g_cur_n;
static int g_iter;

static void fi_dump(void) {
    fprintf(stderr, "input #%d (%zu bytes):", g_iter, g_cur_n);
    for (size_t i = 0; i < g_cur_n && i < 4096; i++) fprintf(stderr, "%s%02x", i % 32 ? "" : "\n  ", g_cur[i]);
    fputc('\n', stderr);
}

static void fi_add(fi_seeds *s, const void *p, size_t n) {
    s->v = dsf_xrealloc(s->v, (size_t)(s->n + 1) * sizeof *s->v);
    s->v[s->n].p = dsf_xmalloc(n ? n : 1);
    if (n) memcpy(s->v[s->n].p, p, n);
    s->v[s->n].n = n;
    s->n++;
}

static int fi_cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds every file of tests/fuzz/seeds/NAME (sorted by name, at most 64 KiB each). */
static void fi_add_dir(fi_seeds *s, const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz/seeds/%s", name);
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[256];
    int nn = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nn < 256)
        if (e->d_name[0] != '.') names[nn++] = dsf_xstrdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)nn, sizeof *names, fi_cmp_name);
    for (int i = 0; i < nn; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint8_t *buf;
        size_t len;
        if (dsf_read_file(path, &buf, &len, NULL) == 0) {
            fi_add(s, buf, len < 65536 ? len : 65536);
            free(buf);
        }
        free(names[i]);
    }
}

static void fi_free(fi_seeds *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i].p);
    free(s->v);
}

/* Tokens the mutator splices in: the markers and syntax every parser here keys on. */
static const char *const k_dict[] = {
    "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", "\n\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C calls>", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C invoke>",
    "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C invoke name=\"", "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C parameter name=\"",
    "\" string=\"true\">", "\" string=\"false\">", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C parameter>", "<think>", "</think>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
    "{\"messages\": [", "{\"role\": \"user\", \"content\": \"", "\"tool_calls\": [", "\"args\": {\"thinking_mode\": \"thinking\"}",
    "\"prompt\": [1, 2, 3]", "\"stop\": [\"\", \"a\"]", "\"max_tokens\": 99999", "\\u0000", "\\ud800", "1e999", "-0.0",
    "NaN", "null", "[[[[", "}}}", "\"dtype\": \"BF16\"", "\"shape\": [4294967296, 4294967296]",
    "\"data_offsets\": [0, 18446744073709551615]", "\xFF\xFF\xFF\x7F", "\x00\x00\x80\x7F", "\x00\x00\xC0\x7F",
    "\xF0\x9F\x98", "\xED\xA0\x80", "\xC0\x80", "\r\n", "   ", "12345",
};

/* Applies 1..4 random edits to a copy of s in b. */
static void fi_mutate(dsf_buf *b, const fi_seed *s, uint64_t *rng) {
    b->len = 0;
    dsf_buf_append(b, s->p, s->n);
    int edits = 1 + (int)(fz_rand(rng) % 4);
    for (int k = 0; k < edits; k++) {
        uint64_t r = fz_rand(rng);
        size_t n = b->len, at = n ? (size_t)((r >> 8) % (n + 1)) : 0;
        switch (r % 8) {
        case 0: /* flip a byte */
            if (at < n) b->data[at] ^= (uint8_t)(1u << ((r >> 40) % 8));
            break;
        case 1: /* set a byte to an interesting value */
            if (at < n) {
                static const uint8_t v[] = {0, 0xFF, 0x7F, 0x80, '"', '\\', '<', '\n', '}', ']', '0', '9'};
                b->data[at] = v[(r >> 40) % sizeof v];
            }
            break;
        case 2: { /* delete a range */
            size_t len = (size_t)((r >> 40) % 16) + 1;
            if (at + len > n) len = n - at;
            memmove(b->data + at, b->data + at + len, n - at - len);
            b->len -= len;
            break;
        }
        case 3: /* truncate */
            b->len = at;
            break;
        case 4: case 5: { /* splice a dictionary token */
            const char *t = k_dict[(r >> 40) % (sizeof k_dict / sizeof k_dict[0])];
            size_t tl = strlen(t) ? strlen(t) : 1, old = b->len;
            dsf_buf_reserve(b, tl);
            memmove(b->data + at + tl, b->data + at, old - at);
            memcpy(b->data + at, t, tl);
            b->len = old + tl;
            break;
        }
        case 6: { /* duplicate a range */
            size_t len = (size_t)((r >> 40) % 64) + 1;
            if (at + len > n) len = n - at;
            if (!len) break;
            uint8_t tmp[64];
            memcpy(tmp, b->data + at, len);
            dsf_buf_reserve(b, len);
            memmove(b->data + at + len, b->data + at, n - at);
            memcpy(b->data + at, tmp, len);
            b->len = n + len;
            break;
        }
        default: { /* overwrite 4 bytes with a random word (lengths, offsets, floats) */
            uint32_t w = (uint32_t)(r >> 32);
            for (int i = 0; i < 4 && at + (size_t)i < n; i++) b->data[at + i] = (uint8_t)(w >> (8 * i));
            break;
        }
        }
    }
}

static uint64_t fi_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* Runs each seed as is, then iters mutants, through one(); returns how many inputs the
 * parser accepted (one() returned 1). */
static int fi_run(const char *name, fi_seeds *s, int iters, int (*one)(const uint8_t *, size_t), int *total) {
    int accepted = 0;
    *total = s->n + (s->n ? iters : 0);
    fz_on_fail = fi_dump;
    uint64_t rng = fi_hash(name);
    dsf_buf b = {0};
    for (int i = 0; i < s->n; i++) {
        g_iter = -1 - i;
        g_cur = s->v[i].p;
        g_cur_n = s->v[i].n;
        accepted += one(s->v[i].p, s->v[i].n) == 1;
    }
    for (int it = 0; it < iters && s->n; it++) {
        fi_mutate(&b, &s->v[fz_rand(&rng) % (uint64_t)s->n], &rng);
        /* mutate a mutant now and then: deeper edits */
        if (it % 4 == 3 && b.len) {
            fi_seed tmp = {dsf_xmalloc(b.len), b.len};
            memcpy(tmp.p, b.data, b.len);
            fi_mutate(&b, &tmp, &rng);
            free(tmp.p);
        }
        g_iter = it;
        g_cur = b.data ? b.data : (const uint8_t *)"";
        g_cur_n = b.len;
        accepted += one(g_cur, g_cur_n) == 1;
    }
    dsf_buf_free(&b);
    fi_free(s);
    return accepted;
}

/* The loop must reach both sides of a parser: a mutator that only produced garbage (or only
 * valid inputs) would make the test vacuous. */
#define FI_CHECK_MIX(acc, total) \
    CHECKF((acc) > (total) / 100 && (acc) < (total), "accepted %d of %d inputs: the mutants do not reach both sides", \
           (acc), (total))

/* ---- one test per parser ----------------------------------------------------------------- */

/* Seeds from the embedded files themselves: their ETags are computed at build time. */
TEST(replay_webui) {
    fi_seeds s = {0};
    for (int i = 0; i <= webui_n_files; i++) {
        const char *e = i < webui_n_files ? webui_files[i].etag : "\"x\"";
        char b[160];
        int n = snprintf(b, sizeof b, "%c%s", (char)i, e);
        fi_add(&s, b, (size_t)n);
        n = snprintf(b, sizeof b, "%cW/\"a\", W/%s,*", (char)(i | 0x80), e);
        fi_add(&s, b, (size_t)n);
    }
    int total, acc = fi_run("webui", &s, 2000, fz_webui_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_tokenizer) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_tokenizer");
    static const char t1[] = "The quick brown fox, 12345 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD <think>x</think>\n\n";
    fi_add(&s, t1, sizeof t1 - 1);
    fi_add(&s, "\xFF\xFE\x80 \xC3", 5);
    int total, acc = fi_run("tokenizer", &s, 300, fz_tokenizer_one, &total);
    CHECKF(acc == total, "the tokenizer refused %d of %d inputs (it takes any bytes)", total - acc, total);
}

TEST(replay_dsml) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_dsml");
    static const char t1[] = "\x01\x01\x02\x03\x04\x05\x06\x07\x08r</think>c\n\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C calls>\n"
                             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C invoke name=\"f\">\n\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C invoke>\n"
                             "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C calls>";
    fi_add(&s, t1, sizeof t1 - 1);
    int total, acc = fi_run("dsml", &s, 1000, fz_dsml_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_grammar) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_grammar");
    static const char *const seeds[] = {
        "\x10\x01\x02\x03\x04\x05\x06\x07\x08{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"maxLength\": 4},"
        " \"b\": {\"type\": \"array\", \"items\": {\"enum\": [1, \"x\", null]}}, \"c\": {\"anyOf\": [{\"type\": \"number\"},"
        " {\"$ref\": \"#/$defs/d\"}]}}, \"required\": [\"a\", \"c\"], \"$defs\": {\"d\": {\"type\": [\"boolean\", \"null\"]}}}",
        "\x01\x09\x08\x07\x06\x05\x04\x03\x02true",
        "\x06\x11\x12\x13\x14\x15\x16\x17\x18[{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\":"
        " {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}, \"o\": {\"type\": \"object\", \"properties\": {\"x\": {}}}},"
        " \"required\": [\"q\"]}}, {\"name\": \"ns::g\"}]",
        "\x03\x21\x22\x23\x24\x25\x26\x27\x28[{\"name\": \"h\", \"parameters\": {\"properties\": {\"e\": {\"enum\": [\"a<b\", \"c\"]}}}}]",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) fi_add(&s, seeds[i], strlen(seeds[i]));
    int total, acc = fi_run("grammar", &s, 2000, fz_grammar_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_chat) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_chat");
    static const char t1[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"args\": {\"thinking_mode\": \"thinking\"}}";
    fi_add(&s, t1, sizeof t1 - 1);
    int total, acc = fi_run("chat", &s, 1500, fz_chat_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_server) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_server");
    static const char t1[] = "\x00{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"a\", \"\"], \"max_tokens\": 5, "
                             "\"logprobs\": true, \"top_logprobs\": 3, \"temperature\": 0.5}";
    static const char t2[] = "\x01{\"prompt\": \"Hello there\", \"max_tokens\": 3, \"logprobs\": 2, \"seed\": -1}";
    static const char t3[] = "\x81{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8], \"max_tokens\": 1}";
    fi_add(&s, t1, sizeof t1 - 1);
    fi_add(&s, t2, sizeof t2 - 1);
    fi_add(&s, t3, sizeof t3 - 1);
    int total, acc = fi_run("server", &s, 1500, fz_server_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_messages) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_messages");
    static const char t1[] = "\x00{\"model\": \"m\", \"max_tokens\": 5, \"system\": [{\"type\": \"text\", \"text\": \"s\"}], "
                             "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop_sequences\": [\"a\"]}";
    static const char t2[] = "\x01{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                             "\"tool_result\", \"tool_use_id\": \"t\", \"is_error\": true, \"content\": \"x\"}]}]}";
    static const char t3[] = "\x81{\"model\": \"m\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\", "
                             "\"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}";
    fi_add(&s, t1, sizeof t1 - 1);
    fi_add(&s, t2, sizeof t2 - 1);
    fi_add(&s, t3, sizeof t3 - 1);
    int total, acc = fi_run("messages", &s, 1500, fz_messages_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_responses) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_responses");
    static const char t1[] = "\x00{\"input\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_output_tokens\": 4}";
    fi_add(&s, t1, sizeof t1 - 1);
    int total, acc = fi_run("responses", &s, 1500, fz_responses_one, &total);
    FI_CHECK_MIX(acc, total);
}

/* base64 texts (canonical, unpadded, broken), PNG and JPEG heads, and image records. */
TEST(replay_dataurl) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_dataurl");
    static const char *const texts[] = {"\0Zm9vYmFy", "\0Zm9vYg==", "\0Zm8", "\0Zh==",
        "\1\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x05\x00\x00\x00\x03\x08\x02\x00\x00\x00\xd4\x54\x52\xaf",
        "\1\xff\xd8\xff\xe0\x00\x04\x61\x62\xff\xc0\x00\x0b\x08\x00\x10\x00\x20\x01\x01\x11\x00",
        "\2[{\"type\": \"image\", \"url\": \"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAUAAAADCAIAAADUVFKv\"}]",
        "\2[{\"type\": \"image\", \"source\": {\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"iVBORw0KGgoAAAANSUhEUgAAAAUAAAADCAIAAADUVFKv\"}}]",
        "\2[{\"type\": \"image\", \"url\": \"https://example.com/a.png\"}]"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) fi_add(&s, texts[i], strlen(texts[i]));
    int total, acc = fi_run("dataurl", &s, 2000, fz_dataurl_one, &total);
    FI_CHECK_MIX(acc, total);
}

/* Valid entries (header + payload) with each flag combination, and a short file. */
TEST(replay_distmsg) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_distmsg");
    /* flags (eval, n from the length), n_embd, count bits, 2 tokens; then a batch of 1 */
    fi_add(&s, "\x00\x04\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00", 14);
    fi_add(&s, "\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00", 18);
    int total, acc = fi_run("distmsg", &s, 3000, fz_distmsg_one, &total);
    FI_CHECK_MIX(acc, total);
}

/* Chunks of 1..8 tokens at several positions, at every cut with and without the lists, intact,
 * truncated and patched (the header's magic and T, a list count). */
TEST(replay_diststream) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    (void)gg;
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_diststream");
    /* T - 1, position, cut (bits 7, 6: the lists), flags, truncation, then patches */
    fi_add(&s, "\x00\x05\x02\x00\x00\x00", 6);
    fi_add(&s, "\x03\x07\xc3\x02\x00\x00", 6);
    fi_add(&s, "\x07\x0b\xc6\x02\x00\x00", 6);
    fi_add(&s, "\x05\x17\x45\x00\x00\x00", 6);
    fi_add(&s, "\x02\x03\x86\x01\x40\x00", 6);
    fi_add(&s, "\x01\x01\x01\x00\x00\x00\x00\x00\x53", 9);
    fi_add(&s, "\x01\x01\x01\x00\x00\x00\x04\x00\x09", 9);
    fi_add(&s, "\x03\x07\xc3\x04\x00\x03", 6);
    fi_add(&s, "\x05\x0b\x81\x06\x00\x0c", 6);
    int total, acc = fi_run("diststream", &s, 1500, fz_diststream_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_pcache) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_pcache");
    for (int k = 0; k < 4; k++) {
        uint8_t e[1 + PCACHE_HDR_BYTES + 40];
        for (int i = 0; i < 40; i++) e[1 + PCACHE_HDR_BYTES + i] = (uint8_t)(i * 37 + k);
        pcache_hdr h = {.version = 1, .n_tokens = 5u + (unsigned)k, .key = {7, 9}, .ident = 3, .payload_len = 40,
                        .payload_sum = pcache_sum(e + 1 + PCACHE_HDR_BYTES, 40)};
        pcache_hdr_write(&h, e + 1);
        e[0] = (uint8_t)k;
        fi_add(&s, e, sizeof e);
    }
    fi_add(&s, "\3DSFPCE1", 9);
    int total, acc = fi_run("pcache", &s, 2000, fz_pcache_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_safetensors) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_safetensors");
    static const char t1[] = "\x00\x3c\x00\x00\x00\x00\x00\x00\x00{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}   \x01\x02\x03\x04";
    fi_add(&s, t1, sizeof t1 - 1);
    int total, acc = fi_run("safetensors", &s, 500, fz_safetensors_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_imatrix) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_imatrix");
    CHECKF(s.n > 0, "no seed under tests/fuzz/seeds/fuzz_imatrix");
    int total, acc = fi_run("imatrix", &s, 400, fz_imatrix_one, &total);
    FI_CHECK_MIX(acc, total);
}

/* Tiny PNGs (8/16-bit, palette with tRNS, Adam7, grey+alpha) and JPEGs (RGB, progressive
 * grey, CMYK) from the seed folder, behind the 3 parameter bytes of fuzz_image.c. */
TEST(replay_image) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_image");
    /* cap 129 pixels, M 12, min_pixels 196; a 2x1 RGB PNG */
    static const char t1[] = "\x02\x08\x01\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x02\x00\x00\x00\x01"
                             "\x08\x02\x00\x00\x00\x7b\x40\xe8\xdd\x00\x00\x00\x0fIDAT\x78\xda\x63\x38\xc1\x25"
                             "\xc2\xfa\xcb\x06\x00\x07\x78\x02\x22\x29\x81\x39\x3e\x00\x00\x00\x00IEND\xae\x42\x60\x82";
    fi_add(&s, t1, sizeof t1 - 1);
    int total, acc = fi_run("image", &s, 1500, fz_image_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_sampler) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_sampler");
    /* part, temperature, top_k, top_p, min_p, ignore_eos, eos (u32), seed (u64), logits */
    uint8_t t1[18 + 4 * 16] = {0, 96, 12, 180, 20, 1, 3, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7};
    float lg[16] = {1.0f, -2.0f, 3.5f, 3.5f, NAN, -INFINITY, INFINITY, 0.0f, -0.0f, 1e-40f, -1e30f, 1e30f, 2.0f, 2.0f, -1.0f, 0.5f};
    memcpy(t1 + 18, lg, sizeof lg);
    fi_add(&s, t1, sizeof t1);
    t1[1] = 10; /* greedy */
    fi_add(&s, t1, sizeof t1);
    static const char t2[] = "\x01\x03stop\0op\0\xE2\x80\0text that has a sto and a stop in it \xE2\x80\xA6";
    fi_add(&s, t2, sizeof t2 - 1);
    int total, acc = fi_run("sampler", &s, 3000, fz_sampler_one, &total);
    FI_CHECK_MIX(acc, total);
}

/* fuzz_gguf.c's harness, plus whether the reader accepted the input. */
static int fi_gguf_one(const uint8_t *data, size_t size) {
    fz_gguf_one(data, size);
    char err[DSF_ERR_LEN];
    gguf_file *f = gguf_open_mem(data, size, "fuzz.gguf", err);
    int ok = f != NULL;
    gguf_close(f);
    return ok;
}

TEST(replay_gguf) {
    fi_seeds s = {0};
    uint8_t *buf;
    size_t len;
    static const char *const seeds[] = {"tests/fuzz/seed-small.gguf",
                                        "tests/fuzz/seed-quant.gguf", /* a [256][2] tensor of each fixture type */
                                        "tests/fuzz/seed-native.gguf", /* FP8_B32 {40, 33}, FP8_R264 {256, 2} */
                                        /* a clip / deepseek41v projector (synth_mmproj_write: 1 block, width 8,
                                         * 2 heads, SwiGLU 8, patch 2, merge 2, projection 8): F32/BF16, a 4-D
                                         * tensor, float arrays, bools */
                                        "tests/fuzz/seed-mmproj.gguf"};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
        if (dsf_read_file(seeds[i], &buf, &len, NULL) == 0) {
            fi_add(&s, buf, len);
            free(buf);
        }
    const char *tiny = test_shared("testdata/tiny41/tiny41.gguf");
    FILE *f = tiny ? fopen(tiny, "rb") : NULL;
    if (f) { /* the header and metadata of a real file, cut short: the tensor table is hostile */
        uint8_t *head = dsf_xmalloc(65536);
        size_t n = fread(head, 1, 65536, f);
        fclose(f);
        fi_add(&s, head, n);
        free(head);
    }
    if (s.n == 0) {
        fi_free(&s);
        SKIP("no GGUF seed (tests/fuzz/seed-small.gguf, ../shared) found");
    }
    int total, acc = fi_run("gguf", &s, 500, fi_gguf_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_snapshot) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    (void)gg;
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_snapshot");
    /* tokens, flags, truncation, then (offset, value) patches: none, the header's token count,
     * a token id, a window value, and a truncation */
    fi_add(&s, "\x05\x00\x00\x00", 4);
    fi_add(&s, "\x09\x00\x00\x00\x18\x00\x40", 7);
    fi_add(&s, "\x03\x00\x00\x00\x40\x00\xff\x43\x00\xff", 10);
    fi_add(&s, "\x0c\x00\x00\x00\x00\x02\x7f", 7);
    fi_add(&s, "\x04\x02\x30\x00", 4);
    /* tinyvl with a span (flags bit 2), 10 tokens: unpatched, then the span count (at 72 + 40),
     * a type (at 120), a text position's key (at 130), a span row's float made NaN (at 212) */
    fi_add(&s, "\x0a\x04\x00\x00", 4);
    fi_add(&s, "\x0a\x04\x00\x00\x70\x00\x03", 7);
    fi_add(&s, "\x0a\x04\x00\x00\x78\x00\x09", 7);
    fi_add(&s, "\x0a\x04\x00\x00\x82\x00\x01", 7);
    fi_add(&s, "\x0a\x04\x00\x00\xd4\x00\xff\xd5\x00\xff", 10);
    int total, acc = fi_run("snapshot", &s, 60, fz_snapshot_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_vocab) {
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_vocab");
    fi_add(&s, "\x01\x10\x01in\x00\x04<x>\x00\x00i n\x00", 16);
    int total, acc = fi_run("vocab", &s, 80, fz_vocab_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_dspark) {
    NEED_SHARED(gg, "testdata/tinyds/tinyds-dspark.gguf");
    (void)gg;
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_dspark");
    /* no patch (must load), then patches in the header, a key/value and a tensor info */
    fi_add(&s, "", 0);
    fi_add(&s, "\x00\x00\x08\x02", 4);
    fi_add(&s, "\x05\x00\x30\x07\x21\x00\x10\x00", 8);
    fi_add(&s, "\x30\x00\x14\x03", 4);
    int total, acc = fi_run("dspark", &s, 30, fz_dspark_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_mmproj) {
    NEED_SHARED(gg, "testdata/tinyvl/mmproj-tinyvl.gguf");
    (void)gg;
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_mmproj");
    /* no patch (must load), then patches in the header, a key/value and a tensor info */
    fi_add(&s, "", 0);
    fi_add(&s, "\x00\x00\x08\x02", 4);
    fi_add(&s, "\x05\x00\x30\x07\x21\x00\x10\x00", 8);
    fi_add(&s, "\x30\x00\x14\x03", 4);
    int total, acc = fi_run("mmproj", &s, 30, fz_mmproj_one, &total);
    FI_CHECK_MIX(acc, total);
}

TEST(replay_model) {
    NEED_SHARED(gg, "testdata/tiny41/tiny41.gguf");
    (void)gg;
    fi_seeds s = {0};
    fi_add_dir(&s, "fuzz_model");
    /* no patch (must load), then one patch in the header, a key/value and a tensor info */
    fi_add(&s, "", 0);
    fi_add(&s, "\x00\x00\x08\x02", 4);
    fi_add(&s, "\x05\x00\x30\x07\x40\x00\x10\x00", 8);
    fi_add(&s, "\x20\x01\x14\x03", 4);
    int total, acc = fi_run("model", &s, 30, fz_model_one, &total);
    FI_CHECK_MIX(acc, total);
}
