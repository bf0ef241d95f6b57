/* The CPython module openinfer._core: the Server type over the C server. The contract is
 * python/openinfer/_core.pyi. */
#define OI_NUMPY_IMPORT
#include "python/numpy_api.h"

#include <errno.h>
#include <structmember.h>

#include "backends/identity_backend.h"
#include "backends/process_backend.h"
#include "backends/python_backend.h"
#include "backends/onnx_backend.h"
#include "backends/torch_backend.h"
#include "core/cpus.h"
#include "python/bls.h"
#include "python/bridge.h"
#include "python/client.h"
#include "python/onnx_module.h"
#include "python/pb_objects.h"
#include "python/triton_execute.h"
#include "python/torch_module.h"
#include "python/worker.h"
#include "server/classify.h"
#include "server/sched/ensemble.h"
#include "server/server.h"
#include "server/sched/warmup.h"
#include "transport/loop.h"
#include "transport/hdr_forward.h"
#include "transport/peer.h"

typedef struct {
    PyObject_HEAD
    oi_server_config_t cfg;
    char host[256];
    char metrics_host[256];              /* --metrics-address; "" for host */
    char grpc_host[256];                 /* --grpc-address; "" for host */
    char http_fwd[1024], grpc_fwd[1024]; /* the header forward patterns (copied: the server keeps them) */
    char http_unix[108], grpc_unix[108]; /* "" when not served */
    char access_log[4096]; /* the access log's path, "" for none */
    char trace_file[4096]; /* the trace extension's file, "" for none */
    oi_server_t *server; /* NULL once stopped */
    int started;
    unsigned max_sequence_backlog; /* each sequence model's backlog bound (0: none) */
    oi_tls_ctx_t *http_tls, *grpc_tls; /* ours; the servers take their own references */
} ServerObject;

/* A header forward pattern: copied into `dst` when it compiles, else a ValueError naming
 * `what` and regcomp's reason. NULL: none. 0 or -1. */
static int check_forward_pattern(const char *what, const char *pattern, char *dst, size_t cap)
{
    if (pattern == NULL)
        return 0;
    if (pattern[0] == '\0' || strlen(pattern) >= cap) {
        PyErr_Format(PyExc_ValueError, "%s must be a regular expression of 1 to %zu bytes", what, cap - 1);
        return -1;
    }
    regex_t re;
    int rc = oi_hdr_forward_compile(&re, pattern);
    if (rc != 0) {
        char why[128];
        regerror(rc, &re, why, sizeof(why));
        PyErr_Format(PyExc_ValueError, "%s %s is not a regular expression openinfer takes: %s", what, pattern, why);
        return -1;
    }
    regfree(&re);
    snprintf(dst, cap, "%s", pattern);
    return 0;
}

/* Fills `t` from a sequence of (group, header, value) strings, the restricted APIs of one
 * protocol as openinfer.server parsed them from tritonserver's flags (None: none). 0, or -1
 * with an exception. The value is a key: it never goes into an error. */
static int parse_restricted(PyObject *seq, const char *what, oi_restricted_t *t)
{
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, "restricted APIs must be a sequence of (group, header, value)");
    if (fast == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && rc == 0; i++) {
        const char *group, *header, *value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "sss", &group, &header, &value)) {
            rc = -1;
            break;
        }
        int g = 0;
        while (g < OI_API_COUNT && strcmp(oi_api_group_names[g], group) != 0)
            g++;
        if (g == OI_API_COUNT || header[0] == '\0' || value[0] == '\0') {
            PyErr_Format(PyExc_ValueError, "%s: expected a group of tritonserver's, a header and a value; got '%.100s'",
                         what, group);
            rc = -1;
        } else if ((rc = oi_restricted_set(t, (oi_api_group_t)g, header, value)) == -2) {
            PyErr_Format(PyExc_ValueError, "%s: '%s' is restricted twice", what, group);
        } else if (rc == -1) {
            PyErr_NoMemory();
        }
    }
    Py_DECREF(fast);
    return rc;
}

/* A TLS context from serve()'s (cert, key, root_cert or None, mutual) for `proto`; NULL with
 * ValueError naming the file and OpenSSL's reason. `alpn` is the protocol offered. */
