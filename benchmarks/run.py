#!/usr/bin/env python3
"""Run openinfer benchmark scenarios, one after another (never two at once:
they pin to the same cores).

    .venv/bin/python benchmarks/run.py [--quick] [--out DIR] [s1 s2 ... s8]

With no scenario named, runs all of them (S1-S8, S10). Each scenario is its own script
(benchmarks/<id>_*.py) started in a child process with this Python; --quick
and --out are passed on. The peers (Triton run directly, Triton through PyTriton,
MLServer, KServe) are installed on first use into benchmarks/.venvs/ by benchmarks/peers.py. At the end,
benchmarks/summary.py writes the table of ratios (summary.md; after a full run of
every scenario, also README.md's Benchmarks section). Exit status: 0 when every
scenario succeeded.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

SCENARIOS = {
    "s1": ("s1_http_json.py", "simple over HTTP JSON vs peers and the nginx limit (wrk)"),
    "s2": ("s2_http_binary.py", "simple over HTTP binary tensors vs peers and nginx (wrk)"),
    "s3": ("s3_grpc.py", "simple over gRPC unary/streaming vs peers (h2load); 16 MiB vs TCP"),
    "s4": ("s4_http_tensors.py", "identity_fp32 4 KiB..64 MiB over HTTP vs peers, TCP echo / memcpy"),
    "s5": ("s5_json_codec.py", "the JSON codec alone vs orjson+numpy and json+numpy"),
    "s6": ("s6_torchscript.py", "TorchScript MLP/CNN vs Triton (PyTriton + torch) and in-process"),
    "s7": ("s7_client.py", "openinfer.Client vs tritonclient.http, same server"),
    "s8": ("s8_startup.py", "start-up, import time, idle memory vs the peers"),
    "s9": ("s9_workers.py", "CPU-bound Python model: N instances (worker processes) vs 1, Triton, MLServer"),
    "s11": ("s11_streaming.py", "decoupled model streaming over gRPC and SSE vs in-process and native Triton"),
    "s10": ("s10_soak.py", "soak: mixed valid/invalid HTTP + gRPC, RSS and descriptors over time"),
    "s12": ("s12_onnx.py", "ONNX MLP (ONNX Runtime C API) beside TorchScript, each vs in-process"),
    "s13": ("s13_identity.py", "S1's request to the C identity backend vs the nginx limit (wrk)"),
    "s14": ("s14_pt2.py", "PT2 (AOTInductor) MLP beside TorchScript: overhead vs in-process, batching vs transport"),
    "pa": ("pa_s1_s3.py", "S1/S3 (simple, HTTP and gRPC) with Triton's perf_analyzer vs native Triton"),
}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="scenarios: " + "; ".join(f"{k}: {v[1]}" for k, v in SCENARIOS.items()))
    ap.add_argument("--quick", action="store_true", help="each scenario's check mode (< 1 min each)")
    ap.add_argument("--out", help="results directory passed to every scenario")
    ap.add_argument("scenarios", nargs="*", metavar="ID", help="scenario ids (default: all)")
    args = ap.parse_args()
    ids = [s.lower() for s in args.scenarios] or list(SCENARIOS)
    unknown = [s for s in ids if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")

    child: list[subprocess.Popen] = []

    def on_term(signum, frame):  # pass SIGTERM/SIGHUP on, so servers get stopped
        for p in child:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    summary = []
    try:
        for sid in ids:
            script = BENCH_DIR / SCENARIOS[sid][0]
            argv = [sys.executable, str(script)]
            if args.quick:
                argv.append("--quick")
            if args.out:
                argv += ["--out", args.out]
            print(f"==> {sid}: {' '.join(argv)}", flush=True)
            t0 = time.monotonic()
            p = subprocess.Popen(argv, cwd=REPO_ROOT)
            child[:] = [p]
            rc = p.wait()
            summary.append((sid, rc, time.monotonic() - t0))
            print(f"<== {sid}: rc={rc} in {summary[-1][2]:.0f}s\n", flush=True)
    except KeyboardInterrupt:
        for p in child:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        print("\ninterrupted", file=sys.stderr)
        return 130
    # The table of ratios (openinfer vs each peer and limit) from what this run wrote; a full
    # run of every scenario also refreshes README.md's Benchmarks section.
    out = args.out or str(BENCH_DIR / "results" / ("raw" if args.quick else ""))
    argv = [sys.executable, str(BENCH_DIR / "summary.py"), "--out", out]
    if not args.quick and not args.out and set(ids) == set(SCENARIOS):
        argv.append("--readme")
    subprocess.run(argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    print(f"summary table: {Path(out) / 'summary.md'}")
    print("summary: " + ", ".join(f"{s} {'ok' if rc == 0 else f'FAILED (rc={rc})'} "
                                  f"({t:.0f}s)" for s, rc, t in summary))
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
