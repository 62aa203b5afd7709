/*
 * fastgen — adaptive KV-cache compression (FastGen, "Model Tells You What to
 * Discard", Ge et al., ICLR 2024) for LLM inference.
 *
 * Flow, per sequence:
 *   1. fg_seq_create()   registers the prompt tokens (classified special /
 *                        punctuation / ordinary by the context's token classes);
 *   2. fg_prefill()      once per layer: causal attention over the prompt, then
 *                        profiling of every KV head, policy choice, compaction;
 *   3. fg_decode()       once per layer per new token, batched over sequences:
 *                        attention over each head's compressed cache plus the
 *                        new token, score update, insertion and eviction;
 *   4. fg_seq_destroy()  returns the sequence's pages to the pool.
 *
 * Conventions: every function returns an fg_status (FG_OK = 0, errors < 0)
 * and leaves a message readable with fg_last_error(); handles are opaque;
 * the destroy calls of handles (fg_context_destroy, fg_token_classes_destroy,
 * fg_threadpool_destroy) take the address of the handle, accept NULL and
 * clear it; fg_seq_destroy takes a sequence's id.
 * Activations (Q, K, V, outputs) are fp32 arrays (or act_dtype's), aligned
 * to their elements (an unaligned one is refused), on the host by default or
 * in the device's memory with FG_IO_DEVICE; keys are passed after RoPE. A
 * failed call leaves every cache as it was before the call.
 *
 * Threads: contexts are independent; any number of threads may each drive
 * their own. One context takes one call at a time: it may pass from thread
 * to thread (the engine orders the calls), and a call that finds another
 * thread inside a call on the same context does nothing and returns
 * FG_ERR_BAD_STATE, its message in fg_last_error(NULL) (the context's
 * message stays that of the call in progress). fg_context_destroy must not
 * overlap any call on its context. Token classes and parameters are read
 * only: share them freely once built. A thread pool takes one job at a time
 * and queues the others (fg_threadpool_run).
 *
 * Growth: a public struct only ever grows at its end. Every call that reads
 * or fills one is an inline function of this header that passes the
 * struct's size, as the program was compiled, to the library's _sized entry
 * point. A program built against an older header therefore keeps working
 * with a newer library: the fields its header did not have take their
 * defaults, and outputs it does not know are not written. A struct from a
 * newer header is accepted by an older library when every field the library
 * does not know is zero, and refused with a message otherwise: so a field
 * added later has 0 as its default, and the struct's sizeof grows with it.
 * Bindings (ctypes, cffi) call the exported _sized functions with their
 * struct's size. A call that fails writes nothing to its output struct. A
 * size past 4096 bytes, which no version of these structs will reach, is
 * refused (FG_ERR_INVALID_ARGUMENT; the _default calls, which return
 * nothing, then write nothing). fg_policy is fixed as it is (new per-entry settings would join
 * fg_compression_params). Research switches and diagnostics that may change
 * between minor versions are declared only when FG_EXPERIMENTAL is defined
 * before this header is included.
 */
#ifndef FASTGEN_H
#define FASTGEN_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen_version.h"

#if defined(_WIN32) && defined(FG_BUILDING_DLL)
#define FG_API __declspec(dllexport)
#elif defined(_WIN32) && defined(FG_USING_DLL)
#define FG_API __declspec(dllimport)
#elif defined(__GNUC__)
#define FG_API __attribute__((visibility("default")))
#else
#define FG_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum fg_status {
    FG_OK = 0,
    FG_ERR_INVALID_ARGUMENT = -1, /* a NULL pointer, a size or value out of range */
    FG_ERR_OUT_OF_MEMORY = -2,    /* host or device allocation failed, or the pool cap */
    FG_ERR_UNAVAILABLE = -3,      /* backend not compiled in, or no device */
    FG_ERR_BAD_STATE = -4,        /* e.g. decode before prefill, prefill twice */
    FG_ERR_CAPACITY = -5,         /* a sequence past max_seq_len, too many sequences */
    FG_ERR_BACKEND = -6,          /* the backend (driver, kernel) failed */
    FG_ERR_IO = -7,               /* a file could not be read */
    FG_ERR_FORMAT = -8,           /* a file or string is malformed */
    FG_ERR_INTERNAL = -9          /* a bug: please report it */
} fg_status;

/* Static name of a status ("FG_ERR_INVALID_ARGUMENT: invalid argument"). */
FG_API const char *fg_status_string(fg_status status);

/* Runtime version string, e.g. "0.2.0"; compare with FG_VERSION_* macros. */
FG_API const char *fg_version(void);
/* The backends this build serves, e.g. "ref, cpu, cuda"; a HIP backend that
 * runs on the CPU through HIP-CPU is listed as "hip (HIP-CPU emulation)". */
FG_API const char *fg_build_backends(void);

/* ---------------------------------------------------------------- logging */

typedef enum fg_log_level { FG_LOG_ERROR = 0, FG_LOG_WARN = 1, FG_LOG_INFO = 2, FG_LOG_DEBUG = 3 } fg_log_level;
/* Called on the thread of the call that logs, in the middle of that call
 * (an error it returns, a step that failed and that the call goes on
 * without). It may read fg_last_error and use other contexts; a call on its
 * own context from it is refused (FG_ERR_BAD_STATE, nothing done), and
 * fg_context_destroy of that context from it does nothing. */
typedef void (*fg_log_fn)(void *user, fg_log_level level, const char *message);

/* ---------------------------------------------------------------- token classes
 * docs/design.md §2.1. Special: declared ids, every token of a declared multi-token
 * sequence, and positions < n_sink. Punctuation: pieces made only of ASCII
 * punctuation and whitespace (byte-fallback "<0xNN>" pieces by their byte).
 * A token that is both is special. */

typedef enum fg_token_class { FG_TOKEN_ORDINARY = 0, FG_TOKEN_SPECIAL = 1, FG_TOKEN_PUNCT = 2 } fg_token_class;

typedef struct fg_token_classes fg_token_classes;

