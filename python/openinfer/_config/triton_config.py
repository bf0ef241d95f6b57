"""Triton's model configuration (inference.ModelConfig of proto/model_config.proto) as the
model configuration endpoints report it: a config.pbtxt checked against the schema, completed
the way Triton's auto-complete completes it, then rendered as Triton's JSON and as protobuf.

`normalize` reads what `config.parse` produced (or a JSON config) against the schema: every
field must exist, values get their proto type, repeated fields become lists and maps dicts.
`complete` adds what a served model version implies (its inputs, outputs, backend and
instances) and Triton's defaults. `to_json` prints like Triton (protobuf's JSON with field
names as declared, every scalar, repeated and map field even when defaulted, enums by name,
64-bit integers as numbers where Triton converts them); `to_protobuf` serializes.

The schema below mirrors proto/model_config.proto (fields in declaration order, which is the
order Triton's JSON uses); tests/test_model_config.py checks it against that file and against
tritonclient's own copy, so a field added to one and not the other fails the tests.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import sequence
from ..config import TRITON_DATATYPES, ConfigError


class _F(NamedTuple):
    """A field: name, number, type (a scalar type, "enum:<Enum>" or a message name) and label
    ("", "repeated", "map:<key type>" or "oneof:<group>")."""

    name: str
    number: int
    type: str
    label: str


# Every message of proto/model_config.proto (nested ones as "Outer.Inner"), fields in
# declaration order, then every enum's values.
MESSAGES: dict[str, tuple[_F, ...]] = {
    "ModelRateLimiter": (
        _F("resources", 1, "ModelRateLimiter.Resource", "repeated"),
        _F("priority", 2, "uint32", ""),
    ),
    "ModelRateLimiter.Resource": (
        _F("name", 1, "string", ""),
        _F("global", 2, "bool", ""),
        _F("count", 3, "uint32", ""),
    ),
    "ModelInstanceGroup": (
        _F("name", 1, "string", ""),
        _F("kind", 4, "enum:ModelInstanceGroup.Kind", ""),
        _F("count", 2, "int32", ""),
        _F("rate_limiter", 6, "ModelRateLimiter", ""),
        _F("gpus", 3, "int32", "repeated"),
        _F("secondary_devices", 8, "ModelInstanceGroup.SecondaryDevice", "repeated"),
        _F("profile", 5, "string", "repeated"),
        _F("passive", 7, "bool", ""),
        _F("host_policy", 9, "string", ""),
    ),
    "ModelInstanceGroup.SecondaryDevice": (
        _F("kind", 1, "enum:ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind", ""),
        _F("device_id", 2, "int64", ""),
    ),
    "ModelTensorReshape": (
        _F("shape", 1, "int64", "repeated"),
    ),
    "ModelInput": (
        _F("name", 1, "string", ""),
        _F("data_type", 2, "enum:DataType", ""),
        _F("format", 3, "enum:ModelInput.Format", ""),
        _F("dims", 4, "int64", "repeated"),
        _F("reshape", 5, "ModelTensorReshape", ""),
        _F("is_shape_tensor", 6, "bool", ""),
        _F("allow_ragged_batch", 7, "bool", ""),
        _F("optional", 8, "bool", ""),
        _F("is_non_linear_format_io", 9, "bool", ""),
    ),
    "ModelOutput": (
        _F("name", 1, "string", ""),
        _F("data_type", 2, "enum:DataType", ""),
        _F("dims", 3, "int64", "repeated"),
        _F("reshape", 5, "ModelTensorReshape", ""),
        _F("label_filename", 4, "string", ""),
        _F("is_shape_tensor", 6, "bool", ""),
        _F("is_non_linear_format_io", 7, "bool", ""),
    ),
    "BatchInput": (
        _F("kind", 1, "enum:BatchInput.Kind", ""),
        _F("target_name", 2, "string", "repeated"),
        _F("data_type", 3, "enum:DataType", ""),
        _F("source_input", 4, "string", "repeated"),
    ),
    "BatchOutput": (
        _F("target_name", 1, "string", "repeated"),
        _F("kind", 2, "enum:BatchOutput.Kind", ""),
        _F("source_input", 3, "string", "repeated"),
    ),
    "ModelVersionPolicy": (
        _F("latest", 1, "ModelVersionPolicy.Latest", "oneof:policy_choice"),
        _F("all", 2, "ModelVersionPolicy.All", "oneof:policy_choice"),
        _F("specific", 3, "ModelVersionPolicy.Specific", "oneof:policy_choice"),
    ),
    "ModelVersionPolicy.Latest": (
        _F("num_versions", 1, "uint32", ""),
    ),
    "ModelVersionPolicy.All": (
    ),
    "ModelVersionPolicy.Specific": (
        _F("versions", 1, "int64", "repeated"),
    ),
    "ModelOptimizationPolicy": (
        _F("graph", 1, "ModelOptimizationPolicy.Graph", ""),
        _F("priority", 2, "enum:ModelOptimizationPolicy.ModelPriority", ""),
        _F("cuda", 3, "ModelOptimizationPolicy.Cuda", ""),
        _F("execution_accelerators", 4, "ModelOptimizationPolicy.ExecutionAccelerators", ""),
        _F("input_pinned_memory", 5, "ModelOptimizationPolicy.PinnedMemoryBuffer", ""),
        _F("output_pinned_memory", 6, "ModelOptimizationPolicy.PinnedMemoryBuffer", ""),
        _F("gather_kernel_buffer_threshold", 7, "uint32", ""),
        _F("eager_batching", 8, "bool", ""),
    ),
    "ModelOptimizationPolicy.Graph": (
        _F("level", 1, "int32", ""),
    ),
    "ModelOptimizationPolicy.Cuda": (
        _F("graphs", 1, "bool", ""),
        _F("busy_wait_events", 2, "bool", ""),
        _F("graph_spec", 3, "ModelOptimizationPolicy.Cuda.GraphSpec", "repeated"),
        _F("output_copy_stream", 4, "bool", ""),
    ),
    "ModelOptimizationPolicy.Cuda.GraphSpec": (
        _F("batch_size", 1, "int32", ""),
        _F("input", 2, "ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "map:string"),
        _F("graph_lower_bound", 3, "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound", ""),
    ),
    "ModelOptimizationPolicy.Cuda.GraphSpec.Shape": (
        _F("dim", 1, "int64", "repeated"),
    ),
    "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound": (
        _F("batch_size", 1, "int32", ""),
        _F("input", 2, "ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "map:string"),
    ),
    "ModelOptimizationPolicy.ExecutionAccelerators": (
        _F("gpu_execution_accelerator", 1, "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator", "repeated"),
        _F("cpu_execution_accelerator", 2, "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator", "repeated"),
    ),
    "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator": (
        _F("name", 1, "string", ""),
        _F("parameters", 2, "string", "map:string"),
    ),
    "ModelOptimizationPolicy.PinnedMemoryBuffer": (
        _F("enable", 1, "bool", ""),
    ),
    "ModelQueuePolicy": (
        _F("timeout_action", 1, "enum:ModelQueuePolicy.TimeoutAction", ""),
        _F("default_timeout_microseconds", 2, "uint64", ""),
        _F("allow_timeout_override", 3, "bool", ""),
        _F("max_queue_size", 4, "uint32", ""),
    ),
    "ModelDynamicBatching": (
        _F("preferred_batch_size", 1, "int32", "repeated"),
        _F("max_queue_delay_microseconds", 2, "uint64", ""),
        _F("preserve_ordering", 3, "bool", ""),
        _F("priority_levels", 4, "uint64", ""),
        _F("default_priority_level", 5, "uint64", ""),
        _F("default_queue_policy", 6, "ModelQueuePolicy", ""),
        _F("priority_queue_policy", 7, "ModelQueuePolicy", "map:uint64"),
    ),
    "ModelSequenceBatching": (
        _F("direct", 3, "ModelSequenceBatching.StrategyDirect", "oneof:strategy_choice"),
        _F("oldest", 4, "ModelSequenceBatching.StrategyOldest", "oneof:strategy_choice"),
        _F("max_sequence_idle_microseconds", 1, "uint64", ""),
        _F("control_input", 2, "ModelSequenceBatching.ControlInput", "repeated"),
        _F("state", 5, "ModelSequenceBatching.State", "repeated"),
        _F("iterative_sequence", 6, "bool", ""),
    ),
    "ModelSequenceBatching.Control": (
        _F("kind", 1, "enum:ModelSequenceBatching.Control.Kind", ""),
        _F("int32_false_true", 2, "int32", "repeated"),
        _F("fp32_false_true", 3, "float", "repeated"),
        _F("bool_false_true", 5, "bool", "repeated"),
        _F("data_type", 4, "enum:DataType", ""),
    ),
    "ModelSequenceBatching.ControlInput": (
        _F("name", 1, "string", ""),
        _F("control", 2, "ModelSequenceBatching.Control", "repeated"),
    ),
    "ModelSequenceBatching.InitialState": (
        _F("data_type", 1, "enum:DataType", ""),
        _F("dims", 2, "int64", "repeated"),
        _F("zero_data", 3, "bool", "oneof:state_data"),
        _F("data_file", 4, "string", "oneof:state_data"),
        _F("name", 5, "string", ""),
    ),
    "ModelSequenceBatching.State": (
        _F("input_name", 1, "string", ""),
        _F("output_name", 2, "string", ""),
        _F("data_type", 3, "enum:DataType", ""),
        _F("dims", 4, "int64", "repeated"),
        _F("initial_state", 5, "ModelSequenceBatching.InitialState", "repeated"),
        _F("use_same_buffer_for_input_output", 6, "bool", ""),
        _F("use_growable_memory", 7, "bool", ""),
    ),
    "ModelSequenceBatching.StrategyDirect": (
        _F("max_queue_delay_microseconds", 1, "uint64", ""),
        _F("minimum_slot_utilization", 2, "float", ""),
    ),
    "ModelSequenceBatching.StrategyOldest": (
        _F("max_candidate_sequences", 1, "int32", ""),
        _F("preferred_batch_size", 2, "int32", "repeated"),
        _F("max_queue_delay_microseconds", 3, "uint64", ""),
        _F("preserve_ordering", 4, "bool", ""),
    ),
    "ModelEnsembling": (
        _F("step", 1, "ModelEnsembling.Step", "repeated"),
        _F("max_inflight_requests", 2, "uint32", ""),
    ),
    "ModelEnsembling.Step": (
        _F("model_name", 1, "string", ""),
        _F("model_version", 2, "int64", ""),
        _F("input_map", 3, "string", "map:string"),
        _F("output_map", 4, "string", "map:string"),
        _F("model_namespace", 5, "string", ""),
    ),
    "ModelParameter": (
        _F("string_value", 1, "string", ""),
    ),
    "ModelWarmup": (
        _F("name", 1, "string", ""),
        _F("batch_size", 2, "uint32", ""),
        _F("inputs", 3, "ModelWarmup.Input", "map:string"),
        _F("count", 4, "uint32", ""),
    ),
    "ModelWarmup.Input": (
        _F("data_type", 1, "enum:DataType", ""),
        _F("dims", 2, "int64", "repeated"),
        _F("zero_data", 3, "bool", "oneof:input_data_type"),
        _F("random_data", 4, "bool", "oneof:input_data_type"),
        _F("input_data_file", 5, "string", "oneof:input_data_type"),
    ),
    "ModelOperations": (
        _F("op_library_filename", 1, "string", "repeated"),
    ),
    "ModelTransactionPolicy": (
        _F("decoupled", 1, "bool", ""),
    ),
    "ModelRepositoryAgents": (
        _F("agents", 1, "ModelRepositoryAgents.Agent", "repeated"),
    ),
    "ModelRepositoryAgents.Agent": (
        _F("name", 1, "string", ""),
        _F("parameters", 2, "string", "map:string"),
    ),
    "ModelResponseCache": (
        _F("enable", 1, "bool", ""),
    ),
    "ModelMetrics": (
        _F("metric_control", 1, "ModelMetrics.MetricControl", "repeated"),
    ),
    "ModelMetrics.MetricControl": (
        _F("metric_identifier", 1, "ModelMetrics.MetricControl.MetricIdentifier", ""),
        _F("histogram_options", 2, "ModelMetrics.MetricControl.HistogramOptions", "oneof:metric_options"),
    ),
    "ModelMetrics.MetricControl.MetricIdentifier": (
        _F("family", 1, "string", ""),
    ),
    "ModelMetrics.MetricControl.HistogramOptions": (
        _F("buckets", 1, "double", "repeated"),
    ),
    "ModelConfig": (
        _F("name", 1, "string", ""),
        _F("platform", 2, "string", ""),
        _F("backend", 17, "string", ""),
        _F("runtime", 25, "string", ""),
        _F("version_policy", 3, "ModelVersionPolicy", ""),
        _F("max_batch_size", 4, "int32", ""),
        _F("input", 5, "ModelInput", "repeated"),
        _F("output", 6, "ModelOutput", "repeated"),
        _F("batch_input", 20, "BatchInput", "repeated"),
        _F("batch_output", 21, "BatchOutput", "repeated"),
        _F("optimization", 12, "ModelOptimizationPolicy", ""),
        _F("dynamic_batching", 11, "ModelDynamicBatching", "oneof:scheduling_choice"),
        _F("sequence_batching", 13, "ModelSequenceBatching", "oneof:scheduling_choice"),
        _F("ensemble_scheduling", 15, "ModelEnsembling", "oneof:scheduling_choice"),
        _F("instance_group", 7, "ModelInstanceGroup", "repeated"),
        _F("default_model_filename", 8, "string", ""),
        _F("cc_model_filenames", 9, "string", "map:string"),
        _F("metric_tags", 10, "string", "map:string"),
        _F("parameters", 14, "ModelParameter", "map:string"),
        _F("model_warmup", 16, "ModelWarmup", "repeated"),
        _F("model_operations", 18, "ModelOperations", ""),
        _F("model_transaction_policy", 19, "ModelTransactionPolicy", ""),
        _F("model_repository_agents", 23, "ModelRepositoryAgents", ""),
        _F("response_cache", 24, "ModelResponseCache", ""),
        _F("model_metrics", 26, "ModelMetrics", ""),
    ),
}
ENUMS: dict[str, dict[str, int]] = {
    "DataType": {
        "TYPE_INVALID": 0, "TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4,
        "TYPE_UINT64": 5, "TYPE_INT8": 6, "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9,
        "TYPE_FP16": 10, "TYPE_FP32": 11, "TYPE_FP64": 12, "TYPE_STRING": 13, "TYPE_BF16": 14,
    },
    "ModelInstanceGroup.Kind": {"KIND_AUTO": 0, "KIND_GPU": 1, "KIND_CPU": 2, "KIND_MODEL": 3},
    "ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind": {"KIND_NVDLA": 0},
    "ModelInput.Format": {"FORMAT_NONE": 0, "FORMAT_NHWC": 1, "FORMAT_NCHW": 2},
    "BatchInput.Kind": {
        "BATCH_ELEMENT_COUNT": 0, "BATCH_ACCUMULATED_ELEMENT_COUNT": 1,
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": 2, "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE": 3,
        "BATCH_ITEM_SHAPE": 4, "BATCH_ITEM_SHAPE_FLATTEN": 5,
    },
    "BatchOutput.Kind": {"BATCH_SCATTER_WITH_INPUT_SHAPE": 0},
    "ModelOptimizationPolicy.ModelPriority": {"PRIORITY_DEFAULT": 0, "PRIORITY_MAX": 1, "PRIORITY_MIN": 2},
    "ModelQueuePolicy.TimeoutAction": {"REJECT": 0, "DELAY": 1},
    "ModelSequenceBatching.Control.Kind": {
        "CONTROL_SEQUENCE_START": 0, "CONTROL_SEQUENCE_READY": 1, "CONTROL_SEQUENCE_END": 2,
        "CONTROL_SEQUENCE_CORRID": 3,
    },
}

# 64-bit fields that Triton's JSON leaves as strings (protobuf's JSON default): its
# ModelConfigToJson turns every other int64/uint64 field of the config into a number.
_JSON_STRING_INT64 = {
    ("ModelInstanceGroup.SecondaryDevice", "device_id"),
    ("ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "dim"),
    ("ModelSequenceBatching.InitialState", "dims"),
}

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
_FIELDS = {m: {f.name: f for f in fs} for m, fs in MESSAGES.items()}
_V2_TO_TRITON = {v2: triton for triton, v2 in TRITON_DATATYPES.items()}

Message = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Reading a config against the schema


def normalize(raw: Mapping[str, Any], source: str = "<config>") -> Message:
    """Checks a parsed config.pbtxt (config.parse) or a JSON config against ModelConfig and
    returns it typed: lists for repeated fields (a field written once included), dicts for
    maps (text format's repeated {key, value} entries or JSON objects), enum values by name,
    integers range-checked. Raises ConfigError naming `source` and the field's path."""
    return _message(raw, "ModelConfig", source, "")


def _message(value: object, message: str, source: str, path: str) -> Message:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: {path or 'the config'}: expected a message {{...}}, got {value!r}")
    fields = _FIELDS[message]
    out: Message = {}
    oneofs: dict[str, str] = {}
    for key, v in value.items():
        here = f"{path}.{key}" if path else key
        f = fields.get(key)
        if f is None:
            known = ", ".join(fields)
            raise ConfigError(f"{source}: {here}: unknown field (the fields of {message} are: {known})")
        if f.label.startswith("oneof:"):
            other = oneofs.setdefault(f.label, key)
            if other != key:
                raise ConfigError(f"{source}: {here}: only one of {other} and {key} may be given")
        if f.label == "repeated":
            items = v if isinstance(v, list) else [v]
            out[key] = [_single(f, x, source, f"{here}[{i}]") for i, x in enumerate(items)]
        elif f.label.startswith("map:"):
            out[key] = _map(f, v, source, here)
        else:
            if isinstance(v, list):
                raise ConfigError(f"{source}: {here}: given {len(v)} times; it takes one value")
            out[key] = _single(f, v, source, here)
    return out


def _map(f: _F, value: object, source: str, path: str) -> dict[Any, Any]:
    key_type = f.label[4:]
    if isinstance(value, Mapping) and not (set(value) <= {"key", "value"} and "key" in value):
        entries = list(value.items())  # the JSON form {key: value}
    else:
        listed = value if isinstance(value, list) else [value]
        entries = []
        for i, e in enumerate(listed):
            if not isinstance(e, Mapping) or "key" not in e or set(e) - {"key", "value"}:
                raise ConfigError(f"{source}: {path}[{i}]: expected an entry {{ key: ... value: ... }}, got {e!r}")
            entries.append((e["key"], e.get("value", _default(f))))
    out: dict[Any, Any] = {}
    for k, v in entries:
        key = _scalar(key_type, k, source, f"{path} key")
        out[key] = _single(f, v, source, f"{path}[{k!r}]")
    return out


def _single(f: _F, value: object, source: str, path: str) -> Any:
    if f.type in MESSAGES:
        return _message(value, f.type, source, path)
    return _scalar(f.type, value, source, path)


def _scalar(kind: str, value: object, source: str, path: str) -> Any:
    if kind.startswith("enum:"):
        names = ENUMS[kind[5:]]
        if isinstance(value, str) and value in names:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            for name, number in names.items():
                if number == value:
                    return name
        raise ConfigError(f"{source}: {path}: expected one of {', '.join(names)}, got {value!r}")
    if kind == "string":
        if isinstance(value, str):
            return value
        raise ConfigError(f"{source}: {path}: expected a string, got {value!r}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{source}: {path}: expected true or false, got {value!r}")
    if kind in ("float", "double"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{source}: {path}: expected a number, got {value!r}")
    low, high = _INT_RANGES[kind]
    number = value
    if isinstance(value, str) and value.lstrip("-").isdigit():  # protobuf's JSON quotes 64-bit integers
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise ConfigError(f"{source}: {path}: expected an integer from {low} to {high} ({kind}), got {value!r}")
    return number


def _default(f: _F) -> Any:
    if f.type in MESSAGES:
        return {}
    if f.type.startswith("enum:"):
        return next(iter(ENUMS[f.type[5:]]))
    return {"string": "", "bool": False, "float": 0.0, "double": 0.0}.get(f.type, 0)


# ---------------------------------------------------------------------------------------------
# Completing it for a served model version


def complete(name: str, config: Message, model: Any, *, backend: str, gpus: tuple[int, ...] = ()) -> Message:
    """The configuration a served version reports, as Triton's auto-complete and normalization
    leave it: `config` (normalized; {} without config.pbtxt) plus the model's name, backend and
    platform, max_batch_size, inputs and outputs when the config declares none, a default
    version policy, pinned-memory defaults and named instance groups. `model` is the loaded
    TorchModel, OnnxModel or Model, which `backend` names ("pytorch", "onnxruntime", "python");
    `gpus` the CUDA devices its instances run on."""
    c = dict(config)
    c["name"] = c.get("name") or name
    if backend == "pytorch":
        c.setdefault("backend", "pytorch")
        if c["backend"] == "pytorch" and not c.get("platform"):
            aoti = getattr(model, "platform", "") == "torch_aoti"  # a PT2 package (torch_aoti.py)
            c["platform"] = "torch_aoti" if aoti else "pytorch_libtorch"
            if not c.get("default_model_filename"):
                c["default_model_filename"] = "model.pt2" if aoti else "model.pt"
    elif backend == "onnxruntime":
        c["backend"] = "onnxruntime"
        c["platform"] = "onnxruntime_onnx"
        if not c.get("default_model_filename"):
            c["default_model_filename"] = "model.onnx"
    elif backend != "ensemble":  # an ensemble has its platform and no backend
        if not c.get("backend") and not c.get("platform"):
            c["backend"] = "python"
        if c.get("backend") == "python" and not c.get("default_model_filename"):
            c["default_model_filename"] = "model.py"
    c["max_batch_size"] = model.max_batch_size
    batch = 1 if model.max_batch_size > 0 else 0
    if not c.get("input") and not c.get("output"):
        c["input"] = [_tensor(t, batch) for t in model.inputs]
        c["output"] = [_tensor(t, batch) for t in model.outputs]
    c.setdefault("version_policy", {"latest": {"num_versions": 1}})
    if getattr(model, "decoupled", False) or c.get("platform") == "ensemble":
        # A generator infer, or declared so; an ensemble's is its steps' (Triton sets it so).
        c["model_transaction_policy"] = {**c.get("model_transaction_policy", {}),
                                         "decoupled": bool(getattr(model, "decoupled", False))}
    if getattr(model, "response_cache", False):  # Model(..., response_cache=True)
        c["response_cache"] = {"enable": True}
    if model.dynamic_batching is not None and "dynamic_batching" not in c and model.max_batch_size > 0:
        db = model.dynamic_batching
        c["dynamic_batching"] = {
            "preferred_batch_size": list(db.preferred_batch_size),
            "max_queue_delay_microseconds": db.max_queue_delay_microseconds,
            "preserve_ordering": db.preserve_ordering,
            "priority_levels": db.priority_levels,
            "default_priority_level": db.default_priority_level,
            "default_queue_policy": vars(db.default_policy()),
            "priority_queue_policy": {level: vars(p) for level, p in db.priority_queue_policy},
        }
    if "dynamic_batching" in c and not c["dynamic_batching"].get("preferred_batch_size") and model.max_batch_size > 0:
        c["dynamic_batching"] = {**c["dynamic_batching"], "preferred_batch_size": [model.max_batch_size]}
    if "sequence_batching" not in c and getattr(model, "_sequence_config", None) is not None:
        c["sequence_batching"] = model._sequence_config  # given in Python, not in a config.pbtxt
    if "sequence_batching" in c:
        c["sequence_batching"] = sequence.complete(c, model.max_batch_size)
    if backend == "ensemble":  # no instances and no optimization of its own
        return c
    optimization = dict(c.get("optimization", {}))
    optimization.setdefault("input_pinned_memory", {"enable": True})
    optimization.setdefault("output_pinned_memory", {"enable": True})
    c["optimization"] = optimization
    c["instance_group"] = _instance_groups(c["name"], c.get("instance_group", []), model.instances, gpus)
    return c


def v2_to_triton(datatype: str) -> str:
    """A V2 datatype's config name: "FP32" -> "TYPE_FP32", "BYTES" -> "TYPE_STRING"."""
    return _V2_TO_TRITON[datatype]


def _tensor(t: Any, batch: int) -> Message:
    """A declared openinfer Tensor as a ModelInput/ModelOutput: dims without the batch
    dimension; any shape (None) as [-1], the nearest a config can say."""
    dims = [-1] if t.shape is None else list(t.shape[batch:])
    return {"name": t.name, "data_type": _V2_TO_TRITON[t.datatype], "dims": dims,
            **({"optional": True} if getattr(t, "optional", False) else {})}


def _instance_groups(name: str, groups: list[Message], instances: int, gpus: tuple[int, ...]) -> list[Message]:
    if not groups:
        groups = [{"name": name, "count": instances if not gpus else max(1, instances // len(gpus))}]
    out = []
    for i, g in enumerate(groups):
        g = dict(g)
        g["name"] = g.get("name") or f"{name}_{i}"
        if g.get("kind", "KIND_AUTO") == "KIND_AUTO":
            g["kind"] = "KIND_GPU" if gpus else "KIND_CPU"
        if g.get("count", 0) < 1:
            g["count"] = 1
        if g["kind"] == "KIND_GPU" and not g.get("gpus"):
            g["gpus"] = list(gpus)
        out.append(g)
    return out


# ---------------------------------------------------------------------------------------------
# Rendering


def to_json(config: Message) -> dict[str, Any]:
    """Triton's JSON of a normalized ModelConfig (GET .../config): every field in declaration
    order, scalars, repeated and map fields also when defaulted, sub-messages and oneof members
    only when set."""
    return _json_message(config, "ModelConfig")


def _json_message(msg: Message, message: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in MESSAGES[message]:
        present = f.name in msg
        if f.label.startswith("oneof:") or (f.type in MESSAGES and not f.label):
            if present:
                out[f.name] = _json_value(f, message, msg[f.name])
        elif f.label == "repeated":
            out[f.name] = [_json_value(f, message, x) for x in msg.get(f.name, [])]
        elif f.label.startswith("map:"):
            out[f.name] = {str(k): _json_value(f, message, v) for k, v in msg.get(f.name, {}).items()}
        else:
            out[f.name] = _json_value(f, message, msg.get(f.name, _default(f)))
    return out


def _json_value(f: _F, message: str, value: Any) -> Any:
    if f.type in MESSAGES:
        return _json_message(value, f.type)
    if f.type in ("int64", "uint64") and (message, f.name) in _JSON_STRING_INT64:
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)  # protobuf prints 1.0 as 1
    return value


def to_protobuf(config: Message) -> bytes:
    """The serialized inference.ModelConfig of a normalized config (proto3: fields in number
    order, defaulted scalars left out, numeric repeated fields packed)."""
    return bytes(_pb_message(config, "ModelConfig"))


_VARINT = {"int32", "int64", "uint32", "uint64", "bool"}


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative numbers travel as 10-byte two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_scalar(kind: str, value: Any) -> tuple[int, bytes]:
    """(wire type, encoded value without tag) of a scalar or enum value."""
    if kind.startswith("enum:"):
        return 0, _varint(ENUMS[kind[5:]][value])
    if kind in _VARINT:
        return 0, _varint(int(value))
    if kind == "float":
        return 5, struct.pack("<f", value)
    if kind == "double":
        return 1, struct.pack("<d", value)
    data = value.encode()
    return 2, _varint(len(data)) + data


def _pb_field(number: int, kind: str, value: Any) -> bytes:
    if kind in MESSAGES:
        data = bytes(_pb_message(value, kind))
        return _varint(number << 3 | 2) + _varint(len(data)) + data
    wire, data = _pb_scalar(kind, value)
    return _varint(number << 3 | wire) + data


def _pb_message(msg: Message, message: str) -> bytearray:
    out = bytearray()
    for f in sorted(MESSAGES[message], key=lambda f: f.number):
        if f.name not in msg:
            continue
        value = msg[f.name]
        if f.label == "repeated":
            if f.type in MESSAGES or f.type == "string":
                for x in value:
                    out += _pb_field(f.number, f.type, x)
            elif value:
                packed = b"".join(_pb_scalar(f.type, x)[1] for x in value)
                out += _varint(f.number << 3 | 2) + _varint(len(packed)) + packed
        elif f.label.startswith("map:"):
            entry_value = _F("value", 2, f.type, "")
            for k, v in value.items():
                entry = _pb_field(1, f.label[4:], k) + _pb_field(2, entry_value.type, v)
                out += _varint(f.number << 3 | 2) + _varint(len(entry)) + entry
        elif f.label.startswith("oneof:") or f.type in MESSAGES or value != _default(f):
            out += _pb_field(f.number, f.type, value)
    return out


# ---------------------------------------------------------------------------------------------
# What openinfer does not do (yet)


def unsupported(config: Message, source: str) -> tuple[list[str], list[str]]:
    """Splits the fields of a normalized config that openinfer does not act on into refusals
    (fields that change what the model answers or how requests are admitted: serving the model
    while ignoring them would answer differently from Triton, so the model is not served) and
    warnings (fields that only tune performance or reporting, accepted and ignored). Returns
    (refusals, warnings), each a list of messages naming `source` and the field."""
    refused: list[str] = []
    warned: list[str] = []

    def refuse(field: str, why: str) -> None:
        refused.append(f"{source}: {field} is not supported by openinfer ({why}); remove it to serve the model")

    def warn(field: str, why: str) -> None:
        warned.append(f"{source}: {field} is ignored ({why})")

    sb = config.get("sequence_batching", {})
    if sb.get("iterative_sequence"):
        refuse("sequence_batching.iterative_sequence", "no iterative sequences")
    if sb.get("oldest", {}).get("preserve_ordering"):
        refuse("sequence_batching.oldest.preserve_ordering", "answers of different sequences leave when ready")
    for i, state in enumerate(sb.get("state", [])):
        for key in ("use_same_buffer_for_input_output", "use_growable_memory"):
            if state.get(key):
                warn(f"sequence_batching.state[{i}].{key}", "it only tunes performance")
    python = config.get("backend", "python") == "python" and not config.get("platform")
    ensemble_of = config.get("platform") == "ensemble"  # decoupled when a step is, whatever it says
    if config.get("model_transaction_policy", {}).get("decoupled") and not python and not ensemble_of:
        refuse("model_transaction_policy { decoupled: true }", "only Python models can be decoupled")
    if config.get("response_cache", {}).get("enable"):
        # Triton's own checks (model_config_utils.cc), in its words.
        name = config.get("name") or os.path.basename(os.path.dirname(source))
        if "sequence_batching" in config:
            refused.append(f"{source}: Response Cache does not currently support model {name} with sequence "
                           "batching scheduler. Please disable the response cache.")
        elif config.get("model_transaction_policy", {}).get("decoupled"):
            refused.append(f"{source}: Response Cache does not currently support model {name} with 'decoupled' "
                           "transaction policy. Please disable the response cache.")
    for i, group in enumerate(config.get("instance_group", [])):
        if "rate_limiter" in group:
            refuse(f"instance_group[{i}].rate_limiter", "no rate limiter")
        for key in ("profile", "secondary_devices", "host_policy", "passive"):
            if group.get(key):
                warn(f"instance_group[{i}].{key}", "instances are placed by kind, count and gpus only")
    for key in ("batch_input", "batch_output"):
        if config.get(key):
            refuse(key, "no ragged batching")
    # Optional inputs reach the models that take the inputs sent by name: Python models, Triton's
    # identity backend and ensembles; TorchScript, PT2 and ONNX models take every input.
    by_name = python or config.get("backend") == "identity" or config.get("platform") == "ensemble"
    for i, tensor in enumerate(config.get("input", [])):
        if tensor.get("optional") and not by_name:
            refuse(f"input[{i}].optional", "only Python, identity and ensemble models take optional inputs")
    for kind in ("input", "output"):
        for i, tensor in enumerate(config.get(kind, [])):
            for key in ("allow_ragged_batch", "is_shape_tensor", "is_non_linear_format_io"):
                if tensor.get(key):
                    refuse(f"{kind}[{i}].{key}", "tensors are dense and plain")
    if config.get("model_repository_agents", {}).get("agents"):
        refuse("model_repository_agents", "no repository agents")
    if config.get("model_operations", {}).get("op_library_filename"):
        refuse("model_operations", "custom operation libraries are not loaded")
    onnx = config.get("backend") == "onnxruntime" or config.get("platform") == "onnxruntime_onnx"
    tuned = {k for k in config.get("optimization", {}) if not (onnx and k in ("graph", "execution_accelerators"))}
    if tuned:
        warn("optimization", "it only tunes performance")
    for key in ("cc_model_filenames", "metric_tags", "model_metrics"):
        if config.get(key):
            warn(key, "not used by openinfer")
    return refused, warned
