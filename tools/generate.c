/* fastgen generate and fastgen profile. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/serve.h"
#include "tools/svg.h"

static const char *k_model_help =
    "  -m, --model FILE        GGUF file or llama2.c checkpoint (default: stories260K.bin from\n"
    "                          $FASTGEN_MODEL, ../shared/models/ or ./models/)\n"
    "  -z, --tokenizer FILE    llama2.c tokenizer (default: tok512.bin beside the model; GGUF files carry theirs)\n"
    "  -p, --prompt TEXT       prompt (default \"Once upon a time\")\n"
    "  --policy NAME           fastgen | fastgen-budget | fastgen-adaptive | full | streamingllm | h2o |\n"
    "                          local | frequent | snapkv | adakv | tova\n"
    "                          (default fastgen)\n"
    "  -T X                    recovery threshold in (0, 1] (default 0.95)\n"
    "  --budget B              FastGen's budget mode: keep at most B of the full cache's rows, in (0, 1]\n"
    "  --ratio-local R         local window ratio of every policy (default 0.3)\n"
    "  --ratio-frequent R      frequent budget ratio of every policy (default 0.3)\n"
    "  -f, --file FILE         the prompt is the whole of FILE (- for standard input)\n"
    "  --backend NAME          ref | cpu | cuda | hip (default cpu)\n"
    "  --dtype NAME            f32 | f16 | bf16 KV cache storage (default f16)\n"
    "  -t, --threads N         CPU threads (default: the cores this process may run on)\n"
    "  --q8-activations        q4_0 / q4_1 / q8_0 weights: activations quantized to 8 bits and integer\n"
    "                          dot products, as llama.cpp does (the default)\n"
    "  --f32-activations       f32 activations against the dequantized weights instead\n"
    "  --prefill-chunk N       the prompt through the model N tokens at a time (fg_prefill_chunk), profiled\n"
    "                          over the whole prompt at its last chunk\n"
    "  -q, --quiet             no progress line for the prompt (none either when stderr is not a terminal)\n";

/* The common start of a model command: help text, options, the model (found
 * in the default places when not given), the compression parameters.
 * Returns 0 to go on, else the exit code (0 after --help). */
static int model_command(const char *cmd, const char *help_head, const char *help_tail, unsigned accept,
                         int32_t n_default, int argc, char **argv, cli_opts *o, fg_compression_params *cp, char *model,
                         char *tok, size_t size, cli_extra_fn extra, void *user) {
    char help[4096];
    snprintf(help, sizeof help, "%s%s%s", help_head, k_model_help, help_tail);
    cli_defaults(o, n_default);
    int rc = cli_parse(cmd, help, accept, argc, argv, o, extra, user);
    if (rc)
        return rc < 0 ? -1 : rc;
    if ((rc = cli_need_model(cmd, o, model, tok, size)))
        return rc;
    if ((rc = cli_read_prompt(cmd, o)))
        return rc;
    return cli_compression(cmd, o, cp);
}

static int open_or_fail(const cli_opts *o, int track, cli_session *s) {
    char err[512];
    fg_status st = cli_open(o, 1, track, s, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen: %s\n", err);
        return 1;
    }
    return 0;
}

/* A growing string. */
typedef struct text_buf {
    char *s;
    size_t len, cap;
} text_buf;

static void text_append(text_buf *t, const char *piece) {
    size_t n = strlen(piece);
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s)
            return;
        t->s = s;
        t->cap = cap;
    }
    memcpy(t->s + t->len, piece, n + 1);
    t->len += n;
}

/* ------------------------------------------------------------------ generate */

static const char *k_generate_help_head =
    "usage: fastgen generate [options]\n"
    "\n"
    "Generates text with a llama2.c model whose attention runs through fastgen,\n"
    "then prints tokens/s and the KV bytes held against a full cache.\n"
    "\n"
    "options:\n";
