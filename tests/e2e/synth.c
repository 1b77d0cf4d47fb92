/* synth.c: `dsflash synth`, the command, and the synth module's refusals.
 * Guards against: an unknown preset or a bad output path that does not fail cleanly (one
 * "dsflash synth:" line, non-zero exit), a bench preset that outgrows 24 GiB, and synthetic
 * projectors (--mmproj-preset) off the converter's layout or the release's shape. */
#include "helpers.h"
#include "test.h"
#include "dsflash.h"
#include "convert/synth.h"
#include "io/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(synth_unknown_preset_and_cli) {
    char err[DSF_ERR_LEN] = "";
    CHECK(synth_write("huge", "/nonexistent/x.gguf", 1, err) < 0 && strstr(err, "huge"));
    CHECK(synth_data_bytes("bench") > 8000000000ull && synth_data_bytes("bench") < 16000000000ull); /* fits 24 GiB */
    /* bench-moe keeps the release's experts per layer at the real widths: 3 x 5120 x 2304 x 384
     * MXFP4 values (17 bytes per 32, gguf-layout §1.4) = 7,219,445,760 bytes, and fits 24 GiB
     * with its draft (<= 12 GB) */
    CHECKF(synth_data_bytes("bench-moe") > 7219445760ull && synth_data_bytes("bench-moe") <= 12000000000ull,
           "bench-moe: %llu bytes", (unsigned long long)synth_data_bytes("bench-moe"));
    char cmd[1200], out[2048];
    snprintf(cmd, sizeof cmd, "%s synth --preset nope %s/x.gguf 2>&1", test_bin(), test_tmpdir());
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash synth:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny 2>&1", test_bin());
    CHECK(test_run(cmd, out, sizeof out) != 0);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny /nonexistent-dir/x.gguf 2>&1", test_bin());
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "dsflash synth:"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --help", test_bin());
    CHECK(test_run(cmd, out, sizeof out) == 0 && strstr(out, "--preset"));
}

/* Guards against: --header-only, --type or --expert-type not reaching the file through the
 * command line (--type alone must retype the experts too, as llama-quantize does), a header-only file that `inspect --plan` cannot read, and an unknown type
 * name accepted. The plan's "all" line is the sum of the tensor bytes: about 698.8 GB with the
 * released dtypes (gguf-layout §3.2), i.e. 650.8 GiB; the two-decimal print is checked to the
 * spec's precision. */
TEST(synth_real_header_only_plan) {
    char cmd[1600], out[8192], path[600];
    snprintf(path, sizeof path, "%s/real-hdr.gguf", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only 2>&1", test_bin(), path);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "header only") && strstr(out, "650.8"), "rc %d: %s", rc, out);
    /* --type alone reaches the experts (like llama-quantize): Q4_K experts are 40 x 3 x 384 x
     * 2304 x 5120 / 256 x 144 bytes (gguf-layout §1.4: 256 values in 144 bytes) = 284.766 GiB */
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only --type Q4_K 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "routed experts        284.766"), "rc %d: %s", rc, out);
    /* --expert-type overrides it: MXFP4 experts are 288,777,830,400 B (gguf-layout §3.2) = 268.945 GiB */
    snprintf(cmd, sizeof cmd, "%s synth --preset real %s --header-only --type Q8_0 --expert-type mxfp4 2>&1",
             test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s inspect --plan %s --ram 512 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "routed experts        268.945"), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s --type Q9_X 2>&1", test_bin(), path);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "Q9_X"), "rc %d: %s", rc, out);
}

/* Guards against: `synth --dspark` writing a draft that is not the gguf-layout.md §4 file for
 * its main model (78 tensors for 3 stages, block size 5, the last three layers 5-7 of the tiny
 * preset as targets, no token_embd/output, the noise token inside the vocab), or one that
 * dspark_open refuses or that changes the main model's greedy text: with --draft-policy always
 * every drafted token is verified, and the text must equal the plain run's (the random draft is
 * almost always rejected, so this exercises rejection and rollback on every round). */
