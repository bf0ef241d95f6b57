"""ONNX models: from ``<model>/<version>/model.onnx`` (and config.pbtxt when there is one) to
the declaration and spec that the C core's ONNX Runtime backend serves.

The rules are those of Triton's onnxruntime backend. A config that declares inputs and
outputs is checked against the model's own metadata: names, datatypes and dims (an input's
dim of -1 in the model accepts any configured size; outputs must match exactly; with
max_batch_size > 0 the model's first dimension must be -1). A config that leaves inputs or
outputs out is auto-completed from the metadata: when every input and output has a variable
first dimension, the model batches, with max_batch_size 4 (Triton's default-max-batch-size)
unless the config gives one, and dynamic batching on.

`instance_group` places one session per instance on the CPU or, through the CUDA execution
provider (the onnxruntime-gpu wheel), on a GPU; `optimization { graph { level } }`,
`optimization { execution_accelerators }` and the parameters intra_op_thread_count,
inter_op_thread_count and execution_mode are honoured as Triton's backend does.

The library is libonnxruntime from the installed onnxruntime (or onnxruntime-gpu) wheel, or
the file $OPENINFER_ONNXRUNTIME_LIB names; it is loaded only when an ONNX model is, and the
onnxruntime Python package itself is never imported.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._config import paths, triton_config
from ..config import DynamicBatching, InstanceGroup, ModelConfig, TensorConfig
from ..model import Tensor
from .native_model import NativeModel, count_parameter, place_instances

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size
LIBRARY_ENV = "OPENINFER_ONNXRUNTIME_LIB"
INSTALL_HINT = "pip install onnxruntime (or onnxruntime-gpu for CUDA)"
_GRAPH_LEVELS = {-1: 1, 0: 99, 1: 2, 2: 0}  # Triton's optimization.graph.level -> ORT's
_GPU_ACCELERATORS = {"cuda", "tensorrt"}
_CPU_ACCELERATORS = {"openvino"}
# Accelerator parameters that would let a configuration run code or touch memory: a library to
# load, or the address of a function, stream or buffer.
_LIBRARY = "it names a library for ONNX Runtime to load, which a model configuration may not"
_ADDRESS = "it passes a memory address, which a model configuration cannot know"
_UNSAFE_ACCELERATOR_PARAMETERS = {
    "trt_extra_plugin_lib_paths": _LIBRARY,
    "trt_engine_decryption_lib_path": _LIBRARY,
    "user_compute_stream": _ADDRESS,
    "has_user_compute_stream": _ADDRESS,
    "gpu_external_alloc": _ADDRESS,
    "gpu_external_free": _ADDRESS,
    "gpu_external_empty_cache": _ADDRESS,
    "default_memory_arena_cfg": _ADDRESS,
    "trt_onnx_bytestream": _ADDRESS,
    "context": _ADDRESS,
}


class OnnxLoadError(Exception):
    """Why an ONNX model version cannot be served; the repository reports it."""


class OnnxUnavailable(OnnxLoadError):
    """ONNX Runtime is not installed (or cannot load): ONNX models cannot be served at all."""


class OnnxModel(NativeModel):
    """An ONNX model version ready to register; `spec` is what
    `_core.Server.add_model(onnx=...)` takes."""


def library_path() -> str:
    """libonnxruntime's path: $OPENINFER_ONNXRUNTIME_LIB, else the one in the installed
    onnxruntime package (found without importing it). Raises OnnxUnavailable."""
    given = os.environ.get(LIBRARY_ENV)
    if given:
        return given
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):  # a broken or deliberately hidden package
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    found: list[Path] = []
    for location in locations:
        capi = Path(location, "capi")
        found += [*capi.glob("libonnxruntime.so*"), *capi.glob("libonnxruntime*.dylib")]
    if not found:
        where = f" (the onnxruntime package at {locations[0]} has no capi/libonnxruntime)" if locations else ""
        raise OnnxUnavailable(f"serving ONNX models needs ONNX Runtime, which is not installed{where}; {INSTALL_HINT}")

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"[0-9]+", p.name))

    return str(max(found, key=version))


def ensure_runtime() -> tuple[str, int]:
    """Loads ONNX Runtime into the core (once per process); returns (version, API version).
    Raises OnnxUnavailable with what to install."""
    path = library_path()
    from .. import _core

    try:
        version, api = _core.onnx_open(path)
    except OSError as e:
        raise OnnxUnavailable(f"{e} ({INSTALL_HINT}, or set {LIBRARY_ENV} to libonnxruntime)") from None
    return str(version), int(api)


def providers() -> list[str]:
    """The execution providers of the loaded ONNX Runtime."""
    from .. import _core

    return list(json.loads(_core.onnx_providers()))


def describe(spec: dict[str, Any]) -> dict[str, Any]:
    """The model's inputs and outputs as ONNX Runtime reads them (see _core.onnx_describe),
    from the first instance's session, which `spec` then carries to add_model. Raises
    RuntimeError with ONNX Runtime's message."""
    from .. import _core

    text, spec["session"] = _core.onnx_describe(spec)
    return dict(json.loads(text))


