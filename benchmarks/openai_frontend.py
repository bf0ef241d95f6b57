#!/usr/bin/env python3
"""OpenAI's API: what the /v1 frontend adds over the model.

A Python generator model `tokens` (Triton's LLM conventions: text_input, sampling_parameters,
text_output) yields max_tokens one-byte tokens as fast as it can. Measured side by side in one
run, the server in its own process pinned to CPU 0 (where there are two), the readers on CPU 1:

- in-process: the same generator iterated in this process through the model's own handler;
- generate_stream: POST /v2/models/tokens/generate_stream, Triton's generate extension (the SSE
  path the frontend maps onto);
- /v1/completions: the same request through OpenAI's API, streamed (`"stream": true`).

For each: time to first token (median of 50 one-token requests, send to first event read, raw
socket), server CPU per token over one 50000-token stream (the frontend's per-token cost is the
/v1 row minus the in-process one), and streams of 16 tokens per second at concurrency 16 (16
keep-alive connections, one thread each) with the server's CPU per stream over them.

Compare the paths' per-request cost by the CPU per stream, not by streams/s: streams/s is a
wall-clock rate, and on a shared machine it follows the CPU the server and the readers get from
one five-second run to the next (other work's load), not the path. An earlier table (load 9.5)
put /v1 at 0.78x generate_stream's streams/s; later runs put it anywhere from 0.82x to 1.43x,
while the server's CPU per 16-token stream stayed within about 10% of generate_stream's, the
readers' CPU per stream was the same, and at concurrency 1 a stream took the same time (+15 µs
of 950). What /v1 does more per stream: it reads one more JSON body (OpenAI's, mapped onto the
generate form) and writes one more event (the finish chunk with [DONE], which ends an OpenAI
stream; this model gives no finish_reason, so it can only follow the last token). Its chunks
are written without printf (a profile showed printf at 3% of the /v1 server's CPU before).
Rounds alternate the order of the paths, so that a load that rises or falls over a round does
not favour the path that runs first.

    .venv/bin/python benchmarks/openai_frontend.py [--quick] [--rounds R]

(Not benchmarks/openai.py: with benchmarks/ on sys.path that name would hide the openai SDK.)

KServe's OpenAI server beside openinfer on a language model: benchmarks/openai_peers.py.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
from s11_streaming import cpu_seconds  # noqa: E402

NAME = "openai"

MODEL_PY = '''
import json

import numpy as np

TOKEN = np.array([b"x"], dtype=np.object_)


def infer(inputs):
    n = json.loads(inputs["sampling_parameters"].reshape(-1)[0]).get("max_tokens", 16)
    for _ in range(n):
        yield {"text_output": TOKEN}
'''

CONFIG = '''
name: "tokens"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
'''


def make_repo(tmp: Path) -> Path:
    return C.python_model_repo(tmp, "tokens", CONFIG, MODEL_PY)


def request(path: str, n: int) -> bytes:
    """The streamed request for n tokens on one of the two HTTP paths."""
    if path == "/v1/completions":
        body = {"model": "tokens", "prompt": "x", "max_tokens": n, "stream": True}
    else:
        body = {"text_input": "x", "sampling_parameters": json.dumps({"max_tokens": n})}
    data = json.dumps(body).encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data


PATHS = {"generate_stream": "/v2/models/tokens/generate_stream", "/v1/completions": "/v1/completions"}


def stream(sock: socket.socket, req: bytes) -> float:
    """Sends one request on a keep-alive connection and reads its chunked answer to the end;
    returns the seconds to its first event."""
    t0 = time.perf_counter()
    sock.sendall(req)
    tail, first = b"", 0.0
    while not tail.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("closed mid-answer")
        tail = tail[-16:] + chunk  # the answer's end, and an event split across reads
        if not first and b"data: " in tail:
            first = time.perf_counter() - t0
    return first


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def ttft(port: int, path: str) -> float:
    with connect(port) as sock:
        return statistics.median(stream(sock, request(path, 1)) for _ in range(50))


def per_token(port: int, pid: int, path: str, n: int) -> tuple[float, float]:
    """Server CPU and wall seconds per token over one n-token stream."""
    with connect(port) as sock:
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        stream(sock, request(path, n))
        return (cpu_seconds(pid) - c0) / n, (time.perf_counter() - t0) / n


def throughput(port: int, pid: int, path: str, seconds: float, concurrency: int = 16,
               n: int = 16) -> tuple[float, float]:
    """Complete n-token streams per second at `concurrency`, and the server's CPU seconds per
    stream over them."""
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    rps = streams_per_second(port, request(path, n), seconds, concurrency)
    streams = max(rps * (time.perf_counter() - t0), 1)
    return rps, (cpu_seconds(pid) - c0) / streams


def streams_per_second(port: int, req: bytes, seconds: float, concurrency: int) -> float:
    """Complete answers to `req` (a streamed request) per second, `concurrency` keep-alive
    connections sending it over and over, one thread each."""
    done = [0] * concurrency
    stop = time.perf_counter() + seconds

    def run(i: int) -> None:
        with connect(port) as sock:
            while time.perf_counter() < stop:
                stream(sock, req)
                done[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def in_process(repo: Path, n: int) -> tuple[float, float]:
    """The handler's own time to its first token and per token."""
    sys.path.insert(0, str(C.REPO_ROOT / "python"))
    from openinfer._repository.repository import scan

    (loaded,) = [m for m in scan(repo) if m.name == "tokens"]
    inputs = {"text_input": np.array([b"x"], dtype=np.object_),
              "sampling_parameters": np.array([json.dumps({"max_tokens": n}).encode()], dtype=np.object_)}
    firsts = []
    for _ in range(50):
        t0 = time.perf_counter()
        next(iter(loaded.model.handler({**inputs, "sampling_parameters": np.array([b'{"max_tokens": 1}'],
                                                                                    dtype=np.object_)},
                                       None, ("text_output",))))
        firsts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    count = sum(1 for _ in loaded.model.handler(inputs, None, ("text_output",)))
    return statistics.median(firsts), (time.perf_counter() - t0) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="where openai.md goes (results/, raw/ when quick)")
    args = ap.parse_args()
    out = args.out or C.RESULTS_DIR / ("raw" if args.quick else "")
    # Long streams for the CPU column: the kernel counts CPU time in 10 ms ticks.
    rounds, seconds, n = (1, 2.0, 5000) if args.quick else (args.rounds, 5.0, 50000)
    tmp = Path(tempfile.mkdtemp(prefix="openai-"))
    repo = make_repo(tmp)
    port = C.free_port()
    cores = C.nproc()
    two = cores >= 2
    if two:  # the readers on the other CPU
        import os

        os.sched_setaffinity(0, {1})
    server = C.openinfer_server(port, "0" if two else None, tmp / "server.log", threads=1, extra=[str(repo)]).start()
    rows: dict[str, dict[str, list[float]]] = {name: {"ttft": [], "cpu": [], "wall": [], "rps": [], "stream_cpu": []}
                                               for name in PATHS}
    try:
        C.wait_http_ready(f"http://127.0.0.1:{port}/v2/models/tokens/ready")
        for path in PATHS.values():  # warm-up
            throughput(port, server.pid, path, 0.5)
        for r in range(rounds):  # A B B A: each round measures both paths, the first in turn
            for name, path in list(PATHS.items())[:: 1 if r % 2 == 0 else -1]:
                rows[name]["ttft"].append(ttft(port, path))
                cpu, wall = per_token(port, server.pid, path, n)
                rows[name]["cpu"].append(cpu)
                rows[name]["wall"].append(wall)
                rps, stream_cpu = throughput(port, server.pid, path, seconds)
                rows[name]["rps"].append(rps)
                rows[name]["stream_cpu"].append(stream_cpu)
    finally:
        server.stop()
    first, token = in_process(repo, n)
    med = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in rows.items()}
    v1, gen = med["/v1/completions"], med["generate_stream"]
    lines = ["# OpenAI's API: the /v1 frontend's own cost\n",
             f"Command: `{C.invocation()}` (server pinned to CPU {'0' if two else 'none'}, readers on CPU "
             f"{'1' if two else 'any'}, one event-loop thread; {C.now_utc()}, commit `{C.git_describe()}`, "
             f"{cores} cores, load {C.loadavg()}).\n",
             f"A Python generator of one-byte tokens; medians of {rounds} round(s), paths alternated.\n",
             "| path | time to first token | server CPU µs / token | wall µs / token "
             "| 16-token streams/s at concurrency 16 | server CPU µs / 16-token stream |",
             "|---|---|---|---|---|---|",
             f"| in-process (the handler) | {first * 1e3:.3f} ms | {token * 1e6:.1f} | {token * 1e6:.1f} | - | - |"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['ttft'] * 1e3:.3f} ms | {m['cpu'] * 1e6:.1f} | {m['wall'] * 1e6:.1f} | "
                     f"{m['rps']:,.0f} | {m['stream_cpu'] * 1e6:.0f} |")
    lines += ["",
              f"- /v1 over generate_stream: time to first token {(v1['ttft'] - gen['ttft']) * 1e6:+.0f} µs, "
              f"server CPU per token {(v1['cpu'] - gen['cpu']) * 1e6:+.1f} µs, server CPU per 16-token stream "
              f"{(v1['stream_cpu'] - gen['stream_cpu']) * 1e6:+.0f} µs ({v1['stream_cpu'] / gen['stream_cpu']:.2f}x), "
              f"streams/s {v1['rps'] / gen['rps']:.2f}x.",
              f"- /v1 over the in-process handler (the whole server: HTTP, queue, executor, the model's "
              f"thread hand-off, SSE): time to first token +{(v1['ttft'] - first) * 1e3:.3f} ms, server CPU "
              f"per token {(v1['cpu'] - token) * 1e6:+.1f} µs.",
              "- Time to first token is read by a Python raw-socket reader, the same for every row.",
              "- Streams/s is a wall-clock rate: on a shared machine it follows the CPU the server and the readers "
              "get (the load above), so the paths are compared by their CPU per stream (the module's docstring)."]
    text = "\n".join(lines) + "\n"
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    page = out / f"{NAME}.md"
    # This run replaces the page's first section only: the sections after it (aiperf, KServe)
    # are other scripts' runs.
    later = page.read_text().partition("\n## ")[1:] if page.exists() else ("", "")
    page.write_text(text + "".join(later))


if __name__ == "__main__":
    main()
