/* fastgen eval: quality against memory on a real model (docs/design.md §5.2).
 *
 * For every prompt, the full cache generates a greedy reference of N tokens.
 * Every policy is then teacher-forced on that reference and compared with
 * the full model's next-token distributions step by step. Phase 1 runs
 * FastGen at each T; phase 2 runs each baseline at the KV memory FastGen
 * kept on that prompt at that T (its ratio set to FastGen's time-averaged
 * kept fraction). All sequences of a phase decode together in one batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/cmd_eval_chat.h"
#include "tools/cmd_eval_sweep.h"
#include "tools/svg.h"
#include "model/io.h"

#define N_T 3
static const float k_T[N_T] = {0.90f, 0.95f, 0.98f};
#define N_BASE 4
static const char *const k_base[N_BASE] = {"streamingllm", "h2o", "local", "frequent"};
#define N_CFG (N_T * (1 + N_BASE))
#define BATCH (N_BASE * N_T) /* sequences teacher-forced together */

typedef struct eval_acc {
    double kl_sum, kl_max, nll_sum, nll_full_sum, rec_sum, kept_sum;
    int64_t steps, top1;
    int32_t prompts;
} eval_acc;

typedef struct eval_state {
    cli_session s;
    int32_t n_steps, vocab;
    float *ref_logits;  /* [N][vocab] full-cache logits before each reference token */
    int32_t *ref;       /* [N] reference tokens */
    float *logits;      /* [BATCH][vocab] */
    eval_acc acc[N_CFG];
} eval_state;

static const char *cfg_family(int i) { return i < N_T ? "fastgen" : k_base[(i - N_T) / N_T]; }
static int cfg_t(int i) { return i % N_T; }

static void cfg_name(int i, char *buf, size_t n) {
    if (i < N_T)
        snprintf(buf, n, "fastgen T=%.2f", (double)k_T[i]);
    else
        snprintf(buf, n, "%s @ T=%.2f mem", cfg_family(i), (double)k_T[cfg_t(i)]);
}

static double log_softmax_at(const float *logits, int32_t vocab, int32_t i, double *lse_out) {
    const double lse = cli_logsumexp(logits, vocab);
    if (lse_out)
        *lse_out = lse;
    return logits[i] - lse;
}

/* Compares step `t` of configuration `c` (logits) with the reference. */
static void score_step(eval_state *e, int c, int32_t t, const float *logits) {
    const int32_t V = e->vocab;
    const float *pf = e->ref_logits + (size_t)t * V;
    double lse_f, lse_c;
    log_softmax_at(pf, V, 0, &lse_f);
    log_softmax_at(logits, V, 0, &lse_c);
    double kl = 0.0;
    for (int32_t v = 0; v < V; v++) {
        double lf = pf[v] - lse_f, lc = logits[v] - lse_c;
        kl += exp(lf) * (lf - lc);
    }
    eval_acc *a = &e->acc[c];
    a->kl_sum += kl;
    a->kl_max = kl > a->kl_max ? kl : a->kl_max;
    a->nll_sum -= logits[e->ref[t]] - lse_c;
    a->nll_full_sum -= pf[e->ref[t]] - lse_f;
    a->top1 += cli_argmax(logits, V) == cli_argmax(pf, V);
    a->steps++;
}

/* Teacher-forces the configurations cfg[0..n) with params cp[0..n) on the
 * reference; their time-averaged kept fraction goes to kept[0..n). */
