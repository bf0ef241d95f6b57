#!/usr/bin/env python3
"""This checkout against another (a "before" build), S1's and S4's requests side by side: one
openinfer server per checkout on the same repository, servers in turn, round after round.

    .venv/bin/python benchmarks/checkouts.py --baseline /work/wt/base/python
                                             [--concurrency 1,8] [--sizes 1M,16M] [--rounds 5]

For "nothing slower" claims, where a scenario's own table compares openinfer with nginx or a
TCP echo and the change's effect hides in their noise:
- S1: model `simple` (INT32 [1,16] add/sub), HTTP JSON by wrk at each concurrency;
- S4: model `identity_fp32`, FP32 tensors of each size by openinfer.Client (binary), a
  sequential loop (S4's own client, so concurrency 1).
Per point: req/s (S1) or GB/s (S4), and the server's CPU µs per request (user + system, from
/proc: it hardly moves when other work shares the machine, unlike req/s); the claim is the
median over rounds of this checkout / baseline. Both servers serve a copy of this checkout's
two example models (the example repository itself differs between checkouts: a model loaded
beside them costs the others too). Prints a Markdown table; `--out FILE` writes it too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s1_http_json as S1  # noqa: E402

MODELS = ("simple", "identity_fp32")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout's python/ directory")
    ap.add_argument("--concurrency", default="1,8", help="S1's wrk connections (1,8)")
    ap.add_argument("--sizes", default="1M,16M", help="S4's tensor sizes (1M,16M)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measured run")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    C.check_cpus(args.server_cpu, args.client_cpu)
    tmp = C.make_tmpdir("openinfer-checkouts-")
    for name in MODELS:
        shutil.copytree(C.REPO_ROOT / "examples" / "models" / name, tmp / "repo" / name)
    roots = {"this": C.REPO_ROOT / "python", "baseline": args.baseline.resolve()}
    load_before, started = C.loadavg(), time.monotonic()
    servers, workers, ports = {}, {}, {}
    try:
        for who, root in roots.items():
            port = ports[who] = C.free_port()
            env = dict(os.environ, PYTHONPATH=str(root))
            servers[who] = C.openinfer_server(port, args.server_cpu, tmp / f"{who}.log", extra=[str(tmp / "repo")],
                                              env=env).start()
            C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", 120, proc=servers[who])
            workers[who] = C.Worker(f"{who} client", "openinfer", [f"http://127.0.0.1:{port}"], args.client_cpu,
                                    tmp / f"worker-{who}.log")
            workers[who].start()
            workers[who].call("verify")
        rows = s1_rows(args, servers, ports, tmp) + s4_rows(args, servers, workers)
    finally:
        for w in workers.values():
            w.stop()
        for s in servers.values():
            s.stop()
    text = "\n".join([
        f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"commit `{C.git_describe()}`, {time.monotonic() - started:.0f} s).",
        "",
        f"Baseline: `{args.baseline}`; servers on CPU {args.server_cpu}, clients on CPU {args.client_cpu}; "
        f"{args.rounds} rounds, servers in turn; medians, min-max in brackets; load average before "
        f"{load_before}, after {C.loadavg()}.",
        "",
        "| scenario | point | this | baseline | this / baseline | server CPU µs/request: this | baseline | this / baseline |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def s1_rows(args: argparse.Namespace, servers: dict, ports: dict, tmp: Path) -> list[str]:
    script = C.write_wrk_script(tmp / "s1.lua", "POST", S1.BODY, {"Content-Type": "application/json"})
    rows = []
    for c in C.parse_int_list(args.concurrency):
        got: dict[str, list[tuple[float, float]]] = {who: [] for who in servers}
        for rnd in range(args.rounds + 1):  # round 0 warms up
            for who, server in servers.items():
                before = C.proc_cpu_seconds(server.pid)
                run = C.run_wrk(f"http://127.0.0.1:{ports[who]}{S1.INFER_PATH}", script, c, args.duration,
                                args.client_cpu, servers=(server,))
                if run.error:
                    raise SystemExit(f"S1 c={c} {who}: {run.error}")
                spent = C.proc_cpu_seconds(server.pid) - before
                if rnd:
                    got[who].append((run.rps, spent / run.requests * 1e6))
        rows.append(row("S1 req/s", f"c={c}", got, ",.0f"))
    return rows


def s4_rows(args: argparse.Namespace, servers: dict, workers: dict) -> list[str]:
    rows = []
    for size in C.parse_size_list(args.sizes):
        got: dict[str, list[tuple[float, float]]] = {who: [] for who in servers}
        for rnd in range(args.rounds + 1):
            for who, server in servers.items():
                r = C.worker_loop(workers[who], who, "tensor", server=server, seconds=args.duration, nbytes=size,
                                  timeout=args.duration + 120)
                if not r.ok:
                    raise SystemExit(f"S4 {C.fmt_size(size)} {who}: {r.error}")
                if rnd:
                    got[who].append((r.gbps, r.server_cpu / r.n * 1e6))
        rows.append(row("S4 GB/s", C.fmt_size(size), got, ".3f"))
    return rows


def row(scenario: str, point: str, got: dict[str, list[tuple[float, float]]], spec: str) -> str:
    """One table row: the measure and the CPU per request, each with the per-round ratio."""
    def cells(i: int, fmt: str) -> list[str]:
        this, base = [r[i] for r in got["this"]], [r[i] for r in got["baseline"]]
        ratios = [a / b for a, b in zip(this, base)]
        return [spread(this, fmt), spread(base, fmt), spread(ratios, ".3f")]

    return "| " + " | ".join([scenario, point, *cells(0, spec), *cells(1, ".1f")]) + " |"


def spread(values: list[float], spec: str) -> str:
    return f"{statistics.median(values):{spec}} ({min(values):{spec}}-{max(values):{spec}})"


if __name__ == "__main__":
    raise SystemExit(main())
