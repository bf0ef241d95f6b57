"""The binary tensor data extension and content encodings on the server, on the wire: binary
inputs and outputs mixed with JSON, the raw-body form, gzip/deflate both ways, and every bad
form of it."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Iterator

import numpy as np
import pytest

import openinfer
from conftest import Http, assert_alive
from openinfer import Model, Tensor


def binary_request(inputs: list[tuple[str, str, list[int], bytes]], outputs: list[dict] | None = None,
                   **params) -> tuple[bytes, int]:
    head = {"inputs": [
        {"name": n, "datatype": dt, "shape": shape, "parameters": {"binary_data_size": len(raw)}}
        for n, dt, shape, raw in inputs]}
    if outputs is not None:
        head["outputs"] = outputs
    if params:
        head["parameters"] = params
    js = json.dumps(head).encode()
    return js + b"".join(raw for *_, raw in inputs), len(js)


def split_response(headers: dict[str, str], body: bytes) -> tuple[dict, bytes]:
    n = int(headers.get("inference-header-content-length", len(body)))
    return json.loads(body[:n]), body[n:]


def test_server_metadata_lists_the_extension(http: Http) -> None:
    status, _, body = http.request("GET", "/v2")
    assert "binary_tensor_data" in json.loads(body)["extensions"]


def test_binary_in_binary_out(http: Http) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    body, jlen = binary_request([("INPUT0", "INT32", [2, 16], a.tobytes()), ("INPUT1", "INT32", [2, 16], b.tobytes())],
                                binary_data_output=True)
    status, headers, out = http.request("POST", "/v2/models/simple/infer", body,
                                        {"Inference-Header-Content-Length": str(jlen)})
    assert status == 200, out
    assert headers["content-type"] == "application/octet-stream"
    meta, raw = split_response(headers, out)
    sizes = [o["parameters"]["binary_data_size"] for o in meta["outputs"]]
    assert sizes == [128, 128] and len(raw) == 256
    assert np.array_equal(np.frombuffer(raw[:128], np.int32).reshape(2, 16), a + b)
    assert np.array_equal(np.frombuffer(raw[128:], np.int32).reshape(2, 16), a - b)


def test_mixed_json_and_binary(http: Http) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    head = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]}
    js = json.dumps(head).encode()
    status, headers, out = http.request("POST", "/v2/models/simple/infer", js + a.tobytes(),
                                        {"Inference-Header-Content-Length": str(len(js))})
    assert status == 200, out
    meta, raw = split_response(headers, out)
    assert np.array_equal(np.frombuffer(raw, np.int32), a.ravel() + 1)
    assert meta["outputs"][1]["data"] == list(a.ravel() - 1)
    assert "data" not in meta["outputs"][0]


def test_binary_bytes_and_fp16(http: Http) -> None:
    strings = [b"a", b"", b"\xff\x00binary"]
    raw = b"".join(len(s).to_bytes(4, "little") + s for s in strings)
    body, jlen = binary_request([("INPUT0", "BYTES", [3], raw)], binary_data_output=True)
    status, headers, out = http.request("POST", "/v2/models/echo_bytes/infer", body,
                                        {"Inference-Header-Content-Length": str(jlen)})
    assert status == 200, out
    assert split_response(headers, out)[1] == raw
    h = np.array([0.5, -2.0, 65504.0], dtype=np.float16)
    body, jlen = binary_request([("INPUT0", "FP16", [3], h.tobytes())], binary_data_output=True)
    status, headers, out = http.request("POST", "/v2/models/echo_fp16/infer", body,
                                        {"Inference-Header-Content-Length": str(jlen)})
    assert np.array_equal(np.frombuffer(split_response(headers, out)[1], np.float16), h)


RAW = {"Inference-Header-Content-Length": "0"}


def raw_answer(http: Http, model: str, body: bytes) -> tuple[dict, bytes]:
    """A raw binary request's answer: in binary, as tritonserver's (its header JSON, the data)."""
    status, headers, out = http.request("POST", f"/v2/models/{model}/infer", body, RAW)
    assert status == 200, out
    assert headers["content-type"] == "application/octet-stream"
    assert int(headers["inference-header-content-length"]) < len(out)
    return split_response(headers, out)


def test_raw_body_single_input(http: Http) -> None:
    x = np.linspace(0, 1, 10, dtype=np.float32)
    meta, data = raw_answer(http, "identity_fp32", x.tobytes())
    assert meta["outputs"][0]["shape"] == [10] and meta["outputs"][0]["parameters"]["binary_data_size"] == 40
    assert np.array_equal(np.frombuffer(data, np.float32), x)


def test_raw_body_batch_dimension_is_one(http: Http) -> None:
    # "matrix" is [-1, 2, 3] with max_batch_size 4: the batch dimension counts as 1, as Triton's.
    x = np.arange(6, dtype=np.float32)
    meta, data = raw_answer(http, "matrix", x.tobytes())
    assert meta["outputs"][0]["shape"] == [1, 2, 3]
    assert np.array_equal(np.frombuffer(data, np.float32), x)


@pytest.fixture(scope="module")
def bytes_models() -> Iterator[openinfer.Server]:
    def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": inputs["INPUT0"]}

    def one(name: str, shape: list[int], **kw) -> Model:
        return Model(name, echo, inputs=[Tensor("INPUT0", "BYTES", shape)],
                     outputs=[Tensor("OUTPUT0", "BYTES", shape)], **kw)

    srv = openinfer.serve(models=[one("one_string", [1]), one("batched_string", [-1, 1], max_batch_size=2),
                                  one("open_strings", [-1]), one("two_open", [-1, -1])],
                          http_port=0, grpc_port=None, metrics_port=None, log=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("model,shape", [("one_string", [1]), ("batched_string", [1, 1])])
def test_raw_body_of_a_bytes_input_is_one_element(bytes_models, model, shape) -> None:
    # Triton's core takes the whole body as the one element (its length is no part of it).
    text = b"a string \x00 with \xff anything in it"
    http = Http(bytes_models.http_port)
    try:
        meta, data = raw_answer(http, model, text)
    finally:
        http.close()
    assert meta["outputs"][0]["shape"] == shape and meta["outputs"][0]["datatype"] == "BYTES"
    assert data == len(text).to_bytes(4, "little") + text


RAW_REFUSALS = [
    ("simple", "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model "
               "configuration"),
    ("two_open", "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
                 "variable-sized dimension"),
    ("open_strings", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
]


@pytest.mark.parametrize("model,message", RAW_REFUSALS, ids=[m for m, _ in RAW_REFUSALS])
def test_raw_body_refused_in_tritons_words(server, bytes_models, model, message) -> None:
    http = Http((server if model == "simple" else bytes_models).http_port)
    try:
        status, _, out = http.request("POST", f"/v2/models/{model}/infer", b"\0" * 128, RAW)
    finally:
        http.close()
    assert (status, json.loads(out)) == (400, {"error": message})


def test_raw_body_of_the_wrong_size(http: Http) -> None:
    status, _, out = http.request("POST", "/v2/models/echo_fp64/infer", b"\0" * 12, RAW)
    assert status == 400 and "for model 'echo_fp64'. Expected 8, got 12" in json.loads(out)["error"]


@pytest.mark.parametrize("encoding, compress", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some clients send it
])
def test_compressed_request(http: Http, encoding: str, compress) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    body, jlen = binary_request([("INPUT0", "INT32", [2, 16], a.tobytes()), ("INPUT1", "INT32", [2, 16], a.tobytes())])
    status, headers, out = http.request("POST", "/v2/models/simple/infer", compress(body),
                                        {"Content-Encoding": encoding, "Inference-Header-Content-Length": str(jlen)})
    assert status == 200, out
    assert json.loads(out)["outputs"][0]["data"] == list((a + a).ravel())


@pytest.mark.parametrize("accept, decompress", [("gzip", gzip.decompress), ("deflate", zlib.decompress),
                                                ("gzip;q=0, deflate", zlib.decompress)])
def test_compressed_response(http: Http, accept: str, decompress) -> None:
    x = np.zeros(5000, dtype=np.float32)
    body, jlen = binary_request([("INPUT0", "FP32", [5000], x.tobytes())], binary_data_output=True)
    status, headers, out = http.request("POST", "/v2/models/identity_fp32/infer", body,
                                        {"Accept-Encoding": accept, "Inference-Header-Content-Length": str(jlen)})
    assert status == 200
    assert headers["content-encoding"] == {"gzip": "gzip", "zlib": "deflate"}[decompress.__module__]
    plain = decompress(out)
    assert len(out) < len(plain) / 10
    meta, raw = split_response(headers, plain)
    assert np.array_equal(np.frombuffer(raw, np.float32), x)


def test_identity_when_nothing_acceptable(http: Http) -> None:
    status, headers, _ = http.request("GET", "/v2/health/live", headers={"Accept-Encoding": "br"})
    assert status == 200 and "content-encoding" not in headers


BAD_BINARY = [
    # (body, headers, status, message fragment)
    (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":64}}]}',
     {}, 400, "binary_data_size"),
    (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":60}}]}' + b"\0" * 60,
     "IHCL", 400, "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"),
    (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":64}}]}' + b"\0" * 70,
     "IHCL", 400, "70 bytes follow the JSON"),
    (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":18446744073709551615}}]}',
     "IHCL", 400, "binary_data_size"),
    (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[4611686018427387904,4],"parameters":{"binary_data_size":0}}]}',
     "IHCL", 400, "shape"),
    (b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "compressed request body is corrupt"),
    (gzip.compress(b"{}")[:-6], {"Content-Encoding": "gzip"}, 400, "truncated"),
    (b"{}", {"Content-Encoding": "br"}, 415, "unsupported Content-Encoding 'br'"),
]


@pytest.mark.parametrize("body, headers, status, fragment", BAD_BINARY)
def test_bad_binary_requests(server, body: bytes, headers, status: int, fragment: str) -> None:
    if headers == "IHCL":
        headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3)}
    conn = Http(server.http_port)
    try:
        got, _, out = conn.request("POST", "/v2/models/simple/infer", body, headers)
        assert got == status, out
        assert fragment in json.loads(out)["error"]
        # The connection stays usable.
        assert conn.request("GET", "/v2/health/live")[0] == 200
    finally:
        conn.close()


@pytest.mark.parametrize(("start", "status", "fragment"), [
    (b"{", 400, "Decompressed data size exceeds the maximum allowed value of 67108864 bytes"),  # 100 MiB > 64
    (b"\0", 400, "is not a JSON object: it starts with byte 0x00"),  # refused at its first byte
])
def test_gzip_bomb_is_limited(server, start: bytes, status: int, fragment: str) -> None:
    bomb = gzip.compress(start + b" " * (100 << 20))
    conn = Http(server.http_port)
    try:
        got, _, out = conn.request("POST", "/v2/models/simple/infer", bomb, {"Content-Encoding": "gzip"})
        assert got == status and fragment in json.loads(out)["error"], out
    finally:
        conn.close()
    assert_alive(server.http_port)
