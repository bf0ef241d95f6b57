"""Triton's ensembles: ``platform: "ensemble"`` with ``ensemble_scheduling { step [...] }``.

An ensemble is a graph of served models: each step sends ensemble tensors to one model
(``input_map``: step input -> ensemble tensor) and names its outputs as ensemble tensors
(``output_map``: step output -> ensemble tensor). The core runs it (csrc/server/ensemble.c);
this module checks the graph when the model loads, as Triton's model configuration checks do
(core src/model_config_utils.cc ValidateEnsembleSchedulingConfig, ensemble_utils.cc), so that
a broken ensemble is served as UNAVAILABLE with a reason naming the field, never half-run.

Two checks need the other models: the step models must be served, and their declared inputs
and outputs must match the maps. `check_steps` does those when the ensemble is published; the
repository loads ensembles after the models they use (see `is_ensemble`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, ModelConfig, load_model_config
from ..model import Tensor

PLATFORM = "ensemble"


@dataclass(frozen=True)
class Step:
    model_name: str
    model_version: int  # -1: the model's default version
    input_map: tuple[tuple[str, str], ...]  # (step model input, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]  # (step model output, ensemble tensor)


@dataclass(frozen=True)
class EnsembleModel:
    """One version of an ensemble, ready for the core: what `openinfer.Model` offers the
    loader (name, version, inputs, outputs, ...) and the steps."""

    name: str
    version: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int
    steps: tuple[Step, ...]
    max_inflight_requests: int = 0  # Triton's per-step limit of runs in flight; 0: none
    platform: str = PLATFORM
    instances: int = 1
    dynamic_batching: None = None
    decoupled: bool = False  # decided when it is published, from its step models (`is_decoupled`)

    def core(self) -> tuple[int, list[tuple[str, int, list[tuple[str, str]], list[tuple[str, str]]]]]:
        """add_model's `ensemble` argument."""
        steps = [(s.model_name, s.model_version, list(s.input_map), list(s.output_map)) for s in self.steps]
        return self.max_inflight_requests, steps


def is_ensemble(config: Mapping[str, Any]) -> bool:
    """Whether a normalized config declares an ensemble (either half: the other is checked)."""
    return config.get("platform") == PLATFORM or "ensemble_scheduling" in config


def steps_in(model_dir: Path) -> list[str] | None:
    """The step model names of the ensemble that the model directory's config.pbtxt declares,
    or None when it declares none (or cannot be read: its load reports why)."""
    try:
        config = load_model_config(model_dir)
    except (ConfigError, OSError):
        return None
    return steps_of(config)


def steps_of(config: ModelConfig) -> list[str] | None:
    """The step model names of an ensemble's parsed config, or None when it is no ensemble."""
    if not is_ensemble({**config.raw, "platform": config.platform}):
        return None
    steps = config.raw.get("ensemble_scheduling", {})
    steps = steps.get("step", []) if isinstance(steps, dict) else []
    steps = steps if isinstance(steps, list) else [steps]
    return [s["model_name"] for s in steps if isinstance(s, dict) and isinstance(s.get("model_name"), str)]


def load_order(names: list[str], steps_of: Callable[[str], list[str] | None]) -> list[str]:
    """`names` with every ensemble after the models its steps use (ensembles of ensembles
    included), else in name order; a cycle between ensembles keeps name order (their load then
    says which step model is missing)."""
    plain = [n for n in sorted(names) if steps_of(n) is None]
    ensembles = {n: steps_of(n) or [] for n in sorted(names) if n not in plain}
    ordered: list[str] = []
    seen: set[str] = set()

    def visit(n: str, path: set[str]) -> None:
        if n in seen or n in path:
            return
        path.add(n)
        for dep in ensembles[n]:
            if dep in ensembles:
                visit(dep, path)
        seen.add(n)
        ordered.append(n)

    for n in ensembles:
        visit(n, set())
    return plain + ordered