/* What the pieces given to fg_token_classes_create_from are. */
typedef enum fg_piece_encoding {
    FG_PIECES_TEXT = 0,          /* the text each token stands for (decoded) */
    FG_PIECES_SENTENCEPIECE = 1, /* SentencePiece pieces: U+2581 for a space, "<0xNN>" byte pieces (GGUF
                                    tokenizer.ggml.model "llama") */
    FG_PIECES_GPT2_BYTES = 2     /* GPT-2 byte-level BPE pieces: every byte as its stand-in code point,
                                    "Ġ" for a space (tokenizer.ggml.model "gpt2", tokenizer.json) */
} fg_piece_encoding;

/* pieces: [vocab_size] NUL-terminated decoded pieces, or NULL (every id
 * ordinary until set). Pieces may be NULL individually. Raw vocabulary
 * strings (GGUF's tokenizer.ggml.tokens) go through
 * fg_token_classes_create_from with their encoding: as text, "▁," and "Ġ,"
 * are not punctuation. A context whose classes came from text of which many
 * pieces look encoded logs a warning (FG_LOG_WARN) that says so. */
FG_API fg_status fg_token_classes_create(int32_t vocab_size, const char *const *pieces, fg_token_classes **out);
FG_API fg_status fg_token_classes_create_from(int32_t vocab_size, const char *const *pieces,
                                              fg_piece_encoding encoding, fg_token_classes **out);
/* Ids of a class (e.g. how many pieces were found to be punctuation). */
FG_API int32_t fg_token_classes_count(const fg_token_classes *classes, fg_token_class cls);
FG_API void fg_token_classes_destroy(fg_token_classes **classes);
/* Override the class of one id (e.g. declare BOS and EOS special). */
FG_API fg_status fg_token_classes_set(fg_token_classes *classes, int32_t id, fg_token_class cls);
FG_API fg_status fg_token_classes_get(const fg_token_classes *classes, int32_t id, fg_token_class *out);
/* Declare a multi-token special marker such as "[INST]" = ids[0..n). */
FG_API fg_status fg_token_classes_add_sequence(fg_token_classes *classes, const int32_t *ids, int32_t n);
FG_API int32_t fg_token_classes_vocab_size(const fg_token_classes *classes);
/* Classify a whole token stream: out[n] receives fg_token_class values. */
FG_API fg_status fg_token_classes_classify(const fg_token_classes *classes, const int32_t *tokens, int32_t n,
                                           int32_t n_sink, uint8_t *out);

/* ---------------------------------------------------------------- policies
 * docs/design.md §2.2. A policy is a union of components; a shortlist is an ordered
 * list of policies, cheapest first. A head takes the first entry whose
 * attention recovery reaches the threshold, else the last entry. */

enum {
    FG_KEEP_SPECIAL = 1u << 0,
    FG_KEEP_PUNCT = 1u << 1,
    FG_KEEP_FREQUENT = 1u << 2, /* the k(t) best-ranked others, re-ranked and evicted every step (H2O, TOVA) */
    FG_KEEP_LOCAL = 1u << 3,
    FG_KEEP_FULL = 1u << 4,
    /* the k(n) best-ranked others of the prompt (n its length), chosen once at
     * prefill and kept for good: never re-ranked, never evicted (SnapKV, AdaKV) */
    FG_KEEP_SNAPSHOT = 1u << 5
};

#define FG_MAX_SHORTLIST 8

typedef struct fg_policy {
    uint32_t components;     /* FG_KEEP_* bits */
    float ratio_local;       /* r_l in [0,1]: window w(t) = max(1, ceil(r_l t)) */
    float ratio_frequent;    /* r_f in [0,1]: budget k(t) = ceil(r_f t) */
    int32_t local_tokens;    /* > 0: absolute window cap (the smaller wins); 0: none */
    int32_t frequent_tokens; /* > 0: absolute frequent cap; 0: none */
} fg_policy;

typedef enum fg_score_mode {
    FG_SCORE_SUM = 0,  /* cumulative attention (H2O, the paper) */
    FG_SCORE_MEAN = 1, /* cumulative attention / number of rows that saw the key */
    FG_SCORE_LAST = 2  /* the attention of the latest row only: each decode step replaces the score (TOVA) */
} fg_score_mode;

/* How the rows of a sequence are shared among its heads. */
typedef enum fg_allocation {
    /* each head takes its own shortlist entry: the first that recovers T, or
     * within the layer's budget in budget mode */
    FG_ALLOC_SHORTLIST = 0,
    /* AdaKV: one shortlist entry for every head, and the layer's frequent or
     * snapshot rows (Hkv x k(n)) go to the best-ranked keys over all its
     * heads together, each head keeping at least alloc_floor x k(n) */
    FG_ALLOC_ADAKV = 1,
    /* fastgen-adaptive: the sequence's budget shared among all its heads of
     * every layer by the error they are predicted to make. Every head holds
     * its full cache until the sequence has been observed: at the end of the
     * last layer's prefill, or, when the prompt is shorter than defer_until
     * tokens, at the decode step that reaches it or at the end of the
     * fg_seq_append (its last layer) that carries the sequence to or past it.
     * Then, for every (layer, KV head) and
     * every shortlist entry (a family: its components and the split of its
     * ratios) at 41 levels of memory, the attention output each of the last
     * observation_window rows would get, as a decode query at its own
     * position, from the rows that entry keeps is compared with the full
     * cache's (squared error, values included). The heads start from the
     * uniform allocation of the family predicted best; rows move between
     * heads and layers only where the predicted error falls, each head
     * keeping at least alloc_floor of the uniform share. Each head then keeps
     * its family's policy at its own ratios (fg_head_info.policy). Until then
     * the sequence holds its full cache; during the compression, the full
     * cache and the compressed one. The last entry must be full.
     * Non-finite arithmetic (a NaN or infinite query, key or value, or one
     * large enough to overflow a dot product) makes an entry's predicted
     * error the worst there is: it ranks after every finite one, and the
     * choice stays within the budget. */
    FG_ALLOC_ADAPTIVE = 2,
    /* TOVA: every head of a layer keeps the same rows. One shortlist entry
     * for every head, its frequent or snapshot rows ranked by the layer's
     * attention: each KV head's pooled attention averaged over the layer's
     * KV heads (the mean over all its query heads), at the prompt and at
     * every decode step's eviction. A context that holds some of a model's KV
     * heads (tensor parallelism) averages over the heads it holds. */
    FG_ALLOC_LAYER = 3
} fg_allocation;

