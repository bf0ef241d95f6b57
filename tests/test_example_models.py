"""Triton's simple_int8 and simple_identity examples as its clients call them (tritonclient
HTTP and gRPC against the example repository the session server serves)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: openinfer.Server) -> Iterator[Any]:
    """tritonclient on the session server, which serves the example repository."""
    if request.param == "http":
        c: Any = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    else:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield request.param, c
    c.close()


def infer(client: tuple[str, Any], model: str, arrays: dict[str, np.ndarray], datatype: str) -> Any:
    kind, c = client
    mod = httpclient if kind == "http" else grpcclient
    inputs = []
    for name, arr in arrays.items():
        i = mod.InferInput(name, list(arr.shape), datatype)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return c.infer(model, inputs)


def test_simple_int8_wraps_like_int8(client: tuple[str, Any]) -> None:
    a = np.array([[127, -128, 5, 100, -100, 0, 1, -1, 64, -64, 127, -128, 10, 20, 30, 40]], dtype=np.int8)
    b = np.array([[1, -1, 5, 100, 100, 0, -1, 1, 64, 64, 127, -128, 3, 2, 1, 0]], dtype=np.int8)
    r = infer(client, "simple_int8", {"INPUT0": a, "INPUT1": b}, "INT8")
    assert r.as_numpy("OUTPUT0").dtype == np.int8
    assert r.as_numpy("OUTPUT0").tolist() == (a + b).tolist()  # numpy's int8 wraps: -128 for 127 + 1
    assert r.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    assert r.as_numpy("OUTPUT0")[0, 0] == -128


def test_simple_identity_answers_bytes_unchanged(client: tuple[str, Any]) -> None:
    data = np.array([[b"", "é".encode(), b"\x00\xff"], [b"a", b"bb", b"ccc"]], dtype=np.object_)
    r = infer(client, "simple_identity", {"INPUT0": data}, "BYTES")
    assert r.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_simple_int8_refuses_another_datatype(client: tuple[str, Any]) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException, match="INPUT0") as e:
        infer(client, "simple_int8", {"INPUT0": a, "INPUT1": a}, "INT32")
    assert "INT8" in str(e.value)
