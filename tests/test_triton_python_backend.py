"""Triton Python-backend models (``class TritonPythonModel`` + ``triton_python_backend_utils``)
served unchanged: python_backend's own examples with their own client scripts, the lifecycle
(initialize args, execute, finalize), Triton's errors for a wrong execute, and every datatype
through pb_utils, over tritonclient HTTP and gRPC."""

from __future__ import annotations

import copy
import json
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http

EXAMPLES = Path(__file__).parent / "triton_python_examples"

# Runs an example's client script unchanged, its hard-coded localhost:8000 (HTTP), :8001 (gRPC)
# and :8002 (metrics) pointed at the test's server instead: the ports on a shared machine are
# not ours to take.
_RUN_CLIENT = """
import runpy, sys
http_port, grpc_port, metrics_port, script = sys.argv[1:5]
ports = {"localhost:8000": "127.0.0.1:" + http_port, "localhost:8001": "127.0.0.1:" + grpc_port,
         "localhost:8002": "127.0.0.1:" + metrics_port}
import requests, tritonclient.http, tritonclient.grpc
for module in (tritonclient.http, tritonclient.grpc):
    cls = module.InferenceServerClient
    def patched(self, url, *a, __init=cls.__init__, **k):
        __init(self, ports.get(url, url), *a, **k)
    cls.__init__ = patched
def request(self, method, url, *a, __request=requests.Session.request, **k):
    for old, new in ports.items():
        url = url.replace("//" + old + "/", "//" + new + "/")
    return __request(self, method, url, *a, **k)
requests.Session.request = request
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""


def run_client(srv: openinfer.Server, script: Path) -> str:
    """The example's client script, run unchanged against `srv`; fails with its output unless it exits 0."""
    ports = [str(p or 0) for p in (srv.http_port, srv.grpc_port, srv.metrics_port)]
    done = subprocess.run(
        [sys.executable, "-c", _RUN_CLIENT, *ports, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def add_model(repo: Path, name: str, model_py: str, config: str | None = None) -> None:
    """A model directory as Triton lays it out: <name>/config.pbtxt and <name>/1/model.py."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)


def example(repo: Path, name: str, model: str, config: str | None) -> None:
    add_model(repo, name, (EXAMPLES / model).read_text(), (EXAMPLES / config).read_text() if config else None)


PROLOGUE = "import json, threading\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"

# One output per request built from the inputs by `body` (a function of `requests`).
ECHO_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }}]
"""


def bad_model(body: str, init: str = "pass") -> str:
    return PROLOGUE + textwrap.dedent(
        f"""
        class TritonPythonModel:
            def initialize(self, args):
                {init}

            def execute(self, requests):
                {body}
        """
    )


ALL_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES"]  # fmt: skip
_CONFIG_NAME = {"BYTES": "TYPE_STRING"}

DTYPES_CONFIG = 'name: "dtypes"\nbackend: "python"\n' + "".join(
    f'input [{{ name: "IN_{t}", data_type: {_CONFIG_NAME.get(t, "TYPE_" + t)}, dims: [ 3 ] }}]\n'
    f'output [{{ name: "OUT_{t}", data_type: {_CONFIG_NAME.get(t, "TYPE_" + t)}, dims: [ 3 ] }}]\n'
    for t in ALL_TYPES
)
# Every input back as the output of the same type, made with pb_utils.Tensor from as_numpy(),
# plus the numpy dtype the model saw for each (in a parameter of the response, as a check).
DTYPES_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                outputs = []
                for tensor in request.inputs():
                    array = tensor.as_numpy()
                    assert not array.flags.writeable, tensor.name()
                    if tensor.name() == "IN_BYTES":
                        assert array.dtype == np.object_ and all(type(x) is bytes for x in array.flat)
                    outputs.append(pb_utils.Tensor("OUT_" + tensor.name()[3:], array.copy()))
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses
    """
)

LIFECYCLE_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os
    class TritonPythonModel:
        def initialize(self, args):
            self.args = dict(args)

        def execute(self, requests):
            responses = []
            for request in requests:
                text = json.dumps({"args": self.args, "n": len(requests),
                                   "requested": request.requested_output_names(),
                                   "parameters": json.loads(request.parameters())})
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))]))
            return responses

        def finalize(self):
            with open(os.environ["PYB_FINALIZED"], "a") as f:
                f.write(self.args["model_instance_name"] + "\\n")
    """
)
LIFECYCLE_CONFIG = """
name: "lifecycle"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
output [{ name: "OTHER", data_type: TYPE_FP32, dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
parameters { key: "greeting" value: { string_value: "hello" } }
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_repo")
    example(repo, "add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
    add_model(repo, "dtypes", DTYPES_MODEL, DTYPES_CONFIG)
    add_model(repo, "lifecycle", LIFECYCLE_MODEL, LIFECYCLE_CONFIG)
    for name, body, init in [
        ("too_many", "return [pb_utils.InferenceResponse([]), pb_utils.InferenceResponse([])]", "pass"),
        ("not_a_list", "return pb_utils.InferenceResponse([])", "pass"),
        ("not_a_response", "return [{'OUT': np.zeros(1, np.float32)}]", "pass"),
        ("raises", "raise ValueError('no good')", "pass"),
        ("error_response",
         "return [pb_utils.InferenceResponse(error=pb_utils.TritonError('IN is odd', pb_utils.TritonError.INVALID_ARG))"
         " for r in requests]", "pass"),
        ("init_raises", "return None", "raise pb_utils.TritonModelException('cannot start: weights missing')"),
    ]:  # fmt: skip
        add_model(repo, name, bad_model(body, init), ECHO_CONFIG.format(name=name))
    return repo


@pytest.fixture(scope="module")
def finalized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("finalized") / "finalized.txt"
    mp = pytest.MonkeyPatch()
    mp.setenv("PYB_FINALIZED", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def srv(repo: Path, finalized: Path) -> Iterator[openinfer.Server]:
    server = openinfer.serve(
        repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False,
        model_control_mode="explicit", load_models=["*"],
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def test_add_sub_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    out = run_client(srv, EXAMPLES / "add_sub" / "client.py")
    assert "PASS: add_sub" in out


def test_add_sub_over_grpc(srv: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient

    client = triton_grpc(srv)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    config = client.get_model_config("add_sub", as_json=True)["config"]
    assert config["backend"] == "python" and config["input"][0]["name"] == "INPUT0"


def _one(client_module: object, name: str, datatype: str, array: np.ndarray) -> object:
    tensor = client_module.InferInput(name, list(array.shape), datatype)  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(array)
    return tensor


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_datatype_through_as_numpy_and_tensor(srv: openinfer.Server, protocol: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    client = triton_http(srv) if protocol == "http" else triton_grpc(srv)
    arrays = {}
    for t in ALL_TYPES:
        if t == "BYTES":
            arrays[t] = np.array([b"a", b"", b"\x00\xffz"], dtype=np.object_)
        elif t == "BOOL":
            arrays[t] = np.array([True, False, True])
        elif t == "BF16":
            arrays[t] = np.array([0x3F80, 0xC000, 0x7F80], dtype=np.uint16)  # 1.0, -2.0, inf bits
        else:
            from openinfer.model import numpy_dtype

            arrays[t] = np.array([1, 2, 3], dtype=numpy_dtype(t))
    inputs = []
    for t, a in arrays.items():
        if t == "BF16":  # tritonclient sends BF16 from float32 values; the model sees uint16 bits
            inputs.append(_one(module, f"IN_{t}", t, np.array([1.0, -2.0, np.inf], np.float32)))
        else:
            inputs.append(_one(module, f"IN_{t}", t, a))
    result = client.infer("dtypes", inputs)
    for t, a in arrays.items():
        got = result.as_numpy(f"OUT_{t}")
        if t == "BF16":
            np.testing.assert_array_equal(got, np.array([1.0, -2.0, np.inf], np.float32))
        else:
            assert got.dtype == a.dtype and got.tolist() == a.tolist(), t


def test_initialize_args_and_requests(srv: openinfer.Server, repo: Path) -> None:
    import tritonclient.http as httpclient

    client = triton_http(srv)
    x = np.zeros(2, np.float32)
    result = client.infer(
        "lifecycle", [_one(httpclient, "IN", "FP32", x)],
        outputs=[httpclient.InferRequestedOutput("OUT")], parameters={"temperature": 0.5},
    )  # fmt: skip
    seen = json.loads(result.as_numpy("OUT")[0])
    args = seen["args"]
    assert set(args) == {"model_config", "model_instance_kind", "model_instance_name",
                         "model_instance_device_id", "model_repository", "model_version", "model_name"}  # fmt: skip
    assert (args["model_name"], args["model_version"], args["model_instance_kind"]) == ("lifecycle", "1", "CPU")
    assert args["model_instance_name"] == "lifecycle_0_0" and args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]) == repo / "lifecycle"
    config = json.loads(args["model_config"])
    assert config["name"] == "lifecycle" and config["parameters"]["greeting"] == {"string_value": "hello"}
    assert [o["data_type"] for o in config["output"]] == ["TYPE_STRING", "TYPE_FP32"]
    assert seen["n"] == 1 and seen["requested"] == ["OUT"]
    assert seen["parameters"] == {"temperature": 0.5}


def test_finalize_at_unload(srv: openinfer.Server, finalized: Path) -> None:
    client = triton_http(srv)
    assert client.is_model_ready("lifecycle")
    assert not finalized.exists()
    client.unload_model("lifecycle")
    deadline = __import__("time").monotonic() + 30
    while not finalized.exists() and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.05)
    assert finalized.read_text() == "lifecycle_0_0\n"
    client.load_model("lifecycle")
    assert client.is_model_ready("lifecycle")


FAILURES = {
    "too_many": "Failed to process the request(s) for model 'too_many_0', message: Number of InferenceResponse "
    "objects do not match the number of InferenceRequest objects. InferenceRequest(s) size is:1, and "
    "InferenceResponse(s) size is:2\n",
    "not_a_list": "Failed to process the request(s) for model 'not_a_list_0', message: Expected a list in the "
    "execute return, found type '<class '",
    "not_a_response": "Failed to process the request(s) for model 'not_a_response_0', message: Expected an "
    "'InferenceResponse' object in the execute function return list, found type '<class 'dict'>'.",
    "raises": "Failed to process the request(s) for model 'raises_0', message: ValueError: no good\n\nAt:\n",
}


@pytest.mark.parametrize("name", sorted(FAILURES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_execute_errors_as_triton_words_them(srv: openinfer.Server, name: str, protocol: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    module = httpclient if protocol == "http" else grpcclient
    client = triton_http(srv) if protocol == "http" else triton_grpc(srv)
    with pytest.raises(InferenceServerException) as e:
        client.infer(name, [_one(module, "IN", "FP32", np.ones(2, np.float32))])
    assert e.value.message().startswith(FAILURES[name])
    assert e.value.status() in ("500", "StatusCode.INTERNAL")
    assert client.is_server_live() and client.is_model_ready(name)


def test_error_response_keeps_its_code(srv: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    for module, client, status in [
        (httpclient, triton_http(srv), "400"),
        (grpcclient, triton_grpc(srv), "StatusCode.INVALID_ARGUMENT"),
    ]:
        with pytest.raises(InferenceServerException) as e:
            client.infer("error_response", [_one(module, "IN", "FP32", np.ones(2, np.float32))])
        assert (e.value.message(), e.value.status()) == ("IN is odd", status)


def test_initialize_raising_makes_the_version_unavailable(srv: openinfer.Server) -> None:
    client = triton_http(srv)
    assert not client.is_model_ready("init_raises")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["init_raises"]["state"] == "UNAVAILABLE"
    assert index["init_raises"]["reason"].startswith("TritonModelException: cannot start: weights missing")
    assert client.is_model_ready("add_sub")  # the others load


def test_infer_models_still_load_beside_triton_ones(tmp_path: Path) -> None:
    add_model(
        tmp_path, "plain",
        "import openinfer\nINPUTS=[openinfer.Tensor('x','FP32',[-1])]\nOUTPUTS=[openinfer.Tensor('y','FP32',[-1])]\n"
        "def infer(inputs):\n    return {'y': inputs['x'] * 2}\n",
    )  # fmt: skip
    shutil.copytree(EXAMPLES / "add_sub", tmp_path / "add_sub" / "1")
    shutil.move(tmp_path / "add_sub" / "1" / "config.pbtxt", tmp_path / "add_sub" / "config.pbtxt")
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=None, metrics_port=None, threads=1, log=False)
    try:
        client = openinfer.Client(server.url)
        np.testing.assert_array_equal(client.infer("plain", {"x": np.ones(2, np.float32)})["y"], [2, 2])
        out = client.infer("add_sub", {"INPUT0": np.ones(4, np.float32), "INPUT1": np.ones(4, np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2, 2, 2, 2])
        client.close()
    finally:
        server.stop()


def test_finalize_at_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "finalized.txt"
    monkeypatch.setenv("PYB_FINALIZED", str(marker))
    add_model(tmp_path / "repo", "lifecycle", LIFECYCLE_MODEL, LIFECYCLE_CONFIG)
    server = openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=None, metrics_port=None, threads=1, log=False)
    try:
        assert triton_http(server).is_model_ready("lifecycle")
        assert not marker.exists()
    finally:
        server.stop()
    assert marker.read_text() == "lifecycle_0_0\n"


# A non-decoupled model that answers through its request's sender (and returns None), makes a
# BF16 output from a torch bfloat16 tensor by DLPack, round-trips BYTES through pb_utils'
# serializers and logs with pb_utils.Logger.
SENDER_MODEL = PROLOGUE + textwrap.dedent(
    """
    import torch
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                words = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(
                    np.array([b"a", "b\\u00e9", b""], dtype=np.object_)))
                pb_utils.Logger.log_info("sender model: " + str(len(words)))
                half = pb_utils.Tensor.from_dlpack("HALF", torch.tensor(x.tolist(), dtype=torch.bfloat16) / 2)
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([half, pb_utils.Tensor("WORDS", words)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
)
SENDER_CONFIG = """
name: "sender"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }]
output [{ name: "HALF", data_type: TYPE_BF16, dims: [ 2 ] }]
output [{ name: "WORDS", data_type: TYPE_STRING, dims: [ 3 ] }]
"""


def test_non_decoupled_sender_bf16_by_dlpack_and_bytes_helpers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import tritonclient.grpc as grpcclient

    add_model(tmp_path, "sender", SENDER_MODEL, SENDER_CONFIG)
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=0, metrics_port=None, threads=1, log=False)
    try:
        result = triton_grpc(server).infer("sender", [_one(grpcclient, "IN", "FP32", np.array([3.0, -5.0], np.float32))])
        np.testing.assert_array_equal(result.as_numpy("HALF"), np.array([1.5, -2.5], np.float32))
        assert result.as_numpy("WORDS").tolist() == [b"a", "b\u00e9".encode(), b""]
    finally:
        server.stop()