static fg_status run_phase(eval_state *e, const int32_t *prompt, int32_t n_prompt, int n, const int *cfg,
                           const fg_compression_params *cp, double *kept) {
    fg_context *ctx = fgm_runner_context(e->s.runner);
    int32_t seqs[N_CFG];
    fg_status st = FG_OK;
    int made = 0;
    if ((st = fgm_runner_prefill_many(e->s.runner, n, cp, prompt, n_prompt, seqs, e->logits)) != FG_OK)
        goto out;
    made = n;
    for (int i = 1; i < n; i++) /* the prompt's logits: the same under every policy */
        memcpy(e->logits + (size_t)i * e->vocab, e->logits, (size_t)e->vocab * sizeof *e->logits);
    double held[N_CFG] = {0}, full[N_CFG] = {0};
    int32_t toks[N_CFG];
    for (int32_t t = 0; t < e->n_steps; t++) {
        for (int i = 0; i < n; i++) {
            score_step(e, cfg[i], t, e->logits + (size_t)i * e->vocab);
            toks[i] = e->ref[t];
        }
        if (t + 1 == e->n_steps)
            break;
        if ((st = fgm_runner_decode(e->s.runner, n, seqs, toks, e->logits)))
            goto out;
        for (int i = 0; i < n; i++) {
            fg_memory_stats m;
            fg_memory(ctx, seqs[i], &m);
            held[i] += (double)m.kv_bytes_held;
            full[i] += (double)m.kv_bytes_full;
        }
    }
    for (int i = 0; i < n; i++) {
        kept[i] = full[i] > 0 ? held[i] / full[i] : 1.0;
        eval_acc *a = &e->acc[cfg[i]];
        a->kept_sum += kept[i];
        a->rec_sum += fgm_runner_recovery(e->s.runner, seqs[i]);
        a->prompts++;
    }
out:
    for (int i = 0; i < made; i++)
        fgm_runner_release(e->s.runner, seqs[i]);
    return st;
}

/* Rows a one-entry baseline keeps at length t, by the library's w(t) and
 * k(t) (its budgets are deterministic; the stories have no special token
 * after BOS, which the sinks hold). h2o splits r between its window and its
 * heavy hitters. */
static int64_t baseline_rows(const char *family, double r, int64_t t, int32_t n_sink) {
    const int split = !strcmp(family, "h2o");
    const fg_policy e = {0, (float)(split ? r / 2 : r), (float)(split ? r / 2 : r), 0, 0};
    int32_t w, k;
    if (fg_policy_rows(&e, (int32_t)t, &w, &k) != FG_OK)
        return t;
    const int64_t rows = split                           ? (int64_t)w + k
                         : !strcmp(family, "streamingllm") ? (int64_t)n_sink + w
                         : !strcmp(family, "local")        ? w
                                                           : k;
    return rows < t ? rows : t;
}

/* The baseline `family` with the ratio whose rows, summed over the lengths
 * t in [t0, t1), come closest to rho of the full cache's (bisection). */
static void baseline_params(const char *family, double rho, int32_t t0, int32_t t1, fg_compression_params *cp) {
    fg_compression_params_preset(family, cp);
    int64_t full = 0;
    for (int64_t t = t0; t < t1; t++)
        full += t;
    double lo = 0.0, hi = 1.0;
    int64_t rows_lo = 0, rows_hi = 0; /* lo keeps fewer rows than the target, hi at least as many */
    for (int it = 0; it < 40; it++) {
        double mid = 0.5 * (lo + hi);
        int64_t rows = 0;
        for (int64_t t = t0; t < t1; t++)
            rows += baseline_rows(family, mid, t, cp->n_sink);
        if ((double)rows < rho * (double)full)
            lo = mid, rows_lo = rows;
        else
            hi = mid, rows_hi = rows;
    }
    if (rows_hi > 0 && (double)rows_hi - rho * (double)full < rho * (double)full - (double)rows_lo)
        lo = hi; /* the closer of the two */
    fg_policy *p = &cp->shortlist[0];
    if (!strcmp(family, "h2o"))
        p->ratio_local = p->ratio_frequent = (float)(lo / 2);
    else if (!strcmp(family, "streamingllm") || !strcmp(family, "local"))
        p->ratio_local = (float)lo;
    else
        p->ratio_frequent = (float)lo;
}

