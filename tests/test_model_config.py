"""The model configuration extension: GET /v2/models/{m}[/versions/{v}]/config and gRPC
ModelConfig in Triton's JSON and protobuf shapes, configs inferred for models served without a
config.pbtxt, the schema kept in step with proto/model_config.proto and tritonclient's copy, and
config.pbtxt features openinfer does not implement refused by name (or accepted with a warning
when they only tune performance)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor
from openinfer._config import triton_config
from openinfer.config import ConfigError, parse

from conftest import assert_alive, assert_grpc_alive

# Triton's JSON: protobuf's field order (as declared), every scalar/repeated/map field present.
TOP_LEVEL_ORDER = [
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output",
    "batch_input", "batch_output", "optimization", "instance_group", "default_model_filename",
    "cc_model_filenames", "metric_tags", "parameters", "model_warmup",
]  # fmt: skip


def get_config(server: openinfer.Server, path: str) -> tuple[int, Any]:
    r = requests.get(server.url + path, timeout=10)
    return r.status_code, r.json()


# ---- the schema ------------------------------------------------------------------------------

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_UINT64: "uint64", FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "double",
}  # fmt: skip


def describe(file_descriptor: Any) -> dict[str, tuple[tuple[str, int, str, str], ...]]:
    """Every message of a compiled model_config.proto as triton_config.MESSAGES spells it."""

    def short(full_name: str) -> str:
        return full_name.removeprefix("inference.")

    def walk(desc: Any, out: dict[str, Any]) -> None:
        fields = []
        for f in desc.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
                key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
                vt = short(value.message_type.full_name) if value.message_type else _SCALARS[value.type]
                fields.append((f.name, f.number, vt, "map:" + _SCALARS[key.type]))
                continue
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                kind = short(f.message_type.full_name)
            elif f.type == FieldDescriptor.TYPE_ENUM:
                kind = "enum:" + short(f.enum_type.full_name)
            else:
                kind = _SCALARS[f.type]
            label = "repeated" if f.is_repeated else ("oneof:" + f.containing_oneof.name if f.containing_oneof else "")
            fields.append((f.name, f.number, kind, label))
        out[short(desc.full_name)] = tuple(fields)
        for nested in desc.nested_types:
            if not nested.GetOptions().map_entry:
                walk(nested, out)

    out: dict[str, Any] = {}
    for desc in file_descriptor.message_types_by_name.values():
        walk(desc, out)
    return out


def enums_of(file_descriptor: Any) -> dict[str, dict[str, int]]:
    out = {}

    def walk(desc: Any) -> None:
        for e in desc.enum_types:
            out[e.full_name.removeprefix("inference.")] = {v.name: v.number for v in e.values}
        for nested in desc.nested_types:
            walk(nested)

    for e in file_descriptor.enum_types_by_name.values():
        out[e.full_name.removeprefix("inference.")] = {v.name: v.number for v in e.values}
    for desc in file_descriptor.message_types_by_name.values():
        walk(desc)
    return out


def test_schema_is_proto_model_config(grpc_stubs: Any) -> None:
    """triton_config's schema is proto/model_config.proto, field for field and in order."""
    mine = {k: tuple(tuple(f) for f in v) for k, v in triton_config.MESSAGES.items()}
    assert describe(grpc_stubs.mc.DESCRIPTOR) == mine
    assert enums_of(grpc_stubs.mc.DESCRIPTOR) == triton_config.ENUMS


def test_schema_agrees_with_tritonclient() -> None:
    """Every field of tritonclient's bundled model_config.proto exists here with the same
    number, type and label (newer Triton fields may be added here: clients skip them)."""
    theirs = describe(model_config_pb2.DESCRIPTOR)
    mine = {k: {f.name: tuple(f) for f in v} for k, v in triton_config.MESSAGES.items()}
    assert theirs, "tritonclient's model_config_pb2 has no messages"
    for message, fields in theirs.items():
        for field in fields:
            assert mine[message][field[0]] == field, (message, field)
    for enum, values in enums_of(model_config_pb2.DESCRIPTOR).items():
        assert values.items() <= triton_config.ENUMS[enum].items(), enum


# ---- the endpoints -----------------------------------------------------------------------------


