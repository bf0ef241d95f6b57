#!/usr/bin/env python3
"""Concurrency 1, taken apart: where the time of one sequential request goes, and what that
leaves for a client's speed-up over tritonclient (issue 19, items 2 and 4).

    .venv/bin/python benchmarks/c1_breakdown.py [--quick] [--seconds S] [--rounds R]

One openinfer server (`python -m openinfer serve --threads 1`, the example repository, pinned
to --server-cpu); this process, pinned to --client-cpu, sends sequential requests on one
connection, each kind in turn for R rounds:

- `health`: a raw-socket `GET /v2/health/live` (a request the loop answers itself: the
  transport's round trip with the cheapest client there is);
- `simple JSON`: a raw-socket `POST /v2/models/simple/infer` (the same, plus the JSON codec,
  the executor hand-offs and the Python model);
- `openinfer.Client` and `tritonclient` on `simple` with binary tensors, HTTP and gRPC, each
  driven as S7's load generator drives it (benchmarks/loadgen.py).

Per kind: µs per call (wall), its p50, and the client's CPU µs per call (getrusage of this
process).
`tritonclient / openinfer` is the median of per-round ratios. `bound` is tritonclient's time
over the `simple JSON` raw-socket time: the most any client could gain over tritonclient
against this server. Results: benchmarks/results/c1_breakdown.md (--quick: results/raw/).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import loadgen as L  # noqa: E402

NAME = "c1_breakdown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 0.5 s per kind")
    ap.add_argument("--seconds", type=float, help="seconds per kind and round (default 2)")
    ap.add_argument("--rounds", type=int, help="rounds (default 3)")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    a = ap.parse_args(argv)
    a.seconds = a.seconds or (0.5 if a.quick else 2.0)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.out = C.RAW_DIR if a.quick else C.RESULTS_DIR
    return a


class RawHttp:
    """One keep-alive connection, requests written whole, responses read by Content-Length."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = self.buf[:end].lower()
                length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
                if len(self.buf) >= end + 4 + length:
                    body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
                    if not head.startswith(b"http/1.1 200"):
                        raise RuntimeError(f"unexpected answer: {head[:80]!r}")
                    return body
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("the server closed the connection")
            self.buf += data


def kinds(http_port: int, grpc_port: int) -> dict[str, Callable[[], object]]:
    raw = RawHttp(http_port)
    health = b"GET /v2/health/live HTTP/1.1\r\nHost: bench\r\n\r\n"
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": L.SIMPLE_A.ravel().tolist()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": L.SIMPLE_B.ravel().tolist()}]}).encode()
    infer = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n" % len(body)) + body
    clients = {
        "openinfer.Client HTTP": L.OpenInfer(f"http://127.0.0.1:{http_port}"),
        "tritonclient.http": L.Triton(f"127.0.0.1:{http_port}"),
        "openinfer.Client gRPC": L.OpenInfer(f"grpc://127.0.0.1:{grpc_port}"),
        "tritonclient.grpc": L.TritonGrpc(f"127.0.0.1:{grpc_port}"),
    }
    for client in clients.values():
        client.op_verify()  # answers checked before timing
    return {"health (raw socket)": lambda: raw.call(health), "simple JSON (raw socket)": lambda: raw.call(infer),
            **{name: client._simple for name, client in clients.items()}}


def measure(call: Callable[[], object], seconds: float) -> tuple[float, float, float]:
    """µs per call (wall), its p50, and this process's CPU µs per call."""
    r = L.timed_seq(call, seconds)
    return 1e6 * r["elapsed"] / r["n"], r["p50_us"], 1e6 * r["cpu"] / r["n"]


def main() -> int:
    args = parse_args()
    C.check_cpus(args.server_cpu, args.client_cpu)
    started = time.monotonic()
    load_before = C.loadavg()
    tmp = C.make_tmpdir("c1_breakdown")
    http_port, grpc_port = C.free_port(), C.free_port()
    server = C.openinfer_server(http_port, args.server_cpu, tmp / "server.log",
                                extra=["--grpc-port", str(grpc_port)])
    with server:
        C.wait_http_ready(f"http://127.0.0.1:{http_port}/v2/health/ready")
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
        calls = kinds(http_port, grpc_port)
        for call in calls.values():  # warm-up
            measure(call, args.seconds / 4)
        wall: dict[str, list[float]] = {k: [] for k in calls}
        p50: dict[str, list[float]] = {k: [] for k in calls}
        cpu: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(args.rounds):
            for name, call in calls.items():
                w, m, c = measure(call, args.seconds)
                wall[name].append(w)
                p50[name].append(m)
                cpu[name].append(c)
                print(f"[c1] round {r + 1} {name}: {w:.1f} µs/call, p50 {m:.1f} µs, client CPU {c:.1f} µs",
                      flush=True)
    load_after = C.loadavg()

    def cell(values: list[float]) -> str:
        s = C.summarize(values)
        return f"{s.median:,.1f} ({s.lo:,.1f}–{s.hi:,.1f})"

    rows = [[name, cell(wall[name]), cell(p50[name]), cell(cpu[name])] for name in calls]
    ratios = []
    floor = wall["simple JSON (raw socket)"]
    for proto, ours, theirs in (("HTTP", "openinfer.Client HTTP", "tritonclient.http"),
                                ("gRPC", "openinfer.Client gRPC", "tritonclient.grpc")):
        ratios.append([proto, cell(C.paired_ratios(wall[theirs], wall[ours])),
                       cell(C.paired_ratios(wall[theirs], floor)),
                       cell(C.paired_ratios(cpu[theirs], cpu[ours]))])
    lines = C.report_header("Concurrency 1, taken apart", args.quick, time.monotonic() - started)
    lines += ["Sequential requests on one connection; medians (min–max) over rounds.", "",
              C.markdown_table(["kind", "µs per call", "p50 µs", "client CPU µs per call"], rows), "",
              C.markdown_table(["protocol", "tritonclient / openinfer.Client (time per call)",
                                "bound: tritonclient / raw-socket simple JSON",
                                "client CPU tritonclient / openinfer"], ratios), "",
              "## Method", "",
              f"- Server: `{server.command}` pinned to CPU {args.server_cpu}; this process "
              f"on CPU {args.client_cpu}; {args.rounds} rounds of {args.seconds:g} s per kind, kinds "
              "in turn; answers checked before timing.",
              "- `bound` is what a client costing nothing would reach over tritonclient against this "
              "server: the raw-socket JSON request already includes the transport, the codec and the "
              "model, none of which a client can remove (the HTTP request bounds the gRPC row too: "
              "there is no cheaper raw gRPC client to time).",
              C.machine_line((load_before, load_after)), ""]
    C.write_report(NAME, args.out, lines, "c1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
