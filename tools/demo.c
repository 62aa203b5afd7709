/* fastgen demo: the real model when one is found, else the synthetic
 * workload with planted head types. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/synth.h"

static int demo_fail(const char *what, fg_status st, const fg_context *ctx) {
    fprintf(stderr, "fastgen: %s: %s\n  %s\n", what, fg_status_string(st), fg_last_error(ctx));
    return 1;
}

/* ------------------------------------------------------------------ demo */

typedef struct demo_opts {
    int32_t layers, q_heads, kv_heads, dim, prompt, steps, batch;
    float threshold;
    const char *backend;
    fg_dtype dtype;
    uint64_t seed;
} demo_opts;

static const char *k_demo_help =
    "usage: fastgen demo [options]\n"
    "\n"
    "With no options and a model at $FASTGEN_MODEL, ../shared/models/ or ./models/\n"
    "(stories260K.bin + tok512.bin), generates the same story with the full cache and\n"
    "with FastGen in one batch and compares text and memory. Otherwise:\n"
    "\n"    "Runs FastGen on a synthetic workload with planted head types (attention\n"
    "sinks, punctuation, heavy hitters, local, broad) at a Llama-like shape:\n"
    "profiles the prompt, decodes, and prints the policy chosen per head, how\n"
    "often it matches the planted type, and the KV memory held vs a full cache.\n"
    "\n"
    "options:\n"
    "  --layers N      layers (default 2)\n"
    "  --heads Q/KV    query / KV heads (default 32/8, Llama-3-8B)\n"
    "  --dim D         head dimension (default 128)\n"
    "  --prompt N      prompt tokens (default 2048)\n"
    "  --steps N       decode steps (default 256)\n"
    "  --batch N       sequences decoded together (default 1)\n"
    "  -T X            recovery threshold (default 0.95)\n"
    "  --backend NAME  ref | cpu | cuda | hip (default cpu)\n"
    "  --dtype NAME    f32 | f16 | bf16 cache storage (default f16)\n"
    "  --seed S        workload seed (default 1)\n"
    "  --synthetic     use the synthetic workload even when a model is found\n"
    "  -m MODEL [-z TOKENIZER]  the demo on this model (a GGUF file, or a llama2.c checkpoint and tokenizer)\n";

static int demo_parse(int argc, char **argv, demo_opts *o) {
    *o = (demo_opts){2, 32, 8, 128, 2048, 256, 1, 0.95f, "cpu", FG_DTYPE_F16, 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_demo_help, stdout);
            return -1;
        }
        if (!strcmp(a, "--synthetic"))
            continue;
        if (i + 1 >= argc)
            return cli_usage("demo", "unknown option or missing value: %s", a);
        const char *val = argv[++i];
        int ok = 1;
        if (!strcmp(a, "--layers"))
            ok = cli_parse_int(val, 1, 256, &o->layers);
        else if (!strcmp(a, "--heads")) {
            char q[32];
            const char *slash = strchr(val, '/');
            ok = slash && (size_t)(slash - val) < sizeof q;
            if (ok) {
                memcpy(q, val, (size_t)(slash - val));
                q[slash - val] = '\0';
                ok = cli_parse_int(q, 1, 1024, &o->q_heads) && cli_parse_int(slash + 1, 1, 1024, &o->kv_heads) &&
                     o->q_heads % o->kv_heads == 0;
            }
        } else if (!strcmp(a, "--dim"))
            ok = cli_parse_int(val, 16, 1024, &o->dim);
        else if (!strcmp(a, "--prompt"))
            ok = cli_parse_int(val, 1, 1 << 20, &o->prompt);
        else if (!strcmp(a, "--steps"))
            ok = cli_parse_int(val, 0, 1 << 20, &o->steps);
        else if (!strcmp(a, "--batch"))
            ok = cli_parse_int(val, 1, 256, &o->batch);
        else if (!strcmp(a, "-T"))
            ok = cli_parse_float(val, 0.0f, 1.0f, &o->threshold) && o->threshold > 0.0f;
        else if (!strcmp(a, "--backend"))
            o->backend = val;
        else if (!strcmp(a, "--seed")) {
            int32_t s;
            ok = cli_parse_int(val, 0, 2147483647, &s);
            o->seed = (uint64_t)s;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(val, "f32"))
                o->dtype = FG_DTYPE_F32;
            else if (!strcmp(val, "f16"))
                o->dtype = FG_DTYPE_F16;
            else if (!strcmp(val, "bf16"))
                o->dtype = FG_DTYPE_BF16;
            else
                ok = 0;
        } else
            return cli_usage("demo", "unknown option: %s", a);
        if (!ok)
            return cli_usage("demo", "bad value for %s", a);
    }
    return 0;
}

