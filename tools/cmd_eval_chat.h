/* fastgen eval --chat (tools/cmd_eval_chat.c). */
#ifndef FG_EVAL_CHAT_H
#define FG_EVAL_CHAT_H

#include "tools/cli.h"

/* Keep against re-profile on the conversations of a file (turns separated
 * by blank lines, conversations by lines of "---"), teacher-forced on the
 * full cache's replies of up to o->n tokens. Returns the exit code. */
/* limit: the first `limit` conversations (0: all). */
int eval_chat(const cli_opts *o, const char *path, int32_t limit);

#endif
