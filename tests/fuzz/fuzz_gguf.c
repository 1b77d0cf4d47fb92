/* fuzz_gguf.c: libFuzzer harness for the GGUF reader (`make fuzz`). Every input is opened
 * with gguf_open_mem; when it is accepted, everything the reader promises is exercised:
 * each key and tensor is looked up by name, every typed getter runs on every key, and the
 * first and last rows of each tensor of a supported type are dequantized (this reads tensor
 * data, which must lie inside the input), an FP8_B32 matrix's through its scale grid (which
 * must fit in the tensor's bytes). ASan/UBSan turn any overread into a crash. */
#include "io/gguf.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[DSF_ERR_LEN];
    gguf_file *f = gguf_open_mem(data, size, "fuzz.gguf", err);
    if (!f) {
        if (strncmp(err, "fuzz.gguf: ", 11) != 0) abort(); /* every error names the file */
        return 0;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const char *k = f->kv[i].key;
        if (gguf_find_kv(f, k) != &f->kv[i]) abort();
        uint32_t u; int32_t s; float x; bool b; char *str = NULL;
        uint32_t *au = NULL; int32_t *ai = NULL; uint64_t *a64 = NULL, n; float *af = NULL;
        gguf_get_u32(f, k, &u, err);
        gguf_get_i32(f, k, &s, err);
        gguf_get_f32(f, k, &x, err);
        gguf_get_bool(f, k, &b, err);
        if (gguf_get_str(f, k, &str, err) == 0) free(str);
        if (gguf_get_arr_u32(f, k, &au, &n, err) == 0) free(au);
        if (gguf_get_arr_i32(f, k, &ai, &n, err) == 0) free(ai);
        if (gguf_get_arr_u64(f, k, &a64, &n, err) == 0) free(a64);
        if (gguf_get_arr_f32(f, k, &af, &n, err) == 0) free(af);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t) abort();
        if (t->data < f->map + f->data_offset || t->data + t->nbytes > f->map + f->size) abort();
        if (t->type == DSF_TYPE_FP8B32 && t->ne[0] <= (1 << 16)) { /* rows, then the grid (docs/FORMAT.md) */
            const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            if (t->nbytes != (uint64_t)(rows * t->ne[0]) + dsf_type_extra_bytes(t->type, (uint64_t)t->ne[0], (uint64_t)rows))
                abort();
            const dsf_wmat w = {t->type, t->ne[0], rows, (uint64_t)t->ne[0], t->data, t->data + rows * t->ne[0]};
            float *row = malloc((size_t)t->ne[0] * sizeof *row);
            wmat_dequant_row(&w, 0, row);
            wmat_dequant_row(&w, rows - 1, row);
            free(row);
        }
        if (!ggml_type_supported(t->type) || t->ne[0] > (1 << 16)) continue;
        float *row = malloc((size_t)t->ne[0] * sizeof *row);
        dequant_row(t->type, t->data, row, t->ne[0]);
        dequant_row(t->type, t->data + t->nbytes - t->row_bytes, row, t->ne[0]);
        free(row);
    }
    gguf_close(f);
    return 0;
}