#ifdef FG_EXPERIMENTAL
/* Variants of the adaptive mode (fg_compression_params.adaptive_flags), to
 * measure what each of its parts brings; none is better than the mode.
 * Experimental: they may change or go between minor versions. */
enum {
    FG_ADAPTIVE_PER_LAYER = 1u << 0,   /* the budget shared within each layer, not across layers */
    FG_ADAPTIVE_MASS = 1u << 1,        /* predicted error = the attention the kept rows miss (no values);
                                          FG_OBSERVE_SCORES: the share of the head's given scores the keys
                                          kept for a decode query after the sequence miss (no rows) */
    FG_ADAPTIVE_ANCHOR_END = 1u << 2,  /* every observed row judged by what is kept at the compression,
                                          not by what a query at its own position keeps */
    FG_ADAPTIVE_TAIL_RANKS = 1u << 3,  /* the frequent part ranks keys by the attention of the prompt's
                                          last observation_window rows, not of every prompt row */
    FG_ADAPTIVE_ROW_MAX = 1u << 4,     /* a choice's error is its worst observed row's, not their sum */
    FG_ADAPTIVE_ROW_NORM = 1u << 5     /* each observed row's error over its error with nothing kept but its
                                          own key and the pinned ones: every row weighs alike */
};
#endif

/* What fg_seq_append does with the heads' policies (the paper profiles once,
 * at the prompt; re-profiling every turn is beyond it). */
typedef enum fg_append_mode {
    /* Each head keeps its policy: the chunk is exactly its tokens decoded one
     * by one (§2.5). */
    FG_APPEND_KEEP = 0,
    /* The chunk is prefilled over each head's kept rows (every token attends
     * them and the chunk's tokens before it, all of them), then every head is
     * profiled again over the chunk's rows (§2.3 over the keys it holds; a
     * frequent candidate ranks by its cumulative score, the chunk's attention
     * added), takes the first entry that recovers T of that attention, and
     * keeps what that entry keeps of its rows and the chunk's. Dropped rows
     * never come back, so an entry with `local` whose window reaches rows the
     * head no longer holds is not a candidate. Not with budget mode. */
    FG_APPEND_REPROFILE = 1
} fg_append_mode;

/* The rows the adaptive mode judges its choices by (fg_compression_params.observe). */
typedef enum fg_observe_mode {
    /* the prompt's last observation_window rows, then the decode rows until
     * defer_until: compressed on its own as FG_ALLOC_ADAPTIVE says */
    FG_OBSERVE_TAIL = 0,
    /* the query rows the engine gives (fg_seq_observe), each judged as a
     * decode query after the whole sequence: e.g. a reconstruction pass
     * (KVzip's idea: the context fed again after "repeat the previous
     * context", so that every fact a later question may ask for is asked
     * for once), which makes the compression independent of the question.
     * The sequence holds its full cache until fg_seq_compress; defer_until
     * is not used. The frequent and snapshot parts then rank keys by the
     * given rows' attention alone. */
    FG_OBSERVE_EXPLICIT = 1,
    /* ExpectedAttention's idea, with no extra pass: the tail's rows (as
     * FG_OBSERVE_TAIL observes them) advanced by RoPE to positions spread
     * over the next predict_horizon tokens, each judged as a decode query
     * there, after the whole sequence: the queries decoding will bring,
     * predicted from the ones seen. Needs the context's RoPE
     * (fg_context_params.rope_theta). The frequent part ranks by the
     * prompt's profile with the predicted rows' attention added (as if they
     * had been decoded), the snapshot part by theirs alone. */
    FG_OBSERVE_PREDICTED = 2,
    /* KVzap's idea: a score per held key that the engine gives
     * (fg_seq_observe_scores; e.g. a small model calibrated offline on what
     * a reconstruction pass ranks high, fed the layer's hidden states) ranks
     * the keys of the frequent and snapshot parts in place of any attention,
     * and the prompt's last observation_window rows judge the allocation as
     * FG_OBSERVE_TAIL's do. No extra pass. The sequence holds its full cache
     * until fg_seq_compress; defer_until is not used. */
    FG_OBSERVE_SCORES = 3
} fg_observe_mode;

/* How the engine rotates a head's queries and keys (RoPE); only
 * FG_OBSERVE_PREDICTED reads it. */
typedef enum fg_rope_style {
    FG_ROPE_ADJACENT = 0, /* pairs (2i, 2i + 1): llama2.c, llama.cpp's LLAMA rope */
    FG_ROPE_HALVES = 1    /* pairs (i, i + rope_dims / 2): GPT-NeoX, Hugging Face's rotate_half */
} fg_rope_style;

