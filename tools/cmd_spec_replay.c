/* cmd_spec_replay.c: `dsflash spec-replay`, the test hook of the DSpark goldens
 * (../shared/testdata/tinyds/README.md): replays a scenario's rounds with its accept schedule
 * (dspark.md §7.2-§7.3): prefill, then per round draft, verify as one multi-token forward,
 * accept exactly the scheduled k ("natural": the greedy count), roll the main model back and
 * commit the rings. Writes DIR/draft.f32 [rounds*B][V], DIR/verify.f32 [rounds*(B+1)][V],
 * DIR/hidden.f32 [final_len][feat_dim] (the goldens' layouts) and DIR/replay.json (per round
 * the anchor, drafted ids, confidences, accept count; the final tokens).
 * --golden-features runs the draft alone (README "draft in isolation"): the rings come from
 * the scenario's hidden.f32 and each round drafts at the scenario's (p, anchor); no verify.
 * Must not: decide anything the scenario does not (no sampling: tau = 0). */
#include "cmd.h"
#include "dsflash.h"
#include "model/dspark.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char *USAGE =
    "usage: dsflash spec-replay -m MAIN.gguf --draft DRAFT.gguf --scenario CASE.json --out-dir DIR\n"
    "                           [--numerics reference|plain] [--plain] [--golden-features] [--threads T]\n"
    "  Replays a DSpark golden scenario (rounds of draft -> verify -> accept k -> rollback) and writes\n"
    "  draft.f32, verify.f32, hidden.f32 and replay.json into DIR (which must exist).\n"
    "  --numerics N       reference (the QDQ contract, the goldens' \"contract\" mode; default;\n"
    "                     \"contract\" is accepted as its name too) or plain (fp32, no QDQ)\n"
    "  --plain            the same as --numerics plain\n"
    "  --golden-features  the draft alone, fed the scenario's target features (hidden.f32)\n";

typedef struct {
    dsf_engine *e;
    dsf_session *s;
    dsf_dspark *d;
    dsf_dspark_seq *q;
    dsf_dspark_info di;
    int64_t V;
    json_t *sc, *out_rounds;
    FILE *fdraft, *fverify;
    float *feat_all; /* golden features (--golden-features) */
    int64_t n_feat_all;
} replay;

static int argmax(const float *l, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return (int)b;
}

