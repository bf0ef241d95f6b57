"""TorchScript models: from ``<model>/<version>/model.pt`` (and config.pbtxt when there is one)
to the declaration and spec that the C core's torch backend serves.

With a config.pbtxt, Triton's pytorch backend rules apply: inputs are matched to forward()'s
arguments by name, else by the ``NAME__index`` convention, else in the config's order; outputs
by ``NAME__index`` (or, for a forward() that returns a dict, by key), else in the config's
order; TYPE_STRING tensors (one dimension in all) are forward()'s ``List[str]`` arguments and
results, on the CPU; `reshape`, `instance_group`, `dynamic_batching` and
the parameters INFERENCE_MODE, DISABLE_OPTIMIZED_EXECUTION, INTRA_OP_THREAD_COUNT and
INTER_OP_THREAD_COUNT are honoured.

Without one (beyond Triton), the inputs are forward()'s Tensor arguments by name. When the
module has an ``example_inputs`` attribute (a Tensor, or a tuple or list of them), the
datatypes and shapes come from it and the outputs (names, datatypes, shapes) from running
forward() on it once at load; dimension 0 is then declared variable. Without it, inputs are
FP32 of any shape, and outputs ``OUTPUT__<i>`` FP32 of any shape, as many as forward()'s
return annotation says (Tensor or Tuple of Tensors).

torch is imported only here, and only when a TorchScript model is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from .._config.paths import HeldFile
from ..config import InstanceGroup, ModelConfig
from ..model import Tensor
from .native_model import NativeModel, count_parameter, place_instances

TORCH_PLATFORM = "pytorch_libtorch"  # Triton's name, reported for configured models
CONFIGLESS_PLATFORM = "pytorch_torchscript"  # reported for models served without config.pbtxt
logger = logging.getLogger("openinfer")


def _named_index(name: str) -> int | None:
    """The index of a name that follows Triton's ``<name>__<index>`` convention as its pytorch
    backend reads it: what follows the first "__", all digits; else None."""
    head, sep, index = name.partition("__")
    return int(index or 0) if sep and (not index or index.isdigit()) else None
_TUPLE = re.compile(r"Tuple\[(.*)\]")


class TorchLoadError(Exception):
    """Why a TorchScript model version cannot be served; the repository reports it."""


class TorchUnavailable(TorchLoadError):
    """torch is not installed: TorchScript models cannot be served at all."""


class TorchModel(NativeModel):
    """A TorchScript model version ready to register; `spec` is what
    `_core.Server.add_model(torch=...)` takes."""


def load_torchscript(
    name: str, version: int, model_file: HeldFile, config: ModelConfig | None, sequence: Any = None
) -> TorchModel:
    """Describes the module (loading it once on the CPU) and checks the config against it.
    With `sequence` (a sequence.SequenceBatching), forward() also takes the control inputs and
    state inputs and returns the state outputs, matched like the declared ones. Raises
    TorchLoadError with the reason."""
    _ensure_shim()
    from .. import _core

    path = model_file.path
    try:
        described: dict[str, Any] = json.loads(_core.torch_describe(model_file.source))
    except RuntimeError as e:
        raise TorchLoadError(str(e)) from None
    args = [a for a in described["arguments"] if not a["has_default"]]
    configured = bool(config and (config.inputs or config.outputs))
    for a in args:  # List[str] is a TYPE_STRING input, which only a config can declare
        if a["type"] != "Tensor" and not (a["type"] == "List[str]" and configured):
            raise TorchLoadError(
                f"{path}: forward() argument {a['name']!r} is {a['type']}; only Tensor arguments, "
                "and List[str] ones declared TYPE_STRING in config.pbtxt, can be served (give others "
                "a default value)"
            )
    arg_names = [a["name"] for a in args]
    max_batch_size = config.max_batch_size if config else 0
    if config and configured:
        inputs, outputs, spec = _from_config(path, config, arg_names, described, sequence)
        platform = config.platform or TORCH_PLATFORM
    elif sequence is not None:
        raise TorchLoadError(f"{path}: sequence_batching needs input and output in config.pbtxt")
    else:
        inputs, outputs, spec = _from_signature(path, arg_names, described, max_batch_size)
        platform = CONFIGLESS_PLATFORM
    devices = _devices(config.instance_groups if config else ())
    params = config.parameters if config else {}
    spec["disable_optimized_execution"] = int(_flag(params, "DISABLE_OPTIMIZED_EXECUTION", False))
    return torch_version(name, version, model_file, config, inputs, outputs, max_batch_size, devices, platform, spec)


def torch_version(
    name: str, version: int, model_file: HeldFile, config: ModelConfig | None, inputs: list[Tensor],
    outputs: list[Tensor], max_batch_size: int, devices: tuple[str, ...], platform: str, spec: dict[str, Any],
) -> TorchModel:
    """The TorchModel of a TorchScript module or a PT2 package: `spec` completed with the file
    (read through the descriptor the repository opened, held as long as the spec), the
    instances' devices and the PyTorch backend's parameters both formats take."""
    params = config.parameters if config else {}
    spec.update(
        path=model_file.source,
        model=model_file,
        devices=list(devices),
        inference_mode=int(_flag(params, "INFERENCE_MODE", True)),
        intra_op_threads=count_parameter(params, "INTRA_OP_THREAD_COUNT", TorchLoadError),
        inter_op_threads=count_parameter(params, "INTER_OP_THREAD_COUNT", TorchLoadError),
    )
    return TorchModel(
        name=name, version=version, path=model_file.path, inputs=tuple(inputs), outputs=tuple(outputs),
        max_batch_size=max_batch_size, devices=devices, platform=platform, spec=spec,
        dynamic_batching=config.dynamic_batching if config else None,
    )


def _ensure_shim() -> None:
    """Imports torch (the shim links the libraries it loads), builds the shim if needed and
    loads it into the core: once per process."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise TorchUnavailable(
            f"serving TorchScript models needs torch, which cannot be imported ({e}); "
            "pip install torch"
        ) from None
    from .. import _core
    from .._code_cache import UntrustedCache
    from .._torch_build import ShimBuildError, shim

    try:
        with shim() as path:
            try:
                _core.torch_open_shim(path)
            except OSError as e:  # named by its file, not the descriptor it was loaded through
                raise OSError(str(e).replace(path, os.path.realpath(path))) from None
    except (ShimBuildError, UntrustedCache, OSError) as e:
        raise TorchLoadError(str(e)) from None


