/* fastgen generate: text from a prompt, a conversation (--chat) or K forked samples (--samples). */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/cmd_generate_serve.h"

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
    "Generates text with a GGUF or llama2.c model whose attention and KV cache\n"
    "run through fastgen, then prints the prompt's and the generation's speed\n"
    "(as llama-cli does) and the KV memory held against a full cache.\n"
    "\n"
    "options:\n";
static const char *k_generate_help_tail =
    "  -n, --steps N           tokens to generate after the prompt (default 64; --n-predict N too, -1:\n"
    "                          until the context is full)\n"
    "  -c, --ctx-size N        positions a sequence may hold (default: the model's context)\n"
    "  -e, --escape            process \\n \\r \\t \\' \\\" \\\\ in the prompt (llama.cpp's -e)\n"
    "  --temp X                sampling temperature, 0 = greedy (default 0, greedy; --temperature too)\n"
    "  --top-k K               sample among the K likeliest tokens (default 0: all)\n"
    "  --top-p P               nucleus sampling (default 0.9)\n"
    "  -s, --seed S            sampling seed (default 1)\n"
    "                          --top-k, --top-p or --seed without --temp sample at 0.8, llama.cpp's default\n"
    "  --repeat-penalty X      llama.cpp's penalty on the tokens of the last --repeat-last-n (default 64,\n"
    "                          -1: all) positions (default 1: none)\n"
    "  --json                  one JSON object: text, tokens, kv_bytes_held, kv_bytes_full, ...\n"
    "  --chat FILE             a conversation: the user turns of FILE (separated by blank lines) are\n"
    "                          appended to one sequence in turn, and the model answers each (-n tokens\n"
    "                          at most); --json: turns[{user, reply}], stopped, kv_bytes_held, kv_bytes_full.\n"
    "                          A turn that does not fit the rest of the context ends the run: the turns\n"
    "                          before it are printed, \"stopped\" says why (null when all were answered)\n"
    "                          and the exit status is 1\n"
    "  --prompt-ids FILE       the prompt as token ids (whitespace-separated) instead of -p's text\n"
    "  --ignore-eos            generate all N tokens, past the end of text (for timing)\n"
    "  --observe MODE          --policy fastgen-adaptive: what judges its compression: tail (the prompt's\n"
    "                          last rows; the default) or reconstruct (a pass that reads the prompt again\n"
    "                          after an instruction to repeat it, KVzip's idea: what the compression keeps\n"
    "                          no longer depends on the question; its time is printed) or predicted (the\n"
    "                          last rows advanced by RoPE over the next 512 positions, ExpectedAttention's\n"
    "                          idea: no extra pass) or scores (the keys ranked by the model's calibrated\n"
    "                          scorer, --scorer or MODEL.fgscore from `fastgen calibrate`: the\n"
    "                          reconstruction's ranks predicted, no extra pass)\n"
    "  --append MODE           --chat's later turns: keep (each head keeps its policy; the default) or\n"
    "                          reprofile (each head profiled again over the new turn)\n"
    "  --samples K             K samples (temperature 1 unless --temp says otherwise, seeds S..S+K-1) forked\n"
    "                          from one prefilled prompt, sharing its pages; --json: samples, kv_bytes_held\n"
    "                          (shared pages once), kv_bytes_alone (as separate sequences), kv_bytes_full\n"
    "                          (full caches that share the prompt's pages too)\n";

typedef struct generate_extra {
    const char *chat, *prompt_ids;
    int32_t samples;
    int ignore_eos;
    int observe, reconstruct, predicted, scores; /* --observe given; its value reconstruct, predicted, scores */
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
    if (!strcmp(opt, "--observe")) {
        x->observe = 1;
        x->reconstruct = val && !strcmp(val, "reconstruct");
        x->predicted = val && !strcmp(val, "predicted");
        x->scores = val && !strcmp(val, "scores");
        return val && (x->reconstruct || x->predicted || x->scores || !strcmp(val, "tail")) ? 0 : 1;
    }
    return 2;
}

