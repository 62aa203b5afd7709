/* fastgen generate --chat / --samples (tools/serve.c). */
#ifndef FG_SERVE_H
#define FG_SERVE_H

#include "tools/cli.h"

/* User turns from a file (blank-line separated), each appended to one
 * sequence and answered by the model (up to o->n tokens). */
int serve_chat(const cli_opts *o, const fg_compression_params *cp, const char *path);
/* k samples forked from one prefilled prompt, decoded in one batch. */
int serve_samples(const cli_opts *o, const fg_compression_params *cp, int32_t k);

#endif
