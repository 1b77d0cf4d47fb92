/* outfile.h: the OUT.tmp-then-rename protocol of the commands that write a model file
 * (`convert`, `quantize`): the file is written as OUT.tmp and renamed to OUT only when
 * complete; on any error, and on SIGINT/SIGTERM/SIGHUP, OUT.tmp is removed, so no file
 * ever appears under the target name unless it is complete, and OUT is untouched on failure. */
#ifndef DSF_OUTFILE_H
#define DSF_OUTFILE_H

/* Sets up OUT.tmp for out and installs the signal handlers. Returns the .tmp path (static
 * storage), or NULL if the path is too long. */
const char *outfile_begin(const char *out);
/* Ends the protocol: rc == 0 renames OUT.tmp to OUT (a failed rename becomes rc -1 with the
 * reason in err); otherwise OUT.tmp is removed. Returns the final rc. */
int outfile_end(int rc, char *err);

#endif
