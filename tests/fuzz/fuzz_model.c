/* fuzz_model.c: libFuzzer harness for model loading (dsf_engine_open: src/model/engine.c, shape.c,
 * weights.c) on hostile metadata: tiny41.gguf with byte patches in its header, its
 * non-tokenizer key/values and its tensor table (wrong shapes, dtypes, offsets, layer counts,
 * ratios, missing or renamed keys and tensors).
 *
 * The template is mapped once and copied into a memfd; the harness parses its layout itself
 * (spans: the header, each key/value that is not tokenizer.*, each tensor info), and the
 * input is a list of 4-byte patches (u16 span, u8 offset in the span, u8 value). The patched
 * bytes are written into the memfd, the engine is opened from /proc/self/fd/N, and the bytes
 * are put back. Checks: a refused model gets a one-line error; an accepted one opens a
 * session and evaluates two tokens, or refuses them with an error (never a crash, overread or
 * abort). */
#include "fuzz_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    uint32_t b, e; /* byte range in the file */
} fz_span;

typedef struct {
    int fd;
    uint8_t *tpl; /* the template's bytes */
    size_t size;
    fz_span *spans;
    int n_spans;
    char path[64];
} fz_model_env;

/* A bounded little-endian reader over the template (the template is trusted: it is tiny41). */
static uint64_t fz_rd(const uint8_t *p, size_t *o, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[*o + (size_t)i] << (8 * i);
    *o += (size_t)n;
    return v;
}

static void fz_skip_value(const uint8_t *p, size_t *o, uint32_t type) {
    static const int sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
        uint64_t l = fz_rd(p, o, 8);
        *o += (size_t)l;
    } else if (type == 9) {
        uint32_t et = (uint32_t)fz_rd(p, o, 4);
        uint64_t n = fz_rd(p, o, 8);
        for (uint64_t i = 0; i < n; i++) fz_skip_value(p, o, et);
    } else {
        FZ_REQUIRE(type < 13, "template: value type %u", type);
        *o += (size_t)sz[type];
    }
}

/* The template ../shared/REL (or $DSF_SHARED/REL) in a memfd, with its spans; env is filled
 * once. NULL without the file. */
static fz_model_env *fz_tpl_env(fz_model_env *envp, const char *rel) {
    if (envp->tpl) return envp;
    char path[4096];
    const char *shared = getenv("DSF_SHARED");
    snprintf(path, sizeof path, "%s/%s", shared ? shared : "../shared", rel);
    uint8_t *buf;
    size_t len;
    if (dsf_read_file(path, &buf, &len, NULL)) return NULL;
    envp->tpl = buf;
    envp->size = len;
    envp->fd = memfd_create("fuzz-model.gguf", MFD_CLOEXEC);
    FZ_REQUIRE(envp->fd >= 0 && write(envp->fd, buf, len) == (ssize_t)len, "memfd: %s", strerror(errno));
    snprintf(envp->path, sizeof envp->path, "/proc/self/fd/%d", envp->fd);
    /* the layout: header, key/values, tensor infos */
    size_t o = 8;
    uint64_t n_tensors = fz_rd(buf, &o, 8), n_kv = fz_rd(buf, &o, 8);
    envp->spans = dsf_xmalloc((size_t)(1 + n_kv + n_tensors) * sizeof *envp->spans);
    envp->spans[envp->n_spans++] = (fz_span){0, 24};
    for (uint64_t i = 0; i < n_kv; i++) {
        size_t b = o;
        uint64_t kl = fz_rd(buf, &o, 8);
        bool tokenizer = kl >= 10 && !memcmp(buf + o, "tokenizer.", 10);
        o += (size_t)kl;
        uint32_t type = (uint32_t)fz_rd(buf, &o, 4);
        fz_skip_value(buf, &o, type);
        if (!tokenizer) envp->spans[envp->n_spans++] = (fz_span){(uint32_t)b, (uint32_t)o};
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        size_t b = o;
        uint64_t nl = fz_rd(buf, &o, 8);
        o += (size_t)nl;
        uint32_t nd = (uint32_t)fz_rd(buf, &o, 4);
        o += 8 * (size_t)nd + 4 + 8;
        envp->spans[envp->n_spans++] = (fz_span){(uint32_t)b, (uint32_t)o};
    }
    FZ_REQUIRE(o <= len, "template layout runs past the file");
    return envp;
}

static fz_model_env *fz_model_env_get(void) {
    static fz_model_env env;
    return fz_tpl_env(&env, "testdata/tiny41/tiny41.gguf");
}

/* Writes the patches of data (4 bytes each: u16 span, u8 offset in the span, u8 value) into
 * env's memfd; at[] receives their offsets (put back by fz_unpatch). Returns their count. */
static int fz_patch(fz_model_env *env, const uint8_t *data, size_t size, uint32_t *at, int max) {
    int np = 0;
    for (size_t i = 0; i + 4 <= size && np < max; i += 4) {
        const fz_span *sp = &env->spans[(data[i] | data[i + 1] << 8) % env->n_spans];
        uint32_t off = sp->b + data[i + 2] % (sp->e - sp->b);
        at[np++] = off;
        uint8_t v = data[i + 3];
        FZ_REQUIRE(pwrite(env->fd, &v, 1, off) == 1, "pwrite failed");
    }
    return np;
}

static void fz_unpatch(fz_model_env *env, const uint32_t *at, int np) {
    for (int i = np - 1; i >= 0; i--) /* put the template back */
        FZ_REQUIRE(pwrite(env->fd, env->tpl + at[i], 1, at[i]) == 1, "pwrite failed");
}

static int fz_model_one(const uint8_t *data, size_t size) {
    fz_model_env *env = fz_model_env_get();
    FZ_REQUIRE(env != NULL, "needs ../shared/testdata/tiny41/tiny41.gguf (or DSF_SHARED)");
    enum { MAX_PATCH = 64 };
    uint32_t at[MAX_PATCH];
    const int np = fz_patch(env, data, size, at, MAX_PATCH);
    char err[DSF_ERR_LEN] = "";
    dsf_engine_params p;
    dsf_engine_params_default(&p);
    p.n_threads = 1;
    dsf_engine *e = dsf_engine_open(env->path, &p, err);
    int ok = e != NULL;
    if (!e) {
        fz_check_err(err, "dsf_engine_open");
    } else {
        dsf_session *s = dsf_session_new(e, 16, err);
        if (!s) {
            fz_check_err(err, "dsf_session_new");
        } else {
            int nv = dsf_engine_n_vocab(e);
            FZ_REQUIRE(nv > 0, "n_vocab %d", nv);
            int32_t toks[2] = {1 % nv, 7 % nv};
            float *lg = malloc((size_t)nv * sizeof *lg);
            if (dsf_session_eval(s, toks, 2, lg, false, err)) fz_check_err(err, "dsf_session_eval");
            free(lg);
            dsf_session_free(s);
        }
        dsf_engine_close(e);
    }
    fz_unpatch(env, at, np);
    return ok;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_model_one(data, size);
    return 0;
}
#endif
