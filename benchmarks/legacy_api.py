#!/usr/bin/env python3
"""The legacy v1 API (TensorRT Inference Server 1.x) beside V2, on one openinfer server.

HTTP: `POST /api/infer/simple` (NV-InferRequest header, raw 128-byte body, both outputs raw)
against V2 binary tensor data on the same model (benchmarks/wrk/s2_simple_binary.lua, what
tritonclient.http sends), at concurrency 1, 8 and 64 with wrk. gRPC: GRPCService/Infer against
GRPCInferenceService/ModelInfer, `simple`, with h2load (one connection, c streams in flight).

    .venv/bin/python benchmarks/legacy_api.py [--quick] [--concurrency 1,8,64] [--duration S]
                                              [--rounds N]

Protocol (../shared/BENCHMARKS.md): server pinned to CPU 0, load to CPU 1; a warm-up, then rounds
alternating legacy and V2 (A B A B); the claim is the median of per-round ratios legacy / V2.
Every answer is verified before the load (values, and for h2load the exact DATA length of one
answer), and each wrk run must have no non-2xx answer.
"""

from __future__ import annotations

import argparse
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "legacy_api"
LEGACY_HEADER = ('batch_size: 1 input { name: "INPUT0" } input { name: "INPUT1" } '
                 'output { name: "OUTPUT0" } output { name: "OUTPUT1" }')
A = np.arange(16, dtype=np.int32)
B = np.ones(16, dtype=np.int32)


# ---- protobuf wire, by hand (the legacy and V2 protos share file names: no stubs needed) -----


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def field(num: int, payload: bytes) -> bytes:
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    out, i = [], 0
    while i < len(buf):
        key, n = 0, 0
        while True:
            b = buf[i]
            i += 1
            key |= (b & 0x7F) << n
            n += 7
            if b < 0x80:
                break
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, n = 0, 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7F) << n
                n += 7
                if b < 0x80:
                    break
            out.append((num, v))
        elif wt == 2:
            ln, n = 0, 0
            while True:
                b = buf[i]
                i += 1
                ln |= (b & 0x7F) << n
                n += 7
                if b < 0x80:
                    break
            out.append((num, buf[i:i + ln]))
            i += ln
        else:
            raise ValueError(f"wire type {wt}")
    return out


def legacy_request() -> bytes:
    """nvidia.inferenceserver.InferRequest for `simple`: model_name 1, model_version 2 (-1:
    latest), meta_data 3 (InferRequestHeader: batch_size 1, input 2 {name 1}, output 3 {name 1}),
    raw_input 4."""
    hdr = varint(1 << 3) + varint(1)
    hdr += field(2, field(1, b"INPUT0")) + field(2, field(1, b"INPUT1"))
    hdr += field(3, field(1, b"OUTPUT0")) + field(3, field(1, b"OUTPUT1"))
    return (field(1, b"simple") + varint(2 << 3) + varint(-1) + field(3, hdr) +
            field(4, A.tobytes()) + field(4, B.tobytes()))


def v2_request() -> bytes:
    """inference.ModelInferRequest for `simple`: inputs 5 {name, datatype, shape packed},
    outputs 6, raw_input_contents 7 (as tritonclient.grpc sends it)."""
    def tensor(name: bytes) -> bytes:
        return field(1, name) + field(2, b"INT32") + field(3, varint(1) + varint(16))
    return (field(1, b"simple") + field(5, tensor(b"INPUT0")) + field(5, tensor(b"INPUT1")) +
            field(6, field(1, b"OUTPUT0")) + field(6, field(1, b"OUTPUT1")) +
            field(7, A.tobytes()) + field(7, B.tobytes()))


def framed(msg: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(msg)) + msg


def verify_grpc(port: int) -> dict[str, int]:
    """One answer of each service checked with grpcio; returns each framed answer's length."""
    import grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        raw = ch.unary_unary("/nvidia.inferenceserver.GRPCService/Infer")(legacy_request(), timeout=30)
        f = fields(raw)
        status = dict(fields(next(v for k, v in f if k == 1)))
        outs = [v for k, v in f if k == 3]
        if status.get(1) != 1 or [np.frombuffer(o, np.int32).tolist() for o in outs] != [(A + B).tolist(),
                                                                                       (A - B).tolist()]:
            raise SystemExit(f"error: wrong legacy gRPC answer: {f}")
        legacy = len(framed(raw))
        raw = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(v2_request(), timeout=30)
        outs = [v for k, v in fields(raw) if k == 6]
        if [np.frombuffer(o, np.int32).tolist() for o in outs] != [(A + B).tolist(), (A - B).tolist()]:
            raise SystemExit(f"error: wrong V2 gRPC answer: {fields(raw)}")
        return {"legacy": legacy, "v2": len(framed(raw))}


def run_h2load(port: int, path: str, body: Path, conc: int, duration: int, cpu: str, answer_len: int) -> dict:
    cmd = ["taskset", "-c", cpu, "h2load", "-c", "1", "-m", str(conc), "-D", str(duration), "-d", str(body),
           "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{port}{path}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    text = p.stdout + p.stderr
    m_req = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                      text)
    m_fin = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", text)
    m_data = re.search(r"headers \(space savings [^)]*\), [\d.]+\w*B \((\d+)\) data", text)
    if p.returncode != 0 or not (m_req and m_fin and m_data):
        return {"rps": float("nan"), "error": f"h2load rc={p.returncode}: {text[-300:]}"}
    done, ok = int(m_req.group(2)), int(m_req.group(3))
    data = int(m_data.group(1))
    # The legacy answer's RequestStatus.request_id is a varint that grows with the count: a
    # few bytes either way of the verified answer's length.
    slack = 4 if "nvidia" in path else 0
    if ok != done or done == 0 or not done * (answer_len - slack) <= data <= (done + conc) * (answer_len + slack):
        return {"rps": float("nan"), "error": f"h2load: {m_req.group(0)}; {data} DATA bytes"}
    return {"rps": float(m_fin.group(2)), "error": None}


