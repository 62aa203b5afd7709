/*
 * fastgen._fastgen: the C library (include/fastgen.h) and the model runner
 * (model/runner.h) as a CPython extension. The Python package (__init__.py)
 * adds the keyword-friendly layer; everything a decode loop calls per layer
 * is here, in C, so a call costs what parsing its arguments costs.
 *
 * Arrays cross without copies: any C-contiguous float32 object with the
 * buffer protocol (NumPy) or with __dlpack__ (torch tensors, CPU or, with
 * io="device", CUDA). Every shape is checked against the context's and a
 * mismatch names the argument and the shape it wanted. The GIL is released
 * during every library call; a context refuses to close while a call on it
 * runs in another thread. A failed call raises ValueError (invalid argument,
 * bad state, capacity), MemoryError (out of memory) or RuntimeError (the
 * rest) with fg_last_error()'s text; the exception's `status` attribute is
 * the fg_status name.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastgen.h"
#include "model/model.h"
#include "model/scorer.h"
#include "model/runner.h"
#include "model/tokenizer.h"

/* ------------------------------------------------------------------ errors */

static PyObject *status_name(fg_status st) {
    const char *s = fg_status_string(st);
    const char *colon = strchr(s, ':');
    return PyUnicode_FromStringAndSize(s, colon ? (Py_ssize_t)(colon - s) : (Py_ssize_t)strlen(s));
}

/* Raises the exception of a failed call: what (the C function), the library's message. */
static PyObject *raise_status(fg_status st, const char *what, const char *message) {
    PyObject *type = PyExc_RuntimeError;
    if (st == FG_ERR_INVALID_ARGUMENT || st == FG_ERR_BAD_STATE || st == FG_ERR_CAPACITY)
        type = PyExc_ValueError;
    else if (st == FG_ERR_OUT_OF_MEMORY)
        type = PyExc_MemoryError;
    const char *text = message && message[0] ? message : fg_status_string(st);
    PyObject *exc = PyObject_CallFunction(type, "s", text);
    if (!exc)
        return NULL;
    PyObject *name = status_name(st);
    if (name) {
        PyObject_SetAttrString(exc, "status", name);
        Py_DECREF(name);
    }
    (void)what;
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ------------------------------------------------------------------ arrays */

/* DLPack's ABI (dlpack.h v0.8, the "dltensor" capsule), declared here as the
 * protocol defines it. */
typedef struct {
    int32_t device_type; /* 1: CPU, 2: CUDA, 3: CUDA host, 10: ROCm */
    int32_t device_id;
} dl_device;
typedef struct {
    uint8_t code; /* 0: int, 1: uint, 2: float, 4: bfloat */
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;
typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: compact row-major */
    uint64_t byte_offset;
} dl_tensor;
typedef struct dl_managed {
    dl_tensor tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_ROCM = 10 };

/* An argument's memory while a call runs. */
typedef struct {
    Py_buffer view; /* the buffer protocol's, when view.obj is set */
    PyObject *capsule;
    dl_managed *dl;
    void *data;
    int ndim;
    Py_ssize_t shape[4];
} arg_array;

static void array_release(arg_array *a) {
    if (a->view.obj)
        PyBuffer_Release(&a->view);
    if (a->capsule) {
        if (a->dl && a->dl->deleter)
            a->dl->deleter(a->dl);
        PyCapsule_SetName(a->capsule, "used_dltensor");
        Py_DECREF(a->capsule);
    }
    memset(a, 0, sizeof *a);
}

static const char *dl_type_name(dl_dtype t) {
    if (t.lanes != 1)
        return "a vector type";
    switch (t.code) {
    case 0: return t.bits == 8 ? "int8" : t.bits == 16 ? "int16" : t.bits == 32 ? "int32" : "int64";
    case 1: return t.bits == 8 ? "uint8" : "an unsigned integer type";
    case 2: return t.bits == 16 ? "float16" : t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : "a float type";
    case 4: return "bfloat16";
    case 6: return "bool";
    }
    return "an unknown type";
}

static const char *buffer_type_name(const char *fmt) {
    if (!fmt)
        return "bytes";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@' || *fmt == '!' || *fmt == '>')
        fmt++;
    switch (*fmt) {
    case 'f': return "float32";
    case 'd': return "float64";
    case 'e': return "float16";
    case 'i': return "int32";
    case 'l': case 'q': return "int64";
    case 'b': return "int8";
    case 'B': return "uint8";
    case '?': return "bool";
    }
    return fmt;
}

/* want: 'f' (float32) or 'i' (int32). */
static int format_is(const char *fmt, char want) {
    if (!fmt)
        return 0;
    if (*fmt == '<' || *fmt == '=' || *fmt == '@')
        fmt++;
    if (want == 'i' && sizeof(long) == 4 && *fmt == 'l' && !fmt[1])
        return 1;
    return fmt[0] == want && !fmt[1];
}

/* Where a context's activations live: the host, or the device of its backend. */
typedef enum { ON_HOST = 0, ON_DEVICE = 1 } io_place;

/* Takes obj's memory as a C-contiguous array of float32 (type 'f') or int32
 * ('i') on place. The caller checks the shape. */
static int array_get(PyObject *obj, const char *name, char type, int writable, io_place place, void *stream,
                     arg_array *a) {
    memset(a, 0, sizeof *a);
    const char *tname = type == 'f' ? "float32" : type == 'e' ? "float16" : type == 'b' ? "bfloat16" : "int32";
    const Py_ssize_t itemsize = type == 'e' || type == 'b' ? 2 : 4;
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %s array, got None", name, tname);
        return -1;
    }
    if (PyObject_CheckBuffer(obj)) {
        if (place == ON_DEVICE) {
            PyErr_Format(PyExc_ValueError, "%s is in host memory, but the context's activations are on the device "
                         "(io=\"device\"): pass device tensors, or create the context with io=\"host\"", name);
            return -1;
        }
        int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, &a->view, flags) < 0) {
            if (writable && (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_ValueError))) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s must be writable (it receives the output)", name);
            }
            return -1;
        }
        if (type == 'b' || !format_is(a->view.format, type) || a->view.itemsize != itemsize) {
            if (type == 'b') /* NumPy has no bfloat16: a torch tensor's DLPack carries it */
                PyErr_Format(PyExc_TypeError, "%s must be bfloat16 (a torch.bfloat16 tensor), got %s", name,
                             buffer_type_name(a->view.format));
            else
                PyErr_Format(PyExc_TypeError, "%s must be %s, got %s (convert it with .astype(numpy.%s))", name, tname,
                             buffer_type_name(a->view.format), tname);
            array_release(a);
            return -1;
        }
        if (!PyBuffer_IsContiguous(&a->view, 'C')) {
            PyErr_Format(PyExc_ValueError, "%s must be C-contiguous (numpy.ascontiguousarray(%s) makes a copy that is)",
                         name, name);
            array_release(a);
            return -1;
        }
        if (a->view.ndim > 4) {
            PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most 3 are expected", name, a->view.ndim);
            array_release(a);
            return -1;
        }
        a->data = a->view.buf;
        a->ndim = a->view.ndim;
        for (int i = 0; i < a->ndim; i++)
            a->shape[i] = a->view.shape[i];
        return 0;
    }
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a %s array (NumPy, or a tensor with __dlpack__), got %s", name,
                     tname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    /* the device and, for CUDA, the stream the producer must order its work before */
    PyObject *capsule;
    if (place == ON_DEVICE) {
        PyObject *kw = Py_BuildValue("{s:n}", "stream", stream ? (Py_ssize_t)(intptr_t)stream : (Py_ssize_t)1);
        PyObject *noargs = PyTuple_New(0);
        capsule = kw && noargs ? PyObject_Call(method, noargs, kw) : NULL;
        Py_XDECREF(kw);
        Py_XDECREF(noargs);
    } else {
        capsule = PyObject_CallNoArgs(method);
    }
    Py_DECREF(method);
    if (!capsule)
        return -1;
    dl_managed *dl = PyCapsule_GetPointer(capsule, "dltensor");
    if (!dl) {
        Py_DECREF(capsule);
        return -1;
    }
    a->capsule = capsule;
    a->dl = dl;
    const dl_tensor *t = &dl->tensor;
    const int host = t->device.device_type == DL_CPU || t->device.device_type == DL_CUDA_HOST;
    if (place == ON_HOST && !host) {
        PyErr_Format(PyExc_ValueError, "%s is on a device (DLPack device type %d), but the context's activations "
                     "are in host memory (io=\"host\"): move it with .cpu(), or create the context with io=\"device\"",
                     name, (int)t->device.device_type);
        array_release(a);
        return -1;
    }
    if (place == ON_DEVICE && host) {
        PyErr_Format(PyExc_ValueError, "%s is in host memory, but the context's activations are on the device "
                     "(io=\"device\"): pass device tensors, or create the context with io=\"host\"", name);
        array_release(a);
        return -1;
    }
    const int want_code = type == 'f' || type == 'e' ? 2 : type == 'b' ? 4 : 0; /* kDLFloat, kDLBfloat, kDLInt */
    if (t->dtype.code != want_code || t->dtype.bits != 8 * itemsize || t->dtype.lanes != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be %s, got %s (convert it with .to(torch.%s))", name, tname,
                     dl_type_name(t->dtype), tname);
        array_release(a);
        return -1;
    }
    if (t->ndim > 4) {
        PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most 3 are expected", name, (int)t->ndim);
        array_release(a);
        return -1;
    }
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) { /* compact row-major (a dimension of 1 may have any stride) */
        if (t->strides && t->shape[i] > 1 && t->strides[i] != expect) {
            PyErr_Format(PyExc_ValueError, "%s must be C-contiguous (call .contiguous() on it first)", name);
            array_release(a);
            return -1;
        }
        expect *= t->shape[i];
    }
    a->data = (char *)t->data + t->byte_offset;
    a->ndim = t->ndim;
    for (int i = 0; i < a->ndim; i++)
        a->shape[i] = (Py_ssize_t)t->shape[i];
    (void)writable; /* DLPack before 1.0 carries no read-only flag */
    return 0;
}

/* The shape a call expects: (rows, heads, dim), also taken flattened as (rows, heads * dim). */
static int array_check_shape(const arg_array *a, const char *name, const char *rows_name, Py_ssize_t rows,
                             const char *heads_name, Py_ssize_t heads, Py_ssize_t dim) {
    int ok = 0;
    if (a->ndim == 3)
        ok = a->shape[0] == rows && a->shape[1] == heads && a->shape[2] == dim;
    else if (a->ndim == 2)
        ok = a->shape[0] == rows && a->shape[1] == heads * dim;
    if (ok)
        return 0;
    char got[96] = "(";
    size_t at = 1;
    for (int i = 0; i < a->ndim && at < sizeof got - 24; i++)
        at += (size_t)snprintf(got + at, sizeof got - at, "%s%zd", i ? ", " : "", a->shape[i]);
    snprintf(got + at, sizeof got - at, "%s)", a->ndim == 1 ? "," : "");
    PyErr_Format(PyExc_ValueError,
                 "%s: expected shape (%s, %s, head_dim) = (%zd, %zd, %zd), or (%zd, %zd) flattened, got %s", name,
                 rows_name, heads_name, rows, heads, dim, rows, heads * dim, got);
    return -1;
}

/* A 1-D int32 argument (tokens, sequence ids): an int32 array, or any sequence of ints (copied). */
typedef struct {
    arg_array arr;
    int32_t *owned;
    int32_t *data;
    Py_ssize_t n;
    int32_t small[16];
} arg_ints;

static void ints_release(arg_ints *v) {
    array_release(&v->arr);
    if (v->owned && v->owned != v->small)
        PyMem_Free(v->owned);
    v->owned = NULL;
}

