/* numpy <-> tensor bridging shared by the Python backend and the module: datatype mapping,
 * read-only array views of tensor memory, and tensor owners that keep an array alive. */
#ifndef OI_PYTHON_BRIDGE_H
#define OI_PYTHON_BRIDGE_H

#include "python/numpy_api.h"

#include "core/tensor.h"

/* The numpy type number that carries a datatype (BF16: NPY_UINT16 bit patterns, BYTES:
 * NPY_OBJECT), or -1. */
int oi_py_typenum(oi_dtype_t t);

/* Returns a new ndarray viewing the tensor's memory, read-only unless `writable`, whose base
 * keeps a reference to the tensor's owner (BYTES: a new object array of bytes). NULL with a
 * Python error set. Needs the GIL. */
PyObject *oi_py_array_view(const oi_tensor_t *t, int writable);

/* Like oi_py_array_view, but with `base` (not NULL) as the array's base when it already owns a
 * reference to the tensor's owner: arrays of one response then share one base object. */
PyObject *oi_py_array_view_base(const oi_tensor_t *t, int writable, PyObject *base);

/* Returns a new Python object that holds one reference to `owner` (a capsule), or NULL. */
PyObject *oi_py_owner_capsule(oi_buf_t *owner);

/* Returns a new owner (one reference) that keeps `obj` alive and releases it, GIL or no
 * GIL on the releasing thread, without ever blocking that thread on the GIL. Takes the
 * caller's reference to obj. NULL when out of memory (the reference is then dropped). */
oi_buf_t *oi_py_owner(PyObject *obj, void *data, size_t len);

/* Converts `obj` into a tensor of datatype `t` owned by a new owner: numpy arrays keep their
 * memory when already C-contiguous and of that type. Other bool, integer and float arrays
 * convert when every value fits `t` (never wrapped, never rounded to infinity); floats to
 * integers, numbers to BOOL and other kinds are refused. BF16 takes numbers (rounded) or
 * bit patterns (uint16, ml_dtypes.bfloat16); BYTES takes bytes or str elements. Error messages
 * name the tensor as "<kind> '<name>'", the expected datatype and the numpy dtype given. Needs
 * the GIL. Returns NULL or a status. */
oi_status_t *oi_py_to_tensor(PyObject *obj, oi_dtype_t t, const char *kind, const char *name, oi_tensor_t *out);

/* Releases the objects whose release was deferred. Call with the GIL held: executors do at
 * each call, the module at shutdown. */
void oi_py_owner_flush(void);

/* Empties the calling thread's thread-local values (threading.local) while its thread state
 * is whole; call it with the GIL held before that state is deleted. Deleting the state frees
 * them half-way through, and some extensions' destructors then deadlock or crash there
 * (gevent's hub, made on the thread by a finalizer the garbage collector ran there, does). */
void oi_py_clear_thread_locals(void);

#endif
