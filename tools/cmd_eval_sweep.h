/* fastgen eval --sweep and --passkey (tools/cmd_eval_sweep.c). */
#ifndef FG_EVAL_SWEEP_H
#define FG_EVAL_SWEEP_H

#include "tools/cli.h"

typedef struct eval_sweep_opts {
    const char *methods; /* comma-separated presets, the driven one first; NULL: the default set */
    const char *budgets; /* comma-separated budgets of the driven method; NULL: the default points */
    const char *dtypes;  /* comma-separated cache dtypes, budgets then in bytes of the --dtype cache; NULL: --dtype */
} eval_sweep_opts;

/* --passkey: one line's questions about its prompt, each the key its
 * answer must hold (several references separated by '|': the share of them
 * it holds scores) and, in the two-turn form, the turn that asks for it
 * (turn[0] NULL: one question, at the end of the prompt). Several turns: the
 * document is prefilled and compressed once, then forked for each. */
#define EVAL_MAX_QUESTIONS 8
typedef struct eval_passkey {
    int32_t n;
    const char *key[EVAL_MAX_QUESTIONS];
    const char *turn[EVAL_MAX_QUESTIONS];
} eval_passkey;

/* The score of one answer: the share of the references of `key` (one, or
 * several separated by '|', each non-empty) that `answer` holds, ASCII
 * letters compared in either case (RULER's string_match_all). */
double eval_answer_score(const char *answer, const char *key);

/* The sweep over prompts[0..n) (passkeys == NULL), or the passkey task
 * (passkeys[i]: prompt i's questions). -n tokens a prompt: teacher-forced
 * (sweep) or at most that many greedy ones a question (passkey). Returns the
 * exit code. */
int eval_sweep(const cli_opts *o, const eval_sweep_opts *x, char **prompts, const eval_passkey *passkeys,
               int32_t n_prompts);

#endif