static int ints_get(PyObject *obj, const char *name, arg_ints *v) {
    memset(v, 0, sizeof *v);
    if (PyObject_CheckBuffer(obj) && !PyBytes_Check(obj) && !PyByteArray_Check(obj)) {
        /* an int32 array is used in place; another integer array is copied below, element by element */
        arg_array *a = &v->arr;
        if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
            return -1;
        if (!format_is(a->view.format, 'i') || a->view.itemsize != 4 || !PyBuffer_IsContiguous(&a->view, 'C')) {
            array_release(a);
            goto copy;
        }
        a->data = a->view.buf;
        a->ndim = a->view.ndim;
        a->shape[0] = a->ndim ? a->view.shape[0] : 0;
        if (v->arr.ndim != 1) {
            PyErr_Format(PyExc_ValueError, "%s: expected a 1-D array of int32, got %d dimensions", name, v->arr.ndim);
            array_release(&v->arr);
            return -1;
        }
        v->data = v->arr.data;
        v->n = v->arr.shape[0];
        if (v->n > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: %zd ids; at most %d", name, v->n, (int)INT32_MAX);
            array_release(&v->arr);
            return -1;
        }
        return 0;
    }
    if (PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints (e.g. [%ld]), got an int", name,
                     PyLong_AsLong(obj));
        return -1;
    }
copy:;
    PyObject *seq = PySequence_Fast(obj, "");
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints or an int32 array, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > INT32_MAX) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: %zd ids; at most %d", name, n, (int)INT32_MAX);
        return -1;
    }
    v->owned = n <= 16 ? v->small : PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!v->owned) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        long x = PyLong_AsLong(items[i]);
        if ((x == -1 && PyErr_Occurred()) || x < INT32_MIN || x > INT32_MAX) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError) ||
                PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s[%zd]: expected an int that fits int32", name, i);
            }
            Py_DECREF(seq);
            ints_release(v);
            return -1;
        }
        v->owned[i] = (int32_t)x;
    }
    Py_DECREF(seq);
    v->data = v->owned;
    v->n = n;
    return 0;
}

/* New arrays (outputs when none is given, kept positions): fastgen/__init__.py's
 * allocator, new_array(like, shape, dtype), so they are NumPy arrays, or
 * torch tensors on the device of `like` when it is one. */
static PyObject *g_new_array;

static PyObject *new_array(PyObject *like, PyObject *shape, const char *dtype) {
    if (!g_new_array) {
        PyErr_SetString(PyExc_RuntimeError, "fastgen._fastgen: no allocator set (import fastgen, not _fastgen)");
        return NULL;
    }
    return PyObject_CallFunction(g_new_array, "OOs", like ? like : Py_None, shape, dtype);
}

static PyObject *set_allocator(PyObject *self, PyObject *fn) {
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the allocator must be callable");
        return NULL;
    }
    Py_XSETREF(g_new_array, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ argument parsing for the hot calls */

/* Positional arguments, then keywords among names[]; at least n_required given. */
static int parse_fast(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *fn,
                      const char *const *names, int n_names, int n_required, PyObject **out) {
    if (nargs > n_names) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fn, n_names, nargs);
        return -1;
    }
    for (int i = 0; i < n_names; i++)
        out[i] = i < nargs ? args[i] : NULL;
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, j));
        if (!key)
            return -1;
        int found = -1;
        for (int i = 0; i < n_names; i++)
            if (!strcmp(key, names[i]))
                found = i;
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fn, key);
            return -1;
        }
        if (out[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, key);
            return -1;
        }
        out[found] = args[nargs + j];
    }
    for (int i = 0; i < n_required; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}

static int get_i32(PyObject *obj, const char *name, int32_t *out) {
    long x = PyLong_AsLong(obj);
    if (x == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: expected an int, got %s", name, Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %ld does not fit int32", name, x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* ------------------------------------------------------------------ compression parameters <-> dict */

static const char *const k_score_modes[] = {"sum", "mean", "last", NULL};
static const char *const k_allocations[] = {"shortlist", "adakv", "adaptive", "layer", NULL};
static const char *const k_append_modes[] = {"keep", "reprofile", NULL};
static const char *const k_observe_modes[] = {"tail", "explicit", "predicted", "scores", NULL};
static const char *const k_rope_styles[] = {"adjacent", "halves", NULL};

/* A float field as the shortest decimal that reads back as the same float (0.3, not 0.30000001192092896). */
static double f32_value(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)x);
    for (int digits = 1; digits < 9; digits++) {
        char shorter[32];
        snprintf(shorter, sizeof shorter, "%.*g", digits, (double)x);
        if ((float)strtod(shorter, NULL) == x)
            return strtod(shorter, NULL);
    }
    return strtod(buf, NULL);
}

static int get_f32(PyObject *obj, const char *name, float *out) {
    double x = PyFloat_AsDouble(obj);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a number, got %s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = (float)x;
    return 0;
}

static int get_enum(PyObject *obj, const char *name, const char *const *names, int32_t *out) {
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    for (int32_t i = 0; s && names[i]; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    char list[128] = "";
    for (int i = 0; names[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
    }
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: expected one of %s, got %R", name, list, obj);
    return -1;
}

/* The fields of fg_policy and fg_compression_params that cross into
 * Python, described once: the dicts in both directions (the keys of
 * fastgen.Compression and fastgen.Policy) are made from these tables, in
 * this order; scripts/struct_fields.py checks them against fastgen.h. A
 * policy's components (a name such as "special+punct+local") and the
 * shortlist (a list of policy dicts) are the two fields with a shape of
 * their own. */
typedef enum { FIELD_F32, FIELD_I32, FIELD_U32, FIELD_ENUM } field_kind;
typedef struct field {
    const char *name;
    field_kind kind;
    size_t offset;
    const char *const *names; /* FIELD_ENUM: its values' names, in the enum's order */
} field;
#define FIELD(type, member, kind, names) {#member, kind, offsetof(type, member), names}
#define N_FIELDS(table) (sizeof table / sizeof table[0])
_Static_assert(sizeof(fg_score_mode) == sizeof(int32_t) && sizeof(fg_append_mode) == sizeof(int32_t) &&
                   sizeof(fg_allocation) == sizeof(int32_t) && sizeof(fg_observe_mode) == sizeof(int32_t),
               "FIELD_ENUM reads an enum as an int32_t");

static const field k_policy_fields[] = {
    FIELD(fg_policy, ratio_local, FIELD_F32, NULL),
    FIELD(fg_policy, ratio_frequent, FIELD_F32, NULL),
    FIELD(fg_policy, local_tokens, FIELD_I32, NULL),
    FIELD(fg_policy, frequent_tokens, FIELD_I32, NULL),
};

static const field k_compression_fields[] = {
    FIELD(fg_compression_params, threshold, FIELD_F32, NULL),
    FIELD(fg_compression_params, n_sink, FIELD_I32, NULL),
    FIELD(fg_compression_params, score_mode, FIELD_ENUM, k_score_modes),
    FIELD(fg_compression_params, observation_window, FIELD_I32, NULL),
    FIELD(fg_compression_params, budget, FIELD_F32, NULL),
    FIELD(fg_compression_params, budget_tokens, FIELD_I32, NULL),
    FIELD(fg_compression_params, append_mode, FIELD_ENUM, k_append_modes),
    FIELD(fg_compression_params, score_pool, FIELD_I32, NULL),
    FIELD(fg_compression_params, allocation, FIELD_ENUM, k_allocations),
    FIELD(fg_compression_params, alloc_floor, FIELD_F32, NULL),
    FIELD(fg_compression_params, adaptive_flags, FIELD_U32, NULL),
    FIELD(fg_compression_params, defer_until, FIELD_I32, NULL),
    FIELD(fg_compression_params, observe, FIELD_ENUM, k_observe_modes),
    FIELD(fg_compression_params, tolerance, FIELD_F32, NULL),
    FIELD(fg_compression_params, predict_horizon, FIELD_I32, NULL),
};

static PyObject *field_get(const void *s, const field *f) {
    const unsigned char *at = (const unsigned char *)s + f->offset;
    int32_t i;
    switch (f->kind) {
    case FIELD_F32: {
        float x;
        memcpy(&x, at, sizeof x);
        return PyFloat_FromDouble(f32_value(x));
    }
    case FIELD_U32: {
        uint32_t u;
        memcpy(&u, at, sizeof u);
        return PyLong_FromUnsignedLong(u);
    }
    case FIELD_I32:
        memcpy(&i, at, sizeof i);
        return PyLong_FromLong(i);
    case FIELD_ENUM:
        memcpy(&i, at, sizeof i);
        for (int32_t j = 0; j <= i; j++)
            if (!f->names[j]) /* a value past the names: as its number */
                return PyLong_FromLong(i);
        return i >= 0 ? PyUnicode_FromString(f->names[i]) : PyLong_FromLong(i);
    }
    return NULL;
}

static int field_set(void *s, const field *f, PyObject *value) {
    unsigned char *at = (unsigned char *)s + f->offset;
    float x;
    int32_t i;
    int rc;
    switch (f->kind) {
    case FIELD_F32:
        if ((rc = get_f32(value, f->name, &x)) == 0)
            memcpy(at, &x, sizeof x);
        return rc;
    case FIELD_I32:
    case FIELD_U32: /* taken as an int32: flags 0 to 2^31 - 1, every bit fastgen.h defines */
        if ((rc = get_i32(value, f->name, &i)) == 0)
            memcpy(at, &i, sizeof i);
        return rc;
    case FIELD_ENUM:
        if ((rc = get_enum(value, f->name, f->names, &i)) == 0)
            memcpy(at, &i, sizeof i);
        return rc;
    }
    return -1;
}

/* Each field of the table into d; -1 with the error set. */
static int fields_to_dict(PyObject *d, const void *s, const field *fs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        PyObject *v = field_get(s, &fs[i]);
        if (!v || PyDict_SetItemString(d, fs[i].name, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return 0;
}

static const field *field_find(const field *fs, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fs[i].name, name))
            return &fs[i];
    return NULL;
}

static PyObject *policy_to_dict(const fg_policy *p) {
    char name[96];
    fg_policy_name(p->components, name, sizeof name);
    PyObject *d = Py_BuildValue("{s:s}", "components", name);
    if (d && fields_to_dict(d, p, k_policy_fields, N_FIELDS(k_policy_fields)) < 0)
        Py_CLEAR(d);
    return d;
}

static PyObject *compression_to_dict(const fg_compression_params *cp) {
    PyObject *list = PyList_New(cp->n_policies);
    if (!list)
        return NULL;
    for (int32_t i = 0; i < cp->n_policies; i++) {
        PyObject *p = policy_to_dict(&cp->shortlist[i]);
        if (!p) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, p);
    }
    PyObject *d = Py_BuildValue("{s:N}", "shortlist", list);
    if (d && fields_to_dict(d, cp, k_compression_fields, N_FIELDS(k_compression_fields)) < 0)
        Py_CLEAR(d);
    return d;
}

static int dict_to_policy(PyObject *d, int i, fg_policy *p) {
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "shortlist[%d]: expected a dict", i);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key);
        if (!k)
            return -1;
        const field *f = field_find(k_policy_fields, N_FIELDS(k_policy_fields), k);
        if (f) {
            if (field_set(p, f, value) < 0)
                return -1;
        } else if (!strcmp(k, "components")) {
            if (PyLong_Check(value)) {
                p->components = (uint32_t)PyLong_AsUnsignedLong(value);
                if (PyErr_Occurred())
                    return -1;
            } else {
                const char *s = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
                if (!s || fg_policy_parse(s, &p->components) != FG_OK) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_ValueError, "shortlist[%d].components: %R is not a policy (names joined by "
                                 "+: special, punct, frequent, local, full, snapshot)", i, value);
                    return -1;
                }
            }
        } else {
            PyErr_Format(PyExc_ValueError, "shortlist[%d]: unknown field '%s' (components, ratio_local, "
                         "ratio_frequent, local_tokens, frequent_tokens)", i, k);
            return -1;
        }
    }
    return 0;
}