/* The combinations generate refuses: an option the run would not use. */
static int generate_checks(const cli_opts *o, const fg_compression_params *cp, const generate_extra *x) {
    const char *cmd = "generate";
    if (x->observe && cp->allocation != FG_ALLOC_ADAPTIVE)
        return cli_usage(cmd, "--observe says what judges the adaptive mode's compression: it needs --policy "
                              "fastgen-adaptive (not %s)", o->policy);
    if (x->reconstruct && (x->chat || x->samples))
        return cli_usage(cmd, "--observe reconstruct goes with a plain prompt: not with --chat or --samples");
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
    if ((x->samples || x->chat) && (o->has_repeat_penalty || o->has_repeat_last_n))
        return cli_usage(cmd, "--repeat-penalty applies to a plain generate: --chat and --samples sample without it");
    if (o->has_temperature && o->temperature == 0.0f && (o->has_top_p || o->has_top_k || o->has_seed))
        return cli_usage(cmd, "--top-k, --top-p and --seed shape sampling: --temp 0 is greedy");
    return 0;
}

/* llama.cpp samples by default: --top-k, --top-p or --seed alone mean sampling at its temperature, 0.8. */
static void sampling_defaults(cli_opts *o, const generate_extra *x) {
    if (!o->has_temperature && !x->samples && (o->has_top_p || o->has_top_k || o->has_seed)) {
        o->temperature = 0.8f;
        if (!o->quiet)
            fprintf(stderr, "fastgen generate: sampling at --temp 0.8 (llama.cpp's default; fastgen's is 0, "
                            "greedy)\n");
    }
}

static int generate_one(cli_opts *op, const fg_compression_params *cpp, const generate_extra *xp);

int cmd_generate(int argc, char **argv) {
    char model[1024], tokp[1024];
    cli_opts o;
    fg_compression_params cp;
    generate_extra x = {NULL, NULL, 0, 0, 0, 0, 0, 0};
    int rc = cli_model_command("generate", k_generate_help_head, k_generate_help_tail,
                           CLI_MODEL | CLI_PROMPT | CLI_POLICY | CLI_APPEND | CLI_RUN | CLI_STEPS | CLI_SAMPLE | CLI_JSON |
                               CLI_QUIET | CLI_CTX,
                           64, argc, argv, &o, &cp, model, tokp, sizeof model, generate_option, &x);
    if (rc == 0)
        rc = generate_checks(&o, &cp, &x);
    if (rc == 0)
        sampling_defaults(&o, &x);
    if (rc) {
        cli_opts_free(&o);
        return rc < 0 ? 0 : rc;
    }
    if (x.predicted) /* --observe reconstruct: generate_one's pass (refused with --chat and --samples) */
        cp.observe = FG_OBSERVE_PREDICTED;
    if (x.scores)
        cp.observe = FG_OBSERVE_SCORES;
    if (x.chat)
        rc = serve_chat(&o, &cp, x.observe, x.chat);
    else if (x.samples)
        rc = serve_samples(&o, &cp, x.observe, x.samples);
    else
        rc = generate_one(&o, &cp, &x);
    cli_opts_free(&o);
    return rc;
}

