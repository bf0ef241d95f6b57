#!/usr/bin/env python3
"""S7: the client side. openinfer.Client against tritonclient.http, both
talking to the same openinfer server: request rate, latency and client CPU
per request on `simple` (sequential and at concurrency 16), GB/s on
identity_fp32 with the S4 large sizes.

    .venv/bin/python benchmarks/s7_client.py [--quick] [--seconds S] [--rounds N]
                                              [--concurrency 16] [--sizes 16M,64M]
                                              [--transport http|grpc]

With --transport grpc the same comparison runs over gRPC: openinfer.Client
("grpc://...") against tritonclient.grpc, plus a streaming point
(ModelStreamInfer: `Client.stream_infer` vs `start_stream`/`async_stream_infer`);
results go to s7_client_grpc.{md,csv,png}.

Each client runs in its own long-lived worker process (benchmarks/loadgen.py)
pinned to the client core, the server to the other; per point both workers
are warmed up, then measured in turn (openinfer, tritonclient, A B A B) for N
rounds. Client CPU is getrusage(RUSAGE_SELF) of the worker process (all its
threads) over the measured loop. The claim is the median of per-round ratios
openinfer/tritonclient (min–max).

Results: benchmarks/results/s7_client[_grpc].{md,csv,png}; --quick runs go to
benchmarks/results/raw/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s7_client"
T = "s7"
TARGET = 3.0  # the issue: openinfer.Client >= 3x tritonclient's request rate on simple
CLIENTS = ("openinfer", "tritonclient")
# Per transport: the peer's worker kind and its name in the report.
PEER = {"http": ("tritonclient", "tritonclient.http"), "grpc": ("tritonclient-grpc", "tritonclient.grpc")}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="check run: 1 round of 1 s per point (< 1 min)")
    ap.add_argument("--seconds", type=float, help="seconds per measured loop "
                    "(default 2; quick 1)")
    ap.add_argument("--rounds", type=int, help="A/B rounds per point (default 3; quick 1)")
    ap.add_argument("--warmup", type=float, help="seconds of discarded warm-up per "
                    "client and point (default 1; quick 0.3)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight for the concurrent points (16)")
    ap.add_argument("--sizes", default="16M,64M", help="identity_fp32 tensor sizes (16M,64M)")
    ap.add_argument("--threads", type=int, default=1, help="openinfer event-loop threads (1)")
    ap.add_argument("--server-cpu", default="0", help="taskset CPU list for the server (0)")
    ap.add_argument("--client-cpu", default="1", help="taskset CPU list for the clients (1)")
    ap.add_argument("--transport", choices=("http", "grpc"), default="http",
                    help="HTTP (vs tritonclient.http) or gRPC (vs tritonclient.grpc)")
    ap.add_argument("--out", type=Path, help="results directory (default "
                    "benchmarks/results; quick: benchmarks/results/raw)")
    a = ap.parse_args(argv)
    a.sizes = C.parse_size_list(a.sizes)
    a.seconds = a.seconds or (1.0 if a.quick else 2.0)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.warmup = a.warmup if a.warmup is not None else (0.3 if a.quick else 1.0)
    if a.seconds <= 0 or a.rounds < 1 or a.warmup < 0 or a.concurrency < 1:
        ap.error("--seconds, --rounds, --concurrency must be positive, --warmup >= 0")
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    a.name = NAME if a.transport == "http" else NAME + "_grpc"
    a.peer = PEER[a.transport][1]
    return a


def points(args):
    """(key, title, kind, openinfer how, tritonclient how, op, kwargs per client)."""
    c = args.concurrency
    if args.transport == "grpc":
        return grpc_points(args)
    pts = [
        ("seq", "simple, sequential (1 thread)", "rate",
         "`Client.infer` in a loop", "`InferenceServerClient.infer` in a loop",
         "simple", {"mode": "seq"}, {"mode": "seq"}),
        ("async", f"simple, concurrency {c}, async APIs", "rate",
         f"`Client.infer_async`, a window of {c} futures (done-callback submits the next)",
         f"`async_infer` on `concurrency={c}`, a window of {c} (oldest `get_result()` first)",
         "simple", {"mode": "async", "concurrency": c},
         {"mode": "async", "concurrency": c}),
        ("threads", f"simple, concurrency {c}, threads / greenlets", "rate",
         f"{c} threads sharing one `Client`, each calling `infer` in a loop",
         f"{c} gevent greenlets calling `infer` on one `concurrency={c}` client",
         "simple", {"mode": "threads", "concurrency": c},
         {"mode": "greenlets", "concurrency": c}),
    ]
    for size in args.sizes:
        pts.append((f"t{size}", f"identity_fp32 {C.fmt_size(size)}", "bytes",
                    "`Client.infer` (binary, zero-copy)",
                    "`InferInput.set_data_from_numpy(binary_data=True)`, `infer`, "
                    "`as_numpy` (binary outputs)",
                    "tensor", {"nbytes": size}, {"nbytes": size}))
    return pts


def grpc_points(args):
    c = args.concurrency
    pts = [
        ("seq", "simple, sequential (1 thread)", "rate",
         "`Client.infer` in a loop", "`InferenceServerClient.infer` in a loop",
         "simple", {"mode": "seq"}, {"mode": "seq"}),
        ("async", f"simple, concurrency {c}, async APIs", "rate",
         f"`Client.infer_async`, a window of {c} futures (done-callback submits the next)",
         f"`async_infer`, a window of {c} (its callback submits the next)",
         "simple", {"mode": "async", "concurrency": c}, {"mode": "async", "concurrency": c}),
        ("threads", f"simple, concurrency {c}, threads", "rate",
         f"{c} threads sharing one `Client`, each calling `infer` in a loop",
         f"{c} threads sharing one `InferenceServerClient`, each calling `infer` in a loop",
         "simple", {"mode": "threads", "concurrency": c}, {"mode": "threads", "concurrency": c}),
        ("stream", f"simple, ModelStreamInfer, {c} in flight", "rate",
         f"`Client.stream_infer` over a generator, `max_in_flight={c}`",
         f"`start_stream` + `async_stream_infer`, a window of {c} (its callback sends the next)",
         "simple", {"mode": "stream", "concurrency": c}, {"mode": "stream", "concurrency": c}),
    ]
    for size in args.sizes:
        pts.append((f"t{size}", f"identity_fp32 {C.fmt_size(size)}", "bytes",
                    "`Client.infer` (raw_input_contents from the array, outputs viewing the message)",
                    "`InferInput.set_data_from_numpy`, `infer`, `as_numpy` (messages up to any size)",
                    "tensor", {"nbytes": size}, {"nbytes": size}))
    return pts


def main(argv=None) -> int:
    args = parse_args(argv)
    C.check_cpus(args.server_cpu, args.client_cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / args.name / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), C.loadavg()
    port = C.free_port()
    url = f"http://127.0.0.1:{port}"
    max_body = max(2 * max(args.sizes) + (1 << 20), 1 << 30)
    # A free gRPC port in both modes: the default 8001 may be taken on a shared machine.
    gport = C.free_port()
    extra = ["--max-body-bytes", str(max_body), "--grpc-port", str(gport)]
    client_url = url if args.transport == "http" else f"grpc://127.0.0.1:{gport}"
    oi = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log",
                            threads=args.threads, extra=extra)
    kinds = {"openinfer": "openinfer", "tritonclient": PEER[args.transport][0]}
    workers = {k: C.Worker(f"{k} client", kinds[k], [client_url], args.client_cpu,
                           raw_dir / f"worker-{k}.log") for k in CLIENTS}
    results: dict[tuple[str, str], list[C.LoopResult]] = {}
    problems: list[str] = []
    versions: dict[str, str] = {}
    pts = points(args)
    try:
        oi.start()
        C.wait_http_ready(url + "/v2/health/ready", proc=oi)
        for k, w in workers.items():
            w.start()
            versions[k] = w.info.get("version", "?")
            w.call("verify")
        print(f"[{T}] openinfer server pid {oi.pid} on {client_url}, CPU {args.server_cpu}; "
              f"client workers on CPU {args.client_cpu}; answers verified; "
              f"{args.rounds} rounds x {args.seconds:g}s, warm-up {args.warmup:g}s",
              flush=True)
        for key, title, kind, _, _, op, kw_oi, kw_tc in pts:
            def show(r: C.LoopResult, kind=kind) -> str:
                head = (f"{r.gbps:>7.3f} GB/s" if kind == "bytes"
                        else f"{r.rps:>9,.0f} req/s")
                return (f"{head}  p50 {r.p50_us:>8.0f} us  p99 {r.p99_us:>8.0f} us  "
                        f"cpu {r.cpu_us_per_req:>7.1f} us/req")
            contenders = [
                (k, lambda s, k=k, kw=kw: C.worker_loop(
                    workers[k], k, op, server=oi, seconds=s, timeout=s + 180, **kw))
                for k, kw in (("openinfer", kw_oi), ("tritonclient", kw_tc))]
            got = C.alternate(T, key, contenders, args.rounds, args.seconds,
                              args.warmup, show)
            for k, runs in got.items():
                results[(key, k)] = runs
            if not oi.alive():
                problems.append(f"the server died during '{title}'; later points skipped")
                break
        if oi.alive():
            try:
                workers["openinfer"].call("verify")
            except C.WorkerError as e:
                problems.append(f"openinfer failed the check after load: {e}")
    except (C.WorkerError, RuntimeError) as e:
        problems.append(f"run aborted: {e}")
        print(f"[{T}] ERROR: {e}", flush=True)
    finally:
        for w in workers.values():
            w.stop()
        oi.stop()
    notes = []
    oi_log = oi.log_tail(40).strip()
    if oi_log:
        notes.append("openinfer log (level warning) was not empty:\n\n```\n"
                     + oi_log + "\n```")
    elapsed = time.monotonic() - started
    failed = report(args, pts, results, problems, notes, versions, raw_dir, elapsed,
                    (load_before, C.loadavg()), max_body)
    print(f"[{T}] done in {elapsed:.0f}s", flush=True)
    return 1 if failed else 0


def report(args, pts, results, problems, notes, versions, raw_dir, elapsed, load,
           max_body) -> bool:
    out: Path = args.out
    csv_path, png_path = out / f"{args.name}.csv", out / f"{args.name}.png"
    rows = []
    for (key, k), runs in results.items():
        for i, r in enumerate(runs, 1):
            rows.append([key, i, k, r.n, f"{r.elapsed:.4f}", f"{r.rps:.1f}",
                         f"{r.gbps:.4f}", f"{r.p50_us:.1f}", f"{r.p99_us:.1f}",
                         f"{r.max_us:.1f}", f"{r.cpu:.4f}", f"{r.cpu_us_per_req:.2f}",
                         f"{r.server_cpu:.3f}", r.error or ""])
    C.write_csv(csv_path, ["point", "round", "client", "requests", "elapsed_s", "rps",
                           "GBps", "p50_us", "p99_us", "max_us", "client_cpu_s",
                           "client_cpu_us_per_req", "server_cpu_s", "error"], rows)
    failed = any(not r.ok for runs in results.values() for r in runs)

    rate_rows, byte_rows, how_rows, verdicts, ratio_rows = [], [], [], [], []
    bars: dict[str, tuple[list, list, list, list]] = {k: ([], [], [], []) for k in CLIENTS}
    for i, (key, title, kind, how_oi, how_tc, *_rest) in enumerate(pts):
        a, b = results.get((key, "openinfer"), []), results.get((key, "tritonclient"), [])
        if not a or not b:
            continue
        how_rows.append([title, how_oi, how_tc])
        attr = "gbps" if kind == "bytes" else "rps"
        ratio = C.ratio_of(a, b, attr)
        cpu_ratio = C.ratio_of(b, a, "cpu_us_per_req")
        if ratio not in ("FAILED", "–"):
            ratio_rows.append(C.ratio_row(
                "S7", title, "tritonclient.http", "peer", "GB/s" if kind == "bytes" else "req/s",
                C.paired_ratios([getattr(r, attr) for r in a], [getattr(r, attr) for r in b])))
            ratio_rows.append(C.ratio_row(
                "S7", title + ", client CPU/request", "tritonclient.http", "peer", "cpu_us",
                C.paired_ratios([r.cpu_us_per_req for r in a], [r.cpu_us_per_req for r in b]),
                note="lower is better"))
        lat = [C.cell_of(a, "p50_us"), C.cell_of(a, "p99_us"),
               C.cell_of(b, "p50_us"), C.cell_of(b, "p99_us")]
        cpu = [C.cell_of(a, "cpu_us_per_req", ",.1f"), C.cell_of(b, "cpu_us_per_req", ",.1f"),
               cpu_ratio]
        srv = [C.cell_of(a, "server_cpu_pct"), C.cell_of(b, "server_cpu_pct")]
        if kind == "rate":
            verdict = "–"
            if ratio not in ("FAILED", "–"):
                med = C.summarize(C.paired_ratios([r.rps for r in a],
                                                  [r.rps for r in b])).median
                verdict = "met" if med >= TARGET else "**not met**"
                verdicts.append(f"{title}: {med:.2f}× ({verdict.strip('*')})")
            rate_rows.append([title, C.cell_of(a, "rps"), C.cell_of(b, "rps"), ratio,
                              verdict, *lat, *cpu, *srv])
        else:
            byte_rows.append([title, C.cell_of(a, "gbps", ".3f"), C.cell_of(b, "gbps", ".3f"),
                              ratio, *lat, *cpu, *srv])
        for k, runs in (("openinfer", a), ("tritonclient", b)):
            if all(r.ok for r in runs):
                sm = C.summarize(C.paired_ratios([getattr(r, attr) for r in runs],
                                                 [getattr(r, attr) for r in b]))
                for lst, v in zip(bars[k], (i + 1, sm.median, sm.lo, sm.hi)):
                    lst.append(v)
    C.write_ratios(out, NAME, ratio_rows)
    plot_note = C.plot_lines(
        png_path, "S7: client throughput relative to tritonclient (median, min–max)",
        "point (1 = sequential, 2 = async c16, 3 = threads/greenlets c16, 4+ = tensors)",
        "× tritonclient", {"openinfer.Client": bars["openinfer"],
                           args.peer: bars["tritonclient"]},
        logx=False) if rate_rows or byte_rows else "no data"

    lat_h = ["openinfer p50 µs", "openinfer p99 µs", "tritonclient p50 µs",
             "tritonclient p99 µs"]
    cpu_h = ["openinfer CPU µs/req", "tritonclient CPU µs/req", "CPU tritonclient/openinfer"]
    srv_h = ["server CPU % (openinfer)", "server CPU % (tritonclient)"]
    lines = C.report_header(f"S7 — client side: openinfer.Client vs {args.peer}",
                            args.quick, elapsed) + [
        "**Claim: openinfer/tritonclient** = median of per-round ratios (req/s or GB/s; "
        "min–max), both clients against the same openinfer server. Other cells are "
        f"median (min–max) over rounds. Target ({'the issue' if args.transport == 'http' else 'issue 3, set for HTTP; shown for reference'}): openinfer ≥ {TARGET:g}× "
        "tritonclient's request rate on `simple`, sequential and at concurrency "
        f"{args.concurrency}" + (f" — {'; '.join(verdicts)}." if verdicts else "."),
        "",
        "### `simple` (INT32 [1,16] add/sub), binary tensors both ways",
        "",
        C.markdown_table(["point", "openinfer req/s", "tritonclient req/s",
                          "openinfer/tritonclient", "target ≥3×", *lat_h, *cpu_h, *srv_h],
                         rate_rows),
        "### `identity_fp32`, binary tensors both ways (GB/s = 2 × tensor bytes per request)",
        "",
        C.markdown_table(["point", "openinfer GB/s", "tritonclient GB/s",
                          "openinfer/tritonclient", *lat_h, *cpu_h, *srv_h], byte_rows),
        "### How each client is driven (each one's idiomatic way)",
        "",
        C.markdown_table(["point", "openinfer.Client", args.peer], how_rows,
                         align=["l", "l", "l"]),
        "## Method",
        "",
        *(http_method(versions) if args.transport == "http" else grpc_method(versions)),
        "- Latency: per request, submit to completion as each client's loop sees it "
        "(for the `async_infer` window, up to the oldest-first `get_result()`).",
        "- Client CPU µs/req = worker process CPU (user+system, getrusage, all threads) "
        "over the measured loop / requests. Server CPU % = openinfer server process "
        "CPU over the call / wall time (100 = one core; includes the worker's small "
        "set-up around the loop).",
        f"- Server: `python -m openinfer serve --threads {args.threads} "
        f"--max-body-bytes {max_body} --log-level warning` pinned with `taskset -c "
        f"{args.server_cpu}`; both client workers (`benchmarks/loadgen.py`) pinned with "
        f"`taskset -c {args.client_cpu}`, one process per client, kept for the whole run.",
        f"- Per point: {args.warmup:g} s warm-up of each client (discarded), then "
        f"{args.rounds} rounds of openinfer, tritonclient alternately (A B A B), each "
        f"loop ≥ {args.seconds:g} s (tensors: and ≥ 3 requests). A failed request or a "
        "server exit marks the run FAILED instead of giving a number.",
        C.machine_line(load),
        f"- Per-run numbers: `{csv_path.name}`; logs: `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    lines += ([f"No plot: {plot_note}", ""] if plot_note
              else [f"![S7 openinfer / tritonclient]({png_path.name})", ""])
    failed = failed or bool(problems)
    if failed and not problems:
        problems = ["Some measured runs failed (see tables and CSV)."]
    lines += C.problems_section(problems + notes)
    C.write_report(args.name, out, lines, T)
    print("\n" + C.markdown_table(["point", "oi req/s", "tc req/s", "oi/tc", "target",
                                   "oi p50", "oi p99", "tc p50", "tc p99", "oi cpu µs",
                                   "tc cpu µs", "cpu tc/oi", "srv% oi", "srv% tc"],
                                  rate_rows), flush=True)
    print(C.markdown_table(["point", "oi GB/s", "tc GB/s", "oi/tc", "oi p50", "oi p99",
                            "tc p50", "tc p99", "oi cpu µs", "tc cpu µs", "cpu tc/oi",
                            "srv% oi", "srv% tc"], byte_rows), flush=True)
    return failed


def http_method(versions) -> list[str]:
    return [
        f"- Clients: openinfer {versions.get('openinfer', '?')} (`openinfer.Client`, "
        f"default pool of 32 connections), tritonclient "
        f"{versions.get('tritonclient', '?')} (`tritonclient.http`, geventhttpclient). "
        "Every request carries binary inputs and asks for binary outputs; each "
        "tritonclient request builds its `InferInput`s and reads outputs with "
        "`as_numpy` (what a caller does per request; the `InferRequestedOutput`s are "
        "built once); each openinfer request passes the numpy arrays and reads the "
        "output arrays. Answers are verified before the load and again after it.",
        "- Note on `async_infer`: tritonclient.http's `async_infer` calls "
        "`gevent.sleep(0.01)` after scheduling each request, so a caller that submits "
        "from one loop gets at most ~100 submissions/s whatever the server; the "
        "greenlets row shows tritonclient.http without that sleep.",
    ]


def grpc_method(versions) -> list[str]:
    return [
        f"- Clients: openinfer {versions.get('openinfer', '?')} (`openinfer.Client(\"grpc://...\")`, "
        "the C core's h2c connection on nghttp2, default pool of 32 connections), tritonclient "
        f"{versions.get('tritonclient', '?')} (`tritonclient.grpc` on grpcio, one channel, "
        "message limits lifted). Both send `raw_input_contents` and read "
        "`raw_output_contents`; each tritonclient request builds its `InferInput`s and reads "
        "outputs with `as_numpy` (the `InferRequestedOutput`s are built once); each openinfer "
        "request passes the numpy arrays and reads the output arrays. Answers are verified "
        "before the load and again after it.",
        "- Streaming: one ModelStreamInfer call per measured loop with the window kept full; "
        "latency from a request being sent to its answer (answers in request order).",
    ]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n[{T}] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
