/* quantize_model.c: the streaming half of `dsflash quantize` (quantize_model.h): the plan
 * (a type per tensor from the recipe, the overrides and the fallbacks, all checked before
 * the output exists), the KV copy, and the row-chunk pipeline
 * read -> dequant_row -> quantize_row -> write.
 *
 * Must not: hold a whole tensor (a chunk is at most CHUNK_BYTES of source and of output
 * rows, plus one row of fp32 scratch per thread), or let the bytes depend on the thread
 * count (each row is quantized from that row alone; a failure reports the lowest bad row).
 * Invariant: the output has the input's KVs (file_type and quantization_version set) and
 * its tensors in the input's order with the input's shapes. The `native` target
 * (quantize_native.c) streams the same way: FP8_B32 a 32-row stripe at a time (the scale grid,
 * 1/1024 of the tensor, is kept and written after the rows), FP8_R264 a row at a time. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "convert/quantize_model.h"
#include "convert/imatrix.h"
#include "convert/progress.h"
#include "io/gguf.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"
#include "kernels/quantize.h"
#include "base/threads.h"
#include "base/util.h"

#include <fcntl.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CHUNK_BYTES ((uint64_t)8 << 20) /* source (and output) bytes per streamed chunk */

typedef struct {
    const gguf_tensor *t;
    int qc;                /* QC_* */
    uint32_t want;         /* the type the recipe or an override asks for (before the fallbacks) */
    uint32_t type;         /* output type */
    bool copy;             /* written as the input's bytes */
    bool has_im;
    imatrix_entry im;
    uint64_t out_bytes;
} qtensor;

typedef struct {
    gguf_file *f;
    imatrix *im;
    const quantize_recipe *r;
    bool native;           /* the `native` target (quantize_native.c) */
    qtensor *t;            /* [f->n_tensors], in the input's order */
} qplan;

/* `quantize IN OUT native`: its ftype is the converter's (gguf-layout.md §2: 38 also for bf16). */
static const quantize_recipe native_recipe = {"native", 38, {0}};

static uint64_t n_rows(const gguf_tensor *t) { return (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]); }

/* ================================================================ the plan */

static int compile_patterns(const quantize_opts *o, pcre2_code **re, char *err) {
    for (int k = 0; k < o->n_tt; k++) {
        int ec;
        PCRE2_SIZE off;
        re[k] = pcre2_compile((PCRE2_SPTR)o->tt[k].pattern, PCRE2_ZERO_TERMINATED, 0, &ec, &off, NULL);
        if (!re[k]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return dsf_seterr(err, "--tensor-type '%s': bad regex at offset %zu: %s", o->tt[k].pattern, (size_t)off,
                              (const char *)msg);
        }
    }
    return 0;
}

