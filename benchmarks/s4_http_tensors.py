#!/usr/bin/env python3
"""S4 over HTTP: identity_fp32 with large FP32 tensors sent and received as
binary (openinfer.Client), against the physical limits measured in the same
run with the same pinning: raw TCP loopback echo of the same byte count and
memcpy of the same size.

    .venv/bin/python benchmarks/s4_http_tensors.py [--quick] [--sizes 4K,1M,16M,64M]
                                                    [--seconds S] [--rounds N]

Per size: each contender is warmed up, then measured in turn for N rounds
(openinfer, TCP echo, memcpy; A B C A B C ...), each a sequential loop of at
least S seconds (and 3 requests). GB/s counts request + response payload
(2 × tensor bytes per request) for openinfer and for the echo (N bytes sent,
N back); memcpy counts the bytes copied. The claim is the median of per-round
ratios openinfer/TCP echo (min–max). iperf3 (Debian), when it installs, gives
the one-direction streaming figure as a cross-check of the echo.

Results: benchmarks/results/s4_http_tensors.{md,csv,png}; --quick runs go to
benchmarks/results/raw/.
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
import peers as PEERS  # noqa: E402

NAME = "s4_http_tensors"
T = "s4"
TARGET = 0.70          # the target, openinfer/TCP echo
TARGET_MIN_SIZE = 16 << 20  # ... for 16 MiB and 64 MiB
CONTENDERS = ("openinfer", "tcp echo", "memcpy")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="check run: 1 round of 0.5 s per size (< 1 min)")
    ap.add_argument("--sizes", default=None,
                    help="tensor sizes in bytes, K/M/G binary units (4K,1M,16M,64M)")
    ap.add_argument("--seconds", type=float, help="seconds per measured loop "
                    "(default 1.5; quick 0.5)")
    ap.add_argument("--rounds", type=int, help="rounds per size (default 3; quick 1)")
    ap.add_argument("--warmup", type=float, help="seconds of discarded warm-up per "
                    "contender and size (default 1; quick 0.3)")
    ap.add_argument("--threads", type=int, default=1, help="openinfer event-loop threads (1)")
    ap.add_argument("--server-cpu", default="0", help="taskset CPU list for the servers (0)")
    ap.add_argument("--client-cpu", default="1", help="taskset CPU list for the clients (1)")
    ap.add_argument("--no-iperf3", action="store_true", help="skip the iperf3 cross-check")
    ap.add_argument("--peers", default=None, help="comma-separated peers (default "
                    "triton,pytriton,kserve,mlserver; 'none')")
    ap.add_argument("--out", type=Path, help="results directory (default "
                    "benchmarks/results; quick: benchmarks/results/raw)")
    a = ap.parse_args(argv)
    a.sizes = C.parse_size_list(a.sizes or ("4K,1M,16M" if a.quick else "4K,1M,16M,64M"))
    a.seconds = a.seconds or (0.5 if a.quick else 1.5)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.warmup = a.warmup if a.warmup is not None else (0.3 if a.quick else 1.0)
    if a.seconds <= 0 or a.rounds < 1 or a.warmup < 0:
        ap.error("--seconds and --rounds must be positive, --warmup >= 0")
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    return a


def iperf3_run(port: int, seconds: float, cpus: str) -> tuple[float, str]:
    """One iperf3 client run (1 MiB writes, the largest it allows) -> GB/s received."""
    dur = max(1, round(seconds))
    argv = ["taskset", "-c", cpus, "iperf3", "-c", "127.0.0.1", "-p", str(port),
            "-t", str(dur), "-l", "1M", "-J"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=dur + 30)
        d = json.loads(p.stdout)
        if "error" in d:
            return float("nan"), d["error"]
        return d["end"]["sum_received"]["bits_per_second"] / 8e9, ""
    except (subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
        return float("nan"), f"iperf3 failed: {e}"


def main(argv=None) -> int:
    args = parse_args(argv)
    C.check_cpus(args.server_cpu, args.client_cpu)
    have_iperf3 = not args.no_iperf3 and not args.quick and C.ensure_debian_packages([["iperf3"]], optional=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), C.loadavg()
    max_body = 2 * max(args.sizes) + (1 << 20)
    max_body = max(max_body, 1 << 30)  # never below the default (1 GiB)
    oi_port, echo_port, ip_port = C.free_port(), C.free_port(), C.free_port()
    py = sys.executable

    oi = C.openinfer_server(oi_port, args.server_cpu, raw_dir / "openinfer.log",
                            threads=args.threads,
                            extra=["--max-body-bytes", str(max_body)])
    echo = C.ServerProcess("echo", [py, str(C.LOADGEN), "echo-server", str(echo_port)],
                           args.server_cpu, raw_dir / "echo.log")
    ip = (C.ServerProcess("iperf3", ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(ip_port)],
                          args.server_cpu, raw_dir / "iperf3-server.log")
          if have_iperf3 else None)
    url = f"http://127.0.0.1:{oi_port}"
    w_oi = C.Worker("openinfer client", "openinfer", [url], args.client_cpu,
                    raw_dir / "worker-openinfer.log")
    w_raw = C.Worker("raw client", "raw", [], args.client_cpu, raw_dir / "worker-raw.log")
    results: dict[tuple[int, str], list[C.LoopResult]] = {}
    iperf: list[float] = []
    problems: list[str] = []
    peer_problems: list[str] = []
    peer_after: list[str] = []  # a peer's failed check after the load: reported, not fatal
    peers: dict = {}
    peer_workers: dict[str, C.Worker] = {}
    procs = [p for p in (oi, echo, ip) if p is not None]
    try:
        for p in procs:
            p.start()
        C.wait_http_ready(url + "/v2/health/ready", proc=oi)
        w_oi.start()
        w_raw.start()
        w_oi.call("verify")
        peers = PEERS.start_peers(C.peer_list(args.peers, ["triton", "pytriton", "kserve",
                                                           "mlserver"]),
                                  args.server_cpu, raw_dir, peer_problems)
        PEERS.check_same_answers(peers, url, peer_problems)
        for n, p in list(peers.items()):
            w = C.Worker(f"{n} client", "openinfer", [p.http_url], args.client_cpu,
                         raw_dir / f"worker-{n}.log")
            try:
                w.start()
                # op_tensor checks the answer equals the input before timing (the
                # worker's `verify` also sends a [3,1000] tensor, which a peer whose
                # identity is declared 1-D, like Triton's, refuses).
                w.call("tensor", seconds=0, nbytes=min(args.sizes), min_iters=1, timeout=300)
            except C.WorkerError as e:
                peer_problems.append(f"{p.label} left out: the same openinfer.Client request "
                                     f"fails against it: {e}")
                w.stop()
                p.stop()
                del peers[n]
                continue
            peer_workers[n] = w
        print(f"[{T}] openinfer pid {oi.pid} on :{oi_port}, echo server pid {echo.pid}"
              f"{f', iperf3 -s pid {ip.pid}' if ip else ''}, all on CPU {args.server_cpu}; "
              f"clients on CPU {args.client_cpu}; sizes "
              f"{[C.fmt_size(s) for s in args.sizes]}, {args.rounds} rounds x "
              f"{args.seconds:g}s, warm-up {args.warmup:g}s", flush=True)

        def show(r: C.LoopResult) -> str:
            return (f"{r.gbps:>7.3f} GB/s  n={r.n:<6} p50 {r.p50_us / 1e3:>8.2f} ms  "
                    f"p99 {r.p99_us / 1e3:>8.2f} ms")

        for size in args.sizes:
            contenders = [
                ("openinfer", lambda s, size=size: C.worker_loop(
                    w_oi, "openinfer", "tensor", server=oi, seconds=s, nbytes=size,
                    timeout=s + 120)),
            ] + [
                (n, lambda s, size=size, n=n: C.worker_loop(
                    peer_workers[n], n, "tensor", server=peers[n].proc, seconds=s,
                    nbytes=size, min_iters=1, timeout=s + 300))
                for n in peer_workers
            ] + [
                ("tcp echo", lambda s, size=size: C.worker_loop(
                    w_raw, "tcp echo", "echo", server=echo, seconds=s, nbytes=size,
                    port=echo_port, timeout=s + 120)),
                ("memcpy", lambda s, size=size: C.worker_loop(
                    w_raw, "memcpy", "memcpy", seconds=min(s, 0.5), nbytes=size)),
            ]
            got = C.alternate(T, C.fmt_size(size), contenders, args.rounds,
                              args.seconds, args.warmup, show)
            for name, runs in got.items():
                results[(size, name)] = runs
            if not oi.alive():
                problems.append(f"openinfer died at {C.fmt_size(size)}; later sizes skipped")
                break
        if ip is not None:
            ip_rounds = 1 if args.quick else args.rounds
            for rnd in range(1, ip_rounds + 1):
                g, err = iperf3_run(ip_port, args.seconds, args.client_cpu)
                iperf.append(g)
                print(f"[{T}] iperf3 round {rnd}/{ip_rounds}: {g:.3f} GB/s {err}", flush=True)
                if err:
                    problems.append(f"iperf3: {err}")
                    break
        if oi.alive():
            try:
                w_oi.call("verify")
            except C.WorkerError as e:
                problems.append(f"openinfer failed the check after load: {e}")
            PEERS.check_same_answers(peers, url, peer_after, after_load=True)
        for n, w in peer_workers.items():
            if peers[n].alive():
                try:  # the same tensor check as before the load
                    w.call("tensor", seconds=0, nbytes=min(args.sizes), min_iters=1, timeout=300)
                except C.WorkerError as e:
                    peer_after.append(f"{peers[n].label} failed the check after load: {e}")
    except (C.WorkerError, RuntimeError) as e:
        problems.append(f"run aborted: {e}")
        print(f"[{T}] ERROR: {e}", flush=True)
    finally:
        for w in (w_oi, w_raw, *peer_workers.values()):
            w.stop()
        for p in peers.values():
            p.stop()
        for p in procs:
            p.stop()
    notes = list(peer_after)
    oi_log = oi.log_tail(40).strip()
    if oi_log:
        notes.append("openinfer log (level warning) was not empty:\n\n```\n"
                     + oi_log + "\n```")
    elapsed = time.monotonic() - started
    failed = report(args, results, iperf, problems, notes, raw_dir, elapsed,
                    (load_before, C.loadavg()), max_body, peers, peer_problems)
    print(f"[{T}] done in {elapsed:.0f}s", flush=True)
    return 1 if failed else 0


def report(args, results, iperf, problems, notes, raw_dir, elapsed, load,
           max_body, peers, peer_problems) -> bool:
    out: Path = args.out
    csv_path, png_path = out / f"{NAME}.csv", out / f"{NAME}.png"
    rows = []
    for (size, name), runs in results.items():
        for i, r in enumerate(runs, 1):
            rows.append([size, i, name, r.n, f"{r.elapsed:.4f}", f"{r.gbps:.4f}",
                         f"{r.p50_us:.1f}", f"{r.p99_us:.1f}", f"{r.max_us:.1f}",
                         f"{r.cpu:.3f}", f"{r.server_cpu:.3f}", r.error or ""])
    C.write_csv(csv_path, ["size_bytes", "round", "what", "requests", "elapsed_s", "GBps",
                           "p50_us", "p99_us", "max_us", "client_cpu_s",
                           "server_cpu_s", "error"], rows)
    failed = any(not r.ok for (size, k), runs in results.items() for r in runs
                 if k not in peers)
    names = ["openinfer", *peers, "tcp echo", "memcpy"]
    label = {"openinfer": "openinfer", "tcp echo": "TCP loopback echo (limit)",
             "memcpy": "memcpy (limit)", **{n: p.label for n, p in peers.items()}}
    table, plot, verdicts, ratio_rows = [], {k: ([], [], [], []) for k in names}, [], []
    for size in args.sizes:
        a = results.get((size, "openinfer"), [])
        if not a:
            continue
        for k in names:
            runs = results.get((size, k), [])
            if not runs:
                continue
            ratio, vs_tcp = "1", ""
            if k != "openinfer":
                ratio = C.ratio_of(a, runs, "gbps")
                if ratio not in ("FAILED", "–"):
                    ratio_rows.append(C.ratio_row(
                        "S4", f"HTTP {C.fmt_size(size)}", label[k],
                        "peer" if k in peers else "limit", "GB/s",
                        C.paired_ratios([r.gbps for r in a], [r.gbps for r in runs])))
            if k != "memcpy":
                vs_tcp = C.ratio_of(runs, results.get((size, "tcp echo"), []), "gbps")
            if k == "openinfer" and size >= TARGET_MIN_SIZE and vs_tcp not in ("FAILED", "–"):
                med = C.summarize(C.paired_ratios(
                    [r.gbps for r in a],
                    [r.gbps for r in results.get((size, "tcp echo"), [])])).median
                verdicts.append(f"{C.fmt_size(size)}: {med:.2f} "
                                f"({'met' if med >= TARGET else 'not met'})")
            table.append([C.fmt_size(size), label[k], C.cell_of(runs, "gbps", ".3f"), ratio,
                          vs_tcp, C.cell_of(runs, "p50_us", ",.0f"),
                          C.cell_of(runs, "p99_us", ",.0f"),
                          C.cell_of(runs, "server_cpu_pct", ".0f") if k not in ("tcp echo", "memcpy") else "",
                          C.cell_of(runs, "n", ",.0f")])
            if all(r.ok for r in runs):
                sm = C.summarize([r.gbps for r in runs])
                for lst, v in zip(plot[k], (size, sm.median, sm.lo, sm.hi)):
                    lst.append(v)
    C.write_ratios(out, NAME, ratio_rows)
    plot_note = C.plot_lines(
        png_path, "S4: identity_fp32 over HTTP binary (median, min–max)",
        "tensor bytes", "GB/s (request + response payload)",
        {label[k]: plot[k] for k in names}, logy=True) if table else "no data"
    ip_sum = C.summarize(iperf)
    peer_lines = [f"- {p.label}: {p.version}, `{p.command}`, the same `openinfer.Client` "
                  f"worker as for openinfer. {' '.join(p.notes)}".rstrip() for p in peers.values()]
    lines = C.report_header("S4 — identity_fp32 tensors over HTTP binary", args.quick,
                            elapsed) + [
        "**Claim: openinfer/X** = median of per-round ratios of GB/s (min–max), X a peer "
        "or a limit; **X/TCP** the same against the raw TCP loopback echo of the same bytes; "
        "other cells are median (min–max) over rounds. Target (the issue): openinfer/TCP ≥ "
        f"{TARGET:.2f} at 16 MiB and 64 MiB"
        + (f" — {'; '.join(verdicts)}." if verdicts else "."),
        "",
        C.markdown_table(
            ["tensor", "server / limit", "GB/s", "openinfer/X", "X/TCP", "p50 µs", "p99 µs",
             "server CPU %", "requests/round"], table),
        (f"iperf3 one-direction stream over loopback (1 MiB writes, same pinning): "
         f"{ip_sum.fmt('.3f')} GB/s over {ip_sum.n} runs of {max(1, round(args.seconds))} s — "
         "a cross-check that the echo reaches what the kernel gives (the echo moves "
         "each direction in turn, so it is the comparable limit for request/response)."
         if iperf else "iperf3: not run."),
        "",
        "## Method",
        "",
        "- Work: `identity_fp32` (returns its input array), one FP32 tensor "
        "`INPUT0` of the given size, sent and received with the binary tensor data "
        "extension by `openinfer.Client.infer` (zero-copy numpy client), "
        "sequentially on one connection — the same client for every server. Each "
        "server's answer is checked equal to the input before it is timed.",
        "- GB/s = requests × 2 × tensor bytes / wall time (request + response "
        "payload; HTTP and JSON headers not counted). memcpy: `numpy.copyto` of "
        "the same size, bytes copied / time (at most 0.5 s per round).",
        "- Physical limit: a TCP loopback echo (`benchmarks/loadgen.py echo-server`, "
        "Python sockets, TCP_NODELAY, `recv_into` with MSG_WAITALL into a "
        "preallocated buffer, `sendall` of it): the client sends the N bytes, the "
        "server receives all N and sends them back, sequentially on one connection — "
        "the same byte movement as one request, with nothing else. At 4 KiB "
        "the Python per-call overhead of the echo is a visible part of its time.",
        f"- openinfer: `python -m openinfer serve --threads {args.threads} "
        f"--max-body-bytes {max_body} --log-level warning`.",
        *peer_lines,
        f"- Servers (openinfer, peers, echo, iperf3 -s) pinned with `taskset -c "
        f"{args.server_cpu}`, all started at once; clients (`benchmarks/loadgen.py` "
        f"workers, iperf3 -c) with `taskset -c {args.client_cpu}`. Server CPU % = server "
        "process CPU over the loop / wall time (100 = one core; the work of Triton's Python "
        "backend stub and of PyTriton in their child processes is not counted).",
        f"- Per size: {args.warmup:g} s warm-up of each contender (discarded), then "
        f"{args.rounds} rounds of the contenders in turn, each loop "
        f"≥ {args.seconds:g} s and ≥ 3 requests (peers: ≥ 1 request, as one can take seconds). A failed request or a server "
        "exit marks the run FAILED instead of giving a number.",
        C.machine_line(load, [C.tool_version(["iperf3", "--version"])] if iperf else []),
        f"- Per-run numbers: `{csv_path.name}`; logs: `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    lines += ([f"No plot: {plot_note}", ""] if plot_note
              else [f"![S4 GB/s vs tensor size]({png_path.name})", ""])
    if peer_problems:
        lines += ["## Peers that did not run", "", *[f"- {p}" for p in peer_problems], ""]
    failed = failed or bool(problems)
    if failed and not problems:
        problems = ["Some measured runs failed (see table and CSV)."]
    lines += C.problems_section(problems + notes)
    C.write_report(NAME, out, lines, T)
    print("\n" + C.markdown_table(
        ["tensor", "server", "GB/s", "oi/X", "X/TCP", "p50 µs", "p99 µs", "srv CPU %", "n"],
        table), flush=True)
    return failed


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n[{T}] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
