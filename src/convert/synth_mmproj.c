/* synth_mmproj.c: random-weight deepseek41v projectors (synth.h: synth_write_mmproj), in the layout
 * `convert --mmproj` writes (mmproj_layout.c), for the tower's tests and benchmarks.
 *
 * Owns: the two projector presets and the value distribution of each tensor (norms near 1, dense
 * matrices with std 1/sqrt(fan_in), small biases, delimiter vectors with std 1).
 * Must not: lay out keys or tensors itself (mmproj_layout.c does, for both writers), or hold tensor
 * data (synth_model.c generates it while streaming).
 * Invariant: output = f(shape, seed, types); a tensor's values depend on its name, not its place. */
#include "convert/synth_impl.h"
#include "convert/mmproj_layout.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#include <stdlib.h>
#include <string.h>

/* The tower of testdata/tinyvl (README "The model") and the release's (vision.md §1), with the
 * projection width of the text preset each pairs with: tiny's 128; bench's, bench-moe's and
 * real's 5120. */
static const struct {
    const char *id;
    mmproj_meta m;
} presets[] = {
    {"tinyvl", {.name = "dsflash-synth-tinyvl", .n_layer = 2, .n_embd = 64, .n_head = 4, .ff = 176, .patch = 14,
                .merge = 3, .proj_dim = 128, .min_pixels = 12544}},
    {"release", {.name = "dsflash-synth-vision", .n_layer = 32, .n_embd = 1024, .n_head = 16, .ff = 2816, .patch = 14,
                 .merge = 3, .proj_dim = 5120, .min_pixels = 295936}},
};

static int head_mmproj(gguf_writer *w, const void *ctx, char *err) { return mmproj_meta_write(w, ctx, err); }

int synth_mmproj_write(const mmproj_meta *meta, const char *path, uint64_t seed, bool header_only, char *err) {
    static const enum synth_kind kinds[] = {[MMF_NORM] = K_NORM, [MMF_DENSE] = K_DENSE, [MMF_BIAS] = K_BIAS,
                                            [MMF_EMBED] = K_EMBED};
    synth_model *m = synth_model_alloc(hash_str("mmproj", seed));
    int n = 0;
    mmproj_tensor *t = mmproj_tensors(meta, &n);
    for (int i = 0; i < n; i++) {
        synth_tensor(m, t[i].type, kinds[t[i].fill], t[i].fan_in, t[i].n_dims < 3 ? t[i].n_dims : 3, t[i].ne[0],
                     t[i].ne[1], t[i].ne[2], "%s", t[i].name);
        /* v.patch_embd.weight is 4-D; its values follow the flattened patch's fan-in all the same */
        if (t[i].n_dims > 3) synth_reshape_tensor(m, t[i].name, t[i].n_dims, t[i].ne);
    }
    free(t);
    synth_set_head(m, head_mmproj, meta);
    int rc = header_only ? synth_model_write_header(m, path, err) : synth_model_write(m, path, err);
    synth_model_free(m);
    return rc;
}

int synth_write_mmproj(const char *preset, const char *path, uint64_t seed, const synth_write_opts *o, char *err) {
    static const synth_write_opts defaults = {.type = SYNTH_TYPE_KEEP, .expert_type = SYNTH_TYPE_KEEP};
    if (!o) o = &defaults;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        if (!preset || strcmp(presets[i].id, preset)) continue;
        if (o->type != SYNTH_TYPE_KEEP && o->type != GGML_TYPE_F32 && o->type != GGML_TYPE_BF16)
            return dsf_seterr(err, "a projector's weights are BF16 or F32, not %s", ggml_type_name((uint32_t)o->type));
        mmproj_meta m = presets[i].m;
        for (int c = 0; c < 3; c++) m.mean[c] = m.std[c] = 0.5f;
        m.f32 = o->type == GGML_TYPE_F32;
        return synth_mmproj_write(&m, path, seed, o->header_only, err);
    }
    return dsf_seterr(err, "unknown projector preset '%s' (tinyvl, release)", preset ? preset : "(null)");
}
