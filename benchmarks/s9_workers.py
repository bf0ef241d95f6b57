#!/usr/bin/env python3
"""S9 (processes): a CPU-bound Python model served by one openinfer process and by
`openinfer serve --workers N`, side by side. A Python model runs under its process's GIL, so
one process uses one core for it however many the machine has; N worker processes each have
their own interpreter.

    .venv/bin/python benchmarks/s9_workers.py [--workers 1,2] [--seconds 5] [--rounds 5]
                                              [--concurrency 8] [--out DIR]

The model (`busy`, written into a temporary repository) spends about --work-ms of pure-Python
arithmetic per request. wrk drives it at --concurrency connections over HTTP JSON; the
servers are not pinned (the point is to use every core), wrk is pinned to the last CPU, and
the configurations alternate round by round. Each round's rate with N workers is divided by
the same round's single-process rate. Results: DIR/s9_workers.md (default
benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

BUSY_MODEL = """\
import numpy as np

def _spin(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1000003
    return acc

def infer(inputs):
    x = inputs["X"]
    _spin({loops})
    return {{"Y": x + 1}}
"""

BUSY_CONFIG = """\
name: "busy"
backend: "python"
input [{name: "X" data_type: TYPE_INT32 dims: [1]}]
output [{name: "Y" data_type: TYPE_INT32 dims: [1]}]
"""


def calibrate(work_ms: float) -> int:
    """Loop count of _spin that takes about work_ms here."""
    import time

    ns: dict = {}
    exec(BUSY_MODEL.format(loops=0), ns)
    n = 10000
    t = time.perf_counter()
    ns["_spin"](n)
    per = (time.perf_counter() - t) / n
    return max(1000, int(work_ms / 1000 / per))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--work-ms", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=C.RESULTS_DIR / "raw")
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    loops = calibrate(args.work_ms)
    load_cpu = str(C.nproc() - 1)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / "busy" / "1").mkdir(parents=True)
        (repo / "busy" / "config.pbtxt").write_text(BUSY_CONFIG)
        (repo / "busy" / "1" / "model.py").write_text(BUSY_MODEL.format(loops=loops))
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
        script = C.write_wrk_script(Path(tmp) / "busy.lua", "POST", body, {"Content-Type": "application/json"})
        rates: dict[int, list[float]] = {n: [] for n in counts}
        commands: dict[int, str] = {}
        for r in range(args.rounds):
            for n in counts:
                port = C.free_port()
                srv = C.openinfer_server(port, None, Path(tmp) / f"server-{n}.log", threads=1,
                                         extra=["--workers", str(n), str(repo)])
                commands[n] = srv.command
                with srv:
                    C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout=60)
                    res = C.run_wrk(f"http://127.0.0.1:{port}/v2/models/busy/infer", script, args.concurrency,
                                    args.seconds, load_cpu, label=f"workers={n}", servers=[srv])
                if res.error:
                    print(f"round {r} workers={n}: {res.error}", file=sys.stderr)
                    return 1
                rates[n].append(res.rps)
                print(f"round {r} workers={n}: {res.rps:,.0f} req/s", file=sys.stderr)
    base = counts[0]
    rows = []
    for n in counts:
        ratio = C.summarize(C.paired_ratios(rates[n], rates[base]))
        rows.append([n, C.summarize(rates[n]).fmt(), ratio.fmt(".2f") if n != base else "1", f"`{commands[n]}`"])
    text = (
        f"# S9: CPU-bound Python model, one process vs --workers N\n\n"
        + ", ".join(f"{k}: {v}" for k, v in C.machine_facts().items())
        + "\n\n"
        f"Model `busy`: ~{args.work_ms:g} ms of pure-Python work per request ({loops} loop iterations); "
        f"wrk at c={args.concurrency} on CPU {load_cpu}, servers unpinned; {args.rounds} rounds of "
        f"{args.seconds:g} s, configurations alternated. Median (min–max); ratio = per-round rate / "
        f"single-process rate.\n\n"
        + C.markdown_table(["workers", "req/s", f"vs {base} worker", "command"], rows)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "s9_workers.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