static json_t *ids_json(const int32_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *floats_json(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* Commits positions [p0, p1) to the rings from the session's recorded features. */
static int commit_from_session(replay *r, int p0, int p1, char *err) {
    for (int p = p0; p < p1; p++) {
        const float *f = dsf_session_feature(r->s, p);
        if (!f) return dsf_seterr(err, "no target feature recorded for position %d", p);
        dspark_seq_commit(r->q, f, p, 1);
    }
    return 0;
}

/* The scheduled accept count of round i: an integer, or "natural" (the greedy count). */
static int sched_accept(replay *r, int i, const int32_t *d, const float *vrows, int B, char *err) {
    json_t *a = json_array_get(json_object_get(r->sc, "accept_schedule"), (size_t)i);
    if (json_is_integer(a)) {
        int k = (int)json_integer_value(a);
        if (k < 0 || k > B) return dsf_seterr(err, "scenario: accept_schedule[%d] = %d is outside 0..%d", i, k, B);
        return k;
    }
    if (!json_is_string(a) || strcmp(json_string_value(a), "natural"))
        return dsf_seterr(err, "scenario: accept_schedule[%d] must be an integer or \"natural\"", i);
    int k = 0;
    while (k < B && argmax(vrows + (int64_t)k * r->V, r->V) == d[k]) k++;
    return k;
}

/* One round of the full loop; *p and *anchor advance. */
static int round_full(replay *r, int i, int *p, int32_t *anchor, char *err) {
    const int B = r->di.block;
    int32_t ids[64], vt[65];
    float conf[64];
    float *dl = dsf_xmalloc((size_t)B * (size_t)r->V * sizeof(float));
    float *vl = dsf_xmalloc((size_t)(B + 1) * (size_t)r->V * sizeof(float));
    int rc = -1, k = 0;
    if (dspark_draft(r->q, *p, *anchor, B, 0.0f, NULL, ids, dl, NULL, conf, err) < 0) goto done;
    vt[0] = *anchor;
    memcpy(vt + 1, ids, (size_t)B * sizeof(int32_t));
    if (dsf_session_eval(r->s, vt, B + 1, vl, true, err) < 0) goto done;
    if ((k = sched_accept(r, i, ids, vl, B, err)) < 0) goto done;
    int32_t next = (int32_t)argmax(vl + (int64_t)k * r->V, r->V);
    if (dsf_session_rollback(r->s, *p + 2 + k, err) < 0 || commit_from_session(r, *p + 1, *p + 2 + k, err) < 0) goto done;
    fwrite(dl, sizeof(float), (size_t)B * (size_t)r->V, r->fdraft);
    fwrite(vl, sizeof(float), (size_t)(B + 1) * (size_t)r->V, r->fverify);
    int32_t vam[65];
    for (int j = 0; j <= B; j++) vam[j] = argmax(vl + (int64_t)j * r->V, r->V);
    json_array_append_new(r->out_rounds,
                          json_pack("{s:i, s:i, s:i, s:o, s:o, s:o, s:i, s:o, s:i}", "round", i, "last_committed_pos", *p,
                                    "anchor", *anchor, "draft_ids", ids_json(ids, B), "confidence", floats_json(conf, B),
                                    "verify_argmax", ids_json(vam, B + 1), "accept", k, "committed_tokens",
                                    ids_json(vt, k + 1), "next_anchor", next));
    *p += 1 + k;
    *anchor = next;
    rc = 0;
done:
    free(dl);
    free(vl);
    return rc;
}

/* One round of the draft alone at the scenario's (p, anchor), rings from golden features. */
static int round_isolated(replay *r, int i, char *err) {
    json_t *jr = json_array_get(json_object_get(r->sc, "rounds"), (size_t)i);
    json_t *jp = json_object_get(jr, "last_committed_pos"), *ja = json_object_get(jr, "anchor");
    if (!json_is_integer(jp) || !json_is_integer(ja)) return dsf_seterr(err, "scenario: rounds[%d] lacks last_committed_pos/anchor", i);
    const int p = (int)json_integer_value(jp), B = r->di.block;
    if (p < 0 || p >= r->n_feat_all) return dsf_seterr(err, "scenario: rounds[%d].last_committed_pos %d is outside the features", i, p);
    int64_t lo, hi;
    dspark_seq_range(r->q, &lo, &hi);
    if (hi <= p) dspark_seq_commit(r->q, r->feat_all + hi * r->di.feat_dim, hi, p + 1 - hi);
    int32_t ids[64];
    float conf[64];
    float *dl = dsf_xmalloc((size_t)B * (size_t)r->V * sizeof(float));
    int rc = dspark_draft(r->q, p, (int32_t)json_integer_value(ja), B, 0.0f, NULL, ids, dl, NULL, conf, err);
    if (rc >= 0) {
        fwrite(dl, sizeof(float), (size_t)B * (size_t)r->V, r->fdraft);
        json_array_append_new(r->out_rounds, json_pack("{s:i, s:i, s:I, s:o, s:o}", "round", i, "last_committed_pos", p,
                                                       "anchor", json_integer_value(ja), "draft_ids", ids_json(ids, B),
                                                       "confidence", floats_json(conf, B)));
    }
    free(dl);
    return rc < 0 ? -1 : 0;
}

static int read_floats(const char *path, int64_t n, float **out, char *err) {
    uint8_t *b;
    size_t len;
    if (dsf_read_file(path, &b, &len, err)) return -1;
    if (len != (size_t)n * sizeof(float)) {
        free(b);
        return dsf_seterr(err, "%s: %zu bytes, expected %lld floats", path, len, (long long)n);
    }
    *out = (float *)(void *)b;
    return 0;
}

/* The scenario's prompt as ids. */
static int scenario_prompt(json_t *sc, int32_t **ids, int *n, char *err) {
    json_t *pr = json_object_get(sc, "prompt");
    if (!json_is_array(pr) || json_array_size(pr) < 1 || json_array_size(pr) > 1000000)
        return dsf_seterr(err, "scenario: 'prompt' must be a non-empty array of token ids");
    *n = (int)json_array_size(pr);
    *ids = dsf_xmalloc((size_t)*n * sizeof(int32_t));
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(pr, (size_t)i);
        if (!json_is_integer(v)) return dsf_seterr(err, "scenario: prompt[%d] is not an integer", i);
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int run_full(replay *r, const char *dir, int n_rounds, char *err) {
    int32_t *prompt = NULL;
    int n = 0, rc = -1;
    float *lg = dsf_xmalloc((size_t)r->V * sizeof(float));
    if (scenario_prompt(r->sc, &prompt, &n, err) < 0) goto done;
    if (dsf_session_set_features(r->s, r->di.targets, r->di.n_targets, err) < 0 ||
        dsf_session_eval(r->s, prompt, n, lg, false, err) < 0 || commit_from_session(r, 0, n, err) < 0)
        goto done;
    int p = n - 1;
    int32_t anchor = (int32_t)argmax(lg, r->V);
    for (int i = 0; i < n_rounds; i++)
        if (round_full(r, i, &p, &anchor, err) < 0) goto done;
    /* the committed positions' features */
    char path[4096];
    snprintf(path, sizeof path, "%s/hidden.f32", dir);
    FILE *fh = fopen(path, "wb");
    if (!fh) {
        dsf_seterr(err, "cannot write %s", path);
        goto done;
    }
    for (int q = 0; q <= p; q++) {
        const float *f = dsf_session_feature(r->s, q);
        if (!f) {
            fclose(fh);
            dsf_seterr(err, "the feature of position %d is no longer recorded", q);
            goto done;
        }
        fwrite(f, sizeof(float), (size_t)r->di.feat_dim, fh);
    }
    fclose(fh);
    rc = 0;
done:
    free(prompt);
    free(lg);
    return rc;
}

static int replay_run(replay *r, const char *scenario, const char *dir, bool golden_feats, char *err) {
    json_error_t je;
    r->sc = json_load_file(scenario, 0, &je);
    if (!r->sc) return dsf_seterr(err, "%s: %s (line %d)", scenario, je.text, je.line);
    json_t *sched = json_object_get(r->sc, "accept_schedule");
    if (!json_is_array(sched) || json_array_size(sched) > 100000)
        return dsf_seterr(err, "%s: 'accept_schedule' must be an array", scenario);
    const int n_rounds = (int)json_array_size(sched);
    if (r->di.block > 64) return dsf_seterr(err, "draft block size %d exceeds 64", r->di.block);
    char path[4096];
    /* the out dir and its missing parents, as mkdir -p */
    snprintf(path, sizeof path, "%s", dir);
    for (char *c = path + 1;; c++)
        if (*c == '/' || !*c) {
            char keep = *c;
            *c = 0;
            if (mkdir(path, 0777) && errno != EEXIST)
                return dsf_seterr(err, "cannot create the out dir %s: %s", path, strerror(errno));
            if (!(*c = keep)) break;
        }
    snprintf(path, sizeof path, "%s/draft.f32", dir);
    r->fdraft = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/verify.f32", dir);
    r->fverify = golden_feats ? NULL : fopen(path, "wb");
    if (!r->fdraft || (!golden_feats && !r->fverify)) return dsf_seterr(err, "cannot write into %s", dir);
    r->out_rounds = json_array();
    if (golden_feats) {
        const char *hf = json_string_value(json_object_get(json_object_get(r->sc, "files"), "hidden"));
        json_t *fl = json_object_get(r->sc, "final_len");
        if (!hf || !json_is_integer(fl) || json_integer_value(fl) < 1 || json_integer_value(fl) > 10000000)
            return dsf_seterr(err, "%s: needs files.hidden and final_len for --golden-features", scenario);
        char hp[4096];
        const char *sl = strrchr(scenario, '/');
        snprintf(hp, sizeof hp, "%.*s%s", sl ? (int)(sl - scenario + 1) : 0, scenario, hf);
        r->n_feat_all = json_integer_value(fl);
        if (read_floats(hp, r->n_feat_all * r->di.feat_dim, &r->feat_all, err)) return -1;
        for (int i = 0; i < n_rounds; i++)
            if (round_isolated(r, i, err) < 0) return -1;
    } else if (run_full(r, dir, n_rounds, err) < 0)
        return -1;
    snprintf(path, sizeof path, "%s/replay.json", dir);
    json_t *o = json_pack("{s:o}", "rounds", json_incref(r->out_rounds));
    if (!golden_feats) json_object_set_new(o, "final_tokens", ids_json(dsf_session_tokens(r->s), dsf_session_n_past(r->s)));
    int rc = json_dump_file(o, path, JSON_INDENT(1));
    json_decref(o);
    return rc ? dsf_seterr(err, "cannot write %s", path) : 0;
}

static int cmd_spec_replay(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) return fputs(USAGE, stdout), 0;
    const char *model = NULL, *draft = NULL, *scenario = NULL, *dir = NULL;
    bool plain = false, golden_feats = false;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--plain")) plain = true;
        else if (v && !strcmp(a, "--numerics")) {
            v = argv[++i];
            if (!strcmp(v, "plain")) plain = true;
            else if (!strcmp(v, "reference") || !strcmp(v, "contract")) plain = false;
            else {
                fprintf(stderr, "dsflash spec-replay: --numerics must be reference, contract or plain, not '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--golden-features")) golden_feats = true;
        else if (v && (!strcmp(a, "-m") || !strcmp(a, "--model"))) model = argv[++i];
        else if (v && !strcmp(a, "--draft")) draft = argv[++i];
        else if (v && !strcmp(a, "--scenario")) scenario = argv[++i];
        else if (v && !strcmp(a, "--out-dir")) dir = argv[++i];
        else if (v && (!strcmp(a, "--threads") || !strcmp(a, "-t"))) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "dsflash spec-replay: unknown or incomplete option '%s'\n%s", a, USAGE);
            return 2;
        }
    }
    if (!model || !draft || !scenario || !dir) {
        fputs(USAGE, stderr);
        return 2;
    }
    char err[DSF_ERR_LEN] = "";
    dsf_engine_params ep;
    dsf_engine_params_default(&ep);
    ep.numerics = plain ? DSF_NUMERICS_PLAIN : DSF_NUMERICS_REFERENCE;
    ep.n_threads = threads;
    replay r;
    memset(&r, 0, sizeof r);
    int rc = 1;
    r.e = dsf_engine_open(model, &ep, err);
    if (!r.e) goto done;
    r.V = dsf_engine_n_vocab(r.e);
    if (!(r.d = dspark_open(draft, r.e, err))) goto done;
    dspark_info(r.d, &r.di);
    if (!(r.q = dspark_seq_new(r.d, err))) goto done;
    if (!golden_feats && !(r.s = dsf_session_new(r.e, 0, err))) goto done;
    rc = replay_run(&r, scenario, dir, golden_feats, err) < 0;
done:
    if (rc) fprintf(stderr, "dsflash spec-replay: %s\n", err[0] ? err : "failed");
    if (r.fdraft) fclose(r.fdraft);
    if (r.fverify) fclose(r.fverify);
    json_decref(r.sc);
    json_decref(r.out_rounds);
    free(r.feat_all);
    dsf_session_free(r.s);
    dspark_seq_free(r.q);
    dspark_close(r.d);
    dsf_engine_close(r.e);
    return rc;
}

/* DSF_COMMAND names a command after a C identifier; this one has a hyphen. */
__attribute__((constructor)) static void dsf_cmd_reg_spec_replay(void) {
    dsf_cmd_register("spec-replay", "replay a DSpark golden scenario (draft, verify, accept k, rollback) and dump its rows",
                     cmd_spec_replay);
}
