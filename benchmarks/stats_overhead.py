#!/usr/bin/env python3
"""What counting costs: S1 (`simple`, HTTP JSON, wrk) and S3 (`simple`, gRPC unary and
streaming, h2load) against two openinfer servers side by side, one with the statistics
extension and Prometheus metrics on (the defaults, scraped once a second during its runs) and
one with both off (`--allow-statistics=false --allow-metrics=false`). Goal: the request rate
with them on is at least 98% of the rate with them off.

    .venv/bin/python benchmarks/stats_overhead.py [--quick] [--duration S] [--rounds N]

Protocol (../shared/BENCHMARKS.md): both servers pinned to one core (--threads 1), the load
generators and this driver (with its scraper) to the other; per point both servers are warmed
up, then measured alternately A B A B for N rounds; the claim is the median of the per-round
ratios on/off with min–max. After the load, the "on" server's own statistics are checked
against the number of requests the load generators completed. Results go to
benchmarks/results/stats_overhead.{md,csv,ratios.json} (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s1_http_json as S1  # noqa: E402
import s3_grpc as S3  # noqa: E402

NAME = "stats_overhead"
SERVERS = {
    "on": [],  # the defaults: statistics counted, /metrics served
    "off": ["--allow-statistics=false", "--allow-metrics=false"],
}


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


class Scraper:
    """GETs /metrics once a second while started, as a Prometheus would (more often than
    the usual 15 s), and checks every scrape parses as a page of Triton's metrics."""

    def __init__(self, url: str, cpus: set[int]) -> None:
        self.url = url
        self.cpus = cpus
        self.count = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        os.sched_setaffinity(0, self.cpus)  # this thread only: off the servers' core
        while not self._stop.wait(1.0):
            try:
                status, body = C.http_request(self.url)
                if status != 200 or b"nv_inference_request_success" not in body:
                    self.errors.append(f"HTTP {status}: {body[:200]!r}")
                self.count += 1
            except Exception as e:  # noqa: BLE001 - reported
                self.errors.append(str(e))

    def __enter__(self) -> "Scraper":
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()