static int match_override(const quantize_opts *o, pcre2_code **re, const char *name) {
    for (int k = 0; k < o->n_tt; k++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re[k], NULL);
        int rc = pcre2_match(re[k], (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        if (rc >= 0) return k;
    }
    return -1;
}

/* The type of every tensor: the class's recipe type, an override, the MXFP4 rule, the
 * block-size fallback (logged, naming the tensor). */
static void plan_types(qplan *p, const quantize_opts *o, pcre2_code **re) {
    for (uint64_t i = 0; i < p->f->n_tensors; i++) {
        qtensor *q = &p->t[i];
        const gguf_tensor *t = q->t = &p->f->tensors[i];
        q->qc = quantize_tensor_class(t->name, t->n_dims, t->type);
        uint32_t type = t->type;
        if (p->native) type = q->want = quantize_native_type(t->name, t->n_dims, t->type, t->ne[0]);
        else if (q->qc != QC_KEEP) {
            int k = match_override(o, re, t->name);
            type = q->want = k >= 0 ? o->tt[k].type : p->r->type[q->qc];
            uint32_t fb = k >= 0 ? quantize_fallback_type(type, t->ne[0])
                                 : quantize_recipe_type(p->r, t->name, t->n_dims, t->type, t->ne[0]);
            if (fb != type && fb != GGML_TYPE_MXFP4)
                dsf_log(1, "quantize: %s: ne0 %lld is not a multiple of %s's block size %u: %s instead", t->name,
                        (long long)t->ne[0], ggml_type_name(type), ggml_blck_size(type), ggml_type_name(fb));
            type = fb;
        }
        q->type = type;
        q->copy = type == t->type;
        q->out_bytes = n_rows(t) * (uint64_t)t->ne[0] / ggml_blck_size(type) * ggml_type_size(type) +
                       dsf_type_extra_bytes(type, (uint64_t)t->ne[0], n_rows(t));
    }
}

/* The first quantized tensor with a type that `bad` refuses (bad returns that type, or -1),
 * that type in *type, and how many more tensors have it. */
static const qtensor *first_bad(const qplan *p, int (*bad)(const qtensor *), uint32_t *type, int64_t *more) {
    const qtensor *first = NULL;
    *more = 0;
    for (uint64_t i = 0; i < p->f->n_tensors; i++) {
        int b = p->t[i].qc == QC_KEEP ? -1 : bad(&p->t[i]);
        if (b < 0) continue;
        if (!first) {
            first = &p->t[i];
            *type = (uint32_t)b;
        } else if ((uint32_t)b == *type) ++*more;
    }
    return first;
}

/* The asked-for type counts as well as the final one: a recipe is never silently changed
 * into another because a fallback or the MXFP4 rule applied on this file. */
static int needs_imatrix(const qtensor *q) {
    return quantize_requires_imatrix(q->want) ? (int)q->want : !q->copy && quantize_requires_imatrix(q->type) ? (int)q->type : -1;
}
static int not_decodable(const qtensor *q) { return !q->copy && !ggml_type_supported(q->t->type) ? (int)q->t->type : -1; }
static int not_writable(const qtensor *q) {
    return !quantize_type_supported(q->want) ? (int)q->want : !q->copy && !quantize_type_supported(q->type) ? (int)q->type : -1;
}

/* Binds every quantized tensor's imatrix entry; refuses a mismatched entry, and a missing
 * one where the type needs it. */
static int check_imatrix(qplan *p, const quantize_opts *o, char *err) {
    int64_t missing = 0;
    for (uint64_t i = 0; i < p->f->n_tensors; i++) {
        qtensor *x = &p->t[i];
        if (x->copy) continue;
        int r = imatrix_find(p->im, x->t->name, x->t->ne[0], x->t->ne[2] * x->t->ne[3], &x->im, err);
        if (r < 0) return dsf_prefixerr(err, "%s", o->imatrix);
        x->has_im = r == 0;
        if (r == 1 && quantize_requires_imatrix(x->type))
            return dsf_seterr(err, "%s: no entry for '%s', which gets %s (a type that needs an importance matrix)",
                              o->imatrix, x->t->name, ggml_type_name(x->type));
        missing += r == 1 && x->qc != QC_EMBD && x->qc != QC_ENGRAM;
    }
    if (missing) dsf_log(1, "quantize: %lld quantized matmul weights have no imatrix entry (quantized without)", (long long)missing);
    return 0;
}

/* Refuses the plan before anything is written: types that need an imatrix without one,
 * imatrix mismatches, sources that cannot be decoded, types the quantizer cannot write. */
static int plan_check(qplan *p, const quantize_opts *o, char *err) {
    int64_t more;
    uint32_t ty = 0;
    if (p->native && (o->n_tt || o->imatrix))
        return dsf_seterr(err, "recipe native: %s does not apply (native storage is lossless: each tensor gets its "
                          "checkpoint type)", o->n_tt ? "--tensor-type" : "--imatrix");
    const qtensor *q = p->native ? NULL : first_bad(p, needs_imatrix, &ty, &more);
    if (q && !o->imatrix)
        return dsf_seterr(err, "recipe %s: %s gets %s (and %lld more tensors do), a type that needs an importance matrix: "
                          "give one with --imatrix FILE (llama-imatrix's GGUF format)", p->r->name, q->t->name,
                          ggml_type_name(ty), (long long)more);
    if (p->im && check_imatrix(p, o, err)) return -1;
    if ((q = first_bad(p, not_decodable, &ty, &more)))
        return dsf_seterr(err, "tensor '%s': its type %s cannot be decoded by this build, so it cannot be requantized",
                          q->t->name, ggml_type_name(ty));
    if (!p->native && (q = first_bad(p, not_writable, &ty, &more))) {
        char can[512] = "";
        size_t n = 0;
        for (uint32_t t = 0; t < GGML_TYPE_COUNT && n < sizeof can - 16; t++)
            if (quantize_type_supported(t)) n += (size_t)snprintf(can + n, sizeof can - n, " %s", ggml_type_name(t));
        return dsf_seterr(err, "recipe %s: type %s (for %s and %lld more tensors) cannot be written by this build's "
                          "quantizer yet (it writes:%s); use another recipe or --tensor-type", p->r->name,
                          ggml_type_name(ty), q->t->name, (long long)more, can);
    }
    return 0;
}

/* ================================================================ KVs */

/* native: the output is a native file (docs/FORMAT.md), marked by DSF_NATIVE_KEY at the end. */
static int write_kvs(gguf_writer *w, const gguf_file *f, uint32_t ftype, bool native, char *err) {
    bool ft = false, qv = false;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        int r;
        if (native && !strcmp(kv->key, DSF_NATIVE_KEY)) continue;
        if (!strcmp(kv->key, "general.file_type")) {
            r = gguf_writer_kv_u32(w, kv->key, ftype, err);
            ft = true;
        } else if (!strcmp(kv->key, "general.quantization_version")) {
            r = gguf_writer_kv_u32(w, kv->key, 2, err);
            qv = true;
        } else if (!strcmp(kv->key, "general.alignment") && !(kv->type == GGUF_VT_UINT32 && kv->u == GGUF_DEFAULT_ALIGNMENT)) {
            dsf_log(1, "quantize: general.alignment dropped (the output is aligned to %d bytes)", GGUF_DEFAULT_ALIGNMENT);
            continue;
        } else r = gguf_writer_copy_kv(w, kv, err);
        if (r) return -1;
    }
    if (!qv && gguf_writer_kv_u32(w, "general.quantization_version", 2, err)) return -1;
    if (!ft && gguf_writer_kv_u32(w, "general.file_type", ftype, err)) return -1;
    return native ? gguf_writer_kv_u32(w, DSF_NATIVE_KEY, DSF_NATIVE_VERSION, err) : 0;
}

