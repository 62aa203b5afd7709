/* fastgen eval --sweep and --passkey (tools/cmd_eval_sweep.c). */
#ifndef FG_EVAL_SWEEP_H
#define FG_EVAL_SWEEP_H

#include "tools/cli.h"

typedef struct eval_sweep_opts {
    const char *methods; /* comma-separated presets, the driven one first; NULL: the default set */
    const char *budgets; /* comma-separated budgets of the driven method; NULL: the default points */
    const char *dtypes;  /* comma-separated cache dtypes, budgets then in bytes of the --dtype cache; NULL: --dtype */
} eval_sweep_opts;

/* The sweep over prompts[0..n) (keys == NULL), or the passkey task (keys[i]:
 * the number prompt i hides; turns[i], when turns and it are not NULL: a
 * second turn appended after prompt i is prefilled and compressed). -n
 * tokens a prompt: teacher-forced (sweep) or at most that many greedy ones
 * (passkey). Returns the exit code. */
int eval_sweep(const cli_opts *o, const eval_sweep_opts *x, char **prompts, const char **keys, const char **turns,
               int32_t n_prompts);

#endif
