/* Shared pieces of the fastgen CLI: options (tools/args.c), the model session
 * and output (tools/session.c), the commands (tools/cmd_<name>.c). */
#ifndef FG_CLI_H
#define FG_CLI_H

#include <stdio.h>

#include "fastgen.h"
#include "model/llama2c.h"
#include "model/runner.h"
#include "model/tokenizer.h"
#include "tools/escape.h"

/* The groups of common options; each command names those it takes, and
 * cli_parse refuses the others (no option is ever silently ignored). */
enum {
    CLI_MODEL = 1 << 0,   /* -m, -z */
    CLI_PROMPT = 1 << 1,  /* -p, -f */
    CLI_POLICY = 1 << 2,  /* --policy, -T, --budget, --ratio-local, --ratio-frequent */
    CLI_APPEND = 1 << 3,  /* --append */
    CLI_RUN = 1 << 4,     /* --backend, --dtype, -t/--threads, --q8-activations, --f32-activations, --prefill-chunk */
    CLI_STEPS = 1 << 5,   /* -n */
    CLI_SAMPLE = 1 << 6,  /* --temp, --top-p, --seed */
    CLI_JSON = 1 << 7,    /* --json */
    CLI_CSV = 1 << 8,     /* --csv */
    CLI_SVG = 1 << 9,     /* --svg */
    CLI_QUIET = 1 << 10,  /* -q */
    CLI_CTX = 1 << 11,    /* -c, --ctx-size */
};

/* Options shared by generate, profile and eval. */
typedef struct cli_opts {
    const char *model, *tokenizer, *prompt, *policy, *backend, *svg;
    const char *prompt_file; /* -f FILE: the prompt is the whole of FILE (- = standard input) */
    const char *scorer;      /* --scorer FILE: observe=scores' scorer (NULL: MODEL.fgscore if there; "none") */
    char *prompt_text;       /* its text, read by cli_read_prompt (owned) */
    int32_t n;
    int32_t threads;         /* -t N: 0 = the cores this process may run on */
    float threshold, ratio_local, ratio_frequent, temperature, top_p, budget;
    int has_threshold, has_ratio_local, has_ratio_frequent, has_temperature, has_top_p, has_seed, has_prompt;
    uint64_t seed;
    fg_dtype dtype;
    int json, csv, quiet;
    int q8_activations; /* ggml's 8-bit activations for q4_0/q4_1/q5/q8_0 weights (default; --f32-activations: off) */
    int32_t prefill_chunk; /* --prefill-chunk N: prompts in chunks of N tokens (0: at once) */
    int append_mode;       /* --append keep|reprofile: FG_APPEND_*, or -1 for the policy's default */
    int tokenizer_defaulted; /* the tokenizer is tok512.bin beside the model, not one -z named */
    /* llama.cpp's names for the same things */
    int32_t ctx_size;        /* -c N: positions a sequence may hold (0: the model's context) */
    int32_t top_k;           /* --top-k K: sample among the K likeliest (0: all) */
    float repeat_penalty;    /* --repeat-penalty X: llama.cpp's penalty on the last repeat_last_n tokens (1: off) */
    int32_t repeat_last_n;   /* --repeat-last-n N (default 64, -1: the whole context) */
    int has_top_k, has_repeat_penalty, has_repeat_last_n, escape;
    int has_cache_type_k, has_cache_type_v, has_dtype;
    fg_dtype cache_type_k, cache_type_v; /* -ctk, -ctv as given */
    int32_t v_dtype; /* V's storage apart from K's (dtype): an fg_dtype, or -1 (V as K) */
} cli_opts;

typedef struct cli_session {
    fgm_llama_model model;
    fgm_tokenizer tok;
    fgm_runner *runner;
    struct fgm_scorer *scorer; /* the runner's key scorer (cli_open), or NULL */
    char scorer_path[1100];    /* where it came from */
} cli_session;

/* Bad usage: prints "fastgen CMD: reason (try ...)" and returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int cli_parse_int(const char *s, long lo, long hi, int32_t *out);
int cli_parse_float(const char *s, float lo, float hi, float *out);
/* Parses the common options of the groups in `accept` (CLI_*); the others
 * go to `extra` (may be NULL), which returns 0 (taken; *used_val: whether
 * it took the value after it), 1 (bad value) or 2 (not its option). A
 * common option outside `accept` is refused with a line that says so.
 * Returns 0, 2 on bad usage, or -1 after --help (help text printed). */
typedef int (*cli_extra_fn)(void *user, const char *opt, const char *val, int *used_val);
int cli_parse(const char *cmd, const char *help, unsigned accept, int argc, char **argv, cli_opts *o,
              cli_extra_fn extra, void *user);
/* -f FILE: reads the file (or standard input) into o->prompt. 0, or 1 after
 * printing why it could not. */
int cli_read_prompt(const char *cmd, cli_opts *o);
/* The whole of a text file (or standard input for "-"), NUL-terminated
 * (malloc'd; *size: its bytes, may be NULL); NULL after printing why: it
 * cannot be read, or it holds a NUL byte (nothing of a text is dropped). */
char *cli_read_text(const char *cmd, const char *path, size_t *size);
/* Frees what cli_read_prompt read. */
void cli_opts_free(cli_opts *o);
/* Defaults: the model found by cli_find_model, prompt "Once upon a time". */
void cli_defaults(cli_opts *o, int32_t n);
/* The model file scripts/get-models.sh (and so the demo) fetches. */
#define CLI_SMOLLM2_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
/* SmolLM2 in the cache scripts/get-models.sh fills ($FASTGEN_CACHE, else
 * $XDG_CACHE_HOME/fastgen, else ~/.cache/fastgen): 1 and its path if there. */