/* ================================================================ streaming */

typedef struct {
    const qtensor *q;
    const uint8_t *src;    /* this chunk's source rows */
    uint8_t *dst;          /* this chunk's output rows */
    uint64_t row0;         /* first row of the chunk in the tensor */
    float *scratch;        /* [threads][2][ld] */
    int64_t ld;
    int64_t *bad_row;      /* [threads] lowest failing row (tensor row), or -1 */
    int *bad_rc;
} qjob;

static void q_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const qjob *j = ctx;
    const gguf_tensor *t = j->q->t;
    int64_t ne0 = t->ne[0];
    uint64_t drb = (uint64_t)ne0 / ggml_blck_size(j->q->type) * ggml_type_size(j->q->type);
    float *x = j->scratch + (size_t)tid * 2 * (size_t)j->ld, *imp = x + j->ld;
    for (int64_t r = r0; r < r1; r++) {
        uint64_t row = j->row0 + (uint64_t)r;
        dequant_row(t->type, j->src + (uint64_t)r * t->row_bytes, x, ne0);
        const float *w = NULL;
        if (j->q->has_im && imatrix_row(&j->q->im, (int64_t)(row / (uint64_t)t->ne[1]), imp) == 0) w = imp;
        int rc = quantize_row(j->q->type, x, ne0, w, j->dst + (uint64_t)r * drb);
        if (rc && (j->bad_row[tid] < 0 || (int64_t)row < j->bad_row[tid])) {
            j->bad_row[tid] = (int64_t)row;
            j->bad_rc[tid] = rc;
        }
    }
}

typedef struct {
    const qplan *p;
    gguf_writer *w;
    dsf_pool *pool;
    int threads;
    dsf_progress bar;
    uint8_t *sbuf, *dbuf;
    uint64_t scap, dcap;
    float *scratch;
    int64_t ld;
    int64_t *bad_row;
    int *bad_rc;
} qstream;

static uint8_t *grow(uint8_t **b, uint64_t *cap, uint64_t n) {
    if (n > *cap) {
        free(*b);
        *b = dsf_xmalloc((size_t)n);
        *cap = n;
    }
    return *b;
}

