/* fuzz_safetensors.c: libFuzzer harness for the safetensors reader (src/io/safetensors.c).
 *
 * Byte 0 picks the mode:
 *   even: the rest is a whole .safetensors file (u64 header length, JSON header, data),
 *         opened with st_open_file from a memfd;
 *   odd:  the rest is model.safetensors.index.json in a scratch folder that also holds two
 *         valid shards (s1.safetensors: a F32[2], b BF16[1,3]; s2.safetensors: c U8[4]),
 *         opened with st_open_dir.
 * When the checkpoint is accepted, every promise of safetensors.h is checked: names are found
 * by st_find, nbytes = nelem * dtype size, shapes multiply to nelem, the first and last bytes
 * of each tensor can be read, and a read past a tensor's end is refused with an error. */
#include "fuzz_common.h"
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void fz_st_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    FZ_REQUIRE(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

/* Writes a one-file checkpoint with the given header JSON and data bytes. */
static void fz_st_shard(const char *path, const char *json, const uint8_t *data, size_t n) {
    size_t hl = strlen(json);
    dsf_buf b = {0};
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    dsf_buf_append(&b, len8, 8);
    dsf_buf_append(&b, json, hl);
    dsf_buf_append(&b, data, n);
    fz_st_write(path, b.data, b.len);
    dsf_buf_free(&b);
}

/* The scratch folder with the two shards (created once per process). */
static const char *fz_st_dir(void) {
    static char dir[4096];
    if (dir[0]) return dir;
#ifdef FUZZ_NO_MAIN /* in the test suite: the runner's temporary folder */
    snprintf(dir, sizeof dir, "%s/fuzz-st", test_tmpdir());
    FZ_REQUIRE(mkdir(dir, 0700) == 0 || errno == EEXIST, "cannot create %s", dir);
#else
    snprintf(dir, sizeof dir, "/tmp/dsf-fuzz-st-XXXXXX");
    FZ_REQUIRE(mkdtemp(dir) != NULL, "mkdtemp failed");
#endif
    char p[4200];
    static const uint8_t d1[14] = {0, 0, 128, 63, 0, 0, 0, 64, 1, 2, 3, 4, 5, 6};
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    fz_st_shard(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]},"
                   "\"__metadata__\":{\"format\":\"pt\"}}", d1, sizeof d1);
    static const uint8_t d2[4] = {9, 8, 7, 6};
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    fz_st_shard(p, "{\"c\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", d2, sizeof d2);
    return dir;
}

static void fz_st_check(const st_checkpoint *c) {
    char err[DSF_ERR_LEN];
    int n = st_count(c);
    FZ_REQUIRE(n >= 0, "negative count");
    FZ_REQUIRE(st_at(c, -1) == NULL && st_at(c, n) == NULL, "st_at out of range returned a tensor");
    uint8_t buf[16];
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_at(c, i);
        FZ_REQUIRE(t && t->name && st_find(c, t->name) == t, "tensor %d not found by its name", i);
        FZ_REQUIRE(t->dtype >= 0 && t->dtype < ST_DTYPE_COUNT, "dtype %d", t->dtype);
        FZ_REQUIRE(t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS, "n_dims %d", t->n_dims);
        uint64_t nel = 1;
        for (int d = 0; d < t->n_dims; d++) {
            FZ_REQUIRE(t->shape[d] >= 0, "negative dim");
            nel *= (uint64_t)t->shape[d]; /* checked for overflow by the reader */
        }
        FZ_REQUIRE(nel == t->nelem, "shape product %llu != nelem %llu", (unsigned long long)nel,
                   (unsigned long long)t->nelem);
        FZ_REQUIRE(t->nbytes == t->nelem * st_dtype_size(t->dtype), "nbytes != nelem * dtype size");
        uint64_t k = t->nbytes < sizeof buf ? t->nbytes : sizeof buf;
        FZ_REQUIRE(st_read(c, t, 0, k, buf, err) == 0, "reading the first bytes of '%s' failed: %s", t->name, err);
        FZ_REQUIRE(st_read(c, t, t->nbytes - k, k, buf, err) == 0, "reading the last bytes failed: %s", err);
        FZ_REQUIRE(st_read(c, t, t->nbytes, 1, buf, err) != 0, "a read past the end of '%s' succeeded", t->name);
        fz_check_err(err, "st_read");
        FZ_REQUIRE(st_read(c, t, UINT64_MAX, 2, buf, err) != 0, "an overflowing read succeeded");
        st_release(c, t, 0, t->nbytes);
    }
    FZ_REQUIRE(st_find(c, "") == NULL, "found a tensor with an empty name");
}

static int fz_safetensors_one(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    uint8_t mode = fz_u8(&in);
    char err[DSF_ERR_LEN] = "";
    st_checkpoint *c;
    if (mode & 1) {
        const char *dir = fz_st_dir();
        char p[4200];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        fz_st_write(p, in.p, in.n);
        c = st_open_dir(dir, err);
        if (c) {
            /* A valid index over these shards names exactly a, b, c. */
            FZ_REQUIRE(st_count(c) >= 1 && st_count(c) <= 3, "index opened with %d tensors", st_count(c));
        }
    } else {
        int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
        FZ_REQUIRE(fd >= 0, "memfd_create failed");
        FZ_REQUIRE(in.n == 0 || write(fd, in.p, in.n) == (ssize_t)in.n, "memfd write failed");
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        c = st_open_file(p, err);
        close(fd); /* the reader has its own descriptor */
    }
    if (!c) {
        fz_check_err(err, "st_open");
        return 0;
    }
    fz_st_check(c);
    st_close(c);
    return 1;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_safetensors_one(data, size);
    return 0;
}
#endif
