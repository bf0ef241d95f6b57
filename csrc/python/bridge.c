#include "python/bridge.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <string.h>

#include "core/thread.h"

int oi_py_typenum(oi_dtype_t t)
{
    switch (t) {
    case OI_TYPE_BOOL: return NPY_BOOL;
    case OI_TYPE_UINT8: return NPY_UINT8;
    case OI_TYPE_UINT16: return NPY_UINT16;
    case OI_TYPE_UINT32: return NPY_UINT32;
    case OI_TYPE_UINT64: return NPY_UINT64;
    case OI_TYPE_INT8: return NPY_INT8;
    case OI_TYPE_INT16: return NPY_INT16;
    case OI_TYPE_INT32: return NPY_INT32;
    case OI_TYPE_INT64: return NPY_INT64;
    case OI_TYPE_FP16: return NPY_HALF;
    case OI_TYPE_FP32: return NPY_FLOAT32;
    case OI_TYPE_FP64: return NPY_FLOAT64;
    case OI_TYPE_BF16: return NPY_UINT16;
    case OI_TYPE_BYTES: return NPY_OBJECT;
    default: return -1;
    }
}

/* ---- owners released without taking the GIL on the releasing thread --------------------- */

/* Loop threads must never wait for the GIL (a Python model may hold it for a long time), so
 * objects they release wait in a list. Executors empty it whenever they hold the GIL anyway
 * (oi_py_owner_flush at the start of each call); a reaper thread empties it only when nobody
 * has for a whole period, so that an idle server frees memory without the reaper fighting busy
 * executors for the GIL. */
#define REAPER_PERIOD_NS (100 * 1000 * 1000)

static struct {
    pthread_mutex_t mu;
    PyObject **items;
    size_t n;
    size_t cap;
    int started;
    size_t flushes; /* batches taken so far */
} reaper = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0, 0};

static PyObject **take_batch(size_t *n)
{
    pthread_mutex_lock(&reaper.mu);
    PyObject **items = reaper.items;
    *n = reaper.n;
    reaper.items = NULL;
    reaper.n = reaper.cap = 0;
    reaper.flushes++;
    pthread_mutex_unlock(&reaper.mu);
    return items;
}

void oi_py_owner_flush(void)
{
    if (reaper.n == 0) /* racy peek: a miss is caught by the next flush or the reaper */
        return;
    size_t n;
    PyObject **items = take_batch(&n);
    for (size_t i = 0; i < n; i++)
        Py_DECREF(items[i]);
    free(items);
}

static void *reaper_main(void *arg)
{
    (void)arg;
    size_t seen = (size_t)-1;
    for (;;) {
        struct timespec ts = {0, REAPER_PERIOD_NS};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&reaper.mu);
        size_t pending = reaper.n, flushes = reaper.flushes;
        pthread_mutex_unlock(&reaper.mu);
        int flushed_meanwhile = flushes != seen;
        seen = flushes;
        if (pending == 0 || flushed_meanwhile || !Py_IsInitialized())
            continue;
        PyGILState_STATE g = PyGILState_Ensure();
        oi_py_owner_flush();
        PyGILState_Release(g);
        pthread_mutex_lock(&reaper.mu); /* its own flush is not another's: the next period counts those */
        seen = reaper.flushes;
        pthread_mutex_unlock(&reaper.mu);
    }
    return NULL;
}

static void release_py(oi_buf_t *b)
{
    PyObject *obj = b->ctx;
    free(b);
    if (PyGILState_Check()) {
        Py_DECREF(obj);
        return;
    }
    pthread_mutex_lock(&reaper.mu);
    if (reaper.n == reaper.cap) {
        size_t cap = reaper.cap ? reaper.cap * 2 : 64;
        PyObject **p = realloc(reaper.items, cap * sizeof(*p));
        if (p == NULL) { /* cannot queue: leak one object rather than block a loop thread */
            pthread_mutex_unlock(&reaper.mu);
            return;
        }
        reaper.items = p;
        reaper.cap = cap;
    }
    reaper.items[reaper.n++] = obj;
    if (!reaper.started) {
        pthread_t th;
        reaper.started = oi_thread_create(&th, "oi-py-release", reaper_main, NULL, 1) == 0;
    }
    pthread_mutex_unlock(&reaper.mu);
}

