/* TorchScript models through the libtorch shim (backends/torch_shim/), which is loaded with
 * dlopen only when a TorchScript model is served: openinfer itself never links libtorch. */
#ifndef OI_BACKENDS_TORCH_BACKEND_H
#define OI_BACKENDS_TORCH_BACKEND_H

#include "backends/backend.h"
#include "backends/torch_shim/torch_shim.h"

extern const oi_backend_t oi_torch_backend;

/* Loads the shim at `path` (dlopen RTLD_NOW | RTLD_LOCAL; the caller has imported torch, so
 * libtorch is already in the process) and resolves every entry point. Idempotent: once one
 * shim is loaded, later calls return 0 and ignore `path`. The shim is never unloaded, since
 * output buffers may outlive every model. Returns 0, or -1 with a message in `err`. Not
 * thread-safe: call with the GIL held. */
int oi_torch_shim_open(const char *path, char *err, size_t errlen);

/* 1 once oi_torch_shim_open succeeded. */
int oi_torch_shim_loaded(void);

/* How the model's declaration maps onto forward(). Arrays are borrowed for the call. */
typedef struct oi_torch_spec_s {
    const char *path;              /* the TorchScript file, or the PT2 package when `package` */
    int package;                   /* 1: an AOTInductor package (oits_package_load) */
    const char *const *devices;    /* one device per instance: "cpu", "cuda:0" */
    int instances;
    oits_options_t options;        /* device is ignored: see `devices` */
    const uint32_t *arg_inputs;    /* forward() argument k takes model input arg_inputs[k] */
    uint32_t n_args;
    const int *output_index;       /* model output i is result element output_index[i], */
    const char *const *output_key; /* or, when forward() returns a dict, key output_key[i] */
    const oi_io_spec_t *input_reshape;  /* per input: the shape forward() sees (ndim -1: as sent) */
    const oi_io_spec_t *output_reshape; /* per output: the shape forward() returns (ndim -1: as declared) */
    /* Dimensions that must be equal, as (argument, dimension, argument, dimension) quads: a
     * PT2 package's inputs sharing one dynamic size, which it does not check itself. */
    const int32_t *dim_links;
    uint32_t n_dim_links;
} oi_torch_spec_t;

/* Loads one module per instance and returns the state for oi_torch_backend (which owns it),
 * or NULL with a new message in *err (free() it). `inputs` and `outputs` are the model's
 * declaration (copied where kept); max_batch_size > 0 means dimension 0 is the batch,
 * which reshapes leave alone. */
void *oi_torch_backend_state(const char *model_name, const oi_torch_spec_t *spec, int max_batch_size,
                             const oi_io_spec_t *inputs, uint32_t n_inputs, const oi_io_spec_t *outputs,
                             uint32_t n_outputs, char **err);

/* Loads `path` on the CPU and returns new JSON text (free() it) describing forward() as the
 * shim's oits_module_describe does, plus "example_outputs": [{"name": str|null, "dtype":
 * "FP32", "shape": [...]}] from a probe run when the module has example_inputs (else null).
 * NULL with a new message in *err. */
char *oi_torch_describe(const char *path, char **err);

/* Loads the PT2 package at `path` on `device` ("cpu", "cuda:N") and runs it once on
 * zero-filled inputs of the given datatypes and shapes (`data` is ignored), to learn its
 * outputs: new JSON text (free() it), [{"name": null, "dtype": "FP32", "shape": [...]}, ...].
 * NULL with a new message in *err: the loader's or the run's reason. */
char *oi_torch_package_probe(const char *path, const char *device, const oits_input_t *inputs, size_t n_inputs,
                             char **err);

#endif
