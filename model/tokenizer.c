/* The tokenizer of model/tokenizer.h. */
#include "model/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/io.h"

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
    return strcmp(((const fgm_tokenizer_entry *)a)->piece, ((const fgm_tokenizer_entry *)b)->piece);
}

void fgm_tokenizer_free(fgm_tokenizer *t) {
    if (!t)
        return;
    if (t->pieces)
        for (int32_t i = 0; i < t->vocab_size; i++)
            free(t->pieces[i]);
    free(t->pieces);
    free(t->scores);
    free(t->control);
    for (int32_t i = 0; t->merges && i < t->n_merges; i++)
        free((void *)t->merges[i].pair);
    free(t->merges);
    for (int32_t i = 0; t->text && i < t->vocab_size; i++)
        free(t->text[i]);
    free(t->text);
    free(t->sorted);
    free(t->specials);
    memset(t, 0, sizeof *t);
}

/* The lookup table, the byte pieces and the control flags, once the pieces are in. */
static fg_status finish(fgm_tokenizer *t, char *err, size_t err_size) {
    if (!t->control)
        t->control = calloc((size_t)t->vocab_size, 1);
    if (!t->control) {
        fgm_tokenizer_free(t);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d tokens", (int)t->vocab_size);
    }
    for (int32_t i = 0; i < t->vocab_size; i++) {
        t->sorted[i] = (fgm_tokenizer_entry){t->pieces[i], i};
        const size_t len = strlen(t->pieces[i]);
        if (len > t->max_piece_len)
            t->max_piece_len = len;
    }
    qsort(t->sorted, (size_t)t->vocab_size, sizeof *t->sorted, by_piece);
    if (t->bos >= 0 && t->bos < t->vocab_size)
        t->control[t->bos] = 1;
    if (t->eos >= 0 && t->eos < t->vocab_size)
        t->control[t->eos] = 1;
    /* the control tokens with a text, longest first, for FGM_ENCODE_SPECIAL */
    t->n_specials = 0;
    for (int32_t i = 0; i < t->vocab_size; i++)
        t->n_specials += t->control[i] && t->pieces[i][0];
    t->specials = malloc((t->n_specials ? (size_t)t->n_specials : 1) * sizeof *t->specials);
    if (!t->specials) {
        fgm_tokenizer_free(t);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d tokens", (int)t->vocab_size);
    }
    t->n_specials = 0;
    for (int32_t i = 0; i < t->vocab_size; i++) { /* insertion by length: there are a few */
        if (!t->control[i] || !t->pieces[i][0])
            continue;
        int32_t at = t->n_specials++;
        for (; at > 0 && strlen(t->pieces[t->specials[at - 1]]) < strlen(t->pieces[i]); at--)
            t->specials[at] = t->specials[at - 1];
        t->specials[at] = i;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        fgm_tokenizer_entry key = {name, 0};
        const fgm_tokenizer_entry *e = bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof key, by_piece);
        t->byte_id[b] = e ? e->id : -1;
        t->byte_pieces[b][0] = (char)b;
        t->byte_pieces[b][1] = '\0';
    }
    return FG_OK;
}

