/* The model runner of model/runner.h. */
#include "model/runner.h"

#include "common/vexp.h"
#include "fastgen_config.h"
#include "model/dequant.h"
#include "model/matvec.h"
#include "model/io.h"
#include "model/scorer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FG_HAVE_BLAS
#include <cblas.h>
#endif

#define FGM_RUNNER_TILE 64

struct fgm_runner {
    const fgm_llama_model *model;
    fg_context *ctx;
    fg_threadpool *threads; /* the model's products and the context's attention share it */
    fg_token_classes *classes;
    int32_t max_seqs, max_rows; /* rows = prompt positions or batch */
    int32_t ctx_len;            /* positions a sequence may hold: the model's, or less if asked */
    int32_t page_tokens;        /* rows per page of the context's cache */
    /* activations, [max_rows][width] */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    /* recovery tracking: every key of every sequence, [max_seqs][L][ctx_len][kv_dim] */
    int track;
    float *keys;
    double *rec_sum;
    int64_t *rec_count;
    int32_t *kept; /* [ctx_len] scratch */
    int32_t *pos;  /* [max_rows] position of each row */
    float *rope_freq; /* [head_size / 2] the angle per position of each pair of a head's lanes */
    float *rope_cs;   /* [max_rows][head_size / 2][2] each row's cos and sin per pair: the same in every layer */
    float *wtile;  /* [threads][FGM_RUNNER_TILE][max(dim, hidden)] weights of another type than f32, as floats */
    size_t wtile_size; /* floats per thread */
    fgm_q8_block *act;  /* [FGM_MATVEC_MAX_ROWS][max(dim, hidden) / 32] quantized activations, or NULL */
    int32_t prefill_chunk; /* tokens per prompt chunk; 0 = the whole prompt at once */
    fgm_runner_progress_fn progress; /* prompt passes: called after each layer (NULL: not) */
    void *progress_user;
    int32_t progress_done, progress_total;
    char error[512]; /* why the last prefill or decode failed */
    int timing;         /* fgm_runner_timing: phase is the one running since mark */
    int phase;
    double mark;
    fgm_runner_times times;
    const fgm_scorer *scorer; /* fgm_runner_set_scorer: prompt passes score their keys */
    float *scores;            /* [L][Hkv][ctx_len] the scorer's log-scores of the prompt's keys */
    float *feat;              /* fgm_runner_capture: [L][feat_rows][dim] the prompt's normed input rows */
    int32_t feat_rows;
};

enum { PHASE_NONE, PHASE_WEIGHTS, PHASE_ATTENTION, PHASE_REST };

static double runner_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The time since the last mark goes to the phase that ran; `next` runs from now. */
static void phase(fgm_runner *r, int next) {
    if (!r->timing)
        return;
    const double now = runner_now(), dt = now - r->mark;
    if (r->phase == PHASE_WEIGHTS)
        r->times.weights += dt;
    else if (r->phase == PHASE_ATTENTION)
        r->times.attention += dt;
    else if (r->phase == PHASE_REST)
        r->times.rest += dt;
    r->phase = next;
    r->mark = now;
}

void fgm_runner_timing(fgm_runner *r, int on) {
    r->timing = on != 0;
    r->phase = PHASE_NONE;
    r->times = (fgm_runner_times){0};
}

fgm_runner_times fgm_runner_get_times(const fgm_runner *r) { return r->times; }

