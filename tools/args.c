/* The CLI's options: parsing, defaults, the model found, the compression they describe. */
#include "tools/cli.h"

#include "model/gguf.h"
#include "model/io.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fastgen %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (try `fastgen %s --help`)\n", cmd);
    va_end(ap);
    return 2;
}

/* Numbers are taken whole: strtol and strtof would skip leading spaces. */
int cli_parse_int(const char *s, long lo, long hi, int32_t *out) {
    char *end;
    if (!*s || isspace((unsigned char)*s))
        return 0;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return 0;
    *out = (int32_t)v;
    return 1;
}

int cli_parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    if (!*s || isspace((unsigned char)*s))
        return 0;
    float v = strtof(s, &end);
    if (*end || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int cli_find_model_in(const char *dir, char *model, char *tokenizer, size_t size) {
    if (!dir || !*dir)
        return 0;
    size_t len = strlen(dir);
    if (file_exists(dir) && fgm_gguf_is_gguf(dir)) { /* a GGUF file carries its tokenizer */
        snprintf(model, size, "%s", dir);
        tokenizer[0] = '\0';
        return 1;
    }
    if (len > 4 && strcmp(dir + len - 4, ".bin") == 0 && file_exists(dir)) {
        /* a model file: the tokenizer sits beside it */
        snprintf(model, size, "%s", dir);
        const char *slash = strrchr(dir, '/');
        snprintf(tokenizer, size, "%.*stok512.bin", slash ? (int)(slash - dir + 1) : 0, dir);
    } else {
        snprintf(model, size, "%s/stories260K.bin", dir);
        snprintf(tokenizer, size, "%s/tok512.bin", dir);
    }
    return file_exists(model) && file_exists(tokenizer);
}

int cli_cached_smollm2(char *path, size_t size) {
    const char *cache = getenv("FASTGEN_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && cache[0])
        snprintf(path, size, "%s/" CLI_SMOLLM2_FILE, cache);
    else if (xdg && xdg[0])
        snprintf(path, size, "%s/fastgen/" CLI_SMOLLM2_FILE, xdg);
    else if (home && home[0])
        snprintf(path, size, "%s/.cache/fastgen/" CLI_SMOLLM2_FILE, home);
    else
        return 0;
    return file_exists(path);
}

const char *cli_find_model(char *model, char *tokenizer, size_t size) {
    if (cli_find_model_in(getenv("FASTGEN_MODEL"), model, tokenizer, size))
        return "$FASTGEN_MODEL";
    if (cli_cached_smollm2(model, size)) {
        tokenizer[0] = '\0';
        return "the cache scripts/get-models.sh and the demo fill";
    }
    const char *dirs[] = {"../shared/models", "models", "../../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (cli_find_model_in(dirs[i], model, tokenizer, size))
            return "the test models' folder";
    return NULL;
}

void cli_defaults(cli_opts *o, int32_t n) {
    memset(o, 0, sizeof *o);
    o->prompt = "Once upon a time";
    o->policy = "fastgen";
    o->n = n;
    o->threshold = 0.95f;
    o->top_p = 0.9f;
    o->seed = 1;
    o->dtype = FG_DTYPE_F16; /* llama.cpp's cache type too */
    o->v_dtype = -1;
    o->q8_activations = 1;   /* ggml's 8-bit activations on q4_0 / q4_1 / q5 / q8_0 weights */
    o->append_mode = -1;
    o->repeat_penalty = 1.0f;
    o->repeat_last_n = 64; /* llama.cpp's */
}

static int match(const char *a, const char *s, const char *l) { return (s && !strcmp(a, s)) || !strcmp(a, l); }

/* The group of a common option, or 0 when it is not one. */
static unsigned group_of(const char *a) {
    static const struct {
        const char *name;
        unsigned group;
    } k[] = {
        {"-m", CLI_MODEL}, {"--model", CLI_MODEL}, {"-z", CLI_MODEL}, {"--tokenizer", CLI_MODEL},
        {"-p", CLI_PROMPT}, {"--prompt", CLI_PROMPT}, {"-f", CLI_PROMPT}, {"--file", CLI_PROMPT},
        {"--policy", CLI_POLICY}, {"-T", CLI_POLICY}, {"--budget", CLI_POLICY}, {"--ratio-local", CLI_POLICY},
        {"--ratio-frequent", CLI_POLICY}, {"--append", CLI_APPEND},
        {"--backend", CLI_RUN}, {"--dtype", CLI_RUN}, {"-t", CLI_RUN}, {"--threads", CLI_RUN},
        {"--q8-activations", CLI_RUN}, {"--f32-activations", CLI_RUN}, {"--prefill-chunk", CLI_RUN},
        {"--scorer", CLI_RUN}, {"-n", CLI_STEPS}, {"--steps", CLI_STEPS},
        {"--temp", CLI_SAMPLE}, {"--temperature", CLI_SAMPLE}, {"--top-p", CLI_SAMPLE}, {"--seed", CLI_SAMPLE},
        {"--json", CLI_JSON}, {"--csv", CLI_CSV}, {"--svg", CLI_SVG}, {"-q", CLI_QUIET}, {"--quiet", CLI_QUIET},
        /* llama.cpp's names */
        {"-c", CLI_CTX}, {"--ctx-size", CLI_CTX}, {"-s", CLI_SAMPLE}, {"--top-k", CLI_SAMPLE},
        {"--repeat-penalty", CLI_SAMPLE}, {"--repeat-last-n", CLI_SAMPLE}, {"--n-predict", CLI_STEPS},
        {"-e", CLI_PROMPT}, {"--escape", CLI_PROMPT}, {"-ctk", CLI_RUN}, {"--cache-type-k", CLI_RUN},
        {"-ctv", CLI_RUN}, {"--cache-type-v", CLI_RUN},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(a, k[i].name))
            return k[i].group;
    return 0;
}

/* llama.cpp's options fastgen has no counterpart for: refused, naming what to use instead. */
static const char *llama_only(const char *a) {
    static const struct {
        const char *name, *why;
    } k[] = {
        {"-cnv", "llama-cli's interactive chat: `fastgen generate --chat FILE` answers the turns of a file in one "
                 "sequence"},
        {"--conversation", "llama-cli's interactive chat: `fastgen generate --chat FILE` answers the turns of a "
                           "file in one sequence"},
        {"-i", "interactive mode: `fastgen generate --chat FILE` answers the turns of a file"},
        {"-ngl", "fastgen's GPU backends run the attention only (--backend cuda|hip); the model runs on the CPU"},
        {"--n-gpu-layers", "fastgen's GPU backends run the attention only (--backend cuda|hip); the model runs on "
                           "the CPU"},
        {"-fa", "fastgen's attention is always one fused pass over the kept rows: there is nothing to turn on"},
        {"--flash-attn", "fastgen's attention is always one fused pass over the kept rows: there is nothing to "
                         "turn on"},
        {"-b", "--prefill-chunk N sends the prompt N tokens at a time"},
        {"--batch-size", "--prefill-chunk N sends the prompt N tokens at a time"},
        {"-ub", "--prefill-chunk N sends the prompt N tokens at a time"},
        {"--ubatch-size", "--prefill-chunk N sends the prompt N tokens at a time"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(a, k[i].name))
            return k[i].why;
    return NULL;
}

/* -e: llama.cpp's escapes in a prompt (\n \r \t \' \" \\), in place. */
static void unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] && strchr("nrt'\"\\", r[1])) {
            r++;
            *w++ = *r == 'n' ? '\n' : *r == 'r' ? '\r' : *r == 't' ? '\t' : *r;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* The prompt with -e's escapes processed: 0, or 1 when out of memory. */
static int escape_prompt(cli_opts *o) {
    if (!o->escape || !o->prompt)
        return 0;
    if (!o->prompt_text) { /* -p's text: a copy of our own */
        const size_t n = strlen(o->prompt) + 1;
        if (!(o->prompt_text = malloc(n)))
            return 1;
        memcpy(o->prompt_text, o->prompt, n);
        o->prompt = o->prompt_text;
    }
    unescape(o->prompt_text);
    return 0;
}

int cli_parse(const char *cmd, const char *help, unsigned accept, int argc, char **argv, cli_opts *o,
              cli_extra_fn extra, void *user) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (match(a, "-h", "--help")) {
            fputs(help, stdout);
            return -1;
        }
        const char *instead = llama_only(a);
        if (instead)
            return cli_usage(cmd, "%s (llama.cpp) has no fastgen counterpart: %s", a, instead);
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        const unsigned group = group_of(a);
        if (group && !(group & accept)) {
            /* the command's own option of that name comes first (demo's --prompt N) */
            int used = 1, r = extra ? extra(user, a, val, &used) : 2;
            if (r == 2)
                return cli_usage(cmd, "%s is not an option of %s", a, cmd);
            if (r == 1 || (used && !val))
                return val ? cli_usage(cmd, "bad value for %s: %s", a, val) : cli_usage(cmd, "%s needs a value", a);
            i += used;
            continue;
        }
        /* flags without a value */
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--csv")) {
            o->csv = 1;
            continue;
        }
        if (!strcmp(a, "--q8-activations") || !strcmp(a, "--f32-activations")) {
            o->q8_activations = a[2] == 'q';
            continue;
        }
        if (match(a, "-q", "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (match(a, "-e", "--escape")) {
            o->escape = 1;
            continue;
        }
        int ok = 1, used = 1;
        if (match(a, "-m", "--model"))
            o->model = val;
        else if (match(a, "-z", "--tokenizer"))
            o->tokenizer = val;
        else if (match(a, "-p", "--prompt")) {
            ok = !o->prompt_file;
            o->prompt = val;
            o->has_prompt = 1;
        } else if (match(a, "-f", "--file")) {
            ok = !o->has_prompt;
            o->prompt_file = val;
        } else if (!strcmp(a, "--prefill-chunk"))
            ok = val && cli_parse_int(val, 1, 1 << 20, &o->prefill_chunk);
        else if (!strcmp(a, "--scorer"))
            ok = (o->scorer = val) != NULL;
        else if (match(a, "-n", "--steps"))
            ok = val && cli_parse_int(val, 0, 1 << 20, &o->n);
        else if (!strcmp(a, "--n-predict")) { /* llama.cpp's -1: until the context is full */
            if (val && !strcmp(val, "-1") && strcmp(cmd, "generate"))
                return cli_usage(cmd, "--n-predict -1 (until the context is full) is generate's: give a number of "
                                      "tokens");
            ok = val && (!strcmp(val, "-1") || cli_parse_int(val, 0, 1 << 20, &o->n));
            if (ok && !strcmp(val, "-1"))
                o->n = 1 << 20;
        } else if (match(a, "-c", "--ctx-size"))
            ok = val && cli_parse_int(val, 0, 1 << 24, &o->ctx_size);
        else if (!strcmp(a, "--top-k")) {
            ok = val && cli_parse_int(val, 0, 1 << 30, &o->top_k);
            o->has_top_k = 1;
        } else if (!strcmp(a, "--repeat-penalty")) {
            ok = val && cli_parse_float(val, 0.0f, 100.0f, &o->repeat_penalty) && o->repeat_penalty > 0.0f;
            o->has_repeat_penalty = 1;
        } else if (!strcmp(a, "--repeat-last-n")) {
            ok = val && (!strcmp(val, "-1") ? (o->repeat_last_n = -1, 1) : cli_parse_int(val, 0, 1 << 24,
                                                                                           &o->repeat_last_n));
            o->has_repeat_last_n = 1;
        }
        else if (match(a, "-ctk", "--cache-type-k")) {
            ok = val && fg_dtype_parse(val, &o->cache_type_k) == FG_OK;
            o->has_cache_type_k = 1;
        } else if (match(a, "-ctv", "--cache-type-v")) {
            ok = val && fg_dtype_parse(val, &o->cache_type_v) == FG_OK;
            o->has_cache_type_v = 1;
        }
        else if (match(a, "-t", "--threads"))
            ok = val && cli_parse_int(val, 1, FG_MAX_THREADS, &o->threads);
        else if (!strcmp(a, "--policy"))
            o->policy = val;
        else if (!strcmp(a, "--append")) {
            ok = val && (!strcmp(val, "keep") || !strcmp(val, "reprofile"));
            o->append_mode = ok && !strcmp(val, "reprofile") ? FG_APPEND_REPROFILE : FG_APPEND_KEEP;
        } else if (!strcmp(a, "-T")) {
            ok = val && cli_parse_float(val, 0.0f, 1.0f, &o->threshold) && o->threshold > 0.0f;
            o->has_threshold = 1;
        } else if (!strcmp(a, "--ratio-local")) {
            ok = val && cli_parse_float(val, 0.0f, 1.0f, &o->ratio_local);
            o->has_ratio_local = 1;
        } else if (!strcmp(a, "--ratio-frequent")) {
            ok = val && cli_parse_float(val, 0.0f, 1.0f, &o->ratio_frequent);
            o->has_ratio_frequent = 1;
        } else if (!strcmp(a, "--budget"))
            ok = val && cli_parse_float(val, 0.0f, 1.0f, &o->budget) && o->budget > 0.0f;
        else if (!strcmp(a, "--backend"))
            o->backend = val;
        else if (!strcmp(a, "--svg"))
            o->svg = val;
        else if (match(a, "--temp", "--temperature")) {
            ok = val && cli_parse_float(val, 0.0f, 100.0f, &o->temperature);
            o->has_temperature = 1;
        } else if (!strcmp(a, "--top-p")) {
            ok = val && cli_parse_float(val, 0.0f, 1.0f, &o->top_p) && o->top_p > 0.0f;
            o->has_top_p = 1;
        } else if (match(a, "-s", "--seed")) {
            int32_t s = 0;
            ok = val && cli_parse_int(val, 0, 2147483647, &s);
            o->seed = (uint64_t)s;
            o->has_seed = 1;
        } else if (!strcmp(a, "--dtype")) {
            ok = val && fg_dtype_parse(val, &o->dtype) == FG_OK;
            o->has_dtype = 1;
        } else if (extra) {
            int r = extra(user, a, val, &used);
            if (r == 2)
                return cli_usage(cmd, "unknown option %s", a);
            ok = r == 0;
        } else {
            return cli_usage(cmd, "unknown option %s", a);
        }
        if (ok == 0 && val && (match(a, "-p", "--prompt") || match(a, "-f", "--file")))
            return cli_usage(cmd, "-p and -f both give the prompt: pass one");
        if (!ok || (used && !val))
            return val ? cli_usage(cmd, "bad value for %s: %s", a, val) : cli_usage(cmd, "%s needs a value", a);
        i += used;
    }
    if (o->json && o->csv)
        return cli_usage(cmd, "--json and --csv are two formats of the same results: pass one");
    if (o->has_repeat_last_n && !o->has_repeat_penalty)
        return cli_usage(cmd, "--repeat-last-n sets the window of --repeat-penalty, which is off without it");
    /* -ctk / -ctv: K and V one at a time, as llama.cpp (the other stays f16, or --dtype's) */
    if (o->has_cache_type_k || o->has_cache_type_v) {
        const fg_dtype k = o->has_cache_type_k ? o->cache_type_k : o->dtype;
        const fg_dtype v = o->has_cache_type_v ? o->cache_type_v : o->dtype;
        if (o->has_dtype && (k != o->dtype || v != o->dtype))
            return cli_usage(cmd, "--dtype %s stores K and V alike, -ctk / -ctv set them one at a time: pass one or "
                                  "the other", fg_dtype_name(o->dtype));
        o->dtype = k;
        o->v_dtype = v != k ? (int32_t)v : -1; /* the backends that cannot, the library refuses */
    }
    if (escape_prompt(o))
        return cli_usage(cmd, "out of memory");
    return 0;
}

char *cli_read_text(const char *cmd, const char *path, size_t *size_out) {
    void *buf;
    size_t size;
    char err[512];
    if (fgm_read_file(path, &buf, &size, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen %s: %s\n", cmd, err);
        return NULL;
    }
    char *text = realloc(buf, size + 1);
    if (!text) {
        free(buf);
        fprintf(stderr, "fastgen %s: out of memory reading %s\n", cmd, path);
        return NULL;
    }
    text[size] = '\0';
    const size_t nul = strlen(text);
    if (nul != size) {
        free(text);
        fprintf(stderr, "fastgen %s: %s holds a NUL byte (at byte %zu of %zu): a text file is expected\n", cmd, path,
                nul, size);
        return NULL;
    }
    if (size_out)
        *size_out = size;
    return text;
}

int cli_read_prompt(const char *cmd, cli_opts *o) {
    if (!o->prompt_file)
        return 0;
    char *text = cli_read_text(cmd, o->prompt_file, NULL);
    if (!text)
        return 1;
    free(o->prompt_text);
    o->prompt_text = text;
    o->prompt = text;
    o->has_prompt = 1;
    if (o->escape)
        unescape(text);
    return 0;
}

void cli_opts_free(cli_opts *o) {
    free(o->prompt_text);
    o->prompt_text = NULL;
}

int cli_need_model(const char *cmd, cli_opts *o, char *model, char *tok, size_t size) {
    const char *where = NULL;
    if (!o->model && (where = cli_find_model(model, tok, size))) {
        o->model = model;
        if (!o->tokenizer && tok[0]) {
            o->tokenizer = tok;
            o->tokenizer_defaulted = 1;
        }
        if (!o->quiet) /* the file it took, and why */
            fprintf(stderr, "fastgen %s: model %s (from %s; -m FILE for another)\n", cmd, model, where);
    }
    if (!o->model)
        return cli_usage(cmd, "no model found: pass -m MODEL.gguf, or -m MODEL -z TOKENIZER for llama2.c "
                              "(bash scripts/get-models.sh fetches SmolLM2-135M-Instruct into the cache, where "
                              "every command looks after $FASTGEN_MODEL)");
    if (fgm_gguf_is_gguf(o->model)) {
        if (o->tokenizer)
            return cli_usage(cmd, "-z: %s is a GGUF file, which carries its own tokenizer", o->model);
        return 0;
    }
    if (!o->tokenizer) {
        const char *slash = strrchr(o->model, '/');
        snprintf(tok, size, "%.*stok512.bin", slash ? (int)(slash - o->model + 1) : 0, o->model);
        o->tokenizer = tok;
        o->tokenizer_defaulted = 1;
    }
    return 0;
}

int cli_compression(const char *cmd, const cli_opts *o, fg_compression_params *cp) {
    /* --budget: FastGen's budget mode (its finer shortlist) unless another policy is named */
    const char *policy = o->budget > 0.0f && !strcmp(o->policy, "fastgen") ? "fastgen-budget" : o->policy;
    if (fg_compression_params_preset(policy, cp) != FG_OK)
        return cli_usage(cmd, "%s", fg_last_error(NULL)); /* the name, and the presets the library knows */
    if (o->budget > 0.0f) {
        if (strcmp(policy, "fastgen-budget") && strcmp(policy, "fastgen-adaptive"))
            return cli_usage(cmd, "--budget applies to FastGen's budget modes (--policy fastgen-adaptive, fastgen or "
                                  "fastgen-budget), not %s", policy);
        cp->budget = o->budget;
    }
    /* T picks a shortlist entry by recovery; a one-policy preset, a shared budget or the adaptive mode picks
       none that way */
    const int by_recovery = cp->n_policies > 1 && cp->budget <= 0.0f && cp->budget_tokens <= 0 &&
                            cp->allocation == FG_ALLOC_SHORTLIST;
    if (o->has_threshold && !by_recovery)
        return cli_usage(cmd, "-T picks a shortlist entry by its recovery, and %s does not choose that way (%s)",
                         policy, cp->n_policies == 1 ? "one policy for every head" : "a budget shared by the heads");
    int has_local = 0, has_frequent = 0; /* the components a ratio sizes, in an entry that does not keep all */
    for (int32_t e = 0; e < cp->n_policies; e++) {
        const uint32_t c = cp->shortlist[e].components;
        has_local |= !(c & FG_KEEP_FULL) && (c & FG_KEEP_LOCAL);
        has_frequent |= !(c & FG_KEEP_FULL) && (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT));
    }
    if (o->has_ratio_local && !has_local)
        return cli_usage(cmd, "--ratio-local sizes a local window, and %s has none", policy);
    if (o->has_ratio_frequent && !has_frequent)
        return cli_usage(cmd, "--ratio-frequent sizes the heavy hitters, and %s keeps none", policy);
    if (o->has_threshold)
        cp->threshold = o->threshold;
    if (o->append_mode >= 0) {
        if (o->append_mode == FG_APPEND_REPROFILE && cp->budget > 0.0f)
            return cli_usage(cmd, "--append reprofile does not go with budget mode (%s)", policy);
        cp->append_mode = (fg_append_mode)o->append_mode;
    }
    for (int32_t e = 0; e < cp->n_policies; e++) {
        if (o->has_ratio_local)
            cp->shortlist[e].ratio_local = o->ratio_local;
        if (o->has_ratio_frequent)
            cp->shortlist[e].ratio_frequent = o->ratio_frequent;
    }
    return 0;
}

fg_dtype cli_v_dtype(const cli_opts *o) { return o->v_dtype >= 0 ? (fg_dtype)o->v_dtype : o->dtype; }

void cli_runner_dtypes(const cli_opts *o, fgm_runner_params *rp) {
    rp->kv_dtype = o->dtype;
    rp->v_apart = o->v_dtype >= 0;
    rp->v_dtype = cli_v_dtype(o);
}

const char *cli_dtype_label(const cli_opts *o, char *buf, size_t size) {
    if (o->v_dtype < 0)
        snprintf(buf, size, "K and V %s", fg_dtype_name(o->dtype));
    else
        snprintf(buf, size, "K %s, V %s", fg_dtype_name(o->dtype), fg_dtype_name(cli_v_dtype(o)));
    return buf;
}

size_t cli_kv_pair_bytes(const cli_opts *o, int32_t head_dim) {
    return fg_kv_row_bytes(o->dtype, head_dim) + fg_kv_row_bytes(cli_v_dtype(o), head_dim);
}

/* The help lines of the options every model command may take, each under its group. */
static const struct {
    unsigned group;
    const char *text;
} k_model_help[] = {
    {CLI_MODEL,
     "  -m, --model FILE        GGUF file or llama2.c checkpoint (default: $FASTGEN_MODEL, else SmolLM2 in\n"
     "                          the cache the demo fills, else stories260K.bin in ../shared/models/ or\n"
     "                          ./models/; a line on stderr names the file taken)\n"},
    {CLI_MODEL,
     "  -z, --tokenizer FILE    llama2.c tokenizer (default: tok512.bin beside the model; GGUF files carry theirs)\n"},
    {CLI_PROMPT,
     "  -p, --prompt TEXT       prompt (default \"Once upon a time\")\n"},
    {CLI_POLICY,
     "  --policy NAME           fastgen | fastgen-budget | fastgen-adaptive | full | streamingllm | h2o |\n"
     "                          local | frequent | snapkv | adakv | tova (default: generate fastgen-adaptive at\n"
     "                          half the cache, profile fastgen, the paper's threshold mode)\n"},
    {CLI_POLICY,
     "  -T X                    recovery threshold in (0, 1] (default 0.95)\n"},
    {CLI_POLICY,
     "  --budget B              keep at most B of the full cache's rows, in (0, 1]: fastgen-adaptive's budget\n"
     "                          (0.5 by default), or the paper's mode in budget mode (--policy fastgen)\n"},
    {CLI_POLICY,
     "  --ratio-local R         local window ratio of every policy (default 0.3)\n"},
    {CLI_POLICY,
     "  --ratio-frequent R      frequent budget ratio of every policy (default 0.3)\n"},
    {CLI_PROMPT,
     "  -f, --file FILE         the prompt is the whole of FILE (- for standard input)\n"},
    {CLI_RUN,
     "  --backend NAME          ref | cpu | cuda | hip (default cpu)\n"},
    {CLI_RUN,
     "  --dtype NAME            f32 | f16 | bf16 | q8_0 | q4_0 KV cache storage (default f16; K and V alike)\n"
     "  -ctk, --cache-type-k T  K's storage alone, and -ctv/--cache-type-v V's, as llama.cpp (the other\n"
     "                          stays f16, or --dtype's; backends ref and cpu)\n"},
    {CLI_RUN,
     "  -t, --threads N         CPU threads (default: the cores this process may run on)\n"},
    {CLI_RUN,
     "  --q8-activations        q4_0 / q4_1 / q5_0 / q5_1 / q8_0 weights: activations quantized to 8 bits and integer\n"
     "                          dot products, ggml's q8_0 / q8_1 scheme (the default)\n"},
    {CLI_RUN,
     "  --f32-activations       f32 activations against the dequantized weights instead\n"},
    {CLI_RUN,
     "  --prefill-chunk N       the prompt through the model N tokens at a time (fg_prefill_chunk), profiled\n"
     "                          over the whole prompt at its last chunk\n"},
    {CLI_RUN,
     "  --scorer FILE           the key scorer of observe=scores (fastgen calibrate); default MODEL.fgscore\n"
     "                          when that file exists, \"none\" for no scorer\n"},
    {CLI_QUIET,
     "  -q, --quiet             no progress line for the prompt (none either when stderr is not a terminal)\n"},
};

void cli_model_help(unsigned accept, char *help, size_t size) {
    size_t at = strlen(help);
    for (size_t i = 0; i < sizeof k_model_help / sizeof k_model_help[0] && at < size; i++)
        if (k_model_help[i].group & accept)
            at += (size_t)snprintf(help + at, size - at, "%s", k_model_help[i].text);
}

/* The common start of a model command: help text, options, the model (found
 * in the default places when not given), the compression parameters.
 * Returns 0 to go on, else the exit code (0 after --help). */
int cli_model_command(const char *cmd, const char *help_head, const char *help_tail, unsigned accept,
                         int32_t n_default, int argc, char **argv, cli_opts *o, fg_compression_params *cp, char *model,
                         char *tok, size_t size, cli_extra_fn extra, void *user) {
    char help[4096];
    snprintf(help, sizeof help, "%s", help_head);
    cli_model_help(accept, help, sizeof help);
    snprintf(help + strlen(help), sizeof help - strlen(help), "%s", help_tail);
    cli_defaults(o, n_default);
    /* generate runs the method the README leads with (docs/design.md §4 says why); profile shows the
       paper's per-head choice */
    if (!strcmp(cmd, "generate"))
        o->policy = "fastgen-adaptive";
    int rc = cli_parse(cmd, help, accept, argc, argv, o, extra, user);
    if (rc)
        return rc < 0 ? -1 : rc;
    if ((rc = cli_need_model(cmd, o, model, tok, size)))
        return rc;
    if ((rc = cli_read_prompt(cmd, o)))
        return rc;
    return cli_compression(cmd, o, cp);
}

/* Token ids, whitespace-separated, each below vocab (malloc'd). */
fg_status cli_read_ids(const char *cmd, const char *path, int32_t vocab, int32_t **ids, int32_t *n) {
    FILE *f = fopen(path, "r");
    int32_t cap = 1024;
    *n = 0;
    *ids = malloc((size_t)cap * sizeof **ids);
    fg_status st = f && *ids ? FG_OK : FG_ERR_INVALID_ARGUMENT;
    if (!f)
        fprintf(stderr, "fastgen %s: cannot open %s\n", cmd, path);
    for (long v; st == FG_OK && fscanf(f, "%ld", &v) == 1;) {
        if (v < 0 || v >= vocab) {
            fprintf(stderr, "fastgen %s: %s: id %ld is outside the vocabulary of %d\n", cmd, path, v, (int)vocab);
            st = FG_ERR_INVALID_ARGUMENT;
        } else if (*n == cap) {
            int32_t *more = realloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
            st = more ? FG_OK : FG_ERR_OUT_OF_MEMORY;
            if (more)
                *ids = more;
        }
        if (st == FG_OK)
            (*ids)[(*n)++] = (int32_t)v;
    }
    if (st == FG_OK && (ferror(f) || !feof(f) || *n == 0)) {
        fprintf(stderr, "fastgen %s: %s: expected whitespace-separated token ids\n", cmd, path);
        st = FG_ERR_INVALID_ARGUMENT;
    }
    if (f)
        fclose(f);
    if (st) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}
