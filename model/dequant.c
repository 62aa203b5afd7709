/*
 * Dequantization of ggml's block formats (model/dequant.h). Each function is
 * its block layout read as plainly as possible: the scale(s) first, then the
 * packed quants, in the order ggml's own dequantizer combines them, so the
 * results equal ggml's bit for bit (tests/test_gguf.c checks every type
 * against ggml's output in quants.gguf). QK = 32 values per block for the
 * legacy formats and IQ4_NL, QK_K = 256 for the K-quants and IQ4_XS.
 */
#include "model/dequant.h"

#include <stddef.h>
#include <string.h>

#include "common/dtype.h"

#define QK 32
#define QK_K 256

static float f16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fg_f16_to_f32(h);
}

static void f32_to_float(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *p = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = f16(p + 2 * i);
}

static void bf16_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = fg_bf16_to_f32(h);
    }
}

/* Q4_0: f16 d; 16 bytes of 4-bit quants (low nibbles: values 0..15, high: 16..31); x = (q - 8) * d */
static void q4_0_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, y += QK) {
        const float d = f16(b);
        const unsigned char *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((qs[j] & 0x0F) - 8) * d;
            y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

/* Q4_1: f16 d, f16 m; 16 bytes of 4-bit quants; x = q * d + m */
static void q4_1_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 20, y += QK) {
        const float d = f16(b), m = f16(b + 2);
        const unsigned char *qs = b + 4;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(qs[j] & 0x0F) * d + m;
            y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

/* Q5_0: f16 d; uint32 of fifth bits (bit j for value j); 16 bytes of low nibbles; x = (q - 16) * d */
static void q5_0_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 22, y += QK) {
        const float d = f16(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const unsigned char *qs = b + 6;
        for (int j = 0; j < QK / 2; j++) {
            const int h0 = (int)((qh >> j) << 4 & 0x10), h1 = (int)(qh >> (j + 12) & 0x10);
            y[j] = (float)(((qs[j] & 0x0F) | h0) - 16) * d;
            y[j + QK / 2] = (float)(((qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

/* Q5_1: f16 d, f16 m; uint32 of fifth bits; 16 bytes of low nibbles; x = q * d + m */
static void q5_1_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 24, y += QK) {
        const float d = f16(b), m = f16(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const unsigned char *qs = b + 8;
        for (int j = 0; j < QK / 2; j++) {
            const int h0 = (int)((qh >> j) << 4 & 0x10), h1 = (int)(qh >> (j + 12) & 0x10);
            y[j] = (float)((qs[j] & 0x0F) | h0) * d + m;
            y[j + QK / 2] = (float)((qs[j] >> 4) | h1) * d + m;
        }
    }
}

/* Q8_0: f16 d; 32 int8 quants; x = q * d */
static void q8_0_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 34, y += QK) {
        const float d = f16(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++)
            y[j] = (float)qs[j] * d;
    }
}

/* Q2_K: 16 bytes of (4-bit scale | 4-bit min) per 16 values; 64 bytes of 2-bit quants;
 * f16 d, f16 dmin. Each 32-byte run of quants holds four 2-bit planes of 32 values. */
static void q2_k_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 84) {
        const unsigned char *scales = b, *q = b + 16;
        const float d = f16(b + 80), min = f16(b + 82);
        int is = 0;
        for (int half = 0; half < QK_K; half += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int part = 0; part < 2; part++) {
                    const int sc = scales[is++];
                    const float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[l + 16 * part] >> shift) & 3) - ml;
                }
    }
}

/* Q3_K: 32 bytes of high bits; 64 bytes of 2-bit quants; 12 bytes packing sixteen 6-bit
 * scales (offset by 32); f16 d. A value is its 2 low bits, minus 4 when its high bit is clear. */
