/* vl_logits.c: `dsflash logits --mmproj --image` (tools/logits_image.c) end to end on the
 * tinyvl PNGs: the whole path (decode -> plan -> tower -> expansion -> text model with spans)
 * against the official reference's logits, checked by ../shared/testdata/check_logits.py, the
 * goldens' independent checker (skipped where python3 is absent); the expanded prompt printed
 * by --print-tokens against the reference's tokens and types; and the command's refusals. */
#include "test.h"
#include "helpers.h"
#include "mpi.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VDIR "testdata/tinyvl/"

static bool have_python(void) { return test_run("python3 -c 1", NULL, 0) == 0; }

/* The command line of a case (CASE.json: prompt_text -> a file read by the shell, image_files,
 * max_image_tokens, prefill_len, mode) writing its logits to outp; extra appended. */
static int case_cmd(const char *name, const char *outp, const char *extra, char *cmd, size_t cap, json_t **jout) {
    char rel[256], paths[3][4096];
    snprintf(rel, sizeof rel, VDIR "golden/%s.json", name);
    const char *js = test_shared(rel), *model = test_shared(VDIR "tinyvl.gguf"),
               *proj = test_shared(VDIR "mmproj-tinyvl.gguf");
    if (!js || !model || !proj) return -1;
    snprintf(paths[0], sizeof paths[0], "%s", js);
    snprintf(paths[1], sizeof paths[1], "%s", model);
    snprintf(paths[2], sizeof paths[2], "%s", proj);
    json_error_t je;
    json_t *j = json_load_file(paths[0], 0, &je);
    if (!j) return -1;
    char txt[4096];
    snprintf(txt, sizeof txt, "%s/%s.prompt.txt", test_tmpdir(), name);
    FILE *f = fopen(txt, "wb");
    const char *pt = json_string_value(json_object_get(j, "prompt_text"));
    if (!f || !pt || fputs(pt, f) < 0) {
        if (f) fclose(f);
        json_decref(j);
        return -1;
    }
    fclose(f);
    const bool contract = !strcmp(json_string_value(json_object_get(j, "mode")), "contract");
    int o = snprintf(cmd, cap,
                     "'%s' logits -m '%s' --mmproj '%s' --prompt-text \"$(cat '%s')\" --image-max-tokens %d "
                     "--prefill %d --numerics %s --threads 2 --out '%s' %s",
                     test_bin(), paths[1], paths[2], txt, (int)json_integer_value(json_object_get(j, "max_image_tokens")),
                     (int)json_integer_value(json_object_get(j, "prefill_len")), contract ? "reference" : "plain", outp,
                     extra);
    json_t *files = json_object_get(j, "image_files");
    for (size_t i = 0; i < json_array_size(files) && o > 0 && (size_t)o < cap; i++) {
        snprintf(rel, sizeof rel, VDIR "%s", json_string_value(json_array_get(files, i)));
        const char *png = test_shared(rel);
        if (!png) return json_decref(j), -1;
        o += snprintf(cmd + o, cap - (size_t)o, " --image '%s'", png);
    }
    if (jout) *jout = j;
    else json_decref(j);
    return o > 0 && (size_t)o < cap ? 0 : -1;
}

/* Guards against: any stage of the path differing from the reference in a way the logits see
 * (preprocessing, tower, span layout, bias_vl, Engram rules, the prefill/decode split of
 * grad-decode, the token cap of cap20): every case within check_logits.py's preset (plain;
 * contract for the reference-numerics case, whose tower is bf16 by default). */
TEST(vl_logits_cases) {
    if (!test_shared(VDIR "golden/grad-plain.json")) SKIP("needs ../shared/" VDIR);
    if (!have_python()) SKIP("needs python3 for check_logits.py");
    const char *chk = test_shared("testdata/check_logits.py");
    CHECK(chk);
    char chks[4096];
    snprintf(chks, sizeof chks, "%s", chk);
    static const char *cases[] = {"grad-plain", "grad-decode", "wide-plain", "tall-plain",
                                  "tiny-plain", "cap20-plain", "two-plain", "grad-contract"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char outp[4096], cmd[32768], out[8192], rel[256];
        snprintf(outp, sizeof outp, "%s/%s.f32", test_tmpdir(), cases[i]);
        CHECKF(case_cmd(cases[i], outp, "2>&1", cmd, sizeof cmd, NULL) == 0, "%s: no command", cases[i]);
        CHECKF(test_run(cmd, out, sizeof out) == 0, "%s: %s", cases[i], out);
        snprintf(rel, sizeof rel, VDIR "golden/%s.json", cases[i]);
        snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' --preset %s 2>&1", chks, test_shared(rel), outp,
                 strstr(cases[i], "contract") ? "contract" : "plain");
        CHECKF(test_run(cmd, out, sizeof out) == 0, "%s: check_logits.py: %s", cases[i], out);
        remove(outp);
    }
}

/* Guards against: a CLI that tokenizes the prompt text differently (special tokens not parsed,
 * BOS added twice) or expands the placeholders into another layout than the reference's:
 * --print-tokens lists two-plain's expanded ids and types exactly as CASE.json has them. */
