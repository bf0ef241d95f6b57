#!/usr/bin/env python3
"""S11: streaming from a decoupled model (many responses per request).

A Python generator model `count` yields N responses of one INT32 each as fast as it can. Measured
side by side in one run, the server in its own process (pinned to CPU 0 where there are two):

- in-process: the same generator iterated in this process through the model's own handler, with
  no server: the limit the transports are compared with;
- gRPC: one ModelStreamInfer call carrying one request, read by grpcio (responses/s over the
  stream, and time to first response of a 1-response request);
- SSE: POST /v2/models/count/generate_stream, events read off a raw socket.

    .venv/bin/python benchmarks/s11_streaming.py [--quick] [--responses N] [--rounds R]

Time to first response is the median over 50 requests of one response each (from the request's
send to its first response read). Peer: native tritonserver (benchmarks/peers.py, the binary in the
nvidia-pytriton wheel) serving the same decoupled model with its Python backend, over gRPC
ModelStreamInfer read by the same grpcio client (--no-triton leaves it out).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s11_streaming"

MODEL_PY = '''
import numpy as np

def infer(inputs):
    n = int(inputs["N"][0])
    for i in range(n):
        yield {"OUT": np.array([i], dtype=np.int32)}
'''

CONFIG = '''
name: "count"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def make_repo(tmp: Path) -> Path:
    return C.python_model_repo(tmp, "count", CONFIG, MODEL_PY)


# ---- in-process limit ------------------------------------------------------------------------


def in_process(repo: Path, n: int) -> float:
    sys.path.insert(0, str(C.REPO_ROOT / "python"))
    from openinfer._repository.repository import scan

    (loaded,) = [m for m in scan(repo) if m.name == "count"]
    handler = loaded.model.handler
    t0 = time.perf_counter()
    count = sum(1 for _ in handler({"N": np.array([n], dtype=np.int32)}, None, ("OUT",)))
    return count / (time.perf_counter() - t0)


# ---- gRPC -------------------------------------------------------------------------------------


def grpc_stub(tmp: Path) -> tuple[Any, Any]:
    import grpc

    protos = sorted(str(p) for p in (C.REPO_ROOT / "proto").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{C.REPO_ROOT / 'proto'}",
                    f"--python_out={tmp}", f"--grpc_python_out={tmp}", *protos], check=True)
    sys.path.insert(0, str(tmp))
    import grpc_service_pb2 as pb  # type: ignore[import-not-found]
    import grpc_service_pb2_grpc as rpc  # type: ignore[import-not-found]

    return pb, rpc, grpc


def grpc_request(pb: Any, n: int) -> Any:
    req = pb.ModelInferRequest(model_name="count")
    req.inputs.add(name="N", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.array([n], dtype=np.int32).tobytes())
    return req


def grpc_rate(stub: Any, pb: Any, n: int) -> float:
    t0 = time.perf_counter()
    got = sum(1 for _ in stub.ModelStreamInfer(iter([grpc_request(pb, n)]), timeout=600))
    assert got == n, got
    return n / (time.perf_counter() - t0)


def grpc_ttfr(stub: Any, pb: Any) -> float:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        call = stub.ModelStreamInfer(iter([grpc_request(pb, 1)]), timeout=60)
        next(call)
        times.append(time.perf_counter() - t0)
        for _ in call:
            pass
    return statistics.median(times)


# ---- SSE --------------------------------------------------------------------------------------


def sse_events(port: int, n: int, first_only: bool = False) -> tuple[int, float]:
    """Sends one generate_stream request; returns (events read, seconds to the first)."""
    body = json.dumps({"N": n}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.perf_counter()
        s.sendall(b"POST /v2/models/count/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        buf, events, first = b"", 0, 0.0
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
            k = buf.count(b"\n\n")
            if k and not events:
                first = time.perf_counter() - t0
            events += k
            buf = buf[buf.rfind(b"\n\n") + 2:] if k else buf
            if buf.endswith(b"0\r\n\r\n") or (first_only and events):
                break
        return events, first


def sse_rate(port: int, n: int) -> float:
    t0 = time.perf_counter()
    events, _ = sse_events(port, n)
    assert events == n, events
    return n / (time.perf_counter() - t0)


def sse_ttfr(port: int) -> float:
    return statistics.median(sse_events(port, 1)[1] for _ in range(50))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (USER_HZ 100)


TRITON_MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def triton_peer(tmp: Path, cpus: str | None) -> tuple[Any, str]:
    """Native tritonserver (benchmarks/peers.py) serving the same decoupled `count` model with
    its Python backend (a response sender instead of a generator), or (None, why not)."""
    import peers

    d = tmp / "triton_repo" / "count"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(CONFIG)
    (d / "1" / "model.py").write_text(TRITON_MODEL_PY)
    try:
        peer = peers.start_triton(cpus, tmp / "triton-logs", repo=tmp / "triton_repo", models=["count"])
    except peers.PeerUnavailable as e:
        return None, str(e).splitlines()[0]
    return peer, peer.command


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--responses", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-triton", action="store_true", help="leave out native Triton")
    ap.add_argument("--out", type=Path, default=None, help="where s11_streaming.md goes (results/, raw/ when quick)")
    args = ap.parse_args()
    out = args.out or C.RESULTS_DIR / ("raw" if args.quick else "")
    n = 2000 if args.quick else args.responses
    rounds = 1 if args.quick else args.rounds
    tmp = Path(tempfile.mkdtemp(prefix="s11-"))
    repo = make_repo(tmp)
    pb, rpc, grpc = grpc_stub(tmp)
    port, gport = C.free_port(), C.free_port()
    cpus = "0" if C.nproc() >= 2 else None
    server = C.openinfer_server(port, cpus, tmp / "server.log", threads=1,
                                extra=[str(repo), "--grpc-port", str(gport)]).start()
    try:
        C.wait_http_ready(f"http://127.0.0.1:{port}/v2/models/count/ready")
        channel = grpc.insecure_channel(f"127.0.0.1:{gport}")
        stub = rpc.GRPCInferenceServiceStub(channel)
        grpc_rate(stub, pb, 100)  # warm-up
        sse_rate(port, 100)
        rows: dict[str, list[float]] = {"in-process": [], "gRPC": [], "SSE": []}
        cpu = {"gRPC": 0.0, "SSE": 0.0}
        for _ in range(rounds):
            rows["in-process"].append(in_process(repo, n))
            c0 = cpu_seconds(server.pid)
            rows["gRPC"].append(grpc_rate(stub, pb, n))
            c1 = cpu_seconds(server.pid)
            rows["SSE"].append(sse_rate(port, n))
            cpu["gRPC"] += c1 - c0
            cpu["SSE"] += cpu_seconds(server.pid) - c1
        ttfr = {"gRPC": grpc_ttfr(stub, pb), "SSE": sse_ttfr(port)}
        channel.close()
    finally:
        server.stop()
    triton, triton_note = (None, "skipped (--no-triton)") if args.no_triton else triton_peer(tmp, cpus)
    if triton is not None:
        try:
            tchannel = grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}")
            tstub = rpc.GRPCInferenceServiceStub(tchannel)
            grpc_rate(tstub, pb, 100)  # warm-up
            rows["Triton gRPC stream (native tritonserver, Python backend)"] = []
            for _ in range(rounds):
                rows["Triton gRPC stream (native tritonserver, Python backend)"].append(grpc_rate(tstub, pb, n))
            ttfr["Triton gRPC stream (native tritonserver, Python backend)"] = grpc_ttfr(tstub, pb)
            tchannel.close()
        finally:
            triton.stop()
    limit = statistics.median(rows["in-process"])
    lines = [f"# S11 streaming (decoupled model)\n",
             f"Command: `{C.invocation()}` (server pinned to CPU {cpus or 'none'}, one event-loop thread; "
             f"{C.now_utc()}, commit `{C.git_describe()}`, {C.nproc()} cores).\n",
             f"## S11 streaming: {n} responses of INT32[1] from one request, median of {rounds} round(s)\n",
             "| path | responses/s | vs in-process | time to first response | server CPU µs / response |",
             "|---|---|---|---|---|"]
    for name, values in rows.items():
        rate = statistics.median(values)
        first = f"{ttfr[name] * 1e3:.2f} ms" if name in ttfr else "-"
        per = f"{cpu[name] / (n * rounds) * 1e6:.1f}" if name in cpu else "-"
        lines.append(f"| {name} | {rate:,.0f} | {rate / limit:.2f} | {first} | {per} |")
    if triton is not None:
        t = statistics.median(rows["Triton gRPC stream (native tritonserver, Python backend)"])
        lines.append(f"\nopeninfer gRPC / Triton gRPC: {statistics.median(rows['gRPC']) / t:.2f}x responses/s; "
                     f"time to first response {ttfr['gRPC'] * 1e3:.2f} ms vs "
                     f"{ttfr['Triton gRPC stream (native tritonserver, Python backend)'] * 1e3:.2f} ms "
                     "(Triton's stub process CPU is not in its server CPU column, so that column is left out)")
    lines.append("\nThe rates are bound by the Python readers (grpcio's stream iterator, a raw-socket SSE "
                 "reader) more than by either server: server CPU per response is openinfer's own cost, and "
                 "a gRPC rate equal to Triton's means both outrun the same reader.")
    lines.append(f"\nTriton: {triton_note}")
    text = "\n".join(lines) + "\n"
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{NAME}.md").write_text(text)


if __name__ == "__main__":
    main()