def load_onnx(
    name: str, version: int, model_file: paths.HeldFile, config: ModelConfig | None, sequence: Any = None
) -> OnnxModel:
    """Makes the first instance's session (which the spec carries to add_model: the file is
    read once for it), checks the config against the model's metadata or completes the config
    from it, and makes the spec. With `sequence` (a sequence.SequenceBatching) the model also
    takes its control and state inputs and gives its state outputs, which the core declares
    and checks against the model. Raises OnnxLoadError."""
    ensure_runtime()
    config = config or ModelConfig()
    devices = _devices(config.instance_groups)
    path = model_file.path
    normalized = triton_config.normalize(config.raw, str(path)) if config.raw else {}
    model_dir = path.parent.parent
    spec = _options(normalized, config.parameters, model_dir)
    # ONNX Runtime reads the file the repository opened, and external data this process read.
    spec.update(path=model_file.source, external=_external_data(model_file, model_dir), model=model_file,
                devices=[-1 if d == "cpu" else int(d[5:]) for d in devices])
    try:
        described = describe(spec)
    except RuntimeError as e:
        raise OnnxLoadError(f"{path}: {e}") from None
    model_in = {t["name"]: t for t in described["inputs"]}
    model_out = {t["name"]: t for t in described["outputs"]}
    for t in (*described["inputs"], *described["outputs"]):
        if not t["datatype"]:
            raise OnnxLoadError(
                f"{path}: {t['name']!r} is an ONNX {t['kind']} of element type {t['onnx_type']}, "
                "which has no V2 datatype"
            )
    if sequence is not None and not (config.inputs and config.outputs):
        raise OnnxLoadError(f"{path}: sequence_batching needs input and output in config.pbtxt")
    max_batch_size = config.max_batch_size
    dynamic_batching = config.dynamic_batching
    if not config.inputs or not config.outputs:
        max_batch_size, auto_batching = _complete_max_batch(name, config, described)
        if auto_batching and dynamic_batching is None and "sequence_batching" not in config.raw:
            dynamic_batching = DynamicBatching()
    batch = [-1] if max_batch_size > 0 else []
    if config.inputs:
        _check_tensors(name, "input", config.inputs, model_in, max_batch_size)
        inputs = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.inputs]
        input_reshape = [_reshape(t, model_in[t.name]) for t in config.inputs]
    else:
        inputs = [_auto_tensor(t) for t in described["inputs"]]
        input_reshape = [None] * len(inputs)
    if config.outputs:
        _check_tensors(name, "output", config.outputs, model_out, max_batch_size)
        outputs = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs]
        output_reshape = [_reshape(t, model_out[t.name]) for t in config.outputs]
    else:
        outputs = [_auto_tensor(t) for t in described["outputs"]]
        output_reshape = [None] * len(outputs)
    batcher_in = {c[0] for c in sequence.controls} | {s[0] for s in sequence.states} if sequence else set()
    missing = [n for n in model_in if n not in {t.name for t in inputs} | batcher_in]
    if missing:
        raise OnnxLoadError(
            f"unable to load model '{name}', configuration expects {len(inputs)} inputs, model "
            f"provides {len(model_in)} (no input for {', '.join(map(repr, missing))})"
        )
    spec.update(input_reshape=input_reshape, output_reshape=output_reshape)
    return OnnxModel(
        name=name,
        version=version,
        path=path,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        max_batch_size=max_batch_size,
        devices=devices,
        platform=ONNX_PLATFORM,
        spec=spec,
        dynamic_batching=dynamic_batching,
    )


