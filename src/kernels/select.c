/* kernels.c: picks the kernel table once at startup and routes each call to the table entry
 * or, when it has none, to the scalar twin.
 *
 * Selection: the best table whose every compile flag the CPU supports (a table compiled with
 * -mavx512vbmi may contain such instructions anywhere, so all of them are required); amx also
 * needs the OS to grant the tile state. DSF_KERNELS=ref|avx2|avx512|amx|amx-mxfp4 forces one;
 * an unknown name or one the CPU cannot run prints a warning and falls back to the automatic
 * choice. */
#include "kernels/matmul.h"
#include "base/util.h"

#include <pthread.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* clang 14 has no "f16c" name for __builtin_cpu_supports: read CPUID.1:ECX[29] */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi");
#else
    return 0;
#endif
}

/* AMX: CPUID.(7,0):EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), the OS saving the tile state
 * (XCR0 bits 17 and 18), and Linux granting this process the tile data state
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile
 * instruction faults). Asked once. */
static int amx_ok;
static void amx_probe(void) {
#if defined(__linux__) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (!kernels_amx_built() || !cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) ||
        !(d & (1u << 22)) || !(d & (1u << 24)))
        return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
}

static dsf_kernels amx_table, amx_mx_table;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_setup(void) {
    amx_probe();
    if (!amx_ok) return;
    kernels_amx_init(&amx_table, 0);
    kernels_amx_init(&amx_mx_table, 1);
}
static int cpu_has_amx(void) {
    pthread_once(&amx_once, amx_setup);
    return amx_ok;
}

const dsf_kernels *kernels_by_name(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "ref")) return &kernels_ref;
    if (!strcmp(name, "avx2")) return cpu_has_avx2() ? &kernels_avx2 : NULL;
    if (!strcmp(name, "avx512")) return cpu_has_avx512() ? &kernels_avx512 : NULL;
    if (!strcmp(name, "amx")) return cpu_has_amx() ? &amx_table : NULL;
    if (!strcmp(name, "amx-mxfp4")) return cpu_has_amx() ? &amx_mx_table : NULL;
    return NULL;
}

static const dsf_kernels *pick(void) {
    const char *want = dsf_knob("DSF_KERNELS");
    if (want) {
        const dsf_kernels *k = kernels_by_name(want);
        if (k) return k;
        dsf_log(0, "dsflash: warning: DSF_KERNELS=%s is %s; choosing automatically", want,
                (!strcmp(want, "avx2") || !strcmp(want, "avx512") || !strncmp(want, "amx", 3))
                    ? "not supported by this CPU"
                    : "unknown (ref, avx2, avx512, amx, amx-mxfp4)");
    }
    if (cpu_has_amx()) return &amx_table;
    if (cpu_has_avx512()) return &kernels_avx512;
    if (cpu_has_avx2()) return &kernels_avx2;
    return &kernels_ref;
}

const dsf_kernels *kernels_get(void) {
    static const dsf_kernels *_Atomic k;
    const dsf_kernels *cur = k;
    if (!cur) {
        cur = pick(); /* idempotent: a race picks the same table twice */
        k = cur;
    }
    return cur;
}

uint64_t mxfp4r_row_bytes(int64_t n_in) { return n_in > 0 && n_in % 32 == 0 ? (uint64_t)n_in / 2 : 0; }

/* Byte offset of code bytes 4h .. 4h+3 of block b in a repacked row of nbk blocks (kernels.h):
 * unit u = b / 16 is 4 lines of 4 nu bytes, nu = its blocks (16, or fewer in the last); the
 * two whole units of a pair (2p, 2p + 1) interleave their lines. */
static uint64_t mxfp4r_dword(int64_t nbk, int64_t b, int h) {
    const int64_t u = b / 16, nu = nbk - 16 * u < 16 ? nbk - 16 * u : 16, npair = nbk / 32;
    if (u < 2 * npair) return (uint64_t)(512 * (u / 2) + 128 * h + 64 * (u % 2) + 4 * (b % 16));
    return (uint64_t)(256 * u + 4 * nu * h + 4 * (b % 16));
}

