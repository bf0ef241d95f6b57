/* ONNX models through ONNX Runtime's C API. libonnxruntime is loaded with dlopen only when an
 * ONNX model is served (the path comes from the installed onnxruntime wheel, found by Python):
 * openinfer itself never links it, and runs without it. */
#ifndef OI_BACKENDS_ONNX_BACKEND_H
#define OI_BACKENDS_ONNX_BACKEND_H

#include "backends/backend.h"

extern const oi_backend_t oi_onnx_backend;

/* Loads libonnxruntime from `path` (dlopen RTLD_NOW | RTLD_LOCAL), takes the OrtApi of the
 * vendored header's version (or, from an older library, of the oldest version whose entry
 * points this backend uses) and creates the process's one OrtEnv. Idempotent: once loaded,
 * later calls return 0 and ignore `path`; never unloaded, since outputs may outlive every
 * model. Returns 0, or -1 with a message in `err`. Not thread-safe: call with the GIL held. */
int oi_onnx_open(const char *path, char *err, size_t errlen);

/* The loaded library's version ("1.32.0") and API version in use; NULL / 0 before open. */
const char *oi_onnx_version(void);
unsigned oi_onnx_api_version(void);

/* The execution providers the loaded library was built with ("CPUExecutionProvider", ...) as
 * new JSON text (a list of strings; free() it), or NULL with a new message in *err. */
char *oi_onnx_providers(char **err);

/* An execution provider to append to a session, with its options (borrowed for the call). */
typedef struct oi_onnx_accel_s {
    const char *name; /* "cuda", "tensorrt" (GPU instances) or "openvino" (CPU instances) */
    const char *const *keys;
    const char *const *values;
    size_t n;
} oi_onnx_accel_t;

/* How each instance's session is made. Arrays are borrowed for the call. */
typedef struct oi_onnx_spec_s {
    const char *path;
    /* The external data files the model names, by the location it gives, with their contents:
     * ONNX Runtime takes them from memory (n_external 0: the model has none). */
    const char *const *external_names;
    char *const *external_data;
    const size_t *external_lengths;
    size_t n_external;
    const int *devices; /* one per instance: -1 the CPU, else a CUDA device id */
    int instances;
    int intra_op_threads; /* 0: ONNX Runtime's default */
    int inter_op_threads;
    int graph_level;                   /* a GraphOptimizationLevel */
    int execution_mode;                /* 0 sequential, 1 parallel */
    const oi_onnx_accel_t *gpu_accels; /* appended, in order, before CUDA on GPU instances */
    size_t n_gpu_accels;
    const oi_onnx_accel_t *cpu_accels; /* appended on CPU instances */
    size_t n_cpu_accels;
    /* Per declared input: the shape the session sees past the batch (ndim -1: as sent); per
     * declared output: the session's shape differs from the declared one (ndim -1: it does
     * not), and the output is reported in the declared shape. NULL: none. */
    const oi_io_spec_t *input_reshape;
    const oi_io_spec_t *output_reshape;
    /* The first instance's session, from oi_onnx_describe on this spec, which
     * oi_onnx_backend_state takes (NULL: it makes the session). */
    void *session;
} oi_onnx_spec_t;

/* Makes the first instance's session of `spec` (the model file is read here, and only here
 * for that instance) and describes it as new JSON text (free() it): {"inputs": [...],
 * "outputs": [...]}, each tensor {"name": str, "datatype": "FP32" ("" when it has no V2
 * datatype), "onnx_type": int, "kind": "tensor"|"sequence"|"map"|..., "shape": [dims, -1
 * where symbolic or unknown]}; "shape" is null when the rank is unknown. The session is
 * handed to *session, for spec->session or oi_onnx_session_release. NULL with a new message
 * in *err (free() it), and no session. */
char *oi_onnx_describe(const oi_onnx_spec_t *spec, void **session, char **err);

/* Releases a session from oi_onnx_describe that no model took. */
void oi_onnx_session_release(void *session);

/* Creates one session per instance (taking spec->session, when given, as the first one, even
 * when it fails) and returns the state for oi_onnx_backend (which owns it), or NULL with a
 * new message in *err (free() it). `inputs` and `outputs` are the
 * model's declaration (names and datatypes are copied), which must name tensors of the model
 * with the same datatypes; max_batch_size > 0 means dimension 0 is the batch. */
void *oi_onnx_backend_state(const char *model_name, const oi_onnx_spec_t *spec, int max_batch_size,
                            const oi_io_spec_t *inputs, uint32_t n_inputs, const oi_io_spec_t *outputs,
                            uint32_t n_outputs, char **err);

#endif
