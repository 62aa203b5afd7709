/* Token classes (docs/design.md §2.1): special ids and multi-token special markers,
 * punctuation from decoded pieces, sinks by position. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

struct fg_token_classes {
    int32_t vocab_size;
    int32_t raw_looking; /* pieces given as text that look like raw vocabulary strings (fg_token_classes_raw_looking) */
    uint8_t *cls;       /* [vocab_size] fg_token_class of each id */
    int32_t n_markers;
    int32_t *marker_off; /* [n_markers + 1] offsets into marker_ids */
    int32_t *marker_ids;
};

static int is_punct_or_space(unsigned char c) {
    return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
           (c >= 0x7b && c <= 0x7e) || c == ' ' || (c >= 0x09 && c <= 0x0d);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Punctuation: a non-empty piece of ASCII punctuation and whitespace only, or
 * a byte-fallback piece "<0xNN>" whose byte is one. */
static int piece_is_punct(const char *piece) {
    size_t len = strlen(piece);
    if (len == 0)
        return 0;
    if (len == 6 && piece[0] == '<' && piece[1] == '0' && piece[2] == 'x' && piece[5] == '>') {
        int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
        if (hi >= 0 && lo >= 0)
            return is_punct_or_space((unsigned char)(hi * 16 + lo));
    }
    for (size_t i = 0; i < len; i++)
        if (!is_punct_or_space((unsigned char)piece[i]))
            return 0;
    return 1;
}

/* GPT-2's byte-level stand-ins: bytes 33..126, 161..172 and 174..255 are
 * their own code point; the 68 others, in order, are U+0100 onwards. The
 * byte of code point cp, or -1. */
static int gpt2_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    int n = (int)cp - 256;
    for (int b = 0; b < 256; b++) {
        const int self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!self && n-- == 0)
            return b;
    }
    return -1;
}

/* The next code point of well-formed UTF-8 at *p (advanced), or -1. */
static int32_t next_code_point(const unsigned char **p) {
    const unsigned char *s = *p;
    const int n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0)
        return -1;
    uint32_t cp = n == 1 ? s[0] : (uint32_t)(s[0] & (0x7f >> n));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *p = s + n;
    return (int32_t)cp;
}

/* A piece as the text it stands for, into buf (NUL-terminated); 0 when it
 * is not well formed for its encoding (then it is an ordinary token). */
static int decode_piece(const char *piece, fg_piece_encoding enc, char *buf, size_t size) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)piece; *p && n + 1 < size;) {
        if (enc == FG_PIECES_SENTENCEPIECE && p[0] == 0xe2 && p[1] == 0x96 && p[2] == 0x81) { /* U+2581 */
            buf[n++] = ' ';
            p += 3;
        } else if (enc == FG_PIECES_GPT2_BYTES) {
            const int32_t cp = next_code_point(&p);
            const int b = cp < 0 ? -1 : gpt2_byte((uint32_t)cp);
            if (b < 0)
                return 0;
            buf[n++] = (char)b;
        } else {
            buf[n++] = (char)*p++;
        }
    }
    buf[n] = '\0';
    return 1;
}

/* Whether a piece given as text looks SentencePiece encoded (it holds
 * U+2581, which decoded text hardly ever does) or GPT-2 encoded (it starts
 * with "Ġ", GPT-2's space: a few words of Maltese do too). */
static int looks_sentencepiece(const char *piece) { return strstr(piece, "\xe2\x96\x81") != NULL; }
static int looks_gpt2(const char *piece) { return piece[0] == '\xc4' && piece[1] == '\xa0'; }

fg_status fg_token_classes_create(int32_t vocab_size, const char *const *pieces, fg_token_classes **out) {
    return fg_token_classes_create_from(vocab_size, pieces, FG_PIECES_TEXT, out);
}