def _from_config(
    path: Path, config: ModelConfig, arg_names: list[str], described: dict[str, Any],
    sequence: Any = None,
) -> tuple[list[Tensor], list[Tensor], dict[str, Any]]:
    batch = [-1] if config.max_batch_size > 0 else []
    model = config.name or path.parent.parent.name
    # TYPE_STRING tensors are forward()'s List[str]: one dimension in all, as Triton allows.
    for kind, tensors in (("input", config.inputs), ("output", config.outputs)):
        for t in tensors:
            dims = t.reshape if t.reshape is not None else t.dims
            if t.datatype == "BYTES" and len(dims) + len(batch) > 1:
                raise TorchLoadError(
                    f"Triton only supports 1 dimensional List of String as {kind} for '{t.name}' for model "
                    f"'{model}'"
                )
    # What the sequence batcher adds: control and state inputs, then the state outputs the
    # config does not declare (in the order add_model's core appends them).
    extra_in = [] if sequence is None else [c[0] for c in sequence.controls] + [s[0] for s in sequence.states]
    declared_out = {t.name for t in config.outputs}
    extra_out = [] if sequence is None else [s[1] for s in sequence.states if s[1] not in declared_out]
    if sequence is not None and any(c[2] == "BYTES" for c in sequence.controls):
        raise TorchLoadError("a CORRID control of TYPE_STRING: the torch backend serves numeric and BOOL "
                             "tensors, not strings")  # fmt: skip
    names = [t.name for t in config.inputs] + extra_in
    out_names = [t.name for t in config.outputs] + extra_out
    # Triton's rules (its pytorch backend's GetNamingConvention): forward()'s argument names,
    # else NAME__index (index = argument position), else the config's order.
    indices = [_named_index(n) for n in names]
    if set(names) <= set(arg_names):
        missing = [a for a in arg_names if a not in names]
        if missing:
            raise TorchLoadError(
                f"forward() argument(s) {', '.join(map(repr, missing))} have no input in "
                "config.pbtxt"
            )
        arg_inputs = [names.index(a) for a in arg_names]
    elif None in indices:
        bad = names[indices.index(None)]
        logger.warning(
            "input '%s' or previous input(s) are neither an input argument to the model '%s' nor do "
            "they follow the <name>__<index> naming convention. Falling back to enforcing strict "
            "ordering from model configuration.", bad, model,
        )
        if len(names) != len(arg_names):
            raise TorchLoadError(
                f"input name(s) {', '.join(repr(n) for n in names if n not in arg_names)} match no "
                f"forward() argument ({', '.join(arg_names) or 'none'}) and do not follow the "
                f"NAME__index convention, so inputs go to forward() in the config's order: it "
                f"declares {len(names)} for {len(arg_names)} argument(s)"
            )
        arg_inputs = list(range(len(arg_names)))
    else:
        index = {k: i for i, k in enumerate(indices) if k is not None}
        if sorted(index) != list(range(len(arg_names))):
            raise TorchLoadError(
                f"inputs {', '.join(names)} must number forward()'s {len(arg_names)} "
                f"argument(s) as __0 to __{len(arg_names) - 1}"
            )
        arg_inputs = [index[k] for k in range(len(arg_names))]
    returns = described.get("returns") or ""
    is_dict = returns.startswith("Dict[")
    out_indices = [_named_index(n) for n in out_names]
    if is_dict:  # looked up by name (beyond Triton's rules)
        output_index, output_key = [-1] * len(out_names), list(out_names)
    elif None not in out_indices:
        output_index, output_key = [k for k in out_indices if k is not None], [None] * len(out_names)
    else:  # as Triton: the result's elements in the config's order
        logger.warning(
            "output '%s' or previous output(s) of the model '%s' do not follow the <name>__<index> "
            "naming convention. Falling back to enforcing strict ordering from model configuration.",
            out_names[out_indices.index(None)], model,
        )
        output_index, output_key = list(range(len(out_names))), [None] * len(out_names)

    def reshape(dims: tuple[int, ...] | None) -> list[int] | None:
        return None if dims is None else list(dims)

    spec: dict[str, Any] = {
        "arg_inputs": arg_inputs,
        "output_index": output_index,
        "output_key": output_key,
        "input_reshape": [reshape(t.reshape) for t in config.inputs] + [None] * len(extra_in),
        "output_reshape": [reshape(t.reshape) for t in config.outputs] + [None] * len(extra_out),
    }
    inputs = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.inputs]
    outputs = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs]
    return inputs, outputs, spec


