"""OUTPUT0 = INPUT0 for FP32 tensors of any shape; the array goes back as is (no copy).

There is no config.pbtxt: a Triton config cannot declare "any shape" (dims fix the rank), so
the declaration lives here, with ``shape=None``.
"""

from __future__ import annotations

import numpy as np

from openinfer import Tensor

MAX_BATCH_SIZE = 0
INPUTS = [Tensor("INPUT0", "FP32", None)]
OUTPUTS = [Tensor("OUTPUT0", "FP32", None)]


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}
