/* select.c: picks the kernel tables (matmul and vec, together) once at startup and routes each
 * call to the table entry or, when it has none, to the scalar twin.
 *
 * Owns: the CPU probe, DSF_KERNELS, the choice, and the kern_* / ka_* calls (select.h).
 * Must not: compute a value itself; be called from a twin or an ISA file (they sit below it).
 *
 * Selection: the best table whose every compile flag the CPU supports (a table compiled with
 * -mavx512vbmi may contain such instructions anywhere, so all of them are required); amx also
 * needs the OS to grant the tile state. DSF_KERNELS=ref|avx2|avx512|amx|amx-mxfp4 forces one (and
 * amx-emu|amx-mxfp4-emu, the amx code on emulated tiles, for tests);
 * an unknown name or one the CPU cannot run prints a warning and falls back to the automatic
 * choice. */
#include "kernels/select.h"
#include "kernels/mxfp4r.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
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

/* The amx tables on emulated tiles (matmul.h): any CPU with the avx512 table's features. */
static dsf_kernels amxemu_table, amxemu_mx_table;
static pthread_once_t amxemu_once = PTHREAD_ONCE_INIT;
static int amxemu_ok;
static void amxemu_setup(void) {
    amxemu_ok = kernels_amxemu_built() && cpu_has_avx512();
    if (!amxemu_ok) return;
    kernels_amxemu_init(&amxemu_table, 0);
    kernels_amxemu_init(&amxemu_mx_table, 1);
}
static const dsf_kernels *amxemu(int mxfp4) {
    pthread_once(&amxemu_once, amxemu_setup);
    return !amxemu_ok ? NULL : mxfp4 ? &amxemu_mx_table : &amxemu_table;
}

const dsf_kernels *kernels_by_name(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "ref")) return &kernels_ref;
    if (!strcmp(name, "avx2")) return cpu_has_avx2() ? &kernels_avx2 : NULL;
    if (!strcmp(name, "avx512")) return cpu_has_avx512() ? &kernels_avx512 : NULL;
    if (!strcmp(name, "amx")) return cpu_has_amx() ? &amx_table : NULL;
    if (!strcmp(name, "amx-mxfp4")) return cpu_has_amx() ? &amx_mx_table : NULL;
    if (!strcmp(name, "amx-emu")) return amxemu(0);
    if (!strcmp(name, "amx-mxfp4-emu")) return amxemu(1);
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
                    : "unknown (ref, avx2, avx512, amx, amx-mxfp4, amx-emu, amx-mxfp4-emu)");
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

void kern_matmul(const dsf_kernels *k, const dsf_wmat *w, const float *x, int64_t T, float *y,
                 int64_t ldy, int64_t r0, int64_t r1) {
    matmul_fn fn = (k && w->type < GGML_TYPE_COUNT) ? k->matmul[w->type] : NULL;
    if (!fn && w->type < GGML_TYPE_COUNT) fn = kernels_ref.matmul[w->type];
    if (k && w->type == DSF_TYPE_FP8B32) fn = k->fp8b32;
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
    if (k && w->type == DSF_TYPE_FP8B32) fn = k->fp8b32_xbf16;
    if (!fn) fn = matmul_xbf16_any_ref;
    fn(w, x, T, y, ldy, r0, r1);
}

void kern_matmul_q8k(const dsf_kernels *k, const dsf_wmat *w, const dsf_q8k *x, int64_t T, float *y,
                     int64_t ldy, int64_t r0, int64_t r1) {
    matmul_q8k_fn fn = (k && w->type < GGML_TYPE_COUNT) ? k->matmul_q8k[w->type] : NULL;
    if (!fn) fn = matmul_q8k_any_ref;
    fn(w, x, T, y, ldy, r0, r1);
}

bool kern_act_to_bf16(const float *x, uint16_t *xb, int64_t n) {
    const dsf_kernels *k = kernels_get();
    return (k->act_to_bf16 ? k->act_to_bf16 : act_to_bf16_ref)(x, xb, n);
}

/* ---- the vec table: follows the matmul table's choice ----------------------------------- */

static const dsf_akernels *by_matmul_table(const dsf_kernels *k) {
    if (!k) return &akernels_ref;
    if (!strcmp(k->name, "avx512") || !strncmp(k->name, "amx", 3)) return &akernels_avx512; /* amx: avx512 + tiles */
    if (!strcmp(k->name, "avx2")) return &akernels_avx2;
    return &akernels_ref;
}