def _from_signature(
    path: Path, arg_names: list[str], described: dict[str, Any], max_batch_size: int
) -> tuple[list[Tensor], list[Tensor], dict[str, Any]]:
    examples = described.get("example_inputs")
    probed = described.get("example_outputs")
    inputs: list[Tensor]
    outputs: list[Tensor]
    output_key: list[str | None]
    if examples is not None and probed is not None:
        if len(examples) != len(arg_names):
            raise TorchLoadError(
                f"{path}: example_inputs holds {len(examples)} tensor(s) for forward()'s "
                f"{len(arg_names)} argument(s)"
            )
        inputs = [
            Tensor(a, _datatype(path, e["dtype"], a), _variable_batch(e["shape"]))
            for a, e in zip(arg_names, examples)
        ]
        names = [o["name"] or f"OUTPUT__{i}" for i, o in enumerate(probed)]
        outputs = [
            Tensor(n, _datatype(path, o["dtype"], n), _variable_batch(o["shape"]))
            for n, o in zip(names, probed)
        ]
        output_key = [o["name"] for o in probed]
    else:
        if max_batch_size > 0:
            raise TorchLoadError(
                f"{path}: max_batch_size needs input shapes: declare input/output in "
                "config.pbtxt or give the module an example_inputs attribute"
            )
        returns = described.get("returns") or ""
        tuple_match = _TUPLE.fullmatch(returns)
        if returns == "Tensor":
            count = 1
        elif tuple_match and all(
            p.strip() == "Tensor" for p in tuple_match.group(1).split(",")
        ):
            count = len(tuple_match.group(1).split(","))
        else:
            raise TorchLoadError(
                f"{path}: forward() returns {returns or 'an unannotated type'}; without a "
                "config.pbtxt the outputs are only known for Tensor or Tuple[Tensor, ...]: "
                "add a config.pbtxt or an example_inputs attribute to the module"
            )
        inputs = [Tensor(a, "FP32", None) for a in arg_names]
        outputs = [Tensor(f"OUTPUT__{i}", "FP32", None) for i in range(count)]
        output_key = [None] * count
    spec: dict[str, Any] = {
        "arg_inputs": list(range(len(arg_names))),
        "output_index": list(range(len(outputs))),
        "output_key": output_key,
        "input_reshape": [None] * len(inputs),
        "output_reshape": [None] * len(outputs),
    }
    if max_batch_size > 0:
        for t in (*inputs, *outputs):
            if not t.shape:
                raise TorchLoadError(f"{path}: {t.name!r} has no batch dimension to batch on")
    return inputs, outputs, spec


def _variable_batch(shape: list[int]) -> list[int]:
    """An example's shape with dimension 0 variable: the example's batch size is arbitrary."""
    return [-1, *shape[1:]] if shape else []


def _datatype(path: Path, dtype: str, what: str) -> str:
    if not dtype or dtype == "INVALID":
        raise TorchLoadError(f"{path}: {what!r} has a torch dtype with no V2 datatype")
    return dtype


def _devices(groups: tuple[InstanceGroup, ...]) -> tuple[str, ...]:
    """One device per instance, on the CPU or a GPU torch sees (kinds other than KIND_GPU and
    KIND_AUTO run on the CPU)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return place_instances(
        groups,
        gpus,
        TorchLoadError,
        no_gpu="instance_group kind KIND_GPU needs a CUDA GPU, and torch sees none "
        f"(torch {torch.__version__}); use KIND_CPU",
        seen=f"torch sees {gpus} GPU(s)",
    )


def _flag(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise TorchLoadError(f"parameter {key} must be true or false, got {value!r}")
