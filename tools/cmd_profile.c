/* fastgen profile: the policy of every head and the recovery of every shortlist entry. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/svg.h"

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
    int rc = cli_model_command("profile", k_profile_help_head, k_profile_help_tail,
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
    if (cli_open_or_report(&o, 0, &s)) {
        cli_opts_free(&o);
        return 1;
    }
    const fgm_llama_config *c = &s.model.config;
    fg_context *ctx = fgm_runner_context(s.runner);
    int32_t *tokens = NULL, n = 0, seq = -1;
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    int32_t *policy = malloc((size_t)c->n_layers * c->n_kv_heads * sizeof *policy);
    fg_head_info *info = malloc((size_t)c->n_layers * c->n_kv_heads * sizeof *info);
    rc = 1;
    if (!logits || !policy || !info ||
        (prompt_ids ? cli_read_ids("profile", prompt_ids, c->vocab_size, &tokens, &n)
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
    fg_status st = fgm_runner_prefill(s.runner, &full, tokens, n, &seq, logits);
    fgm_sampler greedy = {0};
    for (int32_t i = 0; st == FG_OK && i < o.n; i++) {
        tokens[n] = fgm_sample(&greedy, logits, c->vocab_size);
        st = fgm_runner_decode(s.runner, 1, &seq, &tokens[n], logits);
        n++;
    }
    if (seq >= 0)
        fgm_runner_release(s.runner, seq);
    if (st == FG_OK)
        st = fgm_runner_prefill(s.runner, &cp, tokens, n, &seq, NULL);
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
        const svg_profile_data pd = {subtitle, c->n_layers, c->n_kv_heads, policy, kept_share, recovery, name_ptr,
                                        cp.n_policies};
        const int bad = !f || !kept_share || !recovery || svg_profile(f, &pd) != 0;
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