static int demo_synthetic(int argc, char **argv) {
    demo_opts o;
    int rc = demo_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;

    fg_synth syn;
    fg_status st = fg_synth_create(o.layers, o.q_heads, o.kv_heads, o.dim, o.seed, &syn);
    if (st)
        return demo_fail("synthetic workload", st, NULL);
    fg_context_params cp;
    fg_context_params_default(&cp);
    cp.backend = o.backend;
    cp.n_layers = o.layers;
    cp.n_q_heads = o.q_heads;
    cp.n_kv_heads = o.kv_heads;
    cp.head_dim = o.dim;
    cp.kv_dtype = o.dtype;
    cp.max_seqs = o.batch;
    cp.max_seq_len = o.prompt + o.steps;
    cp.classes = syn.classes;
    cp.compression.threshold = o.threshold;
    fg_context *ctx = NULL;
    st = fg_context_create(&cp, &ctx);
    if (st) {
        fg_synth_destroy(&syn);
        return demo_fail("context", st, NULL);
    }

    const int32_t n = o.prompt, Hq = o.q_heads, Hkv = o.kv_heads, d = o.dim, B = o.batch;
    printf("fastgen %s demo: synthetic workload, %d layers, %d q / %d kv heads, d=%d, %s cache, backend %s\n",
           fg_version(), (int)o.layers, (int)Hq, (int)Hkv, (int)d,
           o.dtype == FG_DTYPE_F32 ? "f32" : o.dtype == FG_DTYPE_F16 ? "f16" : "bf16", fg_context_backend(ctx));
    printf("prompt %d tokens x %d sequences, then %d decode steps, T = %.2f\n\n", (int)n, (int)B, (int)o.steps,
           (double)o.threshold);

    int32_t total = n + o.steps;
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    size_t qn = (size_t)n * Hq * d, kn = (size_t)n * Hkv * d;
    float *q = malloc(qn * sizeof *q), *k = malloc(kn * sizeof *k), *v = malloc(kn * sizeof *v);
    float *out = malloc(qn * sizeof *out);
    size_t bq = (size_t)B * Hq * d, bk = (size_t)B * Hkv * d;
    float *dq = malloc(bq * sizeof *dq), *dk = malloc(bk * sizeof *dk), *dv = malloc(bk * sizeof *dv);
    float *dout = malloc(bq * sizeof *dout);
    int32_t *seqs = malloc((size_t)B * sizeof *seqs), *dtok = malloc((size_t)B * sizeof *dtok);
    if (!tokens || !q || !k || !v || !out || !dq || !dk || !dv || !dout || !seqs || !dtok) {
        fprintf(stderr, "fastgen demo: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int32_t p = 0; p < total; p++)
        tokens[p] = fg_synth_token(&syn, p);

    /* every sequence sees the same stream: a batch of identical requests */
    double t0 = cli_now();
    for (int32_t b = 0; b < B; b++) {
        if ((st = fg_seq_create(ctx, NULL, tokens, n, &seqs[b]))) {
            rc = demo_fail("sequence", st, ctx);
            goto done;
        }
    }
    for (int32_t l = 0; l < o.layers; l++) {
        fg_synth_qkv(&syn, l, tokens, 0, n, q, k, v);
        for (int32_t b = 0; b < B; b++)
            if ((st = fg_prefill(ctx, seqs[b], l, q, k, v, out))) {
                rc = demo_fail("prefill", st, ctx);
                goto done;
            }
    }
    double t_prefill = cli_now() - t0;

    fg_memory_stats mem0;
    fg_memory(ctx, -1, &mem0);

    t0 = cli_now();
    double t_synth = 0.0;
    for (int32_t step = 0; step < o.steps; step++) {
        const int32_t p = n + step;
        for (int32_t l = 0; l < o.layers; l++) {
            double ts = cli_now();
            fg_synth_qkv(&syn, l, &tokens[p], p, 1, dq, dk, dv);
            for (int32_t b = 1; b < B; b++) {
                memcpy(dq + (size_t)b * Hq * d, dq, (size_t)Hq * d * sizeof *dq);
                memcpy(dk + (size_t)b * Hkv * d, dk, (size_t)Hkv * d * sizeof *dk);
                memcpy(dv + (size_t)b * Hkv * d, dv, (size_t)Hkv * d * sizeof *dv);
            }
            for (int32_t b = 0; b < B; b++)
                dtok[b] = tokens[p];
            t_synth += cli_now() - ts;
            if ((st = fg_decode(ctx, l, B, seqs, dtok, dq, dk, dv, dout))) {
                rc = demo_fail("decode", st, ctx);
                goto done;
            }
        }
    }
    double t_decode = cli_now() - t0 - t_synth;

    /* the policy map of sequence 0 */
    fg_compression_params paper;
    fg_compression_params_default(&paper);
    int32_t agree = 0, heads = 0;
    int32_t counts[FG_MAX_SHORTLIST] = {0};
    printf("policy per KV head (S=special, P=+punct, F=+frequent, L=+local, X=full; lower case = differs from the "
           "planted type)\n");
    for (int32_t l = 0; l < o.layers; l++) {
        printf("  layer %2d  ", (int)l);
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head_info info;
            if ((st = fg_head_inspect(ctx, seqs[0], l, g, &info))) {
                rc = demo_fail("inspect", st, ctx);
                goto done;
            }
            const char letters[] = "SPFLX";
            int32_t expected = fg_synth_expected_entry(syn.types[l * Hkv + g]);
            int ok = info.policy_index == expected;
            char c = info.policy_index < 5 ? letters[info.policy_index] : '?';
            putchar(ok ? c : c - 'A' + 'a');
            agree += ok;
            heads++;
            counts[info.policy_index]++;
        }
        putchar('\n');
    }
    printf("\nchosen policies over %d heads:", (int)heads);
    for (int32_t e = 0; e < paper.n_policies; e++) {
        char name[64];
        fg_policy_name(paper.shortlist[e].components, name, sizeof name);
        printf("  %s %d", name, (int)counts[e]);
    }
    printf("\nplanted vs chosen agreement: %d / %d heads (%.1f%%)\n", (int)agree, (int)heads,
           100.0 * agree / (heads ? heads : 1));

    fg_memory_stats mem;
    fg_memory(ctx, -1, &mem);
    char held[32], full[32], held0[32], full0[32];
    cli_human_bytes((double)mem0.kv_bytes_held, held0, sizeof held0);
    cli_human_bytes((double)mem0.kv_bytes_full, full0, sizeof full0);
    cli_human_bytes((double)mem.kv_bytes_held, held, sizeof held);
    cli_human_bytes((double)mem.kv_bytes_full, full, sizeof full);
    printf("\nKV cache after the prompt : %s held vs %s full (%.1f%% kept)\n", held0, full0,
           100.0 * (double)mem0.kv_bytes_held / (double)mem0.kv_bytes_full);
    printf("KV cache after decoding   : %s held vs %s full (%.1f%% kept, %lld of %lld rows)\n", held, full,
           100.0 * (double)mem.kv_bytes_held / (double)mem.kv_bytes_full, (long long)mem.rows_kept,
           (long long)mem.rows_full);
    printf("prefill + profiling: %.2f s (%.0f tokens/s); decode: %.3f s for %d steps x %d seqs (%.1f tokens/s)\n",
           t_prefill, (double)n * B / t_prefill, t_decode, (int)o.steps, (int)B,
           t_decode > 0 ? (double)o.steps * B / t_decode : 0.0);
    rc = 0;
done:
    free(tokens);
    free(q);
    free(k);
    free(v);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    free(dout);
    free(seqs);
    free(dtok);
    fg_context_destroy(&ctx);
    fg_synth_destroy(&syn);
    return rc;
}


/* ------------------------------------------------------------------ real model */

static int demo_model(const char *model, const char *tokenizer) {
    cli_opts o;
    cli_defaults(&o, 200);
    o.model = model;
    o.tokenizer = tokenizer;
    cli_session s;
    char err[512];
    fg_status st = cli_open(&o, 2, 0, &s, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen demo: %s\n", err);
        return 1;
    }
    const fg_llama_config *c = &s.model.config;
    fg_context *ctx = fg_runner_context(s.runner);
    printf("fastgen %s demo: %s (%d layers, %d query / %d KV heads, d=%d, %d tokens of context)\n", fg_version(),
           model, (int)c->n_layers, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_size, (int)c->seq_len);
    if (strstr(model, "stories260K"))
        printf("model: Karpathy's stories260K, trained on TinyStories; public source: github.com/karpathy/llama2.c\n"
               "(doc/stories260K.md; weights in the Hugging Face repo karpathy/tinyllamas, folder stories260K)\n");
    printf("\n");

    fg_compression_params cp[2];
    fg_compression_params_preset("full", &cp[0]);
    fg_compression_params_default(&cp[1]);
    const char *label[2] = {"full cache", "FastGen T=0.95"};
    int32_t *prompt = NULL, n_prompt = 0, seqs[2] = {-1, -1};
    int32_t *toks[2] = {malloc((size_t)c->seq_len * sizeof(int32_t)), malloc((size_t)c->seq_len * sizeof(int32_t))};
    float *logits = malloc(2 * (size_t)c->vocab_size * sizeof(float));
    int rc = 1, n_done = 0;
    if (!toks[0] || !toks[1] || !logits || (st = cli_encode(&s, o.prompt, &prompt, &n_prompt)) != FG_OK) {
        fprintf(stderr, "fastgen demo: %s\n", fg_status_string(st ? st : FG_ERR_OUT_OF_MEMORY));
        goto done;
    }
    /* the prompt and at least one generated token must fit the model's context */
    if (n_prompt >= c->seq_len) {
        fprintf(stderr, "fastgen demo: the %d-token prompt leaves no room in the model's context of %d tokens\n",
                (int)n_prompt, (int)c->seq_len);
        goto done;
    }
    const int32_t steps = c->seq_len - n_prompt < o.n ? c->seq_len - n_prompt : o.n;
    for (int b = 0; b < 2; b++) {
        memcpy(toks[b], prompt, (size_t)n_prompt * sizeof(int32_t));
        if ((st = fg_runner_prefill(s.runner, &cp[b], prompt, n_prompt, &seqs[b], logits + (size_t)b * c->vocab_size)))
            goto fail;
    }
    /* both sequences decode in the same batched call, each with its own policies */
    fg_sampler greedy = {0};
    double t0 = cli_now();
    for (int32_t i = 0; i < steps; i++, n_done++) {
        int32_t next[2];
        for (int b = 0; b < 2; b++)
            toks[b][n_prompt + i] = next[b] = fg_sample(&greedy, logits + (size_t)b * c->vocab_size, c->vocab_size);
        if (next[0] == s.tok.bos || next[1] == s.tok.bos || next[0] == s.tok.eos || next[1] == s.tok.eos)
            break;
        if ((st = fg_runner_decode(s.runner, 2, seqs, next, logits)))
            goto fail;
    }
    double t = cli_now() - t0;
    int32_t diverge = -1;
    for (int32_t i = 0; i < n_prompt + n_done && diverge < 0; i++)
        if (toks[0][i] != toks[1][i])
            diverge = i;
    for (int b = 0; b < 2; b++) {
        printf("%s:\n  ", label[b]);
        for (int32_t i = 1; i < n_prompt + n_done; i++) {
            const char *piece = fg_tokenizer_decode(&s.tok, toks[b][i - 1], toks[b][i]);
            for (const char *p = piece; *p; p++)
                fputs(*p == '\n' ? "\n  " : (char[2]){*p, 0}, stdout);
        }
        printf("\n\n");
    }
    if (diverge < 0)
        printf("identical text over %d generated tokens (greedy)\n", (int)n_done);
    else
        printf("the texts agree for %d of %d generated tokens, then diverge\n", (int)(diverge - n_prompt),
               (int)n_done);
    for (int b = 0; b < 2; b++) {
        fg_memory_stats m;
        fg_memory(ctx, seqs[b], &m);
        char held[32], full[32];
        cli_human_bytes((double)m.kv_bytes_held, held, sizeof held);
        cli_human_bytes((double)m.kv_bytes_full, full, sizeof full);
        printf("%-15s KV cache %s held vs %s full (%lld of %lld rows)\n", label[b], held, full,
               (long long)m.rows_kept, (long long)m.rows_full);
    }
    printf("\nFastGen policies per layer (profiled on the %d-token prompt):\n", (int)n_prompt);
    for (int32_t l = 0; l < c->n_layers; l++) {
        printf("  layer %d:", (int)l);
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            fg_head_info hi;
            char name[64];
            fg_head_inspect(ctx, seqs[1], l, g, &hi);
            fg_policy_name(hi.components, name, sizeof name);
            printf("  %s", name);
        }
        printf("\n");
    }
    printf("\n%d steps x 2 sequences in %.3f s (%.0f tokens/s); try `fastgen profile` and `fastgen eval`\n",
           (int)n_done, t, t > 0 ? 2.0 * n_done / t : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "fastgen demo: %s\n", cli_reason(s.runner, st));
done:
    free(prompt);
    free(toks[0]);
    free(toks[1]);
    free(logits);
    cli_close(&s);
    return rc;
}

int cmd_demo(int argc, char **argv) {
    int synthetic = argc > 0;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return demo_synthetic(argc, argv);
    char model[1024], tokenizer[1024];
    if (argc >= 2 && (!strcmp(argv[0], "-m") || !strcmp(argv[0], "--model"))) { /* a model of the user's */
        cli_opts o;
        cli_defaults(&o, 200);
        o.model = argv[1];
        if (argc == 4 && (!strcmp(argv[2], "-z") || !strcmp(argv[2], "--tokenizer")))
            o.tokenizer = argv[3];
        else if (argc != 2)
            return cli_usage("demo", "-m MODEL takes only -z TOKENIZER beside it");
        int rc = cli_need_model("demo", &o, model, tokenizer, sizeof model);
        return rc ? rc : demo_model(o.model, o.tokenizer);
    }
    if (!synthetic && cli_find_model(model, tokenizer, sizeof model))
        return demo_model(model, tokenizer);
    if (!synthetic)
        printf("no model found at $FASTGEN_MODEL, ../shared/models/ or ./models/ (stories260K.bin + tok512.bin from "
               "github.com/karpathy/llama2.c); running the synthetic workload\n\n");
    return demo_synthetic(argc, argv);
}
