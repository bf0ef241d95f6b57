#include "backends/onnx_backend.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/instances.h"
#include "core/buf.h"
#include "third_party/onnxruntime/onnxruntime_c_api.h"

/* The oldest API version whose entry points this file uses (GetResizedStringTensorElementBuffer
 * and the V2 CUDA / TensorRT options are the newest of them): a library older than the
 * vendored header still serves through that prefix of the OrtApi struct. */
#define OX_MIN_API_VERSION 16
/* AddExternalInitializersFromFilesInMemory: external data given by the server, never opened
 * by ONNX Runtime by the name a model file gives. */
#define OX_EXTERNAL_IN_MEMORY_API_VERSION 18

/* The library, resolved once by oi_onnx_open and kept for the life of the process. */
static struct {
    void *handle;
    const OrtApi *api;
    unsigned api_version;
    int external_in_memory; /* the library has API version OX_EXTERNAL_IN_MEMORY_API_VERSION */
    const char *version;
    OrtEnv *env;
    OrtMemoryInfo *cpu;      /* where request inputs and preallocated outputs live */
    OrtAllocator *allocator; /* ONNX Runtime's default CPU allocator (string tensors) */
} ort;

const char *oi_onnx_version(void)
{
    return ort.version;
}
unsigned oi_onnx_api_version(void)
{
    return ort.api_version;
}

/* Takes an OrtStatus: a new malloc'd message, or NULL when there was none (success). */
static char *take_status(OrtStatus *st)
{
    if (st == NULL)
        return NULL;
    const char *msg = ort.api->GetErrorMessage(st);
    char *copy = strdup(msg && *msg ? msg : "unknown ONNX Runtime error");
    ort.api->ReleaseStatus(st);
    return copy ? copy : strdup("out of memory");
}

int oi_onnx_open(const char *path, char *err, size_t errlen)
{
    if (ort.handle != NULL)
        return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(err, errlen, "cannot load ONNX Runtime: %s", dlerror());
        return -1;
    }
    const OrtApiBase *(*get_base)(void);
    *(void **)&get_base = dlsym(h, "OrtGetApiBase");
    const OrtApiBase *base = get_base ? get_base() : NULL;
    if (base == NULL) {
        snprintf(err, errlen, "%s is not ONNX Runtime (no OrtGetApiBase)", path);
        dlclose(h);
        return -1;
    }
    const char *version = base->GetVersionString();
    unsigned api_version = ORT_API_VERSION;
    const OrtApi *api = base->GetApi(api_version);
    if (api == NULL) {
        api_version = OX_MIN_API_VERSION;
        api = base->GetApi(api_version);
    }
    if (api == NULL) {
        snprintf(err, errlen,
                 "ONNX Runtime %s at %s is too old: openinfer needs API version %d (onnxruntime 1.%d) or "
                 "newer; pip install -U onnxruntime",
                 version ? version : "?", path, OX_MIN_API_VERSION, OX_MIN_API_VERSION);
        dlclose(h);
        return -1;
    }
    ort.api = api;
    ort.external_in_memory = base->GetApi(OX_EXTERNAL_IN_MEMORY_API_VERSION) != NULL;
    OrtEnv *env = NULL;
    char *msg = take_status(api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "openinfer", &env));
    OrtMemoryInfo *cpu = NULL;
    if (msg == NULL)
        msg = take_status(api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &cpu));
    OrtAllocator *allocator = NULL;
    if (msg == NULL)
        msg = take_status(api->GetAllocatorWithDefaultOptions(&allocator));
    if (msg != NULL) {
        snprintf(err, errlen, "ONNX Runtime %s: %s", version ? version : "?", msg);
        free(msg);
        if (cpu)
            api->ReleaseMemoryInfo(cpu);
        if (env)
            api->ReleaseEnv(env);
        memset(&ort, 0, sizeof(ort));
        dlclose(h);
        return -1;
    }
    ort.env = env;
    ort.cpu = cpu;
    ort.allocator = allocator;
    ort.version = version ? version : "?";
    ort.api_version = api_version;
    ort.handle = h;
    return 0;
}

/* ---- datatypes -------------------------------------------------------------------------- */

static oi_dtype_t from_onnx(ONNXTensorElementDataType t)
{
    switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return OI_TYPE_BOOL;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return OI_TYPE_UINT8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return OI_TYPE_UINT16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return OI_TYPE_UINT32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return OI_TYPE_UINT64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return OI_TYPE_INT8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return OI_TYPE_INT16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return OI_TYPE_INT32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return OI_TYPE_INT64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return OI_TYPE_FP16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return OI_TYPE_FP32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return OI_TYPE_FP64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return OI_TYPE_BF16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return OI_TYPE_BYTES;
    default: return OI_TYPE_INVALID;
    }
}