static oi_tls_ctx_t *tls_from_spec(PyObject *spec, const char *proto, const char *alpn)
{
    const char *cert = NULL, *key = NULL, *ca = NULL;
    int mutual = 0;
    if (!PyArg_ParseTuple(spec, "ssz|p", &cert, &key, &ca, &mutual)) {
        PyErr_Format(PyExc_ValueError, "%s_tls must be (server_cert, server_key, root_cert or None, mutual)", proto);
        return NULL;
    }
    oi_tls_config_t cfg = {.cert_file = cert, .key_file = key, .ca_file = ca, .mutual = mutual, .alpn = alpn};
    char err[512];
    oi_tls_ctx_t *ctx;
    Py_BEGIN_ALLOW_THREADS
    ctx = oi_tls_ctx_new(&cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (ctx == NULL)
        PyErr_Format(PyExc_ValueError, "%s TLS: %s", proto, err);
    return ctx;
}

static int Server_init(ServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"host",
                             "http_port",
                             "threads",
                             "max_body_bytes",
                             "max_header_bytes",
                             "max_connections",
                             "header_timeout_ms",
                             "idle_timeout_ms",
                             "max_json_depth",
                             "grpc_port",
                             "grpc_max_message_bytes",
                             "allow_shared_memory",
                             "max_connections_per_peer",
                             "first_byte_timeout_ms",
                             "body_timeout_ms",
                             "grpc_max_queued_bytes",
                             "statistics",
                             "metrics_port",
                             "metrics_counter_latencies",
                             "metrics_histogram_latencies",
                             "metrics_cpu",
                             "metrics_gpu",
                             "http_unix",
                             "grpc_unix",
                             "unix_socket_mode",
                             "grpc_infer_compression_level",
                             "access_log",
                             "trace_file",
                             "metrics_address",
                             "metrics_interval_ms",
                             "metrics_summary_latencies",
                             "metrics_summary_quantiles",
                             "http_listen_fd",
                             "grpc_listen_fd",
                             "metrics_listen_fd",
                             "response_cache_bytes",
                             "max_sequence_backlog",
                             "max_inflight_body_bytes",
                             "max_inflate_ratio",
                             "body_min_rate",
                             "http_restricted",
                             "grpc_restricted",
                             "grpc_address",
                             "strict_readiness",
                             "http_header_forward_pattern",
                             "grpc_header_forward_pattern",
                             "http_tls",
                             "grpc_tls",
                             NULL};
    const char *host = "127.0.0.1";
    int port = 8000, threads = 0, max_conn = 4096, grpc_port = 8001, max_per_peer = 0;
    unsigned long long max_body = 64ull << 20, max_header = 64 << 10, header_to = 30000, idle_to = 300000;
    unsigned long long first_byte_to = 5000, body_to = 30000;
    unsigned long long grpc_max = 2ull << 30, grpc_queued = 64ull << 20;
    unsigned int depth = 64;
    PyObject *allow_shm = Py_None;
    int statistics = 1, metrics_port = -1, counter_lat = 1, histogram_lat = 0, metrics_cpu = 1, metrics_gpu = 1;
    const char *http_unix = NULL, *grpc_unix = NULL, *access_log = NULL, *trace_file = NULL, *metrics_host = NULL;
    unsigned int metrics_interval = 2000;
    int summary_lat = 0;
    PyObject *quantiles = Py_None;
    unsigned int unix_mode = 0660;
    int compression_level = 0, http_fd = 0, grpc_fd = 0, metrics_fd = 0;
    unsigned long long cache_bytes = 0;
    /* Sequences that may wait for a slot of one model: room for a load test's worth of
     * clients beyond the slots, not for one client's flood of STARTs (each holds its request). */
    unsigned int seq_backlog = 1000;
    long long inflight_bytes = 0;
    int inflate_ratio = 1000, body_min_rate = 500;
    PyObject *http_restricted = Py_None, *grpc_restricted = Py_None;
    const char *grpc_host = NULL; /* --grpc-address; NULL: host */
    int strict_readiness = 1;
    const char *http_fwd = NULL, *grpc_fwd = NULL; /* the header forward patterns; NULL: none */
    PyObject *http_tls = Py_None, *grpc_tls = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "|si$iKKiKKIiKOiKKKpippppzzIizzzIpOiiiKILiiOOzpzzOO", kwlist, &host, &port, &threads, &max_body,
            &max_header, &max_conn, &header_to, &idle_to, &depth, &grpc_port, &grpc_max, &allow_shm, &max_per_peer,
            &first_byte_to, &body_to, &grpc_queued, &statistics, &metrics_port, &counter_lat, &histogram_lat,
            &metrics_cpu, &metrics_gpu, &http_unix, &grpc_unix, &unix_mode, &compression_level, &access_log,
            &trace_file, &metrics_host, &metrics_interval, &summary_lat, &quantiles, &http_fd, &grpc_fd, &metrics_fd,
            &cache_bytes, &seq_backlog, &inflight_bytes, &inflate_ratio, &body_min_rate, &http_restricted,
            &grpc_restricted, &grpc_host, &strict_readiness, &http_fwd, &grpc_fwd, &http_tls, &grpc_tls))
        return -1;
    if (http_fd < 0 || grpc_fd < 0 || metrics_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a listen_fd must be a listening socket's descriptor (> 0), or 0");
        return -1;
    }
    if (trace_file != NULL && (trace_file[0] == '\0' || strlen(trace_file) >= sizeof(self->trace_file) - 16)) {
        PyErr_Format(PyExc_ValueError, "trace_file must be a path of 1 to %zu bytes", sizeof(self->trace_file) - 17);
        return -1;
    }
    if (access_log != NULL && (access_log[0] == '\0' || strlen(access_log) >= sizeof(self->access_log))) {
        PyErr_Format(PyExc_ValueError, "access_log must be a path of 1 to %zu bytes, or \"-\" for standard output",
                     sizeof(self->access_log) - 1);
        return -1;
    }
    if (metrics_host != NULL && (metrics_host[0] == '\0' || strlen(metrics_host) >= sizeof(self->metrics_host))) {
        PyErr_Format(PyExc_ValueError, "metrics_address must be a host of 1 to %zu bytes",
                     sizeof(self->metrics_host) - 1);
        return -1;
    }
    if (grpc_host != NULL && (grpc_host[0] == '\0' || strlen(grpc_host) >= sizeof(self->grpc_host))) {
        PyErr_Format(PyExc_ValueError, "grpc_address must be a host of 1 to %zu bytes", sizeof(self->grpc_host) - 1);
        return -1;
    }
    if (check_forward_pattern("http_header_forward_pattern", http_fwd, self->http_fwd, sizeof(self->http_fwd)) != 0 ||
        check_forward_pattern("grpc_header_forward_pattern", grpc_fwd, self->grpc_fwd, sizeof(self->grpc_fwd)) != 0)
        return -1;
    double qs[16];
    int nq = 0;
    if (quantiles != Py_None) {
        PyObject *fast = PySequence_Fast(quantiles, "metrics_summary_quantiles must be a sequence of floats");
        if (fast == NULL)
            return -1;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
        for (Py_ssize_t i = 0; i < len && nq < 16; i++) {
            qs[nq] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
            if (!(qs[nq] >= 0 && qs[nq] <= 1)) {
                Py_DECREF(fast);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "metrics_summary_quantiles: each quantile is 0 to 1");
                return -1;
            }
            nq++;
        }
        Py_DECREF(fast);
        if (len > 16) {
            PyErr_SetString(PyExc_ValueError, "metrics_summary_quantiles: at most 16 quantiles");
            return -1;
        }
    }
    if (metrics_interval == 0) {
        PyErr_SetString(PyExc_ValueError, "metrics_interval_ms must be at least 1");
        return -1;
    }
    if (metrics_port < -1 || metrics_port > 65535) {
        PyErr_Format(PyExc_ValueError, "metrics_port must be 0 to 65535, or -1 for no metrics, got %d", metrics_port);
        return -1;
    }
    const char *paths[2] = {http_unix, grpc_unix};
    for (int i = 0; i < 2; i++)
        if (paths[i] != NULL && (paths[i][0] == '\0' || strlen(paths[i]) >= sizeof(self->http_unix))) {
            PyErr_Format(PyExc_ValueError, "%s must be a socket path of 1 to %zu bytes, got %zu",
                         i ? "grpc_unix" : "http_unix", sizeof(self->http_unix) - 1, strlen(paths[i]));
            return -1;
        }
    if (compression_level < 0 || compression_level > 3) {
        PyErr_Format(PyExc_ValueError, "grpc_infer_compression_level must be 0 (none) to 3 (high), got %d",
                     compression_level);
        return -1;
    }
    if (unix_mode > 0777) {
        PyErr_Format(PyExc_ValueError, "unix_socket_mode must be permission bits 0 to 0o777, got 0o%o", unix_mode);
        return -1;
    }
    int allow = allow_shm == Py_None ? -1 : PyObject_IsTrue(allow_shm);
    if (allow == -1 && allow_shm != Py_None)
        return -1;
    if (port < (http_unix ? -1 : 0) || port > 65535) {
        PyErr_Format(PyExc_ValueError, "http_port must be 0 to 65535%s, got %d",
                     http_unix ? ", or -1 for HTTP on http_unix only" : "", port);
        return -1;
    }
    if (grpc_port < -1 || grpc_port > 65535) {
        PyErr_Format(PyExc_ValueError, "grpc_port must be 0 to 65535, or -1 for no gRPC, got %d", grpc_port);
        return -1;
    }
    if (grpc_max == 0 || grpc_max > 0xffffffffull) {
        PyErr_Format(PyExc_ValueError, "grpc_max_message_bytes must be 1 to 4294967295, got %llu", grpc_max);
        return -1;
    }
    if (grpc_queued == 0 || grpc_queued > SIZE_MAX / 2) {
        PyErr_Format(PyExc_ValueError, "grpc_max_queued_bytes must be at least 1, got %llu", grpc_queued);
        return -1;
    }
    if (max_conn < 1) {
        PyErr_Format(PyExc_ValueError, "max_connections must be at least 1, got %d", max_conn);
        return -1;
    }
    if (max_per_peer < 0) {
        PyErr_Format(PyExc_ValueError, "max_connections_per_peer must be 0 (half of max_connections) or more, got %d",
                     max_per_peer);
        return -1;
    }
    if (inflight_bytes < 0) {
        PyErr_Format(PyExc_ValueError,
                     "max_inflight_body_bytes must be 0 (half of the memory the process may use) or more, got %lld",
                     inflight_bytes);
        return -1;
    }
    if (inflate_ratio < 0) {
        PyErr_Format(PyExc_ValueError, "max_inflate_ratio must be 0 (no limit) or more, got %d", inflate_ratio);
        return -1;
    }
    if (body_min_rate < 0) {
        PyErr_Format(PyExc_ValueError, "body_min_rate must be 0 (no minimum) or more bytes per second, got %d",
                     body_min_rate);
        return -1;
    }
    if (max_per_peer == 0) /* one address can never take every slot */
        max_per_peer = max_conn > 1 ? max_conn / 2 : 1;
    if (self->server != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Server is already initialized");
        return -1;
    }
    if (http_tls != Py_None && (self->http_tls = tls_from_spec(http_tls, "http", "http/1.1")) == NULL)
        return -1;
    if (grpc_tls != Py_None && (self->grpc_tls = tls_from_spec(grpc_tls, "grpc", "h2")) == NULL)
        return -1;
    snprintf(self->host, sizeof(self->host), "%s", host);
    snprintf(self->metrics_host, sizeof(self->metrics_host), "%s", metrics_host ? metrics_host : "");
    snprintf(self->grpc_host, sizeof(self->grpc_host), "%s", grpc_host ? grpc_host : "");
    snprintf(self->http_unix, sizeof(self->http_unix), "%s", http_unix ? http_unix : "");
    snprintf(self->grpc_unix, sizeof(self->grpc_unix), "%s", grpc_unix ? grpc_unix : "");
    snprintf(self->access_log, sizeof(self->access_log), "%s", access_log ? access_log : "");
    snprintf(self->trace_file, sizeof(self->trace_file), "%s", trace_file ? trace_file : "");
    self->cfg = (oi_server_config_t){
        .http = {.host = self->host,
                 .port = port,
                 .listen_fd = http_fd,
                 .unix_path = http_unix ? self->http_unix : NULL,
                 .unix_mode = unix_mode,
                 .threads = threads,
                 .max_body_bytes = (size_t)max_body,
                 .max_header_bytes = (size_t)max_header,
                 .max_connections = max_conn,
                 .max_connections_per_peer = max_per_peer,
                 .first_byte_timeout_ms = first_byte_to,
                 .header_timeout_ms = header_to,
                 .body_timeout_ms = body_to,
                 .body_min_rate = (uint32_t)body_min_rate,
                 .idle_timeout_ms = idle_to,
                 .tls = self->http_tls},
        .max_json_depth = depth,
        .grpc_port = grpc_port,
        .grpc_listen_fd = grpc_fd,
        .grpc_tls = self->grpc_tls,
        .grpc_unix_path = grpc_unix ? self->grpc_unix : NULL,
        .grpc_infer_compression_level = compression_level,
        .grpc_max_message_bytes = (size_t)grpc_max,
        .grpc_max_queued_bytes = (size_t)grpc_queued,
        .max_inflight_body_bytes = (size_t)inflight_bytes,
        .max_inflate_ratio = (unsigned)inflate_ratio,
        .allow_shared_memory = allow,
        .statistics = statistics,
        .metrics_port = metrics_port,
        .metrics_host = self->metrics_host[0] ? self->metrics_host : NULL,
        .grpc_host = self->grpc_host[0] ? self->grpc_host : NULL,
        .http_forward_pattern = http_fwd ? self->http_fwd : NULL,
        .grpc_forward_pattern = grpc_fwd ? self->grpc_fwd : NULL,
        .lax_readiness = !strict_readiness,
        .metrics_listen_fd = metrics_fd,
        .metrics = {.counter_latencies = counter_lat,
                    .histogram_latencies = histogram_lat,
                    .cpu = metrics_cpu,
                    .gpu = metrics_gpu,
                    .interval_ms = metrics_interval,
                    .summary_latencies = summary_lat,
                    .n_quantiles = nq},
        .access_log = self->access_log[0] ? self->access_log : NULL,
        .trace_file = self->trace_file[0] ? self->trace_file : NULL,
        .response_cache_bytes = (size_t)cache_bytes,
    };
    memcpy(self->cfg.metrics.quantiles, qs, (size_t)nq * sizeof(double));
    self->max_sequence_backlog = seq_backlog;
    oi_restricted_t restricted[2];
    memset(restricted, 0, sizeof(restricted));
    if (parse_restricted(http_restricted, "http_restricted", &restricted[0]) != 0 ||
        parse_restricted(grpc_restricted, "grpc_restricted", &restricted[1]) != 0) {
        oi_restricted_free(&restricted[0]);
        oi_restricted_free(&restricted[1]);
        return -1;
    }
    self->cfg.http_restricted = &restricted[0];
    self->cfg.grpc_restricted = &restricted[1];
    self->server = oi_server_new(&self->cfg);
    self->cfg.http_restricted = self->cfg.grpc_restricted = NULL; /* the server keeps its copies */
    oi_restricted_free(&restricted[0]);
    oi_restricted_free(&restricted[1]);
    if (self->server == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static oi_server_t *live_server(ServerObject *self)
{
    if (self->server == NULL)
        PyErr_SetString(PyExc_RuntimeError, "the server is stopped");
    return self->server;
}

static void stop_server(ServerObject *self, double timeout)
{
    oi_server_t *s = self->server;
    self->server = NULL;
    if (s == NULL)
        return;
    uint64_t ms = timeout > 0 ? (uint64_t)(timeout * 1000.0) : 0;
    Py_BEGIN_ALLOW_THREADS
    oi_server_stop(s, ms);
    Py_END_ALLOW_THREADS
    oi_py_owner_flush();
}

static void Server_dealloc(ServerObject *self)
{
    stop_server(self, 0);
    oi_tls_ctx_unref(self->http_tls);
    oi_tls_ctx_unref(self->grpc_tls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Server_set_metadata(ServerObject *self, PyObject *arg)
{
    oi_server_t *s = live_server(self);
    Py_buffer view;
    if (s == NULL || PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    int rc = oi_server_set_metadata(s, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (rc != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Parses a sequence of (name, datatype, shape[, flag]) into specs, the flag an input's
 * `optional` or an output's `shape_as_produced`; names point into the tuples' strings, valid
 * while `seq` lives. */
static int parse_specs(PyObject *seq, const char *what, oi_io_spec_t **out, uint32_t *n)
{
    PyObject *fast = PySequence_Fast(seq, "inputs/outputs must be a sequence of (name, datatype, shape)");
    if (fast == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    *out = calloc(count ? (size_t)count : 1, sizeof(oi_io_spec_t));
    *n = 0;
    if (*out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i), *shape;
        const char *name, *dtype;
        int flag = 0;
        oi_io_spec_t *s = &(*out)[i];
        if (!PyArg_ParseTuple(item, "ssO|p;each declaration is (name, datatype, shape[, flag])", &name, &dtype,
                              &shape, &flag))
            goto fail;
        for (Py_ssize_t j = 0; j < i; j++)
            if (strcmp((*out)[j].name, name) == 0) {
                PyErr_Format(PyExc_ValueError, "%s '%s' is declared twice", what, name);
                goto fail;
            }
        s->name = (char *)name;
        if (strcmp(what, "input") == 0)
            s->optional = (uint8_t)flag;
        else
            s->shape_as_produced = (uint8_t)flag;
        s->dtype = oi_dtype_from_name(dtype, strlen(dtype));
        if (s->dtype == OI_TYPE_INVALID) {
            PyErr_Format(PyExc_ValueError, "%s '%s': unknown datatype '%s'", what, name, dtype);
            goto fail;
        }
        if (shape == Py_None) { /* any shape */
            s->ndim = -1;
            (*n)++;
            continue;
        }
        PyObject *dims = PySequence_Fast(shape, "shape must be a sequence of ints or None");
        if (dims == NULL)
            goto fail;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims);
        if (nd > OI_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "%s '%s': %zd dimensions, at most %d", what, name, nd, OI_MAX_DIMS);
            Py_DECREF(dims);
            goto fail;
        }
        s->ndim = (int)nd;
        for (Py_ssize_t j = 0; j < nd; j++) {
            long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, j));
            if (d < -1 || (d == -1 && PyErr_Occurred())) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "%s '%s': dimension %zd is %lld; expected -1 or more", what, name,
                                 j, d);
                Py_DECREF(dims);
                goto fail;
            }
            s->dims[j] = d;
        }
        Py_DECREF(dims);
        (*n)++;
    }
    Py_DECREF(fast); /* the names stay valid: the caller's sequence holds the tuples */
    return 0;
fail:
    Py_DECREF(fast);
    free(*out);
    *out = NULL;
    return -1;
}

/* ---- model versions outside the registry ------------------------------------------------- */

/* A model version built by add_model(publish=False) and not yet swapped into the registry
 * (Server.swap_models takes it over). Lets a load build every version before any is served. */
typedef struct {
    PyObject_HEAD
    oi_model_t *model; /* the only reference; NULL once swapped in */
} ModelVersionObject;

static void ModelVersion_dealloc(ModelVersionObject *self)
{
    oi_model_t *m = self->model;
    self->model = NULL;
    if (m != NULL) {
        Py_BEGIN_ALLOW_THREADS /* a Python model's executors need the GIL to end */
        oi_model_retire(m);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ModelVersion_get_error(ModelVersionObject *self, void *closure)
{
    (void)closure;
    if (self->model == NULL || self->model->error == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(self->model->error);
}

static PyObject *ModelVersion_get_version(ModelVersionObject *self, void *closure)
{
    (void)closure;
    return self->model ? PyLong_FromLongLong(self->model->version) : Py_NewRef(Py_None);
}

/* load_seconds = x: how long loading took, for nv_model_load_duration_secs. */
static int ModelVersion_set_load_seconds(ModelVersionObject *self, PyObject *value, void *closure)
{
    (void)closure;
    double secs = value ? PyFloat_AsDouble(value) : -1.0;
    if (secs == -1.0 && PyErr_Occurred())
        return -1;
    if (self->model == NULL || !(secs >= 0 && secs < 1e9)) {
        PyErr_SetString(PyExc_ValueError, "load_seconds: 0 to 1e9 seconds, on a version not yet swapped in");
        return -1;
    }
    self->model->load_ns = (uint64_t)(secs * 1e9);
    return 0;
}

static PyObject *ModelVersion_get_load_seconds(ModelVersionObject *self, void *closure)
{
    (void)closure;
    return self->model ? PyFloat_FromDouble((double)self->model->load_ns / 1e9) : Py_NewRef(Py_None);
}

/* Builds request `i` of a warm-up sample: a list of (name, datatype, shape, bytes). Each input
 * gets its own buffer (data, then the name). 0, or -1 with an exception set. */
static int warmup_request(PyObject *spec, oi_request_t *r)
{
    PyObject *fast = PySequence_Fast(spec, "a warm-up request is a list of (name, datatype, shape, bytes)");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = -1;
    r->binary_data_output = -1;
    r->inputs = calloc(n ? (size_t)n : 1, sizeof(*r->inputs));
    if (r->inputs == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name, *dtype;
        PyObject *shape;
        Py_buffer data;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i),
                              "ssOy*;a warm-up input is (name, datatype, shape, bytes)", &name, &dtype, &shape, &data))
            goto out;
        oi_tensor_t *t = &r->inputs[r->n_inputs];
        size_t name_len = strlen(name);
        t->owner = oi_buf_new((size_t)data.len + name_len + 1);
        if (t->owner == NULL) {
            PyBuffer_Release(&data);
            PyErr_NoMemory();
            goto out;
        }
        r->n_inputs++;
        memcpy(t->owner->data, data.buf, (size_t)data.len);
        memcpy(t->owner->data + data.len, name, name_len + 1);
        t->owner->len = (size_t)data.len + name_len + 1;
        t->data = t->owner->data;
        t->byte_size = (size_t)data.len;
        t->name = t->owner->data + data.len;
        PyBuffer_Release(&data);
        t->dtype = oi_dtype_from_name(dtype, strlen(dtype));
        PyObject *dims = PySequence_Fast(shape, "a warm-up input's shape is a sequence of ints");
        if (dims == NULL)
            goto out;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims);
        if (t->dtype == OI_TYPE_INVALID || nd > OI_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "warm-up input '%s': datatype %s, %zd dimensions", name, dtype, nd);
            Py_DECREF(dims);
            goto out;
        }
        for (Py_ssize_t d = 0; d < nd; d++)
            t->shape[d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
        t->ndim = (int)nd;
        Py_DECREF(dims);
        if (PyErr_Occurred())
            goto out;
    }
    rc = 0;
out:
    Py_DECREF(fast);
    return rc;
}

