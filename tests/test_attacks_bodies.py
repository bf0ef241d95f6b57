"""Attacks through request bodies (issue 29, items 3 and 4), over real sockets.

Gzip amplification: a 1 MB gzip body that inflates to 1000 MiB used to be inflated in full
before the JSON parser refused its first byte, and nothing bounded many of them at once. Now
the first inflated bytes are checked (a JSON object, a protobuf tag), the ratio of inflated to
sent bytes is capped past 64 MiB (max_inflate_ratio), and one budget bounds the bodies and gRPC
messages in flight, raw and inflated (max_inflight_body_bytes: 503 / RESOURCE_EXHAUSTED). The
memory figures are the peak RSS growth of a server in a process of its own.

Slow bodies: connections that send a body byte now and then, each gap under body_timeout_ms,
filled the connection table from two addresses and locked every new client out. Now a body
must average body_min_rate bytes/s once it has taken body_timeout_ms (408, or
DEADLINE_EXCEEDED for a gRPC message), and a full table evicts the slowest connection still
sending its request (503) when no connection is idle."""

from __future__ import annotations

import functools
import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from conftest import GRPC_BIG_MESSAGES, Cli, Http, assert_alive, assert_grpc_alive, encode_request, infer_body
from test_grpc_compression import send_all
from test_grpc_transport import H2, SERVICE, frame, status_of

import openinfer
from openinfer import Model, Tensor

ASAN = "asan" in os.environ.get("LD_PRELOAD", "")
MiB = 1 << 20
BOMB_MIB = 1000  # over the default max_body_bytes (64 MiB), under grpc_max_message_bytes (2 GiB)


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


def serve(**limits: Any) -> openinfer.Server:
    """A server of its own (one loop thread, so that eviction sees every connection)."""
    return openinfer.serve(models=[Model("echo", _echo, **ONE_INT)], http_port=0, log=False, threads=1, **limits)