void mxfp4r_repack(const dsf_wmat *src, int64_t r0, int64_t r1, uint8_t *codes, uint8_t *scales) {
    const int64_t nbk = src->n_in / 32;
    const uint64_t rb = mxfp4r_row_bytes(src->n_in);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *in = src->data + (uint64_t)r * src->row_bytes;
        uint8_t *c = codes + (uint64_t)r * rb, *sc = scales + (uint64_t)r * (uint64_t)nbk;
        for (int64_t b = 0; b < nbk; b++) {
            sc[b] = in[b * 17];
            for (int h = 0; h < 4; h++) memcpy(c + mxfp4r_dword(nbk, b, h), in + b * 17 + 1 + 4 * h, 4);
        }
    }
}

void mxfp4r_block(const uint8_t *codes, const uint8_t *scales, int64_t nbk, int64_t b, uint8_t blk[17]) {
    blk[0] = scales[b];
    for (int h = 0; h < 4; h++) memcpy(blk + 1 + 4 * h, codes + mxfp4r_dword(nbk, b, h), 4);
}

dsf_wmat mxfp4r_view(const dsf_wmat *src, const uint8_t *codes, const uint8_t *scales) {
    dsf_wmat m = *src;
    m.type = DSF_TYPE_MXFP4R;
    m.row_bytes = mxfp4r_row_bytes(src->n_in);
    m.data = codes;
    m.scales = scales;
    return m;
}

void kern_matmul(const dsf_kernels *k, const dsf_wmat *w, const float *x, int64_t T, float *y,
                 int64_t ldy, int64_t r0, int64_t r1) {
    matmul_fn fn = (k && w->type < GGML_TYPE_COUNT) ? k->matmul[w->type] : NULL;
    if (!fn && w->type < GGML_TYPE_COUNT) fn = kernels_ref.matmul[w->type];
    if (!fn) fn = matmul_any_ref;
    fn(w, x, T, y, ldy, r0, r1);
}

double kern_read_probe(const dsf_kernels *k, const uint8_t *p, uint64_t n) {
    read_probe_fn fn = k && k->read_probe ? k->read_probe : kernels_ref.read_probe;
    return fn(p, n);
}

uint64_t kern_peak_probe(const dsf_kernels *k, int64_t iters, int bf16, float *sink) {
    peak_probe_fn fn = k && k->peak_probe ? k->peak_probe : kernels_ref.peak_probe;
    return fn(iters, bf16, sink);
}

void kern_matmul_xbf16(const dsf_kernels *k, const dsf_wmat *w, const uint16_t *x, int64_t T, float *y,
                       int64_t ldy, int64_t r0, int64_t r1) {
    matmul_xbf16_fn fn = (k && w->type < GGML_TYPE_COUNT) ? k->matmul_xbf16[w->type] : NULL;
    if (k && w->type == DSF_TYPE_MXFP4R) fn = k->mxfp4r_xbf16;
    if (!fn) fn = matmul_xbf16_any_ref;
    fn(w, x, T, y, ldy, r0, r1);
}

bool kern_act_to_bf16(const float *x, uint16_t *xb, int64_t n) {
    const dsf_kernels *k = kernels_get();
    return (k->act_to_bf16 ? k->act_to_bf16 : act_to_bf16_ref)(x, xb, n);
}

bool act_to_bf16_ref(const float *x, uint16_t *xb, int64_t n) {
    bool exact = true;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        /* round to nearest even; NaN stays a quiet NaN (quant.c's f32_to_bf16 rule) */
        uint16_t h = (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)((u >> 16) | 0x40)
                                                     : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
        xb[i] = h;
        exact &= (u & 0xFFFFu) == 0;
    }
    return exact;
}
