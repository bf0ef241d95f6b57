"""The gRPC service through real sockets: stubs generated from proto/ (grpcio) and
tritonclient.grpc, every RPC, every datatype with raw and typed contents, streaming, large
tensors, and errors with their status codes and messages."""

from __future__ import annotations

import json
import queue
import struct
import threading
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import GRPC_BIG_MESSAGES, NP, V2_TYPES, assert_alive, assert_grpc_alive

TYPED_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def sample(dtype: str, n: int = 5) -> list[Any]:
    if dtype == "BYTES":
        return [b"", b"a", "\u00e9t\u00e9".encode(), b"\x00\xff", b"x" * 300][:n]
    if dtype == "BOOL":
        return [True, False, True, True, False][:n]
    info = np.iinfo(NP[dtype]) if dtype not in ("FP16", "FP32", "FP64") else None
    if dtype == "BF16":
        return [0x3F80, 0xC000, 0x0000, 0x7F80, 0x3E4D][:n]
    if info is not None:
        return [int(info.min), int(info.max), 0, 1, int(info.max) // 3][:n]
    return [0.5, -1.25, 3.0e4, float("inf"), -0.0][:n]


def raw_bytes(dtype: str, values: list[Any]) -> bytes:
    if dtype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    return np.array(values, dtype=NP[dtype]).tobytes()


def infer_request(pb: Any, model: str, inputs: list[tuple[str, str, list[int], Any]], **kw: Any) -> Any:
    """A ModelInferRequest; each input is (name, datatype, shape, raw bytes or ('typed', values))."""
    req = pb.ModelInferRequest(model_name=model, **kw)
    raw = []
    for name, dtype, shape, data in inputs:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if isinstance(data, tuple):
            getattr(t.contents, TYPED_FIELD[dtype]).extend(data[1])
        else:
            raw.append(data)
    req.raw_input_contents.extend(raw)
    return req


def rpc_error(fn: Any, *args: Any, **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, **kw)
    return e.value


# ---- health and metadata -------------------------------------------------------------------


def test_health_rpcs(stub: Any, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    assert stub.ServerLive(pb.ServerLiveRequest()).live is True
    assert stub.ServerReady(pb.ServerReadyRequest()).ready is True
    assert stub.ModelReady(pb.ModelReadyRequest(name="simple")).ready is True
    assert stub.ModelReady(pb.ModelReadyRequest(name="versioned", version="2")).ready is True
    # As Triton: a model or version that is not served is not ready, and the call succeeds.
    assert stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="versioned", version="9")).ready is False
    e = rpc_error(stub.ModelReady, pb.ModelReadyRequest(name="versioned", version="x9"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to get model version from specified version string 'x9'" in e.details()


def test_metadata_rpcs(stub: Any, grpc_stubs: Any, url: str) -> None:
    pb = grpc_stubs.pb
    meta = stub.ServerMetadata(pb.ServerMetadataRequest())
    http = requests.get(f"{url}/v2").json()
    assert (meta.name, meta.version, list(meta.extensions)) == (http["name"], http["version"], http["extensions"])
    m = stub.ModelMetadata(pb.ModelMetadataRequest(name="simple"))
    http = requests.get(f"{url}/v2/models/simple").json()
    assert m.name == "simple" and list(m.versions) == http["versions"] and m.platform == http["platform"]
    assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [
        (t["name"], t["datatype"], t["shape"]) for t in http["inputs"]]
    assert [(t.name, t.datatype, list(t.shape)) for t in m.outputs] == [
        (t["name"], t["datatype"], t["shape"]) for t in http["outputs"]]
    m = stub.ModelMetadata(pb.ModelMetadataRequest(name="versioned", version="3"))
    assert list(m.versions) == ["1", "2", "3"]
    e = rpc_error(stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_tritonclient_health_and_metadata(server: openinfer.Server) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("simple")
        meta = client.get_model_metadata("simple", as_json=True)
        assert meta["name"] == "simple" and [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
        assert client.get_server_metadata(as_json=True)["name"] == "openinfer"
    finally:
        client.close()


def test_unimplemented_rpcs(grpc_channel: Any) -> None:
    e = rpc_error(grpc_channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc"), b"", timeout=10)
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "NoSuchRpc" in e.details()
    e = rpc_error(grpc_channel.unary_unary("/other.Service/Call"), b"", timeout=10)
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "unknown service" in e.details()


# ---- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_every_datatype_raw(stub: Any, grpc_stubs: Any, dtype: str) -> None:
    values = sample(dtype)
    data = raw_bytes(dtype, values)
    req = infer_request(grpc_stubs.pb, f"echo_{dtype.lower()}", [("INPUT0", dtype, [len(values)], data)], id="r-1")
    resp = stub.ModelInfer(req)
    assert (resp.model_name, resp.model_version, resp.id) == (f"echo_{dtype.lower()}", "1", "r-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [("OUTPUT0", dtype, [len(values)])]
    assert list(resp.raw_output_contents) == [data]


@pytest.mark.parametrize("dtype", [t for t in V2_TYPES if t not in ("FP16", "BF16")])
def test_every_datatype_typed(stub: Any, grpc_stubs: Any, dtype: str) -> None:
    values = sample(dtype)
    req = infer_request(grpc_stubs.pb, f"echo_{dtype.lower()}", [("INPUT0", dtype, [len(values)], ("typed", values))])
    resp = stub.ModelInfer(req)
    assert list(resp.raw_output_contents) == [raw_bytes(dtype, values)]


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
def test_half_types_have_no_typed_contents(stub: Any, grpc_stubs: Any, dtype: str) -> None:
    req = grpc_stubs.pb.ModelInferRequest(model_name=f"echo_{dtype.lower()}")
    req.inputs.add(name="INPUT0", datatype=dtype, shape=[1]).contents.fp32_contents.append(1.0)
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"datatype {dtype} has no typed contents; send it in raw_input_contents" in e.details()


@pytest.mark.parametrize("dtype", [t for t in V2_TYPES if t != "BF16"])
def test_tritonclient_every_datatype(server: openinfer.Server, dtype: str) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        arr = np.array(sample(dtype), dtype=object if dtype == "BYTES" else NP[dtype]).reshape(1, 5)
        inp = tgrpc.InferInput("INPUT0", list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        model = f"echo_{dtype.lower()}"
        # echo models take any rank? they declare [-1]: send 1-D
        inp = tgrpc.InferInput("INPUT0", [5], dtype)
        inp.set_data_from_numpy(arr.reshape(5))
        out = client.infer(model, [inp], outputs=[tgrpc.InferRequestedOutput("OUTPUT0")]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, arr.reshape(5))
    finally:
        client.close()


def test_parameters_mean_what_they_mean_over_http(stub: Any, grpc_stubs: Any, url: str) -> None:
    req = infer_request(grpc_stubs.pb, "params", [("INPUT0", "INT32", [1], raw_bytes("INT32", [7]))])
    req.parameters["flag"].bool_param = True
    req.parameters["count"].int64_param = -3
    req.parameters["name"].string_param = 'quote " and \u00e9'
    req.parameters["ratio"].double_param = 0.25
    req.parameters["big"].uint64_param = 2**64 - 1
    resp = stub.ModelInfer(req)
    body = resp.raw_output_contents[0]
    got = json.loads(body[4:])
    want = {"flag": True, "count": -3, "name": 'quote " and \u00e9', "ratio": 0.25, "big": 2**64 - 1}
    assert got == want
    http = requests.post(f"{url}/v2/models/params/infer", json={
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [7]}], "parameters": want}).json()
    assert json.loads(http["outputs"][0]["data"][0]) == got


def test_requested_outputs_and_order(stub: Any, grpc_stubs: Any) -> None:
    a = np.arange(16, dtype=np.int32)
    b = np.ones(16, dtype=np.int32)
    req = infer_request(grpc_stubs.pb, "simple", [("INPUT0", "INT32", [1, 16], a.tobytes()),
                                                   ("INPUT1", "INT32", [1, 16], b.tobytes())])
    req.outputs.add(name="OUTPUT1")
    req.outputs.add(name="OUTPUT0")
    resp = stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["OUTPUT1", "OUTPUT0"]
    assert np.frombuffer(resp.raw_output_contents[0], np.int32).tolist() == (a - b).tolist()
    assert np.frombuffer(resp.raw_output_contents[1], np.int32).tolist() == (a + b).tolist()


def test_tritonclient_infer_async_and_large(server: openinfer.Server) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}", channel_args=GRPC_BIG_MESSAGES)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [tgrpc.InferInput("INPUT0", [1, 16], "INT32"), tgrpc.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        r = client.infer("simple", inputs, request_id="one")
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * a)
        assert r.get_response().id == "one"

        done: queue.Queue = queue.Queue()
        for _ in range(8):
            client.async_infer("simple", inputs, lambda result, error: done.put((result, error)))
        for _ in range(8):
            result, error = done.get(timeout=30)
            assert error is None
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * a)

        big = np.random.default_rng(0).standard_normal(4 << 20, dtype=np.float32)  # 16 MiB
        inp = tgrpc.InferInput("INPUT0", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)
        out = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, big)
    finally:
        client.close()


def test_tritonclient_streaming(server: openinfer.Server) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [tgrpc.InferInput("INPUT0", [1, 16], "INT32"), tgrpc.InferInput("INPUT1", [1, 16], "INT32")]
        for x in inputs:
            x.set_data_from_numpy(a)
        for k in range(5):
            client.async_stream_infer("simple", inputs, request_id=f"s{k}")
        client.async_stream_infer("nope", inputs, request_id="bad")
        client.async_stream_infer("simple", inputs, request_id="after")
        got = {}
        errors = []
        for _ in range(7):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("OUTPUT0")
        assert sorted(got) == ["after", "s0", "s1", "s2", "s3", "s4"]
        assert all((v == 2 * a).all() for v in got.values())
        assert len(errors) == 1 and "Request for unknown model: 'nope' is not found" in str(errors[0])
    finally:
        client.stop_stream()
        client.close()


def test_stream_answers_each_request_and_ends_ok(stub: Any, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    good = infer_request(pb, "echo_int32", [("INPUT0", "INT32", [2], raw_bytes("INT32", [1, 2]))], id="g")
    bad = infer_request(pb, "echo_int32", [("INPUT0", "INT32", [3], raw_bytes("INT32", [1, 2]))], id="b")
    responses = list(stub.ModelStreamInfer(iter([good, bad, good, good]), timeout=30))
    assert len(responses) == 4
    errors = [r for r in responses if r.error_message]
    assert len(errors) == 1 and errors[0].error_message == ("[request id: b] input byte size mismatch for input 'INPUT0' for model "
                                                       "'echo_int32'. Expected 12, got 8")
    assert errors[0].infer_response.id == "b"
    assert sum(r.infer_response.id == "g" for r in responses) == 3
    # An empty stream ends OK with no answer.
    assert list(stub.ModelStreamInfer(iter([]), timeout=30)) == []


def test_many_concurrent_calls_on_one_channel(stub: Any, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    futures = []
    for k in range(200):
        req = infer_request(pb, "echo_int64", [("INPUT0", "INT64", [1], raw_bytes("INT64", [k]))], id=str(k))
        futures.append(stub.ModelInfer.future(req, timeout=60))
    for k, f in enumerate(futures):
        r = f.result()
        assert r.id == str(k) and r.raw_output_contents[0] == raw_bytes("INT64", [k])


# ---- errors --------------------------------------------------------------------------------


def test_infer_errors(stub: Any, grpc_stubs: Any, server: openinfer.Server) -> None:
    pb = grpc_stubs.pb
    one = raw_bytes("INT32", [1])
    cases = [
        (infer_request(pb, "nope", [("INPUT0", "INT32", [1], one)]), grpc.StatusCode.NOT_FOUND,
         "Request for unknown model: 'nope' is not found"),
        (infer_request(pb, "echo_int32", [("INPUT0", "INT32", [2], one)]), grpc.StatusCode.INVALID_ARGUMENT,
         "input byte size mismatch for input 'INPUT0' for model 'echo_int32'. Expected 8, got 4"),
        (infer_request(pb, "echo_int32", [("INPUT0", "FP32", [1], one)]), grpc.StatusCode.INVALID_ARGUMENT,
         "input 'INPUT0': expected datatype INT32, got FP32"),
        (infer_request(pb, "echo_int32", [("INPUT0", "INT33", [1], one)]), grpc.StatusCode.INVALID_ARGUMENT,
         "unknown datatype 'INT33'"),
        (infer_request(pb, "echo_int32", [("INPUT0", "INT32", [2], ("typed", [1]))]),
         grpc.StatusCode.INVALID_ARGUMENT, "shape [2] needs 2 elements, contents.int_contents has 1"),
        (infer_request(pb, "echo_int32", [("INPUT0", "INT32", [1], ("typed", [1.5]))][:0] or
                       [("INPUT0", "INT32", [1], one)], raw_input_contents=[one]),
         grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2 entries for 1 inputs"),
        (infer_request(pb, "echo_int32", [("INPUT0", "INT32", [1], None)][:0]),
         grpc.StatusCode.INVALID_ARGUMENT, "but missing required input(s) ['INPUT0']"),
        (infer_request(pb, "raises", [("INPUT0", "INT32", [1], one)]), grpc.StatusCode.INTERNAL,
         "the model refuses negative numbers"),
        (infer_request(pb, "client_error", [("INPUT0", "INT32", [1], one)]), grpc.StatusCode.INVALID_ARGUMENT,
         "INPUT0 must be sorted"),
        (infer_request(pb, "wrong_dtype", [("INPUT0", "INT32", [1], one)]), grpc.StatusCode.INTERNAL,
         "expected INT32, got float64 values"),
        (pb.ModelInferRequest(), grpc.StatusCode.INVALID_ARGUMENT, "model_name is empty"),
    ]
    both = infer_request(pb, "echo_int32", [("INPUT0", "INT32", [1], ("typed", [1]))])
    both.raw_input_contents.append(one)
    cases.append((both, grpc.StatusCode.INVALID_ARGUMENT, "has both contents and raw_input_contents"))
    for req, code, text in cases:
        e = rpc_error(stub.ModelInfer, req, timeout=30)
        assert (e.code(), text in e.details()) == (code, True), (e.code(), e.details(), text)
    assert_grpc_alive(server.grpc_port)


@pytest.mark.parametrize("payload,text", [
    (b"\x0a\xff", "malformed varint"),
    (b"\x0a\x10abc", "truncated field"),
    (b"\x08\x01", "field 1 has wire type 0 (varint), expected 2"),
    (b"\x0a\x06echo_x\x2a\x02\x0a\x05", "inputs[0]: truncated field"),
    (b"\x0b", "unsupported wire type"),
])
def test_malformed_protobuf(grpc_channel: Any, server: openinfer.Server, payload: bytes, text: str) -> None:
    call = grpc_channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    e = rpc_error(call, payload, timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and text in e.details(), e.details()
    assert_grpc_alive(server.grpc_port)


def test_unary_without_a_message(grpc_channel: Any) -> None:
    call = grpc_channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")
    e = rpc_error(call, iter([]), timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "without a request message" in e.details()


def test_grpc_and_http_side_by_side(server: openinfer.Server, stub: Any, grpc_stubs: Any) -> None:
    """Both protocols at once on the same loops: neither disturbs the other."""
    errors: list[BaseException] = []

    def grpc_load() -> None:
        try:
            for k in range(50):
                req = infer_request(grpc_stubs.pb, "echo_int32", [("INPUT0", "INT32", [1], raw_bytes("INT32", [k]))])
                assert stub.ModelInfer(req, timeout=30).raw_output_contents[0] == raw_bytes("INT32", [k])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=grpc_load) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        assert_alive(server.http_port)
    for t in threads:
        t.join()
    assert not errors, errors


def test_serve_grpc_options() -> None:
    with openinfer.serve(http_port=0, grpc_port=None, log=False) as srv:
        assert srv.grpc_port is None and srv.grpc_url is None
    with openinfer.serve(http_port=0, log=False) as srv:
        assert srv.grpc_port and srv.grpc_url == f"grpc://127.0.0.1:{srv.grpc_port}"
        assert_grpc_alive(srv.grpc_port)
    with pytest.raises(ValueError, match="grpc_port"):
        openinfer.serve(http_port=0, grpc_port=70000, log=False)
    with openinfer.serve(http_port=0, log=False) as a:
        with pytest.raises(OSError, match="gRPC"):
            openinfer.serve(http_port=0, grpc_port=a.grpc_port, log=False)


def test_tritonclient_errors(server: openinfer.Server) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        inp = tgrpc.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found") as e:
            client.infer("nope", [inp])
        assert e.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()