/* Records why a prefill or decode failed (fgm_runner_error) and returns st. */
static fg_status runner_fail(fgm_runner *r, fg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static fg_status runner_fail(fgm_runner *r, fg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fgm_vfailf(r->error, sizeof r->error, st, fmt, ap);
    va_end(ap);
    return st;
}

/* y[rows][out] = x[rows][in] . W[out][in]^T over f32 weights, ldy apart */
static void matmul_f32(float *y, int32_t ldy, const float *x, const float *W, int32_t rows, int32_t in, int32_t out) {
#ifdef FG_HAVE_BLAS
    if (rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, W, in, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, W, in, 0.0f, y, ldy);
#else
    for (int32_t r = 0; r < rows; r++)
        for (int32_t o = 0; o < out; o++) {
            float s = 0.0f;
            for (int32_t i = 0; i < in; i++)
                s += W[(size_t)o * in + i] * x[(size_t)r * in + i];
            y[(size_t)r * ldy + o] = s;
        }
#endif
}

/* One task of matmul: FGM_RUNNER_TILE output columns (weight rows). */
typedef struct matmul_job {
    const fgm_runner *r;
    float *y;
    const float *x;
    const fgm_tensor *W;
    int32_t rows;
} matmul_job;

static void matmul_tile(void *arg, int32_t t, int32_t thread) {
    const matmul_job *j = arg;
    const fgm_tensor *W = j->W;
    const int32_t in = (int32_t)W->cols, out = (int32_t)W->rows;
    const int32_t o0 = t * FGM_RUNNER_TILE, n = out - o0 < FGM_RUNNER_TILE ? out - o0 : FGM_RUNNER_TILE;
    if (W->type == FGM_GGML_F32) {
        matmul_f32(j->y + o0, out, j->x, (const float *)W->data + (size_t)o0 * in, j->rows, in, n);
        return;
    }
    float *tile = j->r->wtile + (size_t)thread * j->r->wtile_size;
    const size_t row_bytes = (size_t)fgm_type_row_bytes(W->type, in);
    fgm_type_info_of(W->type)->to_float((const unsigned char *)W->data + (size_t)o0 * row_bytes, tile, (int64_t)n * in);
    matmul_f32(j->y + o0, out, j->x, tile, j->rows, in, n);
}

/* y[rows][W.rows] = x[rows][W.cols] . W^T. Weights in another type than f32
 * are read in place for a few rows (decode: model/matvec.h; with 8-bit
 * activations when the runner asks for them); for more rows (a prompt, a
 * large batch) they are dequantized FGM_RUNNER_TILE rows at a time into each
 * thread's scratch, never the whole matrix, and multiplied there in f32, as
 * ggml's BLAS backend does (through BLAS: 1.5x the prefill speed of 8-bit
 * products on SmolLM2, AMD Zen 5). Either way the work is spread over the runner's pool. */
static void matmul(fgm_runner *r, float *y, const float *x, const fgm_tensor *W, int32_t rows) {
    const int32_t out = (int32_t)W->rows;
    if (W->type != FGM_GGML_F32 && rows <= FGM_MATVEC_MAX_ROWS) {
        if (r->act && fgm_matvec_quantizes(W->type))
            fgm_matvec_q8(r->threads, y, out, x, W, rows, r->act);
        else
            fgm_matvec(r->threads, y, out, x, W, rows);
        return;
    }
    const matmul_job j = {r, y, x, W, rows};
    fg_threadpool_run(r->threads, (out + FGM_RUNNER_TILE - 1) / FGM_RUNNER_TILE, matmul_tile, (void *)&j);
}

/* matmul of one input with n <= 3 matrices (q, k and v; or the MLP's gate
 * and up projections): a decode step's products in one parallel job, the
 * input quantized once, when every matrix takes the same few-row path. */
static void matmul_many(fgm_runner *r, int32_t n, float *const *ys, const float *x, const fgm_tensor *const *Ws,
                        int32_t rows) {
    int q8 = r->act != NULL, few = rows <= FGM_MATVEC_MAX_ROWS;
    fgm_matvec_out outs[3];
    for (int32_t i = 0; i < n; i++) {
        q8 = q8 && Ws[i]->type != FGM_GGML_F32 && fgm_matvec_quantizes(Ws[i]->type);
        few = few && Ws[i]->type != FGM_GGML_F32;
        outs[i] = (fgm_matvec_out){ys[i], (int32_t)Ws[i]->rows, Ws[i]};
    }
    if (q8 && few) {
        fgm_matvec_q8_many(r->threads, outs, n, x, rows, r->act);
    } else if (few && !r->act) {
        fgm_matvec_many(r->threads, outs, n, x, rows);
    } else {
        for (int32_t i = 0; i < n; i++)
            matmul(r, ys[i], x, Ws[i], rows);
    }
}

/* Row `id` of a weight matrix, as floats. */
static void row_of(const fgm_tensor *W, int32_t id, float *dst) {
    const size_t row_bytes = (size_t)fgm_type_row_bytes(W->type, W->cols);
    fgm_type_info_of(W->type)->to_float((const unsigned char *)W->data + (size_t)id * row_bytes, dst, W->cols);
}

static void rmsnorm(float *o, const float *x, const float *w, int32_t n, float eps) {
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

/* The cos and sin of each pair's angle at pos (cs[2j], cs[2j + 1]), for rope(). */
static void rope_angles(float *cs, const float *freq, int32_t head_size, int32_t pos) {
    for (int32_t j = 0; j < head_size / 2; j++) {
        const float a = (float)pos * freq[j];
        cs[2 * j] = cosf(a);
        cs[2 * j + 1] = sinf(a);
    }
}

/* Rotates adjacent pairs of every head of one row by its angles (rope_angles:
 * computed once per row of a pass, not per head and layer; the same floats). */
static void rope(float *v, int32_t width, int32_t head_size, const float *cs) {
    for (int32_t h = 0; h < width; h += head_size)
        for (int32_t i = 0; i < head_size; i += 2) {
            const float c = cs[i], s = cs[i + 1], v0 = v[h + i], v1 = v[h + i + 1];
            v[h + i] = v0 * c - v1 * s;
            v[h + i + 1] = v0 * s + v1 * c;
        }
}

/* hb = silu(hb) hb2 over n values (SwiGLU). With AVX2, 8 at a time:
 * silu(a) = a s with s = 1 / (1 + e) for a >= 0 and e / (1 + e) below, e =
 * e^-|a| (fg_exp256 takes x <= 0; 1 + e never overflows). It differs from
 * the scalar a / (1 + e^-a) by a few ulp of rounding, and below a = -87.3
 * (fg_exp256's floor) gives about 1e-38 a where the scalar gives 0; that
 * the greedy ids of the GGUF test models stay llama.cpp's, with 8-bit
 * activations on AVX2 (test_gguf), says the models do not part on it. */
static void swiglu_generic(float *hb, const float *hb2, int32_t n, int32_t e0) {
    for (int32_t e = e0; e < n; e++) {
        const float a = hb[e];
        hb[e] = a / (1.0f + expf(-a)) * hb2[e];
    }
}

#ifdef FG_X86
FG_SIMD_AVX2_TARGET static void swiglu_avx2(float *hb, const float *hb2, int32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int32_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const __m256 a = _mm256_loadu_ps(hb + e);
        const __m256 t = fg_exp256(_mm256_or_ps(a, sign)); /* e^-|a| */
        const __m256 d = _mm256_add_ps(one, t);
        const __m256 s = _mm256_div_ps(_mm256_blendv_ps(one, t, a), d); /* a's sign bit picks e */
        _mm256_storeu_ps(hb + e, _mm256_mul_ps(_mm256_mul_ps(a, s), _mm256_loadu_ps(hb2 + e)));
    }
    swiglu_generic(hb, hb2, n, e);
}
#endif

static void swiglu(float *hb, const float *hb2, int32_t n) {
#ifdef FG_X86
    if (fg_cpu_features_get().isa >= FG_ISA_AVX2) {
        swiglu_avx2(hb, hb2, n);
        return;
    }
#endif
    swiglu_generic(hb, hb2, n, 0);
}

/* The runner's row-wise work between the products: the norms, RoPE, the
 * residuals and SwiGLU. 2 REST_ROWS rows or more (a prompt, a batch of 32
 * sequences) go over the pool REST_ROWS at a time (each row's arithmetic is
 * the one loop a single thread runs: the same bits on any number of
 * threads); fewer (a decode step of a few sequences) stay on the caller,
 * where a job's hand-off would cost more than the work. */
#define REST_ROWS 16
typedef enum {
    REST_NORM,     /* xb = norm(x) */
    REST_ADD_NORM, /* x += xb (the residual), then xb = norm(x) */
    REST_ADD,      /* x += xb */
    REST_ROPE,     /* q and k rotated */
    REST_SWIGLU    /* hb = silu(hb) hb2 */
} rest_op;

typedef struct rest_job {
    const fgm_runner *r;
    rest_op op;
    const float *norm; /* the norm's weights */
    int32_t rows;
} rest_job;

static void rest_rows(const rest_job *j, int32_t i0, int32_t i1) {
    const fgm_runner *r = j->r;
    const fgm_llama_config *c = &r->model->config;
    const int32_t D = c->dim, KV = c->kv_dim, H = c->hidden_dim, hs = c->head_size;
    for (int32_t i = i0; i < i1; i++) {
        float *x = r->x + (size_t)i * D, *xb = r->xb + (size_t)i * D;
        switch (j->op) {
        case REST_ADD_NORM:
        case REST_ADD:
            for (int32_t e = 0; e < D; e++)
                x[e] += xb[e];
            if (j->op == REST_ADD)
                break;
            /* fall through */
        case REST_NORM:
            rmsnorm(xb, x, j->norm, D, c->rms_eps);
            break;
        case REST_ROPE:
            rope(r->q + (size_t)i * D, D, hs, r->rope_cs + (size_t)i * hs);
            rope(r->k + (size_t)i * KV, KV, hs, r->rope_cs + (size_t)i * hs);
            break;
        case REST_SWIGLU:
            swiglu(r->hb + (size_t)i * H, r->hb2 + (size_t)i * H, H);
            break;
        }
    }
}

static void rest_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const rest_job *j = arg;
    const int32_t i0 = t * REST_ROWS;
    rest_rows(j, i0, j->rows - i0 < REST_ROWS ? j->rows : i0 + REST_ROWS);
}