TEST(synth_dspark_draft_greedy_identity) {
    char cmd[2400], out[8192], ref[8192], m[600], d[600], e[600];
    snprintf(m, sizeof m, "%s/sds-main.gguf", test_tmpdir());
    snprintf(d, sizeof d, "%s/sds-draft.gguf", test_tmpdir());
    snprintf(e, sizeof e, "%s/sds.err", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s --dspark %s --seed 4 2>&1", test_bin(), m, d);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    char err[DSF_ERR_LEN] = "";
    gguf_file *g = gguf_open(d, err);
    CHECKF(g, "%s", err);
    if (!g) return;
    char *arch = NULL;
    uint32_t blk = 0, stages = 0, mask = 0;
    int32_t *tl = NULL;
    uint64_t nt = 0;
    CHECK(gguf_get_str(g, "general.architecture", &arch, err) == 0 && !strcmp(arch, "dflash"));
    CHECK(gguf_get_u32(g, "dflash.block_size", &blk, err) == 0 && blk == 5);
    CHECK(gguf_get_u32(g, "dflash.block_count", &stages, err) == 0 && stages == 3);
    CHECK(gguf_get_u32(g, "tokenizer.ggml.mask_token_id", &mask, err) == 0 && mask < 1024);
    CHECK(gguf_get_arr_i32(g, "dflash.target_layers", &tl, &nt, err) == 0 && nt == 3 && tl[0] == 5 &&
          tl[1] == 6 && tl[2] == 7);
    CHECKF(g->n_tensors == 78, "%llu tensors", (unsigned long long)g->n_tensors);
    CHECK(!gguf_find_tensor(g, "token_embd.weight") && !gguf_find_tensor(g, "output.weight") &&
          gguf_find_tensor(g, "fc.weight") && gguf_find_tensor(g, "conf_proj.weight") &&
          gguf_find_tensor(g, "blk.2.ffn_gate_exps.weight"));
    free(arch);
    free(tl);
    gguf_close(g);
    const char *run = "%s run -m %s -p 'Once upon a time' --raw -n 40 --ignore-eos --temp 0 --threads 2 %s 2>%s";
    snprintf(cmd, sizeof cmd, run, test_bin(), m, "", "/dev/null");
    CHECK(test_run(cmd, ref, sizeof ref) == 0 && strlen(ref) > 20);
    char opt[700];
    snprintf(opt, sizeof opt, "--draft %s --draft-policy always", d);
    snprintf(cmd, sizeof cmd, run, test_bin(), m, opt, e);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0 && !strcmp(out, ref), "rc %d; --draft changed the text:\n%s\nvs\n%s", rc, out, ref);
    snprintf(cmd, sizeof cmd, "cat %s", e);
    CHECK(test_run(cmd, out, sizeof out) == 0);
    /* a round per committed token but the first, none of them a plain step */
    CHECKF(strstr(out, "completion 40 tokens") && strstr(out, "39 rounds, 0 plain steps"), "stderr: %s", out);
    /* a recipe retypes the draft too and sets its general.file_type (once: a duplicate key is a
     * writer refusal) to the recipe's, LLAMA_FTYPE_MOSTLY_Q4_K_M = 15 */
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny %s --dspark %s --recipe Q4_K_M 2>&1", test_bin(), m, d);
    rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 0, "rc %d: %s", rc, out);
    g = gguf_open(d, err);
    CHECKF(g && gguf_get_u32(g, "general.file_type", &blk, err) == 0 && blk == 15, "%s", err);
    gguf_close(g);
}

/* Guards against a synthetic projector whose layout is not the converter's (gguf-layout.md §5):
 * the tinyvl preset must have every key of the shipped mmproj-tinyvl.gguf (-f32.gguf with --type
 * F32) in order, with its type and value (general.name excepted), and every tensor's name, order,
 * dtype and shape; its weights must be its own (random, seeded: the same seed gives the same file,
 * another seed another one). */
TEST(synth_mmproj_tinyvl_layout) {
    static const struct { const char *ref, *opt; } c[] = {{"testdata/tinyvl/mmproj-tinyvl.gguf", ""},
                                                         {"testdata/tinyvl/mmproj-tinyvl-f32.gguf", "--type F32"}};
    char cmd[2048], log[2048], msg[512] = "", err[DSF_ERR_LEN];
    for (size_t i = 0; i < 2; i++) {
        NEED_SHARED(ref, c[i].ref);
        const char *p1 = test_tmpfile("mm1.gguf"), *p2 = test_tmpfile("mm2.gguf"), *p3 = test_tmpfile("mm3.gguf");
        snprintf(cmd, sizeof cmd, "%s synth --mmproj-preset tinyvl %s %s 2>&1 && %s synth --mmproj-preset tinyvl %s %s "
                 "2>&1 && %s synth --mmproj-preset tinyvl %s --seed 2 %s 2>&1",
                 test_bin(), p1, c[i].opt, test_bin(), p2, c[i].opt, test_bin(), p3, c[i].opt);
        CHECKF(test_run(cmd, log, sizeof log) == 0, "%s", log);
        gguf_file *r = gguf_open(ref, err), *a = gguf_open(p1, err), *b = gguf_open(p2, err), *d = gguf_open(p3, err);
        CHECKF(r && a && b && d, "%s", err);
        int layout = test_gguf_same(r, a, TG_ORDER, "general.name", msg, sizeof msg);
        int same_seed = test_gguf_same(a, b, TG_ORDER | TG_DATA, NULL, msg + 256, 256);
        int other_seed = test_gguf_same(a, d, TG_DATA, NULL, log, sizeof log);
        int own = test_gguf_same(r, a, TG_DATA, "general.name", log, sizeof log);
        gguf_close(r), gguf_close(a), gguf_close(b), gguf_close(d);
        CHECKF(layout == 0, "%s: %s", c[i].ref, msg);
        CHECKF(same_seed == 0, "same seed, other bytes: %s", msg + 256);
        CHECK(other_seed != 0 && own != 0);
    }
}

