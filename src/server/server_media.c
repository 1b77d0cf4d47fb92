/* server_media.c: images in `dsflash serve`: the projector's lifetime, a request's images on
 * its connection thread, and their encoding and the prompt's expansion on the scheduler.
 *
 * Owns: --mmproj (dsf_vision_open, its fit with the model), the limits applied to a request
 * (server_image.c parses), the job's expanded prompt (dsf_mm_expand with the tokenizer's
 * <｜deepseek_image｜> id) and its content keys, which prefix reuse in RAM (generate.c) and on
 * disk (server_pcache.c) compare with the ids, so the same text with another image never
 * reuses a state.
 * Must not: encode on a connection thread (the tower runs on the scheduler thread, between
 * forwards, like every other engine call); hold srv->mu while encoding.
 * Invariant: once prepared, j->req.prompt / n_prompt are the expanded prompt (what the session
 * evaluates, what usage and the log count) and j->media points into j->mm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_image.h"
#include "server/server_int.h"

#define IMAGE_TOKEN "<｜deepseek_image｜>"

int srv_media_open(srv_server *s, char *err) {
    s->image_tok = dsf_token_id(s->tok, IMAGE_TOKEN);
    if (!s->p.mmproj_path) return 0;
    if (s->image_tok < 0) return dsf_seterr(err, "--mmproj: the model's vocabulary has no %s token", IMAGE_TOKEN);
    if (!dsf_engine_has_vision(s->e))
        return dsf_seterr(err, "--mmproj: the model %s carries no ffn.gate.bias_vl: it cannot read image spans",
                          s->p.model_path);
    dsf_vision_params vp;
    dsf_vision_params_default(&vp);
    vp.numerics = s->p.numerics;
    vp.n_threads = s->p.n_threads;
    vp.max_tokens = s->p.image_max_tokens;
    vp.max_pixels = s->p.max_image_pixels;
    s->vis = dsf_vision_open(s->p.mmproj_path, &vp, err);
    if (!s->vis) return dsf_prefixerr(err, "--mmproj %s", s->p.mmproj_path), -1;
    int a = dsf_vision_n_embd(s->vis), b = dsf_engine_n_embd(s->e);
    if (a != b) {
        dsf_vision_close(s->vis);
        s->vis = NULL;
        return dsf_seterr(err, "--mmproj %s: its blocks are %d wide, the model's residual stream %d", s->p.mmproj_path, a, b);
    }
    return 0;
}

void srv_media_close(srv_server *s) {
    dsf_vision_close(s->vis);
    s->vis = NULL;
}

int srv_media_request(srv_server *s, srv_req *req, srv_error *e) {
    if (!req->images_json) return 0;
    srv_image_limits lim = {.max_images = s->p.max_images, .max_bytes = s->p.max_image_bytes,
                            .max_pixels = s->p.max_image_pixels};
    if (srv_images_parse(req->images_json, &lim, &req->images, &req->n_images, e)) return -1;
    if (req->n_images && !s->vis)
        return srv_fail(e, 400, "messages", "no_vision", "this model has no vision projector (start serve with --mmproj)");
    return 0;
}

const uint64_t *srv_job_keys(const job *j) { return j->mm.n ? j->mm.keys : NULL; }

/* The context check of server_api.c, on the expanded prompt. */
static int check_ctx(const srv_server *s, const job *j, srv_error *e) {
    int n = j->mm.n, mt = j->req.max_tokens;
    if (n >= s->n_ctx)
        return srv_fail(e, 400, "messages", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, your request has %d prompt "
                        "tokens (%d of them for %d image%s). Please reduce the length of the messages or the images "
                        "(--image-max-tokens).",
                        s->n_ctx, n, n - (j->req.n_prompt - j->req.n_images), j->req.n_images,
                        j->req.n_images == 1 ? "" : "s");
    if (mt > 0 && (long long)n + mt > s->n_ctx)
        return srv_fail(e, 400, "max_tokens", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                        "the messages with their images, %d in the completion).",
                        s->n_ctx, (long long)n + mt, n, mt);
    return 0;
}

int srv_media_prepare(srv_server *s, job *j, srv_error *e) {
    char err[DSF_ERR_LEN] = "";
    int n = j->req.n_images, rc = -1;
    if (!s->vis) return srv_fail(e, 400, "messages", "no_vision", "this model has no vision projector (start serve with --mmproj)");
    dsf_image *im = dsf_xcalloc((size_t)n, sizeof *im);
    int done = 0, off = 0;
    off += snprintf(j->img_log, sizeof j->img_log, " images %d (tokens", n);
    for (; done < n; done++) {
        const srv_image *si = &j->req.images[done];
        if (dsf_vision_encode(s->vis, si->data, si->len, s->p.image_max_tokens, &im[done], err)) {
            srv_fail(e, 400, "messages", "invalid_image", "image %d: %s", done + 1, err);
            goto out;
        }
        if (off < (int)sizeof j->img_log)
            off += snprintf(j->img_log + off, sizeof j->img_log - (size_t)off, "%s%d", done ? "+" : " ",
                            im[done].plan.n_tokens);
    }
    if (off < (int)sizeof j->img_log) snprintf(j->img_log + off, sizeof j->img_log - (size_t)off, ")");
    if (dsf_mm_expand(j->req.prompt, j->req.n_prompt, s->image_tok, im, n, &j->mm, err)) {
        /* the encoder emits one placeholder per image record: a mismatch is ours */
        srv_fail(e, 500, NULL, "internal_error", "expanding the prompt's images: %s", err);
        goto out;
    }
    if (check_ctx(s, j, e)) goto out;
    j->media = dsf_mm_media(&j->mm);
    free(j->req.prompt);
    j->req.prompt = dsf_xmalloc((size_t)j->mm.n * sizeof *j->req.prompt);
    memcpy(j->req.prompt, j->mm.tokens, (size_t)j->mm.n * sizeof *j->req.prompt);
    j->req.n_prompt = j->mm.n;
    rc = 0;
out:
    for (int i = 0; i < done; i++) dsf_image_free(&im[i]);
    free(im);
    if (rc) {
        snprintf(j->img_log, sizeof j->img_log, " images %d", n);
        dsf_mm_prompt_free(&j->mm);
        memset(&j->mm, 0, sizeof j->mm);
    }
    return rc;
}
