"""HTTP/1.1 framing and connection handling: keep-alive, pipelining, chunked bodies,
Expect: 100-continue, limits, timeouts, vanishing clients and many concurrent clients."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from conftest import Http, assert_alive, encode_request, infer_body

import openinfer

SIMPLE_BODY = infer_body([
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
])


def check_simple(status: int, body: bytes) -> None:
    assert status == 200, body
    out = json.loads(body)["outputs"]
    assert out[0]["data"] == [x + 1 for x in range(16)]


def test_keep_alive_many_requests_one_connection(http: Http) -> None:
    for _ in range(50):
        status, headers, body = http.request("POST", "/v2/models/simple/infer", SIMPLE_BODY)
        check_simple(status, body)
        assert "close" not in headers.get("connection", "")


def test_pipelining_answers_in_order(http: Http) -> None:
    reqs = []
    for v in (1, 2, 3, 2, 1):
        reqs.append(encode_request("POST", f"/v2/models/versioned/versions/{v}/infer", infer_body(
            [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0]}])))
        reqs.append(encode_request("GET", "/v2/health/live"))
    http.send(b"".join(reqs))  # all at once, in one write
    for v in (1, 2, 3, 2, 1):
        status, _, body = http.read_response()
        assert status == 200 and json.loads(body)["model_version"] == str(v)
        status, _, body = http.read_response()
        assert json.loads(body) == {"live": True}


def test_pipelined_slow_and_fast_keep_order(http: Http) -> None:
    """Responses leave in request order whatever the models take: each answer names its own
    request by content (no dependence on timing or on the server's overall readiness)."""
    def one(model: str, value: int) -> bytes:
        return encode_request("POST", f"/v2/models/{model}/infer", infer_body(
            [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]))

    wire = [("slow", 300), ("echo_int32", 1), ("slow", 50), ("echo_int32", 2), ("slow", 0)]
    http.send(b"".join(one(m, v) for m, v in wire) + encode_request("GET", "/v2/health/live"))
    for _, value in wire:
        status, _, body = http.read_response()
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [value]
    status, _, body = http.read_response()
    assert status == 200 and json.loads(body) == {"live": True}


def test_chunked_body(http: Http) -> None:
    body = SIMPLE_BODY
    chunks = [body[i:i + 7] for i in range(0, len(body), 7)]
    wire = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    http.send(head)
    for i in range(0, len(wire), 13):  # dribble it in small writes
        http.send(wire[i:i + 13])
    status, _, out = http.read_response()
    check_simple(status, out)


def test_large_chunked_body_grows(url: str) -> None:
    n = 300_000
    body = infer_body([{"name": "INPUT0", "shape": [n], "datatype": "FP32", "data": [0.5] * n}])

    def gen():
        for i in range(0, len(body), 65536):
            yield body[i:i + 65536]

    r = requests.post(url + "/v2/models/identity_fp32/infer", data=gen(), timeout=60)
    assert r.status_code == 200
    assert r.json()["outputs"][0]["shape"] == [n]


def test_expect_100_continue(http: Http) -> None:
    head = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: " + str(len(SIMPLE_BODY)).encode() + b"\r\n\r\n")
    http.send(head)
    status, _, body = http.read_response()
    assert status == 100 and body == b""
    http.send(SIMPLE_BODY)
    status, _, body = http.read_response()
    check_simple(status, body)


def test_http10_client(server: openinfer.Server) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b'{"live":true}')


def test_oversized_body_rejected_before_reading(server: openinfer.Server) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        status, headers, body = conn.read_response()
        assert (status, json.loads(body)["error"]) == (400, (
            f"request JSON size of 1000000000 bytes exceeds the maximum allowed input size of {64 << 20} bytes. "
            "Use --http-max-input-size to increase the limit."))
        assert headers["connection"] == "close"
        assert conn.closed_by_peer()
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_oversized_chunked_body(server: openinfer.Server) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * (1 << 20)
        status = None
        try:
            for _ in range(80):  # 80 MiB > the fixture's 64 MiB limit
                conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            status, _, body = conn.read_response()
        except (ConnectionError, ConnectionResetError):
            status = 400  # the server may reset after answering; the check below still holds
        assert status == 400
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_oversized_headers(server: openinfer.Server) -> None:
    conn = Http(server.http_port)
    try:
        status, _, body = conn.request("GET", "/v2/health/live", headers={"X-Big": "a" * 70000})
        assert status == 431 and "max_header_bytes" in json.loads(body)["error"]
    finally:
        conn.close()
    assert_alive(server.http_port)