/* Bytes [off, off + n) of tensor t were consumed: a source of hundreds of GB (the Engram
 * table) is read once, so its pages leave the page cache (as the converter's st_release). */
static void release(const qplan *p, const gguf_tensor *t, uint64_t off, uint64_t n) {
    if (p->f->fd >= 0)
        (void)posix_fadvise(p->f->fd, (off_t)(p->f->data_offset + t->offset + off), (off_t)n, POSIX_FADV_DONTNEED);
}

static int put(qstream *s, const void *d, uint64_t n, char *err) {
    if (gguf_writer_write(s->w, d, n, err)) return -1;
    progress_add(&s->bar, n);
    return 0;
}

static int write_copy(qstream *s, const qtensor *q, char *err) {
    const gguf_tensor *t = q->t;
    for (uint64_t o = 0; o < t->nbytes; o += CHUNK_BYTES) {
        uint64_t n = t->nbytes - o < CHUNK_BYTES ? t->nbytes - o : CHUNK_BYTES;
        uint8_t *buf = grow(&s->sbuf, &s->scap, n);
        if (put(s, gguf_read_span(s->p->f, t->data + o, (size_t)n, buf, (size_t)n, false), n, err)) return -1;
        release(s->p, t, o, n);
    }
    return 0;
}

static int write_quant(qstream *s, const qtensor *q, char *err) {
    const gguf_tensor *t = q->t;
    uint64_t rows = n_rows(t), drb = q->out_bytes / rows, rb = t->row_bytes > drb ? t->row_bytes : drb;
    uint64_t step = CHUNK_BYTES / rb ? CHUNK_BYTES / rb : 1;
    for (uint64_t r0 = 0; r0 < rows; r0 += step) {
        uint64_t n = rows - r0 < step ? rows - r0 : step;
        uint8_t *buf = grow(&s->sbuf, &s->scap, n * t->row_bytes), *dst = grow(&s->dbuf, &s->dcap, n * drb);
        const uint8_t *src = gguf_read_span(s->p->f, t->data + r0 * t->row_bytes, (size_t)(n * t->row_bytes), buf,
                                            (size_t)(n * t->row_bytes), false);
        for (int k = 0; k < s->threads; k++) s->bad_row[k] = -1;
        qjob j = {q, src, dst, r0, s->scratch, s->ld, s->bad_row, s->bad_rc};
        dsf_parallel_for_dyn(s->pool, (int64_t)n, 4, q_rows, &j);
        int64_t bad = -1;
        int rc = 0;
        for (int k = 0; k < s->threads; k++)
            if (s->bad_row[k] >= 0 && (bad < 0 || s->bad_row[k] < bad)) {
                bad = s->bad_row[k];
                rc = s->bad_rc[k];
            }
        if (bad >= 0)
            return dsf_seterr(err, "tensor '%s' row %lld (of %llu): cannot quantize to %s: %s", t->name, (long long)bad,
                              (unsigned long long)rows, ggml_type_name(q->type), quantize_strerror(rc));
        if (put(s, dst, n * drb, err)) return -1;
        release(s->p, t, r0 * t->row_bytes, n * t->row_bytes);
    }
    return 0;
}

typedef struct {
    const float *x;        /* the chunk's rows, fp32 */
    uint8_t *dst, *grid;   /* the chunk's output rows; FP8_B32: the grid rows of its stripes */
    int64_t ne0, sr, rows; /* values per row, rows per stripe (32 or 1), rows in the chunk */
    bool b32;
    int64_t *bad;          /* [stripes]: the first inexact value's index in the stripe, or -1 */
} njob;

static void n_stripes(void *ctx, int64_t k0, int64_t k1, int tid) {
    (void)tid;
    const njob *j = ctx;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t r = k * j->sr, n = j->rows - r < j->sr ? j->rows - r : j->sr;
        const float *x = j->x + r * j->ne0;
        j->bad[k] = j->b32 ? quantize_native_stripe(x, n, j->ne0, j->dst + r * j->ne0, j->grid + k * ((j->ne0 + 31) / 32))
                           : quantize_native_r264(x, j->ne0, j->dst + r * (j->ne0 / 256 * 264));
    }
}

/* A tensor into FP8_B32 or FP8_R264 (quantize_native.c), losslessly or not at all: chunks of
 * whole stripes, decoded to fp32, encoded in parallel; the lowest inexact value is the error. */