static void q3_k_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
        const unsigned char *hm = b, *q = b + 32, *packed = b + 96;
        const float d_all = f16(b + 108);
        int8_t scales[16];
        for (int j = 0; j < 16; j++) {
            const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4; /* 4 low bits */
            const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;  /* 2 high bits */
            scales[j] = (int8_t)((low | high << 4) - 32);
        }
        int is = 0;
        unsigned m = 1;
        for (int half = 0; half < QK_K; half += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int part = 0; part < 2; part++) {
                    const float dl = d_all * (float)scales[is++];
                    for (int l = 0; l < 16; l++) {
                        const int k = l + 16 * part;
                        *y++ = dl * (float)((int8_t)((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                    }
                }
    }
}

/* The 6-bit scale and min of sub-block j (of 8) in the 12-byte packing of Q4_K and Q5_K:
 * bytes 0-3 scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low nibbles of scales and
 * mins 4-7, whose two high bits sit in the top bits of bytes 0-3 and 4-7. */
static void scale_min_k4(int j, const unsigned char *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: f16 d, f16 dmin; 12 bytes of scales and mins; 128 bytes of 4-bit quants, each 32
 * bytes holding two sub-blocks of 32 (low nibbles first); x = d*sc * q - dmin*m.
 * Q5_K: the same with 32 bytes of fifth bits (bits 2k and 2k+1 of byte l for the two
 * sub-blocks of quant run k) between the scales and the nibbles. */
static void q45_k_to_float(const unsigned char *b, float *y, int64_t n, int fifth_bits) {
    for (int64_t i = 0; i < n / QK_K; i++, b += fifth_bits ? 176 : 144) {
        const float d = f16(b), min = f16(b + 2);
        const unsigned char *scales = b + 4, *qh = b + 16, *q = b + (fifth_bits ? 48 : 16);
        unsigned u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, q += 32, u1 <<= 2, u2 <<= 2) {
            int sc, m;
            scale_min_k4(is, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xF) + (fifth_bits && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) + (fifth_bits && (qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

static void q4_k_to_float(const void *src, float *y, int64_t n) { q45_k_to_float(src, y, n, 0); }
static void q5_k_to_float(const void *src, float *y, int64_t n) { q45_k_to_float(src, y, n, 1); }

/* Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales (one per
 * 16 values), f16 d; x = d * scale * (q - 32). Each half of 128 values interleaves four
 * runs of 32 across the nibbles and the high-bit pairs. */
static void q6_k_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 210) {
        const unsigned char *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = f16(b + 208);
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int8_t)((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
                const int q2 = (int8_t)((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
                const int q3 = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
                const int q4 = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}

/* The 16 values IQ4_NL and IQ4_XS index with their 4-bit quants (a non-linear grid). */
static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ4_NL: f16 d; 16 bytes of 4-bit indices into the grid (low nibbles first) */
static void iq4_nl_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, y += QK) {
        const float d = f16(b);
        const unsigned char *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)k_iq4nl[qs[j] & 0xF];
            y[j + QK / 2] = d * (float)k_iq4nl[qs[j] >> 4];
        }
    }
}

/* IQ4_XS: f16 d; uint16 of the scales' high 2 bits; 4 bytes of their low nibbles (eight
 * 6-bit scales, offset by 32, one per 32 values); 128 bytes of grid indices as IQ4_NL */
static void iq4_xs_to_float(const void *src, float *y, int64_t n) {
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 136) {
        const float d = f16(b);
        uint16_t scales_h;
        memcpy(&scales_h, b + 2, 2);
        const unsigned char *scales_l = b + 4, *qs = b + 8;
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)k_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * (float)k_iq4nl[qs[j] >> 4];
            }
        }
    }
}

static const fgm_type_info k_types[FGM_GGML_N_TYPES] = {
    [0] = {"f32", 1, 4, f32_to_float},
    [1] = {"f16", 1, 2, f16_to_float},
    [2] = {"q4_0", QK, 18, q4_0_to_float},
    [3] = {"q4_1", QK, 20, q4_1_to_float},
    [6] = {"q5_0", QK, 22, q5_0_to_float},
    [7] = {"q5_1", QK, 24, q5_1_to_float},
    [8] = {"q8_0", QK, 34, q8_0_to_float},
    [9] = {"q8_1", QK, 36, NULL},
    [10] = {"q2_K", QK_K, 84, q2_k_to_float},
    [11] = {"q3_K", QK_K, 110, q3_k_to_float},
    [12] = {"q4_K", QK_K, 144, q4_k_to_float},
    [13] = {"q5_K", QK_K, 176, q5_k_to_float},
    [14] = {"q6_K", QK_K, 210, q6_k_to_float},
    [15] = {"q8_K", QK_K, 292, NULL},
    [16] = {"iq2_xxs", QK_K, 66, NULL},
    [17] = {"iq2_xs", QK_K, 74, NULL},
    [18] = {"iq3_xxs", QK_K, 98, NULL},
    [19] = {"iq1_s", QK_K, 50, NULL},
    [20] = {"iq4_nl", QK, 18, iq4_nl_to_float},
    [21] = {"iq3_s", QK_K, 110, NULL},
    [22] = {"iq2_s", QK_K, 82, NULL},
    [23] = {"iq4_xs", QK_K, 136, iq4_xs_to_float},
    [24] = {"i8", 1, 1, NULL},
    [25] = {"i16", 1, 2, NULL},
    [26] = {"i32", 1, 4, NULL},
    [27] = {"i64", 1, 8, NULL},
    [28] = {"f64", 1, 8, NULL},
    [29] = {"iq1_m", QK_K, 56, NULL},
    [30] = {"bf16", 1, 2, bf16_to_float},
};

const fgm_type_info *fgm_type_info_of(int32_t type) {
    if (type < 0 || type >= FGM_GGML_N_TYPES || !k_types[type].name)
        return NULL;
    return &k_types[type];
}

int64_t fgm_type_row_bytes(int32_t type, int64_t n) {
    const fgm_type_info *t = fgm_type_info_of(type);
    if (!t || n < 0 || n % t->block)
        return -1;
    return n / t->block * t->bytes;
}