def test_pb_utils_helpers_as_triton_has_them() -> None:
    from openinfer._backends import triton_utils as pb

    assert pb.triton_string_to_numpy("TYPE_STRING") is np.object_ and pb.triton_string_to_numpy("TYPE_BOOL") is bool
    assert [pb.numpy_to_triton_type(t) for t in (np.bool_, np.uint8, np.float32, np.object_, np.bytes_)] == [1, 2, 11, 13, 13]
    assert pb.triton_to_numpy_type(12) is np.float64 and pb.triton_to_numpy_type(13) is np.object_
    assert pb.serialize_byte_tensor(np.array([], np.object_)) == ()
    assert pb.serialize_byte_tensor(np.array([b"ab", 7], np.object_)) == b"\x02\x00\x00\x00ab\x01\x00\x00\x007"
    config = {"input": [{"name": "A"}], "output": [{"name": "B"}], "model_transaction_policy": {"decoupled": True}}
    assert pb.get_input_config_by_name(config, "A") == {"name": "A"} and pb.get_output_config_by_name(config, "A") is None
    assert pb.using_decoupled_model_transaction_policy(config) and not pb.using_decoupled_model_transaction_policy({})
    with pytest.raises(TypeError, match="Tensor 'x': expected a numpy array, got list"):
        pb.Tensor("x", [1, 2])
    error = pb.TritonError("gone", pb.TritonError.NOT_FOUND)
    assert (error.message(), error.code(), error.status()) == ("gone", 2, 404)
    sender = pb.InferenceResponseSender(True, lambda: False)
    with pytest.raises(pb.TritonModelException, match="^Unable to send response. Unsupported flag provided.$"):
        sender.send(flags=7)
    with pytest.raises(pb.TritonModelException, match="^Inference Response object must be provided when the response "
                                                      "flags is set to zero.$"):  # fmt: skip
        sender.send()
    response = pb.InferenceRequest("m", [], ["OUT"]).exec()  # BLS with no server running its model
    assert response.has_error() and response.error().code() in (pb.TritonError.UNSUPPORTED, pb.TritonError.UNAVAILABLE)


