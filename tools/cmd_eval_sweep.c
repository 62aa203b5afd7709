/* fastgen eval --sweep and --passkey: a driven method (fastgen-adaptive by
 * default) against the fixed policies and the peer methods, at KV memory
 * matched per prompt (docs/design.md §5.2).
 *
 * For every prompt the full cache makes a greedy reference. The driven
 * method runs at each budget; every other method then runs at the memory
 * the driven run kept on that prompt at that budget: its ratio is bisected
 * until its rows, summed over the same decode steps, match (a fixed policy's
 * row count depends only on its ratio, the lengths and the token classes,
 * so no run is needed to find it). Methods that take a budget themselves
 * (the FastGen budget modes) run at the budget instead.
 *
 * --sweep teacher-forces every run on the reference and reports, per memory
 * point and method: mean and max KL(full || compressed) of the next-token
 * distribution, top-1 agreement, the tokens before the first top-1
 * difference (where a free-running greedy decode would first part from the
 * full cache), and the paired difference of mean KL against the driven
 * method with a bootstrap 95% interval over the prompts.
 *
 * --passkey decodes greedily from each prompt (a number hidden in filler,
 * asked for at the end, or in a turn appended after it) and counts the runs
 * whose answer holds the number (or the share of several references it
 * holds, eval_answer_score). Several questions about one document: the
 * document is prefilled and compressed once and forked for each (the
 * serving shape; a method that defers its compression past the document
 * compresses in each fork instead), each run's accuracy the share of them
 * answered. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/sweep.h"

static const float k_default_budgets[] = {0.25f, 0.35f, 0.5f, 0.65f, 0.8f, 0.9f};
static const char *const k_default_methods[] = {"fastgen-adaptive", "h2o", "streamingllm", "tova", "snapkv", "adakv"};

/* ---------------------------------------------------------------- runs */

/* KL(full || compressed) of one step. */
static double step_kl(const float *full, const float *comp, int32_t V) {
    const double lf = cli_logsumexp(full, V), lc = cli_logsumexp(comp, V);
    double kl = 0.0;
    for (int32_t v = 0; v < V; v++) {
        const double a = full[v] - lf;
        kl += exp(a) * (a - (comp[v] - lc));
    }
    return kl > 0.0 ? kl : 0.0;
}