typedef struct fg_compression_params {
    int32_t n_policies;                   /* 1..FG_MAX_SHORTLIST */
    fg_policy shortlist[FG_MAX_SHORTLIST];
    float threshold;                      /* T in (0,1] */
    int32_t n_sink;                       /* positions < n_sink are special */
    fg_score_mode score_mode;
    int32_t observation_window;           /* > 0: profile only the last m prompt rows */
    /* Budget mode (beyond the paper), on when either is > 0: instead of the
     * threshold, each layer's heads take the shortlist entries that recover
     * the most attention in total within the budget, chosen at prefill greedily
     * by recovery gained per row kept. Ratio-based entries then grow with the
     * sequence, so the kept share stays near the budget while decoding. A
     * recovery that is not finite (NaN or infinite attention) ranks below
     * every real one; every such search ends whatever the floats. A
     * one-entry shortlist has nothing to choose: refused with a budget. */
    float budget;                         /* KV rows kept / full, in [0, 1]; 0 = off */
    int32_t budget_tokens;                /* > 0: at most this many rows per KV head on average (the smaller wins) */
    fg_append_mode append_mode;           /* fg_seq_append: FG_APPEND_KEEP (default) or FG_APPEND_REPROFILE */
    /* > 1: a key's rank at prefill is the best profile score within
     * score_pool / 2 positions of it (max pooling, SnapKV: 7); 0 or 1: its own */
    int32_t score_pool;
    fg_allocation allocation;             /* FG_ALLOC_SHORTLIST (default), FG_ALLOC_ADAKV, FG_ALLOC_ADAPTIVE,
                                             FG_ALLOC_LAYER */
    float alloc_floor;                    /* AdaKV, adaptive: the share of the uniform one every head keeps, in [0, 1] */
    uint32_t adaptive_flags;              /* 0 (the adaptive mode); experimental variants for comparisons
                                             (FG_ADAPTIVE_*, declared with FG_EXPERIMENTAL) */
    int32_t defer_until;                  /* FG_ALLOC_ADAPTIVE: the heads keep their full caches until the sequence
                                             holds this many tokens (its prompt, when longer); the decode rows
                                             join the observed ones, so at most observation_window of them;
                                             at most the context's max_seq_len */
    fg_observe_mode observe;              /* FG_ALLOC_ADAPTIVE: FG_OBSERVE_TAIL (default), FG_OBSERVE_EXPLICIT,
                                             FG_OBSERVE_PREDICTED or FG_OBSERVE_SCORES */
    /* FG_ALLOC_ADAPTIVE, in [0, 1); 0 = off: a quality target instead of (or under) the budget. The
     * heads share the fewest rows (as the search finds them) whose allocation predicts an error of at
     * most tolerance x the error of keeping the least (every head at the lowest level of its best
     * family but full). The memory so follows the prompt; a budget, when also set, caps it. */
    float tolerance;
    /* FG_OBSERVE_PREDICTED: the observed rows land on positions spread over
     * the next predict_horizon tokens after the sequence (0 = 512), in
     * position order: the oldest nearest */
    int32_t predict_horizon;
} fg_compression_params;

/* The paper: special, +punct, +frequent, +local, full; r = 0.3, T = 0.95. */
FG_API void fg_compression_params_default_sized(fg_compression_params *params, size_t size);
static inline void fg_compression_params_default(fg_compression_params *params) {
    fg_compression_params_default_sized(params, sizeof *params);
}
/* Named presets: "fastgen", "full", "streamingllm" (special+local, 4 sinks),
 * "h2o" (frequent+local), "local", "frequent", "fastgen-budget" (budget mode
 * at 0.5 over special+punct+frequent+local at ratios 0.025, 0.05, 0.1, 0.15,
 * 0.2, 0.3 and 0.4, and full), and the peer methods:
 *   "snapkv": snapshot+local; keys ranked by the attention of the last 32
 *             prompt rows (observation_window), max-pooled over 7 positions;
 *   "adakv":  snapkv with FG_ALLOC_ADAKV, floor 0.2;
 *   "tova":   frequent, FG_SCORE_LAST, FG_ALLOC_LAYER: each step evicts the
 *             row the newest query attends least, averaged over the layer's
 *             heads, in all of them (observation_window 1 at prefill).
 * The one-entry presets keep ratio 0.3 in each of their components.
 * "fastgen-adaptive": FG_ALLOC_ADAPTIVE at budget 0.5 over the families
 * frequent+local (H2O), special+local (StreamingLLM, 4 sinks) and full;
 * the last 64 rows observed, compressed at 32 tokens at the earliest,
 * every head keeping at least 0.8 of the uniform share (alloc_floor). */
FG_API fg_status fg_compression_params_preset_sized(const char *name, fg_compression_params *params, size_t size);
static inline fg_status fg_compression_params_preset(const char *name, fg_compression_params *params) {
    return fg_compression_params_preset_sized(name, params, sizeof *params);
}
/* A compression written as one string, as `fastgen eval --methods` and
 * llama.cpp's --kv-compress take it: NAME[:KNOB][:KEY=VALUE]..., NAME a
 * preset; KNOB in (0, 1] the budget of fastgen-budget and fastgen-adaptive,
 * or the kept ratio of a one-entry preset (split evenly between a window and
 * a frequent or snapshot part where it has both: snapkv:0.5 keeps half the
 * prompt); options window, defer, floor, pool,
 * sink, horizon, tol (the fields observation_window, defer_until,
 * alloc_floor, score_pool, n_sink, predict_horizon, tolerance), flags
 * (adaptive_flags, experimental: per-layer, mass, end, tail, rowmax, rownorm joined by
 * '+'), families (the shortlist entries kept, as their digits: "02"),
 * observe (tail, reconstruct, predicted, scores) and alloc (shortlist, layer).
 * Examples: "fastgen-adaptive:0.25:observe=predicted", "h2o:0.5", "full".
 * The result is validated; on FG_ERR_INVALID_ARGUMENT the message names
 * the part refused and params is untouched. */
FG_API fg_status fg_compression_params_parse_sized(const char *spec, fg_compression_params *params, size_t size);
static inline fg_status fg_compression_params_parse(const char *spec, fg_compression_params *params) {
    return fg_compression_params_parse_sized(spec, params, sizeof *params);
}
/* The presets' names, i = 0, 1, ... (the three FastGen modes first); NULL
 * past the last: what a tool lists or loops over. */
FG_API const char *fg_compression_preset_name(int32_t i);
FG_API fg_status fg_compression_params_validate_sized(const fg_compression_params *params, size_t size);
static inline fg_status fg_compression_params_validate(const fg_compression_params *params) {
    return fg_compression_params_validate_sized(params, sizeof *params);
}
/* "special+punct+frequent" -> FG_KEEP_* bits (names: special, punct,
 * frequent, local, full, snapshot). */
