#!/usr/bin/env python3
"""S1 and S3 measured with Triton's own load generator, perf_analyzer (the binary in the
tritonclient wheel), beside wrk and h2load: `simple` (two INT32 [1,16], add/sub) over HTTP
and gRPC at concurrency 1, 8 and 64, against openinfer and native Triton (tritonserver from
the nvidia-pytriton wheel, whose `simple` runs in its Python backend: the only backend the
wheel has), so the numbers sit beside those Triton users publish.

    .venv/bin/python benchmarks/pa_s1_s3.py [--quick] [--concurrency 1,8,64] [--rounds N]
                                            [--interval-ms MS] [--no-probe]

Protocol as S1/S3: both servers pinned to CPU 0, perf_analyzer to CPU 1, the two measured in
turn (A B, then B A) for N rounds; the claim is the median of the per-round ratios
openinfer/Triton with min–max. perf_analyzer runs its own stabilisation (time windows of
--interval-ms, average latency within 20 %, at most 10 trials).

perf_analyzer's settings: synchronous (one thread per request in flight, its default) at
concurrency 1 and 8; at 64, asynchronous with one sending thread (`-a --max-threads 1`),
for both servers. Pinned to one core, its synchronous HTTP mode with 32 or more threads gives
no measurement against a server as fast as openinfer: its windows close rarely (one in 150 s
on a quiet machine, its RSS growing past 400 MB) or disagree by more than its 10 % (a busy
one), while the server answers all along, read from its own statistics: perf_analyzer's own
threads and bookkeeping fighting over the core, not the server. The probe (below, and in
the result) records it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers as PEERS  # noqa: E402

NAME = "pa_s1_s3"
SERVER_CPU, LOAD_CPU = "0", "1"


def perf_analyzer() -> tuple[str, dict[str, str]]:
    """The perf_analyzer binary of the tritonclient wheel and its environment (libcudart.so.12
    from the nvidia-cuda-runtime-cu12 wheel, which it links even without a GPU)."""
    exe = Path(sys.executable).parent / "perf_analyzer"
    found = str(exe) if exe.is_file() else shutil.which("perf_analyzer")
    if found is None:
        raise SystemExit("error: no perf_analyzer (it comes with the tritonclient wheel: make setup)")
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime

        lib = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    except ImportError:
        pass
    r = subprocess.run([found, "--version"], capture_output=True, text=True, env=env, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"error: perf_analyzer cannot run here: {(r.stdout + r.stderr).strip()[-400:]}")
    return found, env


def pa_version(pa: tuple[str, dict[str, str]]) -> str:
    r = subprocess.run([pa[0], "--version"], capture_output=True, text=True, env=pa[1])
    return (r.stdout + r.stderr).strip()


def pa_args(url: str, protocol: str, concurrency: int, interval_ms: int) -> list[str]:
    mode = ["-a", "--max-threads", "1"] if concurrency >= 32 else []
    return ["-m", "simple", "-u", url, "-i", protocol, "--concurrency-range", str(concurrency), *mode,
            "--measurement-interval", str(interval_ms), "--stability-percentage", "20", "--max-trials", "10"]


def run_pa(pa: tuple[str, dict[str, str]], args: list[str], log: Path, timeout: float = 180) -> dict:
    """One perf_analyzer run pinned to LOAD_CPU: throughput (infer/s) and p99 latency (µs)."""
    argv = ["taskset", "-c", LOAD_CPU, pa[0], *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=pa[1], timeout=timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after {timeout:.0f} s)", -1
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(" ".join(argv) + "\n" + (out if isinstance(out, str) else out.decode(errors="replace")))
    thr = re.search(r"Throughput: ([\d.]+) infer/sec", str(out))
    p99 = re.search(r"p99 latency: (\d+) usec", str(out))
    return {"ok": rc == 0 and thr is not None, "infer_s": float(thr.group(1)) if thr else float("nan"),
            "p99_us": int(p99.group(1)) if p99 else None, "warnings": re.findall(r"Unexpected error: [^\n]*", str(out))}


def success_count(http: str) -> int:
    status, raw = C.http_request(f"http://{http}/v2/models/simple/stats")
    if status != 200:
        return -1
    return int(json.loads(raw)["model_stats"][0]["inference_stats"]["success"]["count"])


def probe_sync_http_64(pa: tuple[str, dict[str, str]], http: str, seconds: float, log: Path) -> dict:
    """perf_analyzer's default (synchronous) HTTP mode at concurrency 64, pinned to one core,
    for `seconds`: whether it reports, what the server answered meanwhile (its statistics),
    and perf_analyzer's peak RSS."""
    argv = ["taskset", "-c", LOAD_CPU, pa[0], "-m", "simple", "-u", http, "-i", "http",
            "--concurrency-range", "64", "-v"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=pa[1])
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    samples, peak_rss = [], 0
    start = time.monotonic()
    while time.monotonic() - start < seconds and proc.poll() is None:
        time.sleep(min(5.0, seconds / 6))
        samples.append((time.monotonic() - start, success_count(http)))
        try:
            rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text()).group(1))
            peak_rss = max(peak_rss, rss)
        except (OSError, AttributeError):
            pass
    finished = proc.poll() is not None
    if not finished:
        proc.kill()
    proc.wait()
    reader.join(10)
    text = "".join(out)
    log.write_text(" ".join(argv) + "\n" + text)
    rates = [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(samples, samples[1:]) if c0 >= 0 and c1 >= 0]
    return {"finished": finished and "Throughput:" in text, "passes": len(re.findall(r"Pass \[", text)),
            "server_req_s": rates, "pa_peak_rss_mb": peak_rss / 1024, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round, concurrency 1 and 64, 1 s windows")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--no-probe", action="store_true", help="skip the synchronous HTTP c=64 probe")
    args = ap.parse_args(argv)
    conc = [1, 64] if args.quick else [int(c) for c in args.concurrency.split(",")]
    rounds = 1 if args.quick else args.rounds
    interval = 1000 if args.quick else args.interval_ms
    out_dir = C.RAW_DIR if args.quick else C.RESULTS_DIR
    raw = C.RAW_DIR / NAME
    raw.mkdir(parents=True, exist_ok=True)
    pa = perf_analyzer()
    servers: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    port, gport = C.free_port(), C.free_port()
    oi = C.openinfer_server(port, SERVER_CPU, raw / "openinfer.log", extra=["--grpc-port", str(gport)]).start()
    triton = None
    try:
        C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout=120, proc=oi)
        servers["openinfer"] = {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{gport}"}
        try:
            triton = PEERS.start_triton(SERVER_CPU, raw, models=["simple"])
            servers["Triton"] = {"http": f"127.0.0.1:{triton.http_port}", "grpc": f"127.0.0.1:{triton.grpc_port}"}
        except PEERS.PeerUnavailable as e:
            problems.append(f"native Triton could not start: {str(e)[-400:]}")
        rows: list[list[object]] = []
        results: dict[tuple[str, int, str], list[dict]] = {}
        for rnd in range(rounds):
            for protocol in ("http", "grpc"):
                for c in conc:
                    order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                    for name in order:
                        res = run_pa(pa, pa_args(servers[name][protocol], protocol, c, interval),
                                     raw / f"{name}-{protocol}-c{c}-r{rnd}.log")
                        results.setdefault((protocol, c, name), []).append(res)
                        print(f"[{NAME}] round {rnd + 1} {protocol} c={c} {name}: {res['infer_s']:.0f} infer/s "
                              f"p99 {res['p99_us']} µs{' FAILED' if not res['ok'] else ''}", flush=True)
        ratios: dict[str, dict] = {}
        for protocol in ("http", "grpc"):
            for c in conc:
                o = results.get((protocol, c, "openinfer"), [])
                t = results.get((protocol, c, "Triton"), [])
                med_o = C.summarize([r["infer_s"] for r in o if r["ok"]]) if any(r["ok"] for r in o) else None
                med_t = C.summarize([r["infer_s"] for r in t if r["ok"]]) if any(r["ok"] for r in t) else None
                pairs = [a["infer_s"] / b["infer_s"] for a, b in zip(o, t) if a["ok"] and b["ok"]]
                ratio = C.summarize(pairs) if pairs else None
                p99 = lambda rs: sorted(r["p99_us"] for r in rs if r["p99_us"] is not None)  # noqa: E731
                rows.append([protocol.upper(), c,
                             f"{med_o.median:.0f}" if med_o else "failed",
                             f"{med_t.median:.0f}" if med_t else ("—" if "Triton" not in servers else "failed"),
                             f"{ratio.median:.2f} ({ratio.lo:.2f}–{ratio.hi:.2f})" if ratio else "—",
                             (p99(o) or ["—"])[len(p99(o)) // 2] if p99(o) else "—",
                             (p99(t) or ["—"])[len(p99(t)) // 2] if p99(t) else "—"])
                if ratio:
                    ratios[f"{protocol}_c{c}"] = {"median": ratio.median, "min": ratio.lo, "max": ratio.hi}
        probe = None
        if not args.no_probe:
            probe = probe_sync_http_64(pa, servers["openinfer"]["http"], 20 if args.quick else 60,
                                       raw / "probe-sync-http-c64.log")
    finally:
        oi.stop()
        if triton is not None:
            triton.stop()
    lines = [f"# S1/S3 with perf_analyzer ({'quick' if args.quick else 'full'})", "",
             *(f"- {k}: {v}" for k, v in C.machine_facts().items()),
             f"- perf_analyzer: `{pa_version(pa)}`",
             f"- rounds {rounds}, windows of {interval} ms (average latency within 20 %, at most 10 trials); servers on CPU "
             f"{SERVER_CPU}, perf_analyzer on CPU {LOAD_CPU}; synchronous below concurrency 32, "
             "`-a --max-threads 1` at 64", "",
             C.markdown_table(["protocol", "concurrency", "openinfer infer/s", "Triton infer/s",
                               "openinfer/Triton (min–max)", "openinfer p99 µs", "Triton p99 µs"], rows), ""]
    warnings = sorted({w for rs in results.values() for r in rs for w in r["warnings"]})
    if warnings:
        lines += ["perf_analyzer's client printed: " + "; ".join(f"`{w}`" for w in warnings)
                  + " (its curl multi loop; the run still counted every request)", ""]
    if probe is not None:
        rates = probe["server_req_s"]
        lines += ["## The synchronous HTTP c=64 probe", "",
                  f"perf_analyzer's default mode (`-i http --concurrency-range 64`, 64 sending threads) pinned "
                  f"to CPU {LOAD_CPU} for {probe['seconds']:.0f} s against openinfer: "
                  f"{'it reported' if probe['finished'] else 'no measurement came out'} "
                  f"({probe['passes']} window(s) closed); the server answered "
                  + (f"{min(rates):.0f}–{max(rates):.0f} req/s" if rates else "? req/s")
                  + " the whole time (its statistics, read every few seconds); perf_analyzer's RSS reached "
                  f"{probe['pa_peak_rss_mb']:.0f} MB.", ""]
    lines += [*(f"- {p}" for p in problems)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.md").write_text("\n".join(lines) + "\n")
    (out_dir / f"{NAME}.ratios.json").write_text(json.dumps(ratios, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n[{NAME}] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