static const char *kind_name(ONNXType t)
{
    switch (t) {
    case ONNX_TYPE_TENSOR: return "tensor";
    case ONNX_TYPE_SEQUENCE: return "sequence";
    case ONNX_TYPE_MAP: return "map";
    case ONNX_TYPE_OPAQUE: return "opaque";
    case ONNX_TYPE_SPARSETENSOR: return "sparse tensor";
    case ONNX_TYPE_OPTIONAL: return "optional";
    default: return "unknown";
    }
}

/* ---- one tensor's metadata -------------------------------------------------------------- */

typedef struct ox_io_s {
    char *name;
    ONNXType kind;
    ONNXTensorElementDataType type;
    int ndim; /* -1: unknown rank */
    int64_t dims[OI_MAX_DIMS];
    /* Set by oi_onnx_backend_state from the declaration. An input's reshape: the shape past
     * the batch that the session is given (ndim -1: as sent), and its `declared` shape, whose
     * -1s give the reshape's theirs. An output's `declared` shape, reported instead of the
     * produced one when the config reshapes it (ndim -1: as produced), its -1s filled from the
     * produced shape where its `reshape` has -1s. */
    oi_io_spec_t reshape;
    oi_io_spec_t declared;
} ox_io_t;

static void io_free(ox_io_t *io, size_t n)
{
    for (size_t i = 0; io && i < n; i++)
        free(io[i].name);
    free(io);
}

/* The session's inputs (output = 0) or outputs (1), as a new array of *n; NULL and a message. */
static ox_io_t *session_io(OrtSession *session, int output, size_t *n, char **err)
{
    const OrtApi *api = ort.api;
    *n = 0;
    size_t count = 0;
    if ((*err = take_status(output ? api->SessionGetOutputCount(session, &count)
                                   : api->SessionGetInputCount(session, &count))) != NULL)
        return NULL;
    ox_io_t *io = calloc(count ? count : 1, sizeof(*io));
    if (io == NULL) {
        *err = strdup("out of memory");
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        char *name = NULL;
        OrtTypeInfo *info = NULL;
        *err = take_status(output ? api->SessionGetOutputName(session, i, ort.allocator, &name)
                                  : api->SessionGetInputName(session, i, ort.allocator, &name));
        if (*err == NULL) {
            io[i].name = strdup(name);
            free(take_status(api->AllocatorFree(ort.allocator, name)));
            if (io[i].name == NULL)
                *err = strdup("out of memory");
        }
        if (*err == NULL)
            *err = take_status(output ? api->SessionGetOutputTypeInfo(session, i, &info)
                                      : api->SessionGetInputTypeInfo(session, i, &info));
        if (*err == NULL)
            *err = take_status(api->GetOnnxTypeFromTypeInfo(info, &io[i].kind));
        io[i].ndim = -1;
        const OrtTensorTypeAndShapeInfo *tinfo = NULL;
        if (*err == NULL && io[i].kind == ONNX_TYPE_TENSOR)
            *err = take_status(api->CastTypeInfoToTensorInfo(info, &tinfo));
        if (*err == NULL && tinfo != NULL) {
            size_t nd = 0;
            *err = take_status(api->GetTensorElementType(tinfo, &io[i].type));
            if (*err == NULL)
                *err = take_status(api->GetDimensionsCount(tinfo, &nd));
            if (*err == NULL && nd > OI_MAX_DIMS)
                *err = strdup("a tensor of the model has more than 16 dimensions");
            if (*err == NULL) {
                io[i].ndim = (int)nd;
                *err = take_status(api->GetDimensions(tinfo, io[i].dims, nd));
            }
            for (size_t d = 0; d < nd && *err == NULL; d++)
                if (io[i].dims[d] < 0)
                    io[i].dims[d] = -1; /* symbolic or unknown */
        }
        if (info)
            api->ReleaseTypeInfo(info);
        if (*err != NULL) {
            io_free(io, count);
            return NULL;
        }
    }
    *n = count;
    return io;
}

/* ---- sessions --------------------------------------------------------------------------- */

