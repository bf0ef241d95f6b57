#!/usr/bin/env python3
"""S1: model `simple` (INT32 [1,16] add/sub) over HTTP JSON, against the
physical limit (a static nginx `return 200` under the same wrk load).

    .venv/bin/python benchmarks/s1_http_json.py [--quick] [--concurrency 1,8,64]
                                                 [--duration S] [--rounds N]

Protocol (../shared/BENCHMARKS.md): server(s) pinned to one core, wrk to the
other; per concurrency point both servers are warmed up, then measured
alternately A B A B for N rounds; the claim is the median of the per-round
ratios openinfer/nginx with min–max. Results go to benchmarks/results/
(s1_http_json.md, .csv, .png); --quick runs go to benchmarks/results/raw/
unless --out is given, so they never replace the full results.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s1_http_json"
MODEL = "simple"
INFER_PATH = f"/v2/models/{MODEL}/infer"
LUA_SCRIPT = C.WRK_DIR / "s1_simple_json.lua"

INPUT0 = list(range(16))
INPUT1 = [1] * 16
# Byte-identical to the body in wrk/s1_simple_json.lua (checked below).
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": INPUT0},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": INPUT1},
]}, separators=(",", ":"))

SERVERS = ("openinfer", "nginx")


def lua_body(path: Path) -> str:
    """The wrk.body of the S1 Lua script (concatenated '...' pieces)."""
    text = path.read_text()
    m = re.search(r"wrk\.body\s*=(.*?)\n\s*\n", text, re.S)
    if not m:
        raise SystemExit(f"error: no wrk.body in {path}")
    return "".join(re.findall(r"'([^']*)'", m.group(1)))


def check_openinfer_answer(base: str) -> None:
    """One request whose outputs are verified before anything is measured."""
    status, raw = C.http_request(base + INFER_PATH, BODY.encode(), "POST",
                                 {"Content-Type": "application/json"})
    if status != 200:
        raise SystemExit(f"error: openinfer answered HTTP {status}: {raw[:300]!r}")
    resp = json.loads(raw)
    outs = {o["name"]: o for o in resp.get("outputs", [])}
    want = {"OUTPUT0": [a + b for a, b in zip(INPUT0, INPUT1)],
            "OUTPUT1": [a - b for a, b in zip(INPUT0, INPUT1)]}
    for name, data in want.items():
        o = outs.get(name)
        if (o is None or o.get("datatype") != "INT32" or o.get("shape") != [1, 16]
                or o.get("data") != data):
            raise SystemExit(f"error: wrong {name} from openinfer: {o!r}")


def check_nginx_answer(base: str) -> None:
    status, raw = C.http_request(base + INFER_PATH, BODY.encode(), "POST",
                                 {"Content-Type": "application/json"})
    if status != 200 or json.loads(raw) != {"ok": True}:
        raise SystemExit(f"error: nginx answered HTTP {status}: {raw[:300]!r}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="check run: concurrency 1,64, 2 rounds of 2 s (< 1 min)")
    ap.add_argument("--concurrency", help="comma-separated wrk connection counts "
                    "(default 1,8,64; quick 1,64)")
    ap.add_argument("--duration", type=int, help="seconds per measured run "
                    "(default 5; quick 2)")
    ap.add_argument("--rounds", type=int, help="A/B rounds per point "
                    "(default 5; quick 2)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="seconds of discarded warm-up per server and point (2)")
    ap.add_argument("--threads", type=int, default=1,
                    help="openinfer event-loop threads (1)")
    ap.add_argument("--server-cpu", default="0", help="taskset CPU list for both "
                    "servers (0)")
    ap.add_argument("--client-cpu", default="1", help="taskset CPU list for wrk (1)")
    ap.add_argument("--out", type=Path, help="results directory (default "
                    "benchmarks/results; quick: benchmarks/results/raw)")
    a = ap.parse_args()
    a.concurrency = C.parse_int_list(a.concurrency or ("1,64" if a.quick else "1,8,64"))
    a.duration = a.duration or (2 if a.quick else 5)
    a.rounds = a.rounds or (2 if a.quick else 5)
    if a.duration < 1 or a.rounds < 1 or a.warmup < 0:
        ap.error("--duration and --rounds must be >= 1, --warmup >= 0")
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    return a


def main() -> int:
    args = parse_args()
    C.ensure_debian_packages([["wrk"], ["nginx-light", "nginx"]])
    C.check_cpus(args.server_cpu, args.client_cpu)
    if lua_body(LUA_SCRIPT) != BODY:
        raise SystemExit(f"error: body in {LUA_SCRIPT} differs from the one verified here")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = C.make_tmpdir("openinfer-s1-nginx-")
    oi_port, ng_port = C.free_port(), C.free_port()
    started = time.monotonic()
    load_before = C.loadavg()
    results: dict[tuple[int, str], list[C.WrkResult]] = {}
    warm_errors: list[str] = []
    notes: list[str] = []
    fatal: list[str] = []  # problems that make the whole run fail

    oi = C.openinfer_server(oi_port, args.server_cpu, raw_dir / "openinfer.log",
                            threads=args.threads)
    ng = C.nginx_static(ng_port, args.server_cpu, tmp)
    urls = {"openinfer": f"http://127.0.0.1:{oi_port}",
            "nginx": f"http://127.0.0.1:{ng_port}"}
    procs = {"openinfer": oi, "nginx": ng}
    try:
        with oi, ng:
            C.wait_http_ready(urls["openinfer"] + "/v2/health/ready", proc=oi)
            C.wait_http_ready(urls["nginx"] + "/", proc=ng)
            check_openinfer_answer(urls["openinfer"])
            check_nginx_answer(urls["nginx"])
            print(f"[s1] openinfer pid {oi.pid} on :{oi_port}, nginx pid {ng.pid} "
                  f"on :{ng_port}, both pinned to CPU {args.server_cpu}; "
                  f"wrk on CPU {args.client_cpu}", flush=True)
            print(f"[s1] openinfer answer verified; concurrency {args.concurrency}, "
                  f"{args.rounds} rounds x {args.duration}s, warm-up {args.warmup}s",
                  flush=True)

            def one(server: str, c: int, dur: int, tag: str) -> C.WrkResult:
                r = C.run_wrk(urls[server] + INFER_PATH, LUA_SCRIPT, c, dur,
                              args.client_cpu, label=server,
                              servers=[procs[server]])
                (raw_dir / f"c{c}_{tag}_{server}.txt").write_text(r.raw)
                return r

            for c in args.concurrency:
                if args.warmup:
                    for s in SERVERS:
                        w = one(s, c, args.warmup, "warmup")
                        if not w.ok:
                            warm_errors.append(f"c={c} {s} warm-up: {w.error}")
                            print(f"[s1] c={c} {s} warm-up FAILED: {w.error}",
                                  flush=True)
                for rnd in range(1, args.rounds + 1):
                    for s in SERVERS:  # A B A B ...
                        r = one(s, c, args.duration, f"r{rnd}")
                        results.setdefault((c, s), []).append(r)
                        state = "ok" if r.ok else f"FAILED: {r.error}"
                        print(f"[s1] c={c:<3} round {rnd}/{args.rounds} {s:<9} "
                              f"{r.rps:>10,.0f} req/s  p50 {r.p50_us:>7.0f} us  "
                              f"p99 {r.p99_us:>7.0f} us  {state}", flush=True)
                    if not oi.alive() or not ng.alive():
                        break
                if not oi.alive() or not ng.alive():
                    fatal.append("a server died during the run; later points skipped")
                    break

            # After load: still healthy and still correct?
            if oi.alive():
                try:
                    C.wait_http_ready(urls["openinfer"] + "/v2/health/ready",
                                      timeout=5, proc=oi)
                    check_openinfer_answer(urls["openinfer"])
                except (RuntimeError, SystemExit) as e:
                    fatal.append(f"openinfer failed the check after load: {e}")
    finally:
        err_log = tmp / "error.log"
        if err_log.exists() and err_log.stat().st_size:
            shutil.copy(err_log, raw_dir / "nginx-error.log")
        shutil.rmtree(tmp, ignore_errors=True)

    oi_log = oi.log_tail(40).strip()
    if oi_log:
        notes.append("openinfer log (level warning) was not empty:\n\n```\n"
                     + oi_log + "\n```")
    elapsed = time.monotonic() - started
    args.load = (load_before, C.loadavg())
    failed = report(args, results, warm_errors + fatal, notes, raw_dir, elapsed)
    print(f"[s1] done in {elapsed:.0f}s; raw wrk output in "
          f"{raw_dir.relative_to(C.REPO_ROOT)}", flush=True)
    return 1 if failed else 0


def report(args, results, warm_errors, notes, raw_dir: Path, elapsed: float) -> bool:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    md_path, csv_path, png_path = (out / f"{NAME}.md", out / f"{NAME}.csv",
                                   out / f"{NAME}.png")
    any_failed = bool(warm_errors)

    # Per-run CSV (every measured run).
    rows = []
    for (c, s), runs in sorted(results.items()):
        for i, r in enumerate(runs, 1):
            rows.append([c, i, s, f"{r.rps:.1f}", r.requests, r.duration_s,
                         r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us,
                         r.non2xx, r.socket_errors, r.error or ""])
    C.write_csv(csv_path, ["concurrency", "round", "server", "rps", "requests",
                           "duration_s", "p50_us", "p90_us", "p99_us", "p999_us",
                           "max_us", "non2xx", "socket_errors", "error"], rows)

    def cell(runs, attr, spec=",.0f"):
        bad = [r for r in runs if not r.ok]
        if bad:
            return f"FAILED ({len(bad)}/{len(runs)} runs: {bad[0].error})"
        return C.summarize([getattr(r, attr) for r in runs]).fmt(spec)

    table, tail, plot = [], [], {s: ([], [], [], []) for s in SERVERS}
    for c in args.concurrency:
        a, b = results.get((c, "openinfer"), []), results.get((c, "nginx"), [])
        if not a or not b:
            continue
        if any(not r.ok for r in a + b):
            any_failed = True
            ratio = "FAILED"
        else:
            ratio = C.summarize(C.paired_ratios([r.rps for r in a],
                                                [r.rps for r in b])).fmt(".2f")
        table.append([c, cell(a, "rps"), cell(b, "rps"), ratio,
                      cell(a, "p50_us"), cell(a, "p99_us"),
                      cell(b, "p50_us"), cell(b, "p99_us")])
        tail.append([c, cell(a, "p999_us"), cell(a, "max_us"),
                     cell(b, "p999_us"), cell(b, "max_us")])
        for s, runs in (("openinfer", a), ("nginx", b)):
            if all(r.ok for r in runs):
                sm = C.summarize([r.rps for r in runs])
                for lst, v in zip(plot[s], (c, sm.median, sm.lo, sm.hi)):
                    lst.append(v)

    plot_note = None
    if table:
        plot_note = C.plot_lines(
            png_path, "S1: simple, HTTP JSON (median, min–max)",
            "concurrency (wrk connections)", "requests/s",
            {"openinfer": plot["openinfer"], "nginx return 200 (limit)": plot["nginx"]})
        if plot_note:
            print(f"[s1] note: {plot_note}", flush=True)

    facts = C.machine_facts()
    lines = [
        f"# S1 — `simple` over HTTP JSON{' (quick check)' if args.quick else ''}",
        "",
        f"Run {C.now_utc()}, openinfer commit `{C.git_describe()}`, "
        f"{elapsed:.0f} s wall.",
        "",
        "```",
        C.invocation(),
        "```",
        "",
        "**Claim: openinfer/nginx** = median of per-round ratios of req/s "
        "(min–max); other cells are median (min–max) over rounds. Latency in µs "
        "as measured by wrk (closed loop, so latency ≈ concurrency / rate).",
        "",
        C.markdown_table(
            ["concurrency", "openinfer req/s", "nginx req/s", "openinfer/nginx",
             "openinfer p50 µs", "openinfer p99 µs", "nginx p50 µs", "nginx p99 µs"],
            table),
        "Tail latency (µs):",
        "",
        C.markdown_table(["concurrency", "openinfer p99.9", "openinfer max",
                          "nginx p99.9", "nginx max"], tail),
        "## Method",
        "",
        f"- Work: `POST {INFER_PATH}`, V2 JSON body ({len(BODY)} bytes: INPUT0 = "
        "0..15, INPUT1 = ones, INT32 [1,16]), `Content-Type: application/json`, "
        f"sent by wrk with `{LUA_SCRIPT.relative_to(C.REPO_ROOT)}`. The openinfer "
        "answer is verified (OUTPUT0 = INPUT0+INPUT1, OUTPUT1 = INPUT0−INPUT1) "
        "before and after the load.",
        f"- openinfer: `python -m openinfer serve --threads {args.threads} "
        "--log-level warning` (bundled example repository).",
        "- Physical limit: nginx (Debian), private generated config, "
        "`worker_processes 1`, `access_log off`, keep-alive with "
        "`keepalive_requests 1000000000`, `return 200 '{\"ok\":true}'` "
        "(`default_type application/json`) for the same POST with the same bytes.",
        f"- Load: `taskset -c {args.client_cpu} wrk -t 1 -c <concurrency> "
        f"-d {args.duration}s --timeout 5s --latency`; both servers pinned with "
        f"`taskset -c {args.server_cpu}`; wrk pinned to CPU {args.client_cpu}.",
        f"- Per concurrency point: {args.warmup} s warm-up of each server "
        f"(discarded), then {args.rounds} rounds of openinfer, nginx alternately "
        f"(A B A B), {args.duration} s each. Any non-2xx answer, socket error or "
        "server exit marks the run FAILED instead of giving a number.",
        f"- Machine: nproc {facts['nproc']}, CPU {facts['cpu']}, kernel "
        f"{facts['kernel']}, Python {facts['python']}; "
        f"{C.tool_version(['wrk', '-v'])}; {C.tool_version([C.find_nginx(), '-v'])}; "
        f"load average before {args.load[0]}, after {args.load[1]} (the machine is "
        "shared: other work on it shows up as noise).",
        f"- Per-run numbers: `{csv_path.name}`; raw wrk output: "
        f"`{raw_dir.relative_to(C.REPO_ROOT)}/` (not committed).",
        "",
    ]
    if plot_note:
        lines += [f"No plot: {plot_note}", ""]
    else:
        lines += [f"![S1 req/s vs concurrency]({png_path.name})", ""]
    if warm_errors or notes or any_failed:
        lines += ["## Problems", ""]
        lines += [f"- {e}" for e in warm_errors]
        lines += [f"- {n}" for n in notes]
        if any_failed and not warm_errors:
            lines += ["- Some measured runs failed (see table and CSV)."]
        lines += [""]
    md_path.write_text("\n".join(lines))
    print(f"[s1] wrote {md_path.relative_to(C.REPO_ROOT)}, "
          f"{csv_path.relative_to(C.REPO_ROOT)}"
          + ("" if plot_note else f", {png_path.relative_to(C.REPO_ROOT)}"),
          flush=True)
    print("\n" + C.markdown_table(
        ["c", "openinfer req/s", "nginx req/s", "ratio", "oi p50", "oi p99",
         "ng p50", "ng p99"], table), flush=True)
    return any_failed


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s1] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
