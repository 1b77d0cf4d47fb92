/* vision/vision.c: the public projector API (dsf_vision_open/close/n_embd, the parameters) and
 * the internal entry points of vision/vision.h: the tower on given patches, the image key.
 * Owns: the dsf_vision object (the validated model, its thread pool, the kernel table, the
 * numerics and the default token cap).
 * Must not: compute (vision/tower does), decode or preprocess (vision/encode.c composes
 * io/image and vision/prep with the tower).
 * Invariant: a dsf_vision is read-only after open; calls on one object must not overlap (they
 * share its pool), calls on different objects may. */
#include "vision/vision.h"
#include "vision/tower.h"
#include "kernels/select.h"
#include "base/util.h"

#include <stdlib.h>
#include <unistd.h>

struct dsf_vision {
    vis_model *m;
    dsf_pool *pool;
    const dsf_kernels *k;
    bool bf16;
    int max_tokens;
    long max_pixels;
};

void dsf_vision_params_default(dsf_vision_params *p) {
    p->numerics = DSF_NUMERICS_REFERENCE; /* the engine's default: the official dtype flow */
    p->n_threads = 0;
    p->max_tokens = 0;
    p->max_pixels = 0;
}

dsf_vision *dsf_vision_open(const char *mmproj_path, const dsf_vision_params *p, char *err) {
    dsf_vision_params def;
    if (!p) {
        dsf_vision_params_default(&def);
        p = &def;
    }
    if (p->numerics != DSF_NUMERICS_PLAIN && p->numerics != DSF_NUMERICS_REFERENCE) {
        dsf_seterr(err, "vision: unknown numerics %d", (int)p->numerics);
        return NULL;
    }
    if (p->max_tokens < 0 || p->max_tokens > 1000000 || p->max_pixels < 0) {
        dsf_seterr(err, "vision: max_tokens %d / max_pixels %ld out of range", p->max_tokens, p->max_pixels);
        return NULL;
    }
    vis_model *m = vis_model_open(mmproj_path, err);
    if (!m) return NULL;
    dsf_vision *v = dsf_xcalloc(1, sizeof *v);
    long nt = p->n_threads > 0 ? p->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
    v->m = m;
    v->pool = dsf_pool_new(nt < 1 ? 1 : nt > 256 ? 256 : (int)nt);
    v->k = kernels_get();
    v->bf16 = p->numerics == DSF_NUMERICS_REFERENCE;
    v->max_tokens = p->max_tokens > 0 ? p->max_tokens : 1024;
    v->max_pixels = p->max_pixels;
    return v;
}

void dsf_vision_close(dsf_vision *v) {
    if (!v) return;
    dsf_pool_free(v->pool);
    vis_model_free(v->m);
    free(v);
}

int dsf_vision_n_embd(const dsf_vision *v) { return v ? v->m->hp.proj_dim : 0; }

const vis_model *vision_model(const dsf_vision *v) { return v->m; }
dsf_pool *vision_pool(dsf_vision *v) { return v->pool; }
bool vision_bf16(const dsf_vision *v) { return v->bf16; }
long vision_max_pixels(const dsf_vision *v) { return v->max_pixels; }
int vision_cap(const dsf_vision *v, int max_tokens) { return max_tokens > 0 ? max_tokens : v->max_tokens; }

int vision_run_patches(dsf_vision *v, const float *patches, const dsf_image_plan *pl, float *vit, float *block,
                       char *err) {
    const int r = v->m->hp.merge;
    if (pl->n_vit_h < 1 || pl->n_vit_w < 1 || pl->n_llm_h != (pl->n_vit_h + r - 1) / r ||
        pl->n_llm_w != (pl->n_vit_w + r - 1) / r || pl->n_tokens != pl->n_llm_h * (pl->n_llm_w + 1) + 2)
        return dsf_seterr(err, "vision: plan %dx%d patches / %dx%d cells / %d tokens does not fit merge %d",
                          pl->n_vit_w, pl->n_vit_h, pl->n_llm_w, pl->n_llm_h, pl->n_tokens, r);
    return vis_tower_run(v->m, v->pool, v->k, v->bf16, patches, pl->n_vit_h, pl->n_vit_w, vit, block, err);
}

/* FNV-1a over the bytes and the cap's 4 little-endian bytes, then a 64-bit finaliser
 * (splitmix64's), so that nearby inputs spread; 0 is mapped to 1. */
uint64_t vision_key(const uint8_t *bytes, size_t len, int cap) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
    for (int i = 0; i < 4; i++) h = (h ^ (uint8_t)((uint32_t)cap >> (8 * i))) * 0x100000001b3ull;
    h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 27, h *= 0x94d049bb133111ebull, h ^= h >> 31;
    return h ? h : 1;
}

void dsf_image_free(dsf_image *im) {
    if (!im) return;
    free(im->block);
    im->block = NULL;
}