static void rest(fgm_runner *r, rest_op op, const float *norm, int32_t rows) {
    const rest_job j = {r, op, norm, rows};
    if (rows < 2 * REST_ROWS || fg_threadpool_size(r->threads) < 2 ||
        fg_threadpool_run(r->threads, (rows + REST_ROWS - 1) / REST_ROWS, rest_task, (void *)&j) != FG_OK)
        rest_rows(&j, 0, rows); /* (the pool refuses nothing here: no job of its own is running) */
}

static fg_status fail(char *err, size_t n, fg_status st, const char *what) {
    return fgm_failf(err, n, st, "%s: %s", what, st == FG_OK ? "" : fg_last_error(NULL));
}

fg_status fgm_runner_create(const fgm_llama_model *model, const fgm_tokenizer *tok, const fgm_runner_params *rp,
                           fgm_runner **out, char *err, size_t err_size) {
    const fgm_llama_config *c = &model->config;
    *out = NULL;
    fgm_runner *r = calloc(1, sizeof *r);
    if (!r)
        return fail(err, err_size, FG_ERR_OUT_OF_MEMORY, "runner");
    r->model = model;
    r->max_seqs = rp->max_seqs > 0 ? rp->max_seqs : 1;
    r->ctx_len = rp->max_len > 0 && rp->max_len < c->seq_len ? rp->max_len : c->seq_len;
    r->max_rows = r->ctx_len > r->max_seqs ? r->ctx_len : r->max_seqs;
    r->track = rp->track_recovery;

    /* token classes: punctuation from the text of the pieces (a BPE piece's
       bytes, not its stand-ins); control tokens (BOS, EOS, chat markers) special */
    const char **pieces = malloc((size_t)c->vocab_size * sizeof *pieces);
    fg_status st = pieces ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) {
        for (int32_t i = 0; i < c->vocab_size; i++)
            pieces[i] = tok->kind == FGM_TOKENIZER_BPE ? tok->text[i] : tok->pieces[i];
        st = fg_token_classes_create(c->vocab_size, pieces, &r->classes);
        free(pieces);
    }
    for (int32_t i = 0; st == FG_OK && i < c->vocab_size; i++)
        if (tok->control[i])
            st = fg_token_classes_set(r->classes, i, FG_TOKEN_SPECIAL);
    if (st) {
        fgm_runner_destroy(&r);
        return fail(err, err_size, st, "token classes");
    }

    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = rp->backend;
    p.n_layers = c->n_layers;
    p.n_q_heads = c->n_heads;
    p.n_kv_heads = c->n_kv_heads;
    p.head_dim = c->head_size;
    p.kv_dtype = rp->kv_dtype;
    p.v_dtype = rp->v_apart ? (int32_t)rp->v_dtype : -1;
    p.max_seqs = r->max_seqs;
    p.max_seq_len = r->ctx_len;
    if (rp->page_tokens > 0)
        p.page_tokens = rp->page_tokens;
    r->page_tokens = p.page_tokens;
    p.classes = r->classes;
    p.rope_theta = c->rope_theta; /* rope() below: adjacent pairs over the whole head */
    p.rope_style = FG_ROPE_ADJACENT;
    st = fg_threadpool_create(rp->n_threads, &r->threads);
    if (st) {
        fgm_runner_destroy(&r);
        return fail(err, err_size, st, "threads");
    }
    p.threadpool = r->threads;
    st = fg_context_create(&p, &r->ctx);
    if (st) {
        fgm_runner_destroy(&r);
        return fail(err, err_size, st, "context");
    }

    const size_t rows = (size_t)r->max_rows, D = (size_t)c->dim, H = (size_t)c->hidden_dim;
    r->x = malloc(rows * D * sizeof(float));
    r->xb = malloc(rows * D * sizeof(float));
    r->q = malloc(rows * D * sizeof(float));
    r->k = malloc(rows * (size_t)c->kv_dim * sizeof(float));
    r->v = malloc(rows * (size_t)c->kv_dim * sizeof(float));
    r->att = malloc(rows * D * sizeof(float));
    r->hb = malloc(rows * H * sizeof(float));
    r->hb2 = malloc(rows * H * sizeof(float));
    r->pos = malloc(rows * sizeof(int32_t));
    r->rope_freq = malloc((size_t)c->head_size / 2 * sizeof(float));
    r->rope_cs = malloc(rows * (size_t)c->head_size * sizeof(float));
    for (int32_t j = 0; r->rope_freq && j < c->head_size / 2; j++)
        r->rope_freq[j] = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)c->head_size);
    r->wtile_size = (size_t)FGM_RUNNER_TILE * (D > H ? D : H);
    r->wtile = malloc((size_t)fg_threadpool_size(r->threads) * r->wtile_size * sizeof(float));
    r->prefill_chunk = rp->prefill_chunk > 0 ? rp->prefill_chunk : 0;
    if (rp->q8_activations)
        r->act = malloc((size_t)FGM_MATVEC_MAX_ROWS * ((D > H ? D : H) / 32 + 1) * sizeof *r->act);
    int ok = r->x && r->xb && r->q && r->k && r->v && r->att && r->hb && r->hb2 && r->pos && r->rope_freq &&
             r->rope_cs && r->wtile && (r->act || !rp->q8_activations);
    if (r->track) {
        r->keys = malloc((size_t)r->max_seqs * c->n_layers * r->ctx_len * c->kv_dim * sizeof(float));
        r->rec_sum = calloc((size_t)r->max_seqs, sizeof(double));
        r->rec_count = calloc((size_t)r->max_seqs, sizeof(int64_t));
        r->kept = malloc((size_t)r->ctx_len * sizeof(int32_t));
        ok = ok && r->keys && r->rec_sum && r->rec_count && r->kept;
    }
    if (!ok) {
        fgm_runner_destroy(&r);
        return fail(err, err_size, FG_ERR_OUT_OF_MEMORY, "runner activations");
    }