@pytest.mark.parametrize("garbage", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"GET /v2/health/live HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/1.1\r\nExpect: something-else\r\n\r\n",
    b"GET /v2/health/live HTTP/1.1\r\nInference-Header-Content-Length: -4\r\n\r\n",
])
def test_bad_framing_gets_4xx_and_close(server: openinfer.Server, garbage: bytes) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(garbage)
        status, headers, body = conn.read_response()
        assert 400 <= status < 500 and json.loads(body)["error"]
        assert headers["connection"] == "close"
    finally:
        conn.close()
    assert_alive(server.http_port)


FOLDED = "malformed HTTP request: a header line begins with whitespace (obsolete line folding is not accepted, " \
         "RFC 9112 section 5.2)"


def send_bytewise(conn: Http, data: bytes, until_answered: bool = False) -> None:
    """Writes `data` a byte at a time, so that the server reads it in pieces split anywhere;
    `until_answered`: stops once the server answers (a refusal closes the connection)."""
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(len(data)):
        if select.select([conn.sock], [], [], 0.001)[0] and until_answered:
            return
        conn.send(data[i:i + 1])


# A line that begins with whitespace, after a header (obsolete line folding: continuing a value,
# an empty one, whitespace only, a Content-Length that llhttp would call a duplicate) or after the
# request line.
WHITESPACE_LINES = {
    "fold": b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  b\r\n\r\n",
    "fold-tab": b"GET /v2/health/live HTTP/1.1\r\nX-A: a\r\n\tb\r\nHost: x\r\n\r\n",
    "fold-of-empty": b"GET /v2/health/live HTTP/1.1\r\nX-A:\r\n b\r\nHost: x\r\n\r\n",
    "fold-of-blank": b"GET /v2/health/live HTTP/1.1\r\nX-A: \r\n \t b\r\n\r\n",
    "fold-content-length": b"POST /v2/health/live HTTP/1.1\r\nContent-Length: 1\r\n Content-Length: 1\r\n\r\nx",
    "fold-transfer-encoding": b"POST /v2/health/live HTTP/1.1\r\nTransfer-Encoding: chunked\r\n gzip\r\n\r\n0\r\n\r\n",
    "after-request-line": b"GET /v2/health/live HTTP/1.1\r\n Host: x\r\n\r\n",
}


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("name", list(WHITESPACE_LINES))
def test_header_line_beginning_with_whitespace_refused(server: openinfer.Server, name: str, bytewise: bool) -> None:
    conn = Http(server.http_port)
    try:
        send_bytewise(conn, WHITESPACE_LINES[name], until_answered=True) if bytewise else conn.send(WHITESPACE_LINES[name])
        status, headers, body = conn.read_response()
        assert (status, json.loads(body)) == (400, {"error": FOLDED})
        assert headers["connection"] == "close"
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_header_values_lose_surrounding_whitespace_only(server: openinfer.Server) -> None:
    # Spaces and tabs around values (and inside them, and empty values) are no folds; the values
    # the server reads lose the whitespace around them. Pipelined, and then split anywhere.
    # (Content-Length takes none after its digits: llhttp refuses that, which is safe.)
    body = SIMPLE_BODY
    request = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost:  x \r\nX-Empty:\r\nX-Blank: \t \r\n"
               b"X-Inner: a  b\t c\r\nExpect: 100-continue \t\r\n"
               b"Content-Type: \tapplication/json\r\nContent-Length:  %d\r\n\r\n" % len(body) + body)
    for write in (Http.send, send_bytewise):
        conn = Http(server.http_port)
        try:
            write(conn, request * 2)
            for _ in range(2):
                status, _, answer = conn.read_response()
                if status == 100:
                    status, _, answer = conn.read_response()
                check_simple(status, answer)
        finally:
            conn.close()


