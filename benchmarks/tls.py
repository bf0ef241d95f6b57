#!/usr/bin/env python3
"""TLS beside plain text (issue 35): S1 (model `simple` over HTTP JSON, wrk) and S3 (ModelInfer
of `simple` over gRPC, h2load) at concurrency 1, 8 and 64, and a 16 MiB FP32 tensor round trip
(identity_fp32: gRPC with h2load, HTTP binary with openinfer.Client), each against the same
server build serving plain text on one set of ports and TLS on another.

    .venv/bin/python benchmarks/tls.py [--concurrency 1,8,64] [--duration S] [--rounds N]
                                       [--server-cpu 0] [--client-cpu 1]

Two `openinfer serve` processes (one loop thread each) pinned to the same core, the load
generator to the other; per point both are warmed up, then measured alternately (plain, TLS)
for N rounds; the claim is the median of the per-round ratios TLS/plain. TLS: an EC P-256
certificate made here, TLS 1.3 as the clients negotiate it (wrk and h2load: OpenSSL, AES-GCM).
Prints a Markdown table; with --out writes it there too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s3_grpc as S3  # noqa: E402

HTTP_BIG = """
import json, sys, time
import numpy as np
import openinfer
url, ca, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
kw = {"ca_file": ca} if url.startswith("https") else {}
kw["shared_memory"] = False  # the socket is what is measured
x = np.random.default_rng(0).standard_normal(4 << 20, dtype=np.float32)
with openinfer.Client(url, **kw) as c:
    assert np.array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        c.infer("identity_fp32", {"INPUT0": x})
        n += 1
    print(json.dumps({"rps": n / (time.monotonic() - t0)}))
"""


def make_cert(d: Path) -> tuple[Path, Path]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def wrk_rps(url: str, script: Path, conc: int, duration: float, cpu: str, servers: list) -> float:
    r = C.run_wrk(url, script, conc, duration, cpu, threads=1, servers=servers)
    if r.error:
        raise SystemExit(f"error: wrk {url} c={conc}: {r.error}\n{r.raw[-500:] if r.raw else ''}")
    return r.rps


def http_big(url: str, ca: Path, duration: float, cpu: str) -> float:
    p = subprocess.run(["taskset", "-c", cpu, sys.executable, "-c", HTTP_BIG, url, str(ca), str(duration)],
                       capture_output=True, text=True, timeout=duration + 120,
                       env={**__import__("os").environ, "PYTHONPATH": str(C.REPO_ROOT / "python")})
    if p.returncode != 0:
        raise SystemExit(f"error: 16 MiB HTTP client on {url}: {p.stderr[-800:]}")
    return float(json.loads(p.stdout.strip().splitlines()[-1])["rps"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=C.parse_int_list, default=[1, 8, 64])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    C.check_cpus(args.server_cpu, args.client_cpu)
    tmp = C.make_tmpdir("openinfer-tls-bench-")
    cert, key = make_cert(tmp)
    pb = S3.stubs(C.make_tmpdir("openinfer-tls-stubs-"))
    simple, (big, x) = S3.simple_request(pb), S3.big_request(pb)
    bodies = {"simple": tmp / "simple.grpc", "big": tmp / "big.grpc"}
    bodies["simple"].write_bytes(S3.framed(simple))
    bodies["big"].write_bytes(S3.framed(big))
    script = tmp / "s1.lua"
    import s1_http_json as S1  # noqa: PLC0415

    C.write_wrk_script(script, "POST", S1.BODY, {"Content-Type": "application/json"})
    ports = {k: (C.free_port(), C.free_port()) for k in ("plain", "tls")}
    tls_flags = ["--http-use-ssl", "--http-server-cert", str(cert), "--http-server-key", str(key),
                 "--grpc-use-ssl", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]
    procs = {k: C.openinfer_server(ports[k][0], args.server_cpu, tmp / f"{k}.log", threads=1,
                                   extra=["--grpc-port", str(ports[k][1]), *(tls_flags if k == "tls" else [])])
             for k in ("plain", "tls")}
    scheme = {"plain": ("http", "http"), "tls": ("https", "https")}
    rows = []
    load_before, started = C.loadavg(), time.monotonic()
    with procs["plain"], procs["tls"]:
        C.wait_http_ready(f"http://127.0.0.1:{ports['plain'][0]}/v2/health/ready", proc=procs["plain"])
        for port in (*ports["tls"], ports["plain"][1]):
            S3.wait_port(port, procs["tls" if port in ports["tls"] else "plain"])
        servers = list(procs.values())
        answer = {k: S3.verify(pb, ports[k][1], simple, big, x) for k in ("plain",)}

        def s1(k: str, c: int, d: float) -> float:
            return wrk_rps(f"{scheme[k][0]}://127.0.0.1:{ports[k][0]}{S1.INFER_PATH}", script, c, d,
                           args.client_cpu, servers)

        def s3(k: str, c: int, d: float, which: str = "simple") -> float:
            n = answer["plain"]["unary" if which == "simple" else "big"]
            r = S3.run_h2load(ports[k][1], "ModelInfer", bodies[which], c, max(1, int(d)), args.client_cpu,
                              tmp / f"h2load-{k}.log", n, 1, scheme=scheme[k][1])
            if r["error"]:
                raise SystemExit(f"error: h2load {k} c={c} {which}: {r['error']}")
            return float(r["rps"])

        def hbig(k: str, c: int, d: float) -> float:
            return http_big(f"{scheme[k][0]}://127.0.0.1:{ports[k][0]}", cert, d, args.client_cpu)

        points = [("S1 HTTP JSON `simple`", s1, c) for c in args.concurrency]
        points += [("S3 gRPC ModelInfer `simple`", s3, c) for c in args.concurrency]
        points += [("gRPC 16 MiB FP32 (h2load)", lambda k, c, d: s3(k, c, d, "big"), 1),
                   ("HTTP binary 16 MiB FP32 (openinfer.Client)", hbig, 1)]
        for name, fn, c in points:
            for k in ("plain", "tls"):
                fn(k, c, 1)  # warm-up
            got: dict[str, list[float]] = {"plain": [], "tls": []}
            for _ in range(args.rounds):
                for k in ("plain", "tls"):
                    got[k].append(fn(k, c, args.duration))
            ratios = [t / p for p, t in zip(got["plain"], got["tls"]) if p > 0]
            rs = C.summarize(ratios)
            rows.append([name, c, C.summarize(got["plain"]).fmt(",.1f"), C.summarize(got["tls"]).fmt(",.1f"),
                         f"{rs.median:.2f} ({rs.lo:.2f}–{rs.hi:.2f})"])
            print(" | ".join(str(v) for v in rows[-1]), flush=True)
    table = C.markdown_table(["scenario", "c", "plain req/s", "TLS req/s", "TLS/plain (min–max)"], rows)
    text = (f"# TLS beside plain text\n\n{C.now_utc()}, {args.rounds} rounds of {args.duration:g} s, server on CPU "
            f"{args.server_cpu} (1 loop thread), load on CPU {args.client_cpu}; {C.machine_line((load_before, C.loadavg()))}"
            f"; {time.monotonic() - started:.0f} s.\n\n{table}\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
