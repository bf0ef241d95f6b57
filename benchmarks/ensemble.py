#!/usr/bin/env python3
"""An ensemble of two trivial steps against the client calling the two models one after the
other: what the saved round trip (and the tensor that stays in the server) is worth.

    .venv/bin/python benchmarks/ensemble.py [--quick] [--duration S] [--rounds N] [--concurrency 1,8]

One openinfer server (`python -m openinfer serve`, one loop thread, pinned to --server-cpu)
serves a temporary repository: `step_a` (Y = X + 1) and `step_b` (Y = 2 X), Python models on
FP32 [16], and `pair`, the ensemble step_a -> step_b. Clients (tritonclient, HTTP binary and
gRPC, pinned to --client-cpu) run `c` threads for --duration seconds per run, each either
calling `pair` once or calling step_a then step_b with step_a's answer; every answer is checked
against 2 (X + 1). Runs alternate ensemble / two calls, N rounds per point; the figure is the
median of the per-round ratios of answers per second (ensemble / two calls) with min-max.
Results go to benchmarks/results/ensemble.{md,csv} (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "ensemble"
STEP = """def infer(inputs):
    return {{"Y": {expr}}}
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""
ENSEMBLE = """name: "pair"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "step_a" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "t" } },
  { model_name: "step_b" model_version: -1 input_map { key: "X" value: "t" } output_map { key: "Y" value: "OUT" } }
] }
"""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="check run: 1 round of 1 s per point")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measured run (3)")
    ap.add_argument("--rounds", type=int, default=3, help="ensemble/two-call rounds per point (3)")
    ap.add_argument("--concurrency", type=C.parse_int_list, default=[1, 8])
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.quick:
        a.duration, a.rounds = 1.0, 1
    return a


def make_repo(root: Path) -> Path:
    for name, expr in (("step_a", 'inputs["X"] + 1'), ("step_b", 'inputs["X"] * 2')):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(STEP.format(expr=expr))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (root / "pair" / "1").mkdir(parents=True)
    (root / "pair" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def client_for(proto: str, http_port: int, grpc_port: int):
    if proto == "http":
        import tritonclient.http as mod

        return mod, mod.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=30.0)
    import tritonclient.grpc as mod

    return mod, mod.InferenceServerClient(f"127.0.0.1:{grpc_port}")


def call(mod, client, model: str, name: str, x: np.ndarray, out: str) -> np.ndarray:
    i = mod.InferInput(name, [16], "FP32")
    i.set_data_from_numpy(x)
    return client.infer(model, [i], outputs=[mod.InferRequestedOutput(out)]).as_numpy(out)


def run(mode: str, proto: str, conc: int, duration: float, ports: tuple[int, int]) -> float:
    """Answers per second over `duration` seconds with `conc` client threads."""
    counts = [0] * conc
    errors: list[str] = []
    start = threading.Barrier(conc + 1)
    stop = threading.Event()

    def worker(k: int) -> None:
        mod, client = client_for(proto, *ports)
        x = np.arange(16, dtype=np.float32) + k
        want = (x + 1) * 2
        try:
            start.wait(30)
            while not stop.is_set():
                if mode == "ensemble":
                    y = call(mod, client, "pair", "IN", x, "OUT")
                else:
                    y = call(mod, client, "step_b", "X", call(mod, client, "step_a", "X", x, "Y"), "Y")
                if not np.array_equal(y, want):
                    errors.append(f"wrong answer {y}")
                    return
                counts[k] += 1
        except Exception as e:  # reported below; the run is void
            errors.append(repr(e))
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(conc)]
    for t in threads:
        t.start()
    start.wait(30)
    t0 = time.monotonic()
    time.sleep(duration)
    done = sum(counts)
    elapsed = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(30)
    if errors:
        raise RuntimeError(f"{mode} {proto} c={conc}: {errors[0]}")
    return done / elapsed


def main() -> int:
    a = parse_args()
    C.check_cpus(a.server_cpu, a.client_cpu)
    out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {int(c) for c in a.client_cpu.split(",")})
    rows = []
    with tempfile.TemporaryDirectory(prefix="oi-ens-bench-") as tmp:
        repo = make_repo(Path(tmp) / "models")
        http_port, grpc_port = C.free_port(), C.free_port()
        server = C.openinfer_server(http_port, a.server_cpu, Path(tmp) / "server.log",
                                    extra=["--grpc-port", str(grpc_port), str(repo)])
        with server:
            C.wait_http_ready(f"http://127.0.0.1:{http_port}/v2/models/pair/ready")
            for proto in ("http", "grpc"):
                for conc in a.concurrency:
                    run("ensemble", proto, conc, min(a.duration, 1.0), (http_port, grpc_port))  # warm-up
                    run("two calls", proto, conc, min(a.duration, 1.0), (http_port, grpc_port))
                    ens, two = [], []
                    for _ in range(a.rounds):
                        ens.append(run("ensemble", proto, conc, a.duration, (http_port, grpc_port)))
                        two.append(run("two calls", proto, conc, a.duration, (http_port, grpc_port)))
                    r = C.summarize(C.paired_ratios(ens, two))
                    e, t = C.summarize(ens), C.summarize(two)
                    rows.append([proto, conc, f"{e.median:.0f}", f"{t.median:.0f}",
                                 f"{r.median:.2f} ({r.lo:.2f}-{r.hi:.2f})"])
                    print(f"{proto} c={conc}: ensemble {e.median:.0f}/s, two calls {t.median:.0f}/s, "
                          f"ratio {r.median:.2f} ({r.lo:.2f}-{r.hi:.2f})", flush=True)
    headers = ["protocol", "concurrency", "ensemble answers/s", "two calls answers/s", "ratio (min-max)"]
    C.write_csv(out / f"{NAME}.csv", headers, rows)
    facts = C.machine_facts()
    (out / f"{NAME}.md").write_text(
        f"# Ensemble of two steps vs two client calls\n\n{C.now_utc()}; "
        f"{facts.get('cpu', '')}; {a.rounds} rounds of {a.duration:g} s per point, server on CPU "
        f"{a.server_cpu}, clients on CPU {a.client_cpu}.\n\n"
        "Answers per second (each answer is 2 (X + 1) for X FP32 [16], checked); the ratio is the "
        "median of per-round ensemble / two-call ratios.\n\n" + C.markdown_table(headers, rows)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