/* warmup(requests) -> None, or the failures joined: runs one warm-up iteration (a list of
 * requests, each a list of inputs) through the version's scheduler and waits for it. */
static PyObject *ModelVersion_warmup(ModelVersionObject *self, PyObject *requests)
{
    oi_model_t *m = self->model;
    if (m == NULL || m->sched == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "warmup: the version is served already, or cannot serve");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(requests, "warmup() takes a list of requests");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    oi_request_t *reqs = calloc(n ? (size_t)n : 1, sizeof(*reqs));
    PyObject *ret = NULL;
    if (reqs == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (warmup_request(PySequence_Fast_GET_ITEM(fast, i), &reqs[i]) != 0)
            goto out;
    oi_status_t *st;
    Py_BEGIN_ALLOW_THREADS /* a Python model's executors need the GIL */
        st = oi_warmup_run(m, reqs, (size_t)n);
    Py_END_ALLOW_THREADS ret = st == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(st->message);
    oi_status_free(st);
out:
    for (Py_ssize_t i = 0; reqs != NULL && i < n; i++)
        oi_request_clear(&reqs[i]);
    free(reqs);
    Py_DECREF(fast);
    return ret;
}

static PyMethodDef ModelVersion_methods[] = {
    {"warmup", (PyCFunction)ModelVersion_warmup, METH_O,
     "warmup(requests) -> None or the failures: one warm-up iteration through the scheduler."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ModelVersion_getset[] = {
    {"error", (getter)ModelVersion_get_error, NULL, "Why the version cannot serve, or None.", NULL},
    {"load_seconds", (getter)ModelVersion_get_load_seconds, (setter)ModelVersion_set_load_seconds,
     "How long loading took (nv_model_load_duration_secs).", NULL},
    {"version", (getter)ModelVersion_get_version, NULL, "The version number (None once swapped in).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelVersionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.ModelVersion",
    .tp_basicsize = sizeof(ModelVersionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A model version built by Server.add_model(publish=False), not yet served.",
    .tp_dealloc = (destructor)ModelVersion_dealloc,
    .tp_getset = ModelVersion_getset,
    .tp_methods = ModelVersion_methods,
};

/* Wraps `m` (taking its reference) in a new ModelVersion; on failure `m` is retired. */
static PyObject *model_version_new(oi_model_t *m)
{
    ModelVersionObject *v = PyObject_New(ModelVersionObject, &ModelVersionType);
    if (v == NULL) {
        Py_BEGIN_ALLOW_THREADS
        oi_model_retire(m);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    v->model = m;
    return (PyObject *)v;
}

/* swap_models(add, remove, timeout=None): in one registry step, each ModelVersion of `add`
 * replaces the entry of its namespace, name and version, and each (name, version[, namespace])
 * of `remove` leaves; then
 * waits, without the GIL, for the requests in flight on the entries that left (at most
 * `timeout` seconds each, see oi_model_retire_within), and ends them. Returns the (name,
 * version) of those abandoned because a request still ran past the bound. */
static PyObject *Server_swap_models(ServerObject *self, PyObject *args)
{
    PyObject *add_o, *remove_o, *timeout_o = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O", &add_o, &remove_o, &timeout_o))
        return NULL;
    int64_t timeout_ms = -1;
    if (timeout_o != Py_None) {
        double secs = PyFloat_AsDouble(timeout_o);
        if (secs == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(secs >= 0.0 && secs <= 1e9)) {
            PyErr_Format(PyExc_ValueError, "timeout must be None or seconds in [0, 1e9], got %R", timeout_o);
            return NULL;
        }
        timeout_ms = (int64_t)(secs * 1000.0);
    }
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    PyObject *add = PySequence_Fast(add_o, "add must be a sequence of ModelVersion");
    PyObject *remove = add ? PySequence_Fast(remove_o, "remove must be a sequence of (name, version)") : NULL;
    if (remove == NULL) {
        Py_XDECREF(add);
        return NULL;
    }
    Py_ssize_t n_add = PySequence_Fast_GET_SIZE(add), n_remove = PySequence_Fast_GET_SIZE(remove);
    oi_model_t **models = calloc((size_t)n_add + 1, sizeof(*models));
    const char **names = calloc((size_t)n_remove + 1, sizeof(*names));
    const char **spaces = calloc((size_t)n_remove + 1, sizeof(*spaces));
    int64_t *versions = calloc((size_t)n_remove + 1, sizeof(*versions));
    oi_model_t **retired = NULL;
    size_t n_retired = 0;
    PyObject *ret = NULL;
    if (models == NULL || names == NULL || spaces == NULL || versions == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_add; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(add, i);
        if (!PyObject_TypeCheck(v, &ModelVersionType) || ((ModelVersionObject *)v)->model == NULL) {
            PyErr_SetString(PyExc_TypeError, "add must hold ModelVersion objects not yet swapped in");
            goto done;
        }
        models[i] = ((ModelVersionObject *)v)->model;
        for (Py_ssize_t j = 0; j < i; j++)
            if (models[j] == models[i]) {
                PyErr_SetString(PyExc_ValueError, "add holds one ModelVersion twice");
                goto done;
            }
    }
    for (Py_ssize_t i = 0; i < n_remove; i++) {
        long long v;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(remove, i), "sL|z;remove holds (name, version[, namespace])",
                              &names[i], &v, &spaces[i]))
            goto done;
        versions[i] = v;
    }
    /* The swap itself is quick and holds the GIL, so that a stop cannot free the server under it. */
    if (oi_server_swap_models(s, models, (size_t)n_add, spaces, names, versions, (size_t)n_remove, &retired,
                              &n_retired) != 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_add; i++)
        ((ModelVersionObject *)PySequence_Fast_GET_ITEM(add, i))->model = NULL; /* the registry's now */
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < n_retired; i++)
        if (oi_model_retire_within(retired[i], timeout_ms) == 0)
            retired[i] = NULL;
    Py_END_ALLOW_THREADS
    ret = PyList_New(0);
    for (size_t i = 0; ret != NULL && i < n_retired; i++) {
        PyObject *left = retired[i] == NULL ? NULL : Py_BuildValue("(sL)", retired[i]->name, (long long)retired[i]->version);
        if (retired[i] != NULL && (left == NULL || PyList_Append(ret, left) != 0))
            Py_CLEAR(ret);
        Py_XDECREF(left);
    }
done:
    free(retired);
    free(models);
    free(names);
    free(spaces);
    free(versions);
    Py_DECREF(add);
    Py_DECREF(remove);
    return ret;
}

/* ---- the model repository handler ------------------------------------------------------- */

static const char *const repo_ops[] = {"index", "load", "unload", "logging", "trace", "ready"};

/* A LIST parameter's strings as a Python list. */
static PyObject *param_list(const oi_repo_param_t *p)
{
    PyObject *list = PyList_New(0);
    for (size_t at = 0; list != NULL && at < p->len;) {
        size_t n = strlen(p->data + at);
        PyObject *item = PyUnicode_DecodeUTF8(p->data + at, (Py_ssize_t)n, "replace");
        if (item == NULL || PyList_Append(list, item) != 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
        at += n + 1;
    }
    return list;
}

/* The call's gRPC parameters as a dict of bool, int, str, bytes or list of str; None over HTTP. */
static PyObject *repo_params(const oi_repo_call_t *call)
{
    if (!call->grpc)
        return Py_NewRef(Py_None);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < call->n_params; i++) {
        const oi_repo_param_t *p = &call->params[i];
        PyObject *v = p->kind == OI_REPO_PARAM_BOOL     ? PyBool_FromLong((long)p->number)
                      : p->kind == OI_REPO_PARAM_INT    ? PyLong_FromLongLong(p->number)
                      : p->kind == OI_REPO_PARAM_STRING ? PyUnicode_DecodeUTF8(p->data, (Py_ssize_t)p->len, "replace")
                      : p->kind == OI_REPO_PARAM_LIST   ? param_list(p)
                                                        : PyBytes_FromStringAndSize(p->data, (Py_ssize_t)p->len);
        if (v == NULL || PyDict_SetItemString(d, p->name, v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* A status with `len` bytes of `text` as its message, each NUL byte written as backslash, 0: a message
 * quoting what a client sent (a file name, say) would otherwise end at its first NUL. */
static oi_status_t *status_escaping_nul(int code, const char *text, size_t len)
{
    if (memchr(text, '\0', len) == NULL)
        return oi_status_new(code, "%s", text);
    oi_sbuf_t b = {0};
    int bad = 0;
    for (const char *p = text, *end = text + len; p < end && bad == 0;) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        size_t n = nul ? (size_t)(nul - p) : (size_t)(end - p);
        bad |= oi_sbuf_append(&b, p, n);
        if (nul != NULL)
            bad |= oi_sbuf_append(&b, "\\0", 2);
        p += n + (nul != NULL);
    }
    oi_status_t *st = bad ? oi_status_new(code, "%.*s", (int)strnlen(text, len), text)
                          : oi_status_new(code, "%.*s", (int)b.len, b.data);
    oi_sbuf_free(&b);
    return st;
}

/* The status of the exception set: an openinfer.InferenceServerError keeps its status and
 * message, anything else is a 500 naming it. Clears the exception. */
static oi_status_t *repo_error(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int code = OI_INTERNAL;
    PyObject *status = value ? PyObject_GetAttrString(value, "status") : NULL;
    PyObject *message = status ? PyObject_GetAttrString(value, "message") : NULL;
    if (status != NULL && PyLong_Check(status) && message != NULL && PyUnicode_Check(message)) {
        long c = PyLong_AsLong(status);
        code = oi_status_code_valid(c) ? (int)c : OI_INTERNAL;
    } else {
        Py_XDECREF(message);
        message = value ? PyObject_Str(value) : NULL;
    }
    PyErr_Clear();
    Py_ssize_t len = 0;
    const char *text = message ? PyUnicode_AsUTF8AndSize(message, &len) : NULL;
    PyErr_Clear();
    oi_status_t *st = text != NULL ? status_escaping_nul(code, text, (size_t)len)
                                   : oi_status_new(code, "the model repository handler failed");
    Py_XDECREF(status);
    Py_XDECREF(message);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return st;
}

/* An index line's field: None stays absent (NULL), anything else is its str(). */
static int entry_field(PyObject *v, const char **out)
{
    *out = NULL;
    if (v == Py_None)
        return 0;
    *out = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (*out == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "index entries are (name, version, state, reason) of str or None");
    return *out ? 0 : -1;
}

static int repo_entries(oi_repo_call_t *call, PyObject *result)
{
    PyObject *fast = PySequence_Fast(result, "the repository handler returns a list of index entries");
    if (fast == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *n, *v, *st, *why;
        const char *f[4];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OOOO", &n, &v, &st, &why) || entry_field(n, &f[0]) ||
            entry_field(v, &f[1]) || entry_field(st, &f[2]) || entry_field(why, &f[3]))
            rc = -1;
        else if (oi_repo_call_add_entry(call, f[0], f[1], f[2], f[3]) != 0) {
            PyErr_NoMemory();
            rc = -1;
        }
    }
    Py_DECREF(fast);
    return rc;
}

/* A list of str as a LIST parameter's bytes (each string NUL-terminated, back to back). */
static int list_bytes(PyObject *v, oi_sbuf_t *out)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
        Py_ssize_t n = 0;
        PyObject *item = PyList_GET_ITEM(v, i);
        const char *text = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &n) : NULL;
        if (text == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a setting's list holds str");
            return -1;
        }
        if (memchr(text, '\0', (size_t)n) != NULL) {
            PyErr_SetString(PyExc_ValueError, "a setting's str holds no NUL");
            return -1;
        }
        if (oi_sbuf_append(out, text, (size_t)n + 1) != 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* A settings answer: (name, value) pairs, each value a bool, an int (0 to 2**32-1), a str or a
 * list of str. */
static int repo_results(oi_repo_call_t *call, PyObject *result)
{
    PyObject *fast = PySequence_Fast(result, "a settings handler returns a list of (name, value)");
    if (fast == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(fast); i++) {
        const char *name;
        PyObject *v;
        Py_ssize_t len = 0;
        const char *text = NULL;
        long long number = 0;
        oi_repo_param_kind_t kind = OI_REPO_PARAM_STRING;
        oi_sbuf_t list = {0};
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "sO", &name, &v)) {
            rc = -1;
        } else if (PyList_Check(v)) {
            kind = OI_REPO_PARAM_LIST;
            rc = list_bytes(v, &list);
            text = list.data;
            len = (Py_ssize_t)list.len;
        } else if (PyBool_Check(v)) {
            kind = OI_REPO_PARAM_BOOL;
            number = v == Py_True;
        } else if (PyLong_Check(v)) {
            kind = OI_REPO_PARAM_INT;
            number = PyLong_AsLongLong(v);
            if (PyErr_Occurred() || number < 0 || number > UINT32_MAX) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "a setting's int is 0 to 2**32-1");
                rc = -1;
            }
        } else if ((text = PyUnicode_Check(v) ? PyUnicode_AsUTF8AndSize(v, &len) : NULL) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a setting is a bool, an int or a str");
            rc = -1;
        }
        if (rc == 0 && oi_repo_call_add_result(call, name, kind, number, text, (size_t)len) != 0) {
            PyErr_NoMemory();
            rc = -1;
        }
        oi_sbuf_free(&list);
    }
    Py_DECREF(fast);
    return rc;
}

/* Runs on a control thread: handler(op, model, body, params, ready, stop), `stop` a one-byte
 * memoryview of call->stop (non-zero once the client has gone), released when the handler
 * returns: the handler must not keep it. */
static void repo_call(void *ctx, oi_repo_call_t *call)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *handler = ctx;
    PyObject *body =
        call->body ? PyBytes_FromStringAndSize(call->body->data, (Py_ssize_t)call->body->len) : Py_NewRef(Py_None);
    /* READY's one parameter is the version asked about. */
    PyObject *params = call->op == OI_REPO_READY ? Py_BuildValue("{s:L}", "version", (long long)call->version)
                                                 : repo_params(call);
    PyObject *stop = PyMemoryView_FromMemory((char *)&call->stop, 1, PyBUF_WRITE);
    PyObject *result = NULL;
    if (body != NULL && params != NULL && stop != NULL)
        result = PyObject_CallFunction(handler, "szOOOO", repo_ops[call->op], call->model, body, params,
                                       call->ready ? Py_True : Py_False, stop);
    if (result != NULL && call->op == OI_REPO_INDEX && repo_entries(call, result) != 0)
        Py_CLEAR(result);
    if (result != NULL && (call->op == OI_REPO_LOGGING || call->op == OI_REPO_TRACE) && repo_results(call, result) != 0)
        Py_CLEAR(result);
    if (result != NULL && call->op == OI_REPO_READY && (call->ready = PyObject_IsTrue(result)) < 0)
        Py_CLEAR(result);
    if (result == NULL)
        call->status = repo_error();
    Py_XDECREF(result);
    Py_XDECREF(body);
    Py_XDECREF(params);
    if (stop != NULL) { /* call->stop goes with the call: no view of it may outlive this */
        PyObject *released = PyObject_CallMethod(stop, "release", NULL);
        if (released == NULL)
            PyErr_WriteUnraisable(handler);
        Py_XDECREF(released);
        Py_DECREF(stop);
    }
    oi_py_clear_thread_locals(); /* PyGILState_Release deletes this control thread's state */
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(handler);
    PyGILState_Release(g);
}

