/*
 * fastgen's numerics against ggml's (llama.cpp's tensor library), on a GGUF
 * model. `scripts/smollm2-check.sh --numerics` builds and runs it; it links
 * the build's static libraries and loads libggml-cpu at run time, so it
 * needs no ggml header.
 *
 *   ggml_numerics products MODEL LIBGGML_CPU
 *       The 8-bit products of the model's q4_0, q4_1 and q8_0 matrices (the
 *       first and last layer's seven and the classifier), fgm_matvec_q8
 *       against ggml's own activation quantizer and vec_dot for the type, in
 *       4 one-row trials each (a decode step's shape): how many quantized
 *       blocks and outputs are the same bits. Exit status 1 when any differs.
 *   ggml_numerics logits MODEL q8|f32 BACKEND
 *       Teacher-forced logits: reads "n ids of the prompt, m forced ids" on
 *       stdin and writes m rows of float32 logits to stdout (after the
 *       prompt, then after each forced id but the last), an f16 cache, the
 *       full policy.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastgen.h"
#include "common/dtype.h"
#include "model/dequant.h"
#include "model/matvec.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/tokenizer.h"

/* The part of ggml-cpu.h's ABI used here (ggml_get_type_traits_cpu). */
enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_Q8_1 = 9 };
typedef void (*ggml_from_float)(const float *x, void *y, int64_t k);
typedef void (*ggml_vec_dot)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
typedef struct ggml_traits {
    ggml_from_float from_float;
    ggml_vec_dot vec_dot;
    int vec_dot_type;
    int64_t nrows;
} ggml_traits;

