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
flight, as in unary); the rate counted is messages answered per second. Peers (benchmarks/peers.py:
Triton run directly, Triton through PyTriton, MLServer, KServe) run side by side on the same core; a
peer or a part of one (streaming, 16 MiB) that does not work is reported with the error it gave.

Protocol (../shared/BENCHMARKS.md): server pinned to CPU 0, load to CPU 1; warm-up, then
rounds with the servers in turn (A B C A B C); for S4 the gRPC servers and raw TCP alternate likewise; the
claims are medians of per-round ratios.
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
    # Every .proto of proto/: grpc_service.proto imports model_config.proto.
    protos = sorted(str(p) for p in (C.REPO_ROOT / "proto").glob("*.proto"))
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{C.REPO_ROOT / 'proto'}",
                        f"--python_out={tmp}", *protos],
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


def verify(pb, port: int, simple: bytes, big: bytes, x: np.ndarray) -> dict:
    """Checks one server's answers with grpcio; returns the framed response lengths the load
    must reproduce exactly ("unary", "stream", "big"), or for a part the server does not do,
    the error it gave under "<part>_error". Raises SystemExit when unary `simple` is wrong."""
    import grpc  # noqa: PLC0415

    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    out: dict = {}
    want = {"OUTPUT0": list(range(1, 17)), "OUTPUT1": list(range(-1, 15))}

    def outputs(resp):
        if resp.raw_output_contents:
            return {o.name: np.frombuffer(resp.raw_output_contents[i], np.int32).tolist()
                    for i, o in enumerate(resp.outputs)}
        return {o.name: list(o.contents.int_contents) for o in resp.outputs}

    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        raw = ch.unary_unary(SERVICE + "ModelInfer")(simple, timeout=30)
        resp = pb.ModelInferResponse.FromString(raw)
        if outputs(resp) != want:
            raise SystemExit(f"error: wrong answer from :{port}: {resp}")
        out["unary"] = len(framed(raw))
        try:
            sraw = list(ch.stream_stream(SERVICE + "ModelStreamInfer")(iter([simple]), timeout=30))
            sresp = pb.ModelStreamInferResponse.FromString(sraw[0])
            if sresp.error_message or outputs(sresp.infer_response) != want:
                raise RuntimeError(f"wrong streamed answer: {sresp}")
            out["stream"] = len(framed(sraw[0]))
        except (grpc.RpcError, RuntimeError, IndexError) as e:
            out["stream_error"] = (f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError)
                                   else str(e)[:300])
        try:
            braw = ch.unary_unary(SERVICE + "ModelInfer")(big, timeout=120)
            bresp = pb.ModelInferResponse.FromString(braw)
            y = (np.frombuffer(bresp.raw_output_contents[0], np.float32)
                 if bresp.raw_output_contents else np.asarray(bresp.outputs[0].contents.fp32_contents,
                                                              np.float32))
            if not np.array_equal(y, x):
                raise RuntimeError("wrong 16 MiB answer")
            if not bresp.raw_output_contents:
                raise RuntimeError("16 MiB answer in typed contents, not raw (h2load counts "
                                   "raw bytes)")
            out["big"] = len(framed(braw))
        except (grpc.RpcError, RuntimeError, IndexError) as e:
            out["big_error"] = (f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError)
                                else str(e)[:300])
    return out


# ---- h2load ------------------------------------------------------------------------------------


