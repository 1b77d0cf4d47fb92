/* convert_mmproj.c: `convert --mmproj`, the checkpoint's vision tower, aligner and image
 * delimiters -> the deepseek41v projector GGUF (gguf-layout.md §5, vision.md §10), as llama.cpp's
 * DeepseekV41VisionModel writes it.
 *
 * Owns: reading vision_config (and preprocessor_config.json's mean/std when present), the
 * converter's refusals of §6.3 (no tower, max_image_tokens != 1024, a max_wh_ratio,
 * rope_theta != 10000), and the conversion's order: validate everything, then write.
 * Must not: know the tensor layout (mmproj_layout.c) or stream bytes itself (the tensor plan of
 * convert_tensors.c does, chunk by chunk).
 * Invariant: every value is the checkpoint's (BF16 -> F32 is exact; BF16 stays BF16). */
#include "convert/convert_impl.h"
#include "convert/mmproj_layout.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DIM (1 << 24) /* sanity bound on every config dimension */

/* vision_config.k as an integer in [lo, hi]. */
static int vint(json_t *vc, const char *k, int64_t lo, int64_t hi, uint32_t *out, char *err) {
    char label[96];
    snprintf(label, sizeof label, "vision_config.%s", k);
    int64_t v;
    if (convert_json_int(json_object_get(vc, k), label, lo, hi, &v, err)) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* image_mean / image_std of preprocessor_config.json when the repository ships one (llama.cpp's
 * converter writes them instead of the V4-Flash default 0.5). */
static int read_norm(const char *hf_dir, mmproj_meta *m, char *err) {
    for (int c = 0; c < 3; c++) m->mean[c] = m->std[c] = 0.5f;
    char path[4096];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", hf_dir);
    if (access(path, F_OK)) return 0;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return dsf_seterr(err, "%s: %s (line %d)", path, jerr.text, jerr.line);
    static const char *const keys[2] = {"image_mean", "image_std"};
    float *dst[2] = {m->mean, m->std};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        json_t *a = json_object_get(root, keys[k]);
        if (!a) continue;
        if (!json_is_array(a) || json_array_size(a) != 3) {
            rc = dsf_seterr(err, "%s: '%s' must be a list of 3 numbers", path, keys[k]);
            break;
        }
        for (int c = 0; c < 3 && !rc; c++) {
            json_t *e = json_array_get(a, (size_t)c);
            if (!json_is_number(e)) rc = dsf_seterr(err, "%s: '%s'[%d] is not a number", path, keys[k], c);
            else dst[k][c] = (float)json_number_value(e);
        }
    }
    json_decref(root);
    return rc;
}

