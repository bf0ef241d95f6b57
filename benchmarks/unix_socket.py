#!/usr/bin/env python3
"""The Unix-domain socket transport against TCP loopback, side by side on one server:
`openinfer serve` (examples repository, one loop thread, pinned to CPU 0) listening on both,
and `openinfer.Client` (pinned to CPU 1) sending `simple` requests one at a time, over HTTP
and over gRPC. Each round measures TCP then the Unix socket for the same time; the claim is
the median of the per-round ratios unix/TCP of the request rate (min–max).

    .venv/bin/python benchmarks/unix_socket.py [--seconds 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import openinfer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate(client: openinfer.Client, seconds: float) -> float:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = {"INPUT0": a, "INPUT1": a}
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.infer("simple", inputs)
        n += 1
    return n / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="oi_bench_")
    http_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "openinfer", "serve", "--threads", "1", "--http-port",
         str(http_port), "--grpc-port", str(grpc_port), "--http-unix", f"{d}/h.sock", "--grpc-unix", f"{d}/g.sock",
         "--log-level", "warning"])
    try:
        os.sched_setaffinity(0, {1})
        urls = {"http": (f"http://127.0.0.1:{http_port}", f"unix:{d}/h.sock"),
                "grpc": (f"grpc://127.0.0.1:{grpc_port}", f"grpc+unix:{d}/g.sock")}
        clients = {k: tuple(openinfer.Client(u) for u in pair) for k, pair in urls.items()}
        deadline = time.monotonic() + 60
        while not all(_ready(c) for pair in clients.values() for c in pair):
            if time.monotonic() > deadline:
                raise SystemExit("the server did not come up")
            time.sleep(0.2)
        print(f"| protocol | TCP req/s | Unix req/s | unix/TCP, median of {args.rounds} rounds (min–max) |")
        print("|---|---|---|---|")
        for proto, (tcp, unix) in clients.items():
            rate(tcp, 0.5), rate(unix, 0.5)  # warm-up
            rounds = [(rate(tcp, args.seconds), rate(unix, args.seconds)) for _ in range(args.rounds)]
            ratios = [u / t for t, u in rounds]
            print(f"| {proto} | {statistics.median(t for t, _ in rounds):.0f} | "
                  f"{statistics.median(u for _, u in rounds):.0f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) |")
    finally:
        server.terminate()
        server.wait(30)
    return 0


def _ready(client: openinfer.Client) -> bool:
    try:
        return client.is_server_ready()
    except (ConnectionError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main())
