"""tritonclient.http, unchanged, against openinfer: health, metadata, binary and JSON tensors
mixed, BYTES, compression both ways, async_infer over many connections, errors."""

from __future__ import annotations

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def triton(server):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=8)
    yield c
    c.close()


def simple_inputs(binary: bool) -> list:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    i0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_data_from_numpy(a, binary_data=binary)
    i1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_data_from_numpy(b, binary_data=not binary)  # one JSON, one binary
    return [i0, i1]


def test_health_and_metadata(triton) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("simple")
    assert not triton.is_model_ready("nope")
    assert triton.get_server_metadata()["name"] == "openinfer"
    meta = triton.get_model_metadata("simple")
    assert meta["name"] == "simple" and meta["inputs"][0]["shape"] == [-1, 16]


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_mixed(triton, binary_in: bool, binary_out: bool) -> None:
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary_out)]
    result = triton.infer("simple", simple_inputs(binary_in), outputs=outputs, request_id="r1")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + 1)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - 1)
    assert result.get_response()["id"] == "r1"


def test_bytes(triton) -> None:
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"2"] * 16], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    result = triton.infer("simple_string", inputs,
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                                   httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)])
    assert [int(x) for x in result.as_numpy("OUTPUT0").ravel()] == [i + 2 for i in range(16)]
    assert [int(x) for x in result.as_numpy("OUTPUT1").ravel()] == [i - 2 for i in range(16)]


@pytest.mark.parametrize("req_alg, resp_alg", [("gzip", "deflate"), ("deflate", "gzip"), (None, "gzip")])
def test_compression_both_ways(triton, req_alg, resp_alg) -> None:
    x = np.linspace(0, 1, 4096, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [4096], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = triton.infer("identity_fp32", [inp], request_compression_algorithm=req_alg,
                          response_compression_algorithm=resp_alg)
    assert np.array_equal(result.as_numpy("OUTPUT0"), x)


def test_async_infer_many_connections(triton) -> None:
    handles = []
    for i in range(40):
        a = np.full((1, 16), i, np.int32)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        handles.append((i, triton.async_infer("simple", inputs)))
    for i, h in handles:
        assert h.get_result().as_numpy("OUTPUT0")[0, 0] == 2 * i


def test_errors_carry_status(triton) -> None:
    with pytest.raises(InferenceServerException) as e:
        triton.infer("simple", simple_inputs(True)[:1])
    assert e.value.status() == "400" and "but missing required input(s) ['INPUT1']" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        triton.get_model_metadata("nope")
    assert e.value.status() == "404"
    with pytest.raises(InferenceServerException) as e:
        inp = httpclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], np.int32))
        triton.infer("raises", [inp])
    assert e.value.status() == "500" and "refuses negative numbers" in e.value.message()