fg_status fgm_tokenizer_load_memory(const void *buf, size_t size, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                   size_t err_size) {
    memset(out, 0, sizeof *out);
    if (vocab_size <= FGM_TOKEN_EOS)
        return fgm_failf(err, err_size, FG_ERR_INVALID_ARGUMENT,
                     "vocabulary of %d tokens: a llama2.c tokenizer has at least <unk>, BOS and EOS",
                     (int)vocab_size);
    const unsigned char *p = buf;
    if (!buf || size < 4)
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "tokenizer is %zu bytes, shorter than its header", size);
    out->vocab_size = vocab_size;
    out->pieces = calloc((size_t)vocab_size, sizeof *out->pieces);
    out->scores = malloc((size_t)vocab_size * sizeof *out->scores);
    out->sorted = malloc((size_t)vocab_size * sizeof *out->sorted);
    if (!out->pieces || !out->scores || !out->sorted) {
        fgm_tokenizer_free(out);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d tokens", (int)vocab_size);
    }
    size_t off = 4; /* max_token_length: not trusted, lengths are checked one by one */
    for (int32_t i = 0; i < vocab_size; i++) {
        float score;
        int32_t len;
        if (size - off < 8) {
            fgm_tokenizer_free(out);
            return fgm_failf(err, err_size, FG_ERR_FORMAT,
                         "tokenizer has %d entries, the model's vocabulary has %d (truncated or wrong file)", (int)i,
                         (int)vocab_size);
        }
        memcpy(&score, p + off, 4);
        memcpy(&len, p + off + 4, 4);
        off += 8;
        if (len < 0 || (size_t)len > size - off || !isfinite(score)) {
            fgm_tokenizer_free(out);
            return fgm_failf(err, err_size, FG_ERR_FORMAT,
                         "tokenizer entry %d: length %d or score %g runs past the end of the file (%zu bytes)",
                         (int)i, (int)len, (double)score, size);
        }
        out->pieces[i] = malloc((size_t)len + 1);
        if (!out->pieces[i]) {
            fgm_tokenizer_free(out);
            return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for tokenizer entry %d", (int)i);
        }
        memcpy(out->pieces[i], p + off, (size_t)len);
        out->pieces[i][len] = '\0';
        off += (size_t)len;
        out->scores[i] = score;
    }
    if (off != size) {
        fgm_tokenizer_free(out);
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
                        "tokenizer has %zu bytes after its %d entries (a tokenizer for a larger vocabulary, or not "
                        "a llama2.c tokenizer)", size - off, (int)vocab_size);
    }
    out->bos = FGM_TOKEN_BOS;
    out->eos = FGM_TOKEN_EOS;
    out->unk = 0;
    out->add_bos = 1;
    return finish(out, err, err_size);
}

fg_status fgm_tokenizer_load_file(const char *path, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                 size_t err_size) {
    void *buf;
    size_t size;
    memset(out, 0, sizeof *out);
    fg_status st = fgm_read_file(path, &buf, &size, err, err_size);
    if (st)
        return st;
    st = fgm_tokenizer_load_memory(buf, size, vocab_size, out, err, err_size);
    free(buf);
    return st;
}

static int32_t lookup(const fgm_tokenizer *t, const char *s) {
    fgm_tokenizer_entry key = {s, 0};
    const fgm_tokenizer_entry *e = bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof key, by_piece);
    return e ? e->id : -1;
}

int32_t fgm_tokenizer_piece_id(const fgm_tokenizer *t, const char *piece) { return lookup(t, piece); }

/* A candidate merge of symbol l with its right neighbour r into piece id
 * (score score), as it was when queued: stale once either symbol changed. */
typedef struct {
    float score;
    int32_t l, r, lid, rid, id;
} spm_pair;

/* Pops before: the higher score, then the leftmost (the order the merges
 * are taken in: SentencePiece's and llama.cpp's). */
static int spm_before(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->l < b->l);
}

static void spm_push(spm_pair *heap, int32_t *n, spm_pair e) {
    int32_t i = (*n)++;
    for (; i > 0 && spm_before(&e, &heap[(i - 1) / 2]); i = (i - 1) / 2)
        heap[i] = heap[(i - 1) / 2];
    heap[i] = e;
}

static spm_pair spm_pop(spm_pair *heap, int32_t *n) {
    const spm_pair top = heap[0], last = heap[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && spm_before(&heap[c + 1], &heap[c]))
            c++;
        if (!spm_before(&heap[c], &last))
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0)
        heap[i] = last;
    return top;
}

