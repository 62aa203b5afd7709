/* fastgen calibrate: a model's key scorer (model/scorer.h), fitted to what a
 * reconstruction pass ranks on a calibration text, for observe=scores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/scorer.h"
#include "tools/cli.h"
#include "tools/cmd_generate_serve.h"

static const char *k_calibrate_help_head =
    "usage: fastgen calibrate -m MODEL --text FILE [--text FILE ...] [options]\n"
    "\n"
    "Fits the model's key scorer for fastgen-adaptive:observe=scores (the\n"
    "retrieval-safe observation without a second pass). The calibration text is\n"
    "cut into chunks; each is prefilled, then read again after an instruction to\n"
    "repeat it (a reconstruction pass, KVzip's idea), and the attention each key\n"
    "gets from that pass is what a linear function of the layer's input row learns\n"
    "to predict, per layer and KV head (ridge regression on its log). The last\n"
    "chunk is held out: the overlap of its predicted and its true top keys is\n"
    "printed. Use a text that is not your evaluation's (e.g. the licences in\n"
    "/usr/share/common-licenses).\n"
    "\n"
    "options:\n";
static const char *k_calibrate_help_tail =
    "  --text FILE             calibration text (repeatable; - = standard input)\n"
    "  -o, --output FILE       where the scorer goes (default: MODEL.fgscore, where generate, eval, demo\n"
    "                          and the Python Model look for it)\n"
    "  --chunk N               tokens per chunk (default 2048; at most half the context)\n"
    "  --max-tokens N          calibration tokens at most (default 16384)\n"
    "  --ridge X               ridge: the weights' diagonal of the normal equations times 1 + X (default 0.01)\n"
    "  --chat, --plain         each chunk as a ChatML user turn, or as plain text (default: a user turn\n"
    "                          when the model's vocabulary has ChatML's markers, as SmolLM2's)\n";

typedef struct calibrate_args {
    const char *texts[16];
    int n_texts;
    const char *output;
    int32_t chunk, max_tokens;
    float ridge;
    int chat; /* 1 --chat, 0 --plain, -1 the model's */
} calibrate_args;

static int calibrate_option(void *user, const char *opt, const char *val, int *used) {
    calibrate_args *a = user;
    *used = 1;
    if (!strcmp(opt, "--text")) {
        if (!val || a->n_texts == (int)(sizeof a->texts / sizeof a->texts[0]))
            return 1;
        a->texts[a->n_texts++] = val;
        return 0;
    }
    if (!strcmp(opt, "-o") || !strcmp(opt, "--output")) {
        a->output = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "--chunk"))
        return val && cli_parse_int(val, 64, 1 << 20, &a->chunk) ? 0 : 1;
    if (!strcmp(opt, "--max-tokens"))
        return val && cli_parse_int(val, 64, 1 << 26, &a->max_tokens) ? 0 : 1;
    if (!strcmp(opt, "--ridge"))
        return val && cli_parse_float(val, 0.0f, 1e6f, &a->ridge) ? 0 : 1;
    *used = 0;
    if (!strcmp(opt, "--chat") || !strcmp(opt, "--plain")) {
        a->chat = !strcmp(opt, "--chat");
        return 0;
    }
    return 2;
}

/* The reconstruction's ranks as targets: log of each key's over the head's mean, floored at 1e-4. */
static void targets(float *y, int32_t n_heads, int32_t n) {
    for (int32_t g = 0; g < n_heads; g++) {
        float *row = y + (size_t)g * n;
        double sum = 0.0;
        for (int32_t j = 0; j < n; j++)
            sum += row[j];
        const double mean = sum > 0.0 ? sum / n : 1.0;
        for (int32_t j = 0; j < n; j++) {
            const double r = row[j] / mean;
            row[j] = (float)log(r > 1e-4 ? r : 1e-4);
        }
    }
}

typedef struct ranked {
    float v;
    int32_t j;
} ranked;

static int by_value_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    return x->v < y->v ? 1 : x->v > y->v ? -1 : (x->j > y->j) - (x->j < y->j);
}

/* The share of the true top `top` keys among the predicted top `top`. */
static double top_overlap(const float *truth, const float *pred, int32_t n, int32_t top, ranked *a, ranked *b,
                          unsigned char *mark) {
    for (int32_t j = 0; j < n; j++) {
        a[j] = (ranked){truth[j], j};
        b[j] = (ranked){pred[j], j};
        mark[j] = 0;
    }
    qsort(a, (size_t)n, sizeof *a, by_value_desc);
    qsort(b, (size_t)n, sizeof *b, by_value_desc);
    for (int32_t i = 0; i < top; i++)
        mark[a[i].j] = 1;
    int32_t hit = 0;
    for (int32_t i = 0; i < top; i++)
        hit += mark[b[i].j];
    return (double)hit / top;
}

