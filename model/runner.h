/*
 * A small Llama runner whose attention goes only through the fastgen API:
 * RMSNorm, RoPE (adjacent pairs, theta 10000), SwiGLU MLP, matmuls through
 * BLAS (sgemm over a prompt or a batch, sgemv for one token); prefill +
 * profiling + compaction per layer for the prompt, one batched fg_decode per
 * layer per token.
 */
#ifndef FGM_RUNNER_H
#define FGM_RUNNER_H

#include "fastgen.h"
#include "model/llama2c.h"
#include "model/tokenizer.h"

typedef struct fgm_runner_params {
    const char *backend;        /* NULL = the library default */
    fg_dtype kv_dtype;          /* K's storage, and V's unless v_apart */
    int v_apart;                /* V stored as v_dtype (llama.cpp's -ctv), not as kv_dtype (ref and cpu) */
    fg_dtype v_dtype;
    int32_t max_seqs;           /* sequences decoded together */
    int32_t page_tokens;        /* 0 = library default */
    int track_recovery;         /* measure attention recovered vs the full cache */
    int32_t max_len;            /* positions a sequence may hold; 0 = the model's context */
    int q8_activations;         /* ggml's 8-bit scheme for q4_0, q4_1, q5_0, q5_1 and q8_0 weights in the few-row
                                   products of a decode step: activations quantized to 8 bits per
                                   block, integer dots (model/matvec.h); 0: f32 activations against
                                   the dequantized weights. A prompt of more than FGM_MATVEC_MAX_ROWS
                                   tokens (or chunk, or appended turn) is multiplied in f32 either way */
    int32_t prefill_chunk;      /* > 0: prompts go through the model in chunks of this many tokens
                                   (fg_prefill_chunk); 0: at once */
    int32_t n_threads;          /* threads of the model's products and the attention; 0 = the cores this
                                   process may run on (fg_default_threads) */
} fgm_runner_params;

typedef struct fgm_runner fgm_runner;

fg_status fgm_runner_create(const fgm_llama_model *model, const fgm_tokenizer *tok, const fgm_runner_params *params,
                           fgm_runner **out, char *err, size_t err_size);
void fgm_runner_destroy(fgm_runner **r);
fg_context *fgm_runner_context(fgm_runner *r);
/* Rows per page of the context's KV cache. */
int32_t fgm_runner_page_tokens(const fgm_runner *r);
/* Positions a sequence may hold: the model's context, or max_len when less. */
int32_t fgm_runner_ctx_len(const fgm_runner *r);
/* Called after each layer of a prompt's pass (fgm_runner_prefill*): done of
 * total layer passes (chunks x layers). NULL: no calls. */
typedef void (*fgm_runner_progress_fn)(void *user, int32_t done, int32_t total);
void fgm_runner_set_progress(fgm_runner *r, fgm_runner_progress_fn fn, void *user);
const fg_token_classes *fgm_runner_classes(const fgm_runner *r);

/* Registers and prefills a prompt under cp (NULL = paper FastGen); logits of
 * its last position go to logits[vocab] (may be NULL). */
fg_status fgm_runner_prefill(fgm_runner *r, const fg_compression_params *cp, const int32_t *tokens, int32_t n,
                            int32_t *seq, float *logits);
/* The same prompt into k new sequences seqs[0..k), each under its own
 * cps[i]: one pass over the weights (the prompt's attention is full under
 * every policy); the caches differ. Logits as fgm_runner_prefill. All or none:
 * on failure no sequence is left. */
fg_status fgm_runner_prefill_many(fgm_runner *r, int32_t k, const fg_compression_params *cps, const int32_t *tokens,
                                 int32_t n, int32_t *seqs, float *logits);
/* One token for each of n sequences; logits: [n][vocab] (may be NULL). */
fg_status fgm_runner_decode(fgm_runner *r, int32_t n, const int32_t *seqs, const int32_t *tokens, float *logits);
/* n more tokens onto a sequence (a new turn): logits of its last one go to
 * logits[vocab] (may be NULL). */
