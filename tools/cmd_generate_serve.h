/* fastgen generate --chat / --samples (tools/cmd_generate_serve.c). */
#ifndef FG_SERVE_H
#define FG_SERVE_H

#include "tools/cli.h"

/* Whether the vocabulary has ChatML's two control tokens. */
int serve_chatml(const cli_session *s);
/* The tokens of a user turn (ChatML markup when chatml; the first turn
 * opens the conversation) at toks[0..*n). */
fg_status serve_turn_tokens(const cli_session *s, int chatml, int first, const char *user, int32_t *toks, int32_t cap,
                            int32_t *n);
/* Splits text in place into turns (paragraphs separated by blank lines,
 * each made one line); turns must hold strlen(text) / 2 + 1. Returns the count. */
int32_t serve_split_turns(char *text, char **turns);
/* User turns from a file (blank-line separated), each appended to one
 * sequence and answered by the model (up to o->n tokens). observe_named:
 * --observe was given (else the model's scorer is fastgen-adaptive's
 * default, cli_default_observe). */
int serve_chat(const cli_opts *o, const fg_compression_params *cp, int observe_named, const char *path);
/* k samples forked from one prefilled prompt, decoded in one batch. */
int serve_samples(const cli_opts *o, const fg_compression_params *cp, int observe_named, int32_t k);

#endif