oi_buf_t *oi_py_owner(PyObject *obj, void *data, size_t len)
{
    oi_buf_t *b = oi_buf_wrap(data, len, release_py, obj);
    if (b == NULL)
        Py_DECREF(obj);
    return b;
}

/* ---- tensors as arrays ------------------------------------------------------------------- */

static void capsule_release(PyObject *cap) { oi_buf_unref(PyCapsule_GetPointer(cap, "openinfer.buf")); }

static PyObject *bytes_array(const oi_tensor_t *t, npy_intp *dims, int writable)
{
    PyArrayObject *arr = (PyArrayObject *)PyArray_SimpleNew(t->ndim, dims, NPY_OBJECT);
    if (arr == NULL)
        return NULL;
    PyObject **items = PyArray_DATA(arr);
    npy_intp n = PyArray_SIZE(arr);
    size_t off = 0;
    for (npy_intp i = 0; i < n; i++) { /* sizes were checked by oi_tensor_check_size */
        uint32_t len;
        memcpy(&len, t->data + off, 4);
        PyObject *b = PyBytes_FromStringAndSize(t->data + off + 4, len);
        if (b == NULL) {
            Py_DECREF(arr);
            return NULL;
        }
        Py_XSETREF(items[i], b); /* new object arrays may hold NULLs */
        off += 4 + (size_t)len;
    }
    if (!writable)
        PyArray_CLEARFLAGS(arr, NPY_ARRAY_WRITEABLE);
    return (PyObject *)arr;
}

PyObject *oi_py_owner_capsule(oi_buf_t *owner)
{
    PyObject *cap = PyCapsule_New(oi_buf_ref(owner), "openinfer.buf", capsule_release);
    if (cap == NULL)
        oi_buf_unref(owner);
    return cap;
}

PyObject *oi_py_array_view_base(const oi_tensor_t *t, int writable, PyObject *base)
{
    npy_intp dims[OI_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        dims[i] = (npy_intp)t->shape[i];
    if (t->dtype == OI_TYPE_BYTES)
        return bytes_array(t, dims, writable);
    int typenum = oi_py_typenum(t->dtype);
    if (t->byte_size == 0 || t->owner == NULL) /* numpy allocates for empty arrays */
        return PyArray_SimpleNew(t->ndim, dims, typenum);
    int flags = NPY_ARRAY_C_CONTIGUOUS | (writable ? NPY_ARRAY_WRITEABLE : 0);
    PyObject *arr = PyArray_New(&PyArray_Type, t->ndim, dims, typenum, NULL, t->data, 0, flags, NULL);
    if (arr == NULL)
        return NULL;
    PyObject *own = base != NULL ? Py_NewRef(base) : oi_py_owner_capsule(t->owner);
    if (own == NULL || PyArray_SetBaseObject((PyArrayObject *)arr, own) != 0) { /* steals own */
        Py_DECREF(arr);
        return NULL;
    }
    PyArray_UpdateFlags((PyArrayObject *)arr, NPY_ARRAY_ALIGNED);
    return arr;
}

PyObject *oi_py_array_view(const oi_tensor_t *t, int writable) { return oi_py_array_view_base(t, writable, NULL); }

/* ---- objects as tensors ------------------------------------------------------------------ */

/* Names a tensor in messages, formatted only when there is an error to report. */
typedef struct oi_label_s {
    const char *kind; /* "input", "output" */
    const char *name;
} oi_label_t;

static oi_status_t *py_error_status(oi_label_t what, const char *doing)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
    oi_status_t *st = oi_status_new(OI_INTERNAL, "%s '%s': %s: %s", what.kind, what.name, doing, msg ? msg : "unknown error");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return st;
}

