/*
 * Concurrency: several contexts, each driven from its own thread, give the
 * same bits as the same work done one context after another. Each job is a
 * whole life: create, prompts with mixed policies, prefill, batched decode,
 * inspect, destroy. Error messages are per thread (fg_last_error(NULL)) and
 * per context. CI also runs this under ThreadSanitizer (see .ci/run).
 * Usage: test_threads [BACKEND...]   (default: ref cpu)
 */
#include <pthread.h>
#include <string.h>

#include "fastgen.h"
#include "harness.h"
#include "tools/synth.h"

enum { L = 2, HKV = 2, G = 2, HQ = G * HKV, D = 32, N = 48, STEPS = 40, SEQS = 2, JOBS = 4, REPEATS = 2 };

typedef struct job {
    const char *backend;
    int index;
    fg_dtype dtype;
    float *out;   /* every output the job produced, in order */
    size_t n_out; /* floats written */
    int32_t kept[SEQS * L * HKV];
    fg_status status;
    char error[512];
} job;

#define OUT_FLOATS ((size_t)SEQS * L * (N + STEPS) * HQ * D)

static void *run_job(void *arg) {
    job *j = arg;
    j->n_out = 0;
    j->status = FG_OK;
    fg_synth syn;
    fg_status st = fg_synth_create(L, HQ, HKV, D, 100 + (uint64_t)j->index, &syn);
    fg_context *ctx = NULL;
    if (st == FG_OK) {
        fg_context_params p = test_context_params(j->backend, L, HQ, HKV, D);
        p.kv_dtype = j->dtype;
        p.max_seqs = SEQS;
        p.max_seq_len = N + STEPS;
        p.page_tokens = 8;
        p.n_threads = 1 + j->index % 2; /* thread pools inside concurrent callers, too */
        p.classes = syn.classes;
        st = fg_context_create(&p, &ctx);
    }
    /* a refused call: its message is this thread's own */
    fg_context_params bad;
    fg_context_params_default(&bad);
    bad.n_layers = -(1000 + j->index);
    fg_context *none = NULL;
    char want[32];
    snprintf(want, sizeof want, "%d", 1000 + j->index);
    if (st == FG_OK && (fg_context_create(&bad, &none) == FG_OK || !strstr(fg_last_error(NULL), want)))
        st = FG_ERR_INTERNAL;

    const char *presets[SEQS] = {"fastgen", "h2o"};
    int32_t tokens[SEQS][N + STEPS], seqs[SEQS];
    static _Thread_local float q[(N + STEPS) * HQ * D], k[(N + STEPS) * HKV * D], v[(N + STEPS) * HKV * D];
    for (int32_t s = 0; s < SEQS && st == FG_OK; s++) {
        for (int32_t t = 0; t < N + STEPS; t++)
            tokens[s][t] = fg_synth_token(&syn, t + 17 * s + j->index);
        fg_compression_params cp;
        fg_compression_params_preset(presets[s], &cp);
        st = fg_seq_create(ctx, &cp, tokens[s], N - 5 * s, &seqs[s]);
        for (int32_t l = 0; l < L && st == FG_OK; l++) {
            fg_synth_qkv(&syn, l, tokens[s], 0, N - 5 * s, q, k, v);
            st = fg_prefill(ctx, seqs[s], l, q, k, v, j->out + j->n_out);
            j->n_out += (size_t)(N - 5 * s) * HQ * D;
        }
    }
    for (int32_t step = 0; step < STEPS && st == FG_OK; step++)
        for (int32_t l = 0; l < L && st == FG_OK; l++) {
            int32_t toks[SEQS];
            for (int32_t s = 0; s < SEQS; s++) {
                const int32_t pos = N - 5 * s + step;
                toks[s] = tokens[s][pos];
                fg_synth_qkv(&syn, l, &toks[s], pos, 1, q + (size_t)s * HQ * D, k + (size_t)s * HKV * D,
                             v + (size_t)s * HKV * D);
            }
            st = fg_decode(ctx, l, SEQS, seqs, toks, q, k, v, j->out + j->n_out);
            j->n_out += (size_t)SEQS * HQ * D;
        }
    for (int32_t s = 0; s < SEQS && st == FG_OK; s++)
        for (int32_t l = 0; l < L && st == FG_OK; l++)
            for (int32_t g = 0; g < HKV && st == FG_OK; g++) {
                fg_head_info info;
                st = fg_head_inspect(ctx, seqs[s], l, g, &info);
                j->kept[(s * L + l) * HKV + g] = info.kept;
            }
    if (st)
        snprintf(j->error, sizeof j->error, "%s", ctx ? fg_last_error(ctx) : fg_last_error(NULL));
    j->status = st;
    fg_context_destroy(&ctx);
    fg_synth_destroy(&syn);
    return NULL;
}

int main(int argc, char **argv) {
    test_seed("test_threads");
    const char *dflt[] = {"ref", "cpu"};
    const char **names = argc > 1 ? (const char **)argv + 1 : dflt;
    const int n_names = argc > 1 ? argc - 1 : 2;
    for (int b = 0; b < n_names; b++) {
        if (fg_backend_probe(names[b]) != FG_OK) {
            printf("%s: not tested: %s\n", names[b], fg_last_error(NULL));
            continue;
        }
        job serial[JOBS], threaded[JOBS];
        for (int i = 0; i < JOBS; i++) {
            serial[i] = (job){.backend = names[b], .index = i, .dtype = (fg_dtype)(i % 3)};
            serial[i].out = malloc(OUT_FLOATS * sizeof(float));
            run_job(&serial[i]);
            EXPECT(serial[i].status == FG_OK, "%s job %d alone: %s", names[b], i, serial[i].error);
        }
        int same = 1;
        for (int r = 0; r < REPEATS; r++) {
            pthread_t th[JOBS];
            for (int i = 0; i < JOBS; i++) {
                threaded[i] = serial[i];
                threaded[i].out = malloc(OUT_FLOATS * sizeof(float));
                EXPECT(pthread_create(&th[i], NULL, run_job, &threaded[i]) == 0, "pthread_create");
            }
            for (int i = 0; i < JOBS; i++)
                pthread_join(th[i], NULL);
            for (int i = 0; i < JOBS; i++) {
                EXPECT(threaded[i].status == FG_OK, "%s job %d in a thread: %s", names[b], i, threaded[i].error);
                same &= threaded[i].n_out == serial[i].n_out &&
                        memcmp(threaded[i].out, serial[i].out, serial[i].n_out * sizeof(float)) == 0 &&
                        memcmp(threaded[i].kept, serial[i].kept, sizeof serial[i].kept) == 0;
                free(threaded[i].out);
            }
        }
        EXPECT(same, "%s: %d contexts on %d threads differ from serial use", names[b], JOBS, JOBS);
        printf("%s: %d jobs x %d concurrent repeats, %zu output floats each: %s\n", names[b], JOBS, REPEATS,
               serial[0].n_out, same ? "bit-identical to serial" : "DIFFERENT");
        for (int i = 0; i < JOBS; i++)
            free(serial[i].out);
    }
    return test_finish();
}
