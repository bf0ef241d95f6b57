#!/usr/bin/env python3
"""S3 and S4 over gRPC.

S3: model `simple` (INT32 [1,16] add/sub) as ModelInfer (unary) and ModelStreamInfer, at
concurrency 1, 8 and 64. S4 (gRPC part): identity_fp32 with a 16 MiB tensor, against the raw TCP
loopback throughput of the same round trip (16 MiB out, 16 MiB back) measured in the same run.

    .venv/bin/python benchmarks/s3_grpc.py [--quick] [--concurrency 1,8,64] [--duration S]
                                           [--rounds N]

Load generator: h2load (Debian's nghttp2-client, written in C by the nghttp2 project), which
sends a pre-framed gRPC message (5-byte prefix + ModelInferRequest) as each request body with
`content-type: application/grpc`; one connection, `-m <concurrency>` concurrent streams (one
gRPC channel with that many calls in flight). h2load judges success by HTTP status only, so
every answer's DATA bytes are checked against the exact length of the verified response, and
the answer itself is verified with grpcio before and after the load. Streaming at concurrency c:
one ModelStreamInfer call at a time, each carrying c messages sent at once (so c messages are in
flight, as in unary); the rate counted is messages answered per second. Peers (MLServer, KServe gRPC)
belong to issue 6 and are not run here.

Protocol (../shared/BENCHMARKS.md): server pinned to CPU 0, load to CPU 1; warm-up, then
rounds; for S4 gRPC and raw TCP alternate A B A B and the claim is the median per-round ratio.
"""

from __future__ import annotations

import argparse
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s3_grpc"
SERVICE = "/inference.GRPCInferenceService/"
BIG_BYTES = 16 << 20


# ---- messages ----------------------------------------------------------------------------------


def stubs(tmp: Path):
    """Message classes generated from proto/ with grpcio-tools (as the tests do)."""
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{C.REPO_ROOT / 'proto'}",
                        f"--python_out={tmp}", str(C.REPO_ROOT / "proto" / "grpc_service.proto")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: grpc_tools.protoc failed: {r.stderr}")
    sys.path.insert(0, str(tmp))
    import grpc_service_pb2  # noqa: PLC0415

    return grpc_service_pb2


def simple_request(pb) -> bytes:
    req = pb.ModelInferRequest(model_name="simple")
    for name, arr in (("INPUT0", np.arange(16, dtype=np.int32)), ("INPUT1", np.ones(16, dtype=np.int32))):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(arr.tobytes())
    return req.SerializeToString()


