/* logits_image.h: `dsflash logits --mmproj ... --image ...` (tools/logits_image.c), the image
 * form of the logits command; cmd_logits.c hands over when it sees an image option. */
#ifndef DSF_LOGITS_IMAGE_H
#define DSF_LOGITS_IMAGE_H

#include <stdbool.h>

/* Whether argv holds an option of the image form (--mmproj, --image, --prompt-text). */
bool logits_image_wanted(int argc, char **argv);
/* Runs the image form; returns the exit status (one error line on stderr on failure). */
int logits_image_main(int argc, char **argv);

#endif
