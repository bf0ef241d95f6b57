"""openinfer.Client over gRPC (grpc://) against real sockets, beyond what test_client.py runs
on both transports: answers equal to the HTTP side's, large tensors, zero-copy, every status,
deadlines, servers that go away or misbehave, streaming, and several calls on one connection
(the C core's _core.GrpcConnection)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import Client, InferenceServerError, Model, Tensor, _core

SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)
SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def grpc_url(server: openinfer.Server) -> str:
    return server.grpc_url


@pytest.fixture(scope="module")
def client(grpc_url: str) -> Iterator[Client]:
    with Client(grpc_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def http_client(url: str) -> Iterator[Client]:
    with Client(url, timeout=60) as c:
        yield c


def simple(i: int = 0) -> dict[str, np.ndarray]:
    return {"INPUT0": SIMPLE_A + i, "INPUT1": SIMPLE_B}


# ---- the same answers as over HTTP --------------------------------------------------------


def test_url_and_default_port() -> None:
    assert Client("grpc://example.com").url == "grpc://example.com"
    assert Client("grpc://example.com")._port == 8001
    assert Client("grpc://[::1]:9001")._port == 9001
    with pytest.raises(ValueError, match="no path"):
        Client("grpc://example.com:8001/v2")


@pytest.mark.parametrize("model,version", [("simple", None), ("versioned", "1"), ("versioned", 3),
                                           ("identity_fp32", None), ("echo_bytes", None), ("matrix", None)])
def test_metadata_equals_http(client: Client, http_client: Client, model: str, version: Any) -> None:
    assert client.model_metadata(model, version) == http_client.model_metadata(model, version)
    assert client.is_model_ready(model, version) == http_client.is_model_ready(model, version)


def test_server_metadata_and_health_equal_http(client: Client, http_client: Client) -> None:
    assert client.server_metadata() == http_client.server_metadata()
    assert client.is_server_live() and client.is_server_ready() == http_client.is_server_ready()


def test_infer_equals_http(client: Client, http_client: Client) -> None:
    for model, inputs in [("simple", simple(3)), ("matrix", {"INPUT0": np.random.rand(3, 2, 3).astype(np.float32)}),
                          ("echo_bytes", {"INPUT0": np.array([b"a", b"", "\u00e9".encode()], dtype=object)}),
                          ("echo_bool", {"INPUT0": np.zeros(0, bool)})]:
        g, h = client.infer(model, inputs), http_client.infer(model, inputs)
        assert list(g) == list(h)
        for name in g:
            assert g[name].dtype == h[name].dtype and g[name].shape == h[name].shape
            assert g[name].tolist() == h[name].tolist()


def test_request_id_version_and_every_parameter_type(client: Client) -> None:
    out = client.infer("params", {"INPUT0": np.zeros(1, np.int32)},
                       parameters={"b": True, "i": -(2**63), "u": 2**64 - 1, "f": 0.25, "s": "\u00e9", "x": b"raw"})
    import json
    assert json.loads(out["OUTPUT0"][0]) == {"b": True, "i": -(2**63), "u": 2**64 - 1, "f": 0.25, "s": "\u00e9",
                                             "x": "raw"}
    with pytest.raises(TypeError, match="parameter 'bad'"):
        client.infer("params", {"INPUT0": np.zeros(1, np.int32)}, parameters={"bad": [1]})
    with pytest.raises(OverflowError, match="'big'"):
        client.infer("params", {"INPUT0": np.zeros(1, np.int32)}, parameters={"big": 2**64})
    assert client.infer("versioned", {"INPUT0": np.zeros(2, np.int32)}, version="2",
                        request_id="r-1")["OUTPUT0"].tolist() == [2, 2]


def test_bf16_raw_with_ml_dtypes_or_bits(client: Client) -> None:
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0xFFC1], np.uint16)
    out = client.infer("echo_bf16", {"INPUT0": bits}, datatypes={"INPUT0": "BF16"})["OUTPUT0"]
    assert out.view(np.uint16).tolist() == bits.tolist()
    half = np.array([1.5, -0.0, np.inf, 65504], np.float16)
    out = client.infer("echo_fp16", {"INPUT0": half})["OUTPUT0"]
    assert out.dtype == np.float16 and out.shape == (4,) and out.tobytes() == half.tobytes()


# ---- large tensors and zero-copy --------------------------------------------------------------


@pytest.mark.parametrize("mib", [16, 64])
def test_large_tensors(client: Client, mib: int) -> None:
    x = np.random.default_rng(mib).random((mib << 20) // 4, dtype=np.float32)
    out = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
    assert out.shape == x.shape and np.array_equal(out, x)
    assert not out.flags.owndata and out.base is not None


def test_outputs_point_into_one_received_message(client: Client) -> None:
    out = client.infer("simple", simple(1))
    a, b = out["OUTPUT0"], out["OUTPUT1"]
    assert a.base is b.base and not a.flags.owndata and a.flags.writeable
    # Both live in the one reassembled ModelInferResponse, a few bytes apart.
    assert 0 < b.ctypes.data - a.ctypes.data < 4096


RSS_CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from openinfer import Client

    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10

    n = int(sys.argv[2])
    with Client(sys.argv[1], timeout=120) as c:
        c.infer("identity_fp32", {"INPUT0": np.ones(1024, np.float32)})  # connection and warm-up
        x = np.ones(n // 4, np.float32)  # pages touched: counted in the baseline
        base = peak()
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert out.shape == x.shape and out[-1] == 1.0
        print(peak() - base)
""")


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="RSS is not meaningful under ASan")
def test_one_copy_of_each_tensor_in_client_memory(grpc_url: str) -> None:
    # A client in its own process (the session server shares this one): sending 64 MiB and
    # receiving 64 MiB back may grow its peak RSS by the received message only. A copy of the
    # input, or of the output after reassembly, would add another 64 MiB.
    n = 64 << 20
    r = subprocess.run([sys.executable, "-c", RSS_CHILD, grpc_url, str(n)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    growth = int(r.stdout.split()[-1])
    assert growth < n + (24 << 20), f"peak RSS grew by {growth >> 20} MiB for a {n >> 20} MiB round trip"


# ---- statuses ----------------------------------------------------------------------------------


def test_statuses_map_like_http(client: Client) -> None:
    cases = [
        (lambda: client.infer("nope", {"X": np.zeros(1)}), 404, "Request for unknown model: 'nope' is not found"),
        (lambda: client.model_metadata("simple", "9"), 404, "version"),
        (lambda: client.infer("simple", {"INPUT0": SIMPLE_A}), 400, "but missing required input(s) ['INPUT1']"),
        (lambda: client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": np.ones((1, 15), np.int32)}), 400, "shape"),
        (lambda: client.infer("raises", {"INPUT0": np.zeros(1, np.int32)}), 500, "refuses negative numbers"),
        (lambda: client.infer("wrong_dtype", {"INPUT0": np.zeros(1, np.int32)}), 500, "OUTPUT0"),
    ]
    for call, status, text in cases:
        with pytest.raises(InferenceServerError) as e:
            call()
        assert e.value.status == status and text in e.value.message, (status, e.value)
    assert client.is_model_ready("nope") is False


def test_unimplemented_and_not_found_through_the_connection(server: openinfer.Server) -> None:
    conn = _core.GrpcConnection("127.0.0.1", server.grpc_port)
    status, message = conn.unary(SERVICE + "NoSuchRpc", b"")
    assert status == 12 and "not implemented" in message  # UNIMPLEMENTED
    status, message = conn.unary("/other.Service/Call", b"")
    assert status == 12 and "unknown service" in message
    assert conn.unary(SERVICE + "ServerLive", b"") == (0, b"\x08\x01")
    status, message = conn.unary(SERVICE + "ModelMetadata", b"\x0a\x04nope")
    assert status == 5 and message == "Request for unknown model: 'nope' is not found"
    # A percent-encoded grpc-message comes back decoded.
    status, message = conn.unary(SERVICE + "ModelMetadata", "\x0a\x05n\u00e9%\n".encode())
    assert status == 5 and message == "Request for unknown model: 'n\u00e9%\n' is not found"
    conn.close()
    from openinfer.client import _grpc_error
    assert _grpc_error(12, "x").status == 501 and _grpc_error(14, "x").status == 503
    assert isinstance(_grpc_error(4, "late"), TimeoutError)


def test_model_not_ready_is_503(tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\ninput [{name: "X" data_type: TYPE_FP32 dims: [1]}]\n'
        'output [{name: "Y" data_type: TYPE_FP32 dims: [1]}]\n')
    (repo / "broken" / "1" / "model.py").write_text("def infer(inputs):\n    return {\n")
    with openinfer.serve(repo, http_port=0, log=False) as srv, Client(srv.grpc_url) as c:
        assert c.is_model_ready("broken") is False and c.is_server_ready() is False
        with pytest.raises(InferenceServerError) as e:
            c.infer("broken", {"X": np.zeros(1, np.float32)})
        assert e.value.status == 503 and "SyntaxError" in e.value.message
        with pytest.raises(InferenceServerError) as e:
            c.model_metadata("broken")
        assert e.value.status == 503


# ---- deadlines and connections ---------------------------------------------------------------------


def test_deadline_cancels_the_call_and_the_connection_goes_on(server: openinfer.Server) -> None:
    conn = _core.GrpcConnection("127.0.0.1", server.grpc_port)
    try:  # the server's DEADLINE_EXCEEDED, or our deadline first (then the stream is reset)
        status, message = conn.infer("slow", [("INPUT0", "INT32", np.array([2000], np.int32))], timeout=0.2)
        assert status == 4 and "deadline" in message
    except TimeoutError as e:
        assert "timed out" in str(e)
    # Same connection: the timed-out stream was reset, the connection stays.
    status, result = conn.infer("slow", [("INPUT0", "INT32", np.array([1], np.int32))], timeout=10)
    assert status == 0 and result[3]["OUTPUT0"].tolist() == [1]
    conn.close()


def test_timeout_while_sending_a_large_request() -> None:
    # A server that reads nothing: the request cannot leave, the deadline ends the call.
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        port = lsock.getsockname()[1]
        conn = _core.GrpcConnection("127.0.0.1", port)
        x = np.zeros(32 << 20, np.uint8)
        with pytest.raises(TimeoutError):
            conn.infer("m", [("INPUT0", "UINT8", x)], timeout=0.5)
        conn.close()


@pytest.mark.parametrize("behaviour", ["close", "garbage", "half_message"])
def test_a_server_that_misbehaves_gives_connection_error(behaviour: str) -> None:
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        port = lsock.getsockname()[1]

        def serve_once() -> None:
            s, _ = lsock.accept()
            with s:
                s.recv(65536)
                if behaviour == "garbage":
                    s.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                elif behaviour == "half_message":
                    # SETTINGS, then HEADERS for stream 1 (:status 200, HPACK static index 8)
                    # and a DATA frame holding half of a 100-byte message; then the close.
                    s.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                    s.sendall(b"\x00\x00\x01\x01\x04\x00\x00\x00\x01\x88")
                    s.sendall(b"\x00\x00\x0a\x00\x00\x00\x00\x00\x01" + b"\x00\x00\x00\x00\x64" + b"abcde")
                    time.sleep(0.2)

        t = threading.Thread(target=serve_once)
        t.start()
        with Client(f"grpc://127.0.0.1:{port}", timeout=10) as c, pytest.raises(ConnectionError):
            c.infer("m", {"X": np.zeros(4, np.float32)})
        t.join()


class FakeGrpcServer:
    """An HTTP/2 server (the h2 library) that answers each call with a scripted behaviour, one
    script per accepted connection: for what a correct server never sends."""

    def __init__(self, *scripts: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.scripts = list(scripts)
        self.headers: list[dict[str, str]] = []  # each call's request headers
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import h2.config
        import h2.connection
        import h2.events

        for script in self.scripts:
            s, _ = self.sock.accept()
            with s:
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
                conn.initiate_connection()
                s.sendall(conn.data_to_send())
                live = True
                while live:
                    data = s.recv(65536)
                    if not data:
                        break
                    for ev in conn.receive_data(data):
                        if isinstance(ev, h2.events.RequestReceived):
                            self.headers.append({k.decode(): v.decode() for k, v in ev.headers})
                        if isinstance(ev, h2.events.DataReceived):
                            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                        if isinstance(ev, h2.events.StreamEnded):
                            live = script(conn, ev.stream_id)
                    s.sendall(conn.data_to_send())
                time.sleep(0.2)

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()


OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def _trailers_only(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, OK_HEADERS + [("grpc-status", "5"), ("grpc-message", "gone%20away%21 %E2%9C%93")],
                      end_stream=True)
    return False


def _http_503(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, [(":status", "503")], end_stream=True)
    return False


def _compressed(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, OK_HEADERS)
    conn.send_data(sid, b"\x01\x00\x00\x00\x02\x08\x01")
    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    return False


def _truncated(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, OK_HEADERS)
    conn.send_data(sid, b"\x00\x00\x00\x00\x64" + b"x" * 10)
    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    return False


def _two_messages(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, OK_HEADERS)
    conn.send_data(sid, b"\x00\x00\x00\x00\x02\x08\x01" * 2)
    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    return False


def _reset(conn: Any, sid: int) -> bool:
    conn.reset_stream(sid, 2)  # INTERNAL_ERROR
    return False


def _refuse(conn: Any, sid: int) -> bool:
    conn.reset_stream(sid, 7)  # REFUSED_STREAM: not processed, safe to retry
    return False


def _live(conn: Any, sid: int) -> bool:
    conn.send_headers(sid, OK_HEADERS)
    conn.send_data(sid, b"\x00\x00\x00\x00\x02\x08\x01")
    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    return True


@pytest.mark.parametrize("script,status,text", [
    (_trailers_only, 5, "gone away! \u2713"),
    (_http_503, 14, "HTTP 503"),
    (_compressed, 13, "compressed"),
    (_truncated, 13, "truncated"),
    (_two_messages, 13, "more than one message"),
    (_reset, 13, "INTERNAL_ERROR"),
])
def test_statuses_from_what_the_server_sent(script: Any, status: int, text: str) -> None:
    srv = FakeGrpcServer(script)
    conn = _core.GrpcConnection("127.0.0.1", srv.port)
    got = conn.unary(SERVICE + "ServerLive", b"", timeout=10)
    assert got[0] == status and text in got[1], got
    conn.close()
    srv.close()


def test_request_headers_and_grpc_timeout() -> None:
    srv = FakeGrpcServer(_live)
    conn = _core.GrpcConnection("127.0.0.1", srv.port)
    assert conn.server_live(timeout=2.5) == (0, True)
    assert conn.server_live() == (0, True)
    conn.close()
    srv.close()
    first, second = srv.headers
    assert first[":method"] == "POST" and first[":scheme"] == "http" and first["te"] == "trailers"
    assert first[":path"] == SERVICE + "ServerLive" and first[":authority"] == f"127.0.0.1:{srv.port}"
    assert first["content-type"] == "application/grpc"
    # What is left of the 2.5 s, in milliseconds (how much is left depends on the machine's speed).
    assert first["grpc-timeout"].endswith("m") and 0 < int(first["grpc-timeout"][:-1]) <= 2500
    assert "grpc-timeout" not in second


def test_a_refused_call_is_made_again_on_a_new_connection() -> None:
    srv = FakeGrpcServer(_refuse, _live)
    with Client(f"grpc://127.0.0.1:{srv.port}", timeout=10) as c:
        assert c.is_server_live()
    srv.close()


def test_server_goes_away_and_comes_back() -> None:
    model = Model("id", lambda x: {"Y": x["X"]}, inputs=[Tensor("X", "INT64", [-1])],
                  outputs=[Tensor("Y", "INT64", [-1])])
    srv = openinfer.serve(models=[model], http_port=0, log=False)
    port = srv.grpc_port
    with Client(srv.grpc_url, timeout=10) as c:
        assert c.infer("id", {"X": np.arange(3)})["Y"].tolist() == [0, 1, 2]
        srv.stop()
        with pytest.raises(ConnectionError):
            c.infer("id", {"X": np.arange(3)})
        with pytest.raises(ConnectionError):
            c.is_server_live()
        srv = openinfer.serve(models=[model], http_port=0, grpc_port=port, log=False)
        try:
            assert c.infer("id", {"X": np.arange(4)})["Y"].tolist() == [0, 1, 2, 3]  # reconnected
        finally:
            srv.stop()


def test_many_threads_many_connections(grpc_url: str) -> None:
    errors: list[BaseException] = []
    with Client(grpc_url, max_connections=4) as c:
        def worker(k: int) -> None:
            try:
                for i in range(40):
                    x = np.full(1000 + k, i, np.float32)
                    out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
                    assert np.array_equal(out, x)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(c._idle) <= 4
    assert not errors, errors[0]


def test_several_calls_at_once_on_one_connection(server: openinfer.Server) -> None:
    # The C connection multiplexes: two streams and unary calls interleave on one socket.
    conn = _core.GrpcConnection("127.0.0.1", server.grpc_port)
    s1, s2 = conn.stream("simple"), conn.stream("identity_fp32")
    for i in range(5):
        assert s1.send([("INPUT0", "INT32", SIMPLE_A + i), ("INPUT1", "INT32", SIMPLE_B)], str(i))
        assert s2.send([("INPUT0", "FP32", np.full(3, i, np.float32))], str(i))
        assert conn.server_live() == (0, True)
    s1.close_send()
    got1 = []
    while (r := s1.recv()) is not None:
        got1.append(int(r[1][3]["OUTPUT0"][0, 0]))
    assert s1.status() == (0, "")
    s2.close_send()
    got2 = []
    while (r := s2.recv()) is not None:
        got2.append(float(r[1][3]["OUTPUT0"][0]))
    assert sorted(got1) == [1, 2, 3, 4, 5] and sorted(got2) == [0, 1, 2, 3, 4]
    s1.close()
    s2.close()
    assert conn.infer("simple", [("INPUT0", "INT32", SIMPLE_A), ("INPUT1", "INT32", SIMPLE_B)])[0] == 0
    conn.close()


def test_many_streams_open_at_once_on_one_connection(server: openinfer.Server) -> None:
    conn = _core.GrpcConnection("127.0.0.1", server.grpc_port)
    streams = [conn.stream("simple") for _ in range(60)]
    for i, s in enumerate(streams):  # every stream has a request in flight before any answer is read
        assert s.send([("INPUT0", "INT32", SIMPLE_A + i), ("INPUT1", "INT32", SIMPLE_B)], str(i))
    for i, s in reversed(list(enumerate(streams))):
        error, result = s.recv()
        assert error is None and result[2] == str(i) and result[3]["OUTPUT0"][0, 0] == i + 1
        s.close_send()
        assert s.recv() is None and s.status() == (0, "")
        s.close()
    conn.close()


# ---- streaming -------------------------------------------------------------------------------------


def test_stream_in_request_order(client: Client) -> None:
    # `slow` has 4 instances and sleeps INPUT0 ms: later requests finish first on the server.
    delays = [120, 90, 60, 30, 0, 100, 5, 50]
    reqs = ({"INPUT0": np.array([d], np.int32)} for d in delays)
    assert [int(o["OUTPUT0"][0]) for o in client.stream_infer("slow", reqs)] == delays


def test_stream_errors_at_their_position_and_the_stream_goes_on(client: Client) -> None:
    reqs = [simple(0), {"INPUT0": SIMPLE_A}, simple(2), {"INPUT0": np.zeros(2, np.complex64), "INPUT1": SIMPLE_B},
            {"INPUT0": SIMPLE_A.astype(np.int64), "INPUT1": SIMPLE_B}, simple(5)]
    it = client.stream_infer("simple", reqs)
    assert next(it)["OUTPUT0"][0, 0] == 1
    with pytest.raises(InferenceServerError) as e:
        next(it)
    assert "but missing required input(s) ['INPUT1']" in e.value.message and e.value.status == 500
    assert next(it)["OUTPUT0"][0, 0] == 3
    with pytest.raises(ValueError, match="no V2 datatype"):  # never sent: its own error
        next(it)
    with pytest.raises(InferenceServerError, match="expected datatype INT32, got INT64"):
        next(it)
    assert next(it)["OUTPUT0"][0, 0] == 6
    assert list(it) == []


def test_stream_many_requests_outputs_and_parameters(client: Client) -> None:
    n = 500
    outs = list(client.stream_infer("simple", (simple(i) for i in range(n)), outputs=["OUTPUT1"], max_in_flight=32))
    assert [list(o) for o in outs[:2]] == [["OUTPUT1"]] * 2
    assert [int(o["OUTPUT1"][0, 0]) for o in outs] == [i - 1 for i in range(n)]
    out = list(client.stream_infer("params", [{"INPUT0": np.zeros(1, np.int32)}], parameters={"k": 7}))
    assert out[0]["OUTPUT0"][0] == b'{"k": 7}'
    assert list(client.stream_infer("simple", [])) == []


def test_stream_large_tensors_zero_copy(client: Client) -> None:
    xs = [np.full((8 << 20) // 4, i, np.float32) for i in range(4)]
    for i, out in enumerate(client.stream_infer("identity_fp32", ({"INPUT0": x} for x in xs), max_in_flight=2)):
        y = out["OUTPUT0"]
        assert y.shape == xs[i].shape and y[0] == i and y[-1] == i and not y.flags.owndata


def test_stream_unknown_model_errors_every_request(client: Client) -> None:
    results = []
    for _ in range(3):
        try:
            next(it := client.stream_infer("nope", [simple(0)]))
        except InferenceServerError as e:
            results.append(e.message)
        it.close()
    assert results == ["Request for unknown model: 'nope' is not found"] * 3


def test_stream_closed_early_gives_the_connection_back(grpc_url: str) -> None:
    with Client(grpc_url, max_connections=1) as c:
        with c.stream_infer("slow", ({"INPUT0": np.array([20], np.int32)} for _ in range(100))) as it:
            assert next(it)["OUTPUT0"].tolist() == [20]
        # The one connection is free again, and still works.
        assert c.infer("simple", simple(1))["OUTPUT0"][0, 0] == 2
        it2 = c.stream_infer("simple", [simple(0), simple(1)])
        assert next(it2)["OUTPUT0"][0, 0] == 1
        del it2  # dropped half-way: the connection comes back all the same
        assert c.infer("simple", simple(2))["OUTPUT0"][0, 0] == 3


def test_stream_timeout(client: Client) -> None:
    # 5 s: far past the first answer's 10 ms on a slow machine, far short of the second's 15 s.
    it = client.stream_infer("slow", ({"INPUT0": np.array([d], np.int32)} for d in (10, 15_000)), timeout=5)
    assert next(it)["OUTPUT0"].tolist() == [10]
    with pytest.raises(TimeoutError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert client.infer("simple", simple(0))["OUTPUT0"][0, 0] == 1


def test_stream_over_http_is_not_implemented(http_client: Client) -> None:
    with pytest.raises(NotImplementedError, match="gRPC"):
        http_client.stream_infer("simple", [simple(0)])


def test_async_client_over_grpc(grpc_url: str) -> None:
    async def main() -> tuple[list[int], list[int], bool]:
        async with openinfer.AsyncClient(grpc_url) as c:
            live = await c.is_server_live()
            outs = await asyncio.gather(*[c.infer("simple", simple(i)) for i in range(20)])
            streamed = [int(o["OUTPUT0"][0, 0]) async for o in await c.stream_infer("simple", [simple(i) for i in range(5)])]
            return [int(o["OUTPUT0"][0, 0]) for o in outs], streamed, live

    outs, streamed, live = asyncio.run(main())
    assert live and outs == [i + 1 for i in range(20)] and streamed == [1, 2, 3, 4, 5]
