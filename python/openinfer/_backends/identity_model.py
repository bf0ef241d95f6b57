"""Triton's identity backend (`backend: "identity"` in config.pbtxt): each output OUTPUT<i>
answers with input INPUT<i>, served by the C core without a copy (csrc/backends/identity_backend.c).
The config is checked as Triton's backend checks it, with its words; its parameters
`execute_delay_ms`, `instance_wise_delay_multiplier` and `creation_delay_sec` work as there.
No model file: the version directory only has to exist."""

from __future__ import annotations

import time
from pathlib import Path

from ..config import ModelConfig, TensorConfig
from ..model import Tensor
from .native_model import NativeModel, count_parameter
from .._config.triton_config import v2_to_triton

IDENTITY_BACKEND = "identity"


class IdentityLoadError(Exception):
    """A config.pbtxt that the identity backend refuses; the message is Triton's."""


class IdentityModel(NativeModel):
    """An identity model version ready to register; `spec` holds its parameters
    execute_delay_ms and instance_wise_delay_multiplier (see `core_spec`)."""

    def core_spec(self) -> tuple[int, int]:
        """What `_core.Server.add_model(identity=...)` takes."""
        return (self.spec["execute_delay_ms"], self.spec["instance_wise_delay_multiplier"])


def _shape(t: TensorConfig) -> tuple[int, ...]:
    return t.reshape if t.reshape is not None else t.dims


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_config(config: ModelConfig) -> None:
    """Triton's identity backend's ValidateModelConfig: as many inputs as outputs, named
    INPUT<i> and OUTPUT<i>, each output's input of the same datatype and shape (its reshape
    where it has one). Raises IdentityLoadError."""
    if len(config.inputs) != len(config.outputs):
        raise IdentityLoadError("model configuration must have equal input/output pairs")
    inputs: dict[str, TensorConfig] = {}
    outputs: dict[str, TensorConfig] = {}
    for i, o in zip(config.inputs, config.outputs):
        if not i.name.startswith("INPUT"):
            raise IdentityLoadError(f"expected input name to follow INPUT<index> pattern, got '{i.name}'")
        if not o.name.startswith("OUTPUT"):
            raise IdentityLoadError(f"expected output name to follow OUTPUT<index> pattern, got '{o.name}'")
        inputs[i.name[len("INPUT"):]] = i
        outputs[o.name[len("OUTPUT"):]] = o
    for index, o in sorted(outputs.items()):
        i = inputs.get(index)
        if i is None:
            raise IdentityLoadError("expected input and output indices to match")
        if i.datatype != o.datatype:
            raise IdentityLoadError(
                f"expected input and output datatype to match, got {v2_to_triton(i.datatype)} and "
                f"{v2_to_triton(o.datatype)}"
            )
        if _shape(i) != _shape(o):
            raise IdentityLoadError(
                f"expected input and output shape to match, got {_shape_text(_shape(i))} and {_shape_text(_shape(o))}"
            )


def load_identity(name: str, version: int, version_dir: Path, config: ModelConfig | None) -> IdentityModel:
    """An identity model version from its config. Raises IdentityLoadError."""
    if config is None or not config.inputs:
        raise IdentityLoadError("the identity backend needs the model's inputs and outputs in config.pbtxt")
    check_config(config)
    params = config.parameters
    delay_ms = count_parameter(params, "execute_delay_ms", IdentityLoadError)
    multiplier = count_parameter(params, "instance_wise_delay_multiplier", IdentityLoadError) if delay_ms else 0
    creation_delay = count_parameter(params, "creation_delay_sec", IdentityLoadError)
    if creation_delay:
        time.sleep(creation_delay)  # as Triton's backend: a model slow to load, for tests of loading
    batch = [-1] if config.max_batch_size > 0 else []
    # Every instance runs on the CPU whatever its kind: the answer is the request's own memory.
    instances = sum(g.count for g in config.instance_groups) or 1
    return IdentityModel(
        name=name,
        version=version,
        path=version_dir,
        inputs=tuple(Tensor(t.name, t.datatype, [*batch, *t.dims], optional=t.optional) for t in config.inputs),
        outputs=tuple(Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs),
        max_batch_size=config.max_batch_size,
        devices=("cpu",) * instances,
        platform=config.platform or IDENTITY_BACKEND,
        spec={"execute_delay_ms": delay_ms, "instance_wise_delay_multiplier": multiplier},
        dynamic_batching=config.dynamic_batching,
    )