def test_http_config_of_a_configured_python_model(server: openinfer.Server) -> None:
    status, config = get_config(server, "/v2/models/simple/config")
    assert status == 200
    assert list(config) == TOP_LEVEL_ORDER
    assert config["name"] == "simple" and config["backend"] == "python" and config["platform"] == ""
    assert config["max_batch_size"] == 8
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["input"][0] == {
        "name": "INPUT0", "data_type": "TYPE_INT32", "format": "FORMAT_NONE", "dims": [16],
        "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False,
    }  # fmt: skip
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert config["output"][1]["dims"] == [16] and config["output"][1]["label_filename"] == ""
    assert config["instance_group"] == [{
        "name": "simple", "kind": "KIND_CPU", "count": 1, "gpus": [], "secondary_devices": [], "profile": [],
        "passive": False, "host_policy": "",
    }]  # fmt: skip
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["default_model_filename"] == "model.py"
    assert config["parameters"] == {} and config["model_warmup"] == [] and config["batch_input"] == []
    assert "dynamic_batching" not in config and "sequence_batching" not in config
    assert get_config(server, "/v2/models/simple/versions/1/config") == (200, config)


def test_both_protocols_report_the_same_config(server: openinfer.Server) -> None:
    h = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    g = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for model in ("simple", "simple_string", "identity_fp32", "matrix", "versioned"):
            from_http = h.get_model_config(model)
            from_grpc = g.get_model_config(model).config  # parsed with tritonclient's model_config_pb2
            assert isinstance(from_grpc, model_config_pb2.ModelConfig)
            assert from_grpc.name == model
            parsed = json_format.ParseDict(from_http, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
            assert parsed == from_grpc, model
            as_dict = g.get_model_config(model, as_json=True)["config"]
            assert as_dict["name"] == model
    finally:
        h.close()
        g.close()


def test_grpc_config_fields(server: openinfer.Server) -> None:
    g = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        c = g.get_model_config("matrix").config
        assert c.backend == "python" and c.max_batch_size == 4
        assert list(c.input[0].dims) == [2, 3]  # without the batch dimension
        assert c.input[0].data_type == model_config_pb2.TYPE_FP32
        assert c.version_policy.latest.num_versions == 1
        assert c.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        v2 = g.get_model_config("versioned", "2").config
        assert v2.name == "versioned" and list(v2.input[0].dims) == [-1]
    finally:
        g.close()


def test_configless_torchscript_reports_what_was_inferred(server: openinfer.Server) -> None:
    pytest.importorskip("torch")
    status, config = get_config(server, "/v2/models/cnn/config")  # the example served from forward()
    assert status == 200
    assert (config["backend"], config["platform"]) == ("pytorch", "pytorch_libtorch")
    assert config["default_model_filename"] == "model.pt"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("image", "TYPE_FP32", [-1, 1, 28, 28])]
    assert [o["name"] for o in config["output"]] == ["logits", "probabilities"]
    status, mlp = get_config(server, "/v2/models/mlp/config")  # with config.pbtxt, dynamic batching
    assert mlp["dynamic_batching"]["preferred_batch_size"] == [8, 16]
    assert mlp["dynamic_batching"]["max_queue_delay_microseconds"] == 500  # a number, as Triton fixes it
    assert mlp["parameters"]["INTRA_OP_THREAD_COUNT"] == {"string_value": "1"}
    assert mlp["instance_group"][0]["name"] == "mlp_0"


def test_config_of_a_repository_model(tmp_path: Path) -> None:
    """What a config.pbtxt says comes back, completed as Triton completes it."""
    model = tmp_path / "adder"
    (model / "3").mkdir(parents=True)
    (model / "3" / "model.py").write_text(
        "def infer(inputs):\n    return {'Y': inputs['X'] + 1}\n"
    )
    (model / "config.pbtxt").write_text(
        """
        backend: "python"
        max_batch_size: 4
        input { name: "X" data_type: TYPE_INT64 dims: [ 2, -1 ] }
        output [ { name: "Y", data_type: TYPE_INT64, dims: [ 2, -1 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU }, { name: "extra" } ]
        dynamic_batching { max_queue_delay_microseconds: 100 }
        version_policy: { specific: { versions: [ 3 ] } }
        parameters { key: "k" value { string_value: "v" } }
        parameters [ { key: "z" value: { string_value: "w" } } ]
        """
    )
    with openinfer.serve(tmp_path, http_port=0, log=False) as s:
        status, config = get_config(s, "/v2/models/adder/config")
        assert status == 200
        assert config["version_policy"] == {"specific": {"versions": [3]}}
        assert config["input"][0]["dims"] == [2, -1] and config["input"][0]["data_type"] == "TYPE_INT64"
        assert [(g["name"], g["kind"], g["count"]) for g in config["instance_group"]] == [
            ("adder_0", "KIND_CPU", 2), ("extra", "KIND_CPU", 1)]
        assert config["dynamic_batching"]["preferred_batch_size"] == [4]  # Triton's default: max_batch_size
        assert config["parameters"] == {"k": {"string_value": "v"}, "z": {"string_value": "w"}}
        g = tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            c = g.get_model_config("adder", "3").config
            assert list(c.version_policy.specific.versions) == [3]
            assert c.parameters["z"].string_value == "w"
            assert c.dynamic_batching.max_queue_delay_microseconds == 100
        finally:
            g.close()