static void repo_release(void *ctx)
{
    if (!Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(g);
}

/* set_repository(handler): serves the model repository extension through handler(op, model,
 * body, params, ready), called on a control thread. */
static PyObject *Server_set_repository(ServerObject *self, PyObject *handler)
{
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    if (!PyCallable_Check(handler)) {
        PyErr_SetString(PyExc_TypeError, "the repository handler must be callable");
        return NULL;
    }
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "set_repository() comes before start()");
        return NULL;
    }
    oi_server_set_repository(s, repo_call, Py_NewRef(handler), repo_release);
    Py_RETURN_NONE;
}

/* On a libuv worker thread, for /v1/chat/completions: renderer(model, version, messages) gives
 * the prompt (a str); an exception with .status and .message answers that status. */
static oi_status_t *chat_render(void *ctx, const char *model, int64_t version, const char *messages, size_t len,
                                oi_sbuf_t *prompt)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *result = PyObject_CallFunction(ctx, "sLy#", model, (long long)version, messages, (Py_ssize_t)len);
    Py_ssize_t n = 0;
    const char *text = result != NULL && PyUnicode_Check(result) ? PyUnicode_AsUTF8AndSize(result, &n) : NULL;
    oi_status_t *st = NULL;
    if (text == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the chat renderer must return a str");
        st = repo_error();
    } else if (oi_sbuf_append(prompt, text, (size_t)n) != 0) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
    }
    Py_XDECREF(result);
    oi_py_clear_thread_locals(); /* PyGILState_Release deletes this thread's state */
    PyGILState_Release(g);
    return st;
}

