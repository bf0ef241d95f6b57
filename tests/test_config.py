"""The config.pbtxt parser and ModelConfig extraction, on Triton-style configs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from openinfer.config import (
    ConfigError,
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    TensorConfig,
    VersionPolicy,
    load_config,
    parse,
)

# Triton's documented example (model_configuration.md), with instance groups, dynamic
# batching, a version policy, python-backend parameters and trailing commas between fields.
TRITON_FULL = """
# A TensorRT-style config as Triton documents it.
name: "mymodel"
platform: "tensorrt_plan"
max_batch_size: 8
version_policy: { latest: { num_versions: 2 } }
input [
  {
    name: "input0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "input1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "output0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_GPU
    gpus: [ 0 ]
  },
  {
    count: 2
    kind: KIND_GPU
    gpus: [ 1, 2 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
parameters: {
  key: "EXECUTION_ENV_PATH",
  value: {string_value: "$$TRITON_MODEL_DIRECTORY/python3.6.tar.gz"}
}
parameters: {
  key: "shm-default-byte-size"
  value: { string_value: "16777216" }
}
"""

RESHAPE = """
max_batch_size: 8
input [
  {
    name: "in"
    data_type: TYPE_INT64
    dims: [ 1 ]
    reshape: { shape: [ ] }
  }
]
output [
  {
    name: "out"
    data_type: TYPE_STRING
    dims: [ 3, 4 ]
    reshape: { shape: [ 12 ] }
  }
]
"""

UNKNOWN_FIELDS = """
name: "seq"
backend: "python"
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          fp32_false_true: [ 0, 1 ]
        }
      ]
    }
  ]
}
optimization { execution_accelerators {
  gpu_execution_accelerator : [ {
    name : "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }}]
}}
model_warmup [{ name: "w" batch_size: 1
  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } }]
input { name: "x" data_type: TYPE_FP32 dims: 4 }
output < name: 'y' data_type: TYPE_FP32 dims: [ 4 ] >
"""


def test_triton_full_example() -> None:
    config = ModelConfig.from_dict(parse(TRITON_FULL, "config.pbtxt"))
    assert config.name == "mymodel"
    assert config.platform == "tensorrt_plan"
    assert config.backend is None
    assert config.max_batch_size == 8
    assert config.inputs == (
        TensorConfig("input0", "FP32", (16,)),
        TensorConfig("input1", "FP32", (16,)),
    )
    assert config.outputs == (TensorConfig("output0", "FP32", (16,)),)
    assert config.instance_groups == (
        InstanceGroup(1, "KIND_GPU", (0,)),
        InstanceGroup(2, "KIND_GPU", (1, 2)),
    )
    assert config.instances == 1 * 1 + 2 * 2  # count instances on each listed GPU
    assert config.dynamic_batching == DynamicBatching((4, 8), 100)
    assert config.version_policy == VersionPolicy("latest", num_versions=2)
    assert config.parameters == {
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/python3.6.tar.gz",
        "shm-default-byte-size": "16777216",
    }


def test_defaults_of_a_minimal_config() -> None:
    config = ModelConfig.from_dict(parse('output { name: "y" data_type: TYPE_BOOL dims: [ -1 ] }'))
    assert config.name is None and config.max_batch_size == 0
    assert config.inputs == () and config.outputs == (TensorConfig("y", "BOOL", (-1,)),)
    assert config.instance_groups == () and config.instances == 1
    assert config.dynamic_batching is None
    assert config.version_policy == VersionPolicy("latest", num_versions=1)
    assert config.default_model_filename is None and config.parameters == {}


def test_reshape_is_kept() -> None:
    config = ModelConfig.from_dict(parse(RESHAPE))
    assert config.inputs[0] == TensorConfig("in", "INT64", (1,), reshape=())
    assert config.outputs[0] == TensorConfig("out", "BYTES", (3, 4), reshape=(12,))


def test_unknown_fields_are_kept_and_single_fields_normalised() -> None:
    raw = parse(UNKNOWN_FIELDS)
    config = ModelConfig.from_dict(raw)
    # A repeated field written once (`input {..}`, `dims: 4`) still reads as a list.
    assert config.inputs == (TensorConfig("x", "FP32", (4,)),)
    assert config.outputs == (TensorConfig("y", "FP32", (4,)),)
    control = raw["sequence_batching"]["control_input"][0]["control"][0]
    assert control == {"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}
    accelerator = raw["optimization"]["execution_accelerators"]["gpu_execution_accelerator"]
    assert accelerator == [
        {"name": "tensorrt", "parameters": {"key": "precision_mode", "value": "FP16"}}
    ]
    assert raw["model_warmup"][0]["inputs"]["value"]["zero_data"] is True
    assert config.raw is raw


@pytest.mark.parametrize(
    ("text", "policy", "selected"),
    [
        ("version_policy: { all { }}", VersionPolicy("all"), [1, 2, 5]),
        ("version_policy { all: {} }", VersionPolicy("all"), [1, 2, 5]),
        (
            "version_policy: { latest: { num_versions: 2 }}",
            VersionPolicy("latest", num_versions=2),
            [2, 5],
        ),
        ("version_policy: { latest {} }", VersionPolicy("latest", num_versions=1), [5]),
        (
            "version_policy: { specific: { versions: [1, 3] }}",
            VersionPolicy("specific", versions=(1, 3)),
            [1],
        ),
        (
            "version_policy { specific { versions: 2 versions: 5 } }",
            VersionPolicy("specific", versions=(2, 5)),
            [2, 5],
        ),
    ],
)
def test_version_policies(text: str, policy: VersionPolicy, selected: list[int]) -> None:
    config = ModelConfig.from_dict(parse(text))
    assert config.version_policy == policy
    assert policy.select([5, 1, 2]) == selected


def test_scalars() -> None:
    raw = parse(
        r"""
        s1: "tab\there" s2: 'it\'s' s3: "\"q\"" s4: "\101\x42\u00e9\U0001F600" s5: "a" 'b' "c"
        i1: 42 i2: -7 i3: 0x1F i4: 010 i5: 0
        f1: 1.5 f2: -2e3 f3: .25 f4: 1.0f f5: -inf f6: nan f7: 5E-1
        b1: true b2: false b3: True
        e1: KIND_GPU
        """
    )
    assert raw["s1"] == "tab\there" and raw["s2"] == "it's" and raw["s3"] == '"q"'
    assert raw["s4"] == "ABé\U0001f600" and raw["s5"] == "abc"
    assert (raw["i1"], raw["i2"], raw["i3"], raw["i4"], raw["i5"]) == (42, -7, 31, 8, 0)
    assert (raw["f1"], raw["f2"], raw["f3"], raw["f4"], raw["f7"]) == (1.5, -2000.0, 0.25, 1.0, 0.5)
    assert raw["f5"] == -math.inf and math.isnan(raw["f6"])
    assert raw["b1"] is True and raw["b2"] is False and raw["b3"] is True
    assert raw["e1"] == "KIND_GPU"


def test_lists_messages_and_separators() -> None:
    raw = parse(
        """
        empty: []
        one: [7]
        repeated: 1 repeated: 2
        mixed: [1] mixed: 2
        angle < a: 1; b: 2, >
        nested { inner [ { x: 1 }, < x: 2 > ] }
        colon_list: [ { x: 1 } ]
        """
    )
    assert raw["empty"] == [] and raw["one"] == [7]
    assert raw["repeated"] == [1, 2] and raw["mixed"] == [1, 2]
    assert raw["angle"] == {"a": 1, "b": 2}
    assert raw["nested"] == {"inner": [{"x": 1}, {"x": 2}]}
    assert raw["colon_list"] == [{"x": 1}]


def test_comments_everywhere() -> None:
    raw = parse('# head\nname: "m" # trailing\n# between\ndims: [ 1, # in a list\n 2 ]\n# end')
    assert raw == {"name": "m", "dims": [1, 2]}
    assert parse("") == {} and parse("  # only a comment\n") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "simple', "config.pbtxt:1:7: unterminated string"),
        ('name: "a\nb"', "config.pbtxt:1:7: unterminated string"),
        (
            "input [\n  {\n    name: 'x'\n",
            "config.pbtxt:4:1: expected a field name or '}', got end of file",
        ),
        ("a { b: 1 >", "config.pbtxt:1:10: expected a field name or '}', got '>'"),
        (
            "max_batch_size 8",
            "config.pbtxt:1:16: expected ':' or '{' after field name 'max_batch_size'",
        ),
        (
            "dims: [ 1 2 ]",
            "config.pbtxt:1:11: expected ',' or ']' in the list of 'dims', got number 2",
        ),
        ("dims: [ 1, ]", "config.pbtxt:1:12: expected a value for 'dims', got ']'"),
        ("\n\n  count: 16abc", "config.pbtxt:3:10: malformed number '16abc'"),
        ("kind: -KIND_GPU", "config.pbtxt:1:8: expected a number after '-' for 'kind'"),
        ('s: "\\q"', "config.pbtxt:1:5: unknown escape '\\\\q'"),
        ("}", "config.pbtxt:1:1: expected a field name, got '}'"),
        ("name: @", "config.pbtxt:1:7: unexpected character '@'"),
        ("09: 1", "config.pbtxt:1:1: expected a field name, got number 09"),
        ("x: 09", "config.pbtxt:1:4: malformed octal number '09'"),
        ("name:", "config.pbtxt:1:6: expected a value for 'name', got end of file"),
    ],
)
def test_syntax_errors_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(text, "config.pbtxt")
    assert str(error.value).startswith(message)
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'input { name: "x" data_type: TYPE_FLOAT dims: [1] }',
            "input 'x': data_type must be one of TYPE_BOOL",
        ),
        ('input { name: "x" dims: [1] }', "input 'x': data_type must be one of"),
        # Found by tests/fuzz/fuzz_config.py: a repeated data_type (a list) raised TypeError.
        (
            'input { name: "x" data_type: TYPE_FP32 data_type: TYPE_INT8 dims: [1] }',
            "input 'x': data_type must be one of",
        ),
        ('input { name: "x" data_type: [TYPE_FP32] dims: [1] }', "input 'x': data_type must be one of"),
        ('output { name: "y" data_type: TYPE_FP32 }', "output 'y': dims missing"),
        (
            'output { name: "y" data_type: TYPE_FP32 dims: [ -2 ] }',
            "output 'y': dims must be >= -1",
        ),
        (
            'output { name: "y" data_type: TYPE_FP32 dims: [ "a" ] }',
            "output 'y': dims must hold integers",
        ),
        ("input { data_type: TYPE_FP32 dims: [1] }", "every input needs a name"),
        ("max_batch_size: -1", "max_batch_size must be >= 0"),
        ('max_batch_size: "8"', "max_batch_size must be a single integer"),
        ("max_batch_size: true", "max_batch_size must be a single integer"),
        ('name: "a" name: "b"', "name must be a single string"),
        ("instance_group { count: 0 }", "instance_group: count must be >= 1"),
        ("instance_group { kind: KIND_TPU }", "instance_group: kind must be KIND_AUTO"),
        ("version_policy { }", "version_policy: expected exactly one of"),
        ("version_policy { all {} latest {} }", "version_policy: expected exactly one of"),
        ("version_policy { latest { num_versions: 0 } }", "num_versions must be >= 1"),
        ("version_policy { specific { } }", "versions must list at least one version"),
        ("dynamic_batching: 1", "dynamic_batching must be a single message"),
        ('parameters { value { string_value: "v" } }', "parameters: every entry needs a key"),
        ("input: 3", "input must hold messages"),
    ],
)
def test_config_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: ") as error:
        ModelConfig.from_dict(parse(text), "m/config.pbtxt")
    assert message in str(error.value)


def test_load_config_reads_files(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(TRITON_FULL)
    assert load_config(path).name == "mymodel"
    path.write_text("name: 'x'\nmax_batch_size: [")
    with pytest.raises(ConfigError, match=rf"^{path}:2:18: expected a value for 'max_batch_size'"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.pbtxt")


# ---- JSON model configurations (a repository load's "config") ------------------------------


def test_json_config_reads_as_the_same_config_as_pbtxt() -> None:
    from openinfer._config.triton_config import normalize
    from openinfer.config import parse, parse_json_config

    pbtxt = """
        name: "m" platform: "pytorch_libtorch" max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, -1 ] } ]
        output [ { name: "y" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] } } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100
                           priority_levels: 2 default_priority_level: 1
                           priority_queue_policy { key: 2 value { max_queue_size: 3 timeout_action: DELAY } } }
        version_policy { specific { versions: [ 1, 3 ] } }
        parameters { key: "k" value: { string_value: "v" } }
        metric_tags { key: "teamName" value: "x" }
    """
    # As protobuf's JSON mapping writes it: lowerCamelCase allowed, int64 as strings, maps as objects.
    text = """{
        "name": "m", "platform": "pytorch_libtorch", "maxBatchSize": 8,
        "input": [{"name": "x", "dataType": "TYPE_FP32", "dims": ["3", "-1"]}],
        "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}],
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": "100",
                             "priorityLevels": 2, "defaultPriorityLevel": 1,
                             "priorityQueuePolicy": {"2": {"maxQueueSize": 3, "timeoutAction": "DELAY"}}},
        "version_policy": {"specific": {"versions": ["1", 3]}},
        "parameters": {"k": {"string_value": "v"}},
        "metricTags": {"teamName": "x"}
    }"""
    from_json = parse_json_config(text)
    from_pbtxt = ModelConfig.from_dict(parse(pbtxt))
    assert {**vars(from_json), "raw": None} == {**vars(from_pbtxt), "raw": None}
    # Map keys are names, not fields: "teamName" stays as it is; a uint64 key is a number.
    assert normalize(from_json.raw) == normalize(from_pbtxt.raw)
    assert from_json.dynamic_batching.priority_queue_policy[0][0] == 2
    assert from_json.parameters == {"k": "v"} and from_json.inputs[0].dims == (3, -1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "config override: not valid JSON"),
        ("[1]", "config override: expected a JSON object, got list"),
        ('{"max_batch_size": "eight"}', "max_batch_size must be a single integer"),
        ('{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["three"]}]}', "input 'x': dims must hold integers, got 'three'"),
        ('{"input": [{"name": "x", "data_type": "TYPE_FLOAT", "dims": [1]}]}', "data_type must be one of"),
        ('{"maxBatchSize": 1, "max_batch_size": 2}', "field 'max_batch_size' is given twice"),
        ('{"name": null}', "null is not a value"),
        ('{"max_batch_size": 8, "dynamic_batching": {"priority_levels": 2, "priority_queue_policy": {"two": {}}}}',
         "dynamic_batching.priority_queue_policy: key must be a single integer, got 'two'"),
    ],
)
def test_json_config_errors_name_the_field(text: str, message: str) -> None:
    from openinfer.config import parse_json_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_json_config(text)