static oi_status_t *bytes_to_tensor(PyObject *obj, oi_label_t what, oi_tensor_t *out)
{
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(obj, NPY_OBJECT, 0, OI_MAX_DIMS, NPY_ARRAY_C_CONTIGUOUS);
    if (arr == NULL)
        return py_error_status(what, "cannot make an array of bytes");
    npy_intp n = PyArray_SIZE(arr);
    PyObject **items = PyArray_DATA(arr);
    size_t total = 0;
    for (npy_intp i = 0; i < n; i++) {
        Py_ssize_t len;
        if (PyBytes_Check(items[i]))
            len = PyBytes_GET_SIZE(items[i]);
        else if (PyUnicode_Check(items[i])) {
            if (PyUnicode_AsUTF8AndSize(items[i], &len) == NULL) {
                Py_DECREF(arr);
                return py_error_status(what, "cannot encode a str element as UTF-8");
            }
        } else {
            oi_status_t *st = oi_status_new(OI_INTERNAL, "%s '%s': BYTES element %zd is %s; expected bytes or str", what.kind, what.name,
                                            (Py_ssize_t)i, Py_TYPE(items[i])->tp_name);
            Py_DECREF(arr);
            return st;
        }
        if ((size_t)len > UINT32_MAX) {
            Py_DECREF(arr);
            return oi_status_new(OI_INTERNAL, "%s '%s': BYTES element %zd exceeds 4 GiB", what.kind, what.name, (Py_ssize_t)i);
        }
        total += 4 + (size_t)len;
    }
    oi_buf_t *b = oi_buf_new(total);
    if (b == NULL) {
        Py_DECREF(arr);
        return oi_status_new(OI_INTERNAL, "%s '%s': out of memory", what.kind, what.name);
    }
    for (npy_intp i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *p = PyBytes_Check(items[i]) ? PyBytes_AS_STRING(items[i]) : PyUnicode_AsUTF8AndSize(items[i], &len);
        if (PyBytes_Check(items[i]))
            len = PyBytes_GET_SIZE(items[i]);
        uint32_t l32 = (uint32_t)len;
        memcpy(b->data + b->len, &l32, 4);
        memcpy(b->data + b->len + 4, p, (size_t)len);
        b->len += 4 + (size_t)len;
    }
    out->ndim = PyArray_NDIM(arr);
    for (int i = 0; i < out->ndim; i++)
        out->shape[i] = PyArray_DIM(arr, i);
    Py_DECREF(arr);
    out->dtype = OI_TYPE_BYTES;
    out->owner = b;
    out->data = b->data;
    out->byte_size = b->len;
    return NULL;
}

/* The numpy name of an array's dtype ("int64", "<U3"), for messages. */
static void dtype_text(PyArrayObject *arr, char *buf, size_t cap)
{
    PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR(arr));
    const char *u = s ? PyUnicode_AsUTF8(s) : NULL;
    snprintf(buf, cap, "%s", u ? u : "?");
    if (u == NULL)
        PyErr_Clear();
    Py_XDECREF(s);
}

/* A C-contiguous, aligned, native-order array of `arr`'s values as `typenum` (a new reference,
 * `arr` itself when it already is one), to read them with plain C loads. NULL with an error set. */
static PyArrayObject *as_carray(PyArrayObject *arr, int typenum)
{
    return (PyArrayObject *)PyArray_FROMANY((PyObject *)arr, typenum, 0, 0, NPY_ARRAY_CARRAY_RO);
}

/* Refuses integer values that integer datatype `t` cannot hold: numpy's casts wrap them. */
static oi_status_t *check_int_range(PyArrayObject *arr, oi_dtype_t t, oi_label_t what, const char *given)
{
    int from_unsigned = PyArray_DESCR(arr)->kind == 'u';
    PyArrayObject *v = as_carray(arr, from_unsigned ? NPY_UINT64 : NPY_INT64);
    if (v == NULL)
        return py_error_status(what, "cannot read the integers");
    unsigned bits = 8 * (unsigned)oi_dtype_size(t);
    int to_signed = t == OI_TYPE_INT8 || t == OI_TYPE_INT16 || t == OI_TYPE_INT32 || t == OI_TYPE_INT64;
    int64_t lo = to_signed ? -(int64_t)((UINT64_C(1) << (bits - 1)) - 1) - 1 : 0;
    uint64_t hi = to_signed ? (UINT64_C(1) << (bits - 1)) - 1 : bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    oi_status_t *st = NULL;
    for (npy_intp i = 0, n = PyArray_SIZE(v); i < n && st == NULL; i++) {
        char value[24];
        if (from_unsigned) {
            uint64_t x = ((const uint64_t *)PyArray_DATA(v))[i];
            if (x <= hi)
                continue;
            snprintf(value, sizeof(value), "%" PRIu64, x);
        } else {
            int64_t x = ((const int64_t *)PyArray_DATA(v))[i];
            if (x >= lo && (x < 0 || (uint64_t)x <= hi))
                continue;
            snprintf(value, sizeof(value), "%" PRId64, x);
        }
        st = oi_status_new(OI_INTERNAL,
                           "%s '%s': expected %s, got %s values that do not fit: element %zd is %s, outside %" PRId64
                           "..%" PRIu64,
                           what.kind, what.name, oi_dtype_name(t), given, (Py_ssize_t)i, value, lo, hi);
    }
    Py_DECREF(v);
    return st;
}