static unsigned long long g_rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* xorshift64, [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int products(const fgm_llama_model *m, const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "ggml_numerics: %s\n", dlerror());
        return 2;
    }
    void (*cpu_init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
    const ggml_traits *(*traits_of)(int) = (const ggml_traits *(*)(int))dlsym(h, "ggml_get_type_traits_cpu");
    if (!cpu_init || !traits_of) {
        fprintf(stderr, "ggml_numerics: %s has no ggml_cpu_init / ggml_get_type_traits_cpu\n", lib);
        dlclose(h);
        return 2;
    }
    cpu_init();
    const fgm_llama_weights *w = &m->weights;
    const int32_t last = m->config.n_layers - 1;
    const fgm_tensor *mats[16];
    int n = 0;
    for (int32_t l = 0; l <= last; l += last > 0 ? last : 1) {
        const fgm_llama_layer *ly = &w->layers[l];
        const fgm_tensor *t[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (int i = 0; i < 7; i++)
            mats[n++] = t[i];
    }
    mats[n++] = &w->wcls;
    long blocks = 0, blocks_same = 0, outs = 0, outs_same = 0;
    for (int i = 0; i < n; i++) {
        const fgm_tensor *W = mats[i];
        const int ggml_type = W->type == FGM_GGML_Q4_0 ? GGML_Q4_0 : W->type == FGM_GGML_Q4_1 ? GGML_Q4_1
                              : W->type == FGM_GGML_Q8_0 ? GGML_Q8_0 : -1;
        if (ggml_type < 0 || !fgm_matvec_quantizes(W->type))
            continue;
        const ggml_traits *tw = traits_of(ggml_type);
        const int want = ggml_type == GGML_Q4_1 ? GGML_Q8_1 : GGML_Q8_0;
        const ggml_traits *ta = tw && tw->vec_dot && tw->vec_dot_type == want ? traits_of(want) : NULL;
        if (!ta || !ta->from_float) { /* the layout above is not this library's */
            fprintf(stderr, "ggml_numerics: %s: unexpected type traits (another ggml ABI?)\n", lib);
            dlclose(h);
            return 2;
        }
        const int32_t in = (int32_t)W->cols, out = (int32_t)W->rows, nb = in / 32;
        const size_t row_bytes = (size_t)fgm_type_row_bytes(W->type, W->cols);
        const size_t act_block = tw->vec_dot_type == GGML_Q8_0 ? 34 : 36; /* d, [s,] 32 quants */
        float *x = malloc(sizeof(float) * (size_t)in), *y = malloc(sizeof(float) * (size_t)out);
        fgm_q8_block *ours = malloc(sizeof(fgm_q8_block) * (size_t)nb);
        unsigned char *theirs = malloc(act_block * (size_t)nb);
        for (int trial = 0; x && y && ours && theirs && trial < 4; trial++) {
            const float scale = trial % 2 ? 30.0f : 1.0f; /* and every 17th value 8x: outliers */
            for (int32_t k = 0; k < in; k++)
                x[k] = uniform() * scale * (k % 17 == 0 ? 8.0f : 1.0f);
            fgm_matvec_q8(NULL, y, out, x, W, 1, ours);
            ta->from_float(x, theirs, in);
            for (int32_t b = 0; b < nb; b++) {
                const unsigned char *t = theirs + (size_t)b * act_block;
                uint16_t d, s = 0;
                memcpy(&d, t, 2);
                if (act_block == 36)
                    memcpy(&s, t + 2, 2);
                blocks++;
                blocks_same += !memcmp(t + act_block - 32, ours[b].qs, 32) && fg_f16_to_f32(d) == ours[b].d &&
                               (act_block == 34 || fg_f16_to_f32(s) == ours[b].s);
            }
            for (int32_t o = 0; o < out; o++) {
                float s;
                tw->vec_dot(in, &s, 0, (const unsigned char *)W->data + (size_t)o * row_bytes, 0, theirs, 0, 1);
                outs++;
                outs_same += !memcmp(&s, &y[o], sizeof s);
            }
        }
        const int ok = x && y && ours && theirs;
        free(x);
        free(y);
        free(ours);
        free(theirs);
        if (!ok) {
            fprintf(stderr, "ggml_numerics: out of memory\n");
            dlclose(h);
            return 2;
        }
    }
    printf("8-bit products against ggml's (%s): quantized activation blocks %ld of %ld the same bytes, "
           "outputs %ld of %ld the same bits\n", lib, blocks_same, blocks, outs_same, outs);
    dlclose(h);
    return blocks_same == blocks && outs_same == outs && outs > 0 ? 0 : 1;
}

static int logits(const fgm_llama_model *m, const char *mode, const char *backend) {
    char err[400];
    fgm_tokenizer tok;
    if (!m->gguf || fgm_tokenizer_from_gguf(m->gguf, m->config.vocab_size, &tok, err, sizeof err)) {
        fprintf(stderr, "ggml_numerics: the tokenizer: %s\n", m->gguf ? err : "not a GGUF file");
        return 2;
    }
    fgm_runner_params rp = {.backend = backend, .kv_dtype = FG_DTYPE_F16, .max_seqs = 1,
                            .q8_activations = !strcmp(mode, "q8")};
    fgm_runner *r = NULL;
    if (fgm_runner_create(m, &tok, &rp, &r, err, sizeof err)) {
        fprintf(stderr, "ggml_numerics: %s\n", err);
        fgm_tokenizer_free(&tok);
        return 2;
    }
    /* stdin: n, n ids of the prompt, m, m forced ids; every id a token of the model */
    const int32_t V = m->config.vocab_size, most = 1 << 20;
    int n_prompt = 0, n_forced = 0, rc = 2;
    int32_t *ids = NULL;
    if (scanf("%d", &n_prompt) == 1 && n_prompt > 0 && n_prompt < most &&
        (ids = malloc(sizeof *ids * (size_t)n_prompt)) != NULL) {
        int ok = 1;
        for (int i = 0; ok && i < n_prompt; i++)
            ok = scanf("%d", &ids[i]) == 1 && ids[i] >= 0 && ids[i] < V;
        int32_t *all = ok && scanf("%d", &n_forced) == 1 && n_forced > 0 && n_forced < most
                           ? realloc(ids, sizeof *ids * ((size_t)n_prompt + (size_t)n_forced))
                           : NULL;
        ok = all != NULL;
        if (all)
            ids = all;
        for (int i = 0; ok && i < n_forced; i++)
            ok = scanf("%d", &ids[n_prompt + i]) == 1 && ids[n_prompt + i] >= 0 && ids[n_prompt + i] < V;
        rc = ok ? 0 : 2;
    }
    float *z = malloc(sizeof *z * (size_t)V);
    fg_compression_params full;
    fg_compression_params_preset("full", &full);
    int32_t seq = -1;
    if (rc == 0 && (!z || fgm_runner_prefill(r, &full, ids, n_prompt, &seq, z) != FG_OK))
        rc = 1;
    for (int i = 0; rc == 0 && i < n_forced; i++) {
        if (fwrite(z, sizeof *z, (size_t)V, stdout) != (size_t)V)
            rc = 3;
        else if (i + 1 < n_forced && fgm_runner_decode(r, 1, &seq, &ids[n_prompt + i], z) != FG_OK)
            rc = 1;
    }
    if (rc == 0 && fflush(stdout) != 0)
        rc = 3;
    if (rc)
        fprintf(stderr, "ggml_numerics: %s\n",
                rc == 2   ? "stdin: n ids of the prompt, then m forced ids, each below the vocabulary's size"
                : rc == 3 ? "the logits could not be written"
                : z       ? fgm_runner_error(r)
                          : "out of memory");
    rc = rc == 3 ? 1 : rc;
    free(z);
    free(ids);
    fgm_runner_destroy(&r);
    fgm_tokenizer_free(&tok);
    return rc;
}

int main(int argc, char **argv) {
    const int prod = argc == 4 && !strcmp(argv[1], "products");
    const int logit = argc == 5 && !strcmp(argv[1], "logits") && (!strcmp(argv[3], "q8") || !strcmp(argv[3], "f32"));
    if (!prod && !logit) {
        fprintf(stderr, "usage: ggml_numerics products MODEL LIBGGML_CPU\n"
                        "       ggml_numerics logits MODEL q8|f32 BACKEND < ids\n");
        return 2;
    }
    char err[400];
    fgm_llama_model m;
    if (fgm_model_load(argv[2], &m, err, sizeof err) != FG_OK) {
        fprintf(stderr, "ggml_numerics: %s\n", err);
        return 2;
    }
    const int rc = prod ? products(&m, argv[3]) : logits(&m, argv[3], argv[4]);
    fgm_llama_free(&m);
    return rc;
}
