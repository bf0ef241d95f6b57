"""What the ONNX and TorchScript loaders (onnx_model, torch_model) share: the model version
they hand to the C core's own backends, Triton's placement of instances on devices, and
Triton's non-negative integer parameters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import DynamicBatching, InstanceGroup
from ..model import Tensor


@dataclass(frozen=True, eq=False)
class NativeModel:
    """A model version ready to register with a backend of the C core: its V2 declaration
    (full shapes, as `openinfer.Model` has them) and `spec`, the dict that
    `_core.Server.add_model` takes for that backend."""

    name: str
    version: int
    path: Path
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int
    devices: tuple[str, ...]
    platform: str
    spec: dict[str, Any]
    dynamic_batching: DynamicBatching | None = None

    @property
    def instances(self) -> int:
        return len(self.devices)


def place_instances(
    groups: tuple[InstanceGroup, ...],
    gpus: int,
    error: type[Exception],
    *,
    no_gpu: str,
    seen: str,
    backend: str | None = None,
) -> tuple[str, ...]:
    """One device per instance, as Triton places them: `count` instances on each listed GPU
    (every one of the `gpus` usable GPUs when none is listed), or on the CPU; KIND_AUTO (and
    no instance_group, which means one instance) is a GPU where there is one. Raises `error`:
    `no_gpu` for a KIND_GPU group without a GPU, "... but `seen`" for a GPU past the usable
    ones, and, when `backend` is given, for any other kind (else other kinds run on the CPU)."""
    if not groups:
        return ("cuda:0",) if gpus else ("cpu",)
    devices: list[str] = []
    for g in groups:
        kind = g.kind
        if kind == "KIND_AUTO":
            kind = "KIND_GPU" if gpus else "KIND_CPU"
        if kind == "KIND_GPU":
            if not gpus:
                raise error(no_gpu)
            for gpu in g.gpus or tuple(range(gpus)):
                if gpu >= gpus:
                    raise error(f"instance_group names GPU {gpu}, but {seen}")
                devices += [f"cuda:{gpu}"] * g.count
        elif kind == "KIND_CPU" or backend is None:
            devices += ["cpu"] * g.count
        else:
            raise error(f"instance_group kind {kind} is not supported by the {backend} backend")
    return tuple(devices)


def count_parameter(params: dict[str, str], key: str, error: type[Exception]) -> int:
    """Parameter `key` as a non-negative integer (0 when absent or empty); raises `error`."""
    value = params.get(key)
    if value is None or value == "":
        return 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise error(f"parameter {key} must be a non-negative integer, got {value!r}")
    return count
