/* fastgen bench: llama-bench's pp/tg table for a model, with the full cache
 * and with compression, each row's speed against the full cache's. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "bench/roofline.h"
#include "model/dequant.h"
#include "model/matvec.h"
#include "model/model.h"
#include "tools/cli.h"

static const char *k_bench_help_head =
    "usage: fastgen bench [options]\n"
    "\n"
    "llama-bench's table for a model: prompt processing (ppN: a prompt of N\n"
    "tokens) and text generation (tgN: N tokens decoded one at a time after a\n"
    "prompt of -d tokens), each run -r times with random tokens after one\n"
    "untimed warm-up run, for the full\n"
    "cache and for every compression method, with the KV memory each holds and\n"
    "its speed against the full cache's in the same run. Each row also gets\n"
    "its roofline on this CPU (backends cpu and ref), from probes run after\n"
    "the tests in the same process on as many threads: the read bandwidth (4x\n"
    "the last-level cache) and the peaks of the instructions the step uses\n"
    "(8-bit and fp32 multiply-adds, f16 widening; the prompt's products: an\n"
    "sgemm). A token's floor is the sum over its phases (weight products,\n"
    "attention, the rest) of max(bytes read / bandwidth, operations / peak);\n"
    "a tg row's KV bytes are the mean of the test's start and end. A second\n"
    "table puts each phase's measured time beside its floor (the timed runs\n"
    "read the clock at each phase change, about 14 times a layer).\n"
    "\n"
    "options:\n";
static const char *k_bench_help_tail =
    "  -p, --n-prompt N        tokens of the pp test (default 512; 0: none; llama-bench's -p)\n"
    "  -n, --n-gen N           tokens of the tg test (default 128; 0: none; --steps too)\n"
    "  -d, --n-depth LIST      prompt tokens before each tg test, each at least 1 (a sequence starts\n"
    "                          with a prefill), comma-separated (default 1024)\n"
    "  -r, --repetitions N     runs of each test (default 3)\n"
    "  --methods LIST          compressions, comma-separated, each PRESET[:RATIO][:KEY=VALUE]...\n"
    "                          (default full,fastgen-adaptive:0.5,fastgen-adaptive:0.25)\n"
    "  --json                  one JSON object: a row per method and test\n";

typedef struct bench_extra {
    int32_t pp, tg, reps, n_depths;
    int32_t depths[8];
    const char *methods;
} bench_extra;

static int bench_option(void *user, const char *opt, const char *val, int *used) {
    bench_extra *x = user;
    *used = 1;
    if (!strcmp(opt, "-p") || !strcmp(opt, "-pp") || !strcmp(opt, "--n-prompt")) /* llama-bench's -p */
        return val && cli_parse_int(val, 0, 1 << 20, &x->pp) ? 0 : 1;
    if (!strcmp(opt, "--n-gen"))
        return val && cli_parse_int(val, 0, 1 << 20, &x->tg) ? 0 : 1;
    if (!strcmp(opt, "-r") || !strcmp(opt, "--repetitions"))
        return val && cli_parse_int(val, 1, 1000, &x->reps) ? 0 : 1;
    if (!strcmp(opt, "--methods")) {
        x->methods = val;
        return val ? 0 : 1;
    }
    if (!strcmp(opt, "-d") || !strcmp(opt, "--n-depth")) {
        if (!val)
            return 1;
        char buf[256];
        if (strlen(val) >= sizeof buf)
            return 1;
        snprintf(buf, sizeof buf, "%s", val);
        x->n_depths = 0;
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (x->n_depths == 8 || !cli_parse_int(tok, 1, 1 << 20, &x->depths[x->n_depths]))
                return 1;
            x->n_depths++;
        }
        return x->n_depths > 0 ? 0 : 1;
    }
    return 2;
}

enum { MAX_METHODS = 8 };

typedef struct method {
    char name[64];
    fg_compression_params cp;
} method;