def test_slow_client_times_out(server: openinfer.Server) -> None:
    # The fixture's header_timeout_ms is 1500: a request that dribbles in slower is cut.
    conn = Http(server.http_port)
    try:
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n")
        for _ in range(6):
            time.sleep(0.5)
            try:
                conn.send(b"X-Slow: 1\r\n")  # bytes keep coming, but the deadline holds
            except (BrokenPipeError, ConnectionResetError):
                break
        status, _, body = conn.read_response()
        assert status == 408 and "timed out" in json.loads(body)["error"]
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_client_gone_mid_request(server: openinfer.Server) -> None:
    # Half a body, then gone; and a client that leaves while its slow request runs.
    conn = Http(server.http_port)
    conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{\"inputs\":")
    conn.close()
    conn = Http(server.http_port)
    conn.send(encode_request("POST", "/v2/models/slow/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [200]}])))
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()  # reset while the model runs
    time.sleep(0.4)
    assert_alive(server.http_port)


def test_hundreds_of_concurrent_requests(url: str) -> None:
    def one(i: int) -> None:
        a = [(i + k) % 1000 for k in range(16)]
        b = [k for k in range(16)]
        body = infer_body([
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b},
        ], id=str(i))
        with requests.Session() as s:
            for _ in range(5):
                r = s.post(url + "/v2/models/simple/infer", data=body, timeout=60)
                assert r.status_code == 200
                out = r.json()
                assert out["id"] == str(i)
                assert out["outputs"][0]["data"] == [x + y for x, y in zip(a, b)]
                assert out["outputs"][1]["data"] == [x - y for x, y in zip(a, b)]

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(one, range(200)))


def test_many_raw_connections_at_once(server: openinfer.Server) -> None:
    conns = [Http(server.http_port) for _ in range(200)]
    try:
        for c in conns:
            c.send(encode_request("POST", "/v2/models/simple/infer", SIMPLE_BODY))
        for c in conns:
            status, _, body = c.read_response()
            check_simple(status, body)
    finally:
        for c in conns:
            c.close()


def test_client_that_never_reads_does_not_stall_others(server: openinfer.Server) -> None:
    hog = Http(server.http_port)
    try:
        big = infer_body([{"name": "INPUT0", "shape": [200_000], "datatype": "FP32", "data": [1.25] * 200_000}])
        req = encode_request("POST", "/v2/models/identity_fp32/infer", big)
        stop = threading.Event()

        def flood() -> None:
            try:
                while not stop.is_set():
                    hog.send(req)
            except OSError:
                pass

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        time.sleep(0.5)
        for _ in range(5):
            assert_alive(server.http_port)
        stop.set()
    finally:
        hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        hog.close()
    assert_alive(server.http_port)


def test_numpy_float_payload_exact(url: str) -> None:
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    body = infer_body([{"name": "INPUT0", "shape": [1000], "datatype": "FP32", "data": x.tolist()}])
    r = requests.post(url + "/v2/models/identity_fp32/infer", data=body, timeout=30)
    got = np.array(r.json()["outputs"][0]["data"], dtype=np.float32)
    assert np.array_equal(got, x)


def test_head_answer_has_no_body(server: openinfer.Server, http: Http) -> None:
    """An answer to HEAD says its body's length and sends no body: a client reads none, so
    body bytes would be taken for the next response (found by tests/fuzz/fuzz_http1.c, whose
    harness reads the answers as a client does). Whatever the route answers HEAD with, the
    connection stays in step."""
    from http.client import HTTPConnection

    conn = HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        for path in ("/v2/health/live", "/v2/models/simple", "/v2/no/such/route"):
            conn.request("HEAD", path)
            r = conn.getresponse()
            assert r.read() == b"" and int(r.getheader("Content-Length")) > 0
            conn.request("GET", "/v2/health/live")  # same connection: still in step
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())) == (200, {"live": True})
    finally:
        conn.close()
    # Pipelined on a raw socket: the bytes after the HEAD answer's header block are the next
    # answer's status line.
    http.send(encode_request("HEAD", "/v2/models/simple") + encode_request("GET", "/v2/health/live"))
    while http.buf.count(b"\r\n\r\n") < 2:
        assert http._fill(), http.buf
    first, rest = http.buf.split(b"\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 ") and rest.startswith(b"HTTP/1.1 200 OK\r\n"), http.buf
