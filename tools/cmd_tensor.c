/* cmd_tensor.c: `dsflash tensor M.gguf NAME --out OUT.f32`: one tensor of any GGUF, whatever
 * its architecture, dequantized to little-endian f32 (ggml element order: ne0 fastest).
 *
 * Owns: the streamed dequantization of one tensor and the check of its values.
 * Must not: know a model (it reads the container only: io/gguf.h), hold the tensor in memory
 * (it reads whole blocks with pread into a bounded buffer and never touches another tensor's
 * bytes), or leave a partial OUT.f32 (it writes OUT.f32.tmp, then renames it).
 * Invariant: the output's bytes are dequant_row's values of the file's blocks, in order (an
 * FP8_B32 matrix's: wmat_dequant_row's, row by row). A
 * NaN or an infinity in the values (a block scale of NaN/Inf, an F32 weight holding one) is
 * an error naming the row and block, unless --allow-nonfinite; --check scans without
 * writing. */
#include "cmd.h"
#include "io/gguf.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *USAGE =
    "usage: dsflash tensor MODEL.gguf NAME (--out OUT.f32 | --check) [--allow-nonfinite]\n"
    "  Dequantizes tensor NAME of any GGUF file to little-endian float32, ne0 fastest (a [ne1][ne0]\n"
    "  matrix is written row by row). Reads the file's tensor table and that tensor's bytes only,\n"
    "  a bounded piece at a time; writes OUT.f32.tmp, then renames it to OUT.f32.\n"
    "  A NaN or an infinity among the values (e.g. a quantized block whose scale is NaN or Inf) is\n"
    "  an error that names the row and block; --allow-nonfinite writes them anyway.\n"
    "  --check           scan the values and report the non-finite ones; writes nothing\n"
    "  --allow-nonfinite write the values even if some are NaN or infinite (still reported)\n";

#define PIECE_BYTES (4u << 20)  /* file bytes read per pread: whole blocks, at least one */
#define PIECE_VALUES (4u << 20) /* and values dequantized per piece (16 MiB of f32) */
#define MAX_REPORTS 8          /* non-finite blocks listed before the summary */

typedef struct {
    const gguf_tensor *t;
    uint64_t bad_values, bad_blocks;
    int reported;
} scan;

/* Records the non-finite values of block b (elements [b*bs, b*bs+bs) of the tensor). */
static void check_block(scan *sc, const float *v, uint32_t bs, uint64_t b) {
    uint64_t bad = 0;
    for (uint32_t i = 0; i < bs; i++) bad += !isfinite(v[i]);
    if (!bad) return;
    sc->bad_values += bad;
    sc->bad_blocks++;
    if (sc->reported++ >= MAX_REPORTS) return;
    const uint64_t per_row = (uint64_t)sc->t->ne[0] / bs;
    fprintf(stderr, "dsflash tensor: %s: row %llu, block %llu (elements %llu..%llu of the row): %llu of %u values "
                    "are NaN or infinite\n",
            sc->t->name, (unsigned long long)(b / per_row), (unsigned long long)(b % per_row),
            (unsigned long long)(b % per_row * bs), (unsigned long long)(b % per_row * bs + bs - 1),
            (unsigned long long)bad, bs);
}

/* Reads n bytes at file offset off into buf; -1 with err on a read error or a short read (a
 * file truncated since it was opened). */