/* Guards against a release projector preset that does not pair with `synth --preset bench` (its
 * clip.vision.projection_dim must be bench's deepseek41.embedding_length) or does not have the
 * released tower's shape (vision.md §1: 32 blocks, width 1024, 16 heads, SwiGLU 2816, patch 14,
 * merge 3, min_pixels 295936; 9 x 32 + 10 = 298 tensors). Its bytes: the checkpoint's 970,536,960
 * BF16 bytes (vision.md §10) plus 2 more per element of the tensors the GGUF keeps F32: the patch
 * embedding (1024 x 588) and every vector (32 x (1024 + 3072 + 1024 + 1024) + 1024 + 1024 +
 * 2 x 5120 + 3 x 5120 = 224,256 values). */
TEST(synth_mmproj_release_pairs_with_bench) {
    const char *pm = test_tmpfile("mm-rel.gguf"), *pb = test_tmpfile("bench-hdr.gguf");
    char cmd[2048], log[2048], err[DSF_ERR_LEN];
    snprintf(cmd, sizeof cmd, "%s synth --mmproj-preset release %s --header-only 2>&1 && %s synth --preset bench %s "
             "--header-only 2>&1", test_bin(), pm, test_bin(), pb);
    CHECKF(test_run(cmd, log, sizeof log) == 0, "%s", log);
    gguf_file *m = gguf_open_header(pm, err), *b = m ? gguf_open_header(pb, err) : NULL;
    CHECKF(m && b, "%s", err);
    static const struct { const char *k; uint64_t v; } want[] = {
        {"clip.vision.block_count", 32}, {"clip.vision.embedding_length", 1024},
        {"clip.vision.attention.head_count", 16}, {"clip.vision.feed_forward_length", 2816},
        {"clip.vision.patch_size", 14}, {"clip.vision.projector.scale_factor", 3},
        {"clip.vision.image_min_pixels", 295936}, {"general.file_type", 32}};
    bool ok = true;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const gguf_kv *kv = gguf_find_kv(m, want[i].k);
        if (!kv || kv->u != want[i].v) ok = false, fprintf(stderr, "%s: not %llu\n", want[i].k, (unsigned long long)want[i].v);
    }
    const gguf_kv *pd = gguf_find_kv(m, "clip.vision.projection_dim"), *ne = gguf_find_kv(b, "deepseek41.embedding_length");
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < m->n_tensors; i++) bytes += m->tensors[i].nbytes;
    const uint64_t n_tensors = m->n_tensors;
    const bool pairs = pd && ne && pd->u == ne->u;
    gguf_close(m), gguf_close(b);
    CHECK(ok && pairs);
    CHECKF(n_tensors == 298, "%llu tensors", (unsigned long long)n_tensors);
    CHECKF(bytes == 970536960ull + 2ull * (1024 * 588 + 224256), "%llu bytes", (unsigned long long)bytes);
}

/* Guards against --mmproj-preset accepting what it cannot honour: an unknown preset, a
 * quantized type, a model option. */
TEST(synth_mmproj_cli_refusals) {
    static const char *const bad[] = {"--mmproj-preset nope", "--mmproj-preset tinyvl --type Q8_0",
                                      "--mmproj-preset tinyvl --preset tiny", "--mmproj-preset tinyvl --native"};
    char cmd[1024], log[2048];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "%s synth %s %s 2>&1", test_bin(), bad[i], test_tmpfile("bad.gguf"));
        int rc = test_run(cmd, log, sizeof log);
        const char *nl = strchr(log, '\n');
        CHECKF(rc != 0 && strstr(log, "dsflash synth: ") && (!nl || !nl[1]), "%s: rc %d: %s", bad[i], rc, log);
    }
}