fg_status fgm_runner_append(fgm_runner *r, int32_t seq, const int32_t *tokens, int32_t n, float *logits);
/* A reconstruction pass (KVzip's idea) for n_seqs sequences of one length
 * under FG_OBSERVE_EXPLICIT (one pass over the weights for all of them),
 * then their compression: prefix (an instruction to repeat what came
 * before) and context (what to repeat, the prompt) go through the model
 * after each sequence without being kept (fg_seq_observe), in chunks of the
 * context that fit the context window after it, each after the prefix;
 * then each is compressed (fg_seq_compress). *n_fed (may be NULL): the rows
 * fed per sequence. Not all or nothing: after a failure a sequence may hold
 * some layers' rows and not others', which fg_seq_compress refuses; release
 * it. */
fg_status fgm_runner_reconstruct(fgm_runner *r, int32_t n_seqs, const int32_t *seqs, const int32_t *prefix,
                                 int32_t n_prefix, const int32_t *context, int32_t n_context, int32_t *n_fed);
/* The same pass without the compression: the sequences' ranks (fg_seq_observed_ranks)
 * are what it leaves, for a calibration to read. */
fg_status fgm_runner_reconstruct_pass(fgm_runner *r, int32_t n_seqs, const int32_t *seqs, const int32_t *prefix,
                                      int32_t n_prefix, const int32_t *context, int32_t n_context, int32_t *n_fed);
/* A calibrated key scorer (model/scorer.h; borrowed, NULL: none): every
 * prompt pass then scores its keys, and a sequence prefilled under
 * FG_OBSERVE_SCORES is given its scores and compressed at the end of
 * fgm_runner_prefill*; without a scorer such a prefill fails. Refused when
 * the scorer was calibrated for another shape. */
struct fgm_scorer;
fg_status fgm_runner_set_scorer(fgm_runner *r, const struct fgm_scorer *sc);
/* Calibration: prompt passes copy each layer's normed input rows (what the
 * scorer reads) to feat [n_layers][rows][dim] at their positions, those
 * below rows; NULL: off. */
void fgm_runner_capture(fgm_runner *r, float *feat, int32_t rows);
/* A sequence that continues from seq, sharing its pages (fg_seq_fork). */
fg_status fgm_runner_fork(fgm_runner *r, int32_t seq, int32_t *child);
fg_status fgm_runner_release(fgm_runner *r, int32_t seq);
/* Why the last fgm_runner_prefill or fgm_runner_decode failed (one line). */
const char *fgm_runner_error(const fgm_runner *r);

/* Where the passes' time goes, when timing is on: the weight products (each
 * matrix product, its activation quantization and the pool's hand-off
 * included), the attention (the fastgen call of each layer: attention,
 * cache and policy), and the rest (embedding, RMSNorm, RoPE, residuals,
 * SwiGLU), in seconds since fgm_runner_timing last turned it on. */
typedef struct fgm_runner_times {
    double weights, attention, rest;
} fgm_runner_times;
/* Turns the timing on (and resets it) or off; off by default (a clock read
 * per phase change when on). */
void fgm_runner_timing(fgm_runner *r, int on);
fgm_runner_times fgm_runner_get_times(const fgm_runner *r);

/* Mean over decode steps, layers and query heads of the attention mass (under
 * the full cache) on the rows the head kept plus the new token. */
double fgm_runner_recovery(const fgm_runner *r, int32_t seq);

/* Sampling: temperature 0 = greedy; else among the top_k likeliest (0: all),
 * the smallest prefix of them whose renormalised mass reaches top_p, with a
 * seeded RNG. */
typedef struct fgm_sampler {
    float temperature, top_p;
    uint64_t state;
    int32_t top_k;
} fgm_sampler;
int32_t fgm_sample(fgm_sampler *s, float *logits, int32_t vocab);
/* llama.cpp's repetition penalty: each distinct token among the last last_n
 * of history[0..n) (last_n < 0: all of them) has its logit divided by
 * penalty when positive, multiplied when not. penalty 1: nothing. seen:
 * the caller's vocab bytes, all 0, left all 0 (the marks of one call). */
void fgm_penalize(float *logits, int32_t vocab, const int32_t *history, int32_t n, int32_t last_n, float penalty,
                  unsigned char *seen);

#endif