static char *append_accel(OrtSessionOptions *so, const oi_onnx_accel_t *a, int device)
{
    const OrtApi *api = ort.api;
    char dev[16];
    snprintf(dev, sizeof(dev), "%d", device);
    const char *keys[a->n + 1], *values[a->n + 1];
    keys[0] = "device_id";
    values[0] = dev;
    for (size_t i = 0; i < a->n; i++) {
        keys[i + 1] = a->keys[i];
        values[i + 1] = a->values[i];
    }
    char *msg = NULL;
    if (strcmp(a->name, "cuda") == 0) {
        OrtCUDAProviderOptionsV2 *o = NULL;
        msg = take_status(api->CreateCUDAProviderOptions(&o));
        if (msg == NULL)
            msg = take_status(api->UpdateCUDAProviderOptions(o, keys, values, a->n + 1));
        if (msg == NULL)
            msg = take_status(api->SessionOptionsAppendExecutionProvider_CUDA_V2(so, o));
        if (o)
            api->ReleaseCUDAProviderOptions(o);
    } else if (strcmp(a->name, "tensorrt") == 0) {
        OrtTensorRTProviderOptionsV2 *o = NULL;
        msg = take_status(api->CreateTensorRTProviderOptions(&o));
        if (msg == NULL)
            msg = take_status(api->UpdateTensorRTProviderOptions(o, keys, values, a->n + 1));
        if (msg == NULL)
            msg = take_status(api->SessionOptionsAppendExecutionProvider_TensorRT_V2(so, o));
        if (o)
            api->ReleaseTensorRTProviderOptions(o);
    } else if (strcmp(a->name, "openvino") == 0) {
        msg = take_status(api->SessionOptionsAppendExecutionProvider(so, "OpenVINO", a->keys, a->values, a->n));
    } else {
        msg = strdup("unknown execution accelerator");
    }
    if (msg != NULL) {
        size_t n = strlen(msg) + strlen(a->name) + 64;
        char *full = malloc(n);
        if (full)
            snprintf(full, n, "execution accelerator '%s': %s", a->name, msg);
        free(msg);
        msg = full ? full : strdup("out of memory");
    }
    return msg;
}

/* A session for `device` (-1: CPU), or NULL with a new message in *err. */
static OrtSession *session_new(const oi_onnx_spec_t *spec, int device, char **err)
{
    const OrtApi *api = ort.api;
    OrtSessionOptions *so = NULL;
    OrtSession *session = NULL;
    *err = take_status(api->CreateSessionOptions(&so));
    if (*err == NULL)
        *err = take_status(api->SetSessionGraphOptimizationLevel(so, (GraphOptimizationLevel)spec->graph_level));
    if (*err == NULL)
        *err = take_status(api->SetSessionExecutionMode(so, spec->execution_mode ? ORT_PARALLEL : ORT_SEQUENTIAL));
    if (*err == NULL && spec->intra_op_threads > 0)
        *err = take_status(api->SetIntraOpNumThreads(so, spec->intra_op_threads));
    if (*err == NULL && spec->inter_op_threads > 0)
        *err = take_status(api->SetInterOpNumThreads(so, spec->inter_op_threads));
    if (device >= 0) {
        int cuda_given = 0;
        for (size_t i = 0; i < spec->n_gpu_accels && *err == NULL; i++) {
            cuda_given |= strcmp(spec->gpu_accels[i].name, "cuda") == 0;
            *err = append_accel(so, &spec->gpu_accels[i], device);
        }
        if (*err == NULL && !cuda_given) {
            oi_onnx_accel_t cuda = {.name = "cuda"};
            *err = append_accel(so, &cuda, device);
        }
    } else {
        for (size_t i = 0; i < spec->n_cpu_accels && *err == NULL; i++)
            *err = append_accel(so, &spec->cpu_accels[i], device);
    }
    if (*err == NULL && spec->n_external > 0)
        *err = ort.external_in_memory
                   ? take_status(api->AddExternalInitializersFromFilesInMemory(
                         so, spec->external_names, spec->external_data, spec->external_lengths, spec->n_external))
                   : strdup("the model keeps tensors in external data files, which openinfer reads with "
                            "ONNX Runtime 1.18 or newer; pip install -U onnxruntime");
    if (*err == NULL)
        *err = take_status(api->CreateSession(ort.env, spec->path, so, &session));
    if (so)
        api->ReleaseSessionOptions(so);
    return *err == NULL ? session : NULL;
}

/* ---- description ------------------------------------------------------------------------ */

static int append_json_string(oi_sbuf_t *b, const char *s)
{
    int ok = oi_sbuf_append(b, "\"", 1) == 0;
    for (const unsigned char *c = (const unsigned char *)s; ok && *c; c++)
        ok = (*c == '"' || *c == '\\' || *c < 0x20) ? oi_sbuf_printf(b, "\\u%04x", *c) == 0
                                                    : oi_sbuf_append(b, c, 1) == 0;
    return ok && oi_sbuf_append(b, "\"", 1) == 0 ? 0 : -1;
}

