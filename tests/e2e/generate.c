/* generate.c: the `dsflash run` / `dsflash chat` front ends of the generation loop, end to
 * end, on a random-weight tiny model written by the synth module into the test's temp dir.
 * Guards against: output that depends on more than the prompt under greedy decoding, stats or
 * modes lost on the way to stdout/stderr, a REPL that mishandles its commands or prefix reuse,
 * and bad options that do not fail with one line. */
#include "test.h"
#include "helpers.h"

#include <stdio.h>
#include <string.h>

/* The synth tiny model (written once per test process). */
static const char *tiny_model(void) {
    static char path[512];
    return test_synth_tiny(path, sizeof path, "gen-tiny.gguf", 7);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Guards: `dsflash run` end to end: exit 0, text on stdout, stats on stderr; greedy output
 * depends only on the prompt. */
TEST(generate_cli_run) {
    const char *m = tiny_model();
    CHECK(m);
    char cmd[2048], out1[16384], out2[16384], errf[600];
    snprintf(errf, sizeof errf, "%s/run.err", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Hello! Who are you?' -n 12 --temp 0 --threads 2 2>%s", test_bin(), m,
             errf);
    CHECK(test_run(cmd, out1, sizeof out1) == 0);
    CHECK(test_run(cmd, out2, sizeof out2) == 0);
    CHECK(strlen(out1) > 1 && strcmp(out1, out2) == 0);
    /* --mmap (the dense weights read from the file) and --no-repack change no value: the same
     * greedy text */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Hello! Who are you?' -n 12 --temp 0 --threads 2 --mmap --no-repack 2>/dev/null",
             test_bin(), m);
    CHECK(test_run(cmd, out2, sizeof out2) == 0);
    CHECKF(strcmp(out1, out2) == 0, "--mmap --no-repack: '%s' against '%s'", out2, out1);
    /* not a terminal: reasoning is marked and the output ends with a newline */
    CHECKF(strncmp(out1, "[thinking] ", 11) == 0 || strstr(out1, "\n\n"), "stdout: '%s'", out1);
    char stats[4096];
    snprintf(cmd, sizeof cmd, "cat %s", errf);
    CHECK(test_run(cmd, stats, sizeof stats) == 0);
    CHECKF(strstr(stats, "completion 12 tokens") && strstr(stats, "finish: length"), "stderr: '%s'", stats);
    /* --raw and --no-think run too */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'plain text' --raw -n 4 --temp 0 2>/dev/null", test_bin(), m);
    CHECK(test_run(cmd, out1, sizeof out1) == 0 && strncmp(out1, "[thinking]", 10) != 0);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --no-think --effort low --system 'Be brief.' -n 4 --seed 3 2>&1",
             test_bin(), m);
    CHECK(test_run(cmd, out1, sizeof out1) == 0 && strstr(out1, "completion 4 tokens"));
}

/* Guards: `dsflash chat` through a pipe: commands, two turns with prefix reuse, /reset, /quit
 * (nothing after it is answered). */
TEST(generate_cli_chat_pipe) {
    const char *m = tiny_model();
    CHECK(m);
    char cmd[2048], out[32768];
    snprintf(cmd, sizeof cmd,
             "printf '/think\\nHello there\\nAnd a second question\\n/effort 30\\n/nothink\\n/reset\\nThird\\n/quit\\n"
             "never answered\\n' | %s chat -m %s -n 6 --temp 0 2>&1",
             test_bin(), m);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "[thinking mode]") && strstr(out, "[chat mode]") && strstr(out, "[conversation reset]") &&
               strstr(out, "[effort 30]"),
           "output: %s", out);
    /* three answered turns, each with a stats line */
    int turns = 0;
    for (const char *s = out; (s = strstr(s, "[chat] prompt")); s++) turns++;
    CHECKF(turns == 3, "%d stats lines in: %s", turns, out);
    /* the second turn re-renders the first: its prompt starts with the same BOS + system/user
     * tokens, which the generator reuses */
    const char *second = strstr(strstr(out, "[chat] prompt") + 1, "[chat] prompt");
    int np = 0, nc = 0;
    CHECK(sscanf(second, "[chat] prompt %d tokens (%d cached", &np, &nc) == 2);
    CHECKF(nc > 1 && nc < np, "second turn: %d of %d cached", nc, np);
    /* EOF ends the REPL too */
    snprintf(cmd, sizeof cmd, "printf 'hi' | %s chat -m %s -n 3 --temp 0 2>&1", test_bin(), m);
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "[chat] prompt"));
}

/* Guards: bad options: one "dsflash NAME: ..." line on stderr, non-zero exit; --help works. */
TEST(generate_cli_errors_and_help) {
    const char *m = tiny_model();
    CHECK(m);
    const char *bad[] = {
        "run -p hi",                      /* no model */
        "run -m MODEL",                   /* no prompt */
        "run -m MODEL -p hi -n abc",      /* bad number */
        "run -m MODEL -p hi --temp -1",   /* out of range */
        "run -m MODEL -p hi --top-p 2",
        "run -m MODEL -p hi --effort 0",  /* spec §2.9: 1..100 */
        "run -m MODEL -p hi --numerics x",
        "run -m MODEL -p hi --bogus",
        "run -m MODEL -p",                /* missing value */
        "run -m /nonexistent.gguf -p hi",
        "run -m MODEL -p hi --ctx 4",     /* the prompt does not fit */
        "chat -m MODEL --seed -3",
        "chat --temp 1",
        "chat -m MODEL extra",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[256], cmd[2048], out[4096];
        const char *mp = strstr(bad[i], "MODEL");
        if (mp) snprintf(args, sizeof args, "%.*s%s%s", (int)(mp - bad[i]), bad[i], m, mp + 5);
        else snprintf(args, sizeof args, "%s", bad[i]);
        snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null </dev/null", test_bin(), args);
        int rc = test_run(cmd, out, sizeof out);
        const char *name = strncmp(args, "run", 3) == 0 ? "dsflash run: " : "dsflash chat: ";
        CHECKF(rc != 0, "'%s' exited 0", bad[i]);
        CHECKF(strncmp(out, name, strlen(name)) == 0 && count_lines(out) == 1, "'%s' printed: %s", bad[i], out);
    }
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s run --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "usage: dsflash run") && strstr(out, "--effort"));
    snprintf(cmd, sizeof cmd, "%s chat --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "usage: dsflash chat") && strstr(out, "/reset"));
}