ASYNC_MODEL = PROLOGUE + textwrap.dedent(
    """
    import asyncio
    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                                .as_numpy() + 1)]) for r in requests]
    """
)


def test_async_execute(tmp_path: Path) -> None:
    add_model(tmp_path, "async_model", ASYNC_MODEL, ECHO_CONFIG.format(name="async_model"))
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=None, metrics_port=None, threads=1, log=False)
    try:
        client = openinfer.Client(server.url)
        for _ in range(3):  # the executor's loop serves call after call
            np.testing.assert_array_equal(client.infer("async_model", {"IN": np.ones(2, np.float32)})["OUT"], [2, 2])
        client.close()
    finally:
        server.stop()


def test_pb_utils_tensor_construction_is_checked_in_c_as_in_python() -> None:
    """pb_utils.Tensor's construction and reads are C (_core.TensorBase): the same checks, texts,
    datatypes and fields as the Python class had, for every way a model makes one."""
    from openinfer._backends import triton_utils as pb

    values = np.arange(4, dtype=np.float32)
    tensor = pb.Tensor("OUT", values)
    assert (tensor.name(), tensor.as_numpy() is values, tensor._datatype, tensor.triton_dtype()) == ("OUT", True, "FP32", 11)
    assert pb.Tensor(name="W", data=np.array([b"a"], np.object_))._datatype == "BYTES"
    assert pb.Tensor("B", np.zeros(2, np.uint16), _datatype="BF16").triton_dtype() == 14
    assert pb.Tensor("D", values.astype(">f8"))._datatype == "FP64"  # a dtype first seen here is cached
    with pytest.raises(TypeError, match="^Tensor name must be a str, got int$"):
        pb.Tensor(3, values)
    with pytest.raises(TypeError, match="^Tensor 'x': expected a numpy array, got tuple"):
        pb.Tensor("x", (1, 2))
    with pytest.raises(TypeError, match="^Tensor 'c': numpy dtype complex64 has no Triton datatype$"):
        pb.Tensor("c", np.zeros(2, np.complex64))
    with pytest.raises(TypeError):
        pb.Tensor("x")
    with pytest.raises(AttributeError):
        pb.Tensor("x", values).extra = 1  # no __dict__, as with the Python class's __slots__

    class Named(pb.Tensor):  # a model's own subclass keeps its attributes
        pass

    named = Named("N", values)
    named.note = "kept"
    assert (named.name(), named.note, repr(named)) == ("N", "kept", "pb_utils.Tensor('N', FP32, shape=[4])")