static fg_status eval_prompt(eval_state *e, const char *text) {
    int32_t *prompt = NULL, n_prompt = 0, seq = -1;
    fg_status st = cli_encode(&e->s, text, &prompt, &n_prompt);
    if (st) {
        fprintf(stderr, "fastgen eval: cannot encode a prompt: %s\n", fg_status_string(st));
        return st;
    }
    const int32_t V = e->vocab;
    if (n_prompt + e->n_steps > e->s.model.config.seq_len) {
        free(prompt);
        return FG_ERR_CAPACITY;
    }
    /* the full-cache greedy reference */
    fg_compression_params cp[N_CFG];
    fg_compression_params_preset("full", &cp[0]);
    st = fgm_runner_prefill(e->s.runner, &cp[0], prompt, n_prompt, &seq, e->ref_logits);
    for (int32_t t = 0; st == FG_OK && t < e->n_steps; t++) {
        e->ref[t] = cli_argmax(e->ref_logits + (size_t)t * V, V);
        if (t + 1 < e->n_steps)
            st = fgm_runner_decode(e->s.runner, 1, &seq, &e->ref[t], e->ref_logits + (size_t)(t + 1) * V);
    }
    if (seq >= 0)
        fgm_runner_release(e->s.runner, seq);
    int cfg[N_CFG];
    double kept[N_CFG];
    /* phase 1: FastGen at each T */
    for (int i = 0; i < N_T; i++) {
        fg_compression_params_default(&cp[i]);
        cp[i].threshold = k_T[i];
        cfg[i] = i;
    }
    if (st == FG_OK)
        st = run_phase(e, prompt, n_prompt, N_T, cfg, cp, kept);
    /* phase 2: every baseline at the memory of each FastGen run */
    double rho[N_T];
    memcpy(rho, kept, sizeof rho);
    for (int b = 0; b < N_BASE; b++)
        for (int t = 0; t < N_T; t++) {
            int i = b * N_T + t;
            cfg[i] = N_T + i;
            /* memory is sampled after each decode step: lengths n_prompt + 1 .. n_prompt + N - 1 */
            baseline_params(k_base[b], rho[t], n_prompt + 1, n_prompt + e->n_steps, &cp[i]);
        }
    if (st == FG_OK)
        st = run_phase(e, prompt, n_prompt, N_BASE * N_T, cfg, cp, kept);
    if (st)
        fprintf(stderr, "fastgen eval: %s\n", cli_reason(e->s.runner, st));
    free(prompt);
    return st;
}