static const char *k_generate_help_tail =
    "  -n, --steps N           tokens to generate after the prompt (default 64)\n"
    "  --temp X                sampling temperature, 0 = greedy (default 0; --temperature too)\n"
    "  --top-p P               nucleus sampling when the temperature is above 0 (default 0.9)\n"
    "  --seed S                sampling seed (default 1)\n"
    "  --json                  one JSON object: text, tokens, kv_bytes_held, kv_bytes_full, ...\n"
    "  --chat FILE             a conversation: the user turns of FILE (separated by blank lines) are\n"
    "                          appended to one sequence in turn, and the model answers each (-n tokens\n"
    "                          at most); --json: turns[{user, reply}], stopped, kv_bytes_held, kv_bytes_full.\n"
    "                          A turn that does not fit the rest of the context ends the run: the turns\n"
    "                          before it are printed, \"stopped\" says why (null when all were answered)\n"
    "                          and the exit status is 1\n"
    "  --prompt-ids FILE       the prompt as token ids (whitespace-separated) instead of -p's text\n"
    "  --ignore-eos            generate all N tokens, past the end of text (for timing)\n"
    "  --append MODE           --chat's later turns: keep (each head keeps its policy; the default) or\n"
    "                          reprofile (each head profiled again over the new turn)\n"
    "  --samples K             K samples (temperature 1 unless --temp says otherwise, seeds S..S+K-1) forked\n"
    "                          from one prefilled prompt, sharing its pages; --json: samples, kv_bytes_held\n"
    "                          (shared pages once), kv_bytes_unshared (each counted whole), kv_bytes_full\n"
    "                          (full caches that share the prompt's pages too)\n";

typedef struct generate_extra {
    const char *chat, *prompt_ids;
    int32_t samples;
    int ignore_eos;
} generate_extra;