/* Queues the merge of symbols l and r when their concatenation is a piece. */
static void spm_queue(const fgm_tokenizer *t, const int32_t *id, int32_t l, int32_t r, char *pair, spm_pair *heap,
                      int32_t *n_heap) {
    if (l < 0 || r < 0)
        return;
    const size_t a = strlen(t->pieces[id[l]]), b = strlen(t->pieces[id[r]]);
    if (a + b > t->max_piece_len)
        return;
    memcpy(pair, t->pieces[id[l]], a);
    memcpy(pair + a, t->pieces[id[r]], b + 1);
    const int32_t m = lookup(t, pair);
    if (m >= 0 && isfinite(t->scores[m])) /* a NaN would break the heap's order */
        spm_push(heap, n_heap, (spm_pair){t->scores[m], l, r, id[l], id[r], m});
}

/* SentencePiece: the dummy-prefix space (when prefix), code points whole or
 * as bytes, then merges, the best-scoring adjacent pair first, until no pair
 * is a piece; appended at tokens[*n_out] (counted past cap). The symbols
 * form a linked list and the candidate pairs a heap, so n bytes take
 * O(n log n): each merge queues at most two new pairs. */
static fg_status spm_encode(const fgm_tokenizer *t, const char *text, int prefix, int32_t *tokens, int32_t cap,
                            int32_t *n_out) {
    /* before merging: at most the dummy prefix and one token per byte */
    const size_t len_text = strlen(text);
    if (len_text > (size_t)INT32_MAX / 4)
        return FG_ERR_CAPACITY;
    const size_t n_max = len_text + 2;
    int32_t *id = malloc(n_max * sizeof *id), *next = malloc(n_max * sizeof *next);
    int32_t *prev = malloc(n_max * sizeof *prev);
    spm_pair *heap = malloc(3 * n_max * sizeof *heap); /* n - 1 pairs, then two per merge */
    char *pair = malloc(2 * t->max_piece_len + 1);
    fg_status st = FG_OK;
    if (!id || !next || !prev || !heap || !pair)
        st = FG_ERR_OUT_OF_MEMORY;
    int32_t n = 0;
    if (st == FG_OK && prefix && text[0]) {
        int32_t space = lookup(t, " ");
        if (space >= 0)
            id[n++] = space;
    }
    /* code points whole, else their bytes */
    char cp[5];
    for (const unsigned char *s = (const unsigned char *)text; st == FG_OK && *s;) {
        size_t len = 1;
        while (len < 4 && (s[len] & 0xc0) == 0x80)
            len++;
        memcpy(cp, s, len);
        cp[len] = '\0';
        int32_t cid = lookup(t, cp);
        if (cid >= 0) {
            id[n++] = cid;
        } else {
            for (size_t i = 0; i < len; i++) /* byte fallback, else the unknown token */
                id[n++] = t->byte_id[s[i]] >= 0 ? t->byte_id[s[i]] : t->unk >= 0 ? t->unk : 0;
        }
        s += len;
    }
    int32_t n_heap = 0;
    for (int32_t i = 0; st == FG_OK && i < n; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
        if (i > 0)
            spm_queue(t, id, i - 1, i, pair, heap, &n_heap);
    }
    while (n_heap > 0) {
        const spm_pair e = spm_pop(heap, &n_heap);
        if (id[e.l] < 0 || next[e.l] != e.r || id[e.l] != e.lid || id[e.r] != e.rid)
            continue; /* stale: a symbol of it merged since */
        id[e.l] = e.id; /* r joins l and leaves the list */
        id[e.r] = -1;
        next[e.l] = next[e.r];
        if (next[e.r] >= 0)
            prev[next[e.r]] = e.l;
        spm_queue(t, id, prev[e.l], e.l, pair, heap, &n_heap);
        spm_queue(t, id, e.l, next[e.l], pair, heap, &n_heap);
    }
    for (int32_t i = st == FG_OK && n > 0 ? 0 : -1; i >= 0; i = next[i], (*n_out)++)
        if (*n_out < cap)
            tokens[*n_out] = id[i];
    free(id);
    free(next);
    free(prev);
    free(heap);
    free(pair);
    return st;
}

