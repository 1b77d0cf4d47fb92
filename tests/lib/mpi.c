/* mpi.c: see mpi.h. */
#include "mpi.h"
#include "test.h"

#include <stdio.h>
#include <string.h>

const char *test_mpi_missing(void) {
    static int state = 0; /* 0 unknown, 1 ok, 2 missing */
    static char why[256];
    if (state == 1) return NULL;
    if (state == 2) return why;
    char out[1024], cmd[512];
    state = 2;
    if (test_run("command -v mpirun", NULL, 0) != 0) {
        snprintf(why, sizeof why, "mpirun is not installed (make deps installs openmpi-bin)");
        return why;
    }
    /* a build without MPI refuses --parallel before reading anything */
    snprintf(cmd, sizeof cmd, "%s logits --parallel pipeline 2>&1", test_bin());
    test_run(cmd, out, sizeof out);
    if (strstr(out, "built without MPI")) {
        snprintf(why, sizeof why, "build/dsflash was built without MPI (libopenmpi-dev absent at build time)");
        return why;
    }
    state = 1;
    return NULL;
}

const char *test_mpirun(int np) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0],
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
             "mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none -np %d",
             np);
    return b;
}