/* A dict of fg_compression_params fields (compression_to_dict's keys) onto the defaults. */
static int dict_to_compression(PyObject *d, fg_compression_params *cp) {
    fg_compression_params_default(cp);
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "compression: expected a fastgen.Compression or a dict, got %s",
                     Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key);
        if (!k)
            return -1;
        const field *f = field_find(k_compression_fields, N_FIELDS(k_compression_fields), k);
        if (f) {
            if (field_set(cp, f, value) < 0)
                return -1;
            continue;
        }
        if (strcmp(k, "shortlist") != 0) {
            PyErr_Format(PyExc_ValueError, "compression: unknown field '%s'", k);
            return -1;
        }
        PyObject *seq = PySequence_Fast(value, "shortlist: expected a list of policies");
        if (!seq)
            return -1;
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n < 1 || n > FG_MAX_SHORTLIST) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "shortlist: 1 to %d policies, got %zd", FG_MAX_SHORTLIST, n);
            return -1;
        }
        memset(cp->shortlist, 0, sizeof cp->shortlist);
        int rc = 0;
        for (Py_ssize_t i = 0; i < n && rc == 0; i++)
            rc = dict_to_policy(PySequence_Fast_GET_ITEM(seq, i), (int)i, &cp->shortlist[i]);
        cp->n_policies = (int32_t)n;
        Py_DECREF(seq);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static PyObject *mod_preset(PyObject *self, PyObject *name) {
    (void)self;
    const char *s = PyUnicode_AsUTF8(name);
    if (!s)
        return NULL;
    fg_compression_params cp;
    fg_status st = fg_compression_params_preset(s, &cp);
    if (st)
        return raise_status(st, "fg_compression_params_preset", fg_last_error(NULL));
    return compression_to_dict(&cp);
}

static PyObject *mod_validate(PyObject *self, PyObject *d) {
    (void)self;
    fg_compression_params cp;
    if (dict_to_compression(d, &cp) < 0)
        return NULL;
    fg_status st = fg_compression_params_validate(&cp);
    if (st)
        return raise_status(st, "fg_compression_params_validate", fg_last_error(NULL));
    Py_RETURN_NONE;
}

static PyObject *mod_preset_names(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int32_t i = 0; list; i++) {
        const char *n = fg_compression_preset_name(i);
        if (!n)
            break;
        PyObject *s = PyUnicode_FromString(n);
        if (!s || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(s);
    }
    return list;
}

static PyObject *mod_policy_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *d;
    int t;
    if (!PyArg_ParseTuple(args, "O!i:policy_rows", &PyDict_Type, &d, &t))
        return NULL;
    fg_policy p = {0};
    if (dict_to_policy(d, 0, &p) < 0)
        return NULL;
    int32_t w = 0, k = 0;
    fg_status st = fg_policy_rows(&p, t, &w, &k);
    if (st)
        return raise_status(st, "fg_policy_rows", fg_last_error(NULL));
    return Py_BuildValue("(ii)", (int)w, (int)k);
}

static PyObject *mod_version(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(fg_version());
}

static PyObject *mod_build_backends(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(fg_build_backends());
}

static PyObject *mod_backend_probe(PyObject *self, PyObject *name) {
    (void)self;
    const char *s = PyUnicode_AsUTF8(name);
    if (!s)
        return NULL;
    fg_status st = fg_backend_probe(s);
    if (st == FG_OK)
        Py_RETURN_NONE;
    const char *why = fg_last_error(NULL);
    return PyUnicode_FromString(why && why[0] ? why : fg_status_string(st));
}

static PyObject *mod_default_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(fg_default_threads());
}

static PyObject *mod_kv_row_bytes(PyObject *self, PyObject *args) {
    (void)self;
    const char *dtype;
    int d;
    if (!PyArg_ParseTuple(args, "si:kv_row_bytes", &dtype, &d))
        return NULL;
    fg_dtype t;
    if (fg_dtype_parse(dtype, &t) != FG_OK)
        return raise_status(FG_ERR_INVALID_ARGUMENT, "fg_dtype_parse", fg_last_error(NULL));
    return PyLong_FromSize_t(fg_kv_row_bytes(t, d));
}

/* ------------------------------------------------------------------ TokenClasses */

typedef struct {
    PyObject_HEAD
    fg_token_classes *classes;
} ClassesObject;

static const char *const k_class_names[] = {"ordinary", "special", "punct", NULL};
static const char *const k_encodings[] = {"text", "sentencepiece", "gpt2", NULL};

static void classes_dealloc(ClassesObject *self) {
    fg_token_classes_destroy(&self->classes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int classes_init(ClassesObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"vocab_size", "pieces", "encoding", NULL};
    int vocab = 0;
    PyObject *pieces = Py_None, *encoding = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|O$O:TokenClasses", kwlist, &vocab, &pieces, &encoding))
        return -1;
    int32_t enc = FG_PIECES_TEXT;
    if (encoding && get_enum(encoding, "encoding", k_encodings, &enc) < 0)
        return -1;
    if (vocab < 1) {
        PyErr_Format(PyExc_ValueError, "vocab_size: expected at least 1, got %d", vocab);
        return -1;
    }
    const char **ptrs = NULL;
    PyObject *seq = NULL;
    if (pieces != Py_None) {
        seq = PySequence_Fast(pieces, "pieces: expected a sequence of str (one per token id) or None");
        if (!seq)
            return -1;
        if (PySequence_Fast_GET_SIZE(seq) != vocab) {
            PyErr_Format(PyExc_ValueError, "pieces: expected vocab_size = %d strings, got %zd", vocab,
                         PySequence_Fast_GET_SIZE(seq));
            Py_DECREF(seq);
            return -1;
        }
        ptrs = PyMem_Calloc((size_t)vocab, sizeof *ptrs);
        if (!ptrs) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (int i = 0; i < vocab; i++) {
            PyObject *p = PySequence_Fast_GET_ITEM(seq, i);
            if (p == Py_None)
                continue;
            ptrs[i] = PyUnicode_Check(p) ? PyUnicode_AsUTF8(p) : PyBytes_Check(p) ? PyBytes_AsString(p) : NULL;
            if (!ptrs[i]) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "pieces[%d]: expected str, bytes or None, got %s", i,
                             Py_TYPE(p)->tp_name);
                PyMem_Free(ptrs);
                Py_DECREF(seq);
                return -1;
            }
        }
    }
    fg_token_classes *c = NULL;
    fg_status st = fg_token_classes_create_from(vocab, ptrs, (fg_piece_encoding)enc, &c);
    PyMem_Free(ptrs);
    Py_XDECREF(seq);
    if (st) {
        raise_status(st, "fg_token_classes_create_from", fg_last_error(NULL));
        return -1;
    }
    fg_token_classes_destroy(&self->classes);
    self->classes = c;
    return 0;
}

static int classes_ready(ClassesObject *self) {
    if (!self->classes) {
        PyErr_SetString(PyExc_ValueError, "TokenClasses: not initialised");
        return 0;
    }
    return 1;
}

static PyObject *classes_set(ClassesObject *self, PyObject *args) {
    int id;
    PyObject *cls;
    if (!classes_ready(self) || !PyArg_ParseTuple(args, "iO:set", &id, &cls))
        return NULL;
    int32_t c;
    if (get_enum(cls, "cls", k_class_names, &c) < 0)
        return NULL;
    fg_status st = fg_token_classes_set(self->classes, id, (fg_token_class)c);
    if (st)
        return raise_status(st, "fg_token_classes_set", fg_last_error(NULL));
    Py_RETURN_NONE;
}

static PyObject *classes_get(ClassesObject *self, PyObject *arg) {
    int32_t id;
    if (!classes_ready(self) || get_i32(arg, "id", &id) < 0)
        return NULL;
    fg_token_class c;
    fg_status st = fg_token_classes_get(self->classes, id, &c);
    if (st)
        return raise_status(st, "fg_token_classes_get", fg_last_error(NULL));
    return PyUnicode_FromString(k_class_names[c]);
}

static PyObject *classes_count(ClassesObject *self, PyObject *arg) {
    int32_t c;
    if (!classes_ready(self) || get_enum(arg, "cls", k_class_names, &c) < 0)
        return NULL;
    return PyLong_FromLong(fg_token_classes_count(self->classes, (fg_token_class)c));
}

static PyObject *classes_add_sequence(ClassesObject *self, PyObject *arg) {
    arg_ints ids;
    if (!classes_ready(self) || ints_get(arg, "ids", &ids) < 0)
        return NULL;
    fg_status st = fg_token_classes_add_sequence(self->classes, ids.data, (int32_t)ids.n);
    ints_release(&ids);
    if (st)
        return raise_status(st, "fg_token_classes_add_sequence", fg_last_error(NULL));
    Py_RETURN_NONE;
}

static PyObject *classes_classify(ClassesObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "n_sink", NULL};
    PyObject *tokens;
    int n_sink = 0;
    if (!classes_ready(self) || !PyArg_ParseTupleAndKeywords(args, kw, "O|i:classify", kwlist, &tokens, &n_sink))
        return NULL;
    arg_ints ids;
    if (ints_get(tokens, "tokens", &ids) < 0)
        return NULL;
    PyObject *out = PyList_New(ids.n);
    uint8_t *cls = PyMem_Malloc((size_t)(ids.n ? ids.n : 1));
    fg_status st = FG_OK;
    if (out && cls && (st = fg_token_classes_classify(self->classes, ids.data, (int32_t)ids.n, n_sink, cls)) == FG_OK)
        for (Py_ssize_t i = 0; i < ids.n; i++)
            PyList_SET_ITEM(out, i, PyUnicode_FromString(k_class_names[cls[i]]));
    PyMem_Free(cls);
    ints_release(&ids);
    if (st) {
        Py_XDECREF(out);
        return raise_status(st, "fg_token_classes_classify", fg_last_error(NULL));
    }
    if (!cls) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    return out;
}

static PyObject *classes_vocab_size(ClassesObject *self, void *unused) {
    (void)unused;
    return classes_ready(self) ? PyLong_FromLong(fg_token_classes_vocab_size(self->classes)) : NULL;
}