/* Refuses finite values that float datatype `t` would round to an infinity. The bound is
 * halfway between the type's largest finite value and the next power of two: from there on,
 * round-to-nearest-even gives infinity. Infinities and NaNs given stay what they are. */
static oi_status_t *check_float_range(PyArrayObject *arr, oi_dtype_t t, oi_label_t what, const char *given)
{
    double bound;
    switch (t) {
    case OI_TYPE_FP16: bound = ldexp(2.0 - ldexp(1.0, -11), 15); break;
    case OI_TYPE_BF16: bound = ldexp(2.0 - ldexp(1.0, -8), 127); break;
    case OI_TYPE_FP32: bound = ldexp(2.0 - ldexp(1.0, -24), 127); break;
    default: return NULL; /* FP64 holds every value that reaches it as a double */
    }
    PyArrayObject *v = as_carray(arr, NPY_FLOAT64);
    if (v == NULL)
        return py_error_status(what, "cannot read the values");
    oi_status_t *st = NULL;
    const double *x = PyArray_DATA(v);
    for (npy_intp i = 0, n = PyArray_SIZE(v); i < n && st == NULL; i++)
        if (isfinite(x[i]) && fabs(x[i]) >= bound)
            st = oi_status_new(
                OI_INTERNAL,
                "%s '%s': expected %s, got %s values that do not fit: element %zd is %.17g, beyond the largest %s",
                what.kind, what.name, oi_dtype_name(t), given, (Py_ssize_t)i, x[i], oi_dtype_name(t));
    Py_DECREF(v);
    return st;
}

/* BF16 travels as uint16 bit patterns: bool, integer and float values are rounded to bfloat16
 * (refused where they would become infinite), other 2-byte types (ml_dtypes.bfloat16) are taken
 * as the bits. uint16 arrays, the bits themselves, never come here. */
static PyArrayObject *bf16_bits(PyArrayObject *arr, oi_label_t what, const char *given, oi_status_t **st)
{
    PyArray_Descr *d = PyArray_DESCR(arr);
    if (d->kind == 'b' || d->kind == 'i' || d->kind == 'u' || d->kind == 'f') {
        if ((*st = check_float_range(arr, OI_TYPE_BF16, what, given)) != NULL)
            return NULL;
        PyArrayObject *f = as_carray(arr, NPY_FLOAT32);
        if (f == NULL) {
            *st = py_error_status(what, "cannot convert to float32 for BF16");
            return NULL;
        }
        PyArrayObject *bits = (PyArrayObject *)PyArray_SimpleNew(PyArray_NDIM(f), PyArray_DIMS(f), NPY_UINT16);
        if (bits != NULL) {
            const float *src = PyArray_DATA(f);
            uint16_t *dst = PyArray_DATA(bits);
            for (npy_intp i = 0, n = PyArray_SIZE(f); i < n; i++)
                dst[i] = oi_float_to_bf16(src[i]);
        }
        Py_DECREF(f);
        if (bits == NULL)
            *st = py_error_status(what, "out of memory");
        return bits;
    }
    if (PyDataType_ELSIZE(d) == 2) {
        PyArray_Descr *u16 = PyArray_DescrFromType(NPY_UINT16);
        PyArrayObject *v = (PyArrayObject *)PyArray_View(arr, u16, NULL); /* steals u16 */
        if (v == NULL)
            *st = py_error_status(what, "cannot view as BF16 bits");
        return v;
    }
    *st = oi_status_new(OI_INTERNAL,
                        "%s '%s': expected BF16, got %s values; give numbers or bfloat16 bit patterns (uint16)",
                        what.kind, what.name, given);
    return NULL;
}

