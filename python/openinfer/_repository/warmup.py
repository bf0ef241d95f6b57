"""Model warm-up: config.pbtxt's ``model_warmup`` samples, run on a model version before it is
served, as Triton runs them.

Each sample (``name``, ``batch_size``, ``inputs { key: { data_type dims zero_data |
random_data | input_data_file } }``, ``count``) becomes `batch_size` requests of one row each
(the sample's ``dims``, behind a batch dimension of 1 when the model batches), sent together
through the model's scheduler ``count`` times (0 counts as 1). A sample with ``batch_size`` 0
is skipped, as in Triton. Data:

- ``zero_data``: zeros (BYTES: empty strings);
- ``random_data``: random bytes (BYTES: empty strings, as Triton; BOOL: random 0/1);
- ``input_data_file``: the file of that name in the model's ``warmup/`` directory: its raw
  bytes (the first ones the shape needs; BYTES: the whole file, 4-byte little-endian lengths
  each followed by the bytes). A path leaving ``warmup/`` is refused.

Any failure (a sample that cannot be built, or a request the model fails) makes the version
UNAVAILABLE with the reason naming the sample and the input. The samples run once per model
version, where Triton runs them once per instance: openinfer's instances share the version's
model (one Python handler, one TorchScript module), so one warm-up warms them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._config import paths
from ..config import TRITON_DATATYPES
from ..model import numpy_dtype

# One request: (name, datatype, shape, bytes) per input.
Request = list[tuple[str, str, tuple[int, ...], bytes]]


class WarmupError(ValueError):
    """A warm-up sample that cannot be built or that the model failed; the message names it."""


@dataclass(frozen=True)
class Sample:
    name: str
    count: int
    requests: list[Request]


def samples(config: dict[str, Any], max_batch_size: int, model_dir: Path | None) -> list[Sample]:
    """The warm-up samples of a normalized config (triton_config.normalize), built. Raises
    WarmupError naming the sample and the input."""
    if config.get("model_warmup") and "sequence_batching" in config:
        # Triton feeds a sequence model's warm-up the control inputs itself; openinfer does not.
        raise WarmupError("model_warmup with sequence_batching is not supported by openinfer; remove one")
    if config.get("model_warmup") and config.get("model_transaction_policy", {}).get("decoupled"):
        raise WarmupError("model_warmup of a decoupled model is not supported by openinfer; remove one")
    out = []
    for index, sample in enumerate(config.get("model_warmup") or []):
        name = str(sample.get("name", ""))
        where = f"model_warmup[{index}] '{name}'"
        batch_size = int(sample.get("batch_size", 0))
        if batch_size == 0:
            continue  # as Triton: a sample of batch 0 is skipped
        inputs = sample.get("inputs") or {}
        if not inputs:
            raise WarmupError(f"{where}: no inputs")
        request: Request = []
        for key, spec in inputs.items():
            request.append(_input(where, key, spec, max_batch_size, model_dir))
        out.append(Sample(name, max(int(sample.get("count", 0)), 1), [request] * batch_size))
    return out


def _input(
    where: str, key: str, spec: dict[str, Any], max_batch_size: int, model_dir: Path | None
) -> tuple[str, str, tuple[int, ...], bytes]:
    field = f"{where} input '{key}'"
    datatype = TRITON_DATATYPES.get(str(spec.get("data_type", "TYPE_INVALID")))
    if datatype is None:
        raise WarmupError(f"{field}: data_type must be one of {', '.join(TRITON_DATATYPES)}, got "
                          f"{spec.get('data_type', 'none')}")
    dims = [int(d) for d in spec.get("dims", [])]
    if any(d < 0 for d in dims):
        raise WarmupError(
            f"{field}: warmup setting expects all variable-size dimensions are specified for input "
            f"'{key}', got dims {dims}"
        )
    shape = tuple(([1] if max_batch_size > 0 else []) + dims)
    elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
    width = 4 if datatype == "BYTES" else (2 if datatype == "BF16" else numpy_dtype(datatype).itemsize)
    size = elements * width  # BYTES: that many empty strings (4-byte zero lengths)
    if size > 1 << 30:
        raise WarmupError(f"{field}: {size} bytes of data is more than warm-up allows (1 GiB)")
    if spec.get("zero_data"):
        return key, datatype, shape, bytes(size)
    if spec.get("random_data"):
        if datatype == "BYTES":
            return key, datatype, shape, bytes(size)
        data = os.urandom(size)
        if datatype == "BOOL":
            data = bytes(b & 1 for b in data)
        return key, datatype, shape, data
    file = spec.get("input_data_file")
    if file:
        data = _read_file(field, str(file), model_dir)
        if datatype == "BYTES":
            return key, datatype, shape, data
        if len(data) < size:
            raise WarmupError(
                f"{field}: warmup setting expects {size} bytes, but the data provided from {file} "
                f"only has {len(data)} bytes"
            )
        return key, datatype, shape, data[:size]
    raise WarmupError(f"{field}: warmup setting expects input '{key}' to have input_data_type set "
                      "(zero_data, random_data or input_data_file)")


def _read_file(field: str, name: str, model_dir: Path | None) -> bytes:
    """File `name` of the model's warmup/ directory (see paths.open_beneath: one file name, no
    link out of it, read from the descriptor it is opened as)."""
    if model_dir is None:
        raise WarmupError(f"{field}: input_data_file needs a model directory (this model has none)")
    try:
        return paths.read_beneath(model_dir / "warmup", name, f"{field}: input_data_file", model_dir)
    except paths.PathError as e:
        raise WarmupError(str(e)) from None
    except OSError as e:
        raise WarmupError(f"{field}: cannot read input_data_file warmup/{paths.printable(name)}: "
                          f"{e.strerror or e}") from None


def run(handle: Any, samples_: list[Sample]) -> None:
    """Runs the samples on an unpublished core model version (`ModelVersion.warmup`), each
    `count` times, stopping at the first failure. Raises WarmupError with Triton's wording
    ("failed to run warmup sample 'NAME': ...")."""
    for sample in samples_:
        for _ in range(sample.count):
            error = handle.warmup(sample.requests)
            if error is not None:
                raise WarmupError(f"failed to run warmup sample '{sample.name}': {error}")