TEST(vl_logits_print_tokens) {
    char outp[4096], cmd[32768], out[65536];
    json_t *j = NULL;
    snprintf(outp, sizeof outp, "%s/print.f32", test_tmpdir());
    if (case_cmd("two-plain", outp, "--print-tokens 2>/dev/null", cmd, sizeof cmd, &j) < 0)
        SKIP("needs ../shared/" VDIR);
    CHECKF(test_run(cmd, out, sizeof out) == 0, "%s", out);
    json_t *tok = json_object_get(j, "tokens"), *ty = json_object_get(j, "token_types");
    const char *p = out;
    for (size_t i = 0; i < json_array_size(tok); i++) {
        int idx, id, type, used = 0;
        CHECKF(sscanf(p, "%d %d %d\n%n", &idx, &id, &type, &used) == 3 && used > 0, "line %zu: %.40s", i, p);
        CHECKF(idx == (int)i && id == json_integer_value(json_array_get(tok, i)) &&
                   type == json_integer_value(json_array_get(ty, i)),
               "token %zu: %d %d (want %lld %lld)", i, id, type, json_integer_value(json_array_get(tok, i)),
               json_integer_value(json_array_get(ty, i)));
        p += used;
    }
    CHECKF(*p == 0, "more lines than the reference's %zu tokens: %.40s", json_array_size(tok), p);
    json_decref(j);
    remove(outp);
}

/* Guards against: a crash, a zero exit or silent output on bad input: placeholders and images
 * that do not correspond (the reference's message), a model without bias_vl, a missing image
 * file, a bad --tower. */
TEST(vl_logits_refusals) {
    NEED_SHARED(m41, "testdata/tiny41/tiny41.gguf");
    char m41s[4096], outp[4096], cmd[32768], out[4096];
    snprintf(m41s, sizeof m41s, "%s", m41);
    snprintf(outp, sizeof outp, "%s/refused.f32", test_tmpdir());
    if (case_cmd("grad-plain", outp, "", cmd, sizeof cmd, NULL) < 0) SKIP("needs ../shared/" VDIR);
    const char *png = strstr(cmd, " --image '");
    CHECK(png);
    char img[4200];
    snprintf(img, sizeof img, "%s", png);
    const struct {
        const char *extra, *want;
    } cases[] = {
        {"%s", "Found 1 image tokens but got 2 images"}, /* the image given twice */
        {"--image /nonexistent.png", "nonexistent"},
        {"--tower int8", "--tower"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char extra[8192], full[49152];
        snprintf(extra, sizeof extra, cases[i].extra, img);
        snprintf(full, sizeof full, "%s %s 2>&1", cmd, extra);
        int rc = test_run(full, out, sizeof out);
        CHECKF(rc != 0 && rc < 128, "case %zu: exit %d: %s", i, rc, out);
        CHECKF(strstr(out, cases[i].want), "case %zu: '%s' lacks '%s'", i, out, cases[i].want);
    }
    /* the text model without bias_vl (tiny41: the same tokenizer and width) */
    char *m = strstr(cmd, " -m '");
    CHECK(m);
    char rest[32768];
    snprintf(rest, sizeof rest, "%s", strchr(m + 5, '\'') + 1);
    snprintf(m, sizeof cmd - (size_t)(m - cmd), " -m '%s'%s 2>&1", m41s, rest);
    int rc = test_run(cmd, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "cannot take images"), "exit %d: %s", rc, out);
    remove(outp);
}

/* Guards against: image spans going wrong in an MPI job (issue 39): the span rows reach only
 * stage 0 (model/distops.c), their types and keys every rank (routing with bias_vl, Engram
 * DEAD), and a snapshot or rollback keeps them. The logits of a text+image case (one image with
 * decode steps after the prefill; two images in one prompt) must be byte-identical to the same
 * binary in one process, under every --parallel choice. */
TEST(vl_logits_mpi_same_as_one_process) {
    const char *why = test_mpi_missing();
    if (why) SKIP("%s", why);
    static const char *const cases[] = {"grad-decode", "two-plain", "grad-contract"};
    static const struct {
        int np;
        const char *par;
    } jobs[] = {{2, "pipeline"}, {3, "pipeline,experts"}, {2, "experts"}};
    char one[4096], job[4096], cmd[32768], full[40000], out[4096];
    snprintf(one, sizeof one, "%s", test_tmpfile("vl_mpi_one.f32"));
    snprintf(job, sizeof job, "%s", test_tmpfile("vl_mpi_job.f32"));
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (case_cmd(cases[c], one, "", cmd, sizeof cmd, NULL) < 0) SKIP("needs ../shared/" VDIR);
        snprintf(full, sizeof full, "%s 2>&1", cmd);
        CHECKF(test_run(full, out, sizeof out) == 0, "%s in one process: %s", cases[c], out);
        long na = 0;
        unsigned char *a = test_slurp(one, &na);
        CHECK(a && na > 0);
        for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
            char extra[64];
            snprintf(extra, sizeof extra, "--parallel %s", jobs[j].par);
            if (case_cmd(cases[c], job, extra, cmd, sizeof cmd, NULL) < 0) SKIP("needs ../shared/" VDIR);
            snprintf(full, sizeof full, "%s %s 2>&1", test_mpirun(jobs[j].np), cmd);
            remove(job);
            const int rc = test_run(full, out, sizeof out);
            long nb = 0;
            unsigned char *b = rc == 0 ? test_slurp(job, &nb) : NULL;
            const bool same = b && nb == na && memcmp(a, b, (size_t)na) == 0;
            free(b);
            if (!same) free(a);
            CHECKF(rc == 0, "%s, np %d --parallel %s: exit %d: %s", cases[c], jobs[j].np, jobs[j].par, rc, out);
            CHECKF(same, "%s, np %d --parallel %s: the logits differ from one process's", cases[c], jobs[j].np,
                   jobs[j].par);
        }
        free(a);
    }
    printf("  tinyvl: 3 cases x 3 jobs byte-identical to one process\n");
    remove(one);
    remove(job);
}