static const char *k_eval_help =
    "usage: fastgen eval [options]\n"
    "\n"
    "Quality against memory on a real model. For each prompt the full cache makes\n"
    "a greedy reference of N tokens; FastGen at T = 0.90, 0.95, 0.98 and, at the\n"
    "KV memory each FastGen run kept, StreamingLLM, H2O, local-only and\n"
    "frequent-only are teacher-forced on it. Reported per policy: mean and max\n"
    "KL(full || compressed) of the next-token distribution, top-1 agreement,\n"
    "perplexity ratio, attention recovered while decoding (against the full\n"
    "cache) and KV bytes held / full (pages of one token, so bytes = rows).\n"
    "\n"
    "options:\n"
    "  -m, --model FILE     GGUF file or llama2.c checkpoint (default: found as for generate)\n"
    "  -z, --tokenizer FILE llama2.c tokenizer (default: tok512.bin beside the model)\n"
    "  --prompts FILE       one prompt per line, \\n for a newline in one; - for standard input\n"
    "                       (default: 32 story openings built into fastgen, tools/prompts.txt)\n"
    "  --limit K            only the first K prompts (--chat: conversations)\n"
    "  -n, --steps N        reference tokens per prompt (default 128)\n"
    "  --backend NAME       ref | cpu | cuda | hip (default cpu)\n"
    "  --dtype NAME         f32 | f16 | bf16 | q8_0 | q4_0 KV cache storage (default f16)\n"
    "  -t, --threads N      CPU threads (default: the cores this process may run on)\n"
    "  --q8-activations     q4_0 / q4_1 / q5_0 / q5_1 / q8_0 weights: 8-bit activations, integer dots (ggml's scheme;\n"
    "                       the default)\n"
    "  --f32-activations    f32 activations against the dequantized weights instead\n"
    "  --prefill-chunk N    prompts through the model N tokens at a time (fg_prefill_chunk)\n"
    "  --csv | --json       machine-readable results instead of the table\n"
    "  --svg FILE           quality vs memory, one line per policy\n"
    "  --sweep              the adaptive mode against the fixed policies and the peer methods at\n"
    "                       memory matched per prompt: fastgen-adaptive at each budget, then h2o,\n"
    "                       streamingllm, tova, snapkv and adakv at the KV memory it kept on that\n"
    "                       prompt (their ratio bisected); per point mean and max KL, top-1, tokens\n"
    "                       before the first top-1 difference, and the paired KL difference with a\n"
    "                       bootstrap 95% interval over the prompts\n"
    "  --methods LIST       --sweep / --passkey: comma-separated presets, the driven one first, each with\n"
    "                       options after colons (fastgen-adaptive:window=64:defer=64; window, defer,\n"
    "                       floor, pool (snapkv, adakv), sink, families=DIGITS,\n"
    "                       flags=per-layer+mass+end+tail+rowmax+rownorm, tol=X (a quality target:\n"
    "                       the fewest rows predicted within X of the least's error, the budget a cap),\n"
    "                       observe=tail|reconstruct|predicted|scores: fastgen-adaptive judged by the\n"
    "                       prompt's last rows, by a pass that repeats the prompt after an instruction to\n"
    "                       (KVzip's idea), whose cost is printed, by the last rows advanced by RoPE over\n"
    "                       the next horizon=N positions (default 512; ExpectedAttention's idea), or its\n"
    "                       keys ranked by the model's scorer (--scorer, MODEL.fgscore: fastgen calibrate)\n"
    "                       and judged by the last rows; a method named fastgen-adaptive stays the tail's\n"
    "                       alloc=shortlist|layer: a one-entry preset's\n"
    "                       heads ranked each alone, or by their layer's mean as one (tova's default))\n"
    "  --budgets LIST       --sweep / --passkey: the driven method's budgets (default\n"
    "                       0.25,0.35,0.5,0.65,0.8,0.9)\n"
    "  --dtypes LIST        --sweep / --passkey: every method on caches of each dtype (f16,q8_0,q4_0),\n"
    "                       the budgets then bytes of the full --dtype cache, which makes the\n"
    "                       reference: a dtype runs at rows min(1, budget / its bytes per row)\n"
    "  --passkey FILE       retrieval instead: each line KEY<TAB>PROMPT, the prompt hiding KEY; every\n"
    "                       method as --sweep, -n greedy tokens at most (default 12); a run scores 1 when\n"
    "                       its answer holds KEY (ASCII letters in either case), or with KEY=A|B|C the\n"
    "                       share of A, B and C it holds (each as written, spaces included).\n"
    "                       KEY<TAB>DOCUMENT<TAB>TURN on every line: the document prefilled (and\n"
    "                       compressed) alone, the turn that asks appended after it; up to 7 more\n"
    "                       KEY<TAB>TURN after it: the compressed document forked for each question,\n"
    "                       the score their mean (scripts/needle.py and scripts/ruler.py write these)\n"
    "  -q, --quiet          no progress bar (none either when stderr is not a terminal)\n"
    "  --chat FILE          multi-turn instead: the conversations of FILE (user turns separated by blank\n"
    "                       lines, conversations by lines of ---) answered by the full cache (-n tokens\n"
    "                       a reply at most, default 32), then FastGen at T = 0.90, 0.95, 0.98 with\n"
    "                       --append keep and reprofile teacher-forced on them: KL and top-1 at the\n"
    "                       replies of the later turns, and the KV memory held\n";

