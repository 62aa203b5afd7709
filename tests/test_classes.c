/*
 * Token classes (docs/design.md §2.1): the punctuation rule on pieces, byte-fallback
 * pieces, overrides, multi-token special markers (in a prompt and completed
 * while decoding), and sinks by position.
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"

static fg_token_class class_of(const fg_token_classes *tc, int32_t id) {
    fg_token_class c = (fg_token_class)-1;
    fg_token_classes_get(tc, id, &c);
    return c;
}

int main(void) {
    test_seed("test_classes");
    const char *pieces[] = {
        "<unk>", ".", " ,", "\n", "  ", "", "a.", "<0x2C>", "<0x41>", "<0x0A>", "<0xZZ>", "!?", "<s>", NULL, " the",
        "...\n", "<0x2c>", "\t",
    };
    const int32_t V = (int32_t)(sizeof pieces / sizeof pieces[0]);
    const fg_token_class want[] = {
        FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT, FG_TOKEN_PUNCT,    FG_TOKEN_PUNCT,    FG_TOKEN_PUNCT, FG_TOKEN_ORDINARY,
        FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT, FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT,    FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT,
        FG_TOKEN_ORDINARY, FG_TOKEN_ORDINARY, FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT, FG_TOKEN_PUNCT, FG_TOKEN_PUNCT,
    };
    fg_token_classes *tc = NULL;
    EXPECT_OK(NULL, fg_token_classes_create(V, pieces, &tc));
    for (int32_t i = 0; i < V; i++)
        EXPECT(class_of(tc, i) == want[i], "piece %d \"%s\": class %d, want %d", (int)i,
               pieces[i] ? pieces[i] : "(null)", (int)class_of(tc, i), (int)want[i]);

    /* a token that is both is special */
    EXPECT_OK(NULL, fg_token_classes_set(tc, 1, FG_TOKEN_SPECIAL));
    EXPECT(class_of(tc, 1) == FG_TOKEN_SPECIAL, "override to special");
    EXPECT(fg_token_classes_vocab_size(tc) == V, "vocab size");

    /* markers: every token of a matched occurrence is special, a partial match is not */
    const int32_t marker[] = {14, 6, 8};
    EXPECT_OK(NULL, fg_token_classes_add_sequence(tc, marker, 3));
    const int32_t stream[] = {0, 14, 6, 8, 14, 6, 2, 14, 6, 8};
    uint8_t cls[10];
    EXPECT_OK(NULL, fg_token_classes_classify(tc, stream, 10, 0, cls));
    const uint8_t want_stream[] = {0, 1, 1, 1, 0, 0, 2, 1, 1, 1};
    EXPECT(memcmp(cls, want_stream, 10) == 0, "marker classification");
    /* sinks */
    EXPECT_OK(NULL, fg_token_classes_classify(tc, stream, 10, 2, cls));
    EXPECT(cls[0] == FG_TOKEN_SPECIAL && cls[1] == FG_TOKEN_SPECIAL && cls[4] == 0, "n_sink = 2");

    /* while decoding: a marker completed by the new token makes it special;
     * a `special`-only head caches exactly its special tokens */
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = "ref";
    p.n_layers = 1;
    p.n_q_heads = p.n_kv_heads = 1;
    p.head_dim = 4;
    p.max_seq_len = 16;
    p.classes = tc;
    fg_compression_params special;
    fg_compression_params_preset("full", &special);
    special.shortlist[0].components = FG_KEEP_SPECIAL;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &special));
    const int32_t prompt[] = {1, 14, 6};
    float q[3 * 4] = {0}, k[3 * 4] = {0}, v[3 * 4] = {0}, out[3 * 4];
    int32_t seq = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, prompt, 3, &seq));
    EXPECT_OK(ctx, fg_prefill(ctx, seq, 0, q, k, v, out));
    const int32_t next[] = {8, 14, 0, 8};  /* completes the marker, then not */
    const int32_t kept_after[] = {2, 2, 2, 2};
    for (int32_t i = 0; i < 4; i++) {
        EXPECT_OK(ctx, fg_decode(ctx, 0, 1, &seq, &next[i], q, k, v, out));
        int32_t pos[16], n = 0;
        EXPECT_OK(ctx, fg_head_positions(ctx, seq, 0, 0, pos, 16, &n));
        EXPECT(n == kept_after[i], "step %d: special-only head keeps %d rows, want %d", (int)i, (int)n,
               (int)kept_after[i]);
        if (i == 0)
            EXPECT(n == 2 && pos[0] == 0 && pos[1] == 3, "BOS and the token that completed the marker");
    }
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
    EXPECT(tc == NULL, "destroy clears the handle");
    return test_finish();
}
