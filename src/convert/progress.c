/* progress.c: see progress.h. The line: "[#####     ]  42.0% 1.23/2.90 GB  ETA 00:01:05". */
#include "convert/progress.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>

void progress_start(dsf_progress *p, uint64_t total, bool on) {
    p->on = on;
    p->done = 0;
    p->total = total;
    p->t0 = p->last = dsf_now();
}

static void draw(dsf_progress *p, bool final) {
    double now = dsf_now();
    if (!final && now - p->last < 0.2) return;
    p->last = now;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    double el = now - p->t0, eta = frac > 0 ? el / frac - el : 0;
    char bar[31];
    int nb = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < nb ? '#' : ' ';
    bar[30] = 0;
    double unit = p->total >= 1e9 ? 1e9 : 1e6;
    fprintf(stderr, "\r[%s] %5.1f%% %.2f/%.2f %s  ETA %02d:%02d:%02d ", bar, 100 * frac, (double)p->done / unit,
            (double)p->total / unit, unit == 1e9 ? "GB" : "MB", (int)(eta / 3600), (int)fmod(eta / 60, 60),
            (int)fmod(eta, 60));
    if (final) fprintf(stderr, "\n");
}

void progress_add(dsf_progress *p, uint64_t n) {
    p->done += n;
    if (p->on) draw(p, false);
}

void progress_end(dsf_progress *p, bool ok) {
    if (!p->on) return;
    if (ok) draw(p, true);
    else if (p->total) fprintf(stderr, "\n");
}
