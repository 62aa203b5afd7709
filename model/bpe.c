/*
 * Byte-level BPE (GPT-2 and its descendants, tokenizer.ggml.model = "gpt2").
 * 1. Pre-tokenization: GPT-2's pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    applied by hand, alternative by alternative (model/unicode_classes.h
 *    holds the Unicode classes); "smollm" first splits every digit apart.
 * 2. Each pre-token's bytes become GPT-2's printable stand-ins (bytes 33-126,
 *    161-172 and 174-255 stand for themselves, the others for 256, 257, ...).
 * 3. Merges: repeatedly the adjacent pair ranked first in the merges list
 *    (leftmost on ties), then each symbol is looked up as a token.
 * Checked on vocabularies the tests build; no real GPT-2 vocabulary is here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/bpe.h"
#include "model/gguf.h"
#include "model/io.h"

/* ------------------------------------------------------------------ Unicode */

typedef enum fgm_uc_class { FGM_UC_OTHER = 0, FGM_UC_LETTER, FGM_UC_NUMBER, FGM_UC_SPACE } fgm_uc_class;

typedef struct fgm_uc_range {
    uint32_t lo, hi;
    fgm_uc_class cls;
} fgm_uc_range;

#include "model/unicode_classes.h"

/* Bytes in the well-formed UTF-8 sequence at p (1 to 4), 0 if none starts
 * there: overlong forms, surrogates, code points past U+10FFFF and cut
 * sequences are not well formed (Unicode's table 3-7). */
int fgm_utf8_length(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    if (p[0] < 0x80)
        return 1;
    int n;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        n = 2;
    else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        n = 3;
        lo = p[0] == 0xe0 ? 0xa0 : 0x80;
        hi = p[0] == 0xed ? 0x9f : 0xbf;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        n = 4;
        lo = p[0] == 0xf0 ? 0x90 : 0x80;
        hi = p[0] == 0xf4 ? 0x8f : 0xbf;
    } else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

static fgm_uc_class uc_class(uint32_t c) {
    size_t lo = 0, hi = sizeof k_uc_ranges / sizeof k_uc_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < k_uc_ranges[mid].lo)
            hi = mid;
        else if (c > k_uc_ranges[mid].hi)
            lo = mid + 1;
        else
            return k_uc_ranges[mid].cls;
    }
    return FGM_UC_OTHER;
}

/* The code point at s (malformed UTF-8: one byte, as itself) and its length. */
static uint32_t utf8_next(const unsigned char *s, size_t left, size_t *len) {
    const unsigned c = s[0];
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > left) {
        *len = 1;
        return c;
    }
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *len = n;
    return cp;
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* ------------------------------------------------------------------ pre-tokenization */

typedef struct scan {
    const unsigned char *s;
    size_t n;
} scan;

static fgm_uc_class class_at(const scan *x, size_t i, size_t *len) {
    return uc_class(utf8_next(x->s + i, x->n - i, len));
}

/* Length of the run of class k from i (0 when none). */
static size_t run_of(const scan *x, size_t i, fgm_uc_class k) {
    size_t j = i, len;
    while (j < x->n && class_at(x, j, &len) == k)
        j += len;
    return j - i;
}

/* Length of a run of "other" (not space, letter or number) from i. */
static size_t run_of_other(const scan *x, size_t i) { return run_of(x, i, FGM_UC_OTHER); }

/* The GPT-2 pattern at i: the length of the match (>= 1). */
static size_t gpt2_match(const scan *x, size_t i) {
    const unsigned char *s = x->s + i;
    const size_t left = x->n - i;
    if (s[0] == '\'') {
        static const char *k_suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        for (size_t k = 0; k < sizeof k_suffixes / sizeof k_suffixes[0]; k++) {
            const size_t m = strlen(k_suffixes[k]);
            if (left > m && !memcmp(s + 1, k_suffixes[k], m))
                return 1 + m;
        }
    }
    const size_t sp = s[0] == ' ' && left > 1 ? 1 : 0; /* the optional leading space */
    size_t len;
    const fgm_uc_class k = class_at(x, i + sp, &len);
    if (k == FGM_UC_LETTER || k == FGM_UC_NUMBER)
        return sp + run_of(x, i + sp, k);
    if (k == FGM_UC_OTHER)
        return sp + run_of_other(x, i + sp);
    /* whitespace: \s+(?!\S) leaves the last space to the next word; else \s+ */
    const size_t ws = run_of(x, i, FGM_UC_SPACE);
    if (i + ws >= x->n)
        return ws;
    size_t j = i, last = i;
    while (j < i + ws) { /* the start of the last space character (ws counts bytes) */
        last = j;
        class_at(x, j, &len);
        j += len;
    }
    return last > i ? last - i : ws; /* one space character alone: \s+ takes it */
}