FG_API fg_status fg_policy_parse(const char *text, uint32_t *components);
/* FG_KEEP_* bits -> "special+punct" (written to buf, always NUL-terminated). */
FG_API fg_status fg_policy_name(uint32_t components, char *buf, size_t buf_size);
/* The rows an entry's ratios give at sequence length t >= 1, as the library
 * computes them (each ratio rounded to parts per million first): its window
 * w(t) = max(1, ceil(ratio_local t)) and its frequent budget k(t) =
 * ceil(ratio_frequent t), each capped by its token cap when that is > 0.
 * What a tool needs to predict an entry's memory (the components decide
 * which of the two it keeps). Either output may be NULL. */
FG_API fg_status fg_policy_rows(const fg_policy *policy, int32_t t, int32_t *window, int32_t *frequent);

/* ---------------------------------------------------------------- context */

/* Storage of cached K/V rows. Accumulation is always fp32.
 * Q8_0 and Q4_0 are ggml's formats of the same names: a row of head_dim
 * values is cut into blocks along the head dimension, each stored as an
 * fp16 scale followed by its values, quantized once when the row is written
 * (round to nearest, as ggml quantizes):
 *   Q8_0  [scale][qb int8]        x = q * scale,        scale = max|x| / 127
 *   Q4_0  [scale][qb / 2 bytes]   x = (q - 8) * scale,  scale = (signed max) / -8;
 *         byte j holds value j in its low nibble and value j + qb / 2 in its high one
 * The block is qb = 32 values (ggml's block_q8_0 / block_q4_0, byte for byte,
 * so an engine can hand rows across) when 32 divides head_dim, else 16, else
 * 8 (one scale per block); quantized caches need head_dim to be a multiple
 * of 8. K and V share kv_dtype unless fg_context_params.v_dtype stores V
 * apart (llama.cpp's -ctk and -ctv: q8_0 keys and f16 values, say; ref and
 * cpu). fg_kv_row_bytes() gives a row's size. Profiling at prefill sees the prompt's unquantized K/V; what is read
 * back from the cache later (the adaptive mode's decisions, re-profiling on
 * append) is the quantized rows' values. Decoding dots cached Q8_0 / Q4_0 K
 * rows with the query rounded to Q8_0 blocks of the same size (as ggml dots
 * them; a block holding a NaN or an inf, or whose scale would overflow
 * fp16, is used as given), on every backend alike. */
typedef enum fg_dtype {
    FG_DTYPE_F32 = 0,
    FG_DTYPE_F16 = 1,
    FG_DTYPE_BF16 = 2,
    FG_DTYPE_Q8_0 = 3,
    FG_DTYPE_Q4_0 = 4
} fg_dtype;

/* "f32", "f16", "bf16", "q8_0", "q4_0" (NULL for a value outside the enum). */
FG_API const char *fg_dtype_name(fg_dtype dtype);
/* The dtype named by text (the names above); FG_ERR_INVALID_ARGUMENT otherwise. */
FG_API fg_status fg_dtype_parse(const char *text, fg_dtype *dtype);
/* Bytes of one cached K (or V) row of head_dim values stored as dtype, scales
 * included; 0 when the dtype cannot hold such a row (a quantized dtype and a
 * head_dim that is not a multiple of 8, or an unknown dtype). */
FG_API size_t fg_kv_row_bytes(fg_dtype dtype, int32_t head_dim);

typedef struct fg_context fg_context;

/* The most threads a context or pool may have: each thread of the cpu
 * backend has its own decode workspace. */
#define FG_MAX_THREADS 1024

/* A pool of threads for CPU work. Every context runs its CPU loops on one
 * (its own, or one the engine shares between contexts and its own loops,
 * as the fastgen CLI does for the model's matrix products). A job is n_tasks
 * calls fn(arg, task, thread), thread in [0, size) and the caller being 0;
 * tasks are taken one at a time, so a thread the OS deschedules holds up at
 * most the task it is in. Between jobs the workers spin briefly, then sleep
 * (FASTGEN_SPIN_US in the environment: how long, default 100), so a busy
 * machine does not make the threads wait on each other's time slices.
 * One job runs at a time: callers on other threads wait their turn; a task
 * that runs a job on its own pool runs it inline. A task of pool A may run
 * a job on another pool B; a task of that job may not run one on A again
 * (A's job waits on it): that call, and any call on a context whose pool is
 * A, returns FG_ERR_BAD_STATE and runs nothing. Pools nest in one order:
 * while one thread's task of A runs B, another thread's task of B that runs
 * A waits for ever (each job waits on the other pool), as two locks taken in
 * opposite orders do; the library cannot see that across threads. */
typedef struct fg_threadpool fg_threadpool;
typedef void (*fg_task_fn)(void *arg, int32_t task, int32_t thread);
/* The number of CPUs this process may run on (sched_getaffinity). */
FG_API int32_t fg_default_threads(void);
/* n_threads: 0 = fg_default_threads(); 1 = no worker threads. */
FG_API fg_status fg_threadpool_create(int32_t n_threads, fg_threadpool **out);
FG_API void fg_threadpool_destroy(fg_threadpool **pool);
/* A pool whose workers are an engine's threads, lent while the engine runs
 * fastgen from one of them (llama.cpp's graph threads, in its custom op):
 * it starts no thread. Thread t in 1..n_threads-1 calls
 * fg_threadpool_lend(pool, t, ticket) and serves the pool's jobs until
 * the caller's fg_threadpool_release(pool, ticket) (at once if that came
 * first); tickets grow, one per turn (each thread counts the turns the
 * same way). A job runs whether the lent threads came or not: the caller
 * takes the tasks of an absent one. */
FG_API fg_status fg_threadpool_create_lent(int32_t n_threads, fg_threadpool **out);
FG_API fg_status fg_threadpool_lend(fg_threadpool *pool, int32_t thread, uint64_t ticket);
FG_API fg_status fg_threadpool_release(fg_threadpool *pool, uint64_t ticket);
/* Threads of a pool, the caller included (1 for NULL). */
FG_API int32_t fg_threadpool_size(const fg_threadpool *pool);
/* Runs the job and returns when every task has finished (NULL pool:
 * serially). FG_OK; FG_ERR_INVALID_ARGUMENT (n_tasks < 0, or fn NULL with
 * tasks to run) and FG_ERR_BAD_STATE (see above) run nothing, with a message
 * in fg_last_error(NULL). */