fg_status fg_token_classes_create_from(int32_t vocab_size, const char *const *pieces, fg_piece_encoding encoding,
                                       fg_token_classes **out) {
    if (!out)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_create: out must not be NULL");
    *out = NULL;
    if (encoding != FG_PIECES_TEXT && encoding != FG_PIECES_SENTENCEPIECE && encoding != FG_PIECES_GPT2_BYTES)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                        "fg_token_classes_create_from: unknown piece encoding %d (FG_PIECES_TEXT 0, "
                        "FG_PIECES_SENTENCEPIECE 1, FG_PIECES_GPT2_BYTES 2)", (int)encoding);
    if (vocab_size <= 0)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "vocab_size must be > 0, got %d", (int)vocab_size);
    fg_token_classes *tc = calloc(1, sizeof *tc);
    if (!tc)
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "out of memory creating token classes");
    tc->vocab_size = vocab_size;
    tc->cls = calloc((size_t)vocab_size, 1);
    tc->marker_off = calloc(1, sizeof(int32_t));
    if (!tc->cls || !tc->marker_off) {
        fg_token_classes_destroy(&tc);
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "out of memory creating token classes for %d ids", (int)vocab_size);
    }
    int32_t sp = 0, gpt2 = 0;
    for (int32_t i = 0; pieces && i < vocab_size; i++) {
        if (!pieces[i])
            continue;
        char text[256];
        if (encoding == FG_PIECES_TEXT) {
            sp += looks_sentencepiece(pieces[i]);
            gpt2 += looks_gpt2(pieces[i]);
            if (piece_is_punct(pieces[i]))
                tc->cls[i] = FG_TOKEN_PUNCT;
        } else if (strlen(pieces[i]) < sizeof text && decode_piece(pieces[i], encoding, text, sizeof text) &&
                   piece_is_punct(text)) {
            tc->cls[i] = FG_TOKEN_PUNCT;
        }
    }
    tc->raw_looking = sp + ((int64_t)gpt2 * 20 >= vocab_size ? gpt2 : 0);
    *out = tc;
    return FG_OK;
}

int32_t fg_token_classes_count(const fg_token_classes *tc, fg_token_class cls) {
    int32_t n = 0;
    for (int32_t i = 0; tc && i < tc->vocab_size; i++)
        n += tc->cls[i] == (uint8_t)cls;
    return n;
}

int32_t fg_token_classes_raw_looking(const fg_token_classes *tc) { return tc ? tc->raw_looking : 0; }

void fg_token_classes_destroy(fg_token_classes **classes) {
    if (!classes || !*classes)
        return;
    fg_token_classes *tc = *classes;
    free(tc->cls);
    free(tc->marker_off);
    free(tc->marker_ids);
    free(tc);
    *classes = NULL;
}

static fg_status check_id(const fg_token_classes *tc, int32_t id, const char *fn) {
    if (!tc)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "%s: classes must not be NULL", fn);
    if (id < 0 || id >= tc->vocab_size)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "%s: token id %d outside the vocabulary [0, %d)", fn, (int)id,
                        (int)tc->vocab_size);
    return FG_OK;
}

fg_status fg_token_classes_set(fg_token_classes *tc, int32_t id, fg_token_class cls) {
    fg_status st = check_id(tc, id, "fg_token_classes_set");
    if (st)
        return st;
    if (cls != FG_TOKEN_ORDINARY && cls != FG_TOKEN_SPECIAL && cls != FG_TOKEN_PUNCT)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_set: unknown class %d", (int)cls);
    tc->cls[id] = (uint8_t)cls;
    return FG_OK;
}

fg_status fg_token_classes_get(const fg_token_classes *tc, int32_t id, fg_token_class *out) {
    fg_status st = check_id(tc, id, "fg_token_classes_get");
    if (st)
        return st;
    if (!out)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_get: out must not be NULL");
    *out = (fg_token_class)tc->cls[id];
    return FG_OK;
}

int32_t fg_token_classes_vocab_size(const fg_token_classes *tc) { return tc ? tc->vocab_size : 0; }