int cli_cached_smollm2(char *path, size_t size);
/* The default model: $FASTGEN_MODEL (a GGUF or .bin file, or a directory
 * holding stories260K.bin and tok512.bin), else SmolLM2 in the cache, else
 * stories260K in ../shared/models/ or ./models/. Returns where it was found
 * (for a line that says so), or NULL; tokenizer is "" for a GGUF file. */
const char *cli_find_model(char *model, char *tokenizer, size_t size);
/* stories260K.bin + tok512.bin in dir (or dir a .bin with tok512.bin beside it). Returns 1 if found. */
int cli_find_model_in(const char *dir, char *model, char *tokenizer, size_t size);
/* Fills o->model / o->tokenizer from cli_find_model when not given (the
 * tokenizer defaults to tok512.bin beside the model); bad usage (2) when no
 * model is found, else 0. */
int cli_need_model(const char *cmd, cli_opts *o, char *model, char *tok, size_t size);
/* The compression parameters the options describe. */
int cli_compression(const char *cmd, const cli_opts *o, fg_compression_params *cp);
/* V's storage: v_dtype when apart, else dtype. */
fg_dtype cli_v_dtype(const cli_opts *o);
/* The runner's K and V storage, from --dtype / -ctk / -ctv. */
void cli_runner_dtypes(const cli_opts *o, fgm_runner_params *rp);
/* The storage named for people: "K and V q8_0", or "K q8_0, V f16". */
const char *cli_dtype_label(const cli_opts *o, char *buf, size_t size);
/* Bytes of one cached row of K and one of V, head_dim values each. */
size_t cli_kv_pair_bytes(const cli_opts *o, int32_t head_dim);
/* Appends to help (a string of size bytes) the help lines of the common
 * options in the groups accept names. */
void cli_model_help(unsigned accept, char *help, size_t size);
/* The common start of a model command: help text (help_head, the common
 * options it accepts, help_tail), options, the model (found in the default places when not
 * given), the prompt, the compression parameters. Returns 0 to go on, -1
 * after --help, else the exit code. */
int cli_model_command(const char *cmd, const char *help_head, const char *help_tail, unsigned accept,
                      int32_t n_default, int argc, char **argv, cli_opts *o, fg_compression_params *cp, char *model,
                      char *tok, size_t size, cli_extra_fn extra, void *user);
/* Token ids, whitespace-separated, each below vocab (malloc'd); prints why not. */
fg_status cli_read_ids(const char *cmd, const char *path, int32_t vocab, int32_t **ids, int32_t *n);

/* The model and its tokenizer (from the GGUF file, or -z beside a llama2.c
 * checkpoint); cli_open adds the runner. */
fg_status cli_load(const cli_opts *o, cli_session *s, char *err, size_t n);
fg_status cli_open(const cli_opts *o, int32_t max_seqs, int track_recovery, cli_session *s, char *err, size_t n);
void cli_close(cli_session *s);
/* The key scorer of observe=scores on runner r: --scorer's file, else
 * MODEL.fgscore when it exists (none: nothing), loaded once per session. */
/* fastgen-adaptive's observation when the command line named none (cp at
 * FG_OBSERVE_TAIL): observe=scores when the session has a scorer; the
 * choice said once on stderr unless quiet. */
void cli_default_observe(const cli_session *s, fg_compression_params *cp, int quiet);
fg_status cli_attach_scorer(const cli_opts *o, cli_session *s, fgm_runner *r, char *err, size_t n);
/* cli_open for one sequence; prints why it failed. 0, or 1 on failure. */
int cli_open_or_report(const cli_opts *o, int track_recovery, cli_session *s);
/* prompt -> tokens (malloc'd): BOS first when the vocabulary asks for it;
 * control tokens spelled in the prompt ("<|im_start|>") become their ids. */
fg_status cli_encode(const cli_session *s, const char *prompt, int32_t **tokens, int32_t *n);
/* The same for text that continues a sequence (no BOS). */
fg_status cli_encode_more(const cli_session *s, const char *text, int32_t **tokens, int32_t *n);
/* The instruction a reconstruction pass reads before the prompt again (KVzip's, as a ChatML user turn
 * when chat is set, else plain text). */
fg_status cli_reconstruct_prefix(const cli_session *s, int chat, int32_t **tokens, int32_t *n);

void cli_human_bytes(double b, char *buf, size_t n);
/* A prompt's tokens as generate shows them (control tokens such as ChatML's
 * markers decode to nothing); malloc'd, NULL when out of memory. */
char *cli_display_prompt(const cli_session *s, const int32_t *tokens, int32_t n);
/* "<label>1.2 MiB held vs 2.5 MiB full (48.0%; 600 of 1250 rows kept)", every
 * command's one way of saying it, and a note when rows were dropped but no
 * page (of page_tokens rows) was given back. */
void cli_print_kv(const char *label, const fg_memory_stats *m, int32_t page_tokens);

/* Why a runner call failed with st: the runner's message, else the status's name (never ""). */
const char *cli_reason(const fgm_runner *r, fg_status st);
double cli_now(void);
/* The index of the largest of x[0..n) (the first on ties). */
int32_t cli_argmax(const float *x, int32_t n);
/* log sum_i exp(x[i]), in double. */
double cli_logsumexp(const float *x, int32_t n);

/* Subcommands. */
int cmd_generate(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_version(int argc, char **argv);

/* eval's default prompt set: tools/prompts.txt, built in (prompts_data.c, generated by tools/meson.build). */
extern const char cli_default_prompts[];

#endif