#ifdef FG_HAVE_OPENBLAS /* another BLAS: nothing to set */
    openblas_set_num_threads(1); /* each task's product runs on its own thread of the pool */
#endif
    *out = r;
    return FG_OK;
}

void fgm_runner_destroy(fgm_runner **pr) {
    if (!pr || !*pr)
        return;
    fgm_runner *r = *pr;
    fg_context_destroy(&r->ctx);
    fg_threadpool_destroy(&r->threads);
    fg_token_classes_destroy(&r->classes);
    free(r->x);
    free(r->xb);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->att);
    free(r->hb);
    free(r->hb2);
    free(r->keys);
    free(r->rec_sum);
    free(r->rec_count);
    free(r->kept);
    free(r->pos);
    free(r->rope_freq);
    free(r->rope_cs);
    free(r->wtile);
    free(r->act);
    free(r->scores);
    free(r);
    *pr = NULL;
}

int32_t fgm_runner_page_tokens(const fgm_runner *r) { return r->page_tokens; }

int32_t fgm_runner_ctx_len(const fgm_runner *r) { return r->ctx_len; }

fg_context *fgm_runner_context(fgm_runner *r) { return r->ctx; }

void fgm_runner_set_progress(fgm_runner *r, fgm_runner_progress_fn fn, void *user) {
    r->progress = fn;
    r->progress_user = user;
}
const fg_token_classes *fgm_runner_classes(const fgm_runner *r) { return r->classes; }

fg_status fgm_runner_set_scorer(fgm_runner *r, const fgm_scorer *sc) {
    const fgm_llama_config *c = &r->model->config;
    if (sc && (sc->n_layers != c->n_layers || sc->n_kv_heads != c->n_kv_heads || sc->dim != c->dim))
        return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "the scorer was calibrated for %d layers, %d KV heads and "
                           "width %d; this model has %d, %d and %d", (int)sc->n_layers, (int)sc->n_kv_heads,
                           (int)sc->dim, (int)c->n_layers, (int)c->n_kv_heads, (int)c->dim);
    if (sc && !r->scores &&
        !(r->scores = malloc((size_t)c->n_layers * c->n_kv_heads * r->ctx_len * sizeof *r->scores)))
        return runner_fail(r, FG_ERR_OUT_OF_MEMORY, "out of memory for the scorer's key scores");
    r->scorer = sc;
    return FG_OK;
}

void fgm_runner_capture(fgm_runner *r, float *feat, int32_t rows) {
    r->feat = feat;
    r->feat_rows = feat ? rows : 0;
}

/* FG_OBSERVE_SCORES: a prefilled sequence given every layer's scores of its
 * n keys (the scorer's, from the prompt's pass), then compressed. */
