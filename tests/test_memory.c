/*
 * Memory accounting: bytes held equal every head's kept rows rounded up to
 * pages; the full-cache figure is reported beside them; pages freed by
 * eviction go back to the pool and are reused; destroying a sequence returns
 * its pages and empty chunks go back to the backend.
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { LAYERS = 2, HKV = 5, G = 2, D = 32, N = 200, STEPS = 150, P = 16 };

typedef struct totals {
    size_t held, full;
    int64_t pages, rows;
} totals;

static totals sum_heads(fg_context *ctx, int32_t seq) {
    const size_t row = 2 * D * 2; /* f16 K and V */
    totals t = {0};
    for (int32_t l = 0; l < LAYERS; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &info));
            int64_t pages = (info.kept + P - 1) / P;
            EXPECT(info.kv_bytes_held == (size_t)pages * P * row, "head bytes %zu for %d rows", info.kv_bytes_held,
                   (int)info.kept);
            EXPECT(info.kv_bytes_full == (size_t)((info.length + P - 1) / P) * P * row, "full bytes %zu for t=%d",
                   info.kv_bytes_full, (int)info.length);
            t.held += info.kv_bytes_held;
            t.full += info.kv_bytes_full;
            t.pages += pages;
            t.rows += info.kept;
        }
    return t;
}

