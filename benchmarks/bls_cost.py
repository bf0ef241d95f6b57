#!/usr/bin/env python3
"""What one BLS call costs: inside a served Triton Python model, `InferenceRequest(add_sub).exec()`
against computing the same step directly in the model (python_backend's add_sub example is the
step), p50 of each over the same iterations, in-process (no client, no socket: the clock is read in
the calling model). The goal is a BLS call no more than 30 µs above the direct step.

With --workers: BLS from a worker process (a model whose instances are worker processes calls a
target that sleeps --target-ms per request, with eight instances in the server): eight calls at
once, from threads and with async_exec under asyncio.gather, against one call alone, p50 of each
over the same iterations. The goal is eight at once taking no more than 2x one.

    .venv/bin/python benchmarks/bls_cost.py [--iterations N] [--rounds R]
    .venv/bin/python benchmarks/bls_cost.py --workers [--iterations N] [--rounds R] [--target-ms MS]

Prints the p50s and their difference (or ratio) per round and the median.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "python"))
import openinfer  # noqa: E402

EXAMPLE = REPO_ROOT / "tests" / "triton_python_examples" / "add_sub"
TIMER = textwrap.dedent(
    """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            n = int(pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0])
            a = pb_utils.Tensor("INPUT0", np.array([0.5, 1.5, 2.5, 3.5], np.float32))
            b = pb_utils.Tensor("INPUT1", np.ones(4, np.float32))
            bls, direct = [], []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                r = pb_utils.InferenceRequest(model_name="add_sub", inputs=[a, b],
                                              requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
                assert not r.has_error(), r.error().message()
                t1 = time.perf_counter_ns()
                x, y = a.as_numpy(), b.as_numpy()
                outs = [pb_utils.Tensor("OUTPUT0", (x + y).astype(np.float32)),
                        pb_utils.Tensor("OUTPUT1", (x - y).astype(np.float32))]
                pb_utils.InferenceResponse(output_tensors=outs)
                t2 = time.perf_counter_ns()
                bls.append(t1 - t0)
                direct.append(t2 - t1)
            out = np.array([np.median(bls), np.median(direct)], np.float64)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("P50", out)])]
    """
)
TIMER_CONFIG = """
name: "timer"
backend: "python"
input [{ name: "N", data_type: TYPE_INT64, dims: [ 1 ] }]
output [{ name: "P50", data_type: TYPE_FP64, dims: [ 2 ] }]
"""
# In worker processes: p50s of one BLS call to `sleeper`, of eight at once from threads, and of
# eight at once with async_exec under asyncio.gather, each call checked for its own answer.
FAN = textwrap.dedent(
    """
    import asyncio, time
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def request(i):
        return pb_utils.InferenceRequest(model_name="sleeper", inputs=[pb_utils.Tensor("IN", np.array([i], np.float32))],
                                         requested_output_names=["OUT"])

    def check(i, r):
        assert not r.has_error(), r.error().message()
        assert pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0] == i

    class TritonPythonModel:
        async def execute(self, requests):
            n = int(pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0])
            one, threads, gathered = [], [], []
            with ThreadPoolExecutor(8) as pool:
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    check(0, request(0).exec())
                    t1 = time.perf_counter_ns()
                    for i, r in enumerate(pool.map(lambda i: request(i).exec(), range(8))):
                        check(i, r)
                    t2 = time.perf_counter_ns()
                    for i, r in enumerate(await asyncio.gather(*(request(i).async_exec() for i in range(8)))):
                        check(i, r)
                    t3 = time.perf_counter_ns()
                    one.append(t1 - t0)
                    threads.append(t2 - t1)
                    gathered.append(t3 - t2)
            out = np.array([np.median(one), np.median(threads), np.median(gathered)], np.float64)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("P50", out)])]
    """
)
FAN_CONFIG = """
name: "fan"
backend: "python"
input [{ name: "N", data_type: TYPE_INT64, dims: [ 1 ] }]
output [{ name: "P50", data_type: TYPE_FP64, dims: [ 3 ] }]
instance_group [{ count: 2, kind: KIND_CPU }]
"""
SLEEPER = textwrap.dedent(
    """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(SECONDS)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                                .as_numpy())]) for r in requests]
    """
)
SLEEPER_CONFIG = """
name: "sleeper"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
instance_group [{ count: 8, kind: KIND_MODEL }]
"""


def add(repo: Path, name: str, model_py: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)


def from_workers(repo: Path, args: argparse.Namespace) -> None:
    """The --workers case: eight BLS calls at once from one worker process against one."""
    add(repo, "fan", FAN, FAN_CONFIG)
    add(repo, "sleeper", SLEEPER.replace("SECONDS", repr(args.target_ms / 1000)), SLEEPER_CONFIG)
    server = openinfer.serve(repo, http_port=0, log=False)
    client = openinfer.Client(server.url)
    try:
        ratios = []
        for r in range(args.rounds):
            one, threads, gathered = client.infer("fan", {"N": np.array([args.iterations], np.int64)})["P50"] / 1e6
            ratios.append(max(threads, gathered) / one)
            print(f"round {r + 1}: one call p50 {one:.1f} ms, 8 at once p50 {threads:.1f} ms (threads) "
                  f"{gathered:.1f} ms (async_exec), ratio {threads / one:.2f}x / {gathered / one:.2f}x")
        print(f"median of the larger ratio, 8 at once over one: {statistics.median(ratios):.2f}x (goal <= 2x)")
    finally:
        client.close()
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", action="store_true", help="BLS from a worker process: 8 calls at once vs one")
    parser.add_argument("--target-ms", type=float, default=20.0, help="--workers: the target's time per request")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        if args.workers:
            from_workers(repo, args)
            return 0
        (repo / "add_sub" / "1").mkdir(parents=True)
        shutil.copy(EXAMPLE / "model.py", repo / "add_sub" / "1" / "model.py")
        shutil.copy(EXAMPLE / "config.pbtxt", repo / "add_sub" / "config.pbtxt")
        (repo / "timer" / "1").mkdir(parents=True)
        (repo / "timer" / "1" / "model.py").write_text(TIMER)
        (repo / "timer" / "config.pbtxt").write_text(TIMER_CONFIG)
        server = openinfer.serve(repo, http_port=0, log=False)
        client = openinfer.Client(server.url)
        try:
            diffs = []
            for r in range(args.rounds):
                bls, direct = client.infer("timer", {"N": np.array([args.iterations], np.int64)})["P50"] / 1000.0
                diffs.append(bls - direct)
                print(f"round {r + 1}: BLS exec p50 {bls:.1f} µs, direct step p50 {direct:.1f} µs, "
                      f"BLS cost {bls - direct:.1f} µs")
            print(f"median BLS cost over the direct step: {statistics.median(diffs):.1f} µs (goal <= 30 µs)")
        finally:
            client.close()
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