/* The control token whose text starts s, the longest of them; -1 if none. */
static int32_t special_at(const fgm_tokenizer *t, const char *s) {
    for (int32_t i = 0; i < t->n_specials; i++) /* longest first */
        if (!strncmp(s, t->pieces[t->specials[i]], strlen(t->pieces[t->specials[i]])))
            return t->specials[i];
    return -1;
}

/* Text without control tokens in it, appended at tokens[*n]. */
static fg_status encode_text(const fgm_tokenizer *t, const char *text, int prefix, int32_t *tokens, int32_t cap,
                             int32_t *n) {
    return t->kind == FGM_TOKENIZER_BPE ? fgm_bpe_encode(t, text, tokens, cap, n)
                                       : spm_encode(t, text, prefix, tokens, cap, n);
}

fg_status fgm_tokenizer_encode(const fgm_tokenizer *t, const char *text, int flags, int32_t *tokens, int32_t cap,
                              int32_t *n_out) {
    int32_t n = 0;
    if ((flags & FGM_ENCODE_BOS) && t->add_bos && t->bos >= 0) {
        if (cap > 0)
            tokens[0] = t->bos;
        n = 1;
    }
    fg_status st = FG_OK;
    if (!(flags & FGM_ENCODE_SPECIAL) || t->n_specials == 0) {
        st = encode_text(t, text, 1, tokens, cap, &n);
    } else { /* the runs of text between control tokens, each encoded alone (as llama.cpp does) */
        char *run = malloc(strlen(text) + 1);
        if (!run)
            return FG_ERR_OUT_OF_MEMORY;
        int after_special = 1; /* SentencePiece's dummy prefix: at the start and after a control token */
        for (const char *p = text; st == FG_OK && *p;) {
            const char *q = p;
            int32_t id = -1;
            while (*q && (id = special_at(t, q)) < 0)
                q++;
            if (q > p) {
                memcpy(run, p, (size_t)(q - p));
                run[q - p] = '\0';
                st = encode_text(t, run, after_special, tokens, cap, &n);
                after_special = 0;
            }
            if (id >= 0) {
                if (n < cap)
                    tokens[n] = id;
                n++;
                after_special = 1;
                q += strlen(t->pieces[id]);
            }
            p = q;
        }
        free(run);
    }
    *n_out = n;
    return st != FG_OK ? st : n <= cap ? FG_OK : FG_ERR_CAPACITY;
}

const char *fgm_tokenizer_decode(const fgm_tokenizer *t, int32_t prev, int32_t token) {
    if (token < 0 || token >= t->vocab_size)
        return "";
    if (t->control[token])
        return "";
    if (t->kind == FGM_TOKENIZER_BPE)
        return t->text[token];
    const char *piece = t->pieces[token];
    if (prev == t->bos && piece[0] == ' ')
        piece++;
    /* "<0xNN>" with exactly two hex digits (no sign, no space) is its byte */
    if (strlen(piece) == 6 && !strncmp(piece, "<0x", 3) && piece[5] == '>') {
        int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
        if (hi >= 0 && lo >= 0)
            return t->byte_pieces[hi * 16 + lo];
    }
    return piece;
}

/* ------------------------------------------------------------------ GGUF */

/* GGUF token types (llama.cpp's): 2 unknown, 3 control, 6 byte. */
#define GGUF_TOKEN_CONTROL 3