static fg_status give_scores(fgm_runner *r, int32_t seq, int32_t n) {
    const fgm_llama_config *c = &r->model->config;
    if (!r->scorer)
        return runner_fail(r, FG_ERR_BAD_STATE, "observe=scores ranks keys by a calibrated scorer, and none is loaded "
                           "(fastgen calibrate writes one)");
    float *buf = malloc((size_t)c->n_kv_heads * n * sizeof *buf);
    if (!buf)
        return runner_fail(r, FG_ERR_OUT_OF_MEMORY, "out of memory for a sequence's key scores");
    fg_status st = FG_OK;
    for (int32_t l = 0; l < c->n_layers && st == FG_OK; l++) {
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            const float *ls = r->scores + ((size_t)l * c->n_kv_heads + g) * r->ctx_len;
            for (int32_t j = 0; j < n; j++) /* the log-score, bounded so that exp stays finite */
                buf[(size_t)g * n + j] = expf(ls[j] < -80.0f ? -80.0f : ls[j] > 80.0f ? 80.0f : ls[j]);
        }
        st = fg_seq_observe_scores(r->ctx, seq, l, buf, n);
    }
    free(buf);
    if (st == FG_OK)
        st = fg_seq_compress(r->ctx, seq);
    return st ? runner_fail(r, st, "%s", fg_last_error(r->ctx)) : FG_OK;
}

static float *seq_keys(const fgm_runner *r, int32_t seq, int32_t layer) {
    const fgm_llama_config *c = &r->model->config;
    return r->keys + (((size_t)seq * c->n_layers + layer) * r->ctx_len) * c->kv_dim;
}

/* After fg_decode of `layer` for row b (sequence seq at position pos): the
 * full-cache attention of each query head, and its mass on the kept rows. */
static fg_status track_recovery(fgm_runner *r, int32_t layer, int32_t b, int32_t seq, int32_t pos) {
    const fgm_llama_config *c = &r->model->config;
    const int32_t hs = c->head_size, G = c->n_heads / c->n_kv_heads;
    const float *keys = seq_keys(r, seq, layer);
    for (int32_t g = 0; g < c->n_kv_heads; g++) {
        int32_t n_kept = 0;
        fg_status st = fg_head_positions(r->ctx, seq, layer, g, r->kept, r->ctx_len, &n_kept);
        if (st)
            return st;
        for (int32_t h = g * G; h < (g + 1) * G; h++) {
            const float *q = r->q + (size_t)b * c->dim + (size_t)h * hs;
            double m = -INFINITY, sum = 0.0, kept = 0.0;
            for (int32_t j = 0; j <= pos; j++) {
                double s = 0.0;
                for (int32_t x = 0; x < hs; x++)
                    s += (double)q[x] * keys[(size_t)j * c->kv_dim + (size_t)g * hs + x];
                m = s > m ? s : m;
            }
            int32_t ki = 0;
            for (int32_t j = 0; j <= pos; j++) {
                double s = 0.0;
                for (int32_t x = 0; x < hs; x++)
                    s += (double)q[x] * keys[(size_t)j * c->kv_dim + (size_t)g * hs + x];
                double e = exp((s - m) / sqrt((double)hs));
                sum += e;
                while (ki < n_kept && r->kept[ki] < j)
                    ki++;
                if (j == pos || (ki < n_kept && r->kept[ki] == j))
                    kept += e;
            }
            r->rec_sum[seq] += kept / sum;
            r->rec_count[seq]++;
        }
    }
    return FG_OK;
}

/* One transformer pass over `rows` rows: positions of a prompt (seqs ==
 * NULL) or one new token of each of `rows` sequences. A prompt goes into each
 * of the n_same sequences same[] (or with `append`, a chunk after what the one
 * sequence same[0] holds): the full attention over a prompt is the same under
 * every policy, so the weights are multiplied once and only the caches, which
 * each sequence compresses its own way, differ. PASS_CHUNK: rows are a chunk
 * of the prompt from position pos[0] (fg_prefill_chunk). */
/* How a pass over prompt rows reaches the caches. PASS_OBSERVE: rows after
 * the sequence that it does not keep (fg_seq_observe). */
enum { PASS_PREFILL, PASS_APPEND, PASS_CHUNK, PASS_OBSERVE };

