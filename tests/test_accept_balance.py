"""Connections spread over a server's event loops: each loop accepts one connection per wake-up,
so a burst of connections is not taken whole by the loop that woke first (issue 19).

Which loop served a connection is read from the kernel, not from the server: the bytes that
each loop thread has read (`rchar` in /proc/PID/task/TID/io) grow on the loop that owns the
connection. Each connection here sends far more than a loop reads for anything else."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

import openinfer

CONNECTIONS = 8
PAD = 64 << 10  # JSON whitespace per request: what marks a loop as having served one
SIMPLE = json.dumps({
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}).encode()


def loop_reads(skip: frozenset[int] = frozenset()) -> dict[int, int]:
    """Bytes read so far by each of this process's event-loop threads (but those in `skip`:
    another server's, still ending), by thread id."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        if int(tid) in skip:
            continue
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
                if f.read().strip() != "oi-loop":
                    continue
            with open(f"/proc/{os.getpid()}/task/{tid}/io") as f:
                out[int(tid)] = int(next(line for line in f if line.startswith("rchar:")).split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return out


def connections_per_loop(before: dict[int, int], per_connection: int) -> list[int]:
    """How many connections each loop served since `before`: the bytes it read, in units of
    what one connection sent (a loop reads little else: wake-ups of 8 bytes)."""
    after = loop_reads()
    return sorted((after[tid] - n) // per_connection for tid, n in before.items() if tid in after)


# A burst is spread when each of the two loops serves about half of it: the loops take turns
# (4/4, or 5/3 when one waits for a CPU). Without the balance the loop that woke first takes
# most of it: 8/0 to 5/3, the smaller shares of 5 bursts summing to 1-13 (measured). A loop kept
# from its CPU longer than a busier one's pause (1 ms) still lets that one take another (one
# CI run under ASan saw 6/2), so the test counts over several bursts: with the balance their
# smaller shares sum to 20, or nearly, and must reach AT_LEAST.
ROUNDS = 5
AT_LEAST = 15


@pytest.fixture()
def server() -> Iterator[tuple[openinfer.Server, frozenset[int]]]:
    """A fresh server per test, with two loops (nothing left over from another test's
    connections on them)."""
    if not os.path.exists(f"/proc/{os.getpid()}/io"):
        pytest.skip("no per-thread I/O accounting in /proc")
    others = frozenset(loop_reads())
    srv = openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=0, threads=2, log=False)
    try:
        assert len(loop_reads(others)) == 2
        yield srv, others
    finally:
        srv.stop()


def connect_all(port: int) -> list[socket.socket]:
    """CONNECTIONS sockets connected together: the handshakes complete in the kernel, so the
    server finds them all in its accept queue at once."""
    socks = []
    for _ in range(CONNECTIONS):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        s.setblocking(True)
        s.settimeout(30)
    # The loops accept while this thread sleeps, not while it competes with them for the CPUs
    # by sending: the balance is between the loops, not between a loop and the test.
    time.sleep(0.05)
    return socks


def close_all(socks: list[socket.socket]) -> None:
    """Closes the connections once the server has closed its ends (it reads our end-of-file),
    so the next burst finds both loops with none open."""
    for s in socks:
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
        s.close()
    time.sleep(0.05)  # the loops count a connection closed on their next turn


def shares_of_bursts(port: int, others: frozenset[int], exchange: Callable[[socket.socket], None],
                     per_connection: int) -> list[list[int]]:
    """ROUNDS bursts of CONNECTIONS connections to `port`, each making its `exchange` (which
    sends `per_connection` bytes): how many connections of each burst each loop served."""
    shares = []
    for _ in range(ROUNDS):
        before = loop_reads(others)
        socks = connect_all(port)
        try:
            for s in socks:
                exchange(s)
            served = connections_per_loop(before, per_connection)
            assert sum(served) == CONNECTIONS, served
            shares.append(served)
        finally:
            close_all(socks)
    return shares


def assert_spread(shares: list[list[int]]) -> None:
    assert sum(min(served) for served in shares) >= AT_LEAST, shares


def recv_http_response(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, "connection closed before the response"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed inside the response"
        body += chunk
    return int(head.split()[1]), body


def test_http_burst_is_served_by_both_loops(server: tuple[openinfer.Server, frozenset[int]]) -> None:
    srv, others = server
    body = SIMPLE + b" " * PAD
    request = (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    def two_requests(s: socket.socket) -> None:  # keep-alive: the same connection answers both
        for _ in range(2):
            s.sendall(request)
            status, out = recv_http_response(s)
            assert status == 200, out
            assert json.loads(out)["outputs"][0]["data"] == [x + 1 for x in range(16)]

    assert_spread(shares_of_bursts(srv.http_port, others, two_requests, 2 * len(request)))


def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


PINGS = 600  # 17 bytes each: about 10 KiB per connection


def test_grpc_burst_is_served_by_both_loops(server: tuple[openinfer.Server, frozenset[int]]) -> None:
    """gRPC (HTTP/2) shares the loops and accepts the same way: a connection's PINGs, each
    answered, are read by the loop that accepted it."""
    srv, others = server
    out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, b"")
    out += b"".join(h2_frame(6, 0, 0, struct.pack(">Q", i)) for i in range(PINGS))

    def pings(s: socket.socket) -> None:
        s.sendall(out)
        acks, buf = 0, b""
        while acks < PINGS:
            while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
                chunk = s.recv(65536)
                assert chunk, f"connection closed after {acks} PING acks"
                buf += chunk
            n = 9 + int.from_bytes(buf[:3], "big")
            if buf[3] == 6 and buf[4] & 1:
                acks += 1
            buf = buf[n:]

    assert_spread(shares_of_bursts(srv.grpc_port, others, pings, len(out)))


SERVER_SHORT_OF_DESCRIPTORS = """
import os, resource, sys, openinfer
srv = openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, metrics_port=None,
                      threads=2, log=False)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
print(srv.http_port, flush=True)
sys.stdin.read()
srv.stop()
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_pauses_accepting_then_serves_the_waiting() -> None:
    """A server that cannot accept (EMFILE) neither spins on its readable socket nor drops the
    waiting connections: they stay in the queue and are served once descriptors are free."""
    import select
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", SERVER_SHORT_OF_DESCRIPTORS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        request = (f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(SIMPLE)}\r\n\r\n").encode() + SIMPLE
        socks = []
        for _ in range(12):  # three times what the server has descriptors for
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(request)
            socks.append(s)
        # Those it could not accept wait; the server meanwhile sleeps between tries (a spinning
        # loop would burn a CPU second per second; these are far apart, whatever the machine).
        cpu = cpu_seconds(proc.pid)
        select.select([], [], [], 1.0)
        assert cpu_seconds(proc.pid) - cpu < 0.5
        waiting, served = list(socks), 0
        while waiting:
            ready, _, _ = select.select(waiting, [], [], 30)
            assert ready, f"{len(waiting)} connections never answered"
            for s in ready:
                status, body = recv_http_response(s)
                assert status == 200, body
                served += 1
                s.close()  # frees the server's descriptor for one that waits
                waiting.remove(s)
        assert served == 12
        assert proc.poll() is None
    finally:
        for s in socks:
            s.close()
        proc.communicate("", timeout=30)
    assert proc.returncode == 0