static int read_at(const gguf_file *g, uint64_t off, uint8_t *buf, size_t n, char *err) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(g->fd, buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dsf_seterr(err, "%s: read failed at offset %llu: %s", g->path, (unsigned long long)(off + got),
                                     strerror(errno));
        if (r == 0)
            return dsf_seterr(err, "%s: truncated: the file ends at offset %llu, inside the tensor's data", g->path,
                              (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}

/* The pieces a tensor is streamed in: per_piece whole blocks of bs values (ts bytes each) at a
 * time; an FP8_B32 matrix (docs/FORMAT.md) as 32-row stripes, each read with its row of the
 * scale grid that follows all the rows, and checked value by value (bs 1). */
typedef struct {
    bool b32;
    uint32_t bs, ts;
    uint64_t per_piece, n_units;      /* blocks per piece and in all (b32: rows per piece and rows) */
    uint64_t raw_bytes, values;       /* buffer sizes of one piece */
} pieces;

static pieces plan_pieces(const gguf_tensor *t) {
    pieces p = {t->type == DSF_TYPE_FP8B32, ggml_blck_size(t->type), ggml_type_size(t->type), 0, 0, 0, 0};
    const uint64_t ne0 = (uint64_t)t->ne[0];
    if (p.b32) {
        p.per_piece = 32;
        p.n_units = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        p.raw_bytes = 32 * ne0 + (ne0 + 31) / 32;
        p.values = 32 * ne0;
        return p;
    }
    p.n_units = t->nbytes / p.ts;
    p.per_piece = PIECE_BYTES / p.ts < PIECE_VALUES / p.bs ? PIECE_BYTES / p.ts : PIECE_VALUES / p.bs;
    if (p.per_piece < 1) p.per_piece = 1;
    p.raw_bytes = p.per_piece * p.ts;
    p.values = p.per_piece * p.bs;
    return p;
}

/* Reads and dequantizes the piece starting at unit u (n units) into val; *nv values. */
static int read_piece(const gguf_file *g, const gguf_tensor *t, const pieces *p, uint64_t u, uint64_t n, uint8_t *raw,
                      float *val, uint64_t *nv, char *err) {
    const uint64_t base = g->data_offset + t->offset, ne0 = (uint64_t)t->ne[0], gc = (ne0 + 31) / 32;
    if (!p->b32) {
        if (read_at(g, base + u * p->ts, raw, (size_t)(n * p->ts), err) < 0) return -1;
        dequant_row(t->type, raw, val, (int64_t)(n * p->bs));
        *nv = n * p->bs;
        return 0;
    }
    if (read_at(g, base + u * ne0, raw, (size_t)(n * ne0), err) < 0 ||
        read_at(g, base + p->n_units * ne0 + u / 32 * gc, raw + 32 * ne0, (size_t)gc, err) < 0)
        return -1;
    const dsf_wmat w = {DSF_TYPE_FP8B32, (int64_t)ne0, (int64_t)n, ne0, raw, raw + 32 * ne0};
    for (uint64_t r = 0; r < n; r++) wmat_dequant_row(&w, (int64_t)r, val + r * ne0);
    *nv = n * ne0;
    return 0;
}

/* Streams tensor t through its decoder: every value is checked, and written to out (may be
 * NULL). 0, or -1 with err. */
static int stream(const gguf_file *g, const gguf_tensor *t, FILE *out, scan *sc, char *err) {
    const pieces p = plan_pieces(t);
    const uint32_t cbs = p.b32 ? 1 : p.bs; /* the values checked together */
    uint8_t *raw = malloc((size_t)p.raw_bytes);
    float *val = malloc((size_t)p.values * sizeof(float));
    int rc = -1;
    if (!raw || !val) {
        dsf_seterr(err, "out of memory for a piece of %llu values", (unsigned long long)p.values);
        goto done;
    }
    uint64_t done_values = 0;
    for (uint64_t u = 0; u < p.n_units; u += p.per_piece) {
        const uint64_t n = p.n_units - u < p.per_piece ? p.n_units - u : p.per_piece;
        uint64_t nv;
        if (read_piece(g, t, &p, u, n, raw, val, &nv, err) < 0) goto done;
        for (uint64_t k = 0; k < nv / cbs; k++) check_block(sc, val + k * cbs, cbs, done_values / cbs + k);
        done_values += nv;
        if (out && fwrite(val, sizeof(float), (size_t)nv, out) != (size_t)nv) {
            dsf_seterr(err, "write failed: %s", strerror(errno));
            goto done;
        }
    }
    rc = 0;
done:
    free(raw);
    free(val);
    return rc;
}

/* Dequantizes NAME into out_path (NULL: scan only). Returns the exit status. */
static int run(const char *model, const char *name, const char *out_path, bool allow_nonfinite) {
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open(model, err);
    if (!g) {
        dsf_err_oneline(err);
        fprintf(stderr, "dsflash tensor: %s\n", err);
        return 1;
    }
    int rc = 1;
    char *tmp = NULL;
    FILE *out = NULL;
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "dsflash tensor: %s has no tensor named '%s'\n", model, name);
        goto done;
    }
    if (!ggml_type_supported(t->type) && t->type != DSF_TYPE_FP8B32) {
        fprintf(stderr, "dsflash tensor: %s: type %s (%u) is not supported by dsflash (no dequantizer for it)\n",
                t->name, ggml_type_name(t->type), t->type);
        goto done;
    }
    if (out_path) {
        size_t n = strlen(out_path) + 5;
        tmp = dsf_xmalloc(n);
        snprintf(tmp, n, "%s.tmp", out_path);
        out = fopen(tmp, "wb");
        if (!out) {
            fprintf(stderr, "dsflash tensor: cannot write %s: %s\n", tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto done;
        }
    }
    scan sc = {t, 0, 0, 0};
    if (stream(g, t, out, &sc, err) < 0) {
        fprintf(stderr, "dsflash tensor: %s: %s\n", t->name, err);
        goto done;
    }
    if (sc.bad_values) {
        if (sc.reported > MAX_REPORTS) fprintf(stderr, "dsflash tensor: %s: ... (%d more blocks)\n", t->name,
                                               sc.reported - MAX_REPORTS);
        fprintf(stderr, "dsflash tensor: %s (%s): %llu values in %llu blocks are NaN or infinite%s\n", t->name,
                ggml_type_name(t->type), (unsigned long long)sc.bad_values, (unsigned long long)sc.bad_blocks,
                out && allow_nonfinite ? " (written: --allow-nonfinite)" : out ? "; nothing written (--allow-nonfinite writes them)" : "");
        if (!allow_nonfinite || !out) goto done;
    }
    if (out) {
        int e = fflush(out) != 0 || ferror(out);
        e |= fclose(out) != 0;
        out = NULL;
        if (e || rename(tmp, out_path) != 0) {
            fprintf(stderr, "dsflash tensor: cannot write %s: %s\n", out_path, strerror(errno));
            goto done;
        }
        free(tmp);
        tmp = NULL;
    }
    if (!sc.bad_values || allow_nonfinite) rc = 0;
done:
    if (out) fclose(out);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    gguf_close(g);
    return rc;
}

static int cmd_tensor(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    const char *pos[2] = {NULL, NULL}, *out = NULL;
    int n_pos = 0;
    bool check = false, allow = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--check")) check = true;
        else if (!strcmp(argv[i], "--allow-nonfinite")) allow = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "dsflash tensor: unknown option %s\n%s", argv[i], USAGE);
            return 2;
        } else if (n_pos < 2) pos[n_pos++] = argv[i];
        else {
            fprintf(stderr, "dsflash tensor: unexpected argument %s\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (n_pos != 2 || (!out) == !check) {
        fprintf(stderr, "dsflash tensor: %s\n%s",
                n_pos != 2 ? "needs MODEL.gguf and a tensor NAME" : "needs exactly one of --out OUT.f32 and --check", USAGE);
        return 2;
    }
    return run(pos[0], pos[1], out, allow);
}

DSF_COMMAND(tensor, "dequantize one tensor of any GGUF to float32 (--out), or check its values (--check)", cmd_tensor)
