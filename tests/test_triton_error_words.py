"""tritonserver's status codes and words for requests it refuses (issue 41, point 10), over HTTP
(requests, as Triton's qa/L0_http sends them) and gRPC (tritonclient): a requested output named
twice, a negative dimension, an element count or byte size past INT64_MAX. HTTP JSON shapes meet
its HTTP frontend's checks (server src/http_server.cc), gRPC shapes and HTTP binary tensors its
core's (core src/model_config_utils.h, src/infer_request.cc)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

INT64_MAX = 2**63 - 1
# qa/L0_http/http_test.py's test_buffer_size_overflow shapes: the element count overflows, then
# only the byte count (x 4 bytes of FP32).
TOO_MANY = [2**4, 2**60 + 2]
TOO_MANY_BYTES = [2**2, 2**60 + 2]


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    model = Model("ident", _echo, inputs=[Tensor("INPUT0", "FP32", [-1, -1])],
                  outputs=[Tensor("OUTPUT0", "FP32", [-1, -1])])
    with openinfer.serve(models=[model], http_port=0, grpc_port=0, threads=1, log=False) as srv:
        yield srv


def _http(server: openinfer.Server, shape: list[int], **extra: object) -> requests.Response:
    body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}], **extra}
    return requests.post(f"{server.url}/v2/models/ident/infer", json=body, timeout=30)


def _http_binary(server: openinfer.Server, shape: list[int]) -> requests.Response:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    return requests.post(f"{server.url}/v2/models/ident/infer", data=header + b"\0\0\x80?",
                         headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)


def _grpc_error(server: openinfer.Server, shape: list[int], **extra: object) -> InferenceServerException:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    tensor.set_shape(shape)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("ident", [tensor], **extra)
    return e.value


def test_duplicate_output_names_the_request(server: openinfer.Server) -> None:
    """The core's words, its request id first ("<id_unknown>" without one); 400 / INVALID_ARGUMENT."""
    twice = [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]
    r = _http(server, [1, 1], outputs=twice, id="r7")
    assert r.status_code == 400
    assert r.json()["error"] == "[request id: r7] output 'OUTPUT0' already exists in request"
    e = _grpc_error(server, [1, 1], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")] * 2, request_id="r7")
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == "[request id: r7] output 'OUTPUT0' already exists in request"


def test_negative_dimension(server: openinfer.Server) -> None:
    """HTTP reads a dimension as an unsigned integer: a negative one is its JSON library's error,
    a 500 (qa/L0_http asserts both), in a JSON-only and in a binary request alike. gRPC's int64
    shape meets the core's check: 400 / INVALID_ARGUMENT."""
    words = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    for r in (_http(server, [2, -5]), _http_binary(server, [2, -5])):
        assert (r.status_code, r.json()["error"]) == (500, words)
    e = _grpc_error(server, [2, -5])
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == "tensor 'INPUT0' contains an invalid dimension in shape [2,-5]"


def test_element_count_overflow(server: openinfer.Server) -> None:
    shown = "[" + ",".join(map(str, TOO_MANY)) + "]"
    r = _http(server, TOO_MANY)
    assert r.status_code == 400
    assert r.json()["error"] == (f"invalid shape for input 'INPUT0': shape {shown} causes total element count "
                                 f"to exceed maximum size of {INT64_MAX}")
    r = _http_binary(server, TOO_MANY)  # the core's check: Triton's HTTP frontend counts JSON data only
    assert r.status_code == 400
    assert r.json()["error"] == f"element count for tensor 'INPUT0' exceeds maximum size of {INT64_MAX}"
    e = _grpc_error(server, TOO_MANY)
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == f"element count for tensor 'INPUT0' exceeds maximum size of {INT64_MAX}"


def test_byte_size_overflow(server: openinfer.Server) -> None:
    count = TOO_MANY_BYTES[0] * TOO_MANY_BYTES[1]
    r = _http(server, TOO_MANY_BYTES)
    assert r.status_code == 400
    assert r.json()["error"] == (f"byte size overflow for input 'INPUT0': element count ({count}) * data type "
                                 f"size (4) exceeds maximum allowed size ({INT64_MAX})")
    r = _http_binary(server, TOO_MANY_BYTES)
    assert r.status_code == 400
    assert r.json()["error"] == f"byte size for tensor 'INPUT0' exceeds maximum size of {INT64_MAX}"
    e = _grpc_error(server, TOO_MANY_BYTES)
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == f"byte size for tensor 'INPUT0' exceeds maximum size of {INT64_MAX}"
    assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_byte_size_mismatch_names_the_model(server: openinfer.Server) -> None:
    """qa/L0_input_validation's "compromised shape": 10 FP32 values sent for shape [1,8], refused
    once the model is known in the core's words (a binary HTTP tensor and gRPC alike)."""
    words = "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'ident'. Expected 32, got 40"
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 40}}]}).encode()
    r = requests.post(f"{server.url}/v2/models/ident/infer", data=header + bytes(40),
                      headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    assert (r.status_code, r.json()["error"]) == (400, words)
    tensor = grpcclient.InferInput("INPUT0", [1, 10], "FP32")
    tensor.set_data_from_numpy(np.arange(10, dtype=np.float32)[None])
    tensor.set_shape([1, 8])
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("ident", [tensor])
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", words)


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_duplicate_key_is_a_duplicate_input(server: openinfer.Server, endpoint: str) -> None:
    """qa/L0_http/generate_endpoint_test.py's test_duplicate_inputs: a JSON key given twice."""
    r = requests.post(f"{server.url}/v2/models/ident/{endpoint}", timeout=30,
                      data=b'{"INPUT0": [1.0], "INPUT0": [2.0]}')
    assert r.status_code == 400
    assert r.json()["error"] == "[request id: <id_unknown>] input 'INPUT0' already exists in request"