static int write_native(qstream *s, const qtensor *q, char *err) {
    const gguf_tensor *t = q->t;
    const bool b32 = q->type == DSF_TYPE_FP8B32;
    const int64_t ne0 = t->ne[0], sr = b32 ? 32 : 1, gc = (ne0 + 31) / 32;
    const uint64_t rows = n_rows(t), orb = b32 ? (uint64_t)ne0 : (uint64_t)ne0 / 256 * 264;
    uint64_t step = CHUNK_BYTES / ((uint64_t)ne0 * sizeof(float)) / (uint64_t)sr * (uint64_t)sr;
    if (step < (uint64_t)sr) step = (uint64_t)sr;
    uint8_t *grid = b32 ? dsf_xmalloc((size_t)((rows + 31) / 32 * (uint64_t)gc)) : NULL;
    int64_t *bad = dsf_xmalloc((size_t)(step / (uint64_t)sr) * sizeof *bad);
    float *x = dsf_xmalloc((size_t)(step * (uint64_t)ne0) * sizeof *x);
    int rc = 0;
    for (uint64_t r0 = 0; r0 < rows && !rc; r0 += step) {
        const uint64_t n = rows - r0 < step ? rows - r0 : step, ns = (n + (uint64_t)sr - 1) / (uint64_t)sr;
        uint8_t *buf = grow(&s->sbuf, &s->scap, n * t->row_bytes), *dst = grow(&s->dbuf, &s->dcap, n * orb);
        const uint8_t *src = gguf_read_span(s->p->f, t->data + r0 * t->row_bytes, (size_t)(n * t->row_bytes), buf,
                                            (size_t)(n * t->row_bytes), false);
        for (uint64_t r = 0; r < n; r++) dequant_row(t->type, src + r * t->row_bytes, x + r * (uint64_t)ne0, ne0);
        njob j = {x, dst, grid ? grid + r0 / 32 * (uint64_t)gc : NULL, ne0, sr, (int64_t)n, b32, bad};
        dsf_parallel_for_dyn(s->pool, (int64_t)ns, 1, n_stripes, &j);
        for (uint64_t k = 0; k < ns && !rc; k++) {
            if (bad[k] < 0) continue;
            const uint64_t row = r0 + k * (uint64_t)sr + (uint64_t)bad[k] / (uint64_t)ne0;
            const uint64_t b0 = b32 ? row / 32 * 32 : row, b1 = b32 && b0 + 31 < rows ? b0 + 31 : b32 ? rows - 1 : row;
            const int64_t col = bad[k] % ne0, c0 = col / 32 * 32, c1 = c0 + 31 < ne0 ? c0 + 31 : ne0 - 1;
            rc = dsf_seterr(err, "tensor '%s': value %.9g at row %llu, column %lld (block of rows %llu..%llu, columns "
                            "%lld..%lld) is not an e4m3 value times the block's power-of-two scale: %s storage is "
                            "lossless, and this file's weights are not FP8 values", t->name,
                            (double)x[(row - r0) * (uint64_t)ne0 + (uint64_t)col], (unsigned long long)row, (long long)col,
                            (unsigned long long)b0, (unsigned long long)b1, (long long)c0, (long long)c1,
                            ggml_type_name(q->type));
        }
        if (!rc) rc = put(s, dst, n * orb, err);
        release(s->p, t, r0 * t->row_bytes, n * t->row_bytes);
    }
    if (!rc && b32) rc = put(s, grid, (rows + 31) / 32 * (uint64_t)gc, err); /* FORMAT.md: the grid follows the rows */
    free(grid);
    free(bad);
    free(x);
    return rc;
}