FG_API fg_status fg_threadpool_run(fg_threadpool *pool, int32_t n_tasks, fg_task_fn fn, void *arg);

/* Where the activations of fg_prefill, fg_decode and fg_seq_append live. */
typedef enum fg_io {
    FG_IO_HOST = 0,  /* host arrays, on every backend; GPU backends copy them and wait for the result */
    FG_IO_DEVICE = 1 /* device addresses of the backend (cuda, hip): nothing crosses the bus but the host's
                        bookkeeping (one upload per step), and fg_decode returns without waiting */
} fg_io;

typedef struct fg_context_params {
    const char *backend;        /* "ref", "cpu", "cuda", "hip"; NULL = "cpu" */
    int32_t n_layers;
    int32_t n_q_heads;          /* Hq */
    int32_t n_kv_heads;         /* Hkv, divides Hq */
    int32_t head_dim;           /* d */
    fg_dtype kv_dtype;          /* storage of cached K, and of V unless v_dtype says otherwise; accumulation is
                                   fp32 */
    int32_t max_seqs;           /* sequences alive at once */
    int32_t max_seq_len;        /* prompt + generated tokens per sequence */
    int32_t page_tokens;        /* rows per page (default 16) */
    int32_t pool_chunk_pages;   /* pages per backend allocation (default 256) */
    size_t max_pool_bytes;      /* 0 = unlimited; else the pool never grows past it */
    int32_t n_threads;          /* cpu backend: 0 = the cores this process may run on (fg_default_threads),
                                   at most FG_MAX_THREADS; with threadpool, 0 or its size */
    fg_threadpool *threadpool;  /* optional: the pool the context's CPU work runs on (it must outlive the
                                   context); NULL = the context starts its own of n_threads */
    const fg_token_classes *classes; /* required; the context keeps its own copy */
    fg_log_fn log_fn;           /* optional; see fg_log_fn for what it may call */
    void *log_user;
    fg_io io;                   /* FG_IO_HOST (default) or FG_IO_DEVICE (cuda, hip) */
    void *stream;               /* cuda / hip: the engine's cudaStream_t / hipStream_t that all the context's
                                   work is queued on; NULL = the backend's own stream */
    int32_t v_dtype;            /* storage of cached V apart from K (an fg_dtype, as llama.cpp's -ctv), or -1
                                   (the default): kv_dtype. ref and cpu only: cuda and hip refuse a v_dtype
                                   other than kv_dtype with FG_ERR_UNAVAILABLE */
    int32_t act_dtype;          /* the dtype of q, k, v and out at fg_prefill, fg_prefill_chunk, fg_decode,
                                   fg_seq_append and fg_seq_observe (an fg_dtype): FG_DTYPE_F32 (0, the
                                   default), FG_DTYPE_F16 or FG_DTYPE_BF16, as the engine keeps them. The
                                   context converts them to fp32 where they lie (on the host, or on the
                                   device with FG_IO_DEVICE), once per call, and out back (rounded to
                                   nearest even); the kernels compute in fp32 as with fp32 activations.
                                   The fp32 copies live in buffers of the context (host, or device with
                                   FG_IO_DEVICE) as large as the largest call's q, k, v and out (a whole
                                   prompt for fg_prefill), kept until fg_trim or fg_context_destroy */
    /* The engine's RoPE, for FG_OBSERVE_PREDICTED (nothing else reads it): pair i of the first rope_dims
     * lanes of a head turns by theta^(-2i / rope_dims) / freq_factors[i] radians per position */
    float rope_theta;                /* the base (10000, 500000, ...); 0 (the default) = not described */
    int32_t rope_dims;               /* lanes rotated at the start of each head, even; 0 = head_dim */
    int32_t rope_style;              /* an fg_rope_style: FG_ROPE_ADJACENT (0) or FG_ROPE_HALVES */
    const float *rope_freq_factors;  /* optional [rope_dims / 2], each > 0 (llama.cpp's rope_freqs: Llama 3's
                                        scaling); the context copies them. NULL = all 1 */
} fg_context_params;

/* Every field's default: start from it (a zeroed struct is not one: its
 * page_tokens of 0 is refused, and a v_dtype of 0 would store V as f32). */
FG_API void fg_context_params_default_sized(fg_context_params *params, size_t size);
static inline void fg_context_params_default(fg_context_params *params) {
    fg_context_params_default_sized(params, sizeof *params);
}
FG_API fg_status fg_context_create_sized(const fg_context_params *params, size_t size, fg_context **out);
static inline fg_status fg_context_create(const fg_context_params *params, fg_context **out) {
    return fg_context_create_sized(params, sizeof *params, out);
}
/* The compression a sequence created with compression = NULL takes
 * (initially fg_compression_params_default's), validated as fg_seq_create
 * validates it; the context keeps a copy. */
FG_API fg_status fg_context_set_compression_sized(fg_context *ctx, const fg_compression_params *compression,
                                                  size_t size);
static inline fg_status fg_context_set_compression(fg_context *ctx, const fg_compression_params *compression) {
    return fg_context_set_compression_sized(ctx, compression, sizeof *compression);
}
FG_API void fg_context_destroy(fg_context **ctx);
/* The message of the last call on ctx: "" when it succeeded (every call
 * clears it first), or of this thread's last failure when ctx is NULL (for
 * failed creations, functions that take no context, and calls refused
 * because another thread was inside one). Never NULL. */
FG_API const char *fg_last_error(const fg_context *ctx);
/* Queues the context's work on another stream (cuda, hip; NULL = the
 * backend's own) after waiting for the work already queued. */
