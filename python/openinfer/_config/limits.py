"""Bounds on what one model configuration may ask the server to allocate or start, checked on
the normalized config (triton_config.normalize) before any of it is: instances, batch rows,
queue lengths, sequence slots and state, ensemble steps and warm-up samples. A config is
untrusted input (a load request's override comes from the network), and each of these sizes
an allocation or a number of threads or processes; the numbers are summed in Python, so two
groups of 2**31 - 1 instances are a refusal, not an overflow in the core.

These are fixed bounds, far above what any model needs, that the message names. A load request
is also held to the server's --max-instances (openinfer._control.control), checked on
`instances` of its override before the override is used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ConfigError

MAX_MODEL_INSTANCES = 1 << 14  # any config's, the repository's included; loads also --max-instances
MAX_BATCH_SIZE = 1 << 20  # rows of one batch: max_batch_size, preferred sizes, warm-up batch_size
MAX_QUEUE_SIZE = 1 << 24  # requests one queue policy lets wait
MAX_SEQUENCE_SLOTS = 1 << 20  # sequences a model holds slots for, over all its instances
MAX_STATE_BYTES = 1 << 30  # one sequence state's initial value
MAX_ENSEMBLE_STEPS = 1024
MAX_WARMUP_COUNT = 1 << 16  # runs of one warm-up sample


def default_max_instances() -> int:
    """max_instances when not given: four instances per usable CPU, and at least 64 (enough for
    a repository of GPU models on a host of few CPUs)."""
    from .. import _core

    return max(64, 4 * int(_core.usable_cpus()))


def check(config: Mapping[str, Any], source: str) -> None:
    """Raises ConfigError naming `source`, the field, its value and the bound it passes. The
    server-wide --max-instances is the caller's to check, on `instances(config)`."""
    count = instances(config)
    _bound(source, "instance_group count", count, MAX_MODEL_INSTANCES, "instances of one model")
    max_batch = int(config.get("max_batch_size", 0))
    _bound(source, "max_batch_size", max_batch, MAX_BATCH_SIZE, "rows per batch")
    batching = config.get("dynamic_batching") or {}
    for i, size in enumerate(batching.get("preferred_batch_size", [])):
        _bound(source, f"dynamic_batching.preferred_batch_size[{i}]", size, MAX_BATCH_SIZE, "rows per batch")
    policies = {"dynamic_batching.default_queue_policy": batching.get("default_queue_policy") or {}}
    for level, policy in (batching.get("priority_queue_policy") or {}).items():
        policies[f"dynamic_batching.priority_queue_policy[{level}]"] = policy or {}
    for where, policy in policies.items():
        _bound(source, f"{where}.max_queue_size", int(policy.get("max_queue_size", 0)), MAX_QUEUE_SIZE,
               "queued requests")
    _check_sequences(config.get("sequence_batching"), source, max_batch, count)
    steps = (config.get("ensemble_scheduling") or {}).get("step", [])
    _bound(source, "ensemble_scheduling.step count", len(steps), MAX_ENSEMBLE_STEPS, "steps")
    for i, sample in enumerate(config.get("model_warmup") or []):
        where = f"model_warmup[{i}]"
        _bound(source, f"{where}.batch_size", int(sample.get("batch_size", 0)), MAX_BATCH_SIZE, "rows per batch")
        _bound(source, f"{where}.count", int(sample.get("count", 0)), MAX_WARMUP_COUNT, "runs of a sample")


def instances(config: Mapping[str, Any]) -> int:
    """The instances a normalized config asks for: each group's count (at least 1) on each GPU
    it lists, summed; 1 without instance_group."""
    groups = config.get("instance_group") or []
    return sum(max(1, int(g.get("count", 1))) * max(1, len(g.get("gpus") or [])) for g in groups) or 1


def _check_sequences(sb: Mapping[str, Any] | None, source: str, max_batch: int, instances: int) -> None:
    """Sequence slots (max_candidate_sequences, else max_batch_size, per instance) and the size
    of each state's initial value, which every sequence gets a copy of."""
    if sb is None:
        return
    per_instance = int((sb.get("oldest") or {}).get("max_candidate_sequences", 0)) or max(1, max_batch)
    field = "oldest.max_candidate_sequences" if "oldest" in sb else "max_batch_size"
    _bound(source, f"sequence_batching: {per_instance} slots ({field}) x {instances} instances =",
           per_instance * instances, MAX_SEQUENCE_SLOTS, "sequence slots")
    for i, state in enumerate(sb.get("state") or []):
        for dims_of, dims in [("dims", state.get("dims") or [])] + [
            (f"initial_state[{k}].dims", s.get("dims") or []) for k, s in enumerate(state.get("initial_state") or [])
        ]:
            elements = 1
            for d in dims:
                elements *= max(1, int(d))
            _bound(source, f"sequence_batching.state[{i}].{dims_of} {list(dims)}: up to", elements * 8,
                   MAX_STATE_BYTES, "bytes of one state")


def _bound(source: str, field: str, value: int, limit: int, unit: str) -> None:
    if value > limit:
        raise ConfigError(f"{source}: {field} {value} is more than openinfer allows ({limit} {unit})")