static int describe_io(oi_sbuf_t *b, const char *key, const ox_io_t *io, size_t n)
{
    int ok = oi_sbuf_printf(b, "\"%s\":[", key) == 0;
    for (size_t i = 0; ok && i < n; i++) {
        oi_dtype_t dt = io[i].kind == ONNX_TYPE_TENSOR ? from_onnx(io[i].type) : OI_TYPE_INVALID;
        ok =
            oi_sbuf_printf(b, "%s{\"name\":", i ? "," : "") == 0 && append_json_string(b, io[i].name) == 0 &&
            oi_sbuf_printf(b, ",\"datatype\":\"%s\",\"onnx_type\":%d,\"kind\":\"%s\",\"shape\":",
                           dt == OI_TYPE_INVALID ? "" : oi_dtype_name(dt), (int)io[i].type, kind_name(io[i].kind)) == 0;
        if (ok && io[i].ndim < 0) {
            ok = oi_sbuf_printf(b, "null}") == 0;
            continue;
        }
        ok = ok && oi_sbuf_append(b, "[", 1) == 0;
        for (int d = 0; ok && d < io[i].ndim; d++)
            ok = oi_sbuf_printf(b, "%s%" PRId64, d ? "," : "", io[i].dims[d]) == 0;
        ok = ok && oi_sbuf_append(b, "]}", 2) == 0;
    }
    return ok && oi_sbuf_append(b, "]", 1) == 0 ? 0 : -1;
}

char *oi_onnx_describe(const oi_onnx_spec_t *spec, void **session_out, char **err)
{
    *err = NULL;
    *session_out = NULL;
    if (ort.handle == NULL) {
        *err = strdup("ONNX Runtime is not loaded");
        return NULL;
    }
    OrtSession *session = session_new(spec, spec->devices ? spec->devices[0] : -1, err);
    if (session == NULL)
        return NULL;
    size_t n_in = 0, n_out = 0;
    ox_io_t *in = session_io(session, 0, &n_in, err), *out = NULL;
    if (in != NULL)
        out = session_io(session, 1, &n_out, err);
    if (out == NULL) {
        ort.api->ReleaseSession(session);
        io_free(in, n_in);
        return NULL;
    }
    oi_sbuf_t b = {0};
    int ok = oi_sbuf_append(&b, "{", 1) == 0 && describe_io(&b, "inputs", in, n_in) == 0 &&
             oi_sbuf_append(&b, ",", 1) == 0 && describe_io(&b, "outputs", out, n_out) == 0 &&
             oi_sbuf_append(&b, "}", 2) == 0; /* with the NUL */
    io_free(in, n_in);
    io_free(out, n_out);
    if (!ok) {
        ort.api->ReleaseSession(session);
        oi_sbuf_free(&b);
        *err = strdup("out of memory");
        return NULL;
    }
    *session_out = session;
    return b.data;
}

void oi_onnx_session_release(void *session)
{
    if (session != NULL)
        ort.api->ReleaseSession(session);
}

char *oi_onnx_providers(char **err)
{
    *err = NULL;
    if (ort.handle == NULL) {
        *err = strdup("ONNX Runtime is not loaded");
        return NULL;
    }
    char **names = NULL;
    int n = 0;
    if ((*err = take_status(ort.api->GetAvailableProviders(&names, &n))) != NULL)
        return NULL;
    oi_sbuf_t b = {0};
    int ok = oi_sbuf_append(&b, "[", 1) == 0;
    for (int i = 0; ok && i < n; i++)
        ok = (i == 0 || oi_sbuf_append(&b, ",", 1) == 0) && append_json_string(&b, names[i]) == 0;
    ok = ok && oi_sbuf_append(&b, "]", 2) == 0;
    free(take_status(ort.api->ReleaseAvailableProviders(names, n)));
    if (!ok) {
        oi_sbuf_free(&b);
        *err = strdup("out of memory");
        return NULL;
    }
    return b.data;
}

/* ---- state ------------------------------------------------------------------------------ */

typedef struct ox_state_s {
    char *model_name;
    int max_batch_size;
    size_t n_inputs; /* the session's inputs, in its order; all are declared */
    ox_io_t *inputs;
    size_t n_outputs; /* the session's outputs */
    ox_io_t *outputs;
    /* Executors take a free session for each call, so each session (and its device) runs one
     * request at a time. There are as many sessions as executors. */
    oi__instances_t pool;
    int n_instances;
    OrtSession *sessions[];
} ox_state_t;

static void ox_release(void *state)
{
    ox_state_t *s = state;
    if (s == NULL)
        return;
    for (int i = 0; i < s->n_instances; i++)
        if (s->sessions[i])
            ort.api->ReleaseSession(s->sessions[i]);
    io_free(s->inputs, s->n_inputs);
    io_free(s->outputs, s->n_outputs);
    free(s->model_name);
    oi__instances_destroy(&s->pool);
    free(s);
}