FG_API fg_status fg_context_set_stream(fg_context *ctx, void *stream);
/* Waits for the context's queued device work (FG_OK at once on host
 * backends). With FG_IO_DEVICE, fg_decode does not wait for its kernels: a
 * failure inside them is reported here, by fg_head_positions, and by the
 * next fg_prefill; the caches of that step are then undefined. */
FG_API fg_status fg_synchronize(fg_context *ctx);
/* Name of the backend the context runs on. */
FG_API const char *fg_context_backend(const fg_context *ctx);

#ifdef FG_EXPERIMENTAL
/* Diagnostics: what the cpu backend found on this CPU and picked for it:
 * vendor, family and model, the ISA, the decode kernel's prefetch hint and
 * why (measured by the process's first large decode steps: each layer's
 * step that reads >= 256 KiB of K and V; t0 until then; the environment
 * variables FASTGEN_PF_LOCALITY=nta|t0 and FG_CPU_ISA=generic|avx2|avx512
 * override, for benchmarks). The text and the variables may change between
 * minor versions. */
FG_API fg_status fg_cpu_describe(char *buf, size_t size);
#endif

/* Whether a backend is compiled in and usable here (FG_OK) or why not. */
FG_API fg_status fg_backend_probe(const char *name);

/* ---------------------------------------------------------------- sequences */

/* Registers a sequence with its prompt. compression: NULL = the context's
 * (fg_context_set_compression). */
FG_API fg_status fg_seq_create_sized(fg_context *ctx, const fg_compression_params *compression, size_t size,
                                     const int32_t *prompt, int32_t n_prompt, int32_t *seq_out);
static inline fg_status fg_seq_create(fg_context *ctx, const fg_compression_params *compression,
                                      const int32_t *prompt, int32_t n_prompt, int32_t *seq_out) {
    return fg_seq_create_sized(ctx, compression, sizeof *compression, prompt, n_prompt, seq_out);
}
FG_API fg_status fg_seq_destroy(fg_context *ctx, int32_t seq);
/* A new sequence that continues from seq (after its prefill, between decode
 * sweeps: every layer at the same length; FG_ERR_BAD_STATE before): it
 * shares seq's K/V row pages, which are never copied (each side writes new
 * rows into pages of its own, and a head whose share stops saving memory
 * gathers its kept rows into its own pages once), and its small metadata
 * pages, copied when one side is about to write them (copy-on-write); shared
 * pages are counted once by fg_memory(ctx, -1). Destroying either leaves the
 * other intact. */
FG_API fg_status fg_seq_fork(fg_context *ctx, int32_t seq, int32_t *child);
/* Tokens the sequence has at layer (0 before that layer's prefill). */
FG_API fg_status fg_seq_length(const fg_context *ctx, int32_t seq, int32_t layer, int32_t *length);

/* Prompt phase for one layer: out = causal attention; every KV head is
 * profiled, takes its policy and keeps its compressed cache. With
 * FG_IO_DEVICE the call waits once, for the profile the host chooses from.
 *   q:   [n_prompt][Hq][d]     k, v: [n_prompt][Hkv][d] (k after RoPE)
 *   out: [n_prompt][Hq][d] */
FG_API fg_status fg_prefill(fg_context *ctx, int32_t seq, int32_t layer, const void *q, const void *k, const void *v,
                            void *out);

/* Chunked prefill: rows [begin, begin + n) of the prompt of one layer, in
 * order (the first chunk at 0, each where the last ended). A chunk's output
 * is its rows' causal attention over the prompt so far; the layer's last
 * chunk (begin + n = the prompt's length) profiles every head over the whole
 * prompt, chooses its policy and compacts, as fg_prefill does. Until then
 * the sequence holds the chunks' q, k, v and row statistics (the memory of
 * an uncompressed prompt; device memory with FG_IO_DEVICE). The outputs, the
 * policies and the kept rows equal fg_prefill's bit for bit (ref, cuda, hip;
 * cpu when the chunks end on multiples of 64 rows, else within its float
 * rounding). A failed chunk can be sent again; fork and append wait for the
 * last chunk of every layer.
 *   q: [n][Hq][d]   k, v: [n][Hkv][d] (k after RoPE)   out: [n][Hq][d] */
FG_API fg_status fg_prefill_chunk(fg_context *ctx, int32_t seq, int32_t layer, int32_t begin, int32_t n,
                                  const void *q, const void *k, const void *v, void *out);

/* One decoding step of one layer for a batch of distinct sequences. tokens[i]
 * is the id of the new token of seqs[i]; its position is that sequence's
 * length at this layer. Every layer sees the same token for a position.
 *   seqs, tokens: [n_seqs]
 *   q: [n_seqs][Hq][d]   k, v: [n_seqs][Hkv][d]   out: [n_seqs][Hq][d] */
FG_API fg_status fg_decode(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                           const void *q, const void *k, const void *v, void *out);

/* n new tokens of one layer onto a sequence that holds a compressed cache
 * (a new user turn, the next chunk of a long prompt): each token attends the
 * kept rows and the chunk's tokens before it. With FG_APPEND_KEEP (the
 * sequence's append_mode) the heads keep their policies, inserting and
 * evicting exactly as n decode steps would (docs/design.md §2.5); with
 * FG_APPEND_REPROFILE every head is profiled again over the chunk and
 * recompacted (see fg_append_mode; the call then waits for the device).
 * Every layer appends the same tokens. All or nothing: on a failure the
 * sequence is as it was (keep: the call keeps a copy-on-write copy of its
 * state, so the pages it rewrites are copied once per call; re-profile: the
 * new caches go to new pages, the old ones are given back at the end).
 *   tokens: [n]   q: [n][Hq][d]   k, v: [n][Hkv][d] (k after RoPE)   out: [n][Hq][d] */
FG_API fg_status fg_seq_append(fg_context *ctx, int32_t seq, int32_t layer, const int32_t *tokens, int32_t n,
                               const void *q, const void *k, const void *v, void *out);