# ---- HTTP ----------------------------------------------------------------------------------------


def verify_http(port: int) -> None:
    status, headers, body = C.http_request_full(f"http://127.0.0.1:{port}/api/infer/simple",
                                                A.tobytes() + B.tobytes(), "POST",
                                                {"NV-InferRequest": LEGACY_HEADER})
    if status != 200 or np.frombuffer(body[:64], np.int32).tolist() != (A + B).tolist():
        raise SystemExit(f"error: wrong legacy HTTP answer: {status} {headers}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds = 2.0, 1
    C.ensure_debian_packages([["wrk"], ["nghttp2-client"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    concs = C.parse_int_list(args.concurrency)
    tmp = C.make_tmpdir("openinfer-legacy-")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    load_before = C.loadavg()
    port, grpc_port = C.free_port(), C.free_port()
    server = C.openinfer_server(port, args.server_cpu, raw_dir / "server.log",
                                extra=["--grpc-port", str(grpc_port)])
    server.start()
    C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready")
    verify_http(port)
    lengths = verify_grpc(grpc_port)
    scripts = {
        "legacy": C.write_wrk_script(tmp / "legacy.lua", "POST", A.tobytes() + B.tobytes(),
                                     {"NV-InferRequest": LEGACY_HEADER}),
        "v2": C.WRK_DIR / "s2_simple_binary.lua",
    }
    paths = {"legacy": "/api/infer/simple", "v2": "/v2/models/simple/infer"}
    bodies = {"legacy": tmp / "legacy.grpc", "v2": tmp / "v2.grpc"}
    bodies["legacy"].write_bytes(framed(legacy_request()))
    bodies["v2"].write_bytes(framed(v2_request()))
    rpcs = {"legacy": "/nvidia.inferenceserver.GRPCService/Infer", "v2": "/inference.GRPCInferenceService/ModelInfer"}
    rows, problems = [], []
    for conc in concs:
        for kind in ("legacy", "v2"):  # warm-up
            C.run_wrk(f"http://127.0.0.1:{port}{paths[kind]}", scripts[kind], conc, 1, args.client_cpu,
                      threads=1, servers=[server])
            run_h2load(grpc_port, rpcs[kind], bodies[kind], conc, 1, args.client_cpu, lengths[kind])
        http = {"legacy": [], "v2": []}
        grpc = {"legacy": [], "v2": []}
        for _ in range(args.rounds):
            for kind in ("legacy", "v2"):
                r = C.run_wrk(f"http://127.0.0.1:{port}{paths[kind]}", scripts[kind], conc, args.duration,
                              args.client_cpu, threads=1, servers=[server])
                if not r.ok or r.non2xx:
                    problems.append(f"HTTP {kind} c={conc}: {r.error or f'{r.non2xx} non-2xx'}")
                http[kind].append(r.rps if r.ok and not r.non2xx else float("nan"))
            for kind in ("legacy", "v2"):
                g = run_h2load(grpc_port, rpcs[kind], bodies[kind], conc, int(args.duration), args.client_cpu,
                               lengths[kind])
                if g["error"]:
                    problems.append(f"gRPC {kind} c={conc}: {g['error']}")
                grpc[kind].append(g["rps"])
        for proto, res in (("HTTP", http), ("gRPC", grpc)):
            ratios = C.paired_ratios(res["legacy"], res["v2"])
            rows.append([proto, conc, f"{C.summarize(res['legacy']).median:,.0f}",
                         f"{C.summarize(res['v2']).median:,.0f}",
                         f"{C.summarize(ratios).median:.2f}" if ratios else "n/a"])
    server.stop()
    lines = C.report_header("Legacy v1 API beside V2 on `simple`", args.quick, time.monotonic() - started)
    lines += ["", C.markdown_table(["protocol", "concurrency", "legacy req/s", "V2 req/s", "legacy / V2 (median of rounds)"],
                                   rows), ""]
    lines += [f"HTTP: wrk -t1 -c<concurrency> -d{args.duration:g}s on CPU {args.client_cpu}, legacy "
              "`POST /api/infer/simple` (NV-InferRequest, 128-byte raw body) vs V2 binary tensor data "
              "(benchmarks/wrk/s2_simple_binary.lua). gRPC: h2load -c1 -m<concurrency>, GRPCService/Infer vs "
              f"ModelInfer, every answer's DATA length checked. Server on CPU {args.server_cpu}, one loop thread. "
              f"{args.rounds} rounds alternating legacy and V2.",
              C.machine_line((load_before, C.loadavg()),
                             [C.tool_version(["wrk", "-v"]), C.tool_version(["h2load", "--version"])])]
    lines += C.problems_section(problems)
    print("\n".join(lines))
    C.write_report(NAME, C.RESULTS_DIR, lines, "legacy")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