static int generate_option(void *user, const char *opt, const char *val, int *used) {
    generate_extra *x = user;
    *used = 1;
    if (!strcmp(opt, "--ignore-eos")) {
        x->ignore_eos = 1;
        *used = 0;
        return 0;
    }
    if (!strcmp(opt, "--prompt-ids")) {
        x->prompt_ids = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--chat")) {
        x->chat = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--samples"))
        return val && cli_parse_int(val, 1, 64, &x->samples) ? 0 : 1;
    return 2;
}

/* Token ids, whitespace-separated, each below vocab (malloc'd). */
static fg_status read_ids(const char *cmd, const char *path, int32_t vocab, int32_t **ids, int32_t *n) {
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

/* The combinations generate refuses: an option the run would not use. */
static int generate_checks(const cli_opts *o, const generate_extra *x) {
    const char *cmd = "generate";
    if (x->chat && x->samples)
        return cli_usage(cmd, "--chat and --samples do not go together");
    if (x->chat && (o->has_prompt || x->prompt_ids))
        return cli_usage(cmd, "--chat takes its turns from its file: -p, -f and --prompt-ids do not go with it");
    if (x->prompt_ids && o->has_prompt)
        return cli_usage(cmd, "--prompt-ids gives the prompt: -p and -f do not go with it");
    if (o->append_mode >= 0 && !x->chat)
        return cli_usage(cmd, "--append says how --chat's later turns join the sequence: it needs --chat");
    if (x->ignore_eos && x->chat)
        return cli_usage(cmd, "--ignore-eos: a --chat reply ends at the end of its turn");
    if (x->samples && (x->prompt_ids || x->ignore_eos))
        return cli_usage(cmd, "--samples takes its prompt from -p or -f and stops each sample at its end of text: "
                              "--prompt-ids and --ignore-eos do not go with it");
    if (x->samples && o->has_temperature && o->temperature == 0.0f)
        return cli_usage(cmd, "--samples with --temp 0 would give %d copies of the greedy text: pass a temperature "
                              "above 0", (int)x->samples);
    const int sampling = x->samples || o->temperature > 0.0f;
    if (!sampling && (o->has_top_p || o->has_seed))
        return cli_usage(cmd, "--top-p and --seed shape sampling: they need --temp above 0 (or --samples)");
    return 0;
}

static int generate_one(cli_opts *op, const fg_compression_params *cpp, const generate_extra *xp);

int cmd_generate(int argc, char **argv) {
    char model[1024], tokp[1024];
    cli_opts o;
    fg_compression_params cp;
    generate_extra x = {NULL, NULL, 0, 0};
    int rc = model_command("generate", k_generate_help_head, k_generate_help_tail,
                           CLI_MODEL | CLI_PROMPT | CLI_POLICY | CLI_APPEND | CLI_RUN | CLI_STEPS | CLI_SAMPLE | CLI_JSON |
                               CLI_QUIET,
                           64, argc, argv, &o, &cp, model, tokp, sizeof model, generate_option, &x);
    if (rc == 0)
        rc = generate_checks(&o, &x);
    if (rc) {
        cli_opts_free(&o);
        return rc < 0 ? 0 : rc;
    }
    if (x.chat)
        rc = serve_chat(&o, &cp, x.chat);
    else if (x.samples)
        rc = serve_samples(&o, &cp, x.samples);
    else
        rc = generate_one(&o, &cp, &x);
    cli_opts_free(&o);
    return rc;
}

static int generate_one(cli_opts *op, const fg_compression_params *cpp, const generate_extra *xp) {
    cli_opts o = *op;
    const fg_compression_params cp = *cpp;
    const generate_extra x = *xp;
    int rc;

    cli_session s;
    if (open_or_fail(&o, 0, &s))
        return 1;
    const int32_t seq_len = s.model.config.seq_len, vocab = s.model.config.vocab_size;
    int32_t *tokens = NULL, n_prompt = 0, seq = -1;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    text_buf text = {0};
    rc = 1;
    if (!logits || (x.prompt_ids ? read_ids("generate", x.prompt_ids, vocab, &tokens, &n_prompt)
                                 : cli_encode(&s, o.prompt, &tokens, &n_prompt)) != FG_OK) {
        fprintf(stderr, "fastgen generate: cannot %s the prompt\n", x.prompt_ids ? "read" : "encode");
        goto done;
    }
    if (n_prompt > seq_len) {
        fprintf(stderr, "fastgen generate: the prompt is %d tokens, longer than the model's context of %d\n",
                (int)n_prompt, (int)seq_len);
        goto done;
    }
    if (n_prompt + o.n > seq_len) {
        fprintf(stderr, "fastgen generate: generating %d tokens, not %d: the context holds %d\n",
                (int)(seq_len - n_prompt), (int)o.n, (int)seq_len);
        o.n = seq_len - n_prompt;
    }
    int32_t *all = realloc(tokens, (size_t)(n_prompt + o.n + 1) * sizeof *all);
    if (!all)
        goto done;
    tokens = all;

    double t0 = cli_now();
    fg_status st = fg_runner_prefill(s.runner, &cp, tokens, n_prompt, &seq, logits);
    if (st) {
        fprintf(stderr, "fastgen generate: prefill: %s\n", cli_reason(s.runner, st));
        goto done;
    }
    double t_prefill = cli_now() - t0;
    for (int32_t i = 0; i < n_prompt; i++) /* BOS and other control tokens decode to nothing */
        text_append(&text, fg_tokenizer_decode(&s.tok, i ? tokens[i - 1] : s.tok.bos, tokens[i]));
    if (!o.json) {
        fputs(text.s ? text.s : "", stdout);
        fflush(stdout);
    }
    fg_sampler sampler = {o.temperature, o.top_p, o.seed * 0x9e3779b97f4a7c15ull + 1};
    int32_t n_total = n_prompt;
    t0 = cli_now();
    for (int32_t step = 0; step < o.n; step++) {
        int32_t next = fg_sample(&sampler, logits, vocab);
        if (!x.ignore_eos && (next == s.tok.bos || next == s.tok.eos))
            break;
        const char *piece = fg_tokenizer_decode(&s.tok, tokens[n_total - 1], next);
        text_append(&text, piece);
        if (!o.json) {
            fputs(piece, stdout);
            fflush(stdout);
        }
        tokens[n_total++] = next;
        if (step + 1 < o.n && (st = fg_runner_decode(s.runner, 1, &seq, &next, logits))) {
            fprintf(stderr, "\nfastgen generate: decode: %s\n", cli_reason(s.runner, st));
            goto done;
        }
    }
    double t_decode = cli_now() - t0;
    fg_memory_stats mem;
    fg_memory(fg_runner_context(s.runner), seq, &mem);
    const int32_t generated = n_total - n_prompt;
    const double tps = t_decode > 0.0 ? generated / t_decode : 0.0;
    if (o.json) {
        printf("{\"text\": ");
        cli_json_string(stdout, text.s ? text.s : "");
        printf(", \"tokens\": [");
        for (int32_t i = 0; i < n_total; i++)
            printf("%s%d", i ? ", " : "", (int)tokens[i]);
        printf("], \"n_prompt\": %d, \"n_generated\": %d, \"policy\": ", (int)n_prompt, (int)generated);
        cli_json_string(stdout, o.policy);
        printf(", \"backend\": ");
        cli_json_string(stdout, fg_context_backend(fg_runner_context(s.runner)));
        printf(", \"kv_bytes_held\": %zu, \"kv_bytes_full\": %zu, \"rows_kept\": %lld, \"rows_full\": %lld, "
               "\"prefill_s\": %.6f, \"tokens_per_s\": %.2f}\n",
               mem.kv_bytes_held, mem.kv_bytes_full, (long long)mem.rows_kept, (long long)mem.rows_full, t_prefill,
               tps);
    } else {
        char held[32], full[32];
        cli_human_bytes((double)mem.kv_bytes_held, held, sizeof held);
        cli_human_bytes((double)mem.kv_bytes_full, full, sizeof full);
        printf("\n\n%d prompt + %d generated tokens, %.1f tokens/s (backend %s, policy %s)\n", (int)n_prompt,
               (int)generated, tps, fg_context_backend(fg_runner_context(s.runner)), o.policy);
        printf("KV cache: %s held vs %s full (%.1f%%; %lld of %lld rows kept)\n", held, full,
               100.0 * (double)mem.kv_bytes_held / (double)(mem.kv_bytes_full ? mem.kv_bytes_full : 1),
               (long long)mem.rows_kept, (long long)mem.rows_full);
    }
    rc = 0;
done:
    free(tokens);
    free(logits);
    free(text.s);
    cli_close(&s);
    return rc;
}

/* ------------------------------------------------------------------ profile */

static const char *k_profile_help_head =
    "usage: fastgen profile [options]\n"
    "\n"
    "Profiles a prompt: per layer and KV head, the policy FastGen chooses and the\n"
    "attention recovered by every shortlist entry. The prompt is followed by N\n"
    "greedily generated tokens (full cache), so that a short opening still gives\n"
    "a prompt long enough to profile.\n"
    "\n"
    "options:\n";
static const char *k_profile_help_tail =
    "  -n, --steps N           tokens generated after the prompt before profiling (default 128)\n"
    "  --prompt-ids FILE       the prompt as token ids (whitespace-separated) instead of -p's text\n"
    "  --json                  one JSON object: layers[{layer, heads[{kv_head, policy, recovery, kept}]}]\n"
    "  --svg FILE              heat map of the policies (layers x KV heads) with counts per layer\n";

static int profile_option(void *user, const char *opt, const char *val, int *used) {
    *used = 1;
    if (!strcmp(opt, "--prompt-ids")) {
        *(const char **)user = val;
        return val ? 0 : 1;
    }
    return 2;
}

int cmd_profile(int argc, char **argv) {
    char model[1024], tokp[1024];
    cli_opts o;
    fg_compression_params cp, full;
    const char *prompt_ids = NULL;
    int rc = model_command("profile", k_profile_help_head, k_profile_help_tail,
                           CLI_MODEL | CLI_PROMPT | CLI_POLICY | CLI_RUN | CLI_STEPS | CLI_JSON | CLI_SVG | CLI_QUIET, 128,
                           argc, argv, &o, &cp, model, tokp, sizeof model, profile_option, &prompt_ids);
    if (rc == 0 && prompt_ids && o.has_prompt)
        rc = cli_usage("profile", "--prompt-ids gives the prompt: -p and -f do not go with it");
    if (rc) {
        cli_opts_free(&o);
        return rc < 0 ? 0 : rc;
    }
    fg_compression_params_preset("full", &full);
    cli_session s;
    if (open_or_fail(&o, 0, &s)) {
        cli_opts_free(&o);
        return 1;
    }
    const fg_llama_config *c = &s.model.config;
    fg_context *ctx = fg_runner_context(s.runner);
    int32_t *tokens = NULL, n = 0, seq = -1;
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    int32_t *policy = malloc((size_t)c->n_layers * c->n_kv_heads * sizeof *policy);
    fg_head_info *info = malloc((size_t)c->n_layers * c->n_kv_heads * sizeof *info);
    rc = 1;
    if (!logits || !policy || !info ||
        (prompt_ids ? read_ids("profile", prompt_ids, c->vocab_size, &tokens, &n)
                    : cli_encode(&s, o.prompt, &tokens, &n)) != FG_OK ||
        n > c->seq_len) {
        fprintf(stderr, "fastgen profile: cannot encode the prompt or it is longer than the context (%d)\n",
                (int)c->seq_len);
        goto done;
    }
    if (n + o.n > c->seq_len)
        o.n = c->seq_len - n;
    const int32_t n_prompt = n;
    int32_t *all = realloc(tokens, (size_t)(n + o.n) * sizeof *all);
    if (!all)
        goto done;
    tokens = all;
    /* the continuation, greedy with the full cache */
    fg_status st = fg_runner_prefill(s.runner, &full, tokens, n, &seq, logits);
    fg_sampler greedy = {0};
    for (int32_t i = 0; st == FG_OK && i < o.n; i++) {
        tokens[n] = fg_sample(&greedy, logits, c->vocab_size);
        st = fg_runner_decode(s.runner, 1, &seq, &tokens[n], logits);
        n++;
    }
    if (seq >= 0)
        fg_runner_release(s.runner, seq);
    if (st == FG_OK)
        st = fg_runner_prefill(s.runner, &cp, tokens, n, &seq, NULL);
    if (st) {
        fprintf(stderr, "fastgen profile: %s\n", cli_reason(s.runner, st));
        goto done;
    }
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            fg_head_info *hi = &info[l * c->n_kv_heads + g];
            fg_head_inspect(ctx, seq, l, g, hi);
            policy[l * c->n_kv_heads + g] = hi->policy_index;
        }
    char names[FG_MAX_SHORTLIST][64];
    const char *name_ptr[FG_MAX_SHORTLIST];
    for (int32_t e = 0; e < cp.n_policies; e++) {
        fg_policy_name(cp.shortlist[e].components, names[e], sizeof names[e]);
        name_ptr[e] = names[e];
    }
    fg_memory_stats mem;
    fg_memory(ctx, seq, &mem);

    if (o.json) {
        printf("{\"prompt_tokens\": %d, \"generated_tokens\": %d, \"policy\": ", (int)n_prompt, (int)(n - n_prompt));
        cli_json_string(stdout, o.policy);
        printf(", \"threshold\": %.4f, \"shortlist\": [", (double)cp.threshold);
        for (int32_t e = 0; e < cp.n_policies; e++) {
            printf("%s", e ? ", " : "");
            cli_json_string(stdout, names[e]);
        }
        printf("], \"layers\": [");
        for (int32_t l = 0; l < c->n_layers; l++) {
            printf("%s{\"layer\": %d, \"heads\": [", l ? ", " : "", (int)l);
            for (int32_t g = 0; g < c->n_kv_heads; g++) {
                const fg_head_info *hi = &info[l * c->n_kv_heads + g];
                printf("%s{\"kv_head\": %d, \"policy\": ", g ? ", " : "", (int)g);
                cli_json_string(stdout, names[hi->policy_index]);
                printf(", \"ratio_local\": %.6f, \"ratio_frequent\": %.6f, \"recovery\": [",
                       (double)hi->policy.ratio_local, (double)hi->policy.ratio_frequent);
                for (int32_t e = 0; e < hi->n_policies; e++)
                    printf("%s%.6f", e ? ", " : "", (double)hi->recovery[e]);
                printf("], \"kept\": %d, \"length\": %d}", (int)hi->kept, (int)hi->length);
            }
            printf("]}");
        }
        printf("], \"kv_bytes_held\": %zu, \"kv_bytes_full\": %zu}\n", mem.kv_bytes_held, mem.kv_bytes_full);
    } else {
        if (n > n_prompt)
            printf("profile of %d tokens: the prompt's %d and %d generated greedily with the full cache (-n); "
                   "policy %s, T = %.2f\n\n",
                   (int)n, (int)n_prompt, (int)(n - n_prompt), o.policy, (double)cp.threshold);
        else
            printf("profile of the prompt's %d tokens, policy %s, T = %.2f\n\n", (int)n, o.policy,
                   (double)cp.threshold);
        printf("layer head  %-30s %6s %6s", "policy", "r_l", "r_f");
        for (int32_t e = 0; e < cp.n_policies; e++)
            printf("  rec[%d]", (int)e);
        printf("   kept\n");
        for (int32_t l = 0; l < c->n_layers; l++)
            for (int32_t g = 0; g < c->n_kv_heads; g++) {
                const fg_head_info *hi = &info[l * c->n_kv_heads + g];
                printf("%5d %4d  %-30s %6.3f %6.3f", (int)l, (int)g, names[hi->policy_index],
                       (double)hi->policy.ratio_local, (double)hi->policy.ratio_frequent);
                for (int32_t e = 0; e < hi->n_policies; e++)
                    printf("  %6.3f", (double)hi->recovery[e]);
                printf("  %3d/%d\n", (int)hi->kept, (int)hi->length);
            }
        printf("\nshortlist:");
        for (int32_t e = 0; e < cp.n_policies; e++)
            printf(" [%d] %s", (int)e, names[e]);
        printf("\npolicies per layer:\n");
        for (int32_t l = 0; l < c->n_layers; l++) {
            printf("  layer %d:", (int)l);
            for (int32_t e = 0; e < cp.n_policies; e++) {
                int cnt = 0;
                for (int32_t g = 0; g < c->n_kv_heads; g++)
                    cnt += policy[l * c->n_kv_heads + g] == e;
                if (cnt)
                    printf(" %s %d", names[e], cnt);
            }
            printf("\n");
        }
        char held[32], fullb[32];
        cli_human_bytes((double)mem.kv_bytes_held, held, sizeof held);
        cli_human_bytes((double)mem.kv_bytes_full, fullb, sizeof fullb);
        printf("KV cache after the prompt: %s held vs %s full (%lld of %lld rows kept)\n", held, fullb,
               (long long)mem.rows_kept, (long long)mem.rows_full);
    }
    if (o.svg) {
        FILE *f = fopen(o.svg, "w");
        const int32_t units = c->n_layers * c->n_kv_heads;
        double *kept_share = malloc((size_t)units * sizeof *kept_share);
        float *recovery = malloc((size_t)units * cp.n_policies * sizeof *recovery);
        for (int32_t i = 0; kept_share && recovery && i < units; i++) {
            kept_share[i] = info[i].length ? (double)info[i].kept / info[i].length : 0.0;
            for (int32_t e = 0; e < cp.n_policies; e++)
                recovery[(size_t)i * cp.n_policies + e] = info[i].recovery[e];
        }
        const char *slash = strrchr(o.model, '/');
        char subtitle[512], tokens_said[96];
        if (n > n_prompt)
            snprintf(tokens_said, sizeof tokens_said, "%d tokens (%d prompt + %d generated)", (int)n, (int)n_prompt,
                     (int)(n - n_prompt));
        else
            snprintf(tokens_said, sizeof tokens_said, "%d prompt tokens", (int)n);
        snprintf(subtitle, sizeof subtitle, "%s: %s, policy %s, T = %.2f, KV rows kept %.0f%%",
                 slash ? slash + 1 : o.model, tokens_said, o.policy, (double)cp.threshold,
                 100.0 * (double)mem.rows_kept / (double)(mem.rows_full ? mem.rows_full : 1));
        const fg_svg_profile_data pd = {subtitle, c->n_layers, c->n_kv_heads, policy, kept_share, recovery, name_ptr,
                                        cp.n_policies};
        const int bad = !f || !kept_share || !recovery || fg_svg_profile(f, &pd) != 0;
        free(kept_share);
        free(recovery);
        if (bad) {
            fprintf(stderr, "fastgen profile: cannot write %s\n", o.svg);
            if (f)
                fclose(f);
            goto done;
        }
        fclose(f);
        if (!o.json)
            printf("heat map written to %s\n", o.svg);
    }
    rc = 0;
done:
    free(tokens);
    free(logits);
    free(policy);
    free(info);
    cli_close(&s);
    cli_opts_free(&o);
    return rc;
}