static char *errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *errorf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p == NULL)
        return strdup("out of memory");
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* Reports an output the config reshapes in its declared shape, with the batch as produced
 * and each variable dimension the produced size of the reshape's matching one (as Triton's
 * InferenceResponse::Output::Reshape). */
static void reshape_output(const ox_state_t *s, const ox_io_t *io, oi_tensor_t *t)
{
    const oi_io_spec_t *d = &io->declared;
    int skip = s->max_batch_size > 0 && d->ndim > 0 ? 1 : 0;
    int64_t produced[OI_MAX_DIMS];
    int n = t->ndim;
    memcpy(produced, t->shape, (size_t)n * sizeof(int64_t));
    int rn = io->reshape.ndim == n - skip ? io->reshape.ndim : 0;
    oi_shape_map_wildcards(io->reshape.dims, rn, produced + skip, d->dims + skip, d->ndim - skip, t->shape + skip);
    t->ndim = d->ndim;
    if (skip)
        t->shape[0] = n > 0 ? produced[0] : 1;
}

/* Checks the declaration against the session's own tensors: every declared tensor exists
 * there with the same datatype, and every session input is declared. */
static char *check_declared(const ox_state_t *s, const oi_io_spec_t *decl, uint32_t n_decl, const ox_io_t *io,
                            size_t n_io, const char *kind)
{
    for (uint32_t i = 0; i < n_decl; i++) {
        size_t k = 0;
        while (k < n_io && strcmp(io[k].name, decl[i].name) != 0)
            k++;
        if (k == n_io)
            return errorf("model '%s': %s '%s' is not a tensor of the ONNX model", s->model_name, kind, decl[i].name);
        oi_dtype_t dt = io[k].kind == ONNX_TYPE_TENSOR ? from_onnx(io[k].type) : OI_TYPE_INVALID;
        if (dt == OI_TYPE_INVALID)
            return errorf("model '%s': %s '%s' is an ONNX %s (element type %d), which has no V2 datatype",
                          s->model_name, kind, decl[i].name, kind_name(io[k].kind), (int)io[k].type);
        if (dt != decl[i].dtype)
            return errorf("model '%s': %s '%s' is declared %s, the ONNX model has %s", s->model_name, kind,
                          decl[i].name, oi_dtype_name(decl[i].dtype), oi_dtype_name(dt));
    }
    return NULL;
}

void *oi_onnx_backend_state(const char *model_name, const oi_onnx_spec_t *spec, int max_batch_size,
                            const oi_io_spec_t *inputs, uint32_t n_inputs, const oi_io_spec_t *outputs,
                            uint32_t n_outputs, char **err)
{
    *err = NULL;
    if (ort.handle == NULL) { /* then no session can have been made */
        *err = strdup("ONNX Runtime is not loaded");
        return NULL;
    }
    int n_inst = spec->instances < 1 ? 1 : spec->instances;
    ox_state_t *s = calloc(1, sizeof(*s) + (size_t)n_inst * sizeof(OrtSession *));
    if (s == NULL) {
        oi_onnx_session_release(spec->session);
        *err = strdup("out of memory");
        return NULL;
    }
    s->n_instances = n_inst;
    s->sessions[0] = spec->session;
    if (oi__instances_init(&s->pool, n_inst) != 0 || (s->model_name = strdup(model_name)) == NULL) {
        ox_release(s);
        *err = strdup("out of memory");
        return NULL;
    }
    s->max_batch_size = max_batch_size;
    for (int i = spec->session != NULL; i < n_inst; i++) {
        s->sessions[i] = session_new(spec, spec->devices ? spec->devices[i] : -1, err);
        if (s->sessions[i] == NULL)
            goto fail;
    }
    if ((s->inputs = session_io(s->sessions[0], 0, &s->n_inputs, err)) == NULL ||
        (s->outputs = session_io(s->sessions[0], 1, &s->n_outputs, err)) == NULL)
        goto fail;
    if ((*err = check_declared(s, inputs, n_inputs, s->inputs, s->n_inputs, "input")) != NULL ||
        (*err = check_declared(s, outputs, n_outputs, s->outputs, s->n_outputs, "output")) != NULL)
        goto fail;
    for (size_t k = 0; k < s->n_inputs; k++) {
        uint32_t i = 0;
        while (i < n_inputs && strcmp(inputs[i].name, s->inputs[k].name) != 0)
            i++;
        if (i == n_inputs) {
            *err = errorf("model '%s': the ONNX model's input '%s' is not declared", model_name, s->inputs[k].name);
            goto fail;
        }
        s->inputs[k].reshape = spec->input_reshape ? spec->input_reshape[i] : (oi_io_spec_t){.ndim = -1};
        s->inputs[k].reshape.name = NULL;
        s->inputs[k].declared = inputs[i];
        s->inputs[k].declared.name = NULL;
    }
    for (size_t k = 0; k < s->n_outputs; k++) {
        s->outputs[k].declared = (oi_io_spec_t){.ndim = -1};
        for (uint32_t i = 0; i < n_outputs; i++)
            if (strcmp(outputs[i].name, s->outputs[k].name) == 0 && spec->output_reshape &&
                spec->output_reshape[i].ndim >= 0) {
                s->outputs[k].declared = outputs[i];
                s->outputs[k].declared.name = NULL;
                s->outputs[k].reshape = spec->output_reshape[i];
                s->outputs[k].reshape.name = NULL;
            }
    }
    return s;
fail:
    ox_release(s);
    return NULL;
}