static fg_status forward(fgm_runner *r, int32_t rows, const int32_t *same, int32_t n_same, int mode,
                         const int32_t *seqs, const int32_t *tokens, const int32_t *pos, float *logits,
                         int logits_last_only) {
    const fgm_llama_model *m = r->model;
    const fgm_llama_config *c = &m->config;
    const fgm_llama_weights *w = &m->weights;
    const int32_t D = c->dim, KV = c->kv_dim;
    const int32_t hs = c->head_size;
    phase(r, PHASE_REST);
    for (int32_t i = 0; i < rows; i++) {
        row_of(&w->token_embedding, tokens[i], r->x + (size_t)i * D);
        rope_angles(r->rope_cs + (size_t)i * hs, r->rope_freq, hs, pos[i]);
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        const fgm_llama_layer *ly = &w->layers[l];
        /* the last layer's MLP residual, then this layer's norm */
        rest(r, l == 0 ? REST_NORM : REST_ADD_NORM, ly->rms_att, rows);
        if (!seqs && (mode == PASS_PREFILL || mode == PASS_CHUNK)) { /* a prompt's rows: scored, captured */
            if (r->scorer)
                fgm_scorer_predict(r->scorer, l, r->xb, rows, r->scores + (size_t)l * c->n_kv_heads * r->ctx_len,
                                   (size_t)r->ctx_len, pos[0]);
            if (r->feat && pos[0] + rows <= r->feat_rows)
                memcpy(r->feat + ((size_t)l * r->feat_rows + pos[0]) * D, r->xb, (size_t)rows * D * sizeof *r->xb);
        }
        phase(r, PHASE_WEIGHTS);
        matmul_many(r, 3, (float *const[]){r->q, r->k, r->v}, r->xb,
                    (const fgm_tensor *const[]){&ly->wq, &ly->wk, &ly->wv}, rows);
        phase(r, PHASE_REST);
        rest(r, REST_ROPE, NULL, rows);
        fg_status st = FG_OK;
        phase(r, PHASE_ATTENTION);
        if (!seqs) {
            for (int32_t i = 0; st == FG_OK && i < n_same; i++) {
                st = mode == PASS_APPEND    ? fg_seq_append(r->ctx, same[i], l, tokens, rows, r->q, r->k, r->v, r->att)
                     : mode == PASS_CHUNK   ? fg_prefill_chunk(r->ctx, same[i], l, pos[0], rows, r->q, r->k, r->v, r->att)
                     : mode == PASS_OBSERVE ? fg_seq_observe(r->ctx, same[i], l, r->q, r->k, r->v, rows, r->att)
                                            : fg_prefill(r->ctx, same[i], l, r->q, r->k, r->v, r->att);
                if (st == FG_OK && r->track && mode != PASS_OBSERVE)
                    memcpy(seq_keys(r, same[i], l) + (size_t)pos[0] * KV, r->k, (size_t)rows * KV * sizeof(float));
            }
        } else {
            if (r->track)
                for (int32_t i = 0; i < rows; i++)
                    memcpy(seq_keys(r, seqs[i], l) + (size_t)pos[i] * KV, r->k + (size_t)i * KV,
                           (size_t)KV * sizeof(float));
            st = fg_decode(r->ctx, l, rows, seqs, tokens, r->q, r->k, r->v, r->att);
            for (int32_t i = 0; st == FG_OK && r->track && i < rows; i++)
                st = track_recovery(r, l, i, seqs[i], pos[i]);
        }
        phase(r, st ? PHASE_NONE : PHASE_WEIGHTS);
        if (st)
            return st;
        if (!seqs && r->progress && r->progress_total > 0)
            r->progress(r->progress_user, ++r->progress_done, r->progress_total);
        matmul(r, r->xb, r->att, &ly->wo, rows);
        phase(r, PHASE_REST);
        rest(r, REST_ADD_NORM, ly->rms_ffn, rows);
        phase(r, PHASE_WEIGHTS);
        matmul_many(r, 2, (float *const[]){r->hb, r->hb2}, r->xb, (const fgm_tensor *const[]){&ly->w1, &ly->w3}, rows);
        phase(r, PHASE_REST);
        rest(r, REST_SWIGLU, NULL, rows);
        phase(r, PHASE_WEIGHTS);
        matmul(r, r->xb, r->hb, &ly->w2, rows);
        phase(r, PHASE_REST); /* its residual goes in with the next layer's norm */
    }
    rest(r, REST_ADD, NULL, rows);
    if (logits) {
        int32_t first = logits_last_only ? rows - 1 : 0;
        for (int32_t i = first; i < rows; i++)
            rmsnorm(r->xb + (size_t)(i - first) * D, r->x + (size_t)i * D, w->rms_final, D, c->rms_eps);
        phase(r, PHASE_WEIGHTS);
        matmul(r, logits, r->xb, &w->wcls, rows - first);
    }
    phase(r, PHASE_NONE);
    return FG_OK;
}

fg_status fgm_runner_prefill(fgm_runner *r, const fg_compression_params *cp, const int32_t *tokens, int32_t n,
                            int32_t *seq, float *logits) {
    return fgm_runner_prefill_many(r, 1, cp, tokens, n, seq, logits);
}

fg_status fgm_runner_prefill_many(fgm_runner *r, int32_t k, const fg_compression_params *cps, const int32_t *tokens,
                                 int32_t n, int32_t *seqs, float *logits) {
    if (k <= 0 || k > r->max_seqs)
        return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "%d sequences of one prompt (this runner holds 1 to %d)", (int)k,
                           (int)r->max_seqs);
    if (n <= 0 || n > r->ctx_len)
        return runner_fail(r, n <= 0 ? FG_ERR_INVALID_ARGUMENT : FG_ERR_CAPACITY,
                           "a prompt of %d tokens does not fit the context of %d", (int)n, (int)r->ctx_len);
    for (int32_t i = 0; cps && !r->scorer && i < k; i++) /* before any work: what would fail at the end */
        if (cps[i].allocation == FG_ALLOC_ADAPTIVE && cps[i].observe == FG_OBSERVE_SCORES)
            return runner_fail(r, FG_ERR_BAD_STATE, "observe=scores ranks keys by a calibrated scorer, and none is "
                               "loaded (fastgen calibrate writes one)");
    fg_status st = FG_OK;
    int32_t made = 0;
    for (; made < k && st == FG_OK; made++) {
        fg_compression_params shorter;
        const fg_compression_params *cp = cps ? &cps[made] : NULL;
        if (cp && cp->allocation == FG_ALLOC_ADAPTIVE && cp->defer_until >= r->ctx_len && r->ctx_len > 1) {
            shorter = *cp; /* a preset made for longer contexts: compressed before this one's last step */
            shorter.defer_until = r->ctx_len - 1;
            cp = &shorter;
        }
        if ((st = fg_seq_create(r->ctx, cp, tokens, n, &seqs[made])) != FG_OK)
            runner_fail(r, st, "%s", fg_last_error(r->ctx));
    }
    if (st == FG_OK) {
        made = k;
        for (int32_t i = 0; i < n; i++)
            r->pos[i] = i;
        const int32_t chunk = r->prefill_chunk > 0 && r->prefill_chunk < n ? r->prefill_chunk : n;
        r->progress_done = 0;
        r->progress_total = (n + chunk - 1) / chunk * r->model->config.n_layers;
        for (int32_t at = 0; at < n && st == FG_OK; at += chunk) {
            const int32_t m = n - at < chunk ? n - at : chunk;
            st = forward(r, m, seqs, k, chunk < n ? PASS_CHUNK : PASS_PREFILL, NULL, tokens + at, r->pos + at,
                         at + m == n ? logits : NULL, 1);
        }
        if (r->progress && r->progress_done < r->progress_total) /* a failed pass: the line goes too */
            r->progress(r->progress_user, r->progress_total, r->progress_total);
        r->progress_total = 0;
        if (st)
            runner_fail(r, st, "%s", fg_last_error(r->ctx));
    } else {
        made--; /* the one that failed was not made */
    }
    if (st) {
        for (int32_t i = 0; i < made; i++)
            fg_seq_destroy(r->ctx, seqs[i]);
        return st;
    }
    for (int32_t i = 0; i < k && st == FG_OK; i++) /* the sequences that rank by the scorer, compressed now */
        if (cps && cps[i].allocation == FG_ALLOC_ADAPTIVE && cps[i].observe == FG_OBSERVE_SCORES)
            st = give_scores(r, seqs[i], n);
    if (st) {
        for (int32_t i = 0; i < k; i++)
            fg_seq_destroy(r->ctx, seqs[i]);
        return st;
    }
    for (int32_t i = 0; r->track && i < k; i++) {
        r->rec_sum[seqs[i]] = 0.0;
        r->rec_count[seqs[i]] = 0;
    }
    return FG_OK;
}