static int generate_one(cli_opts *op, const fg_compression_params *cpp, const generate_extra *xp) {
    cli_opts o = *op;
    fg_compression_params cp = *cpp;
    const generate_extra x = *xp;
    int32_t *recon = NULL, n_recon = 0;
    if (x.reconstruct)
        cp.observe = FG_OBSERVE_EXPLICIT;
    int rc;

    cli_session s;
    if (cli_open_or_report(&o, 0, &s))
        return 1;
    if (!x.observe)
        cli_default_observe(&s, &cp, o.quiet || o.json);
    const int32_t seq_len = fgm_runner_ctx_len(s.runner), vocab = s.model.config.vocab_size;
    int32_t *tokens = NULL, n_prompt = 0, seq = -1;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    unsigned char *seen = calloc((size_t)vocab, 1); /* fgm_penalize's marks */
    text_buf text = {0};
    rc = 1;
    if (!logits || !seen || (x.prompt_ids ? cli_read_ids("generate", x.prompt_ids, vocab, &tokens, &n_prompt)
                                 : cli_encode(&s, o.prompt, &tokens, &n_prompt)) != FG_OK) {
        fprintf(stderr, "fastgen generate: cannot %s the prompt\n", x.prompt_ids ? "read" : "encode");
        goto done;
    }
    if (n_prompt > seq_len) {
        fprintf(stderr, "fastgen generate: the prompt is %d tokens, longer than the context of %d\n", (int)n_prompt,
                (int)seq_len);
        goto done;
    }
    if (n_prompt + o.n > seq_len) {
        if (o.n < (1 << 20)) /* not --n-predict -1, which asks for exactly this */
            fprintf(stderr, "fastgen generate: generating %d tokens, not %d: the context holds %d\n",
                    (int)(seq_len - n_prompt), (int)o.n, (int)seq_len);
        o.n = seq_len - n_prompt;
    }
    if (!o.quiet && !o.json) { /* llama-cli's KV buffer line: what a full cache of the context would take */
        const fgm_llama_config *c = &s.model.config;
        char full[32], kv[32];
        cli_human_bytes((double)c->n_layers * c->n_kv_heads * seq_len * (double)cli_kv_pair_bytes(&o, c->head_size),
                        full, sizeof full);
        fprintf(stderr, "fastgen generate: KV cache of a full context: %s (%s, %d layers x %d KV heads x %d, %d "
                        "tokens); policy %s holds what it keeps of it\n", full, cli_dtype_label(&o, kv, sizeof kv),
                (int)c->n_layers, (int)c->n_kv_heads, (int)c->head_size, (int)seq_len, o.policy);
    }
    int32_t *all = realloc(tokens, (size_t)(n_prompt + o.n + 1) * sizeof *all);
    if (!all)
        goto done;
    tokens = all;

    double t0 = cli_now();
    fg_status st = fgm_runner_prefill(s.runner, &cp, tokens, n_prompt, &seq, logits);
    if (st) {
        fprintf(stderr, "fastgen generate: prefill: %s\n", cli_reason(s.runner, st));
        goto done;
    }
    double t_prefill = cli_now() - t0, t_reconstruct = 0.0;
    int32_t n_fed = 0; /* the reconstruction's rows */
    if (x.reconstruct) { /* the prompt again after an instruction to repeat it, then the compression */
        const int32_t skip = tokens[0] == s.tok.bos;
        t0 = cli_now();
        st = cli_reconstruct_prefix(&s, !x.prompt_ids && strstr(o.prompt, "<|im_start|>"), &recon, &n_recon);
        if (st == FG_OK)
            st = fgm_runner_reconstruct(s.runner, 1, &seq, recon, n_recon, tokens + skip, n_prompt - skip, &n_fed);
        if (st) {
            fprintf(stderr, "fastgen generate: reconstruction: %s\n", cli_reason(s.runner, st));
            goto done;
        }
        t_reconstruct = cli_now() - t0;
    }
    for (int32_t i = 0; i < n_prompt; i++) /* BOS and other control tokens decode to nothing */
        text_append(&text, fgm_tokenizer_decode(&s.tok, i ? tokens[i - 1] : s.tok.bos, tokens[i]));
    if (!o.json) {
        fputs(text.s ? text.s : "", stdout);
        fflush(stdout);
    }
    fgm_sampler sampler = {o.temperature, o.top_p, o.seed * 0x9e3779b97f4a7c15ull + 1, o.top_k};
    int32_t n_total = n_prompt;
    t0 = cli_now();
    for (int32_t step = 0; step < o.n; step++) {
        fgm_penalize(logits, vocab, tokens, n_total, o.repeat_last_n, o.repeat_penalty, seen);
        int32_t next = fgm_sample(&sampler, logits, vocab);
        if (!x.ignore_eos && (next == s.tok.bos || next == s.tok.eos))
            break;
        const char *piece = fgm_tokenizer_decode(&s.tok, tokens[n_total - 1], next);
        text_append(&text, piece);
        if (!o.json) {
            fputs(piece, stdout);
            fflush(stdout);
        }
        tokens[n_total++] = next;
        if (step + 1 < o.n && (st = fgm_runner_decode(s.runner, 1, &seq, &next, logits))) {
            fprintf(stderr, "\nfastgen generate: decode: %s\n", cli_reason(s.runner, st));
            goto done;
        }
    }
    double t_decode = cli_now() - t0;
    fg_memory_stats mem;
    fg_memory(fgm_runner_context(s.runner), seq, &mem);
    const int32_t generated = n_total - n_prompt;
    /* decode steps run: the last sampled token is not fed back (nor one that ended the text) */
    const int32_t runs = generated > 0 && generated == o.n ? generated - 1 : generated;
    const double tps = t_decode > 0.0 ? runs / t_decode : 0.0;
    if (o.json) {
        printf("{\"text\": ");
        cli_json_string(stdout, text.s ? text.s : "");
        printf(", \"tokens\": [");
        for (int32_t i = 0; i < n_total; i++)
            printf("%s%d", i ? ", " : "", (int)tokens[i]);
        printf("], \"n_prompt\": %d, \"n_generated\": %d, \"policy\": ", (int)n_prompt, (int)generated);
        cli_json_string(stdout, o.policy);
        printf(", \"backend\": ");
        cli_json_string(stdout, fg_context_backend(fgm_runner_context(s.runner)));
        printf(", \"kv_bytes_held\": %zu, \"kv_bytes_full\": %zu, \"rows_kept\": %lld, \"rows_full\": %lld, "
               "\"prefill_s\": %.6f, \"prompt_tokens_per_s\": %.2f, \"reconstruct_s\": %.6f, \"decode_s\": %.6f, "
               "\"decode_runs\": %d, \"tokens_per_s\": %.2f}\n",
               mem.kv_bytes_held, mem.kv_bytes_full, (long long)mem.rows_kept, (long long)mem.rows_full, t_prefill,
               t_prefill > 0.0 ? n_prompt / t_prefill : 0.0, t_reconstruct, t_decode, (int)runs, tps);
    } else {
        /* llama-cli's timing lines */
        printf("\n\nprompt eval: %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n",
               1e3 * t_prefill, (int)n_prompt, n_prompt ? 1e3 * t_prefill / n_prompt : 0.0,
               t_prefill > 0.0 ? n_prompt / t_prefill : 0.0);
        if (x.reconstruct)
            printf("reconstruct: %10.2f ms / %5d tokens (%.2fx the prompt's eval)\n", 1e3 * t_reconstruct,
                   (int)n_fed, t_prefill > 0.0 ? t_reconstruct / t_prefill : 0.0);
        printf("       eval: %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n", 1e3 * t_decode,
               (int)runs, runs ? 1e3 * t_decode / runs : 0.0, tps);
        printf("%d prompt + %d generated tokens, backend %s, policy %s\n", (int)n_prompt, (int)generated,
               fg_context_backend(fgm_runner_context(s.runner)), o.policy);
        cli_print_kv("KV cache: ", &mem, fgm_runner_page_tokens(s.runner));
        if (o.dtype != FG_DTYPE_F16 || o.v_dtype >= 0) { /* the bytes against the default f16 cache's */
            const int32_t hd = s.model.config.head_size;
            const double f16_full = (double)mem.kv_bytes_full * 2.0 * (double)fg_kv_row_bytes(FG_DTYPE_F16, hd) /
                                    (double)cli_kv_pair_bytes(&o, hd);
            char f16s[32], kv[32];
            cli_human_bytes(f16_full, f16s, sizeof f16s);
            printf("KV cache rows stored as %s: %.1f%% of an f16 full cache (%s)\n",
                   o.v_dtype >= 0 ? cli_dtype_label(&o, kv, sizeof kv) : fg_dtype_name(o.dtype),
                   100.0 * (double)mem.kv_bytes_held / f16_full, f16s);
        }
    }
    rc = 0;
done:
    free(recon);
    free(tokens);
    free(logits);
    free(seen);
    free(text.s);
    cli_close(&s);
    return rc;
}
