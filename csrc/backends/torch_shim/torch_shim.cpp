// The libtorch shim: TorchScript modules behind the C ABI of torch_shim.h. Built against the
// installed torch by python/openinfer/_torch_build.py (at pip install, or on first use).
//
// Every extern "C" function catches everything: an exception escaping into the C core would
// terminate the server. Errors go back through the caller's `err` out-parameter only.

#include "backends/torch_shim/torch_shim.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#ifdef OITS_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct oits_module_s {
    torch::jit::Module module;
    // Set for a PT2 package instead of `module`: its forward is the package's compiled run().
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package;
    c10::Device device{c10::kCPU};
    oits_options_t opts{};
    std::string path;
#ifdef OITS_WITH_CUDA
    // One stream and one pinned staging buffer per module, i.e. per model instance: the
    // backend runs one forward at a time on a CUDA module (see torch_backend.c).
    std::optional<c10::cuda::CUDAStream> stream;
    at::Tensor staging;
#endif
};

struct oits_tensor_s {
    at::Tensor tensor;
};

namespace {

char *dup_cstr(const std::string &s)
{
    char *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p != nullptr)
        std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

void set_err(char **err, const std::string &msg)
{
    if (err != nullptr)
        *err = dup_cstr(msg);
}

// Runs `fn`, turning any exception into an error message. c10::Error's what() carries a C++
// backtrace; what_without_backtrace() is the part a person wants to read.
template <typename F>
bool guarded(char **err, const char *what, F &&fn)
{
    try {
        fn();
        return true;
    } catch (const c10::Error &e) {
        set_err(err, std::string(what) + ": " + e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_err(err, std::string(what) + ": " + e.what());
    } catch (...) {
        set_err(err, std::string(what) + ": unknown C++ exception");
    }
    return false;
}

std::optional<at::ScalarType> scalar_type(oi_dtype_t t)
{
    switch (t) {
    case OI_TYPE_BOOL: return at::kBool;
    case OI_TYPE_UINT8: return at::kByte;
    case OI_TYPE_UINT16: return at::kUInt16;
    case OI_TYPE_UINT32: return at::kUInt32;
    case OI_TYPE_UINT64: return at::kUInt64;
    case OI_TYPE_INT8: return at::kChar;
    case OI_TYPE_INT16: return at::kShort;
    case OI_TYPE_INT32: return at::kInt;
    case OI_TYPE_INT64: return at::kLong;
    case OI_TYPE_FP16: return at::kHalf;
    case OI_TYPE_FP32: return at::kFloat;
    case OI_TYPE_FP64: return at::kDouble;
    case OI_TYPE_BF16: return at::kBFloat16;
    default: return std::nullopt;
    }
}

oi_dtype_t v2_dtype(at::ScalarType t)
{
    switch (t) {
    case at::kBool: return OI_TYPE_BOOL;
    case at::kByte: return OI_TYPE_UINT8;
    case at::kUInt16: return OI_TYPE_UINT16;
    case at::kUInt32: return OI_TYPE_UINT32;
    case at::kUInt64: return OI_TYPE_UINT64;
    case at::kChar: return OI_TYPE_INT8;
    case at::kShort: return OI_TYPE_INT16;
    case at::kInt: return OI_TYPE_INT32;
    case at::kLong: return OI_TYPE_INT64;
    case at::kHalf: return OI_TYPE_FP16;
    case at::kFloat: return OI_TYPE_FP32;
    case at::kDouble: return OI_TYPE_FP64;
    case at::kBFloat16: return OI_TYPE_BF16;
    default: return OI_TYPE_INVALID;
    }
}

std::string json_string(const std::string &s)
{
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

// The tensors of the module's `example_inputs` attribute: a Tensor or a tuple/list of them.
std::optional<std::vector<at::Tensor>> example_inputs(const torch::jit::Module &m)
{
    if (!m.hasattr("example_inputs"))
        return std::nullopt;
    c10::IValue v = m.attr("example_inputs");
    std::vector<at::Tensor> out;
    if (v.isTensor()) {
        out.push_back(v.toTensor());
    } else if (v.isTuple()) {
        for (const auto &e : v.toTupleRef().elements())
            out.push_back(e.toTensor());
    } else if (v.isList()) {
        for (const auto &e : v.toListRef())
            out.push_back(e.toTensor());
    } else {
        throw std::runtime_error("attribute example_inputs is " + v.tagKind() +
                                 "; expected a Tensor or a tuple or list of Tensors");
    }
    return out;
}

// A host, contiguous tensor that owns its memory: a view of an input (an identity model
// returns its argument) is copied, because request memory is freed before a kept output.
at::Tensor owned_host_output(at::Tensor t, const std::vector<std::pair<const char *, size_t>> &borrowed)
{
    t = t.contiguous();
    if (t.numel() > 0) {
        const char *p = static_cast<const char *>(t.storage().data());
        for (const auto &[base, len] : borrowed)
            if (base != nullptr && p >= base && p < base + len)
                return t.clone();
    }
    return t;
}

void add_output(std::vector<oits_output_t> &outs, const at::Tensor &src, const std::string *name,
                const std::vector<std::pair<const char *, size_t>> &borrowed, size_t index)
{
    if (src.dim() > OITS_MAX_DIMS)
        throw std::runtime_error("output " + std::to_string(index) + " has " + std::to_string(src.dim()) +
                                 " dimensions; at most " + std::to_string(OITS_MAX_DIMS));
    if (src.is_sparse() || src.is_quantized())
        throw std::runtime_error("output " + std::to_string(index) + " is a sparse or quantized tensor; "
                                 "return a dense one");
    at::Tensor t = owned_host_output(src, borrowed);
    oits_output_t o{};
    o.dtype = v2_dtype(t.scalar_type());
    o.ndim = static_cast<int>(t.dim());
    for (int i = 0; i < o.ndim; i++)
        o.shape[i] = t.size(i);
    o.nbytes = t.nbytes();
    o.data = t.numel() > 0 ? t.data_ptr() : nullptr;
    o.tensor = new oits_tensor_s{std::move(t)};
    if (name != nullptr && (o.name = dup_cstr(*name)) == nullptr) {
        delete o.tensor;
        throw std::bad_alloc();
    }
    outs.push_back(o);
}

// A List[str] result as a BYTES output of shape [n]: each element a 4-byte little-endian length
// then its bytes, in a byte tensor that owns them (Triton's pytorch backend serves List[str]
// the same way).
void add_strings_output(std::vector<oits_output_t> &outs, const c10::List<c10::IValue> &list,
                        const std::string *name, size_t index)
{
    size_t total = 0;
    for (const c10::IValue &v : list) {
        if (!v.isString())
            throw std::runtime_error("output " + std::to_string(index) + " is a list holding " + v.tagKind() +
                                     "; a list output must be List[str] (BYTES)");
        total += 4 + v.toStringRef().size();
    }
    at::Tensor t = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
    auto *p = static_cast<unsigned char *>(t.data_ptr());
    for (const c10::IValue &v : list) {
        const std::string &s = v.toStringRef();
        if (s.size() > UINT32_MAX)
            throw std::runtime_error("output " + std::to_string(index) + " has a string of 4 GiB or more");
        uint32_t n = static_cast<uint32_t>(s.size());
        for (int b = 0; b < 4; b++)
            *p++ = static_cast<unsigned char>(n >> (8 * b));
        std::memcpy(p, s.data(), s.size());
        p += s.size();
    }
    oits_output_t o{};
    o.dtype = OI_TYPE_BYTES;
    o.ndim = 1;
    o.shape[0] = static_cast<int64_t>(list.size());
    o.nbytes = total;
    o.data = total > 0 ? t.data_ptr() : nullptr;
    o.tensor = new oits_tensor_s{std::move(t)};
    if (name != nullptr && (o.name = dup_cstr(*name)) == nullptr) {
        delete o.tensor;
        throw std::bad_alloc();
    }
    outs.push_back(o);
}

// A BYTES input (validated by the server: `count` elements, each a 4-byte little-endian length
// then its bytes) as the List[str] forward() takes.
c10::IValue strings_input(const oits_input_t &in, int64_t count)
{
    c10::List<std::string> list;
    list.reserve(static_cast<size_t>(count));
    const auto *p = static_cast<const unsigned char *>(in.data);
    for (int64_t i = 0; i < count; i++) {
        uint32_t n = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
        list.push_back(std::string(reinterpret_cast<const char *>(p + 4), n));
        p += 4 + n;
    }
    return list;
}

void free_outputs(std::vector<oits_output_t> &outs)
{
    for (auto &o : outs) {
        std::free(o.name);
        delete o.tensor;
    }
    outs.clear();
}

// Whether a result is one List[str] output rather than a list of outputs.
bool is_strings(const c10::IValue &v)
{
    return v.isList() && v.type()->containedType(0)->kind() == c10::TypeKind::StringType;
}

// Flattens forward()'s result into outputs in order: Tensor or List[str], tuple or list of
// them, or a dict of str -> them.
void collect(const c10::IValue &result, std::vector<oits_output_t> &outs,
             const std::vector<std::pair<const char *, size_t>> &borrowed)
{
    auto element = [&](const c10::IValue &v, size_t i, const std::string *name) {
        if (is_strings(v)) {
            add_strings_output(outs, v.toList(), name, i);
            return;
        }
        if (!v.isTensor())
            throw std::runtime_error("forward() returned " + v.tagKind() + " as output " + std::to_string(i) +
                                     "; only Tensors and List[str] can be served");
        add_output(outs, v.toTensor(), name, borrowed, i);
    };
    if (result.isTensor() || is_strings(result)) {
        element(result, 0, nullptr);
    } else if (result.isTuple()) {
        const auto &els = result.toTupleRef().elements();
        for (size_t i = 0; i < els.size(); i++)
            element(els[i], i, nullptr);
    } else if (result.isList()) {
        auto list = result.toListRef();
        for (size_t i = 0; i < list.size(); i++)
            element(list[i], i, nullptr);
    } else if (result.isGenericDict()) {
        size_t i = 0;
        for (const auto &kv : result.toGenericDict()) {
            if (!kv.key().isString())
                throw std::runtime_error("forward() returned a dict with " + kv.key().tagKind() +
                                         " keys; expected str keys (the output names)");
            std::string key = kv.key().toStringRef();
            element(kv.value(), i++, &key);
        }
    } else {
        throw std::runtime_error("forward() returned " + result.tagKind() +
                                 "; expected a Tensor, or a tuple, list or dict of Tensors");
    }
}

// Per executor thread: at::set_num_threads affects the calling thread's OpenMP team size, so
// it is applied on the thread that runs forward, once per thread and count.
void apply_intra_op_threads(int n)
{
    thread_local int applied = 0;
    if (n > 0 && applied != n) {
        at::set_num_threads(n);
        applied = n;
    }
}

// The package's outputs, in the order of its flattened output spec.
void collect_package(const std::vector<at::Tensor> &result, std::vector<oits_output_t> &outs,
                     const std::vector<std::pair<const char *, size_t>> &borrowed)
{
    for (size_t i = 0; i < result.size(); i++)
        add_output(outs, result[i], nullptr, borrowed, i);
}

// Runs the module (TorchScript forward, or the package's run) on `args` and flattens the
// result with collect/collect_package.
void call_module(oits_module_t *m, std::vector<c10::IValue> args, std::vector<oits_output_t> &outs,
                 const std::vector<std::pair<const char *, size_t>> &borrowed)
{
    if (!m->package) {
        collect(m->module.forward(std::move(args)), outs, borrowed);
        return;
    }
    std::vector<at::Tensor> tensors;
    tensors.reserve(args.size());
    for (auto &a : args)
        tensors.push_back(a.toTensor());
    void *stream = nullptr;
#ifdef OITS_WITH_CUDA
    if (m->device.is_cuda())
        stream = m->stream->stream();
#endif
    collect_package(m->package->run(tensors, stream), outs, borrowed);
}

int run_forward(oits_module_t *m, std::vector<c10::IValue> args,
                const std::vector<std::pair<const char *, size_t>> &borrowed, oits_output_t **outputs,
                size_t *n_outputs)
{
    apply_intra_op_threads(m->opts.intra_op_threads);
    torch::NoGradGuard no_grad;
    c10::InferenceMode inference(m->opts.inference_mode != 0);
    torch::jit::GraphOptimizerEnabledGuard optimize(m->opts.disable_optimized == 0);
    std::vector<oits_output_t> outs;
    try {
#ifdef OITS_WITH_CUDA
        if (m->device.is_cuda()) {
            c10::cuda::CUDAStreamGuard stream_guard(*m->stream);
            // Results come back to pinned host memory, one copy each, then one wait.
            std::vector<oits_output_t> dev;
            call_module(m, std::move(args), dev, {});
            for (auto &o : dev) {
                at::Tensor d = o.tensor->tensor;
                at::Tensor h = at::empty(d.sizes(), d.options().device(c10::kCPU).pinned_memory(true));
                h.copy_(d, /*non_blocking=*/true);
                o.tensor->tensor = h;
                o.data = h.numel() > 0 ? h.data_ptr() : nullptr;
            }
            m->stream->synchronize();
            outs = std::move(dev);
        } else
#endif
        {
            call_module(m, std::move(args), outs, borrowed);
        }
    } catch (...) {
        free_outputs(outs);
        throw;
    }
    auto *arr = static_cast<oits_output_t *>(std::calloc(outs.empty() ? 1 : outs.size(), sizeof(oits_output_t)));
    if (arr == nullptr) {
        free_outputs(outs);
        throw std::bad_alloc();
    }
    std::copy(outs.begin(), outs.end(), arr);
    *outputs = arr;
    *n_outputs = outs.size();
    return 0;
}

#ifdef OITS_WITH_CUDA
// Copies every input into the module's pinned staging buffer, then to the device in one
// transfer on the module's stream; the arguments are views of that one device block.
std::vector<c10::IValue> cuda_inputs(oits_module_t *m, const oits_input_t *inputs, size_t n)
{
    constexpr size_t kAlign = 256;
    std::vector<size_t> offsets(n);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t count = 1;
        for (int d = 0; d < inputs[i].ndim; d++)
            count *= inputs[i].shape[d];
        offsets[i] = total;
        total += (static_cast<size_t>(count) * oi_dtype_size(inputs[i].dtype) + kAlign - 1) / kAlign * kAlign;
    }
    if (!m->staging.defined() || static_cast<size_t>(m->staging.numel()) < total)
        m->staging = at::empty({static_cast<int64_t>(std::max<size_t>(total, 1 << 20))},
                               at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    char *base = static_cast<char *>(m->staging.data_ptr());
    for (size_t i = 0; i < n; i++) {
        size_t len = 1;
        for (int d = 0; d < inputs[i].ndim; d++)
            len *= static_cast<size_t>(inputs[i].shape[d]);
        len *= oi_dtype_size(inputs[i].dtype);
        if (len > 0)
            std::memcpy(base + offsets[i], inputs[i].data, len);
    }
    c10::cuda::CUDAStreamGuard stream_guard(*m->stream);
    at::Tensor block = m->staging.narrow(0, 0, static_cast<int64_t>(std::max<size_t>(total, 1)))
                           .to(m->device, /*non_blocking=*/true);
    std::vector<c10::IValue> args;
    for (size_t i = 0; i < n; i++) {
        at::ScalarType st = *scalar_type(inputs[i].dtype);
        std::vector<int64_t> shape(inputs[i].shape, inputs[i].shape + inputs[i].ndim);
        int64_t count = 1;
        for (auto d : shape)
            count *= d;
        int64_t bytes = count * static_cast<int64_t>(oi_dtype_size(inputs[i].dtype));
        if (count == 0) {
            args.emplace_back(at::empty(shape, at::TensorOptions().dtype(st).device(m->device)));
            continue;
        }
        args.emplace_back(block.narrow(0, static_cast<int64_t>(offsets[i]), bytes).view(st).view(shape));
    }
    return args;
}
#endif

// A new module for `path` on the options' device (checked to exist), not loaded yet.
std::unique_ptr<oits_module_s> new_module(const char *path, const oits_options_t *opts)
{
    auto mod = std::make_unique<oits_module_s>();
    if (opts != nullptr)
        mod->opts = *opts;
    mod->opts.device = nullptr; // not kept: the caller's string
    mod->path = path;
    std::string dev = opts && opts->device ? opts->device : "cpu";
    mod->device = c10::Device(dev);
    if (mod->device.is_cuda()) {
#ifdef OITS_WITH_CUDA
        int count = static_cast<int>(c10::cuda::device_count());
        int index = mod->device.has_index() ? mod->device.index() : 0;
        if (index >= count)
            throw std::runtime_error("device " + dev + " does not exist (" + std::to_string(count) +
                                     " CUDA devices visible)");
        mod->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
        mod->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, mod->device.index());
#else
        throw std::runtime_error("device " + dev + " needs a CUDA build of torch; the installed torch " +
                                 OITS_TORCH_VERSION " has no CUDA");
#endif
    } else if (!mod->device.is_cpu()) {
        throw std::runtime_error("device " + dev + " is not supported (use cpu or cuda:N)");
    }
    if (mod->opts.inter_op_threads > 0 && static_cast<int>(at::get_num_interop_threads()) != mod->opts.inter_op_threads)
        at::set_num_interop_threads(mod->opts.inter_op_threads);
    return mod;
}

} // namespace

extern "C" {

int oits_abi_version(void) { return OITS_ABI_VERSION; }

void oits_free(char *p) { std::free(p); }

int oits_cuda_device_count(void)
{
    try {
#ifdef OITS_WITH_CUDA
        return static_cast<int>(c10::cuda::device_count());
#else
        return 0;
#endif
    } catch (...) {
        return 0;
    }
}

oits_module_t *oits_module_load(const char *path, const oits_options_t *opts, char **err)
{
    oits_module_t *m = nullptr;
    std::string where = std::string("cannot load TorchScript module ") + (path ? path : "(null)");
    bool ok = guarded(err, where.c_str(), [&] {
        auto mod = new_module(path, opts);
        c10::InferenceMode inference(mod->opts.inference_mode != 0);
        mod->module = torch::jit::load(path, mod->device);
        mod->module.eval();
        if (!mod->module.find_method("forward"))
            throw std::runtime_error("the module has no forward() method");
        m = mod.release();
    });
    return ok ? m : nullptr;
}

oits_module_t *oits_package_load(const char *path, const oits_options_t *opts, char **err)
{
    oits_module_t *m = nullptr;
    std::string where = std::string("cannot load PT2 package ") + (path ? path : "(null)");
    bool ok = guarded(err, where.c_str(), [&] {
        // The package's device kind, read before creating the runner: a CUDA package asked to
        // run on the CPU (or on a torch without CUDA) is refused with the reason, not with
        // whatever the runner's constructor fails on.
        auto meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
        std::string kind = meta.count("AOTI_DEVICE_KEY") ? meta["AOTI_DEVICE_KEY"] : "cpu";
        std::string dev = opts && opts->device ? opts->device : "cpu";
        std::string want = c10::Device(dev).is_cuda() ? "cuda" : "cpu";
        if (kind != want) {
#ifndef OITS_WITH_CUDA
            if (kind == "cuda")
                throw std::runtime_error("the package was compiled for CUDA, and the installed torch " +
                                         std::string(OITS_TORCH_VERSION) + " has no CUDA");
#endif
            throw std::runtime_error("the package was compiled for " + kind + ", and this instance runs on " +
                                     dev + " (set instance_group's kind to match the package)");
        }
        auto mod = new_module(path, opts);
        c10::DeviceIndex index = mod->device.is_cuda() ? mod->device.index() : -1;
        mod->package = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
            path, "model", /*run_single_threaded=*/false, /*num_runners=*/1, index);
        m = mod.release();
    });
    return ok ? m : nullptr;
}

void oits_module_free(oits_module_t *m)
{
    try {
        delete m;
    } catch (...) {
        // A destructor that throws leaks the module rather than taking the server down.
    }
}

char *oits_module_describe(oits_module_t *m, char **err)
{
    char *out = nullptr;
    guarded(err, "cannot describe forward()", [&] {
        if (m->package)
            throw std::runtime_error("a PT2 package is described by its call spec, not forward()");
        const auto &schema = m->module.get_method("forward").function().getSchema();
        // Plain string appends, no std::ostream: its number formatting goes through the
        // locale's num_put facet, and inserting an int64_t crashed there inside this shim when
        // built by Ubuntu 24.04's g++ against torch 2.11+cu130 (an H100 machine; describe of a
        // module with example_inputs, the first number it printed).
        std::string js = "{\"arguments\":[";
        bool first = true;
        for (size_t i = 0; i < schema.arguments().size(); i++) {
            const auto &a = schema.arguments()[i];
            if (i == 0 && a.name() == "self")
                continue;
            js += std::string(first ? "" : ",") + "{\"name\":" + json_string(a.name()) +
                  ",\"type\":" + json_string(a.type()->annotation_str()) +
                  ",\"has_default\":" + (a.default_value().has_value() ? "true" : "false") + "}";
            first = false;
        }
        js += "],\"returns\":";
        js += schema.returns().size() == 1 ? json_string(schema.returns()[0].type()->annotation_str()) : "null";
        js += ",\"example_inputs\":";
        auto ex = example_inputs(m->module);
        if (!ex) {
            js += "null";
        } else {
            js += "[";
            for (size_t i = 0; i < ex->size(); i++) {
                const at::Tensor &t = (*ex)[i];
                oi_dtype_t dt = v2_dtype(t.scalar_type());
                js += std::string(i ? "," : "") + "{\"dtype\":" + json_string(oi_dtype_name(dt)) + ",\"shape\":[";
                for (int64_t d = 0; d < t.dim(); d++)
                    js += (d ? "," : "") + std::to_string(t.size(d));
                js += "]}";
            }
            js += "]";
        }
        js += "}";
        out = dup_cstr(js);
        if (out == nullptr)
            throw std::bad_alloc();
    });
    return out;
}

int oits_module_probe(oits_module_t *m, oits_output_t **outputs, size_t *n_outputs, char **err)
{
    int rc = -1;
    guarded(err, "probing forward() with example_inputs failed", [&] {
        if (m->package)
            throw std::runtime_error("a PT2 package has no example_inputs attribute");
        auto ex = example_inputs(m->module);
        if (!ex)
            throw std::runtime_error("the module has no example_inputs attribute");
        std::vector<c10::IValue> args;
        for (auto &t : *ex)
            args.emplace_back(t.to(m->device));
        rc = run_forward(m, std::move(args), {}, outputs, n_outputs);
    });
    return rc;
}

int oits_module_forward(oits_module_t *m, const oits_input_t *inputs, size_t n_inputs, oits_output_t **outputs,
                        size_t *n_outputs, char **err)
{
    int rc = -1;
    guarded(err, "forward() failed", [&] {
        std::vector<std::pair<const char *, size_t>> borrowed;
        for (size_t i = 0; i < n_inputs; i++) {
            if (inputs[i].dtype == OI_TYPE_BYTES && (m->package || m->device.is_cuda()))
                throw std::runtime_error("input " + std::to_string(i) + " is BYTES: List[str] arguments are "
                                         "served to TorchScript modules on the CPU only");
            if (inputs[i].dtype != OI_TYPE_BYTES && !scalar_type(inputs[i].dtype))
                throw std::runtime_error(std::string("input ") + std::to_string(i) + ": datatype " +
                                         oi_dtype_name(inputs[i].dtype) + " has no torch dtype");
            if (inputs[i].ndim < 0 || inputs[i].ndim > OITS_MAX_DIMS)
                throw std::runtime_error("input " + std::to_string(i) + ": bad rank " + std::to_string(inputs[i].ndim));
        }
#ifdef OITS_WITH_CUDA
        if (m->device.is_cuda()) {
            rc = run_forward(m, cuda_inputs(m, inputs, n_inputs), {}, outputs, n_outputs);
            return;
        }
#endif
        std::vector<c10::IValue> args;
        args.reserve(n_inputs);
        for (size_t i = 0; i < n_inputs; i++) {
            const oits_input_t &in = inputs[i];
            std::vector<int64_t> shape(in.shape, in.shape + in.ndim);
            int64_t count = 1;
            for (auto d : shape)
                count *= d;
            if (in.dtype == OI_TYPE_BYTES) {
                args.emplace_back(strings_input(in, count));
                continue;
            }
            at::ScalarType st = *scalar_type(in.dtype);
            size_t esize = oi_dtype_size(in.dtype);
            auto options = at::TensorOptions().dtype(st);
            if (count == 0 || in.data == nullptr) {
                args.emplace_back(at::empty(shape, options)); // from_blob wants memory
                continue;
            }
            at::Tensor t = torch::from_blob(in.data, shape, options);
            // The binary extension places tensors back to back, so one may start at an
            // address its element type does not align to; kernels assume alignment.
            if (reinterpret_cast<uintptr_t>(in.data) % esize != 0)
                t = t.clone();
            else
                borrowed.emplace_back(static_cast<const char *>(in.data), static_cast<size_t>(count) * esize);
            args.emplace_back(std::move(t));
        }
        rc = run_forward(m, std::move(args), borrowed, outputs, n_outputs);
    });
    return rc;
}

void oits_outputs_free(oits_output_t *outputs, size_t n)
{
    if (outputs == nullptr)
        return;
    for (size_t i = 0; i < n; i++) {
        std::free(outputs[i].name);
        try {
            delete outputs[i].tensor;
        } catch (...) {
        }
    }
    std::free(outputs);
}

void oits_tensor_free(oits_tensor_t *t)
{
    try {
        delete t;
    } catch (...) {
    }
}

} // extern "C"