/* Whether `text` holds `ref` (n bytes), ASCII letters in either case. */
static int holds(const char *text, const char *ref, size_t n) {
    for (; *text; text++) {
        size_t i = 0;
        while (i < n && text[i] && tolower((unsigned char)text[i]) == tolower((unsigned char)ref[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

double eval_answer_score(const char *answer, const char *key) {
    int32_t found = 0, refs = 0;
    for (const char *r = key;; r++) {
        const char *end = strchr(r, '|');
        const size_t len = end ? (size_t)(end - r) : strlen(r);
        found += holds(answer, r, len);
        refs++;
        if (!end)
            break;
        r = end;
    }
    return (double)found / refs;
}

/* The steps of n runs (sequences seqs, results out[i]) from the logits
 * each has in w->logits: teacher-forced on the reference (--sweep), or each
 * decoding its own greedy tokens until it stops or has n_steps of them
 * (--passkey: question q's score added, eval_answer_score). `last`: the
 * token before the first step. Memory is sampled before every step, into
 * held and full. */
static fg_status steps(sweep *w, fgm_runner *r, const int32_t *seqs, int32_t n, int32_t q, int32_t last,
                       double *held, double *full, sw_result **out) {
    fg_context *ctx = fgm_runner_context(r);
    int32_t toks[SW_MAX_METHODS * SW_MAX_POINTS];
    char answer[SW_MAX_METHODS * SW_MAX_POINTS][256];
    int32_t alen[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    int done[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    const int32_t V = w->vocab;
    fg_status st = FG_OK;
    for (int i = 0; i < n; i++)
        answer[i][0] = '\0';
    for (int32_t t = 0; t < w->n_steps; t++) {
        int32_t live[SW_MAX_METHODS * SW_MAX_POINTS], ids[SW_MAX_METHODS * SW_MAX_POINTS], m = 0;
        for (int i = 0; i < n; i++) {
            fg_memory_stats ms;
            fg_memory(ctx, seqs[i], &ms);
            held[i] += (double)ms.rows_kept;
            full[i] += (double)ms.rows_full;
            const float *lg = w->logits + (size_t)i * V;
            if (!w->passkey) {
                const double kl = step_kl(w->ref_logits + (size_t)t * V, lg, V);
                out[i]->kl += kl;
                out[i]->kl_max = kl > out[i]->kl_max ? kl : out[i]->kl_max;
                const int same = cli_argmax(lg, V) == cli_argmax(w->ref_logits + (size_t)t * V, V);
                out[i]->top1 += same;
                if (!same && out[i]->agree < 0)
                    out[i]->agree = t;
                toks[i] = w->ref[t];
            } else if (!done[i]) {
                const int32_t prev = t ? toks[i] : last;
                toks[i] = cli_argmax(lg, V);
                const char *piece = fgm_tokenizer_decode(&w->s.tok, prev, toks[i]);
                done[i] = toks[i] == w->s.tok.eos || w->s.tok.control[toks[i]]; /* end of text, or of the turn */
                for (const char *c = piece; c && *c && alen[i] < (int32_t)sizeof answer[i] - 1; c++)
                    answer[i][alen[i]++] = *c;
                answer[i][alen[i]] = '\0';
            }
            if (!done[i]) {
                live[m] = i;
                ids[m++] = seqs[i];
            }
        }
        if (t + 1 == w->n_steps || m == 0)
            break;
        int32_t mt[SW_MAX_METHODS * SW_MAX_POINTS];
        for (int j = 0; j < m; j++)
            mt[j] = toks[live[j]];
        if ((st = fgm_runner_decode(r, m, ids, mt, w->logits)) != FG_OK)
            break;
        for (int j = m - 1; j >= 0; j--) /* row j to row live[j] >= j, the last first */
            if (live[j] != j)
                memcpy(w->logits + (size_t)live[j] * V, w->logits + (size_t)j * V, (size_t)V * sizeof *w->logits);
    }
    for (int i = 0; w->passkey && i < n; i++)
        out[i]->correct += eval_answer_score(answer[i], w->key[q]);
    return st;
}

/* Runs n configurations (params cps, results out[i]) on one prompt and its
 * questions (steps). Several questions: each asked of a fork of every
 * configuration's compressed prompt, the forks released after it. */
static fg_status run_batch(sweep *w, fgm_runner *r, const int32_t *prompt, int32_t n_prompt, int32_t n,
                           const fg_compression_params *cps, sw_result **out) {
    int32_t seqs[SW_MAX_METHODS * SW_MAX_POINTS], kids[SW_MAX_METHODS * SW_MAX_POINTS];
    double held[SW_MAX_METHODS * SW_MAX_POINTS] = {0}, full[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    const int32_t V = w->vocab;
    fg_status st = fgm_runner_prefill_many(r, n, cps, prompt, n_prompt, seqs, w->logits);
    if (st)
        return st;
    int32_t recon[SW_MAX_METHODS * SW_MAX_POINTS], n_recon = 0; /* observe=reconstruct: one pass for them all */
    for (int i = 0; i < n; i++)
        if (cps[i].allocation == FG_ALLOC_ADAPTIVE && cps[i].observe == FG_OBSERVE_EXPLICIT)
            recon[n_recon++] = seqs[i];
    if (n_recon > 0) { /* the prompt again after the instruction, without the sequence's start */
        const int32_t skip = prompt[0] == w->s.tok.bos;
        const double t0 = cli_now();
        st = fgm_runner_reconstruct(r, n_recon, recon, w->recon, w->n_recon, prompt + skip, n_prompt - skip, NULL);
        w->t_recon += cli_now() - t0;
        w->n_recons++;
    }
    for (int i = 1; i < n; i++) /* the prompt's logits: the same under every policy */
        memcpy(w->logits + (size_t)i * V, w->logits, (size_t)V * sizeof *w->logits);
    for (int i = 0; i < n; i++) {
        memset(out[i], 0, sizeof *out[i]);
        out[i]->agree = -1;
    }
    const int forked = w->n_q > 1;
    for (int32_t q = 0; q < w->n_q && st == FG_OK; q++) {
        const int32_t *on = seqs;
        int32_t n_kids = 0;
        if (forked) {
            for (; n_kids < n && st == FG_OK; n_kids++)
                st = fgm_runner_fork(r, seqs[n_kids], &kids[n_kids]);
            n_kids -= st != FG_OK; /* the fork that failed made no sequence */
            on = kids;
        }
        for (int i = 0; i < n && st == FG_OK && w->n_turn[q] > 0; i++) /* the turn, on each cache as it is */
            st = fgm_runner_append(r, on[i], w->turn[q], w->n_turn[q], w->logits + (size_t)i * V);
        if (st == FG_OK)
            st = steps(w, r, on, n, q, w->n_turn[q] > 0 ? w->turn[q][w->n_turn[q] - 1] : prompt[n_prompt - 1],
                       held, full, out);
        for (int i = 0; i < n_kids; i++)
            fgm_runner_release(r, kids[i]);
    }
    for (int i = 0; i < n; i++) {
        const double n_steps = w->n_steps;
        out[i]->kl /= n_steps;
        out[i]->top1 /= n_steps;
        out[i]->kept = full[i] > 0 ? held[i] / full[i] : 1.0;
        out[i]->agree = out[i]->agree < 0 ? w->n_steps : out[i]->agree;
        out[i]->correct /= w->n_q;
        out[i]->made = st == FG_OK; /* a run that failed is not one */
        fgm_runner_release(r, seqs[i]);
    }
    return st;
}

/* The full cache's greedy reference: logits before each of n_steps tokens. */
static fg_status reference(sweep *w, const int32_t *prompt, int32_t n_prompt) {
    fg_compression_params cp;
    fg_compression_params_preset("full", &cp);
    int32_t seq = -1;
    const int32_t V = w->vocab;
    const double t0 = cli_now();
    fg_status st = fgm_runner_prefill(w->s.runner, &cp, prompt, n_prompt, &seq, w->ref_logits);
    w->t_prefill += cli_now() - t0;
    w->n_prefill++;
    if (st == FG_OK && w->n_turn[0] > 0) /* the first question's */
        st = fgm_runner_append(w->s.runner, seq, w->turn[0], w->n_turn[0], w->ref_logits);
    for (int32_t t = 0; st == FG_OK && t < w->n_steps; t++) {
        w->ref[t] = cli_argmax(w->ref_logits + (size_t)t * V, V);
        if (t + 1 < w->n_steps)
            st = fgm_runner_decode(w->s.runner, 1, &seq, &w->ref[t], w->ref_logits + (size_t)(t + 1) * V);
    }
    if (seq >= 0)
        fgm_runner_release(w->s.runner, seq);
    return st;
}

/* One prompt: the reference, the driven method at every budget, then every
 * other method at the memory each driven run kept. */
static fg_status sweep_prompt(sweep *w, int32_t p, const char *text, const eval_passkey *pk) {
    int32_t *prompt = NULL, n_prompt = 0;
    fg_status st = cli_encode(&w->s, text, &prompt, &n_prompt);
    w->n_q = pk ? pk->n : 1;
    for (int32_t q = 0; q < w->n_q; q++) {
        w->key[q] = pk ? pk->key[q] : NULL;
        w->turn[q] = NULL;
        w->n_turn[q] = 0;
        if (st == FG_OK && pk && pk->turn[q])
            st = cli_encode_more(&w->s, pk->turn[q], &w->turn[q], &w->n_turn[q]);
        if (st == FG_OK && n_prompt + w->n_turn[q] + w->n_steps > w->ctx_len)
            st = FG_ERR_CAPACITY;
    }
    /* the classes and the lengths the other methods are matched at: the first question's (the driven
     * run's kept share is over every question's decode; the turns differ by a few tokens) */
    const int32_t n_turn = w->n_turn[0];
    if (st == FG_OK)
        st = reference(w, prompt, n_prompt);
    /* the classes of the prompt, the second turn and the reference, and the special tokens before each length */
    const int32_t n_all = n_prompt + n_turn + w->n_steps;
    int32_t *all = malloc((size_t)n_all * sizeof *all);
    int32_t *spec = malloc((size_t)(n_all + 1) * sizeof *spec);
    fg_compression_params cps[SW_MAX_METHODS * SW_MAX_POINTS];
    sw_result *outs[SW_MAX_METHODS * SW_MAX_POINTS];
    if (!all || !spec)
        st = FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) {
        memcpy(all, prompt, (size_t)n_prompt * sizeof *all);
        if (n_turn > 0)
            memcpy(all + n_prompt, w->turn[0], (size_t)n_turn * sizeof *all);
        memcpy(all + n_prompt + n_turn, w->ref, (size_t)w->n_steps * sizeof *all);
        st = fg_token_classes_classify(fgm_runner_classes(w->s.runner), all, n_all, 4, w->cls);
        spec[0] = 0;
        for (int32_t t = 0; t < n_all; t++)
            spec[t + 1] = spec[t] + (w->cls[t] == FG_TOKEN_SPECIAL);
    }
    /* per cache dtype: the driven method, then the others (a batch each) */
    const int64_t t0 = n_prompt + n_turn, t1 = t0 + w->n_steps; /* the lengths memory was sampled at */
    for (int32_t di = 0; st == FG_OK && di < w->n_dt; di++) {
        int n = 0;
        for (int32_t b = 0; b < w->n_points; b++, n++) {
            sweep_method_params(w->methods[0], row_budget(w, di, b), &cps[n]);
            outs[n] = result(w, di, p, 0, b);
        }
        st = run_batch(w, w->runners[di], prompt, n_prompt, n, cps, outs);
        w->failed = st ? w->runners[di] : NULL;
        n = 0;
        for (int32_t m = 1; st == FG_OK && m < w->n_methods; m++)
            for (int32_t b = 0; b < w->n_points; b++, n++) {
                if (!sweep_matched_params(w->methods[m], result(w, di, p, 0, b)->kept, t0, t1, n_prompt, spec, &cps[n]))
                    sweep_method_params(w->methods[m], row_budget(w, di, b), &cps[n]);
                outs[n] = result(w, di, p, m, b);
            }
        if (st == FG_OK && n > 0) {
            st = run_batch(w, w->runners[di], prompt, n_prompt, n, cps, outs);
            w->failed = st ? w->runners[di] : NULL;
        }
    }
    free(all);
    free(spec);
    free(prompt);
    for (int32_t q = 0; q < w->n_q; q++) {
        free(w->turn[q]);
        w->turn[q] = NULL;
        w->n_turn[q] = 0;
    }
    return st;
}

/* ---------------------------------------------------------------- driver */

static int parse_list(const char *text, const char **names, float *values, int32_t max, int32_t *n, char *buf,
                      size_t buf_size) {
    *n = 0;
    if (strlen(text) >= buf_size) /* refused whole, never cut */
        return 0;
    snprintf(buf, buf_size, "%s", text);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == max)
            return 0;
        if (names) {
            names[(*n)++] = tok;
        } else {
            float v = 0.0f;
            if (!cli_parse_float(tok, 0.0f, 1.0f, &v) || v == 0.0f)
                return 0;
            values[(*n)++] = v;
        }
    }
    return *n > 0;
}

int eval_sweep(const cli_opts *o, const eval_sweep_opts *x, char **prompts, const eval_passkey *passkeys,
               int32_t n_prompts) {
    sweep w;
    memset(&w, 0, sizeof w);
    w.x = x;
    static char mbuf[1024], bbuf[256];
    if (x->methods) {
        if (!parse_list(x->methods, w.methods, NULL, SW_MAX_METHODS, &w.n_methods, mbuf, sizeof mbuf))
            return cli_usage("eval", "--methods takes 1 to %d comma-separated policy names", SW_MAX_METHODS);
    } else {
        w.n_methods = (int32_t)(sizeof k_default_methods / sizeof k_default_methods[0]);
        memcpy(w.methods, k_default_methods, sizeof k_default_methods);
    }
    if (x->budgets) {
        if (!parse_list(x->budgets, NULL, w.budgets, SW_MAX_POINTS, &w.n_points, bbuf, sizeof bbuf))
            return cli_usage("eval", "--budgets takes 1 to %d comma-separated fractions in (0, 1]", SW_MAX_POINTS);
    } else {
        w.n_points = (int32_t)(sizeof k_default_budgets / sizeof k_default_budgets[0]);
        memcpy(w.budgets, k_default_budgets, sizeof k_default_budgets);
    }
    for (int32_t m = 0; m < w.n_methods; m++) {
        fg_compression_params cp;
        if (!sweep_method_params(w.methods[m], 0.5, &cp))
            return cli_usage("eval", "--methods: \"%s\" is not a policy a sweep can drive (a preset that takes a "
                                     "budget, or a one-entry preset, with options each after a colon: window=, "
                                     "defer=, floor=, pool=, sink=, families=, flags=, tol=, observe=, alloc=)", w.methods[m]);
    }
    w.n_dt = 1;
    w.dts[0] = o->dtype;
    w.by_bytes = x->dtypes != NULL;
    if (x->dtypes && o->v_dtype >= 0)
        return cli_usage("eval", "--dtypes stores K and V in each type it names: -ctk / -ctv do not go with it");
    if (x->dtypes) {
        char dbuf[128];
        if (strlen(x->dtypes) >= sizeof dbuf)
            return cli_usage("eval", "--dtypes takes up to %d of f32, f16, bf16, q8_0, q4_0, comma-separated",
                             SW_MAX_DTYPES);
        snprintf(dbuf, sizeof dbuf, "%s", x->dtypes);
        w.n_dt = 0;
        for (char *tok = strtok(dbuf, ","); tok; tok = strtok(NULL, ",")) {
            if (w.n_dt == SW_MAX_DTYPES || fg_dtype_parse(tok, &w.dts[w.n_dt]) != FG_OK)
                return cli_usage("eval", "--dtypes takes up to %d of f32, f16, bf16, q8_0, q4_0, comma-separated: %s",
                                 SW_MAX_DTYPES, x->dtypes);
            w.n_dt++;
        }
    }
    w.n_cfg = (w.n_methods > 1 ? w.n_methods - 1 : 1) * w.n_points;
    if (w.n_points > w.n_cfg)
        w.n_cfg = w.n_points;
    w.n_steps = o->n;
    w.n_prompts = n_prompts;
    w.passkey = passkeys != NULL;
    int forks = 0; /* some prompt has several questions: every configuration forked for each */
    for (int32_t p = 0; passkeys && p < n_prompts; p++)
        forks |= passkeys[p].n > 1;

    int reconstruct = 0; /* some method reconstructs its prompt: the runner holds it twice */
    for (int32_t m = 0; m < w.n_methods; m++) {
        fg_compression_params cp;
        reconstruct |= sweep_method_params(w.methods[m], 0.5, &cp) && cp.observe == FG_OBSERVE_EXPLICIT;
    }
    char err[512];
    fg_status st = cli_load(o, &w.s, err, sizeof err);
    int32_t longest = 0, longest_doc = 0;
    for (int32_t p = 0; st == FG_OK && p < n_prompts; p++) {
        int32_t *ids = NULL, n = 0;
        if (cli_encode(&w.s, prompts[p], &ids, &n) == FG_OK)
            for (int32_t q = 0; passkeys && q < passkeys[p].n && passkeys[p].turn[q]; q++) {
                int32_t *more = NULL, n_more = 0;
                cli_encode_more(&w.s, passkeys[p].turn[q], &more, &n_more);
                longest = n + n_more > longest ? n + n_more : longest;
                free(more);
            }
        longest = n > longest ? n : longest;
        longest_doc = n > longest_doc ? n : longest_doc;
        free(ids);
    }
    if (st == FG_OK && reconstruct) { /* KVzip's instruction, in the chat's form where the prompts have one */
        int chat = 0;
        for (int32_t p = 0; p < n_prompts; p++)
            chat |= strstr(prompts[p], "<|im_start|>") != NULL;
        st = cli_reconstruct_prefix(&w.s, chat, &w.recon, &w.n_recon);
        if (st == FG_OK && longest_doc * 2 + w.n_recon > longest) /* the document again after it, at once */
            longest = longest_doc * 2 + w.n_recon;
    }
    /* the reference's runner (--dtype), and one per other dtype of --dtypes */
    for (int32_t di = -1; st == FG_OK && di < w.n_dt; di++) {
        if (di >= 0 && w.dts[di] == o->dtype) {
            w.runners[di] = w.s.runner;
            continue;
        }
        fgm_runner_params rp = {.backend = o->backend, .max_seqs = (forks ? 2 : 1) * w.n_cfg, .max_len = longest + o->n,
                                .q8_activations = o->q8_activations, .prefill_chunk = o->prefill_chunk,
                                .n_threads = o->threads};
        cli_runner_dtypes(o, &rp); /* the reference's: --dtype, or -ctk / -ctv */
        if (di >= 0)
            rp.kv_dtype = w.dts[di];
        st = fgm_runner_create(&w.s.model, &w.s.tok, &rp, di < 0 ? &w.s.runner : &w.runners[di], err, sizeof err);
        if (st == FG_OK)
            st = cli_attach_scorer(o, &w.s, di < 0 ? w.s.runner : w.runners[di], err, sizeof err);
    }
    for (int32_t di = 0; st == FG_OK && di < w.n_dt; di++) {
        const int32_t hd = w.s.model.config.head_size;
        w.bytes[di] = (double)fg_kv_row_bytes(w.dts[di], hd) / (double)fg_kv_row_bytes(o->dtype, hd);
    }
    int rc = 1;
    if (st) {
        fprintf(stderr, "fastgen eval: %s\n", err);
        goto done;
    }
    w.vocab = w.s.model.config.vocab_size;
    w.ctx_len = longest + o->n < w.s.model.config.seq_len ? longest + o->n : w.s.model.config.seq_len;
    w.ref = malloc((size_t)o->n * sizeof *w.ref);
    w.ref_logits = malloc((size_t)o->n * w.vocab * sizeof *w.ref_logits);
    w.logits = malloc((size_t)w.n_cfg * w.vocab * sizeof *w.logits);
    w.cls = malloc((size_t)w.ctx_len + 1);
    w.res = calloc((size_t)w.n_dt * n_prompts * w.n_methods * w.n_points, sizeof *w.res);
    if (!w.ref || !w.ref_logits || !w.logits || !w.cls || !w.res) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        goto done;
    }
    const int show = !o->quiet && isatty(2);
    const double t0 = cli_now();
    int32_t n_done = 0;
    for (int32_t p = 0; p < n_prompts; p++) {
        if (show) {
            fprintf(stderr, "\r  prompt %d/%d", (int)p + 1, (int)n_prompts);
            fflush(stderr);
        }
        st = sweep_prompt(&w, p, prompts[p], passkeys ? &passkeys[p] : NULL);
        if (st == FG_ERR_CAPACITY) {
            fprintf(stderr, "fastgen eval: prompt %d plus %d tokens does not fit the context; skipped\n", (int)p + 1,
                    (int)o->n);
            continue;
        }
        if (st) {
            fprintf(stderr, "fastgen eval: %s\n", cli_reason(w.failed ? w.failed : w.s.runner, st));
            goto done;
        }
        n_done++;
    }
    if (show)
        fprintf(stderr, "\n");
    if (n_done == 0) {
        fprintf(stderr, "fastgen eval: no prompt fits the context with -n %d; nothing to report\n", (int)o->n);
        goto done;
    }
    rc = sweep_report(&w, o, cli_now() - t0, w.passkey);
done:
    free(w.recon);
    free(w.ref);
    free(w.ref_logits);
    free(w.logits);
    free(w.cls);
    free(w.res);
    for (int32_t di = 0; di < w.n_dt; di++)
        if (w.runners[di] && w.runners[di] != w.s.runner)
            fgm_runner_destroy(&w.runners[di]);
    cli_close(&w.s);
    return rc;
}