/* Converts `arr` (a new reference, of another dtype than `t`'s) to datatype `t`: the values
 * must fit, since numpy's casts would wrap integers and overflow floats to infinity without a
 * word. Conversions that change what a value means are refused: floats to integers (which
 * rounding?), numbers to BOOL, anything but bool/integer/float arrays to numbers. Returns the
 * converted array (a new reference) or NULL with *st set; takes the reference to `arr`. */
static PyArrayObject *convert_checked(PyArrayObject *arr, oi_dtype_t t, oi_label_t what, oi_status_t **st)
{
    char given[64];
    dtype_text(arr, given, sizeof(given));
    PyArrayObject *out = NULL;
    char from = PyArray_DESCR(arr)->kind;
    char to = t == OI_TYPE_BOOL ? 'b' : (t == OI_TYPE_FP16 || t == OI_TYPE_FP32 || t == OI_TYPE_FP64) ? 'f' : 'i';
    int numeric = from == 'b' || from == 'i' || from == 'u' || from == 'f';
    if (t == OI_TYPE_BF16) {
        out = bf16_bits(arr, what, given, st);
    } else if (from != 'b' && (to == 'b' || (to == 'i' && from == 'f') || !numeric)) {
        const char *hint = to == 'b' ? "only bool arrays convert to BOOL"
                           : numeric ? "floats are not converted to integers: round and cast them in the model"
                                     : "only bool, integer and float arrays convert to numbers";
        *st = oi_status_new(OI_INTERNAL, "%s '%s': expected %s, got %s values; %s", what.kind, what.name,
                            oi_dtype_name(t), given, hint);
    } else {
        PyArray_Descr *want = PyArray_DescrFromType(oi_py_typenum(t));
        if (!PyArray_CanCastArrayTo(arr, want, NPY_SAFE_CASTING))
            *st = to == 'i' ? check_int_range(arr, t, what, given) : check_float_range(arr, t, what, given);
        if (*st == NULL) {
            out = (PyArrayObject *)PyArray_CastToType(arr, want, 0); /* steals want */
            if (out == NULL)
                *st = py_error_status(what, "cast failed");
        } else {
            Py_DECREF(want);
        }
    }
    Py_DECREF(arr);
    return out;
}

oi_status_t *oi_py_to_tensor(PyObject *obj, oi_dtype_t t, const char *kind, const char *name, oi_tensor_t *out)
{
    const oi_label_t what = {kind, name};
    if (t == OI_TYPE_BYTES)
        return bytes_to_tensor(obj, what, out);
    int typenum = oi_py_typenum(t);
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(obj, NPY_NOTYPE, 0, 0, 0);
    if (arr == NULL)
        return py_error_status(what, "cannot convert to an array");
    oi_status_t *st = NULL;
    if (PyArray_NDIM(arr) > OI_MAX_DIMS) {
        st = oi_status_new(OI_INTERNAL, "%s '%s': %d dimensions, at most %d are supported", what.kind, what.name, PyArray_NDIM(arr), OI_MAX_DIMS);
        Py_DECREF(arr);
        return st;
    }
    if (PyArray_TYPE(arr) != typenum && (arr = convert_checked(arr, t, what, &st)) == NULL)
        return st;
    PyArrayObject *c = (PyArrayObject *)PyArray_GETCONTIGUOUS(arr);
    Py_DECREF(arr);
    if (c == NULL)
        return py_error_status(what, "cannot make the array contiguous");
    out->dtype = t;
    out->ndim = PyArray_NDIM(c);
    for (int i = 0; i < out->ndim; i++)
        out->shape[i] = PyArray_DIM(c, i);
    out->data = PyArray_DATA(c);
    out->byte_size = (size_t)PyArray_NBYTES(c);
    out->owner = oi_py_owner((PyObject *)c, out->data, out->byte_size);
    if (out->owner == NULL) {
        out->data = NULL;
        out->byte_size = 0;
        return oi_status_new(OI_INTERNAL, "%s '%s': out of memory", what.kind, what.name);
    }
    return NULL;
}

void oi_py_clear_thread_locals(void)
{
    PyObject *locals = PyThreadState_GetDict(); /* borrowed */
    if (locals != NULL)
        PyDict_Clear(locals);
}