@functools.lru_cache(maxsize=None)
def bomb(prefix: bytes, fill: bytes, mib: int) -> bytes:
    """gzip of `prefix` then `mib` MiB of `fill`, made without holding the inflated bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = fill * MiB
    return c.compress(prefix) + b"".join(c.compress(chunk) for _ in range(mib)) + c.flush()


def varint(v: int) -> bytes:
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


# ---- a server in a process of its own, for its peak RSS -------------------------------------

CHILD = textwrap.dedent("""
    import json, sys
    import openinfer
    from openinfer import Model, Tensor

    model = Model("echo", lambda i: {"OUTPUT0": i["INPUT0"]},
                  inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    srv = openinfer.serve(models=[model], http_port=0, log=False, **json.loads(sys.argv[1]))
    print(json.dumps({"http": srv.http_port, "grpc": srv.grpc_port}), flush=True)
    sys.stdin.readline()
    srv.stop()
""")


class ChildServer:
    def __init__(self, **limits: Any) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(limits)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, "the child server did not start"
        ports = json.loads(line)
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]

    def _status(self, key: str) -> int:
        text = open(f"/proc/{self.proc.pid}/status").read()
        return int(re.search(key + r":\s+(\d+)", text).group(1)) << 10

    def reset_peak(self) -> int:
        """Starts the peak again from the current RSS (clear_refs 5); returns the base."""
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
                f.write("5")
            return self._status("VmRSS")
        except OSError:  # not allowed here: the peak so far is the base
            return self._status("VmHWM")

    def peak(self) -> int:
        return self._status("VmHWM")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def child() -> Iterator[ChildServer]:
    srv = ChildServer()  # every limit at its default
    try:
        yield srv
    finally:
        srv.close()


def at_once(fns: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - reported by the assertions
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


# ---- gzip bombs ----------------------------------------------------------------------------


def test_four_gzip_bombs_at_once_over_http(child: ChildServer) -> None:
    """Four 1 MB bodies that inflate to 1000 MiB each (all four used to be inflated, 4 GB):
    zeros are refused at their first byte, a JSON prefix past max_body_bytes while measuring."""
    zeros, text = bomb(b"", b"\0", BOMB_MIB), bomb(b'{"id":"', b"a", BOMB_MIB)
    assert len(zeros) < 2 * MiB and len(text) < 2 * MiB
    url = f"http://127.0.0.1:{child.http_port}/v2/models/echo/infer"
    requests.get(f"http://127.0.0.1:{child.http_port}/v2/health/live", timeout=30).raise_for_status()
    base = child.reset_peak()
    out = at_once([lambda b=b: requests.post(url, data=b, headers={"Content-Encoding": "gzip"}, timeout=300)
                   for b in (zeros, text, zeros, text)])
    growth = child.peak() - base
    print(f"four HTTP gzip bombs: peak RSS growth {growth / MiB:.1f} MiB")
    for r in out:
        assert isinstance(r, requests.Response), r
    for r in out[0::2]:
        assert r.status_code == 400, r.text
        assert r.json()["error"] == ("the decompressed request body is not a JSON object: it starts with byte "
                                     "0x00, expected '{'")
    for r in out[1::2]:
        assert r.status_code == 400, r.text
        assert r.json()["error"] == (f"Decompressed data size exceeds the maximum allowed value of {64 * MiB} bytes. "
                                     "Use --http-max-input-size to increase the limit.")
    if not ASAN:  # RSS is not meaningful under ASan
        assert growth < 256 * MiB, f"peak RSS grew by {growth / MiB:.0f} MiB"
    assert_alive(child.http_port)


def test_four_gzip_bombs_at_once_over_grpc(child: ChildServer) -> None:
    """The same with grpc-encoding gzip, under the 2 GiB message limit: zeros are no protobuf
    message; a message that starts with a 1000 MiB bytes field passes its ratio."""
    zeros = bomb(b"", b"\0", BOMB_MIB)
    field = bomb(b"\x3a" + varint(BOMB_MIB * MiB), b"\0", BOMB_MIB)  # raw_input_contents

    def call(msg: bytes) -> tuple[str, str, str]:
        conn = H2(child.grpc_port)
        # Four 1000 MiB inflations at once hold the server's loop threads for seconds on a
        # loaded 2-core machine: a send may wait past H2's 10 s socket timeout.
        conn.sock.settimeout(120)
        try:
            sid = conn.start(SERVICE + "ModelInfer", extra=[("grpc-encoding", "gzip")])
            send_all(conn, sid, frame(msg, flag=1))
            [st] = conn.wait(sid, timeout=300)
            return status_of(st)
        finally:
            conn.close()

    assert_grpc_alive(child.grpc_port)
    base = child.reset_peak()
    out = at_once([lambda m=m: call(m) for m in (zeros, field, zeros, field)])
    growth = child.peak() - base
    print(f"four gRPC gzip bombs: peak RSS growth {growth / MiB:.1f} MiB")
    for st in out[0::2]:
        assert isinstance(st, tuple), st
        assert st[1] == "13" and st[2] == ("the decompressed request message is not a protobuf message: its first "
                                           "tag names field 0 with wire type 0 (expected a field from 1 and a wire "
                                           "type up to 5)"), st
    for st in out[1::2]:
        assert isinstance(st, tuple), st
        assert st[1] == "8" and "past the server's max_inflate_ratio of 1000" in st[2], st  # RESOURCE_EXHAUSTED
    if not ASAN:
        assert growth < 256 * MiB, f"peak RSS grew by {growth / MiB:.0f} MiB"
    assert_grpc_alive(child.grpc_port)


def test_honest_gzip_bodies_still_work(grpc_stubs: Any) -> None:
    """Compressed requests as clients send them, a zero tensor at deflate's full ratio (about
    1030x) included while it inflates within the 64 MiB floor; past the floor it needs
    max_inflate_ratio raised (0: no limit), and says so."""
    import grpc
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    zeros = np.zeros(8 * MiB, np.int32)  # 32 MiB, about 31 KiB compressed
    small = np.arange(1000, dtype=np.int32)
    with serve() as srv:
        client = thttp.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
        for data in (small, zeros):
            inp = thttp.InferInput("INPUT0", [data.size], "INT32")
            inp.set_data_from_numpy(data, binary_data=data is zeros)
            out = [thttp.InferRequestedOutput("OUTPUT0", binary_data=True)]
            r = client.infer("echo", [inp], outputs=out, request_compression_algorithm="gzip")
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), data)
        client.close()
        gclient = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}", channel_args=GRPC_BIG_MESSAGES)
        inp = tgrpc.InferInput("INPUT0", [zeros.size], "INT32")
        inp.set_data_from_numpy(zeros)
        r = gclient.infer("echo", [inp], compression_algorithm="gzip")
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), zeros)

        big = np.zeros(20 * MiB, np.int32)  # 80 MiB at about 1030x: past the floor and the ratio
        inp = tgrpc.InferInput("INPUT0", [big.size], "INT32")
        inp.set_data_from_numpy(big)
        with pytest.raises(tgrpc.InferenceServerException) as e:
            gclient.infer("echo", [inp], compression_algorithm="gzip")
        assert e.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert "max_inflate_ratio of 1000" in e.value.message()
        gclient.close()
    with serve(max_inflate_ratio=0) as srv:
        gclient = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}", channel_args=GRPC_BIG_MESSAGES)
        r = gclient.infer("echo", [inp], compression_algorithm="gzip")
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), big)
        gclient.close()


# ---- the budget for bodies in flight ------------------------------------------------------------

BUDGET = 8 * MiB


def binary_echo(n: int) -> tuple[bytes, int]:
    """An echo request of n int32 elements in the binary form: (body, JSON length)."""
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [n],
                                   "parameters": {"binary_data_size": 4 * n}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return head + np.arange(n, dtype=np.int32).tobytes(), len(head)


def head_of(body: bytes, jlen: int, extra: str = "") -> bytes:
    return (f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {jlen}\r\n{extra}\r\n").encode()


def hold_budget(srv: openinfer.Server, body: bytes, jlen: int) -> Http:
    """A connection whose body is charged (the server's 100 Continue comes after the charge)
    and partly sent. Bodies of earlier requests are given back as their last owner lets go,
    which for a Python model's arrays is a moment after the answer: until then, 503 and again."""
    end = time.monotonic() + 30  # a bound for a leak, not a timing claim
    while True:
        conn = Http(srv.http_port)
        conn.send(head_of(body, jlen, "Expect: 100-continue\r\n"))
        status, _, out = conn.read_response()
        if status == 100:
            conn.send(body[:MiB])
            return conn
        conn.close()
        assert status == 503 and time.monotonic() < end, out
        time.sleep(0.05)


def until_ok(fn: Any, ok: Any) -> Any:
    """Calls fn until ok(result), for at most 30 s (see hold_budget)."""
    end = time.monotonic() + 30
    while True:
        result = fn()
        if ok(result) or time.monotonic() > end:
            return result
        time.sleep(0.05)


def test_bodies_beyond_the_budget_get_503_and_the_budget_comes_back(grpc_stubs: Any) -> None:
    import grpc

    big, jlen = binary_echo(6 * MiB // 4)  # 6 MiB of an 8 MiB budget
    with serve(max_inflight_body_bytes=BUDGET, max_body_bytes=64 * MiB) as srv, \
            grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}", options=GRPC_BIG_MESSAGES) as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)

        def grpc_echo(nbytes: int) -> Any:
            req = grpc_stubs.pb.ModelInferRequest(model_name="echo")
            req.inputs.add(name="INPUT0", datatype="INT32", shape=[nbytes // 4])
            req.raw_input_contents.append(bytes(nbytes))
            try:
                return stub.ModelInfer(req, timeout=60)
            except grpc.RpcError as e:
                return e

        for _ in range(3):  # each round ends with the budget whole again
            holder = hold_budget(srv, big, jlen)
            try:
                over = Http(srv.http_port)
                over.send(head_of(big, jlen))
                status, headers, out = over.read_response()  # answered at its headers
                over.close()
                assert status == 503 and headers["connection"] == "close", out
                assert json.loads(out)["error"].startswith(
                    f"the server is out of memory for request bodies: this request body needs {len(big)} bytes "
                    f"and the server's max_inflight_body_bytes of {BUDGET} bytes has ")
                # Inflated bytes count too: 4 MiB from a small deflate body do not fit beside them.
                packed = zlib.compress(json.dumps({"inputs": []}).encode() + b" " * (4 * MiB), 9)
                r = requests.post(f"{srv.url}/v2/models/echo/infer", data=packed,
                                  headers={"Content-Encoding": "deflate"}, timeout=60)
                assert r.status_code == 503, r.text
                assert r.json()["error"].startswith(
                    f"the server is out of memory for request bodies: this decompressed request body needs "
                    f"{len(json.dumps({'inputs': []})) + 4 * MiB} bytes")
                # A gRPC message alike: RESOURCE_EXHAUSTED.
                e = grpc_echo(4 * MiB)
                assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "this request message needs" in e.details() and "max_inflight_body_bytes" in e.details()
                holder.send(big[MiB:])
                status, _, _ = holder.read_response()
                assert status == 200
            finally:
                holder.close()
        # Nothing stayed charged: the whole budget serves one body again, over both protocols.
        whole, wlen = binary_echo((BUDGET - 4096) // 4)
        assert BUDGET - 4096 < len(whole) <= BUDGET

        conn = hold_budget(srv, whole, wlen)
        try:
            conn.send(whole[MiB:])
            assert conn.read_response()[0] == 200
        finally:
            conn.close()
        r = until_ok(lambda: grpc_echo(BUDGET - 4096), lambda r: not isinstance(r, grpc.RpcError))
        assert not isinstance(r, grpc.RpcError), r
        assert len(r.raw_output_contents[0]) == BUDGET - 4096


@pytest.mark.parametrize("limit", ["max_inflight_body_bytes", "max_inflate_ratio", "body_min_rate"])
def test_bad_limits_are_clear_errors(limit: str) -> None:
    with pytest.raises(ValueError, match=limit):
        serve(**{limit: -1})


def test_the_limits_are_cli_flags() -> None:
    """--max-inflight-body-bytes, --max-inflate-ratio and --body-min-rate reach the core (and
    --max-body-bytes, above the 64 MiB ratio floor)."""
    cli = Cli("--max-inflight-body-bytes", str(MiB), "--max-inflate-ratio", "0", "--body-min-rate", "100",
              "--body-timeout-ms", "1000", "--max-body-bytes", str(128 * MiB))
    try:
        conn = Http(cli.port)
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n")
        status, _, out = conn.read_response()
        conn.close()
        assert status == 503 and f"max_inflight_body_bytes of {MiB} bytes" in json.loads(out)["error"], out
        # A 70 MiB body at 1028:1 is over the default ratio, not over no ratio: it reaches the JSON parser.
        r = requests.post(f"http://127.0.0.1:{cli.port}/v2/models/simple/infer", data=bomb(b'{"x":"', b"a", 70),
                          headers={"Content-Encoding": "gzip"}, timeout=60)
        assert r.status_code == 503 and "decompressed request body needs" in r.json()["error"], r.text
        conn = Http(cli.port)
        conn.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(50):  # a byte every 0.1 s: 10 bytes/s, under the 100 asked
            conn.send(b" ")
            if select.select([conn.sock], [], [], 0.1)[0]:
                break
        status, _, out = conn.read_response()
        conn.close()
        assert status == 408 and "body_min_rate of 100 bytes/s" in json.loads(out)["error"], out
    finally:
        cli.kill()


# ---- slow bodies ---------------------------------------------------------------------------


def slow_upload(port: int, source: str, length: int = 1000) -> socket.socket:
    """A connection from `source` whose request is mid-body: its headers were read (the
    server's 100 Continue says so) and one body byte sent."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.sendall(f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
              "Expect: 100-continue\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, "closed before 100 Continue"
        got += chunk
    assert got.startswith(b"HTTP/1.1 100 Continue"), got
    s.sendall(b"{")
    return s


def pending_bytes(s: socket.socket) -> bytes:
    """What the server sent on `s` so far, without waiting."""
    s.setblocking(False)
    try:
        return s.recv(65536)
    except (BlockingIOError, ConnectionResetError):
        return b""
    finally:
        s.setblocking(True)


def echo_ok(conn: Http, value: int = 7) -> bool:
    conn.send(encode_request("POST", "/v2/models/echo/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}])))
    status, _, body = conn.read_response()
    return status == 200 and json.loads(body)["outputs"][0]["data"] == [value]


def test_slow_bodies_from_two_addresses_do_not_lock_new_clients_out() -> None:
    """64 connections, 32 from each of two addresses (the per-peer cap), every one mid-body:
    new clients from a third address are served, each taking the place of the slowest."""
    with serve(max_connections=64, body_timeout_ms=60_000, first_byte_timeout_ms=60_000) as srv:
        slow: list[socket.socket] = []
        try:
            for i in range(64):
                slow.append(slow_upload(srv.http_port, "127.0.0.2" if i % 2 else "127.0.0.3"))
            for n in range(3):
                fresh = Http(srv.http_port)
                try:
                    assert echo_ok(fresh, n)
                finally:
                    fresh.close()
            evicted = [got for got in map(pending_bytes, slow) if got]
            assert len(evicted) >= 1
            for got in evicted:
                assert got.startswith(b"HTTP/1.1 503 "), got
                assert b"max_connections 64) and this request was the slowest to arrive" in got, got
        finally:
            for s in slow:
                s.close()
        assert_alive(srv.http_port)


def test_a_full_table_that_empties_at_once_takes_new_clients() -> None:
    """63 clients leave while the loop is busy (decoding a large JSON body on a 64th), and a
    new one comes: the loop's next turn closes the 63 and accepts the new one. Connections
    being closed used to count until freed, later in that turn, so the table looked full of
    connections none of which could make room, and the new client was reset (every round)."""
    n = 4 << 20
    big = (b'{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"INT32","data":[' % n
           + b",".join([b"1234567"] * n) + b"]}]}")
    with serve(max_connections=64, max_connections_per_peer=100) as srv:
        for _ in range(3):
            conns = [Http(srv.http_port) for _ in range(63)]
            for c in conns:
                assert c.request("GET", "/v2/health/live")[0] == 200
            busy = Http(srv.http_port, timeout=120)
            try:
                busy.send(encode_request("POST", "/v2/models/echo/infer", big))
                time.sleep(0.05)  # into the decoding (a shorter one only makes the test weaker)
                for c in conns:
                    c.close()
                fresh = Http(srv.http_port)
                try:
                    assert fresh.request("GET", "/v2/health/live")[0] == 200
                finally:
                    fresh.close()
                assert busy.read_response()[0] == 200
            finally:
                busy.close()


def test_a_body_trickling_below_the_minimum_rate_gets_408() -> None:
    """A byte every 0.2 s, each gap far under body_timeout_ms (1 s): the body must average
    body_min_rate (500 bytes/s by default) once it has taken 1 s, and is answered 408 when it
    falls behind."""
    with serve(body_timeout_ms=1000, header_timeout_ms=60_000) as srv:
        conn = Http(srv.http_port)
        try:
            conn.send(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            answered = False
            for _ in range(50):  # a bound of 10 s for a server that never cuts it
                try:
                    conn.send(b" ")
                except OSError:
                    answered = True
                    break
                if select.select([conn.sock], [], [], 0.2)[0]:
                    answered = True
                    break
            assert answered, "the trickled body was never cut"
            status, headers, body = conn.read_response()
            assert status == 408 and headers["connection"] == "close"
            assert re.fullmatch(r"timed out reading the request: its body arrived slower than the server's "
                                r"body_min_rate of 500 bytes/s \(\d+ bytes in \d+ ms\)", json.loads(body)["error"])
        finally:
            conn.close()
        assert_alive(srv.http_port)


def test_a_grpc_message_trickling_below_the_minimum_rate_is_ended() -> None:
    with serve(body_timeout_ms=1000) as srv:
        conn = H2(srv.grpc_port)
        try:
            sid = conn.start(SERVICE + "ModelInfer")
            conn.send(sid, struct.pack(">BI", 0, 1000))
            for _ in range(50):  # a bound of 10 s
                if conn.streams[sid]["ended"]:
                    break
                conn.send(sid, b"\0")
                if select.select([conn.sock], [], [], 0.2)[0]:
                    conn.pump()
            assert conn.streams[sid]["ended"], "the trickled message was never cut"
            _, code, text = status_of(conn.streams[sid])
            assert code == "4", text  # DEADLINE_EXCEEDED
            assert re.fullmatch(r"the request message arrived slower than the server's body_min_rate of 500 "
                                r"bytes/s \(\d+ bytes in \d+ ms\)", text), text
            [st] = conn.wait(conn.call(SERVICE + "ServerLive", b""))  # the connection goes on
            assert status_of(st)[1] == "0"
        finally:
            conn.close()


class SlowH2(H2):
    """An HTTP/2 connection from `source` with one call whose message is under way."""

    def __init__(self, port: int, source: str) -> None:  # noqa: D107 - H2's, from another address
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()
        self.streams = {}
        self.goaway = False
        self.sid = self.start(SERVICE + "ModelInfer")
        self.send(self.sid, struct.pack(">BI", 0, 1000) + b"\0")
        self.conn.ping(b"12345678")  # its answer says the server has read all of the above
        self.flush()
        self.acked = False
        while not self.acked:
            self.pump_pings()

    def pump_pings(self) -> None:
        import h2.events

        data = self.sock.recv(1 << 20)
        assert data, "closed"
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.PingAckReceived):
                self.acked = True
        self.flush()


def test_slow_grpc_messages_do_not_lock_new_clients_out() -> None:
    with serve(max_connections=8, body_timeout_ms=60_000, first_byte_timeout_ms=60_000) as srv:
        slow: list[SlowH2] = []
        try:
            for i in range(8):
                slow.append(SlowH2(srv.grpc_port, "127.0.0.2" if i % 2 else "127.0.0.3"))
            assert_grpc_alive(srv.grpc_port)  # it used to be refused: every connection had a call open
            assert sum(_closed(s.sock) for s in slow) >= 1
        finally:
            for s in slow:
                s.close()


def _closed(s: socket.socket) -> bool:
    """Whether the server has closed `s` (given 0.2 s to say so: a bound, not a timing claim)."""
    s.settimeout(0.2)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
