/* frontend_media.c: images in `dsflash run` and `dsflash chat` (see frontend.h): --mmproj,
 * --image FILE (repeatable), --image-max-tokens; the images go into the first user message as
 * image content blocks, the encoder renders one <｜deepseek_image｜> per block, and the prompt's
 * placeholders are expanded with the encoded images before the prefill.
 * Owns only the CLI's use of the image API; decoding and the tower are src/vision/, the
 * expansion src/runtime/media.c, the span prefill src/runtime/generate_media.c.
 * Must not: exit the process (errors go back as err).
 * Invariant: the --image files are read and encoded once, at load; every turn of a chat
 * expands its prompt with the same images (same content keys), so prefix reuse holds across
 * turns. */
#include "frontend.h"
#include "dsflash.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const GEN_CLI_IMAGE_HELP =
    "  --mmproj FILE      the vision projector (mmproj GGUF, deepseek41v), for --image\n"
    "  --image FILE       a PNG or JPEG for the first user message (repeatable, at most 16)\n"
    "  --image-max-tokens N  the token cap of one image's block (default: the projector's, 1024)\n";

int gen_cli_load_images(const gen_cli_opts *o, gen_cli_model *m, char *err) {
    m->image_tok = dsf_token_id(m->tok, "<｜deepseek_image｜>");
    if (o->n_images && !o->mmproj) return dsf_seterr(err, "--image needs the vision projector: --mmproj FILE");
    if (!o->mmproj) return 0;
    if (m->image_tok < 0) return dsf_seterr(err, "--mmproj: the model's vocabulary has no <｜deepseek_image｜> token");
    if (!dsf_engine_has_vision(m->e))
        return dsf_seterr(err, "--mmproj: the model %s carries no ffn.gate.bias_vl: it cannot read image spans", o->model);
    dsf_vision_params vp;
    dsf_vision_params_default(&vp);
    vp.numerics = o->numerics;
    vp.n_threads = o->n_threads;
    vp.max_tokens = o->image_max_tokens;
    m->vis = dsf_vision_open(o->mmproj, &vp, err);
    if (!m->vis) return dsf_prefixerr(err, "--mmproj %s", o->mmproj);
    if (dsf_vision_n_embd(m->vis) != dsf_engine_n_embd(m->e))
        return dsf_seterr(err, "--mmproj %s: its blocks are %d wide, the model's residual stream %d", o->mmproj,
                          dsf_vision_n_embd(m->vis), dsf_engine_n_embd(m->e));
    m->images = dsf_xcalloc((size_t)(o->n_images ? o->n_images : 1), sizeof *m->images);
    for (int i = 0; i < o->n_images; i++) {
        uint8_t *bytes = NULL;
        size_t len = 0;
        if (dsf_read_file(o->images[i], &bytes, &len, err)) return dsf_prefixerr(err, "--image");
        int rc = dsf_vision_encode(m->vis, bytes, len, o->image_max_tokens, &m->images[i], err);
        free(bytes);
        if (rc) return dsf_prefixerr(err, "image %s", o->images[i]);
        m->n_images++;
    }
    return 0;
}

void gen_cli_unload_images(gen_cli_model *m) {
    for (int i = 0; i < m->n_images; i++) dsf_image_free(&m->images[i]);
    free(m->images);
    m->images = NULL;
    m->n_images = 0;
    dsf_vision_close(m->vis);
    m->vis = NULL;
}

json_t *gen_cli_user_message(const gen_cli_model *m, const char *text, size_t len, bool first) {
    json_t *t = json_stringn(text, len);
    if (!t) return NULL;
    if (!first || !m->n_images) return json_pack("{s:s,s:o}", "role", "user", "content", t);
    /* the encoder only counts the blocks (one placeholder each): the files are m->images */
    json_t *parts = json_array();
    for (int i = 0; i < m->n_images; i++)
        json_array_append_new(parts, json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", "file"));
    json_array_append_new(parts, json_pack("{s:s,s:o}", "type", "text", "text", t));
    return json_pack("{s:s,s:o}", "role", "user", "content", parts);
}

int gen_cli_generate(gen_cli_model *m, const int32_t *ids, int n, const dsf_gen_params *p,
                     dsf_gen_progress_cb progress, dsf_gen_result *out, char *err) {
    bool any = false;
    for (int i = 0; i < n && !any; i++) any = ids[i] == m->image_tok;
    if (!m->n_images || !any) return dsf_gen_run(m->g, ids, n, p, progress, out, err);
    memset(out, 0, sizeof *out);
    out->finish = DSF_FINISH_ERROR;
    dsf_mm_prompt mm;
    memset(&mm, 0, sizeof mm);
    if (dsf_mm_expand(ids, n, m->image_tok, m->images, m->n_images, &mm, err)) return -1;
    dsf_media media = dsf_mm_media(&mm);
    int rc = dsf_gen_prefill_media(m->g, mm.tokens, &media, mm.n, 0, progress, p->ud, err);
    if (rc == 0) rc = dsf_gen_decode(m->g, p, out, err);
    dsf_mm_prompt_free(&mm);
    return rc;
}
