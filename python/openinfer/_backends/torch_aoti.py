"""PyTorch 2 AOTInductor packages (``<model>/<version>/model.pt2``, ``platform: "torch_aoti"``):
from the package to the declaration and spec that the C core's torch backend serves. The
package runs in the libtorch shim (oits_package_load: torch::inductor::AOTIModelPackageLoader)
on the executor threads of the TorchScript backend, with its instance pool, batching and
output handling; no Python runs per request.

Naming follows Triton's pytorch backend (README, "AOT Inductor Support"): the package's
flattened inputs are ``INPUT__<i>`` or, from its call spec, ``ARGS[i]``, ``ARGS[i][key]`` and
``KWARGS[name]``; its flattened outputs ``OUTPUT__<i>`` or ``RESULT``, ``RESULT[key]``,
``RESULT[i]`` (nested as deep as the result is). A config.pbtxt may mix both conventions.

What the package does not say in its call spec (the inputs' datatypes and shapes) comes from
the input checks AOTInductor compiles into the package's wrapper source: datatype, and each
dimension fixed or dynamic (-1). The outputs' datatypes and shapes come from running the
package once at load on zero-filled inputs, twice when a dimension is dynamic (the dimensions
that change between the two runs are declared -1).

Without config.pbtxt (beyond Triton, whose auto-complete skips PT2 models) the model declares
``INPUT__<i>`` and ``OUTPUT__<i>`` with those datatypes and shapes. Beyond Triton too:
``max_batch_size > 0`` (dynamic batching: rows of requests concatenated into one call) when
dimension 0 of every input is dynamic, several instances, and sequence batching with implicit
state.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

from .._config.paths import HeldFile
from ..config import ModelConfig
from ..model import Tensor
from .torch_model import TorchLoadError, TorchModel, _devices, _ensure_shim, torch_version

AOTI_PLATFORM = "torch_aoti"
_ORDINAL_IN = re.compile(r"INPUT__([0-9]+)")
_ORDINAL_OUT = re.compile(r"OUTPUT__([0-9]+)")
# AOTInductor's dtype names (aoti_torch_dtype_<name>) as V2 datatypes.
_DTYPES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "bfloat16": "BF16",
}  # fmt: skip
_BAD_KEY = re.compile(r'["\[\]\s]|[^\x21-\x7e]')


class _Input:
    """One flattened input of the package: datatype and dimensions (int, or the name of a
    dynamic size such as "s17", shared by the dimensions that must be equal)."""

    def __init__(self, dtype: str, dims: list[int | str], low: dict[int, int]):
        self.dtype = dtype
        self.dims = dims
        self.low = low  # dynamic dimension -> the smallest size the export allowed

    def shape(self) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in self.dims]


def load_package(
    name: str, version: int, model_file: HeldFile, config: ModelConfig | None, sequence: Any = None
) -> TorchModel:
    """Reads the package's call spec and input checks, runs it once (or twice) on zeros to
    learn its outputs, and checks the config against it: all through the descriptor the
    package was opened as. Raises TorchLoadError."""
    _ensure_shim()
    path = model_file.path
    in_names, out_names, inputs, device_key = _read_package(model_file)
    max_batch_size = config.max_batch_size if config else 0
    groups = config.instance_groups if config else ()
    devices = _devices(groups)
    if device_key == "cpu" and not any(g.kind == "KIND_GPU" for g in groups):
        devices = ("cpu",) * len(devices)  # KIND_AUTO places a CPU package on the CPU
    probed = _probe(model_file, devices[0], inputs)
    if len(probed) != len(out_names):
        raise TorchLoadError(
            f"{path}: the package returned {len(probed)} outputs; its call spec names {len(out_names)}"
        )
    if max_batch_size > 0:
        for i, t in enumerate(inputs):
            if not t.dims or isinstance(t.dims[0], int):
                raise TorchLoadError(
                    f"{path}: max_batch_size {max_batch_size} batches on dimension 0, but input "
                    f"INPUT__{i} ({in_names[i]}) was exported with "
                    + (f"a fixed dimension 0 of {t.dims[0]}" if t.dims else "no dimensions")
                    + ": export it with a dynamic first dimension (torch.export.Dim) or set "
                    "max_batch_size 0"
                )
        for i, o in enumerate(probed):
            if not o["shape"] or o["shape"][0] != -1:
                raise TorchLoadError(
                    f"{path}: max_batch_size {max_batch_size} batches on dimension 0, but output "
                    f"OUTPUT__{i} ({out_names[i]}) does not follow the batch size of the inputs"
                )
    if config and (config.inputs or config.outputs):
        decl_in, decl_out, spec = _from_config(path, config, in_names, out_names, inputs, probed, sequence)
    elif sequence is not None:
        raise TorchLoadError(f"{path}: sequence_batching needs input and output in config.pbtxt")
    else:
        decl_in = [Tensor(f"INPUT__{i}", t.dtype, t.shape()) for i, t in enumerate(inputs)]
        decl_out = [Tensor(f"OUTPUT__{i}", o["dtype"], o["shape"]) for i, o in enumerate(probed)]
        spec = {
            "arg_inputs": list(range(len(inputs))),
            "output_index": list(range(len(probed))),
            "output_key": [None] * len(probed),
            "input_reshape": [None] * len(inputs),
            "output_reshape": [None] * len(probed),
        }
    spec.update(package=1, dim_links=_dim_links(inputs))
    return torch_version(name, version, model_file, config, decl_in, decl_out, max_batch_size, devices, AOTI_PLATFORM, spec)


# ---- the package -------------------------------------------------------------------------


def _read_package(model_file: HeldFile) -> tuple[list[str], list[str], list[_Input], str]:
    """Forward-based input and output names (flattened, in call-spec order), the inputs'
    datatypes and dimensions, and the device kind the package was compiled for."""
    path = model_file.path
    try:
        with open(model_file.source, "rb") as f, zipfile.ZipFile(f) as z:
            names = z.namelist()
            wrappers = [n for n in names if re.search(r"/data/aotinductor/model/[^/]*\.wrapper\.cpp$", n)]
            metas = [n for n in names if re.search(r"/data/aotinductor/model/[^/]*\.wrapper_metadata\.json$", n)]
            if not wrappers:
                raise TorchLoadError(
                    f"cannot load PT2 package {path}: it holds no AOTInductor model "
                    "(data/aotinductor/model/*.wrapper.cpp): make it with "
                    "torch._inductor.aoti_compile_and_package"
                )
            source = z.read(wrappers[0]).decode("utf-8", "replace")
            meta = json.loads(z.read(metas[0])) if metas else {}
    except (zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        raise TorchLoadError(f"cannot load PT2 package {path}: {e}") from None
    in_spec = re.search(r'in_spec_ = R"\((.*?)\)";', source, re.S)
    out_spec = re.search(r'out_spec_ = R"\((.*?)\)";', source, re.S)
    if not in_spec or not out_spec:
        raise TorchLoadError(f"{path}: the package's wrapper source has no call spec")
    in_names = _input_names(path, json.loads(in_spec.group(1)))
    out_names = _output_names(path, json.loads(out_spec.group(1)))
    inputs = [_input_check(path, source, i) for i in range(len(in_names))]
    return in_names, out_names, inputs, str(meta.get("AOTI_DEVICE_KEY") or "cpu")


def _input_check(path: Path, source: str, i: int) -> _Input:
    """Input `i`'s datatype and dimensions from the check_input_<i> function AOTInductor
    writes into the wrapper (and, for shared dynamic sizes, its assert_size_stride)."""
    body = re.search(
        r"static void check_input_%d\(.*?\n\}\n" % i, source, re.S
    )  # fmt: skip
    if body is None:
        raise TorchLoadError(f"{path}: the package's wrapper source does not check input {i}")
    text = body.group(0)
    handle = re.search(r"ConstantHandle (\w+) = ConstantHandle\(input_handles\[%d\]\)" % i, text)
    dtype = re.search(r"_expected_dtype = aoti_torch_dtype_(\w+)\(\)", text)
    if handle is None or dtype is None or dtype.group(1) not in _DTYPES:
        raise TorchLoadError(
            f"{path}: input {i} has a datatype openinfer cannot read or serve"
            + (f" ({dtype.group(1)})" if dtype else "")
        )
    arg = handle.group(1)
    fixed = {int(d): int(v) for v, d in re.findall(r"if \((-?\d+) != %s_size\[(\d+)\]\)" % arg, text)}
    low = {int(d): int(v) for d, v in re.findall(r"if \(%s_size\[(\d+)\] < (\d+)\)" % arg, text)}
    dynamic = set(low) | {int(d) for d in re.findall(r"if \(%s_size\[(\d+)\] > \d+\)" % arg, text)}
    strides = {int(d) for d in re.findall(r"%s_stride\[(\d+)\]" % arg, text)}
    asserted = re.search(r"assert_size_stride\(%s, \{([^}]*)\}" % arg, source)
    symbols = [s.strip() for s in asserted.group(1).split(",") if s.strip()] if asserted else []
    rank = max([-1, *fixed, *dynamic, *strides]) + 1
    rank = max(rank, len(symbols))
    dims: list[int | str] = []
    for d in range(rank):
        if d in fixed:
            dims.append(fixed[d])
        elif d < len(symbols) and re.fullmatch(r"-?\d+L?", symbols[d]):
            dims.append(int(symbols[d].rstrip("L")))
        else:
            dims.append(symbols[d] if d < len(symbols) else f"input{i}_dim{d}")
    return _Input(_DTYPES[dtype.group(1)], dims, low)


def _dim_links(inputs: list[_Input]) -> list[tuple[int, int, int, int]]:
    """(input, dimension, input, dimension) for every dimension that shares a dynamic size
    with an earlier one: the package assumes them equal and does not check it, so the backend
    refuses a request where they differ (reading past an input otherwise)."""
    first: dict[str, tuple[int, int]] = {}
    links = []
    for i, t in enumerate(inputs):
        for d, dim in enumerate(t.dims):
            if isinstance(dim, str):
                if dim in first:
                    links.append((*first[dim], i, d))
                else:
                    first[dim] = (i, d)
    return links


def _probe(model_file: HeldFile, device: str, inputs: list[_Input]) -> list[dict[str, Any]]:
    """The outputs' datatypes and shapes: one run on zeros at the smallest dynamic sizes the
    export allowed (at least 2), and, when a size is dynamic, one more at those sizes + 1;
    dimensions that differ are -1."""
    from .. import _core

    path = model_file.path

    def run(extra: int) -> list[dict[str, Any]]:
        sizes: dict[str, int] = {}
        shapes = []
        for t in inputs:
            shape = []
            for d, dim in enumerate(t.dims):
                if isinstance(dim, int):
                    shape.append(dim)
                else:
                    sizes.setdefault(dim, max(2, t.low.get(d, 2)) + extra)
                    shape.append(sizes[dim])
            shapes.append((t.dtype, shape))
        try:
            return json.loads(_core.torch_package_probe(model_file.source, device, shapes))
        except RuntimeError as e:
            raise TorchLoadError(str(e)) from None

    first = run(0)
    for i, o in enumerate(first):
        if not o["dtype"]:
            raise TorchLoadError(f"{path}: output OUTPUT__{i} has a torch dtype with no V2 datatype")
    if not any(isinstance(d, str) for t in inputs for d in t.dims):
        return first
    second = run(1)
    for a, b in zip(first, second):
        a["shape"] = [x if x == y else -1 for x, y in zip(a["shape"], b["shape"])]
    return first


# ---- call spec ---------------------------------------------------------------------------


def _context(node: dict[str, Any]) -> Any:
    ctx = node.get("context")
    return json.loads(ctx) if isinstance(ctx, str) else ctx


def _leaf_names(path: Path, node: dict[str, Any], where: str) -> list[str]:
    """The names of the tensors under `node` (a pytree spec), prefixed with `where`: a leaf is
    `where` itself, a tuple or list element `where[i]`, a dict entry `where[key]`."""
    kind = node.get("type")
    children = node.get("children_spec") or []
    if kind is None:
        return [where]
    if kind in ("builtins.tuple", "builtins.list"):
        out: list[str] = []
        for i, child in enumerate(children):
            out += _leaf_names(path, child, f"{where}[{i}]")
        return out
    if kind == "builtins.dict":
        keys = _context(node) or []
        out = []
        for key, child in zip(keys, children):
            if not isinstance(key, str) or _BAD_KEY.search(key) or not key:
                raise TorchLoadError(
                    f"{path}: {where} has the key {key!r}; keys must be strings without '\"', "
                    "'[', ']', whitespace or non-printable characters"
                )
            out += _leaf_names(path, child, f"{where}[{key}]")
        return out
    raise TorchLoadError(
        f"{path}: {where} is {kind}; only dict, tuple, list and torch.Tensor are supported, "
        "with tensors at every leaf"
    )


def _input_names(path: Path, spec: Any) -> list[str]:
    root = spec[1] if isinstance(spec, list) and len(spec) == 2 else spec
    children = root.get("children_spec") or []
    if root.get("type") != "builtins.tuple" or len(children) != 2 or children[1].get("type") != "builtins.dict":
        raise TorchLoadError(
            f"{path}: unexpected input call specification; expected structure to be "
            "tuple[builtins.tuple, builtins.dict] (args, kwargs)"
        )
    return _leaf_names(path, children[0], "ARGS") + _leaf_names(path, children[1], "KWARGS")


def _output_names(path: Path, spec: Any) -> list[str]:
    root = spec[1] if isinstance(spec, list) and len(spec) == 2 else spec
    return _leaf_names(path, root, "RESULT")


# ---- config.pbtxt ------------------------------------------------------------------------


def _index(name: str, ordinal: re.Pattern[str], named: list[str], what: str, path: Path) -> int:
    m = ordinal.fullmatch(name)
    if m and int(m.group(1)) < len(named):
        return int(m.group(1))
    if name in named:
        return named.index(name)
    prefix = "INPUT__" if what == "input" else "OUTPUT__"
    raise TorchLoadError(
        f"{path}: {what.capitalize()} \"{name}\" is not found in model {what} map; the package's "
        f"{what}s are {prefix}0 to {prefix}{len(named) - 1}, or {', '.join(named)}"
    )


def _from_config(
    path: Path, config: ModelConfig, in_names: list[str], out_names: list[str], inputs: list[_Input],
    probed: list[dict[str, Any]], sequence: Any,
) -> tuple[list[Tensor], list[Tensor], dict[str, Any]]:
    batch = [-1] if config.max_batch_size > 0 else []
    extra_in = [] if sequence is None else [c[0] for c in sequence.controls] + [s[0] for s in sequence.states]
    declared_out = {t.name for t in config.outputs}
    extra_out = [] if sequence is None else [s[1] for s in sequence.states if s[1] not in declared_out]
    names = [t.name for t in config.inputs] + extra_in
    if len(names) != len(in_names):
        raise TorchLoadError(
            f"{path}: configuration expects {len(names)} inputs, but model expects {len(in_names)} inputs"
        )
    flat = [_index(n, _ORDINAL_IN, in_names, "input", path) for n in names]
    if len(set(flat)) != len(flat):
        raise TorchLoadError(f"{path}: two configured inputs name the same package input")
    # Each declared input against the package's: datatype, rank, fixed dimensions.
    seq_types: dict[str, str] = {}
    if sequence is not None:
        seq_types = {c[0]: c[2] for c in sequence.controls} | {s[0]: s[2] for s in sequence.states}
    seq_shapes = {} if sequence is None else {s[0]: list(s[3]) for s in sequence.states}
    for k, name in enumerate(names):
        t = inputs[flat[k]]
        if k < len(config.inputs):
            dtype, dims = config.inputs[k].datatype, [*batch, *(config.inputs[k].reshape or config.inputs[k].dims)]
        else:
            dtype, dims = seq_types[name], seq_shapes.get(name, [*batch, 1])
        if dtype != t.dtype:
            raise TorchLoadError(
                f"{path}: input '{name}' is {dtype} in config.pbtxt, but the package takes {t.dtype} "
                f"({in_names[flat[k]]})"
            )
        want = t.shape()
        if len(dims) != len(want) or any(w != -1 and d != -1 and d != w for d, w in zip(dims, want)) or any(
            w != -1 and d == -1 for d, w in zip(dims, want)
        ):
            raise TorchLoadError(
                f"{path}: input '{name}' has shape {dims} in config.pbtxt"
                + (" (with the batch dimension)" if batch else "")
                + f", but the package takes {want} ({in_names[flat[k]]}; -1: dynamic)"
            )
    arg_inputs = [flat.index(j) for j in range(len(in_names))]
    out_all = [t.name for t in config.outputs] + extra_out
    output_index = [_index(n, _ORDINAL_OUT, out_names, "output", path) for n in out_all]
    for k, name in enumerate(out_all):
        got = probed[output_index[k]]["dtype"]
        want_t = config.outputs[k].datatype if k < len(config.outputs) else next(
            s[2] for s in sequence.states if s[1] == name
        )
        if got != want_t:
            raise TorchLoadError(
                f"{path}: output '{name}' is {want_t} in config.pbtxt, but the package returns "
                f"{got or 'a dtype with no V2 datatype'} ({out_names[output_index[k]]})"
            )

    def reshape(dims: tuple[int, ...] | None) -> list[int] | None:
        return None if dims is None else list(dims)

    spec: dict[str, Any] = {
        "arg_inputs": arg_inputs,
        "output_index": output_index,
        "output_key": [None] * len(out_all),
        "input_reshape": [reshape(t.reshape) for t in config.inputs] + [None] * len(extra_in),
        "output_reshape": [reshape(t.reshape) for t in config.outputs] + [None] * len(extra_out),
    }
    decl_in = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.inputs]
    decl_out = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs]
    return decl_in, decl_out, spec
