#!/usr/bin/env python3
"""S4 with shared memory: identity_fp32 with large FP32 tensors through system
shared memory against the socket path, with the same client API
(`openinfer.Client.infer`), and against memcpy bandwidth measured in the same
run with the same pinning (server on CPU 0, client on CPU 1).

    .venv/bin/python benchmarks/s4_shm.py [--quick] [--grpc] [--sizes 1M,16M,64M]
                                          [--seconds S] [--rounds N]

Contenders, per size, in turn for N rounds (A B C D A B C D ...):
  shm        Client() against the local server: it stages the input in a pooled
             region it registered once and gets the output back as an array
             viewing the region (one copy: the staging; no tensor byte on the
             socket).
  shm, in place  the input already lives in a registered region
             (client.shared_memory()) and the output is asked back into the
             same place (out=): no copy at all.
  socket     Client(shared_memory=False): the binary tensor extension over HTTP.
  memcpy     numpy.copyto of the same size.
GB/s counts request + response payload (2 × tensor bytes per request) for the
three client paths, and bytes copied for memcpy. The claim is the median of
per-round ratios shm/socket at 64 MiB (target ≥ 5), with shm/memcpy beside it.

No peer runs here: the claim compares openinfer.Client's two paths to the same server.

With --grpc the client speaks gRPC (the server is the same). Results:
benchmarks/results/s4_shm.{md,csv,png} (s4_shm_grpc.* with --grpc); --quick runs go to
benchmarks/results/raw/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s4_shm"
T = "s4-shm"
TARGET = 5.0             # the issue: shm >= 5x the socket path's throughput...
TARGET_SIZE = 64 << 20   # ... at 64 MiB
CONTENDERS = ("shm", "shm, in place", "socket", "memcpy")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="check run: 2 rounds of 1 s per size")
    ap.add_argument("--sizes", default="1M,16M,64M", help="tensor sizes, K/M/G binary units (1M,16M,64M)")
    ap.add_argument("--seconds", type=float, help="seconds per measured loop (default 2; quick 1)")
    ap.add_argument("--rounds", type=int, help="rounds per size (default 5; quick 2)")
    ap.add_argument("--warmup", type=float, help="seconds of discarded warm-up per contender and size "
                    "(default 1; quick 0.3)")
    ap.add_argument("--grpc", action="store_true", help="the client over gRPC (grpc://) instead of HTTP; "
                    "results go to s4_shm_grpc.*")
    ap.add_argument("--threads", type=int, default=1, help="openinfer event-loop threads (1)")
    ap.add_argument("--server-cpu", default="0", help="taskset CPU list for the server (0)")
    ap.add_argument("--client-cpu", default="1", help="taskset CPU list for the clients (1)")
    ap.add_argument("--out", type=Path, help="results directory (default benchmarks/results; "
                    "quick: benchmarks/results/raw)")
    a = ap.parse_args(argv)
    a.sizes = C.parse_size_list(a.sizes)
    a.seconds = a.seconds or (1.0 if a.quick else 2.0)
    a.rounds = a.rounds or (2 if a.quick else 5)
    a.warmup = a.warmup if a.warmup is not None else (0.3 if a.quick else 1.0)
    if a.seconds <= 0 or a.rounds < 1 or a.warmup < 0:
        ap.error("--seconds and --rounds must be positive, --warmup >= 0")
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    C.check_cpus(args.server_cpu, args.client_cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), C.loadavg()
    max_body = max(2 * max(args.sizes) + (1 << 20), 1 << 30)
    port, grpc_port = C.free_port(), C.free_port()
    oi = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log", threads=args.threads,
                            extra=["--max-body-bytes", str(max_body), "--grpc-port", str(grpc_port)])
    http_url = f"http://127.0.0.1:{port}"
    url = f"grpc://127.0.0.1:{grpc_port}" if args.grpc else http_url
    w_shm = C.Worker("shm client", "openinfer-shm", [url], args.client_cpu, raw_dir / "worker-shm.log")
    w_sock = C.Worker("socket client", "openinfer", [url], args.client_cpu, raw_dir / "worker-socket.log")
    w_raw = C.Worker("raw client", "raw", [], args.client_cpu, raw_dir / "worker-raw.log")
    workers = (w_shm, w_sock, w_raw)
    results: dict[tuple[int, str], list[C.LoopResult]] = {}
    problems: list[str] = []
    try:
        oi.start()
        C.wait_http_ready(http_url + "/v2/health/ready", proc=oi)
        for w in workers:
            w.start()
        w_shm.call("verify")
        w_sock.call("verify")
        print(f"[{T}] openinfer pid {oi.pid} on :{port} on CPU {args.server_cpu}; clients on CPU "
              f"{args.client_cpu}; sizes {[C.fmt_size(s) for s in args.sizes]}, {args.rounds} rounds x "
              f"{args.seconds:g}s, warm-up {args.warmup:g}s", flush=True)

        def show(r: C.LoopResult) -> str:
            return (f"{r.gbps:>8.3f} GB/s  n={r.n:<6} p50 {r.p50_us / 1e3:>8.2f} ms  "
                    f"p99 {r.p99_us / 1e3:>8.2f} ms")

        for size in args.sizes:
            contenders = [
                ("shm", lambda s, size=size: C.worker_loop(
                    w_shm, "shm", "tensor", server=oi, seconds=s, nbytes=size, timeout=s + 120)),
                ("shm, in place", lambda s, size=size: C.worker_loop(
                    w_shm, "shm, in place", "tensor_inplace", server=oi, seconds=s, nbytes=size,
                    timeout=s + 120)),
                ("socket", lambda s, size=size: C.worker_loop(
                    w_sock, "socket", "tensor", server=oi, seconds=s, nbytes=size, timeout=s + 120)),
                ("memcpy", lambda s, size=size: C.worker_loop(
                    w_raw, "memcpy", "memcpy", seconds=min(s, 0.5), nbytes=size)),
            ]
            got = C.alternate(T, C.fmt_size(size), contenders, args.rounds, args.seconds, args.warmup, show)
            for name, runs in got.items():
                results[(size, name)] = runs
            if not oi.alive():
                problems.append(f"openinfer died at {C.fmt_size(size)}; later sizes skipped")
                break
        if oi.alive():
            for w in (w_shm, w_sock):
                try:
                    w.call("verify")
                except C.WorkerError as e:
                    problems.append(f"{w.name} failed the check after load: {e}")
    except (C.WorkerError, RuntimeError) as e:
        problems.append(f"run aborted: {e}")
        print(f"[{T}] ERROR: {e}", flush=True)
    finally:
        for w in workers:
            w.stop()
        oi.stop()
    notes = []
    oi_log = oi.log_tail(40).strip()
    if oi_log:
        notes.append("openinfer log (level warning) was not empty:\n\n```\n" + oi_log + "\n```")
    elapsed = time.monotonic() - started
    failed = report(args, results, problems, notes, raw_dir, elapsed, (load_before, C.loadavg()), max_body)
    print(f"[{T}] done in {elapsed:.0f}s", flush=True)
    return 1 if failed else 0


def report(args, results, problems, notes, raw_dir, elapsed, load, max_body) -> bool:
    out: Path = args.out
    report_name = NAME + ("_grpc" if args.grpc else "")
    csv_path, png_path = out / f"{report_name}.csv", out / f"{report_name}.png"
    rows = []
    for (size, name), runs in results.items():
        for i, r in enumerate(runs, 1):
            rows.append([size, i, name, r.n, f"{r.elapsed:.4f}", f"{r.gbps:.4f}", f"{r.p50_us:.1f}",
                         f"{r.p99_us:.1f}", f"{r.max_us:.1f}", f"{r.cpu:.3f}", f"{r.server_cpu:.3f}",
                         r.error or ""])
    C.write_csv(csv_path, ["size_bytes", "round", "what", "requests", "elapsed_s", "GBps", "p50_us", "p99_us",
                           "max_us", "client_cpu_s", "server_cpu_s", "error"], rows)
    failed = any(not r.ok for runs in results.values() for r in runs)
    table, plot, verdicts = [], {k: ([], [], [], []) for k in CONTENDERS}, []
    for size in args.sizes:
        shm, inplace, sock, mem = (results.get((size, k), []) for k in CONTENDERS)
        if not shm:
            continue
        ratio = C.ratio_of(shm, sock, "gbps")
        verdict = ""
        if size == TARGET_SIZE and ratio not in ("FAILED", "–"):
            med = C.summarize(C.paired_ratios([r.gbps for r in shm], [r.gbps for r in sock])).median
            verdict = "met" if med >= TARGET else "**not met**"
            verdicts.append(f"{C.fmt_size(size)}: {med:.2f} ({verdict.strip('*')})")
        table.append([C.fmt_size(size), C.cell_of(shm, "gbps", ".2f"), C.cell_of(inplace, "gbps", ".2f"),
                      C.cell_of(sock, "gbps", ".2f"), C.cell_of(mem, "gbps", ".2f"), ratio, verdict,
                      C.ratio_of(inplace, sock, "gbps"), C.ratio_of(shm, mem, "gbps"),
                      C.cell_of(shm, "p50_us", ",.0f"), C.cell_of(sock, "p50_us", ",.0f"),
                      C.cell_of(shm, "server_cpu_pct", ".0f"), C.cell_of(sock, "server_cpu_pct", ".0f")])
        for k, runs in zip(CONTENDERS, (shm, inplace, sock, mem)):
            if runs and all(r.ok for r in runs):
                sm = C.summarize([r.gbps for r in runs])
                for lst, v in zip(plot[k], (size, sm.median, sm.lo, sm.hi)):
                    lst.append(v)
    plot_note = C.plot_lines(
        png_path, "S4 with shared memory: identity_fp32 (median, min–max)", "tensor bytes", "GB/s",
        {"shm (req+resp payload)": plot["shm"], "shm, in place": plot["shm, in place"],
         "socket (HTTP binary)": plot["socket"], "memcpy": plot["memcpy"]}) if table else "no data"
    transport = "gRPC" if args.grpc else "HTTP"
    lines = C.report_header(f"S4 — identity_fp32 through system shared memory ({transport} client)", args.quick,
                            elapsed) + [
        "**Claim: shm/socket** = median of per-round ratios of GB/s, `openinfer.Client.infer` "
        "through shared memory (as it goes on its own against a local server) against the same "
        f"call over the socket (min–max); other cells are median (min–max) over rounds. Target "
        f"(the issue): ≥ {TARGET:.0f} at {C.fmt_size(TARGET_SIZE)}"
        + (f" — {'; '.join(verdicts)}." if verdicts else "."),
        "",
        C.markdown_table(
            ["tensor", "shm GB/s", "shm in place GB/s", "socket GB/s", "memcpy GB/s", "shm/socket",
             f"target ≥{TARGET:.0f}", "in place/socket", "shm/memcpy", "shm p50 µs", "socket p50 µs",
             "server CPU % shm", "server CPU % socket"], table),
        "## Method",
        "",
        "- Work: `identity_fp32` (returns its input array), one FP32 tensor `INPUT0` of the given "
        "size, sequential calls of `openinfer.Client.infer` from one thread. Each client path's "
        "answer is checked equal to its input before it is timed, and again after the load.",
        "- shm: `Client(url)` against the local server; the client copies the input into a pooled "
        "region it registered once, asks the output into the same window (an output that is its "
        "input is then not copied by the server), and returns an array viewing the region. shm, "
        "in place: the input array lives in a region from `client.shared_memory()` and "
        "`out={'OUTPUT0': x}` asks the output back into it: no tensor byte is copied. socket: "
        "`Client(url, shared_memory=False)`: over HTTP/1.1 the binary tensor data extension, over gRPC "
        "raw_input_contents / raw_output_contents. This run: the client over " + transport + ".",
        "- GB/s = requests × 2 × tensor bytes / wall time (request + response payload, as in S4 "
        "over HTTP). memcpy: `numpy.copyto` of the same size, bytes copied / time (at most 0.5 s "
        "per round). shm moves its payload with one memcpy of the tensor, so its ceiling in these "
        "units is about 2 × memcpy GB/s; shm/memcpy near 2 means the rest of the call is small.",
        f"- Server: `python -m openinfer serve --threads {args.threads} --max-body-bytes {max_body} "
        f"--log-level warning`, pinned with `taskset -c {args.server_cpu}`; clients "
        f"(`benchmarks/loadgen.py` workers) with `taskset -c {args.client_cpu}`. Server CPU % = "
        "openinfer process CPU over the loop / wall time (100 = one core).",
        f"- Per size: {args.warmup:g} s warm-up of each contender (discarded), then {args.rounds} "
        f"rounds of the four in turn, each loop ≥ {args.seconds:g} s and ≥ 3 requests. A failed "
        "request or a server exit marks the run FAILED instead of giving a number.",
        C.machine_line(load),
        f"- Per-run numbers: `{csv_path.name}`; logs: `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    lines += ([f"No plot: {plot_note}", ""] if plot_note else [f"![S4 shm GB/s vs tensor size]({png_path.name})", ""])
    failed = failed or bool(problems)
    if failed and not problems:
        problems = ["Some measured runs failed (see table and CSV)."]
    lines += C.problems_section(problems + notes)
    C.write_report(report_name, out, lines, T)
    print("\n" + C.markdown_table(
        ["tensor", "shm", "in place", "socket", "memcpy", "shm/sock", "target", "inpl/sock", "shm/memcpy",
         "shm p50", "sock p50", "srv% shm", "srv% sock"], table), flush=True)
    return failed


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n[{T}] interrupted; server stopped", file=sys.stderr)
        sys.exit(130)