int main(void) {
    test_seed("test_memory");
    synth syn;
    EXPECT(synth_create(LAYERS, G * HKV, HKV, D, 3, &syn) == FG_OK, "synth");
    fg_context_params p = test_context_params("ref", LAYERS, G * HKV, HKV, D);
    p.kv_dtype = FG_DTYPE_F16;
    p.max_seqs = 3;
    p.max_seq_len = N + STEPS;
    p.page_tokens = P;
    p.pool_chunk_pages = 8;
    p.classes = syn.classes;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));

    int32_t tokens[N + STEPS];
    for (int32_t i = 0; i < N + STEPS; i++)
        tokens[i] = synth_token(&syn, i);
    const int32_t Hq = G * HKV;
    float *q = malloc((size_t)N * Hq * D * sizeof(float)), *out = malloc((size_t)N * Hq * D * sizeof(float));
    float *k = malloc((size_t)N * HKV * D * sizeof(float)), *v = malloc((size_t)N * HKV * D * sizeof(float));

    /* a FastGen sequence and a local-only one (window of 8 tokens) */
    fg_compression_params local;
    fg_compression_params_preset("local", &local);
    local.shortlist[0].local_tokens = 8;
    int32_t s_fast = -1, s_local = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, tokens, N, &s_fast));
    EXPECT_OK(ctx, fg_seq_create(ctx, &local, tokens, N, &s_local));
    for (int32_t l = 0; l < LAYERS; l++) {
        synth_qkv(&syn, l, tokens, 0, N, q, k, v);
        EXPECT_OK(ctx, fg_prefill(ctx, s_fast, l, q, k, v, out));
        EXPECT_OK(ctx, fg_prefill(ctx, s_local, l, q, k, v, out));
    }

    fg_memory_stats m, ms;
    EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
    totals a = sum_heads(ctx, s_fast), b = sum_heads(ctx, s_local);
    EXPECT(m.kv_bytes_held == a.held + b.held, "context held %zu, heads %zu", m.kv_bytes_held, a.held + b.held);
    EXPECT(m.pages_in_use == a.pages + b.pages, "pages in use %lld, heads %lld", (long long)m.pages_in_use,
           (long long)(a.pages + b.pages));
    EXPECT(m.kv_bytes_full == 2 * (size_t)LAYERS * HKV * ((N + P - 1) / P) * P * (2 * D * 2), "full %zu",
           m.kv_bytes_full);
    EXPECT(m.rows_full == 2LL * LAYERS * HKV * N && m.rows_kept == a.rows + b.rows, "rows");
    EXPECT(m.kv_bytes_held < m.kv_bytes_full, "compression holds less than full (%zu vs %zu)", m.kv_bytes_held,
           m.kv_bytes_full);
    EXPECT(b.rows == LAYERS * HKV * 8, "local-only keeps its 8-token window: %lld rows", (long long)b.rows);
    EXPECT_OK(ctx, fg_memory(ctx, s_local, &ms));
    EXPECT(ms.kv_bytes_held == b.held && ms.rows_kept == b.rows, "per-sequence memory");
    const size_t page_bytes = (m.kv_bytes_held + m.meta_bytes_held) / (size_t)m.pages_in_use;
    EXPECT(m.pages_free >= 0 && m.pool_bytes == (size_t)(m.pages_in_use + m.pages_free) * page_bytes,
           "pool of %zu bytes is not its %lld + %lld pages", m.pool_bytes, (long long)m.pages_in_use,
           (long long)m.pages_free);

    /* decode: the local-only sequence stays at one page per head while the
     * full cache grows; every step's evictions return their pages */
    float dq[2][G * HKV * D], dk[2][HKV * D], dv[2][HKV * D], dout[2][G * HKV * D];
    int32_t ids[2] = {s_fast, s_local};
    for (int32_t step = 0; step < STEPS; step++) {
        int32_t pos = N + step, toks[2] = {tokens[pos], tokens[pos]};
        for (int32_t l = 0; l < LAYERS; l++) {
            synth_qkv(&syn, l, &tokens[pos], pos, 1, dq[0], dk[0], dv[0]);
            memcpy(dq[1], dq[0], sizeof dq[0]);
            memcpy(dk[1], dk[0], sizeof dk[0]);
            memcpy(dv[1], dv[0], sizeof dv[0]);
            EXPECT_OK(ctx, fg_decode(ctx, l, 2, ids, toks, &dq[0][0], &dk[0][0], &dv[0][0], &dout[0][0]));
        }
        EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
        a = sum_heads(ctx, s_fast);
        b = sum_heads(ctx, s_local);
        EXPECT(m.pages_in_use == a.pages + b.pages, "step %d: pool has %lld pages in use, heads hold %lld",
               (int)step, (long long)m.pages_in_use, (long long)(a.pages + b.pages));
        EXPECT(b.pages == LAYERS * HKV && b.rows == LAYERS * HKV * 8, "step %d: local-only holds %lld pages",
               (int)step, (long long)b.pages);
    }
    EXPECT(m.kv_bytes_full == 2 * (size_t)LAYERS * HKV * ((N + STEPS + P - 1) / P) * P * (2 * D * 2),
           "full bytes follow the length");

    /* a destroyed sequence's pages are reused without growing the pool */
    const size_t pool_before = m.pool_bytes;
    const int64_t fast_pages = a.pages;
    EXPECT_OK(ctx, fg_seq_destroy(ctx, s_fast));
    EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
    EXPECT(m.pages_in_use == b.pages, "after destroy: %lld pages in use, want %lld", (long long)m.pages_in_use,
           (long long)b.pages);
    EXPECT(m.pool_bytes < pool_before, "emptied chunks went back to the backend (%zu -> %zu)", pool_before,
           m.pool_bytes);
    int32_t s_again = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, tokens, N, &s_again));
    for (int32_t l = 0; l < LAYERS; l++) {
        synth_qkv(&syn, l, tokens, 0, N, q, k, v);
        EXPECT_OK(ctx, fg_prefill(ctx, s_again, l, q, k, v, out));
    }
    EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
    EXPECT(m.pages_in_use <= b.pages + fast_pages, "re-prefill uses no more pages than before");

    /* everything back: no page in use, no byte held by the pool */
    EXPECT_OK(ctx, fg_seq_destroy(ctx, s_again));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, s_local));
    EXPECT_OK(ctx, fg_trim(ctx));
    EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
    EXPECT(m.pages_in_use == 0 && m.pool_bytes == 0 && m.kv_bytes_held == 0, "empty context holds %zu pool bytes",
           m.pool_bytes);

    free(q);
    free(k);
    free(v);
    free(out);
    fg_context_destroy(&ctx);
    synth_destroy(&syn);
    return test_finish();
}