void fgm_bpe_pretokenize(fgm_pretok pre, const char *text, void (*emit)(void *user, const char *s, size_t n),
                        void *user) {
    const size_t n = strlen(text);
    size_t i = 0;
    while (i < n) {
        /* smollm: every digit stands alone before GPT-2's pattern sees the rest */
        size_t end = n, len;
        if (pre == FGM_PRETOK_SMOLLM) {
            scan all = {(const unsigned char *)text, n};
            if (class_at(&all, i, &len) == FGM_UC_NUMBER) {
                emit(user, text + i, len);
                i += len;
                continue;
            }
            for (end = i; end < n && class_at(&all, end, &len) != FGM_UC_NUMBER; end += len)
                ;
        }
        scan x = {(const unsigned char *)text, end};
        while (i < end) {
            const size_t m = gpt2_match(&x, i);
            emit(user, text + i, m);
            i += m;
        }
    }
}

/* ------------------------------------------------------------------ merges */

static int by_pair(const void *a, const void *b) {
    return strcmp(((const fgm_bpe_merge *)a)->pair, ((const fgm_bpe_merge *)b)->pair);
}

/* By pair, then by rank: the first of a pair listed twice comes first. */
static int by_pair_rank(const void *a, const void *b) {
    const int c = by_pair(a, b);
    const int32_t ra = ((const fgm_bpe_merge *)a)->rank, rb = ((const fgm_bpe_merge *)b)->rank;
    return c ? c : (ra > rb) - (ra < rb);
}

static int by_piece(const void *a, const void *b) {
    return strcmp(((const fgm_tokenizer_entry *)a)->piece, ((const fgm_tokenizer_entry *)b)->piece);
}

static int32_t rank_of(const fgm_tokenizer *t, const char *pair) {
    fgm_bpe_merge key = {pair, 0};
    const fgm_bpe_merge *m = bsearch(&key, t->merges, (size_t)t->n_merges, sizeof key, by_pair);
    return m ? m->rank : -1;
}

static int32_t lookup(const fgm_tokenizer *t, const char *s) {
    fgm_tokenizer_entry key = {s, 0};
    const fgm_tokenizer_entry *e = bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof key, by_piece);
    return e ? e->id : -1;
}

/* GPT-2's byte -> code point stand-ins. */
static uint32_t byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    unsigned k = 0; /* the k-th byte without a printable self */
    for (unsigned c = 0; c < b; c++)
        k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    return 256 + k;
}

typedef struct encoder {
    const fgm_tokenizer *t;
    int32_t *out, cap, n;
    char *sym;    /* [len * 3] the stand-ins, then merged symbols */
    size_t *at;   /* [len + 1] symbol boundaries in sym */
    char *buf;    /* pair scratch */
} encoder;

static void push(encoder *e, int32_t id) {
    if (e->n < e->cap)
        e->out[e->n] = id;
    e->n++;
}

static void encode_word(void *user, const char *s, size_t n) {
    encoder *e = user;
    size_t m = 0, count = 0;
    for (size_t i = 0; i < n; i++) { /* one symbol per byte, as its stand-in */
        e->at[count++] = m;
        m += utf8_put(byte_char((unsigned char)s[i]), e->sym + m);
    }
    e->at[count] = m;
    for (;;) { /* the best-ranked adjacent pair, leftmost on ties */
        int32_t best = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < count; i++) {
            const size_t la = e->at[i + 1] - e->at[i], lb = e->at[i + 2] - e->at[i + 1];
            memcpy(e->buf, e->sym + e->at[i], la);
            e->buf[la] = ' ';
            memcpy(e->buf + la + 1, e->sym + e->at[i + 1], lb);
            e->buf[la + 1 + lb] = '\0';
            const int32_t r = rank_of(e->t, e->buf);
            if (r >= 0 && (best < 0 || r < best)) {
                best = r;
                best_i = i;
            }
        }
        if (best < 0)
            break;
        memmove(e->at + best_i + 1, e->at + best_i + 2, (count - best_i - 1) * sizeof *e->at);
        count--;
    }
    for (size_t i = 0; i < count; i++) {
        const size_t len = e->at[i + 1] - e->at[i];
        memcpy(e->buf, e->sym + e->at[i], len);
        e->buf[len] = '\0';
        const int32_t id = lookup(e->t, e->buf);
        push(e, id >= 0 ? id : e->t->unk >= 0 ? e->t->unk : 0);
    }
}

/* text with every byte that is not part of well-formed UTF-8 replaced by
 * U+FFFD (as llama.cpp reads text, and stricter: overlong forms and
 * surrogates too): such bytes have no piece of their own
 * in a byte-level vocabulary, and the unknown token may be a control token.
 * NULL when text is well formed (or out of memory: *st). */