static PyMethodDef classes_methods[] = {
    {"set", (PyCFunction)classes_set, METH_VARARGS,
     "set(id, cls)\n--\n\nOverride the class of one id: \"ordinary\", \"special\" or \"punct\" (e.g. declare BOS and "
     "EOS special)."},
    {"get", (PyCFunction)classes_get, METH_O, "get(id)\n--\n\nThe class of one id."},
    {"count", (PyCFunction)classes_count, METH_O,
     "count(cls)\n--\n\nHow many ids are of a class (e.g. how many pieces were found to be punctuation)."},
    {"add_sequence", (PyCFunction)classes_add_sequence, METH_O,
     "add_sequence(ids)\n--\n\nDeclare a multi-token special marker such as \"[INST]\" = ids."},
    {"classify", (PyCFunction)(void (*)(void))classes_classify, METH_VARARGS | METH_KEYWORDS,
     "classify(tokens, n_sink=0)\n--\n\nThe class of every token of a stream (positions < n_sink are special)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef classes_getset[] = {
    {"vocab_size", (getter)classes_vocab_size, NULL, "Ids the classes cover.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ClassesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fastgen.TokenClasses",
    .tp_basicsize = sizeof(ClassesObject),
    .tp_dealloc = (destructor)classes_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "TokenClasses(vocab_size, pieces=None, *, encoding=\"text\")\n--\n\n"
              "Which token ids are special, punctuation or ordinary (docs/design.md 2.1): FastGen's special and "
              "punct policies keep the rows of those classes.\n\n"
              "pieces: one string per id (None for an id with no text), read as `encoding`: \"text\" (the text "
              "each token stands for), \"sentencepiece\" (U+2581 for a space, <0xNN> byte pieces: GGUF's "
              "tokenizer model \"llama\") or \"gpt2\" (byte-level BPE, \"\\u0120\" for a space). A piece made only "
              "of ASCII punctuation and whitespace is punct. Without pieces every id is ordinary until set().",
    .tp_methods = classes_methods,
    .tp_getset = classes_getset,
    .tp_init = (initproc)classes_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ Context */

typedef struct {
    PyObject_HEAD
    fg_context *ctx;
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    io_place io;
    void *stream;
    int busy;            /* calls on it running with the GIL released */
    int32_t max_seqs;
    int32_t *prompt_len; /* [max_seqs] each live sequence's prompt (prefill's rows), 0 for none */
    char act;            /* q, k, v and out: 'f' float32, 'e' float16, 'b' bfloat16 (act_dtype) */
} ContextObject;

static const char *const k_io_names[] = {"host", "device", NULL};

static int context_ready(ContextObject *self) {
    if (!self->ctx) {
        PyErr_SetString(PyExc_ValueError, "the context is closed");
        return 0;
    }
    return 1;
}

/* The message: this thread's last failure (fg_last_error(NULL)), which is this call's even when another
 * thread's call on the same context has written the context's own since. */
static PyObject *context_fail(ContextObject *self, fg_status st, const char *what) {
    if (!self->ctx) { /* close() ran while the call read its arguments (an __index__ or a buffer of Python code) */
        PyErr_Format(PyExc_ValueError, "%s: the context is closed", what);
        return NULL;
    }
    return raise_status(st, what, fg_last_error(NULL));
}

/* The library call runs with the GIL released; close() waits for none and refuses while busy. */
#define CONTEXT_CALL(self, st, call)                                                                                   \
    do {                                                                                                               \
        (self)->busy++;                                                                                                \
        Py_BEGIN_ALLOW_THREADS(st) = (call);                                                                           \
        Py_END_ALLOW_THREADS(self)->busy--;                                                                            \
    } while (0)

static void context_dealloc(ContextObject *self) {
    fg_context_destroy(&self->ctx);
    PyMem_Free(self->prompt_len);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int context_init(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"n_layers", "n_q_heads", "n_kv_heads", "head_dim", "classes", "backend", "kv_dtype",
                             "v_dtype", "max_seqs", "max_seq_len", "page_tokens", "pool_chunk_pages",
                             "max_pool_bytes", "threads", "io", "stream", "act_dtype", "rope_theta", "rope_dims",
                             "rope_style", "rope_freq_factors", NULL};
    fg_context_params p;
    fg_context_params_default(&p);
    int n_layers, hq, hkv, d;
    PyObject *classes, *backend = Py_None, *kv_dtype = NULL, *v_dtype = Py_None, *io = NULL, *stream = Py_None;
    PyObject *act_dtype = NULL, *rope_style = NULL, *rope_factors = Py_None;
    double rope_theta = 0.0;
    int rope_dims = 0;
    int max_seqs = p.max_seqs, max_seq_len = p.max_seq_len, page_tokens = p.page_tokens,
        pool_chunk = p.pool_chunk_pages, threads = p.n_threads;
    PyObject *max_pool_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiiO!|$OOOiiiiOiOOOdiOO:Context", kwlist, &n_layers, &hq, &hkv, &d,
                                     &ClassesType, &classes, &backend, &kv_dtype, &v_dtype, &max_seqs, &max_seq_len,
                                     &page_tokens, &pool_chunk, &max_pool_o, &threads, &io, &stream, &act_dtype,
                                     &rope_theta, &rope_dims, &rope_style, &rope_factors))
        return -1;
    unsigned long long max_pool = 0; /* checked, not wrapped as "K" would: -1 is no cap of 2^64 - 1 bytes */
    if (max_pool_o) {
        PyObject *ix = PyNumber_Index(max_pool_o);
        if (!ix)
            return -1;
        max_pool = PyLong_AsUnsignedLongLong(ix);
        Py_DECREF(ix);
        if (PyErr_Occurred() || max_pool > (unsigned long long)SIZE_MAX) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "max_pool_bytes: expected bytes in [0, %zu] (0: no cap), got %R",
                         (size_t)SIZE_MAX, max_pool_o);
            return -1;
        }
    }
    if (self->ctx || self->prompt_len) {
        PyErr_SetString(PyExc_ValueError, "Context: already initialised (make a new one)");
        return -1;
    }
    p.n_layers = n_layers;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.head_dim = d;
    p.max_seqs = max_seqs;
    p.max_seq_len = max_seq_len;
    p.page_tokens = page_tokens;
    p.pool_chunk_pages = pool_chunk;
    p.max_pool_bytes = (size_t)max_pool;
    p.n_threads = threads;
    p.classes = ((ClassesObject *)classes)->classes;
    if (!p.classes) {
        PyErr_SetString(PyExc_ValueError, "classes: not initialised");
        return -1;
    }
    if (backend != Py_None && !(p.backend = PyUnicode_AsUTF8(backend)))
        return -1;
    fg_dtype t;
    if (kv_dtype) {
        const char *s = PyUnicode_AsUTF8(kv_dtype);
        if (!s)
            return -1;
        if (fg_dtype_parse(s, &t) != FG_OK) {
            PyErr_Format(PyExc_ValueError, "kv_dtype: expected f32, f16, bf16, q8_0 or q4_0, got '%s'", s);
            return -1;
        }
        p.kv_dtype = t;
    }
    if (v_dtype != Py_None) {
        const char *s = PyUnicode_AsUTF8(v_dtype);
        if (!s)
            return -1;
        if (fg_dtype_parse(s, &t) != FG_OK) {
            PyErr_Format(PyExc_ValueError, "v_dtype: expected f32, f16, bf16, q8_0, q4_0 or None, got '%s'", s);
            return -1;
        }
        p.v_dtype = (int32_t)t;
    }
    if (act_dtype && act_dtype != Py_None) {
        const char *s = PyUnicode_AsUTF8(act_dtype);
        if (!s)
            return -1;
        if (fg_dtype_parse(s, &t) != FG_OK || (t != FG_DTYPE_F32 && t != FG_DTYPE_F16 && t != FG_DTYPE_BF16)) {
            PyErr_Format(PyExc_ValueError, "act_dtype: expected f32, f16 or bf16, got '%s'", s);
            return -1;
        }
        p.act_dtype = (int32_t)t;
    }
    int32_t io_v = 0, style = 0;
    if (io && get_enum(io, "io", k_io_names, &io_v) < 0)
        return -1;
    if (rope_style && rope_style != Py_None && get_enum(rope_style, "rope_style", k_rope_styles, &style) < 0)
        return -1;
    p.rope_theta = (float)rope_theta;
    p.rope_dims = rope_dims;
    p.rope_style = style;
    float factors[512]; /* head_dim <= 1024 (fg_context_create refuses more) */
    if (rope_factors != Py_None) {
        PyObject *seq = PySequence_Fast(rope_factors, "rope_freq_factors: expected a sequence of floats or None");
        if (!seq)
            return -1;
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        const int32_t want = (rope_dims ? rope_dims : d) / 2;
        if (n != want || n > 512) {
            PyErr_Format(PyExc_ValueError, "rope_freq_factors: expected %d values (rope_dims / 2), got %zd", (int)want,
                         n);
            Py_DECREF(seq);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (get_f32(PySequence_Fast_GET_ITEM(seq, i), "rope_freq_factors", &factors[i]) < 0) {
                Py_DECREF(seq);
                return -1;
            }
        Py_DECREF(seq);
        p.rope_freq_factors = factors;
    }
    p.io = io_v ? FG_IO_DEVICE : FG_IO_HOST;
    if (stream != Py_None) {
        p.stream = PyLong_AsVoidPtr(stream);
        if (PyErr_Occurred())
            return -1;
    }
    fg_context *ctx = NULL;
    fg_status st;
    Py_BEGIN_ALLOW_THREADS st = fg_context_create(&p, &ctx);
    Py_END_ALLOW_THREADS if (st) {
        raise_status(st, "fg_context_create", fg_last_error(NULL));
        return -1;
    }
    self->prompt_len = PyMem_Calloc((size_t)max_seqs, sizeof *self->prompt_len);
    if (!self->prompt_len) {
        fg_context_destroy(&ctx);
        PyErr_NoMemory();
        return -1;
    }
    self->max_seqs = max_seqs;
    self->ctx = ctx;
    self->n_layers = n_layers;
    self->n_q_heads = hq;
    self->n_kv_heads = hkv;
    self->head_dim = d;
    self->io = io_v ? ON_DEVICE : ON_HOST;
    self->stream = p.stream;
    self->act = p.act_dtype == FG_DTYPE_F16 ? 'e' : p.act_dtype == FG_DTYPE_BF16 ? 'b' : 'f';
    return 0;
}

static PyObject *context_close(ContextObject *self, PyObject *unused) {
    (void)unused;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "close(): a call on this context is running in another thread");
        return NULL;
    }
    fg_context *ctx = self->ctx;
    self->ctx = NULL;
    Py_BEGIN_ALLOW_THREADS fg_context_destroy(&ctx);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *context_set_compression(ContextObject *self, PyObject *arg) {
    fg_compression_params cp;
    if (!context_ready(self) || dict_to_compression(arg, &cp) < 0)
        return NULL;
    fg_status st = fg_context_set_compression(self->ctx, &cp);
    if (st)
        return context_fail(self, st, "fg_context_set_compression");
    Py_RETURN_NONE;
}

static PyObject *context_create(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"prompt", "compression", NULL};
    PyObject *prompt, *comp = Py_None;
    if (!context_ready(self) || !PyArg_ParseTupleAndKeywords(args, kw, "O|O:create", kwlist, &prompt, &comp))
        return NULL;
    fg_compression_params cp;
    if (comp != Py_None && dict_to_compression(comp, &cp) < 0)
        return NULL;
    arg_ints ids;
    if (ints_get(prompt, "prompt", &ids) < 0)
        return NULL;
    int32_t seq = -1;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_create(self->ctx, comp == Py_None ? NULL : &cp, ids.data, (int32_t)ids.n, &seq));
    ints_release(&ids);
    if (st)
        return context_fail(self, st, "fg_seq_create");
    self->prompt_len[seq] = (int32_t)ids.n;
    return PyLong_FromLong(seq);
}

static PyObject *context_destroy_seq(ContextObject *self, PyObject *arg) {
    int32_t seq;
    if (!context_ready(self) || get_i32(arg, "seq", &seq) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_destroy(self->ctx, seq));
    if (st)
        return context_fail(self, st, "fg_seq_destroy");
    self->prompt_len[seq] = 0;
    Py_RETURN_NONE;
}

static PyObject *context_fork(ContextObject *self, PyObject *arg) {
    int32_t seq, child = -1;
    if (!context_ready(self) || get_i32(arg, "seq", &seq) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_fork(self->ctx, seq, &child));
    if (st)
        return context_fail(self, st, "fg_seq_fork");
    self->prompt_len[child] = self->prompt_len[seq];
    return PyLong_FromLong(child);
}

static PyObject *context_length(ContextObject *self, PyObject *args) {
    int seq, layer;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "ii:length", &seq, &layer))
        return NULL;
    int32_t n = 0;
    fg_status st = fg_seq_length(self->ctx, seq, layer, &n);
    if (st)
        return context_fail(self, st, "fg_seq_length");
    return PyLong_FromLong(n);
}

/* q, k, v and out of a call of `rows` rows; out is created like q when absent. */
typedef struct {
    arg_array q, k, v, out;
    PyObject *out_obj; /* the reference returned */
} qkv_args;

static void qkv_release(qkv_args *a) {
    array_release(&a->q);
    array_release(&a->k);
    array_release(&a->v);
    array_release(&a->out);
    Py_XDECREF(a->out_obj);
    a->out_obj = NULL;
}

