/* The synthetic workload of tools/synth.h. */
#include "tools/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

static double uniform(uint64_t h) { return ((double)(h >> 11) + 0.5) * 0x1p-53; }

static float gauss(uint64_t h) {
    double u1 = uniform(h), u2 = uniform(mix(h));
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static const char *const k_punct[] = {".", ",", "\n", "!", "?", " -"};
#define N_PUNCT 6
#define FIRST_WORD (3 + N_PUNCT)

fg_status synth_create(int32_t n_layers, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, uint64_t seed,
                          synth *out) {
    if (!out || n_layers <= 0 || n_kv_heads <= 0 || n_q_heads % n_kv_heads || head_dim < 16)
        return FG_ERR_INVALID_ARGUMENT;
    *out = (synth){n_layers, n_q_heads, n_kv_heads, head_dim, seed, NULL, NULL};
    out->types = malloc((size_t)n_layers * n_kv_heads * sizeof *out->types);
    if (!out->types)
        return FG_ERR_OUT_OF_MEMORY;
    for (int32_t l = 0; l < n_layers; l++)
        for (int32_t g = 0; g < n_kv_heads; g++)
            out->types[l * n_kv_heads + g] = (synth_type)((g + 2 * l) % SYNTH_N_TYPES);

    char words[SYNTH_VOCAB][16]; /* " w" and any int: what -Wformat-truncation asks at -O1 */
    const char *pieces[SYNTH_VOCAB];
    pieces[0] = "<unk>";
    pieces[SYNTH_BOS] = "<s>";
    pieces[SYNTH_EOS] = "</s>";
    for (int32_t i = 0; i < N_PUNCT; i++)
        pieces[3 + i] = k_punct[i];
    for (int32_t i = FIRST_WORD; i < SYNTH_VOCAB; i++) {
        snprintf(words[i], sizeof words[i], " w%d", (int)i);
        pieces[i] = words[i];
    }
    fg_status st = fg_token_classes_create(SYNTH_VOCAB, pieces, &out->classes);
    if (st == FG_OK)
        st = fg_token_classes_set(out->classes, SYNTH_BOS, FG_TOKEN_SPECIAL);
    if (st == FG_OK)
        st = fg_token_classes_set(out->classes, SYNTH_EOS, FG_TOKEN_SPECIAL);
    if (st)
        synth_destroy(out);
    return st;
}

void synth_destroy(synth *s) {
    if (!s)
        return;
    free(s->types);
    fg_token_classes_destroy(&s->classes);
    s->types = NULL;
}

const char *synth_type_name(synth_type t) {
    static const char *const names[] = {"sink", "punct", "heavy", "local", "broad"};
    return t < SYNTH_N_TYPES ? names[t] : "?";
}

int32_t synth_expected_entry(synth_type t) { return (int32_t)t; }

int32_t synth_token(const synth *s, int32_t p) {
    if (p == 0)
        return SYNTH_BOS;
    double u = uniform(hash4(s->seed, 0x70c, (uint64_t)p, 1));
    if (u < 0.12)
        return 3 + (int32_t)(hash4(s->seed, 0x70c, (uint64_t)p, 2) % N_PUNCT);
    return FIRST_WORD + (int32_t)(hash4(s->seed, 0x70c, (uint64_t)p, 3) % (SYNTH_VOCAB - FIRST_WORD));
}

static int is_heavy(const synth *s, int32_t layer, int32_t g, int32_t p) {
    return uniform(hash4(s->seed, 0x4ea, (uint64_t)(layer * 4096 + g), (uint64_t)p)) < 0.05;
}

/* Layout of a row: [0] special, [1] punct, [2] heavy, [3] unused, then up to
 * 16 (cos, sin) pairs of the position. */
#define CH_SPECIAL 0
#define CH_PUNCT 1
#define CH_HEAVY 2
#define CH_ROT 4

static int32_t n_pairs(int32_t d) { return (d - CH_ROT) / 2 < 16 ? (d - CH_ROT) / 2 : 16; }

static double theta(int32_t f, int32_t m) { return pow(1.0 / 64.0, (double)f / (double)(m > 1 ? m - 1 : 1)); }

void synth_qkv(const synth *s, int32_t layer, const int32_t *tokens, int32_t pos0, int32_t n, float *q, float *k,
                  float *v) {
    const int32_t Hq = s->n_q_heads, Hkv = s->n_kv_heads, d = s->head_dim, G = Hq / Hkv, m = n_pairs(d);
    /* planted scores of ~12 (in units of q.k / sqrt(d)) over noise of ~0.3 */
    const float A = sqrtf(12.0f * sqrtf((float)d));
    const float B = sqrtf(12.0f * sqrtf((float)d) / (float)m);
    const float noise = 0.3f;
    for (int32_t r = 0; r < n; r++) {
        const int32_t p = pos0 + r;
        fg_token_class cls = FG_TOKEN_ORDINARY;
        fg_token_classes_get(s->classes, tokens[r], &cls);
        for (int32_t g = 0; g < Hkv; g++) {
            const uint64_t hk = hash4(s->seed, (uint64_t)layer, (uint64_t)g, (uint64_t)p);
            float *kr = k + ((size_t)r * Hkv + g) * d, *vr = v + ((size_t)r * Hkv + g) * d;
            for (int32_t c = 0; c < d; c++) {
                kr[c] = noise * gauss(hash4(hk, 1, (uint64_t)c, 0));
                vr[c] = gauss(hash4(hk, 2, (uint64_t)c, 0));
            }
            if (cls == FG_TOKEN_SPECIAL || p == 0)
                kr[CH_SPECIAL] += A;
            if (p == 0) { /* BOS is a sink: where a head looks when its target has not appeared yet */
                kr[CH_PUNCT] += A;
                kr[CH_HEAVY] += A;
            }
            if (cls == FG_TOKEN_PUNCT)
                kr[CH_PUNCT] += A;
            if (is_heavy(s, layer, g, p) && cls == FG_TOKEN_ORDINARY)
                kr[CH_HEAVY] += A;
            for (int32_t f = 0; f < m; f++) {
                kr[CH_ROT + 2 * f] += B * (float)cos(theta(f, m) * p);
                kr[CH_ROT + 2 * f + 1] += B * (float)sin(theta(f, m) * p);
            }
            const synth_type type = s->types[layer * Hkv + g];
            for (int32_t h = g * G; h < (g + 1) * G; h++) {
                float *qr = q + ((size_t)r * Hq + h) * d;
                const uint64_t hq = hash4(s->seed, (uint64_t)layer, (uint64_t)(h + 1000), (uint64_t)p);
                for (int32_t c = 0; c < d; c++)
                    qr[c] = noise * gauss(hash4(hq, 3, (uint64_t)c, 0));
                switch (type) {
                case SYNTH_SINK: qr[CH_SPECIAL] += A; break;
                case SYNTH_PUNCT: qr[CH_PUNCT] += A; break;
                case SYNTH_HEAVY: qr[CH_HEAVY] += A; break;
                case SYNTH_LOCAL:
                    for (int32_t f = 0; f < m; f++) {
                        qr[CH_ROT + 2 * f] += B * (float)cos(theta(f, m) * p);
                        qr[CH_ROT + 2 * f + 1] += B * (float)sin(theta(f, m) * p);
                    }
                    break;
                case SYNTH_BROAD:
                case SYNTH_N_TYPES: break;
                }
            }
        }
    }
}
