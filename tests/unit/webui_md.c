/* webui_md.c: the chat page's Markdown renderer (webui/markdown.js) under node
 * (tests/npm/webui/markdown.test.mjs): XSS payloads, nested code fences and random mixtures of
 * markup must come out with no live tag, attribute or non-http(s) link.
 * Guards against: model text that runs script in the page (an <img onerror>, a javascript:
 * link, an attribute breakout). Needs node only (no npm package); skips without it. */
#include <stdio.h>
#include <string.h>

#include "test.h"

TEST(webui_md_xss) {
    if (test_run("command -v node >/dev/null", NULL, 0) != 0) SKIP("node is not installed");
    static char out[1 << 16];
    int rc = test_run("timeout 120 node --test --test-reporter=spec tests/npm/webui/markdown.test.mjs 2>&1", out,
                      sizeof out);
    size_t n = strlen(out);
    CHECKF(rc == 0, "node --test webui/markdown.test.mjs failed (rc %d):\n%s", rc, n > 6000 ? out + n - 6000 : out);
}
