/* dsml.c: `dsflash parse`, the output parser's command.
 * Guards against: a parse that differs from the library's (strict and tolerant), an official
 * error that does not reach stderr and the exit status, an unknown option accepted. */
#include "test.h"

#include <stdio.h>
#include <string.h>

TEST(dsml_cli_parse) {
    char in[512], cmd[2048], out[4096];
    snprintf(in, sizeof in, "%s/parse_in.txt", test_tmpdir());
    FILE *f = fopen(in, "wb");
    CHECK(f);
    fputs("  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"search::lookup\">\n<｜DSML｜ parameter "
          "name=\"query\" string=\"true\">value</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"limit\" string=\"false\">2"
          "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", f);
    fclose(f);
    const char *want = "{\"reasoning_content\": \"  reason  \", \"content\": \"summary\", \"tool_calls\": [{\"name\": "
                       "\"lookup\", \"namespace\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"value\\\", "
                       "\\\"limit\\\": 2}\"}]}\n";
    snprintf(cmd, sizeof cmd, "%s parse --thinking --strict < %s", test_bin(), in);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, want), "got %s", out);
    snprintf(cmd, sizeof cmd, "%s parse --thinking < %s", test_bin(), in);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    CHECKF(!strcmp(out, want), "tolerant: %s", out);
    /* strict error: chat mode sees </think> in the content */
    snprintf(cmd, sizeof cmd, "%s parse --strict < %s 2>&1", test_bin(), in);
    CHECK(test_run(cmd, out, sizeof out) == 1);
    CHECKF(!strcmp(out, "dsflash parse: Unexpected special token '</think>' in content\n"), "got %s", out);
    snprintf(cmd, sizeof cmd, "%s parse --bogus < %s 2>/dev/null", test_bin(), in);
    CHECK(test_run(cmd, NULL, 0) != 0);
}

