"""HTTP and gRPC judge a request the same way: duplicate input names and duplicate requested
outputs are refused on both, a shape whose byte count overflows is a 400 / INVALID_ARGUMENT
(not a 500 from the backend), nested JSON data must match the shape at every level (flat data
stays accepted), and NaN / Infinity are accepted only as floating-point tensor elements."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from conftest import assert_alive, assert_grpc_alive

import openinfer
from openinfer import Model, Tensor


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _pair(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"], "OUTPUT1": inputs["INPUT1"]}


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    models = [
        Model("any_fp32", _echo, inputs=[Tensor("INPUT0", "FP32", None)], outputs=[Tensor("OUTPUT0", "FP32", None)]),
        Model("any_int32", _echo, inputs=[Tensor("INPUT0", "INT32", None)], outputs=[Tensor("OUTPUT0", "INT32", None)]),
        Model("pair", _pair, inputs=[Tensor("INPUT0", "INT32", [-1]), Tensor("INPUT1", "INT32", [-1])],
              outputs=[Tensor("OUTPUT0", "INT32", [-1]), Tensor("OUTPUT1", "INT32", [-1])]),
    ]
    srv = openinfer.serve(models=models, http_port=0, threads=1, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def post(server: openinfer.Server, model: str, body: bytes | dict, headers: dict | None = None) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{server.url}/v2/models/{model}/infer", data=data, headers=headers or {}, timeout=30)


def tinput(name: str, values: list[int]) -> tgrpc.InferInput:
    t = tgrpc.InferInput(name, [len(values)], "INT32")
    t.set_data_from_numpy(np.array(values, dtype=np.int32))
    return t


# ---- duplicates ------------------------------------------------------------------------------


def test_grpc_refuses_duplicate_input_names(server: openinfer.Server) -> None:
    with tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        with pytest.raises(tgrpc.InferenceServerException) as e:
            client.infer("pair", [tinput("INPUT0", [1]), tinput("INPUT1", [2]), tinput("INPUT0", [3])])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "input 'INPUT0' already exists in request" in e.value.message()
    r = post(server, "pair", {"inputs": [{"name": n, "shape": [1], "datatype": "INT32", "data": [1]}
                                         for n in ("INPUT0", "INPUT1", "INPUT0")]})
    assert r.status_code == 400 and "input 'INPUT0' already exists in request" in r.json()["error"]
    assert_grpc_alive(server.grpc_port)


def test_grpc_refuses_duplicate_requested_outputs(server: openinfer.Server) -> None:
    with tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        outputs = [tgrpc.InferRequestedOutput("OUTPUT1"), tgrpc.InferRequestedOutput("OUTPUT1")]
        with pytest.raises(tgrpc.InferenceServerException) as e:
            client.infer("pair", [tinput("INPUT0", [1]), tinput("INPUT1", [2])], outputs=outputs)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "output 'OUTPUT1' already exists in request" in e.value.message()
        ok = client.infer("pair", [tinput("INPUT0", [1]), tinput("INPUT1", [2])], outputs=outputs[:1])
        assert ok.as_numpy("OUTPUT1").tolist() == [2]
    r = post(server, "pair", {"inputs": [{"name": n, "shape": [1], "datatype": "INT32", "data": [1]}
                                         for n in ("INPUT0", "INPUT1")],
                              "outputs": [{"name": "OUTPUT1"}, {"name": "OUTPUT1"}]})
    assert r.status_code == 400 and "output 'OUTPUT1' already exists in request" in r.json()["error"]


# ---- shapes whose byte count overflows ---------------------------------------------------------

HUGE = [[0, 2**62], [2**62, 0], [0, 2**61, 4], [0, 2**40, 2**40]]


@pytest.mark.parametrize("shape", HUGE, ids=str)
def test_http_huge_shape_with_a_zero_dimension_is_400(server: openinfer.Server, shape: list[int]) -> None:
    shown = "[" + ",".join(map(str, shape)) + "]"
    r = post(server, "any_fp32", {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": []}]})
    assert r.status_code == 400, r.text
    assert "input 'INPUT0'" in r.json()["error"] and shown in r.json()["error"]
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    r = post(server, "any_fp32", header, {"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400, r.text
    assert "input 'INPUT0'" in r.json()["error"] and shown in r.json()["error"]
    assert_alive(server.http_port)


@pytest.mark.parametrize("shape", HUGE, ids=str)
def test_grpc_huge_shape_with_a_zero_dimension_is_invalid_argument(server: openinfer.Server, grpc_stubs: Any,
                                                                    shape: list[int]) -> None:
    pb = grpc_stubs.pb
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        raw = pb.ModelInferRequest(model_name="any_fp32")
        raw.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
        raw.raw_input_contents.append(b"")
        typed = pb.ModelInferRequest(model_name="any_fp32")
        typed.inputs.add(name="INPUT0", datatype="FP32", shape=shape).contents.SetInParent()  # present, empty
        for req in (raw, typed):
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert "'INPUT0'" in e.value.details() and "[" + ",".join(map(str, shape)) + "]" in e.value.details()
    assert_grpc_alive(server.grpc_port)


def test_large_but_possible_empty_shapes_still_work(server: openinfer.Server) -> None:
    r = post(server, "any_fp32", {"inputs": [{"name": "INPUT0", "shape": [0, 1 << 20], "datatype": "FP32", "data": []}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"] == [0, 1 << 20]


# ---- nested data -------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "data", "message"), [
    ([1, 16], [[1, 2], [3], list(range(4, 17))], "an array at depth 2 has 2 elements, expected 16"),
    ([2, 2], [[1, 2, 3], [4]], "an array at depth 2 has 3 elements, expected 2"),
    ([2, 2], [[1, 2], [3, 4], [5, 6]], "an array at depth 1 has 3 elements, expected 2"),
    ([4], [[1, 2], [3, 4]], "an array at depth 2, deeper than the shape"),
    ([2, 2], [[1, 2], 3, 4], "a value at depth 1, expected arrays down to depth 2"),
    ([2, 2], [1, 2, [3, 4]], "an array at depth 2 among values"),
    ([2, 2, 1], [[1, 2], [3, 4]], "a value at depth 2, expected arrays down to depth 3"),
    ([4], [[1], [2, [3]], [], 4], "an array at depth 2, deeper than the shape"),
])
def test_ragged_nested_data_is_refused(server: openinfer.Server, shape: list[int], data: list, message: str) -> None:
    r = post(server, "any_int32", {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "INT32", "data": data}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "input 'INPUT0'" in error and "[" + ",".join(map(str, shape)) + "]" in error and message in error, error


@pytest.mark.parametrize(("shape", "data"), [
    ([2, 2], [[1, 2], [3, 4]]),
    ([2, 2], [1, 2, 3, 4]),
    ([1, 16], [list(range(16))]),
    ([1, 16], list(range(16))),
    ([2, 1, 2], [[[1, 2]], [[3, 4]]]),
    ([2, 0], [[], []]),
    ([2, 0], []),
    ([0, 3], []),
    ([1], 7),
    ([], [7]),
])
def test_flat_and_well_nested_data_are_accepted(server: openinfer.Server, shape: list[int], data: Any) -> None:
    r = post(server, "any_int32", {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "INT32", "data": data}]})
    assert r.status_code == 200, r.text
    flat = np.array(data).reshape(-1).tolist() if data != [[], []] else []
    assert r.json()["outputs"][0]["data"] == flat and r.json()["outputs"][0]["shape"] == shape


# ---- NaN and Infinity ----------------------------------------------------------------------------


def test_non_finite_floats_are_accepted_and_emitted_as_tensor_elements(server: openinfer.Server) -> None:
    # What Python's json module, tritonclient and Triton (rapidjson's NaN/Inf flags) write and read.
    body = b'{"inputs":[{"name":"INPUT0","shape":[3],"datatype":"FP32","data":[NaN,Infinity,-Infinity]}]}'
    r = post(server, "any_fp32", body)
    assert r.status_code == 200, r.text
    assert b'"data":[NaN,Infinity,-Infinity]' in r.content
    got = r.json()["outputs"][0]["data"]
    assert np.isnan(got[0]) and got[1:] == [float("inf"), float("-inf")]


@pytest.mark.parametrize(("body", "message"), [
    (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[1]}],"parameters":{"t":NaN}}',
     "NaN is not a JSON number"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[1],"parameters":{"t":-Infinity}}]}',
     "-Infinity is not a JSON number"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[1]}],"x":[Infinity]}',
     "Infinity is not a JSON number"),
])
def test_non_finite_tokens_elsewhere_are_refused(server: openinfer.Server, body: bytes, message: str) -> None:
    r = post(server, "any_fp32", body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"], r.json()["error"]
    assert "only as elements of FP16, FP32, FP64 and BF16 tensor data" in r.json()["error"]


def test_non_finite_tokens_for_integer_tensors_are_refused(server: openinfer.Server) -> None:
    body = b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[NaN]}]}'
    r = post(server, "any_int32", body)
    assert r.status_code == 400 and "expected an integer for INT32, got NaN" in r.json()["error"]
