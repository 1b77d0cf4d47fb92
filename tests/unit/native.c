/* native.c: dsflash's native types (kernels/dtype.h, docs/FORMAT.md): their sizes and names, the
 * FP8_R264 row decoder and the FP8_B32 matrix rows (wmat_dequant_row), against values worked out
 * by hand from architecture.md §3.1-3.2 (e4m3: (8+m) 2^(e-10), subnormal m 2^-9; E8M0: 2^(b-127)).
 *
 * Guards against: a scale applied to the wrong 32 values or the wrong 32-row block, a grid
 * indexed by rows instead of row blocks, the sign of zero lost, e4m3 subnormals mis-decoded, and
 * a size rule that forgets the FP8_B32 grid or counts a partial block wrong. */
#include "test.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

TEST(native_type_sizes) {
    CHECK(ggml_blck_size(DSF_TYPE_FP8R264) == 256 && ggml_type_size(DSF_TYPE_FP8R264) == 264);
    CHECK(ggml_blck_size(DSF_TYPE_FP8B32) == 1 && ggml_type_size(DSF_TYPE_FP8B32) == 1);
    CHECK(!strcmp(ggml_type_name(DSF_TYPE_FP8B32), "FP8_B32") && !strcmp(ggml_type_name(DSF_TYPE_FP8R264), "FP8_R264"));
    CHECK(dsf_type_native(DSF_TYPE_FP8B32) && dsf_type_native(DSF_TYPE_FP8R264) && !dsf_type_native(GGML_TYPE_BF16));
    CHECK(ggml_type_supported(DSF_TYPE_FP8R264));
    CHECK(!ggml_blck_size(1026) && !strcmp(ggml_type_name(1026), "?"));
    /* [8192 rows][4096]: 256 x 128 scale bytes; a partial block counts whole: 33 x 40 -> 2 x 2 */
    CHECK(dsf_type_extra_bytes(DSF_TYPE_FP8B32, 4096, 8192) == 256 * 128);
    CHECK(dsf_type_extra_bytes(DSF_TYPE_FP8B32, 40, 33) == 4);
    CHECK(dsf_type_extra_bytes(DSF_TYPE_FP8R264, 256, 10) == 0 && dsf_type_extra_bytes(GGML_TYPE_BF16, 64, 64) == 0);
}

TEST(native_r264_row) {
    uint8_t b[264];
    for (int j = 0; j < 256; j++) b[j] = 0;
    b[0] = 0x38;   /* e=7, m=0: 1.0 */
    b[1] = 0xB8;   /* -1.0 */
    b[2] = 0x01;   /* subnormal: 2^-9 */
    b[3] = 0x7E;   /* e=15, m=6: 14 * 2^5 = 448 */
    b[4] = 0x80;   /* -0.0 */
    b[31] = 0x3C;  /* e=7, m=4: 12 * 2^-3 = 1.5 */
    b[32] = 0x38;  /* first value of the second scale group */
    b[255] = 0x40; /* e=8, m=0: 2.0 */
    for (int s = 0; s < 8; s++) b[256 + s] = (uint8_t)(127 + s); /* group s: 2^s */
    b[256] = 120;                                                /* group 0: 2^-7 */
    float y[256];
    dequant_row(DSF_TYPE_FP8R264, b, y, 256);
    CHECK(y[0] == 0x1p-7f && y[1] == -0x1p-7f && y[2] == 0x1p-16f && y[3] == 448.0f * 0x1p-7f);
    CHECK(y[4] == 0.0f && signbit(y[4]) && y[5] == 0.0f && !signbit(y[5]));
    CHECK(y[31] == 1.5f * 0x1p-7f && y[32] == 2.0f && y[255] == 2.0f * 128.0f);
}

TEST(native_b32_rows) {
    enum { NO = 40, NI = 40 }; /* 2 x 2 blocks, the second ones partial (8 rows, 8 columns) */
    static uint8_t q[NO * NI + 4];
    for (int i = 0; i < NO * NI; i++) q[i] = 0x38; /* every value 1.0 before its scale */
    q[33 * NI + 35] = 0x01;                        /* row 33, column 35: 2^-9 */
    q[5 * NI + 7] = 0xC0;                          /* row 5, column 7: -2.0 */
    uint8_t *grid = q + NO * NI;
    grid[0] = 127; grid[1] = 128; grid[2] = 126; grid[3] = 130; /* S[0][0]=1, S[0][1]=2, S[1][0]=.5, S[1][1]=8 */
    dsf_wmat w = {DSF_TYPE_FP8B32, NI, NO, NI, q, grid};
    float y[NI];
    wmat_dequant_row(&w, 5, y);
    CHECK(y[0] == 1.0f && y[7] == -2.0f && y[31] == 1.0f && y[32] == 2.0f && y[39] == 2.0f);
    wmat_dequant_row(&w, 31, y);
    CHECK(y[31] == 1.0f && y[32] == 2.0f);
    wmat_dequant_row(&w, 32, y);
    CHECK(y[0] == 0.5f && y[31] == 0.5f && y[32] == 8.0f);
    wmat_dequant_row(&w, 33, y);
    CHECK(y[35] == 0x1p-9f * 8.0f && y[34] == 8.0f && y[1] == 0.5f);
}
