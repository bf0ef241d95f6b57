"""Triton's sequence batching (``sequence_batching`` in config.pbtxt), checked against the
model and turned into what the C core's sequence batcher takes.

Requests that carry a ``sequence_id`` belong to a sequence: they run in order, one at a time,
with the control inputs the config declares (START, END, READY, CORRID) and the implicit state
(``state``) the server keeps between them; requests of different sequences batch together. A
Python model sees controls and state inputs as ordinary inputs and returns each state's
output like any other output; a Triton Python model gets the initial state at every step, as
Triton's python_backend never updates a state (`SequenceBatching.states_follow_outputs`).

Both strategies admit ``instance_group`` count x slots sequences at once (Direct: max(1,
max_batch_size) slots per instance; Oldest: ``max_candidate_sequences``, else the same). Direct,
as in Triton, binds each sequence to one batch row of one instance for its whole life and pads
the rows without a ready request (READY false); the core's sequence batcher forms those batches,
waiting up to ``max_queue_delay_microseconds`` for ``minimum_slot_utilization``. Oldest batches
the ready requests of its sequences through the model's dynamic batcher, with its
``preferred_batch_size`` and ``max_queue_delay_microseconds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import paths
from ..config import ConfigError

IDLE_DEFAULT_US = 1_000_000  # Triton's default max_sequence_idle_microseconds

_KINDS = {
    "CONTROL_SEQUENCE_START": 0,
    "CONTROL_SEQUENCE_READY": 1,
    "CONTROL_SEQUENCE_END": 2,
    "CONTROL_SEQUENCE_CORRID": 3,
}
_FLAG_TYPES = (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"), ("bool_false_true", "BOOL"))
_CORRID_TYPES = {"TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64", "TYPE_UINT32": "UINT32",
                 "TYPE_INT32": "INT32", "TYPE_STRING": "BYTES"}  # fmt: skip


@dataclass(frozen=True)
class SequenceBatching:
    """A checked ``sequence_batching``: what add_model's `sequence_batching` and
    `dynamic_batching` need, less the instance count."""

    oldest: bool
    min_slot_utilization: float  # Direct only
    slots_per_instance: int
    idle_us: int
    preferred_batch_size: tuple[int, ...]
    max_queue_delay_us: int
    controls: tuple[tuple[str, int, str, float, float], ...]
    states: tuple[tuple[str, str, str, tuple[int, ...], bytes], ...]
    # Each state input is the sequence's last state output (the backend updates the state);
    # False for a Triton Python model, whose python_backend never does: every request gets the
    # initial state (see docs/sequences.md).
    states_follow_outputs: bool = True

    def core(self, instances: int) -> tuple[int, int, list[Any], list[Any], tuple[int, float] | None, bool]:
        """add_model's `sequence_batching` tuple."""
        direct = None if self.oldest else (self.max_queue_delay_us, self.min_slot_utilization)
        return (self.slots_per_instance * max(1, instances), self.idle_us, list(self.controls),
                list(self.states), direct, self.states_follow_outputs)  # fmt: skip

    def batching(self) -> tuple[tuple[int, ...], int] | None:
        """add_model's `dynamic_batching` tuple: how the Oldest strategy batches the ready
        requests of different sequences (Direct forms its batches in the sequence batcher)."""
        return (self.preferred_batch_size, self.max_queue_delay_us) if self.oldest else None


