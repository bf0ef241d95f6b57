"""The sum and difference of two BYTES tensors of decimal integers, as decimal bytes."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # Elements are bytes such as b"12"; int32 arithmetic wraps as in the INT32 "simple".
    a = inputs["INPUT0"].astype(np.int32)
    b = inputs["INPUT1"].astype(np.int32)
    return {"OUTPUT0": _decimal(a + b), "OUTPUT1": _decimal(a - b)}


def _decimal(values: np.ndarray) -> np.ndarray:
    return np.char.encode(values.astype(str)).astype(object)
