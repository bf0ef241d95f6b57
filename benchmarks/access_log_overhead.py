#!/usr/bin/env python3
"""What the access log costs: S1 (`simple`, HTTP JSON, wrk) and S3 (`simple`, gRPC unary,
h2load) against two openinfer servers side by side, one writing an access log to a file
(`--access-log PATH`) and one without. Goal: the request rate with it is at least 98% of the
rate without.

    .venv/bin/python benchmarks/access_log_overhead.py [--quick] [--duration S] [--rounds N]

Protocol (../shared/BENCHMARKS.md): both servers pinned to one core (--threads 1), the load
generators and this driver to the other; per point both servers are warmed up, then measured
alternately A B A B for N rounds; the claim is the median of the per-round ratios with/without
with min–max. Afterwards the log's lines plus the dropped ones it notes are checked against the
requests the server answered. Results go to benchmarks/results/access_log_overhead.{md,csv,
ratios.json} (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s1_http_json as S1  # noqa: E402
import s3_grpc as S3  # noqa: E402

NAME = "access_log_overhead"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="check run: 1 round of 1 s per point")
    ap.add_argument("--duration", type=int, default=3, help="seconds per measured run (3)")
    ap.add_argument("--rounds", type=int, default=5, help="A/B rounds per point (5)")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.quick:
        a.duration, a.rounds = 1, 1
    return a


def main() -> int:
    args = parse_args()
    C.ensure_debian_packages([["wrk"], ["nghttp2-client"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    raw_dir = C.RAW_DIR / NAME / time.strftime("%Y%m%d-%H%M%S")
    raw_dir.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    pb = S3.stubs(C.make_tmpdir("openinfer-access-stubs-"))
    simple = S3.simple_request(pb)
    big, x = S3.big_request(pb)
    body = raw_dir / "simple.grpc"
    body.write_bytes(S3.framed(simple))
    access = raw_dir / "access.log"
    servers = {"with": ["--access-log", str(access)], "without": []}
    points = [("S1 HTTP JSON", "http", 1), ("S1 HTTP JSON", "http", 64), ("S3 gRPC unary", "unary", 64)]
    ports = {n: {"http": C.free_port(), "grpc": C.free_port()} for n in servers}
    procs = {n: C.openinfer_server(ports[n]["http"], args.server_cpu, raw_dir / f"openinfer-{n}.log", threads=1,
                                   extra=["--grpc-port", str(ports[n]["grpc"]), *extra])
             for n, extra in servers.items()}
    started, load_before = time.monotonic(), C.loadavg()
    results: dict[tuple[str, str, int, str], list[float]] = {}
    failures: list[str] = []
    with procs["with"], procs["without"]:
        lens = {}
        for n in servers:
            base = f"http://127.0.0.1:{ports[n]['http']}"
            C.wait_http_ready(base + "/v2/health/ready", proc=procs[n])
            S3.wait_port(ports[n]["grpc"], procs[n])
            S1.check_openinfer_answer(base)
            lens[n] = S3.verify(pb, ports[n]["grpc"], simple, big, x)

        def run(n: str, kind: str, conc: int, dur: int, tag: str) -> tuple[float, str | None]:
            if kind == "http":
                r = C.run_wrk(f"http://127.0.0.1:{ports[n]['http']}{S1.INFER_PATH}", S1.LUA_SCRIPT, conc, dur,
                              args.client_cpu, label=n, servers=[procs[n]])
                (raw_dir / f"{kind}_c{conc}_{tag}_{n}.log").write_text(r.raw)
                return r.rps, r.error
            r = S3.run_h2load(ports[n]["grpc"], "ModelInfer", body, conc, dur, args.client_cpu,
                              raw_dir / f"{kind}_c{conc}_{tag}_{n}.log", lens[n]["unary"], 1)
            return r["rps"], r["error"]

        for label, kind, conc in points:
            for n in servers:
                run(n, kind, conc, 1, "warmup")
            for rnd in range(1, args.rounds + 1):
                for n in servers:
                    rps, err = run(n, kind, conc, args.duration, f"r{rnd}")
                    if err:
                        failures.append(f"{label} c={conc} round {rnd} {n}: {err}")
                    results.setdefault((label, kind, conc, n), []).append(rps if err is None else float("nan"))
                    print(f"[access] {label:<14} c={conc:<3} round {rnd}/{args.rounds} {n:<7} {rps:>10,.0f} req/s"
                          f"{'  FAILED: ' + err if err else ''}", flush=True)
    # The server has stopped: its writer wrote everything it kept.
    text = access.read_text()
    lines = sum(1 for line in text.splitlines() if not line.startswith("#"))
    noted = re.findall(r"^# access log: (\d+) lines dropped", text, re.M)
    dropped = int(noted[-1]) if noted else 0
    elapsed = time.monotonic() - started
    rows, csv_rows, ratio_rows = [], [], []
    for label, kind, conc in points:
        on, off = results[(label, kind, conc, "with")], results[(label, kind, conc, "without")]
        ratios = C.paired_ratios(on, off)
        rows.append([label, conc, C.summarize(on).fmt(), C.summarize(off).fmt(), C.summarize(ratios).fmt(".3f")])
        for i, (a, b) in enumerate(zip(on, off), 1):
            csv_rows.append([label, conc, i, f"{a:.1f}", f"{b:.1f}"])
        ratio_rows.append(C.ratio_row(NAME, f"{label} c={conc}", "access log off", "self", "req/s", ratios))
    out_dir.mkdir(parents=True, exist_ok=True)
    C.write_csv(out_dir / f"{NAME}.csv", ["point", "concurrency", "round", "with_rps", "without_rps"], csv_rows)
    C.write_ratios(out_dir, NAME, ratio_rows)
    report = C.report_header("Access log overhead (S1, S3)", args.quick, elapsed)
    report += [
        "An access log written to a file against none, side by side: request rate, medians with "
        "min–max and the median of the per-round ratios. Goal: with/without ≥ 0.98.",
        "",
        C.markdown_table(["point", "concurrency", "with req/s", "without req/s", "with/without"], rows),
        "",
        "## Method",
        "",
        f"- `{C.invocation()}`",
        f"- Two `python -m openinfer serve --threads 1` servers on CPU {args.server_cpu}, one with "
        f"`--access-log FILE`; wrk (S1) and h2load (S3 unary) on CPU {args.client_cpu}.",
        f"- Per point a 1 s warm-up of each server, then {args.rounds} rounds of {args.duration} s, in turn.",
        f"- The log held {lines} lines and noted {dropped} dropped (the writer thread shares the "
        "server's core).",
        C.machine_line((load_before, C.loadavg()), [C.tool_version(["wrk", "--version"]),
                                                    C.tool_version(["h2load", "--version"])]),
    ]
    report += C.problems_section(failures)
    path = C.write_report(NAME, out_dir, report, "access")
    print(f"[access] done in {elapsed:.0f}s: {path}; {lines} lines, {dropped} dropped",
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[access] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