def test_config_of_a_python_model_from_code() -> None:
    m = Model("batched", lambda inputs: {"Y": inputs["X"]}, inputs=[Tensor("X", "BYTES", [-1, 3])],
              outputs=[Tensor("Y", "BYTES", [-1, 3])], max_batch_size=8, dynamic_batching=True, instances=3)
    anyshape = Model("anyshape", lambda inputs: {"Y": inputs["X"]}, inputs=[Tensor("X", "BF16", None)],
                     outputs=[Tensor("Y", "BF16", None)])
    with openinfer.serve(models=[m, anyshape], http_port=0, log=False) as s:
        status, config = get_config(s, "/v2/models/batched/config")
        assert status == 200 and config["backend"] == "python" and config["max_batch_size"] == 8
        assert config["input"][0]["data_type"] == "TYPE_STRING" and config["input"][0]["dims"] == [3]
        assert config["dynamic_batching"]["preferred_batch_size"] == [8]
        assert config["instance_group"][0]["count"] == 3
        status, config = get_config(s, "/v2/models/anyshape/config")
        assert config["input"][0]["data_type"] == "TYPE_BF16" and config["input"][0]["dims"] == [-1]


def test_config_errors(server: openinfer.Server, stub: Any, grpc_stubs: Any, grpc_channel: Any) -> None:
    pb = grpc_stubs.pb
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelConfig(pb.ModelConfigRequest(name="nope"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "Request for unknown model: 'nope' is not found"
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelConfig(pb.ModelConfigRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no model name" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        grpc_channel.unary_unary("/inference.GRPCInferenceService/ModelConfig")(b"\x0a\x09abc", timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ModelConfigRequest" in e.value.details()
    assert requests.get(server.url + "/v2/models/simple/config/x", timeout=10).status_code == 404
    assert requests.post(server.url + "/v2/models/simple/config", timeout=10).status_code == 405
    assert_alive(server.http_port)
    assert_grpc_alive(server.grpc_port)


# ---- config.pbtxt features refused or accepted with a warning ----------------------------------

REFUSED = [
    ("sequence_batching { iterative_sequence: true }", "sequence_batching.iterative_sequence"),
    ("model_transaction_policy { decoupled: true } dynamic_batching { }", "model_transaction_policy { decoupled: true }"),
    ("response_cache { enable: true }\nsequence_batching { }",
     "Response Cache does not currently support model m with sequence batching scheduler"),
    ("instance_group [ { count: 1 rate_limiter { resources [ { name: \"R\" count: 1 } ] } } ]",
     "instance_group[0].rate_limiter"),
    ("max_batch_size: 4 dynamic_batching { default_queue_policy { max_queue_size: -1 } }",
     "dynamic_batching.default_queue_policy.max_queue_size"),
    ("max_batch_size: 4 dynamic_batching { default_queue_policy { default_timeout_microseconds: -1 } }",
     "dynamic_batching.default_queue_policy.default_timeout_microseconds"),
    ("dynamic_batching { priority_levels: 2 }", "dynamic_batching.default_priority_level"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "dynamic_batching.default_priority_level"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value { } } }",
     "dynamic_batching.priority_queue_policy"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 0 value { max_queue_size: 1 } } }", "dynamic_batching.priority_queue_policy"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: -2 default_priority_level: 1 }",
     "dynamic_batching.priority_levels"),
    ("max_batch_size: 4 dynamic_batching { preserve_ordering: true "
     "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 } }",
     "dynamic_batching.default_queue_policy.timeout_action"),
    ("batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"N\" data_type: TYPE_INT32 source_input: \"X\" } ]",
     "batch_input"),
    ("model_operations { op_library_filename: \"libops.so\" }", "model_operations"),
    ("unknown_field: 3", "unknown_field: unknown field"),
    ("max_batch_size: \"eight\"", "max_batch_size"),
]


