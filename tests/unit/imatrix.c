/* imatrix.c: the imatrix reader's lookups (convert/imatrix.c), on small files written here.
 *
 * Guards against: an imatrix_find message that quotes a weight name holding a newline or
 * another control byte as it is, breaking the one-line error contract (the name can come
 * from a file: the model's tensor table or the imatrix's). */
#include "test.h"
#include "convert/imatrix.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <string.h>
#include <unistd.h>

/* An imatrix with one weight `name`: in_sum2 {4, 1} = sum2[], counts {1, 1} = 2. */
static int write_one(const char *path, const char *name, const float *sum2, char *err) {
    char sn[GGUF_MAX_NAME], cn[GGUF_MAX_NAME];
    snprintf(sn, sizeof sn, "%s.in_sum2", name);
    snprintf(cn, sizeof cn, "%s.counts", name);
    const int64_t ne_s[2] = {4, 1}, ne_c[2] = {1, 1};
    const float cnt = 2;
    gguf_writer *w = gguf_writer_new();
    int rc = gguf_writer_kv_str(w, "general.type", "imatrix", err) ||
             gguf_writer_tensor(w, sn, GGML_TYPE_F32, 2, ne_s, err) || gguf_writer_tensor(w, cn, GGML_TYPE_F32, 2, ne_c, err) ||
             gguf_writer_begin(w, path, err) || gguf_writer_write(w, sum2, 16, err) || gguf_writer_write(w, &cnt, 4, err) ||
             gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc;
}

TEST(imatrix_find_messages_one_line) {
    char path[512], err[DSF_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/one.imatrix.gguf", test_tmpdir());
    const float good[4] = {1, 2, 3, 4}, neg[4] = {1, -2, 3, 4};
    const char *name = "blk.0.a\nb.weight";
    for (int k = 0; k < 2; k++) {
        CHECKF(write_one(path, name, k ? neg : good, err) == 0, "%s", err);
        imatrix *m = imatrix_open(path, err);
        CHECKF(m, "%s", err);
        imatrix_entry e;
        /* k 0: a column count mismatch; k 1: a negative sum */
        int r = imatrix_find(m, name, k ? 4 : 8, 1, &e, err);
        imatrix_close(m);
        CHECKF(r == -1, "case %d: imatrix_find returned %d", k, r);
        CHECKF(!strchr(err, '\n') && strstr(err, "blk.0.a?b.weight"), "case %d: message not on one line: %s", k, err);
        CHECKF(strstr(err, k ? "is -2" : "covers 4 columns"), "case %d: message does not name the problem: %s", k, err);
    }
    unlink(path);
}
