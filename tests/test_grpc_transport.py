"""The gRPC transport (h2c on nghttp2) on raw HTTP/2 connections (the `h2` library) and raw
sockets: framing, content-type, timeouts, resets, truncated frames, concurrency, limits and
draining. The server stays up and, under the sanitizer run, leaks nothing."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

import openinfer
from conftest import assert_alive, assert_grpc_alive

SERVICE = "/inference.GRPCInferenceService/"


def frame(msg: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(msg)) + msg


class H2:
    """A client HTTP/2 connection with prior knowledge, for byte-level control."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()
        self.streams: dict[int, dict[str, Any]] = {}
        self.goaway = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(self, path: str, content_type: str = "application/grpc", method: str = "POST",
              extra: list[tuple[str, str]] | None = None, end: bool = False) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                   ("content-type", content_type), ("te", "trailers"), *(extra or [])]
        self.conn.send_headers(sid, headers, end_stream=end)
        self.streams[sid] = {"headers": {}, "data": b"", "trailers": {}, "ended": False, "reset": None}
        self.flush()
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        self.conn.send_data(sid, data, end_stream=end)
        self.flush()

    def call(self, path: str, msg: bytes, **kw: Any) -> int:
        sid = self.start(path, **kw)
        self.send(sid, frame(msg), end=True)
        return sid

    def pump(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        for ev in self.conn.receive_data(data):
            st = self.streams.get(getattr(ev, "stream_id", 0))
            if isinstance(ev, h2.events.ResponseReceived):
                st["headers"] = dict(ev.headers)
            elif isinstance(ev, h2.events.TrailersReceived):
                st["trailers"] = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                st["data"] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                st["ended"] = True
            elif isinstance(ev, h2.events.StreamReset):
                if st is not None:
                    st["reset"] = ev.error_code
                    st["ended"] = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = True
        self.flush()

    def wait(self, *sids: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not all(self.streams[s]["ended"] for s in sids):
            assert time.monotonic() < deadline, "timed out waiting for the answer"
            self.pump()
        return [self.streams[s] for s in sids]

    def close(self) -> None:
        self.sock.close()


def status_of(st: dict[str, Any]) -> tuple[str, str, str]:
    """(:status, grpc-status, grpc-message) from the trailers or a Trailers-Only answer."""
    where = st["trailers"] or st["headers"]
    return st["headers"].get(":status", ""), where.get("grpc-status", ""), where.get("grpc-message", "")


@pytest.fixture
def h2c(server: openinfer.Server) -> Any:
    conn = H2(server.grpc_port)
    yield conn
    conn.close()


def test_unary_answer_shape(h2c: H2) -> None:
    [st] = h2c.wait(h2c.call(SERVICE + "ServerLive", b""))
    assert st["headers"][":status"] == "200" and st["headers"]["content-type"] == "application/grpc"
    assert st["data"] == frame(b"\x08\x01")
    assert st["trailers"] == {"grpc-status": "0"}


def test_wrong_content_type_is_415(h2c: H2, server: openinfer.Server) -> None:
    sid = h2c.start(SERVICE + "ServerLive", content_type="application/json")
    h2c.send(sid, b"{}", end=True)
    [st] = h2c.wait(sid)
    assert st["headers"][":status"] == "415"
    assert "application/grpc" in st["headers"]["grpc-message"]
    # The connection stays usable.
    [st] = h2c.wait(h2c.call(SERVICE + "ServerLive", b""))
    assert status_of(st)[1] == "0"


def test_get_is_refused(h2c: H2) -> None:
    [st] = h2c.wait(h2c.start(SERVICE + "ServerLive", method="GET", end=True))
    assert st["headers"][":status"] == "405"


def test_trailers_only_for_immediate_errors(h2c: H2) -> None:
    [st] = h2c.wait(h2c.call(SERVICE + "NoSuchMethod", b""))
    assert st["headers"][":status"] == "200" and st["data"] == b"" and not st["trailers"]
    assert st["headers"]["grpc-status"] == "12"
    assert "NoSuchMethod" in st["headers"]["grpc-message"]


def test_grpc_message_is_percent_encoded(h2c: H2) -> None:
    msg = b"\x0a\x05caf\xc3\xa9"  # ModelInferRequest{model_name: "café"}
    [st] = h2c.wait(h2c.call(SERVICE + "ModelInfer", msg))
    _, code, text = status_of(st)
    assert code == "5" and "caf%C3%A9" in text


def test_compressed_flag_without_an_encoding_is_internal(h2c: H2) -> None:
    # The gRPC compression spec: a compressed flag with no grpc-encoding (or identity) is
    # INTERNAL; test_grpc_compression.py covers real compression.
    sid = h2c.start(SERVICE + "ServerLive")
    h2c.send(sid, frame(b"", flag=1), end=True)
    [st] = h2c.wait(sid)
    _, code, text = status_of(st)
    assert code == "13" and "compressed flag is set but the call has no grpc-encoding" in text


def test_grpc_timeout_is_honoured(h2c: H2, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    req = pb.ModelInferRequest(model_name="slow")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    req.raw_input_contents.append(struct.pack("<i", 800))  # sleeps 800 ms
    sid = h2c.start(SERVICE + "ModelInfer", extra=[("grpc-timeout", "100m")])
    h2c.send(sid, frame(req.SerializeToString()), end=True)
    [st] = h2c.wait(sid)
    _, code, text = status_of(st)
    assert code == "4" and "deadline" in text
    # The late answer of the model is dropped and the connection goes on.
    time.sleep(0.8)
    [st] = h2c.wait(h2c.call(SERVICE + "ServerLive", b""))
    assert status_of(st)[1] == "0"


def test_reset_mid_message(h2c: H2, server: openinfer.Server) -> None:
    sid = h2c.start(SERVICE + "ModelInfer")
    h2c.send(sid, struct.pack(">BI", 0, 1 << 20) + b"x" * 1000)
    h2c.conn.reset_stream(sid)
    h2c.flush()
    [st] = h2c.wait(h2c.call(SERVICE + "ServerLive", b""))
    assert status_of(st)[1] == "0"
    assert_grpc_alive(server.grpc_port)


def test_end_inside_a_message(h2c: H2) -> None:
    sid = h2c.start(SERVICE + "ModelInfer")
    h2c.send(sid, struct.pack(">BI", 0, 100) + b"x" * 10, end=True)
    [st] = h2c.wait(sid)
    _, code, text = status_of(st)
    assert code == "13" and "truncated" in text


def test_many_concurrent_streams_on_one_connection(h2c: H2) -> None:
    sids = [h2c.call(SERVICE + "ServerLive", b"") for _ in range(300)]
    for st in h2c.wait(*sids):
        assert st["data"] == frame(b"\x08\x01") and status_of(st)[1] == "0"


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # HTTP/1.1 on the gRPC port
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x64\x01\x04\x00\x00\x00\x01" + b"\x00" * 10,  # truncated frame
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x08\x00\x00\x00\x00\x00",  # WINDOW_UPDATE cut short
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff" + b"\x00" * 64,  # nonsense frame
])
def test_bad_bytes_and_truncated_frames(server: openinfer.Server, garbage: bytes) -> None:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10)
    sock.sendall(garbage)
    sock.shutdown(socket.SHUT_WR)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    sock.close()
    assert_grpc_alive(server.grpc_port)
    assert_alive(server.http_port)