fg_status fgm_runner_decode(fgm_runner *r, int32_t n, const int32_t *seqs, const int32_t *tokens, float *logits) {
    if (n <= 0 || n > r->max_seqs)
        return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "a batch of %d sequences (this runner decodes 1 to %d)", (int)n,
                           (int)r->max_seqs);
    for (int32_t i = 0; i < n; i++) {
        fg_status st = fg_seq_length(r->ctx, seqs[i], 0, &r->pos[i]);
        if (st)
            return runner_fail(r, st, "%s", fg_last_error(r->ctx));
        if (r->pos[i] >= r->ctx_len)
            return runner_fail(r, FG_ERR_CAPACITY, "sequence %d is full: %d tokens, the whole context",
                               (int)seqs[i], (int)r->pos[i]);
    }
    fg_status st = forward(r, n, NULL, 0, PASS_PREFILL, seqs, tokens, r->pos, logits, 0);
    return st ? runner_fail(r, st, "%s", fg_last_error(r->ctx)) : FG_OK;
}

fg_status fgm_runner_append(fgm_runner *r, int32_t seq, const int32_t *tokens, int32_t n, float *logits) {
    int32_t t = 0;
    fg_status st = fg_seq_length(r->ctx, seq, 0, &t);
    if (st)
        return runner_fail(r, st, "%s", fg_last_error(r->ctx));
    if (n <= 0 || n > r->ctx_len - t)
        return runner_fail(r, n <= 0 ? FG_ERR_INVALID_ARGUMENT : FG_ERR_CAPACITY,
                           "%d more tokens do not fit after %d in the context of %d", (int)n, (int)t,
                           (int)r->ctx_len);
    for (int32_t i = 0; i < n; i++)
        r->pos[i] = t + i;
    st = forward(r, n, &seq, 1, PASS_APPEND, NULL, tokens, r->pos, logits, 1);
    return st ? runner_fail(r, st, "%s", fg_last_error(r->ctx)) : FG_OK;
}

fg_status fgm_runner_reconstruct_pass(fgm_runner *r, int32_t n_seqs, const int32_t *seqs, const int32_t *prefix,
                                      int32_t n_prefix, const int32_t *context, int32_t n_context, int32_t *n_fed) {
    int32_t t = 0;
    if (n_seqs <= 0 || n_seqs > r->max_seqs || !seqs)
        return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "a reconstruction of %d sequences (this runner holds 1 to %d)",
                           (int)n_seqs, (int)r->max_seqs);
    fg_status st = FG_OK;
    for (int32_t i = 0; i < n_seqs && st == FG_OK; i++) {
        int32_t ti = 0;
        st = fg_seq_length(r->ctx, seqs[i], 0, &ti);
        if (st == FG_OK && i > 0 && ti != t)
            return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "sequences reconstructed together must have one length "
                               "(%d and %d)", (int)t, (int)ti);
        t = ti;
    }
    if (st)
        return runner_fail(r, st, "%s", fg_last_error(r->ctx));
    if (n_prefix < 0 || n_context <= 0 || (n_prefix > 0 && !prefix) || !context)
        return runner_fail(r, FG_ERR_INVALID_ARGUMENT, "a reconstruction needs its context (%d tokens) and its "
                           "prefix (%d tokens)", (int)n_context, (int)n_prefix);
    const int32_t room = r->ctx_len - t - n_prefix; /* the context goes again in chunks that fit after it */
    if (room < 1)
        return runner_fail(r, FG_ERR_CAPACITY, "no room to reconstruct: %d tokens and a prefix of %d fill the "
                           "context of %d", (int)t, (int)n_prefix, (int)r->ctx_len);
    const int32_t n_chunks = (n_context + room - 1) / room, chunk = (n_context + n_chunks - 1) / n_chunks;
    int32_t *buf = malloc((size_t)(n_prefix + chunk) * sizeof *buf);
    if (!buf)
        return runner_fail(r, FG_ERR_OUT_OF_MEMORY, "out of memory for a reconstruction's tokens");
    if (n_prefix > 0)
        memcpy(buf, prefix, (size_t)n_prefix * sizeof *buf);
    int32_t fed = 0;
    for (int32_t at = 0; at < n_context && st == FG_OK; at += chunk) {
        const int32_t m = n_context - at < chunk ? n_context - at : chunk;
        memcpy(buf + n_prefix, context + at, (size_t)m * sizeof *buf);
        for (int32_t i = 0; i < n_prefix + m; i++)
            r->pos[i] = t + i;
        st = forward(r, n_prefix + m, seqs, n_seqs, PASS_OBSERVE, NULL, buf, r->pos, NULL, 1);
        fed += n_prefix + m;
    }
    free(buf);
    if (n_fed)
        *n_fed = fed;
    return st ? runner_fail(r, st, "%s", fg_last_error(r->ctx)) : FG_OK;
}