fg_status fgm_tokenizer_from_gguf(const fgm_gguf *g, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                 size_t err_size) {
    memset(out, 0, sizeof *out);
    char model[32];
    fgm_gguf_get_str(g, "tokenizer.ggml.model", model, sizeof model);
    const int bpe = !strcmp(model, "gpt2");
    if (strcmp(model, "llama") && !bpe)
        return fgm_failf(err, err_size, FG_ERR_UNAVAILABLE,
                        "GGUF: tokenizer \"%s\" is not supported (fastgen reads SentencePiece, \"llama\", and "
                        "byte-level BPE, \"gpt2\")", model[0] ? model : "(none)");
    const fgm_gguf_kv *tokens = fgm_gguf_find(g, "tokenizer.ggml.tokens");
    const fgm_gguf_kv *scores = fgm_gguf_find(g, "tokenizer.ggml.scores");
    const fgm_gguf_kv *types = fgm_gguf_find(g, "tokenizer.ggml.token_type");
    if (!tokens || tokens->type != FGM_GGUF_ARRAY || tokens->elem_type != FGM_GGUF_STRING ||
        tokens->n_elems != (uint64_t)vocab_size)
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
                        "GGUF: tokenizer.ggml.tokens must be an array of %d strings (the embedding's rows)",
                        (int)vocab_size);
    if ((scores && (scores->type != FGM_GGUF_ARRAY || scores->elem_type == FGM_GGUF_STRING ||
                    scores->n_elems != (uint64_t)vocab_size)) ||
        (types && (types->type != FGM_GGUF_ARRAY || types->elem_type == FGM_GGUF_STRING ||
                   types->n_elems != (uint64_t)vocab_size)))
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
                        "GGUF: tokenizer.ggml.scores and token_type must be numeric arrays of %d", (int)vocab_size);
    /* absent ids: SentencePiece's usual 1, 2, 0; a BPE vocabulary has none unless it says so */
    int64_t bos, eos, unk, add_bos;
    fg_status st = fgm_gguf_get_int(g, "tokenizer.ggml.bos_token_id", bpe ? -1 : 1, &bos, err, err_size);
    if (!st)
        st = fgm_gguf_get_int(g, "tokenizer.ggml.eos_token_id", bpe ? -1 : 2, &eos, err, err_size);
    if (!st)
        st = fgm_gguf_get_int(g, "tokenizer.ggml.unknown_token_id", bpe ? -1 : 0, &unk, err, err_size);
    if (!st)
        st = fgm_gguf_get_int(g, "tokenizer.ggml.add_bos_token", bpe ? 0 : 1, &add_bos, err, err_size);
    if (st)
        return st;
    if (bos < -1 || bos >= vocab_size || eos < -1 || eos >= vocab_size || unk < -1 || unk >= vocab_size)
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "GGUF: BOS %lld, EOS %lld or unknown %lld outside the %d tokens",
                        (long long)bos, (long long)eos, (long long)unk, (int)vocab_size);
    out->vocab_size = vocab_size;
    out->pieces = calloc((size_t)vocab_size, sizeof *out->pieces);
    out->scores = malloc((size_t)vocab_size * sizeof *out->scores);
    out->sorted = malloc((size_t)vocab_size * sizeof *out->sorted);
    out->control = calloc((size_t)vocab_size, 1);
    if (!out->pieces || !out->scores || !out->sorted || !out->control) {
        fgm_tokenizer_free(out);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d tokens", (int)vocab_size);
    }
    for (int32_t i = 0; i < vocab_size; i++) {
        /* U+2581 (the SentencePiece space, E2 96 81) becomes an ASCII space */
        const char *src = tokens->strs[i];
        char *dst = out->pieces[i] = malloc(strlen(src) + 1);
        if (!dst) {
            fgm_tokenizer_free(out);
            return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for token %d", (int)i);
        }
        while (*src)
            if (!bpe && !strncmp(src, "\xe2\x96\x81", 3)) {
                *dst++ = ' ';
                src += 3;
            } else {
                *dst++ = *src++;
            }
        *dst = '\0';
        out->scores[i] = scores ? (float)fgm_gguf_array_num(scores, (uint64_t)i) : 0.0f;
        out->control[i] = types && fgm_gguf_array_num(types, (uint64_t)i) == GGUF_TOKEN_CONTROL;
    }
    out->bos = (int32_t)bos;
    out->eos = (int32_t)eos;
    out->unk = (int32_t)unk;
    out->add_bos = add_bos != 0;
    st = finish(out, err, err_size);
    if (st == FG_OK && bpe && (st = fgm_bpe_from_gguf(g, vocab_size, out, err, err_size)) != FG_OK)
        fgm_tokenizer_free(out);
    return st;
}
