"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 (INT32, wrapping like Triton's).

It describes itself as config.pbtxt does (INPUTS/OUTPUTS, batched up to 8), so a config that
names no tensors still serves it: Triton's model-control examples load it with the override
{"max_batch_size":"16"}, a whole config in Triton's sense, which Triton's Python backend
completes from the model.
"""

from __future__ import annotations

import numpy as np

from openinfer import Tensor

MAX_BATCH_SIZE = 8
INPUTS = [Tensor("INPUT0", "INT32", [-1, 16]), Tensor("INPUT1", "INT32", [-1, 16])]
OUTPUTS = [Tensor("OUTPUT0", "INT32", [-1, 16]), Tensor("OUTPUT1", "INT32", [-1, 16])]


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}