/* A compression as fg_compression_params_parse takes it ("h2o:0.5") into m; 0 when it is none. */
static int parse_method(const char *text, method *m) {
    if (strlen(text) >= sizeof m->name || fg_compression_params_parse(text, &m->cp) != FG_OK)
        return 0;
    snprintf(m->name, sizeof m->name, "%s", text);
    return 1;
}

/* One test's runs: tokens per second of each, and the memory held at the end. */
typedef struct bench_row {
    const char *method;
    char test[32];
    double mean, sd, ratio;
    double kept;     /* KV bytes held / full at the end of the test */
    double kv_bytes; /* tg: KV bytes held, mean of the decode's start and end */
    double limit;    /* tokens per second at the roofline; 0 when not known */
    int is_pp;
    int32_t n;                     /* tokens the test times */
    fgm_runner_times spent;        /* the timed runs' phases, summed */
    roofline_phase phases[3];      /* a token's work: weights, attention, the rest */
} bench_row;

enum { PH_WEIGHTS, PH_ATTENTION, PH_REST, N_PHASES };

static uint64_t g_rng = 0x5eedf00dull;

static int32_t random_token(int32_t vocab) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return 3 + (int32_t)((g_rng >> 33) % (uint64_t)(vocab - 3)); /* past <unk>, BOS and EOS */
}

/* Runs test (pp n at depth 0, or tg n after a prompt of depth) `reps` times under cp. */
static fg_status run_test(cli_session *s, const fg_compression_params *cp, int is_pp, int32_t n, int32_t depth,
                          int32_t reps, double *tps, double *kept, double *kv_bytes, fgm_runner_times *spent) {
    const int32_t vocab = s->model.config.vocab_size, len = is_pp ? n : depth;
    int32_t *tokens = malloc((size_t)(len > 0 ? len : 1) * sizeof *tokens);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    fg_status st = tokens && logits ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    for (int32_t r = -1; r < reps && st == FG_OK; r++) { /* run -1 warms the caches and the threads, untimed */
        for (int32_t i = 0; i < len; i++)
            tokens[i] = random_token(vocab);
        int32_t seq = -1;
        fgm_runner_timing(s->runner, is_pp);
        double t0 = cli_now();
        st = fgm_runner_prefill(s->runner, cp, tokens, len > 0 ? len : 1, &seq, logits);
        double t = cli_now() - t0;
        fg_memory_stats m0 = {0};
        if (st == FG_OK && !is_pp) {
            fg_memory(fgm_runner_context(s->runner), seq, &m0);
            fgm_runner_timing(s->runner, 1);
            t0 = cli_now();
            for (int32_t i = 0; i < n && st == FG_OK; i++) {
                const int32_t next = random_token(vocab);
                st = fgm_runner_decode(s->runner, 1, &seq, &next, logits);
            }
            t = cli_now() - t0;
        }
        const fgm_runner_times ph = fgm_runner_get_times(s->runner);
        fgm_runner_timing(s->runner, 0);
        if (st == FG_OK && r >= 0) {
            spent->weights += ph.weights;
            spent->attention += ph.attention;
            spent->rest += ph.rest;
            tps[r] = t > 0.0 ? n / t : 0.0;
            fg_memory_stats m;
            fg_memory(fgm_runner_context(s->runner), seq, &m);
            *kept = m.kv_bytes_full ? (double)m.kv_bytes_held / (double)m.kv_bytes_full : 0.0;
            *kv_bytes = 0.5 * ((double)m0.kv_bytes_held + (double)m.kv_bytes_held);
        }
        if (seq >= 0)
            fgm_runner_release(s->runner, seq);
    }
    free(tokens);
    free(logits);
    return st;
}

/* The roofline's probes on `threads` threads (bench/roofline.h), and the
 * prompt's GEMM peak (flop/s; 0 without BLAS); zeros when they cannot run. */
