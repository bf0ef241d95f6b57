"""--http-max-input-size (max_body_bytes) as tritonserver applies it, over real sockets: it
bounds a JSON body, the JSON header of a binary-extension body and a raw body, each refused 400
in tritonserver's words naming the flag; tensor data after a JSON header is bounded by the
in-flight body budget instead (a 503 past it); chunked bodies are counted as tritonserver counts
their chunks; endpoints other than infer keep the limit on their whole body."""

from __future__ import annotations

import json
import re
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import Http, assert_alive
from openinfer import Model, Tensor

LIMIT = 4096
BUDGET = 1 << 20  # max_inflight_body_bytes


def too_large(n: int | str) -> str:
    return (f"request JSON size of {n} bytes exceeds the maximum allowed input size of {LIMIT} bytes. Use "
            "--http-max-input-size to increase the limit.")


@pytest.fixture(scope="module")
def small() -> Iterator[openinfer.Server]:
    def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": inputs["INPUT0"]}

    model = Model("echo", echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    srv = openinfer.serve(models=[model], http_port=0, grpc_port=None, metrics_port=None, threads=1, log=False,
                          max_body_bytes=LIMIT, max_inflight_body_bytes=BUDGET)
    try:
        yield srv
    finally:
        srv.stop()


def refused(srv: openinfer.Server, request: bytes, closes: bool = True) -> tuple[int, str]:
    """Sends `request` on a connection of its own: the status and error of the refusal, which
    closes the connection when it comes before the body is read (`closes`)."""
    conn = Http(srv.http_port)
    try:
        conn.send(request)
        status, headers, body = conn.read_response()
        assert (headers.get("connection") == "close") == closes
        return status, json.loads(body)["error"]
    finally:
        conn.close()
        assert_alive(srv.http_port)


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in ("Host: x", f"Content-Length: {len(body)}", *headers))
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body


def json_infer(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)],
                                   "data": values}]}).encode()


def test_json_body_over_the_limit_refused_in_tritons_words(small) -> None:
    body = json_infer(list(range(2000)))
    assert len(body) > LIMIT
    assert refused(small, post("/v2/models/echo/infer", body)) == (400, too_large(len(body)))


def test_raw_body_over_the_limit_refused_in_tritons_words(small) -> None:
    request = post("/v2/models/echo/infer", b"\0" * 8192, "Inference-Header-Content-Length: 0")
    assert refused(small, request) == (400, "Raw input has a byte_size (8192 bytes) that exceeds the maximum "
                                            f"allowed value of {LIMIT} bytes. Use --http-max-input-size to increase "
                                            "the limit.")


def test_binary_extension_json_header_over_the_limit_refused(small) -> None:
    header = b" " * 5000 + json_infer([1])
    request = post("/v2/models/echo/infer", header, f"Inference-Header-Content-Length: {len(header)}")
    assert refused(small, request) == (400, too_large(len(header)))


def test_binary_extension_tensor_data_past_the_limit_is_served(small) -> None:
    # 64 KiB of tensor data behind a small JSON header, as tritonclient sends it: the limit
    # bounds the header only (tritonserver serves 2 GB of such data where memory allows).
    x = np.arange(16384, dtype=np.int32)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{small.http_port}")
    try:
        inp = httpclient.InferInput("INPUT0", [x.size], "INT32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x)
        # The same values as JSON are a JSON body over the limit.
        inp.set_data_from_numpy(x, binary_data=False)
        with pytest.raises(InferenceServerException, match="exceeds the maximum allowed input size of 4096 bytes. "
                                                           "Use --http-max-input-size to increase the limit."):
            client.infer("echo", [inp])
    finally:
        client.close()


def test_binary_extension_chunked_past_the_limit_is_served(small) -> None:
    x = np.arange(4096, dtype=np.int32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [x.size],
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    body = header + x.tobytes()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000]) for i in range(0, len(body), 1000))
    conn = Http(small.http_port)
    try:
        conn.send(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Inference-Header-Content-Length: %d\r\n\r\n%s0\r\n\r\n" % (len(header), chunks))
        status, _, out = conn.read_response()
    finally:
        conn.close()
    assert status == 200, out
    assert json.loads(out)["outputs"][0]["data"] == x.tolist()


def test_chunked_json_over_the_limit_refused(small) -> None:
    body = json_infer(list(range(2000)))
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000]) for i in range(0, len(body), 1000))
    status, error = refused(small, b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    # Refused as the body passes the limit: how much had come is what the reads brought.
    m = re.fullmatch(re.escape(too_large("at least NNN")).replace("NNN", r"(\d+)"), error)
    assert status == 400 and m and LIMIT < int(m.group(1)) <= len(body), error


def test_binary_extension_tensor_data_is_bounded_by_the_budget(small) -> None:
    header = json_infer([1])
    request = post("/v2/models/echo/infer", header + b"\0" * (2 * BUDGET),
                   f"Inference-Header-Content-Length: {len(header)}")
    conn = Http(small.http_port)
    try:
        conn.send(request[:200])  # the headers: refused before the body is read
        status, _, body = conn.read_response()
    finally:
        conn.close()
    assert status == 503 and "max_inflight_body_bytes" in json.loads(body)["error"]


def test_other_endpoints_keep_the_limit_on_their_whole_body(small) -> None:
    # An Inference-Header-Content-Length opens the budget to infer only: a repository request
    # of that size is a JSON body over the limit.
    request = post("/v2/repository/index", b"{}" + b" " * 8190, "Inference-Header-Content-Length: 2")
    assert refused(small, request, closes=False) == (400, too_large(8192))


def test_too_many_chunks_refused_in_tritons_words(server: openinfer.Server) -> None:
    # tritonserver's kMaxChunkedChunks: 65536 non-empty chunks, then 400 (empty ones are no chunk).
    conn = Http(server.http_port)
    try:
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            conn.send(b"1\r\n \r\n" * 65537 + b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending; the answer is already there
        status, headers, body = conn.read_response()
    finally:
        conn.close()
    assert (status, json.loads(body)) == (400, {"error": "Chunked request body exceeds maximum of 65536 non-empty "
                                                         "chunks. Send fewer or larger HTTP chunks."})
    assert headers["connection"] == "close"
    assert_alive(server.http_port)
