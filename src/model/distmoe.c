/* distmoe.c: the members of a stage combine their experts' outputs in a fixed order (dist.h).
 * Member m owns the experts [e0, e1) of increasing id ranges, so the single process's additions
 * (increasing expert id, then the shared expert) are member 0's, then member 1's on its sum,
 * and so on: each member waits for the previous one's sum, adds its outputs and passes it on;
 * the last adds the shared expert and sends the total back to every member. One message per
 * member and layer, T x n_embd floats each, and the values are bit for bit the single
 * process's.
 * Must not: compute the outputs (moe.c does). */
#include "model/dist.h"
#include "model/forward.h"
#include "base/util.h"

#include <string.h>

/* A comm failure leaves acc as it is: the forward finishes on garbage and dist_forward
 * reports the failure. */
void dist_moe_begin(const fwd *f, float *acc) {
    const dist_plan *d = f->e->dist;
    const size_t n = (size_t)(f->T * f->sh->n_embd) * sizeof(float);
    if (d->member == 0) {
        memset(acc, 0, n);
        return;
    }
    comm_recv(d->rank - 1, COMM_TAG_MOE, acc, n, false, NULL);
}

void dist_moe_end(const fwd *f, float *acc) {
    const dist_plan *d = f->e->dist;
    const size_t n = (size_t)(f->T * f->sh->n_embd) * sizeof(float);
    const int last = d->first[d->stage] + d->members - 1;
    if (d->rank != last) {
        comm_send(d->rank + 1, COMM_TAG_MOE, acc, n, NULL);
        comm_recv(last, COMM_TAG_MOE, acc, n, false, NULL);
        return;
    }
    comm_req r[COMM_MAX_RANKS];
    int nr = 0;
    for (int p = d->first[d->stage]; p < last; p++)
        if (comm_isend(p, COMM_TAG_MOE, acc, n, &r[nr], NULL) == 0) nr++;
    for (int k = 0; k < nr; k++) comm_wait(&r[k], NULL);
}
