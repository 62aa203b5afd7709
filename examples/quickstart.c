/* Quickstart: one layer, one sequence, the paper's FastGen policy. */
#include <fastgen.h>
#include <stdio.h>
#include <stdlib.h>

static float noise(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

int main(void) {
    enum { VOCAB = 100, LAYERS = 1, HQ = 8, HKV = 2, D = 64, N = 256 };

    /* 1. Token classes: id 1 is BOS (special), id 2 is a full stop. */
    fg_token_classes *classes = NULL;
    fg_token_classes_create(VOCAB, NULL, &classes);
    fg_token_classes_set(classes, 1, FG_TOKEN_SPECIAL);
    fg_token_classes_set(classes, 2, FG_TOKEN_PUNCT);

    /* 2. A context for the model's attention shape. */
    fg_context_params p;
    fg_context_params_default(&p); /* FastGen shortlist, T = 0.95 */
    p.n_layers = LAYERS;
    p.n_q_heads = HQ;
    p.n_kv_heads = HKV;
    p.head_dim = D;
    p.kv_dtype = FG_DTYPE_F16;
    p.max_seq_len = N + 16;
    p.classes = classes;
    fg_context *ctx = NULL;
    if (fg_context_create(&p, &ctx) != FG_OK) {
        fprintf(stderr, "fastgen: %s\n", fg_last_error(NULL));
        return 1;
    }

    /* 3. Prompt: per layer, Q/K/V from the model (random here). */
    int32_t prompt[N];
    float *q = malloc(sizeof(float) * N * HQ * D), *out = malloc(sizeof(float) * N * HQ * D);
    float *k = malloc(sizeof(float) * N * HKV * D), *v = malloc(sizeof(float) * N * HKV * D);
    for (int i = 0; i < N; i++)
        prompt[i] = i == 0 ? 1 : (i % 7 == 0 ? 2 : 3 + rand() % 90);
    for (int i = 0; i < N * HQ * D; i++)
        q[i] = noise();
    for (int i = 0; i < N * HKV * D; i++) {
        k[i] = noise();
        v[i] = noise();
    }
    int32_t seq;
    fg_status st = fg_seq_create(ctx, NULL, prompt, N, &seq);
    for (int l = 0; l < LAYERS && st == FG_OK; l++)
        st = fg_prefill(ctx, seq, l, q, k, v, out); /* attention + profiling + compression */

    /* 4. Decode: one call per layer per token (a batch of one sequence). */
    for (int step = 0; step < 16 && st == FG_OK; step++) {
        int32_t token = 3 + step;
        for (int l = 0; l < LAYERS && st == FG_OK; l++)
            st = fg_decode(ctx, l, 1, &seq, &token, q, k, v, out); /* q: [1][HQ][D], k, v: [1][HKV][D] */
    }
    if (st != FG_OK) {
        fprintf(stderr, "fastgen: %s: %s\n", fg_status_string(st), fg_last_error(ctx));
        return 1;
    }

    /* 5. What each head kept, and the memory saved. */
    for (int g = 0; g < HKV; g++) {
        fg_head_info info;
        char name[64];
        fg_head_inspect(ctx, seq, 0, g, &info);
        fg_policy_name(info.components, name, sizeof name);
        printf("kv head %d: %-30s keeps %d of %d tokens\n", g, name, info.kept, info.length);
    }
    fg_memory_stats mem;
    fg_memory(ctx, -1, &mem);
    printf("KV bytes held %zu vs full %zu\n", mem.kv_bytes_held, mem.kv_bytes_full);

    fg_seq_destroy(ctx, seq);
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&classes);
    free(q);
    free(k);
    free(v);
    free(out);
    return 0;
}