/* FG_OBSERVE_EXPLICIT: n rows of one layer that the engine feeds after the
 * sequence without keeping them (a reconstruction pass: the prompt again
 * after an instruction to repeat it) attend what the sequence holds and
 * each other (causal, as fg_seq_append would: out gets their attention),
 * and the attention they give each held key is what the adaptive mode ranks
 * and judges by when fg_seq_compress comes; the rows themselves are not
 * cached. Valid after the prompt's prefill, every layer at one length,
 * before fg_seq_compress; every layer must be given the same rows. Chunks
 * may be given in several calls (each attends the sequence and itself).
 * Host memory: a [max_seq_len] float per KV head of each layer, and every
 * stride-th given row (at most 2 x observation_window per layer).
 *   q: [n][Hq][d]   k, v: [n][Hkv][d] (k after RoPE)   out: [n][Hq][d] */
FG_API fg_status fg_seq_observe(fg_context *ctx, int32_t seq, int32_t layer, const void *q, const void *k,
                                const void *v, int32_t n, void *out);
/* FG_OBSERVE_SCORES: the engine's score of each of the n keys a layer
 * holds (n: the layer's length; every layer prefilled to one length, before
 * fg_seq_compress), scores [Hkv][n], fp32 in host memory whatever the
 * context's io and act_dtype, finite and >= 0, higher kept first. A second
 * call adds to the first's (refused if a sum would overflow). Every layer
 * must be given scores as many times. All or nothing. */
FG_API fg_status fg_seq_observe_scores(fg_context *ctx, int32_t seq, int32_t layer, const float *scores, int32_t n);
/* The ranks an FG_OBSERVE_EXPLICIT or FG_OBSERVE_SCORES sequence holds for
 * a layer's first n keys (what fg_seq_compress will rank by): the
 * attention the given rows gave each key, or the sum of the given scores;
 * 0 for a key nothing was given about. out [Hkv][n]; n at most the layer's
 * length. Before fg_seq_compress. What a calibration reads after a
 * reconstruction pass. */
FG_API fg_status fg_seq_observed_ranks(fg_context *ctx, int32_t seq, int32_t layer, float *out, int32_t n);
/* An adaptive sequence's heads compressed now (FG_ALLOC_ADAPTIVE: what it
 * would do on its own at defer_until), from the rows fg_seq_observe gave
 * (or ranked by the scores fg_seq_observe_scores gave, judged by the rows
 * it observed itself), else the ones it observed itself, ranked by the
 * prompt's attention. All or nothing. FG_ERR_BAD_STATE when
 * the sequence is not adaptive, is compressed already, has a layer not
 * prefilled or a sweep half done, or its layers were given different
 * numbers of rows or of score calls. */
FG_API fg_status fg_seq_compress(fg_context *ctx, int32_t seq);

/* ---------------------------------------------------------------- inspection */

typedef struct fg_head_info {
    int32_t policy_index;    /* index in the sequence's shortlist */
    uint32_t components;     /* FG_KEEP_* of the chosen policy */
    fg_policy policy;        /* the head's own policy: its shortlist entry, with the ratios and token
                                caps an allocation (FG_ALLOC_ADAKV) gave this head */
    int32_t n_policies;
    float recovery[FG_MAX_SHORTLIST]; /* profiled recovery of every entry */
    int32_t length;          /* t: tokens seen by this layer */
    int32_t kept;            /* rows the head keeps */
    size_t kv_bytes_held;    /* pages held by this head (K and V) */
    size_t kv_bytes_full;    /* pages a full cache of length t would hold */
    size_t kv_bytes_shared;  /* of kv_bytes_held: pages another sequence holds too (forks share
                                the rows they have in common; a head whose share stops paying
                                for itself gathers its rows into pages of its own) */
} fg_head_info;

FG_API fg_status fg_head_inspect_sized(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head,
                                       fg_head_info *info, size_t size);
static inline fg_status fg_head_inspect(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head,
                                        fg_head_info *info) {
    return fg_head_inspect_sized(ctx, seq, layer, kv_head, info, sizeof *info);
}
/* Kept positions in ascending order (a synchronising read). capacity: size of
 * positions; *n_out receives the kept count (even when capacity is short:
 * then FG_ERR_CAPACITY and nothing is written). */
FG_API fg_status fg_head_positions(fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, int32_t *positions,
                                   int32_t capacity, int32_t *n_out);

typedef struct fg_memory_stats {
    size_t kv_bytes_held;  /* K/V bytes of the pages in use */
    size_t kv_bytes_full;  /* K/V bytes of a full paged cache of the same sequences */
    size_t meta_bytes_held;/* slot metadata (position, flags, score) of the pages in use */
    size_t pool_bytes;     /* what the pool holds from the backend (pages in use + free) */
    int64_t pages_in_use;
    int64_t pages_free;
    int64_t rows_kept;     /* kept rows over all heads */
    int64_t rows_full;     /* rows a full cache would keep */
    size_t kv_bytes_alone; /* K/V bytes the sequences would hold sharing nothing: each head its kept
                              rows rounded up to pages (kv_bytes_held / kv_bytes_alone: what forks save) */
} fg_memory_stats;

/* seq < 0: the whole context, pages shared by forks counted once both in
 * kv_bytes_held and in kv_bytes_full (the full caches of forked sequences
 * would share the whole pages of their common prefix too), so a full-policy
 * sequence and its fork hold 100% of their full cache; rows_kept and
 * rows_full count every sequence's rows. Else one sequence, with every page
 * it holds, shared or not, against its own full cache (pool fields are
 * global). */
FG_API fg_status fg_memory_sized(const fg_context *ctx, int32_t seq, fg_memory_stats *stats, size_t size);
static inline fg_status fg_memory(const fg_context *ctx, int32_t seq, fg_memory_stats *stats) {
    return fg_memory_sized(ctx, seq, stats, sizeof *stats);
}
/* Returns pool chunks with no page in use to the backend, and the buffers
 * that act_dtype f16 / bf16 converts activations into. */
FG_API fg_status fg_trim(fg_context *ctx);

#ifdef __cplusplus
}
#endif

#endif /* FASTGEN_H */
