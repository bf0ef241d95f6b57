/* The client side of the _core module. */
#ifndef OI_PYTHON_CLIENT_H
#define OI_PYTHON_CLIENT_H

#include "python/numpy_api.h"

#include "client/tls_client.h"
#include "core/tensor.h"

/* _core.HttpConnection. */
extern PyTypeObject oi_py_conn_type;

/* _core.GrpcConnection and the _core.GrpcStream objects it opens (python/grpc_client.c). */
extern PyTypeObject oi_py_grpc_conn_type;
extern PyTypeObject oi_py_grpc_stream_type;

/* Helpers the two connection types share (python/client.c). */

/* Parses a connection's constructor arguments (host, port, tls=(ca_file, cert_file, key_file,
 * verify) or None) and checks the port; *has_tls says whether `tls` was filled (its strings
 * point into the arguments: copy them before they go). 0, or -1 with a Python error set. */
int oi__py_conn_args(PyObject *args, PyObject *kw, const char **host, int *port, oi_ctls_config_t *tls,
                     int *has_tls);

/* Takes a connection's lock for one call without waiting: a connection is one byte stream,
 * so a second thread gets a clear error rather than a wait. `open` is 0 once the connection
 * is closed. 0, or -1 with RuntimeError set. */
int oi__py_conn_acquire(PyThread_type_lock lock, int open);

/* Blocking client I/O without the GIL that Ctrl-C interrupts: between begin and end, a wait
 * that a signal interrupts runs Python's signal handlers (taking the GIL for that), and one
 * that raises (KeyboardInterrupt) makes the I/O fail at once with its connection closed, so
 * that the server drops the request. After end, `raised` says so and the exception is set:
 * the caller returns NULL with it, whatever the I/O returned. */
typedef struct oi_py_io_s {
    PyThreadState *ts;
    int raised;
} oi_py_io_t;
void oi__py_io_begin(oi_py_io_t *io);
void oi__py_io_end(oi_py_io_t *io);

/* A call's `timeout` argument (seconds, None) as milliseconds: 0 for none, at least 1
 * otherwise; -1 with a Python error set when it is not a positive number. */
int64_t oi__py_timeout_ms(PyObject *timeout);

/* Turns a sequence of (name, datatype, array-like) triples into tensors owning their memory
 * (zero-copy for C-contiguous arrays of the datatype): *out is a new array of *n tensors, each
 * with its owner reference and its name borrowed from the caller's tuple. 0, or -1 with a
 * Python error set (*out then holds the tensors made so far: clear them and free it). */
int oi__py_collect_inputs(PyObject *seq, oi_tensor_t **out, uint32_t *n);

/* (model_name, model_version, id, {name: ndarray}, {name: datatype}) for a decoded response
 * whose outputs are result->inputs: outputs that live in result->body view it, all through
 * one shared base object. A new reference, or NULL with a Python error set. Needs the GIL. */
PyObject *oi__py_infer_result(const oi_request_t *result, const char *model_name, const char *model_version);

#endif
