/* mpi.h: running build/dsflash as an MPI job in the tests (tests/e2e/mpi*.c, serve tests).
 * Must not: hold expected values. */
#ifndef DSF_TEST_MPI_H
#define DSF_TEST_MPI_H

#include <stdbool.h>
#include <stddef.h>

/* NULL when this machine can run MPI jobs of build/dsflash (mpirun on PATH, dsflash built
 * with MPI); otherwise why not (the test SKIPs with it). */
const char *test_mpi_missing(void);
/* The command prefix that starts np ranks of what follows on this one machine (static buffer,
 * rotated over 4): root allowed, oversubscribed, shared memory without single-copy (containers
 * often forbid process_vm_readv), ASan's leak check off (MPI's own allocations at exit). */
const char *test_mpirun(int np);

#endif