def parse(
    config: dict[str, Any], source: str, model_dir: Path | None, declared: tuple[str, ...]
) -> SequenceBatching | None:
    """Checks a normalized config's sequence_batching (None when it has none) against the
    model's declared input names; initial state files are read from ``model_dir/initial_state``.
    Raises ConfigError naming the field."""
    sb = config.get("sequence_batching")
    if sb is None:
        return None
    where = f"{source}: sequence_batching"
    max_batch = int(config.get("max_batch_size", 0))
    batch = (1,) if max_batch > 0 else ()
    oldest = "oldest" in sb
    slots = max(1, max_batch)
    min_util = 0.0
    preferred: tuple[int, ...] = ()
    if oldest:
        o = sb["oldest"]
        if o.get("max_candidate_sequences", 0) < 0:
            raise ConfigError(f"{where}.oldest.max_candidate_sequences must be >= 0, got {o['max_candidate_sequences']}")
        slots = o.get("max_candidate_sequences") or slots
        preferred = tuple(o.get("preferred_batch_size") or ([max_batch] if max_batch > 0 else []))
        for p in preferred:
            if p < 1 or (max_batch > 0 and p > max_batch):
                raise ConfigError(
                    f"{where}.oldest.preferred_batch_size: {p} is not within 1..max_batch_size ({max_batch})"
                )
        delay = int(o.get("max_queue_delay_microseconds", 0))
    else:
        delay = int(sb.get("direct", {}).get("max_queue_delay_microseconds", 0))
        min_util = float(sb.get("direct", {}).get("minimum_slot_utilization", 0.0))
        if not 0.0 <= min_util <= 1.0:
            raise ConfigError(  # Triton's words, then the value
                f"{where}.direct.minimum_slot_utilization: sequence batching minimum slot utilization must be "
                f"in range (0.0, 1.0] for {config.get('name', '')}, got {min_util}"
            )
    taken = set(declared)
    controls = []
    kinds_seen: dict[str, str] = {}
    for i, ci in enumerate(sb.get("control_input", [])):
        name = ci.get("name", "")
        at = f"{where}.control_input[{i}]"
        if not name:
            raise ConfigError(f"{at}: name is required")
        if name in taken:
            raise ConfigError(f"{at}: name '{name}' is already an input of the model")
        taken.add(name)
        if len(ci.get("control", [])) != 1:
            raise ConfigError(
                f"{at} ('{name}'): expected exactly one control, got {len(ci.get('control', []))}"
            )
        c = ci["control"][0]
        kind = c.get("kind", "CONTROL_SEQUENCE_START")
        if kind not in _KINDS:
            raise ConfigError(f"{at}: control kind {kind} is not supported")
        if kind in kinds_seen:
            raise ConfigError(
                f"{at}: {kind} is already given by control input '{kinds_seen[kind]}'"
            )
        kinds_seen[kind] = name
        if kind == "CONTROL_SEQUENCE_CORRID":
            dtype = c.get("data_type", "TYPE_INVALID")
            if dtype not in _CORRID_TYPES:
                raise ConfigError(
                    f"{at} ('{name}'): CONTROL_SEQUENCE_CORRID data_type must be one of "
                    f"{', '.join(_CORRID_TYPES)}, got {dtype}"
                )
            controls.append((name, _KINDS[kind], _CORRID_TYPES[dtype], 0.0, 0.0))
            continue
        given = [(field, dt) for field, dt in _FLAG_TYPES if c.get(field)]
        if len(given) != 1 or len(c[given[0][0]]) != 2:
            raise ConfigError(
                f"{at} ('{name}'): {kind} needs exactly one of int32_false_true, fp32_false_true "
                "or bool_false_true, with two values (false, true)"
            )
        field, dtype = given[0]
        false, true = (float(v) for v in c[field])
        controls.append((name, _KINDS[kind], dtype, false, true))
    states = []
    outputs_seen: set[str] = set()
    for i, s in enumerate(sb.get("state", [])):
        at = f"{where}.state[{i}]"
        inp, out = s.get("input_name", ""), s.get("output_name", "")
        if not inp or not out:
            raise ConfigError(f"{at}: input_name and output_name are required")
        if inp in taken:
            raise ConfigError(f"{at}: input_name '{inp}' is already an input of the model")
        if out in outputs_seen:
            raise ConfigError(f"{at}: output_name '{out}' is already a state's output")
        taken.add(inp)
        outputs_seen.add(out)
        dtype = s.get("data_type", "TYPE_INVALID")
        if dtype in ("TYPE_INVALID", "TYPE_STRING") or not dtype.startswith("TYPE_"):
            raise ConfigError(f"{at} ('{inp}'): data_type must be a numeric type, got {dtype}")
        datatype = dtype[5:]
        dims = list(s.get("dims", []))
        if any(d < -1 for d in dims):
            raise ConfigError(f"{at} ('{inp}'): dims {dims} must hold ints >= -1")
        initial = s.get("initial_state", [])
        if len(initial) > 1:
            raise ConfigError(f"{at} ('{inp}'): at most one initial_state, got {len(initial)}")
        shape = [1 if d == -1 else d for d in dims]
        np_dtype = np.dtype(_NUMPY[datatype])
        data = b""
        if initial:
            init = initial[0]
            ia = f"{at}.initial_state"
            if init.get("data_type", "TYPE_INVALID") != dtype:
                raise ConfigError(
                    f"{ia}: data_type {init.get('data_type', 'TYPE_INVALID')} differs from the state's {dtype}"
                )
            idims = list(init.get("dims", []))
            if len(idims) != len(dims) or any(d < 0 for d in idims) or any(
                d != -1 and d != e for d, e in zip(dims, idims)
            ):
                raise ConfigError(f"{ia}: dims {idims} do not fit the state's dims {dims}")
            shape = idims
            size = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
            if init.get("data_file"):
                if model_dir is None:
                    raise ConfigError(f"{ia}: data_file needs a model directory")
                try:
                    data = paths.read_beneath(model_dir / "initial_state", init["data_file"], f"{ia}: data_file",
                                              model_dir)
                except paths.PathError as e:
                    raise ConfigError(str(e)) from None
                except OSError as e:
                    raise ConfigError(f"{ia}: cannot read data_file "
                                      f"'initial_state/{paths.printable(init['data_file'])}': {e.strerror}") from None
                if len(data) != size:
                    raise ConfigError(
                        f"{ia}: data_file {init['data_file']!r} holds {len(data)} bytes; "
                        f"dims {idims} of {datatype} need {size}"
                    )
            else:
                data = bytes(size)
        else:
            data = bytes(int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize)
        states.append((inp, out, datatype, (*batch, *shape), data))
    idle = int(sb.get("max_sequence_idle_microseconds", 0)) or IDLE_DEFAULT_US
    return SequenceBatching(
        oldest, min_util, int(slots), idle, preferred, delay, tuple(controls), tuple(states)
    )


def complete(config: dict[str, Any], max_batch_size: int) -> dict[str, Any]:
    """Triton's defaults for a reported configuration's sequence_batching."""
    sb = dict(config["sequence_batching"])
    if not sb.get("max_sequence_idle_microseconds"):
        sb["max_sequence_idle_microseconds"] = IDLE_DEFAULT_US
    if "oldest" in sb and not sb["oldest"].get("preferred_batch_size") and max_batch_size > 0:
        sb["oldest"] = {**sb["oldest"], "preferred_batch_size": [max_batch_size]}
    return sb


_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BF16": np.uint16,
}  # fmt: skip
