#!/usr/bin/env python3
"""Server CPU per 16 MiB round trip, plain text beside TLS (issue 35): what TLS costs the server,
read from the server process's own user + system time (/proc/PID/stat) over each measured run,
divided by the requests it answered. On a shared machine the request rate of a one-at-a-time
16 MiB round trip follows the load of other work and of the client's own encryption on the other
core; the server's CPU per request does not, so a change to the server's TLS path is judged by it.

    .venv/bin/python benchmarks/tls_cpu.py [--rounds N] [--duration S] [--before PYTHONPATH]

Two servers (plain, TLS; one loop thread each, on --server-cpu) of this checkout's build, and with
--before two more of another build's (e.g. /work/main/python), all measured in alternate rounds in
one run: gRPC ModelInfer of identity_fp32 with h2load, HTTP binary with openinfer.Client (the
client on --client-cpu). Prints, per build, req/s and server CPU ms per request of each round.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s3_grpc as S3  # noqa: E402
import tls as T  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3)
    ap.add_argument("--before", help="PYTHONPATH of another build to measure beside this one")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    args = ap.parse_args()
    C.check_cpus(args.server_cpu, args.client_cpu)
    tmp = C.make_tmpdir("openinfer-tls-cpu-")
    cert, key = T.make_cert(tmp)
    pb = S3.stubs(C.make_tmpdir("openinfer-tls-cpu-stubs-"))
    simple, (big, x) = S3.simple_request(pb), S3.big_request(pb)
    (tmp / "big.grpc").write_bytes(S3.framed(big))
    tls_flags = ["--http-use-ssl", "--http-server-cert", str(cert), "--http-server-key", str(key),
                 "--grpc-use-ssl", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]
    here = str(C.REPO_ROOT / "python")
    builds = {"this": here, **({"before": args.before} if args.before else {})}
    keys = [(b, k) for b in builds for k in ("plain", "tls")]
    ports = {bk: (C.free_port(), C.free_port()) for bk in keys}
    procs = {}
    env_path = os.environ.get("PYTHONPATH")
    try:
        for b, k in keys:  # each server imports its build (the servers inherit PYTHONPATH)
            os.environ["PYTHONPATH"] = builds[b]
            procs[(b, k)] = C.openinfer_server(ports[(b, k)][0], args.server_cpu, tmp / f"{b}-{k}.log", threads=1,
                                               extra=["--grpc-port", str(ports[(b, k)][1]),
                                                      *(tls_flags if k == "tls" else [])])
            procs[(b, k)].__enter__()
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
    try:
        for bk in keys:
            for port in ports[bk]:
                S3.wait_port(port, procs[bk])
        answer_len = S3.verify(pb, ports[keys[0]][1], simple, big, x)["big"]
        scheme = {"plain": "http", "tls": "https"}

        def grpc_big(bk, d: int) -> tuple[float, float]:
            r = S3.run_h2load(ports[bk][1], "ModelInfer", tmp / "big.grpc", 1, d, args.client_cpu,
                              tmp / "h2load.log", answer_len, 1, scheme=scheme[bk[1]])
            if r["error"]:
                raise SystemExit(f"error: h2load {bk}: {r['error']}")
            return float(r["rps"]), float(r["rps"]) * d

        def http_big(bk, d: int) -> tuple[float, float]:
            rps = T.http_big(f"{scheme[bk[1]]}://127.0.0.1:{ports[bk][0]}", cert, d, args.client_cpu)
            return rps, rps * d + 1  # the client's first request, a check, is not timed

        for name, fn in (("gRPC 16 MiB (h2load)", grpc_big), ("HTTP 16 MiB (openinfer.Client)", http_big)):
            for bk in keys:
                fn(bk, 1)  # warm-up
            got: dict = {bk: [] for bk in keys}
            for _ in range(args.rounds):
                for bk in keys:
                    pid = procs[bk].pid
                    c0 = cpu_seconds(pid)
                    rps, requests = fn(bk, args.duration)
                    got[bk].append((rps, (cpu_seconds(pid) - c0) / requests * 1000))
            for bk in keys:
                print(f"{name} | {bk[0]} {bk[1]} | " + ", ".join(f"{r:.1f} req/s {ms:.1f} ms" for r, ms in got[bk]))
            for b in builds:
                ratios = [t[0] / p[0] for p, t in zip(got[(b, "plain")], got[(b, "tls")]) if p[0] > 0]
                print(f"{name} | {b} TLS/plain req/s | " + ", ".join(f"{r:.2f}" for r in ratios), flush=True)
    finally:
        for p in procs.values():
            p.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