/* set_chat_renderer(renderer): serves /v1/chat/completions, renderer(model, version, messages)
 * making each request's prompt on a worker thread. */
static PyObject *Server_set_chat_renderer(ServerObject *self, PyObject *renderer)
{
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    if (!PyCallable_Check(renderer)) {
        PyErr_SetString(PyExc_TypeError, "the chat renderer must be callable");
        return NULL;
    }
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "set_chat_renderer() comes before start()");
        return NULL;
    }
    oi_server_set_chat_renderer(s, chat_render, Py_NewRef(renderer), repo_release);
    Py_RETURN_NONE;
}

/* A new buffer holding a copy of a Python buffer's bytes, or NULL (out of memory). */
static oi_buf_t *buf_copy(const Py_buffer *b)
{
    oi_buf_t *out = oi_buf_new((size_t)b->len);
    if (out != NULL) {
        memcpy(out->data, b->buf, (size_t)b->len);
        out->len = (size_t)b->len;
    }
    return out;
}

/* Latency summaries for a new model's statistics when the server reports them. 0, or -1
 * with MemoryError set. */
static int summaries_for(ServerObject *self, oi_model_t *m)
{
    if (!self->cfg.metrics.summary_latencies || !self->cfg.statistics || self->cfg.metrics_port < 0)
        return 0;
    if (oi_stats_enable_summaries(oi_scheduler_stats(m->sched), m->cache != NULL) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Starts m's executors for its backend and state (both set), the statistics' summaries with
 * them; batch NULL: no batching. 0, or -1 with the exception set. */
static int start_executors(ServerObject *self, oi_model_t *m, int instances, const oi_batching_t *batch)
{
    char err[256];
    m->sched = oi_scheduler_new_batching(m->backend, m->state, instances, batch, err, sizeof(err));
    if (m->sched == NULL) {
        PyErr_Format(PyExc_RuntimeError, "model '%s': %s", m->name, err);
        return -1;
    }
    return summaries_for(self, m);
}

/* add_model's labels: {output name: the bytes of its label file}. Returns 0, or -1 with an
 * exception set. */
static int set_labels(oi_model_t *m, PyObject *labels)
{
    if (!PyDict_Check(labels)) {
        PyErr_SetString(PyExc_TypeError, "labels must be a dict of output name to bytes");
        return -1;
    }
    if (PyDict_Size(labels) == 0)
        return 0;
    if ((m->labels = calloc(m->n_outputs ? m->n_outputs : 1, sizeof(*m->labels))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < m->n_outputs; i++) {
        PyObject *text = PyDict_GetItemString(labels, m->outputs[i].name); /* borrowed */
        if (text == NULL)
            continue;
        if (!PyBytes_Check(text)) {
            PyErr_Format(PyExc_TypeError, "labels of output '%s' must be bytes", m->outputs[i].name);
            return -1;
        }
        m->labels[i] = oi_labels_parse(PyBytes_AS_STRING(text), (size_t)PyBytes_GET_SIZE(text));
        if (m->labels[i] == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* What a malformed sequence_batching tuple is told. */
#define SEQUENCE_TUPLE "sequence_batching is (slots, idle_us, controls, states, direct, states_follow_outputs)"

/* add_model's sequence_batching: (slots, idle_us, controls, states, direct,
 * states_follow_outputs), where a control is (name, kind, datatype, false_value, true_value), a
 * state is (input_name, output_name, datatype, dims, initial_bytes), direct is None (the Oldest
 * strategy) or the Direct strategy's (max_queue_delay_us, minimum_slot_utilization) and
 * states_follow_outputs is oi_seq_config_t's (a bool); the repository has checked them
 * against the model. Returns the batcher in front of `sched` (`instances` executors), with at
 * most `max_backlog` sequences waiting for a slot (0: any number), or NULL with an exception
 * set. */
static oi_seq_t *make_sequence_batcher(PyObject *spec, const char *name, int max_batch, int instances,
                                       unsigned max_backlog, oi_scheduler_t *sched)
{
    int slots, follow;
    unsigned long long idle;
    PyObject *controls, *states, *direct;
    oi_seq_direct_t dir = {0, 0, 0.0};
    if (!PyArg_ParseTuple(spec, "iKO!O!Op;" SEQUENCE_TUPLE, &slots, &idle, &PyList_Type, &controls, &PyList_Type,
                          &states, &direct, &follow))
        return NULL;
    if (direct != Py_None) {
        if (!PyArg_ParseTuple(direct, "Kd;direct is (max_queue_delay_us, minimum_slot_utilization)",
                              &dir.max_queue_delay_us, &dir.min_slot_utilization))
            return NULL;
        dir.instances = instances > 0 ? instances : 1;
    }
    Py_ssize_t nc = PyList_GET_SIZE(controls), ns = PyList_GET_SIZE(states);
    oi_seq_control_t *c = calloc((size_t)nc + 1, sizeof(*c));
    oi_seq_state_t *st = calloc((size_t)ns + 1, sizeof(*st));
    oi_seq_t *q = NULL;
    if (c == NULL || st == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nc; i++) {
        const char *dtype;
        int kind;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(controls, i), "sisdd;a control is (name, kind, datatype, false, true)",
                              &c[i].name, &kind, &dtype, &c[i].false_true[0], &c[i].false_true[1]))
            goto done;
        c[i].kind = (oi_seq_control_kind_t)kind;
        c[i].dtype = oi_dtype_from_name(dtype, strlen(dtype));
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        const char *dtype;
        PyObject *dims;
        Py_buffer init;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(states, i), "sssOy*;a state is (input, output, datatype, dims, initial)",
                              &st[i].input_name, &st[i].output_name, &dtype, &dims, &init))
            goto done;
        st[i].initial = init.buf; /* the bytes object lives in `states` */
        st[i].initial_size = (size_t)init.len;
        PyBuffer_Release(&init);
        st[i].dtype = oi_dtype_from_name(dtype, strlen(dtype));
        PyObject *fast = PySequence_Fast(dims, "state dims must be a sequence of ints");
        if (fast == NULL)
            goto done;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(fast);
        for (Py_ssize_t d = 0; d < nd && d < OI_MAX_DIMS; d++)
            st[i].dims[d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, d));
        st[i].ndim = (int)(nd < OI_MAX_DIMS ? nd : OI_MAX_DIMS);
        Py_DECREF(fast);
        if (PyErr_Occurred())
            goto done;
    }
    oi_seq_config_t cfg = {name, max_batch, slots, idle, max_backlog, c, (uint32_t)nc, st, (uint32_t)ns, dir, follow};
    char err[256];
    q = oi_seq_new(&cfg, sched, err, sizeof(err));
    if (q == NULL)
        PyErr_Format(PyExc_RuntimeError, "model '%s': %s", name, err);
done:
    free(c);
    free(st);
    return q;
}

/* The tensors a sequence model's backend sees beyond the declared ones: `specs` followed by,
 * for inputs (`outputs` 0), each control and each state input of a sequence_batching tuple,
 * and for outputs each state output not already declared, in that order (the order
 * openinfer.torch_model maps forward() with). Names are borrowed; *n becomes the new count.
 * Returns a new array, or NULL with an exception set. */
static oi_io_spec_t *with_sequence_tensors(PyObject *sequence, const oi_io_spec_t *specs, uint32_t *n, int outputs)
{
    PyObject *lists[2] = {NULL, NULL}; /* controls, states */
    if (sequence != Py_None) {
        if (!PyTuple_Check(sequence) || PyTuple_GET_SIZE(sequence) != 6 ||
            !PyList_Check(PyTuple_GET_ITEM(sequence, 2)) || !PyList_Check(PyTuple_GET_ITEM(sequence, 3))) {
            PyErr_SetString(PyExc_TypeError, SEQUENCE_TUPLE);
            return NULL;
        }
        lists[0] = outputs ? NULL : PyTuple_GET_ITEM(sequence, 2);
        lists[1] = PyTuple_GET_ITEM(sequence, 3);
    }
    size_t cap = *n + 1;
    for (int l = 0; l < 2; l++)
        cap += lists[l] ? (size_t)PyList_GET_SIZE(lists[l]) : 0;
    oi_io_spec_t *out = calloc(cap, sizeof(*out));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, specs, *n * sizeof(*out));
    uint32_t k = *n;
    for (int l = 0; l < 2; l++)
        for (Py_ssize_t i = 0; lists[l] != NULL && i < PyList_GET_SIZE(lists[l]); i++) {
            PyObject *item = PyList_GET_ITEM(lists[l], i);
            /* A control is (name, kind, datatype, ...); a state (input, output, datatype, ...). */
            Py_ssize_t name_at = l == 1 && outputs ? 1 : 0, type_at = 2;
            const char *name, *dtype;
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 3 ||
                (name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, name_at))) == NULL ||
                (dtype = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, type_at))) == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "a control or state is a tuple (name, ..., datatype, ...)");
                free(out);
                return NULL;
            }
            int declared = 0;
            for (uint32_t j = 0; outputs && j < *n && !declared; j++)
                declared = strcmp(specs[j].name, name) == 0;
            if (declared)
                continue;
            out[k].name = (char *)name;
            out[k].dtype = oi_dtype_from_name(dtype, strlen(dtype));
            out[k].ndim = -1;
            k++;
        }
    *n = k;
    return out;
}

/* add_model's ensemble: (max_inflight_requests, steps), the steps a sequence of (model_name,
 * model_version, input_map, output_map), each map a sequence of (model tensor, ensemble tensor)
 * pairs, as python/openinfer/_backends/ensemble.py checked them. Returns the ensemble's
 * backend state, or NULL with an exception set. */