static int qkv_get(ContextObject *self, PyObject *q, PyObject *k, PyObject *v, PyObject *out, Py_ssize_t rows,
                   const char *rows_name, qkv_args *a) {
    memset(a, 0, sizeof *a);
    const Py_ssize_t hq = self->n_q_heads, hkv = self->n_kv_heads, d = self->head_dim;
    const char act = self->act;
    if (array_get(q, "q", act, 0, self->io, self->stream, &a->q) < 0 ||
        array_check_shape(&a->q, "q", rows_name, rows, "n_q_heads", hq, d) < 0 ||
        array_get(k, "k", act, 0, self->io, self->stream, &a->k) < 0 ||
        array_check_shape(&a->k, "k", rows_name, rows, "n_kv_heads", hkv, d) < 0 ||
        array_get(v, "v", act, 0, self->io, self->stream, &a->v) < 0 ||
        array_check_shape(&a->v, "v", rows_name, rows, "n_kv_heads", hkv, d) < 0)
        goto fail;
    if (!out || out == Py_None) {
        PyObject *shape = Py_BuildValue("(nnn)", rows, hq, d);
        out = shape ? new_array(q, shape, act == 'e' ? "float16" : act == 'b' ? "bfloat16" : "float32") : NULL;
        Py_XDECREF(shape);
        if (!out)
            goto fail;
        a->out_obj = out;
    } else {
        a->out_obj = Py_NewRef(out);
    }
    if (array_get(out, "out", act, 1, self->io, self->stream, &a->out) < 0 ||
        array_check_shape(&a->out, "out", rows_name, rows, "n_q_heads", hq, d) < 0)
        goto fail;
    return 0;
fail:
    qkv_release(a);
    return -1;
}

/* With io="device" on the context's own stream (stream=None) the producer's stream is not ordered after our
 * kernels: wait for them before the tensors' memory can go back to its allocator. */
static fg_status device_settle(ContextObject *self, fg_status st) {
    if (st == FG_OK && self->io == ON_DEVICE && !self->stream)
        CONTEXT_CALL(self, st, fg_synchronize(self->ctx));
    return st;
}

/* The return value: out, the reference the call held. */
static PyObject *qkv_result(qkv_args *a) {
    PyObject *r = a->out_obj;
    a->out_obj = NULL;
    qkv_release(a);
    return r;
}

static PyObject *context_prefill(ContextObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"seq", "layer", "q", "k", "v", "out"};
    PyObject *a[6];
    int32_t seq, layer;
    if (!context_ready(self) || parse_fast(args, nargs, kwnames, "prefill", names, 6, 5, a) < 0 ||
        get_i32(a[0], "seq", &seq) < 0 || get_i32(a[1], "layer", &layer) < 0)
        return NULL;
    /* the rows: the prompt fg_seq_create was given */
    if (seq < 0 || seq >= self->max_seqs || self->prompt_len[seq] == 0) {
        PyErr_Format(PyExc_ValueError, "prefill: seq %d is not a sequence of this context (create() makes one)",
                     (int)seq);
        return NULL;
    }
    qkv_args x;
    if (qkv_get(self, a[2], a[3], a[4], a[5], self->prompt_len[seq], "n_prompt", &x) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_prefill(self->ctx, seq, layer, x.q.data, x.k.data, x.v.data, x.out.data));
    st = device_settle(self, st);
    if (st) {
        qkv_release(&x);
        return context_fail(self, st, "fg_prefill");
    }
    return qkv_result(&x);
}

/* The rows of q (its first dimension; 0 when it has none, which its shape check then refuses), or -1 with
 * an exception when they pass int32. */
static Py_ssize_t rows_of(PyObject *q) {
    Py_ssize_t n = PyObject_Length(q);
    if (n < 0) {
        PyErr_Clear();
        n = 0;
    }
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "q: %zd rows; at most %d", n, (int)INT32_MAX);
        return -1;
    }
    return n;
}

static PyObject *context_prefill_chunk(ContextObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
    static const char *const names[] = {"seq", "layer", "begin", "q", "k", "v", "out"};
    PyObject *a[7];
    int32_t seq, layer, begin;
    if (!context_ready(self) || parse_fast(args, nargs, kwnames, "prefill_chunk", names, 7, 6, a) < 0 ||
        get_i32(a[0], "seq", &seq) < 0 || get_i32(a[1], "layer", &layer) < 0 || get_i32(a[2], "begin", &begin) < 0)
        return NULL;
    const Py_ssize_t n = rows_of(a[3]);
    if (n < 0)
        return NULL;
    qkv_args x;
    if (qkv_get(self, a[3], a[4], a[5], a[6], n, "n", &x) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st,
                 fg_prefill_chunk(self->ctx, seq, layer, begin, (int32_t)n, x.q.data, x.k.data, x.v.data, x.out.data));
    st = device_settle(self, st);
    if (st) {
        qkv_release(&x);
        return context_fail(self, st, "fg_prefill_chunk");
    }
    return qkv_result(&x);
}

static PyObject *context_decode(ContextObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"layer", "seqs", "tokens", "q", "k", "v", "out"};
    PyObject *a[7];
    int32_t layer;
    if (!context_ready(self) || parse_fast(args, nargs, kwnames, "decode", names, 7, 6, a) < 0 ||
        get_i32(a[0], "layer", &layer) < 0)
        return NULL;
    arg_ints seqs, tokens;
    if (ints_get(a[1], "seqs", &seqs) < 0)
        return NULL;
    if (ints_get(a[2], "tokens", &tokens) < 0) {
        ints_release(&seqs);
        return NULL;
    }
    PyObject *r = NULL;
    qkv_args x;
    if (tokens.n != seqs.n)
        PyErr_Format(PyExc_ValueError, "tokens: expected one per sequence (%zd), got %zd", seqs.n, tokens.n);
    else if (qkv_get(self, a[3], a[4], a[5], a[6], seqs.n, "n_seqs", &x) == 0) {
        fg_status st;
        CONTEXT_CALL(self, st, fg_decode(self->ctx, layer, (int32_t)seqs.n, seqs.data, tokens.data, x.q.data,
                                         x.k.data, x.v.data, x.out.data));
        st = device_settle(self, st);
        if (st) {
            qkv_release(&x);
            context_fail(self, st, "fg_decode");
        } else {
            r = qkv_result(&x);
        }
    }
    ints_release(&seqs);
    ints_release(&tokens);
    return r;
}

static PyObject *context_append(ContextObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"seq", "layer", "tokens", "q", "k", "v", "out"};
    PyObject *a[7];
    int32_t seq, layer;
    if (!context_ready(self) || parse_fast(args, nargs, kwnames, "append", names, 7, 6, a) < 0 ||
        get_i32(a[0], "seq", &seq) < 0 || get_i32(a[1], "layer", &layer) < 0)
        return NULL;
    arg_ints tokens;
    if (ints_get(a[2], "tokens", &tokens) < 0)
        return NULL;
    PyObject *r = NULL;
    qkv_args x;
    if (qkv_get(self, a[3], a[4], a[5], a[6], tokens.n, "n_tokens", &x) == 0) {
        fg_status st;
        CONTEXT_CALL(self, st, fg_seq_append(self->ctx, seq, layer, tokens.data, (int32_t)tokens.n, x.q.data,
                                             x.k.data, x.v.data, x.out.data));
        st = device_settle(self, st);
        if (st) {
            qkv_release(&x);
            context_fail(self, st, "fg_seq_append");
        } else {
            r = qkv_result(&x);
        }
    }
    ints_release(&tokens);
    return r;
}

static PyObject *context_observe(ContextObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"seq", "layer", "q", "k", "v", "out"};
    PyObject *a[6];
    int32_t seq, layer;
    if (!context_ready(self) || parse_fast(args, nargs, kwnames, "observe", names, 6, 5, a) < 0 ||
        get_i32(a[0], "seq", &seq) < 0 || get_i32(a[1], "layer", &layer) < 0)
        return NULL;
    const Py_ssize_t n = rows_of(a[2]);
    if (n < 0)
        return NULL;
    qkv_args x;
    if (qkv_get(self, a[2], a[3], a[4], a[5], n, "n", &x) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_observe(self->ctx, seq, layer, x.q.data, x.k.data, x.v.data, (int32_t)n, x.out.data));
    st = device_settle(self, st);
    if (st) {
        qkv_release(&x);
        return context_fail(self, st, "fg_seq_observe");
    }
    return qkv_result(&x);
}

static PyObject *context_compress(ContextObject *self, PyObject *arg) {
    int32_t seq;
    if (!context_ready(self) || get_i32(arg, "seq", &seq) < 0)
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_compress(self->ctx, seq));
    if (st)
        return context_fail(self, st, "fg_seq_compress");
    Py_RETURN_NONE;
}

static PyObject *context_observe_scores(ContextObject *self, PyObject *args) {
    int seq, layer;
    PyObject *obj;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "iiO:observe_scores", &seq, &layer, &obj))
        return NULL;
    arg_array a;
    if (array_get(obj, "scores", 'f', 0, ON_HOST, NULL, &a) < 0)
        return NULL;
    if (a.ndim != 2 || a.shape[0] != self->n_kv_heads || a.shape[1] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "scores: expected shape (n_kv_heads, n) = (%d, n), got %d dimensions%s%zd",
                     (int)self->n_kv_heads, a.ndim, a.ndim ? ", the first of " : "", a.ndim ? a.shape[0] : (Py_ssize_t)0);
        array_release(&a);
        return NULL;
    }
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_observe_scores(self->ctx, seq, layer, a.data, (int32_t)a.shape[1]));
    array_release(&a);
    if (st)
        return context_fail(self, st, "fg_seq_observe_scores");
    Py_RETURN_NONE;
}

static PyObject *context_observed_ranks(ContextObject *self, PyObject *args) {
    int seq, layer, n;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "iii:observed_ranks", &seq, &layer, &n))
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "observed_ranks: n must be >= 0, got %d", n);
        return NULL;
    }
    PyObject *shape = Py_BuildValue("(ii)", (int)self->n_kv_heads, n);
    PyObject *out = shape ? new_array(NULL, shape, "float32") : NULL;
    Py_XDECREF(shape);
    if (!out)
        return NULL;
    arg_array a;
    if (array_get(out, "ranks", 'f', 1, ON_HOST, NULL, &a) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    float one;
    fg_status st;
    CONTEXT_CALL(self, st, fg_seq_observed_ranks(self->ctx, seq, layer, n ? a.data : &one, n));
    array_release(&a);
    if (st) {
        Py_DECREF(out);
        return context_fail(self, st, "fg_seq_observed_ranks");
    }
    return out;
}

static PyObject *context_inspect(ContextObject *self, PyObject *args) {
    int seq, layer, kv_head;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "iii:inspect", &seq, &layer, &kv_head))
        return NULL;
    fg_head_info h;
    fg_status st;
    CONTEXT_CALL(self, st, fg_head_inspect(self->ctx, seq, layer, kv_head, &h));
    if (st)
        return context_fail(self, st, "fg_head_inspect");
    PyObject *rec = PyList_New(h.n_policies);
    for (int32_t i = 0; rec && i < h.n_policies; i++)
        PyList_SET_ITEM(rec, i, PyFloat_FromDouble((double)h.recovery[i]));
    char name[96];
    fg_policy_name(h.components, name, sizeof name);
    PyObject *policy = policy_to_dict(&h.policy);
    if (!rec || !policy) {
        Py_XDECREF(rec);
        Py_XDECREF(policy);
        return NULL;
    }
    return Py_BuildValue("{s:i,s:s,s:N,s:N,s:i,s:i,s:n,s:n,s:n}", "policy_index", (int)h.policy_index, "components",
                         name, "policy", policy, "recovery", rec, "length", (int)h.length, "kept", (int)h.kept,
                         "kv_bytes_held", (Py_ssize_t)h.kv_bytes_held, "kv_bytes_full", (Py_ssize_t)h.kv_bytes_full,
                         "kv_bytes_shared", (Py_ssize_t)h.kv_bytes_shared);
}

