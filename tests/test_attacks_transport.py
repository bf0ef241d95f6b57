"""Attacks on the transports (issue 17): each test reproduces one way a client could get two
answers to one request, hold connections it does not use, or make the server hold memory or
time it should not. Loopback only, every loop bounded, no timing assertions: behaviour is
proven by status codes and by which connections the server closes."""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import Http, assert_alive, assert_grpc_alive, encode_request, infer_body, pending_requests, wait_for
from test_grpc_transport import H2, SERVICE, frame, status_of

import openinfer
from openinfer import Model, Tensor


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _slow(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(float(inputs["INPUT0"][0]) / 1000.0)
    return {"OUTPUT0": inputs["INPUT0"]}


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
MODELS = [Model("echo", _echo, **ONE_INT), Model("slow", _slow, instances=8, **ONE_INT)]


def small_server(**limits: Any) -> openinfer.Server:
    """A server of its own with the limits under test (one loop thread: eviction order is
    that loop's order), HTTP and gRPC on free ports."""
    return openinfer.serve(models=MODELS, http_port=0, log=False, threads=1, **limits)


def echo_request(value: int = 7) -> bytes:
    return encode_request("POST", "/v2/models/echo/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]))


def echo_ok(conn: Http, value: int = 7) -> bool:
    conn.send(echo_request(value))
    status, _, body = conn.read_response()
    return status == 200 and json.loads(body)["outputs"][0]["data"] == [value]


def closed_without_answer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Reads until the server closes; True when it did within `timeout` (a bound for a hung
    test, not a measurement), having sent no HTTP response."""
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        return False
    return not got.startswith(b"HTTP/")


# ---- one request, one response: Upgrade and CONNECT ----------------------------------------


@pytest.mark.parametrize("method, path", [("GET", "/v2/health/live"), ("POST", "/v2/models/nope/infer")])
def test_upgrade_request_gets_one_answer_then_close(server: openinfer.Server, method: str, path: str) -> None:
    """Connection: Upgrade is refused: the request gets its normal answer, the connection is
    closed (what follows it would be another protocol), and no second response appears."""
    conn = Http(server.http_port)
    try:
        req = encode_request(method, path, b"{}" if method == "POST" else b"",
                             {"Connection": "Upgrade", "Upgrade": "foo"})
        # A pipelining client sends its next request at once; it must not get a stray answer.
        conn.send(req + encode_request("GET", "/v2/health/ready"))
        status, headers, _ = conn.read_response()
        assert status == (200 if method == "GET" else 404)
        assert headers["connection"] == "close"
        assert conn.closed_by_peer()
        assert conn.buf == b"", f"a second response followed: {conn.buf!r}"
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_connect_gets_one_answer_then_close(server: openinfer.Server) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n"
                  + encode_request("GET", "/v2/health/live"))
        status, headers, body = conn.read_response()
        assert status == 405 and "CONNECT" in json.loads(body)["error"]
        assert headers["connection"] == "close"
        assert conn.closed_by_peer()
        assert conn.buf == b"", f"a second response followed: {conn.buf!r}"
    finally:
        conn.close()
    assert_alive(server.http_port)


# ---- connection exhaustion: silent connections, the gRPC preface and idle, per-peer limits --


@pytest.fixture(scope="module")
def quick() -> Iterator[openinfer.Server]:
    """A short first-byte deadline; the idle one far above the tests' bounds, so that only the
    first-byte deadline can close a silent connection in time."""
    srv = small_server(first_byte_timeout_ms=300, idle_timeout_ms=120_000, header_timeout_ms=30_000)
    try:
        yield srv
    finally:
        srv.stop()


def test_silent_http_connection_is_closed_at_first_byte_timeout(quick: openinfer.Server) -> None:
    """A connection that sends nothing no longer holds its slot for the (long) idle timeout."""
    with socket.create_connection(("127.0.0.1", quick.http_port)) as s:
        assert closed_without_answer(s)
    assert_alive(quick.http_port)


def test_silent_grpc_connection_is_closed_at_preface_timeout(quick: openinfer.Server) -> None:
    with socket.create_connection(("127.0.0.1", quick.grpc_port)) as s:
        assert closed_without_answer(s)  # our SETTINGS may come first; then the close
    assert_grpc_alive(quick.grpc_port)


def test_trickled_grpc_preface_is_cut(quick: openinfer.Server) -> None:
    """The preface deadline is not pushed back by bytes: half a preface, then a byte now and
    then, is still cut."""
    magic = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    with socket.create_connection(("127.0.0.1", quick.grpc_port)) as s:
        closed = False
        for b in magic:  # bounded: 24 bytes
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
        assert closed or closed_without_answer(s)
    assert_grpc_alive(quick.grpc_port)


def test_idle_grpc_connection_gets_goaway_but_open_stream_is_kept() -> None:
    """gRPC connections with no open stream are told to go away after the idle timeout (they
    were kept forever); a call that outlasts the idle timeout is not cut."""
    with small_server(idle_timeout_ms=1500) as srv:
        _idle_grpc_goaway(srv)
        assert_grpc_alive(srv.grpc_port)


def _idle_grpc_goaway(srv: openinfer.Server) -> None:
    conn = H2(srv.grpc_port)
    try:
        req = _infer_request("slow", 2500)  # longer than the 1500 ms idle timeout
        sid = conn.call(SERVICE + "ModelInfer", req)
        [st] = conn.wait(sid, timeout=30)
        assert status_of(st)[1] == "0", status_of(st)
        assert not conn.goaway
        deadline = time.monotonic() + 30  # a bound, not a measurement
        while not conn.goaway and time.monotonic() < deadline:
            try:
                conn.pump()
            except ConnectionError:
                break
        assert conn.goaway
    finally:
        conn.close()


def _infer_request(model: str, value: int) -> bytes:
    """A ModelInferRequest by hand (model_name, one INT32 input of shape [1], raw contents)."""
    def ld(field: int, payload: bytes) -> bytes:
        return bytes([field << 3 | 2]) + _varint(len(payload)) + payload

    tensor = ld(1, b"INPUT0") + ld(2, b"INT32") + bytes([3 << 3 | 2]) + _varint(1) + _varint(1)
    return ld(1, model.encode()) + ld(5, tensor) + ld(7, struct.pack("<i", value))


def _varint(v: int) -> bytes:
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def test_full_table_evicts_the_oldest_idle_connection() -> None:
    """With every slot held by silent connections, a new client is served and the oldest
    silent connection is the one closed (it used to be the new client that was refused)."""
    with small_server(max_connections=6, max_connections_per_peer=100, first_byte_timeout_ms=60_000) as srv:
        silent = []
        try:
            for _ in range(6):
                silent.append(Http(srv.http_port))
                time.sleep(0.02)  # accepted in this order (eviction order, not a timing check)
            fresh = Http(srv.http_port)
            try:
                assert echo_ok(fresh)
            finally:
                fresh.close()
            assert silent[0].closed_by_peer(timeout=10)
            assert echo_ok(silent[-1])  # the newest silent one was left alone
        finally:
            for c in silent:
                c.close()


def test_full_grpc_table_evicts_the_oldest_idle_connection() -> None:
    with small_server(max_connections=4, max_connections_per_peer=100, first_byte_timeout_ms=60_000) as srv:
        silent = []
        try:
            for _ in range(4):
                silent.append(socket.create_connection(("127.0.0.1", srv.grpc_port)))
                time.sleep(0.02)
            assert_grpc_alive(srv.grpc_port)
            assert closed_without_answer(silent[0])
        finally:
            for s in silent:
                s.close()


def test_per_peer_limit_refuses_a_busy_address() -> None:
    """One address may hold only max_connections_per_peer connections, HTTP and gRPC alike:
    while all of them have a request with the model, the one over is closed unanswered."""
    import threading

    lock, running, release = threading.Lock(), [0], threading.Event()
    all_running = threading.Event()

    def gate(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with lock:
            running[0] += 1
            if running[0] == 6:
                all_running.set()
        release.wait(30)  # a bound for the test; released below
        return {"OUTPUT0": inputs["INPUT0"]}

    models = [Model("gate", gate, instances=6, **ONE_INT)]
    with openinfer.serve(models=models, http_port=0, log=False, threads=1, max_connections=100,
                         max_connections_per_peer=3, first_byte_timeout_ms=60_000) as srv:
        conns = [Http(srv.http_port) for _ in range(3)]
        calls = [H2(srv.grpc_port) for _ in range(3)]
        try:
            for c in conns:
                c.send(encode_request("POST", "/v2/models/gate/infer", infer_body(
                    [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}])))
            sids = [h.call(SERVICE + "ModelInfer", _infer_request("gate", 1)) for h in calls]
            assert all_running.wait(30)  # every connection of the address is busy now
            over = Http(srv.http_port)
            try:
                over.send(echo_request())
            except OSError:
                pass
            assert closed_without_answer(over.sock)
            over.close()
            with socket.create_connection(("127.0.0.1", srv.grpc_port)) as s:
                assert closed_without_answer(s)
            release.set()
            for c in conns:  # the busy ones were not touched
                status, _, _ = c.read_response()
                assert status == 200
            for h, sid in zip(calls, sids):
                [st] = h.wait(sid, timeout=30)
                assert status_of(st)[1] == "0"
        finally:
            release.set()
            for c in conns:
                c.close()
            for h in calls:
                h.close()


def test_per_peer_limit_displaces_the_address_own_idle_connection() -> None:
    """At its limit, an address's new connection takes the place of that address's oldest idle
    one, rather than being refused: a client can only ever displace itself."""
    with small_server(max_connections=100, max_connections_per_peer=3, first_byte_timeout_ms=60_000) as srv:
        conns = []
        try:
            for _ in range(3):
                conns.append(Http(srv.http_port))
                assert echo_ok(conns[-1])
                time.sleep(0.02)
            fresh = Http(srv.http_port)
            conns.append(fresh)
            assert echo_ok(fresh)
            assert conns[0].closed_by_peer(timeout=10)
            assert echo_ok(conns[2])
        finally:
            for c in conns:
                c.close()


# ---- slow uploads: the body is timed on silence, not as a total -----------------------------


def test_slow_but_progressing_upload_is_not_cut() -> None:
    """The header deadline used to bound the body too: an upload that keeps sending, slower
    than header_timeout_ms in total, got 408. Now only a silent body times out."""
    with small_server(header_timeout_ms=300, body_timeout_ms=3000) as srv:
        body = infer_body([{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [5]}])
        conn = Http(srv.http_port)
        try:
            conn.send(f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                      .encode())
            for i in range(len(body)):  # about 0.1 s a byte: far past the header deadline in total
                conn.send(body[i:i + 1])
                time.sleep(0.1 if i < 12 else 0)
            status, _, out = conn.read_response()
            assert status == 200 and json.loads(out)["outputs"][0]["data"] == [5]
        finally:
            conn.close()


def test_keep_alive_outlasts_a_shorter_request_deadline() -> None:
    """Timeouts are deadlines checked when the connection's timer fires: the timer set for a
    request's header deadline (300 ms) fires while the connection idles between requests, and
    must wait on for the idle deadline (3 s) instead of closing."""
    with small_server(header_timeout_ms=300, idle_timeout_ms=3000) as srv:
        body = infer_body([{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [5]}])
        request = encode_request("POST", "/v2/models/echo/infer", body)
        conn = Http(srv.http_port)
        try:
            for _ in range(2):
                conn.send(request)
                status, _, out = conn.read_response()
                assert status == 200 and json.loads(out)["outputs"][0]["data"] == [5]
                time.sleep(0.8)  # past the header deadline, within the idle one
            assert conn.closed_by_peer(timeout=30)  # the idle deadline closes it, at last
        finally:
            conn.close()


def test_a_request_deadline_earlier_than_the_idle_one_is_kept() -> None:
    """A request that starts on a connection idling with a long deadline (120 s; the first
    byte's as long) is held to its own, earlier header deadline (300 ms): a stalled header is
    answered 408 at once, not after the idle timeout."""
    with small_server(header_timeout_ms=300, idle_timeout_ms=120_000, first_byte_timeout_ms=120_000) as srv:
        conn = Http(srv.http_port)
        try:
            conn.send(encode_request("GET", "/v2/health/live"))
            assert conn.read_response()[0] == 200
            conn.send(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Stalled: ")
            status, headers, body = conn.read_response()  # the socket's 10 s bound, far below 120 s
            assert status == 408 and headers["connection"] == "close"
        finally:
            conn.close()
        assert_alive(srv.http_port)


def test_stalled_body_gets_408() -> None:
    with small_server(header_timeout_ms=300, body_timeout_ms=300) as srv:
        conn = Http(srv.http_port)
        try:
            conn.send(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in")
            status, headers, body = conn.read_response()
            assert status == 408 and "timed out" in json.loads(body)["error"]
            assert headers["connection"] == "close"
        finally:
            conn.close()
        assert_alive(srv.http_port)


# ---- a gRPC client that never reads: responses must not pile up without bound --------------


def _bytes_request(n: int, tag: int) -> bytes:
    """A ModelInferRequest for `echo8` with one UINT8 input of n bytes (raw contents), whose
    first byte is `tag` so that answers can be matched to requests in order."""
    def ld(field: int, payload: bytes) -> bytes:
        return bytes([field << 3 | 2]) + _varint(len(payload)) + payload

    tensor = ld(1, b"INPUT0") + ld(2, b"UINT8") + bytes([3 << 3 | 2]) + _varint(len(_varint(n))) + _varint(n)
    return ld(1, b"echo8") + ld(5, tensor) + ld(7, bytes([tag & 0xFF]) + bytes(n - 1))


def _messages(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 5 <= len(data):
        n = struct.unpack(">I", data[i + 1:i + 5])[0]
        if i + 5 + n > len(data):
            break
        out.append(data[i + 5:i + 5 + n])
        i += 5 + n
    return out


class NonReader(H2):
    """An HTTP/2 client that announces SETTINGS_INITIAL_WINDOW_SIZE=0, so the server can send
    it no response data, and pushes requests as fast as the server's window lets it."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        import h2.settings
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self.flush()

    def start(self, path: str, **kw: Any) -> int:
        sid = super().start(path, **kw)
        self.streams[sid]["data"] = bytearray()  # appended to in place: answers add up to MiBs
        return sid

    def push(self, sid: int, payload: bytes, stall: float = 3.0) -> bytes:
        """Sends `payload` on `sid`; returns what is left unsent when the server left the window
        shut for `stall` seconds (it stopped granting window: a bound for the test, not a
        measurement), else b""."""
        view = memoryview(payload)
        while view:
            window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if window <= 0:
                self.sock.settimeout(stall)
                try:
                    self.pump()
                except socket.timeout:
                    return bytes(view)
                finally:
                    self.sock.settimeout(10)
                continue
            self.conn.send_data(sid, bytes(view[:window]))
            self.flush()
            view = view[window:]
        return b""


MSG = 256 << 10
BUDGET = 160 << 20  # what a client may try to push: well past the bound plus the stream window


def _stream_until_blocked(srv: openinfer.Server) -> tuple[NonReader, int, int, bytes]:
    """Pushes requests until the server stops granting window; returns the connection, the
    stream, how many requests were begun and the unsent tail of the last one."""
    conn = NonReader(srv.grpc_port)
    sid = conn.start(SERVICE + "ModelStreamInfer")
    sent = 0
    while sent * MSG < BUDGET:
        rest = conn.push(sid, frame(_bytes_request(MSG, sent)))
        sent += 1
        if rest:
            return conn, sid, sent, rest
    return conn, sid, sent, b""


@pytest.fixture(scope="module")
def echo8() -> Iterator[openinfer.Server]:
    models = [Model("echo8", _echo, inputs=[Tensor("INPUT0", "UINT8", [-1])], outputs=[Tensor("OUTPUT0", "UINT8", [-1])])]
    srv = openinfer.serve(models=models, http_port=0, log=False, threads=1, grpc_max_queued_bytes=1 << 20)
    try:
        yield srv
    finally:
        srv.stop()


def test_stream_client_that_never_reads_is_throttled_then_resumed(echo8: openinfer.Server) -> None:
    """With the client's window at 0, the server stops granting window once 1 MiB of answers
    wait (it used to take every request and queue every answer). When the client reads, the
    held requests are served in order and every request gets its answer."""
    conn, sid, sent, rest = _stream_until_blocked(echo8)
    try:
        assert rest, "the server kept granting window to a client that reads nothing"
        import h2.settings
        conn.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        conn.conn.increment_flow_control_window(1 << 30)
        conn.flush()
        assert conn.push(sid, rest, stall=30) == b""  # the window reopens as the answers drain
        more = 4
        for i in range(more):
            assert conn.push(sid, frame(_bytes_request(MSG, sent + i)), stall=30) == b""
        conn.send(sid, b"", end=True)
        [st] = conn.wait(sid, timeout=120)
        assert status_of(st)[1] == "0", status_of(st)
        answers = _messages(st["data"])
        assert len(answers) == sent + more
        for i, a in enumerate(answers):
            assert bytes([i & 0xFF]) + bytes(MSG - 1) in a
    finally:
        conn.close()
    assert_grpc_alive(echo8.grpc_port)


def test_stream_client_that_never_reads_then_vanishes(echo8: openinfer.Server) -> None:
    """Held requests and queued answers go with the connection (the sanitizer run checks that
    nothing leaks); the server goes on serving."""
    conn, _, _, rest = _stream_until_blocked(echo8)
    assert rest
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
    assert_grpc_alive(echo8.grpc_port)
    assert_alive(echo8.http_port)


# ---- shutdown honours its time limit ---------------------------------------------------------


def test_stop_timeout_answers_what_is_pending_while_the_model_still_runs(grpc_stubs: Any) -> None:
    """stop(timeout) used to wait for a running model however long it took. Now, once the
    time is up, the running request and the ones queued behind it get 503 (gRPC UNAVAILABLE)
    and stop returns while the model is still running."""
    import threading

    import grpc

    release, started, finished = threading.Event(), threading.Event(), threading.Event()

    def stuck(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started.set()
        release.wait(60)  # a bound for the test; released below
        finished.set()
        return {"OUTPUT0": inputs["INPUT0"]}

    srv = openinfer.serve(models=[Model("stuck", stuck, **ONE_INT)], http_port=0, log=False, threads=1)
    body = infer_body([{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}])
    running, queued = Http(srv.http_port, timeout=30), Http(srv.http_port, timeout=30)
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    try:
        running.send(encode_request("POST", "/v2/models/stuck/infer", body))
        assert started.wait(30)
        queued.send(encode_request("POST", "/v2/models/stuck/infer", body))
        pb = grpc_stubs.pb
        req = pb.ModelInferRequest(model_name="stuck")
        req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        req.raw_input_contents.append(struct.pack("<i", 1))
        future = grpc_stubs.rpc.GRPCInferenceServiceStub(channel).ModelInfer.future(req, timeout=60)
        wait_for(lambda: pending_requests(srv, "stuck") == 2, "both queued behind the running one")
        srv.stop(timeout=0.5)
        assert not finished.is_set(), "stop waited for the model"
        for conn in (running, queued):
            status, _, out = conn.read_response()
            assert status == 503 and "shutting down" in json.loads(out)["error"]
            assert conn.closed_by_peer()
        with pytest.raises(grpc.RpcError) as e:
            future.result()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        release.set()
        running.close()
        queued.close()
        channel.close()
    assert finished.wait(30)
    time.sleep(0.5)  # the server's memory goes once the model is back (checked under ASan)


def test_sigterm_honours_the_shutdown_timeout(tmp_path: Any) -> None:
    """SIGTERM with a model that takes a minute: the server answers 503 after
    --shutdown-timeout and exits 0 (it used to exit only when the model was done)."""
    import threading

    import requests
    from conftest import Cli

    repo = tmp_path / "repo"
    (repo / "stuck" / "1").mkdir(parents=True)
    (repo / "stuck" / "config.pbtxt").write_text(
        'name: "stuck"\nbackend: "python"\n'
        'input [{name: "X" data_type: TYPE_INT32 dims: [1]}]\noutput [{name: "Y" data_type: TYPE_INT32 dims: [1]}]\n'
    )
    (repo / "stuck" / "1" / "model.py").write_text(
        "import time\nfrom pathlib import Path\n\ndef infer(inputs):\n"
        "    (Path(__file__).parents[2] / 'running').touch()\n    time.sleep(60)\n    return {'Y': inputs['X']}\n"
    )
    # The new limits' flags reach the core (a bad value would fail the start).
    cli = Cli(str(repo), "--shutdown-timeout", "0.5", "--first-byte-timeout-ms", "2000", "--body-timeout-ms", "5000",
              "--max-connections-per-peer", "64", "--grpc-max-queued-bytes", str(1 << 20))
    try:
        result: dict[str, Any] = {}

        def call() -> None:
            r = requests.post(f"http://127.0.0.1:{cli.port}/v2/models/stuck/infer", timeout=60, json={
                "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
            result["status"], result["body"] = r.status_code, r.json()

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: (repo / "running").exists(), "the request with the model")
        cli.proc.send_signal(signal.SIGTERM)
        rc, out = cli.wait()  # within its 20 s bound, long before the model's minute
        t.join(30)
        assert rc == 0, out
        assert result["status"] == 503 and "shutting down" in result["body"]["error"]
    finally:
        cli.kill()


def test_bytes_that_start_no_request_do_not_buy_the_idle_timeout(quick: openinfer.Server) -> None:
    """Blank lines before a request are allowed, but they must not move a new connection
    from the short first-byte deadline to the long idle one."""
    with socket.create_connection(("127.0.0.1", quick.http_port)) as s:
        s.sendall(b"\r\n")
        assert closed_without_answer(s)
    assert_alive(quick.http_port)


@pytest.mark.parametrize("limit, value", [
    ("max_connections_per_peer", -1), ("max_connections", 0), ("grpc_max_queued_bytes", 0),
])
def test_bad_limits_are_clear_errors(limit: str, value: int) -> None:
    with pytest.raises(ValueError, match=limit):
        openinfer.serve(models=MODELS, http_port=0, log=False, **{limit: value})