/* ---- execution -------------------------------------------------------------------------- */

/* A response buffer that owns one OrtValue ONNX Runtime allocated: released once sent. */
static void free_value(oi_buf_t *b)
{
    ort.api->ReleaseValue(b->ctx);
    free(b);
}

/* A string tensor over the request's length-prefixed BYTES elements (validated by the
 * server): ONNX Runtime keeps its own strings, so each element is copied once. */
static char *bytes_value(const oi_tensor_t *t, OrtValue **out)
{
    const OrtApi *api = ort.api;
    int64_t count = 0;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return strdup("bad shape");
    char *msg = take_status(api->CreateTensorAsOrtValue(ort.allocator, t->shape, (size_t)t->ndim,
                                                        ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING, out));
    const unsigned char *p = (const unsigned char *)t->data;
    for (int64_t i = 0; i < count && msg == NULL; i++) {
        uint32_t len = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        char *dst = NULL;
        msg = take_status(api->GetResizedStringTensorElementBuffer(*out, (size_t)i, len, &dst));
        if (msg == NULL && len > 0)
            memcpy(dst, p + 4, len);
        p += 4 + (size_t)len;
    }
    return msg;
}

/* A string output as the V2 layout (a 4-byte little-endian length before each element). */
static char *bytes_output(const OrtValue *v, size_t count, oi_tensor_t *t)
{
    const OrtApi *api = ort.api;
    size_t total = 0;
    char *msg = take_status(api->GetStringTensorDataLength(v, &total));
    if (msg != NULL)
        return msg;
    size_t *offsets = malloc((count ? count : 1) * sizeof(size_t));
    oi_buf_t *b = oi_buf_new(total + 4 * count + 1);
    if (offsets == NULL || b == NULL) {
        free(offsets);
        if (b)
            oi_buf_unref(b);
        return strdup("out of memory");
    }
    /* The content lands at the end of the buffer, then moves down between the prefixes. */
    char *content = b->data + 4 * count;
    if (count > 0 && (msg = take_status(api->GetStringTensorContent(v, content, total, offsets, count))) != NULL) {
        free(offsets);
        oi_buf_unref(b);
        return msg;
    }
    /* Element i moves from content + offsets[i] down to 4 * (i + 1) + offsets[i]: never onto
     * the bytes of a later element, which start at or past 4 * count + offsets[i + 1]. */
    char *w = b->data;
    for (size_t i = 0; i < count; i++) {
        size_t end = i + 1 < count ? offsets[i + 1] : total;
        size_t len = end - offsets[i];
        w[0] = (char)(len & 0xff);
        w[1] = (char)(len >> 8 & 0xff);
        w[2] = (char)(len >> 16 & 0xff);
        w[3] = (char)(len >> 24 & 0xff);
        memmove(w + 4, content + offsets[i], len);
        w += 4 + len;
    }
    free(offsets);
    b->len = (size_t)(w - b->data);
    t->data = b->data;
    t->byte_size = b->len;
    t->owner = b;
    return NULL;
}

static const ox_io_t *find_io(const ox_io_t *io, size_t n, const char *name)
{
    for (size_t k = 0; k < n; k++)
        if (strcmp(io[k].name, name) == 0)
            return &io[k];
    return NULL;
}

/* The batch size of a request to a batching model: dimension 0 of its first input. */
static int64_t request_batch(const oi_request_t *req)
{
    return req->n_inputs > 0 && req->inputs[0].ndim > 0 ? req->inputs[0].shape[0] : -1;
}

/* A numeric output whose shape the model states (up to the batch) goes into memory openinfer
 * owns, bound before the run; returns that buffer (one reference) or NULL when the shape is
 * not known or anything fails, in which case ONNX Runtime allocates the output itself. */