def write_model(root: Path, name: str, extra: str, *, output: str = "") -> None:
    d = root / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text("def infer(inputs):\n    return {'Y': inputs['X']}\n")
    (d / "config.pbtxt").write_text(
        f'backend: "python"\ninput {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }}\n'
        f'output {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] {output} }}\n{extra}\n'
    )


@pytest.mark.parametrize("extra, field", REFUSED)
def test_unimplemented_features_make_the_model_unavailable(tmp_path: Path, extra: str, field: str) -> None:
    write_model(tmp_path, "m", extra)
    write_model(tmp_path, "fine", "")
    with openinfer.serve(tmp_path, http_port=0, log=False) as s:
        r = requests.get(s.url + "/v2/models/m/ready", timeout=10)
        assert r.status_code == 400 and r.json()["ready"] is False and field in r.json()["error"]
        assert "config.pbtxt" in r.json()["error"]
        for path in ("/v2/models/m", "/v2/models/m/config"):
            r = requests.get(s.url + path, timeout=10)
            assert r.status_code == 503 and field in r.json()["error"], path
        r = requests.post(s.url + "/v2/models/m/infer", timeout=10,
                          json={"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]})
        assert r.status_code == 503 and field in r.json()["error"]
        g = tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            assert g.is_model_ready("m") is False and g.is_model_ready("fine") is True
            with pytest.raises(InferenceServerException) as e:
                g.get_model_config("m")
            assert e.value.status() == "StatusCode.UNAVAILABLE" and field in e.value.message()
        finally:
            g.close()
        assert s.failed["m"] and s.models == {"fine": (1,)}


@pytest.mark.parametrize(
    "extra, output, field",
    [
        ("optimization { cuda { graphs: true } }", "", "optimization"),
        ("instance_group [ { count: 1 kind: KIND_CPU profile: [ \"p\" ] } ]", "", "instance_group[0].profile"),
        ("metric_tags { key: \"team\" value: \"a\" }", "", "metric_tags"),
        ("model_transaction_policy { decoupled: false }\nresponse_cache { enable: false }", "", None),
    ],
)
def test_performance_fields_load_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                extra: str, output: str, field: str | None) -> None:
    write_model(tmp_path, "m", extra, output=output)
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        with openinfer.serve(tmp_path, http_port=0, log=False) as s:
            assert requests.get(s.url + "/v2/models/m/ready", timeout=10).status_code == 200
            status, config = get_config(s, "/v2/models/m/config")
            assert status == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if field is None:
        assert warnings == []
    else:
        assert any(field in w and "ignored" in w for w in warnings), warnings


def test_normalize_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"cfg: input\[1\].dims\[0\]: expected an integer"):
        triton_config.normalize(parse('input { name: "a" } input { name: "b" dims: [ "x" ] }'), "cfg")
    with pytest.raises(ConfigError, match="only one of dynamic_batching and sequence_batching"):
        triton_config.normalize(parse("dynamic_batching { } sequence_batching { }"), "cfg")
    with pytest.raises(ConfigError, match=r"instance_group\[0\].kind: expected one of KIND_AUTO"):
        triton_config.normalize(parse("instance_group { kind: KIND_TPU }"), "cfg")
    with pytest.raises(ConfigError, match="max_batch_size: expected an integer from -2147483648 to 2147483647"):
        triton_config.normalize(parse("max_batch_size: 4294967296"), "cfg")
    with pytest.raises(ConfigError, match="given 2 times"):
        triton_config.normalize(parse("name: 'a' name: 'b'"), "cfg")
    # JSON's forms are read too: 64-bit integers as strings, maps as objects, enums as numbers.
    typed = triton_config.normalize(
        {"input": [{"name": "a", "data_type": 11, "dims": ["-1", 4]}], "parameters": {"k": {"string_value": "v"}}})
    assert typed == {"input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
                     "parameters": {"k": {"string_value": "v"}}}