int cmd_calibrate(int argc, char **argv) {
    char model[1024], tokp[1024];
    cli_opts o;
    fg_compression_params cp;
    calibrate_args a = {.chunk = 2048, .max_tokens = 16384, .ridge = 0.01f, .chat = -1};
    int rc = cli_model_command("calibrate", k_calibrate_help_head, k_calibrate_help_tail,
                               CLI_MODEL | CLI_RUN | CLI_CTX | CLI_QUIET, 0, argc, argv, &o, &cp, model, tokp,
                               sizeof model, calibrate_option, &a);
    if (rc == 0 && a.n_texts == 0)
        rc = cli_usage("calibrate", "--text FILE: the calibration text is needed");
    if (rc == 0 && o.scorer)
        rc = cli_usage("calibrate", "--scorer: calibrate writes a scorer (-o FILE says where), it reads none");
    if (rc) {
        cli_opts_free(&o);
        return rc < 0 ? 0 : rc;
    }
    char out_path[1100];
    snprintf(out_path, sizeof out_path, "%s.fgscore", o.model);
    if (a.output)
        snprintf(out_path, sizeof out_path, "%s", a.output);
    cli_session s;
    o.scorer = "none"; /* a scorer there already is what this run replaces: not loaded */
    if (cli_open_or_report(&o, 0, &s)) {
        cli_opts_free(&o);
        return 1;
    }
    if (a.chat < 0)
        a.chat = serve_chatml(&s);
    const fgm_llama_config *c = &s.model.config;
    const int32_t L = c->n_layers, Hkv = c->n_kv_heads, D = c->dim, ctx_len = fgm_runner_ctx_len(s.runner);
    fg_context *ctx = fgm_runner_context(s.runner);
    int32_t *all = NULL, n_all = 0, *bos = NULL, n_bos = 0, *open = NULL, n_open = 0, *close = NULL, n_close = 0;
    int32_t *recon = NULL, n_recon = 0, *prompt = NULL;
    float *feat = NULL, *y = NULL, *pred = NULL;
    ranked *ra = NULL, *rb = NULL;
    unsigned char *mark = NULL;
    fgm_scorer_fit *fits = NULL;
    fgm_scorer sc = {L, Hkv, D, 0, NULL};
    rc = 1;
    /* the texts' tokens, one after another */
    for (int i = 0; i < a.n_texts; i++) {
        char *text = cli_read_text("calibrate", a.texts[i], NULL);
        int32_t *tk = NULL, m = 0;
        fg_status st = text ? cli_encode_more(&s, text, &tk, &m) : FG_ERR_IO;
        free(text);
        int32_t *grown = st == FG_OK ? realloc(all, (size_t)(n_all + m) * sizeof *all) : NULL;
        if (!grown) {
            free(tk);
            fprintf(stderr, "fastgen calibrate: cannot read or encode %s\n", a.texts[i]);
            goto done;
        }
        all = grown;
        memcpy(all + n_all, tk, (size_t)m * sizeof *all);
        n_all += m;
        free(tk);
    }
    if (cli_encode(&s, "", &bos, &n_bos) || cli_reconstruct_prefix(&s, a.chat, &recon, &n_recon) ||
        (a.chat && (cli_encode_more(&s, "<|im_start|>user\n", &open, &n_open) ||
                    cli_encode_more(&s, "<|im_end|>\n", &close, &n_close)))) {
        fprintf(stderr, "fastgen calibrate: cannot encode the chunks' frame\n");
        goto done;
    }
    const int32_t frame = n_bos + n_open + n_close;
    const int32_t chunk = a.chunk + frame + n_recon > ctx_len / 2 ? ctx_len / 2 - frame - n_recon : a.chunk;
    if (chunk < 64) {
        fprintf(stderr, "fastgen calibrate: the context (%d tokens) is too short to calibrate in\n", (int)ctx_len);
        goto done;
    }
    const int32_t usable = n_all < a.max_tokens ? n_all : a.max_tokens, n_chunks = usable / chunk;
    if (n_chunks < 1) {
        fprintf(stderr, "fastgen calibrate: %d tokens of text, fewer than one chunk of %d\n", (int)n_all, (int)chunk);
        goto done;
    }
    const int32_t n = frame + chunk; /* rows of each chunk's prompt */
    prompt = malloc((size_t)n * sizeof *prompt);
    feat = malloc((size_t)L * n * D * sizeof *feat);
    y = malloc((size_t)Hkv * n * sizeof *y);
    pred = malloc((size_t)Hkv * n * sizeof *pred);
    ra = malloc((size_t)n * sizeof *ra);
    rb = malloc((size_t)n * sizeof *rb);
    mark = malloc((size_t)n);
    fits = calloc((size_t)L, sizeof *fits);
    sc.w = malloc((size_t)L * Hkv * (D + 1) * sizeof *sc.w);
    if (!prompt || !feat || !y || !pred || !ra || !rb || !mark || !fits || !sc.w) {
        fprintf(stderr, "fastgen calibrate: out of memory\n");
        goto done;
    }
    for (int32_t l = 0; l < L; l++)
        if (fgm_scorer_fit_init(&fits[l], D, Hkv)) {
            fprintf(stderr, "fastgen calibrate: out of memory\n");
            goto done;
        }
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.observe = FG_OBSERVE_EXPLICIT;
    fgm_runner_capture(s.runner, feat, n);
    const int held_out = n_chunks > 1; /* the last chunk judges the fit of the others */
    if (!o.quiet)
        fprintf(stderr, "fastgen calibrate: %d chunks of %d tokens (%d of the text's %d)%s, %s\n", (int)n_chunks,
                (int)chunk, (int)(n_chunks * chunk), (int)n_all, held_out ? ", the last held out" : "",
                a.chat ? "each a ChatML user turn" : "as plain text");
    double overlap25 = 0.0, overlap10 = 0.0;
    for (int32_t k = 0; k < n_chunks; k++) {
        int32_t at = 0, seq = -1;
        const int32_t *parts[4] = {bos, open, all + (size_t)k * chunk, close}; /* NULL where a frame is empty */
        const int32_t lens[4] = {n_bos, n_open, chunk, n_close};
        for (int p = 0; p < 4; p++)
            if (lens[p] > 0) {
                memcpy(prompt + at, parts[p], (size_t)lens[p] * sizeof *prompt);
                at += lens[p];
            }
        int said = 0;
        fg_status st = fgm_runner_prefill(s.runner, &cp, prompt, n, &seq, NULL);
        if (st == FG_OK)
            st = fgm_runner_reconstruct_pass(s.runner, 1, &seq, recon, n_recon, prompt + n_bos, n - n_bos, NULL);
        const int last = held_out && k == n_chunks - 1;
        if (st == FG_OK && last) { /* the fit so far, then this chunk's ranks against it */
            for (int32_t l = 0; l < L && st == FG_OK; l++) {
                char err[256];
                if ((st = fgm_scorer_fit_solve(&fits[l], a.ridge, sc.w + (size_t)l * Hkv * (D + 1), err,
                                               sizeof err))) {
                    fprintf(stderr, "fastgen calibrate: layer %d: %s\n", (int)l, err);
                    said = 1;
                    break;
                }
            }
        }
        for (int32_t l = 0; l < L && st == FG_OK; l++) {
            if ((st = fg_seq_observed_ranks(ctx, seq, l, y, n))) {
                fprintf(stderr, "fastgen calibrate: chunk %d: %s\n", (int)k, fg_last_error(ctx));
                said = 1;
                break;
            }
            targets(y, Hkv, n);
            const float *xl = feat + (size_t)l * n * D;
            if (!last) {
                fgm_scorer_fit_add(&fits[l], xl, y, n);
                continue;
            }
            fgm_scorer_predict(&sc, l, xl, n, pred, (size_t)n, 0);
            for (int32_t g = 0; g < Hkv; g++) {
                overlap25 += top_overlap(y + (size_t)g * n, pred + (size_t)g * n, n, n / 4, ra, rb, mark);
                overlap10 += top_overlap(y + (size_t)g * n, pred + (size_t)g * n, n, n / 10, ra, rb, mark);
            }
        }
        if (seq >= 0)
            fgm_runner_release(s.runner, seq);
        if (st) { /* the runner's failures said here; the fit's and the ranks' were said where they failed */
            if (!said)
                fprintf(stderr, "fastgen calibrate: chunk %d: %s\n", (int)k, cli_reason(s.runner, st));
            goto done;
        }
        if (!o.quiet)
            fprintf(stderr, "fastgen calibrate: chunk %d of %d done\n", (int)k + 1, (int)n_chunks);
    }
    if (!held_out) /* one chunk: fitted on it, nothing to judge by */
        for (int32_t l = 0; l < L; l++) {
            char err[256];
            if (fgm_scorer_fit_solve(&fits[l], a.ridge, sc.w + (size_t)l * Hkv * (D + 1), err, sizeof err)) {
                fprintf(stderr, "fastgen calibrate: layer %d: %s\n", (int)l, err);
                goto done;
            }
        }
    sc.calib_tokens = (n_chunks - held_out) * chunk;
    char err[1300];
    if (fgm_scorer_save(out_path, &sc, err, sizeof err)) {
        fprintf(stderr, "fastgen calibrate: %s\n", err);
        goto done;
    }
    printf("scorer: %s (%d layers x %d KV heads, fitted on %d tokens, ridge %g)\n", out_path, (int)L, (int)Hkv,
           (int)sc.calib_tokens, (double)a.ridge);
    if (held_out)
        printf("held-out chunk (%d tokens): the reconstruction's top 25 %% found in the scorer's top 25 %%: %.3f "
               "(chance 0.25); top 10 %%: %.3f (chance 0.10), mean over %d heads\n",
               (int)n, overlap25 / (L * Hkv), overlap10 / (L * Hkv), (int)(L * Hkv));
    rc = 0;
done:
    fgm_runner_capture(s.runner, NULL, 0);
    for (int32_t l = 0; fits && l < L; l++)
        fgm_scorer_fit_free(&fits[l]);
    free(fits);
    fgm_scorer_free(&sc);
    free(all);
    free(bos);
    free(open);
    free(close);
    free(recon);
    free(prompt);
    free(feat);
    free(y);
    free(pred);
    free(ra);
    free(rb);
    free(mark);
    cli_close(&s);
    cli_opts_free(&o);
    return rc;
}
