/* The C ABI of the libtorch shim (libopeninfer_torch.so), the only code of openinfer that is
 * C++ and links libtorch. The C core dlopens it (RTLD_NOW | RTLD_LOCAL) after Python has
 * imported torch, and resolves these functions with dlsym, so openinfer builds, installs and
 * runs without torch.
 *
 * Conventions, which fix the two weaknesses of the tch-rs pattern this follows:
 * - Every handle is opaque and every entry point catches every exception (`catch (...)`
 *   included): no C++ exception ever crosses into C.
 * - A failing call returns -1 (or NULL) and sets `*err` to a new message that the caller
 *   frees with oits_free; there is no global or thread-local "last error" that another call
 *   could overwrite.
 * - Datatypes are oi_dtype_t values (core/dtype.h), so the core needs no second table. */
#ifndef OI_BACKENDS_TORCH_SHIM_H
#define OI_BACKENDS_TORCH_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/dtype.h" /* a C header without its own extern "C" */

/* Bumped whenever a signature below changes: the core refuses a shim of another version (a
 * stale build in the cache) instead of calling it with the wrong arguments. */
#define OITS_ABI_VERSION 2
#define OITS_MAX_DIMS 16

/* The shim is built with hidden visibility; only these entry points are exported. */
#define OITS_API __attribute__((visibility("default")))

typedef struct oits_module_s oits_module_t; /* one loaded TorchScript module or PT2 package on one device */
typedef struct oits_tensor_s oits_tensor_t; /* one output tensor kept alive for the writer */

/* How a module is loaded and run; zero-initialised means libtorch's defaults. */
typedef struct oits_options_s {
    const char *device;          /* "cpu" or "cuda:N"; NULL means "cpu" */
    int inference_mode;          /* 1: run under torch::InferenceMode (default), 0: NoGradGuard */
    int disable_optimized;       /* 1: run with the graph executor's optimizations off */
    int intra_op_threads;        /* > 0: at::set_num_threads on each executor thread */
    int inter_op_threads;        /* > 0: at::set_num_interop_threads (process-wide, once) */
} oits_options_t;

/* One input: borrowed request memory, wrapped without a copy (torch::from_blob) on the CPU;
 * copied once to the device (through pinned staging) for a CUDA module. */
typedef struct oits_input_s {
    void *data; /* may be NULL when the tensor has no elements */
    oi_dtype_t dtype;
    int ndim;
    const int64_t *shape;
} oits_input_t;

/* One output of a forward call. `tensor` keeps the (contiguous, host) memory at `data`
 * alive until oits_tensor_free; the caller takes it by setting the field to NULL, which is
 * how an output becomes the owner of a response buffer with no copy. */
typedef struct oits_output_s {
    char *name; /* the key when forward() returned a dict, else NULL; freed by oits_outputs_free */
    oits_tensor_t *tensor;
    void *data;
    size_t nbytes;
    oi_dtype_t dtype; /* OI_TYPE_INVALID when torch's dtype has no V2 datatype */
    int ndim;
    int64_t shape[OITS_MAX_DIMS];
} oits_output_t;

/* Returns OITS_ABI_VERSION of the build. */
OITS_API int oits_abi_version(void);

/* Frees a message or JSON text returned by the shim. NULL is ignored. */
OITS_API void oits_free(char *p);

/* Loads a TorchScript file (torch::jit::load) onto the device, in eval mode. Returns a new
 * module, or NULL with *err set. */
OITS_API oits_module_t *oits_module_load(const char *path, const oits_options_t *opts, char **err);

/* Loads a PyTorch 2 AOTInductor package (model.pt2: torch._inductor.aoti_compile_and_package)
 * with torch::inductor::AOTIModelPackageLoader onto the device, which must be of the kind the
 * package was compiled for. Returns a new module, or NULL with *err set (the loader's reason).
 * oits_module_forward runs it: inputs are the package's flattened inputs in call-spec order,
 * outputs its flattened outputs (never named); describe and probe refuse it. */
OITS_API oits_module_t *oits_package_load(const char *path, const oits_options_t *opts, char **err);

/* Frees a module; no forward call may be running on it. NULL is ignored. */
OITS_API void oits_module_free(oits_module_t *m);

/* Describes forward() as JSON text (free with oits_free):
 *   {"arguments": [{"name": "x", "type": "Tensor", "has_default": false}, ...],
 *    "returns": "Tuple[Tensor, Tensor]",
 *    "example_inputs": [{"dtype": "FP32", "shape": [1, 16]}, ...] or null}
 * `self` is left out. example_inputs comes from a module attribute of that name (a Tensor
 * or a tuple/list of Tensors) when the module has one. NULL with *err set on failure. */
OITS_API char *oits_module_describe(oits_module_t *m, char **err);

/* Runs forward() on the module's example_inputs attribute (see oits_module_describe), for
 * config-less serving to learn the outputs. Same results as oits_module_forward. */
OITS_API int oits_module_probe(oits_module_t *m, oits_output_t **outputs, size_t *n_outputs, char **err);

/* Runs forward(inputs...) under InferenceMode. On success sets *outputs to a new array of
 * *n_outputs outputs (free with oits_outputs_free): a Tensor result gives one, a tuple or
 * list one per element, a dict one per entry in its order (with `name`). Outputs are
 * contiguous and on the host. The inputs' memory is only borrowed for the call. Any number
 * of threads may run forward on one module at once. Returns 0, or -1 with *err set. */
OITS_API int oits_module_forward(oits_module_t *m, const oits_input_t *inputs, size_t n_inputs, oits_output_t **outputs,
                        size_t *n_outputs, char **err);

/* Frees an output array: names, the array, and every tensor the caller did not take. */
OITS_API void oits_outputs_free(oits_output_t *outputs, size_t n);

/* Releases one output tensor that the caller took from an oits_output_t. Any thread. */
OITS_API void oits_tensor_free(oits_tensor_t *t);

/* The number of CUDA devices libtorch sees: 0 when torch was built without CUDA. */
OITS_API int oits_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