fg_status fgm_runner_reconstruct(fgm_runner *r, int32_t n_seqs, const int32_t *seqs, const int32_t *prefix,
                                 int32_t n_prefix, const int32_t *context, int32_t n_context, int32_t *n_fed) {
    fg_status st = fgm_runner_reconstruct_pass(r, n_seqs, seqs, prefix, n_prefix, context, n_context, n_fed);
    for (int32_t i = 0; i < n_seqs && st == FG_OK; i++)
        st = fg_seq_compress(r->ctx, seqs[i]);
    return st ? runner_fail(r, st, "%s", fg_last_error(r->ctx)) : FG_OK;
}

fg_status fgm_runner_fork(fgm_runner *r, int32_t seq, int32_t *child) {
    fg_status st = fg_seq_fork(r->ctx, seq, child);
    if (st)
        return runner_fail(r, st, "%s", fg_last_error(r->ctx));
    if (r->track) {
        const fgm_llama_config *c = &r->model->config;
        memcpy(seq_keys(r, *child, 0), seq_keys(r, seq, 0),
               (size_t)c->n_layers * r->ctx_len * c->kv_dim * sizeof(float));
        r->rec_sum[*child] = r->rec_sum[seq];
        r->rec_count[*child] = r->rec_count[seq];
    }
    return FG_OK;
}

const char *fgm_runner_error(const fgm_runner *r) { return r->error; }

fg_status fgm_runner_release(fgm_runner *r, int32_t seq) { return fg_seq_destroy(r->ctx, seq); }

double fgm_runner_recovery(const fgm_runner *r, int32_t seq) {
    if (!r->track || seq < 0 || seq >= r->max_seqs || r->rec_count[seq] == 0)
        return NAN;
    return r->rec_sum[seq] / (double)r->rec_count[seq];
}

/* ------------------------------------------------------------------ sampling */

static uint32_t rng_u32(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545f4914f6cdd1dull) >> 32);
}

static float rng_unit(uint64_t *s) { return (float)(rng_u32(s) >> 8) / 16777216.0f; }

typedef struct prob_index {
    float p;
    int32_t i;
} prob_index;

static int by_prob_desc(const void *a, const void *b) {
    float x = ((const prob_index *)a)->p, y = ((const prob_index *)b)->p;
    return (x < y) - (x > y);
}

void fgm_penalize(float *logits, int32_t vocab, const int32_t *history, int32_t n, int32_t last_n, float penalty,
                  unsigned char *seen) {
    if (penalty == 1.0f)
        return;
    const int32_t from = last_n < 0 || last_n > n ? 0 : n - last_n;
    for (int32_t i = from; i < n; i++) { /* each distinct token once */
        const int32_t t = history[i];
        if (t >= 0 && t < vocab && !seen[t]) {
            seen[t] = 1;
            logits[t] = logits[t] > 0.0f ? logits[t] / penalty : logits[t] * penalty;
        }
    }
    for (int32_t i = from; i < n; i++)
        if (history[i] >= 0 && history[i] < vocab)
            seen[history[i]] = 0;
}

int32_t fgm_sample(fgm_sampler *s, float *logits, int32_t vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    if (s->temperature <= 0.0f)
        return best;
    float m = logits[best], sum = 0.0f;
    for (int32_t i = 0; i < vocab; i++) {
        logits[i] = expf((logits[i] - m) / s->temperature);
        sum += logits[i];
    }
    if (!isfinite(sum) || !(sum > 0.0f)) /* a NaN or infinite logit: nothing to sample from, greedy */
        return best;
    prob_index *pi = malloc((size_t)vocab * sizeof *pi);
    if (!pi)
        return best;
    for (int32_t i = 0; i < vocab; i++)
        pi[i] = (prob_index){logits[i] / sum, i};
    qsort(pi, (size_t)vocab, sizeof *pi, by_prob_desc);
    /* the top_k likeliest, then the smallest prefix whose mass reaches top_p of theirs */
    const int32_t k = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    float top_p = s->top_p > 0.0f && s->top_p <= 1.0f ? s->top_p : 1.0f, mass = 0.0f, k_mass = 0.0f;
    for (int32_t i = 0; i < k; i++)
        k_mass += pi[i].p;
    int32_t keep = 0;
    while (keep < k && mass < top_p * k_mass) /* at least one: finite sums, top_p > 0 */
        mass += pi[keep++].p;
    float u = rng_unit(&s->state) * mass, acc = 0.0f;
    int32_t pick = pi[keep - 1].i;
    for (int32_t i = 0; i < keep; i++) {
        acc += pi[i].p;
        if (u < acc) {
            pick = pi[i].i;
            break;
        }
    }
    free(pi);
    return pick;
}