typedef struct eval_extra {
    const char *prompts, *chat, *passkey;
    int32_t limit;
    int sweep;
    eval_sweep_opts sw;
} eval_extra;

static int eval_option(void *user, const char *opt, const char *val, int *used) {
    eval_extra *x = user;
    *used = 1;
    if (!strcmp(opt, "--sweep")) {
        x->sweep = 1;
        *used = 0;
        return 0;
    }
    if (!strcmp(opt, "--chat")) {
        x->chat = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--prompts")) {
        x->prompts = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--passkey")) {
        x->passkey = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--methods")) {
        x->sw.methods = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--budgets")) {
        x->sw.budgets = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--dtypes")) {
        x->sw.dtypes = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--limit"))
        return val && cli_parse_int(val, 1, 1 << 20, &x->limit) ? 0 : 1;
    return 2;
}

/* The prompts of `text` (owned by the result): one per line, "\n" a newline
 * inside one, blank lines and lines starting with # skipped. lines[0] owns
 * the buffer, the prompts follow. `name` names the set in messages. */
static char **parse_prompts(char *text, size_t size, const char *name, int32_t *n) {
    *n = 0;
    char **lines = calloc(size / 2 + 2, sizeof *lines);
    if (!lines) {
        free(text);
        return NULL;
    }
    lines[0] = text; /* owns the buffer; lines point into it */
    int32_t count = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[strspn(line, " \t\r\f\v")] == '\0' || line[0] == '#') /* blank lines and comments are not prompts */
            continue;
        char *w = line; /* "\n" is a newline inside a prompt, "\\" a backslash */
        for (const char *r = line; *r; r++) {
            if (r[0] == '\\' && (r[1] == 'n' || r[1] == '\\'))
                *w++ = *++r == 'n' ? '\n' : '\\';
            else
                *w++ = *r;
        }
        *w = '\0';
        lines[1 + count++] = line;
    }
    if (count == 0) {
        fprintf(stderr, "fastgen eval: %s holds no prompt (one prompt per line; blank lines and lines starting "
                        "with # are skipped)\n", name);
        free(text);
        free(lines);
        return NULL;
    }
    *n = count;
    return lines;
}

static char **read_prompts(const char *path, int32_t *n) {
    size_t size;
    *n = 0;
    char *text = cli_read_text("eval", path, &size);
    return text ? parse_prompts(text, size, path, n) : NULL;
}

static char **default_prompts(int32_t *n) {
    *n = 0;
    const size_t size = strlen(cli_default_prompts);
    char *text = malloc(size + 1);
    if (!text) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        return NULL;
    }
    memcpy(text, cli_default_prompts, size + 1);
    return parse_prompts(text, size, "the built-in prompt set", n);
}