def big_request(pb) -> tuple[bytes, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(BIG_BYTES // 4, dtype=np.float32)
    req = pb.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[x.size])
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString(), x


def framed(msg: bytes) -> bytes:
    return struct.pack(">BI", 0, len(msg)) + msg


def verify(pb, port: int, simple: bytes, big: bytes, x: np.ndarray) -> tuple[int, int, int]:
    """Checks the answers with grpcio and returns the framed response lengths (unary simple,
    one streamed simple answer, unary 16 MiB) the load must reproduce exactly."""
    import grpc  # noqa: PLC0415

    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        raw = ch.unary_unary(SERVICE + "ModelInfer")(simple, timeout=30)
        resp = pb.ModelInferResponse.FromString(raw)
        out = {o.name: np.frombuffer(resp.raw_output_contents[i], np.int32) for i, o in enumerate(resp.outputs)}
        if out["OUTPUT0"].tolist() != list(range(1, 17)) or out["OUTPUT1"].tolist() != list(range(-1, 15)):
            raise SystemExit(f"error: wrong answer from openinfer: {resp}")
        sraw = list(ch.stream_stream(SERVICE + "ModelStreamInfer")(iter([simple]), timeout=30))
        sresp = pb.ModelStreamInferResponse.FromString(sraw[0])
        if sresp.error_message or sresp.infer_response.SerializeToString() != raw:
            raise SystemExit(f"error: wrong streamed answer: {sresp}")
        braw = ch.unary_unary(SERVICE + "ModelInfer")(big, timeout=60)
        bresp = pb.ModelInferResponse.FromString(braw)
        if not np.array_equal(np.frombuffer(bresp.raw_output_contents[0], np.float32), x):
            raise SystemExit("error: wrong 16 MiB answer")
    return len(framed(raw)), len(framed(sraw[0])), len(framed(braw))


# ---- h2load ------------------------------------------------------------------------------------


def run_h2load(port: int, rpc: str, body: Path, conc: int, duration: int, cpu: str, log: Path,
               answer_len: int, per_request: int) -> dict:
    """One bounded h2load run; returns req/s (messages/s), p50/p99 µs and an error if any."""
    cmd = ["taskset", "-c", cpu, "h2load", "-c", "1", "-m", str(conc), "-D", str(duration), "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
           f"--log-file={log}", f"http://127.0.0.1:{port}{SERVICE}{rpc}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    text = p.stdout + p.stderr
    res = {"rps": float("nan"), "p50_us": float("nan"), "p99_us": float("nan"), "error": None, "raw": text}
    m_req = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                      text)
    m_fin = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", text)
    m_data = re.search(r"headers \(space savings [^)]*\), [\d.]+\w*B \((\d+)\) data", text)
    if p.returncode != 0 or not (m_req and m_fin and m_data):
        res["error"] = f"h2load rc={p.returncode}: {text[-300:]}"
        return res
    done, ok = int(m_req.group(2)), int(m_req.group(3))
    if ok != done or int(m_req.group(4)) or int(m_req.group(5)) or done == 0:
        res["error"] = f"h2load: {m_req.group(0)}"
        return res
    # Every finished call got its whole answer; calls cut off by the end of the run may have
    # part of theirs (at most `conc` of them). An error answer (Trailers-Only) has no DATA.
    data, each = int(m_data.group(1)), answer_len * per_request
    if not done * each <= data <= (done + conc) * each:
        res["error"] = f"answers have {data} DATA bytes for {done} calls; expected {each} each"
        return res
    res["rps"] = float(m_fin.group(2)) * per_request
    durs = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line.count("\t") >= 2)
    if durs:
        res["p50_us"] = durs[len(durs) // 2]
        res["p99_us"] = durs[min(len(durs) - 1, int(len(durs) * 0.99))]
    return res


# ---- raw TCP ------------------------------------------------------------------------------------


def tcp_echo_server(port: int, cpu: str, log: Path) -> C.ServerProcess:
    code = (
        "import socket,sys\n"
        f"N={BIG_BYTES}\n"
        "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        f"s.bind(('127.0.0.1',{port}));s.listen(1)\n"
        "buf=bytearray(N);mv=memoryview(buf)\n"
        "while True:\n"
        "  c,_=s.accept()\n"
        "  while True:\n"
        "    got=0\n"
        "    while got<N:\n"
        "      n=c.recv_into(mv[got:])\n"
        "      if n==0: break\n"
        "      got+=n\n"
        "    if got<N: break\n"
        "    c.sendall(mv)\n"
        "  c.close()\n"
    )
    return C.ServerProcess("tcp-echo", [sys.executable, "-c", code], cpu, log)


def run_tcp(port: int, duration: int, cpu: str) -> dict:
    """Round trips of 16 MiB out and back over loopback from a client pinned to `cpu`."""
    code = (
        "import socket,time,sys\n"
        f"N={BIG_BYTES}\n"
        f"c=socket.create_connection(('127.0.0.1',{port}))\n"
        "out=bytes(N);buf=bytearray(N);mv=memoryview(buf)\n"
        "def once():\n"
        "  c.sendall(out);got=0\n"
        "  while got<N: got+=c.recv_into(mv[got:])\n"
        "t=time.monotonic()\n"
        "while time.monotonic()-t<1: once()\n"
        f"t=time.monotonic();k=0\n"
        f"while time.monotonic()-t<{duration}:\n"
        "  once();k+=1\n"
        "print(k/(time.monotonic()-t))\n"
    )
    p = subprocess.run(["taskset", "-c", cpu, sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=duration + 60)
    if p.returncode != 0:
        return {"rps": float("nan"), "error": p.stderr[-300:]}
    return {"rps": float(p.stdout.strip()), "error": None}


def wait_port(port: int, proc: C.ServerProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise SystemExit(f"error: {proc.name} exited: {proc.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"error: {proc.name} not listening on {port}")


# ---- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run (under a minute), results to results/raw/")
    ap.add_argument("--concurrency", type=C.parse_int_list, default=[1, 8, 64])
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds = 2, 1
    return args


def main() -> int:
    args = parse_args()
    C.ensure_debian_packages([["nghttp2-client"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or (raw_dir if args.quick else C.RESULTS_DIR)
    pb = stubs(C.make_tmpdir("openinfer-s3-stubs-"))
    simple = simple_request(pb)
    big, x = big_request(pb)
    bodies = {"unary": raw_dir / "simple.grpc", "big": raw_dir / "big.grpc"}
    bodies["unary"].write_bytes(framed(simple))
    bodies["big"].write_bytes(framed(big))
    for c in args.concurrency:
        bodies[f"stream{c}"] = raw_dir / f"simple_stream{c}.grpc"
        bodies[f"stream{c}"].write_bytes(framed(simple) * c)

    http_port, grpc_port, tcp_port = C.free_port(), C.free_port(), C.free_port()
    started, load_before = time.monotonic(), C.loadavg()
    oi = C.openinfer_server(http_port, args.server_cpu, raw_dir / "openinfer.log", threads=1,
                            extra=["--grpc-port", str(grpc_port)])
    tcp = tcp_echo_server(tcp_port, args.server_cpu, raw_dir / "tcp.log")
    s3: dict[tuple[str, int], list[dict]] = {}
    s4: dict[str, list[dict]] = {"grpc": [], "tcp": []}
    failures: list[str] = []
    notes: list[str] = []
    with oi, tcp:
        C.wait_http_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", proc=oi)
        wait_port(grpc_port, oi)
        wait_port(tcp_port, tcp)
        lens = verify(pb, grpc_port, simple, big, x)
        print(f"[s3] openinfer pid {oi.pid} (HTTP :{http_port}, gRPC :{grpc_port}) and TCP echo pid {tcp.pid} on "
              f"CPU {args.server_cpu}; h2load and the TCP client on CPU {args.client_cpu}; answers verified",
              flush=True)

        for c in args.concurrency:
            for mode in ("unary", "stream"):
                rpc = "ModelInfer" if mode == "unary" else "ModelStreamInfer"
                per = 1 if mode == "unary" else c
                streams = c if mode == "unary" else 1
                alen = lens[0] if mode == "unary" else lens[1]
                body = bodies["unary" if mode == "unary" else f"stream{c}"]
                w = run_h2load(grpc_port, rpc, body, streams, 2, args.client_cpu, raw_dir / "warmup.log", alen, per)
                if w["error"]:
                    notes.append(f"S3 {mode} c={c} warm-up (discarded): {w['error']}")
                for rnd in range(args.rounds):
                    r = run_h2load(grpc_port, rpc, body, streams, args.duration, args.client_cpu,
                                   raw_dir / f"{mode}_c{c}_r{rnd}.log", alen, per)
                    (raw_dir / f"{mode}_c{c}_r{rnd}.txt").write_text(r.pop("raw"))
                    s3.setdefault((mode, c), []).append(r)
                    if r["error"]:
                        failures.append(f"S3 {mode} c={c}: {r['error']}")
                    print(f"[s3] {mode:<6} c={c:<3} round {rnd + 1}: {r['rps']:>10,.0f} msg/s  p50 {r['p50_us']:>8} us"
                          f"  p99 {r['p99_us']:>8} us  {r['error'] or 'ok'}", flush=True)

        run_h2load(grpc_port, "ModelInfer", bodies["big"], 1, 1, args.client_cpu, raw_dir / "warmup.log", lens[2], 1)
        for rnd in range(args.rounds):  # A B A B
            g = run_h2load(grpc_port, "ModelInfer", bodies["big"], 1, args.duration, args.client_cpu,
                           raw_dir / f"big_r{rnd}.log", lens[2], 1)
            (raw_dir / f"big_r{rnd}.txt").write_text(g.pop("raw"))
            t = run_tcp(tcp_port, args.duration, args.client_cpu)
            s4["grpc"].append(g)
            s4["tcp"].append(t)
            for what, r in (("gRPC", g), ("TCP", t)):
                if r["error"]:
                    failures.append(f"S4 {what}: {r['error']}")
            print(f"[s4] round {rnd + 1}: gRPC {g['rps'] * BIG_BYTES / 1e9:6.2f} GB/s  raw TCP "
                  f"{t['rps'] * BIG_BYTES / 1e9:6.2f} GB/s  ratio {g['rps'] / t['rps']:.2f}", flush=True)
        verify(pb, grpc_port, simple, big, x)
        if not oi.alive():
            failures.append("openinfer exited during the run")

    # ---- report ----
    rows, csv_rows = [], []
    for (mode, c), runs in s3.items():
        rps = C.summarize([r["rps"] for r in runs])
        p50 = C.summarize([r["p50_us"] for r in runs])
        p99 = C.summarize([r["p99_us"] for r in runs])
        rows.append([mode, c, rps.fmt(), p50.fmt(), p99.fmt()])
        csv_rows += [["S3", mode, c, i, r["rps"], r["p50_us"], r["p99_us"], r["error"] or ""] for i, r in enumerate(runs)]
    ratios = C.paired_ratios([r["rps"] for r in s4["grpc"]], [r["rps"] for r in s4["tcp"]])
    gbs = C.summarize([r["rps"] * BIG_BYTES / 1e9 for r in s4["grpc"]])
    tbs = C.summarize([r["rps"] * BIG_BYTES / 1e9 for r in s4["tcp"]])
    csv_rows += [["S4", "grpc_16MiB", 1, i, g["rps"], "", "", g["error"] or ""] for i, g in enumerate(s4["grpc"])]
    csv_rows += [["S4", "tcp_16MiB", 1, i, t["rps"], "", "", t["error"] or ""] for i, t in enumerate(s4["tcp"])]
    status = "FAILED: " + "; ".join(failures) if failures else "all answers verified"
    md = [
        f"# S3/S4 — gRPC\n\nRun {C.now_utc()}, openinfer commit `{C.git_describe()}`, "
        f"{time.monotonic() - started:.0f} s wall. {status}.\n",
        f"```\n{C.invocation()}\n```\n",
        "## S3: `simple` over gRPC\n\nMedian (min–max) over rounds. Streaming at concurrency c: one "
        "ModelStreamInfer call at a time carrying c messages at once; req/s counts messages answered, and "
        "its latency is that of the whole call of c messages.\n",
        C.markdown_table(["mode", "concurrency", "req/s", "p50 µs", "p99 µs"], rows),
        "\n## S4: identity_fp32, 16 MiB tensor, gRPC vs raw TCP loopback\n\n"
        "**Claim: gRPC/TCP** = median of per-round ratios of round trips per second (min–max); each round "
        "trip carries 16 MiB out and 16 MiB back.\n",
        C.markdown_table(["gRPC GB/s (tensor bytes one way)", "raw TCP GB/s", "gRPC/TCP"],
                         [[gbs.fmt(".2f"), tbs.fmt(".2f"), C.summarize(ratios).fmt(".2f")]]),
        "\n## Method\n\n"
        f"- openinfer: `python -m openinfer serve --threads 1 --grpc-port P` (bundled examples), `taskset -c "
        f"{args.server_cpu}`. Load: `taskset -c {args.client_cpu} h2load -c 1 -m <concurrency> -D {args.duration} "
        "-d <framed ModelInferRequest> -H 'content-type: application/grpc' -H 'te: trailers'`; "
        "p50/p99 from h2load's per-request log. Every answer's DATA length is checked against the verified "
        "response; answers verified with grpcio before and after. A 1 s h2load run warms up each point.\n"
        "- Raw TCP: a Python echo server (recv_into a 16 MiB buffer, sendall it back) on the server CPU and a "
        "Python client (sendall 16 MiB, recv_into 16 MiB) on the client CPU, alternating with the gRPC rounds.\n"
        "- The gRPC 16 MiB client is h2load (C); its default 16 KiB receive frames and window handling are "
        "part of the measured cost.\n"
        f"- Machine: {', '.join(f'{k} {v}' for k, v in C.machine_facts().items())}; "
        f"{C.tool_version(['h2load', '--version'])}; load before {load_before}, after {C.loadavg()}.\n"
        f"- Raw output: `{raw_dir.relative_to(C.REPO_ROOT)}` (not committed).\n",
        *(f"- Note: {n}\n" for n in notes),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.md").write_text("\n".join(md))
    C.write_csv(out_dir / f"{NAME}.csv", ["scenario", "mode", "concurrency", "round", "per_s", "p50_us", "p99_us",
                                         "error"], csv_rows)
    print("\n".join(md))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