def run_h2load(port: int, rpc: str, body: Path, conc: int, duration: int, cpu: str, log: Path,
               answer_len: int, per_request: int, scheme: str = "http") -> dict:
    """One bounded h2load run; returns req/s (messages/s), p50/p99 µs and an error if any.
    `scheme` "https" speaks TLS (ALPN h2) instead of h2c."""
    cmd = ["taskset", "-c", cpu, "h2load", "-c", "1", "-m", str(conc), "-D", str(duration), "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
           f"--log-file={log}", f"{scheme}://127.0.0.1:{port}{SERVICE}{rpc}"]
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
    ap.add_argument("--concurrency", type=C.parse_int_list, default=None, help="default 1,8,64 (quick 8)")
    ap.add_argument("--duration", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers", default=None, help="comma-separated peers (default triton,pytriton,mlserver,kserve; 'none')")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds = 1, 1
    args.concurrency = args.concurrency or ([8] if args.quick else [1, 8, 64])
    return args


def main() -> int:
    import peers as PEERS

    args = parse_args()
    C.ensure_debian_packages([["nghttp2-client"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
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
    s3: dict[tuple[str, int, str], list[dict]] = {}
    s4: dict[str, list[dict]] = {}
    failures: list[str] = []
    notes: list[str] = []
    peer_problems: list[str] = []
    peers: dict = {}
    ports = {"openinfer": grpc_port}
    procs = {"openinfer": oi}
    labels = {"openinfer": "openinfer"}
    lens: dict[str, dict] = {}
    try:
        with oi, tcp:
            C.wait_http_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", proc=oi)
            wait_port(grpc_port, oi)
            wait_port(tcp_port, tcp)
            lens["openinfer"] = verify(pb, grpc_port, simple, big, x)
            peers = PEERS.start_peers(C.peer_list(args.peers, ["triton", "pytriton", "mlserver",
                                                               "kserve"]),
                                      args.server_cpu, raw_dir, peer_problems)
            PEERS.check_same_answers(peers, f"http://127.0.0.1:{http_port}", peer_problems)
            for n, p in list(peers.items()):
                try:
                    wait_port(p.grpc_port, p.proc)
                    lens[n] = verify(pb, p.grpc_port, simple, big, x)
                except (SystemExit, Exception) as e:  # noqa: BLE001 - reported
                    peer_problems.append(f"{p.label} gRPC left out: {e}")
                    p.stop()
                    del peers[n]
                    continue
                ports[n], procs[n], labels[n] = p.grpc_port, p.proc, p.label
                for part in ("stream", "big"):
                    if f"{part}_error" in lens[n]:
                        what = "ModelStreamInfer" if part == "stream" else "ModelInfer with 16 MiB"
                        peer_problems.append(f"{p.label}: {what} not measured — it answered "
                                             f"`{lens[n][part + '_error']}`")
            names = list(ports)
            print(f"[s3] servers {', '.join(f'{n} gRPC :{ports[n]} pid {procs[n].pid}' for n in names)} and "
                  f"TCP echo pid {tcp.pid} on CPU {args.server_cpu}; h2load and the TCP client on CPU "
                  f"{args.client_cpu}; answers verified", flush=True)

            for mode in ("unary", "stream"):
                for c in args.concurrency:
                    rpc = "ModelInfer" if mode == "unary" else "ModelStreamInfer"
                    per = 1 if mode == "unary" else c
                    streams = c if mode == "unary" else 1
                    body = bodies["unary" if mode == "unary" else f"stream{c}"]
                    live = [n for n in names if mode in lens[n] and procs[n].alive()]
                    for n in live:
                        w = run_h2load(ports[n], rpc, body, streams, 1, args.client_cpu,
                                       raw_dir / "warmup.log", lens[n][mode], per)
                        if w["error"]:
                            notes.append(f"S3 {n} {mode} c={c} warm-up (discarded): {w['error']}")
                    for rnd in range(args.rounds):  # A B C ... A B C
                        for n in live:
                            r = run_h2load(ports[n], rpc, body, streams, args.duration, args.client_cpu,
                                           raw_dir / f"{n}_{mode}_c{c}_r{rnd}.log", lens[n][mode], per)
                            (raw_dir / f"{n}_{mode}_c{c}_r{rnd}.txt").write_text(r.pop("raw"))
                            s3.setdefault((mode, c, n), []).append(r)
                            if r["error"]:
                                failures.append(f"S3 {n} {mode} c={c}: {r['error']}")
                            print(f"[s3] {mode:<6} c={c:<3} round {rnd + 1} {n:<9}: {r['rps']:>9,.0f} msg/s  "
                                  f"p50 {r['p50_us']:>8} us  p99 {r['p99_us']:>8} us  {r['error'] or 'ok'}",
                                  flush=True)

            big_names = [n for n in names if "big" in lens[n] and procs[n].alive()]
            for n in big_names:
                run_h2load(ports[n], "ModelInfer", bodies["big"], 1, 1, args.client_cpu, raw_dir / "warmup.log",
                           lens[n]["big"], 1)
            for rnd in range(args.rounds):  # A B C ... TCP
                line = []
                for n in big_names:
                    g = run_h2load(ports[n], "ModelInfer", bodies["big"], 1, args.duration, args.client_cpu,
                                   raw_dir / f"{n}_big_r{rnd}.log", lens[n]["big"], 1)
                    (raw_dir / f"{n}_big_r{rnd}.txt").write_text(g.pop("raw"))
                    s4.setdefault(n, []).append(g)
                    if g["error"]:
                        failures.append(f"S4 {n}: {g['error']}")
                    line.append(f"{n} {g['rps'] * BIG_BYTES / 1e9:6.2f}")
                t = run_tcp(tcp_port, args.duration, args.client_cpu)
                s4.setdefault("tcp", []).append(t)
                if t["error"]:
                    failures.append(f"S4 TCP: {t['error']}")
                print(f"[s4] round {rnd + 1}: GB/s " + ", ".join(line)
                      + f", raw TCP {t['rps'] * BIG_BYTES / 1e9:6.2f}", flush=True)
            verify(pb, grpc_port, simple, big, x)
            if not oi.alive():
                failures.append("openinfer exited during the run")
            for n in names:
                if n != "openinfer" and procs[n].alive():
                    try:  # each peer's gRPC answers, as before the load
                        verify(pb, ports[n], simple, big, x)
                    except (SystemExit, Exception) as e:  # noqa: BLE001 - reported
                        notes.append(f"{labels[n]} failed the gRPC check after the load: {e}")
            PEERS.check_same_answers(peers, f"http://127.0.0.1:{http_port}", notes, after_load=True)
            for n, p in peers.items():
                if not p.alive():
                    notes.append(f"{p.label} exited during the run (rc={p.proc.returncode()})")
    finally:
        for p in peers.values():
            p.stop()

    # ---- report ----
    rows, csv_rows, ratio_rows = [], [], []
    for mode in ("unary", "stream"):
        for c in args.concurrency:
            a = s3.get((mode, c, "openinfer"), [])
            for n in ports:
                runs = s3.get((mode, c, n))
                if not runs:
                    continue
                ok = a and all(not r["error"] for r in a + runs)
                rs = C.paired_ratios([r["rps"] for r in a], [r["rps"] for r in runs]) if ok else []
                ratio = "1" if n == "openinfer" else (C.summarize(rs).fmt(".2f") if ok else "FAILED")
                if ok and n != "openinfer":
                    ratio_rows.append(C.ratio_row("S3", f"{mode} c={c}", labels[n], "peer", "msg/s", rs))
                rows.append([mode, c, labels[n], C.summarize([r["rps"] for r in runs]).fmt(), ratio,
                             C.summarize([r["p50_us"] for r in runs]).fmt(),
                             C.summarize([r["p99_us"] for r in runs]).fmt()])
                csv_rows += [["S3", mode, c, n, i, r["rps"], r["p50_us"], r["p99_us"], r["error"] or ""]
                             for i, r in enumerate(runs)]
    big_rows = []
    tcp_runs = s4.get("tcp", [])
    oi_big = s4.get("openinfer", [])
    for n, runs in s4.items():
        gbs = C.summarize([r["rps"] * BIG_BYTES / 1e9 for r in runs])
        vs_tcp = C.paired_ratios([r["rps"] for r in runs], [t["rps"] for t in tcp_runs])
        vs_oi = C.paired_ratios([r["rps"] for r in oi_big], [r["rps"] for r in runs])
        big_rows.append([labels.get(n, "raw TCP loopback (limit)"), gbs.fmt(".2f"),
                         C.summarize(vs_tcp).fmt(".2f") if n != "tcp" else "1",
                         C.summarize(vs_oi).fmt(".2f") if n not in ("openinfer",) else "1"])
        if n == "openinfer":
            ratio_rows.append(C.ratio_row("S4", "gRPC 16 MiB", "raw TCP loopback", "limit", "GB/s", vs_tcp))
        elif n != "tcp":
            ratio_rows.append(C.ratio_row("S4", "gRPC 16 MiB", labels.get(n, "raw TCP loopback"),
                                          "limit" if n == "tcp" else "peer", "GB/s", vs_oi))
        csv_rows += [["S4", f"{n}_16MiB", 1, n, i, r["rps"], "", "", r.get("error") or ""]
                     for i, r in enumerate(runs)]
    status = "FAILED: " + "; ".join(failures) if failures else "all answers verified"
    peer_lines = "".join(f"- {p.label}: {p.version}, `{p.command}`. {' '.join(p.notes)}".rstrip() + "\n"
                         for p in peers.values())
    pa_path, pa_note = PEERS.perf_analyzer_status()
    md = [
        f"# S3/S4 — gRPC{' (quick check)' if args.quick else ''}\n\nRun {C.now_utc()}, openinfer commit "
        f"`{C.git_describe()}`, {time.monotonic() - started:.0f} s wall. {status}.\n",
        f"```\n{C.invocation()}\n```\n",
        "## S3: `simple` over gRPC\n\nMedian (min–max) over rounds; **openinfer/X** = median of per-round ratios "
        "of messages/s. Streaming at concurrency c: one ModelStreamInfer call at a time carrying c messages at "
        "once; msg/s counts messages answered, and its latency is that of the whole call of c messages.\n",
        C.markdown_table(["mode", "concurrency", "server", "msg/s", "openinfer/X", "p50 µs", "p99 µs"], rows),
        "\n## S4: identity_fp32, 16 MiB tensor over gRPC, vs raw TCP loopback\n\n"
        "GB/s counts tensor bytes one way per round trip (16 MiB out and 16 MiB back each); ratios are medians "
        "of per-round ratios (min–max).\n",
        C.markdown_table(["server", "GB/s", "X/TCP", "openinfer/X"], big_rows),
        "\n## Method\n\n"
        f"- openinfer: `python -m openinfer serve --threads 1 --grpc-port P` (bundled examples), `taskset -c "
        f"{args.server_cpu}`.\n" + peer_lines +
        f"- Every server pinned to CPU {args.server_cpu} (all started at once, idle while another is measured). "
        f"Load: `taskset -c {args.client_cpu} h2load -c 1 -m <concurrency> -D {args.duration} "
        "-d <framed ModelInferRequest> -H 'content-type: application/grpc' -H 'te: trailers'`; "
        "p50/p99 from h2load's per-request log. Every answer's DATA length is checked against the verified "
        "response of that server; answers verified with grpcio before and after the load. A 1 s h2load run warms up each "
        f"server at each point; then {args.rounds} rounds of the servers in turn.\n"
        f"- Triton's perf_analyzer: not used — {pa_note} h2load (C, nghttp2) is the nearest real "
        "alternative: an outside load generator speaking gRPC over HTTP/2 with the same request bytes.\n"
        "- Raw TCP: a Python echo server (recv_into a 16 MiB buffer, sendall it back) on the server CPU and a "
        "Python client (sendall 16 MiB, recv_into 16 MiB) on the client CPU, alternating with the gRPC rounds.\n"
        "- The gRPC 16 MiB client is h2load (C); its default 16 KiB receive frames and window handling are "
        "part of the measured cost.\n"
        f"- Machine: {', '.join(f'{k} {v}' for k, v in C.machine_facts().items())}; "
        f"{C.tool_version(['h2load', '--version'])}; load before {load_before}, after {C.loadavg()}.\n"
        f"- Raw output: `{raw_dir.relative_to(C.REPO_ROOT)}` (not committed).\n",
        *(f"- Note: {n}\n" for n in notes),
    ]
    if peer_problems:
        md += ["\n## Peers or parts that did not run\n\n" + "".join(f"- {p}\n" for p in peer_problems)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.md").write_text("\n".join(md))
    C.write_csv(out_dir / f"{NAME}.csv", ["scenario", "mode", "concurrency", "server", "round", "per_s",
                                         "p50_us", "p99_us", "error"], csv_rows)
    C.write_ratios(out_dir, NAME, ratio_rows)
    plot = {}
    for n in ports:
        xs, med, lo, hi = [], [], [], []
        for c in args.concurrency:
            runs = s3.get(("unary", c, n))
            if runs and not any(r["error"] for r in runs):
                sm = C.summarize([r["rps"] for r in runs])
                xs.append(c), med.append(sm.median), lo.append(sm.lo), hi.append(sm.hi)
        plot[labels[n]] = (xs, med, lo, hi)
    note = C.plot_lines(out_dir / f"{NAME}.png", "S3: simple over gRPC, unary (median, min–max)",
                        "concurrency (streams in flight)", "requests/s", plot)
    if not note:
        (out_dir / f"{NAME}.md").write_text("\n".join(md) + f"\n![S3 req/s vs concurrency]({NAME}.png)\n")
    print("\n".join(md))
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s3] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
