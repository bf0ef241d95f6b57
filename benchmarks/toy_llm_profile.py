#!/usr/bin/env python3
"""What a streamed token of examples/models/toy_llm (a decoupled Triton Python model, one
response per token through its response sender) costs without a server: 16-token streamed
requests through `TritonModel.handler` as the core's executor calls it (execute on its thread,
the executor draining the sender), CPU time of the whole process per token (both threads),
best of 3 runs of N requests; then the same request with execute and the drain on one thread
(`--profile`: under cProfile, the functions that cost most).

    PYTHONPATH=python .venv/bin/python benchmarks/toy_llm_profile.py [--requests N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_python_profile import REPO_ROOT, _Flag  # noqa: E402

from openinfer._backends import triton_model  # noqa: E402
from openinfer._backends import triton_utils as pb  # noqa: E402
from openinfer._backends.model_file import import_model_file  # noqa: E402
from openinfer.config import load_config  # noqa: E402

EXAMPLE = REPO_ROOT / "examples" / "models" / "toy_llm"
TOKENS = 16
PROMPT = b"Hello"  # toy_llm's continuation of it runs past 16 tokens: max_tokens ends it
OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")


def _view(value: object, dtype: type) -> np.ndarray:
    array = np.array([value], dtype=dtype)
    array.flags.writeable = False  # as the core's input views are
    return array


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    path = EXAMPLE / "1" / "model.py"
    source = path.read_bytes()
    module = import_model_file("toy_llm", 1, path, source, triton_model.PROVIDED)
    model = triton_model.load("toy_llm", 1, path, source, module, load_config(EXAMPLE / "config.pbtxt"), False)
    inputs = {"text_input": _view(PROMPT, np.object_), "stream": _view(True, np.bool_),
              "sampling_parameters": _view(json.dumps({"max_tokens": TOKENS}).encode(), np.object_)}
    flag = _Flag()

    def served() -> None:
        assert sum(1 for _ in model.handler(dict(inputs), None, OUTPUTS, flag)) == TOKENS

    def one_thread() -> None:
        request = pb.InferenceRequest._served("toy_llm", dict(inputs), model._input_types, OUTPUTS, None, flag, True)
        sender = request.get_response_sender()
        model._execute([request], flag)
        assert sum(1 for _ in model._stream(sender, OUTPUTS, flag)) == TOKENS

    for label, fn in (("handler (execute on its thread, as served)", served), ("execute and drain on one thread", one_thread)):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            for _ in range(args.requests):
                fn()
            best = min(best, (time.process_time() - start) / (args.requests * TOKENS))
        print(f"{label}: {best * 1e6:.1f} µs CPU per token")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(lambda: [one_thread() for _ in range(args.requests)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