static oi_buf_t *preallocate(const ox_state_t *s, const ox_io_t *o, int64_t batch, OrtValue **value)
{
    oi_dtype_t dt = from_onnx(o->type);
    if (o->kind != ONNX_TYPE_TENSOR || dt == OI_TYPE_BYTES || dt == OI_TYPE_INVALID || o->ndim < 0)
        return NULL;
    int64_t shape[OI_MAX_DIMS], count = 0;
    for (int d = 0; d < o->ndim; d++) {
        shape[d] = o->dims[d];
        if (d == 0 && shape[d] < 0 && s->max_batch_size > 0)
            shape[d] = batch;
        if (shape[d] < 0)
            return NULL;
    }
    if (oi_shape_elements(shape, o->ndim, &count) != 0 || count == 0)
        return NULL;
    size_t bytes = (size_t)count * oi_dtype_size(dt);
    oi_buf_t *b = oi_buf_new(bytes);
    if (b == NULL)
        return NULL;
    b->len = bytes;
    OrtStatus *st =
        ort.api->CreateTensorWithDataAsOrtValue(ort.cpu, b->data, bytes, shape, (size_t)o->ndim, o->type, value);
    if (st != NULL) {
        ort.api->ReleaseStatus(st);
        *value = NULL;
        oi_buf_unref(b);
        return NULL;
    }
    return b;
}

/* Describes the run's failure on `what` as a status of `code` and frees `msg`. */
static oi_status_t *run_error(const ox_state_t *s, int code, const char *kind, const char *what, char *msg)
{
    oi_status_t *st = oi_status_new(code, "model '%s' %s '%s': %s", s->model_name, kind, what, msg);
    free(msg);
    return st;
}

/* Fills response tensor `t` from run output `v`: numeric data stays where it is (in `prealloc`,
 * or in `v` itself, whose ownership moves to *owner on first use); strings are laid out anew. */
static char *take_output(OrtValue **v, oi_buf_t *prealloc, oi_buf_t **owner, oi_tensor_t *t)
{
    const OrtApi *api = ort.api;
    OrtTensorTypeAndShapeInfo *info = NULL;
    size_t nd = 0, count = 0;
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    char *msg = take_status(api->GetTensorTypeAndShape(*v, &info));
    if (msg == NULL)
        msg = take_status(api->GetTensorElementType(info, &et));
    if (msg == NULL)
        msg = take_status(api->GetDimensionsCount(info, &nd));
    if (msg == NULL && nd > OI_MAX_DIMS)
        msg = strdup("more than 16 dimensions");
    if (msg == NULL)
        msg = take_status(api->GetDimensions(info, t->shape, nd));
    if (msg == NULL)
        msg = take_status(api->GetTensorShapeElementCount(info, &count));
    if (info)
        api->ReleaseTensorTypeAndShapeInfo(info);
    if (msg == NULL && from_onnx(et) != t->dtype)
        msg = errorf("produced element type %d, declared %s", (int)et, oi_dtype_name(t->dtype));
    if (msg != NULL)
        return msg;
    t->ndim = (int)nd;
    if (t->dtype == OI_TYPE_BYTES)
        return bytes_output(*v, count, t);
    t->byte_size = count * oi_dtype_size(t->dtype);
    if (t->byte_size == 0)
        return NULL;
    void *data = NULL;
    if ((msg = take_status(api->GetTensorMutableData(*v, &data))) != NULL)
        return msg;
    if (prealloc == NULL && *owner == NULL) {
        if ((*owner = oi_buf_wrap(data, t->byte_size, free_value, *v)) == NULL)
            return strdup("out of memory");
        *v = NULL; /* the owner has it now */
    }
    t->data = data;
    t->owner = oi_buf_ref(prealloc ? prealloc : *owner);
    return NULL;
}

