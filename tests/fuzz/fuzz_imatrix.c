/* fuzz_imatrix.c: libFuzzer harness for the importance-matrix reader (src/convert/imatrix.c),
 * the file `dsflash quantize --imatrix` takes. The input is a whole file, written to a memfd
 * and opened with imatrix_open. A refusal must be one line naming the problem. When the file
 * is accepted, every promise of imatrix.h is checked against the GGUF reader's view of the
 * same bytes: one entry per "<weight>.in_sum2" tensor, each found with its own shape and
 * refused with any other, an unknown weight reported absent, and the importance rows never
 * NaN or negative (finite non-negative sums over positive finite counts). */
#include "fuzz_common.h"
#include "convert/imatrix.h"
#include "io/gguf.h"

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#define FZ_IM_SUM2 ".in_sum2"

static void fz_im_check(const imatrix *m, const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN];
    gguf_file *g = gguf_open_mem(data, size, "fuzz.gguf", err);
    FZ_REQUIRE(g, "imatrix_open accepted a file the GGUF reader refuses: %s", err);
    int64_t n = 0;
    static float row[8192];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        size_t len = strlen(t->name), sl = strlen(FZ_IM_SUM2);
        if (len <= sl || strcmp(t->name + len - sl, FZ_IM_SUM2)) continue;
        n++;
        char name[GGUF_MAX_NAME + 16];
        snprintf(name, sizeof name, "%.*s", (int)(len - sl), t->name);
        imatrix_entry e;
        int r = imatrix_find(m, name, t->ne[0], t->ne[1], &e, err);
        FZ_REQUIRE(r == 0 || r == -1, "entry '%s' of the file not found (%d)", name, r);
        if (r < 0) {
            fz_check_err(err, "imatrix_find");
            continue;
        }
        FZ_REQUIRE(e.n_in == t->ne[0] && e.n_mat == t->ne[1] && !strcmp(e.weight, name), "entry '%s' misbound", name);
        imatrix_entry e2;
        FZ_REQUIRE(imatrix_find(m, name, t->ne[0] + 1, t->ne[1], &e2, err) == -1, "'%s': a wrong n_in was accepted", name);
        fz_check_err(err, "imatrix_find (wrong shape)");
        if (e.n_in > (int64_t)(sizeof row / sizeof *row)) continue;
        for (int64_t k = 0; k < e.n_mat && k < 4; k++) {
            if (imatrix_row(&e, k, row)) continue; /* no token reached matrix k */
            for (int64_t c = 0; c < e.n_in; c++)
                FZ_REQUIRE(!isnan(row[c]) && row[c] >= 0, "'%s' matrix %lld column %lld: importance %g", name,
                           (long long)k, (long long)c, row[c]);
        }
    }
    FZ_REQUIRE(n == imatrix_count(m), "imatrix_count %lld, the file holds %lld in_sum2 tensors",
               (long long)imatrix_count(m), (long long)n);
    imatrix_entry e;
    FZ_REQUIRE(imatrix_find(m, "no.such.weight", 1, 1, &e, err) == 1, "an unknown weight was found");
    gguf_close(g);
}

static int fz_imatrix_one(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.imatrix", MFD_CLOEXEC);
    FZ_REQUIRE(fd >= 0, "memfd_create failed");
    FZ_REQUIRE(size == 0 || write(fd, data, size) == (ssize_t)size, "memfd write failed");
    char path[64], err[DSF_ERR_LEN];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    imatrix *m = imatrix_open(path, err);
    int accepted = m != NULL;
    if (m) {
        fz_im_check(m, data, size);
        imatrix_close(m);
    } else {
        fz_check_err(err, "imatrix_open");
    }
    close(fd);
    return accepted;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_imatrix_one(data, size);
    return 0;
}
#endif
