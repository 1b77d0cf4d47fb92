/* npm.h: the test-only npm packages of tests/npm (reference tools: tokenizers, the official
 * OpenAI and Anthropic SDKs, a JSON-schema validator). No TEST here. */
#ifndef DSF_TEST_NPM_H
#define DSF_TEST_NPM_H

#include <stddef.h>

/* Installs tests/npm (npm ci) unless every path in need (NULL-terminated, relative to
 * tests/npm/node_modules) exists. NULL when ready, else the reason to skip (in why or static). */
const char *test_npm_ready(const char *const *need, char *why, size_t cap);

#endif