static PyObject *context_positions(ContextObject *self, PyObject *args) {
    int seq, layer, kv_head;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "iii:positions", &seq, &layer, &kv_head))
        return NULL;
    fg_head_info info; /* its kept count sizes the array */
    fg_status st;
    CONTEXT_CALL(self, st, fg_head_inspect(self->ctx, seq, layer, kv_head, &info));
    if (st)
        return context_fail(self, st, "fg_head_positions");
    int32_t n = info.kept, got = 0;
    PyObject *out = NULL;
    for (;;) { /* another thread's decode may add rows between the size and the fill: size again */
        PyObject *shape = Py_BuildValue("(i)", (int)n);
        out = shape ? new_array(NULL, shape, "int32") : NULL;
        Py_XDECREF(shape);
        if (!out)
            return NULL;
        arg_array a;
        if (array_get(out, "positions", 'i', 1, ON_HOST, NULL, &a) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        CONTEXT_CALL(self, st, fg_head_positions(self->ctx, seq, layer, kv_head, n ? a.data : &got, n ? n : 1, &got));
        array_release(&a);
        if (st == FG_ERR_CAPACITY && got > n) {
            Py_DECREF(out);
            n = got;
            continue;
        }
        break;
    }
    if (st) {
        Py_DECREF(out);
        return context_fail(self, st, "fg_head_positions");
    }
    if (got < n) { /* another thread's call in between evicted rows: the array's first got are the kept ones */
        PyObject *cut = PySequence_GetSlice(out, 0, got);
        Py_DECREF(out);
        return cut;
    }
    return out;
}

static PyObject *context_memory(ContextObject *self, PyObject *args) {
    int seq = -1;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "|i:memory", &seq))
        return NULL;
    fg_memory_stats m;
    fg_status st;
    CONTEXT_CALL(self, st, fg_memory(self->ctx, seq, &m));
    if (st)
        return context_fail(self, st, "fg_memory");
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:L,s:L,s:L,s:L,s:n}", "kv_bytes_held", (Py_ssize_t)m.kv_bytes_held,
                         "kv_bytes_full", (Py_ssize_t)m.kv_bytes_full, "meta_bytes_held",
                         (Py_ssize_t)m.meta_bytes_held, "pool_bytes", (Py_ssize_t)m.pool_bytes, "pages_in_use",
                         (long long)m.pages_in_use, "pages_free", (long long)m.pages_free, "rows_kept",
                         (long long)m.rows_kept, "rows_full", (long long)m.rows_full, "kv_bytes_alone",
                         (Py_ssize_t)m.kv_bytes_alone);
}

static PyObject *context_trim(ContextObject *self, PyObject *unused) {
    (void)unused;
    if (!context_ready(self))
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_trim(self->ctx));
    if (st)
        return context_fail(self, st, "fg_trim");
    Py_RETURN_NONE;
}

static PyObject *context_synchronize(ContextObject *self, PyObject *unused) {
    (void)unused;
    if (!context_ready(self))
        return NULL;
    fg_status st;
    CONTEXT_CALL(self, st, fg_synchronize(self->ctx));
    if (st)
        return context_fail(self, st, "fg_synchronize");
    Py_RETURN_NONE;
}

/* The overhead benchmark's other side: the same fg_decode calls as a Python
 * loop over layers, made from C, reps times; returns the seconds. */
static PyObject *context_bench_decode_c(ContextObject *self, PyObject *args) {
    PyObject *seqs_o, *tokens_o, *q, *k, *v, *out;
    int reps;
    if (!context_ready(self) || !PyArg_ParseTuple(args, "OOOOOOi:_bench_decode_c", &seqs_o, &tokens_o, &q, &k, &v,
                                                  &out, &reps))
        return NULL;
    arg_ints seqs, tokens;
    if (ints_get(seqs_o, "seqs", &seqs) < 0)
        return NULL;
    if (ints_get(tokens_o, "tokens", &tokens) < 0) {
        ints_release(&seqs);
        return NULL;
    }
    qkv_args x;
    if (tokens.n != seqs.n) {
        PyErr_Format(PyExc_ValueError, "tokens: expected one per sequence (%zd), got %zd", seqs.n, tokens.n);
        ints_release(&seqs);
        ints_release(&tokens);
        return NULL;
    }
    if (qkv_get(self, q, k, v, out, seqs.n, "n_seqs", &x) < 0) {
        ints_release(&seqs);
        ints_release(&tokens);
        return NULL;
    }
    fg_status st = FG_OK;
    struct timespec t0, t1;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < reps && st == FG_OK; r++)
        for (int32_t l = 0; l < self->n_layers && st == FG_OK; l++)
            st = fg_decode(self->ctx, l, (int32_t)seqs.n, seqs.data, tokens.data, x.q.data, x.k.data, x.v.data,
                           x.out.data);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS self->busy--;
    qkv_release(&x);
    ints_release(&seqs);
    ints_release(&tokens);
    if (st)
        return context_fail(self, st, "fg_decode");
    return PyFloat_FromDouble((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}

static PyObject *context_get_backend(ContextObject *self, void *unused) {
    (void)unused;
    return context_ready(self) ? PyUnicode_FromString(fg_context_backend(self->ctx)) : NULL;
}

static PyObject *context_get_closed(ContextObject *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(self->ctx == NULL);
}

static PyObject *context_get_last_error(ContextObject *self, void *unused) {
    (void)unused;
    return PyUnicode_FromString(fg_last_error(self->ctx));
}

static PyObject *context_get_shape(ContextObject *self, void *unused) {
    (void)unused;
    return Py_BuildValue("(iiii)", (int)self->n_layers, (int)self->n_q_heads, (int)self->n_kv_heads,
                         (int)self->head_dim);
}

static PyObject *context_get_io(ContextObject *self, void *unused) {
    (void)unused;
    return PyUnicode_FromString(k_io_names[self->io]);
}

static PyMethodDef context_methods[] = {
    {"close", (PyCFunction)context_close, METH_NOARGS,
     "close()\n--\n\nDestroys the context and every sequence in it, at once (also at `with`'s end). Later calls "
     "raise ValueError; a second close() does nothing."},
    {"_set_compression", (PyCFunction)context_set_compression, METH_O, NULL},
    {"_create", (PyCFunction)(void (*)(void))context_create, METH_VARARGS | METH_KEYWORDS, NULL},
    {"destroy", (PyCFunction)context_destroy_seq, METH_O,
     "destroy(seq)\n--\n\nFrees a sequence: its pages go back to the pool (fg_seq_destroy)."},
    {"fork", (PyCFunction)context_fork, METH_O,
     "fork(seq) -> int\n--\n\nA new sequence that continues from seq, sharing its pages (copy-on-write), after its "
     "prefill (fg_seq_fork)."},
    {"length", (PyCFunction)context_length, METH_VARARGS,
     "length(seq, layer) -> int\n--\n\nTokens the sequence has at a layer (0 before that layer's prefill)."},
    {"prefill", (PyCFunction)(void (*)(void))context_prefill, METH_FASTCALL | METH_KEYWORDS,
     "prefill(seq, layer, q, k, v, out=None) -> out\n--\n\n"
     "Prompt phase of one layer (fg_prefill): out = causal attention; every KV head is profiled, takes its policy "
     "and keeps its compressed cache.\n"
     "q: [n_prompt, n_q_heads, head_dim], k, v: [n_prompt, n_kv_heads, head_dim] (k after RoPE), float32, "
     "C-contiguous (or each flattened to 2-D). out: [n_prompt, n_q_heads, head_dim], written in place when given, "
     "else created like q."},
    {"prefill_chunk", (PyCFunction)(void (*)(void))context_prefill_chunk, METH_FASTCALL | METH_KEYWORDS,
     "prefill_chunk(seq, layer, begin, q, k, v, out=None) -> out\n--\n\n"
     "Rows [begin, begin + n) of one layer's prompt (fg_prefill_chunk), in order; the layer's last chunk profiles "
     "and compacts as prefill() does. Shapes as prefill() with n rows."},
    {"decode", (PyCFunction)(void (*)(void))context_decode, METH_FASTCALL | METH_KEYWORDS,
     "decode(layer, seqs, tokens, q, k, v, out=None) -> out\n--\n\n"
     "One decoding step of one layer for a batch of distinct sequences (fg_decode). tokens[i] is the id of the "
     "new token of seqs[i] (lists of ints or int32 arrays).\n"
     "q: [n_seqs, n_q_heads, head_dim], k, v: [n_seqs, n_kv_heads, head_dim], out: [n_seqs, n_q_heads, head_dim]."},
    {"append", (PyCFunction)(void (*)(void))context_append, METH_FASTCALL | METH_KEYWORDS,
     "append(seq, layer, tokens, q, k, v, out=None) -> out\n--\n\n"
     "n new tokens of one layer onto a sequence that holds a compressed cache (fg_seq_append): a new user turn. "
     "All or nothing. Shapes as prefill() with n = len(tokens) rows."},
    {"observe", (PyCFunction)(void (*)(void))context_observe, METH_FASTCALL | METH_KEYWORDS,
     "observe(seq, layer, q, k, v, out=None) -> out\n--\n\n"
     "observe=\"explicit\" (FG_OBSERVE_EXPLICIT): n rows of one layer fed after the sequence and not kept "
     "(fg_seq_observe), e.g. a reconstruction pass (the prompt again after an instruction to repeat it): out gets "
     "their causal attention over the held rows and themselves, and the attention they give each held key is what "
     "compress() ranks and judges by. Shapes as prefill() with n rows."},
    {"compress", (PyCFunction)context_compress, METH_O,
     "compress(seq)\n--\n\n"
     "An adaptive sequence's heads compressed now (fg_seq_compress), from the rows observe() gave, else its own "
     "observed rows. All or nothing."},
    {"observe_scores", (PyCFunction)context_observe_scores, METH_VARARGS,
     "observe_scores(seq, layer, scores)\n--\n\n"
     "observe=\"scores\" (FG_OBSERVE_SCORES): the engine's score of each of the n keys a layer holds "
     "(fg_seq_observe_scores), a float32 array (n_kv_heads, n), finite and >= 0; they add up call by call and rank "
     "the keys compress() keeps. Every layer scored as many times. All or nothing."},
    {"observed_ranks", (PyCFunction)context_observed_ranks, METH_VARARGS,
     "observed_ranks(seq, layer, n) -> numpy.ndarray\n--\n\n"
     "The ranks an observe=\"explicit\" or \"scores\" sequence holds for a layer's first n keys, (n_kv_heads, n) "
     "float32 (fg_seq_observed_ranks): the attention the given rows gave, or the scores' sums. Before compress()."},
    {"inspect", (PyCFunction)context_inspect, METH_VARARGS,
     "inspect(seq, layer, kv_head) -> dict\n--\n\n"
     "One head (fg_head_inspect): policy_index, components (its policy's name), policy (its own ratios), recovery "
     "(of every shortlist entry), length, kept, kv_bytes_held, kv_bytes_full, kv_bytes_shared."},
    {"positions", (PyCFunction)context_positions, METH_VARARGS,
     "positions(seq, layer, kv_head) -> numpy.ndarray\n--\n\nThe positions a head keeps, ascending (int32)."},
    {"memory", (PyCFunction)context_memory, METH_VARARGS,
     "memory(seq=-1) -> dict\n--\n\n"
     "KV memory (fg_memory): of one sequence, or of the whole context (seq < 0, pages shared by forks counted "
     "once). kv_bytes_held against kv_bytes_full, rows_kept against rows_full, the pool's pages."},
    {"trim", (PyCFunction)context_trim, METH_NOARGS,
     "trim()\n--\n\nReturns the pool's chunks with no page in use to the backend."},
    {"synchronize", (PyCFunction)context_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWaits for the context's queued device work (io=\"device\")."},
    {"_bench_decode_c", (PyCFunction)context_bench_decode_c, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef context_getset[] = {
    {"backend", (getter)context_get_backend, NULL, "The backend the context runs on.", NULL},
    {"closed", (getter)context_get_closed, NULL, "Whether close() was called.", NULL},
    {"last_error", (getter)context_get_last_error, NULL, "The message of the last call on the context (\"\" when it "
     "succeeded).", NULL},
    {"shape", (getter)context_get_shape, NULL, "(n_layers, n_q_heads, n_kv_heads, head_dim)", NULL},
    {"io", (getter)context_get_io, NULL, "Where the activations live: \"host\" or \"device\".", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fastgen._fastgen._Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)context_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C side of fastgen.Context.",
    .tp_methods = context_methods,
    .tp_getset = context_getset,
    .tp_init = (initproc)context_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ Model: the runner */

typedef struct {
    PyObject_HEAD
    fgm_llama_model model;
    fgm_tokenizer tok;
    fgm_runner *runner;
    fgm_scorer scorer; /* the runner's key scorer (observe="scores"), when one was loaded */
    int loaded;
    int busy;
} ModelObject;

static void model_free(ModelObject *self) {
    fgm_runner_destroy(&self->runner);
    fgm_scorer_free(&self->scorer);
    if (self->loaded) {
        fgm_tokenizer_free(&self->tok);
        fgm_llama_free(&self->model);
    }
    self->loaded = 0;
}

static void model_dealloc(ModelObject *self) {
    model_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int model_init(ModelObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "tokenizer", "backend", "kv_dtype", "v_dtype", "max_seqs", "threads",
                             "f32_activations", "ctx_size", "prefill_chunk", "scorer", NULL};
    PyObject *path_o, *tok_o = Py_None, *scorer_o = Py_None;
    const char *backend = NULL, *kv = "f16", *vd = NULL;
    int max_seqs = 4, threads = 0, f32 = 0, ctx_size = 0, chunk = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O$zsziipiiO:Model", kwlist, PyUnicode_FSConverter, &path_o, &tok_o,
                                     &backend, &kv, &vd, &max_seqs, &threads, &f32, &ctx_size, &chunk, &scorer_o))
        return -1;
    if (self->loaded || self->busy) {
        Py_DECREF(path_o);
        PyErr_SetString(PyExc_ValueError, "Model: already initialised (make a new one)");
        return -1;
    }
    if (max_seqs < 1 || threads < 0 || threads > FG_MAX_THREADS || ctx_size < 0 || chunk < 0) { /* fastgen.Model
                                                                                   names each in the CLI's words */
        Py_DECREF(path_o);
        PyErr_Format(PyExc_ValueError, "Model: max_seqs %d must be >= 1, threads %d in [0, %d], ctx_size %d and "
                     "prefill_chunk %d >= 0", max_seqs, threads, FG_MAX_THREADS, ctx_size, chunk);
        return -1;
    }
    PyObject *tok_bytes = NULL, *scorer_bytes = NULL;
    if (tok_o != Py_None && !PyUnicode_FSConverter(tok_o, &tok_bytes)) {
        Py_DECREF(path_o);
        return -1;
    }
    if (scorer_o != Py_None && !PyUnicode_FSConverter(scorer_o, &scorer_bytes)) {
        Py_DECREF(path_o);
        Py_XDECREF(tok_bytes);
        return -1;
    }
    fgm_runner_params rp = {.backend = backend, .max_seqs = max_seqs, .q8_activations = !f32, .n_threads = threads,
                           .max_len = ctx_size, .prefill_chunk = chunk};
    char err[512] = "";
    fg_status st = FG_OK;
    if (fg_dtype_parse(kv, &rp.kv_dtype) != FG_OK) {
        snprintf(err, sizeof err, "kv_dtype: expected f32, f16, bf16, q8_0 or q4_0, got '%s'", kv);
        st = FG_ERR_INVALID_ARGUMENT;
    } else if (vd) {
        rp.v_apart = 1;
        if (fg_dtype_parse(vd, &rp.v_dtype) != FG_OK) {
            snprintf(err, sizeof err, "v_dtype: expected f32, f16, bf16, q8_0 or q4_0, got '%s'", vd);
            st = FG_ERR_INVALID_ARGUMENT;
        }
    }
    const char *path = PyBytes_AS_STRING(path_o);
    const char *tokp = tok_bytes ? PyBytes_AS_STRING(tok_bytes) : NULL;
    if (st == FG_OK) {
        self->busy++;
        Py_BEGIN_ALLOW_THREADS st = fgm_model_load(path, &self->model, err, sizeof err);
        if (st == FG_OK) {
            if (self->model.gguf && !tokp)
                st = fgm_tokenizer_from_gguf(self->model.gguf, self->model.config.vocab_size, &self->tok, err,
                                             sizeof err);
            else if (!tokp) {
                st = FG_ERR_INVALID_ARGUMENT;
                snprintf(err, sizeof err, "%s is a llama2.c checkpoint: pass its tokenizer (tokenizer=...)", path);
            } else
                st = fgm_tokenizer_load_file(tokp, self->model.config.vocab_size, &self->tok, err, sizeof err);
            if (st)
                fgm_llama_free(&self->model);
        }
        if (st == FG_OK) {
            self->loaded = 1;
            st = fgm_runner_create(&self->model, &self->tok, &rp, &self->runner, err, sizeof err);
        }
        if (st == FG_OK && scorer_bytes) {
            const char *sp = PyBytes_AS_STRING(scorer_bytes);
            st = fgm_scorer_load(sp, &self->scorer, err, sizeof err);
            if (st == FG_OK && (st = fgm_runner_set_scorer(self->runner, &self->scorer)))
                snprintf(err, sizeof err, "%s: %s", sp, fgm_runner_error(self->runner));
        }
        Py_END_ALLOW_THREADS self->busy--;
    }
    Py_DECREF(path_o);
    Py_XDECREF(tok_bytes);
    Py_XDECREF(scorer_bytes);
    if (st) {
        model_free(self);
        raise_status(st, "fastgen.Model", err);
        return -1;
    }
    return 0;
}

static int model_ready(ModelObject *self) {
    if (!self->runner) {
        PyErr_SetString(PyExc_ValueError, "the model is closed");
        return 0;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the model is running a call in another thread");
        return 0;
    }
    return 1;
}

static PyObject *model_fail(ModelObject *self, fg_status st, const char *what) {
    const char *e = fgm_runner_error(self->runner);
    char msg[640];
    snprintf(msg, sizeof msg, "%s: %s", what, e && e[0] ? e : fg_status_string(st));
    return raise_status(st, what, msg);
}

static PyObject *model_close(ModelObject *self, PyObject *unused) {
    (void)unused;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "close(): the model is running a call in another thread");
        return NULL;
    }
    model_free(self);
    Py_RETURN_NONE;
}

static PyObject *model_tokenize_claimed(ModelObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"text", "bos", "special", NULL};
    const char *text;
    int bos = 1, special = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|pp:tokenize", kwlist, &text, &bos, &special))
        return NULL;
    const int32_t cap = (int32_t)strlen(text) + 2;
    int32_t *ids = PyMem_Malloc((size_t)cap * sizeof *ids), n = 0;
    if (!ids)
        return PyErr_NoMemory();
    const int flags = (bos ? FGM_ENCODE_BOS : 0) | (special ? FGM_ENCODE_SPECIAL : 0);
    fg_status st = fgm_tokenizer_encode(&self->tok, text, flags, ids, cap, &n);
    PyObject *list = st ? NULL : PyList_New(n);
    for (int32_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, PyLong_FromLong(ids[i]));
    PyMem_Free(ids);
    if (st)
        return raise_status(st, "tokenize", "the text cannot be encoded");
    return list;
}