static roofline_peaks measure_peaks(int32_t threads, double *gemm) {
    roofline_peaks p = {0};
    *gemm = 0.0;
    fg_threadpool *pool = NULL;
    if (fg_threadpool_create(threads, &pool) != FG_OK)
        return p;
    p = roofline_measure(pool);
    *gemm = bench_sgemm_rate_on(pool, 256, 256, 256);
    fg_threadpool_destroy(&pool);
    return p;
}

/* The multiply-adds of a weight product per token (times `share`: the
 * tokens that go through it, per token timed): i8 where the runner
 * quantizes the activations for the matrix's type, fma otherwise. */
static void count_matrix(const fgm_tensor *W, int q8, double share, roofline_phase *ph) {
    const double macs = (double)W->rows * (double)W->cols * share;
    if (q8 && W->type != FGM_GGML_F32 && fgm_matvec_quantizes(W->type))
        ph->i8 += macs;
    else
        ph->fma += macs;
}

/* A token's work, phase by phase. Decode: the weights read once (bytes
 * from weights_read), each matrix's multiply-adds, attention over the
 * rows of kv_bytes; a prompt of n tokens: the products as fp32 GEMMs (the
 * runner dequantizes tiles of the weights), the causal attention's
 * (n + 1) / 2 rows a token, its bytes not counted (the prompt's rows stay
 * in cache as they are made). */
static void count_phases(const cli_session *s, const cli_opts *o, double wbytes, int is_pp, int32_t n,
                         double kv_bytes, roofline_phase *ph) {
    const fgm_llama_config *c = &s->model.config;
    const fgm_llama_weights *w = &s->model.weights;
    const int q8 = o->q8_activations && !is_pp;
    ph[PH_WEIGHTS] = (roofline_phase){"weights", is_pp ? 0.0 : wbytes, 0, 0, 0};
    for (int32_t l = 0; l < c->n_layers; l++) {
        const fgm_llama_layer *ly = &w->layers[l];
        const fgm_tensor *mats[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w3, &ly->w2};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            count_matrix(mats[i], q8, 1.0, &ph[PH_WEIGHTS]);
    }
    count_matrix(&w->wcls, q8, is_pp ? 1.0 / n : 1.0, &ph[PH_WEIGHTS]); /* a prompt's logits: its last row's */
    const int32_t d = c->head_size, G = c->n_heads / c->n_kv_heads;
    const fg_dtype kd = o->dtype, vd = cli_v_dtype(o);
    double rows;
    if (is_pp)
        rows = 0.5 * (n + 1) * (double)c->n_layers * c->n_kv_heads;
    else
        rows = kv_bytes / (double)(fg_row_bytes(kd, d) + fg_row_bytes(vd, d));
    ph[PH_ATTENTION] = roofline_attention(rows, G, d, is_pp ? FG_DTYPE_F32 : kd, is_pp ? FG_DTYPE_F32 : vd,
                                          is_pp ? 0.0 : kv_bytes);
    const double D = c->dim, H = c->hidden_dim, KV = c->kv_dim;
    /* 2 RMSNorms (3 D), 2 residuals (D), RoPE on q and k (3 an element), SwiGLU (e^x and 3 more) */
    const double per_layer = 2 * 3 * D + 2 * D + 3 * (D + KV) + H * (ROOFLINE_EXP_OPS + 3);
    ph[PH_REST] = (roofline_phase){"rest", 0.0, 0.0, c->n_layers * per_layer + 3 * D, 0.0};
}

/* A token's floor (seconds): decode at the probes' peaks, a prompt at the
 * GEMM's (its fp32 products; the fma probe's rate where there is no BLAS). */
static double row_floor(const roofline_peaks *p, double gemm, const bench_row *r, int phase, double *mem,
                        double *ops) {
    if (!r->is_pp || phase == PH_REST)
        return roofline_phase_floor(p, &r->phases[phase], mem, ops);
    roofline_peaks g = *p;
    if (gemm > 0.0)
        g.fma = 0.5 * gemm;
    return roofline_phase_floor(&g, &r->phases[phase], mem, ops);
}

