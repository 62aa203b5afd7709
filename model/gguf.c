/* The GGUF reader of model/gguf.h. A cursor walks the file; every read
 * checks what is left before it takes anything. */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/dequant.h"
#include "model/llama2c.h"
#include "model/io.h"

/* Limits far beyond any real model that keep every size computation exact. */
#define MAX_KV ((int64_t)1 << 20)
#define MAX_TENSORS ((int64_t)1 << 20)
#define MAX_ELEMS ((int64_t)1 << 40)

typedef struct cursor {
    const unsigned char *p;
    size_t left, size;
    char *err;
    size_t err_size;
    const char *where; /* the key or tensor being read, for messages */
} cursor;

static fg_status bad(cursor *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static fg_status bad(cursor *c, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fgm_failf(c->err, c->err_size, FG_ERR_FORMAT, "GGUF %s at byte %zu: %s", c->where, c->size - c->left, what);
}

static fg_status take(cursor *c, void *dst, size_t n) {
    if (c->left < n)
        return bad(c, "needs %zu more bytes, the file has %zu", n, c->left);
    memcpy(dst, c->p, n);
    c->p += n;
    c->left -= n;
    return FG_OK;
}

static fg_status take_str(cursor *c, fgm_gguf_str *s) {
    uint64_t n = 0;
    fg_status st = take(c, &n, 8);
    if (st)
        return st;
    if (n > c->left)
        return bad(c, "a string of %llu bytes runs past the end of the file", (unsigned long long)n);
    s->s = (const char *)c->p;
    s->n = n;
    c->p += n;
    c->left -= n;
    return FG_OK;
}

static size_t vtype_size(fgm_gguf_vtype t) {
    switch (t) {
    case FGM_GGUF_UINT8: case FGM_GGUF_INT8: case FGM_GGUF_BOOL: return 1;
    case FGM_GGUF_UINT16: case FGM_GGUF_INT16: return 2;
    case FGM_GGUF_UINT32: case FGM_GGUF_INT32: case FGM_GGUF_FLOAT32: return 4;
    case FGM_GGUF_UINT64: case FGM_GGUF_INT64: case FGM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *fgm_gguf_vtype_name(fgm_gguf_vtype t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < FGM_GGUF_N_VTYPES ? names[t] : "unknown";
}

/* A scalar of type t at p into kv's union. */
static void decode_scalar(fgm_gguf_vtype t, const unsigned char *p, fgm_gguf_kv *kv) {
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    float f32;
    switch (t) {
    case FGM_GGUF_UINT8: case FGM_GGUF_BOOL: memcpy(&u8, p, 1); kv->v.u = u8; break;
    case FGM_GGUF_INT8: memcpy(&i8, p, 1); kv->v.i = i8; break;
    case FGM_GGUF_UINT16: memcpy(&u16, p, 2); kv->v.u = u16; break;
    case FGM_GGUF_INT16: memcpy(&i16, p, 2); kv->v.i = i16; break;
    case FGM_GGUF_UINT32: memcpy(&u32, p, 4); kv->v.u = u32; break;
    case FGM_GGUF_INT32: memcpy(&i32, p, 4); kv->v.i = i32; break;
    case FGM_GGUF_FLOAT32: memcpy(&f32, p, 4); kv->v.f = f32; break;
    case FGM_GGUF_UINT64: memcpy(&kv->v.u, p, 8); break;
    case FGM_GGUF_INT64: memcpy(&kv->v.i, p, 8); break;
    case FGM_GGUF_FLOAT64: memcpy(&kv->v.f, p, 8); break;
    default: break;
    }
}

static char *dup_str(fgm_gguf_str s) {
    char *out = malloc(s.n + 1);
    if (out) {
        memcpy(out, s.s, s.n);
        out[s.n] = '\0';
    }
    return out;
}

static fg_status read_kv(cursor *c, fgm_gguf_kv *kv) {
    fg_status st = take_str(c, &kv->key);
    if (st)
        return st;
    static _Thread_local char where[160];
    snprintf(where, sizeof where, "key \"%.*s\"", (int)(kv->key.n < 100 ? kv->key.n : 100), kv->key.s);
    c->where = where;
    uint32_t t = 0;
    if ((st = take(c, &t, 4)))
        return st;
    if (t >= FGM_GGUF_N_VTYPES)
        return bad(c, "unknown value type %u", t);
    kv->type = (fgm_gguf_vtype)t;
    if (t == FGM_GGUF_STRING)
        return take_str(c, &kv->v.str);
    if (t != FGM_GGUF_ARRAY) {
        const size_t n = vtype_size(kv->type);
        if (c->left < n)
            return bad(c, "a %s needs %zu bytes, the file has %zu", fgm_gguf_vtype_name(kv->type), n, c->left);
        decode_scalar(kv->type, c->p, kv);
        c->p += n;
        c->left -= n;
        return FG_OK;
    }
    uint32_t et = 0;
    uint64_t count = 0;
    if ((st = take(c, &et, 4)) || (st = take(c, &count, 8)))
        return st;
    if (et >= FGM_GGUF_N_VTYPES || et == FGM_GGUF_ARRAY)
        return bad(c, "array of %s elements", et == FGM_GGUF_ARRAY ? "array" : "unknown");
    kv->elem_type = (fgm_gguf_vtype)et;
    kv->n_elems = count;
    kv->elems = c->p;
    if (et != FGM_GGUF_STRING) {
        const size_t es = vtype_size(kv->elem_type);
        if (count > c->left / es)
            return bad(c, "an array of %llu %s runs past the end of the file", (unsigned long long)count,
                       fgm_gguf_vtype_name(kv->elem_type));
        c->p += count * es;
        c->left -= count * es;
        return FG_OK;
    }
    /* strings: each is at least its 8-byte length, which bounds the count first */
    if (count > c->left / 8)
        return bad(c, "an array of %llu strings runs past the end of the file", (unsigned long long)count);
    kv->strs = calloc(count ? count : 1, sizeof *kv->strs);
    if (!kv->strs)
        return fgm_failf(c->err, c->err_size, FG_ERR_OUT_OF_MEMORY, "GGUF %s: out of memory for %llu strings", where,
                        (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) {
        fgm_gguf_str s = {0};
        if ((st = take_str(c, &s)))
            return st;
        if (!(kv->strs[i] = dup_str(s)))
            return fgm_failf(c->err, c->err_size, FG_ERR_OUT_OF_MEMORY, "GGUF %s: out of memory", where);
    }
    return FG_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const fgm_gguf_tensor *x = *(const fgm_gguf_tensor *const *)a, *y = *(const fgm_gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static fg_status read_tensor(cursor *c, fgm_gguf_tensor *t, int64_t index) {
    static _Thread_local char where[160];
    snprintf(where, sizeof where, "tensor %lld", (long long)index);
    c->where = where;
    fgm_gguf_str name = {0};
    fg_status st = take_str(c, &name);
    if (st)
        return st;
    if (name.n == 0 || name.n >= sizeof t->name)
        return bad(c, "a name of %llu bytes (1 to %zu)", (unsigned long long)name.n, sizeof t->name - 1);
    memcpy(t->name, name.s, name.n);
    t->name[name.n] = '\0';
    snprintf(where, sizeof where, "tensor \"%s\"", t->name);
    if ((st = take(c, &t->n_dims, 4)))
        return st;
    if (t->n_dims < 1 || t->n_dims > FGM_GGUF_MAX_DIMS)
        return bad(c, "%u dimensions (1 to %d)", t->n_dims, FGM_GGUF_MAX_DIMS);
    int64_t elems = 1;
    for (uint32_t i = 0; i < FGM_GGUF_MAX_DIMS; i++) {
        uint64_t ne = 1;
        if (i < t->n_dims && (st = take(c, &ne, 8)))
            return st;
        if (ne < 1 || ne > (uint64_t)MAX_ELEMS || (uint64_t)elems > (uint64_t)MAX_ELEMS / ne)
            return bad(c, "dimension %u of %llu: the tensor would exceed 2^40 values", i, (unsigned long long)ne);
        t->ne[i] = (int64_t)ne;
        elems *= (int64_t)ne;
    }
    uint32_t type = 0;
    if ((st = take(c, &type, 4)) || (st = take(c, &t->offset, 8)))
        return st;
    t->type = (int32_t)type;
    const fgm_type_info *ti = fgm_type_info_of(t->type);
    if (!ti)
        return bad(c, "unknown tensor type %u", type);
    const int64_t row = fgm_type_row_bytes(t->type, t->ne[0]);
    if (row < 0)
        return bad(c, "rows of %lld values do not split into %s blocks of %d", (long long)t->ne[0], ti->name,
                   (int)ti->block);
    t->bytes = (uint64_t)row * (uint64_t)(elems / t->ne[0]);
    return FG_OK;
}

fg_status fgm_gguf_parse(const void *buf, size_t size, fgm_gguf *g, char *err, size_t err_size) {
    memset(g, 0, sizeof *g);
    cursor c = {buf, size, size, err, err_size, "header"};
    char magic[4];
    fg_status st = buf ? take(&c, magic, 4) : bad(&c, "no data");
    if (st)
        return st;
    if (memcmp(magic, "GGUF", 4))
        return bad(&c, "not a GGUF file (no \"GGUF\" magic)");
    uint64_t n_tensors = 0, n_kv = 0;
    if ((st = take(&c, &g->version, 4)))
        return st;
    if (g->version != 2 && g->version != 3)
        return bad(&c, "version %u (this reader takes 2 and 3)", g->version);
    if ((st = take(&c, &n_tensors, 8)) || (st = take(&c, &n_kv, 8)))
        return st;
    if (n_tensors > (uint64_t)MAX_TENSORS || n_kv > (uint64_t)MAX_KV || n_kv > c.left / 12)
        return bad(&c, "%llu tensors and %llu keys do not fit a file of %zu bytes", (unsigned long long)n_tensors,
                   (unsigned long long)n_kv, size);
    g->base = buf;
    g->size = size;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        fgm_gguf_free(g);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "GGUF: out of memory for %llu keys and %llu tensors",
                        (unsigned long long)n_kv, (unsigned long long)n_tensors);
    }
    /* n_kv counts the key being read too, so a string array that fails part-way is freed */
    for (uint64_t i = 0; i < n_kv && st == FG_OK; i++, g->n_kv++) {
        st = read_kv(&c, &g->kv[i]);
        for (uint64_t j = 0; st == FG_OK && j < i; j++)
            if (g->kv[j].key.n == g->kv[i].key.n && !memcmp(g->kv[j].key.s, g->kv[i].key.s, g->kv[i].key.n))
                st = bad(&c, "appears twice");
    }
    g->alignment = 32;
    const fgm_gguf_kv *al = st ? NULL : fgm_gguf_find(g, "general.alignment");
    if (al) {
        c.where = "key \"general.alignment\"";
        if (al->type != FGM_GGUF_UINT32 && al->type != FGM_GGUF_UINT64 && al->type != FGM_GGUF_INT32)
            st = bad(&c, "of type %s, not an integer", fgm_gguf_vtype_name(al->type));
        else if (al->v.u == 0 || al->v.u > 65536 || (al->v.u & (al->v.u - 1)))
            st = bad(&c, "%llu is not a power of two up to 65536", (unsigned long long)al->v.u);
        else
            g->alignment = al->v.u;
    }
    for (uint64_t i = 0; i < n_tensors && st == FG_OK; i++, g->n_tensors++) {
        st = read_tensor(&c, &g->tensors[i], (int64_t)i);
        for (uint64_t j = 0; st == FG_OK && j < i; j++)
            if (!strcmp(g->tensors[j].name, g->tensors[i].name))
                st = bad(&c, "appears twice");
    }
    if (st) {
        fgm_gguf_free(g);
        return st;
    }
    /* the data section starts at the next multiple of the alignment */
    c.where = "data section";
    const size_t header = size - c.left;
    const uint64_t data_at = (header + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors && data_at > size) {
        fgm_gguf_free(g);
        return bad(&c, "starts at byte %llu, past the end of the %zu-byte file", (unsigned long long)data_at, size);
    }
    const uint64_t data_size = data_at <= size ? size - data_at : 0;
    fgm_gguf_tensor **order = malloc((n_tensors ? n_tensors : 1) * sizeof *order);
    if (!order) {
        fgm_gguf_free(g);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "GGUF: out of memory");
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        fgm_gguf_tensor *t = &g->tensors[i];
        order[i] = t;
        const int unaligned = t->offset % g->alignment != 0;
        if (unaligned || t->offset > data_size || t->bytes > data_size - t->offset) {
            char where[160];
            snprintf(where, sizeof where, "tensor \"%s\"", t->name);
            c.where = where;
            if (unaligned)
                st = bad(&c, "data at offset %llu is not %llu-aligned", (unsigned long long)t->offset,
                         (unsigned long long)g->alignment);
            else
                st = bad(&c, "data at offset %llu (%llu bytes) runs past the end of the file: the data section "
                             "holds %llu bytes (a truncated file?)",
                         (unsigned long long)t->offset, (unsigned long long)t->bytes, (unsigned long long)data_size);
            break;
        }
        t->data = (const unsigned char *)buf + data_at + t->offset;
    }
    if (st == FG_OK) {
        qsort(order, n_tensors, sizeof *order, cmp_offset);
        for (uint64_t i = 1; i < n_tensors && st == FG_OK; i++)
            if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset) {
                char where[240];
                snprintf(where, sizeof where, "tensors \"%s\" and \"%s\"", order[i - 1]->name, order[i]->name);
                c.where = where;
                st = bad(&c, "overlap");
            }
    }
    free(order);
    if (st)
        fgm_gguf_free(g);
    return st;
}

fg_status fgm_gguf_open(const char *path, fgm_gguf *g, char *err, size_t err_size) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return fgm_failf(err, err_size, FG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0) {
        close(fd);
        return fgm_failf(err, err_size, FG_ERR_IO, "%s is not a regular, non-empty file", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return fgm_failf(err, err_size, FG_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    char inner[400];
    fg_status st = fgm_gguf_parse(map, (size_t)sb.st_size, g, inner, sizeof inner);
    if (st) {
        munmap(map, (size_t)sb.st_size);
        return fgm_failf(err, err_size, st, "%s: %s", path, inner);
    }
    g->mapping = map;
    return FG_OK;
}

void fgm_gguf_free(fgm_gguf *g) {
    if (!g)
        return;
    for (int64_t i = 0; g->kv && i < g->n_kv; i++)
        if (g->kv[i].strs) {
            for (uint64_t j = 0; j < g->kv[i].n_elems; j++)
                free((void *)g->kv[i].strs[j]);
            free(g->kv[i].strs);
        }
    free(g->kv);
    free(g->tensors);
    if (g->mapping)
        munmap(g->mapping, g->size);
    memset(g, 0, sizeof *g);
}

const fgm_gguf_kv *fgm_gguf_find(const fgm_gguf *g, const char *key) {
    const size_t n = strlen(key);
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.n == n && !memcmp(g->kv[i].key.s, key, n))
            return &g->kv[i];
    return NULL;
}

const fgm_gguf_tensor *fgm_gguf_tensor_find(const fgm_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

fg_status fgm_gguf_get_int(const fgm_gguf *g, const char *key, int64_t dflt, int64_t *out, char *err, size_t n) {
    const fgm_gguf_kv *kv = fgm_gguf_find(g, key);
    *out = dflt;
    if (!kv)
        return FG_OK;
    switch (kv->type) {
    case FGM_GGUF_UINT8: case FGM_GGUF_UINT16: case FGM_GGUF_UINT32: case FGM_GGUF_BOOL:
        *out = (int64_t)kv->v.u;
        return FG_OK;
    case FGM_GGUF_UINT64:
        if (kv->v.u > (uint64_t)INT64_MAX)
            break;
        *out = (int64_t)kv->v.u;
        return FG_OK;
    case FGM_GGUF_INT8: case FGM_GGUF_INT16: case FGM_GGUF_INT32: case FGM_GGUF_INT64:
        *out = kv->v.i;
        return FG_OK;
    default:
        break;
    }
    return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF key \"%s\" is a %s, not an integer", key,
                    fgm_gguf_vtype_name(kv->type));
}

fg_status fgm_gguf_get_float(const fgm_gguf *g, const char *key, double dflt, double *out, char *err, size_t n) {
    const fgm_gguf_kv *kv = fgm_gguf_find(g, key);
    *out = dflt;
    if (!kv)
        return FG_OK;
    if (kv->type == FGM_GGUF_FLOAT32 || kv->type == FGM_GGUF_FLOAT64) {
        *out = kv->v.f;
        return FG_OK;
    }
    int64_t i;
    if (fgm_gguf_get_int(g, key, 0, &i, err, n) == FG_OK) {
        *out = (double)i;
        return FG_OK;
    }
    return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF key \"%s\" is a %s, not a number", key, fgm_gguf_vtype_name(kv->type));
}

void fgm_gguf_get_str(const fgm_gguf *g, const char *key, char *buf, size_t n) {
    const fgm_gguf_kv *kv = fgm_gguf_find(g, key);
    buf[0] = '\0';
    if (kv && kv->type == FGM_GGUF_STRING && n)
        snprintf(buf, n, "%.*s", (int)(kv->v.str.n < n ? kv->v.str.n : n - 1), kv->v.str.s);
}

double fgm_gguf_array_num(const fgm_gguf_kv *kv, uint64_t i) {
    if (kv->type != FGM_GGUF_ARRAY || i >= kv->n_elems || kv->elem_type == FGM_GGUF_STRING)
        return 0.0;
    fgm_gguf_kv one = {0};
    decode_scalar(kv->elem_type, kv->elems + i * vtype_size(kv->elem_type), &one);
    switch (kv->elem_type) {
    case FGM_GGUF_FLOAT32: case FGM_GGUF_FLOAT64: return one.v.f;
    case FGM_GGUF_INT8: case FGM_GGUF_INT16: case FGM_GGUF_INT32: case FGM_GGUF_INT64: return (double)one.v.i;
    default: return (double)one.v.u;
    }
}

int fgm_gguf_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f)
        fclose(f);
    return yes;
}