const dsf_akernels *akernels_by_name(const char *name) {
    const dsf_kernels *k = kernels_by_name(name); /* NULL unless this CPU runs that ISA */
    return k ? by_matmul_table(k) : NULL;
}

const dsf_akernels *akernels_get(void) {
    static const dsf_akernels *_Atomic t;
    const dsf_akernels *cur = t;
    if (!cur) {
        cur = by_matmul_table(kernels_get()); /* idempotent: a race picks the same table */
        t = cur;
    }
    return cur;
}

/* ---- calls with fallback ---------------------------------------------------------------- */

void ka_attn(const dsf_akernels *k, float *o, const float *q, int64_t nh, int64_t dh, const float *const *keys,
             int64_t nk, float scale, const float *sinks, float *att) {
    (k && k->attn ? k->attn : attn_ref)(o, q, nh, dh, keys, nk, scale, sinks, att);
}

void ka_index(const dsf_akernels *k, float *scores, const float *q, const float *w, const float *ik, int64_t j0,
              int64_t j1, int64_t ih, int64_t id, const uint8_t *cmask, int64_t B) {
    (k && k->index ? k->index : index_ref)(scores, q, w, ik, j0, j1, ih, id, cmask, B);
}

double ka_sumsq(const dsf_akernels *k, const float *x, int64_t n) {
    return (k && k->sumsq ? k->sumsq : sumsq_ref)(x, n);
}

void ka_hc_collapse(const dsf_akernels *k, float *out, const float *X, const float *pre, int64_t hc, int64_t D,
                    int64_t ld) {
    (k && k->hc_collapse ? k->hc_collapse : hc_collapse_ref)(out, X, pre, hc, D, ld);
}

void ka_hc_expand(const dsf_akernels *k, float *Y, const float *fo, const float *R, const float *post,
                  const float *comb, int64_t hc, int64_t D, int64_t ld) {
    (k && k->hc_expand ? k->hc_expand : hc_expand_ref)(Y, fo, R, post, comb, hc, D, ld);
}

void ka_swiglu(const dsf_akernels *k, float *z, const float *g, const float *u, int64_t n, float lim, float wt) {
    (k && k->swiglu ? k->swiglu : swiglu_ref)(z, g, u, n, lim, wt);
}

void ka_add(const dsf_akernels *k, float *a, const float *y, int64_t n) {
    (k && k->add ? k->add : add_ref)(a, y, n);
}

float ka_softmax(const dsf_akernels *k, float *s, int64_t n) {
    return (k && k->softmax ? k->softmax : softmax_ref)(s, n);
}

void ka_qdq_fp8(const dsf_akernels *k, float *x, int64_t n) {
    (k && k->qdq_fp8 ? k->qdq_fp8 : qdq_fp8_e8m0)(x, n);
}

void ka_qdq_fp4(const dsf_akernels *k, float *x, int64_t n) {
    (k && k->qdq_fp4 ? k->qdq_fp4 : qdq_fp4_e8m0)(x, n);
}

void ka_qdq_fp4_e4m3(const dsf_akernels *k, float *x, int64_t n) {
    (k && k->qdq_fp4_e4m3 ? k->qdq_fp4_e4m3 : qdq_fp4_e4m3)(x, n);
}

void ka_unpack_fp8(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    (k && k->unpack_fp8 ? k->unpack_fp8 : unpack_fp8_e8m0)(y, codes, scales, n);
}

void ka_unpack_fp4(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    (k && k->unpack_fp4 ? k->unpack_fp4 : unpack_fp4_e8m0)(y, codes, scales, n);
}

void ka_unpack_fp4_e4m3(const dsf_akernels *k, float *y, const uint8_t *codes, const uint8_t *scales, int64_t n) {
    (k && k->unpack_fp4_e4m3 ? k->unpack_fp4_e4m3 : unpack_fp4_e4m3)(y, codes, scales, n);
}

void ka_rmsnorm(const dsf_akernels *k, float *y, const float *x, const float *w, int64_t n, float eps) {
    (void)k; /* op_rmsnorm rounds exactly as the reference does; no faster order is allowed */
    op_rmsnorm(y, x, w, n, eps);
}