def test_client_disconnects_with_calls_in_flight(server: openinfer.Server, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    conn = H2(server.grpc_port)
    for _ in range(4):
        req = pb.ModelInferRequest(model_name="slow")
        req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        req.raw_input_contents.append(struct.pack("<i", 200))
        conn.call(SERVICE + "ModelInfer", req.SerializeToString())
    time.sleep(0.05)
    conn.close()
    time.sleep(0.4)  # the answers arrive for a connection that is gone
    assert_grpc_alive(server.grpc_port)


def test_message_over_the_limit() -> None:
    with openinfer.serve(http_port=0, log=False, grpc_max_message_bytes=1024) as srv:
        conn = H2(srv.grpc_port)
        try:
            sid = conn.start(SERVICE + "ModelInfer")
            conn.send(sid, struct.pack(">BI", 0, 4096) + b"x" * 100)
            [st] = conn.wait(sid)
            _, code, text = status_of(st)
            assert code == "8" and "over the server's limit of 1024 bytes" in text
        finally:
            conn.close()


def test_shutdown_drains_calls_and_sends_goaway(grpc_stubs: Any) -> None:
    """A call under way when the stop begins (the idle connection told to go away shows it has)
    finishes; the model is held at a gate until then, so the order is forced, not timed."""
    import grpc
    import numpy as np

    from conftest import test_models

    entered, release = threading.Event(), threading.Event()

    def held(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        entered.set()
        release.wait(60)  # a bound for the test; released below
        return {"OUTPUT0": inputs["INPUT0"]}

    one_int = dict(inputs=[openinfer.Tensor("INPUT0", "INT32", [-1])], outputs=[openinfer.Tensor("OUTPUT0", "INT32", [-1])])
    pb = grpc_stubs.pb
    srv = openinfer.serve(models=[*test_models(), openinfer.Model("held", held, **one_int)], http_port=0, log=False,
                          threads=1)
    idle = H2(srv.grpc_port)
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
    req = pb.ModelInferRequest(model_name="held", id="drained")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    req.raw_input_contents.append(struct.pack("<i", 300))
    future = stub.ModelInfer.future(req, timeout=60)
    assert entered.wait(60), "the call never reached the model"
    stopper = threading.Thread(target=srv.stop, kwargs={"timeout": 60})
    stopper.start()
    try:
        deadline = time.monotonic() + 60  # a bound for a hung test
        while not idle.goaway and time.monotonic() < deadline:
            idle.pump()  # the idle connection is told to go away
        assert idle.goaway
        release.set()
        assert future.result().id == "drained"  # the call under way finishes
    finally:
        release.set()
        stopper.join()
        idle.close()
        channel.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=2).close()