def parse(config: Mapping[str, Any], source: str, name: str) -> tuple[Step, ...]:
    """The steps of a normalized ensemble config, after Triton's checks of the configuration on
    its own: the platform, the fields an ensemble cannot have, every step complete, every
    tensor connected, no cycle, every ensemble output written and every tensor used. Raises
    ConfigError naming `source` and the field; `name` is the model's."""

    def error(field: str, message: str) -> ConfigError:
        return ConfigError(f"{source}: {field}: {message}")

    if "ensemble_scheduling" not in config:
        raise error(
            "ensemble_scheduling",
            f"ensemble scheduling must be set for ensemble {name} whose platform is {PLATFORM}",
        )
    if config.get("platform") != PLATFORM:
        raise error(
            "ensemble_scheduling",
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {PLATFORM}",
        )
    if config.get("backend"):
        raise error("backend", f"an ensemble has no backend (ensemble '{name}' names {config['backend']!r})")
    for field, why in (
        ("instance_group", "instance group should not be specified for ensemble"),
        ("optimization", "optimization should not be specified for ensemble"),
        ("model_warmup", "model_warmup can not be specified for ensemble"),
        ("dynamic_batching", "dynamic batching can not be specified for ensemble"),
        ("sequence_batching", "sequence batching can not be specified for ensemble"),
    ):
        if config.get(field):
            raise error(field, f"{why} '{name}'")
    raw_steps = config["ensemble_scheduling"].get("step", [])
    if not raw_steps:
        raise error("ensemble_scheduling.step", f"must specify 'step' for ensemble '{name}'")

    steps: list[Step] = []
    producer: dict[str, int] = {}  # ensemble tensor -> the step whose output it is
    for i, s in enumerate(raw_steps):
        where = f"ensemble_scheduling.step[{i}]"
        for key in ("model_name", "input_map", "output_map"):
            if not s.get(key):
                raise error(f"{where}.{key}", f"must specify '{key}' in step {i} of ensemble '{name}'")
        for tensor in s["output_map"].values():
            if tensor in producer:
                raise error(
                    f"{where}.output_map",
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                    f"'{name}' step {i}",
                )
            producer[tensor] = i
        version = int(s.get("model_version", -1))
        steps.append(
            Step(s["model_name"], version, tuple(s["input_map"].items()), tuple(s["output_map"].items()))
        )

    inputs = [t["name"] for t in config.get("input", [])]
    outputs = [t["name"] for t in config.get("output", [])]
    consumed = {tensor for s in steps for _, tensor in s.input_map}
    for tensor in inputs:
        if tensor in producer:
            raise error(
                f"ensemble_scheduling.step[{producer[tensor]}].output_map",
                f"ensemble tensor '{tensor}' is an ensemble input and cannot be a step's output",
            )
        if tensor not in consumed:
            raise error("input", f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    # A tensor read by a step must be an ensemble input or some step's output.
    for i, s in enumerate(steps):
        for model_input, tensor in s.input_map:
            if tensor not in producer and tensor not in inputs:
                raise error(
                    f"ensemble_scheduling.step[{i}].input_map",
                    f"ensemble tensor '{tensor}' (input '{model_input}' of model '{s.model_name}') is "
                    f"neither an ensemble input nor any step's output in ensemble '{name}'",
                )
    cycle = _cycle(steps, producer)
    if cycle:
        path = " -> ".join(f"step[{i}] ('{steps[i].model_name}')" for i in cycle)
        raise error(
            "ensemble_scheduling.step",
            f"the steps of ensemble '{name}' form a cycle: {path}; no step of it can ever run",
        )
    for tensor in outputs:
        if tensor not in producer:
            raise error(
                "output",
                f"output '{tensor}' for ensemble '{name}' is not written: no step's output_map "
                "names it",
            )
    for tensor in producer:
        if tensor not in consumed and tensor not in outputs:
            raise error(
                f"ensemble_scheduling.step[{producer[tensor]}].output_map",
                f"ensemble tensor '{tensor}' is unused in ensemble '{name}'",
            )
    return tuple(steps)


def _cycle(steps: list[Step], producer: dict[str, int]) -> list[int]:
    """A cycle of steps (the first step repeated at the end), or [] when the graph has none."""
    after = [sorted({producer[t] for _, t in s.input_map if t in producer}) for s in steps]
    state = [0] * len(steps)  # 0 unseen, 1 on the path, 2 done
    path: list[int] = []

    def visit(i: int) -> list[int]:
        state[i] = 1
        path.append(i)
        for j in after[i]:
            if state[j] == 1:
                return [*path[path.index(j):], j][::-1]
            if state[j] == 0 and (found := visit(j)):
                return found
        path.pop()
        state[i] = 2
        return []

    for i in range(len(steps)):
        if state[i] == 0 and (found := visit(i)):
            return found
    return []


def check_steps(
    name: str,
    steps: tuple[Step, ...],
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    served: Callable[[str, int], tuple[Any, str | None]],
) -> str | None:
    """Checks the steps against the models they use, as Triton does when it loads an ensemble:
    each step model is served (`served(model, version)` returns the loaded model, or None and
    why not), its inputs are all mapped and only to declared inputs, its mapped outputs exist,
    and every ensemble tensor has one datatype. Returns the reason the ensemble cannot serve,
    or None."""
    types: dict[str, tuple[str, str]] = {t.name: (t.datatype, f"ensemble '{name}'") for t in inputs}
    for t in outputs:
        types.setdefault(t.name, (t.datatype, f"ensemble '{name}'"))

    def typed(i: int, tensor: str, datatype: str, model: str) -> str | None:
        seen = types.setdefault(tensor, (datatype, f"model {model}"))
        if seen[0] != datatype:
            return (
                f"ensemble_scheduling.step[{i}]: in ensemble {name}, ensemble tensor {tensor}: inconsistent "
                f"data type: {datatype} is inferred from model {model} while {seen[0]} is inferred from "
                f"{seen[1]}"
            )
        return None

    for i, s in enumerate(steps):
        where = f"ensemble_scheduling.step[{i}]"
        model, why = served(s.model_name, s.model_version)
        if model is None:
            return f"{where}.model_name: ensemble '{name}' depends on '{s.model_name}' {why}"
        declared_in = {t.name: t for t in model.inputs}
        declared_out = {t.name: t for t in model.outputs}
        for model_input, tensor in s.input_map:
            if model_input not in declared_in:
                return (
                    f"{where}.input_map: in ensemble {name}, ensemble tensor {tensor} is mapping to "
                    f"non-existing input {model_input} in model {s.model_name}"
                )
            if (bad := typed(i, tensor, declared_in[model_input].datatype, s.model_name)) is not None:
                return bad
        mapped = {model_input for model_input, _ in s.input_map}
        for model_input, t in declared_in.items():
            if model_input not in mapped and not t.optional:  # Triton lets an optional input go unmapped
                return (
                    f"{where}.input_map: in ensemble {name}, input {model_input} in model {s.model_name} "
                    "is not mapped to any ensemble tensors"
                )
        for model_output, tensor in s.output_map:
            if model_output not in declared_out:
                return (
                    f"{where}.output_map: in ensemble {name}, ensemble tensor {tensor} is mapped from "
                    f"non-existing output {model_output} in model {s.model_name}"
                )
            if (bad := typed(i, tensor, declared_out[model_output].datatype, s.model_name)) is not None:
                return bad
    return _mixed_lineage(name, steps, outputs, [is_decoupled((s,), served) for s in steps])


def is_decoupled(steps: tuple[Step, ...], served: Callable[[str, int], tuple[Any, str | None]]) -> bool:
    """Whether any step model is decoupled: the ensemble then is too (Triton sets its
    model_transaction_policy so), every response of that step a new request to the steps after."""
    return any(getattr(served(s.model_name, s.model_version)[0], "decoupled", False) for s in steps)


def _mixed_lineage(
    name: str, steps: tuple[Step, ...], outputs: tuple[Tensor, ...], decoupled: list[bool]
) -> str | None:
    """Triton's check of a graph with decoupled steps (ensemble_utils.cc): the inputs of a step,
    and the ensemble's outputs, must all come from the responses of the same decoupled step (or
    from none), since only those come in matching numbers. The reason when they do not. The
    graph is `parse`'s: acyclic, every step with inputs."""
    label: dict[str, int] = {tensor: 0 for s in steps for _, tensor in s.input_map if not _produced(tensor, steps)}
    pending, labels = list(range(len(steps))), 0
    while ready := [i for i in pending if all(t in label for _, t in steps[i].input_map)]:
        for i in ready:  # a pass over the steps whose inputs all have their origin
            pending.remove(i)
            seen = {label[t] for _, t in steps[i].input_map}  # a step has inputs (parse checked)
            if len(seen) > 1:
                return _mixed(i, name, steps[i].model_name)
            if decoupled[i]:
                labels += 1
            for _, tensor in steps[i].output_map:
                label[tensor] = labels if decoupled[i] else next(iter(seen))
    if len({label[t.name] for t in outputs if t.name in label}) > 1:
        return _mixed(None, name, name)
    return None


def _produced(tensor: str, steps: tuple[Step, ...]) -> bool:
    return any(tensor == t for s in steps for _, t in s.output_map)


def _mixed(i: int | None, name: str, model: str) -> str:
    where = "ensemble_scheduling.step" + (f"[{i}]" if i is not None else "")
    return (
        f"{where}: in ensemble {name}, step of model '{model}' receives inputs originated from different "
        "decoupled models"
    )
