#!/usr/bin/env python3
"""Where a Triton Python model's request goes, without a server: python_backend's `add_sub`
(tests/triton_python_examples/add_sub, unchanged) called through `TritonModel.handler` as the core
calls it, piece by piece, beside the same computation as an `infer()` function. CPU time of this
thread (not wall time: a shared machine's other work does not count), best of 5 runs of N calls.

    PYTHONPATH=python .venv/bin/python benchmarks/triton_python_profile.py [--calls N]

What the table's rows are: `handler` is the whole request through the adapter's Python, as the
core's executor makes it for a decoupled model, a reshape, a BF16 output or an `async def
execute` (less the C side: the input views and the output conversion, the same for both kinds of
model; add_sub's served requests take the core's own call of execute, `_core.TritonExecute`,
which has no Python entry point: benchmarks/triton_python_cpu.py measures it served);
`InferenceRequest` its construction from the core's arrays; `execute` the model's own execute
(numpy's work and its pb_utils calls); `adapter around execute` the instance pool, pb_utils'
context and the reschedule check; the pb_utils rows are one call each; `infer()` is the same
computation as an openinfer model function (the core calls it directly).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "python"))
from openinfer._backends import triton_model  # noqa: E402
from openinfer._backends import triton_utils as pb  # noqa: E402
from openinfer._backends.model_file import import_model_file  # noqa: E402
from openinfer.config import load_config  # noqa: E402

EXAMPLE = REPO_ROOT / "tests" / "triton_python_examples" / "add_sub"
OUTPUTS = ("OUTPUT0", "OUTPUT1")


class _Flag:
    """What the core's CancelFlag answers for a lone request from a client."""

    def __call__(self) -> bool:
        return False

    def batch(self) -> None:
        return None

    def request_id(self) -> None:
        return None

    def bls_chain(self) -> None:
        return None


def _infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": (a + b).astype(np.float32), "OUTPUT1": (a - b).astype(np.float32)}


def cpu_us(fn: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    path = EXAMPLE / "model.py"
    source = path.read_bytes()
    module = import_model_file("add_sub", 1, path, source, triton_model.PROVIDED)
    model = triton_model.load("add_sub", 1, path, source, module, load_config(EXAMPLE / "config.pbtxt"), False)
    a, b = np.array([0.5, 1.5, 2.5, 3.5], np.float32), np.ones(4, np.float32)
    a.flags.writeable = b.flags.writeable = False  # as the core's input views are
    inputs, flag = {"INPUT0": a, "INPUT1": b}, _Flag()
    instance = model.fn.acquire()
    model.fn.release(instance)
    request = pb.InferenceRequest._served("add_sub", inputs, model._input_types, OUTPUTS, None, flag, False)
    tensor = pb.Tensor("OUTPUT0", a)
    rows = [
        ("handler (the whole request)", lambda: model.handler(inputs, None, OUTPUTS, flag)),
        ("InferenceRequest from the core's arrays",
         lambda: pb.InferenceRequest._served("add_sub", inputs, model._input_types, OUTPUTS, None, flag, False)),
        ("execute (the model's own)", lambda: instance.execute([request])),
        ("execute with the adapter around it", lambda: model._execute([request], flag)),
        ("pb_utils.Tensor(name, array)", lambda: pb.Tensor("OUTPUT0", a)),
        ("pb_utils.InferenceResponse([t, t])", lambda: pb.InferenceResponse(output_tensors=[tensor, tensor])),
        ("get_input_tensor_by_name", lambda: pb.get_input_tensor_by_name(request, "INPUT1")),
        ("Tensor.as_numpy()", tensor.as_numpy),
        ("infer() (same computation)", lambda: _infer(inputs)),
    ]  # fmt: skip
    print("| piece | CPU µs per call |")
    print("|:---|---:|")
    for label, fn in rows:
        print(f"| {label} | {cpu_us(fn, args.calls):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
