/* The tokenizer of tools/tokenizer.h. */
#include "tools/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/llama2c.h"

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int by_piece(const void *a, const void *b) {
    return strcmp(((const fg_tokenizer_entry *)a)->piece, ((const fg_tokenizer_entry *)b)->piece);
}

void fg_tokenizer_free(fg_tokenizer *t) {
    if (!t)
        return;
    if (t->pieces)
        for (int32_t i = 0; i < t->vocab_size; i++)
            free(t->pieces[i]);
    free(t->pieces);
    free(t->scores);
    free(t->sorted);
    memset(t, 0, sizeof *t);
}

fg_status fg_tokenizer_load_memory(const void *buf, size_t size, int32_t vocab_size, fg_tokenizer *out, char *err,
                                   size_t err_size) {
    memset(out, 0, sizeof *out);
    if (vocab_size <= FG_TOKEN_EOS)
        return fg_failf(err, err_size, FG_ERR_INVALID_ARGUMENT,
                     "vocabulary of %d tokens: a llama2.c tokenizer has at least <unk>, BOS and EOS",
                     (int)vocab_size);
    const unsigned char *p = buf;
    if (!buf || size < 4)
        return fg_failf(err, err_size, FG_ERR_FORMAT, "tokenizer is %zu bytes, shorter than its header", size);
    out->vocab_size = vocab_size;
    out->pieces = calloc((size_t)vocab_size, sizeof *out->pieces);
    out->scores = malloc((size_t)vocab_size * sizeof *out->scores);
    out->sorted = malloc((size_t)vocab_size * sizeof *out->sorted);
    if (!out->pieces || !out->scores || !out->sorted) {
        fg_tokenizer_free(out);
        return fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d tokens", (int)vocab_size);
    }
    size_t off = 4; /* max_token_length: not trusted, lengths are checked one by one */
    for (int32_t i = 0; i < vocab_size; i++) {
        float score;
        int32_t len;
        if (size - off < 8) {
            fg_tokenizer_free(out);
            return fg_failf(err, err_size, FG_ERR_FORMAT,
                         "tokenizer has %d entries, the model's vocabulary has %d (truncated or wrong file)", (int)i,
                         (int)vocab_size);
        }
        memcpy(&score, p + off, 4);
        memcpy(&len, p + off + 4, 4);
        off += 8;
        if (len < 0 || (size_t)len > size - off || !isfinite(score)) {
            fg_tokenizer_free(out);
            return fg_failf(err, err_size, FG_ERR_FORMAT,
                         "tokenizer entry %d: length %d or score %g runs past the end of the file (%zu bytes)",
                         (int)i, (int)len, (double)score, size);
        }
        out->pieces[i] = malloc((size_t)len + 1);
        if (!out->pieces[i]) {
            fg_tokenizer_free(out);
            return fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for tokenizer entry %d", (int)i);
        }
        memcpy(out->pieces[i], p + off, (size_t)len);
        out->pieces[i][len] = '\0';
        off += (size_t)len;
        out->scores[i] = score;
        out->sorted[i] = (fg_tokenizer_entry){out->pieces[i], i};
        if ((size_t)len > out->max_piece_len)
            out->max_piece_len = (size_t)len;
    }
    if (off != size) {
        fg_tokenizer_free(out);
        return fg_failf(err, err_size, FG_ERR_FORMAT,
                        "tokenizer has %zu bytes after its %d entries (a tokenizer for a larger vocabulary, or not "
                        "a llama2.c tokenizer)", size - off, (int)vocab_size);
    }
    qsort(out->sorted, (size_t)vocab_size, sizeof *out->sorted, by_piece);
    for (int b = 0; b < 256; b++) {
        out->byte_pieces[b][0] = (char)b;
        out->byte_pieces[b][1] = '\0';
    }
    return FG_OK;
}

fg_status fg_tokenizer_load_file(const char *path, int32_t vocab_size, fg_tokenizer *out, char *err,
                                 size_t err_size) {
    void *buf;
    size_t size;
    memset(out, 0, sizeof *out);
    fg_status st = fg_read_file(path, &buf, &size, err, err_size);
    if (st)
        return st;
    st = fg_tokenizer_load_memory(buf, size, vocab_size, out, err, err_size);
    free(buf);
    return st;
}

static int32_t lookup(const fg_tokenizer *t, const char *s) {
    fg_tokenizer_entry key = {s, 0};
    const fg_tokenizer_entry *e = bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof key, by_piece);
    return e ? e->id : -1;
}

fg_status fg_tokenizer_encode(const fg_tokenizer *t, const char *text, int bos, int32_t *tokens, int32_t cap,
                              int32_t *n_out) {
    /* before merging: at most BOS, the dummy prefix and one token per byte */
    const size_t len_text = strlen(text);
    int32_t *work = malloc((len_text + 2) * sizeof *work);
    char *pair = malloc(2 * t->max_piece_len + 1);
    if (!work || !pair) {
        free(work);
        free(pair);
        return FG_ERR_OUT_OF_MEMORY;
    }
    int32_t n = 0;
    if (bos)
        work[n++] = FG_TOKEN_BOS;
    if (text[0]) {
        int32_t space = lookup(t, " ");
        if (space >= 0)
            work[n++] = space;
    }
    /* code points whole, else their bytes */
    char cp[5];
    for (const unsigned char *s = (const unsigned char *)text; *s;) {
        size_t len = 1;
        while (len < 4 && (s[len] & 0xc0) == 0x80)
            len++;
        memcpy(cp, s, len);
        cp[len] = '\0';
        int32_t id = lookup(t, cp);
        if (id >= 0) {
            work[n++] = id;
        } else {
            for (size_t i = 0; i < len; i++)
                work[n++] = 3 + (int32_t)s[i] < t->vocab_size ? 3 + (int32_t)s[i] : 0;
        }
        s += len;
    }
    /* merges: the best-scoring adjacent pair, until none is in the vocabulary */
    for (;;) {
        float best = -INFINITY;
        int32_t best_id = -1, best_at = -1;
        for (int32_t i = 0; i + 1 < n; i++) {
            size_t a = strlen(t->pieces[work[i]]), b = strlen(t->pieces[work[i + 1]]);
            memcpy(pair, t->pieces[work[i]], a);
            memcpy(pair + a, t->pieces[work[i + 1]], b + 1);
            int32_t id = lookup(t, pair);
            if (id >= 0 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_at = i;
            }
        }
        if (best_at < 0)
            break;
        work[best_at] = best_id;
        memmove(work + best_at + 1, work + best_at + 2, (size_t)(n - best_at - 2) * sizeof *work);
        n--;
    }
    *n_out = n;
    fg_status st = n <= cap ? FG_OK : FG_ERR_CAPACITY;
    if (st == FG_OK)
        memcpy(tokens, work, (size_t)n * sizeof *work);
    free(work);
    free(pair);
    return st;
}

const char *fg_tokenizer_decode(const fg_tokenizer *t, int32_t prev, int32_t token) {
    if (token < 0 || token >= t->vocab_size)
        return "";
    const char *piece = t->pieces[token];
    if (prev == FG_TOKEN_BOS && piece[0] == ' ')
        piece++;
    /* "<0xNN>" with exactly two hex digits (no sign, no space) is its byte */
    if (strlen(piece) == 6 && !strncmp(piece, "<0x", 3) && piece[5] == '>') {
        int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
        if (hi >= 0 && lo >= 0)
            return t->byte_pieces[hi * 16 + lo];
    }
    return piece;
}