static oi_status_t *ox_execute(void *state, const oi_request_t *req, const char *const *names, uint32_t n,
                               oi_response_t *resp)
{
    ox_state_t *s = state;
    const OrtApi *api = ort.api;
    static char empty[8]; /* ONNX Runtime wants a pointer even for no elements */
    size_t n_in = s->n_inputs;
    uint32_t cap = n ? n : 1, n_run = 0;
    const char *in_names[n_in ? n_in : 1];
    OrtValue *in_values[n_in ? n_in : 1];
    /* The distinct outputs asked for, in the order first asked: what Run computes. */
    const char *run_names[cap];
    OrtValue *run_values[cap];
    oi_buf_t *run_bufs[cap], *owners[cap];
    const ox_io_t *run_io[cap];
    uint32_t run_index[cap];
    memset(in_values, 0, sizeof(in_values));
    memset(run_values, 0, sizeof(run_values));
    memset(run_bufs, 0, sizeof(run_bufs));
    memset(owners, 0, sizeof(owners));
    oi_status_t *st = NULL;
    for (size_t k = 0; k < n_in && st == NULL; k++) {
        const oi_tensor_t *t = NULL;
        for (uint32_t j = 0; j < req->n_inputs && t == NULL; j++)
            if (strcmp(req->inputs[j].name, s->inputs[k].name) == 0)
                t = &req->inputs[j];
        if (t == NULL) { /* validation requires every declared input */
            st = oi_status_new(OI_BAD_REQUEST, "missing input '%s' for model '%s'", s->inputs[k].name, s->model_name);
            break;
        }
        in_names[k] = s->inputs[k].name;
        oi_tensor_t view = *t; /* the tensor as the session sees it */
        if (s->inputs[k].reshape.ndim >= 0 &&
            (st = oi_tensor_reshape(t, &s->inputs[k].declared, &s->inputs[k].reshape, s->max_batch_size > 0,
                                    view.shape, &view.ndim)) != NULL)
            break;
        char *msg = t->dtype == OI_TYPE_BYTES
                        ? bytes_value(&view, &in_values[k])
                        : take_status(api->CreateTensorWithDataAsOrtValue(ort.cpu, t->byte_size ? t->data : empty,
                                                                          t->byte_size, view.shape, (size_t)view.ndim,
                                                                          s->inputs[k].type, &in_values[k]));
        if (msg != NULL)
            st = run_error(s, OI_BAD_REQUEST, "input", t->name, msg);
    }
    int64_t batch = s->max_batch_size > 0 ? request_batch(req) : -1;
    for (uint32_t i = 0; i < n && st == NULL; i++) {
        const ox_io_t *io = find_io(s->outputs, s->n_outputs, names[i]);
        if (io == NULL) {
            st = oi_status_new(OI_INTERNAL, "model '%s' has no output '%s'", s->model_name, names[i]);
            break;
        }
        uint32_t r = 0;
        while (r < n_run && run_io[r] != io)
            r++;
        if (r == n_run) {
            run_io[r] = io;
            run_names[r] = io->name;
            run_bufs[r] = preallocate(s, io, batch, &run_values[r]);
            n_run++;
        }
        run_index[i] = r;
    }
    if (st == NULL) {
        int inst = oi__instances_acquire(&s->pool);
        char *msg = take_status(api->Run(s->sessions[inst], NULL, in_names, (const OrtValue *const *)in_values, n_in,
                                         run_names, n_run, run_values));
        oi__instances_release(&s->pool, inst);
        if (msg != NULL) {
            st = oi_status_new(OI_INTERNAL, "model '%s': %s", s->model_name, msg);
            free(msg);
        }
    }
    if (st == NULL && (resp->outputs = calloc(cap, sizeof(oi_tensor_t))) == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n && st == NULL; i++) {
        uint32_t r = run_index[i];
        oi_tensor_t *t = &resp->outputs[i];
        const oi_tensor_t *first = NULL; /* the same output asked for earlier */
        for (uint32_t j = 0; j < i && first == NULL; j++)
            if (run_index[j] == r)
                first = &resp->outputs[j];
        if (first != NULL) {
            *t = *first;
            t->name = names[i];
            if (t->owner)
                oi_buf_ref(t->owner);
            resp->n_outputs = i + 1;
            continue;
        }
        t->name = names[i];
        t->dtype = from_onnx(run_io[r]->type);
        char *msg = run_values[r] == NULL ? strdup("no value produced")
                                          : take_output(&run_values[r], run_bufs[r], &owners[r], t);
        if (msg == NULL && run_io[r]->declared.ndim >= 0)
            reshape_output(s, run_io[r], t);
        if (msg != NULL) {
            st = run_error(s, OI_INTERNAL, "output", names[i], msg);
            break;
        }
        resp->n_outputs = i + 1;
    }
    for (uint32_t r = 0; r < n_run; r++) {
        if (run_bufs[r])
            oi_buf_unref(run_bufs[r]);
        if (owners[r])
            oi_buf_unref(owners[r]); /* the response tensors hold their own references */
        if (run_values[r])
            api->ReleaseValue(run_values[r]); /* preallocated wrappers, strings, or unused */
    }
    for (size_t k = 0; k < n_in; k++)
        if (in_values[k])
            api->ReleaseValue(in_values[k]);
    return st;
}

const oi_backend_t oi_onnx_backend = {
    .name = "onnxruntime",
    .execute = ox_execute,
    .release = ox_release,
    .runs_on_loop = 1,
};