def test_pb_utils_response_construction_is_checked_in_c_as_in_python() -> None:
    """pb_utils.InferenceResponse's construction and reads are C (_core.ResponseBase): the same
    checks, texts and fields as the Python class had."""
    from openinfer._backends import triton_utils as pb

    out = pb.Tensor("OUT", np.zeros(2, np.float32))
    given = [out]
    response = pb.InferenceResponse(given)
    given.append(out)  # the response keeps its own list
    assert (response.output_tensors(), response.has_error(), response.error(), response.parameters()) == ([out], False, None, "{}")
    assert pb.InferenceResponse(output_tensors=iter([out])).output_tensors() == [out]
    assert pb.InferenceResponse().output_tensors() == [] and pb.InferenceResponse(None, None, None)._error is None
    failed = pb.InferenceResponse(error=pb.TritonError("no", pb.TritonError.INVALID_ARG))
    assert failed.has_error() and failed.error().message() == "no" and failed.output_tensors() == []
    assert pb.InferenceResponse([out], parameters={"k": 1, "b": True}).parameters() == '{"k": 1, "b": true}'
    assert pb.InferenceResponse([out], parameters='{"t": "x"}').parameters() == '{"t": "x"}'
    with pytest.raises(TypeError, match="^InferenceResponse output_tensors must hold pb_utils.Tensor, got ndarray$"):
        pb.InferenceResponse([np.zeros(2)])
    with pytest.raises(TypeError, match="^InferenceResponse error must be a pb_utils.TritonError, got str$"):
        pb.InferenceResponse(error="bad")
    with pytest.raises(pb.TritonModelException, match="bool/int/str"):
        pb.InferenceResponse([out], parameters={"f": 1.5})
    with pytest.raises(TypeError):
        pb.InferenceResponse([out], None, None, None)
    kept = copy.deepcopy(pb.InferenceResponse([out], failed.error(), {"k": 1}))  # as a model may keep one
    assert [t.name() for t in kept.output_tensors()] == ["OUT"] and kept.error().message() == "no"
    assert kept.parameters() == '{"k": 1}' and pickle.loads(pickle.dumps(out)).as_numpy().tolist() == [0.0, 0.0]
    assert copy.copy(pb.Tensor("B", np.zeros(1, np.uint16), _datatype="BF16"))._datatype == "BF16"
