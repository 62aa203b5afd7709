/*
 * Soak: 50,000 batched decode calls over sequences that are created,
 * decoded and destroyed along the way (mixed policies, prompts of 4..40
 * tokens, lives of 10..200 tokens). Memory must stay flat: after a warm-up,
 * the pool and the process's resident set may not grow, and at the end,
 * with every sequence destroyed and the pool trimmed, the pool is empty.
 * A test with a count, not a time. Usage: test_soak [BACKEND] [CALLS]
 */
#include <stdio.h>
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"

/* AddressSanitizer holds freed memory in quarantine (up to 256 MiB), so the
 * resident set grows there whatever the library does: that build checks the
 * pool and leaves leaks to LeakSanitizer. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

enum { HKV = 2, G = 2, HQ = G * HKV, D = 16, SEQS = 4, MAXLEN = 256, VOCAB = 16 };

/* Resident set size in bytes (Linux), 0 where unknown. */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * 4096;
}

typedef struct life {
    int32_t id, len, end; /* -1: free slot */
    int32_t tokens[MAXLEN];
} life;

static const char *k_presets[] = {"fastgen", "h2o", "streamingllm", "local", "frequent", "full"};

static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = rng_gauss();
}

int main(int argc, char **argv) {
    test_seed("test_soak");
    const char *backend = argc > 1 ? argv[1] : "cpu";
    const long calls = argc > 2 ? atol(argv[2]) : 50000;
    fg_token_classes *tc = NULL;
    EXPECT_OK(NULL, fg_token_classes_create(VOCAB, NULL, &tc));
    fg_token_classes_set(tc, 1, FG_TOKEN_SPECIAL);
    fg_token_classes_set(tc, 2, FG_TOKEN_PUNCT);
    fg_context_params p = test_context_params(backend, 1, HQ, HKV, D);
    p.kv_dtype = FG_DTYPE_F16;
    p.max_seqs = SEQS;
    p.max_seq_len = MAXLEN;
    p.page_tokens = 8;
    p.pool_chunk_pages = 16;
    p.n_threads = 1; /* memory is the point here; more threads would only compete with the tests beside it */
    p.classes = tc;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    if (!ctx)
        return test_finish();

    static life lives[SEQS];
    static float q[MAXLEN * HQ * D], k[MAXLEN * HKV * D], v[MAXLEN * HKV * D], out[MAXLEN * HQ * D];
    for (int i = 0; i < SEQS; i++)
        lives[i].id = -1;
    long created = 0, bad = 0;
    size_t rss_warm = 0, pool_warm = 0, pool_max_after = 0;
    int64_t steps_tokens = 0;
    for (long call = 0; call < calls; call++) {
        /* births: every free slot gets a new sequence, prefilled */
        for (int i = 0; i < SEQS; i++) {
            life *lf = &lives[i];
            if (lf->id >= 0)
                continue;
            const int32_t n = rng_int(4, 40);
            lf->end = n + rng_int(10, 200);
            if (lf->end > MAXLEN)
                lf->end = MAXLEN;
            for (int32_t t = 0; t < MAXLEN; t++)
                lf->tokens[t] = t == 0 ? 1 : rng_int(0, VOCAB - 1);
            fg_compression_params cp;
            fg_compression_params_preset(k_presets[created % 6], &cp);
            fill(q, (size_t)n * HQ * D);
            fill(k, (size_t)n * HKV * D);
            fill(v, (size_t)n * HKV * D);
            fg_status st = fg_seq_create(ctx, &cp, lf->tokens, n, &lf->id);
            if (st == FG_OK)
                st = fg_prefill(ctx, lf->id, 0, q, k, v, out);
            bad += st != FG_OK;
            lf->len = n;
            created++;
        }
        /* one batched decode over every live sequence */
        int32_t ids[SEQS], toks[SEQS];
        for (int i = 0; i < SEQS; i++) {
            ids[i] = lives[i].id;
            toks[i] = lives[i].tokens[lives[i].len];
        }
        fill(q, (size_t)SEQS * HQ * D);
        fill(k, (size_t)SEQS * HKV * D);
        fill(v, (size_t)SEQS * HKV * D);
        bad += fg_decode(ctx, 0, SEQS, ids, toks, q, k, v, out) != FG_OK;
        steps_tokens += SEQS;
        /* deaths */
        for (int i = 0; i < SEQS; i++)
            if (++lives[i].len >= lives[i].end) {
                bad += fg_seq_destroy(ctx, lives[i].id) != FG_OK;
                lives[i].id = -1;
                if (call % 7 == 0)
                    bad += fg_trim(ctx) != FG_OK;
            }
        fg_memory_stats m;
        fg_memory(ctx, -1, &m);
        if (call == calls / 5) {
            rss_warm = rss_bytes();
            pool_warm = m.pool_bytes;
        }
        if (call > calls / 5 && m.pool_bytes > pool_max_after)
            pool_max_after = m.pool_bytes;
    }
    const size_t rss_end = rss_bytes();
    EXPECT(bad == 0, "%ld calls failed: %s", bad, fg_last_error(ctx));
    for (int i = 0; i < SEQS; i++)
        if (lives[i].id >= 0)
            EXPECT_OK(ctx, fg_seq_destroy(ctx, lives[i].id));
    EXPECT_OK(ctx, fg_trim(ctx));
    fg_memory_stats m;
    EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
    EXPECT(m.pages_in_use == 0 && m.pool_bytes == 0 && m.kv_bytes_held == 0,
           "after destroying everything and trimming: %lld pages in use, %zu pool bytes", (long long)m.pages_in_use,
           m.pool_bytes);
    /* the pool never outgrows what every head at its longest needs, plus one chunk
       (pages of 8 f16 rows of K and V: 512 bytes and their metadata, under 1 KiB),
       and the process does not grow past its warm size (1 MiB of slack for the allocator) */
    const size_t pool_cap = ((size_t)SEQS * HKV * (MAXLEN / 8) + 16) * 1024;
    EXPECT(pool_max_after <= pool_cap, "pool grew to %zu bytes (bound %zu)", pool_max_after, pool_cap);
    EXPECT(!RSS_MEANINGFUL || rss_warm == 0 || rss_end <= rss_warm + ((size_t)1 << 20), "RSS grew from %zu to %zu bytes",
           rss_warm, rss_end);
    printf("%s: %ld decode calls (%lld tokens), %ld sequences created and destroyed; pool %zu bytes at 20%%, at "
           "most %zu after; RSS %zu -> %zu bytes\n",
           backend, calls, (long long)steps_tokens, created, pool_warm, pool_max_after, rss_warm, rss_end);
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
    return test_finish();
}