static char *well_formed(const char *text, size_t n, fg_status *st) {
    size_t i = 0;
    int len;
    while (i < n && (len = fgm_utf8_length(text + i)) > 0)
        i += (size_t)len;
    if (i == n)
        return NULL;
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) {
        *st = FG_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    for (i = 0; i < n;) {
        len = fgm_utf8_length(text + i);
        if (len == 0) {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(o, text + i, (size_t)len);
            o += len;
            i += (size_t)len;
        }
    }
    *o = '\0';
    return out;
}

fg_status fgm_bpe_encode(const fgm_tokenizer *t, const char *text, int32_t *tokens, int32_t cap, int32_t *n_out) {
    fg_status st = FG_OK;
    char *fixed = well_formed(text, strlen(text), &st);
    if (st)
        return st;
    if (fixed)
        text = fixed;
    const size_t n = strlen(text);
    encoder e = {t, tokens, cap, *n_out, malloc(3 * n + 1), malloc((n + 2) * sizeof(size_t)), malloc(6 * n + 2)};
    if (e.sym && e.at && e.buf)
        fgm_bpe_pretokenize(t->pre, text, encode_word, &e);
    else
        st = FG_ERR_OUT_OF_MEMORY;
    free(e.sym);
    free(e.at);
    free(e.buf);
    free(fixed);
    if (st == FG_OK)
        *n_out = e.n;
    return st;
}

/* ------------------------------------------------------------------ loading */

/* The bytes a token's stand-ins spell (pieces of control tokens stay as
 * they are); byte_of: the byte of each stand-in code point below 512, or -1. */
static char *stand_ins_to_bytes(const char *piece, const int16_t byte_of[512]) {
    const size_t n = strlen(piece);
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        const uint32_t cp = utf8_next((const unsigned char *)piece + i, n - i, &len);
        const int b = cp < 512 ? byte_of[cp] : -1;
        if (b >= 0)
            out[m++] = (char)b;
        else {
            memcpy(out + m, piece + i, len);
            m += len;
        }
        i += len;
    }
    out[m] = '\0';
    return out;
}

fg_status fgm_bpe_from_gguf(const fgm_gguf *g, int32_t vocab_size, fgm_tokenizer *out, char *err, size_t err_size) {
    char pre[64];
    fgm_gguf_get_str(g, "tokenizer.ggml.pre", pre, sizeof pre);
    if (!pre[0] || !strcmp(pre, "default") || !strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2"))
        out->pre = FGM_PRETOK_GPT2;
    else if (!strcmp(pre, "smollm"))
        out->pre = FGM_PRETOK_SMOLLM;
    else
        return fgm_failf(err, err_size, FG_ERR_UNAVAILABLE,
                        "GGUF: pre-tokenizer \"%s\" is not supported (fastgen knows gpt2 and smollm)", pre);
    const fgm_gguf_kv *merges = fgm_gguf_find(g, "tokenizer.ggml.merges");
    if (!merges || merges->type != FGM_GGUF_ARRAY || merges->elem_type != FGM_GGUF_STRING ||
        merges->n_elems > (uint64_t)INT32_MAX)
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "GGUF: a gpt2 tokenizer needs tokenizer.ggml.merges (strings)");
    out->kind = FGM_TOKENIZER_BPE;
    out->n_merges = (int32_t)merges->n_elems;
    out->merges = malloc((merges->n_elems ? merges->n_elems : 1) * sizeof *out->merges);
    out->text = calloc((size_t)vocab_size, sizeof *out->text);
    if (!out->merges || !out->text)
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %d merges", (int)out->n_merges);
    for (int32_t i = 0; i < out->n_merges; i++) {
        const size_t len = strlen(merges->strs[i]);
        char *copy = malloc(len + 1);
        if (!copy) {
            out->n_merges = i;
            return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for merge %d", (int)i);
        }
        memcpy(copy, merges->strs[i], len + 1);
        out->merges[i] = (fgm_bpe_merge){copy, i};
    }
    /* a pair listed twice keeps its first rank (a lookup must not find the later copy) */
    qsort(out->merges, (size_t)out->n_merges, sizeof *out->merges, by_pair_rank);
    int32_t kept = 0;
    for (int32_t i = 0; i < out->n_merges; i++) {
        if (kept > 0 && !strcmp(out->merges[kept - 1].pair, out->merges[i].pair))
            free((char *)out->merges[i].pair);
        else
            out->merges[kept++] = out->merges[i];
    }
    out->n_merges = kept;
    int16_t byte_of[512];
    for (int c = 0; c < 512; c++)
        byte_of[c] = -1;
    for (int b = 255; b >= 0; b--)
        byte_of[byte_char((unsigned)b)] = (int16_t)b;
    for (int32_t i = 0; i < vocab_size; i++)
        if (!(out->text[i] = stand_ins_to_bytes(out->pieces[i], byte_of)))
            return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for token %d", (int)i);
    return FG_OK;
}