def _complete_max_batch(name: str, config: ModelConfig, described: dict[str, Any]) -> tuple[int, bool]:
    """Triton's AutoCompleteMaxBatch: (max_batch_size, whether the model batches)."""
    tensors = [*described["inputs"], *described["outputs"]]
    batches = all(t["shape"] and t["shape"][0] == -1 for t in tensors)
    if not batches:
        if config.max_batch_size != 0:
            raise OnnxLoadError(
                f"autofill failed for model '{name}': model does not support batching while "
                "non-zero max_batch_size is specified"
            )
        return 0, False
    max_batch_size = config.max_batch_size or DEFAULT_MAX_BATCH_SIZE
    return max_batch_size, max_batch_size > 1


def _auto_tensor(t: dict[str, Any]) -> Tensor:
    shape = t["shape"]
    return Tensor(t["name"], t["datatype"], None if shape is None else list(shape))


def _shape(dims: list[int] | tuple[int, ...] | None) -> str:
    return "[" + ",".join(str(d) for d in dims or ()) + "]"


def _check_tensors(
    name: str, kind: str, declared: tuple[TensorConfig, ...], model: dict[str, dict[str, Any]], max_batch_size: int
) -> None:
    """Triton's checks of configured tensors against the model's: present, same datatype,
    compatible dims (inputs: the model's -1 accepts any size; outputs: exactly)."""
    for t in declared:
        found = model.get(t.name)
        if found is None:
            raise OnnxLoadError(
                f"unable to load model '{name}', unexpected inference {kind} '{t.name}', allowed "
                f"{kind}s are: {', '.join(model)}"
            )
        if found["datatype"] != t.datatype:
            raise OnnxLoadError(
                f"unable to load model '{name}', configuration expects datatype "
                f"{triton_config.v2_to_triton(t.datatype)} for {kind} '{t.name}', model provides "
                f"{triton_config.v2_to_triton(found['datatype'])}"
            )
        shape = found["shape"]
        dims = list(t.reshape if t.reshape is not None else t.dims)
        if shape is None:
            continue  # the model does not say its rank
        if not shape:  # a scalar: the config says [1] (or nothing)
            if any(d != 1 for d in dims):
                raise OnnxLoadError(
                    f"unable to load model '{name}', scalar tensor '{t.name}', should only provide 1 in "
                    "the model configuration when the model doesn't support batching. Model "
                    f"configuration provided: {_shape(dims)}."
                )
            continue
        exact = kind == "output"
        if max_batch_size > 0:
            if shape[0] != -1:
                raise OnnxLoadError(
                    f"model '{name}', tensor '{t.name}': for the model to support batching the shape "
                    "should have at least 1 dimension and the first dimension must be -1; but shape "
                    f"expected by the model is {_shape(shape)}"
                )
            full = [-1, *dims]
            what = (
                f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 "
                f"followed by the explicit tensor shape, making complete shape {_shape(full)})"
            )
        else:
            full = dims
            what = f"{len(full)} dimensions (shape {_shape(full)})"
        same = len(shape) == len(full) and all(
            m == c for m, c in zip(shape, full) if exact or m != -1
        )
        if not same:
            raise OnnxLoadError(
                f"model '{name}', tensor '{t.name}': the model expects {len(shape)} dimensions "
                f"(shape {_shape(shape)}) but the model configuration specifies {what}"
            )


