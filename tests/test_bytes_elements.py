"""BYTES inputs whose element count does not match their shape are refused in Triton's words
(core's InferenceRequest::ValidateBytesInputs), naming the input, the model and the request:
through tritonclient's HTTP binary data and gRPC raw contents, and a raw HTTP body; the server
stays up."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import triton_grpc, triton_http

CONFIG = """
name: "strings"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("strings")
    (repo / "strings" / "1").mkdir(parents=True)
    (repo / "strings" / "config.pbtxt").write_text(CONFIG)
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    assert srv.failed == {}, srv.failed
    yield srv
    srv.stop()


def _mislabelled(mod: Any, elements: int, shape: int) -> Any:
    """An input holding `elements` strings whose declared shape says `shape`."""
    i = mod.InferInput("INPUT0", [elements], "BYTES")
    i.set_data_from_numpy(np.array([b"ab"] * elements, dtype=np.object_))
    i.set_shape([shape])
    return i


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("elements, shape, words", [
    (2, 3, "expected 3 string elements for inference input 'INPUT0' for model 'strings', got 2"),
    (3, 2, "unexpected number of string elements 3 for inference input 'INPUT0' for model 'strings', expecting 2"),
    (0, 1, "expected 1 string elements for inference input 'INPUT0' for model 'strings', got 0"),
])  # fmt: skip
def test_element_count_in_tritons_words(server: openinfer.Server, protocol: str, elements: int, shape: int,
                                        words: str) -> None:
    mod = httpclient if protocol == "http" else grpcclient
    client = triton_http(server) if protocol == "http" else triton_grpc(server)
    with pytest.raises(InferenceServerException) as e:
        client.infer("strings", [_mislabelled(mod, elements, shape)], request_id="r7")
    assert e.value.message() == f"[request id: r7] {words}"
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException) as e:
        client.infer("strings", [_mislabelled(mod, elements, shape)])
    assert e.value.message() == f"[request id: <id_unknown>] {words}"
    # The server stays up, and a well-formed request is answered.
    r = client.infer("strings", [_mislabelled(mod, 2, 2)])
    assert r.as_numpy("OUTPUT0").tolist() == [b"ab", b"ab"]


def test_incomplete_length_indicator(server: openinfer.Server) -> None:
    raw = struct.pack("<I", 3) + b"abc" + b"\x01\x00"
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    r = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/strings/infer", data=header + raw,
                      headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == (
        "[request id: <id_unknown>] incomplete string length indicator for inference input 'INPUT0' for model "
        "'strings', expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator is "
        "in one buffer."
    )


def test_element_longer_than_the_bytes_left_is_refused(server: openinfer.Server) -> None:
    """Triton lets this through to its backend; openinfer refuses it (the model would read past
    the request), naming the model as the other element errors do."""
    raw = struct.pack("<I", 10) + b"abc"
    header = json.dumps({"id": "x", "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                                                "parameters": {"binary_data_size": len(raw)}}]}).encode()
    r = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/strings/infer", data=header + raw,
                      headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    assert (r.status_code, r.json()["error"]) == (400, (
        "[request id: x] string element 0 of inference input 'INPUT0' for model 'strings' declares 10 bytes but only "
        "3 remain"))  # fmt: skip