static oi_ensemble_t *make_ensemble(oi_server_t *s, const oi_model_t *self, PyObject *ensemble)
{
    oi_ensemble_t *e = NULL;
    unsigned int max_inflight;
    PyObject *seq;
    if (!PyArg_ParseTuple(ensemble, "IO;an ensemble is (max_inflight_requests, steps)", &max_inflight, &seq))
        return NULL;
    PyObject *steps = PySequence_Fast(seq, "ensemble steps must be a sequence");
    if (steps == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(steps), total = 0;
    oi_ensemble_step_spec_t *specs = calloc(n ? (size_t)n : 1, sizeof(*specs));
    PyObject **maps = calloc(n ? (size_t)n * 2 : 1, sizeof(*maps)); /* the Fast sequences, kept */
    oi_ensemble_map_t *pairs = NULL;
    if (specs == NULL || maps == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *in, *out;
        long long version;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(steps, i),
                              "sLOO;an ensemble step is (model_name, model_version, input_map, output_map)",
                              &specs[i].model_name, &version, &in, &out))
            goto done;
        specs[i].model_version = version;
        if ((maps[2 * i] = PySequence_Fast(in, "input_map must be a sequence of pairs")) == NULL ||
            (maps[2 * i + 1] = PySequence_Fast(out, "output_map must be a sequence of pairs")) == NULL)
            goto done;
        total += PySequence_Fast_GET_SIZE(maps[2 * i]) + PySequence_Fast_GET_SIZE(maps[2 * i + 1]);
    }
    if ((pairs = calloc(total ? (size_t)total : 1, sizeof(*pairs))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    oi_ensemble_map_t *p = pairs;
    for (Py_ssize_t i = 0; i < 2 * n; i++) {
        Py_ssize_t k = PySequence_Fast_GET_SIZE(maps[i]);
        if (i % 2 == 0) {
            specs[i / 2].inputs = p;
            specs[i / 2].n_inputs = (uint32_t)k;
        } else {
            specs[i / 2].outputs = p;
            specs[i / 2].n_outputs = (uint32_t)k;
        }
        for (Py_ssize_t j = 0; j < k; j++, p++)
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(maps[i], j),
                                  "ss;a map entry is (model tensor, ensemble tensor)", &p->model_tensor,
                                  &p->ensemble_tensor))
                goto done;
    }
    e = oi_ensemble_new(oi_server_registry(s), self, oi_server_counts_statistics(s), specs, (uint32_t)n,
                        max_inflight);
    if (e == NULL)
        PyErr_NoMemory();
done:
    for (Py_ssize_t i = 0; maps != NULL && i < 2 * n; i++)
        Py_XDECREF(maps[i]);
    free(maps);
    free(pairs);
    free(specs);
    Py_DECREF(steps);
    return e;
}

/* add_model's level policies: one (timeout_action_delay, default_timeout_us,
 * allow_timeout_override, max_queue_size) tuple per priority level, the highest first.
 * Returns a malloc'd array (the caller frees it) and its length in *n, or NULL with an
 * exception set. */
static oi_queue_policy_t *parse_queue_policies(PyObject *levels, uint32_t *n)
{
    PyObject *fast = PySequence_Fast(levels, "level_policies must be a sequence of tuples");
    if (fast == NULL)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    oi_queue_policy_t *p = NULL;
    if (len < 1 || len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "level_policies must hold one policy per priority level");
        goto fail;
    }
    if ((p = calloc((size_t)len, sizeof(*p))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        int delay = 0, allow = 0;
        unsigned long long timeout = 0;
        unsigned int max_queue = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i),
                              "pKpI;a level policy is (delay, default_timeout_us, allow_timeout_override, "
                              "max_queue_size)",
                              &delay, &timeout, &allow, &max_queue))
            goto fail;
        p[i] = (oi_queue_policy_t){delay, timeout, allow, max_queue};
    }
    Py_DECREF(fast);
    *n = (uint32_t)len;
    return p;
fail:
    free(p);
    Py_DECREF(fast);
    return NULL;
}

/* The NULL-terminated copy of a list of str, borrowing their UTF-8; NULL with an exception. */
static char **string_list(PyObject *list, const char *what)
{
    PyObject *fast = PySequence_Fast(list, what);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    char **v = calloc((size_t)n + 1, sizeof(char *));
    for (Py_ssize_t i = 0; v != NULL && i < n; i++)
        if ((v[i] = (char *)PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i))) == NULL) {
            free(v);
            v = NULL;
        }
    if (v == NULL && !PyErr_Occurred())
        PyErr_NoMemory();
    Py_DECREF(fast); /* the strings live on in `list`, which the caller holds */
    return v;
}

/* add_model(workers=(argv, env, recipe, ring_bytes[, stop])): the model's instances as worker
 * processes; `stop`, a buffer whose first byte set gives the start up. Returns the backend's
 * state; NULL with an exception set, or NULL with *err set (malloc'd) when a worker could not
 * import the model or the start was stopped. Waits for the imports without the GIL. */
static void *start_workers(oi_server_t *server, const char *name, int instances, PyObject *workers, char **err)
{
    PyObject *argv_list, *env_list, *stop_obj = Py_None;
    Py_buffer recipe, stop = {0};
    unsigned long long ring = 0;
    if (!PyArg_ParseTuple(workers, "OOy*K|O;workers is (argv, env, recipe, ring_bytes[, stop])", &argv_list, &env_list,
                          &recipe, &ring, &stop_obj))
        return NULL;
    if (stop_obj != Py_None && PyObject_GetBuffer(stop_obj, &stop, PyBUF_SIMPLE) != 0) {
        PyBuffer_Release(&recipe);
        return NULL;
    }
    if (stop_obj != Py_None && stop.len < 1) {
        PyErr_SetString(PyExc_ValueError, "workers' stop is a buffer of at least one byte");
        PyBuffer_Release(&stop);
        PyBuffer_Release(&recipe);
        return NULL;
    }
    void *state = NULL;
    char **argv = string_list(argv_list, "workers argv must be a list of str");
    char **envp = argv ? string_list(env_list, "workers env must be a list of str") : NULL;
    if (argv != NULL && argv[0] == NULL)
        PyErr_SetString(PyExc_ValueError, "workers argv is empty");
    else if (envp != NULL) {
        oi_pw_bls_hook_t bls = {oi_py_bls_worker_start, oi_py_bls_worker_next, oi_py_bls_worker_cancel,
                                oi_py_bls_worker_release, server}; /* the workers' BLS requests */
        oi_process_spec_t spec = {argv, envp, recipe.buf, (size_t)recipe.len, (size_t)ring, stop.buf, &bls};
        char msg[1024];
        Py_BEGIN_ALLOW_THREADS state = oi_process_backend_start(name, instances, &spec, msg, sizeof(msg));
        Py_END_ALLOW_THREADS
        if (state == NULL && (*err = strdup(msg)) == NULL)
            PyErr_NoMemory();
    }
    free(argv);
    free(envp);
    PyBuffer_Release(&recipe);
    if (stop.obj != NULL)
        PyBuffer_Release(&stop);
    return state;
}

/* add_model's openai_names: (convention's name, model's name) pairs, copied into the model. */
static int set_openai_names(oi_model_t *m, PyObject *pairs)
{
    PyObject *fast = PySequence_Fast(pairs, "openai_names must be a sequence of (str, str) pairs");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = 0;
    if (n > 0 && (m->openai_names = calloc((size_t)n * 2, sizeof(char *))) == NULL) {
        PyErr_NoMemory();
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        const char *convention, *own;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ss;openai_names holds (str, str) pairs", &convention,
                              &own)) {
            rc = -1;
        } else if ((m->openai_names[2 * i] = strdup(convention)) == NULL ||
                   (m->openai_names[2 * i + 1] = strdup(own)) == NULL) {
            PyErr_NoMemory();
            rc = -1;
        }
        m->n_openai_names = (uint32_t)i + 1; /* what is allocated so far: freed with the model */
    }
    Py_DECREF(fast);
    return rc;
}

