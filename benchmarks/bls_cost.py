#!/usr/bin/env python3
"""What one BLS call costs: inside a served Triton Python model, `InferenceRequest(add_sub).exec()`
against computing the same step directly in the model (python_backend's add_sub example is the
step), p50 of each over the same iterations, in-process (no client, no socket: the clock is read in
the calling model). The goal is a BLS call no more than 30 µs above the direct step.

    .venv/bin/python benchmarks/bls_cost.py [--iterations N] [--rounds R]

Prints the p50s and their difference per round and the median difference.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
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