def test_protobuf_round_trip_through_tritonclient(grpc_stubs: Any) -> None:
    """Every kind of field encodes so that protobuf reads back what the JSON says (through
    tritonclient's copy of the proto, and through proto/ itself for the newer fields)."""
    text = """
        name: "m" max_batch_size: 2 backend: "python"
        input { name: "a" data_type: TYPE_FP16 dims: [ -1, 3 ] reshape { shape: [ 3 ] } }
        output { name: "b" data_type: TYPE_STRING dims: [ 1 ] }
        instance_group { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] secondary_devices { device_id: 7 } }
        dynamic_batching { preferred_batch_size: [ 1, 2 ] max_queue_delay_microseconds: 18446744073709551615
                           priority_queue_policy { key: 3 value { default_timeout_microseconds: 9 } } }
        optimization { priority: PRIORITY_MAX gather_kernel_buffer_threshold: 2 cuda { graph_spec { batch_size: 1 input { key: "a" value { dim: [ 5 ] } } } } }
        parameters { key: "p" value { string_value: "\\u00e9" } }
        model_warmup { name: "w" inputs { key: "a" value { dims: [ 3 ] random_data: true } } }
        model_metrics { metric_control { metric_identifier { family: "f" } histogram_options { buckets: [ 1, 2.5 ] } } }
        runtime: "r"
    """
    typed = triton_config.normalize(parse(text), "cfg")
    as_json = triton_config.to_json(typed)
    decoded = model_config_pb2.ModelConfig()
    decoded.ParseFromString(triton_config.to_protobuf(typed))
    decoded.DiscardUnknownFields()  # the fields newer than tritonclient's copy
    assert decoded == json_format.ParseDict(as_json, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    assert decoded.dynamic_batching.max_queue_delay_microseconds == 2**64 - 1
    assert list(decoded.input[0].dims) == [-1, 3] and decoded.parameters["p"].string_value == "\u00e9"
    assert decoded.model_warmup[0].inputs["a"].random_data is True
    ours = grpc_stubs.mc.ModelConfig()
    ours.ParseFromString(triton_config.to_protobuf(typed))
    assert ours == json_format.ParseDict(as_json, grpc_stubs.mc.ModelConfig())
    assert ours.runtime == "r" and list(ours.model_metrics.metric_control[0].histogram_options.buckets) == [1, 2.5]
    assert as_json["model_metrics"]["metric_control"][0]["histogram_options"]["buckets"] == [1, 2.5]
    # Triton's JSON: 64-bit fields as numbers, except the few its converter leaves as strings.
    assert as_json["dynamic_batching"]["max_queue_delay_microseconds"] == 2**64 - 1
    assert as_json["dynamic_batching"]["priority_queue_policy"]["3"]["default_timeout_microseconds"] == 9
    assert as_json["instance_group"][0]["secondary_devices"][0]["device_id"] == "7"
    assert as_json["optimization"]["cuda"]["graph_spec"][0]["input"]["a"]["dim"] == ["5"]
    assert as_json["model_warmup"][0]["inputs"]["a"]["dims"] == [3]


def test_a_version_registered_without_a_config(server: openinfer.Server) -> None:
    """Registered through the core without a configuration (not what serve() does): the
    endpoints say so rather than inventing one."""
    m = Model("bare", lambda inputs: {"Y": inputs["X"]}, inputs=[Tensor("X", "FP32", [-1])],
              outputs=[Tensor("Y", "FP32", [-1])])
    with openinfer.serve(models=m, http_port=0, log=False) as s:
        s._core.add_model("bare", 2, inputs=[("X", "FP32", (-1,))], outputs=[("Y", "FP32", (-1,))],
                          max_batch_size=0, metadata_json=b"{}", handler=m.handler)
        status, body = get_config(s, "/v2/models/bare/versions/2/config")
        assert (status, body["error"]) == (404, "model 'bare' version 2 has no configuration")
        assert get_config(s, "/v2/models/bare/versions/1/config")[0] == 200
        g = tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            with pytest.raises(InferenceServerException) as e:
                g.get_model_config("bare", "2")
            assert e.value.status() == "StatusCode.NOT_FOUND" and "has no configuration" in e.value.message()
        finally:
            g.close()