/* Weight bytes a decode step reads: every matrix, the norms, and the
 * classifier (the embedding table when it is shared; else one row of it). */
static double weights_read(const fgm_llama_model *m) {
    double bytes = (double)fgm_llama_weight_bytes(m);
    if (!m->config.shared_classifier) {
        const fgm_tensor *e = &m->weights.token_embedding;
        bytes -= (double)fgm_type_row_bytes(e->type, e->cols) * (double)(e->rows - 1);
    }
    return bytes;
}

int cmd_bench(int argc, char **argv) {
    char model[1024], tokp[1024];
    cli_opts o;
    fg_compression_params cp0;
    bench_extra x = {512, 128, 3, 1, {1024}, "full,fastgen-adaptive:0.5,fastgen-adaptive:0.25"};
    int rc = cli_model_command("bench", k_bench_help_head, k_bench_help_tail, CLI_MODEL | CLI_RUN | CLI_JSON | CLI_STEPS,
                               -1, argc, argv, &o, &cp0, model, tokp, sizeof model, bench_option, &x);
    if (rc) {
        cli_opts_free(&o);
        return rc < 0 ? 0 : rc;
    }
    if (o.n >= 0)
        x.tg = o.n; /* -n: llama-bench's tg size */
    method methods[MAX_METHODS];
    int32_t n_methods = 0;
    char mbuf[512];
    if (strlen(x.methods) >= sizeof mbuf)
        return cli_usage("bench", "--methods is too long");
    snprintf(mbuf, sizeof mbuf, "%s", x.methods);
    for (char *tok = strtok(mbuf, ","); tok; tok = strtok(NULL, ",")) {
        if (n_methods == MAX_METHODS || !parse_method(tok, &methods[n_methods]))
            return cli_usage("bench", "--methods takes up to %d compressions, each PRESET[:RATIO][:KEY=VALUE]... "
                                      "(\"%s\": %s)", MAX_METHODS, tok,
                             n_methods == MAX_METHODS ? "one too many" : fg_last_error(NULL));
        n_methods++;
    }
    if (strcmp(methods[0].name, "full"))
        return cli_usage("bench", "--methods starts with full: every row's speed is against it");
    if (x.pp == 0 && x.tg == 0)
        return cli_usage("bench", "-pp 0 and -n 0 leave no test to run");
    int32_t longest = x.pp;
    for (int32_t i = 0; i < x.n_depths; i++)
        longest = x.depths[i] + x.tg > longest ? x.depths[i] + x.tg : longest;
    o.ctx_size = longest + 1;
    o.quiet = 1;
    cli_session s;
    if (cli_open_or_report(&o, 0, &s)) {
        cli_opts_free(&o);
        return 1;
    }
    if (fgm_runner_ctx_len(s.runner) < longest + 1) {
        fprintf(stderr, "fastgen bench: the tests need %d positions; the model's context holds %d\n", (int)longest + 1,
                (int)fgm_runner_ctx_len(s.runner));
        cli_close(&s);
        cli_opts_free(&o);
        return 1;
    }
    const int32_t n_tests = (x.pp > 0) + (x.tg > 0 ? x.n_depths : 0);
    bench_row *rows = calloc((size_t)n_methods * n_tests, sizeof *rows);
    double *tps = malloc((size_t)x.reps * sizeof *tps);
    fg_status st = rows && tps ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    int32_t n_rows = 0;
    for (int32_t t = 0; t < n_tests && st == FG_OK; t++) {
        const int is_pp = x.pp > 0 && t == 0;
        const int32_t depth = is_pp ? 0 : x.depths[t - (x.pp > 0)], n = is_pp ? x.pp : x.tg;
        for (int32_t m = 0; m < n_methods && st == FG_OK; m++) { /* the methods in turn, each test's full first */
            bench_row *row = &rows[n_rows++];
            row->method = methods[m].name;
            row->is_pp = is_pp;
            row->n = n;
            if (is_pp)
                snprintf(row->test, sizeof row->test, "pp%d", (int)n);
            else
                snprintf(row->test, sizeof row->test, "tg%d @ d%d", (int)n, (int)depth);
            st = run_test(&s, &methods[m].cp, is_pp, n, depth, x.reps, tps, &row->kept, &row->kv_bytes, &row->spent);
            double sum = 0.0, sq = 0.0;
            for (int32_t r = 0; r < x.reps; r++)
                sum += tps[r];
            row->mean = sum / x.reps;
            for (int32_t r = 0; r < x.reps; r++)
                sq += (tps[r] - row->mean) * (tps[r] - row->mean);
            row->sd = x.reps > 1 ? sqrt(sq / (x.reps - 1)) : 0.0;
            const bench_row *full = &rows[n_rows - 1 - m];
            row->ratio = full->mean > 0.0 ? row->mean / full->mean : 0.0;
        }
    }
    const int32_t threads = o.threads ? o.threads : fg_default_threads();
    const int cpu_backend = !strcmp(fg_context_backend(fgm_runner_context(s.runner)), "cpu") ||
                            !strcmp(fg_context_backend(fgm_runner_context(s.runner)), "ref");
    /* the host's probes bound the host backends only */
    double gemm = 0.0;
    const roofline_peaks peaks = st == FG_OK && cpu_backend ? measure_peaks(threads, &gemm) : (roofline_peaks){0};
    const double wbytes = weights_read(&s.model);
    for (int32_t i = 0; i < n_rows; i++) {
        bench_row *r = &rows[i];
        count_phases(&s, &o, wbytes, r->is_pp, r->n, r->kv_bytes, r->phases);
        double floor = 0.0;
        for (int ph = 0; ph < N_PHASES; ph++)
            floor += row_floor(&peaks, gemm, r, ph, NULL, NULL);
        r->limit = peaks.read_bps > 0.0 && floor > 0.0 ? 1.0 / floor : 0.0;
    }
    if (st) {
        fprintf(stderr, "fastgen bench: %s\n", cli_reason(s.runner, st));
        rc = 1;
    } else {
        const char *slash = strrchr(o.model, '/');
        const char *name = slash ? slash + 1 : o.model;
        char cpu[256];
        fg_cpu_describe(cpu, sizeof cpu);
        if (o.json) {
            printf("{\"model\": ");
            cli_json_string(stdout, name);
            printf(", \"backend\": ");
            cli_json_string(stdout, fg_context_backend(fgm_runner_context(s.runner)));
            printf(", \"kv_dtype\": \"%s\", \"v_dtype\": \"%s\", \"threads\": %d, \"repetitions\": %d, \"cpu\": ",
                   fg_dtype_name(o.dtype), fg_dtype_name(cli_v_dtype(&o)), (int)threads, (int)x.reps);
            cli_json_string(stdout, cpu);
            printf(", \"weights_read_bytes\": %.0f", wbytes);
            if (peaks.read_bps > 0.0)
                printf(", \"probes\": {\"isa\": \"%s\", \"read_bandwidth_gbs\": %.3f, \"i8_gmacs\": %.3f, "
                       "\"fma_gmacs\": %.3f, \"f16_widen_g\": %.3f, \"sgemm_gflops\": %.3f}",
                       fg_cpu_isa_name(peaks.isa), peaks.read_bps / 1e9, peaks.i8_macs / 1e9, peaks.fma / 1e9,
                       peaks.widen / 1e9, gemm / 1e9);
            printf(", \"rows\": [");
            for (int32_t i = 0; i < n_rows; i++) {
                const bench_row *r = &rows[i];
                printf("%s{\"method\": ", i ? ", " : "");
                cli_json_string(stdout, r->method);
                printf(", \"test\": \"%s\", \"tokens_per_s\": %.3f, \"sd\": %.3f, \"vs_full\": %.4f, \"kv_kept\": %.4f",
                       r->test, r->mean, r->sd, r->ratio, r->kept);
                if (!r->is_pp)
                    printf(", \"kv_bytes\": %.0f", r->kv_bytes);
                if (r->limit > 0.0) {
                    printf(", \"roofline_tokens_per_s\": %.3f, \"of_roofline\": %.4f, \"phases\": [", r->limit,
                           r->mean / r->limit);
                    const double per = (double)x.reps * r->n;
                    const double spent[N_PHASES] = {r->spent.weights, r->spent.attention, r->spent.rest};
                    for (int ph = 0; ph < N_PHASES; ph++) {
                        double mem, ops;
                        const double fl = row_floor(&peaks, gemm, r, ph, &mem, &ops);
                        printf("%s{\"phase\": \"%s\", \"measured_us\": %.3f, \"floor_us\": %.3f, \"bytes_us\": %.3f, "
                               "\"ops_us\": %.3f}",
                               ph ? ", " : "", r->phases[ph].name, 1e6 * spent[ph] / per, 1e6 * fl, 1e6 * mem,
                               1e6 * ops);
                    }
                    printf("]");
                }
                printf("}");
            }
            printf("]}\n");
        } else {
            char kv[32];
            cli_dtype_label(&o, kv, sizeof kv);
            printf("| model | backend | KV | method | KV kept | test | t/s | vs full | roofline t/s | of roofline |\n");
            printf("| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
            for (int32_t i = 0; i < n_rows; i++) {
                char lim[32] = "-", of[32] = "-";
                if (rows[i].limit > 0.0) {
                    snprintf(lim, sizeof lim, "%.1f", rows[i].limit);
                    snprintf(of, sizeof of, "%.2f", rows[i].mean / rows[i].limit);
                }
                printf("| %s | %s | %s | %s | %.1f%% | %s | %.2f ± %.2f | %.2fx | %s | %s |\n", name,
                       fg_context_backend(fgm_runner_context(s.runner)), kv, rows[i].method,
                       100.0 * rows[i].kept, rows[i].test, rows[i].mean, rows[i].sd, rows[i].ratio, lim, of);
            }
            printf("\n%d runs each, random tokens; cpu: %s\n", (int)x.reps, cpu);
            if (peaks.read_bps > 0.0) {
                roofline_print_peaks(stdout, "roofline ", &peaks);
                if (gemm > 0.0)
                    printf("roofline prompt: sgemm %.1f Gflop/s (BLAS, 256^3 a thread, every thread at once)\n",
                           gemm / 1e9);
                printf("\nwhere a token's time goes (us a token; floor: max(bytes / bandwidth, operations / peak); "
                       "of floor: floor / measured):\n\n");
                printf("| method | test | phase | measured | floor | bytes term | operations term | of floor |\n");
                printf("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
                for (int32_t i = 0; i < n_rows; i++) {
                    const bench_row *r = &rows[i];
                    const double per = (double)x.reps * r->n;
                    const double spent[N_PHASES] = {r->spent.weights, r->spent.attention, r->spent.rest};
                    for (int ph = 0; ph < N_PHASES; ph++) {
                        double mem, ops;
                        const double fl = row_floor(&peaks, gemm, r, ph, &mem, &ops), us = 1e6 * spent[ph] / per;
                        printf("| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", r->method, r->test,
                               r->phases[ph].name, us, 1e6 * fl, 1e6 * mem, 1e6 * ops, us > 0 ? 1e6 * fl / us : 0.0);
                    }
                }
                printf("\nweights: every matrix read once, one multiply-add a weight (8-bit where the activations "
                       "are, fp32 for a prompt's dequantized tiles at the sgemm's rate); attention: the KV rows held "
                       "read once, 2 d multiply-adds and an e^x a row and query head, a 16-bit row widened; rest: "
                       "RMSNorm, RoPE, residuals, SwiGLU at the fp32 peak (its time includes the runner's serial "
                       "work); weights' time includes the activations' quantization and the pool's hand-offs\n");
            }
        }
    }
    free(rows);
    free(tps);
    cli_close(&s);
    cli_opts_free(&o);
    return rc;
}