def _reshape(t: TensorConfig, found: dict[str, Any]) -> list[int] | None:
    """The shape the session sees past the batch, when it differs from the declared dims: a
    config reshape, or a scalar model tensor declared as [1]."""
    if t.reshape is not None:
        return list(t.reshape)
    if found["shape"] == [] and list(t.dims) != []:
        return []
    return None


def _options(config: dict[str, Any], params: dict[str, str], model_dir: Path) -> dict[str, Any]:
    """Session options from the normalized config: graph level, accelerators, parameters. An
    accelerator parameter that names a path is confined to the model directory (its folder is
    opened and held: paths.open_parent_beneath, in the spec's "held"); one that loads a library
    or passes a memory address is refused."""
    held: list[paths.HeldFile] = []
    optimization = config.get("optimization", {})
    level = optimization.get("graph", {}).get("level", 0)
    accelerators = optimization.get("execution_accelerators", {})

    def accels(key: str, allowed: set[str]) -> list[tuple[str, list[tuple[str, str]]]]:
        out = []
        for i, a in enumerate(accelerators.get(key, [])):
            accel_name = a.get("name", "")
            if accel_name not in allowed:
                raise OnnxLoadError(
                    f"optimization.execution_accelerators.{key}: unknown accelerator "
                    f"{accel_name!r} (the onnxruntime backend takes {', '.join(sorted(allowed))})"
                )
            given = []
            for k, v in a.get("parameters", {}).items():
                field = f"optimization.execution_accelerators.{key}[{i}].parameters['{paths.printable(str(k))}']"
                if k in _UNSAFE_ACCELERATOR_PARAMETERS:
                    raise OnnxLoadError(f"{field} is not accepted: {_UNSAFE_ACCELERATOR_PARAMETERS[k]}")
                if k in paths.ACCELERATOR_PATHS:
                    try:
                        folder, last = paths.open_parent_beneath(model_dir, v, field, model_dir)
                    except paths.PathError as e:
                        raise OnnxLoadError(str(e)) from None
                    except OSError as e:
                        raise OnnxLoadError(f"{field} '{paths.printable(v)}': {e.strerror or e}") from None
                    held.append(folder)
                    v = f"{folder.source}/{last}"
                given.append((str(k), str(v)))
            out.append((accel_name, given))
        return out

    execution_mode = count_parameter(params, "execution_mode", OnnxLoadError)
    if execution_mode not in (0, 1):
        raise OnnxLoadError(
            f"Invalid configuration value provided. Expected values for execution_mode are 0 or 1 "
            f"but got {execution_mode} ."
        )
    return {
        "graph_level": _GRAPH_LEVELS.get(level, 99),
        "gpu_accelerators": accels("gpu_execution_accelerator", _GPU_ACCELERATORS),
        "cpu_accelerators": accels("cpu_execution_accelerator", _CPU_ACCELERATORS),
        "intra_op_threads": count_parameter(params, "intra_op_thread_count", OnnxLoadError),
        "inter_op_threads": count_parameter(params, "inter_op_thread_count", OnnxLoadError),
        "execution_mode": execution_mode,
        "held": held,
    }