def counting_cost(raw_dir: Path) -> tuple[float, str]:
    """Nanoseconds that counting one request costs on its executor thread, from
    benchmarks/c/stats_bench.c compiled here with the extension's -O2 against
    csrc/server/observe/counters.c (and summary.c), run on this (the client's) core."""
    import subprocess

    exe = raw_dir / "stats_bench"
    server = C.REPO_ROOT / "csrc" / "server" / "observe"
    cmd = ["gcc", "-std=c11", "-O2", "-D_GNU_SOURCE", f"-I{C.REPO_ROOT / 'csrc'}",
           str(C.BENCH_DIR / "c" / "stats_bench.c"), str(server / "counters.c"), str(server / "summary.c"), "-lm",
           "-o", str(exe)]
    subprocess.run(cmd, check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    shown = " ".join(["gcc -std=c11 -O2 -D_GNU_SOURCE -Icsrc", "benchmarks/c/stats_bench.c", "csrc/server/observe/counters.c",
                      "csrc/server/observe/summary.c -lm", "-o", "stats_bench"])
    return float(out.strip()), shown


def main() -> int:
    args = parse_args()
    C.ensure_debian_packages([["wrk"], ["nghttp2-client"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    pb = S3.stubs(C.make_tmpdir("openinfer-stats-stubs-"))
    simple = S3.simple_request(pb)
    big, x = S3.big_request(pb)
    points = [("S1 HTTP JSON", "http", 1), ("S1 HTTP JSON", "http", 64),
              ("S3 gRPC unary", "unary", 1), ("S3 gRPC unary", "unary", 64), ("S3 gRPC stream", "stream", 64)]
    bodies = {"unary": raw_dir / "simple.grpc", "stream": raw_dir / "simple_stream64.grpc"}
    bodies["unary"].write_bytes(S3.framed(simple))
    bodies["stream"].write_bytes(S3.framed(simple) * 64)

    ports = {n: {"http": C.free_port(), "grpc": C.free_port(), "metrics": C.free_port()} for n in SERVERS}
    procs = {}
    for n, extra in SERVERS.items():
        metrics = [] if extra else ["--metrics-port", str(ports[n]["metrics"])]
        procs[n] = C.openinfer_server(ports[n]["http"], args.server_cpu, raw_dir / f"openinfer-{n}.log", threads=1,
                                      extra=["--grpc-port", str(ports[n]["grpc"]), *metrics, *extra])
    started, load_before = time.monotonic(), C.loadavg()
    results: dict[tuple[str, str, int, str], list[float]] = {}
    cpu_per_req: dict[tuple[str, str, int, str], list[float]] = {}  # server CPU µs per request
    completed = {n: 0 for n in SERVERS}  # requests the load generators saw answered
    failures: list[str] = []
    scraper = Scraper(f"http://127.0.0.1:{ports['on']['metrics']}/metrics",
                      {int(c) for c in args.client_cpu.split(",")})
    check: dict = {}
    with procs["on"], procs["off"]:
        lens = {}
        for n in SERVERS:
            base = f"http://127.0.0.1:{ports[n]['http']}"
            C.wait_http_ready(base + "/v2/health/ready", proc=procs[n])
            S3.wait_port(ports[n]["grpc"], procs[n])
            S1.check_openinfer_answer(base)
            lens[n] = S3.verify(pb, ports[n]["grpc"], simple, big, x)
        status, body = C.http_request(f"http://127.0.0.1:{ports['off']['http']}/v2/models/simple/stats")
        if status != 503:
            raise SystemExit(f"error: the 'off' server still counts statistics (HTTP {status}: {body[:200]!r})")
        baseline = json.loads(C.http_request(f"http://127.0.0.1:{ports['on']['http']}/v2/models/simple/stats")[1])
        print(f"[stats] on pid {procs['on'].pid}, off pid {procs['off'].pid}, CPU {args.server_cpu}; load on CPU "
              f"{args.client_cpu}; {args.rounds} rounds x {args.duration}s", flush=True)

        def run(n: str, kind: str, conc: int, dur: int, tag: str) -> tuple[float, int, str | None]:
            log = raw_dir / f"{kind}_c{conc}_{tag}_{n}.log"
            if kind == "http":
                r = C.run_wrk(f"http://127.0.0.1:{ports[n]['http']}{S1.INFER_PATH}", S1.LUA_SCRIPT, conc, dur,
                              args.client_cpu, label=n, servers=[procs[n]])
                log.write_text(r.raw)
                return r.rps, r.requests, r.error
            rpc, per = ("ModelInfer", 1) if kind == "unary" else ("ModelStreamInfer", 64)
            streams = conc if kind == "unary" else 1
            r = S3.run_h2load(ports[n]["grpc"], rpc, bodies[kind], streams, dur, args.client_cpu, log,
                              lens[n][kind], per)
            done = int(r["rps"] * dur) if r["error"] is None else 0  # h2load's rate over its own run
            return r["rps"], done, r["error"]

        for label, kind, conc in points:
            for n in SERVERS:
                run(n, kind, conc, 1, "warmup")
            for rnd in range(1, args.rounds + 1):
                for n in SERVERS:  # A B A B
                    cpu0 = C.proc_cpu_seconds(procs[n].pid)
                    if n == "on":
                        with scraper:
                            rps, done, err = run(n, kind, conc, args.duration, f"r{rnd}")
                    else:
                        rps, done, err = run(n, kind, conc, args.duration, f"r{rnd}")
                    cpu = C.proc_cpu_seconds(procs[n].pid) - cpu0
                    cpu_per_req.setdefault((label, kind, conc, n), []).append(
                        cpu * 1e6 / done if done and err is None else float("nan"))
                    completed[n] += done
                    if err:
                        failures.append(f"{label} c={conc} round {rnd} {n}: {err}")
                    results.setdefault((label, kind, conc, n), []).append(rps if err is None else float("nan"))
                    print(f"[stats] {label:<15} c={conc:<3} round {rnd}/{args.rounds} {n:<3} {rps:>10,.0f} req/s"
                          f"{'  FAILED: ' + err if err else ''}", flush=True)
        # The "on" server counted every request it answered, and no failure.
        after = json.loads(C.http_request(f"http://127.0.0.1:{ports['on']['http']}/v2/models/simple/stats")[1])
        b, a = baseline["model_stats"][0], after["model_stats"][0]
        check = {
            "success": a["inference_stats"]["success"]["count"] - b["inference_stats"]["success"]["count"],
            "fail": a["inference_stats"]["fail"]["count"],
            "inference_count": a["inference_count"] - b["inference_count"],
            "execution_count": a["execution_count"] - b["execution_count"],
        }
        if check["fail"] or check["success"] != check["inference_count"] or check["success"] < completed["on"] * 0.99:
            failures.append(f"the 'on' server's statistics {check} do not match the ~{completed['on']} requests "
                            "the load generators completed")
        if scraper.errors:
            failures.append(f"{len(scraper.errors)} scrapes failed, first: {scraper.errors[0]}")

    elapsed = time.monotonic() - started
    count_ns, bench_cmd = counting_cost(raw_dir)
    rows, csv_rows, ratio_rows = [], [], []
    for label, kind, conc in points:
        on, off = results[(label, kind, conc, "on")], results[(label, kind, conc, "off")]
        cpu_on, cpu_off = cpu_per_req[(label, kind, conc, "on")], cpu_per_req[(label, kind, conc, "off")]
        ratios = C.paired_ratios(on, off)
        cpu_ratios = C.paired_ratios(cpu_on, cpu_off)
        s = C.summarize(ratios)
        off_cpu = C.summarize(cpu_off).median
        share = count_ns / (off_cpu * 1000) if off_cpu == off_cpu and off_cpu > 0 else float("nan")
        rows.append([label, conc, C.summarize(on).fmt(), C.summarize(off).fmt(), s.fmt(".3f"),
                     C.summarize(cpu_on).fmt(".1f"), C.summarize(cpu_off).fmt(".1f"),
                     C.summarize(cpu_ratios).fmt(".3f"), f"{share:.2%}"])
        for i, (x_on, x_off, c_on, c_off) in enumerate(zip(on, off, cpu_on, cpu_off), 1):
            csv_rows.append([label, conc, i, f"{x_on:.1f}", f"{x_off:.1f}", f"{c_on:.2f}", f"{c_off:.2f}"])
        ratio_rows.append(C.ratio_row(NAME, f"{label} c={conc}", "statistics+metrics off", "self", "req/s", ratios))
        ratio_rows.append(C.ratio_row(NAME, f"{label} c={conc}", "statistics+metrics off", "self", "cpu_us",
                                      cpu_ratios))
    out_dir.mkdir(parents=True, exist_ok=True)
    C.write_csv(out_dir / f"{NAME}.csv",
                ["point", "concurrency", "round", "on_rps", "off_rps", "on_cpu_us_per_req", "off_cpu_us_per_req"],
                csv_rows)
    C.write_ratios(out_dir, NAME, ratio_rows)
    lines = C.report_header("Statistics and metrics overhead (S1, S3)", args.quick, elapsed)
    lines += [
        "The statistics extension and /metrics on (scraped every second during its runs) against "
        "both off, side by side: request rate and the server's CPU time per request, medians with "
        "min–max and the median of the per-round ratios. Goal: rate on/off ≥ 0.98 (CPU per request "
        "on/off ≤ 1.02). The last column is what counting costs per request measured alone "
        f"({count_ns:.0f} ns on the executor thread, `benchmarks/c/stats_bench.c`), as a share of "
        "the off server's CPU time per request: the overhead with the load generators' noise taken "
        "out.",
        "",
        C.markdown_table(["point", "concurrency", "on req/s", "off req/s", "rate on/off", "on CPU µs/req",
                          "off CPU µs/req", "CPU on/off", "counting share"], rows),
        "",
        "## Method",
        "",
        f"- `{C.invocation()}`",
        f"- Two `python -m openinfer serve --threads 1` servers on CPU {args.server_cpu}: **on** with the "
        "defaults (statistics counted, metrics on their own port), **off** with `--allow-statistics=false "
        f"--allow-metrics=false`. wrk (S1, `{S1.LUA_SCRIPT.relative_to(C.REPO_ROOT)}`) and h2load (S3, "
        f"the pre-framed `simple` request, unary and 64 per stream) on CPU {args.client_cpu}, as are this "
        "driver and its scraper.",
        f"- Per point a 1 s warm-up of each server, then {args.rounds} rounds of {args.duration} s, on and "
        "off in turn. CPU per request: the server process's user+system time over the run (/proc, "
        "10 ms ticks) divided by the requests the load generator completed.",
        f"- Counting alone: `{bench_cmd}`, then `stats_bench` (best of 5 rounds of 2M requests).",
        f"- Check after the load: the on server counted {check.get('success', '?')} successes "
        f"({check.get('fail', '?')} failures; inference_count {check.get('inference_count', '?')}, "
        f"execution_count {check.get('execution_count', '?')}) for ~{completed['on']} requests the load "
        f"generators completed in its measured runs (plus its warm-ups); {scraper.count} scrapes.",
        C.machine_line((load_before, C.loadavg()), [C.tool_version(["wrk", "--version"]), C.tool_version(["h2load", "--version"])]),
    ]
    lines += C.problems_section(failures)
    path = C.write_report(NAME, out_dir, lines, "stats")
    print(f"[stats] done in {elapsed:.0f}s: {path.relative_to(C.REPO_ROOT)}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[stats] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
