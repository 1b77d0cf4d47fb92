/* inspect.c: `dsflash inspect`'s summaries, run as a process.
 * Guards against: the bytes by type or the types by tensor class missing or misfiled (tiny41
 * is a converter output: gguf-layout.md §3.1 puts MXFP4 on the routed experts, F32 on the
 * router, the hc mixes and the vectors, BF16 on the other matrices and the tables), and a
 * --plan that does not read a header-only file or misjudges what fits. */
#include "test.h"
#include "helpers.h"
#include "io/gguf.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(inspect_type_summary) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char cmd[1200];
    static char out[1 << 20];
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_bin(), model);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    const char *s = strstr(out, "== bytes by type ==");
    CHECKF(s && strstr(s, "MXFP4") && strstr(s, "== types by tensor class =="), "%s", s ? s : out);
    static const char *const want[] = {"routed experts        24 tensors", "MXFP4 x24", "router                 8 tensors",
                                       "hc mixes              16 tensors", "Engram table           1 tensors"};
    for (int i = 0; i < 5; i++) CHECKF(strstr(s, want[i]), "no '%s' in:\n%s", want[i], s);
    const char *router = strstr(s, "router "), *embd = strstr(s, "token embedding");
    CHECK(router && strstr(router, "F32 x8") && embd && strstr(embd, "BF16 x1"));
}

TEST(inspect_plan_cli) {
    NEED_SHARED(model, "testdata/tiny41/tiny41.gguf");
    char cmd[1200], out[8192], err[DSF_ERR_LEN], path[512];
    gguf_file *g = gguf_open(model, err);
    CHECKF(g, "%s", err);
    const uint64_t head = g->data_offset;
    gguf_close(g);
    snprintf(path, sizeof path, "%s/inspect-header.gguf", test_tmpdir());
    CHECK(test_copy_head(model, head, path) == 0);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 64 2>&1", test_bin(), path);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "(header only)") && strstr(out, "fits:") &&
               strstr(out, "KV state, reference numerics (packed rows)") &&
               strstr(out, "KV state, plain numerics (fp32 rows)") &&
               strstr(out, "Engram table") && strstr(out, "read by row"),
           "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 0.001 2>&1", test_bin(), model);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 3 && strstr(out, "(whole file)") && strstr(out, "does not fit"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ctx x 2>&1", test_bin(), model);
    CHECK(test_run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ubatch 0 2>&1", test_bin(), model);
    CHECK(test_run(cmd, out, sizeof out) == 2);
    /* the prefill chunk on the released shape (384 experts, top-6; dsf_engine_params.ubatch):
     * 2048 tokens (32 per expert) where RAM allows, 512 on a tiny RAM, --ubatch as given */
    snprintf(cmd, sizeof cmd, "%s synth --preset real --header-only %s/inspect-real.gguf >/dev/null 2>&1", test_bin(),
             test_tmpdir());
    CHECK(test_run(cmd, out, sizeof out) == 0);
    static const struct {
        const char *opt, *want;
    } ck[] = {{"--ram 768", "chunk 2048 tokens (auto for this RAM): 32.0 tokens per routed expert"},
              {"--ram 4", "chunk 512 tokens (auto for this RAM): 8.0 tokens per routed expert"},
              {"--ram 768 --ubatch 3000", "chunk 3000 tokens (--ubatch): 46.9 tokens per routed expert"}};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "%s inspect --plan %s/inspect-real.gguf %s 2>&1", test_bin(), test_tmpdir(), ck[k].opt);
        rc = test_run(cmd, out, sizeof out);
        CHECKF((rc == 0 || rc == 3) && strstr(out, ck[k].want), "%s: rc %d: %s", ck[k].opt, rc, out);
    }
}

/* A copy of src at dst with the first occurrence of `from` (n bytes, after the bytes `after` when
 * not NULL) replaced by `to`. 0, or -1 if src cannot be read or holds no such bytes. */
static int patched_copy(const char *src, const char *dst, const char *after, const void *from, const void *to, size_t n) {
    long size = 0;
    unsigned char *b = test_slurp(src, &size);
    unsigned char *a = b && after ? memmem(b, (size_t)size, after, strlen(after)) : b;
    unsigned char *p = a ? memmem(a, (size_t)(size - (a - b)), from, n) : NULL;
    FILE *f = p ? fopen(dst, "wb") : NULL;
    if (f) {
        memcpy(p, to, n);
        fwrite(b, 1, (size_t)size, f);
        fclose(f);
    }
    free(b);
    return f ? 0 : -1;
}

/* Guards against inspect refusing, crashing on or misdescribing a vision projector: it must say
 * that the file is a deepseek41v projector and print the tower's shape (testdata/tinyvl's
 * README: 2 blocks, width 64, 4 heads of 16, SwiGLU 176, patch 14, merge 3, aligner 576 -> 128 ->
 * 128, min_pixels 12544) and its tensors; and against another clip projector type, or a head
 * count of 0 (a division), being taken for one: a one-line error and exit 1. */
TEST(inspect_mmproj) {
    NEED_SHARED(mm, "testdata/tinyvl/mmproj-tinyvl.gguf");
    char cmd[1200];
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_bin(), mm);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    static const char *const want[] = {"deepseek41v vision projector", "2 blocks, width 64, 4 heads x 16, SwiGLU 176, patch 14",
                                       "3 x 3 merge, 576 -> 128 -> 128; image_min_pixels 12544",
                                       "v.blk.1.ffn_up.weight            BF16  64 x 176",
                                       "v.patch_embd.weight              F32   14 x 14 x 3 x 64"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECKF(strstr(out, want[i]), "no '%s' in:\n%s", want[i], out);
    const char *other = test_tmpfile("llava.gguf"), *heads0 = test_tmpfile("heads0.gguf");
    const uint32_t four[2] = {GGUF_VT_UINT32, 4}, zero[2] = {GGUF_VT_UINT32, 0}; /* the key's type, then its value */
    CHECK(patched_copy(mm, other, NULL, "deepseek41v", "deepseek4xx", 11) == 0);
    CHECK(patched_copy(mm, heads0, "clip.vision.attention.head_count", four, zero, 8) == 0);
    static const char *const bad[] = {"a clip projector of type 'deepseek4xx'", "head_count is 0"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_bin(), i ? heads0 : other);
        int rc = test_run(cmd, out, sizeof out);
        CHECKF(rc == 1 && strstr(out, bad[i]) && strchr(out, '\n') == out + strlen(out) - 1, "rc %d: %s", rc, out);
    }
}