fg_status fg_token_classes_add_sequence(fg_token_classes *tc, const int32_t *ids, int32_t n) {
    if (!tc || !ids)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_add_sequence: classes and ids must not be NULL");
    if (n < 1 || n > 64)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "a special sequence needs 1..64 tokens, got %d", (int)n);
    for (int32_t i = 0; i < n; i++) {
        fg_status st = check_id(tc, ids[i], "fg_token_classes_add_sequence");
        if (st)
            return st;
    }
    int32_t total = tc->marker_off[tc->n_markers];
    int32_t *off = realloc(tc->marker_off, (size_t)(tc->n_markers + 2) * sizeof(int32_t));
    if (!off)
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "out of memory adding a special sequence");
    tc->marker_off = off;
    int32_t *mid = realloc(tc->marker_ids, (size_t)(total + n) * sizeof(int32_t));
    if (!mid)
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "out of memory adding a special sequence");
    tc->marker_ids = mid;
    memcpy(mid + total, ids, (size_t)n * sizeof(int32_t));
    tc->n_markers++;
    tc->marker_off[tc->n_markers] = total + n;
    return FG_OK;
}

fg_status fg_token_classes_clone(const fg_token_classes *src, fg_token_classes **out) {
    fg_status st = fg_token_classes_create(src->vocab_size, NULL, out);
    if (st)
        return st;
    memcpy((*out)->cls, src->cls, (size_t)src->vocab_size);
    (*out)->raw_looking = src->raw_looking;
    for (int32_t m = 0; m < src->n_markers && st == FG_OK; m++)
        st = fg_token_classes_add_sequence(*out, src->marker_ids + src->marker_off[m],
                                           src->marker_off[m + 1] - src->marker_off[m]);
    if (st)
        fg_token_classes_destroy(out);
    return st;
}

fg_status fg_token_classes_classify(const fg_token_classes *tc, const int32_t *tokens, int32_t n, int32_t n_sink,
                                    uint8_t *out) {
    if (!tc || (!tokens && n > 0) || (!out && n > 0))
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_classify: NULL argument");
    if (n < 0 || n_sink < 0)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_token_classes_classify: n (%d) and n_sink (%d) must be >= 0",
                        (int)n, (int)n_sink);
    for (int32_t p = 0; p < n; p++)
        if (tokens[p] < 0 || tokens[p] >= tc->vocab_size)
            return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "token %d at position %d is outside the vocabulary [0, %d)",
                            (int)tokens[p], (int)p, (int)tc->vocab_size);
    for (int32_t p = 0; p < n; p++)
        out[p] = p < n_sink ? (uint8_t)FG_TOKEN_SPECIAL : tc->cls[tokens[p]];
    /* every token of a matched marker occurrence is special */
    for (int32_t m = 0; m < tc->n_markers; m++) {
        const int32_t *mk = tc->marker_ids + tc->marker_off[m];
        int32_t len = tc->marker_off[m + 1] - tc->marker_off[m];
        for (int32_t p = 0; p + len <= n; p++) {
            if (memcmp(tokens + p, mk, (size_t)len * sizeof(int32_t)) == 0)
                memset(out + p, FG_TOKEN_SPECIAL, (size_t)len);
        }
    }
    return FG_OK;
}

uint8_t fg_token_classes_next(const fg_token_classes *tc, const int32_t *history, int32_t p, int32_t id,
                              int32_t n_sink) {
    if (p < n_sink || tc->cls[id] == FG_TOKEN_SPECIAL)
        return FG_TOKEN_SPECIAL;
    /* a marker that ends with this token makes it special; the earlier tokens
     * of the occurrence were already decoded and keep their class */
    for (int32_t m = 0; m < tc->n_markers; m++) {
        const int32_t *mk = tc->marker_ids + tc->marker_off[m];
        int32_t len = tc->marker_off[m + 1] - tc->marker_off[m];
        if (len - 1 > p || mk[len - 1] != id)
            continue;
        if (memcmp(history + p - (len - 1), mk, (size_t)(len - 1) * sizeof(int32_t)) == 0)
            return FG_TOKEN_SPECIAL;
    }
    return tc->cls[id];
}