static PyObject *Server_add_model(ServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name",      "version",          "inputs",
                             "outputs",   "max_batch_size",   "metadata_json",
                             "handler",   "instances",        "error",
                             "torch",     "dynamic_batching", "config_json",
                             "config_pb", "publish",          "sequence_batching",
                             "decoupled", "onnx",             "labels",
                             "ensemble",  "response_cache",   "workers",
                             "direct",    "identity",         "ready_probe",
                             "namespace", "openai_names", NULL};
    const char *name, *error = NULL, *ns = NULL;
    long long version;
    PyObject *inputs = NULL, *outputs = NULL, *handler = NULL, *torch = Py_None, *batching = Py_None,
             *sequence = Py_None, *onnx = Py_None, *labels = Py_None, *ensemble = Py_None, *workers = Py_None,
             *direct = Py_None, *identity = Py_None, *openai_names = Py_None;
    int max_batch = 0, instances = 1, publish = 1, decoupled = 0, response_cache = 0, ready_probe = 0;
    Py_buffer meta = {0}, cfg_json = {0}, cfg_pb = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sL|$OOiy*OizOOy*y*pOpOOOpOOOpzO", kwlist, &name, &version, &inputs,
                                     &outputs, &max_batch, &meta, &handler, &instances, &error, &torch, &batching,
                                     &cfg_json, &cfg_pb, &publish, &sequence, &decoupled, &onnx, &labels, &ensemble,
                                     &response_cache, &workers, &direct, &identity, &ready_probe, &ns, &openai_names))
        return NULL;
    if (handler == NULL && (torch != Py_None || onnx != Py_None || ensemble != Py_None || identity != Py_None))
        handler = Py_None;
    if (inputs == NULL || outputs == NULL || handler == NULL || meta.buf == NULL) {
        PyErr_SetString(PyExc_TypeError, "add_model() needs inputs, outputs, metadata_json and handler");
        PyBuffer_Release(&meta);
        PyBuffer_Release(&cfg_json);
        PyBuffer_Release(&cfg_pb);
        return NULL;
    }
    oi_io_spec_t *in = NULL, *out = NULL;
    uint32_t n_in = 0, n_out = 0;
    oi_model_t *m = NULL;
    PyObject *ret = NULL, *load_error = Py_None;
    oi_batching_t batch = {0};
    oi_queue_policy_t *policies = NULL; /* batch.policies: the scheduler copies them */
    oi_server_t *s = live_server(self);
    if (s == NULL)
        goto done;
    if (version < 0) {
        PyErr_Format(PyExc_ValueError, "model '%s': version must be >= 0, got %lld", name, version);
        goto done;
    }
    if (handler != Py_None && !PyCallable_Check(handler)) {
        PyErr_Format(PyExc_TypeError, "model '%s': handler must be callable or None", name);
        goto done;
    }
    if (batching != Py_None) {
        PyObject *pref = NULL;
        unsigned long long delay = 0;
        unsigned int max_queue = 0, default_level = 0;
        int preserve = 0, each_parameters = 0;
        PyObject *levels = Py_None;
        if (!PyArg_ParseTuple(batching,
                              "OK|IOIpp;dynamic_batching is (preferred_batch_sizes, max_queue_delay_us[, max_queue_size"
                              "[, level_policies, default_priority_level[, preserve_ordering[, each_parameters]]]])",
                              &pref, &delay, &max_queue, &levels, &default_level, &preserve, &each_parameters))
            goto done;
        /* The model reads each request's own parameters (oi_request_t.batch_params): requests
         * with different ones share a batch, as Triton batches them. */
        batch.ignore_parameters = each_parameters;
        batch.preserve_ordering = preserve;
        batch.max_queue_size = max_queue;
        if (levels != Py_None && (policies = parse_queue_policies(levels, &batch.n_levels)) == NULL)
            goto done;
        batch.policies = policies;
        batch.default_level = default_level;
        PyObject *fast = PySequence_Fast(pref, "preferred_batch_sizes must be a sequence of ints");
        if (fast == NULL)
            goto done;
        Py_ssize_t np = PySequence_Fast_GET_SIZE(fast);
        for (Py_ssize_t i = 0; i < np && i < 16; i++)
            batch.preferred[batch.n_preferred++] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        Py_DECREF(fast);
        if (PyErr_Occurred())
            goto done;
        batch.max_batch_size = max_batch;
        batch.max_queue_delay_us = delay;
    }
    batch.ignore_parameters |= sequence != Py_None; /* each request names its own sequence */
    if (handler == Py_None && error == NULL && torch == Py_None && onnx == Py_None && ensemble == Py_None &&
        identity == Py_None) {
        PyErr_Format(PyExc_ValueError, "model '%s': a model without a handler needs an error reason", name);
        goto done;
    }
    if (parse_specs(inputs, "input", &in, &n_in) != 0 || parse_specs(outputs, "output", &out, &n_out) != 0)
        goto done;
    if (max_batch > 0)
        for (uint32_t i = 0; i < n_in; i++)
            if (in[i].ndim <= 0 || in[i].dims[0] != -1) {
                PyErr_Format(PyExc_ValueError, "model '%s' input '%s': with max_batch_size > 0 the first dimension "
                                               "must be -1 (the batch)", name, in[i].name);
                goto done;
            }
    m = oi_model_new(name, version, max_batch, in, n_in, out, n_out);
    if (m == NULL || (ns != NULL && (m->ns = strdup(ns)) == NULL) ||
        (m->metadata = oi_buf_new((size_t)meta.len)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (decoupled && (torch != Py_None || onnx != Py_None || identity != Py_None || batching != Py_None)) {
        PyErr_Format(PyExc_ValueError, "model '%s': only a Python model without dynamic batching can be decoupled",
                     name);
        goto done;
    }
    m->decoupled = decoupled;
    m->ready_probe = ready_probe;
    /* Without a server cache the model runs uncached, as in Triton. */
    m->cache = response_cache ? oi_server_response_cache(s) : NULL;
    memcpy(m->metadata->data, meta.buf, (size_t)meta.len);
    m->metadata->len = (size_t)meta.len;
    if ((cfg_json.buf != NULL && (m->config_json = buf_copy(&cfg_json)) == NULL) ||
        (cfg_pb.buf != NULL && (m->config_pb = buf_copy(&cfg_pb)) == NULL)) {
        PyErr_NoMemory();
        goto done;
    }
    if (labels != Py_None && set_labels(m, labels) != 0)
        goto done;
    if (openai_names != Py_None && set_openai_names(m, openai_names) != 0)
        goto done;
    if ((torch != Py_None || onnx != Py_None) && error == NULL) {
        /* A native backend: TorchScript through the shim, or ONNX Runtime. */
        char *terr = NULL;
        /* The model also takes the sequence batcher's controls and states: the backend is
         * made for a copy of the model that declares them. */
        oi_model_t seen = *m;
        oi_io_spec_t *ins = with_sequence_tensors(sequence, m->inputs, &seen.n_inputs, 0);
        oi_io_spec_t *outs = ins ? with_sequence_tensors(sequence, m->outputs, &seen.n_outputs, 1) : NULL;
        if (outs == NULL) {
            free(ins);
            goto done;
        }
        seen.inputs = ins;
        seen.outputs = outs;
        m->state = torch != Py_None ? oi_py_torch_state(&seen, torch, &terr) : oi_py_onnx_state(&seen, onnx, &terr);
        free(ins);
        free(outs);
        if (m->state == NULL && terr == NULL)
            goto done; /* a malformed spec: the exception is set */
        if (m->state == NULL) {
            load_error = PyUnicode_FromString(terr);
            m->error = terr;
            if (load_error == NULL)
                goto done;
        } else {
            m->backend = torch != Py_None ? &oi_torch_backend : &oi_onnx_backend;
            if (start_executors(self, m, instances, &batch) != 0)
                goto done;
        }
    } else if (identity != Py_None && error == NULL) {
        unsigned long long delay_ms = 0, multiplier = 0;
        char *ierr = NULL;
        if (!PyArg_ParseTuple(identity, "KK;identity is (execute_delay_ms, instance_wise_delay_multiplier)", &delay_ms,
                              &multiplier))
            goto done;
        /* A sequence batcher's controls reach it as extra inputs, which it leaves alone; it has
         * no output to carry an implicit state in. */
        if (sequence != Py_None && (!PyTuple_Check(sequence) || PyTuple_GET_SIZE(sequence) != 6 ||
                                    !PyList_Check(PyTuple_GET_ITEM(sequence, 3)) ||
                                    PyList_GET_SIZE(PyTuple_GET_ITEM(sequence, 3)) > 0)) {
            PyErr_Format(PyExc_ValueError, "model '%s': the identity backend takes no implicit state", name);
            goto done;
        }
        m->state = oi_identity_backend_state(name, max_batch, m->inputs, m->n_inputs, m->outputs, m->n_outputs,
                                             delay_ms, multiplier, &ierr);
        if (m->state == NULL) {
            PyErr_Format(PyExc_ValueError, "%s", ierr ? ierr : "out of memory");
            free(ierr);
            goto done;
        }
        m->backend = delay_ms > 0 ? &oi_identity_delayed_backend : &oi_identity_backend;
        if (start_executors(self, m, instances, &batch) != 0)
            goto done;
    } else if (ensemble != Py_None && error == NULL) {
        if (sequence != Py_None || batching != Py_None) { /* decoupled when a step is */
            PyErr_Format(PyExc_ValueError, "model '%s': an ensemble has no batcher of its own", name);
            goto done;
        }
        if ((m->state = make_ensemble(s, m, ensemble)) == NULL)
            goto done;
        m->backend = &oi_ensemble_backend;
        if (start_executors(self, m, OI_ENSEMBLE_EXECUTORS, NULL) != 0)
            goto done;
    } else if (handler == Py_None) {
        m->error = strdup(error);
    } else {
        /* The model's state outputs are outputs too, converted to the state's datatype. */
        uint32_t n_outs = m->n_outputs;
        oi_io_spec_t *outs = with_sequence_tensors(sequence, m->outputs, &n_outs, 1);
        if (outs == NULL)
            goto done;
        if (workers != Py_None) {
            free(outs);
            char *werr = NULL;
            if ((m->state = start_workers(self->server, name, instances, workers, &werr)) == NULL && werr == NULL)
                goto done; /* a malformed spec: the exception is set */
            if (m->state == NULL) { /* a worker could not import the model: a load error */
                load_error = PyUnicode_FromString(werr);
                m->error = werr;
                if (load_error == NULL)
                    goto done;
            } else {
                m->backend = &oi_process_backend;
            }
        } else {
            PyObject *fn = NULL, *select = NULL, *triton = NULL;
            if (PyObject_TypeCheck(direct, &oi_py_triton_execute_type))
                triton = direct; /* a Triton Python model's execute, called from the core */
            else if (direct != Py_None && (!PyTuple_Check(direct) || PyTuple_GET_SIZE(direct) != 2 ||
                                      !PyCallable_Check(fn = PyTuple_GET_ITEM(direct, 0)) ||
                                      !PyCallable_Check(select = PyTuple_GET_ITEM(direct, 1)))) {
                PyErr_Format(PyExc_TypeError, "direct is (fn, select), two callables, or a TritonExecute; got %R", direct);
                free(outs);
                goto done;
            }
            m->state = oi_python_backend_state(handler, fn, select, triton, name, outs, n_outs);
            free(outs);
            if (m->state == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            m->backend = &oi_python_backend;
        }
        if (m->state != NULL && start_executors(self, m, instances, &batch) != 0)
            goto done;
    }
    if (sequence != Py_None && m->sched != NULL &&
        (m->seq = make_sequence_batcher(sequence, name, max_batch, instances, self->max_sequence_backlog, m->sched)) ==
            NULL)
        goto done;
    if (!publish) {
        ret = model_version_new(m); /* takes m */
        m = NULL;
        goto done;
    }
    /* Again: loading TorchScript let other threads run, a stop among them. */
    if ((s = live_server(self)) == NULL)
        goto done;
    if (oi_server_add_model(s, m) != 0) {
        PyErr_Format(PyExc_RuntimeError, "model '%s' version %lld is already registered", name, version);
        goto done;
    }
    m = NULL; /* the registry's now */
    ret = Py_NewRef(load_error);
done:
    if (load_error != Py_None)
        Py_XDECREF(load_error); /* ret holds its own reference */
    if (m != NULL) {
        Py_BEGIN_ALLOW_THREADS /* a Python model's executors need the GIL to end */
        oi_model_retire(m);
        Py_END_ALLOW_THREADS
    }
    free(in);
    free(out);
    free(policies);
    PyBuffer_Release(&meta);
    PyBuffer_Release(&cfg_json);
    PyBuffer_Release(&cfg_pb);
    return ret;
}

static PyObject *Server_start(ServerObject *self, PyObject *noargs)
{
    (void)noargs;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "the server is already started");
        return NULL;
    }
    char err[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = oi_server_start(s, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        stop_server(self, 0);
        PyErr_SetString(PyExc_OSError, err[0] ? err : uv_strerror(rc));
        return NULL;
    }
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *Server_stop(ServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    double timeout = 30.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|d", kwlist, &timeout))
        return NULL;
    stop_server(self, timeout);
    Py_RETURN_NONE;
}

static PyObject *Server_drain(ServerObject *self, PyObject *unused)
{
    (void)unused;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    oi_server_drain(s);
    Py_RETURN_NONE;
}

static PyObject *Server_get_port(ServerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->server && self->started ? oi_server_port(self->server) : 0);
}

static PyObject *Server_get_grpc_port(ServerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->server && self->started ? oi_server_grpc_port(self->server) : 0);
}

static PyObject *Server_get_metrics_port(ServerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->server && self->started ? oi_server_metrics_port(self->server) : 0);
}

/* trace_set(model, clear, level, rate, count, log_frequency): the trace extension's sampling
 * settings of `model` (None: the global ones). */