/* config.json -> m (name excepted), refusing what the converter refuses (gguf-layout.md §6.3). */
static int load_vision_config(const char *hf_dir, mmproj_meta *m, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return dsf_seterr(err, "%s: %s (line %d)", path, jerr.text, jerr.line);
    int rc = -1;
    json_t *vc = json_object_get(root, "vision_config"), *tc = json_object_get(root, "text_config");
    json_t *hs = json_is_object(tc) && json_object_get(tc, "hidden_size") ? json_object_get(tc, "hidden_size")
                                                                           : json_object_get(root, "hidden_size");
    uint32_t max_tok = 0;
    int64_t dim;
    if (!json_is_object(vc)) {
        dsf_seterr(err, "config.json: no vision_config object: this checkpoint has no vision tower");
        goto done;
    }
    json_t *nl = json_object_get(vc, "num_hidden_layers");
    if (json_is_integer(nl) && json_integer_value(nl) == 0) {
        dsf_seterr(err, "config.json: vision_config.num_hidden_layers must be > 0 (a checkpoint without a tower)");
        goto done;
    }
    if (vint(vc, "num_hidden_layers", 1, 512, &m->n_layer, err) || vint(vc, "hidden_size", 1, MAX_DIM, &m->n_embd, err) ||
        vint(vc, "num_attention_heads", 1, 4096, &m->n_head, err) ||
        vint(vc, "intermediate_size", 1, MAX_DIM, &m->ff, err) || vint(vc, "patch_size", 1, 4096, &m->patch, err) ||
        vint(vc, "downsample_ratio", 1, 64, &m->merge, err) ||
        vint(vc, "min_pixels", 1, UINT32_MAX, &m->min_pixels, err) ||
        vint(vc, "max_image_tokens", 0, INT32_MAX, &max_tok, err) ||
        convert_json_int(hs, "hidden_size", 1, MAX_DIM, &dim, err))
        goto done;
    m->proj_dim = (uint32_t)dim;
    if (m->n_embd % m->n_head || (m->n_embd / m->n_head) % 4) {
        /* vision.md §3: head dim D/H, split in quarters by the 2-D RoPE */
        dsf_seterr(err, "config.json: vision_config.hidden_size %u is not num_attention_heads (%u) x a multiple of 4",
                   m->n_embd, m->n_head);
        goto done;
    }
    /* §6.3: clip.cpp hard-codes these (gguf-layout.md §5.1), so another value cannot be stored */
    json_t *theta = json_object_get(vc, "rope_theta"), *ratio = json_object_get(vc, "max_wh_ratio");
    if (max_tok != 1024) {
        dsf_seterr(err, "config.json: vision_config.max_image_tokens is %u; the projector format assumes 1024", max_tok);
        goto done;
    }
    if (ratio && !json_is_null(ratio)) {
        dsf_seterr(err, "config.json: vision_config.max_wh_ratio must be null (the projector format has no aspect cap)");
        goto done;
    }
    if (theta && !json_is_null(theta) && (!json_is_number(theta) || json_number_value(theta) != 10000.0)) {
        dsf_seterr(err, "config.json: vision_config.rope_theta must be 10000 (the projector format does not store it)");
        goto done;
    }
    rc = read_norm(hf_dir, m, err);
done:
    json_decref(root);
    return rc;
}

/* Plans every tensor of m from ck; refuses a tower tensor the layout does not name (split
 * q/k/v, an image_pad, a block past the count). */
static int plan_tensors(tensor_plan *p, const st_checkpoint *ck, const mmproj_meta *m, char *err) {
    int n = 0;
    mmproj_tensor *t = mmproj_tensors(m, &n);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = tensor_plan_add_rows(p, t[i].src, t[i].src_d0, t[i].src_d1, t[i].row0, t[i].rows, t[i].name, t[i].type,
                                  t[i].n_dims, t[i].ne, err);
    free(t);
    for (int i = 0; i < st_count(ck) && !rc; i++) {
        const char *nm = st_at(ck, i)->name;
        bool tower = !strncmp(nm, "vision.", 7) || !strncmp(nm, "aligner.", 8) || !strncmp(nm, "image_", 6);
        if (tower && !tensor_plan_uses(p, i))
            rc = dsf_seterr(err, "checkpoint: unexpected tensor '%s' (not part of the deepseek41v projector layout)", nm);
    }
    if (!rc) tensor_plan_order(p);
    return rc;
}

int convert_mmproj(const char *hf_dir, const char *out_path, const convert_opts *o, char *err) {
    if (o->native || o->dspark) return dsf_seterr(err, "--mmproj writes bf16 or f32 only (not native, not --dspark)");
    mmproj_meta m = {.f32 = o->f32};
    char name[512];
    if (o->name) snprintf(name, sizeof name, "%s", o->name);
    else convert_default_name(hf_dir, name, sizeof name);
    m.name = name;
    if (load_vision_config(hf_dir, &m, err)) return -1;
    cfg c; /* the plan's streaming reads only the FP8 block size, unused here */
    memset(&c, 0, sizeof c);
    c.bo = c.bi = 32;
    st_checkpoint *ck = st_open_dir(hf_dir, err);
    if (!ck) return -1;
    tensor_plan *p = tensor_plan_new(&c, ck, o->f32, false);
    gguf_writer *w = gguf_writer_new();
    uint64_t total = 0;
    int rc = plan_tensors(p, ck, &m, err) || mmproj_meta_write(w, &m, err) || tensor_plan_declare(p, w, &total, err) ||
                     gguf_writer_begin(w, out_path, err) ||
                     tensor_plan_write(p, w, total, o->threads, o->progress, err)
                 ? -1
                 : 0;
    gguf_writer_free(w);
    tensor_plan_free(p);
    st_close(ck);
    return rc;
}