static int stream_all(const qplan *p, gguf_writer *w, const quantize_opts *o, uint64_t total, char *err) {
    qstream s;
    memset(&s, 0, sizeof s);
    s.p = p;
    s.w = w;
    s.threads = o->threads < 1 ? 1 : o->threads;
    s.pool = dsf_pool_new(s.threads);
    s.threads = dsf_pool_size(s.pool) > s.threads ? dsf_pool_size(s.pool) : s.threads;
    for (uint64_t i = 0; i < p->f->n_tensors; i++)
        if (!p->t[i].copy && p->t[i].t->ne[0] > s.ld) s.ld = p->t[i].t->ne[0];
    s.scratch = dsf_xmalloc((size_t)s.threads * 2 * (size_t)(s.ld ? s.ld : 1) * sizeof(float));
    s.bad_row = dsf_xmalloc((size_t)s.threads * sizeof *s.bad_row);
    s.bad_rc = dsf_xmalloc((size_t)s.threads * sizeof *s.bad_rc);
    progress_start(&s.bar, total, o->progress);
    int rc = 0;
    for (uint64_t i = 0; i < p->f->n_tensors && !rc; i++)
        rc = p->t[i].copy ? write_copy(&s, &p->t[i], err)
             : dsf_type_native(p->t[i].type) ? write_native(&s, &p->t[i], err)
                                               : write_quant(&s, &p->t[i], err);
    if (!rc) rc = gguf_writer_finish(w, err);
    progress_end(&s.bar, rc == 0);
    dsf_pool_free(s.pool);
    free(s.sbuf);
    free(s.dbuf);
    free(s.scratch);
    free(s.bad_row);
    free(s.bad_rc);
    return rc;
}

/* ================================================================ the command */

static void log_summary(const qplan *p, uint64_t total) {
    uint64_t cnt[GGML_TYPE_COUNT + 2] = {0}, in = 0; /* the ggml types, then FP8_B32 and FP8_R264 */
    for (uint64_t i = 0; i < p->f->n_tensors; i++) {
        const uint32_t ty = p->t[i].type;
        cnt[ty < GGML_TYPE_COUNT ? ty : GGML_TYPE_COUNT + (ty == DSF_TYPE_FP8R264)]++; /* gguf.c knows no other */
        in += p->t[i].t->nbytes;
    }
    char line[512];
    size_t n = 0;
    for (uint32_t t = 0; t < GGML_TYPE_COUNT + 2 && n < sizeof line - 32; t++)
        if (cnt[t])
            n += (size_t)snprintf(line + n, sizeof line - n, " %s x%llu",
                                  ggml_type_name(t < GGML_TYPE_COUNT ? t : DSF_TYPE_FP8B32 + (t - GGML_TYPE_COUNT)),
                                  (unsigned long long)cnt[t]);
    dsf_log(1, "quantize: %s (ftype %u): %llu tensors, %.2f MB -> %.2f MB;%s", p->r->name, p->r->ftype,
            (unsigned long long)p->f->n_tensors, (double)in / 1e6, (double)total / 1e6, line);
}

int quantize_model(const char *in_path, const char *out_path, const quantize_opts *o, char *err) {
    qplan p;
    memset(&p, 0, sizeof p);
    p.native = !strcasecmp(o->recipe, "native");
    p.r = p.native ? &native_recipe : quantize_recipe_find(o->recipe);
    if (!p.r) return dsf_seterr(err, "unknown recipe '%s' (see --help for the list)", o->recipe);
    int rc = -1;
    gguf_writer *w = NULL;
    pcre2_code **re = dsf_xcalloc((size_t)o->n_tt + 1, sizeof *re);
    if (compile_patterns(o, re, err)) goto done;
    if (!(p.f = gguf_open(in_path, err))) goto done;
    if (o->imatrix && !(p.im = imatrix_open(o->imatrix, err))) goto done;
    p.t = dsf_xcalloc((size_t)p.f->n_tensors + 1, sizeof *p.t);
    plan_types(&p, o, re);
    if (plan_check(&p, o, err)) goto done;
    w = gguf_writer_new();
    if (write_kvs(w, p.f, p.r->ftype, p.native, err)) goto done;
    uint64_t total = 0;
    for (uint64_t i = 0; i < p.f->n_tensors; i++) {
        const gguf_tensor *t = p.t[i].t;
        if (gguf_writer_tensor(w, t->name, p.t[i].type, t->n_dims, t->ne, err)) goto done;
        total += p.t[i].out_bytes;
    }
    log_summary(&p, total);
    if (gguf_writer_begin(w, out_path, err) || stream_all(&p, w, o, total, err)) goto done;
    rc = 0;
done:
    gguf_writer_free(w);
    for (int k = 0; k < o->n_tt; k++) pcre2_code_free(re[k]);
    free(re);
    free(p.t);
    imatrix_close(p.im);
    gguf_close(p.f);
    return rc;
}