static PyObject *Server_trace_set(ServerObject *self, PyObject *args)
{
    const char *model = NULL;
    int clear = 0, level = 0, count = -1;
    unsigned int rate = 0, log_frequency = 0;
    if (!PyArg_ParseTuple(args, "zpiIiI", &model, &clear, &level, &rate, &count, &log_frequency))
        return NULL;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    if (oi_server_trace_set(s, model, clear, level, rate, count, log_frequency) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "no trace file, or too many models with trace settings of their own");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* trace_count(model) -> the traces `model` (None: globally) may still take, -1: no limit. */
static PyObject *Server_trace_count(ServerObject *self, PyObject *args)
{
    const char *model = NULL;
    if (!PyArg_ParseTuple(args, "z", &model))
        return NULL;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    return PyLong_FromLong(oi_server_trace_count(s, model));
}

/* statistics(name, version) -> (200, JSON bytes) or (status code, message): Triton's
 * statistics body, as GET /v2/models[/name[/versions/v]]/stats answers it. */
static PyObject *Server_statistics(ServerObject *self, PyObject *args)
{
    const char *name = "", *version = "";
    if (!PyArg_ParseTuple(args, "|ss", &name, &version))
        return NULL;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    oi_status_t *st = NULL;
    oi_buf_t *b;
    Py_BEGIN_ALLOW_THREADS
    b = oi_server_statistics(s, name, version, &st);
    Py_END_ALLOW_THREADS
    PyObject *ret = b ? Py_BuildValue("(iy#)", 200, b->data, (Py_ssize_t)b->len)
                      : Py_BuildValue("(is)", st->code, st->message);
    oi_buf_unref(b);
    oi_status_free(st);
    return ret;
}

/* set_custom_metrics(text): the models' own metric families, appended to every /metrics
 * scrape. Keeps the GIL: stop_server clears self->server under it, so the server lives here. */
static PyObject *Server_set_custom_metrics(ServerObject *self, PyObject *args)
{
    const char *text;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "y#", &text, &len))
        return NULL;
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    if (oi_server_set_custom_metrics(s, text, (size_t)len) != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Server_get_shared_memory(ServerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->server != NULL && oi_server_shm_allowed(self->server));
}

static PyObject *Server_get_running(ServerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->server != NULL && self->started);
}

/* bls(model, version, inputs, outputs, ...): a model's inference on this server (python/bls.h). */
static PyObject *Server_bls(ServerObject *self, PyObject *args, PyObject *kwargs)
{
    oi_server_t *s = live_server(self);
    if (s == NULL)
        return NULL;
    return oi_py_bls_start(oi_server_registry(s), oi_server_counts_statistics(s), args, kwargs);
}

/* SIGHUP: loads the TLS certificates and keys again; new connections get them. */
static PyObject *Server_reload_tls(ServerObject *self, PyObject *unused)
{
    (void)unused;
    oi_tls_ctx_t *ctxs[2] = {self->http_tls, self->grpc_tls};
    const char *names[2] = {"http", "grpc"};
    for (int i = 0; i < 2; i++) {
        if (ctxs[i] == NULL)
            continue;
        char err[512];
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = oi_tls_ctx_reload(ctxs[i], err, sizeof(err));
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return PyErr_Format(PyExc_ValueError, "%s TLS: %s", names[i], err);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Server_methods[] = {
    {"bls", (PyCFunction)(void (*)(void))Server_bls, METH_VARARGS | METH_KEYWORDS,
     "bls(model, version, inputs, outputs, ...) -> BlsCall: an inference made by a model (BLS)."},
    {"reload_tls", (PyCFunction)Server_reload_tls, METH_NOARGS,
     "Loads the TLS certificates and keys again (new connections use them)."},
    {"set_metadata", (PyCFunction)Server_set_metadata, METH_O, "Sets the body of GET /v2."},
    {"add_model", (PyCFunction)(void (*)(void))Server_add_model, METH_VARARGS | METH_KEYWORDS,
     "Registers one model version."},
    {"swap_models", (PyCFunction)Server_swap_models, METH_VARARGS,
     "Swaps model versions into and out of the registry in one step; waits for requests on those that left (at "
     "most timeout seconds each); returns those abandoned."},
    {"set_repository", (PyCFunction)Server_set_repository, METH_O,
     "Serves the model repository extension through handler(op, model, body, params, ready)."},
    {"set_chat_renderer", (PyCFunction)Server_set_chat_renderer, METH_O,
     "set_chat_renderer(renderer): renderer(model, version, messages) -> prompt, for /v1/chat/completions."},
    {"start", (PyCFunction)Server_start, METH_NOARGS, "Binds and starts the loop threads."},
    {"stop", (PyCFunction)(void (*)(void))Server_stop, METH_VARARGS | METH_KEYWORDS,
     "Drains in-flight requests and stops."},
    {"drain", (PyCFunction)Server_drain, METH_NOARGS,
     "Turns server readiness false while every request is still served (before stop)."},
    {"trace_set", (PyCFunction)Server_trace_set, METH_VARARGS,
     "trace_set(model, clear, level, rate, count, log_frequency): a model's (None: the global) trace settings."},
    {"trace_count", (PyCFunction)Server_trace_count, METH_VARARGS,
     "trace_count(model) -> the traces still to take (-1: no limit)."},
    {"set_custom_metrics", (PyCFunction)Server_set_custom_metrics, METH_VARARGS,
     "set_custom_metrics(text: bytes): the models' own metric families for /metrics."},
    {"statistics", (PyCFunction)Server_statistics, METH_VARARGS,
     "statistics(name='', version='') -> (200, JSON bytes) or (status, message)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Server_getset[] = {
    {"port", (getter)Server_get_port, NULL, "The bound HTTP port.", NULL},
    {"grpc_port", (getter)Server_get_grpc_port, NULL, "The bound gRPC port; 0 without gRPC.", NULL},
    {"metrics_port", (getter)Server_get_metrics_port, NULL, "The bound metrics port; 0 without metrics.", NULL},
    {"running", (getter)Server_get_running, NULL, "Whether the server serves.", NULL},
    {"shared_memory", (getter)Server_get_shared_memory, NULL,
     "Whether clients may register shared-memory regions.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.Server",
    .tp_basicsize = sizeof(ServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A V2 inference server (HTTP/1.1 and gRPC) on native event-loop threads.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Server_init,
    .tp_dealloc = (destructor)Server_dealloc,
    .tp_methods = Server_methods,
    .tp_getset = Server_getset,
};

/* peer_credentials(fd): what the server would know of the client on the other end of a
 * connected socket (transport/peer.h), for tests and diagnostics. */
static PyObject *peer_credentials(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0)
        return NULL;
    oi_peer_t p;
    Py_BEGIN_ALLOW_THREADS;
    oi_peer_lookup(fd, &p);
    Py_END_ALLOW_THREADS;
    if (p.error != 0) {
        errno = p.error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *groups = PyList_New(p.ngroups);
    for (int i = 0; groups != NULL && i < p.ngroups; i++)
        PyList_SET_ITEM(groups, i, PyLong_FromUnsignedLong(p.groups[i]));
    if (groups == NULL)
        return NULL;
    return Py_BuildValue("{s:k,s:l,s:N}", "uid", (unsigned long)p.uid, "gid",
                         p.gid == (gid_t)-1 ? -1L : (long)p.gid, "groups", groups);
}

/* _hold_work(on) / _held_work(): the test hold of transport/loop.h (oi__work_hold), so that a
 * test can see the loops serve while a (de)compression waits on a worker thread. */
static PyObject *hold_work(PyObject *self, PyObject *arg)
{
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    oi__work_hold(on);
    Py_RETURN_NONE;
}

static PyObject *held_work(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromLong(oi__work_held());
}

static PyObject *usable_cpus(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromLong(oi_usable_cpus());
}

static PyMethodDef peer_functions[] = {
    {"_hold_work", hold_work, METH_O,
     "For tests: while true, work sent off the event loops (decompression, compression) waits before it starts."},
    {"_held_work", held_work, METH_NOARGS, "For tests: how many pieces of work wait on _hold_work."},
    {"usable_cpus", usable_cpus, METH_NOARGS,
     "The CPUs this process may use: its affinity mask, capped by the cgroup CPU quota (at least 1)."},
    {"peer_credentials", peer_credentials, METH_O,
     "The uid, gid (-1: unknown) and groups of the process on the other end of a connected socket (a file "
     "descriptor or an object with fileno()); OSError when unknown (ENOENT: not on this host)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "openinfer._core", "The C core of openinfer.", -1, oi_py_torch_functions, NULL, NULL, NULL,
    NULL,
};

/* RESTRICTED_APIS: tritonserver's restricted-API group names, in its order, then openinfer's "openai". */
static int add_api_groups(PyObject *m)
{
    PyObject *names = PyTuple_New(OI_API_COUNT);
    for (int g = 0; names != NULL && g < OI_API_COUNT; g++) {
        PyObject *n = PyUnicode_FromString(oi_api_group_names[g]);
        if (n == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, g, n);
    }
    if (names == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(m, "RESTRICTED_APIS", names);
    Py_DECREF(names);
    return rc;
}

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    if (PyType_Ready(&ServerType) < 0 || PyType_Ready(&ModelVersionType) < 0 || PyType_Ready(&oi_py_conn_type) < 0 || PyType_Ready(&oi_py_bls_type) < 0 ||
        PyType_Ready(&oi_py_grpc_conn_type) < 0 || PyType_Ready(&oi_py_grpc_stream_type) < 0 ||
        PyType_Ready(&oi_py_pb_tensor_type) < 0 || PyType_Ready(&oi_py_pb_response_type) < 0 ||
        PyType_Ready(&oi_py_pb_request_type) < 0 || PyType_Ready(&oi_py_triton_execute_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Server", (PyObject *)&ServerType) < 0 ||
        PyModule_AddObjectRef(m, "ModelVersion", (PyObject *)&ModelVersionType) < 0 ||
        PyModule_AddObjectRef(m, "HttpConnection", (PyObject *)&oi_py_conn_type) < 0 ||
        PyModule_AddObjectRef(m, "GrpcConnection", (PyObject *)&oi_py_grpc_conn_type) < 0 ||
        PyModule_AddObjectRef(m, "GrpcStream", (PyObject *)&oi_py_grpc_stream_type) < 0 ||
        PyModule_AddObjectRef(m, "TensorBase", (PyObject *)&oi_py_pb_tensor_type) < 0 ||
        PyModule_AddObjectRef(m, "ResponseBase", (PyObject *)&oi_py_pb_response_type) < 0 ||
        PyModule_AddObjectRef(m, "RequestBase", (PyObject *)&oi_py_pb_request_type) < 0 ||
        PyModule_AddObjectRef(m, "TritonExecute", (PyObject *)&oi_py_triton_execute_type) < 0 ||
        PyModule_AddFunctions(m, oi_py_pb_functions) < 0 ||
        PyModule_AddFunctions(m, peer_functions) < 0 || PyModule_AddFunctions(m, oi_py_onnx_functions) < 0 ||
        PyModule_AddFunctions(m, oi_py_worker_functions) < 0 ||
        PyModule_AddStringConstant(m, "__version__", OI_VERSION) < 0 || add_api_groups(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
