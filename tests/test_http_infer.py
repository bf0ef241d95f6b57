"""Inference over HTTP/1.1 with the V2 JSON codec: the example models, every datatype, and
every way a request can be wrong."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import requests
from conftest import V2_TYPES, assert_alive


def infer(url: str, model: str, body: bytes | dict, version: str | None = None, headers: dict | None = None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = requests.post(url + path, data=data, headers=headers or {}, timeout=30)
    return r.status_code, r.json()


def simple_inputs(a: list[int], b: list[int], shape=(1, 16)) -> list[dict]:
    return [
        {"name": "INPUT0", "shape": list(shape), "datatype": "INT32", "data": a},
        {"name": "INPUT1", "shape": list(shape), "datatype": "INT32", "data": b},
    ]


def test_simple(url: str) -> None:
    a, b = list(range(16)), [1] * 16
    status, body = infer(url, "simple", {"id": "req-1", "inputs": simple_inputs(a, b)})
    assert status == 200, body
    assert body["model_name"] == "simple" and body["model_version"] == "1" and body["id"] == "req-1"
    out = {o["name"]: o for o in body["outputs"]}
    assert out["OUTPUT0"] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": [x + 1 for x in a]}
    assert out["OUTPUT1"]["data"] == [x - 1 for x in a]


def test_simple_batch_nested_data(url: str) -> None:
    a = [[i + 16 * r for i in range(16)] for r in range(3)]
    status, body = infer(url, "simple", {"inputs": simple_inputs(a, a, shape=(3, 16))})
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [3, 16]
    assert body["outputs"][0]["data"] == [2 * x for row in a for x in row]
    assert body["outputs"][1]["data"] == [0] * 48


def test_simple_string(url: str) -> None:
    a = [str(i) for i in range(16)]
    b = [str(2 * i) for i in range(16)]
    inputs = [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "BYTES", "data": a},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "BYTES", "data": b},
    ]
    status, body = infer(url, "simple_string", {"inputs": inputs})
    assert status == 200, body
    out = {o["name"]: o for o in body["outputs"]}
    assert out["OUTPUT0"]["datatype"] == "BYTES"
    assert out["OUTPUT0"]["data"] == [str(3 * i) for i in range(16)]
    assert out["OUTPUT1"]["data"] == [str(-i) for i in range(16)]


def test_identity_fp32_and_id_escapes(url: str) -> None:
    values = [0.1, -2.5, 1e-30, 3.4028234663852886e38, 1.0, 0.0]
    status, body = infer(url, "identity_fp32", {"id": 'a"b\\c\u00e9\n', "inputs": [
        {"name": "INPUT0", "shape": [6], "datatype": "FP32", "data": values}]})
    assert status == 200, body
    assert body["id"] == 'a"b\\c\u00e9\n'
    got = body["outputs"][0]["data"]
    assert got == [float(np.float32(v)) for v in values] or got == pytest.approx(values, rel=1e-7)
    # Shortest round trip: 0.1 as float32 prints as 0.1, not 0.10000000149011612.
    assert json.dumps(got[0]) == "0.1"


SAMPLES: dict[str, list] = {
    "BOOL": [True, False, True],
    "UINT8": [0, 1, 255],
    "UINT16": [0, 65535, 7],
    "UINT32": [0, 4294967295, 12],
    "UINT64": [0, 18446744073709551615, 3],
    "INT8": [-128, 127, 0],
    "INT16": [-32768, 32767, -1],
    "INT32": [-2147483648, 2147483647, 5],
    "INT64": [-9223372036854775808, 9223372036854775807, -5],
    "FP16": [0.5, -65504.0, 0.0009765625],
    "FP32": [0.1, -1.5, 3.0e38],
    "FP64": [0.1, 1.0 / 3.0, -1e300],
    "BF16": [1.0, -2.0, 0.15625],
    "BYTES": ["hello", "", "\u00fcnicode \u2603"],
}


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_every_datatype_round_trip(url: str, dtype: str) -> None:
    data = SAMPLES[dtype]
    status, body = infer(url, f"echo_{dtype.lower()}", {"inputs": [
        {"name": "INPUT0", "shape": [len(data)], "datatype": dtype, "data": data}]})
    assert status == 200, body
    out = body["outputs"][0]
    assert out["datatype"] == dtype and out["shape"] == [len(data)]
    if dtype in ("FP16", "FP32", "BF16"):
        # Written as the shortest decimal that reads back to the same value of its own type.
        np_type = {"FP16": np.float16, "FP32": np.float32, "BF16": np.float32}[dtype]
        got, want = np.array(out["data"], dtype=np_type), np.array(data, dtype=np_type)
        assert np.array_equal(got, want) if dtype != "BF16" else np.allclose(got, want, rtol=2**-8)
        assert all(len(repr(x)) <= len(repr(y)) for x, y in zip(out["data"], data))
    else:
        assert out["data"] == data


def test_fp_special_values(url: str) -> None:
    body = b'{"inputs":[{"name":"INPUT0","shape":[3],"datatype":"FP64","data":[NaN,Infinity,-Infinity]}]}'
    r = requests.post(url + "/v2/models/echo_fp64/infer", data=body, timeout=10)
    assert r.status_code == 200
    data = json.loads(r.text)["outputs"][0]["data"]
    assert math.isnan(data[0]) and data[1] == math.inf and data[2] == -math.inf


def test_zero_elements(url: str) -> None:
    status, body = infer(url, "echo_int32", {"inputs": [{"name": "INPUT0", "shape": [0], "datatype": "INT32", "data": []}]})
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [0] and body["outputs"][0]["data"] == []


def test_versions_route(url: str) -> None:
    one = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32", "data": [0, 0]}]}
    for v in ("1", "2", "3"):
        status, body = infer(url, "versioned", one, version=v)
        assert status == 200 and body["model_version"] == v and body["outputs"][0]["data"] == [int(v)] * 2
    status, body = infer(url, "versioned", one)
    assert body["model_version"] == "3"
    status, body = infer(url, "versioned", one, version="9")
    assert (status, body["error"]) == (404, "Request for unknown model: 'versioned' version 9 is not found")


def test_requested_outputs_subset_and_order(url: str) -> None:
    a = list(range(16))
    status, body = infer(url, "simple", {"inputs": simple_inputs(a, a), "outputs": [{"name": "OUTPUT1"}]})
    assert status == 200
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT1"]
    status, body = infer(url, "simple", {"inputs": simple_inputs(a, a), "outputs": [{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]})
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT1", "OUTPUT0"]


def test_parameters_reach_the_model(url: str) -> None:
    params = {"temperature": 0.5, "tag": "x", "nested": {"k": [1, 2]}}
    status, body = infer(url, "params", {"parameters": params, "inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]})
    assert status == 200, body
    assert json.loads(body["outputs"][0]["data"][0]) == params


def test_data_before_datatype_and_shape(url: str) -> None:
    body = b'{"inputs":[{"data":[1,2,3],"name":"INPUT0","datatype":"INT64","shape":[3]}]}'
    status, out = infer(url, "echo_int64", body)
    assert status == 200 and out["outputs"][0]["data"] == [1, 2, 3]


def test_multidim_shape_checked(url: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    status, body = infer(url, "matrix", {"inputs": [{"name": "INPUT0", "shape": [2, 2, 3], "datatype": "FP32", "data": x.tolist()}]})
    assert status == 200 and body["outputs"][0]["data"] == x.ravel().tolist()
    status, body = infer(url, "matrix", {"inputs": [{"name": "INPUT0", "shape": [5, 2, 3], "datatype": "FP32", "data": [0.0] * 30}]})
    assert status == 400 and "batch size (first dimension) must be 1 to 4, got 5" in body["error"]


BAD_REQUESTS = [
    # (body, fragment of the error message)
    (b'{"inputs": [', "end of input"),
    (b"not json", "expected a JSON object, got malformed JSON"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[1]}]} trailing', "JSON"),
    (b'{"inputs": []}', "expected at least one input"),
    (b"{}", "'inputs' is required"),
    (b'{"inputs": {}}', "inputs"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FLOAT","data":[1]}]}', "expected one of BOOL, UINT8"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32"}]}', "data"),
    (b'{"inputs":[{"name":"INPUT0","shape":"x","datatype":"INT32","data":[1]}]}', "shape"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[1,2,3]}]}', "expected 16 elements"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":["a"]}]}', "INT32"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1000000000000,16],"datatype":"INT32","data":[1]}]}', "elements"),
    (b'{"inputs":[{"name":"INPUT0","shape":[9223372036854775807,16],"datatype":"INT32","data":[1]}]}', "shape"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[1.5,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}', "INT32"),
    (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[4294967296,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}', "out of range"),
]


@pytest.mark.parametrize("body, fragment", BAD_REQUESTS)
def test_malformed_requests(url: str, body: bytes, fragment: str) -> None:
    status, out = infer(url, "simple", body)
    assert status == 400, out
    assert fragment in out["error"], out["error"]


def test_request_vs_model_declaration(url: str) -> None:
    a = list(range(16))
    cases = [
        ({"inputs": simple_inputs(a, a)[:1]},  # Triton's words (infer_request.cc), exactly
         "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) "
         "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
        ({"inputs": simple_inputs(a, a) + [{"name": "EXTRA", "shape": [1], "datatype": "INT32", "data": [1]}]},
         "unexpected input 'EXTRA' for model 'simple'; its inputs are: INPUT0, INPUT1"),
        ({"inputs": simple_inputs(a, a) + simple_inputs(a, a)[:1]}, "input 'INPUT0' already exists in request"),
        ({"inputs": [dict(simple_inputs(a, a)[0], datatype="INT64"), simple_inputs(a, a)[1]]},
         "input 'INPUT0': expected datatype INT32, got INT64"),
        ({"inputs": simple_inputs(a, a, shape=(16,))}, "input 'INPUT0': expected shape [-1,16], got [16]"),
        ({"inputs": simple_inputs(a + a, a + a, shape=(1, 32))}, "expected shape [-1,16], got [1,32]"),
        ({"inputs": simple_inputs(a, a), "outputs": [{"name": "NOPE"}]},
         "unknown output 'NOPE' for model 'simple'; its outputs are: OUTPUT0, OUTPUT1"),
        ({"inputs": simple_inputs(a, a), "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]},
         "output 'OUTPUT0' already exists in request"),
    ]
    for body, message in cases:
        status, out = infer(url, "simple", body)
        assert status == 400, (body, out)
        assert message in out["error"], out["error"]


def test_model_errors(url: str) -> None:
    one = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
    status, body = infer(url, "raises", one)
    assert status == 500
    assert body["error"] == "model 'raises' raised ValueError: the model refuses negative numbers"
    status, body = infer(url, "client_error", one)
    assert (status, body["error"]) == (422, "INPUT0 must be sorted")
    status, body = infer(url, "wrong_dtype", one)
    assert status == 500 and "expected INT32, got float64 values" in body["error"]
    status, body = infer(url, "missing_output", one)
    assert status == 500 and "OUTPUT0" in body["error"]
    status, body = infer(url, "simple", {"inputs": simple_inputs(list(range(16)), [0] * 16)})
    assert status == 200  # the server and the model are fine afterwards


def test_unknown_model(url: str) -> None:
    status, body = infer(url, "nope", {"inputs": []})
    assert (status, body["error"]) == (404, "Request for unknown model: 'nope' is not found")


def test_unsupported_content_encoding(url: str) -> None:
    status, body = infer(url, "simple", b"xx", headers={"Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding" in body["error"]


def test_inference_header_length_past_body(url: str) -> None:
    status, body = infer(url, "simple", b"{}", headers={"Inference-Header-Content-Length": "99"})
    assert status == 400 and "exceeds the body length" in body["error"]


def test_server_alive_after_bad_requests(url: str) -> None:
    for body, _ in BAD_REQUESTS:
        infer(url, "simple", body)
    assert_alive(int(url.rsplit(":", 1)[1]))
    a = list(range(16))
    assert infer(url, "simple", {"inputs": simple_inputs(a, a)})[0] == 200


def test_large_json_tensor_keeps_its_size(url: str) -> None:
    # A JSON tensor of more than 1 MiB lands in a pooled large buffer; its size must still be
    # the tensor's (a regression: it once took the buffer's block size).
    x = (np.arange(300_000, dtype=np.float32) / 7).tolist()
    status, body = infer(url, "identity_fp32", {"inputs": [
        {"name": "INPUT0", "shape": [300_000], "datatype": "FP32", "data": x}]})
    assert status == 200, body
    out = body["outputs"][0]
    assert out["shape"] == [300_000] and len(out["data"]) == 300_000
    assert np.array_equal(np.array(out["data"], np.float32), np.array(x, np.float32))
