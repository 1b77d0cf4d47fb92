/* progress.h: the progress bar with ETA that the converter and the quantizer draw on stderr
 * while they stream tensor bytes (one helper, so both commands show the same bar).
 *
 * Owns: the bar's state and its drawing. Must not: allocate, or draw when disabled (a
 * disabled bar costs one branch per update).
 * Invariant: done <= total is not required (the bar clamps at 100 %); the line is redrawn
 * at most every 0.2 s, and progress_end() ends it with a newline when it was drawn. */
#ifndef DSF_PROGRESS_H
#define DSF_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool on;             /* draw at all (e.g. stderr is a terminal) */
    uint64_t done, total; /* bytes */
    double t0, last;      /* dsf_now() at start and at the last draw */
} dsf_progress;

/* Starts a bar over total bytes; nothing is drawn when on is false. */
void progress_start(dsf_progress *p, uint64_t total, bool on);
/* Counts n more bytes and redraws if 0.2 s have passed. */
void progress_add(dsf_progress *p, uint64_t n);
/* Draws the final state (ok) or just ends the line (failure). */
void progress_end(dsf_progress *p, bool ok);

#endif