static PyObject *model_detokenize_claimed(ModelObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"ids", "after", NULL};
    PyObject *arg;
    int after = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$i:detokenize", kwlist, &arg, &after))
        return NULL;
    if (after >= self->tok.vocab_size) {
        PyErr_Format(PyExc_ValueError, "after: %d is not a token id (vocabulary of %d)", after,
                     (int)self->tok.vocab_size);
        return NULL;
    }
    arg_ints ids;
    if (ints_get(arg, "ids", &ids) < 0)
        return NULL;
    PyObject *parts = PyList_New(0);
    for (Py_ssize_t i = 0; parts && i < ids.n; i++) {
        if (ids.data[i] < 0 || ids.data[i] >= self->tok.vocab_size) {
            PyErr_Format(PyExc_ValueError, "ids[%zd]: %d is not a token id (vocabulary of %d)", i, (int)ids.data[i],
                         (int)self->tok.vocab_size);
            Py_CLEAR(parts);
            break;
        }
        const int32_t prev = i ? ids.data[i - 1] : after >= 0 ? after : self->tok.bos;
        PyObject *s = PyBytes_FromString(fgm_tokenizer_decode(&self->tok, prev, ids.data[i]));
        if (!s || PyList_Append(parts, s) < 0)
            Py_CLEAR(parts);
        Py_XDECREF(s);
    }
    ints_release(&ids);
    if (!parts)
        return NULL;
    PyObject *empty = PyBytes_FromString("");
    PyObject *joined = empty ? PyObject_CallMethod(empty, "join", "O", parts) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(parts);
    if (!joined)
        return NULL;
    PyObject *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(joined), PyBytes_GET_SIZE(joined), "replace");
    Py_DECREF(joined);
    return text;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static PyObject *memory_dict(const fg_memory_stats *m) {
    return Py_BuildValue("{s:n,s:n,s:L,s:L}", "kv_bytes_held", (Py_ssize_t)m->kv_bytes_held, "kv_bytes_full",
                         (Py_ssize_t)m->kv_bytes_full, "rows_kept", (long long)m->rows_kept, "rows_full",
                         (long long)m->rows_full);
}