static void progress(int done, int total) {
    const int width = 30;
    int filled = total ? width * done / total : width;
    fprintf(stderr, "\r  [%.*s%*s] %d/%d prompts", filled, "##############################", width - filled, "", done,
            total);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

int cmd_eval(int argc, char **argv) {
    cli_opts o;
    cli_defaults(&o, -1);
    eval_extra x = {NULL, NULL, NULL, 0, 0, {NULL, NULL, NULL}};
    int rc = cli_parse("eval", k_eval_help, CLI_MODEL | CLI_RUN | CLI_STEPS | CLI_JSON | CLI_CSV | CLI_SVG | CLI_QUIET,
                       argc, argv, &o, eval_option, &x);
    if (rc)
        return rc < 0 ? 0 : rc;
    char model[1024], tokp[1024];
    if ((rc = cli_need_model("eval", &o, model, tokp, sizeof model)))
        return rc;
    if (o.n < 0) /* not given */
        o.n = x.chat ? 32 : x.passkey ? 12 : 128;
    if (o.n < 1)
        return cli_usage("eval", "-n must be at least 1");
    if (!!x.chat + !!x.passkey + !!x.sweep > 1)
        return cli_usage("eval", "--chat, --sweep and --passkey do not go together");
    if ((x.sw.methods || x.sw.budgets || x.sw.dtypes) && !x.sweep && !x.passkey)
        return cli_usage("eval", "--methods, --budgets and --dtypes go with --sweep or --passkey");
    if ((x.chat || x.passkey) && x.prompts)
        return cli_usage("eval", "--%s FILE holds the prompts: --prompts does not go with it",
                         x.chat ? "chat" : "passkey");
    if ((x.chat || x.sweep || x.passkey) && o.csv)
        return cli_usage("eval", "--csv is the table's format; --%s writes a table or --json",
                         x.chat ? "chat" : x.sweep ? "sweep" : "passkey");
    if (x.chat && o.svg)
        return cli_usage("eval", "--chat draws no chart: --svg does not go with it");
    if (x.chat)
        return eval_chat(&o, x.chat, x.limit);
    int32_t n_prompts = 0;
    char **prompts = x.passkey || x.prompts ? read_prompts(x.passkey ? x.passkey : x.prompts, &n_prompts)
                                            : default_prompts(&n_prompts);
    if (!prompts)
        return 1;
    if (x.limit && x.limit < n_prompts)
        n_prompts = x.limit;
    if (x.sweep || x.passkey) {
        eval_passkey *pk = x.passkey ? calloc((size_t)n_prompts, sizeof *pk) : NULL;
        int bad = x.passkey && !pk, two = 0;
        /* KEY<TAB>PROMPT, or KEY<TAB>DOCUMENT<TAB>TURN[<TAB>KEY<TAB>TURN]... */
        for (int32_t p = 0; pk && p < n_prompts; p++) {
            char *f[2 * EVAL_MAX_QUESTIONS + 2];
            int nf = 0, empty = 0;
            for (char *c = prompts[1 + p]; c && nf < (int)(sizeof f / sizeof f[0]);) {
                f[nf++] = c;
                c = strchr(c, '\t');
                if (c)
                    *c++ = '\0';
            }
            for (int i = 0; i < nf; i++)
                empty |= !f[i][0];
            for (int i = 0; i < nf; i += i == 0 ? 3 : 2) /* the keys (f[0], f[3], f[5]...): no empty reference */
                empty |= f[i][0] == '|' || (f[i][0] && f[i][strlen(f[i]) - 1] == '|') || strstr(f[i], "||");
            const int line_two = nf >= 3;
            if (empty || nf < 2 || (nf > 2 && nf % 2 == 0) || nf > 2 * EVAL_MAX_QUESTIONS + 1 ||
                (p > 0 && two != line_two)) {
                fprintf(stderr, "fastgen eval: %s: line %d is not KEY<TAB>PROMPT, or KEY<TAB>DOCUMENT<TAB>TURN "
                                "(then up to %d more KEY<TAB>TURN) as every line before it, each KEY one or "
                                "more non-empty references separated by '|'\n",
                        x.passkey, (int)p + 1, EVAL_MAX_QUESTIONS - 1);
                bad = 1;
                break;
            }
            two = line_two;
            prompts[1 + p] = f[1];
            pk[p].n = nf == 2 ? 1 : (nf - 1) / 2;
            for (int32_t q = 0; q < pk[p].n; q++) {
                pk[p].key[q] = f[q == 0 ? 0 : 1 + 2 * q];
                pk[p].turn[q] = nf == 2 ? NULL : f[2 + 2 * q];
            }
        }
        rc = bad ? 1 : eval_sweep(&o, &x.sw, prompts + 1, pk, n_prompts);
        free(pk);
        free(prompts[0]);
        free(prompts);
        return rc;
    }

    eval_state e;
    memset(&e, 0, sizeof e);
    char err[512];
    fg_status st = cli_load(&o, &e.s, err, sizeof err);
    int32_t longest = 0; /* the runner holds the longest prompt and its reference, not the model's whole context */
    for (int32_t p = 0; st == FG_OK && p < n_prompts; p++) {
        int32_t *ids = NULL, n = 0;
        if (cli_encode(&e.s, prompts[1 + p], &ids, &n) == FG_OK && n > longest)
            longest = n;
        free(ids);
    }
    if (st == FG_OK) {
        fgm_runner_params rp = {.backend = o.backend, .max_seqs = BATCH, .page_tokens = 1,
                               .track_recovery = 1, .max_len = longest + o.n,
                               .q8_activations = o.q8_activations, .prefill_chunk = o.prefill_chunk,
                               .n_threads = o.threads};
        cli_runner_dtypes(&o, &rp);
        st = fgm_runner_create(&e.s.model, &e.s.tok, &rp, &e.s.runner, err, sizeof err);
        if (st == FG_OK)
            st = cli_attach_scorer(&o, &e.s, e.s.runner, err, sizeof err);
    }
    rc = 1;
    if (st) {
        fprintf(stderr, "fastgen eval: %s\n", err);
        goto done;
    }
    e.vocab = e.s.model.config.vocab_size;
    e.n_steps = o.n;
    e.ref = malloc((size_t)o.n * sizeof *e.ref);
    e.ref_logits = malloc((size_t)o.n * e.vocab * sizeof *e.ref_logits);
    e.logits = malloc((size_t)BATCH * e.vocab * sizeof *e.logits);
    if (!e.ref || !e.ref_logits || !e.logits) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        goto done;
    }
    const int show = !o.quiet && isatty(2);
    double t0 = cli_now();
    int32_t n_done = 0;
    for (int32_t p = 0; p < n_prompts; p++) {
        if (show)
            progress(p, n_prompts);
        st = eval_prompt(&e, prompts[1 + p]);
        if (st == FG_ERR_CAPACITY) {
            fprintf(stderr, "fastgen eval: prompt %d plus %d tokens does not fit the context; skipped\n", (int)p + 1,
                    (int)o.n);
            continue;
        }
        if (st)
            goto done;
        n_done++;
    }
    if (show)
        progress(n_prompts, n_prompts);
    if (n_done == 0) {
        fprintf(stderr, "fastgen eval: no prompt of %s fits the context with -n %d; nothing to report\n",
                x.prompts ? x.prompts : "the built-in set",
                (int)o.n);
        goto done;
    }

    /* results */
    double kept[N_CFG], kl[N_CFG], klmax[N_CFG], top1[N_CFG], ppl[N_CFG], rec[N_CFG];
    for (int i = 0; i < N_CFG; i++) {
        const eval_acc *a = &e.acc[i];
        double steps = a->steps ? (double)a->steps : 1.0, np = a->prompts ? a->prompts : 1;
        kept[i] = a->kept_sum / np;
        kl[i] = a->kl_sum / steps;
        klmax[i] = a->kl_max;
        top1[i] = (double)a->top1 / steps;
        ppl[i] = exp((a->nll_sum - a->nll_full_sum) / steps);
        rec[i] = a->rec_sum / np;
    }
    const int order[N_CFG] = {0, 3, 6, 9, 12, 1, 4, 7, 10, 13, 2, 5, 8, 11, 14};
    if (o.json) {
        printf("{\"prompts\": %d, \"steps\": %d, \"results\": [", (int)n_prompts, (int)o.n);
        for (int k = 0; k < N_CFG; k++) {
            int i = order[k];
            printf("%s{\"policy\": \"%s\", \"matched_T\": %.2f, \"kv_kept\": %.4f, \"kl_mean\": %.6f, "
                   "\"kl_max\": %.6f, \"top1\": %.4f, \"ppl_ratio\": %.4f, \"attention_recovered\": %.4f}",
                   k ? ", " : "", cfg_family(i), (double)k_T[cfg_t(i)], kept[i], kl[i], klmax[i], top1[i], ppl[i],
                   rec[i]);
        }
        printf("]}\n");
    } else if (o.csv) {
        printf("policy,matched_T,kv_kept,kl_mean,kl_max,top1,ppl_ratio,attention_recovered\n");
        for (int k = 0; k < N_CFG; k++) {
            int i = order[k];
            printf("%s,%.2f,%.4f,%.6f,%.6f,%.4f,%.4f,%.4f\n", cfg_family(i), (double)k_T[cfg_t(i)], kept[i], kl[i],
                   klmax[i], top1[i], ppl[i], rec[i]);
        }
    } else {
        printf("fastgen eval: %d prompts x %d teacher-forced tokens, %s (%.1f s)\n\n", (int)n_prompts, (int)o.n,
               o.model, cli_now() - t0);
        printf("%-28s %8s %9s %9s %7s %9s %9s\n", "policy", "KV kept", "KL mean", "KL max", "top-1", "ppl x",
               "att. rec");
        for (int k = 0; k < N_CFG; k++) {
            int i = order[k];
            char name[64];
            cfg_name(i, name, sizeof name);
            printf("%-28s %7.1f%% %9.4f %9.4f %6.1f%% %9.4f %8.1f%%\n", name, 100 * kept[i], kl[i], klmax[i],
                   100 * top1[i], ppl[i], 100 * rec[i]);
            if (k % (1 + N_BASE) == N_BASE)
                printf("\n");
        }
    }
    if (o.svg) {
        svg_series s_kl[1 + N_BASE], s_top1[1 + N_BASE];
        double xs[1 + N_BASE][N_T], y_kl[1 + N_BASE][N_T], y_top1[1 + N_BASE][N_T];
        for (int f = 0; f <= N_BASE; f++) {
            for (int t = 0; t < N_T; t++) {
                int i = f == 0 ? t : N_T + (f - 1) * N_T + t;
                xs[f][t] = kept[i];
                y_kl[f][t] = kl[i];
                y_top1[f][t] = top1[i];
            }
            const char *name = f == 0 ? "fastgen (T = 0.90, 0.95, 0.98)" : k_base[f - 1];
            s_kl[f] = (svg_series){name, N_T, xs[f], y_kl[f], NULL, NULL};
            s_top1[f] = (svg_series){name, N_T, xs[f], y_top1[f], NULL, NULL};
        }
        char sub[512];
        const char *slash = strrchr(o.model, '/');
        snprintf(sub, sizeof sub, "%s: %d prompts, %d teacher-forced tokens each", slash ? slash + 1 : o.model,
                 (int)n_prompts, (int)o.n);
        cli_utf8_whole(sub);
        const svg_chart charts[2] = {
            {"Mean KL(full || compressed) vs KV memory kept", SVG_MEMORY_LABEL, "mean KL", s_kl, 1 + N_BASE, 1, 0,
             sub},
            {"Top-1 agreement with the full cache vs KV memory kept", SVG_MEMORY_LABEL, "top-1 agreement", s_top1,
             1 + N_BASE, 1, 1, sub},
        };
        FILE *fp = fopen(o.svg, "w");
        if (!fp || svg_charts(fp, charts, 2) != 0) {
            fprintf(stderr, "fastgen eval: cannot write %s\n", o.svg);
            if (fp)
                fclose(fp);
            goto done;
        }
        fclose(fp);
    }
    rc = 0;
done:
    free(e.ref);
    free(e.ref_logits);
    free(e.logits);
    cli_close(&e.s);
    if (prompts)
        free(prompts[0]);
    free(prompts);
    return rc;
}
