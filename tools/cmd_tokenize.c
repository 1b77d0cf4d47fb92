/* cmd_tokenize.c: `dsflash tokenize -m MODEL.gguf (--text T | --file F) [--bos] [--no-special]`
 * prints the token ids of a text on one line, space-separated. Only the GGUF's tokenizer
 * keys are read (a vocab-only GGUF works). */
#include "cmd.h"
#include "dsflash.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *usage_text =
    "usage: dsflash tokenize -m MODEL.gguf (--text TEXT | --file FILE) [--bos] [--no-special]\n"
    "  Prints the token ids of TEXT (or of FILE's bytes) on one line, space-separated.\n"
    "  --bos         prepend the BOS token (tokenizer.ggml.bos_token_id)\n"
    "  --no-special  do not match control tokens such as <\xef\xbd\x9c" "User\xef\xbd\x9c> written in the text\n"
    "                (user-defined added tokens such as <think> are matched either way)\n"
    "  --pieces      print one 'id<TAB>bytes' line per token instead (bytes escaped as in C)\n";

static void print_piece(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static int cmd_tokenize(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return 0;
    }
    const char *model = NULL, *text = NULL, *file = NULL;
    bool bos = false, special = true, pieces = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) model = argv[++i];
        else if (!strcmp(a, "--text") && has_val) text = argv[++i];
        else if (!strcmp(a, "--file") && has_val) file = argv[++i];
        else if (!strcmp(a, "--bos")) bos = true;
        else if (!strcmp(a, "--no-special")) special = false;
        else if (!strcmp(a, "--pieces")) pieces = true;
        else {
            fprintf(stderr, "dsflash tokenize: unknown or incomplete option '%s'\n%s", a, usage_text);
            return 2;
        }
    }
    if (!model || (!text) == (!file)) {
        fprintf(stderr, "dsflash tokenize: need -m MODEL.gguf and exactly one of --text / --file\n%s",
                usage_text);
        return 2;
    }
    char err[DSF_ERR_LEN];
    uint8_t *buf = NULL;
    size_t len = 0;
    if (file) {
        if (dsf_read_file(file, &buf, &len, err) != 0) {
            fprintf(stderr, "dsflash tokenize: %s\n", err);
            return 1;
        }
        text = (const char *)buf;
    } else {
        len = strlen(text);
    }
    dsf_tokenizer *tok = dsf_tokenizer_load(model, err);
    if (!tok) {
        fprintf(stderr, "dsflash tokenize: %s\n", err);
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = dsf_tokenize(tok, text, len, bos, special, &ids, &n, err);
    if (rc != 0) {
        fprintf(stderr, "dsflash tokenize: %s\n", err);
    } else if (pieces) {
        for (size_t i = 0; i < n; i++) {
            size_t bl;
            const char *b = dsf_token_bytes(tok, ids[i], &bl);
            printf("%d\t", ids[i]);
            print_piece(b, bl);
            putchar('\n');
        }
    } else {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    }
    free(ids);
    free(buf);
    dsf_tokenizer_free(tok);
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "dsflash tokenize: cannot write the output\n");
        return 1;
    }
    return rc == 0 ? 0 : 1;
}

DSF_COMMAND(tokenize, "print the token ids of a text", cmd_tokenize)