/* _generate(ids, compression, max_tokens, temperature, top_p, top_k, seed, ignore_eos) -> dict */
static PyObject *model_generate_claimed(ModelObject *self, PyObject *args) {
    PyObject *ids_o, *comp, *recon_o = Py_None;
    int max_tokens, top_k, ignore_eos;
    float temperature, top_p;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OOiffiKp|O:_generate", &ids_o, &comp, &max_tokens, &temperature,
                                                &top_p, &top_k, &seed, &ignore_eos, &recon_o))
        return NULL;
    fg_compression_params cp;
    if (dict_to_compression(comp, &cp) < 0)
        return NULL;
    if ((cp.observe == FG_OBSERVE_EXPLICIT) != (recon_o != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "observe=\"explicit\": the runner reconstructs the prompt after an "
                                          "instruction (its tokens), and only then");
        return NULL;
    }
    arg_ints prompt, recon = {0};
    if (recon_o != Py_None && ints_get(recon_o, "instruction", &recon) < 0)
        return NULL;
    if (ints_get(ids_o, "prompt", &prompt) < 0) {
        if (recon_o != Py_None)
            ints_release(&recon);
        return NULL;
    }
    const int32_t vocab = self->model.config.vocab_size, n_prompt = (int32_t)prompt.n;
    const int32_t room = fgm_runner_ctx_len(self->runner) - n_prompt;
    if (n_prompt < 1 || room < 0) {
        ints_release(&prompt);
        if (recon_o != Py_None)
            ints_release(&recon);
        PyErr_Format(PyExc_ValueError, "prompt: %d tokens; the model's context holds 1 to %d", (int)n_prompt,
                     (int)fgm_runner_ctx_len(self->runner));
        return NULL;
    }
    if (max_tokens > room)
        max_tokens = room;
    float *logits = PyMem_Malloc((size_t)vocab * sizeof *logits);
    int32_t *out = PyMem_Malloc((size_t)(max_tokens > 0 ? max_tokens : 1) * sizeof *out);
    if (!logits || !out) {
        PyMem_Free(logits);
        PyMem_Free(out);
        ints_release(&prompt);
        if (recon_o != Py_None)
            ints_release(&recon);
        return PyErr_NoMemory();
    }
    int32_t seq = -1, n_out = 0, runs = 0;
    fg_status st;
    const char *what = "prefill";
    double t_prefill = 0.0, t_decode = 0.0, t_recon = 0.0;
    fg_memory_stats mem = {0};
    self->busy++;
    Py_BEGIN_ALLOW_THREADS double t0 = now_s();
    st = fgm_runner_prefill(self->runner, &cp, prompt.data, n_prompt, &seq, logits);
    t_prefill = now_s() - t0;
    if (st == FG_OK && recon_o != Py_None) { /* the prompt again after the instruction, then the compression */
        const int32_t skip = prompt.data[0] == self->tok.bos;
        what = "reconstruct";
        t0 = now_s();
        st = fgm_runner_reconstruct(self->runner, 1, &seq, recon.data, (int32_t)recon.n, prompt.data + skip,
                                    n_prompt - skip, NULL);
        t_recon = now_s() - t0;
    }
    fgm_sampler sampler = {temperature, top_p, seed * 0x9e3779b97f4a7c15ull + 1, top_k};
    t0 = now_s();
    for (int32_t step = 0; st == FG_OK && step < max_tokens; step++) {
        int32_t next = fgm_sample(&sampler, logits, vocab);
        if (!ignore_eos && (next == self->tok.bos || next == self->tok.eos))
            break;
        out[n_out++] = next;
        if (step + 1 < max_tokens) {
            what = "decode";
            st = fgm_runner_decode(self->runner, 1, &seq, &next, logits);
            runs++;
        }
    }
    t_decode = now_s() - t0;
    if (st == FG_OK)
        fg_memory(fgm_runner_context(self->runner), seq, &mem);
    if (seq >= 0)
        fgm_runner_release(self->runner, seq);
    Py_END_ALLOW_THREADS self->busy--;
    PyObject *r = NULL;
    if (st)
        model_fail(self, st, what);
    else {
        PyObject *ids = PyList_New(n_out);
        for (int32_t i = 0; ids && i < n_out; i++)
            PyList_SET_ITEM(ids, i, PyLong_FromLong(out[i]));
        PyObject *mem_d = memory_dict(&mem);
        if (ids && mem_d)
            r = Py_BuildValue("{s:O,s:i,s:O,s:d,s:d,s:i,s:d}", "ids", ids, "n_prompt", (int)n_prompt, "memory", mem_d,
                              "prefill_s", t_prefill, "decode_s", t_decode, "decode_runs", (int)runs, "reconstruct_s",
                              t_recon);
        Py_XDECREF(ids);
        Py_XDECREF(mem_d);
    }
    PyMem_Free(logits);
    PyMem_Free(out);
    ints_release(&prompt);
    if (recon_o != Py_None)
        ints_release(&recon);
    return r;
}

/* _profile(ids, compression) -> dict: every head's choice after the prompt. */
static PyObject *model_profile_claimed(ModelObject *self, PyObject *args) {
    PyObject *ids_o, *comp;
    if (!PyArg_ParseTuple(args, "OO:_profile", &ids_o, &comp))
        return NULL;
    fg_compression_params cp;
    if (dict_to_compression(comp, &cp) < 0)
        return NULL;
    if (cp.observe == FG_OBSERVE_EXPLICIT) {
        PyErr_SetString(PyExc_ValueError, "profile: observe=\"explicit\" compresses after a reconstruction, which "
                                          "profile does not run; generate() does");
        return NULL;
    }
    arg_ints prompt;
    if (ints_get(ids_o, "prompt", &prompt) < 0)
        return NULL;
    int32_t seq = -1;
    fg_status st;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS st = fgm_runner_prefill(self->runner, &cp, prompt.data, (int32_t)prompt.n, &seq, NULL);
    Py_END_ALLOW_THREADS self->busy--;
    ints_release(&prompt);
    if (st)
        return model_fail(self, st, "prefill");
    fg_context *ctx = fgm_runner_context(self->runner);
    const int32_t L = self->model.config.n_layers, H = self->model.config.n_kv_heads;
    PyObject *heads = PyList_New(0);
    for (int32_t l = 0; heads && l < L; l++)
        for (int32_t h = 0; heads && h < H; h++) {
            fg_head_info info;
            if ((st = fg_head_inspect(ctx, seq, l, h, &info)) != FG_OK) {
                raise_status(st, "fg_head_inspect", fg_last_error(ctx));
                Py_CLEAR(heads);
                break;
            }
            char name[96];
            fg_policy_name(info.components, name, sizeof name);
            PyObject *rec = PyList_New(info.n_policies);
            for (int32_t i = 0; rec && i < info.n_policies; i++)
                PyList_SET_ITEM(rec, i, PyFloat_FromDouble((double)info.recovery[i]));
            PyObject *row = rec ? Py_BuildValue("{s:i,s:i,s:i,s:s,s:N,s:i,s:i}", "layer", (int)l, "kv_head", (int)h,
                                                "policy_index", (int)info.policy_index, "components", name, "recovery",
                                                rec, "kept", (int)info.kept, "length", (int)info.length)
                                : NULL;
            if (!row || PyList_Append(heads, row) < 0)
                Py_CLEAR(heads);
            Py_XDECREF(row);
        }
    fg_memory_stats mem;
    PyObject *r = NULL;
    if (heads && (st = fg_memory(ctx, seq, &mem)) != FG_OK)
        raise_status(st, "fg_memory", fg_last_error(NULL));
    else if (heads) {
        PyObject *mem_d = memory_dict(&mem);
        r = mem_d ? Py_BuildValue("{s:O,s:N}", "heads", heads, "memory", mem_d) : NULL;
    }
    Py_XDECREF(heads);
    fgm_runner_release(self->runner, seq);
    return r;
}

/* The calls that read Python arguments take the model (busy) before reading them: reading may run Python
 * code (an __index__, a buffer) that releases the GIL, and another thread's call must then find the model
 * busy, not run beside this one on the same runner. */
static PyObject *model_tokenize(ModelObject *self, PyObject *args, PyObject *kw) {
    if (!model_ready(self))
        return NULL;
    self->busy++;
    PyObject *r = model_tokenize_claimed(self, args, kw);
    self->busy--;
    return r;
}

static PyObject *model_detokenize(ModelObject *self, PyObject *args, PyObject *kw) {
    if (!model_ready(self))
        return NULL;
    self->busy++;
    PyObject *r = model_detokenize_claimed(self, args, kw);
    self->busy--;
    return r;
}

static PyObject *model_generate(ModelObject *self, PyObject *args) {
    if (!model_ready(self))
        return NULL;
    self->busy++;
    PyObject *r = model_generate_claimed(self, args);
    self->busy--;
    return r;
}

static PyObject *model_profile(ModelObject *self, PyObject *args) {
    if (!model_ready(self))
        return NULL;
    self->busy++;
    PyObject *r = model_profile_claimed(self, args);
    self->busy--;
    return r;
}

static PyObject *model_get_config(ModelObject *self, void *unused) {
    (void)unused;
    if (!model_ready(self))
        return NULL;
    const fgm_llama_config *c = &self->model.config;
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:n}", "dim", (int)c->dim, "hidden_dim",
                         (int)c->hidden_dim, "n_layers", (int)c->n_layers, "n_heads", (int)c->n_heads, "n_kv_heads",
                         (int)c->n_kv_heads, "head_dim", (int)c->head_size, "vocab_size", (int)c->vocab_size,
                         "seq_len", (int)c->seq_len, "ctx_len", (int)fgm_runner_ctx_len(self->runner),
                         "weight_bytes", (Py_ssize_t)fgm_llama_weight_bytes(&self->model));
}

static PyObject *model_get_backend(ModelObject *self, void *unused) {
    (void)unused;
    return model_ready(self) ? PyUnicode_FromString(fg_context_backend(fgm_runner_context(self->runner))) : NULL;
}

static PyObject *model_get_special(ModelObject *self, void *unused) {
    (void)unused;
    return model_ready(self) ? Py_BuildValue("{s:i,s:i}", "bos", (int)self->tok.bos, "eos", (int)self->tok.eos) : NULL;
}

static PyMethodDef model_methods[] = {
    {"close", (PyCFunction)model_close, METH_NOARGS, "close()\n--\n\nFrees the model, its tokenizer and its context."},
    {"tokenize", (PyCFunction)(void (*)(void))model_tokenize, METH_VARARGS | METH_KEYWORDS,
     "tokenize(text, bos=True, special=True) -> list[int]\n--\n\n"
     "The model's token ids for text (BOS first when the model expects it and bos is true; special: chat markers "
     "in the text become their tokens)."},
    {"detokenize", (PyCFunction)(void (*)(void))model_detokenize, METH_VARARGS | METH_KEYWORDS,
     "detokenize(ids, *, after=-1) -> str\n--\n\nThe text of token ids; after: the id before them, for a "
     "continuation (a first piece's leading space depends on it)."},
    {"_generate", (PyCFunction)model_generate, METH_VARARGS, NULL},
    {"_profile", (PyCFunction)model_profile, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"config", (getter)model_get_config, NULL, "The model's shape (dim, n_layers, n_heads, n_kv_heads, head_dim, "
     "vocab_size, seq_len, ctx_len, weight_bytes).", NULL},
    {"backend", (getter)model_get_backend, NULL, "The backend the attention runs on.", NULL},
    {"special_ids", (getter)model_get_special, NULL, "The BOS and EOS ids (-1 where the vocabulary has none).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fastgen._fastgen._Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_dealloc = (destructor)model_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C side of fastgen.Model.",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
    .tp_init = (initproc)model_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ the module */

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS, "version()\n--\n\nThe library's version string."},
    {"build_backends", mod_build_backends, METH_NOARGS, "build_backends()\n--\n\nThe backends this build serves."},
    {"backend_probe", mod_backend_probe, METH_O,
     "backend_probe(name)\n--\n\nNone when the backend is compiled in and usable here, else why not."},
    {"preset_names", mod_preset_names, METH_NOARGS, "preset_names()\n--\n\nThe compression presets' names."},
    {"preset", mod_preset, METH_O, "preset(name)\n--\n\nA preset's fields, as a dict."},
    {"validate", mod_validate, METH_O, "validate(fields)\n--\n\nChecks compression fields as fg_seq_create does."},
    {"policy_rows", mod_policy_rows, METH_VARARGS,
     "policy_rows(policy, t)\n--\n\nThe window w(t) and frequent budget k(t) of a policy at length t."},
    {"default_threads", mod_default_threads, METH_NOARGS, "default_threads()\n--\n\nThe CPUs this process may run on."},
    {"kv_row_bytes", mod_kv_row_bytes, METH_VARARGS,
     "kv_row_bytes(dtype, head_dim)\n--\n\nBytes of one cached K (or V) row (0 when the dtype cannot hold it)."},
    {"_set_allocator", set_allocator, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
    if (PyType_Ready(&ClassesType) < 0 || PyType_Ready(&ContextType) < 0 || PyType_Ready(&ModelType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "TokenClasses", (PyObject *)&ClassesType) < 0 ||
        PyModule_AddObjectRef(m, "_Context", (PyObject *)&ContextType) < 0 ||
        PyModule_AddObjectRef(m, "_Model", (PyObject *)&ModelType) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "MAX_SHORTLIST", FG_MAX_SHORTLIST) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", FG_MAX_THREADS) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastgen._fastgen",
    .m_doc = "The fastgen C library and model runner (use the fastgen package).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__fastgen(void);
PyMODINIT_FUNC PyInit__fastgen(void) { return PyModuleDef_Init(&module_def); }