# ONNX file fields that lead to tensors (onnx.proto), by message: a tensor's external_data (13)
# holds key/value entries, one of which is the location of its data.
_ONNX_WALK: dict[str, dict[int, str]] = {
    "model": {7: "graph", 25: "function"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
    "tensor": {13: "entry"},
}


def _varint(buf: Any, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise ValueError("a varint runs past its message")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _entries(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """The length-delimited fields of the message in buf[start:end]: (number, start, end).
    Other fields are skipped, groups (unknown to ONNX, skipped by protobuf too) included."""
    i = start
    groups: list[int] = []  # the groups being skipped, innermost last
    while i < end:
        key, i = _varint(buf, i, end)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i, end)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            n, i = _varint(buf, i, end)
            if i + n <= end and not groups:
                yield key >> 3, i, i + n
            i += n
        elif wire == 3:
            groups.append(key >> 3)
        elif wire == 4 and groups and groups[-1] == key >> 3:
            groups.pop()
        else:
            raise ValueError(f"wire type {wire} where it cannot be")
        if i > end:
            raise ValueError("a field runs past its message")
    if groups:
        raise ValueError("a group is not closed")


def external_data(fd: int, path: Path) -> list[str]:
    """The external data locations that the tensors of ONNX file `fd` (`path`, for messages)
    name (initializers, constants and the tensors of subgraphs and functions alike), read from
    the protobuf wire without loading the model. Raises OnnxLoadError for a file that is not
    valid protobuf."""
    found: list[str] = []
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            stack = [("model", 0, len(buf))]
            while stack:
                kind, start, end = stack.pop()
                if kind == "entry":
                    fields = {n: bytes(buf[a:b]) for n, a, b in _entries(buf, start, end)}
                    if fields.get(1) == b"location":
                        found.append(fields.get(2, b"").decode("utf-8", "replace"))
                    continue
                walk = _ONNX_WALK[kind]
                stack += [(walk[n], a, b) for n, a, b in _entries(buf, start, end) if n in walk]
    except ValueError as e:  # mmap of an empty file too
        raise OnnxLoadError(f"{path}: not a valid ONNX model file (protobuf: {e})") from None
    except OSError as e:
        raise OnnxLoadError(f"{path.name}: cannot be read: {e.strerror or e}") from None
    return found


def _external_data(model_file: paths.HeldFile, model_dir: Path) -> list[tuple[str, mmap.mmap | bytes]]:
    """The files the model's tensors take data from, each (its location as the model names it,
    its contents mapped), opened beneath the version directory (paths.open_beneath: an absolute
    location, '..' or a symbolic link pointing out is refused). ONNX Runtime is given these
    contents and never opens a file by the name a model gives."""
    out: list[tuple[str, mmap.mmap | bytes]] = []
    for location in dict.fromkeys(external_data(model_file.fd, model_file.path)):
        what = f"{model_file.path.name}: external data location"
        try:
            fd = paths.open_beneath(model_file.path.parent, location, what, model_dir, nested=True)
        except paths.PathError as e:
            raise OnnxLoadError(str(e)) from None
        except OSError as e:
            raise OnnxLoadError(f"{what} '{paths.printable(location)}': cannot be read: {e.strerror or e}") from None
        try:
            out.append((location, mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else b""))
        finally:
            os.close(fd)
    return out


def _visible_gpus() -> int:
    """CUDA devices this process may use: the NVIDIA driver's list, narrowed by
    CUDA_VISIBLE_DEVICES."""
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]))
    return count


def _devices(groups: tuple[InstanceGroup, ...]) -> tuple[str, ...]:
    """One session per instance, on the CPU or, through the CUDA execution provider, on a GPU
    (KIND_AUTO and no instance_group: a GPU where ONNX Runtime can use one)."""
    available = providers()
    cuda = "CUDAExecutionProvider" in available
    gpus = _visible_gpus() if cuda else 0
    no_gpu = (
        "instance_group kind KIND_GPU needs a CUDA GPU, and none is visible; use KIND_CPU"
        if cuda
        else "instance_group kind KIND_GPU needs ONNX Runtime's CUDA execution provider, which the "
        f"installed onnxruntime lacks (it has {', '.join(available)}); pip install onnxruntime-gpu, or use "
        "KIND_CPU"
    )
    return place_instances(
        groups, gpus, OnnxLoadError, no_gpu=no_gpu, seen=f"{gpus} GPU(s) are visible", backend=ONNX_BACKEND
    )
